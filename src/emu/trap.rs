//! Single-step capture: the SIGTRAP handler, the signal observers and the TF switches.
//!
//! **Async-signal-safe module.** `on_sigtrap` and `on_observed_signal` run inside signal
//! handlers: they never allocate, lock, print or panic; they use only thread-local `Cell`
//! reads, atomics and async-signal-safe system calls (gettid, process_vm_readv/writev,
//! sigaction, raise). They write into a [`StepBuffer`] that was allocated before tracing
//! started and that the tracing thread reaches through a thread-local pointer armed by
//! [`arm`]. The install/arm functions ([`window_opening`], [`window_closed`], [`arm`],
//! [`disarm`]) run in normal context.
//!
//! How it works: [`set_tf`] sets EFLAGS.TF with `pushfq/or/popfq`; from then on every
//! user instruction of the calling thread ends in a debug trap, which the kernel turns into
//! SIGTRAP (`si_code == TRAP_TRACE`). The handler appends the interrupted RIP (the next
//! instruction to execute) and a TSC to the buffer. [`clear_tf`] ends the stepping.
//! The kernel clears TF when it enters any signal handler and `rt_sigreturn` restores the
//! interrupted flags, so handlers are never stepped; `on_observed_signal` (wrapped around
//! the application's handlers while windows are open) records that such an asynchronous
//! transfer happened so the encoder can emit FUP + TIP.PGD / TIP.PGE.
//!
//! Hazards handled here:
//! - SIGTRAP must never be blocked while stepping (the kernel would reset it to SIG_DFL and
//!   kill the process): `rt_sigprocmask` calls of the stepped thread that would block it are
//!   performed by the handler with SIGTRAP left out (glibc's `raise`, `pthread_create`,
//!   `posix_spawn` block all signals briefly);
//! - traps of other threads that share our memory/TLS (vfork children) or inherited TF
//!   (threads created inside a window, fork children) stop their stepping instead of being
//!   recorded or killing the process;
//! - a SIGTRAP that is not a single step (int3, kill, hardware breakpoints) goes to the
//!   handler that was installed before ours (default action included);
//! - a buffer that fills up stops the stepping (linear-mode semantics), unless a handover
//!   hook is installed ([`set_handover`], the LD_PRELOAD shim's snapshot mode): then the
//!   hook closes the full buffer (or the one that just recorded an `addr:` mark) and arms
//!   another, and stepping goes on.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result, Status};

/// EFLAGS.TF.
pub const EFLAGS_TF: u64 = 0x100;

/// Kind of a [`Step`] record.
pub const STEP_TRAP: u32 = 0;
/// A signal handler was entered while the thread was being stepped; `ip` is the
/// interrupted (not yet executed) instruction, `arg` the signal number.
pub const STEP_SIGNAL: u32 = 1;

/// A snapshot `addr:` trigger was reached (LD_PRELOAD shim, snapshot mode): `ip` is the
/// trigger's address, the instruction about to execute (the [`STEP_TRAP`] record before
/// this one says so too), `arg` the trigger's index. The encoder skips it; the shim cuts
/// the window there.
pub const STEP_MARK: u32 = 2;

/// Addresses whose execution records a [`STEP_MARK`] (0: unused slot). Set by the shim
/// before stepping starts; read by the single-step handler at every step.
pub static MARK_ADDRS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Records a buffer keeps free for what may follow a step before the next one (a signal
/// record, a mark, the shim's synthesized syscall step): the handler asks for a handover
/// when fewer are left.
pub const HANDOVER_ROOM: usize = 4;
/// [`set_handover`] hook reasons: the buffer is (nearly) full; a [`STEP_MARK`] was recorded;
/// a snapshot cut was requested since the buffer was armed ([`request_cut`]).
pub const HAND_FULL: u32 = 1;
pub const HAND_MARK: u32 = 2;
pub const HAND_CUT: u32 = 3;
/// [`set_handover`] hook results: nothing done (the buffer stays armed); a fresh buffer is
/// armed and stepping goes on; no buffer could be armed, stepping stops.
pub const HANDOVER_DECLINED: u32 = 0;
pub const HANDOVER_CONTINUED: u32 = 1;
pub const HANDOVER_STOPPED: u32 = 2;

/// The installed handover hook (`fn(u32) -> u32` as an address; 0: none).
static HANDOVER: AtomicUsize = AtomicUsize::new(0);

/// Snapshot cuts requested so far (a generation, see [`request_cut`]).
static CUT_REQUESTS: AtomicU64 = AtomicU64::new(0);

/// Asks every stepped thread to end its buffer at its next step (the LD_PRELOAD shim's
/// snapshot mode: a trigger fired, each thread's snapshot ends at the instruction it is
/// about to execute). A buffer armed before the request is handed over ([`HAND_CUT`]) at
/// its next step when a handover hook is installed. Returns the request's generation.
/// Async-signal-safe.
pub fn request_cut() -> u64 {
    CUT_REQUESTS.fetch_add(1, Ordering::AcqRel) + 1
}

/// The generation of the latest [`request_cut`] (0: none yet). Async-signal-safe.
pub fn cut_requests() -> u64 {
    CUT_REQUESTS.load(Ordering::Acquire)
}

/// The generation of the latest [`request_cut`] made before this process was forked (0 in
/// the first process): requests the writer of this process will never be told about.
static CUT_REQUESTS_AT_FORK: AtomicU64 = AtomicU64::new(0);

/// In a forked child (its only thread, before it runs on): the requests made so far were
/// the parent's. Async-signal-safe.
pub fn forked() {
    CUT_REQUESTS_AT_FORK.store(cut_requests(), Ordering::Release);
}

/// The requests of the parent process ([`forked`]). Async-signal-safe.
pub fn cut_requests_at_fork() -> u64 {
    CUT_REQUESTS_AT_FORK.load(Ordering::Acquire)
}

/// Installs `hook`, called by the single-step handler on the stepped thread (so it must be
/// async-signal-safe) when the armed buffer has fewer than [`HANDOVER_ROOM`] free records
/// ([`HAND_FULL`]), has just recorded a [`STEP_MARK`] ([`HAND_MARK`]) or was armed before
/// the latest [`request_cut`] ([`HAND_CUT`]). It returns one of
/// the `HANDOVER_*` results; with [`HANDOVER_CONTINUED`] it has armed ([`arm`]) the buffer
/// to go on with.
pub fn set_handover(hook: fn(u32) -> u32) {
    HANDOVER.store(hook as usize, Ordering::Release);
}

/// Calls the handover hook ([`HANDOVER_DECLINED`] without one). Async-signal-safe.
fn handover(reason: u32) -> u32 {
    let f = HANDOVER.load(Ordering::Acquire);
    if f == 0 {
        return HANDOVER_DECLINED;
    }
    // SAFETY: a non-zero value was stored by `set_handover` from a `fn(u32) -> u32`.
    let hook: fn(u32) -> u32 = unsafe { std::mem::transmute::<usize, fn(u32) -> u32>(f) };
    hook(reason)
}

/// One record of the capture buffer (written by the handlers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Step {
    /// For [`STEP_TRAP`]: the instruction about to execute after the trap.
    pub ip: u64,
    /// TSC read in the handler.
    pub tsc: u64,
    pub kind: u32,
    pub arg: u32,
}

/// A pre-allocated per-handle capture buffer shared with the signal handlers.
///
/// The records live in an anonymous private mapping (lazily backed by the kernel, so a big
/// capacity costs address space, not memory, until it is used).
pub struct StepBuffer {
    recs: *mut Step,
    cap: usize,
    map_len: usize,
    len: AtomicUsize,
    /// The buffer filled up; stepping was stopped (linear-mode semantics).
    overflow: AtomicBool,
    /// Recording is on (set by [`arm`], cleared by [`disarm`]).
    active: AtomicBool,
    /// Thread that owns the window; traps from another thread that shares our memory and
    /// TLS (a vfork child) or a fork child are not recorded and their stepping is stopped.
    tid: AtomicI32,
    /// Traps seen from a thread other than `tid` (their TF was cleared).
    foreign: AtomicU32,
    /// [`cut_requests`] when the buffer was armed (a later request hands it over).
    armed_at: AtomicU64,
}

// SAFETY: the raw record pointer is only written by the owning thread (and its signal
// handlers); other threads never touch it. The struct is moved between threads only as part
// of a handle, never while armed on another thread.
unsafe impl Send for StepBuffer {}
// SAFETY: shared access goes through atomics; `recs` writes happen on one thread only.
unsafe impl Sync for StepBuffer {}

impl StepBuffer {
    /// Reserves room for `cap` records.
    pub fn new(cap: usize) -> Result<StepBuffer> {
        let cap = cap.max(16);
        let map_len = cap
            .checked_mul(std::mem::size_of::<Step>())
            .ok_or_else(|| Error::invalid(format!("capture buffer of {cap} steps is too big")))?;
        // SAFETY: anonymous private mapping, no file, no fixed address.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::from_errno(
                Status::FailedToMmapPtData,
                format_args!(
                    "emulated backend: cannot reserve {map_len} bytes for {cap} capture steps \
                     (use a smaller pt_size_shift)"
                ),
            ));
        }
        Ok(StepBuffer {
            recs: p.cast(),
            cap,
            map_len,
            len: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
            active: AtomicBool::new(false),
            tid: AtomicI32::new(0),
            foreign: AtomicU32::new(0),
            armed_at: AtomicU64::new(0),
        })
    }

    /// Like [`StepBuffer::new`] but async-signal-safe (one raw `mmap` through the shim's
    /// in-range stub, no allocation): for buffers created inside a signal handler.
    /// `None` when the mapping fails.
    pub fn new_raw(cap: usize) -> Option<StepBuffer> {
        let cap = cap.max(16);
        let map_len = cap.checked_mul(std::mem::size_of::<Step>())?;
        let r = crate::shim::raw::sys6(
            libc::SYS_mmap as u64,
            [
                0,
                map_len as u64,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64,
                u64::MAX,
                0,
            ],
        );
        if (-4095..0).contains(&r) {
            return None;
        }
        Some(StepBuffer {
            recs: r as *mut Step,
            cap,
            map_len,
            len: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
            active: AtomicBool::new(false),
            tid: AtomicI32::new(0),
            foreign: AtomicU32::new(0),
            armed_at: AtomicU64::new(0),
        })
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The [`cut_requests`] generation when the buffer was last armed: it holds code run
    /// after every cut request up to that one.
    pub fn armed_at(&self) -> u64 {
        self.armed_at.load(Ordering::Acquire)
    }

    /// Records captured so far.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire).min(self.cap)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The last record, if any. Async-signal-safe; meant for the owning thread.
    pub fn last(&self) -> Option<Step> {
        let n = self.len();
        if n == 0 {
            return None;
        }
        // SAFETY: n - 1 < cap and the record was written before len was published.
        Some(unsafe { self.recs.add(n - 1).read() })
    }

    /// Appends a record from the owning thread (e.g. a synthesized step for a syscall the
    /// shim performed for it). Async-signal-safe. False when full (the overflow flag is
    /// set).
    pub fn push_step(&self, step: Step) -> bool {
        let ok = self.push(step);
        if !ok {
            self.overflow.store(true, Ordering::Relaxed);
        }
        ok
    }

    /// Clears the buffer for a new window owned by `tid`.
    pub fn reset(&self, tid: i32) {
        self.len.store(0, Ordering::Relaxed);
        self.overflow.store(false, Ordering::Relaxed);
        self.foreign.store(0, Ordering::Relaxed);
        self.tid.store(tid, Ordering::Relaxed);
    }

    /// Whether `tid` owns the current window.
    pub fn tid_matches(&self, tid: i32) -> bool {
        self.tid.load(Ordering::Relaxed) == tid
    }

    pub fn overflowed(&self) -> bool {
        self.overflow.load(Ordering::Relaxed)
    }

    pub fn foreign_traps(&self) -> u32 {
        self.foreign.load(Ordering::Relaxed)
    }

    /// Gives the memory of the recorded steps back to the kernel (after big windows).
    pub fn release_memory(&self) {
        let used = self.len.load(Ordering::Relaxed).min(self.cap) * std::mem::size_of::<Step>();
        if used >= 1 << 20 {
            // SAFETY: the range lies inside our private anonymous mapping, which is not armed;
            // MADV_DONTNEED makes it read back as zeros.
            unsafe { libc::madvise(self.recs.cast(), used, libc::MADV_DONTNEED) };
        }
    }

    /// The records of the window (call only while disarmed).
    pub fn records(&self) -> &[Step] {
        let n = self.len.load(Ordering::Acquire).min(self.cap);
        // SAFETY: `recs` points to `cap` records of our mapping; the first `n` were written
        // by the handler on this thread before it was disarmed.
        unsafe { std::slice::from_raw_parts(self.recs, n) }
    }

    /// Appends a record; async-signal-safe. Returns false when full.
    fn push(&self, step: Step) -> bool {
        let n = self.len.load(Ordering::Relaxed);
        if n >= self.cap {
            return false;
        }
        // SAFETY: n < cap, inside our mapping; only this thread writes records.
        unsafe { self.recs.add(n).write(step) };
        self.len.store(n + 1, Ordering::Release);
        true
    }
}

impl Drop for StepBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` with this length and is not armed any more
        // (the owner disarms before dropping).
        unsafe { libc::munmap(self.recs.cast(), self.map_len) };
    }
}

thread_local! {
    /// The buffer armed on this thread (null when none). Const-initialised, no destructor:
    /// reading it from a signal handler is a plain TLS load.
    static CURRENT: Cell<*const StepBuffer> = const { Cell::new(ptr::null()) };
}

fn current() -> *const StepBuffer {
    CURRENT.try_with(Cell::get).unwrap_or(ptr::null())
}

/// Makes `buf` the calling thread's capture buffer and turns recording on.
///
/// The caller must keep `buf` alive and call [`disarm`] before dropping or moving it.
pub fn arm(buf: &StepBuffer) {
    buf.armed_at.store(cut_requests(), Ordering::Release);
    buf.active.store(true, Ordering::Release);
    let _ = CURRENT.try_with(|c| c.set(buf as *const StepBuffer));
}

/// Turns recording off for the calling thread.
pub fn disarm(buf: &StepBuffer) {
    let _ = CURRENT.try_with(|c| c.set(ptr::null()));
    buf.active.store(false, Ordering::Release);
}

/// Sets EFLAGS.TF; returns the address of the first instruction that runs stepped.
#[inline(never)]
pub fn set_tf() -> u64 {
    let first: u64;
    // SAFETY: only toggles EFLAGS.TF through the stack (pushfq/popfq, balanced); the
    // SIGTRAP handler is installed before this is called.
    unsafe {
        core::arch::asm!(
            "lea {first}, [rip + 2f]",
            "pushfq",
            "or qword ptr [rsp], 0x100",
            "popfq",
            "2:",
            first = out(reg) first,
        );
    }
    first
}

/// Clears EFLAGS.TF; returns whether it was set.
#[inline(never)]
pub fn clear_tf() -> bool {
    let before: u64;
    // SAFETY: balanced pushfq/popfq that only clears EFLAGS.TF (the flags are read from the
    // pushed copy before it is modified).
    unsafe {
        core::arch::asm!(
            "pushfq",
            "mov {b}, qword ptr [rsp]",
            "and qword ptr [rsp], -257",
            "popfq",
            b = out(reg) before,
        );
    }
    before & EFLAGS_TF != 0
}

/// Whether SIGTRAP is blocked on the calling thread (a single-step trap would then kill the
/// process: the kernel resets a blocked forced signal to its default action).
pub fn sigtrap_blocked() -> bool {
    // SAFETY: a null new set only queries the calling thread's mask.
    unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, ptr::null(), &mut cur) == 0
            && libc::sigismember(&cur, libc::SIGTRAP) == 1
    }
}

/// Whether EFLAGS.TF is set on the calling thread right now.
#[inline(never)]
pub fn tf_is_set() -> bool {
    let flags: u64;
    // SAFETY: reads EFLAGS through a balanced pushfq/pop.
    unsafe { core::arch::asm!("pushfq", "pop {f}", f = out(reg) flags) };
    flags & EFLAGS_TF != 0
}

#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc is unprivileged on Linux x86-64 (CR4.TSD clear) and has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn raw_gettid() -> i32 {
    // Through the shim's in-range stub: under the LD_PRELOAD shim a libc syscall from this
    // handler would raise SIGSYS (Syscall User Dispatch); elsewhere the stub is a plain
    // `syscall`.
    crate::shim::raw::gettid()
}

/// `process_vm_readv`/`writev` on our own pid through the shim's in-range stub (see
/// [`raw_gettid`]). Returns the byte count or -errno.
fn self_vm(nr: i64, local: &libc::iovec, remote: &libc::iovec) -> isize {
    let pid = crate::shim::raw::getpid();
    crate::shim::raw::sys6(
        nr as u64,
        [
            pid as u64,
            local as *const libc::iovec as u64,
            1,
            remote as *const libc::iovec as u64,
            1,
            0,
        ],
    ) as isize
}

/// # Safety
/// `ctx` must be the `ucontext_t` the kernel passed to a SA_SIGINFO handler.
unsafe fn uc_greg(ctx: *mut libc::c_void, reg: libc::c_int) -> *mut i64 {
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: per the contract, uc is a valid ucontext; gregs has 23 entries and reg < 23.
    unsafe { ptr::addr_of_mut!((*uc).uc_mcontext.gregs[reg as usize]) }
}

// ---- previous SIGTRAP disposition (chained for traps that are not ours) ----

static PREV_TRAP_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREV_TRAP_FLAGS: AtomicI32 = AtomicI32::new(0);

/// The SIGTRAP disposition traps that are not ours are passed to: (handler, sa_flags).
pub fn chained_handler() -> (usize, i32) {
    (
        PREV_TRAP_HANDLER.load(Ordering::Acquire),
        PREV_TRAP_FLAGS.load(Ordering::Relaxed),
    )
}

/// Replaces the chained SIGTRAP disposition (the LD_PRELOAD shim keeps our handler
/// installed and records the application's `sigaction(SIGTRAP)` here). Async-signal-safe.
pub fn set_chained_handler(handler: usize, flags: i32) {
    PREV_TRAP_FLAGS.store(flags, Ordering::Relaxed);
    PREV_TRAP_HANDLER.store(handler, Ordering::Release);
}

/// Single steps reported with si_code TRAP_BRKPT instead of TRAP_TRACE (DR6.BS missing).
static ODD_DR6_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many single steps arrived as TRAP_BRKPT in this process (a hypervisor quirk).
pub fn odd_dr6_steps() -> u64 {
    ODD_DR6_STEPS.load(Ordering::Relaxed)
}

/// The SIGTRAP handler. Async-signal-safe.
extern "C" fn on_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo (SA_SIGINFO).
    let code = unsafe { (*info).si_code };
    // A #DB-derived SIGTRAP: TRAP_TRACE is a single step (after a TF-clearing popf the
    // saved flags no longer have TF, so they are not checked). The kernel derives si_code
    // from DR6, and this KVM guest was seen handing out DR6 = 0, which turns a genuine step
    // into TRAP_BRKPT (the "icebp" case), so that counts too; chaining it to SIG_DFL would
    // kill the process. (int3 gives SI_KERNEL, kill/tgkill SI_USER/SI_TKILL: never ours.)
    // SAFETY: ctx is the kernel's ucontext for this delivery when not null.
    let stepping = !ctx.is_null() && (code == libc::TRAP_TRACE || code == libc::TRAP_BRKPT);
    if stepping {
        if code != libc::TRAP_TRACE {
            ODD_DR6_STEPS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: ctx is the kernel's ucontext for this delivery.
        let (rip, efl) = unsafe { (uc_greg(ctx, libc::REG_RIP), uc_greg(ctx, libc::REG_EFL)) };
        let buf = current();
        if !buf.is_null() {
            // SAFETY: an armed buffer outlives its window (disarm happens before drop).
            let b = unsafe { &*buf };
            if b.active.load(Ordering::Acquire) {
                if b.tid.load(Ordering::Relaxed) != raw_gettid() {
                    // A vfork/fork child running on our memory: stop stepping it.
                    b.foreign.fetch_add(1, Ordering::Relaxed);
                    // SAFETY: efl points into the live ucontext.
                    unsafe { *efl &= !(EFLAGS_TF as i64) };
                    return;
                }
                // SAFETY: rip points into the live ucontext.
                let ip = unsafe { *rip } as u64;
                // SAFETY: ctx is the kernel's ucontext for this delivery.
                unsafe { keep_sigtrap_unblocked(ctx, ip) };
                let ok = b.push(Step {
                    ip,
                    tsc: rdtsc(),
                    kind: STEP_TRAP,
                    arg: 0,
                });
                if !ok {
                    b.overflow.store(true, Ordering::Relaxed);
                    // SAFETY: as above.
                    unsafe { *efl &= !(EFLAGS_TF as i64) };
                    return;
                }
                let mark = MARK_ADDRS
                    .iter()
                    .position(|a| a.load(Ordering::Relaxed) == ip);
                if let Some(k) = mark {
                    let _ = b.push_step(Step {
                        ip,
                        tsc: rdtsc(),
                        kind: STEP_MARK,
                        arg: k as u32,
                    });
                }
                let cut = cut_requests();
                let reason = if mark.is_some() {
                    HAND_MARK
                } else if b.len() + HANDOVER_ROOM >= b.capacity() {
                    HAND_FULL
                } else if cut != b.armed_at.load(Ordering::Relaxed) {
                    HAND_CUT
                } else {
                    return;
                };
                match handover(reason) {
                    HANDOVER_STOPPED => {
                        // SAFETY: as above.
                        unsafe { *efl &= !(EFLAGS_TF as i64) };
                    }
                    // Not asked again for this request: the buffer goes on.
                    HANDOVER_DECLINED => b.armed_at.store(cut, Ordering::Relaxed),
                    _ => {}
                }
                return;
            }
        }
        // A single step nobody on this thread armed (e.g. a thread created inside a window
        // inherits TF). If the application had a handler, it may be its own stepping.
        let prev = PREV_TRAP_HANDLER.load(Ordering::Acquire);
        if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
            // SAFETY: as above.
            unsafe { *efl &= !(EFLAGS_TF as i64) };
            return;
        }
    }
    chain_sigtrap(sig, info, ctx);
}

/// SIGTRAP bit in a kernel sigset.
const SIGTRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// Reads `len` bytes of our own memory without faulting (process_vm_readv).
/// Async-signal-safe.
fn safe_read(addr: u64, dst: *mut u8, len: usize) -> bool {
    let local = libc::iovec {
        iov_base: dst.cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // Copies into `dst` (valid for `len`), EFAULT instead of a fault.
    let n = self_vm(libc::SYS_process_vm_readv, &local, &remote);
    n == len as isize
}

/// Writes `len` bytes into our own memory without faulting (process_vm_writev).
fn safe_write(addr: u64, src: *const u8, len: usize) -> bool {
    let local = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // Copies from `src` (valid for `len`), EFAULT instead of a fault.
    let n = self_vm(libc::SYS_process_vm_writev, &local, &remote);
    n == len as isize
}

/// Whether the trap handler performs SIGTRAP-blocking `rt_sigprocmask` calls itself (see
/// [`keep_sigtrap_unblocked`]). The LD_PRELOAD shim turns this off: it intercepts those
/// calls itself (so they are recorded) and keeps SIGTRAP out of the restored mask.
pub static EMULATE_SIGPROCMASK: AtomicBool = AtomicBool::new(true);

/// If the stepped thread is about to run `rt_sigprocmask` that would block SIGTRAP, performs
/// the call here instead, leaving SIGTRAP unblocked. A single-step trap while SIGTRAP is
/// blocked makes the kernel reset SIGTRAP to its default action, which kills the process
/// (glibc's `raise`, `pthread_create`, `sigsetjmp`… block all signals for a moment).
/// The call's effect is otherwise exact: old mask written, new mask applied through the
/// ucontext (restored by rt_sigreturn), rax = 0, rip past the `syscall`.
///
/// # Safety
/// `ctx` must be the kernel's ucontext of a SA_SIGINFO delivery.
unsafe fn keep_sigtrap_unblocked(ctx: *mut libc::c_void, ip: u64) {
    if !EMULATE_SIGPROCMASK.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: per the contract.
    let (rax, rdi, rsi, rdx, r10) = unsafe {
        (
            *uc_greg(ctx, libc::REG_RAX),
            *uc_greg(ctx, libc::REG_RDI),
            *uc_greg(ctx, libc::REG_RSI),
            *uc_greg(ctx, libc::REG_RDX),
            *uc_greg(ctx, libc::REG_R10),
        )
    };
    if rax != libc::SYS_rt_sigprocmask || rsi == 0 || r10 != 8 {
        return;
    }
    let how = rdi as i32;
    if how != libc::SIG_BLOCK && how != libc::SIG_SETMASK {
        return;
    }
    let mut insn = [0u8; 2];
    if !safe_read(ip, insn.as_mut_ptr(), 2) || insn != [0x0f, 0x05] {
        return;
    }
    let mut set = 0u64;
    if !safe_read(rsi as u64, ptr::addr_of_mut!(set).cast(), 8) {
        return; // let the kernel report EFAULT
    }
    if set & SIGTRAP_BIT == 0 {
        return;
    }
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: uc_sigmask starts with the kernel's 64-bit mask of the interrupted thread.
    let mask_ptr = unsafe { ptr::addr_of_mut!((*uc).uc_sigmask).cast::<u64>() };
    // SAFETY: as above.
    let cur = unsafe { mask_ptr.read_unaligned() };
    if rdx != 0 && !safe_write(rdx as u64, ptr::addr_of!(cur).cast(), 8) {
        return; // let the kernel report EFAULT
    }
    let unblockable = SIGTRAP_BIT | 1 << (libc::SIGKILL - 1) | 1 << (libc::SIGSTOP - 1);
    let new = if how == libc::SIG_BLOCK {
        cur | set
    } else {
        set
    } & !unblockable;
    // SAFETY: writes the mask rt_sigreturn will install, the result and the next rip.
    unsafe {
        mask_ptr.write_unaligned(new);
        *uc_greg(ctx, libc::REG_RAX) = 0;
        *uc_greg(ctx, libc::REG_RIP) = ip as i64 + 2;
    }
}

/// Passes a SIGTRAP that is not ours to the disposition that was there before us.
fn chain_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PREV_TRAP_HANDLER.load(Ordering::Acquire);
    let flags = PREV_TRAP_FLAGS.load(Ordering::Relaxed);
    if prev == libc::SIG_IGN {
        return;
    }
    if prev == libc::SIG_DFL {
        // Default action (core dump): restore it and re-raise; the signal is blocked while we
        // run and is delivered as soon as this handler returns.
        // SAFETY: sigaction/raise are async-signal-safe; the struct is zero-initialised.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGTRAP, &sa, ptr::null_mut());
            libc::raise(libc::SIGTRAP);
        }
        return;
    }
    // SAFETY: prev was installed by sigaction with these flags.
    unsafe { call_handler(prev, flags & libc::SA_SIGINFO != 0, sig, info, ctx) };
}

/// Calls a signal handler installed by `sigaction` (`SA_SIGINFO` form or plain).
/// Async-signal-safe: a plain indirect call.
///
/// # Safety
/// `handler` must be the address of a function installed as a signal handler, taking
/// (sig, info, ctx) when `siginfo` is true and (sig) otherwise.
pub unsafe fn call_handler(
    handler: usize,
    siginfo: bool,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    if siginfo {
        // SAFETY: the caller guarantees the SA_SIGINFO signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the caller guarantees the plain-handler signature.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

// ---- observers for the other signals: record "a handler ran here" ----

const MAX_SIG: usize = 65;
static OBS_HANDLER: [AtomicUsize; MAX_SIG] = [const { AtomicUsize::new(0) }; MAX_SIG];
static OBS_FLAGS: [AtomicI32; MAX_SIG] = [const { AtomicI32::new(0) }; MAX_SIG];

/// Wrapper installed in front of application signal handlers while windows are open.
/// Records a [`STEP_SIGNAL`] marker when the interrupted flow was being stepped, then runs
/// the application's handler. Async-signal-safe (apart from what the wrapped handler does).
extern "C" fn on_observed_signal(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    if !ctx.is_null() {
        // SAFETY: ctx is the kernel's ucontext for this delivery.
        let (rip, efl) = unsafe { (*uc_greg(ctx, libc::REG_RIP), *uc_greg(ctx, libc::REG_EFL)) };
        let buf = current();
        if efl as u64 & EFLAGS_TF != 0 && !buf.is_null() {
            // SAFETY: armed buffers outlive their window.
            let b = unsafe { &*buf };
            if b.active.load(Ordering::Acquire) && b.tid.load(Ordering::Relaxed) == raw_gettid() {
                let ok = b.push(Step {
                    ip: rip as u64,
                    tsc: rdtsc(),
                    kind: STEP_SIGNAL,
                    arg: sig as u32,
                });
                if !ok {
                    b.overflow.store(true, Ordering::Relaxed);
                    // SAFETY: points into the live ucontext; sigreturn restores it.
                    unsafe { *uc_greg(ctx, libc::REG_EFL) &= !(EFLAGS_TF as i64) };
                }
            }
        }
    }
    let idx = sig as usize;
    if idx >= MAX_SIG {
        return;
    }
    let h = OBS_HANDLER[idx].load(Ordering::Acquire);
    let flags = OBS_FLAGS[idx].load(Ordering::Relaxed);
    if h == libc::SIG_DFL || h == libc::SIG_IGN || h == 0 {
        return;
    }
    // SAFETY: the application installed h with these flags.
    unsafe { call_handler(h, flags & libc::SA_SIGINFO != 0, sig, info, ctx) };
}

// ---- installation (normal context) ----

struct InstallState {
    trap_installed: bool,
    /// Open windows in the process; observers are installed while > 0.
    windows: usize,
    /// Signals whose handler we wrapped.
    observed: Vec<i32>,
}

static INSTALL: Mutex<InstallState> = Mutex::new(InstallState {
    trap_installed: false,
    windows: 0,
    observed: Vec::new(),
});

fn query(sig: i32) -> Option<libc::sigaction> {
    // SAFETY: sigaction with a null new action only reads the disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, ptr::null(), &mut old) != 0 {
            return None;
        }
        Some(old)
    }
}

fn trap_handler_addr() -> usize {
    on_sigtrap as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize
}

fn observer_addr() -> usize {
    on_observed_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
        as usize
}

fn install_trap_locked(st: &mut InstallState) -> Result<()> {
    let mine = trap_handler_addr();
    if st.trap_installed {
        let cur = query(libc::SIGTRAP).map(|a| a.sa_sigaction);
        if cur != Some(mine) {
            return Err(Error::new(
                Status::FailedToStartTracing,
                "emulated backend: the SIGTRAP handler it installed was replaced by another one \
                 (the application called sigaction(SIGTRAP) after the first trace window); \
                 install your SIGTRAP handler before creating the first emulated-backend handle \
                 so it can be chained, or use the hardware backend",
            ));
        }
        return Ok(());
    }
    let prev = query(libc::SIGTRAP).ok_or_else(|| {
        Error::from_errno(
            Status::FailedToStartTracing,
            "sigaction(SIGTRAP) query failed",
        )
    })?;
    PREV_TRAP_FLAGS.store(prev.sa_flags, Ordering::Relaxed);
    PREV_TRAP_HANDLER.store(prev.sa_sigaction, Ordering::Release);
    // SAFETY: installs our handler with a fully initialised sigaction (all signals blocked
    // while it runs so observers see consistent buffers).
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = mine;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigfillset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTRAP, &sa, ptr::null_mut())
    };
    if rc != 0 {
        return Err(Error::from_errno(
            Status::FailedToStartTracing,
            "emulated backend: sigaction(SIGTRAP) install failed",
        ));
    }
    st.trap_installed = true;
    Ok(())
}

/// Signals never wrapped: SIGTRAP is ours, KILL/STOP cannot be caught.
fn observable(sig: i32) -> bool {
    sig != libc::SIGTRAP && sig != libc::SIGKILL && sig != libc::SIGSTOP
}

/// For a `sigaction(sig, handler, flags)` the LD_PRELOAD shim is about to pass to the
/// kernel (inside its SIGSYS handler; async-signal-safe): records `handler` as the one the
/// observer calls and returns the observer's address to install instead (with
/// SA_SIGINFO), together with the previously recorded (handler, flags) for reporting the
/// old disposition. `None` when the disposition is not a handler or `sig` is not observed.
pub fn observe(sig: i32, handler: usize, flags: i32) -> Option<(usize, (usize, i32))> {
    let idx = usize::try_from(sig).ok().filter(|i| *i < MAX_SIG)?;
    if !observable(sig) || handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return None;
    }
    let prev = observed(sig)?;
    OBS_FLAGS[idx].store(flags, Ordering::Relaxed);
    OBS_HANDLER[idx].store(handler, Ordering::Release);
    Some((observer_addr(), prev))
}

/// The application's (handler, flags) behind the observer for `sig`. Async-signal-safe.
pub fn observed(sig: i32) -> Option<(usize, i32)> {
    let idx = usize::try_from(sig).ok().filter(|i| *i < MAX_SIG)?;
    Some((
        OBS_HANDLER[idx].load(Ordering::Acquire),
        OBS_FLAGS[idx].load(Ordering::Relaxed),
    ))
}

/// The observer's entry point (to recognise it in a disposition read back).
pub fn observer_entry() -> usize {
    observer_addr()
}

/// Wraps every application signal handler with [`on_observed_signal`].
fn install_observers_locked(st: &mut InstallState) {
    let obs = observer_addr();
    for sig in 1..MAX_SIG as i32 {
        if !observable(sig) {
            continue;
        }
        let Some(old) = query(sig) else { continue };
        let h = old.sa_sigaction;
        // Wrapped already (ours is installed) or nothing to wrap; a handler the application
        // installed since the last scan (over ours or not) is wrapped now.
        if h == libc::SIG_DFL || h == libc::SIG_IGN || h == obs {
            continue;
        }
        OBS_FLAGS[sig as usize].store(old.sa_flags, Ordering::Relaxed);
        OBS_HANDLER[sig as usize].store(h, Ordering::Release);
        let mut sa = old;
        sa.sa_sigaction = obs;
        sa.sa_flags = old.sa_flags | libc::SA_SIGINFO;
        // SAFETY: sa is the application's own disposition with our entry point.
        if unsafe { libc::sigaction(sig, &sa, ptr::null_mut()) } == 0 && !st.observed.contains(&sig)
        {
            st.observed.push(sig);
        }
    }
}

/// Puts the application's handlers back (only where ours is still installed).
fn remove_observers_locked(st: &mut InstallState) {
    let obs = observer_addr();
    for sig in st.observed.drain(..) {
        let Some(cur) = query(sig) else { continue };
        if cur.sa_sigaction != obs {
            continue; // the application replaced it meanwhile; keep theirs
        }
        let mut sa = cur;
        sa.sa_sigaction = OBS_HANDLER[sig as usize].load(Ordering::Acquire);
        sa.sa_flags = OBS_FLAGS[sig as usize].load(Ordering::Relaxed);
        // SAFETY: restores the application's disposition as it was.
        unsafe { libc::sigaction(sig, &sa, ptr::null_mut()) };
    }
}

/// Before a window: installs the SIGTRAP handler (once per process) and the signal
/// observers (while any window is open).
pub fn window_opening() -> Result<()> {
    let mut st = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    install_trap_locked(&mut st)?;
    // Rescanned at every window: handlers installed since the last scan get wrapped too.
    install_observers_locked(&mut st);
    st.windows += 1;
    Ok(())
}

/// After a window (stepping already off).
pub fn window_closed() {
    let mut st = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    st.windows = st.windows.saturating_sub(1);
    if st.windows == 0 {
        remove_observers_locked(&mut st);
    }
}
