//! C ABI: DynamoRIO's drpttracer API and the `drpttracer_ext_*` extensions.
//!
//! ABI only: the types here are the C layouts, every function converts its arguments,
//! looks handles up in [`registry`] (a pointer we did not hand out is never dereferenced),
//! calls [`crate::tracer`], records the calling thread's message for its last failure
//! ([`last_error`]) and returns the status. No panic crosses this boundary: every entry
//! point runs under `catch_unwind`.
//!
//! DynamoRIO's clients load this library through DynamoRIO's private loader, with a private
//! libc that lacks some of what a normal process has: nothing on these paths registers a
//! thread-local destructor (`__cxa_thread_atexit_impl` dereferences NULL there), and the
//! statics are plain std mutexes. Semantics follow DynamoRIO's `drpttracer.c`:
//! `drpttracer_init` returns false where nothing can trace (see [`backend_for_c_api`]).
#![allow(non_camel_case_types)]

pub mod last_error;
pub mod registry;

use std::ffi::{c_char, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Result, Status};
use crate::metadata::{BackendKind, PtMetadata};
use crate::perf::pmu::IntelPtPmu;
use crate::probe::inside_dynamorio;
use crate::sideband::record::SIDEBAND_SAMPLE_TYPE;
use crate::tracer::{BackendChoice, Mode, OutputBuffers, Tracer, TracerConfig, BACKEND_ENV};

/// Status of every drpttracer call (values fixed by DynamoRIO's ABI).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum drpttracer_status_t {
    DRPTTRACER_SUCCESS = 0,
    DRPTTRACER_ERROR,
    DRPTTRACER_ERROR_INVALID_PARAMETER,
    DRPTTRACER_ERROR_FAILED_TO_OPEN_PERF_EVENT,
    DRPTTRACER_ERROR_FAILED_TO_MMAP_PERF_DATA,
    DRPTTRACER_ERROR_FAILED_TO_MMAP_PT_DATA,
    DRPTTRACER_ERROR_FAILED_TO_ALLOCATE_OUTPUT_BUFFER,
    DRPTTRACER_ERROR_FAILED_TO_START_TRACING,
    DRPTTRACER_ERROR_FAILED_TO_STOP_TRACING,
    DRPTTRACER_ERROR_OVERWRITTEN_PT_TRACE,
    DRPTTRACER_ERROR_FAILED_TO_READ_PT_DATA,
    DRPTTRACER_ERROR_OVERWRITTEN_SIDEBAND_DATA,
    DRPTTRACER_ERROR_FAILED_TO_READ_SIDEBANBD_DATA,
}

impl From<Status> for drpttracer_status_t {
    fn from(s: Status) -> Self {
        use drpttracer_status_t::*;
        match s {
            Status::Success => DRPTTRACER_SUCCESS,
            Status::Error => DRPTTRACER_ERROR,
            Status::InvalidParameter => DRPTTRACER_ERROR_INVALID_PARAMETER,
            Status::FailedToOpenPerfEvent => DRPTTRACER_ERROR_FAILED_TO_OPEN_PERF_EVENT,
            Status::FailedToMmapPerfData => DRPTTRACER_ERROR_FAILED_TO_MMAP_PERF_DATA,
            Status::FailedToMmapPtData => DRPTTRACER_ERROR_FAILED_TO_MMAP_PT_DATA,
            Status::FailedToAllocateOutputBuffer => {
                DRPTTRACER_ERROR_FAILED_TO_ALLOCATE_OUTPUT_BUFFER
            }
            Status::FailedToStartTracing => DRPTTRACER_ERROR_FAILED_TO_START_TRACING,
            Status::FailedToStopTracing => DRPTTRACER_ERROR_FAILED_TO_STOP_TRACING,
            Status::OverwrittenPtTrace => DRPTTRACER_ERROR_OVERWRITTEN_PT_TRACE,
            Status::FailedToReadPtData => DRPTTRACER_ERROR_FAILED_TO_READ_PT_DATA,
            Status::OverwrittenSidebandData => DRPTTRACER_ERROR_OVERWRITTEN_SIDEBAND_DATA,
            Status::FailedToReadSidebandData => DRPTTRACER_ERROR_FAILED_TO_READ_SIDEBANBD_DATA,
        }
    }
}

/// What a handle traces.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum drpttracer_tracing_mode_t {
    DRPTTRACER_TRACING_ONLY_USER = 0,
    DRPTTRACER_TRACING_ONLY_KERNEL = 1,
    DRPTTRACER_TRACING_USER_AND_KERNEL = 2,
}

/// The mode parameter as it arrives from C: any `int` (the header names it
/// `drpttracer_tracing_mode_t`; receiving it as an integer keeps out-of-range values from
/// C defined behaviour in Rust).
pub type tracing_mode_arg_t = std::ffi::c_int;

/// Metadata a decoder needs (packed, 18 bytes, little-endian).
#[repr(C, packed)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pt_metadata_t {
    pub cpu_family: u16,
    pub cpu_model: u8,
    pub cpu_stepping: u8,
    pub time_shift: u16,
    pub time_mult: u32,
    pub time_zero: u64,
}

/// Buffers a window is copied into by `drpttracer_stop_tracing`.
#[repr(C)]
#[derive(Debug)]
pub struct drpttracer_output_t {
    pub pt_buffer: *mut c_void,
    pub pt_buffer_size: usize,
    pub pt_size: usize,
    pub sideband_buffer: *mut c_void,
    pub sideband_buffer_size: usize,
    pub sideband_size: usize,
}

/// Extended metadata (`drpttracer_ext_get_metadata`): everything libipt's config wants
/// plus how the trace was captured. `struct_size` must be set by the caller.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct drpttracer_ext_metadata_t {
    /// sizeof(drpttracer_ext_metadata_t), set by the caller (versioning).
    pub struct_size: u32,
    /// 0 = hardware (perf intel_pt), 1 = emulated (software single-step).
    pub backend: u32,
    pub cpu_family: u16,
    pub cpu_model: u8,
    pub cpu_stepping: u8,
    /// Nominal (max non-turbo) frequency ratio.
    pub nom_freq: u8,
    /// MTC frequency (`mtc_period`).
    pub mtc_freq: u8,
    /// 1 when time_zero/time_mult/time_shift are valid: published by the kernel
    /// (cap_user_time_zero) or, on the emulated backend, measured against kernel records.
    pub time_zero_valid: u8,
    pub reserved: u8,
    pub time_shift: u16,
    pub time_mult: u32,
    pub time_zero: u64,
    pub cpuid_0x15_eax: u32,
    pub cpuid_0x15_ebx: u32,
    /// perf_event_attr.type and .config of the PT event (0 for the emulated backend).
    pub perf_type: u32,
    pub perf_config: u64,
    /// sample_type of the sideband records' sample_id trailers.
    pub sideband_sample_type: u64,
}

// ---------------------------------------------------------------------------------------
// Outputs, errors, the backend.

/// Each output is boxed; the pointer handed out is the address of its `c` field.
struct OutputAlloc {
    c: drpttracer_output_t,
    _buffers: OutputBuffers,
}
// SAFETY: the raw pointers in `c` point into `_buffers`, owned by the same allocation.
unsafe impl Send for OutputAlloc {}

/// Runs `f`, converting errors and panics into a status (+ message).
fn guard(what: &str, f: impl FnOnce() -> Result<()>) -> drpttracer_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            last_error::set("");
            drpttracer_status_t::DRPTTRACER_SUCCESS
        }
        Ok(Err(e)) => {
            last_error::set(&format!("{what}: {}", e.message));
            e.status.into()
        }
        Err(_) => {
            last_error::set(&format!(
                "{what}: internal error (panic caught at the C boundary)"
            ));
            drpttracer_status_t::DRPTTRACER_ERROR
        }
    }
}

/// The backend C callers get: [`BACKEND_ENV`] when set (`hardware`, `emulated`, or `auto`:
/// hardware where present, else emulated), and when unset or empty Intel PT hardware only,
/// as DynamoRIO's library (a software backend is used only where asked for).
pub fn backend_for_c_api() -> Result<BackendChoice> {
    match std::env::var_os(BACKEND_ENV) {
        None => Ok(BackendChoice::Hardware),
        Some(v) if v.is_empty() => Ok(BackendChoice::Hardware),
        Some(v) => BackendChoice::parse(&v.to_string_lossy()),
    }
}

const NOT_IN_DYNAMORIO: &str = "the emulated backend single-steps the thread (EFLAGS.TF and \
     a SIGTRAP handler), which cannot work inside DynamoRIO: DynamoRIO runs the application \
     from its code cache and owns its signals; there only Intel PT hardware traces";

/// Whether `choice` can trace on this machine, checked by the first `drpttracer_init` as
/// DynamoRIO's checks for the `intel_pt` PMU; the error says why not and what to do.
fn can_trace(choice: BackendChoice) -> Result<()> {
    let no_pt = |e: Error| {
        Error::new(
            Status::Error,
            format!(
                "no Intel PT to trace with ({}); as DynamoRIO's drpttracer, this library \
                 then traces nothing unless a software backend is asked for \
                 ({BACKEND_ENV}=emulated or {BACKEND_ENV}=auto)",
                e.message
            ),
        )
    };
    let in_dr = inside_dynamorio();
    match choice {
        BackendChoice::Hardware => IntelPtPmu::probe().map(|_| ()).map_err(no_pt),
        BackendChoice::Emulated | BackendChoice::Auto if in_dr => match IntelPtPmu::probe() {
            Ok(_) if choice == BackendChoice::Auto => Ok(()),
            _ => Err(Error::new(
                Status::Error,
                format!("{BACKEND_ENV}={}: {NOT_IN_DYNAMORIO}", choice.name()),
            )),
        },
        BackendChoice::Emulated | BackendChoice::Auto => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// DynamoRIO's API.

/// Initializes the library (reference counted; pair each call that returned true with
/// `drpttracer_exit`). As DynamoRIO's: false where nothing can trace (no `intel_pt` PMU and
/// no software backend asked for with `PTTRACER_BACKEND`), with the reason in
/// `drpttracer_ext_last_error()`; later calls only count.
#[no_mangle]
pub extern "C" fn drpttracer_init() -> bool {
    guard("drpttracer_init", || {
        registry::init(|| {
            if inside_dynamorio() {
                crate::capture::uncache_tids();
            }
            can_trace(backend_for_c_api()?)
        })
    }) == drpttracer_status_t::DRPTTRACER_SUCCESS
}

/// Drops one reference; the last one destroys every remaining handle and output.
#[no_mangle]
pub extern "C" fn drpttracer_exit() {
    let _ = catch_unwind(registry::exit);
}

/// Creates a trace handle for the calling thread. Rings are 2^shift pages (shift > 0).
///
/// # Safety
/// `tracer_handle` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn drpttracer_create_handle(
    drcontext: *mut c_void,
    tracing_mode: tracing_mode_arg_t,
    pt_size_shift: c_uint,
    sideband_size_shift: c_uint,
    tracer_handle: *mut *mut c_void,
) -> drpttracer_status_t {
    let _ = drcontext;
    let raw_mode = tracing_mode as u32;
    guard("drpttracer_create_handle", || {
        if tracer_handle.is_null() {
            return Err(Error::invalid("tracer_handle (the out pointer) is NULL"));
        }
        // Parameters first, then the state, as DynamoRIO's library checks them.
        for (name, v) in [
            ("pt_size_shift", pt_size_shift),
            ("sideband_size_shift", sideband_size_shift),
        ] {
            if v == 0 {
                return Err(Error::invalid(format!(
                    "{name}=0: rings are 2^shift pages, the shift must be > 0"
                )));
            }
        }
        let mode = Mode::from_raw(raw_mode).ok_or_else(|| {
            Error::invalid(format!(
                "tracing_mode={raw_mode} is not a drpttracer_tracing_mode_t (0, 1 or 2)"
            ))
        })?;
        registry::require_init()?;
        let backend = backend_for_c_api()?;
        let in_dr = inside_dynamorio();
        if in_dr && backend.resolve(mode)? == BackendKind::Emulated {
            return Err(Error::new(
                Status::FailedToOpenPerfEvent,
                format!("{BACKEND_ENV}={}: {NOT_IN_DYNAMORIO}", backend.name()),
            ));
        }
        let config = TracerConfig {
            mode,
            pt_size_shift,
            sideband_size_shift,
            backend,
        };
        let handle = registry::insert_handle(Tracer::new(config)?, !in_dr);
        // SAFETY: checked non-NULL above; the caller provides storage for a pointer.
        unsafe { *tracer_handle = handle };
        Ok(())
    })
}

/// Destroys a handle created by this thread.
#[no_mangle]
pub extern "C" fn drpttracer_destroy_handle(
    drcontext: *mut c_void,
    tracer_handle: *mut c_void,
) -> drpttracer_status_t {
    let _ = drcontext;
    guard("drpttracer_destroy_handle", || {
        registry::remove_handle(tracer_handle, "drpttracer_destroy_handle")
    })
}

/// Starts tracing the calling thread with `tracer_handle`.
#[no_mangle]
pub extern "C" fn drpttracer_start_tracing(
    drcontext: *mut c_void,
    tracer_handle: *mut c_void,
) -> drpttracer_status_t {
    let _ = drcontext;
    guard("drpttracer_start_tracing", || {
        let t = registry::lookup(tracer_handle, "drpttracer_start_tracing")?;
        let mut t = registry::lock(&t);
        t.start()
    })
}

/// Stops tracing and copies the window into `output` (sizes set even on data loss).
///
/// # Safety
/// `output` must be NULL or point to a `drpttracer_output_t` whose buffers are valid for
/// their stated sizes (as `drpttracer_create_output` makes them).
#[no_mangle]
pub unsafe extern "C" fn drpttracer_stop_tracing(
    drcontext: *mut c_void,
    tracer_handle: *mut c_void,
    output: *mut drpttracer_output_t,
) -> drpttracer_status_t {
    let _ = drcontext;
    guard("drpttracer_stop_tracing", || {
        let t = registry::lookup(tracer_handle, "drpttracer_stop_tracing")?;
        if output.is_null() {
            return Err(Error::invalid("output is NULL"));
        }
        // SAFETY: non-NULL; the caller guarantees it points to a valid output struct.
        let out = unsafe { &mut *output };
        if out.pt_buffer.is_null() && out.pt_buffer_size != 0 {
            return Err(Error::invalid(
                "output->pt_buffer is NULL but pt_buffer_size is not 0",
            ));
        }
        if out.sideband_buffer.is_null() && out.sideband_buffer_size != 0 {
            return Err(Error::invalid(
                "output->sideband_buffer is NULL but sideband_buffer_size is not 0",
            ));
        }
        // A buffer of size 0 holds nothing: a window with PT then fails as one that does
        // not fit (ERROR_FAILED_TO_READ_PT_DATA, as DynamoRIO's library).
        let pt: &mut [u8] = if out.pt_buffer.is_null() {
            &mut []
        } else {
            // SAFETY: the caller guarantees pt_buffer holds pt_buffer_size writable bytes.
            unsafe { std::slice::from_raw_parts_mut(out.pt_buffer as *mut u8, out.pt_buffer_size) }
        };
        let sb = if out.sideband_buffer.is_null() {
            None
        } else {
            // SAFETY: as above, for the sideband buffer.
            Some(unsafe {
                std::slice::from_raw_parts_mut(
                    out.sideband_buffer as *mut u8,
                    out.sideband_buffer_size,
                )
            })
        };
        let cap = registry::lock(&t).stop_into(pt, sb)?;
        out.pt_size = cap.pt_size;
        out.sideband_size = cap.sideband_size;
        match cap.status() {
            Status::Success => Ok(()),
            s => Err(Error::new(
                s,
                format!(
                    "window incomplete: pt {} bytes{}{}, sideband {} bytes{}{}",
                    cap.pt_size,
                    if cap.pt_lost {
                        ", PT data lost (ring full/overwritten)"
                    } else {
                        ""
                    },
                    if cap.pt_truncated_by_output {
                        ", PT did not fit the output buffer"
                    } else {
                        ""
                    },
                    cap.sideband_size,
                    if cap.sideband_lost {
                        ", sideband records lost"
                    } else {
                        ""
                    },
                    if cap.sideband_truncated_by_output {
                        ", sideband did not fit the output buffer"
                    } else {
                        ""
                    },
                ),
            )),
        }
    })
}

/// Copies the handle's metadata into `pt_metadata`.
///
/// # Safety
/// `pt_metadata` must be NULL or point to writable storage for a `pt_metadata_t`.
#[no_mangle]
pub unsafe extern "C" fn drpttracer_get_pt_metadata(
    tracer_handle: *mut c_void,
    pt_metadata: *mut pt_metadata_t,
) -> drpttracer_status_t {
    guard("drpttracer_get_pt_metadata", || {
        let t = registry::lookup(tracer_handle, "drpttracer_get_pt_metadata")?;
        if pt_metadata.is_null() {
            return Err(Error::invalid("pt_metadata is NULL"));
        }
        let m: PtMetadata = registry::lock(&t).metadata();
        let c = pt_metadata_t {
            cpu_family: m.cpu_family,
            cpu_model: m.cpu_model,
            cpu_stepping: m.cpu_stepping,
            time_shift: m.time_shift,
            time_mult: m.time_mult,
            time_zero: m.time_zero,
        };
        // SAFETY: non-NULL; packed struct has alignment 1 so any address is aligned.
        unsafe { pt_metadata.write(c) };
        Ok(())
    })
}

/// Allocates an output: PT buffer of 2^`pt_buf_size_shift` pages, sideband buffer of
/// (2^`sd_buf_size_shift` + 1) pages or none when `sd_buf_size_shift` is 0.
///
/// # Safety
/// `output` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn drpttracer_create_output(
    drcontext: *mut c_void,
    pt_buf_size_shift: c_uint,
    sd_buf_size_shift: usize,
    output: *mut *mut drpttracer_output_t,
) -> drpttracer_status_t {
    let _ = drcontext;
    guard("drpttracer_create_output", || {
        if output.is_null() {
            return Err(Error::invalid("output (the out pointer) is NULL"));
        }
        let sd_shift = u32::try_from(sd_buf_size_shift).map_err(|_| {
            Error::invalid(format!(
                "sd_buf_size_shift={sd_buf_size_shift} is out of range"
            ))
        })?;
        let mut buffers = OutputBuffers::new(pt_buf_size_shift, sd_shift)?;
        let c = drpttracer_output_t {
            pt_buffer: buffers.pt.as_mut_ptr() as *mut c_void,
            pt_buffer_size: buffers.pt.len(),
            pt_size: 0,
            sideband_buffer: if buffers.sideband.is_empty() {
                std::ptr::null_mut()
            } else {
                buffers.sideband.as_mut_ptr() as *mut c_void
            },
            sideband_buffer_size: buffers.sideband.len(),
            sideband_size: 0,
        };
        let mut alloc = Box::new(OutputAlloc {
            c,
            _buffers: buffers,
        });
        let ptr: *mut drpttracer_output_t = &mut alloc.c;
        registry::insert_output(ptr as usize, alloc);
        // SAFETY: checked non-NULL; the caller provides storage for a pointer.
        unsafe { *output = ptr };
        Ok(())
    })
}

/// Frees an output made by `drpttracer_create_output`.
#[no_mangle]
pub extern "C" fn drpttracer_destroy_output(
    drcontext: *mut c_void,
    output: *mut drpttracer_output_t,
) -> drpttracer_status_t {
    let _ = drcontext;
    guard("drpttracer_destroy_output", || {
        if output.is_null() {
            return Err(Error::invalid("output is NULL"));
        }
        if registry::remove_output(output as usize) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "output {output:p} was not made by drpttracer_create_output or is already destroyed"
            )))
        }
    })
}

// ---------------------------------------------------------------------------------------
// Extensions.

/// The calling thread's message for its last failed call ("" after a success). The
/// pointer stays valid until this thread's next drpttracer call.
#[no_mangle]
pub extern "C" fn drpttracer_ext_last_error() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    catch_unwind(last_error::as_ptr).unwrap_or(EMPTY.as_ptr() as *const c_char)
}

/// Copies the handle's extended metadata into `out` (`out->struct_size` must be set).
///
/// # Safety
/// `out` must be NULL or point to a writable `drpttracer_ext_metadata_t`.
#[no_mangle]
pub unsafe extern "C" fn drpttracer_ext_get_metadata(
    tracer_handle: *mut c_void,
    out: *mut drpttracer_ext_metadata_t,
) -> drpttracer_status_t {
    guard("drpttracer_ext_get_metadata", || {
        let t = registry::lookup(tracer_handle, "drpttracer_ext_get_metadata")?;
        if out.is_null() {
            return Err(Error::invalid("out is NULL"));
        }
        // SAFETY: non-NULL; struct_size is the first field of a caller-owned struct.
        let size = unsafe { (*out).struct_size } as usize;
        if size != std::mem::size_of::<drpttracer_ext_metadata_t>() {
            return Err(Error::invalid(format!(
                "out->struct_size={size} but this library's drpttracer_ext_metadata_t is {} bytes; \
                 set struct_size = sizeof(drpttracer_ext_metadata_t)",
                std::mem::size_of::<drpttracer_ext_metadata_t>()
            )));
        }
        let m = registry::lock(&t).ext_metadata();
        let c = drpttracer_ext_metadata_t {
            struct_size: size as u32,
            backend: m.backend as u32,
            cpu_family: m.base.cpu_family,
            cpu_model: m.base.cpu_model,
            cpu_stepping: m.base.cpu_stepping,
            nom_freq: m.nom_freq,
            mtc_freq: m.mtc_freq,
            time_zero_valid: u8::from(m.time_zero_valid),
            reserved: 0,
            time_shift: m.base.time_shift,
            time_mult: m.base.time_mult,
            time_zero: m.base.time_zero,
            cpuid_0x15_eax: m.cpuid_0x15_eax,
            cpuid_0x15_ebx: m.cpuid_0x15_ebx,
            perf_type: m.perf_type,
            perf_config: m.perf_config,
            sideband_sample_type: m.sideband_sample_type,
        };
        // SAFETY: non-NULL, sized as checked above.
        unsafe { out.write(c) };
        Ok(())
    })
}

/// Copies `bytes` into a caller buffer, always reporting the needed size.
///
/// # Safety
/// `buf` must be NULL or hold `buf_size` writable bytes; `needed` must be NULL or writable.
unsafe fn copy_out(
    bytes: &[u8],
    buf: *mut c_void,
    buf_size: usize,
    needed: *mut usize,
) -> Result<()> {
    if needed.is_null() {
        return Err(Error::invalid("the size out pointer is NULL"));
    }
    // SAFETY: checked non-NULL; caller-provided storage.
    unsafe { *needed = bytes.len() };
    if buf.is_null() || buf_size < bytes.len() {
        return Err(Error::invalid(format!(
            "buffer of {buf_size} bytes is too small: {} bytes needed (query with buf = NULL)",
            bytes.len()
        )));
    }
    // SAFETY: buf holds at least bytes.len() writable bytes (checked above).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len()) };
    Ok(())
}

/// Copies the vDSO's bytes (it has no file on disk) so user traces through it decode.
/// `*vdso_size` always receives the size; `*vdso_addr` its load address.
///
/// # Safety
/// `buf` NULL or `buf_size` writable bytes; `vdso_size`, `vdso_addr` writable.
#[no_mangle]
pub unsafe extern "C" fn drpttracer_ext_get_vdso(
    buf: *mut c_void,
    buf_size: usize,
    vdso_size: *mut usize,
    vdso_addr: *mut u64,
) -> drpttracer_status_t {
    guard("drpttracer_ext_get_vdso", || {
        if vdso_addr.is_null() {
            return Err(Error::invalid("vdso_addr is NULL"));
        }
        let (addr, bytes) = crate::sideband::synth::vdso_bytes()?;
        // SAFETY: checked non-NULL.
        unsafe { *vdso_addr = addr };
        // SAFETY: forwarded caller contract.
        unsafe { copy_out(&bytes, buf, buf_size, vdso_size) }
    })
}

/// Writes MMAP2 records (sample_type = TID|TIME|CPU|IDENTIFIER) for every executable
/// mapping of this process: the "synthesized" initial image of a user-mode trace.
///
/// # Safety
/// `buf` NULL or `buf_size` writable bytes; `size` writable.
#[no_mangle]
pub unsafe extern "C" fn drpttracer_ext_synthesize_mappings(
    buf: *mut c_void,
    buf_size: usize,
    size: *mut usize,
) -> drpttracer_status_t {
    guard("drpttracer_ext_synthesize_mappings", || {
        let bytes = crate::sideband::synth::synthesize_exec_mmap2(SIDEBAND_SAMPLE_TYPE, 0)?;
        // SAFETY: forwarded caller contract.
        unsafe { copy_out(&bytes, buf, buf_size, size) }
    })
}
