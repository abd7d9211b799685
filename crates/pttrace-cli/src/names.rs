//! Names of code addresses in one traced process image, for every output that names
//! frames (`view`'s timeline, flame graph and folded stacks; `decode`'s source lines).
//!
//! In order: PLT stubs as `function@plt`; JIT code from the image's perf map
//! (`perf-PID.map`, kept in the trace directory by `pttrace run`, else `/tmp`); the mapped
//! ELF file through [`pttrace_symbols`] (DWARF with separate debug files by build-id or
//! debuglink, `--debug-dir`, demangled; code without symbols named once per function from
//! its `.eh_frame` start, `module+0xOFF`); the ELF symbols the decoder reads (the vDSO's);
//! else `module+0xOFF` of the address, else the address.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use drpttracer::decode::callstack::{Functions, INLINE_KEY};
use drpttracer::decode::ptt_dir::{PttProcess, PttThread, PttTrace};
use drpttracer::decode::Symbols;
use pttrace_symbols::{
    AddrHasher, DebugLookup, DebugSearch, DebugSource, EmbeddedBlob, JitDump, NameOrigin, PerfMap,
    Symbolized, Symbolizer,
};

/// Debug-file search and opened modules, shared by every image of one command.
pub type SharedSymbolizer = Rc<RefCell<Symbolizer>>;

/// A symbolizer that also looks in `debug_dirs` (the `--debug-dir` options).
pub fn symbolizer(debug_dirs: &[PathBuf]) -> SharedSymbolizer {
    let mut search = DebugSearch::new();
    for d in debug_dirs {
        search.add_debug_dir(d);
    }
    Rc::new(RefCell::new(Symbolizer::new(search)))
}

/// A file-backed mapping of the image.
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    /// The file to read (under `--sysroot` when given).
    file: PathBuf,
    /// Its name in messages and names (`libc.so.6`).
    module: String,
}

/// What an address is: its function (`name`, run-time `start` when known) and the frames
/// inlined at it, innermost first (each with its source position), then the function's.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: Arc<str>,
    pub start: Option<u64>,
    pub resolved: Option<Arc<Symbolized>>,
}

/// What a module whose code stays (partly) unnamed lacks and what would fix it, e.g.
/// `python3.11: stripped, no debug file for build-id 1234…; install python3.11-dbgsym`.
pub fn unnamed_line(debug: &DebugLookup, name: &str, file: &Path) -> String {
    let mut line = debug.describe(name);
    if debug.source == DebugSource::None {
        if let Some(pkg) = pttrace_symbols::debian_debug_package(file) {
            line.push_str(&format!("; install {pkg}"));
        }
    } else {
        line.push_str("; some of its code has no symbol there either");
    }
    line
}

/// A resolved address and the key of the functions inlined there (0: none).
struct Entry {
    named: Named,
    inline_key: u64,
}

/// Interned chains of inlined functions (outermost first): by id, and ids by chain.
type Chains = (Vec<Vec<Arc<str>>>, HashMap<Vec<Arc<str>>, u32>);

/// Names of one process image's code.
pub struct ImageNames {
    maps: Vec<Mapping>,
    elf: Symbols,
    plts: Vec<Plt>,
    jit: Option<PerfMap>,
    jitdump: Option<JitDump>,
    symbolizer: SharedSymbolizer,
    cache: RefCell<HashMap<u64, Entry, BuildHasherDefault<AddrHasher>>>,
    /// Mapped files some of whose code got no name from symbols.
    unnamed: RefCell<std::collections::BTreeSet<PathBuf>>,
    /// Chains of inlined functions (outermost first), by their id in an inline key.
    chains: RefCell<Chains>,
    /// Whether each mapping's file has DWARF (where inlined code can be), once asked.
    dwarf: RefCell<Vec<Option<bool>>>,
    /// Each mapping's module in the symbolizer ([`Symbolizer::module_id`]), once asked.
    module_ids: RefCell<Vec<Option<usize>>>,
    /// The image's thread files: their code records tell where copies of mapped code run.
    code_files: Vec<PathBuf>,
    /// Copies of V8's embedded builtins, placed once asked.
    v8_copies: RefCell<Option<Vec<CodeCopy>>>,
    /// What naming cost so far: distinct addresses resolved, and the time spent setting up
    /// and resolving them (not counting lookups of addresses already resolved).
    cost: std::cell::Cell<(u64, std::time::Duration)>,
    /// Distinct addresses of code outside any mapped file (JIT code) named by their
    /// address alone so far.
    anonymous: std::cell::Cell<u64>,
}

/// Code copied from a mapped file into anonymous memory (V8's builtins): `len` bytes at
/// `copy` are the bytes at run-time address `original`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CodeCopy {
    copy: u64,
    original: u64,
    len: u64,
}

/// Code records that must agree on a copy's start before it is taken (one run of common
/// instructions can match the blob by chance; the first must be long enough to place the
/// copy alone, the others confirm it).
const COPY_VOTES: u32 = 3;

/// Which process images share one [`ImageNames`] (see [`SharedKey`]).
pub struct SharedImages {
    /// Each process image -> the first with the same key (itself when none has, or it has
    /// no key).
    names_of: HashMap<(i32, u64), (i32, u64)>,
    /// The thread files of every image of each such first one (the code records that
    /// place V8's copies of mapped code, of them all).
    files: HashMap<(i32, u64), Vec<PathBuf>>,
}

impl SharedImages {
    /// The process images of `threads` (in order; the first of a key names them).
    pub fn of<'t>(
        trace: &PttTrace,
        threads: impl Iterator<Item = &'t PttThread>,
        trace_dir: &Path,
    ) -> Self {
        let mut first: HashMap<SharedKey, (i32, u64)> = HashMap::new();
        let mut shared = SharedImages {
            names_of: HashMap::new(),
            files: HashMap::new(),
        };
        for th in threads {
            let image = (th.header.pid, th.header.nonce);
            if shared.names_of.contains_key(&image) {
                continue;
            }
            let key = trace
                .process_of(th)
                .and_then(|p| shared_key(p, Some(trace_dir)));
            let names = key.map_or(image, |k| *first.entry(k).or_insert(image));
            shared.names_of.insert(image, names);
            shared
                .files
                .entry(names)
                .or_default()
                .extend(trace.image_files(th));
        }
        shared
    }

    /// The process image whose names `image` (pid, nonce) uses.
    pub fn names_of(&self, image: (i32, u64)) -> (i32, u64) {
        self.names_of.get(&image).copied().unwrap_or(image)
    }

    /// The thread files of the images that use the names of `image`.
    pub fn code_files(&self, image: (i32, u64)) -> Vec<PathBuf> {
        self.files.get(&image).cloned().unwrap_or_default()
    }

    /// Process images.
    pub fn images(&self) -> usize {
        self.names_of.len()
    }
}

/// The perf map of process `p`: the copy `pttrace run` keeps in the trace directory,
/// else `/tmp/perf-PID.map` if it is `p`'s ([`written_since`]).
fn perf_map(dir: Option<&Path>, p: &PttProcess) -> Option<PerfMap> {
    PerfMap::open(&perf_map_path(dir, p)?).ok()
}

fn perf_map_path(dir: Option<&Path>, p: &PttProcess) -> Option<PathBuf> {
    let name = format!("perf-{}.map", p.pid);
    let kept = dir.map(|d| d.join(&name)).filter(|k| k.is_file());
    kept.or_else(|| {
        Some(Path::new("/tmp").join(&name)).filter(|t| t.is_file() && written_since(&p.path, t))
    })
}

/// The jitdump of process `p`: the copy `pttrace run` keeps in the trace directory, else
/// `jit-PID.dump` in /tmp or the working directory (where JITs write it: node --perf-prof
/// in its working directory, perf's JVMTI agent in /tmp) if it is `p`'s.
fn jitdump(dir: Option<&Path>, p: &PttProcess) -> Option<JitDump> {
    jitdump_path(dir, p).and_then(|path| JitDump::open(&path).ok())
}

fn jitdump_path(dir: Option<&Path>, p: &PttProcess) -> Option<PathBuf> {
    let name = format!("jit-{}.dump", p.pid);
    let kept = dir.map(|d| d.join(&name)).filter(|k| k.is_file());
    kept.or_else(|| {
        [Path::new("/tmp").join(&name), PathBuf::from(&name)]
            .into_iter()
            .find(|f| f.is_file() && written_since(&p.path, f))
    })
}

/// Whether `file` (a perf map or jitdump named by a process id) was written since the
/// process whose info file is `info` started: one left by an earlier process of the same
/// id is not its own and would name its code wrongly. (True where either time is unknown:
/// a file system without creation times.)
pub fn written_since(info: &Path, file: &Path) -> bool {
    let started = std::fs::metadata(info).and_then(|m| m.created());
    let written = std::fs::metadata(file).and_then(|m| m.modified());
    match (started, written) {
        (Ok(s), Ok(w)) => w >= s,
        _ => true,
    }
}

/// What the names of a process image's code depend on when nothing of the process itself
/// names it (no perf map, no jitdump): the files it maps (path and identity), where and
/// from which offset, and its vDSO. Images of equal keys name every address of their
/// mapped files alike, so they can share one [`ImageNames`]: the same programs a script
/// runs again and again, at the same addresses where nothing randomizes them (QEMU).
#[derive(Debug, PartialEq, Eq, Hash)]
struct SharedKey {
    maps: Vec<(u64, u64, u64, u64, u32, u32, String)>,
    vdso: Option<(u64, Vec<u8>)>,
}

/// The key of `p`'s names (see [`SharedKey`]), none when the process's own perf map or
/// jitdump (looked for as [`ImageNames::new`] does, `trace_dir` first) names its code.
fn shared_key(p: &PttProcess, trace_dir: Option<&Path>) -> Option<SharedKey> {
    if perf_map_path(trace_dir, p).is_some() || jitdump_path(trace_dir, p).is_some() {
        return None;
    }
    Some(SharedKey {
        maps: p
            .maps
            .iter()
            .map(|m| {
                (
                    m.start,
                    m.end,
                    m.offset,
                    m.inode,
                    m.maj,
                    m.min,
                    m.path.clone(),
                )
            })
            .collect(),
        vdso: p.vdso.clone(),
    })
}

fn module_of(path: &str) -> String {
    if path.is_empty() {
        "[anon]".to_string()
    } else {
        path.rsplit('/').next().unwrap_or(path).to_string()
    }
}

impl ImageNames {
    pub fn new(
        p: Option<&PttProcess>,
        sysroot: Option<&Path>,
        trace_dir: Option<&Path>,
        symbolizer: SharedSymbolizer,
    ) -> Self {
        let began = std::time::Instant::now();
        let elf = p.map(|p| p.symbols(sysroot)).unwrap_or_default();
        let mut maps: Vec<Mapping> = p
            .map(|p| {
                p.maps
                    .iter()
                    .map(|m| Mapping {
                        start: m.start,
                        end: m.end,
                        offset: m.offset,
                        file: if m.path.starts_with('/') {
                            match sysroot {
                                Some(r) => r.join(m.path.trim_start_matches('/')),
                                None => PathBuf::from(&m.path),
                            }
                        } else {
                            PathBuf::new()
                        },
                        module: module_of(&m.path),
                    })
                    .collect()
            })
            .unwrap_or_default();
        maps.sort_by_key(|m| m.start);
        let mut plts = Vec::new();
        for (start, file, path) in p.map(|p| p.mapped_files(sysroot)).unwrap_or_default() {
            plts.extend(plts_of(&file, start, &module_of(path)));
        }
        ImageNames {
            dwarf: RefCell::new(vec![None; maps.len()]),
            module_ids: RefCell::new(vec![None; maps.len()]),
            maps,
            elf,
            plts,
            jit: p.and_then(|p| perf_map(trace_dir, p)),
            jitdump: p.and_then(|p| jitdump(trace_dir, p)),
            symbolizer,
            cache: RefCell::new(HashMap::default()),
            unnamed: RefCell::new(Default::default()),
            chains: RefCell::new(Default::default()),
            code_files: Vec::new(),
            v8_copies: RefCell::new(None),
            cost: std::cell::Cell::new((0, began.elapsed())),
            anonymous: std::cell::Cell::new(0),
        }
    }

    /// Distinct addresses resolved so far, and the time naming took (set-up included).
    pub fn cost(&self) -> (u64, std::time::Duration) {
        self.cost.get()
    }

    /// Also names code run from copies of mapped code (V8's builtins) by the bytes the
    /// code records of the image's thread files `files` hold.
    pub fn with_code_files(mut self, files: Vec<PathBuf>) -> Self {
        self.code_files = files;
        self
    }

    /// The address in the mapped file whose copy runs at `addr` (see [`EmbeddedBlob`]).
    fn copied_from(&self, addr: u64) -> Option<u64> {
        if self.v8_copies.borrow().is_none() {
            let found = self.place_v8_copies();
            *self.v8_copies.borrow_mut() = Some(found);
        }
        let copies = self.v8_copies.borrow();
        copies
            .as_ref()?
            .iter()
            .find(|c| addr >= c.copy && addr - c.copy < c.len)
            .map(|c| c.original + (addr - c.copy))
    }

    /// Every copy of V8's embedded builtins that code ran from: the blob of a mapped file
    /// placed where the code records' bytes (outside mapped files) equal its own.
    fn place_v8_copies(&self) -> Vec<CodeCopy> {
        if self.code_files.is_empty() {
            return Vec::new();
        }
        // The blob and its run-time address, in the first mapped file that has one.
        let mut files = std::collections::BTreeSet::new();
        let blob = self.maps.iter().find_map(|m| {
            if m.file.as_os_str().is_empty() || !files.insert(&m.file) {
                return None;
            }
            let blob = EmbeddedBlob::of_file(&m.file)?;
            let mut sym = self.symbolizer.borrow_mut();
            let module = sym.module(&m.file).ok()?;
            let at = self
                .maps
                .iter()
                .filter(|n| n.file == m.file)
                .find_map(|n| {
                    let rt = module.addr_to_runtime(blob.vaddr, n.start, n.offset)?;
                    (rt >= n.start && rt < n.end).then_some(rt)
                })?;
            Some((blob, at))
        });
        let Some((blob, original)) = blob else {
            return Vec::new();
        };
        let len = blob.len() as u64;
        let mut votes: HashMap<u64, u32> = HashMap::new();
        let mut placed: Vec<CodeCopy> = Vec::new();
        for f in &self.code_files {
            let _ = drpttracer::decode::ptt_dir::for_each_code_record(f, &mut |addr, bytes| {
                if self.mapping(addr).is_some()
                    || placed.iter().any(|c| addr >= c.copy && addr - c.copy < len)
                {
                    return std::ops::ControlFlow::Continue(());
                }
                // A run of the blob at a placement already found confirms it; else a
                // long enough run may place a new copy.
                let copy = votes
                    .keys()
                    .copied()
                    .find(|&c| blob.holds(c, addr, bytes))
                    .or_else(|| blob.copy_start(addr, bytes));
                if let Some(copy) = copy {
                    let v = votes.entry(copy).or_insert(0);
                    *v += 1;
                    if *v == COPY_VOTES {
                        placed.push(CodeCopy {
                            copy,
                            original,
                            len,
                        });
                    }
                }
                std::ops::ControlFlow::Continue(())
            });
        }
        placed
    }

    fn mapping(&self, addr: u64) -> Option<&Mapping> {
        self.mapping_index(addr).and_then(|i| self.maps.get(i))
    }

    fn mapping_index(&self, addr: u64) -> Option<usize> {
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        (addr < self.maps.get(i)?.end).then_some(i)
    }

    /// Whether the code at `addr` lies in a mapped file with DWARF: only there can it be
    /// inlined code (JIT code, files without debug info: no need to resolve it).
    fn in_dwarf(&self, addr: u64) -> bool {
        let Some(i) = self.mapping_index(addr) else {
            return false;
        };
        if let Some(Some(known)) = self.dwarf.borrow().get(i) {
            return *known;
        }
        let has = self.module_id(i).is_some_and(|id| {
            self.symbolizer
                .borrow_mut()
                .module_by_id(id)
                .is_some_and(|module| module.has_dwarf())
        });
        if let Some(e) = self.dwarf.borrow_mut().get_mut(i) {
            *e = Some(has);
        }
        has
    }

    /// The symbolizer's number of mapping `i`'s module (none: no file mapped there).
    fn module_id(&self, i: usize) -> Option<usize> {
        if let Some(Some(id)) = self.module_ids.borrow().get(i) {
            return Some(*id);
        }
        let m = self.maps.get(i)?;
        if m.file.as_os_str().is_empty() {
            return None;
        }
        let id = self.symbolizer.borrow_mut().module_id(&m.file);
        if let Some(e) = self.module_ids.borrow_mut().get_mut(i) {
            *e = Some(id);
        }
        Some(id)
    }

    /// The address through the mapped file's debug info and symbols.
    fn in_mapped_file(&self, addr: u64) -> Option<Named> {
        let i = self.mapping_index(addr)?;
        let m = self.maps.get(i)?;
        let id = self.module_id(i)?;
        let mut sym = self.symbolizer.borrow_mut();
        let module = sym.module_by_id(id)?;
        let elf_addr = module.runtime_to_addr(addr, m.start, m.offset)?;
        let r = module.resolve(elf_addr);
        match r.origin {
            NameOrigin::Unknown => return None,
            NameOrigin::EhFrame | NameOrigin::Boundary => {
                self.unnamed.borrow_mut().insert(m.file.clone());
            }
            NameOrigin::Dwarf | NameOrigin::Symbol => {}
        }
        let start = r
            .start
            .and_then(|s| module.addr_to_runtime(s, m.start, m.offset));
        Some(Named {
            name: r.function.clone(),
            start,
            resolved: Some(r),
        })
    }

    /// What `addr` is (cached).
    pub fn named(&self, addr: u64) -> Named {
        self.with_entry(addr, |e| e.named.clone())
    }

    /// Runs `f` on the cached entry of `addr`, resolving it first when new.
    fn with_entry<T>(&self, addr: u64, f: impl FnOnce(&Entry) -> T) -> T {
        if let Some(e) = self.cache.borrow().get(&addr) {
            return f(e);
        }
        let began = std::time::Instant::now();
        let named = self.resolve(addr);
        let inline_key = self.chain_key(&named);
        let (n, t) = self.cost.get();
        self.cost.set((n + 1, t + began.elapsed()));
        let e = Entry { named, inline_key };
        let r = f(&e);
        self.cache.borrow_mut().insert(addr, e);
        r
    }

    /// The inline key of a resolved address (see [`Functions::inline_context`]).
    fn chain_key(&self, n: &Named) -> u64 {
        let Some(r) = n.resolved.as_ref() else {
            return 0;
        };
        let inlined = r.inlined();
        if inlined.is_empty() {
            return 0;
        }
        let chain: Vec<Arc<str>> = inlined.iter().rev().map(|f| f.name.clone()).collect();
        let mut chains = self.chains.borrow_mut();
        let next = chains.0.len() as u32;
        let id = *chains.1.entry(chain.clone()).or_insert(next);
        if id == next {
            chains.0.push(chain);
        }
        INLINE_KEY | u64::from(id)
    }

    fn resolve(&self, addr: u64) -> Named {
        let plain = |name: String, start: Option<u64>| Named {
            name: name.into(),
            start,
            resolved: None,
        };
        if let Some(n) = self.plts.iter().find_map(|p| p.name(addr)) {
            return plain(n, None);
        }
        if let Some(j) = self.jit.as_ref().and_then(|j| j.lookup(addr)) {
            return plain(j.name.clone(), Some(j.start));
        }
        if let Some(j) = self.jitdump.as_ref().and_then(|j| j.lookup(addr, None)) {
            return plain(j.name().to_string(), Some(j.start));
        }
        if let Some(n) = self.in_mapped_file(addr) {
            return n;
        }
        if let Some((name, off)) = self.elf.lookup(addr) {
            return plain(name.to_string(), Some(addr.wrapping_sub(off)));
        }
        if let Some(m) = self.mapping(addr) {
            return plain(
                format!("{}+{:#x}", m.module, addr - m.start + m.offset),
                None,
            );
        }
        // Anonymous code: a copy of a mapped file's (V8's builtins) is named as its original.
        if let Some(original) = self
            .copied_from(addr)
            .filter(|&o| self.mapping(o).is_some())
        {
            let n = self.resolve(original);
            return Named {
                start: n.start.map(|s| s.wrapping_add(addr.wrapping_sub(original))),
                ..n
            };
        }
        self.anonymous.set(self.anonymous.get() + 1);
        plain(format!("{addr:#x}"), None)
    }

    /// Distinct addresses of code outside any mapped file named by their address alone so
    /// far, when the image had neither perf map nor jitdump to name it (JIT code whose
    /// runtime wrote neither: [`jit_names_hint`] says how to get them).
    pub fn jit_without_names(&self) -> u64 {
        if self.jit.is_some() || self.jitdump.is_some() {
            return 0;
        }
        self.anonymous.get()
    }

    /// The function's name at `addr`.
    pub fn name(&self, addr: u64) -> Arc<str> {
        self.named(addr).name
    }

    /// `file:line` of the instruction at `addr`, where DWARF gives it.
    pub fn srcline(&self, addr: u64) -> Option<String> {
        let n = self.named(addr);
        match n.resolved.as_ref() {
            Some(r) => Some(r.location()?.to_string()),
            // JIT code: the jitdump's debug entries.
            None => {
                let hit = self.jitdump.as_ref()?.lookup(addr, None)?;
                let e = hit.line(addr)?;
                Some(format!("{}:{}", e.file, e.line))
            }
        }
    }

    /// The mapped files some of whose code named so far got no name from symbols, each
    /// with where the search looked and what would fix it (for `report` and `view`), e.g.
    /// `python3.11: stripped, no debug file for build-id 1234…; install python3.11-dbgsym`.
    pub fn modules_without_symbols(&self) -> Vec<String> {
        let mut sym = self.symbolizer.borrow_mut();
        let mut out = Vec::new();
        for file in self.unnamed.borrow().iter() {
            let Ok(module) = sym.module(file) else {
                continue;
            };
            out.push(unnamed_line(module.debug(), module.name(), file));
        }
        out
    }
}

/// How the runtime of program `prog` (its command name) names its JIT code for
/// profilers: the flag that makes it write a perf map (`/tmp/perf-PID.map`, which `pttrace
/// run` keeps with the trace).
pub fn jit_names_hint(prog: &str) -> String {
    let base = prog.rsplit('/').next().unwrap_or(prog);
    if base == "java" || base.starts_with("java") {
        format!(
            "run it as `{base} -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit …` \
             (a perf map at its exit)"
        )
    } else if base == "node" || base == "nodejs" || base == "deno" {
        format!("run it as `{base} --perf-basic-prof …` (a perf map as it compiles)")
    } else if base.starts_with("python") {
        format!("run it as `{base} -X perf …` (Python 3.12 and later: a perf map)")
    } else {
        "have it write a perf map (/tmp/perf-PID.map: address, size and name per line)".to_string()
    }
}

/// A PLT section of a mapped ELF file, at its run-time address, and the names of the
/// functions its GOT slots are bound to (run-time slot address -> name).
pub struct Plt {
    start: u64,
    bytes: Vec<u8>,
    module: String,
    got: HashMap<u64, String>,
}

impl Plt {
    /// The stub at `addr` (a call target): its `jmp *slot(%rip)` (within the stub's first
    /// 8 bytes, after endbr64/bnd) names the function bound to the slot.
    pub fn name(&self, addr: u64) -> Option<String> {
        let off = usize::try_from(addr.checked_sub(self.start)?).ok()?;
        if off >= self.bytes.len() {
            return None;
        }
        let stub = self.bytes.get(off..self.bytes.len().min(off + 14))?;
        let name = (0..stub.len().saturating_sub(5).min(8))
            .find(|&k| stub[k] == 0xff && stub[k + 1] == 0x25)
            .and_then(|k| {
                let disp = i32::from_le_bytes(stub.get(k + 2..k + 6)?.try_into().ok()?);
                let slot = addr
                    .wrapping_add(k as u64 + 6)
                    .wrapping_add(i64::from(disp) as u64);
                self.got.get(&slot).cloned()
            })
            .unwrap_or_else(|| self.module.clone());
        Some(format!("{name}@plt"))
    }
}

/// The PLT sections (`.plt`, `.plt.sec`, `.plt.got`) of the ELF file mapped from file
/// offset 0 at `start`, moved like `PttProcess::symbols` moves its symbols.
pub fn plts_of(path: &Path, start: u64, module: &str) -> Vec<Plt> {
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable};
    let Ok(map) = drpttracer::decode::image::Backing::map_file(path) else {
        return Vec::new();
    };
    let Ok(obj) = object::File::parse(map.bytes()) else {
        return Vec::new();
    };
    let low = obj.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let bias = start.wrapping_sub(low);
    let mut got = HashMap::new();
    if let (Some(relocs), Some(dynsyms)) = (obj.dynamic_relocations(), obj.dynamic_symbol_table()) {
        for (slot, r) in relocs {
            if let object::RelocationTarget::Symbol(i) = r.target() {
                if let Some(name) = dynsyms.symbol_by_index(i).ok().and_then(|s| s.name().ok()) {
                    if !name.is_empty() {
                        got.insert(slot.wrapping_add(bias), name.to_string());
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for sec in obj.sections() {
        if !matches!(sec.name(), Ok(".plt" | ".plt.sec" | ".plt.got")) {
            continue;
        }
        if let Ok(bytes) = sec.data() {
            out.push(Plt {
                start: sec.address().wrapping_add(bias),
                bytes: bytes.to_vec(),
                module: module.to_string(),
                got: got.clone(),
            });
        }
    }
    out
}

impl ImageNames {
    /// The functions inlined at the key's place, outermost first (see
    /// [`Functions::inline_context`]).
    pub fn inline_chain(&self, key: u64) -> Option<Vec<Arc<str>>> {
        if key & INLINE_KEY == 0 {
            return None;
        }
        let chains = self.chains.borrow();
        chains.0.get((key & 0xffff_ffff) as usize).cloned()
    }
}

impl Functions for ImageNames {
    fn function_start(&self, addr: u64) -> Option<u64> {
        self.with_entry(addr, |e| e.named.start)
    }

    fn inline_context(&self, pc: u64) -> u64 {
        if !self.in_dwarf(pc) {
            return 0;
        }
        self.with_entry(pc, |e| e.inline_key)
    }

    /// The mapping around `pc` (inlined code only where it is a file with DWARF), or the
    /// space between mappings (JIT code: none).
    fn inline_region(&self, pc: u64) -> (std::ops::Range<u64>, bool) {
        let after = self.maps.partition_point(|m| m.start <= pc);
        let before = after.checked_sub(1).and_then(|i| self.maps.get(i));
        match before {
            Some(m) if pc < m.end => {
                if !self.in_dwarf(pc) {
                    return (m.start..m.end, false);
                }
                // The compilation unit (or the space between units) around it, in the
                // mapping's addresses.
                let Some(id) = self.module_id(after - 1) else {
                    return (m.start..m.end, true);
                };
                let mut sym = self.symbolizer.borrow_mut();
                let Some(module) = sym.module_by_id(id) else {
                    return (m.start..m.end, true);
                };
                let Some(elf) = module.runtime_to_addr(pc, m.start, m.offset) else {
                    return (m.start..m.end, true);
                };
                let (r, maybe) = module.dwarf_region(elf);
                let (before, after) = (elf - r.start, r.end - elf);
                (
                    pc.saturating_sub(before).max(m.start)..pc.saturating_add(after).min(m.end),
                    maybe,
                )
            }
            _ => {
                let start = before.map_or(0, |m| m.end);
                let end = self.maps.get(after).map_or(u64::MAX, |m| m.start);
                (start..end, false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{jit_names_hint, shared_key};
    use drpttracer::decode::ptt_dir::PttProcess;
    use pttrace_format::maps::MapsEntry;

    /// A process of pid `pid` mapping `/usr/bin/prog` (inode `inode`) at `at` and an
    /// anonymous page after it.
    fn process(pid: i32, at: u64, inode: u64) -> PttProcess {
        let line = |s: String| MapsEntry::parse(&s).unwrap();
        PttProcess {
            path: format!("{pid}-1.info").into(),
            pid,
            nonce: u64::from(pid.unsigned_abs()) * 7,
            maps: vec![
                line(format!(
                    "{at:x}-{:x} r-xp 00001000 08:01 {inode} /usr/bin/prog",
                    at + 0x2000
                )),
                line(format!(
                    "{:x}-{:x} rw-p 00000000 00:00 0",
                    at + 0x2000,
                    at + 0x3000
                )),
            ],
            vdso: Some((0x7fff_f000, vec![0x7f, b'E', b'L', b'F'])),
            metadata: None,
            cmdline: "prog".into(),
        }
    }

    #[test]
    fn images_of_the_same_files_at_the_same_places_share_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = Some(dir.path());
        // (Pids no /tmp/perf-PID.map or jit-PID.dump is written for.)
        let (a, b) = (2_000_000_001, 2_000_000_002);
        let key = shared_key(&process(a, 0x40_0000, 11), d).unwrap();
        assert_eq!(shared_key(&process(b, 0x40_0000, 11), d), Some(key));
        let key = shared_key(&process(a, 0x40_0000, 11), d);
        // Another file (inode), another place, another vDSO: names of their own.
        assert_ne!(shared_key(&process(b, 0x40_0000, 12), d), key);
        assert_ne!(shared_key(&process(b, 0x50_0000, 11), d), key);
        let mut other_vdso = process(b, 0x40_0000, 11);
        other_vdso.vdso = Some((0x7fff_e000, vec![0x7f, b'E', b'L', b'F']));
        assert_ne!(shared_key(&other_vdso, d), key);
        // A process whose own perf map or jitdump names code: none.
        std::fs::write(dir.path().join(format!("perf-{b}.map")), "1000 10 jitted\n").unwrap();
        assert_eq!(shared_key(&process(b, 0x40_0000, 11), d), None);
        std::fs::write(dir.path().join(format!("jit-{a}.dump")), b"").unwrap();
        assert_eq!(shared_key(&process(a, 0x40_0000, 11), d), None);
    }

    #[test]
    fn each_runtime_is_told_its_own_perf_map_flag() {
        assert_eq!(
            jit_names_hint("/usr/lib/jvm/java-17-openjdk-amd64/bin/java"),
            "run it as `java -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit …` (a \
             perf map at its exit)"
        );
        assert_eq!(
            jit_names_hint("node"),
            "run it as `node --perf-basic-prof …` (a perf map as it compiles)"
        );
        assert_eq!(
            jit_names_hint("/usr/bin/python3.12"),
            "run it as `python3.12 -X perf …` (Python 3.12 and later: a perf map)"
        );
        assert_eq!(
            jit_names_hint("./minijit"),
            "have it write a perf map (/tmp/perf-PID.map: address, size and name per line)"
        );
    }
}
