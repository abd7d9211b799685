//! Snapshot (flight-recorder) mode of the shim on the hardware backend (`pttrace run
//! --backend hardware --mode user --window thread --snapshot SIZE [--trigger ...]`): each
//! application thread's user code in its own `intel_pt` event whose AUX area is in
//! overwrite mode ([`crate::perf::hardware::HardwareSnapshot`]; what a firing writes is
//! [`crate::perf::hwsnap`]'s, the same `Snapshot` record and window as on simulated rings).
//!
//! **Normal context only: everything here runs on the writer thread** (it allocates and
//! opens events); the handler's side, which stops a thread's trace at a `syscall:`
//! trigger, is [`super::request::fire_if_trigger`]. Firings, their numbers and notes are
//! [`super::ring`]'s, shared with the single-step backend; this module is what a
//! thread's "ring" is on this backend.
//!
//! - The writer opens a thread's event (per thread: `pid` = its tid, `cpu` -1, user mode,
//!   enabled at once) the first time it drains the thread's slot: the main thread's at
//!   start-up, a new thread's while the thread waits at its start (the clone stub's
//!   start trap, [`super::request::await_thread_event`], bounded), so that each thread is
//!   traced from its first instruction. The shim's own writer thread and anything the
//!   kernel does are not traced. The shim's SIGSYS handler is user code of the thread and is traced with
//!   it (it shows between the syscall's PGD and the next PGE).
//! - A firing disables the event, writes the PT since the previous snapshot (its last
//!   SIZE bytes from their first PSB) with the sideband since then, and enables it again.
//!   `syscall:NAME`: the handler disabled the event right after that syscall, so the
//!   firing thread's snapshot ends there; other threads (and `signal:` requests) are
//!   written at the writer's next pass, their PT running until then.
//! - `addr:` triggers are refused: Intel PT shows no address as it is executed (the
//!   single-step and QEMU backends see every instruction).
//! - A SIGKILL takes the AUX areas with the process: nothing is recovered (the single-step
//!   backend's rings have a file copy; these live in kernel memory).
//! - Limits: each thread maps an AUX area of SIZE rounded up to a power of two of pages,
//!   and the DATA ring; the kernel charges them to `perf_event_mlock_kb` and then
//!   RLIMIT_MEMLOCK. A thread whose event cannot be opened is named in a note of the info
//!   file with the kernel's reason, and its firings write nothing for it.

use std::io;

use super::super::config::{ShimConfig, WindowKind};
use super::super::raw;
use super::super::slots::Slot;
use crate::capture::Mode;
use crate::format::snapshot::TriggerKind;
use crate::metadata::BackendKind;
use crate::perf::hardware::HardwareSnapshot;
use crate::perf::hwsnap::Firing;

/// Whether this configuration keeps hardware snapshots: snapshot mode, user mode, thread
/// windows, on the hardware backend.
pub fn wanted(cfg: &ShimConfig, backend: BackendKind) -> bool {
    cfg.snapshot.is_some()
        && cfg.mode == Mode::UserOnly
        && cfg.window == WindowKind::Thread
        && backend == BackendKind::Hardware
}

/// A thread's overwrite-mode event; its descriptor is published in the slot for the
/// handler while it lives.
pub struct ThreadPt {
    snap: HardwareSnapshot,
    slot: *const Slot,
}

impl ThreadPt {
    /// Opens thread `slot`'s event (SIZE bytes of AUX area at least, 2^`sb_shift` pages of
    /// DATA ring). Err: the kernel's reason.
    pub fn open(slot: &Slot, size: u64, sb_shift: u32) -> Result<ThreadPt, String> {
        let tid = slot.tid.load(std::sync::atomic::Ordering::Relaxed);
        let snap = HardwareSnapshot::open_thread(tid, Mode::UserOnly, size, sb_shift)
            .map_err(|e| e.message)?;
        slot.snap_fd
            .store(snap.raw_fd(), std::sync::atomic::Ordering::Release);
        Ok(ThreadPt { snap, slot })
    }

    /// Writes the snapshot of firing `number` into the thread file `fd`: the `Snapshot`
    /// record and (unless empty) one window. Ok(true): a window was written.
    pub fn write(
        &mut self,
        fd: i32,
        number: u64,
        kind: TriggerKind,
        fired_tid: i32,
        trigger: &str,
    ) -> Result<bool, String> {
        let firing = Firing {
            number,
            kind,
            fired_tid,
            trigger: trigger.to_string(),
            tsc: raw::rdtsc(),
        };
        let written = self
            .snap
            .write_snapshot(&firing, &mut FdWriter(fd))
            .map_err(|e| e.message)?;
        Ok(written.window.is_some())
    }
}

impl Drop for ThreadPt {
    fn drop(&mut self) {
        // SAFETY: slots are never unmapped.
        let slot = unsafe { &*self.slot };
        let fd = self.snap.raw_fd();
        // Only ours: a recycled slot may already carry its new thread's (-1 until opened).
        let _ = slot.snap_fd.compare_exchange(
            fd,
            -1,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// A thread file's descriptor as an `io::Write` (the shim's raw `write` loop).
struct FdWriter(i32);

impl io::Write for FdWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if raw::write_all(self.0, buf) {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "writing {} bytes to descriptor {} failed",
                buf.len(),
                self.0
            )))
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
