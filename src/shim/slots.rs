//! Per-thread state ("slots") and process-wide shim state. **Async-signal-safe**: every
//! function here may run in the SIGSYS handler (no allocation, no locks that a signal could
//! find held by its own thread, no std I/O, no panics). Slot memory comes from `mmap`
//! through the shim's syscall stub.
//!
//! Each traced thread owns one [`Slot`]: a bounded multi-producer queue of completed
//! windows (Vyukov's sequence-numbered ring: a signal handler nested inside the thread's own
//! handler is a second producer, so pushes must be reentrant), counters, and the file
//! descriptors of its output files. The writer thread (or, at exit/exec, the exiting
//! thread) drains slots; a per-slot try-lock (`drain_lock`) keeps one drainer at a time.
//!
//! Backpressure: with `block` (default) a producer whose queue is full wakes the writer and
//! waits (sleeping 50 µs at a time) until there is room — no window is lost; when no
//! writer exists (a forked child whose fork bypassed glibc) the producer drains its own
//! slot. With `drop` the window is counted in `dropped` and the writer writes a `Dropped`
//! record with the count, so a drop is never silent.

use super::config::{Backpressure, ShimConfig};
use super::raw;
use crate::format::ptt::Window;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Most threads traced at the same time in one process.
pub const MAX_SLOTS: usize = 4096;
/// Per-slot encoding scratch for the drainer.
pub const SCRATCH: usize = 16 * 1024;

pub const FREE: u32 = 0;
pub const ACTIVE: u32 = 1;
/// The thread is gone; the slot is freed once drained.
pub const EXITED: u32 = 2;

pub use super::process::*;

static SLOTS: [AtomicPtr<Slot>; MAX_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SLOTS];
/// Slots ever allocated (indices below this may be non-null).
pub static SLOT_COUNT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The calling thread's slot (const-initialized, no destructor: plain TLS access).
    static CURRENT: Cell<*mut Slot> = const { Cell::new(std::ptr::null_mut()) };
    /// Set on the shim's own writer thread: its syscalls are never recorded.
    static UNTRACED: Cell<bool> = const { Cell::new(false) };
}

/// Set while a forked child starts its writer thread: the only thread without a slot that
/// can appear then is that writer (the child has exactly one application thread).
pub static SPAWNING_WRITER: AtomicBool = AtomicBool::new(false);

/// Whether the calling thread has claimed a slot.
pub fn has_current() -> bool {
    !CURRENT.with(|c| c.get()).is_null()
}

/// Marks the calling thread as the shim's own (never recorded).
pub fn set_untraced() {
    UNTRACED.with(|c| c.set(true));
}

/// Whether the calling thread is the shim's own.
pub fn untraced() -> bool {
    UNTRACED.with(|c| c.get())
}

/// One queue entry.
#[repr(C)]
pub struct Entry {
    pub seq: AtomicU64,
    pub w: UnsafeCell<Window>,
    /// `spool::window_check(w)`: a reader of a spool tells a damaged entry.
    pub check: UnsafeCell<u64>,
}

/// A window begun by a reissued clone, finished when the parent's notify trap arrives.
#[derive(Clone, Copy, Default)]
pub struct PendingClone {
    pub w: Window,
    pub record: bool,
    pub counted_thread: bool,
}

/// Per-thread state, at the start of its own mapping (followed by scratch and entries).
#[repr(C)]
pub struct Slot {
    pub state: AtomicU32,
    pub tid: AtomicI32,
    pub pid: AtomicI32,
    pub nonce: AtomicU64,
    pub depth: AtomicU32,
    pub drain_lock: AtomicU32,
    pub next_index: AtomicU64,
    pub enq: AtomicU64,
    pub deq: AtomicU64,
    pub dropped_written: AtomicU64,
    pub written: AtomicU64,
    pub fd: AtomicI32,
    pub kfd: AtomicI32,
    /// `EndReason` to write once drained (`u32::MAX`: none yet).
    pub end_reason: AtomicU32,
    pub end_written: AtomicBool,
    /// TSC when the thread last returned from a syscall (thread windows).
    pub last_exit_tsc: AtomicU64,
    /// A vfork-style child (shared memory, no new thread) is running on this slot.
    pub vfork_child: AtomicBool,
    pub pending_clone: UnsafeCell<PendingClone>,
    /// Files of the vfork-style child running on this slot (valid when zeroed).
    pub child: UnsafeCell<super::child_files::ChildFiles>,
    /// Buffers of that child's files (valid when zeroed).
    pub child_buf: UnsafeCell<super::child_files::ChildBuf>,
    /// Hardware PT of this thread's kernel-mode windows (see `super::kernelpt`).
    pub kpt: super::kpt_slot::KptSlot,
    /// Hardware snapshot mode: the descriptor of this thread's overwrite-mode event,
    /// opened and closed by the writer (see `super::snapshot::hw`); -1 when none.
    pub snap_fd: AtomicI32,
    /// Copy of the application's `clone_args` for a reissued clone3.
    pub clone_args: UnsafeCell<[u64; 16]>,
    pub cap: usize,
    pub map_len: usize,
    pub scratch: *mut u8,
    /// The queue entries, inside the spool mapping (see [`super::spool`]).
    pub entries: AtomicPtr<Entry>,
    /// The spool mapping of the slot's current thread and its length.
    pub spool: AtomicPtr<u8>,
    pub spool_len: AtomicUsize,
}

// SAFETY: a slot is shared between its thread (producer) and drainers; every shared
// field is atomic, the entries are published through their sequence numbers, and the
// UnsafeCell fields are only touched by the owning thread.
unsafe impl Sync for Slot {}

impl Slot {
    /// The entry of queue position `pos`; `None` while the slot has no spool (a forked
    /// child that could not make one).
    fn entry(&self, pos: u64) -> Option<&Entry> {
        let i = (pos as usize) & (self.cap - 1);
        let base = self.entries.load(Acquire);
        // SAFETY: a non-null `entries` points to `cap` initialized entries inside this
        // slot's spool mapping, and i < cap.
        unsafe { base.as_ref().map(|_| &*base.add(i)) }
    }

    /// The current spool mapping.
    pub fn spool_map(&self) -> super::spool::Mapping {
        super::spool::Mapping {
            base: self.spool.load(Acquire),
            len: self.spool_len.load(Acquire),
        }
    }

    /// Windows dropped under backpressure (kept in the spool, so a kill cannot hide them).
    pub fn dropped(&self) -> &AtomicU64 {
        super::spool::dropped(self.spool.load(Acquire))
    }

    /// Gives the slot a new spool for thread `tid` of image (`pid`, `nonce`), unmapping the
    /// previous one (whose file is left alone: it is complete, or it is a forked parent's).
    /// The caller owns the slot (claiming it, or the only thread of a forked child).
    pub fn attach_spool(&self, tid: i32, pid: i32, nonce: u64) -> bool {
        let old = self.spool_map();
        self.spool.store(std::ptr::null_mut(), Release);
        self.entries.store(std::ptr::null_mut(), Release);
        super::spool::unmap(old);
        let Some(m) = super::spool::create(pid, nonce, tid, self.cap) else {
            return false;
        };
        self.spool_len.store(m.len, Release);
        self.entries
            .store(super::spool::entries(m) as *mut Entry, Release);
        self.spool.store(m.base, Release);
        true
    }

    /// Forgets the spool without touching it (a forked child: the mapping is shared with
    /// the parent, whose thread it belongs to).
    pub fn forget_spool(&self) {
        let old = self.spool_map();
        self.spool.store(std::ptr::null_mut(), Release);
        self.entries.store(std::ptr::null_mut(), Release);
        super::spool::unmap(old);
    }

    /// Resets the queue and counters for a new owner thread (its spool attached).
    pub fn reset(&self, tid: i32, pid: i32, nonce: u64) {
        for i in 0..self.cap {
            if let Some(e) = self.entry(i as u64) {
                e.seq.store(i as u64, Relaxed);
            }
        }
        self.enq.store(0, Relaxed);
        self.deq.store(0, Relaxed);
        self.dropped_written.store(0, Relaxed);
        self.written.store(0, Relaxed);
        self.next_index.store(0, Relaxed);
        self.fd.store(-1, Relaxed);
        self.kfd.store(-1, Relaxed);
        self.snap_fd.store(-1, Relaxed);
        self.end_reason.store(u32::MAX, Relaxed);
        self.end_written.store(false, Relaxed);
        self.vfork_child.store(false, Relaxed);
        self.kpt.reset(true);
        // A recycled slot: its previous thread left through `exit` inside the handler.
        self.depth.store(0, Relaxed);
        self.last_exit_tsc.store(raw::rdtsc(), Relaxed);
        self.tid.store(tid, Relaxed);
        self.pid.store(pid, Relaxed);
        self.nonce.store(nonce, Release);
        if let Some(st) = STATIC.get() {
            let id = super::spool::Identity {
                pid,
                tid,
                nonce,
                start_tsc: START_TSC.load(Relaxed),
                cap: self.cap,
                kind: [
                    st.mode,
                    st.window.code(),
                    st.backend,
                    u8::from(st.pt_present),
                ],
            };
            super::spool::publish_header(self.spool.load(Acquire), &id);
        }
    }

    /// Windows queued and not yet drained.
    pub fn queued(&self) -> u64 {
        self.enq.load(Acquire).wrapping_sub(self.deq.load(Acquire))
    }

    /// Enqueues `w`; false when the queue is full. Reentrant (lock-free, multi-producer).
    pub fn try_push(&self, w: &Window) -> bool {
        let mut pos = self.enq.load(Relaxed);
        loop {
            let Some(e) = self.entry(pos) else {
                return false;
            };
            let seq = e.seq.load(Acquire);
            let dif = seq.wrapping_sub(pos) as i64;
            if dif == 0 {
                match self
                    .enq
                    .compare_exchange_weak(pos, pos.wrapping_add(1), Relaxed, Relaxed)
                {
                    Ok(_) => {
                        // SAFETY: the CAS gave this producer exclusive use of the entry until
                        // it publishes it with the seq store below.
                        unsafe {
                            *e.w.get() = *w;
                            *e.check.get() = crate::format::spool::window_check(w);
                        }
                        e.seq.store(pos.wrapping_add(1), Release);
                        return true;
                    }
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = self.enq.load(Relaxed);
            }
        }
    }

    /// The window `k` places after the queue's head, if published (drainer only, under
    /// `drain_lock`). It stays in the queue, and in the spool, until [`Slot::release`].
    pub fn peek(&self, k: u64) -> Option<Window> {
        let pos = self.deq.load(Relaxed).wrapping_add(k);
        if k >= self.cap as u64 {
            return None;
        }
        let e = self.entry(pos)?;
        if e.seq.load(Acquire) != pos.wrapping_add(1) {
            return None;
        }
        // SAFETY: seq == pos+1 means a producer published this entry and no producer will
        // touch it until the drainer releases it (seq = pos+cap).
        Some(unsafe { *e.w.get() })
    }

    /// Releases the first `n` queued windows, which are in the thread's file now (drainer
    /// only, under `drain_lock`).
    pub fn release(&self, n: u64) {
        let deq = self.deq.load(Relaxed);
        for k in 0..n {
            let pos = deq.wrapping_add(k);
            if let Some(e) = self.entry(pos) {
                e.seq.store(pos.wrapping_add(self.cap as u64), Release);
            }
        }
        self.deq.store(deq.wrapping_add(n), Release);
    }

    /// Takes the drain lock, spinning (with sched_yield) while another drainer holds it.
    pub fn lock_drain(&self) {
        let mut spins = 0u32;
        while self
            .drain_lock
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_err()
        {
            spins = spins.wrapping_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                raw::sched_yield();
            }
        }
    }
    pub fn try_lock_drain(&self) -> bool {
        self.drain_lock
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_ok()
    }
    pub fn unlock_drain(&self) {
        self.drain_lock.store(0, Release);
    }

    /// Scratch buffer for encoding (only under `drain_lock`).
    ///
    /// # Safety
    /// The caller holds this slot's drain lock, so no one else uses the scratch.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn scratch(&self) -> &mut [u8] {
        // SAFETY: scratch points to SCRATCH bytes in this slot's mapping; exclusivity is
        // the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.scratch, SCRATCH) }
    }
}

const _: () = assert!(std::mem::size_of::<Entry>() == crate::format::spool::ENTRY_SIZE);

fn layout() -> (usize, usize) {
    let header = std::mem::size_of::<Slot>().next_multiple_of(64);
    let total = header + SCRATCH;
    (header, total.next_multiple_of(4096))
}

/// Allocates a fresh slot mapping (the queue entries live in the spool, attached later).
fn alloc_slot(cap: usize) -> Option<*mut Slot> {
    let (header, total) = layout();
    let base = raw::mmap_anon(total)?;
    let slot = base as *mut Slot;
    // SAFETY: base is a fresh zeroed mapping of `total` bytes, large enough for the header
    // and scratch; Slot is valid when zeroed except for the fields written here.
    unsafe {
        std::ptr::addr_of_mut!((*slot).cap).write(cap);
        std::ptr::addr_of_mut!((*slot).map_len).write(total);
        std::ptr::addr_of_mut!((*slot).scratch).write(base.add(header));
        std::ptr::addr_of_mut!((*slot).fd).write(AtomicI32::new(-1));
        std::ptr::addr_of_mut!((*slot).kfd).write(AtomicI32::new(-1));
        std::ptr::addr_of_mut!((*slot).snap_fd).write(AtomicI32::new(-1));
        (*slot).kpt.reset(false);
    }
    Some(slot)
}

/// The slot at index `i`, if allocated.
pub fn slot_at(i: usize) -> Option<&'static Slot> {
    let p = SLOTS.get(i)?.load(Acquire);
    // SAFETY: slot mappings are never unmapped while the process lives.
    unsafe { p.as_ref() }
}

/// Claims a slot for the calling thread (`tid`), reusing a free one when possible.
pub fn claim(tid: i32, pid: i32, nonce: u64) -> Option<&'static Slot> {
    let cap = STATIC.get()?.queue_cap;
    let count = SLOT_COUNT.load(Acquire).min(MAX_SLOTS);
    for i in 0..count {
        if let Some(s) = slot_at(i) {
            if s.state.load(Relaxed) == FREE
                && s.state
                    .compare_exchange(FREE, ACTIVE, AcqRel, Relaxed)
                    .is_ok()
            {
                // A drainer that saw ACTIVE waits for the lock; the queue is new then.
                s.lock_drain();
                let ok = s.attach_spool(tid, pid, nonce);
                if ok {
                    s.reset(tid, pid, nonce);
                }
                s.unlock_drain();
                if !ok {
                    s.state.store(FREE, Release);
                    return None;
                }
                return Some(s);
            }
        }
    }
    loop {
        let i = SLOT_COUNT.load(Acquire);
        if i >= MAX_SLOTS {
            return None;
        }
        if SLOT_COUNT
            .compare_exchange(i, i + 1, AcqRel, Relaxed)
            .is_err()
        {
            continue;
        }
        let p = alloc_slot(cap)?;
        // SAFETY: p is a fresh slot mapping owned by this thread until published.
        let s = unsafe { &*p };
        if !s.attach_spool(tid, pid, nonce) {
            return None;
        }
        s.reset(tid, pid, nonce);
        s.state.store(ACTIVE, Release);
        if let Some(cell) = SLOTS.get(i) {
            cell.store(p, Release);
        }
        return Some(s);
    }
}

/// The calling thread's slot, claiming one on first use. `None` when every slot is taken
/// or the shim is not configured.
pub fn current() -> Option<&'static Slot> {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: slots are never unmapped.
    if let Some(s) = unsafe { p.as_ref() } {
        return Some(s);
    }
    let s = claim(raw::gettid(), PID.load(Relaxed), NONCE.load(Relaxed))?;
    set_current(s);
    Some(s)
}

/// Sets the calling thread's slot.
pub fn set_current(s: &'static Slot) {
    CURRENT.with(|c| c.set(s as *const Slot as *mut Slot));
}

/// Indices of allocated slots.
pub fn slot_count() -> usize {
    SLOT_COUNT.load(Acquire).min(MAX_SLOTS)
}

/// What drains a slot whose drain lock the caller holds: the writer's
/// (`super::output::drain_locked`), handed down by [`set_drainer`] at start-up, so that
/// this layer calls the one above it without importing it.
static DRAINER: AtomicUsize = AtomicUsize::new(0);

/// Sets the function that drains a locked slot (before the handler is installed).
pub fn set_drainer(f: fn(&Slot)) {
    DRAINER.store(f as usize, Release);
}

/// Drains `slot` (its drain lock held) with the function [`set_drainer`] gave; nothing
/// before one was set.
pub fn drain_locked(slot: &Slot) {
    let f = DRAINER.load(Acquire);
    if f != 0 {
        // SAFETY: a non-zero DRAINER is only ever stored from a `fn(&Slot)` pointer.
        let f: fn(&Slot) = unsafe { std::mem::transmute::<usize, fn(&Slot)>(f) };
        f(slot);
    }
}

/// Wakes the writer thread.
pub fn wake_writer() {
    WAKE.fetch_add(1, Release);
    raw::futex_wake(&WAKE);
}

/// Enqueues a window applying the backpressure policy. False: not queued (dropped, and
/// counted, by backpressure `drop`; or no queue).
pub fn push(slot: &Slot, w: &Window) -> bool {
    let Some(st) = STATIC.get() else { return false };
    if slot.entries.load(Acquire).is_null() {
        return false;
    }
    loop {
        if slot.try_push(w) {
            if slot.queued() == (slot.cap as u64) / 2 {
                wake_writer();
            }
            return true;
        }
        match st.backpressure {
            Backpressure::Drop => {
                slot.dropped().fetch_add(1, Relaxed);
                return false;
            }
            Backpressure::Block => {
                if WRITER_ALIVE.load(Acquire) {
                    wake_writer();
                    raw::nanosleep(50_000);
                } else if slot.try_lock_drain() {
                    drain_locked(slot);
                    slot.unlock_drain();
                } else {
                    raw::sched_yield();
                }
            }
        }
    }
}

/// Fills `w` with `pos` in the current thread's window sequence.
pub fn next_index(slot: &Slot) -> u64 {
    slot.next_index.fetch_add(1, Relaxed)
}

/// Builds the `Static` from a validated configuration (normal context).
#[allow(clippy::too_many_arguments)]
pub fn make_static(
    cfg: &ShimConfig,
    backend: u8,
    pt_present: bool,
    reason: String,
    metadata: [u8; 50],
    pt_metadata: [u8; 18],
    vdso: (u64, usize),
    rewrite: bool,
    lib_path: Vec<u8>,
) -> Static {
    let mut out_dir = cfg.out_dir.as_os_str().as_encoded_bytes().to_vec();
    while out_dir.len() > 1 && out_dir.last() == Some(&b'/') {
        out_dir.pop();
    }
    Static {
        filter: cfg.filter.clone(),
        mode: cfg.mode as u32 as u8,
        window: cfg.window,
        backend,
        pt_present,
        reason,
        config_text: cfg.describe(),
        out_dir,
        queue_cap: cfg.queue,
        backpressure: cfg.backpressure,
        spool: cfg.spool,
        metadata,
        pt_metadata,
        vdso,
        kernel_raw: cfg.mode.traces_kernel(),
        rewrite,
        lib_path,
        exec_env: super::config::ALL_VARS
            .iter()
            .filter_map(|k| {
                let v = std::env::var_os(k)?;
                let mut e = format!("{k}=").into_bytes();
                e.extend_from_slice(v.as_encoded_bytes());
                e.push(0);
                Some(e)
            })
            .take(16)
            .collect(),
    }
}
