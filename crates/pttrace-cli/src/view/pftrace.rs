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

/// A protobuf message being built.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
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
const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;
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

/// Writes packets into a `Trace` stream.
pub struct Writer<W: Write> {
    out: W,
    next_sequence: u64,
    /// Framed packets not compressed yet.
    batch: Vec<u8>,
    /// Bytes written to `out`.
    pub bytes: u64,
    /// Packets written.
    pub packets: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Writer {
            out,
            next_sequence: 2,
            batch: Vec::with_capacity(BATCH + 4096),
            bytes: 0,
            packets: 0,
        }
    }

    fn packet(&mut self, p: &Msg) -> io::Result<()> {
        let mut framed = Msg(std::mem::take(&mut self.batch));
        framed.msg(1, p); // Trace.packet
        self.batch = framed.0;
        self.packets += 1;
        if self.batch.len() >= BATCH {
            self.flush_batch()?;
        }
        Ok(())
    }

    /// Writes the batch as one `compressed_packets` packet.
    fn flush_batch(&mut self) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut z = flate2::write::ZlibEncoder::new(
            Vec::with_capacity(self.batch.len() / 4),
            flate2::Compression::default(),
        );
        z.write_all(&self.batch)?;
        self.batch.clear();
        let mut p = Msg::default();
        p.bytes(TP_COMPRESSED_PACKETS, &z.finish()?);
        let mut framed = Msg::default();
        framed.msg(1, &p);
        self.bytes += framed.0.len() as u64;
        self.out.write_all(&framed.0)
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
        Ok(Sequence {
            id,
            last_ts: t0,
            names: HashMap::new(),
            categories: HashMap::new(),
        })
    }

    /// One event of `seq` at `ts` (ns, not before the sequence's previous event), on the
    /// sequence's track.
    pub fn event(&mut self, seq: &mut Sequence, e: Event<'_>) -> io::Result<()> {
        let mut interned = Msg::default();
        let mut te = Msg::default();
        let (ty, named, ts) = match e {
            Event::Begin { ts, name, category } => (TYPE_SLICE_BEGIN, Some((name, category)), ts),
            Event::End { ts } => (TYPE_SLICE_END, None, ts),
            Event::Instant { ts, name, category } => (TYPE_INSTANT, Some((name, category)), ts),
        };
        te.uint(TE_TYPE, ty);
        if let Some((name, category)) = named {
            // InternedData.event_categories, InternedData.event_names.
            let cat = intern(&mut seq.categories, category, 1, &mut interned);
            let name = intern(&mut seq.names, name, 2, &mut interned);
            te.uint(TE_CATEGORY_IIDS, cat).uint(TE_NAME_IID, name);
        }
        let delta = ts.saturating_sub(seq.last_ts);
        seq.last_ts = seq.last_ts.max(ts);
        let mut p = Msg::default();
        p.uint(TP_TIMESTAMP, delta)
            .uint(TP_SEQUENCE_ID, seq.id)
            .uint(TP_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE)
            .msg(TP_TRACK_EVENT, &te);
        if !interned.0.is_empty() {
            p.msg(TP_INTERNED_DATA, &interned);
        }
        self.packet(&p)
    }

    pub fn finish(mut self) -> io::Result<u64> {
        self.flush_batch()?;
        self.out.flush()?;
        Ok(self.bytes)
    }
}

/// The iid of `s` in `table`; a new one is added to `interned` (as field `field` of
/// `InternedData`: an `{iid, name}` entry).
fn intern(table: &mut HashMap<String, u64>, s: &str, field: u32, interned: &mut Msg) -> u64 {
    if let Some(&iid) = table.get(s) {
        return iid;
    }
    let iid = table.len() as u64 + 1;
    table.insert(s.to_string(), iid);
    let mut m = Msg::default();
    m.uint(1, iid).string(2, s);
    interned.msg(field, &m);
    iid
}

/// The state of one packet sequence.
pub struct Sequence {
    id: u64,
    last_ts: u64,
    names: HashMap<String, u64>,
    categories: HashMap<String, u64>,
}

/// What [`Writer::event`] writes.
pub enum Event<'a> {
    /// A slice (a call, a window) begins.
    Begin {
        ts: u64,
        name: &'a str,
        category: &'a str,
    },
    /// The innermost open slice ends.
    End { ts: u64 },
    /// Something that happened at one instant (a gap).
    Instant {
        ts: u64,
        name: &'a str,
        category: &'a str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

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
