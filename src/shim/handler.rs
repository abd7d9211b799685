//! The SIGSYS handler. **Async-signal-safe**: this module runs inside a signal handler
//! (and re-entrantly: it is installed with `SA_NODEFER` so that syscalls of application
//! signal handlers that run *during* an intercepted syscall are intercepted too). No
//! allocation, no locks (only per-slot try-locks never held across a syscall that could
//! re-enter), no std I/O, no panics.
//!
//! What runs where:
//! - here, on the application thread: read nr/args from the ucontext, take timestamps
//!   (`rdtsc`), perform the syscall through the allowed stub, write the result into RAX,
//!   and push a metadata window into the thread's queue;
//! - special syscalls, emulated or rewritten here: `rt_sigaction` (SIGSYS stays ours, the
//!   application's SIGSYS handler is remembered and chained; SIGSYS is removed from every
//!   handler mask), `rt_sigprocmask` (applied to the ucontext's saved mask so it takes
//!   effect when the handler returns; SIGSYS can never be blocked), masks of
//!   `rt_sigsuspend`/`ppoll`/`pselect6`/`epoll_pwait(2)` (SIGSYS removed), `rt_sigreturn`
//!   (recorded, then resumed at the in-range sigreturn stub), thread-creating
//!   `clone`/`clone3` (reissued after the handler returns, see [`super::raw`]; the child of
//!   a vfork-style one, e.g. `posix_spawn`, writes its own files, [`super::vfork_child`]),
//!   `fork`,
//!   `vfork` and `clone` without a new stack (performed here as a fork; `vfork` becomes
//!   `clone(CLONE_VFORK)` without shared memory so the child cannot clobber this frame),
//!   `execve`/`execveat` (everything flushed and the window written before the call,
//!   retracted if it fails), `exit` (thread file ended; the last thread ends the process),
//!   `exit_group` (everything flushed synchronously), `prctl(PR_SET_SYSCALL_USER_DISPATCH)`
//!   (refused with EBUSY: the application cannot turn interception off);
//! - on the writer thread: draining queues into files ([`super::output`]).

use super::output;
use super::raw::{self, sys6};
use super::slots::{self, Slot, EXITED, STATIC};
use super::vfork_child;
use super::window::{begin, finish, ordinary_syscall, push_final_window, push_window, Begun};
use crate::format::ptt::{EndReason, Window, WF_FORK_CHILD, WF_NO_RETURN};
use libc::{c_int, c_void, siginfo_t, ucontext_t};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// `si_code` of a Syscall User Dispatch SIGSYS.
const SYS_USER_DISPATCH: c_int = 2;
const SIGSYS_BIT: u64 = 1 << (libc::SIGSYS - 1);
const UNBLOCKABLE: u64 = SIGSYS_BIT | (1 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1));

/// The application's SIGSYS disposition (kernel `struct sigaction` fields).
pub static APP_SIGSYS_HANDLER: AtomicU64 = AtomicU64::new(0);
pub static APP_SIGSYS_FLAGS: AtomicU64 = AtomicU64::new(0);
pub static APP_SIGSYS_RESTORER: AtomicU64 = AtomicU64::new(0);
pub static APP_SIGSYS_MASK: AtomicU64 = AtomicU64::new(0);

const NR_READ_SIGACTION: u64 = libc::SYS_rt_sigaction as u64;
const NR_SIGPROCMASK: u64 = libc::SYS_rt_sigprocmask as u64;
const NR_SIGRETURN: u64 = libc::SYS_rt_sigreturn as u64;
const NR_CLONE: u64 = libc::SYS_clone as u64;
const NR_CLONE3: u64 = libc::SYS_clone3 as u64;
const NR_FORK: u64 = libc::SYS_fork as u64;
const NR_VFORK: u64 = libc::SYS_vfork as u64;
const NR_EXECVE: u64 = libc::SYS_execve as u64;
const NR_EXECVEAT: u64 = libc::SYS_execveat as u64;
const NR_EXIT: u64 = libc::SYS_exit as u64;
const NR_EXIT_GROUP: u64 = libc::SYS_exit_group as u64;
const NR_PRCTL: u64 = libc::SYS_prctl as u64;
const PR_SET_SYSCALL_USER_DISPATCH: u64 = 59;
const NR_SIGSUSPEND: u64 = libc::SYS_rt_sigsuspend as u64;
const NR_PPOLL: u64 = libc::SYS_ppoll as u64;
const NR_PSELECT6: u64 = libc::SYS_pselect6 as u64;
const NR_EPOLL_PWAIT: u64 = libc::SYS_epoll_pwait as u64;
const NR_EPOLL_PWAIT2: u64 = libc::SYS_epoll_pwait2 as u64;

const CLONE_VM: u64 = libc::CLONE_VM as u64;
const CLONE_VFORK: u64 = libc::CLONE_VFORK as u64;
const CLONE_THREAD: u64 = libc::CLONE_THREAD as u64;
/// Bytes the reissue stub reserves below a stack pointer: 128 (red zone) + 8 (address).
const REISSUE_GAP: u64 = 136;

/// Kernel `struct sigaction` (x86-64): handler, flags, restorer, mask.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

struct Regs<'a> {
    g: &'a mut [libc::greg_t; 23],
}

impl Regs<'_> {
    fn get(&self, r: c_int) -> u64 {
        self.g.get(r as usize).map_or(0, |v| *v as u64)
    }
    fn set(&mut self, r: c_int, v: u64) {
        if let Some(x) = self.g.get_mut(r as usize) {
            *x = v as libc::greg_t;
        }
    }
    fn args(&self) -> [u64; 6] {
        [
            self.get(libc::REG_RDI),
            self.get(libc::REG_RSI),
            self.get(libc::REG_RDX),
            self.get(libc::REG_R10),
            self.get(libc::REG_R8),
            self.get(libc::REG_R9),
        ]
    }
}

/// Reads a u64 from application memory.
///
/// # Safety
/// `addr` must be readable (the application passed it to a syscall that reads it).
unsafe fn peek(addr: u64) -> u64 {
    // SAFETY: caller contract; unaligned reads are fine on x86-64.
    unsafe { (addr as *const u64).read_unaligned() }
}

/// # Safety
/// `addr` must be writable application memory.
unsafe fn poke(addr: u64, v: u64) {
    // SAFETY: caller contract.
    unsafe { (addr as *mut u64).write_unaligned(v) }
}

/// The installed SIGSYS handler.
///
/// # Safety
/// Called by the kernel with a valid siginfo and ucontext.
pub unsafe extern "C" fn on_sigsys(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    // User PT of thread windows: close the window before the syscall, open the next one
    // when returning (no-op unless enabled; see `super::userpt`).
    // SAFETY: the kernel passes valid pointers to a signal handler with SA_SIGINFO.
    let ours = unsafe { (*info).si_code } == SYS_USER_DISPATCH;
    // SAFETY: uctx is this delivery's ucontext.
    let tok = ours.then(|| unsafe { super::userpt::enter(uctx) });
    // SAFETY: forwarding the kernel's arguments.
    unsafe { sigsys_body(sig, info, uctx) };
    if let Some(tok) = tok {
        // SAFETY: as above.
        unsafe { super::userpt::leave(tok, uctx) };
    }
}

/// The SIGSYS handler proper.
///
/// # Safety
/// Called with the kernel's signal handler arguments.
unsafe fn sigsys_body(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    // SAFETY: the kernel passes valid pointers to a signal handler with SA_SIGINFO.
    let code = unsafe { (*info).si_code };
    if code != SYS_USER_DISPATCH || !slots::ACTIVE_FLAG.load(Relaxed) {
        // SAFETY: forwarding the kernel's arguments.
        unsafe { chain_app_sigsys(sig, info, uctx) };
        return;
    }
    // SAFETY: uctx is the ucontext_t of the interrupted thread.
    let uc = unsafe { &mut *(uctx as *mut ucontext_t) };
    let mut regs = Regs {
        g: &mut uc.uc_mcontext.gregs,
    };
    let nr = regs.get(libc::REG_RAX);
    let args = regs.args();
    let Some(st) = STATIC.get() else {
        let r = sys6(nr, args);
        regs.set(libc::REG_RAX, r as u64);
        return;
    };
    if regs.get(libc::REG_RIP) == raw::child_start_resume() {
        // A new thread's start trap (see `raw`): perform the stub's `ret 128` with clone's
        // child result; `userpt::leave` then arms stepping at the thread's first
        // instruction (hardware snapshot mode: the thread waits for its event). Nothing
        // is recorded.
        let sp = regs.get(libc::REG_RSP);
        // SAFETY: the reissue put the resume address at the child's stack pointer.
        let rip = unsafe { peek(sp) };
        regs.set(libc::REG_RIP, rip);
        regs.set(libc::REG_RSP, sp.wrapping_add(8 + 128));
        regs.set(libc::REG_RAX, 0);
        // Hardware snapshot mode: traced from here once the writer opened its event.
        super::snapshot::handler_side::await_thread_event();
        return;
    }
    if regs.get(libc::REG_RIP) == super::rewrite::fallback_resume() {
        // A patched site sent a syscall that needs the full handler: its `call` left the
        // site's resume address on the stack. Make the context look like a trap there.
        let sp = regs.get(libc::REG_RSP);
        // SAFETY: the patched `call` pushed the resume address at the stack pointer.
        let rip = unsafe { peek(sp) };
        regs.set(libc::REG_RIP, rip);
        regs.set(libc::REG_RSP, sp.wrapping_add(8));
    }
    let mut b = begin(st, nr, args);
    if regs.get(libc::REG_RIP) == raw::notify_resume() {
        // The parent of a reissued clone: RAX holds the clone result; leave it.
        if let Some(s) = b.slot {
            // This trap is not a syscall (RAX holds the result): nothing in flight.
            super::spool::leave(s.spool.load(Relaxed), b.w.depth);
            finish_clone(s, nr as i64);
            s.depth.fetch_sub(1, Relaxed);
        }
        return;
    }
    let outcome = match nr {
        NR_SIGRETURN | NR_READ_SIGACTION | NR_SIGPROCMASK | NR_SIGSUSPEND | NR_PPOLL
        | NR_EPOLL_PWAIT | NR_EPOLL_PWAIT2 | NR_PSELECT6 => {
            signal_syscall(&mut regs, uctx, &mut b, nr, args)
        }
        NR_CLONE | NR_CLONE3 | NR_FORK | NR_VFORK | NR_EXECVE | NR_EXECVEAT | NR_EXIT
        | NR_EXIT_GROUP => lifecycle_syscall(&mut regs, &mut b, nr, args),
        // The application may not switch Syscall User Dispatch off (or repoint it) under
        // the shim: refuse as the kernel does for an unsupported configuration.
        NR_PRCTL if args[0] == PR_SET_SYSCALL_USER_DISPATCH => Outcome::Ret(-(libc::EBUSY as i64)),
        _ => {
            let r = ordinary_syscall(b.slot, b.record, &mut b.w, nr, args);
            if st.rewrite {
                super::rewrite::maybe_patch(regs.get(libc::REG_RIP), nr);
            }
            Outcome::Ret(r)
        }
    };
    if let Outcome::Ret(ret) = outcome {
        regs.set(libc::REG_RAX, ret as u64);
        finish(b.slot, b.record, b.w, ret, b.t0);
    }
}

/// How a syscall handled by the SIGSYS handler ended.
enum Outcome {
    /// It returned this value: into RAX, and its window finished.
    Ret(i64),
    /// Its window was finished already, or will be later (a reissued clone), and RAX is
    /// not to be touched.
    Handled,
}

/// Signal-related syscalls: what the kernel must never see as the application wrote it
/// (SIGSYS stays deliverable and ours), and `rt_sigreturn`.
fn signal_syscall(
    regs: &mut Regs<'_>,
    uctx: *mut c_void,
    b: &mut Begun<'static>,
    nr: u64,
    args: [u64; 6],
) -> Outcome {
    match nr {
        NR_SIGRETURN => {
            // Resume at the in-range stub: our own sigreturn restores the application's
            // registers (rsp pointing at its signal frame), then the stub's rt_sigreturn
            // consumes that frame.
            regs.set(libc::REG_RIP, raw::sigreturn_stub());
            b.w.flags |= WF_NO_RETURN;
            finish(b.slot, b.record, b.w, 0, b.t0);
            Outcome::Handled
        }
        NR_READ_SIGACTION => Outcome::Ret(do_sigaction(&args)),
        NR_SIGPROCMASK => Outcome::Ret(do_sigprocmask(uc_mask(uctx), &args)),
        _ => Outcome::Ret(masked_wait(nr, args)),
    }
}

/// `rt_sigsuspend`, `ppoll`, `epoll_pwait(2)`, `pselect6`: performed with SIGSYS removed
/// from the mask they install for the wait.
fn masked_wait(nr: u64, args: [u64; 6]) -> i64 {
    match nr {
        NR_SIGSUSPEND => {
            let mut m = 0u64;
            if args[0] != 0 && args[1] == 8 {
                // SAFETY: the application passes its mask for the kernel to read.
                m = unsafe { peek(args[0]) } & !SIGSYS_BIT;
            }
            let mut a = args;
            if args[0] != 0 {
                a[0] = core::ptr::addr_of!(m) as u64;
            }
            sys6(nr, a)
        }
        NR_PPOLL | NR_EPOLL_PWAIT | NR_EPOLL_PWAIT2 => {
            let (mi, si) = if nr == NR_PPOLL { (3, 4) } else { (4, 5) };
            let mut a = args;
            let m: u64;
            if args[mi] != 0 && args[si] == 8 {
                // SAFETY: the application passes its mask for the kernel to read.
                m = unsafe { peek(args[mi]) } & !SIGSYS_BIT;
                a[mi] = core::ptr::addr_of!(m) as u64;
            }
            sys6(nr, a)
        }
        _ => {
            // pselect6
            let mut a = args;
            let m: u64;
            let mut pair: [u64; 2];
            if args[5] != 0 {
                // SAFETY: pselect6's 6th argument points to {const sigset_t *, size_t}.
                pair = unsafe { [peek(args[5]), peek(args[5] + 8)] };
                if pair[0] != 0 && pair[1] == 8 {
                    // SAFETY: as above, the kernel would read this mask.
                    m = unsafe { peek(pair[0]) } & !SIGSYS_BIT;
                    pair[0] = core::ptr::addr_of!(m) as u64;
                }
                a[5] = pair.as_ptr() as u64;
            }
            sys6(nr, a)
        }
    }
}

/// Syscalls that create, replace or end threads and processes.
fn lifecycle_syscall(
    regs: &mut Regs<'_>,
    b: &mut Begun<'static>,
    nr: u64,
    args: [u64; 6],
) -> Outcome {
    let slot = b.slot;
    let r = match nr {
        NR_CLONE | NR_CLONE3 => match clone_kind(nr, &args) {
            CloneKind::NewStack { flags, stack_top } => {
                if let Some(s) = slot {
                    if reissue_clone(s, regs, nr, flags, stack_top, &args, b.w, b.record) {
                        return Outcome::Handled;
                    }
                }
                -(libc::ENOMEM as i64)
            }
            CloneKind::Fork => do_fork(slot, nr, strip_vm(nr, &args, slot), &mut b.w),
        },
        NR_FORK => do_fork(
            slot,
            NR_CLONE,
            [libc::SIGCHLD as u64, 0, 0, 0, 0, 0],
            &mut b.w,
        ),
        NR_VFORK => do_fork(
            slot,
            NR_CLONE,
            [CLONE_VFORK | libc::SIGCHLD as u64, 0, 0, 0, 0, 0],
            &mut b.w,
        ),
        NR_EXECVE | NR_EXECVEAT => do_exec(slot, b.vfork_child, nr, args, &mut b.w, b.t0),
        NR_EXIT => {
            if let Some(s) = slot {
                push_final_window(s, b.record, &mut b.w, b.t0);
                if b.vfork_child {
                    vfork_child::end(s, EndReason::ThreadExit, args[0] as i32);
                } else {
                    thread_exit(s, args[0] as i32);
                }
            }
            sys6(nr, args)
        }
        _ => {
            // exit_group
            if let Some(s) = slot {
                push_final_window(s, b.record, &mut b.w, b.t0);
                if b.vfork_child {
                    vfork_child::end(s, EndReason::ExitGroup, args[0] as i32);
                } else {
                    super::userpt::wait_for_writer();
                    super::snapshot::handler_side::flush_for_exit(EndReason::ExitGroup);
                    block_all_signals();
                    output::drain_all(Some((EndReason::ExitGroup, args[0] as i32)));
                }
            }
            sys6(nr, args)
        }
    };
    Outcome::Ret(r)
}

fn uc_mask(uctx: *mut c_void) -> *mut u64 {
    // SAFETY: uc_sigmask is inside the ucontext the kernel gave us; its first 8 bytes are
    // the kernel signal mask.
    unsafe { core::ptr::addr_of_mut!((*(uctx as *mut ucontext_t)).uc_sigmask) as *mut u64 }
}

fn block_all_signals() {
    let all: u64 = !UNBLOCKABLE;
    raw::sys4(
        libc::SYS_rt_sigprocmask,
        libc::SIG_SETMASK as u64,
        core::ptr::addr_of!(all) as u64,
        0,
        8,
    );
}

/// `rt_sigaction`: keeps SIGSYS for the shim and SIGSYS out of every handler's mask.
fn do_sigaction(a: &[u64; 6]) -> i64 {
    let (sig, act, old, size) = (a[0], a[1], a[2], a[3]);
    if size != 8 {
        return -(libc::EINVAL as i64);
    }
    if sig == libc::SIGTRAP as u64 && super::userpt::enabled() {
        // The single-step handler stays; the application's is chained behind it.
        return super::userpt::app_sigtrap(act, old);
    }
    if sig == libc::SIGSYS as u64 {
        let prev = KSigaction {
            handler: APP_SIGSYS_HANDLER.load(Relaxed),
            flags: APP_SIGSYS_FLAGS.load(Relaxed),
            restorer: APP_SIGSYS_RESTORER.load(Relaxed),
            mask: APP_SIGSYS_MASK.load(Relaxed),
        };
        if act != 0 {
            // SAFETY: the application passes a struct sigaction for the kernel to read.
            let n = unsafe { (act as *const KSigaction).read_unaligned() };
            APP_SIGSYS_HANDLER.store(n.handler, Relaxed);
            APP_SIGSYS_FLAGS.store(n.flags, Relaxed);
            APP_SIGSYS_RESTORER.store(n.restorer, Relaxed);
            APP_SIGSYS_MASK.store(n.mask, Relaxed);
        }
        if old != 0 {
            // SAFETY: the application passes a writable struct sigaction.
            unsafe { (old as *mut KSigaction).write_unaligned(prev) };
        }
        return 0;
    }
    let bit = 1u64.checked_shl(sig as u32).unwrap_or(0);
    let ours = FATAL_OURS.load(Acquire) & bit != 0;
    let mut copy: KSigaction;
    let mut args = *a;
    let mut observed_prev = None;
    if act != 0 {
        // SAFETY: as above.
        copy = unsafe { (act as *const KSigaction).read_unaligned() };
        copy.mask &= !SIGSYS_BIT;
        if ours && copy.handler == libc::SIG_DFL as u64 {
            // The default action stays "flush, then the default action".
            copy = fatal_action();
        }
        // User PT: the handler is entered through the single-step signal observer.
        let mut k = [copy.handler, copy.flags, copy.restorer, copy.mask];
        observed_prev = super::userpt::wrap_app_handler(sig, &mut k);
        (copy.handler, copy.flags) = (k[0], k[1]);
        args[1] = core::ptr::addr_of!(copy) as u64;
    }
    let r = sys6(NR_READ_SIGACTION, args);
    if r == 0 && old != 0 && super::userpt::enabled() {
        // SAFETY: the kernel just wrote the old disposition there.
        let o = unsafe { (old as *mut KSigaction).read_unaligned() };
        let mut k = [o.handler, o.flags, o.restorer, o.mask];
        super::userpt::unwrap_old_handler(sig, &mut k, observed_prev);
        let o = KSigaction {
            handler: k[0],
            flags: k[1],
            restorer: k[2],
            mask: k[3],
        };
        // SAFETY: as above.
        unsafe { (old as *mut KSigaction).write_unaligned(o) };
    }
    if r == 0 && ours {
        if old != 0 {
            // The application sees the default disposition it never changed.
            // SAFETY: the application passes a writable struct sigaction.
            unsafe { (old as *mut KSigaction).write_unaligned(KSigaction::default()) };
        }
        // SAFETY: as above (act was read successfully when non-zero).
        if act != 0
            && unsafe { (act as *const KSigaction).read_unaligned() }.handler
                != libc::SIG_DFL as u64
        {
            FATAL_OURS.fetch_and(!bit, AcqRel);
        }
    }
    r
}

/// Signals whose default action ends the process: while their disposition is the default,
/// the shim's handler flushes every queue and ends the files first, then restores the
/// default action and re-raises.
pub const FATAL_SIGNALS: [c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGSEGV,
    libc::SIGTERM,
];

/// Bit n set: the shim's fatal-signal handler is installed for signal n.
pub static FATAL_OURS: AtomicU64 = AtomicU64::new(0);

const SA_RESTORER: u64 = 0x0400_0000;

fn fatal_action() -> KSigaction {
    KSigaction {
        handler: on_fatal as *const () as u64,
        flags: libc::SA_SIGINFO as u64 | SA_RESTORER,
        restorer: raw::sigreturn_stub(),
        mask: 0,
    }
}

/// Installs the fatal-signal handler where the disposition is the default (start-up).
pub fn install_fatal_handlers() {
    for sig in FATAL_SIGNALS {
        let mut old = KSigaction::default();
        let act = fatal_action();
        let r = raw::sys4(
            libc::SYS_rt_sigaction,
            sig as u64,
            0,
            core::ptr::addr_of_mut!(old) as u64,
            8,
        );
        if r != 0 || old.handler != libc::SIG_DFL as u64 {
            continue;
        }
        if raw::sys4(
            libc::SYS_rt_sigaction,
            sig as u64,
            core::ptr::addr_of!(act) as u64,
            0,
            8,
        ) == 0
        {
            FATAL_OURS.fetch_or(1 << sig, AcqRel);
        }
    }
}

/// A fatal signal with the default disposition: flush, end the files, die the default way.
///
/// # Safety
/// Called by the kernel as a signal handler.
unsafe extern "C" fn on_fatal(sig: c_int, _info: *mut siginfo_t, _uctx: *mut c_void) {
    block_all_signals();
    if slots::ACTIVE_FLAG.load(Acquire) {
        if let Some(s) = slots::current() {
            s.end_reason.store(EndReason::Signal as u32, Release);
        }
        super::snapshot::handler_side::flush_for_exit(EndReason::Signal);
        output::drain_all(Some((EndReason::Signal, sig)));
    }
    let dfl = KSigaction::default();
    raw::sys4(
        libc::SYS_rt_sigaction,
        sig as u64,
        core::ptr::addr_of!(dfl) as u64,
        0,
        8,
    );
    FATAL_OURS.fetch_and(!(1u64 << sig), AcqRel);
    // Delivered with the default action once this handler returns (a fault re-executes
    // and faults again).
    raw::sys3(
        libc::SYS_tgkill,
        raw::getpid() as u64,
        raw::gettid() as u64,
        sig as u64,
    );
}

/// `rt_sigprocmask` applied to the mask the handler's return restores.
fn do_sigprocmask(cur_p: *mut u64, a: &[u64; 6]) -> i64 {
    let (how, set, old, size) = (a[0], a[1], a[2], a[3]);
    if size != 8 {
        return -(libc::EINVAL as i64);
    }
    // SAFETY: cur_p points into our ucontext.
    let cur = unsafe { cur_p.read_unaligned() };
    let new = if set != 0 {
        // SAFETY: the application passes a mask for the kernel to read.
        let s = unsafe { peek(set) };
        match how as c_int {
            libc::SIG_BLOCK => Some(cur | s),
            libc::SIG_UNBLOCK => Some(cur & !s),
            libc::SIG_SETMASK => Some(s),
            _ => return -(libc::EINVAL as i64),
        }
    } else {
        None
    };
    if old != 0 {
        // SAFETY: the application passes a writable mask.
        unsafe { poke(old, cur) };
    }
    if let Some(n) = new {
        // SAFETY: as above.
        unsafe { cur_p.write_unaligned(n & !UNBLOCKABLE) };
    }
    0
}

/// Calls the application's SIGSYS handler for SIGSYS that are not ours.
///
/// # Safety
/// Arguments as received from the kernel.
unsafe fn chain_app_sigsys(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let h = APP_SIGSYS_HANDLER.load(Relaxed);
    let flags = APP_SIGSYS_FLAGS.load(Relaxed);
    if h == libc::SIG_IGN as u64 {
        return;
    }
    if h == libc::SIG_DFL as u64 {
        // Default action (terminate with core): restore it and re-raise; it is delivered
        // when this handler returns.
        let dfl = KSigaction::default();
        raw::sys4(
            libc::SYS_rt_sigaction,
            libc::SIGSYS as u64,
            core::ptr::addr_of!(dfl) as u64,
            0,
            8,
        );
        raw::sys3(
            libc::SYS_tgkill,
            raw::getpid() as u64,
            raw::gettid() as u64,
            libc::SIGSYS as u64,
        );
        return;
    }
    // SAFETY: the application registered h as a handler with these flags.
    unsafe {
        crate::emu::trap::call_handler(
            h as usize,
            flags & libc::SA_SIGINFO as u64 != 0,
            sig,
            info,
            uctx,
        )
    };
}

enum CloneKind {
    /// The child gets its own stack (threads, posix_spawn): reissue after return.
    NewStack { flags: u64, stack_top: u64 },
    /// The child runs on a copy of this stack: perform here.
    Fork,
}

fn clone_kind(nr: u64, a: &[u64; 6]) -> CloneKind {
    let (flags, top) = if nr == NR_CLONE {
        (a[0], a[1])
    } else {
        if a[0] == 0 || a[1] < 64 {
            return CloneKind::Fork;
        }
        // SAFETY: clone3's first argument points to struct clone_args of a[1] >= 64 bytes:
        // flags at 0, stack at 40, stack_size at 48.
        let (f, s, sz) = unsafe { (peek(a[0]), peek(a[0] + 40), peek(a[0] + 48)) };
        (f, if s == 0 { 0 } else { s.wrapping_add(sz) })
    };
    if top != 0 {
        CloneKind::NewStack {
            flags,
            stack_top: top,
        }
    } else {
        CloneKind::Fork
    }
}

/// Arguments for a clone performed here: a child without its own stack must not share
/// this memory (it would run over this handler's frame), so CLONE_VM is removed.
fn strip_vm(nr: u64, a: &[u64; 6], slot: Option<&Slot>) -> [u64; 6] {
    let mut out = *a;
    if nr == NR_CLONE {
        out[0] &= !CLONE_VM;
    } else if let Some(s) = slot {
        let n = (a[1] as usize).min(128);
        // SAFETY: clone_args is a[1] bytes of readable memory; we copy at most 128 bytes into
        // the slot's buffer (owned by this thread).
        let buf = unsafe { &mut *s.clone_args.get() };
        *buf = [0; 16];
        for i in 0..n / 8 {
            if let Some(b) = buf.get_mut(i) {
                // SAFETY: as above.
                *b = unsafe { peek(a[0] + 8 * i as u64) };
            }
        }
        buf[0] &= !CLONE_VM;
        out[0] = buf.as_ptr() as u64;
        out[1] = (n / 8 * 8) as u64;
    }
    out
}

/// Sets up the reissue of a clone whose child starts on its own stack. Returns false when
/// the arguments cannot be rewritten (the caller fails the syscall).
#[allow(clippy::too_many_arguments)]
fn reissue_clone(
    s: &Slot,
    regs: &mut Regs<'_>,
    nr: u64,
    flags: u64,
    stack_top: u64,
    a: &[u64; 6],
    w: Window,
    record: bool,
) -> bool {
    let rip = regs.get(libc::REG_RIP);
    let rsp = regs.get(libc::REG_RSP);
    let child_sp = stack_top.wrapping_sub(REISSUE_GAP);
    // SAFETY: the child stack is application memory handed to clone; the 136 bytes below
    // its top are free (the child has not run yet). The parent's slot 136 bytes below its
    // stack pointer is below the red zone, i.e. free stack.
    unsafe {
        poke(child_sp, rip);
        poke(rsp.wrapping_sub(REISSUE_GAP), rip);
    }
    if nr == NR_CLONE {
        regs.set(libc::REG_RSI, child_sp);
    } else {
        let n = (a[1] as usize).min(128);
        // SAFETY: the slot's clone_args buffer belongs to this thread; clone_args is n bytes.
        let buf = unsafe { &mut *s.clone_args.get() };
        *buf = [0; 16];
        for i in 0..n / 8 {
            if let Some(b) = buf.get_mut(i) {
                // SAFETY: as above.
                *b = unsafe { peek(a[0] + 8 * i as u64) };
            }
        }
        // stack_size -= 136 so that stack + stack_size == child_sp.
        buf[6] = buf[6].wrapping_sub(REISSUE_GAP);
        regs.set(libc::REG_RDI, buf.as_ptr() as u64);
        regs.set(libc::REG_RSI, (n / 8 * 8) as u64);
    }
    regs.set(libc::REG_RSP, rsp.wrapping_sub(REISSUE_GAP));
    regs.set(libc::REG_RIP, raw::reissue_clone_stub());
    regs.set(libc::REG_RAX, nr);
    let thread = flags & CLONE_THREAD != 0;
    if thread {
        // Counted before the child can run, so that the writer never sees zero live
        // threads while the child is starting.
        slots::LIVE.fetch_add(1, AcqRel);
    }
    if flags & CLONE_VM != 0 && !thread && flags & CLONE_VFORK != 0 {
        // The child runs on this thread's TLS (and slot) until it execs or exits.
        vfork_child::arm(s, flags);
        s.vfork_child.store(true, Release);
    }
    // SAFETY: pending_clone belongs to this thread.
    unsafe {
        *s.pending_clone.get() = slots::PendingClone {
            w,
            record,
            counted_thread: thread,
        };
    }
    // The window stays open (depth held) until the notify trap.
    true
}

/// The parent side of a reissued clone returned `r`.
fn finish_clone(s: &Slot, r: i64) {
    s.vfork_child.store(false, Release);
    vfork_child::disarm(s);
    // SAFETY: pending_clone belongs to this thread.
    let p = unsafe { *s.pending_clone.get() };
    if r < 0 && p.counted_thread {
        slots::LIVE.fetch_sub(1, AcqRel);
    }
    // Back to the depth of the clone's entry + 1 for the notify trap (the caller drops that
    // one). Storing rather than decrementing also discards what a vfork-style child that
    // exec'd or exited on this slot left counted.
    s.depth.store(p.w.depth + 1, Relaxed);
    if p.record {
        let mut w = p.w;
        w.ret = r;
        w.tsc_end = raw::rdtsc();
        push_window(s, &mut w);
    }
    s.last_exit_tsc.store(raw::rdtsc(), Relaxed);
}

/// fork-like clone performed inside the handler.
fn do_fork(slot: Option<&Slot>, nr: u64, a: [u64; 6], w: &mut Window) -> i64 {
    let r = sys6(nr, a);
    if r == 0 {
        after_fork_child(slot, w);
    }
    r
}

/// In a forked child (still inside the handler): this image is a new process.
fn after_fork_child(slot: Option<&Slot>, w: &mut Window) {
    // The kernel does not carry Syscall User Dispatch into a CLONE_VFORK child (vfork is
    // performed as one): arm it again before the child runs application code.
    super::arm();
    let pid = raw::getpid();
    let nonce = raw::rdtsc() & 0xFFFF_FFFF;
    slots::PID.store(pid, Relaxed);
    slots::NONCE.store(nonce, Relaxed);
    slots::START_TSC.store(raw::rdtsc(), Relaxed);
    slots::WRITER_ALIVE.store(false, Release);
    slots::LIVE.store(1, Release);
    crate::emu::trap::forked();
    // A parent thread may have been patching when we forked: its lock is not ours.
    super::rewrite::PATCH_LOCK.store(false, Release);
    let me = slot.map_or(core::ptr::null(), |s| s as *const Slot);
    // Every other slot belonged to a thread of the parent: its queue is the parent's to
    // write; its file descriptors are copies.
    for i in 0..slots::slot_count() {
        let Some(s) = slots::slot_at(i) else { continue };
        // The spool mapping is shared with the parent: never written here.
        s.forget_spool();
        raw::close(s.fd.swap(-1, Relaxed));
        raw::close(s.kfd.swap(-1, Relaxed));
        // Perf mappings are not inherited; the descriptor copy is closed.
        s.kpt.reset(true);
        s.drain_lock.store(0, Relaxed);
        if !core::ptr::eq(s, me) {
            s.state.store(slots::FREE, Release);
        }
    }
    raw::close(slots::INFO_FD.swap(-1, Relaxed));
    if let Some(s) = slot {
        let depth = s.depth.load(Relaxed);
        if s.attach_spool(pid, pid, nonce) {
            s.reset(pid, pid, nonce);
        } else {
            // No memory for a queue: the child runs untraced rather than crash.
            s.state.store(slots::FREE, Release);
        }
        s.depth.store(depth, Relaxed);
    }
    output::write_info_file();
    w.flags |= WF_FORK_CHILD;
}

/// execve/execveat: flush, write the window (retracted if the call fails), exec.
fn do_exec(
    slot: Option<&Slot>,
    vfork_child: bool,
    nr: u64,
    args: [u64; 6],
    w: &mut Window,
    t0: u64,
) -> i64 {
    let Some(s) = slot else { return sys6(nr, args) };
    if vfork_child {
        // Its own files (see `super::vfork_child`): a successful exec never returns here,
        // so the window and the ends are written first and retracted if the exec fails
        // (the caller then records the window with its error).
        let pos = vfork_child::mark(s);
        if STATIC.get().is_some_and(|st| st.filter.records(nr)) {
            let mut pre = *w;
            pre.flags |= WF_NO_RETURN;
            pre.tsc_end = t0;
            vfork_child::record(s, &mut pre);
        }
        vfork_child::end(s, EndReason::Exec, 0);
        let r = exec_with_shim(nr, args);
        vfork_child::retract(s, pos);
        return r;
    }
    // (In snapshot mode the exec's window belongs to no snapshot: not written.)
    let record = STATIC.get().is_some_and(|st| st.filter.records(nr))
        && !super::snapshot::handler_side::on();
    // Flush everything this image recorded so far.
    super::userpt::wait_for_writer();
    super::snapshot::handler_side::flush_for_exit(EndReason::Exec);
    output::drain_all(None);
    s.lock_drain();
    let fd = s.fd.load(Relaxed);
    let info = slots::INFO_FD.load(Relaxed);
    // (The info and kernel.raw files are O_APPEND: their retract points are their ends.)
    let (pos, ipos) = (raw::tell(fd), raw::end_of(info));
    let mut pre = *w;
    pre.flags |= WF_NO_RETURN;
    pre.tsc_end = t0;
    pre.index = s.next_index.load(Relaxed);
    let mut buf = [0u8; 256];
    let mut n = 0;
    if record && fd >= 0 {
        if let Some(m) = crate::format::ptt::encode_window(&mut buf, &pre, &[], &[]) {
            n = m;
        }
    }
    let written = s.written.load(Relaxed) + u64::from(n > 0);
    let dropped = s.dropped().load(Relaxed);
    if let Some(m) = crate::format::ptt::encode_frame(
        buf.get_mut(n..).unwrap_or(&mut []),
        crate::format::ptt::RecordType::End,
        |c| {
            c.u32(EndReason::Exec as u32);
            c.u32(0);
            c.u64(written);
            c.u64(dropped);
        },
    ) {
        n += m;
    }
    if fd >= 0 {
        raw::write_all(fd, buf.get(..n).unwrap_or(&[]));
    }
    // The DynamoRIO file gets the exec's PDB too (it is opened O_APPEND).
    let kfd = s.kfd.load(Relaxed);
    let kpos = raw::end_of(kfd);
    if record && kfd >= 0 {
        let mut kb = [0u8; 128];
        if let Some(m) = output::encode_pdb(&mut kb, s, &pre) {
            raw::write_all(kfd, kb.get(..m).unwrap_or(&[]));
        }
    }
    let ended = slots::PROCESS_ENDED.load(Relaxed);
    output::write_process_end(EndReason::Exec, 0);
    // The file is complete: set the spool aside (the new image removes it).
    let (pid, nonce, tid) = (
        s.pid.load(Relaxed),
        s.nonce.load(Relaxed),
        s.tid.load(Relaxed),
    );
    super::spool::set_aside(pid, nonce, tid, false);
    let r = exec_with_shim(nr, args);
    super::spool::set_aside(pid, nonce, tid, true);
    // Still here: the exec failed. Retract the window and the end records.
    if pos >= 0 {
        // Truncating does not move the file offset: seek back too, or the next write
        // would leave a hole of zeros.
        raw::ftruncate(fd, pos as u64);
        raw::sys3(
            libc::SYS_lseek,
            fd as u64,
            pos as u64,
            libc::SEEK_SET as u64,
        );
    }
    if kpos >= 0 {
        raw::ftruncate(kfd, kpos as u64);
    }
    if ipos >= 0 {
        raw::ftruncate(info, ipos as u64);
    }
    slots::PROCESS_ENDED.store(ended, Relaxed);
    s.unlock_drain();
    r
}

/// Performs the exec with an environment that keeps the shim preloaded and configured.
fn exec_with_shim(nr: u64, args: [u64; 6]) -> i64 {
    let env_arg = if nr == NR_EXECVE { 2 } else { 3 };
    let mut a = args;
    let patched = super::execenv::patch(args[env_arg]);
    if let Some(p) = &patched {
        a[env_arg] = p.envp;
    }
    let r = sys6(nr, a);
    // Still here: the exec failed.
    if let Some(p) = patched {
        p.release();
    }
    r
}

/// `exit` of one thread: its file is ended; the last application thread ends the process.
fn thread_exit(s: &Slot, code: i32) {
    let tid = s.tid.load(Relaxed);
    if tid == slots::PID.load(Relaxed) {
        slots::LEADER_CODE.store(code, Relaxed);
    }
    s.end_reason.store(EndReason::ThreadExit as u32, Release);
    s.state.store(EXITED, Release);
    let left = slots::LIVE.fetch_sub(1, AcqRel) - 1;
    if left <= 0 {
        // The writer (if any) ends the process; without one, flush here.
        if slots::WRITER_ALIVE.load(Acquire) {
            slots::wake_writer();
        } else {
            block_all_signals();
            output::drain_all(Some((
                EndReason::LastThread,
                slots::LEADER_CODE.load(Relaxed),
            )));
        }
    } else {
        slots::wake_writer();
    }
}
