//! The QEMU backend of `pttrace run`: the program runs under QEMU's user-mode emulator
//! (`qemu-x86_64`) with pttrace's TCG plugin (`libpttrace_qemu.so`, the `pttrace-qemu`
//! crate), which writes genuine PT of every thread into the trace directory and follows
//! `execve` by re-executing the new image through QEMU.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use drpttracer::format::launch;

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

/// The QEMU command that runs `cmd` (program + arguments) traced into `out` (the command
/// line of [`pttrace_format::launch`]).
pub fn command(
    qemu: &Path,
    plugin: &Path,
    out: &Path,
    cmd: &[String],
    oracle: bool,
    extra: Vec<(String, Vec<u8>)>,
) -> Result<Command, String> {
    let prog = cmd
        .first()
        .ok_or("no command given: use pttrace run [options] -- CMD ARGS…")?;
    let path = which(prog).ok_or_else(|| format!("{prog}: command not found"))?;
    let argv: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
    let run = launch::resolve(path.as_os_str().as_bytes(), &argv).map_err(|e| {
        format!(
            "{}: {e} (the QEMU backend runs x86-64 Linux programs)",
            path.display()
        )
    })?;
    let env = std::env::vars_os().map(|(k, v)| {
        let mut kv = k.into_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        kv
    });
    let (argv, host_env) = launch::Plugin {
        plugin: plugin.as_os_str().as_bytes(),
        out: out.as_os_str().as_bytes(),
        qemu: qemu.as_os_str().as_bytes(),
        oracle,
        cut: None,
        extra,
    }
    .command(env, run);
    let mut argv = argv.into_iter().map(OsString::from_vec);
    let mut c = Command::new(argv.next().unwrap_or_else(|| qemu.into()));
    c.args(argv).env_clear();
    for kv in host_env {
        let (k, v) = kv.split_at(kv.iter().position(|b| *b == b'=').unwrap_or(kv.len()));
        c.env(
            OsStr::from_bytes(k),
            OsStr::from_bytes(v.get(1..).unwrap_or(&[])),
        );
    }
    Ok(c)
}
