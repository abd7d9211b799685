//! Code images: which bytes live at which virtual address.
//!
//! An [`AddressSpace`] is a sorted set of non-overlapping [`Segment`]s. Adding a segment
//! that overlaps existing ones shrinks or splits them (a later mapping replaces the earlier
//! code, exactly like libipt's `pt_image_add_file`). Sources: ELF executables (their
//! executable PT_LOAD segments at a base), raw bytes at an address (the vDSO), kcore (all
//! PT_LOAD segments at their kernel addresses) and plain file ranges (perf MMAP records).
//! Symbols come from ELF symbol tables and `kallsyms`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;

use super::DecodeError;

/// Where a segment's bytes come from.
#[derive(Debug)]
pub enum Backing {
    /// A memory-mapped file.
    File { path: PathBuf, map: memmap2::Mmap },
    /// Bytes held in memory (e.g. a saved vDSO).
    Bytes { name: String, bytes: Vec<u8> },
}

impl Backing {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Backing::File { map, .. } => map,
            Backing::Bytes { bytes, .. } => bytes,
        }
    }

    /// The file path, when the bytes come from a file (libipt can then map it itself).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Backing::File { path, .. } => Some(path),
            Backing::Bytes { .. } => None,
        }
    }

    pub fn name(&self) -> String {
        match self {
            Backing::File { path, .. } => path.display().to_string(),
            Backing::Bytes { name, .. } => name.clone(),
        }
    }

    /// Maps a whole file read-only.
    pub fn map_file(path: &Path) -> Result<Arc<Backing>, DecodeError> {
        let f = std::fs::File::open(path)
            .map_err(|e| DecodeError::whole(path.display(), format!("cannot open image: {e}")))?;
        // SAFETY: the mapping is read-only and private; we only read it. A concurrent
        // truncation of the file by another process could fault, which is the documented
        // caveat of decoding from files that are being modified.
        let map = unsafe { memmap2::Mmap::map(&f) }
            .map_err(|e| DecodeError::new(path.display(), 0, format!("cannot map image: {e}")))?;
        Ok(Arc::new(Backing::File {
            path: path.to_path_buf(),
            map,
        }))
    }
}

/// `len` bytes of `backing` starting at `offset`, loaded at `start`.
#[derive(Debug, Clone)]
pub struct Segment {
    pub start: u64,
    pub len: u64,
    pub backing: Arc<Backing>,
    pub offset: u64,
}

impl Segment {
    /// A segment clipped to the bytes `backing` really has; `None` when empty.
    pub fn new(start: u64, len: u64, backing: Arc<Backing>, offset: u64) -> Option<Segment> {
        let avail = (backing.bytes().len() as u64).saturating_sub(offset);
        let len = len.min(avail).min(u64::MAX - start);
        (len > 0).then_some(Segment {
            start,
            len,
            backing,
            offset,
        })
    }

    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    /// The segment's bytes.
    pub fn bytes(&self) -> &[u8] {
        let data = self.backing.bytes();
        let (o, l) = (self.offset as usize, self.len as usize);
        data.get(o..o.saturating_add(l)).unwrap_or(&[])
    }
}

/// A generation number no address space of this process has had (caches keyed by it are
/// valid for every clone of a space until one of them changes).
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Non-overlapping segments sorted by address.
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    segs: Vec<Segment>,
    /// Changed on every change, to a number unique in the process (lets caches notice,
    /// also across clones).
    generation: u64,
}

impl AddressSpace {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segs
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Removes everything (an exec).
    pub fn clear(&mut self) {
        self.segs.clear();
        self.generation = next_generation();
    }

    /// Adds `seg`, shrinking or splitting whatever it overlaps.
    pub fn add(&mut self, seg: Segment) {
        let (s, e) = (seg.start, seg.end());
        let mut out = Vec::with_capacity(self.segs.len() + 2);
        for old in self.segs.drain(..) {
            if old.end() <= s || old.start >= e {
                out.push(old);
                continue;
            }
            if old.start < s {
                out.push(Segment {
                    len: s - old.start,
                    ..old.clone()
                });
            }
            if old.end() > e {
                let cut = e - old.start;
                out.push(Segment {
                    start: e,
                    len: old.len - cut,
                    offset: old.offset + cut,
                    backing: old.backing.clone(),
                });
            }
        }
        out.push(seg);
        out.sort_by_key(|x| x.start);
        self.segs = out;
        self.generation = next_generation();
    }

    /// Whether `other` holds the same code at the same addresses: the same segments, each
    /// from the same file at the same offset or of the same bytes (a file is read as it is
    /// now, by both). Caches built for one are then valid for the other.
    pub fn same_code(&self, other: &AddressSpace) -> bool {
        self.segs.len() == other.segs.len()
            && self.segs.iter().zip(&other.segs).all(|(a, b)| {
                a.start == b.start
                    && a.len == b.len
                    && (Arc::ptr_eq(&a.backing, &b.backing)
                        || match (a.backing.path(), b.backing.path()) {
                            (Some(pa), Some(pb)) => pa == pb && a.offset == b.offset,
                            (None, None) => a.bytes() == b.bytes(),
                            _ => false,
                        })
            })
    }

    /// The segment containing `addr`.
    pub fn find(&self, addr: u64) -> Option<&Segment> {
        let i = self.segs.partition_point(|s| s.start <= addr);
        let seg = self.segs.get(i.checked_sub(1)?)?;
        (addr < seg.end()).then_some(seg)
    }

    /// Whether the bytes mapped at `addr` are exactly `bytes` (across segments).
    pub fn holds(&self, addr: u64, bytes: &[u8]) -> bool {
        let mut done = 0usize;
        while done < bytes.len() {
            let Some(at) = addr.checked_add(done as u64) else {
                return false;
            };
            let Some(seg) = self.find(at) else {
                return false;
            };
            let from = (at - seg.start) as usize;
            let have = seg.bytes().get(from..).unwrap_or(&[]);
            let want = &bytes[done..];
            let n = have.len().min(want.len());
            if n == 0 || have[..n] != want[..n] {
                return false;
            }
            done += n;
        }
        true
    }

    /// Copies up to `buf.len()` bytes at `addr` (within one segment); returns the count.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let Some(seg) = self.find(addr) else {
            return 0;
        };
        let from = (addr - seg.start) as usize;
        let src = seg.bytes().get(from..).unwrap_or(&[]);
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        n
    }

    /// Adds raw bytes at `addr` (e.g. the vDSO).
    pub fn add_bytes(&mut self, name: &str, bytes: Vec<u8>, addr: u64) {
        let len = bytes.len() as u64;
        let backing = Arc::new(Backing::Bytes {
            name: name.to_string(),
            bytes,
        });
        if let Some(seg) = Segment::new(addr, len, backing, 0) {
            self.add(seg);
        }
    }

    /// Adds captured code (address, bytes) in one pass: adjacent and overlapping pieces
    /// are merged into runs (a later piece wins where pieces overlap), and each run
    /// replaces whatever it overlaps, as [`Self::add`] does.
    pub fn add_code(&mut self, pieces: &[(u64, &[u8])]) {
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        order.sort_by_key(|&i| pieces[i].0);
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for i in order {
            let (addr, bytes) = pieces[i];
            if bytes.is_empty() || addr.checked_add(bytes.len() as u64).is_none() {
                continue;
            }
            match runs.last_mut() {
                Some((start, run)) if addr <= *start + run.len() as u64 => {
                    let off = (addr - *start) as usize;
                    let end = off + bytes.len();
                    if end > run.len() {
                        run.resize(end, 0);
                    }
                    run[off..end].copy_from_slice(bytes);
                }
                _ => runs.push((addr, bytes.to_vec())),
            }
        }
        // Code identical to what is mapped there already (a QEMU trace records every block
        // it runs, mostly straight from the files) changes nothing: keeping the file
        // segments whole lets libipt read them as cached file sections.
        runs.retain(|(addr, bytes)| !self.holds(*addr, bytes));
        if runs.is_empty() {
            return;
        }
        let new: Vec<Segment> = runs
            .into_iter()
            .filter_map(|(addr, bytes)| {
                let len = bytes.len() as u64;
                let backing = Arc::new(Backing::Bytes {
                    name: "[code]".to_string(),
                    bytes,
                });
                Segment::new(addr, len, backing, 0)
            })
            .collect();
        let mut out = Vec::with_capacity(self.segs.len() + 2 * new.len());
        for old in self.segs.drain(..) {
            // Pieces of `old` not covered by any new run (runs are sorted and disjoint).
            let mut cur = old.start;
            let first = new.partition_point(|n| n.end() <= old.start);
            for n in new[first..].iter().take_while(|n| n.start < old.end()) {
                if n.start > cur {
                    out.push(Segment {
                        start: cur,
                        len: n.start - cur,
                        offset: old.offset + (cur - old.start),
                        backing: old.backing.clone(),
                    });
                }
                cur = cur.max(n.end());
            }
            if cur < old.end() {
                out.push(Segment {
                    start: cur,
                    len: old.end() - cur,
                    offset: old.offset + (cur - old.start),
                    backing: old.backing.clone(),
                });
            }
        }
        out.extend(new);
        out.sort_by_key(|x| x.start);
        self.segs = out;
        self.generation = next_generation();
    }

    /// Adds `len` bytes of a file at `offset` to `addr` (an MMAP record).
    pub fn add_file_range(
        &mut self,
        backing: Arc<Backing>,
        offset: u64,
        len: u64,
        addr: u64,
    ) -> bool {
        match Segment::new(addr, len, backing, offset) {
            Some(seg) => {
                self.add(seg);
                true
            }
            None => false,
        }
    }

    /// Adds an ELF file's executable PT_LOAD segments. With `base`, the lowest PT_LOAD
    /// page is placed at `base`; without, segments go to their link addresses. Returns the
    /// load bias (`base - lowest page`).
    pub fn add_elf(&mut self, path: &Path, base: Option<u64>) -> Result<u64, DecodeError> {
        let backing = Backing::map_file(path)?;
        let loads = elf_loads(path, backing.bytes())?;
        let lowest = loads
            .iter()
            .map(|l| l.vaddr & !0xfff)
            .min()
            .ok_or_else(|| DecodeError::new(path.display(), 0, "ELF has no PT_LOAD segment"))?;
        let bias = base.map_or(0, |b| b.wrapping_sub(lowest));
        for l in loads.iter().filter(|l| l.exec) {
            self.add_file_range(
                backing.clone(),
                l.offset,
                l.filesz,
                l.vaddr.wrapping_add(bias),
            );
        }
        Ok(bias)
    }

    /// Adds every PT_LOAD segment of a kcore copy at its (kernel) virtual address.
    pub fn add_kcore(&mut self, path: &Path) -> Result<usize, DecodeError> {
        let backing = Backing::map_file(path)?;
        let loads = elf_loads(path, backing.bytes())?;
        let mut n = 0;
        for l in &loads {
            if self.add_file_range(backing.clone(), l.offset, l.filesz, l.vaddr) {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// One PT_LOAD program header.
#[derive(Debug, Clone, Copy)]
struct Load {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    exec: bool,
}

fn elf_loads(path: &Path, data: &[u8]) -> Result<Vec<Load>, DecodeError> {
    let bad = |what: String| DecodeError::new(path.display(), 0, what);
    let hdr = elf::FileHeader64::<Endianness>::parse(data)
        .map_err(|e| bad(format!("not a 64-bit ELF file: {e}")))?;
    let endian = hdr
        .endian()
        .map_err(|e| bad(format!("bad ELF endianness: {e}")))?;
    let phdrs = hdr
        .program_headers(endian, data)
        .map_err(|e| bad(format!("bad ELF program headers: {e}")))?;
    Ok(phdrs
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD && p.p_filesz(endian) > 0)
        .map(|p| Load {
            offset: p.p_offset(endian),
            vaddr: p.p_vaddr(endian),
            filesz: p.p_filesz(endian),
            exec: p.p_flags(endian) & elf::PF_X != 0,
        })
        .collect())
}

/// Address -> name lookup (ELF symbol tables, kallsyms).
#[derive(Debug, Clone, Default)]
pub struct Symbols {
    /// (start, size or 0 = up to the next symbol, name), sorted by start.
    syms: Vec<(u64, u64, String)>,
}

impl Symbols {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    pub fn add(&mut self, addr: u64, size: u64, name: &str) {
        self.syms.push((addr, size, name.to_string()));
    }

    /// Sorts after adding (call once after loading).
    pub fn finish(&mut self) {
        self.syms.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
        self.syms.dedup_by(|a, b| a.0 == b.0);
    }

    /// Parses `/proc/kallsyms` text (`ADDR TYPE NAME [module]`); text symbols only.
    pub fn add_kallsyms(&mut self, path: &Path, text: &str) -> Result<usize, DecodeError> {
        let mut n = 0;
        // Byte offset of each line in the file (the error's offset), line number in the text.
        let mut offset = 0u64;
        for (lineno, raw) in text.split_inclusive('\n').enumerate() {
            let at = offset;
            offset += raw.len() as u64;
            let line = raw.trim_end_matches(['\n', '\r']);
            let mut it = line.split_whitespace();
            let (Some(addr), Some(ty), Some(name)) = (it.next(), it.next(), it.next()) else {
                if line.trim().is_empty() {
                    continue;
                }
                return Err(DecodeError::new(
                    path.display(),
                    at,
                    format!("kallsyms line {}: expected 'ADDR TYPE NAME'", lineno + 1),
                ));
            };
            let addr = u64::from_str_radix(addr, 16).map_err(|_| {
                DecodeError::new(
                    path.display(),
                    at,
                    format!("kallsyms line {}: bad address '{addr}'", lineno + 1),
                )
            })?;
            if matches!(ty, "t" | "T" | "w" | "W") && addr != 0 {
                self.add(addr, 0, name);
                n += 1;
            }
        }
        self.finish();
        Ok(n)
    }

    /// Adds an ELF file's function symbols (symtab and dynsym), moved by `bias`. A symbol
    /// without a size (`_init`, `_fini`, assembly labels) covers its section up to the next
    /// symbol, never beyond the section: else the file's last one named every address
    /// above it, other files' and anonymous memory's (a JVM's generated code was `_fini`).
    pub fn add_elf(&mut self, path: &Path, data: &[u8], bias: u64) -> Result<usize, DecodeError> {
        use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
        let file = object::File::parse(data)
            .map_err(|e| DecodeError::new(path.display(), 0, format!("bad ELF: {e}")))?;
        let mut n = 0;
        for s in file.symbols().chain(file.dynamic_symbols()) {
            if s.kind() != SymbolKind::Text || s.address() == 0 {
                continue;
            }
            let size = match s.size() {
                0 => s
                    .section_index()
                    .and_then(|i| file.section_by_index(i).ok())
                    .map(|sec| (sec.address() + sec.size()).saturating_sub(s.address()))
                    .filter(|&left| left > 0)
                    .unwrap_or(0),
                size => size,
            };
            if let Ok(name) = s.name() {
                self.add(s.address().wrapping_add(bias), size, name);
                n += 1;
            }
        }
        self.finish();
        Ok(n)
    }

    /// `name+0xoff` for `addr`, if a symbol covers it.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let i = self.syms.partition_point(|s| s.0 <= addr);
        let (start, size, name) = self.syms.get(i.checked_sub(1)?)?;
        let off = addr - start;
        if *size != 0 && off >= *size {
            return None;
        }
        Some((name.as_str(), off))
    }
}

/// Files opened once and shared between mappings of the same path.
#[derive(Debug, Default, Clone)]
pub struct FileCache {
    files: HashMap<PathBuf, Option<Arc<Backing>>>,
}

impl FileCache {
    /// The mapped file, `None` when it cannot be opened (remembered).
    pub fn get(&mut self, path: &Path) -> Option<Arc<Backing>> {
        self.files
            .entry(path.to_path_buf())
            .or_insert_with(|| Backing::map_file(path).ok())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two spaces hold the same code when every segment is the same file at the same
    /// place and offset, or the same bytes; any other start, length, offset, file or byte
    /// makes them differ.
    #[test]
    fn same_code_is_the_same_files_and_bytes_at_the_same_places() {
        let dir = std::env::temp_dir().join(format!("same-code-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (fa, fb) = (dir.join("a"), dir.join("b"));
        std::fs::write(&fa, [0x90u8; 0x3000]).unwrap();
        std::fs::write(&fb, [0x90u8; 0x3000]).unwrap();
        let space = |file: &Path, at: u64, offset: u64, vdso: &[u8]| {
            let mut s = AddressSpace::new();
            // (Each space maps the file anew, as each thread image does.)
            assert!(s.add_file_range(Backing::map_file(file).unwrap(), offset, 0x1000, at));
            s.add_bytes("[vdso]", vdso.to_vec(), 0x7000_0000);
            s
        };
        let one = space(&fa, 0x40_0000, 0x1000, &[1, 2, 3]);
        assert!(one.same_code(&space(&fa, 0x40_0000, 0x1000, &[1, 2, 3])));
        for other in [
            space(&fa, 0x50_0000, 0x1000, &[1, 2, 3]),
            space(&fa, 0x40_0000, 0x2000, &[1, 2, 3]),
            space(&fb, 0x40_0000, 0x1000, &[1, 2, 3]),
            space(&fa, 0x40_0000, 0x1000, &[1, 2, 4]),
            space(&fa, 0x40_0000, 0x1000, &[1, 2]),
        ] {
            assert!(!one.same_code(&other), "{:?}", other.segments());
        }
        let mut more = space(&fa, 0x40_0000, 0x1000, &[1, 2, 3]);
        more.add_bytes("jit", vec![0xc3], 0x6000_0000);
        assert!(!one.same_code(&more));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn bytes(v: &[u8]) -> Arc<Backing> {
        Arc::new(Backing::Bytes {
            name: "t".into(),
            bytes: v.to_vec(),
        })
    }

    #[test]
    fn code_pieces_merge_into_runs_and_replace_older_code() {
        let mut a = AddressSpace::new();
        a.add(Segment::new(0x1000, 0x100, bytes(&[0xaa; 0x100]), 0).unwrap());
        a.add_code(&[
            (0x1010, &[1, 2, 3][..]),
            (0x2000, &[9][..]),
            (0x1013, &[4, 5][..]),
            (0x1012, &[7][..]),
        ]);
        let spans: Vec<(u64, u64, String)> = a
            .segments()
            .iter()
            .map(|s| (s.start, s.len, s.backing.name()))
            .collect();
        let file = a.segments()[0].backing.name();
        assert_eq!(
            spans,
            vec![
                (0x1000, 0x10, file.clone()),
                (0x1010, 5, "[code]".to_string()),
                (0x1015, 0xeb, file),
                (0x2000, 1, "[code]".to_string()),
            ]
        );
        let mut buf = [0u8; 8];
        assert_eq!(a.read(0x1010, &mut buf), 5);
        assert_eq!(&buf[..5], &[1, 2, 7, 4, 5]);
        // A later version of the code at the same address replaces the bytes.
        a.add_code(&[(0x1011, &[0xcc][..])]);
        assert_eq!(a.read(0x1011, &mut buf), 1);
        assert_eq!(buf[0], 0xcc);
        assert_eq!(a.read(0x1010, &mut buf), 1);
        assert_eq!(buf[0], 1);
        assert_eq!(a.read(0x1012, &mut buf), 3);
        assert_eq!(&buf[..3], &[7, 4, 5]);
    }

    #[test]
    fn overlapping_add_splits_and_replaces() {
        let mut a = AddressSpace::new();
        a.add_file_range(bytes(&[1; 100]), 0, 100, 1000);
        a.add_file_range(bytes(&[2; 10]), 0, 10, 1020);
        let layout: Vec<(u64, u64)> = a.segments().iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(layout, vec![(1000, 20), (1020, 10), (1030, 70)]);
        let mut b = [0u8; 4];
        assert_eq!(a.read(1018, &mut b), 2);
        assert_eq!(&b[..2], &[1, 1]);
        assert_eq!(a.read(1025, &mut b), 4);
        assert_eq!(b, [2; 4]);
        assert_eq!(a.read(1099, &mut b), 1);
        assert_eq!(a.read(1100, &mut b), 0);
        assert_eq!(a.read(999, &mut b), 0);
        a.clear();
        assert!(a.is_empty());
    }

    #[test]
    fn kallsyms_errors_name_the_byte_offset_and_the_line() {
        let mut s = Symbols::new();
        let text = "ffffffff81000000 T _stext\nffffffff81000100 t foo\nzzzz T bad\n";
        let e = s
            .add_kallsyms(Path::new("k"), text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("offset 0x31") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn kallsyms_lookup() {
        let mut s = Symbols::new();
        let n = s
            .add_kallsyms(
                Path::new("k"),
                "ffffffff81000000 T _stext\nffffffff81000100 t foo\nffffffff81000200 D data\n",
            )
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(s.lookup(0xffffffff81000104), Some(("foo", 4)));
        assert_eq!(s.lookup(0xffffffff81000000), Some(("_stext", 0)));
        assert_eq!(s.lookup(0xffffffff80000000), None);
        assert!(s.add_kallsyms(Path::new("k"), "zz T x\n").is_err());
    }

    /// ELF64 with two PT_LOADs: R at vaddr 0 (file 0..0x1000) and R+X at vaddr 0x1000
    /// (file 0x1000.., `code`).
    fn pie(code: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; 0x1000];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[6] = 1;
        e[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        e[18..20].copy_from_slice(&62u16.to_le_bytes());
        e[32..40].copy_from_slice(&64u64.to_le_bytes());
        e[52..54].copy_from_slice(&64u16.to_le_bytes());
        e[54..56].copy_from_slice(&56u16.to_le_bytes());
        e[56..58].copy_from_slice(&2u16.to_le_bytes());
        for (k, (flags, off, len)) in [(4u32, 0u64, 0x1000u64), (5, 0x1000, code.len() as u64)]
            .into_iter()
            .enumerate()
        {
            let ph = 64 + 56 * k;
            e[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
            e[ph + 4..ph + 8].copy_from_slice(&flags.to_le_bytes());
            e[ph + 8..ph + 16].copy_from_slice(&off.to_le_bytes());
            e[ph + 16..ph + 24].copy_from_slice(&off.to_le_bytes());
            e[ph + 32..ph + 40].copy_from_slice(&len.to_le_bytes());
            e[ph + 40..ph + 48].copy_from_slice(&len.to_le_bytes());
        }
        e.extend_from_slice(code);
        e
    }

    /// A symbol without a size names its section's bytes from it on, not every address
    /// above it (a C program's `_fini`: the last symbol of its file).
    #[test]
    fn symbols_without_a_size_stay_in_their_section() {
        use object::{Object, ObjectSection, ObjectSymbol};
        let dir = tempfile::tempdir().unwrap();
        let (c, exe) = (dir.path().join("p.c"), dir.path().join("p"));
        std::fs::write(&c, "int main(void) { return 0; }\n").unwrap();
        let o = std::process::Command::new("cc")
            .arg(&c)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let data = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let fini = file.symbols().find(|s| s.name() == Ok("_fini")).unwrap();
        assert_eq!(fini.size(), 0, "cc's _fini has no size");
        let sec = file
            .section_by_index(fini.section_index().unwrap())
            .unwrap();
        let end = sec.address() + sec.size();
        let bias = 0x5555_0000_0000;
        let mut syms = Symbols::new();
        assert!(syms.add_elf(&exe, &data, bias).unwrap() > 0);
        let at = fini.address() + bias;
        assert_eq!(syms.lookup(at), Some(("_fini", 0)));
        assert_eq!(
            syms.lookup(end - 1 + bias),
            Some(("_fini", end - 1 - fini.address()))
        );
        assert_eq!(syms.lookup(end + bias).map(|s| s.0), None);
        assert_eq!(syms.lookup(0x7f00_0000_0000), None);
    }

    #[test]
    fn elf_exec_segments_at_a_base() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("lib.so");
        std::fs::write(&f, pie(&[0x90, 0xc3])).unwrap();
        let mut a = AddressSpace::new();
        let bias = a.add_elf(&f, Some(0x7f00_0000_0000)).unwrap();
        assert_eq!(bias, 0x7f00_0000_0000);
        // Only the executable segment is loaded, at base + its vaddr.
        let layout: Vec<(u64, u64)> = a.segments().iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(layout, vec![(0x7f00_0000_1000, 2)]);
        let mut b = [0u8; 2];
        assert_eq!(a.read(0x7f00_0000_1000, &mut b), 2);
        assert_eq!(b, [0x90, 0xc3]);
        assert_eq!(a.segments()[0].backing.path(), Some(f.as_path()));
        // Without a base: the link address.
        let mut a = AddressSpace::new();
        assert_eq!(a.add_elf(&f, None).unwrap(), 0);
        assert_eq!(a.segments()[0].start, 0x1000);
        // Not an ELF: an error naming the file.
        std::fs::write(&f, b"junk").unwrap();
        let e = AddressSpace::new().add_elf(&f, None).unwrap_err();
        assert!(e.to_string().contains("lib.so"), "{e}");
    }
}
