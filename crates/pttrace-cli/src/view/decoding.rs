//! Decoding a thread image for the view: the decoder on a thread of its own, handing
//! batches of packed instructions to the call-stack reconstruction on this one.

use std::ops::ControlFlow;

use drpttracer::decode::callstack::{pack_instruction, CallStacks, Finished, SpanSink};
use drpttracer::decode::ptt_dir::{PttThread, PttTrace, PttWindowInfo, ThreadStats};
use drpttracer::decode::records::Record;
use drpttracer::decode::DecodeError;
use drpttracer::decode::TraceDecoder;
use drpttracer::format::ptt;

use super::{ViewRange, LOSS_FLAGS};
use crate::names::ImageNames;

/// A thread image decoded through the call-stack reconstruction `cs`: what it made, each
/// window with its instruction range, the instructions counted (`--range`), the decoder's
/// statistics.
pub(super) type Decoded<S> = (
    Finished<S>,
    Vec<(PttWindowInfo, u64, u64)>,
    std::ops::Range<u64>,
    ThreadStats,
);

/// Instructions per batch handed from the decoding thread to the reconstruction.
pub(super) const BATCH_INSTRUCTIONS: usize = 1 << 16;

/// What the decoding thread hands over: instructions packed one per word
/// ([`pack_instruction`]), and between them the other records and the windows' bounds.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) instructions: Vec<u64>,
    /// (instructions of the batch before it, what)
    pub(super) events: Vec<(usize, BatchEvent)>,
}

impl Batch {
    /// Adds records: the instructions packed, each run in one loop (a block's
    /// instructions are the common slice), the other records as events.
    #[inline(always)]
    fn add(&mut self, recs: &[Record]) {
        let mut rest = recs;
        loop {
            let before = self.instructions.len();
            self.instructions.extend(rest.iter().map_while(|r| match r {
                Record::Instruction(i) => Some(pack_instruction(i.pc, i.size, i.class)),
                _ => None,
            }));
            let packed = self.instructions.len() - before;
            let Some((r, after)) = rest.get(packed..).and_then(<[Record]>::split_first) else {
                return;
            };
            self.events
                .push((self.instructions.len(), BatchEvent::Record(r.clone())));
            rest = after;
        }
    }
}

pub(super) enum BatchEvent {
    Record(Record),
    WindowStart(PttWindowInfo),
    WindowEnd,
}

/// Sends the full `batch` to the reconstruction and starts the next one in a batch that
/// came back (or a new one); false when the reconstruction has stopped. Out of line: the
/// decoder's per-block callback stays small enough to be inlined into its loop.
#[cold]
#[inline(never)]
fn hand_over(
    batch: &mut Batch,
    tx: &std::sync::mpsc::SyncSender<Batch>,
    back: &std::sync::mpsc::Receiver<Batch>,
) -> bool {
    let next = back.try_recv().unwrap_or_else(|_| {
        let mut b = Batch::default();
        b.instructions.reserve(BATCH_INSTRUCTIONS + 4096);
        b
    });
    tx.send(std::mem::replace(batch, next)).is_ok()
}

/// Decodes `th` on a thread of its own, handing the records over in batches, while this
/// thread feeds them to the call-stack reconstruction `cs`.
pub(super) fn decode_one<S: SpanSink>(
    trace: &PttTrace,
    th: &PttThread,
    mut cs: CallStacks<'_, ImageNames, S>,
    range: Option<ViewRange>,
    bar: Option<&indicatif::ProgressBar>,
) -> Result<Decoded<S>, DecodeError> {
    let syscall_windows = ptt::window_name(th.header.window) == "syscall";
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
        let decoder = scope.spawn(move || {
            let mut batch = Batch::default();
            batch.instructions.reserve(BATCH_INSTRUCTIONS + 4096);
            let stats = trace.decode_thread(th, &mut |w: &PttWindowInfo, dec| {
                if let Some(b) = bar {
                    b.inc((w.pt_len + w.sideband_len + 124) as u64);
                }
                let at = batch.instructions.len();
                batch.events.push((at, BatchEvent::WindowStart(w.clone())));
                if let Some(dec) = dec {
                    let cut = dec.for_each_slice(|recs| {
                        batch.add(recs);
                        if batch.instructions.len() >= BATCH_INSTRUCTIONS
                            && !hand_over(&mut batch, &tx, &back_rx)
                        {
                            return ControlFlow::Break(());
                        }
                        ControlFlow::Continue(())
                    });
                    if cut.is_some() {
                        return Err(stopped());
                    }
                }
                let at = batch.instructions.len();
                batch.events.push((at, BatchEvent::WindowEnd));
                Ok::<(), DecodeError>(())
            })?;
            tx.send(batch).map_err(|_| stopped())?;
            Ok::<ThreadStats, DecodeError>(stats)
        });
        let mut windows = Vec::new();
        let mut window: Option<(PttWindowInfo, u64)> = None;
        for mut batch in rx {
            let mut done = 0usize;
            for (at, ev) in batch.events.drain(..) {
                cs.packed_instructions(batch.instructions.get(done..at).unwrap_or(&[]));
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
                        window = Some((w, cs.instructions()));
                    }
                    BatchEvent::WindowEnd => {
                        if let Some((w, start)) = window.take() {
                            windows.push((w, start, cs.instructions()));
                        }
                    }
                }
            }
            cs.packed_instructions(batch.instructions.get(done..).unwrap_or(&[]));
            batch.instructions.clear();
            let _ = back_tx.try_send(batch);
        }
        let stats = decoder
            .join()
            .map_err(|_| DecodeError::whole(th.path.display(), "the decoding thread panicked"))??;
        let counted = cs.counted();
        Ok((cs.finish_with(), windows, counted, stats))
    })
}
