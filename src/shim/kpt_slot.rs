//! One thread's kernel-mode PT state in its slot ([`super::slots::Slot::kpt`]): the data
//! only, so that the per-thread state below everything needs nothing of
//! [`super::kernelpt`], which opens, reads and closes it. **Async-signal-safe**: atomics.

use super::raw;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};

/// Windows whose PT may wait for the drainer, per thread.
pub const PENDING: usize = 256;

/// fd state: nothing open.
pub(super) const FD_NONE: i32 = -1;

/// One thread's event and its windows waiting for the drainer (in the slot, valid after
/// [`KptSlot::reset`]; all-zero is "nothing open" too once `fd` is set to -1).
pub struct KptSlot {
    pub(super) fd: AtomicI32,
    /// Base of the control page + DATA ring mapping; base of the AUX mapping.
    pub(super) ctl: AtomicU64,
    pub(super) aux: AtomicU64,
    /// Ends of the last window (set by `leave`, pushed by `publish`).
    pub(super) pending_aux: AtomicU64,
    pub(super) pending_data: AtomicU64,
    pub(super) has_pending: AtomicBool,
    /// Ring of (index, aux end, data end): producer `head`, consumer `tail`.
    pub(super) ring: [[AtomicU64; 3]; PENDING],
    pub(super) head: AtomicU64,
    pub(super) tail: AtomicU64,
}

impl KptSlot {
    /// Nothing open, nothing pending (a new owner thread, or a forked child whose parent's
    /// mappings did not come along: the descriptor copy is closed).
    pub fn reset(&self, close_fd: bool) {
        let fd = self.fd.swap(FD_NONE, Relaxed);
        if close_fd && fd >= 0 {
            raw::close(fd);
        }
        self.ctl.store(0, Relaxed);
        self.aux.store(0, Relaxed);
        self.has_pending.store(false, Relaxed);
        self.head.store(0, Relaxed);
        self.tail.store(0, Relaxed);
    }
}
