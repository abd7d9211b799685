//! Sideband: perf records (mappings, comm, task, loss) and their sources.
//!
//! - [`record`]: parse/encode perf records;
//! - [`synth`]: MMAP2 records synthesized from `/proc/self/maps`, vDSO bytes;
//! - [`event`]: a software dummy perf event that yields real kernel records.

pub mod event;
pub mod record;
pub mod synth;
