//! Spool files: what a traced thread has done but not yet written to its `.ptt` file, kept
//! where SIGKILL cannot take it away.
//!
//! The LD_PRELOAD shim queues each completed window in memory for its writer thread. A
//! process killed by SIGKILL runs no code of ours afterwards, so that queue, and the
//! syscall the thread was in, would vanish. The queue therefore lives in a `MAP_SHARED`
//! mapping of `<pid>-<nonce>-<tid>.spool` beside the thread's `.ptt`: the kernel keeps
//! every store to it in the page cache when the process dies. The writer releases a queue
//! entry only after the window's frame is in the `.ptt`, and the spool is deleted once the
//! thread's `End` record is written. A spool beside a `.ptt` thus means the process died
//! (or is still running), and its published entries are the windows the `.ptt` may lack.
//!
//! Readers ([`read_thread_file`], [`crate::summary::summarize_thread`]) merge a spool in
//! memory; [`salvage`] (used by `pttrace run` once the process is gone) appends the
//! recovered frames to the `.ptt` for good and deletes the spool.
//!
//! # Layout (little-endian; written by the shim with plain stores: a process death cannot
//! tear a store, and every entry is published by its sequence number; each entry's window
//! carries a CRC-32 so that damage after the fact is seen)
//!
//! ```text
//! 0     "PTTSPOOL"            written last when the spool is set up (zero: not ready)
//! 8     u32 version (=2)      12  u32 entry size (=112)
//! 16    u64 capacity          (a power of two >= 2)
//! 24    i32 pid               28  i32 tid
//! 32    u64 nonce             40  u64 start_tsc       (as in the ThreadHeader)
//! 48    u64 dropped           windows dropped under `PTTRACER_BACKPRESSURE=drop` (total)
//! 56    u64 flags             bit 0: a syscall nested deeper than 16 levels went untracked
//! 64    u8 mode, u8 window, u8 backend, u8 pt_present, u32 reserved
//! 128   in-flight[16]         per signal-nesting depth: u64 t0 (TSC when the syscall was
//!                             entered; 0 = none), u64 nr, u64 args[6]  (64 bytes each)
//! 4096  entry[capacity]       u64 seq, then the 96-byte Window (crate::ptt::Window's
//!                             fields in order: index, nr, args[6], ret, tsc_start,
//!                             tsc_end, u32 flags, u32 depth), u32 CRC-32 of those 96
//!                             bytes ([`window_check`]), u32 reserved
//! ```
//! The queue is Vyukov's bounded ring: entry `i` is published (holds a window not yet
//! released by the writer) when `seq ≡ i + 1 (mod capacity)`, free when `seq ≡ i`.
//! An in-flight syscall whose window is in neither the `.ptt` nor the spool (same `nr`,
//! and `t0` equal to the window's `tsc_start` or `tsc_end`) had not returned when the
//! process died: the `Recovered` record lists it.
//!
//! `Recovered` record payload: u64 windows recovered, u64 dropped windows recovered (not
//! yet counted by a `Dropped` record), u32 in-flight count, u32 flags (as above), then per
//! in-flight syscall: u32 depth, u32 reserved, u64 t0, u64 nr, `u64 args[6]` (72 bytes).

use crate::ptt::{
    self, decode_dropped, decode_window, FileKind, FormatError, ParsedFile, RecordType, Tail,
    Window, WF_PT_ABSENT, WF_PT_DROPPED, WF_RECOVERED,
};
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"PTTSPOOL";
pub const VERSION: u32 = 2;
/// Bytes of a `Window` as stored (the `repr(C)` struct).
pub const WINDOW_BYTES: usize = 96;
pub const ENTRY_SIZE: usize = 8 + WINDOW_BYTES + 8;

/// The check stored after an entry's window: the CRC-32 of its 96 bytes (in the low half;
/// the high half is reserved, zero).
pub fn window_check(w: &Window) -> u64 {
    // SAFETY: Window is repr(C) plain data of WINDOW_BYTES bytes without padding (asserted
    // below), so its bytes are initialized.
    let raw = unsafe { std::slice::from_raw_parts(w as *const Window as *const u8, WINDOW_BYTES) };
    let mut c = crate::ptt::Crc32::new();
    c.update(raw);
    u64::from(c.finish())
}
pub const OFF_VERSION: usize = 8;
pub const OFF_ENTRY_SIZE: usize = 12;
pub const OFF_CAP: usize = 16;
pub const OFF_PID: usize = 24;
pub const OFF_TID: usize = 28;
pub const OFF_NONCE: usize = 32;
pub const OFF_START_TSC: usize = 40;
pub const OFF_DROPPED: usize = 48;
pub const OFF_FLAGS: usize = 56;
pub const OFF_MODE: usize = 64;
pub const OFF_IN_FLIGHT: usize = 128;
/// In-flight slots (signal-nesting depths tracked).
pub const IN_FLIGHT_SLOTS: usize = 16;
pub const IN_FLIGHT_SIZE: usize = 64;
pub const ENTRIES_OFFSET: usize = 4096;
/// Header flag: a syscall at a nesting depth of [`IN_FLIGHT_SLOTS`] or more was not tracked.
pub const FLAG_IN_FLIGHT_OVERFLOW: u64 = 1;
/// Payload bytes per in-flight syscall in a `Recovered` record.
pub const RECOVERED_IN_FLIGHT_SIZE: usize = 72;

const _: () = assert!(std::mem::size_of::<Window>() == WINDOW_BYTES);
const _: () = assert!(OFF_IN_FLIGHT + IN_FLIGHT_SLOTS * IN_FLIGHT_SIZE <= ENTRIES_OFFSET);

/// Bytes of a spool file for a queue of `cap` entries (whole pages).
pub fn file_len(cap: usize) -> usize {
    (ENTRIES_OFFSET + cap * ENTRY_SIZE).next_multiple_of(4096)
}

/// The spool path of a thread file (`X.ptt` -> `X.spool`).
pub fn path_for(ptt: &Path) -> PathBuf {
    ptt.with_extension("spool")
}

/// A syscall that had been entered and whose window was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub depth: u32,
    pub t0: u64,
    pub nr: u64,
    pub args: [u64; 6],
}

/// A parsed spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spool {
    pub cap: u64,
    pub pid: i32,
    pub tid: i32,
    pub nonce: u64,
    pub start_tsc: u64,
    pub dropped: u64,
    pub flags: u64,
    pub mode: u8,
    pub window: u8,
    pub backend: u8,
    pub pt_present: bool,
    /// Published (unreleased) windows, by index.
    pub pending: Vec<Window>,
    /// The byte offset of each of `pending`'s entries in the spool file.
    pub pending_at: Vec<u64>,
    /// The byte offsets of published entries whose window fails its check (damaged after
    /// it was written): left out of `pending`.
    pub corrupt: Vec<u64>,
    /// Entered syscalls, outermost first.
    pub in_flight: Vec<InFlight>,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The stored window at `at` (96 bytes, see the layout).
fn read_window(b: &[u8], at: usize) -> Window {
    let mut args = [0u64; 6];
    for (i, a) in args.iter_mut().enumerate() {
        *a = le_u64(b, at + 16 + 8 * i);
    }
    Window {
        index: le_u64(b, at),
        nr: le_u64(b, at + 8),
        args,
        ret: le_u64(b, at + 64) as i64,
        tsc_start: le_u64(b, at + 72),
        tsc_end: le_u64(b, at + 80),
        flags: le_u32(b, at + 88),
        depth: le_u32(b, at + 92),
    }
}

/// Parses a spool (`name` for messages). `Ok(None)`: the spool was never set up (its magic
/// is still zero: the thread died while creating it, before recording anything).
pub fn parse(name: &str, data: &[u8]) -> Result<Option<Spool>, FormatError> {
    let bad = |offset: usize, what: String| FormatError::Record {
        path: name.to_string(),
        offset,
        what,
    };
    if data.len() < ENTRIES_OFFSET {
        if data.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        return Err(FormatError::ShortHeader(name.to_string(), data.len()));
    }
    if data[..8] == [0; 8] {
        return Ok(None);
    }
    if data[..8] != MAGIC {
        return Err(FormatError::BadMagic(name.to_string()));
    }
    let version = le_u32(data, OFF_VERSION);
    if version != VERSION {
        return Err(FormatError::Version(name.to_string(), version));
    }
    let esize = le_u32(data, OFF_ENTRY_SIZE) as usize;
    if esize != ENTRY_SIZE {
        return Err(bad(
            OFF_ENTRY_SIZE,
            format!("entry size {esize}, expected {ENTRY_SIZE}"),
        ));
    }
    let cap = le_u64(data, OFF_CAP);
    if cap < 2 || !cap.is_power_of_two() || cap > 1 << 24 {
        return Err(bad(
            OFF_CAP,
            format!("capacity {cap} is not a power of two in 2..=2^24"),
        ));
    }
    let need = ENTRIES_OFFSET + cap as usize * ENTRY_SIZE;
    if data.len() < need {
        return Err(bad(
            0,
            format!(
                "file is {} bytes; a queue of {cap} entries needs {need}",
                data.len()
            ),
        ));
    }
    let mut entries = Vec::new();
    let mut corrupt = Vec::new();
    for i in 0..cap as usize {
        let at = ENTRIES_OFFSET + i * ENTRY_SIZE;
        let seq = le_u64(data, at);
        if seq % cap == (i as u64 + 1) % cap {
            let w = read_window(data, at + 8);
            if le_u64(data, at + 8 + WINDOW_BYTES) != window_check(&w) {
                corrupt.push(at as u64);
                continue;
            }
            entries.push((w, at as u64));
        }
    }
    entries.sort_by_key(|(w, _)| w.index);
    entries.dedup_by_key(|(w, _)| w.index);
    let (pending, pending_at) = entries.into_iter().unzip();
    let mut in_flight = Vec::new();
    for d in 0..IN_FLIGHT_SLOTS {
        let at = OFF_IN_FLIGHT + d * IN_FLIGHT_SIZE;
        let t0 = le_u64(data, at);
        if t0 == 0 {
            continue;
        }
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = le_u64(data, at + 16 + 8 * i);
        }
        in_flight.push(InFlight {
            depth: d as u32,
            t0,
            nr: le_u64(data, at + 8),
            args,
        });
    }
    Ok(Some(Spool {
        cap,
        pid: le_u32(data, OFF_PID) as i32,
        tid: le_u32(data, OFF_TID) as i32,
        nonce: le_u64(data, OFF_NONCE),
        start_tsc: le_u64(data, OFF_START_TSC),
        dropped: le_u64(data, OFF_DROPPED),
        flags: le_u64(data, OFF_FLAGS),
        mode: data[OFF_MODE],
        window: data[OFF_MODE + 1],
        backend: data[OFF_MODE + 2],
        pt_present: data[OFF_MODE + 3] != 0,
        pending,
        pending_at,
        corrupt,
        in_flight,
    }))
}

/// The first place where the windows a spool adds to a thread file do not follow each
/// other (and the file's last window, `from` being the index after it): (byte offset of
/// the entry in the spool, the index expected, the index found). Entries carry no
/// checksum, so this is what shows a lost or damaged entry.
pub fn first_gap(spool: &Spool, from: u64) -> Option<(u64, u64, u64)> {
    let mut want = from;
    for (w, at) in spool.pending.iter().zip(&spool.pending_at) {
        if w.index < from {
            continue;
        }
        if w.index != want {
            return Some((*at, want, w.index));
        }
        want = w.index + 1;
    }
    None
}

/// What a spool added to a thread file (also the `Recovered` record's content).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Windows taken from the spool.
    pub windows: u64,
    /// Dropped windows the file had not counted yet.
    pub dropped: u64,
    /// Syscalls entered and not returned when the process died.
    pub in_flight: Vec<InFlight>,
    pub flags: u32,
}

impl Recovered {
    /// The `Recovered` record payload.
    pub fn payload(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(24 + self.in_flight.len() * RECOVERED_IN_FLIGHT_SIZE);
        p.extend_from_slice(&self.windows.to_le_bytes());
        p.extend_from_slice(&self.dropped.to_le_bytes());
        p.extend_from_slice(&(self.in_flight.len() as u32).to_le_bytes());
        p.extend_from_slice(&self.flags.to_le_bytes());
        for f in &self.in_flight {
            p.extend_from_slice(&f.depth.to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            p.extend_from_slice(&f.t0.to_le_bytes());
            p.extend_from_slice(&f.nr.to_le_bytes());
            for a in f.args {
                p.extend_from_slice(&a.to_le_bytes());
            }
        }
        p
    }

    /// Decodes a `Recovered` record payload.
    pub fn decode(p: &[u8]) -> Option<Recovered> {
        if p.len() < 24 {
            return None;
        }
        let n = le_u32(p, 16) as usize;
        if p.len() != 24 + n.checked_mul(RECOVERED_IN_FLIGHT_SIZE)? {
            return None;
        }
        let in_flight = (0..n)
            .map(|k| {
                let at = 24 + k * RECOVERED_IN_FLIGHT_SIZE;
                let mut args = [0u64; 6];
                for (i, a) in args.iter_mut().enumerate() {
                    *a = le_u64(p, at + 24 + 8 * i);
                }
                InFlight {
                    depth: le_u32(p, at),
                    t0: le_u64(p, at + 8),
                    nr: le_u64(p, at + 16),
                    args,
                }
            })
            .collect();
        Some(Recovered {
            windows: le_u64(p, 0),
            dropped: le_u64(p, 8),
            in_flight,
            flags: le_u32(p, 20),
        })
    }
}

/// How a spool completes a thread file: keep the file's first `keep` bytes (its complete
/// frames; a frame torn by the death is dropped, its window is in the spool) and append
/// `frames`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub keep: usize,
    /// How the file's own frames ended (before the recovered ones).
    pub file_tail: Tail,
    pub frames: Vec<u8>,
    pub recovered: Recovered,
    /// The recovered windows, as written into `frames`.
    pub windows: Vec<Window>,
    /// The thread's process and thread ids (from the spool).
    pub pid: i32,
    pub tid: i32,
    /// Snapshot mode: the snapshot recovered from the thread's ring file
    /// ([`crate::ringfile`]) that `frames` starts with, and how many of its windows came
    /// from the ring (the others: the spool's, without PT).
    pub snapshot: Option<(crate::snapshot::SnapshotRecord, u64)>,
    /// Where the spool's windows do not follow each other or the file's last one
    /// ([`first_gap`]; outside snapshot mode, where the ring drops windows on purpose).
    pub gap: Option<(u64, u64, u64)>,
    /// The spool's entries whose window fails its check ([`Spool::corrupt`]).
    pub corrupt: Vec<u64>,
}

/// What the thread file's frames say (the parts recovery needs).
#[derive(Default)]
struct FileState {
    has_header: bool,
    next_index: Option<u64>,
    dropped_total: u64,
    /// (nr, tsc_start, tsc_end) of the file's windows.
    windows: Vec<(u64, u64, u64)>,
    has_recovered: bool,
}

fn in_flight_done(f: &InFlight, windows: &[(u64, u64, u64)], pending: &[Window]) -> bool {
    let same = |nr: u64, s: u64, e: u64| nr == f.nr && (s == f.t0 || e == f.t0);
    windows.iter().any(|&(nr, s, e)| same(nr, s, e))
        || pending.iter().any(|w| same(w.nr, w.tsc_start, w.tsc_end))
}

/// The frames `spool` adds to the thread file `file` (whose bytes end at `file_len`).
/// `None` when the file already holds a `Recovered` record (salvaged before).
pub fn recover(spool: &Spool, file: &ParsedFile<'_>, file_len: usize) -> Option<Recovery> {
    let mut st = FileState::default();
    for f in &file.frames {
        match RecordType::from_raw(f.ty) {
            Some(RecordType::Window) => {
                if let Some(w) = decode_window(f.payload) {
                    let w = w.window;
                    st.next_index = Some(st.next_index.map_or(w.index + 1, |n| n.max(w.index + 1)));
                    st.windows.push((w.nr, w.tsc_start, w.tsc_end));
                }
            }
            Some(RecordType::Dropped) => {
                if let Some((_, total)) = decode_dropped(f.payload) {
                    st.dropped_total = st.dropped_total.max(total);
                }
            }
            Some(RecordType::Recovered) => st.has_recovered = true,
            Some(RecordType::ThreadHeader) => st.has_header = true,
            _ => {}
        }
    }
    if st.has_recovered {
        return None;
    }
    let keep = match file.tail {
        Tail::Clean => file_len,
        Tail::Truncated { offset, .. } | Tail::Corrupt { offset, .. } => offset,
    };
    let from = st.next_index.unwrap_or(0);
    let mut out = Vec::new();
    if !st.has_header && file.frames.is_empty() {
        // The process died while creating the file: its header comes from the spool.
        let h = ptt::ThreadHeader {
            pid: spool.pid,
            tid: spool.tid,
            mode: spool.mode,
            window: spool.window,
            backend: spool.backend,
            pt_present: spool.pt_present,
            nonce: spool.nonce,
            start_tsc: spool.start_tsc,
            pt_absent_reason: String::new(),
        };
        out.extend(ptt::frame_vec(
            RecordType::ThreadHeader,
            &ptt::thread_header_payload(&h),
        )?);
    }
    let mut rec = Recovered {
        flags: (spool.flags & FLAG_IN_FLIGHT_OVERFLOW) as u32,
        ..Default::default()
    };
    let mut windows = Vec::new();
    for w in spool.pending.iter().filter(|w| w.index >= from) {
        let mut w = *w;
        w.flags |= WF_RECOVERED;
        if w.flags & WF_PT_ABSENT == 0 {
            w.flags |= WF_PT_DROPPED;
        }
        out.extend(ptt::frame_vec(RecordType::Window, &window_payload(&w))?);
        rec.windows += 1;
        windows.push(w);
    }
    if spool.dropped > st.dropped_total {
        rec.dropped = spool.dropped - st.dropped_total;
        let mut p = Vec::with_capacity(16);
        p.extend_from_slice(&rec.dropped.to_le_bytes());
        p.extend_from_slice(&spool.dropped.to_le_bytes());
        out.extend(ptt::frame_vec(RecordType::Dropped, &p)?);
    }
    rec.in_flight = spool
        .in_flight
        .iter()
        .filter(|f| !in_flight_done(f, &st.windows, &spool.pending))
        .copied()
        .collect();
    out.extend(ptt::frame_vec(RecordType::Recovered, &rec.payload())?);
    Some(Recovery {
        keep,
        file_tail: file.tail.clone(),
        frames: out,
        recovered: rec,
        windows,
        pid: spool.pid,
        tid: spool.tid,
        snapshot: None,
        gap: first_gap(spool, from),
        corrupt: spool.corrupt.clone(),
    })
}

/// The last window index of a thread file's frames, and whether it holds a `Recovered`
/// record.
fn last_index(file: &ParsedFile<'_>) -> (Option<u64>, bool) {
    let mut last: Option<u64> = None;
    let mut recovered = false;
    for f in &file.frames {
        match RecordType::from_raw(f.ty) {
            Some(RecordType::Window) => {
                if let Some(w) = decode_window(f.payload) {
                    last = Some(last.map_or(w.window.index, |l| l.max(w.window.index)));
                }
            }
            Some(RecordType::Recovered) => recovered = true,
            _ => {}
        }
    }
    (last, recovered)
}

/// Snapshot mode: what the ring file `ring` (and the spool, if any) add to the thread
/// file `file`: the ring's windows not written yet and the spool's queued windows as one
/// snapshot numbered `number` ([`crate::ringfile::recover`]), then what the spool says
/// besides (dropped windows, syscalls in flight) in a `Recovered` record. `None` when the
/// file was salvaged before.
pub fn recover_with_ring(
    spool: Option<&Spool>,
    ring: &crate::ringfile::RingFile,
    file: &ParsedFile<'_>,
    file_len: usize,
    number: u64,
) -> Option<Recovery> {
    let (last, salvaged) = last_index(file);
    if salvaged {
        return None;
    }
    let keep = match file.tail {
        Tail::Clean => file_len,
        Tail::Truncated { offset, .. } | Tail::Corrupt { offset, .. } => offset,
    };
    let queued = spool.map_or(&[][..], |s| &s.pending[..]);
    let mut out = Vec::new();
    let mut snapshot = None;
    let mut windows = Vec::new();
    let mut rec = Recovered::default();
    if let Some(r) = crate::ringfile::recover(ring, last, queued, number) {
        out.extend_from_slice(&r.frames);
        rec.windows = r.from_spool;
        snapshot = Some((r.record, r.from_ring));
        windows = r.windows;
    }
    if let Some(spool) = spool {
        rec.flags = (spool.flags & FLAG_IN_FLIGHT_OVERFLOW) as u32;
        let mut dropped_total = 0;
        for f in &file.frames {
            if f.ty == RecordType::Dropped as u16 {
                if let Some((_, total)) = decode_dropped(f.payload) {
                    dropped_total = dropped_total.max(total);
                }
            }
        }
        if spool.dropped > dropped_total {
            rec.dropped = spool.dropped - dropped_total;
            let mut p = Vec::with_capacity(16);
            p.extend_from_slice(&rec.dropped.to_le_bytes());
            p.extend_from_slice(&spool.dropped.to_le_bytes());
            out.extend(ptt::frame_vec(RecordType::Dropped, &p)?);
        }
        // The recovered windows have no syscall fields of their own to match: a syscall
        // whose window was queued returned.
        rec.in_flight = spool
            .in_flight
            .iter()
            .filter(|f| !in_flight_done(f, &[], &spool.pending))
            .copied()
            .collect();
    }
    out.extend(ptt::frame_vec(RecordType::Recovered, &rec.payload())?);
    Some(Recovery {
        keep,
        file_tail: file.tail.clone(),
        frames: out,
        recovered: rec,
        windows,
        pid: ring.pid,
        tid: ring.tid,
        snapshot,
        gap: None,
        corrupt: spool.map_or_else(Vec::new, |s| s.corrupt.clone()),
    })
}

/// The number the recovered snapshot of a thread file takes: one more than the last
/// firing of its process image (the `Snapshot` records of its thread files, the firing
/// notes of its info file).
pub fn next_snapshot_number(ptt_path: &Path) -> u64 {
    let Some(name) = ptt_path.file_name().and_then(|n| n.to_str()) else {
        return 1;
    };
    let Some((base, _)) = name.trim_end_matches(".ptt").rsplit_once('-') else {
        return 1;
    };
    let dir = ptt_path.parent().unwrap_or(Path::new("."));
    let mut max = 0;
    let prefix = format!("{base}-");
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for e in entries {
        let p = e.path();
        let Some(n) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let thread = n.starts_with(&prefix) && n.ends_with(".ptt");
        let info = n == format!("{base}.info");
        if !thread && !info {
            continue;
        }
        let Ok(data) = std::fs::read(&p) else {
            continue;
        };
        let Ok(pf) = ptt::parse(n, &data) else {
            continue;
        };
        for f in &pf.frames {
            let number = match RecordType::from_raw(f.ty) {
                Some(RecordType::Snapshot) => crate::snapshot::SnapshotRecord::decode(f.payload)
                    .filter(|r| r.kind != crate::snapshot::TriggerKind::Kill as u32)
                    .map(|r| r.number),
                Some(RecordType::Note) => std::str::from_utf8(f.payload)
                    .ok()
                    .filter(|t| !t.contains(crate::ringfile::RECOVERED_NOTE))
                    .and_then(|t| t.strip_prefix("snapshot "))
                    .and_then(|t| t.split_once(':'))
                    .and_then(|(n, _)| n.parse::<u64>().ok()),
                _ => None,
            };
            max = max.max(number.unwrap_or(0));
        }
    }
    max + 1
}

/// The `Window` payload of `w` without PT or sideband.
fn window_payload(w: &Window) -> Vec<u8> {
    let mut buf = [0u8; ptt::WINDOW_HEAD_SIZE + 4];
    let n = ptt::encode_window(&mut buf, w, &[], &[]).unwrap_or(0);
    buf.get(8..n.saturating_sub(4)).unwrap_or(&[]).to_vec()
}

/// The thread files among the paths of a directory listing, sorted: every `.ptt`, and the
/// `.ptt` a spool stands for when its process died before creating that file.
pub fn thread_files(entries: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = entries
        .iter()
        .filter_map(|e| match e.extension().and_then(|x| x.to_str()) {
            Some("ptt") => Some(e.clone()),
            Some("spool") | Some("snapring") => Some(e.with_extension("ptt")),
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A thread file's bytes with its spool (if any) merged in memory, and what the spool
/// added. The file on disk is not changed. A missing thread file whose spool exists (the
/// process died before creating it) reads as the spool's windows alone.
pub fn read_thread_file(path: &Path) -> Result<(Vec<u8>, Option<Recovery>), FormatError> {
    let name = path.display().to_string();
    let mut data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && (path_for(path).exists() || crate::ringfile::path_for(path).exists()) =>
        {
            Vec::new()
        }
        Err(e) => {
            return Err(FormatError::Record {
                path: name.clone(),
                offset: 0,
                what: format!("cannot read: {e}"),
            })
        }
    };
    let Some(r) = recovery_for(path, &data)? else {
        return Ok((data, None));
    };
    if data.len() < ptt::HEADER_SIZE {
        data = ptt::encode_header(FileKind::Thread).to_vec();
    }
    data.truncate(r.keep);
    data.extend_from_slice(&r.frames);
    Ok((data, Some(r)))
}

/// The recovery a spool beside `path` (whose bytes are `data`) brings, if any; in
/// snapshot mode, with the thread's ring file ([`recover_with_ring`]).
pub fn recovery_for(path: &Path, data: &[u8]) -> Result<Option<Recovery>, FormatError> {
    let read = |p: &Path| match std::fs::read(p) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FormatError::Record {
            path: p.display().to_string(),
            offset: 0,
            what: format!("cannot read: {e}"),
        }),
    };
    let sp = path_for(path);
    let spool = match read(&sp)? {
        Some(d) => parse(&sp.display().to_string(), &d)?,
        None => None,
    };
    let rp = crate::ringfile::path_for(path);
    let ring = match read(&rp)? {
        Some(d) => crate::ringfile::parse(&rp.display().to_string(), &d)?,
        None => None,
    };
    if spool.is_none() && ring.is_none() {
        return Ok(None);
    }
    let name = path.display().to_string();
    // A file the process died creating (shorter than its header): the spool has it all.
    let created: Vec<u8>;
    let data = if data.len() < ptt::HEADER_SIZE
        && ptt::encode_header(FileKind::Thread).starts_with(data)
    {
        created = ptt::encode_header(FileKind::Thread).to_vec();
        &created[..]
    } else {
        data
    };
    let file = ptt::parse(&name, data)?;
    if file.kind != FileKind::Thread {
        return Err(FormatError::Record {
            path: name,
            offset: 12,
            what: "expected a thread file (kind 2) beside the spool".into(),
        });
    }
    match (&spool, &ring) {
        (_, Some(ring)) => {
            let number = next_snapshot_number(path);
            Ok(recover_with_ring(
                spool.as_ref(),
                ring,
                &file,
                data.len(),
                number,
            ))
        }
        (Some(spool), None) => Ok(recover(spool, &file, data.len())),
        (None, None) => Ok(None),
    }
}

/// Kernel modes also keep DynamoRIO's `kernel.raw/<tid>.raw.pt` per thread, with one
/// syscall PDB per window (PDB index = window index): after a death it lacks the windows
/// the spool gave and may lack the last ones the thread file got (the two are written one
/// after the other) or end in a torn PDB. It gets every window of the completed thread
/// file (`data`) past its last good PDB, without PT (none was captured for them), and is
/// created with the process's `pt_metadata` when the thread died before it existed.
fn complete_kernel_raw(ptt: &Path, data: &[u8], pid: i32, tid: i32) -> Result<(), FormatError> {
    let dir = ptt.parent().unwrap_or(Path::new(".")).join("kernel.raw");
    if !dir.is_dir() {
        return Ok(());
    }
    let raw = dir.join(format!("{}.raw.pt", tid as u32));
    let err = |p: &Path, what: String| FormatError::Record {
        path: p.display().to_string(),
        offset: 0,
        what,
    };
    // The process's pt_metadata, from its info file (`<pid>-<nonce>.info`), as the header
    // of a file the thread died before creating (or writing its header into).
    let fresh = || -> Option<Vec<u8>> {
        let name = ptt.file_name()?.to_str()?;
        let (base, _) = name.trim_end_matches(".ptt").rsplit_once('-')?;
        let info = ptt.with_file_name(format!("{base}.info"));
        let idata = std::fs::read(&info).ok()?;
        let parsed = ptt::parse(&info.display().to_string(), &idata).ok()?;
        let md = parsed
            .frames
            .iter()
            .find(|f| f.ty == RecordType::Metadata as u16)
            .and_then(|f| crate::metadata::PtMetadata::from_bytes(f.payload))?;
        Some(crate::pdb::PdbWriter::new(pid as u32 as u64, tid as u32 as u64, &md).buf)
    };
    const HEADER: usize = 24 + 18;
    let mut have = match std::fs::read(&raw) {
        Ok(d) if d.len() >= HEADER => d,
        Ok(_) => match fresh() {
            Some(h) => h,
            None => return Ok(()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match fresh() {
            Some(h) => h,
            None => return Ok(()),
        },
        Err(e) => return Err(err(&raw, format!("cannot read: {e}"))),
    };
    let (file, _damage) = crate::pdb::parse_prefix(&have)
        .map_err(|e| err(&raw, format!("not a DynamoRIO .raw.pt file: {e}")))?;
    // Keep the good PDBs (a torn one at the end goes: its window is written again).
    let keep = file.windows.last().map_or(HEADER, |w| w.pt.end);
    have.truncate(keep);
    let parsed = ptt::parse(&ptt.display().to_string(), data)?;
    let windows: Vec<Window> = parsed
        .frames
        .iter()
        .filter(|f| f.ty == RecordType::Window as u16)
        .filter_map(|f| decode_window(f.payload).map(|w| w.window))
        .collect();
    // A tid's file outlives `execve` (each image numbers its windows from 0): this image's
    // PDBs are the last run of rising indices, if its first one is this file's window 0.
    let run_start = file
        .windows
        .windows(2)
        .rposition(|p| p[1].syscall_idx <= p[0].syscall_idx)
        .map_or(0, |i| i + 1);
    let ours = file.windows.get(run_start).is_some_and(|p| {
        windows.first().is_some_and(|w| {
            p.syscall_idx == w.index && p.sysnum == w.nr && p.args[..] == w.args[..]
        })
    });
    let after = file.windows.last().filter(|_| ours).map(|p| p.syscall_idx);
    let mut pdbs = crate::pdb::PdbWriter::default();
    for w in windows.iter().filter(|w| after.is_none_or(|a| w.index > a)) {
        pdbs.syscall(
            pid as u32 as u64,
            tid as u32 as u64,
            w.nr,
            w.index,
            &w.args,
            &[],
        );
    }
    have.extend_from_slice(&pdbs.buf);
    let tmp = raw.with_extension("pt.salvage");
    std::fs::write(&tmp, &have).map_err(|e| err(&tmp, format!("cannot write: {e}")))?;
    std::fs::rename(&tmp, &raw).map_err(|e| err(&raw, format!("cannot write: {e}")))?;
    Ok(())
}

/// Makes the recovery of `path`'s spool permanent: the thread file keeps its complete
/// frames and gets the recovered ones appended (written to a temporary file and renamed
/// over the original, so a failure leaves both files as they were); the spool is deleted.
/// Call only when the process that wrote them is gone. Returns what was recovered.
///
/// In snapshot mode the thread's ring file ([`crate::ringfile`]) is recovered with it,
/// as one more snapshot, noted in the process's info file, and deleted too.
pub fn salvage(path: &Path) -> Result<Option<Recovery>, FormatError> {
    let (data, rec) = read_thread_file(path)?;
    let io = |p: &Path, e: std::io::Error| FormatError::Record {
        path: p.display().to_string(),
        offset: 0,
        what: format!("cannot write: {e}"),
    };
    let sp = path_for(path);
    if let Some(r) = &rec {
        let tmp = path.with_extension("ptt.salvage");
        std::fs::write(&tmp, &data).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
        complete_kernel_raw(path, &data, r.pid, r.tid)?;
        if let Some((snap, from_ring)) = &r.snapshot {
            note_recovered_snapshot(path, snap, *from_ring, r.tid);
        }
        remove_if_there(&sp).map_err(|e| io(&sp, e))?;
        let rp = crate::ringfile::path_for(path);
        remove_if_there(&rp).map_err(|e| io(&rp, e))?;
        return Ok(rec);
    }
    // Nothing to add (never set up, or salvaged already): the spool is only a leftover.
    remove_if_there(&sp).map_err(|e| io(&sp, e))?;
    let rp = crate::ringfile::path_for(path);
    remove_if_there(&rp).map_err(|e| io(&rp, e))?;
    Ok(None)
}

fn remove_if_there(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Appends to the process's info file (`<pid>-<nonce>.info` beside the thread file) the
/// note that thread `tid`'s snapshot `snap` was recovered after the process was killed.
/// Best effort: an info file that cannot be read or written keeps what it has (the
/// snapshot's record says the same).
fn note_recovered_snapshot(
    ptt_path: &Path,
    snap: &crate::snapshot::SnapshotRecord,
    from_ring: u64,
    tid: i32,
) {
    let Some(name) = ptt_path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let Some((base, _)) = name.trim_end_matches(".ptt").rsplit_once('-') else {
        return;
    };
    let info = ptt_path.with_file_name(format!("{base}.info"));
    let Ok(data) = std::fs::read(&info) else {
        return;
    };
    let Ok(pf) = ptt::parse(&info.display().to_string(), &data) else {
        return;
    };
    let keep = match pf.tail {
        Tail::Clean => data.len(),
        Tail::Truncated { offset, .. } | Tail::Corrupt { offset, .. } => offset,
    };
    let text = format!(
        "snapshot {}: {} of thread {tid}: {} windows, {} PT bytes ({} from its ring, {} \
         still queued without PT), {} windows discarded before them",
        snap.number,
        crate::ringfile::RECOVERED_NOTE,
        snap.windows,
        snap.pt_bytes,
        from_ring.min(snap.windows),
        snap.windows.saturating_sub(from_ring),
        snap.discarded_windows
    );
    let Some(frame) = ptt::frame_vec(RecordType::Note, text.as_bytes()) else {
        return;
    };
    let mut all = data[..keep].to_vec();
    all.extend_from_slice(&frame);
    let tmp = info.with_extension("info.salvage");
    if std::fs::write(&tmp, &all).is_ok() {
        let _ = std::fs::rename(&tmp, &info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptt::{encode_header, encode_window, parse as parse_ptt};

    fn win(index: u64, nr: u64, t: u64) -> Window {
        Window {
            index,
            nr,
            args: [index, 2, 3, 4, 5, 6],
            ret: 7,
            tsc_start: t,
            tsc_end: t + 1,
            flags: WF_PT_ABSENT,
            depth: 0,
        }
    }

    /// A spool as the shim leaves it: entries `released` were written and released,
    /// `pending` are published.
    fn spool_bytes(
        cap: usize,
        released: &[Window],
        pending: &[Window],
        fl: &[InFlight],
    ) -> Vec<u8> {
        let mut b = vec![0u8; file_len(cap)];
        b[..8].copy_from_slice(&MAGIC);
        b[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[OFF_ENTRY_SIZE..OFF_ENTRY_SIZE + 4].copy_from_slice(&(ENTRY_SIZE as u32).to_le_bytes());
        b[OFF_CAP..OFF_CAP + 8].copy_from_slice(&(cap as u64).to_le_bytes());
        b[OFF_PID..OFF_PID + 4].copy_from_slice(&10i32.to_le_bytes());
        b[OFF_TID..OFF_TID + 4].copy_from_slice(&11i32.to_le_bytes());
        for i in 0..cap {
            let at = ENTRIES_OFFSET + i * ENTRY_SIZE;
            b[at..at + 8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        let mut put = |pos: u64, w: &Window, published: bool| {
            let i = (pos as usize) % cap;
            let at = ENTRIES_OFFSET + i * ENTRY_SIZE;
            let seq = if published { pos + 1 } else { pos + cap as u64 };
            b[at..at + 8].copy_from_slice(&seq.to_le_bytes());
            // SAFETY: Window is repr(C) plain data of WINDOW_BYTES bytes.
            let raw = unsafe {
                std::slice::from_raw_parts(w as *const Window as *const u8, WINDOW_BYTES)
            };
            b[at + 8..at + 8 + WINDOW_BYTES].copy_from_slice(raw);
            b[at + 8 + WINDOW_BYTES..at + ENTRY_SIZE]
                .copy_from_slice(&window_check(w).to_le_bytes());
        };
        let mut pos = 0u64;
        for w in released {
            put(pos, w, false);
            pos += 1;
        }
        for w in pending {
            put(pos, w, true);
            pos += 1;
        }
        for f in fl {
            let at = OFF_IN_FLIGHT + f.depth as usize * IN_FLIGHT_SIZE;
            b[at..at + 8].copy_from_slice(&f.t0.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&f.nr.to_le_bytes());
            for (k, a) in f.args.iter().enumerate() {
                b[at + 16 + 8 * k..at + 24 + 8 * k].copy_from_slice(&a.to_le_bytes());
            }
        }
        b
    }

    fn thread_file(ws: &[Window]) -> Vec<u8> {
        let mut f = encode_header(FileKind::Thread).to_vec();
        for w in ws {
            let mut buf = [0u8; 256];
            let n = encode_window(&mut buf, w, &[], &[]).unwrap();
            f.extend_from_slice(&buf[..n]);
        }
        f
    }

    #[test]
    fn spool_windows_after_the_file_and_the_unreturned_syscall_are_recovered() {
        // 6 windows: 0..4 written (3 and 4 also still published: released only after the
        // write), the write of 5 torn by the kill; 5 and 6 published; kill(2) in flight,
        // and a finished getpid whose in-flight slot was not cleared yet.
        let ws: Vec<Window> = (0..7).map(|i| win(i, 39, 100 * (i + 1))).collect();
        let mut file = thread_file(&ws[..5]);
        let good = file.len();
        let torn = thread_file(&ws[5..6]);
        file.extend_from_slice(&torn[16..16 + 40]);
        let kill = InFlight {
            depth: 0,
            t0: 5000,
            nr: 62,
            args: [10, 9, 0, 0, 0, 0],
        };
        let done = InFlight {
            depth: 1,
            t0: ws[6].tsc_start,
            nr: 39,
            args: [6, 2, 3, 4, 5, 6],
        };
        let sp = spool_bytes(8, &ws[..3], &ws[3..], &[kill, done]);
        let spool = parse("s", &sp).unwrap().unwrap();
        assert_eq!(spool.pending, ws[3..].to_vec());
        assert_eq!(spool.in_flight, vec![kill, done]);
        let parsed = parse_ptt("t", &file).unwrap();
        let r = recover(&spool, &parsed, file.len()).unwrap();
        assert_eq!(r.keep, good);
        assert_eq!(
            r.file_tail,
            Tail::Truncated {
                offset: good,
                bytes: 40
            }
        );
        let mut merged = file[..r.keep].to_vec();
        merged.extend_from_slice(&r.frames);
        let m = parse_ptt("m", &merged).unwrap();
        assert_eq!(m.tail, Tail::Clean);
        let got: Vec<Window> = m
            .frames
            .iter()
            .filter(|f| f.ty == RecordType::Window as u16)
            .map(|f| decode_window(f.payload).unwrap().window)
            .collect();
        let mut want = ws.clone();
        for w in &mut want[5..] {
            w.flags |= WF_RECOVERED;
        }
        assert_eq!(got, want);
        let last = m.frames.last().unwrap();
        assert_eq!(last.ty, RecordType::Recovered as u16);
        let rec = Recovered::decode(last.payload).unwrap();
        assert_eq!(
            rec,
            Recovered {
                windows: 2,
                dropped: 0,
                in_flight: vec![kill],
                flags: 0
            }
        );
        assert_eq!(rec, r.recovered);
        // A second recovery of the merged file adds nothing.
        assert_eq!(recover(&spool, &m, merged.len()), None);
    }

    #[test]
    fn salvage_rewrites_the_thread_file_and_removes_the_spool() {
        let dir = std::env::temp_dir().join(format!("spool-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ptt = dir.join("1-00000000-1.ptt");
        let ws: Vec<Window> = (0..3).map(|i| win(i, 0, 10 * (i + 1))).collect();
        std::fs::write(&ptt, thread_file(&ws[..1])).unwrap();
        std::fs::write(path_for(&ptt), spool_bytes(4, &[], &ws, &[])).unwrap();
        let (merged, r) = read_thread_file(&ptt).unwrap();
        assert_eq!(r.unwrap().recovered.windows, 2);
        let rec = salvage(&ptt).unwrap().unwrap().recovered;
        assert_eq!(rec.windows, 2);
        assert!(!path_for(&ptt).exists());
        assert_eq!(std::fs::read(&ptt).unwrap(), merged);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_spools_name_the_field() {
        let mut sp = spool_bytes(4, &[], &[], &[]);
        assert_eq!(parse("s", &vec![0u8; 4096]).unwrap(), None);
        sp[OFF_CAP] = 3;
        let e = parse("s", &sp).unwrap_err().to_string();
        assert_eq!(
            e,
            "s: record at offset 16: capacity 3 is not a power of two in 2..=2^24"
        );
        sp[OFF_CAP] = 4;
        sp[OFF_ENTRY_SIZE] = 1;
        assert!(parse("s", &sp)
            .unwrap_err()
            .to_string()
            .contains("offset 12: entry size 1"));
        let e = parse("s", &sp[..5000]).unwrap_err().to_string();
        assert!(e.contains("s: "), "{e}");
    }
}
