//! Trace handles: one per thread, each driving a capture backend.
//!
//! A [`Tracer`] belongs to the thread that created it. It picks a backend
//! ([`crate::perf`] for Intel PT hardware, [`crate::emu`] for the software emulation),
//! starts and stops trace windows and copies each window into caller buffers.
//! The C ABI in [`crate::ffi`] is a thin layer over this type plus a handle registry.

use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, ExtMetadata, PtMetadata};

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

    /// The backend this choice resolves to for `mode` on this machine.
    pub fn resolve(self, mode: Mode) -> Result<BackendKind> {
        match self {
            BackendChoice::Hardware => Ok(BackendKind::Hardware),
            BackendChoice::Emulated => Ok(BackendKind::Emulated),
            BackendChoice::Auto => {
                if crate::perf::pmu::IntelPtPmu::probe().is_ok() || mode.traces_kernel() {
                    // Kernel modes can only be hardware; its open reports why it fails.
                    Ok(BackendKind::Hardware)
                } else {
                    Ok(BackendKind::Emulated)
                }
            }
        }
    }
}

/// Parameters of a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracerConfig {
    pub mode: Mode,
    /// PT ring = 2^shift pages (> 0).
    pub pt_size_shift: u32,
    /// Sideband ring = 2^shift pages (> 0).
    pub sideband_size_shift: u32,
    pub backend: BackendChoice,
}

/// Largest accepted ring shift: 2^24 pages = 64 GiB, well past any mlock limit.
pub const MAX_SIZE_SHIFT: u32 = 24;

impl TracerConfig {
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("pt_size_shift", self.pt_size_shift),
            ("sideband_size_shift", self.sideband_size_shift),
        ] {
            if v == 0 || v > MAX_SIZE_SHIFT {
                return Err(Error::invalid(format!(
                    "{name}={v} is out of range: rings are 2^shift pages, shift must be 1..={MAX_SIZE_SHIFT}"
                )));
            }
        }
        Ok(())
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

/// Owned output buffers of the sizes `drpttracer_create_output` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputBuffers {
    pub pt: Vec<u8>,
    pub pt_size: usize,
    pub sideband: Vec<u8>,
    pub sideband_size: usize,
}

impl OutputBuffers {
    /// PT buffer of 2^`pt_shift` pages; sideband of (2^`sd_shift` + 1) pages or none for 0.
    pub fn new(pt_shift: u32, sd_shift: u32) -> Result<Self> {
        if pt_shift == 0 || pt_shift > MAX_SIZE_SHIFT {
            return Err(Error::invalid(format!(
                "pt_buf_size_shift={pt_shift} is out of range 1..={MAX_SIZE_SHIFT}"
            )));
        }
        if sd_shift > MAX_SIZE_SHIFT {
            return Err(Error::invalid(format!(
                "sd_buf_size_shift={sd_shift} is out of range 0..={MAX_SIZE_SHIFT}"
            )));
        }
        let page = page_size();
        let pt_len = page << pt_shift;
        let sd_len = if sd_shift == 0 {
            0
        } else {
            ((1usize << sd_shift) + 1) * page
        };
        let alloc = |len: usize, what: &str| -> Result<Vec<u8>> {
            let mut v = Vec::new();
            v.try_reserve_exact(len).map_err(|_| {
                Error::new(
                    Status::FailedToAllocateOutputBuffer,
                    format!("cannot allocate the {len}-byte {what} output buffer"),
                )
            })?;
            v.resize(len, 0);
            Ok(v)
        };
        Ok(OutputBuffers {
            pt: alloc(pt_len, "PT")?,
            pt_size: 0,
            sideband: alloc(sd_len, "sideband")?,
            sideband_size: 0,
        })
    }

    /// The PT bytes of the last window.
    pub fn pt_data(&self) -> &[u8] {
        &self.pt[..self.pt_size.min(self.pt.len())]
    }
    /// The sideband bytes of the last window.
    pub fn sideband_data(&self) -> &[u8] {
        &self.sideband[..self.sideband_size.min(self.sideband.len())]
    }
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

/// A trace handle bound to the thread that created it.
pub struct Tracer {
    backend: Box<dyn CaptureBackend>,
    mode: Mode,
    owner_tid: i32,
    tracing: bool,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("backend", &self.backend.kind())
            .field("mode", &self.mode)
            .field("owner_tid", &self.owner_tid)
            .field("tracing", &self.tracing)
            .finish()
    }
}

impl Tracer {
    /// Creates a handle for the calling thread.
    pub fn new(config: TracerConfig) -> Result<Tracer> {
        config.validate()?;
        let kind = config.backend.resolve(config.mode)?;
        let backend: Box<dyn CaptureBackend> = match kind {
            BackendKind::Hardware => Box::new(crate::perf::HardwareBackend::open(
                config.mode,
                config.pt_size_shift,
                config.sideband_size_shift,
            )?),
            BackendKind::Emulated => Box::new(crate::emu::EmulatedBackend::open(
                config.mode,
                config.pt_size_shift,
                config.sideband_size_shift,
            )?),
        };
        Ok(Tracer {
            backend,
            mode: config.mode,
            owner_tid: current_tid(),
            tracing: false,
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }
    pub fn owner_tid(&self) -> i32 {
        self.owner_tid
    }
    pub fn backend_kind(&self) -> BackendKind {
        self.backend.kind()
    }
    pub fn is_tracing(&self) -> bool {
        self.tracing
    }

    fn check_thread(&self, what: &str) -> Result<()> {
        let tid = current_tid();
        if tid != self.owner_tid {
            return Err(Error::invalid(format!(
                "{what}: tracer_handle belongs to thread {} but was used from thread {tid}; \
                 create one handle per thread",
                self.owner_tid
            )));
        }
        Ok(())
    }

    /// Starts a window on the owning thread.
    pub fn start(&mut self) -> Result<()> {
        self.check_thread("start_tracing")?;
        if self.tracing {
            return Err(Error::new(
                Status::FailedToStartTracing,
                "start_tracing: this handle is already tracing; call stop_tracing first",
            ));
        }
        self.backend.start()?;
        self.tracing = true;
        Ok(())
    }

    /// Stops the window and copies it into `out` (sizes set even when data was lost).
    pub fn stop(&mut self, out: &mut OutputBuffers) -> Result<WindowCapture> {
        let cap = self.stop_into(&mut out.pt, Some(&mut out.sideband))?;
        out.pt_size = cap.pt_size;
        out.sideband_size = cap.sideband_size;
        Ok(cap)
    }

    /// Stops the window and copies it into raw buffers; `sideband` may be `None`.
    pub fn stop_into(
        &mut self,
        pt: &mut [u8],
        sideband: Option<&mut [u8]>,
    ) -> Result<WindowCapture> {
        self.check_thread("stop_tracing")?;
        if !self.tracing {
            return Err(Error::new(
                Status::FailedToStopTracing,
                "stop_tracing: this handle is not tracing; call start_tracing first",
            ));
        }
        self.tracing = false;
        let sideband = if self.mode.has_sideband() {
            sideband.filter(|s| !s.is_empty())
        } else {
            None
        };
        self.backend.stop(pt, sideband)
    }

    pub fn metadata(&self) -> PtMetadata {
        self.backend.metadata().base
    }
    pub fn ext_metadata(&self) -> ExtMetadata {
        self.backend.metadata()
    }
}
