//! Files of a vfork-style child (`posix_spawn`, `clone(CLONE_VM|CLONE_VFORK)` on a new
//! stack). **Async-signal-safe**: everything here runs inside the SIGSYS handler of the
//! child (no allocation, no locks, no std I/O, no panics).
//!
//! Such a child is a new process that runs on its parent's memory and thread-local storage
//! until it execs or exits, while the parent thread waits in `clone`. It therefore finds
//! the parent thread's slot; it must not touch the parent's queue or the process globals
//! (other parent threads keep running and read them). Its windows go, synchronously, into
//! files of its own image instead: `<pid>-<nonce>.info` and `<pid>-<nonce>-<pid>.ptt`
//! (plus `kernel.raw/<pid>.raw.pt` in kernel modes), opened at its first recorded syscall.
//! The state lives in [`ChildFiles`] inside the parent's slot: only the child touches it
//! between the clone and the parent's return, and the parent resets it afterwards. Records
//! collect in [`ChildBuf`] (also in the slot) and reach the files when it is full and at
//! the child's exec or exit, so a child makes a handful of writes, not one per syscall.
//! (A child killed before either loses what was buffered, like the writer thread's last
//! 10 ms after SIGKILL.)
//!
//! The child's `execve` writes its window with `WF_NO_RETURN` and the `Exec` ends first and
//! retracts them if the exec fails; `exit`/`exit_group` end the files.

use super::output::{self, Image};
use super::raw;
use super::slots::{Slot, STATIC};
use crate::format::ptt::{encode_frame, encode_window, EndReason, RecordType, Window};
use std::sync::atomic::Ordering::*;

pub use super::child_files::{ChildBuf, ChildFiles};

/// The parent, before issuing a vfork-style clone from `slot`.
pub fn arm(slot: &Slot, clone_flags: u64) {
    // SAFETY: the calling thread owns its slot; no child runs on it yet.
    let c = unsafe { &mut *slot.child.get() };
    *c = ChildFiles {
        armed: true,
        shared_fds: clone_flags & libc::CLONE_FILES as u64 != 0,
        info: -1,
        fd: -1,
        kfd: -1,
        ..ChildFiles::default()
    };
}

/// The parent, back from the clone: the child has exec'd or exited.
pub fn disarm(slot: &Slot) {
    // SAFETY: the child no longer runs on the slot (the parent thread resumed).
    let c = unsafe { &mut *slot.child.get() };
    if c.armed && c.open && c.shared_fds {
        // The child's descriptors landed in our table as well.
        for fd in [c.info, c.fd, c.kfd] {
            raw::close(fd);
        }
    }
    *c = ChildFiles::default();
}

/// Runs `f` on the child's files, opened on first use. None when they cannot be created.
fn with_files<R>(slot: &Slot, f: impl FnOnce(&mut ChildFiles, &mut ChildBuf) -> R) -> Option<R> {
    // SAFETY: called by the vfork-style child, the only thread using the slot until the
    // parent resumes; the references do not outlive this call.
    let (c, b) = unsafe { (&mut *slot.child.get(), &mut *slot.child_buf.get()) };
    if !c.armed {
        return None;
    }
    if !c.open {
        let st = STATIC.get()?;
        let img = Image {
            pid: raw::getpid(),
            nonce: raw::rdtsc() & 0xFFFF_FFFF,
            start_tsc: raw::rdtsc(),
        };
        c.pid = img.pid;
        c.nonce = img.nonce;
        c.start_tsc = img.start_tsc;
        c.info = output::create_info_file(&img);
        c.fd = output::create_thread_file(&img, img.pid, st);
        c.kfd = if st.kernel_raw {
            output::create_kernel_raw(img.pid, img.pid, st)
        } else {
            -1
        };
        c.open = true;
    }
    (c.fd >= 0).then(|| f(c, b))
}

/// Writes out what is buffered.
fn flush(c: &mut ChildFiles, b: &ChildBuf) {
    raw::write_all(c.fd, b.thread.get(..c.tlen).unwrap_or(&[]));
    c.tlen = 0;
    if c.kfd >= 0 {
        raw::write_all(c.kfd, b.kernel.get(..c.klen).unwrap_or(&[]));
    }
    c.klen = 0;
}

/// Records a completed window of the child (numbered in the child's own file).
pub fn record(slot: &Slot, w: &mut Window) {
    with_files(slot, |c, b| record_into(c, b, w));
}

fn record_into(c: &mut ChildFiles, b: &mut ChildBuf, w: &mut Window) {
    w.index = c.next_index;
    c.next_index += 1;
    for _ in 0..2 {
        let (tail, ktail) = (
            b.thread.get_mut(c.tlen..).unwrap_or(&mut []),
            b.kernel.get_mut(c.klen..).unwrap_or(&mut []),
        );
        let n = encode_window(tail, w, &[], &[]);
        let k = if c.kfd >= 0 {
            output::encode_pdb_for(ktail, c.pid, c.pid, w, 0)
        } else {
            Some(0)
        };
        if let (Some(n), Some(k)) = (n, k) {
            c.tlen += n;
            c.klen += k;
            c.written += 1;
            return;
        }
        // A buffer is full: write both out (keeping their orders) and encode again.
        flush(c, b);
    }
}

/// Ends the child's thread and info files (`exit`, `exit_group`, before an `execve`).
pub fn end(slot: &Slot, reason: EndReason, code: i32) {
    with_files(slot, |c, b| end_files(c, b, reason, code));
}

fn end_files(c: &mut ChildFiles, b: &ChildBuf, reason: EndReason, code: i32) {
    flush(c, b);
    let mut buf = [0u8; 48];
    if let Some(n) = encode_frame(&mut buf, RecordType::End, |f| {
        f.u32(reason as u32);
        f.u32(0);
        f.u64(c.written);
        f.u64(0);
    }) {
        raw::write_all(c.fd, buf.get(..n).unwrap_or(&[]));
    }
    output::write_process_end_to(c.info, reason, code, u64::from(c.fd >= 0));
}

/// Where the child's files stand before an exec's records.
#[derive(Clone, Copy)]
pub struct Mark {
    /// Sizes of the thread, info and kernel.raw files (-1 where absent).
    pos: [i64; 3],
    next_index: u64,
    written: u64,
}

pub fn mark(slot: &Slot) -> Option<Mark> {
    with_files(slot, |c, b| {
        flush(c, b);
        Mark {
            pos: [raw::end_of(c.fd), raw::end_of(c.info), raw::end_of(c.kfd)],
            next_index: c.next_index,
            written: c.written,
        }
    })
}

/// A failed exec: cut the files back to `m`.
pub fn retract(slot: &Slot, m: Option<Mark>) {
    let Some(m) = m else { return };
    with_files(slot, |c, _| retract_files(c, m));
}

/// (The exec's records were flushed by [`end`]: nothing is buffered here.)
fn retract_files(c: &mut ChildFiles, m: Mark) {
    for (fd, p) in [c.fd, c.info, c.kfd].into_iter().zip(m.pos) {
        if fd >= 0 && p >= 0 {
            // Truncating does not move the offset of the (non-append) thread file.
            raw::ftruncate(fd, p as u64);
            raw::sys3(libc::SYS_lseek, fd as u64, p as u64, libc::SEEK_SET as u64);
        }
    }
    c.next_index = m.next_index;
    c.written = m.written;
}

/// Whether a vfork-style child runs on `slot` now.
pub fn active(slot: &Slot) -> bool {
    slot.vfork_child.load(Acquire)
}
