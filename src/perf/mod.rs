//! Hardware Intel PT backend: perf_event_open on the `intel_pt` PMU.
//!
//! - [`pmu`]: the PMU's type, format terms and caps from sysfs;
//! - [`event`]: the event fd and its DATA/AUX mappings;
//! - [`ring`]: control page access and ring copies;
//! - [`hardware`]: the [`CaptureBackend`](crate::capture::CaptureBackend) built from them;
//! - [`hwsnap`]: snapshot mode: an overwrite-mode AUX area to `Snapshot` records;
//! - [`sideband_event`]: a software dummy event for the sideband of the emulated backend.

pub mod event;
pub mod hardware;
pub mod hwsnap;
pub mod pmu;
pub mod ring;
pub mod sideband_event;

pub use hardware::HardwareBackend;
