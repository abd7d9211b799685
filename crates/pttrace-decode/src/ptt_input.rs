//! Decoding the shim's own files (`<base>.info` + `<base>-<tid>.ptt`, see
//! [`pttrace_format::ptt`]): CPU/time parameters from the `Metadata` record, the initial
//! image from the `Maps` text (as MMAP2 events before the trace) and the saved vDSO.

use std::path::{Path, PathBuf};

use super::config::{CpuParams, TraceParams};
use super::sideband::{parse_records, ImageEvent};
use super::DecodeError;
use pttrace_format::maps::{encode_exec_mappings, MapsEntry};
use pttrace_format::metadata::{PtMetadata, TimeConv};
use pttrace_format::perf_record::SIDEBAND_SAMPLE_TYPE;
use pttrace_format::ptt::{self, FileKind, RecordType, Tail, ThreadHeader};
use pttrace_format::spool::{self, Recovered};

/// What the process info file tells the decoder.
#[derive(Debug, Clone, Default)]
pub struct PttProcess {
    pub params: TraceParams,
    /// `sample_type` of the windows' sideband records.
    pub sideband_sample_type: u64,
    /// The mappings when tracing began, as image events at time 0.
    pub initial_events: Vec<ImageEvent>,
    /// (load address, bytes) of the vDSO.
    pub vdso: Option<(u64, Vec<u8>)>,
    /// (pid, image nonce) from the `Process` record: which thread files belong to it.
    pub identity: Option<(i32, u64)>,
}

/// One window of a thread file: its PT and sideband, and where the PT starts in the file.
#[derive(Debug, Clone)]
pub struct PttWindow<'a> {
    pub window: ptt::Window,
    pub pt: &'a [u8],
    pub sideband: &'a [u8],
    /// File offset of the first PT byte (gap offsets become file offsets).
    pub pt_file_offset: u64,
}

/// The info file that belongs to thread file `<base>-<tid>.ptt`: `<base>.info`.
pub fn info_path_for(thread_file: &Path) -> Option<PathBuf> {
    let name = thread_file.file_name()?.to_str()?;
    let stem = name.strip_suffix(".ptt")?;
    let (base, tid) = stem.rsplit_once('-')?;
    tid.parse::<u64>().ok()?;
    Some(thread_file.with_file_name(format!("{base}.info")))
}

/// Reads a process info file.
pub fn read_process(name: &str, data: &[u8]) -> Result<PttProcess, DecodeError> {
    let f = ptt::parse(name, data).map_err(|e| DecodeError::new(name, 0, e.to_string()))?;
    if f.kind != FileKind::ProcessInfo {
        return Err(DecodeError::new(
            name,
            12,
            "not a process info (.info) file",
        ));
    }
    let mut out = PttProcess::default();
    let mut pid = 0u32;
    for fr in &f.frames {
        let bad = |what: &str| {
            DecodeError::new(name, fr.offset as u64, format!("malformed {what} record"))
        };
        match RecordType::from_raw(fr.ty) {
            Some(RecordType::Process) => {
                let r = ptt::decode_process(fr.payload).ok_or_else(|| bad("Process"))?;
                pid = r.pid as u32;
                out.identity = Some((r.pid, r.nonce));
            }
            Some(RecordType::Metadata) => {
                let p = fr.payload;
                let md = PtMetadata::from_bytes(p).ok_or_else(|| bad("Metadata"))?;
                let u32_at = |o: usize| {
                    p.get(o..o + 4)
                        .and_then(|b| b.try_into().ok())
                        .map(u32::from_le_bytes)
                };
                let u64_at = |o: usize| {
                    p.get(o..o + 8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes)
                };
                let (eax, ebx) = (
                    u32_at(18).ok_or_else(|| bad("Metadata"))?,
                    u32_at(22).ok_or_else(|| bad("Metadata"))?,
                );
                let (nom, mtc, tz_valid) = (
                    *p.get(26).ok_or_else(|| bad("Metadata"))?,
                    *p.get(27).ok_or_else(|| bad("Metadata"))?,
                    *p.get(28).ok_or_else(|| bad("Metadata"))? != 0,
                );
                out.sideband_sample_type = u64_at(42).ok_or_else(|| bad("Metadata"))?;
                let mut params = TraceParams::from_pt_metadata(&md);
                params.cpu = CpuParams {
                    mtc_freq: mtc,
                    nom_freq: nom,
                    cpuid_0x15_eax: eax,
                    cpuid_0x15_ebx: ebx,
                    ..params.cpu
                };
                let (shift, mult, zero) = (md.time_shift, md.time_mult, md.time_zero);
                params.time = (tz_valid && mult != 0).then_some(TimeConv {
                    time_shift: shift,
                    time_mult: mult,
                    time_zero: zero,
                });
                out.params = params;
            }
            Some(RecordType::Maps) => {
                let text = String::from_utf8_lossy(fr.payload);
                let maps: Vec<MapsEntry> = text.lines().filter_map(MapsEntry::parse).collect();
                let sb = encode_exec_mappings(&maps, pid, pid, SIDEBAND_SAMPLE_TYPE, 0);
                out.initial_events = parse_records(name, &sb, SIDEBAND_SAMPLE_TYPE)?;
            }
            Some(RecordType::Vdso) => {
                let (addr, bytes) = ptt::decode_vdso(fr.payload).ok_or_else(|| bad("Vdso"))?;
                out.vdso = Some((addr, bytes.to_vec()));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A thread file as read for decoding: its bytes with the spool beside it (if any) merged
/// (see [`pttrace_format::spool`]).
#[derive(Debug, Clone)]
pub struct ThreadInput {
    pub data: Vec<u8>,
    /// Damage in the file's own frames. A tail torn by the death of the process is not
    /// damage when a spool completed the file (the torn window is among the recovered).
    pub tail: Tail,
    /// What the spool gave: merged now, or salvaged into the file earlier.
    pub recovered: Option<Recovered>,
    /// The file's `ThreadHeader`.
    pub header: Option<ThreadHeader>,
}

/// Reads thread file `path` with its spool merged.
pub fn read_thread(path: &Path) -> Result<ThreadInput, DecodeError> {
    let name = path.display().to_string();
    let (data, rec) =
        spool::read_thread_file(path).map_err(|e| DecodeError::new(&name, 0, e.to_string()))?;
    let f = ptt::parse(&name, &data).map_err(|e| DecodeError::new(&name, 0, e.to_string()))?;
    if f.kind != FileKind::Thread {
        return Err(DecodeError::new(&name, 12, "not a thread (.ptt) file"));
    }
    let mut header = None;
    let mut recovered = None;
    for fr in &f.frames {
        match RecordType::from_raw(fr.ty) {
            Some(RecordType::ThreadHeader) if header.is_none() => {
                header = ptt::decode_thread_header(fr.payload)
            }
            Some(RecordType::Recovered) => recovered = Recovered::decode(fr.payload),
            _ => {}
        }
    }
    let tail = match &rec {
        Some(r) if matches!(r.file_tail, Tail::Truncated { .. }) => Tail::Clean,
        Some(r) => r.file_tail.clone(),
        None => f.tail.clone(),
    };
    Ok(ThreadInput {
        data,
        tail,
        recovered,
        header,
    })
}

/// The windows of a thread file (frames that do not parse are skipped; a damaged tail is
/// reported by [`ptt::parse`]'s `tail`, which the caller may show).
pub fn read_windows<'a>(name: &str, data: &'a [u8]) -> Result<Vec<PttWindow<'a>>, DecodeError> {
    let f = ptt::parse(name, data).map_err(|e| DecodeError::new(name, 0, e.to_string()))?;
    if f.kind != FileKind::Thread {
        return Err(DecodeError::new(name, 12, "not a thread (.ptt) file"));
    }
    let mut out = Vec::new();
    for fr in &f.frames {
        if RecordType::from_raw(fr.ty) != Some(RecordType::Window) {
            continue;
        }
        let Some(w) = ptt::decode_window(fr.payload) else {
            return Err(DecodeError::new(
                name,
                fr.offset as u64,
                "malformed Window record",
            ));
        };
        // Frame header is 8 bytes, then the fixed window fields.
        let pt_file_offset = (fr.offset + 8 + ptt::WINDOW_FIXED_SIZE) as u64;
        out.push(PttWindow {
            window: w.window,
            pt: w.pt,
            sideband: w.sideband,
            pt_file_offset,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_path_from_thread_path() {
        assert_eq!(
            info_path_for(Path::new("/t/prog-12-abc-345.ptt")),
            Some(PathBuf::from("/t/prog-12-abc.info"))
        );
        assert_eq!(info_path_for(Path::new("/t/x.pt")), None);
    }
}
