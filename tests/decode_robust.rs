//! Robustness: thousands of randomly mutated inputs decode without a panic or a hang, and
//! every gap names an offset inside the input.

use drpttracer::decode::packets::list_packets;
use drpttracer::decode::parallel::decode_parallel;
use drpttracer::decode::sideband::{encode_mmap2, parse_records, TEST_SAMPLE_TYPE};
use drpttracer::decode::testgen::{mutate, LoopProgram, XorShift};
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{
    AddressSpace, ImageResolver, PtDecoder, Record, TraceParams, WindowOptions,
};
use drpttracer::format::{auxtrace, pdb};
use drpttracer::metadata::{PtMetadata, TimeConv};

fn check_records(recs: &[Record], len: usize) {
    for r in recs {
        if let Record::Gap(g) = r {
            assert!(g.pt_offset <= len as u64, "{g} beyond {len}");
            assert!(!g.error.is_empty());
        }
    }
}

#[test]
fn mutated_traces_never_panic() {
    let prog = LoopProgram::new(0x40_0000);
    let (base, _) = prog.trace(3000, 300, 99);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let params = TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    let sb = encode_mmap2(
        1,
        1,
        0x40_0000,
        0x1000,
        0,
        std::path::Path::new("/nonexistent/x"),
        5,
    );
    let events = parse_records("sb", &sb, TEST_SAMPLE_TYPE).unwrap();
    let mut rng = XorShift::new(0x5eed);
    let mut total_gaps = 0usize;
    let mut total_insns = 0usize;
    for n in 0..2500 {
        let t = mutate(&mut rng, &base);
        let opts = WindowOptions {
            source: format!("mutant{n}"),
            ..Default::default()
        };
        let mk = || {
            PtDecoder::new(
                &t,
                params,
                space.clone(),
                events.clone(),
                ImageResolver::default(),
                opts.clone(),
            )
            .unwrap()
        };
        let recs: Vec<Record> = mk().collect();
        check_records(&recs, t.len());
        if n % 5 == 0 {
            // The fast loop yields exactly the iterator's records, errors included.
            let mut by_slices = Vec::with_capacity(recs.len());
            mk().for_each_slice(|s| {
                by_slices.extend_from_slice(s);
                std::ops::ControlFlow::<()>::Continue(())
            });
            assert_eq!(by_slices, recs, "mutant {n}");
        }
        total_gaps += recs.iter().filter(|r| matches!(r, Record::Gap(_))).count();
        total_insns += recs.iter().filter(|r| r.as_instruction().is_some()).count();
        if n % 10 == 0 {
            let par = decode_parallel(
                &t,
                &params,
                &space,
                &events,
                &ImageResolver::default(),
                &opts,
                2,
            )
            .unwrap();
            check_records(&par, t.len());
        }
        let _ = list_packets(&t);
    }
    // The mutations really exercised both decoding and error paths.
    assert!(total_gaps > 500, "{total_gaps}");
    assert!(total_insns > 100_000, "{total_insns}");
}

#[test]
fn mutated_containers_never_panic() {
    let prog = LoopProgram::new(0x40_0000);
    let (pt, _) = prog.trace(1500, 300, 5);
    let wrapped = auxtrace::wrap(&pt, 256, 1, 0);
    let mut w = pdb::PdbWriter::new(1, 1, &PtMetadata::default());
    w.syscall(1, 1, 0, 0, &[1, 2, 3], &pt[..500])
        .syscall(1, 1, 1, 1, &[], &pt[500..]);
    let mut sb = vec![];
    for k in 0..8u64 {
        sb.extend(encode_mmap2(
            1,
            1,
            0x1000 * k,
            0x1000,
            0,
            std::path::Path::new("/x"),
            k,
        ));
    }
    let mut rng = XorShift::new(77);
    for _ in 0..1000 {
        let _ = auxtrace::unwrap(&mutate(&mut rng, &wrapped));
        let m = mutate(&mut rng, &w.buf);
        if let Ok(f) = pdb::parse(&m) {
            for win in &f.windows {
                assert!(win.pt.end <= m.len());
            }
        }
        let _ = parse_records("sb", &mutate(&mut rng, &sb), TEST_SAMPLE_TYPE);
    }
}
