//! PSB-parallel decode with the fast decoder, record for record its one-pass result.
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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{Inputs, Segment};
use crate::pipeline::flow::{PartReport, PartStart};
use crate::pipeline::{CompactRecords, DecoderCaches, PtDecoder};
use crate::records::Record;
use crate::DecodeError;

impl Inputs<'_> {
    /// Decodes from segment `k`'s cut (or the trace's start) as `start` says, on to the
    /// first later cut where the decoder can stop.
    fn part(
        &self,
        segs: &[Segment],
        k: usize,
        start: PartStart,
        caches: &mut DecoderCaches,
    ) -> Result<(CompactRecords, PartReport), DecodeError> {
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
        let mut dec = PtDecoder::new_part(
            &self.trace[from..],
            *self.params,
            self.image.clone(),
            self.resolver.clone(),
            self.options_from(from, k),
            start,
            cuts,
        )?
        .with_caches(std::mem::take(caches));
        let out = dec.collect_part();
        *caches = dec.take_caches();
        Ok(out)
    }
}

/// The records of one fast decoder's pass over the trace, decoded on `threads` threads;
/// `None` where the fast decoder leaves the trace to libipt.
pub(super) fn decode(
    inputs: &Inputs<'_>,
    segs: &[Segment],
    threads: usize,
    stats: &mut super::ParallelStats,
) -> Result<Option<Vec<CompactRecords>>, DecodeError> {
    let n = segs.len();
    type Slot = Mutex<Option<Result<(CompactRecords, PartReport), DecodeError>>>;
    let results: Vec<Slot> = segs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.min(n) {
            s.spawn(|| {
                let mut caches = DecoderCaches::default();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        break;
                    }
                    let start = if k == 0 {
                        PartStart::Trace
                    } else {
                        PartStart::Cut
                    };
                    let r = inputs.part(segs, k, start, &mut caches);
                    if let Ok(mut slot) = results[k].lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    let mut done = Vec::with_capacity(n);
    for (k, m) in results.into_iter().enumerate() {
        let r = m.into_inner().ok().flatten().unwrap_or_else(|| {
            Err(DecodeError::new(
                &inputs.opts.source,
                segs[k].start as u64,
                "decoder thread failed",
            ))
        });
        done.push(Some(r?));
    }

    // Stitch: follow the handoffs from the first segment.
    let Some((recs, mut report)) = done.first_mut().and_then(Option::take) else {
        return Ok(None);
    };
    let mut out = vec![recs];
    let mut caches = DecoderCaches::default();
    loop {
        if report.failed.is_some() {
            return Ok(None);
        }
        let Some(h) = report.end.take() else {
            return Ok(Some(out));
        };
        let joined = done.get_mut(h.cut).and_then(|d| {
            let joins = d.as_ref().is_some_and(|(_, r)| {
                r.failed.is_none() && r.start.is_some_and(|start| start.joins(&h))
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
                    matches!(r, Record::Timestamp { tsc, .. } if Some(*tsc) == h.last_timestamp)
                });
                if repeats {
                    recs.drop_first_marker(is_timestamp);
                }
                next.end = next.end.map(|e| e.after(&h));
                stats.joined += 1;
                out.push(recs);
                report = next;
            }
            None => {
                let cut = h.cut;
                let (recs, next) =
                    inputs.part(segs, cut, PartStart::Handoff(Box::new(h)), &mut caches)?;
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
