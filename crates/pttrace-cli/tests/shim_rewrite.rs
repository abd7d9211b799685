//! Patched syscall sites (`PTTRACER_REWRITE`): the same exactness and the same register,
//! flag and red-zone semantics as the Syscall User Dispatch path. Site stubs (`sites`, the
//! default) need no privileges and always run; the page-0 trampoline (`all`) skips, with a
//! message, where page 0 cannot be mapped (needs CAP_SYS_RAWIO or vm.mmap_min_addr=0).

mod shim_util;

use drpttracer::format::ptt;
use shim_util::*;

const NR_GETPPID: u64 = 110;

/// The rewrite levels that patch sites.
const KINDS: [&str; 2] = ["sites", "all"];

/// Runs `prog` with rewrite level `kind`; None (after printing SKIP) when that level is
/// unavailable here.
fn run_fast(prog: &std::path::Path, out: &std::path::Path, kind: &str) -> Option<TraceDir> {
    let _ = std::fs::remove_dir_all(out);
    let o = run_traced(out, prog, &[], &[("PTTRACER_REWRITE", kind)]);
    let err = String::from_utf8_lossy(&o.stderr);
    if (kind == "all" && err.contains("cannot map page 0")) || err.contains("lacks") {
        println!("SKIP: {}", err.trim());
        return None;
    }
    assert!(o.status.success(), "{o:?}");
    Some(read_dir(out))
}

/// Syscall sites the fast path patched, from the ProcessEnd records of `out`.
fn patched_sites(out: &std::path::Path) -> u64 {
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "info"))
        .map(|p| {
            drpttracer::format::summary::summarize_process(&p)
                .unwrap()
                .patched_sites
        })
        .sum()
}

#[test]
fn site_stubs_keep_registers_flags_red_zone_and_exact_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("site_stub", tmp.path());
    for (kind, patched) in [("sites", "1 1 1"), ("off", "0 0 0")] {
        let out = tmp.path().join(kind);
        let o = run_traced(&out, &prog, &[], &[("PTTRACER_REWRITE", kind)]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{kind}: {o:?}");
        // The program checks every register, CF, xmm0 and the red zone across each
        // syscall itself, and reads its own code to see which movs became jmps.
        assert_eq!(
            stdout,
            format!("patched {patched}; syscall kept 1; bad 0\n"),
            "{kind}"
        );
        let td = read_dir(&out);
        assert_eq!(td.threads.len(), 1);
        // 1 + 50 x (site5, site7, site_jt, regcheck) getppid; 1 + 50 getpid through a jump
        // straight to a patched site's syscall.
        assert_eq!(td.count_nr(NR_GETPPID), 201, "{kind}");
        assert_eq!(td.count_nr(39), 51, "{kind}");
        let regcheck_args = [0x2001, 0x2002, 0x2003, 0x2006, 0x2004, 0x2005];
        let w = &td.threads[0].windows;
        assert_eq!(
            w.iter()
                .filter(|w| w.nr == NR_GETPPID && w.args == regcheck_args)
                .count(),
            50,
            "{kind}"
        );
        for (i, w) in w.iter().enumerate() {
            assert_eq!(w.index, i as u64);
        }
        let sites = patched_sites(&out);
        if kind == "off" {
            assert_eq!(sites, 0);
        } else {
            // site5, site7, site_jt, regcheck, plus libc's getppid/getpid/write...
            assert!(sites >= 4, "{sites} sites patched");
        }
    }
}

#[test]
fn fast_path_counts_sixteen_threads_exactly() {
    for kind in KINDS {
        sixteen_threads(kind);
    }
}

fn sixteen_threads(kind: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("threads", tmp.path());
    let out = tmp.path().join("trace");
    let Some(td) = run_fast(&prog, &out, kind) else {
        return;
    };
    assert_eq!(td.threads.len(), 17);
    for t in td.threads.iter().filter(|t| t.header.tid != t.header.pid) {
        assert_eq!(
            t.windows.iter().filter(|w| w.nr == NR_GETPPID).count(),
            1000
        );
        for (i, w) in t.windows.iter().enumerate() {
            assert_eq!(w.index, i as u64);
        }
        assert_eq!(t.end.map(|e| e.0), Some(ptt::EndReason::ThreadExit as u32));
    }
    assert_eq!(td.count_nr(NR_GETPPID), 16_001);
    assert!(patched_sites(&out) >= 1, "no syscall site was patched");
}

#[test]
fn fast_path_keeps_raw_syscall_arguments_and_signal_semantics() {
    for kind in KINDS {
        raw_syscall_and_signals(kind);
    }
}

fn raw_syscall_and_signals(kind: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("raw_syscall", tmp.path());
    let out = tmp.path().join("trace");
    let Some(td) = run_fast(&prog, &out, kind) else {
        return;
    };
    let ppid: Vec<_> = td.threads[0]
        .windows
        .iter()
        .filter(|w| w.nr == NR_GETPPID)
        .collect();
    assert_eq!(ppid.len(), 100);
    for (i, w) in ppid.iter().enumerate().skip(1) {
        assert_eq!(
            w.args,
            [0x1111 + i as u64, 0x2222, 0x3333, 0x4444, 0x5555, 0x6666]
        );
    }
    let prog = compile("handlers", tmp.path());
    let out = tmp.path().join("trace2");
    let o = run_traced(&out, &prog, &[], &[("PTTRACER_REWRITE", kind)]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ok sigsys handler\nok sigtrap handler\nok sigprocmask\nok sa_restart read\nok eintr read\n\
         sud off: refused\n"
    );
}

#[test]
fn fast_path_follows_fork_and_exec() {
    for kind in KINDS {
        fork_and_exec(kind);
    }
}

fn fork_and_exec(kind: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("trace");
    if run_fast(std::path::Path::new("/bin/true"), &out, kind).is_none() {
        return;
    }
    std::fs::remove_dir_all(&out).unwrap();
    let o = run_traced(
        &out,
        std::path::Path::new("/bin/sh"),
        &["-c", "ls / | wc -l"],
        &[("PTTRACER_REWRITE", kind)],
    );
    assert!(o.status.success(), "{o:?}");
    let td = read_dir(&out);
    // The shell, its two forked children, and ls and wc after exec: one thread each (the
    // children's writer threads are never traced, even though they run patched code).
    assert_eq!(td.infos.len(), 5);
    for info in &td.infos {
        assert_eq!(
            td.threads_of(info.process.pid, info.process.nonce).len(),
            1,
            "{}",
            info.name
        );
    }
}
