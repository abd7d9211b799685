//! A syscall's window, from its start to its queueing for the writer: begin (timestamps,
//! nesting, the spool's in-flight entry), perform an ordinary syscall (with its kernel PT
//! where captured), finish, and queue (numbering, PT, snapshot triggers). Shared by the
//! SIGSYS handler ([`super::handler`]) and the patched syscall sites
//! ([`super::rewrite`]), so that neither imports the other for it.
//!
//! **Async-signal-safe**: runs inside the SIGSYS handler and on patched sites in any
//! context. No allocation, no locks, no std I/O, no panics.

use super::raw::{self, sys6};
use super::slots::{self, Slot, STATIC};
use super::vfork_child;
use crate::format::ptt::{Window, WF_NESTED, WF_NO_RETURN, WF_PT_ABSENT, WF_VFORK_CHILD};
use std::sync::atomic::Ordering::*;

/// A window being recorded.
pub(super) struct Begun<'a> {
    pub(super) slot: Option<&'a Slot>,
    pub(super) record: bool,
    pub(super) w: Window,
    pub(super) t0: u64,
    pub(super) vfork_child: bool,
}

/// Enters the handler's nesting level for the calling thread and starts a window.
pub(super) fn begin(st: &slots::Static, nr: u64, args: [u64; 6]) -> Begun<'static> {
    let slot = slots::current();
    // The child of a vfork-style clone runs on its parent's thread-local slot.
    let vfork_child = slot.is_some_and(|s| s.vfork_child.load(Acquire));
    let record = st.filter.records(nr);
    let depth = slot.map_or(0, |s| s.depth.fetch_add(1, Relaxed));
    let mut w = Window {
        index: 0,
        nr,
        args,
        ret: 0,
        tsc_start: 0,
        tsc_end: 0,
        flags: WF_PT_ABSENT
            | if depth > 0 { WF_NESTED } else { 0 }
            | if vfork_child { WF_VFORK_CHILD } else { 0 },
        depth,
    };
    if let Some(s) = slot {
        if st.window == super::config::WindowKind::Thread {
            w.tsc_start = s.last_exit_tsc.load(Relaxed);
        }
    }
    let t0 = raw::rdtsc();
    if w.tsc_start == 0 {
        w.tsc_start = t0;
    }
    if let Some(s) = slot {
        if record && !vfork_child {
            // Until its window is queued, the syscall is in flight in the spool: a kill
            // before then is recorded, not lost (see `super::spool`).
            super::spool::enter(s.spool.load(Relaxed), depth, t0, nr, &args);
        }
    }
    Begun {
        slot,
        record,
        w,
        t0,
        vfork_child,
    }
}

/// An ordinary syscall (no special handling), performed and recorded. Used by the SIGSYS
/// handler's ordinary case and by patched syscall sites (normal context, see
/// [`super::rewrite`]).
pub fn general(nr: u64, args: [u64; 6]) -> i64 {
    let Some(st) = STATIC.get() else {
        return sys6(nr, args);
    };
    if slots::untraced() {
        return sys6(nr, args);
    }
    if slots::SPAWNING_WRITER.load(Acquire) && !slots::has_current() {
        // The writer thread being started by a forked child, before it could mark itself.
        slots::set_untraced();
        return sys6(nr, args);
    }
    let mut b = begin(st, nr, args);
    let r = ordinary_syscall(b.slot, b.record, &mut b.w, nr, args);
    finish(b.slot, b.record, b.w, r, b.t0);
    r
}

/// Performs an ordinary syscall of window `w`, with its hardware PT when the shim captures
/// some (kernel modes on a PT machine; see `super::kernelpt`).
pub(super) fn ordinary_syscall(
    slot: Option<&Slot>,
    record: bool,
    w: &mut Window,
    nr: u64,
    args: [u64; 6],
) -> i64 {
    let armed = slot.is_some_and(|s| super::kernelpt::enter(s, record, w.depth));
    let r = sys6(nr, args);
    if let Some(s) = slot {
        super::kernelpt::leave(s, armed, w);
    }
    r
}

/// Records a completed window and leaves the handler's nesting level.
pub(super) fn finish(slot: Option<&Slot>, record: bool, mut w: Window, ret: i64, _t0: u64) {
    let Some(s) = slot else { return };
    let t1 = raw::rdtsc();
    w.ret = ret;
    w.tsc_end = t1;
    if let Some(st) = STATIC.get() {
        if st.window == super::config::WindowKind::Thread {
            // A thread window ends where the syscall begins.
            w.tsc_end = _t0;
        }
    }
    if record {
        push_window(s, &mut w);
    }
    s.last_exit_tsc.store(t1, Relaxed);
    s.depth.fetch_sub(1, Relaxed);
}

/// The window of a syscall that does not return (`exit`, `exit_group`), recorded before
/// the call: it ends where the syscall begins.
pub(super) fn push_final_window(slot: &Slot, record: bool, w: &mut Window, t0: u64) {
    w.flags |= WF_NO_RETURN;
    w.tsc_end = t0;
    if record {
        push_window(slot, w);
    }
}

/// Numbers a completed window, attaches its PT (user modes) and queues it for the writer.
/// Async-signal-safe: an atomic increment and lock-free queue operations.
pub(super) fn push_window(slot: &Slot, w: &mut Window) {
    if vfork_child::active(slot) {
        // A vfork-style child: its own files, written here (see `super::vfork_child`).
        vfork_child::record(slot, w);
        return;
    }
    w.index = slots::next_index(slot);
    let fired = super::snapshot::handler_side::fire_if_trigger(slot, w.nr, w.depth);
    super::userpt::attach(slot, w, fired);
    super::kernelpt::publish(slot, w.index);
    if !slots::push(slot, w) {
        // Dropped: the writer never asks for its PT.
        super::userpt::forget(slot, w.index);
    }
    super::spool::leave(slot.spool.load(Relaxed), w.depth);
}
