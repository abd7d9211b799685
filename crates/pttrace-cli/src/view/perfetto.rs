//! `timeline.pftrace` of the views, on a thread of its own ([`PfPipe`]): track
//! descriptors, then each thread image's calls, gaps and windows as [`pftrace`] packets,
//! read from its spill file as soon as the image is handed over (while the next image is
//! decoded). While it reads a spill, it keeps the calls the bounded formats may show in a
//! file of their own ([`spill::KeptWriter`]), which they read instead, while it is written
//! ([`PfPipe::kept`]).

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};

use drpttracer::decode::callstack::Marker;
use drpttracer::decode::ptt_dir::PttWindowInfo;

use super::frames::Names;
use super::{
    marker_ns, ns, pftrace, pids, process_name, span_category, spill, thread_track_names,
    window_name, Axis, Clock, Namer, Nesting, ThreadView, Who,
};

/// What the Perfetto writer's thread is handed: first the tracks, then the thread images
/// in order.
enum PfMsg {
    Tracks { whos: Vec<Who>, axis: Axis },
    View(Box<PfView>),
}

/// One thread image's part of the timeline, with the frame names it added.
struct PfView {
    pid: i32,
    tid: i32,
    clock: Clock,
    markers: Vec<Marker>,
    windows: Vec<(PttWindowInfo, u64, u64)>,
    spill: Option<spill::Spill>,
    cut: Option<(u64, u64)>,
    /// Its process image (whose frame table its spans' frames index).
    image: (i32, u64),
    /// The frames its process image's table got since the last image handed over.
    new_frames: Vec<Vec<u32>>,
    /// The names the view's string table got since then.
    new_names: Vec<String>,
    /// Where to keep its calls at least this long for the bounded formats (none: they
    /// read the spill).
    keep: Option<(PathBuf, u64)>,
}

/// The Perfetto writer's thread and what was handed to it.
pub(super) struct PfPipe {
    tx: Option<Sender<PfMsg>>,
    /// Each image's kept calls, in the order the images were handed over.
    kept: Receiver<Option<spill::Kept>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<pftrace::Size>>>,
    /// The file, given its name `path` once complete ([`crate::outfile`]).
    out: Option<crate::outfile::OutFile>,
    path: PathBuf,
    /// Names handed over, and frames by process image.
    sent_names: usize,
    sent_frames: HashMap<(i32, u64), usize>,
}

impl PfPipe {
    /// Starts the writer of `path` (which has no name until it is complete).
    pub(super) fn start(path: PathBuf) -> Result<Self, String> {
        let cannot = |e: std::io::Error| format!("{}: cannot create: {e}", path.display());
        let out = crate::outfile::OutFile::create(&path).map_err(cannot)?;
        let file = out.writer().map_err(cannot)?;
        let no_thread = |e: std::io::Error| format!("view: cannot start a thread: {e}");
        let pf =
            pftrace::Writer::new(BufWriter::with_capacity(1 << 20, file)).map_err(no_thread)?;
        let (tx, rx) = std::sync::mpsc::channel::<PfMsg>();
        let (kept_tx, kept) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("view-pftrace".into())
            .spawn(move || write_pftrace(pf, &rx, &kept_tx))
            .map_err(no_thread)?;
        Ok(PfPipe {
            tx: Some(tx),
            kept,
            thread: Some(thread),
            out: Some(out),
            path,
            sent_names: 0,
            sent_frames: HashMap::new(),
        })
    }

    fn send(&mut self, m: PfMsg) {
        // A writer that stopped says why at `finish`.
        if let Some(tx) = &self.tx {
            if tx.send(m).is_err() {
                self.tx = None;
            }
        }
    }

    /// The tracks: a process track per pid, a thread track and a windows track per thread.
    pub(super) fn tracks(&mut self, whos: &[Who], axis: &Axis) {
        self.send(PfMsg::Tracks {
            whos: whos.to_vec(),
            axis: axis.clone(),
        });
    }

    /// The next thread image, decoded: its spans are read from its spill file; with
    /// `keep_from`, its calls at least that long are kept for the bounded formats (see
    /// [`PfPipe::kept`]).
    pub(super) fn view(
        &mut self,
        v: &ThreadView,
        namers: &HashMap<(i32, u64), Namer>,
        names: &Names,
        keep_from: Option<u64>,
    ) {
        let keep = match (keep_from, &v.spill, v.cut) {
            (Some(min_len), Some(s), None) => Some((s.kept_path(), min_len)),
            _ => None,
        };
        let new_names = names.strings.get(self.sent_names..).unwrap_or(&[]).to_vec();
        self.sent_names = names.strings.len();
        let sent = self.sent_frames.entry(v.image).or_insert(0);
        let new_frames = namers
            .get(&v.image)
            .and_then(|n| n.frames.chains.get(*sent..))
            .unwrap_or(&[])
            .to_vec();
        *sent += new_frames.len();
        self.send(PfMsg::View(Box::new(PfView {
            pid: v.who.pid,
            tid: v.who.tid,
            clock: v.clock.clone(),
            markers: v.markers.clone(),
            windows: v.windows.clone(),
            spill: v.spill.clone(),
            cut: v.cut,
            image: v.image,
            new_frames,
            new_names,
            keep,
        })));
    }

    /// The kept calls of the next image handed over (in order), once the writer starts
    /// reading its spill (they are read as it writes them); none when it was not asked to
    /// keep them or could not (the bounded formats then read the spill).
    pub(super) fn kept(&mut self) -> Option<spill::Kept> {
        self.kept.recv().ok().flatten()
    }

    /// Waits for the file to be complete; its size.
    pub(super) fn finish(mut self) -> Result<pftrace::Size, String> {
        self.tx = None;
        let bytes = match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r.map_err(|e| format!("{}: cannot write: {e}", self.path.display()))?,
            _ => {
                return Err(format!(
                    "{}: the writing thread panicked",
                    self.path.display()
                ))
            }
        };
        self.out
            .take()
            .map_or(Ok(()), crate::outfile::OutFile::commit)
            .map_err(|e| format!("{}: cannot write: {e}", self.path.display()))?;
        Ok(bytes)
    }
}

/// Packet bytes (inflated) from which `timeline.pftrace` may be more than the Perfetto UI
/// holds in a browser tab: Perfetto's page on large traces puts a tab's memory at about
/// 2 GB typically, and what a proto trace takes there at 2-4 times its uncompressed size.
const UI_TAB_PACKETS: u64 = 512 << 20;

/// What `view` says under `timeline.pftrace` (at `path`, of `size`) when the Perfetto UI
/// may not hold it in a browser tab: how to load it natively instead.
pub(super) fn large_trace_note(size: pftrace::Size, path: &std::path::Path) -> Option<String> {
    if size.packets < UI_TAB_PACKETS {
        return None;
    }
    let path = path.display().to_string();
    let quoted = if path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@".contains(&b))
    {
        path
    } else {
        format!("'{}'", path.replace('\'', "'\\''"))
    };
    Some(format!(
        "({} MB of packets once inflated: more than the Perfetto UI may hold in a browser \
         tab, about 2 GB for a trace 2-4 times that size; where it runs out of memory, load \
         the file with Perfetto's native trace_processor, `trace_processor --httpd {}`, \
         which ui.perfetto.dev then uses)",
        size.packets / 1_000_000,
        crate::text::printable(&quoted)
    ))
}

impl Drop for PfPipe {
    fn drop(&mut self) {
        // Not finished (an error): the writer stops and its file goes (never named).
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer's thread: every image's calls (each function of an inlined chain a slice),
/// gaps as instant events, its windows on their own track.
fn write_pftrace<W: Write + Send + 'static>(
    mut pf: pftrace::Writer<W>,
    rx: &Receiver<PfMsg>,
    kept_tx: &Sender<Option<spill::Kept>>,
) -> std::io::Result<pftrace::Size> {
    let mut names: Vec<String> = Vec::new();
    let mut frames: HashMap<(i32, u64), Vec<Vec<u32>>> = HashMap::new();
    let mut tracks: HashMap<(i32, i32), (u64, u64)> = HashMap::new();
    let mut axis = Axis::Instructions { why: String::new() };
    for m in rx {
        match m {
            PfMsg::Tracks { whos, axis: a } => {
                tracks = pf_tracks(&mut pf, &whos, &a)?;
                axis = a;
            }
            PfMsg::View(v) => {
                let PfView {
                    new_frames,
                    new_names,
                    ..
                } = &*v;
                names.extend_from_slice(new_names);
                let table = frames.entry(v.image).or_default();
                table.extend_from_slice(new_frames);
                // The kept calls go to the bounded formats before they are written: they
                // read them while this thread writes. (A kept file that cannot be created
                // is left out: they read the spill. They may be done already: an error.)
                let (keep, kept) = v
                    .keep
                    .as_ref()
                    .and_then(|(path, min_len)| spill::KeptWriter::create(path, *min_len).ok())
                    .unzip();
                let _ = kept_tx.send(kept);
                write_view(&mut pf, &tracks, &v, table, &names, &axis, keep)?;
            }
        }
    }
    pf.finish()
}

/// One thread image's sequence: its calls from its spill, its gaps among them in time
/// order; then its windows, one after the other on their own track and sequence. Its
/// calls long enough go to `keep` as they are read.
fn write_view<W: Write + Send + 'static>(
    pf: &mut pftrace::Writer<W>,
    tracks: &HashMap<(i32, i32), (u64, u64)>,
    v: &PfView,
    frames: &[Vec<u32>],
    names: &[String],
    axis: &Axis,
    mut keep: Option<spill::KeptWriter>,
) -> std::io::Result<()> {
    let name_of = |id: u32| names.get(id as usize).map_or("?", String::as_str);
    let chain = |f: u32| frames.get(f as usize).map_or(&[][..], Vec::as_slice);
    let (track, window_track) = tracks.get(&(v.pid, v.tid)).copied().unwrap_or((0, 0));
    let t0 = ns(axis.place(&v.clock, 0, 0).0);
    let mut seq = pf.sequence(track, t0)?;
    let mut markers = v.markers.iter().peekable();
    // When the next gap is (ns; none: never), asked once per gap rather than per edge.
    let gap_at = |m: Option<&&Marker>| m.map_or(u64::MAX, |m| marker_ns(&v.clock, axis, m));
    let mut next_gap = gap_at(markers.peek());
    // Categories by start and end kind, each with its key in the sequence.
    let mut cats: Vec<Option<(u32, String)>> = vec![None; 64];
    let mut keys = 0u32;
    let mut nesting: Nesting<()> = Nesting::new();
    if let Some(s) = &v.spill {
        spill::replay(s, v.cut, |e| {
            if let Some(w) = &mut keep {
                if w.edge(&e).is_err() {
                    // (Its readers stop with an error naming the file; the timeline goes on.)
                    keep = None;
                }
            }
            let (ts, frame, kinds) = match e {
                spill::Edge::Begin {
                    at,
                    len,
                    frame,
                    start,
                    end,
                } => {
                    let (_, _, b) = nesting.begin(axis, &v.clock, at, len, ());
                    (b, frame, Some((start, end)))
                }
                spill::Edge::End { frame, .. } => (nesting.end().0, frame, None),
            };
            while next_gap <= ts {
                let Some(m) = markers.next() else {
                    break;
                };
                gap(pf, &mut seq, &v.clock, axis, m)?;
                next_gap = gap_at(markers.peek());
            }
            let chain = chain(frame);
            let Some((start, end)) = kinds else {
                for _ in chain {
                    pf.event(&mut seq, pftrace::Event::End { ts })?;
                }
                return Ok(());
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
                        ts,
                        name: pftrace::Named::keyed(id, name_of(id)),
                        category: pftrace::Named::keyed(*cat_key, category),
                    },
                )?;
            }
            Ok(())
        })?;
    }
    for m in markers {
        gap(pf, &mut seq, &v.clock, axis, m)?;
    }
    let mut wseq = pf.sequence(window_track, t0)?;
    for (win, start, end) in &v.windows {
        let name = window_name(win);
        let (ts, dur) = axis.place(&v.clock, *start, *end);
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
    // (A kept file that cannot be finished makes its readers stop with an error; the
    // timeline is not the worse for it.)
    if let Some(w) = keep {
        let _ = w.finish();
    }
    Ok(())
}

/// The track descriptors of `timeline.pftrace`: a process track per pid, a thread track
/// and a windows track per thread; returns the (thread, windows) track uuids by thread.
fn pf_tracks<W: Write + Send + 'static>(
    w: &mut pftrace::Writer<W>,
    whos: &[Who],
    axis: &Axis,
) -> std::io::Result<HashMap<(i32, i32), (u64, u64)>> {
    use pftrace::Track;
    let unit = match axis {
        Axis::Instructions { .. } => " [time axis: instructions, 1 ns = 1 instruction]",
        Axis::Nanoseconds { .. } => "",
    };
    let mut uuids: HashMap<(i32, i32), (u64, u64)> = HashMap::new();
    let mut next = 1u64;
    for pid in pids(whos) {
        let process = next;
        next += 1;
        let name = format!("{}{unit}", process_name(whos, pid));
        w.track(process, Track::Process { pid, name: &name })?;
        for v in whos.iter().filter(|v| v.pid == pid) {
            if uuids.contains_key(&(v.pid, v.tid)) {
                continue;
            }
            let (thread, windows) = thread_track_names(whos, v);
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
fn gap<W: Write + Send + 'static>(
    w: &mut pftrace::Writer<W>,
    seq: &mut pftrace::Sequence,
    clock: &Clock,
    axis: &Axis,
    m: &Marker,
) -> std::io::Result<()> {
    let ts = marker_ns(clock, axis, m);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_trace_too_large_for_a_browser_tab_is_said_so_with_the_native_way_to_open_it() {
        let size = |packets| pftrace::Size {
            file: packets / 10,
            packets,
        };
        let path = Path::new("/tmp/v/timeline.pftrace");
        assert_eq!(large_trace_note(size((512 << 20) - 1), path), None);
        assert_eq!(
            large_trace_note(size(936_123_456), path).as_deref(),
            Some(
                "(936 MB of packets once inflated: more than the Perfetto UI may hold in a \
                 browser tab, about 2 GB for a trace 2-4 times that size; where it runs out of \
                 memory, load the file with Perfetto's native trace_processor, \
                 `trace_processor --httpd /tmp/v/timeline.pftrace`, which ui.perfetto.dev then \
                 uses)"
            )
        );
        // A path the shell would split or expand is quoted for it.
        let note = large_trace_note(size(1 << 30), Path::new("/tmp/my trace/it's.pftrace"));
        assert!(
            note.as_deref().is_some_and(
                |n| n.contains("`trace_processor --httpd '/tmp/my trace/it'\\''s.pftrace'`")
            ),
            "{note:?}"
        );
    }
}
