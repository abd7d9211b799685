//! Hardware Intel PT backend: perf_event_open on the `intel_pt` PMU.
//!
//! - [`pmu`]: the PMU's type, format terms and caps from sysfs;
//! - [`event`]: the event fd and its DATA/AUX mappings;
//! - [`ring`]: control page access and ring copies;
//! - [`hardware`]: the [`CaptureBackend`](crate::tracer::CaptureBackend) built from them.

pub mod event;
pub mod hardware;
pub mod pmu;
pub mod ring;

pub use hardware::HardwareBackend;
