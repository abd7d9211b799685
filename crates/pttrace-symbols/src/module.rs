//! One ELF module: its symbols, `.eh_frame` ranges and DWARF, and a cache of resolved
//! addresses.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::elf::{self, Buf, Load, RawSym, Reader};
use crate::search::{DebugLookup, DebugSearch};
use crate::SymbolError;

/// A source position.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceLoc {
    /// The file path as DWARF gives it (joined with the unit's directory).
    pub file: Arc<str>,
    /// The line, 1-based; 0 when DWARF gives none.
    pub line: u32,
    /// The column, 1-based; 0 when unknown.
    pub column: u32,
}

impl fmt::Display for SourceLoc {
    /// `file:line`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// One (possibly inlined) function frame at an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The function's demangled name.
    pub name: Arc<str>,
    /// Where execution is inside this function: for the innermost frame the address's own
    /// source line; for an outer frame the call site of the frame inlined into it.
    pub location: Option<SourceLoc>,
}

/// Where a function name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NameOrigin {
    /// A DWARF subprogram.
    Dwarf,
    /// An ELF symbol (`.symtab` of the binary or the debug file, or `.dynsym`).
    Symbol,
    /// No symbol: an `.eh_frame` FDE gives the function's start, named `module+0xOFF`.
    EhFrame,
    /// No symbol nor FDE: the nearest preceding symbol/FDE/section boundary, `module+0xOFF`.
    Boundary,
    /// Outside every executable range of the file: the address itself, `module+0xOFF`.
    Unknown,
}

/// What an address resolves to. Every address of one function gets the same
/// [`Symbolized::function`] (and `start`, when known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbolized {
    /// The (outermost, non-inlined) function's name, demangled.
    pub function: Arc<str>,
    /// The function's start (ELF address) when a symbol, FDE or boundary gives it.
    pub start: Option<u64>,
    /// Where `function` came from.
    pub origin: NameOrigin,
    /// Frames innermost first; the last one is `function` itself, the ones before it are
    /// inlined into it (see [`Frame::location`]). Never empty.
    pub frames: Vec<Frame>,
}

impl Symbolized {
    /// The address's own source position (the innermost frame's).
    pub fn location(&self) -> Option<&SourceLoc> {
        self.frames.first().and_then(|f| f.location.as_ref())
    }

    /// The inlined frames (innermost first), without the outermost function.
    pub fn inlined(&self) -> &[Frame] {
        &self.frames[..self.frames.len().saturating_sub(1)]
    }
}

/// A function symbol, one per address (the best of its aliases, chosen like perf does).
#[derive(Debug, Clone)]
struct Sym {
    start: u64,
    /// 0: up to the next symbol (within its executable range).
    size: u64,
    name: Box<str>,
}

/// One row of a line table (see [`Module::line_rows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineRow {
    pub addr: u64,
    pub size: u64,
    pub file: Box<str>,
    pub line: u32,
}

/// An ELF file opened for symbolization. Addresses are **ELF addresses**: the virtual
/// addresses the file's own section headers, symbols and DWARF use (its link-time
/// addresses; for a PIE or shared library the offset from its load base). Convert
/// run-time addresses with [`Module::runtime_to_addr`].
pub struct Module {
    path: PathBuf,
    name: String,
    lookup: DebugLookup,
    loads: Vec<Load>,
    exec: Vec<(u64, u64)>,
    syms: Vec<Sym>,
    /// Other names of symbols at the same address (only where there are aliases).
    aliases: HashMap<u64, Vec<Box<str>>>,
    fdes: Vec<(u64, u64)>,
    bounds: Vec<u64>,
    dwarf: Option<addr2line::Context<Reader>>,
    /// The ELF addresses the DWARF's compilation units cover, sorted and disjoint; `None`
    /// where some unit's could not be read (then any address may be described).
    unit_ranges: Option<UnitRanges>,
    cache: HashMap<u64, Arc<Symbolized>, AddrHash>,
    names: HashMap<Box<str>, Arc<str>>,
    files: HashMap<Box<str>, Arc<str>>,
    fallback: HashMap<u64, Arc<str>>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("debug", &self.lookup)
            .field("symbols", &self.syms.len())
            .field("fdes", &self.fdes.len())
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl Module {
    /// Opens the ELF file at `path` and finds its debug info with `search`.
    pub fn open(path: &Path, search: &DebugSearch) -> Result<Module, SymbolError> {
        let buf = elf::map_file(path)?;
        Module::from_buf(path, buf, search)
    }

    /// A module from bytes already in memory (e.g. a saved vDSO); `path` names it and is
    /// where a `.gnu_debuglink` is looked up beside.
    pub fn from_bytes(
        path: &Path,
        data: Vec<u8>,
        search: &DebugSearch,
    ) -> Result<Module, SymbolError> {
        Module::from_buf(path, Arc::new(Buf::Vec(data)), search)
    }

    fn from_buf(path: &Path, buf: Arc<Buf>, search: &DebugSearch) -> Result<Module, SymbolError> {
        let file = elf::parse(path, buf.as_slice())?;
        let facts = elf::facts(&file);
        let (mut lookup, found) = search.find_with(path, &facts);
        let mut raw = Vec::new();
        elf::symbols(&file, &mut raw);
        let (entry, library) = (object::Object::entry(&file), elf::has_soname(&file));
        let fdes = elf::fde_ranges(&file);
        let mut dwarf = None;
        if facts.has_dwarf {
            dwarf = load_dwarf(&file, &buf, &facts, path, search, &mut lookup);
        }
        drop(file);
        if let Some(found) = found {
            let dfile = elf::parse(&found.path, found.buf.as_slice())?;
            elf::symbols(&dfile, &mut raw);
            let dfacts = elf::facts(&dfile);
            if dfacts.has_dwarf {
                dwarf = load_dwarf(
                    &dfile,
                    &found.buf,
                    &dfacts,
                    &found.path,
                    search,
                    &mut lookup,
                );
            }
        }
        let (dwarf, unit_ranges) = match dwarf {
            Some((ctx, units)) => (Some(ctx), units),
            None => (None, None),
        };
        // (After the debug file's symbols: a stripped program's `_start` may be there.)
        if let Some(s) = elf::entry_symbol(entry, library, &raw, &fdes) {
            raw.push(s);
        }
        let (syms, aliases) = best_symbols(raw);
        let mut bounds: Vec<u64> = Vec::with_capacity(syms.len() * 2 + fdes.len() * 2);
        for s in &syms {
            bounds.push(s.start);
            if s.size != 0 {
                bounds.push(s.start.saturating_add(s.size));
            }
        }
        for &(s, e) in &fdes {
            bounds.push(s);
            bounds.push(e);
        }
        for &(s, _) in &facts.exec {
            bounds.push(s);
        }
        bounds.sort_unstable();
        bounds.dedup();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        Ok(Module {
            path: path.to_path_buf(),
            name,
            lookup,
            loads: facts.loads,
            exec: facts.exec,
            syms,
            aliases,
            fdes,
            bounds,
            dwarf,
            unit_ranges,
            cache: HashMap::default(),
            names: HashMap::new(),
            files: HashMap::new(),
            fallback: HashMap::new(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's name (its last path component), used in `module+0xOFF` names.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the debug info came from.
    pub fn debug(&self) -> &DebugLookup {
        &self.lookup
    }

    /// What the user can do for better names when the module has no DWARF, e.g.
    /// `libc.so.6: install libc6-dbg` (the Debian package owning the file, from dpkg's
    /// lists; see [`crate::debian_debug_package`]); `None` with DWARF or no such package.
    pub fn advice(&self) -> Option<String> {
        if self.dwarf.is_some() {
            return None;
        }
        let pkg = crate::debian_debug_package(&self.path)?;
        Some(format!("{}: install {pkg}", self.name))
    }

    /// The range of ELF addresses around `addr` that DWARF describes alike in one respect:
    /// `true` inside a compilation unit's code (inlined frames may be there), `false` in
    /// the space between units and without DWARF (code no unit describes: none).
    pub fn dwarf_region(&self, addr: u64) -> (std::ops::Range<u64>, bool) {
        if self.dwarf.is_none() {
            return (0..u64::MAX, false);
        }
        let Some(units) = &self.unit_ranges else {
            return (0..u64::MAX, true);
        };
        let after = units.partition_point(|&(lo, _)| lo <= addr);
        let before = after.checked_sub(1).and_then(|i| units.get(i));
        match before {
            Some(&(lo, hi)) if addr < hi => (lo..hi, true),
            _ => (
                before.map_or(0, |r| r.1)..units.get(after).map_or(u64::MAX, |r| r.0),
                false,
            ),
        }
    }

    /// Whether DWARF is loaded (names, inlined frames and lines available).
    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Every row of the DWARF line tables in the file's executable ranges, in address
    /// order: `size` bytes at `addr` are code of `line` in `file` (inlined code under the
    /// file and line it was written at). Empty without DWARF.
    pub fn line_rows(&self) -> Vec<LineRow> {
        let Some(ctx) = self.dwarf.as_ref() else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for &(lo, hi) in &self.exec {
            let Ok(iter) = ctx.find_location_range(lo, hi) else {
                continue;
            };
            for (addr, size, loc) in iter {
                if let (Some(file), Some(line)) = (loc.file, loc.line) {
                    if line > 0 && size > 0 {
                        rows.push(LineRow {
                            addr,
                            size,
                            file: file.into(),
                            line,
                        });
                    }
                }
            }
        }
        rows.sort_by_key(|r| r.addr);
        rows
    }

    /// The function symbols (one per address): start, size (0: up to the next symbol) and
    /// name, in address order.
    pub fn functions(&self) -> impl Iterator<Item = (u64, u64, &str)> {
        self.syms.iter().map(|s| (s.start, s.size, &*s.name))
    }

    /// Number of function symbols (one per address).
    pub fn symbol_count(&self) -> usize {
        self.syms.len()
    }

    /// Number of distinct addresses resolved so far (the cache's size).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The ELF address of file offset `off` (through the PT_LOAD holding it).
    pub fn file_offset_to_addr(&self, off: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|l| off >= l.offset && off - l.offset < l.filesz.max(1))
            .map(|l| l.vaddr.wrapping_add(off - l.offset))
    }

    /// The file offset of ELF address `addr` (through the PT_LOAD holding it).
    pub fn addr_to_file_offset(&self, addr: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|l| addr >= l.vaddr && addr - l.vaddr < l.filesz.max(1))
            .map(|l| l.offset.wrapping_add(addr - l.vaddr))
    }

    /// The ELF address of run-time address `runtime` in a mapping of this file that starts
    /// at `map_start` with file offset `map_offset` (as in `/proc/PID/maps` or a perf MMAP
    /// record).
    pub fn runtime_to_addr(&self, runtime: u64, map_start: u64, map_offset: u64) -> Option<u64> {
        let off = runtime.checked_sub(map_start)?.checked_add(map_offset)?;
        self.file_offset_to_addr(off)
    }

    /// The run-time address of ELF address `addr` in that mapping.
    pub fn addr_to_runtime(&self, addr: u64, map_start: u64, map_offset: u64) -> Option<u64> {
        let off = self.addr_to_file_offset(addr)?;
        map_start.checked_add(off.checked_sub(map_offset)?)
    }

    /// Resolves one ELF address (of an instruction: for a return address pass
    /// `ret - 1`), once: later calls return the cached result.
    pub fn resolve(&mut self, addr: u64) -> Arc<Symbolized> {
        if let Some(s) = self.cache.get(&addr) {
            return s.clone();
        }
        let s = Arc::new(self.resolve_uncached(addr));
        self.cache.insert(addr, s.clone());
        s
    }

    /// Resolves many ELF addresses; the result is in the order of `addrs`. Each distinct
    /// address is resolved once (in ascending order, which keeps DWARF units warm).
    pub fn resolve_many(&mut self, addrs: &[u64]) -> Vec<Arc<Symbolized>> {
        let mut todo: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(a))
            .collect();
        todo.sort_unstable();
        todo.dedup();
        self.cache.reserve(todo.len());
        for a in todo {
            let s = Arc::new(self.resolve_uncached(a));
            self.cache.insert(a, s);
        }
        addrs.iter().map(|a| self.resolve(*a)).collect()
    }

    fn resolve_uncached(&mut self, addr: u64) -> Symbolized {
        let mut frames: Vec<(Option<Arc<str>>, Option<SourceLoc>)> = Vec::new();
        // The outermost frame's raw name (the last one seen).
        let mut outer_raw: Option<String> = None;
        if let Some(ctx) = &self.dwarf {
            if let Ok(mut it) = ctx.find_frames(addr).skip_all_loads() {
                while let Ok(Some(f)) = it.next() {
                    let raw = f.function.as_ref().and_then(|n| n.raw_name().ok());
                    outer_raw = raw.as_deref().map(str::to_string);
                    let name = raw.map(|raw| intern_name(&mut self.names, &raw));
                    let loc = f.location.as_ref().and_then(|l| {
                        let file = l.file?;
                        let file = match self.files.get(file) {
                            Some(f) => f.clone(),
                            None => {
                                let a: Arc<str> = Arc::from(file);
                                self.files.insert(file.into(), a.clone());
                                a
                            }
                        };
                        Some(SourceLoc {
                            file,
                            line: l.line.unwrap_or(0),
                            column: l.column.unwrap_or(0),
                        })
                    });
                    frames.push((name, loc));
                }
            }
        }
        let sym = self.symbol_at(addr);
        let fde = self.fde_at(addr);
        let mut dwarf_name = frames.last().and_then(|f| f.0.clone());
        let start = sym.map(|s| s.0).or(fde.map(|f| f.0));
        // A C function's DWARF name may be an internal alias (glibc's `__GI_getaddrinfo`,
        // from an asm label): when it is one of the names of the symbol covering the
        // address, the symbol's best name (perf's choice) names it.
        if let (Some(raw), Some((s, i))) = (outer_raw.as_deref(), sym) {
            let best = &self.syms[i].name;
            let mangled = raw.starts_with("_Z") || raw.starts_with("_R");
            if !mangled
                && raw != &**best
                && self
                    .aliases
                    .get(&s)
                    .is_some_and(|a| a.iter().any(|n| &**n == raw))
            {
                dwarf_name = Some(intern_name(&mut self.names, best));
            }
        }
        let (function, origin, start) = if let Some(n) = dwarf_name {
            (n, NameOrigin::Dwarf, start)
        } else if let Some((s, i)) = sym {
            (
                intern_name(&mut self.names, &self.syms[i].name),
                NameOrigin::Symbol,
                Some(s),
            )
        } else if let Some((s, _)) = fde {
            (self.fallback_name(s), NameOrigin::EhFrame, Some(s))
        } else if let Some(b) = self.boundary_at(addr) {
            (self.fallback_name(b), NameOrigin::Boundary, Some(b))
        } else {
            (self.fallback_name(addr), NameOrigin::Unknown, None)
        };
        let frames = if frames.is_empty() {
            vec![Frame {
                name: function.clone(),
                location: None,
            }]
        } else {
            let n = frames.len();
            frames
                .into_iter()
                .enumerate()
                .map(|(i, (name, location))| Frame {
                    name: if i + 1 == n {
                        function.clone()
                    } else {
                        name.unwrap_or_else(|| Arc::from("[inlined]"))
                    },
                    location,
                })
                .collect()
        };
        Symbolized {
            function,
            start,
            origin,
            frames,
        }
    }

    /// `module+0xOFF` for ELF address `addr` (OFF: its file offset when a PT_LOAD holds
    /// it, else the address), interned.
    fn fallback_name(&mut self, addr: u64) -> Arc<str> {
        if let Some(n) = self.fallback.get(&addr) {
            return n.clone();
        }
        let off = self.addr_to_file_offset(addr).unwrap_or(addr);
        let n: Arc<str> = Arc::from(format!("{}+{off:#x}", self.name));
        self.fallback.insert(addr, n.clone());
        n
    }

    /// The symbol covering `addr`: (start, index in `syms`).
    fn symbol_at(&self, addr: u64) -> Option<(u64, usize)> {
        let i = self
            .syms
            .partition_point(|s| s.start <= addr)
            .checked_sub(1)?;
        let s = &self.syms[i];
        if s.size != 0 {
            return (addr - s.start < s.size).then_some((s.start, i));
        }
        // Size 0: up to the next symbol, within the executable range of its start.
        if self.syms.get(i + 1).is_some_and(|n| n.start <= addr) {
            return None;
        }
        let range = self.exec_range(s.start)?;
        (addr < range.1).then_some((s.start, i))
    }

    fn fde_at(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.fdes.partition_point(|f| f.0 <= addr).checked_sub(1)?;
        let f = self.fdes[i];
        (addr < f.1).then_some(f)
    }

    fn exec_range(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.exec.partition_point(|r| r.0 <= addr).checked_sub(1)?;
        let r = self.exec[i];
        (addr < r.1).then_some(r)
    }

    /// The nearest boundary at or below `addr` inside `addr`'s executable range.
    fn boundary_at(&self, addr: u64) -> Option<u64> {
        let range = self.exec_range(addr)?;
        let i = self.bounds.partition_point(|&b| b <= addr).checked_sub(1)?;
        let b = self.bounds[i];
        (b >= range.0).then_some(b)
    }
}

fn intern_name(names: &mut HashMap<Box<str>, Arc<str>>, raw: &str) -> Arc<str> {
    if let Some(n) = names.get(raw) {
        return n.clone();
    }
    let n: Arc<str> = Arc::from(crate::demangle(raw).as_ref());
    names.insert(raw.into(), n.clone());
    n
}

fn load_dwarf(
    file: &object::File<'_>,
    buf: &Arc<Buf>,
    facts: &elf::Facts,
    path: &Path,
    search: &DebugSearch,
    lookup: &mut DebugLookup,
) -> Option<(addr2line::Context<Reader>, Option<UnitRanges>)> {
    lookup.has_dwarf = false;
    let mut dwarf = match elf::dwarf(file, buf) {
        Ok(d) => d,
        Err(e) => {
            lookup.dwarf_error = Some(e.to_string());
            return None;
        }
    };
    if let Some((name, id)) = &facts.altlink {
        match search.find_sup(path, name, id) {
            Some(found) => match elf::parse(&found.path, found.buf.as_slice()) {
                Ok(sfile) => {
                    if elf::load_sup(&mut dwarf, &sfile, &found.buf).is_ok() {
                        lookup.sup = Some(found.path.clone());
                    }
                }
                Err(e) => lookup.dwarf_error = Some(e.to_string()),
            },
            None => {
                lookup.dwarf_error = Some(format!(
                    "dwz supplementary file {name} (build-id {}) not found",
                    elf::hex(id)
                ));
            }
        }
    }
    let units = unit_ranges(&dwarf);
    match addr2line::Context::from_dwarf(dwarf) {
        Ok(ctx) => {
            lookup.has_dwarf = true;
            Some((ctx, units))
        }
        Err(e) => {
            lookup.dwarf_error = Some(e.to_string());
            None
        }
    }
}

/// ELF address ranges (start, end), sorted and disjoint.
type UnitRanges = Vec<(u64, u64)>;

/// The ELF addresses the compilation units of `dwarf` cover (their root DIEs' ranges),
/// sorted and merged; `None` where a unit cannot be read.
fn unit_ranges(dwarf: &gimli::Dwarf<Reader>) -> Option<UnitRanges> {
    let mut out = Vec::new();
    let mut headers = dwarf.units();
    while let Some(header) = headers.next().ok()? {
        let unit = dwarf.unit(header).ok()?;
        let mut ranges = dwarf.unit_ranges(&unit).ok()?;
        while let Some(r) = ranges.next().ok()? {
            if r.begin < r.end {
                out.push((r.begin, r.end));
            }
        }
    }
    out.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(out.len());
    for (lo, hi) in out {
        match merged.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    Some(merged)
}

/// One symbol per address: the best of the aliases by perf's rules (a sized one over a
/// zero-sized one, non-weak over weak, global over local, fewer leading underscores, the
/// longer name), then the lexicographically smallest, so the choice is stable.
fn best_symbols(mut raw: Vec<RawSym>) -> (Vec<Sym>, HashMap<u64, Vec<Box<str>>>) {
    fn underscores(n: &str) -> usize {
        n.bytes().take_while(|&b| b == b'_').count()
    }
    raw.sort_by(|a, b| {
        a.addr
            .cmp(&b.addr)
            .then((b.size != 0).cmp(&(a.size != 0)))
            .then(a.weak.cmp(&b.weak))
            .then(b.global.cmp(&a.global))
            .then(underscores(&a.name).cmp(&underscores(&b.name)))
            .then(b.name.len().cmp(&a.name.len()))
            .then(a.name.cmp(&b.name))
    });
    let mut syms: Vec<Sym> = Vec::new();
    let mut aliases: HashMap<u64, Vec<Box<str>>> = HashMap::new();
    for r in raw {
        match syms.last() {
            Some(last) if last.start == r.addr => {
                if *last.name != *r.name {
                    aliases
                        .entry(r.addr)
                        .or_default()
                        .push(r.name.into_boxed_str());
                }
            }
            _ => syms.push(Sym {
                start: r.addr,
                size: r.size,
                name: r.name.into_boxed_str(),
            }),
        }
    }
    (syms, aliases)
}

/// A fast hasher for address keys (the cache is hit once per address looked up; the keys
/// are code addresses, no flooding concern). Also for callers' own address caches.
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, x: u64) {
        // Fibonacci hashing; the high bits (which hashbrown uses for its tags) get mixed too.
        let h = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

type AddrHash = std::hash::BuildHasherDefault<AddrHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(addr: u64, size: u64, name: &str, weak: bool, global: bool) -> RawSym {
        RawSym {
            addr,
            size,
            name: name.into(),
            weak,
            global,
        }
    }

    #[test]
    fn aliases_choose_like_perf() {
        let (s, aliases) = best_symbols(vec![
            raw(0x10, 8, "__memcpy_avx_unaligned_erms", false, false),
            raw(0x10, 8, "__memmove_avx_unaligned_erms", false, false),
            raw(0x20, 0, "zero", false, true),
            raw(0x20, 4, "sized", false, false),
            raw(0x30, 4, "weak_one", true, true),
            raw(0x30, 4, "strong", false, false),
            raw(0x40, 4, "__glob", false, true),
            raw(0x40, 4, "loc", false, false),
            raw(0x50, 4, "__x", false, true),
            raw(0x50, 4, "_y", false, true),
        ]);
        let names: Vec<(u64, &str)> = s.iter().map(|s| (s.start, &*s.name)).collect();
        assert_eq!(
            names,
            vec![
                (0x10, "__memmove_avx_unaligned_erms"),
                (0x20, "sized"),
                (0x30, "strong"),
                (0x40, "__glob"),
                (0x50, "_y"),
            ]
        );
        let a: Vec<&str> = aliases[&0x40].iter().map(|n| &**n).collect();
        assert_eq!(a, vec!["loc"]);
        assert_eq!(&*aliases[&0x10][0], "__memcpy_avx_unaligned_erms");
        assert!(!aliases.contains_key(&0x50) || aliases[&0x50] == vec!["__x".into()]);
    }
}
