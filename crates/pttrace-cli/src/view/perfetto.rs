//! `timeline.pftrace` of the views: track descriptors, then each view's calls, gaps and
//! windows as [`pftrace`] packets, from the call edges the spill's read gives.

use std::collections::HashMap;
use std::io::Write;

use drpttracer::decode::callstack::{Marker, SpanEnd, SpanStart};

use super::frames::{FrameTable, Names};
use super::{
    marker_ns, ns, pftrace, pids, process_name, span_category, thread_track_names, window_name,
    Axis, ThreadView,
};

/// Edges handed to the Perfetto writer at a time.
pub(super) const PF_BATCH: usize = 1 << 14;

/// A call's begin (with how it began and ended) or end, at `ts` (ns), for the Perfetto
/// writer.
#[derive(Clone, Copy)]
pub(super) struct PfEdge {
    pub(super) ts: u64,
    pub(super) frame: u32,
    pub(super) kinds: Option<(SpanStart, SpanEnd)>,
}

/// Writes `timeline.pftrace` (see [`pftrace`]) from the edges of each view in turn, as
/// [`write_views`] reads them (an empty batch ends a view): its calls (each function of
/// an inlined chain a slice), gaps as instant events, its windows on their own track.
pub(super) fn write_pftrace_views<W: Write + Send + 'static>(
    mut pf: pftrace::Writer<W>,
    tracks: &HashMap<(i32, i32), (u64, u64)>,
    views: &[ThreadView],
    view_frames: &[&FrameTable],
    names: &Names,
    axis: &Axis,
    edges: &std::sync::mpsc::Receiver<Vec<PfEdge>>,
) -> std::io::Result<u64> {
    let empty = FrameTable::default();
    for (k, v) in views.iter().enumerate() {
        let frames = view_frames.get(k).copied().unwrap_or(&empty);
        let (track, window_track) = tracks.get(&(v.pid, v.tid)).copied().unwrap_or((0, 0));
        let t0 = ns(axis.place(v, 0, 0).0);
        let mut seq = pf.sequence(track, t0)?;
        let mut markers = v.markers.iter().peekable();
        // Categories by start and end kind, each with its key in the sequence.
        let mut cats: Vec<Option<(u32, String)>> = vec![None; 64];
        let mut keys = 0u32;
        while let Ok(batch) = edges.recv() {
            if batch.is_empty() {
                break;
            }
            for e in batch {
                while let Some(m) = markers.next_if(|m| marker_ns(v, axis, m) <= e.ts) {
                    gap(&mut pf, &mut seq, v, axis, m)?;
                }
                let chain = frames.chain(e.frame);
                let Some((start, end)) = e.kinds else {
                    for _ in chain {
                        pf.event(&mut seq, pftrace::Event::End { ts: e.ts })?;
                    }
                    continue;
                };
                let slot = (start as usize * 8 + end as usize) % 64;
                let (cat_key, category) = cats[slot].get_or_insert_with(|| {
                    keys += 1;
                    (keys - 1, span_category(start, end).into_owned())
                });
                for &id in chain {
                    pf.event(
                        &mut seq,
                        pftrace::Event::Begin {
                            ts: e.ts,
                            name: pftrace::Named::keyed(id, names.get(id)),
                            category: pftrace::Named::keyed(*cat_key, category),
                        },
                    )?;
                }
            }
        }
        for m in markers {
            gap(&mut pf, &mut seq, v, axis, m)?;
        }
        // Windows, one after the other on their own track and sequence.
        let mut wseq = pf.sequence(window_track, t0)?;
        for (win, start, end) in &v.windows {
            let name = window_name(win);
            let (ts, dur) = axis.place(v, *start, *end);
            let ts = ns(ts);
            pf.event(
                &mut wseq,
                pftrace::Event::Begin {
                    ts,
                    name: pftrace::Named::text(&name),
                    category: pftrace::Named::text("syscall"),
                },
            )?;
            pf.event(&mut wseq, pftrace::Event::End { ts: ts + ns(dur) })?;
        }
    }
    pf.finish()
}

/// The track descriptors of `timeline.pftrace`: a process track per pid, a thread track
/// and a windows track per thread; returns the (thread, windows) track uuids by thread.
pub(super) fn pf_tracks<W: Write + Send + 'static>(
    w: &mut pftrace::Writer<W>,
    views: &[ThreadView],
    axis: &Axis,
) -> std::io::Result<HashMap<(i32, i32), (u64, u64)>> {
    use pftrace::Track;
    let unit = match axis {
        Axis::Instructions { .. } => " [time axis: instructions, 1 ns = 1 instruction]",
        Axis::Nanoseconds { .. } => "",
    };
    let mut uuids: HashMap<(i32, i32), (u64, u64)> = HashMap::new();
    let mut next = 1u64;
    for pid in pids(views) {
        let process = next;
        next += 1;
        let name = format!("{}{unit}", process_name(views, pid));
        w.track(process, Track::Process { pid, name: &name })?;
        for v in views.iter().filter(|v| v.pid == pid) {
            if uuids.contains_key(&(v.pid, v.tid)) {
                continue;
            }
            let (thread, windows) = thread_track_names(views, v);
            let (t, wt) = (next, next + 1);
            next += 2;
            w.track(
                t,
                Track::Thread {
                    pid,
                    tid: v.tid,
                    name: &thread,
                },
            )?;
            w.track(
                wt,
                Track::Named {
                    parent: process,
                    name: &windows,
                },
            )?;
            uuids.insert((v.pid, v.tid), (t, wt));
        }
    }
    Ok(uuids)
}

/// A gap or loss as an instant event on the thread's track.
pub(super) fn gap<W: Write + Send + 'static>(
    w: &mut pftrace::Writer<W>,
    seq: &mut pftrace::Sequence,
    v: &ThreadView,
    axis: &Axis,
    m: &Marker,
) -> std::io::Result<()> {
    let ts = marker_ns(v, axis, m);
    let name = format!("gap: {}", m.what);
    w.event(
        seq,
        pftrace::Event::Instant {
            ts,
            name: pftrace::Named::text(&name),
            category: pftrace::Named::text("gap"),
        },
    )
}
