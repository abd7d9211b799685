//! The pipeline reproduces the oracle's instruction sequence for the synthetic loop program.

use drpttracer::decode::testgen::LoopProgram;
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{
    AddressSpace, ImageResolver, PtDecoder, Record, TraceParams, WindowOptions,
};

/// A decoder over `trace` of the loop program in `space` (no sideband), its window
/// numbered `window_id`.
fn loop_decoder<'a>(trace: &'a [u8], space: &AddressSpace, window_id: u64) -> PtDecoder<'a> {
    PtDecoder::new(
        trace,
        TraceParams::default(),
        space.clone(),
        vec![],
        ImageResolver::default(),
        WindowOptions {
            window_id: Some(window_id),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn loop_program_decodes_exactly() {
    let prog = LoopProgram::new(0x40_0000);
    let (trace, bits) = prog.trace(20_000, 1500, 7);
    let expect = prog.simulate(&bits);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let dec = PtDecoder::new(
        &trace,
        TraceParams::default(),
        space,
        vec![],
        ImageResolver::default(),
        WindowOptions::default(),
    )
    .unwrap();
    let recs: Vec<Record> = dec.collect();
    let gaps: Vec<&Record> = recs
        .iter()
        .filter(|r| matches!(r, Record::Gap(_)))
        .collect();
    assert!(gaps.is_empty(), "{gaps:?}");
    let pcs: Vec<u64> = recs
        .iter()
        .filter_map(|r| r.as_instruction())
        .map(|i| i.pc)
        .collect();
    assert!(pcs.len() > 10_000);
    // The trace ends with a return's TIP: the decoder stops at that return, the last
    // instruction the trace accounts for (as ptxed does at `pts_eos`); the oracle runs on
    // to the next branch that would need trace (4 more instructions).
    assert_eq!(&pcs[..], &expect[..pcs.len()]);
    let last = recs.iter().rev().find_map(|r| r.as_instruction()).unwrap();
    assert_eq!(last.class, drpttracer::decode::InsnClass::Return);
    assert_eq!(pcs.len() + 4, expect.len());
}

#[test]
fn parallel_decode_equals_sequential() {
    use drpttracer::decode::parallel::{decode_parallel, split_at_psbs};
    let prog = LoopProgram::new(0x40_0000);
    for (size, psb_every, seed) in [(60_000, 700, 1u64), (30_000, 64, 2), (5_000, 4096, 3)] {
        let (trace, _) = prog.trace(size, psb_every, seed);
        let mut space = AddressSpace::new();
        space.add_bytes("loop", prog.code.clone(), prog.base);
        let opts = WindowOptions {
            window_id: Some(0),
            ..Default::default()
        };
        let seq: Vec<Record> = PtDecoder::new(
            &trace,
            TraceParams::default(),
            space.clone(),
            vec![],
            ImageResolver::default(),
            opts.clone(),
        )
        .unwrap()
        .collect();
        for threads in [1, 2, 3] {
            if threads > 1 && size > 10_000 {
                assert!(split_at_psbs(&trace, threads * 4).len() > 1);
            }
            let par = decode_parallel(
                &trace,
                &TraceParams::default(),
                &space,
                &[],
                &ImageResolver::default(),
                &opts,
                threads,
            )
            .unwrap();
            assert_eq!(
                par.len(),
                seq.len(),
                "size {size} psb {psb_every} threads {threads}"
            );
            let first = par.iter().zip(&seq).position(|(a, b)| a != b);
            assert_eq!(first, None, "size {size} psb {psb_every} threads {threads}");
        }
    }
}

#[test]
fn slices_and_iterator_agree() {
    let prog = LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(8_000, 500, 3);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let mk = || loop_decoder(&trace, &space, 4);
    let by_iter: Vec<Record> = mk().collect();
    let mut dec = mk();
    let mut by_slice = vec![];
    let mut slices = 0;
    while let Some(s) = dec.next_slice() {
        assert!(!s.is_empty());
        by_slice.extend_from_slice(s);
        slices += 1;
    }
    assert_eq!(by_slice, by_iter);
    // Mixing: a few records through the iterator, then slices.
    let mut dec = mk();
    let mut mixed: Vec<Record> = dec.by_ref().take(7).collect();
    while let Some(s) = dec.next_slice() {
        mixed.extend_from_slice(s);
        if let Some(r) = dec.next() {
            mixed.push(r);
        }
    }
    assert_eq!(mixed, by_iter);
    assert_eq!(by_iter[0], Record::WindowId(4));
    assert!(slices > 100 && slices < by_iter.len());
}

#[test]
fn for_each_slice_and_for_each_agree_with_next_slice_and_resume_after_break() {
    use std::ops::ControlFlow;
    let prog = LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(8_000, 500, 5);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let mk = || loop_decoder(&trace, &space, 2);
    // The same slices, boundaries included, as next_slice.
    let mut dec = mk();
    let mut by_next: Vec<Vec<Record>> = vec![];
    while let Some(s) = dec.next_slice() {
        by_next.push(s.to_vec());
    }
    let mut by_each: Vec<Vec<Record>> = vec![];
    let none: Option<()> = mk().for_each_slice(|s| {
        by_each.push(s.to_vec());
        ControlFlow::Continue(())
    });
    assert_eq!(none, None);
    assert_eq!(by_each, by_next);
    let flat: Vec<Record> = by_next.concat();
    assert!(flat.len() > 1000);
    // Iterator::for_each (its own fast path) yields the records in order.
    let mut by_for_each = vec![];
    mk().for_each(|r| by_for_each.push(r));
    assert_eq!(by_for_each, flat);
    // Break every 37 slices, take a few records through the iterator, go on: nothing
    // lost or repeated, and the break value comes back.
    let mut dec = mk();
    let mut mixed = vec![];
    let mut breaks = 0;
    loop {
        let mut n = 0;
        let r = dec.for_each_slice(|s| {
            mixed.extend_from_slice(s);
            n += 1;
            if n == 37 {
                ControlFlow::Break(n)
            } else {
                ControlFlow::Continue(())
            }
        });
        match r {
            Some(37) => breaks += 1,
            Some(other) => panic!("break value {other}"),
            None => break,
        }
        mixed.extend(dec.by_ref().take(3));
    }
    assert!(breaks > 10);
    assert_eq!(mixed, flat);
}

#[test]
fn compact_collection_equals_iteration_and_parallel_compact_equals_sequential() {
    use drpttracer::decode::parallel::decode_parallel_compact;
    let prog = LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(40_000, 300, 9);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let opts = WindowOptions {
        window_id: Some(1),
        ..Default::default()
    };
    let mk = || loop_decoder(&trace, &space, 1);
    let seq: Vec<Record> = mk().collect();
    let compact = mk().collect_compact();
    assert_eq!(compact.len(), seq.len());
    assert_eq!(compact.to_vec(), seq);
    assert!(compact.iter().eq(seq.iter()));
    // Partly consumed by the iterator, the rest compact: still the same sequence.
    let mut d = mk();
    let head: Vec<Record> = d.by_ref().take(1001).collect();
    let mut both = head;
    both.extend(d.collect_compact().to_vec());
    assert_eq!(both, seq);
    for threads in [2, 3, 5] {
        let chunks = decode_parallel_compact(
            &trace,
            &TraceParams::default(),
            &space,
            &[],
            &ImageResolver::default(),
            &opts,
            threads,
        )
        .unwrap();
        assert!(chunks.len() > 1);
        let flat: Vec<Record> = chunks.iter().flat_map(|c| c.iter().cloned()).collect();
        assert_eq!(flat.len(), seq.len(), "threads {threads}");
        assert!(flat == seq, "threads {threads}");
    }
}

/// A decoder that gives only what [`TraceDecoder`] requires (its slices, position and
/// name), so that every consumer runs on the trait's generic versions.
struct SlicesOnly<'a>(PtDecoder<'a>);

impl TraceDecoder for SlicesOnly<'_> {
    fn next_slice(&mut self) -> Option<&[Record]> {
        self.0.next_slice()
    }
    fn position(&self) -> u64 {
        self.0.position()
    }
    fn decoded_by(&self) -> (&'static str, Option<&'static str>) {
        self.0.decoded_by()
    }
}

#[test]
fn the_decoder_seams_generic_consumers_equal_the_pipelines_own() {
    let prog = LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(20_000, 1500, 7);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let want: Vec<Record> = loop_decoder(&trace, &space, 3).collect();
    assert!(want.len() > 20_000);

    // One at a time.
    let generic = SlicesOnly(loop_decoder(&trace, &space, 3));
    let got: Vec<Record> = generic.records().collect();
    assert_eq!(got, want);

    // Slice by slice, and stopping where the consumer says.
    let mut generic = SlicesOnly(loop_decoder(&trace, &space, 3));
    let mut seen = Vec::new();
    let stop = generic.for_each_slice(|s| {
        seen.extend_from_slice(s);
        if seen.len() >= 10_000 {
            std::ops::ControlFlow::Break(seen.len())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    });
    assert_eq!(stop, Some(seen.len()));
    assert_eq!(&seen[..], &want[..seen.len()]);
    // ... and going on from there.
    generic.for_each_slice(|s| {
        seen.extend_from_slice(s);
        std::ops::ControlFlow::<()>::Continue(())
    });
    assert_eq!(seen, want);
    assert_eq!(generic.position(), trace.len() as u64);
    assert_eq!(generic.decoded_by(), ("fast", None));

    // Kept whole: copies in the collection's own arenas equal the pipeline's references
    // into its block cache.
    let copied = SlicesOnly(loop_decoder(&trace, &space, 3)).collect_compact();
    let referenced = loop_decoder(&trace, &space, 3).collect_compact();
    assert_eq!(copied.to_vec(), want);
    assert_eq!(copied, referenced);
    // Fewer entries than slices: consecutive copies join into one reference.
    let slices = {
        let mut d = loop_decoder(&trace, &space, 3);
        std::iter::from_fn(|| d.next_slice().map(|_| ())).count()
    };
    assert!(copied.slices().count() < slices / 100, "{slices} slices");

    // The oracle comparison takes any two decoders.
    let same = drpttracer::decode::check::compare(
        SlicesOnly(loop_decoder(&trace, &space, 3)),
        &mut loop_decoder(&trace, &space, 3),
    )
    .unwrap();
    assert_eq!(same.records, want.len() as u64);
    let other = drpttracer::decode::check::compare(
        SlicesOnly(loop_decoder(&trace, &space, 3)),
        loop_decoder(&trace, &space, 4),
    )
    .unwrap_err();
    assert_eq!(other.record, 0);
    assert_eq!(other.fast, Some(Record::WindowId(3)));
    assert_eq!(other.libipt, Some(Record::WindowId(4)));
}
