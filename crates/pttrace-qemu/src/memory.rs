//! `memory=on` (`pttrace run --memory`): a guest thread's loads and stores, from its
//! vCPU's log to memory records in its windows' sideband ([`pttrace_format::memory`]).
//!
//! The log holds each access after the block it belongs to, naming its instruction by
//! its offset from that block's start. Each is encoded as it comes; a synchronous fault rolls the
//! encoder back to before the faulting instruction's own (it did not retire; it runs again
//! after the handler, if ever). Each access says whether it starts another
//! execution of the instruction of the access before it: a block began between them, and
//! not the same `rep` instruction going on (QEMU runs its iterations as blocks of their
//! own; PT counts it once).

use pttrace_format::memory::{Encoder, Mark};

use crate::BlockInfo;

#[derive(Default)]
pub struct ThreadMemory {
    /// The window's accesses, written into its sideband as they come.
    encoder: Encoder,
    /// Where the encoder was before the last block's accesses of the instruction that made
    /// the last ones (a synchronous fault there drops them; meaningful while `in_block`).
    mark: Mark,
    /// The last block made accesses.
    in_block: bool,
    /// A block was logged (the next accesses are of its instructions): its start.
    logged: bool,
    start: u64,
    /// The pc of the last access.
    last_pc: u64,
    /// A block began since the last access (and not the same `rep` instruction going on).
    began: bool,
    /// The `rep` instruction the last block ended with.
    last_rep: Option<u64>,
}

impl ThreadMemory {
    /// Block `b` begins.
    #[inline]
    pub fn block(&mut self, b: &'static BlockInfo) {
        self.logged = true;
        self.start = b.block.start;
        self.in_block = false;
        if self.last_rep != Some(b.block.start) {
            self.began = true;
        }
        self.last_rep = match b.block.kind {
            pttrace_encoder::flow::BlockEnd::Rep { ip } => Some(ip),
            _ => None,
        };
    }

    /// A load or store at `addr` by the instruction at `offset` from the last block's start
    /// (`kind`: log2 size in bits 0-2, store in bit 3, as [`crate::log::TAG_MEMORY`] has
    /// them at bit 12), into `sideband`.
    #[inline]
    pub fn access(&mut self, offset: u64, kind: u64, addr: u64, sideband: &mut Vec<u8>) {
        if !self.logged {
            return;
        }
        let pc = self.start.wrapping_add(offset);
        let same = pc == self.last_pc;
        if !self.in_block || !same {
            self.mark = self.encoder.mark();
            self.in_block = true;
        }
        // The size shift and store bit are the record's (bits 0-2 and 3).
        let again = u64::from(same && self.began);
        self.encoder
            .push_parts(pc, addr, again << 4 | kind & 0xf, sideband);
        self.last_pc = pc;
        self.began = false;
    }

    /// A signal handler is entered, interrupting the instruction at `rip`. Its accesses
    /// in the last block are dropped where it faulted (it did not retire): `fault` says so
    /// when the frame has a siginfo; else `fault_signal` (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
    /// SIGTRAP) is taken to. (Only such a signal sent by another thread or process,
    /// delivered as a block that loops to itself comes back to the instruction that made
    /// its last accesses, would lose them; and a faulting instruction whose accesses
    /// straddle a record's end keeps those before it.)
    pub fn signal(&mut self, rip: u64, fault: Option<bool>, fault_signal: bool) {
        if fault.unwrap_or(fault_signal) && self.in_block && self.last_pc == rip {
            self.encoder.rollback(self.mark);
        }
        self.in_block = false;
    }

    /// The window ends: its accesses go into its sideband.
    pub fn end_window(&mut self, sideband: &mut Vec<u8>) {
        // (A mark from before the window's last record cannot be rolled back to.)
        self.encoder.finish(sideband);
    }
}
