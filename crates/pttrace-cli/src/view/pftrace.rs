//! `timeline.pftrace`: the timeline in Perfetto's own trace format (a `Trace` of
//! `TracePacket`s, field numbers from Perfetto's published protos under
//! `protos/perfetto/trace/`), which the Perfetto UI opens at sizes where JSON fails.
//!
//! - Track descriptors first (sequence 1): one process track per pid (named by the command
//!   lines of its images), one thread track per thread (`ThreadDescriptor`, named as in the
//!   JSON), and one track per thread for its windows (a child of the process track).
//! - Then one packet sequence per thread image: its first packet clears the incremental
//!   state, sets the packet defaults (the thread's track, the sequence's clock 64) and
//!   defines clock 64 as incremental (`ClockSnapshot`): every later timestamp is a delta
//!   from the packet before, a byte or two for most calls.
//! - Calls are `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pairs; their names and categories are
//!   interned (`InternedData` in the packet that first uses one), so a call costs its two
//!   packets of ~10-14 bytes each.
//! - Windows are slices on the windows track, gaps and losses instant events saying what was
//!   lost.
//! - Packets go out in batches of [`BATCH`] bytes as `compressed_packets` (zlib deflate,
//!   which Perfetto inflates): a call then takes a few bytes.
//!
//! Timestamps are nanoseconds: on the instruction axis one instruction counts as 1 ns (the
//! window track's name and the process track say so).
//!
//! Written by hand (a few varints and length prefixes): the output uses ten message types,
//! writing only, and a protobuf crate would add a build step for `.proto` files or
//! hand-kept structs of the same size.

use std::collections::HashMap;
use std::io::{self, Write};

use pttrace_format::leb128;

use super::varint::{put_at, put_byte};

/// A protobuf message being built.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, v: u64) {
        leb128::push(&mut self.0, v);
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }
    fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        self.key(field, 0);
        self.varint(v);
        self
    }
    fn int(&mut self, field: u32, v: i64) -> &mut Self {
        // int32/int64: two's complement as a varint.
        self.uint(field, v as u64)
    }
    fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn string(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }
    fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

/// Bytes an event's packet may take: its framing, the timestamp's key and delta, the
/// sequence's fields and the track event's key (written as the 16 bytes of
/// [`Sequence::fields`]), the track event's length and its three fields.
const EVENT_ROOM: usize = 2 + 11 + 16 + 1 + 2 + 2 * 11;

/// Packets not compressed yet: `buf[..fill]`. The buffer is kept at its full size, so that
/// an event's packet is written into it in place ([`Batch::room`]).
struct Batch {
    buf: Vec<u8>,
    fill: usize,
}

impl Batch {
    fn new() -> Self {
        Batch {
            buf: vec![0; BATCH + EVENT_ROOM + 4096],
            fill: 0,
        }
    }

    /// The room after the packets, for one event's packet.
    #[inline(always)]
    fn room(&mut self) -> Option<&mut [u8]> {
        let at = self.fill;
        self.buf.get_mut(at..at + EVENT_ROOM)
    }

    /// Appends `bytes` (a whole packet).
    fn append(&mut self, bytes: &[u8]) {
        let end = self.fill + bytes.len();
        if self.buf.len() < end + EVENT_ROOM {
            self.buf.resize(end + EVENT_ROOM, 0);
        }
        if let Some(to) = self.buf.get_mut(self.fill..end) {
            to.copy_from_slice(bytes);
        }
        self.fill = end;
    }

    /// The packets, the batch starting over (in `reuse`, a buffer the compressor is done
    /// with, when there is one: its bytes need not be zeroed again).
    fn take(&mut self, reuse: Option<Vec<u8>>) -> Vec<u8> {
        let next = match reuse {
            Some(mut buf) => {
                buf.resize(BATCH + EVENT_ROOM + 4096, 0);
                Batch { buf, fill: 0 }
            }
            None => Batch::new(),
        };
        let mut full = std::mem::replace(self, next);
        full.buf.truncate(full.fill);
        full.buf
    }
}

// TracePacket fields.
const TP_TIMESTAMP: u32 = 8;
const TP_SEQUENCE_ID: u32 = 10;
const TP_TRACK_EVENT: u32 = 11;
const TP_INTERNED_DATA: u32 = 12;
const TP_SEQUENCE_FLAGS: u32 = 13;
const TP_CLOCK_SNAPSHOT: u32 = 6;
const TP_DEFAULTS: u32 = 59;
const TP_TRACK_DESCRIPTOR: u32 = 60;
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
// TrackEvent.
const TE_CATEGORY_IIDS: u32 = 3;
const TE_TYPE: u32 = 9;
const TE_NAME_IID: u32 = 10;
const TYPE_SLICE_BEGIN: u64 = 1;
const TYPE_SLICE_END: u64 = 2;
const TYPE_INSTANT: u64 = 3;
/// The sequence-scoped clock of every event sequence (ids 64..128 are per sequence).
const CLOCK_ID: u64 = 64;
const BOOTTIME: u64 = 6;

/// A track: process, thread, or a named child track.
pub enum Track<'a> {
    Process { pid: i32, name: &'a str },
    Thread { pid: i32, tid: i32, name: &'a str },
    Named { parent: u64, name: &'a str },
}

/// Uncompressed packet bytes per `compressed_packets` batch (Perfetto wants each such packet
/// under 512 KiB; deflate never makes 256 KiB larger than that).
pub const BATCH: usize = 256 << 10;
const TP_COMPRESSED_PACKETS: u32 = 50;
/// Batches handed to the compressor at a time: each hand-over may wake its thread, which
/// costs tens of microseconds on a virtual machine (node's 1.4 G-instruction trace makes
/// 2,900 batches).
const GROUP: usize = 4;

/// Compresses batches and writes them to the output, on a thread of its own.
type Compressor<W> = std::thread::JoinHandle<io::Result<(W, u64)>>;

/// Writes packets into a `Trace` stream.
pub struct Writer<W: Write + Send + 'static> {
    next_sequence: u64,
    /// Framed packets not compressed yet.
    batch: Batch,
    /// Full batches go to the compressor through this, [`GROUP`] at a time.
    to_compressor: Option<std::sync::mpsc::SyncSender<Vec<Vec<u8>>>>,
    /// Full batches not handed over yet.
    group: Vec<Vec<u8>>,
    /// And come back through this once compressed.
    from_compressor: std::sync::mpsc::Receiver<Vec<u8>>,
    compressor: Option<Compressor<W>>,
    /// Packets written.
    pub packets: u64,
    /// Their bytes before compression.
    packet_bytes: u64,
    /// The interned data of `event`'s packet (its buffer kept between calls).
    interned: Msg,
}

/// deflate's level for `compressed_packets`. A call's packets differ little from the last
/// call's, which the fast levels find too: on a python start-up trace (23 M calls), level
/// 2 writes 1.6 bytes a call in a sixth of level 6's time (0.9 bytes a call), which made
/// the compressing thread the slowest of `view`'s writers. Level 1 (zlib-rs's quick
/// deflate, fixed codes) takes a third less time again: on python threads (121 M calls),
/// 1.42 bytes a call against level 2's 1.04, the compressing thread's CPU time 2,100 →
/// 1,360 samples of `perf record` (the view shares 2 cores: what a writer saves, the rest
/// gets).
const LEVEL: u32 = 1;

/// The compressor's loop: each batch becomes one `compressed_packets` packet, compressed
/// by one deflate state reset between batches.
fn compress_batches(
    mut out: impl Write,
    groups: std::sync::mpsc::Receiver<Vec<Vec<u8>>>,
    done: std::sync::mpsc::SyncSender<Vec<u8>>,
) -> io::Result<u64> {
    let mut bytes = 0u64;
    let mut z = flate2::Compress::new(flate2::Compression::new(LEVEL), true);
    let mut deflated: Vec<u8> = Vec::new();
    let mut framed = Msg::default();
    for batch in groups.into_iter().flatten() {
        z.reset();
        deflated.clear();
        // zlib's bound for one deflate call: the input, 5 bytes per 16 KiB block, header.
        deflated.reserve(batch.len() + batch.len() / 1000 + 64);
        let status = z
            .compress_vec(&batch, &mut deflated, flate2::FlushCompress::Finish)
            .map_err(io::Error::other)?;
        if status != flate2::Status::StreamEnd {
            return Err(io::Error::other("deflate did not finish a batch"));
        }
        framed.0.clear();
        // Trace.packet { compressed_packets }
        framed.key(1, 2);
        let field = varint_len(u64::from(TP_COMPRESSED_PACKETS) << 3);
        framed.varint((field + varint_len(deflated.len() as u64) + deflated.len()) as u64);
        framed.bytes(TP_COMPRESSED_PACKETS, &deflated);
        bytes += framed.0.len() as u64;
        out.write_all(&framed.0)?;
        // (The writer takes it back when it wants one; else it goes.)
        let _ = done.try_send(batch);
    }
    out.flush()?;
    Ok(bytes)
}

impl<W: Write + Send + 'static> Writer<W> {
    pub fn new(out: W) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Vec<u8>>>(2);
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2 * GROUP);
        let compressor = std::thread::Builder::new()
            .name("pf-deflate".into())
            .spawn(move || {
                let mut out = out;
                let bytes = compress_batches(&mut out, rx, done_tx)?;
                Ok((out, bytes))
            })?;
        Ok(Writer {
            next_sequence: 2,
            batch: Batch::new(),
            to_compressor: Some(tx),
            group: Vec::with_capacity(GROUP),
            from_compressor: done_rx,
            compressor: Some(compressor),
            packets: 0,
            packet_bytes: 0,
            interned: Msg::default(),
        })
    }

    /// The compressor's error, once it has stopped.
    fn compressor_error(&mut self) -> io::Error {
        self.to_compressor = None;
        match self.compressor.take().map(std::thread::JoinHandle::join) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => io::Error::other("the compressing thread panicked"),
            _ => io::Error::other("the compressing thread stopped"),
        }
    }

    fn packet(&mut self, p: &Msg) -> io::Result<()> {
        let mut framed = Msg::default();
        framed.msg(1, p); // Trace.packet
        self.batch.append(&framed.0);
        self.packets += 1;
        if self.batch.fill >= BATCH {
            self.flush_batch(false)?;
        }
        Ok(())
    }

    /// Ends the batch (one `compressed_packets` packet), handed to the compressor with
    /// the next ones (all of them when `last`).
    fn flush_batch(&mut self, last: bool) -> io::Result<()> {
        if self.batch.fill > 0 {
            self.packet_bytes += self.batch.fill as u64;
            let batch = self.batch.take(self.from_compressor.try_recv().ok());
            self.group.push(batch);
        }
        if self.group.is_empty() || (self.group.len() < GROUP && !last) {
            return Ok(());
        }
        let group = std::mem::replace(&mut self.group, Vec::with_capacity(GROUP));
        let sent = self.to_compressor.as_ref().map(|tx| tx.send(group));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(self.compressor_error()),
        }
    }

    /// Describes a track (uuid `uuid`).
    pub fn track(&mut self, uuid: u64, t: Track<'_>) -> io::Result<()> {
        let mut d = Msg::default();
        d.uint(1, uuid);
        match t {
            Track::Process { pid, name } => {
                let mut p = Msg::default();
                p.int(1, i64::from(pid)).string(6, name);
                d.msg(3, &p);
            }
            Track::Thread { pid, tid, name } => {
                let mut th = Msg::default();
                th.int(1, i64::from(pid))
                    .int(2, i64::from(tid))
                    .string(5, name);
                d.msg(4, &th);
            }
            Track::Named { parent, name } => {
                d.string(2, name).uint(5, parent);
            }
        }
        let mut p = Msg::default();
        p.uint(TP_SEQUENCE_ID, 1).msg(TP_TRACK_DESCRIPTOR, &d);
        self.packet(&p)
    }

    /// Starts the packet sequence of one thread image whose events go on `track` by
    /// default, its clock starting at `t0` (ns).
    pub fn sequence(&mut self, track: u64, t0: u64) -> io::Result<Sequence> {
        let id = self.next_sequence;
        self.next_sequence += 1;
        let mut te_defaults = Msg::default();
        te_defaults.uint(11, track); // TrackEventDefaults.track_uuid
        let mut defaults = Msg::default();
        defaults.uint(58, CLOCK_ID).msg(11, &te_defaults);
        let mut incremental = Msg::default();
        incremental.uint(1, CLOCK_ID).uint(2, t0).uint(3, 1);
        let mut boot = Msg::default();
        boot.uint(1, BOOTTIME).uint(2, t0);
        let mut snap = Msg::default();
        snap.msg(1, &incremental).msg(1, &boot);
        let mut p = Msg::default();
        p.uint(TP_SEQUENCE_ID, id)
            .uint(TP_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED)
            .msg(TP_DEFAULTS, &defaults)
            .msg(TP_CLOCK_SNAPSHOT, &snap);
        self.packet(&p)?;
        // (At most 12 bytes: keys of one byte, a sequence id of up to ten.) No sequence
        // flags: SEQ_NEEDS_INCREMENTAL_STATE only tells a reader to skip the packet while
        // the sequence's incremental state is not valid (after lost packets: Perfetto's
        // trace_processor, `ProtoTraceReader::ParsePacket`); the state here is valid from
        // the sequence's first packet on, which clears it. (2 bytes in each event.)
        let mut fields = [0u8; 16];
        let mut fields_len = 0;
        put_at(&mut fields, &mut fields_len, u64::from(TP_SEQUENCE_ID) << 3);
        put_at(&mut fields, &mut fields_len, id);
        put_at(
            &mut fields,
            &mut fields_len,
            u64::from(TP_TRACK_EVENT) << 3 | 2,
        );
        Ok(Sequence {
            last_ts: t0,
            fields,
            fields_len,
            names: Interned::default(),
            categories: Interned::default(),
        })
    }

    /// One event of `seq` at `ts` (ns, not before the sequence's previous event), on the
    /// sequence's track.
    // (Inlined: its event stays in registers; passed in memory, the caller's separate
    // stores of its fields were read back as a whole, a stall per event.)
    #[inline(always)]
    pub fn event(&mut self, seq: &mut Sequence, e: Event<'_>) -> io::Result<()> {
        let (ty, named, ts) = match e {
            Event::Begin { ts, name, category } => (TYPE_SLICE_BEGIN, Some((name, category)), ts),
            Event::End { ts } => (TYPE_SLICE_END, None, ts),
            Event::Instant { ts, name, category } => (TYPE_INSTANT, Some((name, category)), ts),
        };
        let iids = named.map(|(name, category)| {
            // InternedData.event_categories, InternedData.event_names.
            let cat = seq.categories.iid(category, 1, &mut self.interned);
            (cat, seq.names.iid(name, 2, &mut self.interned))
        });
        let delta = ts.saturating_sub(seq.last_ts);
        seq.last_ts = seq.last_ts.max(ts);
        // The packet, written in place: its two framing bytes (Trace.packet, its length,
        // set after), then its fields, through a cursor held in a register (pushed one by
        // one, each byte's store made the vector's length be read back from memory).
        // (Its body, when the packet must be framed again with interned data after it.)
        let (n, reframe) = {
            let Some(w) = self.batch.room() else {
                return Err(io::Error::other("a Perfetto batch overflowed"));
            };
            let mut n = 2usize;
            put_byte(w, &mut n, (TP_TIMESTAMP << 3) as u8);
            put_at(w, &mut n, delta);
            if let Some(to) = w.get_mut(n..n + seq.fields.len()) {
                to.copy_from_slice(&seq.fields);
            }
            n += seq.fields_len;
            // The track event's length (under 128: one byte), set once its fields are in.
            let te_at = n;
            n += 1;
            put_byte(w, &mut n, (TE_TYPE << 3) as u8);
            put_byte(w, &mut n, ty as u8);
            if let Some((cat, name)) = iids {
                put_byte(w, &mut n, (TE_CATEGORY_IIDS << 3) as u8);
                put_at(w, &mut n, cat);
                put_byte(w, &mut n, (TE_NAME_IID << 3) as u8);
                put_at(w, &mut n, name);
            }
            if let Some(len) = w.get_mut(te_at) {
                *len = (n - te_at - 1) as u8;
            }
            let body_len = n - 2;
            if self.interned.0.is_empty() && body_len < 0x80 {
                if let Some([tag, len]) = w.get_mut(..2) {
                    *tag = 0x0a;
                    *len = body_len as u8;
                }
                (n, None)
            } else {
                (n, Some(w.get(2..n).unwrap_or(&[]).to_vec()))
            }
        };
        match reframe {
            None => self.batch.fill += n,
            Some(body) => {
                // With the interned data the packet's first use of a name or category adds.
                let field = varint_len(u64::from(TP_INTERNED_DATA) << 3);
                let extra =
                    field + varint_len(self.interned.0.len() as u64) + self.interned.0.len();
                let mut b = Msg::default();
                b.key(1, 2);
                b.varint((body.len() + extra) as u64);
                b.0.extend_from_slice(&body);
                b.msg(TP_INTERNED_DATA, &self.interned);
                self.batch.append(&b.0);
                self.interned.0.clear();
            }
        }
        self.packets += 1;
        if self.batch.fill >= BATCH {
            self.flush_batch(false)?;
        }
        Ok(())
    }

    /// Writes what is left; the sizes of what was written.
    pub fn finish(mut self) -> io::Result<Size> {
        self.flush_batch(true)?;
        self.to_compressor = None;
        match self.compressor.take().map(std::thread::JoinHandle::join) {
            Some(Ok(Ok((_, file)))) => Ok(Size {
                file,
                packets: self.packet_bytes,
            }),
            Some(Ok(Err(e))) => Err(e),
            _ => Err(io::Error::other("the compressing thread panicked")),
        }
    }
}

/// What a `Trace` stream took: the bytes written, and its packets' bytes before they were
/// compressed (what a reader inflates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub file: u64,
    pub packets: u64,
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A name or category, with a key that stands for its text in its sequence (so that
/// interning it costs no hashing of the text), or none.
#[derive(Clone, Copy)]
pub struct Named<'a> {
    pub key: Option<u32>,
    pub text: &'a str,
}

impl<'a> Named<'a> {
    /// A text that stands for itself (interned by hashing it).
    pub fn text(text: &'a str) -> Self {
        Named { key: None, text }
    }

    /// A text with its key in the sequence.
    pub fn keyed(key: u32, text: &'a str) -> Self {
        Named {
            key: Some(key),
            text,
        }
    }
}

/// The interned strings of one kind in a sequence.
#[derive(Default)]
pub struct Interned {
    by_key: Vec<u64>,
    by_text: HashMap<String, u64>,
    next: u64,
}

impl Interned {
    /// The iid of `n`; a new one is added to `interned` (as field `field` of
    /// `InternedData`: an `{iid, name}` entry).
    #[inline(always)]
    fn iid(&mut self, n: Named<'_>, field: u32, interned: &mut Msg) -> u64 {
        // (A keyed name met before, nearly every event's: in line.)
        if let Some(&iid) = n.key.and_then(|k| self.by_key.get(k as usize)) {
            if iid != 0 {
                return iid;
            }
        }
        self.iid_new(n, field, interned)
    }

    /// [`Self::iid`] of a name not keyed or new.
    #[cold]
    #[inline(never)]
    fn iid_new(&mut self, n: Named<'_>, field: u32, interned: &mut Msg) -> u64 {
        let slot = match n.key {
            Some(k) => {
                let k = k as usize;
                if self.by_key.len() <= k {
                    self.by_key.resize(k + 1, 0);
                }
                match self.by_key.get(k) {
                    Some(&iid) if iid != 0 => return iid,
                    _ => Some(k),
                }
            }
            None => {
                if let Some(&iid) = self.by_text.get(n.text) {
                    return iid;
                }
                None
            }
        };
        self.next += 1;
        let iid = self.next;
        match slot.and_then(|k| self.by_key.get_mut(k)) {
            Some(e) => *e = iid,
            None => {
                self.by_text.insert(n.text.to_string(), iid);
            }
        }
        let mut m = Msg::default();
        m.uint(1, iid).string(2, n.text);
        interned.msg(field, &m);
        iid
    }
}

/// The state of one packet sequence.
pub struct Sequence {
    last_ts: u64,
    /// The same bytes in each of its event packets after the timestamp: the sequence id
    /// and the track event's key (their length is `fields_len`).
    fields: [u8; 16],
    fields_len: usize,
    names: Interned,
    categories: Interned,
}

/// What [`Writer::event`] writes.
pub enum Event<'a> {
    /// A slice (a call, a window) begins.
    Begin {
        ts: u64,
        name: Named<'a>,
        category: Named<'a>,
    },
    /// The innermost open slice ends.
    End { ts: u64 },
    /// Something that happened at one instant (a gap).
    Instant {
        ts: u64,
        name: Named<'a>,
        category: Named<'a>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's output, kept after the writer is done with it.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn read_varint(b: &[u8], i: &mut usize) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let c = b[*i];
            *i += 1;
            v |= u64::from(c & 0x7f) << shift;
            shift += 7;
            if c < 0x80 {
                return v;
            }
        }
    }

    #[test]
    fn events_are_packets_with_interned_names_and_time_deltas() {
        let out = Shared::default();
        let mut w = Writer::new(out.clone()).unwrap();
        let mut seq = w.sequence(7, 1000).unwrap();
        let f = Named::keyed(5, "f");
        let call = Named::text("call");
        let begin = |ts| Event::Begin {
            ts,
            name: f,
            category: call,
        };
        w.event(&mut seq, begin(1000)).unwrap();
        w.event(&mut seq, begin(1300)).unwrap();
        w.event(&mut seq, Event::End { ts: 1500 }).unwrap();
        let size = w.finish().unwrap();
        let file = out.0.lock().unwrap().clone();
        // One Trace.packet holding compressed_packets (field 50), the whole file.
        let mut i = 0;
        assert_eq!(read_varint(&file, &mut i), 1 << 3 | 2);
        let len = read_varint(&file, &mut i) as usize;
        assert_eq!(i + len, file.len());
        assert_eq!(read_varint(&file, &mut i), 50 << 3 | 2);
        let len = read_varint(&file, &mut i) as usize;
        assert_eq!(i + len, file.len());
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&file[i..]), &mut raw)
            .unwrap();
        // The sequence's first packet, then the three events.
        let mut j = 0;
        assert_eq!(read_varint(&raw, &mut j), 1 << 3 | 2);
        let first = read_varint(&raw, &mut j) as usize;
        let events = &raw[j + first..];
        assert_eq!(
            size,
            Size {
                file: file.len() as u64,
                packets: raw.len() as u64
            }
        );
        #[rustfmt::skip]
        let expected: Vec<u8> = [
            // Begin at delta 0: sequence 2, a track event (slice begin, category iid 1,
            // name iid 1) and the interned category and name.
            &[0x0a, 0x1f, 0x40, 0x00, 0x50, 0x02,
              0x5a, 0x06, 0x48, 0x01, 0x18, 0x01, 0x50, 0x01,
              0x62, 0x11,
              0x0a, 0x08, 0x08, 0x01, 0x12, 0x04][..], b"call",
            &[0x12, 0x05, 0x08, 0x01, 0x12, 0x01], b"f",
            // Begin 300 ns later (varint 0xac 0x02), both names known.
            &[0x0a, 0x0d, 0x40, 0xac, 0x02, 0x50, 0x02,
              0x5a, 0x06, 0x48, 0x01, 0x18, 0x01, 0x50, 0x01],
            // End 200 ns later: a slice end alone.
            &[0x0a, 0x09, 0x40, 0xc8, 0x01, 0x50, 0x02, 0x5a, 0x02, 0x48, 0x02],
        ]
        .concat();
        assert_eq!(events, &expected[..]);
    }

    #[test]
    fn varints_and_fields_are_protobuf_encoded() {
        let mut m = Msg::default();
        m.uint(1, 150);
        assert_eq!(m.0, [0x08, 0x96, 0x01]);
        let mut m = Msg::default();
        m.string(2, "testing");
        assert_eq!(m.0, b"\x12\x07testing");
        let mut m = Msg::default();
        m.int(1, -1);
        assert_eq!(m.0.len(), 11, "negative int64: ten varint bytes");
        let mut inner = Msg::default();
        inner.uint(1, 150);
        let mut outer = Msg::default();
        outer.msg(3, &inner);
        assert_eq!(outer.0, [0x1a, 0x03, 0x08, 0x96, 0x01]);
    }
}
