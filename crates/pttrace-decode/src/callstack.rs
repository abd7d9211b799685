//! Call-stack reconstruction: one thread's decoded records -> nested spans of function
//! calls (what magic-trace draws on a timeline) and instruction counts per call stack
//! (flame graphs).
//!
//! Feed a thread's records in order to [`CallStacks::record`] (its windows one after the
//! other; call [`CallStacks::restart`] where the trace is known to be discontinuous between
//! two windows), then [`CallStacks::finish`]. Time is counted in instructions: the thread's
//! instruction `i` (0-based) occupies `[i, i + 1)`, and a span covers the instructions
//! executed while its frame was on the stack. `Timestamp` records are kept as anchors, so
//! that a trace with usable time can map instruction indices to time ([`TimeMap`]).
//!
//! # Rules
//!
//! - **call** ([`InsnClass::Call`]): the call instruction belongs to the caller; a frame
//!   opens at the next instruction (the target) and expects a return to the address after
//!   the call. A call to the very next instruction (`call 1f`, a way to read the IP) opens
//!   no frame.
//! - **return**: the return instruction belongs to the frame it leaves. The nearest frame
//!   expecting the return's target is closed (`Return`), together with the frames above it
//!   (`Unwound`: longjmp or stack unwinding left them without their own return). When no
//!   frame expects that address the top frame closes (`Return`), unless it is a signal
//!   handler's frame (see signals); if the stack is then empty, the code returned to runs
//!   in an *implied* frame for a caller that was never seen, which starts at the beginning
//!   of the segment (the thread's start or the last gap) and so encloses everything drawn
//!   since (magic-trace's rule for unmatched returns). A thread traced from its entry
//!   point (its first instruction a function's first: the program's or the dynamic
//!   loader's entry) has no caller: a return no frame expects closes frames down to its
//!   first frame at most, and the code returned to runs in an implied frame on it from
//!   there (the stacks lost track: code that makes its own return addresses, as V8's
//!   deoptimizer and interpreter do).
//! - **tail call** (conservative): an unconditional or conditional jump whose target is the
//!   first instruction of a function (a symbol's start) other than the one containing the
//!   jump replaces the top frame (same expected return; the old frame ends `TailCall`, the
//!   new one starts `TailCall`). Jumps within a function, to the middle of a function, or
//!   to code without symbols change nothing. (A PLT stub jumping to its function is a tail
//!   call under this rule.)
//! - **non-local jump** (longjmp, exception landing pads): a jump to the middle of a
//!   function other than the jump's own and the top frame's, when a frame below the top
//!   one is in that function: the frames above the nearest such frame end `Unwound`. (A
//!   jump into the top frame's function from outside it is its split-off `.cold` part
//!   going back: nothing.)
//! - **signals, asynchronous entries**: tracing disabled at an interrupted address
//!   (`TraceDisabled { ip: Some(a) }`, FUP + TIP.PGD) and enabled again elsewhere; enabled
//!   after a non-branch instruction (a syscall) at another address than the next one; or a
//!   `KernelXfer`: a frame opens at the new address (`Async`) and the interrupted context
//!   is saved. The handler's return, which no frame expects, lands in the signal
//!   trampoline: its frame is replaced by one for the trampoline (`Trampoline`). When
//!   tracing is later enabled at the saved interrupted address (after `rt_sigreturn`),
//!   the frames opened since end (`Resumed`) and the interrupted code continues where it
//!   was, its pending branch included. Enabled at the address where it was disabled (an
//!   untraced handler, an interrupt): nothing changes.
//! - **gaps** (`Gap`, `Overflow`, [`CallStacks::restart`]): every open frame ends `Gap`,
//!   the stack starts over and a marker records where.
//! - **window start mid-function**: the first instruction of a segment (or one met with an
//!   empty stack) opens an implied frame for the function containing it.
//! - the thread's end closes the frames still open (`TraceEnd`).
//!
//! Frames are identified by an address: the call or jump target, the asynchronous entry,
//! or for implied frames the start of the function containing the first instruction seen
//! (that instruction where no symbol covers it). Callers name them from their symbols.

use rustc_hash::FxHashMap;

use crate::image::Symbols;
use crate::records::{InsnClass, Record};
use crate::runs::{transfers, Run};

/// Where functions start: what the tail-call and non-local-jump rules need to know.
pub trait Functions {
    /// The start address of the function containing `addr`, when known.
    fn function_start(&self, addr: u64) -> Option<u64>;

    /// The functions inlined at `pc`, as one key: 0 where none, else [`INLINE_KEY`] with an
    /// id of the chain in the low 32 bits. With [`CallStacks::with_inline_frames`], the
    /// instructions at such a `pc` are counted under a child of the current frame with that
    /// key (its own frame, or frames, in folded stacks and flame graphs).
    fn inline_context(&self, pc: u64) -> u64 {
        let _ = pc;
        0
    }

    /// The range of addresses around `pc` that [`Self::inline_context`] answers alike for
    /// in one respect: `false` where none of them can be inlined code (JIT code, a file
    /// without debug info), so that the reconstruction asks nothing for a whole region;
    /// `true` where some may be.
    fn inline_region(&self, pc: u64) -> (std::ops::Range<u64>, bool) {
        let _ = pc;
        (0..u64::MAX, false)
    }
}

/// The high bits of an inlined-frames key: a non-canonical address, so never a frame's.
pub const INLINE_KEY: u64 = 0x8000_0000_0000_0000;

impl Functions for Symbols {
    fn function_start(&self, addr: u64) -> Option<u64> {
        self.lookup(addr).map(|(_, off)| addr.wrapping_sub(off))
    }
}

/// How a span began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanStart {
    /// Called.
    Call,
    /// Jumped to from the frame it replaced.
    TailCall,
    /// Entered asynchronously (a signal handler, an interrupt).
    Async,
    /// The signal trampoline a handler returned to.
    Trampoline,
    /// Code of inlined functions ([`CallStacks::with_inline_frames`]; the span's address
    /// is their inline key): from the first instruction of a run of the frame's own
    /// instructions with that key.
    Inlined,
    /// Its call was not seen (the thread's or segment's start, an unmatched return): the
    /// span starts at the segment's start or where its first instruction was met.
    Implied,
}

/// How a span ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanEnd {
    /// Its return.
    Return,
    /// Replaced by a tail call.
    TailCall,
    /// A return to a frame below it, or a non-local jump, left it.
    Unwound,
    /// The code interrupted by its asynchronous entry resumed.
    Resumed,
    /// A gap in the trace.
    Gap,
    /// The thread's trace ended with it open.
    TraceEnd,
    /// Inlined code: after the last instruction of its run (the frame's next own
    /// instruction is elsewhere, or the frame ended).
    Inlined,
}

impl SpanStart {
    pub fn name(self) -> &'static str {
        match self {
            SpanStart::Call => "call",
            SpanStart::TailCall => "tail_call",
            SpanStart::Async => "async",
            SpanStart::Trampoline => "trampoline",
            SpanStart::Inlined => "inlined",
            SpanStart::Implied => "implied",
        }
    }
}

impl SpanEnd {
    pub fn name(self) -> &'static str {
        match self {
            SpanEnd::Return => "return",
            SpanEnd::TailCall => "tail_call",
            SpanEnd::Unwound => "unwound",
            SpanEnd::Resumed => "resumed",
            SpanEnd::Gap => "gap",
            SpanEnd::TraceEnd => "trace_end",
            SpanEnd::Inlined => "inlined",
        }
    }
}

/// One function activation: instructions `[start, end)` of the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// The frame's address (see the module documentation).
    pub addr: u64,
    /// Nesting depth (0 = outermost).
    pub depth: u32,
    pub start: u64,
    pub end: u64,
    pub start_kind: SpanStart,
    pub end_kind: SpanEnd,
}

/// Something that happened between two instructions (a gap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// Instructions before it.
    pub at: u64,
    pub what: String,
}

/// A timestamp met after `insn` instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeAnchor {
    pub insn: u64,
    pub tsc: u64,
    pub perf_time: Option<u64>,
}

/// The result for one thread.
#[derive(Debug, Clone, Default)]
pub struct ThreadStacks {
    /// Every span, ordered by start, then depth (enclosing spans first).
    pub spans: Vec<Span>,
    /// Call stacks (outermost frame first) and the instructions executed with exactly that
    /// stack (self counts). Every instruction is counted once.
    pub stacks: Vec<(Vec<u64>, u64)>,
    pub markers: Vec<Marker>,
    pub anchors: Vec<TimeAnchor>,
    pub instructions: u64,
    /// Returns that went where no open call expected, from a frame whose return address
    /// was known ([`Finished::lost_returns`]).
    pub lost_returns: u64,
}

/// Where the spans go as the reconstruction makes them: in the order of their begins and
/// ends, properly nested, so that a timeline can be written while the trace is decoded
/// (memory bounded by the stack depth).
///
/// One kind of span is known late: the implied caller of an unmatched return
/// ([`SpanSink::implied_caller`]) starts at its segment's start, below everything the
/// segment has shown so far; its begin belongs before the segment's first event. Its end
/// comes through [`SpanSink::end`] like any other, at a moment when no other span is open.
pub trait SpanSink {
    /// A span opens at instruction `at` (`addr`: its frame's address, or for `Inlined` its
    /// inline key).
    fn begin(&mut self, at: u64, addr: u64, kind: SpanStart);
    /// The innermost open span ends at `at`, or, when none is open, the innermost implied
    /// caller.
    fn end(&mut self, at: u64, kind: SpanEnd);
    /// A caller never seen was returned to: a span from `from` (the segment's start) that
    /// encloses every span of the segment so far, the implied callers before it included.
    fn implied_caller(&mut self, from: u64, addr: u64);
    /// The segment ends at `at` (a gap, or the thread's end): every span is closed; the
    /// next one starts over.
    fn segment_end(&mut self, at: u64);
}

/// A sink that may be absent: `None` drops the spans (only the stacks are wanted).
impl<T: SpanSink> SpanSink for Option<T> {
    fn begin(&mut self, at: u64, addr: u64, kind: SpanStart) {
        if let Some(s) = self {
            s.begin(at, addr, kind);
        }
    }
    fn end(&mut self, at: u64, kind: SpanEnd) {
        if let Some(s) = self {
            s.end(at, kind);
        }
    }
    fn implied_caller(&mut self, from: u64, addr: u64) {
        if let Some(s) = self {
            s.implied_caller(from, addr);
        }
    }
    fn segment_end(&mut self, at: u64) {
        if let Some(s) = self {
            s.segment_end(at);
        }
    }
}

/// Collects the spans ([`CallStacks::finish`]): their depths counted with the implied
/// callers below them.
#[derive(Debug, Default)]
pub struct SpanList {
    spans: Vec<Span>,
    /// Open spans: index in `spans` of their placeholder.
    open: Vec<usize>,
    /// This segment's implied callers (index in `spans`), in the order they were found
    /// (the last is the outermost), and whether each has ended.
    bottoms: Vec<(usize, bool)>,
    /// The first span of the segment.
    seg_first: usize,
    /// For each span of the segment: the implied callers that had ended when it began
    /// (the ones found later, and the one open, enclose it).
    ended_before: Vec<u32>,
}

impl SpanList {
    /// Every span, ordered by start, then depth (enclosing spans first).
    pub fn into_spans(mut self) -> Vec<Span> {
        self.spans
            .sort_by_key(|s| (s.start, s.depth, std::cmp::Reverse(s.end)));
        self.spans
    }
}

impl SpanSink for SpanList {
    fn begin(&mut self, at: u64, addr: u64, kind: SpanStart) {
        self.ended_before
            .push(self.bottoms.iter().filter(|b| b.1).count() as u32);
        self.open.push(self.spans.len());
        self.spans.push(Span {
            addr,
            depth: (self.open.len() - 1) as u32,
            start: at,
            end: at,
            start_kind: kind,
            end_kind: SpanEnd::TraceEnd,
        });
    }
    fn end(&mut self, at: u64, kind: SpanEnd) {
        let k = match self.open.pop() {
            Some(k) => k,
            None => match self.bottoms.iter_mut().rev().find(|b| !b.1) {
                Some(b) => {
                    b.1 = true;
                    b.0
                }
                None => return,
            },
        };
        if let Some(s) = self.spans.get_mut(k) {
            s.end = at;
            s.end_kind = kind;
        }
    }
    fn implied_caller(&mut self, from: u64, addr: u64) {
        self.ended_before.push(0);
        self.bottoms.push((self.spans.len(), false));
        self.spans.push(Span {
            addr,
            depth: 0,
            start: from,
            end: from,
            start_kind: SpanStart::Implied,
            end_kind: SpanEnd::TraceEnd,
        });
    }
    fn segment_end(&mut self, _at: u64) {
        // Depths: a span lies above the segment's implied callers that had not ended
        // when it began; the k-th of those (from 1) lies above the ones found after it.
        let total = self.bottoms.len() as u32;
        for (s, ended) in self.spans[self.seg_first..]
            .iter_mut()
            .zip(&self.ended_before)
        {
            s.depth += total - ended;
        }
        for (i, &(k, _)) in self.bottoms.iter().enumerate() {
            if let Some(s) = self.spans.get_mut(k) {
                s.depth = total - 1 - i as u32;
            }
        }
        self.bottoms.clear();
        self.open.clear();
        self.ended_before.clear();
        self.seg_first = self.spans.len();
    }
}

/// The call stacks of a thread as a trie: each node a frame (its address, or an inline
/// key) under its caller, with the instructions executed with exactly that stack.
#[derive(Debug, Clone, Default)]
pub struct StackTrie {
    /// Nodes whose parent is [`StackTrie::ROOT`] are segment roots (no frame).
    pub nodes: Vec<StackNode>,
}

#[derive(Debug, Clone)]
pub struct StackNode {
    pub key: u64,
    pub parent: u32,
    pub count: u64,
    pub children: Vec<u32>,
}

impl StackTrie {
    /// The parent of segment roots.
    pub const ROOT: u32 = u32::MAX;

    /// Visits every frame node, each after its parent: `f(node, parent)` (`parent`: `None`
    /// under a segment root).
    pub fn walk(&self, mut f: impl FnMut(u32, Option<u32>, &StackNode)) {
        let mut todo: Vec<(u32, Option<u32>)> = Vec::new();
        for n in self.nodes.iter().rev().filter(|n| n.parent == Self::ROOT) {
            todo.extend(n.children.iter().rev().map(|&c| (c, None)));
        }
        while let Some((k, parent)) = todo.pop() {
            let Some(n) = self.nodes.get(k as usize) else {
                continue;
            };
            f(k, parent, n);
            todo.extend(n.children.iter().rev().map(|&c| (c, Some(k))));
        }
    }

    /// Call stacks (outermost frame first) and the instructions executed with exactly
    /// that stack.
    pub fn paths(&self) -> Vec<(Vec<u64>, u64)> {
        let mut stacks = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.count == 0 || n.parent == Self::ROOT {
                continue;
            }
            let mut path = Vec::new();
            let mut k = i as u32;
            while let Some(node) = self.nodes.get(k as usize) {
                if node.parent == Self::ROOT {
                    break;
                }
                path.push(node.key);
                k = node.parent;
            }
            path.reverse();
            stacks.push((path, n.count));
        }
        stacks
    }
}

/// What [`CallStacks::finish_with`] returns.
#[derive(Debug)]
pub struct Finished<S> {
    pub sink: S,
    pub trie: StackTrie,
    pub markers: Vec<Marker>,
    pub anchors: Vec<TimeAnchor>,
    pub instructions: u64,
    /// Returns that went where no open call expected, from a frame whose return address
    /// was known (not an implied frame's: that is a trace started mid-function). The
    /// stacks lost track there (code that makes its own return addresses: a JIT, an
    /// interpreter, a deoptimizer) and are a guess after it.
    pub lost_returns: u64,
}

/// The frames open at a point of a thread image ([`CallStacks::stack`]), bottom first:
/// what a forked child inherits ([`CallStacks::seed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackSeed {
    /// (frame address, its function's start, its return address)
    frames: Vec<(u64, Option<u64>, Option<u64>)>,
    /// The stack's first frame has no caller (see [`CallStacks::set_thread_start`]).
    rooted: bool,
}

impl StackSeed {
    /// The frames' addresses (a function's start, or where an implied frame began), bottom
    /// first.
    pub fn addresses(&self) -> Vec<u64> {
        self.frames.iter().map(|f| f.0).collect()
    }
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    func: Option<u64>,
    ret: Option<u64>,
    start_kind: SpanStart,
    node: u32,
    /// A signal handler's frame (or what replaced it by tail calls / the trampoline).
    is_async: bool,
    /// The inline key of the run of its own instructions in inlined code now open (a
    /// span one deeper than the frame); 0: none.
    inline: u64,
}

/// The last instruction, while its successor is not known.
#[derive(Debug, Clone, Copy)]
struct Last {
    pc: u64,
    next: u64,
    class: InsnClass,
}

/// An interrupted context.
#[derive(Debug, Clone, Copy)]
struct Saved {
    resume: u64,
    depth: usize,
    last: Option<Last>,
}

#[derive(Debug, Clone)]
struct Node {
    key: u64,
    /// `u32::MAX` for a segment root.
    parent: u32,
    count: u64,
    children: Vec<u32>,
}

const ROOT: u32 = u32::MAX;
const CACHE_SLOTS: usize = 1 << 14;
/// Deepest call stack kept: past it the stacks start over (see [`CallStacks::restart`]).
pub const MAX_DEPTH: usize = 10_000;
/// Implied callers inserted below a segment's frames (returns to frames never seen) before
/// its stacks start over.
pub const MAX_BOTTOMS: usize = 256;
/// Instruction addresses remembered with their inline key (an interpreter's loop alone
/// spans thousands).
const INLINE_CACHE_SLOTS: usize = 1 << 18;

/// Runs of instructions (see [`CallStacks::runs`]) remembered with the
/// inline key they share.
const RUN_CACHE_SLOTS: usize = 1 << 16;

/// Slots of the children looked up last ([`CallStacks::node_for`]).
const CHILD_MEMO_SLOTS: usize = 1 << 12;

/// A remembered run: its first and last address, its length, and its instructions'
/// inline keys ([`RunInline`]).
#[derive(Clone, Copy, Default)]
struct RunKey {
    first: u64,
    last: u64,
    len: u32,
    known: bool,
    keys: RunInline,
}

/// The inline keys of a run's instructions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum RunInline {
    /// All share this one (0: none).
    One(u64),
    /// Stretches of one key each (inlined code begins or ends inside the run):
    /// `run_stretches[start..start + count]`, as (instructions, key).
    Stretches(u32, u32),
    /// More stretches than [`MAX_STRETCHES`]: an instruction at a time.
    #[default]
    Mixed,
}

/// The most stretches of one inline key a remembered run is kept as.
const MAX_STRETCHES: usize = 16;

/// The stretches kept for all remembered runs, at most (then they start over; few in unit
/// tests, so that they do).
#[cfg(not(test))]
const MAX_RUN_STRETCHES: usize = 1 << 20;
#[cfg(test)]
const MAX_RUN_STRETCHES: usize = 40;

/// Reconstructs one thread's call stacks; see the module documentation.
pub struct CallStacks<'f, F: Functions + ?Sized, S: SpanSink = SpanList> {
    funcs: &'f F,
    cache: Vec<(u64, Option<u64>, bool)>,
    /// (pc, inline key + 1) of the last lookups (0: empty slot), when inlined frames are
    /// counted.
    inline_cache: Vec<(u64, u64)>,
    /// Runs of instructions with their inline keys, when inlined frames are counted.
    run_cache: Vec<RunKey>,
    /// The stretches of the remembered runs that have more than one inline key.
    run_stretches: Vec<(u32, u64)>,
    /// The code regions met last, most recent first ([`Functions::inline_region`]): their
    /// start, length, and whether inlined code may be there.
    regions: [(u64, u64, bool); 4],
    /// The last (frame node, inline key) counted to and its child node.
    last_inline: (u32, u64, u32),
    stack: Vec<Frame>,
    insns: u64,
    last: Option<Last>,
    /// `Some(ip)` after `TraceDisabled { ip }` until the next `TraceEnabled`.
    disabled: Option<Option<u64>>,
    saved: Vec<Saved>,
    seg_start: u64,
    seg_root: u32,
    /// Implied callers inserted below everything in this segment.
    seg_bottoms: u32,
    /// The segment starts where the thread image does, at a function's first instruction
    /// (its entry point, which nothing called) or where the thread was created
    /// ([`Self::set_thread_start`]): its first frame is never returned past.
    seg_rooted: bool,
    /// The thread image's first instruction is its thread's first ([`Self::set_thread_start`]).
    thread_start: bool,
    /// The trie node instructions are counted to (the top frame's, or the segment root's).
    cur: u32,
    nodes: Vec<Node>,
    child: FxHashMap<(u32, u64), u32>,
    /// The children looked up last, in front of `child` (direct-mapped by parent and key):
    /// (parent, generation, key, child), valid while its generation is `child_generation`.
    child_memo: Vec<(u32, u32, u64, u32)>,
    /// Moves on when children change parents ([`Self::push_bottom`]).
    child_generation: u32,
    sink: S,
    markers: Vec<Marker>,
    anchors: Vec<TimeAnchor>,
    /// The instructions counted into the stacks (all by default; [`CallStacks::count_only`]).
    counted: std::ops::Range<u64>,
    /// Whether `counted` is every instruction (no range to cut a run at). (Kept beside
    /// it: comparing the range on each run cost 2% more of the runs' machine instructions
    /// on a gcc trace.)
    count_all: bool,
    /// [`Finished::lost_returns`].
    lost_returns: u64,
}

fn is_branch(class: InsnClass) -> bool {
    !matches!(
        class,
        InsnClass::Other | InsnClass::FarCall | InsnClass::Ptwrite
    )
}

impl<'f, F: Functions + ?Sized> CallStacks<'f, F, SpanList> {
    pub fn new(funcs: &'f F) -> Self {
        Self::with_sink(funcs, SpanList::default())
    }

    /// Closes the frames still open and returns the thread's spans and stacks.
    pub fn finish(self) -> ThreadStacks {
        let done = self.finish_with();
        ThreadStacks {
            spans: done.sink.into_spans(),
            stacks: done.trie.paths(),
            markers: done.markers,
            anchors: done.anchors,
            instructions: done.instructions,
            lost_returns: done.lost_returns,
        }
    }
}

impl<'f, F: Functions + ?Sized, S: SpanSink> CallStacks<'f, F, S> {
    /// Reconstructs the stacks, giving the spans to `sink` as they open and close.
    pub fn with_sink(funcs: &'f F, sink: S) -> Self {
        let mut s = CallStacks {
            funcs,
            cache: vec![(0, None, false); CACHE_SLOTS],
            inline_cache: Vec::new(),
            run_cache: Vec::new(),
            run_stretches: Vec::new(),
            regions: [(0, 0, false); 4],
            last_inline: (u32::MAX, 0, 0),
            stack: Vec::new(),
            insns: 0,
            last: None,
            disabled: None,
            saved: Vec::new(),
            seg_start: 0,
            seg_root: 0,
            seg_bottoms: 0,
            seg_rooted: false,
            thread_start: false,
            cur: 0,
            nodes: Vec::new(),
            child: FxHashMap::default(),
            child_memo: vec![(u32::MAX, 0, 0, 0); CHILD_MEMO_SLOTS],
            child_generation: 0,
            sink,
            markers: Vec::new(),
            anchors: Vec::new(),
            counted: 0..u64::MAX,
            count_all: true,
            lost_returns: 0,
        };
        s.new_segment_root();
        s
    }

    /// Instructions seen so far.
    pub fn instructions(&self) -> u64 {
        self.insns
    }

    /// Current stack depth.
    pub fn depth(&self) -> usize {
        self.stack.len()
    }

    /// Feeds the next record of the thread.
    pub fn record(&mut self, r: &Record) {
        match r {
            Record::Instruction(i) => self.instruction(i.pc, i.size, i.class),
            Record::TraceDisabled { ip } => self.disabled = Some(*ip),
            Record::TraceEnabled { ip } => self.enabled(*ip),
            Record::KernelXfer { from, to } => match to {
                Some(to) => {
                    let last = self.last.take();
                    self.disabled = None;
                    self.async_entry(*from, *to, last);
                }
                None => self.disabled = Some(Some(*from)),
            },
            Record::Gap(g) => self.restart(Some(format!("gap: {g}"))),
            Record::Overflow { ip } => self.restart(Some(match ip {
                Some(ip) => format!("overflow: trace lost, resumes at {ip:#x}"),
                None => "overflow: trace lost".to_string(),
            })),
            Record::Timestamp { tsc, perf_time } => {
                if self.anchors.last().is_none_or(|a| a.tsc <= *tsc) {
                    self.anchors.push(TimeAnchor {
                        insn: self.insns,
                        tsc: *tsc,
                        perf_time: *perf_time,
                    });
                }
            }
            Record::WindowId(_)
            | Record::Cpu(_)
            | Record::Syscall { .. }
            | Record::InterruptFlag { .. } => {}
        }
    }

    /// The trace is discontinuous here: closes every open frame (`Gap`) and starts over;
    /// `what`, when given, becomes a marker.
    pub fn restart(&mut self, what: Option<String>) {
        self.end_segment(SpanEnd::Gap);
        self.thread_start = false;
        if let Some(what) = what {
            self.markers.push(Marker {
                at: self.insns,
                what,
            });
        }
    }

    /// Closes the frames still open; returns the sink and the rest of the reconstruction.
    pub fn finish_with(mut self) -> Finished<S> {
        self.end_segment(SpanEnd::TraceEnd);
        Finished {
            sink: self.sink,
            trie: StackTrie {
                nodes: self
                    .nodes
                    .into_iter()
                    .map(|n| StackNode {
                        key: n.key,
                        parent: n.parent,
                        count: n.count,
                        children: n.children,
                    })
                    .collect(),
            },
            markers: self.markers,
            anchors: self.anchors,
            instructions: self.insns,
            lost_returns: self.lost_returns,
        }
    }

    /// Whether the next instruction, when it is the thread image's first, is the first
    /// its thread ran (a thread traced from its creation, as the software backends trace
    /// every thread a process creates: the instruction after `clone` in the child). The
    /// frame it runs in then has no caller: a return no frame expects never closes it
    /// (see [`Finished::lost_returns`]). Said where each window starts (a window whose
    /// trace went missing, or after which the first instructions come, says false).
    pub fn set_thread_start(&mut self, here: bool) {
        self.thread_start = here && self.insns == 0;
    }

    /// The frames open now, bottom first (a fork's: the stack its child inherits).
    pub fn stack(&self) -> StackSeed {
        StackSeed {
            frames: self
                .stack
                .iter()
                .map(|f| {
                    let addr = self.nodes.get(f.node as usize).map_or(0, |n| n.key);
                    (addr, f.func, f.ret)
                })
                .collect(),
            rooted: self.seg_rooted,
        }
    }

    /// Before the thread image's first instruction: its thread starts with the frames of
    /// `seed` open (a forked child, whose first instruction is the one after the fork in
    /// its parent's code, in its parent's frames: returns close them as they expect, and
    /// its stacks go down to where its parent's do). Each is an implied frame from
    /// instruction 0. Nothing once instructions were seen or frames opened.
    pub fn seed(&mut self, seed: &StackSeed) {
        if self.insns != 0 || !self.stack.is_empty() {
            return;
        }
        for &(addr, func, ret) in &seed.frames {
            self.push(addr, func, ret, SpanStart::Implied, false);
        }
        self.seg_rooted = seed.rooted && !seed.frames.is_empty();
    }

    /// Counts only the instructions numbered in `range` (from 0, as [`Self::instructions`])
    /// into the stacks (a part of the trace in detail: the spans are all still made; cut
    /// them to the same range). May be moved while the trace goes on.
    pub fn count_only(&mut self, range: std::ops::Range<u64>) {
        self.count_all = range == (0..u64::MAX);
        self.counted = range;
    }

    /// The instructions counted into the stacks ([`Self::count_only`]).
    pub fn counted(&self) -> std::ops::Range<u64> {
        self.counted.clone()
    }

    /// Counts the instructions of inlined functions under frames of their own
    /// ([`Functions::inline_context`]).
    pub fn with_inline_frames(mut self) -> Self {
        self.inline_cache = vec![(0, 0); INLINE_CACHE_SLOTS];
        self.run_cache = vec![RunKey::default(); RUN_CACHE_SLOTS];
        self
    }

    /// The inline key of the instruction at `pc`: 0 at once in a region without inlined
    /// code (most of a JIT runtime's code), else from the cache of the addresses asked.
    #[inline]
    fn inline_context(&mut self, pc: u64) -> u64 {
        let (start, len, maybe) = self.regions[0];
        if pc.wrapping_sub(start) >= len {
            return self.inline_context_elsewhere(pc);
        }
        if !maybe {
            return 0;
        }
        self.inline_context_cached(pc)
    }

    /// [`Self::inline_context`] where `pc` is not in the last region: its region is made
    /// the first.
    #[cold]
    #[inline(never)]
    fn inline_context_elsewhere(&mut self, pc: u64) -> u64 {
        let known = self.regions[1..]
            .iter()
            .position(|&(start, len, _)| pc.wrapping_sub(start) < len);
        let (k, region) = match known {
            Some(k) => (k + 1, self.regions[k + 1]),
            None => {
                let (r, maybe) = self.funcs.inline_region(pc);
                // (A region that does not hold `pc` is taken as one address.)
                let (start, len) = if r.contains(&pc) {
                    (r.start, r.end - r.start)
                } else {
                    (pc, 1)
                };
                (self.regions.len() - 1, (start, len, maybe))
            }
        };
        self.regions.copy_within(0..k, 1);
        self.regions[0] = region;
        if region.2 {
            self.inline_context_cached(pc)
        } else {
            0
        }
    }

    #[inline]
    fn inline_context_cached(&mut self, pc: u64) -> u64 {
        let slot = ((pc ^ (pc >> 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44) as usize
            % INLINE_CACHE_SLOTS;
        if let Some(&(a, k)) = self.inline_cache.get(slot) {
            if k != 0 && a == pc {
                return k - 1;
            }
        }
        self.inline_context_miss(pc, slot)
    }

    #[cold]
    #[inline(never)]
    fn inline_context_miss(&mut self, pc: u64, slot: usize) -> u64 {
        let k = self.funcs.inline_context(pc);
        if let Some(e) = self.inline_cache.get_mut(slot) {
            *e = (pc, k + 1);
        }
        k
    }

    /// The slot of `addr` in the cache of function starts.
    #[inline(always)]
    fn cache_slot(addr: u64) -> usize {
        ((addr ^ (addr >> 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50) as usize % CACHE_SLOTS
    }

    /// [`Functions::function_start`] of `addr` when the cache has it.
    #[inline(always)]
    fn cached_function_start(&self, addr: u64) -> Option<Option<u64>> {
        self.cache
            .get(Self::cache_slot(addr))
            .filter(|e| e.2 && e.0 == addr)
            .map(|e| e.1)
    }

    fn function_start(&mut self, addr: u64) -> Option<u64> {
        if let Some(r) = self.cached_function_start(addr) {
            return r;
        }
        let slot = Self::cache_slot(addr);
        let r = self.funcs.function_start(addr);
        if let Some(e) = self.cache.get_mut(slot) {
            *e = (addr, r, true);
        }
        r
    }

    /// Feeds the thread's next instruction (what [`Self::record`] does with an
    /// `Instruction` record).
    #[inline]
    pub fn instruction(&mut self, pc: u64, size: u8, class: InsnClass) {
        if self.placed_by_control_flow() && !self.moves_no_frame(pc) {
            self.control_flow(pc);
        }
        let node = if self.inline_cache.is_empty() {
            self.cur
        } else {
            self.inline_node(pc)
        };
        self.count_one(node);
        self.set_last(pc, size, class);
    }

    /// Whether the next instruction goes through [`Self::control_flow`]: the last one
    /// was a call, return, jump or conditional jump, or the stack is empty.
    #[inline]
    fn placed_by_control_flow(&self) -> bool {
        self.last.is_some_and(|l| transfers(l.class)) || self.stack.is_empty()
    }

    /// Whether the last instruction's branch to `pc` is one that [`Self::control_flow`]
    /// would see leave the stack as it is, told from the cached function starts alone: a
    /// conditional branch not taken that stays in its function, a jump within the top
    /// frame's function or to code of no known function. False when unsure (then
    /// `control_flow` decides). Most branches are these: they cost no call.
    #[inline(always)]
    fn moves_no_frame(&self, pc: u64) -> bool {
        let (Some(last), Some(top)) = (self.last, self.stack.last()) else {
            return false;
        };
        match last.class {
            InsnClass::CondJump if pc == last.next => self
                .cached_function_start(pc)
                .is_some_and(|f| f != Some(pc)),
            InsnClass::Jump | InsnClass::CondJump => match self.cached_function_start(pc) {
                Some(None) => true,
                Some(tf) => top.func == tf,
                None => false,
            },
            _ => false,
        }
    }

    /// Counts the next `n` instructions to `node` (those in the counted range).
    #[inline]
    fn count_to(&mut self, node: u32, n: u64) {
        if self.count_all {
            if let Some(node) = self.nodes.get_mut(node as usize) {
                node.count += n;
            }
            self.insns += n;
            return;
        }
        let from = self.insns;
        let to = from + n;
        let counted = to
            .min(self.counted.end)
            .saturating_sub(from.max(self.counted.start));
        if let Some(node) = self.nodes.get_mut(node as usize) {
            node.count += counted;
        }
        self.insns = to;
    }

    /// [`Self::count_to`] of one instruction.
    #[inline]
    fn count_one(&mut self, node: u32) {
        if self.counted.contains(&self.insns) {
            if let Some(n) = self.nodes.get_mut(node as usize) {
                n.count += 1;
            }
        }
        self.insns += 1;
    }

    #[inline]
    fn set_last(&mut self, pc: u64, size: u8, class: InsnClass) {
        self.last = Some(Last {
            pc,
            next: pc.wrapping_add(u64::from(size)),
            class,
        });
    }

    /// Feeds the thread's next instructions as runs ([`Runs`]; `sizes` from the first
    /// run's first instruction on): what [`Self::instruction`] does with each, a run at a
    /// time. A run moves no frame after its first instruction, and its instructions count
    /// to one node unless inlined code begins or ends inside it. Returns the instructions
    /// fed (the sizes used).
    pub fn runs(&mut self, runs: &[Run], sizes: &[u8]) -> usize {
        let mut at = 0usize;
        let inline = !self.inline_cache.is_empty();
        for r in runs {
            if self.placed_by_control_flow() && !self.moves_no_frame(r.first) {
                self.control_flow(r.first);
            }
            if inline {
                self.count_run_inline(r, sizes, at);
            } else {
                self.count_to(self.cur, u64::from(r.len));
            }
            at += r.len as usize;
            self.set_last(r.last, r.last_size, r.last_class);
        }
        at
    }

    /// Counts the instructions of run `r` (their sizes from `sizes[at]` on) where inlined
    /// frames are counted: to the node of their inline key, a stretch of one key at a
    /// time where inlined code begins or ends inside the run (each counted as its
    /// instructions one by one would be).
    #[inline]
    fn count_run_inline(&mut self, r: &Run, sizes: &[u8], at: usize) {
        // (The run's sizes are sliced only where they are read: most runs are remembered.)
        let sizes = || sizes.get(at..at + r.len as usize).unwrap_or(&[]);
        match self.run_inline_keys(r, sizes) {
            RunInline::One(key) => {
                let node = self.node_of_key(key);
                self.count_to(node, u64::from(r.len));
            }
            RunInline::Stretches(start, count) => {
                for k in start..start + count {
                    let Some(&(n, key)) = self.run_stretches.get(k as usize) else {
                        break;
                    };
                    let node = self.node_of_key(key);
                    self.count_to(node, u64::from(n));
                }
            }
            RunInline::Mixed => {
                let mut pc = r.first;
                for &size in sizes() {
                    let node = self.inline_node(pc);
                    self.count_one(node);
                    pc = pc.wrapping_add(u64::from(size));
                }
            }
        }
    }

    /// The inline keys of the instructions of run `r` (their sizes given by `sizes`, asked
    /// only for a run not remembered): one they all share (0: none), or the stretches of
    /// one key each. Runs are remembered by their first address, their length and last
    /// address: the straight code from an address to its first branch is the same each
    /// time, unless a program rewrites code that has debug information (then a run of the
    /// same bounds keeps the keys of its first decoding). Runs in regions without inlined
    /// code are not remembered.
    fn run_inline_keys<'s>(&mut self, r: &Run, sizes: impl FnOnce() -> &'s [u8]) -> RunInline {
        let (start, len, maybe) = self.regions[0];
        // (A run's addresses go up from its first to its last.)
        if !maybe && r.first.wrapping_sub(start) < len && r.last.wrapping_sub(start) < len {
            return RunInline::One(0);
        }
        let (pc, end) = (r.first, r.last);
        let slot = ((pc ^ (pc >> 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize
            % RUN_CACHE_SLOTS;
        if let Some(e) = self.run_cache.get(slot) {
            if e.first == pc && e.last == end && e.len == r.len && e.known {
                return e.keys;
            }
        }
        let keys = self.run_stretches_of(r, sizes());
        if let Some(e) = self.run_cache.get_mut(slot) {
            *e = RunKey {
                first: pc,
                last: end,
                len: r.len,
                known: true,
                keys,
            };
        }
        keys
    }

    /// [`Self::run_inline_keys`] of a run not remembered: its instructions' keys asked
    /// one by one, the stretches of more than one key kept in `run_stretches`.
    #[inline(never)]
    fn run_stretches_of(&mut self, r: &Run, sizes: &[u8]) -> RunInline {
        let mut stretches = [(0u32, 0u64); MAX_STRETCHES];
        let mut count = 0;
        let (mut key, mut n) = (self.inline_context(r.first), 1u32);
        let mut at = r.first;
        for &size in sizes.get(..sizes.len().saturating_sub(1)).unwrap_or(&[]) {
            at = at.wrapping_add(u64::from(size));
            let k = self.inline_context(at);
            if k == key {
                n += 1;
                continue;
            }
            let Some(s) = stretches.get_mut(count) else {
                return RunInline::Mixed;
            };
            *s = (n, key);
            count += 1;
            (key, n) = (k, 1);
        }
        if count == 0 {
            return RunInline::One(key);
        }
        // (The last stretch takes the instructions without a size, if any.)
        let counted: u32 = stretches.iter().take(count).map(|s| s.0).sum();
        let Some(s) = stretches.get_mut(count) else {
            return RunInline::Mixed;
        };
        *s = (r.len.saturating_sub(counted).max(n), key);
        count += 1;
        if self.run_stretches.len() + count > MAX_RUN_STRETCHES {
            // Full: every remembered run with stretches is forgotten.
            self.run_stretches.clear();
            for e in &mut self.run_cache {
                if matches!(e.keys, RunInline::Stretches(..)) {
                    e.known = false;
                }
            }
        }
        let start = self.run_stretches.len() as u32;
        self.run_stretches
            .extend_from_slice(stretches.get(..count).unwrap_or(&[]));
        RunInline::Stretches(start, count as u32)
    }

    /// What the last instruction's branch to `pc` did to the stack; an empty stack gets
    /// an implied frame.
    #[inline(never)]
    fn control_flow(&mut self, pc: u64) {
        if let Some(last) = self.last.take() {
            match last.class {
                InsnClass::Call => self.call(last, pc),
                InsnClass::Return => self.ret(pc),
                // A conditional branch not taken goes on in its own function, unless it
                // falls through into the next one.
                InsnClass::CondJump if pc == last.next && self.function_start(pc) != Some(pc) => {}
                InsnClass::Jump | InsnClass::CondJump => self.jump(last.pc, pc),
                _ => {}
            }
        }
        if self.stack.is_empty() {
            let func = self.function_start(pc);
            // (The thread image's first instruction, a function's entry: the program's or
            // the dynamic loader's entry point.)
            if self.insns == 0 && (func == Some(pc) || self.thread_start) {
                self.seg_rooted = true;
            }
            self.push(func.unwrap_or(pc), func, None, SpanStart::Implied, false);
        }
    }

    /// The node the instruction at `pc` counts to, its frame's run of inlined code
    /// followed.
    #[inline]
    fn inline_node(&mut self, pc: u64) -> u32 {
        let key = self.inline_context(pc);
        self.node_of_key(key)
    }

    /// The node an instruction of inline key `key` counts to, its frame's run of inlined
    /// code followed.
    #[inline]
    fn node_of_key(&mut self, key: u64) -> u32 {
        if key == 0 && self.stack.last().is_none_or(|f| f.inline == 0) {
            return self.cur;
        }
        self.inline_node_of(key)
    }

    #[inline(never)]
    fn inline_node_of(&mut self, key: u64) -> u32 {
        let mut node = self.cur;
        if key != 0 {
            node = match self.last_inline {
                (c, k, n) if c == self.cur && k == key => n,
                _ => {
                    let n = self.node_for(self.cur, key);
                    self.last_inline = (self.cur, key, n);
                    n
                }
            };
        }
        self.inline_run(key);
        node
    }

    fn call(&mut self, last: Last, target: u64) {
        if target == last.next {
            return;
        }
        let func = self.function_start(target);
        self.push(target, func, Some(last.next), SpanStart::Call, false);
    }

    fn ret(&mut self, target: u64) {
        if let Some(k) = self.stack.iter().rposition(|f| f.ret == Some(target)) {
            self.close_above(k + 1, SpanEnd::Unwound);
            self.pop(SpanEnd::Return);
            return;
        }
        let Some(top) = self.stack.last().copied() else {
            return;
        };
        if top.ret.is_some() {
            self.lost_returns += 1;
        }
        if top.is_async && top.start_kind != SpanStart::Trampoline {
            self.pop_keep(SpanEnd::Return);
            let func = self.function_start(target);
            self.push(
                func.unwrap_or(target),
                func,
                None,
                SpanStart::Trampoline,
                true,
            );
            return;
        }
        if self.seg_rooted {
            // The thread's first frame (its entry point) has no caller to return to: the
            // reconstruction has lost track of the stack (code that makes its own return
            // addresses, as V8's deoptimizer and interpreter do). The code returned to runs
            // in an implied frame from here on, on the first frame, rather than in callers
            // implied from the thread's start around everything seen since.
            if self.stack.len() > 1 {
                self.pop(SpanEnd::Return);
            }
            let func = self.function_start(target);
            if self.stack.len() == 1 && self.stack.last().is_some_and(|f| f.func != func) {
                self.push(
                    func.unwrap_or(target),
                    func,
                    None,
                    SpanStart::Implied,
                    false,
                );
            }
            return;
        }
        self.pop(SpanEnd::Return);
        if self.stack.is_empty() {
            self.push_bottom(target);
        }
    }

    fn jump(&mut self, from: u64, target: u64) {
        let Some(tf) = self.function_start(target) else {
            return;
        };
        // A jump within the top frame's own function (most jumps: looked at before the
        // source's function), or into it from code outside it: the function's split-off
        // part (gcc's `.cold` code, which a stripped binary gives no symbol) going back,
        // or looping to its start. The frame goes on; the same function deeper in the
        // stack (recursion: an interpreter) is no target.
        if self.stack.last().is_some_and(|f| f.func == Some(tf)) {
            return;
        }
        if self.function_start(from) == Some(tf) {
            return;
        }
        if tf == target {
            let Some(top) = self.stack.last().copied() else {
                return;
            };
            self.pop_keep(SpanEnd::TailCall);
            self.push(target, Some(tf), top.ret, SpanStart::TailCall, top.is_async);
        } else if self.stack.len() >= 2 {
            let below = self.stack.len() - 1;
            if let Some(k) = self.stack[..below].iter().rposition(|f| f.func == Some(tf)) {
                self.close_above(k + 1, SpanEnd::Unwound);
            }
        }
    }

    fn enabled(&mut self, ip: u64) {
        match self.disabled.take() {
            Some(Some(at)) => {
                if at != ip {
                    let last = self.last.take();
                    self.async_entry(at, ip, last);
                }
            }
            _ => {
                let next = self.last.filter(|l| !is_branch(l.class)).map(|l| l.next);
                if next == Some(ip) {
                    return;
                }
                if let Some(k) = self.saved.iter().rposition(|s| s.resume == ip) {
                    let s = self.saved[k];
                    self.close_above(s.depth, SpanEnd::Resumed);
                    self.saved.truncate(k);
                    self.last = s.last;
                    return;
                }
                if let Some(next) = next {
                    self.last = None;
                    self.async_entry(next, ip, None);
                }
            }
        }
    }

    fn async_entry(&mut self, resume: u64, entry: u64, last: Option<Last>) {
        self.saved.push(Saved {
            resume,
            depth: self.stack.len(),
            last,
        });
        let func = self.function_start(entry);
        self.push(entry, func, None, SpanStart::Async, true);
    }

    #[inline]
    fn node_for(&mut self, parent: u32, key: u64) -> u32 {
        let slot = ((key ^ u64::from(parent).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            >> 52) as usize
            % CHILD_MEMO_SLOTS;
        if let Some(&(p, g, k, n)) = self.child_memo.get(slot) {
            if p == parent && k == key && g == self.child_generation {
                return n;
            }
        }
        let n = self.node_for_uncached(parent, key);
        if let Some(e) = self.child_memo.get_mut(slot) {
            *e = (parent, self.child_generation, key, n);
        }
        n
    }

    /// [`Self::node_for`] through the map of every child.
    #[inline(never)]
    fn node_for_uncached(&mut self, parent: u32, key: u64) -> u32 {
        if let Some(&n) = self.child.get(&(parent, key)) {
            return n;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            key,
            parent,
            count: 0,
            children: Vec::new(),
        });
        if let Some(p) = self.nodes.get_mut(parent as usize) {
            p.children.push(id);
        }
        self.child.insert((parent, key), id);
        id
    }

    fn push(
        &mut self,
        addr: u64,
        func: Option<u64>,
        ret: Option<u64>,
        start_kind: SpanStart,
        is_async: bool,
    ) {
        if self.stack.len() >= MAX_DEPTH {
            // Calls whose returns never show (code that leaves frames by jumps, as JIT
            // runtimes do) would grow the stack, and the trie with it, for ever.
            self.restart(Some(format!(
                "call stack deeper than {MAX_DEPTH} frames (calls whose returns were not \
                 seen): the stacks start over"
            )));
        }
        // A call made from inlined code is under the inlined function's frame.
        let parent = match self.stack.last() {
            None => self.seg_root,
            Some(f) if f.inline != 0 => {
                let (node, key) = (f.node, f.inline);
                self.node_for(node, key)
            }
            Some(f) => f.node,
        };
        let node = self.node_for(parent, addr);
        self.sink.begin(self.insns, addr, start_kind);
        self.stack.push(Frame {
            func,
            ret,
            start_kind,
            node,
            is_async,
            inline: 0,
        });
        self.cur = node;
    }

    /// The caller of everything seen so far in this segment, returned to with an empty
    /// stack: a frame below all the segment's spans, from the segment's start.
    fn push_bottom(&mut self, target: u64) {
        if self.seg_bottoms as usize >= MAX_BOTTOMS {
            // Code that keeps returning to callers it was never called from (a JVM's
            // interpreter and compiled code): every stack would grow a frame deeper at its
            // bottom each time. The stacks start over instead (no trace is lost: no marker).
            self.restart(None);
        }
        // Nodes move under the new bottom frame: forget the children looked up.
        self.last_inline = (u32::MAX, 0, 0);
        self.child_generation = self.child_generation.wrapping_add(1);
        if self.child_generation == 0 {
            // (Wrapped: entries of generation 0 could look valid again.)
            self.child_memo.fill((u32::MAX, 0, 0, 0));
        }
        let func = self.function_start(target);
        let addr = func.unwrap_or(target);
        let root = self.seg_root;
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            key: addr,
            parent: root,
            count: 0,
            children: Vec::new(),
        });
        let moved = self
            .nodes
            .get_mut(root as usize)
            .map(|r| std::mem::replace(&mut r.children, vec![id]))
            .unwrap_or_default();
        for &c in &moved {
            if let Some(n) = self.nodes.get_mut(c as usize) {
                n.parent = id;
                let key = n.key;
                self.child.remove(&(root, key));
                self.child.insert((id, key), c);
            }
        }
        if let Some(n) = self.nodes.get_mut(id as usize) {
            n.children = moved;
        }
        self.child.insert((root, addr), id);
        self.seg_bottoms += 1;
        self.sink.implied_caller(self.seg_start, addr);
        self.stack.push(Frame {
            func,
            ret: None,
            start_kind: SpanStart::Implied,
            node: id,
            is_async: false,
            inline: 0,
        });
        self.cur = id;
    }

    /// Closes the top frame; the interrupted contexts whose handler frame it was are
    /// forgotten.
    fn pop(&mut self, end_kind: SpanEnd) {
        self.pop_keep(end_kind);
        let depth = self.stack.len();
        self.saved.retain(|s| s.depth < depth);
    }

    /// Counts the top frame's instruction at `insns` (inline key `key`, 0: none) into its
    /// run of inlined code: a run of another key ends there (with the calls made from it,
    /// which are inside it) and one of a nonzero key begins, one deeper than the frame.
    fn inline_run(&mut self, key: u64) {
        let at = self.insns;
        let Some(f) = self.stack.last_mut() else {
            return;
        };
        if f.inline == key {
            return;
        }
        let open = std::mem::replace(&mut f.inline, key);
        if open != 0 {
            self.sink.end(at, SpanEnd::Inlined);
        }
        if key != 0 {
            self.sink.begin(at, key, SpanStart::Inlined);
        }
    }

    /// Closes the top frame to replace it (the interrupted contexts stay).
    fn pop_keep(&mut self, end_kind: SpanEnd) {
        let Some(f) = self.stack.pop() else {
            return;
        };
        if f.inline != 0 {
            self.sink.end(self.insns, SpanEnd::Inlined);
        }
        self.sink.end(self.insns, end_kind);
        self.cur = self.stack.last().map_or(self.seg_root, |f| f.node);
    }

    fn close_above(&mut self, depth: usize, end_kind: SpanEnd) {
        while self.stack.len() > depth {
            self.pop(end_kind);
        }
    }

    fn new_segment_root(&mut self) {
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            key: 0,
            parent: ROOT,
            count: 0,
            children: Vec::new(),
        });
        self.seg_root = id;
        self.cur = id;
    }

    fn end_segment(&mut self, end_kind: SpanEnd) {
        self.close_above(0, end_kind);
        self.sink.segment_end(self.insns);
        self.seg_bottoms = 0;
        self.seg_rooted = false;
        self.seg_start = self.insns;
        self.saved.clear();
        self.last = None;
        self.disabled = None;
        if self
            .nodes
            .get(self.seg_root as usize)
            .is_some_and(|r| !r.children.is_empty() || r.count > 0)
        {
            self.new_segment_root();
        }
    }
}

/// Instruction index -> time, interpolated linearly between anchors (flat before the first
/// and after the last).
#[derive(Debug, Clone, Default)]
pub struct TimeMap {
    /// (instruction index, time), sorted. Several anchors at one index (time passed
    /// between two instructions, e.g. in a syscall): the instructions before it are
    /// interpolated towards the first, the index itself and later from the last.
    points: Vec<(u64, f64)>,
}

impl TimeMap {
    /// From (instruction index, time) pairs in trace order; pairs going back in time are
    /// dropped.
    pub fn new(points: impl IntoIterator<Item = (u64, f64)>) -> Self {
        let mut v: Vec<(u64, f64)> = Vec::new();
        for (i, t) in points {
            if v.last().is_none_or(|l| i >= l.0 && t >= l.1) {
                v.push((i, t));
            }
        }
        TimeMap { points: v }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The time of instruction index `insn` (0 without anchors).
    pub fn at(&self, insn: u64) -> f64 {
        let k = self.points.partition_point(|p| p.0 <= insn);
        match (
            k.checked_sub(1).and_then(|j| self.points.get(j)),
            self.points.get(k),
        ) {
            (Some(a), Some(b)) => {
                let f = (insn - a.0) as f64 / (b.0 - a.0) as f64;
                a.1 + (b.1 - a.1) * f
            }
            (Some(a), None) => a.1,
            (None, Some(b)) => b.1,
            (None, None) => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Gap, GapKind};
    use crate::runs::Runs;

    /// Functions as address ranges (start, end).
    struct Table(Vec<(u64, u64)>);

    impl Functions for Table {
        fn function_start(&self, addr: u64) -> Option<u64> {
            self.0
                .iter()
                .find(|(s, e)| (*s..*e).contains(&addr))
                .map(|(s, _)| *s)
        }
    }

    const MAIN: u64 = 0x1000;
    const A: u64 = 0x2000;
    const B: u64 = 0x3000;
    const C: u64 = 0x4000;
    const H: u64 = 0x5000; // a signal handler
    const R: u64 = 0x6000; // the signal trampoline
    const LIB: u64 = 0x7000;

    fn table() -> Table {
        Table(vec![
            (MAIN, MAIN + 0x100),
            (A, A + 0x100),
            (B, B + 0x100),
            (C, C + 0x100),
            (H, H + 0x100),
            (R, R + 0x100),
            (LIB, LIB + 0x100),
        ])
    }

    fn ins(pc: u64, size: u8, class: InsnClass) -> Record {
        crate::testgen::instruction(pc, size, class)
    }
    fn other(pc: u64) -> Record {
        ins(pc, 1, InsnClass::Other)
    }
    fn call(pc: u64) -> Record {
        ins(pc, 5, InsnClass::Call)
    }
    fn ret(pc: u64) -> Record {
        ins(pc, 1, InsnClass::Return)
    }
    fn jmp(pc: u64) -> Record {
        ins(pc, 2, InsnClass::Jump)
    }
    fn syscall(pc: u64) -> Record {
        ins(pc, 2, InsnClass::FarCall)
    }

    fn span(addr: u64, depth: u32, start: u64, end: u64, s: SpanStart, e: SpanEnd) -> Span {
        Span {
            addr,
            depth,
            start,
            end,
            start_kind: s,
            end_kind: e,
        }
    }

    fn run(records: &[Record]) -> ThreadStacks {
        run_from(records, false)
    }

    /// [`run`], the first record said to be its thread's first instruction or not
    /// ([`CallStacks::set_thread_start`]).
    fn run_from(records: &[Record], thread_start: bool) -> ThreadStacks {
        let t = table();
        let mut cs = CallStacks::new(&t);
        cs.set_thread_start(thread_start);
        for r in records {
            cs.record(r);
        }
        cs.finish()
    }

    fn stacks(t: &ThreadStacks) -> Vec<(Vec<u64>, u64)> {
        let mut v = t.stacks.clone();
        v.sort();
        v
    }

    use SpanEnd as E;
    use SpanStart as S;

    /// [`table`]'s functions, with code inlined at `A+0x10..A+0x20` (key 1) and DWARF only
    /// for `A`'s region; the inline keys asked.
    struct Inlines {
        table: Table,
        asked: std::cell::RefCell<Vec<u64>>,
    }

    impl Functions for Inlines {
        fn function_start(&self, addr: u64) -> Option<u64> {
            self.table.function_start(addr)
        }

        fn inline_context(&self, pc: u64) -> u64 {
            self.asked.borrow_mut().push(pc);
            if (A + 0x10..A + 0x20).contains(&pc) {
                INLINE_KEY | 1
            } else {
                0
            }
        }

        fn inline_region(&self, pc: u64) -> (std::ops::Range<u64>, bool) {
            match pc {
                ..A => (0..A, false),
                A..0x2100 => (A..A + 0x100, true),
                _ => (A + 0x100..u64::MAX, false),
            }
        }
    }

    /// Inlined frames are looked up only in regions that may have them, each address once;
    /// the frames come out the same.
    #[test]
    fn inline_frames_are_asked_only_where_inlined_code_may_be() {
        let f = Inlines {
            table: table(),
            asked: Default::default(),
        };
        let mut cs = CallStacks::new(&f).with_inline_frames();
        for _ in 0..3 {
            for r in [
                call(MAIN),
                other(A),
                other(A + 0x10),
                other(A + 0x11),
                other(A + 0x20),
                ret(A + 0x21),
                call(MAIN + 5),
                other(C),
                other(C + 1),
                ret(C + 2),
                other(MAIN + 10),
                jmp(MAIN + 11),
            ] {
                cs.record(&r);
            }
        }
        let t = cs.finish();
        assert_eq!(
            *f.asked.borrow(),
            [A, A + 0x10, A + 0x11, A + 0x20, A + 0x21]
        );
        assert_eq!(
            stacks(&t),
            [
                (vec![MAIN], 12),
                (vec![MAIN, A], 9),
                (vec![MAIN, A, INLINE_KEY | 1], 6),
                (vec![MAIN, C], 9),
            ]
        );
    }

    /// A deterministic walk through static code over [`table`]'s functions (every address
    /// always holds the same instruction): calls, returns (to a caller or, with an empty
    /// stack, elsewhere), loops, tail calls, and now and then an overflow or a system call
    /// whose trace resumes elsewhere.
    fn walk(seed: u64, len: usize) -> Vec<Record> {
        let starts = [MAIN, A, B, C, H, R, LIB];
        let hash = |x: u64| {
            let x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut pc, mut stack, mut out) = (MAIN, Vec::new(), Vec::new());
        while out.len() < len {
            let (base, h) = (pc & !0xFFF, hash(pc));
            let size = (1 + (h >> 8) % 4) as u8;
            let target = starts[(h >> 16) as usize % 7];
            let (class, to) = match h % 32 {
                _ if pc - base >= 0x40 || h % 32 == 5 => {
                    let to = stack.pop().unwrap_or(starts[(next() % 7) as usize] + 4);
                    (InsnClass::Return, to)
                }
                0 | 1 => {
                    stack.push(pc + u64::from(size));
                    (InsnClass::Call, target)
                }
                2 if next() % 3 == 0 => (InsnClass::CondJump, base),
                2 => (InsnClass::CondJump, pc + u64::from(size)),
                3 => (InsnClass::Jump, target),
                4 => (InsnClass::FarCall, pc + u64::from(size)),
                _ => (InsnClass::Other, pc + u64::from(size)),
            };
            out.push(ins(pc, size, class));
            pc = to;
            match (class, next() % 64) {
                (InsnClass::FarCall, 0..=7) => {
                    out.push(Record::TraceDisabled { ip: None });
                    out.push(Record::TraceEnabled { ip: pc });
                }
                (_, 0) if next() % 8 == 0 => {
                    pc = starts[(next() % 7) as usize];
                    stack.clear();
                    out.push(Record::Overflow { ip: Some(pc) });
                }
                _ => {}
            }
        }
        out
    }

    /// Inlined code in `MAIN` (key 1 at +0x10..+0x1d, key 2 at +0x1d..+0x25); debug
    /// information (regions where inlined code may be) for `MAIN` and `A`.
    struct TwoInlines;

    impl Functions for TwoInlines {
        fn function_start(&self, addr: u64) -> Option<u64> {
            table().function_start(addr)
        }

        fn inline_context(&self, pc: u64) -> u64 {
            match pc {
                0x1010..0x101d => INLINE_KEY | 1,
                0x101d..0x1025 => INLINE_KEY | 2,
                _ => 0,
            }
        }

        fn inline_region(&self, pc: u64) -> (std::ops::Range<u64>, bool) {
            match pc {
                ..MAIN => (0..MAIN, false),
                MAIN..0x1100 => (MAIN..MAIN + 0x100, true),
                0x1100..A => (MAIN + 0x100..A, false),
                A..0x2100 => (A..A + 0x100, true),
                _ => (A + 0x100..u64::MAX, false),
            }
        }
    }

    /// Code whose inline key changes every instruction (`MAIN+0x10..MAIN+0x50`, as
    /// 2-byte instructions: inlined, not, inlined...).
    struct Stripes;

    impl Functions for Stripes {
        fn function_start(&self, addr: u64) -> Option<u64> {
            table().function_start(addr)
        }

        fn inline_context(&self, pc: u64) -> u64 {
            match pc {
                0x1010..0x1050 if (pc - MAIN) / 2 % 2 == 0 => INLINE_KEY | 1,
                _ => 0,
            }
        }

        fn inline_region(&self, pc: u64) -> (std::ops::Range<u64>, bool) {
            match pc {
                MAIN..0x1100 => (MAIN..MAIN + 0x100, true),
                _ => (0..MAIN, false),
            }
        }
    }

    /// Runs whose inlined code begins and ends inside them count as their instructions
    /// one at a time do, when first met and again from the runs remembered: a run of 8
    /// stretches of one key each (kept as such), one of 32 (more than are kept: an
    /// instruction at a time). (The stretches kept for all runs starting over when full:
    /// the random walks of [`runs_reconstruct_what_single_instructions_do`].)
    #[test]
    fn runs_with_stretches_of_inlined_code_count_as_their_instructions() {
        let f = Stripes;
        let mut recs = vec![other(MAIN)];
        for _ in 0..3 {
            // 32 instructions, a jump last, to the 8 of 0x40..0x50, a jump last.
            for start in [0x10, 0x40] {
                for pc in (MAIN + start..MAIN + 0x4e).step_by(2) {
                    recs.push(ins(pc, 2, InsnClass::Other));
                }
                recs.push(jmp(MAIN + 0x4e));
            }
        }
        recs.push(other(MAIN + 0x50));
        let mut one = CallStacks::new(&f).with_inline_frames();
        for r in &recs {
            one.record(r);
        }
        let mut by_runs = CallStacks::new(&f).with_inline_frames();
        let mut runs = Runs::default();
        assert_eq!(runs.add_instructions(&recs), recs.len());
        assert_eq!(by_runs.runs(&runs.runs, &runs.sizes), recs.len());
        let kept: Vec<RunInline> = by_runs
            .run_cache
            .iter()
            .filter(|e| e.known)
            .map(|e| e.keys)
            .collect();
        assert!(kept.contains(&RunInline::Mixed), "{kept:?}");
        assert!(
            kept.iter().any(|k| matches!(k, RunInline::Stretches(_, 8))),
            "{kept:?}"
        );
        // Five times more, from the runs remembered.
        let mut again = by_runs;
        for _ in 0..5 {
            again.runs(&runs.runs, &runs.sizes);
        }
        for _ in 0..5 {
            for r in &recs {
                one.record(r);
            }
        }
        let (one, by_runs) = (one.finish(), again.finish());
        assert!(
            one.spans
                .iter()
                .filter(|s| s.start_kind == S::Inlined)
                .count()
                > 100
        );
        assert_eq!(one.spans, by_runs.spans);
        assert_eq!(stacks(&one), stacks(&by_runs));
        assert_eq!(one.instructions, by_runs.instructions);
    }

    /// Instructions fed as runs, gathered from slices of records cut anywhere (as a
    /// decoder hands them out), reconstruct exactly what they do one record at a time: the
    /// same spans, stacks (inlined frames included), markers and counts, with and without
    /// a counted range.
    #[test]
    fn runs_reconstruct_what_single_instructions_do() {
        let f = TwoInlines;
        for seed in [1, 7, 1234] {
            let records = walk(seed, 60_000);
            for (inline, counted) in [(false, None), (true, None), (true, Some(5_000..41_003))] {
                let new = || {
                    let cs = CallStacks::new(&f);
                    let mut cs = if inline { cs.with_inline_frames() } else { cs };
                    if let Some(r) = counted.clone() {
                        cs.count_only(r);
                    }
                    cs
                };
                let mut one = new();
                for r in &records {
                    one.record(r);
                }
                let mut by_runs = new();
                let mut runs = Runs::default();
                let mut rest = &records[..];
                let mut cut = seed;
                while !rest.is_empty() {
                    cut = cut.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let (slice, after) = rest.split_at(((cut >> 58) as usize + 1).min(rest.len()));
                    rest = after;
                    let mut s = slice;
                    loop {
                        let n = runs.add_instructions(s);
                        s = &s[n..];
                        // Fed at the slice's end only at times: runs carry over.
                        if s.is_empty() && cut >> 63 == 0 {
                            break;
                        }
                        let fed = by_runs.runs(&runs.runs, &runs.sizes);
                        assert_eq!(fed, runs.instructions());
                        runs.clear();
                        let Some((r, after)) = s.split_first() else {
                            break;
                        };
                        by_runs.record(r);
                        s = after;
                    }
                }
                by_runs.runs(&runs.runs, &runs.sizes);
                let (one, by_runs) = (one.finish(), by_runs.finish());
                assert!(one.spans.len() > 1_000 && one.markers.len() > 5, "{seed}");
                if inline {
                    assert!(one.spans.iter().any(|s| s.start_kind == S::Inlined));
                }
                assert_eq!(one.spans, by_runs.spans, "seed {seed}, inline {inline}");
                assert_eq!(
                    stacks(&one),
                    stacks(&by_runs),
                    "seed {seed}, inline {inline}"
                );
                assert_eq!(one.markers, by_runs.markers);
                assert_eq!(one.instructions, by_runs.instructions);
            }
        }
    }

    /// A thread traced from its entry point (its first instruction a function's first):
    /// nothing called that frame, so a return no frame expects (code that makes its own
    /// return addresses: V8's deoptimizer and interpreter) opens an implied frame on it
    /// from there, where a thread traced from the middle of its code gets callers implied
    /// from its start (`unmatched_returns`).
    #[test]
    fn a_thread_from_its_entry_point_is_never_returned_past() {
        let body = |first: u64| {
            vec![
                other(first),       // 0: the entry point (or not)
                call(MAIN + 1),     // 1 -> A
                other(A),           // 2
                jmp(A + 1),         // 3 -> B, a tail call (B expects MAIN+6)
                other(B),           // 4
                ret(B + 1),         // 5 -> C+0x10, which no frame expects
                other(C + 0x10),    // 6
                ret(C + 0x11),      // 7 -> LIB+0x20
                other(LIB + 0x20),  // 8
                ret(LIB + 0x21),    // 9 -> MAIN+0x40: the entry's own function
                other(MAIN + 0x40), // 10
                ret(MAIN + 0x41),   // 11 -> A+0x50: from the first frame itself
                other(A + 0x50),    // 12
            ]
        };
        let t = run(&body(MAIN));
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 13, S::Implied, E::TraceEnd),
                span(A, 1, 2, 4, S::Call, E::TailCall),
                span(B, 1, 4, 6, S::TailCall, E::Return),
                span(C, 1, 6, 8, S::Implied, E::Return),
                span(LIB, 1, 8, 10, S::Implied, E::Return),
                span(A, 1, 12, 13, S::Implied, E::TraceEnd),
            ]
        );
        assert_eq!(
            stacks(&t),
            vec![
                (vec![MAIN], 4),
                (vec![MAIN, A], 3),
                (vec![MAIN, B], 2),
                (vec![MAIN, C], 2),
                (vec![MAIN, LIB], 2),
            ]
        );
        // B's return is the one that went elsewhere than its frame expected; the others
        // left implied frames (return addresses never seen).
        assert_eq!(t.lost_returns, 1);
        // The same code entered in the middle of main: B's return goes on in main's
        // frame, and the returns from it open callers implied from the start.
        let t = run(&body(MAIN + 8));
        assert_eq!(
            t.spans,
            vec![
                span(A, 0, 0, 13, S::Implied, E::TraceEnd),
                span(MAIN, 1, 0, 12, S::Implied, E::Return),
                span(LIB, 2, 0, 10, S::Implied, E::Return),
                span(MAIN, 3, 0, 8, S::Implied, E::Return),
                span(A, 4, 2, 4, S::Call, E::TailCall),
                span(B, 4, 4, 6, S::TailCall, E::Return),
            ]
        );
        assert_eq!(t.lost_returns, 1);
        // Entered in the middle of main where its thread began (a thread created by
        // `clone`, traced from the child's first instruction): rooted as at an entry point.
        let t = run_from(&body(MAIN + 8), true);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 13, S::Implied, E::TraceEnd),
                span(A, 1, 2, 4, S::Call, E::TailCall),
                span(B, 1, 4, 6, S::TailCall, E::Return),
                span(C, 1, 6, 8, S::Implied, E::Return),
                span(LIB, 1, 8, 10, S::Implied, E::Return),
                span(A, 1, 12, 13, S::Implied, E::TraceEnd),
            ]
        );
        assert_eq!(t.lost_returns, 1);
        // Said after the first instruction, or undone by a restart before it: not rooted.
        let t = table();
        let mut cs = CallStacks::new(&t);
        cs.record(&body(MAIN + 8)[0]);
        cs.set_thread_start(true);
        for r in &body(MAIN + 8)[1..] {
            cs.record(r);
        }
        assert_eq!(
            cs.finish().spans[0],
            span(A, 0, 0, 13, S::Implied, E::TraceEnd)
        );
        let mut cs = CallStacks::new(&t);
        cs.set_thread_start(true);
        cs.restart(None);
        for r in &body(MAIN + 8) {
            cs.record(r);
        }
        assert_eq!(
            cs.finish().spans[0],
            span(A, 0, 0, 13, S::Implied, E::TraceEnd)
        );
    }

    /// A forked child starts in its parent's frames at the fork: its returns close them
    /// as they expect, and its stacks go down to the parent's first frame (no caller,
    /// as the parent's).
    #[test]
    fn a_forked_child_starts_with_its_parent_s_stack() {
        let t = table();
        let mut parent = CallStacks::new(&t);
        for r in [
            other(MAIN),    // the entry point
            call(MAIN + 1), // -> A, returns to MAIN+6
            other(A),
            call(A + 1), // -> B, returns to A+6
            other(B),    // the fork
        ] {
            parent.record(&r);
        }
        let seed = parent.stack();
        assert_eq!(seed.addresses(), vec![MAIN, A, B]);
        let mut child = CallStacks::new(&t);
        child.seed(&seed);
        for r in [
            other(B + 1),    // 0: after the fork
            ret(B + 2),      // 1 -> A+6
            other(A + 6),    // 2
            ret(A + 7),      // 3 -> MAIN+6
            other(MAIN + 6), // 4
            ret(MAIN + 7),   // 5 -> C+0x10: no frame expects it
            other(C + 0x10), // 6
        ] {
            child.record(&r);
        }
        let c = child.finish();
        assert_eq!(
            c.spans,
            vec![
                span(MAIN, 0, 0, 7, S::Implied, E::TraceEnd),
                span(A, 1, 0, 4, S::Implied, E::Return),
                span(B, 2, 0, 2, S::Implied, E::Return),
                span(C, 1, 6, 7, S::Implied, E::TraceEnd),
            ]
        );
        assert_eq!(
            stacks(&c),
            vec![
                (vec![MAIN], 2),
                (vec![MAIN, A], 2),
                (vec![MAIN, A, B], 2),
                (vec![MAIN, C], 1),
            ]
        );
        assert_eq!(c.lost_returns, 0);
        // Seeded after the first instruction: nothing.
        let mut late = CallStacks::new(&t);
        late.record(&other(B + 1));
        late.seed(&seed);
        late.record(&ret(B + 2));
        late.record(&other(A + 6));
        let spans = late.finish().spans;
        assert!(
            spans.contains(&span(B, 1, 0, 2, S::Implied, E::Return)),
            "{spans:?}"
        );
        assert!(spans.iter().all(|s| s.addr != MAIN), "{spans:?}");
    }

    /// Code that keeps returning to callers it was never called from (what a JVM's
    /// interpreter and compiled code do): each such return inserts an implied caller below
    /// the stack, and without a bound every stack grew one frame deeper each time (a java
    /// thread of 0.6 G instructions: 175,000 frames, paths of the folded stacks past 10 GB).
    /// The stacks start over after MAX_BOTTOMS such callers; every instruction is counted.
    #[test]
    fn returns_to_callers_never_seen_keep_the_stacks_bounded() {
        let mut recs = Vec::new();
        let n = 3 * MAX_BOTTOMS as u64 + 7;
        for i in 0..n {
            // A return from the current function to a new function's code each time.
            let f = 0x10_0000 + i * 0x100;
            recs.push(other(f));
            recs.push(ret(f + 1));
        }
        recs.push(other(0x10_0000 + n * 0x100));
        let t = run(&recs);
        let deepest = t.stacks.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        assert!(deepest <= MAX_BOTTOMS + 1, "{deepest} frames deep");
        assert!(
            deepest >= MAX_BOTTOMS / 2,
            "{deepest}: the callers are kept up to the bound"
        );
        let counted: u64 = t.stacks.iter().map(|(_, n)| n).sum();
        assert_eq!(counted, 2 * n + 1);
        assert_eq!(t.instructions, 2 * n + 1);
        assert!(t.markers.is_empty(), "no trace was lost: {:?}", t.markers);
    }

    /// A call chain deeper than MAX_DEPTH (calls whose returns never show) starts over with
    /// a marker instead of growing for ever.
    #[test]
    fn calls_without_returns_keep_the_stack_bounded() {
        let mut recs = Vec::new();
        let n = MAX_DEPTH as u64 + 10;
        for i in 0..n {
            let f = 0x100_0000 + i * 0x100;
            recs.push(call(f));
        }
        recs.push(other(0x100_0000 + n * 0x100));
        let t = run(&recs);
        let deepest = t.stacks.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        assert!(deepest <= MAX_DEPTH + 1, "{deepest}");
        assert_eq!(t.markers.len(), 1, "{:?}", t.markers.len());
        assert!(t.markers[0]
            .what
            .starts_with("call stack deeper than 10000 frames"));
        let counted: u64 = t.stacks.iter().map(|(_, n)| n).sum();
        assert_eq!(counted, n + 1);
    }

    /// main (entered mid-function) calls a, which calls b, twice; then main calls c.
    #[test]
    fn nested_calls() {
        let recs = vec![
            other(MAIN + 0x10), // 0
            call(MAIN + 0x11),  // 1 -> a (returns to MAIN+0x16)
            other(A),           // 2
            call(A + 1),        // 3 -> b (returns to A+6)
            other(B),           // 4
            ret(B + 1),         // 5
            other(A + 6),       // 6
            ret(A + 7),         // 7
            call(MAIN + 0x16),  // 8 -> a (returns to MAIN+0x1b)
            other(A),           // 9
            call(A + 1),        // 10
            other(B),           // 11
            ret(B + 1),         // 12
            other(A + 6),       // 13
            ret(A + 7),         // 14
            call(MAIN + 0x1b),  // 15 -> c
            other(C),           // 16
            ret(C + 1),         // 17
            other(MAIN + 0x20), // 18
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 19, S::Implied, E::TraceEnd),
                span(A, 1, 2, 8, S::Call, E::Return),
                span(B, 2, 4, 6, S::Call, E::Return),
                span(A, 1, 9, 15, S::Call, E::Return),
                span(B, 2, 11, 13, S::Call, E::Return),
                span(C, 1, 16, 18, S::Call, E::Return),
            ]
        );
        assert_eq!(
            stacks(&t),
            vec![
                (vec![MAIN], 5),
                (vec![MAIN, A], 8),
                (vec![MAIN, A, B], 4),
                (vec![MAIN, C], 2),
            ]
        );
        assert_eq!(t.instructions, 19);
        assert!(t.markers.is_empty());
    }

    /// a tail-calls b with a jump to b's first instruction; b's return goes to main.
    /// Jumps inside a function and to the middle of another one change nothing.
    #[test]
    fn tail_call() {
        let recs = vec![
            other(MAIN),     // 0
            call(MAIN + 1),  // 1 -> a (returns to MAIN+6)
            jmp(A),          // 2 -> A+0x10: same function
            jmp(A + 0x10),   // 3 -> B: b's first instruction: tail call
            jmp(B),          // 4 -> C+0x20: middle of c, no frame in c
            jmp(C + 0x20),   // 5 -> B+5: middle of b
            ret(B + 5),      // 6 -> MAIN+6: the return a's call expected
            other(MAIN + 6), // 7
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 8, S::Implied, E::TraceEnd),
                span(A, 1, 2, 4, S::Call, E::TailCall),
                span(B, 1, 4, 7, S::TailCall, E::Return),
            ]
        );
        assert_eq!(
            stacks(&t),
            vec![(vec![MAIN], 3), (vec![MAIN, A], 2), (vec![MAIN, B], 3)]
        );
    }

    /// Branches met again are told from the cached function starts without a call
    /// ([`CallStacks::moves_no_frame`]): a jump within the function, a conditional branch
    /// taken or not within it, are no-ops; a jump to another function's first
    /// instruction, and a conditional branch not taken that falls into the next one's,
    /// stay tail calls. Each round of the same code (the first with nothing cached) makes
    /// the same frames.
    #[test]
    fn branches_met_again_move_the_frames_as_the_first_time() {
        const D: u64 = A + 0x100; // right after a
        const E: u64 = D + 0x100; // right after d
        let t = Table(vec![
            (MAIN, MAIN + 0x100),
            (A, A + 0x100),
            (D, D + 0x100),
            (E, E + 0x100),
        ]);
        let cond = |pc| ins(pc, 2, InsnClass::CondJump);
        let mut recs = Vec::new();
        for _ in 0..3 {
            recs.extend([
                call(MAIN + 1), // -> a
                jmp(A),         // -> A+0x10: within a
                cond(A + 0x10), // not taken: A+0x12, within a
                cond(A + 0x12), // taken: A+0x20, within a
                jmp(A + 0x20),  // -> d's first instruction: a tail call
                cond(D),        // taken: D+0xfe, within d
                cond(D + 0xfe), // not taken: e's first instruction, a tail call
                ret(E),         // -> MAIN+6
                jmp(MAIN + 6),  // -> MAIN+1: within main
            ]);
        }
        recs.push(other(MAIN + 1));
        for by_runs in [false, true] {
            let mut cs = CallStacks::new(&t);
            if by_runs {
                let mut runs = Runs::default();
                assert_eq!(runs.add_instructions(&recs), recs.len());
                cs.runs(&runs.runs, &runs.sizes);
            } else {
                for r in &recs {
                    cs.record(r);
                }
            }
            let mut want = vec![span(MAIN, 0, 0, 28, S::Implied, E::TraceEnd)];
            for k in 0..3 {
                let b = 9 * k;
                want.push(span(A, 1, b + 1, b + 5, S::Call, E::TailCall));
                want.push(span(D, 1, b + 5, b + 7, S::TailCall, E::TailCall));
                want.push(span(E, 1, b + 7, b + 8, S::TailCall, E::Return));
            }
            let mut got = cs.finish().spans;
            got.sort_by_key(|s| (s.start, s.depth));
            assert_eq!(got, want, "by runs: {by_runs}");
        }
    }

    /// The trace starts in b, called by a, called by main: each return with an empty
    /// stack opens an implied caller from the thread's start, enclosing what came before.
    #[test]
    fn unmatched_returns() {
        let recs = [
            other(B + 0x10),    // 0
            call(B + 0x11),     // 1 -> lib
            ret(LIB),           // 2 -> B+0x16
            ret(B + 0x16),      // 3 -> A+0x20
            other(A + 0x20),    // 4
            ret(A + 0x21),      // 5 -> MAIN+0x30
            other(MAIN + 0x30), // 6
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 7, S::Implied, E::TraceEnd),
                span(A, 1, 0, 6, S::Implied, E::Return),
                span(B, 2, 0, 4, S::Implied, E::Return),
                span(LIB, 3, 2, 3, S::Call, E::Return),
            ]
        );
        assert_eq!(
            stacks(&t),
            vec![
                (vec![MAIN], 1),
                (vec![MAIN, A], 2),
                (vec![MAIN, A, B], 3),
                (vec![MAIN, A, B, LIB], 1),
            ]
        );
        // (Returns out of implied frames: a trace that starts mid-function, not lost.)
        assert_eq!(t.lost_returns, 0);
    }

    /// A function's split-off cold part (code outside every symbol, as gcc's `.cold` code in
    /// a stripped binary) jumps back into the middle of its function and to its start,
    /// while the same function is deeper in the stack (recursion): the frames stay.
    #[test]
    fn cold_parts_jumping_back_keep_the_frames() {
        const COLD: u64 = 0x9000; // no symbol covers it
        let recs = vec![
            other(MAIN),     // 0
            call(MAIN + 1),  // 1 -> A
            other(A),        // 2
            call(A + 1),     // 3 -> A again (recursion)
            jmp(A),          // 4 -> COLD (no symbol: nothing)
            jmp(COLD),       // 5 -> A+0x20: back into the middle of A
            jmp(A + 0x20),   // 6 -> A: back to A's start (a loop, not a tail call)
            other(A),        // 7
            ret(A + 1),      // 8 -> A+6
            other(A + 6),    // 9
            ret(A + 7),      // 10 -> MAIN+6
            other(MAIN + 6), // 11
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 12, S::Implied, E::TraceEnd),
                span(A, 1, 2, 11, S::Call, E::Return),
                span(A, 2, 4, 9, S::Call, E::Return),
            ]
        );
    }

    /// A return to a frame below the top (longjmp done with a return, or unwinding)
    /// closes the frames above it; a jump into the middle of a caller's function (glibc's
    /// longjmp) does the same.
    #[test]
    fn longjmp_and_unwinding() {
        let recs = [
            other(MAIN),        // 0
            call(MAIN + 1),     // 1 -> a (returns to MAIN+6)
            call(A),            // 2 -> b (returns to A+5)
            call(B),            // 3 -> c (returns to B+5)
            ret(C),             // 4 -> MAIN+6: c and b unwound, a returns
            call(MAIN + 6),     // 5 -> a (returns to MAIN+11)
            call(A),            // 6 -> b
            jmp(B),             // 7 -> MAIN+0x40: longjmp back into main
            other(MAIN + 0x40), // 8
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 9, S::Implied, E::TraceEnd),
                span(A, 1, 2, 5, S::Call, E::Return),
                span(B, 2, 3, 5, S::Call, E::Unwound),
                span(C, 3, 4, 5, S::Call, E::Unwound),
                span(A, 1, 6, 8, S::Call, E::Unwound),
                span(B, 2, 7, 8, S::Call, E::Unwound),
            ]
        );
    }

    /// A signal interrupts b (asynchronous disable at the interrupted instruction, enable
    /// in the handler); the handler calls c, returns into the trampoline, which makes
    /// rt_sigreturn; b resumes where it was interrupted and returns normally. A second
    /// async pair at the same address (an untraced handler) changes nothing.
    #[test]
    fn signal_handler() {
        let recs = vec![
            other(MAIN),    // 0
            call(MAIN + 1), // 1 -> b (ret MAIN+6)
            other(B),       // 2
            Record::TraceDisabled { ip: Some(B + 1) },
            Record::TraceEnabled { ip: H },
            other(H),       // 3
            call(H + 1),    // 4 -> c (ret H+6)
            ret(C),         // 5
            ret(H + 6),     // 6 -> trampoline
            other(R),       // 7
            syscall(R + 1), // 8 rt_sigreturn
            Record::Syscall { pc: R + 1 },
            Record::TraceDisabled { ip: None },
            Record::TraceEnabled { ip: B + 1 },
            other(B + 1), // 9
            Record::TraceDisabled { ip: Some(B + 2) },
            Record::TraceEnabled { ip: B + 2 },
            ret(B + 2),      // 10 -> MAIN+6
            other(MAIN + 6), // 11
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 12, S::Implied, E::TraceEnd),
                span(B, 1, 2, 11, S::Call, E::Return),
                span(H, 2, 3, 7, S::Async, E::Return),
                span(C, 3, 5, 6, S::Call, E::Return),
                span(R, 2, 7, 9, S::Trampoline, E::Resumed),
            ]
        );
        assert_eq!(
            stacks(&t),
            vec![
                (vec![MAIN], 3),
                (vec![MAIN, B], 3),
                (vec![MAIN, B, H], 3),
                (vec![MAIN, B, H, C], 1),
                (vec![MAIN, B, R], 2),
            ]
        );
    }

    /// A signal delivered at a syscall's return: the next window starts in the handler
    /// instead of after the syscall. A window boundary after a syscall at the next
    /// instruction is no event at all.
    #[test]
    fn signal_at_syscall_and_plain_windows() {
        let recs = vec![
            other(A),       // 0
            syscall(A + 1), // 1
            Record::TraceDisabled { ip: None },
            Record::TraceEnabled { ip: A + 3 },
            syscall(A + 3), // 2
            Record::TraceDisabled { ip: None },
            Record::TraceEnabled { ip: H },
            ret(H),     // 3 -> trampoline
            syscall(R), // 4
            Record::TraceDisabled { ip: None },
            Record::TraceEnabled { ip: A + 5 },
            other(A + 5), // 5
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(A, 0, 0, 6, S::Implied, E::TraceEnd),
                span(H, 1, 3, 4, S::Async, E::Return),
                span(R, 1, 4, 5, S::Trampoline, E::Resumed),
            ]
        );
    }

    /// A gap in the middle closes every open frame and starts over with an implied frame;
    /// an unmatched return after it encloses only what follows the gap.
    #[test]
    fn gap_in_the_middle() {
        let gap = Record::Gap(Box::new(Gap {
            kind: GapKind::DecodeError,
            ip: None,
            pt_offset: 0x40,
            source: "t.pt".into(),
            error: "bad packet".into(),
        }));
        let recs = vec![
            other(MAIN),    // 0
            call(MAIN + 1), // 1 -> a
            other(A),       // 2
            call(A + 1),    // 3 -> b
            other(B),       // 4
            gap,
            other(B + 0x20), // 5
            ret(B + 0x21),   // 6 -> A+6 (its call was before the gap)
            other(A + 6),    // 7
            Record::Overflow { ip: Some(C) },
            other(C), // 8
        ];
        let t = run(&recs);
        assert_eq!(
            t.spans,
            vec![
                span(MAIN, 0, 0, 5, S::Implied, E::Gap),
                span(A, 1, 2, 5, S::Call, E::Gap),
                span(B, 2, 4, 5, S::Call, E::Gap),
                span(A, 0, 5, 8, S::Implied, E::Gap),
                span(B, 1, 5, 7, S::Implied, E::Return),
                span(C, 0, 8, 9, S::Implied, E::TraceEnd),
            ]
        );
        assert_eq!(
            t.markers,
            vec![
                Marker {
                    at: 5,
                    what: "gap: t.pt: PT offset 0x40: bad packet".into()
                },
                Marker {
                    at: 8,
                    what: "overflow: trace lost, resumes at 0x4000".into()
                },
            ]
        );
        assert_eq!(
            stacks(&t),
            vec![
                (vec![MAIN], 2),
                (vec![MAIN, A], 2),
                (vec![MAIN, A, B], 1),
                (vec![A], 1),
                (vec![A, B], 2),
                (vec![C], 1),
            ]
        );
    }

    /// A call to the next instruction (reading the IP) opens no frame; timestamps become
    /// anchors; the time map interpolates between them.
    #[test]
    fn call_next_and_time() {
        let recs = vec![
            Record::Timestamp {
                tsc: 100,
                perf_time: None,
            },
            call(A), // -> A+5: no frame
            other(A + 5),
            other(A + 6),
            Record::Timestamp {
                tsc: 400,
                perf_time: Some(7),
            },
            other(A + 7),
        ];
        let t = run(&recs);
        assert_eq!(t.spans, vec![span(A, 0, 0, 4, S::Implied, E::TraceEnd)]);
        assert_eq!(
            t.anchors,
            vec![
                TimeAnchor {
                    insn: 0,
                    tsc: 100,
                    perf_time: None
                },
                TimeAnchor {
                    insn: 3,
                    tsc: 400,
                    perf_time: Some(7)
                },
            ]
        );
        let m = TimeMap::new(t.anchors.iter().map(|a| (a.insn, a.tsc as f64)));
        assert_eq!(m.at(0), 100.0);
        assert_eq!(m.at(1), 200.0);
        assert_eq!(m.at(3), 400.0);
        assert_eq!(m.at(10), 400.0);
        let m = TimeMap::new([(0, 5.0), (2, 9.0), (2, 15.0), (4, 25.0)]);
        assert_eq!((m.at(1), m.at(2), m.at(3)), (7.0, 15.0, 20.0));
    }

    /// Random record streams (calls, returns to expected and unexpected places, jumps,
    /// syscalls, asynchronous entries and resumptions, gaps): the spans nest (each one
    /// inside a span one level up, none overlapping at a level), the outermost ones cover
    /// every instruction exactly once, and the stacks count every instruction once.
    #[test]
    fn random_streams_keep_the_invariants() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let t = table();
        let funcs = [MAIN, A, B, C, H, R, LIB, 0x9000];
        for _ in 0..3000 {
            let mut cs = CallStacks::new(&t);
            let mut pc = funcs[rnd(8) as usize] + rnd(0x20);
            for _ in 0..rnd(200) {
                let r = match rnd(20) {
                    0..=7 => ins(pc, 1 + rnd(4) as u8, InsnClass::Other),
                    8..=10 => ins(pc, 5, InsnClass::Call),
                    11..=13 => ins(pc, 1, InsnClass::Return),
                    14 => ins(pc, 2, InsnClass::Jump),
                    15 => ins(pc, 2, InsnClass::FarCall),
                    16 => Record::TraceDisabled {
                        ip: (rnd(2) == 0).then_some(pc),
                    },
                    17 => Record::TraceEnabled { ip: pc },
                    18 => Record::KernelXfer {
                        from: pc,
                        to: (rnd(2) == 0).then_some(H),
                    },
                    _ => match rnd(4) {
                        0 => Record::Overflow { ip: None },
                        _ => Record::Timestamp {
                            tsc: rnd(1000),
                            perf_time: None,
                        },
                    },
                };
                cs.record(&r);
                // The next address: mostly sequential, sometimes a function start or an
                // address inside one (returns and jumps go anywhere).
                pc = match rnd(6) {
                    0 => funcs[rnd(8) as usize],
                    1 => funcs[rnd(8) as usize] + rnd(0x40),
                    _ => pc + 1 + rnd(4),
                };
            }
            let out = cs.finish();
            let total: u64 = out.stacks.iter().map(|s| s.1).sum();
            assert_eq!(total, out.instructions);
            let outer: u64 = out
                .spans
                .iter()
                .filter(|s| s.depth == 0)
                .map(|s| s.end - s.start)
                .sum();
            assert_eq!(outer, out.instructions, "{:?}", out.spans);
            for s in &out.spans {
                assert!(s.start <= s.end && s.end <= out.instructions, "{s:?}");
                for o in &out.spans {
                    if o != s && o.depth == s.depth {
                        assert!(
                            o.end <= s.start
                                || s.end <= o.start
                                || o.start == o.end
                                || s.start == s.end,
                            "{s:?} overlaps {o:?}"
                        );
                    }
                }
                if s.depth > 0 {
                    assert!(
                        out.spans.iter().any(|p| p.depth + 1 == s.depth
                            && p.start <= s.start
                            && s.end <= p.end),
                        "{s:?} has no parent in {:?}",
                        out.spans
                    );
                }
            }
        }
    }
}
