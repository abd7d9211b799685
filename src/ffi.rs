//! C ABI: DynamoRIO's drpttracer API and the `drpttracer_ext_*` extensions.
//!
//! ABI only: the types here are the C layouts, every function converts its arguments,
//! looks handles up in a registry (a pointer we did not hand out is never dereferenced),
//! calls [`crate::tracer`], records a thread-local message for the last failure and returns
//! the status. No panic crosses this boundary: every entry point runs under
//! `catch_unwind`.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::error::{Error, Result, Status};
use crate::metadata::PtMetadata;
use crate::sideband::record::SIDEBAND_SAMPLE_TYPE;
use crate::tracer::{current_tid, BackendChoice, Mode, OutputBuffers, Tracer, TracerConfig};

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
// Registries and the last-error message.

/// A live handle's tracer, shared between the registry and per-thread caches.
type SharedTracer = Arc<Mutex<Tracer>>;

struct HandleEntry {
    owner_tid: i32,
    tracer: Arc<Mutex<Tracer>>,
}

static HANDLES: Lazy<Mutex<HashMap<usize, HandleEntry>>> = Lazy::new(Default::default);

/// Each output is boxed; the pointer handed out is the box's address.
struct OutputAlloc {
    c: drpttracer_output_t,
    _buffers: OutputBuffers,
}
// SAFETY: the raw pointers in `c` point into `_buffers`, owned by the same allocation.
unsafe impl Send for OutputAlloc {}

static OUTPUTS: Lazy<Mutex<HashMap<usize, Box<OutputAlloc>>>> = Lazy::new(Default::default);

static INIT_COUNT: Mutex<u64> = Mutex::new(0);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Destroys this thread's remaining handles when the thread exits.
    static THREAD_HANDLES: ThreadHandles = const { ThreadHandles };
}

struct ThreadHandles;

impl Drop for ThreadHandles {
    fn drop(&mut self) {
        let tid = current_tid();
        let mut map = HANDLES.lock();
        map.retain(|_, e| e.owner_tid != tid);
        drop(map);
        handles_removed();
    }
}

fn set_last_error(msg: &str) {
    let _ = LAST_ERROR.try_with(|e| {
        let mut e = e.borrow_mut();
        // Successes clear the message without allocating: start/stop run inside windows.
        if msg.is_empty() {
            if !e.as_bytes().is_empty() {
                *e = CString::default();
            }
        } else {
            *e = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        }
    });
}

/// Runs `f`, converting errors and panics into a status (+ message).
fn guard(what: &str, f: impl FnOnce() -> Result<()>) -> drpttracer_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last_error("");
            drpttracer_status_t::DRPTTRACER_SUCCESS
        }
        Ok(Err(e)) => {
            set_last_error(&format!("{what}: {}", e.message));
            e.status.into()
        }
        Err(_) => {
            set_last_error(&format!(
                "{what}: internal error (panic caught at the C boundary)"
            ));
            drpttracer_status_t::DRPTTRACER_ERROR
        }
    }
}

/// Bumped whenever handles leave the registry, so per-thread lookup caches revalidate.
static REGISTRY_GENERATION: AtomicU64 = AtomicU64::new(0);

fn handles_removed() {
    REGISTRY_GENERATION.fetch_add(1, Ordering::Release);
}

thread_local! {
    /// The last handle this thread looked up successfully: (key, registry generation, it).
    /// Start and stop run inside trace windows; the cache keeps them short.
    static LAST_LOOKUP: RefCell<Option<(usize, u64, SharedTracer)>> =
        const { RefCell::new(None) };
}

fn lookup(handle: *mut c_void, what: &str) -> Result<SharedTracer> {
    if handle.is_null() {
        return Err(Error::invalid("tracer_handle is NULL"));
    }
    let key = handle as usize;
    let generation = REGISTRY_GENERATION.load(Ordering::Acquire);
    let cached = LAST_LOOKUP
        .try_with(|c| match &*c.borrow() {
            Some((k, g, t)) if *k == key && *g == generation => Some(t.clone()),
            _ => None,
        })
        .ok()
        .flatten();
    if let Some(t) = cached {
        return Ok(t);
    }
    let t = lookup_in_registry(handle, what)?;
    let _ = LAST_LOOKUP.try_with(|c| *c.borrow_mut() = Some((key, generation, t.clone())));
    Ok(t)
}

fn lookup_in_registry(handle: *mut c_void, what: &str) -> Result<SharedTracer> {
    let map = HANDLES.lock();
    let Some(entry) = map.get(&(handle as usize)) else {
        return Err(Error::invalid(format!(
            "tracer_handle {handle:p} is not a live handle (never created, or already destroyed)"
        )));
    };
    let tid = current_tid();
    if entry.owner_tid != tid {
        return Err(Error::invalid(format!(
            "{what}: tracer_handle {handle:p} belongs to thread {} but was used from thread \
             {tid}; handles are per thread",
            entry.owner_tid
        )));
    }
    Ok(entry.tracer.clone())
}

fn require_init() -> Result<()> {
    if *INIT_COUNT.lock() == 0 {
        return Err(Error::new(
            Status::Error,
            "drpttracer is not initialized: call drpttracer_init() first",
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// DynamoRIO's API.

/// Initializes the library (reference counted; pair each call with `drpttracer_exit`).
#[no_mangle]
pub extern "C" fn drpttracer_init() -> bool {
    catch_unwind(|| {
        *INIT_COUNT.lock() += 1;
        true
    })
    .unwrap_or(false)
}

/// Drops one reference; the last one destroys every remaining handle and output.
#[no_mangle]
pub extern "C" fn drpttracer_exit() {
    let _ = catch_unwind(|| {
        let mut n = INIT_COUNT.lock();
        if *n == 0 {
            return;
        }
        *n -= 1;
        if *n == 0 {
            HANDLES.lock().clear();
            handles_removed();
            OUTPUTS.lock().clear();
        }
    });
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
        require_init()?;
        let mode = Mode::from_raw(raw_mode).ok_or_else(|| {
            Error::invalid(format!(
                "tracing_mode={raw_mode} is not a drpttracer_tracing_mode_t (0, 1 or 2)"
            ))
        })?;
        let config = TracerConfig {
            mode,
            pt_size_shift,
            sideband_size_shift,
            backend: BackendChoice::from_env()?,
        };
        let tracer = Tracer::new(config)?;
        let owner_tid = tracer.owner_tid();
        let tracer = Arc::new(Mutex::new(tracer));
        let key = Arc::as_ptr(&tracer) as usize;
        THREAD_HANDLES.with(|_| ());
        HANDLES
            .lock()
            .insert(key, HandleEntry { owner_tid, tracer });
        // SAFETY: checked non-NULL above; the caller provides storage for a pointer.
        unsafe { *tracer_handle = key as *mut c_void };
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
        lookup(tracer_handle, "drpttracer_destroy_handle")?;
        let removed = HANDLES.lock().remove(&(tracer_handle as usize));
        handles_removed();
        // Drop this thread's cached reference too, so the tracer (and its fds) goes now.
        let _ = LAST_LOOKUP.try_with(|c| c.borrow_mut().take());
        drop(removed);
        Ok(())
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
        let t = lookup(tracer_handle, "drpttracer_start_tracing")?;
        let mut t = t.lock();
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
        let t = lookup(tracer_handle, "drpttracer_stop_tracing")?;
        if output.is_null() {
            return Err(Error::invalid("output is NULL"));
        }
        // SAFETY: non-NULL; the caller guarantees it points to a valid output struct.
        let out = unsafe { &mut *output };
        if out.pt_buffer.is_null() || out.pt_buffer_size == 0 {
            return Err(Error::invalid(
                "output->pt_buffer is NULL or pt_buffer_size is 0",
            ));
        }
        if out.sideband_buffer.is_null() && out.sideband_buffer_size != 0 {
            return Err(Error::invalid(
                "output->sideband_buffer is NULL but sideband_buffer_size is not 0",
            ));
        }
        // SAFETY: the caller guarantees pt_buffer holds pt_buffer_size writable bytes.
        let pt =
            unsafe { std::slice::from_raw_parts_mut(out.pt_buffer as *mut u8, out.pt_buffer_size) };
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
        let mut t = t.lock();
        let cap = t.stop_into(pt, sb)?;
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
        let t = lookup(tracer_handle, "drpttracer_get_pt_metadata")?;
        if pt_metadata.is_null() {
            return Err(Error::invalid("pt_metadata is NULL"));
        }
        let m: PtMetadata = t.lock().metadata();
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
        OUTPUTS.lock().insert(ptr as usize, alloc);
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
        match OUTPUTS.lock().remove(&(output as usize)) {
            Some(_) => Ok(()),
            None => Err(Error::invalid(format!(
                "output {output:p} was not made by drpttracer_create_output or is already destroyed"
            ))),
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
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|e| e.borrow().as_ptr())
            .unwrap_or(EMPTY.as_ptr() as *const c_char)
    })
    .unwrap_or(EMPTY.as_ptr() as *const c_char)
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
        let t = lookup(tracer_handle, "drpttracer_ext_get_metadata")?;
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
        let m = t.lock().ext_metadata();
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
