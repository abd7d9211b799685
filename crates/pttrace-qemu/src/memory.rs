//! `memory=on` (`pttrace run --memory`): a guest thread's loads and stores, from its
//! vCPU's log to memory records in its windows' sideband ([`pttrace_format::memory`]).
//!
//! The log holds each access after the block it belongs to, naming its instruction by
//! index in that block. Each is encoded as it comes; a synchronous fault rolls the
//! encoder back to before the faulting instruction's own (it did not retire; it runs again
//! after the handler, if ever). Each access says whether it starts another
//! execution of the instruction of the access before it: a block began between them, and
//! not the same `rep` instruction going on (QEMU runs its iterations as blocks of their
//! own; PT counts it once).

use pttrace_format::memory::{Access, Encoder, Mark};

use crate::BlockInfo;

#[derive(Default)]
pub struct ThreadMemory {
    /// The window's accesses, written into its sideband as they come.
    encoder: Encoder,
    /// Where the encoder was before the last block's accesses of the instruction that made
    /// the last ones (a synchronous fault there drops them).
    mark: Option<Mark>,
    /// The last block made accesses.
    in_block: bool,
    /// The block logged last (whose instructions the next accesses are of).
    info: Option<&'static BlockInfo>,
    /// The pc of the last access, and whether a block began since.
    last_access: (u64, bool),
    /// The `rep` instruction the last block ended with.
    last_rep: Option<u64>,
}

impl ThreadMemory {
    /// Block `b` begins.
    #[inline]
    pub fn block(&mut self, b: &'static BlockInfo) {
        self.info = Some(b);
        self.in_block = false;
        if self.last_rep != Some(b.block.start) {
            self.last_access.1 = true;
        }
        self.last_rep = match b.block.kind {
            pttrace_encoder::flow::BlockEnd::Rep { ip } => Some(ip),
            _ => None,
        };
    }

    /// A load or store (`w`: its log word, [`crate::log::TAG_MEMORY`]) at `addr` by an
    /// instruction of the last block, into `sideband`.
    #[inline]
    pub fn access(&mut self, w: u64, addr: u64, sideband: &mut Vec<u8>) {
        let Some(b) = self.info else {
            return;
        };
        let index = ((w >> 3) & 0x1ff) as usize;
        let pc = b.block.start + u64::from(b.offsets.get(index).copied().unwrap_or(0));
        if !self.in_block || pc != self.last_access.0 {
            self.mark = Some(self.encoder.mark());
            self.in_block = true;
        }
        self.encoder.push(
            Access {
                pc,
                addr,
                size_shift: ((w >> 12) & 7) as u8,
                store: (w >> 15) & 1 != 0,
                again: self.last_access == (pc, true),
            },
            sideband,
        );
        self.last_access = (pc, false);
    }

    /// A signal handler is entered, interrupting the instruction at `rip`. Its accesses
    /// in the last block are dropped where it faulted (it did not retire): `fault` says so
    /// when the frame has a siginfo; else `fault_signal` (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
    /// SIGTRAP) is taken to. (Only such a signal sent by another thread or process,
    /// delivered as a block that loops to itself comes back to the instruction that made
    /// its last accesses, would lose them; and a faulting instruction whose accesses
    /// straddle a record's end keeps those before it.)
    pub fn signal(&mut self, rip: u64, fault: Option<bool>, fault_signal: bool) {
        if fault.unwrap_or(fault_signal) && self.in_block && self.last_access.0 == rip {
            if let Some(m) = self.mark.take() {
                self.encoder.rollback(m);
            }
        }
        self.mark = None;
        self.in_block = false;
    }

    /// The window ends: its accesses go into its sideband.
    pub fn end_window(&mut self, sideband: &mut Vec<u8>) {
        self.encoder.finish(sideband);
        self.mark = None;
    }
}
