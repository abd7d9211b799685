//! DynamoRIO's drmemtrace offline trace, as its analyzers (`drmemtrace_launcher -indir`,
//! drcachesim's tools, the invariant checker) read it after raw2trace: per thread a stream
//! of packed 12-byte `trace_entry_t` records (u16 type, u16 size, u64 addr/value, little
//! endian), cut into chunks of a fixed number of instructions (the members of the thread's
//! `.zip`). Facts from DynamoRIO's `clients/drcachesim/common/trace_entry.h`, raw2trace and
//! reader, checked against the built analyzers.
//!
//! One thread's records, as [`ThreadWriter`] writes them:
//! ```text
//! HEADER(version) VERSION FILETYPE THREAD(tid) PID CACHE_LINE_SIZE CHUNK_INSTR_COUNT
//! PAGE_SIZE TIMESTAMP WINDOW_ID(0) CPU_ID
//!   per instruction: ENCODING… (the first time its pc is met in the chunk)
//!                    [BRANCH_TARGET (indirect branches: where it went)] INSTR-kind
//!                    [READ/WRITE… (its loads and stores, when the trace has them)]
//!   after a syscall: TIMESTAMP CPU_ID SYSCALL(number) TIMESTAMP CPU_ID (numbers known)
//!   a discontinuity: [TIMESTAMP] WINDOW_ID(+1) [CPU_ID] (no timestamp right after a branch)
//!   a signal:        KERNEL_EVENT(interrupted pc) … handler … KERNEL_XFER(after sigreturn)
//!   every N instructions: CHUNK_FOOTER(k) | RECORD_ORDINAL TIMESTAMP CPU_ID (next chunk)
//! THREAD_EXIT(tid) FOOTER
//! ```

/// `trace_type_t` values.
pub mod ty {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const INSTR: u16 = 10;
    pub const DIRECT_JUMP: u16 = 11;
    pub const INDIRECT_JUMP: u16 = 12;
    pub const DIRECT_CALL: u16 = 14;
    pub const INDIRECT_CALL: u16 = 15;
    pub const RETURN: u16 = 16;
    pub const THREAD: u16 = 22;
    pub const THREAD_EXIT: u16 = 23;
    pub const PID: u16 = 24;
    pub const HEADER: u16 = 25;
    pub const FOOTER: u16 = 26;
    pub const MARKER: u16 = 28;
    pub const ENCODING: u16 = 47;
    pub const TAKEN_JUMP: u16 = 48;
    pub const UNTAKEN_JUMP: u16 = 49;
}

/// `trace_marker_type_t` values (the `size` field of a `MARKER`).
pub mod marker {
    pub const KERNEL_EVENT: u16 = 0;
    pub const KERNEL_XFER: u16 = 1;
    pub const TIMESTAMP: u16 = 2;
    pub const CPU_ID: u16 = 3;
    pub const FILETYPE: u16 = 9;
    pub const CACHE_LINE_SIZE: u16 = 10;
    pub const VERSION: u16 = 12;
    pub const WINDOW_ID: u16 = 14;
    pub const PAGE_SIZE: u16 = 18;
    pub const CHUNK_INSTR_COUNT: u16 = 20;
    pub const CHUNK_FOOTER: u16 = 21;
    pub const RECORD_ORDINAL: u16 = 22;
    pub const SYSCALL: u16 = 25;
    pub const BRANCH_TARGET: u16 = 29;
    pub const SIGNAL_NUMBER: u16 = 40;
}

/// `offline_file_type_t` bits.
pub mod filetype {
    /// No data references in the trace.
    pub const INSTRUCTION_ONLY: u64 = 0x4;
    pub const ARCH_X86_64: u64 = 0x40;
    /// Data references left out (the invariant checker then expects none).
    pub const DFILTERED: u64 = 0x100;
    /// Instruction encodings are in the trace.
    pub const ENCODINGS: u64 = 0x200;
    /// Every syscall is followed by a `SYSCALL` marker with its number.
    pub const SYSCALL_NUMBERS: u64 = 0x400;
}

/// `TRACE_ENTRY_VERSION_RETIRED_INSTRUCTIONS_ONLY`, the newest version.
pub const VERSION: u64 = 7;
/// Instructions per chunk (raw2trace's default).
pub const CHUNK_INSTRUCTIONS: u64 = 10_000_000;
/// Microseconds from 1601-01-01 (the timestamps' epoch) to 1970-01-01.
pub const UNIX_EPOCH_US: u64 = 11_644_473_600_000_000;
/// Bytes of a record.
pub const ENTRY_SIZE: usize = 12;

/// What kind of instruction a record says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Not a branch (a syscall too).
    Other,
    /// A conditional branch, and whether it was taken.
    Conditional {
        taken: bool,
    },
    DirectJump,
    DirectCall,
    /// An indirect jump, call or return, and where it went.
    IndirectJump {
        target: u64,
    },
    IndirectCall {
        target: u64,
    },
    Return {
        target: u64,
    },
}

impl Kind {
    fn record_type(self) -> u16 {
        match self {
            Kind::Other => ty::INSTR,
            Kind::Conditional { taken: true } => ty::TAKEN_JUMP,
            Kind::Conditional { taken: false } => ty::UNTAKEN_JUMP,
            Kind::DirectJump => ty::DIRECT_JUMP,
            Kind::DirectCall => ty::DIRECT_CALL,
            Kind::IndirectJump { .. } => ty::INDIRECT_JUMP,
            Kind::IndirectCall { .. } => ty::INDIRECT_CALL,
            Kind::Return { .. } => ty::RETURN,
        }
    }

    fn indirect_target(self) -> Option<u64> {
        match self {
            Kind::IndirectJump { target }
            | Kind::IndirectCall { target }
            | Kind::Return { target } => Some(target),
            _ => None,
        }
    }
}

/// Hashes instruction addresses with one multiplication (the standard hasher costs more
/// than the rest of writing an instruction).
#[derive(Default, Clone, Copy)]
pub struct BuildPcHasher;

/// See [`BuildPcHasher`].
#[derive(Default)]
pub struct PcHasher(u64);

impl std::hash::Hasher for PcHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl std::hash::BuildHasher for BuildPcHasher {
    type Hasher = PcHasher;
    fn build_hasher(&self) -> PcHasher {
        PcHasher(0)
    }
}

/// One record's bytes.
pub fn entry(ty: u16, size: u16, addr: u64) -> [u8; ENTRY_SIZE] {
    let mut e = [0u8; ENTRY_SIZE];
    e[0..2].copy_from_slice(&ty.to_le_bytes());
    e[2..4].copy_from_slice(&size.to_le_bytes());
    e[4..12].copy_from_slice(&addr.to_le_bytes());
    e
}

/// log2 of [`ThreadWriter`]'s memo slots.
const SEEN_BITS: u32 = 12;
const SEEN_SLOTS: usize = 1 << SEEN_BITS;

/// A memo slot: the instruction at `pc` with `encoding` had its encoding written in
/// chunk `chunk`.
#[derive(Clone, Copy)]
struct Seen {
    pc: u64,
    encoding: ([u8; 15], u8),
    chunk: u64,
}

/// Writes one thread's records, cut into chunks ([`ThreadWriter::take_chunks`] hands the
/// finished ones over as they fill, so memory stays bounded by one chunk).
pub struct ThreadWriter {
    tid: u64,
    chunk_instructions: u64,
    cur: Vec<u8>,
    done: Vec<Vec<u8>>,
    chunk_no: u64,
    in_chunk: u64,
    /// Records tools see (every instruction and marker but the hidden ones), for the
    /// `RECORD_ORDINAL` of each chunk after the first.
    visible: u64,
    /// Encodings written in this chunk, by pc (bytes, zero padded, and length).
    encodings: std::collections::HashMap<u64, ([u8; 15], u8), BuildPcHasher>,
    /// A direct-mapped memo in front of `encodings` (most instructions repeat): the last
    /// pc seen at each slot, its encoding and the chunk it was seen in.
    seen: Box<[Seen]>,
    last_ts: u64,
    cpu: u64,
    window: u64,
    /// The last record was a branch: no timestamp may follow before the next instruction.
    after_branch: bool,
    instructions: u64,
}

impl ThreadWriter {
    /// A thread's header, its first timestamp (µs since 1601) and cpu, and window 0.
    pub fn new(
        tid: u64,
        pid: u64,
        filetype: u64,
        chunk_instructions: u64,
        ts: u64,
        cpu: u64,
    ) -> Self {
        let mut w = ThreadWriter {
            tid,
            chunk_instructions: chunk_instructions.max(1),
            cur: Vec::with_capacity(1 << 16),
            done: Vec::new(),
            chunk_no: 0,
            in_chunk: 0,
            visible: 0,
            encodings: Default::default(),
            seen: vec![
                Seen {
                    pc: 0,
                    encoding: ([0; 15], 0),
                    chunk: u64::MAX,
                };
                SEEN_SLOTS
            ]
            .into_boxed_slice(),
            last_ts: ts,
            cpu,
            window: 0,
            after_branch: false,
            instructions: 0,
        };
        w.hidden(ty::HEADER, 0, VERSION);
        w.marker(marker::VERSION, VERSION);
        w.marker(marker::FILETYPE, filetype);
        w.hidden(ty::THREAD, 4, tid);
        w.hidden(ty::PID, 4, pid);
        w.marker(marker::CACHE_LINE_SIZE, 64);
        w.marker(marker::CHUNK_INSTR_COUNT, w.chunk_instructions);
        w.marker(marker::PAGE_SIZE, 4096);
        w.marker(marker::TIMESTAMP, ts);
        w.marker(marker::WINDOW_ID, 0);
        w.marker(marker::CPU_ID, cpu);
        w
    }

    fn hidden(&mut self, ty: u16, size: u16, addr: u64) {
        self.cur.extend_from_slice(&entry(ty, size, addr));
    }

    fn marker(&mut self, m: u16, value: u64) {
        self.hidden(ty::MARKER, m, value);
        self.visible += 1;
    }

    /// Instructions written so far.
    pub fn instructions(&self) -> u64 {
        self.instructions
    }

    /// Bytes of the current chunk not yet taken by [`Self::drain`].
    #[inline]
    pub fn pending_bytes(&self) -> usize {
        self.cur.len()
    }

    /// The next instruction (`bytes` its encoding, 1 to 15 bytes).
    pub fn instruction(&mut self, pc: u64, bytes: &[u8], kind: Kind) {
        let len = bytes.len().min(15);
        let mut padded = [0u8; 15];
        padded[..len].copy_from_slice(&bytes[..len]);
        self.instruction_padded(pc, &padded, len, kind);
    }

    /// [`Self::instruction`] of the encoding `padded[..len]`, the rest of `padded` zero.
    pub fn instruction_padded(&mut self, pc: u64, padded: &[u8; 15], len: usize, kind: Kind) {
        if self.in_chunk == self.chunk_instructions {
            self.next_chunk();
        }
        let len = len.min(15);
        let encoding = (*padded, len as u8);
        let slot = (pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SEEN_BITS)) as usize;
        let seen = &self.seen[slot % SEEN_SLOTS];
        if !(seen.pc == pc && seen.chunk == self.chunk_no && seen.encoding == encoding) {
            if self.encodings.get(&pc) != Some(&encoding) {
                for piece in padded[..len].chunks(8) {
                    let mut v = [0u8; 8];
                    v[..piece.len()].copy_from_slice(piece);
                    self.hidden(ty::ENCODING, piece.len() as u16, u64::from_le_bytes(v));
                }
                self.encodings.insert(pc, encoding);
            }
            self.seen[slot % SEEN_SLOTS] = Seen {
                pc,
                encoding,
                chunk: self.chunk_no,
            };
        }
        if let Some(t) = kind.indirect_target() {
            self.hidden(ty::MARKER, marker::BRANCH_TARGET, t);
        }
        self.hidden(kind.record_type(), len as u16, pc);
        self.visible += 1;
        self.in_chunk += 1;
        self.instructions += 1;
        self.after_branch = kind != Kind::Other;
    }

    /// A load (`store` false) or store of `size` bytes at `addr` by the instruction just
    /// written.
    pub fn data(&mut self, addr: u64, size: u16, store: bool) {
        self.hidden(if store { ty::WRITE } else { ty::READ }, size, addr);
        self.visible += 1;
    }

    fn next_chunk(&mut self) {
        self.marker(marker::CHUNK_FOOTER, self.chunk_no);
        let next = Vec::with_capacity(self.cur.capacity());
        self.done.push(std::mem::replace(&mut self.cur, next));
        self.chunk_no += 1;
        self.in_chunk = 0;
        self.encodings.clear();
        // Where a reader seeking to this chunk lands: the ordinal and the time and cpu
        // repeated (a reader walking on skips them; none of them count as visible).
        let (ts, cpu, ordinal) = (self.last_ts, self.cpu, self.visible);
        self.hidden(ty::MARKER, marker::RECORD_ORDINAL, ordinal);
        self.hidden(ty::MARKER, marker::TIMESTAMP, ts);
        self.hidden(ty::MARKER, marker::CPU_ID, cpu);
    }

    /// The time (µs since 1601; never before the last) and cpu, unless right after a
    /// branch (where the analyzers want the branch's target next): then nothing.
    pub fn timestamp(&mut self, ts: u64, cpu: u64) {
        if self.after_branch {
            return;
        }
        self.last_ts = self.last_ts.max(ts);
        self.cpu = cpu;
        let t = self.last_ts;
        self.marker(marker::TIMESTAMP, t);
        self.marker(marker::CPU_ID, cpu);
    }

    /// After a syscall instruction: its number, between timestamps.
    pub fn syscall(&mut self, number: u64, ts: u64) {
        let cpu = self.cpu;
        self.timestamp(ts, cpu);
        self.marker(marker::SYSCALL, number);
        self.timestamp(ts, cpu);
    }

    /// The flow is discontinuous here (trace lost, or a jump nothing explains): a new
    /// window, which lets the next instruction be anywhere.
    pub fn gap(&mut self, ts: u64) {
        self.window += 1;
        if self.after_branch {
            self.marker(marker::WINDOW_ID, self.window);
        } else {
            self.last_ts = self.last_ts.max(ts);
            let (t, cpu, w) = (self.last_ts, self.cpu, self.window);
            self.marker(marker::TIMESTAMP, t);
            self.marker(marker::WINDOW_ID, w);
            self.marker(marker::CPU_ID, cpu);
        }
        self.after_branch = false;
    }

    /// A signal delivered: the next instruction is its handler's first, `interrupted` the
    /// one that would have run.
    pub fn kernel_event(&mut self, interrupted: u64, signal: Option<u64>) {
        self.marker(marker::KERNEL_EVENT, interrupted);
        if let Some(s) = signal {
            self.marker(marker::SIGNAL_NUMBER, s);
        }
        self.after_branch = false;
    }

    /// The handler's sigreturn (after its syscall's markers): `from` is the pc after it;
    /// the next instruction is the one its `kernel_event` named.
    pub fn kernel_xfer(&mut self, from: u64) {
        self.marker(marker::KERNEL_XFER, from);
        self.after_branch = false;
    }

    /// Whether a chunk ended since the last [`Self::take_chunks`].
    #[inline]
    pub fn chunk_ended(&self) -> bool {
        !self.done.is_empty()
    }

    /// The chunks ended since the last call, in order: each the rest of a chunk (what
    /// [`Self::drain`] has not taken), after which the next chunk begins.
    pub fn take_chunks(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.done)
    }

    /// The current chunk's bytes written since the last call (a writer streams them out, so
    /// that memory holds no whole chunk). `spare` (emptied) takes their place, so that a
    /// writer handing its buffers back writes into memory already grown.
    pub fn drain(&mut self, mut spare: Vec<u8>) -> Vec<u8> {
        spare.clear();
        std::mem::replace(&mut self.cur, spare)
    }

    /// The thread's end: its last chunk.
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        let tid = self.tid;
        self.hidden(ty::THREAD_EXIT, 4, tid);
        self.visible += 1;
        self.hidden(ty::FOOTER, 0, 0);
        let mut out = std::mem::take(&mut self.done);
        out.push(std::mem::take(&mut self.cur));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(b: &[u8]) -> Vec<(u16, u16, u64)> {
        b.chunks(ENTRY_SIZE)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u64::from_le_bytes(e[4..12].try_into().unwrap()),
                )
            })
            .collect()
    }

    const M: u16 = ty::MARKER;

    #[test]
    fn every_record_of_a_small_thread_in_order_and_chunks_cut_as_raw2trace_does() {
        let ft = filetype::ARCH_X86_64
            | filetype::ENCODINGS
            | filetype::DFILTERED
            | filetype::INSTRUCTION_ONLY
            | filetype::SYSCALL_NUMBERS;
        let mut w = ThreadWriter::new(7, 5, ft, 3, 1000, 2);
        w.instruction(0x1000, &[0x90], Kind::Other); // nop
        w.instruction(0x1001, &[0x75, 0x02], Kind::Conditional { taken: true }); // jnz
        w.timestamp(1500, 2); // right after a branch: dropped
        w.instruction(0x1005, &[0xc3], Kind::Return { target: 0x2000 });
        // Chunk 1: the ret's target, a 10-byte movabs (two encoding records), a syscall.
        let movabs = [0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8];
        w.instruction(0x2000, &movabs, Kind::Other);
        w.instruction(0x200a, &[0x0f, 0x05], Kind::Other);
        w.syscall(39, 1600);
        w.gap(1700);
        // Chunk 2: the nop again (its encoding again: a new chunk), a signal.
        w.instruction(0x1000, &[0x90], Kind::Other);
        w.kernel_event(0x1001, Some(10));
        w.instruction(0x3000, &[0x90], Kind::Other);
        w.kernel_xfer(0x3003);
        let mut chunks = w.take_chunks();
        chunks.extend(w.finish());
        let c: Vec<_> = chunks.iter().map(|c| records(c)).collect();
        assert_eq!(c.len(), 3);
        let enc = |b: &[u8]| {
            let mut v = [0u8; 8];
            v[..b.len()].copy_from_slice(b);
            (ty::ENCODING, b.len() as u16, u64::from_le_bytes(v))
        };
        assert_eq!(
            c[0],
            vec![
                (ty::HEADER, 0, 7),
                (M, marker::VERSION, 7),
                (M, marker::FILETYPE, 0x744),
                (ty::THREAD, 4, 7),
                (ty::PID, 4, 5),
                (M, marker::CACHE_LINE_SIZE, 64),
                (M, marker::CHUNK_INSTR_COUNT, 3),
                (M, marker::PAGE_SIZE, 4096),
                (M, marker::TIMESTAMP, 1000),
                (M, marker::WINDOW_ID, 0),
                (M, marker::CPU_ID, 2),
                enc(&[0x90]),
                (ty::INSTR, 1, 0x1000),
                enc(&[0x75, 0x02]),
                (ty::TAKEN_JUMP, 2, 0x1001),
                enc(&[0xc3]),
                (M, marker::BRANCH_TARGET, 0x2000),
                (ty::RETURN, 1, 0x1005),
                (M, marker::CHUNK_FOOTER, 0),
            ]
        );
        // Visible before chunk 1: 7 header markers (VERSION FILETYPE CACHE_LINE_SIZE
        // CHUNK_INSTR_COUNT PAGE_SIZE TIMESTAMP WINDOW_ID CPU_ID: 8), 3 instructions, the
        // footer.
        assert_eq!(
            c[1],
            vec![
                (M, marker::RECORD_ORDINAL, 12),
                (M, marker::TIMESTAMP, 1000),
                (M, marker::CPU_ID, 2),
                enc(&movabs[..8]),
                enc(&movabs[8..]),
                (ty::INSTR, 10, 0x2000),
                enc(&[0x0f, 0x05]),
                (ty::INSTR, 2, 0x200a),
                (M, marker::TIMESTAMP, 1600),
                (M, marker::CPU_ID, 2),
                (M, marker::SYSCALL, 39),
                (M, marker::TIMESTAMP, 1600),
                (M, marker::CPU_ID, 2),
                (M, marker::TIMESTAMP, 1700),
                (M, marker::WINDOW_ID, 1),
                (M, marker::CPU_ID, 2),
                enc(&[0x90]),
                (ty::INSTR, 1, 0x1000),
                // Markers after a chunk's last instruction stay in it.
                (M, marker::KERNEL_EVENT, 0x1001),
                (M, marker::SIGNAL_NUMBER, 10),
                (M, marker::CHUNK_FOOTER, 1),
            ]
        );
        assert_eq!(
            c[2],
            vec![
                (M, marker::RECORD_ORDINAL, 12 + 14),
                (M, marker::TIMESTAMP, 1700),
                (M, marker::CPU_ID, 2),
                enc(&[0x90]),
                (ty::INSTR, 1, 0x3000),
                (M, marker::KERNEL_XFER, 0x3003),
                (ty::THREAD_EXIT, 4, 7),
                (ty::FOOTER, 0, 0),
            ]
        );
    }

    #[test]
    fn a_gap_right_after_a_branch_is_a_window_change_alone() {
        let mut w = ThreadWriter::new(1, 1, 0, 100, 5, 0);
        w.instruction(0x10, &[0xeb, 0x00], Kind::DirectJump);
        w.gap(9);
        let c = w.finish();
        let r = records(&c[0]);
        assert_eq!(
            &r[13..],
            &[
                (M, marker::WINDOW_ID, 1),
                (ty::THREAD_EXIT, 4, 1),
                (ty::FOOTER, 0, 0)
            ]
        );
    }
}
