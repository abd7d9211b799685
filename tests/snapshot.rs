//! Snapshot (flight-recorder) mode end to end under QEMU: `pttrace run --snapshot SIZE
//! --trigger ...` of tests/progs/snapshot_loop.c, whose loop iterations the decoded
//! instruction stream spells (step(i) calls bit_one/bit_zero per bit of i). Needs
//! `qemu-x86_64`; prints `SKIP: <reason>` without it.

mod shim_util;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use drpttracer::decode::ptt_dir;
use drpttracer::decode::Record;
use drpttracer::format::ptt::{self, RecordType, WF_NO_SYSCALL};
use drpttracer::format::snapshot::{SnapshotRecord, TriggerKind};
use shim_util::{plugin, pttrace, qemu_available, qemu_run_command, run_under_qemu, symbol, text};

const N: u64 = 100_000;
const SIZE: u64 = 64 * 1024;

struct Prog {
    _dir: tempfile::TempDir,
    exe: PathBuf,
    out: PathBuf,
    step: u64,
    one: u64,
    zero: u64,
    marker: u64,
}

fn prog() -> Option<Prog> {
    if !qemu_available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = shim_util::compile_with("snapshot_loop", dir.path(), "sl", &["-no-pie"]);
    let out = dir.path().join("out");
    Some(Prog {
        step: symbol(&exe, "step"),
        one: symbol(&exe, "bit_one"),
        zero: symbol(&exe, "bit_zero"),
        marker: symbol(&exe, "marker"),
        exe,
        out,
        _dir: dir,
    })
}

fn run(p: &Prog, opts: &[&str], args: &[&str]) -> Output {
    let mut cmd: Vec<&OsStr> = vec![p.exe.as_os_str()];
    cmd.extend(args.iter().map(OsStr::new));
    let o = run_under_qemu(&p.out, opts, &cmd);
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// One thread file: its snapshots (each with the windows after it) and its decoded
/// instructions per snapshot.
struct Snap {
    rec: SnapshotRecord,
    windows: Vec<ptt::Window>,
    pt_bytes: u64,
    pcs: Vec<u64>,
    gaps: usize,
}

fn snapshots(out: &Path) -> Vec<Snap> {
    let t = ptt_dir::open(out).unwrap();
    assert_eq!(t.threads.len(), 1, "one thread");
    let th = &t.threads[0];
    let data = std::fs::read(&th.path).unwrap();
    let pf = ptt::parse("t", &data).unwrap();
    assert_eq!(pf.tail, ptt::Tail::Clean);
    let mut snaps: Vec<Snap> = Vec::new();
    for f in &pf.frames {
        match RecordType::from_raw(f.ty) {
            Some(RecordType::Snapshot) => snaps.push(Snap {
                rec: SnapshotRecord::decode(f.payload).unwrap(),
                windows: Vec::new(),
                pt_bytes: 0,
                pcs: Vec::new(),
                gaps: 0,
            }),
            Some(RecordType::Window) => {
                let w = ptt::decode_window(f.payload).unwrap();
                let s = snaps.last_mut().expect("a window outside any snapshot");
                s.windows.push(w.window);
                s.pt_bytes += w.pt.len() as u64;
            }
            _ => {}
        }
    }
    // Decoded windows in file order, handed to the snapshot they belong to.
    let decoded = t.collect_thread(th).unwrap();
    let mut it = decoded.into_iter();
    for s in &mut snaps {
        assert_eq!(s.rec.windows, s.windows.len() as u64);
        assert_eq!(s.rec.pt_bytes, s.pt_bytes);
        for w in &s.windows {
            let (info, recs) = it.next().unwrap();
            assert_eq!(info.index, w.index);
            for r in recs {
                match r {
                    Record::Gap(_) => s.gaps += 1,
                    r => {
                        if let Some(i) = r.as_instruction() {
                            s.pcs.push(i.pc)
                        }
                    }
                }
            }
        }
    }
    snaps
}

/// The iterations spelled by `pcs`: (bits seen before the first step() entry, the
/// numbers of complete iterations in order, bits of the unfinished last one).
fn iterations(p: &Prog, pcs: &[u64]) -> (Vec<bool>, Vec<u64>, Option<usize>) {
    let mut lead = Vec::new();
    let mut done = Vec::new();
    let mut cur: Option<(u64, usize)> = None;
    for &pc in pcs {
        let bit = if pc == p.one {
            Some(true)
        } else if pc == p.zero {
            Some(false)
        } else {
            None
        };
        if pc == p.step {
            if let Some((v, n)) = cur.take() {
                assert_eq!(n, 17, "an iteration with {n} bits");
                done.push(v);
            }
            cur = Some((0, 0));
        } else if let Some(b) = bit {
            match cur.as_mut() {
                Some((v, n)) => {
                    *v |= u64::from(b) << *n;
                    *n += 1;
                }
                None => lead.push(b),
            }
        }
    }
    let mut unfinished = None;
    if let Some((v, n)) = cur {
        if n == 17 {
            done.push(v);
        } else {
            unfinished = Some(n);
        }
    }
    (lead, done, unfinished)
}

/// The complete iterations are consecutive and end at `last`; the bits before the first
/// one are the high bits of the iteration before it. Returns how many complete ones.
fn assert_tail_of_loop(p: &Prog, pcs: &[u64], last: u64) -> u64 {
    let (lead, done, unfinished) = iterations(p, pcs);
    assert_eq!(unfinished, None, "the snapshot ends inside an iteration");
    let k = done.len() as u64;
    assert!(k > 0, "no complete iteration");
    let first = last + 1 - k;
    let want: Vec<u64> = (first..=last).collect();
    assert_eq!(done, want, "not the last {k} iterations");
    if first > 0 {
        let prev = first - 1;
        let skip = 17 - lead.len();
        let want_lead: Vec<bool> = (skip..17).map(|b| (prev >> b) & 1 == 1).collect();
        assert_eq!(lead, want_lead, "the partial iteration {prev}");
    }
    k
}

#[test]
fn addr_trigger_keeps_exactly_the_end_of_the_loop_up_to_marker() {
    let Some(p) = prog() else { return };
    let o = run(
        &p,
        &["--snapshot", "64K", "--trigger", "addr:marker"],
        &[&N.to_string()],
    );
    let out = text(&o);
    assert!(
        out.contains(&format!(
            "snapshot 1: trigger addr:marker ({:#x}) fired in thread",
            p.marker
        )),
        "{out}"
    );
    assert!(out.contains("snapshot 1 (addr:marker"), "{out}");
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1, "the trigger fired once");
    let s = &snaps[0];
    assert_eq!(s.rec.number, 1);
    assert_eq!(s.rec.kind, TriggerKind::Addr as u32);
    assert_eq!(s.rec.ring_size, SIZE);
    assert_eq!(s.gaps, 0);
    // At most SIZE of PT, and the ring is not far from full (windows of SIZE/8).
    assert!(s.pt_bytes <= SIZE, "{} PT bytes", s.pt_bytes);
    assert!(s.pt_bytes >= SIZE * 3 / 4, "{} PT bytes", s.pt_bytes);
    assert!(s.rec.discarded_windows > 100, "{:?}", s.rec);
    // Only the end: the last K iterations, whole, then main up to the call of marker.
    let k = assert_tail_of_loop(&p, &s.pcs, N - 1);
    assert!(k > 200 && k < 5000, "{k} iterations");
    assert!(
        !s.pcs.contains(&p.marker),
        "marker's entry itself is not executed"
    );
    let last = *s.pcs.last().unwrap();
    let main = symbol(&p.exe, "main");
    assert!(
        (main..main + 0x200).contains(&last),
        "the last instruction {last:#x} is not main's call of marker"
    );
    // Nothing from the start of the program: no instruction before the loop's tail, no
    // loader, no windows cut at a syscall (the loop makes none).
    assert!(s.windows.iter().all(|w| w.flags & WF_NO_SYSCALL != 0));
    assert!(s.windows[0].index > 100);
    // Nothing was written after the trigger (no exit trigger).
    let rep = Command::new(pttrace())
        .arg("report")
        .arg(&p.out)
        .output()
        .unwrap();
    assert!(rep.status.success(), "{}", text(&rep));
    assert!(
        text(&rep).contains("snapshot mode: last 65536 PT bytes per thread, triggers addr:marker")
    );
}

#[test]
fn a_trigger_firing_twice_writes_two_numbered_snapshots_without_overlap() {
    let Some(p) = prog() else { return };
    run(
        &p,
        &["--snapshot", "16K", "--trigger", "addr:marker"],
        &["20000", "twice"],
    );
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 2);
    assert_eq!(
        snaps.iter().map(|s| s.rec.number).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_tail_of_loop(&p, &snaps[0].pcs, 19_999);
    assert_tail_of_loop(&p, &snaps[1].pcs, 39_999);
    let last0 = snaps[0].windows.last().unwrap().index;
    assert!(snaps[1].windows[0].index > last0);
    for s in &snaps {
        assert!(s.pt_bytes <= 16 * 1024, "{}", s.pt_bytes);
    }
}

#[test]
fn syscall_trigger_ends_with_the_syscall_window() {
    let Some(p) = prog() else { return };
    run(
        &p,
        &["--snapshot", "32K", "--trigger", "syscall:getppid"],
        &["30000", "syscall"],
    );
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1);
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Syscall as u32);
    assert_eq!(s.rec.trigger, "syscall:getppid");
    let w = s.windows.last().unwrap();
    assert_eq!(w.nr, libc::SYS_getppid as u64);
    assert!(w.ret > 0, "getppid returned {}", w.ret);
    assert!(s.pt_bytes <= 32 * 1024);
    assert_tail_of_loop(&p, &s.pcs, 29_999);
    assert!(!s.pcs.contains(&p.marker));
}

#[test]
fn exit_is_the_default_trigger_and_holds_the_end_of_the_program() {
    let Some(p) = prog() else { return };
    run(&p, &["--snapshot", "32K"], &["30000"]);
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1);
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Exit as u32);
    assert_eq!(s.rec.trigger, "exit (exit_group)");
    assert!(s.pt_bytes <= 32 * 1024);
    assert!(s.pcs.contains(&p.marker));
    assert_eq!(
        s.windows.last().unwrap().nr,
        libc::SYS_exit_group as u64,
        "the last window ends at exit_group"
    );
    // The loop's end is there (then marker, then the exit path).
    let upto = s.pcs.iter().position(|&pc| pc == p.marker).unwrap();
    assert_tail_of_loop(&p, &s.pcs[..upto], 29_999);
}

#[test]
fn signal_sent_to_pttrace_takes_a_snapshot_and_the_program_goes_on() {
    let Some(p) = prog() else { return };
    let ready = p.out.with_file_name("ready");
    let go = p.out.with_file_name("go");
    let cmd = [
        p.exe.as_os_str(),
        OsStr::new("30000"),
        OsStr::new("wait"),
        ready.as_os_str(),
        go.as_os_str(),
    ];
    let child = qemu_run_command(
        &p.out,
        &["--snapshot", "64K", "--trigger", "signal:USR2"],
        &cmd,
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the program never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: kill sends a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGUSR2) }, 0);
    // Wait until the snapshot is in the thread file, then let the program end.
    let has_snapshot = |out: &Path| -> bool {
        std::fs::read_dir(out).unwrap().flatten().any(|e| {
            let data = std::fs::read(e.path()).unwrap_or_default();
            e.path().extension() == Some(OsStr::new("ptt"))
                && ptt::parse("t", &data).is_ok_and(|pf| {
                    pf.frames
                        .iter()
                        .any(|f| f.ty == RecordType::Snapshot as u16)
                })
        })
    };
    while !has_snapshot(&p.out) {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot was written"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::write(&go, b"").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("SIGUSR2: snapshot requested"), "{out}");
    assert!(
        out.contains("snapshot 1: trigger signal:SIGUSR2 (sent to pttrace run) fired"),
        "{out}"
    );
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1, "one signal, one snapshot (none at exit)");
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Signal as u32);
    assert_eq!(s.rec.fired_tid, 0);
    assert_eq!(s.gaps, 0);
    assert!(s.pt_bytes <= SIZE + SIZE / 8, "{}", s.pt_bytes);
    // The ring holds the end of the loop (the creation of READY after it may or may not be
    // in: a thread's worker writes what it had received when the request reached it, and
    // a thread inside a syscall, the 1 ms sleeps, contributes up to the window before it).
    // How much of the loop's end is in depends on when the request reached the worker
    // (it may end inside an iteration under load): the loop's code is there, marker's not.
    assert!(!s.pcs.contains(&p.marker), "taken before marker ran");
    assert!(s.pcs.iter().any(|&pc| pc == p.one || pc == p.zero));
}

#[test]
fn bad_snapshot_options_are_named() {
    let Some(p) = prog() else { return };
    let exe = p.exe.to_str().unwrap();
    let out = p.out.to_str().unwrap();
    let q = plugin();
    let qp = q.to_str().unwrap();
    let base = [
        "run",
        "--mode",
        "user",
        "--window",
        "thread",
        "--backend",
        "qemu",
        "--qemu-plugin",
        qp,
        "--out",
        out,
    ];
    let cases: &[(&[&str], &str)] = &[
        (&["--snapshot", "12Q"], "--snapshot \"12Q\": unknown unit"),
        (
            &["--snapshot", "100"],
            "--snapshot \"100\": 100 bytes is outside",
        ),
        (
            &["--snapshot", "64K", "--trigger", "addr:no_such_fn"],
            "--trigger addr:no_such_fn: no symbol \"no_such_fn\" defined in",
        ),
        (
            &["--snapshot", "64K", "--trigger", "addr:0x10"],
            "--trigger addr:0x10: 0x10 is not inside a loaded segment",
        ),
        (
            &["--snapshot", "64K", "--trigger", "signal:KILL"],
            "--trigger \"signal:KILL\": signal 9 cannot be used",
        ),
        (
            &["--snapshot", "64K", "--trigger", "syscall:nosuch"],
            "unknown x86-64 syscall \"nosuch\"",
        ),
        (
            &["--snapshot", "64K", "--trigger", "later"],
            "unknown trigger",
        ),
        (&["--trigger", "exit"], "needs --snapshot SIZE"),
    ];
    for (opts, want) in cases {
        let o = Command::new(pttrace())
            .args(base)
            .args(*opts)
            .args(["--", exe])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{opts:?}");
        assert!(text(&o).contains(want), "{opts:?}: {}", text(&o));
    }
    // The shim's backends keep no ring: refused, naming the backend that has one.
    let o = Command::new(pttrace())
        .args([
            "run",
            "--backend",
            "emulated",
            "--mode",
            "user",
            "--out",
            out,
        ])
        .args(["--snapshot", "64K", "--", exe])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--snapshot is supported by the qemu backend only (--backend qemu"),
        "{}",
        text(&o)
    );
}
