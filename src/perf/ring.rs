//! perf ring buffers: the control page (`perf_event_mmap_page`) and copying windows out of
//! the DATA ring (whole records) and the AUX ring (raw bytes).
//!
//! head/tail are ever-increasing byte counts; a position is `count % size` with `size` a
//! power of two (not Intel PT's `aux_head` in overwrite mode, an offset within the area:
//! see [`crate::perf::hwsnap`]). The kernel writes `*_head`; we read it with acquire ordering before
//! touching data, and publish the new `*_tail` with release ordering after copying.
//! The same code runs over real mappings and over simulated memory in tests.

use std::mem::offset_of;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use perf_event_open_sys::bindings::perf_event_mmap_page;

use crate::metadata::TimeConv;
use crate::sideband::record::{
    RecordHeader, HEADER_SIZE, PERF_AUX_FLAG_COLLISION, PERF_AUX_FLAG_PARTIAL,
    PERF_AUX_FLAG_TRUNCATED, PERF_RECORD_AUX, PERF_RECORD_LOST,
};

/// AUX record flags that mean PT data of the window is missing.
pub const AUX_LOSS_FLAGS: u64 =
    PERF_AUX_FLAG_TRUNCATED | PERF_AUX_FLAG_PARTIAL | PERF_AUX_FLAG_COLLISION;

const CAP_USER_TIME_ZERO: u64 = 1 << 4;

/// Size of the control page structure we touch (up to and including `aux_size`).
pub const CONTROL_PAGE_MIN: usize = offset_of!(perf_event_mmap_page, aux_size) + 8;

/// A `perf_event_mmap_page` in memory (a real mapping or a simulation in a test).
#[derive(Debug, Clone, Copy)]
pub struct ControlPage {
    base: NonNull<u8>,
}

// SAFETY: the page is shared memory accessed only through atomics/volatile reads.
unsafe impl Send for ControlPage {}

impl ControlPage {
    /// # Safety
    /// `base` must point to at least [`CONTROL_PAGE_MIN`] bytes, 8-byte aligned, that stay
    /// mapped for as long as this value is used.
    pub unsafe fn new(base: NonNull<u8>) -> Self {
        ControlPage { base }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `new`'s contract: the page is mapped, aligned and large enough; every
        // offset used is a u64 field of perf_event_mmap_page.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, for u32 fields.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU32) }
    }

    pub fn data_head(&self) -> u64 {
        self.u64_at(offset_of!(perf_event_mmap_page, data_head))
            .load(Ordering::Acquire)
    }
    pub fn data_tail(&self) -> u64 {
        self.u64_at(offset_of!(perf_event_mmap_page, data_tail))
            .load(Ordering::Relaxed)
    }
    pub fn set_data_tail(&self, v: u64) {
        self.u64_at(offset_of!(perf_event_mmap_page, data_tail))
            .store(v, Ordering::Release)
    }
    pub fn data_offset(&self) -> u64 {
        self.u64_at(offset_of!(perf_event_mmap_page, data_offset))
            .load(Ordering::Relaxed)
    }
    pub fn data_size(&self) -> u64 {
        self.u64_at(offset_of!(perf_event_mmap_page, data_size))
            .load(Ordering::Relaxed)
    }
    pub fn aux_head(&self) -> u64 {
        self.u64_at(offset_of!(perf_event_mmap_page, aux_head))
            .load(Ordering::Acquire)
    }
    pub fn aux_tail(&self) -> u64 {
        self.u64_at(offset_of!(perf_event_mmap_page, aux_tail))
            .load(Ordering::Relaxed)
    }
    pub fn set_aux_tail(&self, v: u64) {
        self.u64_at(offset_of!(perf_event_mmap_page, aux_tail))
            .store(v, Ordering::Release)
    }
    /// Publishes where the AUX area will be mapped (must precede the AUX mmap).
    pub fn set_aux_area(&self, offset: u64, size: u64) {
        self.u64_at(offset_of!(perf_event_mmap_page, aux_offset))
            .store(offset, Ordering::Relaxed);
        self.u64_at(offset_of!(perf_event_mmap_page, aux_size))
            .store(size, Ordering::Release);
    }
    /// Simulation only: what the kernel does when it writes data.
    pub fn set_data_head(&self, v: u64) {
        self.u64_at(offset_of!(perf_event_mmap_page, data_head))
            .store(v, Ordering::Release)
    }
    /// Simulation only: what the kernel does when it writes AUX data.
    pub fn set_aux_head(&self, v: u64) {
        self.u64_at(offset_of!(perf_event_mmap_page, aux_head))
            .store(v, Ordering::Release)
    }

    /// The TSC conversion, read consistently under the page's seqlock;
    /// `None` unless the kernel sets `cap_user_time_zero`.
    pub fn time_conv(&self) -> Option<TimeConv> {
        let lock = self.u32_at(offset_of!(perf_event_mmap_page, lock));
        for _ in 0..1000 {
            let seq = lock.load(Ordering::Acquire);
            let caps = self
                .u64_at(offset_of!(perf_event_mmap_page, __bindgen_anon_1))
                .load(Ordering::Relaxed);
            let shift_mult = self
                .u64_at(offset_of!(perf_event_mmap_page, pmc_width))
                .load(Ordering::Relaxed);
            let zero = self
                .u64_at(offset_of!(perf_event_mmap_page, time_zero))
                .load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if lock.load(Ordering::Relaxed) != seq {
                continue;
            }
            if caps & CAP_USER_TIME_ZERO == 0 {
                return None;
            }
            // pmc_width u16 | time_shift u16 | time_mult u32, little-endian in one u64.
            return Some(TimeConv {
                time_shift: (shift_mult >> 16) as u16,
                time_mult: (shift_mult >> 32) as u32,
                time_zero: zero,
            });
        }
        None
    }
}

/// Ring memory: `len` (a power of two) bytes written by the kernel.
#[derive(Debug, Clone, Copy)]
pub struct RingMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: read-only access to shared memory through raw copies.
unsafe impl Send for RingMemory {}

impl RingMemory {
    /// # Safety
    /// `ptr..ptr+len` must stay mapped and readable while this value is used; `len` must be
    /// a non-zero power of two.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        debug_assert!(len.is_power_of_two());
        RingMemory { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` (<= ring size) bytes starting at byte count `pos`, wrapping.
    pub fn read_at(&self, pos: u64, dst: &mut [u8]) {
        let n = dst.len().min(self.len);
        let start = (pos as usize) & (self.len - 1);
        let first = n.min(self.len - start);
        // SAFETY: start < len and first <= len - start, so the source range is inside the
        // mapping; dst is a distinct Rust buffer of at least n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), dst.as_mut_ptr(), first);
            if n > first {
                std::ptr::copy_nonoverlapping(
                    self.ptr.as_ptr(),
                    dst.as_mut_ptr().add(first),
                    n - first,
                );
            }
        }
    }
}

impl RingMemory {
    /// The `len` (<= ring size) bytes starting at byte count `pos`, in place: one piece, or
    /// two when they wrap.
    ///
    /// # Safety
    /// The mapping must stay valid for `'a`, and the producer must not write these bytes
    /// meanwhile (they lie between the consumer's tail and the producer's head).
    pub unsafe fn slices<'a>(&self, pos: u64, len: usize) -> [&'a [u8]; 2] {
        let n = len.min(self.len);
        let start = (pos as usize) & (self.len - 1);
        let first = n.min(self.len - start);
        // SAFETY: start < len and first <= len - start, the wrapped rest starts at the
        // mapping's base; validity and stability for 'a are the caller's contract.
        unsafe {
            [
                std::slice::from_raw_parts(self.ptr.as_ptr().add(start), first),
                std::slice::from_raw_parts(self.ptr.as_ptr(), n - first),
            ]
        }
    }
}

/// Result of copying a byte window (AUX/PT data).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteWindow {
    /// Bytes copied into the destination.
    pub copied: usize,
    /// `head - tail`: bytes the producer wrote in the window.
    pub available: u64,
    /// More was written than the ring holds: the oldest bytes were overwritten.
    pub overwritten: bool,
    /// The destination was too small; only its first `copied` bytes were filled.
    pub truncated_by_output: bool,
}

/// Copies ring bytes `[tail, head)` into `dst`.
///
/// If the window exceeds the ring, only the newest ring-size bytes still exist: they are
/// copied and `overwritten` is set. If it exceeds `dst`, the oldest bytes that fit are
/// copied and `truncated_by_output` is set.
pub fn copy_ring_bytes(ring: &RingMemory, tail: u64, head: u64, dst: &mut [u8]) -> ByteWindow {
    let available = head.wrapping_sub(tail);
    if head < tail {
        // A head behind the tail is not something the kernel produces: report, copy nothing.
        return ByteWindow {
            copied: 0,
            available: 0,
            overwritten: true,
            truncated_by_output: false,
        };
    }
    let (start, len, overwritten) = if available > ring.len() as u64 {
        (head - ring.len() as u64, ring.len(), true)
    } else {
        (tail, available as usize, false)
    };
    let n = len.min(dst.len());
    ring.read_at(start, &mut dst[..n]);
    ByteWindow {
        copied: n,
        available,
        overwritten,
        truncated_by_output: n < len,
    }
}

/// Result of copying the records of a DATA ring window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordWindow {
    /// Bytes of whole records copied into the destination.
    pub copied: usize,
    /// Records seen in the window.
    pub records: usize,
    /// Records that did not fit the destination (dropped from the copy).
    pub records_not_copied: usize,
    /// Sum of PERF_RECORD_LOST counts.
    pub lost_records: u64,
    /// OR of the flags of all PERF_RECORD_AUX records.
    pub aux_flags: u64,
    /// The window exceeded the ring or a record header was inconsistent.
    pub overwritten: bool,
}

/// Walks the records of `[tail, head)`, copying whole records that fit into `dst` and
/// collecting loss information (LOST counts, AUX flags) from all of them.
pub fn copy_ring_records(
    ring: &RingMemory,
    tail: u64,
    head: u64,
    mut dst: Option<&mut [u8]>,
) -> RecordWindow {
    let mut w = RecordWindow::default();
    if head < tail || head - tail > ring.len() as u64 {
        w.overwritten = true;
        return w;
    }
    let mut pos = tail;
    let mut hdr = [0u8; HEADER_SIZE];
    let mut body = [0u8; 24];
    let mut out_full = false;
    while pos < head {
        let left = head - pos;
        if left < HEADER_SIZE as u64 {
            w.overwritten = true;
            break;
        }
        ring.read_at(pos, &mut hdr);
        let Some(h) = RecordHeader::parse(&hdr) else {
            break;
        };
        let size = u64::from(h.size);
        if size < HEADER_SIZE as u64 || size > left {
            w.overwritten = true;
            break;
        }
        w.records += 1;
        match h.kind {
            PERF_RECORD_LOST if size >= 24 => {
                ring.read_at(pos + 8, &mut body[..16]);
                w.lost_records += u64::from_le_bytes(body[8..16].try_into().unwrap_or([0; 8]));
            }
            PERF_RECORD_AUX if size >= 32 => {
                ring.read_at(pos + 8, &mut body[..24]);
                w.aux_flags |= u64::from_le_bytes(body[16..24].try_into().unwrap_or([0; 8]));
            }
            _ => {}
        }
        if let Some(d) = dst.as_deref_mut() {
            let size = size as usize;
            if !out_full && w.copied + size <= d.len() {
                ring.read_at(pos, &mut d[w.copied..w.copied + size]);
                w.copied += size;
            } else {
                out_full = true;
                w.records_not_copied += 1;
            }
        }
        pos += size;
    }
    w
}

/// Simulated perf mappings (control page, DATA ring, AUX ring) for tests: the producer
/// side does what the kernel does, the consumer side is the production code.
#[cfg(test)]
pub(crate) mod sim {
    use super::*;

    const PAGE: usize = 4096;

    pub(crate) struct SimMapping {
        mem: Vec<u64>,
        data_len: usize,
        aux_len: usize,
    }

    impl SimMapping {
        pub(crate) fn new(data_len: usize, aux_len: usize) -> Self {
            assert!(data_len.is_power_of_two() && aux_len.is_power_of_two());
            let mut s = SimMapping {
                mem: vec![0u64; (PAGE + data_len + aux_len) / 8],
                data_len,
                aux_len,
            };
            let base = s.base();
            // SAFETY: the control page is the first PAGE bytes of the Vec.
            unsafe {
                *(base.add(offset_of!(perf_event_mmap_page, data_offset)) as *mut u64) =
                    PAGE as u64;
                *(base.add(offset_of!(perf_event_mmap_page, data_size)) as *mut u64) =
                    data_len as u64;
            }
            s.ctl()
                .set_aux_area((PAGE + data_len) as u64, aux_len as u64);
            s
        }
        fn base(&mut self) -> *mut u8 {
            self.mem.as_mut_ptr() as *mut u8
        }
        pub(crate) fn ctl(&mut self) -> ControlPage {
            // SAFETY: the Vec holds PAGE >= CONTROL_PAGE_MIN bytes, u64-aligned.
            unsafe { ControlPage::new(NonNull::new(self.base()).unwrap()) }
        }
        pub(crate) fn data(&mut self) -> RingMemory {
            // SAFETY: data_len bytes after the page are inside the Vec.
            unsafe { RingMemory::new(NonNull::new(self.base().add(PAGE)).unwrap(), self.data_len) }
        }
        pub(crate) fn aux(&mut self) -> RingMemory {
            let off = PAGE + self.data_len;
            // SAFETY: aux_len bytes after the DATA ring are inside the Vec.
            unsafe { RingMemory::new(NonNull::new(self.base().add(off)).unwrap(), self.aux_len) }
        }
        fn write(&mut self, start: usize, len: usize, pos: u64, bytes: &[u8]) {
            let base = self.base();
            for (i, b) in bytes.iter().enumerate() {
                let at = start + ((pos as usize + i) & (len - 1));
                // SAFETY: at < start + len, inside the Vec.
                unsafe { *base.add(at) = *b };
            }
        }
        /// Kernel side: writes records at byte count `pos` and publishes the new data_head.
        pub(crate) fn produce_data(&mut self, pos: u64, bytes: &[u8]) {
            self.write(PAGE, self.data_len, pos, bytes);
            self.ctl().set_data_head(pos + bytes.len() as u64);
        }
        /// Kernel side: writes PT bytes at byte count `pos` and publishes the new aux_head.
        pub(crate) fn produce_aux(&mut self, pos: u64, bytes: &[u8]) {
            self.write(PAGE + self.data_len, self.aux_len, pos, bytes);
            self.ctl().set_aux_head(pos + bytes.len() as u64);
        }
        /// Kernel side in overwrite (snapshot) mode for Intel PT: writes PT bytes at byte
        /// count `pos` and publishes the new head as an offset within the area.
        pub(crate) fn produce_aux_overwrite(&mut self, pos: u64, bytes: &[u8]) {
            self.write(PAGE + self.data_len, self.aux_len, pos, bytes);
            let head = (pos + bytes.len() as u64) & (self.aux_len as u64 - 1);
            self.ctl().set_aux_head(head);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sim::SimMapping;
    use super::*;
    use crate::sideband::record::{encode_aux, encode_lost, SampleId, SIDEBAND_SAMPLE_TYPE};

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn byte_copy_at_every_wrap_position() {
        let len = 64;
        for tail in 0..(2 * len as u64) {
            for n in [0usize, 1, 7, 63, 64] {
                let mut sim = SimMapping::new(64, len);
                let data = pattern(n, tail as u8);
                sim.produce_aux(tail, &data);
                let ctl = sim.ctl();
                let mut dst = vec![0u8; 128];
                let w = copy_ring_bytes(&sim.aux(), tail, ctl.aux_head(), &mut dst);
                assert_eq!(w.copied, n, "tail {tail} n {n}");
                assert!(!w.overwritten && !w.truncated_by_output);
                assert_eq!(&dst[..n], &data[..], "tail {tail} n {n}");
            }
        }
    }

    #[test]
    fn byte_copy_empty_full_overfull_and_small_output() {
        let mut sim = SimMapping::new(64, 64);
        let ring = sim.aux();
        let mut dst = vec![0u8; 64];
        // empty window
        assert_eq!(
            copy_ring_bytes(&ring, 100, 100, &mut dst),
            ByteWindow::default()
        );
        // exactly full, wrapped
        let data = pattern(64, 3);
        sim.produce_aux(10, &data);
        let w = copy_ring_bytes(&ring, 10, 74, &mut dst);
        assert_eq!(
            (w.copied, w.overwritten, w.truncated_by_output),
            (64, false, false)
        );
        assert_eq!(dst, data);
        // over-full: 100 bytes written into a 64-byte ring -> newest 64 survive
        let data = pattern(100, 9);
        sim.produce_aux(5, &data);
        let w = copy_ring_bytes(&ring, 5, 105, &mut dst);
        assert!(w.overwritten);
        assert_eq!(w.available, 100);
        assert_eq!(w.copied, 64);
        assert_eq!(dst, data[36..]);
        // output smaller than the window: oldest bytes that fit, flagged
        let data = pattern(40, 1);
        sim.produce_aux(200, &data);
        let mut small = vec![0u8; 16];
        let w = copy_ring_bytes(&ring, 200, 240, &mut small);
        assert_eq!((w.copied, w.truncated_by_output), (16, true));
        assert_eq!(small, data[..16]);
    }

    #[test]
    fn record_copy_wraps_and_collects_loss() {
        let s = SampleId {
            pid: Some(1),
            tid: Some(1),
            time: Some(5),
            cpu: Some(0),
            identifier: Some(9),
            ..Default::default()
        };
        let aux = encode_aux(0, 4096, 1, &s, SIDEBAND_SAMPLE_TYPE); // TRUNCATED
        let lost = encode_lost(9, 17, &s, SIDEBAND_SAMPLE_TYPE);
        let mut stream = aux.clone();
        stream.extend(&lost);
        let len = 256;
        for tail in (0..(2 * len as u64)).step_by(8) {
            let mut sim = SimMapping::new(len, 64);
            sim.produce_data(tail, &stream);
            let ctl = sim.ctl();
            let mut dst = vec![0u8; 512];
            let w = copy_ring_records(&sim.data(), tail, ctl.data_head(), Some(&mut dst));
            assert_eq!(w.records, 2);
            assert_eq!(w.copied, stream.len());
            assert_eq!(&dst[..w.copied], &stream[..]);
            assert_eq!(w.lost_records, 17);
            assert_eq!(w.aux_flags, 1);
            assert!(!w.overwritten);
            ctl.set_data_tail(tail + w.copied as u64);
            assert_eq!(ctl.data_tail(), ctl.data_head());
        }
        // output too small for the second record: first copied whole, second counted
        let mut sim = SimMapping::new(len, 64);
        sim.produce_data(0, &stream);
        let ring = sim.data();
        let mut dst = vec![0u8; aux.len() + 8];
        let w = copy_ring_records(&ring, 0, stream.len() as u64, Some(&mut dst));
        assert_eq!(
            (w.copied, w.records_not_copied, w.lost_records),
            (aux.len(), 1, 17)
        );
        // a window larger than the ring is overwritten
        let w = copy_ring_records(&ring, 0, len as u64 + 8, None);
        assert!(w.overwritten);
    }

    /// Overwrite (snapshot) mode: the kernel writes `total` bytes from byte count 0 into a
    /// 64-byte area, wrapping; the snapshot is exactly the newest bytes still there.
    #[test]
    fn control_page_offsets_match_uapi() {
        assert_eq!(offset_of!(perf_event_mmap_page, data_head), 1024);
        assert_eq!(offset_of!(perf_event_mmap_page, data_tail), 1032);
        assert_eq!(offset_of!(perf_event_mmap_page, data_offset), 1040);
        assert_eq!(offset_of!(perf_event_mmap_page, data_size), 1048);
        assert_eq!(offset_of!(perf_event_mmap_page, aux_head), 1056);
        assert_eq!(offset_of!(perf_event_mmap_page, aux_tail), 1064);
        assert_eq!(offset_of!(perf_event_mmap_page, aux_offset), 1072);
        assert_eq!(offset_of!(perf_event_mmap_page, aux_size), 1080);
        assert_eq!(offset_of!(perf_event_mmap_page, __bindgen_anon_1), 40);
        assert_eq!(offset_of!(perf_event_mmap_page, pmc_width), 48);
        assert_eq!(offset_of!(perf_event_mmap_page, time_shift), 50);
        assert_eq!(offset_of!(perf_event_mmap_page, time_mult), 52);
        assert_eq!(offset_of!(perf_event_mmap_page, time_zero), 64);
    }
}
