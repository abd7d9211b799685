//! Helpers shared by the fuzz targets: a fixed code image, a scratch directory for the
//! readers that take a path, pttrace files made from frame lists (valid CRCs), and the
//! invariants every reader's result must keep.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pttrace_decode::testgen::LoopProgram;
use pttrace_decode::{AddressSpace, Record};
use pttrace_format::ptt::{self, FileKind};

/// The image PT is decoded against: the test generator's loop program at 0x40_0000.
pub fn loop_image() -> &'static AddressSpace {
    static SPACE: OnceLock<AddressSpace> = OnceLock::new();
    SPACE.get_or_init(|| {
        let prog = LoopProgram::new(0x40_0000);
        let mut space = AddressSpace::new();
        space.add_bytes("loop", prog.code, prog.base);
        space
    })
}

/// A valid trace of the loop program (for targets that fuzz the parameters, not the PT).
pub fn loop_trace() -> &'static [u8] {
    static TRACE: OnceLock<Vec<u8>> = OnceLock::new();
    TRACE.get_or_init(|| LoopProgram::new(0x40_0000).trace(300, 150, 1).0)
}

/// This process's scratch directory (one per fuzzing process: parallel jobs do not share).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("pttrace-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the scratch directory");
        d
    })
}

/// Writes `data` to `name` in the scratch directory and returns its path.
pub fn write_scratch(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch_dir().join(name);
    std::fs::write(&p, data).expect("write a scratch file");
    p
}

/// Every gap of `recs` lies inside `len` bytes of input named `source`.
pub fn check_gaps(recs: &[Record], source: &str, len: u64) {
    for r in recs {
        if let Record::Gap(g) = r {
            assert!(g.pt_offset <= len, "{g} beyond {len}");
            assert!(g.source.starts_with(source), "{g}");
        }
    }
}

/// The first byte picks one of `n` variants; the rest is the input.
pub fn split_selector(data: &[u8], n: usize) -> Option<(usize, &[u8])> {
    let (&first, rest) = data.split_first()?;
    Some((usize::from(first) % n, rest))
}

/// `data` as a pttrace file of `kind`: as is when it starts with the file magic; else read
/// as a list of frames (u16 type, u16 payload length, payload; the last frame takes what is
/// left) and written as a file with valid CRCs, so that the fuzzer reaches the record
/// decoders behind the CRC.
pub fn ptt_input(kind: FileKind, data: &[u8]) -> Cow<'_, [u8]> {
    if data.starts_with(&ptt::MAGIC) {
        return Cow::Borrowed(data);
    }
    let mut file = ptt::encode_header(kind).to_vec();
    let mut rest = data;
    while let Some((head, tail)) = rest.split_first_chunk::<4>() {
        let ty = u16::from_le_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_le_bytes([head[2], head[3]])).min(tail.len());
        let (payload, next) = tail.split_at(len);
        let start = file.len();
        file.extend_from_slice(&(len as u32).to_le_bytes());
        file.extend_from_slice(&ty.to_le_bytes());
        file.extend_from_slice(&0u16.to_le_bytes());
        file.extend_from_slice(payload);
        let crc = ptt::crc32(&file[start..]);
        file.extend_from_slice(&crc.to_le_bytes());
        rest = next;
    }
    Cow::Owned(file)
}
