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
    let mut overflows = 0u64;
    let mut unjoined: Vec<String> = Vec::new();
    let mut written = Vec::new();
    let mut clocks: std::collections::HashMap<PathBuf, (Option<Clock>, bool)> = Default::default();
    for th in &trace.threads {
        let h = &th.header;
        let proc_ = trace.process_of(th);
        let comm = proc_
            .map(|p| crate::view::basename(&p.cmdline))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "thread".to_string());
        // An image's info file is read once for all its threads: its clock, and whether
        // loads and stores were recorded.
        let (clock, memory) = proc_.map_or((None, false), |p| {
            *clocks
                .entry(p.path.clone())
                .or_insert_with(|| Clock::of(&p.path))
        });
        let file = out.join(format!(
            "drmemtrace.{}.{}.{:08x}.trace.zip",
            file_part(&comm),
            h.tid,
            h.nonce
        ));
        let mut conv = Converter::new(h.tid as u64, h.pid as u64, clock, file.clone());
        conv.memory = memory;
        trace.decode_thread(th, &mut |w: &PttWindowInfo, dec| {
            conv.window_nr = Some(w.nr);
            let Some(dec) = dec else { return Ok(()) };
            let mut join = drpttracer::decode::accesses::AccessJoin::new(&w.memory);
            for r in dec {
                if let Record::Overflow { .. } = r {
                    overflows += 1;
                }
                if let Record::Instruction(i) = &r {
                    join.of(i.pc, &mut conv.accesses);
                }
                conv.record(&r);
            }
            unjoined.extend(join.left_out(w.index));
            Ok::<(), DecodeError>(())
        })?;
        for what in unjoined.drain(..) {
            damages.add_whole(crate::text::printable(&th.path.display().to_string()), what);
        }
        let n = conv
            .finish()
            .map_err(|e| format!("{}: cannot write: {e}", file.display()))?;
        if n > 0 {
            written.push((file, n));
        }
    }
    print_written(out, &written);
    damages.note_overflows(overflows);
    damages.finish("decode", args.policy)
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
    bytes: [u8; 16],
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
    pending: Option<Pending>,
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
    /// The loads and stores of the instruction read next, and a buffer for the one after.
    accesses: Vec<pttrace_format::memory::Access>,
    spare: Vec<pttrace_format::memory::Access>,
    operands: Operands,
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
            pending: None,
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
            spare: Vec::new(),
            operands: Operands::default(),
        }
    }

    fn record(&mut self, r: &Record) {
        match r {
            Record::Instruction(i) => self.instruction(i.pc, i.encoding(), i.class),
            Record::Syscall { pc } => {
                let nr = self.window_nr;
                if let Some(p) = self.pending.as_mut().filter(|p| p.pc == *pc) {
                    p.syscall = nr;
                }
            }
            Record::Gap(_) | Record::Overflow { .. } => self.lost = true,
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

    fn instruction(&mut self, pc: u64, bytes: &[u8], class: InsnClass) {
        // Left asynchronously at one pc and back at another: a signal's handler.
        if let Some(at) = self.left_at.take().filter(|&at| at != pc) {
            self.signal.get_or_insert(at);
        }
        let flow_next = self.signal.unwrap_or(pc);
        let written = self.pending.take().map(|p| self.write(p, Some(flow_next)));
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
        let mut b = [0u8; 16];
        let len = bytes.len().min(15);
        b[..len].copy_from_slice(&bytes[..len]);
        let accesses = std::mem::replace(&mut self.accesses, std::mem::take(&mut self.spare));
        self.pending = Some(Pending {
            pc,
            bytes: b,
            len,
            class,
            syscall: None,
            accesses,
        });
    }

    /// Writes `p` now that the flow after it is known (`None`: the thread ended); returns
    /// the pc it should be followed by, and whether it is a syscall other than a sigreturn.
    fn write(&mut self, mut p: Pending, next: Option<u64>) -> (u64, bool) {
        let bytes = &p.bytes[..p.len];
        let fall = p.pc.wrapping_add(p.len as u64);
        // Direct or not, and the target: decoded for jumps and calls only (the rest need
        // neither, and decoding every instruction would cost more than the rest together).
        let (direct, target) = match p.class {
            InsnClass::CondJump | InsnClass::Jump | InsnClass::Call => {
                let d = Decoder::with_ip(64, bytes, p.pc, DecoderOptions::NONE).decode();
                let direct = matches!(
                    d.op0_kind(),
                    OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
                );
                (direct, d.near_branch_target())
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
            return (expected, syscall);
        };
        w.instruction(p.pc, bytes, kind);
        if !p.accesses.is_empty() {
            let operands = self.operands.of(p.pc, bytes);
            for (store, ranges) in operand_ranges(&p.accesses, operands) {
                for (at, size) in ranges {
                    w.data(at, size.min(u64::from(u16::MAX)) as u16, store);
                }
            }
        }
        p.accesses.clear();
        self.spare = std::mem::take(&mut p.accesses);
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
    fn stream(&mut self) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let ended = w.take_chunks();
        if ended.is_empty() && w.pending_bytes() < 1 << 20 {
            return;
        }
        if self.zip.is_none() && self.error.is_none() {
            match ZipOut::create(&self.file) {
                Ok(z) => self.zip = Some(z),
                Err(e) => self.error = Some(e),
            }
        }
        let Some(z) = self.zip.as_mut() else { return };
        let put = || -> std::io::Result<()> {
            for rest in ended {
                z.write(&rest)?;
                z.next_member()?;
            }
            z.write(&w.drain())
        };
        if let Err(e) = put() {
            self.error.get_or_insert(e);
        }
    }

    /// Ends the thread: its last instruction, the end records, the `.zip` closed.
    fn finish(mut self) -> std::io::Result<u64> {
        if let Some(p) = self.pending.take() {
            self.write(p, None);
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
        for (k, c) in rest.iter().enumerate() {
            z.write(c)?;
            if k < last {
                z.next_member()?;
            }
        }
        z.finish()?;
        Ok(self.instructions)
    }
}

/// How many memory operands an instruction reads, writes, and reads and writes (DynamoRIO's
/// `instr_num_memory_read_access`/`_write_access`), decoded once per pc and encoding.
#[derive(Default)]
struct Operands(std::collections::HashMap<u64, ([u8; 16], u8, u8, u8)>);

/// Memory operands read, written, and both (the read-modify-write ones).
#[derive(Clone, Copy)]
struct OperandCounts {
    reads: usize,
    writes: usize,
    both: usize,
}

impl Operands {
    /// The operands of the instruction `bytes` at `pc`; `None` where it does not decode.
    fn of(&mut self, pc: u64, bytes: &[u8]) -> Option<OperandCounts> {
        use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, Mnemonic, OpAccess};
        let mut key = [0u8; 16];
        let len = bytes.len().min(16);
        key[..len].copy_from_slice(&bytes[..len]);
        let counts = |r: u8, w: u8, b: u8| {
            (r != u8::MAX).then_some(OperandCounts {
                reads: usize::from(r),
                writes: usize::from(w),
                both: usize::from(b),
            })
        };
        if let Some(&(k, r, w, b)) = self.0.get(&pc) {
            if k == key {
                return counts(r, w, b);
            }
        }
        let insn = Decoder::with_ip(64, bytes, pc, DecoderOptions::NONE).decode();
        let (mut r, mut w, mut b) = (0u8, 0u8, 0u8);
        if insn.is_invalid() {
            r = u8::MAX;
        } else {
            for m in InstructionInfoFactory::new().info(&insn).used_memory() {
                // (reads, writes) of the operand.
                let (rd, wr) = match m.access() {
                    OpAccess::Read | OpAccess::CondRead => (1, 0),
                    OpAccess::Write | OpAccess::CondWrite => (0, 1),
                    OpAccess::ReadWrite | OpAccess::ReadCondWrite => (1, 1),
                    _ => (0, 0),
                };
                r = r.saturating_add(rd);
                w = w.saturating_add(wr);
                b = b.saturating_add(rd & wr);
            }
            // The xsave family only writes its area for DynamoRIO (the header it reads
            // is no operand of its own).
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
                r = 0;
            }
        }
        self.0.insert(pc, (key, r, w, b));
        counts(r, w, b)
    }
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
) -> [(bool, Vec<(u64, u64)>); 2] {
    let ranges = |store: bool| {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for a in accesses.iter().filter(|a| a.store == store) {
            let (lo, hi) = (a.addr, a.addr.wrapping_add(a.size()));
            match out
                .iter_mut()
                .find(|(at, size)| at.wrapping_add(*size) == lo || hi == *at)
            {
                Some((at, size)) => {
                    *at = (*at).min(lo);
                    *size += a.size();
                }
                None => out.push((lo, a.size())),
            }
        }
        out
    };
    let mut both = [(false, ranges(false)), (true, ranges(true))];
    if let Some(ops) = operands {
        // The read-modify-write operands one kind is missing: the other kind's ranges.
        for (to, from) in [(0, 1), (1, 0)] {
            let want = if to == 0 { ops.reads } else { ops.writes };
            let missing = want.saturating_sub(both[to].1.len()).min(ops.both);
            let extra: Vec<(u64, u64)> = both[from].1.iter().take(missing).copied().collect();
            both[to].1.extend(extra);
        }
        for ((_, r), n) in both.iter_mut().zip([ops.reads, ops.writes]) {
            if r.len() > n {
                let rest = r.split_off(n.saturating_sub(1));
                if n > 0 {
                    let lo = rest.iter().map(|x| x.0).min().unwrap_or(0);
                    let hi = rest
                        .iter()
                        .map(|x| x.0.wrapping_add(x.1))
                        .max()
                        .unwrap_or(lo);
                    r.push((lo, hi.wrapping_sub(lo)));
                }
            }
        }
    }
    both
}

/// A thread's `.zip`: members `chunk.00000000`, `chunk.00000001`, … (deflated).
struct ZipOut {
    zip: zip::ZipWriter<std::io::BufWriter<std::fs::File>>,
    member: usize,
}

impl ZipOut {
    fn create(file: &Path) -> std::io::Result<ZipOut> {
        let f = std::fs::File::create(file)?;
        let mut z = ZipOut {
            zip: zip::ZipWriter::new(std::io::BufWriter::with_capacity(1 << 20, f)),
            member: 0,
        };
        z.start()?;
        Ok(z)
    }

    fn start(&mut self) -> std::io::Result<()> {
        // Deflate at its fastest level: records compress well anyway (0.6 bytes per
        // instruction on python), and the default level made writing 15x decoding.
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .compression_level(Some(1))
            .large_file(true);
        self.zip
            .start_file(format!("chunk.{:08}", self.member), opts)
            .map_err(std::io::Error::other)
    }

    fn write(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.zip.write_all(b)
    }

    fn next_member(&mut self) -> std::io::Result<()> {
        self.member += 1;
        self.start()
    }

    fn finish(self) -> std::io::Result<()> {
        self.zip.finish().map_err(std::io::Error::other)?.flush()
    }
}
