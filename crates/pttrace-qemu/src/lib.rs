//! `libpttrace_qemu.so`: a QEMU user-mode TCG plugin (plugin API v1, Debian's QEMU 7.2)
//! that writes genuine Intel PT of the emulated program into a pttrace trace directory —
//! the same `<pid>-<nonce>.info` and `<pid>-<nonce>-<tid>.ptt` files the LD_PRELOAD shim
//! writes, so `pttrace report` and `pttrace decode DIR` read them unchanged.
//!
//! How: at translation time each block's instructions are copied (address, bytes) and its
//! last instruction is classified ([`pttrace_encoder::classify`]); the block gets an
//! execution callback whose user data is its descriptor. At execution time each vCPU (one
//! per guest thread) feeds the block sequence to its own [`FlowEncoder`], which writes the
//! packets user-only hardware would write (TNT from the next block, TIP for indirect
//! branches and returns, asynchronous events for signals, PSB+ periodically). Windows are
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
//! block sequence to `<...>.oracle`, for tests), `cut=BYTES` (PT per window before a cut).
//!
//! Threading: QEMU calls the execution and syscall callbacks of a vCPU on that vCPU's
//! thread only, so each [`Thread`] is touched by one thread; the atexit callback runs with
//! the other vCPUs stopped (QEMU's exclusive section).

mod api;
mod exec;

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use pttrace_encoder::{classify_bytes, Block, BlockEnd, FlowEncoder, PSB_PERIOD};
use pttrace_format::code::{push_code_record, SampleId};
use pttrace_format::ptt::{self, EndReason, FileKind, RecordType, Window};

/// The plugin API version this plugin speaks (QEMU 6.0 to 7.2).
#[no_mangle]
pub static qemu_plugin_version: c_int = 1;

/// Most vCPUs (guest threads alive at once) the plugin traces.
const MAX_VCPUS: usize = 4096;
/// Default PT bytes per window before it is cut (bounds memory per thread).
const DEFAULT_CUT: usize = 8 << 20;
/// `-QEMU_ESIGRETURN`: what QEMU returns for rt_sigreturn (the syscall does not return).
const QEMU_ESIGRETURN: i64 = -513;

/// Plugin arguments.
struct Config {
    out: PathBuf,
    oracle: bool,
    cut: usize,
    qemu: Option<String>,
    this: Option<String>,
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
}

/// Window metadata carried with the PT until the window is final.
struct WinMeta {
    w: Window,
    sideband: Vec<u8>,
}

struct Thread {
    /// Unique per thread state of this process image (never 0).
    uid: u64,
    tid: i32,
    pid: i32,
    file: Option<File>,
    file_len: u64,
    path: PathBuf,
    enc: FlowEncoder<WinMeta>,
    /// Bit per block id: its code is in this thread's file already.
    sent: Vec<u64>,
    sideband: Vec<u8>,
    index: u64,
    win_tsc: u64,
    in_syscall: Option<WinMeta>,
    oracle: Option<std::io::BufWriter<File>>,
    written: u64,
    failed: bool,
}

struct Global {
    cfg: Config,
    pid: AtomicI32,
    nonce: AtomicU64,
    start_tsc: AtomicU64,
    info: Mutex<Option<File>>,
    /// Exit code from exit_group (-1 = none seen).
    exit_code: AtomicI32,
    code_map: Mutex<BTreeMap<u64, &'static BlockInfo>>,
    next_id: AtomicU32,
    /// Next `Thread::uid`.
    next_uid: AtomicU64,
    /// Bytes of the longest block translated (how far back an overlap can start).
    longest_block: AtomicU64,
    threads: Box<[AtomicPtr<Thread>]>,
    /// Guest addresses are host addresses (checked on the first translated block).
    identity_mapped: AtomicBool,
    checked_mapping: AtomicBool,
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

fn write_frame(f: &mut File, ty: RecordType, payload: &[u8]) -> std::io::Result<()> {
    match ptt::frame_vec(ty, payload) {
        Some(v) => f.write_all(&v),
        None => Err(std::io::Error::other("record too large")),
    }
}

/// The guest's command line and program from QEMU's own (`qemu -plugin .. -0 argv0 prog
/// args..`, as pttrace and the exec follower start it).
fn guest_cmdline() -> (Vec<u8>, String) {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let mut i = 1;
    let mut argv0: Option<&[u8]> = None;
    while i < args.len() {
        let a = args[i];
        if a == b"-0" {
            argv0 = args.get(i + 1).copied();
            i += 2;
        } else if a.starts_with(b"-") && i + 1 < args.len() {
            i += 2;
        } else {
            break;
        }
    }
    let prog = args.get(i).copied().unwrap_or(b"");
    let mut out = Vec::new();
    out.extend_from_slice(argv0.unwrap_or(prog));
    for a in args.iter().skip(i + 1) {
        if a.is_empty() {
            continue;
        }
        out.push(0);
        out.extend_from_slice(a);
    }
    out.push(0);
    let exe = std::fs::canonicalize(String::from_utf8_lossy(prog).as_ref())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(prog).into_owned());
    (out, exe)
}

/// The 50-byte `Metadata` record of a software backend (layout in `ptt`): the CPU
/// identity of QEMU's x86-64 model (family 6, model 0: no erratum applies), no TSC
/// conversion, backend qemu, the sideband's sample_type.
fn metadata_record() -> [u8; 50] {
    let mut m = [0u8; 50];
    m[0..2].copy_from_slice(&6u16.to_le_bytes());
    m[29] = ptt::BACKEND_QEMU;
    let sample_type: u64 = (1 << 1) | (1 << 2) | (1 << 7) | (1 << 16);
    m[42..50].copy_from_slice(&sample_type.to_le_bytes());
    m
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
        let file = File::create(&path).and_then(|mut f| {
            f.write_all(&ptt::encode_header(FileKind::ProcessInfo))?;
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
            write_frame(&mut f, RecordType::Process, &ptt::process_payload(&rec))?;
            let cfg = format!(
                "PTTRACER_BACKEND=qemu\nPTTRACER_MODE=user\nPTTRACER_WINDOW=thread\nPTTRACER_OUT={}\n",
                self.cfg.out.display()
            );
            write_frame(&mut f, RecordType::Config, cfg.as_bytes())?;
            write_frame(&mut f, RecordType::Metadata, &metadata_record())?;
            let mut clock = [0u8; 16];
            clock[..8].copy_from_slice(&monotonic_ns().to_le_bytes());
            clock[8..].copy_from_slice(&rdtsc().to_le_bytes());
            write_frame(&mut f, RecordType::Clock, &clock)?;
            let (cmdline, exe) = guest_cmdline();
            write_frame(&mut f, RecordType::Cmdline, &cmdline)?;
            write_frame(&mut f, RecordType::Exe, exe.as_bytes())?;
            Ok(f)
        });
        match file {
            Ok(f) => {
                if let Ok(mut g) = self.info.lock() {
                    *g = Some(f);
                }
            }
            Err(e) => say(&format!("cannot create {}: {e}", path.display())),
        }
    }

    fn note(&self, text: &str) {
        if let Ok(mut g) = self.info.lock() {
            if let Some(f) = g.as_mut() {
                let _ = write_frame(f, RecordType::Note, text.as_bytes());
            }
        }
    }

    fn close_info(&self, reason: EndReason, code: i32) {
        if let Ok(mut g) = self.info.lock() {
            if let Some(mut f) = g.take() {
                let mut clock = [0u8; 16];
                clock[..8].copy_from_slice(&monotonic_ns().to_le_bytes());
                clock[8..].copy_from_slice(&rdtsc().to_le_bytes());
                let _ = write_frame(&mut f, RecordType::Clock, &clock);
                let _ = write_frame(
                    &mut f,
                    RecordType::ProcessEnd,
                    &ptt::process_end_payload(reason, code, 0),
                );
            }
        }
    }

    #[inline]
    fn slot(&self, vcpu: c_uint) -> Option<&AtomicPtr<Thread>> {
        self.threads.get(vcpu as usize)
    }

    /// The state of `vcpu`, created on its first block (on its own thread). Mutable from a
    /// shared `Global` because each state belongs to one vCPU thread (see the SAFETY note).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    fn thread(&self, vcpu: c_uint) -> Option<&mut Thread> {
        let slot = self.slot(vcpu)?;
        let mut p = slot.load(Ordering::Relaxed);
        if p.is_null() {
            p = self.create_thread(slot);
        }
        // SAFETY: the pointer came from Box::into_raw and is only used by this vCPU's
        // thread (QEMU runs a vCPU's callbacks on its own thread), or by the atexit
        // callback while every other vCPU is stopped.
        Some(unsafe { &mut *p })
    }

    #[cold]
    #[inline(never)]
    fn create_thread(&self, slot: &AtomicPtr<Thread>) -> *mut Thread {
        let p = Box::into_raw(Box::new(self.new_thread()));
        slot.store(p, Ordering::Relaxed);
        p
    }

    fn new_thread(&self) -> Thread {
        let tid = gettid();
        let pid = self.pid.load(Ordering::Relaxed);
        let nonce = self.nonce.load(Ordering::Relaxed);
        let path = self.cfg.out.join(format!("{pid}-{nonce:08x}-{tid}.ptt"));
        let tsc = rdtsc();
        let file = File::create(&path).and_then(|mut f| {
            f.write_all(&ptt::encode_header(FileKind::Thread))?;
            let h = ptt::ThreadHeader {
                pid,
                tid,
                mode: 0,
                window: 1,
                backend: ptt::BACKEND_QEMU,
                pt_present: true,
                nonce,
                start_tsc: self.start_tsc.load(Ordering::Relaxed),
                pt_absent_reason: String::new(),
            };
            write_frame(
                &mut f,
                RecordType::ThreadHeader,
                &ptt::thread_header_payload(&h),
            )?;
            Ok(f)
        });
        let (file, failed) = match file {
            Ok(f) => (Some(f), false),
            Err(e) => {
                say(&format!("cannot create {}: {e}", path.display()));
                (None, true)
            }
        };
        let oracle = if self.cfg.oracle {
            File::create(path.with_extension("oracle"))
                .ok()
                .map(|f| std::io::BufWriter::with_capacity(1 << 16, f))
        } else {
            None
        };
        let file_len = file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
        Thread {
            uid: self.next_uid.fetch_add(1, Ordering::Relaxed),
            tid,
            pid,
            file,
            file_len,
            path,
            enc: FlowEncoder::new(PSB_PERIOD),
            sent: Vec::new(),
            sideband: Vec::new(),
            index: 0,
            win_tsc: tsc,
            in_syscall: None,
            oracle,
            written: 0,
            failed,
        }
    }
}

impl Thread {
    fn sample(&self) -> SampleId {
        SampleId {
            pid: self.pid as u32,
            tid: self.tid as u32,
            time: rdtsc(),
            cpu: 0,
            id: 0,
        }
    }

    /// The block's code is in this thread's file from now on; true when it was not yet.
    /// (`owner` remembers the last thread that claimed it: a thread that finds itself
    /// there needs no look-up in its own set.)
    #[cold]
    #[inline(never)]
    fn claim(&mut self, b: &BlockInfo) -> bool {
        b.owner.store(self.uid, Ordering::Relaxed);
        self.first_time(b.id)
    }

    #[cold]
    #[inline(never)]
    fn syscall_without_return(&mut self) {
        if let Some(mut meta) = self.in_syscall.take() {
            // The syscall did not return through QEMU's syscall-return hook.
            meta.w.flags |= ptt::WF_NO_RETURN;
            self.enc.end_window(meta);
            self.drain();
        }
    }

    /// A block this thread executes for the first time: its code goes into the window's
    /// sideband; code that replaces other code executed before cuts the window first.
    #[cold]
    #[inline(never)]
    fn first_execution(&mut self, b: &BlockInfo, tsc: &mut dyn FnMut() -> u64) {
        let cut_first = b.replaces && self.enc.in_window();
        if self.enc.block(&b.block, tsc).is_err() {
            return;
        }
        if cut_first {
            // New code at addresses executed before: only the next window sees it.
            let meta = self.no_syscall_meta();
            let _ = self.enc.cut(meta, tsc);
            self.drain();
        }
        let s = self.sample();
        if push_code_record(&mut self.sideband, b.block.start, &b.code, &s).is_none() {
            say("block larger than a code record; its code is missing from the trace");
        }
    }

    #[cold]
    #[inline(never)]
    fn record_oracle(&mut self, b: &BlockInfo, first: bool) {
        let Some(o) = self.oracle.as_mut() else {
            return;
        };
        if first {
            let _ = o.write_all(&((1u64 << 63) | b.lens.len() as u64).to_le_bytes());
            let mut ip = b.block.start;
            for l in b.lens.iter() {
                let _ = o.write_all(&ip.to_le_bytes());
                ip += u64::from(*l);
            }
        }
        let _ = o.write_all(&b.block.start.to_le_bytes());
    }

    /// The window's PT reached the cut size: end it between two blocks.
    #[cold]
    #[inline(never)]
    fn cut(&mut self, tsc: &mut dyn FnMut() -> u64) {
        let meta = self.no_syscall_meta();
        let _ = self.enc.cut(meta, tsc);
        self.drain();
    }

    /// Marks block `id` as sent; true when it was not yet.
    #[inline]
    fn first_time(&mut self, id: u32) -> bool {
        let (w, bit) = ((id >> 6) as usize, 1u64 << (id & 63));
        match self.sent.get_mut(w) {
            Some(word) if *word & bit != 0 => false,
            Some(word) => {
                *word |= bit;
                true
            }
            None => self.grow_sent(w, bit),
        }
    }

    #[cold]
    #[inline(never)]
    fn grow_sent(&mut self, w: usize, bit: u64) -> bool {
        self.sent.resize(w + 1024, 0);
        self.sent[w] |= bit;
        true
    }

    fn no_syscall_meta(&mut self) -> WinMeta {
        let w = Window {
            index: self.index,
            nr: u64::MAX,
            tsc_start: self.win_tsc,
            tsc_end: rdtsc(),
            flags: ptt::WF_NO_SYSCALL,
            ..Window::default()
        };
        self.index += 1;
        self.win_tsc = w.tsc_end;
        WinMeta {
            w,
            sideband: std::mem::take(&mut self.sideband),
        }
    }

    /// Writes every window whose PT is final.
    fn drain(&mut self) {
        while let Some((meta, pt)) = self.enc.ready() {
            self.write_window(&meta, &pt);
            self.enc.recycle(pt);
        }
    }

    /// Appends one `Window` frame, written in place from the PT and sideband buffers.
    fn write_window(&mut self, meta: &WinMeta, pt: &[u8]) {
        if self.failed {
            return;
        }
        let Some(f) = self.file.as_mut() else {
            return;
        };
        let payload = ptt::WINDOW_FIXED_SIZE + pt.len() + meta.sideband.len();
        let (Ok(plen), Ok(pt_len), Ok(sb_len)) = (
            u32::try_from(payload),
            u32::try_from(pt.len()),
            u32::try_from(meta.sideband.len()),
        ) else {
            say(&format!(
                "{}: window {} is too large for one record; dropped",
                self.path.display(),
                meta.w.index
            ));
            return;
        };
        let w = &meta.w;
        let mut head = Vec::with_capacity(8 + ptt::WINDOW_FIXED_SIZE);
        head.extend_from_slice(&plen.to_le_bytes());
        head.extend_from_slice(&(RecordType::Window as u16).to_le_bytes());
        head.extend_from_slice(&0u16.to_le_bytes());
        for v in [w.index, w.nr].into_iter().chain(w.args) {
            head.extend_from_slice(&v.to_le_bytes());
        }
        head.extend_from_slice(&w.ret.to_le_bytes());
        head.extend_from_slice(&w.tsc_start.to_le_bytes());
        head.extend_from_slice(&w.tsc_end.to_le_bytes());
        for v in [w.flags, w.depth, pt_len, sb_len] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        let mut crc = ptt::Crc32::new();
        crc.update(&head);
        crc.update(pt);
        crc.update(&meta.sideband);
        let crc = crc.finish().to_le_bytes();
        let parts: [&[u8]; 4] = [&head, pt, &meta.sideband, &crc];
        match write_all_at(f, &parts, self.file_len) {
            Ok(n) => {
                self.file_len += n;
                self.written += 1;
            }
            Err(e) => {
                // Keep what is already written whole: cut a partial frame off.
                let _ = f.set_len(self.file_len);
                self.failed = true;
                say(&format!(
                    "writing {} failed at window {}: {e}; the {} windows before it are kept, later ones are lost",
                    self.path.display(),
                    meta.w.index,
                    self.written
                ));
            }
        }
    }

    /// Ends the thread's file (`reason`); the thread makes no more windows.
    fn finish(&mut self, reason: EndReason) {
        if let Some(mut meta) = self.in_syscall.take() {
            meta.w.flags |= ptt::WF_NO_RETURN;
            self.enc.end_window(meta);
        } else if self.enc.in_window() {
            let _ = self.enc.far_transfer();
            let meta = self.no_syscall_meta();
            self.enc.end_window(meta);
        }
        self.enc.finish();
        self.drain();
        if let Some(f) = self.file.as_mut() {
            if !self.failed {
                let payload = ptt::end_payload(reason, self.written, 0);
                if let Some(v) = ptt::frame_vec(RecordType::End, &payload) {
                    if f.write_all_at(&v, self.file_len).is_ok() {
                        self.file_len += v.len() as u64;
                    }
                }
            }
        }
        self.file = None;
        if let Some(o) = self.oracle.as_mut() {
            let _ = o.flush();
        }
        self.oracle = None;
    }
}

/// Writes `parts` one after the other at `offset` (pwritev, resumed after short writes);
/// returns the bytes written.
fn write_all_at(f: &File, parts: &[&[u8]], offset: u64) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0usize;
    while done < total {
        let mut skip = done;
        let mut iov = Vec::with_capacity(parts.len());
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            iov.push(libc::iovec {
                iov_base: p[skip..].as_ptr() as *mut c_void,
                iov_len: p.len() - skip,
            });
            skip = 0;
        }
        // SAFETY: every iovec points into a live slice of `parts` for its length.
        let n = unsafe {
            libc::pwritev(
                f.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as c_int,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        done += n as usize;
    }
    Ok(total as u64)
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
                kind = BlockEnd::from_flow(c.flow, ip);
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
    }
    let mut code = Vec::with_capacity(n * 4);
    let mut lens = Vec::with_capacity(insns.len());
    for (_, bytes) in &insns {
        code.extend_from_slice(bytes);
        lens.push(bytes.len() as u8);
    }
    let end = start + code.len() as u64;
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
            block: Block::new(start, end, kind),
            code: code.into_boxed_slice(),
            lens: lens.into_boxed_slice(),
            replaces,
            owner: AtomicU64::new(0),
        }));
        map.insert(start, info);
        info
    };
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

extern "C" fn on_exec(vcpu: c_uint, udata: *mut c_void) {
    guarded(|| {
        // SAFETY: udata is the leaked `BlockInfo` registered with this callback.
        let b = unsafe { &*(udata as *const BlockInfo) };
        exec_block(vcpu, b);
    });
}

#[inline]
fn exec_block(vcpu: c_uint, b: &BlockInfo) {
    let Some(g) = global() else { return };
    let Some(t) = g.thread(vcpu) else { return };
    if t.in_syscall.is_some() {
        t.syscall_without_return();
    }
    // Fast path: the block was last claimed by this thread, so its code is in the file.
    let first = b.owner.load(Ordering::Relaxed) != t.uid && t.claim(b);
    let mut tsc = rdtsc;
    if first {
        t.first_execution(b, &mut tsc);
    } else if t.enc.block(&b.block, &mut tsc).is_err() {
        return;
    }
    if t.oracle.is_some() {
        t.record_oracle(b, first);
    }
    if t.enc.window_len() > g.cfg.cut {
        t.cut(&mut tsc);
    }
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
        let Some(t) = g.thread(vcpu) else { return };
        if let Some(mut meta) = t.in_syscall.take() {
            meta.w.flags |= ptt::WF_NO_RETURN;
            t.enc.end_window(meta);
        }
        let _ = t.enc.far_transfer();
        let now = rdtsc();
        let meta = WinMeta {
            w: Window {
                index: t.index,
                nr: num as u64,
                args: [a1, a2, a3, a4, a5, a6],
                ret: 0,
                tsc_start: t.win_tsc,
                tsc_end: now,
                flags: 0,
                depth: 0,
            },
            sideband: std::mem::take(&mut t.sideband),
        };
        t.index += 1;
        t.in_syscall = Some(meta);
        match num {
            libc::SYS_exit_group => {
                g.exit_code.store(a1 as i32, Ordering::Relaxed);
            }
            libc::SYS_execve | libc::SYS_execveat => exec::follow(g, t, num, [a1, a2, a3, a4, a5]),
            _ => {}
        }
    });
}

extern "C" fn on_syscall_ret(_id: api::PluginId, vcpu: c_uint, num: i64, ret: i64) {
    guarded(|| {
        let Some(g) = global() else { return };
        let Some(t) = g.thread(vcpu) else { return };
        let is_fork = matches!(
            num,
            libc::SYS_clone | libc::SYS_fork | libc::SYS_vfork | libc::SYS_clone3
        );
        if is_fork && ret == 0 && getpid() != t.pid {
            become_fork_child(g, vcpu);
            return;
        }
        let Some(mut meta) = t.in_syscall.take() else {
            return;
        };
        meta.w.ret = ret;
        if ret == QEMU_ESIGRETURN {
            meta.w.flags |= ptt::WF_NO_RETURN;
        }
        t.enc.end_window(meta);
        t.drain();
        t.win_tsc = rdtsc();
    });
}

/// Drops a thread state copied from the parent by fork without flushing anything of the
/// parent's into the files (the oracle buffer holds the parent's bytes: leaked unflushed).
fn discard_copy(p: *mut Thread) -> Option<WinMeta> {
    if p.is_null() {
        return None;
    }
    // SAFETY: only the forking thread exists in the child; the state was created by
    // Box::into_raw and its slot was cleared before this call.
    let mut t = unsafe { Box::from_raw(p) };
    if let Some(o) = t.oracle.take() {
        std::mem::forget(o);
    }
    t.in_syscall.take()
}

/// In the child of a fork: a new process image with new files; the copies of the parent's
/// threads are dropped (they do not exist here) and this thread starts afresh, its first
/// window being the child's side of the fork (no PT: the parent's file has that code).
fn become_fork_child(g: &Global, vcpu: c_uint) {
    let parent = g.pid.load(Ordering::Relaxed);
    if let Ok(mut info) = g.info.lock() {
        *info = None; // our copy of the parent's descriptor
    }
    let mut fork_window = None;
    for (i, slot) in g.threads.iter().enumerate() {
        let meta = discard_copy(slot.swap(std::ptr::null_mut(), Ordering::Relaxed));
        if i == vcpu as usize {
            fork_window = meta;
        }
    }
    g.open_info(parent);
    let Some(t) = g.thread(vcpu) else { return };
    if let Some(mut meta) = fork_window {
        meta.w.index = 0;
        meta.w.ret = 0;
        meta.w.flags |= ptt::WF_FORK_CHILD;
        meta.sideband.clear();
        t.index = 1;
        t.write_window(&meta, &[]);
    }
    t.win_tsc = rdtsc();
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
        let mut t = unsafe { Box::from_raw(p) };
        t.finish(EndReason::ThreadExit);
    });
}

extern "C" fn on_atexit(_id: api::PluginId, _udata: *mut c_void) {
    guarded(|| {
        let Some(g) = global() else { return };
        let code = g.exit_code.load(Ordering::Relaxed);
        let reason = if code >= 0 && code != i32::MIN {
            EndReason::ExitGroup
        } else {
            EndReason::Signal
        };
        for slot in g.threads.iter() {
            let p = slot.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: every other vCPU is stopped while atexit callbacks run.
                let mut t = unsafe { Box::from_raw(p) };
                t.finish(reason);
            }
        }
        g.close_info(reason, if code == i32::MIN { 0 } else { code });
    });
}

fn parse_args(argc: c_int, argv: *const *const c_char) -> Result<Config, String> {
    let mut cfg = Config {
        out: PathBuf::new(),
        oracle: false,
        cut: DEFAULT_CUT,
        qemu: None,
        this: None,
    };
    for i in 0..argc.max(0) as usize {
        // SAFETY: QEMU passes argc valid NUL-terminated strings.
        let arg = unsafe { CStr::from_ptr(*argv.add(i)) }.to_string_lossy();
        let (k, v) = arg.split_once('=').unwrap_or((&arg, ""));
        match k {
            "out" => cfg.out = PathBuf::from(v),
            "oracle" => cfg.oracle = matches!(v, "on" | "true" | "1" | "yes"),
            "cut" => {
                cfg.cut = v
                    .parse()
                    .map_err(|_| format!("cut={v}: not a number of bytes"))?
            }
            "qemu" => cfg.qemu = Some(v.to_string()),
            "self" => cfg.this = Some(v.to_string()),
            _ => {
                return Err(format!(
                    "unknown argument {arg:?} (out=, oracle=, cut=, qemu=, self=)"
                ))
            }
        }
    }
    if cfg.out.as_os_str().is_empty() {
        return Err("missing out=DIR (the trace directory)".into());
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
        let cfg = match parse_args(argc, argv) {
            Ok(c) => c,
            Err(e) => {
                say(&e);
                return -1;
            }
        };
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
            exit_code: AtomicI32::new(i32::MIN),
            code_map: Mutex::new(BTreeMap::new()),
            next_id: AtomicU32::new(0),
            longest_block: AtomicU64::new(0),
            next_uid: AtomicU64::new(1),
            threads: (0..MAX_VCPUS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            identity_mapped: AtomicBool::new(false),
            checked_mapping: AtomicBool::new(false),
        };
        if GLOBAL.set(g).is_err() {
            return -1;
        }
        let Some(g) = global() else { return -1 };
        // SAFETY: getppid cannot fail.
        g.open_info(unsafe { libc::getppid() });
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
