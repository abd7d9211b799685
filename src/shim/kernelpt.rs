//! Hardware Intel PT of kernel-mode syscall windows in the shim. **Async-signal-safe
//! module, except [`init`]**: [`enter`], [`leave`] and [`publish`] run in the SIGSYS
//! handler or in the patched-site entry, [`take`]/[`release`] on the drainer (the writer
//! thread, or the handler at `exit_group`/`execve`): raw syscalls, atomics and the perf
//! mappings only (no allocation, no locks, no std I/O, no panics).
//!
//! Design (perf_event_open(2), REFERENCE §2): at start-up [`init`] builds the
//! `perf_event_attr` of the `intel_pt` PMU for the mode (normal context). Each thread opens
//! its event at its first traced window (`perf_event_open` for itself with FD_CLOEXEC, then
//! the control page + DATA ring and the AUX area mapped read-write: linear mode, the kernel
//! stops and flags TRUNCATED instead of overwriting what we have not read). Per window:
//! `ioctl(ENABLE)` right before the syscall, `ioctl(DISABLE)` right after; the handler then
//! only notes where the AUX and DATA heads stand and, once the window has its index, pushes
//! `(index, aux end, data end)` into a small single-producer ring in the slot. It copies
//! nothing. The drainer takes each window's PT straight out of the AUX mapping (one or two
//! pieces when it wraps), reads the DATA records of the window for AUX TRUNCATED/LOST flags,
//! and advances both tails.
//!
//! Only ordinary syscalls get PT (the ones the SIGSYS handler performs itself or a patched
//! site performs); nested windows, syscalls with special handling (clone, exec, exit,
//! signals…) and vfork-style children keep `WF_PT_ABSENT`. When the ring of pending windows
//! is full, tracing is not enabled for that window (it is written with `WF_PT_DROPPED`), so
//! the AUX ranges always belong to exactly one window. Forked children open their own event
//! (perf mappings are not inherited); the drainer closes and unmaps a thread's event after
//! its last window.

use super::config::{ShimConfig, WindowKind};
use super::raw;
use super::slots::Slot;
use crate::format::ptt::{Window, WF_CAPTURE_ERROR, WF_PT_ABSENT, WF_PT_DROPPED, WF_PT_LOST};
use crate::perf::hardware::{pt_attr, pt_config};
use crate::perf::pmu::IntelPtPmu;
use crate::perf::ring::AUX_LOSS_FLAGS;
use crate::perf::ring::{copy_ring_records, ControlPage, RingMemory};
use perf_event_open_sys::bindings::{self, perf_event_attr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::OnceLock;

use super::kpt_slot::FD_NONE;
pub use super::kpt_slot::PENDING;

/// The event attributes (set once by [`init`]).
static ATTR: OnceLock<perf_event_attr> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);
/// DATA ring and AUX area sizes in bytes (powers of two).
static DATA_LEN: AtomicU64 = AtomicU64::new(0);
static AUX_LEN: AtomicU64 = AtomicU64::new(0);

/// fd state besides a real descriptor or none: opening the event failed.
const FD_FAILED: i32 = -2;

pub use super::kpt_slot::KptSlot;

impl KptSlot {
    /// Closes the event and unmaps its areas (the drainer, after the thread's last window).
    pub fn close(&self) {
        let fd = self.fd.swap(FD_NONE, Relaxed);
        let (ctl, aux) = (self.ctl.swap(0, Relaxed), self.aux.swap(0, Relaxed));
        if ctl != 0 {
            raw::munmap(ctl as *mut u8, page() + DATA_LEN.load(Relaxed) as usize);
        }
        if aux != 0 {
            raw::munmap(aux as *mut u8, AUX_LEN.load(Relaxed) as usize);
        }
        raw::close(fd);
    }

    fn control(&self) -> Option<ControlPage> {
        let p = NonNull::new(self.ctl.load(Acquire) as *mut u8)?;
        // SAFETY: ctl is the base of our live control page mapping (page aligned, one page
        // or more), unmapped only by `close` after the last use.
        Some(unsafe { ControlPage::new(p) })
    }

    fn rings(&self) -> Option<(ControlPage, RingMemory, RingMemory)> {
        let ctl = self.control()?;
        let data = NonNull::new((self.ctl.load(Acquire) as usize + page()) as *mut u8)?;
        let aux = NonNull::new(self.aux.load(Acquire) as *mut u8)?;
        // SAFETY: the DATA ring follows the control page in the same live mapping and the
        // AUX area is its own live mapping; both lengths are the powers of two mapped.
        let (data, aux) = unsafe {
            (
                RingMemory::new(data, DATA_LEN.load(Relaxed) as usize),
                RingMemory::new(aux, AUX_LEN.load(Relaxed) as usize),
            )
        };
        Some((ctl, data, aux))
    }
}

fn page() -> usize {
    crate::tracer::page_size()
}

/// Whether this configuration gets hardware PT from the shim: kernel modes with syscall
/// windows on the hardware backend.
pub fn wanted(cfg: &ShimConfig) -> bool {
    cfg.mode.traces_kernel() && cfg.window == WindowKind::Syscall
}

/// Prepares the event attributes (normal context). Err says why PT stays absent.
pub fn init(cfg: &ShimConfig) -> Result<(), String> {
    let pmu = IntelPtPmu::probe().map_err(|e| e.message)?;
    let (config, _) = pt_config(&pmu, cfg.mode).map_err(|e| e.message)?;
    let attr = pt_attr(pmu.pmu_type, config, cfg.mode);
    let _ = ATTR.set(attr);
    DATA_LEN.store((page() as u64) << cfg.sb_shift.min(24), Relaxed);
    AUX_LEN.store((page() as u64) << cfg.pt_shift.min(24), Relaxed);
    ENABLED.store(true, Release);
    Ok(())
}

pub fn enabled() -> bool {
    ENABLED.load(Acquire)
}

/// Opens the calling thread's event on first use. False when it cannot be (the thread's
/// windows then carry `WF_CAPTURE_ERROR`).
fn ensure_open(k: &KptSlot) -> bool {
    match k.fd.load(Relaxed) {
        FD_FAILED => return false,
        fd if fd >= 0 => return true,
        _ => {}
    }
    let ok = open_event(k);
    if !ok {
        k.close();
        k.fd.store(FD_FAILED, Relaxed);
    }
    ok
}

fn open_event(k: &KptSlot) -> bool {
    let Some(attr) = ATTR.get() else { return false };
    let mut attr = *attr;
    let fd = raw::sys6(
        libc::SYS_perf_event_open as u64,
        [
            core::ptr::addr_of_mut!(attr) as u64,
            0,
            u64::MAX, // cpu -1: any CPU, this thread
            u64::MAX, // no group
            u64::from(bindings::PERF_FLAG_FD_CLOEXEC),
            0,
        ],
    );
    if fd < 0 {
        return false;
    }
    k.fd.store(fd as i32, Relaxed);
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let (data_len, aux_len) = (DATA_LEN.load(Relaxed), AUX_LEN.load(Relaxed));
    let ctl_len = page() as u64 + data_len;
    let ctl = raw::sys6(
        libc::SYS_mmap as u64,
        [0, ctl_len, rw, libc::MAP_SHARED as u64, fd as u64, 0],
    );
    if (-4095..0).contains(&ctl) {
        return false;
    }
    k.ctl.store(ctl as u64, Release);
    let Some(c) = k.control() else { return false };
    let aux_offset = ctl_len;
    c.set_aux_area(aux_offset, aux_len);
    let aux = raw::sys6(
        libc::SYS_mmap as u64,
        [
            0,
            aux_len,
            rw,
            libc::MAP_SHARED as u64,
            fd as u64,
            aux_offset,
        ],
    );
    if (-4095..0).contains(&aux) {
        return false;
    }
    k.aux.store(aux as u64, Release);
    true
}

fn ioctl(fd: i32, req: u64) -> bool {
    raw::sys3(libc::SYS_ioctl, fd as u64, req, 0) == 0
}

/// Before an ordinary syscall of a recorded, outermost window: enables tracing. Returns
/// whether it did (pass to [`leave`]).
pub fn enter(slot: &Slot, record: bool, depth: u32) -> bool {
    if !enabled() || !record || !candidate(slot, depth) {
        return false;
    }
    let k = &slot.kpt;
    if k.head.load(Relaxed).wrapping_sub(k.tail.load(Acquire)) >= PENDING as u64 {
        return false;
    }
    ensure_open(k) && ioctl(k.fd.load(Relaxed), u64::from(bindings::ENABLE))
}

/// After the syscall: disables tracing and notes where the window's data ends; marks the
/// window as carrying PT (or why it does not).
pub fn leave(slot: &Slot, armed: bool, w: &mut Window) {
    if !enabled() || !candidate(slot, w.depth) {
        return;
    }
    let k = &slot.kpt;
    if !armed {
        w.flags |= match k.fd.load(Relaxed) {
            FD_FAILED => WF_CAPTURE_ERROR,
            _ => WF_PT_DROPPED,
        };
        return;
    }
    ioctl(k.fd.load(Relaxed), u64::from(bindings::DISABLE));
    let Some(c) = k.control() else { return };
    k.pending_aux.store(c.aux_head(), Relaxed);
    k.pending_data.store(c.data_head(), Relaxed);
    k.has_pending.store(true, Relaxed);
    w.flags &= !WF_PT_ABSENT;
}

/// Whether a window at nesting `depth` can get PT: outermost, not a vfork child's.
fn candidate(slot: &Slot, depth: u32) -> bool {
    depth == 0 && !slot.vfork_child.load(Acquire)
}

/// The window noted by [`leave`] got its index: hand its range to the drainer.
pub fn publish(slot: &Slot, index: u64) {
    let k = &slot.kpt;
    if !k.has_pending.swap(false, Relaxed) {
        return;
    }
    let h = k.head.load(Relaxed);
    let e = &k.ring[(h % PENDING as u64) as usize];
    e[0].store(index, Relaxed);
    e[1].store(k.pending_aux.load(Relaxed), Relaxed);
    e[2].store(k.pending_data.load(Relaxed), Relaxed);
    k.head.store(h + 1, Release);
}

/// A window's PT as the drainer finds it: up to two pieces of the AUX mapping.
pub struct WindowPt<'a> {
    pub pieces: [&'a [u8]; 2],
    pub flags: u32,
    aux_end: u64,
    data_end: u64,
}

impl WindowPt<'_> {
    pub fn len(&self) -> usize {
        self.pieces[0].len() + self.pieces[1].len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The PT of window `w` of `slot` when it has some (drainer).
pub fn take_for<'a>(slot: &'a Slot, w: &Window) -> Option<WindowPt<'a>> {
    if !enabled() || w.flags & WF_PT_ABSENT != 0 {
        return None;
    }
    take(slot, w.index)
}

/// The PT of window `index` of `slot` (drainer). Ranges of windows that were never written
/// (dropped under backpressure) are skipped. None: this window has no PT entry.
pub fn take(slot: &Slot, index: u64) -> Option<WindowPt<'_>> {
    let k = &slot.kpt;
    let (ctl, data, aux) = k.rings()?;
    loop {
        let t = k.tail.load(Relaxed);
        if t == k.head.load(Acquire) {
            return None;
        }
        let e = &k.ring[(t % PENDING as u64) as usize];
        let (i, aux_end, data_end) = (e[0].load(Relaxed), e[1].load(Relaxed), e[2].load(Relaxed));
        if i > index {
            return None;
        }
        if i < index {
            // Its window was dropped: discard its bytes.
            advance(k, aux_end, data_end);
            continue;
        }
        // SAFETY: the mappings are unmapped only by `KptSlot::close`, which the drainer
        // calls after the thread's last window, and the kernel does not write between the
        // tail and its head in linear mode.
        return Some(unsafe { window_pt(&ctl, &data, &aux, aux_end, data_end) });
    }
}

/// The AUX bytes `[aux_tail, aux_end)` in place and the loss flags of the DATA records up to
/// `data_end`. Pure on its arguments (tested on simulated rings).
///
/// # Safety
/// The rings' memory must stay mapped, and the AUX bytes unwritten by the producer, for
/// `'a` (the drainer holds the slot's drain lock; the kernel does not write between the
/// tail and its head in linear mode).
unsafe fn window_pt<'a>(
    ctl: &ControlPage,
    data: &RingMemory,
    aux: &RingMemory,
    aux_end: u64,
    data_end: u64,
) -> WindowPt<'a> {
    let tail = ctl.aux_tail();
    let mut flags = 0;
    let (start, len) = if aux_end < tail {
        flags |= WF_PT_LOST;
        (tail, 0)
    } else if aux_end - tail > aux.len() as u64 {
        // Cannot happen in linear mode; keep the newest bytes and say so.
        flags |= WF_PT_LOST;
        (aux_end - aux.len() as u64, aux.len())
    } else {
        (tail, (aux_end - tail) as usize)
    };
    let rw = copy_ring_records(data, ctl.data_tail(), data_end, None);
    if rw.overwritten || rw.lost_records > 0 || rw.aux_flags & AUX_LOSS_FLAGS != 0 {
        flags |= WF_PT_LOST;
    }
    WindowPt {
        // SAFETY: this function's contract.
        pieces: unsafe { aux.slices(start, len) },
        flags,
        aux_end,
        data_end,
    }
}

/// The drainer is done with `w`: the kernel may reuse its space.
pub fn release(slot: &Slot, w: &WindowPt<'_>) {
    advance(&slot.kpt, w.aux_end, w.data_end);
}

/// Consumes the oldest pending window: the rings' tails move to its ends.
fn advance(k: &KptSlot, aux_end: u64, data_end: u64) {
    if let Some(c) = k.control() {
        c.set_aux_tail(aux_end.max(c.aux_tail()));
        c.set_data_tail(data_end.max(c.data_tail()));
    }
    k.tail.fetch_add(1, Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::ring::sim::SimMapping;
    use crate::sideband::record::{encode_aux, SampleId, SIDEBAND_SAMPLE_TYPE};

    fn sample() -> SampleId {
        SampleId::default()
    }

    #[test]
    fn window_pt_is_read_in_place_across_the_wrap_and_released() {
        let mut sim = SimMapping::new(256, 64);
        let mut aux_pos = 0u64;
        for round in 0..10u8 {
            // The "kernel": 40 PT bytes and one AUX record per window, wrapping the
            // 64-byte AUX ring every other window.
            let pt: Vec<u8> = (0..40).map(|i| i ^ round).collect();
            sim.produce_aux(aux_pos, &pt);
            let rec = encode_aux(aux_pos, 40, 0, &sample(), SIDEBAND_SAMPLE_TYPE);
            let dpos = sim.ctl().data_head();
            sim.produce_data(dpos, &rec);
            aux_pos += 40;
            let (ctl, data, aux) = (sim.ctl(), sim.data(), sim.aux());
            // SAFETY: the simulated rings live until the end of the test.
            let w = unsafe { window_pt(&ctl, &data, &aux, ctl.aux_head(), ctl.data_head()) };
            assert_eq!(w.flags, 0, "round {round}");
            assert_eq!([w.pieces[0], w.pieces[1]].concat(), pt, "round {round}");
            assert_eq!(w.pieces[1].is_empty(), (aux_pos - 40) % 64 + 40 <= 64);
            // What `release` does to the control page.
            ctl.set_aux_tail(w.aux_end);
            ctl.set_data_tail(w.data_end);
        }
    }

    #[test]
    fn truncated_aux_records_mark_the_window_lost() {
        let mut sim = SimMapping::new(256, 64);
        sim.produce_aux(0, &[1, 2, 3]);
        // PERF_AUX_FLAG_TRUNCATED: the kernel stopped writing, the ring was full.
        let rec = encode_aux(0, 3, 0x1, &sample(), SIDEBAND_SAMPLE_TYPE);
        sim.produce_data(0, &rec);
        let (ctl, data, aux) = (sim.ctl(), sim.data(), sim.aux());
        // SAFETY: the simulated rings live until the end of the test.
        let w = unsafe { window_pt(&ctl, &data, &aux, 3, ctl.data_head()) };
        assert_eq!(w.flags, WF_PT_LOST);
        assert_eq!(w.pieces[0], &[1, 2, 3]);
        // An end behind the tail (cannot happen) gives no bytes and says so.
        ctl.set_aux_tail(3);
        // SAFETY: as above.
        let w = unsafe { window_pt(&ctl, &data, &aux, 2, ctl.data_head()) };
        assert_eq!((w.len(), w.flags & WF_PT_LOST), (0, WF_PT_LOST));
    }
}
