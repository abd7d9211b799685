//! Keeping the shim in exec'd images. **Async-signal-safe** (runs in the SIGSYS handler
//! before `execve`/`execveat`): reads the application's `envp` and, when it lacks the
//! shim's `LD_PRELOAD` entry or any `PTTRACER_*` setting, builds a new environment array in
//! an `mmap`ed buffer (no allocation) that has them. Settings the application passes
//! explicitly are kept; an existing `LD_PRELOAD` keeps its value after the shim's path.

use super::raw;
use super::slots::STATIC;

const MAX_ENTRIES: usize = 1 << 16;
const MAX_STR: usize = 1 << 20;
const LD_PRELOAD: &[u8] = b"LD_PRELOAD=";

/// Length of the NUL-terminated string at `p` (at most MAX_STR).
///
/// # Safety
/// `p` points to a NUL-terminated string the application passed to exec.
unsafe fn c_len(p: *const u8) -> usize {
    let mut n = 0;
    // SAFETY: caller contract; we stop at the NUL or at MAX_STR.
    while n < MAX_STR && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    n
}

/// # Safety
/// As [`c_len`].
unsafe fn c_bytes<'a>(p: *const u8) -> &'a [u8] {
    // SAFETY: caller contract; c_len bytes are readable.
    unsafe { std::slice::from_raw_parts(p, c_len(p)) }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A replacement environment; unmap it with [`Patched::release`] if the exec fails.
pub struct Patched {
    pub envp: u64,
    map: *mut u8,
    len: usize,
}

impl Patched {
    pub fn release(self) {
        raw::munmap(self.map, self.len);
    }
}

/// The environment to pass instead of `envp`, or None when it already carries the shim.
pub fn patch(envp: u64) -> Option<Patched> {
    let st = STATIC.get()?;
    if st.lib_path.is_empty() {
        return None;
    }
    let vars = envp as *const u64;
    let mut n = 0usize;
    let mut preload_at: Option<usize> = None;
    let mut preload_ok = false;
    let mut have = [false; 16];
    while envp != 0 && n < MAX_ENTRIES {
        // SAFETY: envp is the NULL-terminated array the application passes to exec.
        let p = unsafe { *vars.add(n) };
        if p == 0 {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string.
        let s = unsafe { c_bytes(p as *const u8) };
        if s.starts_with(LD_PRELOAD) {
            preload_at = Some(n);
            preload_ok = contains(s, &st.lib_path);
        }
        for (i, e) in st.exec_env.iter().enumerate() {
            let name_len = e.iter().position(|&b| b == b'=').map_or(0, |x| x + 1);
            if let (Some(h), Some(name)) = (have.get_mut(i), e.get(..name_len)) {
                if s.starts_with(name) {
                    *h = true;
                }
            }
        }
        n += 1;
    }
    let missing = st
        .exec_env
        .iter()
        .enumerate()
        .filter(|(i, _)| !have.get(*i).copied().unwrap_or(true))
        .count();
    if preload_ok && missing == 0 {
        return None;
    }
    // Old LD_PRELOAD value (after the '='), kept behind ours.
    let old: &[u8] = match preload_at {
        // SAFETY: as above.
        Some(i) => unsafe { c_bytes(*vars.add(i) as *const u8) }
            .get(LD_PRELOAD.len()..)
            .unwrap_or(&[]),
        None => &[],
    };
    let ptrs = (n + st.exec_env.len() + 2) * 8;
    let strlen = LD_PRELOAD.len() + st.lib_path.len() + 1 + old.len() + 1;
    let len = (ptrs + strlen).next_multiple_of(4096);
    let map = raw::mmap_anon(len)?;
    // SAFETY: map is a fresh RW mapping of len bytes: pointers first, then the string.
    let (out, text) = unsafe {
        (
            std::slice::from_raw_parts_mut(map as *mut u64, ptrs / 8),
            std::slice::from_raw_parts_mut(map.add(ptrs), strlen),
        )
    };
    let mut t = 0;
    for part in [LD_PRELOAD, &st.lib_path[..]] {
        if let Some(d) = text.get_mut(t..t + part.len()) {
            d.copy_from_slice(part);
        }
        t += part.len();
    }
    if !old.is_empty() {
        if let Some(d) = text.get_mut(t) {
            *d = b':';
        }
        t += 1;
        if let Some(d) = text.get_mut(t..t + old.len()) {
            d.copy_from_slice(old);
        }
        t += old.len();
    }
    if let Some(d) = text.get_mut(t) {
        *d = 0;
    }
    let mut k = 0;
    let mut put = |v: u64| {
        if let Some(o) = out.get_mut(k) {
            *o = v;
        }
        k += 1;
    };
    put(text.as_ptr() as u64);
    for i in 0..n {
        if Some(i) != preload_at {
            // SAFETY: i < n entries read above.
            put(unsafe { *vars.add(i) });
        }
    }
    for (i, e) in st.exec_env.iter().enumerate() {
        if !have.get(i).copied().unwrap_or(true) {
            put(e.as_ptr() as u64);
        }
    }
    put(0);
    Some(Patched {
        envp: map as u64,
        map,
        len,
    })
}
