//! The state of a vfork-style child's own files, kept in its parent thread's slot
//! ([`super::slots::Slot::child`]): the data only; [`super::vfork_child`] uses it.
//! **Async-signal-safe**: plain data, written by the child in its SIGSYS handler.

/// The files of the vfork-style child running on a slot. All zero: none.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub struct ChildFiles {
    /// A vfork-style clone was issued from this slot and has not returned to the parent.
    pub armed: bool,
    /// The child's descriptors are in the parent's table too (CLONE_FILES).
    pub shared_fds: bool,
    /// Files are open (the child recorded something).
    pub open: bool,
    pub pid: i32,
    pub nonce: u64,
    pub start_tsc: u64,
    pub info: i32,
    pub fd: i32,
    pub kfd: i32,
    pub next_index: u64,
    pub written: u64,
    /// Bytes buffered in [`ChildBuf`] for the thread and the kernel.raw file.
    pub tlen: usize,
    pub klen: usize,
}

/// Buffers of the child's thread and kernel.raw files (valid when zeroed).
#[repr(C)]
pub struct ChildBuf {
    pub thread: [u8; 8192],
    pub kernel: [u8; 8192],
}
