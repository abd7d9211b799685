//! `decode --format drmemtrace`, read by DynamoRIO's own analyzers (`drmemtrace_launcher`
//! from the build `scripts/dynamorio.sh` makes; without it each test prints `SKIP`): real
//! programs traced under QEMU pass the invariant checker, `basic_counts` counts exactly
//! the instructions pttrace decodes, the syscalls, one kernel event and transfer per
//! signal handled, one window per loss, and `view` shows the decoder's instructions; also
//! an assembly loop, data-dependent branches and indirect calls, 8 threads, JIT code
//! (rewritten in place) and a fork + exec chain.

mod shim_util;

use std::path::Path;
use std::process::Command;

use shim_util::{analyze, dynamorio_launcher as launcher, pttrace, qemu_available, text};

/// The number before `label` on a line of basic_counts' totals.
fn count(out: &str, label: &str) -> u64 {
    out.lines()
        .find(|l| {
            l.trim_start()
                .split_once(' ')
                .is_some_and(|(_, r)| r == label)
        })
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{label:?} not in:\n{out}"))
}

/// Traces `prog args` under QEMU, writes its drmemtrace, and checks it with DynamoRIO:
/// returns (basic_counts' output, pttrace's instruction total, view's output).
fn check(l: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> (String, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile(name, dir.path());
    let one_thread = name != "threads" && !args.contains(&"threads");
    check_program(l, &prog, one_thread, args, env)
}

/// [`check`] of a program given by path; `one_thread`: its first instructions are
/// compared with DynamoRIO's `view`.
fn check_program(
    l: &Path,
    prog: &Path,
    one_thread: bool,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--quiet", "--backend", "qemu", "--out"])
        .arg(&out)
        .arg("--")
        .arg(prog)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let dm = dir.path().join("dm");
    let o = Command::new(pttrace())
        .args(["decode", "--keep-going", "--format", "drmemtrace", "--out"])
        .arg(&dm)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let checked = analyze(l, &dm, "invariant_checker");
    assert!(
        checked.contains("Trace invariant checks passed"),
        "{checked}"
    );
    let summary = Command::new(pttrace())
        .args(["decode", "--keep-going", "--format", "summary"])
        .arg(&out)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&summary.stdout).into_owned();
    let total = summary
        .lines()
        .find_map(|l| l.strip_prefix("total: "))
        .and_then(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let k = w.iter().position(|x| x.starts_with("instructions"))?;
            w.get(k - 1)?.parse().ok()
        })
        .unwrap_or_else(|| panic!("{summary}"));
    // The first instructions DynamoRIO shows are the decoder's first.
    let view = analyze(l, &dm, "view");
    let jsonl = Command::new(pttrace())
        .args(["decode", "--format", "jsonl"])
        .arg(&out)
        .output()
        .unwrap();
    let ours: Vec<u64> = String::from_utf8_lossy(&jsonl.stdout)
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["type"] == "insn").then(|| {
                u64::from_str_radix(v["pc"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
            })
        })
        .take(20)
        .collect();
    let theirs: Vec<u64> = view
        .lines()
        .filter_map(|l| {
            let at = l.split(" @ ").nth(1)?;
            u64::from_str_radix(at.split_whitespace().next()?.trim_start_matches("0x"), 16).ok()
        })
        .take(20)
        .collect();
    if one_thread {
        // (One thread: the first instructions in the file are the first decoded.)
        assert_eq!(theirs, ours);
    }
    (analyze(l, &dm, "basic_counts"), total, view)
}

/// One test, the programs one after another (under QEMU each takes two cores' worth).
#[test]
fn dynamorio_reads_pttrace_traces() {
    let Some(l) = launcher() else { return };
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    shim_util::plugin();

    // Syscalls: each followed by its number.
    let (counts, total, _) = check(&l, "names", &[], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    assert!(
        count(&counts, "total system call number markers") > 20,
        "{counts}"
    );
    assert_eq!(
        count(&counts, "total kernel transfer markers"),
        0,
        "{counts}"
    );

    // SIGALRM every 200 µs into a loop: each handled signal an event and its sigreturn a
    // transfer back.
    let (counts, total, _) = check(&l, "qemu_cases", &["alarm", "30"], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    let xfers = count(&counts, "total kernel transfer markers");
    assert!(xfers >= 60 && xfers % 2 == 0, "{counts}");
    assert!(
        !counts.contains("Total windows"),
        "no loss, no window: {counts}"
    );

    // A handler leaving by siglongjmp, traced without signal frames: the QEMU backend
    // writes OVF there, each a new window for DynamoRIO.
    let (counts, total, _) = check(&l, "sigjmp_loop", &[], &[("PTTRACE_QEMU_SIGFRAMES", "off")]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    let windows: u64 = counts
        .lines()
        .find_map(|l| l.trim().strip_prefix("Total windows: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{counts}"));
    assert!(windows > 1, "{counts}");

    // 17 threads.
    let (counts, total, _) = check(&l, "threads", &[], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    assert_eq!(count(&counts, "total threads"), 17, "{counts}");

    // An assembly loop; data-dependent branches, indirect calls through a table,
    // recursion and a libc callback; 8 threads; code rewritten at the same address. The
    // checker follows every conditional branch's taken/untaken marker and every indirect
    // branch's target marker to the next instruction.
    for args in [&["loop", "1000"][..], &["mix"], &["threads"], &["jit"]] {
        let (counts, total, _) = check(&l, "qemu_cases", args, &[]);
        assert_eq!(
            count(&counts, "total (fetched) instructions"),
            total,
            "{args:?}"
        );
        if args == ["threads"] {
            assert_eq!(count(&counts, "total threads"), 9, "{counts}");
        }
    }

    // A fork + exec chain: a shell runs a pipeline and a program (posix_spawn's failure
    // reporting cannot be traced here: QEMU runs vfork as fork), every image checked.
    let (counts, total, _) = check_program(
        &l,
        Path::new("/bin/sh"),
        false,
        &["-c", "echo a | cat; /bin/echo b"],
        &[],
    );
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    assert!(count(&counts, "total threads") >= 4, "{counts}");

    // JIT code named in a perf map: instructions written at run time, their encodings
    // from the trace's code records.
    let (counts, total, _) = check(&l, "minijit", &[], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
}
