//! Emulated Intel PT backend: software single-stepping that emits genuine PT packets.
//!
//! For CPUs and VMs without Intel PT. A window single-steps the calling thread with
//! EFLAGS.TF ([`trap`]: an async-signal-safe SIGTRAP handler records each next IP and a TSC
//! into a pre-allocated per-handle buffer), then [`encode`] turns the observed IP sequence
//! into the packets user-only hardware would have written (PSB+, TIP.PGE/PGD, TNT, TIP, FUP,
//! TSC; returns not compressed), using libipt's packet encoder and iced-x86. Sideband comes
//! from a software dummy perf event on the thread (real MMAP2/COMM/FORK/EXIT records) plus
//! MMAP2 records synthesized for the executable mappings that existed before the window, so
//! the decoder builds its images exactly as for hardware traces. [`oracle`] decodes a trace
//! with libipt over this process's memory (used by the tests and the benchmark).
//!
//! Capacity (linear-mode semantics): a handle with a PT ring of 2^pt_shift pages records at
//! most one step per ring byte; when the steps or the encoded packets do not fit, recording
//! stops at that point, what was captured is closed with a clean FUP + TIP.PGD (so it still
//! decodes) and the window reports `OVERWRITTEN_PT_TRACE`.
//!
//! Time: TSC packets carry the TSC read at each trap; the metadata's conversion comes from
//! the dummy event's mmap page, or, where the kernel publishes none (KVM guests), is measured
//! once per process against kernel record timestamps ([`clock`]).
//!
//! Limits: user mode only (kernel modes fail with FAILED_TO_OPEN_PERF_EVENT); the stepped
//! thread runs at one signal delivery per instruction (5-30 µs); signal handlers run
//! untraced and appear as asynchronous disable/enable pairs (handlers installed while a
//! window is open are not observed); syscalls appear as TIP.PGD/TIP.PGE pairs like on
//! user-only hardware; a thread created inside a window and fork/vfork children are not
//! traced; an application that replaces our SIGTRAP handler after the first window is
//! refused at the next start; stepping that ends before stop (a handler that longjmps out,
//! code restoring flags saved before the window) is reported as lost PT.

pub mod clock;
pub mod encode;
pub mod oracle;
pub mod trap;

use std::cell::{Cell, RefCell};

use crate::capture::{current_tid, page_size, CaptureBackend, Mode, WindowCapture};
use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, ExtMetadata};
use crate::perf::sideband_event::{rdtsc, SidebandEvent};
use crate::sideband::record::SIDEBAND_SAMPLE_TYPE;
use crate::sideband::synth::synthesize_exec_mmap2;

/// Most steps one window may record (the buffer is reserved lazily; 2^24 steps = 384 MiB of
/// address space, about 80 s of stepping).
pub const MAX_STEPS: usize = 1 << 24;

/// What the last window of the calling thread looked like (for tests, tools, benchmarks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowReport {
    /// Trap records captured.
    pub steps: usize,
    /// Instructions the PT encodes as executed.
    pub instructions: u64,
    /// The executed IP sequence, when [`keep_observed_ips`] was enabled on this thread.
    pub ips: Option<Vec<u64>>,
    /// First stepped instruction.
    pub first_ip: u64,
    pub gaps: u32,
    pub signals: u32,
    pub far_transfers: u32,
    /// Traps from a fork/vfork child sharing the buffer (their stepping was stopped).
    pub foreign_traps: u32,
    /// The step buffer filled up (stepping stopped early).
    pub steps_overflowed: bool,
    /// Stepping stopped before the window was stopped, for a reason other than a full
    /// buffer (reported as lost PT data).
    pub stepping_lost: bool,
    /// The PT output filled up.
    pub out_of_space: bool,
    pub pt_size: usize,
}

thread_local! {
    static KEEP_IPS: Cell<bool> = const { Cell::new(false) };
    static KEEP_REPORTS: Cell<bool> = const { Cell::new(false) };
    /// Has a destructor: touched only on threads that asked for reports, never on the C
    /// API's own paths (a TLS destructor registers through `__cxa_thread_atexit_impl`,
    /// which DynamoRIO's private loader lacks).
    static LAST_WINDOW: RefCell<Option<WindowReport>> = const { RefCell::new(None) };
}

/// Makes the emulated backend keep a [`WindowReport`] of the calling thread's windows,
/// retrievable with [`take_last_window`].
pub fn keep_window_reports(on: bool) {
    KEEP_REPORTS.with(|k| k.set(on));
}

/// Makes the emulated backend keep the executed IP sequence of the calling thread's windows
/// (8 bytes per instruction) in their reports (and keep the reports), retrievable with
/// [`take_last_window`].
pub fn keep_observed_ips(on: bool) {
    KEEP_IPS.with(|k| k.set(on));
    keep_window_reports(on);
}

/// The report of the calling thread's last emulated window, kept when
/// [`keep_window_reports`] is on (taken: a second call gives None).
pub fn take_last_window() -> Option<WindowReport> {
    LAST_WINDOW.with(|l| l.borrow_mut().take())
}

/// The emulated backend of one handle.
pub struct EmulatedBackend {
    /// Not dropped while another thread may still be stepping into it (see Drop).
    buf: std::mem::ManuallyDrop<Box<trap::StepBuffer>>,
    sideband: Option<SidebandEvent>,
    meta: ExtMetadata,
    synth: Vec<u8>,
    ring_bytes: usize,
    first_ip: u64,
    start_tsc: u64,
    window_pid: i32,
    armed: bool,
    /// TF was already clear when the window was stopped (stepping ended early).
    tf_lost: bool,
}

impl EmulatedBackend {
    /// A handle for the calling thread: a step buffer sized from the PT ring of 2^`pt_shift`
    /// pages, and a dummy perf event with a 2^`sb_shift`-page DATA ring for sideband.
    pub fn open(mode: Mode, pt_shift: u32, sb_shift: u32) -> Result<Self> {
        if mode != Mode::UserOnly {
            return Err(Error::new(
                Status::FailedToOpenPerfEvent,
                format!(
                    "the emulated backend cannot trace {} mode: it single-steps user code and \
                     cannot see the kernel; kernel tracing needs Intel PT hardware (no intel_pt \
                     PMU here, or PTTRACER_BACKEND=emulated forced this backend)",
                    mode.name()
                ),
            ));
        }
        let ring_bytes = page_size()
            .checked_shl(pt_shift)
            .filter(|b| *b > 0)
            .ok_or_else(|| Error::invalid(format!("pt_size_shift={pt_shift} is too big")))?;
        let buf = std::mem::ManuallyDrop::new(Box::new(trap::StepBuffer::new(
            ring_bytes.min(MAX_STEPS),
        )?));
        let sideband = SidebandEvent::open(current_tid(), sb_shift)?;
        // The kernel's conversion when it publishes one, else measured against its records.
        let conv = sideband.time_conv().or_else(clock::calibrated);
        let meta = ExtMetadata::for_this_cpu(BackendKind::Emulated, conv);
        Ok(EmulatedBackend {
            buf,
            sideband: Some(sideband),
            meta,
            synth: Vec::new(),
            ring_bytes,
            first_ip: 0,
            start_tsc: 0,
            window_pid: 0,
            armed: false,
            tf_lost: false,
        })
    }

    fn perf_time_now(&self) -> u64 {
        if self.meta.time_zero_valid {
            self.meta.base.tsc_to_perf_time(rdtsc())
        } else {
            0
        }
    }

    /// Ends stepping (idempotent); returns false when there was nothing to end.
    fn end_stepping(&mut self) -> bool {
        let was_stepping = trap::clear_tf();
        if !self.armed {
            return false;
        }
        self.tf_lost = !was_stepping;
        trap::disarm(&self.buf);
        self.armed = false;
        trap::window_closed();
        true
    }
}

impl CaptureBackend for EmulatedBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Emulated
    }

    fn start(&mut self) -> Result<()> {
        if self.armed {
            return Err(Error::new(
                Status::FailedToStartTracing,
                "emulated backend: a window is already open on this handle",
            ));
        }
        if trap::tf_is_set() {
            return Err(Error::new(
                Status::FailedToStartTracing,
                "emulated backend: EFLAGS.TF is already set on this thread (another window of \
                 this thread, or a debugger single-stepping it); stop that window first",
            ));
        }
        if trap::sigtrap_blocked() {
            return Err(Error::new(
                Status::FailedToStartTracing,
                "emulated backend: SIGTRAP is blocked on this thread; single-stepping needs it \
                 delivered (unblock it with pthread_sigmask before start_tracing)",
            ));
        }
        trap::window_opening()?;
        self.synth.clear();
        if let Some(sb) = &self.sideband {
            sb.discard();
            match synthesize_exec_mmap2(SIDEBAND_SAMPLE_TYPE, self.perf_time_now()) {
                Ok(s) => self.synth = s,
                Err(e) => {
                    trap::window_closed();
                    return Err(e);
                }
            }
            if let Err(e) = sb.enable() {
                trap::window_closed();
                return Err(e);
            }
        }
        // SAFETY: getpid has no preconditions.
        self.window_pid = unsafe { libc::getpid() };
        self.buf.reset(current_tid());
        self.armed = true;
        trap::arm(&self.buf);
        self.start_tsc = rdtsc();
        // From the instruction after the popf in set_tf on, every instruction is stepped.
        self.first_ip = trap::set_tf();
        Ok(())
    }

    fn stop(&mut self, pt: &mut [u8], sideband: Option<&mut [u8]>) -> Result<WindowCapture> {
        // Everything up to the popf inside end_stepping is part of the window (real code).
        if !self.end_stepping() {
            return Err(Error::new(
                Status::FailedToStopTracing,
                "emulated backend: no window is open on this handle",
            ));
        }
        // SAFETY: getpid has no preconditions.
        if unsafe { libc::getpid() } != self.window_pid {
            // A fork child holding a copy of the parent's handle: the child was never traced
            // (its stepping stopped at its first trap) and the sideband event is the parent's.
            self.sideband = None;
            return Err(Error::new(
                Status::FailedToStopTracing,
                "emulated backend: this handle's window was started in the parent process \
                 before fork(); the child is not traced. Create a new handle in the child",
            ));
        }
        let mut cap = WindowCapture::default();
        let steps = self.buf.records();
        let limit = pt.len().min(self.ring_bytes);
        let keep = KEEP_IPS.with(Cell::get);
        let enc =
            encode::encode_window(self.first_ip, self.start_tsc, steps, &mut pt[..limit], keep);
        if let Some(sb) = &self.sideband {
            let _ = sb.disable();
        }
        let enc = enc?;
        cap.pt_size = enc.size;
        let overflowed = self.buf.overflowed();
        // Stepping ended before stop without the buffer filling up: the flow left our control
        // (e.g. a signal handler that longjmp'd, or code that restored flags saved before the
        // window). The trace ends at the last observed IP; the rest of the window is lost.
        let stepping_lost = self.tf_lost && !overflowed;
        if overflowed || stepping_lost || (enc.out_of_space && limit == self.ring_bytes) {
            cap.pt_lost = true;
        } else if enc.out_of_space {
            cap.pt_truncated_by_output = true;
        }
        if let (Some(ev), Some(dst)) = (&self.sideband, sideband) {
            let n = self.synth.len().min(dst.len());
            dst[..n].copy_from_slice(&self.synth[..n]);
            cap.sideband_truncated_by_output = n < self.synth.len();
            let rw = ev.drain(Some(&mut dst[n..]));
            cap.sideband_size = n + rw.copied;
            cap.sideband_truncated_by_output |= rw.records_not_copied > 0;
            cap.sideband_lost = rw.overwritten || rw.lost_records > 0;
        } else if let Some(ev) = &self.sideband {
            ev.drain(None);
        }
        let report = WindowReport {
            steps: steps.len(),
            instructions: enc.instructions,
            ips: enc.ips,
            first_ip: self.first_ip,
            gaps: enc.gaps,
            signals: enc.signals,
            far_transfers: enc.far_transfers,
            foreign_traps: self.buf.foreign_traps(),
            steps_overflowed: overflowed,
            stepping_lost,
            out_of_space: enc.out_of_space,
            pt_size: enc.size,
        };
        self.buf.release_memory();
        if KEEP_REPORTS.with(Cell::get) {
            LAST_WINDOW.with(|l| *l.borrow_mut() = Some(report));
        }
        Ok(cap)
    }

    fn metadata(&self) -> ExtMetadata {
        self.meta
    }
}

impl Drop for EmulatedBackend {
    fn drop(&mut self) {
        // A handle destroyed while its window is open (only possible on the owning thread).
        if self.armed && !self.buf.tid_matches(current_tid()) {
            // Dropped on another thread while the owner may still be stepping: its handler
            // could still write into the buffer, so the buffer is leaked on purpose.
            return;
        }
        if self.armed {
            self.end_stepping();
        }
        // SAFETY: not armed any more (or never was); dropped exactly once here.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.buf) };
    }
}
