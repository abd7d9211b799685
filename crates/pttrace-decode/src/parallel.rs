//! Parallel decode by PSB segments (libipt's "Parallel Decode"), record for record the
//! sequential result, timestamps and gaps included.
//!
//! The trace is cut at PSBs (each PSB+ ending with PSBEND, holding MODE.Exec, and a TSC
//! where the trace has any) into segments. Segment `k`'s decoder synchronizes at its PSB
//! (the first one decodes from the trace's start, as sequential decode does) and decodes
//! on until the PSB+ of a later segment, where it hands over: right there if tracing is
//! disabled at that PSB+; else where the records after it reach the PSB+'s FUP IP, where
//! the next decoder starts (the instructions decoded straight before that stay with this
//! decoder). Its records up to there are the sequential decoder's.
//!
//! A decoder that starts at a PSB knows nothing of what came before. At each handover
//! the stitching checks that the sequential decoder's state there (as the earlier
//! decoder reports it) gives the records the later decoder gave from its fresh start:
//! - the time: the TSC libipt has after the PSB+, and ours;
//! - the pending sync-point timestamp (the later decoder starts with a guess);
//! - the last timestamp emitted: the later decoder emits its first timestamp whatever it
//!   is; the stitching drops it where it repeats the earlier one (as sequential does);
//! - the sideband events applied (the later decoder applies those before its time);
//! - libipt's state when the sequential decoder decoded through the PSB+ rather than
//!   synchronizing there: its return-compression stack (a later decoder that ran out of
//!   it is suspect) and its calibration for cycle-accurate time (a segment where libipt
//!   could meet a CYC packet is suspect);
//! - libipt's block cache, which sequential decode has filled with everything before:
//!   its results differ only where the execution mode changes or is not known, and only
//!   our gaps inside blocks depend on where libipt ends its blocks (those segments are
//!   suspect; traces with more than one execution mode decode in one pass).
//!
//! Where a check fails (errors near a cut, odd traces), the earlier segment is decoded
//! again on this thread, from its start with the now known exact state, on through later
//! cuts until one passes (and where that decode is itself suspect, the whole trace in one
//! pass). Windows with sideband loss records decode in one pass.

mod fast;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::config::TraceParams;
use super::decoder::TraceDecoder;
use super::image::AddressSpace;
use super::ipt::{
    cyc_possible, has_tsc, psb_offsets, psb_offsets_parallel, psb_positions, PsbInfo,
};
use super::pipeline::{
    CompactRecords, FirstGap, Handover, Mark, PtDecoder, SegCtl, SegReport, SegStart, WindowOptions,
};
use super::records::Record;
use super::sideband::{ImageEvent, ImageResolver};
use super::DecodeError;

/// Runs `work(state, k)` for every `k` in `0..n` on `workers` scoped threads: each takes
/// the next `k` no other has taken, with a state of its own made by `init` (its caches).
/// The results come back in `k` order (`None` for a `k` whose worker gave nothing).
pub fn on_workers<S, R: Send>(
    n: usize,
    workers: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, usize) -> R + Sync,
) -> Vec<Option<R>> {
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, n.max(1)) {
            s.spawn(|| {
                let mut state = init();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(slot) = results.get(k) else {
                        break;
                    };
                    let r = work(&mut state, k);
                    if let Ok(mut slot) = slot.lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| m.into_inner().ok().flatten())
        .collect()
}

/// A chunk of the trace starting at a PSB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: usize,
    pub end: usize,
    /// FUP of the chunk's first PSB+ (tracing enabled there).
    pub fup: Option<u64>,
    /// Offset of the PSBEND that ends the chunk's first PSB+.
    pub psbend: usize,
}

/// Whether a PSB can start a segment: a complete PSB+ (PSBEND) that sets the execution
/// mode, and the time when other PSB+ do.
fn cut_point(p: &PsbInfo, timed: bool) -> Option<usize> {
    let psbend = p.psbend.and_then(|o| usize::try_from(o).ok())?;
    (p.mode_exec && (p.tsc.is_some() || !timed)).then_some(psbend)
}

/// Cuts `trace` into about `want` chunks of similar size at PSB boundaries. Bytes before
/// the first PSB cannot be decoded by anyone and belong to no chunk.
pub fn split_at_psbs(trace: &[u8], want: usize) -> Vec<Segment> {
    split(trace, &psb_offsets(trace), want)
}

fn split(trace: &[u8], psbs: &[PsbInfo], want: usize) -> Vec<Segment> {
    let Some(first) = psbs.first() else {
        return Vec::new();
    };
    let timed = psbs.iter().any(|p| p.tsc.is_some());
    let want = want.max(1);
    let target = (trace.len() / want).max(1);
    let mut segs: Vec<Segment> = Vec::new();
    let mut cur = Segment {
        start: first.offset as usize,
        end: trace.len(),
        fup: first.fup,
        psbend: first.psbend.map_or(first.offset as usize, |o| o as usize),
    };
    for p in &psbs[1..] {
        let off = p.offset as usize;
        let Some(psbend) = cut_point(p, timed) else {
            continue;
        };
        if off - cur.start >= target && segs.len() + 1 < want {
            cur.end = off;
            segs.push(cur);
            cur = Segment {
                start: off,
                end: trace.len(),
                fup: p.fup,
                psbend,
            };
        }
    }
    segs.push(cur);
    segs
}

/// Marks a segment's decoder may pass (where it could not stop) before it gives up.
const MISSED_MARKS: usize = 2;

/// Chunks per decoding thread: small enough that the last ones leave little idle time,
/// large enough that cutting costs little.
pub const CHUNKS_PER_THREAD: usize = 16;

/// How many libipt decoders one pass of the fast decoder is worth (it runs at 4-4.5x
/// libipt's block decoder in wall time, 5x by instruction count: `cargo bench --bench
/// decode`).
const FAST_PASSES: usize = 4;

/// Decodes `trace` on `threads` threads and returns records identical to one
/// [`PtDecoder`] pass over the whole trace. Chunks ([`CHUNKS_PER_THREAD`] per thread)
/// are handed out in order.
pub fn decode_parallel(
    trace: &[u8],
    params: &TraceParams,
    image: &AddressSpace,
    events: &[ImageEvent],
    resolver: &ImageResolver,
    opts: &WindowOptions,
    threads: usize,
) -> Result<Vec<Record>, DecodeError> {
    let chunks = decode_parallel_compact(trace, params, image, events, resolver, opts, threads)?;
    let mut out = Vec::with_capacity(chunks.iter().map(CompactRecords::len).sum());
    for c in &chunks {
        for s in c.slices() {
            out.extend_from_slice(s);
        }
    }
    Ok(out)
}

/// What decoding a trace needs besides the bytes.
struct Inputs<'t> {
    trace: &'t [u8],
    params: &'t TraceParams,
    image: &'t AddressSpace,
    events: &'t [ImageEvent],
    resolver: &'t ImageResolver,
    opts: &'t WindowOptions,
    /// The fast decoder's parts warm their clocks up before their cuts (cycle-accurate
    /// time, see `fast::WARM_UP`).
    warm_up: bool,
}

impl<'t> Inputs<'t> {
    /// The options of a decoder of segment `k` whose buffer starts at byte `from`: its
    /// offsets the trace's, and the window's leading records only in the first one.
    fn options_from(&self, from: usize, k: usize) -> WindowOptions {
        let mut o = WindowOptions {
            base_offset: self.opts.base_offset + from as u64,
            ..self.opts.clone()
        };
        if k > 0 {
            o.window_id = None;
            o.cpu = None;
        }
        o
    }

    /// One decoder over the whole trace: its records, and who decoded them
    /// ([`TraceDecoder::decoded_by`]).
    fn sequential(&self) -> Result<(CompactRecords, DecodedBy), DecodeError> {
        let mut dec = PtDecoder::new(
            self.trace,
            *self.params,
            self.image.clone(),
            self.events.to_vec(),
            self.resolver.clone(),
            self.opts.clone(),
        )?;
        let records = dec.collect_compact_mut();
        Ok((records, dec.decoded_by()))
    }

    /// Decodes from segment `k`'s start (the trace's start for 0) in state `state`,
    /// stopping at a mark where `stop` says so (or giving up after passing `give_up`).
    fn segment<'s>(
        &self,
        segs: &[Segment],
        k: usize,
        state: SegStart,
        stop: Box<dyn FnMut(&Handover) -> bool + 's>,
        give_up: Option<usize>,
    ) -> Result<(CompactRecords, SegReport), DecodeError>
    where
        't: 's,
    {
        let from = if k == 0 { 0 } else { segs[k].start };
        let marks = segs
            .iter()
            .enumerate()
            .skip(k + 1)
            .take(give_up.map_or(usize::MAX, |g| g + 1))
            .map(|(j, s)| Mark {
                index: j,
                psb: (s.start - from) as u64,
                psbend: (s.psbend - from) as u64,
            })
            .collect();
        let o = self.options_from(from, k);
        let start = SegStart {
            psbend: (k > 0).then(|| (segs[k].psbend - from) as u64),
            ..state
        };
        let dec = PtDecoder::new_segment(
            &self.trace[from..],
            *self.params,
            self.image.clone(),
            self.events.to_vec(),
            self.resolver.clone(),
            o,
            SegCtl::new(start, marks, stop, give_up),
        )?;
        Ok(dec.collect_segment())
    }
}

/// The sequential decoder's state where a segment's decoder starts (see [`Handover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Incoming {
    pending_timestamp: bool,
    last_timestamp: Option<u64>,
    tsc: Option<u64>,
    timeline: usize,
}

impl Incoming {
    /// The state at handover `h` of a decoder that started in state `self`.
    fn after(&self, h: &Handover) -> Incoming {
        Incoming {
            pending_timestamp: h.pending_timestamp,
            last_timestamp: h.last_timestamp.unwrap_or(self.last_timestamp),
            tsc: h.tsc.or(self.tsc),
            timeline: h.timeline.unwrap_or(self.timeline),
        }
    }
}

/// Whether the decoder of the segment starting at `h`'s mark, which reported `r`,
/// continues the sequential records exactly when the sequential state there is `inc`.
fn joins(h: &Handover, inc: &Incoming, r: &SegReport, cyc: bool) -> bool {
    let Some((at_start, event_tsc, pending)) = r.start else {
        return false;
    };
    let timeline = match r.first_advance {
        Some(applied) => inc.timeline <= applied,
        None => inc.timeline == 0,
    };
    at_start
        && !r.unknown_mode
        && !r.block_bound
        && h.event_tsc == event_tsc
        && inc.tsc == event_tsc
        && inc.pending_timestamp == pending
        && timeline
        // Decoded through the PSB+: libipt kept its return stack and its calibration for
        // cycle-accurate time (`cyc`: the later decoder may have met a CYC packet).
        && (h.via_sync || (!cyc && !r.first_gap.is_some_and(FirstGap::is_retstack_empty)))
}

/// A segment decode accepted into the result: its records are the sequential ones.
struct Run {
    /// The segment it started at, the state there, how it was reached.
    seg: usize,
    incoming: Incoming,
    via: Option<Handover>,
    recs: CompactRecords,
    report: SegReport,
}

/// Like [`decode_parallel`], but returns the stitched chunks in compact form (their
/// concatenation is the sequential result; see [`PtDecoder::collect_compact`]). This is
/// the fast path: no per-instruction copies.
pub fn decode_parallel_compact(
    trace: &[u8],
    params: &TraceParams,
    image: &AddressSpace,
    events: &[ImageEvent],
    resolver: &ImageResolver,
    opts: &WindowOptions,
    threads: usize,
) -> Result<Vec<CompactRecords>, DecodeError> {
    decode_parallel_stats(trace, params, image, events, resolver, opts, threads).map(|(r, _)| r)
}

/// How a parallel decode went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParallelStats {
    /// Who decoded the segments: `"fast"` (the fast decoder), `"libipt"`, or `"one pass"`
    /// (one decoder over the whole trace: one segment, or the stitching gave up).
    pub by: &'static str,
    /// Segments the trace was cut into.
    pub segments: usize,
    /// Handovers where the next segment's own decode joined, and segments decoded again
    /// on the stitching thread (fast decoder).
    pub joined: usize,
    pub redecoded: usize,
    /// For `"one pass"`: who that decoder was ([`TraceDecoder::decoded_by`]).
    pub one_pass_by: Option<DecodedBy>,
}

/// Who decoded a trace, and why libipt where the fast decoder handed it over.
pub type DecodedBy = (&'static str, Option<&'static str>);

/// [`decode_parallel_compact`] and how it went.
pub fn decode_parallel_stats(
    trace: &[u8],
    params: &TraceParams,
    image: &AddressSpace,
    events: &[ImageEvent],
    resolver: &ImageResolver,
    opts: &WindowOptions,
    threads: usize,
) -> Result<(Vec<CompactRecords>, ParallelStats), DecodeError> {
    let inputs = Inputs {
        trace,
        params,
        image,
        events,
        resolver,
        opts,
        warm_up: false,
    };
    let threads = threads.max(1);
    // Loss records are reported once, where the trace's time passes them; a chunk cannot
    // know which of them earlier chunks already reported, so such windows decode in one
    // pass (same result, no speed-up).
    let has_losses = events
        .iter()
        .any(|e| matches!(e.change, super::sideband::ImageChange::Lost { .. }));
    let psbs = if has_losses {
        Vec::new()
    } else {
        psb_offsets_parallel(trace, threads)
    };
    let segs = split(trace, &psbs, threads * CHUNKS_PER_THREAD);
    // (Resync after errors goes on from where the error was, which a decoder starting at
    // a later PSB cannot know: one pass. So do iflags events: whether a MODE.Exec after a
    // PSB+ changes IF depends on the PSB+ before, which a later decoder has not read.)
    if segs.len() <= 1 || opts.resync_on_error || opts.iflags_events {
        return one_pass(&inputs, segs.len());
    }
    // The fast decoder where it decodes the whole trace (no sideband, no filters); else
    // libipt's segments below.
    if opts.decoder == super::DecoderKind::Fast
        && events.is_empty()
        && params.filter.ranges.iter().all(|r| r.0 == 0)
    {
        // Cycle-accurate time: the calibration carried over a cut's PSB is the one pass's
        // only where the part's clock warmed up on the trace before it. Cycle-accurate
        // mode is the capture's setting, so the trace's start tells whether it is on
        // (where CYC packets come later only, the segments before are decoded again).
        let inputs = Inputs {
            warm_up: cyc_near_start(trace),
            ..inputs
        };
        let mut stats = ParallelStats {
            by: "fast",
            segments: segs.len(),
            ..Default::default()
        };
        if let Some(out) = fast::decode(&inputs, &opts.source, &segs, threads, &mut stats)? {
            return Ok((out, stats));
        }
    }
    // Sideband that changes the image during the window: the fast decoder follows it in
    // one pass, libipt in segments; one fast pass is quicker than that many libipt ones.
    if opts.decoder == super::DecoderKind::Fast && !events.is_empty() && threads <= FAST_PASSES {
        return one_pass(&inputs, segs.len());
    }
    let n = segs.len();
    let workers = threads.min(n);

    // Could libipt meet a CYC packet in a segment? Its cycle-accurate time calibration
    // carries over PSBs, which a decoder starting at one cannot know.
    let positions = psb_positions(trace);
    let bounds = |k: usize| {
        let from = if k == 0 { 0 } else { segs[k].start as u64 };
        let to = segs
            .get(k + 1)
            .map_or(trace.len() as u64, |s| s.start as u64);
        (from, to)
    };

    // Every segment on its own, in parallel. Segments after the first start with the
    // pending-timestamp flag of a decoder that passed timed trace before (it stays set
    // where no TSC came yet) and an unknown last timestamp.
    let later = SegStart {
        pending_timestamp: Some(!psbs.iter().any(|p| p.tsc.is_some())),
        last_timestamp: None,
        tsc: None,
        // (What one pass over the whole trace sees.)
        trace_has_tsc: params.time.is_some() && has_tsc(trace),
        psbend: None,
    };
    let first = SegStart {
        pending_timestamp: None,
        last_timestamp: Some(None),
        ..later
    };
    let results = on_workers(
        n,
        workers,
        || (),
        |_, k| {
            let (from, to) = bounds(k);
            let cyc = cyc_possible(trace, &positions, from, to);
            let state = if k == 0 { first } else { later };
            // (A decoder that passes marks without stopping does the work of later
            // ones: bounded here; the stitching decodes on from its start.)
            let stop = Box::new(|_: &Handover| true);
            let r = inputs.segment(&segs, k, state, stop, Some(MISSED_MARKS));
            (cyc, r)
        },
    );
    let mut done: Vec<Option<(CompactRecords, SegReport)>> = Vec::with_capacity(n);
    let mut cyc = Vec::with_capacity(n);
    for (k, m) in results.into_iter().enumerate() {
        let (c, r) = m.unwrap_or_else(|| {
            let e = DecodeError::new(&opts.source, segs[k].start as u64, "decoder thread failed");
            (true, Err(e))
        });
        cyc.push(c);
        done.push(Some(r?));
    }
    // Whether a decoder from segment `k` that stopped at `h` may have met a CYC packet.
    let cyc_in = |k: usize, h: Option<Handover>| {
        cyc.get(k..h.map_or(n, |h| h.index))
            .is_none_or(|c| c.iter().any(|&c| c))
    };
    let reports: Vec<SegReport> = done
        .iter()
        .map(|d| d.as_ref().map(|(_, r)| r.clone()).unwrap_or_default())
        .collect();
    // More than one execution mode: libipt's block cache makes decoding depend on what
    // was decoded before (see `SegReport::modes`).
    let modes = reports.iter().fold(0, |m, r| m | r.modes);
    if modes.count_ones() > 1 {
        return one_pass(&inputs, segs.len());
    }

    // Stitch: follow the handovers from the first segment, checking each.
    let Some((recs, report)) = done[0].take() else {
        return one_pass(&inputs, segs.len());
    };
    let mut run = Run {
        seg: 0,
        incoming: Incoming {
            pending_timestamp: true,
            last_timestamp: None,
            tsc: None,
            timeline: 0,
        },
        via: None,
        recs,
        report,
    };
    let mut out = Vec::new();
    for _ in 0..=2 * n + 1 {
        let joined = match run.report.handover {
            None if !run.report.gave_up => {
                out.push(run.recs);
                let stats = ParallelStats {
                    by: "libipt",
                    segments: n,
                    ..Default::default()
                };
                return Ok((out, stats));
            }
            None => None,
            Some(h) => {
                let inc = run.incoming.after(&h);
                let ok = reports
                    .get(h.index)
                    .is_some_and(|r| joins(&h, &inc, r, cyc_in(h.index, r.handover)));
                ok.then(|| done.get_mut(h.index).and_then(Option::take))
                    .flatten()
                    .map(|next| (h, inc, next))
            }
        };
        match joined {
            Some((h, inc, (mut recs, report))) => {
                // Its first timestamp, emitted whatever it was, goes where it repeats
                // the last one before.
                let repeats = recs.first_marker(is_timestamp).is_some_and(|r| {
                    matches!(r, Record::Timestamp { tsc, .. } if Some(*tsc) == inc.last_timestamp)
                });
                if repeats {
                    recs.drop_first_marker(is_timestamp);
                }
                let next = Run {
                    seg: h.index,
                    incoming: inc,
                    via: Some(h),
                    recs,
                    report,
                };
                out.push(std::mem::replace(&mut run, next).recs);
            }
            None => {
                // Decode this run's segment again with the exact state, on through the
                // cuts until one joins.
                let state = if run.seg == 0 {
                    first
                } else {
                    SegStart {
                        pending_timestamp: Some(run.incoming.pending_timestamp),
                        last_timestamp: Some(run.incoming.last_timestamp),
                        tsc: run.incoming.tsc,
                        ..later
                    }
                };
                let start = run.incoming;
                let stop = |h: &Handover| {
                    reports
                        .get(h.index)
                        .is_some_and(|r| joins(h, &start.after(h), r, cyc_in(h.index, r.handover)))
                };
                let (recs, report) = inputs.segment(&segs, run.seg, state, Box::new(stop), None)?;
                // Decoding further from a PSB that was decoded through: the same checks
                // as for the first stretch, now on the longer one.
                let suspect = report.modes & !modes != 0
                    || run.seg > 0 && (report.unknown_mode || report.block_bound)
                    || run.via.is_some_and(|v| {
                        !v.via_sync
                            && (cyc_in(run.seg, report.handover)
                                || report.first_gap.is_some_and(FirstGap::is_retstack_empty))
                    });
                if suspect {
                    return one_pass(&inputs, segs.len());
                }
                run.recs = recs;
                run.report = report;
            }
        }
    }
    // (Every round joins a later segment or decodes on to one: never reached.)
    one_pass(&inputs, segs.len())
}

/// Whether a CYC packet comes in the first [`fast::WARM_UP`] bytes of `trace` from its
/// first PSB (its packets read with the fast decoder's parser, up to one it does not
/// know).
fn cyc_near_start(trace: &[u8]) -> bool {
    let Some(start) = super::wire::find_psb(trace, 0) else {
        return false;
    };
    let end = trace.len().min(start.saturating_add(fast::WARM_UP));
    let mut p = start;
    while p < end {
        match super::wire::parse(trace, p) {
            Some((super::wire::Pkt::Cyc(_), _)) => return true,
            Some((_, n)) if n > 0 => p += n,
            _ => return false,
        }
    }
    false
}

/// One decoder over the whole trace.
fn one_pass(
    inputs: &Inputs<'_>,
    segments: usize,
) -> Result<(Vec<CompactRecords>, ParallelStats), DecodeError> {
    let (records, by) = inputs.sequential()?;
    let stats = ParallelStats {
        by: "one pass",
        segments,
        one_pass_by: Some(by),
        ..Default::default()
    };
    Ok((vec![records], stats))
}

fn is_timestamp(r: &Record) -> bool {
    matches!(r, Record::Timestamp { .. })
}
