//! `memory=on` (`pttrace run --memory`): a guest thread's loads and stores, from its
//! vCPU's log to memory records in its windows' sideband ([`pttrace_format::memory`]).
//!
//! The log holds each access after the block it belongs to, naming its instruction by
//! index in that block. The accesses of the last block are held until the log goes past
//! it: a synchronous fault drops the faulting instruction's own (it did not retire; it
//! runs again after the handler, if ever). Each access says whether it starts another
//! execution of the instruction of the access before it: a block began between them, and
//! not the same `rep` instruction going on (QEMU runs its iterations as blocks of their
//! own; PT counts it once).

use pttrace_format::memory::{Access, Encoder};

use crate::BlockInfo;

#[derive(Default)]
pub struct ThreadMemory {
    /// The window's accesses, written into its sideband.
    encoder: Encoder,
    /// The last block's accesses, until the log goes on past it.
    block: Vec<Access>,
    /// The block logged last (whose instructions the next accesses are of).
    info: Option<&'static BlockInfo>,
    /// The pc of the last access, and whether a block began since.
    last_access: (u64, bool),
    /// The `rep` instruction the last block ended with.
    last_rep: Option<u64>,
}

impl ThreadMemory {
    /// Block `b` begins; the last one's accesses are final (into `sideband`).
    pub fn block(&mut self, b: &'static BlockInfo, sideband: &mut Vec<u8>) {
        self.info = Some(b);
        if !self.block.is_empty() {
            self.take_block(sideband);
        }
        if self.last_rep != Some(b.block.start) {
            self.last_access.1 = true;
        }
        self.last_rep = match b.block.kind {
            pttrace_encoder::flow::BlockEnd::Rep { ip } => Some(ip),
            _ => None,
        };
    }

    /// A load or store (`w`: its log word, [`crate::log::TAG_MEMORY`]) at `addr` by an
    /// instruction of the last block.
    #[inline]
    pub fn access(&mut self, w: u64, addr: u64) {
        let Some(b) = self.info else {
            return;
        };
        let index = ((w >> 3) & 0x1ff) as usize;
        let pc = b.block.start + u64::from(b.offsets.get(index).copied().unwrap_or(0));
        self.block.push(Access {
            pc,
            addr,
            size_shift: ((w >> 12) & 7) as u8,
            store: (w >> 15) & 1 != 0,
            again: self.last_access == (pc, true),
        });
        self.last_access = (pc, false);
    }

    /// A signal handler is entered, interrupting the instruction at `rip`. Its accesses
    /// in the last block are dropped where it faulted (it did not retire): `fault` says so
    /// when the frame has a siginfo; else `fault_signal` (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
    /// SIGTRAP) is taken to. (Only such a signal sent by another thread or process,
    /// delivered as a block that loops to itself comes back to the instruction that made
    /// its last accesses, would lose them.)
    pub fn signal(
        &mut self,
        rip: u64,
        fault: Option<bool>,
        fault_signal: bool,
        sideband: &mut Vec<u8>,
    ) {
        if fault.unwrap_or(fault_signal) {
            while self.block.last().is_some_and(|a| a.pc == rip) {
                self.block.pop();
            }
        }
        self.take_block(sideband);
    }

    /// The window ends: its accesses go into its sideband.
    pub fn end_window(&mut self, sideband: &mut Vec<u8>) {
        self.take_block(sideband);
        self.encoder.finish(sideband);
    }

    fn take_block(&mut self, sideband: &mut Vec<u8>) {
        for a in self.block.drain(..) {
            self.encoder.push(a, sideband);
        }
    }
}
