//! End to end: a real window of this process captured by the emulated PT backend, decoded
//! by our pipeline with images from the process's mappings (synthesized MMAP2 records to
//! the real files on disk, and the saved vDSO), reproduces exactly the instruction
//! sequence the emulator observed.

use drpttracer::decode::{decode_window, ImageSpec, Record, TraceParams, WindowOptions};
use drpttracer::emu;
use drpttracer::sideband::synth::{synthesize_exec_mmap2, vdso_bytes};
use drpttracer::{BackendChoice, Mode, OutputBuffers, Status, Tracer, TracerConfig};

#[inline(never)]
fn work(data: &[u64]) -> u64 {
    let mut acc = 0u64;
    for &x in data {
        if x % 3 == 0 {
            acc = acc.wrapping_add(x * 7);
        } else {
            acc ^= x.rotate_left(5);
        }
    }
    // A libc call and a syscall inside the window.
    // SAFETY: getppid has no preconditions.
    acc ^ unsafe { libc::getppid() } as u64
}

#[test]
fn emulated_capture_decodes_exactly() {
    let mut t = match Tracer::new(TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: 6,
        sideband_size_shift: 4,
        backend: BackendChoice::Emulated,
    }) {
        Ok(t) => t,
        Err(e) => {
            println!("SKIP: no emulated tracer here: {e}");
            return;
        }
    };
    let mut out = OutputBuffers::new(6, 4).unwrap();
    // The image before the window: every executable mapping, at time 0 (before the trace).
    let st = t.ext_metadata().sideband_sample_type;
    let initial = synthesize_exec_mmap2(st, 0).unwrap();
    let data = std::hint::black_box([1u64, 2, 3, 4, 5, 6, 9, 10]);
    emu::keep_observed_ips(true);
    t.start().unwrap();
    let r = work(&data);
    let cap = t.stop(&mut out).unwrap();
    let rep = emu::take_last_window().expect("window report");
    assert_eq!(cap.status(), Status::Success);
    assert_ne!(r, 0);
    let observed = rep.ips.clone().expect("observed ips");
    assert!(observed.len() > 50);

    let mut sb = initial;
    sb.extend_from_slice(out.sideband_data());
    let (vaddr, vbytes) = vdso_bytes().unwrap();
    let spec = ImageSpec {
        vdso: Some(vbytes.clone()),
        raw: vec![("[vdso]".into(), vbytes, vaddr)],
        ..Default::default()
    };
    let image = spec.load().unwrap();
    let params = TraceParams::from_ext_metadata(&t.ext_metadata());
    let recs = decode_window(
        out.pt_data(),
        Some((&sb, st)),
        &params,
        &image,
        &spec,
        &WindowOptions {
            source: "emulated window".into(),
            window_id: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let gaps: Vec<_> = recs
        .iter()
        .filter(|r| matches!(r, Record::Gap(_)))
        .collect();
    assert!(gaps.is_empty(), "{gaps:?}");
    let pcs: Vec<u64> = recs
        .iter()
        .filter_map(|r| r.as_instruction())
        .map(|i| i.pc)
        .collect();
    assert_eq!(pcs.len(), observed.len());
    assert!(
        pcs == observed,
        "decoded sequence differs from the emulator's observation"
    );
    // The syscall is visible as a marker.
    assert!(recs.iter().any(|r| matches!(r, Record::Syscall { .. })));
}
