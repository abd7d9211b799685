//! The decoder of one PT window, [`PtDecoder`]: the image over time, our own flow
//! reconstruction (`flow`) and libipt's block decoder (through the `ipt` module) where
//! that does not apply -> [`Record`]s, handed out through its output queue as a
//! [`TraceDecoder`].
//!
//! With libipt it syncs forward to the first PSB, then decodes blocks and expands each into instruction
//! records (following direct jumps/calls within a block, as libipt does). libipt events
//! become markers. On any decode error a [`Record::Gap`] (PT offset, address, libipt's
//! error text) is emitted and decoding resumes at the next PSB.

use std::ops::ControlFlow;
use std::rc::Rc;

use super::config::TraceParams;
use super::image::AddressSpace;
use super::insn::{BlockCache, InsnCache};
use super::ipt::{self, Block, BlockDecoder, Ev, PtErr, SharedImage, PTS_EOS, PTS_EVENT_PENDING};
use super::records::{ExecMode, Gap, GapKind, InsnClass, Instruction, Record};
use super::sideband::{ImageEvent, ImageResolver, ImageTimeline};
use super::DecodeError;

pub(crate) mod flow;
mod queue;
pub use flow::DecoderKind;

pub use crate::compact::CompactRecords;
use crate::decoder::TraceDecoder;
use crate::runs::Runs;
use queue::{Drained, Item, ItemQueue};

/// Per-window decoding options.
#[derive(Debug, Clone, Default)]
pub struct WindowOptions {
    /// Name of the input (file path) used in gap records and errors.
    pub source: String,
    /// Emit a leading [`Record::WindowId`].
    pub window_id: Option<u64>,
    /// Emit a leading [`Record::Cpu`].
    pub cpu: Option<u32>,
    /// Offset of `pt` within the input file (added to every reported PT offset).
    pub base_offset: u64,
    /// Which decoder runs (the fast one by default, same records).
    pub decoder: DecoderKind,
    /// After a decode error, resume at the next packet that gives an IP (TIP, TIP.PGE,
    /// FUP-bound events, OVF) as libipt 2.2's `pt_blk_resync` (ptxed `--resync-on-error`)
    /// does, instead of at the next PSB: the fast decoder's `flow::resync`.
    pub resync_on_error: bool,
    /// Report changes of the interrupt flag ([`Record::InterruptFlag`]) as libipt's
    /// iflags events (ptxed `--event:iflags`). libipt then also takes a MODE.Exec that
    /// changes only IF as an event (bound to its FUP or TIP) and a PSB+ that states
    /// another IF than the trace before it as a bad status update.
    pub iflags_events: bool,
}

/// A cut point of parallel decode: a PSB at which the decoder of the next segment starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// Which segment starts there.
    pub index: usize,
    /// Offsets of the PSB and of the PSBEND ending its PSB+, in this decoder's buffer.
    pub psb: u64,
    pub psbend: u64,
}

/// A decoder's state where it reached a [`Mark`] (PSB+ processed, nothing after it), as
/// far as the records after it can depend on it. `None` fields: this decoder has not
/// set them yet (they are what it started with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handover {
    pub index: usize,
    /// Reached by synchronizing there (after an error), not by decoding through it.
    pub via_sync: bool,
    /// The TSC libipt gave the PSB+ (its time after the PSB+).
    pub event_tsc: Option<u64>,
    pub tsc: Option<u64>,
    pub pending_timestamp: bool,
    pub last_timestamp: Option<Option<u64>>,
    /// Sideband events applied.
    pub timeline: Option<usize>,
    /// Instructions decoded after the PSB+ before the IP of its FUP, where the next
    /// segment's decoder starts (they belong to this decoder's records).
    pub delta: u64,
}

/// The first gap of a decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstGap {
    /// libipt's error code.
    Pt(i32),
    /// Too many instructions without trace.
    Progress,
    /// Instruction bytes libipt decoded but we cannot.
    Unreadable,
    /// A branch libipt's instruction decoder does not know ([`InsnInfo::beyond_libipt`]).
    ///
    /// [`InsnInfo::beyond_libipt`]: crate::insn::InsnInfo::beyond_libipt
    BeyondLibipt,
    /// Anything else (lost data).
    Other,
}

impl FirstGap {
    pub fn is_retstack_empty(self) -> bool {
        matches!(self, FirstGap::Pt(c) if PtErr(c).is_retstack_empty())
    }
}

/// What parallel decode needs to know about one segment decoder's run.
#[derive(Debug, Clone, Default)]
pub(crate) struct SegReport {
    /// Its first PSB+: whether it is the PSB+ at the decoder's start (synchronized there
    /// first), the TSC libipt gave it, and the pending-timestamp flag then.
    pub start: Option<(bool, Option<u64>, bool)>,
    pub first_gap: Option<FirstGap>,
    /// Sideband events applied by the first image update that had the trace's time.
    pub first_advance: Option<usize>,
    /// Where it stopped.
    pub handover: Option<Handover>,
    /// It stopped, without a handover, after passing the marks it was allowed to.
    pub gave_up: bool,
    /// It decoded instructions before the trace told the execution mode (after
    /// synchronizing at a PSB+ without MODE.Exec): libipt then decodes by the modes its
    /// block cache remembers from earlier decoding, which only a decoder that decoded
    /// everything before knows.
    pub unknown_mode: bool,
    /// The execution modes the trace set (bit per libipt mode): code decoded in one mode
    /// that libipt's block cache holds from another is decoded by its cache, so with more
    /// than one mode in a trace, what a decoder gives depends on what it decoded before.
    pub modes: u32,
    /// It had a gap whose place depends on where libipt ends its blocks (which, through
    /// libipt's block cache, depends on what was decoded before): instructions we cannot
    /// decode (the rest of their block is lost), too many instructions without trace
    /// (counted at block ends).
    pub block_bound: bool,
}

/// How a decoder of one segment of a trace starts (parallel decode).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegStart {
    /// The pending-timestamp flag after the first synchronization (`None`: set, as always).
    pub pending_timestamp: Option<bool>,
    /// The last timestamp emitted before (`None`: unknown: the first one is always emitted).
    pub last_timestamp: Option<Option<u64>>,
    /// The trace's time so far.
    pub tsc: Option<u64>,
    /// Whether the whole trace has TSC packets.
    pub trace_has_tsc: bool,
    /// Offset of the PSBEND of the PSB+ at the decoder's start.
    pub psbend: Option<u64>,
}

/// Segment control: how the decoder starts, the marks ahead and who decides whether to
/// stop at one.
pub(crate) struct SegCtl<'a> {
    start: SegStart,
    /// Marks after the start, ascending; `next` is the first not yet passed.
    marks: Vec<Mark>,
    next: usize,
    /// Called where the decoder reaches a mark with its state there; `true`: stop there.
    stop: Box<dyn FnMut(&Handover) -> bool + 'a>,
    /// Stop at the first PSB+ after passing this many marks.
    give_up: Option<usize>,
    report: SegReport,
    /// A mark reached at a PSB+ with FUP, decided by the blocks after it.
    awaiting: Option<Awaiting>,
}

/// A mark reached at a PSB+ with FUP, not decided yet.
#[derive(Debug, Clone, Copy)]
struct Awaiting {
    handover: Handover,
    /// The FUP IP.
    fup: u64,
    /// The queue position at the mark.
    queued: u64,
    /// Items after the mark looked at, and the instructions among them.
    scanned: usize,
    insns: u64,
}

/// Whether the instruction consumes trace (a branch the decoder cannot follow alone).
fn needs_trace(i: &Instruction) -> bool {
    match i.class {
        InsnClass::Other | InsnClass::Ptwrite => false,
        InsnClass::Call | InsnClass::Jump => super::insn::decode_insn(i.encoding(), i.pc, i.mode)
            .is_none_or(|d| d.direct_target.is_none()),
        _ => true,
    }
}

impl<'a> SegCtl<'a> {
    pub fn new(
        start: SegStart,
        marks: Vec<Mark>,
        stop: Box<dyn FnMut(&Handover) -> bool + 'a>,
        give_up: Option<usize>,
    ) -> Self {
        SegCtl {
            start,
            marks,
            next: 0,
            stop,
            give_up,
            report: SegReport::default(),
            awaiting: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    NeedSync,
    Running(u32),
    Done,
}

/// Iterator over the records of one PT window.
pub struct PtDecoder<'a> {
    dec: BlockDecoder<'a>,
    /// The PT being decoded.
    trace: &'a [u8],
    /// How libipt reads its packets on the trace's CPU (errata SKD007, SKZ84).
    wire: crate::wire::WireErrata,
    /// The shared section cache handed in with [`DecoderCaches`], handed on.
    sections: Option<std::sync::Arc<ipt::SectionCache>>,
    shared: Rc<SharedImage>,
    timeline: ImageTimeline,
    resolver: ImageResolver,
    params: TraceParams,
    cache: InsnCache,
    blocks: BlockCache<flow::FlowTable>,
    queue: ItemQueue,
    /// Arena range of the block being handed out record by record (`Iterator::next`).
    cur: usize,
    cur_end: usize,
    /// Records handed out by `next_slice` (markers batch / current block).
    batch: Vec<Record>,
    /// `fast_ready` held for the current state when `fill` last returned, and nothing
    /// since changed that: `step_fast` may run.
    fast: bool,
    /// Output buffer of `step_fast`.
    blk: Block,

    state: State,
    opts: WindowOptions,
    /// Sync offset of the last failed decode (resync must move past it).
    last_error_sync: Option<u64>,
    failed_syncs: u32,
    /// Image warnings not yet reported (files that could not be opened...).
    warnings: Vec<String>,
    /// Emit a timestamp before the next instructions (set at sync points).
    pending_timestamp: bool,
    /// The pending flag the first synchronization leaves (segment decoders).
    start_pending: Option<bool>,
    /// The last timestamp before this decoder's start is unknown: emit the next one
    /// whatever it is (segment decoders; parallel decode drops it where it repeats).
    ts_unknown: bool,
    /// Sideband has been applied with the trace's time known.
    advanced: bool,
    /// The trace told the execution mode since the last synchronization (tracked for
    /// segment decoders).
    mode_known: bool,
    /// Parallel decode's control of a segment decoder.
    seg: Option<Box<SegCtl<'a>>>,
    progress_offset: Option<u64>,
    insns_without_progress: u64,
    insns_since_check: u64,
    /// The trace's time: TSC of the latest event that carried one.
    tsc: Option<u64>,
    last_timestamp: Option<u64>,
    /// Whether the trace has any TSC packet (else sideband applies without time order).
    trace_has_tsc: bool,
    /// Bytes of PT in this window.
    pt_len: usize,
    /// The fast decoder's state while it runs the window.
    flow: Option<Box<flow::FlowState>>,
    /// Why the fast decoder handed the window to libipt.
    fallback: Option<flow::Fallback>,
    /// The image and its sideband events as the window started, while the fast decoder
    /// applies them (libipt starts over from them if it hands the window over).
    sideband_start: Option<Box<(AddressSpace, Vec<ImageEvent>)>>,
    /// An image change the fast decoder cannot follow: it hands the window to libipt.
    sideband_failed: Option<flow::Fallback>,
    /// An image change while tracing was off changed code the fast decoder had decoded:
    /// its blocks are built anew at the TIP.PGE that enables tracing.
    sideband_rebuild: bool,
    /// The block just expanded holds a branch libipt does not know: decoding stops there
    /// (a gap) and resumes at the next PSB.
    stop_at_unknown_branch: bool,
    /// Records libipt gives that the fast decoder handed out already (dropped).
    skip: u64,
    /// The fast decoder decoded the whole window.
    flow_done: bool,
    /// A decoder of part of a trace (parallel decode with the fast decoder): how it
    /// started and ended; it fails rather than hand the trace to libipt.
    part: Option<Box<flow::PartReport>>,
}

/// Instructions decoded while the trace position stands still before declaring a gap.
const MAX_INSNS_WITHOUT_TRACE: u64 = 1 << 22;
/// How often (in instructions) the trace position is checked for progress.
const PROGRESS_CHECK: u64 = 1 << 16;

/// What a decoder learns about the code it walks (decoded instructions, the records of
/// whole blocks), valid for the image generation it was built for (generations are unique
/// in the process, see [`AddressSpace::generation`]). Handing it from one window's decoder
/// to the next ([`PtDecoder::with_caches`], [`PtDecoder::take_caches`]) spares every window
/// of a thread re-decoding the same code.
///
/// With [`DecoderCaches::sharing_sections`] the decoders also share libipt's file sections
/// and their block caches (built once, not once per window): every window whose PT is
/// 64-bit only takes part (libipt's block cache keeps each instruction's mode, so a window
/// with other modes, or damaged packets, gets sections of its own and decodes exactly as
/// it would alone).
#[derive(Default)]
pub struct DecoderCaches {
    insns: InsnCache,
    blocks: BlockCache<flow::FlowTable>,
    sections: Option<std::sync::Arc<ipt::SectionCache>>,
}

impl DecoderCaches {
    /// Keeps what is current for the image of generation `from` (what an older image left
    /// goes), for an image of generation `to` whose code the caller checked is the same
    /// ([`AddressSpace::same_code`]).
    pub fn carry(&mut self, from: u64, to: u64) {
        self.insns.carry(from, to);
        if self.blocks.is_valid(from) {
            self.blocks.keep_for(to);
        }
    }

    /// Caches that also share file sections between the decoders they are handed to.
    pub fn sharing_sections() -> Self {
        DecoderCaches {
            sections: ipt::SectionCache::new().map(std::sync::Arc::new),
            ..Default::default()
        }
    }
}

impl<'a> PtDecoder<'a> {
    /// This decoder, starting with `caches` (from an earlier decoder) instead of empty ones.
    /// Call before decoding.
    pub fn with_caches(mut self, caches: DecoderCaches) -> Self {
        if !self.blocks.retire {
            self.cache = caches.insns;
            self.blocks = caches.blocks;
        }
        if caches.sections.is_some() {
            // (Whether libipt may use them is found out only if it decodes: most windows
            // are the fast decoder's, and reading every packet up front cost 2-5% of
            // decoding's machine instructions.)
            self.dec.sections = caches.sections.clone();
            self.dec.sections_unchecked = true;
        }
        self.sections = caches.sections;
        self
    }

    /// Before libipt's decoder first decodes with the shared sections: they stay only
    /// when every packet of the trace is one [`crate::wire::only_64bit`] reads and every
    /// MODE.Exec says 64-bit (libipt's block cache in them keeps each instruction's mode);
    /// else the decoder gets sections of its own, pushed again at its next image sync.
    #[cold]
    #[inline(never)]
    fn check_sections(&mut self) {
        self.dec.sections_unchecked = false;
        if !crate::wire::only_64bit(self.trace) {
            self.dec.sections = ipt::SectionCache::new().map(std::sync::Arc::new);
            self.dec.forget_image_sync();
        }
    }

    /// The image decoding keeps up to date (sideband applied), shared with the decoder.
    pub(crate) fn image(&self) -> Rc<SharedImage> {
        self.shared.clone()
    }

    /// The caches this decoder built (no block records when it kept them for a compact
    /// collection, which owns them). Call when done with the decoder.
    pub fn take_caches(&mut self) -> DecoderCaches {
        let sections = self.sections.take();
        if self.blocks.retire {
            // (The decoded instructions stay valid; the block records went to the output.)
            return DecoderCaches {
                insns: std::mem::take(&mut self.cache),
                sections,
                ..Default::default()
            };
        }
        DecoderCaches {
            insns: std::mem::take(&mut self.cache),
            blocks: std::mem::take(&mut self.blocks),
            sections,
        }
    }

    /// A decoder over `pt` (raw PT packets) with an initial `image` and the image changes
    /// `events` (from sideband), resolved through `resolver`.
    pub fn new(
        pt: &'a [u8],
        params: TraceParams,
        image: AddressSpace,
        events: Vec<ImageEvent>,
        resolver: ImageResolver,
        opts: WindowOptions,
    ) -> Result<Self, DecodeError> {
        let trace_has_tsc = params.time.is_some() && ipt::has_tsc(pt);
        Self::new_inner(pt, params, image, events, resolver, opts, trace_has_tsc)
    }

    fn new_inner(
        pt: &'a [u8],
        params: TraceParams,
        image: AddressSpace,
        events: Vec<ImageEvent>,
        resolver: ImageResolver,
        opts: WindowOptions,
        trace_has_tsc: bool,
    ) -> Result<Self, DecodeError> {
        // (Kept for a fallback to libipt where the fast decoder applies sideband.)
        let start = (opts.decoder == DecoderKind::Fast && !events.is_empty())
            .then(|| Box::new((image.clone(), events.clone())));
        let shared = Rc::new(SharedImage {
            space: std::cell::RefCell::new(image),
            last_nomap: std::cell::Cell::new(None),
        });
        let errata = super::errata::of(&params.cpu).unwrap_or_default();
        let pt_len = pt.len();
        let (dec, state) =
            match BlockDecoder::new(&params, errata, pt, shared.clone(), opts.iflags_events) {
                Ok(d) => (d, State::Start),
                Err(e) if e.is_eos() => {
                    // Empty trace: a decoder over one dummy byte that reports nothing.
                    static ONE: [u8; 1] = [0];
                    let d = BlockDecoder::new(&params, errata, &ONE, shared.clone(), false)
                        .map_err(|e| DecodeError::new(&opts.source, opts.base_offset, e.text()))?;
                    (d, State::Done)
                }
                Err(e) => {
                    return Err(DecodeError::new(
                        &opts.source,
                        opts.base_offset,
                        format!("cannot create libipt decoder: {}", e.text()),
                    ))
                }
            };
        // File sections through a section cache of the decoder's own: its LRU keeps them
        // mapped, and with them libipt's block caches, which libipt otherwise frees each
        // time the decoder moves to another section and zeroes again when it comes back.
        let mut dec = dec;
        dec.sections = ipt::SectionCache::new().map(std::sync::Arc::new);
        let mut queue = ItemQueue::with_capacity(1024);
        if let Some(w) = opts.window_id {
            queue.push_rec(Record::WindowId(w));
        }
        if let Some(c) = opts.cpu {
            queue.push_rec(Record::Cpu(c));
        }
        // What the fast decoder does not read: such a window is libipt's from its start.
        let fast_start = opts.decoder == DecoderKind::Fast && state == State::Start;
        let not_fast = (fast_start
            && events
                .iter()
                .any(|e| matches!(e.change, super::sideband::ImageChange::Lost { .. })))
        .then_some("sideband that reports lost data during the window");
        let wire = crate::wire::WireErrata {
            skd007: errata.skd007,
            skz84: errata.skz84,
        };
        let flow = (fast_start && not_fast.is_none()).then(|| {
            // (libipt 2.1.2's decoder never arms the SKL168 check.)
            let clock = crate::timing::TimeCfg {
                skl168: false,
                ..crate::timing::TimeCfg::of(&params.cpu, &errata)
            };
            let mut f = flow::FlowState::new(errata.bdm70, errata.skd022, clock);
            f.initial_records = queue.records;
            f.resync = opts.resync_on_error;
            f.iflags = opts.iflags_events;
            (f.skd010, f.apl11, f.apl12) = (errata.skd010, errata.apl11, errata.apl12);
            f.bdm64 = errata.bdm64;
            f.wire = wire;
            // (libipt applies SKL014 where any address range is configured.)
            f.skl014 = (errata.skl014 && params.filter.ranges.iter().any(|r| r.0 != 0))
                .then_some(params.filter);
            Box::new(f)
        });
        let mut d = PtDecoder {
            dec,
            trace: pt,
            wire,
            sections: None,
            shared,
            timeline: ImageTimeline::new(events),
            resolver,
            params,
            cache: InsnCache::default(),
            blocks: BlockCache::default(),
            queue,
            cur: 0,
            cur_end: 0,
            batch: Vec::new(),
            fast: false,
            blk: Block::empty(),
            state,
            opts,
            last_error_sync: None,
            failed_syncs: 0,
            warnings: Vec::new(),
            pending_timestamp: false,
            start_pending: None,
            ts_unknown: false,
            advanced: false,
            mode_known: false,
            seg: None,
            progress_offset: None,
            insns_without_progress: 0,
            insns_since_check: 0,
            tsc: None,
            last_timestamp: None,
            trace_has_tsc,
            pt_len,
            flow,
            fallback: not_fast,
            sideband_start: None,
            sideband_failed: None,
            sideband_rebuild: false,
            stop_at_unknown_branch: false,
            skip: 0,
            flow_done: false,
            part: None,
        };
        if d.flow.is_some() && start.is_some() {
            d.sideband_start = start;
            if !trace_has_tsc {
                // Without the trace's time libipt's path applies every event before the
                // first instruction; so does the fast decoder, with nothing decoded yet.
                d.apply_sideband(None);
            }
        }
        Ok(d)
    }

    /// A decoder of the part of a trace from a PSB (or the trace's start) on, for parallel
    /// decode: it starts as `ctl` says, stops where it says, and reports what the
    /// stitching needs ([`PtDecoder::collect_segment`]).
    pub(crate) fn new_segment(
        pt: &'a [u8],
        params: TraceParams,
        image: AddressSpace,
        events: Vec<ImageEvent>,
        resolver: ImageResolver,
        opts: WindowOptions,
        ctl: SegCtl<'a>,
    ) -> Result<Self, DecodeError> {
        let start = ctl.start;
        let trace_has_tsc = params.time.is_some() && start.trace_has_tsc;
        let mut d = Self::new_inner(pt, params, image, events, resolver, opts, trace_has_tsc)?;
        d.start_pending = start.pending_timestamp;
        match start.last_timestamp {
            Some(t) => d.last_timestamp = t,
            None => d.ts_unknown = true,
        }
        d.tsc = start.tsc;
        d.seg = Some(Box::new(ctl));
        // (Segment decoders report libipt's state at their marks.)
        d.flow = None;
        Ok(d)
    }

    /// Decodes to the end or to the mark where it stops: the records (as
    /// [`collect_compact`](Self::collect_compact)) and the report.
    pub(crate) fn collect_segment(mut self) -> (CompactRecords, SegReport) {
        let recs = self.collect_compact_mut();
        let report = self.seg.take().map(|s| s.report).unwrap_or_default();
        (recs, report)
    }

    /// Image problems met so far (files named by sideband that could not be opened...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn offset(&self) -> u64 {
        self.opts.base_offset + self.dec.offset().unwrap_or(0)
    }

    fn push_gap(&mut self, err: PtErr, ip: Option<u64>) {
        let mut error = err.text();
        let here = self.dec.offset().and_then(|o| usize::try_from(o).ok());
        let trig = here.and_then(|o| crate::wire::parse_trig(self.trace.get(o..)?));
        if trig.is_some_and(|(t, _)| t.ip) {
            error = format!(
                "{error}: a TRIG with the IP bit (bound to the FUP after it) is beyond \
                 libipt 2.1.2"
            );
        }
        if err.is_nomap() {
            if let Some(ip) = ip {
                error = format!("{error}: no code image covers {ip:#x}");
            }
        }
        self.push_gap_text(error, ip);
    }

    fn push_gap_text(&mut self, error: String, ip: Option<u64>) {
        self.queue.push_rec(Record::Gap(Box::new(Gap {
            kind: GapKind::DecodeError,
            ip,
            pt_offset: self.offset(),
            source: self.opts.source.clone(),
            error,
        })));
    }

    /// Emits a timestamp for `tsc` unless it repeats the last one.
    fn timestamp(&mut self, tsc: u64) {
        self.pending_timestamp = false;
        if self.last_timestamp == Some(tsc) && !self.ts_unknown {
            return;
        }
        self.ts_unknown = false;
        self.last_timestamp = Some(tsc);
        let perf_time = self.params.time.map(|c| c.tsc_to_perf_time(tsc));
        self.queue.push_rec(Record::Timestamp { tsc, perf_time });
    }

    /// The sync point's timestamp, once the trace's time is known.
    fn flush_pending_timestamp(&mut self) {
        if self.pending_timestamp {
            if let Some(t) = self.tsc {
                self.timestamp(t);
            }
        }
    }

    /// Applies the sideband events that happened before the trace's current time. For a
    /// trace without TSC packets (or without a time conversion), everything is applied.
    fn advance_image(&mut self) {
        if self.timeline.is_done() {
            return;
        }
        let now = match (self.params.time, self.tsc) {
            (Some(conv), Some(tsc)) => Some(conv.tsc_to_perf_time(tsc)),
            // Time comes with the trace's first events: wait for it.
            (Some(_), None) if self.trace_has_tsc => return,
            _ => None,
        };
        self.advanced = true;
        self.apply_sideband(now);
        if let Some(seg) = self.seg.as_mut() {
            seg.report
                .first_advance
                .get_or_insert(self.timeline.applied());
        }
    }

    /// Applies the sideband events up to `now` (all when `None`).
    fn apply_sideband(&mut self, now: Option<u64>) {
        if let (Some(now), Some(next)) = (now, self.timeline.next_time()) {
            if next > now {
                return;
            }
        }
        let Ok(mut space) = self.shared.space.try_borrow_mut() else {
            return;
        };
        let (w, losses) = self.timeline.advance(now, &mut space, &mut self.resolver);
        drop(space);
        for what in losses {
            self.note_gap(FirstGap::Other);
            let pt_offset = self.offset();
            self.queue.push_rec(Record::Gap(Box::new(Gap {
                kind: GapKind::LostData,
                ip: None,
                pt_offset,
                source: self.opts.source.clone(),
                error: what,
            })));
        }
        for msg in w {
            if !self.warnings.contains(&msg) {
                self.warnings.push(msg);
            }
        }
    }

    fn sync(&mut self) {
        let first = self.state == State::Start;
        let start_pending = if first {
            self.start_pending.take()
        } else {
            None
        };
        match self.dec.sync_forward() {
            Ok(status) => {
                let here = self.dec.sync_offset();
                if !first && here.is_some() && here <= self.last_error_sync {
                    // libipt came back to the PSB that failed: skip it.
                    self.failed_syncs += 1;
                    if self.failed_syncs > 2 {
                        self.state = State::Done;
                    }
                    return;
                }
                self.failed_syncs = 0;
                self.mode_known = false;
                self.pending_timestamp = start_pending.unwrap_or(true);
                self.state = State::Running(status);
            }
            Err(e) if e.is_eos() => self.state = State::Done,
            Err(e) => {
                let here = self.dec.offset();
                self.push_gap(e, None);
                self.note_gap(FirstGap::Pt(e.0));
                if here.is_some() && here <= self.last_error_sync {
                    self.state = State::Done;
                } else {
                    self.last_error_sync = here;
                    self.state = State::NeedSync;
                }
            }
        }
    }

    fn fail(&mut self, e: PtErr, ip: Option<u64>) {
        if e.is_eos() {
            self.state = State::Done;
            return;
        }
        self.push_gap(e, ip);
        self.note_gap(FirstGap::Pt(e.0));
        self.last_error_sync = self.dec.sync_offset().or(self.last_error_sync);
        self.state = State::NeedSync;
    }

    /// Notes a gap for parallel decode (the first one; a mark awaited is missed).
    fn note_gap(&mut self, g: FirstGap) {
        if let Some(seg) = self.seg.as_mut() {
            seg.report.first_gap.get_or_insert(g);
            seg.report.block_bound |= matches!(
                g,
                FirstGap::Progress | FirstGap::Unreadable | FirstGap::BeyondLibipt
            );
            seg.awaiting = None;
        }
    }

    /// A PSB+ was decoded (its status event, taken at trace offset `before`, had
    /// `event_tsc`): a segment decoder notes its start or whether it reached a mark. At a
    /// PSB+ without FUP it may stop right here; at one with FUP, at the first block after
    /// it ([`seg_block`](Self::seg_block)).
    #[cold]
    fn seg_psb(&mut self, before: Option<u64>, event_tsc: Option<u64>, fup: Option<u64>) {
        let sync_offset = self.dec.sync_offset();
        let here = Handover {
            index: 0,
            via_sync: false,
            event_tsc,
            tsc: self.tsc,
            pending_timestamp: self.pending_timestamp,
            last_timestamp: (!self.ts_unknown).then_some(self.last_timestamp),
            timeline: self.advanced.then(|| self.timeline.applied()),
            delta: 0,
        };
        let queued = self.queue.pushed;
        let Some(seg) = self.seg.as_mut() else {
            return;
        };
        seg.awaiting = None;
        if seg.report.start.is_none() {
            let ok = sync_offset == Some(0) && before.is_some() && before == seg.start.psbend;
            seg.report.start = Some((ok, event_tsc, self.pending_timestamp));
            if ok {
                return;
            }
        }
        let Some(pos) = before else {
            return;
        };
        while seg.marks.get(seg.next).is_some_and(|m| m.psbend < pos) {
            seg.next += 1;
        }
        let Some(&m) = seg.marks.get(seg.next).filter(|m| m.psbend == pos) else {
            if seg.give_up.is_some_and(|g| seg.next >= g) {
                seg.report.gave_up = true;
                self.state = State::Done;
            }
            return;
        };
        seg.next += 1;
        let h = Handover {
            index: m.index,
            via_sync: sync_offset == Some(m.psb),
            ..here
        };
        match fup {
            Some(ip) => {
                seg.awaiting = Some(Awaiting {
                    handover: h,
                    fup: ip,
                    queued,
                    scanned: 0,
                    insns: 0,
                })
            }
            None => {
                if (seg.stop)(&h) {
                    seg.report.handover = Some(h);
                    self.state = State::Done;
                }
            }
        }
    }

    /// A block after a mark reached at a PSB+ with FUP: the records after the mark equal
    /// those of the next segment's decoder (which starts at the FUP IP) when they start
    /// there too; or when they run into the FUP IP without trace, the instructions before
    /// it belong here. The mark is missed when trace or anything but instructions comes
    /// first; undecided while the straight-line run goes on. Returns whether it stopped.
    #[cold]
    fn seg_block(&mut self) -> bool {
        let Some(mut aw) = self.seg.as_mut().and_then(|s| s.awaiting.take()) else {
            return false;
        };
        let Some(after) = self.queue.since(aw.queued) else {
            return false;
        };
        // Where the next segment's records start: (item, records of it to keep).
        let mut cut = None;
        for (k, item) in after.iter().enumerate().skip(aw.scanned) {
            let recs = match item {
                Item::Rec(r) => self.queue.rec(*r).map_or(&[][..], std::slice::from_ref),
                Item::Block(start, len) => {
                    let (start, len) = (*start as usize, *len as usize);
                    self.blocks.arena.get(start..start + len).unwrap_or(&[])
                }
            };
            for (i, r) in recs.iter().enumerate() {
                match r {
                    Record::Instruction(x) if x.pc == aw.fup => {
                        cut = Some((k, i));
                        break;
                    }
                    // (A sync-point timestamp: the next decoder's own if it starts here.)
                    Record::Timestamp { .. } if aw.insns == 0 => {}
                    Record::Instruction(x) if !needs_trace(x) => aw.insns += 1,
                    _ => return false,
                }
            }
            if cut.is_some() {
                break;
            }
        }
        let Some((k, i)) = cut else {
            aw.scanned = after.len();
            if let Some(seg) = self.seg.as_mut() {
                seg.awaiting = Some(aw);
            }
            return false;
        };
        let timestamps = after[..k]
            .iter()
            .any(|it| matches!(it, Item::Rec(r) if matches!(self.queue.rec(*r), Some(Record::Timestamp { .. }))));
        if aw.insns > 0 && timestamps {
            return false;
        }
        let drop = after.len() - k;
        let keep = match &after[k] {
            Item::Block(start, _) if i > 0 => Some(Item::Block(*start, i as u32)),
            _ => None,
        };
        self.hand_over(&aw, drop, keep)
    }

    /// Ends this segment's decoder at the mark `aw` (the next segment's decoder goes on from
    /// there) when the parallel decode accepts the handover: the last `drop` queued items go,
    /// `keep` is queued instead. Returns whether it stopped.
    fn hand_over(&mut self, aw: &Awaiting, drop: usize, keep: Option<Item>) -> bool {
        let mut h = aw.handover;
        h.delta = aw.insns;
        let Some(seg) = self.seg.as_mut() else {
            return false;
        };
        if !(seg.stop)(&h) {
            return false;
        }
        seg.report.handover = Some(h);
        self.queue.truncate_last(drop);
        if let Some(item) = keep {
            self.queue.push_back(item);
        }
        self.state = State::Done;
        true
    }

    /// An event after a mark reached at a PSB+ with FUP, before trace was needed: libipt
    /// reports an asynchronous one where the decoder is at its IP; if that is the FUP IP,
    /// the next segment's decoder (which starts there) reports it the same way. Otherwise
    /// the mark is missed. Returns whether it stopped.
    #[cold]
    fn seg_event(&mut self, kind: Ev) -> bool {
        let Some(aw) = self.seg.as_mut().and_then(|s| s.awaiting.take()) else {
            return false;
        };
        let at = match kind {
            Ev::AsyncBranch { from, .. } => from,
            Ev::AsyncDisabled { at, .. } => at,
            _ => return false,
        };
        let Some(after) = self.queue.since(aw.queued) else {
            return false;
        };
        let timestamps = after
            .iter()
            .any(|it| matches!(it, Item::Rec(r) if matches!(self.queue.rec(*r), Some(Record::Timestamp { .. }))));
        if at != aw.fup || aw.scanned != after.len() || (aw.insns > 0 && timestamps) {
            return false;
        }
        // Records after the mark: none but the instructions up to the FUP IP.
        let drop = if aw.insns == 0 { after.len() } else { 0 };
        self.hand_over(&aw, drop, None)
    }

    fn event(&mut self) -> Result<u32, PtErr> {
        // (The event decoder's position while the event is still pending: for a PSB+'s
        // event, the offset of its PSBEND.)
        let before = match self.seg {
            Some(_) => self.dec.offset(),
            None => None,
        };
        let (status, ev) = self.dec.event()?;
        let (kind, tsc, status_update) = (ev.kind, ev.tsc, ev.status_update);
        if let Some(t) = tsc {
            self.tsc = Some(t);
        }
        if let Some(mode) = ev.exec_mode {
            self.mode_known = true;
            if let Some(seg) = self.seg.as_mut() {
                seg.report.modes |= 1 << mode.min(31);
            }
        }
        if status_update {
            // A PSB+ (its enabled/disabled status; other status events come with it).
            let fup = match kind {
                Ev::Enabled { ip, .. } => Some(Some(ip)),
                Ev::Disabled { .. } => Some(None),
                _ => None,
            };
            if let Some(fup) = fup {
                // The trace moved on: progress counting starts over (so that it does
                // not depend on where decoding started).
                self.insns_since_check = 0;
                self.progress_offset = None;
                self.insns_without_progress = 0;
                if self.seg.is_some() {
                    self.seg_psb(before, tsc, fup);
                }
            }
            return Ok(status);
        }
        if self.seg.as_ref().is_some_and(|s| s.awaiting.is_some()) && self.seg_event(kind) {
            return Ok(status);
        }
        if kind == Ev::Other {
            return Ok(status);
        }
        match tsc {
            Some(t) => self.timestamp(t),
            None => self.flush_pending_timestamp(),
        }
        match kind {
            Ev::Enabled { ip, .. } => {
                self.queue.push_rec(Record::TraceEnabled { ip });
            }
            Ev::Disabled { ip } => {
                self.queue.push_rec(Record::TraceDisabled { ip });
            }
            Ev::AsyncDisabled { at, .. } => {
                self.queue.push_rec(Record::TraceDisabled { ip: Some(at) });
            }
            Ev::AsyncBranch { from, to } => {
                self.queue.push_rec(Record::KernelXfer { from, to });
            }
            Ev::Overflow { ip } => {
                self.queue.push_rec(Record::Overflow { ip });
            }
            Ev::Iflags { enabled, ip } => {
                self.queue.push_rec(Record::InterruptFlag { enabled, ip });
            }
            Ev::Other => {}
        }
        Ok(status)
    }

    /// Expands a block into instruction records; returns the address after the last one.
    fn expand(&mut self, blk: &Block) -> Option<u64> {
        let mode = blk.mode();
        let key = blk.key();
        let generation = self.shared.space.try_borrow().ok()?.generation();
        // Safe to reset the arena here: `fill` only runs with an empty queue, and this
        // run_once has queued no block yet.
        self.blocks.validate(generation);
        if let Some((start, len, next)) = self.blocks.get(&key) {
            self.queue.push_back(Item::Block(start, len));
            return Some(next);
        }
        let start = self.blocks.arena.len();
        let mut out = std::mem::take(&mut self.blocks.arena);
        let next = self.expand_uncached(blk, mode, &mut out);
        self.blocks.arena = out;
        let len = self.blocks.arena.len() - start;
        let (Ok(start32), Ok(len32)) = (u32::try_from(start), u32::try_from(len)) else {
            return next;
        };
        if len > 0 {
            self.queue.push_back(Item::Block(start32, len32));
        }
        let next = next?;
        // Truncated blocks (an instruction split across sections) are not cached.
        if blk.truncated_insn().is_none() {
            self.blocks.insert(key, (start32, len32, next));
        }
        Some(next)
    }

    fn expand_uncached(
        &mut self,
        blk: &Block,
        mode: ExecMode,
        out: &mut Vec<Record>,
    ) -> Option<u64> {
        let n = blk.ninsn();
        let mut pc = blk.ip();
        let Ok(space) = self.shared.space.try_borrow() else {
            return None;
        };
        for i in 0..n {
            let info = match self.cache.get(&space, pc, mode) {
                Some(info) => info,
                None if i + 1 == n && blk.truncated_insn().is_some() => {
                    super::insn::decode_insn(blk.truncated_insn()?, pc, mode)?
                }
                None => {
                    drop(space);
                    self.note_gap(FirstGap::Unreadable);
                    out.push(Record::Gap(Box::new(Gap {
                        kind: GapKind::DecodeError,
                        ip: Some(pc),
                        pt_offset: self.offset(),
                        source: self.opts.source.clone(),
                        error: "instruction bytes not readable from the image".into(),
                    })));
                    return None;
                }
            };
            info.push_records(out, pc, mode);
            if let Some(name) = info.beyond_libipt {
                // libipt 2.1.2 walks on past it as if it were no branch: what it decodes
                // from here on is not what ran.
                drop(space);
                self.note_gap(FirstGap::BeyondLibipt);
                self.stop_at_unknown_branch = true;
                out.push(Record::Gap(Box::new(Gap {
                    kind: GapKind::DecodeError,
                    ip: Some(pc),
                    pt_offset: self.offset(),
                    source: self.opts.source.clone(),
                    error: format!(
                        "{name}: a branch libipt 2.1.2 does not know (it would decode on past \
                         it as if it were none); decoding resumes at the next PSB (the fast \
                         decoder follows {name})"
                    ),
                })));
                return None;
            }
            pc = match info.direct_target {
                Some(t) if i + 1 < n => t,
                _ => pc.wrapping_add(u64::from(info.size)),
            };
        }
        Some(pc)
    }

    fn run_once(&mut self, mut status: u32) {
        while status & PTS_EVENT_PENDING != 0 {
            match self.event() {
                Ok(s) => status = s,
                Err(e) => return self.fail(e, None),
            }
            if self.state == State::Done {
                return;
            }
        }
        if status & PTS_EOS != 0 {
            // The trace ends here: what comes after the last instruction the trace
            // accounts for never ran as far as the trace can tell (libipt would walk on
            // through code that needs no trace; ptxed stops at `pts_eos` too).
            self.state = State::Done;
            return;
        }
        self.advance_image();
        if self.dec.sections_unchecked {
            self.check_sections();
        }
        if let Err(e) = self.dec.sync_image() {
            return self.fail(e, None);
        }
        self.shared.last_nomap.set(None);
        let mut blk = Block::empty();
        let r = self.dec.next_block(&mut blk);
        self.after_block(status, &blk, r);
    }

    /// Whether the fast path (`run_hot`, `step_fast`) may replace `run_once(status)`: no event or trace
    /// end pending, no sideband left (the image cannot change), libipt's image and the
    /// block cache current, no timestamp waiting to be emitted. Everything `run_once`
    /// does before `next_block` is then a no-op.
    #[inline]
    fn fast_ready(&self, status: u32) -> bool {
        if status & (PTS_EVENT_PENDING | PTS_EOS) != 0
            || self.pending_timestamp
            || !self.timeline.is_done()
            || self
                .seg
                .as_ref()
                .is_some_and(|s| s.awaiting.is_some() || !self.mode_known)
        {
            return false;
        }
        let Ok(space) = self.shared.space.try_borrow() else {
            return false;
        };
        let generation = space.generation();
        self.dec.synced_generation() == Some(generation) && self.blocks.is_valid(generation)
    }

    /// The part of `run_once` after `next_block`: expand the block, check progress, and
    /// take the new status or handle the error.
    fn after_block(&mut self, status: u32, blk: &Block, r: Result<u32, PtErr>) {
        if blk.ninsn() > 0 {
            self.flush_pending_timestamp();
            if !self.mode_known {
                if let Some(seg) = self.seg.as_mut() {
                    seg.report.unknown_mode = true;
                }
            }
        }
        let next_ip = if blk.ninsn() > 0 {
            self.expand(blk)
        } else {
            Some(blk.ip())
        };
        if std::mem::take(&mut self.stop_at_unknown_branch) {
            // (The gap is queued: `expand_uncached`.)
            self.last_error_sync = self.dec.sync_offset().or(self.last_error_sync);
            self.state = State::NeedSync;
            return;
        }
        if self.seg.as_ref().is_some_and(|s| s.awaiting.is_some()) && self.seg_block() {
            return;
        }
        // A loop of direct branches needs no trace and would never end: bound the
        // instructions decoded without the trace position moving (checked every
        // PROGRESS_CHECK instructions to keep the FFI call off the fast path).
        self.insns_since_check += u64::from(blk.ninsn());
        if self.insns_since_check >= PROGRESS_CHECK {
            // (Blocks of up to 65535 instructions can take the count well past the
            // check interval: count what was decoded, not the interval.)
            let decoded = std::mem::take(&mut self.insns_since_check);
            let off = self.dec.offset();
            if off == self.progress_offset {
                self.insns_without_progress += decoded;
            } else {
                self.progress_offset = off;
                self.insns_without_progress = 0;
            }
            if self.insns_without_progress >= MAX_INSNS_WITHOUT_TRACE && r.is_ok() {
                self.push_gap_text(
                    format!(
                        "more than {MAX_INSNS_WITHOUT_TRACE} instructions without trace \
                         (endless loop of direct branches: wrong image or corrupt trace)"
                    ),
                    next_ip,
                );
                self.note_gap(FirstGap::Progress);
                self.last_error_sync = self.dec.sync_offset().or(self.last_error_sync);
                self.insns_without_progress = 0;
                self.state = State::NeedSync;
                return;
            }
        }
        match r {
            Ok(s) => self.state = State::Running(s),
            // After the trace's end libipt fails the first query that needs trace: that
            // is the normal end, not a gap.
            Err(e) if status & PTS_EOS != 0 && (e.is_eos() || e.is_bad_query()) => {
                self.state = State::Done
            }
            Err(e) => {
                // The IP ptxed reports the error at: the unmapped address; a failed
                // query's instruction (the block's last); otherwise the address after
                // the block (its start when it is empty; 0, none, before any IP).
                let ip = if e.is_nomap() {
                    self.shared.last_nomap.get().or(next_ip)
                } else if e.is_bad_query() && blk.ninsn() > 0 {
                    Some(blk.end_ip())
                } else {
                    next_ip.filter(|&ip| ip != 0)
                };
                self.fail(e, ip)
            }
        }
    }

    /// Runs the decoder until at least one record is queued or the trace ends (the fast
    /// paths take over from there), and notes whether they may.
    fn fill(&mut self) {
        while self.flow.is_some() {
            self.fast = false;
            let (pushed, records) = (self.queue.pushed, self.queue.records);
            match self.flow_run() {
                Ok(done) => {
                    if done {
                        // (A decoder of part of a trace: whether CYC came in its part.)
                        if let (Some(part), Some(f)) = (self.part.as_mut(), self.flow.as_ref()) {
                            part.calibrated = f.met_cyc();
                        }
                        self.flow = None;
                        self.flow_done = true;
                        self.state = State::Done;
                        return;
                    }
                    if !self.queue.is_empty() {
                        return;
                    }
                }
                Err(why) => {
                    if let Some(part) = self.part.as_mut() {
                        part.failed = Some(why);
                        self.flow = None;
                        self.state = State::Done;
                        return;
                    }
                    self.flow_fall_back(why, pushed, records)
                }
            }
        }
        loop {
            self.fill_inner();
            if self.skip == 0 || self.queue.is_empty() {
                break;
            }
            self.skip_front();
            if !self.queue.is_empty() {
                break;
            }
        }
        self.fast = self.skip == 0 && matches!(self.state, State::Running(s) if self.fast_ready(s));
    }

    /// Hands the window to libipt: drops what the fast decoder queued since the queue had
    /// seen `pushed` items and `records` records, and has libipt start over, skipping
    /// the records already handed out.
    #[cold]
    fn flow_fall_back(&mut self, why: flow::Fallback, pushed: u64, records: u64) {
        let initial = self.flow.as_ref().map_or(0, |f| f.initial_records);
        self.queue
            .truncate_last(self.queue.pushed.saturating_sub(pushed) as usize);
        self.queue.records = records;
        self.skip = records.saturating_sub(initial);
        self.flow = None;
        self.fallback = Some(why);
        if let Some(start) = self.sideband_start.take() {
            // libipt applies the sideband from the window's start, as the fast decoder did.
            let (space, events) = *start;
            if let Ok(mut s) = self.shared.space.try_borrow_mut() {
                *s = space;
            }
            self.timeline = ImageTimeline::new(events);
            self.advanced = false;
        }
        // The state libipt starts with (as `new` left it).
        self.pending_timestamp = false;
        self.tsc = None;
        self.last_timestamp = None;
        self.ts_unknown = false;
        self.state = State::Start;
    }

    /// Drops queued records libipt gives again after a fallback.
    fn skip_front(&mut self) {
        self.skip = self.queue.skip_records(self.skip);
    }

    /// One `run_once` on the fast path, for callers that checked `self.fast` and an empty
    /// queue: the cached block's (start, len) in the arena, unqueued. Anything but a cache
    /// hit goes through `after_block` (which may queue records) and returns `None`.
    #[inline(always)]
    fn step_fast(&mut self) -> Option<(u32, u32)> {
        match self
            .run_hot(&mut |_: &[Record], start: u32, len: u32| ControlFlow::Break((start, len)))
        {
            ControlFlow::Break(block) => Some(block),
            ControlFlow::Continue(()) => None,
        }
    }

    fn fill_inner(&mut self) {
        loop {
            match self.state {
                State::Done => return,
                State::Start | State::NeedSync => {
                    if self.state == State::Start {
                        if let Err(e) = self.dec.sync_image() {
                            self.fail(e, None);
                        }
                    }
                    self.sync()
                }
                State::Running(status) => self.run_once(status),
            }
            // (Records after a mark stay queued until it is decided.)
            if !self.queue.is_empty() && self.seg.as_ref().is_none_or(|s| s.awaiting.is_none()) {
                return;
            }
        }
    }
}

impl PtDecoder<'_> {
    pub(crate) fn collect_compact_mut(&mut self) -> CompactRecords {
        self.blocks.retire = true;
        let mut out = CompactRecords::default();
        // About one block per 2 bytes of PT (a TNT bit or a TIP each): reserved up front,
        // the item vector never moves while it grows (untouched capacity costs nothing).
        out.reserve((self.pt_len / 2).min(1 << 24));
        // The rest of a block partly consumed through `Iterator::next`.
        if self.cur < self.cur_end {
            let arena = self.blocks.retired.len() as u32;
            let (start, len) = (self.cur as u32, (self.cur_end - self.cur) as u32);
            out.push_block(arena, start, len, &self.blocks.arena);
            self.cur = self.cur_end;
        }
        loop {
            if self.queue.is_empty() {
                // The common case: cached blocks straight from libipt into the output,
                // without a trip through the queue.
                if self.hot_ready() {
                    let arena = self.blocks.retired.len() as u32;
                    let _ = self.run_hot(&mut |recs: &[Record], start: u32, len: u32| {
                        out.push_block(arena, start, len, recs);
                        ControlFlow::<()>::Continue(())
                    });
                }
                if self.queue.is_empty() {
                    self.fill();
                }
                if self.queue.is_empty() {
                    break;
                }
            }
            let arena = self.blocks.retired.len() as u32;
            for item in self.queue.drain() {
                match item {
                    Drained::Rec(r) => out.push_marker(r),
                    Drained::Block(start, len) => {
                        out.push_block(arena, start, len, &self.blocks.arena)
                    }
                }
            }
        }
        let mut arenas = std::mem::take(&mut self.blocks.retired);
        arenas.push(std::mem::take(&mut self.blocks.arena));
        out.set_arenas(arenas);
        out
    }

    /// `next_slice` out of line: `for_each_slice`'s way past its hot loop (keeps that
    /// loop small).
    #[inline(never)]
    fn next_slice_cold(&mut self) -> Option<&[Record]> {
        self.next_slice()
    }

    /// Whether `run_hot` may run: the fast path holds, nothing is queued and no block is
    /// partly consumed.
    #[inline]
    fn hot_ready(&self) -> bool {
        self.fast && self.cur >= self.cur_end && self.queue.is_empty()
    }

    /// The fast path: cached blocks, each handed to `f` as (arena, start, len) —
    /// the arena stays put meanwhile: cache hits never grow or reset it — until something
    /// other than a cache hit comes (handled by `after_block`, which may queue records),
    /// a status flag ends the fast path, or `f` breaks. Callers checked `hot_ready` (a
    /// partly consumed block and queued items come first).
    #[inline(always)]
    fn run_hot<B>(
        &mut self,
        f: &mut impl FnMut(&[Record], u32, u32) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let State::Running(status) = self.state else {
            self.fast = false;
            return ControlFlow::Continue(());
        };
        if status & (PTS_EVENT_PENDING | PTS_EOS) != 0 {
            self.fast = false;
            return ControlFlow::Continue(());
        }
        // Instructions the fast path may still take before the progress check is due
        // (`insns_since_check + ninsn < PROGRESS_CHECK` as a countdown).
        let mut left = (PROGRESS_CHECK - 1).saturating_sub(self.insns_since_check);
        loop {
            // (`last_nomap` is not reset as `run_once` does: every failed read of the
            // callback sets it, and a nomap error always comes from one, so it names this
            // block's failure.)
            let r = self.dec.next_block(&mut self.blk);
            let ninsn = self.blk.ninsn();
            let left_after = left.checked_sub(u64::from(ninsn));
            // (Empty blocks never hit: `get_fast` does not cache them.)
            let hit = match (r, left_after) {
                (Ok(_), Some(_)) => self
                    .blocks
                    .get_fast(self.blk.ip(), ninsn, self.blk.raw_mode()),
                _ => None,
            };
            let (Some((start, len)), Ok(status), Some(l)) = (hit, r, left_after) else {
                self.insns_since_check = PROGRESS_CHECK - 1 - left;
                self.fast = false;
                let blk = self.blk;
                // The status before this block had neither EOS nor a pending event (checked
                // at entry, and the loop stops at those), which is all `after_block` reads
                // of it; so it need not stay live across the libipt call.
                self.after_block(0, &blk, r);
                return ControlFlow::Continue(());
            };
            left = l;
            let flow = f(&self.blocks.arena, start, len);
            if status & (PTS_EVENT_PENDING | PTS_EOS) != 0 || flow.is_break() {
                self.insns_since_check = PROGRESS_CHECK - 1 - left;
                self.state = State::Running(status);
                if status & (PTS_EVENT_PENDING | PTS_EOS) != 0 {
                    self.fast = false;
                }
                return flow;
            }
        }
    }

    /// What [`TraceDecoder::for_each_slice`] does, for a consumer that gathers the
    /// instructions as runs: the runs of each block of the decoder's arena (made once per
    /// block, see [`crate::runs::BlockRuns`]) are appended to `runs` here, without a call
    /// per block; `f` gets the other slices (and blocks that hold other records than
    /// instructions), and an empty slice once `runs` holds `full` instructions or more,
    /// with `runs` each time (to take them or add to them). (A call of `f` per block had
    /// cost `view`'s decoding thread a sixth of its machine instructions.)
    pub fn for_each_slice_runs_into<B>(
        &mut self,
        runs: &mut Runs,
        full: usize,
        mut f: impl FnMut(&[Record], &mut Runs) -> ControlFlow<B>,
    ) -> Option<B> {
        loop {
            if self.cur >= self.cur_end {
                let block = match self.queue.pop_block() {
                    None if self.fast && self.queue.is_empty() => self.step_fast(),
                    b => b,
                };
                if let Some((start, len)) = block {
                    let blocks = &mut self.blocks;
                    let flow = if blocks.runs.append_to(&blocks.arena, start, len, runs) {
                        if runs.instructions() < full {
                            continue;
                        }
                        f(&[], runs)
                    } else {
                        let (s, n) = (start as usize, len as usize);
                        f(blocks.arena.get(s..s + n).unwrap_or(&[]), runs)
                    };
                    if let ControlFlow::Break(b) = flow {
                        return Some(b);
                    }
                    continue;
                }
            }
            let s = self.next_slice_slow()?;
            if let ControlFlow::Break(b) = f(s, runs) {
                return Some(b);
            }
        }
    }

    /// `next_slice` except the common case (a queued block).
    fn next_slice_slow(&mut self) -> Option<&[Record]> {
        if self.cur < self.cur_end {
            let r = self.cur..self.cur_end;
            self.cur = self.cur_end;
            return self.blocks.arena.get(r);
        }
        if self.queue.is_empty() {
            self.fill();
        }
        match self.queue.pop_front()? {
            Item::Block(start, len) => {
                let (start, len) = (start as usize, len as usize);
                self.blocks.arena.get(start..start + len)
            }
            Item::Rec(r) => {
                self.batch.clear();
                let r = self.queue.take_rec(r);
                self.batch.push(r);
                while let Some(Item::Rec(_)) = self.queue.front() {
                    if let Some(Item::Rec(r)) = self.queue.pop_front() {
                        let r = self.queue.take_rec(r);
                        self.batch.push(r);
                    }
                }
                Some(&self.batch)
            }
        }
    }
}

impl TraceDecoder for PtDecoder<'_> {
    /// The decoder's current position in the PT stream (for progress reporting).
    fn position(&self) -> u64 {
        match &self.flow {
            Some(f) => self.opts.base_offset + f.pos as u64,
            // (The fast decoder read the whole window; libipt's decoder never moved.)
            None if self.flow_done => self.opts.base_offset + self.pt_len as u64,
            None => self.opts.base_offset + self.dec.offset().unwrap_or(0),
        }
    }

    /// Which decoder gave (or gives) this window's records: `"fast"`, or `"libipt"` with
    /// the reason the fast decoder handed it over (`None` when it never ran).
    fn decoded_by(&self) -> (&'static str, Option<&'static str>) {
        match (&self.flow, self.fallback) {
            (_, Some(why)) => ("libipt", Some(why)),
            (Some(_), None) => ("fast", None),
            (None, None) if self.flow_done => ("fast", None),
            (None, None) => ("libipt", None),
        }
    }

    /// Decodes to the end into [`CompactRecords`]: block records stay in the decoder's
    /// block arenas and are referenced, not copied (a few bytes per block instead of ~40
    /// per instruction). The fastest way to keep a whole window's records.
    fn collect_compact(mut self) -> CompactRecords {
        self.collect_compact_mut()
    }

    /// The next records as a slice (a run of markers, or one block's instructions),
    /// without copying instruction records: the fast way to consume a decoder. May be
    /// mixed with [`Iterator::next`].
    #[inline(always)]
    fn next_slice(&mut self) -> Option<&[Record]> {
        if self.cur >= self.cur_end {
            let block = match self.queue.pop_block() {
                None if self.fast && self.queue.is_empty() => self.step_fast(),
                b => b,
            };
            if let Some((start, len)) = block {
                let (start, len) = (start as usize, len as usize);
                return self.blocks.arena.get(start..start + len);
            }
        }
        self.next_slice_slow()
    }

    /// Calls `f` with each run of records, exactly as `next_slice` would hand them out,
    /// until `f` breaks (its value is returned) or the trace ends (`None`). The fastest
    /// way to consume a decoder: cached blocks go from libipt to `f` in one tight loop
    /// that keeps the decoder's state in registers. May be mixed with `next_slice` and
    /// [`Iterator::next`].
    #[inline]
    fn for_each_slice<B>(&mut self, mut f: impl FnMut(&[Record]) -> ControlFlow<B>) -> Option<B> {
        loop {
            if self.hot_ready() {
                let flow = self.run_hot(&mut |arena: &[Record], start: u32, len: u32| {
                    let start = start as usize;
                    match arena.get(start..start + len as usize) {
                        Some(recs) => f(recs),
                        // (Cached ranges always lie in the arena.)
                        None => ControlFlow::Continue(()),
                    }
                });
                if let ControlFlow::Break(b) = flow {
                    return Some(b);
                }
            }
            // Queued blocks (the fast decoder's) in this loop, without a call each.
            if self.cur >= self.cur_end {
                while let Some((start, len)) = self.queue.pop_block() {
                    let (start, len) = (start as usize, len as usize);
                    if let Some(recs) = self.blocks.arena.get(start..start + len) {
                        if let ControlFlow::Break(b) = f(recs) {
                            return Some(b);
                        }
                    }
                }
            }
            let s = self.next_slice_cold()?;
            if let ControlFlow::Break(b) = f(s) {
                return Some(b);
            }
        }
    }
}

impl Iterator for PtDecoder<'_> {
    type Item = Record;

    /// The common case inline (the next instruction of the current block, copied);
    /// everything else in `next_record_slow`.
    #[inline]
    fn next(&mut self) -> Option<Record> {
        if self.cur < self.cur_end {
            if let Some(Record::Instruction(i)) = self.blocks.arena.get(self.cur) {
                self.cur += 1;
                return Some(Record::Instruction(*i));
            }
        }
        self.next_record_slow()
    }

    /// Consumes the decoder through [`PtDecoder::for_each_slice`] (the fast path).
    fn for_each<F>(mut self, mut f: F)
    where
        F: FnMut(Record),
    {
        self.for_each_slice(|recs| {
            for r in recs {
                // Instructions copied inline (the enum's clone is out of line).
                f(match r {
                    Record::Instruction(i) => Record::Instruction(*i),
                    other => other.clone(),
                });
            }
            ControlFlow::<()>::Continue(())
        });
    }
}

impl PtDecoder<'_> {
    #[inline(never)]
    fn next_record_slow(&mut self) -> Option<Record> {
        loop {
            if self.cur < self.cur_end {
                let r = self.blocks.arena.get(self.cur).cloned();
                self.cur += 1;
                return r;
            }
            if self.queue.is_empty() {
                if self.fast {
                    if let Some((start, len)) = self.step_fast() {
                        self.cur = start as usize;
                        self.cur_end = start as usize + len as usize;
                        continue;
                    }
                    if !self.queue.is_empty() {
                        continue;
                    }
                }
                self.fill();
            }
            match self.queue.pop_front()? {
                Item::Rec(r) => return Some(self.queue.take_rec(r)),
                Item::Block(start, len) => {
                    self.cur = start as usize;
                    self.cur_end = start as usize + len as usize;
                }
            }
        }
    }
}
