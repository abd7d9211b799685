//! Snapshot (flight-recorder) mode end to end under QEMU: `pttrace run --snapshot SIZE
//! --trigger ...` of tests/progs/snapshot_loop.c, whose loop iterations the decoded
//! instruction stream spells (step(i) calls bit_one/bit_zero per bit of i). Needs
//! `qemu-x86_64`; prints `SKIP: <reason>` without it.

mod shim_util;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// The loop program without needing QEMU (the single-step backend's tests).
fn prog_emu() -> Prog {
    let dir = tempfile::tempdir().unwrap();
    let exe = shim_util::compile_with("snapshot_loop", dir.path(), "sl", &["-no-pie"]);
    let out = dir.path().join("out");
    Prog {
        step: symbol(&exe, "step"),
        one: symbol(&exe, "bit_one"),
        zero: symbol(&exe, "bit_zero"),
        marker: symbol(&exe, "marker"),
        exe,
        out,
        _dir: dir,
    }
}

/// `pttrace run --backend emulated --mode user --window thread` of the loop program (which
/// makes a syscall first, so that its loop is stepped), with `opts`.
fn emu_command(p: &Prog, opts: &[&str], args: &[&str]) -> Command {
    let mut c = Command::new(pttrace());
    c.args(["run", "--backend", "emulated", "--mode", "user"])
        .args(["--window", "thread", "--out"])
        .arg(&p.out)
        .args(opts)
        .arg("--")
        .arg(&p.exe)
        .args(args)
        .env("SNAPSHOT_LOOP_SYSCALL", "1");
    c
}

fn run_emu(p: &Prog, opts: &[&str], args: &[&str]) -> Output {
    let o = emu_command(p, opts, args).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    o
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
    /// Per window: its first instruction's index in `pcs` and its last instruction's
    /// encoding.
    starts: Vec<usize>,
    last_insn: Vec<Vec<u8>>,
}

fn snapshots(out: &Path) -> Vec<Snap> {
    let t = ptt_dir::open(out).unwrap();
    assert_eq!(t.threads.len(), 1, "one thread");
    thread_snapshots(&t, &t.threads[0])
}

fn thread_snapshots(t: &ptt_dir::PttTrace, th: &ptt_dir::PttThread) -> Vec<Snap> {
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
                starts: Vec::new(),
                last_insn: Vec::new(),
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
            s.starts.push(s.pcs.len());
            let mut last = Vec::new();
            for r in recs {
                match r {
                    Record::Gap(_) => s.gaps += 1,
                    r => {
                        if let Some(i) = r.as_instruction() {
                            s.pcs.push(i.pc);
                            last = i.encoding().to_vec();
                        }
                    }
                }
            }
            s.last_insn.push(last);
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
    // (About 10 PT bytes an iteration: its branches and its calls' compressed returns are
    // TNT bits.)
    assert!(k > 200 && k < 10_000, "{k} iterations");
    assert!(
        !s.pcs.contains(&p.marker),
        "marker's entry itself is not executed"
    );
    // The last instruction is main's call of marker (e8 rel32 to marker).
    let last = *s.pcs.last().unwrap();
    let main = symbol(&p.exe, "main");
    let call = s.last_insn.last().unwrap();
    assert!(last > main, "{last:#x} is not in main");
    assert_eq!(call.len(), 5, "{call:x?}");
    assert_eq!(call[0], 0xe8, "{call:x?}");
    let rel = i32::from_le_bytes(call[1..5].try_into().unwrap());
    assert_eq!(
        (last + 5).wrapping_add(rel as i64 as u64),
        p.marker,
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

/// A traced program running under `pttrace run`, its stdout read line by line.
struct Live {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
    deadline: Instant,
}

impl Live {
    fn start(p: &Prog, opts: &[&str], args: &[&str]) -> Live {
        let mut cmd: Vec<&OsStr> = vec![p.exe.as_os_str()];
        cmd.extend(args.iter().map(OsStr::new));
        Live::spawn(qemu_run_command(&p.out, opts, &cmd))
    }

    fn spawn(mut cmd: Command) -> Live {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut all = String::new();
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                all.push_str(&l);
                all.push('\n');
                let _ = tx.send(l);
            }
            all
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Live {
            child,
            lines,
            stdout,
            stderr,
            deadline: Instant::now() + Duration::from_secs(120),
        }
    }

    fn left(&self, what: &str) -> Duration {
        self.deadline
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| panic!("timed out waiting for {what}"))
    }

    /// Waits for the program's `ready K` lines, K in 0..n (any order).
    fn wait_ready(&self, n: usize) {
        let mut seen = Vec::new();
        while seen.len() < n {
            let l = self
                .lines
                .recv_timeout(self.left("ready lines"))
                .unwrap_or_else(|_| panic!("the program never got ready ({seen:?})"));
            if let Some(k) = l.strip_prefix("ready ") {
                seen.push(k.parse::<usize>().unwrap());
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
    }

    /// Waits until `n` threads of the QEMU process (a child of pttrace run) are blocked
    /// in read(2) (its host syscall, as /proc/PID/task/TID/syscall shows it).
    fn wait_blocked_in_read(&self, n: usize) {
        let me = self.child.id().to_string();
        loop {
            let qemu = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .find(|e| {
                    std::fs::read_to_string(e.path().join("stat")).is_ok_and(|st| {
                        let after = st.rsplit_once(')').map_or("", |x| x.1);
                        after.split_whitespace().nth(1) == Some(me.as_str())
                    })
                })
                .map(|e| e.path());
            let reading = qemu.map_or(0, |q| {
                std::fs::read_dir(q.join("task")).map_or(0, |d| {
                    d.flatten()
                        .filter(|t| {
                            std::fs::read_to_string(t.path().join("syscall"))
                                .is_ok_and(|s| s.starts_with("0 "))
                        })
                        .count()
                })
            });
            if reading == n {
                return;
            }
            let what = format!("{n} threads blocked in read ({reading} now)");
            std::thread::sleep(Duration::from_millis(5).min(self.left(&what)));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill sends a signal to our own child (pttrace run).
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Waits until the info file has a note containing `text`.
    fn wait_note(&self, out: &Path, text: &str) {
        while !notes(out).iter().any(|n| n.contains(text)) {
            std::thread::sleep(Duration::from_millis(5).min(self.left(text)));
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.child.stdin.as_mut().unwrap().write_all(bytes).unwrap();
    }

    /// Closes the program's stdin and waits for the end; returns stdout and stderr.
    fn end(mut self) -> String {
        drop(self.child.stdin.take());
        let st = self.child.wait().unwrap();
        let out = format!(
            "{}{}",
            self.stdout.join().unwrap(),
            self.stderr.join().unwrap()
        );
        assert!(st.success(), "{out}");
        out
    }
}

/// Every `Note` of the trace directory's info files.
fn notes(out: &Path) -> Vec<String> {
    let mut v = Vec::new();
    // (None yet while `pttrace run` starts.)
    let Ok(dir) = std::fs::read_dir(out) else {
        return v;
    };
    for e in dir.flatten() {
        if e.path().extension() != Some(OsStr::new("info")) {
            continue;
        }
        let data = std::fs::read(e.path()).unwrap_or_default();
        if let Ok(pf) = ptt::parse("info", &data) {
            for f in pf.frames.iter().filter(|f| f.ty == RecordType::Note as u16) {
                v.push(String::from_utf8_lossy(f.payload).into_owned());
            }
        }
    }
    v
}

const SYSCALL_INSN: &[u8] = &[0x0f, 0x05];

/// The end of a thread's snapshot taken while it was blocked in read(fd): the window of
/// its `ready K` write(1), final with its return value, then the window up to the read,
/// cut by the snapshot (no return value yet) at the syscall instruction; before them only
/// windows cut between blocks (the loop makes no syscall). Returns the instructions
/// up to the read (the loop, ready(), its write).
fn assert_ends_blocked_in_read(s: &Snap, fd: Option<u64>) -> &[u64] {
    let n = s.windows.len();
    assert!(n >= 3, "{n} windows");
    let (w, r) = (&s.windows[n - 2], &s.windows[n - 1]);
    assert_eq!(w.nr, libc::SYS_write as u64);
    assert_eq!(w.args[0], 1);
    assert_eq!(w.ret, "ready 0\n".len() as i64);
    assert_eq!(w.flags, 0);
    assert_eq!(r.nr, libc::SYS_read as u64);
    if let Some(fd) = fd {
        assert_eq!(r.args[0], fd);
    }
    assert_eq!(r.flags, ptt::WF_SNAPSHOT_CUT, "the read had not returned");
    assert_eq!(s.rec.tsc, r.tsc_end, "the snapshot's time is the cut's");
    assert_eq!(s.last_insn[n - 2], SYSCALL_INSN);
    assert_eq!(s.last_insn[n - 1], SYSCALL_INSN);
    assert!(s.windows[..n - 2]
        .iter()
        .all(|w| w.flags == WF_NO_SYSCALL || w.flags == WF_NO_SYSCALL | ptt::WF_SNAPSHOT_CUT));
    &s.pcs[..s.starts[n - 1]]
}

/// `signal:USR2` sent while the program (one thread, `ARGS block`) is blocked in `read`
/// after writing `ready`: the program goes on (a byte on stdin ends its read); the one
/// snapshot, asserted as a complete, error-free signal firing of the first thread.
fn usr2_while_blocked_in_read(mut live: Live, out_dir: &Path) -> Snap {
    live.wait_ready(1);
    live.wait_blocked_in_read(1);
    live.signal(libc::SIGUSR2);
    live.wait_note(out_dir, "snapshot 1: complete, written by 1 thread");
    live.send(b"x");
    let out = live.end();
    assert!(out.contains("SIGUSR2: snapshot requested"), "{out}");
    assert!(
        out.contains("snapshot 1: trigger signal:SIGUSR2 (sent to pttrace run) fired"),
        "{out}"
    );
    let mut snaps = snapshots(out_dir);
    assert_eq!(snaps.len(), 1, "one signal, one snapshot (none at exit)");
    let s = snaps.remove(0);
    assert_eq!(s.rec.kind, TriggerKind::Signal as u32);
    assert_eq!(s.rec.fired_tid, 0);
    assert_eq!(s.gaps, 0);
    s
}

#[test]
fn signal_snapshot_of_a_blocked_thread_ends_exactly_at_its_syscall() {
    let Some(p) = prog() else { return };
    let live = Live::start(
        &p,
        &["--snapshot", "64K", "--trigger", "signal:USR2"],
        &["30000", "block"],
    );
    let s = &usr2_while_blocked_in_read(live, &p.out);
    assert!(s.pt_bytes <= SIZE, "{}", s.pt_bytes);
    // Exactly: the last iterations of the loop, whole, then ready()'s write, then the
    // read the thread was blocked in.
    let before = assert_ends_blocked_in_read(s, Some(0));
    let k = assert_tail_of_loop(&p, before, 29_999);
    assert!(k > 200, "{k} iterations");
    assert!(!s.pcs.contains(&p.marker), "taken before marker ran");
    // decode names the cut window as such (no return value to show).
    let d = Command::new(pttrace())
        .args(["decode", "--format", "disasm"])
        .arg(&p.out)
        .output()
        .unwrap();
    assert!(d.status.success(), "{}", text(&d));
    let want = format!(
        "window {} (ends at read, not returned at the snapshot) flags snapshot-cut:",
        s.windows.last().unwrap().index
    );
    assert!(text(&d).contains(&want), "{want}");
}

#[test]
fn one_firing_writes_every_live_threads_ring_each_ending_at_its_own_last_iterations() {
    let Some(p) = prog() else { return };
    const PER: u64 = 20_000;
    const K: usize = 3;
    let mut live = Live::start(
        &p,
        &[
            "--snapshot",
            "32K",
            "--trigger",
            "signal:USR2",
            "--trigger",
            "syscall:getppid",
        ],
        &[&PER.to_string(), "threads", &K.to_string()],
    );
    live.wait_ready(K + 1);
    live.wait_blocked_in_read(K + 1);
    live.signal(libc::SIGUSR2);
    live.wait_note(&p.out, "snapshot 1: complete, written by 4 threads");
    // A byte on stdin: the main thread calls getppid (a trigger fired in that thread while
    // the others are still blocked), then reads again.
    live.send(b"x");
    live.wait_note(&p.out, "snapshot 2: complete, written by 4 threads");
    let out = live.end();
    assert!(
        out.contains("snapshot 2: trigger syscall:getppid fired in thread"),
        "{out}"
    );
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), K + 1);
    let main_tid = t.processes[0].pid;
    let mut which = Vec::new();
    for th in &t.threads {
        let snaps = thread_snapshots(&t, th);
        let main = th.header.tid == main_tid;
        assert_eq!(snaps.len(), 2, "thread {}: two firings", th.header.tid);
        let (s1, s2) = (&snaps[0], &snaps[1]);
        assert_eq!(s1.rec.number, 1);
        assert_eq!(s1.rec.kind, TriggerKind::Signal as u32);
        assert_eq!(s1.rec.fired_tid, 0);
        assert_eq!(s1.gaps, 0);
        assert!(s1.pt_bytes <= 32 * 1024, "{}", s1.pt_bytes);
        // Each thread's own loop, exactly its last iterations, then its write and read.
        let before = assert_ends_blocked_in_read(s1, main.then_some(0));
        let (_, done, _) = iterations(&p, before);
        let k = done[0] / PER;
        assert_tail_of_loop(&p, before, (k + 1) * PER - 1);
        assert_eq!(k == 0, main, "thread {}: loop {k}", th.header.tid);
        which.push(k);
        // The second firing, in the main thread at getppid's return.
        assert_eq!(s2.rec.number, 2);
        assert_eq!(s2.rec.kind, TriggerKind::Syscall as u32);
        assert_eq!(s2.rec.fired_tid, main_tid);
        if main {
            // Only what ran since: the read returned, getppid.
            assert_eq!(s2.windows.len(), 1);
            assert_eq!(s2.windows[0].nr, libc::SYS_getppid as u64);
            assert!(s2.windows[0].ret > 0);
            assert!(!s2.pcs.contains(&p.step));
        } else {
            // Still in the same read: nothing new.
            assert_eq!(s2.rec.windows, 0);
            assert!(s2.windows.is_empty());
        }
    }
    which.sort_unstable();
    assert_eq!(which, (0..=K as u64).collect::<Vec<_>>());
}

#[test]
fn a_thread_running_code_takes_a_firing_between_two_blocks_and_loses_nothing() {
    let Some(p) = prog() else { return };
    // A ring large enough that nothing of the spinning thread is dropped (its iterations
    // from the first are in its two snapshots).
    let o = run(
        &p,
        &[
            "--snapshot",
            "64M",
            "--trigger",
            "syscall:getppid",
            "--trigger",
            "exit",
        ],
        &["30000", "spin"],
    );
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), 2, "{}", text(&o));
    let main_tid = t.processes[0].pid;
    for th in &t.threads {
        let snaps = thread_snapshots(&t, th);
        assert_eq!(snaps.len(), 2, "the syscall firing, then the thread's exit");
        let (s1, s2) = (&snaps[0], &snaps[1]);
        assert_eq!(s1.rec.number, 1);
        assert_eq!(s1.rec.kind, TriggerKind::Syscall as u32);
        assert_eq!(s1.rec.fired_tid, main_tid);
        assert_eq!(s2.rec.kind, TriggerKind::Exit as u32);
        for s in [s1, s2] {
            assert_eq!(s.gaps, 0);
            assert_eq!(s.rec.discarded_windows, 0);
        }
        if th.header.tid == main_tid {
            assert_eq!(s1.windows.last().unwrap().nr, libc::SYS_getppid as u64);
            assert_tail_of_loop(&p, &s1.pcs, 29_999);
            continue;
        }
        // The spinning thread was executing code: its first snapshot ends between two
        // blocks, at the cut's time.
        let last = s1.windows.last().unwrap();
        assert_eq!(last.flags, WF_NO_SYSCALL | ptt::WF_SNAPSHOT_CUT);
        assert_eq!(s1.rec.tsc, last.tsc_end);
        assert!(s1.windows[..s1.windows.len() - 1]
            .iter()
            .all(|w| w.flags & ptt::WF_SNAPSHOT_CUT == 0));
        // Nothing lost or repeated at the cut: both snapshots together spell every
        // iteration from the first, in order (17 bits each, so modulo 2^17).
        assert_every_iteration_from_the_first(&p, s1, s2);
        let (_, before, _) = iterations(&p, &s1.pcs);
        assert!(!before.is_empty(), "the cut came after some iterations");
    }
}

/// A looping thread's two snapshots together spell every iteration from its first, in
/// order, whole (17 bits each, so modulo 2^17): nothing lost or repeated between them.
fn assert_every_iteration_from_the_first(p: &Prog, s1: &Snap, s2: &Snap) {
    let mut pcs = s1.pcs.clone();
    pcs.extend_from_slice(&s2.pcs);
    let (lead, done, unfinished) = iterations(p, &pcs);
    assert!(lead.is_empty());
    assert_eq!(unfinished, None);
    assert!(done.len() > 1, "{} iterations", done.len());
    let want: Vec<u64> = (0..done.len() as u64).map(|i| i % (1 << 17)).collect();
    assert_eq!(done, want);
}

/// The snapshots of every thread file, per thread, sorted by how many there are.
fn all_snapshots(out: &Path) -> Vec<Vec<Snap>> {
    let t = ptt_dir::open(out).unwrap();
    let mut v: Vec<Vec<Snap>> = t
        .threads
        .iter()
        .map(|th| thread_snapshots(&t, th))
        .collect();
    v.sort_by_key(Vec::len);
    v
}

#[test]
fn addr_symbol_triggers_are_carried_into_exec_d_images() {
    let Some(p) = prog() else { return };
    let exe = p.exe.to_str().unwrap();
    // The first image execs itself at once: marker runs in the second image only.
    let o = run(
        &p,
        &["--snapshot", "32K", "--trigger", "addr:marker"],
        &["0", "exec", exe, "20000"],
    );
    let real = std::fs::canonicalize(&p.exe).unwrap();
    let notes = notes(&p.out);
    let carried = format!(
        "snapshot trigger addr:marker carried into this image: symbol of {} at {:#x}",
        real.display(),
        p.marker
    );
    assert!(notes.contains(&carried), "{notes:?}\n{}", text(&o));
    let snaps = all_snapshots(&p.out);
    assert_eq!(snaps.len(), 2, "two images, one thread each");
    assert!(snaps[0].is_empty(), "the first image never reached marker");
    assert_eq!(snaps[1].len(), 1, "fired once, in the exec'd image");
    let s = &snaps[1][0];
    assert_eq!(s.rec.kind, TriggerKind::Addr as u32);
    assert_eq!(s.rec.trigger, format!("addr:marker ({:#x})", p.marker));
    assert_eq!(s.gaps, 0);
    assert_tail_of_loop(&p, &s.pcs, 19_999);
    assert!(!s.pcs.contains(&p.marker));
}

#[test]
fn addr_address_triggers_are_not_carried_into_exec_d_images_and_say_so() {
    let Some(p) = prog() else { return };
    let exe = p.exe.to_str().unwrap();
    let spec = format!("addr:{:#x}", p.marker);
    run(
        &p,
        &["--snapshot", "32K", "--trigger", &spec],
        &["0", "exec", exe, "20000"],
    );
    let notes = notes(&p.out);
    assert!(
        notes.iter().any(|n| n.starts_with(&format!(
            "snapshot trigger {spec} is not carried into the exec of {exe} (thread "
        )) && n.ends_with("use addr:SYMBOL to follow a symbol")),
        "{notes:?}"
    );
    let snaps = all_snapshots(&p.out);
    assert_eq!(snaps.len(), 2);
    assert!(
        snaps.iter().all(Vec::is_empty),
        "no snapshot in either image"
    );
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
            "--window",
            "syscall",
            "--out",
            out,
        ])
        .args(["--snapshot", "64K", "--", exe])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "--snapshot with the emulated backend traces user code in thread windows: use \
             --mode user --window thread (got --mode user --window syscall)"
        ),
        "{}",
        text(&o)
    );
    // The hardware backend: without an intel_pt PMU refused, naming it; with one, an
    // `addr:` trigger is refused (the `hardware_*` tests run it).
    let hw = |trigger: &[&str]| {
        Command::new(pttrace())
            .args(["run", "--backend", "hardware", "--mode", "user"])
            .args(["--window", "thread", "--out", out])
            .args(["--snapshot", "64K"])
            .args(trigger)
            .args(["--", exe])
            .output()
            .unwrap()
    };
    if drpttracer::perf::pmu::IntelPtPmu::probe().is_err() {
        let o = hw(&[]);
        assert!(!o.status.success());
        assert!(
            text(&o).contains(
                "--snapshot on the hardware backend needs an intel_pt PMU, and this machine \
                 has none: no intel_pt PMU ("
            ),
            "{}",
            text(&o)
        );
    } else {
        let o = hw(&["--trigger", "addr:marker"]);
        assert!(!o.status.success());
        assert!(
            text(&o).contains(
                "--trigger addr:marker: the hardware backend cannot see an address being \
                 executed"
            ),
            "{}",
            text(&o)
        );
    }
}

// Intel PT hardware through the LD_PRELOAD shim: each thread's overwrite-mode event
// (`shim::snapshot::hw`). Only where the `intel_pt` PMU exists; `SKIP: <reason>` elsewhere.

/// The loop program under `pttrace run --backend hardware --mode user --window thread`,
/// or `None` (SKIP printed) without Intel PT.
fn run_hw(opts: &[&str], args: &[&str]) -> Option<Prog> {
    if let Err(e) = drpttracer::perf::pmu::IntelPtPmu::probe() {
        println!("SKIP: no Intel PT hardware: {}", e.message);
        return None;
    }
    let p = prog_emu();
    let o = Command::new(pttrace())
        .args(["run", "--backend", "hardware", "--mode", "user"])
        .args(["--window", "thread", "--out"])
        .arg(&p.out)
        .args(opts)
        .arg("--")
        .arg(&p.exe)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    Some(p)
}

/// A hardware snapshot: one window, cut, within SIZE, decoded without gaps.
fn assert_one_hardware_window(s: &Snap, size: u64) {
    assert_eq!(s.windows.len(), 1);
    assert_eq!(
        s.windows[0].flags & !ptt::WF_PT_LOST,
        ptt::WF_NO_SYSCALL | ptt::WF_SNAPSHOT_CUT
    );
    assert_eq!(
        s.windows[0].flags & ptt::WF_PT_LOST,
        0,
        "the kernel reported loss"
    );
    assert!(
        s.pt_bytes > 0 && s.pt_bytes <= size,
        "{} PT bytes",
        s.pt_bytes
    );
    assert_eq!(s.gaps, 0);
}

#[test]
fn hardware_exit_snapshot_holds_the_end_of_the_loop_then_marker() {
    let Some(p) = run_hw(&["--snapshot", "16K"], &["1500"]) else {
        return;
    };
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1);
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Exit as u32);
    assert_eq!(s.rec.trigger, "exit (exit_group)");
    assert_one_hardware_window(s, 16 * 1024);
    let upto = s
        .pcs
        .iter()
        .position(|&pc| pc == p.marker)
        .expect("marker ran");
    let k = assert_tail_of_loop(&p, &s.pcs[..upto], 1499);
    assert!(
        k < 1500,
        "all {k} iterations in 16K: the area kept more than SIZE"
    );
}

#[test]
fn hardware_syscall_snapshot_ends_at_the_syscall_before_marker() {
    let Some(p) = run_hw(
        &["--snapshot", "16K", "--trigger", "syscall:getppid"],
        &["1500", "syscall"],
    ) else {
        return;
    };
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1);
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Syscall as u32);
    assert_eq!(s.rec.trigger, "syscall:getppid");
    assert_one_hardware_window(s, 16 * 1024);
    // The handler stopped the trace right after getppid: marker never in it.
    assert!(!s.pcs.contains(&p.marker));
    assert_tail_of_loop(&p, &s.pcs, 1499);
}

#[test]
fn hardware_a_thread_without_syscalls_is_in_its_exit_snapshot() {
    let Some(p) = run_hw(&["--snapshot", "16K"], &["1500", "spin"]) else {
        return;
    };
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), 2, "main and the spinner");
    for th in &t.threads {
        let snaps = thread_snapshots(&t, th);
        assert_eq!(snaps.len(), 1, "{}", th.path.display());
        let s = &snaps[0];
        assert_eq!(s.rec.kind, TriggerKind::Exit as u32);
        assert_one_hardware_window(s, 16 * 1024);
        // Consecutive whole iterations: the spinner's trace (its loop never makes a
        // syscall) as much as main's.
        let (_, done, _) = iterations(&p, &s.pcs);
        assert!(done.len() > 10, "{} iterations", done.len());
        assert!(done.windows(2).all(|w| w[1] == w[0] + 1), "{done:?}");
    }
}

#[test]
fn shim_hardware_snapshot_without_intel_pt_says_why_and_runs_untraced() {
    if drpttracer::perf::pmu::IntelPtPmu::probe().is_ok() {
        println!("SKIP: this machine has Intel PT (the hardware_* tests run the mode)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = Command::new("/bin/sh")
        .args(["-c", "echo ran"])
        .env("LD_PRELOAD", shim_util::lib_path())
        .env("PTTRACER_OUT", &out)
        .env("PTTRACER_MODE", "user")
        .env("PTTRACER_WINDOW", "thread")
        .env("PTTRACER_BACKEND", "hardware")
        .env("PTTRACER_SNAPSHOT", "64K")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with(
            "drpttracer shim: snapshot mode (PTTRACER_SNAPSHOT) needs user PT in thread \
             windows (PTTRACER_MODE=user PTTRACER_WINDOW=thread) from the emulated backend \
             or Intel PT hardware; here: hardware backend for mode user: no intel_pt PMU ("
        ),
        "{err}"
    );
    assert!(
        err.trim_end()
            .ends_with("tracing disabled, the program runs untraced"),
        "{err}"
    );
}

// The single-step (emulated) backend of the LD_PRELOAD shim: the same ring and records.
// It steps ~0.7 M instructions/s here, so the loops are short (an iteration is ~140
// instructions and ~73 PT bytes).

const EMU_N: u64 = 2000;

#[test]
fn emulated_addr_trigger_keeps_exactly_the_end_of_the_loop_up_to_marker() {
    let p = prog_emu();
    let o = run_emu(
        &p,
        &["--snapshot", "16K", "--trigger", "addr:marker"],
        &[&EMU_N.to_string()],
    );
    let out = text(&o);
    assert!(
        out.contains(&format!(
            "snapshot 1: trigger addr:marker ({:#x}) fired in thread",
            p.marker
        )),
        "{out}"
    );
    assert!(
        out.contains("snapshot 1: complete, written by 1 thread"),
        "{out}"
    );
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1, "the trigger fired once");
    let s = &snaps[0];
    assert_eq!(s.rec.number, 1);
    assert_eq!(s.rec.kind, TriggerKind::Addr as u32);
    assert_eq!(s.rec.trigger, format!("addr:marker ({:#x})", p.marker));
    assert_eq!(s.rec.ring_size, 16 * 1024);
    assert_eq!(s.gaps, 0);
    // At most SIZE of PT, 7/8 of it at least (pieces of SIZE/8).
    assert!(s.pt_bytes <= 16 * 1024, "{} PT bytes", s.pt_bytes);
    assert!(s.pt_bytes >= 14 * 1024, "{} PT bytes", s.pt_bytes);
    assert!(s.rec.discarded_windows > 20, "{:?}", s.rec);
    // Exactly the last K iterations, whole, then main up to its call of marker.
    let k = assert_tail_of_loop(&p, &s.pcs, EMU_N - 1);
    assert!(k > 100 && k < 400, "{k} iterations");
    assert_ends_at_call_of_marker(&p, s);
    // The loop makes no syscall: only pieces cut without one.
    assert!(s.windows.iter().all(|w| w.flags == WF_NO_SYSCALL));
    // Nothing is written after the trigger (no exit trigger).
    let pf = std::fs::read(&ptt_dir::open(&p.out).unwrap().threads[0].path).unwrap();
    let pf = ptt::parse("t", &pf).unwrap();
    let tail: Vec<u16> = pf.frames.iter().rev().take(2).map(|f| f.ty).collect();
    assert_eq!(tail, [RecordType::End as u16, RecordType::Window as u16]);
}

/// The snapshot's last instruction is main's `call marker` (marker's entry not executed).
fn assert_ends_at_call_of_marker(p: &Prog, s: &Snap) {
    assert!(!s.pcs.contains(&p.marker), "marker's entry is not executed");
    let call = s.last_insn.last().unwrap();
    let last = *s.pcs.last().unwrap();
    assert_eq!((call.len(), call[0]), (5, 0xe8), "{call:x?}");
    let rel = i32::from_le_bytes(call[1..5].try_into().unwrap());
    assert_eq!((last + 5).wrapping_add(rel as i64 as u64), p.marker);
}

/// How many times the info files note that `addr:marker` fired.
fn marker_firings(out: &Path) -> usize {
    notes(out)
        .iter()
        .filter(|n| n.contains("trigger addr:marker ("))
        .count()
}

#[test]
fn emulated_a_stretch_longer_than_the_step_buffer_keeps_its_end() {
    let p = prog_emu();
    // --pt-shift 1: step buffers of 8192 steps, ~58 iterations (~140 steps each); the
    // loop fills ~26 of them without a syscall. Each full buffer is handed over and
    // stepping goes on in another one.
    let o = run_emu(
        &p,
        &[
            "--pt-shift",
            "1",
            "--snapshot",
            "8K",
            "--trigger",
            "addr:marker",
        ],
        &["1500"],
    );
    let out = text(&o);
    assert!(
        out.contains("snapshot 1: complete, written by 1 thread"),
        "{out}"
    );
    assert_eq!(marker_firings(&p.out), 1, "{:?}", notes(&p.out));
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1, "the trigger fired once");
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Addr as u32);
    assert_eq!(s.gaps, 0);
    assert!(s.pt_bytes <= 8 * 1024, "{} PT bytes", s.pt_bytes);
    assert!(s.pt_bytes >= 7 * 1024, "{} PT bytes", s.pt_bytes);
    // Windows cut without a syscall (buffer handovers and ring pieces), none lost.
    assert!(
        s.windows.iter().all(|w| w.flags == WF_NO_SYSCALL),
        "{:?}",
        s.windows
    );
    // The end of the stretch, not its beginning: exactly the last iterations, whole
    // and consecutive across buffer handovers (more than one buffer holds), up to main's
    // call of marker.
    let k = assert_tail_of_loop(&p, &s.pcs, 1499);
    assert!(k > 80, "{k} iterations");
    assert_ends_at_call_of_marker(&p, s);
}

/// The thread file of a trace directory with one traced thread, once there is one.
fn thread_file(out: &Path) -> Option<PathBuf> {
    std::fs::read_dir(out)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension() == Some(OsStr::new("ptt")))
}

#[test]
fn emulated_addr_snapshot_is_written_while_the_program_spins_on_without_syscalls() {
    let p = prog_emu();
    // The loop, marker(), then more iterations without any syscall until killed.
    let mut live = Live::spawn(emu_command(
        &p,
        &["--snapshot", "8K", "--trigger", "addr:marker"],
        &["1500", "after"],
    ));
    let path = loop {
        if let Some(path) = thread_file(&p.out) {
            break path;
        }
        std::thread::sleep(Duration::from_millis(5).min(live.left("the thread file")));
    };
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let pid: i32 = name.split('-').next().unwrap().parse().unwrap();
    // The program never ends by itself: killed when the test ends, failed or not.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // SAFETY: kill sends SIGKILL to the traced program (a child of pttrace run).
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let guard = KillOnDrop(pid);
    live.wait_note(&p.out, "snapshot 1: complete, written by 1 thread");
    // The snapshot is in the thread file while the program is still running its loop.
    let data = std::fs::read(&path).unwrap();
    let pf = ptt::parse("t", &data).unwrap();
    let at = pf
        .frames
        .iter()
        .position(|f| f.ty == RecordType::Snapshot as u16)
        .expect("the snapshot record is in the thread file");
    let early = SnapshotRecord::decode(pf.frames[at].payload).unwrap();
    let windows_after = pf.frames[at + 1..]
        .iter()
        .take_while(|f| f.ty == RecordType::Window as u16)
        .count() as u64;
    assert_eq!(early.number, 1);
    assert_eq!(windows_after, early.windows, "{early:?}");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = stat.rsplit_once(')').unwrap().1.split_whitespace().next();
    assert!(matches!(state, Some("R" | "S" | "D")), "{stat}");
    assert!(
        live.child.try_wait().unwrap().is_none(),
        "pttrace run ended"
    );
    drop(guard);
    drop(live.child.stdin.take());
    let st = live.child.wait().unwrap();
    let out = format!(
        "{}{}",
        live.stdout.join().unwrap(),
        live.stderr.join().unwrap()
    );
    assert!(!st.success(), "{out}");
    assert!(out.contains("signal: 9 (SIGKILL)"), "{out}");
    assert_eq!(marker_firings(&p.out), 1, "{:?}", notes(&p.out));
    let snaps = snapshots(&p.out);
    let s = &snaps[0];
    assert_eq!(s.rec, early, "the snapshot written while the program ran");
    assert_eq!(s.rec.kind, TriggerKind::Addr as u32);
    assert_eq!(s.gaps, 0);
    assert!(s.pt_bytes <= 8 * 1024, "{} PT bytes", s.pt_bytes);
    let k = assert_tail_of_loop(&p, &s.pcs, 1499);
    assert!(k > 80, "{k} iterations");
    assert_ends_at_call_of_marker(&p, s);
    // What the kill recovered (if anything reached the ring) is after marker: none of
    // the loop's code again.
    for r in &snaps[1..] {
        assert_eq!(r.rec.kind, TriggerKind::Kill as u32);
        let (_, done, _) = iterations(&p, &r.pcs);
        assert!(done.iter().all(|&i| i >= 1500), "{done:?}");
    }
}

#[test]
fn emulated_syscall_trigger_ends_with_the_syscall_window() {
    let p = prog_emu();
    run_emu(
        &p,
        &["--snapshot", "8K", "--trigger", "syscall:getppid"],
        &["1500", "syscall"],
    );
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1);
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Syscall as u32);
    assert_eq!(s.rec.trigger, "syscall:getppid");
    let w = s.windows.last().unwrap();
    assert_eq!(w.nr, libc::SYS_getppid as u64);
    assert_eq!(w.flags, 0);
    assert!(w.ret > 0, "getppid returned {}", w.ret);
    assert_eq!(s.last_insn.last().unwrap(), SYSCALL_INSN);
    assert!(s.pt_bytes <= 8 * 1024);
    assert_eq!(s.gaps, 0);
    assert_tail_of_loop(&p, &s.pcs, 1499);
    assert!(!s.pcs.contains(&p.marker));
}

#[test]
fn emulated_exit_is_the_default_trigger_and_holds_the_end_of_the_program() {
    let p = prog_emu();
    run_emu(&p, &["--snapshot", "8K"], &["1500"]);
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1);
    let s = &snaps[0];
    assert_eq!(s.rec.kind, TriggerKind::Exit as u32);
    assert_eq!(s.rec.trigger, "exit (exit_group)");
    assert!(s.pt_bytes <= 8 * 1024);
    assert_eq!(s.gaps, 0);
    assert!(s.pcs.contains(&p.marker));
    assert_eq!(
        s.windows.last().unwrap().nr,
        libc::SYS_exit_group as u64,
        "the last window ends at exit_group"
    );
    let upto = s.pcs.iter().position(|&pc| pc == p.marker).unwrap();
    assert_tail_of_loop(&p, &s.pcs[..upto], 1499);
}

#[test]
fn emulated_signal_snapshot_of_a_blocked_thread_ends_exactly_at_its_syscall() {
    let p = prog_emu();
    let live = Live::spawn(emu_command(
        &p,
        &["--snapshot", "8K", "--trigger", "signal:USR2"],
        &["1500", "block"],
    ));
    let s = &usr2_while_blocked_in_read(live, &p.out);
    assert!(s.pt_bytes <= 8 * 1024, "{}", s.pt_bytes);
    // As under QEMU: the last iterations of the loop, whole, then ready()'s write
    // (returned), then the read the thread was blocked in, cut (no return value).
    let before = assert_ends_blocked_in_read(s, Some(0));
    let k = assert_tail_of_loop(&p, before, 1499);
    assert!(k > 50, "{k} iterations");
    assert!(!s.pcs.contains(&p.marker), "taken before marker ran");
    // The read returned after the snapshot: its window is not written again (no exit
    // trigger, so nothing follows the snapshot), and decode names the cut window.
    let d = Command::new(pttrace())
        .args(["decode", "--format", "disasm"])
        .arg(&p.out)
        .output()
        .unwrap();
    assert!(d.status.success(), "{}", text(&d));
    let want = format!(
        "window {} (ends at read, not returned at the snapshot) flags snapshot-cut:",
        s.windows.last().unwrap().index
    );
    assert!(text(&d).contains(&want), "{want}");
}

#[test]
fn emulated_bad_addr_trigger_is_named() {
    let p = prog_emu();
    let o = emu_command(
        &p,
        &["--snapshot", "8K", "--trigger", "addr:no_such_fn"],
        &["1"],
    )
    .output()
    .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--trigger addr:no_such_fn: no symbol \"no_such_fn\" defined in"),
        "{}",
        text(&o)
    );
}

/// The `.snapring` file of the trace directory (one thread traced), once there is one.
fn ring_file(out: &Path) -> Option<PathBuf> {
    std::fs::read_dir(out)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension() == Some(OsStr::new("snapring")))
}

#[test]
fn emulated_sigkill_keeps_the_ring_as_a_recovered_snapshot_of_the_last_iterations() {
    use drpttracer::format::ringfile;
    let p = prog_emu();
    // The loop then one iteration per getppid() until killed; no trigger fires before.
    let mut live = Live::spawn(emu_command(
        &p,
        &["--snapshot", "8K", "--trigger", "syscall:exit"],
        &["10", "forever"],
    ));
    // Wait until the ring (its file) has dropped windows: the horizon has moved on.
    let path = loop {
        if let Some(path) = ring_file(&p.out) {
            let data = std::fs::read(&path).unwrap();
            let r = ringfile::parse("ring", &data).unwrap();
            if r.is_some_and(|r| r.discarded_windows > 300) {
                break path;
            }
        }
        std::thread::sleep(Duration::from_millis(20).min(live.left("the ring to wrap")));
    };
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let pid: i32 = name.split('-').next().unwrap().parse().unwrap();
    // SAFETY: kill sends SIGKILL to the traced program (a child of pttrace run).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(live.child.stdin.take());
    let st = live.child.wait().unwrap();
    let out = format!(
        "{}{}",
        live.stdout.join().unwrap(),
        live.stderr.join().unwrap()
    );
    assert!(!st.success(), "{out}");
    assert!(out.contains("signal: 9 (SIGKILL)"), "{out}");
    // Salvaged: the ring file and the spool are gone, the snapshot is in the thread file.
    assert!(ring_file(&p.out).is_none(), "{out}");
    let snaps = snapshots(&p.out);
    assert_eq!(snaps.len(), 1, "{out}");
    let s = &snaps[0];
    assert_eq!(s.rec.number, 1);
    assert_eq!(s.rec.kind, TriggerKind::Kill as u32);
    assert_eq!(s.rec.fired_tid, 0);
    assert_eq!(s.rec.trigger, ringfile::KILL_TRIGGER);
    assert_eq!(s.rec.ring_size, 8 * 1024);
    assert!(s.rec.discarded_windows > 300, "{:?}", s.rec);
    assert!(s.pt_bytes <= 8 * 1024, "{} PT bytes", s.pt_bytes);
    assert!(s.pt_bytes >= 7 * 1024, "{} PT bytes", s.pt_bytes);
    assert!(
        out.contains(&format!(
            "snapshot 1 recovered after the process was killed: {} windows, {} PT bytes",
            s.windows.len(),
            s.pt_bytes
        )),
        "{out}"
    );
    // The ring's windows, each one iteration ending at its getppid (returned), then the
    // windows still queued when the process died: no PT (it was in the process's memory),
    // flagged so, numbered on.
    let n_ring = s
        .windows
        .iter()
        .position(|w| w.flags & ptt::WF_RECOVERED != 0)
        .unwrap_or(s.windows.len());
    assert!(n_ring > 50, "{n_ring} windows from the ring");
    for w in &s.windows[..n_ring] {
        assert_eq!((w.nr, w.flags), (libc::SYS_getppid as u64, 0), "{w:?}");
        assert!(w.ret > 0);
    }
    for w in &s.windows[n_ring..] {
        assert_eq!(w.nr, libc::SYS_getppid as u64);
        assert_eq!(w.flags, ptt::WF_RECOVERED | ptt::WF_PT_DROPPED, "{w:?}");
    }
    let idx: Vec<u64> = s.windows.iter().map(|w| w.index).collect();
    let first = idx[0];
    assert_eq!(idx, (first..first + idx.len() as u64).collect::<Vec<_>>());
    assert!(
        first > 300,
        "windows from the start of the program: {first}"
    );
    // Exactly consecutive iterations, one per ring window, ending at the last one the
    // ring got; nothing from before its horizon (not the first loop of 10).
    let upto = s.starts.get(n_ring).copied().unwrap_or(s.pcs.len());
    let (lead, done, unfinished) = iterations(&p, &s.pcs[..upto]);
    assert!(lead.is_empty(), "{lead:?}");
    assert_eq!(unfinished, None);
    assert_eq!(done.len(), n_ring);
    let want: Vec<u64> = (done[0]..done[0] + n_ring as u64).collect();
    assert_eq!(done, want);
    assert!(done[0] > 300, "iteration {}", done[0]);
    assert_eq!(s.gaps, 0);
    assert_eq!(
        upto,
        s.pcs.len(),
        "instructions decoded from windows without PT"
    );
    let want_note = format!(
        "snapshot 1: {} of thread {pid}: {} windows, {} PT bytes ({n_ring} from its ring, {} \
         still queued without PT), {} windows discarded before them",
        ringfile::RECOVERED_NOTE,
        s.windows.len(),
        s.pt_bytes,
        s.windows.len() - n_ring,
        s.rec.discarded_windows
    );
    let notes = notes(&p.out);
    assert!(notes.contains(&want_note), "{notes:?} lack {want_note:?}");
}

#[test]
fn emulated_signal_writes_both_threads_rings_each_its_own_last_iterations() {
    let p = prog_emu();
    const PER: u64 = 1500;
    let mut live = Live::spawn(emu_command(
        &p,
        &[
            "--snapshot",
            "8K",
            "--trigger",
            "signal:USR2",
            "--trigger",
            "syscall:getppid",
        ],
        &[&PER.to_string(), "threads", "1"],
    ));
    live.wait_ready(2);
    live.wait_blocked_in_read(2);
    live.signal(libc::SIGUSR2);
    live.wait_note(&p.out, "snapshot 1: complete, written by 2 threads");
    // A byte on stdin: main's read returns, it calls getppid (a trigger fired in that
    // thread while the other is still blocked), then reads again; EOF ends it.
    live.send(b"x");
    live.wait_note(&p.out, "snapshot 2: complete, written by 2 threads");
    let out = live.end();
    assert!(
        out.contains("snapshot 2: trigger syscall:getppid fired in thread"),
        "{out}"
    );
    assert!(
        out.contains("snapshot 1: trigger signal:SIGUSR2 (sent to pttrace run) fired"),
        "{out}"
    );
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), 2);
    let main_tid = t.processes[0].pid;
    let mut loops = Vec::new();
    for th in &t.threads {
        let main = th.header.tid == main_tid;
        let snaps = thread_snapshots(&t, th);
        assert_eq!(snaps.len(), 2, "thread {}: two firings", th.header.tid);
        let (s, s2) = (&snaps[0], &snaps[1]);
        assert_eq!(s.rec.number, 1);
        assert_eq!(s.rec.kind, TriggerKind::Signal as u32);
        assert_eq!(s.rec.fired_tid, 0);
        assert_eq!(s.gaps, 0);
        assert!(s.pt_bytes <= 8 * 1024, "{}", s.pt_bytes);
        assert!(s.rec.discarded_windows > 0, "{:?}", s.rec);
        // Blocked in read: the snapshot ends with the window of its `ready K` write,
        // returned, then the window up to the read, cut there (as under QEMU). Before
        // them, exactly the last iterations of the thread's own loop, whole (the write's
        // window holds the loop's end, then ready()).
        let before = assert_ends_blocked_in_read(s, main.then_some(0));
        let (_, done, _) = iterations(&p, before);
        let k = done[0] / PER;
        let got = assert_tail_of_loop(&p, before, (k + 1) * PER - 1);
        assert!(got > 50, "{got} iterations");
        assert_eq!(k == 0, main, "thread {}: loop {k}", th.header.tid);
        assert!(!s.pcs.contains(&p.marker));
        loops.push(k);
        // The second firing, in the main thread at getppid's return.
        assert_eq!(s2.rec.number, 2);
        assert_eq!(s2.rec.kind, TriggerKind::Syscall as u32);
        assert_eq!(s2.rec.fired_tid, main_tid);
        assert_eq!(s2.gaps, 0);
        if main {
            // Only what ran since: not the read's code again (its window returned after
            // the cut), just the code from its return to getppid.
            assert_eq!(s2.windows.len(), 1, "{:?}", s2.windows);
            let w = &s2.windows[0];
            assert_eq!((w.nr, w.flags), (libc::SYS_getppid as u64, 0));
            assert!(w.ret > 0);
            assert_eq!(s2.last_insn[0], SYSCALL_INSN);
            assert!(!s2.pcs.contains(&p.step));
            assert!(!s2.pcs.contains(&p.one) && !s2.pcs.contains(&p.zero));
        } else {
            // Still in the same read, cut already: nothing new.
            assert_eq!(s2.rec.windows, 0);
            assert!(s2.windows.is_empty());
        }
    }
    loops.sort_unstable();
    assert_eq!(loops, [0, 1]);
}

/// Where the instruction at `pc` (`bytes`) may go next: its fall-through or its direct
/// target; `None` for returns and indirect branches (anywhere).
fn successors(pc: u64, bytes: &[u8]) -> Option<Vec<u64>> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let i = Decoder::with_ip(64, bytes, pc, DecoderOptions::NONE).decode();
    let next = pc + i.len() as u64;
    match i.flow_control() {
        FlowControl::Next | FlowControl::Interrupt => Some(vec![next]),
        FlowControl::UnconditionalBranch | FlowControl::Call => Some(vec![i.near_branch64()]),
        FlowControl::ConditionalBranch => Some(vec![next, i.near_branch64()]),
        _ => None,
    }
}

#[test]
fn emulated_a_thread_running_code_takes_a_firing_between_two_instructions_and_loses_nothing() {
    let p = prog_emu();
    const N: u64 = 300;
    // A ring large enough that nothing of the spinning thread is dropped (its iterations
    // from the first are in its two snapshots).
    let o = run_emu(
        &p,
        &[
            "--snapshot",
            "16M",
            "--trigger",
            "syscall:getppid",
            "--trigger",
            "exit",
        ],
        &[&N.to_string(), "spin"],
    );
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), 2, "{}", text(&o));
    let main_tid = t.processes[0].pid;
    let notes = notes(&p.out);
    assert!(
        notes.contains(&"snapshot 1: complete, written by 2 threads".to_string()),
        "{notes:?}"
    );
    assert!(
        !notes.iter().any(|n| n.contains("did not reach")),
        "{notes:?}"
    );
    for th in &t.threads {
        let snaps = thread_snapshots(&t, th);
        assert_eq!(snaps.len(), 2, "the syscall firing, then the thread's exit");
        let (s1, s2) = (&snaps[0], &snaps[1]);
        assert_eq!(s1.rec.number, 1);
        assert_eq!(s1.rec.kind, TriggerKind::Syscall as u32);
        assert_eq!(s1.rec.fired_tid, main_tid);
        assert_eq!(s2.rec.kind, TriggerKind::Exit as u32);
        for s in [s1, s2] {
            assert_eq!(s.gaps, 0);
            assert_eq!(s.rec.discarded_windows, 0);
        }
        if th.header.tid == main_tid {
            let w = s1.windows.last().unwrap();
            assert_eq!((w.nr, w.flags), (libc::SYS_getppid as u64, 0));
            assert_tail_of_loop(&p, &s1.pcs, N - 1);
            continue;
        }
        // The spinning thread was executing code when getppid returned in main (which
        // then stops it): its first snapshot ends at its next instruction, in a window
        // cut there, at the cut's time.
        let last = s1.windows.last().unwrap();
        assert_eq!(last.flags, WF_NO_SYSCALL | ptt::WF_SNAPSHOT_CUT);
        assert_eq!(s1.rec.tsc, last.tsc_end);
        assert!(s1.windows[..s1.windows.len() - 1]
            .iter()
            .all(|w| w.flags & ptt::WF_SNAPSHOT_CUT == 0));
        assert!(s2
            .windows
            .iter()
            .all(|w| w.flags & ptt::WF_SNAPSHOT_CUT == 0));
        // Nothing lost or repeated at the cut: the second snapshot starts with the
        // instruction the first one's last instruction leads to...
        let (pc, bytes) = (*s1.pcs.last().unwrap(), s1.last_insn.last().unwrap());
        if let Some(next) = successors(pc, bytes) {
            assert!(next.contains(&s2.pcs[0]), "{pc:#x} then {:#x}", s2.pcs[0]);
        }
        // ...and both together spell every iteration from the first, in order.
        assert_every_iteration_from_the_first(&p, s1, s2);
        let (_, before, _) = iterations(&p, &s1.pcs);
        assert!(!before.is_empty(), "the cut came after some iterations");
    }
}

#[test]
fn emulated_exit_snapshot_ends_a_thread_running_code_at_its_next_instruction() {
    let p = prog_emu();
    const N: u64 = 200;
    run_emu(
        &p,
        &["--snapshot", "16M", "--trigger", "exit"],
        &[&N.to_string(), "spinexit"],
    );
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), 2);
    let main_tid = t.processes[0].pid;
    let notes = notes(&p.out);
    assert!(
        notes.contains(&"snapshot 1: complete, written by 2 threads".to_string()),
        "{notes:?}"
    );
    for th in &t.threads {
        let snaps = thread_snapshots(&t, th);
        assert_eq!(snaps.len(), 1, "the exit snapshot");
        let s = &snaps[0];
        assert_eq!(s.rec.kind, TriggerKind::Exit as u32);
        assert_eq!(s.rec.trigger, "exit (exit_group)");
        assert_eq!((s.gaps, s.rec.discarded_windows), (0, 0));
        let last = s.windows.last().unwrap();
        if th.header.tid == main_tid {
            assert_eq!(last.nr, libc::SYS_exit_group as u64);
            assert_tail_of_loop(&p, &s.pcs, N - 1);
            continue;
        }
        // Still looping when main called exit_group: its snapshot holds its iterations
        // from the first up to its next instruction then, in a window cut there.
        assert_eq!(last.flags, WF_NO_SYSCALL | ptt::WF_SNAPSHOT_CUT);
        assert_eq!(s.rec.tsc, last.tsc_end);
        let (lead, done, _) = iterations(&p, &s.pcs);
        assert!(lead.is_empty());
        assert!(done.len() > 1, "{} iterations", done.len());
        let want: Vec<u64> = (0..done.len() as u64).collect();
        assert_eq!(done, want);
    }
}

#[test]
fn emulated_a_thread_in_an_untraced_signal_handler_at_a_firing_is_written_after_500_ms_and_noted() {
    let p = prog_emu();
    const N: u64 = 100;
    run_emu(
        &p,
        &[
            "--snapshot",
            "16M",
            "--trigger",
            "syscall:getppid",
            "--trigger",
            "exit",
        ],
        &[&N.to_string(), "handler"],
    );
    let t = ptt_dir::open(&p.out).unwrap();
    assert_eq!(t.threads.len(), 2);
    let main_tid = t.processes[0].pid;
    let other = t
        .threads
        .iter()
        .find(|th| th.header.tid != main_tid)
        .unwrap();
    // The spinning thread was inside its SIGUSR1 handler (signal handlers run untraced:
    // no step ends its buffer) for 1.5 s after getppid fired: the writer waited 500 ms,
    // said so, and wrote its part with the windows taken by then.
    let notes = notes(&p.out);
    let want = format!(
        "snapshot 1: thread {} did not reach its next instruction within 500 ms of the \
         firing (running untraced code, e.g. a signal handler): its part ends with the \
         windows taken by then",
        other.header.tid
    );
    assert!(notes.contains(&want), "{notes:?}");
    assert!(
        notes.contains(&"snapshot 1: complete, written by 2 threads".to_string()),
        "{notes:?}"
    );
    let snaps = thread_snapshots(&t, other);
    assert_eq!(snaps.len(), 2, "the syscall firing, then the thread's exit");
    let (s1, s2) = (&snaps[0], &snaps[1]);
    assert_eq!(s1.rec.kind, TriggerKind::Syscall as u32);
    assert_eq!(s2.rec.kind, TriggerKind::Exit as u32);
    // (Nor does its window that ended at its first step after the handler, in the next
    // snapshot: it ends no part.)
    for s in [s1, s2] {
        assert!(s
            .windows
            .iter()
            .all(|w| w.flags & ptt::WF_SNAPSHOT_CUT == 0));
    }
    // Its stepped code is all there, none lost or repeated: both snapshots spell every
    // iteration from the first, in order.
    assert_every_iteration_from_the_first(&p, s1, s2);
    assert_eq!((s1.gaps, s2.gaps), (0, 0));
}
