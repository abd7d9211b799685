//! Symbolizer for pttrace: names as good as perf's.
//!
//! * **Debug info** ([`DebugSearch`]): the file's own DWARF, separate debug files by build-id
//!   (`ROOT/.build-id/xx/rest.debug`), by `.gnu_debuglink` (CRC32 checked), the debuginfod
//!   client caches, and caller-given `--debug-dir`s; dwz supplementary files
//!   (`.gnu_debugaltlink`); compressed debug sections. [`DebugLookup`] says where it came
//!   from, and [`DebugLookup::describe`] / [`debian_debug_package`] word it for the user.
//! * **Addresses** ([`Module`], [`Symbolizer`]): the function (DWARF subprogram, else the
//!   best ELF symbol of the debug file's and the binary's `.symtab` and `.dynsym`), its
//!   inlined frames innermost first, and file:line. Names are demangled as perf prints them
//!   ([`demangle`]). A function without any name gets one stable name, `module+0xOFF`, from
//!   its `.eh_frame` FDE start, else from the nearest preceding symbol/FDE/section boundary.
//!   Each distinct address is resolved once per module (cached); [`Module::resolve_many`]
//!   resolves a batch in address order.
//! * **JIT code** ([`PerfMap`], [`JitDump`]): `/tmp/perf-PID.map` and `jit-PID.dump`.
//!
//! # Address convention
//!
//! [`Module`] takes **ELF addresses**: the virtual addresses of the file's own section
//! headers, symbols and DWARF (link-time addresses; for a PIE or shared library, the
//! offset from its load base, usually equal to the file offset in the text). A run-time
//! address in a mapping `start-end` with file offset `pgoff` (from `/proc/PID/maps` or a
//! perf MMAP record) becomes one with [`Module::runtime_to_addr`]; file offsets with
//! [`Module::file_offset_to_addr`]. Names of unnamed code, `module+0xOFF`, give the *file
//! offset* (as `pttrace view` already names unknown code).
//!
//! # Why addr2line + gimli + object
//!
//! `object` 0.36 is what the workspace already parses ELF with; `addr2line` 0.24 and
//! `gimli` 0.31 are the versions built on that same `object` (one copy in the build), are
//! what Rust's own backtraces use, and give inlined frames and lines lazily per unit.
//! `blazesym` would also symbolize ELF/DWARF and perf maps, but carries its own ELF and
//! DWARF stack (a second `gimli`), has no jitdump reader, and hides the debug-file search
//! (no say over the order, the extra directories, or a report of where the DWARF came
//! from), which pttrace needs for its messages. Demangling uses `rustc-demangle` (the
//! Rust project's demangler, legacy and v0) and `cpp_demangle` (the gimli project's
//! Itanium demangler); `crc32fast` checks `.gnu_debuglink` CRCs (and is already pulled in
//! by `object`'s decompression).

mod demangle;
mod elf;
mod jit;
mod module;
mod search;
mod v8;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use demangle::demangle;
pub use jit::{
    JitCodeLoad, JitCodeMove, JitDebugEntry, JitDump, JitDumpHeader, JitHit, JitSymbol,
    JitUnwindingInfo, PerfMap, Truncation, JITDUMP_MAGIC, JIT_CODE_CLOSE, JIT_CODE_DEBUG_INFO,
    JIT_CODE_LOAD, JIT_CODE_MOVE, JIT_CODE_UNWINDING_INFO,
};
pub use module::{AddrHasher, Frame, LineRow, Module, NameOrigin, SourceLoc, Symbolized};
pub use search::{
    build_id_path, debian_debug_package, prepare_debian_packages, DebugLookup, DebugSearch,
    DebugSource,
};
pub use v8::EmbeddedBlob;

/// Errors: files that cannot be read, are not ELF, or do not parse.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SymbolError {
    /// A file could not be opened, read or mapped.
    #[error("{}: {msg}", path.display())]
    Io { path: PathBuf, msg: String },
    /// Not a usable ELF file.
    #[error("{}: {msg}", path.display())]
    Elf { path: PathBuf, msg: String },
    /// A perf map or jitdump that does not parse, at a byte offset (and line, for maps).
    #[error("{}: byte offset {offset}{}: {msg}", path.display(), line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Format {
        path: PathBuf,
        offset: u64,
        line: Option<usize>,
        msg: String,
    },
}

impl SymbolError {
    pub(crate) fn io(path: &Path, e: &std::io::Error) -> SymbolError {
        SymbolError::Io {
            path: path.to_path_buf(),
            msg: e.to_string(),
        }
    }
}

/// Modules by path, each opened once on first use (a failure is remembered too), each
/// with a number that finds it again without its path ([`Symbolizer::module_id`]).
#[derive(Debug, Default)]
pub struct Symbolizer {
    search: DebugSearch,
    /// The modules (or why each could not be opened), by number.
    modules: Vec<Result<Module, SymbolError>>,
    /// Module numbers by path. (Keyed by the path's bytes, which hash cheaply where a
    /// `Path` hashes component by component; a path is copied only on its first use.)
    ids: rustc_hash::FxHashMap<OsString, usize>,
}

impl Symbolizer {
    /// A symbolizer that finds debug files with `search`.
    pub fn new(search: DebugSearch) -> Self {
        Symbolizer {
            search,
            modules: Vec::new(),
            ids: rustc_hash::FxHashMap::default(),
        }
    }

    /// The debug-file search in use.
    pub fn search(&self) -> &DebugSearch {
        &self.search
    }

    /// The number of the module for the ELF file at `path` (opened on first use), for
    /// [`Self::module_by_id`]: a caller that names many addresses of one mapping looks
    /// its path up once.
    pub fn module_id(&mut self, path: &Path) -> usize {
        let key = path.as_os_str();
        if let Some(&id) = self.ids.get(key) {
            return id;
        }
        let id = self.modules.len();
        self.modules.push(Module::open(path, &self.search));
        self.ids.insert(key.to_os_string(), id);
        id
    }

    /// The module numbered `id` ([`Self::module_id`]); `None` where it could not be opened
    /// (or no module has that number).
    pub fn module_by_id(&mut self, id: usize) -> Option<&mut Module> {
        self.modules.get_mut(id)?.as_mut().ok()
    }

    /// The module for the ELF file at `path`, opened on first use.
    pub fn module(&mut self, path: &Path) -> Result<&mut Module, SymbolError> {
        let id = self.module_id(path);
        match self.modules.get_mut(id) {
            Some(m) => m.as_mut().map_err(|e| e.clone()),
            None => Err(SymbolError::Io {
                path: path.to_path_buf(),
                msg: "not opened".into(),
            }),
        }
    }

    /// Resolves ELF address `addr` of the file at `path`.
    pub fn resolve(&mut self, path: &Path, addr: u64) -> Result<Arc<Symbolized>, SymbolError> {
        Ok(self.module(path)?.resolve(addr))
    }

    /// Resolves many ELF addresses of the file at `path` (in the order given).
    pub fn resolve_many(
        &mut self,
        path: &Path,
        addrs: &[u64],
    ) -> Result<Vec<Arc<Symbolized>>, SymbolError> {
        Ok(self.module(path)?.resolve_many(addrs))
    }

    /// The modules opened successfully so far.
    pub fn modules(&self) -> impl Iterator<Item = &Module> {
        self.modules.iter().filter_map(|m| m.as_ref().ok())
    }
}
