//! `memory=on` (`pttrace run --memory`): a guest thread's loads and stores, from its
//! vCPU's log to memory records in its windows' sideband ([`pttrace_format::memory`]).
//!
//! The log holds each access after the block it belongs to, naming its instruction by
//! index in that block. Accesses are encoded as they come; before an instruction's first
//! access in a block execution the encoder is marked, so that a synchronous fault there
//! drops that instruction's own (it did not retire; it runs again after the handler, if
//! ever) by rolling back to the mark. (A record is written at a mark when little room is
//! left, so an instruction's accesses stay in the record being collected.) Each access says whether it starts another
//! execution of the instruction of the access before it: a block began between them, and
//! not the same `rep` instruction going on (QEMU runs its iterations as blocks of their
//! own; PT counts it once).

use pttrace_format::memory::{Access, Encoder, Mark};

use crate::BlockInfo;

/// Raw bytes kept free for one instruction's accesses in one block execution, so that a
/// fault's can be dropped from the record being collected (910 accesses at most 18 bytes;
/// a `rep` instruction's iterations are block executions of their own, xsave's pieces a
/// few hundred).
const INSTRUCTION_ROOM: usize = 16_384;

#[derive(Default)]
pub struct ThreadMemory {
    /// The window's accesses, written into its sideband.
    encoder: Encoder,
    /// The block logged last (whose instructions the next accesses are of).
    info: Option<&'static BlockInfo>,
    /// The pc of the last access, and whether a block began since.
    last_access: (u64, bool),
    /// The `rep` instruction the last block ended with.
    last_rep: Option<u64>,
    /// The instruction of the current block execution that made the last accesses, and
    /// the encoder before its first: a fault there drops them.
    mark: Option<(u64, Mark)>,
}

impl ThreadMemory {
    /// Block `b` begins.
    pub fn block(&mut self, b: &'static BlockInfo) {
        self.info = Some(b);
        self.mark = None;
        if self.last_rep != Some(b.block.start) {
            self.last_access.1 = true;
        }
        self.last_rep = match b.block.kind {
            pttrace_encoder::flow::BlockEnd::Rep { ip } => Some(ip),
            _ => None,
        };
    }

    /// A load or store (`w`: its log word, [`crate::log::TAG_MEMORY`]) at `addr` by an
    /// instruction of the last block; full records go to `sideband`.
    #[inline]
    pub fn access(&mut self, w: u64, addr: u64, sideband: &mut Vec<u8>) {
        let Some(b) = self.info else {
            return;
        };
        let index = ((w >> 3) & 0x1ff) as usize;
        let pc = b.block.start + u64::from(b.offsets.get(index).copied().unwrap_or(0));
        if self.mark.is_none_or(|(at, _)| at != pc) {
            self.mark = Some((pc, self.encoder.mark(INSTRUCTION_ROOM, sideband)));
        }
        let a = Access {
            pc,
            addr,
            size_shift: ((w >> 12) & 7) as u8,
            store: (w >> 15) & 1 != 0,
            again: self.last_access == (pc, true),
        };
        self.encoder.push(a, sideband);
        self.last_access = (pc, false);
    }

    /// A signal handler is entered, interrupting the instruction at `rip`. Its accesses
    /// in the block execution that ran are dropped where it faulted (it did not retire):
    /// `fault` says so when the frame has a siginfo; else `fault_signal` (SIGSEGV, SIGBUS,
    /// SIGFPE, SIGILL, SIGTRAP) is taken to. (Only such a signal sent by another thread or
    /// process, delivered as a block that loops to itself comes back to the instruction
    /// that made its last accesses, would lose them.)
    pub fn signal(&mut self, rip: u64, fault: Option<bool>, fault_signal: bool) {
        if let (true, Some((pc, m))) = (fault.unwrap_or(fault_signal), self.mark) {
            if pc == rip {
                self.encoder.rollback(m);
            }
        }
        self.mark = None;
    }

    /// The window ends: its accesses go into its sideband.
    pub fn end_window(&mut self, sideband: &mut Vec<u8>) {
        self.encoder.finish(sideband);
        self.mark = None;
    }
}
