//! Example: trace a loop of this program through the Rust API and print the window.
//!
//! `cargo run --example trace_loop`

use drpttracer::{BackendChoice, Mode, OutputBuffers, Tracer, TracerConfig};

#[inline(never)]
fn sum_odd(n: u64) -> u64 {
    (0..n).filter(|i| i % 2 == 1).sum()
}

fn main() -> Result<(), drpttracer::Error> {
    let mut tracer = Tracer::new(TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: 8,
        sideband_size_shift: 6,
        backend: BackendChoice::from_env()?,
    })?;
    let mut out = OutputBuffers::new(8, 6)?;
    tracer.start()?;
    let s = sum_odd(std::hint::black_box(40));
    let cap = tracer.stop(&mut out)?;
    println!(
        "sum_odd(40) = {s}; {} backend: {} PT bytes, {} sideband bytes, status {}",
        tracer.backend_kind().name(),
        cap.pt_size,
        cap.sideband_size,
        cap.status()
    );
    Ok(())
}
