//! Output files that appear whole or not at all (`view`'s timelines, stacks and flame
//! graph, `decode --format drmemtrace`'s archives, `profile`'s BOLT and lcov files).
//!
//! A file is written without a name in its directory (`O_TMPFILE`) and linked under its
//! name once complete ([`OutFile::commit`]), replacing an older file of that name in one
//! step (`rename`). Whatever stops the command before (Ctrl-C, a kill, an error, a full
//! disk), nothing is left: neither a file cut short under the name a viewer opens, nor a
//! temporary one (a file without a name goes with its last descriptor). An older output
//! of the same name stays as it was until the new one replaces it.
//!
//! Where the file system has no unnamed files, the file is written as `.NAME.partial`
//! beside it and renamed; an error removes it, a kill leaves it (under a name that says so).

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file being written for `path` (see the module documentation).
pub struct OutFile {
    file: File,
    path: PathBuf,
    /// The name it is written under where unnamed files are not available.
    partial: Option<PathBuf>,
}

/// `.NAME.SUFFIX` beside `path`.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{suffix}"))
}

impl OutFile {
    /// Starts the file for `path`; its errors are those of creating a file there.
    pub fn create(path: &Path) -> io::Result<OutFile> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let unnamed = File::options()
            .read(true)
            .write(true)
            .mode(0o666)
            .custom_flags(libc::O_TMPFILE)
            .open(dir);
        match unnamed {
            Ok(file) => Ok(OutFile {
                file,
                path: path.to_path_buf(),
                partial: None,
            }),
            // (No unnamed files on this file system, or a kernel before 3.11.)
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                let partial = beside(path, "partial");
                let file = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&partial)?;
                Ok(OutFile {
                    file,
                    path: path.to_path_buf(),
                    partial: Some(partial),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Another descriptor of the file, for a writer of its own (on another thread); the
    /// file is committed through this one once that writer is done.
    pub fn writer(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// The file, complete: it takes its name (replacing the file of that name, if any).
    pub fn commit(mut self) -> io::Result<()> {
        let to = &self.path;
        if let Some(partial) = self.partial.take() {
            return std::fs::rename(&partial, to).inspect_err(|_| {
                let _ = std::fs::remove_file(&partial);
            });
        }
        // Linked under a temporary name first, then renamed over `to`: `linkat` does not
        // replace a file.
        let tmp = beside(to, &format!("{}.linking", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        link(&self.file, &tmp)?;
        std::fs::rename(&tmp, to).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

/// [`OutFile::commit`] of a buffered file, once its buffer is written out.
pub fn commit_buffered(w: io::BufWriter<OutFile>) -> io::Result<()> {
    w.into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .commit()
}

/// Gives the unnamed file `file` the name `to`: through its `/proc/self/fd` link (any
/// user), or by its descriptor where /proc is not mounted (`AT_EMPTY_PATH` needs
/// CAP_DAC_READ_SEARCH).
fn link(file: &File, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &[u8]| {
        std::ffi::CString::new(p).map_err(|_| io::Error::other("a path with a NUL byte"))
    };
    let to_c = c(to.as_os_str().as_bytes())?;
    let fd = file.as_raw_fd();
    let proc_path = c(format!("/proc/self/fd/{fd}").as_bytes())?;
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let proc_err = io::Error::last_os_error();
    // SAFETY: an open descriptor, an empty NUL-terminated path and a NUL-terminated
    // target that outlive the call.
    let r = unsafe {
        libc::linkat(
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(proc_err)
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        // Not committed: an unnamed file goes with its descriptor; a named one is removed.
        if let Some(p) = self.partial.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for OutFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_file_has_no_name_until_committed_and_then_replaces_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timeline.json");
        std::fs::write(&path, "old").unwrap();
        let mut f = OutFile::create(&path).unwrap();
        f.write_all(b"new, ").unwrap();
        // Written through a second descriptor too, as a writer thread does.
        f.writer().unwrap().write_all(b"whole").unwrap();
        // (This file system has unnamed files: /tmp on Linux.)
        assert!(f.partial.is_none());
        assert_eq!(names(dir.path()), ["timeline.json"]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        f.commit().unwrap();
        assert_eq!(names(dir.path()), ["timeline.json"]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new, whole");
    }

    #[test]
    fn a_file_not_committed_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stacks.folded");
        let mut f = OutFile::create(&path).unwrap();
        f.write_all(b"cut sho").unwrap();
        drop(f);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn without_unnamed_files_a_partial_file_is_renamed_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.fdata");
        let partial = beside(&path, "partial");
        let named = |p: &Path| OutFile {
            file: File::create(&partial).unwrap(),
            path: p.to_path_buf(),
            partial: Some(partial.clone()),
        };
        let mut f = named(&path);
        f.write_all(b"B 1 2 3 0\n").unwrap();
        assert_eq!(names(dir.path()), [".profile.fdata.partial"]);
        f.commit().unwrap();
        assert_eq!(names(dir.path()), ["profile.fdata"]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "B 1 2 3 0\n");
        drop(named(&path));
        assert_eq!(names(dir.path()), ["profile.fdata"]);
    }

    #[test]
    fn a_missing_directory_is_an_error_and_makes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("out.zip");
        assert!(OutFile::create(&path).is_err());
        assert!(names(dir.path()).is_empty());
    }
}
