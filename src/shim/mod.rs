//! LD_PRELOAD shim: traces syscall windows of unmodified binaries.
