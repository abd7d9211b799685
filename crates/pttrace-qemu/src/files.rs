//! Writing the trace files: whole frames, appended at known offsets, so a failed write can
//! be cut back to the last whole frame.
//!
//! The traced program shares our descriptor table: it may close our descriptors (a
//! `subprocess` child closes every descriptor above 2 before its exec) and then get the
//! same number for a file of its own, or `dup2` onto it. A [`TraceFile`] therefore checks
//! before each write that its descriptor still is its file (device and inode) and otherwise
//! opens the file again by path, never writing into the program's files; a descriptor
//! that is no longer ours is never closed by us.

use std::ffi::{c_int, c_void};
use std::fs::File;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::path::{Path, PathBuf};

use pttrace_format::ptt::{self, RecordType, WRITE_PIECE};

/// A file of the trace directory written by appending.
pub struct TraceFile {
    file: Option<File>,
    path: PathBuf,
    id: (u64, u64),
    len: u64,
}

fn identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the struct we pass; a bad descriptor is an error return.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

impl TraceFile {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> std::io::Result<TraceFile> {
        let file = File::create(path)?;
        let id = identity(file.as_raw_fd()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(TraceFile {
            file: Some(file),
            path: path.to_path_buf(),
            id,
            len: 0,
        })
    }

    /// The descriptor, after making sure it is still this file (reopened by path if not).
    fn checked(&mut self) -> std::io::Result<&File> {
        let ours = self
            .file
            .as_ref()
            .is_some_and(|f| identity(f.as_raw_fd()) == Some(self.id));
        if !ours {
            if let Some(f) = self.file.take() {
                // The number belongs to the program now (or to nothing): never close it.
                let _ = f.into_raw_fd();
            }
            let f = std::fs::OpenOptions::new().write(true).open(&self.path)?;
            if identity(f.as_raw_fd()) != Some(self.id) {
                return Err(std::io::Error::other(
                    "the file was replaced on disk while being written",
                ));
            }
            self.file = Some(f);
        }
        self.file
            .as_ref()
            .ok_or_else(|| std::io::Error::other("no descriptor"))
    }

    /// Appends `parts` whole; on failure the partial write is cut off again.
    pub fn append(&mut self, parts: &[&[u8]]) -> std::io::Result<()> {
        let at = self.len;
        let f = self.checked()?;
        match write_all_at(f, parts, at) {
            Ok(n) => {
                self.len += n;
                Ok(())
            }
            Err(e) => {
                let _ = f.set_len(at);
                Err(e)
            }
        }
    }

    /// Appends one frame of type `ty`.
    pub fn frame(&mut self, ty: RecordType, payload: &[u8]) -> std::io::Result<()> {
        match ptt::frame_vec(ty, payload) {
            Some(v) => self.append(&[&v]),
            None => Err(std::io::Error::other("record too large")),
        }
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            if identity(f.as_raw_fd()) != Some(self.id) {
                let _ = f.into_raw_fd(); // not ours any more: leave it open
            }
        }
    }
}

/// Writes `parts` one after the other at `offset` (pwritev of at most [`WRITE_PIECE`]
/// bytes, resumed after short writes); returns the bytes written.
pub fn write_all_at(f: &File, parts: &[&[u8]], offset: u64) -> std::io::Result<u64> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0usize;
    while done < total {
        let mut skip = done;
        let mut room = WRITE_PIECE;
        let mut iov = Vec::with_capacity(parts.len());
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            if room == 0 {
                break;
            }
            let len = (p.len() - skip).min(room);
            iov.push(libc::iovec {
                iov_base: p[skip..].as_ptr() as *mut c_void,
                iov_len: len,
            });
            room -= len;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts larger than a piece, pieces ending inside parts and on their boundaries: the
    /// file holds the parts' bytes, one after the other, from the offset on.
    #[test]
    fn write_all_at_writes_every_part_in_pieces() {
        let dir = std::env::temp_dir().join(format!("pttrace-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pieces");
        let f = File::create(&path).unwrap();
        let big: Vec<u8> = (0..WRITE_PIECE * 5 / 2)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let exact = vec![0xa5u8; WRITE_PIECE - 3];
        let parts: [&[u8]; 5] = [b"abc", &exact, &big, b"", b"xyz"];
        let n = write_all_at(&f, &parts, 5).unwrap();
        let want: Vec<u8> = parts.concat();
        assert_eq!(n, want.len() as u64);
        let got = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got.len(), 5 + want.len());
        assert!(got[..5].iter().all(|&b| b == 0));
        assert!(
            got[5..] == want[..],
            "the bytes written differ from the parts"
        );
    }
}
