//! `pttrace report DIR`: summarizes a trace directory written by the shim.

use super::text::{printable, recovered_text};
pub use crate::tracedir::DirSummary;
use crate::tracedir::{summarize_dir, torn_tail_recovered};
use crate::CmdResult;
use drpttracer::format::ptt::{self, Tail};
use drpttracer::shim::sysnames;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `writeln!` for summaries: a closed stream (`| head`) is not an error of the summary.
macro_rules! say {
    ($w:expr) => {{
        let _ = writeln!($w);
    }};
    ($w:expr, $($arg:tt)*) => {{
        let _ = writeln!($w, $($arg)*);
    }};
}

#[derive(clap::Args)]
pub struct Args {
    /// Trace directory (the `--out` of `pttrace run`).
    pub dir: PathBuf,
    /// Also list the number of windows per syscall.
    #[arg(long)]
    pub per_syscall: bool,
    /// Damaged files (torn or corrupt records, unreadable files, windows missing): print
    /// the summary and exit 0 (the damage is still listed on stderr).
    #[command(flatten)]
    pub policy: crate::damage::Policy,
}

fn tail_text(t: &Tail) -> Option<String> {
    match t {
        Tail::Clean => None,
        Tail::Truncated { offset, bytes } => Some(format!(
            "TRUNCATED tail: {bytes} bytes at offset {offset} are an incomplete record (ignored)"
        )),
        Tail::Corrupt { offset, bytes } => Some(format!(
            "CORRUPT record at offset {offset} (bad checksum or length): {bytes} bytes ignored"
        )),
    }
}

fn end_text(end: Option<(u32, u64, u64)>) -> String {
    match end {
        Some((r, _, _)) => ptt::EndReason::from_raw(r)
            .map_or_else(|| format!("end reason {r}"), |r| r.name().to_string()),
        None => "no End record (killed, or ended by another thread's exit/exec)".into(),
    }
}

/// `NAME=value` from a `Config` record's text.
fn config_value<'a>(config: &'a str, name: &str) -> Option<&'a str> {
    config
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
}

/// The mapped ELF files whose code would stay unnamed (stripped, no debug file found), each
/// with where the search looked and what would fix it (the debug-file search only).
fn unnamed_files(files: &[String], search: &pttrace_symbols::DebugSearch) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let path = Path::new(f);
        let Ok(debug) = search.find_file(path) else {
            continue; // not an ELF file (data mappings), or gone
        };
        if debug.source == pttrace_symbols::DebugSource::None && !debug.has_symtab {
            let name = f.rsplit('/').next().unwrap_or(f);
            out.push(crate::names::unnamed_line(&debug, name, path));
        }
    }
    out
}

/// How much `print_summary` says.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Every process image and thread (`report`).
    Full,
    /// At the end of `pttrace run`: every image and thread where something was lost,
    /// damaged or noted, the first image to start, the one with the most trace and each
    /// image's main thread; the rest, when there are many, counted in one line each
    /// (`report` lists them).
    Brief,
}

/// Images and threads of an image `Detail::Brief` lists one by one at most.
const BRIEF_IMAGES: usize = 6;
const BRIEF_THREADS: usize = 8;

/// A thread file with nothing lost, damaged, recovered or snapshotted: its line says
/// nothing a count does not.
fn thread_is_plain(t: &drpttracer::format::summary::ThreadSummary) -> bool {
    t.lossy_windows == 0
        && t.dropped == 0
        && t.tail == Tail::Clean
        && t.recovered.is_none()
        && !t.spool_pending
        && t.snapshots.is_empty()
        && t.end.is_some()
        && t.first_index_gap.is_none()
        && t.spool_gap.is_none()
        && t.spool_corrupt.is_none()
}

/// A process image whose lines say nothing a count does not: it ended, with PT, no note,
/// no damage, every thread plain.
fn image_is_plain(s: &DirSummary, key: &(i32, String)) -> bool {
    let Some(p) = s.processes.get(key) else {
        return false;
    };
    p.end.is_some()
        && p.notes.is_empty()
        && p.tail == Tail::Clean
        && p.process.as_ref().is_some_and(|r| r.pt_present)
        && config_value(&p.config, "PTTRACER_SNAPSHOT").is_none()
        && s.threads
            .get(key)
            .is_some_and(|ts| ts.iter().all(thread_is_plain))
}

/// Prints the summary of trace directory `dir` (as much as `detail` says); returns it for
/// callers that add to it.
pub fn print_summary(
    dir: &Path,
    per_syscall: bool,
    detail: Detail,
    w: &mut dyn std::io::Write,
) -> Result<DirSummary, String> {
    let search = pttrace_symbols::DebugSearch::new();
    let s = summarize_dir(dir)?;
    if s.processes.is_empty()
        && s.threads.is_empty()
        && s.unreadable.is_empty()
        && s.kernel_raw_files == 0
    {
        return Err(format!(
            "{}: no info or per-thread .ptt files (is this a `pttrace run --out` directory?)",
            printable(&dir.display().to_string())
        ));
    }
    say!(
        w,
        "trace directory: {}",
        printable(&dir.display().to_string())
    );
    let keys = s.images();
    let brief = detail == Detail::Brief && !per_syscall;
    let mut backends = BTreeMap::<String, usize>::new();
    // Images left out (Detail::Brief), and the lines on their files without symbols.
    let (mut left_out, mut left_out_pids) = (0usize, std::collections::BTreeSet::new());
    let mut unnamed_said = std::collections::BTreeSet::<String>::new();
    let mut unnamed_left = Vec::<String>::new();
    // (Brief: the image with the most trace is listed too: where the program's work is,
    // behind a launcher or shell that comes first.)
    let biggest = keys.iter().max_by_key(|k| {
        s.threads
            .get(*k)
            .map_or(0, |ts| ts.iter().map(|t| t.pt_bytes).sum::<u64>())
    });
    // (And the first to start: the program run, whatever the pids' order; `images`
    // lists it first.)
    let first = keys.first();
    for key in &keys {
        let (pid, nonce) = key;
        if brief
            && keys.len() > BRIEF_IMAGES
            && Some(key) != first
            && Some(key) != biggest
            && image_is_plain(&s, key)
        {
            left_out += 1;
            left_out_pids.insert(*pid);
            if let Some(p) = s.processes.get(key) {
                if let Some(r) = &p.process {
                    *backends
                        .entry(ptt::backend_name(r.backend).to_string())
                        .or_default() += 1;
                }
                unnamed_left.extend(unnamed_files(&p.mapped_files, &search));
            }
            continue;
        }
        match s.processes.get(key) {
            Some(p) => {
                let ppid = p.process.as_ref().map_or(0, |r| r.ppid);
                say!(
                    w,
                    "process {pid} (image {nonce}, parent {ppid}): {}",
                    printable(&if p.cmdline.is_empty() {
                        p.exe.clone()
                    } else {
                        p.cmdline.join(" ")
                    })
                );
                if let Some(r) = &p.process {
                    let b = ptt::backend_name(r.backend).to_string();
                    *backends.entry(b.clone()).or_default() += 1;
                    say!(
                        w,
                        "  exe {}, mode {}, window {}, backend {b}, {} mappings, vDSO {} bytes",
                        printable(&p.exe),
                        ptt::mode_name(r.mode),
                        ptt::window_name(r.window),
                        p.maps_lines,
                        p.vdso_bytes
                    );
                    if !r.pt_present {
                        say!(w, "  PT absent: {}", printable(&r.pt_absent_reason));
                    }
                    for line in unnamed_files(&p.mapped_files, &search) {
                        say!(w, "  no symbols: {}", printable(&line));
                        unnamed_said.insert(line);
                    }
                }
                match p.end {
                    Some((r, code)) => say!(
                        w,
                        "  ended: {} (status {code}){}",
                        ptt::EndReason::from_raw(r).map_or("?", |r| r.name()),
                        if p.patched_sites > 0 {
                            format!(", {} syscall sites patched", p.patched_sites)
                        } else {
                            String::new()
                        }
                    ),
                    None => say!(w, "  ended: no ProcessEnd record (killed or still running)"),
                }
                if let Some(size) = config_value(&p.config, "PTTRACER_SNAPSHOT") {
                    say!(
                        w,
                        "  snapshot mode: last {size} PT bytes per thread, triggers {}",
                        printable(config_value(&p.config, "PTTRACER_TRIGGERS").unwrap_or("?"))
                    );
                }
                for n in &p.notes {
                    say!(w, "  note: {}", printable(n));
                }
                if let Some(t) = tail_text(&p.tail) {
                    say!(w, "  info file {t}");
                }
                let threads = s.threads.get(key).map_or(&[][..], Vec::as_slice);
                if threads.iter().any(|t| t.windows > 0)
                    && threads.iter().all(|t| t.vfork_child_windows == t.windows)
                {
                    say!(
                        w,
                        "  vfork-style child (posix_spawn): ran on its parent's memory until it exec'd or exited"
                    );
                }
            }
            None => say!(w, "process {pid} (image {nonce}): no info file"),
        }
        let threads = s.threads.get(key).map_or(&[][..], Vec::as_slice);
        let fold = brief && threads.len() > BRIEF_THREADS;
        let (mut folded, mut folded_windows, mut folded_pt) = (0usize, 0u64, 0u64);
        for t in threads {
            // (The main thread stays listed: its tid is the pid.)
            let main = t.header.as_ref().is_some_and(|h| h.tid == h.pid);
            if fold && !main && thread_is_plain(t) {
                folded += 1;
                folded_windows += t.windows;
                folded_pt += t.pt_bytes;
                continue;
            }
            let tid = t.header.as_ref().map_or(0, |h| h.tid);
            say!(
                w,
                "  thread {tid}: {} windows, {} PT bytes, {} sideband bytes, {} lossy ({} with PT overflows), {} dropped, ended: {}",
                t.windows,
                t.pt_bytes,
                t.sideband_bytes,
                t.lossy_windows,
                t.overflow_windows,
                t.dropped,
                end_text(t.end)
            );
            if torn_tail_recovered(t) {
                say!(
                    w,
                    "    {}: its last record was torn when the process died; the spool \
                     beside it has that window",
                    printable(&t.file)
                );
            } else if let Some(tt) = tail_text(&t.tail) {
                say!(w, "    {}: {tt}", printable(&t.file));
            }
            if let Some(r) = &t.recovered {
                say!(w, "    {}", recovered_text(r));
                if t.spool_pending {
                    say!(
                        w,
                        "    (read from the .spool beside the file; `pttrace run` merges it into \
                         the file when the program ends)"
                    );
                }
            }
            for snap in &t.snapshots {
                say!(w, "    {}", printable(&snap.describe()));
            }
            if per_syscall {
                for (nr, n) in &t.per_syscall {
                    let name = sysnames::name(*nr).map_or_else(|| format!("#{nr}"), String::from);
                    say!(w, "    {name:<20} {n}");
                }
            }
        }
        if folded > 0 {
            say!(
                w,
                "  … and {}: {folded_windows} windows, {folded_pt} PT bytes, nothing lost, \
                 each ended (`pttrace report` lists each)",
                crate::text::count(folded as u64, "more thread")
            );
        }
    }
    if left_out > 0 {
        say!(
            w,
            "… and {} of {}: nothing lost, each ended (`pttrace report {}` lists each)",
            crate::text::count(left_out as u64, "more process image"),
            crate::text::count(left_out_pids.len() as u64, "process"),
            printable(&dir.display().to_string())
        );
        let mut seen = unnamed_said;
        for line in unnamed_left {
            if seen.insert(line.clone()) {
                say!(w, "  no symbols: {}", printable(&line));
            }
        }
    }
    for (name, e) in &s.unreadable {
        say!(w, "unreadable: {name}: {e}");
    }
    let pt: u64 = s.threads.values().flatten().map(|t| t.pt_bytes).sum();
    let sb: u64 = s.threads.values().flatten().map(|t| t.sideband_bytes).sum();
    let (lossy, overflowed, dropped) = s.loss_counts();
    let backend = if backends.is_empty() {
        "none".to_string()
    } else {
        backends.keys().cloned().collect::<Vec<_>>().join(", ")
    };
    // As the kernel counts them: an execve starts a new image of the same process.
    let pids: std::collections::BTreeSet<i32> = keys.iter().map(|k| k.0).collect();
    let images = if keys.len() > pids.len() {
        format!(" ({} images: execve)", keys.len())
    } else {
        String::new()
    };
    say!(
        w,
        "total: {}{images}, {}, {} windows, {} PT bytes, {} sideband bytes, \
         losses: {lossy} lossy windows ({overflowed} with PT overflows), {dropped} dropped windows, \
         {} truncated/corrupt files; \
         backend {backend}; kernel.raw: {} files, {} bytes{}{}",
        crate::text::count(pids.len() as u64, "process"),
        crate::text::count(s.thread_count() as u64, "thread"),
        s.windows(),
        pt,
        sb,
        s.truncated_files(),
        s.kernel_raw_files,
        s.kernel_raw_bytes,
        if s.has_kallsyms { ", kallsyms" } else { "" },
        if s.has_kcore { ", kcore" } else { "" },
    );
    Ok(s)
}

pub fn run(args: Args) -> CmdResult {
    if crate::text::is_thread_file(&args.dir) {
        let dir = args
            .dir
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        return Err(format!(
            "{file} is one thread's file of a trace directory: `pttrace report {dir}` reports \
             the whole directory; `pttrace decode {file} --format summary` this thread",
            file = args.dir.display(),
            dir = dir.display()
        )
        .into());
    }
    let s = print_summary(
        &args.dir,
        args.per_syscall,
        Detail::Full,
        &mut std::io::stdout().lock(),
    )?;
    let mut d = s.damages();
    d.set_losses(s.losses());
    d.finish("report", args.policy)
}
