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

use pttrace_format::perf_record::{
    self as perf, Mapping, Record as PerfRecord, RecordIter, SampleId, PERF_AUX_FLAG_OVERWRITE,
    PERF_AUX_FLAG_TRUNCATED,
};

/// `sample_type` used by [`encode_mmap2`] (the project's sideband sample_type).
pub const TEST_SAMPLE_TYPE: u64 = perf::SIDEBAND_SAMPLE_TYPE;

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
    /// The bytes of code executed at `addr` (a software backend's code record).
    Code { addr: u64, bytes: Vec<u8> },
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

impl ImageEvent {
    /// Whether it applies at trace time `now` (`None`: whatever the time; an event
    /// without time applies at any).
    fn is_due(&self, now: Option<u64>) -> bool {
        match (now, self.time) {
            (Some(now), Some(t)) => t <= now,
            _ => true,
        }
    }
}

/// Parses a buffer of raw perf records (as copied out of a perf DATA ring) with the given
/// `sample_type` (it decides the sample_id trailer layout) into image events, sorted by
/// time. Records that do not change the image are skipped; a malformed record is an error
/// naming `source` and its offset.
pub fn parse_records(
    source: &str,
    data: &[u8],
    sample_type: u64,
) -> Result<Vec<ImageEvent>, DecodeError> {
    parse_window_sideband(source, data, sample_type).map(|(events, _)| events)
}

/// [`parse_records`], and the loads and stores its memory records hold
/// ([`pttrace_format::memory`], the QEMU backend's `--memory`), in execution order.
pub fn parse_window_sideband(
    source: &str,
    data: &[u8],
    sample_type: u64,
) -> Result<(Vec<ImageEvent>, pttrace_format::memory::Packed), DecodeError> {
    const PROT_EXEC: u32 = 4;
    let mut out = Vec::new();
    let mut memory = pttrace_format::memory::Packed::default();
    for item in RecordIter::new(data, sample_type) {
        let (_, rec) = item.map_err(|e| {
            DecodeError::new(
                source,
                e.offset as u64,
                format!("{} (is --sample-type right?)", e.reason),
            )
        })?;
        let map = |m: Mapping| ImageChange::Map {
            addr: m.addr,
            len: m.len,
            pgoff: m.pgoff,
            filename: m.filename,
        };
        let change = match rec.record {
            // MMAP records exist for executable mappings only.
            PerfRecord::Mmap(m) => Some(map(m)),
            PerfRecord::Mmap2(m) if m.prot & PROT_EXEC != 0 => Some(map(m)),
            PerfRecord::Comm {
                comm, exec: true, ..
            } => Some(ImageChange::Exec { comm }),
            PerfRecord::TextPoke { addr, bytes } => Some(ImageChange::Code { addr, bytes }),
            PerfRecord::Memory(body) => {
                // (The head was checked by the record's parser.)
                let _ = memory.push_body(&body);
                None
            }
            PerfRecord::Lost { lost, .. } => Some(ImageChange::Lost {
                what: format!("{lost} sideband records lost"),
            }),
            PerfRecord::Aux { flags, .. }
                if flags & (PERF_AUX_FLAG_TRUNCATED | PERF_AUX_FLAG_OVERWRITE) != 0 =>
            {
                Some(ImageChange::Lost {
                    what: format!("AUX flags {flags:#x}: trace truncated or overwritten"),
                })
            }
            _ => None,
        };
        if let Some(change) = change {
            out.push(ImageEvent {
                time: rec.sample.time,
                cpu: rec.sample.cpu,
                change,
            });
        }
    }
    // Stable sort keeps same-time records in stream order.
    out.sort_by_key(|e| e.time.unwrap_or(0));
    Ok((out, memory))
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

    /// Applies one window's sideband before the window (pttrace thread files): mappings
    /// in order, then the captured code in one pass, since it is what actually ran. Adds
    /// to `warnings` the changes that could not be applied fully (each message once).
    pub fn apply_window(
        &mut self,
        space: &mut AddressSpace,
        events: &[ImageEvent],
        warnings: &mut Vec<String>,
    ) {
        let mut code = Vec::new();
        for ev in events {
            if let ImageChange::Code { addr, bytes } = &ev.change {
                code.push((*addr, bytes.as_slice()));
            } else if let Some(w) = self.apply(space, &ev.change) {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
        }
        space.add_code(&code);
    }

    /// Applies one change; returns a message when it could not be applied fully.
    pub fn apply(&mut self, space: &mut AddressSpace, change: &ImageChange) -> Option<String> {
        match change {
            ImageChange::Exec { .. } => {
                space.clear();
                None
            }
            ImageChange::Lost { .. } => None,
            ImageChange::Code { addr, bytes } => {
                space.add_code(&[(*addr, bytes.as_slice())]);
                None
            }
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

    /// How many events have been applied (always a prefix of the list).
    pub(crate) fn applied(&self) -> usize {
        self.next
    }

    /// The pending events [`advance`](Self::advance) applies at `now`, if any.
    pub(crate) fn due(&self, now: u64) -> Option<&[ImageEvent]> {
        let rest = self.events.get(self.next..)?;
        let n = rest.iter().take_while(|e| e.is_due(Some(now))).count();
        rest.get(..n).filter(|d| !d.is_empty())
    }

    /// Perf time of the last event applied (`Some(0)` for a time-less one), if any.
    pub(crate) fn last_applied_time(&self) -> Option<u64> {
        let i = self.next.checked_sub(1)?;
        self.events.get(i).map(|e| e.time.unwrap_or(0))
    }

    /// Perf time of the next pending event (`Some(0)` for a time-less event).
    pub fn next_time(&self) -> Option<u64> {
        self.events.get(self.next).map(|e| e.time.unwrap_or(0))
    }

    /// Applies every pending event with time <= `now` (all of them when `now` is None).
    /// Returns warnings (images that could not be loaded) and the data losses passed.
    pub fn advance(
        &mut self,
        now: Option<u64>,
        space: &mut AddressSpace,
        resolver: &mut ImageResolver,
    ) -> (Vec<String>, Vec<String>) {
        let mut warnings = Vec::new();
        let mut losses = Vec::new();
        while let Some(ev) = self.events.get(self.next) {
            if !ev.is_due(now) {
                break;
            }
            if let ImageChange::Lost { what } = &ev.change {
                losses.push(what.clone());
            }
            if let Some(w) = resolver.apply(space, &ev.change) {
                warnings.push(w);
            }
            self.next += 1;
        }
        (warnings, losses)
    }
}

/// Encodes an executable MMAP2 record with a [`TEST_SAMPLE_TYPE`] trailer (tests, tools).
pub fn encode_mmap2(
    pid: u32,
    tid: u32,
    addr: u64,
    len: u64,
    pgoff: u64,
    filename: &Path,
    time: u64,
) -> Vec<u8> {
    let m = Mapping {
        pid,
        tid,
        addr,
        len,
        pgoff,
        maj: 0,
        min: 0,
        ino: 0,
        ino_generation: 0,
        prot: 5,  // PROT_READ | PROT_EXEC
        flags: 2, // MAP_PRIVATE
        filename: filename.to_string_lossy().into_owned(),
    };
    let sample = SampleId {
        pid: Some(pid),
        tid: Some(tid),
        time: Some(time),
        cpu: Some(0),
        identifier: Some(0),
        ..Default::default()
    };
    perf::encode_mmap2(&m, &sample, TEST_SAMPLE_TYPE)
}

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

    #[test]
    fn sysroot_vdso_and_exec_resolution() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/lib")).unwrap();
        std::fs::write(dir.path().join("usr/lib/libx.so"), [0x90u8; 64]).unwrap();
        let mut r = ImageResolver::new(Some(dir.path().to_path_buf()), Some(vec![0xc3; 16]));
        let mut space = AddressSpace::new();
        let map = |f: &str, addr| ImageChange::Map {
            addr,
            len: 32,
            pgoff: 16,
            filename: f.into(),
        };
        assert_eq!(r.apply(&mut space, &map("/usr/lib/libx.so", 0x1000)), None);
        assert_eq!(r.apply(&mut space, &map("[vdso]", 0x9000)), None);
        assert_eq!(r.apply(&mut space, &map("[heap]", 0x5000)), None);
        let miss = r.apply(&mut space, &map("/nope/liby.so", 0x7000)).unwrap();
        assert!(miss.contains("nope/liby.so"), "{miss}");
        let mut b = [0u8; 4];
        assert_eq!(space.read(0x101f, &mut b), 1);
        assert_eq!(space.read(0x1020, &mut b), 0);
        assert_eq!(space.read(0x9000, &mut b), 4);
        assert_eq!(b, [0xc3; 4]);
        assert_eq!(space.segments().len(), 2);
        r.apply(&mut space, &ImageChange::Exec { comm: "x".into() });
        assert!(space.is_empty());
    }
}
