//! The execution callback's fast path: where each vCPU writes its next log word.
//!
//! QEMU calls the execution callback at every translated block the guest runs (hundreds of
//! millions a second of guest time), so what it does per block is most of what tracing
//! costs the vCPU. Here it is a bounds check, two loads, a compare, a store and an
//! increment: each vCPU has a [`Cursor`] (its own cache line) into the log chunk its
//! [`crate::feeder::Feeder`] owns, and a block's word goes straight there. Everything else
//! (a full chunk, a vCPU's first block, a snapshot firing to take) makes the cursor's limit
//! refuse the write, and the callback takes the slow path through the feeder.
//!
//! The cursor belongs to the vCPU's thread, like its feeder: only that thread writes
//! through it or moves it ([`crate::feeder::Feeder`] takes the words written into its
//! chunk before it touches the chunk, and hands the cursor back after), except that
//! [`refuse_all`] may drop any cursor's limit from another thread (a snapshot firing
//! published: every vCPU takes the slow path at its next block), and the atexit callback
//! and a fork's child reset cursors while no other vCPU runs.

use std::sync::atomic::{AtomicPtr, Ordering};

use crate::MAX_VCPUS;

/// One vCPU's write position: words go to `next` while it is below `limit`. Null limits
/// (the initial state) refuse every write.
#[repr(align(64))]
pub struct Cursor {
    next: AtomicPtr<u64>,
    limit: AtomicPtr<u64>,
}

#[allow(clippy::declare_interior_mutable_const)]
const IDLE: Cursor = Cursor {
    next: AtomicPtr::new(std::ptr::null_mut()),
    limit: AtomicPtr::new(std::ptr::null_mut()),
};

static CURSORS: [Cursor; MAX_VCPUS] = [IDLE; MAX_VCPUS];

/// Writes `word` at `vcpu`'s cursor; false when the cursor refuses it (take the slow path).
#[inline(always)]
pub fn write(vcpu: usize, word: u64) -> bool {
    let Some(c) = CURSORS.get(vcpu) else {
        return false;
    };
    let next = c.next.load(Ordering::Relaxed);
    if next >= c.limit.load(Ordering::Relaxed) {
        return false;
    }
    // SAFETY: `next` is below `limit`, and the feeder of this vCPU (this thread's) set both
    // inside the spare capacity of the chunk it owns ([`hand_back`]) and has not touched the
    // chunk since; nothing else writes there.
    // (A plain store. A non-temporal one, meant to spare the worker fetching the line
    // from this core's cache, stalled the vCPU: `perf` put half of this function's samples
    // on the instruction after it, and the python loop ran 2.96 s against 2.80 s with the
    // plain store, medians of 12 rounds each, the vCPU being what the run waits for.)
    unsafe { next.write(word) };
    c.next.store(next.wrapping_add(1), Ordering::Relaxed);
    true
}

/// Words written through `vcpu`'s cursor into a chunk whose words start at `base` and that
/// holds `len` words: the chunk's length now (at most `capacity`). A cursor that points
/// elsewhere (reset, or never handed this chunk) adds nothing.
pub fn taken(vcpu: usize, base: *const u64, len: usize, capacity: usize) -> usize {
    let Some(c) = CURSORS.get(vcpu) else {
        return len;
    };
    let next = c.next.load(Ordering::Relaxed) as usize;
    let words = next.wrapping_sub(base as usize) / 8;
    if next < base as usize || words > capacity || words < len {
        return len;
    }
    words
}

/// Hands `vcpu`'s cursor the chunk whose words start at `base`: it writes from word `len`
/// up to word `end`. A firing published meanwhile (`pending`, asked after the limit is
/// set) leaves the limit at null.
pub fn hand_back(vcpu: usize, base: *mut u64, len: usize, end: usize, pending: impl Fn() -> bool) {
    let Some(c) = CURSORS.get(vcpu) else {
        return;
    };
    c.next.store(base.wrapping_add(len), Ordering::Relaxed);
    c.limit
        .store(base.wrapping_add(end.max(len)), Ordering::SeqCst);
    // (A publisher stores its number before it drops the limits: either this sees the
    // number, or the publisher's drop comes after the store above.)
    if pending() {
        c.limit.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

/// `vcpu`'s cursor refuses every write (its feeder has the chunk, is gone, or starts
/// afresh). (On the vCPU's own thread, or with it stopped: no ordering needed.)
pub fn reset(vcpu: usize) {
    if let Some(c) = CURSORS.get(vcpu) {
        c.limit.store(std::ptr::null_mut(), Ordering::Relaxed);
        c.next.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}

/// Every vCPU takes the slow path at its next block (a snapshot firing was published).
pub fn refuse_all() {
    for c in CURSORS.iter() {
        c.limit.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words go to the chunk up to the limit and are counted back into it; an idle, reset
    /// or refused cursor (a firing pending when it was handed back, or published after)
    /// takes none.
    #[test]
    fn a_cursor_writes_up_to_its_limit_and_refuses_otherwise() {
        // (The last cursor: no other test uses it.)
        let vcpu = MAX_VCPUS - 1;
        assert!(!write(MAX_VCPUS, 1), "no such vCPU");
        let mut chunk: Vec<u64> = Vec::with_capacity(8);
        chunk.push(7);
        assert!(!write(vcpu, 1), "an idle cursor refuses");
        hand_back(vcpu, chunk.as_mut_ptr(), chunk.len(), 4, || false);
        assert!(write(vcpu, 10) && write(vcpu, 11) && write(vcpu, 12));
        assert!(!write(vcpu, 13), "the limit");
        let len = taken(vcpu, chunk.as_ptr(), chunk.len(), chunk.capacity());
        assert_eq!(len, 4);
        // SAFETY: the cursor wrote words 1 to 3, within the capacity.
        unsafe { chunk.set_len(len) };
        assert_eq!(chunk, [7, 10, 11, 12]);

        hand_back(vcpu, chunk.as_mut_ptr(), chunk.len(), 8, || true);
        assert!(!write(vcpu, 20), "a firing is pending");
        hand_back(vcpu, chunk.as_mut_ptr(), chunk.len(), 8, || false);
        assert!(write(vcpu, 20));
        refuse_all();
        assert!(!write(vcpu, 21), "a firing was published");
        assert_eq!(
            taken(vcpu, chunk.as_ptr(), chunk.len(), chunk.capacity()),
            5
        );
        reset(vcpu);
        assert!(!write(vcpu, 22));
        assert_eq!(
            taken(vcpu, chunk.as_ptr(), chunk.len(), chunk.capacity()),
            4,
            "a reset cursor counts nothing"
        );
    }
}
