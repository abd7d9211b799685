//! The one reader of a trace directory's files for every command: each info and thread
//! file (and the spool standing for a thread file a killed process never made) read and
//! validated once, frame by frame, into a [`DirSummary`]; [`DirSummary::damages`] is the
//! list of damage that `report`, `decode DIR` and `view DIR` all print, with the same
//! cause, file and position, and [`DirSummary::losses`] the one line about losses they
//! all print.

use crate::damage::Damages;
use drpttracer::format::ptt::Tail;
use drpttracer::format::summary::{self, ProcessSummary, ThreadSummary};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Everything found in a trace directory.
pub struct DirSummary {
    /// Info files keyed by (pid, nonce) as written in their file names.
    pub processes: BTreeMap<(i32, String), ProcessSummary>,
    /// Thread files keyed by (pid, nonce) of their process image.
    pub threads: BTreeMap<(i32, String), Vec<ThreadSummary>>,
    /// Files that could not be read at all (name, error).
    pub unreadable: Vec<(String, String)>,
    /// Trace files whose names do not follow `<pid>-<nonce>[-<tid>]` (stray files: `decode`
    /// reads a thread file whatever its name), with how their frames end.
    pub stray_tails: Vec<(String, Tail)>,
    pub kernel_raw_files: usize,
    pub kernel_raw_bytes: u64,
    /// `kernel.raw/<tid>.raw.pt` paths, sorted.
    pub kernel_raw_paths: Vec<PathBuf>,
    /// Damage met in those files' PDB framing: (file, byte, what).
    pub kernel_raw_damage: Vec<(String, u64, String)>,
    pub has_kallsyms: bool,
    pub has_kcore: bool,
}

impl DirSummary {
    /// Every process image (info file or thread files): processes in the order they
    /// started (the program run first, whatever the pids, which wrap around), the images
    /// of a process in the order they started (an `execve` chain in its order; the image
    /// ids are random).
    pub fn images(&self) -> Vec<(i32, String)> {
        let mut keys: Vec<_> = self
            .processes
            .keys()
            .chain(self.threads.keys())
            .cloned()
            .collect();
        keys.sort();
        keys.dedup();
        let starts: BTreeMap<(i32, String), u64> = keys
            .iter()
            .map(|k| (k.clone(), self.image_start(k)))
            .collect();
        let mut pid_start = BTreeMap::<i32, u64>::new();
        for (k, &s) in &starts {
            let p = pid_start.entry(k.0).or_insert(u64::MAX);
            *p = (*p).min(s);
        }
        keys.sort_by_key(|k| (pid_start[&k.0], k.0, starts[k]));
        keys
    }

    /// When image `key` started (its TSC; `u64::MAX` when nothing says).
    fn image_start(&self, key: &(i32, String)) -> u64 {
        let from_threads = self
            .threads
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|t| t.header.as_ref().map(|h| h.start_tsc))
            .min();
        self.processes
            .get(key)
            .and_then(|p| p.process.as_ref().map(|r| r.start_tsc))
            .or(from_threads)
            .unwrap_or(u64::MAX)
    }

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
            if let Some((offset, want, got)) = t.first_index_gap {
                let more = match t.index_gaps {
                    1 => String::new(),
                    n => format!(" (the first of {n} places where the indices jump)"),
                };
                d.add(
                    &t.file,
                    offset,
                    format!(
                        "window {got} follows window {}: windows missing{more}",
                        want.wrapping_sub(1)
                    ),
                );
            }
        }
        for t in self.threads.values().flatten() {
            if let Some((spool, at, want, got)) = &t.spool_gap {
                let what = match want {
                    0 => format!(
                        "window {got} is the thread's first: windows 0 to {} missing",
                        got.wrapping_sub(1)
                    ),
                    w => format!("window {got} follows window {}: windows missing", w - 1),
                };
                d.add(spool, *at, format!("{what} (a spool entry lost)"));
            }
            if let Some((spool, at, n)) = &t.spool_corrupt {
                let more = match n {
                    1 => String::new(),
                    n => format!(" (the first of {n} such entries)"),
                };
                d.add(
                    spool,
                    *at,
                    format!(
                        "a queued window's entry fails its checksum (damaged after it was \
                         written): that window is left out{more}"
                    ),
                );
            }
        }
        for (key, ts) in &self.threads {
            let Some((reason, _)) = self.processes.get(key).and_then(|p| p.end) else {
                continue;
            };
            for t in ts {
                if t.end.is_none() && t.tail == Tail::Clean && !t.spool_pending {
                    let name = drpttracer::format::ptt::EndReason::from_raw(reason)
                        .map_or("?", |r| r.name());
                    d.add(
                        &t.file,
                        t.file_len,
                        format!(
                            "the file ends without its End record although its process ended \
                             ({name}): its last windows are missing"
                        ),
                    );
                }
            }
        }
        for (name, tail) in &self.stray_tails {
            d.add_tail(name, tail);
        }
        for (name, at, what) in &self.kernel_raw_damage {
            d.add(name, *at, what.clone());
        }
        for (name, e) in &self.unreadable {
            d.add_whole(name, format!("unreadable: {e}"));
        }
        for (key, p) in &self.processes {
            // A thread whose end ended its process (exit_group, the last thread's exit, a
            // fatal signal, exec): the info file's ProcessEnd record, written then, must be
            // there; without it, the info file's end was cut off.
            use drpttracer::format::ptt::EndReason;
            let ended = self.threads.get(key).and_then(|ts| {
                ts.iter().find_map(|t| {
                    let r = EndReason::from_raw(t.end?.0)?;
                    (r != EndReason::ThreadExit).then_some(r)
                })
            });
            if let (Some(r), None, Tail::Clean) = (ended, p.end, &p.tail) {
                d.add(
                    &p.file,
                    p.file_len,
                    format!(
                        "the file ends without its ProcessEnd record although a thread of the \
                         process ended by {}: its last records are missing",
                        r.name()
                    ),
                );
            }
        }
        let mut main_missing = std::collections::BTreeSet::new();
        for ((pid, nonce), p) in &self.processes {
            // Every image has its main thread's file (the thread that execs takes the
            // process id), created when the image starts: one missing was deleted.
            let own = format!("-{pid}.ptt");
            let has_main = self
                .threads
                .get(&(*pid, nonce.clone()))
                .is_some_and(|ts| ts.iter().any(|t| t.file.ends_with(&own)));
            if !has_main {
                main_missing.insert((*pid, nonce.clone()));
                let file = std::path::Path::new(&p.file)
                    .with_file_name(format!("{pid}-{nonce}-{pid}.ptt"));
                d.add_whole(
                    file.display(),
                    "missing: the main thread's file of the image that the info file beside \
                     it describes (deleted?): its windows are lost",
                );
            }
        }
        for (key, ts) in &self.threads {
            // The shim keeps a thread's queue in a spool until the thread's End record is
            // written; a file without its End record, never completed from a spool, whose
            // spool is gone: the windows the spool held are lost.
            let Some(p) = self.processes.get(key) else {
                continue;
            };
            // (Where the process ended, a file without its End record is reported above.)
            let spooled = p.end.is_none()
                && p.config.lines().any(|l| l == "PTTRACER_SPOOL=on")
                && !p
                    .config
                    .lines()
                    .any(|l| l.starts_with("PTTRACER_SNAPSHOT="));
            for t in ts {
                let shim = t
                    .header
                    .as_ref()
                    .is_some_and(|h| h.backend != drpttracer::format::ptt::BACKEND_QEMU);
                if spooled
                    && shim
                    && t.end.is_none()
                    && t.recovered.is_none()
                    && !t.spool_pending
                    && t.snapshots.is_empty()
                {
                    let spool = drpttracer::format::spool::path_for(Path::new(&t.file));
                    d.add_whole(
                        spool.display(),
                        "missing: the spool of a thread file that ends without its End record \
                         (its process died) and was never completed from it (deleted?): the \
                         windows it held are lost",
                    );
                }
            }
        }
        for t in self.threads.values().flatten() {
            // The shim opens a thread's `kernel.raw/<tid>.raw.pt` with its thread file when
            // it traces the kernel (modes kernel and user_kernel).
            let Some(h) = &t.header else { continue };
            let kernel = matches!(
                drpttracer::format::ptt::mode_name(h.mode),
                "kernel" | "user_kernel"
            );
            if !kernel || h.backend == drpttracer::format::ptt::BACKEND_QEMU || t.windows == 0 {
                continue;
            }
            let raw = Path::new(&t.file)
                .with_file_name("kernel.raw")
                .join(format!("{}.raw.pt", h.tid));
            if !self.kernel_raw_paths.contains(&raw) {
                d.add_whole(
                    raw.display(),
                    "missing: the kernel side of a thread traced in kernel mode (deleted?): \
                     its kernel windows are lost",
                );
            }
        }
        for (key, p) in &self.processes {
            // The writer counted the image's thread files in its ProcessEnd: fewer here
            // were deleted or lost (the main thread's is checked by name above).
            let Some((at, want)) = p.thread_files else {
                continue;
            };
            // A missing main thread's file is reported above, by name.
            let named = u64::from(main_missing.contains(key));
            let got = self.threads.get(key).map_or(0, Vec::len) as u64;
            if got + named < want {
                d.add(
                    &p.file,
                    at,
                    format!(
                        "the ProcessEnd record counts {want} thread files for this image, \
                         {got} are here: {} missing{} (deleted?), their windows are lost",
                        want - got - named,
                        if named == 1 {
                            " besides the main thread's"
                        } else {
                            ""
                        }
                    ),
                );
            }
        }
        for ((pid, nonce), ts) in &self.threads {
            if self.processes.contains_key(&(*pid, nonce.clone())) {
                continue;
            }
            for t in ts {
                d.add_whole(
                    &t.file,
                    format!(
                        "its process's info file {pid}-{nonce}.info is missing: the \
                         process's maps, vDSO and end are unknown"
                    ),
                );
            }
        }
        d
    }

    /// Windows with losses, those of them with PT overflows, and windows dropped.
    pub fn loss_counts(&self) -> (u64, u64, u64) {
        let mut n = (0, 0, 0);
        for t in self.threads.values().flatten() {
            n.0 += t.lossy_windows;
            n.1 += t.overflow_windows;
            n.2 += t.dropped;
        }
        n
    }

    /// What the trace lost while it was recorded, in one line (`None`: nothing): windows
    /// whose PT or sideband is incomplete (OVF packets among them) and windows dropped.
    pub fn losses(&self) -> Option<String> {
        let (lossy, ovf, dropped) = self.loss_counts();
        if lossy == 0 && dropped == 0 {
            return None;
        }
        Some(format!(
            "{lossy} lossy windows ({ovf} with PT overflows), {dropped} dropped windows: \
             what they lack is missing from the output (`pttrace report` says which threads)"
        ))
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
        stray_tails: Vec::new(),
        kernel_raw_files: 0,
        kernel_raw_bytes: 0,
        kernel_raw_paths: Vec::new(),
        kernel_raw_damage: Vec::new(),
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
    // Info files first: a process image's writer ends its threads' files (their End
    // records) before its info file says the process ended, so what is read of a
    // directory being written never has a process ended without its threads' End records
    // (the thread files, read first, had shown that for a moment).
    names.sort_by_key(|p| (p.extension().is_none_or(|x| x != "info"), p.clone()));
    for path in names {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(key) = key_of(&name) else {
            // Read like the others, so every command reports its damage alike.
            let shown = path.display().to_string();
            let tail = if name.ends_with(".info") {
                summary::summarize_process(&path).map(|p| p.tail)
            } else {
                summary::summarize_thread(&path).map(|t| t.tail)
            };
            match tail {
                Ok(t) => s.stray_tails.push((shown, t)),
                Err(e) => s.unreadable.push((shown, e.to_string())),
            }
            continue;
        };
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
    // The threads of an image in the order they started (its main thread first), as
    // `decode` and `view` list them.
    for ts in s.threads.values_mut() {
        ts.sort_by_key(|t| {
            t.header
                .as_ref()
                .map_or((u64::MAX, 0), |h| (h.start_tsc, h.tid))
        });
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("kernel.raw")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            match name.as_str() {
                "kallsyms" => {
                    s.has_kallsyms = true;
                    if let Some(d) = kallsyms_damage(&e.path()) {
                        s.kernel_raw_damage.push(d);
                    }
                }
                "kcore" => s.has_kcore = true,
                n if n.ends_with(".raw.pt") => {
                    s.kernel_raw_files += 1;
                    s.kernel_raw_bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
                    s.kernel_raw_paths.push(e.path());
                    let shown = e.path().display().to_string();
                    match std::fs::read(e.path()) {
                        Ok(data) => match drpttracer::format::pdb::parse_prefix(&data) {
                            Ok((_, None)) => {}
                            Ok((_, Some(d))) | Err(d) => {
                                s.kernel_raw_damage.push((shown, d.offset, d.message));
                            }
                        },
                        Err(err) => s.unreadable.push((shown, err.to_string())),
                    }
                }
                _ => {}
            }
        }
        s.kernel_raw_paths.sort();
    }
    Ok(s)
}

/// What is wrong with a kept `kallsyms` (the kernel's symbols for decoding kernel windows):
/// not UTF-8 text, or a line that does not parse; `None` when it reads well.
fn kallsyms_damage(path: &Path) -> Option<(String, u64, String)> {
    let shown = path.display().to_string();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return Some((shown, crate::damage::WHOLE_FILE, format!("unreadable: {e}"))),
    };
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
            return Some((shown, at as u64, format!("not UTF-8 text (line {line})")));
        }
    };
    let mut syms = drpttracer::decode::Symbols::new();
    match syms.add_kallsyms(path, &text) {
        Ok(_) => None,
        Err(e) => Some((shown, e.offset, e.message)),
    }
}

/// A thread file whose last record was torn by the death of its process, completed from
/// its spool: not damage (the torn window is among the recovered ones).
pub fn torn_tail_recovered(t: &ThreadSummary) -> bool {
    t.spool_pending && matches!(t.tail, Tail::Truncated { .. })
}

/// The damage of a trace input as every command reports it, and whether it covers the
/// input's files: for a directory the shared check of every file (this module),
/// which the command then does not repeat per file; for a single file, nothing yet (its
/// reader adds what it meets).
pub fn of_trace(path: &std::path::Path) -> (Damages, bool) {
    if !path.is_dir() {
        return (Damages::default(), false);
    }
    match summarize_dir(path) {
        Ok(s) => {
            let mut d = s.damages();
            d.set_losses(s.losses());
            (d, true)
        }
        Err(_) => (Damages::default(), false),
    }
}
