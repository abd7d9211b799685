//! The SIGSYS handler's side of snapshot mode ([`super::ring`] is the writer's).
//! **Async-signal-safe module**: atomics, the futex wake of the writer and `nanosleep`
//! through the shim's raw syscalls; no allocation, no locks, no std I/O.

use super::super::raw;
use super::super::slots;
use crate::format::ptt::EndReason;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::*};

/// Snapshot mode is on in this process image (windows go into rings, not files).
use super::super::process::SNAPSHOT_ON as ON;
/// The `exit` trigger is on.
static EXIT: AtomicBool = AtomicBool::new(false);
/// Exit requests asked and answered (generations), the reason and the asking thread.
static ASKED: AtomicU64 = AtomicU64::new(0);
static ANSWERED: AtomicU64 = AtomicU64::new(0);
static REASON: AtomicU32 = AtomicU32::new(0);
static TID: AtomicI32 = AtomicI32::new(0);

/// Longest wait for the writer to write the rings at an exit.
const WAIT_MS: u64 = 10_000;

/// Turns snapshot mode on (start-up, normal context).
pub fn turn_on(exit: bool) {
    EXIT.store(exit, Relaxed);
    ON.store(true, Release);
}

/// Whether snapshot mode is on.
pub fn on() -> bool {
    ON.load(Relaxed)
}

/// The process image ends (`exit_group`, `execve`, a fatal signal) on the calling
/// application thread: asks the writer to take every queue into its ring and write the
/// rings as the `exit` snapshot, and waits for it (bounded). Windows drained by the
/// caller afterwards are not written (they belong to no snapshot).
pub fn flush_for_exit(reason: EndReason) {
    if !on() || !EXIT.load(Relaxed) || slots::untraced() || !slots::WRITER_ALIVE.load(Acquire) {
        return;
    }
    REASON.store(reason as u32, Relaxed);
    TID.store(raw::gettid(), Relaxed);
    let gen = ASKED.fetch_add(1, AcqRel) + 1;
    for _ in 0..WAIT_MS {
        slots::wake_writer();
        if ANSWERED.load(Acquire) >= gen {
            return;
        }
        raw::nanosleep(1_000_000);
    }
}

/// For the writer: an exit request not answered yet (generation, reason, thread).
pub fn exit_requested() -> Option<(u64, EndReason, i32)> {
    let gen = ASKED.load(Acquire);
    if gen <= ANSWERED.load(Acquire) {
        return None;
    }
    let reason = EndReason::from_raw(REASON.load(Relaxed)).unwrap_or(EndReason::ExitGroup);
    Some((gen, reason, TID.load(Relaxed)))
}

/// For the writer: the request `gen` is answered.
pub fn exit_done(gen: u64) {
    ANSWERED.fetch_max(gen, AcqRel);
}

/// The syscalls of `syscall:` triggers (0 is `read`, so unused cells hold `u64::MAX`).
static FIRE_AT: [AtomicU64; MAX_SYSCALL_TRIGGERS] =
    [const { AtomicU64::new(u64::MAX) }; MAX_SYSCALL_TRIGGERS];
/// Most `syscall:` triggers the handler acts on at the syscall.
pub const MAX_SYSCALL_TRIGGERS: usize = 16;

/// Start-up (normal context): the syscalls of `syscall:` triggers, which the handler
/// acts on as they return ([`fire_if_trigger`]). Returns false when there are more than
/// [`MAX_SYSCALL_TRIGGERS`].
pub fn fire_at(nrs: &[u64]) -> bool {
    for (cell, nr) in FIRE_AT.iter().zip(nrs) {
        cell.store(*nr, Relaxed);
    }
    nrs.len() <= MAX_SYSCALL_TRIGGERS
}

/// In the handler, as a window of `slot` is queued: a depth-0 window of a trigger
/// syscall ends the snapshot right there, before the thread runs on.
/// - Hardware backend: the thread's event is disabled (the writer writes the snapshot
///   and enables it again).
/// - Single-step backend: every other stepped thread is asked to end its buffer at its
///   next step ([`crate::emu::trap::request_cut`]); returns the request, which the
///   window carries to the writer (0: not a trigger).
pub fn fire_if_trigger(slot: &slots::Slot, nr: u64, depth: u32) -> u64 {
    if !on() || depth != 0 || !FIRE_AT.iter().any(|c| c.load(Relaxed) == nr) {
        return 0;
    }
    let fd = slot.snap_fd.load(Acquire);
    if fd >= 0 {
        raw::sys3(
            libc::SYS_ioctl,
            fd as u64,
            u64::from(perf_event_open_sys::bindings::DISABLE),
            0,
        );
        return 0;
    }
    if super::super::process::USER_PT_ON.load(Relaxed) {
        crate::emu::trap::request_cut()
    } else {
        0
    }
}

/// Hardware snapshot mode: new threads wait at their start until the writer opened their
/// event ([`await_thread_event`]).
static WAIT_NEW_THREADS: AtomicBool = AtomicBool::new(false);
/// Longest wait of a new thread for its event.
const NEW_THREAD_WAIT_US: u64 = 1_000_000;

/// Start-up (normal context): new threads trap once at their start (the clone stub's
/// child-start trap, as for stepping) and wait there for their hardware snapshot event,
/// so that they are traced from their first instruction.
pub fn trace_new_threads_from_start() {
    WAIT_NEW_THREADS.store(true, Release);
    raw::step_new_threads();
}

/// In the handler, at a new thread's start trap: claims its slot and waits (bounded)
/// until the writer has opened its event or given up on it (`snap_fd` no longer -1).
pub fn await_thread_event() {
    if !WAIT_NEW_THREADS.load(Acquire) || slots::untraced() || !slots::WRITER_ALIVE.load(Acquire) {
        return;
    }
    let Some(slot) = slots::current() else {
        return;
    };
    let mut waited = 0;
    while slot.snap_fd.load(Acquire) == -1 && waited < NEW_THREAD_WAIT_US {
        slots::wake_writer();
        raw::nanosleep(100_000);
        waited += 100;
    }
}
