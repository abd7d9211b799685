//! The shim's output files: one process info file per traced process image and one
//! per-thread file with a framed record per syscall window.
//!
//! Names in the output directory: `<pid>-<nonce>.info` and `<pid>-<nonce>-<tid>.ptt`, where
//! `<nonce>` is 8 lowercase hex digits identifying the process image (a pid that calls
//! `execve` gets a new image and a new nonce). Kernel modes also write DynamoRIO's
//! `kernel.raw/<tid>.raw.pt` (PT Data Buffers; written by `shim::output`).
//!
//! While a thread runs, its queue of windows not yet written is kept in
//! `<pid>-<nonce>-<tid>.spool` beside its file ([`crate::spool`]); the shim deletes it after
//! the thread's `End` record. A spool left behind means the process died without writing
//! everything (SIGKILL): readers merge it, and `pttrace run` appends what it holds to the
//! thread file as `Window` frames flagged [`WF_RECOVERED`] and a `Recovered` record. Files
//! from before spools existed read as before (version 1 is unchanged; record 26 and flag
//! bit 10 are new, and older readers skip unknown records).
//!
//! # Layout (all integers little-endian)
//!
//! ```text
//! file   := header frame*
//! header := "PTTRACE\0" (8 bytes) | u32 version (=1) | u32 kind (1 = process info, 2 = thread)
//! frame  := u32 len | u16 type | u16 flags (=0) | payload[len] | u32 crc
//! ```
//! `crc` is CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as iSCSI/ext4) over
//! `len | type | flags | payload`; the SSE4.2 `crc32` instruction computes it where present.
//! A reader stops at the first frame that does not fit the file (truncated tail, e.g.
//! after SIGKILL mid-write) or whose CRC does not match, and reports the offset and the
//! number of bytes it ignored. Frames of unknown types are skipped.
//!
//! Frame types and payloads are listed on [`RecordType`]; [`Window`] is the per-syscall
//! record. Encoding functions write into caller buffers and never allocate, so the shim
//! can use them from a signal handler.

use std::path::Path;

/// File magic.
pub const MAGIC: [u8; 8] = *b"PTTRACE\0";
/// Format version written by this crate.
pub const VERSION: u32 = 1;
/// Size of the file header.
pub const HEADER_SIZE: usize = 16;
/// Bytes a frame adds around its payload (len, type, flags before; crc after).
pub const FRAME_OVERHEAD: usize = 12;
/// Largest payload a reader accepts (guards against reading garbage lengths).
pub const MAX_PAYLOAD: usize = 1 << 30;
/// Bytes a writer of trace files hands the kernel in one call at most. A window of the
/// QEMU backend is up to 8 MiB of PT: written in one `pwritev`, the kernel here (6.18,
/// ext4) spent 0.13-1.3 s of system time on 300 MB, against 0.08-0.09 s in calls of 1 MiB
/// (measured with the same buffer and file).
pub const WRITE_PIECE: usize = 1 << 20;

/// What a file contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FileKind {
    ProcessInfo = 1,
    Thread = 2,
}

/// Frame types.
///
/// Thread files:
/// - `ThreadHeader` (1): i32 pid, i32 tid, u8 mode (0 user, 1 kernel, 2 user_kernel),
///   u8 window (0 syscall, 1 thread), u8 backend (0 hardware, 1 emulated), u8 pt_present,
///   u64 nonce (identifies the process image, as in the info file), u64 start_tsc,
///   then UTF-8 text: why PT is absent (empty when present).
/// - `Window` (2): see [`Window`].
/// - `Dropped` (3): u64 windows dropped since the previous `Dropped`, u64 total.
/// - `End` (4): u32 reason ([`EndReason`]), u32 reserved, u64 windows written, u64 dropped.
///
/// Process info files:
/// - `Process` (16): i32 pid, i32 ppid, u64 nonce, u64 start_tsc, u64 start_monotonic_ns,
///   u8 mode, u8 window, u8 backend, u8 pt_present, u32 reserved, then UTF-8 text: why PT
///   is absent (empty when present).
/// - `Cmdline` (17): the raw bytes of /proc/self/cmdline (NUL-separated arguments).
/// - `Exe` (18): the path of /proc/self/exe.
/// - `Maps` (19): the text of /proc/self/maps when tracing began.
/// - `Vdso` (20): u64 load address, then the vDSO image bytes.
/// - `Metadata` (21): the 18-byte `pt_metadata_t`, u32 cpuid_0x15_eax, u32 cpuid_0x15_ebx,
///   u8 nom_freq, u8 mtc_freq, u8 time_zero_valid, u8 backend, u32 perf_type,
///   u64 perf_config, u64 sideband_sample_type (50 bytes).
/// - `Clock` (22): u64 CLOCK_MONOTONIC ns, u64 TSC, taken together (start and end give
///   the TSC rate for converting window timestamps).
/// - `Config` (23): UTF-8 text, the `PTTRACER_*` settings, one `NAME=value` per line.
/// - `ProcessEnd` (24): u32 reason ([`EndReason`]), i32 exit code, u64 syscall sites
///   patched by the fast path (`PTTRACER_REWRITE`, 0 otherwise), u64 thread files the
///   writer created for this image (0: not counted; absent in files of older writers), so
///   a reader can tell when some are missing.
/// - `Note` (25): UTF-8 text, something a reader must tell the user (e.g. an `execve`
///   whose new image was not traced, and why).
///
/// Thread files again:
/// - `Recovered` (26): what was taken from the thread's spool after the process died
///   without writing it (SIGKILL): see [`crate::spool`] for the payload. The recovered
///   windows come before it as ordinary `Window` frames flagged [`WF_RECOVERED`].
/// - `Snapshot` (27): snapshot mode (`pttrace run --snapshot`): the windows after it, up to
///   the next `Snapshot` or `End`, are one snapshot of the thread's ring, written when a
///   trigger fired; payload in [`crate::snapshot::SnapshotRecord`].
///
/// Backend byte (`ThreadHeader`, `Process`, `Metadata`): 0 hardware, 1 emulated
/// (single-step), 2 qemu ([`BACKEND_QEMU`]: the QEMU TCG plugin; its windows' sideband
/// carries the executed code as [`crate::code`] records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RecordType {
    ThreadHeader = 1,
    Window = 2,
    Dropped = 3,
    End = 4,
    Process = 16,
    Cmdline = 17,
    Exe = 18,
    Maps = 19,
    Vdso = 20,
    Metadata = 21,
    Clock = 22,
    Config = 23,
    ProcessEnd = 24,
    Note = 25,
    Recovered = 26,
    Snapshot = 27,
}

impl RecordType {
    pub fn from_raw(v: u16) -> Option<RecordType> {
        use RecordType::*;
        Some(match v {
            1 => ThreadHeader,
            2 => Window,
            3 => Dropped,
            4 => End,
            16 => Process,
            17 => Cmdline,
            18 => Exe,
            19 => Maps,
            20 => Vdso,
            21 => Metadata,
            22 => Clock,
            23 => Config,
            24 => ProcessEnd,
            25 => Note,
            26 => Recovered,
            27 => Snapshot,
            _ => return None,
        })
    }
}

/// Why a thread file or a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum EndReason {
    /// The thread called `exit`.
    ThreadExit = 0,
    /// The process called `exit_group`.
    ExitGroup = 1,
    /// The process image was replaced by `execve`/`execveat`.
    Exec = 2,
    /// The last application thread exited; the shim ended the process.
    LastThread = 3,
    /// A fatal signal (the `ProcessEnd` exit code is the signal number); written by the
    /// shim's handler for signals whose disposition was the default action.
    Signal = 4,
}

impl EndReason {
    pub fn from_raw(v: u32) -> Option<EndReason> {
        match v {
            0 => Some(EndReason::ThreadExit),
            1 => Some(EndReason::ExitGroup),
            2 => Some(EndReason::Exec),
            3 => Some(EndReason::LastThread),
            4 => Some(EndReason::Signal),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            EndReason::ThreadExit => "exit",
            EndReason::ExitGroup => "exit_group",
            EndReason::Exec => "exec",
            EndReason::LastThread => "last thread exited",
            EndReason::Signal => "fatal signal",
        }
    }
}

/// Window flag: the syscall did not return (exit, successful exec, rt_sigreturn);
/// `ret` is meaningless.
pub const WF_NO_RETURN: u32 = 1 << 0;
/// Window flag: PT data of this window was lost (ring overwritten/truncated).
pub const WF_PT_LOST: u32 = 1 << 1;
/// Window flag: sideband records of this window were lost.
pub const WF_SIDEBAND_LOST: u32 = 1 << 2;
/// Window flag: no PT for this window (the thread has no tracer; reason in the header).
pub const WF_PT_ABSENT: u32 = 1 << 3;
/// Window flag: the syscall was made by a signal handler running inside another
/// intercepted syscall of the same thread (nested window; never captured).
pub const WF_NESTED: u32 = 1 << 4;
/// Window flag: starting or stopping the capture failed for this window.
pub const WF_CAPTURE_ERROR: u32 = 1 << 5;
/// Window flag: the PT/sideband bytes did not fit the shim's per-thread byte ring.
pub const WF_PT_DROPPED: u32 = 1 << 6;
/// Window flag: the syscall was made by the child of a `vfork`-style clone (`posix_spawn`)
/// while it ran on its parent's memory, before its exec; recorded in the child's own files
/// (an image with the parent's exe whose `ppid` is the parent).
pub const WF_VFORK_CHILD: u32 = 1 << 7;
/// Window flag: the record is the child's side of a fork (`ret` = 0).
pub const WF_FORK_CHILD: u32 = 1 << 8;

/// Window flag: the window ended without a syscall (the thread's PT was cut between two
/// blocks: buffer limit, code replaced at run time, or the thread ended); `nr`, `args`
/// and `ret` are meaningless. The next window continues where this one stopped.
pub const WF_NO_SYSCALL: u32 = 1 << 9;
/// The window was recovered from the thread's spool after the process died before writing
/// it (see [`crate::spool`]); its PT, if it had any, is lost (`WF_PT_DROPPED`).
pub const WF_RECOVERED: u32 = 1 << 10;
/// Snapshot mode: the window is the last of a thread's snapshot and ends where the thread
/// took it (see [`crate::snapshot`]): at a syscall that had not returned yet (then `nr` and
/// `args` are that syscall's and `ret` is meaningless; the next window starts after its
/// return), or between two blocks (with [`WF_NO_SYSCALL`]). `tsc_end` is the cut's time.
pub const WF_SNAPSHOT_CUT: u32 = 1 << 11;
/// The window's PT holds OVF packets its backend wrote where it lost the flow (the QEMU
/// backend: a signal entered between two blocks whose interrupted instruction never became
/// known, because the handler did not return to it): trace is missing at each of them.
pub const WF_PT_OVERFLOW: u32 = 1 << 12;

/// Backend byte of the QEMU plugin.
pub const BACKEND_QEMU: u8 = 2;

/// Fixed part of a `Window` payload.
pub const WINDOW_FIXED_SIZE: usize = 8 + 8 + 6 * 8 + 8 + 8 + 8 + 4 + 4 + 4 + 4;

/// One syscall window.
///
/// Payload: u64 index (per thread, from 0), u64 nr, u64 args × 6, i64 ret, u64 tsc_start,
/// u64 tsc_end, u32 flags (`WF_*`), u32 depth (signal nesting, 0 = outermost),
/// u32 pt_len, u32 sideband_len, then pt_len PT bytes, then sideband_len bytes of perf
/// records (user modes). Timestamps are TSC values (see the `Clock` records).
///
/// In memory the struct is `repr(C)` with exactly this field order (96 bytes on x86-64):
/// the shim's spool stores it as is (see [`crate::spool`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Window {
    pub index: u64,
    pub nr: u64,
    pub args: [u64; 6],
    pub ret: i64,
    pub tsc_start: u64,
    pub tsc_end: u64,
    pub flags: u32,
    pub depth: u32,
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) lookup table.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0x82F6_3B78 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Running CRC-32 state (start with [`Crc32::new`], finish with [`Crc32::finish`]).
#[derive(Debug, Clone, Copy)]
pub struct Crc32(u32);

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    pub const fn new() -> Self {
        Crc32(0xFFFF_FFFF)
    }
    pub fn update(&mut self, data: &[u8]) {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE4.2 (checked just above).
            self.0 = unsafe { crc32c_sse42(self.0, data) };
        } else {
            self.0 = crc32c_table(self.0, data);
        }
    }
    pub fn finish(self) -> u32 {
        self.0 ^ 0xFFFF_FFFF
    }
}

fn crc32c_table(mut c: u32, data: &[u8]) -> u32 {
    for &b in data {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8);
    }
    c
}

/// # Safety
/// The CPU must support SSE4.2.
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(mut c: u32, data: &[u8]) -> u32 {
    use core::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut chunks = data.chunks_exact(8);
    let mut c64 = u64::from(c);
    for ch in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(ch);
        c64 = _mm_crc32_u64(c64, u64::from_le_bytes(w));
    }
    c = c64 as u32;
    for &b in chunks.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    c
}

/// CRC-32C of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(data);
    c.finish()
}

/// The 16-byte file header.
pub fn encode_header(kind: FileKind) -> [u8; HEADER_SIZE] {
    let mut h = [0u8; HEADER_SIZE];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(kind as u32).to_le_bytes());
    h
}

/// A cursor that writes little-endian values into a fixed buffer without allocating.
/// Writes past the end are counted but dropped; check [`Cursor::overflowed`].
pub struct Cursor<'a> {
    buf: &'a mut [u8],
    pos: usize,
    overflow: bool,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Cursor {
            buf,
            pos: 0,
            overflow: false,
        }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn overflowed(&self) -> bool {
        self.overflow
    }
    pub fn bytes(&mut self, b: &[u8]) {
        let end = self.pos.saturating_add(b.len());
        match self.buf.get_mut(self.pos..end) {
            Some(dst) => {
                dst.copy_from_slice(b);
                self.pos = end;
            }
            None => self.overflow = true,
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Writes a complete frame (`len | type | flags | payload | crc`) into `out` with the
/// payload produced by `fill`; returns the frame length, or `None` when `out` is too small.
/// Never allocates.
pub fn encode_frame(
    out: &mut [u8],
    ty: RecordType,
    fill: impl FnOnce(&mut Cursor<'_>),
) -> Option<usize> {
    if out.len() < FRAME_OVERHEAD {
        return None;
    }
    let cap = out.len() - FRAME_OVERHEAD;
    let plen = {
        let mut c = Cursor::new(out.get_mut(8..8 + cap)?);
        fill(&mut c);
        if c.overflowed() {
            return None;
        }
        c.pos()
    };
    let len32 = u32::try_from(plen).ok()?;
    out.get_mut(0..4)?.copy_from_slice(&len32.to_le_bytes());
    out.get_mut(4..6)?
        .copy_from_slice(&(ty as u16).to_le_bytes());
    out.get_mut(6..8)?.copy_from_slice(&0u16.to_le_bytes());
    let crc = crc32(out.get(..8 + plen)?);
    out.get_mut(8 + plen..12 + plen)?
        .copy_from_slice(&crc.to_le_bytes());
    Some(plen + FRAME_OVERHEAD)
}

/// Bytes of a `Window` frame before its PT: the frame header and the fixed fields.
pub const WINDOW_HEAD_SIZE: usize = 8 + WINDOW_FIXED_SIZE;

/// The parts of a `Window` frame around its PT and sideband: the frame header with the
/// fixed fields, and the CRC (for writers that write the PT in place, vectored); `None`
/// when a length does not fit its field. Never allocates.
pub fn window_frame_parts(
    w: &Window,
    pt: &[u8],
    sideband: &[u8],
) -> Option<([u8; WINDOW_HEAD_SIZE], [u8; 4])> {
    let pt_len = u32::try_from(pt.len()).ok()?;
    let sb_len = u32::try_from(sideband.len()).ok()?;
    let plen = u32::try_from(WINDOW_FIXED_SIZE + pt.len() + sideband.len()).ok()?;
    let mut head = [0u8; WINDOW_HEAD_SIZE];
    let mut c = Cursor::new(&mut head);
    c.u32(plen);
    c.u16(RecordType::Window as u16);
    c.u16(0);
    c.u64(w.index);
    c.u64(w.nr);
    for a in w.args {
        c.u64(a);
    }
    c.i64(w.ret);
    c.u64(w.tsc_start);
    c.u64(w.tsc_end);
    c.u32(w.flags);
    c.u32(w.depth);
    c.u32(pt_len);
    c.u32(sb_len);
    let mut crc = Crc32::new();
    crc.update(&head);
    crc.update(pt);
    crc.update(sideband);
    Some((head, crc.finish().to_le_bytes()))
}

/// Encodes the fixed part of a window followed by its PT and sideband bytes.
pub fn encode_window(out: &mut [u8], w: &Window, pt: &[u8], sideband: &[u8]) -> Option<usize> {
    let (head, crc) = window_frame_parts(w, pt, sideband)?;
    let n = WINDOW_HEAD_SIZE + pt.len() + sideband.len() + 4;
    let mut c = Cursor::new(out.get_mut(..n)?);
    c.bytes(&head);
    c.bytes(pt);
    c.bytes(sideband);
    c.bytes(&crc);
    Some(n)
}

/// A whole frame of type `ty` around `payload` (for writers that are not in a signal
/// handler); `None` when the payload is over [`MAX_PAYLOAD`].
pub fn frame_vec(ty: RecordType, payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    let mut v = Vec::with_capacity(payload.len() + FRAME_OVERHEAD);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&(ty as u16).to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(payload);
    let crc = crc32(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    Some(v)
}

/// Payload of a `ThreadHeader` record.
pub fn thread_header_payload(h: &ThreadHeader) -> Vec<u8> {
    let mut v = Vec::with_capacity(32 + h.pt_absent_reason.len());
    v.extend_from_slice(&h.pid.to_le_bytes());
    v.extend_from_slice(&h.tid.to_le_bytes());
    v.extend_from_slice(&[h.mode, h.window, h.backend, u8::from(h.pt_present)]);
    v.extend_from_slice(&h.nonce.to_le_bytes());
    v.extend_from_slice(&h.start_tsc.to_le_bytes());
    v.extend_from_slice(h.pt_absent_reason.as_bytes());
    v
}

/// Payload of a `Process` record.
pub fn process_payload(p: &ProcessRecord) -> Vec<u8> {
    let mut v = Vec::with_capacity(40 + p.pt_absent_reason.len());
    v.extend_from_slice(&p.pid.to_le_bytes());
    v.extend_from_slice(&p.ppid.to_le_bytes());
    v.extend_from_slice(&p.nonce.to_le_bytes());
    v.extend_from_slice(&p.start_tsc.to_le_bytes());
    v.extend_from_slice(&p.start_monotonic_ns.to_le_bytes());
    v.extend_from_slice(&[p.mode, p.window, p.backend, u8::from(p.pt_present)]);
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(p.pt_absent_reason.as_bytes());
    v
}

/// Payload of an `End` record (thread files).
pub fn end_payload(reason: EndReason, written: u64, dropped: u64) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[0..4].copy_from_slice(&(reason as u32).to_le_bytes());
    v[8..16].copy_from_slice(&written.to_le_bytes());
    v[16..24].copy_from_slice(&dropped.to_le_bytes());
    v
}

/// Payload of a `ProcessEnd` record.
pub fn process_end_payload(
    reason: EndReason,
    code: i32,
    patched: u64,
    thread_files: u64,
) -> [u8; PROCESS_END_SIZE] {
    let mut v = [0u8; PROCESS_END_SIZE];
    v[0..4].copy_from_slice(&(reason as u32).to_le_bytes());
    v[4..8].copy_from_slice(&code.to_le_bytes());
    v[8..16].copy_from_slice(&patched.to_le_bytes());
    v[16..24].copy_from_slice(&thread_files.to_le_bytes());
    v
}

/// Size of a `ProcessEnd` payload as written now.
pub const PROCESS_END_SIZE: usize = 24;

// ---------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------

/// One frame as read from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Byte offset of the frame in the file.
    pub offset: usize,
    pub ty: u16,
    pub payload: &'a [u8],
}

/// How a file's frame sequence ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tail {
    /// Every byte belongs to a complete frame.
    #[default]
    Clean,
    /// The last `bytes` bytes from `offset` are an incomplete frame (the writer was killed).
    Truncated { offset: usize, bytes: usize },
    /// The frame at `offset` has a bad CRC or impossible length; `bytes` were ignored.
    Corrupt { offset: usize, bytes: usize },
}

/// A parsed file: kind, frames in order, and how it ended.
#[derive(Debug, Clone)]
pub struct ParsedFile<'a> {
    pub kind: FileKind,
    pub version: u32,
    pub frames: Vec<Frame<'a>>,
    pub tail: Tail,
}

/// Errors that prevent reading a file at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{0}: not a pttrace file (bad magic in the first 8 bytes)")]
    BadMagic(String),
    #[error("{0}: file is {1} bytes, shorter than the 16-byte header (truncated at creation)")]
    ShortHeader(String, usize),
    #[error("{0}: unsupported version {1} (this build reads version {VERSION})")]
    Version(String, u32),
    #[error("{0}: unknown file kind {1} at offset 12")]
    Kind(String, u32),
    #[error("{path}: record at offset {offset}: {what}")]
    Record {
        path: String,
        offset: usize,
        what: String,
    },
}

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// What comes at a frame boundary.
enum NextFrame {
    /// A frame whose payload has this length (its bytes are all there).
    Frame(usize),
    /// The frame sequence ends here, cleanly or not.
    End(Tail),
}

/// The verdict at offset `off` with `rest` bytes left in the file: `read_len` gives the
/// frame's length field (called only when a whole frame header is there). One rule for the
/// in-memory and the streaming readers.
fn next_frame<E>(
    off: usize,
    rest: usize,
    read_len: impl FnOnce() -> Result<u32, E>,
) -> Result<NextFrame, E> {
    if rest == 0 {
        return Ok(NextFrame::End(Tail::Clean));
    }
    let truncated = Tail::Truncated {
        offset: off,
        bytes: rest,
    };
    if rest < FRAME_OVERHEAD {
        return Ok(NextFrame::End(truncated));
    }
    let len = read_len()? as usize;
    if len > MAX_PAYLOAD {
        return Ok(NextFrame::End(Tail::Corrupt {
            offset: off,
            bytes: rest,
        }));
    }
    if rest < len + FRAME_OVERHEAD {
        return Ok(NextFrame::End(truncated));
    }
    Ok(NextFrame::Frame(len))
}

/// Splits `data` (a whole file; `name` is used in messages) into frames.
pub fn parse<'a>(name: &str, data: &'a [u8]) -> Result<ParsedFile<'a>, FormatError> {
    if data.len() < HEADER_SIZE {
        return Err(FormatError::ShortHeader(name.to_string(), data.len()));
    }
    if data[..8] != MAGIC {
        return Err(FormatError::BadMagic(name.to_string()));
    }
    let version = le_u32(data, 8).unwrap_or(0);
    if version != VERSION {
        return Err(FormatError::Version(name.to_string(), version));
    }
    let kind = match le_u32(data, 12).unwrap_or(0) {
        1 => FileKind::ProcessInfo,
        2 => FileKind::Thread,
        k => return Err(FormatError::Kind(name.to_string(), k)),
    };
    let mut frames = Vec::new();
    let mut off = HEADER_SIZE;
    let tail = loop {
        let rest = data.len() - off;
        let len = match next_frame(off, rest, || {
            Ok::<_, std::convert::Infallible>(le_u32(data, off).unwrap_or(u32::MAX))
        }) {
            Ok(NextFrame::Frame(len)) => len,
            Ok(NextFrame::End(tail)) => break tail,
            Err(never) => match never {},
        };
        let stored = le_u32(data, off + 8 + len).unwrap_or(0);
        if crc32(&data[off..off + 8 + len]) != stored {
            break Tail::Corrupt {
                offset: off,
                bytes: rest,
            };
        }
        frames.push(Frame {
            offset: off,
            ty: le_u16(data, off + 4).unwrap_or(0),
            payload: &data[off + 8..off + 8 + len],
        });
        off += len + FRAME_OVERHEAD;
    };
    Ok(ParsedFile {
        kind,
        version,
        frames,
        tail,
    })
}

/// A decoded window with its PT and sideband bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowRecord<'a> {
    pub window: Window,
    pub pt: &'a [u8],
    pub sideband: &'a [u8],
}

/// Decodes a `Window` payload.
pub fn decode_window(p: &[u8]) -> Option<WindowRecord<'_>> {
    let mut args = [0u64; 6];
    for (i, a) in args.iter_mut().enumerate() {
        *a = le_u64(p, 16 + 8 * i)?;
    }
    let w = Window {
        index: le_u64(p, 0)?,
        nr: le_u64(p, 8)?,
        args,
        ret: le_u64(p, 64)? as i64,
        tsc_start: le_u64(p, 72)?,
        tsc_end: le_u64(p, 80)?,
        flags: le_u32(p, 88)?,
        depth: le_u32(p, 92)?,
    };
    let pt_len = le_u32(p, 96)? as usize;
    let sb_len = le_u32(p, 100)? as usize;
    let pt = p.get(WINDOW_FIXED_SIZE..WINDOW_FIXED_SIZE.checked_add(pt_len)?)?;
    let sb_start = WINDOW_FIXED_SIZE + pt_len;
    let sideband = p.get(sb_start..sb_start.checked_add(sb_len)?)?;
    if sb_start + sb_len != p.len() {
        return None;
    }
    Some(WindowRecord {
        window: w,
        pt,
        sideband,
    })
}

/// Decoded `ThreadHeader`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadHeader {
    pub pid: i32,
    pub tid: i32,
    pub mode: u8,
    pub window: u8,
    pub backend: u8,
    pub pt_present: bool,
    pub nonce: u64,
    pub start_tsc: u64,
    pub pt_absent_reason: String,
}

pub fn decode_thread_header(p: &[u8]) -> Option<ThreadHeader> {
    Some(ThreadHeader {
        pid: le_u32(p, 0)? as i32,
        tid: le_u32(p, 4)? as i32,
        mode: *p.get(8)?,
        window: *p.get(9)?,
        backend: *p.get(10)?,
        pt_present: *p.get(11)? != 0,
        nonce: le_u64(p, 12)?,
        start_tsc: le_u64(p, 20)?,
        pt_absent_reason: String::from_utf8_lossy(p.get(28..)?).into_owned(),
    })
}

/// Decoded `Process` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRecord {
    pub pid: i32,
    pub ppid: i32,
    pub nonce: u64,
    pub start_tsc: u64,
    pub start_monotonic_ns: u64,
    pub mode: u8,
    pub window: u8,
    pub backend: u8,
    pub pt_present: bool,
    pub pt_absent_reason: String,
}

pub fn decode_process(p: &[u8]) -> Option<ProcessRecord> {
    Some(ProcessRecord {
        pid: le_u32(p, 0)? as i32,
        ppid: le_u32(p, 4)? as i32,
        nonce: le_u64(p, 8)?,
        start_tsc: le_u64(p, 16)?,
        start_monotonic_ns: le_u64(p, 24)?,
        mode: *p.get(32)?,
        window: *p.get(33)?,
        backend: *p.get(34)?,
        pt_present: *p.get(35)? != 0,
        pt_absent_reason: String::from_utf8_lossy(p.get(40..)?).into_owned(),
    })
}

/// Decoded `End` record: (reason, windows, dropped).
pub fn decode_end(p: &[u8]) -> Option<(u32, u64, u64)> {
    Some((le_u32(p, 0)?, le_u64(p, 8)?, le_u64(p, 16)?))
}

/// Decoded `Dropped` record: (since last, total).
pub fn decode_dropped(p: &[u8]) -> Option<(u64, u64)> {
    Some((le_u64(p, 0)?, le_u64(p, 8)?))
}

/// Decoded `Clock` record: (monotonic ns, tsc).
pub fn decode_clock(p: &[u8]) -> Option<(u64, u64)> {
    Some((le_u64(p, 0)?, le_u64(p, 8)?))
}

/// Decoded `ProcessEnd` record: (reason, exit code).
pub fn decode_process_end(p: &[u8]) -> Option<(u32, i32)> {
    Some((le_u32(p, 0)?, le_u32(p, 4)? as i32))
}

/// Syscall sites patched by the fast path, from a `ProcessEnd` payload.
pub fn decode_patched_sites(p: &[u8]) -> u64 {
    le_u64(p, 8).unwrap_or(0)
}

/// Thread files created for the image, from a `ProcessEnd` payload (`None`: not counted).
pub fn decode_thread_files(p: &[u8]) -> Option<u64> {
    le_u64(p, 16).filter(|&n| n > 0)
}

/// Decoded `Vdso` record: (address, bytes).
pub fn decode_vdso(p: &[u8]) -> Option<(u64, &[u8])> {
    Some((le_u64(p, 0)?, p.get(8..)?))
}

/// Mode byte -> name.
pub fn mode_name(m: u8) -> &'static str {
    match m {
        0 => "user",
        1 => "kernel",
        2 => "user_kernel",
        _ => "?",
    }
}

/// Window-kind byte -> name.
pub fn window_name(w: u8) -> &'static str {
    match w {
        0 => "syscall",
        1 => "thread",
        _ => "?",
    }
}

/// Backend byte -> name.
pub fn backend_name(b: u8) -> &'static str {
    match b {
        0 => "hardware",
        1 => "emulated",
        2 => "qemu",
        _ => "?",
    }
}

// ---------------------------------------------------------------------------------------
// Streaming reader (the whole-file summaries are in `crate::summary`)
// ---------------------------------------------------------------------------------------

/// Reads a file of `kind` one frame at a time, handing each to `f`; returns how the frame
/// sequence ended (the same verdicts as [`parse`]).
pub fn stream_frames(
    path: &Path,
    kind: FileKind,
    mut f: impl FnMut(&Frame<'_>) -> Result<(), FormatError>,
) -> Result<Tail, FormatError> {
    use std::io::Read;
    let name = path.display().to_string();
    let io = |e: std::io::Error, offset: usize| FormatError::Record {
        path: name.clone(),
        offset,
        what: format!("cannot read: {e}"),
    };
    let file = std::fs::File::open(path).map_err(|e| io(e, 0))?;
    let size = file.metadata().map_err(|e| io(e, 0))?.len() as usize;
    let mut r = std::io::BufReader::with_capacity(1 << 16, file);
    let mut head = [0u8; HEADER_SIZE];
    let n = read_full(&mut r, &mut head).map_err(|e| io(e, 0))?;
    // The header checks of `parse`, on the first 16 bytes.
    let parsed = parse(&name, &head[..n])?;
    if parsed.kind != kind {
        return Err(FormatError::Record {
            path: name.clone(),
            offset: 12,
            what: format!(
                "expected {}",
                match kind {
                    FileKind::ProcessInfo => "a process info file (kind 1)",
                    FileKind::Thread => "a thread file (kind 2)",
                }
            ),
        });
    }
    let mut off = HEADER_SIZE;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let rest = size.saturating_sub(off);
        let mut fh = [0u8; 8];
        let len = match next_frame(off, rest, || {
            r.read_exact(&mut fh)
                .map(|()| le_u32(&fh, 0).unwrap_or(u32::MAX))
        })
        .map_err(|e| io(e, off))?
        {
            NextFrame::Frame(len) => len,
            NextFrame::End(tail) => return Ok(tail),
        };
        buf.resize(len + 4, 0);
        r.read_exact(&mut buf).map_err(|e| io(e, off))?;
        let stored = le_u32(&buf, len).unwrap_or(0);
        let mut crc = Crc32::new();
        crc.update(&fh);
        crc.update(&buf[..len]);
        if crc.finish() != stored {
            return Ok(Tail::Corrupt {
                offset: off,
                bytes: rest,
            });
        }
        f(&Frame {
            offset: off,
            ty: le_u16(&fh, 4).unwrap_or(0),
            payload: &buf[..len],
        })?;
        off += len + FRAME_OVERHEAD;
    }
}

fn read_full(r: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        // The CRC-32C (CRC-32/ISCSI) check value of "123456789".
        assert_eq!(crc32(b"123456789"), 0xE306_9283);
        assert_eq!(crc32(b""), 0);
        // The instruction and table paths agree on every length and alignment.
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..9 {
            for end in start..data.len() {
                let t = crc32c_table(0xFFFF_FFFF, &data[start..end]);
                if std::arch::is_x86_feature_detected!("sse4.2") {
                    // SAFETY: SSE4.2 is present.
                    let h = unsafe { crc32c_sse42(0xFFFF_FFFF, &data[start..end]) };
                    assert_eq!(h, t, "{start}..{end}");
                }
            }
        }
    }

    #[test]
    fn frame_layout_is_exact() {
        let mut buf = [0u8; 64];
        let n = encode_frame(&mut buf, RecordType::Dropped, |c| {
            c.u64(3);
            c.u64(7);
        })
        .unwrap();
        assert_eq!(n, 12 + 16);
        assert_eq!(&buf[0..4], &16u32.to_le_bytes());
        assert_eq!(&buf[4..6], &3u16.to_le_bytes());
        assert_eq!(&buf[6..8], &[0, 0]);
        assert_eq!(&buf[8..16], &3u64.to_le_bytes());
        assert_eq!(&buf[16..24], &7u64.to_le_bytes());
        assert_eq!(&buf[24..28], &crc32(&buf[0..24]).to_le_bytes());
        // Too small a buffer is refused, not truncated.
        assert_eq!(
            encode_frame(&mut buf[..27], RecordType::Dropped, |c| {
                c.u64(3);
                c.u64(7);
            }),
            None
        );
    }

    fn sample_file() -> (Vec<u8>, Vec<usize>) {
        let mut file = encode_header(FileKind::Thread).to_vec();
        let mut ends = vec![];
        let mut buf = vec![0u8; 4096];
        for i in 0..3u64 {
            let w = Window {
                index: i,
                nr: 110,
                args: [1, 2, 3, 4, 5, 6],
                ret: -(i as i64),
                tsc_start: 100 * i,
                tsc_end: 100 * i + 50,
                flags: WF_PT_ABSENT,
                depth: 0,
            };
            let n = encode_window(&mut buf, &w, &[0xAA; 5][..i as usize], b"sb").unwrap();
            file.extend_from_slice(&buf[..n]);
            ends.push(file.len());
        }
        (file, ends)
    }

    #[test]
    fn windows_round_trip() {
        let (file, _) = sample_file();
        let p = parse("t", &file).unwrap();
        assert_eq!(p.kind, FileKind::Thread);
        assert_eq!(p.tail, Tail::Clean);
        assert_eq!(p.frames.len(), 3);
        let w = decode_window(p.frames[2].payload).unwrap();
        assert_eq!(w.window.index, 2);
        assert_eq!(w.window.nr, 110);
        assert_eq!(w.window.args, [1, 2, 3, 4, 5, 6]);
        assert_eq!(w.window.ret, -2);
        assert_eq!(w.window.tsc_end, 250);
        assert_eq!(w.pt, &[0xAA, 0xAA]);
        assert_eq!(w.sideband, b"sb");
    }

    #[test]
    fn every_truncation_point_is_detected() {
        let (file, ends) = sample_file();
        for cut in HEADER_SIZE..file.len() {
            let p = parse("t", &file[..cut]).unwrap();
            let complete = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(p.frames.len(), complete, "cut at {cut}");
            let last_end = if complete == 0 {
                HEADER_SIZE
            } else {
                ends[complete - 1]
            };
            if cut == last_end {
                assert_eq!(p.tail, Tail::Clean);
            } else {
                assert_eq!(
                    p.tail,
                    Tail::Truncated {
                        offset: last_end,
                        bytes: cut - last_end
                    },
                    "cut at {cut}"
                );
            }
        }
    }

    /// The streaming reader gives the same frames and the same tail verdict as `parse`, at
    /// every truncation point and with a flipped byte.
    #[test]
    fn streaming_reader_agrees_with_parse() {
        let dir = std::env::temp_dir().join(format!("ptt-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.ptt");
        let (file, ends) = sample_file();
        let mut flipped = file.clone();
        flipped[ends[0] + 20] ^= 0x40;
        let mut inputs: Vec<Vec<u8>> = (HEADER_SIZE..=file.len())
            .map(|c| file[..c].to_vec())
            .collect();
        inputs.push(flipped);
        for data in inputs {
            std::fs::write(&path, &data).unwrap();
            let p = parse("t", &data).unwrap();
            let mut seen = Vec::new();
            let tail = stream_frames(&path, FileKind::Thread, |f| {
                seen.push((f.offset, f.ty, f.payload.to_vec()));
                Ok(())
            })
            .unwrap();
            let want: Vec<_> = p
                .frames
                .iter()
                .map(|f| (f.offset, f.ty, f.payload.to_vec()))
                .collect();
            assert_eq!(seen, want, "{} bytes", data.len());
            assert_eq!(tail, p.tail, "{} bytes", data.len());
            let s = crate::summary::summarize_thread(&path).unwrap();
            assert_eq!(s.windows, p.frames.len() as u64);
            assert_eq!(s.tail, p.tail);
        }
        std::fs::write(&path, &file[..10]).unwrap();
        assert!(matches!(
            crate::summary::summarize_thread(&path),
            Err(FormatError::ShortHeader(_, 10))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_flipped_byte_is_corruption_not_data() {
        let (mut file, ends) = sample_file();
        file[ends[0] + 20] ^= 0x40;
        let p = parse("t", &file).unwrap();
        assert_eq!(p.frames.len(), 1);
        assert_eq!(
            p.tail,
            Tail::Corrupt {
                offset: ends[0],
                bytes: file.len() - ends[0]
            }
        );
    }

    #[test]
    fn bad_headers_are_named() {
        assert!(matches!(
            parse("x", b"short"),
            Err(FormatError::ShortHeader(_, 5))
        ));
        let mut h = encode_header(FileKind::Thread);
        h[0] = b'Q';
        assert!(matches!(parse("x", &h), Err(FormatError::BadMagic(_))));
        let mut h = encode_header(FileKind::Thread);
        h[8] = 9;
        assert!(matches!(parse("x", &h), Err(FormatError::Version(_, 9))));
    }
}
