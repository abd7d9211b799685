//! On-disk formats.

pub mod pdb;
pub mod ptt;
