//! One frame of a pttrace file (length, type, payload, CRC-32; see
//! [`crate::format::ptt`]) written straight to a file descriptor with the shim's raw
//! syscalls. **Async-signal-safe**: used by the writer thread and inside the SIGSYS
//! handler ([`super::output`], [`super::userpt`], [`super::snapshot::ring`]); no allocation,
//! no locks, no std I/O, no panics.

use super::raw;
use crate::format::ptt::{Crc32, RecordType};

/// Writes one frame whose payload is the concatenation of `parts`, straight to `fd`.
pub fn write_frame_parts(fd: i32, ty: RecordType, parts: &[&[u8]]) -> bool {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let Ok(len32) = u32::try_from(len) else {
        return false;
    };
    let mut head = [0u8; 8];
    head[0..4].copy_from_slice(&len32.to_le_bytes());
    head[4..6].copy_from_slice(&(ty as u16).to_le_bytes());
    let mut crc = Crc32::new();
    crc.update(&head);
    for p in parts {
        crc.update(p);
    }
    let mut ok = raw::write_all(fd, &head);
    for p in parts {
        ok &= raw::write_all(fd, p);
    }
    ok & raw::write_all(fd, &crc.finish().to_le_bytes())
}
