//! Parallel decode by PSB segments (libipt's "Parallel Decode").
//!
//! The trace is cut at PSB offsets into chunks that threads decode independently; the
//! chunks' records are then stitched so that the result equals a single sequential pass:
//! - a chunk that ends inside straight-line code runs on (without trace) past the point
//!   where the next chunk's PSB+ FUP resumes; that overlap, from the first instruction at
//!   the FUP address onwards, is dropped from the earlier chunk;
//! - a chunk that starts at a PSB+ with FUP (tracing on) drops the sync-point timestamp a
//!   sequential pass does not emit there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::config::TraceParams;
use super::image::AddressSpace;
use super::ipt::{psb_offsets, PsbInfo};
use super::pipeline::{CompactRecords, PtDecoder, WindowOptions};
use super::records::{InsnClass, Record};
use super::sideband::{ImageEvent, ImageResolver};
use super::DecodeError;

/// A chunk of the trace starting at a PSB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: usize,
    pub end: usize,
    /// FUP of the chunk's first PSB+ (tracing enabled there).
    pub fup: Option<u64>,
}

/// Cuts `trace` into about `want` chunks of similar size at PSB boundaries. Bytes before
/// the first PSB cannot be decoded by anyone and belong to no chunk.
pub fn split_at_psbs(trace: &[u8], want: usize) -> Vec<Segment> {
    let psbs: Vec<PsbInfo> = psb_offsets(trace);
    let Some(first) = psbs.first() else {
        return Vec::new();
    };
    let want = want.max(1);
    let target = (trace.len() / want).max(1);
    let mut segs: Vec<Segment> = Vec::new();
    let mut cur = Segment {
        start: first.offset as usize,
        end: trace.len(),
        fup: first.fup,
    };
    for p in &psbs[1..] {
        let off = p.offset as usize;
        if off - cur.start >= target && segs.len() + 1 < want {
            cur.end = off;
            segs.push(cur);
            cur = Segment {
                start: off,
                end: trace.len(),
                fup: p.fup,
            };
        }
    }
    segs.push(cur);
    segs
}

/// Instruction classes that consume trace (end a straight-line run).
fn needs_trace(c: InsnClass) -> bool {
    !matches!(c, InsnClass::Other | InsnClass::Ptwrite)
        && !matches!(c, InsnClass::Call | InsnClass::Jump) // direct ones are fine; indirect
                                                           // ones are checked by the caller
}

/// Drops from `recs` (an earlier chunk) the straight-line tail that the next chunk, which
/// resumes at `fup`, decodes again: walking back over the trailing run of instructions
/// that needed no trace (the last one, the unresolved branch, may have), cut at the
/// earliest instruction at `fup`.
fn trim_overlap(recs: &mut CompactRecords, fup: u64) {
    recs.truncate_back(|r, is_last| match r {
        Record::Syscall { .. } => (false, false),
        // An instruction that consumed trace ends the overlap (it cannot reach before).
        Record::Instruction(i) => (i.pc == fup, !is_last && needs_trace(i.class)),
        _ => (false, true),
    });
}

/// Chunks per decoding thread: small enough that the last ones leave little idle time,
/// large enough that cutting costs little (0.5% more instructions than one pass on an
/// 8 MB trace).
pub const CHUNKS_PER_THREAD: usize = 16;

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
    let threads = threads.max(1);
    // Loss records are reported once, where the trace's time passes them; a chunk cannot
    // know which of them earlier chunks already reported, so such windows decode in one
    // pass (same result, no speed-up).
    let has_losses = events
        .iter()
        .any(|e| matches!(e.change, super::sideband::ImageChange::Lost { .. }));
    let segs = if has_losses {
        Vec::new()
    } else {
        split_at_psbs(trace, threads * CHUNKS_PER_THREAD)
    };
    if segs.len() <= 1 {
        let dec = PtDecoder::new(
            trace,
            *params,
            image.clone(),
            events.to_vec(),
            resolver.clone(),
            opts.clone(),
        )?;
        return Ok(vec![dec.collect_compact()]);
    }
    type Slot = Mutex<Option<Result<CompactRecords, DecodeError>>>;
    let results: Vec<Slot> = segs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.min(segs.len()) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(seg) = segs.get(k) else { break };
                let mut o = WindowOptions {
                    base_offset: opts.base_offset + seg.start as u64,
                    ..opts.clone()
                };
                if k > 0 {
                    o.window_id = None;
                    o.cpu = None;
                }
                let r = PtDecoder::new(
                    &trace[seg.start..seg.end],
                    *params,
                    image.clone(),
                    events.to_vec(),
                    resolver.clone(),
                    o,
                )
                .map(PtDecoder::collect_compact);
                if let Ok(mut slot) = results[k].lock() {
                    *slot = Some(r);
                }
            });
        }
    });
    let mut chunks = Vec::with_capacity(segs.len());
    for (k, m) in results.into_iter().enumerate() {
        let r = m.into_inner().ok().flatten().unwrap_or_else(|| {
            Err(DecodeError::new(
                &opts.source,
                segs[k].start as u64,
                "decoder thread failed",
            ))
        })?;
        chunks.push(r);
    }
    Ok(stitch(chunks, &segs))
}

/// Stitches per-chunk records in place (see the module docs).
fn stitch(mut chunks: Vec<CompactRecords>, segs: &[Segment]) -> Vec<CompactRecords> {
    for k in 1..chunks.len() {
        let Some(fup) = segs[k].fup else { continue };
        // The last non-empty earlier chunk holds the tail to trim.
        let Some(prev) = chunks[..k].iter().rposition(|c| !c.is_empty()) else {
            continue;
        };
        if matches!(chunks[prev].last(), Some(Record::Gap(_))) {
            continue;
        }
        trim_overlap(&mut chunks[prev], fup);
        // Sequential decoding crosses this PSB silently.
        chunks[k].drop_leading(|r| matches!(r, Record::Timestamp { .. }));
    }
    chunks
}
