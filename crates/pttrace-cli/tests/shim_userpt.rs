//! User-mode PT of thread windows under the shim (emulated backend: single-stepping),
//! decoded with the library's `ptt_dir` reader: exact loop counts between two syscalls,
//! every thread of a multi-threaded program, and `/bin/ls` without gaps.

mod shim_util;

use drpttracer::decode::ptt_dir::{self as ptt_input, PttTrace, PttWindowInfo};
use drpttracer::decode::Record;
use drpttracer::format::ptt::{WF_PT_ABSENT, WF_PT_DROPPED, WF_PT_LOST};
use shim_util::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const NR_GETPID: u64 = 39;
const NR_GETPPID: u64 = 110;
const NR_GETTID: u64 = 186;

/// Compiles tests/progs/userpt_loop.c without PIE (symbol addresses are load addresses).
fn loop_prog(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/userpt_loop.c");
    let out = dir.join("userpt_loop");
    let st = Command::new("cc")
        .args(["-O1", "-no-pie", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed for {}", src.display());
    out
}

/// `pttrace run --mode user --window thread --backend emulated` into `out` (the shim's
/// single-stepping; without `--backend` a machine with QEMU would use the QEMU backend).
fn run_user_thread(out: &Path, prog: &Path, args: &[&str]) -> String {
    run_user_thread_with(out, &[], prog, args)
}

fn run_user_thread_with(out: &Path, opts: &[&str], prog: &Path, args: &[&str]) -> String {
    let o = Command::new(pttrace())
        .arg("run")
        .arg("--out")
        .arg(out)
        .arg("--lib")
        .arg(lib_path())
        .args([
            "--mode",
            "user",
            "--window",
            "thread",
            "--backend",
            "emulated",
        ])
        .args(opts)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .unwrap();
    let text = text(&o);
    assert!(o.status.success(), "pttrace run failed: {text}");
    text
}

fn ips(recs: &[Record]) -> Vec<u64> {
    recs.iter()
        .filter_map(|r| r.as_instruction().map(|i| i.pc))
        .collect()
}

fn gaps(recs: &[Record]) -> Vec<String> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Gap(g) => Some(g.to_string()),
            _ => None,
        })
        .collect()
}

struct LoopSyms {
    head: u64,
    jz: u64,
    jnz: u64,
    nop: u64,
    dec: u64,
}

fn loop_syms(exe: &Path) -> LoopSyms {
    let head = symbol(exe, "pt_loop_head");
    let jz = symbol(exe, "pt_loop_jz");
    let jnz = symbol(exe, "pt_loop_jnz");
    // test cl,1 (3 bytes) | jz rel8 (2) | nop (1) | dec rcx (3) | jnz rel8 (2)
    assert_eq!(jz, head + 3);
    assert_eq!(jnz, head + 9);
    LoopSyms {
        head,
        jz,
        jnz,
        nop: jz + 2,
        dec: jz + 3,
    }
}

/// Asserts the exact loop of `n` iterations in `ips` (and nothing else of the loop).
fn assert_loop(ips: &[u64], s: &LoopSyms, n: usize) {
    let count = |a: u64| ips.iter().filter(|&&ip| ip == a).count();
    assert_eq!(count(s.head), n, "test executions");
    assert_eq!(count(s.jz), n, "jz executions");
    assert_eq!(
        count(s.nop),
        n / 2,
        "nop executions (jz not taken: odd rcx)"
    );
    assert_eq!(count(s.dec), n, "dec executions");
    assert_eq!(count(s.jnz), n, "jnz executions");
    // Branch outcomes: jz taken exactly when rcx is even (rcx counts down from n).
    let mut rcx = n;
    let mut seen = 0;
    for (k, &ip) in ips.iter().enumerate() {
        if ip == s.jz {
            let next = ips[k + 1];
            let want = if rcx % 2 == 0 { s.dec } else { s.nop };
            assert_eq!(next, want, "jz outcome with rcx={rcx}");
            seen += 1;
        }
        if ip == s.jnz {
            rcx -= 1;
            let next = ips.get(k + 1).copied();
            if rcx > 0 {
                assert_eq!(next, Some(s.head), "jnz taken with rcx={rcx}");
            } else {
                assert_ne!(next, Some(s.head), "jnz falls through at the end");
            }
        }
    }
    assert_eq!(seen, n);
}

/// Every window of one thread with its records.
type ThreadWindows = Vec<(PttWindowInfo, Vec<Record>)>;

fn decode_all(dir: &Path) -> (PttTrace, Vec<ThreadWindows>) {
    let t = ptt_input::open(dir).unwrap();
    let all = t
        .threads
        .iter()
        .map(|th| t.collect_thread(th).unwrap())
        .collect();
    (t, all)
}

#[test]
fn loop_between_two_syscalls_decodes_with_exact_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = loop_prog(tmp.path());
    let out = tmp.path().join("trace");
    let summary = run_user_thread(&out, &prog, &[]);
    assert!(summary.contains("backend emulated"), "{summary}");
    let s = loop_syms(&prog);
    let (t, all) = decode_all(&out);
    assert_eq!(t.threads.len(), 1);
    let wins = &all[0];
    // The window that ends at getppid holds no loop; the one ending at getpid holds the
    // whole loop, no gap, and ends with the getpid syscall instruction.
    let k = wins
        .iter()
        .position(|(w, _)| w.nr == NR_GETPPID)
        .expect("getppid window");
    // (getppid is the program's first syscall after the shim started: stepping starts
    // there, the window before it has no PT.)
    assert!(!ips(&wins[k].1).contains(&s.head));
    let (w, recs) = &wins[k + 1];
    assert_eq!(w.nr, NR_GETPID, "the next syscall after the loop is getpid");
    assert_eq!(w.flags & (WF_PT_ABSENT | WF_PT_LOST | WF_PT_DROPPED), 0);
    assert!(w.pt_len > 0);
    assert_eq!(gaps(recs), Vec::<String>::new());
    let ip = ips(recs);
    assert_loop(&ip, &s, 1000);
    // The window starts at getppid's return address and ends with getpid's `syscall`.
    let first = recs.iter().find_map(|r| match r {
        Record::TraceEnabled { ip } => Some(*ip),
        _ => None,
    });
    assert_eq!(first, ip.first().copied());
    let last = recs
        .iter()
        .rev()
        .find_map(|r| r.as_instruction())
        .expect("instructions");
    assert_eq!(
        last.encoding(),
        &[0x0f, 0x05],
        "window ends with the syscall"
    );
    assert!(recs
        .iter()
        .any(|r| matches!(r, Record::Syscall { pc } if *pc == last.pc)));
    // Every window after the first syscall has PT and decodes without gaps.
    for (w, recs) in wins.iter().skip(1) {
        assert_eq!(w.flags & WF_PT_ABSENT, 0, "window {} has PT", w.index);
        assert_eq!(gaps(recs), Vec::<String>::new(), "window {}", w.index);
    }
}

#[test]
fn every_thread_of_a_threaded_program_decodes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = loop_prog(tmp.path());
    let out = tmp.path().join("trace");
    run_user_thread(&out, &prog, &["threads"]);
    let s = loop_syms(&prog);
    let (t, all) = decode_all(&out);
    assert_eq!(t.threads.len(), 5, "main + 4 workers");
    let mut loops = Vec::new();
    for (th, wins) in t.threads.iter().zip(&all) {
        let with_pt = wins.iter().filter(|(w, _)| w.pt_len > 0).count();
        let worker = th.header.tid != th.header.pid;
        if worker {
            // Stepped from its first instruction: clone's return in libc, where the new
            // thread starts, up to its first syscall.
            assert_eq!(with_pt, wins.len(), "thread {}", th.header.tid);
            let first = ips(&wins[0].1);
            assert!(first.len() > 3, "thread {}: {first:x?}", th.header.tid);
            let proc_ = t.process_of(th).expect("info file");
            let libc = proc_
                .maps
                .iter()
                .find(|m| m.exec && m.path.contains("/libc"))
                .expect("libc mapping");
            assert!(
                (libc.start..libc.end).contains(&first[0]),
                "thread {} starts at {:#x}, outside libc",
                th.header.tid,
                first[0]
            );
            let last = wins[0].1.iter().rev().find_map(|r| r.as_instruction());
            assert_eq!(
                last.map(|i| i.encoding()),
                Some(&[0x0f, 0x05][..]),
                "the first window ends with the thread's first syscall"
            );
        } else {
            assert!(
                with_pt + 1 >= wins.len(),
                "thread {}: only the first window lacks PT",
                th.header.tid
            );
        }
        for (w, recs) in wins {
            assert_eq!(
                gaps(recs),
                Vec::<String>::new(),
                "thread {} window {}",
                th.header.tid,
                w.index
            );
            assert_eq!(w.flags & (WF_PT_LOST | WF_PT_DROPPED), 0);
        }
        if let Some(k) = wins.iter().position(|(w, _)| w.nr == NR_GETTID) {
            assert_eq!(wins[k - 1].0.nr, NR_GETPPID);
            let ip = ips(&wins[k].1);
            let n = ip.iter().filter(|&&a| a == s.jnz).count();
            assert_loop(&ip, &s, n);
            loops.push(n);
        }
    }
    loops.sort();
    assert_eq!(loops, vec![100, 200, 300, 400]);
}

#[test]
fn bin_ls_decodes_without_gaps_inside_ls_and_libc() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("a"), b"x").unwrap();
    std::fs::write(dir.join("b"), b"y").unwrap();
    let out = tmp.path().join("trace");
    run_user_thread(&out, Path::new("/bin/ls"), &[dir.to_str().unwrap()]);
    let (t, all) = decode_all(&out);
    assert_eq!(t.threads.len(), 1);
    let proc_ = t.process_of(&t.threads[0]).expect("info file");
    let range_of = |pred: &dyn Fn(&str) -> bool| -> Vec<(u64, u64)> {
        proc_
            .maps
            .iter()
            .filter(|m| m.exec && pred(&m.path))
            .map(|m| (m.start, m.end))
            .collect()
    };
    let ls = range_of(&|p| p.ends_with("/ls"));
    let libc = range_of(&|p| p.contains("/libc.so") || p.contains("/libc-"));
    assert!(!ls.is_empty() && !libc.is_empty(), "maps: {:?}", proc_.maps);
    let inside = |r: &[(u64, u64)], ip: u64| r.iter().any(|&(a, b)| ip >= a && ip < b);
    let (mut total, mut in_ls, mut in_libc) = (0u64, 0u64, 0u64);
    let wins = &all[0];
    assert!(wins.len() > 10);
    for (w, recs) in wins {
        assert_eq!(gaps(recs), Vec::<String>::new(), "window {}", w.index);
        assert_eq!(
            w.flags & (WF_PT_LOST | WF_PT_DROPPED),
            0,
            "window {}",
            w.index
        );
        if w.index > 0 {
            assert!(w.pt_len > 0, "window {} has PT", w.index);
        }
        for ip in ips(recs) {
            total += 1;
            in_ls += u64::from(inside(&ls, ip));
            in_libc += u64::from(inside(&libc, ip));
        }
    }
    eprintln!("ls: {total} instructions, {in_ls} in ls, {in_libc} in libc");
    assert!(total > 10_000, "{total}");
    assert!(in_ls > 1000 && in_libc > 1000, "{in_ls} {in_libc}");
    // The CLI decodes the directory too.
    let o = Command::new(pttrace())
        .arg("decode")
        .arg(&out)
        .args(["--format", "summary"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    let want = format!("{total} instructions, 0 gaps, 0 overflows, 0 damaged files");
    let total_line = text
        .lines()
        .find(|l| l.starts_with("total: "))
        .unwrap_or("");
    assert!(total_line.contains(&want), "{text}");
    // Which decoder gave the records: every window's, by one of the two.
    let by = text.lines().last().unwrap_or("");
    assert!(by.starts_with("decoded by: "), "{text}");
}

#[test]
fn syscall_windows_in_user_mode_say_why_pt_is_absent() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = loop_prog(tmp.path());
    let out = tmp.path().join("trace");
    let o = Command::new(pttrace())
        .arg("run")
        .arg("--out")
        .arg(&out)
        .arg("--lib")
        .arg(lib_path())
        .args(["--mode", "user", "--window", "syscall", "--"])
        .arg(&prog)
        .output()
        .unwrap();
    assert!(o.status.success());
    let t = ptt_input::open(&out).unwrap();
    let h = &t.threads[0].header;
    assert!(!h.pt_present);
    assert!(
        h.pt_absent_reason.contains("--window thread"),
        "{}",
        h.pt_absent_reason
    );
    let wins = t.collect_thread(&t.threads[0]).unwrap();
    assert!(wins
        .iter()
        .all(|(w, r)| w.flags & WF_PT_ABSENT != 0 && r.is_empty()));
}

#[test]
fn own_sigsys_and_sigtrap_handlers_keep_working_while_stepped() {
    // handlers.c: its own SIGSYS and SIGTRAP handlers, syscalls inside handlers, a read
    // interrupted by SIGALRM with and without SA_RESTART, sigprocmask blocking everything.
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("handlers", tmp.path());
    let out = tmp.path().join("trace");
    let text = run_user_thread(&out, &prog, &[]);
    for check in [
        "ok sigsys handler",
        "ok sigtrap handler",
        "ok sigprocmask",
        "ok sa_restart read",
        "ok eintr read",
    ] {
        assert!(text.contains(check), "{check} missing: {text}");
    }
    let (t, all) = decode_all(&out);
    assert_eq!(t.threads.len(), 1);
    let wins = &all[0];
    let with_pt = wins.iter().filter(|(w, _)| w.pt_len > 0).count();
    assert!(with_pt > 10, "{with_pt} windows with PT");
    for (w, recs) in wins {
        assert_eq!(
            w.flags & (WF_PT_LOST | WF_PT_DROPPED),
            0,
            "window {}",
            w.index
        );
        // Signal handlers run untraced or as a new window; never a silent wrong path:
        // whatever discontinuity there is must be an explicit gap, and here there is none.
        assert_eq!(gaps(recs), Vec::<String>::new(), "window {}", w.index);
    }
}

#[test]
fn a_window_longer_than_the_buffer_is_flagged_lost_and_still_decodes() {
    // --pt-shift 1: a 2-page ring, i.e. 8192 steps per window; the loop needs ~450000.
    let tmp = tempfile::tempdir().unwrap();
    let prog = loop_prog(tmp.path());
    let out = tmp.path().join("trace");
    run_user_thread_with(&out, &["--pt-shift", "1"], &prog, &["long"]);
    let s = loop_syms(&prog);
    let (_, all) = decode_all(&out);
    let wins = &all[0];
    let k = wins
        .iter()
        .position(|(w, _)| w.nr == NR_GETPID)
        .expect("getpid window");
    let (w, recs) = &wins[k];
    assert_ne!(
        w.flags & WF_PT_LOST,
        0,
        "overflow flagged: {:?}",
        w.flag_names()
    );
    assert_eq!(gaps(recs), Vec::<String>::new());
    let ip = ips(recs);
    let page = 4096usize;
    assert!(
        ip.len() <= 2 * page && ip.len() > page,
        "{} instructions",
        ip.len()
    );
    // What was captured is the start of the loop, exactly.
    let n = ip.iter().filter(|&&a| a == s.jnz).count();
    assert!(n > 100 && n < 100_000, "{n}");
    let first_test = ip.iter().position(|&a| a == s.head).unwrap();
    let mut rcx = 100_000usize;
    for (j, &a) in ip[first_test..].iter().enumerate() {
        if a == s.jz {
            let want = if rcx % 2 == 0 { s.dec } else { s.nop };
            if let Some(&next) = ip[first_test..].get(j + 1) {
                assert_eq!(next, want, "rcx={rcx}");
            }
        }
        if a == s.jnz {
            rcx -= 1;
        }
    }
    // Stepping resumes with the next window.
    let (next, nrecs) = &wins[k + 1];
    assert_eq!(next.nr, NR_GETPPID);
    assert_eq!(next.flags & (WF_PT_LOST | WF_PT_ABSENT | WF_PT_DROPPED), 0);
    assert!(!ips(nrecs).is_empty());
}

#[test]
fn fork_exec_pipeline_every_process_and_thread_decodes() {
    // /bin/sh -c 'ls DIR | wc -l': fork, exec, pipes; every image traced again via
    // LD_PRELOAD, every thread file decodes without gaps.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("a"), b"x").unwrap();
    let out = tmp.path().join("trace");
    let cmd = format!("ls {} | wc -l", dir.display());
    let text = run_user_thread(&out, Path::new("/bin/sh"), &["-c", &cmd]);
    assert!(text.lines().any(|l| l.trim() == "1"), "wc output: {text}");
    let (t, all) = decode_all(&out);
    assert!(
        t.processes.len() >= 4,
        "sh, its fork children, ls and wc images"
    );
    let mut images = Vec::new();
    for (th, wins) in t.threads.iter().zip(&all) {
        let p = t.process_of(th).expect("info file of every thread");
        images.push(p.cmdline.clone());
        let mut insns = 0;
        for (w, recs) in wins {
            assert_eq!(
                gaps(recs),
                Vec::<String>::new(),
                "{} window {}",
                p.cmdline,
                w.index
            );
            assert_eq!(w.flags & (WF_PT_LOST | WF_PT_DROPPED), 0);
            insns += ips(recs).len();
        }
        assert!(insns > 0, "{}: instructions decoded", p.cmdline);
    }
    assert!(images.iter().any(|c| c.starts_with("ls ")), "{images:?}");
    assert!(images.iter().any(|c| c == "wc -l"), "{images:?}");
}

#[test]
fn code_of_a_library_loaded_later_decodes_through_the_window_sideband() {
    let tmp = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/userpt_dlopen.c");
    let prog = tmp.path().join("userpt_dlopen");
    let st = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&prog)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success());
    let out = tmp.path().join("trace");
    let text = run_user_thread(&out, &prog, &[]);
    let cos = text
        .lines()
        .find_map(|l| u64::from_str_radix(l.trim().strip_prefix("0x")?, 16).ok())
        .unwrap_or_else(|| panic!("no address printed: {text}"));
    let (t, all) = decode_all(&out);
    let proc_ = t.process_of(&t.threads[0]).unwrap();
    assert!(
        !proc_.maps.iter().any(|m| m.path.contains("libm.so")),
        "libm is not among the mappings at start"
    );
    let wins = &all[0];
    assert!(wins.iter().any(|(w, _)| w.sideband_len > 0));
    let mut found = false;
    for (w, recs) in wins {
        assert_eq!(gaps(recs), Vec::<String>::new(), "window {}", w.index);
        found |= ips(recs).contains(&cos);
    }
    assert!(found, "cos at {cos:#x} decoded");
}

#[test]
fn signals_arriving_mid_loop_are_explicit_and_the_loop_stays_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = loop_prog(tmp.path());
    let out = tmp.path().join("trace");
    let text = run_user_thread(&out, &prog, &["alarm"]);
    let alarms: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("alarms ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no alarm count: {text}"));
    let s = loop_syms(&prog);
    let (_, all) = decode_all(&out);
    let wins = &all[0];
    let getpid = wins
        .iter()
        .position(|(w, _)| w.nr == NR_GETPID)
        .expect("getpid window");
    // The loop's window is the one `getpid` closes; but an alarm that lands at that
    // `syscall` itself (after the loop, seen about once in 15 full test runs under load)
    // makes the handler's `rt_sigreturn` close it, flagged no-return, and the `getpid`
    // window holds the syscall's own instruction only: a known limit of the shim's window
    // bookkeeping (a signal delivered while it handles the closing syscall), said here so
    // that the loop is still checked exactly in the window that holds it.
    let mut loop_window = getpid;
    if let Some(before) = getpid.checked_sub(1) {
        let (wb, rb) = &wins[before];
        let heads_before = ips(rb).iter().filter(|&&a| a == s.head).count();
        if wb.nr == 15 && heads_before > 0 {
            eprintln!(
                "an alarm landed at getpid: the loop is in window {} (rt_sigreturn)",
                wb.index
            );
            assert!(ips(&wins[getpid].1).len() <= 2, "getpid window after it");
            loop_window = before;
        }
    }
    let (w, recs) = &wins[loop_window];
    assert_eq!(w.flags & (WF_PT_ABSENT | WF_PT_LOST | WF_PT_DROPPED), 0);
    assert_eq!(gaps(recs), Vec::<String>::new());
    let ip = ips(recs);
    let heads = ip.iter().filter(|&&a| a == s.head).count();
    if heads != 20000 {
        // (Seen once under a full test run's load: keep the trace and say which windows
        // there were, to find where the loop went.)
        let kept = std::env::temp_dir().join("shim_userpt_signals_failure");
        let _ = std::fs::remove_dir_all(&kept);
        let _ = Command::new("cp").arg("-r").arg(&out).arg(&kept).status();
        let list: Vec<String> = wins
            .iter()
            .map(|(w, r)| {
                let n = ips(r).len();
                format!(
                    "window {} nr {} flags {:#x}: {n} instructions",
                    w.index, w.nr, w.flags
                )
            })
            .collect();
        panic!(
            "the getpid window has {heads} loop heads of 20000 ({alarms} alarms); the trace \
             is kept in {}; its windows:\n{}",
            kept.display(),
            list.join("\n")
        );
    }
    assert_loop(&ip, &s, 20000);
    // Each handler entry inside the window: an asynchronous disable at the interrupted
    // instruction, and tracing enabled again at that same instruction.
    let mut disables = 0;
    for (k, r) in recs.iter().enumerate() {
        if let Record::TraceDisabled { ip: Some(at) } = r {
            if k + 3 < recs.len() {
                let resumed = recs[k + 1..].iter().find_map(|r| match r {
                    Record::TraceEnabled { ip } => Some(*ip),
                    _ => None,
                });
                assert_eq!(resumed, Some(*at), "resumes where it was interrupted");
                disables += 1;
            }
        }
    }
    eprintln!("{alarms} alarms, {disables} inside the loop window");
    assert!(
        alarms > 0 && disables > 0,
        "{alarms} alarms, {disables} disables"
    );
    // Handler windows (rt_sigreturn) carry no PT: the handlers run untraced (but the one
    // that closed the loop's window, above).
    assert!(wins
        .iter()
        .enumerate()
        .filter(|(k, (w, _))| w.nr == 15 && *k != loop_window)
        .all(|(_, (w, _))| w.flags & WF_PT_ABSENT != 0));
}
