//! A software dummy perf event that collects real sideband for one thread.
//!
//! `PERF_COUNT_SW_DUMMY` counts nothing but, with mmap/mmap2/comm/task set, makes the
//! kernel write MMAP2, COMM, FORK and EXIT records into its DATA ring. It works without
//! Intel PT and at perf_event_paranoid=2 (user-only), which is how the emulated backend
//! gets the same sideband the hardware backend gets from its PT event.

use perf_event_open_sys::bindings::{perf_event_attr, PERF_COUNT_SW_DUMMY, PERF_TYPE_SOFTWARE};

use crate::error::Result;
use crate::metadata::TimeConv;
use crate::perf::event::PerfEvent;
use crate::perf::ring::{copy_ring_records, RecordWindow};
use crate::sideband::record::SIDEBAND_SAMPLE_TYPE;

/// Sets the sideband-related attribute bits shared by the PT event and the dummy event.
pub fn set_sideband_attrs(attr: &mut perf_event_attr, context_switch: bool) {
    attr.set_mmap(1);
    attr.set_mmap2(1);
    attr.set_comm(1);
    attr.set_comm_exec(1);
    attr.set_task(1);
    attr.set_context_switch(u64::from(context_switch));
    attr.set_sample_id_all(1);
    attr.sample_type = SIDEBAND_SAMPLE_TYPE;
}

/// A dummy event on thread `tid` with a DATA ring of 2^shift pages.
#[derive(Debug)]
pub struct SidebandEvent {
    event: PerfEvent,
}

impl SidebandEvent {
    /// Opens the event, maps its ring and leaves it disabled.
    pub fn open(tid: i32, shift: u32) -> Result<SidebandEvent> {
        // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
        let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
        attr.type_ = PERF_TYPE_SOFTWARE;
        attr.config = u64::from(PERF_COUNT_SW_DUMMY);
        attr.set_disabled(1);
        attr.set_exclude_kernel(1);
        attr.set_exclude_hv(1);
        set_sideband_attrs(&mut attr, false);
        let mut event = PerfEvent::open(&mut attr, tid, -1, "software dummy event for sideband")?;
        event.map_data(shift)?;
        Ok(SidebandEvent { event })
    }

    pub fn enable(&self) -> Result<()> {
        self.event.enable()
    }
    pub fn disable(&self) -> Result<()> {
        self.event.disable()
    }

    /// Drops everything collected so far.
    pub fn discard(&self) {
        if let Some(ctl) = self.event.control() {
            ctl.set_data_tail(ctl.data_head());
        }
    }

    /// Copies the records collected since the last drain into `dst` (whole records that
    /// fit) and advances the tail.
    pub fn drain(&self, dst: Option<&mut [u8]>) -> RecordWindow {
        let (Some(ctl), Some(ring)) = (self.event.control(), self.event.data_ring()) else {
            return RecordWindow {
                overwritten: true,
                ..Default::default()
            };
        };
        let head = ctl.data_head();
        let tail = ctl.data_tail();
        let w = copy_ring_records(&ring, tail, head, dst);
        ctl.set_data_tail(head);
        w
    }

    /// TSC conversion published by the kernel in the control page.
    pub fn time_conv(&self) -> Option<TimeConv> {
        self.event.control()?.time_conv()
    }
}

/// The current TSC.
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc is available on every x86-64 CPU and has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sideband::record::{Record, RecordIter};
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn dummy_event_reports_a_real_mmap2_of_an_exec_mapping() {
        let tid = crate::capture::current_tid();
        let ev = SidebandEvent::open(tid, 4).expect("open dummy event");
        ev.enable().unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[0xc3u8; 8192]).unwrap();
        f.flush().unwrap();
        let path = std::fs::canonicalize(f.path()).unwrap();
        // SAFETY: mapping 8 KiB of a file we own, PROT_READ|PROT_EXEC, at offset 4096.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                f.as_file().as_raw_fd(),
                4096,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        ev.disable().unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let w = ev.drain(Some(&mut buf));
        assert!(!w.overwritten);
        // SAFETY: unmapping what we mapped above.
        unsafe { libc::munmap(addr, 4096) };
        let found = RecordIter::new(&buf[..w.copied], SIDEBAND_SAMPLE_TYPE)
            .map(|r| r.unwrap().1)
            .find_map(|r| match r.record {
                Record::Mmap2(m) if m.addr == addr as u64 => Some((m, r.sample)),
                _ => None,
            })
            .expect("MMAP2 record for our mapping");
        let (m, s) = found;
        assert_eq!(m.len, 4096);
        assert_eq!(m.pgoff, 4096);
        assert_eq!(m.filename, path.to_string_lossy());
        assert_eq!(m.prot & libc::PROT_EXEC as u32, libc::PROT_EXEC as u32);
        assert_eq!(s.tid, Some(tid as u32));
        assert!(s.time.unwrap_or(0) > 0);
        // A second drain finds nothing new.
        assert_eq!(ev.drain(Some(&mut buf)).records, 0);
    }
}
