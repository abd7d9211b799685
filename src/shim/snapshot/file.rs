//! The file copy of a thread's snapshot ring, so that a SIGKILL of the process does not
//! lose it (layout and recovery: [`crate::format::ringfile`]).
//!
//! **Normal context only: the writer thread** ([`super::ring`] owns each thread's
//! [`RingFile`] beside its ring in memory). A forked child starts with fresh rings and
//! files of its own; the parent's mappings it inherited are never written by it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::*};

use super::super::paths;
use super::super::raw;
use crate::format::ptt::{window_frame_parts, Window, WINDOW_HEAD_SIZE};
use crate::format::ringfile::{
    capacity_for, file_len, CARRY_OFFSET, CARRY_SIZE, DATA_OFFSET, MAGIC, OFF_CAP, OFF_CARRY,
    OFF_DISCARDED, OFF_DISCARDED_PT, OFF_END, OFF_NEXT_INDEX, OFF_NONCE, OFF_PID, OFF_SIZE,
    OFF_START, OFF_VERSION, VERSION,
};

const EXT: &[u8] = b".snapring";

/// A thread's ring file, mapped shared.
pub struct RingFile {
    base: *mut u8,
    len: usize,
    cap: u64,
    start: u64,
    end: u64,
    /// Byte lengths of the frames from `start`, oldest first.
    frames: VecDeque<u64>,
    carry_len: usize,
    carry_slot: u64,
}

impl Drop for RingFile {
    fn drop(&mut self) {
        raw::munmap(self.base, self.len);
    }
}

impl RingFile {
    /// Creates (and maps) the ring file of thread `tid` of image (`pid`, `nonce`) for a
    /// ring of `size` PT bytes; why not when it cannot.
    pub fn create(pid: i32, nonce: u64, tid: i32, size: u64) -> Result<RingFile, String> {
        let cap = capacity_for(size);
        let len = usize::try_from(file_len(cap)).map_err(|_| "too large".to_string())?;
        let mut path = paths::thread_file(pid, nonce, tid, EXT)
            .ok_or_else(|| "the output path is too long".to_string())?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
        let fd = raw::open(path.c_str(), flags, 0o644);
        if fd < 0 {
            return Err(format!("cannot create it (errno {})", -fd));
        }
        // The blocks are reserved: a store into a shared mapping of a sparse file on a full
        // disk would raise SIGBUS.
        let r = raw::fallocate(fd, len as u64);
        let base = (r == 0).then(|| raw::mmap_shared(fd, len)).flatten();
        raw::close(fd);
        let Some(base) = base else {
            raw::unlink(path.c_str());
            return Err(if r != 0 {
                format!("cannot reserve {len} bytes for it (errno {})", -r)
            } else {
                format!("cannot map its {len} bytes")
            });
        };
        let f = RingFile {
            base,
            len,
            cap,
            start: 0,
            end: 0,
            frames: VecDeque::new(),
            carry_len: 0,
            carry_slot: 0,
        };
        f.bytes_mut(OFF_VERSION, 4)
            .copy_from_slice(&VERSION.to_le_bytes());
        f.word(OFF_CAP).store(cap, Relaxed);
        f.word(OFF_SIZE).store(size, Relaxed);
        f.word(OFF_PID)
            .store((pid as u32 as u64) | ((tid as u32 as u64) << 32), Relaxed);
        f.word(OFF_NONCE).store(nonce, Relaxed);
        // The magic last: a reader never takes a half-made file for a ring.
        f.word(0).store(u64::from_le_bytes(MAGIC), Release);
        Ok(f)
    }

    /// `n` bytes of the mapping at `off` (inside it, or an empty slice).
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self, off: usize, n: usize) -> &mut [u8] {
        if off.checked_add(n).is_none_or(|e| e > self.len) {
            return &mut [];
        }
        // SAFETY: the range is inside the live mapping, which only this writer-thread
        // object writes (a reader of the file is another process); callers never hold two
        // of these slices at once.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(off), n) }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        static NONE: AtomicU64 = AtomicU64::new(0);
        if off % 8 != 0 || off + 8 > DATA_OFFSET {
            return &NONE;
        }
        // SAFETY: an 8-aligned word of the page-aligned, live mapping's header.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Copies `bytes` to logical offset `at` of the data area (wrapping).
    fn put(&self, at: u64, bytes: &[u8]) {
        let pos = (at % self.cap) as usize;
        let first = bytes.len().min(self.cap as usize - pos);
        self.bytes_mut(DATA_OFFSET + pos, first)
            .copy_from_slice(&bytes[..first]);
        let rest = &bytes[first..];
        self.bytes_mut(DATA_OFFSET, rest.len())
            .copy_from_slice(rest);
    }

    fn drop_front(&mut self) {
        if let Some(n) = self.frames.pop_front() {
            self.start += n;
        }
    }

    /// Appends window `w`'s frame, dropping the oldest frames while it needs their room.
    pub fn push(&mut self, w: &Window, pt: &[u8], sideband: &[u8]) {
        let total = (WINDOW_HEAD_SIZE + pt.len() + sideband.len() + 4) as u64;
        let Some((head, crc)) = window_frame_parts(w, pt, sideband) else {
            return;
        };
        if total > self.cap {
            // Larger than the file: it holds nothing older either (a recovery takes less
            // than the ring, never something out of order).
            self.clear();
            return;
        }
        while self.end - self.start + total > self.cap {
            self.drop_front();
        }
        // Room first (the frames overwritten are gone from the file), then the bytes, then
        // the end that publishes them.
        self.word(OFF_START).store(self.start, Release);
        let mut at = self.end;
        for part in [&head[..], pt, sideband, &crc[..]] {
            self.put(at, part);
            at += part.len() as u64;
        }
        self.end = at;
        self.frames.push_back(total);
        self.word(OFF_END).store(self.end, Release);
    }

    /// Keeps the newest `n` frames (the ring dropped the others).
    pub fn keep_last(&mut self, n: usize) {
        if self.frames.len() > n {
            while self.frames.len() > n {
                self.drop_front();
            }
            self.word(OFF_START).store(self.start, Release);
        }
    }

    /// Empties the file (the ring was written).
    pub fn clear(&mut self) {
        self.frames.clear();
        self.start = self.end;
        self.word(OFF_START).store(self.start, Release);
    }

    /// The ring's counts of dropped windows, their sideband and its next window index.
    pub fn set_state(&mut self, discarded: (u64, u64, &[u8]), next_index: u64) {
        let (windows, pt, sideband) = discarded;
        self.word(OFF_DISCARDED).store(windows, Relaxed);
        self.word(OFF_DISCARDED_PT).store(pt, Relaxed);
        self.word(OFF_NEXT_INDEX).store(next_index, Relaxed);
        if sideband.len() == self.carry_len || sideband.len() > CARRY_SIZE {
            // Unchanged (it only grows between snapshots), or too large: the file keeps
            // the last that fitted.
            return;
        }
        // Into the slot not in use, then switch.
        let slot = if self.carry_slot == 1 { 2 } else { 1 };
        let at = CARRY_OFFSET + (slot as usize - 1) * CARRY_SIZE;
        self.bytes_mut(at, sideband.len()).copy_from_slice(sideband);
        let word = if sideband.is_empty() {
            0
        } else {
            sideband.len() as u64 | (slot << 32)
        };
        self.word(OFF_CARRY).store(word, Release);
        self.carry_slot = slot;
        self.carry_len = sideband.len();
    }
}

/// Removes the ring file of a thread whose file is complete. Async-signal-safe (it runs
/// where the spool is removed, in a handler's drain too).
pub fn remove(pid: i32, nonce: u64, tid: i32) {
    if let Some(mut p) = paths::thread_file(pid, nonce, tid, EXT) {
        raw::unlink(p.c_str());
    }
}
