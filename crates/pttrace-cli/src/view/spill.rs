//! A thread image's calls on disk while its trace is decoded, so that `view` needs memory
//! for the call depth and not for the trace's length.
//!
//! While decoding, [`SpillSink`] takes the spans of the call-stack reconstruction as they
//! open and close ([`SpanSink`]) and appends them to a temporary file: a begin record per
//! span (its time, frame and start kind, and a fixed-size field that is filled in with
//! its length and end kind when it ends: in the buffer, or in the file for the few that
//! stay open longer than a buffer), an end record, and a record at each segment's end.
//! The implied callers of a segment (begun at its start, known only later) stay in
//! memory, a few per segment, with the segments they belong to. It also adds each call's
//! cost in JSON to a histogram ([`Costs`]), from which the bounded formats choose which
//! calls to merge.
//!
//! After decoding, [`replay`] reads the file back as begins and ends in time order,
//! properly nested, each begin knowing its length: what the timeline formats write.
//!
//! The bounded formats leave out the calls shorter than a length known only once every
//! thread image is decoded, but never longer than the one the images decoded so far give
//! (their calls only add to what would be written). So the Perfetto writer, which reads
//! every image's spill while the next ones decode, also keeps the calls at least that
//! long in a small file of their own ([`KeptWriter`]); the bounded formats read that
//! ([`replay_kept`]) instead of the whole spill again: the same begins and ends, less the
//! calls they would leave out anyway (a kept call's callers are at least as long).
//!
//! Both files are removed from their directory as soon as they are created and read
//! through the open file ([`At`]): whatever ends `view` (Ctrl-C, a kill, a crash), the
//! hundreds of megabytes of a large trace's spill are not left behind.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drpttracer::decode::callstack::{SpanEnd, SpanSink, SpanStart};

use pttrace_format::leb128;

use super::varint::{put_at, put_byte};

const BEGIN: u8 = 1;
const END: u8 = 2;
const SEGMENT_END: u8 = 3;
const IMPLIED_END: u8 = 4;
/// A spill's end record of one byte: the tag in its low 3 bits, a time delta under
/// [`SHORT_DELTAS`] above them (most calls end a few instructions after the last
/// record). A spill's begin record has its start kind's code above its tag the same way.
/// (A quarter of the spill of a trace of short calls.)
const END_SHORT: u8 = 5;
const SHORT_DELTAS: u64 = 32;
/// The tag bits of a spill record's first byte.
const TAG: u8 = 7;
/// The begin record's field filled in at the span's end: end kind (1 byte), length (4:
/// a span of 2^32 instructions or more has [`LONG`] set in the end kind's byte and the
/// index of its length in [`SpillFile::long`] there). (Five bytes, not nine: the spill of
/// a trace of short calls is a quarter smaller, pages the kernel need not find.)
const PATCH: usize = 5;
/// Set in a patch field's end kind byte: its length is kept apart.
const LONG: u8 = 0x80;
/// Bytes buffered before they go to the file.
const BUFFER: usize = 1 << 20;
/// Room for any record of a spill ([`MAX_RECORD`]) after the buffered ones.
const RECORD_ROOM: usize = 64;

fn start_code(k: SpanStart) -> u8 {
    match k {
        SpanStart::Call => 0,
        SpanStart::TailCall => 1,
        SpanStart::Async => 2,
        SpanStart::Trampoline => 3,
        SpanStart::Inlined => 4,
        SpanStart::Implied => 5,
    }
}

fn start_kind(c: u8) -> SpanStart {
    match c {
        0 => SpanStart::Call,
        1 => SpanStart::TailCall,
        2 => SpanStart::Async,
        3 => SpanStart::Trampoline,
        4 => SpanStart::Inlined,
        _ => SpanStart::Implied,
    }
}

fn end_code(k: SpanEnd) -> u8 {
    match k {
        SpanEnd::Return => 0,
        SpanEnd::TailCall => 1,
        SpanEnd::Unwound => 2,
        SpanEnd::Resumed => 3,
        SpanEnd::Gap => 4,
        SpanEnd::TraceEnd => 5,
        SpanEnd::Inlined => 6,
    }
}

fn end_kind(c: u8) -> SpanEnd {
    match c {
        0 => SpanEnd::Return,
        1 => SpanEnd::TailCall,
        2 => SpanEnd::Unwound,
        3 => SpanEnd::Resumed,
        4 => SpanEnd::Gap,
        6 => SpanEnd::Inlined,
        _ => SpanEnd::TraceEnd,
    }
}

/// What a frame's spans are named by: `(address, inlined)` to a frame id of the view,
/// given by the caller (which names it and says what it costs).
pub trait FrameIds {
    /// The frame id of a span's address (`inlined`: an inline key), the bytes one of its
    /// spans takes in the JSON timeline, and the spans it stands for (the functions of an
    /// inlined chain).
    fn frame(&mut self, addr: u64, inlined: bool) -> (u32, u64, u32);
}

/// Call lengths and what their calls cost in JSON: exact below [`Costs::EXACT`]
/// instructions, by powers of two above.
pub struct Costs {
    exact: Vec<u64>,
    log: [u64; 64],
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            exact: vec![0; Self::EXACT as usize],
            log: [0; 64],
        }
    }
}

impl Costs {
    const EXACT: u64 = 1 << 16;

    pub fn add(&mut self, len: u64, cost: u64) {
        match self.exact.get_mut(len as usize) {
            Some(c) => *c += cost,
            None => {
                if let Some(c) = self.log.get_mut(63 - len.leading_zeros() as usize) {
                    *c += cost;
                }
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.exact.iter().sum::<u64>() + self.log.iter().sum::<u64>()
    }

    /// The shortest length kept so that the calls at least that long cost at most
    /// `limit` (longest first); 0 when all fit.
    pub fn threshold(&self, limit: u64) -> u64 {
        if self.total() <= limit {
            return 0;
        }
        let mut used = 0u64;
        for k in (16..64).rev() {
            used += self.log[k];
            if used > limit {
                return 1u64 << (k + 1).min(63);
            }
        }
        for len in (0..self.exact.len()).rev() {
            used += self.exact[len];
            if used > limit {
                return len as u64 + 1;
            }
        }
        0
    }
}

/// An implied caller of a segment: its frame, start and, once ended, end and end kind.
#[derive(Clone, Copy, Debug)]
struct Implied {
    frame: u32,
    cost: u64,
    start: u64,
    end: Option<(u64, SpanEnd)>,
}

/// The file of one thread image's spans, and what stays in memory to read it back. Its
/// clones read the same file (the timelines are written from it on two threads), which is
/// gone when the last is dropped (it has no name since it was created).
#[derive(Clone)]
pub struct Spill(Arc<SpillFile>);

struct SpillFile {
    /// The file (unlinked), and its name when it was created (for messages).
    file: Arc<File>,
    path: PathBuf,
    /// Implied callers by segment (in the order they were found), for the segments that
    /// have some.
    implied: HashMap<u32, Vec<Implied>>,
    /// The lengths of spans of 2^32 instructions or more, by the index their begin has.
    long: Vec<u64>,
    spans: u64,
}

impl Spill {
    /// Where its kept calls go ([`KeptWriter`]): beside it.
    pub fn kept_path(&self) -> PathBuf {
        let mut p = self.0.path.clone().into_os_string();
        p.push(".kept");
        PathBuf::from(p)
    }

    /// The spans written.
    pub fn spans(&self) -> u64 {
        self.0.spans
    }
}

/// A new file `path`, open for reading and writing and removed from its directory at once
/// (see the module documentation).
fn unlinked_file(path: &Path) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    std::fs::remove_file(path)?;
    Ok(file)
}

/// Reads a shared file from a position of its own (`pread`: the readers of one file on
/// several threads do not move each other).
struct At {
    file: Arc<File>,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Writes a thread image's spans to its spill file (see the module documentation).
pub struct SpillSink<'a, N: FrameIds> {
    file: Option<Arc<File>>,
    path: PathBuf,
    /// The records not written yet: `buf[..fill]` (its length stays
    /// `BUFFER + RECORD_ROOM`, so that a record is written into it in place).
    buf: Vec<u8>,
    fill: usize,
    /// File offset of `buf[0]`.
    base: u64,
    /// Open spans: (file offset of their begin's patch field, start, cost, spans).
    open: Vec<(u64, u64, u64, u32)>,
    /// Lengths of spans too long for a patch field ([`LONG`]).
    long: Vec<u64>,
    last_at: u64,
    segment: u32,
    implied: HashMap<u32, Vec<Implied>>,
    cur_implied: Vec<Implied>,
    frames: &'a mut N,
    /// The frames of recent span addresses, in front of `frames` (direct-mapped).
    recent: Box<[RecentFrame]>,
    costs: &'a mut Costs,
    spans: u64,
    error: Option<io::Error>,
}

/// A span address's frame as [`FrameIds::frame`] gave it: the address and its inline
/// bit (none: an empty slot), the frame id, the spans it stands for, its cost in JSON.
#[derive(Clone, Copy, Default)]
struct RecentFrame {
    key: Option<(u64, bool)>,
    frame: u32,
    width: u32,
    cost: u64,
}

/// Slots of [`SpillSink`]'s recent frames: a program's hot functions fit.
const RECENT: usize = 1 << 12;

/// The slot of `key` among the recent frames (Fibonacci hashing).
#[inline(always)]
fn recent_slot(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - RECENT.trailing_zeros())) as usize
}

impl<'a, N: FrameIds> SpillSink<'a, N> {
    /// A sink writing to a new file `path` (unlinked at once: gone when the [`Spill`] is
    /// dropped, or when `view` ends however it ends).
    pub fn create(path: &Path, frames: &'a mut N, costs: &'a mut Costs) -> io::Result<Self> {
        let file = unlinked_file(path)?;
        Ok(SpillSink {
            file: Some(Arc::new(file)),
            path: path.to_path_buf(),
            buf: vec![0; BUFFER + RECORD_ROOM],
            fill: 0,
            base: 0,
            open: Vec::new(),
            long: Vec::new(),
            last_at: 0,
            segment: 0,
            implied: HashMap::new(),
            cur_implied: Vec::new(),
            frames,
            recent: vec![RecentFrame::default(); RECENT].into_boxed_slice(),
            costs,
            spans: 0,
            error: None,
        })
    }

    /// [`FrameIds::frame`] through the recent frames: (frame, cost, width).
    #[inline(always)]
    fn frame(&mut self, addr: u64, inlined: bool) -> (u32, u64, u32) {
        let slot = recent_slot(addr ^ u64::from(inlined));
        let key = Some((addr, inlined));
        if let Some(r) = self.recent.get(slot).filter(|r| r.key == key) {
            return (r.frame, r.cost, r.width);
        }
        let (frame, cost, width) = self.frames.frame(addr, inlined);
        if let Some(r) = self.recent.get_mut(slot) {
            *r = RecentFrame {
                key,
                frame,
                width,
                cost,
            };
        }
        (frame, cost, width)
    }

    /// The time from the last record to `at`, which becomes the last.
    #[inline(always)]
    fn delta(&mut self, at: u64) -> u64 {
        let d = at.saturating_sub(self.last_at);
        self.last_at = self.last_at.max(at);
        d
    }

    /// Appends a record of tag `tag` and time delta `d` (an end or a segment's end).
    #[inline(always)]
    fn tagged(&mut self, tag: u8, d: u64) {
        let Some(w) = self.buf.get_mut(self.fill..self.fill + RECORD_ROOM) else {
            return;
        };
        let mut n = 0;
        put_byte(w, &mut n, tag);
        put_at(w, &mut n, d);
        self.fill += n;
    }

    fn flush_buf(&mut self) {
        if let (Some(f), None) = (&self.file, &self.error) {
            if let Err(e) = f.write_all_at(self.buf.get(..self.fill).unwrap_or(&[]), self.base) {
                self.error = Some(e);
            }
        }
        self.base += self.fill as u64;
        self.fill = 0;
    }

    #[inline(always)]
    fn maybe_flush(&mut self) {
        if self.fill >= BUFFER {
            self.flush_buf();
        }
    }

    /// Fills in a begin record's length and end kind.
    fn patch(&mut self, pos: u64, end: SpanEnd, len: u64) {
        let (code, len) = match u32::try_from(len) {
            Ok(len) => (end_code(end), len),
            Err(_) => {
                self.long.push(len);
                (end_code(end) | LONG, (self.long.len() - 1) as u32)
            }
        };
        if pos >= self.base {
            // (Stored in place: a field put together on the stack was read back across
            // its two stores, a stall per call.)
            let k = (pos - self.base) as usize;
            if let Some([c, rest @ ..]) = self.buf.get_mut(k..k + PATCH) {
                *c = code;
                rest.copy_from_slice(&len.to_le_bytes());
            }
            return;
        }
        let mut field = [0u8; PATCH];
        field[0] = code;
        field[1..].copy_from_slice(&len.to_le_bytes());
        if let (Some(f), None) = (&self.file, &self.error) {
            if let Err(e) = f.write_all_at(&field, pos) {
                self.error = Some(e);
            }
        }
    }

    /// Writes what is buffered; the spill, or the first error met writing it.
    pub fn finish(mut self) -> io::Result<Spill> {
        self.flush_buf();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let file = self
            .file
            .take()
            .ok_or_else(|| io::Error::other("a spill finished twice"))?;
        Ok(Spill(Arc::new(SpillFile {
            file,
            path: std::mem::take(&mut self.path),
            implied: std::mem::take(&mut self.implied),
            long: std::mem::take(&mut self.long),
            spans: self.spans,
        })))
    }
}

impl<N: FrameIds> SpanSink for SpillSink<'_, N> {
    fn begin(&mut self, at: u64, addr: u64, kind: SpanStart) {
        let (frame, cost, width) = self.frame(addr, kind == SpanStart::Inlined);
        let d = self.delta(at);
        let Some(w) = self.buf.get_mut(self.fill..self.fill + RECORD_ROOM) else {
            return;
        };
        let mut n = 0;
        put_byte(w, &mut n, BEGIN | start_code(kind) << 3);
        put_at(w, &mut n, d);
        put_at(w, &mut n, u64::from(frame));
        let pos = self.base + (self.fill + n) as u64;
        // (The patch field, zero until the span ends: the buffer holds older records.)
        if let Some(f) = w.get_mut(n..n + PATCH) {
            f.copy_from_slice(&[0; PATCH]);
        }
        n += PATCH;
        self.fill += n;
        self.open.push((pos, at, cost, width));
        self.maybe_flush();
    }

    fn end(&mut self, at: u64, kind: SpanEnd) {
        match self.open.pop() {
            Some((pos, start, cost, width)) => {
                self.spans += u64::from(width);
                let len = at.saturating_sub(start);
                self.patch(pos, kind, len);
                self.costs.add(len, cost);
                let d = self.delta(at);
                if d < SHORT_DELTAS {
                    if let Some(b) = self.buf.get_mut(self.fill) {
                        *b = END_SHORT | (d as u8) << 3;
                        self.fill += 1;
                    }
                } else {
                    self.tagged(END, d);
                }
            }
            None => {
                let Some(i) = self.cur_implied.iter_mut().rev().find(|i| i.end.is_none()) else {
                    return;
                };
                i.end = Some((at, kind));
                self.spans += 1;
                let len = at.saturating_sub(i.start);
                self.costs.add(len, i.cost);
                let d = self.delta(at);
                self.tagged(IMPLIED_END, d);
            }
        }
        self.maybe_flush();
    }

    fn implied_caller(&mut self, from: u64, addr: u64) {
        let (frame, cost, _) = self.frame(addr, false);
        self.cur_implied.push(Implied {
            frame,
            cost,
            start: from,
            end: None,
        });
    }

    fn segment_end(&mut self, at: u64) {
        self.open.clear();
        let d = self.delta(at);
        self.tagged(SEGMENT_END, d);
        if !self.cur_implied.is_empty() {
            self.implied
                .insert(self.segment, std::mem::take(&mut self.cur_implied));
        }
        self.segment += 1;
        self.maybe_flush();
    }
}

/// A span's begin or end, as [`replay`] gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    Begin {
        at: u64,
        len: u64,
        frame: u32,
        start: SpanStart,
        end: SpanEnd,
    },
    End {
        at: u64,
        frame: u32,
    },
}

/// A damaged spill file (it is this process's own: an I/O fault or a bug).
#[cold]
fn damaged(path: &Path, what: &str) -> io::Error {
    io::Error::other(format!("{}: {what}", path.display()))
}

/// Reads a spill file in blocks, a record never split (records are at most
/// [`MAX_RECORD`] bytes).
struct Reader<R: Read> {
    r: R,
    /// The bytes read are `buf[pos..end]` (its length grows to [`BUFFER`]).
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
}

/// The first read of a [`Reader`].
const FIRST_READ: usize = 64 << 10;

/// The longest record: a spill's begin (tag, two varints, kind, patch field) or a kept
/// file's (tag, three varints, two kinds).
const MAX_RECORD: usize = 1 + 10 + 10 + 10 + 2;

impl<R: Read> Reader<R> {
    fn new(r: R) -> Self {
        Reader {
            r,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            eof: false,
        }
    }

    /// Makes a whole record available (unless the file ends first); false at the end.
    #[inline(always)]
    fn fill(&mut self) -> io::Result<bool> {
        if self.end - self.pos >= MAX_RECORD || self.eof {
            return Ok(self.pos < self.end);
        }
        self.refill()
    }

    /// [`Self::fill`] when the buffer runs low: what is left moves to its start, and the
    /// file fills the rest.
    #[cold]
    #[inline(never)]
    fn refill(&mut self) -> io::Result<bool> {
        // (The buffer grows from a small one, doubling at each refill: most thread
        // images' files are small, and a buffer of [`BUFFER`] zeroed for each of them
        // cost more than reading them.)
        if self.buf.len() < BUFFER {
            let len = (self.buf.len() * 2).clamp(FIRST_READ, BUFFER);
            self.buf.resize(len, 0);
        }
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        while self.end < self.buf.len() {
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(k) => {
                    self.end += k;
                    // (A file read while it is written gives what is there: a record is
                    // enough to go on with. A plain file fills the buffer in one read.)
                    if self.end >= MAX_RECORD {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.pos < self.end)
    }

    /// The bytes read and not yet taken.
    #[inline(always)]
    fn available(&self) -> &[u8] {
        self.buf.get(self.pos..self.end).unwrap_or(&[])
    }

    /// Takes `n` of the bytes [`Self::available`] gave.
    #[inline(always)]
    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }
}

/// Reads a spill back: every span, as begins and ends in time order and properly nested;
/// with `cut`, only the spans' parts within
/// instructions `[a, b)` (a span cut at its start starts `Implied`, one cut at its end
/// ends `TraceEnd`; inlined code keeps its kinds).
pub fn replay(
    spill: &Spill,
    cut: Option<(u64, u64)>,
    mut f: impl FnMut(Edge) -> io::Result<()>,
) -> io::Result<()> {
    let spill = &*spill.0;
    let mut r = Reader::new(At {
        file: spill.file.clone(),
        pos: 0,
    });
    let (lo, hi) = cut.unwrap_or((0, u64::MAX));
    // Open spans: frame, and whether their begin was given.
    let mut open: Vec<(u32, bool)> = Vec::new();
    let begin = |at: u64, len: u64, start: SpanStart, end: SpanEnd| {
        let (mut b, mut e) = (at, at.saturating_add(len));
        let (mut sk, mut ek) = (start, end);
        let shown = e > lo && b < hi || e == b && (lo..hi).contains(&b);
        if b < lo {
            b = lo;
            if sk != SpanStart::Inlined {
                sk = SpanStart::Implied;
            }
        }
        if e > hi {
            e = hi;
            if ek != SpanEnd::Inlined {
                ek = SpanEnd::TraceEnd;
            }
        }
        (shown, b, e, sk, ek)
    };
    let mut segment = 0u32;
    let mut at = 0u64;
    let mut implied_open: Vec<(u32, bool, u64)> = Vec::new();
    // The implied callers of the segment begun last not given yet (given from the last
    // found, the outermost).
    let mut implied = spill.implied.get(&segment).map_or(&[][..], Vec::as_slice);
    // (Every edge goes to `f` from one place, the end of this loop: `f` is then compiled
    // into it, where a call per edge had cost the Perfetto writer a tenth of its time.)
    loop {
        let edge = if let Some((i, rest)) = implied.split_last() {
            implied = rest;
            let (end_at, end) = i.end.unwrap_or((i.start, SpanEnd::TraceEnd));
            let (shown, b, e, sk, ek) = begin(i.start, end_at - i.start, SpanStart::Implied, end);
            implied_open.push((i.frame, shown, e));
            if !shown {
                continue;
            }
            Edge::Begin {
                at: b,
                len: e - b,
                frame: i.frame,
                start: sk,
                end: ek,
            }
        } else {
            if !r.fill()? {
                return Ok(());
            }
            let (rec, used) = spill_record(r.available())
                .ok_or_else(|| damaged(&spill.path, "spill file cut short or damaged"))?;
            r.consume(used);
            match rec {
                SpillRecord::Begin {
                    delta,
                    frame,
                    start,
                    end,
                    len,
                } => {
                    at += delta;
                    let frame = u32::try_from(frame)
                        .map_err(|_| damaged(&spill.path, "bad frame in spill file"))?;
                    let len = match end & LONG {
                        0 => u64::from(len),
                        _ => *spill
                            .long
                            .get(len as usize)
                            .ok_or_else(|| damaged(&spill.path, "bad span length in spill file"))?,
                    };
                    let (sk, ek) = (start_kind(start), end_kind(end & !LONG));
                    let (shown, b, e, sk, ek) = begin(at, len, sk, ek);
                    open.push((frame, shown));
                    if !shown {
                        continue;
                    }
                    Edge::Begin {
                        at: b,
                        len: e - b,
                        frame,
                        start: sk,
                        end: ek,
                    }
                }
                SpillRecord::End { delta } => {
                    at += delta;
                    let Some((frame, true)) = open.pop() else {
                        continue;
                    };
                    Edge::End {
                        at: at.clamp(lo, hi),
                        frame,
                    }
                }
                SpillRecord::ImpliedEnd { delta } => {
                    at += delta;
                    // The innermost implied caller still open.
                    let Some(k) = implied_open.iter().rposition(|i| i.2 != u64::MAX) else {
                        continue;
                    };
                    let (frame, shown, _) = implied_open[k];
                    implied_open[k].2 = u64::MAX;
                    if !shown {
                        continue;
                    }
                    Edge::End {
                        at: at.clamp(lo, hi),
                        frame,
                    }
                }
                SpillRecord::SegmentEnd { delta } => {
                    at += delta;
                    open.clear();
                    segment += 1;
                    implied_open.clear();
                    implied = spill.implied.get(&segment).map_or(&[][..], Vec::as_slice);
                    continue;
                }
            }
        };
        f(edge)?;
    }
}

/// A record of a spill file as [`SpillSink`] wrote it (kinds by their codes).
enum SpillRecord {
    Begin {
        delta: u64,
        frame: u64,
        start: u8,
        /// The end kind's code, with [`LONG`] when `len` is the index of the length.
        end: u8,
        len: u32,
    },
    End {
        delta: u64,
    },
    ImpliedEnd {
        delta: u64,
    },
    SegmentEnd {
        delta: u64,
    },
}

/// The spill record at the start of `b` and its bytes; `None` when `b` ends within it or
/// it is no record.
#[inline(always)]
fn spill_record(b: &[u8]) -> Option<(SpillRecord, usize)> {
    let first = *b.first()?;
    if first & TAG == END_SHORT {
        let delta = u64::from(first >> 3);
        return Some((SpillRecord::End { delta }, 1));
    }
    let mut n = 1;
    let delta = leb128::read(b, &mut n)?;
    let rec = match first & TAG {
        BEGIN => {
            let frame = leb128::read(b, &mut n)?;
            let [end, l0, l1, l2, l3] = *b.get(n..n + PATCH)? else {
                return None;
            };
            n += PATCH;
            SpillRecord::Begin {
                delta,
                frame,
                start: first >> 3,
                end,
                len: u32::from_le_bytes([l0, l1, l2, l3]),
            }
        }
        END => SpillRecord::End { delta },
        IMPLIED_END => SpillRecord::ImpliedEnd { delta },
        SEGMENT_END => SpillRecord::SegmentEnd { delta },
        _ => return None,
    };
    // (Only a begin has bits above its tag.)
    if first >> 3 != 0 && first & TAG != BEGIN {
        return None;
    }
    Some((rec, n))
}

/// Writes the calls of a spill's [`replay`] that are at least `min_len` long (with their
/// callers, which are as long) to a file of their own, read back by [`replay_kept`].
///
/// Records: a begin (tag, time delta, length, frame, start kind, end kind), an end (tag,
/// time delta). The file is read while it is written ([`Kept`]): each buffer written out
/// is announced to its readers.
pub struct KeptWriter {
    file: Arc<File>,
    /// The records not written yet: `buf[..fill]` (written in place, as the spill's; the
    /// buffer grows from a small one, as [`Reader`]'s: most images keep few calls).
    buf: Vec<u8>,
    fill: usize,
    path: PathBuf,
    /// Bytes written out, and where the readers learn of them.
    written: u64,
    progress: Arc<KeptProgress>,
    finished: bool,
    min_len: u64,
    last_at: u64,
    /// Whether each open call is kept.
    open: Vec<bool>,
}

/// A file of kept calls ([`KeptWriter`]), which [`replay_kept`] reads as it is written;
/// gone when dropped (it has no name since it was created).
pub struct Kept {
    file: Arc<File>,
    path: PathBuf,
    progress: Arc<KeptProgress>,
}

/// How far a kept-calls file is written, and whether its writer is done.
#[derive(Default)]
struct KeptProgress {
    state: std::sync::Mutex<(u64, KeptState)>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
enum KeptState {
    #[default]
    Writing,
    Complete,
    /// Stopped before the end, and why.
    Stopped(String),
}

impl KeptProgress {
    fn set(&self, written: u64, state: KeptState) {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *s = (written, state);
        self.changed.notify_all();
    }

    /// The bytes written, once there are more than `pos` or the writer is done (whether
    /// it finished or stopped before: [`Self::stopped`]).
    fn beyond(&self, pos: u64) -> u64 {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            match &s.1 {
                KeptState::Writing if s.0 <= pos => {
                    s = self
                        .changed
                        .wait(s)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                _ => return s.0,
            }
        }
    }

    /// Why the writer stopped before the end, if it did.
    fn stopped(&self) -> Option<String> {
        match &self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
        {
            KeptState::Stopped(why) => Some(why.clone()),
            _ => None,
        }
    }
}

impl KeptWriter {
    /// A writer of a new file `path` (unlinked at once), and the file as its readers read
    /// it.
    pub fn create(path: &Path, min_len: u64) -> io::Result<(Self, Kept)> {
        let file = Arc::new(unlinked_file(path)?);
        let progress = Arc::new(KeptProgress::default());
        let kept = Kept {
            file: file.clone(),
            path: path.to_path_buf(),
            progress: progress.clone(),
        };
        let w = KeptWriter {
            file,
            buf: vec![0; FIRST_READ + MAX_RECORD],
            fill: 0,
            path: path.to_path_buf(),
            written: 0,
            progress,
            finished: false,
            min_len,
            last_at: 0,
            open: Vec::new(),
        };
        Ok((w, kept))
    }

    /// The time from the last record to `at`, which becomes the last.
    #[inline(always)]
    fn delta(&mut self, at: u64) -> u64 {
        let d = at.saturating_sub(self.last_at);
        self.last_at = self.last_at.max(at);
        d
    }

    /// The next edge of the replay.
    #[inline]
    pub fn edge(&mut self, e: &Edge) -> io::Result<()> {
        match *e {
            Edge::Begin {
                at,
                len,
                frame,
                start,
                end,
            } => {
                let kept = len >= self.min_len;
                self.open.push(kept);
                if !kept {
                    return Ok(());
                }
                let d = self.delta(at);
                let Some(w) = self.buf.get_mut(self.fill..self.fill + MAX_RECORD) else {
                    return Err(io::Error::other("a kept-calls record overflowed"));
                };
                let mut n = 0;
                put_byte(w, &mut n, BEGIN);
                put_at(w, &mut n, d);
                put_at(w, &mut n, len);
                put_at(w, &mut n, u64::from(frame));
                put_byte(w, &mut n, start_code(start));
                put_byte(w, &mut n, end_code(end));
                self.fill += n;
            }
            Edge::End { at, .. } => {
                if self.open.pop() != Some(true) {
                    return Ok(());
                }
                let d = self.delta(at);
                let Some(w) = self.buf.get_mut(self.fill..self.fill + MAX_RECORD) else {
                    return Err(io::Error::other("a kept-calls record overflowed"));
                };
                let mut n = 0;
                put_byte(w, &mut n, END);
                put_at(w, &mut n, d);
                self.fill += n;
            }
        }
        if self.fill + MAX_RECORD > self.buf.len() {
            self.flush_buf()?;
        }
        Ok(())
    }

    /// Writes the buffered records out (the buffer doubling, up to [`BUFFER`]) and tells
    /// the readers.
    fn flush_buf(&mut self) -> io::Result<()> {
        self.file
            .write_all_at(self.buf.get(..self.fill).unwrap_or(&[]), self.written)?;
        self.written += self.fill as u64;
        self.fill = 0;
        self.progress.set(self.written, KeptState::Writing);
        if self.buf.len() < BUFFER + MAX_RECORD {
            let len = (self.buf.len() * 2).min(BUFFER + MAX_RECORD);
            self.buf.resize(len, 0);
        }
        Ok(())
    }

    /// Writes the rest: the file is complete.
    pub fn finish(mut self) -> io::Result<()> {
        self.flush_buf()?;
        self.finished = true;
        self.progress.set(self.written, KeptState::Complete);
        Ok(())
    }
}

impl Drop for KeptWriter {
    fn drop(&mut self) {
        // Dropped before `finish` (an error writing, or the replay's): its readers stop
        // with an error rather than wait.
        if !self.finished {
            self.progress.set(
                self.written,
                KeptState::Stopped(format!(
                    "{}: the Perfetto writer stopped before it had kept every call",
                    self.path.display()
                )),
            );
        }
    }
}

/// A kept-calls file read while it is written: a read waits for bytes its writer has
/// not written out yet, and ends where the writer finished.
struct GrowingFile {
    file: At,
    progress: Arc<KeptProgress>,
}

impl Read for GrowingFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let written = self.progress.beyond(self.file.pos);
        let n = usize::try_from(written.saturating_sub(self.file.pos))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let k = self.file.read(buf.get_mut(..n).unwrap_or(&mut []))?;
        if k == 0 {
            return Err(io::Error::other("kept-calls file shorter than written"));
        }
        Ok(k)
    }
}

/// Reads a [`KeptWriter`]'s file back while it is written (waiting for what is not yet):
/// its begins and ends, as [`replay`] gave them.
pub fn replay_kept(kept: &Kept, mut f: impl FnMut(Edge) -> io::Result<()>) -> io::Result<()> {
    let mut r = Reader::new(GrowingFile {
        file: At {
            file: kept.file.clone(),
            pos: 0,
        },
        progress: kept.progress.clone(),
    });
    let mut at = 0u64;
    let mut open: Vec<u32> = Vec::new();
    while r.fill()? {
        let (rec, used) = kept_record(r.available())
            .ok_or_else(|| damaged(&kept.path, "kept-calls file cut short or damaged"))?;
        r.consume(used);
        match rec {
            KeptRecord::Begin {
                delta,
                len,
                frame,
                start,
                end,
            } => {
                at += delta;
                let frame = u32::try_from(frame)
                    .map_err(|_| damaged(&kept.path, "bad frame in kept-calls file"))?;
                let (start, end) = (start_kind(start), end_kind(end));
                open.push(frame);
                f(Edge::Begin {
                    at,
                    len,
                    frame,
                    start,
                    end,
                })?;
            }
            KeptRecord::End { delta } => {
                at += delta;
                let frame = open
                    .pop()
                    .ok_or_else(|| damaged(&kept.path, "an end without its begin"))?;
                f(Edge::End { at, frame })?;
            }
        }
    }
    // (Every call written was read: a writer that stopped before the end says why.)
    if let Some(why) = kept.progress.stopped() {
        return Err(io::Error::other(why));
    }
    Ok(())
}

/// A record of a kept-calls file as [`KeptWriter`] wrote it (kinds by their codes).
enum KeptRecord {
    Begin {
        delta: u64,
        len: u64,
        frame: u64,
        start: u8,
        end: u8,
    },
    End {
        delta: u64,
    },
}

/// The kept-calls record at the start of `b` and its bytes; `None` when `b` ends within
/// it or it is no record.
#[inline(always)]
fn kept_record(b: &[u8]) -> Option<(KeptRecord, usize)> {
    let mut n = 1;
    let delta = leb128::read(b, &mut n)?;
    let rec = match *b.first()? {
        BEGIN => {
            let len = leb128::read(b, &mut n)?;
            let frame = leb128::read(b, &mut n)?;
            let [start, end] = *b.get(n..n + 2)? else {
                return None;
            };
            n += 2;
            KeptRecord::Begin {
                delta,
                len,
                frame,
                start,
                end,
            }
        }
        END => KeptRecord::End { delta },
        _ => return None,
    };
    Some((rec, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frame ids that are the span address's low bits, every frame the same cost.
    struct AddrIds;
    impl FrameIds for AddrIds {
        fn frame(&mut self, addr: u64, _: bool) -> (u32, u64, u32) {
            (addr as u32, 100, 1)
        }
    }

    /// The recent frames in front of [`FrameIds`] give what it gives: an address and its
    /// inline key apart, two addresses of one slot taking turns (each asked of `FrameIds`
    /// again), a kernel address (bit 63 set) apart; a hit asks nothing.
    #[test]
    fn recent_frames_are_the_frame_ids_own() {
        #[derive(Default)]
        struct Ids(Vec<(u64, bool)>);
        impl FrameIds for Ids {
            fn frame(&mut self, addr: u64, inlined: bool) -> (u32, u64, u32) {
                self.0.push((addr, inlined));
                let id = (addr % 1_000_003) as u32 * 2 + u32::from(inlined);
                (id, addr / 7, 1 + u32::from(inlined))
            }
        }
        let expected = |addr: u64, inlined: bool| {
            let id = (addr % 1_000_003) as u32 * 2 + u32::from(inlined);
            (id, addr / 7, 1 + u32::from(inlined))
        };
        let dir = std::env::temp_dir().join(format!("pttrace-recent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut ids, mut costs) = (Ids::default(), Costs::default());
        let mut sink = SpillSink::create(&dir.join("spill"), &mut ids, &mut costs).unwrap();
        let a = 0x40_1000u64;
        let b = (a + 1..)
            .find(|&b| recent_slot(b) == recent_slot(a))
            .unwrap();
        let kernel = a | 1 << 63;
        let asks = [
            (a, false),
            (a, true),
            (a, false),
            (b, false),
            (a, false),
            (b, false),
            (b, false),
            (kernel, false),
            (a, true),
        ];
        for &(addr, inlined) in &asks {
            assert_eq!(
                sink.frame(addr, inlined),
                expected(addr, inlined),
                "{addr:#x} {inlined}"
            );
        }
        drop(sink);
        // Asked of the frame ids: the first time, and again after the other address of
        // the slot took it (the inline key has a slot of its own).
        assert_eq!(
            ids.0,
            [
                (a, false),
                (a, true),
                (b, false),
                (a, false),
                (b, false),
                (kernel, false),
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Span lengths around 2^32 instructions (a patch field holds 32 bits; longer ones
    /// are kept apart) come back exact, whether the span's begin is still in the buffer
    /// when it ends or already in the file (more than a buffer of records in between).
    #[test]
    fn spans_of_any_length_come_back_exact() {
        let dir = std::env::temp_dir().join(format!("pttrace-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut ids, mut costs) = (AddrIds, Costs::default());
        let mut sink = SpillSink::create(&dir.join("spill"), &mut ids, &mut costs).unwrap();
        let long = 1u64 << 32;
        let mut want = Vec::new();
        let begin = |sink: &mut SpillSink<'_, AddrIds>, want: &mut Vec<Edge>, at, frame, len| {
            sink.begin(at, u64::from(frame), SpanStart::Call);
            want.push(Edge::Begin {
                at,
                len,
                frame,
                start: SpanStart::Call,
                end: SpanEnd::Return,
            });
        };
        // main: around everything (its length set below), its begin flushed to the file
        // before it ends.
        begin(&mut sink, &mut want, 0, 1, 0);
        let mut at = 1u64;
        for k in 0..120_000u32 {
            begin(&mut sink, &mut want, at, 2 + k % 5, 3);
            sink.end(at + 3, SpanEnd::Return);
            want.push(Edge::End {
                at: at + 3,
                frame: 2 + k % 5,
            });
            at += 5;
        }
        // Ends 31 and 32 instructions after the record before (an end of one byte, and
        // the first delta that needs its own).
        for (k, len) in [31u64, 32].into_iter().enumerate() {
            begin(&mut sink, &mut want, at, 20 + k as u32, len);
            sink.end(at + len, SpanEnd::Return);
            want.push(Edge::End {
                at: at + len,
                frame: 20 + k as u32,
            });
            at += len;
        }
        // In the buffer: one of 2^32 - 1 instructions (a patch field's largest), then one
        // of 2^32.
        begin(&mut sink, &mut want, at, 10, long - 1);
        sink.end(at + long - 1, SpanEnd::Return);
        want.push(Edge::End {
            at: at + long - 1,
            frame: 10,
        });
        let second = at + long;
        begin(&mut sink, &mut want, second, 11, long);
        sink.end(second + long, SpanEnd::Return);
        want.push(Edge::End {
            at: second + long,
            frame: 11,
        });
        let end = second + long + 1;
        sink.end(end, SpanEnd::Return);
        if let Some(Edge::Begin { len, .. }) = want.first_mut() {
            *len = end;
        }
        want.push(Edge::End { at: end, frame: 1 });
        sink.segment_end(end);
        let spill = sink.finish().unwrap();
        assert_eq!(spill.0.long.len(), 2, "main and the span of 2^32");
        let mut got = Vec::new();
        replay(&spill, None, |e| {
            got.push(e);
            Ok(())
        })
        .unwrap();
        assert_eq!(got.len(), want.len());
        assert_eq!(got, want);
        // Records: a begin's first byte has its start kind above the tag; an end of a
        // short delta is one byte; a byte with bits above another tag is damage.
        assert!(matches!(
            spill_record(&[BEGIN | 2 << 3, 7, 9, 1, 3, 0, 0, 0]),
            Some((
                SpillRecord::Begin {
                    delta: 7,
                    frame: 9,
                    start: 2,
                    end: 1,
                    len: 3
                },
                8
            ))
        ));
        assert!(matches!(
            spill_record(&[END_SHORT | 31 << 3]),
            Some((SpillRecord::End { delta: 31 }, 1))
        ));
        assert!(matches!(
            spill_record(&[END, 32]),
            Some((SpillRecord::End { delta: 32 }, 2))
        ));
        assert!(spill_record(&[END | 1 << 3, 32]).is_none());
        assert!(spill_record(&[6, 0]).is_none());
        drop(spill);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A spill of random nested calls (with implied callers and segments), filtered at
    /// several lengths: the kept file gives exactly the replay's edges of the calls at
    /// least that long, in order, and each of their callers is kept too.
    #[test]
    fn kept_calls_are_the_replays_calls_at_least_that_long() {
        let dir = std::env::temp_dir().join(format!("pttrace-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut ids, mut costs) = (AddrIds, Costs::default());
        let mut sink = SpillSink::create(&dir.join("spill"), &mut ids, &mut costs).unwrap();
        // (Read through the open file: whatever ends `view`, nothing is left behind.)
        assert!(
            !dir.join("spill").exists(),
            "the spill has no name once created"
        );
        // A small deterministic generator (xorshift).
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut at, mut depth) = (0u64, 0usize);
        for seg in 0..3u64 {
            sink.implied_caller(at, 900 + seg);
            sink.implied_caller(at, 950 + seg);
            for _ in 0..20_000 {
                at += next(5);
                match next(3) {
                    0 if depth < 40 => {
                        let kind = [SpanStart::Call, SpanStart::Inlined, SpanStart::TailCall]
                            [next(3) as usize];
                        sink.begin(at, next(50), kind);
                        depth += 1;
                    }
                    1 if depth > 0 => {
                        sink.end(at, SpanEnd::Return);
                        depth -= 1;
                    }
                    // A return from an implied caller, now and then.
                    2 if depth == 0 && next(2000) == 0 => sink.end(at, SpanEnd::Return),
                    _ => {}
                }
            }
            // Every span is closed at a segment's end, the implied callers last.
            for _ in 0..depth + 2 {
                at += 1;
                sink.end(at, SpanEnd::Gap);
            }
            sink.segment_end(at);
            depth = 0;
        }
        let spill = sink.finish().unwrap();
        let mut all = Vec::new();
        replay(&spill, None, |e| {
            all.push(e);
            Ok(())
        })
        .unwrap();
        assert!(all.len() > 20_000, "{} edges", all.len());
        let implied = all
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Edge::Begin {
                        start: SpanStart::Implied,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(implied, 6, "the implied callers are replayed");
        for min_len in [0, 1, 7, 30, 200, 5_000, u64::MAX] {
            let path = dir.join(format!("kept-{min_len}"));
            let (mut w, kept) = KeptWriter::create(&path, min_len).unwrap();
            assert!(!path.exists(), "the kept file has no name once created");
            for e in &all {
                w.edge(e).unwrap();
            }
            w.finish().unwrap();
            let expected = kept_of(&all, min_len);
            if min_len == 0 {
                assert_eq!(expected, all);
            }
            let mut got = Vec::new();
            replay_kept(&kept, |e| {
                got.push(e);
                Ok(())
            })
            .unwrap();
            assert_eq!(got, expected, "min_len {min_len}");
        }
        drop(spill);
        let _ = std::fs::remove_dir_all(&dir);
    }
    /// What a kept-calls filter of `min_len` keeps of `all`: the begins at least that
    /// long and their ends (a kept call's callers are kept: they are at least as long).
    fn kept_of(all: &[Edge], min_len: u64) -> Vec<Edge> {
        let mut open = Vec::new();
        let mut kept = Vec::new();
        for e in all {
            match e {
                Edge::Begin { len, .. } => {
                    open.push(*len >= min_len);
                    if *len >= min_len {
                        assert!(open.iter().all(|&k| k), "a kept call's callers are kept");
                        kept.push(*e);
                    }
                }
                Edge::End { .. } => {
                    if open.pop() == Some(true) {
                        kept.push(*e);
                    }
                }
            }
        }
        kept
    }

    /// `n` calls of lengths that vary, one after the other, each with an inlined callee.
    fn nested_edges(n: u64) -> Vec<Edge> {
        let mut v = Vec::new();
        let mut at = 0u64;
        for i in 0..n {
            let outer = at;
            let len = 40 + i % 50;
            v.push(Edge::Begin {
                at,
                len,
                frame: (i % 7) as u32,
                start: SpanStart::Call,
                end: if i % 11 == 0 {
                    SpanEnd::Unwound
                } else {
                    SpanEnd::Return
                },
            });
            let inner_len = i % 9;
            v.push(Edge::Begin {
                at: at + 3,
                len: inner_len,
                frame: 100 + (i % 5) as u32,
                start: SpanStart::Inlined,
                end: SpanEnd::Inlined,
            });
            v.push(Edge::End {
                at: at + 3 + inner_len,
                frame: 100 + (i % 5) as u32,
            });
            at = outer + len;
            v.push(Edge::End {
                at,
                frame: (i % 7) as u32,
            });
        }
        v
    }

    /// A kept-calls file read while it is written: the reader, started before anything is
    /// written, gets exactly what the writer keeps, in order, however the writes and reads
    /// interleave (the writer pausing between buffers; a reader slower than it).
    #[test]
    fn kept_calls_are_read_while_they_are_written() {
        let dir = std::env::temp_dir().join(format!("pttrace-growing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let all = nested_edges(60_000);
        for (min_len, slow_reader) in [(0, false), (5, true), (45, false)] {
            let path = dir.join(format!("kept-{min_len}"));
            let (mut w, kept) = KeptWriter::create(&path, min_len).unwrap();
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                replay_kept(&kept, |e| {
                    if slow_reader && got.len() % 20_000 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    got.push(e);
                    Ok(())
                })
                .map(|()| got)
            });
            for (k, e) in all.iter().enumerate() {
                w.edge(e).unwrap();
                if k % 50_000 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
            w.finish().unwrap();
            let got = reader.join().unwrap().unwrap();
            let expected = kept_of(&all, min_len);
            assert!(expected.len() > 1000, "{}", expected.len());
            assert_eq!(got, expected, "min_len {min_len}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A writer that stops before the end (dropped: an error while it wrote) makes its
    /// reader fail, naming the file, instead of waiting for the rest, once it has read the
    /// calls written out before.
    #[test]
    fn a_kept_calls_writer_that_stops_makes_its_reader_fail() {
        let dir = std::env::temp_dir().join(format!("pttrace-stopped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let all = nested_edges(60_000);
        let path = dir.join("kept");
        let (mut w, kept) = KeptWriter::create(&path, 0).unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let r = replay_kept(&kept, |e| {
                got.push(e);
                Ok(())
            });
            (got, r)
        });
        let half = all.len() / 2;
        for e in &all[..half] {
            w.edge(e).unwrap();
        }
        // (What it buffered goes out first, as an error writing the next would find it.)
        w.flush_buf().unwrap();
        drop(w);
        let (got, r) = reader.join().unwrap();
        let err = r.unwrap_err().to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("stopped"),
            "{err}"
        );
        assert_eq!(got.len(), half);
        assert_eq!(got[..], all[..half]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
