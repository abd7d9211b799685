//! Errors that must name their cause (issue 13, point 4): each command fails with a message
//! that says what is wrong with which file or option, and exits non-zero. And text from
//! input files never reaches the terminal raw (point 5).

mod shim_util;

use std::process::Command;

use shim_util::{compile_with, lib_path, pttrace, text};

fn fails_with(args: &[&str], want: &str) {
    let o = Command::new(pttrace()).args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} succeeded: {}", text(&o));
    assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
}

#[test]
fn decode_of_a_missing_file_says_so() {
    fails_with(
        &["decode", "/nonexistent/trace.ptt"],
        "/nonexistent/trace.ptt: cannot open: No such file or directory",
    );
}

/// `view --limit` out of range names `--limit` (it had said `--snapshot`, whose sizes it
/// shares).
#[test]
fn a_view_limit_out_of_range_is_named() {
    fails_with(
        &["view", "/nonexistent", "--limit", "1"],
        "--limit \"1\": 1 bytes is outside 4096..=17179869184 (4K to 16G)",
    );
    fails_with(
        &["view", "/nonexistent", "--limit", "2T"],
        "--limit \"2T\": unknown unit \"T\"",
    );
}

#[test]
fn zero_decode_threads_are_refused() {
    fails_with(
        &["decode", "/nonexistent", "--threads", "0"],
        "invalid value '0' for '--threads",
    );
}

#[test]
fn run_refuses_a_preload_library_that_is_not_one() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake.so");
    std::fs::write(&fake, b"not an ELF file").unwrap();
    let out = dir.path().join("out");
    fails_with(
        &[
            "run",
            "--window",
            "syscall",
            "--lib",
            fake.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--",
            "/bin/true",
        ],
        "not an x86-64 ELF shared object",
    );
}

#[test]
fn run_refuses_an_output_directory_it_cannot_write() {
    // /proc/self exists, and nobody (root included) can create files in it.
    fails_with(
        &["run", "--out", "/proc/self", "--", "/bin/true"],
        "cannot write into /proc/",
    );
}

#[test]
fn run_says_when_the_program_wrote_no_trace() {
    // A statically linked program ignores LD_PRELOAD: nothing traced must not look fine.
    let dir = tempfile::tempdir().unwrap();
    let prog = compile_with("qemu_cases", dir.path(), "static", &["-static"]);
    let out = dir.path().join("out");
    fails_with(
        &[
            "run",
            "--backend",
            "emulated",
            "--mode",
            "user",
            "--window",
            "thread",
            "--lib",
            lib_path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            "loop",
            "10",
        ],
        "wrote no trace into",
    );
}

#[test]
fn text_from_trace_files_is_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let evil = "\u{1b}[31mred\u{1b}]0;title\u{7}";
    let o = Command::new(pttrace())
        .args([
            "run",
            "--window",
            "syscall",
            "--lib",
            lib_path().to_str().unwrap(),
        ])
        .arg("--out")
        .arg(&out)
        .args(["--", "/bin/echo", evil])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for args in [vec!["report"], vec!["decode", "--format", "summary"]] {
        let o = Command::new(pttrace())
            .args(&args)
            .arg(&out)
            .output()
            .unwrap();
        let t = text(&o);
        assert!(
            !t.contains('\u{1b}') && !t.contains('\u{7}'),
            "{args:?}: raw escape in {t:?}"
        );
        if args[0] == "report" {
            assert!(
                t.contains("/bin/echo \\x1b[31mred\\x1b]0;title\\x07"),
                "{t}"
            );
        }
    }
    // A directory whose name holds escapes, with a damaged thread file: the damage lines,
    // warnings and errors of every reader name it escaped.
    let evil_dir = dir.path().join(format!("trace{evil}"));
    std::fs::create_dir(&evil_dir).unwrap();
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            let mut data = std::fs::read(&p).unwrap();
            if p.extension().is_some_and(|x| x == "ptt") {
                data[30] ^= 0x20;
            }
            std::fs::write(evil_dir.join(p.file_name().unwrap()), data).unwrap();
        }
    }
    for args in [
        vec!["report"],
        vec!["decode", "--format", "summary"],
        vec!["view", "--format", "folded"],
    ] {
        let o = Command::new(pttrace())
            .args(&args)
            .arg(&evil_dir)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains('\u{1b}') && !err.contains('\u{7}'),
            "{args:?}: raw escape in {err:?}"
        );
        assert!(err.contains("damaged: "), "{args:?}: {err}");
        assert!(
            err.contains("trace\\x1b[31mred\\x1b]0;title\\x07/"),
            "{err}"
        );
    }
}

#[test]
fn a_bad_kallsyms_line_is_named_by_byte_offset_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let pt = dir.path().join("t.pt");
    std::fs::write(&pt, [0x02u8, 0x82, 0x02, 0x82]).unwrap();
    let k = dir.path().join("kallsyms");
    // The third line starts at byte 0x31 = 49.
    std::fs::write(
        &k,
        "ffffffff81000000 T _stext\nffffffff81000100 t foo\nzzzz T bad\n",
    )
    .unwrap();
    fails_with(
        &[
            "decode",
            "--pt",
            pt.to_str().unwrap(),
            "--kallsyms",
            k.to_str().unwrap(),
        ],
        &format!("{}: offset 0x31", k.display()),
    );
    fails_with(
        &[
            "decode",
            "--pt",
            pt.to_str().unwrap(),
            "--kallsyms",
            k.to_str().unwrap(),
        ],
        "line 3",
    );
}

#[test]
fn a_cpu_of_family_zero_warns_and_decodes_on_and_the_stepping_is_optional() {
    let dir = tempfile::tempdir().unwrap();
    let pt = dir.path().join("t.pt");
    // PSB+ with MODE.Exec, then a PSBEND.
    let mut w = drpttracer::decode::testgen::PtWriter::new();
    w.psb_plus(None, None);
    std::fs::write(&pt, &w.buf).unwrap();
    let p = pt.to_str().unwrap();
    for cmd in [&["decode", "--pt", p][..], &["dump", p][..]] {
        // As ptxed and ptdump: no CPU, no erratum workarounds, said on stderr.
        let mut args = cmd.to_vec();
        args.extend(["--cpu", "0/0"]);
        let o = Command::new(pttrace()).args(&args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains(
                "warning: --cpu 0/0: family 0 is no CPU: decoding without erratum workarounds"
            ),
            "{args:?}: {}",
            text(&o)
        );
        if cmd[0] == "dump" {
            // ptdump's own line first, then the listing.
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(
                out.lines().take(2).collect::<Vec<_>>(),
                [
                    "[0: failed to determine errata: unknown cpu]",
                    "0000000000000000  psb"
                ],
                "{out}"
            );
        }
        let mut args = cmd.to_vec();
        args.extend(["--cpu", "6/92"]);
        let o = Command::new(pttrace()).args(&args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        let mut args = cmd.to_vec();
        args.extend(["--cpu", "23/1/0"]);
        let o = Command::new(pttrace()).args(&args).output().unwrap();
        assert!(
            text(&o).contains("warning: --cpu 23/1/0: CPU family 23 (model 1) has no Intel PT"),
            "{args:?}: {}",
            text(&o)
        );
    }
}

#[test]
fn run_names_bad_snapshot_options_and_refuses_snapshot_where_the_shim_keeps_no_ring() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let run = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "run",
            "--backend",
            "emulated",
            "--mode",
            "user",
            "--window",
            "syscall",
            "--out",
            out,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v.extend(["--".to_string(), "/bin/true".to_string()]);
        v
    };
    let cases: &[(&[&str], &str)] = &[
        (&["--snapshot", "lots"], "--snapshot \"lots\": expected a size"),
        (&["--snapshot", "1T"], "--snapshot \"1T\": unknown unit \"T\""),
        (
            &["--snapshot", "1M", "--trigger", "signal:STOP"],
            "--trigger \"signal:STOP\": signal 19 cannot be used as a trigger",
        ),
        (
            &["--snapshot", "1M", "--trigger", "syscall:"],
            "--trigger \"syscall:\": unknown x86-64 syscall",
        ),
        (&["--trigger", "exit"], "--trigger \"exit\" needs --snapshot SIZE"),
        (
            &["--snapshot", "1M"],
            "--snapshot with the emulated backend traces user code in thread windows: use --mode user --window thread (got --mode user --window syscall)",
        ),
    ];
    for (extra, want) in cases {
        let args = run(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&args, want);
    }
    // The hardware backend: on a machine without Intel PT (like this one) refused before
    // anything runs, the whole message naming the missing intel_pt PMU and the probe's
    // reason; with one, user mode in thread windows runs (tests/snapshot.rs `hardware_*`)
    // and other modes are refused, naming what it takes.
    for mode in [["user", "thread"], ["kernel", "syscall"]] {
        let pmu = drpttracer::perf::pmu::IntelPtPmu::probe();
        if pmu.is_ok() && mode[0] == "user" {
            continue;
        }
        let args = [
            "run",
            "--backend",
            "hardware",
            "--mode",
            mode[0],
            "--window",
            mode[1],
            "--out",
            out,
            "--snapshot",
            "64K",
            "--",
            "/bin/true",
        ];
        let o = Command::new(pttrace()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(o.stdout.is_empty(), "{}", text(&o));
        let want = match pmu {
            Err(e) => format!(
                "pttrace run: --snapshot on the hardware backend needs an intel_pt PMU, and \
                 this machine has none: {}\n",
                e.message
            ),
            Ok(_) => "pttrace run: --snapshot with the hardware backend traces user code in \
                      thread windows: use --mode user --window thread (got --mode kernel \
                      --window syscall)\n"
                .to_string(),
        };
        assert_eq!(String::from_utf8_lossy(&o.stderr), want);
        if drpttracer::perf::pmu::IntelPtPmu::probe().is_err() {
            assert!(want.contains("no intel_pt PMU ("), "{want}");
        }
        assert!(
            !std::path::Path::new(out).exists(),
            "nothing was traced or created"
        );
    }
}

/// Inputs with nothing in them are refused, not passed over (exit 2, the input named), and
/// an empty PTTRACER_OUT says that tracing is off instead of running untraced silently.
#[test]
fn empty_inputs_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pt");
    std::fs::write(&empty, b"").unwrap();
    let o = Command::new(pttrace())
        .arg("dump")
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "{}: empty: there is nothing to dump",
            empty.display()
        )),
        "{}",
        text(&o)
    );
    let d = dir.path().join("nothing");
    std::fs::create_dir(&d).unwrap();
    for args in [vec!["report"], vec!["decode", "--format", "summary"]] {
        let o = Command::new(pttrace())
            .args(&args)
            .arg(&d)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is this a `pttrace run --out` directory?"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let o = Command::new("/bin/true")
        .env("LD_PRELOAD", lib_path())
        .env("PTTRACER_OUT", "")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "drpttracer shim: PTTRACER_OUT= is set but empty: it names no output directory; \
         tracing disabled, the program runs untraced\n"
    );
}
