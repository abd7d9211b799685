//! The emulated backend next to an application that has its own SIGTRAP handler.
//! One test in its own binary: the SIGTRAP disposition is process-wide state.

use std::sync::atomic::{AtomicU32, Ordering};

use drpttracer::emu::{self, oracle};
use drpttracer::{BackendChoice, Mode, OutputBuffers, Status, Tracer, TracerConfig};

static BKPT: AtomicU32 = AtomicU32::new(0);
static STEPS: AtomicU32 = AtomicU32::new(0);
static OTHER: AtomicU32 = AtomicU32::new(0);

extern "C" fn app_trap(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO delivery: info and ctx are the kernel's.
    let code = unsafe { (*info).si_code };
    if code == libc::SI_KERNEL {
        BKPT.fetch_add(1, Ordering::SeqCst);
    } else if code == libc::TRAP_TRACE {
        STEPS.fetch_add(1, Ordering::SeqCst);
        // The application's own single-stepping: one step, then off.
        // SAFETY: ctx is a ucontext_t; clears TF in the saved flags.
        unsafe {
            let uc = ctx.cast::<libc::ucontext_t>();
            (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !0x100;
        }
    } else {
        OTHER.fetch_add(1, Ordering::SeqCst);
    }
}

extern "C" fn late_handler(_sig: libc::c_int) {}

fn install(h: usize, siginfo: bool) {
    // SAFETY: installs a handler that only touches atomics / the ucontext.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = h;
        sa.sa_flags = if siginfo { libc::SA_SIGINFO } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut()), 0);
    }
}

#[inline(never)]
fn breakpoint() {
    // SAFETY: int3 raises SIGTRAP, handled by the application's handler.
    unsafe { core::arch::asm!("int3") };
}

#[inline(never)]
fn app_single_step() {
    // SAFETY: sets TF; the application's handler clears it after one step.
    unsafe {
        core::arch::asm!("pushfq", "or qword ptr [rsp], 0x100", "popfq", "nop", "nop");
    }
}

#[test]
fn application_sigtrap_handler_is_chained_or_refused() {
    install(
        app_trap as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize,
        true,
    );
    let mut t = Tracer::new(TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: 4,
        sideband_size_shift: 4,
        backend: BackendChoice::Emulated,
    })
    .unwrap();
    let mut out = OutputBuffers::new(4, 4).unwrap();
    emu::keep_observed_ips(true);

    // A breakpoint inside a window reaches the application's handler.
    t.start().unwrap();
    breakpoint();
    let cap = t.stop(&mut out).unwrap();
    assert_eq!(cap.status(), Status::Success);
    assert_eq!(BKPT.load(Ordering::SeqCst), 1);
    let rep = emu::take_last_window().unwrap();
    let d = oracle::decode_own_memory(out.pt_data()).unwrap();
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(Some(&d.ips), rep.ips.as_ref());
    assert_eq!(rep.gaps, 0);
    assert!(d.ips.contains(&(breakpoint as *const () as u64)));

    // Outside windows the application's breakpoints and its own stepping still work.
    breakpoint();
    assert_eq!(BKPT.load(Ordering::SeqCst), 2);
    app_single_step();
    assert_eq!(STEPS.load(Ordering::SeqCst), 1);
    assert_eq!(OTHER.load(Ordering::SeqCst), 0);

    // An application that replaces our handler after the first window is refused clearly.
    install(late_handler as extern "C" fn(libc::c_int) as usize, false);
    let e = t.start().unwrap_err();
    assert_eq!(e.status, Status::FailedToStartTracing);
    assert!(e.message.contains("SIGTRAP"), "{}", e.message);
}
