//! Following `execve`: QEMU user mode does not emulate the new image of an `execve`, the
//! host kernel would run it natively. At the syscall's entry the plugin reads the guest's
//! path, argv and envp (in user mode on an x86-64 host, guest addresses are host
//! addresses; checked on the first translated block), flushes this process image's files
//! and itself `execve`s `qemu-x86_64 -plugin <this plugin> ... -0 argv0 prog args`, so the
//! new image is traced with a new info file. `#!` scripts run their interpreter that way.
//! Images that cannot be followed (another architecture or format, `execveat` with a
//! directory descriptor, no QEMU path given) are named in a `Note` of the info file and
//! run natively, untraced. Variables that would change how the host loads QEMU itself
//! (`LD_*`) are passed to the guest with `-E` instead of the host environment. Other
//! threads of the process end without their `End` record (the kernel kills them in exec).

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;

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

/// What the first bytes of an executable say.
enum Kind {
    X86_64Elf,
    Script {
        interp: Vec<u8>,
        arg: Option<Vec<u8>>,
    },
    Other(String),
}

fn kind_of(path: &[u8]) -> Option<Kind> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let p = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return None;
    }
    let mut head = [0u8; 256];
    let n = std::fs::File::open(p).ok()?.read(&mut head).ok()?;
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        let class = head.get(4).copied();
        let machine = head.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]]));
        return Some(match (class, machine) {
            (Some(2), Some(62)) => Kind::X86_64Elf,
            (c, m) => Kind::Other(format!(
                "ELF class {} machine {} is not x86-64",
                c.unwrap_or(0),
                m.unwrap_or(0)
            )),
        });
    }
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|b| *b == b'\n').next().unwrap_or(&[]);
        let line = line.trim_ascii();
        let (interp, arg) = match line.iter().position(|b| *b == b' ' || *b == b'\t') {
            Some(i) => (&line[..i], Some(line[i..].trim_ascii().to_vec())),
            None => (line, None),
        };
        return Some(Kind::Script {
            interp: interp.to_vec(),
            arg: arg.filter(|a| !a.is_empty()),
        });
    }
    Some(Kind::Other("not an ELF file or #! script".into()))
}

/// Doubles commas: QEMU's option syntax for a value inside `-plugin`.
fn opt_escape(v: &str) -> String {
    v.replace(',', ",,")
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
    let Some(kind) = kind_of(&path_bytes) else {
        return; // missing or not executable: the guest's execve fails by itself
    };
    let (Some(args), Some(env)) = (read_strings(argv), read_strings(envp)) else {
        return;
    };
    let argv0 = args.first().cloned().unwrap_or_else(|| path_bytes.clone());
    let (prog, argv0, rest): (Vec<u8>, Vec<u8>, Vec<Vec<u8>>) = match kind {
        Kind::X86_64Elf => (
            path_bytes.clone(),
            argv0,
            args.into_iter().skip(1).collect(),
        ),
        Kind::Script { interp, arg } => {
            match kind_of(&interp) {
                Some(Kind::X86_64Elf) => {}
                _ => {
                    not_traced(&format!(
                        "its interpreter {} is not an x86-64 program",
                        String::from_utf8_lossy(&interp)
                    ));
                    return;
                }
            }
            let mut rest = Vec::new();
            rest.extend(arg);
            rest.push(path_bytes.clone());
            rest.extend(args.into_iter().skip(1));
            (interp.clone(), interp, rest)
        }
        Kind::Other(why) => {
            not_traced(&why);
            return;
        }
    };
    let mut spec = format!(
        "file={},out={},qemu={},self={}",
        opt_escape(&this),
        opt_escape(&g.cfg.out.display().to_string()),
        opt_escape(&qemu),
        opt_escape(&this)
    );
    if g.cfg.oracle {
        spec.push_str(",oracle=on");
    }
    spec.push_str(&format!(",cut={}", g.cfg.cut));
    let mut new_argv: Vec<Vec<u8>> = vec![
        qemu.clone().into_bytes(),
        b"-plugin".to_vec(),
        spec.into_bytes(),
    ];
    let mut host_env = Vec::new();
    for e in env {
        if e.starts_with(b"LD_") {
            new_argv.push(b"-E".to_vec());
            new_argv.push(e);
        } else {
            host_env.push(e);
        }
    }
    new_argv.push(b"-0".to_vec());
    new_argv.push(argv0);
    new_argv.push(prog);
    new_argv.extend(rest);
    let to_c = |v: Vec<Vec<u8>>| -> Option<Vec<CString>> {
        v.into_iter().map(|s| CString::new(s).ok()).collect()
    };
    let (Some(cargv), Some(cenv), Ok(cqemu)) =
        (to_c(new_argv), to_c(host_env), CString::new(qemu.clone()))
    else {
        not_traced("an argument or variable holds a NUL byte");
        return;
    };
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
