//! DynamoRIO's per-thread kernel syscall file (`<tid>.raw.pt`): a sequence of PT Data
//! Buffers (PDBs), REFERENCE §5.
//!
//! Every header entry is a little-endian u64: low 59 bits value, high 5 bits type.
//! - first PDB: `[PID, THREAD_ID, PT_METADATA_BOUNDARY(18)]` + the 18-byte `pt_metadata_t`;
//! - one PDB per syscall: `[PID, THREAD_ID, PT_DATA_BOUNDARY, SYSNUM, SYSCALL_IDX,
//!   SYSCALL_ARGS_NUM]` (48 bytes), `args_num` u64 arguments, then the PT bytes. The
//!   boundary value is the PDB's total size `48 + 8*args_num + pt_size`, as DynamoRIO's
//!   writer (and raw2trace) define it.

use std::ops::Range;

use crate::metadata::{PtMetadata, PT_METADATA_SIZE};

pub const PDB_PID: u8 = 0;
pub const PDB_THREAD_ID: u8 = 1;
pub const PDB_PT_METADATA_BOUNDARY: u8 = 2;
pub const PDB_PT_DATA_BOUNDARY: u8 = 3;
pub const PDB_SYSNUM: u8 = 4;
pub const PDB_SYSCALL_IDX: u8 = 5;
pub const PDB_SYSCALL_ARGS_NUM: u8 = 6;

/// Size of a syscall PDB's header (6 entries).
pub const PDB_SYSCALL_HEADER_SIZE: u64 = 48;
const VALUE_MASK: u64 = (1 << 59) - 1;

/// One header entry.
pub fn entry(ty: u8, value: u64) -> u64 {
    (u64::from(ty) << 59) | (value & VALUE_MASK)
}

/// Splits an entry into (type, value).
pub fn split_entry(e: u64) -> (u8, u64) {
    ((e >> 59) as u8, e & VALUE_MASK)
}

/// A problem in a `.raw.pt` file: what and at which byte offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("offset {offset:#x}: {message}")]
pub struct PdbError {
    pub offset: u64,
    pub message: String,
}

fn err(offset: usize, message: impl Into<String>) -> PdbError {
    PdbError {
        offset: offset as u64,
        message: message.into(),
    }
}

/// One syscall window: its header fields and where its PT bytes are in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallPdb {
    pub pid: u64,
    pub tid: u64,
    pub sysnum: u64,
    pub syscall_idx: u64,
    pub args: Vec<u64>,
    /// Byte range of the PT data within the file.
    pub pt: Range<usize>,
}

/// A parsed `.raw.pt` file (the PT bytes stay in the caller's buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPtFile {
    pub pid: u64,
    pub tid: u64,
    pub metadata: PtMetadata,
    pub windows: Vec<SyscallPdb>,
}

fn u64_at(data: &[u8], pos: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(pos..pos + 8)?.try_into().ok()?))
}

/// Reads header entries at `pos`, checking their types.
fn entries(data: &[u8], pos: usize, types: &[u8]) -> Result<Vec<u64>, PdbError> {
    let mut out = Vec::with_capacity(types.len());
    for (k, &want) in types.iter().enumerate() {
        let at = pos + 8 * k;
        let e = u64_at(data, at)
            .ok_or_else(|| err(at, "file ends inside a PDB header (truncated file?)"))?;
        let (ty, value) = split_entry(e);
        if ty != want {
            return Err(err(
                at,
                format!("PDB header entry {k} has type {ty}, expected {want}"),
            ));
        }
        out.push(value);
    }
    Ok(out)
}

/// Parses a whole `.raw.pt` file; any damage is an error.
pub fn parse(data: &[u8]) -> Result<RawPtFile, PdbError> {
    match parse_prefix(data)? {
        (f, None) => Ok(f),
        (_, Some(e)) => Err(e),
    }
}

/// Parses a `.raw.pt` file up to its first damaged PDB: the windows before it, and the
/// damage (`None` when the whole file is good). An error when not even the file header
/// and metadata are readable.
pub fn parse_prefix(data: &[u8]) -> Result<(RawPtFile, Option<PdbError>), PdbError> {
    let h = entries(data, 0, &[PDB_PID, PDB_THREAD_ID, PDB_PT_METADATA_BOUNDARY])?;
    if h[2] != PT_METADATA_SIZE as u64 {
        return Err(err(
            16,
            format!("metadata boundary is {}, expected {PT_METADATA_SIZE}", h[2]),
        ));
    }
    let metadata = PtMetadata::from_bytes(data.get(24..).unwrap_or(&[]))
        .ok_or_else(|| err(24, "file ends inside the 18-byte pt_metadata"))?;
    let mut pos = 24 + PT_METADATA_SIZE;
    let mut windows = Vec::new();
    let damage = loop {
        if pos >= data.len() {
            break None;
        }
        match next_pdb(data, pos) {
            Ok((w, end)) => {
                windows.push(w);
                pos = end;
            }
            Err(e) => break Some(e),
        }
    };
    Ok((
        RawPtFile {
            pid: h_pid(data),
            tid: h_tid(data),
            metadata,
            windows,
        },
        damage,
    ))
}

/// The syscall PDB at `pos` and the offset after it.
fn next_pdb(data: &[u8], pos: usize) -> Result<(SyscallPdb, usize), PdbError> {
    {
        let h = entries(
            data,
            pos,
            &[
                PDB_PID,
                PDB_THREAD_ID,
                PDB_PT_DATA_BOUNDARY,
                PDB_SYSNUM,
                PDB_SYSCALL_IDX,
                PDB_SYSCALL_ARGS_NUM,
            ],
        )?;
        let (boundary, nargs) = (h[2], h[5]);
        let fixed = PDB_SYSCALL_HEADER_SIZE.saturating_add(nargs.saturating_mul(8));
        if boundary < fixed {
            return Err(err(
                pos + 16,
                format!("PDB boundary {boundary} is smaller than its header and {nargs} args"),
            ));
        }
        let end = (pos as u64).saturating_add(boundary);
        if end > data.len() as u64 {
            return Err(err(
                pos + 16,
                format!(
                    "PDB of {boundary} bytes runs past the end of the file ({} bytes left)",
                    data.len() - pos
                ),
            ));
        }
        let args_at = pos + PDB_SYSCALL_HEADER_SIZE as usize;
        let args = (0..nargs as usize)
            .map(|k| u64_at(data, args_at + 8 * k).unwrap_or(0))
            .collect();
        Ok((
            SyscallPdb {
                pid: h[0],
                tid: h[1],
                sysnum: h[3],
                syscall_idx: h[4],
                args,
                pt: pos + fixed as usize..end as usize,
            },
            end as usize,
        ))
    }
}

fn h_pid(data: &[u8]) -> u64 {
    u64_at(data, 0).map_or(0, |e| split_entry(e).1)
}

fn h_tid(data: &[u8]) -> u64 {
    u64_at(data, 8).map_or(0, |e| split_entry(e).1)
}

/// Writes `.raw.pt` files the way DynamoRIO's tracer does.
#[derive(Debug, Default, Clone)]
pub struct PdbWriter {
    pub buf: Vec<u8>,
}

impl PdbWriter {
    /// Starts a file with its metadata PDB.
    pub fn new(pid: u64, tid: u64, metadata: &PtMetadata) -> Self {
        let mut w = PdbWriter { buf: Vec::new() };
        for e in [
            entry(PDB_PID, pid),
            entry(PDB_THREAD_ID, tid),
            entry(PDB_PT_METADATA_BOUNDARY, PT_METADATA_SIZE as u64),
        ] {
            w.buf.extend_from_slice(&e.to_le_bytes());
        }
        w.buf.extend_from_slice(&metadata.to_bytes());
        w
    }

    /// Appends one syscall window.
    pub fn syscall(
        &mut self,
        pid: u64,
        tid: u64,
        sysnum: u64,
        syscall_idx: u64,
        args: &[u64],
        pt: &[u8],
    ) -> &mut Self {
        let boundary = PDB_SYSCALL_HEADER_SIZE + 8 * args.len() as u64 + pt.len() as u64;
        for e in [
            entry(PDB_PID, pid),
            entry(PDB_THREAD_ID, tid),
            entry(PDB_PT_DATA_BOUNDARY, boundary),
            entry(PDB_SYSNUM, sysnum),
            entry(PDB_SYSCALL_IDX, syscall_idx),
            entry(PDB_SYSCALL_ARGS_NUM, args.len() as u64),
        ] {
            self.buf.extend_from_slice(&e.to_le_bytes());
        }
        for a in args {
            self.buf.extend_from_slice(&a.to_le_bytes());
        }
        self.buf.extend_from_slice(pt);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_exact_layout() {
        let md = PtMetadata {
            cpu_family: 6,
            cpu_model: 0x55,
            cpu_stepping: 4,
            time_shift: 10,
            time_mult: 500,
            time_zero: 7,
        };
        let mut w = PdbWriter::new(100, 101, &md);
        w.syscall(100, 101, 0, 5, &[1, 2, 3], &[0xaa; 10]);
        w.syscall(100, 101, 1, 6, &[], &[0xbb; 3]);
        let b = &w.buf;
        assert_eq!(b.len(), 24 + 18 + (48 + 24 + 10) + (48 + 3));
        assert_eq!(&b[0..8], &100u64.to_le_bytes());
        assert_eq!(&b[8..16], &((1u64 << 59) | 101).to_le_bytes());
        assert_eq!(&b[16..24], &((2u64 << 59) | 18).to_le_bytes());
        assert_eq!(&b[24..42], &md.to_bytes());
        // Boundary of the first syscall PDB = 48 + 8*3 + 10.
        assert_eq!(&b[42 + 16..42 + 24], &((3u64 << 59) | 82).to_le_bytes());
        let f = parse(b).unwrap();
        assert_eq!((f.pid, f.tid, f.metadata), (100, 101, md));
        assert_eq!(f.windows.len(), 2);
        assert_eq!(f.windows[0].args, vec![1, 2, 3]);
        assert_eq!(f.windows[0].syscall_idx, 5);
        assert_eq!(&b[f.windows[0].pt.clone()], &[0xaa; 10]);
        assert_eq!(f.windows[1].sysnum, 1);
        assert_eq!(&b[f.windows[1].pt.clone()], &[0xbb; 3]);
        // Truncation and corruption are errors with offsets, never panics.
        for cut in 0..b.len() {
            let _ = parse(&b[..cut]);
        }
        let e = parse(&b[..b.len() - 1]).unwrap_err();
        assert_eq!(e.offset, (42 + 82 + 16) as u64);
        let mut bad = b.clone();
        bad[42 + 23] = 0xff; // boundary type bits
        assert!(parse(&bad).unwrap_err().message.contains("type"));
    }
}
