//! The background writer thread (normal context; created before Syscall User Dispatch is
//! armed, so its own syscalls are never intercepted).
//!
//! It sleeps on a futex word for at most [`POLL_NS`] or until a producer wakes it (queue half
//! full, thread exit), drains every slot into its files and, once no application thread is
//! left (the last one left with `exit` rather than `exit_group`), writes the end records and
//! ends the process with the leader's exit code — otherwise the process would live on as
//! just this thread.
//!
//! crossbeam-channel is deliberately not used between the signal handler and this thread:
//! its `send` may park through thread-locals and a spinlock-protected waker, which is not
//! async-signal-safe. The per-thread queues in [`super::slots`] are lock-free instead.

use super::output;
use super::raw;
use super::slots::{self, FREE};
use crate::format::ptt::EndReason;
use std::sync::atomic::Ordering::*;

/// Longest time a completed window waits in memory before the writer looks at it.
pub const POLL_NS: u64 = 10_000_000;

/// Starts the writer thread and waits until it has marked itself as the shim's own (so no
/// syscall of it is ever recorded, even at patched sites); false when it cannot be created.
/// While it starts, no other thread may be created by the caller's process (true at
/// start-up and in a freshly forked child).
pub fn spawn() -> bool {
    slots::SPAWNING_WRITER.store(true, Release);
    let r = std::thread::Builder::new()
        .name("pttracer-writer".into())
        .spawn(run);
    match r {
        Ok(_) => {
            slots::WRITER_ALIVE.store(true, Release);
            while slots::SPAWNING_WRITER.load(Acquire) {
                std::thread::yield_now();
            }
            true
        }
        Err(e) => {
            slots::SPAWNING_WRITER.store(false, Release);
            eprintln!(
                "drpttracer shim: cannot start the writer thread ({e}); windows are written \
                 by the traced threads themselves when their queues fill and at exit"
            );
            false
        }
    }
}

fn block_signals() {
    // SAFETY: a zeroed sigset_t is valid input for sigfillset, which initializes it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t; pthread_sigmask only reads it.
    unsafe {
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

fn run() {
    slots::set_untraced();
    slots::SPAWNING_WRITER.store(false, Release);
    block_signals();
    loop {
        let seen = slots::WAKE.load(Acquire);
        // Snapshot mode: requests from `pttrace run` and the handler's exit request.
        super::snapshot::writer_side::poll();
        // Threads are ended (their End record, a snapshot's `exit` trigger) only where their
        // end was seen before this pass drained every queue: whatever another thread queued
        // before that end (a `syscall:` trigger's window, whose syscall made the thread
        // end) goes through first, so snapshots are numbered in the order things happened.
        let count = slots::slot_count();
        let mut ended = [0u64; slots::MAX_SLOTS / 64];
        for i in 0..count {
            let Some(s) = slots::slot_at(i) else { continue };
            if s.state.load(Acquire) != FREE && s.end_reason.load(Acquire) != u32::MAX {
                if let Some(w) = ended.get_mut(i / 64) {
                    *w |= 1 << (i % 64);
                }
            }
        }
        for may_end in [false, true] {
            for i in 0..count {
                let Some(s) = slots::slot_at(i) else { continue };
                let seen_ended = ended.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0);
                if s.state.load(Acquire) == FREE || (may_end && !seen_ended) {
                    continue;
                }
                if s.try_lock_drain() {
                    output::drain_locked_with(s, may_end);
                    s.unlock_drain();
                }
            }
        }
        if slots::ACTIVE_FLAG.load(Acquire) && slots::LIVE.load(Acquire) <= 0 {
            let code = slots::LEADER_CODE.load(Acquire);
            output::drain_all(Some((EndReason::LastThread, code)));
            raw::sys1(libc::SYS_exit_group, code as u32 as u64);
        }
        raw::futex_wait(&slots::WAKE, seen, POLL_NS);
    }
}
