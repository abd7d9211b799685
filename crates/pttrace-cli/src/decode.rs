//! `pttrace decode`: PT (+ sideband + images) -> instruction records (disasm/jsonl/summary).

use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use drpttracer::decode::parallel::decode_parallel_stats;
use drpttracer::decode::ptt_input::PttProcess;
use drpttracer::decode::sideband::parse_records;
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{
    check, input, AddressSpace, CpuParams, DecoderCaches, DecoderKind, ImageEvent, ImageResolver,
    ImageSpec, PtDecoder, Record, Symbols, TraceParams, WindowOptions,
};
use drpttracer::metadata::TimeConv;
use iced_x86::{Decoder, Formatter, GasFormatter, IntelFormatter};

use crate::damage::Damages;
use crate::CmdResult;

/// Decoding a `pttrace run` output directory (or one of its `.ptt` files).
mod drmemtrace;
mod lines;
mod ptt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutFormat {
    /// One line per instruction with address, symbol, bytes and disassembly.
    Disasm,
    /// One JSON object per record.
    Jsonl,
    /// Instruction counts per window and the errors met.
    Summary,
    /// DynamoRIO's drmemtrace offline trace (one `.zip` per thread in `--out DIR`), for
    /// drcachesim and DynamoRIO's analyzers; a trace directory or `.ptt` file as input.
    Drmemtrace,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DecoderArg {
    Fast,
    Libipt,
    Check,
}

impl DecoderArg {
    /// The decoder that gives the records (the fast one for `check`, compared with libipt).
    fn kind(self) -> DecoderKind {
        match self {
            DecoderArg::Libipt => DecoderKind::Libipt,
            DecoderArg::Fast | DecoderArg::Check => DecoderKind::Fast,
        }
    }
}

/// What `--decoder check` compared so far.
#[derive(Default)]
struct CheckTally {
    windows: u64,
    /// Windows that hold no PT (nothing to compare).
    without_pt: u64,
    records: u64,
    /// Windows per decoder that gave the fast side's records.
    by: std::collections::BTreeMap<String, u64>,
}

/// What follows a count of decoded windows when `n` windows hold no PT (a fork child's
/// first window, which stands for the fork's return): they are counted with the rest but
/// have nothing to decode.
fn without_pt(n: u64) -> String {
    match n {
        0 => String::new(),
        1 => "; 1 more window holds no PT (nothing to decode)".to_string(),
        n => format!("; {n} more windows hold no PT (nothing to decode)"),
    }
}

fn decoded_by_text((by, why): (&str, Option<&str>)) -> String {
    match why {
        Some(why) => format!("{by} ({why})"),
        None => by.to_string(),
    }
}

impl CheckTally {
    /// Counts a window's outcome; a difference is printed and ends the check.
    fn add(
        &mut self,
        out: &mut impl Write,
        source: &str,
        outcome: Result<check::Agreement, Box<check::Difference>>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        self.windows += 1;
        match outcome {
            Ok(a) => {
                self.records += a.records;
                *self.by.entry(decoded_by_text(a.decoded_by)).or_insert(0) += 1;
                Ok(())
            }
            Err(d) => {
                let json = |r: &Option<Record>| match r {
                    Some(r) => r.to_json().to_string(),
                    None => "(end of the window)".to_string(),
                };
                writeln!(
                    out,
                    "check: {}: record {} differs (fast side at PT offset {:#x}, decoded by {}):",
                    crate::text::printable(source),
                    d.record,
                    d.pt_offset,
                    decoded_by_text(d.decoded_by)
                )?;
                writeln!(out, "  fast:   {}", json(&d.fast))?;
                writeln!(out, "  libipt: {}", json(&d.libipt))?;
                out.flush()?;
                Err("the fast decoder and libipt differ (first difference above)".into())
            }
        }
    }

    fn finish(&self, out: &mut impl Write) -> std::io::Result<()> {
        let by: Vec<String> = self.by.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        writeln!(
            out,
            "check: the fast decoder and libipt agree: {}, {} records (decoded by {}){}",
            crate::text::count(self.windows, "window"),
            self.records,
            if by.is_empty() {
                "none".to_string()
            } else {
                by.join(", ")
            },
            without_pt(self.without_pt)
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Syntax {
    Intel,
    Att,
}

/// Boxed so that `Command::Decode` stays small (the options are many).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    opts: Box<DecodeArgs>,
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    /// A `pttrace run --out` directory, or one of its per-thread `.ptt` files.
    #[arg(value_name = "DIR|FILE.ptt", group = "input")]
    trace_dir: Option<PathBuf>,
    /// Raw PT packets.
    #[arg(long, value_name = "FILE", group = "input")]
    pt: Option<PathBuf>,
    /// perf.data-style stream with PT in PERF_RECORD_AUXTRACE records.
    #[arg(long, value_name = "FILE", group = "input")]
    auxtrace: Option<PathBuf>,
    /// DynamoRIO's per-thread kernel syscall file (<tid>.raw.pt): one window per syscall.
    #[arg(long = "raw-pt", value_name = "FILE", group = "input")]
    raw_pt: Option<PathBuf>,
    /// A thread file written by `pttrace run` (<pid>-<nonce>-<tid>.ptt): one window per
    /// syscall, with its sideband; CPU, time, maps and vDSO come from the process .info.
    #[arg(long, value_name = "FILE", group = "input")]
    ptt: Option<PathBuf>,
    /// The process info file for --ptt (default: <pid>-<nonce>.info beside it).
    #[arg(long, value_name = "FILE", requires = "ptt")]
    info: Option<PathBuf>,
    /// Raw perf records (MMAP/MMAP2/COMM...) giving the image over time. Repeatable
    /// (primary and secondary streams are merged in time order).
    #[arg(long, value_name = "FILE", requires = "sample_type")]
    sideband: Vec<PathBuf>,
    /// perf sample_type of the sideband records (decimal or 0x-hex), e.g. 0x10086.
    #[arg(long, value_name = "N", value_parser = parse_u64)]
    sample_type: Option<u64>,
    /// ELF file loaded at BASE (default: its link address). Repeatable.
    #[arg(long, value_name = "FILE[@BASE]")]
    image: Vec<String>,
    /// Saved vDSO bytes and their load address.
    #[arg(long, value_name = "FILE@ADDR")]
    vdso: Option<String>,
    /// Raw code bytes (not ELF) at address BASE: the whole file, or its byte range
    /// FROM..TO (TO exclusive; as ptxed's --raw FILE[:FROM[-TO]]). Repeatable.
    #[arg(long, value_name = "FILE[:FROM[-TO]]@BASE")]
    raw: Vec<String>,
    /// ELF copy of kernel text (kcore).
    #[arg(long, value_name = "FILE")]
    kcore: Option<PathBuf>,
    /// Kernel symbols for kernel addresses.
    #[arg(long, value_name = "FILE")]
    kallsyms: Option<PathBuf>,
    /// Prefix for the file paths named by sideband MMAP records.
    #[arg(long, value_name = "DIR")]
    sysroot: Option<PathBuf>,
    /// With a trace directory: each instruction's source file:line where DWARF gives it
    /// (jsonl: a "src" field; disasm: after the instruction), like perf script's srcline.
    #[arg(long)]
    srcline: bool,
    /// Also look for separate debug files here (repeatable): as a build-id tree
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink name.
    #[arg(long, value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
    /// CPU that recorded the trace, FAMILY/MODEL[/STEPPING] (errata are derived from it).
    #[arg(long, value_name = "F/M[/S]")]
    cpu: Option<String>,
    /// An address filter the trace was captured with, [N:]CFG,A,B (N 0..3, CFG off, filter
    /// or stop), as ptxed's --filter:addrN_*; libipt needs it to read a TIP.PGD without
    /// IP on CPUs with erratum SKL014. Repeatable.
    #[arg(long, value_name = "[N:]CFG,A,B")]
    filter: Vec<String>,
    /// MTC frequency (the PT event's mtc_period).
    #[arg(long = "mtc-freq", value_name = "N")]
    mtc_freq: Option<u8>,
    /// Nominal frequency ratio (max_nonturbo_ratio).
    #[arg(long = "nom-freq", value_name = "N")]
    nom_freq: Option<u8>,
    /// cpuid leaf 0x15 as EAX,EBX.
    #[arg(long = "cpuid-15", value_name = "EAX,EBX")]
    cpuid_15: Option<String>,
    /// TSC -> perf time conversion SHIFT,MULT,ZERO (to order sideband against the trace).
    #[arg(long = "time-conv", value_name = "SHIFT,MULT,ZERO")]
    time_conv: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "disasm")]
    format: OutFormat,
    /// Where `--format drmemtrace` writes its files (a new or empty directory).
    #[arg(short, long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Disassembly syntax.
    #[arg(long, value_enum, default_value = "intel")]
    syntax: Syntax,
    /// Decode PSB segments on this many threads (output identical to 1 thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// Decoder: `fast` (our own flow reconstruction, libipt where it does not apply; the
    /// same records), `libipt` (libipt's block decoder only), or `check` (both, compared
    /// record for record: prints the first record where they differ and exits 1, or what
    /// was compared).
    #[arg(long, value_enum, default_value = "fast")]
    decoder: DecoderArg,
    /// After a decode error (no code at an IP, trace that does not match the code), go on
    /// at the next packet that gives an IP (TIP, TIP.PGE/PGD, FUP-bound events, OVF) as
    /// ptxed's `--resync-on-error` (libipt 2.2's `pt_blk_resync`) does, instead of at the
    /// next PSB. The fast decoder only (libipt 2.1.2 cannot): the error's gap record
    /// stays; where the fast decoder must hand a window to libipt, that window resyncs at
    /// PSBs and a warning says why.
    #[arg(long)]
    resync_on_error: bool,
    /// Report changes of the interrupt flag, as ptxed's `--event:iflags` (libipt's
    /// iflags events: `iflags` records, `[interrupts enabled]`/`[interrupts disabled]`
    /// in disasm). A MODE.Exec that changes only IF is then an event of its own, bound
    /// to the FUP or TIP after it, and a PSB+ that states another IF than the trace
    /// before it is a decode error (a bad status update), as libipt takes them. (IF is
    /// in the trace with Event Trace, IA32_RTIT_CTL.EventEn.)
    #[arg(long)]
    iflags_events: bool,
    /// Damaged input (a torn or corrupt record, a container record that does not fit):
    /// decode what could be read and exit 0 (the damage is still listed on stderr).
    #[command(flatten)]
    policy: crate::damage::Policy,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a number (decimal or 0x-hex)"))
}

/// `FILE@ADDR` -> (file, Some(addr)); `FILE` -> (file, None).
fn split_at_addr(s: &str, what: &str) -> Result<(PathBuf, Option<u64>), String> {
    if let Some((f, a)) = s.rsplit_once('@') {
        if let Ok(addr) = parse_u64(a) {
            return Ok((PathBuf::from(f), Some(addr)));
        }
        if !Path::new(s).exists() {
            return Err(format!("{what} '{s}': '{a}' is not an address"));
        }
    }
    Ok((PathBuf::from(s), None))
}

/// `FILE[:FROM[-TO]]@BASE` -> (name, the bytes, base address).
fn raw_code(spec: &str) -> Result<(String, Vec<u8>, u64), String> {
    let bad = |what: String| format!("--raw '{spec}': {what}");
    let (file_part, base) = spec
        .rsplit_once('@')
        .ok_or_else(|| bad("expected FILE[:FROM[-TO]]@BASE".into()))?;
    let base = parse_u64(base).map_err(bad)?;
    // A range only when what follows the last ':' is one (paths may contain ':').
    let (file, range) = match file_part.rsplit_once(':') {
        Some((f, r)) if r.split('-').all(|n| parse_u64(n).is_ok()) && !r.is_empty() => (f, Some(r)),
        _ => (file_part, None),
    };
    let data = read(Path::new(file))?;
    let (from, to) = match range {
        None => (0, data.len() as u64),
        Some(r) => match r.split_once('-') {
            Some((a, b)) => (parse_u64(a).map_err(&bad)?, parse_u64(b).map_err(&bad)?),
            None => (parse_u64(r).map_err(&bad)?, data.len() as u64),
        },
    };
    if from > to || to > data.len() as u64 {
        return Err(bad(format!(
            "range {from:#x}..{to:#x} is not inside the file ({} bytes)",
            data.len()
        )));
    }
    let bytes = data[from as usize..to as usize].to_vec();
    Ok((format!("{file}@{base:#x}"), bytes, base))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
}

struct Printer<W: Write> {
    out: W,
    format: OutFormat,
    syntax: Syntax,
    syms: Symbols,
    intel: IntelFormatter,
    gas: GasFormatter,
    text: String,
    /// The disassembly's lines made so far (they hold `syms`' or `lines`' names).
    made: lines::KeptLines,
    window: Option<u64>,
    /// Per window: its id, instructions, gaps, overflows (trace lost where the backend or
    /// the hardware wrote OVF).
    counts: Vec<(Option<u64>, u64, Vec<String>, u64)>,
    /// Names and source lines of the current process image (trace directories); set
    /// through [`Printer::set_names`].
    lines: Option<crate::names::ImageNames>,
    /// Print each instruction's source line (`--srcline`).
    srcline: bool,
    /// OVF records met, in every format (a loss `finish` reports).
    overflows: u64,
    /// Windows by who decoded them ([`decoded_by_text`]), for the summary.
    decoded_by: std::collections::BTreeMap<String, u64>,
    /// `--format drmemtrace` of an input that is not a trace directory.
    drmemtrace: Option<drmemtrace::SingleThread>,
}

impl<W: Write> Printer<W> {
    /// A printer of `format` (disassembly in `syntax`) to `out`, naming code by `syms`
    /// until given an image's names, with source lines where `srcline`.
    fn new(
        out: W,
        format: OutFormat,
        syntax: Syntax,
        syms: Symbols,
        srcline: bool,
        drmemtrace: Option<drmemtrace::SingleThread>,
    ) -> Self {
        Printer {
            out,
            format,
            syntax,
            syms,
            intel: IntelFormatter::new(),
            gas: GasFormatter::new(),
            text: String::new(),
            made: lines::KeptLines::new(),
            window: None,
            counts: Vec::new(),
            lines: None,
            srcline,
            overflows: 0,
            decoded_by: Default::default(),
            drmemtrace,
        }
    }

    /// Names by `syms` from now on.
    fn set_symbols(&mut self, syms: Symbols) {
        self.syms = syms;
        self.made.clear();
    }

    /// Names and source lines by `names` from now on; the ones before.
    fn set_names(
        &mut self,
        names: Option<crate::names::ImageNames>,
    ) -> Option<crate::names::ImageNames> {
        self.made.clear();
        std::mem::replace(&mut self.lines, names)
    }

    /// A window was decoded by `by`.
    fn decoded(&mut self, by: String) {
        *self.decoded_by.entry(by).or_insert(0) += 1;
    }

    /// The summary's line of who decoded the windows (none if nothing was decoded), and
    /// how many more hold no PT.
    fn decoded_by_line(&mut self, no_pt: u64) -> std::io::Result<()> {
        if self.decoded_by.is_empty() {
            return Ok(());
        }
        let by: Vec<String> = self
            .decoded_by
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        writeln!(
            self.out,
            "decoded by: {}{}",
            by.join(", "),
            without_pt(no_pt)
        )
    }

    fn record(&mut self, r: &Record) -> std::io::Result<()> {
        if let Record::Overflow { .. } = r {
            self.overflows += 1;
        }
        match self.format {
            OutFormat::Jsonl => self.jsonl(r, None, false),
            OutFormat::Summary => {
                if let Record::WindowId(w) = r {
                    self.window = Some(*w);
                }
                if self.counts.is_empty() || matches!(r, Record::WindowId(_)) {
                    self.counts.push((self.window, 0, Vec::new(), 0));
                }
                if let Some(last) = self.counts.last_mut() {
                    match r {
                        Record::Instruction(_) => last.1 += 1,
                        Record::Gap(g) => last.2.push(g.to_string()),
                        Record::Overflow { .. } => last.3 += 1,
                        _ => {}
                    }
                }
                Ok(())
            }
            OutFormat::Disasm => self.disasm(r),
            OutFormat::Drmemtrace => {
                if let Some(d) = self.drmemtrace.as_mut() {
                    d.record(r);
                }
                Ok(())
            }
        }
    }

    /// `r` as a line of JSON, naming thread `tid` where given, and with `srcline` the
    /// source line of an instruction the image's names give. An instruction's line is
    /// made once and kept ([`lines::KeptLines`]).
    fn jsonl(&mut self, r: &Record, tid: Option<i32>, srcline: bool) -> std::io::Result<()> {
        let json = |lines: Option<&crate::names::ImageNames>| {
            let mut v = r.to_json();
            if let Some(o) = v.as_object_mut() {
                if let Some(tid) = tid {
                    o.insert("tid".into(), tid.into());
                }
                if let (true, Some(l), Record::Instruction(i)) = (srcline, lines, r) {
                    if let Some(src) = l.srcline(i.pc) {
                        o.insert("src".into(), src.into());
                    }
                }
            }
            v
        };
        let Record::Instruction(i) = r else {
            return writeln!(self.out, "{}", json(self.lines.as_ref()));
        };
        let lines = self.lines.as_ref();
        let line = self
            .made
            .line(i, tid.map_or(-1, i64::from), |line: &mut Vec<u8>| {
                // (Writing into a vector cannot fail.)
                let _ = serde_json::to_writer(&mut *line, &json(lines));
                line.push(b'\n');
            });
        self.out.write_all(line)
    }

    fn disasm(&mut self, r: &Record) -> std::io::Result<()> {
        let Record::Instruction(i) = r else {
            return match r {
                Record::Gap(g) => writeln!(self.out, "[gap: {g}]"),
                Record::WindowId(w) => writeln!(self.out, "[window {w}]"),
                Record::Timestamp { tsc, perf_time } => match perf_time {
                    Some(t) => writeln!(self.out, "[timestamp tsc={tsc:#x} time={t}]"),
                    None => writeln!(self.out, "[timestamp tsc={tsc:#x}]"),
                },
                Record::Cpu(c) => writeln!(self.out, "[cpu {c}]"),
                Record::TraceEnabled { ip } => writeln!(self.out, "[enabled at {ip:#x}]"),
                Record::TraceDisabled { ip: Some(ip) } => {
                    writeln!(self.out, "[disabled at {ip:#x}]")
                }
                Record::TraceDisabled { ip: None } => writeln!(self.out, "[disabled]"),
                Record::KernelXfer { from, to } => match to {
                    Some(t) => writeln!(self.out, "[kernel transfer {from:#x} -> {t:#x}]"),
                    None => writeln!(self.out, "[kernel transfer from {from:#x}]"),
                },
                Record::Syscall { pc } => writeln!(self.out, "[syscall at {pc:#x}]"),
                Record::InterruptFlag { enabled, ip } => {
                    let what = if *enabled { "enabled" } else { "disabled" };
                    match ip {
                        Some(ip) => writeln!(self.out, "[interrupts {what} at {ip:#x}]"),
                        None => writeln!(self.out, "[interrupts {what}]"),
                    }
                }
                Record::Overflow { ip } => match ip {
                    Some(ip) => writeln!(self.out, "[overflow, resumed at {ip:#x}]"),
                    None => writeln!(self.out, "[overflow]"),
                },
                Record::Instruction(_) => Ok(()),
            };
        };
        let Printer {
            made,
            syntax,
            intel,
            gas,
            text,
            lines,
            syms,
            srcline,
            out,
            ..
        } = self;
        let line = made.line(i, 0, |line| {
            let mut d = Decoder::with_ip(i.mode.bitness(), i.encoding(), i.pc, 0);
            let insn = d.decode();
            text.clear();
            match syntax {
                Syntax::Intel => intel.format(&insn, text),
                Syntax::Att => gas.format(&insn, text),
            }
            if *srcline {
                if let Some(src) = lines.as_ref().and_then(|l| l.srcline(i.pc)) {
                    text.push_str("    ; ");
                    text.push_str(&crate::text::printable(&src));
                }
            }
            // The image's names where there is one (debug files, demangled), else the
            // symbols of the files given.
            let named = lines.as_ref().map(|l| l.named(i.pc));
            let sym: Option<(&str, u64)> = match &named {
                // No start: a PLT stub or JIT code is named as a whole; a bare address is
                // not.
                Some(n) if n.name.starts_with("0x") => None,
                Some(n) => Some((&n.name, n.start.map_or(0, |s| i.pc.wrapping_sub(s)))),
                None => syms.lookup(i.pc),
            };
            lines::format_line(line, i.pc, i.encoding(), sym, text);
        });
        out.write_all(line)
    }

    fn finish(&mut self) -> std::io::Result<()> {
        if let Some(d) = self.drmemtrace.take() {
            d.finish()?;
        }
        if self.format == OutFormat::Summary {
            let mut total = 0;
            let mut errors = 0;
            let mut overflows = 0;
            for (w, n, gaps, ovf) in &self.counts {
                match w {
                    Some(w) => writeln!(
                        self.out,
                        "window {w}: {}",
                        tally(*n, gaps.len() as u64, *ovf)
                    )?,
                    None => writeln!(self.out, "trace: {}", tally(*n, gaps.len() as u64, *ovf))?,
                }
                for g in gaps {
                    writeln!(self.out, "  gap: {g}")?;
                }
                total += n;
                errors += gaps.len();
                overflows += ovf;
            }
            writeln!(
                self.out,
                "total: {}",
                tally(total, errors as u64, overflows)
            )?;
            self.decoded_by_line(0)?;
        }
        self.out.flush()
    }
}

/// "N instructions, N gaps, N overflows" (summaries).
fn tally(insns: u64, gaps: u64, overflows: u64) -> String {
    use crate::text::count;
    format!(
        "{}, {}, {}",
        count(insns, "instruction"),
        count(gaps, "gap"),
        count(overflows, "overflow")
    )
}

pub fn run(args: Args) -> CmdResult {
    let args = *args.opts;
    if args.resync_on_error && args.decoder != DecoderArg::Fast {
        return Err(
            "--resync-on-error needs --decoder fast: libipt 2.1.2 resyncs at PSBs \
                    only (and `check` would compare against it)"
                .into(),
        );
    }
    if args.decoder == DecoderArg::Check && args.threads > 1 {
        return Err("--decoder check compares on one thread: leave out --threads".into());
    }
    if let Some(p) = &args.trace_dir {
        return ptt::run(p, &args);
    }
    if args.format == OutFormat::Drmemtrace && args.decoder == DecoderArg::Check {
        return Err(
            "--decoder check compares the decoders and writes no records: leave out \
                    --format drmemtrace"
                .into(),
        );
    }
    let input::Input {
        data,
        windows,
        mut params,
        process,
        damage,
        thread,
        ..
    } = open_input(&args)?;
    let mut damages = Damages(damage, None);
    apply_trace_options(&args, &mut params)?;
    let (spec, mut space, syms) = load_images(&args, process.as_ref())?;
    let events = sideband_events(&args)?;
    let window_sample_type = process
        .as_ref()
        .map(|p| p.sideband_sample_type)
        .filter(|&st| st != 0)
        .or(args.sample_type)
        .unwrap_or(drpttracer::sideband::record::SIDEBAND_SAMPLE_TYPE);

    let drmemtrace = if args.format == OutFormat::Drmemtrace {
        let out = drmemtrace::out_dir(&args)?;
        let (name, pid, tid) = input_thread(&args, thread);
        Some(drmemtrace::SingleThread::new(out, &name, tid, pid))
    } else {
        None
    };
    let stdout = std::io::stdout();
    let mut printer = Printer::new(
        BufWriter::with_capacity(1 << 16, stdout.lock()),
        args.format,
        args.syntax,
        syms,
        false,
        drmemtrace,
    );
    let total: u64 = windows.iter().map(|w| w.pt.len() as u64).sum();
    let bar = crate::progress::pt_bytes(total);
    let mut done = 0u64;
    let mut warnings: Vec<String> = Vec::new();
    let mut resolver = spec.resolver();
    // A thread file's mappings when tracing began make the image the windows start with
    // (as `decode DIR` builds it).
    if let Some(p) = &process {
        resolver.apply_window(&mut space, &p.initial_events, &mut warnings);
    }
    let mut ctx = WindowDecode {
        args: &args,
        params,
        events,
        caches: DecoderCaches::sharing_sections(),
        ref_caches: DecoderCaches::sharing_sections(),
        tally: CheckTally::default(),
    };
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        for w in &windows {
            let opts = WindowOptions {
                source: w.name.clone(),
                window_id: if w.lost.is_some() { None } else { w.id },
                cpu: w.cpu,
                base_offset: w.base_offset,
                decoder: args.decoder.kind(),
                resync_on_error: args.resync_on_error,
                iflags_events: args.iflags_events,
            };
            let pt = &data[w.pt.clone()];
            if let Some(what) = &w.lost {
                if let Some(id) = w.id {
                    printer.record(&Record::WindowId(id))?;
                }
                printer.record(&Record::Gap(Box::new(drpttracer::decode::Gap {
                    kind: drpttracer::decode::GapKind::LostData,
                    ip: None,
                    pt_offset: w.base_offset,
                    source: w.name.clone(),
                    error: what.clone(),
                })))?;
            }
            // A thread file's window sideband changes the image before the window, as in
            // `decode DIR` (ptt_dir): mappings in order, then the captured code, which is
            // what actually ran.
            if let Some(r) = w.sideband.as_ref().filter(|r| !r.is_empty()) {
                let evs = parse_records(
                    &format!("{} sideband", w.name),
                    &data[r.clone()],
                    window_sample_type,
                )?;
                resolver.apply_window(&mut space, &evs, &mut warnings);
            }
            if args.decoder == DecoderArg::Check {
                ctx.check(&mut printer, pt, &space, &resolver, opts, &w.name)?;
            } else if args.threads > 1 {
                ctx.parallel(&mut printer, pt, &space, &resolver, &opts)?;
            } else {
                let progress = |position: u64| {
                    if let Some(b) = &bar {
                        b.set_position(done + position);
                    }
                };
                let found = ctx.stream(&mut printer, pt, &space, &resolver, opts, progress)?;
                for m in found {
                    if !warnings.contains(&m) {
                        warnings.push(m);
                    }
                }
            }
            done += w.pt.len() as u64;
            if let Some(b) = &bar {
                b.set_position(done);
            }
        }
        if args.decoder == DecoderArg::Check {
            ctx.tally.finish(&mut printer.out)?;
            printer.out.flush()?;
        } else {
            printer.finish()?;
        }
        Ok(())
    })();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for w in &warnings {
        eprintln!(
            "pttrace decode: warning: {}",
            crate::text::printable(&w.to_string())
        );
    }
    match result {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        r => {
            r?;
            damages.note_overflows(printer.overflows);
            damages.finish("decode", args.policy)
        }
    }
}

/// The thread a single input holds, for `--format drmemtrace`: (name for its file, pid,
/// tid). A thread file says it (`thread`, from its header); else the first sideband
/// record of a process that mapped or exec'd something (perf samples carry pid and tid);
/// else DynamoRIO's `<tid>.raw.pt` names it; else 1 (said on stderr: the analyzers need
/// some id).
fn input_thread(args: &DecodeArgs, thread: Option<(i32, i32)>) -> (String, u64, u64) {
    use pttrace_format::perf_record::{Record as PerfRecord, RecordIter};
    let path = [&args.ptt, &args.pt, &args.auxtrace, &args.raw_pt]
        .into_iter()
        .flatten()
        .next()
        .cloned()
        .unwrap_or_default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "input".to_string());
    if let Some((pid, tid)) = thread {
        return (name, pid as u64, tid as u64);
    }
    let st = args.sample_type.unwrap_or(0);
    for sb in &args.sideband {
        let Ok(data) = std::fs::read(sb) else {
            continue;
        };
        for item in RecordIter::new(&data, st).flatten() {
            let (_, rec) = item;
            let starts = matches!(
                rec.record,
                PerfRecord::Mmap2(_) | PerfRecord::Mmap(_) | PerfRecord::Comm { exec: true, .. }
            );
            if let (true, Some(pid), Some(tid)) = (starts, rec.sample.pid, rec.sample.tid) {
                if pid != 0 && pid != u32::MAX {
                    return (name, u64::from(pid), u64::from(tid));
                }
            }
        }
    }
    if let Some(tid) = args.raw_pt.as_ref().and_then(|p| {
        p.file_name()?
            .to_str()?
            .split('.')
            .next()?
            .parse::<u64>()
            .ok()
    }) {
        return (name, tid, tid);
    }
    eprintln!(
        "pttrace decode: the input names no thread: written as thread 1 of process 1 \
         (give --sideband with the traced process's records to have its ids)"
    );
    (name, 1, 1)
}

/// Opens the one input the options name (its container's reader in the library), and
/// reports what it says about itself.
fn open_input(args: &DecodeArgs) -> Result<input::Input, Box<dyn std::error::Error>> {
    let input = if let Some(p) = &args.ptt {
        input::open_thread_file(p, args.info.as_deref())?
    } else if let Some(p) = &args.pt {
        input::open_raw(p)?
    } else if let Some(p) = &args.auxtrace {
        input::open_auxtrace(p)?
    } else if let Some(p) = &args.raw_pt {
        input::open_dr_raw(p)?
    } else {
        return Err(
            "give the trace as DIR (a `pttrace run` output), or with --pt, --auxtrace, --raw-pt \
             or --ptt"
                .into(),
        );
    };
    for w in &input.warnings {
        eprintln!("pttrace decode: warning: {}", crate::text::printable(w));
    }
    if let (Some(r), Some(p)) = (&input.recovered, &args.ptt) {
        eprintln!(
            "pttrace decode: {}: {}",
            crate::text::printable(&p.display().to_string()),
            crate::text::recovered_text(r)
        );
    }
    Ok(input)
}

/// The CPU, timing and filter options, over what the input carries.
fn apply_trace_options(args: &DecodeArgs, params: &mut TraceParams) -> Result<(), String> {
    if let Some(c) = &args.cpu {
        let (f, m, s) = CpuParams::parse_cpu(c)?;
        if let Some(w) = drpttracer::decode::errata::cpu_warning(f, m) {
            eprintln!("pttrace decode: warning: --cpu {c}: {w}");
        }
        params.cpu.family = f;
        params.cpu.model = m;
        params.cpu.stepping = s;
    }
    for f in &args.filter {
        params.filter.set(f)?;
    }
    if let Some(v) = args.mtc_freq {
        params.cpu.mtc_freq = v;
    }
    if let Some(v) = args.nom_freq {
        params.cpu.nom_freq = v;
    }
    if let Some(s) = &args.cpuid_15 {
        let (a, b) = s
            .split_once(',')
            .ok_or_else(|| format!("--cpuid-15 '{s}': expected EAX,EBX"))?;
        params.cpu.cpuid_0x15_eax = parse_u64(a)? as u32;
        params.cpu.cpuid_0x15_ebx = parse_u64(b)? as u32;
    }
    if let Some(s) = &args.time_conv {
        let v: Vec<&str> = s.split(',').collect();
        if v.len() != 3 {
            return Err(format!("--time-conv '{s}': expected SHIFT,MULT,ZERO"));
        }
        params.time = Some(TimeConv {
            time_shift: parse_u64(v[0])? as u16,
            time_mult: parse_u64(v[1])? as u32,
            time_zero: parse_u64(v[2])?,
        });
    }
    Ok(())
}

/// The code the options name (ELF files, raw code, vDSO, kcore; DynamoRIO's kcore and
/// kallsyms beside a `.raw.pt` unless told otherwise) and the process's own vDSO: what
/// to load, the loaded image and its symbols.
fn load_images(
    args: &DecodeArgs,
    process: Option<&PttProcess>,
) -> Result<(ImageSpec, AddressSpace, Symbols), Box<dyn std::error::Error>> {
    let beside = |name: &str| -> Option<PathBuf> {
        let dir = args.raw_pt.as_ref()?.parent()?;
        [dir.join(name), dir.parent()?.join(name)]
            .into_iter()
            .find(|p| p.is_file())
    };
    let kcore = args.kcore.clone().or_else(|| beside("kcore"));
    let kallsyms = args.kallsyms.clone().or_else(|| beside("kallsyms"));
    for (what, found, given) in [
        ("kcore", &kcore, &args.kcore),
        ("kallsyms", &kallsyms, &args.kallsyms),
    ] {
        if let (Some(p), None) = (found, given) {
            eprintln!("pttrace decode: using {what} {}", p.display());
        }
    }
    let mut spec = ImageSpec {
        kcore,
        sysroot: args.sysroot.clone(),
        ..Default::default()
    };
    for s in &args.image {
        spec.elfs.push(split_at_addr(s, "--image")?);
    }
    for r in &args.raw {
        let (name, bytes, base) = raw_code(r)?;
        spec.raw.push((name, bytes, base));
    }
    if let Some(v) = &args.vdso {
        let (f, addr) = split_at_addr(v, "--vdso")?;
        let addr = addr.ok_or_else(|| format!("--vdso '{v}': expected FILE@ADDR"))?;
        let bytes = read(&f)?;
        spec.raw.push(("[vdso]".into(), bytes.clone(), addr));
        spec.vdso = Some(bytes);
    }
    if let Some((addr, bytes)) = process.and_then(|p| p.vdso.clone()) {
        if spec.vdso.is_none() {
            spec.raw.push(("[vdso]".into(), bytes.clone(), addr));
            spec.vdso = Some(bytes);
        }
    }
    let mut space = AddressSpace::new();
    let mut syms = Symbols::new();
    if let Some(k) = &spec.kcore {
        space.add_kcore(k)?;
    }
    for (path, base) in &spec.elfs {
        let bias = space.add_elf(path, *base)?;
        let bytes = read(path)?;
        let _ = syms.add_elf(path, &bytes, bias);
    }
    for (name, bytes, addr) in &spec.raw {
        space.add_bytes(name, bytes.clone(), *addr);
    }
    if let Some(k) = &kallsyms {
        let text = crate::text::read_text(k)?;
        syms.add_kallsyms(k, &text)?;
    }
    Ok((spec, space, syms))
}

/// The image changes of the `--sideband` files, in time order.
fn sideband_events(args: &DecodeArgs) -> Result<Vec<ImageEvent>, Box<dyn std::error::Error>> {
    let mut events = Vec::new();
    for sb in &args.sideband {
        let st = args.sample_type.unwrap_or(0);
        events.extend(parse_records(&sb.display().to_string(), &read(sb)?, st)?);
    }
    events.sort_by_key(|e| e.time.unwrap_or(0));
    Ok(events)
}

/// What decoding one window after the other keeps: the trace's parameters and sideband,
/// the decoders' caches (windows decoded one after the other share what their decoders
/// learn) and the oracle check's tally.
struct WindowDecode<'a> {
    args: &'a DecodeArgs,
    params: TraceParams,
    events: Vec<ImageEvent>,
    caches: DecoderCaches,
    ref_caches: DecoderCaches,
    tally: CheckTally,
}

type WindowResult<T> = Result<T, Box<dyn std::error::Error>>;

impl WindowDecode<'_> {
    /// `--decoder check`: the fast decoder against libipt alone, record for record.
    fn check<W: Write>(
        &mut self,
        printer: &mut Printer<W>,
        pt: &[u8],
        space: &AddressSpace,
        resolver: &ImageResolver,
        opts: WindowOptions,
        name: &str,
    ) -> WindowResult<()> {
        let (params, events) = (self.params, self.events.clone());
        let mut fast = PtDecoder::new(
            pt,
            params,
            space.clone(),
            events.clone(),
            resolver.clone(),
            opts.clone(),
        )?
        .with_caches(std::mem::take(&mut self.caches));
        let reference = WindowOptions {
            decoder: DecoderKind::Libipt,
            ..opts
        };
        let mut libipt = PtDecoder::new(
            pt,
            params,
            space.clone(),
            events,
            resolver.clone(),
            reference,
        )?
        .with_caches(std::mem::take(&mut self.ref_caches));
        let outcome = check::compare(&mut fast, &mut libipt);
        self.caches = fast.take_caches();
        self.ref_caches = libipt.take_caches();
        self.tally.add(&mut printer.out, name, outcome)?;
        Ok(())
    }

    /// `--threads N`: PSB-parallel decode of the window.
    fn parallel<W: Write>(
        &mut self,
        printer: &mut Printer<W>,
        pt: &[u8],
        space: &AddressSpace,
        resolver: &ImageResolver,
        opts: &WindowOptions,
    ) -> WindowResult<()> {
        let (chunks, stats) = decode_parallel_stats(
            pt,
            &self.params,
            space,
            &self.events,
            resolver,
            opts,
            usize::from(self.args.threads),
        )?;
        for r in chunks.iter().flat_map(|c| c.iter()) {
            printer.record(r)?;
        }
        printer.decoded(match stats.one_pass_by {
            Some(by) => format!("{} (one pass)", decoded_by_text(by)),
            None => format!("{} (PSB-parallel)", stats.by),
        });
        Ok(())
    }

    /// One decoder over the window, its records printed as they come; `progress` gets its
    /// position now and then. Returns the image warnings the decoder met.
    fn stream<W: Write>(
        &mut self,
        printer: &mut Printer<W>,
        pt: &[u8],
        space: &AddressSpace,
        resolver: &ImageResolver,
        opts: WindowOptions,
        progress: impl Fn(u64),
    ) -> WindowResult<Vec<String>> {
        let events = self.events.clone();
        let mut dec = PtDecoder::new(
            pt,
            self.params,
            space.clone(),
            events,
            resolver.clone(),
            opts,
        )?
        .with_caches(std::mem::take(&mut self.caches));
        // Slices in batches of 4096 between progress updates (the decoder's position is
        // only known between batches).
        loop {
            let mut n = 0u32;
            let flow = dec.for_each_slice(|recs| {
                for r in recs {
                    if let Err(e) = printer.record(r) {
                        return ControlFlow::Break(Err(e));
                    }
                }
                n += 1;
                if n == 4096 {
                    ControlFlow::Break(Ok(()))
                } else {
                    ControlFlow::Continue(())
                }
            });
            match flow {
                None => break,
                Some(r) => r?,
            }
            progress(dec.position());
        }
        printer.decoded(decoded_by_text(dec.decoded_by()));
        let warnings = dec.warnings().to_vec();
        self.caches = dec.take_caches();
        Ok(warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drpttracer::decode::records::{ExecMode, InsnClass, Instruction};

    #[test]
    fn disassembly_lines_follow_the_names_they_are_printed_with() {
        let names = |name: &str| {
            let mut s = Symbols::new();
            s.add(0x1000, 0x10, name);
            s.finish();
            s
        };
        let mut p = Printer::new(
            Vec::new(),
            OutFormat::Disasm,
            Syntax::Intel,
            names("first"),
            false,
            None,
        );
        let mut bytes = [0u8; 15];
        bytes[..3].copy_from_slice(&[0x48, 0x89, 0xe7]);
        let mov = Record::Instruction(Instruction {
            pc: 0x1004,
            size: 3,
            bytes,
            class: InsnClass::Other,
            mode: ExecMode::Bit64,
        });
        p.record(&mov).unwrap();
        p.record(&mov).unwrap();
        p.set_symbols(names("second"));
        p.record(&mov).unwrap();
        p.syntax = Syntax::Att;
        p.set_symbols(Symbols::new());
        p.record(&mov).unwrap();
        assert_eq!(
            String::from_utf8(p.out).unwrap(),
            "0000000000001004 <first+0x4>  48 89 e7                        mov rdi,rsp\n\
             0000000000001004 <first+0x4>  48 89 e7                        mov rdi,rsp\n\
             0000000000001004 <second+0x4>  48 89 e7                        mov rdi,rsp\n\
             0000000000001004  48 89 e7                        mov %rsp,%rdi\n"
        );
    }

    #[test]
    fn summaries_count_in_the_singular() {
        assert_eq!(super::tally(1, 1, 1), "1 instruction, 1 gap, 1 overflow");
        assert_eq!(super::tally(0, 2, 0), "0 instructions, 2 gaps, 0 overflows");
    }
}
