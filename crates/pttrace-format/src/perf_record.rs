//! perf record types (the kernel's `struct perf_event_header` stream): parse and encode.
//!
//! Sideband is a concatenation of raw perf records as they appear in a perf DATA ring.
//! With `sample_id_all`, every non-sample record ends with a `sample_id` trailer whose
//! fields depend on `sample_type` (in order: TID, TIME, ID, STREAM_ID, CPU, IDENTIFIER).

use std::fmt;

pub const PERF_RECORD_MMAP: u32 = 1;
pub const PERF_RECORD_LOST: u32 = 2;
pub const PERF_RECORD_COMM: u32 = 3;
pub const PERF_RECORD_EXIT: u32 = 4;
pub const PERF_RECORD_FORK: u32 = 7;
pub const PERF_RECORD_MMAP2: u32 = 10;
pub const PERF_RECORD_AUX: u32 = 11;
pub const PERF_RECORD_ITRACE_START: u32 = 12;
pub const PERF_RECORD_SWITCH: u32 = 14;
pub const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;
/// Code bytes at an address (perf's TEXT_POKE; the software backends' code records, see
/// [`crate::code`]).
pub const PERF_RECORD_TEXT_POKE: u32 = crate::code::PERF_RECORD_TEXT_POKE;
pub const PERF_RECORD_AUXTRACE: u32 = 71;

pub const PERF_SAMPLE_TID: u64 = 1 << 1;
pub const PERF_SAMPLE_TIME: u64 = 1 << 2;
pub const PERF_SAMPLE_ID: u64 = 1 << 6;
pub const PERF_SAMPLE_CPU: u64 = 1 << 7;
pub const PERF_SAMPLE_STREAM_ID: u64 = 1 << 9;
pub const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;

/// The `sample_type` of every sideband stream this library produces.
pub const SIDEBAND_SAMPLE_TYPE: u64 =
    PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU | PERF_SAMPLE_IDENTIFIER;

pub const PERF_RECORD_MISC_CPUMODE_MASK: u16 = 7;
pub const PERF_RECORD_MISC_KERNEL: u16 = 1;
pub const PERF_RECORD_MISC_USER: u16 = 2;
/// COMM caused by exec (misc bit 13); also SWITCH_OUT for switch records.
pub const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;
pub const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;
/// MMAP2 carries a build id instead of maj/min/ino (misc bit 14).
pub const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;

pub const PERF_AUX_FLAG_TRUNCATED: u64 = 0x1;
pub const PERF_AUX_FLAG_OVERWRITE: u64 = 0x2;
pub const PERF_AUX_FLAG_PARTIAL: u64 = 0x4;
pub const PERF_AUX_FLAG_COLLISION: u64 = 0x8;

/// Size of `struct perf_event_header`.
pub const HEADER_SIZE: usize = 8;

/// `struct perf_event_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: u32,
    pub misc: u16,
    pub size: u16,
}

impl RecordHeader {
    pub fn parse(b: &[u8]) -> Option<RecordHeader> {
        let b = b.get(..HEADER_SIZE)?;
        Some(RecordHeader {
            kind: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            misc: u16::from_le_bytes([b[4], b[5]]),
            size: u16::from_le_bytes([b[6], b[7]]),
        })
    }
}

/// The `sample_id` trailer; fields absent from `sample_type` are `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleId {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub id: Option<u64>,
    pub stream_id: Option<u64>,
    pub cpu: Option<u32>,
    pub identifier: Option<u64>,
}

/// Size in bytes of the sample_id trailer for `sample_type`.
pub fn sample_id_size(sample_type: u64) -> usize {
    [
        PERF_SAMPLE_TID,
        PERF_SAMPLE_TIME,
        PERF_SAMPLE_ID,
        PERF_SAMPLE_STREAM_ID,
        PERF_SAMPLE_CPU,
        PERF_SAMPLE_IDENTIFIER,
    ]
    .iter()
    .filter(|&&bit| sample_type & bit != 0)
    .count()
        * 8
}

impl SampleId {
    fn parse(b: &[u8], sample_type: u64) -> Option<SampleId> {
        let mut r = Reader::new(b);
        let mut s = SampleId::default();
        if sample_type & PERF_SAMPLE_TID != 0 {
            s.pid = Some(r.u32()?);
            s.tid = Some(r.u32()?);
        }
        if sample_type & PERF_SAMPLE_TIME != 0 {
            s.time = Some(r.u64()?);
        }
        if sample_type & PERF_SAMPLE_ID != 0 {
            s.id = Some(r.u64()?);
        }
        if sample_type & PERF_SAMPLE_STREAM_ID != 0 {
            s.stream_id = Some(r.u64()?);
        }
        if sample_type & PERF_SAMPLE_CPU != 0 {
            s.cpu = Some(r.u32()?);
            r.u32()?;
        }
        if sample_type & PERF_SAMPLE_IDENTIFIER != 0 {
            s.identifier = Some(r.u64()?);
        }
        Some(s)
    }

    /// Appends this trailer in `sample_type`'s layout (absent values are written as 0).
    pub fn encode(&self, sample_type: u64, out: &mut Vec<u8>) {
        if sample_type & PERF_SAMPLE_TID != 0 {
            out.extend_from_slice(&self.pid.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&self.tid.unwrap_or(0).to_le_bytes());
        }
        if sample_type & PERF_SAMPLE_TIME != 0 {
            out.extend_from_slice(&self.time.unwrap_or(0).to_le_bytes());
        }
        if sample_type & PERF_SAMPLE_ID != 0 {
            out.extend_from_slice(&self.id.unwrap_or(0).to_le_bytes());
        }
        if sample_type & PERF_SAMPLE_STREAM_ID != 0 {
            out.extend_from_slice(&self.stream_id.unwrap_or(0).to_le_bytes());
        }
        if sample_type & PERF_SAMPLE_CPU != 0 {
            out.extend_from_slice(&self.cpu.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        if sample_type & PERF_SAMPLE_IDENTIFIER != 0 {
            out.extend_from_slice(&self.identifier.unwrap_or(0).to_le_bytes());
        }
    }
}

/// An MMAP or MMAP2 record's mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub pid: u32,
    pub tid: u32,
    pub addr: u64,
    pub len: u64,
    pub pgoff: u64,
    /// maj, min, ino, ino_generation (zeros for MMAP or build-id MMAP2).
    pub maj: u32,
    pub min: u32,
    pub ino: u64,
    pub ino_generation: u64,
    pub prot: u32,
    pub flags: u32,
    pub filename: String,
}

/// A parsed record body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Mmap(Mapping),
    Mmap2(Mapping),
    Comm {
        pid: u32,
        tid: u32,
        comm: String,
        exec: bool,
    },
    Exit {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    Lost {
        id: u64,
        lost: u64,
    },
    Aux {
        aux_offset: u64,
        aux_size: u64,
        flags: u64,
    },
    ItraceStart {
        pid: u32,
        tid: u32,
    },
    Switch {
        out: bool,
    },
    SwitchCpuWide {
        out: bool,
        next_prev_pid: u32,
        next_prev_tid: u32,
    },
    /// New code bytes at `addr` (perf's TEXT_POKE).
    TextPoke {
        addr: u64,
        bytes: Vec<u8>,
    },
    /// Loads and stores (pttrace's own record, [`crate::memory`]): its body, still
    /// deflated (its head checked).
    Memory(Vec<u8>),
    /// A record type this library does not interpret.
    Other {
        kind: u32,
    },
}

/// One record with its header, body and sample_id trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRecord {
    pub header: RecordHeader,
    pub record: Record,
    pub sample: SampleId,
}

/// Why a record could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub offset: usize,
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad perf record at offset {:#x}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for ParseError {}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Self {
        Reader { b, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Some(u64::from_le_bytes(a))
    }
    /// A NUL-terminated string inside the remaining bytes (padding follows).
    fn cstr(&mut self) -> Option<String> {
        let rest = self.b.get(self.pos..)?;
        let n = rest.iter().position(|&c| c == 0)?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Some(s)
    }
}

/// Parses the record at the start of `bytes`. Returns it and its size.
/// `offset` is only used in error messages.
pub fn parse_record(
    bytes: &[u8],
    sample_type: u64,
    offset: usize,
) -> Result<(ParsedRecord, usize), ParseError> {
    let err = |reason: String| ParseError { offset, reason };
    let header = RecordHeader::parse(bytes).ok_or_else(|| {
        err(format!(
            "{} bytes left, a record header needs {HEADER_SIZE}",
            bytes.len()
        ))
    })?;
    let size = usize::from(header.size);
    if size < HEADER_SIZE {
        return Err(err(format!(
            "record size {size} is smaller than its header"
        )));
    }
    let Some(rec) = bytes.get(..size) else {
        return Err(err(format!(
            "record of type {} claims {size} bytes but only {} remain",
            header.kind,
            bytes.len()
        )));
    };
    let body_all = &rec[HEADER_SIZE..];
    let trailer = sample_id_size(sample_type);
    let has_trailer = header.kind != 9 /* PERF_RECORD_SAMPLE */ && header.kind < 64;
    let (body, sample) = if has_trailer && trailer > 0 {
        if body_all.len() < trailer {
            return Err(err(format!(
                "record of type {} is {size} bytes, too small for its {trailer}-byte sample_id",
                header.kind
            )));
        }
        let (b, t) = body_all.split_at(body_all.len() - trailer);
        (b, SampleId::parse(t, sample_type).unwrap_or_default())
    } else {
        (body_all, SampleId::default())
    };
    let short = || {
        err(format!(
            "record of type {} is truncated ({size} bytes)",
            header.kind
        ))
    };
    let mut r = Reader::new(body);
    let record = match header.kind {
        PERF_RECORD_MMAP => {
            let (pid, tid) = (r.u32().ok_or_else(short)?, r.u32().ok_or_else(short)?);
            let (addr, len, pgoff) = (
                r.u64().ok_or_else(short)?,
                r.u64().ok_or_else(short)?,
                r.u64().ok_or_else(short)?,
            );
            let filename = r.cstr().ok_or_else(short)?;
            Record::Mmap(Mapping {
                pid,
                tid,
                addr,
                len,
                pgoff,
                maj: 0,
                min: 0,
                ino: 0,
                ino_generation: 0,
                prot: 0,
                flags: 0,
                filename,
            })
        }
        PERF_RECORD_MMAP2 => {
            let (pid, tid) = (r.u32().ok_or_else(short)?, r.u32().ok_or_else(short)?);
            let (addr, len, pgoff) = (
                r.u64().ok_or_else(short)?,
                r.u64().ok_or_else(short)?,
                r.u64().ok_or_else(short)?,
            );
            let (maj, min, ino, ino_generation) =
                if header.misc & PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                    r.take(24).ok_or_else(short)?;
                    (0, 0, 0, 0)
                } else {
                    (
                        r.u32().ok_or_else(short)?,
                        r.u32().ok_or_else(short)?,
                        r.u64().ok_or_else(short)?,
                        r.u64().ok_or_else(short)?,
                    )
                };
            let (prot, flags) = (r.u32().ok_or_else(short)?, r.u32().ok_or_else(short)?);
            let filename = r.cstr().ok_or_else(short)?;
            Record::Mmap2(Mapping {
                pid,
                tid,
                addr,
                len,
                pgoff,
                maj,
                min,
                ino,
                ino_generation,
                prot,
                flags,
                filename,
            })
        }
        PERF_RECORD_COMM => Record::Comm {
            pid: r.u32().ok_or_else(short)?,
            tid: r.u32().ok_or_else(short)?,
            comm: r.cstr().ok_or_else(short)?,
            exec: header.misc & PERF_RECORD_MISC_COMM_EXEC != 0,
        },
        PERF_RECORD_EXIT | PERF_RECORD_FORK => {
            let (pid, ppid, tid, ptid, time) = (
                r.u32().ok_or_else(short)?,
                r.u32().ok_or_else(short)?,
                r.u32().ok_or_else(short)?,
                r.u32().ok_or_else(short)?,
                r.u64().ok_or_else(short)?,
            );
            if header.kind == PERF_RECORD_EXIT {
                Record::Exit {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                }
            } else {
                Record::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                }
            }
        }
        PERF_RECORD_LOST => Record::Lost {
            id: r.u64().ok_or_else(short)?,
            lost: r.u64().ok_or_else(short)?,
        },
        PERF_RECORD_AUX => Record::Aux {
            aux_offset: r.u64().ok_or_else(short)?,
            aux_size: r.u64().ok_or_else(short)?,
            flags: r.u64().ok_or_else(short)?,
        },
        PERF_RECORD_ITRACE_START => Record::ItraceStart {
            pid: r.u32().ok_or_else(short)?,
            tid: r.u32().ok_or_else(short)?,
        },
        PERF_RECORD_SWITCH => Record::Switch {
            out: header.misc & PERF_RECORD_MISC_SWITCH_OUT != 0,
        },
        PERF_RECORD_SWITCH_CPU_WIDE => Record::SwitchCpuWide {
            out: header.misc & PERF_RECORD_MISC_SWITCH_OUT != 0,
            next_prev_pid: r.u32().ok_or_else(short)?,
            next_prev_tid: r.u32().ok_or_else(short)?,
        },
        PERF_RECORD_TEXT_POKE => {
            let (addr, bytes) = crate::code::parse_code_body(body).ok_or_else(short)?;
            Record::TextPoke {
                addr,
                bytes: bytes.to_vec(),
            }
        }
        crate::memory::PERF_RECORD_PTTRACE_MEMORY => {
            crate::memory::body_count(body).map_err(err)?;
            Record::Memory(body.to_vec())
        }
        kind => Record::Other { kind },
    };
    Ok((
        ParsedRecord {
            header,
            record,
            sample,
        },
        size,
    ))
}

/// Iterates over the records of a sideband buffer; yields `(offset, record)`.
/// After the first error it yields that error and stops.
pub struct RecordIter<'a> {
    buf: &'a [u8],
    pos: usize,
    sample_type: u64,
    failed: bool,
}

impl<'a> RecordIter<'a> {
    pub fn new(buf: &'a [u8], sample_type: u64) -> Self {
        RecordIter {
            buf,
            pos: 0,
            sample_type,
            failed: false,
        }
    }
}

impl Iterator for RecordIter<'_> {
    type Item = Result<(usize, ParsedRecord), ParseError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        match parse_record(&self.buf[self.pos..], self.sample_type, self.pos) {
            Ok((rec, size)) => {
                let at = self.pos;
                self.pos += size;
                Some(Ok((at, rec)))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

fn finish_record(
    kind: u32,
    misc: u16,
    body: &[u8],
    sample: &SampleId,
    sample_type: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_SIZE + body.len() + sample_id_size(sample_type));
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&misc.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(body);
    sample.encode(sample_type, &mut out);
    let size = out.len() as u16;
    out[6..8].copy_from_slice(&size.to_le_bytes());
    out
}

fn push_padded_cstr(body: &mut Vec<u8>, s: &str) {
    body.extend_from_slice(s.as_bytes());
    body.push(0);
    while body.len() % 8 != 0 {
        body.push(0);
    }
}

/// Encodes an MMAP2 record (user-mode misc, maj/min/ino form).
pub fn encode_mmap2(m: &Mapping, sample: &SampleId, sample_type: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + m.filename.len());
    body.extend_from_slice(&m.pid.to_le_bytes());
    body.extend_from_slice(&m.tid.to_le_bytes());
    body.extend_from_slice(&m.addr.to_le_bytes());
    body.extend_from_slice(&m.len.to_le_bytes());
    body.extend_from_slice(&m.pgoff.to_le_bytes());
    body.extend_from_slice(&m.maj.to_le_bytes());
    body.extend_from_slice(&m.min.to_le_bytes());
    body.extend_from_slice(&m.ino.to_le_bytes());
    body.extend_from_slice(&m.ino_generation.to_le_bytes());
    body.extend_from_slice(&m.prot.to_le_bytes());
    body.extend_from_slice(&m.flags.to_le_bytes());
    push_padded_cstr(&mut body, &m.filename);
    finish_record(
        PERF_RECORD_MMAP2,
        PERF_RECORD_MISC_USER,
        &body,
        sample,
        sample_type,
    )
}

/// Encodes a COMM record.
pub fn encode_comm(
    pid: u32,
    tid: u32,
    comm: &str,
    exec: bool,
    sample: &SampleId,
    sample_type: u64,
) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&pid.to_le_bytes());
    body.extend_from_slice(&tid.to_le_bytes());
    push_padded_cstr(&mut body, comm);
    let misc = if exec { PERF_RECORD_MISC_COMM_EXEC } else { 0 };
    finish_record(PERF_RECORD_COMM, misc, &body, sample, sample_type)
}

/// Encodes a PERF_RECORD_AUX record.
pub fn encode_aux(
    aux_offset: u64,
    aux_size: u64,
    flags: u64,
    sample: &SampleId,
    sample_type: u64,
) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&aux_offset.to_le_bytes());
    body.extend_from_slice(&aux_size.to_le_bytes());
    body.extend_from_slice(&flags.to_le_bytes());
    finish_record(PERF_RECORD_AUX, 0, &body, sample, sample_type)
}

/// Encodes a PERF_RECORD_LOST record.
pub fn encode_lost(id: u64, lost: u64, sample: &SampleId, sample_type: u64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&id.to_le_bytes());
    body.extend_from_slice(&lost.to_le_bytes());
    finish_record(PERF_RECORD_LOST, 0, &body, sample, sample_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SampleId {
        SampleId {
            pid: Some(10),
            tid: Some(11),
            time: Some(0x1234_5678_9abc),
            id: None,
            stream_id: None,
            cpu: Some(3),
            identifier: Some(77),
        }
    }

    #[test]
    fn aux_record_from_byte_image() {
        // Header (type 11, misc 0, size 8+24+32), body, sample_id (TID TIME CPU IDENTIFIER).
        let mut img = vec![11, 0, 0, 0, 0, 0, 64, 0];
        img.extend_from_slice(&0x2000u64.to_le_bytes());
        img.extend_from_slice(&0x1000u64.to_le_bytes());
        img.extend_from_slice(&(PERF_AUX_FLAG_TRUNCATED | PERF_AUX_FLAG_COLLISION).to_le_bytes());
        img.extend_from_slice(&[10, 0, 0, 0, 11, 0, 0, 0]);
        img.extend_from_slice(&0x1234_5678_9abcu64.to_le_bytes());
        img.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        img.extend_from_slice(&77u64.to_le_bytes());
        assert_eq!(img.len(), 64);
        let (r, size) = parse_record(&img, SIDEBAND_SAMPLE_TYPE, 0).unwrap();
        assert_eq!(size, 64);
        assert_eq!(
            r.record,
            Record::Aux {
                aux_offset: 0x2000,
                aux_size: 0x1000,
                flags: 0x9
            }
        );
        assert_eq!(r.sample, sample());
        assert_eq!(
            encode_aux(0x2000, 0x1000, 9, &sample(), SIDEBAND_SAMPLE_TYPE),
            img
        );
    }

    #[test]
    fn lost_record_from_byte_image() {
        let mut img = vec![2, 0, 0, 0, 0, 0, 56, 0];
        img.extend_from_slice(&5u64.to_le_bytes());
        img.extend_from_slice(&42u64.to_le_bytes());
        img.extend_from_slice(&[10, 0, 0, 0, 11, 0, 0, 0]);
        img.extend_from_slice(&0x1234_5678_9abcu64.to_le_bytes());
        img.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        img.extend_from_slice(&77u64.to_le_bytes());
        let (r, _) = parse_record(&img, SIDEBAND_SAMPLE_TYPE, 0).unwrap();
        assert_eq!(r.record, Record::Lost { id: 5, lost: 42 });
        assert_eq!(encode_lost(5, 42, &sample(), SIDEBAND_SAMPLE_TYPE), img);
    }

    #[test]
    fn mmap2_and_comm_roundtrip_and_iterate() {
        let m = Mapping {
            pid: 1,
            tid: 2,
            addr: 0x7f00_0000_0000,
            len: 0x3000,
            pgoff: 0x1000,
            maj: 8,
            min: 1,
            ino: 99,
            ino_generation: 4,
            prot: 5,
            flags: 2,
            filename: "/usr/lib/libx.so".into(),
        };
        let mut buf = encode_mmap2(&m, &sample(), SIDEBAND_SAMPLE_TYPE);
        assert_eq!(buf.len() % 8, 0);
        buf.extend(encode_comm(
            1,
            2,
            "ls",
            true,
            &sample(),
            SIDEBAND_SAMPLE_TYPE,
        ));
        let recs: Vec<_> = RecordIter::new(&buf, SIDEBAND_SAMPLE_TYPE)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].0, 0);
        assert_eq!(recs[0].1.record, Record::Mmap2(m));
        assert_eq!(
            recs[1].1.record,
            Record::Comm {
                pid: 1,
                tid: 2,
                comm: "ls".into(),
                exec: true
            }
        );
        assert_eq!(recs[1].1.sample.time, Some(0x1234_5678_9abc));
    }

    #[test]
    fn truncated_and_bogus_records_are_errors_with_offsets() {
        let good = encode_lost(1, 1, &sample(), SIDEBAND_SAMPLE_TYPE);
        let mut buf = good.clone();
        buf.extend_from_slice(&good[..20]);
        let items: Vec<_> = RecordIter::new(&buf, SIDEBAND_SAMPLE_TYPE).collect();
        assert_eq!(items.len(), 2);
        let e = items[1].as_ref().unwrap_err();
        assert_eq!(e.offset, good.len());
        assert!(e.to_string().contains("only 20 remain"), "{e}");
        // size smaller than a header
        let e = parse_record(&[2, 0, 0, 0, 0, 0, 4, 0], 0, 8).unwrap_err();
        assert!(e.to_string().contains("0x8"), "{e}");
    }
}
