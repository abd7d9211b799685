//! `libpttrace_qemu.so`: a QEMU user-mode TCG plugin (plugin API v1, Debian's QEMU 7.2)
//! that writes genuine Intel PT of the emulated program into a pttrace trace directory —
//! the same `<pid>-<nonce>.info` and `<pid>-<nonce>-<tid>.ptt` files the LD_PRELOAD shim
//! writes, so `pttrace report` and `pttrace decode DIR` read them unchanged.
//!
//! How: at translation time each block's instructions are copied (address, bytes) and its
//! last instruction is classified ([`pttrace_encoder::classify`]); the block gets an
//! execution callback whose user data is its descriptor. At execution time each vCPU (one
//! per guest thread) logs the block sequence for a worker thread of its own, whose
//! [`pttrace_encoder::FlowEncoder`] writes the packets user-only hardware would write (TNT
//! from the next block, TIP for indirect branches and returns, asynchronous events for
//! signals, PSB+ periodically). Windows are
//! cut at every syscall (number, arguments, return value, TSCs) like the shim's thread
//! windows; each window's sideband carries, as code records ([`pttrace_format::code`]),
//! the bytes of every block the thread executes for the first time, so the decoder needs
//! no file images and JIT or self-modifying code decodes too (a block whose bytes differ
//! from an earlier translation cuts the window so each window sees one version).
//!
//! Fork children get new files (detected at the fork's return in the child), threads get
//! their own files, and `execve` of an x86-64 program (or a `#!` script) re-executes
//! through QEMU with this plugin (the host `execve` is made from the syscall callback,
//! guest addresses being host addresses in user mode); images that cannot be followed are
//! named in a `Note` of the info file. Plugin arguments: `out=DIR` (required), `qemu=PATH`
//! and `self=PATH` (for following exec), `oracle=on` (also write each thread's executed
//! block sequence to `<...>.oracle`, for tests), `cut=BYTES` (PT per window before a cut),
//! and for snapshot mode `snapshot=BYTES`, `trigger=SPEC` (repeated; `addrsym:NAME` is an
//! `addr:` symbol carried over an exec, resolved in the new executable) and
//! `request=PATH` (see [`snapshot`] and [`pttrace_format::snapshot`]).
//!
//! Threading: QEMU calls the execution and syscall callbacks of a vCPU on that vCPU's
//! thread only; each vCPU logs into its own [`feeder::Feeder`] and a worker thread per
//! guest thread owns the encoder and the files ([`thread::Thread`]); the atexit callback
//! runs with the other vCPUs stopped (QEMU's exclusive section).

mod api;
mod cursor;
mod exec;
mod feeder;
mod files;
mod log;
mod maps;
mod memory;
mod sigframe;
mod snapshot;
mod thread;

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Mutex, OnceLock};

use pttrace_encoder::{can_fault, classify_bytes, Block, BlockEnd, InstructionInfoFactory};
use pttrace_format::metadata::{BackendKind, ExtMetadata, PtMetadata, METADATA_RECORD_SIZE};
use pttrace_format::perf_record::SIDEBAND_SAMPLE_TYPE;
use pttrace_format::ptt::{self, EndReason, FileKind, RecordType};
use pttrace_format::snapshot::Trigger;

use feeder::{Feeder, OpenLog};
use files::TraceFile;
use log::Msg;
use thread::Thread;

/// The plugin API version this plugin speaks (QEMU 6.0 to 7.2).
#[no_mangle]
pub static qemu_plugin_version: c_int = 1;

/// Most vCPUs (guest threads alive at once) the plugin traces.
const MAX_VCPUS: usize = 4096;
/// Default PT bytes per window before it is cut (bounds memory per thread).
const DEFAULT_CUT: usize = 8 << 20;
/// `-QEMU_ESIGRETURN`: what QEMU returns for rt_sigreturn (the syscall does not return).
const QEMU_ESIGRETURN: i64 = -513;
/// `Global::exit_code` before any exit_group.
const NO_EXIT_GROUP: i32 = i32::MIN;

/// Plugin arguments.
struct Config {
    out: PathBuf,
    oracle: bool,
    /// Read where signals interrupted from their frames ([`sigframe`]); off
    /// (`PTTRACE_QEMU_SIGFRAMES=off`, for tests) leaves it to the flow encoder's inference.
    sigframes: bool,
    cut: usize,
    qemu: Option<String>,
    this: Option<String>,
    /// Snapshot mode: PT bytes kept per thread (see [`snapshot`]).
    snapshot: Option<u64>,
    triggers: Vec<Trigger>,
    /// The request file `pttrace run` appends to for signal triggers.
    request: Option<PathBuf>,
    /// `addr:SYMBOL` triggers carried from the image before an exec (`trigger=addrsym:`),
    /// resolved in this image's executable at start ([`snapshot::resolve_carried`]).
    addr_symbols: Vec<String>,
    /// Record every load and store (`memory=on`, `pttrace run --memory`).
    memory: bool,
}

/// `trigger=` prefix of an `addr:SYMBOL` trigger carried into an exec'd image.
const ADDR_SYMBOL: &str = "addrsym:";

impl Config {
    /// Names of the `addr:SYMBOL` triggers (given, or carried here and not found).
    fn carried_symbols(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .triggers
            .iter()
            .filter_map(|t| match t {
                Trigger::Addr { label, .. } if !label.starts_with("0x") => Some(label.clone()),
                _ => None,
            })
            .chain(self.addr_symbols.iter().cloned())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// `addr:0xADDR` triggers (not carried into an exec'd image).
    fn address_triggers(&self) -> Vec<String> {
        self.triggers
            .iter()
            .filter(|t| matches!(t, Trigger::Addr { label, .. } if label.starts_with("0x")))
            .map(Trigger::describe)
            .collect()
    }

    /// Snapshot mode with triggers that fire for every thread (all but `exit`): threads
    /// share their state with the publishers ([`feeder::Share`]).
    fn publishes(&self) -> bool {
        self.has_trigger(|t| *t != Trigger::Exit)
    }

    fn has_trigger(&self, f: impl Fn(&Trigger) -> bool) -> bool {
        self.snapshot.is_some() && self.triggers.iter().any(f)
    }

    /// The arguments an exec'd image gets: `memory=on`, and in snapshot mode the
    /// triggers, `addr:SYMBOL` ones as the symbol's name (the new image resolves it in its
    /// own executable); `addr:0xADDR` ones are not carried (they name an address of this
    /// image's executable).
    fn carried_args(&self) -> Vec<(String, Vec<u8>)> {
        let mut v = Vec::new();
        if self.memory {
            v.push(("memory".to_string(), b"on".to_vec()));
        }
        if let Some(s) = self.snapshot {
            v.push(("snapshot".to_string(), s.to_string().into_bytes()));
            for t in &self.triggers {
                if !matches!(t, Trigger::Addr { .. }) {
                    v.push(("trigger".to_string(), t.to_arg().into_bytes()));
                }
            }
            for name in self.carried_symbols() {
                v.push((
                    "trigger".to_string(),
                    format!("{ADDR_SYMBOL}{name}").into_bytes(),
                ));
            }
            if let Some(r) = &self.request {
                use std::os::unix::ffi::OsStrExt;
                v.push(("request".to_string(), r.as_os_str().as_bytes().to_vec()));
            }
        }
        v
    }
}

/// One translated block.
struct BlockInfo {
    id: u32,
    block: Block,
    code: Box<[u8]>,
    /// Instruction lengths (the oracle expands blocks into instruction addresses).
    lens: Box<[u8]>,
    /// The bytes differ from an earlier translation of the same addresses.
    replaces: bool,
    /// `uid` of the last thread that put this block's code in its file.
    owner: AtomicU64,
    /// An `addr:` snapshot trigger inside the block: (its address, trigger index).
    trigger: Option<(u64, u32)>,
}

struct Global {
    cfg: Config,
    pid: AtomicI32,
    nonce: AtomicU64,
    start_tsc: AtomicU64,
    info: Mutex<Option<TraceFile>>,
    /// Exit code from exit_group (`NO_EXIT_GROUP`: none seen).
    exit_code: AtomicI32,
    code_map: Mutex<BTreeMap<u64, &'static BlockInfo>>,
    /// What the last `Maps` record of the info file said ([`maps`]).
    maps_written: Mutex<maps::Written>,
    next_id: AtomicU32,
    /// Next `Thread::uid`.
    next_uid: AtomicU64,
    /// Bytes of the longest block translated (how far back an overlap can start).
    longest_block: AtomicU64,
    threads: Box<[AtomicPtr<Feeder>]>,
    /// Signal handler entry per signal number (0: none), from the guest's rt_sigaction.
    handlers: [AtomicU64; 65],
    /// Bumped at every change of `handlers`.
    handlers_gen: AtomicU64,
    /// `sa_restorer` per signal number (0: none), from the guest's rt_sigaction: the return
    /// address a signal frame holds at its start (checks that a frame was found).
    restorers: [AtomicU64; 65],
    /// `sa_flags` per signal number.
    sa_flags: [AtomicU64; 65],
    /// Guest addresses are host addresses (checked on the first translated block).
    identity_mapped: AtomicBool,
    checked_mapping: AtomicBool,
    /// Snapshot mode: the last snapshot number given, the process-wide exit snapshot's
    /// number (0: none yet), every worker's channel (by `Thread::uid`), the `addr:`
    /// triggers' run-time addresses, and how much of the request file was taken.
    snapshot_no: AtomicU64,
    exit_no: AtomicU64,
    /// Thread files created for this image (in its `ProcessEnd`: a reader then tells
    /// when some are missing).
    thread_files: AtomicU64,
    workers: Mutex<Vec<Worker>>,
    /// Firings published for every thread ([`Global::publish`]) and the last one's number.
    firings: Mutex<Vec<std::sync::Arc<log::Firing>>>,
    published: AtomicU64,
    trigger_addrs: OnceLock<Vec<(u64, u32)>>,
    request_seen: AtomicU64,
}

/// Snapshot mode: a live thread's worker, as publishers of firings reach it.
struct Worker {
    uid: u64,
    tx: Sender<Msg>,
    share: log::Share,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no memory effects; x86-64 always has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// Prints one line on standard error (QEMU's own `qemu_plugin_outs` goes to its log, which
/// is off unless `-d plugin` is given).
fn say(msg: &str) {
    let _ = std::io::stderr().write_all(format!("pttrace-qemu: {msg}\n").as_bytes());
}

fn new_nonce() -> u64 {
    let t = rdtsc() ^ monotonic_ns().rotate_left(17) ^ (getpid() as u64).rotate_left(40);
    t.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32
}

/// The guest's command line (NUL-separated) and program path (canonical when it exists).
fn guest_cmdline() -> (Vec<u8>, String) {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let (cmdline, prog) = pttrace_format::launch::guest_cmdline(&raw);
    let prog = String::from_utf8_lossy(&prog).into_owned();
    let exe = std::fs::canonicalize(&prog)
        .map(|p| p.display().to_string())
        .unwrap_or(prog);
    (cmdline, exe)
}

/// The `Metadata` record: the CPU identity of QEMU's x86-64 model as family 6 model 0 (no
/// erratum workaround applies to software-written PT), no TSC conversion, backend qemu, the
/// sideband's sample_type.
fn metadata_record() -> [u8; METADATA_RECORD_SIZE] {
    ExtMetadata {
        base: PtMetadata {
            cpu_family: 6,
            cpu_model: 0,
            cpu_stepping: 0,
            time_shift: 0,
            time_mult: 0,
            time_zero: 0,
        },
        cpuid_0x15_eax: 0,
        cpuid_0x15_ebx: 0,
        nom_freq: 0,
        mtc_freq: 0,
        time_zero_valid: false,
        backend: BackendKind::Emulated,
        perf_type: 0,
        perf_config: 0,
        sideband_sample_type: SIDEBAND_SAMPLE_TYPE,
    }
    .record_bytes_with_backend(ptt::BACKEND_QEMU)
}

/// A `Clock` record: CLOCK_MONOTONIC and the TSC, taken together.
fn clock_record() -> [u8; 16] {
    let mut clock = [0u8; 16];
    clock[..8].copy_from_slice(&monotonic_ns().to_le_bytes());
    clock[8..].copy_from_slice(&rdtsc().to_le_bytes());
    clock
}

impl Global {
    /// Creates this process image's info file (at start and in a fork child).
    fn open_info(&self, ppid: i32) {
        let pid = getpid();
        let nonce = new_nonce();
        let tsc = rdtsc();
        self.pid.store(pid, Ordering::Relaxed);
        self.nonce.store(nonce, Ordering::Relaxed);
        self.start_tsc.store(tsc, Ordering::Relaxed);
        let path = self.cfg.out.join(format!("{pid}-{nonce:08x}.info"));
        let file = TraceFile::create(&path).and_then(|mut f| {
            f.append(&[&ptt::encode_header(FileKind::ProcessInfo)])?;
            let rec = ptt::ProcessRecord {
                pid,
                ppid,
                nonce,
                start_tsc: tsc,
                start_monotonic_ns: monotonic_ns(),
                mode: 0,
                window: 1,
                backend: ptt::BACKEND_QEMU,
                pt_present: true,
                pt_absent_reason: String::new(),
            };
            f.frame(RecordType::Process, &ptt::process_payload(&rec))?;
            let mut cfg = format!(
                "PTTRACER_BACKEND=qemu\nPTTRACER_MODE=user\nPTTRACER_WINDOW=thread\nPTTRACER_OUT={}\n",
                self.cfg.out.display()
            );
            if self.cfg.memory {
                cfg.push_str("PTTRACER_MEMORY=on\n");
            }
            if let Some(size) = self.cfg.snapshot {
                let t: Vec<String> = self.cfg.triggers.iter().map(Trigger::describe).collect();
                cfg.push_str(&format!(
                    "PTTRACER_SNAPSHOT={size}\nPTTRACER_TRIGGERS={}\nPTTRACER_CUT={}\n",
                    t.join(","),
                    self.cfg.cut
                ));
            }
            f.frame(RecordType::Config, cfg.as_bytes())?;
            f.frame(RecordType::Metadata, &metadata_record())?;
            f.frame(RecordType::Clock, &clock_record())?;
            let (cmdline, exe) = guest_cmdline();
            f.frame(RecordType::Cmdline, &cmdline)?;
            f.frame(RecordType::Exe, exe.as_bytes())?;
            Ok(f)
        });
        match file {
            Ok(f) => {
                if let Ok(mut w) = self.maps_written.lock() {
                    *w = maps::Written::default();
                }
                if let Ok(mut g) = self.info.lock() {
                    *g = Some(f);
                }
                self.note_code_at(None);
            }
            Err(e) => say(&format!("cannot create {}: {e}", path.display())),
        }
    }

    /// Records the handler a guest `rt_sigaction(sig, act, ..)` installs (the first field of
    /// the kernel's `struct sigaction`; 0 and 1 are SIG_DFL and SIG_IGN) and its restorer
    /// (the third).
    fn note_sigaction(&self, sig: u64, act: u64) {
        if !self.identity_mapped.load(Ordering::Relaxed) {
            return;
        }
        let mut raw = [0u8; 24];
        if exec::read_memory(act, &mut raw) != raw.len() {
            return;
        }
        let word =
            |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let (h, flags, restorer) = (word(0), word(1), word(2));
        if let Some(slot) = self.restorers.get(sig as usize) {
            slot.store(restorer, Ordering::Relaxed);
        }
        if let Some(slot) = self.sa_flags.get(sig as usize) {
            slot.store(flags, Ordering::Relaxed);
        }
        if let Some(slot) = self.handlers.get(sig as usize) {
            let h = if h > 1 { h } else { 0 };
            if slot.swap(h, Ordering::Relaxed) != h {
                self.handlers_gen.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// Whether `addr` is an installed handler's entry point.
    fn is_handler(&self, addr: u64) -> bool {
        self.handlers
            .iter()
            .any(|h| h.load(Ordering::Relaxed) == addr)
    }

    /// The handler installed for `sig` (0: none), and whether with SA_SIGINFO.
    fn handler_of(&self, sig: usize) -> (u64, bool) {
        let h = self
            .handlers
            .get(sig)
            .map_or(0, |h| h.load(Ordering::Relaxed));
        let flags = self
            .sa_flags
            .get(sig)
            .map_or(0, |f| f.load(Ordering::Relaxed));
        (h, flags & libc::SA_SIGINFO as u64 != 0)
    }

    /// Whether `addr` is a restorer some installed handler returns to.
    fn is_restorer(&self, addr: u64) -> bool {
        addr > 1
            && self
                .restorers
                .iter()
                .zip(&self.handlers)
                .any(|(r, h)| h.load(Ordering::Relaxed) != 0 && r.load(Ordering::Relaxed) == addr)
    }

    /// The installed handlers' entry points.
    fn signal_handlers(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .handlers
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .filter(|&h| h != 0)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The handlers of synchronous signals, each with whether it serves no other signal.
    fn fault_handlers(&self) -> Vec<(u64, bool)> {
        const FAULTS: [usize; 5] = [
            libc::SIGILL as usize,
            libc::SIGTRAP as usize,
            libc::SIGBUS as usize,
            libc::SIGFPE as usize,
            libc::SIGSEGV as usize,
        ];
        let all: Vec<u64> = self
            .handlers
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .collect();
        let mut v: Vec<(u64, bool)> = FAULTS
            .iter()
            .map(|&sig| all[sig])
            .filter(|&h| h != 0)
            .map(|h| {
                let only = all
                    .iter()
                    .enumerate()
                    .all(|(sig, &other)| other != h || FAULTS.contains(&sig));
                (h, only)
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Code at `addr` was translated (and is in the code map): a `Maps` record is written
    /// if the last one does not mark its file mapping as code ([`maps`]). Without `addr`
    /// (a fork child, which runs its parent's translated code), one is written at once.
    fn note_code_at(&self, addr: Option<u64>) {
        let Ok(mut written) = self.maps_written.lock() else {
            return;
        };
        if addr.is_some_and(|a| written.covers(a)) {
            return;
        }
        let text = match self.code_map.lock() {
            Ok(blocks) if addr.is_some() || !blocks.is_empty() => {
                written.take(|a, b| blocks.range(a..b).next().is_some(), addr)
            }
            _ => return,
        };
        if let Ok(mut g) = self.info.lock() {
            if let Some(f) = g.as_mut() {
                let _ = f.frame(RecordType::Maps, text.as_bytes());
            }
        }
    }

    fn note(&self, text: &str) {
        if let Ok(mut g) = self.info.lock() {
            if let Some(f) = g.as_mut() {
                let _ = f.frame(RecordType::Note, text.as_bytes());
            }
        }
    }

    fn close_info(&self, reason: EndReason, code: i32) {
        let maps = match self.code_map.lock() {
            Ok(blocks) => maps::guest_file_maps(|a, b| blocks.range(a..b).next().is_some()),
            Err(_) => maps::guest_file_maps(|_, _| false),
        };
        if let Ok(mut g) = self.info.lock() {
            if let Some(mut f) = g.take() {
                let _ = f.frame(RecordType::Maps, maps.as_bytes());
                let _ = f.frame(RecordType::Clock, &clock_record());
                let _ = f.frame(
                    RecordType::ProcessEnd,
                    &ptt::process_end_payload(
                        reason,
                        code,
                        0,
                        self.thread_files.load(Ordering::Acquire),
                    ),
                );
            }
        }
    }

    #[inline]
    fn slot(&self, vcpu: c_uint) -> Option<&AtomicPtr<Feeder>> {
        self.threads.get(vcpu as usize)
    }

    /// The log of `vcpu`, created (with its thread's files and worker) on its first block,
    /// on its own thread, open until dropped. Mutable from a shared `Global` because each
    /// belongs to one vCPU thread (see the SAFETY note).
    #[inline]
    fn feeder(&self, vcpu: c_uint) -> Option<OpenLog<'_>> {
        self.feeder_unopened(vcpu).map(OpenLog::new)
    }

    /// [`Self::feeder`] without opening its log: for what a feeder keeps besides the log
    /// (the memory-access descriptions), the cursor still writing.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    fn feeder_unopened(&self, vcpu: c_uint) -> Option<&mut Feeder> {
        let slot = self.slot(vcpu)?;
        let mut p = slot.load(Ordering::Relaxed);
        if p.is_null() {
            p = self.create_feeder(slot, vcpu);
        }
        // SAFETY: the pointer came from Box::into_raw and is only used by this vCPU's
        // thread (QEMU runs a vCPU's callbacks on its own thread), or by the atexit
        // callback while every other vCPU is stopped.
        Some(unsafe { &mut *p })
    }

    #[cold]
    #[inline(never)]
    fn create_feeder(&self, slot: &AtomicPtr<Feeder>, vcpu: c_uint) -> *mut Feeder {
        let f = Feeder::start(Thread::new(self), vcpu as usize);
        let p = Box::into_raw(Box::new(f));
        slot.store(p, Ordering::Relaxed);
        p
    }
}

#[inline]
fn global() -> Option<&'static Global> {
    GLOBAL.get()
}

/// Runs a callback body, never letting a panic unwind into QEMU.
fn guarded(f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        say("internal error in a callback (panic); tracing of this thread may be incomplete");
    }
}

extern "C" fn on_tb_trans(_id: api::PluginId, tb: *mut api::Tb) {
    guarded(|| translate(tb));
}

fn translate(tb: *mut api::Tb) {
    let Some(g) = global() else { return };
    // SAFETY: `tb` is the block QEMU is translating, valid for this callback.
    let n = unsafe { api::qemu_plugin_tb_n_insns(tb) };
    if n == 0 {
        return;
    }
    let mut insns: Vec<(u64, &[u8])> = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: i < n_insns; the instruction handle and its data are valid during
        // translation; insn_data points at insn_size bytes.
        insns.push(unsafe {
            let insn = api::qemu_plugin_tb_get_insn(tb, i);
            let size = api::qemu_plugin_insn_size(insn);
            let data = api::qemu_plugin_insn_data(insn) as *const u8;
            (
                api::qemu_plugin_insn_vaddr(insn),
                std::slice::from_raw_parts(data, size),
            )
        });
    }
    // QEMU 7.2 ends a block before an instruction that crosses into the next page (unless
    // it is the block's first) but still lists it, with the bytes of the first page only:
    // that instruction runs as the next block.
    let mut kind = BlockEnd::Far;
    while let Some(&(ip, bytes)) = insns.last() {
        match classify_bytes(ip, bytes) {
            Some(c) if usize::from(c.len) == bytes.len() => {
                kind = BlockEnd::from_class(&c, ip);
                break;
            }
            _ if insns.len() > 1 => {
                insns.pop();
            }
            _ => break,
        }
    }
    let start = insns[0].0;
    if !g.checked_mapping.swap(true, Ordering::Relaxed) {
        let mut here = vec![0u8; insns[0].1.len()];
        let same = exec::read_memory(start, &mut here) == here.len() && here == insns[0].1;
        g.identity_mapped.store(same, Ordering::Relaxed);
        if g.cfg.has_trigger(|t| matches!(t, Trigger::Addr { .. })) {
            let _ = g.trigger_addrs.set(snapshot::resolve_addresses(g));
        }
    }
    let mut code = Vec::with_capacity(n * 4);
    let mut lens = Vec::with_capacity(insns.len());
    let mut info = InstructionInfoFactory::new();
    let (mut fault_sites, mut fault_at) = (0u32, 0u64);
    for (i, &(ip, bytes)) in insns.iter().enumerate() {
        code.extend_from_slice(bytes);
        lens.push(bytes.len() as u8);
        // A far transfer ending a block is handled as one (a syscall ends the window).
        let far = kind == BlockEnd::Far && i + 1 == insns.len();
        if !far && can_fault(ip, bytes, &mut info) {
            if fault_sites == 0 {
                fault_at = ip;
            }
            fault_sites += 1;
        }
    }
    let end = start + code.len() as u64;
    let trigger = g
        .trigger_addrs
        .get()
        .and_then(|v| v.iter().find(|(a, _)| (start..end).contains(a)).copied());
    let id = g.next_id.fetch_add(1, Ordering::Relaxed);
    let mut replaces = false;
    let info = {
        let Ok(mut map) = g.code_map.lock() else {
            return;
        };
        let reach = g
            .longest_block
            .fetch_max(code.len() as u64, Ordering::Relaxed);
        let reach = reach.max(code.len() as u64);
        for (_, old) in map.range(start.saturating_sub(reach)..end) {
            let (os, oe) = (old.block.start, old.block.end);
            if oe <= start {
                continue;
            }
            let (s, e) = (os.max(start), oe.min(end));
            let a = &old.code[(s - os) as usize..(e - os) as usize];
            let b = &code[(s - start) as usize..(e - start) as usize];
            if a != b {
                replaces = true;
                break;
            }
        }
        let info: &'static BlockInfo = Box::leak(Box::new(BlockInfo {
            id,
            block: Block::new(start, end, kind).with_fault_sites(fault_sites, fault_at),
            code: code.into_boxed_slice(),
            lens: lens.into_boxed_slice(),
            replaces,
            owner: AtomicU64::new(0),
            trigger,
        }));
        map.insert(start, info);
        info
    };
    g.note_code_at(Some(start));
    if g.cfg.sigframes && g.is_handler(start) {
        // SAFETY: as below; the trampoline takes the same two arguments.
        unsafe {
            api::qemu_plugin_register_vcpu_tb_exec_cb(
                tb,
                sigframe::pttrace_qemu_handler_entry,
                api::CB_NO_REGS,
                info as *const BlockInfo as *mut c_void,
            )
        };
    }
    if g.cfg.memory {
        let mut offset = 0usize;
        for (i, len) in info.lens.iter().enumerate() {
            // SAFETY: i < n_insns and `tb` is valid during translation; the user data is
            // the instruction's offset from the block's start, a plain value.
            unsafe {
                api::qemu_plugin_register_vcpu_mem_cb(
                    api::qemu_plugin_tb_get_insn(tb, i),
                    on_memory,
                    api::CB_NO_REGS,
                    api::MEM_RW,
                    offset as *mut c_void,
                )
            };
            offset += usize::from(*len);
        }
    }
    // SAFETY: `tb` is valid during translation; the callback and its user data (a leaked,
    // never freed descriptor) outlive every execution of the block.
    unsafe {
        api::qemu_plugin_register_vcpu_tb_exec_cb(
            tb,
            on_exec,
            api::CB_NO_REGS,
            info as *const BlockInfo as *mut c_void,
        )
    };
}

/// One executed block: its descriptor's address (the callback's `udata`, a leaked
/// `BlockInfo`) goes into the vCPU's log. The fast path cannot panic; the slow path is
/// guarded.
extern "C" fn on_exec(vcpu: c_uint, udata: *mut c_void) {
    let word = udata as u64;
    if !cursor::write(vcpu as usize, word) {
        guarded(|| exec_block_slow(vcpu, word));
    }
}

/// A load or store of the instruction at offset `udata` from its block's start
/// (`memory=on`).
extern "C" fn on_memory(vcpu: c_uint, info: api::MemInfo, vaddr: u64, udata: *mut c_void) {
    guarded(|| {
        let Some(f) = global().and_then(|g| g.feeder_unopened(vcpu)) else {
            return;
        };
        let kind = f.meminfo(info, ask_meminfo);
        // (As a block's word: through the cursor while the chunk has room.)
        if feeder::memory_word(udata as u64, vaddr, kind)
            .is_some_and(|w| cursor::write(vcpu as usize, w))
        {
            return;
        }
        OpenLog::new(f).memory(udata as u64, vaddr, kind);
    });
}

/// What QEMU's memory-access description `info` says: the size shift in bits 0-2 and the
/// store bit in bit 3 (asked once per description, [`feeder::MemInfos`]).
#[cold]
#[inline(never)]
fn ask_meminfo(info: api::MemInfo) -> u8 {
    // SAFETY: the accessors only read the bits of `info`, a value QEMU passed.
    let (shift, store) = unsafe {
        (
            api::qemu_plugin_mem_size_shift(info),
            api::qemu_plugin_mem_is_store(info),
        )
    };
    (shift as u8 & 7) | u8::from(store) << 3
}

/// [`on_exec`] when the vCPU's cursor refuses the word: the chunk is full, the vCPU
/// has no log yet, or a snapshot firing waits.
#[cold]
#[inline(never)]
fn exec_block_slow(vcpu: c_uint, word: u64) {
    let Some(g) = global() else { return };
    let Some(mut f) = g.feeder(vcpu) else { return };
    if g.published.load(Ordering::SeqCst) != f.seen {
        f.take_firings(g);
    }
    f.block(word);
}

#[allow(clippy::too_many_arguments)]
extern "C" fn on_syscall(
    _id: api::PluginId,
    vcpu: c_uint,
    num: i64,
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
    a6: u64,
    _a7: u64,
    _a8: u64,
) {
    guarded(|| {
        let Some(g) = global() else { return };
        let Some(mut f) = g.feeder(vcpu) else { return };
        f.syscall(num as u64, [a1, a2, a3, a4, a5, a6]);
        match num {
            libc::SYS_exit_group => {
                g.exit_code.store(a1 as i32, Ordering::Relaxed);
            }
            libc::SYS_rt_sigaction if a2 != 0 => g.note_sigaction(a1, a2),
            libc::SYS_execve | libc::SYS_execveat => {
                exec::follow(g, &mut f, num, [a1, a2, a3, a4, a5])
            }
            _ => {}
        }
    });
}

extern "C" fn on_syscall_ret(_id: api::PluginId, vcpu: c_uint, num: i64, ret: i64) {
    guarded(|| {
        let Some(g) = global() else { return };
        let Some(mut f) = g.feeder(vcpu) else { return };
        let is_fork = matches!(
            num,
            libc::SYS_clone | libc::SYS_fork | libc::SYS_vfork | libc::SYS_clone3
        );
        if is_fork && ret == 0 && getpid() != f.pid {
            // (The parent's log is abandoned, its cursor reset with the others.)
            drop(f);
            become_fork_child(g, vcpu);
            return;
        }
        f.ret(ret);
    });
}

/// In the child of a fork: a new process image with new files. The parent's workers do
/// not exist here, so every copied log is abandoned (leaked: its channels may be in any
/// state); this thread starts afresh, its first window being the child's side of the fork.
fn become_fork_child(g: &'static Global, vcpu: c_uint) {
    let parent = g.pid.load(Ordering::Relaxed);
    if let Ok(mut info) = g.info.lock() {
        *info = None; // our copy of the parent's descriptor
    }
    if let Ok(mut w) = g.workers.lock() {
        // The parent's workers do not exist here: forget their channels (never dropped,
        // like the logs below).
        std::mem::forget(std::mem::take(&mut *w));
    }
    if let Ok(mut list) = g.firings.lock() {
        list.clear();
    }
    g.published.store(0, Ordering::SeqCst);
    g.snapshot_no.store(0, Ordering::Relaxed);
    g.exit_no.store(0, Ordering::Relaxed);
    g.thread_files.store(0, Ordering::Relaxed);
    let mut fork_syscall = None;
    for (i, slot) in g.threads.iter().enumerate() {
        cursor::reset(i);
        let p = slot.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if p.is_null() {
            continue;
        }
        // SAFETY: only the forking thread exists in the child; the log was created by
        // Box::into_raw and its slot is cleared. Forgotten, never dropped (see above).
        let f = std::mem::ManuallyDrop::new(unsafe { Box::from_raw(p) });
        if i == vcpu as usize {
            fork_syscall = f.last_syscall;
        }
    }
    g.open_info(parent);
    snapshot::start_watcher(g);
    let Some(slot) = g.slot(vcpu) else { return };
    let mut t = Thread::new(g);
    if let Some((nr, args, tsc)) = fork_syscall {
        t.write_fork_child_window(nr, args, tsc);
    }
    let f = Feeder::start(t, vcpu as usize);
    slot.store(Box::into_raw(Box::new(f)), Ordering::Relaxed);
}

extern "C" fn on_vcpu_exit(_id: api::PluginId, vcpu: c_uint) {
    guarded(|| {
        let Some(g) = global() else { return };
        let Some(slot) = g.slot(vcpu) else { return };
        let p = slot.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if p.is_null() {
            return;
        }
        // SAFETY: created by Box::into_raw for this vCPU; its thread is exiting.
        let mut f = unsafe { Box::from_raw(p) };
        f.take_cursor();
        f.finish(EndReason::ThreadExit);
    });
}

extern "C" fn on_atexit(_id: api::PluginId, _udata: *mut c_void) {
    guarded(|| {
        let Some(g) = global() else { return };
        // Without an exit_group the process is ending on a fatal signal.
        let code = g.exit_code.load(Ordering::Relaxed);
        let (reason, code) = if code == NO_EXIT_GROUP {
            (EndReason::Signal, 0)
        } else {
            (EndReason::ExitGroup, code)
        };
        for slot in g.threads.iter() {
            let p = slot.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: every other vCPU is stopped while atexit callbacks run.
                let mut f = unsafe { Box::from_raw(p) };
                f.take_cursor();
                f.finish(reason);
            }
        }
        g.close_info(reason, code);
    });
}

fn parse_args(argc: c_int, argv: *const *const c_char) -> Result<Config, String> {
    let mut cfg = Config {
        out: PathBuf::new(),
        oracle: false,
        sigframes: std::env::var_os("PTTRACE_QEMU_SIGFRAMES").is_none_or(|v| v != "off"),
        cut: DEFAULT_CUT,
        qemu: None,
        this: None,
        snapshot: None,
        triggers: Vec::new(),
        request: None,
        addr_symbols: Vec::new(),
        memory: false,
    };
    let mut cut_given = false;
    for i in 0..argc.max(0) as usize {
        // SAFETY: QEMU passes argc valid NUL-terminated strings.
        let arg = unsafe { CStr::from_ptr(*argv.add(i)) }.to_string_lossy();
        let (k, v) = arg.split_once('=').unwrap_or((&arg, ""));
        match k {
            "out" => cfg.out = PathBuf::from(v),
            "oracle" => cfg.oracle = matches!(v, "on" | "true" | "1" | "yes"),
            "memory" => cfg.memory = matches!(v, "on" | "true" | "1" | "yes"),
            "cut" => {
                cfg.cut = v
                    .parse()
                    .map_err(|_| format!("cut={v}: not a number of bytes"))?;
                cut_given = true;
            }
            "snapshot" => {
                cfg.snapshot = Some(
                    v.parse()
                        .ok()
                        .filter(|&n: &u64| n > 0)
                        .ok_or_else(|| format!("snapshot={v}: not a number of bytes"))?,
                )
            }
            "trigger" if v.starts_with(ADDR_SYMBOL) => {
                cfg.addr_symbols.push(v[ADDR_SYMBOL.len()..].to_string())
            }
            "trigger" => cfg.triggers.push(
                Trigger::from_arg(v)
                    .ok_or_else(|| format!("trigger={v}: not a trigger pttrace run writes"))?,
            ),
            "request" => cfg.request = Some(PathBuf::from(v)),
            "qemu" => cfg.qemu = Some(v.to_string()),
            "self" => cfg.this = Some(v.to_string()),
            _ => {
                return Err(format!(
                    "unknown argument {arg:?} (out=, oracle=, cut=, qemu=, self=, \
                     snapshot=, trigger=, request=, memory=)"
                ))
            }
        }
    }
    if cfg.out.as_os_str().is_empty() {
        return Err("missing out=DIR (the trace directory)".into());
    }
    if let Some(size) = cfg.snapshot {
        // Windows of about an eighth of the ring: it holds 7/8 to all of `size`.
        let small =
            usize::try_from(pttrace_format::snapshot_ring::cut_size(size)).unwrap_or(usize::MAX);
        if !cut_given || cfg.cut > small {
            cfg.cut = small;
        }
    }
    Ok(cfg)
}

/// # Safety
/// Called by QEMU with its plugin id, info and `argc` argument strings.
#[no_mangle]
pub unsafe extern "C" fn qemu_plugin_install(
    id: api::PluginId,
    info: *const api::QemuInfo,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: `info` is QEMU's description of itself, valid during install.
        if let Some(info) = unsafe { info.as_ref() } {
            if info.system_emulation {
                say("this plugin traces user-mode emulation only (qemu-x86_64)");
                return -1;
            }
            // SAFETY: target_name is a NUL-terminated string owned by QEMU.
            let target = unsafe { CStr::from_ptr(info.target_name) }.to_string_lossy();
            if target != "x86_64" {
                say(&format!("target {target} is not x86_64"));
                return -1;
            }
        }
        let mut cfg = match parse_args(argc, argv) {
            Ok(c) => c,
            Err(e) => {
                say(&e);
                return -1;
            }
        };
        let carried = snapshot::resolve_carried(&mut cfg);
        if let Err(e) = std::fs::create_dir_all(&cfg.out) {
            say(&format!("cannot create {}: {e}", cfg.out.display()));
            return -1;
        }
        let g = Global {
            cfg,
            pid: AtomicI32::new(0),
            nonce: AtomicU64::new(0),
            start_tsc: AtomicU64::new(0),
            info: Mutex::new(None),
            exit_code: AtomicI32::new(NO_EXIT_GROUP),
            code_map: Mutex::new(BTreeMap::new()),
            maps_written: Mutex::new(maps::Written::default()),
            next_id: AtomicU32::new(0),
            longest_block: AtomicU64::new(0),
            next_uid: AtomicU64::new(1),
            threads: (0..MAX_VCPUS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            handlers: [const { AtomicU64::new(0) }; 65],
            restorers: [const { AtomicU64::new(0) }; 65],
            sa_flags: [const { AtomicU64::new(0) }; 65],
            handlers_gen: AtomicU64::new(0),
            identity_mapped: AtomicBool::new(false),
            checked_mapping: AtomicBool::new(false),
            snapshot_no: AtomicU64::new(0),
            exit_no: AtomicU64::new(0),
            thread_files: AtomicU64::new(0),
            workers: Mutex::new(Vec::new()),
            firings: Mutex::new(Vec::new()),
            published: AtomicU64::new(0),
            trigger_addrs: OnceLock::new(),
            request_seen: AtomicU64::new(0),
        };
        if GLOBAL.set(g).is_err() {
            return -1;
        }
        let Some(g) = global() else { return -1 };
        // SAFETY: getppid cannot fail.
        g.open_info(unsafe { libc::getppid() });
        // The main thread's file with the info file, before any guest code runs (this is
        // QEMU's main thread, the guest's first vCPU, 0): readers take an image without it
        // for one whose file was deleted. (Created at its first block, a process killed
        // between its first translation and that block had been reported so.)
        let _ = g.feeder_unopened(0);
        for n in carried {
            g.note(&n);
        }
        g.request_seen
            .store(snapshot::request_file_len(g), Ordering::Relaxed);
        snapshot::start_watcher(g);
        // SAFETY: registering callbacks with the id QEMU gave us.
        unsafe {
            api::qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
            api::qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
            api::qemu_plugin_register_vcpu_syscall_ret_cb(id, on_syscall_ret);
            api::qemu_plugin_register_vcpu_exit_cb(id, on_vcpu_exit);
            api::qemu_plugin_register_atexit_cb(id, on_atexit, std::ptr::null_mut());
        }
        0
    });
    r.unwrap_or(-1)
}
