//! Decoding a thread image for the view: the decoder on a thread of its own, handing
//! batches of instruction runs to the call-stack reconstruction on this one.

use std::ops::ControlFlow;

use drpttracer::decode::callstack::{CallStacks, Finished, SpanSink, StackSeed};
use drpttracer::decode::ptt_dir::{CarriedCaches, PttThread, PttTrace, PttWindowInfo, ThreadStats};
use drpttracer::decode::records::Record;
use drpttracer::decode::runs::Runs;
use drpttracer::decode::DecodeError;
use drpttracer::format::ptt;

use super::{ViewRange, LOSS_FLAGS};
use crate::names::ImageNames;

/// A thread image decoded through the call-stack reconstruction `cs`: what it made, each
/// window with its instruction range, the instructions counted (`--range`), the decoder's
/// statistics, and the stack at each fork it made (the child's id, from the syscall's
/// return value).
pub(super) type Decoded<S> = (
    Finished<S>,
    Vec<(PttWindowInfo, u64, u64)>,
    std::ops::Range<u64>,
    ThreadStats,
    Vec<(i32, StackSeed)>,
);

/// Syscalls that make a process (or a thread: told apart by the child's ids).
const FORKS: [u64; 4] = [
    libc::SYS_fork as u64,
    libc::SYS_vfork as u64,
    libc::SYS_clone as u64,
    libc::SYS_clone3 as u64,
];

/// Instructions per batch handed from the decoding thread to the reconstruction. Each
/// hand-over may wake the other thread, which costs tens of microseconds on a virtual
/// machine: on node's 1.4 G-instruction trace, batches of 2^16 made 19 K context switches
/// and `view` took 7.2-7.5 s, of 2^18 6.8 K and 6.0-6.7 s (2^20: 4.5 K, but 6.7-7.3 s, its
/// batches no longer in the caches).
pub(super) const BATCH_INSTRUCTIONS: usize = 1 << 18;

/// What the decoding thread hands over: the instructions as runs of straight-line code
/// ([`Runs`]), and between them the other records and the windows' bounds.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) runs: Runs,
    /// (runs of the batch before it, what)
    pub(super) events: Vec<(usize, BatchEvent)>,
}

impl Batch {
    /// Adds records that the decoder has no runs made for: the instructions as runs
    /// (to `runs`), the other records as events (to `events`). (The decoder appends its
    /// blocks' runs to `runs` itself.)
    fn add_records(runs: &mut Runs, events: &mut Vec<(usize, BatchEvent)>, recs: &[Record]) {
        let mut rest = recs;
        loop {
            let taken = runs.add_instructions(rest);
            let Some((r, after)) = rest.get(taken..).and_then(<[Record]>::split_first) else {
                return;
            };
            events.push((runs.runs.len(), BatchEvent::Record(r.clone())));
            rest = after;
        }
    }

    /// An empty batch with room for a full one.
    fn new() -> Batch {
        let mut b = Batch::default();
        b.runs.sizes.reserve(BATCH_INSTRUCTIONS + 4096);
        b.runs.runs.reserve(BATCH_INSTRUCTIONS / 4);
        b
    }
}

pub(super) enum BatchEvent {
    Record(Record),
    WindowStart(PttWindowInfo),
    WindowEnd,
}

/// Sends the full batch (`runs` and `events`) to the reconstruction and starts the next
/// one in a batch that came back (or a new one); false when the reconstruction has
/// stopped.
#[cold]
#[inline(never)]
fn hand_over(
    runs: &mut Runs,
    events: &mut Vec<(usize, BatchEvent)>,
    tx: &std::sync::mpsc::SyncSender<Batch>,
    back: &std::sync::mpsc::Receiver<Batch>,
) -> bool {
    let mut full = back.try_recv().unwrap_or_else(|_| Batch::new());
    std::mem::swap(runs, &mut full.runs);
    std::mem::swap(events, &mut full.events);
    tx.send(full).is_ok()
}

/// Decodes `th` on a thread of its own, handing the records over in batches, while this
/// thread feeds them to the call-stack reconstruction `cs`. A forked child's image starts
/// in the frames `inherited` (its parent's at the fork).
pub(super) fn decode_one<S: SpanSink>(
    trace: &PttTrace,
    th: &PttThread,
    mut cs: CallStacks<'_, ImageNames, S>,
    range: Option<ViewRange>,
    bar: Option<&indicatif::ProgressBar>,
    inherited: Option<&StackSeed>,
    carried: &mut CarriedCaches,
) -> Result<Decoded<S>, DecodeError> {
    let syscall_windows = ptt::window_name(th.header.window) == "syscall";
    // A thread the process created (not its first), traced by a software backend, which
    // traces every new thread from its first instruction (the child's side of `clone`):
    // its window 0, when the file has it, starts where the thread did.
    let h = &th.header;
    let created_traced = h.tid != h.pid
        && !syscall_windows
        && matches!(ptt::backend_name(h.backend), "qemu" | "emulated");
    // A process's main thread (a forked child's: its window 0 is the fork itself).
    let from_fork = h.tid == h.pid && !syscall_windows;
    match range {
        Some(ViewRange::Insns(a, b)) => cs.count_only(a..b),
        Some(ViewRange::Windows(..)) => cs.count_only(u64::MAX..u64::MAX),
        None => {}
    }
    let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(4);
    // Batches come back emptied, so their buffers are grown once (growing a fresh one to
    // a batch's size copied it over and over).
    let (back_tx, back_rx) = std::sync::mpsc::sync_channel::<Batch>(8);
    let stopped = || DecodeError::whole(th.path.display(), "decoding stopped: the view failed");
    std::thread::scope(|scope| {
        let decoder = std::thread::Builder::new()
            .name("view-decode".into())
            .spawn_scoped(scope, move || {
                let mut batch = Batch::new();
                let stats =
                    trace.decode_thread_carrying(th, carried, &mut |w: &PttWindowInfo, dec| {
                        if let Some(b) = bar {
                            b.inc((w.pt_len + w.sideband_len + 124) as u64);
                        }
                        let at = batch.runs.runs.len();
                        batch.events.push((at, BatchEvent::WindowStart(w.clone())));
                        if let Some(dec) = dec {
                            let events = &mut batch.events;
                            let cut = dec.for_each_slice_runs_into(
                                &mut batch.runs,
                                BATCH_INSTRUCTIONS,
                                |recs, runs| {
                                    Batch::add_records(runs, events, recs);
                                    if runs.instructions() >= BATCH_INSTRUCTIONS
                                        && !hand_over(runs, events, &tx, &back_rx)
                                    {
                                        return ControlFlow::Break(());
                                    }
                                    ControlFlow::Continue(())
                                },
                            );
                            if cut.is_some() {
                                return Err(stopped());
                            }
                        }
                        let at = batch.runs.runs.len();
                        batch.events.push((at, BatchEvent::WindowEnd));
                        Ok::<(), DecodeError>(())
                    })?;
                tx.send(batch).map_err(|_| stopped())?;
                Ok::<ThreadStats, DecodeError>(stats)
            });
        let decoder = decoder.map_err(|e| {
            DecodeError::whole(
                th.path.display(),
                format!("cannot start the decoding thread: {e}"),
            )
        })?;
        let mut windows = Vec::new();
        let mut forks = Vec::new();
        let mut window: Option<(PttWindowInfo, u64)> = None;
        for mut batch in rx {
            // (runs, instructions) fed so far
            let (mut done, mut sizes_done) = (0usize, 0usize);
            let (runs, sizes) = (&batch.runs.runs, &batch.runs.sizes);
            for (at, ev) in batch.events.drain(..) {
                sizes_done += cs.runs(
                    runs.get(done..at).unwrap_or(&[]),
                    sizes.get(sizes_done..).unwrap_or(&[]),
                );
                done = at;
                match ev {
                    BatchEvent::Record(r) => cs.record(&r),
                    BatchEvent::WindowStart(w) => {
                        if let Some(ViewRange::Windows(n, m)) = range {
                            // Counted from the first window at or after N to the first
                            // after M.
                            let (from, to) = (cs.counted().start, cs.counted().end);
                            if w.index >= n && w.index <= m && from == u64::MAX {
                                cs.count_only(cs.instructions()..u64::MAX);
                            } else if w.index > m && from != u64::MAX && to == u64::MAX {
                                cs.count_only(from..cs.instructions());
                            }
                        }
                        cs.set_thread_start(
                            created_traced && w.index == 0 && w.flags & LOSS_FLAGS == 0,
                        );
                        if w.flags & LOSS_FLAGS != 0 {
                            cs.restart(Some(format!(
                                "window {}: {}",
                                w.index,
                                w.flag_names().join(", ")
                            )));
                        } else if syscall_windows {
                            // Each window is one syscall's own execution.
                            cs.restart(None);
                        }
                        // The child's side of a fork, where its file starts, when its code
                        // is traced from there on (QEMU's window 0 has no code and no loss
                        // flag; the shim's says its PT is absent: it steps a child from its
                        // next syscall): its code runs on in its parent's frames.
                        let fork_window = w.index == 0
                            && w.flags & ptt::WF_FORK_CHILD != 0
                            && w.flags & LOSS_FLAGS == 0;
                        if let Some(seed) = inherited.filter(|_| from_fork && fork_window) {
                            cs.seed(seed);
                        }
                        window = Some((w, cs.instructions()));
                    }
                    BatchEvent::WindowEnd => {
                        if let Some((w, start)) = window.take() {
                            if FORKS.contains(&w.nr) && w.ret > 0 && !syscall_windows {
                                forks.push((w.ret as i32, cs.stack()));
                            }
                            windows.push((w, start, cs.instructions()));
                        }
                    }
                }
            }
            cs.runs(
                runs.get(done..).unwrap_or(&[]),
                sizes.get(sizes_done..).unwrap_or(&[]),
            );
            batch.runs.clear();
            let _ = back_tx.try_send(batch);
        }
        let stats = decoder
            .join()
            .map_err(|_| DecodeError::whole(th.path.display(), "the decoding thread panicked"))??;
        let counted = cs.counted();
        Ok((cs.finish_with(), windows, counted, stats, forks))
    })
}
