//! Synthesized sideband: MMAP2 records for the executable mappings that existed before a
//! trace window (perf's "synthesized events"), and the vDSO's bytes.
//!
//! The kernel only reports mappings created while an event is active, so a window's own
//! sideband cannot tell the decoder where the already-loaded program and libraries live.

use crate::error::{Error, Result, Status};
pub use pttrace_format::maps::{encode_exec_mappings, MapsEntry};

/// Reads and parses `/proc/self/maps`.
pub fn read_self_maps() -> Result<Vec<MapsEntry>> {
    read_maps("/proc/self/maps")
}

/// Reads and parses a maps file.
pub fn read_maps(path: &str) -> Result<Vec<MapsEntry>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(Status::FailedToReadSidebandData, format!("{path}: {e}")))?;
    Ok(text.lines().filter_map(MapsEntry::parse).collect())
}

/// MMAP2 records for every executable mapping of this process, stamped with `time`.
pub fn synthesize_exec_mmap2(sample_type: u64, time: u64) -> Result<Vec<u8>> {
    let maps = read_self_maps()?;
    // SAFETY: getpid/gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
    Ok(encode_exec_mappings(&maps, pid, tid, sample_type, time))
}

/// The vDSO of this process: (load address, bytes).
pub fn vdso_bytes() -> Result<(u64, Vec<u8>)> {
    let maps = read_self_maps()?;
    let v = maps
        .iter()
        .find(|m| m.path == "[vdso]")
        .ok_or_else(|| Error::new(Status::Error, "this process has no [vdso] mapping"))?;
    let len = (v.end - v.start) as usize;
    let mut bytes = vec![0u8; len];
    // SAFETY: [start, end) is a readable mapping of this process (from /proc/self/maps, the
    // vDSO is mapped r-x for the life of the process) and bytes has len bytes.
    unsafe { std::ptr::copy_nonoverlapping(v.start as *const u8, bytes.as_mut_ptr(), len) };
    Ok((v.start, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sideband::record::{Record, RecordIter, SIDEBAND_SAMPLE_TYPE};

    #[test]
    fn parses_maps_lines() {
        let e = MapsEntry::parse(
            "7f1c2a000000-7f1c2a022000 r-xp 00028000 fd:01 1316 /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(e.start, 0x7f1c2a000000);
        assert_eq!(e.end, 0x7f1c2a022000);
        assert!(e.read && e.exec && !e.write && !e.shared);
        assert_eq!((e.offset, e.maj, e.min, e.inode), (0x28000, 0xfd, 1, 1316));
        assert_eq!(e.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let a = MapsEntry::parse("7ffd1000-7ffd3000 r-xp 00000000 00:00 0 ").unwrap();
        assert_eq!(a.perf_name(), "//anon");
        let s = MapsEntry::parse("1000-2000 r-xp 00000000 00:00 0   /tmp/a b").unwrap();
        assert_eq!(s.path, "/tmp/a b");
        assert_eq!(MapsEntry::parse("garbage"), None);
    }

    #[test]
    fn synthesized_records_equal_exec_entries_of_proc_self_maps() {
        let before = read_self_maps().unwrap();
        let bytes = synthesize_exec_mmap2(SIDEBAND_SAMPLE_TYPE, 42).unwrap();
        let after = read_self_maps().unwrap();
        let recs: Vec<_> = RecordIter::new(&bytes, SIDEBAND_SAMPLE_TYPE)
            .map(|r| r.unwrap().1)
            .collect();
        let exec: Vec<_> = after.iter().filter(|m| m.exec).collect();
        // Mappings could change concurrently (other test threads); require a stable snapshot.
        assert_eq!(
            before.iter().filter(|m| m.exec).count(),
            exec.len(),
            "maps changed during the test"
        );
        assert_eq!(recs.len(), exec.len());
        assert!(exec.iter().any(|m| m.path == "[vdso]"));
        for (r, m) in recs.iter().zip(exec) {
            let Record::Mmap2(mm) = &r.record else {
                panic!("not MMAP2: {r:?}")
            };
            assert_eq!(mm.addr, m.start);
            assert_eq!(mm.len, m.end - m.start);
            assert_eq!(mm.pgoff, m.offset);
            assert_eq!((mm.maj, mm.min, mm.ino), (m.maj, m.min, m.inode));
            assert_eq!(mm.filename, m.perf_name());
            assert_eq!(mm.prot & libc::PROT_EXEC as u32, libc::PROT_EXEC as u32);
            assert_eq!(r.sample.time, Some(42));
        }
    }

    #[test]
    fn vdso_bytes_are_an_elf_image() {
        let (addr, bytes) = vdso_bytes().unwrap();
        assert!(addr != 0);
        assert_eq!(&bytes[..4], b"\x7fELF");
        assert_eq!(bytes.len() % 4096, 0);
    }
}
