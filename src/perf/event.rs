//! A perf event file descriptor with its DATA (and optionally AUX) ring mapped.
//!
//! Thin, safe ownership over `perf_event_open(2)`, the ioctls, and the two mmaps:
//! `(1 + 2^n)` pages at offset 0 (control page + DATA ring), then the AUX area at
//! `aux_offset = data_offset + data_size` after publishing its offset/size in the page.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};
use perf_event_open_sys::bindings::{perf_event_attr, PERF_FLAG_FD_CLOEXEC};

use crate::capture::page_size;
use crate::error::{Error, Result, Status};
use crate::perf::ring::{ControlPage, RingMemory};

/// An open perf event with its rings.
pub struct PerfEvent {
    fd: OwnedFd,
    data: Option<MmapRaw>,
    aux: Option<MmapRaw>,
}

impl std::fmt::Debug for PerfEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfEvent")
            .field("fd", &self.fd.as_raw_fd())
            .field("data", &self.data.as_ref().map(|m| m.len()))
            .field("aux", &self.aux.as_ref().map(|m| m.len()))
            .finish()
    }
}

/// The paranoia level, when readable.
pub fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn explain_open_errno(errno: i32, what: &str) -> String {
    let paranoid = perf_event_paranoid()
        .map(|p| p.to_string())
        .unwrap_or_else(|| "unknown".into());
    let hint = match errno {
        libc::EACCES | libc::EPERM => format!(
            "permission denied (perf_event_paranoid={paranoid}); kernel tracing needs \
             CAP_PERFMON/CAP_SYS_ADMIN or perf_event_paranoid <= 1"
        ),
        libc::ENOENT | libc::ENODEV => "the PMU or event does not exist on this CPU".into(),
        libc::EINVAL | libc::EOPNOTSUPP => {
            "the kernel rejected the attributes (unsupported config bit for this CPU?)".into()
        }
        libc::EMFILE => "too many open files".into(),
        libc::EBUSY => "the PMU is in use by another tracer".into(),
        _ => String::new(),
    };
    let e = std::io::Error::from_raw_os_error(errno);
    if hint.is_empty() {
        format!("perf_event_open({what}) failed: {e}")
    } else {
        format!("perf_event_open({what}) failed: {e}: {hint}")
    }
}

fn explain_mmap_errno(errno: i32, what: &str, bytes: usize) -> String {
    let e = std::io::Error::from_raw_os_error(errno);
    let mlock = std::fs::read_to_string("/proc/sys/kernel/perf_event_mlock_kb")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    match errno {
        libc::EPERM | libc::ENOMEM | libc::EAGAIN => format!(
            "mmap of the {what} ({bytes} bytes) failed: {e}: it exceeds RLIMIT_MEMLOCK plus \
             perf_event_mlock_kb ({mlock} KiB); use a smaller size shift, raise `ulimit -l`, \
             or raise /proc/sys/kernel/perf_event_mlock_kb"
        ),
        _ => format!("mmap of the {what} ({bytes} bytes) failed: {e}"),
    }
}

impl PerfEvent {
    /// `perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)`.
    pub fn open(attr: &mut perf_event_attr, pid: i32, cpu: i32, what: &str) -> Result<Self> {
        attr.size = std::mem::size_of::<perf_event_attr>() as u32;
        // SAFETY: attr is a valid, fully initialized perf_event_attr with size set.
        let fd = unsafe {
            perf_event_open_sys::perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC.into())
        };
        if fd < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(Error::new(
                Status::FailedToOpenPerfEvent,
                explain_open_errno(errno, what),
            ));
        }
        Ok(PerfEvent {
            // SAFETY: fd is a freshly opened descriptor we exclusively own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            data: None,
            aux: None,
        })
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Maps the control page and a DATA ring of 2^`shift` pages.
    pub fn map_data(&mut self, shift: u32) -> Result<()> {
        let len = page_size() * (1 + (1usize << shift));
        let m = MmapOptions::new()
            .len(len)
            .map_raw(self.fd.as_raw_fd())
            .map_err(|e| {
                Error::new(
                    Status::FailedToMmapPerfData,
                    explain_mmap_errno(e.raw_os_error().unwrap_or(0), "perf DATA ring", len),
                )
            })?;
        self.data = Some(m);
        Ok(())
    }

    /// Maps an AUX area of 2^`shift` pages after the DATA ring. `linear` (read-write)
    /// makes the kernel stop when full; otherwise it overwrites (snapshot mode).
    pub fn map_aux(&mut self, shift: u32, linear: bool) -> Result<()> {
        let ctl = self.control().ok_or_else(|| {
            Error::new(
                Status::FailedToMmapPtData,
                "map the DATA ring before the AUX area",
            )
        })?;
        let size = (page_size() << shift) as u64;
        let offset = ctl.data_offset() + ctl.data_size();
        ctl.set_aux_area(offset, size);
        let mut opts = MmapOptions::new();
        opts.offset(offset).len(size as usize);
        let m = if linear {
            opts.map_raw(self.fd.as_raw_fd())
        } else {
            opts.map_raw_read_only(self.fd.as_raw_fd())
        }
        .map_err(|e| {
            Error::new(
                Status::FailedToMmapPtData,
                explain_mmap_errno(
                    e.raw_os_error().unwrap_or(0),
                    "AUX (PT) area",
                    size as usize,
                ),
            )
        })?;
        self.aux = Some(m);
        Ok(())
    }

    /// The control page (`None` before [`map_data`](Self::map_data)).
    pub fn control(&self) -> Option<ControlPage> {
        let m = self.data.as_ref()?;
        let p = NonNull::new(m.as_mut_ptr())?;
        // SAFETY: the mapping is at least one page, page-aligned, and lives as long as self.
        Some(unsafe { ControlPage::new(p) })
    }

    /// The DATA ring memory.
    pub fn data_ring(&self) -> Option<RingMemory> {
        let m = self.data.as_ref()?;
        let ctl = self.control()?;
        let (off, size) = (ctl.data_offset() as usize, ctl.data_size() as usize);
        if size == 0 || !size.is_power_of_two() || off.checked_add(size)? > m.len() {
            return None;
        }
        let p = NonNull::new(m.as_mut_ptr().wrapping_add(off))?;
        // SAFETY: off..off+size lies inside the mapping (checked above); size is a power of 2.
        Some(unsafe { RingMemory::new(p, size) })
    }

    /// The AUX ring memory.
    pub fn aux_ring(&self) -> Option<RingMemory> {
        let m = self.aux.as_ref()?;
        let p = NonNull::new(m.as_mut_ptr())?;
        if !m.len().is_power_of_two() {
            return None;
        }
        // SAFETY: the whole AUX mapping is the ring; its length is a power of two.
        Some(unsafe { RingMemory::new(p, m.len()) })
    }

    /// The control page, the AUX ring and the DATA ring, or an error when any is not
    /// mapped.
    pub fn rings(&self) -> Result<(ControlPage, RingMemory, RingMemory)> {
        match (self.control(), self.aux_ring(), self.data_ring()) {
            (Some(ctl), Some(aux), Some(data)) => Ok((ctl, aux, data)),
            _ => Err(Error::new(
                Status::FailedToReadPtData,
                "the perf rings of this handle are not mapped",
            )),
        }
    }

    fn ioctl(&self, req: u64, what: &str, status: Status) -> Result<()> {
        // SAFETY: PERF_EVENT_IOC_{ENABLE,DISABLE,RESET} take an integer argument (0) on a
        // perf fd we own.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, 0) };
        if r < 0 {
            return Err(Error::from_errno(status, format!("ioctl({what})")));
        }
        Ok(())
    }

    pub fn enable(&self) -> Result<()> {
        self.ioctl(
            u64::from(perf_event_open_sys::bindings::ENABLE),
            "PERF_EVENT_IOC_ENABLE",
            Status::FailedToStartTracing,
        )
    }
    pub fn disable(&self) -> Result<()> {
        self.ioctl(
            u64::from(perf_event_open_sys::bindings::DISABLE),
            "PERF_EVENT_IOC_DISABLE",
            Status::FailedToStopTracing,
        )
    }
    pub fn reset(&self) -> Result<()> {
        self.ioctl(
            u64::from(perf_event_open_sys::bindings::RESET),
            "PERF_EVENT_IOC_RESET",
            Status::FailedToStartTracing,
        )
    }
}
