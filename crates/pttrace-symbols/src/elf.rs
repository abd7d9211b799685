//! What the symbolizer reads from one ELF file: notes, load segments, executable ranges,
//! function symbols, `.eh_frame` function ranges and DWARF sections.

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SectionKind, SymbolKind};

use crate::SymbolError;

/// The bytes of a whole file: mapped, or owned (decompressed sections, bytes handed in).
#[derive(Debug)]
pub(crate) enum Buf {
    Map(memmap2::Mmap),
    Vec(Vec<u8>),
}

impl Buf {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Buf::Map(m) => m,
            Buf::Vec(v) => v,
        }
    }
}

/// Maps a whole file read-only.
pub(crate) fn map_file(path: &Path) -> Result<Arc<Buf>, SymbolError> {
    let f = std::fs::File::open(path).map_err(|e| SymbolError::io(path, &e))?;
    let len = f.metadata().map_err(|e| SymbolError::io(path, &e))?.len();
    if len == 0 {
        // mmap of an empty file fails; an empty buffer parses (and is rejected) the same way.
        return Ok(Arc::new(Buf::Vec(Vec::new())));
    }
    // SAFETY: the mapping is read-only and private and only ever read. A file truncated by
    // another process while mapped could fault; that is the usual caveat of reading
    // binaries and debug files through mmap, as every symbolizer does.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| SymbolError::io(path, &e))?;
    Ok(Arc::new(Buf::Map(map)))
}

/// A range of a shared buffer: what gimli reads DWARF sections from without copying them.
#[derive(Debug, Clone)]
pub(crate) struct Bytes {
    buf: Arc<Buf>,
    start: usize,
    len: usize,
}

impl Bytes {
    fn new(buf: Arc<Buf>, start: usize, len: usize) -> Bytes {
        let total = buf.as_slice().len();
        let start = start.min(total);
        let len = len.min(total - start);
        Bytes { buf, start, len }
    }

    fn empty() -> Bytes {
        Bytes::new(Arc::new(Buf::Vec(Vec::new())), 0, 0)
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf
            .as_slice()
            .get(self.start..self.start + self.len)
            .unwrap_or(&[])
    }
}

// SAFETY: a `Bytes` derefs into the heap buffer or mapping owned by its `Arc<Buf>`, which is
// never mutated, moved or freed while any clone of the `Arc` lives: moving a `Bytes` does not
// move the bytes it points to.
unsafe impl gimli::StableDeref for Bytes {}
// SAFETY: a clone shares the same `Arc<Buf>` and range, so it derefs to the same address.
unsafe impl gimli::CloneStableDeref for Bytes {}

/// The DWARF reader type.
pub(crate) type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

/// One PT_LOAD program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub exec: bool,
}

/// A function symbol, before choosing one name per address.
#[derive(Debug, Clone)]
pub(crate) struct RawSym {
    pub addr: u64,
    pub size: u64,
    pub name: String,
    pub weak: bool,
    pub global: bool,
}

/// Facts about an ELF file that do not borrow it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Facts {
    pub build_id: Option<Vec<u8>>,
    pub debuglink: Option<(String, u32)>,
    /// `.gnu_debugaltlink`: (file name, build-id) of the dwz supplementary file.
    pub altlink: Option<(String, Vec<u8>)>,
    pub loads: Vec<Load>,
    /// Executable sections (or executable PT_LOADs without section headers), sorted.
    pub exec: Vec<(u64, u64)>,
    /// Has a `.debug_info` with contents.
    pub has_dwarf: bool,
    /// Has a `.symtab` with function symbols.
    pub has_symtab: bool,
}

pub(crate) fn parse<'d>(path: &Path, data: &'d [u8]) -> Result<object::File<'d>, SymbolError> {
    let file = object::File::parse(data).map_err(|e| SymbolError::Elf {
        path: path.to_path_buf(),
        msg: format!("not an ELF file: {e}"),
    })?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(SymbolError::Elf {
            path: path.to_path_buf(),
            msg: "not an ELF file".into(),
        });
    }
    Ok(file)
}

pub(crate) fn facts(file: &object::File<'_>) -> Facts {
    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let debuglink = file
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc));
    let altlink = file
        .gnu_debugaltlink()
        .ok()
        .flatten()
        .map(|(name, id)| (String::from_utf8_lossy(name).into_owned(), id.to_vec()));
    let mut loads = Vec::new();
    if let object::File::Elf64(elf) = file {
        use object::read::elf::ProgramHeader;
        let endian = elf.endian();
        for ph in elf.elf_program_headers() {
            if ph.p_type(endian) == object::elf::PT_LOAD {
                loads.push(Load {
                    offset: ph.p_offset(endian),
                    vaddr: ph.p_vaddr(endian),
                    filesz: ph.p_filesz(endian),
                    memsz: ph.p_memsz(endian),
                    exec: ph.p_flags(endian) & object::elf::PF_X != 0,
                });
            }
        }
    } else {
        for seg in file.segments() {
            let (offset, filesz) = seg.file_range();
            loads.push(Load {
                offset,
                vaddr: seg.address(),
                filesz,
                memsz: seg.size(),
                exec: matches!(
                    seg.flags(),
                    object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
                ),
            });
        }
    }
    let mut exec: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text && s.size() > 0 && s.address() != 0)
        .map(|s| (s.address(), s.address().saturating_add(s.size())))
        .collect();
    if exec.is_empty() {
        exec = loads
            .iter()
            .filter(|l| l.exec && l.memsz > 0)
            .map(|l| (l.vaddr, l.vaddr.saturating_add(l.memsz)))
            .collect();
    }
    exec.sort_unstable();
    let has_dwarf = file
        .section_by_name(".debug_info")
        .is_some_and(|s| s.kind() != SectionKind::UninitializedData && s.size() > 0);
    let has_symtab = file
        .symbols()
        .any(|s| s.kind() == SymbolKind::Text && s.address() != 0);
    Facts {
        build_id,
        debuglink,
        altlink,
        loads,
        exec,
        has_dwarf,
        has_symtab,
    }
}

/// The function symbols of `.symtab` and `.dynsym`, and the untyped labels of code
/// sections that no function symbol covers (assembly entry points such as ld.so's
/// `_start`, which would otherwise be named after the code before them).
pub(crate) fn symbols(file: &object::File<'_>, out: &mut Vec<RawSym>) {
    let mut funcs: Vec<(u64, u64)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0 && !s.is_undefined())
        .map(|s| (s.address(), s.address().saturating_add(s.size())))
        .collect();
    funcs.sort_unstable();
    // The furthest end of the functions starting at or before each one.
    let mut reach = 0;
    let funcs: Vec<(u64, u64)> = funcs
        .into_iter()
        .map(|(a, e)| {
            reach = reach.max(e);
            (a, reach)
        })
        .collect();
    let inside_function = |addr: u64| {
        let i = funcs.partition_point(|f| f.0 <= addr);
        i > 0 && funcs[i - 1].1 > addr
    };
    // An executable section (also the NOBITS copy of `.text` in a separate debug file).
    let in_code = |s: &object::Symbol<'_, '_>| {
        s.section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .is_some_and(|sec| match sec.flags() {
                object::SectionFlags::Elf { sh_flags } => {
                    sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0
                }
                _ => sec.kind() == SectionKind::Text,
            })
    };
    for s in file.symbols().chain(file.dynamic_symbols()) {
        if s.address() == 0 || s.is_undefined() {
            continue;
        }
        let label = s.kind() == SymbolKind::Unknown && in_code(&s) && !inside_function(s.address());
        if s.kind() != SymbolKind::Text && !label {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        // A versioned definition (`__libc_start_main@@GLIBC_2.34`) names the function
        // without its version, as perf shows it.
        let name = match name.find('@') {
            Some(i) if i > 0 => &name[..i],
            _ => name,
        };
        if name.is_empty() {
            continue;
        }
        out.push(RawSym {
            addr: s.address(),
            size: s.size(),
            name: name.to_string(),
            weak: s.is_weak(),
            global: s.is_global(),
        });
    }
}

/// Whether `file` is a library: it has a `DT_SONAME` (64-bit files, as the rest of this
/// crate: `Elf64_Dyn` is d_tag, d_val).
pub(crate) fn has_soname(file: &object::File<'_>) -> bool {
    const DT_SONAME: i64 = 14;
    let Some(data) = file.section_by_name(".dynamic").and_then(|d| d.data().ok()) else {
        return false;
    };
    let le = file.is_little_endian();
    data.chunks_exact(16).any(|d| {
        let tag: Option<[u8; 8]> = d.get(..8).and_then(|b| b.try_into().ok());
        tag.is_some_and(|b| {
            let tag = if le {
                u64::from_le_bytes(b)
            } else {
                u64::from_be_bytes(b)
            };
            tag as i64 == DT_SONAME
        })
    })
}

/// `_start` at a program's entry point `entry` (the ELF header's `e_entry`) when no
/// symbol is there: a stripped executable's first function, where every process of it
/// starts. Only for programs: not for a `library` (one with a `DT_SONAME`: libc's entry
/// point prints its version; ld.so names its own `_start`).
pub(crate) fn entry_symbol(
    entry: u64,
    library: bool,
    raw: &[RawSym],
    fdes: &[(u64, u64)],
) -> Option<RawSym> {
    if entry == 0
        || library
        || raw
            .iter()
            .any(|r| r.addr <= entry && entry < r.addr.saturating_add(r.size.max(1)))
    {
        return None;
    }
    // Its size: its `.eh_frame` range, else up to the next function known (a symbol or
    // an FDE), else none (a name for the entry alone).
    let next = fdes
        .iter()
        .map(|f| f.0)
        .chain(raw.iter().map(|r| r.addr))
        .filter(|&a| a > entry)
        .min();
    let size = match fdes.iter().find(|f| f.0 == entry) {
        Some(f) => f.1 - f.0,
        None => next.map_or(1, |n| n - entry),
    };
    Some(RawSym {
        addr: entry,
        size,
        name: "_start".to_string(),
        weak: true,
        global: false,
    })
}

/// Function ranges `[start, end)` of the `.eh_frame` FDEs, sorted by start.
pub(crate) fn fde_ranges(file: &object::File<'_>) -> Vec<(u64, u64)> {
    use gimli::UnwindSection;
    let Some(sec) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = sec.uncompressed_data() else {
        return Vec::new();
    };
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut eh = gimli::EhFrame::new(&data, endian);
    eh.set_address_size(if file.is_64() { 8 } else { 4 });
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    // A malformed entry ends the walk: the ranges read so far are still good.
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry {
            let Ok(fde) = partial.parse(|sec, bases, off| sec.cie_from_offset(bases, off)) else {
                continue;
            };
            let (start, len) = (fde.initial_address(), fde.len());
            if start != 0 && len != 0 {
                out.push((start, start.saturating_add(len)));
            }
        }
    }
    out.sort_unstable();
    out
}

/// The DWARF sections of `file` (whose bytes are `buf`), decompressed where needed.
pub(crate) fn dwarf(
    file: &object::File<'_>,
    buf: &Arc<Buf>,
) -> Result<gimli::Dwarf<Reader>, gimli::Error> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let base = buf.as_slice().as_ptr() as usize;
    let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        let bytes = match file.section_by_name(id.name()) {
            Some(sec) if sec.kind() != SectionKind::UninitializedData => {
                match sec.uncompressed_data() {
                    Ok(std::borrow::Cow::Borrowed(b)) => {
                        // Borrowed data lies inside `buf`: refer to it there, uncopied.
                        let start = (b.as_ptr() as usize).wrapping_sub(base);
                        let inside = start
                            .checked_add(b.len())
                            .is_some_and(|end| end <= buf.as_slice().len());
                        if inside {
                            Bytes::new(buf.clone(), start, b.len())
                        } else {
                            Bytes::new(Arc::new(Buf::Vec(b.to_vec())), 0, b.len())
                        }
                    }
                    Ok(std::borrow::Cow::Owned(v)) => {
                        let len = v.len();
                        Bytes::new(Arc::new(Buf::Vec(v)), 0, len)
                    }
                    Err(_) => Bytes::empty(),
                }
            }
            _ => Bytes::empty(),
        };
        Ok(gimli::EndianReader::new(bytes, endian))
    };
    gimli::Dwarf::load(load)
}

/// Loads the sections of a dwz supplementary file into `dwarf.sup`.
pub(crate) fn load_sup(
    dwarf: &mut gimli::Dwarf<Reader>,
    file: &object::File<'_>,
    buf: &Arc<Buf>,
) -> Result<(), gimli::Error> {
    let sup = self::dwarf(file, buf)?;
    dwarf.set_sup(sup);
    Ok(())
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
