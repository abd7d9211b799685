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
//!
//! Windows are decoded on every core ([`ptt_dir::PttTrace::decode_thread_parallel`]), each
//! counted into a [`Piece`] on its own; the pieces are joined in order, which adds what
//! crosses from one window to the next (the branch between them, the run open across).

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
    /// default: the traced program's executable (after the `execve`s of its first
    /// process).
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

/// The executable mappings in `p` of `binary` (opened as `module`).
fn placements(
    p: &PttProcess,
    binary: &Path,
    module: &pttrace_symbols::Module,
    sysroot: Option<&Path>,
) -> Vec<Placed> {
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
    /// Straight-line runs: (first instruction, last instruction: the next taken branch).
    pub runs: AddrMap<(u64, u64)>,
    /// Executions of each instruction (`lcov` only).
    pub instructions: AddrMap<u64>,
    /// Instructions executed in the binary, and in all.
    pub in_binary: u64,
    pub total: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        for (k, n) in other.branches {
            *self.branches.entry(k).or_insert(0) += n;
        }
        for (k, n) in other.runs {
            *self.runs.entry(k).or_insert(0) += n;
        }
        for (k, n) in other.instructions {
            *self.instructions.entry(k).or_insert(0) += n;
        }
        self.in_binary += other.in_binary;
        self.total += other.total;
    }
}

/// Link-time addresses of run-time ones, in one process image.
#[derive(Clone)]
struct Linker<'a> {
    placed: &'a [Placed],
    /// The placement of the last address looked up (most are in the same one).
    near: Placed,
}

impl Linker<'_> {
    #[inline]
    fn link(&mut self, pc: u64) -> Option<u64> {
        if pc >= self.near.start && pc < self.near.end {
            return Some(pc.wrapping_add(self.near.delta));
        }
        let p = *self.placed.iter().find(|p| pc >= p.start && pc < p.end)?;
        self.near = p;
        Some(pc.wrapping_add(p.delta))
    }

    /// Counts a taken branch.
    fn branch(&mut self, c: &mut Counts, from: u64, to: u64) {
        if let (Some(f), Some(t)) = (self.link(from), self.link(to)) {
            *c.branches.entry((f, t)).or_insert(0) += 1;
        }
    }

    /// Counts a straight-line run.
    fn run(&mut self, c: &mut Counts, first: u64, last: u64) {
        if let (Some(s), Some(e)) = (self.link(first), self.link(last)) {
            *c.runs.entry((s, e)).or_insert(0) += 1;
        }
    }
}

/// Where a thread's flow is: the last instruction (its pc, the pc after it, its class) and
/// where the current straight-line run began (run-time addresses); nothing after a loss.
#[derive(Clone, Copy, Default)]
struct Flow {
    last: Option<(u64, u64, InsnClass)>,
    run_start: Option<u64>,
}

/// The flow going from `last` to the instruction at `pc`: whether that is a taken branch,
/// and whether the run ends (at a branch; or, uncounted, at a transfer that does not come
/// back to the next instruction, such as a signal's delivery).
#[inline]
fn step((_, fall, class): (u64, u64, InsnClass), pc: u64) -> (bool, bool) {
    let branch = matches!(class, InsnClass::Jump | InsnClass::Call | InsnClass::Return)
        || (class == InsnClass::CondJump && pc != fall);
    (branch, branch || pc != fall)
}

/// What one window's records give, counted on a worker, for [`Joiner`] to join in order
/// with the windows before it (the run open when the window began ends inside it, or
/// goes on).
#[derive(Default)]
struct Piece {
    counts: Counts,
    /// The first instruction.
    first: Option<u64>,
    /// A loss came before the first instruction.
    reset_before_first: bool,
    /// How the run open at the first instruction ended: at a taken branch at this pc
    /// (`Some(Some(pc))`), uncounted (`Some(None)`), or not in this window (`None`).
    head: Option<Option<u64>>,
    /// The flow at the window's end.
    end: Flow,
}

/// Hands each record of a window to the function it is given.
type Records<'a> = dyn FnMut(&mut dyn FnMut(&Record)) + 'a;

/// Counts `records` (one window's) into a [`Piece`].
fn count_piece(records: &mut Records<'_>, linker: &mut Linker<'_>, per_instruction: bool) -> Piece {
    let mut p = Piece::default();
    let mut flow = Flow::default();
    records(&mut |r| match r {
        Record::Instruction(i) => {
            let c = &mut p.counts;
            c.total += 1;
            if let Some(at) = linker.link(i.pc) {
                c.in_binary += 1;
                if per_instruction {
                    *c.instructions.entry(at).or_insert(0) += 1;
                }
            }
            p.first.get_or_insert(i.pc);
            match flow.last {
                Some(last) => {
                    let (branch, ends) = step(last, i.pc);
                    if ends {
                        if branch {
                            linker.branch(c, last.0, i.pc);
                        }
                        match (branch, flow.run_start, p.head) {
                            // The window's first run: its start is known when joined.
                            (true, Some(_), None) => p.head = Some(Some(last.0)),
                            (false, _, None) => p.head = Some(None),
                            (true, Some(start), Some(_)) => linker.run(c, start, last.0),
                            _ => {}
                        }
                        flow.run_start = Some(i.pc);
                    }
                }
                None => flow.run_start = Some(i.pc),
            }
            flow.last = Some((i.pc, i.pc.wrapping_add(u64::from(i.size)), i.class));
        }
        Record::Gap(_)
        | Record::Overflow { .. }
        | Record::KernelXfer { .. }
        | Record::TraceDisabled { ip: Some(_) } => {
            if p.first.is_none() {
                p.reset_before_first = true;
            } else if p.head.is_none() {
                p.head = Some(None);
            }
            flow = Flow::default();
        }
        _ => {}
    });
    p.end = flow;
    p
}

/// Joins a thread's pieces in order: what crosses from one window to the next.
#[derive(Default)]
struct Joiner {
    flow: Flow,
    counts: Counts,
}

impl Joiner {
    fn join(&mut self, p: Piece, linker: &mut Linker<'_>) {
        if p.reset_before_first {
            self.flow = Flow::default();
        }
        let Some(first) = p.first else {
            self.counts.add(p.counts);
            return;
        };
        // Where the run open at `first` began.
        let start = match self.flow.last {
            Some(last) => {
                let (branch, ends) = step(last, first);
                if ends {
                    if branch {
                        linker.branch(&mut self.counts, last.0, first);
                        if let Some(s) = self.flow.run_start {
                            linker.run(&mut self.counts, s, last.0);
                        }
                    }
                    first
                } else {
                    self.flow.run_start.unwrap_or(first)
                }
            }
            None => first,
        };
        if let Some(Some(end)) = p.head {
            linker.run(&mut self.counts, start, end);
        }
        self.counts.add(p.counts);
        self.flow = match p.head {
            // The first run is still open at the window's end.
            None => Flow {
                last: p.end.last,
                run_start: Some(start),
            },
            Some(_) => p.end,
        };
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
        None => {
            // The program `run` started, as its last `execve` left it (`sh -c 'exec prog'`,
            // wrapper scripts): the latest image of the first process.
            let first = trace.threads.iter().min_by_key(|t| t.header.start_tsc);
            let last_image = first.and_then(|f| {
                trace
                    .threads
                    .iter()
                    .filter(|t| t.header.pid == f.header.pid)
                    .max_by_key(|t| t.header.start_tsc)
            });
            let exe = last_image
                .and_then(|th| trace.process_of(th))
                .and_then(|p| main_executable(p, sysroot))
                .ok_or("cannot tell the traced program's executable: give it with --binary")?;
            eprintln!(
                "pttrace profile: profiling {} (the traced program; another binary: --binary)",
                exe.display()
            );
            exe
        }
    };
    let module = pttrace_symbols::Module::open(&binary, &Default::default())
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    let mut by_image: HashMap<(i32, u64), Vec<Placed>> = HashMap::new();
    let mut counts = Counts::default();
    let mut overflows = 0u64;
    let mut threads = 0usize;
    // Windows are decoded on this many threads (and joined in order here).
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    for th in &trace.threads {
        let key = (th.header.pid, th.header.nonce);
        let placed = by_image
            .entry(key)
            .or_insert_with(|| {
                trace
                    .process_of(th)
                    .map(|p| placements(p, &binary, &module, sysroot))
                    .unwrap_or_default()
            })
            .clone();
        if placed.is_empty() {
            continue;
        }
        threads += 1;
        let per_instruction = args.format == ProfileFormat::Lcov;
        let linker = Linker {
            placed: &placed,
            near: placed[0],
        };
        let work = |_: &PttWindowInfo, dec: Option<&mut drpttracer::decode::PtDecoder<'_>>| {
            let mut linker = linker.clone();
            let Some(dec) = dec else {
                return Ok((Piece::default(), 0u64));
            };
            let mut overflows = 0u64;
            let piece = count_piece(
                &mut |f| {
                    dec.for_each_slice(|records| {
                        for r in records {
                            if let Record::Overflow { .. } = r {
                                overflows += 1;
                            }
                            f(r);
                        }
                        std::ops::ControlFlow::<()>::Continue(())
                    });
                },
                &mut linker,
                per_instruction,
            );
            Ok::<_, DecodeError>((piece, overflows))
        };
        let mut joiner = Joiner::default();
        let mut joining = linker.clone();
        trace.decode_thread_parallel(th, jobs, &work, &mut |_, (piece, ovf)| {
            overflows += ovf;
            joiner.join(piece, &mut joining);
            Ok(())
        })?;
        counts.add(joiner.counts);
    }
    if threads == 0 {
        return Err(format!(
            "{}: no thread of the trace ran it (give the binary as mapped with --binary)",
            binary.display()
        )
        .into());
    }
    let written = match args.format {
        ProfileFormat::Bolt => bolt::write(&args.out, &binary, &counts)
            .map_err(|e| format!("{}: {e}", args.out.display()))?,
        ProfileFormat::Lcov => lcov::write(&args.out, &binary, &args.debug_dir, &counts)?,
    };
    println!(
        "{}: {written}; {} of {} instructions were in {} ({})",
        args.out.display(),
        counts.in_binary,
        counts.total,
        binary.display(),
        crate::text::count(threads as u64, "thread")
    );
    if counts.in_binary.saturating_mul(10) < counts.total {
        eprintln!(
            "pttrace profile: note: most instructions ran outside {} (in a shared library, \
             such as a libpython built --enable-shared? name it with --binary)",
            binary.display()
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use drpttracer::decode::testgen::{instruction as insn, XorShift};

    /// A pseudo-random flow: branches of every class taken or not, calls out of the binary
    /// (above 0x5000) and back, transfers that do not come back, and losses.
    fn stream(seed: u64, n: usize) -> Vec<Record> {
        let mut rng = XorShift::new(seed + 1);
        let mut next = || rng.next_u64();
        let classes = [
            InsnClass::Other,
            InsnClass::Other,
            InsnClass::CondJump,
            InsnClass::Jump,
            InsnClass::Call,
            InsnClass::Return,
            InsnClass::FarCall,
        ];
        let mut out = Vec::new();
        let mut pc = 0x1000u64;
        for _ in 0..n {
            if next() % 23 == 0 {
                out.push(Record::Overflow { ip: None });
            }
            let class = classes[(next() % classes.len() as u64) as usize];
            let size = 1 + (next() % 5) as u8;
            out.push(insn(pc, size, class));
            let fall = pc + u64::from(size);
            pc = match (class, next() % 4) {
                (InsnClass::Other | InsnClass::FarCall, 0) if next() % 5 == 0 => {
                    0x1000 + next() % 64
                }
                (InsnClass::Other | InsnClass::FarCall, _) => fall,
                (InsnClass::CondJump, 0 | 1) => fall,
                (_, 3) => 0x5000 + next() % 16,
                _ => 0x1000 + next() % 64,
            };
        }
        out
    }

    fn counted(pieces: &[&[Record]]) -> Counts {
        let placed = [Placed {
            start: 0x1000,
            end: 0x2000,
            delta: 0x40_0000,
        }];
        let mut linker = Linker {
            placed: &placed,
            near: placed[0],
        };
        let mut joiner = Joiner::default();
        for recs in pieces {
            let piece = count_piece(
                &mut |f| recs.iter().for_each(&mut *f),
                &mut linker.clone(),
                true,
            );
            joiner.join(piece, &mut linker);
        }
        joiner.counts
    }

    fn sorted(m: &AddrMap<(u64, u64)>) -> Vec<((u64, u64), u64)> {
        let mut v: Vec<_> = m.iter().map(|(k, n)| (*k, *n)).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn windows_joined_in_order_count_as_one_stream() {
        for seed in 0..40 {
            let recs = stream(seed, 200);
            let whole = counted(&[&recs]);
            assert!(!whole.branches.is_empty() && !whole.runs.is_empty());
            for cut in 0..=recs.len() {
                let (a, b) = recs.split_at(cut);
                let split = counted(&[a, b]);
                assert_eq!(
                    sorted(&split.branches),
                    sorted(&whole.branches),
                    "seed {seed} cut {cut}"
                );
                assert_eq!(
                    sorted(&split.runs),
                    sorted(&whole.runs),
                    "seed {seed} cut {cut}"
                );
                assert_eq!(
                    (split.total, split.in_binary),
                    (whole.total, whole.in_binary)
                );
            }
            // Every record a window of its own.
            let each: Vec<&[Record]> = recs.chunks(1).collect();
            let split = counted(&each);
            assert_eq!(
                sorted(&split.branches),
                sorted(&whole.branches),
                "seed {seed}"
            );
            assert_eq!(sorted(&split.runs), sorted(&whole.runs), "seed {seed}");
        }
    }

    #[test]
    fn a_loop_counts_its_branches_and_runs() {
        // 0x1000: 3 x (2-byte op; jcc back to 0x1000 taken twice, then falls to a ret).
        let mut recs = Vec::new();
        for k in 0..3 {
            recs.push(insn(0x1000, 2, InsnClass::Other));
            recs.push(insn(0x1002, 2, InsnClass::CondJump));
            if k == 2 {
                recs.push(insn(0x1004, 1, InsnClass::Return));
                recs.push(insn(0x5000, 1, InsnClass::Other));
            }
        }
        let c = counted(&[&recs]);
        assert_eq!(sorted(&c.branches), vec![((0x40_1002, 0x40_1000), 2)]);
        assert_eq!(
            sorted(&c.runs),
            vec![((0x40_1000, 0x40_1002), 2), ((0x40_1000, 0x40_1004), 1)]
        );
        assert_eq!((c.total, c.in_binary), (8, 7));
    }
}
