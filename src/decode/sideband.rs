//! The image over time, from perf sideband records (MMAP, MMAP2, COMM).
//!
//! Records are parsed into [`ImageEvent`]s with their perf time (from the sample_id
//! trailer when `sample_type` has TIME). The decoder applies them in time order as the
//! trace's TSC (converted to perf time) advances; events before the trace's first
//! timestamp form the initial image. MMAP/MMAP2 add (or replace) code at an address; a
//! COMM with the exec flag resets the process image. Paths are looked up under a sysroot.

use std::path::{Path, PathBuf};

use super::image::{AddressSpace, FileCache};
use super::DecodeError;

/// perf record types used here (see REFERENCE §2).
pub const PERF_RECORD_MMAP: u32 = 1;
pub const PERF_RECORD_LOST: u32 = 2;
pub const PERF_RECORD_COMM: u32 = 3;
pub const PERF_RECORD_MMAP2: u32 = 10;
pub const PERF_RECORD_AUX: u32 = 11;
/// `misc` flag of COMM records caused by exec.
pub const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;
/// sample_type bits that put fields into the sample_id trailer.
pub const PERF_SAMPLE_TID: u64 = 1 << 1;
pub const PERF_SAMPLE_TIME: u64 = 1 << 2;
pub const PERF_SAMPLE_ID: u64 = 1 << 6;
pub const PERF_SAMPLE_CPU: u64 = 1 << 7;
pub const PERF_SAMPLE_STREAM_ID: u64 = 1 << 9;
pub const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;

/// One change of the traced image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageChange {
    /// `len` bytes of `filename` at file offset `pgoff` are mapped at `addr`.
    Map {
        addr: u64,
        len: u64,
        pgoff: u64,
        filename: String,
    },
    /// exec: the process image is replaced (everything before is unmapped).
    Exec { comm: String },
    /// Sideband records were lost (PERF_RECORD_LOST) or the AUX area lost trace.
    Lost { what: String },
}

/// An [`ImageChange`] at a perf time (`None` = no time in the record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEvent {
    pub time: Option<u64>,
    pub cpu: Option<u32>,
    pub change: ImageChange,
}

/// Parses a buffer of raw perf records (as copied out of a perf DATA ring) with the given
/// `sample_type` (it decides the sample_id trailer layout). Unknown record types are
/// skipped; a malformed record stops parsing with an error naming its offset.
pub fn parse_records(
    source: &str,
    data: &[u8],
    sample_type: u64,
) -> Result<Vec<ImageEvent>, DecodeError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    let trailer_len = [
        PERF_SAMPLE_TID,
        PERF_SAMPLE_TIME,
        PERF_SAMPLE_ID,
        PERF_SAMPLE_STREAM_ID,
        PERF_SAMPLE_CPU,
        PERF_SAMPLE_IDENTIFIER,
    ]
    .iter()
    .filter(|&&b| sample_type & b != 0)
    .count()
        * 8;
    let time_at = usize::from(sample_type & PERF_SAMPLE_TID != 0) * 8;
    let cpu_at = time_at
        + [PERF_SAMPLE_TIME, PERF_SAMPLE_ID, PERF_SAMPLE_STREAM_ID]
            .iter()
            .filter(|&&b| sample_type & b != 0)
            .count()
            * 8;
    while pos + 8 <= data.len() {
        let u32_at = |b: &[u8], o: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
        };
        let u64_at = |b: &[u8], o: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
        };
        let ty = u32_at(data, pos).unwrap_or(0);
        let misc = u16::from_le_bytes([data[pos + 4], data[pos + 5]]);
        let size = usize::from(u16::from_le_bytes([data[pos + 6], data[pos + 7]]));
        if size < 8 || pos + size > data.len() {
            return Err(DecodeError::new(
                source,
                pos as u64,
                format!(
                    "perf record (type {ty}) has size {size}, which does not fit the {} bytes left; \
                     is --sample-type right?",
                    data.len() - pos
                ),
            ));
        }
        let rec = &data[pos..pos + size];
        let body_end = size.saturating_sub(trailer_len).max(8);
        let trailer = rec.get(body_end..).unwrap_or(&[]);
        let time = if sample_type & PERF_SAMPLE_TIME != 0 {
            u64_at(trailer, time_at)
        } else {
            None
        };
        let cpu = if sample_type & PERF_SAMPLE_CPU != 0 {
            u32_at(trailer, cpu_at)
        } else {
            None
        };
        let body = &rec[8..body_end];
        let cstr = |b: &[u8]| -> String {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        let bad = |what: &str| {
            DecodeError::new(
                source,
                pos as u64,
                format!("truncated {what} record (size {size})"),
            )
        };
        let change = match ty {
            PERF_RECORD_MMAP => {
                let (addr, len, pgoff) = (
                    u64_at(body, 8).ok_or_else(|| bad("MMAP"))?,
                    u64_at(body, 16).ok_or_else(|| bad("MMAP"))?,
                    u64_at(body, 24).ok_or_else(|| bad("MMAP"))?,
                );
                Some(ImageChange::Map {
                    addr,
                    len,
                    pgoff,
                    filename: cstr(body.get(32..).unwrap_or(&[])),
                })
            }
            PERF_RECORD_MMAP2 => {
                let (addr, len, pgoff) = (
                    u64_at(body, 8).ok_or_else(|| bad("MMAP2"))?,
                    u64_at(body, 16).ok_or_else(|| bad("MMAP2"))?,
                    u64_at(body, 24).ok_or_else(|| bad("MMAP2"))?,
                );
                // maj/min/ino/ino_generation (or build id): 24 bytes, then prot, flags.
                let prot = u32_at(body, 56).ok_or_else(|| bad("MMAP2"))?;
                const PROT_EXEC: u32 = 4;
                (prot & PROT_EXEC != 0).then(|| ImageChange::Map {
                    addr,
                    len,
                    pgoff,
                    filename: cstr(body.get(64..).unwrap_or(&[])),
                })
            }
            PERF_RECORD_COMM if misc & PERF_RECORD_MISC_COMM_EXEC != 0 => Some(ImageChange::Exec {
                comm: cstr(body.get(8..).unwrap_or(&[])),
            }),
            PERF_RECORD_LOST => Some(ImageChange::Lost {
                what: format!(
                    "{} sideband records lost",
                    u64_at(body, 8).ok_or_else(|| bad("LOST"))?
                ),
            }),
            PERF_RECORD_AUX => {
                let flags = u64_at(body, 16).ok_or_else(|| bad("AUX"))?;
                (flags & 0x3 != 0).then(|| ImageChange::Lost {
                    what: format!("AUX flags {flags:#x}: trace truncated or overwritten"),
                })
            }
            _ => None,
        };
        if let Some(change) = change {
            out.push(ImageEvent { time, cpu, change });
        }
        pos += size;
    }
    // Stable sort keeps same-time records in stream order.
    out.sort_by_key(|e| e.time.unwrap_or(0));
    Ok(out)
}

/// Resolves sideband file names to image bytes.
#[derive(Debug, Default, Clone)]
pub struct ImageResolver {
    /// Prefix for the absolute paths in MMAP records.
    pub sysroot: Option<PathBuf>,
    /// Saved vDSO bytes (mapped for `[vdso]`).
    pub vdso: Option<Vec<u8>>,
    files: FileCache,
}

impl ImageResolver {
    pub fn new(sysroot: Option<PathBuf>, vdso: Option<Vec<u8>>) -> Self {
        ImageResolver {
            sysroot,
            vdso,
            files: FileCache::default(),
        }
    }

    fn resolve(&self, filename: &str) -> PathBuf {
        match &self.sysroot {
            Some(root) => root.join(filename.trim_start_matches('/')),
            None => PathBuf::from(filename),
        }
    }

    /// Applies one change; returns a message when it could not be applied fully.
    pub fn apply(&mut self, space: &mut AddressSpace, change: &ImageChange) -> Option<String> {
        match change {
            ImageChange::Exec { .. } => {
                space.clear();
                None
            }
            ImageChange::Lost { .. } => None,
            ImageChange::Map {
                addr,
                len,
                pgoff,
                filename,
            } => {
                if filename == "[vdso]" {
                    return match &self.vdso {
                        Some(v) => {
                            let n = v.len().min(usize::try_from(*len).unwrap_or(usize::MAX));
                            space.add_bytes("[vdso]", v[..n].to_vec(), *addr);
                            None
                        }
                        None => Some("no vDSO bytes given for [vdso]".into()),
                    };
                }
                if filename.starts_with('[') || filename.starts_with("//anon") {
                    return None;
                }
                let path = self.resolve(filename);
                match self.files.get(&path) {
                    Some(b) => {
                        space.add_file_range(b, *pgoff, *len, *addr);
                        None
                    }
                    None => Some(format!("cannot open {}", path.display())),
                }
            }
        }
    }
}

/// The pending image events of one trace, applied as time advances.
#[derive(Debug, Default)]
pub struct ImageTimeline {
    events: Vec<ImageEvent>,
    next: usize,
}

impl ImageTimeline {
    pub fn new(events: Vec<ImageEvent>) -> Self {
        ImageTimeline { events, next: 0 }
    }

    pub fn is_done(&self) -> bool {
        self.next >= self.events.len()
    }

    /// Perf time of the next pending event (`Some(0)` for a time-less event).
    pub fn next_time(&self) -> Option<u64> {
        self.events.get(self.next).map(|e| e.time.unwrap_or(0))
    }

    /// Applies every pending event with time <= `now` (all of them when `now` is None).
    /// Returns (whether anything changed, warnings).
    pub fn advance(
        &mut self,
        now: Option<u64>,
        space: &mut AddressSpace,
        resolver: &mut ImageResolver,
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        while let Some(ev) = self.events.get(self.next) {
            if let (Some(now), Some(t)) = (now, ev.time) {
                if t > now {
                    break;
                }
            }
            if let Some(w) = resolver.apply(space, &ev.change) {
                warnings.push(w);
            }
            self.next += 1;
        }
        warnings
    }
}

/// Encodes an MMAP2 record (executable mapping) with a sample_id trailer of
/// TID|TIME|CPU|IDENTIFIER, for tests and tools that synthesize sideband.
pub fn encode_mmap2(
    pid: u32,
    tid: u32,
    addr: u64,
    len: u64,
    pgoff: u64,
    filename: &Path,
    time: u64,
) -> Vec<u8> {
    let name = filename.as_os_str().as_encoded_bytes();
    let name_len = (name.len() + 1).div_ceil(8) * 8;
    let size = 8 + 8 + 24 + 24 + 8 + name_len + 32;
    let mut r = Vec::with_capacity(size);
    r.extend_from_slice(&PERF_RECORD_MMAP2.to_le_bytes());
    r.extend_from_slice(&2u16.to_le_bytes()); // PERF_RECORD_MISC_USER
    r.extend_from_slice(&(size as u16).to_le_bytes());
    r.extend_from_slice(&pid.to_le_bytes());
    r.extend_from_slice(&tid.to_le_bytes());
    r.extend_from_slice(&addr.to_le_bytes());
    r.extend_from_slice(&len.to_le_bytes());
    r.extend_from_slice(&pgoff.to_le_bytes());
    r.extend_from_slice(&[0u8; 24]); // maj, min, ino, ino_generation
    r.extend_from_slice(&5u32.to_le_bytes()); // PROT_READ|PROT_EXEC
    r.extend_from_slice(&2u32.to_le_bytes()); // MAP_PRIVATE
    r.extend_from_slice(name);
    r.resize(r.len() + name_len - name.len(), 0);
    r.extend_from_slice(&pid.to_le_bytes());
    r.extend_from_slice(&tid.to_le_bytes());
    r.extend_from_slice(&time.to_le_bytes());
    r.extend_from_slice(&0u64.to_le_bytes()); // cpu, res
    r.extend_from_slice(&0u64.to_le_bytes()); // identifier
    r
}

/// `sample_type` used by [`encode_mmap2`]: TID|TIME|CPU|IDENTIFIER.
pub const TEST_SAMPLE_TYPE: u64 =
    PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU | PERF_SAMPLE_IDENTIFIER;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmap2_roundtrip_and_garbage() {
        let mut buf = encode_mmap2(1, 2, 0x400000, 0x1000, 0, Path::new("/bin/x"), 77);
        buf.extend(encode_mmap2(
            1,
            2,
            0x500000,
            0x2000,
            0x1000,
            Path::new("/y"),
            5,
        ));
        let ev = parse_records("sb", &buf, TEST_SAMPLE_TYPE).unwrap();
        assert_eq!(ev.len(), 2);
        // Sorted by time: the t=5 record first.
        assert_eq!(ev[0].time, Some(5));
        assert_eq!(
            ev[1].change,
            ImageChange::Map {
                addr: 0x400000,
                len: 0x1000,
                pgoff: 0,
                filename: "/bin/x".into()
            }
        );
        assert_eq!(ev[1].cpu, Some(0));
        let err = parse_records("sb", &buf[..20], TEST_SAMPLE_TYPE).unwrap_err();
        assert!(err.to_string().contains("sb"), "{err}");
    }
}
