//! Snapshot (flight-recorder) mode of the shim's single-step backend (`pttrace run
//! --backend emulated --mode user --window thread --snapshot SIZE [--trigger ...]`;
//! semantics shared with the QEMU backend in [`crate::format::snapshot`]).
//!
//! **Normal context only: everything here runs on the writer thread** (the one thread
//! that encodes PT, see [`super::super::userpt::window_pt`]); the handler's side (the exit
//! request, whether the mode is on) is [`super::request`]. The state is the writer's
//! alone: no lock, and a forked child (whose writer is a new thread) leaves its parent's
//! copy untouched and starts afresh (the pid changed).
//!
//! Each thread has a [`Ring`] of its last windows (`pttrace_format::snapshot_ring`, the
//! QEMU plugin's ring too). The writer encodes a window in pieces of at most SIZE/8 bytes
//! of PT ([`super::super::userpt::window_pt`] with a cut): every piece but the last is a window
//! of its own flagged `WF_NO_SYSCALL` (it starts with a PSB+ and decodes on its own), so
//! a long stretch of code without syscalls does not become one window bigger than the
//! ring. In snapshot mode the windows of a thread file are numbered by the ring (a window
//! cut into pieces numbers each piece). Each ring has a copy in a `MAP_SHARED` file
//! ([`super::file`]) that a SIGKILL does not take away: `pttrace run` then writes it
//! as a `kill` snapshot ([`crate::format::ringfile`]).
//!
//! Triggers:
//! - `syscall:NAME`: the window ending at that syscall (return value included) is the
//!   firing thread's last;
//! - `addr:SYMBOL|0xADDR`: the single-step handler records a mark when the thread is about
//!   to execute the address ([`crate::emu::trap::MARK_ADDRS`]) and hands its buffer over
//!   there ([`super::super::userpt`]: a window of its own, stepping goes on in another buffer);
//!   the window is cut there (the instruction at the address not executed) and the
//!   snapshot taken at the writer's next pass, however long the thread runs on without
//!   a syscall;
//! - `signal:SIG`: `pttrace run` appends `signal N` to the trace directory's request file,
//!   which the writer reads at each pass (at least every 10 ms);
//! - `exit`: a thread's ring when it ends (`exit`), every thread's at `exit_group`,
//!   `execve`, a fatal signal or the last thread's end (the handler asks the writer and
//!   waits, [`super::request::flush_for_exit`]).
//!
//! A firing has the next number of the process image; the firing thread writes its ring
//! at once. Every other thread's part ends where that thread was when the trigger fired,
//! as under QEMU: a firing makes a cut request ([`crate::emu::trap::request_cut`]; the
//! SIGSYS handler makes it as a `syscall:` trigger's syscall returns, the single-step
//! handler at an `addr:` mark, the writer for `signal:`), and
//! - a thread running stepped code ends its buffer at its next step, a window of its own
//!   cut there (`WF_NO_SYSCALL | WF_SNAPSHOT_CUT`), the last of its part;
//! - a thread inside a syscall ends with that syscall's window cut (`WF_SNAPSHOT_CUT`,
//!   its user code up to the syscall, no return value:
//!   [`super::super::userpt::cut_in_flight`]); the window queued at its return is not written
//!   again, its `syscall:` trigger fires then ([`cut_returned`]);
//! - windows opened after the request belong to the next snapshot
//!   ([`super::super::userpt::Cuts`] says where each window lies).
//!
//! The writer waits for those ends ([`end_drain`]) up to [`CUT_WAIT`] (a thread running
//! an untraced signal handler does not step: noted, its part ends with what was taken).
//! A thread's snapshots stay in number order: when it fires a trigger itself, the
//! firings it still owes are written first with what it has. At the process's end the
//! `exit` snapshot waits the same way for threads still running code. The info file gets
//! the same notes as under QEMU.
//!
//! A stretch without syscalls longer than a step buffer comes in buffers handed over
//! mid-window (windows `nr` [`super::super::userpt::HANDOVER_NR`], `WF_NO_SYSCALL`), cut into
//! pieces like any window: the ring keeps the stretch's end.

use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};
use std::sync::OnceLock;

use super::super::frame::write_frame_parts;
use super::super::raw;
use super::super::slots::{self, Slot};
use super::super::userpt::{Cuts, Piece};
use super::file::RingFile;
use crate::format::ptt::{EndReason, RecordType, Window, WF_NO_SYSCALL, WF_SNAPSHOT_CUT};
use crate::format::snapshot::{
    elf_address, AddrSpec, ElfAddrError, TriggerKind, UserTrigger, REQUEST_FILE,
};
use crate::format::snapshot_ring::{cut_size, Ring, RingWindow};

/// The snapshot settings of this process image (set at start-up).
pub struct Settings {
    pub size: u64,
    exit: bool,
    syscalls: Vec<u64>,
    signals: Vec<i32>,
    /// `addr:` triggers by mark index: how notes and records name them.
    marks: Vec<String>,
    request: Option<PathBuf>,
    /// The hardware backend keeps each thread's PT ([`super::hw`]), not the rings.
    hardware: bool,
    /// DATA ring pages (2^n) of the hardware events.
    sb_shift: u32,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Bytes of the request file already taken (inherited by a forked child, so that it does
/// not take its parent's requests again).
static REQUEST_SEEN: AtomicU64 = AtomicU64::new(0);

pub fn settings() -> Option<&'static Settings> {
    SETTINGS.get()
}

/// PT bytes per window piece.
pub fn cut() -> Option<usize> {
    settings().map(|s| usize::try_from(cut_size(s.size)).unwrap_or(usize::MAX))
}

/// Start-up (normal context, before Syscall User Dispatch is armed): checks that this
/// configuration can keep a ring (`stepping`: the single-step backend records user PT;
/// `hardware`: Intel PT hardware in user mode, see [`super::hw`]), resolves `addr:`
/// triggers in this image's executable and turns the mode on. Returns the notes for the
/// info file.
pub fn init(
    cfg: &super::super::config::ShimConfig,
    stepping: bool,
    hardware: bool,
    out: &std::path::Path,
) -> Result<Vec<String>, String> {
    let Some(size) = cfg.snapshot else {
        return Ok(Vec::new());
    };
    if !stepping && !hardware {
        return Err(
            "snapshot mode (PTTRACER_SNAPSHOT) needs user PT in thread windows \
             (PTTRACER_MODE=user PTTRACER_WINDOW=thread) from the emulated backend or Intel \
             PT hardware"
                .into(),
        );
    }
    if hardware {
        if let Some(t) = cfg
            .triggers
            .iter()
            .find(|t| matches!(t, UserTrigger::Addr(_)))
        {
            return Err(format!(
                "snapshot trigger {}: the hardware backend cannot see an address being \
                 executed (Intel PT reports branches, not each instruction); use exit, \
                 signal:SIG or syscall:NAME, or --backend qemu|emulated",
                super::super::config::describe_trigger(t)
            ));
        }
    }
    let mut notes = Vec::new();
    let mut s = Settings {
        size,
        exit: false,
        syscalls: Vec::new(),
        signals: Vec::new(),
        marks: Vec::new(),
        request: None,
        hardware,
        sb_shift: cfg.sb_shift,
    };
    for t in &cfg.triggers {
        match t {
            UserTrigger::Exit => s.exit = true,
            UserTrigger::Syscall(nr) => s.syscalls.push(*nr),
            UserTrigger::Signal(n) => s.signals.push(*n),
            UserTrigger::Addr(spec) => {
                let label = super::super::config::describe_trigger(t);
                match resolve_addr(spec) {
                    Ok(a) => {
                        let k = s.marks.len();
                        let cell = crate::emu::trap::MARK_ADDRS.get(k).ok_or_else(|| {
                            format!(
                                "{label}: at most {} addr: triggers",
                                crate::emu::trap::MARK_ADDRS.len()
                            )
                        })?;
                        cell.store(a, Relaxed);
                        s.marks.push(label.clone());
                        notes.push(format!("snapshot trigger {label} is address {a:#x}"));
                    }
                    Err(why) => notes.push(format!(
                        "snapshot trigger {label} does not fire in this image: {why}"
                    )),
                }
            }
        }
    }
    if !s.signals.is_empty() {
        let path = out.join(REQUEST_FILE);
        REQUEST_SEEN.store(std::fs::metadata(&path).map_or(0, |m| m.len()), Relaxed);
        s.request = Some(path);
    }
    if hardware {
        super::request::trace_new_threads_from_start();
    }
    if !super::request::fire_at(&s.syscalls) {
        return Err(format!(
            "at most {} syscall: snapshot triggers",
            super::request::MAX_SYSCALL_TRIGGERS
        ));
    }
    let exit = s.exit;
    let _ = SETTINGS.set(s);
    super::request::turn_on(exit);
    Ok(notes)
}

/// An `addr:` trigger's run-time address in this image's executable.
fn resolve_addr(spec: &AddrSpec) -> Result<u64, String> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let data = std::fs::read(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    let a = elf_address(&data, spec).map_err(|e| match e {
        ElfAddrError::NotElf(e) => format!("{}: not an ELF file ({e})", exe.display()),
        ElfAddrError::NotX86_64 => format!("{}: not an x86-64 ELF file", exe.display()),
        ElfAddrError::NoSymbol => format!("no such symbol defined in {}", exe.display()),
    })?;
    if !a.loaded {
        return Err(format!(
            "{:#x} is not inside a loaded segment of {}",
            a.value,
            exe.display()
        ));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let first = crate::format::snapshot::exe_first_page(&maps, &exe);
    crate::format::snapshot::runtime_address(&a, first)
        .ok_or_else(|| format!("the mapping of {} was not found", exe.display()))
}

/// A window in the ring: its record and sideband.
struct Meta {
    w: Window,
    sideband: Vec<u8>,
}

impl RingWindow for Meta {
    fn sideband_mut(&mut self) -> &mut Vec<u8> {
        &mut self.sideband
    }
}

/// One firing, as the threads of the process write it.
struct Firing {
    number: u64,
    kind: TriggerKind,
    tid: i32,
    text: String,
    tsc: u64,
    /// Its cut request ([`crate::emu::trap::request_cut`]; single-step backend): each
    /// other thread's part ends with its window open at the request.
    gen: u64,
    at: std::time::Instant,
    /// Threads still to write it, of `threads`.
    remaining: usize,
    threads: usize,
}

struct ThreadRing {
    slot: *const Slot,
    tid: i32,
    ring: Ring<Meta>,
    /// The ring's copy in a file ([`super::file`]), when it could be made.
    file: Option<RingFile>,
    next_index: u64,
    /// Window frames written to the file.
    written: u64,
    /// Firings (indices into `State::firings`) this thread has still to write.
    pending: Vec<usize>,
    /// The process-end `exit` snapshot is written.
    exit_done: bool,
    /// Hardware backend: the thread's event (`None` when it could not be opened: noted).
    hw: Option<super::hw::ThreadPt>,
}

struct State {
    pid: i32,
    number: u64,
    /// The cut request of the process end's `exit` snapshot (0: none yet).
    exit_cut: u64,
    threads: Vec<ThreadRing>,
    firings: Vec<Firing>,
    cuts: CutsKnown,
    /// The process image ends: windows wait for nothing.
    ending: bool,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

/// The writer's state for this process (a fresh one in a forked child).
fn state() -> &'static mut State {
    let pid = raw::getpid();
    let p = STATE.load(Acquire);
    // SAFETY: only the writer thread of this process dereferences STATE, and never holds
    // two references at once (each entry point takes it once); a state of another pid is
    // the parent's (copied by fork) and is left alone (leaked).
    if let Some(st) = unsafe { p.as_mut() } {
        if st.pid == pid {
            return st;
        }
    }
    let fresh = Box::into_raw(Box::new(State {
        pid,
        number: 0,
        exit_cut: 0,
        threads: Vec::new(),
        firings: Vec::new(),
        // (A forked child's writer is never told about its parent's requests.)
        cuts: CutsKnown::after(crate::emu::trap::cut_requests_at_fork()),
        ending: false,
    }));
    STATE.store(fresh, Release);
    // SAFETY: just allocated; see above.
    unsafe { &mut *fresh }
}

impl State {
    fn ring_of(&mut self, slot: &Slot) -> Option<&mut ThreadRing> {
        let size = settings()?.size;
        let tid = slot.tid.load(Relaxed);
        let sp = slot as *const Slot;
        let i = match self.threads.iter().position(|t| t.slot == sp) {
            Some(i) if self.threads[i].tid == tid => i,
            Some(i) => {
                // A recycled slot: the previous thread's ring is gone with it.
                self.threads.remove(i);
                self.new_ring(sp, tid, size)
            }
            None => self.new_ring(sp, tid, size),
        };
        self.threads.get_mut(i)
    }

    fn new_ring(&mut self, slot: *const Slot, tid: i32, size: u64) -> usize {
        // SAFETY: slots are never unmapped.
        let s = unsafe { &*slot };
        let hardware = settings().filter(|set| set.hardware);
        let hw = hardware.and_then(|set| open_hardware(s, tid, size, set.sb_shift));
        // The single-step ring's file copy (the hardware's area is the kernel's).
        let wanted = hardware.is_none() && slots::STATIC.get().is_some_and(|st| st.spool);
        let file = if wanted {
            let (pid, nonce) = (s.pid.load(Relaxed), s.nonce.load(Relaxed));
            match RingFile::create(pid, nonce, tid, size) {
                Ok(f) => Some(f),
                Err(why) => {
                    note(&format!(
                        "snapshot ring of thread {tid} is not kept in a file ({why}): a \
                         SIGKILL of the process loses it"
                    ));
                    None
                }
            }
        } else {
            None
        };
        self.threads.push(ThreadRing {
            slot,
            tid,
            ring: Ring::new(size),
            file,
            next_index: 0,
            written: 0,
            pending: Vec::new(),
            exit_done: false,
            hw,
        });
        self.threads.len() - 1
    }

    fn next_number(&mut self) -> u64 {
        self.number += 1;
        self.number
    }
}

/// The cut requests ([`crate::emu::trap::request_cut`]) that have reached the writer:
/// the window that made one was taken, or the writer made it.
struct CutsKnown {
    /// Every request up to this one.
    upto: u64,
    /// Requests above `upto` (one below them has not come).
    above: Vec<u64>,
    /// The request a window waits for ([`CutsKnown::may_take`]), since when.
    waiting: Option<(u64, std::time::Instant)>,
}

impl CutsKnown {
    /// Requests up to `upto` count as known (a forked child's parent's).
    fn after(upto: u64) -> Self {
        CutsKnown {
            upto,
            above: Vec::new(),
            waiting: None,
        }
    }

    /// Request `g` has come (0: none).
    fn add(&mut self, g: u64) {
        if g <= self.upto || self.above.contains(&g) {
            return;
        }
        self.above.push(g);
        while let Some(k) = self.above.iter().position(|&x| x == self.upto + 1) {
            self.above.swap_remove(k);
            self.upto += 1;
        }
    }

    /// Whether a window closed after request `closed` may be taken at `now`: every request
    /// up to it has come, or the first one missing was waited for [`CUT_WAIT`] (its
    /// window was dropped: given up).
    fn may_take(&mut self, closed: u64, now: std::time::Instant) -> bool {
        loop {
            if closed <= self.upto {
                self.waiting = None;
                return true;
            }
            let want = self.upto + 1;
            match self.waiting {
                Some((g, since)) if g == want && now.duration_since(since) >= CUT_WAIT => {
                    self.add(want);
                    self.waiting = None;
                }
                Some((g, _)) if g == want => return false,
                _ => {
                    self.waiting = Some((want, now));
                    return false;
                }
            }
        }
    }
}

/// Whether the writer may take a window whose steps were closed after cut request
/// `closed` ([`super::super::userpt::closed_at`]) into its thread's ring now. Not before
/// every request up to `closed` has reached the writer: a request is made as its window
/// is queued (a `syscall:` trigger's return, an `addr:` mark), and the writer may reach
/// another thread's queue first, in the same pass, and find there the window that request
/// cut, or windows after it. Taken before the firing, they would go into the ring as if
/// the thread's part had not ended: its snapshot would run on past the firing. The
/// window waits in its queue (the thread's later windows behind it) until the pass that
/// takes the request; a request whose window never comes (dropped by backpressure) is
/// given up after [`CUT_WAIT`].
pub fn may_take(closed: u64) -> bool {
    let st = state();
    st.ending || st.cuts.may_take(closed, std::time::Instant::now())
}

/// Thread `tid`'s hardware snapshot event (`slot`'s), or `None` noted with the kernel's
/// reason (a new thread waiting for it then goes on untraced).
fn open_hardware(slot: &Slot, tid: i32, size: u64, sb_shift: u32) -> Option<super::hw::ThreadPt> {
    match super::hw::ThreadPt::open(slot, size, sb_shift) {
        Ok(t) => Some(t),
        Err(why) => {
            note(&format!(
                "thread {tid} is in no snapshot: its hardware trace could not be opened ({why})"
            ));
            slot.snap_fd.store(-2, Release);
            None
        }
    }
}

fn note(text: &str) {
    write_frame_parts(
        slots::INFO_FD.load(Acquire),
        RecordType::Note,
        &[text.as_bytes()],
    );
}

fn complete_note(number: u64, threads: usize) -> String {
    let s = if threads == 1 { "" } else { "s" };
    format!("snapshot {number}: complete, written by {threads} thread{s}")
}

/// Writes `t`'s ring (of `slot`) as snapshot `number` into `fd` and empties it; the
/// slot's count of written windows (its `End` record's) follows.
#[allow(clippy::too_many_arguments)]
fn write_ring(
    slot: &Slot,
    t: &mut ThreadRing,
    fd: i32,
    number: u64,
    kind: TriggerKind,
    tid: i32,
    text: &str,
    tsc: u64,
) {
    if settings().is_some_and(|set| set.hardware) {
        if let Some(hw) = t.hw.as_mut() {
            match hw.write(fd, number, kind, tid, text) {
                Ok(true) => t.written += 1,
                Ok(false) => {}
                Err(why) => note(&format!(
                    "snapshot {number}: thread {}'s hardware trace was not written: {why}",
                    t.tid
                )),
            }
        }
        slot.written.store(t.written, Relaxed);
        return;
    }
    let taken = t.ring.take();
    let tsc = taken.windows.back().map_or(tsc, |(m, _)| m.w.tsc_end);
    let rec = taken.record(number, kind as u32, tid, tsc, text.to_string());
    write_frame_parts(fd, RecordType::Snapshot, &[&rec.payload()]);
    for (meta, pt) in &taken.windows {
        if super::super::userpt::write_window(fd, &meta.w, pt, &meta.sideband) {
            t.written += 1;
        }
    }
    slot.written.store(t.written, Relaxed);
    // In the thread file now (a recovery skips the windows the file has, should a kill
    // come before the clear).
    t.sync_file();
    if let Some(f) = t.file.as_mut() {
        f.clear();
    }
}

impl ThreadRing {
    /// Adds a window to the ring and its file.
    fn push(&mut self, meta: Meta, pt: Vec<u8>) {
        if let Some(f) = self.file.as_mut() {
            f.push(&meta.w, &pt, &meta.sideband);
        }
        self.ring.push(meta, pt, drop);
        self.sync_file();
    }

    /// The file follows the ring: the windows it dropped, its counts.
    fn sync_file(&mut self) {
        if let Some(f) = self.file.as_mut() {
            f.keep_last(self.ring.len());
            f.set_state(self.ring.discarded(), self.next_index);
        }
    }
}

/// How long a thread may take to reach its next step after a firing's cut request (it
/// may be running an untraced signal handler) before its part is written without it.
const CUT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The first firing this thread has still to write: (index, cut request, when fired).
fn first_pending(st: &mut State, slot: &Slot) -> Option<(usize, u64, std::time::Instant)> {
    loop {
        let i = *st.ring_of(slot)?.pending.first()?;
        match st.firings.get(i) {
            Some(f) => return Some((i, f.gen, f.at)),
            None => {
                st.ring_of(slot)?.pending.remove(0);
            }
        }
    }
}

/// Writes firing `i` (this thread's first pending one) from the ring as it is; a thread
/// inside a syscall whose window opened before the firing first ends with that window,
/// cut (no return value yet; its return ends nothing, see
/// [`super::super::userpt::cut_in_flight`]).
fn write_firing(st: &mut State, slot: &Slot, fd: i32, i: usize) {
    if let Some(t) = st.ring_of(slot) {
        t.pending.retain(|&k| k != i);
    }
    let Some(f) = st.firings.get(i) else { return };
    let (number, kind, tid, text, tsc, gen) =
        (f.number, f.kind, f.tid, f.text.clone(), f.tsc, f.gen);
    if let Some(c) = cut().and_then(|n| super::super::userpt::cut_in_flight(slot, n, gen)) {
        push_pieces(
            st,
            slot,
            fd,
            &c.w,
            c.pieces,
            c.sideband,
            0,
            false,
            Cuts::default(),
        );
    }
    if let Some(t) = st.ring_of(slot) {
        write_ring(slot, t, fd, number, kind, tid, &text, tsc);
    }
    done(st, i);
}

/// Every firing this thread has still to write, written now with what its ring holds
/// (it ended, the process ends, or it fires a trigger itself: its snapshots stay in
/// number order).
fn write_pending(st: &mut State, slot: &Slot, fd: i32) {
    while let Some((i, _, _)) = first_pending(st, slot) {
        write_firing(st, slot, fd, i);
    }
}

/// The firings this thread has pending whose cut request is at most `upto`, in order:
/// the windows in its ring are all of its part in them (the window just taken was open at
/// their request, or the next one opened after it).
fn write_due(st: &mut State, slot: &Slot, fd: i32, upto: u64) {
    while let Some((i, gen, _)) = first_pending(st, slot) {
        if gen > upto {
            return;
        }
        write_firing(st, slot, fd, i);
    }
}

/// A thread has written firing `i`; the last one notes the snapshot complete.
fn done(st: &mut State, i: usize) {
    if let Some(f) = st.firings.get_mut(i) {
        f.remaining = f.remaining.saturating_sub(1);
        if f.remaining == 0 {
            note(&complete_note(f.number, f.threads));
        }
    }
}

/// A trigger fired (in thread `slot` when given, whose ring is written at once into `fd`);
/// every other thread of the process writes it once the writer has its window that was
/// open at the cut request `gen` (0: requested here): its part ends where it was when the
/// trigger fired, at most one instruction later.
fn fire(st: &mut State, from: Option<(&Slot, i32)>, kind: TriggerKind, text: String, gen: u64) {
    let stepping = settings().is_some_and(|set| !set.hardware) && super::super::userpt::enabled();
    let gen = match gen {
        0 if stepping => crate::emu::trap::request_cut(),
        g => g,
    };
    st.cuts.add(gen);
    let number = st.next_number();
    let tid = from.map_or(0, |(s, _)| s.tid.load(Relaxed));
    let where_ = if tid > 0 {
        format!(" in thread {tid}")
    } else {
        String::new()
    };
    note(&format!("snapshot {number}: trigger {text} fired{where_}"));
    let me = from.map(|(s, _)| s as *const Slot);
    let pid = raw::getpid();
    let live: Vec<*const Slot> = (0..slots::slot_count())
        .filter_map(slots::slot_at)
        .filter(|s| s.state.load(Acquire) != slots::FREE && s.pid.load(Relaxed) == pid)
        .map(|s| s as *const Slot)
        .collect();
    let i = st.firings.len();
    st.firings.push(Firing {
        number,
        kind,
        tid,
        text,
        tsc: raw::rdtsc(),
        gen,
        at: std::time::Instant::now(),
        remaining: live.len() + usize::from(me.is_some_and(|m| !live.contains(&m))),
        threads: 0,
    });
    let total = st.firings[i].remaining;
    st.firings[i].threads = total;
    if total == 0 {
        note(&complete_note(number, 0));
    }
    for sp in live {
        if Some(sp) == me {
            continue;
        }
        // SAFETY: slots are never unmapped.
        let s = unsafe { &*sp };
        if let Some(t) = st.ring_of(s) {
            t.pending.push(i);
        }
    }
    if let Some((s, fd)) = from {
        // (Its earlier firings first, with what it has.)
        write_pending(st, s, fd);
        let f = &st.firings[i];
        let (text, tsc) = (f.text.clone(), f.tsc);
        if let Some(t) = st.ring_of(s) {
            write_ring(s, t, fd, number, kind, tid, &text, tsc);
        }
        done(st, i);
    }
}

/// Start-up, before the writer thread exists (so the writer's state is touched by one
/// thread): on the hardware backend the main thread's event opens here, so that it is
/// traced from its first instruction after start-up (later threads: at the writer's
/// first pass over their slot, see [`super::hw`]).
pub fn start_main_thread(slot: &Slot) {
    if settings().is_some_and(|set| set.hardware) {
        let _ = state().ring_of(slot);
    }
}

/// After the writer took `slot`'s queue (its file `fd` is open): the firings it has still
/// to write whose part is complete. Waits (at the next passes) while the thread still runs
/// the code of a window opened before a firing, up to [`CUT_WAIT`]; a thread in a syscall
/// ends with that syscall's window, cut.
pub fn end_drain(slot: &Slot, fd: i32) {
    let st = state();
    while let Some((i, gen, at)) = first_pending(st, slot) {
        // Its queued windows first (at the next pass), then its window open at the
        // request.
        let incomplete = slot.queued() != 0
            || super::super::userpt::at_firing(slot, gen)
                == super::super::userpt::AtFiring::Running;
        if incomplete {
            if at.elapsed() < CUT_WAIT {
                return;
            }
            let (number, tid) = (
                st.firings.get(i).map_or(0, |f| f.number),
                slot.tid.load(Relaxed),
            );
            note(&format!(
                "snapshot {number}: thread {tid} did not reach its next instruction within \
                 {} ms of the firing (running untraced code, e.g. a signal handler): its \
                 part ends with the windows taken by then",
                CUT_WAIT.as_millis()
            ));
        }
        write_firing(st, slot, fd, i);
    }
}

/// A window of `slot` without PT (metadata only), into its ring. On the hardware backend
/// the windows are not kept (the PT holds the syscalls as disable/enable pairs): only a
/// `syscall:` trigger fires.
pub fn push_plain(slot: &Slot, fd: i32, w: &Window) {
    if settings().is_some_and(|set| set.hardware) {
        let st = state();
        // Opens the thread's event when this is the writer's first sight of it.
        let _ = st.ring_of(slot);
        fire_syscall_trigger(st, slot, fd, w, 0);
        return;
    }
    push(slot, fd, w, Vec::new(), Vec::new(), 0, Cuts::default());
}

/// A window of `slot` whose PT was encoded in `pieces`: every piece but the last becomes
/// a `WF_NO_SYSCALL` window; the last carries `w`. Triggers reached in it fire; firings
/// of other threads are written around it by `cuts`.
pub fn push(
    slot: &Slot,
    fd: i32,
    w: &Window,
    pieces: Vec<Piece>,
    sideband: Vec<u8>,
    flags: u32,
    cuts: Cuts,
) {
    push_pieces(state(), slot, fd, w, pieces, sideband, flags, true, cuts);
}

/// The window of a syscall whose code went into a snapshot as a `snapshot-cut` window
/// while it was in flight has returned: it is not written again, but a `syscall:` trigger
/// on it fires now (its return), with the cut request the handler made there (`fired`).
pub fn cut_returned(slot: &Slot, fd: i32, w: &Window, fired: u64) {
    let st = state();
    fire_syscall_trigger(st, slot, fd, w, fired);
    st.cuts.add(fired);
}

/// Window `w` of `slot` (file `fd`) ended at a `syscall:` trigger's syscall (not a
/// nested one): the trigger fires in that thread, with the cut request the handler made
/// at the syscall (`gen`, 0: none).
fn fire_syscall_trigger(st: &mut State, slot: &Slot, fd: i32, w: &Window, gen: u64) {
    if w.depth == 0 && settings().is_some_and(|set| set.syscalls.contains(&w.nr)) {
        let text = crate::format::snapshot::Trigger::Syscall(w.nr).describe();
        fire(st, Some((slot, fd)), TriggerKind::Syscall, text, gen);
    }
}

/// [`push`] into `st`; `syscall` false: the window's syscall trigger does not fire (a
/// window cut before its syscall returned).
#[allow(clippy::too_many_arguments)]
fn push_pieces(
    st: &mut State,
    slot: &Slot,
    fd: i32,
    w: &Window,
    pieces: Vec<Piece>,
    sideband: Vec<u8>,
    flags: u32,
    syscall: bool,
    cuts: Cuts,
) {
    let Some(set) = settings() else { return };
    // Firings of other threads requested before this window opened end before it.
    write_due(st, slot, fd, cuts.armed);
    let n = pieces.len();
    let mut sideband = Some(sideband);
    let mut last_pt = Vec::new();
    let mut last_tsc = w.tsc_start;
    // A buffer handed over mid-window (at an `addr:` mark or full) ends without a
    // syscall: when its last piece ends at the mark, that piece is the window's end.
    let handed = w.nr == super::super::userpt::HANDOVER_NR && w.flags & WF_NO_SYSCALL != 0;
    let mut ended_at_mark = false;
    for (k, p) in pieces.into_iter().enumerate() {
        ended_at_mark = p.mark.is_some();
        if k + 1 == n && p.mark.is_none() {
            last_pt = p.pt;
            last_tsc = p.tsc_start;
            break;
        }
        let Some(t) = st.ring_of(slot) else { return };
        let piece = Window {
            index: t.next_index,
            nr: u64::MAX,
            tsc_start: p.tsc_start,
            tsc_end: p.tsc_end,
            flags: WF_NO_SYSCALL,
            ..Window::default()
        };
        t.next_index += 1;
        let sb = sideband.take().unwrap_or_default();
        t.push(
            Meta {
                w: piece,
                sideband: sb,
            },
            p.pt,
        );
        if let Some(m) = p.mark {
            let what = set.marks.get(m as usize).map_or("addr", String::as_str);
            let ip = crate::emu::trap::MARK_ADDRS
                .get(m as usize)
                .map_or(0, |a| a.load(Relaxed));
            // (The request made at the mark when the buffer was handed over there.)
            let gen = if handed && k + 1 == n { cuts.fired } else { 0 };
            fire(
                st,
                Some((slot, fd)),
                TriggerKind::Addr,
                format!("{what} ({ip:#x})"),
                gen,
            );
        }
        last_tsc = p.tsc_end;
    }
    if handed && ended_at_mark {
        write_due(st, slot, fd, cuts.closed);
        st.cuts.add(cuts.fired);
        return;
    }
    // A buffer handed over for a cut request ends a firing's part only where that firing
    // still waits for it (not one written without it after CUT_WAIT).
    let ends_part = first_pending(st, slot).is_some_and(|(_, g, _)| g <= cuts.closed)
        || (cuts.armed < st.exit_cut && st.exit_cut <= cuts.closed);
    let Some(t) = st.ring_of(slot) else { return };
    let mut last = *w;
    last.index = t.next_index;
    last.flags |= flags;
    if handed && !ends_part {
        last.flags &= !WF_SNAPSHOT_CUT;
    }
    if n > 0 {
        last.tsc_start = last_tsc;
    }
    t.next_index += 1;
    let sb = sideband.take().unwrap_or_default();
    t.push(
        Meta {
            w: last,
            sideband: sb,
        },
        last_pt,
    );
    // Firings of other threads requested while this window was open end with it.
    write_due(st, slot, fd, cuts.closed);
    if syscall {
        fire_syscall_trigger(st, slot, fd, w, cuts.fired);
    }
    // (Whether or not it fired: a window the trigger did not reach, cut short.)
    st.cuts.add(cuts.fired);
}

/// `slot`'s thread ended (`exit`): its ring is written as its own `exit` snapshot when
/// that trigger is on, then dropped. Called before its `End` record.
pub fn thread_end(slot: &Slot, fd: i32, reason: EndReason) {
    let st = state();
    let Some(set) = settings() else { return };
    write_pending(st, slot, fd);
    let sp = slot as *const Slot;
    if set.exit {
        let exit_done = st.ring_of(slot).is_some_and(|t| t.exit_done);
        if !exit_done {
            let tid = slot.tid.load(Relaxed);
            let number = st.next_number();
            let text = if reason == EndReason::ThreadExit {
                note(&format!(
                    "snapshot {number}: trigger exit fired (thread {tid} ended)"
                ));
                "exit (thread exit)".to_string()
            } else {
                note(&format!(
                    "snapshot {number}: trigger exit fired (process end, first in thread {tid})"
                ));
                format!("exit ({})", reason.name())
            };
            if let Some(t) = st.ring_of(slot) {
                write_ring(
                    slot,
                    t,
                    fd,
                    number,
                    TriggerKind::Exit,
                    tid,
                    &text,
                    raw::rdtsc(),
                );
            }
        }
    }
    st.threads.retain(|t| t.slot != sp);
}

/// The process image ends (`reason`, asked by `tid`): every thread's queue is taken into
/// its ring and, with the `exit` trigger, every ring written as one `exit` snapshot.
pub fn process_end(reason: EndReason, tid: i32) {
    let Some(set) = settings() else { return };
    // (Every window is taken now: what a request still on its way would have cut goes
    // into the `exit` snapshot.)
    state().ending = true;
    if set.exit {
        await_running_threads();
    }
    let live = drain_live();
    if !set.exit {
        return;
    }
    // (Taken only now: draining used the state too.)
    let st = state();
    let number = st.next_number();
    note(&format!(
        "snapshot {number}: trigger exit fired (process end, first in thread {tid})"
    ));
    let text = format!("exit ({})", reason.name());
    let mut wrote = 0;
    for s in &live {
        s.lock_drain();
        let fd = s.fd.load(Relaxed);
        if fd >= 0 {
            write_pending(st, s, fd);
            if let Some(t) = st.ring_of(s) {
                if !t.exit_done {
                    write_ring(
                        s,
                        t,
                        fd,
                        number,
                        TriggerKind::Exit,
                        tid,
                        &text,
                        raw::rdtsc(),
                    );
                    t.exit_done = true;
                    wrote += 1;
                }
            }
        }
        s.unlock_drain();
    }
    note(&complete_note(number, wrote));
}

/// Single-step backend, at the process's end: every thread still running stepped code
/// ends its buffer at its next step (a cut request), so that the `exit` snapshot holds
/// its code up to there; waits for them (taking their queues), at most [`CUT_WAIT`].
fn await_running_threads() {
    if settings().is_some_and(|set| set.hardware) || !super::super::userpt::enabled() {
        return;
    }
    let g = crate::emu::trap::request_cut();
    let st = state();
    st.exit_cut = g;
    st.cuts.add(g);
    let start = std::time::Instant::now();
    loop {
        let live = drain_live();
        let running = live.iter().any(|s| {
            super::super::userpt::at_firing(s, g) == super::super::userpt::AtFiring::Running
        });
        if !running || start.elapsed() >= CUT_WAIT {
            return;
        }
        slots::wake_writer();
        raw::nanosleep(1_000_000);
    }
}

/// Takes every queue of this process into its ring (each thread's file opened); returns
/// the threads.
fn drain_live() -> Vec<&'static Slot> {
    let pid = raw::getpid();
    let live: Vec<&Slot> = (0..slots::slot_count())
        .filter_map(slots::slot_at)
        .filter(|s| s.state.load(Acquire) != slots::FREE && s.pid.load(Relaxed) == pid)
        .collect();
    for s in &live {
        s.lock_drain();
        slots::drain_locked(s);
        s.unlock_drain();
    }
    live
}

/// One pass of the writer: `signal:` requests from `pttrace run` and the handler's exit
/// request.
pub fn poll() {
    let Some(set) = settings() else { return };
    if let Some((gen, reason, tid)) = super::request::exit_requested() {
        process_end(reason, tid);
        super::request::exit_done(gen);
    }
    let Some(path) = set.request.as_ref() else {
        return;
    };
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    let seen = REQUEST_SEEN.load(Relaxed);
    if len <= seen {
        return;
    }
    let Ok(data) = std::fs::read(path) else {
        return;
    };
    let Some(new) = data.get(seen as usize..) else {
        return;
    };
    // Whole lines only: a line being appended is taken at the next pass.
    let Some(end) = new.iter().rposition(|b| *b == b'\n') else {
        return;
    };
    REQUEST_SEEN.store(seen + end as u64 + 1, Relaxed);
    for line in new[..end].split(|b| *b == b'\n') {
        let sig = std::str::from_utf8(line)
            .ok()
            .and_then(|l| l.strip_prefix("signal "))
            .and_then(|n| n.trim().parse::<i32>().ok());
        if let Some(s) = sig.filter(|s| set.signals.contains(s)) {
            // Every window queued when the request is taken belongs to it.
            drain_live();
            let t = crate::format::snapshot::Trigger::Signal(s);
            fire(
                state(),
                None,
                TriggerKind::Signal,
                format!("{} (sent to pttrace run)", t.describe()),
                0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_window_closed_after_a_request_waits_until_the_request_has_come() {
        let t0 = Instant::now();
        let mut k = CutsKnown::after(0);
        assert!(k.may_take(0, t0), "no request before it");
        // Request 1 is made as another thread's window is queued; the writer finds a
        // window this one cut before that window: it waits.
        assert!(!k.may_take(1, t0));
        assert!(!k.may_take(1, t0 + ms(499)));
        k.add(1);
        assert!(k.may_take(1, t0 + ms(499)));
        assert_eq!(k.waiting, None);
        // Requests 2 and 3, 3's window taken first: a window closed after 3 waits for 2,
        // one closed before 2 does not.
        k.add(3);
        assert!(!k.may_take(3, t0 + ms(600)));
        assert!(k.may_take(1, t0 + ms(600)));
        k.add(2);
        assert!(k.may_take(3, t0 + ms(601)));
        assert_eq!((k.upto, k.above.as_slice()), (3, &[][..]));
        // Request 4's window never comes (dropped): given up CUT_WAIT after the first
        // wait for it, then request 5 is waited for afresh.
        let t1 = t0 + ms(1000);
        assert!(!k.may_take(5, t1));
        assert!(!k.may_take(5, t1 + CUT_WAIT - ms(1)));
        assert!(!k.may_take(5, t1 + CUT_WAIT));
        assert_eq!((k.upto, k.waiting), (4, Some((5, t1 + CUT_WAIT))));
        k.add(5);
        assert!(k.may_take(5, t1 + CUT_WAIT));
        // Requests already known are not counted again.
        k.add(5);
        k.add(2);
        assert_eq!((k.upto, k.above.as_slice()), (5, &[][..]));
    }

    #[test]
    fn a_forked_child_waits_for_none_of_its_parent_s_requests() {
        let t0 = Instant::now();
        let mut k = CutsKnown::after(7);
        assert!(k.may_take(7, t0));
        assert!(!k.may_take(8, t0));
        k.add(8);
        assert!(k.may_take(8, t0));
    }
}
