//! Emulated PT backend throughput: instructions traced per second (single-step capture +
//! PT encoding) next to the cost of a bare EFLAGS.TF single-step loop (a SIGTRAP handler that
//! only counts), measured in the same run on the same asm loop, and their ratio.
//!
//! Run: `cargo bench --bench emu` (optional argument: loop iterations, default 100000).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use drpttracer::emu;
use drpttracer::{BackendChoice, Mode, OutputBuffers, Tracer, TracerConfig};

static BARE_TRAPS: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_trap(_sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    BARE_TRAPS.fetch_add(1, Ordering::Relaxed);
}

/// `n` iterations of dec/jnz (2n instructions).
#[inline(never)]
fn asm_loop(n: u64) {
    // SAFETY: register-only loop.
    unsafe {
        core::arch::asm!("3:", "dec {c}", "jnz 3b", c = inout(reg) n => _);
    }
}

/// The same loop with TF set around it and a counting handler: the bare stepping cost.
#[inline(never)]
fn bare_stepped_loop(n: u64) {
    // SAFETY: TF set and cleared around a register-only loop; the SIGTRAP handler installed
    // by the caller only counts.
    unsafe {
        core::arch::asm!(
            "pushfq",
            "or qword ptr [rsp], 0x100",
            "popfq",
            "3:",
            "dec {c}",
            "jnz 3b",
            "pushfq",
            "and qword ptr [rsp], -257",
            "popfq",
            c = inout(reg) n => _,
        );
    }
}

fn set_sigtrap(handler: usize, siginfo: bool) {
    // SAFETY: installs a counting handler or restores the default disposition.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = if siginfo { libc::SA_SIGINFO } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut());
    }
}

fn main() {
    let iters: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);

    // 1. Bare TF stepping: counting handler only (installed before the backend's handler).
    set_sigtrap(
        count_trap as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize,
        true,
    );
    bare_stepped_loop(1000); // warm-up
    BARE_TRAPS.store(0, Ordering::Relaxed);
    let t0 = Instant::now();
    bare_stepped_loop(iters);
    let bare = t0.elapsed();
    let bare_traps = BARE_TRAPS.load(Ordering::Relaxed);
    set_sigtrap(libc::SIG_DFL, false);
    let bare_ns = bare.as_nanos() as f64 / bare_traps as f64;

    // 2. The emulated backend on the same loop, through the Tracer API.
    let mut t = Tracer::new(TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: 10,
        sideband_size_shift: 4,
        backend: BackendChoice::Emulated,
    })
    .expect("emulated tracer");
    let mut out = OutputBuffers::new(10, 4).expect("output");
    emu::keep_window_reports(true);
    t.start().expect("start");
    asm_loop(1000); // warm-up window
    t.stop(&mut out).expect("stop");
    let _ = emu::take_last_window();

    let t0 = Instant::now();
    t.start().expect("start");
    asm_loop(iters);
    let t1 = Instant::now();
    let cap = t.stop(&mut out).expect("stop");
    let t2 = Instant::now();
    let rep = emu::take_last_window().expect("report");
    let total = t2 - t0;
    let capture = t1 - t0;
    let encode = t2 - t1;
    let insns = rep.instructions as f64;
    let traced_rate = insns / total.as_secs_f64();
    let bare_rate = 1e9 / bare_ns;

    println!("emulated PT backend benchmark ({iters} iterations of dec/jnz)");
    println!(
        "  bare TF single-step:   {bare_traps} traps in {:.3} s = {:.2} us/instruction = {:.0} instructions/s",
        bare.as_secs_f64(),
        bare_ns / 1000.0,
        bare_rate
    );
    println!(
        "  emulated backend:      {} instructions ({} steps) in {:.3} s (capture {:.3} s + stop/encode {:.3} s) = {:.0} instructions/s, {:.2} us/instruction",
        rep.instructions,
        rep.steps,
        total.as_secs_f64(),
        capture.as_secs_f64(),
        encode.as_secs_f64(),
        traced_rate,
        1e6 / traced_rate
    );
    println!(
        "  PT: {} bytes ({:.3} bytes/instruction), status {:?}",
        cap.pt_size,
        cap.pt_size as f64 / insns,
        cap.status()
    );
    println!(
        "  ratio emulated/bare throughput: {:.2} (1.00 = capture+encode cost no more than bare stepping)",
        traced_rate / bare_rate
    );
    println!(
        "  encode rate alone: {:.0} instructions/s",
        insns / encode.as_secs_f64()
    );
    println!(
        "  single steps reported as TRAP_BRKPT (hypervisor DR6 quirk): {}",
        emu::trap::odd_dr6_steps()
    );
}
