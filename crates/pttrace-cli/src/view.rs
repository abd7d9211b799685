//! `pttrace view`: pictures of a `pttrace run` trace, from the call stacks that
//! `drpttracer::decode::callstack` reconstructs from the decoded instructions:
//! - `timeline.json`: Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing,
//!   speedscope): per thread, the function calls as nested complete (`X`) events (category
//!   `call`, with `,start=KIND` / `,end=KIND` added for a span that did not begin with a
//!   call or end with a return; `inlined` for the code of inlined functions, one span per
//!   function of the chain, inside the frame they were inlined into), its windows
//!   (syscalls) on a track beside it, gaps as instant events;
//! - `flamegraph.svg`: a flame graph (inferno) weighted by instructions;
//! - `stacks.folded`: the collapsed stacks it is drawn from (`a;b;c N`, N instructions).
//!
//! Time axis: the trace's timestamps converted to nanoseconds where the trace has usable
//! time (hardware PT with a TSC conversion, timestamps in every thread); otherwise (the
//! software backends) instruction counts: each thread's instructions numbered from 0, one
//! instruction = one microsecond of the file's `ts` unit. The file says which in
//! `otherData.time_axis`.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use drpttracer::decode::callstack::{CallStacks, Span, SpanEnd, SpanStart, ThreadStacks, TimeMap};
use drpttracer::decode::ptt_dir::{self, PttProcess, PttWindowInfo};
use drpttracer::decode::DecodeError;
use drpttracer::decode::TraceDecoder;
use drpttracer::format::ptt;
use drpttracer::metadata::TimeConv;
use serde::Serialize;

use crate::names::ImageNames;
use crate::CmdResult;

mod pftrace;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ViewFormat {
    /// timeline.json, flamegraph.svg and stacks.folded in the output directory.
    Files,
    /// Only the collapsed stacks (`a;b;c N`, N instructions), on stdout.
    Folded,
}

#[derive(clap::Args)]
pub struct Args {
    /// A `pttrace run --out` directory, or one of its per-thread `.ptt` files.
    #[arg(value_name = "DIR|FILE.ptt")]
    trace: PathBuf,
    /// Where to write timeline.json, flamegraph.svg and stacks.folded (default:
    /// <trace dir>/view).
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
    /// Largest timeline.json (e.g. 256M, 1G): beyond it the shortest calls are merged into
    /// their callers, and the file says how many and below which length (speedscope and
    /// chrome://tracing fail on larger JSON; timeline.pftrace always has every call).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = pttrace_format::snapshot::parse_size)]
    timeline_limit: u64,
    /// Write every call into timeline.json, whatever its size.
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

/// Keeps the part of a thread's spans, markers and windows in its instructions `[a, b)`,
/// the spans cut to it.
fn cut_to(stacks: &mut ThreadStacks, windows: &mut Vec<(PttWindowInfo, u64, u64)>, a: u64, b: u64) {
    stacks.spans.retain(|s| s.end > a && s.start < b);
    for s in &mut stacks.spans {
        let call = s.start_kind != SpanStart::Inlined;
        if s.start < a {
            s.start = a;
            if call {
                s.start_kind = SpanStart::Implied;
            }
        }
        if s.end > b {
            s.end = b;
            if call {
                s.end_kind = SpanEnd::TraceEnd;
            }
        }
    }
    stacks.markers.retain(|m| (a..=b).contains(&m.at));
    windows.retain(|(_, s, e)| (*e > a && *s < b) || (s == e && (a..b).contains(s)));
}

/// Bytes a call takes in timeline.json besides its name (at most, with the longest
/// category and 10-digit times; ~60 for most).
const JSON_BYTES_PER_CALL: u64 = 110;
/// Bytes of a window's event, of a gap's, and of the names and the file's end (at most).
const JSON_BYTES_PER_WINDOW: u64 = 300;
const JSON_BYTES_PER_GAP: u64 = 400;
const JSON_BYTES_FIXED: u64 = 64 << 10;

/// Calls shorter than this (instructions) are merged into their callers to keep the
/// timeline within `limit` bytes; 0 when everything fits.
fn merge_threshold(views: &[ThreadView], names: &Names, limit: u64) -> u64 {
    let cost =
        |v: &ThreadView, k: usize| JSON_BYTES_PER_CALL + names.get(v.span_names[k]).len() as u64;
    let total: u64 = views
        .iter()
        .map(|v| (0..v.stacks.spans.len()).map(|k| cost(v, k)).sum::<u64>())
        .sum();
    let fixed: u64 = views
        .iter()
        .map(|v| {
            v.windows.len() as u64 * JSON_BYTES_PER_WINDOW
                + v.stacks.markers.len() as u64 * JSON_BYTES_PER_GAP
        })
        .sum::<u64>()
        + JSON_BYTES_FIXED;
    let limit = limit.saturating_sub(fixed);
    if total <= limit {
        return 0;
    }
    // Longest calls first, until the limit: the threshold is the first length left out.
    let mut lens: Vec<(u64, u64)> = views
        .iter()
        .flat_map(|v| {
            v.stacks
                .spans
                .iter()
                .enumerate()
                .map(move |(k, s)| (s.end - s.start, cost(v, k)))
        })
        .collect();
    lens.sort_unstable_by_key(|l| std::cmp::Reverse(l.0));
    let mut used = 0u64;
    for (len, c) in lens {
        used += c;
        if used > limit {
            return len + 1;
        }
    }
    0
}

/// Window flags that mean the trace of a window is not continuous with the one before.
const LOSS_FLAGS: u32 =
    ptt::WF_PT_LOST | ptt::WF_PT_DROPPED | ptt::WF_CAPTURE_ERROR | ptt::WF_PT_ABSENT;

/// Tracks of a thread's windows get this added to the thread id (Linux thread ids stay
/// below 2^22).
const WINDOW_TRACK: i64 = 1_000_000_000;

/// Interned frame names.
#[derive(Default)]
struct Names {
    strings: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    fn intern(&mut self, s: String) -> u32 {
        if let Some(&i) = self.index.get(&s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.index.insert(s.clone(), i);
        self.strings.push(s);
        i
    }
    fn get(&self, i: u32) -> &str {
        self.strings.get(i as usize).map_or("?", String::as_str)
    }
}

/// Names frames of one process image ([`ImageNames`]) as ids of the view's string table.
struct Namer {
    image: ImageNames,
    ids: HashMap<u64, u32>,
}

/// A frame name as folded stacks can hold it (their separators replaced).
fn folded_safe(n: &str) -> String {
    n.chars()
        .map(|c| if c == ';' || c.is_control() { ':' } else { c })
        .collect()
}

impl Namer {
    /// The name ids of a thread's spans, where each span of inlined code (its address an
    /// inline key) becomes one span per function of its chain, outermost first, nested
    /// over the same instructions (the spans are rebuilt only where a chain is longer
    /// than one).
    fn span_names(&mut self, spans: &mut Vec<Span>, names: &mut Names) -> Vec<u32> {
        let mut chains: HashMap<u64, Vec<u32>> = HashMap::new();
        for s in spans.iter().filter(|s| s.start_kind == SpanStart::Inlined) {
            if let (std::collections::hash_map::Entry::Vacant(e), Some(chain)) =
                (chains.entry(s.addr), self.image.inline_chain(s.addr))
            {
                e.insert(
                    chain
                        .iter()
                        .map(|n| names.intern(format!("{} (inlined)", folded_safe(n))))
                        .collect(),
                );
            }
        }
        let chain_of = |s: &Span| {
            (s.start_kind == SpanStart::Inlined)
                .then(|| chains.get(&s.addr))
                .flatten()
        };
        if !spans
            .iter()
            .any(|s| chain_of(s).is_some_and(|c| c.len() > 1))
        {
            return spans
                .iter()
                .map(|s| match chain_of(s).and_then(|c| c.first()) {
                    Some(&id) => id,
                    None => self.id(s.addr, names),
                })
                .collect();
        }
        let mut ids = Vec::with_capacity(spans.len());
        let mut out = Vec::with_capacity(spans.len());
        for s in spans.iter() {
            match chain_of(s) {
                Some(chain) => {
                    for (i, &id) in chain.iter().enumerate() {
                        out.push(Span {
                            depth: s.depth + i as u32,
                            ..*s
                        });
                        ids.push(id);
                    }
                }
                None => {
                    out.push(*s);
                    ids.push(self.id(s.addr, names));
                }
            }
        }
        *spans = out;
        ids
    }

    fn new(image: ImageNames) -> Self {
        Namer {
            image,
            ids: HashMap::new(),
        }
    }

    fn id(&mut self, addr: u64, names: &mut Names) -> u32 {
        if let Some(&i) = self.ids.get(&addr) {
            return i;
        }
        // Folded stacks separate frames with ';' and end with the count: an inlined chain
        // is one key but as many frames.
        let name = match self.image.inline_chain(addr) {
            Some(chain) => chain
                .iter()
                .map(|n| format!("{} (inlined)", folded_safe(n)))
                .collect::<Vec<_>>()
                .join(";"),
            None => folded_safe(&self.image.name(addr)),
        };
        let i = names.intern(name);
        self.ids.insert(addr, i);
        i
    }
}

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

/// One thread's reconstruction, ready to draw.
struct ThreadView {
    pid: i32,
    tid: i32,
    comm: String,
    /// Its image's command line.
    cmdline: String,
    /// Where its instruction 0 lies on an instruction axis (a thread continuing in a new
    /// image after execve continues the axis of the old one).
    base: u64,
    stacks: ThreadStacks,
    /// Name of each span's frame (same order as `stacks.spans`).
    span_names: Vec<u32>,
    /// Each window and its instruction range.
    windows: Vec<(PttWindowInfo, u64, u64)>,
    syscall_windows: bool,
    time: Option<TimeMap>,
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
enum Axis {
    Instructions { why: String },
    Nanoseconds { t0: f64 },
}

impl Axis {
    /// (ts, dur) of instructions `[start, end)` of `t`.
    fn place(&self, t: &ThreadView, start: u64, end: u64) -> (Ts, Ts) {
        match (self, &t.time) {
            (Axis::Nanoseconds { t0 }, Some(m)) => {
                let (a, b) = (m.at(start), m.at(end));
                (Ts::F((a - t0) / 1000.0), Ts::F((b - a).max(0.0) / 1000.0))
            }
            _ => (Ts::I(t.base + start), Ts::I(end.saturating_sub(start))),
        }
    }
}

pub(crate) fn basename(cmdline: &str) -> String {
    let first = cmdline.split(' ').next().unwrap_or("");
    first.rsplit('/').next().unwrap_or(first).to_string()
}

pub fn run(args: Args) -> CmdResult {
    let mut trace = ptt_dir::open(&args.trace)?;
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
    let mut order: Vec<usize> = (0..trace.threads.len()).collect();
    order.sort_by_key(|&i| {
        let h = &trace.threads[i].header;
        (h.pid, h.tid, h.start_tsc, h.nonce)
    });
    let bar = crate::progress::pt_bytes(crate::progress::trace_bytes(&trace));
    let mut views: Vec<ThreadView> = Vec::new();
    let mut axis_end: HashMap<(i32, i32), u64> = HashMap::new();
    if let Some(t) = args.tid {
        order.retain(|&i| trace.threads[i].header.tid == t);
        if order.is_empty() {
            return Err(format!("--tid {t}: no thread of the trace has that id").into());
        }
    }
    for &i in &order {
        let th = &trace.threads[i];
        let h = &th.header;
        let proc_ = trace.process_of(th);
        // Where this image's instruction 0 lies on the thread's axis.
        let base = axis_end.get(&(h.pid, h.tid)).copied().unwrap_or(0);
        let namer = namers.entry((h.pid, h.nonce)).or_insert_with(|| {
            Namer::new(ImageNames::new(
                proc_,
                trace.sysroot.as_deref(),
                Some(&trace_dir),
                symbolizer.clone(),
            ))
        });
        let syscall_windows = ptt::window_name(h.window) == "syscall";
        let mut cs = CallStacks::new(&namer.image).with_inline_frames();
        match args.range {
            Some(ViewRange::Insns(a, b)) => {
                cs.count_only(a.saturating_sub(base)..b.saturating_sub(base));
            }
            Some(ViewRange::Windows(..)) => cs.count_only(u64::MAX..u64::MAX),
            None => {}
        }
        let mut windows = Vec::new();
        let stats = trace.decode_thread(th, &mut |w: &PttWindowInfo, dec| {
            if let Some(b) = &bar {
                b.inc((w.pt_len + w.sideband_len + 124) as u64);
            }
            if let Some(ViewRange::Windows(n, m)) = args.range {
                // Counted from the first window at or after N to the first after M.
                let (from, to) = (cs.counted().start, cs.counted().end);
                if w.index >= n && w.index <= m && from == u64::MAX {
                    cs.count_only(cs.instructions()..u64::MAX);
                } else if w.index > m && from != u64::MAX && to == u64::MAX {
                    cs.count_only(from..cs.instructions());
                }
            }
            if w.flags & LOSS_FLAGS != 0 {
                cs.restart(Some(format!(
                    "window {}: {}",
                    w.index,
                    w.flag_names().join(", ")
                )));
            } else if syscall_windows {
                // Each window is one syscall's own execution.
                cs.restart(None);
            }
            let start = cs.instructions();
            if let Some(dec) = dec {
                dec.for_each_slice(|recs| {
                    for r in recs {
                        cs.record(r);
                    }
                    ControlFlow::<()>::Continue(())
                });
            }
            windows.push((w.clone(), start, cs.instructions()));
            Ok::<(), DecodeError>(())
        })?;
        if !files_checked {
            damages.add_tail(th.path.display(), &stats.tail);
        }
        for w in &stats.warnings {
            eprintln!(
                "pttrace view: warning: {}: {}",
                crate::text::printable(&th.path.display().to_string()),
                crate::text::printable(&w.to_string())
            );
        }
        let counted = cs.counted();
        let mut stacks = cs.finish();
        if args.range.is_some() {
            let b = counted.end.min(stacks.instructions);
            let a = counted.start.min(b);
            cut_to(&mut stacks, &mut windows, a, b);
        }
        let span_names = namer.span_names(&mut stacks.spans, &mut names);
        *axis_end.entry((h.pid, h.tid)).or_insert(0) = base + stacks.instructions;
        let time = hardware_time(h.backend, proc_, &stacks);
        views.push(ThreadView {
            pid: h.pid,
            tid: h.tid,
            comm: proc_
                .map(|p| basename(&p.cmdline))
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| format!("pid {}", h.pid)),
            cmdline: proc_.map(|p| p.cmdline.clone()).unwrap_or_default(),
            base,
            stacks,
            span_names,
            windows,
            syscall_windows,
            time,
        });
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }

    // Collapsed stacks of every thread, under the image's command name (as name ids
    // first: the lines of a long trace are large).
    let mut folded: HashMap<Vec<u32>, u64> = HashMap::new();
    for (v, &i) in views.iter().zip(&order) {
        let th = &trace.threads[i];
        let Some(namer) = namers.get_mut(&(th.header.pid, th.header.nonce)) else {
            continue;
        };
        let comm = names.intern(v.comm.replace([';', ' '], "_"));
        for (path, n) in &v.stacks.stacks {
            let mut key = Vec::with_capacity(path.len() + 1);
            key.push(comm);
            key.extend(path.iter().map(|&a| namer.id(a, &mut names)));
            *folded.entry(key).or_default() += n;
        }
    }
    let mut folded_lines: Vec<String> = folded
        .iter()
        .map(|(key, n)| {
            let len: usize = key.iter().map(|&id| names.get(id).len() + 1).sum();
            let mut line = String::with_capacity(len + 20);
            for (k, &id) in key.iter().enumerate() {
                if k > 0 {
                    line.push(';');
                }
                line.push_str(names.get(id));
            }
            line.push(' ');
            line.push_str(&n.to_string());
            line
        })
        .collect();
    drop(folded);
    folded_lines.sort_unstable();

    note_unnamed_modules("view", namers.values().map(|n| &n.image));
    if args.format == ViewFormat::Folded {
        let stdout = std::io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        for l in &folded_lines {
            writeln!(out, "{l}")?;
        }
        out.flush()?;
        return damages.finish("view", args.policy);
    }

    let out_dir = match &args.out {
        Some(d) => d.clone(),
        None => {
            let dir = if args.trace.is_dir() {
                args.trace.clone()
            } else {
                args.trace
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf()
            };
            dir.join("view")
        }
    };
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("{}: cannot create the directory: {e}", out_dir.display()))?;

    let axis = choose_axis(&views);
    let timeline = out_dir.join("timeline.json");
    let merge_below = if args.full || args.range.is_some() {
        0
    } else {
        merge_threshold(&views, &names, args.timeline_limit)
    };
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
    let (events, merged) = write_timeline(
        &timeline,
        &views,
        &names,
        &axis,
        (&args.trace, &part),
        merge_below,
    )
    .map_err(|e| format!("{}: cannot write: {e}", timeline.display()))?;
    let speedscope = out_dir.join("profile.speedscope.json");
    write_speedscope(&speedscope, &views, &names, &axis, merge_below)
        .map_err(|e| format!("{}: cannot write: {e}", speedscope.display()))?;
    let pf = out_dir.join("timeline.pftrace");
    let pf_bytes = write_pftrace(&pf, &views, &names, &axis)
        .map_err(|e| format!("{}: cannot write: {e}", pf.display()))?;
    let stacks_path = out_dir.join("stacks.folded");
    write_lines(&stacks_path, &folded_lines)
        .map_err(|e| format!("{}: cannot write: {e}", stacks_path.display()))?;
    // Gaps and losses: where the stacks start over (instant events on the timeline).
    let gaps: usize = views.iter().map(|v| v.stacks.markers.len()).sum();
    let svg = out_dir.join("flamegraph.svg");
    let svg_written = if folded_lines.is_empty() {
        false
    } else {
        let mut title = match trace.processes.first() {
            Some(p) if !p.cmdline.is_empty() => format!("pttrace view: {}", p.cmdline),
            _ => "pttrace view".to_string(),
        };
        if gaps > 0 {
            title.push_str(&format!(
                " ({gaps} gaps or losses in the trace: the stacks start over at each; they \
                 are instant events on the timeline)"
            ));
        }
        write_flamegraph(&svg, &folded_lines, title)
            .map_err(|e| format!("{}: cannot write: {e}", svg.display()))?;
        true
    };

    let insns: u64 = views.iter().map(|v| v.stacks.instructions).sum();
    let spans: usize = views.iter().map(|v| v.stacks.spans.len()).sum();
    let axis_text = match &axis {
        Axis::Instructions { why } => format!("instructions ({why})"),
        Axis::Nanoseconds { .. } => "nanoseconds (TSC)".to_string(),
    };
    // Threads as the kernel counts them (as `report` does): a thread that execs goes on,
    // in a new image, with the same id.
    let threads: std::collections::BTreeSet<(i32, i32)> =
        views.iter().map(|v| (v.pid, v.tid)).collect();
    let images = if views.len() > threads.len() {
        format!(" ({} thread images: execve)", views.len())
    } else {
        String::new()
    };
    println!(
        "{} threads{images}, {insns} instructions, {spans} function spans, {gaps} gaps; time axis: {axis_text}",
        threads.len()
    );
    println!(
        "timeline:    {} ({events} events; open in ui.perfetto.dev, chrome://tracing or speedscope)",
        timeline.display()
    );
    if merged > 0 {
        println!(
            "             ({merged} calls shorter than {merge_below} instructions merged into \
             their callers to stay within --timeline-limit; --full writes them all)"
        );
    }
    println!(
        "             {} ({pf_bytes} bytes, every call; Perfetto's own format: open in \
         ui.perfetto.dev)",
        pf.display()
    );
    println!(
        "             {} (speedscope's own format, the axis in {})",
        speedscope.display(),
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
    damages.finish("view", args.policy)
}

/// The thread's timestamps as nanoseconds, when the trace has usable time: hardware PT,
/// a known TSC conversion, and at least two timestamps.
fn hardware_time(backend: u8, p: Option<&PttProcess>, s: &ThreadStacks) -> Option<TimeMap> {
    if ptt::backend_name(backend) != "hardware" {
        return None;
    }
    let md = p?.metadata?;
    let (time_shift, time_mult, time_zero) = (md.time_shift, md.time_mult, md.time_zero);
    if time_mult == 0 || s.anchors.len() < 2 {
        return None;
    }
    let conv = TimeConv {
        time_shift,
        time_mult,
        time_zero,
    };
    Some(TimeMap::new(
        s.anchors
            .iter()
            .map(|a| (a.insn, conv.tsc_to_perf_time(a.tsc) as f64)),
    ))
}

fn choose_axis(views: &[ThreadView]) -> Axis {
    let why = if views.is_empty() {
        "no threads"
    } else if views.iter().all(|v| v.time.is_some()) {
        let t0 = views
            .iter()
            .filter_map(|v| v.time.as_ref().map(|m| m.at(0)))
            .fold(f64::INFINITY, f64::min);
        return Axis::Nanoseconds { t0 };
    } else if views.iter().any(|v| v.time.is_some()) {
        "some threads have no usable time"
    } else {
        "the trace has no usable time: software backend, or no TSC conversion"
    };
    Axis::Instructions {
        why: why.to_string(),
    }
}

/// Writes the Chrome Trace Event JSON file; returns the number of events.
fn write_timeline(
    path: &Path,
    views: &[ThreadView],
    names: &Names,
    axis: &Axis,
    (trace, part): (&Path, &str),
    merge_below: u64,
) -> std::io::Result<(u64, u64)> {
    let mut merged = 0u64;
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut n = 0u64;
    w.write_all(b"{\"traceEvents\":[\n")?;
    let mut emit = |w: &mut BufWriter<std::fs::File>, e: &Event<'_>| -> std::io::Result<()> {
        if n > 0 {
            w.write_all(b",\n")?;
        }
        n += 1;
        serde_json::to_writer(&mut *w, e).map_err(std::io::Error::other)
    };
    // Process names: the command lines of the images a pid ran, in order (views are
    // sorted by pid, tid, start); thread names: the commands a thread ran.
    for pid in pids(views) {
        let name = process_name(views, pid);
        let mut e = Event::new("process_name", "M", pid, None);
        e.args = Some(serde_json::json!({ "name": name }));
        emit(&mut w, &e)?;
    }
    let mut sort_index = 0u64;
    let mut named: Vec<(i32, i32)> = Vec::new();
    for v in views {
        let tid = i64::from(v.tid);
        if !named.contains(&(v.pid, v.tid)) {
            named.push((v.pid, v.tid));
            let (thread, windows) = thread_track_names(views, v);
            let tracks = [(tid, thread), (WINDOW_TRACK + tid, windows)];
            for (t, name) in tracks {
                let mut e = Event::new("thread_name", "M", v.pid, Some(t));
                e.args = Some(serde_json::json!({ "name": name }));
                emit(&mut w, &e)?;
                let mut e = Event::new("thread_sort_index", "M", v.pid, Some(t));
                e.args = Some(serde_json::json!({ "sort_index": sort_index }));
                sort_index += 1;
                emit(&mut w, &e)?;
            }
        }
        for (s, &name) in v.stacks.spans.iter().zip(&v.span_names) {
            if s.end - s.start < merge_below {
                merged += 1;
                continue;
            }
            let (ts, dur) = axis.place(v, s.start, s.end);
            let mut e = Event::new(names.get(name), "X", v.pid, Some(tid));
            // How an unusual span began or ended goes into its categories, not its args:
            // speedscope names a frame by its name and args together, so args would split
            // one function into several in its Left Heavy and Sandwich views.
            let cat = span_category(s.start_kind, s.end_kind);
            e.cat = Some(&cat);
            e.ts = Some(ts);
            e.dur = Some(dur);
            emit(&mut w, &e)?;
        }
        for (win, start, end) in &v.windows {
            let name = window_name(win);
            let (ts, dur) = axis.place(v, *start, *end);
            let mut e = Event::new(&name, "X", v.pid, Some(WINDOW_TRACK + tid));
            e.cat = Some("syscall");
            e.ts = Some(ts);
            e.dur = Some(dur);
            e.args = Some(serde_json::json!({
                "window": win.index,
                "nr": win.nr,
                "ret": win.ret,
                "flags": win.flag_names().join(","),
                "instructions": end - start,
            }));
            emit(&mut w, &e)?;
        }
        for m in &v.stacks.markers {
            let (ts, _) = axis.place(v, m.at, m.at);
            let mut e = Event::new("gap", "i", v.pid, Some(tid));
            e.cat = Some("gap");
            e.ts = Some(ts);
            e.s = Some("t");
            e.args = Some(serde_json::json!({ "what": m.what }));
            emit(&mut w, &e)?;
        }
    }
    let insns: u64 = views.iter().map(|v| v.stacks.instructions).sum();
    let (unit, axis_name, note) = match axis {
        Axis::Instructions { why } => (
            None,
            "instructions",
            format!(
                "{why}: ts and dur count instructions (1 unit = 1 instruction), each thread \
                 from 0 (a thread continues its count across execve)"
            ),
        ),
        Axis::Nanoseconds { .. } => (
            Some("ns"),
            "ns",
            "TSC converted to nanoseconds with the trace's time conversion, from the first \
             timestamp, interpolated by instruction between timestamps"
                .to_string(),
        ),
    };
    let mut tail = serde_json::json!({
        "otherData": {
            "time_axis": axis_name,
            "time_axis_note": note,
            "trace": trace.display().to_string(),
            "part": part,
            "instructions": insns,
            "tool": "pttrace view",
            "merged_calls": merged,
            "merged_below_instructions": merge_below,
            "merged_note": if merged == 0 {
                "every call is in this file".to_string()
            } else {
                format!(
                    "{merged} calls shorter than {merge_below} instructions are merged into \
                     their callers (their time counts in the caller's span) to keep this file \
                     within --timeline-limit; timeline.pftrace and `pttrace view --full` have \
                     every call"
                )
            },
        }
    });
    if let (Some(u), Some(o)) = (unit, tail.as_object_mut()) {
        o.insert("displayTimeUnit".into(), u.into());
    }
    w.write_all(b"\n]")?;
    if let Some(o) = tail.as_object() {
        for (k, v) in o {
            w.write_all(b",")?;
            serde_json::to_writer(&mut w, k).map_err(std::io::Error::other)?;
            w.write_all(b":")?;
            serde_json::to_writer(&mut w, v).map_err(std::io::Error::other)?;
        }
    }
    w.write_all(b"}\n")?;
    w.flush()?;
    Ok((n, merged))
}

/// The pids of `views`, in order.
fn pids(views: &[ThreadView]) -> Vec<i32> {
    let mut pids: Vec<i32> = views.iter().map(|v| v.pid).collect();
    pids.dedup();
    pids
}

/// A process's name: the command lines of the images it ran, in order.
fn process_name(views: &[ThreadView], pid: i32) -> String {
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
fn thread_track_names(views: &[ThreadView], v: &ThreadView) -> (String, String) {
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
fn ns(t: Ts) -> u64 {
    match t {
        Ts::I(v) => v,
        Ts::F(us) => (us * 1000.0).round().max(0.0) as u64,
    }
}

/// Writes `timeline.pftrace` (see [`pftrace`]): the same calls, windows and gaps as the
/// JSON timeline. Returns the bytes written.
fn write_pftrace(
    path: &Path,
    views: &[ThreadView],
    names: &Names,
    axis: &Axis,
) -> std::io::Result<u64> {
    use pftrace::{Event as E, Track};
    let file = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut w = pftrace::Writer::new(file);
    let unit = match axis {
        Axis::Instructions { .. } => " [time axis: instructions, 1 ns = 1 instruction]",
        Axis::Nanoseconds { .. } => "",
    };
    let mut uuids: HashMap<(i32, i32), (u64, u64)> = HashMap::new();
    let mut next = 1u64;
    for pid in pids(views) {
        let process = next;
        next += 1;
        let name = format!("{}{unit}", process_name(views, pid));
        w.track(process, Track::Process { pid, name: &name })?;
        for v in views.iter().filter(|v| v.pid == pid) {
            if uuids.contains_key(&(v.pid, v.tid)) {
                continue;
            }
            let (thread, windows) = thread_track_names(views, v);
            let (t, wt) = (next, next + 1);
            next += 2;
            w.track(
                t,
                Track::Thread {
                    pid,
                    tid: v.tid,
                    name: &thread,
                },
            )?;
            w.track(
                wt,
                Track::Named {
                    parent: process,
                    name: &windows,
                },
            )?;
            uuids.insert((v.pid, v.tid), (t, wt));
        }
    }
    for v in views {
        let (track, window_track) = uuids[&(v.pid, v.tid)];
        let t0 = ns(axis.place(v, 0, 0).0);
        // Calls merged with the gaps, in time order (a gap before a call edge at its time).
        let mut seq = w.sequence(track, t0)?;
        let mut markers = v.stacks.markers.iter().peekable();
        let mut cats: HashMap<(SpanStart, SpanEnd), String> = HashMap::new();
        for_each_call_edge(v, axis, 0, |edge| {
            while let Some(m) = markers.next_if(|m| marker_ns(v, axis, m) <= edge.ts) {
                gap(&mut w, &mut seq, v, axis, m)?;
            }
            if !edge.begin {
                return w.event(&mut seq, E::End { ts: edge.ts });
            }
            let s = &v.stacks.spans[edge.span];
            let category = cats
                .entry((s.start_kind, s.end_kind))
                .or_insert_with(|| span_category(s.start_kind, s.end_kind).into_owned());
            let name = names.get(v.span_names[edge.span]);
            w.event(
                &mut seq,
                E::Begin {
                    ts: edge.ts,
                    name,
                    category,
                },
            )
        })?;
        for m in markers {
            gap(&mut w, &mut seq, v, axis, m)?;
        }
        // Windows, one after the other on their own track and sequence.
        let mut wseq = w.sequence(window_track, t0)?;
        for (win, start, end) in &v.windows {
            let name = window_name(win);
            let (ts, dur) = axis.place(v, *start, *end);
            let (ts, category) = (ns(ts), "syscall");
            w.event(
                &mut wseq,
                E::Begin {
                    ts,
                    name: &name,
                    category,
                },
            )?;
            w.event(&mut wseq, E::End { ts: ts + ns(dur) })?;
        }
    }
    w.finish()
}

/// A call's begin or end (`span`: its index in the thread's spans) at `ts` (ns).
struct CallEdge {
    ts: u64,
    span: usize,
    begin: bool,
}

/// The begins and ends of `v`'s calls at least `merge_below` instructions long, in time
/// order and properly nested (a call's end clamped to its caller's, should rounding of
/// times disagree): what the begin/end formats (Perfetto's slices, speedscope's events)
/// write.
fn for_each_call_edge(
    v: &ThreadView,
    axis: &Axis,
    merge_below: u64,
    mut f: impl FnMut(CallEdge) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut open: Vec<(u64, usize)> = Vec::new();
    for (k, s) in v.stacks.spans.iter().enumerate() {
        if s.end - s.start < merge_below {
            continue;
        }
        let (ts, dur) = axis.place(v, s.start, s.end);
        let (begin, end) = (ns(ts), ns(ts) + ns(dur));
        while let Some(&(top, j)) = open.last() {
            if top > begin {
                break;
            }
            f(CallEdge {
                ts: top,
                span: j,
                begin: false,
            })?;
            open.pop();
        }
        f(CallEdge {
            ts: begin,
            span: k,
            begin: true,
        })?;
        open.push((open.last().map_or(end, |&(outer, _)| end.min(outer)), k));
    }
    while let Some((top, j)) = open.pop() {
        f(CallEdge {
            ts: top,
            span: j,
            begin: false,
        })?;
    }
    Ok(())
}

/// Where a gap lies on the timeline (ns).
fn marker_ns(v: &ThreadView, axis: &Axis, m: &drpttracer::decode::callstack::Marker) -> u64 {
    ns(axis.place(v, m.at, m.at).0)
}

/// A window's name on the timeline: its syscall, or that it was cut without one.
fn window_name(win: &PttWindowInfo) -> String {
    if win.flags & ptt::WF_NO_SYSCALL != 0 {
        "(cut, no syscall)".to_string()
    } else {
        win.syscall_name()
    }
}

/// Writes `profile.speedscope.json`: speedscope's own format (a shared frame table, one
/// evented profile per thread image: open/close events), with the axis unit speedscope
/// shows ("none" for instructions, where the Chrome JSON gets "ms"), the calls of the
/// JSON timeline (those at least `merge_below` long). Returns the calls written.
fn write_speedscope(
    path: &Path,
    views: &[ThreadView],
    names: &Names,
    axis: &Axis,
    merge_below: u64,
) -> std::io::Result<u64> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let unit = match axis {
        Axis::Instructions { .. } => "none",
        Axis::Nanoseconds { .. } => "nanoseconds",
    };
    let mut frames: HashMap<u32, usize> = HashMap::new();
    let mut order: Vec<u32> = Vec::new();
    let mut calls = 0u64;
    w.write_all(b"{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",")?;
    w.write_all(b"\"exporter\":\"pttrace view\",\"profiles\":[")?;
    for (k, v) in views.iter().enumerate() {
        if k > 0 {
            w.write_all(b",")?;
        }
        let (name, _) = thread_track_names(views, v);
        let t0 = ns(axis.place(v, 0, 0).0);
        let end = ns(axis
            .place(v, v.stacks.instructions, v.stacks.instructions)
            .0);
        write!(w, "{{\"type\":\"evented\",\"name\":")?;
        serde_json::to_writer(&mut w, &name).map_err(std::io::Error::other)?;
        write!(
            w,
            ",\"unit\":\"{unit}\",\"startValue\":{t0},\"endValue\":{},\"events\":[",
            end.max(t0)
        )?;
        let mut sep = "";
        for_each_call_edge(v, axis, merge_below, |edge| {
            let name = v.span_names[edge.span];
            let next = order.len();
            let frame = *frames.entry(name).or_insert_with(|| {
                order.push(name);
                next
            });
            let ty = if edge.begin { "O" } else { "C" };
            calls += u64::from(edge.begin);
            let at = edge.ts;
            write!(
                w,
                "{sep}{{\"type\":\"{ty}\",\"frame\":{frame},\"at\":{at}}}"
            )?;
            sep = ",";
            Ok(())
        })?;
        w.write_all(b"]}")?;
    }
    w.write_all(b"],\"shared\":{\"frames\":[")?;
    for (k, &name) in order.iter().enumerate() {
        if k > 0 {
            w.write_all(b",")?;
        }
        w.write_all(b"{\"name\":")?;
        serde_json::to_writer(&mut w, names.get(name)).map_err(std::io::Error::other)?;
        w.write_all(b"}")?;
    }
    w.write_all(b"]}}\n")?;
    w.flush()?;
    Ok(calls)
}

/// A gap or loss as an instant event on the thread's track.
fn gap<W: Write>(
    w: &mut pftrace::Writer<W>,
    seq: &mut pftrace::Sequence,
    v: &ThreadView,
    axis: &Axis,
    m: &drpttracer::decode::callstack::Marker,
) -> std::io::Result<()> {
    let ts = marker_ns(v, axis, m);
    let name = format!("gap: {}", m.what);
    w.event(
        seq,
        pftrace::Event::Instant {
            ts,
            name: &name,
            category: "gap",
        },
    )
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

fn write_lines(path: &Path, lines: &[String]) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    for l in lines {
        w.write_all(l.as_bytes())?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

fn write_flamegraph(path: &Path, lines: &[String], title: String) -> std::io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title;
    opts.count_name = "instructions".to_string();
    opts.deterministic = true;
    let w = BufWriter::new(std::fs::File::create(path)?);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w)
}
