//! LD_PRELOAD shim: traces the syscall windows of unmodified binaries.
//!
//! Loaded into a process as `libdrpttracer.so` (by `pttrace run`, or by hand with
//! `LD_PRELOAD=…/libdrpttracer.so PTTRACER_OUT=dir prog`), a constructor in `.init_array`
//! reads the `PTTRACER_*` variables ([`config`]). Without `PTTRACER_OUT` it does nothing at
//! all, so programs and DynamoRIO clients that merely link the library see no side effect;
//! an invalid value prints one line on stderr and the program runs untraced.
//!
//! When active, every syscall of every thread is intercepted with Syscall User Dispatch:
//! the selector byte is BLOCK for the whole process and the shim's own syscalls go through
//! a stub inside the allowed range ([`raw`]). The SIGSYS handler ([`handler`]) performs each
//! syscall itself and records a window (nr, args, return value, TSC start/end, flags) into
//! the thread's lock-free queue ([`slots`]); the writer thread ([`writer`]) drains the
//! queues into per-thread files ([`output`], format in [`crate::format::ptt`]).
//!
//! Threads and processes: SUD is inherited by forked processes (except CLONE_VFORK
//! children, which the handler re-arms) but not by new threads; thread-creating clones are
//! therefore re-executed through a stub whose child path arms SUD before the new thread
//! runs any application instruction ([`raw`]); its slot is claimed at its first syscall.
//! Forked children get a fresh process image (new info file, own thread files); glibc's
//! `fork` runs the shim's `pthread_atfork` child handler, which starts a writer in the
//! child (without it the child's threads write their own queues). `execve` keeps the
//! shim: the environment passed to the new image gets `LD_PRELOAD` and the `PTTRACER_*`
//! settings back if the application dropped them ([`execenv`]).
//!
//! Ends: `exit_group`, the last thread's `exit`, `execve` and fatal signals whose
//! disposition is the default (SIGSEGV, SIGTERM, …; the handler flushes and re-raises)
//! flush every queue and write end records; after SIGKILL everything the writer had
//! flushed (it wakes at least every 10 ms) is readable and the missing end is visible.
//!
//! Fast path (`PTTRACER_REWRITE`, default `sites`): syscall sites that trapped once are
//! patched into calls of a recording entry ([`rewrite`]), about 5x cheaper than a SIGSYS.
//!
//! What runs where: the SIGSYS handler and the patched-site entry run on the application
//! thread and are async-signal-safe ([`handler`], [`window`], [`slots`], [`output`],
//! [`frame`], [`raw`], [`execenv`], [`rewrite`]); the constructor, the `pthread_atfork`
//! handler and the writer thread are normal context ([`writer`], this module).
//!
//! PT: with `PTTRACER_MODE=user PTTRACER_WINDOW=thread` on the emulated backend, the user
//! code between syscalls is single-stepped and written as PT with each window
//! ([`userpt`]). Otherwise the handler records metadata-only windows: at start-up it tries
//! to create a tracer for the configured mode to learn whether PT would be available, and
//! stores the reason it is absent once in the info file and each thread header; those
//! windows carry `WF_PT_ABSENT`.

pub mod child_files;
pub mod config;
pub mod execenv;
pub mod frame;
pub mod handler;
pub mod kernel_files;
pub mod kernelpt;
pub mod kpt_slot;
pub mod output;
pub mod paths;
pub mod process;
pub mod raw;
pub mod rewrite;
pub mod slots;
pub mod snapshot;
pub mod spool;
pub use pttrace_format::sysnames;
pub mod userpt;
pub mod vfork_child;
pub mod window;
pub mod writer;

use config::ShimConfig;
use std::path::Path;
use std::sync::atomic::Ordering::*;

/// Message prefix on stderr.
const WHO: &str = "drpttracer shim";

/// `.init_array` entry: runs when the library is loaded (glibc passes argc, argv, envp).
#[used]
#[link_section = ".init_array"]
static SHIM_INIT: extern "C" fn() = shim_constructor;

extern "C" fn shim_constructor() {
    // Never let a panic cross into the loader.
    let _ = std::panic::catch_unwind(|| {
        if let Err(msg) = init() {
            eprintln!("{WHO}: {msg}; tracing disabled, the program runs untraced");
        }
    });
}

/// Whether this code runs from a shared object (the preloaded cdylib) rather than being
/// linked statically into an executable (the `pttrace` binary and tests link the rlib).
/// The file this code was loaded from (dladdr), empty when unknown.
fn own_path() -> Vec<u8> {
    // SAFETY: dladdr only reads loader data; info is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the address is that of a function in this object.
    let ok = unsafe { libc::dladdr(shim_constructor as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return Vec::new();
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    match std::fs::canonicalize(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name))
    {
        Ok(p) => p.into_os_string().into_encoded_bytes(),
        Err(_) => name.to_vec(),
    }
}

fn loaded_as_shared_object() -> bool {
    // SAFETY: dladdr only reads loader data; info is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the address is that of a function in this object.
    let ok = unsafe { libc::dladdr(shim_constructor as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let b = name.to_bytes();
    b.ends_with(b".so") || b.windows(4).any(|w| w == b".so.")
}

/// The vDSO's address and size from /proc/self/maps.
fn vdso_range() -> (u64, usize) {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return (0, 0);
    };
    for line in maps.lines() {
        if line.ends_with("[vdso]") {
            let range = line.split_whitespace().next().unwrap_or("");
            let mut it = range.split('-');
            let a = it.next().and_then(|v| u64::from_str_radix(v, 16).ok());
            let b = it.next().and_then(|v| u64::from_str_radix(v, 16).ok());
            if let (Some(a), Some(b)) = (a, b) {
                if b > a {
                    return (a, (b - a) as usize);
                }
            }
        }
    }
    (0, 0)
}

/// Learns whether PT is available for the configured mode (and its metadata).
fn probe_tracer(cfg: &ShimConfig) -> (u8, bool, String, crate::metadata::ExtMetadata) {
    use crate::metadata::{cpu_identity, cpuid_0x15, BackendKind, ExtMetadata, PtMetadata};
    let kind = cfg
        .backend
        .resolve(cfg.mode)
        .unwrap_or(BackendKind::Hardware);
    let tcfg = crate::tracer::TracerConfig {
        mode: cfg.mode,
        pt_size_shift: cfg.pt_shift,
        sideband_size_shift: cfg.sb_shift,
        backend: cfg.backend,
    };
    match crate::tracer::Tracer::new(tcfg) {
        Ok(t) if t.backend_kind() == BackendKind::Hardware && kernelpt::wanted(cfg) => {
            // Kernel PT of syscall windows on Intel PT hardware is recorded by `kernelpt`.
            let (present, reason) = match kernelpt::init(cfg) {
                Ok(()) => (true, String::new()),
                Err(e) => (false, format!("hardware backend: {e}")),
            };
            (
                t.backend_kind() as u32 as u8,
                present,
                reason,
                t.ext_metadata(),
            )
        }
        Ok(t) if snapshot::writer_side::hardware_wanted(cfg, t.backend_kind()) => {
            // Snapshot mode on Intel PT hardware: each thread's event is `snapshot::hw`'s.
            (
                t.backend_kind() as u32 as u8,
                true,
                String::new(),
                t.ext_metadata(),
            )
        }
        Ok(t) => {
            // User PT of thread windows on the emulated backend is recorded by `userpt`.
            let reason = userpt::absent_reason(cfg, t.backend_kind());
            (
                t.backend_kind() as u32 as u8,
                reason.is_none(),
                reason.unwrap_or_default(),
                t.ext_metadata(),
            )
        }
        Err(e) => {
            let (fam, model, step) = cpu_identity();
            let (eax, ebx) = cpuid_0x15();
            let meta = ExtMetadata {
                base: PtMetadata {
                    cpu_family: fam,
                    cpu_model: model,
                    cpu_stepping: step,
                    ..Default::default()
                },
                cpuid_0x15_eax: eax,
                cpuid_0x15_ebx: ebx,
                nom_freq: 0,
                mtc_freq: 0,
                time_zero_valid: false,
                backend: kind,
                perf_type: 0,
                perf_config: 0,
                sideband_sample_type: 0,
            };
            (
                kind as u32 as u8,
                false,
                format!(
                    "{} backend for mode {}: {}",
                    kind.name(),
                    cfg.mode.name(),
                    e.message
                ),
                meta,
            )
        }
    }
}

fn install_sigsys() -> Result<(), String> {
    #[repr(C)]
    struct KSigaction {
        handler: u64,
        flags: u64,
        restorer: u64,
        mask: u64,
    }
    const SA_RESTORER: u64 = 0x0400_0000;
    let act = KSigaction {
        handler: handler::on_sigsys as *const () as u64,
        flags: (libc::SA_SIGINFO | libc::SA_NODEFER) as u64 | SA_RESTORER,
        restorer: raw::sigreturn_stub(),
        mask: 0,
    };
    let mut old = KSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    let r = raw::sys4(
        libc::SYS_rt_sigaction,
        libc::SIGSYS as u64,
        &act as *const KSigaction as u64,
        &mut old as *mut KSigaction as u64,
        8,
    );
    if r != 0 {
        return Err(format!("rt_sigaction(SIGSYS) failed with errno {}", -r));
    }
    // A SIGSYS handler installed before us (by another preloaded library) is chained.
    handler::APP_SIGSYS_HANDLER.store(old.handler, Relaxed);
    handler::APP_SIGSYS_FLAGS.store(old.flags, Relaxed);
    handler::APP_SIGSYS_RESTORER.store(old.restorer, Relaxed);
    handler::APP_SIGSYS_MASK.store(old.mask, Relaxed);
    Ok(())
}

const PR_SET_SYSCALL_USER_DISPATCH: u64 = 59;
const PR_SYS_DISPATCH_OFF: u64 = 0;
const PR_SYS_DISPATCH_ON: u64 = 1;

/// Arms Syscall User Dispatch for the calling thread. Async-signal-safe (one raw syscall).
/// Forked children inherit it, except those created with CLONE_VFORK; new threads never do.
pub(crate) fn arm() -> i64 {
    let (start, len) = raw::allowed_range();
    raw::sys6(
        libc::SYS_prctl as u64,
        [
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_ON,
            start,
            len,
            raw::selector_addr(),
            0,
        ],
    )
}

fn disarm() -> i64 {
    raw::sys6(
        libc::SYS_prctl as u64,
        [
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_OFF,
            0,
            0,
            0,
            0,
        ],
    )
}

/// glibc `fork` child handler (normal context, in the child): start the child's writer.
extern "C" fn atfork_child() {
    if !slots::ACTIVE_FLAG.load(Acquire) || slots::WRITER_ALIVE.load(Acquire) {
        return;
    }
    // Not stepped from here: with SUD off, pthread_create's signal blocking (SIGTRAP
    // included) would reach the kernel directly.
    userpt::pause_stepping();
    // The writer must not inherit SUD: disarm this thread while it is created.
    // With patched syscall sites it may still reach the fast path: `spawn` flags it.
    disarm();
    let _ = std::panic::catch_unwind(writer::spawn);
    arm();
}

/// Removes the spools the previous image of this pid set aside at its `execve` (their
/// thread files were complete; see [`spool`]).
fn remove_spools_set_aside(dir: &Path, pid: i32) {
    let prefix = format!("{pid}-");
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".spool.exec") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn init() -> Result<(), String> {
    match std::env::var_os(config::ENV_OUT) {
        None => return Ok(()),
        Some(v) if v.is_empty() && loaded_as_shared_object() => {
            return Err(format!(
                "{}= is set but empty: it names no output directory",
                config::ENV_OUT
            ));
        }
        Some(_) if !loaded_as_shared_object() => return Ok(()),
        Some(_) => {}
    }
    if crate::probe::inside_dynamorio() {
        // Its signal handlers, patched sites and writer thread would fight DynamoRIO's
        // code cache and signal handling (and a client's private copy has no program).
        return Err(
            "running under DynamoRIO: the LD_PRELOAD shim stays off there (DynamoRIO \
                    clients trace through the drpttracer C API)"
                .into(),
        );
    }
    let cfg = match ShimConfig::from_env()? {
        Some(c) => c,
        None => return Ok(()),
    };
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| {
        format!(
            "cannot create the output directory {} ({}={}): {e}",
            cfg.out_dir.display(),
            config::ENV_OUT,
            cfg.out_dir.display()
        )
    })?;
    let (backend, mut pt_present, mut reason, meta) = probe_tracer(&cfg);
    let hw_snapshot = pt_present
        && backend == crate::metadata::BackendKind::Hardware as u32 as u8
        && snapshot::writer_side::hardware_wanted(&cfg, crate::metadata::BackendKind::Hardware);
    let stepping = pt_present && !kernelpt::enabled() && !hw_snapshot;
    if stepping {
        if let Err(e) = userpt::init(&cfg) {
            pt_present = false;
            reason = format!("emulated backend: {e}");
        }
    }
    // Snapshot mode: a ring per thread on the writer (the single-step backend's steps, or
    // each thread's overwrite-mode event on Intel PT hardware).
    let snapshot_notes =
        snapshot::writer_side::init(&cfg, stepping && pt_present, hw_snapshot, &cfg.out_dir)
            .map_err(|e| {
                if pt_present {
                    e
                } else {
                    format!("{e}; here: {reason}")
                }
            })?;
    // Patched syscall sites run shim code in normal context, which stepping would trace,
    // and the decoder reads the original images: no patching while user code is stepped
    // or traced by the hardware.
    let rewrite = !stepping && !hw_snapshot && {
        let (active, msgs) = rewrite::setup(cfg.rewrite);
        for m in msgs {
            eprintln!("{WHO}: {m}");
        }
        active.sites || active.page0
    };
    // The per-thread layer drains a full queue itself when no writer exists: through the
    // writer's function, handed down here.
    slots::set_drainer(output::drain_locked);
    let mut st = slots::make_static(
        &cfg,
        backend,
        pt_present,
        reason,
        meta.record_bytes(),
        meta.base.to_bytes(),
        vdso_range(),
        rewrite,
        own_path(),
    );
    if cfg.mode.traces_kernel() {
        // Kernel symbols and text beside the DynamoRIO-format files (once per directory).
        st.config_text.push_str(&kernel_files::copy_into(
            &cfg.out_dir.join("kernel.raw"),
            Path::new("/proc/kallsyms"),
            Path::new("/proc/kcore"),
        ));
    }
    if slots::STATIC.set(st).is_err() {
        return Ok(());
    }
    let pid = raw::getpid();
    remove_spools_set_aside(&cfg.out_dir, pid);
    let tsc = raw::rdtsc();
    slots::PID.store(pid, Relaxed);
    slots::NONCE.store(tsc & 0xFFFF_FFFF, Relaxed);
    slots::START_TSC.store(tsc, Relaxed);
    let main = slots::claim(raw::gettid(), pid, tsc & 0xFFFF_FFFF)
        .ok_or("cannot allocate the main thread's window queue (mmap failed)")?;
    slots::set_current(main);
    slots::LIVE.store(1, Release);
    if !output::write_info_file() {
        return Err(format!(
            "cannot write the process info file in {}",
            cfg.out_dir.display()
        ));
    }
    for n in &snapshot_notes {
        frame::write_frame_parts(
            slots::INFO_FD.load(Acquire),
            crate::format::ptt::RecordType::Note,
            &[n.as_bytes()],
        );
    }
    snapshot::writer_side::start_main_thread(main);
    writer::spawn();
    install_sigsys()?;
    handler::install_fatal_handlers();
    // SAFETY: registering a plain extern "C" function as the fork child handler.
    unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    slots::ACTIVE_FLAG.store(true, Release);
    let r = arm();
    if r != 0 {
        slots::ACTIVE_FLAG.store(false, Release);
        return Err(format!(
            "prctl(PR_SET_SYSCALL_USER_DISPATCH) failed with errno {} (kernel without \
             CONFIG_GENERIC_ENTRY / Syscall User Dispatch?)",
            -r
        ));
    }
    Ok(())
}
