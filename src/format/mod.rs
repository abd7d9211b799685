//! On-disk formats. The trace-file format shared with the QEMU plugin lives in the
//! `pttrace-format` crate and is re-exported here.

pub use pttrace_format::auxtrace;
pub use pttrace_format::code;
pub use pttrace_format::launch;
pub use pttrace_format::memory;
pub use pttrace_format::pdb;
pub use pttrace_format::ptt;
pub use pttrace_format::ringfile;
pub use pttrace_format::snapshot;
pub use pttrace_format::snapshot_ring;
pub use pttrace_format::spool;
pub use pttrace_format::summary;
