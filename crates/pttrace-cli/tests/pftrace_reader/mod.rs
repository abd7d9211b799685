//! A reader of Perfetto trace files that follows Perfetto's schema (field numbers from
//! `protos/perfetto/trace/`: `Trace`, `TracePacket`, `TrackDescriptor`, `TrackEvent`,
//! `InternedData`, `ClockSnapshot`, `TracePacketDefaults`) and checks what a trace processor
//! relies on: incremental state cleared before it is needed, interned ids defined before use,
//! incremental timestamps from a clock snapshot, begin/end nesting per track, timestamps
//! monotonic per track. Independent of the writer in `src/view/pftrace.rs`.

use std::collections::HashMap;

/// One protobuf field: (number, value).
#[derive(Debug, Clone)]
pub enum Val<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

fn varint(b: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at).ok_or("varint runs past the end")?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes".into())
}

/// The fields of a message, in order.
pub fn fields(b: &[u8]) -> Result<Vec<(u32, Val<'_>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let key = varint(b, &mut at)?;
        let (field, wire) = ((key >> 3) as u32, key & 7);
        let v = match wire {
            0 => Val::Int(varint(b, &mut at)?),
            2 => {
                let n = varint(b, &mut at)? as usize;
                let s = b.get(at..at + n).ok_or("length runs past the end")?;
                at += n;
                Val::Bytes(s)
            }
            1 => {
                let s = b.get(at..at + 8).ok_or("fixed64 past the end")?;
                at += 8;
                Val::Int(u64::from_le_bytes(s.try_into().unwrap()))
            }
            5 => {
                let s = b.get(at..at + 4).ok_or("fixed32 past the end")?;
                at += 4;
                Val::Int(u64::from(u32::from_le_bytes(s.try_into().unwrap())))
            }
            w => return Err(format!("wire type {w}")),
        };
        out.push((field, v));
    }
    Ok(out)
}

fn int(fs: &[(u32, Val<'_>)], f: u32) -> Option<u64> {
    fs.iter().rev().find_map(|(n, v)| match v {
        Val::Int(x) if *n == f => Some(*x),
        _ => None,
    })
}
fn ints(fs: &[(u32, Val<'_>)], f: u32) -> Vec<u64> {
    fs.iter()
        .filter_map(|(n, v)| match v {
            Val::Int(x) if *n == f => Some(*x),
            _ => None,
        })
        .collect()
}
fn msgs<'a>(fs: &[(u32, Val<'a>)], f: u32) -> Vec<&'a [u8]> {
    fs.iter()
        .filter_map(|(n, v)| match v {
            Val::Bytes(x) if *n == f => Some(*x),
            _ => None,
        })
        .collect()
}
fn string(fs: &[(u32, Val<'_>)], f: u32) -> Option<String> {
    msgs(fs, f)
        .last()
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackKind {
    Process { pid: i32 },
    Thread { pid: i32, tid: i32 },
    Other { parent: u64 },
}

#[derive(Debug, Clone)]
pub struct TrackInfo {
    pub kind: TrackKind,
    pub name: String,
}

/// A slice: begin/end matched on its track.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slice {
    pub track: u64,
    pub ts: u64,
    pub dur: u64,
    pub name: String,
    pub categories: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Trace {
    pub tracks: HashMap<u64, TrackInfo>,
    pub slices: Vec<Slice>,
    /// (track, ts, name)
    pub instants: Vec<(u64, u64, String)>,
    pub packets: usize,
}

#[derive(Default)]
struct SeqState {
    cleared: bool,
    names: HashMap<u64, String>,
    categories: HashMap<u64, String>,
    default_track: Option<u64>,
    clock_id: Option<u64>,
    /// Incremental clocks of this sequence: id -> last timestamp.
    incremental: HashMap<u64, u64>,
}

/// The packets of a trace, `compressed_packets` (field 50, zlib deflate) inflated in place.
fn packets(data: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for (n, v) in fields(data)? {
        let (1, Val::Bytes(p)) = (n, v) else {
            return Err(format!("Trace field {n} is not a packet"));
        };
        let pf = fields(p)?;
        match msgs(&pf, 50).last() {
            Some(z) => {
                if pf.len() != 1 {
                    return Err("compressed_packets beside other fields".into());
                }
                if p.len() >= 512 << 10 {
                    return Err(format!("a compressed_packets packet of {} bytes", p.len()));
                }
                let mut raw = Vec::new();
                std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(*z), &mut raw)
                    .map_err(|e| format!("compressed_packets: {e}"))?;
                out.extend(packets(&raw)?);
            }
            None => out.push(p.to_vec()),
        }
    }
    Ok(out)
}

pub fn read(data: &[u8]) -> Result<Trace, String> {
    let mut t = Trace::default();
    let mut seqs: HashMap<u64, SeqState> = HashMap::new();
    // Open slices per track: (ts, name, categories).
    let mut open: HashMap<u64, Vec<(u64, String, Vec<String>)>> = HashMap::new();
    let mut last_ts: HashMap<u64, u64> = HashMap::new();
    for p in packets(data)? {
        t.packets += 1;
        let pf = fields(&p)?;
        let seq_id = int(&pf, 10).ok_or("a packet without trusted_packet_sequence_id")?;
        let flags = int(&pf, 13).unwrap_or(0);
        let st = seqs.entry(seq_id).or_default();
        if flags & 1 != 0 {
            *st = SeqState {
                cleared: true,
                ..Default::default()
            };
        }
        if flags & 2 != 0 && !st.cleared {
            return Err(format!(
                "sequence {seq_id} needs incremental state never cleared"
            ));
        }
        if let Some(d) = msgs(&pf, 59).last() {
            let df = fields(d)?;
            st.clock_id = int(&df, 58);
            if let Some(te) = msgs(&df, 11).last() {
                st.default_track = int(&fields(te)?, 11);
            }
        }
        if let Some(c) = msgs(&pf, 6).last() {
            let mut base = None;
            let mut inc = Vec::new();
            for clock in msgs(&fields(c)?, 1) {
                let cf = fields(clock)?;
                let (id, ts) = (int(&cf, 1).unwrap_or(0), int(&cf, 2).unwrap_or(0));
                if int(&cf, 3) == Some(1) {
                    inc.push((id, ts));
                } else if id == 6 {
                    base = Some(ts);
                }
            }
            for (id, ts) in inc {
                if !(64..128).contains(&id) {
                    return Err(format!("incremental clock {id} is not sequence-scoped"));
                }
                if base != Some(ts) {
                    return Err("incremental clock not tied to BOOTTIME at the same time".into());
                }
                st.incremental.insert(id, ts);
            }
        }
        if let Some(i) = msgs(&pf, 12).last() {
            // (trace_processor skips interned data until the sequence's state is cleared:
            // a later use of it would find nothing.)
            if !st.cleared {
                return Err(format!(
                    "sequence {seq_id}: interned data before its incremental state is cleared"
                ));
            }
            let inf = fields(i)?;
            for (field, map) in [(1, &mut st.categories), (2, &mut st.names)] {
                for e in msgs(&inf, field) {
                    let ef = fields(e)?;
                    let iid = int(&ef, 1).ok_or("interned entry without iid")?;
                    map.insert(iid, string(&ef, 2).unwrap_or_default());
                }
            }
        }
        if let Some(d) = msgs(&pf, 60).last() {
            let df = fields(d)?;
            let uuid = int(&df, 1).ok_or("track without uuid")?;
            let (kind, name) = if let Some(p) = msgs(&df, 3).last() {
                let f = fields(p)?;
                let pid = int(&f, 1).unwrap_or(0) as i32;
                (
                    TrackKind::Process { pid },
                    string(&f, 6).unwrap_or_default(),
                )
            } else if let Some(th) = msgs(&df, 4).last() {
                let f = fields(th)?;
                let (pid, tid) = (
                    int(&f, 1).unwrap_or(0) as i32,
                    int(&f, 2).unwrap_or(0) as i32,
                );
                (
                    TrackKind::Thread { pid, tid },
                    string(&f, 5).unwrap_or_default(),
                )
            } else {
                let parent = int(&df, 5).ok_or("a named track without parent")?;
                (
                    TrackKind::Other { parent },
                    string(&df, 2).unwrap_or_default(),
                )
            };
            t.tracks.insert(uuid, TrackInfo { kind, name });
        }
        if let Some(e) = msgs(&pf, 11).last() {
            let ef = fields(e)?;
            let ts = match int(&pf, 58).or(st.clock_id) {
                Some(id) if st.incremental.contains_key(&id) => {
                    let last = st.incremental.get_mut(&id).unwrap();
                    *last += int(&pf, 8).unwrap_or(0);
                    *last
                }
                Some(id) => return Err(format!("clock {id} is not defined on the sequence")),
                None => int(&pf, 8).ok_or("event without timestamp")?,
            };
            let track = int(&ef, 11)
                .or(st.default_track)
                .ok_or("event without track")?;
            if !t.tracks.contains_key(&track) {
                return Err(format!("event on undescribed track {track}"));
            }
            let prev = last_ts.entry(track).or_insert(0);
            if ts < *prev {
                return Err(format!("track {track}: time goes back from {prev} to {ts}"));
            }
            *prev = ts;
            let name = match int(&ef, 10) {
                Some(iid) => Some(
                    st.names
                        .get(&iid)
                        .cloned()
                        .ok_or(format!("name iid {iid} not interned"))?,
                ),
                None => string(&ef, 23),
            };
            let mut cats = Vec::new();
            for iid in ints(&ef, 3) {
                cats.push(
                    st.categories
                        .get(&iid)
                        .cloned()
                        .ok_or(format!("category iid {iid} not interned"))?,
                );
            }
            match int(&ef, 9) {
                Some(1) => open.entry(track).or_default().push((
                    ts,
                    name.ok_or("slice begin without name")?,
                    cats,
                )),
                Some(2) => {
                    let (b, name, categories) = open
                        .get_mut(&track)
                        .and_then(|v| v.pop())
                        .ok_or(format!("slice end without begin on track {track}"))?;
                    t.slices.push(Slice {
                        track,
                        ts: b,
                        dur: ts - b,
                        name,
                        categories,
                    });
                }
                Some(3) => t.instants.push((track, ts, name.unwrap_or_default())),
                other => return Err(format!("event type {other:?}")),
            }
        }
    }
    if let Some((track, v)) = open.iter().find(|(_, v)| !v.is_empty()) {
        return Err(format!("{} slices never end on track {track}", v.len()));
    }
    Ok(t)
}
