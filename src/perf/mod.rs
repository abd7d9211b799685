//! Hardware Intel PT backend: perf_event_open on the `intel_pt` PMU.

pub mod event;
pub mod pmu;
pub mod ring;

use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, ExtMetadata};
use crate::tracer::{CaptureBackend, Mode, WindowCapture};

/// Placeholder until the hardware backend lands.
pub struct HardwareBackend {
    meta: ExtMetadata,
}

impl HardwareBackend {
    pub fn open(_mode: Mode, _pt_shift: u32, _sb_shift: u32) -> Result<Self> {
        pmu::IntelPtPmu::probe()?;
        Err(Error::new(
            Status::FailedToOpenPerfEvent,
            "hardware backend not yet built",
        ))
    }
}

impl CaptureBackend for HardwareBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Hardware
    }
    fn start(&mut self) -> Result<()> {
        Err(Error::new(Status::FailedToStartTracing, "not available"))
    }
    fn stop(&mut self, _pt: &mut [u8], _sb: Option<&mut [u8]>) -> Result<WindowCapture> {
        Err(Error::new(Status::FailedToStopTracing, "not available"))
    }
    fn metadata(&self) -> ExtMetadata {
        self.meta
    }
}
