//! `pttrace report DIR`: summarizes a trace directory written by the shim.

use super::text::{printable, recovered_text};
use crate::damage::Damages;
use crate::CmdResult;
use drpttracer::format::ptt::{self, Tail};
use drpttracer::format::summary::{self, ProcessSummary, ThreadSummary};
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
    #[arg(long)]
    pub keep_going: bool,
}

/// Everything found in a trace directory.
pub struct DirSummary {
    /// Info files keyed by (pid, nonce) as written in their file names.
    pub processes: BTreeMap<(i32, String), ProcessSummary>,
    /// Thread files keyed by (pid, nonce) of their process image.
    pub threads: BTreeMap<(i32, String), Vec<ThreadSummary>>,
    /// Files that could not be read at all (name, error).
    pub unreadable: Vec<(String, String)>,
    pub kernel_raw_files: usize,
    pub kernel_raw_bytes: u64,
    /// `kernel.raw/<tid>.raw.pt` paths, sorted.
    pub kernel_raw_paths: Vec<PathBuf>,
    pub has_kallsyms: bool,
    pub has_kcore: bool,
}

impl DirSummary {
    /// PT bytes over all windows.
    pub fn pt_bytes(&self) -> u64 {
        self.threads.values().flatten().map(|t| t.pt_bytes).sum()
    }
}

impl DirSummary {
    /// Every damaged place in the directory's files.
    pub fn damages(&self) -> Damages {
        let mut d = Damages::default();
        for p in self.processes.values() {
            d.add_tail(&p.file, &p.tail);
        }
        for t in self.threads.values().flatten() {
            if !torn_tail_recovered(t) {
                d.add_tail(&t.file, &t.tail);
            }
            if t.index_gaps > 0 {
                d.add(
                    &t.file,
                    0,
                    format!(
                        "{} places where window indices jump (windows missing)",
                        t.index_gaps
                    ),
                );
            }
        }
        for (name, e) in &self.unreadable {
            d.add(name, 0, format!("unreadable: {e}"));
        }
        d
    }

    pub fn windows(&self) -> u64 {
        self.threads.values().flatten().map(|t| t.windows).sum()
    }
    /// Threads as the kernel counts them: a thread that execs goes on with the same id in
    /// its new image (another thread file); files without a readable header count alone.
    pub fn thread_count(&self) -> usize {
        let tids: std::collections::BTreeSet<(i32, i32)> = self
            .threads
            .iter()
            .flat_map(|((pid, _), ts)| {
                ts.iter()
                    .filter_map(move |t| t.header.as_ref().map(|h| (*pid, h.tid)))
            })
            .collect();
        let headerless = self
            .threads
            .values()
            .flatten()
            .filter(|t| t.header.is_none())
            .count();
        tids.len() + headerless
    }
    pub fn truncated_files(&self) -> usize {
        let t = self
            .threads
            .values()
            .flatten()
            .filter(|t| t.tail != Tail::Clean && !torn_tail_recovered(t))
            .count();
        let p = self
            .processes
            .values()
            .filter(|p| p.tail != Tail::Clean)
            .count();
        t + p
    }
}

/// `<pid>-<nonce>.info` / `<pid>-<nonce>-<tid>.ptt` -> (pid, nonce).
fn key_of(name: &str) -> Option<(i32, String)> {
    let stem = name
        .strip_suffix(".info")
        .or_else(|| name.strip_suffix(".ptt"))?;
    let mut it = stem.split('-');
    let pid = it.next()?.parse().ok()?;
    let nonce = it.next()?.to_string();
    Some((pid, nonce))
}

/// Reads every shim file in `dir`.
pub fn summarize_dir(dir: &Path) -> Result<DirSummary, String> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read trace directory {}: {e}", dir.display()))?;
    let mut s = DirSummary {
        processes: BTreeMap::new(),
        threads: BTreeMap::new(),
        unreadable: Vec::new(),
        kernel_raw_files: 0,
        kernel_raw_bytes: 0,
        kernel_raw_paths: Vec::new(),
        has_kallsyms: false,
        has_kcore: false,
    };
    let entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    let mut names: Vec<PathBuf> = entries
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "info"))
        .cloned()
        .collect();
    // Thread files, and those a spool stands for (the process died before creating them).
    names.extend(drpttracer::format::spool::thread_files(&entries));
    names.sort();
    for path in names {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(key) = key_of(&name) else { continue };
        if name.ends_with(".info") {
            match summary::summarize_process(&path) {
                Ok(p) => {
                    s.processes.insert(key, p);
                }
                Err(e) => s.unreadable.push((name, e.to_string())),
            }
        } else {
            match summary::summarize_thread(&path) {
                Ok(t) => s.threads.entry(key).or_default().push(t),
                Err(e) => s.unreadable.push((name, e.to_string())),
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("kernel.raw")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            match name.as_str() {
                "kallsyms" => s.has_kallsyms = true,
                "kcore" => s.has_kcore = true,
                n if n.ends_with(".raw.pt") => {
                    s.kernel_raw_files += 1;
                    s.kernel_raw_bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
                    s.kernel_raw_paths.push(e.path());
                }
                _ => {}
            }
        }
        s.kernel_raw_paths.sort();
    }
    Ok(s)
}

/// A thread file whose last record was torn by the death of its process, completed from
/// its spool: not damage (the torn window is among the recovered ones).
fn torn_tail_recovered(t: &ThreadSummary) -> bool {
    t.spool_pending && matches!(t.tail, Tail::Truncated { .. })
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

/// Prints the summary; returns it for callers that add to it.
pub fn print_summary(
    dir: &Path,
    per_syscall: bool,
    w: &mut dyn std::io::Write,
) -> Result<DirSummary, String> {
    let s = summarize_dir(dir)?;
    say!(
        w,
        "trace directory: {}",
        printable(&dir.display().to_string())
    );
    let mut keys: Vec<_> = s
        .processes
        .keys()
        .chain(s.threads.keys())
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    let mut backends = BTreeMap::<String, usize>::new();
    for key in &keys {
        let (pid, nonce) = key;
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
        for t in s.threads.get(key).into_iter().flatten() {
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
    }
    for (name, e) in &s.unreadable {
        say!(w, "unreadable: {name}: {e}");
    }
    let pt: u64 = s.threads.values().flatten().map(|t| t.pt_bytes).sum();
    let sb: u64 = s.threads.values().flatten().map(|t| t.sideband_bytes).sum();
    let lossy: u64 = s.threads.values().flatten().map(|t| t.lossy_windows).sum();
    let overflowed: u64 = s
        .threads
        .values()
        .flatten()
        .map(|t| t.overflow_windows)
        .sum();
    let dropped: u64 = s.threads.values().flatten().map(|t| t.dropped).sum();
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
        "total: {} processes{images}, {} threads, {} windows, {} PT bytes, {} sideband bytes, \
         losses: {lossy} lossy windows ({overflowed} with PT overflows), {dropped} dropped windows, \
         {} truncated/corrupt files; \
         backend {backend}; kernel.raw: {} files, {} bytes{}{}",
        pids.len(),
        s.thread_count(),
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
    let s = print_summary(&args.dir, args.per_syscall, &mut std::io::stdout().lock())?;
    s.damages().finish("report", args.keep_going)
}
