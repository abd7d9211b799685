//! Emulated Intel PT backend (software single-stepping that emits genuine PT packets).

use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, ExtMetadata};
use crate::tracer::{CaptureBackend, Mode, WindowCapture};

/// Placeholder until the emulated backend lands.
pub struct EmulatedBackend {
    _mode: Mode,
}

impl EmulatedBackend {
    pub fn open(mode: Mode, _pt_shift: u32, _sb_shift: u32) -> Result<Self> {
        let _ = mode;
        Err(Error::new(
            Status::FailedToOpenPerfEvent,
            "the emulated backend is not available in this build",
        ))
    }
}

impl CaptureBackend for EmulatedBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Emulated
    }
    fn start(&mut self) -> Result<()> {
        Err(Error::new(Status::FailedToStartTracing, "not available"))
    }
    fn stop(&mut self, _pt: &mut [u8], _sb: Option<&mut [u8]>) -> Result<WindowCapture> {
        Err(Error::new(Status::FailedToStopTracing, "not available"))
    }
    fn metadata(&self) -> ExtMetadata {
        unreachable_metadata()
    }
}

fn unreachable_metadata() -> ExtMetadata {
    ExtMetadata {
        base: Default::default(),
        cpuid_0x15_eax: 0,
        cpuid_0x15_ebx: 0,
        nom_freq: 0,
        mtc_freq: 0,
        time_zero_valid: false,
        backend: BackendKind::Emulated,
        perf_type: 0,
        perf_config: 0,
        sideband_sample_type: 0,
    }
}
