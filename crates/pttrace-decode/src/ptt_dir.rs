//! Decoding a whole LD_PRELOAD shim output directory (`pttrace run --out DIR`, used by
//! `pttrace decode DIR`): every process info file and per-thread `.ptt` file (format in
//! [`pttrace_format::ptt`]), thread by thread, window by window, with symbols. (Single
//! thread files with explicit options: [`super::ptt_input`], `pttrace decode --ptt`.)
//!
//! For each thread file the image is assembled from its process image's info file: the
//! executable mappings of `/proc/self/maps` when tracing began (files read from this
//! machine's file system, or under a sysroot), the saved vDSO bytes at their address, and
//! the CPU from the metadata record. Windows are decoded in order; a window's sideband
//! (MMAP2 records of the mappings that existed when it was written, see
//! the shim's `userpt`) is applied to the image before that window and stays for the
//! following ones. Windows without PT are reported with their flags, not decoded.

use std::path::{Path, PathBuf};

use super::sideband::{parse_window_sideband, ImageChange, ImageResolver};
use super::{AddressSpace, DecodeError, PtDecoder, TraceParams, WindowOptions};
use pttrace_format::maps::MapsEntry;
use pttrace_format::metadata::PtMetadata;
use pttrace_format::perf_record::SIDEBAND_SAMPLE_TYPE;
use pttrace_format::ptt::{self, FileKind, RecordType, Tail, ThreadHeader};

/// One process image's info file.
#[derive(Debug, Clone)]
pub struct PttProcess {
    pub path: PathBuf,
    pub pid: i32,
    pub nonce: u64,
    /// Mappings (`/proc/self/maps`) when tracing began.
    pub maps: Vec<MapsEntry>,
    pub vdso: Option<(u64, Vec<u8>)>,
    pub metadata: Option<PtMetadata>,
    /// Command line, arguments separated by spaces.
    pub cmdline: String,
}

/// One per-thread file.
#[derive(Debug, Clone)]
pub struct PttThread {
    pub path: PathBuf,
    pub header: ThreadHeader,
}

/// A shim output: its process images and thread files.
#[derive(Debug, Clone, Default)]
pub struct PttTrace {
    pub processes: Vec<PttProcess>,
    pub threads: Vec<PttThread>,
    /// Prefix for mapped file paths (default: this machine's root).
    pub sysroot: Option<PathBuf>,
    /// Decode every window with caches of its own instead of handing them from window to
    /// window (slower; the records are the same, see [`crate::DecoderCaches`]).
    pub private_caches: bool,
    /// Which decoder decodes the windows (the fast one by default; same records).
    pub decoder: crate::DecoderKind,
    /// Resynchronize after a decode error at the next packet that gives an IP
    /// ([`WindowOptions::resync_on_error`]).
    pub resync_on_error: bool,
    /// Report changes of the interrupt flag ([`WindowOptions::iflags_events`]).
    pub iflags_events: bool,
    /// Files of a directory that could not be used at all (an unreadable info file, a
    /// thread file without a readable header), left out: the directory's damage check
    /// names them; a single thread file given alone fails instead.
    pub skipped: Vec<DecodeError>,
}

/// What a decoded window was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PttWindowInfo {
    pub pid: i32,
    pub tid: i32,
    pub index: u64,
    /// Syscall that ended the window (thread windows) or the window's syscall.
    pub nr: u64,
    pub ret: i64,
    pub flags: u32,
    pub pt_len: usize,
    pub sideband_len: usize,
    /// The window's loads and stores in execution order (QEMU backend with `--memory`;
    /// empty otherwise), still packed.
    pub memory: pttrace_format::memory::Packed,
}

impl PttWindowInfo {
    /// The syscall's name, or its number.
    pub fn syscall_name(&self) -> String {
        pttrace_format::sysnames::name(self.nr)
            .map(str::to_string)
            .unwrap_or_else(|| format!("syscall {}", self.nr))
    }

    /// Names of the set window flags.
    pub fn flag_names(&self) -> Vec<&'static str> {
        let names = [
            (ptt::WF_NO_RETURN, "no-return"),
            (ptt::WF_PT_LOST, "pt-lost"),
            (ptt::WF_PT_OVERFLOW, "pt-overflow"),
            (ptt::WF_SIDEBAND_LOST, "sideband-lost"),
            (ptt::WF_PT_ABSENT, "pt-absent"),
            (ptt::WF_NESTED, "nested"),
            (ptt::WF_CAPTURE_ERROR, "capture-error"),
            (ptt::WF_PT_DROPPED, "pt-dropped"),
            (ptt::WF_VFORK_CHILD, "vfork-child"),
            (ptt::WF_FORK_CHILD, "fork-child"),
            (ptt::WF_NO_SYSCALL, "no-syscall"),
            (ptt::WF_RECOVERED, "recovered"),
            (ptt::WF_SNAPSHOT_CUT, "snapshot-cut"),
        ];
        names
            .iter()
            .filter(|(f, _)| self.flags & f != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// The starting point of a thread's decode (see [`PttTrace::thread_image`]).
pub struct ThreadImage {
    pub params: TraceParams,
    pub space: AddressSpace,
    pub resolver: ImageResolver,
    /// Image problems met while building it (files that could not be opened...).
    pub warnings: Vec<String>,
}

/// How a thread file ended and what was skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadStats {
    pub windows: u64,
    pub windows_with_pt: u64,
    /// Windows dropped by the shim (`Dropped` records).
    pub dropped: u64,
    /// The file's tail was truncated or corrupt (description).
    pub bad_tail: Option<String>,
    /// Damage in the file's own frames (see [`crate::ptt_input::ThreadInput::tail`]).
    pub tail: Tail,
    /// What the thread's spool gave (windows written after the process died).
    pub recovered: Option<pttrace_format::spool::Recovered>,
    /// Image problems (files that could not be opened...).
    pub warnings: Vec<String>,
    /// The file has the thread's `End` record (it exited, or its process did, or exec'd);
    /// without one the thread was killed or is still running, and what it ran after its
    /// last window is not in the file.
    pub ended: bool,
}

fn err(path: &Path, offset: u64, msg: impl Into<String>) -> DecodeError {
    DecodeError::new(path.display(), offset, msg)
}

fn read(path: &Path) -> Result<Vec<u8>, DecodeError> {
    std::fs::read(path).map_err(|e| err(path, crate::WHOLE_INPUT, format!("cannot read: {e}")))
}

fn parse_process(path: &Path) -> Result<PttProcess, DecodeError> {
    let data = read(path)?;
    let name = path.display().to_string();
    let f = ptt::parse(&name, &data).map_err(|e| err(path, 0, e.to_string()))?;
    if f.kind != FileKind::ProcessInfo {
        return Err(err(path, 12, "not a process info file"));
    }
    let mut p = PttProcess {
        path: path.to_path_buf(),
        pid: 0,
        nonce: 0,
        maps: Vec::new(),
        vdso: None,
        metadata: None,
        cmdline: String::new(),
    };
    for fr in &f.frames {
        match RecordType::from_raw(fr.ty) {
            Some(RecordType::Process) => {
                let r = ptt::decode_process(fr.payload)
                    .ok_or_else(|| err(path, fr.offset as u64, "malformed Process record"))?;
                p.pid = r.pid;
                p.nonce = r.nonce;
            }
            Some(RecordType::Maps) => {
                let text = String::from_utf8_lossy(fr.payload);
                p.maps = text.lines().filter_map(MapsEntry::parse).collect();
            }
            Some(RecordType::Vdso) => {
                if let Some((addr, bytes)) = ptt::decode_vdso(fr.payload) {
                    if !bytes.is_empty() {
                        p.vdso = Some((addr, bytes.to_vec()));
                    }
                }
            }
            Some(RecordType::Metadata) => {
                p.metadata = PtMetadata::from_bytes(fr.payload.get(..18).unwrap_or(&[]))
            }
            Some(RecordType::Cmdline) => {
                p.cmdline = fr
                    .payload
                    .split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ");
            }
            _ => {}
        }
    }
    Ok(p)
}

fn thread_header(path: &Path) -> Result<ThreadHeader, DecodeError> {
    if let Some(h) = first_frame_header(path) {
        return Ok(h);
    }
    // (No whole header frame at the start: a file the spool completes or replaces, or
    // damage, which reading it whole reports.)
    crate::ptt_input::read_thread(path)?
        .header
        .ok_or_else(|| err(path, 16, "no ThreadHeader record at the start"))
}

/// The `ThreadHeader` of thread file `path` when it is the file's first frame, whole and
/// checked, read from the file's first bytes alone (a thread file can be hundreds of MB).
fn first_frame_header(path: &Path) -> Option<ThreadHeader> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    let f = ptt::parse(&path.display().to_string(), &head).ok()?;
    let fr = f.frames.first().filter(|_| f.kind == FileKind::Thread)?;
    (RecordType::from_raw(fr.ty) == Some(RecordType::ThreadHeader))
        .then(|| ptt::decode_thread_header(fr.payload))
        .flatten()
}

/// Calls `f` with each code record (the bytes of code a software backend executed, see
/// [`pttrace_format::code`]) of the thread file at `path`, in file order, until `f` breaks.
/// For names of code whose bytes tell what it is (a copy of a mapped file's code).
pub fn for_each_code_record(
    path: &Path,
    f: &mut dyn FnMut(u64, &[u8]) -> std::ops::ControlFlow<()>,
) -> Result<(), DecodeError> {
    use pttrace_format::perf_record::{Record as PerfRecord, RecordIter};
    // Mapped, not read: a thread file can be hundreds of MB, nearly all PT.
    let file = crate::image::Backing::map_file(path)?;
    let pf = ptt::parse(&path.display().to_string(), file.bytes())
        .map_err(|e| err(path, 0, e.to_string()))?;
    for fr in &pf.frames {
        if RecordType::from_raw(fr.ty) != Some(RecordType::Window) {
            continue;
        }
        let wr = ptt::decode_window(fr.payload)
            .ok_or_else(|| err(path, fr.offset as u64, "malformed Window record"))?;
        for item in RecordIter::new(wr.sideband, SIDEBAND_SAMPLE_TYPE) {
            let Ok((_, rec)) = item else {
                break;
            };
            if let PerfRecord::TextPoke { addr, bytes } = rec.record {
                if f(addr, &bytes).is_break() {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// Whether `path` looks like a shim output (a directory with `.info` files or a `.ptt`).
pub fn is_ptt_input(path: &Path) -> bool {
    if path.is_dir() {
        return std::fs::read_dir(path).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "info"))
        });
    }
    path.extension().is_some_and(|x| x == "ptt")
}

/// Opens a shim output directory, or one `.ptt` thread file (its info file is looked up
/// beside it).
pub fn open(path: &Path) -> Result<PttTrace, DecodeError> {
    if let Err(e) = std::fs::metadata(path) {
        return Err(err(path, crate::WHOLE_INPUT, format!("cannot open: {e}")));
    }
    let (dir, only) = if path.is_dir() {
        (path.to_path_buf(), None)
    } else {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        // (As the directory lists it: a name without a directory is `./NAME` there.)
        let only = path.file_name().map_or(path.to_path_buf(), |n| dir.join(n));
        (dir, Some(only))
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| err(&dir, 0, format!("cannot list the directory: {e}")))?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut t = PttTrace::default();
    for e in &entries {
        if e.extension().is_some_and(|x| x == "info") {
            match parse_process(e) {
                Ok(p) => t.processes.push(p),
                Err(err) if only.is_none() => t.skipped.push(err),
                Err(err) => return Err(err),
            }
        }
    }
    for e in pttrace_format::spool::thread_files(&entries) {
        if only.as_ref().is_none_or(|o| *o == e) {
            match thread_header(&e) {
                Ok(header) => t.threads.push(PttThread { header, path: e }),
                Err(err) if only.is_none() => t.skipped.push(err),
                Err(err) => return Err(err),
            }
        }
    }
    if t.threads.is_empty() && t.skipped.is_empty() {
        return Err(err(
            path,
            crate::WHOLE_INPUT,
            "no per-thread .ptt files (is this a `pttrace run --out` directory?)",
        ));
    }
    // Processes in the order they started (the program run first, whatever the pids,
    // which wrap around), the images of a process in the order they started (an
    // `execve` chain in its order; the image ids are random), the threads of an image in
    // the order they started (its main thread first).
    let mut image_start = std::collections::HashMap::<(i32, u64), u64>::new();
    let mut pid_start = std::collections::HashMap::<i32, u64>::new();
    for th in &t.threads {
        let h = &th.header;
        let s = image_start.entry((h.pid, h.nonce)).or_insert(u64::MAX);
        *s = (*s).min(h.start_tsc);
        let s = pid_start.entry(h.pid).or_insert(u64::MAX);
        *s = (*s).min(h.start_tsc);
    }
    let order = |pid: i32, nonce: u64| {
        (
            pid_start.get(&pid).copied().unwrap_or(u64::MAX),
            pid,
            image_start.get(&(pid, nonce)).copied().unwrap_or(u64::MAX),
            nonce,
        )
    };
    t.threads.sort_by_key(|th| {
        let h = &th.header;
        (order(h.pid, h.nonce), h.start_tsc, h.tid)
    });
    t.processes.sort_by_key(|p| order(p.pid, p.nonce));
    Ok(t)
}

/// Decoder caches one thread's decoding left, with the image they were last valid for,
/// for the next thread of the same code ([`PttTrace::decode_thread_carrying`]).
#[derive(Default)]
pub struct CarriedCaches {
    left: Option<(AddressSpace, crate::DecoderCaches)>,
    taken: u32,
}

impl CarriedCaches {
    /// Threads that started from caches another one left.
    pub fn taken(&self) -> u32 {
        self.taken
    }
}

/// Receives each window of a thread and, when it has PT, its decoder.
pub type WindowSink<'f> =
    dyn FnMut(&PttWindowInfo, Option<&mut PtDecoder<'_>>) -> Result<(), DecodeError> + 'f;

/// Turns a window and, when it has PT, its decoder into a value (on a worker of
/// [`PttTrace::decode_thread_parallel`]).
pub type WindowWork<'f, R> =
    dyn Fn(&PttWindowInfo, Option<&mut PtDecoder<'_>>) -> Result<R, DecodeError> + Sync + 'f;

/// Receives each window of a thread and, when it has PT, how the two decoders compared.
pub type CheckSink<'f> = dyn FnMut(
        &PttWindowInfo,
        Option<Result<crate::check::Agreement, Box<crate::check::Difference>>>,
    ) -> Result<(), DecodeError>
    + 'f;

/// Receives each window of a thread and, when it has PT, what decoding it takes.
type InputSink<'f> =
    dyn FnMut(&PttWindowInfo, Option<WindowInput<'_>>) -> Result<(), DecodeError> + 'f;

/// What decoding one window takes (the image as the window starts).
struct WindowInput<'d> {
    pt: &'d [u8],
    params: TraceParams,
    space: &'d AddressSpace,
    resolver: &'d ImageResolver,
    opts: WindowOptions,
}

impl<'d> WindowInput<'d> {
    fn decoder(&self, kind: crate::DecoderKind) -> Result<PtDecoder<'d>, DecodeError> {
        PtDecoder::new(
            self.pt,
            self.params,
            self.space.clone(),
            Vec::new(),
            self.resolver.clone(),
            WindowOptions {
                decoder: kind,
                ..self.opts.clone()
            },
        )
    }
}

impl PttProcess {
    /// The files mapped when tracing began, once each: (address of the file's offset-0
    /// mapping, the file under `sysroot`, the path as mapped).
    pub fn mapped_files(&self, sysroot: Option<&Path>) -> Vec<(u64, PathBuf, &str)> {
        let mut out: Vec<(u64, PathBuf, &str)> = Vec::new();
        for m in &self.maps {
            if m.offset != 0 || !m.path.starts_with('/') || out.iter().any(|f| f.2 == m.path) {
                continue;
            }
            let file = match sysroot {
                Some(r) => r.join(m.path.trim_start_matches('/')),
                None => PathBuf::from(&m.path),
            };
            out.push((m.start, file, &m.path));
        }
        out
    }

    /// Symbols of the ELF files mapped when tracing began (each at its load bias: the
    /// address of its offset-0 mapping minus its lowest PT_LOAD address), plus the vDSO's.
    pub fn symbols(&self, sysroot: Option<&Path>) -> super::Symbols {
        use object::{Object, ObjectSegment};
        let mut syms = super::Symbols::new();
        for (start, file, _) in self.mapped_files(sysroot) {
            let Ok(map) = crate::image::Backing::map_file(&file) else {
                continue;
            };
            let data = map.bytes();
            let Ok(obj) = object::File::parse(data) else {
                continue;
            };
            let low = obj.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
            let _ = syms.add_elf(&file, data, start.wrapping_sub(low));
        }
        if let Some((addr, bytes)) = &self.vdso {
            let _ = syms.add_elf(Path::new("[vdso]"), bytes, *addr);
        }
        syms.finish();
        syms
    }
}

impl PttTrace {
    /// The info file of `th`'s process image.
    pub fn process_of(&self, th: &PttThread) -> Option<&PttProcess> {
        self.processes
            .iter()
            .find(|p| p.pid == th.header.pid && p.nonce == th.header.nonce)
    }

    /// The thread files of `th`'s process image (its own included), in the trace's order.
    pub fn image_files(&self, th: &PttThread) -> Vec<PathBuf> {
        let (pid, nonce) = (th.header.pid, th.header.nonce);
        self.threads
            .iter()
            .filter(|t| t.header.pid == pid && t.header.nonce == nonce)
            .map(|t| t.path.clone())
            .collect()
    }

    /// What decoding `th` starts from: the parameters of its process image, and its image
    /// when tracing began (the executable file mappings and the vDSO of the info file).
    pub fn thread_image(&self, th: &PttThread) -> ThreadImage {
        let proc_ = self.process_of(th);
        let params = proc_
            .and_then(|p| p.metadata.as_ref())
            .map(TraceParams::from_pt_metadata)
            .unwrap_or_default();
        // No time conversion: window sideband is applied per window, not by time.
        let params = TraceParams {
            time: None,
            ..params
        };
        let vdso = proc_.and_then(|p| p.vdso.clone());
        let mut resolver =
            ImageResolver::new(self.sysroot.clone(), vdso.as_ref().map(|v| v.1.clone()));
        let mut space = AddressSpace::new();
        let mut warnings = Vec::new();
        if let Some(p) = proc_ {
            for m in p.maps.iter().filter(|m| m.exec) {
                let change = ImageChange::Map {
                    addr: m.start,
                    len: m.end.saturating_sub(m.start),
                    pgoff: m.offset,
                    filename: m.path.clone(),
                };
                if let Some(w) = resolver.apply(&mut space, &change) {
                    warnings.push(w);
                }
            }
        }
        if let Some((addr, bytes)) = &vdso {
            space.add_bytes("[vdso]", bytes.clone(), *addr);
        }
        ThreadImage {
            params,
            space,
            resolver,
            warnings,
        }
    }

    /// Decodes every window of `th` in order. `f` gets each window and, when it has PT, a
    /// decoder (an iterator over its records) to consume.
    pub fn decode_thread(
        &self,
        th: &PttThread,
        f: &mut WindowSink<'_>,
    ) -> Result<ThreadStats, DecodeError> {
        self.decode_thread_carrying(th, &mut CarriedCaches::default(), f)
    }

    /// [`Self::decode_thread`] starting from the caches another thread left in `carried`
    /// when its last image holds the same code as this thread's first window
    /// ([`AddressSpace::same_code`]: the same program run again, placed alike), and
    /// leaving this thread's there: its first windows then need not decode that code
    /// again. The records are the same either way.
    pub fn decode_thread_carrying(
        &self,
        th: &PttThread,
        carried: &mut CarriedCaches,
        f: &mut WindowSink<'_>,
    ) -> Result<ThreadStats, DecodeError> {
        let mut caches = self.new_caches();
        let mut from = carried.left.take();
        // (The last window's image, copied once the thread is done.)
        let mut left: Option<std::rc::Rc<crate::ipt::SharedImage>> = None;
        let stats = self.walk_thread(th, &mut |info, input| {
            let Some(w) = input else {
                return f(info, None);
            };
            if let Some((space, mut c)) = from.take() {
                if !self.private_caches && space.same_code(w.space) {
                    c.carry(space.generation(), w.space.generation());
                    caches = c;
                    carried.taken += 1;
                }
            }
            let mut dec = w
                .decoder(self.decoder)?
                .with_caches(std::mem::take(&mut caches));
            f(info, Some(&mut dec))?;
            caches = self.next_caches(&mut dec);
            left = Some(dec.image());
            Ok(())
        })?;
        carried.left = left
            .and_then(|s| s.space.try_borrow().ok().map(|s| s.clone()))
            .map(|s| (s, caches));
        Ok(stats)
    }

    /// Decodes the windows of `th` on `jobs` threads of their own while this thread reads
    /// the file and keeps the image up to date. Each worker keeps decoder caches of its
    /// own from window to window (the records are the same, see
    /// [`crate::DecoderCaches`]). `work` turns a window and, when it has PT, its decoder
    /// into a value on a worker; `merge` gets the values here, in window order, as they
    /// come (so that only the windows decoded ahead of the next one in order wait).
    pub fn decode_thread_parallel<R: Send>(
        &self,
        th: &PttThread,
        jobs: usize,
        work: &WindowWork<'_, R>,
        merge: &mut dyn FnMut(PttWindowInfo, R) -> Result<(), DecodeError>,
    ) -> Result<ThreadStats, DecodeError> {
        use std::sync::mpsc;
        /// A window with what decoding it takes, owned (its PT bytes copied).
        struct Job {
            seq: u64,
            info: PttWindowInfo,
            input: Option<(
                Vec<u8>,
                TraceParams,
                AddressSpace,
                ImageResolver,
                WindowOptions,
            )>,
        }
        type Done<R> = (u64, PttWindowInfo, Result<R, DecodeError>);
        let jobs = jobs.max(1);
        let (job_tx, job_rx) = mpsc::sync_channel::<Job>(2 * jobs);
        let job_rx = std::sync::Mutex::new(job_rx);
        let (done_tx, done_rx) = mpsc::channel::<Done<R>>();
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                let (job_rx, done_tx) = (&job_rx, done_tx.clone());
                scope.spawn(move || {
                    let mut caches = self.new_caches();
                    loop {
                        let next = match job_rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = next else { return };
                        let r = match job.input {
                            None => work(&job.info, None),
                            Some((pt, params, space, resolver, opts)) => {
                                match PtDecoder::new(&pt, params, space, Vec::new(), resolver, opts)
                                {
                                    Ok(dec) => {
                                        let mut dec = dec.with_caches(std::mem::take(&mut caches));
                                        let r = work(&job.info, Some(&mut dec));
                                        caches = self.next_caches(&mut dec);
                                        r
                                    }
                                    Err(e) => Err(e),
                                }
                            }
                        };
                        if done_tx.send((job.seq, job.info, r)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(done_tx);
            let mut waiting: std::collections::BTreeMap<
                u64,
                (PttWindowInfo, Result<R, DecodeError>),
            > = Default::default();
            let mut next_seq = 0u64;
            let mut take = |waiting: &mut std::collections::BTreeMap<_, _>,
                            done: Done<R>|
             -> Result<(), DecodeError> {
                waiting.insert(done.0, (done.1, done.2));
                while let Some((info, r)) = waiting.remove(&next_seq) {
                    next_seq += 1;
                    merge(info, r?)?;
                }
                Ok(())
            };
            let mut seq = 0u64;
            let walked = self.walk_thread(th, &mut |info, input| {
                let job = Job {
                    seq,
                    info: info.clone(),
                    input: input.map(|w| {
                        (
                            w.pt.to_vec(),
                            w.params,
                            w.space.clone(),
                            w.resolver.clone(),
                            WindowOptions {
                                decoder: self.decoder,
                                ..w.opts
                            },
                        )
                    }),
                };
                seq += 1;
                job_tx
                    .send(job)
                    .map_err(|_| err(&th.path, 0, "a decoding thread stopped"))?;
                while let Ok(done) = done_rx.try_recv() {
                    take(&mut waiting, done)?;
                }
                Ok(())
            });
            drop(job_tx);
            let stats = walked?;
            for done in done_rx.iter() {
                take(&mut waiting, done)?;
            }
            if next_seq != seq {
                return Err(err(&th.path, 0, "a decoding thread stopped"));
            }
            Ok(stats)
        })
    }

    /// Decodes every window of `th` with the fast decoder and with libipt alone and
    /// compares their records ([`crate::check::compare`]); `f` gets each window and, when
    /// it has PT, the outcome.
    pub fn check_thread(
        &self,
        th: &PttThread,
        f: &mut CheckSink<'_>,
    ) -> Result<ThreadStats, DecodeError> {
        let (mut fast_caches, mut ref_caches) = (self.new_caches(), self.new_caches());
        self.walk_thread(th, &mut |info, input| {
            let Some(w) = input else {
                return f(info, None);
            };
            let mut fast = w
                .decoder(crate::DecoderKind::Fast)?
                .with_caches(std::mem::take(&mut fast_caches));
            let mut reference = w
                .decoder(crate::DecoderKind::Libipt)?
                .with_caches(std::mem::take(&mut ref_caches));
            let outcome = crate::check::compare(&mut fast, &mut reference);
            fast_caches = self.next_caches(&mut fast);
            ref_caches = self.next_caches(&mut reference);
            f(info, Some(outcome))
        })
    }

    fn new_caches(&self) -> crate::pipeline::DecoderCaches {
        if self.private_caches {
            crate::pipeline::DecoderCaches::default()
        } else {
            crate::pipeline::DecoderCaches::sharing_sections()
        }
    }

    fn next_caches(&self, dec: &mut PtDecoder<'_>) -> crate::pipeline::DecoderCaches {
        if self.private_caches {
            crate::pipeline::DecoderCaches::default()
        } else {
            dec.take_caches()
        }
    }

    /// Goes through the windows of `th` in order, keeping the image up to date: `f` gets
    /// each window and, when it has PT, what decoding it takes.
    fn walk_thread(
        &self,
        th: &PttThread,
        f: &mut InputSink<'_>,
    ) -> Result<ThreadStats, DecodeError> {
        let path = &th.path;
        let input = crate::ptt_input::read_thread(path)?;
        let data = input.data;
        let pf = ptt::parse(&path.display().to_string(), &data)
            .map_err(|e| err(path, 0, e.to_string()))?;
        let ThreadImage {
            params,
            mut space,
            mut resolver,
            mut warnings,
        } = self.thread_image(th);
        let mut stats = ThreadStats::default();
        for fr in &pf.frames {
            match RecordType::from_raw(fr.ty) {
                Some(RecordType::Window) => {}
                Some(RecordType::End) => {
                    stats.ended = true;
                    continue;
                }
                Some(RecordType::Dropped) => {
                    if let Some((n, _)) = ptt::decode_dropped(fr.payload) {
                        stats.dropped = stats.dropped.saturating_add(n);
                    }
                    continue;
                }
                _ => continue,
            }
            let wr = ptt::decode_window(fr.payload)
                .ok_or_else(|| err(path, fr.offset as u64, "malformed Window record"))?;
            stats.windows += 1;
            let mut info = PttWindowInfo {
                pid: th.header.pid,
                tid: th.header.tid,
                index: wr.window.index,
                nr: wr.window.nr,
                ret: wr.window.ret,
                flags: wr.window.flags,
                pt_len: wr.pt.len(),
                sideband_len: wr.sideband.len(),
                memory: Default::default(),
            };
            if !wr.sideband.is_empty() {
                let src = format!("{} window {} (sideband)", path.display(), info.index);
                let (events, memory) =
                    parse_window_sideband(&src, wr.sideband, SIDEBAND_SAMPLE_TYPE)?;
                info.memory = memory;
                resolver.apply_window(&mut space, &events, &mut warnings);
            }
            if wr.pt.is_empty() {
                f(&info, None)?;
                continue;
            }
            stats.windows_with_pt += 1;
            // Payload offset of the PT bytes in the file: frame header (8) + fixed part.
            let base = (fr.offset + 8 + ptt::WINDOW_FIXED_SIZE) as u64;
            let opts = WindowOptions {
                source: format!("{} window {}", path.display(), info.index),
                window_id: Some(info.index),
                cpu: None,
                base_offset: base,
                decoder: self.decoder,
                resync_on_error: self.resync_on_error,
                iflags_events: self.iflags_events,
            };
            let w = WindowInput {
                pt: wr.pt,
                params,
                space: &space,
                resolver: &resolver,
                opts,
            };
            f(&info, Some(w))?;
        }
        stats.tail = input.tail.clone();
        stats.recovered = input.recovered;
        stats.bad_tail = match input.tail {
            Tail::Clean => None,
            Tail::Truncated { offset, bytes } => Some(format!(
                "truncated tail: {bytes} bytes at offset {offset} ignored (writer killed?)"
            )),
            Tail::Corrupt { offset, bytes } => Some(format!(
                "corrupt frame at offset {offset}: {bytes} bytes ignored"
            )),
        };
        stats.warnings = warnings;
        Ok(stats)
    }

    /// Decodes every window of `th` into memory (small traces, tests).
    pub fn collect_thread(
        &self,
        th: &PttThread,
    ) -> Result<Vec<(PttWindowInfo, Vec<super::Record>)>, DecodeError> {
        let mut out = Vec::new();
        self.decode_thread(th, &mut |info, dec| {
            let recs = match dec {
                Some(d) => d.collect(),
                None => Vec::new(),
            };
            out.push((info.clone(), recs));
            Ok(())
        })?;
        Ok(out)
    }
}
