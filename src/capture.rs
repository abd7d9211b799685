//! What every capture backend shares, and nothing else: the tracing [`Mode`], the
//! [`BackendChoice`] a caller asks for, the [`CaptureBackend`] trait and what one window
//! produced ([`WindowCapture`]), and the thread/page helpers backends use. Backends
//! ([`crate::perf`], [`crate::emu`]) depend on this module; the choice between them is
//! made in [`crate::backend`], below [`crate::tracer`].

use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, ExtMetadata};

/// What a handle traces (values are the C ABI's `drpttracer_tracing_mode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Mode {
    UserOnly = 0,
    KernelOnly = 1,
    UserAndKernel = 2,
}

impl Mode {
    pub fn from_raw(v: u32) -> Option<Mode> {
        match v {
            0 => Some(Mode::UserOnly),
            1 => Some(Mode::KernelOnly),
            2 => Some(Mode::UserAndKernel),
            _ => None,
        }
    }
    pub fn traces_user(self) -> bool {
        matches!(self, Mode::UserOnly | Mode::UserAndKernel)
    }
    pub fn traces_kernel(self) -> bool {
        matches!(self, Mode::KernelOnly | Mode::UserAndKernel)
    }
    /// Sideband (mappings) is collected in the modes that trace user code.
    pub fn has_sideband(self) -> bool {
        self.traces_user()
    }
    pub fn name(self) -> &'static str {
        match self {
            Mode::UserOnly => "user",
            Mode::KernelOnly => "kernel",
            Mode::UserAndKernel => "user_kernel",
        }
    }
}

/// Which backend a handle should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// Hardware when the `intel_pt` PMU exists, else emulated for user-only modes.
    Auto,
    Hardware,
    Emulated,
}

/// Name of the environment variable that forces a backend.
pub const BACKEND_ENV: &str = "PTTRACER_BACKEND";

impl BackendChoice {
    /// The name [`BackendChoice::parse`] takes for it.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Hardware => "hardware",
            BackendChoice::Emulated => "emulated",
        }
    }

    /// Reads [`BACKEND_ENV`]: unset/empty/`auto`, `hardware`, `emulated`.
    pub fn from_env() -> Result<BackendChoice> {
        match std::env::var(BACKEND_ENV) {
            Err(_) => Ok(BackendChoice::Auto),
            Ok(v) => BackendChoice::parse(&v),
        }
    }

    pub fn parse(v: &str) -> Result<BackendChoice> {
        match v.trim() {
            "" | "auto" => Ok(BackendChoice::Auto),
            "hardware" | "hw" => Ok(BackendChoice::Hardware),
            "emulated" | "emu" => Ok(BackendChoice::Emulated),
            other => Err(Error::invalid(format!(
                "{BACKEND_ENV}={other:?} is not a backend: use auto, hardware or emulated"
            ))),
        }
    }
}

/// What one stopped window produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCapture {
    /// Bytes of PT copied into the caller's PT buffer.
    pub pt_size: usize,
    /// Bytes of sideband (raw perf records) copied into the caller's sideband buffer.
    pub sideband_size: usize,
    /// PT data of this window was lost (ring full/truncated, overflow, or aux loss flags).
    pub pt_lost: bool,
    /// Sideband records of this window were lost (ring wrapped or PERF_RECORD_LOST).
    pub sideband_lost: bool,
    /// The window's PT did not fit the caller's buffer; `pt_size` bytes were copied.
    pub pt_truncated_by_output: bool,
    /// The window's sideband did not fit the caller's buffer.
    pub sideband_truncated_by_output: bool,
}

impl WindowCapture {
    /// The status the C API reports for this window.
    pub fn status(&self) -> Status {
        if self.pt_lost {
            Status::OverwrittenPtTrace
        } else if self.pt_truncated_by_output {
            Status::FailedToReadPtData
        } else if self.sideband_lost {
            Status::OverwrittenSidebandData
        } else if self.sideband_truncated_by_output {
            Status::FailedToReadSidebandData
        } else {
            Status::Success
        }
    }
}

/// A capture mechanism: hardware Intel PT or its software emulation.
///
/// A backend is created, started and stopped on the thread that owns its handle.
pub trait CaptureBackend: Send {
    fn kind(&self) -> BackendKind;
    /// Begins a window (enables tracing of the calling thread).
    fn start(&mut self) -> Result<()>;
    /// Ends the window and copies its PT into `pt` and, in user modes, its sideband into
    /// `sideband`. Ring positions advance so the backend is ready for the next window.
    fn stop(&mut self, pt: &mut [u8], sideband: Option<&mut [u8]>) -> Result<WindowCapture>;
    /// Metadata needed to decode this backend's traces.
    fn metadata(&self) -> ExtMetadata;
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// Set inside DynamoRIO ([`uncache_tids`]): every [`current_tid`] asks the kernel.
static TID_UNCACHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes [`current_tid`] ask the kernel every time. For DynamoRIO's private loader: the
/// private libc this library runs on there never calls its fork handlers (the
/// application's fork goes through the application's libc), so a cached id would survive
/// into a forked child.
pub fn uncache_tids() {
    TID_UNCACHED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Bumped in the child of every fork (pthread_atfork), invalidating cached thread ids.
static FORK_GENERATION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
static ATFORK_REGISTERED: std::sync::Once = std::sync::Once::new();

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

thread_local! {
    /// (fork generation, tid) of the calling thread; generation u32::MAX = not cached.
    static TID_CACHE: std::cell::Cell<(u32, i32)> = const { std::cell::Cell::new((u32::MAX, 0)) };
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// The calling thread's kernel thread id.
///
/// Cached per thread (and revalidated after fork) so that start/stop paths, which run
/// inside trace windows, make no gettid syscall of their own.
pub fn current_tid() -> i32 {
    if TID_UNCACHED.load(std::sync::atomic::Ordering::Relaxed) {
        return gettid();
    }
    ATFORK_REGISTERED.call_once(|| {
        // SAFETY: registers a child handler that only bumps an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    let generation = FORK_GENERATION.load(std::sync::atomic::Ordering::Relaxed);
    TID_CACHE
        .try_with(|c| {
            let (g, tid) = c.get();
            if g == generation {
                tid
            } else {
                let tid = gettid();
                c.set((generation, tid));
                tid
            }
        })
        .unwrap_or_else(|_| gettid())
}
