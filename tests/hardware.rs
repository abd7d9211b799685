//! Real Intel PT through perf: runs only where the `intel_pt` PMU exists, otherwise prints
//! `SKIP: <reason>` and checks the actionable error instead.

use drpttracer::perf::pmu::IntelPtPmu;
use drpttracer::{BackendChoice, Mode, OutputBuffers, Status, Tracer, TracerConfig};

#[inline(never)]
fn work(n: u64) -> u64 {
    (0..n).fold(0, |a, i| if i % 3 == 0 { a + i } else { a ^ i })
}

#[test]
fn user_mode_window_on_hardware() {
    let cfg = TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: 6,
        sideband_size_shift: 4,
        backend: BackendChoice::Hardware,
    };
    if let Err(e) = IntelPtPmu::probe() {
        println!("SKIP: no Intel PT hardware: {}", e.message);
        let err = Tracer::new(cfg).unwrap_err();
        assert_eq!(err.status, Status::FailedToOpenPerfEvent);
        assert!(err.message.contains("intel_pt"), "{}", err.message);
        return;
    }
    let mut t = Tracer::new(cfg).expect("hardware handle");
    let mut out = OutputBuffers::new(6, 4).unwrap();
    for _ in 0..3 {
        t.start().unwrap();
        std::hint::black_box(work(std::hint::black_box(1000)));
        let cap = t.stop(&mut out).unwrap();
        assert_eq!(cap.status(), Status::Success);
        assert!(cap.pt_size > 16);
        // PT starts with a PSB: 02 82 repeated 8 times.
        assert_eq!(&out.pt_data()[..16], &[2, 0x82].repeat(8)[..]);
        assert!(cap.sideband_size > 0);
    }
}
