//! `pttrace run --snapshot SIZE [--trigger SPEC]...` (flight-recorder mode; semantics in
//! [`drpttracer::format::snapshot`]): checks the size and the triggers, resolves `addr:`
//! triggers in the program's ELF file, and turns the signals of `signal:` triggers sent
//! to `pttrace run` into requests the QEMU plugin (or the shim's writer thread) polls.

use std::io::Write;
use std::path::Path;

use drpttracer::format::launch::{self, Program};
use drpttracer::format::snapshot::{
    elf_address, parse_size, signal_name, AddrSpec, ElfAddrError, Trigger, UserTrigger,
    REQUEST_FILE,
};

/// The checked snapshot options.
pub struct Snapshot {
    pub size: u64,
    pub triggers: Vec<UserTrigger>,
}

/// Parses `--snapshot` and `--trigger` (`None` without `--snapshot`; triggers alone are
/// an error). No trigger means `exit`.
pub fn parse(size: Option<&str>, triggers: &[String]) -> Result<Option<Snapshot>, String> {
    let Some(size) = size else {
        if let Some(t) = triggers.first() {
            return Err(format!(
                "--trigger {t:?} needs --snapshot SIZE (triggers write the flight recorder's ring)"
            ));
        }
        return Ok(None);
    };
    let size = parse_size(size)?;
    let mut parsed = triggers
        .iter()
        .map(|t| UserTrigger::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    if parsed.is_empty() {
        parsed.push(UserTrigger::Exit);
    }
    Ok(Some(Snapshot {
        size,
        triggers: parsed,
    }))
}

/// `addr:` resolved in `prog`'s ELF file: (value, PIE base).
fn resolve_addr(prog: &Path, spec: &AddrSpec) -> Result<(u64, Option<u64>), String> {
    let shown = match spec {
        AddrSpec::Symbol(s) => format!("addr:{s}"),
        AddrSpec::Value(v) => format!("addr:{v:#x}"),
    };
    match launch::inspect(prog) {
        Ok(Program::X86_64) => {}
        Ok(_) => {
            return Err(format!(
                "--trigger {shown}: {} is not an x86-64 ELF executable (addr: triggers name \
                 addresses of the program's own ELF file)",
                prog.display()
            ))
        }
        Err(e) => return Err(format!("--trigger {shown}: {}: {e}", prog.display())),
    }
    let data =
        std::fs::read(prog).map_err(|e| format!("--trigger {shown}: {}: {e}", prog.display()))?;
    let found = elf_address(&data, spec).map_err(|e| match (e, spec) {
        (ElfAddrError::NoSymbol, AddrSpec::Symbol(name)) => format!(
            "--trigger {shown}: no symbol {name:?} defined in {} (.symtab/.dynsym; a \
             stripped program has no .symtab: give addr:0xADDR)",
            prog.display()
        ),
        (ElfAddrError::NotElf(e), _) => format!("--trigger {shown}: {}: {e}", prog.display()),
        // (`launch::inspect` above let only x86-64 programs through, and an address needs
        // no symbol.)
        (e, _) => format!("--trigger {shown}: {}: {e:?}", prog.display()),
    })?;
    if !found.loaded {
        return Err(format!(
            "--trigger {shown}: {:#x} is not inside a loaded segment of {}",
            found.value,
            prog.display()
        ));
    }
    Ok((found.value, found.pie_base))
}

/// Checks that every `addr:` trigger names an address of `prog` (the shim resolves them
/// again in the running image).
pub fn check_addrs(s: &Snapshot, prog: &Path) -> Result<(), String> {
    for t in &s.triggers {
        if let UserTrigger::Addr(spec) = t {
            resolve_addr(prog, spec)?;
        }
    }
    Ok(())
}

/// The plugin's arguments (`snapshot=`, `trigger=`..., `request=`) for running `prog`.
pub fn plugin_args(
    s: &Snapshot,
    prog: &Path,
    out: &Path,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    use std::os::unix::ffi::OsStrExt;
    let mut v = vec![("snapshot".to_string(), s.size.to_string().into_bytes())];
    for t in &s.triggers {
        let t = match t {
            UserTrigger::Exit => Trigger::Exit,
            UserTrigger::Signal(n) => Trigger::Signal(*n),
            UserTrigger::Syscall(nr) => Trigger::Syscall(*nr),
            UserTrigger::Addr(spec) => {
                let (value, pie_base) = resolve_addr(prog, spec)?;
                Trigger::Addr {
                    value,
                    pie_base,
                    label: match spec {
                        AddrSpec::Symbol(s) => s.clone(),
                        AddrSpec::Value(v) => format!("{v:#x}"),
                    },
                }
            }
        };
        v.push(("trigger".to_string(), t.to_arg().into_bytes()));
    }
    if !signals(s).is_empty() {
        v.push((
            "request".to_string(),
            out.join(REQUEST_FILE).as_os_str().as_bytes().to_vec(),
        ));
    }
    Ok(v)
}

fn signals(s: &Snapshot) -> Vec<i32> {
    s.triggers
        .iter()
        .filter_map(|t| match t {
            UserTrigger::Signal(n) => Some(*n),
            _ => None,
        })
        .collect()
}

/// For `signal:` triggers: blocks those signals here (the program starts with an empty
/// mask all the same: [`crate::interrupt::unblock_signals`]) and starts a thread that takes
/// them with `sigwait` and appends a request line for the plugin to the trace directory's
/// request file. Call before starting the
/// program (and before any other thread exists, so that none takes the signal instead).
pub fn forward_signals(s: &Snapshot, out: &Path) -> Result<(), String> {
    let sigs = signals(s);
    if sigs.is_empty() {
        return Ok(());
    }
    let path = out.join(REQUEST_FILE);
    std::fs::write(&path, b"").map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    // (Inherited by the thread spawned below.)
    let set = crate::interrupt::block(&sigs);
    let names: Vec<String> = sigs.iter().map(|&n| signal_name(n)).collect();
    eprintln!(
        "pttrace run: snapshot mode: send {} to pid {} (this pttrace run) to take a snapshot",
        names.join(" or "),
        std::process::id()
    );
    std::thread::Builder::new()
        .name("pttrace-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is a valid signal set and `sig` a valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            let r = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(format!("signal {sig}\n").as_bytes()));
            match r {
                Ok(()) => eprintln!("pttrace run: {}: snapshot requested", signal_name(sig)),
                Err(e) => eprintln!(
                    "pttrace run: {}: cannot request a snapshot in {}: {e}",
                    signal_name(sig),
                    path.display()
                ),
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}
