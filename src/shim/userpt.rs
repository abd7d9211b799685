//! User-mode PT of `thread` windows on the emulated backend (single-stepping inside the
//! LD_PRELOAD shim).
//!
//! **Async-signal-safe module, except [`init`] and [`window_pt`]/[`write_window`]** (those
//! run in normal context: at start-up and on the writer thread). [`enter`], [`leave`],
//! [`attach`], [`maps_changed`] and [`wait_for_writer`] run inside the SIGSYS handler:
//! no allocation (buffers come from raw `mmap`), no locks, no std I/O, no panics.
//!
//! # Design
//! A thread window is the thread's user execution between two syscalls. Stepping is driven
//! entirely through the saved context of the SIGSYS handler: the kernel cleared EFLAGS.TF
//! for the handler itself (so the shim never steps itself) and `rt_sigreturn` restores the
//! saved flags. At each intercepted syscall of a stepped thread:
//! 1. [`enter`] (before the syscall) closes the current window: the step buffer is
//!    disarmed, a synthesized step for the `syscall` instruction is appended (so the
//!    decoded window ends with the syscall, shown like user-only hardware: TIP.PGD), and
//!    TF is cleared in the saved flags;
//! 2. the shim performs the syscall; [`attach`] tags the closed buffer with the window's
//!    index when the window record is queued (the buffer is handed to the writer thread
//!    through the window queue: the writer finds it by index);
//! 3. [`leave`] (before returning) opens the next window: a free pre-allocated buffer is
//!    armed, its first IP is the saved RIP (the return address), and TF is set in the saved
//!    flags, so stepping resumes right after `rt_sigreturn`. SIGTRAP is removed from the
//!    restored signal mask (a single step with SIGTRAP blocked kills the process).
//!
//! The SIGTRAP handler ([`crate::emu::trap`]) records into the armed buffer. Each thread has
//! [`POOL`] buffers (ping-pong plus slack): while the writer encodes closed windows the
//! thread keeps running. When none is free, the thread waits for the writer (backpressure
//! `block`, up to [`WAIT_FREE_MS`]) or runs the window untraced: that window is written
//! with `WF_PT_DROPPED` and counted, never silently.
//!
//! The writer thread ([`window_pt`]) encodes the steps into PT packets with
//! [`crate::emu::encode::encode_window`] (reading the code from this process's memory) and
//! attaches sideband: after any `mmap`/`mprotect`/`munmap`/`mremap`, the next window
//! written carries MMAP2 records synthesized from `/proc/self/maps` (every executable
//! mapping at that time; the decoder applies them before that window). The mappings at
//! start and the vDSO bytes are in the process info file.
//!
//! Signals: the kernel clears TF for every handler, so handlers run untraced. Application
//! handlers are entered through the emulated backend's signal observer (wrapped at
//! start-up, and at every later `sigaction` the shim intercepts): a signal that interrupts
//! stepped code is recorded, and the window shows an asynchronous disable at the
//! interrupted instruction and the enable where the flow resumes; the handler's own
//! syscalls (`rt_sigreturn` included) do not cut the window. A handler entered without the
//! observer that makes a syscall cuts the window there and is stepped itself (its return
//! to the interrupted flow then shows as an explicit gap). The application's
//! `sigaction(SIGTRAP)` is chained behind the single-step handler (raise, int3 and
//! breakpoints still reach it). While stepping, SIGTRAP cannot be blocked (it is removed
//! from the mask restored at each return from the SIGSYS handler).
//!
//! New threads (created through the shim's clone reissue) trap once at their start and are
//! stepped from their first instruction: their first window covers the code up to their
//! first syscall.
//!
//! Windows without PT keep `WF_PT_ABSENT`: the main thread's code before its first
//! syscall (stepping starts there), syscalls made by signal handlers (handlers run untraced),
//! nested syscalls, the window before a successful `execve`, vfork-style children, the
//! child's side of a fork (the parent's file has it). Code run with Syscall User Dispatch
//! off (the shim's fork-child writer start) is not stepped until the next syscall.
//! A buffer holds one step per byte of the configured PT ring (`PTTRACER_PT_SHIFT`,
//! default 2^8 pages = 1 Mi steps). A window whose steps overflow it carries `WF_PT_LOST`:
//! stepping stops there (linear-mode semantics), what was captured decodes, and the next
//! syscall opens a fresh window. Syscall windows (`--window syscall`) in user mode have no
//! user code inside them by definition: PT stays absent with that reason (see
//! [`absent_reason`]).
//!
//! Snapshot mode ([`super::snapshot::ring`]) hands buffers over mid-window instead
//! (`hand_over`, the single-step handler's hook): when the recording buffer is nearly
//! full, has just recorded an `addr:` mark, or was armed before a firing's cut request
//! (another thread's trigger: this thread's part of the snapshot ends at its next
//! step, the window flagged `WF_SNAPSHOT_CUT`), the handler closes it as a window of its
//! own (`WF_NO_SYSCALL`, `nr` [`HANDOVER_NR`]: tagged and queued like a syscall's window,
//! so the writer finds it in queue order) and goes on stepping in a free buffer of the
//! pool from the instruction about to execute. The ring thus keeps the end of a long
//! stretch without syscalls, and an `addr:` snapshot is written at the writer's next
//! pass. With no buffer free the backpressure rules above apply.
//!
//! Buffer states: `FREE` → `RECORDING` (armed) → `CLOSED` (at the syscall, [`enter`]) →
//! `READY` (tagged with its window's index, [`attach`]; or straight from `RECORDING` at a
//! handover) → `FREE` (encoded by the writer). In snapshot mode the writer may take a
//! `CLOSED` buffer for a moment (`CUTTING`, [`cut_in_flight`]) to write the window of a
//! syscall still in flight into a snapshot (`snapshot-cut`); the thread waits for it to
//! be `CLOSED` again before moving it on, and the writer skips that window when it is
//! queued ([`WindowPt::Cut`]).

use super::config::{Backpressure, ShimConfig, WindowKind};
use super::raw;
use super::slots::{self, Slot, MAX_SLOTS, STATIC};
use crate::emu::trap::{self, Step, StepBuffer, EFLAGS_TF, STEP_SIGNAL, STEP_TRAP};
use crate::format::ptt::{
    Window, WF_NO_SYSCALL, WF_PT_ABSENT, WF_PT_DROPPED, WF_PT_LOST, WF_SNAPSHOT_CUT,
};
use crate::metadata::BackendKind;
use crate::tracer::Mode;
use libc::{c_void, ucontext_t};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

/// Step buffers per thread (mapped lazily, their memory released after encoding). More
/// than ping-pong: the writer thread can stall on a malloc arena lock that the stepped
/// thread holds across a syscall (glibc trims heaps with madvise/munmap inside `free`);
/// the thread only waits for the writer when every buffer is still unencoded, so a deep
/// pool keeps that stall from becoming a wait of WAIT_FREE_MS and a dropped window.
pub const POOL: usize = 16;
/// Longest wait for a free buffer with backpressure `block`.
pub const WAIT_FREE_MS: u64 = 5000;

const B_FREE: u32 = 0;
const B_RECORDING: u32 = 1;
/// Closed, waiting for its window index.
const B_CLOSED: u32 = 2;
/// Tagged with a window index; the writer encodes it.
const B_READY: u32 = 3;
/// Closed, its steps being read by the writer for a snapshot cut ([`cut_in_flight`]): the
/// thread waits before moving it on (from `B_CLOSED` only, with a compare-exchange).
const B_CUTTING: u32 = 4;

/// `nr` of a window handed over mid-window (`hand_over`): it ends without a syscall
/// (`WF_NO_SYSCALL`), like the pieces the snapshot ring cuts.
pub const HANDOVER_NR: u64 = u64::MAX;

/// Step capacity of one buffer (address space only until used: MAP_NORESERVE).
static BUF_STEPS: AtomicU64 = AtomicU64::new(1 << 20);
/// User PT of thread windows is on in this process.
use super::process::USER_PT_ON as ENABLED;
/// Bumped by the handler on mapping changes; the writer attaches fresh mappings.
static MAPS_GEN: AtomicU64 = AtomicU64::new(1);
static MAPS_SEEN: AtomicU64 = AtomicU64::new(0);
/// Windows that ran untraced because no buffer was free (process-wide).
pub static DROPPED_WINDOWS: AtomicU64 = AtomicU64::new(0);

/// One buffer of a thread's pool.
#[repr(C)]
struct PtBuf {
    state: AtomicU32,
    /// Window flags to add (WF_PT_LOST).
    flags: AtomicU32,
    first_ip: AtomicU64,
    start_tsc: AtomicU64,
    tag: AtomicU64,
    /// Snapshot mode: the window's code went into a snapshot as a `snapshot-cut` window
    /// while its syscall was in flight ([`cut_in_flight`]); the window, once queued, is
    /// not written again ([`WindowPt::Cut`]).
    cut: AtomicBool,
    /// The syscall that closed the window ([`enter`]): number, arguments, whether the
    /// filter records it, the window's start and end (for a cut while it is in flight).
    sys_nr: AtomicU64,
    sys_args: [AtomicU64; 6],
    sys_record: AtomicBool,
    sys_tsc_start: AtomicU64,
    sys_tsc_end: AtomicU64,
    /// Snapshot mode: [`trap::cut_requests`] when the window was closed (with the
    /// steps' `armed_at`: which firings it precedes, straddles or follows, see [`Cuts`]).
    closed_at: AtomicU64,
    /// Snapshot mode: the cut request of the trigger this window's end fired (a
    /// `syscall:` trigger's syscall, an `addr:` mark), 0 when none.
    fired: AtomicU64,
    steps: StepBuffer,
}

/// Per-thread PT state, in its own mapping (never unmapped; reused by later threads that
/// get the same slot).
#[repr(C)]
struct ThreadPt {
    slot: AtomicPtr<Slot>,
    pid: AtomicI32,
    /// Index of the recording buffer, -1 when no window is open.
    cur: AtomicI32,
    /// Index of the buffer closed at this syscall, -1 when none.
    closed: AtomicI32,
    /// The last window could not be opened (no free buffer).
    missed: AtomicBool,
    bufs: [PtBuf; POOL],
}

static THREADS: [AtomicPtr<ThreadPt>; MAX_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SLOTS];
static THREAD_COUNT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static MINE: Cell<*mut ThreadPt> = const { Cell::new(std::ptr::null_mut()) };
}

/// Whether this configuration records user PT in thread windows (emulated backend).
pub fn wanted(cfg: &ShimConfig, backend: BackendKind) -> bool {
    cfg.mode == Mode::UserOnly
        && cfg.window == WindowKind::Thread
        && backend == BackendKind::Emulated
}

/// Why PT is absent for a configuration this module does not record (None: it records).
pub fn absent_reason(cfg: &ShimConfig, backend: BackendKind) -> Option<String> {
    if wanted(cfg, backend) {
        return None;
    }
    if cfg.mode == Mode::UserOnly && cfg.window == WindowKind::Syscall {
        return Some(
            "user-mode PT of a syscall window is empty by definition (the window runs in the \
             kernel); use --window thread to trace the user code between syscalls"
                .into(),
        );
    }
    if backend == BackendKind::Hardware {
        return Some(format!(
            "hardware backend, mode {}, window {}: the shim captures Intel PT for kernel \
             modes with syscall windows, and user mode with thread windows in snapshot mode \
             only (these windows carry metadata); the C API captures any \
             (drpttracer_start_tracing / drpttracer_stop_tracing)",
            cfg.mode.name(),
            cfg.window.name()
        ));
    }
    Some(format!(
        "{} backend, mode {}, window {}: user PT in the shim needs --mode user --window thread \
         (emulated backend); kernel PT needs Intel PT hardware",
        backend.name(),
        cfg.mode.name(),
        cfg.window.name()
    ))
}

/// Start-up (normal context, before Syscall User Dispatch is armed): installs the SIGTRAP
/// handler and turns user PT on.
pub fn init(cfg: &ShimConfig) -> Result<(), String> {
    trap::window_opening().map_err(|e| e.message)?;
    // The SIGTRAP handler must return through the shim's in-range `rt_sigreturn` stub: the
    // libc restorer's `syscall` would raise SIGSYS while the handler still blocks it, which
    // kills the process. SIGSYS is also left unblocked while it runs.
    const SA_RESTORER: u64 = 0x0400_0000;
    let mut cur = KSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    let r = raw::sys4(
        libc::SYS_rt_sigaction,
        libc::SIGTRAP as u64,
        0,
        std::ptr::addr_of_mut!(cur) as u64,
        8,
    );
    if r != 0 {
        return Err(format!(
            "rt_sigaction(SIGTRAP) query failed with errno {}",
            -r
        ));
    }
    cur.flags |= SA_RESTORER;
    cur.restorer = raw::sigreturn_stub();
    cur.mask &= !(1u64 << (libc::SIGSYS - 1));
    let r = raw::sys4(
        libc::SYS_rt_sigaction,
        libc::SIGTRAP as u64,
        std::ptr::addr_of!(cur) as u64,
        0,
        8,
    );
    if r != 0 {
        return Err(format!("rt_sigaction(SIGTRAP) failed with errno {}", -r));
    }
    trap::EMULATE_SIGPROCMASK.store(false, Relaxed);
    let ring = crate::tracer::page_size()
        .checked_shl(cfg.pt_shift)
        .unwrap_or(1 << 22);
    // One step per PT ring byte, like the emulated backend's handles (linear mode).
    let steps = ring.clamp(4096, crate::emu::MAX_STEPS) as u64;
    BUF_STEPS.store(steps, Relaxed);
    if cfg.snapshot.is_some() {
        // A flight recorder keeps the end of a stretch without syscalls, and an `addr:`
        // snapshot is due when the address is reached: full or marked buffers are handed
        // over mid-window.
        trap::set_handover(hand_over);
    }
    ENABLED.store(true, Release);
    // New threads are stepped from their first instruction.
    raw::step_new_threads();
    Ok(())
}

pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// The application's SIGTRAP disposition (kernel `struct sigaction` layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct KSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

static APP_TRAP_RESTORER: AtomicU64 = AtomicU64::new(0);
static APP_TRAP_MASK: AtomicU64 = AtomicU64::new(0);

/// `rt_sigaction(SIGTRAP, act, old)` of the application while stepping is on (SIGSYS
/// handler): the single-step handler stays installed; the application's handler is
/// recorded and receives every SIGTRAP that is not a step of ours (raise, int3,
/// breakpoints). Returns the syscall result.
pub fn app_sigtrap(act: u64, old: u64) -> i64 {
    let (h, f) = trap::chained_handler();
    let prev = KSigaction {
        handler: h as u64,
        flags: f as u32 as u64,
        restorer: APP_TRAP_RESTORER.load(Relaxed),
        mask: APP_TRAP_MASK.load(Relaxed),
    };
    if act != 0 {
        // SAFETY: the application passes a struct sigaction for the kernel to read.
        let n = unsafe { (act as *const KSigaction).read_unaligned() };
        APP_TRAP_RESTORER.store(n.restorer, Relaxed);
        APP_TRAP_MASK.store(n.mask, Relaxed);
        trap::set_chained_handler(n.handler as usize, n.flags as i32);
    }
    if old != 0 {
        // SAFETY: the application passes a writable struct sigaction.
        unsafe { (old as *mut KSigaction).write_unaligned(prev) };
    }
    0
}

/// Before the shim passes an application's `rt_sigaction` to the kernel (SIGSYS handler):
/// a handler is wrapped with the emulated backend's signal observer, so that a signal
/// entering it while the thread is stepped is recorded (the window then shows an
/// asynchronous disable at the interrupted instruction and the enable where the flow
/// resumes; the handler itself runs untraced). Returns the previously observed
/// (handler, flags) to report as the old disposition, when `act` was rewritten.
pub fn wrap_app_handler(sig: u64, act: &mut [u64; 4]) -> Option<(u64, u64)> {
    if !enabled() {
        return None;
    }
    let (obs, (ph, pf)) = trap::observe(sig as i32, act[0] as usize, act[1] as i32)?;
    act[0] = obs as u64;
    act[1] |= libc::SA_SIGINFO as u64;
    Some((ph as u64, pf as u32 as u64))
}

/// After the kernel answered an application's `rt_sigaction`: an old disposition that is
/// the observer is reported as the application's own handler.
pub fn unwrap_old_handler(sig: u64, old: &mut [u64; 4], prev: Option<(u64, u64)>) {
    if !enabled() || old[0] != trap::observer_entry() as u64 {
        return;
    }
    let (h, f) = match prev {
        Some(p) => p,
        None => match trap::observed(sig as i32) {
            Some((h, f)) => (h as u64, f as u32 as u64),
            None => return,
        },
    };
    old[0] = h;
    // Keep the kernel's flags bits (SA_RESTORER...), with the application's SA_SIGINFO.
    old[1] = (old[1] & !(libc::SA_SIGINFO as u64)) | (f & libc::SA_SIGINFO as u64);
}

/// Stops stepping the calling thread until its next syscall (normal context): for shim
/// code that runs with Syscall User Dispatch off, whose `rt_sigprocmask` calls (blocking
/// SIGTRAP) the shim would not see. The open window ends there; the next syscall closes it
/// and opens a new one.
pub fn pause_stepping() {
    if enabled() {
        trap::clear_tf();
    }
}

/// Finds or creates the calling thread's state for `slot`. Async-signal-safe.
fn thread_state(slot: &Slot) -> Option<&'static ThreadPt> {
    let me = MINE.try_with(Cell::get).unwrap_or(std::ptr::null_mut());
    let sp = slot as *const Slot as *mut Slot;
    // SAFETY: ThreadPt mappings are never unmapped.
    if let Some(t) = unsafe { me.as_ref() } {
        if t.slot.load(Relaxed) == sp {
            return Some(t);
        }
    }
    // A recycled slot: its previous thread's state is drained (the slot was freed only
    // after its queue was written), reuse it.
    let n = (THREAD_COUNT.load(Acquire) as usize).min(MAX_SLOTS);
    for cell in THREADS.iter().take(n) {
        // SAFETY: as above.
        if let Some(t) = unsafe { cell.load(Acquire).as_ref() } {
            if t.slot.load(Relaxed) == sp {
                t.cur.store(-1, Relaxed);
                t.closed.store(-1, Relaxed);
                let _ = MINE.try_with(|c| c.set(t as *const ThreadPt as *mut ThreadPt));
                return Some(t);
            }
        }
    }
    let i = THREAD_COUNT.fetch_add(1, AcqRel) as usize;
    let cell = THREADS.get(i)?;
    let len = std::mem::size_of::<ThreadPt>().next_multiple_of(4096);
    let p = raw::mmap_anon(len)? as *mut ThreadPt;
    let cap = BUF_STEPS.load(Relaxed) as usize;
    // SAFETY: p is a fresh zeroed mapping big enough for a ThreadPt; every field is an
    // atomic (valid when zeroed) except the step buffers, written here before publication.
    unsafe {
        for k in 0..POOL {
            let sb = StepBuffer::new_raw(cap)?;
            std::ptr::addr_of_mut!((*p).bufs[k].steps).write(sb);
        }
        let t = &*p;
        t.slot.store(sp, Relaxed);
        t.pid.store(raw::getpid(), Relaxed);
        t.cur.store(-1, Relaxed);
        t.closed.store(-1, Relaxed);
        cell.store(p, Release);
        let _ = MINE.try_with(|c| c.set(p));
        Some(t)
    }
}

/// The state of `slot`'s thread for the drainer (any thread).
fn state_of(slot: &Slot) -> Option<&'static ThreadPt> {
    let sp = slot as *const Slot as *mut Slot;
    let n = (THREAD_COUNT.load(Acquire) as usize).min(MAX_SLOTS);
    THREADS.iter().take(n).find_map(|cell| {
        // SAFETY: ThreadPt mappings are never unmapped.
        let t = unsafe { cell.load(Acquire).as_ref() }?;
        (t.slot.load(Relaxed) == sp).then_some(t)
    })
}

fn buf(t: &ThreadPt, i: i32) -> Option<&PtBuf> {
    usize::try_from(i).ok().and_then(|i| t.bufs.get(i))
}

/// In a forked child: the buffers are copies of the parent's (its pending windows are the
/// parent's to write); start afresh. Async-signal-safe.
fn forget_parent(t: &ThreadPt) {
    let pid = raw::getpid();
    if t.pid.load(Relaxed) != pid {
        for b in &t.bufs {
            b.state.store(B_FREE, Relaxed);
        }
        t.cur.store(-1, Relaxed);
        t.closed.store(-1, Relaxed);
        t.missed.store(false, Relaxed);
        t.pid.store(pid, Relaxed);
    }
}

/// What [`enter`] decided for this SIGSYS.
#[derive(Clone, Copy)]
pub struct Token {
    t: *const ThreadPt,
}

impl Token {
    const NONE: Token = Token {
        t: std::ptr::null(),
    };
}

unsafe fn greg(uctx: *mut c_void, r: libc::c_int) -> *mut i64 {
    let uc = uctx as *mut ucontext_t;
    // SAFETY: caller passes the kernel's ucontext; r < 23.
    unsafe { std::ptr::addr_of_mut!((*uc).uc_mcontext.gregs[r as usize]) }
}

/// Records that a mapping may have changed (handler, for mmap-family syscalls).
pub fn maps_changed(nr: u64) {
    let nr = nr as i64;
    if nr == libc::SYS_mmap
        || nr == libc::SYS_mprotect
        || nr == libc::SYS_munmap
        || nr == libc::SYS_mremap
    {
        MAPS_GEN.fetch_add(1, Relaxed);
    }
}

/// Before the syscall (SIGSYS handler, outermost level): closes the thread's window.
///
/// # Safety
/// `uctx` is the kernel's ucontext of this SIGSYS delivery.
pub unsafe fn enter(uctx: *mut c_void) -> Token {
    if !ENABLED.load(Relaxed) || slots::untraced() || !slots::ACTIVE_FLAG.load(Relaxed) {
        return Token::NONE;
    }
    let Some(slot) = slots::current() else {
        return Token::NONE;
    };
    if slot.depth.load(Relaxed) != 0 || slot.vfork_child.load(Acquire) {
        return Token::NONE;
    }
    let Some(t) = thread_state(slot) else {
        return Token::NONE;
    };
    // SAFETY: uctx is the live ucontext.
    let (efl, rip, rax) = unsafe {
        (
            greg(uctx, libc::REG_EFL),
            *greg(uctx, libc::REG_RIP) as u64,
            *greg(uctx, libc::REG_RAX) as u64,
        )
    };
    maps_changed(rax);
    forget_parent(t);
    // SAFETY: efl points into the live ucontext.
    let stepping = unsafe { *efl } as u64 & EFLAGS_TF != 0;
    if let Some(b) = buf(t, t.cur.load(Relaxed)) {
        if !stepping && b.steps.last().is_some_and(|s| s.kind == STEP_SIGNAL) {
            // A syscall of a signal handler that interrupted the stepped flow: the handler
            // runs untraced; the window stays open for the interrupted flow.
            return Token::NONE;
        }
        trap::disarm(&b.steps);
        // The `syscall` instruction executed: its successor is the return address.
        if stepping && b.steps.last().is_some_and(|s| s.ip.wrapping_add(2) == rip) {
            b.steps.push_step(Step {
                ip: rip,
                tsc: raw::rdtsc(),
                kind: STEP_TRAP,
                arg: 0,
            });
        }
        if b.steps.overflowed() {
            b.flags.fetch_or(WF_PT_LOST, Relaxed);
        }
        const ARGS: [libc::c_int; 6] = [
            libc::REG_RDI,
            libc::REG_RSI,
            libc::REG_RDX,
            libc::REG_R10,
            libc::REG_R8,
            libc::REG_R9,
        ];
        for (cell, r) in b.sys_args.iter().zip(ARGS) {
            // SAFETY: the register is inside the live ucontext.
            cell.store(unsafe { *greg(uctx, r) } as u64, Relaxed);
        }
        b.sys_nr.store(rax, Relaxed);
        b.sys_record
            .store(STATIC.get().is_some_and(|s| s.filter.records(rax)), Relaxed);
        let since = slot.last_exit_tsc.load(Relaxed);
        let start = b.start_tsc.load(Relaxed);
        b.sys_tsc_start
            .store(if since == 0 { start } else { since }, Relaxed);
        b.sys_tsc_end.store(raw::rdtsc(), Relaxed);
        b.closed_at.store(trap::cut_requests(), Relaxed);
        b.state.store(B_CLOSED, Release);
        t.closed.store(t.cur.swap(-1, Relaxed), Relaxed);
        // SAFETY: as above.
        unsafe { *efl &= !(EFLAGS_TF as i64) };
    }
    Token { t }
}

/// Tags the buffer closed at this syscall with the window's index (the window is about to
/// be queued) and fixes the window's PT flags; `fired` is the cut request of a `syscall:`
/// trigger the syscall fired (0: none, see [`super::snapshot::handler_side::fire_if_trigger`]).
/// Async-signal-safe.
pub fn attach(slot: &Slot, w: &mut Window, fired: u64) {
    if !ENABLED.load(Relaxed) || w.depth != 0 {
        return;
    }
    let Some(t) = state_of_current(slot) else {
        return;
    };
    if t.pid.load(Relaxed) != raw::getpid() {
        // The child's side of a fork: the window before it is the parent's (in its file).
        return;
    }
    let i = t.closed.swap(-1, Relaxed);
    if let Some(b) = buf(t, i) {
        b.tag.store(w.index, Relaxed);
        b.fired.store(fired, Relaxed);
        w.flags &= !WF_PT_ABSENT;
        w.flags |= b.flags.swap(0, Relaxed);
        settle(b, B_READY);
    } else if t.missed.swap(false, Relaxed) {
        w.flags &= !WF_PT_ABSENT;
        w.flags |= WF_PT_DROPPED;
    }
}

/// A window tagged with `index` was not queued (backpressure `drop`): its buffer, which
/// the writer will never ask for, is free again (its steps dropped with the window, which
/// the slot's drop count reports). Async-signal-safe (the SIGSYS and SIGTRAP handlers).
pub fn forget(slot: &Slot, index: u64) {
    let Some(t) = state_of_current(slot) else {
        return;
    };
    // (Only this thread claims buffers, and the writer takes READY ones by the index of a
    // queued window, which this one is not.)
    for b in &t.bufs {
        if b.state.load(Acquire) == B_READY && b.tag.load(Relaxed) == index {
            b.steps.release_memory();
            b.state.store(B_FREE, Release);
        }
    }
}

fn state_of_current(slot: &Slot) -> Option<&'static ThreadPt> {
    let me = MINE.try_with(Cell::get).unwrap_or(std::ptr::null_mut());
    // SAFETY: ThreadPt mappings are never unmapped.
    let t = unsafe { me.as_ref() }?;
    std::ptr::eq(t.slot.load(Relaxed), slot).then_some(t)
}

/// Before returning from the SIGSYS handler: opens the next window.
///
/// # Safety
/// `uctx` is the kernel's ucontext of this SIGSYS delivery.
pub unsafe fn leave(tok: Token, uctx: *mut c_void) {
    // SAFETY: tokens only carry never-unmapped ThreadPt pointers.
    let Some(t) = (unsafe { tok.t.as_ref() }) else {
        return;
    };
    let Some(slot) = slots::current() else { return };
    forget_parent(t);
    // A clone reissued after this handler keeps its window pending (depth held) until the
    // notify trap, which attaches the closed buffer.
    if slot.depth.load(Relaxed) == 0 {
        if let Some(b) = buf(t, t.closed.swap(-1, Relaxed)) {
            // The window was not recorded (filtered out): its PT goes with it.
            b.flags.store(0, Relaxed);
            settle(b, B_FREE);
        }
    }
    if t.cur.load(Relaxed) >= 0 {
        return;
    }
    let Some(i) = claim_free(t) else {
        t.missed.store(true, Relaxed);
        DROPPED_WINDOWS.fetch_add(1, Relaxed);
        return;
    };
    let Some(b) = buf(t, i) else { return };
    // SAFETY: uctx is the live ucontext.
    let rip = unsafe { *greg(uctx, libc::REG_RIP) } as u64;
    open(t, i, b, rip, raw::rdtsc());
    // SAFETY: uc_sigmask and the flags are inside the live ucontext; rt_sigreturn applies
    // them. SIGTRAP must not be blocked while stepping.
    unsafe {
        let m = std::ptr::addr_of_mut!((*(uctx as *mut ucontext_t)).uc_sigmask) as *mut u64;
        m.write_unaligned(m.read_unaligned() & !(1u64 << (libc::SIGTRAP - 1)));
        *greg(uctx, libc::REG_EFL) |= EFLAGS_TF as i64;
    }
}

/// Makes buffer `i` (just claimed) the recording one of `t`, its window starting at `ip`
/// at `tsc`, and arms it. Async-signal-safe.
fn open(t: &ThreadPt, i: i32, b: &PtBuf, ip: u64, tsc: u64) {
    b.steps.reset(raw::gettid());
    b.flags.store(0, Relaxed);
    b.cut.store(false, Relaxed);
    b.fired.store(0, Relaxed);
    b.first_ip.store(ip, Relaxed);
    b.start_tsc.store(tsc, Relaxed);
    t.cur.store(i, Relaxed);
    trap::arm(&b.steps);
}

/// Moves a closed buffer on to `to` (the thread's side, async-signal-safe), waiting while
/// the writer reads it for a snapshot cut (a bounded encoding, see [`cut_in_flight`]).
fn settle(b: &PtBuf, to: u32) {
    loop {
        match b.state.compare_exchange(B_CLOSED, to, AcqRel, Acquire) {
            Err(B_CUTTING) => {
                slots::wake_writer();
                raw::nanosleep(100_000);
            }
            Ok(_) | Err(_) => return,
        }
    }
}

/// The single-step handler's handover hook in snapshot mode ([`trap::set_handover`]):
/// the recording buffer is full, has just recorded an `addr:` mark (whose firing makes a
/// cut request), or was armed before a cut request ([`trap::HAND_CUT`]). The buffer is
/// handed to the writer as a window of its own (`WF_NO_SYSCALL`, `nr` [`HANDOVER_NR`],
/// queued like a syscall's; the writer encodes it into ring pieces, firing the mark's
/// trigger at once), and stepping goes on in a free buffer of the thread's pool from the
/// instruction about to execute. No buffer free: the backpressure of `claim_free`
/// applies, then the rest of the stretch runs untraced and the window ending at the next
/// syscall is flagged `WF_PT_DROPPED` (counted). Runs inside the SIGTRAP handler:
/// async-signal-safe.
fn hand_over(reason: u32) -> u32 {
    if !ENABLED.load(Relaxed) || !super::process::SNAPSHOT_ON.load(Relaxed) {
        return trap::HANDOVER_DECLINED;
    }
    let me = MINE.try_with(Cell::get).unwrap_or(std::ptr::null_mut());
    // SAFETY: ThreadPt mappings are never unmapped.
    let Some(t) = (unsafe { me.as_ref() }) else {
        return trap::HANDOVER_DECLINED;
    };
    // SAFETY: slots are never unmapped.
    let Some(slot) = (unsafe { t.slot.load(Relaxed).as_ref() }) else {
        return trap::HANDOVER_DECLINED;
    };
    if t.pid.load(Relaxed) != raw::getpid()
        || slot.depth.load(Relaxed) != 0
        || slot.vfork_child.load(Acquire)
    {
        return trap::HANDOVER_DECLINED;
    }
    let Some(b) = buf(t, t.cur.load(Relaxed)) else {
        return trap::HANDOVER_DECLINED;
    };
    // The last record is the step to the instruction about to execute (or the mark
    // recorded at it): the next buffer starts there.
    let Some(last) = b.steps.last() else {
        return trap::HANDOVER_DECLINED;
    };
    trap::disarm(&b.steps);
    t.cur.store(-1, Relaxed);
    b.closed_at.store(trap::cut_requests(), Relaxed);
    // A mark fires its trigger here: every other stepped thread ends its snapshot at its
    // next step (this one's next buffer is armed after the request).
    let fired = if reason == trap::HAND_MARK {
        trap::request_cut()
    } else {
        0
    };
    b.fired.store(fired, Relaxed);
    let w = Window {
        index: slots::next_index(slot),
        nr: HANDOVER_NR,
        args: [0; 6],
        ret: 0,
        tsc_start: b.start_tsc.load(Relaxed),
        tsc_end: last.tsc,
        // A buffer ended for another thread's firing is the end of this thread's part
        // of that snapshot: cut by it, as under QEMU.
        flags: if reason == trap::HAND_CUT {
            WF_NO_SYSCALL | WF_SNAPSHOT_CUT
        } else {
            WF_NO_SYSCALL
        },
        depth: 0,
    };
    b.tag.store(w.index, Relaxed);
    b.state.store(B_READY, Release);
    if !slots::push(slot, &w) {
        forget(slot, w.index);
    }
    if reason == trap::HAND_MARK || reason == trap::HAND_CUT {
        // The snapshot is due now, not at the writer's next poll.
        slots::wake_writer();
    }
    let Some(i) = claim_free(t) else {
        t.missed.store(true, Relaxed);
        DROPPED_WINDOWS.fetch_add(1, Relaxed);
        return trap::HANDOVER_STOPPED;
    };
    let Some(nb) = buf(t, i) else {
        return trap::HANDOVER_STOPPED;
    };
    open(t, i, nb, last.ip, last.tsc);
    trap::HANDOVER_CONTINUED
}

fn claim_free(t: &ThreadPt) -> Option<i32> {
    let try_once = || {
        t.bufs.iter().enumerate().find_map(|(i, b)| {
            b.state
                .compare_exchange(B_FREE, B_RECORDING, AcqRel, Relaxed)
                .is_ok()
                .then_some(i as i32)
        })
    };
    if let Some(i) = try_once() {
        return Some(i);
    }
    let block = STATIC
        .get()
        .is_some_and(|s| s.backpressure == Backpressure::Block);
    if !block || !slots::WRITER_ALIVE.load(Acquire) {
        return None;
    }
    for _ in 0..WAIT_FREE_MS {
        slots::wake_writer();
        raw::nanosleep(1_000_000);
        if let Some(i) = try_once() {
            return Some(i);
        }
    }
    None
}

/// Before a synchronous drain in a handler (`exit_group`, `execve`): lets the writer
/// thread encode the queued windows first (encoding is not async-signal-safe). Bounded.
pub fn wait_for_writer() {
    if !ENABLED.load(Relaxed) || !slots::WRITER_ALIVE.load(Acquire) || slots::untraced() {
        return;
    }
    for _ in 0..60_000 {
        let pending = (0..(THREAD_COUNT.load(Acquire) as usize).min(MAX_SLOTS)).any(|i| {
            // SAFETY: ThreadPt mappings are never unmapped.
            unsafe { THREADS[i].load(Acquire).as_ref() }.is_some_and(|t| {
                t.pid.load(Relaxed) == raw::getpid()
                    && t.bufs.iter().any(|b| b.state.load(Acquire) == B_READY)
            })
        });
        if !pending {
            return;
        }
        slots::wake_writer();
        raw::nanosleep(1_000_000);
    }
}

/// PT and sideband of one window, produced on the writer thread.
pub enum WindowPt {
    /// No PT was captured for this window (write it as it is).
    None,
    /// Encoded PT and sideband bytes; extra window flags.
    Some {
        pt: Vec<u8>,
        sideband: Vec<u8>,
        flags: u32,
    },
    /// Snapshot mode: the PT in pieces of at most the cut size (see
    /// [`super::snapshot::ring`]), the sideband, extra window flags, where the window lies
    /// among the cut requests.
    Pieces {
        pieces: Vec<Piece>,
        sideband: Vec<u8>,
        flags: u32,
        cuts: Cuts,
    },
    /// Captured but not encodable here (drained outside the writer thread): dropped.
    Dropped,
    /// Snapshot mode: the window's code is in a snapshot already, as the `snapshot-cut`
    /// window of its syscall in flight ([`cut_in_flight`]); not written again. `fired`:
    /// the cut request of the `syscall:` trigger its return fired (0: none).
    Cut { fired: u64 },
}

/// Where a window lies among the snapshot cut requests ([`trap::request_cut`], one per
/// firing): it ran entirely after request `g` when `armed >= g`, it was open at request
/// `g` (and ends at most one instruction after it) when `armed < g <= closed`, it ended
/// before it otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cuts {
    pub armed: u64,
    pub closed: u64,
    /// The request its own end fired (0: none).
    pub fired: u64,
}

/// Where a thread is, for a firing's cut request `g` (on the writer thread, its queue
/// taken): [`at_firing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtFiring {
    /// Still running the code of a window opened before the request (it ends at the
    /// thread's next step), or a window that ended at it is on its way to the queue.
    Running,
    /// Inside a syscall whose window opened before the request: [`cut_in_flight`].
    InSyscall,
    /// Nothing of it before the request is still to come (not stepped, or everything
    /// since ran after it).
    Past,
}

/// Where `slot`'s thread is for cut request `g` (writer thread, after taking its queue).
pub fn at_firing(slot: &Slot, g: u64) -> AtFiring {
    if !ENABLED.load(Relaxed) {
        return AtFiring::Past;
    }
    let Some(t) = state_of(slot) else {
        return AtFiring::Past;
    };
    if t.pid.load(Relaxed) != raw::getpid() {
        return AtFiring::Past;
    }
    let mut at = AtFiring::Past;
    for b in &t.bufs {
        match b.state.load(Acquire) {
            // (A handed-over buffer between its state and its queue entry, or a buffer
            // claimed and not armed yet: its window comes.)
            B_READY => return AtFiring::Running,
            B_RECORDING if b.steps.armed_at() < g => return AtFiring::Running,
            B_CLOSED | B_CUTTING if b.steps.armed_at() < g && !b.cut.load(Relaxed) => {
                at = AtFiring::InSyscall;
            }
            _ => {}
        }
    }
    at
}

/// A piece of a window's PT (snapshot mode): it starts with a PSB+ and decodes on its
/// own; the next piece starts where its closing FUP points.
pub struct Piece {
    pub pt: Vec<u8>,
    pub tsc_start: u64,
    pub tsc_end: u64,
    /// An `addr:` trigger (its index) was reached where this piece ends.
    pub mark: Option<u32>,
}

/// Encodes `steps` in pieces of at most `cut` PT bytes, also cut at every `addr:` trigger
/// mark ([`crate::emu::trap::STEP_MARK`]). Flags `WF_PT_LOST` when encoding fails.
fn encode_pieces(first: u64, tsc: u64, steps: &[Step], cut: usize, flags: &mut u32) -> Vec<Piece> {
    let mut out = Vec::new();
    let (mut ip, mut t, mut pos) = (first, tsc, 0usize);
    loop {
        let rest = steps.get(pos..).unwrap_or(&[]);
        let end = rest
            .iter()
            .position(|s| s.kind == trap::STEP_MARK)
            .map_or(steps.len(), |k| pos + k);
        loop {
            let mut buf = vec![0u8; cut];
            let part = steps.get(pos..end).unwrap_or(&[]);
            match crate::emu::encode::encode_window(ip, t, part, &mut buf, false) {
                Ok(e) => {
                    buf.truncate(e.size);
                    out.push(Piece {
                        pt: buf,
                        tsc_start: t,
                        tsc_end: e.next_tsc,
                        mark: None,
                    });
                    pos += e.consumed;
                    ip = e.next_ip;
                    t = e.next_tsc;
                    if !e.out_of_space {
                        break;
                    }
                    if e.consumed == 0 {
                        *flags |= WF_PT_LOST;
                        return out;
                    }
                }
                Err(_) => {
                    *flags |= WF_PT_LOST;
                    return out;
                }
            }
        }
        let Some(m) = steps.get(end) else { break };
        if let Some(last) = out.last_mut() {
            last.mark = Some(m.arg);
        }
        ip = m.ip;
        t = m.tsc;
        pos = end + 1;
        if pos >= steps.len() {
            // A buffer handed over at the mark: nothing after it here.
            break;
        }
    }
    out
}

/// A window whose syscall was still in flight when a snapshot took its thread's ring
/// ([`cut_in_flight`]).
pub struct CutWindow {
    /// The syscall's window, `WF_SNAPSHOT_CUT`, no return value.
    pub w: Window,
    pub pieces: Vec<Piece>,
    pub sideband: Vec<u8>,
}

/// Snapshot mode, on the writer thread (normal context): when `slot`'s thread is inside a
/// recorded syscall and every window before it was taken from its queue, encodes the
/// window ending at that syscall (its user code up to the `syscall` instruction) for the
/// snapshot being written, in pieces of at most `cut` bytes. The buffer stays the
/// thread's: marked `PtBuf::cut`, so that the window queued at the syscall's return is
/// not written again ([`WindowPt::Cut`]). While the writer reads it, the buffer is
/// `B_CUTTING` and the thread cannot move it on (`settle`). None: not in a syscall whose
/// window opened before cut request `g`, windows still queued before it (the thread went
/// on after the firing: the snapshot ends with what was taken), cut already, or a mark
/// inside (its trigger fires when the window is written).
pub fn cut_in_flight(slot: &Slot, cut: usize, g: u64) -> Option<CutWindow> {
    if !ENABLED.load(Relaxed) {
        return None;
    }
    let t = state_of(slot)?;
    if t.pid.load(Relaxed) != raw::getpid() {
        return None;
    }
    let b = t.bufs.iter().find(|b| {
        b.state.load(Acquire) == B_CLOSED
            && !b.cut.load(Relaxed)
            && b.steps.armed_at() < g
            && b.sys_record.load(Relaxed)
            && b.state
                .compare_exchange(B_CLOSED, B_CUTTING, AcqRel, Relaxed)
                .is_ok()
    })?;
    // From here the thread cannot queue this window: an empty queue means everything
    // before it was taken.
    let steps = b.steps.records();
    if slot.queued() != 0 || steps.iter().any(|s| s.kind == trap::STEP_MARK) {
        b.state.store(B_CLOSED, Release);
        return None;
    }
    let mut flags = b.flags.load(Relaxed);
    let first = b.first_ip.load(Relaxed);
    let tsc = b.start_tsc.load(Relaxed);
    let pieces = encode_pieces(first, tsc, steps, cut, &mut flags);
    let mut args = [0u64; 6];
    for (a, cell) in args.iter_mut().zip(&b.sys_args) {
        *a = cell.load(Relaxed);
    }
    let w = Window {
        index: 0,
        nr: b.sys_nr.load(Relaxed),
        args,
        ret: 0,
        tsc_start: b.sys_tsc_start.load(Relaxed),
        tsc_end: b.sys_tsc_end.load(Relaxed),
        flags: flags | WF_SNAPSHOT_CUT,
        depth: 0,
    };
    b.cut.store(true, Relaxed);
    b.state.store(B_CLOSED, Release);
    Some(CutWindow {
        w,
        pieces,
        sideband: maps_sideband(),
    })
}

/// The cut requests made before window `w`'s steps were closed ([`Cuts::closed`]; 0: no
/// steps of it are waiting), read without taking them (writer thread, snapshot mode).
pub fn closed_at(slot: &Slot, w: &Window) -> u64 {
    if !ENABLED.load(Relaxed) || w.flags & WF_PT_ABSENT != 0 {
        return 0;
    }
    let Some(t) = state_of(slot) else {
        return 0;
    };
    t.bufs
        .iter()
        .find(|b| b.state.load(Acquire) == B_READY && b.tag.load(Relaxed) == w.index)
        .map_or(0, |b| b.closed_at.load(Relaxed))
}

/// Finds and encodes the PT of window `w` of `slot` (drainer; encodes only on the writer
/// thread, which is normal context).
///
/// With `cut` (snapshot mode) the PT comes in pieces ([`WindowPt::Pieces`]).
pub fn window_pt(slot: &Slot, w: &Window, cut: Option<usize>) -> WindowPt {
    if !ENABLED.load(Relaxed) || w.flags & WF_PT_ABSENT != 0 {
        return WindowPt::None;
    }
    let Some(t) = state_of(slot) else {
        return WindowPt::None;
    };
    let Some(b) = t
        .bufs
        .iter()
        .find(|b| b.state.load(Acquire) == B_READY && b.tag.load(Relaxed) == w.index)
    else {
        return WindowPt::None;
    };
    if !slots::untraced() {
        b.state.store(B_FREE, Release);
        return WindowPt::Dropped;
    }
    if b.cut.load(Relaxed) {
        let fired = b.fired.load(Relaxed);
        b.steps.release_memory();
        b.state.store(B_FREE, Release);
        return WindowPt::Cut { fired };
    }
    let steps = b.steps.records();
    let first = b.first_ip.load(Relaxed);
    let tsc = b.start_tsc.load(Relaxed);
    if let Some(cut) = cut {
        let mut flags = 0;
        let pieces = encode_pieces(first, tsc, steps, cut, &mut flags);
        let cuts = Cuts {
            armed: b.steps.armed_at(),
            closed: b.closed_at.load(Relaxed),
            fired: b.fired.load(Relaxed),
        };
        b.steps.release_memory();
        b.state.store(B_FREE, Release);
        return WindowPt::Pieces {
            pieces,
            sideband: maps_sideband(),
            flags,
            cuts,
        };
    }
    let mut cap = steps.len().saturating_mul(4).max(64 * 1024);
    let mut flags = 0;
    let pt = loop {
        let mut out = vec![0u8; cap];
        match crate::emu::encode::encode_window(first, tsc, steps, &mut out, false) {
            Ok(e) if e.out_of_space && cap < steps.len().saturating_mul(128) + 4096 => {
                cap = steps.len().saturating_mul(128) + 4096;
            }
            Ok(e) => {
                if e.out_of_space {
                    flags |= WF_PT_LOST;
                }
                out.truncate(e.size);
                break out;
            }
            Err(_) => {
                flags |= WF_PT_LOST;
                break Vec::new();
            }
        }
    };
    b.steps.release_memory();
    b.state.store(B_FREE, Release);
    WindowPt::Some {
        pt,
        sideband: maps_sideband(),
        flags,
    }
}

/// MMAP2 records of every executable mapping when a mapping may have changed since the
/// last window written (writer thread).
fn maps_sideband() -> Vec<u8> {
    let gen = MAPS_GEN.load(Relaxed);
    if MAPS_SEEN.swap(gen, Relaxed) == gen {
        return Vec::new();
    }
    crate::sideband::synth::synthesize_exec_mmap2(crate::sideband::record::SIDEBAND_SAMPLE_TYPE, 0)
        .unwrap_or_default()
}

/// Writes window `w` with `pt` and `sideband` as one frame to `fd`.
pub fn write_window(fd: i32, w: &Window, pt: &[u8], sideband: &[u8]) -> bool {
    write_window_parts(fd, w, &[pt], sideband)
}

/// [`write_window`] with the PT in pieces (a wrapped ring). Async-signal-safe.
pub fn write_window_parts(fd: i32, w: &Window, pt: &[&[u8]], sideband: &[u8]) -> bool {
    let pt_len: usize = pt.iter().map(|p| p.len()).sum();
    let mut fixed = [0u8; crate::format::ptt::WINDOW_FIXED_SIZE];
    let mut c = crate::format::ptt::Cursor::new(&mut fixed);
    c.u64(w.index);
    c.u64(w.nr);
    for a in w.args {
        c.u64(a);
    }
    c.i64(w.ret);
    c.u64(w.tsc_start);
    c.u64(w.tsc_end);
    c.u32(w.flags);
    c.u32(w.depth);
    c.u32(pt_len as u32);
    c.u32(sideband.len() as u32);
    if c.overflowed() || pt.len() > 2 {
        return false;
    }
    let mut parts: [&[u8]; 4] = [&fixed, &[], &[], sideband];
    for (dst, p) in parts[1..3].iter_mut().zip(pt) {
        *dst = p;
    }
    super::frame::write_frame_parts(fd, crate::format::ptt::RecordType::Window, &parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mode: &str, window: &str) -> ShimConfig {
        ShimConfig::from_lookup(|k| match k {
            "PTTRACER_OUT" => Some("/tmp/x".into()),
            "PTTRACER_MODE" => Some(mode.into()),
            "PTTRACER_WINDOW" => Some(window.into()),
            _ => None,
        })
        .unwrap()
        .unwrap()
    }

    #[test]
    fn absent_reasons_say_what_records_pt() {
        assert_eq!(
            absent_reason(&cfg("user", "thread"), BackendKind::Emulated),
            None
        );
        let r = absent_reason(&cfg("user", "syscall"), BackendKind::Emulated).unwrap();
        assert!(r.contains("--window thread"), "{r}");
        // On a machine with Intel PT, user-mode windows of the shim carry metadata only
        // (outside snapshot mode, `super::super::snapshot::hw`): say so, and where hardware PT
        // is captured instead.
        let r = absent_reason(&cfg("user", "thread"), BackendKind::Hardware).unwrap();
        assert_eq!(
            r,
            "hardware backend, mode user, window thread: the shim captures Intel PT for \
             kernel modes with syscall windows, and user mode with thread windows in snapshot \
             mode only (these windows carry metadata); the C API captures any \
             (drpttracer_start_tracing / drpttracer_stop_tracing)"
        );
    }
}
