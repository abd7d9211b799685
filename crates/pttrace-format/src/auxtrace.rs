//! PT wrapped in perf.data-style `PERF_RECORD_AUXTRACE` records (type 71).
//!
//! Each AUXTRACE record is a 48-byte header (perf_event_header; u64 size, offset,
//! reference; u32 idx, tid, cpu, reserved) followed by `size` bytes of PT that are not
//! counted in the header's own size. Other records in the stream are skipped. A file that
//! starts with perf.data's `PERFILE2` header is read from its data section.

/// `PERF_RECORD_AUXTRACE`.
pub const PERF_RECORD_AUXTRACE: u32 = 71;
/// Size of the AUXTRACE record header.
pub const AUXTRACE_HEADER_SIZE: usize = 48;

/// One AUXTRACE record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxChunk {
    /// Offset of the PT payload in the file.
    pub file_offset: usize,
    pub len: usize,
    /// Offset of the payload within the AUX area's stream.
    pub aux_offset: u64,
    pub idx: u32,
    pub tid: u32,
    pub cpu: u32,
}

/// The PT of an AUXTRACE file, unwrapped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuxTrace {
    /// Concatenated payloads.
    pub pt: Vec<u8>,
    pub chunks: Vec<AuxChunk>,
}

impl AuxTrace {
    /// The file offset of byte `pt_offset` of [`pt`](Self::pt).
    pub fn file_offset(&self, pt_offset: u64) -> Option<u64> {
        let mut at = 0u64;
        for c in &self.chunks {
            let len = c.len as u64;
            if pt_offset < at + len {
                return Some(c.file_offset as u64 + (pt_offset - at));
            }
            at += len;
        }
        None
    }

    /// The CPU of the first chunk (for a Cpu marker), when all chunks agree.
    pub fn cpu(&self) -> Option<u32> {
        let first = self.chunks.first()?.cpu;
        self.chunks.iter().all(|c| c.cpu == first).then_some(first)
    }
}

/// A problem in an AUXTRACE stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("offset {offset:#x}: {message}")]
pub struct AuxError {
    pub offset: u64,
    pub message: String,
}

fn u32_at(d: &[u8], p: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(p..p + 4)?.try_into().ok()?))
}

fn u64_at(d: &[u8], p: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(p..p + 8)?.try_into().ok()?))
}

/// Strips the AUXTRACE wrappers.
pub fn unwrap(data: &[u8]) -> Result<AuxTrace, AuxError> {
    match unwrap_prefix(data) {
        (a, None) => Ok(a),
        (_, Some(e)) => Err(e),
    }
}

/// Like [`unwrap`], but keeps the PT of the records before the first damaged one: the PT
/// found and the damage (`None` when the whole stream is good).
pub fn unwrap_prefix(data: &[u8]) -> (AuxTrace, Option<AuxError>) {
    let mut out = AuxTrace::default();
    let e = unwrap_into(data, &mut out).err();
    (out, e)
}

fn unwrap_into(data: &[u8], out: &mut AuxTrace) -> Result<(), AuxError> {
    let bad = |offset: usize, message: String| AuxError {
        offset: offset as u64,
        message,
    };
    let (mut pos, end) = if data.starts_with(b"PERFILE2") {
        let off = u64_at(data, 40).ok_or_else(|| bad(40, "perf.data header truncated".into()))?;
        let size = u64_at(data, 48).ok_or_else(|| bad(48, "perf.data header truncated".into()))?;
        if off > data.len() as u64 {
            return Err(bad(
                40,
                format!(
                    "perf.data data section offset {off} is past the end of the file ({} bytes)",
                    data.len()
                ),
            ));
        }
        let end = off.saturating_add(size).min(data.len() as u64);
        (off as usize, end as usize)
    } else {
        (0, data.len())
    };
    while pos + 8 <= end {
        let ty = u32_at(data, pos).unwrap_or(0);
        let size = usize::from(u16::from_le_bytes([data[pos + 6], data[pos + 7]]));
        if size < 8 || pos + size > end {
            return Err(bad(
                pos,
                format!("perf record (type {ty}) of size {size} does not fit the stream"),
            ));
        }
        if ty == PERF_RECORD_AUXTRACE {
            if size < AUXTRACE_HEADER_SIZE {
                return Err(bad(pos, format!("AUXTRACE record of size {size} < 48")));
            }
            let len = u64_at(data, pos + 8).unwrap_or(0);
            let payload = pos + size;
            let len_us = usize::try_from(len).unwrap_or(usize::MAX);
            if payload.saturating_add(len_us) > end {
                return Err(bad(
                    pos,
                    format!(
                        "AUXTRACE payload of {len} bytes runs past the end ({} bytes left)",
                        end - payload
                    ),
                ));
            }
            out.pt.extend_from_slice(&data[payload..payload + len_us]);
            out.chunks.push(AuxChunk {
                file_offset: payload,
                len: len_us,
                aux_offset: u64_at(data, pos + 16).unwrap_or(0),
                idx: u32_at(data, pos + 32).unwrap_or(0),
                tid: u32_at(data, pos + 36).unwrap_or(0),
                cpu: u32_at(data, pos + 40).unwrap_or(0),
            });
            pos = payload + len_us;
        } else {
            pos += size;
        }
    }
    Ok(())
}

/// Wraps `pt` into AUXTRACE records of at most `chunk` bytes each (tests and tools).
pub fn wrap(pt: &[u8], chunk: usize, tid: u32, cpu: u32) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(pt.len() + AUXTRACE_HEADER_SIZE * (pt.len() / chunk.max(1) + 1));
    let mut aux_off = 0u64;
    for piece in pt.chunks(chunk.max(1)) {
        out.extend_from_slice(&PERF_RECORD_AUXTRACE.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(AUXTRACE_HEADER_SIZE as u16).to_le_bytes());
        out.extend_from_slice(&(piece.len() as u64).to_le_bytes());
        out.extend_from_slice(&aux_off.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // reference
        out.extend_from_slice(&0u32.to_le_bytes()); // idx
        out.extend_from_slice(&tid.to_le_bytes());
        out.extend_from_slice(&cpu.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(piece);
        aux_off += piece.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_unwrap_with_foreign_records() {
        let pt: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut data = vec![];
        // A foreign 16-byte record first (type 3 COMM, say).
        data.extend_from_slice(&3u32.to_le_bytes());
        data.extend_from_slice(&0u16.to_le_bytes());
        data.extend_from_slice(&16u16.to_le_bytes());
        data.extend_from_slice(&[0u8; 8]);
        data.extend(wrap(&pt, 300, 42, 3));
        let a = unwrap(&data).unwrap();
        assert_eq!(a.pt, pt);
        assert_eq!(a.chunks.len(), 4);
        assert_eq!(a.chunks[1].aux_offset, 300);
        assert_eq!((a.chunks[0].tid, a.cpu()), (42, Some(3)));
        assert_eq!(a.file_offset(0), Some(16 + 48));
        assert_eq!(a.file_offset(300), Some(16 + 48 + 300 + 48));
        for cut in 0..data.len() {
            let _ = unwrap(&data[..cut]);
        }
        assert!(unwrap(&data[..100]).is_err());
    }
}
