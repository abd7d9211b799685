//! `pttrace run` as a new user types it: no flags trace the program's user code with the
//! best backend this machine has (saying which and why), `--backend qemu` or `--mode user`
//! alone imply thread windows, a second run never mixes with the first, stdout is the
//! program's alone and the exit status is the program's.

mod shim_util;

use std::path::Path;
use std::process::{Command, Output};

use drpttracer::decode::ptt_dir;
use drpttracer::format::ptt;
use shim_util::{pttrace, qemu_available, symbol, text};

fn run(args: &[&str], cmd: &[&str]) -> Output {
    Command::new(pttrace())
        .arg("run")
        .args(args)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap()
}

/// (mode, window, backend) names of the trace (its first thread's header).
fn kind_of(out: &Path) -> (String, String, String) {
    let t = ptt_dir::open(out).unwrap();
    let p = &t.threads[0].header;
    (
        ptt::mode_name(p.mode).to_string(),
        ptt::window_name(p.window).to_string(),
        ptt::backend_name(p.backend).to_string(),
    )
}

/// The backend that no flags pick here, and the words of `run`'s first line for it.
fn expected_default() -> (&'static str, &'static str) {
    if drpttracer::perf::pmu::IntelPtPmu::probe().is_ok() {
        ("hardware", "with Intel PT hardware (intel_pt PMU found)")
    } else if qemu_available() {
        ("qemu", "under QEMU (")
    } else {
        (
            "emulated",
            "by single-stepping (emulated backend: no intel_pt PMU",
        )
    }
}

#[test]
fn no_flags_trace_the_programs_user_code_exactly_with_the_best_backend() {
    // The plugin is found beside pttrace: make sure this build has it.
    if qemu_available() {
        shim_util::plugin();
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile_with("qemu_cases", dir.path(), "qc", &["-no-pie"]);
    let out = dir.path().join("out");
    let o = run(
        &["-o", out.to_str().unwrap()], // perf's short form
        &[prog.to_str().unwrap(), "loop", "1000"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let first = err.lines().next().unwrap_or("");
    let (backend, words) = expected_default();
    assert!(
        first.starts_with("pttrace run: tracing user code in thread windows ")
            && first.contains(words),
        "first line: {first}\n{}",
        text(&o)
    );
    assert_eq!(
        kind_of(&out),
        ("user".into(), "thread".into(), backend.into())
    );
    // The loop, instruction by instruction: test cl,1 | jz | nop | dec rcx | jnz.
    let t = ptt_dir::open(&out).unwrap();
    let main = t
        .threads
        .iter()
        .find(|th| th.header.tid == th.header.pid)
        .unwrap();
    let records: Vec<_> = t
        .collect_thread(main)
        .unwrap()
        .into_iter()
        .flat_map(|(_, r)| r)
        .collect();
    let count = |pc: u64| {
        records
            .iter()
            .filter_map(|r| r.as_instruction())
            .filter(|i| i.pc == pc)
            .count()
    };
    let head = symbol(&prog, "pt_loop_head");
    assert_eq!(
        [
            count(head),
            count(head + 3),
            count(head + 5),
            count(head + 6),
            count(head + 9)
        ],
        [1000, 1000, 500, 1000, 1000]
    );
}

#[test]
fn backend_qemu_or_mode_user_alone_trace_thread_windows() {
    if !qemu_available() {
        return;
    }
    shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    for (args, backend) in [
        (&["--backend", "qemu"][..], "qemu"),
        (&["--mode", "user"][..], expected_default().0),
    ] {
        let out = dir.path().join(args.join("_"));
        let mut a = args.to_vec();
        a.extend(["--out", out.to_str().unwrap()]);
        let o = run(&a, &["/bin/true"]);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert_eq!(
            kind_of(&out),
            ("user".into(), "thread".into(), backend.into()),
            "{args:?}"
        );
    }
    // `--window syscall` alone keeps its old meaning: kernel code in syscall windows.
    let out = dir.path().join("syscall");
    let o = run(
        &["--window", "syscall", "--out", out.to_str().unwrap()],
        &["/bin/true"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let (mode, window, _) = kind_of(&out);
    assert_eq!((mode.as_str(), window.as_str()), ("kernel", "syscall"));
}

#[test]
fn a_second_run_into_the_same_directory_moves_the_first_aside() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace");
    let old = dir.path().join("trace.old");
    let args = ["--window", "syscall", "--out", out.to_str().unwrap()];
    let files = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let o = run(&args, &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    let first = files(&out);
    assert!(first.iter().any(|f| f.ends_with(".info")), "{first:?}");
    // An older .old goes: the second run's .old is the first run.
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("stale"), b"x").unwrap();
    let o = run(&args, &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "pttrace run: {} held a trace of an earlier run: moved to {}",
            out.display(),
            old.display()
        )),
        "{}",
        text(&o)
    );
    assert_eq!(files(&old), first);
    assert_eq!(ptt_dir::open(&out).unwrap().processes.len(), 1);
    assert_ne!(
        files(&out),
        first,
        "the second run's own files (another pid)"
    );
    // A directory without a trace is used as it is.
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(plain.join("notes.txt"), b"mine").unwrap();
    let o = run(
        &["--window", "syscall", "--out", plain.to_str().unwrap()],
        &["/bin/true"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(plain.join("notes.txt").is_file());
    assert!(!dir.path().join("plain.old").exists());
}

#[test]
fn stdout_is_the_programs_own_and_the_exit_status_is_its_own() {
    if qemu_available() {
        shim_util::plugin();
    }
    let dir = tempfile::tempdir().unwrap();
    let script = "printf 'line 1\\nline 2\\n'; ls /; exit $0";
    for (status, want) in [("0", Some(0)), ("3", Some(3))] {
        let native = Command::new("sh")
            .args(["-c", script, status])
            .output()
            .unwrap();
        let out = dir.path().join(format!("out{status}"));
        let o = run(
            &["--out", out.to_str().unwrap()],
            &["sh", "-c", script, status],
        );
        assert_eq!(o.stdout, native.stdout, "{}", text(&o));
        assert_eq!(o.status.code(), want, "{}", text(&o));
        let o = run(
            &["--quiet", "--out", out.to_str().unwrap()],
            &["sh", "-c", script, status],
        );
        assert_eq!(o.stdout, native.stdout);
        assert_eq!(o.status.code(), want);
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("pttrace run:"),
            "--quiet: {}",
            text(&o)
        );
    }
    // Killed by SIGSEGV: 128 + 11, as a shell reports it.
    let out = dir.path().join("segv");
    let o = run(
        &["--out", out.to_str().unwrap()],
        &["sh", "-c", "kill -SEGV $$"],
    );
    assert_eq!(o.status.code(), Some(139), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("pttrace run: sh was killed by signal 11 (Segmentation fault)"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_program_that_cannot_start_ends_the_run_as_env_does_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let not_exec = dir.path().join("data.txt");
    std::fs::write(&not_exec, "not a program\n").unwrap();
    let missing = dir.path().join("missing");
    let cases = [
        (
            "no_such_program_here".to_string(),
            127,
            "no_such_program_here: command not found",
        ),
        (missing.display().to_string(), 127, "missing: no such file"),
        (
            not_exec.display().to_string(),
            126,
            "data.txt: not executable (no execute permission)",
        ),
        (dir.path().display().to_string(), 126, ": is a directory"),
    ];
    for (k, (prog, status, says)) in cases.iter().enumerate() {
        // The status `env` gives the same program (126: found but cannot run; 127: not
        // found), as shells and `timeout` do.
        let env = Command::new("env").arg(prog).output().unwrap();
        assert_eq!(env.status.code(), Some(*status), "env {prog}");
        let out = dir.path().join(format!("out{k}"));
        let o = run(&["--out", out.to_str().unwrap()], &[prog]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(*status), "{prog}: {t}");
        assert!(
            t.contains("pttrace run: ") && t.contains(says),
            "{prog}: {t}"
        );
        assert!(!out.exists(), "{prog}: nothing is created: {t}");
    }
}

#[test]
fn processes_left_running_are_named_and_their_trace_goes_on() {
    if qemu_available() {
        shim_util::plugin();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(
        &["--out", out.to_str().unwrap()],
        &["sh", "-c", "sleep 2 & echo started"],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "started\n");
    // (Before, the summary said nothing of the `sleep`, still tracing into the directory.)
    let said = format!(
        "pttrace run: sh ended, but 1 process it started is still running and tracing into {}: pid ",
        out.display()
    );
    assert!(t.contains(&said), "{t}");
    assert!(t.contains("`pttrace report "), "{t}");
    // Its trace goes on: the `sleep` image ends in the directory, whole.
    let start = std::time::Instant::now();
    loop {
        let r = Command::new(pttrace())
            .arg("report")
            .arg(&out)
            .output()
            .unwrap();
        let rt = text(&r);
        if rt.contains("sleep 2\n") && !rt.contains("no ProcessEnd record") {
            assert_eq!(r.status.code(), Some(0), "{rt}");
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the sleep never ended in the trace: {rt}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn report_counts_an_exec_as_a_new_image_of_the_same_process() {
    if qemu_available() {
        shim_util::plugin();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace");
    let o = run(
        &["--quiet", "--out", out.to_str().unwrap()],
        &["sh", "-c", "exec /bin/true"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let report = shim_util::report(&out);
    assert!(
        report.contains("total: 1 process (2 images: execve), 1 thread, "),
        "{report}"
    );
    // view counts the same way.
    let o = Command::new(pttrace())
        .arg("view")
        .arg(&out)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.starts_with("1 thread (2 thread images: execve), "),
        "{said}"
    );
}

/// `sh -c '/bin/true; exec /bin/true'` traced into `dir/trace` (three thread files: the
/// shell, its forked child, the exec'd image): the trace.
fn traced_child_then_exec(dir: &Path) -> std::path::PathBuf {
    if qemu_available() {
        shim_util::plugin();
    }
    let out = dir.join("trace");
    let o = run(
        &["--quiet", "--out", out.to_str().unwrap()],
        &["sh", "-c", "/bin/true; exec /bin/true"],
    );
    assert!(o.status.success(), "{}", text(&o));
    out
}

/// `decode`'s summary and `--decoder check` account for every window: the windows that
/// hold no PT (here the forked child's, cut before it ran any user code) are counted
/// apart, so that the windows decoded and those add up to the total `decode` and
/// `report` give.
#[test]
fn decode_and_check_account_for_windows_without_pt() {
    let dir = tempfile::tempdir().unwrap();
    let out = traced_child_then_exec(dir.path());
    let trace = ptt_dir::open(&out).unwrap();
    let (mut windows, mut with_pt) = (0u64, 0u64);
    for th in &trace.threads {
        let stats = trace.check_thread(th, &mut |_, _| Ok(())).unwrap();
        windows += stats.windows;
        with_pt += stats.windows_with_pt;
    }
    let no_pt = windows - with_pt;
    assert!(no_pt > 0, "{windows} windows, all with PT");
    let more = match no_pt {
        1 => "; 1 more window holds no PT (nothing to decode)".to_string(),
        n => format!("; {n} more windows hold no PT (nothing to decode)"),
    };
    // `decode` with `more_args`, which must succeed and (every thread ended) note nothing
    // on stderr: its stdout.
    let decode = |more_args: &[&str]| {
        let o = Command::new(pttrace())
            .arg("decode")
            .arg(&out)
            .args(more_args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(o.stderr.is_empty(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let summary = decode(&["--format", "summary"]);
    let lines: Vec<&str> = summary.lines().collect();
    assert!(
        lines[lines.len() - 2].contains(&format!(", {windows} windows, ")),
        "{summary}"
    );
    assert_eq!(
        lines[lines.len() - 1],
        format!("decoded by: fast: {with_pt}{more}"),
        "{summary}"
    );
    let check = decode(&["--decoder", "check"]);
    let last = check.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "check: the fast decoder and libipt agree: {with_pt} windows, "
        )) && last.ends_with(&format!("(decoded by fast: {with_pt}){more}")),
        "{check}"
    );
}

/// At its end `run` lists the first process image and the one with the most trace (where
/// the program's work is) and counts the others in one line when there are many and
/// nothing was lost in them; `report` lists every one.
#[test]
fn run_lists_the_first_and_busiest_images_and_counts_the_rest() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace");
    let script = "/bin/true; /bin/true; /bin/true; ls -l /usr/bin >/dev/null; /bin/true; /bin/true";
    let o = run(&["--out", out.to_str().unwrap()], &["sh", "-c", script]);
    assert!(o.status.success(), "{}", text(&o));
    let said = String::from_utf8_lossy(&o.stderr);
    let listed: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("process "))
        .filter_map(|l| l.split_once("): ").map(|(_, c)| c))
        .collect();
    // Every image, from the trace itself: (pid, image id) in report's order, PT bytes.
    let t = ptt_dir::open(&out).unwrap();
    let mut pt = std::collections::HashMap::<(i32, u64), u64>::new();
    for th in &t.threads {
        let s = drpttracer::format::summary::summarize_thread(&th.path).unwrap();
        *pt.entry((th.header.pid, th.header.nonce)).or_default() += s.pt_bytes;
    }
    let images: Vec<_> = t
        .processes
        .iter()
        .map(|p| (p.pid, p.nonce, p.cmdline.clone()))
        .collect();
    assert!(images.len() > 6, "{} images", images.len());
    let biggest = images
        .iter()
        .max_by_key(|(pid, nonce, _)| pt[&(*pid, *nonce)])
        .unwrap();
    assert_eq!(biggest.2, "ls -l /usr/bin");
    let mut listed = listed;
    listed.sort();
    assert_eq!(
        listed,
        ["ls -l /usr/bin", format!("sh -c {script}").as_str()],
        "{said}"
    );
    // The first image to start (not the smallest pid: pids wrap around).
    let first = t
        .threads
        .iter()
        .min_by_key(|th| th.header.start_tsc)
        .map(|th| (th.header.pid, th.header.nonce))
        .unwrap();
    let hidden: Vec<_> = images
        .iter()
        .filter(|(pid, nonce, _)| ![first, (biggest.0, biggest.1)].contains(&(*pid, *nonce)))
        .collect();
    let pids: std::collections::BTreeSet<i32> = hidden.iter().map(|(pid, _, _)| *pid).collect();
    assert!(
        said.contains(&format!(
            "… and {} more process images of {} processes: nothing lost, each ended \
             (`pttrace report {}` lists each)",
            hidden.len(),
            pids.len(),
            out.display()
        )),
        "{said}"
    );
    // report lists them all.
    let report = shim_util::report(&out);
    let all = report.lines().filter(|l| l.starts_with("process ")).count();
    assert_eq!(all, images.len(), "{report}");
    assert!(!report.contains("more process images"), "{report}");
}

/// `pttrace dump DIR` lists every thread file of a `run` directory, in `decode`'s order:
/// each under a `# thread PID/TID (FILE): CMD` line, exactly what `dump --ptt FILE` lists
/// for it (before, a directory was refused: "Is a directory"), and `dump FILE` what `dump
/// --ptt FILE` does (before: the container listed as raw PT, 60 "damaged" places).
#[test]
fn dump_lists_every_thread_file_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = traced_child_then_exec(dir.path());
    let dump = |args: &[&std::ffi::OsStr]| shim_util::pttrace_ok("dump", args);
    let trace = ptt_dir::open(&out).unwrap();
    assert!(
        trace.threads.len() >= 3,
        "{} thread files",
        trace.threads.len()
    );
    let mut want = String::new();
    for th in &trace.threads {
        let cmd = trace
            .process_of(th)
            .map(|p| p.cmdline.clone())
            .unwrap_or_default();
        want.push_str(&format!(
            "# thread {}/{} ({}): {cmd}\n",
            th.header.pid,
            th.header.tid,
            th.path.display()
        ));
        let listed = dump(&["--ptt".as_ref(), th.path.as_os_str()]);
        // (A thread file is known by its header, --ptt or not.)
        assert_eq!(dump(&[th.path.as_os_str()]), listed);
        want.push_str(&listed);
    }
    // `report` of a thread file says what to run instead.
    let o = Command::new(pttrace())
        .arg("report")
        .arg(&trace.threads[0].path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "is one thread's file of a trace directory: `pttrace report {}` reports the whole \
             directory",
            out.display()
        )),
        "{}",
        text(&o)
    );
    let got = dump(&[out.as_os_str()]);
    assert!(got.contains("\n# window 0 syscall "), "{got}");
    assert_eq!(got, want);
    // A thread file cut short: listed up to the cut, named with its byte offset, exit 1
    // (0 with --keep-going), as `decode` says it.
    let first = &trace.threads[0].path;
    let len = std::fs::metadata(first).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(first).unwrap();
    f.set_len(len - 7).unwrap();
    for (more, status) in [(None, 1), (Some("--keep-going"), 0)] {
        let o = Command::new(pttrace())
            .arg("dump")
            .arg(&out)
            .args(more)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(status), "{err}");
        assert!(
            err.contains(&format!("damaged: {}: byte ", first.display())),
            "{err}"
        );
        assert!(String::from_utf8_lossy(&o.stdout).starts_with("# thread "));
    }
}
