//! Finding the debug info of an ELF file.
//!
//! In order (the first hit wins):
//! 1. the file's own DWARF (a `.debug_info` with contents);
//! 2. by build-id (`NT_GNU_BUILD_ID`): `ROOT/.build-id/xx/rest.debug`, for each extra
//!    debug dir, then each build-id root (default `/usr/lib/debug`);
//! 3. by `.gnu_debuglink` (file name + CRC32 of the debug file, checked): beside the binary,
//!    in `<binary dir>/.debug/`, in each extra debug dir (`DIR/name` and
//!    `DIR/<binary dir>/name`), then `ROOT/<binary dir>/name` for each root;
//! 4. the debuginfod client caches: `CACHE/<build-id>/debuginfo` for
//!    `$DEBUGINFOD_CACHE_PATH`, `$XDG_CACHE_HOME/debuginfod_client` and
//!    `$HOME/.cache/debuginfod_client`.
//!
//! A candidate whose build-id differs from the binary's, or whose CRC32 differs from the
//! debuglink's, is rejected (and listed in [`DebugLookup::rejected`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::elf::{self, Buf};

/// Where to look for separate debug files.
#[derive(Debug, Clone, Default)]
pub struct DebugSearch {
    extra_dirs: Vec<PathBuf>,
    roots: Vec<PathBuf>,
    debuginfod_caches: Vec<PathBuf>,
}

/// Where the DWARF of a module came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebugSource {
    /// The file's own `.debug_info`.
    Embedded,
    /// A separate file found by build-id under a `.build-id` directory.
    BuildId(PathBuf),
    /// A separate file named by `.gnu_debuglink` (CRC checked).
    DebugLink(PathBuf),
    /// A file in a debuginfod client cache.
    Debuginfod(PathBuf),
    /// No DWARF found.
    None,
}

/// The result of a debug-info search for one ELF file.
#[derive(Debug, Clone)]
pub struct DebugLookup {
    /// Where the DWARF (or the debug file's symbols) comes from.
    pub source: DebugSource,
    /// The binary's build-id, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// The binary's `.gnu_debuglink`: (file name, CRC32).
    pub debuglink: Option<(String, u32)>,
    /// The binary has its own `.symtab` function symbols.
    pub has_symtab: bool,
    /// The chosen file (the binary itself for [`DebugSource::Embedded`]) has DWARF.
    pub has_dwarf: bool,
    /// Candidates that existed but were rejected, with the reason.
    pub rejected: Vec<(PathBuf, String)>,
    /// The dwz supplementary file (`.gnu_debugaltlink`) used, if any.
    pub sup: Option<PathBuf>,
    /// A reason the DWARF could not be used, if it could not.
    pub dwarf_error: Option<String>,
}

/// A debug file found (mapped), with its provenance.
pub(crate) struct Found {
    pub path: PathBuf,
    pub buf: Arc<Buf>,
}

impl DebugSearch {
    /// The system defaults: build-id root `/usr/lib/debug` and the debuginfod client caches
    /// (`$DEBUGINFOD_CACHE_PATH`, `$XDG_CACHE_HOME/debuginfod_client`,
    /// `$HOME/.cache/debuginfod_client`).
    pub fn new() -> Self {
        let mut s = DebugSearch::empty();
        s.add_root("/usr/lib/debug");
        if let Some(p) = std::env::var_os("DEBUGINFOD_CACHE_PATH").filter(|p| !p.is_empty()) {
            s.add_debuginfod_cache(p);
        }
        if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
            s.add_debuginfod_cache(Path::new(&p).join("debuginfod_client"));
        }
        if let Some(p) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
            s.add_debuginfod_cache(Path::new(&p).join(".cache/debuginfod_client"));
        }
        s
    }

    /// Nothing but the file's own DWARF (add directories to it).
    pub fn empty() -> Self {
        DebugSearch::default()
    }

    /// A `--debug-dir DIR`: searched first, as a build-id root (`DIR/.build-id/xx/rest.debug`)
    /// and for the debuglink name (`DIR/name`, `DIR/<binary dir>/name`).
    pub fn add_debug_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        push_unique(&mut self.extra_dirs, dir.into());
        self
    }

    /// A global debug root like `/usr/lib/debug` (build-id and `ROOT/<binary dir>/name`).
    pub fn add_root(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        push_unique(&mut self.roots, dir.into());
        self
    }

    /// A debuginfod client cache directory (`CACHE/<build-id>/debuginfo`).
    pub fn add_debuginfod_cache(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        push_unique(&mut self.debuginfod_caches, dir.into());
        self
    }

    /// The extra debug dirs, in search order.
    pub fn debug_dirs(&self) -> &[PathBuf] {
        &self.extra_dirs
    }

    /// Finds the debug info of the ELF file at `path` whose bytes are `data` (see the
    /// module doc for the order).
    pub fn find(&self, path: &Path, data: &[u8]) -> DebugLookup {
        let facts = elf::parse(path, data)
            .map(|f| elf::facts(&f))
            .unwrap_or_default();
        self.find_with(path, &facts).0
    }

    /// [`DebugSearch::find`] for the ELF file at `path` (mapped, not read); an error for a
    /// file that cannot be mapped or is not ELF. Only the search: no symbols or DWARF are
    /// loaded (what [`crate::Module::open`] adds).
    pub fn find_file(&self, path: &Path) -> Result<DebugLookup, crate::SymbolError> {
        let buf = elf::map_file(path)?;
        let file = elf::parse(path, buf.as_slice())?;
        Ok(self.find_with(path, &elf::facts(&file)).0)
    }

    pub(crate) fn find_with(
        &self,
        path: &Path,
        facts: &elf::Facts,
    ) -> (DebugLookup, Option<Found>) {
        let mut lookup = DebugLookup {
            source: DebugSource::None,
            build_id: facts.build_id.clone(),
            debuglink: facts.debuglink.clone(),
            has_symtab: facts.has_symtab,
            has_dwarf: false,
            rejected: Vec::new(),
            sup: None,
            dwarf_error: None,
        };
        if facts.has_dwarf {
            lookup.source = DebugSource::Embedded;
            lookup.has_dwarf = true;
            return (lookup, None);
        }
        let want_id = facts.build_id.as_deref().filter(|id| id.len() >= 2);
        // 2. build-id.
        if let Some(id) = want_id {
            for root in self.extra_dirs.iter().chain(&self.roots) {
                let cand = build_id_path(root, id);
                if let Some(found) = check(&cand, want_id, None, &mut lookup, true) {
                    lookup.source = DebugSource::BuildId(cand);
                    return (lookup, Some(found));
                }
            }
        }
        // 3. .gnu_debuglink.
        if let Some((name, crc)) = &facts.debuglink {
            let name_path = Path::new(name);
            // A debuglink is a bare file name; anything else is not looked up.
            let plain = name_path
                .file_name()
                .is_some_and(|f| f == name_path.as_os_str());
            if plain {
                for cand in self.debuglink_candidates(path, name) {
                    if let Some(found) = check(&cand, want_id, Some(*crc), &mut lookup, true) {
                        lookup.source = DebugSource::DebugLink(cand);
                        return (lookup, Some(found));
                    }
                }
            }
        }
        // 4. debuginfod caches.
        if let Some(id) = want_id {
            for cache in &self.debuginfod_caches {
                let cand = cache.join(elf::hex(id)).join("debuginfo");
                if let Some(found) = check(&cand, want_id, None, &mut lookup, true) {
                    lookup.source = DebugSource::Debuginfod(cand);
                    return (lookup, Some(found));
                }
            }
        }
        (lookup, None)
    }

    /// Where a debuglink `name` of the binary at `path` may be, in search order.
    fn debuglink_candidates(&self, path: &Path, name: &str) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(d) = path.parent() {
            push_unique(&mut dirs, d.to_path_buf());
        }
        if let Some(d) = std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            push_unique(&mut dirs, d);
        }
        let mut out = Vec::new();
        for d in &dirs {
            push_unique(&mut out, d.join(name));
            push_unique(&mut out, d.join(".debug").join(name));
        }
        for extra in &self.extra_dirs {
            push_unique(&mut out, extra.join(name));
            for d in &dirs {
                push_unique(&mut out, under(extra, d).join(name));
            }
        }
        for root in &self.roots {
            for d in &dirs {
                push_unique(&mut out, under(root, d).join(name));
            }
        }
        // The binary itself is never its own debug file.
        out.retain(|c| c != path);
        out
    }

    /// Finds a dwz supplementary file named by `.gnu_debugaltlink` (`name`, `id`) of the
    /// debug file at `debug_path`.
    pub(crate) fn find_sup(&self, debug_path: &Path, name: &str, id: &[u8]) -> Option<Found> {
        let mut cands = Vec::new();
        let p = Path::new(name);
        if p.is_absolute() {
            cands.push(p.to_path_buf());
        } else if let Some(d) = debug_path.parent() {
            cands.push(d.join(p));
        }
        if id.len() >= 2 {
            for root in self.extra_dirs.iter().chain(&self.roots) {
                cands.push(build_id_path(root, id));
            }
        }
        let mut scratch = DebugLookup {
            source: DebugSource::None,
            build_id: None,
            debuglink: None,
            has_symtab: false,
            has_dwarf: false,
            rejected: Vec::new(),
            sup: None,
            dwarf_error: None,
        };
        cands
            .into_iter()
            .find_map(|c| check(&c, Some(id), None, &mut scratch, false))
    }
}

/// `ROOT/.build-id/xx/rest.debug`.
pub fn build_id_path(root: &Path, id: &[u8]) -> PathBuf {
    let hex = elf::hex(id);
    let (head, rest) = hex.split_at(2.min(hex.len()));
    root.join(".build-id")
        .join(head)
        .join(format!("{rest}.debug"))
}

/// `root` joined with the absolute `dir` (its leading `/` dropped).
fn under(root: &Path, dir: &Path) -> PathBuf {
    let rel: PathBuf = dir
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    root.join(rel)
}

fn push_unique(v: &mut Vec<PathBuf>, p: PathBuf) {
    if !v.contains(&p) {
        v.push(p);
    }
}

/// Maps `cand` if it is a usable debug file for a binary with build-id `want_id` and
/// debuglink CRC `crc` (and, with `need_debug`, has DWARF or symbols); otherwise records
/// why not in `lookup.rejected` (when it exists).
fn check(
    cand: &Path,
    want_id: Option<&[u8]>,
    crc: Option<u32>,
    lookup: &mut DebugLookup,
    need_debug: bool,
) -> Option<Found> {
    if !cand.is_file() {
        return None;
    }
    let reject = |lookup: &mut DebugLookup, why: String| {
        lookup.rejected.push((cand.to_path_buf(), why));
        None
    };
    let buf = match elf::map_file(cand) {
        Ok(b) => b,
        Err(e) => return reject(lookup, e.to_string()),
    };
    if let Some(crc) = crc {
        let got = crc32fast::hash(buf.as_slice());
        if got != crc {
            return reject(
                lookup,
                format!("CRC32 {got:08x} differs from the debuglink's {crc:08x}"),
            );
        }
    }
    let file = match elf::parse(cand, buf.as_slice()) {
        Ok(f) => f,
        Err(e) => return reject(lookup, e.to_string()),
    };
    let facts = elf::facts(&file);
    if let (Some(want), Some(got)) = (want_id, facts.build_id.as_deref()) {
        if want != got {
            return reject(
                lookup,
                format!("build-id {} differs from {}", elf::hex(got), elf::hex(want)),
            );
        }
    }
    // (A dwz supplementary file may hold nothing but shared strings.)
    if need_debug && !facts.has_dwarf && !facts.has_symtab {
        return reject(lookup, "has neither DWARF nor symbols".into());
    }
    lookup.has_dwarf = facts.has_dwarf;
    drop(file);
    Some(Found {
        path: cand.to_path_buf(),
        buf,
    })
}

impl DebugLookup {
    /// The separate debug file used, if any.
    pub fn debug_file(&self) -> Option<&Path> {
        match &self.source {
            DebugSource::BuildId(p) | DebugSource::DebugLink(p) | DebugSource::Debuginfod(p) => {
                Some(p)
            }
            DebugSource::Embedded | DebugSource::None => None,
        }
    }

    /// The build-id in hex, if any.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id.as_deref().map(elf::hex)
    }

    /// One line for the user about `module`'s debug info, e.g.
    /// `libc.so.6: DWARF from /usr/lib/debug/.build-id/93/ac61….debug (build-id)` or
    /// `python3.11: stripped, no debug file for build-id 1234…`.
    pub fn describe(&self, module: &str) -> String {
        let short = |id: &str| {
            if id.len() > 12 {
                format!("{}…", &id[..12])
            } else {
                id.to_string()
            }
        };
        let what = if self.has_dwarf { "DWARF" } else { "symbols" };
        let mut s = match &self.source {
            DebugSource::Embedded => format!("{module}: DWARF in the file itself"),
            DebugSource::BuildId(p) => format!("{module}: {what} from {} (build-id)", p.display()),
            DebugSource::DebugLink(p) => {
                format!("{module}: {what} from {} (.gnu_debuglink)", p.display())
            }
            DebugSource::Debuginfod(p) => {
                format!("{module}: {what} from {} (debuginfod cache)", p.display())
            }
            DebugSource::None => {
                let state = if self.has_symtab {
                    "no DWARF, names from .symtab"
                } else {
                    "stripped"
                };
                match self.build_id_hex() {
                    Some(id) => format!(
                        "{module}: {state}, no debug file for build-id {}",
                        short(&id)
                    ),
                    None => format!("{module}: {state}, no build-id and no debug file"),
                }
            }
        };
        if let Some(e) = &self.dwarf_error {
            s.push_str(&format!(" (DWARF unusable: {e})"));
        }
        for (p, why) in &self.rejected {
            s.push_str(&format!("; rejected {}: {why}", p.display()));
        }
        s
    }
}

/// The Debian package to install for `binary`'s debug info (`libc6-dbg` for glibc's
/// files, `PKG-dbgsym` for others), found from dpkg's file lists; `None` when no installed
/// package owns the file.
pub fn debian_debug_package(binary: &Path) -> Option<String> {
    let mut names: Vec<String> = vec![binary.display().to_string()];
    if let Ok(c) = std::fs::canonicalize(binary) {
        names.push(c.display().to_string());
    }
    // /usr-merged systems list files under either /lib or /usr/lib.
    for n in names.clone() {
        if let Some(rest) = n.strip_prefix("/usr") {
            names.push(rest.to_string());
        } else if n.starts_with('/') {
            names.push(format!("/usr{n}"));
        }
    }
    let lists = dpkg_lists();
    let pkg = names.iter().find_map(|n| lists.owner(n))?;
    Some(match pkg {
        "libc6" => "libc6-dbg".to_string(),
        other => format!("{other}-dbgsym"),
    })
}

/// Reads dpkg's file lists now (on the calling thread), so that
/// [`debian_debug_package`] answers at once later: for a thread of its own while other
/// work goes on.
pub fn prepare_debian_packages() {
    dpkg_lists();
}

/// dpkg's file lists (`/var/lib/dpkg/info/PKG[:ARCH].list`), read once per process (a
/// trace names the same files for every process image): each list's text after its
/// package's name and a newline, one after the other. A file's owner is found by
/// searching the text for its line: a few files are asked about, and some 140,000 lines
/// (on a small Debian system) put in a map made `pttrace report` of a short trace take
/// 0.05 s instead of 0.03 s.
struct DpkgLists {
    /// `\n`, then per list: the package's name, `\n`, the list's lines, each ending in
    /// `\n` (a name's line is no file name: file names start with '/').
    text: String,
    /// Where each list's text ends, and its package's name.
    ends: Vec<(usize, std::ops::Range<usize>)>,
}

impl DpkgLists {
    fn new() -> Self {
        DpkgLists {
            text: String::from("\n"),
            ends: Vec::new(),
        }
    }

    /// Adds package `name`'s list, read by `read` (appending it to the string it is
    /// given); a list that cannot be read is left out.
    fn push(&mut self, name: &str, read: impl FnOnce(&mut String) -> std::io::Result<usize>) {
        let start = self.text.len();
        self.text.push_str(name);
        let name = start..self.text.len();
        self.text.push('\n');
        if read(&mut self.text).is_err() {
            self.text.truncate(start);
            return;
        }
        if !self.text.ends_with('\n') {
            self.text.push('\n');
        }
        // (Its last newline: a line of this list ends there at the latest.)
        self.ends.push((self.text.len() - 1, name));
    }

    /// The package whose list holds `path` (the first one, in the order they were read);
    /// `path` is absolute (a package's name, on a line of its own too, never is).
    fn owner(&self, path: &str) -> Option<&str> {
        if !path.starts_with('/') || path.contains('\n') {
            return None;
        }
        let at = self.text.find(&format!("\n{path}\n"))?;
        let k = self.ends.partition_point(|(end, _)| *end <= at);
        let (_, name) = self.ends.get(k)?;
        self.text.get(name.clone())
    }
}

fn dpkg_lists() -> &'static DpkgLists {
    static LISTS: std::sync::OnceLock<DpkgLists> = std::sync::OnceLock::new();
    LISTS.get_or_init(|| {
        let mut lists = DpkgLists::new();
        let Ok(dir) = std::fs::read_dir("/var/lib/dpkg/info") else {
            return lists;
        };
        for e in dir.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("list") {
                continue;
            }
            let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            lists.push(stem.split(':').next().unwrap_or(stem), |text| {
                std::fs::File::open(&p)
                    .and_then(|mut f| std::io::Read::read_to_string(&mut f, text))
            });
        }
        lists
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's owner is the first list holding its whole line: at a list's start or end,
    /// in the last list, not a prefix or suffix of another file's name nor a package's
    /// name; a list that cannot be read or lacks its last newline changes nothing else.
    #[test]
    fn dpkg_lists_name_the_first_package_holding_a_file() {
        let mut l = DpkgLists::new();
        let list = |s: &'static str| {
            move |t: &mut String| -> std::io::Result<usize> {
                t.push_str(s);
                Ok(s.len())
            }
        };
        l.push(
            "libfoo1",
            list("/.\n/usr/lib/libfoo.so.1\n/usr/lib/libfoo.so.1.2\n"),
        );
        l.push("broken", |_| Err(std::io::Error::other("unreadable")));
        l.push(
            "bar",
            list("/usr/bin/bar\n/usr/lib/libfoo.so.1\n/usr/bin/bar2"),
        );
        l.push("python3.11-minimal", list("/usr/bin/python3.11"));
        assert_eq!(l.owner("/usr/lib/libfoo.so.1"), Some("libfoo1"));
        assert_eq!(l.owner("/usr/lib/libfoo.so.1.2"), Some("libfoo1"));
        assert_eq!(l.owner("/usr/bin/bar"), Some("bar"));
        assert_eq!(l.owner("/usr/bin/bar2"), Some("bar"));
        assert_eq!(l.owner("/usr/bin/python3.11"), Some("python3.11-minimal"));
        for absent in [
            "/usr/lib/libfoo.so",
            "/usr/bin/ba",
            "bar",
            "broken",
            "",
            "/usr/bin/bar\n/usr/lib/libfoo.so.1",
        ] {
            assert_eq!(l.owner(absent), None, "{absent:?}");
        }
    }
}
