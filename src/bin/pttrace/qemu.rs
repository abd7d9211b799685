//! The QEMU backend of `pttrace run`: the program runs under QEMU's user-mode emulator
//! (`qemu-x86_64`) with pttrace's TCG plugin (`libpttrace_qemu.so`, the `pttrace-qemu`
//! crate), which writes genuine PT of every thread into the trace directory and follows
//! `execve` by re-executing the new image through QEMU.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// File name of the plugin.
pub const PLUGIN_NAME: &str = "libpttrace_qemu.so";
/// Default emulator.
pub const QEMU_NAME: &str = "qemu-x86_64";

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `name` searched along `PATH` (a name with a slash is taken as it is).
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// The emulator: `--qemu PATH`, or `qemu-x86_64` along PATH.
pub fn find_qemu(explicit: Option<&Path>) -> Result<PathBuf, String> {
    match explicit {
        Some(p) => {
            if is_executable(p) {
                Ok(p.to_path_buf())
            } else {
                Err(format!("--qemu {}: not an executable file", p.display()))
            }
        }
        None => which(QEMU_NAME).ok_or_else(|| {
            format!(
                "{QEMU_NAME} not found in PATH: install QEMU's user-mode emulator \
                 (Debian/Ubuntu: `apt-get install qemu-user`) or pass --qemu PATH"
            )
        }),
    }
}

/// The plugin: `--qemu-plugin PATH`, else beside this executable (target/<profile>/, or
/// its parent for test executables in deps/), else in the install prefix's `lib/`.
pub fn find_plugin(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--qemu-plugin {}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate pttrace itself: {e}"))?;
    let mut tried = Vec::new();
    if let Some(dir) = exe.parent() {
        let mut cands = vec![dir.join(PLUGIN_NAME)];
        if let Some(up) = dir.parent() {
            cands.push(up.join(PLUGIN_NAME));
            cands.push(up.join("lib").join(PLUGIN_NAME));
            cands.push(up.join("lib64").join(PLUGIN_NAME));
            cands.push(up.join("lib/x86_64-linux-gnu").join(PLUGIN_NAME));
        }
        for c in cands {
            if c.is_file() {
                return Ok(c);
            }
            tried.push(c.display().to_string());
        }
    }
    Err(format!(
        "{PLUGIN_NAME} not found (looked at {}): build it with `cargo build` (workspace \
         member pttrace-qemu) or pass --qemu-plugin PATH",
        tried.join(", ")
    ))
}

/// `qemu-x86_64 --version`'s first line.
pub fn qemu_version(qemu: &Path) -> Option<String> {
    let o = Command::new(qemu).arg("--version").output().ok()?;
    let s = String::from_utf8_lossy(&o.stdout);
    s.lines().next().map(str::to_string)
}

/// What the program file is.
enum Program {
    X86_64(PathBuf),
    Script {
        interp: PathBuf,
        arg: Option<OsString>,
        script: PathBuf,
    },
}

fn inspect(path: &Path) -> Result<Program, String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        return match (head.get(4), head.get(18..20)) {
            (Some(2), Some([62, 0])) => Ok(Program::X86_64(path.to_path_buf())),
            _ => Err(format!(
                "{}: not an x86-64 program (the QEMU backend runs x86-64 Linux programs)",
                path.display()
            )),
        };
    }
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest
            .split(|b| *b == b'\n')
            .next()
            .unwrap_or(&[])
            .trim_ascii();
        let (interp, arg) = match line.iter().position(|b| *b == b' ' || *b == b'\t') {
            Some(i) => (&line[..i], Some(line[i..].trim_ascii())),
            None => (line, None),
        };
        let interp = PathBuf::from(std::ffi::OsStr::from_bytes(interp));
        return Ok(Program::Script {
            interp,
            arg: arg
                .filter(|a| !a.is_empty())
                .map(|a| OsString::from_vec(a.to_vec())),
            script: path.to_path_buf(),
        });
    }
    Err(format!(
        "{}: neither an ELF program nor a #! script",
        path.display()
    ))
}

/// Doubles commas: a value inside QEMU's `-plugin` option.
fn opt_escape(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The QEMU command that runs `cmd` (program + arguments) traced into `out`.
pub fn command(
    qemu: &Path,
    plugin: &Path,
    out: &Path,
    cmd: &[String],
    oracle: bool,
) -> Result<Command, String> {
    let (prog, rest) = cmd
        .split_first()
        .ok_or("no command given: use pttrace run [options] -- CMD ARGS…")?;
    let path = which(prog).ok_or_else(|| format!("{prog}: command not found"))?;
    let (target, argv0, mut args): (PathBuf, OsString, Vec<OsString>) = match inspect(&path)? {
        Program::X86_64(p) => (p, prog.into(), Vec::new()),
        Program::Script {
            interp,
            arg,
            script,
        } => {
            match inspect(&interp)? {
                Program::X86_64(_) => {}
                Program::Script { .. } => {
                    return Err(format!(
                        "{}: its interpreter {} is itself a script",
                        script.display(),
                        interp.display()
                    ))
                }
            }
            let mut a: Vec<OsString> = arg.into_iter().collect();
            a.push(script.into_os_string());
            (interp.clone(), interp.into_os_string(), a)
        }
    };
    args.extend(rest.iter().map(OsString::from));
    let mut spec = format!(
        "file={},out={},qemu={},self={}",
        opt_escape(plugin),
        opt_escape(out),
        opt_escape(qemu),
        opt_escape(plugin)
    );
    if oracle {
        spec.push_str(",oracle=on");
    }
    let mut c = Command::new(qemu);
    c.arg("-plugin").arg(spec);
    // Variables for the dynamic loader are the guest's, not QEMU's own.
    for (k, v) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"LD_") {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(&v);
            c.arg("-E").arg(kv);
            c.env_remove(&k);
        }
    }
    c.arg("-0").arg(argv0).arg(target).args(args);
    Ok(c)
}
