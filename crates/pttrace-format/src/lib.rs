//! On-disk formats of pttrace without any capture or decode dependency, so that every
//! writer (the LD_PRELOAD shim, the QEMU plugin) and every reader share one definition:
//! - [`ptt`]: the process info (`.info`) and per-thread (`.ptt`) files; [`spool`]: the
//!   per-thread queue that survives SIGKILL (`.spool`) and its recovery;
//! - [`code`]: the code records (perf `PERF_RECORD_TEXT_POKE`) with which software
//!   backends put the executed instruction bytes into a window's sideband;
//! - [`perf_record`]: perf sideband records (parse/encode), [`maps`]: `/proc/<pid>/maps`;
//! - [`metadata`]: `pt_metadata_t` and the extended metadata, CPU identity, time conversion;
//! - [`pdb`]: DynamoRIO's `kernel.raw` PT Data Buffers; [`auxtrace`]: perf's AUXTRACE;
//! - [`drmemtrace`]: DynamoRIO's drmemtrace offline trace records (what `decode --format
//!   drmemtrace` writes);
//! - [`snapshot`]: snapshot (flight-recorder) mode: sizes, triggers, the `Snapshot` record;
//! - [`summary`]: whole-file summaries for `pttrace report`;
//! - [`sysnames`]: x86-64 syscall names;
//! - [`launch`]: the QEMU command line shared by `pttrace run` and the QEMU plugin.

pub mod auxtrace;
pub mod code;
pub mod drmemtrace;
pub mod launch;
pub mod leb128;
pub mod maps;
pub mod memory;
pub mod metadata;
pub mod pdb;
pub mod perf_record;
pub mod ptt;
pub mod ringfile;
pub mod snapshot;
pub mod snapshot_ring;
pub mod spool;
pub mod summary;
pub mod sysnames;
