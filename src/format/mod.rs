//! On-disk formats.

pub mod auxtrace;
pub mod pdb;
pub mod ptt;
