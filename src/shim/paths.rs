//! Output file names, built without allocation. **Async-signal-safe.**
//!
//! `<out>/<pid>-<nonce>` is the base of every file of one process image (see
//! [`super::output`]); a thread's files add `-<tid>` and an extension.

use super::process::STATIC;
use super::raw::PathBuf;

pub type Path = PathBuf<4352>;

/// `<out>/<pid>-<nonce>`.
pub fn image_base(pid: i32, nonce: u64) -> Option<Path> {
    let st = STATIC.get()?;
    let mut p = Path::new();
    let ok = p.push(&st.out_dir)
        && p.push(b"/")
        && p.push_dec(pid as u32 as u64)
        && p.push(b"-")
        && p.push_hex(nonce, 8);
    ok.then_some(p)
}

/// `<out>/<pid>-<nonce>-<tid><ext>` (`ext` with its dot).
pub fn thread_file(pid: i32, nonce: u64, tid: i32, ext: &[u8]) -> Option<Path> {
    let mut p = image_base(pid, nonce)?;
    (p.push(b"-") && p.push_dec(tid as u32 as u64) && p.push(ext)).then_some(p)
}
