//! Trace handles: one per thread, each driving a capture backend.
//!
//! A [`Tracer`] belongs to the thread that created it. It gets its backend from
//! [`crate::backend`] ([`crate::perf`] for Intel PT hardware, [`crate::emu`] for the
//! software emulation),
//! starts and stops trace windows and copies each window into caller buffers.
//! The C ABI in [`crate::ffi`] is a thin layer over this type plus a handle registry.

pub use crate::capture::{
    current_tid, page_size, BackendChoice, CaptureBackend, Mode, WindowCapture, BACKEND_ENV,
};
use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, ExtMetadata, PtMetadata};

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
        let backend = crate::backend::open(
            kind,
            config.mode,
            config.pt_size_shift,
            config.sideband_size_shift,
        )?;
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
