//! The thread's spool: its window queue and its unreturned syscalls in a `MAP_SHARED`
//! mapping of `<pid>-<nonce>-<tid>.spool`, so that a SIGKILL of the process loses nothing
//! the application's syscalls completed (layout and recovery:
//! [`crate::format::spool`]). **Async-signal-safe**: raw syscalls and plain stores only.
//!
//! Life of a spool: created (with its blocks reserved) when a thread claims its slot;
//! the writer releases an entry only after its window is in the `.ptt`; removed once the
//! thread's `End` record is written. At `execve` it is set aside (`.spool.exec`) and put
//! back if the exec fails; the new image removes its pid's set-aside spools at start-up.
//! When the file cannot be made (disk full, read-only directory) the queue lives in
//! anonymous memory as before and a kill loses the queued windows.

use super::paths;
use super::raw;
use crate::format::spool::{
    ENTRIES_OFFSET, ENTRY_SIZE, FLAG_IN_FLIGHT_OVERFLOW, IN_FLIGHT_SIZE, IN_FLIGHT_SLOTS, MAGIC,
    OFF_CAP, OFF_DROPPED, OFF_ENTRY_SIZE, OFF_FLAGS, OFF_IN_FLIGHT, OFF_MODE, OFF_NONCE, OFF_PID,
    OFF_START_TSC, OFF_TID, OFF_VERSION, VERSION,
};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// A spool mapping.
#[derive(Clone, Copy)]
pub struct Mapping {
    pub base: *mut u8,
    pub len: usize,
}

/// What the header records besides the queue.
pub struct Identity {
    pub pid: i32,
    pub tid: i32,
    pub nonce: u64,
    pub start_tsc: u64,
    pub cap: usize,
    /// mode, window, backend, pt_present (as in the ThreadHeader).
    pub kind: [u8; 4],
}

/// Creates the spool of thread `tid` of image (`pid`, `nonce`) for `cap` entries and maps
/// it; anonymous memory when the file cannot be created and reserved.
pub fn create(pid: i32, nonce: u64, tid: i32, cap: usize) -> Option<Mapping> {
    let len = crate::format::spool::file_len(cap);
    let wanted = super::process::STATIC.get().is_some_and(|st| st.spool);
    if let Some(mut path) = paths::thread_file(pid, nonce, tid, b".spool").filter(|_| wanted) {
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
        let fd = raw::open(path.c_str(), flags, 0o644);
        if fd >= 0 {
            let base = (raw::fallocate(fd, len as u64) == 0)
                .then(|| raw::mmap_shared(fd, len))
                .flatten();
            raw::close(fd);
            if let Some(base) = base {
                return Some(Mapping { base, len });
            }
            raw::unlink(path.c_str());
        }
    }
    raw::mmap_anon(len).map(|base| Mapping { base, len })
}

/// Unmaps a spool (its file, if any, stays as it is).
pub fn unmap(m: Mapping) {
    if !m.base.is_null() {
        raw::munmap(m.base, m.len);
    }
}

/// The queue entries of a spool.
pub fn entries(m: Mapping) -> *mut u8 {
    m.base.wrapping_add(ENTRIES_OFFSET)
}

/// The 8-byte word at `off` of the spool header at `base`.
fn word(base: *mut u8, off: usize) -> Option<&'static AtomicU64> {
    if base.is_null() || off % 8 != 0 || off + 8 > ENTRIES_OFFSET {
        return None;
    }
    // SAFETY: base is a live spool mapping (never unmapped while its slot can use it) of at
    // least ENTRIES_OFFSET bytes, page-aligned, and `off` is 8-aligned inside the header.
    Some(unsafe { &*(base.add(off) as *const AtomicU64) })
}

fn put32(base: *mut u8, off: usize, v: u32) {
    if base.is_null() || off % 4 != 0 || off + 4 > ENTRIES_OFFSET {
        return;
    }
    // SAFETY: as in `word`, for a 4-aligned u32 inside the header.
    unsafe { (*(base.add(off) as *const AtomicU32)).store(v, Relaxed) };
}

/// Writes the header; the magic goes last, after the entries were initialized, so that a
/// reader never takes a half-made spool for a queue.
pub fn publish_header(base: *mut u8, id: &Identity) {
    put32(base, OFF_VERSION, VERSION);
    put32(base, OFF_ENTRY_SIZE, ENTRY_SIZE as u32);
    let set = |off: usize, v: u64| {
        if let Some(w) = word(base, off) {
            w.store(v, Relaxed);
        }
    };
    set(OFF_CAP, id.cap as u64);
    set(
        OFF_PID,
        (id.pid as u32 as u64) | ((id.tid as u32 as u64) << 32),
    );
    debug_assert_eq!(OFF_TID, OFF_PID + 4);
    set(OFF_NONCE, id.nonce);
    set(OFF_START_TSC, id.start_tsc);
    set(OFF_DROPPED, 0);
    set(OFF_FLAGS, 0);
    set(OFF_MODE, u64::from(u32::from_le_bytes(id.kind)));
    for d in 0..IN_FLIGHT_SLOTS {
        set(OFF_IN_FLIGHT + d * IN_FLIGHT_SIZE, 0);
    }
    set(0, u64::from_le_bytes(MAGIC));
    std::sync::atomic::fence(Release);
}

/// The spool's count of windows dropped under backpressure.
pub fn dropped(base: *mut u8) -> &'static AtomicU64 {
    static NONE: AtomicU64 = AtomicU64::new(0);
    word(base, OFF_DROPPED).unwrap_or(&NONE)
}

/// Records that the thread entered syscall `nr` at nesting `depth` at TSC `t0`.
pub fn enter(base: *mut u8, depth: u32, t0: u64, nr: u64, args: &[u64; 6]) {
    let d = depth as usize;
    if d >= IN_FLIGHT_SLOTS {
        if let Some(f) = word(base, OFF_FLAGS) {
            f.fetch_or(FLAG_IN_FLIGHT_OVERFLOW, Relaxed);
        }
        return;
    }
    let at = OFF_IN_FLIGHT + d * IN_FLIGHT_SIZE;
    if let Some(w) = word(base, at + 8) {
        w.store(nr, Relaxed);
    }
    for (i, a) in args.iter().enumerate() {
        if let Some(w) = word(base, at + 16 + 8 * i) {
            w.store(*a, Relaxed);
        }
    }
    if let Some(w) = word(base, at) {
        w.store(t0.max(1), Release);
    }
}

/// The syscall at nesting `depth` has its window queued.
pub fn leave(base: *mut u8, depth: u32) {
    let d = depth as usize;
    if d < IN_FLIGHT_SLOTS {
        if let Some(w) = word(base, OFF_IN_FLIGHT + d * IN_FLIGHT_SIZE) {
            w.store(0, Release);
        }
    }
}

/// Removes the spool file of a thread whose file is complete.
pub fn remove(pid: i32, nonce: u64, tid: i32) {
    if let Some(mut p) = paths::thread_file(pid, nonce, tid, b".spool") {
        raw::unlink(p.c_str());
    }
}

/// Sets the spool aside before an `execve` (`.spool` -> `.spool.exec`); with `back`, puts
/// it back (the exec failed).
pub fn set_aside(pid: i32, nonce: u64, tid: i32, back: bool) {
    let (Some(mut a), Some(mut b)) = (
        paths::thread_file(pid, nonce, tid, b".spool"),
        paths::thread_file(pid, nonce, tid, b".spool.exec"),
    ) else {
        return;
    };
    if back {
        raw::rename(b.c_str(), a.c_str());
    } else {
        raw::rename(a.c_str(), b.c_str());
    }
}
