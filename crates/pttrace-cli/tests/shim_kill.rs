//! SIGKILL mid-run: every window the writer flushed is readable, the missing End record
//! shows the thread was killed, and a torn last record is reported as a truncated tail.

mod shim_util;

use drpttracer::format::ptt::{self, Tail};
use shim_util::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn sigkill_mid_run_leaves_parseable_files_and_a_detected_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("spin", tmp.path());
    let out = tmp.path().join("trace");
    let mut child = Command::new(&prog)
        .env("LD_PRELOAD", lib_path())
        .env("PTTRACER_OUT", &out)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "running\n");
    let file = out.join(format!(
        "{}-{}-{}.ptt",
        child.id(),
        // The nonce is only known from the info file.
        {
            let info = std::fs::read_dir(&out)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .find(|n| n.ends_with(".info"))
                .unwrap();
            info.trim_end_matches(".info")
                .split('-')
                .nth(1)
                .unwrap()
                .to_string()
        },
        child.id()
    ));
    // Wait until the writer has flushed a good number of windows (bounded wait, not a
    // timing assertion).
    for _ in 0..2000 {
        if std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) > 200_000 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    let st = child.wait().unwrap();
    assert!(!st.success());

    let td = read_dir(&out);
    assert_eq!(td.threads.len(), 1);
    let t = &td.threads[0];
    assert!(
        t.windows.len() > 1000,
        "only {} windows flushed",
        t.windows.len()
    );
    assert_eq!(t.end, None, "a killed thread has no End record");
    assert!(matches!(t.tail, Tail::Clean | Tail::Truncated { .. }));
    for (i, w) in t.windows.iter().enumerate() {
        assert_eq!(w.index, i as u64, "windows are complete and in order");
    }
    assert!(td.infos[0].end.is_none(), "no ProcessEnd after SIGKILL");

    // A record torn in the middle (as a kill during a write leaves it) is detected and the
    // complete records before it are all read.
    let data = std::fs::read(&file).unwrap();
    let parsed = ptt::parse("x", &data).unwrap();
    let last = parsed.frames.last().unwrap().offset;
    let torn = &data[..last + 30];
    let p2 = ptt::parse("x", torn).unwrap();
    assert_eq!(p2.frames.len(), parsed.frames.len() - 1);
    assert_eq!(
        p2.tail,
        Tail::Truncated {
            offset: last,
            bytes: 30
        }
    );
    let torn_dir = tmp.path().join("torn");
    std::fs::create_dir(&torn_dir).unwrap();
    std::fs::write(torn_dir.join(file.file_name().unwrap()), torn).unwrap();
    // With its process's info file and kernel side, as the run left them.
    for e in std::fs::read_dir(file.parent().unwrap()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "info") {
            std::fs::copy(&p, torn_dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    // The kill may also have cut the kernel side's last record: each such file is one
    // more damaged place.
    let mut torn_kernel = 0;
    if let Ok(rd) = std::fs::read_dir(file.parent().unwrap().join("kernel.raw")) {
        std::fs::create_dir(torn_dir.join("kernel.raw")).unwrap();
        for e in rd {
            let p = e.unwrap().path();
            std::fs::copy(&p, torn_dir.join("kernel.raw").join(p.file_name().unwrap())).unwrap();
            let data = std::fs::read(&p).unwrap();
            if p.to_string_lossy().ends_with(".raw.pt")
                && !matches!(drpttracer::format::pdb::parse_prefix(&data), Ok((_, None)))
            {
                torn_kernel += 1;
            }
        }
    }
    // Without its spool the torn record is damage: listed, and the exit status says so
    // unless --keep-going.
    let o = Command::new(pttrace())
        .arg("report")
        .arg(&torn_dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    let torn_name = torn_dir.join(file.file_name().unwrap());
    assert!(
        err.contains(&format!(
            "pttrace report: damaged: {}: byte {last}: incomplete record: the file ends 30 \
             bytes into it (writer killed?)",
            torn_name.display()
        )),
        "{err}"
    );
    let o = Command::new(pttrace())
        .args(["report", "--keep-going"])
        .arg(&torn_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    // ... as is the spool the copy lacks (the process died: its queued windows are lost).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "continued past {} damaged places",
            2 + torn_kernel
        )),
        "{o:?}"
    );
    assert_eq!(err.matches("kernel.raw/").count(), torn_kernel, "{o:?}");
    assert!(
        err.contains(&format!(
            "pttrace report: damaged: {}: missing: the spool of a thread file",
            drpttracer::format::spool::path_for(&torn_name).display()
        )),
        "{err}"
    );
    assert!(
        text.contains(&format!(
            "TRUNCATED tail: 30 bytes at offset {last} are an incomplete record"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} windows", parsed.frames.len() - 2)),
        "{text}"
    );
    assert!(text.contains("no End record"), "{text}");
}

#[test]
fn pttrace_run_prints_the_summary_and_the_decode_command() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--lib"])
        .arg(lib_path())
        .arg("--out")
        .arg(&out)
        // Kernel mode in syscall windows (DynamoRIO's syscall_pt_trace), named explicitly.
        .args(["--window", "syscall"])
        .args(["--syscalls", "getdents64,write", "--", "/bin/ls", "/"])
        .output()
        .unwrap();
    // pttrace's own messages go to stderr: stdout is the program's.
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    let td = read_dir(&out);
    let n = td.threads[0].windows.len();
    assert!(n >= 2);
    assert!(
        text.contains(&format!(
            "total: 1 process, 1 thread, {n} windows, 0 PT bytes, 0 sideband bytes, \
             losses: 0 lossy windows (0 with PT overflows), 0 dropped windows, 0 truncated/corrupt files"
        )),
        "{text}"
    );
    // No PT on a machine without Intel PT: the run says there is nothing to decode.
    if td.infos[0].process.pt_present {
        assert!(text.contains("pttrace decode --raw-pt"), "{text}");
    } else {
        assert!(
            text.contains("nothing to decode: no PT was captured"),
            "{text}"
        );
    }
    // An invalid option is refused before anything runs.
    let o = Command::new(pttrace())
        .args(["run", "--mode", "both", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("PTTRACER_MODE=\"both\""));
}

#[test]
fn fatal_signals_flush_and_end_the_files_then_kill_as_before() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("fatal", tmp.path());
    for (arg, sig) in [("segv", libc::SIGSEGV), ("term", libc::SIGTERM)] {
        let out = tmp.path().join(arg);
        let o = run_traced(&out, &prog, &[arg], &[]);
        assert_eq!(o.status.signal(), Some(sig), "{arg}: {o:?}");
        let td = read_dir(&out);
        assert_eq!(td.threads.len(), 1);
        let t = &td.threads[0];
        assert_eq!(
            t.windows.iter().filter(|w| w.nr == 110).count(),
            50,
            "{arg}: every window before the signal is written"
        );
        assert_eq!(t.end.map(|e| e.0), Some(ptt::EndReason::Signal as u32));
        assert_eq!(t.tail, Tail::Clean);
        assert_eq!(td.infos[0].end, Some((ptt::EndReason::Signal as u32, sig)));
    }
}
