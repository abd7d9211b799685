//! Whole-file summaries of trace files (used by `pttrace report` and `pttrace run`): a
//! thread file with its spool (see [`crate::spool`]) merged, and a process info file.

use crate::ptt::{
    decode_clock, decode_dropped, decode_end, decode_patched_sites, decode_process,
    decode_process_end, decode_thread_files, decode_thread_header, decode_vdso, decode_window,
    parse, stream_frames, FileKind, FormatError, Frame, ParsedFile, ProcessRecord, RecordType,
    Tail, ThreadHeader, WF_CAPTURE_ERROR, WF_FORK_CHILD, WF_NO_SYSCALL, WF_PT_DROPPED, WF_PT_LOST,
    WF_PT_OVERFLOW, WF_SIDEBAND_LOST, WF_VFORK_CHILD,
};
use crate::snapshot::SnapshotRecord;
use crate::spool::{self, Recovered};
use std::path::Path;

/// Summary of one thread file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSummary {
    pub file: String,
    pub header: Option<ThreadHeader>,
    pub windows: u64,
    pub pt_bytes: u64,
    pub sideband_bytes: u64,
    /// Windows with any of the loss flags (PT lost, sideband lost, PT dropped, capture error).
    pub lossy_windows: u64,
    /// Of those, windows whose PT holds OVF packets of the backend (`WF_PT_OVERFLOW`).
    pub overflow_windows: u64,
    /// Windows the shim dropped under backpressure (from `Dropped` records).
    pub dropped: u64,
    /// Windows made by a vfork-style child before its exec (`WF_VFORK_CHILD`).
    pub vfork_child_windows: u64,
    /// Per syscall number: count.
    pub per_syscall: std::collections::BTreeMap<u64, u64>,
    pub end: Option<(u32, u64, u64)>,
    /// How the file's own frames end (a tail torn by SIGKILL is superseded by the spool).
    pub tail: Tail,
    /// What the thread's spool gave (windows, unreturned syscalls): from a `Recovered`
    /// record, salvaged into the file or merged in memory from a `.spool` beside it.
    pub recovered: Option<Recovered>,
    /// The spool was merged in memory (it is still beside the file, not salvaged).
    pub spool_pending: bool,
    /// The file's length in bytes.
    pub file_len: u64,
    /// Windows whose index does not follow the previous one (windows missing in between).
    pub index_gaps: u64,
    /// The first jump: (byte offset of the window's frame, index expected, index found).
    pub first_index_gap: Option<(u64, u64, u64)>,
    /// The index the next window should have (`u64::MAX` after a `Snapshot` record: the
    /// windows discarded from the ring before it are no gap).
    pub next_index: u64,
    /// `Snapshot` records (snapshot mode), in order.
    pub snapshots: Vec<SnapshotRecord>,
    /// The spool merged in memory adds windows that do not follow each other or the
    /// file's last one: (the spool's path, byte offset of the entry, index expected, index
    /// found) -- a lost or damaged entry ([`spool::first_gap`]).
    pub spool_gap: Option<(String, u64, u64, u64)>,
    /// The spool's entries whose window fails its check: (spool, first entry's byte,
    /// count); their windows are left out.
    pub spool_corrupt: Option<(String, u64, usize)>,
}

/// Reads and summarizes a thread file, frame by frame (memory bounded by the largest
/// frame, not by the file: a QEMU trace can be gigabytes), with its spool merged when one
/// is beside it (then the file is read whole: only the shim writes spools, and its files
/// hold syscall windows).
pub fn summarize_thread(path: &Path) -> Result<ThreadSummary, FormatError> {
    let name = path.display().to_string();
    let mut s = ThreadSummary {
        file: name.clone(),
        header: None,
        windows: 0,
        pt_bytes: 0,
        sideband_bytes: 0,
        lossy_windows: 0,
        overflow_windows: 0,
        dropped: 0,
        vfork_child_windows: 0,
        per_syscall: Default::default(),
        end: None,
        tail: Tail::Clean,
        recovered: None,
        spool_pending: false,
        file_len: std::fs::metadata(path).map_or(0, |m| m.len()),
        index_gaps: 0,
        first_index_gap: None,
        next_index: 0,
        snapshots: Vec::new(),
        spool_gap: None,
        spool_corrupt: None,
    };
    if spool::path_for(path).exists() {
        let (data, rec) = spool::read_thread_file(path)?;
        if let Some(r) = rec {
            let parsed = parse(&name, &data)?;
            for f in &parsed.frames {
                // The recovered windows (after `keep`): their order is the spool's to check.
                let gaps = (s.index_gaps, s.first_index_gap);
                summarize_thread_frame(&name, &mut s, f)?;
                if f.offset >= r.keep {
                    (s.index_gaps, s.first_index_gap) = gaps;
                }
            }
            let spool_name = spool::path_for(path).display().to_string();
            if let Some(&first) = r.corrupt.first() {
                // A damaged entry's window is left out: the gap after it is its doing.
                s.spool_corrupt = Some((spool_name, first, r.corrupt.len()));
            } else {
                s.spool_gap = r.gap.map(|(at, want, got)| (spool_name, at, want, got));
            }
            s.tail = r.file_tail;
            s.spool_pending = true;
            return Ok(s);
        }
    }
    s.tail = stream_frames(path, FileKind::Thread, |f| {
        summarize_thread_frame(&name, &mut s, f)
    })?;
    Ok(s)
}

/// Reads `path`, checks that it is a file of `kind` and hands its frames to `f`.
fn with_file_of_kind<T>(
    path: &Path,
    kind: FileKind,
    f: impl FnOnce(String, ParsedFile<'_>) -> Result<T, FormatError>,
) -> Result<T, FormatError> {
    let name = path.display().to_string();
    let data = std::fs::read(path).map_err(|e| FormatError::Record {
        path: name.clone(),
        offset: 0,
        what: format!("cannot read: {e}"),
    })?;
    let parsed = parse(&name, &data)?;
    if parsed.kind != kind {
        let expected = match kind {
            FileKind::ProcessInfo => "a process info file (kind 1)",
            FileKind::Thread => "a thread file (kind 2)",
        };
        return Err(FormatError::Record {
            path: name,
            offset: 12,
            what: format!("expected {expected}"),
        });
    }
    f(name, parsed)
}

fn summarize_thread_frame(
    name: &str,
    s: &mut ThreadSummary,
    f: &Frame<'_>,
) -> Result<(), FormatError> {
    let bad = |f: &Frame<'_>, what: &str| FormatError::Record {
        path: name.to_string(),
        offset: f.offset,
        what: what.to_string(),
    };
    match RecordType::from_raw(f.ty) {
        Some(RecordType::ThreadHeader) => {
            s.header =
                Some(decode_thread_header(f.payload).ok_or_else(|| bad(f, "short ThreadHeader"))?)
        }
        Some(RecordType::Window) => {
            let w = decode_window(f.payload).ok_or_else(|| bad(f, "malformed Window"))?;
            s.windows += 1;
            if w.window.index != s.next_index && s.next_index != u64::MAX {
                s.index_gaps += 1;
                s.first_index_gap
                    .get_or_insert((f.offset as u64, s.next_index, w.window.index));
            }
            s.next_index = w.window.index.wrapping_add(1);
            s.pt_bytes += w.pt.len() as u64;
            s.sideband_bytes += w.sideband.len() as u64;
            if w.window.flags
                & (WF_PT_LOST
                    | WF_SIDEBAND_LOST
                    | WF_PT_DROPPED
                    | WF_CAPTURE_ERROR
                    | WF_PT_OVERFLOW)
                != 0
            {
                s.lossy_windows += 1;
            }
            if w.window.flags & WF_PT_OVERFLOW != 0 {
                s.overflow_windows += 1;
            }
            if w.window.flags & WF_VFORK_CHILD != 0 {
                s.vfork_child_windows += 1;
            }
            // A fork child's own record of the fork is the parent's syscall, counted
            // there; windows cut without a syscall have none.
            if w.window.flags & (WF_NO_SYSCALL | WF_FORK_CHILD) == 0 {
                *s.per_syscall.entry(w.window.nr).or_default() += 1;
            }
        }
        Some(RecordType::Dropped) => {
            let (n, _) = decode_dropped(f.payload).ok_or_else(|| bad(f, "short Dropped"))?;
            s.dropped = s.dropped.saturating_add(n);
        }
        Some(RecordType::Recovered) => {
            s.recovered =
                Some(Recovered::decode(f.payload).ok_or_else(|| bad(f, "malformed Recovered"))?)
        }
        Some(RecordType::End) => {
            s.end = Some(decode_end(f.payload).ok_or_else(|| bad(f, "short End"))?)
        }
        Some(RecordType::Snapshot) => {
            s.snapshots
                .push(SnapshotRecord::decode(f.payload).ok_or_else(|| bad(f, "short Snapshot"))?);
            s.next_index = u64::MAX;
        }
        _ => {}
    }
    Ok(())
}

/// Summary of one process info file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSummary {
    pub file: String,
    pub process: Option<ProcessRecord>,
    pub cmdline: Vec<String>,
    pub exe: String,
    pub maps_lines: usize,
    /// Distinct files of its file-backed mappings (absolute paths), in map order.
    pub mapped_files: Vec<String>,
    pub vdso_bytes: usize,
    pub has_metadata: bool,
    pub config: String,
    pub end: Option<(u32, i32)>,
    pub patched_sites: u64,
    /// The `ProcessEnd` record's offset and its count of thread files created for the
    /// image (`None`: not counted).
    pub thread_files: Option<(u64, u64)>,
    pub clocks: Vec<(u64, u64)>,
    /// `Note` records, in order.
    pub notes: Vec<String>,
    pub tail: Tail,
    /// The file's length in bytes.
    pub file_len: u64,
}

/// Reads and summarizes a process info file.
pub fn summarize_process(path: &Path) -> Result<ProcessSummary, FormatError> {
    let mut p = with_file_of_kind(path, FileKind::ProcessInfo, summarize_process_frames)?;
    p.file_len = std::fs::metadata(path).map_or(0, |m| m.len());
    Ok(p)
}

fn summarize_process_frames(
    name: String,
    parsed: ParsedFile<'_>,
) -> Result<ProcessSummary, FormatError> {
    let mut s = ProcessSummary {
        file: name.clone(),
        process: None,
        cmdline: Vec::new(),
        exe: String::new(),
        maps_lines: 0,
        mapped_files: Vec::new(),
        vdso_bytes: 0,
        has_metadata: false,
        config: String::new(),
        end: None,
        patched_sites: 0,
        thread_files: None,
        clocks: Vec::new(),
        notes: Vec::new(),
        tail: parsed.tail.clone(),
        file_len: 0,
    };
    for f in &parsed.frames {
        match RecordType::from_raw(f.ty) {
            Some(RecordType::Process) => s.process = decode_process(f.payload),
            Some(RecordType::Note) => s
                .notes
                .push(String::from_utf8_lossy(f.payload).into_owned()),
            Some(RecordType::Cmdline) => {
                s.cmdline = f
                    .payload
                    .split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            }
            Some(RecordType::Exe) => s.exe = String::from_utf8_lossy(f.payload).into_owned(),
            Some(RecordType::Maps) => {
                s.maps_lines = f.payload.split(|&b| b == b'\n').count() - 1;
                let text = String::from_utf8_lossy(f.payload);
                for m in text.lines().filter_map(crate::maps::MapsEntry::parse) {
                    if m.path.starts_with('/') && !s.mapped_files.contains(&m.path) {
                        s.mapped_files.push(m.path);
                    }
                }
            }
            Some(RecordType::Vdso) => {
                s.vdso_bytes = decode_vdso(f.payload).map_or(0, |(_, b)| b.len())
            }
            Some(RecordType::Metadata) => s.has_metadata = f.payload.len() >= 18,
            Some(RecordType::Config) => s.config = String::from_utf8_lossy(f.payload).into_owned(),
            Some(RecordType::ProcessEnd) => {
                s.end = decode_process_end(f.payload);
                s.patched_sites = decode_patched_sites(f.payload);
                s.thread_files = decode_thread_files(f.payload).map(|n| (f.offset as u64, n));
            }
            Some(RecordType::Clock) => {
                if let Some(c) = decode_clock(f.payload) {
                    s.clocks.push(c)
                }
            }
            _ => {}
        }
    }
    Ok(s)
}
