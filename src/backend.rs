//! Backend selection: which [`CaptureBackend`] a handle gets ([`BackendChoice::resolve`])
//! and opening it ([`open`]). The only module that knows every backend; [`crate::tracer`]
//! uses it, backends never do.

use crate::capture::{BackendChoice, CaptureBackend, Mode};
use crate::error::Result;
use crate::metadata::BackendKind;

impl BackendChoice {
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

/// Opens the backend `kind` for the calling thread.
pub fn open(
    kind: BackendKind,
    mode: Mode,
    pt_size_shift: u32,
    sideband_size_shift: u32,
) -> Result<Box<dyn CaptureBackend>> {
    Ok(match kind {
        BackendKind::Hardware => Box::new(crate::perf::HardwareBackend::open(
            mode,
            pt_size_shift,
            sideband_size_shift,
        )?),
        BackendKind::Emulated => Box::new(crate::emu::EmulatedBackend::open(
            mode,
            pt_size_shift,
            sideband_size_shift,
        )?),
    })
}
