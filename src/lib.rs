//! drpttracer: Intel Processor Trace capture and decode for Linux x86-64.
//!
//! Layers, from the C ABI down:
//! - [`ffi`]: DynamoRIO's drpttracer C API (ABI only, thin) and `drpttracer_ext_*` extensions;
//! - [`tracer`]: thread-affine handles over a capture backend;
//! - backends: [`perf`] (hardware Intel PT via perf_event_open) and [`emu`] (software
//!   single-stepping that emits genuine PT packets);
//! - [`sideband`] (perf records: mappings, comm, loss) and [`metadata`] (CPU, time conversion);
//! - [`format`]: on-disk formats (DynamoRIO's `.raw.pt`, our per-thread files);
//! - [`decode`]: PT + sideband + images -> drmemtrace-style records, built on libipt;
//! - [`shim`]: the LD_PRELOAD syscall-window tracer;
//! - the `pttrace` CLI (`src/bin/pttrace`).

pub mod backend;
pub mod capture;
pub mod emu;
pub use pttrace_decode as decode;
pub mod error;
pub mod ffi;
pub use pttrace_format::metadata;
pub mod format;
pub mod perf;
pub mod probe;
pub mod shim;
pub mod sideband;
pub mod tracer;

pub use error::{Error, Result, Status};
pub use metadata::{BackendKind, ExtMetadata, PtMetadata};
pub use tracer::{BackendChoice, Mode, OutputBuffers, Tracer, TracerConfig, WindowCapture};
