//! The shim's per-thread output files.
