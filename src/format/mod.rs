//! On-disk formats. The trace-file format shared with the QEMU plugin lives in the
//! `pttrace-format` crate and is re-exported here.

pub mod auxtrace;
pub mod pdb;
pub use pttrace_format::code;
pub use pttrace_format::ptt;
