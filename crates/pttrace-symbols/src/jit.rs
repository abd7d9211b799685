//! JIT code names: perf map files (`/tmp/perf-PID.map`) and jitdump files (`jit-PID.dump`).
//!
//! Both tolerate a truncated end (a writer killed mid-write): the incomplete last line or
//! record is dropped and reported by `truncated()`. Anything else that does not parse is
//! an error naming the file and the byte offset (and line, for maps).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::SymbolError;

/// Non-overlapping address ranges, each holding an index; an insert replaces whatever it
/// overlaps (the latest wins).
#[derive(Debug, Clone, Default)]
struct RangeMap {
    /// start -> (end, index)
    map: BTreeMap<u64, (u64, usize)>,
}

impl RangeMap {
    fn insert(&mut self, start: u64, end: u64, index: usize) {
        if start >= end {
            return;
        }
        // Ranges are disjoint and sorted, so walking down from `end`, ends decrease too.
        let over: Vec<(u64, u64, usize)> = self
            .map
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, i))| (s, e, i))
            .collect();
        for (s, e, i) in over {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, (start, i));
            }
            if e > end {
                self.map.insert(end, (e, i));
            }
        }
        self.map.insert(start, (end, index));
    }

    fn get(&self, addr: u64) -> Option<usize> {
        let (_, &(end, i)) = self.map.range(..=addr).next_back()?;
        (addr < end).then_some(i)
    }
}

/// What was dropped from the end of a truncated file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    /// Byte offset of the incomplete line or record.
    pub offset: u64,
    /// Its line number (1-based), for perf maps.
    pub line: Option<usize>,
    /// How many bytes of it there were.
    pub len: u64,
}

/// One perf map entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitSymbol {
    /// Start address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// The name (may contain spaces).
    pub name: String,
}

/// A perf map file: `START SIZE NAME` lines, hex numbers (`0x` optional).
#[derive(Debug, Clone)]
pub struct PerfMap {
    path: PathBuf,
    entries: Vec<JitSymbol>,
    ranges: RangeMap,
    truncated: Option<Truncation>,
}

impl PerfMap {
    /// Reads and parses the perf map at `path`.
    pub fn open(path: &Path) -> Result<PerfMap, SymbolError> {
        let data = std::fs::read(path).map_err(|e| SymbolError::io(path, &e))?;
        PerfMap::parse(path, &data)
    }

    /// Parses perf map text; `path` names the file in errors.
    pub fn parse(path: &Path, data: &[u8]) -> Result<PerfMap, SymbolError> {
        let mut map = PerfMap {
            path: path.to_path_buf(),
            entries: Vec::new(),
            ranges: RangeMap::default(),
            truncated: None,
        };
        let mut offset = 0usize;
        let mut lineno = 0usize;
        while offset < data.len() {
            lineno += 1;
            let rest = &data[offset..];
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                // No newline: the writer stopped mid-line.
                map.truncated = Some(Truncation {
                    offset: offset as u64,
                    line: Some(lineno),
                    len: rest.len() as u64,
                });
                break;
            };
            let line = &rest[..nl];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !line.iter().all(u8::is_ascii_whitespace) {
                let e = parse_map_line(line).map_err(|msg| SymbolError::Format {
                    path: path.to_path_buf(),
                    offset: offset as u64,
                    line: Some(lineno),
                    msg,
                })?;
                if e.size > 0 {
                    let end = e.start.saturating_add(e.size);
                    map.ranges.insert(e.start, end, map.entries.len());
                }
                map.entries.push(e);
            }
            offset += nl + 1;
        }
        Ok(map)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All entries in file order.
    pub fn entries(&self) -> &[JitSymbol] {
        &self.entries
    }

    /// The entry covering `addr` (of overlapping entries, the one loaded last).
    pub fn lookup(&self, addr: u64) -> Option<&JitSymbol> {
        self.entries.get(self.ranges.get(addr)?)
    }

    /// The dropped incomplete last line, if the file ended mid-line.
    pub fn truncated(&self) -> Option<&Truncation> {
        self.truncated.as_ref()
    }
}

fn parse_hex(tok: &[u8], what: &str) -> Result<u64, String> {
    let t = std::str::from_utf8(tok).map_err(|_| format!("bad {what}: not ASCII"))?;
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if digits.is_empty() {
        return Err(format!("bad {what} '{t}'"));
    }
    u64::from_str_radix(digits, 16).map_err(|_| format!("bad {what} '{t}' (expected hex)"))
}

fn parse_map_line(line: &[u8]) -> Result<JitSymbol, String> {
    let is_sp = |b: &u8| *b == b' ' || *b == b'\t';
    let line = &line[line.iter().position(|b| !is_sp(b)).unwrap_or(line.len())..];
    let a_end = line.iter().position(is_sp).unwrap_or(line.len());
    let start = parse_hex(&line[..a_end], "start address")?;
    let rest = &line[a_end..];
    let rest = &rest[rest.iter().position(|b| !is_sp(b)).unwrap_or(rest.len())..];
    if rest.is_empty() {
        return Err("expected 'START SIZE NAME'".into());
    }
    let s_end = rest.iter().position(is_sp).unwrap_or(rest.len());
    let size = parse_hex(&rest[..s_end], "size")?;
    let name = &rest[s_end..];
    let name = &name[name.iter().position(|b| !is_sp(b)).unwrap_or(name.len())..];
    Ok(JitSymbol {
        start,
        size,
        name: String::from_utf8_lossy(name).into_owned(),
    })
}

/// The jitdump magic ("JiTD" written as a native-endian u32).
pub const JITDUMP_MAGIC: u32 = 0x4A69_5444;
/// Record ids.
pub const JIT_CODE_LOAD: u32 = 0;
/// See [`JIT_CODE_LOAD`].
pub const JIT_CODE_MOVE: u32 = 1;
/// See [`JIT_CODE_LOAD`].
pub const JIT_CODE_DEBUG_INFO: u32 = 2;
/// See [`JIT_CODE_LOAD`].
pub const JIT_CODE_CLOSE: u32 = 3;
/// See [`JIT_CODE_LOAD`].
pub const JIT_CODE_UNWINDING_INFO: u32 = 4;

const FILE_HEADER: usize = 40;
const RECORD_HEADER: usize = 16;

/// The jitdump file header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitDumpHeader {
    /// Format version (1 in files written today).
    pub version: u32,
    /// Size of the header in bytes (records start there).
    pub header_size: u32,
    /// ELF `e_machine` of the code.
    pub elf_mach: u32,
    /// The JIT's process id.
    pub pid: u32,
    /// When the file was created.
    pub timestamp: u64,
    /// Flags (bit 0: architecture timestamps, e.g. TSC).
    pub flags: u64,
    /// The file was written big-endian.
    pub big_endian: bool,
}

/// One source line entry of a `JIT_CODE_DEBUG_INFO` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitDebugEntry {
    /// The code address the entry starts at (as the JIT wrote it).
    pub addr: u64,
    /// Source line (1-based).
    pub line: u32,
    /// Column discriminator.
    pub discrim: u32,
    /// Source file name.
    pub file: Arc<str>,
}

/// A `JIT_CODE_LOAD` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitCodeLoad {
    /// Record timestamp.
    pub timestamp: u64,
    /// Process and thread that generated the code.
    pub pid: u32,
    /// See `pid`.
    pub tid: u32,
    /// Virtual address of the code start.
    pub vma: u64,
    /// Code start address (where the code runs; lookups use it).
    pub code_addr: u64,
    /// Code size in bytes.
    pub code_size: u64,
    /// Unique id of this code (`JIT_CODE_MOVE` refers to it).
    pub code_index: u64,
    /// The function's name.
    pub name: String,
    /// Byte range of the code bytes in the file (see [`JitDump::code`]).
    pub code: Range<usize>,
    /// Source lines from the `JIT_CODE_DEBUG_INFO` record written before this load, sorted
    /// by address.
    pub debug: Vec<JitDebugEntry>,
    /// Index in [`JitDump::unwinding`] of the unwinding record written before this load.
    pub unwinding: Option<usize>,
    /// Byte offset of the record in the file.
    pub offset: u64,
}

/// A `JIT_CODE_MOVE` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitCodeMove {
    /// Record timestamp.
    pub timestamp: u64,
    /// Process and thread.
    pub pid: u32,
    /// See `pid`.
    pub tid: u32,
    /// New virtual address.
    pub vma: u64,
    /// Previous code address.
    pub old_code_addr: u64,
    /// New code address (lookups use it).
    pub new_code_addr: u64,
    /// Code size.
    pub code_size: u64,
    /// The `code_index` of the load that is moved.
    pub code_index: u64,
}

/// A `JIT_CODE_UNWINDING_INFO` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitUnwindingInfo {
    /// Record timestamp.
    pub timestamp: u64,
    /// Size of the unwinding data (EH frame header + EH frame).
    pub unwind_data_size: u64,
    /// Size of the EH frame header at its start.
    pub eh_frame_hdr_size: u64,
    /// Size of the data mapped in memory (0 or `unwind_data_size`).
    pub mapped_size: u64,
    /// Byte range of the unwinding data in the file.
    pub data: Range<usize>,
}

/// Where a load's code was, and when.
#[derive(Debug, Clone)]
struct Placement {
    start: u64,
    end: u64,
    load: usize,
    from: u64,
    until: u64,
}

/// A code address found in a jitdump.
#[derive(Debug, Clone, Copy)]
pub struct JitHit<'a> {
    /// The load whose code is there.
    pub load: &'a JitCodeLoad,
    /// Where that code starts at the time asked (its load address, or where it moved).
    pub start: u64,
}

impl JitHit<'_> {
    /// The function name.
    pub fn name(&self) -> &str {
        &self.load.name
    }

    /// The source line of `addr` (inside this hit): the load's debug entry with the
    /// greatest address at or below it (moved code is mapped back to its load address).
    /// Entry addresses are taken as the JIT wrote them; V8 (`node --perf-prof`) writes
    /// them 0x40 bytes (the ELF header `perf inject` puts before the code) past the code
    /// they describe.
    pub fn line(&self, addr: u64) -> Option<&JitDebugEntry> {
        let orig = addr
            .checked_sub(self.start)?
            .checked_add(self.load.code_addr)?;
        let d = &self.load.debug;
        let i = d.partition_point(|e| e.addr <= orig).checked_sub(1)?;
        d.get(i)
    }
}

/// A parsed jitdump file.
#[derive(Debug, Clone)]
pub struct JitDump {
    path: PathBuf,
    data: Vec<u8>,
    /// The file header.
    pub header: JitDumpHeader,
    /// `JIT_CODE_LOAD` records in file order.
    pub loads: Vec<JitCodeLoad>,
    /// `JIT_CODE_MOVE` records in file order.
    pub moves: Vec<JitCodeMove>,
    /// `JIT_CODE_UNWINDING_INFO` records in file order.
    pub unwinding: Vec<JitUnwindingInfo>,
    /// Timestamp of the `JIT_CODE_CLOSE` record, if any.
    pub closed: Option<u64>,
    /// Records of unknown kinds, skipped: (byte offset, id).
    pub unknown: Vec<(u64, u32)>,
    truncated: Option<Truncation>,
    placements: Vec<Placement>,
    max_len: u64,
    latest: RangeMap,
    /// Placement indices sorted by start address.
    by_start: Vec<usize>,
}

struct Cur<'a> {
    data: &'a [u8],
    pos: usize,
    big: bool,
}

impl Cur<'_> {
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b: [u8; N] = self.data.get(self.pos..self.pos + N)?.try_into().ok()?;
        self.pos += N;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.bytes::<4>()?;
        Some(if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.bytes::<8>()?;
        Some(if self.big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }
    /// A NUL-terminated string (NUL consumed).
    fn cstr(&mut self) -> Option<&[u8]> {
        let rest = self.data.get(self.pos..)?;
        let n = rest.iter().position(|&b| b == 0)?;
        self.pos += n + 1;
        Some(&rest[..n])
    }
}

impl JitDump {
    /// Reads and parses the jitdump at `path`.
    pub fn open(path: &Path) -> Result<JitDump, SymbolError> {
        let data = std::fs::read(path).map_err(|e| SymbolError::io(path, &e))?;
        JitDump::parse(path, data)
    }

    /// Parses jitdump bytes; `path` names the file in errors.
    pub fn parse(path: &Path, data: Vec<u8>) -> Result<JitDump, SymbolError> {
        let err = |offset: usize, msg: String| SymbolError::Format {
            path: path.to_path_buf(),
            offset: offset as u64,
            line: None,
            msg,
        };
        let magic = data
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .ok_or_else(|| err(0, "not a jitdump file: shorter than its magic".into()))?;
        let big = if u32::from_le_bytes(magic) == JITDUMP_MAGIC {
            false
        } else if u32::from_be_bytes(magic) == JITDUMP_MAGIC {
            true
        } else {
            return Err(err(
                0,
                format!(
                    "not a jitdump file: magic {:#010x}",
                    u32::from_le_bytes(magic)
                ),
            ));
        };
        if data.len() < FILE_HEADER {
            return Err(err(
                0,
                format!(
                    "truncated file header ({} of {FILE_HEADER} bytes)",
                    data.len()
                ),
            ));
        }
        let mut c = Cur {
            data: &data,
            pos: 4,
            big,
        };
        let mut h = || -> Option<JitDumpHeader> {
            let version = c.u32()?;
            let header_size = c.u32()?;
            let elf_mach = c.u32()?;
            let _pad = c.u32()?;
            let pid = c.u32()?;
            let timestamp = c.u64()?;
            let flags = c.u64()?;
            Some(JitDumpHeader {
                version,
                header_size,
                elf_mach,
                pid,
                timestamp,
                flags,
                big_endian: big,
            })
        };
        let header = h().ok_or_else(|| err(0, "truncated file header".into()))?;
        let hs = header.header_size as usize;
        if hs < FILE_HEADER || hs > data.len() {
            return Err(err(
                8,
                format!(
                    "header size {hs} outside {FILE_HEADER}..={} (the file's size)",
                    data.len()
                ),
            ));
        }
        let mut dump = JitDump {
            path: path.to_path_buf(),
            data: Vec::new(),
            header,
            loads: Vec::new(),
            moves: Vec::new(),
            unwinding: Vec::new(),
            closed: None,
            unknown: Vec::new(),
            truncated: None,
            placements: Vec::new(),
            max_len: 0,
            latest: RangeMap::default(),
            by_start: Vec::new(),
        };
        let mut pending_debug: HashMap<u64, Vec<JitDebugEntry>> = HashMap::new();
        let mut pending_unwind: Option<usize> = None;
        let mut files: HashMap<Vec<u8>, Arc<str>> = HashMap::new();
        let mut off = hs;
        while off < data.len() {
            let rest = data.len() - off;
            let mut c = Cur {
                data: &data[..],
                pos: off,
                big,
            };
            let (Some(id), Some(size), Some(ts)) = (c.u32(), c.u32(), c.u64()) else {
                dump.truncated = Some(Truncation {
                    offset: off as u64,
                    line: None,
                    len: rest as u64,
                });
                break;
            };
            let size = size as usize;
            if size < RECORD_HEADER {
                return Err(err(
                    off,
                    format!("record size {size} smaller than the record header ({RECORD_HEADER})"),
                ));
            }
            if size > rest {
                dump.truncated = Some(Truncation {
                    offset: off as u64,
                    line: None,
                    len: rest as u64,
                });
                break;
            }
            let end = off + size;
            // Fields are read from the record alone.
            let mut r = Cur {
                data: &data[..end],
                pos: off + RECORD_HEADER,
                big,
            };
            let short =
                |kind: &str| err(off, format!("{kind} record of {size} bytes is too short"));
            match id {
                JIT_CODE_LOAD => {
                    let (pid, tid) = (r.u32(), r.u32());
                    let (vma, code_addr, code_size, code_index) =
                        (r.u64(), r.u64(), r.u64(), r.u64());
                    let (
                        Some(pid),
                        Some(tid),
                        Some(vma),
                        Some(code_addr),
                        Some(code_size),
                        Some(code_index),
                    ) = (pid, tid, vma, code_addr, code_size, code_index)
                    else {
                        return Err(short("JIT_CODE_LOAD"));
                    };
                    let name = r.cstr().ok_or_else(|| {
                        err(
                            off,
                            "JIT_CODE_LOAD name is not NUL-terminated within the record".into(),
                        )
                    })?;
                    let name = String::from_utf8_lossy(name).into_owned();
                    let room = (end - r.pos) as u64;
                    if code_size > room {
                        return Err(err(
                            off,
                            format!("JIT_CODE_LOAD code size {code_size} exceeds the {room} bytes left in the record"),
                        ));
                    }
                    let code = r.pos..r.pos + code_size as usize;
                    let mut debug = pending_debug.remove(&code_addr).unwrap_or_default();
                    debug.sort_by_key(|e| e.addr);
                    let index = dump.loads.len();
                    dump.loads.push(JitCodeLoad {
                        timestamp: ts,
                        pid,
                        tid,
                        vma,
                        code_addr,
                        code_size,
                        code_index,
                        name,
                        code,
                        debug,
                        unwinding: pending_unwind.take(),
                        offset: off as u64,
                    });
                    dump.place(code_addr, code_size, index, ts);
                }
                JIT_CODE_MOVE => {
                    let (pid, tid) = (r.u32(), r.u32());
                    let (vma, old, new, code_size, code_index) =
                        (r.u64(), r.u64(), r.u64(), r.u64(), r.u64());
                    let (
                        Some(pid),
                        Some(tid),
                        Some(vma),
                        Some(old_code_addr),
                        Some(new_code_addr),
                        Some(code_size),
                        Some(code_index),
                    ) = (pid, tid, vma, old, new, code_size, code_index)
                    else {
                        return Err(short("JIT_CODE_MOVE"));
                    };
                    dump.moves.push(JitCodeMove {
                        timestamp: ts,
                        pid,
                        tid,
                        vma,
                        old_code_addr,
                        new_code_addr,
                        code_size,
                        code_index,
                    });
                    // The latest placement of that code ends; a new one starts.
                    let load = dump.loads.iter().rposition(|l| l.code_index == code_index);
                    if let Some(load) = load {
                        if let Some(p) = dump
                            .placements
                            .iter_mut()
                            .rev()
                            .find(|p| p.load == load && p.until == u64::MAX)
                        {
                            p.until = ts;
                        }
                        dump.place(new_code_addr, code_size, load, ts);
                    }
                }
                JIT_CODE_DEBUG_INFO => {
                    let (Some(code_addr), Some(n)) = (r.u64(), r.u64()) else {
                        return Err(short("JIT_CODE_DEBUG_INFO"));
                    };
                    let mut entries = Vec::new();
                    let mut prev: Option<Arc<str>> = None;
                    for k in 0..n {
                        let at = r.pos;
                        let (Some(addr), Some(line), Some(discrim)) = (r.u64(), r.u32(), r.u32())
                        else {
                            return Err(err(
                                at,
                                format!("JIT_CODE_DEBUG_INFO entry {k} of {n} overruns the record"),
                            ));
                        };
                        let name = r.cstr().ok_or_else(|| {
                            err(at, format!("JIT_CODE_DEBUG_INFO entry {k}: file name not NUL-terminated within the record"))
                        })?;
                        // A name of the single byte 0xff repeats the previous entry's.
                        let file = match (name, &prev) {
                            ([0xff], Some(p)) => p.clone(),
                            _ => files
                                .entry(name.to_vec())
                                .or_insert_with(|| {
                                    Arc::from(String::from_utf8_lossy(name).as_ref())
                                })
                                .clone(),
                        };
                        prev = Some(file.clone());
                        entries.push(JitDebugEntry {
                            addr,
                            line,
                            discrim,
                            file,
                        });
                    }
                    pending_debug.insert(code_addr, entries);
                }
                JIT_CODE_CLOSE => dump.closed = Some(ts),
                JIT_CODE_UNWINDING_INFO => {
                    let (Some(unwind_data_size), Some(eh_frame_hdr_size), Some(mapped_size)) =
                        (r.u64(), r.u64(), r.u64())
                    else {
                        return Err(short("JIT_CODE_UNWINDING_INFO"));
                    };
                    let room = (end - r.pos) as u64;
                    if unwind_data_size > room || eh_frame_hdr_size > unwind_data_size {
                        return Err(err(
                            off,
                            format!(
                                "JIT_CODE_UNWINDING_INFO sizes (data {unwind_data_size}, EH frame header {eh_frame_hdr_size}) exceed the {room} bytes left in the record"
                            ),
                        ));
                    }
                    pending_unwind = Some(dump.unwinding.len());
                    dump.unwinding.push(JitUnwindingInfo {
                        timestamp: ts,
                        unwind_data_size,
                        eh_frame_hdr_size,
                        mapped_size,
                        data: r.pos..r.pos + unwind_data_size as usize,
                    });
                }
                other => dump.unknown.push((off as u64, other)),
            }
            off = end;
        }
        let mut by_start: Vec<usize> = (0..dump.placements.len()).collect();
        by_start.sort_by_key(|&k| dump.placements[k].start);
        dump.by_start = by_start;
        dump.data = data;
        Ok(dump)
    }

    fn place(&mut self, start: u64, size: u64, load: usize, from: u64) {
        let end = start.saturating_add(size);
        self.max_len = self.max_len.max(size);
        let p = Placement {
            start,
            end,
            load,
            from,
            until: u64::MAX,
        };
        self.latest.insert(start, end, self.placements.len());
        self.placements.push(p);
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The dropped incomplete last record, if the file ended mid-record.
    pub fn truncated(&self) -> Option<&Truncation> {
        self.truncated.as_ref()
    }

    /// The code bytes of a load.
    pub fn code(&self, load: &JitCodeLoad) -> &[u8] {
        self.data.get(load.code.clone()).unwrap_or(&[])
    }

    /// The unwinding data (EH frame header + EH frame) of an unwinding record.
    pub fn unwinding_data(&self, u: &JitUnwindingInfo) -> &[u8] {
        self.data.get(u.data.clone()).unwrap_or(&[])
    }

    /// The code at `addr`. With `time` (the jitdump's clock), the code placed there at that
    /// time (loaded or moved there at or before it, not moved away by then; the latest such);
    /// without, the code placed there last in the file.
    pub fn lookup(&self, addr: u64, time: Option<u64>) -> Option<JitHit<'_>> {
        let p = match time {
            None => self.placements.get(self.latest.get(addr)?)?,
            Some(t) => {
                // Placements starting at or below `addr`, no further down than the longest.
                let i = self
                    .by_start
                    .partition_point(|&k| self.placements[k].start <= addr);
                let k = self.by_start[..i]
                    .iter()
                    .rev()
                    .copied()
                    .take_while(|&k| self.placements[k].start.saturating_add(self.max_len) > addr)
                    .filter(|&k| {
                        let p = &self.placements[k];
                        addr < p.end && p.from <= t && t < p.until
                    })
                    .max_by_key(|&k| (self.placements[k].from, k))?;
                &self.placements[k]
            }
        };
        Some(JitHit {
            load: self.loads.get(p.load)?,
            start: p.start,
        })
    }
}
