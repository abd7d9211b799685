//! On-disk formats of pttrace without any capture or decode dependency, so that every
//! writer (the LD_PRELOAD shim, the QEMU plugin) and every reader share one definition:
//! - [`ptt`]: the process info (`.info`) and per-thread (`.ptt`) files;
//! - [`code`]: the code records (perf `PERF_RECORD_TEXT_POKE`) with which software
//!   backends put the executed instruction bytes into a window's sideband.

pub mod code;
pub mod ptt;
