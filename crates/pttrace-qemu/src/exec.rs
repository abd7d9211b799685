//! Following `execve`: QEMU user mode does not emulate the new image of an `execve`, the
//! host kernel would run it natively. At the syscall's entry the plugin reads the guest's
//! path, argv and envp (in user mode on an x86-64 host, guest addresses are host
//! addresses; checked on the first translated block), flushes this process image's files
//! and itself `execve`s QEMU with this plugin as [`pttrace_format::launch`] describes, so
//! the new image is traced with a new info file. `#!` scripts run their interpreter that way.
//! Images that cannot be followed (another architecture or format, `execveat` with a
//! directory descriptor, no QEMU path given) are named in a `Note` of the info file and
//! run natively, untraced. Variables that would change how the host loads QEMU itself
//! (`LD_*`) are passed to the guest with `-E` instead of the host environment. Other
//! threads of the process end without their `End` record (the kernel kills them in exec).

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;

use std::os::unix::ffi::OsStrExt;

use pttrace_format::launch;
use pttrace_format::ptt::EndReason;

use crate::feeder::Feeder;
use crate::{say, Global};

/// Reads our own memory at `addr` without faulting; returns the bytes read.
pub fn read_memory(addr: u64, buf: &mut [u8]) -> usize {
    let mut done = 0;
    while done < buf.len() {
        let at = addr + done as u64;
        let page_left = (4096 - (at & 4095)) as usize;
        let n = page_left.min(buf.len() - done);
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: n,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: n,
        };
        // SAFETY: process_vm_readv on our own pid copies into `buf` (valid for n bytes from
        // `done`) and reports EFAULT instead of faulting on unmapped memory.
        let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if r <= 0 {
            break;
        }
        done += r as usize;
    }
    done
}

fn read_cstr(addr: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < 1 << 20 {
        let mut chunk = [0u8; 256];
        let n = read_memory(at, &mut chunk[..(256 - (at & 255) as usize)]);
        if n == 0 {
            return None;
        }
        if let Some(z) = chunk[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&chunk[..z]);
            return Some(out);
        }
        out.extend_from_slice(&chunk[..n]);
        at += n as u64;
    }
    None
}

fn read_strings(addr: u64) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    if addr == 0 {
        return Some(out);
    }
    for i in 0..(1u64 << 20) {
        let mut p = [0u8; 8];
        if read_memory(addr + 8 * i, &mut p) != 8 {
            return None;
        }
        let p = u64::from_le_bytes(p);
        if p == 0 {
            return Some(out);
        }
        out.push(read_cstr(p)?);
    }
    None
}

/// An existing regular file with an execute bit (otherwise the guest's own execve fails
/// by itself, with the right error).
fn executable(path: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::fs::metadata(std::ffi::OsStr::from_bytes(path))
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Called at the entry of execve (`a` = path, argv, envp) or execveat (dirfd, path, argv,
/// envp, flags). Returns only when the exec is not followed.
pub fn follow(g: &Global, t: &mut Feeder, num: i64, a: [u64; 5]) {
    let (path, argv, envp) = if num == libc::SYS_execve {
        (a[0], a[1], a[2])
    } else {
        (a[1], a[2], a[3])
    };
    let Some(path_bytes) = read_cstr(path) else {
        return;
    };
    let shown = String::from_utf8_lossy(&path_bytes).into_owned();
    let not_traced = |why: &str| {
        g.note(&format!(
            "exec of {shown} (thread {}) not traced: {why}; it ran natively",
            t.tid
        ))
    };
    if num == libc::SYS_execveat
        && ((a[0] as i32 != libc::AT_FDCWD && !path_bytes.starts_with(b"/")) || a[4] != 0)
    {
        not_traced("execveat with a directory descriptor or flags");
        return;
    }
    if !g.identity_mapped.load(std::sync::atomic::Ordering::Relaxed) {
        not_traced("guest addresses are not host addresses in this QEMU");
        return;
    }
    let (Some(qemu), Some(this)) = (g.cfg.qemu.clone(), g.cfg.this.clone()) else {
        not_traced("the plugin was given no qemu= and self= paths");
        return;
    };
    if !executable(&path_bytes) {
        return;
    }
    let (Some(args), Some(env)) = (read_strings(argv), read_strings(envp)) else {
        return;
    };
    let run = match launch::resolve(&path_bytes, &args) {
        Ok(r) => r,
        Err(why) => {
            not_traced(&why);
            return;
        }
    };
    let (new_argv, host_env) = launch::Plugin {
        plugin: this.as_bytes(),
        out: g.cfg.out.as_os_str().as_bytes(),
        qemu: qemu.as_bytes(),
        oracle: g.cfg.oracle,
        cut: Some(g.cfg.cut),
        extra: g.cfg.carried_args(),
    }
    .command(env, run);
    let to_c = |v: Vec<Vec<u8>>| -> Option<Vec<CString>> {
        v.into_iter().map(|s| CString::new(s).ok()).collect()
    };
    let (Some(cargv), Some(cenv), Ok(cqemu)) =
        (to_c(new_argv), to_c(host_env), CString::new(qemu.clone()))
    else {
        not_traced("an argument or variable holds a NUL byte");
        return;
    };
    for trig in g.cfg.address_triggers() {
        g.note(&format!(
            "snapshot trigger {trig} is not carried into the exec of {shown} (thread {}): it names \
             an address of this image's executable; use addr:SYMBOL to follow a symbol",
            t.tid
        ));
    }
    // Everything of this image is written before the new one starts.
    t.finish(EndReason::Exec);
    g.close_info(EndReason::Exec, 0);
    let mut pargv: Vec<*const libc::c_char> = cargv.iter().map(|c| c.as_ptr()).collect();
    pargv.push(std::ptr::null());
    let mut penv: Vec<*const libc::c_char> = cenv.iter().map(|c| c.as_ptr()).collect();
    penv.push(std::ptr::null());
    // SAFETY: NUL-terminated strings in NULL-terminated arrays, alive across the call.
    unsafe { libc::execve(cqemu.as_ptr(), pargv.as_ptr(), penv.as_ptr()) };
    let e = std::io::Error::last_os_error();
    say(&format!(
        "cannot re-execute {shown} through {qemu}: {e}; it runs natively, untraced"
    ));
}
