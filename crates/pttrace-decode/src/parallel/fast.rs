//! PSB-parallel decode with the fast decoder, record for record its one-pass result. The
//! driver and the stitching are generic over [`PartDecoding`] (the decoder seam for parts
//! of a trace); the fast decoder's parts are [`PtDecoder`]s.
//!
//! Each segment's decoder synchronizes at its cut's PSB (the first one decodes from the
//! trace's start) and decodes on until it can stop at a later cut: where nothing it walked
//! waits for the trace to confirm it, it passes the cut's PSB+ as one decoder of the whole
//! trace does, keeps the instructions of the block waiting there up to the PSB+'s FUP IP,
//! and hands off its state ([`Handoff`]).
//!
//! The stitching follows the handoffs from the first segment. The decoder that
//! synchronized at the cut continues the records exactly when it started in the handoff's
//! state (tracing on or off, the same IP, the same time, no sync-point timestamp pending,
//! see [`CutStart::joins`]) and never needed the return stack from before its start (it
//! fails then); its first timestamp, emitted whatever it was, is dropped where it repeats
//! the last one before. Where a join fails, this thread decodes on from the handoff
//! itself, in the exact state. Where the fast decoder leaves anything to libipt, the
//! caller decodes another way.
//!
//! [`Handoff`]: crate::pipeline::flow::Handoff
//! [`CutStart::joins`]: crate::pipeline::flow::CutStart::joins

use super::{Inputs, Segment};
use crate::decoder::{CutHandoff, CutJoin, DecodedPart, PartDecoding, PartStart};
use crate::pipeline::flow::{CutStart, Handoff};
use crate::pipeline::{CompactRecords, DecoderCaches, PtDecoder};
use crate::records::Record;
use crate::DecodeError;

/// Trace before a cut's PSB that its decoder's clock warms up on in a cycle-accurate
/// trace (at most; from the first PSB in it): PSBs come every few KiB, calibrating MTCs
/// far more often.
pub(super) const WARM_UP: usize = 16 * 1024;

/// The fast decoder's parts: [`PtDecoder`]s of the trace from a cut on.
impl PartDecoding for Inputs<'_> {
    type Handoff = Handoff;
    type Start = CutStart;
    type Caches = DecoderCaches;

    fn decode_part(
        &self,
        part: usize,
        from: usize,
        start: PartStart<Handoff>,
        cuts: Vec<(usize, usize)>,
        caches: &mut DecoderCaches,
    ) -> Result<DecodedPart<Self>, DecodeError> {
        // A later cut's decoder warms its clock up on the trace before its PSB, from an
        // earlier PSB within WARM_UP bytes (cycle-accurate time's calibration).
        let before = match start {
            PartStart::Cut if self.warm_up => {
                let lo = from.saturating_sub(WARM_UP);
                let head = self.trace.get(lo..from).unwrap_or(&[]);
                crate::wire::find_psb(head, 0).map_or(&[][..], |p| &head[p..])
            }
            _ => &[],
        };
        let mut dec = PtDecoder::new_part(
            &self.trace[from..],
            before,
            *self.params,
            self.image.clone(),
            self.resolver.clone(),
            self.options_from(from, part),
            start,
            cuts,
        )?
        .with_caches(std::mem::take(caches));
        let out = dec.collect_part();
        *caches = dec.take_caches();
        Ok(out)
    }
}

/// Decodes from segment `k`'s cut (or the trace's start) as `start` says, on to the first
/// later cut where the decoder can stop.
fn part<P: PartDecoding>(
    parts: &P,
    segs: &[Segment],
    k: usize,
    start: PartStart<P::Handoff>,
    caches: &mut P::Caches,
) -> Result<DecodedPart<P>, DecodeError> {
    let from = match start {
        PartStart::Trace => 0,
        _ => segs[k].start,
    };
    let cuts = segs
        .iter()
        .enumerate()
        .skip(k + 1)
        .map(|(j, s)| (s.start - from, j))
        .collect();
    parts.decode_part(k, from, start, cuts, caches)
}

/// The records of one pass of `parts`' decoder over the trace, decoded on `threads`
/// threads; `None` where a part's decoder cannot give them (`source`: the trace's name in
/// errors).
pub(super) fn decode<P: PartDecoding>(
    parts: &P,
    source: &str,
    segs: &[Segment],
    threads: usize,
    stats: &mut super::ParallelStats,
) -> Result<Option<Vec<CompactRecords>>, DecodeError> {
    let n = segs.len();
    let results = super::on_workers(n, threads, P::Caches::default, |caches, k| {
        let start = if k == 0 {
            PartStart::Trace
        } else {
            PartStart::Cut
        };
        part(parts, segs, k, start, caches)
    });
    let mut done = Vec::with_capacity(n);
    for (k, m) in results.into_iter().enumerate() {
        let r = m.unwrap_or_else(|| {
            Err(DecodeError::new(
                source,
                segs[k].start as u64,
                "decoder thread failed",
            ))
        });
        done.push(Some(r?));
    }

    // Where calibrated state may show in the records (cycle-accurate time: a CYC packet):
    // at a cut from which any part (or a failed one, which cannot tell) used it.
    let mut calibrated_from = vec![false; n + 1];
    for k in (0..n).rev() {
        let used = done[k]
            .as_ref()
            .is_none_or(|(_, r)| r.calibrated || r.failed.is_some());
        calibrated_from[k] = calibrated_from[k + 1] || used;
    }

    // Stitch: follow the handoffs from the first segment.
    let Some((recs, mut report)) = done.first_mut().and_then(Option::take) else {
        return Ok(None);
    };
    let mut out = vec![recs];
    let mut caches = P::Caches::default();
    loop {
        if report.failed.is_some() {
            return Ok(None);
        }
        let Some(h) = report.end.take() else {
            return Ok(Some(out));
        };
        let joined = done.get_mut(h.cut()).and_then(|d| {
            let joins = d.as_ref().is_some_and(|(_, r)| {
                let calibration = calibrated_from.get(h.cut()).is_none_or(|&c| c);
                r.failed.is_none()
                    && r.start
                        .as_ref()
                        .is_some_and(|start| start.joins(&h, calibration))
            });
            if joins {
                d.take()
            } else {
                None
            }
        });
        match joined {
            Some((mut recs, mut next)) => {
                let repeats = next.timestamped
                    && recs.first_marker(is_timestamp).is_some_and(|r| {
                        matches!(r, Record::Timestamp { tsc, .. } if Some(*tsc) == h.last_timestamp())
                    });
                if repeats {
                    recs.drop_first_marker(is_timestamp);
                }
                next.end = next.end.map(|e| e.after(&h));
                // Parts it decoded through without stopping are not used.
                let upto = next.end.as_ref().map_or(n, CutHandoff::cut);
                for d in done.iter_mut().take(upto).skip(h.cut() + 1) {
                    *d = None;
                }
                stats.joined += 1;
                out.push(recs);
                report = next;
            }
            None => {
                let cut = h.cut();
                // (Its own decode is not used: freed before decoding it again.)
                if let Some(d) = done.get_mut(cut) {
                    *d = None;
                }
                let (recs, next) = part(
                    parts,
                    segs,
                    cut,
                    PartStart::Handoff(Box::new(h)),
                    &mut caches,
                )?;
                // Parts it decoded through without stopping are not used either.
                let upto = next.end.as_ref().map_or(n, CutHandoff::cut);
                for d in done.iter_mut().take(upto).skip(cut + 1) {
                    *d = None;
                }
                stats.redecoded += 1;
                out.push(recs);
                report = next;
            }
        }
    }
}

fn is_timestamp(r: &Record) -> bool {
    matches!(r, Record::Timestamp { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::LoopProgram;
    use crate::{ImageResolver, TraceParams, WindowOptions};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A part decoder of its own: the fast decoder's parts, each start counted by kind
    /// and the second part's synchronized start spoiled on request (so that its join
    /// fails and the driver must decode on from the handoff).
    struct Watched<'t> {
        inner: Inputs<'t>,
        traced: AtomicUsize,
        cut: AtomicUsize,
        handoff: AtomicUsize,
        spoil: bool,
    }

    impl PartDecoding for Watched<'_> {
        type Handoff = Handoff;
        type Start = CutStart;
        type Caches = DecoderCaches;

        fn decode_part(
            &self,
            part: usize,
            from: usize,
            start: PartStart<Handoff>,
            cuts: Vec<(usize, usize)>,
            caches: &mut DecoderCaches,
        ) -> Result<DecodedPart<Self>, DecodeError> {
            let counter = match &start {
                PartStart::Trace => &self.traced,
                PartStart::Cut => &self.cut,
                PartStart::Handoff(_) => &self.handoff,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let spoil = self.spoil && part == 1 && matches!(start, PartStart::Cut);
            let (recs, mut report) = self.inner.decode_part(part, from, start, cuts, caches)?;
            if spoil {
                if let Some(s) = report.start.as_mut() {
                    s.ip = s.ip.map(|ip| ip ^ 1);
                }
            }
            Ok((recs, report))
        }
    }

    #[test]
    fn the_parallel_driver_is_generic_over_part_decoders_and_redecodes_where_a_join_fails() {
        let prog = LoopProgram::new(0x40_0000);
        let (trace, _) = prog.trace(256 << 10, 4096, 7);
        let mut space = crate::AddressSpace::new();
        space.add_bytes("loop", prog.code.clone(), prog.base);
        let params = TraceParams::default();
        let opts = WindowOptions::default();
        let resolver = ImageResolver::default();
        let inputs = || Inputs {
            trace: &trace,
            params: &params,
            image: &space,
            events: &[],
            resolver: &resolver,
            opts: &opts,
            warm_up: false,
        };
        let one_pass = inputs().sequential().unwrap().0;
        let want: Vec<Record> = one_pass.iter().cloned().collect();
        assert!(want.len() > 100_000, "{} records", want.len());
        let segs = super::super::split_at_psbs(&trace, 8);
        assert_eq!(segs.len(), 8);
        for spoil in [false, true] {
            let w = Watched {
                inner: inputs(),
                traced: AtomicUsize::new(0),
                cut: AtomicUsize::new(0),
                handoff: AtomicUsize::new(0),
                spoil,
            };
            let mut stats = super::super::ParallelStats::default();
            let out = decode(&w, "loop.pt", &segs, 2, &mut stats)
                .unwrap()
                .expect("the fast decoder's parts");
            let got: Vec<Record> = out.iter().flat_map(|c| c.iter().cloned()).collect();
            assert_eq!(got.len(), want.len(), "spoil {spoil}");
            assert!(got == want, "spoil {spoil}: the stitched records differ");
            assert_eq!(w.traced.load(Ordering::Relaxed), 1);
            assert_eq!(w.cut.load(Ordering::Relaxed), 7);
            // Every join holds, except the spoiled one: the driver decodes that part
            // again from the handoff (and on from there, joining the next cut).
            let redecoded = usize::from(spoil);
            assert_eq!(w.handoff.load(Ordering::Relaxed), redecoded);
            assert_eq!((stats.joined, stats.redecoded), (7 - redecoded, redecoded));
        }
    }
}
