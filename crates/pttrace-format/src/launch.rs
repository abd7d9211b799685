//! How a program runs under QEMU with pttrace's plugin: the contract between `pttrace run`,
//! which starts the first image, and the plugin, which re-executes every image the program
//! execs the same way and reads the guest's command line back from QEMU's own:
//!
//! ```text
//! qemu-x86_64 -plugin file=PLUGIN,out=DIR,qemu=QEMU,self=PLUGIN[,oracle=on][,cut=N]
//!             [-E LD_NAME=value]... -0 ARGV0 PROGRAM ARGS...
//! ```
//! Values inside `-plugin` have their commas doubled (QEMU's option syntax). Variables for
//! the dynamic loader (`LD_*`) are the guest's: they go through `-E`, not into QEMU's own
//! environment. A `#!` script runs as its interpreter with the script as argument.

use std::path::Path;

/// What an executable file is, from its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    X86_64,
    Script {
        interp: Vec<u8>,
        arg: Option<Vec<u8>>,
    },
    /// Anything else, and why it cannot run under `qemu-x86_64`.
    Other(String),
}

/// Reads the first bytes of `path`.
pub fn inspect(path: &Path) -> std::io::Result<Program> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)?.read(&mut head)?;
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        let class = head.get(4).copied().unwrap_or(0);
        let machine = head
            .get(18..20)
            .map_or(0, |m| u16::from_le_bytes([m[0], m[1]]));
        return Ok(if class == 2 && machine == 62 {
            Program::X86_64
        } else {
            Program::Other(format!("ELF class {class} machine {machine}"))
        });
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
        return Ok(Program::Script {
            interp: interp.to_vec(),
            arg: arg.filter(|a| !a.is_empty()).map(<[u8]>::to_vec),
        });
    }
    Ok(Program::Other("neither an ELF file nor a #! script".into()))
}

fn path_of(bytes: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(bytes))
}

/// What QEMU runs: the program, its `argv[0]`, the arguments after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub program: Vec<u8>,
    pub argv0: Vec<u8>,
    pub args: Vec<Vec<u8>>,
}

/// What QEMU is asked to run for `path` started with `argv` (its `argv[0]` first). A script
/// runs as its interpreter; the error says why the file cannot run under `qemu-x86_64`
/// (it names no path).
pub fn resolve(path: &[u8], argv: &[Vec<u8>]) -> Result<Run, String> {
    let argv0 = argv.first().cloned().unwrap_or_else(|| path.to_vec());
    match inspect(path_of(path)).map_err(|e| e.to_string())? {
        Program::X86_64 => Ok(Run {
            program: path.to_vec(),
            argv0,
            args: argv.iter().skip(1).cloned().collect(),
        }),
        Program::Script { interp, arg } => {
            match inspect(path_of(&interp)) {
                Ok(Program::X86_64) => {}
                Ok(_) => {
                    return Err(format!(
                        "its interpreter {} is not an x86-64 program",
                        String::from_utf8_lossy(&interp)
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "its interpreter {}: {e}",
                        String::from_utf8_lossy(&interp)
                    ))
                }
            }
            let mut rest: Vec<Vec<u8>> = arg.into_iter().collect();
            rest.push(path.to_vec());
            rest.extend(argv.iter().skip(1).cloned());
            Ok(Run {
                program: interp.clone(),
                argv0: interp,
                args: rest,
            })
        }
        Program::Other(why) => Err(format!("not an x86-64 program ({why})")),
    }
}

/// The plugin and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin<'a> {
    pub plugin: &'a [u8],
    pub out: &'a [u8],
    pub qemu: &'a [u8],
    pub oracle: bool,
    /// PT bytes per window before a cut (the plugin's default when `None`).
    pub cut: Option<usize>,
    /// Further `key=value` arguments, in order (snapshot mode: `snapshot=`, `trigger=`,
    /// `request=`; see [`crate::snapshot`]).
    pub extra: Vec<(String, Vec<u8>)>,
}

fn escaped(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    for &b in v {
        out.push(b);
        if b == b',' {
            out.push(b',');
        }
    }
    out
}

impl Plugin<'_> {
    /// The value of QEMU's `-plugin` option.
    pub fn option(&self) -> Vec<u8> {
        let mut o = Vec::new();
        for (k, v) in [
            ("file", self.plugin),
            ("out", self.out),
            ("qemu", self.qemu),
            ("self", self.plugin),
        ] {
            if !o.is_empty() {
                o.push(b',');
            }
            o.extend_from_slice(k.as_bytes());
            o.push(b'=');
            o.extend(escaped(v));
        }
        if self.oracle {
            o.extend_from_slice(b",oracle=on");
        }
        if let Some(c) = self.cut {
            o.extend_from_slice(format!(",cut={c}").as_bytes());
        }
        for (k, v) in &self.extra {
            o.push(b',');
            o.extend_from_slice(k.as_bytes());
            o.push(b'=');
            o.extend(escaped(v));
        }
        o
    }

    /// QEMU's argv (QEMU first) and its environment for `run` in the guest environment
    /// `env` (`NAME=value` entries).
    pub fn command(
        &self,
        env: impl IntoIterator<Item = Vec<u8>>,
        run: Run,
    ) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mut argv = vec![self.qemu.to_vec(), b"-plugin".to_vec(), self.option()];
        let mut host_env = Vec::new();
        for e in env {
            if e.starts_with(b"LD_") {
                argv.push(b"-E".to_vec());
                argv.push(e);
            } else {
                host_env.push(e);
            }
        }
        argv.push(b"-0".to_vec());
        argv.push(run.argv0);
        argv.push(run.program);
        argv.extend(run.args);
        (argv, host_env)
    }
}

/// The guest's command line (`argv[0]` and arguments, each followed by NUL) and its program,
/// from QEMU's own command line (`/proc/self/cmdline`, started by [`Plugin::command`]).
pub fn guest_cmdline(raw: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let mut i = 1;
    let mut argv0: Option<&[u8]> = None;
    while i < args.len() {
        let a = args[i];
        if a == b"-0" {
            argv0 = args.get(i + 1).copied();
            i += 2;
        } else if a.starts_with(b"-") && i + 1 < args.len() {
            i += 2;
        } else {
            break;
        }
    }
    let prog = args.get(i).copied().unwrap_or(b"");
    let mut out = Vec::new();
    out.extend_from_slice(argv0.unwrap_or(prog));
    for a in args.iter().skip(i + 1) {
        if a.is_empty() {
            continue;
        }
        out.push(0);
        out.extend_from_slice(a);
    }
    out.push(0);
    (out, prog.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_reads_back_as_the_guest_command_line() {
        let p = Plugin {
            plugin: b"/lib/p,q.so",
            out: b"/tmp/out",
            qemu: b"/usr/bin/qemu-x86_64",
            oracle: true,
            cut: Some(42),
            extra: vec![("trigger".into(), b"addr:0x10::a,b".to_vec())],
        };
        assert_eq!(
            p.option(),
            b"file=/lib/p,,q.so,out=/tmp/out,qemu=/usr/bin/qemu-x86_64,self=/lib/p,,q.so,oracle=on,cut=42,trigger=addr:0x10::a,,b"
        );
        let (argv, env) = p.command(
            [b"PATH=/bin".to_vec(), b"LD_PRELOAD=/x.so".to_vec()],
            Run {
                program: b"/bin/sh".to_vec(),
                argv0: b"sh".to_vec(),
                args: vec![b"-c".to_vec(), b"echo -0 x".to_vec()],
            },
        );
        assert_eq!(env, vec![b"PATH=/bin".to_vec()]);
        assert_eq!(&argv[3..5], &[b"-E".to_vec(), b"LD_PRELOAD=/x.so".to_vec()]);
        let mut raw = Vec::new();
        for a in &argv {
            raw.extend_from_slice(a);
            raw.push(0);
        }
        assert_eq!(
            guest_cmdline(&raw),
            (b"sh\0-c\0echo -0 x\0".to_vec(), b"/bin/sh".to_vec())
        );
    }

    #[test]
    fn scripts_run_as_their_interpreter() {
        let dir = std::env::temp_dir().join(format!("launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("s");
        std::fs::write(&script, b"#!/bin/sh -e\necho\n").unwrap();
        let path = script.to_str().unwrap().as_bytes().to_vec();
        assert_eq!(
            resolve(&path, &[b"s".to_vec(), b"a".to_vec()]),
            Ok(Run {
                program: b"/bin/sh".to_vec(),
                argv0: b"/bin/sh".to_vec(),
                args: vec![b"-e".to_vec(), path.clone(), b"a".to_vec()],
            })
        );
        let elf = dir.join("arm");
        let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        h.resize(64, 0);
        h[18] = 183;
        std::fs::write(&elf, &h).unwrap();
        let e = resolve(elf.to_str().unwrap().as_bytes(), &[]).unwrap_err();
        assert_eq!(e, "not an x86-64 program (ELF class 2 machine 183)");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
