//! `/proc/<pid>/maps` lines and the MMAP2 records perf synthesizes from them.

use crate::perf_record::{encode_mmap2, Mapping, SampleId};

/// One line of `/proc/<pid>/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    pub maj: u32,
    pub min: u32,
    pub inode: u64,
    pub path: String,
}

impl MapsEntry {
    /// Parses `start-end perms offset maj:min inode [path]`.
    pub fn parse(line: &str) -> Option<MapsEntry> {
        // Five space-separated columns, then the path (which may itself contain spaces).
        let mut rest = line;
        let mut col = || -> Option<&str> {
            let t = rest.trim_start();
            let end = t.find(char::is_whitespace).unwrap_or(t.len());
            let (field, tail) = t.split_at(end);
            rest = tail;
            (!field.is_empty()).then_some(field)
        };
        let (range, perms, offset, dev, inode) = (col()?, col()?, col()?, col()?, col()?);
        let path = rest.trim().to_string();
        let (s, e) = range.split_once('-')?;
        let (maj, min) = dev.split_once(':')?;
        let p = perms.as_bytes();
        if p.len() < 4 {
            return None;
        }
        let (start, end) = (
            u64::from_str_radix(s, 16).ok()?,
            u64::from_str_radix(e, 16).ok()?,
        );
        // The kernel never writes an empty or inverted range: such a line is not a mapping.
        if end <= start {
            return None;
        }
        Some(MapsEntry {
            start,
            end,
            read: p[0] == b'r',
            write: p[1] == b'w',
            exec: p[2] == b'x',
            shared: p[3] == b's',
            offset: u64::from_str_radix(offset, 16).ok()?,
            maj: u32::from_str_radix(maj, 16).ok()?,
            min: u32::from_str_radix(min, 16).ok()?,
            inode: inode.parse().ok()?,
            path,
        })
    }

    /// The MMAP2 prot bits.
    pub fn prot(&self) -> u32 {
        let mut p = 0;
        if self.read {
            p |= libc::PROT_READ as u32;
        }
        if self.write {
            p |= libc::PROT_WRITE as u32;
        }
        if self.exec {
            p |= libc::PROT_EXEC as u32;
        }
        p
    }

    /// The name perf uses: the path, or `//anon` for anonymous executable memory.
    pub fn perf_name(&self) -> String {
        if self.path.is_empty() {
            "//anon".into()
        } else {
            self.path.clone()
        }
    }
}

/// Encodes the executable entries of `maps` as MMAP2 records.
pub fn encode_exec_mappings(
    maps: &[MapsEntry],
    pid: u32,
    tid: u32,
    sample_type: u64,
    time: u64,
) -> Vec<u8> {
    let sample = SampleId {
        pid: Some(pid),
        tid: Some(tid),
        time: Some(time),
        cpu: Some(0),
        ..Default::default()
    };
    let mut out = Vec::new();
    for m in maps.iter().filter(|m| m.exec) {
        let mapping = Mapping {
            pid,
            tid,
            addr: m.start,
            len: m.end.saturating_sub(m.start),
            pgoff: m.offset,
            maj: m.maj,
            min: m.min,
            ino: m.inode,
            ino_generation: 0,
            prot: m.prot(),
            flags: if m.shared {
                libc::MAP_SHARED as u32
            } else {
                libc::MAP_PRIVATE as u32
            },
            filename: m.perf_name(),
        };
        out.extend(encode_mmap2(&mapping, &sample, sample_type));
    }
    out
}
