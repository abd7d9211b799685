//! `pttrace profile DIR --format bolt|lcov --out FILE [--binary PATH]`: what a compiler or
//! a coverage report wants from a trace, for one binary, from every thread and process
//! image of the trace that ran it.
//!
//! - `bolt`: BOLT's pre-aggregated profile (`llvm-bolt BIN -pa -p FILE`): every taken
//!   branch (`B from to count 0`: conditional branches taken, jumps, calls, returns,
//!   direct or not) and every straight-line run between two of them (`F start end
//!   count`: from a branch's target to the next branch's source, which gives BOLT the
//!   not-taken conditional branches and fall-throughs), exact counts, at the binary's
//!   link-time addresses.
//! - `lcov`: line coverage in lcov's tracefile format (`genhtml` renders it): every line of
//!   the binary's DWARF line tables with how often it ran (the count of its most executed
//!   instruction), never-run lines with 0, and functions with how often they were entered.
//!
//! A gap, an overflow or a signal's delivery ends the run in progress without counting it
//! (what happened in between is not known); the losses are reported as for `decode`.

mod bolt;
mod lcov;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use drpttracer::decode::ptt_dir::{self, PttProcess, PttWindowInfo};
use drpttracer::decode::{DecodeError, InsnClass, Record, TraceDecoder};

use crate::CmdResult;

#[derive(clap::Args)]
pub struct Args {
    /// Trace directory (the `--out` of `pttrace run`) or one thread file.
    pub trace: PathBuf,
    /// `bolt`: BOLT's pre-aggregated branch profile; `lcov`: line coverage.
    #[arg(long, value_enum)]
    pub format: ProfileFormat,
    /// The file written.
    #[arg(long, short)]
    pub out: PathBuf,
    /// The binary profiled, as the trace mapped it (an executable or a shared library);
    /// default: the traced program's executable.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Root to find mapped files under (traces from another machine).
    #[arg(long)]
    pub sysroot: Option<PathBuf>,
    /// More places to look for separate debug files (`lcov`).
    #[arg(long)]
    pub debug_dir: Vec<PathBuf>,
    #[command(flatten)]
    pub policy: crate::damage::Policy,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileFormat {
    Bolt,
    Lcov,
}

/// Where the profiled binary runs in one process image: `[start, end)` at run time, and
/// what to add to a run-time address there for its link-time address.
#[derive(Clone, Copy)]
struct Placed {
    start: u64,
    end: u64,
    delta: u64,
}

/// The binary's executable mappings in `p`.
fn placements(p: &PttProcess, binary: &Path, sysroot: Option<&Path>) -> Vec<Placed> {
    let Ok(module) = pttrace_symbols::Module::open(binary, &Default::default()) else {
        return Vec::new();
    };
    let wanted = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
    p.maps
        .iter()
        .filter(|m| m.exec && m.path.starts_with('/'))
        .filter(|m| {
            let file = under(sysroot, &m.path);
            std::fs::canonicalize(&file).unwrap_or(file) == wanted
        })
        .filter_map(|m| {
            let link = module.runtime_to_addr(m.start, m.start, m.offset)?;
            Some(Placed {
                start: m.start,
                end: m.end,
                delta: link.wrapping_sub(m.start),
            })
        })
        .collect()
}

/// `path` (as mapped) under `sysroot`.
fn under(sysroot: Option<&Path>, path: &str) -> PathBuf {
    match sysroot {
        Some(r) => r.join(path.trim_start_matches('/')),
        None => PathBuf::from(path),
    }
}

/// The executable of process image `p`: the mapped ELF file that asks for an interpreter
/// (a dynamically linked program), else (a static one) the lowest mapped file.
fn main_executable(p: &PttProcess, sysroot: Option<&Path>) -> Option<PathBuf> {
    use object::Object;
    let files = p.mapped_files(sysroot);
    let interp = files.iter().find(|(_, file, _)| {
        drpttracer::decode::image::Backing::map_file(file).is_ok_and(|m| {
            object::File::parse(m.bytes()).is_ok_and(|o| o.section_by_name(".interp").is_some())
        })
    });
    interp
        .or_else(|| files.iter().min_by_key(|f| f.0))
        .map(|(_, file, _)| file.clone())
}

/// Maps keyed by addresses (the standard hasher costs more than the rest of counting).
type AddrMap<K> = HashMap<K, u64, std::hash::BuildHasherDefault<pttrace_symbols::AddrHasher>>;

/// Counts of the binary's code, joined over every thread that ran it.
#[derive(Default)]
pub struct Counts {
    /// Taken branches: (source, target) at link-time addresses.
    pub branches: AddrMap<(u64, u64)>,
    /// Straight-line runs: (first instruction, last instruction, the branch source).
    pub runs: AddrMap<(u64, u64)>,
    /// Executions of each instruction (`lcov` only).
    pub instructions: AddrMap<u64>,
    /// Instructions executed in the binary, and in all.
    pub in_binary: u64,
    pub total: u64,
}

/// One thread's walk: the last instruction and where the current straight-line run began
/// (run-time addresses).
struct Walk<'a> {
    placed: &'a [Placed],
    /// The placement of the last address looked up (most are in the same one).
    near: Placed,
    per_instruction: bool,
    last: Option<(u64, u64, InsnClass)>,
    run_start: Option<u64>,
}

impl Walk<'_> {
    #[inline]
    fn link(&mut self, pc: u64) -> Option<u64> {
        if pc >= self.near.start && pc < self.near.end {
            return Some(pc.wrapping_add(self.near.delta));
        }
        let p = *self.placed.iter().find(|p| pc >= p.start && pc < p.end)?;
        self.near = p;
        Some(pc.wrapping_add(p.delta))
    }

    fn record(&mut self, r: &Record, c: &mut Counts) {
        match r {
            Record::Instruction(i) => {
                c.total += 1;
                let here = self.link(i.pc);
                if let Some(at) = here {
                    c.in_binary += 1;
                    if self.per_instruction {
                        *c.instructions.entry(at).or_insert(0) += 1;
                    }
                }
                if let Some((pc, fall, class)) = self.last {
                    let branch =
                        matches!(class, InsnClass::Jump | InsnClass::Call | InsnClass::Return)
                            || (class == InsnClass::CondJump && i.pc != fall);
                    if branch || i.pc != fall {
                        if let (Some(from), Some(to)) = (self.link(pc), here) {
                            if branch {
                                *c.branches.entry((from, to)).or_insert(0) += 1;
                            }
                        }
                        // The run ends at a branch; anything else (a far transfer that does
                        // not come back to the next instruction) ends it uncounted.
                        if let (true, Some(start)) = (branch, self.run_start) {
                            if let (Some(s), Some(e)) = (self.link(start), self.link(pc)) {
                                *c.runs.entry((s, e)).or_insert(0) += 1;
                            }
                        }
                        self.run_start = Some(i.pc);
                    }
                } else {
                    self.run_start = Some(i.pc);
                }
                self.last = Some((i.pc, i.pc.wrapping_add(u64::from(i.size)), i.class));
            }
            Record::Gap(_)
            | Record::Overflow { .. }
            | Record::KernelXfer { .. }
            | Record::TraceDisabled { ip: Some(_) } => {
                self.last = None;
                self.run_start = None;
            }
            _ => {}
        }
    }
}

pub fn run(args: Args) -> CmdResult {
    let mut trace = ptt_dir::open(&args.trace)?;
    trace.sysroot = args.sysroot.clone();
    let sysroot = args.sysroot.as_deref();
    let (mut damages, _) = crate::tracedir::of_trace(&args.trace);
    damages.add_skipped(&trace.skipped);
    let binary = match &args.binary {
        Some(b) => {
            if !b.is_file() {
                return Err(format!("--binary {}: no such file", b.display()).into());
            }
            b.clone()
        }
        None => trace
            .threads
            .first()
            .and_then(|th| trace.process_of(th))
            .and_then(|p| main_executable(p, sysroot))
            .ok_or("cannot tell the traced program's executable: give it with --binary")?,
    };
    let mut by_image: HashMap<(i32, u64), Vec<Placed>> = HashMap::new();
    let mut counts = Counts::default();
    let mut overflows = 0u64;
    let mut threads = 0usize;
    for th in &trace.threads {
        let key = (th.header.pid, th.header.nonce);
        let placed = by_image
            .entry(key)
            .or_insert_with(|| {
                trace
                    .process_of(th)
                    .map(|p| placements(p, &binary, sysroot))
                    .unwrap_or_default()
            })
            .clone();
        if placed.is_empty() {
            continue;
        }
        threads += 1;
        let mut walk = Walk {
            placed: &placed,
            near: placed[0],
            per_instruction: args.format == ProfileFormat::Lcov,
            last: None,
            run_start: None,
        };
        trace.decode_thread(th, &mut |_: &PttWindowInfo, dec| {
            let Some(dec) = dec else { return Ok(()) };
            dec.for_each_slice(|records| {
                for r in records {
                    if let Record::Overflow { .. } = r {
                        overflows += 1;
                    }
                    walk.record(r, &mut counts);
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
            Ok::<(), DecodeError>(())
        })?;
    }
    if threads == 0 {
        return Err(format!(
            "{}: no thread of the trace ran it (give the binary as mapped with --binary)",
            binary.display()
        )
        .into());
    }
    let written = match args.format {
        ProfileFormat::Bolt => {
            bolt::write(&args.out, &binary, &counts)
                .map_err(|e| format!("{}: {e}", args.out.display()))?
        }
        ProfileFormat::Lcov => lcov::write(&args.out, &binary, &args.debug_dir, &counts)?,
    };
    println!(
        "{}: {written}; {} of {} instructions were in {} ({threads} threads)",
        args.out.display(),
        counts.in_binary,
        counts.total,
        binary.display()
    );
    if args.format == ProfileFormat::Bolt {
        println!(
            "use: llvm-bolt-16 {bin} -o {bin}.bolt -pa -p {} -reorder-blocks=ext-tsp \
             -reorder-functions=hfsort -split-functions -dyno-stats",
            args.out.display(),
            bin = binary.display()
        );
    }
    damages.note_overflows(overflows);
    damages.finish("profile", args.policy)
}
