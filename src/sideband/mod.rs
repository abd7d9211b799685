//! Sideband: perf records (mappings, comm, task, loss) and their sources.
//!
//! - [`record`]: parse/encode perf records;
//! - [`synth`]: MMAP2 records synthesized from `/proc/self/maps`, vDSO bytes.
//!
//! (The software dummy perf event that yields real kernel records lives in
//! [`crate::perf::sideband_event`]: it is a perf event.)

pub use pttrace_format::perf_record as record;
pub mod synth;
