//! Writing the trace files: whole frames, appended at known offsets, so a failed write can
//! be cut back to the last whole frame.

use std::ffi::{c_int, c_void};
use std::fs::File;
use std::io::Write;

use pttrace_format::ptt::{self, RecordType};

pub fn write_frame(f: &mut File, ty: RecordType, payload: &[u8]) -> std::io::Result<()> {
    match ptt::frame_vec(ty, payload) {
        Some(v) => f.write_all(&v),
        None => Err(std::io::Error::other("record too large")),
    }
}

/// Writes `parts` one after the other at `offset` (pwritev, resumed after short writes);
/// returns the bytes written.
pub fn write_all_at(f: &File, parts: &[&[u8]], offset: u64) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0usize;
    while done < total {
        let mut skip = done;
        let mut iov = Vec::with_capacity(parts.len());
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            iov.push(libc::iovec {
                iov_base: p[skip..].as_ptr() as *mut c_void,
                iov_len: p.len() - skip,
            });
            skip = 0;
        }
        // SAFETY: every iovec points into a live slice of `parts` for its length.
        let n = unsafe {
            libc::pwritev(
                f.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as c_int,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        done += n as usize;
    }
    Ok(total as u64)
}
