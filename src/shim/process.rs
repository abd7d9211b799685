//! Process-wide shim state: the settings fixed at start-up ([`Static`]) and the image's
//! flags and counters. The bottom of the shim: every layer reads it, it imports no other
//! shim module but `config`. **Async-signal-safe**: plain statics and atomics (the
//! `Static` is written once, in normal context, before the handler is installed).

use super::config::{Backpressure, SyscallFilter, WindowKind};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64};
use std::sync::OnceLock;

/// Settings fixed at start-up (normal context), read by the handler.
pub struct Static {
    pub filter: SyscallFilter,
    pub mode: u8,
    pub window: WindowKind,
    pub backend: u8,
    pub pt_present: bool,
    /// Why PT is absent (empty when present).
    pub reason: String,
    pub config_text: String,
    pub out_dir: Vec<u8>,
    pub queue_cap: usize,
    pub backpressure: Backpressure,
    /// Queues in `.spool` files (see [`super::spool`]).
    pub spool: bool,
    /// The `Metadata` record payload (50 bytes).
    pub metadata: [u8; 50],
    /// The 18-byte pt_metadata_t.
    pub pt_metadata: [u8; 18],
    /// vDSO address and length (0, 0 when absent).
    pub vdso: (u64, usize),
    /// Write DynamoRIO `kernel.raw/<tid>.raw.pt` files.
    pub kernel_raw: bool,
    /// Patch syscall sites into direct calls (site stubs or the page-0 trampoline ready).
    pub rewrite: bool,
    /// Path of this library as loaded (for `LD_PRELOAD` in exec'd images).
    pub lib_path: Vec<u8>,
    /// `PTTRACER_*=value\0` entries carried into exec'd images.
    pub exec_env: Vec<Vec<u8>>,
}

pub static STATIC: OnceLock<Static> = OnceLock::new();

/// The handler is installed and recording.
pub static ACTIVE_FLAG: AtomicBool = AtomicBool::new(false);
/// pid and image nonce of this process image (changed in forked children).
pub static PID: AtomicI32 = AtomicI32::new(0);
pub static NONCE: AtomicU64 = AtomicU64::new(0);
pub static START_TSC: AtomicU64 = AtomicU64::new(0);
/// Application threads alive (the writer thread excluded).
pub static LIVE: AtomicI64 = AtomicI64::new(0);
/// A writer thread exists in this process.
pub static WRITER_ALIVE: AtomicBool = AtomicBool::new(false);
/// Futex word the writer sleeps on.
pub static WAKE: AtomicU32 = AtomicU32::new(0);
/// Exit code of the thread-group leader's `exit` (the process status when the last
/// thread leaves with `exit`).
pub static LEADER_CODE: AtomicI32 = AtomicI32::new(0);
/// The process info file (kept open to append `Clock`/`ProcessEnd`).
pub static INFO_FD: AtomicI32 = AtomicI32::new(-1);
/// `ProcessEnd` has been written.
pub static PROCESS_ENDED: AtomicBool = AtomicBool::new(false);

/// Syscall sites patched into direct calls so far (written into the `ProcessEnd` record).
pub static PATCHED: AtomicU64 = AtomicU64::new(0);
/// Thread files created for the current image (in its `ProcessEnd`: a reader then tells
/// when some are missing); zeroed with each new info file.
pub static THREAD_FILES: AtomicU64 = AtomicU64::new(0);
/// Snapshot mode is on (set at start-up).
pub static SNAPSHOT_ON: AtomicBool = AtomicBool::new(false);
/// The single-step backend records user PT in thread windows (set at start-up).
pub static USER_PT_ON: AtomicBool = AtomicBool::new(false);
