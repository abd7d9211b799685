//! Decoder: PT + sideband + images -> drmemtrace-style records (libipt). Also available
//! as `drpttracer::decode`.
//!
//! - [`config`]: what describes a trace: CPU identity/frequencies, errata, address filters;
//! - [`errata`]: which errata a CPU has (libipt's list and newer models);
//! - [`image`]: code images (ELF PT_LOAD segments, raw bytes such as the vDSO, kcore) and
//!   symbols (ELF symtab, kallsyms);
//! - [`sideband`]: the image over time from perf MMAP/MMAP2/COMM records;
//! - [`records`]: the output records;
//! - [`runs`]: instruction records as runs of straight-line code (what the call-stack
//!   reconstruction reads), made once per cached block;
//! - [`decoder`]: [`TraceDecoder`], the seam between a decoder of one trace and its
//!   consumers (slices, one record at a time, [`compact`] collections, the oracle check);
//! - [`pipeline`]: [`PtDecoder`], the decoder of one PT window (our own flow
//!   reconstruction, libipt's block decoder where it does not apply; libipt's types stay
//!   in the private `ipt` module);
//! - [`parallel`]: decoding by PSB segments on several threads;
//! - [`testgen`]: synthetic code + trace builder for tests and benchmarks;
//! - [`callstack`]: call-stack reconstruction (nested call spans, stacks for flame graphs).
//!
//! - [`packets`]: ptdump-style packet listing;
//! - [`timing`]: the trace's time as libipt estimates it (the decoder's clock, dump's time
//!   columns);
//! - [`ptt_input`]: the shim's `.info` / `.ptt` files as decoder input.
//!
//! # Using it from other modules
//!
//! One window, everything in memory (the shim / `pttrace report` path):
//!
//! ```no_run
//! use pttrace_decode::{decode_window, ImageSpec, TraceParams, WindowOptions};
//! # fn f(pt: &[u8], sideband: &[u8], md: &pttrace_format::metadata::ExtMetadata) -> Result<(), Box<dyn std::error::Error>> {
//! let params = TraceParams::from_ext_metadata(md); // or ::from_pt_metadata
//! let spec = ImageSpec { vdso: None, sysroot: None, ..Default::default() };
//! let image = spec.load()?; // static images (ELF files, raw bytes, kcore)
//! let opts = WindowOptions { source: "1234.ptt window 3".into(), window_id: Some(3), ..Default::default() };
//! let records = decode_window(pt, Some((sideband, md.sideband_sample_type)), &params, &image, &spec, &opts)?;
//! # Ok(()) }
//! ```
//!
//! Streaming: [`PtDecoder::new`] is an `Iterator<Item = Record>` (its `for_each` takes
//! the fast path) and a [`TraceDecoder`]: `next_slice()` hands out records without
//! copying; `for_each_slice()` does the same from one tight loop (the fastest way to
//! consume a window); `collect_compact()` keeps a whole window cheaply. Large traces:
//! [`parallel::decode_parallel`] / [`parallel::decode_parallel_compact`] give exactly the
//! sequential result. Input containers: [`input`] (raw PT, perf AUXTRACE, DynamoRIO
//! `.raw.pt`, `pttrace run` thread files).

pub mod accesses;
pub mod callstack;
pub mod check;
pub mod compact;
pub mod config;
pub mod decoder;
pub mod errata;
pub mod hex;
pub mod image;
pub mod input;
mod insn;
mod ipt;
pub use ipt::PsbInfo;
pub mod packets;
pub mod parallel;
pub mod pipeline;
pub mod ptt_dir;
pub mod ptt_input;
pub mod records;
pub mod runs;
pub mod sideband;
pub mod testgen;
pub mod timing;
mod wire;

use std::path::{Path, PathBuf};

pub use config::{AddrFilter, CpuParams, Errata, TraceParams};
pub use decoder::{Records, TraceDecoder};
pub use image::{AddressSpace, Symbols};
pub use insn::{decode_insn, InsnInfo};
pub use pipeline::{CompactRecords, DecoderCaches, DecoderKind, PtDecoder, WindowOptions};
pub use records::{ExecMode, Gap, GapKind, InsnClass, Instruction, Record};
pub use sideband::{ImageChange, ImageEvent, ImageResolver};

/// A decoder setup failure. Names the input and the byte offset in it ([`WHOLE_INPUT`]:
/// the failure concerns the whole input, no offset is printed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {}{message}", offset_text(*offset))]
pub struct DecodeError {
    pub source_name: String,
    pub offset: u64,
    pub message: String,
}

/// [`DecodeError::offset`] of a failure that concerns a whole input (cannot open, empty).
pub const WHOLE_INPUT: u64 = u64::MAX;

fn offset_text(offset: u64) -> String {
    match offset {
        WHOLE_INPUT => String::new(),
        o => format!("offset {o:#x}: "),
    }
}

impl DecodeError {
    /// A failure of the whole input `source` (no offset applies).
    pub fn whole(source: impl std::fmt::Display, message: impl Into<String>) -> Self {
        Self::new(source, WHOLE_INPUT, message)
    }

    pub fn new(source: impl std::fmt::Display, offset: u64, message: impl Into<String>) -> Self {
        DecodeError {
            source_name: source.to_string(),
            offset,
            message: message.into(),
        }
    }
}

/// What code to load before decoding.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// ELF files and optional load bases (default: link address).
    pub elfs: Vec<(PathBuf, Option<u64>)>,
    /// Raw bytes at an address (name, bytes, address), e.g. a saved vDSO.
    pub raw: Vec<(String, Vec<u8>, u64)>,
    /// kcore copy (ELF with kernel text PT_LOAD segments).
    pub kcore: Option<PathBuf>,
    /// Prefix for the paths named by sideband MMAP records.
    pub sysroot: Option<PathBuf>,
    /// vDSO bytes for sideband `[vdso]` mappings.
    pub vdso: Option<Vec<u8>>,
}

impl ImageSpec {
    /// Loads the static part of the image (ELF files, raw bytes, kcore).
    pub fn load(&self) -> Result<AddressSpace, DecodeError> {
        let mut space = AddressSpace::new();
        if let Some(k) = &self.kcore {
            space.add_kcore(k)?;
        }
        for (path, base) in &self.elfs {
            space.add_elf(path, *base)?;
        }
        for (name, bytes, addr) in &self.raw {
            space.add_bytes(name, bytes.clone(), *addr);
        }
        Ok(space)
    }

    /// Resolver for sideband file names.
    pub fn resolver(&self) -> ImageResolver {
        ImageResolver::new(self.sysroot.clone(), self.vdso.clone())
    }
}

/// Decodes one window: `pt` (raw PT packets), optional sideband (raw perf records with
/// their `sample_type`), CPU/time parameters and a loaded image. Decode errors inside the
/// trace become [`Record::Gap`]s; only unusable inputs (bad sideband, no decoder) fail.
pub fn decode_window(
    pt: &[u8],
    sideband: Option<(&[u8], u64)>,
    params: &TraceParams,
    image: &AddressSpace,
    spec: &ImageSpec,
    opts: &WindowOptions,
) -> Result<Vec<Record>, DecodeError> {
    let events = match sideband {
        Some((sb, sample_type)) => {
            sideband::parse_records(&format!("{} (sideband)", opts.source), sb, sample_type)?
        }
        None => Vec::new(),
    };
    let dec = PtDecoder::new(
        pt,
        *params,
        image.clone(),
        events,
        spec.resolver(),
        opts.clone(),
    )?;
    Ok(dec.collect())
}

/// Reads a whole input file, naming it in the error.
pub fn read_input(path: &Path) -> Result<Vec<u8>, DecodeError> {
    std::fs::read(path).map_err(|e| DecodeError::whole(path.display(), format!("cannot read: {e}")))
}
