//! `pttrace run [options] -- CMD ARGS…`: runs a program under the LD_PRELOAD shim, or
//! under QEMU with pttrace's plugin (the QEMU backend, see [`super::qemu`]).

use super::qemu;
use crate::CmdResult;
use drpttracer::format::snapshot::UserTrigger;
use drpttracer::shim::config::{self, ShimConfig};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// Output directory (created if missing). A directory that already holds a trace is
    /// moved aside to DIR.old first (replacing an older one), as perf does with perf.data.
    #[arg(short, long, default_value = "pttrace.out")]
    pub out: PathBuf,
    /// What to trace: user (default), kernel or user_kernel (`--window syscall` alone:
    /// kernel, DynamoRIO's syscall_pt_trace).
    #[arg(long)]
    pub mode: Option<String>,
    /// Window kind: thread (user execution between syscalls; the default in user mode) or
    /// syscall (entry to exit; the default in the kernel modes).
    #[arg(long)]
    pub window: Option<String>,
    /// Print nothing of pttrace's own but errors: the program's output and exit status
    /// only (pttrace's messages, the summary included, go to stderr otherwise).
    #[arg(long, short)]
    pub quiet: bool,
    /// Syscalls to record: names or numbers, comma separated; `!name` excludes.
    #[arg(long, default_value = "")]
    pub syscalls: String,
    /// Capture backend: auto, hardware, emulated (single-stepping in the shim) or qemu
    /// (the whole program under QEMU with pttrace's plugin; user mode, thread windows).
    /// auto (default, or PTTRACER_BACKEND): hardware where Intel PT exists; otherwise, in
    /// user mode with thread windows, qemu when qemu-x86_64 and the plugin are found, else
    /// emulated. The first line of `run` says which one traces and why.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// The qemu-x86_64 to run the program with (QEMU backend; default: PATH).
    #[arg(long)]
    pub qemu: Option<PathBuf>,
    /// Path of libpttrace_qemu.so (QEMU backend; default: next to this executable or in
    /// the install prefix's lib/).
    #[arg(long)]
    pub qemu_plugin: Option<PathBuf>,
    /// QEMU backend: also write each thread's executed block sequence (`.oracle` files,
    /// for tests).
    #[arg(long, hide = true)]
    pub qemu_oracle: bool,
    /// Also record every load and store (address, size, read or write) of the traced
    /// instructions (the QEMU backend, chosen by it where the backend is auto); `decode
    /// --format jsonl|drmemtrace` puts them after their instructions.
    #[arg(long)]
    pub memory: bool,
    /// Windows buffered per thread (power of two).
    #[arg(long)]
    pub queue: Option<usize>,
    /// When a thread's queue is full: block (no loss) or drop (counted in the file).
    #[arg(long)]
    pub backpressure: Option<String>,
    /// PT ring size shift (2^n pages).
    #[arg(long)]
    pub pt_shift: Option<u32>,
    /// Sideband ring size shift (2^n pages).
    #[arg(long)]
    pub sb_shift: Option<u32>,
    /// Syscall sites patched into direct calls after their first trap: sites (the
    /// `mov $nr,%eax; syscall` form, default), all (also the others through a page-0
    /// trampoline; needs root) or off (PTTRACER_REWRITE).
    #[arg(long, value_parser = ["off", "sites", "all"])]
    pub rewrite: Option<String>,
    /// Path of libdrpttracer.so (default: next to this executable).
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// Print windows per syscall in the summary.
    #[arg(long)]
    pub per_syscall: bool,
    /// Snapshot (flight-recorder) mode: keep only the last SIZE of PT per thread (e.g.
    /// 64K, 1M) and write it when a trigger fires (QEMU and emulated backends; Intel PT
    /// hardware in user mode with thread windows, without addr: triggers).
    #[arg(long, value_name = "SIZE")]
    pub snapshot: Option<String>,
    /// When to write the snapshot (repeatable): exit (default: each thread's ring at its
    /// end), signal:SIG (SIG sent to this pttrace run, e.g. signal:USR2), syscall:NAME
    /// (the program enters it), addr:SYMBOL or addr:0xADDR (execution reaches that address
    /// of the program's ELF file). Each firing writes every thread's ring as one numbered
    /// snapshot and tracing goes on.
    #[arg(long, value_name = "SPEC")]
    pub trigger: Vec<String>,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub cmd: Vec<String>,
}

impl Args {
    /// `--mode`, else user, or kernel when only `--window syscall` is given (DynamoRIO's
    /// syscall_pt_trace: kernel code in syscall windows).
    pub fn mode(&self) -> &str {
        match (self.mode.as_deref(), self.window.as_deref()) {
            (Some(m), _) => m,
            (None, Some("syscall")) => "kernel",
            (None, _) => "user",
        }
    }

    /// `--window`, else thread in user mode and syscall in the kernel modes.
    pub fn window(&self) -> &str {
        match self.window.as_deref() {
            Some(w) => w,
            None if self.mode() == "user" => "thread",
            None => "syscall",
        }
    }

    /// Where pttrace's own messages go: stderr, or nowhere with `--quiet`.
    fn messages(&self) -> Box<dyn Write> {
        if self.quiet {
            Box::new(std::io::sink())
        } else {
            Box::new(std::io::stderr())
        }
    }
}

/// libdrpttracer.so next to the running executable (target/<profile>/), or in its parent
/// (test and bench executables live in target/<profile>/deps/).
pub fn find_library() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate pttrace itself: {e}"))?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let cand = d.join("libdrpttracer.so");
        if cand.is_file() {
            return Ok(cand);
        }
        dir = d.parent();
    }
    Err(format!(
        "libdrpttracer.so not found next to {}: build it with `cargo build` (it is the \
         library's cdylib) or pass --lib PATH",
        exe.display()
    ))
}

fn env_pairs(args: &Args) -> Vec<(&'static str, String)> {
    let mut v = vec![
        (config::ENV_OUT, args.out.display().to_string()),
        (config::ENV_MODE, args.mode().to_string()),
        (config::ENV_WINDOW, args.window().to_string()),
        (config::ENV_SYSCALLS, args.syscalls.clone()),
        (config::ENV_BACKEND, asked_backend(args)),
    ];
    if let Some(q) = args.queue {
        v.push((config::ENV_QUEUE, q.to_string()));
    }
    if let Some(b) = &args.backpressure {
        v.push((config::ENV_BACKPRESSURE, b.clone()));
    }
    if let Some(s) = args.pt_shift {
        v.push((config::ENV_PT_SHIFT, s.to_string()));
    }
    if let Some(s) = args.sb_shift {
        v.push((config::ENV_SB_SHIFT, s.to_string()));
    }
    if let Some(r) = &args.rewrite {
        v.push((config::ENV_REWRITE, r.clone()));
    }
    v
}

fn prepend_preload(lib: &Path) -> String {
    let lib = lib.display().to_string();
    match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.trim().is_empty() => format!("{lib}:{old}"),
        _ => lib,
    }
}

/// After the traced program: its JIT symbol files kept, the trace directory's summary
/// (the brief one), and how to decode it.
fn summarize_run(out: &Path, args: &Args, msg: &mut dyn Write) -> Result<(), String> {
    keep_jit_maps(out, msg);
    let summary =
        super::report::print_summary(out, args.per_syscall, super::report::Detail::Brief, msg)?;
    print_decode_hint(out, &summary, msg);
    Ok(())
}

/// Tells how to decode what was captured (or that there is no PT to decode).
fn print_decode_hint(out: &Path, s: &super::report::DirSummary, w: &mut dyn Write) {
    if s.pt_bytes() == 0 {
        let _ = writeln!(
            w,
            "nothing to decode: no PT was captured (see \"PT absent\" above); the windows' \
             metadata is in the .ptt files (summary again: pttrace report {})",
            out.display()
        );
        return;
    }
    match s.kernel_raw_paths.first() {
        Some(first) => {
            let kdir = out.join("kernel.raw");
            let mut extra = String::new();
            if s.has_kcore {
                extra.push_str(&format!(" --kcore {}", kdir.join("kcore").display()));
            }
            if s.has_kallsyms {
                extra.push_str(&format!(" --kallsyms {}", kdir.join("kallsyms").display()));
            }
            let _ = writeln!(
                w,
                "decode with (one per thread file in {}): pttrace decode --raw-pt {}{extra}",
                kdir.display(),
                first.display()
            );
        }
        None => {
            let _ = writeln!(
                w,
                "decode with: pttrace decode {} --format summary   (or --format disasm|jsonl; \
             summary again: pttrace report {})",
                out.display(),
                out.display()
            );
        }
    }
}

/// The backend asked for: `--backend`, or PTTRACER_BACKEND when that is `auto`.
fn asked_backend(args: &Args) -> String {
    match args.backend.trim() {
        "" | "auto" => std::env::var(config::ENV_BACKEND)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "auto".into()),
        b => b.to_string(),
    }
}

/// The emulator and plugin when this run goes through QEMU (see `--backend`).
fn qemu_backend(args: &Args) -> Result<Option<(PathBuf, PathBuf)>, String> {
    let backend = asked_backend(args);
    let thread_user = args.mode() == "user" && args.window() == "thread";
    let found = || -> Result<(PathBuf, PathBuf), String> {
        Ok((
            qemu::find_qemu(args.qemu.as_deref())?,
            qemu::find_plugin(args.qemu_plugin.as_deref())?,
        ))
    };
    match backend.as_str() {
        "qemu" => {
            if !thread_user {
                return Err(format!(
                    "the qemu backend traces user mode in thread windows: use --mode user \
                     --window thread (got --mode {} --window {})",
                    args.mode(),
                    args.window()
                ));
            }
            found().map(Some)
        }
        // `--memory`: QEMU is the one backend that sees loads and stores.
        "auto" if thread_user && args.memory => found().map(Some),
        "auto" if thread_user && drpttracer::perf::pmu::IntelPtPmu::probe().is_err() => {
            Ok(found().ok())
        }
        _ => Ok(None),
    }
}

/// Starts `cmd` (with no signal blocked, this process the reaper of what it leaves
/// running: [`crate::orphans`]) and waits for its end, telling `stopping` when it starts
/// and ends ([`crate::interrupt`]).
fn run_to_end(
    cmd: &mut Command,
    stopping: &crate::interrupt::Stopping,
) -> std::io::Result<std::process::ExitStatus> {
    crate::interrupt::unblock_signals(cmd);
    crate::orphans::adopt();
    let mut child = cmd.spawn()?;
    stopping.started(child.id());
    let status = child.wait();
    stopping.ended();
    status
}

/// Names the processes the program left running (see [`crate::orphans`]).
fn say_left_running(prog: &str, out: &Path, qemu: bool, msg: &mut dyn Write) {
    let left = crate::orphans::still_running(qemu);
    let list: Vec<String> = left
        .iter()
        .map(|(pid, cmd)| format!("pid {pid} ({cmd})"))
        .collect();
    let (count, is, its, it_has) = match left.len() {
        0 => return,
        1 => ("1 process".to_string(), "is", "its", "it has"),
        n => (format!("{n} processes"), "are", "their", "they have"),
    };
    let _ = writeln!(
        msg,
        "pttrace run: {prog} ended, but {count} it started {is} still running and tracing \
         into {out}: {list}; the summary below shows {its} trace as it is now (`pttrace \
         report {out}` once {it_has} ended)",
        out = out.display(),
        list = list.join(", "),
    );
}

/// Ends like the program did: its exit status, or 128 + the signal that killed it (then
/// saying so, and `killed_note` after).
fn mirror_status(
    prog: &str,
    status: std::process::ExitStatus,
    killed_note: Option<&str>,
) -> CmdResult {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(c), _) => std::process::exit(c),
        (None, Some(sig)) => {
            // SAFETY: strsignal returns a pointer to a static or thread-local string.
            let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }
                .to_string_lossy()
                .into_owned();
            eprintln!("pttrace run: {prog} was killed by signal {sig} ({name})");
            if let Some(note) = killed_note {
                eprintln!("pttrace run: {note}");
            }
            std::process::exit(128 + sig)
        }
        (None, None) => Err(format!("{prog}: {status}").into()),
    }
}

fn run_qemu(args: &Args, qemu: PathBuf, plugin: PathBuf) -> CmdResult {
    let mut msg = args.messages();
    let plugin = plugin
        .canonicalize()
        .map_err(|e| format!("{}: {e}", plugin.display()))?;
    let why = if asked_backend(args) == "qemu" {
        "as asked".to_string()
    } else if args.memory {
        "--memory: QEMU is the backend that sees loads and stores".to_string()
    } else {
        "no intel_pt PMU on this machine; --backend emulated single-steps instead".to_string()
    };
    let _ = writeln!(
        msg,
        "pttrace run: tracing user code in thread windows under QEMU ({}, plugin {}; {why})",
        qemu.display(),
        plugin.display()
    );
    let out = fresh_out_dir(&args.out, &mut msg)?;
    let prog = args.cmd.first().cloned().unwrap_or_default();
    let snap = super::snapshot::parse(args.snapshot.as_deref(), &args.trigger)?;
    let mut extra = match &snap {
        Some(s) => {
            let path = qemu::which(&prog).ok_or_else(|| format!("{prog}: command not found"))?;
            super::snapshot::plugin_args(s, &path, &out)?
        }
        None => Vec::new(),
    };
    if args.memory {
        extra.push(("memory".to_string(), b"on".to_vec()));
    }
    let mut cmd = qemu::command(&qemu, &plugin, &out, &args.cmd, args.qemu_oracle, extra)?;
    let stopping = crate::interrupt::start(&prog, args.quiet)?;
    if let Some(s) = &snap {
        super::snapshot::forward_signals(s, &out)?;
    }
    let status = run_to_end(&mut cmd, &stopping)
        .map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    let _ = writeln!(msg, "{prog}: {status} (traced under {})", qemu.display());
    say_left_running(&prog, &out, true, &mut msg);
    if !has_info_file(&out) {
        return Err(format!(
            "{} wrote no trace into {}: QEMU did not load the plugin {} (see its message \
             above)",
            qemu.display(),
            out.display(),
            plugin.display()
        )
        .into());
    }
    summarize_run(&out, args, &mut msg)?;
    // (QEMU 7.2 runs no plugin code on a fatal signal: see the plugin's `maps`.)
    mirror_status(
        &prog,
        status,
        Some(
            "under QEMU a process killed by a signal keeps its trace up to its last system \
             call: the code it ran after is not in the trace",
        ),
    )
}

/// Why `prog` cannot be started, checked as a shell does (along `PATH` for a name without
/// a slash), and the status a shell, `env` or `timeout` exits with then: 127 for a program
/// not found, 126 for one found that cannot run.
fn unstartable(prog: &str) -> Option<(String, i32)> {
    if qemu::which(prog).is_some() {
        return None;
    }
    if !prog.contains('/') {
        return Some((format!("{prog}: command not found"), 127));
    }
    Some(match std::fs::metadata(prog) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            (format!("{prog}: no such file"), 127)
        }
        Err(e) => (format!("{prog}: {e}"), 126),
        Ok(m) if m.is_dir() => (format!("{prog}: is a directory"), 126),
        Ok(_) => (
            format!("{prog}: not executable (no execute permission)"),
            126,
        ),
    })
}

pub fn run(args: Args) -> CmdResult {
    // A program that cannot start ends the run before anything is created, with the
    // status a shell gives it.
    if let Some((why, status)) = args.cmd.first().and_then(|p| unstartable(p)) {
        eprintln!("pttrace run: {why}");
        std::process::exit(status);
    }
    if let Some((qemu, plugin)) = qemu_backend(&args)? {
        return run_qemu(&args, qemu, plugin);
    }
    if args.memory {
        return Err(format!(
            "--memory needs the QEMU backend (--backend qemu), which sees every load and \
             store; the {} backend records control flow only (PT has no data addresses)",
            match asked_backend(&args).as_str() {
                "auto" => "chosen",
                b => b,
            }
        )
        .into());
    }
    let mut msg = args.messages();
    let snap = super::snapshot::parse(args.snapshot.as_deref(), &args.trigger)?;
    if let Some(sn) = &snap {
        shim_snapshot_check(&args, sn)?;
    }
    let mut pairs = env_pairs(&args);
    if let Some(sn) = &snap {
        pairs.push((config::ENV_SNAPSHOT, sn.size.to_string()));
        pairs.push((config::ENV_TRIGGERS, args.trigger.join(",")));
    }
    // Validate here with the shim's own parser so mistakes are reported before running.
    ShimConfig::from_lookup(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))?;
    let lib = match &args.lib {
        Some(l) => l.clone(),
        None => find_library()?,
    };
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    check_preload_library(&lib)?;
    let _ = writeln!(msg, "pttrace run: {}", shim_backend_line(&args));
    let out = fresh_out_dir(&args.out, &mut msg)?;
    let (prog, rest) = args
        .cmd
        .split_first()
        .ok_or("no command given: use pttrace run [options] -- CMD ARGS…")?;
    let stopping = crate::interrupt::start(prog, args.quiet)?;
    if let Some(sn) = &snap {
        super::snapshot::forward_signals(sn, &out)?;
    }
    let mut cmd = Command::new(prog);
    cmd.args(rest);
    for (k, v) in &pairs {
        cmd.env(k, v);
    }
    cmd.env(config::ENV_OUT, &out);
    cmd.env("LD_PRELOAD", prepend_preload(&lib));
    let status = run_to_end(&mut cmd, &stopping).map_err(|e| format!("cannot run {prog}: {e}"))?;
    let _ = writeln!(msg, "{prog}: {status}");
    say_left_running(prog, &out, false, &mut msg);
    if !has_info_file(&out) {
        return Err(format!(
            "{prog} wrote no trace into {}: the preload library {} did not start in it (a \
             statically linked program ignores LD_PRELOAD; see any message above)",
            out.display(),
            lib.display()
        )
        .into());
    }
    salvage_spools(&out, &mut msg);
    summarize_run(&out, &args, &mut msg)?;
    mirror_status(prog, status, None)
}

/// `--snapshot` with the LD_PRELOAD shim: user mode, thread windows, on the single-step
/// (emulated) backend (a ring of windows per thread) or Intel PT hardware (an
/// overwrite-mode AUX area per thread, `drpttracer::shim::snapshot::hw`).
fn shim_snapshot_check(args: &Args, sn: &super::snapshot::Snapshot) -> Result<(), String> {
    let backend = asked_backend(args);
    let pmu = drpttracer::perf::pmu::IntelPtPmu::probe();
    let hardware = backend == "hardware" || (backend == "auto" && pmu.is_ok());
    snapshot_backend_check(
        hardware.then(|| pmu.err().map(|e| e.message)),
        &backend,
        args.mode(),
        args.window(),
        &sn.triggers,
    )?;
    let prog = args.cmd.first().cloned().unwrap_or_default();
    let path = qemu::which(&prog).ok_or_else(|| format!("{prog}: command not found"))?;
    super::snapshot::check_addrs(sn, &path)
}

/// What `--snapshot` needs of the backend, mode and window (`hardware`: the hardware
/// backend is the one, with the PMU probe's error where this machine has no `intel_pt`
/// PMU — named first, as what a user must fix before anything else).
fn snapshot_backend_check(
    hardware: Option<Option<String>>,
    backend: &str,
    mode: &str,
    window: &str,
    triggers: &[UserTrigger],
) -> Result<(), String> {
    if let Some(Some(why)) = &hardware {
        return Err(format!(
            "--snapshot on the hardware backend needs an intel_pt PMU, and this machine has \
             none: {why}"
        ));
    }
    let backend = if hardware.is_some() {
        "hardware"
    } else {
        backend
    };
    if mode != "user" || window != "thread" {
        return Err(format!(
            "--snapshot with the {backend} backend traces user code in thread windows: use \
             --mode user --window thread (got --mode {mode} --window {window})"
        ));
    }
    if hardware.is_some() {
        if let Some(t) = triggers.iter().find(|t| matches!(t, UserTrigger::Addr(_))) {
            return Err(format!(
                "--trigger {}: the hardware backend cannot see an address being executed \
                 (Intel PT reports branches, not each instruction); use exit, signal:SIG or \
                 syscall:NAME, or --backend qemu|emulated",
                config::describe_trigger(t)
            ));
        }
    }
    Ok(())
}

/// Completes the thread files of processes that died before writing everything (SIGKILL)
/// from their spools, so that the directory needs nothing else; processes still running
/// (daemons the program left behind) keep their spools.
fn salvage_spools(out: &Path, msg: &mut dyn Write) {
    let Ok(rd) = std::fs::read_dir(out) else {
        return;
    };
    let mut names: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    names.sort();
    for path in names {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(pid) = name
            .split('-')
            .next()
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        if alive {
            continue;
        }
        if name.ends_with(".spool.exec") {
            // Set aside at an execve whose new image was not traced: nothing in it.
            let _ = std::fs::remove_file(&path);
        } else if let Some(stem) = name
            .strip_suffix(".spool")
            .or_else(|| name.strip_suffix(".snapring"))
        {
            let ptt = path.with_file_name(format!("{stem}.ptt"));
            if !path.exists() {
                // Salvaged with the other file of the pair.
                continue;
            }
            match drpttracer::format::spool::salvage(&ptt) {
                Ok(Some(r)) => {
                    let shown = ptt.display().to_string();
                    let p = super::text::printable(&shown);
                    if let Some((snap, _)) = &r.snapshot {
                        let _ = writeln!(
                            msg,
                            "{p}: snapshot {} recovered after the process was killed: {} \
                             windows, {} PT bytes",
                            snap.number, snap.windows, snap.pt_bytes
                        );
                    }
                    let _ = writeln!(msg, "{p}: {}", super::text::recovered_text(&r.recovered));
                }
                Ok(None) => {}
                Err(e) => eprintln!("pttrace run: cannot complete {name} from its spool: {e}"),
            }
        }
    }
}

/// The preload library must be an x86-64 ELF shared object (the dynamic loader would only
/// warn and run the program untraced).
fn check_preload_library(lib: &Path) -> Result<(), String> {
    use std::io::Read;
    let mut head = [0u8; 20];
    let n = std::fs::File::open(lib)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| format!("--lib {}: {e}", lib.display()))?;
    let ok = n == 20
        && head.starts_with(b"\x7fELF")
        && head[4] == 2
        && u16::from_le_bytes([head[16], head[17]]) == 3 // ET_DYN
        && u16::from_le_bytes([head[18], head[19]]) == 62; // EM_X86_64
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--lib {}: not an x86-64 ELF shared object (expected libdrpttracer.so)",
            lib.display()
        ))
    }
}

/// Creates `out` and checks that files can be created in it; its canonical path.
fn writable_out_dir(out: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let out = out
        .canonicalize()
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let probe = out.join(format!(".pttrace-write-test-{}", std::process::id()));
    std::fs::File::create(&probe)
        .map_err(|e| format!("cannot write into {}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(out)
}

/// The output directory for a new run: a directory that already holds a trace is moved
/// aside to `DIR.old` first (an older `DIR.old` is removed), so two runs never mix (perf's
/// convention for perf.data). Then as [`writable_out_dir`].
fn fresh_out_dir(out: &Path, msg: &mut dyn Write) -> Result<PathBuf, String> {
    if holds_trace(out) {
        let mut old = out.as_os_str().to_os_string();
        old.push(".old");
        let old = PathBuf::from(old);
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| {
                format!(
                    "{} holds a trace and {} cannot be removed to make room for it: {e}",
                    out.display(),
                    old.display()
                )
            })?;
        }
        std::fs::rename(out, &old).map_err(|e| {
            format!(
                "{} holds a trace and cannot be moved aside to {}: {e}",
                out.display(),
                old.display()
            )
        })?;
        let _ = writeln!(
            msg,
            "pttrace run: {} held a trace of an earlier run: moved to {}",
            out.display(),
            old.display()
        );
    }
    writable_out_dir(out)
}

/// Whether `dir` holds files of a trace (thread or info files, spools, DynamoRIO's
/// kernel.raw folder).
fn holds_trace(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == "kernel.raw"
                || [".info", ".ptt", ".spool", ".snapring", ".spool.exec"]
                    .iter()
                    .any(|x| name.ends_with(x))
        })
    })
}

/// What traces a run through the shim, and why: the line `run` starts with.
fn shim_backend_line(args: &Args) -> String {
    let what = match (args.mode(), args.window()) {
        ("user", "thread") => "user code in thread windows".to_string(),
        (m, w) => format!("mode {m} in {w} windows"),
    };
    let pmu = drpttracer::perf::pmu::IntelPtPmu::probe();
    match asked_backend(args).as_str() {
        "hardware" => format!("tracing {what} with Intel PT hardware (as asked)"),
        "emulated" => format!("tracing {what} by single-stepping (emulated backend, as asked)"),
        _ if pmu.is_ok() => format!("tracing {what} with Intel PT hardware (intel_pt PMU found)"),
        _ if args.mode() == "user" && args.window() == "thread" => {
            let qemu = qemu::find_qemu(args.qemu.as_deref())
                .and_then(|_| qemu::find_plugin(args.qemu_plugin.as_deref()).map(|_| ()));
            format!(
                "tracing {what} by single-stepping (emulated backend: no intel_pt PMU on this \
                 machine, and QEMU cannot be used: {})",
                qemu.err().unwrap_or_default()
            )
        }
        _ if args.mode() == "user" => format!(
            "tracing {what} by single-stepping (emulated backend: no intel_pt PMU on this \
             machine)"
        ),
        _ => format!(
            "{what}: this machine has no intel_pt PMU, so the windows are recorded without \
             PT (their syscalls, arguments and times only; `pttrace check` says why). For \
             user code leave out --mode and --window"
        ),
    }
}

/// Copies the JIT symbol files of the traced processes into the trace directory: perf map
/// files (`/tmp/perf-PID.map`: node --perf-basic-prof, JVM perf-map agents, python -X perf)
/// and jitdump files (`jit-PID.dump` in the working directory: node --perf-prof), which
/// the next run of the same program may delete or rewrite. `view` reads the kept copies.
fn keep_jit_maps(out: &Path, msg: &mut dyn Write) {
    let Ok(rd) = std::fs::read_dir(out) else {
        return;
    };
    // Each process image's id and info file.
    let mut images: Vec<(i32, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".info")?;
            Some((stem.split('-').next()?.parse().ok()?, e.path()))
        })
        .collect();
    images.sort_unstable();
    let mut pids: Vec<i32> = images.iter().map(|(pid, _)| *pid).collect();
    pids.dedup();
    for pid in pids {
        // (A process that execs has an info file per image: its files are its own if
        // written since its first image started.)
        let infos: Vec<&PathBuf> = images
            .iter()
            .filter(|(p, _)| *p == pid)
            .map(|(_, info)| info)
            .collect();
        for src in [
            PathBuf::from(format!("/tmp/perf-{pid}.map")),
            PathBuf::from(format!("jit-{pid}.dump")),
        ] {
            let Some(name) = src.file_name() else {
                continue;
            };
            if !src.is_file() {
                continue;
            }
            if !infos
                .iter()
                .any(|info| crate::names::written_since(info, &src))
            {
                let _ = writeln!(
                    msg,
                    "pttrace run: {} is older than process {pid}: left by an earlier process \
                     of that id, not kept",
                    src.display()
                );
                continue;
            }
            let dst = out.join(name);
            match std::fs::copy(&src, &dst) {
                Ok(_) => {
                    let _ = writeln!(
                        msg,
                        "pttrace run: JIT symbols of process {pid} kept: {}",
                        dst.display()
                    );
                }
                Err(e) => {
                    let _ = writeln!(
                        msg,
                        "pttrace run: cannot keep {} with the trace: {e}",
                        src.display()
                    );
                }
            }
        }
    }
}

fn has_info_file(out: &Path) -> bool {
    std::fs::read_dir(out).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "info"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drpttracer::format::snapshot::AddrSpec;

    #[test]
    fn snapshot_backends_take_user_thread_windows_and_hardware_refuses_addr_triggers() {
        let sys = [UserTrigger::Exit, UserTrigger::Syscall(110)];
        let addr = [
            UserTrigger::Exit,
            UserTrigger::Addr(AddrSpec::Symbol("marker".into())),
        ];
        // Hardware with its PMU: user thread windows, exit/signal/syscall triggers.
        assert_eq!(
            snapshot_backend_check(Some(None), "auto", "user", "thread", &sys),
            Ok(())
        );
        assert_eq!(
            snapshot_backend_check(Some(None), "hardware", "user", "thread", &addr),
            Err(
                "--trigger addr:marker: the hardware backend cannot see an address being \
                 executed (Intel PT reports branches, not each instruction); use exit, \
                 signal:SIG or syscall:NAME, or --backend qemu|emulated"
                    .into()
            )
        );
        assert_eq!(
            snapshot_backend_check(Some(None), "auto", "kernel", "syscall", &sys),
            Err(
                "--snapshot with the hardware backend traces user code in thread windows: \
                 use --mode user --window thread (got --mode kernel --window syscall)"
                    .into()
            )
        );
        // Hardware without a PMU: that first, whatever else is wrong.
        assert_eq!(
            snapshot_backend_check(
                Some(Some("no intel_pt PMU".into())),
                "hardware",
                "kernel",
                "syscall",
                &addr
            ),
            Err(
                "--snapshot on the hardware backend needs an intel_pt PMU, and this machine \
                 has none: no intel_pt PMU"
                    .into()
            )
        );
        // The single-step backend sees addresses.
        assert_eq!(
            snapshot_backend_check(None, "emulated", "user", "thread", &addr),
            Ok(())
        );
        assert_eq!(
            snapshot_backend_check(None, "emulated", "user", "syscall", &sys),
            Err(
                "--snapshot with the emulated backend traces user code in thread windows: \
                 use --mode user --window thread (got --mode user --window syscall)"
                    .into()
            )
        );
    }
}
