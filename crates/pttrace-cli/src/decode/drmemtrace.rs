//! `pttrace decode DIR --format drmemtrace --out OUT`: DynamoRIO's drmemtrace offline
//! trace, one `.zip` per thread image (members `chunk.NNNNNNNN` of packed `trace_entry_t`
//! records, [`drpttracer::format::drmemtrace`]), which DynamoRIO's analyzers read
//! (`drmemtrace_launcher -indir OUT -tool basic_counts|opcode_mix|view|invariant_checker`,
//! drcachesim's cache simulator).
//!
//! From the decoded flow, with one instruction of lookahead: a conditional branch is taken
//! when the flow does not fall through; an indirect branch gets the target the flow went
//! to; a `syscall` is followed by its number (the thread window it ended); a signal
//! delivered between instructions (the QEMU backend's asynchronous transfer) is a kernel
//! event, its sigreturn a kernel transfer back; anything else discontinuous (a gap, an
//! overflow, a jump no instruction explains) starts a new window, which the analyzers take
//! as a discontinuity. Instruction-only (no data addresses: PT has none), unless the QEMU
//! backend recorded loads and stores (`run --memory`): then each instruction is followed
//! by its reads and writes, as QEMU reported them.
//!
//! Timestamps are microseconds since 1601: the trace's TSC converted with the process's
//! clock records, placed so that its last clock record falls at the info file's
//! modification time (the process's end); without clock records they are synthetic (one
//! microsecond per thousand instructions from that time).

use std::io::Write;
use std::path::{Path, PathBuf};

use drpttracer::decode::ptt_dir::{self as ptt_input, PttWindowInfo};
use drpttracer::decode::{DecodeError, InsnClass, Record};
use iced_x86::{Decoder, DecoderOptions, OpKind};
use pttrace_format::drmemtrace::{self as dm, filetype, Kind, ThreadWriter};

use super::DecodeArgs;
use crate::CmdResult;

/// rt_sigreturn: the end of a signal handler.
const SYS_RT_SIGRETURN: u64 = 15;

/// Writes every thread of `trace` into `out` (a new or empty directory).
pub fn write_dir(trace: &ptt_input::PttTrace, path: &Path, args: &DecodeArgs) -> CmdResult {
    let out = out_dir(args)?;
    let (mut damages, _) = crate::tracedir::of_trace(path);
    damages.add_skipped(&trace.skipped);
    // An image's info file is read once for all its threads: its clock, and whether
    // loads and stores were recorded.
    let mut clocks: std::collections::HashMap<PathBuf, (Option<Clock>, bool)> = Default::default();
    for p in &trace.processes {
        clocks
            .entry(p.path.clone())
            .or_insert_with(|| Clock::of(&p.path));
    }
    // Thread files are independent: each is converted on one of the workers, which take
    // the next file not taken; what they found is then taken in the trace's order.
    let workers = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let done = drpttracer::decode::parallel::on_workers(
        trace.threads.len(),
        workers,
        || (),
        |_, k| {
            let th = trace.threads.get(k).ok_or("no such thread file")?;
            convert_thread(trace, th, out, &clocks)
        },
    );
    let mut overflows = 0u64;
    let mut written = Vec::new();
    for (th, converted) in trace.threads.iter().zip(done) {
        let c = converted.ok_or_else(|| format!("{}: not converted", th.path.display()))??;
        overflows += c.overflows;
        for what in c.unjoined {
            damages.add_whole(crate::text::printable(&th.path.display().to_string()), what);
        }
        if c.instructions > 0 {
            written.push((c.file, c.instructions));
        }
    }
    print_written(out, &written);
    damages.note_overflows(overflows);
    damages.finish("decode", args.policy)
}

/// What converting one thread file gave.
struct Converted {
    file: PathBuf,
    instructions: u64,
    overflows: u64,
    /// Accesses that joined no instruction, per window.
    unjoined: Vec<String>,
}

/// Converts one thread file into its `.zip` in `out`.
fn convert_thread(
    trace: &ptt_input::PttTrace,
    th: &ptt_input::PttThread,
    out: &Path,
    clocks: &std::collections::HashMap<PathBuf, (Option<Clock>, bool)>,
) -> Result<Converted, String> {
    let h = &th.header;
    let proc_ = trace.process_of(th);
    let comm = proc_
        .map(|p| crate::view::basename(&p.cmdline))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "thread".to_string());
    let (clock, memory) = proc_
        .and_then(|p| clocks.get(&p.path).copied())
        .unwrap_or((None, false));
    let file = out.join(format!(
        "drmemtrace.{}.{}.{:08x}.trace.zip",
        file_part(&comm),
        h.tid,
        h.nonce
    ));
    let mut conv = Converter::new(h.tid as u64, h.pid as u64, clock, file.clone());
    conv.memory = memory;
    let (mut overflows, mut unjoined) = (0u64, Vec::new());
    trace
        .decode_thread(th, &mut |w: &PttWindowInfo, dec| {
            conv.window_nr = Some(w.nr);
            let Some(dec) = dec else { return Ok(()) };
            let mut join = drpttracer::decode::accesses::AccessJoin::new(&w.memory);
            // (Records visited where the decoder keeps them, not copied one by one.)
            drpttracer::decode::TraceDecoder::for_each_slice(dec, |recs| {
                for r in recs {
                    if let Record::Overflow { .. } = r {
                        overflows += 1;
                    }
                    if let Record::Instruction(i) = r {
                        join.of(i.pc, &mut conv.accesses);
                    }
                    conv.record(r);
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
            unjoined.extend(join.left_out(w.index));
            Ok::<(), DecodeError>(())
        })
        .map_err(|e| e.to_string())?;
    let instructions = conv
        .finish()
        .map_err(|e| format!("{}: cannot write: {e}", file.display()))?;
    Ok(Converted {
        file,
        instructions,
        overflows,
        unjoined,
    })
}

/// `--out DIR`, created, when it is new or empty (DynamoRIO's analyzers read every file of
/// the directory as a thread).
pub(super) fn out_dir(args: &DecodeArgs) -> Result<&Path, Box<dyn std::error::Error>> {
    let out = args
        .out
        .as_ref()
        .ok_or("--format drmemtrace writes files: give the directory with --out DIR")?;
    if out.exists()
        && std::fs::read_dir(out)
            .map_err(|e| format!("{}: {e}", out.display()))?
            .next()
            .is_some()
    {
        return Err(format!(
            "{}: not empty: DynamoRIO's analyzers read every file of the directory as a \
             thread; give a new or empty directory",
            out.display()
        )
        .into());
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// `s` as part of a file name: characters other than ASCII letters, digits, `_` and `-`
/// become `_`.
fn file_part(s: &str) -> String {
    s.replace(
        |c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-',
        "_",
    )
}

/// The lines that end every `--format drmemtrace`: each file written, how to read them.
fn print_written(out: &Path, written: &[(PathBuf, u64)]) {
    for (file, n) in written {
        println!("{}: {n} instructions", file.display());
    }
    println!(
        "read with: drmemtrace_launcher -indir {} -tool basic_counts (DynamoRIO: scripts/dynamorio.sh)",
        out.display()
    );
}

/// One thread's drmemtrace file from an input that is not a trace directory (raw PT with
/// sideband, a perf AUXTRACE stream, DynamoRIO's `.raw.pt`, a single thread file): the
/// records of its windows in order, syscalls without numbers (the input has none).
pub(super) struct SingleThread {
    conv: Converter,
    out: PathBuf,
}

impl SingleThread {
    /// Writes into `out` (see [`out_dir`]) a file named after the input `name`, for thread
    /// `tid` of process `pid`.
    pub(super) fn new(out: &Path, name: &str, tid: u64, pid: u64) -> Self {
        let file = out.join(format!("drmemtrace.{}.{tid}.trace.zip", file_part(name)));
        let mut conv = Converter::new(tid, pid, None, file);
        conv.syscall_numbers = false;
        SingleThread {
            conv,
            out: out.to_path_buf(),
        }
    }

    pub(super) fn record(&mut self, r: &Record) {
        self.conv.record(r);
    }

    /// Ends the file and says what was written.
    pub(super) fn finish(self) -> std::io::Result<()> {
        let file = self.conv.file.clone();
        let n = self.conv.finish()?;
        let written = if n > 0 { vec![(file, n)] } else { Vec::new() };
        print_written(&self.out, &written);
        Ok(())
    }
}

/// TSC to microseconds since 1601, from a process's clock records.
#[derive(Clone, Copy)]
struct Clock {
    /// The last clock record's TSC and when it was (µs since 1601).
    tsc_end: u64,
    us_end: u64,
    /// TSC ticks per microsecond (`None`: no two clock records; synthetic time).
    per_us: Option<f64>,
}

impl Clock {
    /// The clock of the image whose info file is `info`, and whether its loads and stores
    /// were recorded.
    fn of(info: &Path) -> (Option<Clock>, bool) {
        match drpttracer::format::summary::summarize_process(info) {
            Ok(p) => (
                Self::of_summary(info, &p),
                p.config.lines().any(|l| l == "PTTRACER_MEMORY=on"),
            ),
            Err(_) => (None, false),
        }
    }

    fn of_summary(info: &Path, p: &drpttracer::format::summary::ProcessSummary) -> Option<Clock> {
        let mtime = std::fs::metadata(info).ok()?.modified().ok()?;
        let unix_us = mtime
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_micros() as u64;
        let us_end = unix_us + dm::UNIX_EPOCH_US;
        let (first, last) = (p.clocks.first()?, p.clocks.last()?);
        let per_us = (last.0 > first.0 && last.1 > first.1)
            .then(|| (last.1 - first.1) as f64 * 1000.0 / (last.0 - first.0) as f64);
        Some(Clock {
            tsc_end: last.1,
            us_end,
            per_us,
        })
    }

    fn us(&self, tsc: u64) -> Option<u64> {
        let per_us = self.per_us?;
        let back = self.tsc_end.saturating_sub(tsc) as f64 / per_us;
        Some(self.us_end.saturating_sub(back as u64))
    }
}

/// The last instruction read, written once its successor is known.
struct Pending {
    pc: u64,
    /// The encoding (`len` bytes), zero padded.
    bytes: [u8; 15],
    len: usize,
    class: InsnClass,
    /// Its syscall number, when it is the syscall that ended a window.
    syscall: Option<u64>,
    /// Its loads and stores.
    accesses: Vec<pttrace_format::memory::Access>,
}

/// One thread's records into a [`ThreadWriter`].
struct Converter {
    tid: u64,
    pid: u64,
    clock: Option<Clock>,
    writer: Option<ThreadWriter>,
    /// The thread's `.zip`, its current member open (created with the first instruction).
    zip: Option<ZipOut>,
    /// Where the `.zip` goes.
    file: PathBuf,
    /// The first error writing it.
    error: Option<std::io::Error>,
    /// The last instruction read (when `has_pending`).
    pending: Pending,
    has_pending: bool,
    /// Trace lost since the pending instruction.
    lost: bool,
    /// A signal delivered after the pending instruction: the pc it interrupted.
    signal: Option<u64>,
    /// Tracing stopped asynchronously before this pc (PT's TIP.PGD after a FUP: an
    /// interrupt or a signal's delivery), and the pc it was at.
    left_at: Option<u64>,
    /// Kernel events not yet returned from (the pcs they interrupted).
    events: Vec<u64>,
    window_nr: Option<u64>,
    ts: u64,
    cpu: u64,
    time_moved: bool,
    instructions: u64,
    /// The trace has loads and stores (not instruction-only).
    memory: bool,
    /// Syscalls are followed by their numbers (the trace knows them).
    syscall_numbers: bool,
    /// The loads and stores of the instruction read next.
    accesses: Vec<pttrace_format::memory::Access>,
    known: Known,
    /// The read and the write ranges of the instruction being written.
    ranges: [Vec<(u64, u64)>; 2],
}

impl Converter {
    fn new(tid: u64, pid: u64, clock: Option<Clock>, file: PathBuf) -> Self {
        let ts = clock.map_or(dm::UNIX_EPOCH_US, |c| c.us_end);
        Converter {
            tid,
            pid,
            clock,
            writer: None,
            zip: None,
            file,
            error: None,
            pending: Pending {
                pc: 0,
                bytes: [0; 15],
                len: 0,
                class: InsnClass::Other,
                syscall: None,
                accesses: Vec::new(),
            },
            has_pending: false,
            lost: false,
            signal: None,
            left_at: None,
            events: Vec::new(),
            window_nr: None,
            ts,
            cpu: u64::MAX,
            time_moved: false,
            instructions: 0,
            memory: false,
            syscall_numbers: true,
            accesses: Vec::new(),
            known: Known::default(),
            ranges: Default::default(),
        }
    }

    fn record(&mut self, r: &Record) {
        match r {
            Record::Instruction(i) => {
                self.instruction(i.pc, &i.bytes, usize::from(i.size).min(15), i.class)
            }
            Record::Syscall { pc } => {
                let nr = self.window_nr;
                if self.has_pending && self.pending.pc == *pc {
                    self.pending.syscall = nr;
                }
            }
            Record::Gap(_) | Record::Overflow { .. } => self.lost = true,
            Record::InterruptFlag { .. } => {}
            Record::KernelXfer { from, .. } => self.signal = Some(*from),
            Record::TraceDisabled { ip: Some(at) } => self.left_at = Some(*at),
            Record::Timestamp { tsc, .. } => {
                if let Some(us) = self.clock.and_then(|c| c.us(*tsc)) {
                    self.ts = self.ts.max(us);
                    self.time_moved = true;
                }
            }
            Record::Cpu(c) => self.cpu = u64::from(*c),
            Record::WindowId(_) | Record::TraceEnabled { .. } | Record::TraceDisabled { .. } => {}
        }
    }

    /// The instruction at `pc`, its encoding `bytes[..len]` (zero padded).
    fn instruction(&mut self, pc: u64, bytes: &[u8; 15], len: usize, class: InsnClass) {
        // Left asynchronously at one pc and back at another: a signal's handler.
        if let Some(at) = self.left_at.take().filter(|&at| at != pc) {
            self.signal.get_or_insert(at);
        }
        let flow_next = self.signal.unwrap_or(pc);
        let written = std::mem::take(&mut self.has_pending).then(|| self.write(Some(flow_next)));
        let expected = written.map(|(e, _)| e);
        // A signal delivered as a syscall returned (QEMU delivers them there): the flow
        // goes on in the handler instead of after the syscall.
        let at_syscall = written.is_some_and(|(e, syscall)| syscall && e != pc);
        if self.clock.and_then(|c| c.per_us).is_none() {
            // Synthetic time: a microsecond per thousand instructions.
            self.ts = self
                .ts
                .max(self.clock.map_or(dm::UNIX_EPOCH_US, |c| c.us_end) + self.instructions / 1000);
        }
        let (memory, numbers) = (self.memory, self.syscall_numbers);
        let w = self.writer.get_or_insert_with(|| {
            let mut ft = filetype::ARCH_X86_64 | filetype::ENCODINGS;
            if numbers {
                ft |= filetype::SYSCALL_NUMBERS;
            }
            if !memory {
                ft |= filetype::DFILTERED | filetype::INSTRUCTION_ONLY;
            }
            ThreadWriter::new(
                self.tid,
                self.pid,
                ft,
                dm::CHUNK_INSTRUCTIONS,
                self.ts,
                self.cpu,
            )
        });
        if std::mem::take(&mut self.time_moved) {
            w.timestamp(self.ts, self.cpu);
        }
        let lost = std::mem::take(&mut self.lost);
        match (self.signal.take(), expected) {
            (Some(from), Some(e)) if !lost && e == from => {
                w.kernel_event(from, None);
                self.events.push(from);
            }
            (None, Some(e)) if !lost && at_syscall => {
                w.kernel_event(e, None);
                self.events.push(e);
            }
            (Some(_), _) => w.gap(self.ts),
            (None, Some(e)) if lost || e != pc => w.gap(self.ts),
            _ if lost => w.gap(self.ts),
            _ => {}
        }
        self.stream();
        let p = &mut self.pending;
        (p.pc, p.bytes, p.len, p.class, p.syscall) = (pc, *bytes, len, class, None);
        // The accesses joined to it (`write` left `p.accesses` empty).
        std::mem::swap(&mut p.accesses, &mut self.accesses);
        self.has_pending = true;
    }

    /// Writes the pending instruction now that the flow after it is known (`None`: the
    /// thread ended); returns the pc it should be followed by, and whether it is a syscall
    /// other than a sigreturn.
    fn write(&mut self, next: Option<u64>) -> (u64, bool) {
        let p = &mut self.pending;
        let bytes = &p.bytes[..p.len];
        let fall = p.pc.wrapping_add(p.len as u64);
        // Direct or not, and the target: looked up for jumps and calls only (the rest need
        // neither).
        let (direct, target) = match p.class {
            InsnClass::CondJump | InsnClass::Jump | InsnClass::Call => {
                let k = self.known.of(p.pc, &p.bytes, p.len);
                (k.direct, k.target)
            }
            _ => (false, 0),
        };
        // Where an indirect branch went (non-zero; at the thread's end, unknown).
        let went = next.unwrap_or(p.pc).max(1);
        let (kind, expected) = match p.class {
            InsnClass::CondJump => {
                let taken = next.is_some_and(|n| n != fall);
                (
                    Kind::Conditional { taken },
                    if taken { target } else { fall },
                )
            }
            InsnClass::Jump if direct => (Kind::DirectJump, target),
            InsnClass::Call if direct => (Kind::DirectCall, target),
            InsnClass::Jump => (Kind::IndirectJump { target: went }, went),
            InsnClass::Call => (Kind::IndirectCall { target: went }, went),
            InsnClass::Return => (Kind::Return { target: went }, went),
            _ => (Kind::Other, fall),
        };
        let syscall = bytes == [0x0f, 0x05] && p.syscall != Some(SYS_RT_SIGRETURN);
        let Some(w) = self.writer.as_mut() else {
            p.accesses.clear();
            return (expected, syscall);
        };
        w.instruction_padded(p.pc, &p.bytes, p.len, kind);
        if !p.accesses.is_empty() {
            let operands = self.known.of(p.pc, &p.bytes, p.len).operands;
            operand_ranges(&p.accesses, operands, &mut self.ranges);
            for (store, ranges) in [(false, &self.ranges[0]), (true, &self.ranges[1])] {
                for &(at, size) in ranges {
                    w.data(at, size.min(u64::from(u16::MAX)) as u16, store);
                }
            }
        }
        p.accesses.clear();
        self.instructions += 1;
        if let Some(nr) = p.syscall {
            w.syscall(nr, self.ts);
            // A handler's sigreturn back to the instruction its signal interrupted (as the
            // kernel event said), or straight into the next signal's handler, delivered
            // there before that instruction ran.
            if let (SYS_RT_SIGRETURN, Some(back)) = (nr, self.events.pop()) {
                w.kernel_xfer(fall);
                if next.is_some_and(|n| n != back) {
                    w.kernel_event(back, None);
                    self.events.push(back);
                }
                return (next.unwrap_or(back), false);
            }
        }
        (expected, syscall)
    }

    /// Streams what the writer has into the `.zip` (every 1 MiB of records, and as chunks
    /// end).
    #[inline]
    fn stream(&mut self) {
        if self
            .writer
            .as_ref()
            .is_some_and(|w| w.pending_bytes() >= 1 << 20 || w.chunk_ended())
        {
            self.flush();
        }
    }

    #[cold]
    fn flush(&mut self) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let ended = w.take_chunks();
        if self.zip.is_none() && self.error.is_none() {
            match ZipOut::create(&self.file) {
                Ok(z) => self.zip = Some(z),
                Err(e) => self.error = Some(e),
            }
        }
        let Some(z) = self.zip.as_mut() else { return };
        let put = || -> std::io::Result<()> {
            for rest in ended {
                z.write(rest)?;
                z.next_member()?;
            }
            z.write(w.drain(z.spare()))
        };
        if let Err(e) = put() {
            self.error.get_or_insert(e);
        }
    }

    /// Ends the thread: its last instruction, the end records, the `.zip` closed.
    fn finish(mut self) -> std::io::Result<u64> {
        if std::mem::take(&mut self.has_pending) {
            self.write(None);
        }
        self.stream();
        let Some(w) = self.writer.take() else {
            return Ok(0);
        };
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let mut z = match self.zip.take() {
            Some(z) => z,
            None => ZipOut::create(&self.file)?,
        };
        let rest = w.finish();
        let last = rest.len().saturating_sub(1);
        for (k, c) in rest.into_iter().enumerate() {
            z.write(c)?;
            if k < last {
                z.next_member()?;
            }
        }
        z.finish()?;
        Ok(self.instructions)
    }
}

/// What writing needs of the instruction at a pc, decoded once per pc and encoding: a
/// branch's directness and target, and how many memory operands it reads, writes, and
/// reads and writes (DynamoRIO's `instr_num_memory_read_access`/`_write_access`).
#[derive(Default)]
struct Known(std::collections::HashMap<u64, Decoded, dm::BuildPcHasher>);

#[derive(Clone, Copy)]
struct Decoded {
    /// The encoding, zero padded, and its length.
    key: ([u8; 15], usize),
    /// A branch to an immediate target.
    direct: bool,
    /// That target (0 where there is none).
    target: u64,
    /// `None` where it does not decode.
    operands: Option<OperandCounts>,
}

/// Memory operands read, written, and both (the read-modify-write ones).
#[derive(Clone, Copy)]
struct OperandCounts {
    reads: usize,
    writes: usize,
    both: usize,
}

impl Known {
    /// The instruction `padded[..len]` (zero padded) at `pc`.
    fn of(&mut self, pc: u64, padded: &[u8; 15], len: usize) -> Decoded {
        match self.0.get(&pc) {
            Some(d) if d.key == (*padded, len) => *d,
            _ => {
                let d = decode(pc, &padded[..len.min(15)], (*padded, len));
                self.0.insert(pc, d);
                d
            }
        }
    }
}

fn decode(pc: u64, bytes: &[u8], key: ([u8; 15], usize)) -> Decoded {
    use iced_x86::{InstructionInfoFactory, Mnemonic, OpAccess};
    let insn = Decoder::with_ip(64, bytes, pc, DecoderOptions::NONE).decode();
    let direct = matches!(
        insn.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    );
    let mut d = Decoded {
        key,
        direct,
        target: insn.near_branch_target(),
        operands: None,
    };
    if insn.is_invalid() {
        return d;
    }
    let mut n = OperandCounts {
        reads: 0,
        writes: 0,
        both: 0,
    };
    for m in InstructionInfoFactory::new().info(&insn).used_memory() {
        // (reads, writes) of the operand.
        let (rd, wr) = match m.access() {
            OpAccess::Read | OpAccess::CondRead => (1, 0),
            OpAccess::Write | OpAccess::CondWrite => (0, 1),
            OpAccess::ReadWrite | OpAccess::ReadCondWrite => (1, 1),
            _ => (0, 0),
        };
        n.reads += rd;
        n.writes += wr;
        n.both += rd & wr;
    }
    // The xsave family only writes its area for DynamoRIO (the header it reads is no
    // operand of its own).
    if matches!(
        insn.mnemonic(),
        Mnemonic::Xsave
            | Mnemonic::Xsave64
            | Mnemonic::Xsaveopt
            | Mnemonic::Xsaveopt64
            | Mnemonic::Xsavec
            | Mnemonic::Xsavec64
            | Mnemonic::Xsaves
            | Mnemonic::Xsaves64
    ) {
        n.reads = 0;
    }
    d.operands = Some(n);
    d
}

/// An instruction's loads and stores as DynamoRIO records them: one record per memory
/// operand (its reads, then its writes). QEMU reports a wide access (16-byte SSE) as
/// 8-byte ones and a `rep` string instruction's accesses iteration by iteration: the
/// accesses of one kind that continue each other (up or down) are one range. Where more
/// ranges are left than the instruction has operands of that kind (`operands`: reads,
/// writes), the last operand gets the bounding range of the rest (xsave's area, written
/// in pieces); accesses of a kind it has no operand for are left out, as DynamoRIO's own
/// tracer has none (the header xsave reads). An atomic read-modify-write QEMU reports
/// once (as a store) is also the read of its operand.
fn operand_ranges(
    accesses: &[pttrace_format::memory::Access],
    operands: Option<OperandCounts>,
    out: &mut [Vec<(u64, u64)>; 2],
) {
    for (ranges, store) in out.iter_mut().zip([false, true]) {
        ranges.clear();
        for a in accesses.iter().filter(|a| a.store == store) {
            let (lo, hi) = (a.addr, a.addr.wrapping_add(a.size()));
            match ranges
                .iter_mut()
                .find(|(at, size)| at.wrapping_add(*size) == lo || hi == *at)
            {
                Some((at, size)) => {
                    *at = (*at).min(lo);
                    *size += a.size();
                }
                None => ranges.push((lo, a.size())),
            }
        }
    }
    let Some(ops) = operands else { return };
    // The read-modify-write operands one kind is missing: the other kind's ranges.
    for (to, from) in [(0, 1), (1, 0)] {
        let want = if to == 0 { ops.reads } else { ops.writes };
        let missing = want.saturating_sub(out[to].len()).min(ops.both);
        for k in 0..missing.min(out[from].len()) {
            let r = out[from][k];
            out[to].push(r);
        }
    }
    for (r, n) in out.iter_mut().zip([ops.reads, ops.writes]) {
        if r.len() > n {
            // The last operand: the bounding range of the rest.
            let first = n.saturating_sub(1);
            let lo = r[first..].iter().map(|x| x.0).min().unwrap_or(0);
            let hi = r[first..]
                .iter()
                .map(|x| x.0.wrapping_add(x.1))
                .max()
                .unwrap_or(lo);
            r.truncate(first);
            if n > 0 {
                r.push((lo, hi.wrapping_sub(lo)));
            }
        }
    }
}

/// A thread's `.zip`: members `chunk.00000000`, `chunk.00000001`, … (deflated), compressed
/// and written on a thread of its own while the next records are decoded. At most two
/// buffers wait for it; it hands each back emptied, for the writer to fill again.
struct ZipOut {
    /// The archive, named once complete ([`crate::outfile`]).
    out: Option<crate::outfile::OutFile>,
    to: Option<std::sync::mpsc::SyncSender<ZipPart>>,
    back: std::sync::mpsc::Receiver<Vec<u8>>,
    worker: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

enum ZipPart {
    Bytes(Vec<u8>),
    /// The next member begins.
    Member,
}

impl ZipOut {
    fn create(file: &Path) -> std::io::Result<ZipOut> {
        let out = crate::outfile::OutFile::create(file)?;
        let f = out.writer()?;
        let (to, parts) = std::sync::mpsc::sync_channel::<ZipPart>(2);
        let (give_back, back) = std::sync::mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("drmemtrace zip".into())
            .spawn(move || {
                let mut zip = zip::ZipWriter::new(std::io::BufWriter::with_capacity(1 << 20, f));
                let mut member = 0;
                start_member(&mut zip, member)?;
                for part in parts {
                    match part {
                        ZipPart::Bytes(b) => {
                            zip.write_all(&b)?;
                            // The writer may be gone (it stopped at an error of its own).
                            let _ = give_back.send(b);
                        }
                        ZipPart::Member => {
                            member += 1;
                            start_member(&mut zip, member)?;
                        }
                    }
                }
                zip.finish().map_err(std::io::Error::other)?.flush()
            })?;
        Ok(ZipOut {
            out: Some(out),
            to: Some(to),
            back,
            worker: Some(worker),
        })
    }

    /// An emptied buffer to write the next records into.
    fn spare(&self) -> Vec<u8> {
        self.back
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(2 << 20))
    }

    fn send(&mut self, part: ZipPart) -> std::io::Result<()> {
        match self.to.as_ref().map(|to| to.send(part)) {
            Some(Ok(())) => Ok(()),
            // The compressing thread stopped: its error.
            _ => Err(self
                .join()
                .err()
                .unwrap_or_else(|| std::io::Error::other("the compressing thread stopped early"))),
        }
    }

    fn write(&mut self, b: Vec<u8>) -> std::io::Result<()> {
        self.send(ZipPart::Bytes(b))
    }

    fn next_member(&mut self) -> std::io::Result<()> {
        self.send(ZipPart::Member)
    }

    /// Waits for the compressing thread (after its input ended): what it returned.
    fn join(&mut self) -> std::io::Result<()> {
        self.to = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the compressing thread panicked")),
            None => Err(std::io::Error::other(
                "the compressing thread stopped early",
            )),
        }
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.join()?;
        self.out
            .take()
            .map_or(Ok(()), crate::outfile::OutFile::commit)
    }
}

/// Starts member `n` (`chunk.NNNNNNNN`).
fn start_member(
    zip: &mut zip::ZipWriter<std::io::BufWriter<std::fs::File>>,
    n: usize,
) -> std::io::Result<()> {
    // Deflate at its fastest level: records compress well anyway (0.6 bytes per
    // instruction on python), and the default level made writing 15x decoding.
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(1))
        .large_file(true);
    zip.start_file(format!("chunk.{n:08}"), opts)
        .map_err(std::io::Error::other)
}
