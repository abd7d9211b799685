//! Memory access records: the loads and stores the QEMU backend saw (`pttrace run --memory`),
//! carried in a window's sideband beside its code records.
//!
//! PT has no data addresses; QEMU reports every access an executed instruction makes
//! (address, size, load or store, in execution order, after the access: an access that
//! faults is not reported). A window's accesses are records of a private perf record type
//! (user types, ≥ 64, have no sample_id trailer):
//!
//! ```text
//! u32 type (= PERF_RECORD_PTTRACE_MEMORY) | u16 misc (= 0) | u16 size
//! u32 accesses | u32 raw length | u32 LZ4 length | the raw bytes as an LZ4 block | zero padding to 8 bytes
//! raw := access*    access := u16 control | pc delta | address delta
//! control := (address delta bytes - 1) << 8 | (pc delta bytes - 1) << 5 | again << 4 | store << 3 | log2 size
//! ```
//! Each delta (to the previous access's pc, or address) is zigzag-encoded and written in
//! as few little-endian bytes as hold it (1 to 8), so that an access is put with three
//! unaligned stores and no loop, and each length comes from one bit count. Bit 30 of the
//! raw length word says this layout. Records of pttrace before it hold two varints per
//! access instead, `zigzag(pc delta) << 5 | again << 4 | store << 3 | log2 size` then
//! `zigzag(address delta)`: prefix varints when bit 31 is set (the first byte's trailing
//! one bits say how many bytes follow, `n - 1` ones then a zero, the value above them;
//! `0xff` then 8 bytes for values of 2^56 or more), LEB128 when neither bit is.
//! `again`: the access is of a new execution of the previous access's instruction (a loop
//! whose only access is that instruction's), not one more access of the same execution
//! (several operands, a wide access QEMU splits, the iterations of one `rep` instruction).
//! Each record starts from pc and address 0 and holds at most [`RAW_CHUNK`] raw bytes, so
//! it fits a record's u16 size and a damaged one loses only its own accesses.

/// The record type of memory access records (a perf user type, no sample_id trailer).
pub const PERF_RECORD_PTTRACE_MEMORY: u32 = 0x7000;
/// Raw bytes per record at most (LZ4 never grows them past the u16 record size).
pub const RAW_CHUNK: usize = 60_000;
/// The longest raw access: two 10-byte varints (older layouts; this one's is 18 bytes).
const MAX_ACCESS: usize = 20;
/// Room past the end of the raw bytes that an access's unaligned 8-byte stores may write.
const STORE_SLACK: usize = 8;
/// A record body's head: accesses, raw length, LZ4 length.
const HEAD: usize = 12;
/// In the raw length word: the varints are prefix varints (older records).
const PREFIX_VARINTS: u32 = 1 << 31;
/// In the raw length word: accesses are a control word and two byte-counted deltas (what
/// this encoder writes).
const CONTROL_WORDS: u32 = 1 << 30;
/// The bits of the raw length word that say the layout.
const LAYOUT_BITS: u32 = PREFIX_VARINTS | CONTROL_WORDS;

/// One load or store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The instruction that made it.
    pub pc: u64,
    pub addr: u64,
    /// log2 of its size in bytes (QEMU's `qemu_plugin_mem_size_shift`).
    pub size_shift: u8,
    pub store: bool,
    /// The first access of another execution of the same instruction as the access
    /// before it.
    pub again: bool,
}

impl Access {
    pub fn size(&self) -> u64 {
        1 << self.size_shift.min(15)
    }

    /// Its flags as a record holds them: `again << 4 | store << 3 | log2 size`.
    fn flags(&self) -> u64 {
        u64::from(self.again) << 4 | u64::from(self.store) << 3 | u64::from(self.size_shift & 7)
    }

    /// The access at `pc` and `addr` with record flags `flags` ([`Access::flags`]).
    fn with_flags(pc: u64, addr: u64, flags: u64) -> Access {
        Access {
            pc,
            addr,
            size_shift: (flags & 7) as u8,
            store: flags & 8 != 0,
            again: flags & 16 != 0,
        }
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Bytes that hold `v` (1 to 8).
#[inline(always)]
fn delta_bytes(v: u64) -> usize {
    (71 - (v | 1).leading_zeros() as usize) >> 3
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Bytes of a prefix varint by the bit length of its value (0-64): 7 value bits a byte up
/// to 8 bytes, then 9 (older records; tests write them).
#[cfg(test)]
const PREFIX_LEN: [u8; 65] = {
    let mut t = [0u8; 65];
    let mut bits = 0;
    while bits <= 64 {
        t[bits] = if bits <= 56 {
            if bits == 0 {
                1
            } else {
                bits.div_ceil(7) as u8
            }
        } else {
            9
        };
        bits += 1;
    }
    t
};

/// Puts prefix varint `v` at `b[at..]` (`b` has 9 bytes of room past `at`); the position
/// after it.
#[cfg(test)]
fn put_prefix_varint(b: &mut [u8], at: usize, v: u64) -> usize {
    // (`v | 1`: the bit length of 0 is taken as 1's, both one byte; and the count needs no
    // zero check.)
    let n = PREFIX_LEN[(64 - (v | 1).leading_zeros()) as usize] as u32;
    if n <= 8 {
        // (n - 1) one bits, then the value above a zero bit.
        let word = (v << n) | ((1u64 << (n - 1)) - 1);
        if let Some(d) = b.get_mut(at..at + 8) {
            d.copy_from_slice(&word.to_le_bytes());
        }
        at + n as usize
    } else {
        put_long_varint(b, at, v)
    }
}

/// A prefix varint of 9 bytes (a value of 2^56 or more).
#[cfg(test)]
fn put_long_varint(b: &mut [u8], at: usize, v: u64) -> usize {
    if let Some(d) = b.get_mut(at..at + 9) {
        d[0] = 0xff;
        d[1..].copy_from_slice(&v.to_le_bytes());
    }
    at + 9
}

/// The prefix varint at `b[*pos..]`, `pos` moved past it.
fn prefix_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let first = *b.get(*pos)?;
    let n = first.trailing_ones() as usize + 1;
    if n == 9 {
        let v = u64::from_le_bytes(b.get(*pos + 1..*pos + 9)?.try_into().ok()?);
        *pos += 9;
        return Some(v);
    }
    let bytes = b.get(*pos..*pos + n)?;
    let mut word = [0u8; 8];
    word[..n].copy_from_slice(bytes);
    *pos += n;
    Some(u64::from_le_bytes(word) >> n)
}

/// Collects a window's accesses and writes them as records.
pub struct Encoder {
    /// The raw bytes (`len` of them), with room for one more access past [`RAW_CHUNK`].
    raw: Vec<u8>,
    len: usize,
    count: u32,
    pc: u64,
    addr: u64,
    /// Room for a record's LZ4 block (sized once).
    packed: Vec<u8>,
    /// Records written so far (a [`Mark`] from before one cannot be rolled back to).
    records: u64,
}

/// Where an [`Encoder`] was, to roll back to ([`Encoder::rollback`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    len: usize,
    count: u32,
    pc: u64,
    addr: u64,
    records: u64,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder {
            raw: vec![0; RAW_CHUNK + MAX_ACCESS + STORE_SLACK],
            len: 0,
            count: 0,
            pc: 0,
            addr: 0,
            packed: vec![0; lz4_flex::block::get_maximum_output_size(RAW_CHUNK)],
            records: 0,
        }
    }
}

impl Encoder {
    /// Accesses collected and not yet written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Where the encoder is now.
    #[inline]
    pub fn mark(&self) -> Mark {
        Mark {
            len: self.len,
            count: self.count,
            pc: self.pc,
            addr: self.addr,
            records: self.records,
        }
    }

    /// Forgets the accesses pushed since `m`; false (and nothing forgotten) when a record
    /// was written since.
    pub fn rollback(&mut self, m: Mark) -> bool {
        if m.records != self.records {
            return false;
        }
        (self.len, self.count, self.pc, self.addr) = (m.len, m.count, m.pc, m.addr);
        true
    }

    /// Adds one access; a full record goes to `out`.
    #[inline]
    pub fn push(&mut self, a: Access, out: &mut Vec<u8>) {
        self.push_parts(a.pc, a.addr, a.flags(), out);
    }

    /// [`Encoder::push`] of an access given as its pc, address and flags (`again << 4 |
    /// store << 3 | log2 size`, as the record holds them).
    #[inline(always)]
    pub fn push_parts(&mut self, pc: u64, addr: u64, flags: u64, out: &mut Vec<u8>) {
        if self.len + MAX_ACCESS > RAW_CHUNK {
            self.record(out);
        }
        let dpc = zigzag(pc.wrapping_sub(self.pc) as i64);
        let daddr = zigzag(addr.wrapping_sub(self.addr) as i64);
        let (npc, naddr) = (delta_bytes(dpc), delta_bytes(daddr));
        let control = (naddr as u16 - 1) << 8 | (npc as u16 - 1) << 5 | (flags & 0x1f) as u16;
        let at = self.len;
        // (Room: `len` is at most RAW_CHUNK - MAX_ACCESS here, and the buffer has
        // MAX_ACCESS + STORE_SLACK bytes past RAW_CHUNK.)
        if let Some(b) = self.raw.get_mut(at..at + 2 + 8 + 8) {
            b[..2].copy_from_slice(&control.to_le_bytes());
            b[2..10].copy_from_slice(&dpc.to_le_bytes());
            b[2 + npc..10 + npc].copy_from_slice(&daddr.to_le_bytes());
        }
        self.len = at + 2 + npc + naddr;
        self.pc = pc;
        self.addr = addr;
        self.count += 1;
    }

    /// Writes what is collected as a record to `out` (the window ends).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.count > 0 {
            self.record(out);
        }
    }

    fn record(&mut self, out: &mut Vec<u8>) {
        let raw = self.raw.get(..self.len).unwrap_or(&[]);
        let n = lz4_flex::block::compress_into(raw, &mut self.packed).unwrap_or(0);
        let packed = self.packed.get(..n).unwrap_or(&[]);
        let body = HEAD + packed.len();
        let pad = (8 - body % 8) % 8;
        let size = 8 + body + pad;
        out.extend_from_slice(&PERF_RECORD_PTTRACE_MEMORY.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(size as u16).to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&(self.len as u32 | CONTROL_WORDS).to_le_bytes());
        out.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        out.extend_from_slice(packed);
        out.extend(std::iter::repeat_n(0u8, pad));
        self.records += 1;
        self.len = 0;
        self.count = 0;
        self.pc = 0;
        self.addr = 0;
    }
}

/// The number of accesses a record's body (after the 8-byte header) claims, its head
/// checked (the rest is checked when [`parse_body`] inflates it).
pub fn body_count(body: &[u8]) -> Result<u32, String> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?))
    };
    let (Some(count), Some(raw_len), Some(packed)) = (word(0), word(4), word(8)) else {
        return Err(format!(
            "memory record body of {} bytes, shorter than its {HEAD}-byte head",
            body.len()
        ));
    };
    let raw_len = raw_len & !LAYOUT_BITS;
    if raw_len as usize > RAW_CHUNK || count > raw_len / 2 {
        return Err(format!(
            "memory record claims {count} accesses in {raw_len} raw bytes"
        ));
    }
    if packed as usize > body.len() - HEAD {
        return Err(format!(
            "memory record claims {packed} packed bytes in a body of {}",
            body.len()
        ));
    }
    Ok(count)
}

/// A window's memory records as read, still compressed (a few bytes per access at most),
/// decompressed record by record as they are used ([`Packed::records`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packed {
    bodies: Vec<u8>,
    ends: Vec<usize>,
    count: u64,
}

impl Packed {
    /// Adds a record's body (its head checked).
    pub fn push_body(&mut self, body: &[u8]) -> Result<(), String> {
        self.count += u64::from(body_count(body)?);
        self.bodies.extend_from_slice(body);
        self.ends.push(self.bodies.len());
        Ok(())
    }

    /// Accesses in all.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The records' bodies, in order.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| self.bodies.get(a..b).unwrap_or(&[]))
    }

    /// Every access (tests and small windows: a window can hold millions).
    pub fn to_vec(&self) -> Result<Vec<Access>, String> {
        let mut out = Vec::new();
        for body in self.records() {
            parse_body(body, &mut out)?;
        }
        Ok(out)
    }

    /// The packed form of `list` (tests).
    pub fn of(list: &[Access]) -> Packed {
        let mut enc = Encoder::default();
        let mut sideband = Vec::new();
        for &a in list {
            enc.push(a, &mut sideband);
        }
        enc.finish(&mut sideband);
        let mut p = Packed::default();
        let mut at = 0;
        while let Some(h) = sideband.get(at..at + 8) {
            let size = usize::from(u16::from_le_bytes([h[6], h[7]]));
            if let Some(body) = sideband.get(at + 8..at + size) {
                // A record just encoded has a sound head.
                let _ = p.push_body(body);
            }
            at += size.max(8);
        }
        p
    }
}

/// The accesses of one record's body (after the 8-byte header), appended to `out`; why
/// not when the body is malformed.
pub fn parse_body(body: &[u8], out: &mut Vec<Access>) -> Result<(), String> {
    let count = body_count(body)?;
    let word = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
    let raw_len = (word & !LAYOUT_BITS) as usize;
    let packed_len = u32::from_le_bytes([body[8], body[9], body[10], body[11]]) as usize;
    let mut raw = vec![0u8; raw_len];
    let packed = body.get(HEAD..HEAD + packed_len).unwrap_or(&[]);
    let n = lz4_flex::block::decompress_into(packed, &mut raw)
        .map_err(|e| format!("memory record does not decompress: {e}"))?;
    raw.truncate(n);
    if raw.len() != raw_len {
        return Err(format!(
            "memory record inflates to {} bytes, not the {raw_len} it claims",
            raw.len()
        ));
    }
    out.reserve(count as usize);
    // (Each layout's reader inlined into a loop of its own.)
    let pos = if word & CONTROL_WORDS != 0 {
        parse_accesses(&raw, count, out, read_controlled)?
    } else if word & PREFIX_VARINTS != 0 {
        parse_accesses(&raw, count, out, |raw, pos| {
            read_varints(raw, pos, prefix_varint)
        })?
    } else {
        parse_accesses(&raw, count, out, |raw, pos| {
            read_varints(raw, pos, crate::leb128::read)
        })?
    };
    if pos != raw.len() {
        return Err(format!(
            "memory record has {} bytes after its {count} accesses",
            raw.len() - pos
        ));
    }
    Ok(())
}

/// The `count` accesses of `raw`, each read by `read` (as [`read_controlled`] reads),
/// appended to `out`; the bytes they took.
fn parse_accesses(
    raw: &[u8],
    count: u32,
    out: &mut Vec<Access>,
    read: impl Fn(&[u8], &mut usize) -> Result<Option<[u64; 3]>, String>,
) -> Result<usize, String> {
    let (mut pos, mut pc, mut addr) = (0usize, 0u64, 0u64);
    for k in 0..count {
        let [flags, dpc, da] = read(raw, &mut pos)
            .map_err(|e| format!("memory record access {k} of {count}: {e}"))?
            .ok_or_else(|| format!("memory record cut inside access {k} of {count}"))?;
        pc = pc.wrapping_add(unzigzag(dpc) as u64);
        addr = addr.wrapping_add(unzigzag(da) as u64);
        out.push(Access::with_flags(pc, addr, flags));
    }
    Ok(pos)
}

/// One access of a record's raw bytes at `pos` (moved past it) in this encoder's layout
/// (a control word and two byte-counted deltas): its flags ([`Access::flags`]) and its
/// zigzag pc and address deltas; `None` when the bytes end inside it, why not when it is
/// malformed.
fn read_controlled(raw: &[u8], pos: &mut usize) -> Result<Option<[u64; 3]>, String> {
    // A little-endian value of `n` bytes at `at`.
    let value = |at: usize, n: usize| -> Option<u64> {
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(raw.get(at..at + n)?);
        Some(u64::from_le_bytes(w))
    };
    let Some(control) = raw
        .get(*pos..*pos + 2)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_le_bytes)
    else {
        return Ok(None);
    };
    if control >> 11 != 0 {
        return Err(format!("control word {control:#06x} has bits above 10 set"));
    }
    let npc = usize::from(control >> 5 & 7) + 1;
    let naddr = usize::from(control >> 8 & 7) + 1;
    let (Some(dpc), Some(da)) = (value(*pos + 2, npc), value(*pos + 2 + npc, naddr)) else {
        return Ok(None);
    };
    *pos += 2 + npc + naddr;
    Ok(Some([u64::from(control & 0x1f), dpc, da]))
}

/// The reader of an access ([`read_controlled`]) of the older layouts: two varints, each
/// read by `read`.
fn read_varints(
    raw: &[u8],
    pos: &mut usize,
    read: fn(&[u8], &mut usize) -> Option<u64>,
) -> Result<Option<[u64; 3]>, String> {
    let (Some(head), Some(da)) = (read(raw, pos), read(raw, pos)) else {
        return Ok(None);
    };
    Ok(Some([head & 0x1f, head >> 5, da]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf_record::{Record, RecordIter, SIDEBAND_SAMPLE_TYPE};

    fn accesses(n: u64) -> Vec<Access> {
        (0..n)
            .map(|i| Access {
                pc: 0x40_1000 + (i % 7) * 5,
                addr: if i % 3 == 0 {
                    0x7fff_f000_0000 - i * 8
                } else {
                    0x4000_0000 + i * 4
                },
                size_shift: (i % 5) as u8,
                store: i % 2 == 1,
                again: i % 11 == 0,
            })
            .collect()
    }

    fn encode(list: &[Access]) -> Vec<u8> {
        let mut enc = Encoder::default();
        let mut out = Vec::new();
        for &a in list {
            enc.push(a, &mut out);
        }
        enc.finish(&mut out);
        out
    }

    /// The accesses of a sideband buffer, or the first error.
    fn decode(data: &[u8]) -> Result<Vec<Access>, String> {
        let mut out = Vec::new();
        for r in RecordIter::new(data, SIDEBAND_SAMPLE_TYPE) {
            let (_, rec) = r.map_err(|e| e.to_string())?;
            match rec.record {
                Record::Memory(body) => parse_body(&body, &mut out)?,
                other => return Err(format!("unexpected {other:?}")),
            }
        }
        Ok(out)
    }

    #[test]
    fn a_rollback_forgets_the_accesses_since_its_mark_unless_a_record_was_written() {
        let list = accesses(40);
        let mut enc = Encoder::default();
        let mut out = Vec::new();
        for &a in &list[..25] {
            enc.push(a, &mut out);
        }
        let mark = enc.mark();
        for &a in &list[25..] {
            enc.push(a, &mut out);
        }
        assert!(enc.rollback(mark));
        // What follows is encoded against the state at the mark.
        enc.push(list[3], &mut out);
        enc.finish(&mut out);
        let mut want = list[..25].to_vec();
        want.push(list[3]);
        assert_eq!(decode(&out), Ok(want));

        // A record written since the mark: nothing is forgotten.
        let many = accesses(30_000);
        let mut enc = Encoder::default();
        let mut out = Vec::new();
        enc.push(many[0], &mut out);
        let mark = enc.mark();
        for &a in &many[1..] {
            enc.push(a, &mut out);
        }
        assert!(!out.is_empty(), "a record was written");
        assert!(!enc.rollback(mark));
        enc.finish(&mut out);
        assert_eq!(decode(&out), Ok(many));
    }

    #[test]
    fn record_layout() {
        let a = Access {
            pc: 0x1000,
            addr: 0x2000,
            size_shift: 3,
            store: true,
            again: false,
        };
        let out = encode(&[a]);
        assert_eq!(&out[..4], &PERF_RECORD_PTTRACE_MEMORY.to_le_bytes());
        assert_eq!(&out[4..6], &[0, 0]);
        assert_eq!(usize::from(u16::from_le_bytes([out[6], out[7]])), out.len());
        assert_eq!(out.len() % 8, 0);
        assert_eq!(&out[8..12], &1u32.to_le_bytes());
        // Control word: address delta zigzag(0x2000) = 0x4000 in 2 bytes, pc delta
        // zigzag(0x1000) = 0x2000 in 2 bytes, store, 8 bytes: 1 << 8 | 1 << 5 | 8 | 3.
        let raw = [0x2b, 0x01, 0x00, 0x20, 0x00, 0x40];
        assert_eq!(
            &out[12..16],
            &(raw.len() as u32 | CONTROL_WORDS).to_le_bytes()
        );
        let packed = u32::from_le_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(20 + packed <= out.len() && out.len() - (20 + packed) < 8);
        let mut unpacked = vec![0u8; raw.len()];
        let n = lz4_flex::block::decompress_into(&out[20..20 + packed], &mut unpacked).unwrap();
        assert_eq!(&unpacked[..n], &raw[..]);
        assert_eq!(decode(&out).unwrap(), vec![a]);
    }

    /// Deltas of every byte length (and the largest), both signs, in pc and address.
    #[test]
    fn deltas_of_every_length_round_trip() {
        let mut steps = vec![0u64, 1, u64::MAX, 1 << 63, (1 << 63) - 1];
        for bits in 1..64 {
            steps.extend([
                (1u64 << bits) - 1,
                1u64 << bits,
                (1u64 << bits).wrapping_neg(),
            ]);
        }
        let (mut pc, mut addr) = (0u64, 0u64);
        let mut list = Vec::new();
        for (k, &step) in steps.iter().enumerate() {
            pc = pc.wrapping_add(step);
            addr = addr.wrapping_sub(step.rotate_left(k as u32));
            list.push(Access {
                pc,
                addr,
                size_shift: (k % 8) as u8,
                store: k % 3 == 0,
                again: k % 2 == 0,
            });
        }
        assert_eq!(decode(&encode(&list)), Ok(list));
        // Each delta takes the fewest bytes that hold it.
        for (v, n) in [
            (0u64, 1),
            (0xff, 1),
            (0x100, 2),
            (u64::MAX >> 8, 7),
            (u64::MAX, 8),
        ] {
            assert_eq!(delta_bytes(v), n, "{v:#x}");
        }
    }

    #[test]
    fn prefix_varints_round_trip_at_every_length() {
        let mut values = vec![0u64, 1, u64::MAX];
        for bits in 1..64 {
            values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
        }
        let mut buf = vec![0u8; values.len() * 9 + 16];
        let mut at = 0;
        let mut lens = Vec::new();
        for &v in &values {
            let next = put_prefix_varint(&mut buf, at, v);
            lens.push(next - at);
            at = next;
        }
        // 7 value bits a byte up to 8 bytes, then 9.
        for (&v, &n) in values.iter().zip(&lens) {
            let bits = 64 - (v | 1).leading_zeros() as usize;
            assert_eq!(n, if bits <= 56 { bits.div_ceil(7) } else { 9 }, "{v:#x}");
        }
        let mut pos = 0;
        for &v in &values {
            assert_eq!(prefix_varint(&buf[..at], &mut pos), Some(v));
        }
        assert_eq!(pos, at);
        // Cut inside the last value.
        let mut pos = at - lens[lens.len() - 1];
        assert_eq!(prefix_varint(&buf[..at - 1], &mut pos), None);
    }

    /// A record body of older layout: `put` writes each varint, `flag` marks the layout.
    fn varint_body(list: &[Access], put: impl Fn(&mut Vec<u8>, u64), flag: u32) -> Vec<u8> {
        let mut raw = Vec::new();
        let (mut pc, mut addr) = (0u64, 0u64);
        for a in list {
            let dpc = zigzag(a.pc.wrapping_sub(pc) as i64);
            put(
                &mut raw,
                dpc << 5
                    | u64::from(a.again) << 4
                    | u64::from(a.store) << 3
                    | u64::from(a.size_shift),
            );
            put(&mut raw, zigzag(a.addr.wrapping_sub(addr) as i64));
            (pc, addr) = (a.pc, a.addr);
        }
        let packed = lz4_flex::block::compress(&raw);
        let mut body = Vec::new();
        body.extend_from_slice(&(list.len() as u32).to_le_bytes());
        body.extend_from_slice(&(raw.len() as u32 | flag).to_le_bytes());
        body.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        body.extend_from_slice(&packed);
        body
    }

    /// A record of pttrace before control words (prefix varints, bit 31) still reads.
    #[test]
    fn prefix_varint_records_still_read() {
        let list = accesses(500);
        let put = |raw: &mut Vec<u8>, v: u64| {
            let at = raw.len();
            raw.resize(at + 17, 0);
            let end = put_prefix_varint(raw, at, v);
            raw.truncate(end);
        };
        let body = varint_body(&list, put, PREFIX_VARINTS);
        let mut out = Vec::new();
        parse_body(&body, &mut out).unwrap();
        assert_eq!(out, list);
    }

    /// A record written before prefix varints (LEB128, no flag) still reads.
    #[test]
    fn leb128_records_still_read() {
        let list = accesses(500);
        let body = varint_body(&list, crate::leb128::push, 0);
        let mut out = Vec::new();
        parse_body(&body, &mut out).unwrap();
        assert_eq!(out, list);
    }

    #[test]
    fn many_accesses_round_trip_over_several_records() {
        let list = accesses(40_000);
        let out = encode(&list);
        let records = RecordIter::new(&out, SIDEBAND_SAMPLE_TYPE).count();
        assert!(records > 1, "{records} records");
        assert_eq!(decode(&out).unwrap(), list);
        // Against 17 bytes an access unpacked (two addresses and the size and kind); these
        // made-up accesses repeat less than a program's (python's loop: 0.15 bytes each).
        assert!(out.len() < list.len() * 6, "{} bytes", out.len());
    }

    #[test]
    fn every_truncation_point_is_an_error_or_whole_records() {
        let list = accesses(9_000);
        let out = encode(&list);
        // Record boundaries and the accesses before each.
        let mut ends = vec![(0usize, 0usize)];
        let mut total = 0usize;
        for r in RecordIter::new(&out, SIDEBAND_SAMPLE_TYPE) {
            let (off, rec) = r.unwrap();
            if let Record::Memory(body) = rec.record {
                total += body_count(&body).unwrap() as usize;
            }
            ends.push((off + usize::from(rec.header.size), total));
        }
        assert!(ends.len() > 2);
        for k in 0..=out.len() {
            match ends.iter().find(|e| e.0 == k) {
                Some(&(_, n)) => assert_eq!(decode(&out[..k]).unwrap(), list[..n], "cut at {k}"),
                None => assert!(decode(&out[..k]).is_err(), "cut at {k} accepted"),
            }
        }
    }

    #[test]
    fn packed_records_give_the_accesses_back() {
        let list = accesses(30_000);
        let p = Packed::of(&list);
        assert_eq!(p.len(), 30_000);
        assert!(p.records().count() > 1);
        assert_eq!(p.to_vec().unwrap(), list);
        assert!(Packed::default().is_empty());
    }

    #[test]
    fn damaged_bodies_are_errors() {
        let out = encode(&accesses(100));
        let body = &out[8..];
        let mut sink = Vec::new();
        // More accesses than the raw bytes hold.
        let mut b = body.to_vec();
        b[0..4].copy_from_slice(&200u32.to_le_bytes());
        assert!(parse_body(&b, &mut sink).is_err());
        // Fewer: bytes left over.
        b[0..4].copy_from_slice(&99u32.to_le_bytes());
        assert!(parse_body(&b, &mut sink).is_err());
        // A raw length that does not match.
        let mut b = body.to_vec();
        b[4] ^= 1;
        assert!(parse_body(&b, &mut sink).is_err());
        // Cut inside its head.
        assert!(parse_body(&body[..5], &mut sink).is_err());
        // A control word with bits above the layout's.
        let a = accesses(1)[0];
        let out = encode(&[a]);
        let packed = u32::from_le_bytes(out[16..20].try_into().unwrap()) as usize;
        let mut raw = lz4_flex::block::decompress(&out[20..20 + packed], 64).unwrap();
        raw[1] |= 0x80;
        let repacked = lz4_flex::block::compress(&raw);
        let mut b = out[8..16].to_vec();
        b.extend_from_slice(&(repacked.len() as u32).to_le_bytes());
        b.extend_from_slice(&repacked);
        let err = parse_body(&b, &mut sink).unwrap_err();
        assert!(err.contains("control word"), "{err}");
    }
}
