//! `pttrace view`: pictures of a `pttrace run` trace, from the call stacks that
//! `drpttracer::decode::callstack` reconstructs from the decoded instructions:
//! - `timeline.json`: Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing,
//!   speedscope): per thread, the function calls as nested complete (`X`) events (category
//!   `call`, with `,start=KIND` / `,end=KIND` added for a span that did not begin with a
//!   call or end with a return; `inlined` for the code of inlined functions, one span per
//!   function of the chain, inside the frame they were inlined into), its windows
//!   (syscalls) on a track beside it, gaps as instant events;
//! - `timeline.pftrace` (every call) and `profile.speedscope.json`;
//! - `flamegraph.svg`: a flame graph (inferno) weighted by instructions;
//! - `stacks.folded`: the collapsed stacks it is drawn from (`a;b;c N`, N instructions).
//!
//! Memory is bounded by the call depth and the distinct stacks, not the trace's length:
//! each thread is decoded ([`decoding`]) while its calls go to a temporary file
//! ([`spill`]) and its instructions into a trie of stacks ([`folded`]). Each file is read
//! back to write the timelines: `timeline.pftrace` on a thread of its own ([`perfetto`]),
//! as soon as the image is decoded when the axis is sure to be instructions (while the
//! next image is decoded), otherwise once all are; the bounded ones ([`json`],
//! [`speedscope`]) once all are, without the calls shorter than a length chosen to fit
//! `--limit`.
//!
//! Time axis: the trace's timestamps converted to nanoseconds where the trace has usable
//! time (hardware PT with a TSC conversion, timestamps in every thread); otherwise (the
//! software backends) instruction counts: each thread's instructions numbered from 0, one
//! instruction = one microsecond of the file's `ts` unit. The file says which in
//! `otherData.time_axis`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use drpttracer::decode::callstack::{
    CallStacks, Finished, Marker, SpanEnd, SpanStart, TimeAnchor, TimeMap,
};
use drpttracer::decode::ptt_dir::{self, PttProcess, PttWindowInfo};
use drpttracer::format::ptt;
use drpttracer::metadata::TimeConv;
use serde::Serialize;

use crate::names::ImageNames;
use crate::text::count;
use crate::CmdResult;

mod decoding;
mod folded;
mod frames;
mod json;
mod perfetto;
mod pftrace;
mod speedscope;
mod spill;
mod varint;

use decoding::decode_one;
use frames::{name_id, FrameNamer, FrameTable, Namer, Names};
use json::{Json, JsonText};
use perfetto::PfPipe;
use speedscope::Speedscope;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ViewFormat {
    /// timeline.pftrace, timeline.json, profile.speedscope.json, flamegraph.svg and
    /// stacks.folded in the output directory.
    Files,
    /// Only the collapsed stacks (`a;b;c N`, N instructions), on stdout.
    Folded,
}

#[derive(clap::Args)]
pub struct Args {
    /// A `pttrace run --out` directory, or one of its per-thread `.ptt` files.
    #[arg(value_name = "DIR|FILE.ptt")]
    trace: PathBuf,
    /// Where to write the files (default: <trace dir>/view).
    #[arg(short, long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// What to produce.
    #[arg(long, value_enum, default_value = "files")]
    format: ViewFormat,
    /// Prefix for the paths of the mapped files (their symbols).
    #[arg(long, value_name = "DIR")]
    sysroot: Option<PathBuf>,
    /// Also look for separate debug files here (repeatable): as a build-id tree
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink name.
    #[arg(long, value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
    /// Damaged input: draw what could be read and exit 0 (the damage is still listed).
    #[command(flatten)]
    policy: crate::damage::Policy,
    /// Largest timeline.json and stacks.folded (e.g. 64M, 1G; the speedscope profile
    /// stays below the JSON): beyond it the shortest calls are merged into their callers,
    /// and the least executed stacks into a `[merged: smaller stacks]` frame under their
    /// caller; each file says how much (chrome://tracing fails near 256 MB of JSON,
    /// speedscope above 375 MB; timeline.pftrace always has every call).
    #[arg(long, alias = "timeline-limit", value_name = "SIZE", default_value = "128M", value_parser = parse_limit)]
    limit: u64,
    /// Write every call and every stack, whatever the size of the files.
    #[arg(long)]
    full: bool,
    /// A part of the trace, in full detail (like `perf script --time`): `insn:A..B`,
    /// positions A (included) to B (excluded) on the instruction axis as the timeline
    /// shows them (`ts`), or `window:N..M`, windows N to M included. Calls are cut to it
    /// (a cut call starts `implied` or ends `trace_end`), the stacks count only its
    /// instructions, and the timeline is not bounded.
    #[arg(long, value_name = "insn:A..B|window:N..M", value_parser = parse_range)]
    range: Option<ViewRange>,
    /// Only the thread with this id (every image of it).
    #[arg(long, value_name = "TID")]
    tid: Option<i32>,
}

/// A part of the trace (`--range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewRange {
    /// Positions `[A, B)` on a thread's instruction axis.
    Insns(u64, u64),
    /// Windows `N..=M`.
    Windows(u64, u64),
}

/// `--limit`'s size (4K to 16G).
fn parse_limit(s: &str) -> Result<u64, String> {
    pttrace_format::snapshot::parse_size_of("--limit", s)
}

fn parse_range(s: &str) -> Result<ViewRange, String> {
    let bad = || format!("--range {s:?}: expected insn:A..B or window:N..M (decimal numbers)");
    let (kind, span) = s.split_once(':').ok_or_else(bad)?;
    let (a, b) = span.split_once("..").ok_or_else(bad)?;
    let num = |x: &str| x.trim().replace('_', "").parse::<u64>().map_err(|_| bad());
    let (a, b) = (num(a)?, num(b)?);
    match kind {
        "insn" if a < b => Ok(ViewRange::Insns(a, b)),
        "window" if a <= b => Ok(ViewRange::Windows(a, b)),
        "insn" | "window" => Err(format!(
            "--range {s:?}: the range is empty (A must be below B)"
        )),
        _ => Err(bad()),
    }
}

/// Bytes a call takes in timeline.json besides its name (at most, with the longest
/// category and 10-digit times; ~60 for most).
const JSON_BYTES_PER_CALL: u64 = 110;
/// Bytes of a window's event, of a gap's, and of the names and the file's end (at most).
const JSON_BYTES_PER_WINDOW: u64 = 300;
const JSON_BYTES_PER_GAP: u64 = 400;
const JSON_BYTES_FIXED: u64 = 64 << 10;

/// Window flags that mean the trace of a window is not continuous with the one before.
const LOSS_FLAGS: u32 =
    ptt::WF_PT_LOST | ptt::WF_PT_DROPPED | ptt::WF_CAPTURE_ERROR | ptt::WF_PT_ABSENT;

/// Tracks of a thread's windows get this added to the thread id (Linux thread ids stay
/// below 2^22).
const WINDOW_TRACK: i64 = 1_000_000_000;

/// One line per module whose code got no name from symbols, with what would fix it.
pub fn note_unnamed_modules<'a>(cmd: &str, images: impl Iterator<Item = &'a ImageNames>) {
    let mut lines: Vec<String> = images
        .flat_map(ImageNames::modules_without_symbols)
        .collect();
    lines.sort();
    lines.dedup();
    for l in lines {
        eprintln!(
            "pttrace {cmd}: code without symbols named module+0xOFFSET: {}",
            crate::text::printable(&l)
        );
    }
}

/// Code that JIT compilers made, below this many distinct addresses without names, is
/// not worth a line (a trampoline or two).
const JIT_NAMES_WORTH_A_LINE: u64 = 64;

/// One line per program whose JIT code got no names (no perf map, no jitdump), saying
/// how its runtime would name it: (program, distinct addresses named by address alone).
pub fn note_unnamed_jit<'a>(cmd: &str, images: impl Iterator<Item = (&'a str, u64)>) {
    let mut per_prog = std::collections::BTreeMap::<&str, u64>::new();
    for (prog, n) in images {
        *per_prog.entry(prog).or_default() += n;
    }
    for (prog, n) in per_prog {
        if n >= JIT_NAMES_WORTH_A_LINE {
            let base = prog.rsplit('/').next().unwrap_or(prog);
            eprintln!(
                "pttrace {cmd}: JIT code named by address: {n} addresses of {} outside any \
                 file, without a perf map or jitdump to name them; {}",
                crate::text::printable(base),
                crate::text::printable(&crate::names::jit_names_hint(prog))
            );
        }
    }
}

/// A `ts`/`dur` value: integers on the instruction axis, microseconds with a fraction on
/// the time axis.
#[derive(Serialize, Clone, Copy)]
#[serde(untagged)]
enum Ts {
    I(u64),
    F(f64),
}

#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'a str>,
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<Ts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<Ts>,
    pid: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<serde_json::Value>,
}

impl<'a> Event<'a> {
    fn new(name: &'a str, ph: &'static str, pid: i32, tid: Option<i64>) -> Self {
        Event {
            name,
            cat: None,
            ph,
            ts: None,
            dur: None,
            pid,
            tid,
            s: None,
            args: None,
        }
    }
}

/// The file's time axis.
#[derive(Clone)]
enum Axis {
    Instructions { why: String },
    Nanoseconds { t0: f64 },
}

impl Axis {
    /// (ts, dur) of instructions `[start, end)` of a thread image with clock `c`.
    #[inline]
    fn place(&self, c: &Clock, start: u64, end: u64) -> (Ts, Ts) {
        match (self, &c.time) {
            (Axis::Nanoseconds { t0 }, Some(m)) => {
                let (a, b) = (m.at(start), m.at(end));
                (Ts::F((a - t0) / 1000.0), Ts::F((b - a).max(0.0) / 1000.0))
            }
            _ => (Ts::I(c.base + start), Ts::I(end.saturating_sub(start))),
        }
    }
}

/// Where a thread image's instructions lie on the axis.
#[derive(Clone)]
struct Clock {
    /// Where its instruction 0 lies on an instruction axis (a thread continuing in a new
    /// image after execve continues the axis of the old one).
    base: u64,
    /// Its instructions' times, when the trace has usable time.
    time: Option<TimeMap>,
}

/// The open calls of a thread image as the timelines place them: each one's end (ns),
/// kept inside its caller's should rounding of times disagree, with what the writer keeps
/// of it (`T`).
struct Nesting<T> {
    open: Vec<(u64, T)>,
}

impl<T: Default> Nesting<T> {
    fn new() -> Self {
        Nesting { open: Vec::new() }
    }

    /// A call of instructions `[at, at + len)` begins: its (ts, dur) on the axis and its
    /// begin in ns.
    #[inline]
    fn begin(&mut self, axis: &Axis, c: &Clock, at: u64, len: u64, kept: T) -> (Ts, Ts, u64) {
        let (ts, dur) = axis.place(c, at, at + len);
        let b = ns(ts);
        let outer = self.open.last().map_or(u64::MAX, |e| e.0);
        self.open.push(((b + ns(dur)).min(outer).max(b), kept));
        (ts, dur, b)
    }

    /// The innermost open call ends: its end (ns) and what was kept of it.
    fn end(&mut self) -> (u64, T) {
        self.open.pop().unwrap_or((0, T::default()))
    }
}

/// Who a thread image is: what its tracks are named after.
#[derive(Clone)]
struct Who {
    pid: i32,
    tid: i32,
    comm: String,
    /// Its image's command line.
    cmdline: String,
    syscall_windows: bool,
}

pub(crate) fn basename(cmdline: &str) -> String {
    let first = cmdline.split(' ').next().unwrap_or("");
    first.rsplit('/').next().unwrap_or(first).to_string()
}

/// One thread image's reconstruction, ready to draw.
struct ThreadView {
    who: Who,
    clock: Clock,
    /// Its image's namer: (pid, nonce).
    image: (i32, u64),
    /// Its spans, on disk while the view is made (none for `--format folded`).
    spill: Option<spill::Spill>,
    /// Its spans (each function of an inlined chain counted once).
    spans: u64,
    markers: Vec<Marker>,
    instructions: u64,
    /// Each window and its instruction range.
    windows: Vec<(PttWindowInfo, u64, u64)>,
    /// `--range`: the instructions `[a, b)` shown.
    cut: Option<(u64, u64)>,
}

pub fn run(args: Args) -> CmdResult {
    let mut trace = ptt_dir::open(&args.trace)?;
    // The install advice for modules without symbols comes at the end; its index of
    // dpkg's file lists is read meanwhile (on a core the decoding leaves idle at first).
    // (A thread that cannot start leaves it to be read then.)
    let _ = std::thread::Builder::new()
        .name("view-dpkg".into())
        .spawn(pttrace_symbols::prepare_debian_packages);
    trace.sysroot = args.sysroot.clone();
    let trace_dir = if args.trace.is_dir() {
        args.trace.clone()
    } else {
        args.trace
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    };
    let symbolizer = crate::names::symbolizer(&args.debug_dir);
    let mut names = Names::default();
    let mut namers: HashMap<(i32, u64), Namer> = HashMap::new();
    let (mut damages, files_checked) = crate::tracedir::of_trace(&args.trace);
    damages.add_skipped(&trace.skipped);
    // The thread images in the order `ptt_dir::open` lists them, which `report` and
    // `decode` list too: processes in the order they started (a parent before its
    // children, whose first image starts in the parent's frames at the fork), a
    // process's images in exec order (each thread's images in order), an image's
    // threads in start order.
    let mut order: Vec<usize> = (0..trace.threads.len()).collect();
    if let Some(t) = args.tid {
        order.retain(|&i| trace.threads[i].header.tid == t);
        if order.is_empty() {
            return Err(format!("--tid {t}: no thread of the trace has that id").into());
        }
    }
    // The output directory holds the spans while the trace is decoded.
    let out_dir = match (&args.out, args.format) {
        (_, ViewFormat::Folded) => None,
        (Some(d), _) => Some(d.clone()),
        (None, _) => {
            let dir = if args.trace.is_dir() {
                args.trace.clone()
            } else {
                args.trace
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf()
            };
            Some(dir.join("view"))
        }
    };
    if let Some(d) = &out_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| format!("{}: cannot create the directory: {e}", d.display()))?;
    }
    // Who each thread image is, known before decoding: the tracks of the timelines.
    let whos: Vec<Who> = order
        .iter()
        .map(|&i| {
            let th = &trace.threads[i];
            let h = &th.header;
            let proc_ = trace.process_of(th);
            Who {
                pid: h.pid,
                tid: h.tid,
                comm: proc_
                    .map(|p| basename(&p.cmdline))
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| format!("pid {}", h.pid)),
                cmdline: proc_.map(|p| p.cmdline.clone()).unwrap_or_default(),
                syscall_windows: ptt::window_name(h.window) == "syscall",
            }
        })
        .collect();
    // timeline.pftrace is written on a thread of its own, each thread image's part as soon
    // as it is decoded when the axis is sure to be instructions (no hardware trace: no
    // time), while the next one is decoded; otherwise once every image is decoded.
    let streamed = order
        .iter()
        .all(|&i| ptt::backend_name(trace.threads[i].header.backend) != "hardware");
    let shared_names = crate::names::SharedImages::of(
        &trace,
        order.iter().filter_map(|&i| trace.threads.get(i)),
        &trace_dir,
    );
    // Threads of the same code hand their decoder caches on.
    let mut carriers = crate::carried::Carriers::new(
        &shared_names,
        order.iter().filter_map(|&i| trace.threads.get(i)),
    );
    let mut pf = match &out_dir {
        Some(d) => {
            let mut p = PfPipe::start(d.join("timeline.pftrace"))?;
            if streamed {
                p.tracks(&whos, &Axis::Instructions { why: String::new() });
            }
            Some(p)
        }
        None => None,
    };
    let limit = (!args.full && args.range.is_none()).then_some(args.limit);
    let bar = crate::progress::pt_bytes(crate::progress::trace_bytes(&trace));
    let mut views: Vec<ThreadView> = Vec::new();
    // The most instructions (on the thread's axis) and windows of a thread image, for a
    // `--range` that holds nothing.
    let mut longest = (0u64, 0u64);
    // Returns that went where no open call expected, and the thread images they were in.
    let (mut lost_returns, mut lost_in) = (0u64, 0usize);
    let mut axis_end: HashMap<(i32, i32), u64> = HashMap::new();
    // The stack of each fork seen so far, by the child's id.
    let mut forks: HashMap<i32, drpttracer::decode::callstack::StackSeed> = HashMap::new();
    let mut costs = spill::Costs::default();
    let mut folded = folded::Folded::default();
    for (k, &i) in order.iter().enumerate() {
        let th = &trace.threads[i];
        let h = &th.header;
        let proc_ = trace.process_of(th);
        // Where this image's instruction 0 lies on the thread's axis.
        let base = axis_end.get(&(h.pid, h.tid)).copied().unwrap_or(0);
        let image_key = shared_names.names_of((h.pid, h.nonce));
        let namer = namers.entry(image_key).or_insert_with(|| {
            Namer::new(
                ImageNames::new(
                    proc_,
                    trace.sysroot.as_deref(),
                    Some(&trace_dir),
                    symbolizer.clone(),
                )
                .with_code_files(shared_names.code_files(image_key)),
            )
        });
        let Namer { image, ids, frames } = namer;
        let range = args.range.map(|r| match r {
            ViewRange::Insns(a, b) => {
                ViewRange::Insns(a.saturating_sub(base), b.saturating_sub(base))
            }
            w => w,
        });
        // The spans go to a spill file, or nowhere for `--format folded`.
        let path = out_dir
            .as_ref()
            .map(|d| d.join(format!(".view-spans-{k}.tmp")));
        let (spill, trie, markers, anchors, instructions, windows, counted, stats) = {
            let mut fnamer = FrameNamer {
                image: &*image,
                ids: &mut *ids,
                frames,
                names: &mut names,
            };
            let sink = match &path {
                Some(p) => Some(
                    spill::SpillSink::create(p, &mut fnamer, &mut costs)
                        .map_err(|e| format!("{}: cannot create: {e}", p.display()))?,
                ),
                None => None,
            };
            let cs = CallStacks::with_sink(&*image, sink).with_inline_frames();
            // (A forked child's first image: its parent's frames at the fork.)
            let inherited = forks.get(&h.pid).filter(|_| h.tid == h.pid && base == 0);
            let mut carried = carriers.take(image_key);
            let (done, windows, counted, stats, made) =
                decode_one(&trace, th, cs, range, bar.as_ref(), inherited, &mut carried)?;
            carriers.give_back(image_key, carried);
            forks.extend(made);
            let Finished {
                sink,
                trie,
                markers,
                anchors,
                instructions,
                lost_returns: lost,
            } = done;
            lost_returns += lost;
            lost_in += usize::from(lost > 0);
            let spill = match (sink, &path) {
                (Some(s), Some(p)) => Some(
                    s.finish()
                        .map_err(|e| format!("{}: cannot write: {e}", p.display()))?,
                ),
                _ => None,
            };
            (
                spill,
                trie,
                markers,
                anchors,
                instructions,
                windows,
                counted,
                stats,
            )
        };
        let spans = spill.as_ref().map_or(0, spill::Spill::spans);
        if !files_checked {
            damages.add_tail(th.path.display(), &stats.tail);
        }
        if !stats.ended {
            eprintln!("pttrace view: {}", crate::text::unended_note(&th.path));
        }
        for w in &stats.warnings {
            eprintln!(
                "pttrace view: warning: {}: {}",
                crate::text::printable(&th.path.display().to_string()),
                crate::text::printable(&w.to_string())
            );
        }
        let who = whos
            .get(k)
            .cloned()
            .ok_or("view: thread images out of step")?;
        // Collapsed stacks, under the image's command name.
        let root = names.intern(who.comm.replace([';', ' '], "_"));
        folded.add_thread(root, &trie, |key| name_id(image, ids, &mut names, key));
        drop(trie);
        let (mut markers, mut windows) = (markers, windows);
        let cut = args.range.map(|_| {
            let b = counted.end.min(instructions);
            (counted.start.min(b), b)
        });
        if let Some((a, b)) = cut {
            markers.retain(|m| (a..=b).contains(&m.at));
            windows.retain(|(_, s, e)| (*e > a && *s < b) || (s == e && (a..b).contains(s)));
        }
        *axis_end.entry((h.pid, h.tid)).or_insert(0) = base + instructions;
        longest = (
            longest.0.max(base + instructions),
            longest.1.max(stats.windows),
        );
        views.push(ThreadView {
            who,
            clock: Clock {
                base,
                time: hardware_time(h.backend, proc_, &anchors),
            },
            image: image_key,
            spill,
            spans,
            markers,
            instructions,
            windows,
            cut,
        });
        if let (Some(pf), true, Some(v)) = (&mut pf, streamed, views.last()) {
            // The length below which the bounded formats will merge calls is at least the
            // one the images so far give: the calls that long are kept for them.
            let keep_from = limit.map(|l| costs.threshold(l.saturating_sub(json_fixed(&views))));
            pf.view(v, &namers, &names, keep_from);
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if let Some(r) = args.range {
        if views.iter().all(|v| v.cut.is_none_or(|(a, b)| a >= b)) {
            let (what, most) = match r {
                ViewRange::Insns(a, b) => (
                    format!("insn:{a}..{b}"),
                    format!("the longest thread image ends at instruction {}", longest.0),
                ),
                ViewRange::Windows(n, m) => (
                    format!("window:{n}..{m}"),
                    format!(
                        "the most windows a thread image has is {}, counted from 0",
                        longest.1
                    ),
                ),
            };
            let tid = args
                .tid
                .map_or(String::new(), |t| format!(" of thread {t}"));
            return Err(format!(
                "--range {what}: no instruction{tid} is in that part of the trace ({most})"
            )
            .into());
        }
    }
    note_unnamed_modules("view", namers.values().map(|n| &n.image));
    note_unnamed_jit(
        "view",
        namers.iter().map(|((pid, nonce), n)| {
            let prog = trace
                .processes
                .iter()
                .find(|p| p.pid == *pid && p.nonce == *nonce)
                .and_then(|p| p.cmdline.split(' ').next())
                .unwrap_or("");
            (prog, n.image.jit_without_names())
        }),
    );
    let name_of = |n: u32| names.get(n);

    let Some(out_dir) = out_dir else {
        let stdout = std::io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        let written = folded.write(&name_of, limit, &mut out)?;
        out.flush()?;
        if lost_returns > 0 {
            eprintln!("pttrace view: {}", lost_returns_said(lost_returns, lost_in));
        }
        if written.merged_frames > 0 {
            eprintln!(
                "pttrace view: {} frames of stacks under {} instructions merged into `{}` \
                 frames to stay within --limit; --full writes them all",
                written.merged_frames,
                written.merged_below,
                folded::MERGED
            );
        }
        return damages.finish("view", args.policy);
    };

    let axis = choose_axis(&views);
    // Calls shorter than this are merged into their callers in the bounded formats.
    let merge_below = limit.map_or(0, |l| costs.threshold(l.saturating_sub(json_fixed(&views))));
    let part = match (args.range, args.tid) {
        (None, None) => "the whole trace".to_string(),
        (r, t) => {
            let r = match r {
                Some(ViewRange::Insns(a, b)) => format!("instructions {a}..{b} of each thread"),
                Some(ViewRange::Windows(n, m)) => format!("windows {n} to {m}"),
                None => "the whole trace".to_string(),
            };
            let t = t.map_or(String::new(), |t| format!(", thread {t} only"));
            format!("{r}{t} (calls cut to it)")
        }
    };
    let paths = OutPaths {
        timeline: out_dir.join("timeline.json"),
        pftrace: out_dir.join("timeline.pftrace"),
        speedscope: out_dir.join("profile.speedscope.json"),
    };
    let mut pf = pf.ok_or("view: the Perfetto writer did not start")?;
    if !streamed {
        pf.tracks(&whos, &axis);
        for v in &views {
            pf.view(v, &namers, &names, limit.map(|_| merge_below));
        }
    }
    // Gaps and losses: where the stacks start over (instant events on the timeline).
    let gaps: usize = views.iter().map(|v| v.markers.len()).sum();
    let stacks_path = out_dir.join("stacks.folded");
    let svg = out_dir.join("flamegraph.svg");
    // JSON and speedscope here, the folded stacks and the flame graph on a thread of
    // their own, while the Perfetto writer finishes.
    let (written, pftrace_size, stacks) = std::thread::scope(|scope| {
        let stacks = scope.spawn(|| {
            write_stacks(
                &folded,
                &names,
                limit,
                (&stacks_path, &svg),
                flamegraph_title(trace.processes.first().map(|p| p.cmdline.as_str()), gaps),
            )
        });
        let written = write_views(
            &paths,
            &views,
            &namers,
            &names,
            &axis,
            (&args.trace, &part),
            (merge_below, &mut || pf.kept()),
        );
        let pftrace_size = pf.finish();
        let stacks = stacks
            .join()
            .unwrap_or_else(|_| Err("view: the folded-stacks writer panicked".to_string()));
        (written, pftrace_size, stacks)
    });
    let wrote = written?;
    let pftrace_size = pftrace_size?;
    let (folded_written, svg_written) = stacks?;
    for v in &mut views {
        v.spill = None;
    }

    let insns: u64 = views.iter().map(|v| v.instructions).sum();
    let spans: u64 = views.iter().map(|v| v.spans).sum();
    let axis_text = match &axis {
        Axis::Instructions { why } => format!("instructions ({why})"),
        Axis::Nanoseconds { .. } => "nanoseconds (TSC)".to_string(),
    };
    // Threads as the kernel counts them (as `report` does): a thread that execs goes on,
    // in a new image, with the same id.
    let threads: std::collections::BTreeSet<(i32, i32)> =
        views.iter().map(|v| (v.who.pid, v.who.tid)).collect();
    let images = if views.len() > threads.len() {
        format!(" ({} thread images: execve)", views.len())
    } else {
        String::new()
    };
    println!(
        "{}{images}, {insns} instructions, {}, {}; time axis: {axis_text}",
        count(threads.len() as u64, "thread"),
        count(spans, "function span"),
        count(gaps as u64, "gap")
    );
    if lost_returns > 0 {
        println!(
            "             ({})",
            lost_returns_said(lost_returns, lost_in)
        );
    }
    println!(
        "timeline:    {} ({} events; open in ui.perfetto.dev, chrome://tracing or speedscope)",
        paths.timeline.display(),
        wrote.events
    );
    let merged = wrote.merged;
    if merged > 0 {
        println!(
            "             ({merged} calls shorter than {merge_below} instructions merged into \
             their callers to stay within --limit; --full writes them all)"
        );
    }
    println!(
        "             {} ({} bytes, every call; Perfetto's own format: open in \
         ui.perfetto.dev)",
        paths.pftrace.display(),
        pftrace_size.file
    );
    if let Some(note) = perfetto::large_trace_note(pftrace_size, &paths.pftrace) {
        println!("             {note}");
    }
    println!(
        "             {} (speedscope's own format, the axis in {})",
        paths.speedscope.display(),
        match &axis {
            Axis::Instructions { .. } => "instructions",
            Axis::Nanoseconds { .. } => "nanoseconds",
        }
    );
    if svg_written {
        println!("flame graph: {}", svg.display());
    } else {
        println!("flame graph: none (no instructions were decoded)");
    }
    println!("stacks:      {}", stacks_path.display());
    if folded_written.merged_frames > 0 {
        println!(
            "             ({} frames of stacks under {} instructions merged into `{}` frames \
             to stay within --limit; --full writes them all)",
            folded_written.merged_frames,
            folded_written.merged_below,
            folded::MERGED
        );
    }
    let (addrs, spent) = namers
        .values()
        .map(|n| n.image.cost())
        .fold((0, std::time::Duration::ZERO), |(a, t), (n, d)| {
            (a + n, t + d)
        });
    let shared = match namers.len() {
        n if shared_names.images() <= n => String::new(),
        1 => "; 1 set of mappings, named once".to_string(),
        n => format!("; {n} sets of mappings, each named once"),
    };
    println!(
        "names:       {addrs} distinct addresses named in {:.2} s ({}{shared})",
        spent.as_secs_f64(),
        count(shared_names.images() as u64, "process image")
    );
    damages.finish("view", args.policy)
}

/// What `view` says of the returns that went where no open call expected (`n` of them, in
/// `images` thread images).
fn lost_returns_said(n: u64, images: usize) -> String {
    format!(
        "{} in {} went where no open call expected: code that makes its own return \
         addresses, as a JIT, an interpreter or a deoptimizer do; the stacks there may be \
         wrong",
        count(n, "return"),
        count(images as u64, "thread image")
    )
}

/// The flame graph's title: the command line, and the gaps and losses when there are any.
fn flamegraph_title(cmdline: Option<&str>, gaps: usize) -> String {
    let mut title = match cmdline {
        Some(c) if !c.is_empty() => format!("pttrace view: {c}"),
        _ => "pttrace view".to_string(),
    };
    if gaps > 0 {
        title.push_str(&format!(
            " ({gaps} gaps or losses in the trace: the stacks start over at each; they are \
             instant events on the timeline)"
        ));
    }
    title
}

/// Writes `stacks.folded` and `flamegraph.svg` (none when no instructions were decoded:
/// `false`) from the collapsed stacks.
fn write_stacks(
    folded: &folded::Folded,
    names: &Names,
    limit: Option<u64>,
    (stacks_path, svg): (&Path, &Path),
    title: String,
) -> Result<(folded::Written, bool), String> {
    let mut w = BufWriter::with_capacity(
        1 << 20,
        crate::outfile::OutFile::create(stacks_path)
            .map_err(|e| format!("{}: cannot create: {e}", stacks_path.display()))?,
    );
    let name_of = |n: u32| names.get(n);
    let written = folded
        .write(&name_of, limit, &mut w)
        .and_then(|r| crate::outfile::commit_buffered(w).map(|()| r))
        .map_err(|e| format!("{}: cannot write: {e}", stacks_path.display()))?;
    if folded.is_empty() {
        return Ok((written, false));
    }
    let lines = folded.lines_for_width(&name_of, FLAMEGRAPH_WIDTH);
    write_flamegraph(svg, &lines, title)
        .map_err(|e| format!("{}: cannot write: {e}", svg.display()))?;
    Ok((written, true))
}

/// The thread's timestamps as nanoseconds, when the trace has usable time: hardware PT,
/// a known TSC conversion, and at least two timestamps.
fn hardware_time(backend: u8, p: Option<&PttProcess>, anchors: &[TimeAnchor]) -> Option<TimeMap> {
    if ptt::backend_name(backend) != "hardware" {
        return None;
    }
    let md = p?.metadata?;
    let (time_shift, time_mult, time_zero) = (md.time_shift, md.time_mult, md.time_zero);
    if time_mult == 0 || anchors.len() < 2 {
        return None;
    }
    let conv = TimeConv {
        time_shift,
        time_mult,
        time_zero,
    };
    Some(TimeMap::new(
        anchors
            .iter()
            .map(|a| (a.insn, conv.tsc_to_perf_time(a.tsc) as f64)),
    ))
}

fn choose_axis(views: &[ThreadView]) -> Axis {
    let why = if views.is_empty() {
        "no threads"
    } else if views.iter().all(|v| v.clock.time.is_some()) {
        let t0 = views
            .iter()
            .filter_map(|v| v.clock.time.as_ref().map(|m| m.at(0)))
            .fold(f64::INFINITY, f64::min);
        return Axis::Nanoseconds { t0 };
    } else if views.iter().any(|v| v.clock.time.is_some()) {
        "some threads have no usable time"
    } else {
        "the trace has no usable time: software backend, or no TSC conversion"
    };
    Axis::Instructions {
        why: why.to_string(),
    }
}

/// Width of the flame graph (inferno's default), for the stacks it can show.
const FLAMEGRAPH_WIDTH: u64 = 1200;

struct OutPaths {
    timeline: PathBuf,
    pftrace: PathBuf,
    speedscope: PathBuf,
}

/// What [`write_views`] wrote.
struct Wrote {
    /// Events in timeline.json.
    events: u64,
    /// Calls left out of timeline.json and the speedscope profile (merged into callers).
    merged: u64,
}

/// An error writing `p`, as the command reports it.
fn write_err(p: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: cannot write: {e}", p.display())
}

/// Writes the bounded timelines ([`Json`], [`Speedscope`]) from one read of each thread
/// image's calls that the Perfetto writer kept for them (`kept`, in the order the images
/// were handed to it; where it kept none, the whole spill), its windows and gaps
/// (timeline.pftrace is written by [`PfPipe`]).
fn write_views(
    paths: &OutPaths,
    views: &[ThreadView],
    namers: &HashMap<(i32, u64), Namer>,
    names: &Names,
    axis: &Axis,
    (trace, part): (&Path, &str),
    (merge_below, kept): (u64, &mut dyn FnMut() -> Option<spill::Kept>),
) -> Result<Wrote, String> {
    let create = |p: &Path| {
        crate::outfile::OutFile::create(p)
            .map(|f| BufWriter::with_capacity(1 << 20, f))
            .map_err(|e| format!("{}: cannot create: {e}", p.display()))
    };
    let mut json = Json {
        w: create(&paths.timeline)?,
        n: 0,
        escaped: Vec::new(),
    };
    let mut ss = Speedscope {
        w: create(&paths.speedscope)?,
        unit: match axis {
            Axis::Instructions { .. } => "none",
            Axis::Nanoseconds { .. } => "nanoseconds",
        },
        frames: Vec::new(),
        order: Vec::new(),
        first: true,
    };
    let whos: Vec<Who> = views.iter().map(|v| v.who.clone()).collect();
    json.start(&whos).map_err(write_err(&paths.timeline))?;
    ss.start().map_err(write_err(&paths.speedscope))?;
    let empty = FrameTable::default();
    // The speedscope profile is written on a thread of its own from the same calls, each
    // view's handed over as this thread reaches it.
    let (tx, rx) = std::sync::mpsc::channel::<ToSpeedscope<'_>>();
    let whos = &whos;
    std::thread::scope(|scope| {
        let speedscope = scope.spawn(move || -> (Speedscope, std::io::Result<()>) {
            let mut each = || -> std::io::Result<()> {
                for (k, (calls, frames, clock, instructions)) in rx.iter().enumerate() {
                    let Some(who) = whos.get(k) else { break };
                    let t0 = ns(axis.place(clock, 0, 0).0);
                    let (_, end) = axis.place(clock, 0, instructions);
                    ss.profile_start(k, whos, who, t0, t0 + ns(end))?;
                    let mut nesting: Nesting<bool> = Nesting::new();
                    calls.replay(&mut |e| {
                        match e {
                            spill::Edge::Begin { at, len, frame, .. } => {
                                let bounded = len >= merge_below;
                                let (_, _, b) = nesting.begin(axis, clock, at, len, bounded);
                                if bounded {
                                    for &id in frames.chain(frame) {
                                        ss.edge(id, true, b)?;
                                    }
                                }
                            }
                            spill::Edge::End { frame, .. } => {
                                let (e, bounded) = nesting.end();
                                if bounded {
                                    for &id in frames.chain(frame).iter().rev() {
                                        ss.edge(id, false, e)?;
                                    }
                                }
                            }
                        }
                        Ok(())
                    })?;
                    ss.profile_end()?;
                }
                Ok(())
            };
            let r = each();
            (ss, r)
        });
        let json_done = (|| -> Result<(u64, u64), String> {
            let (mut shown, mut total) = (0u64, 0u64);
            for v in views {
                total += v.spans;
                let frames = namers.get(&v.image).map_or(&empty, |n| &n.frames);
                let tid = i64::from(v.who.tid);
                let thread = JsonText::thread(v.who.pid, tid);
                let mut cats: FxHashMap<(SpanStart, SpanEnd), JsonText> = FxHashMap::default();
                // The calls the Perfetto writer kept for these formats, or all of them.
                let calls = std::sync::Arc::new(match (kept(), &v.spill) {
                    (Some(k), _) => Calls::Kept(k),
                    (None, Some(s)) => Calls::Spill(s, v.cut),
                    (None, None) => Calls::None,
                });
                // (A speedscope thread that stopped says why when joined.)
                let _ = tx.send((calls.clone(), frames, &v.clock, v.instructions));
                calls
                    .replay(&mut |e| {
                        match e {
                            spill::Edge::Begin {
                                at,
                                len,
                                frame,
                                start,
                                end,
                            } => {
                                if len < merge_below {
                                    return Ok(());
                                }
                                let (jts, dur) = axis.place(&v.clock, at, at + len);
                                let category = match cats.entry((start, end)) {
                                    Entry::Occupied(e) => e.into_mut(),
                                    Entry::Vacant(e) => {
                                        e.insert(JsonText::string(&span_category(start, end))?)
                                    }
                                };
                                for &id in frames.chain(frame) {
                                    shown += 1;
                                    json.call((id, names.get(id)), category, jts, dur, &thread)?;
                                }
                            }
                            spill::Edge::End { .. } => {}
                        }
                        Ok(())
                    })
                    .map_err(write_err(&paths.timeline))?;
                json.windows_and_gaps(v, tid, axis)
                    .map_err(write_err(&paths.timeline))?;
            }
            Ok((shown, total))
        })();
        drop(tx);
        let (ss, ss_done) = speedscope.join().map_err(|_| {
            format!(
                "{}: the writing thread panicked",
                paths.speedscope.display()
            )
        })?;
        let (shown, total) = json_done?;
        ss_done
            .and_then(|()| ss.finish(names))
            .map_err(write_err(&paths.speedscope))?;
        let merged = total.saturating_sub(shown);
        let events = json.n;
        json.finish(views, axis, (trace, part), merged, merge_below)
            .map_err(write_err(&paths.timeline))?;
        Ok(Wrote { events, merged })
    })
}

/// What the speedscope thread gets of each view: its calls, frames, clock and length.
type ToSpeedscope<'a> = (std::sync::Arc<Calls<'a>>, &'a FrameTable, &'a Clock, u64);

/// The calls of one view as the bounded formats read them: the Perfetto writer's kept
/// calls, or the view's spill (cut to a range), or none.
enum Calls<'a> {
    Kept(spill::Kept),
    Spill(&'a spill::Spill, Option<(u64, u64)>),
    None,
}

impl Calls<'_> {
    fn replay(&self, f: &mut dyn FnMut(spill::Edge) -> std::io::Result<()>) -> std::io::Result<()> {
        match self {
            Calls::Kept(k) => spill::replay_kept(k, f),
            Calls::Spill(s, cut) => spill::replay(s, *cut, f),
            Calls::None => Ok(()),
        }
    }
}

/// What the JSON timeline's windows, gaps and frame take whatever calls it shows.
fn json_fixed(views: &[ThreadView]) -> u64 {
    views
        .iter()
        .map(|v| {
            v.windows.len() as u64 * JSON_BYTES_PER_WINDOW
                + v.markers.len() as u64 * JSON_BYTES_PER_GAP
        })
        .sum::<u64>()
        + JSON_BYTES_FIXED
}

/// The pids of `views`, in order.
fn pids(views: &[Who]) -> Vec<i32> {
    let mut pids: Vec<i32> = views.iter().map(|v| v.pid).collect();
    pids.dedup();
    pids
}

/// A process's name: the command lines of the images it ran, in order.
fn process_name(views: &[Who], pid: i32) -> String {
    let mut cmds: Vec<&str> = Vec::new();
    for v in views.iter().filter(|v| v.pid == pid) {
        if !v.cmdline.is_empty() && !cmds.contains(&v.cmdline.as_str()) {
            cmds.push(&v.cmdline);
        }
    }
    if cmds.is_empty() {
        format!("pid {pid}")
    } else {
        cmds.join(" → ")
    }
}

/// The names of a thread's track and of its windows' track (the commands it ran).
fn thread_track_names(views: &[Who], v: &Who) -> (String, String) {
    let mut comms: Vec<&str> = Vec::new();
    for o in views.iter().filter(|o| (o.pid, o.tid) == (v.pid, v.tid)) {
        if !comms.contains(&o.comm.as_str()) {
            comms.push(&o.comm);
        }
    }
    let comm = comms.join("→");
    let windows = if v.syscall_windows {
        format!("{comm} {} syscalls", v.tid)
    } else {
        format!("{comm} {} windows (user code up to each syscall)", v.tid)
    };
    (format!("{comm} {}", v.tid), windows)
}

/// Nanoseconds of a timeline position (instructions count as 1 ns each).
#[inline]
fn ns(t: Ts) -> u64 {
    match t {
        Ts::I(v) => v,
        Ts::F(us) => (us * 1000.0).round().max(0.0) as u64,
    }
}

/// Where a gap lies on the timeline (ns).
fn marker_ns(c: &Clock, axis: &Axis, m: &Marker) -> u64 {
    ns(axis.place(c, m.at, m.at).0)
}

/// A window's name on the timeline: its syscall, or that it was cut without one.
fn window_name(win: &PttWindowInfo) -> String {
    if win.flags & ptt::WF_NO_SYSCALL != 0 {
        "(cut, no syscall)".to_string()
    } else {
        win.syscall_name()
    }
}

/// The categories of a call span: `call`, then `start=KIND` when it did not begin with a
/// call and `end=KIND` when it did not end with a return (e.g. `call,start=implied`);
/// `inlined` for inlined code.
fn span_category(start: SpanStart, end: SpanEnd) -> std::borrow::Cow<'static, str> {
    if start == SpanStart::Inlined {
        return std::borrow::Cow::Borrowed("inlined");
    }
    let mut cat = std::borrow::Cow::Borrowed("call");
    if start != SpanStart::Call {
        cat = format!("{cat},start={}", start.name()).into();
    }
    if end != SpanEnd::Return {
        cat = format!("{cat},end={}", end.name()).into();
    }
    cat
}

fn write_flamegraph(path: &Path, lines: &[String], title: String) -> std::io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title;
    opts.count_name = "instructions".to_string();
    opts.deterministic = true;
    let mut w = BufWriter::new(crate::outfile::OutFile::create(path)?);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut w)?;
    crate::outfile::commit_buffered(w)
}
