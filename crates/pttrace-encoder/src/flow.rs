//! Block-level flow encoding: the executed sequence of basic blocks (as an emulator such as
//! QEMU reports it: each block's start, the address after it, and how its last instruction
//! transfers control) becomes the PT that user-only hardware would write, one window at a
//! time.
//!
//! Per transition from the previous block `P` into the next block `B`:
//! - `P` ends in a conditional branch: one TNT bit (taken iff `B` starts at the target);
//! - an indirect branch or return: TIP(`B`), unless `B` is a signal handler's entry (an
//!   asynchronous entry, resolved like the conditional case below: TIP of the interrupted
//!   block comes first when the flow returns after `rt_sigreturn`); an indirect call: TIP;
//! - a near return to the address the decoder's return stack holds on top: a taken TNT
//!   bit (return compression, [`RetStack`]);
//! - a direct jump/call or a plain end (page/size limit, an instruction the emulator ends
//!   blocks at): nothing, `B` must start at the target / the next instruction;
//! - a REP string instruction: `B` starting at that instruction again is the same
//!   instruction's next iteration (nothing, and `B`'s instructions are not new ones:
//!   [`Transition::RepeatIteration`]); `B` at the next instruction is its end;
//! - an exception-class far transfer (int3, int n) not followed by a syscall: TIP.PGD
//!   (suppressed), then TIP.PGE(`B`), as hardware shows a trip through the kernel;
//! - anything else is an asynchronous transfer (a signal handler entered between blocks):
//!   FUP(interrupted IP) + TIP.PGD, TIP.PGE(`B`); or, when `B` is the entry of a handler of
//!   synchronous signals and `P` holds instructions that can fault
//!   ([`Block::with_fault_sites`]), perhaps a fault inside `P`: then FUP(faulting
//!   instruction) + TIP.PGD, TIP.PGE(`B`), the faulting instruction known when the handler's
//!   `rt_sigreturn` resumes inside `P` (the instruction restarted), or when the handler
//!   serves faults only and `P` has one instruction that can fault. When `P` ended in a conditional branch or
//!   a REP instruction the interrupted IP is not known yet (either successor is possible):
//!   the encoder leaves a splice point, encodes on, and fills in the branch bit and the FUP
//!   when a later window starts at one of the two successors (the return from the handler,
//!   `rt_sigreturn`) -- likewise for a possible fault. Windows from the splice point on are held until then
//!   ([`FlowEncoder::ready`]); if the flow never comes back (longjmp out of the handler,
//!   exit), or too much is held, the gap is written as OVF + FUP(`B`): an explicit loss,
//!   never a guessed branch.
//!
//! Windows begin with PSB+ and TIP.PGE at their first block and end at a syscall
//! ([`FlowEncoder::far_transfer`]: TIP.PGD, IP suppressed) or at a cut between two blocks
//! ([`FlowEncoder::cut`]: FUP + TIP.PGD, the next window enables at the same IP). A PSB+
//! (with FUP of the next block) follows every `psb_period` bytes.

use std::collections::VecDeque;

use crate::classify::{Class, Flow};
use crate::packet::{PacketWriter, TNT_MAX_BITS};
use crate::EncodeError;

/// How a block's last instruction transfers control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockEnd {
    /// No branch: the next block starts at `end`.
    Fall,
    Cond {
        target: u64,
    },
    /// Direct jump.
    Direct {
        target: u64,
    },
    /// Direct near call: its return address goes on the return stack.
    Call {
        target: u64,
    },
    /// Indirect jump or far transfer a decoder takes a TIP for: TIP (a known signal
    /// handler as target is an asynchronous entry instead, see
    /// [`FlowEncoder::set_signal_handlers`]).
    Indirect,
    /// Indirect near call: TIP; its return address goes on the return stack.
    IndirectCall,
    /// Near return: a taken TNT bit when the return stack's top is its target, else TIP
    /// (or an asynchronous entry, as [`BlockEnd::Indirect`]).
    Return,
    /// A REP string instruction at `ip` (the block's last instruction).
    Rep {
        ip: u64,
    },
    /// syscall / int n / int3 and the like.
    Far,
}

impl BlockEnd {
    /// The block end for a last instruction of class `flow` at `ip`, calls and returns
    /// taken as jumps (no return compression).
    pub fn from_flow(flow: Flow, ip: u64) -> BlockEnd {
        Self::from_class(
            &Class {
                len: 0,
                flow,
                call: false,
                ret: false,
            },
            ip,
        )
    }

    /// The block end for a last instruction of class `c` at `ip`.
    pub fn from_class(c: &Class, ip: u64) -> BlockEnd {
        match c.flow {
            Flow::Indirect if c.call => BlockEnd::IndirectCall,
            Flow::Indirect if c.ret => BlockEnd::Return,
            Flow::Direct { target } if c.call => BlockEnd::Call { target },
            Flow::Plain => BlockEnd::Fall,
            Flow::RepString => BlockEnd::Rep { ip },
            Flow::Cond { target } => BlockEnd::Cond { target },
            Flow::Direct { target } => BlockEnd::Direct { target },
            Flow::Indirect => BlockEnd::Indirect,
            Flow::Far => BlockEnd::Far,
        }
    }
}

/// What the encoder needs of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub start: u64,
    /// Address after the block's last instruction.
    pub end: u64,
    pub kind: BlockEnd,
    /// The one successor of a block without a choice (plain end or direct jump), else
    /// `u64::MAX` (never a block start): one compare on the hot path. (A direct call's
    /// target is not here: the call also pushes its return address.)
    fixed: u64,
    /// Instructions of the block that can fault synchronously (memory accesses, division,
    /// undefined opcodes...): where a SIGSEGV, SIGBUS, SIGFPE or SIGILL can come from.
    fault_sites: u32,
    /// The first one's offset from `start` (the block stays 48 bytes: it is copied at
    /// every block).
    fault_off: u32,
}

impl Block {
    pub fn new(start: u64, end: u64, kind: BlockEnd) -> Block {
        let fixed = match kind {
            BlockEnd::Fall => end,
            BlockEnd::Direct { target } => target,
            _ => u64::MAX,
        };
        Block {
            start,
            end,
            kind,
            fixed,
            fault_sites: 0,
            fault_off: 0,
        }
    }

    /// Instructions of the block that can fault synchronously.
    pub fn fault_sites(&self) -> u32 {
        self.fault_sites
    }

    /// The first instruction that can fault (meaningful when there is one).
    pub fn fault_at(&self) -> u64 {
        self.start + u64::from(self.fault_off)
    }

    /// The block with `sites` instructions that can fault synchronously, the first (or only)
    /// one at `first`.
    pub fn with_fault_sites(mut self, sites: u32, first: u64) -> Block {
        self.fault_sites = sites;
        self.fault_off = u32::try_from(first.wrapping_sub(self.start)).unwrap_or(0);
        self
    }
}

/// Whether an entry into a signal handler may be a synchronous fault of the block before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    /// No: the block cannot fault, or the handler serves asynchronous signals only.
    No,
    /// Perhaps: the handler serves both kinds (Go's `runtime.sigtramp`, the JVM's).
    Maybe,
    /// Yes: the handler serves SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGTRAP only.
    Sure,
}

/// How a pending entry was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resumed {
    /// Asynchronous: the interrupted flow went on at this address (a successor).
    At(u64),
    /// A synchronous fault of the instruction at this address (inside the block).
    FaultAt(u64),
    /// Unknown: written as OVF.
    Lost,
}

/// What a transition was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The block begins a window.
    WindowStart,
    /// An ordinary control transfer.
    Flow,
    /// The same REP instruction continues: the block adds no instruction.
    RepeatIteration,
    /// An asynchronous transfer (signal delivery) into the block.
    Async,
    /// A far transfer (int3, int n) through the kernel into the block.
    Far,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Window sequence number holding the splice point, and the offset in it.
    seq: u64,
    offset: usize,
    /// The interrupted block's end (both successors are candidates).
    from: Block,
    /// First block of the handler.
    handler: u64,
    /// Whether the entry may be a fault inside `from`.
    fault: FaultKind,
}

/// What an ordinary transition writes ([`FlowEncoder::ordinary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ordinary {
    /// A TNT bit: taken or not.
    Bit(bool),
    /// A TIP of the next block's address.
    Tip,
    Nothing,
}

/// Counters of what was encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub blocks: u64,
    pub windows: u64,
    pub async_events: u64,
    /// Asynchronous transfers whose interrupted IP never became known (written as OVF).
    pub unresolved: u64,
    /// Of those, entries that may have been a synchronous fault inside a block with
    /// several instructions that can fault, whose handler did not resume there.
    pub unresolved_faults: u64,
    /// Synchronous faults traced at their faulting instruction.
    pub faults: u64,
    pub far_transfers: u64,
}

/// A window whose PT is final.
#[derive(Debug)]
pub struct ReadyWindow<M> {
    pub meta: M,
    pub pt: Vec<u8>,
    /// OVF packets in `pt`: where an asynchronous entry's interrupted IP stayed unknown.
    pub overflows: u32,
}

/// Most bytes of windows held back waiting for a splice before the gap is written as lost.
pub const MAX_HELD_BYTES: usize = 64 << 20;
/// Most windows held back likewise.
pub const MAX_HELD_WINDOWS: usize = 4096;
/// Most entries pending at once (signals nested in handlers, or in the code a handler
/// resumed in, before the first is resolved).
const MAX_PENDING: usize = 32;

const _: () = assert!(std::mem::size_of::<Block>() == 48);

/// Encodes one thread's block sequence into windows of PT; `M` is the caller's window
/// metadata (syscall number, arguments...), carried with the PT until the window is ready.
pub struct FlowEncoder<'b, M> {
    w: PacketWriter<Vec<u8>>,
    /// The block in flight (a reference: copying a block at every block cost more than
    /// the rest of a plain transition).
    prev: Option<&'b Block>,
    /// Sequence number of the window being written.
    seq: u64,
    /// Ended windows not final yet: (seq, meta, PT, OVF packets written into it).
    held: VecDeque<(u64, M, Vec<u8>, u32)>,
    held_bytes: usize,
    /// OVF packets written into the window being written.
    overflows: u32,
    /// A pending entry's handler returned with `rt_sigreturn` elsewhere.
    pending_returned: bool,
    /// Entries whose interrupted IP is not known yet, oldest first (a signal can interrupt
    /// the handler of another, or the code a handler resumed in before the first is
    /// resolved: Go's `asyncPreempt`).
    pending: Vec<Pending>,
    stats: FlowStats,
    /// Emptied window buffers for reuse ([`Self::recycle`]).
    spare: Vec<Vec<u8>>,
    /// Entry points of the program's signal handlers.
    handlers: Vec<u64>,
    /// Handlers of synchronous signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP), sorted:
    /// (entry, serves no other signal).
    fault_handlers: Vec<(u64, bool)>,
    /// The last window ended with rt_sigreturn.
    after_sigreturn: bool,
    /// The next block enters a signal handler that interrupted the thread here (from the
    /// signal frame: [`Self::signal_entry`]), and whether by a synchronous fault, if known.
    entry: Option<(u64, Option<bool>)>,
    /// The top of the decoder's return stack, for return compression.
    rets: RetStack,
}

impl<'b, M> FlowEncoder<'b, M> {
    pub fn new(psb_period: usize) -> Self {
        FlowEncoder {
            w: PacketWriter::new(Vec::with_capacity(1 << 16), psb_period),
            prev: None,
            seq: 0,
            held: VecDeque::new(),
            held_bytes: 0,
            overflows: 0,
            pending_returned: false,
            pending: Vec::new(),
            stats: FlowStats::default(),
            spare: Vec::new(),
            handlers: Vec::new(),
            fault_handlers: Vec::new(),
            after_sigreturn: false,
            entry: None,
            rets: RetStack::default(),
        }
    }

    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    /// PT bytes of the window being written.
    pub fn window_len(&self) -> usize {
        self.w.len()
    }

    /// True when the current window has blocks (tracing is enabled).
    pub fn in_window(&self) -> bool {
        self.prev.is_some()
    }

    /// Encodes the transition into `b`; `tsc` is read only when a timestamp is written.
    #[inline(always)]
    pub fn block(
        &mut self,
        b: &'b Block,
        tsc: &mut dyn FnMut() -> u64,
    ) -> Result<Transition, EncodeError> {
        self.stats.blocks += 1;
        let Some(p) = self.prev else {
            self.entry = None;
            return self.window_start(b, tsc);
        };
        let s = b.start;
        let t = if self.entry.is_some() {
            self.known_entry(*p, b, tsc)?
        } else if s == p.fixed {
            Transition::Flow
        } else {
            match self.ordinary(p, s) {
                Some(o) => {
                    match o {
                        Ordinary::Bit(taken) => self.w.branch(taken)?,
                        Ordinary::Tip => self.w.tip(s)?,
                        Ordinary::Nothing => {}
                    }
                    Transition::Flow
                }
                None => match p.kind {
                    // A pending entry's handler returned elsewhere: resolved here first.
                    BlockEnd::Return | BlockEnd::Indirect
                        if self.pending_returned && !self.handlers.contains(&s) =>
                    {
                        self.resume_at(s, true, false)?;
                        self.w.tip(s)?;
                        Transition::Flow
                    }
                    // Same REP instruction, next iteration: `prev` stays the REP block.
                    BlockEnd::Rep { ip } if s == ip => return Ok(Transition::RepeatIteration),
                    BlockEnd::Rep { .. } if s == p.end => Transition::Flow,
                    _ => self.unusual(*p, b, tsc)?,
                },
            }
        };
        if self.w.psb_due() {
            self.periodic_psb(b, tsc)?;
        }
        self.prev = Some(b);
        Ok(t)
    }

    /// [`Self::block`] for a run of blocks on its hot path: `next(k)` gives the run's `k`-th
    /// block (`None`: the run ends before it), encoded as [`Self::block`] encodes it while
    /// a block is in flight, no signal entry waits to be resolved, and the transition is
    /// the fixed successor or ordinary control flow ([`Self::ordinary`]); `tsc` is the time a periodic PSB+ says. The run stops before the first block
    /// it cannot take so ([`Self::block`] takes that one), and after the block with which
    /// the window's PT exceeds `limit` bytes. Returns how many blocks it encoded, and the
    /// error that stopped it while encoding the next one, if any (as [`Self::block`]'s).
    ///
    /// The loop keeps the block in flight and the pending branch bits in registers, and
    /// looks at the PT's length only after it writes a packet: the QEMU backend's worker
    /// runs 55 machine instructions a block with it, 72 with [`Self::block`] alone
    /// (callgrind, the python loop; 51 when this loop had its own copy of
    /// [`Self::ordinary`]'s rules).
    #[inline(always)]
    pub fn plain_run(
        &mut self,
        mut next: impl FnMut(usize) -> Option<&'b Block>,
        tsc: u64,
        limit: usize,
    ) -> (usize, Result<(), EncodeError>) {
        let Some(mut p) = self.prev else {
            return (0, Ok(()));
        };
        if self.entry.is_some() {
            return (0, Ok(()));
        }
        let (mut tnt, mut bits) = self.w.pending_tnt();
        let mut n = 0;
        let r = 'run: loop {
            let Some(b) = next(n) else {
                break Ok(());
            };
            let s = b.start;
            // (The first block also looks: what came before may have written packets.)
            let mut wrote = n == 0;
            if s != p.fixed {
                // A branch bit; a TIP (which writes the bits before it) or nothing else.
                let (bit, tip) = match self.ordinary(p, s) {
                    Some(Ordinary::Bit(taken)) => (Some(u64::from(taken)), false),
                    Some(Ordinary::Tip) => (None, true),
                    Some(Ordinary::Nothing) => (None, false),
                    None => break Ok(()),
                };
                if let Some(bit) = bit {
                    if bits + 1 < TNT_MAX_BITS {
                        (tnt, bits) = ((tnt << 1) | bit, bits + 1);
                    } else {
                        // The bit that fills a long TNT: the writer writes it.
                        self.w.set_pending_tnt(tnt, bits);
                        let r = self.w.branch(bit == 1);
                        (tnt, bits) = self.w.pending_tnt();
                        if let Err(e) = r {
                            break 'run Err(e);
                        }
                        wrote = true;
                    }
                }
                if tip {
                    self.w.set_pending_tnt(tnt, bits);
                    let r = self.w.tip(s);
                    (tnt, bits) = self.w.pending_tnt();
                    if let Err(e) = r {
                        break 'run Err(e);
                    }
                    wrote = true;
                }
            }
            if wrote && self.w.psb_due() {
                self.w.set_pending_tnt(tnt, bits);
                let r = self.periodic_psb(b, &mut move || tsc);
                (tnt, bits) = self.w.pending_tnt();
                if let Err(e) = r {
                    break 'run Err(e);
                }
            }
            n += 1;
            p = b;
            if wrote && self.w.len() > limit {
                break Ok(());
            }
        };
        self.w.set_pending_tnt(tnt, bits);
        self.prev = Some(p);
        // (`block` counts a block it fails on.)
        self.stats.blocks += (n + usize::from(r.is_err())) as u64;
        (n, r)
    }

    /// What ordinary control flow from `p` into a block at `s` (not `p`'s fixed successor)
    /// writes, the decoder's return stack updated as it goes: a conditional branch either
    /// way, a direct call (its return address pushed, but for a call to the next
    /// instruction: libipt keeps none, position-independent code's way to read its IP), an
    /// indirect call, and a near return or indirect jump to other than a signal handler's
    /// entry while no handler has returned elsewhere; `None` for anything else (nothing
    /// changed). [`Self::block`] and [`Self::plain_run`] both decide here.
    #[inline(always)]
    fn ordinary(&mut self, p: &Block, s: u64) -> Option<Ordinary> {
        Some(match p.kind {
            BlockEnd::Cond { target } if s == target => Ordinary::Bit(true),
            BlockEnd::Cond { .. } if s == p.end => Ordinary::Bit(false),
            BlockEnd::Call { target } if s == target => {
                if target != p.end {
                    self.rets.push(p.end);
                }
                Ordinary::Nothing
            }
            BlockEnd::IndirectCall => {
                self.rets.push(p.end);
                Ordinary::Tip
            }
            BlockEnd::Return if !self.pending_returned && !self.handlers.contains(&s) => {
                if self.rets.pop_if(s) {
                    Ordinary::Bit(true)
                } else {
                    Ordinary::Tip
                }
            }
            BlockEnd::Indirect if !self.pending_returned && !self.handlers.contains(&s) => {
                Ordinary::Tip
            }
            _ => return None,
        })
    }

    #[cold]
    #[inline(never)]
    fn periodic_psb(&mut self, b: &Block, tsc: &mut dyn FnMut() -> u64) -> Result<(), EncodeError> {
        self.psb_plus(Some(tsc()), Some(b.start))
    }

    /// PSB+: a decoder may start here, so no return after it is compressed against a call
    /// before it.
    fn psb_plus(&mut self, tsc: Option<u64>, fup: Option<u64>) -> Result<(), EncodeError> {
        self.rets.clear();
        self.w.psb_plus(tsc, fup)
    }

    /// The first block of a window (resolving a pending asynchronous transfer first when the
    /// window resumes the interrupted flow).
    #[cold]
    #[inline(never)]
    fn window_start(
        &mut self,
        b: &'b Block,
        tsc: &mut dyn FnMut() -> u64,
    ) -> Result<Transition, EncodeError> {
        let after_sigreturn = std::mem::take(&mut self.after_sigreturn);
        if !self.pending.is_empty() {
            self.resume_at(b.start, after_sigreturn, true)?;
        }
        if !self.w.is_empty() {
            // Tracing was disabled inside this window without ending it: enable again
            // without a new PSB (and no return compressed against a call before).
            self.rets.clear();
            self.w.enable(b.start, Some(tsc()))?;
        } else {
            self.psb_plus(Some(tsc()), None)?;
            self.w.enable(b.start, None)?;
        }
        self.prev = Some(b);
        Ok(Transition::WindowStart)
    }

    /// Transitions that are not ordinary control flow: far transfers without a syscall
    /// window end, and asynchronous ones.
    #[cold]
    #[inline(never)]
    fn unusual(
        &mut self,
        p: Block,
        b: &Block,
        tsc: &mut dyn FnMut() -> u64,
    ) -> Result<Transition, EncodeError> {
        // (Whether the decoder pushed or popped at `p` depends on what happened: the
        // encoder forgets its return stack, which only costs compression.)
        self.rets.clear();
        match p.kind {
            BlockEnd::Fall | BlockEnd::Direct { .. } => match self.fault_kind(&p, b.start) {
                FaultKind::No => self.expect(p.fixed, b),
                _ => self.defer(p, b),
            },
            BlockEnd::Call { target } => match self.fault_kind(&p, b.start) {
                FaultKind::No => self.expect(target, b),
                _ => self.defer(p, b),
            },
            // A jump or return into a signal handler's first block: the handler was
            // entered between the blocks; where the jump went shows after rt_sigreturn.
            BlockEnd::Cond { .. }
            | BlockEnd::Rep { .. }
            | BlockEnd::Indirect
            | BlockEnd::Return => self.defer(p, b),
            BlockEnd::IndirectCall => {
                self.w.tip(b.start)?;
                Ok(Transition::Flow)
            }
            BlockEnd::Far => {
                self.stats.far_transfers += 1;
                self.w.tip_pgd(None)?;
                self.w.enable(b.start, Some(tsc()))?;
                Ok(Transition::Far)
            }
        }
    }

    /// `b` must start at `next`; otherwise a signal interrupted the flow at `next`.
    fn expect(&mut self, next: u64, b: &Block) -> Result<Transition, EncodeError> {
        if b.start == next {
            return Ok(Transition::Flow);
        }
        self.stats.async_events += 1;
        self.w.async_disable(next)?;
        self.w.enable(b.start, None)?;
        Ok(Transition::Async)
    }

    /// `b` enters a signal handler; the signal frame said where it interrupted the thread:
    /// a fault of an instruction inside `p`, or (asynchronous) one of `p`'s successors.
    /// Anything else is left to the inference ([`Self::unusual`]).
    #[cold]
    #[inline(never)]
    fn known_entry(
        &mut self,
        p: Block,
        b: &Block,
        tsc: &mut dyn FnMut() -> u64,
    ) -> Result<Transition, EncodeError> {
        let Some((x, fault)) = self.entry.take() else {
            return Ok(Transition::Flow);
        };
        self.rets.clear();
        let successor = match p.kind {
            BlockEnd::Indirect | BlockEnd::IndirectCall | BlockEnd::Return => true,
            _ => next_of(&p, x),
        };
        let inside = (p.start..p.end).contains(&x);
        // Without the siginfo, `x` both inside the block and a successor (a loop's head)
        // is a fault for a handler of faults only, else a signal between blocks.
        let fault = fault.unwrap_or(!successor || self.fault_kind(&p, b.start) == FaultKind::Sure);
        if fault && inside {
            self.stats.faults += 1;
        } else if !fault && successor {
            match p.kind {
                BlockEnd::Cond { target } => self.w.branch(x == target)?,
                BlockEnd::Indirect | BlockEnd::IndirectCall | BlockEnd::Return => self.w.tip(x)?,
                _ => {}
            }
        } else {
            // Not what the frame should say: infer as without it.
            return self.unusual(p, b, tsc);
        }
        self.stats.async_events += 1;
        self.w.async_disable(x)?;
        self.w.enable(b.start, None)?;
        Ok(Transition::Async)
    }

    /// The next block is the entry of a signal handler that interrupted the thread at `rip`
    /// (`fault`: a synchronous fault of the instruction there, or an asynchronous signal;
    /// `None` when the frame does not say), as its signal frame says.
    pub fn signal_entry(&mut self, rip: u64, fault: Option<bool>) {
        self.entry = Some((rip, fault));
    }

    /// Whether the entry into the handler at `h` right after `p` may be a synchronous fault
    /// inside `p`.
    fn fault_kind(&self, p: &Block, h: u64) -> FaultKind {
        if p.fault_sites == 0 {
            return FaultKind::No;
        }
        match self.fault_handlers.binary_search_by_key(&h, |&(a, _)| a) {
            Ok(i) if self.fault_handlers[i].1 => FaultKind::Sure,
            Ok(_) => FaultKind::Maybe,
            Err(_) => FaultKind::No,
        }
    }

    /// An entry into a signal handler whose interrupted IP is not known yet: one of `p`'s
    /// successors (a signal between blocks) or, for a handler of faults, an instruction
    /// inside `p` (a synchronous fault). A splice point is left where the entry goes.
    fn defer(&mut self, p: Block, b: &Block) -> Result<Transition, EncodeError> {
        self.stats.async_events += 1;
        if self.pending.len() >= MAX_PENDING {
            self.resolve(0, Resumed::Lost)?;
        }
        self.w.flush_tnt()?;
        self.w.forget_last_ip();
        let fault = self.fault_kind(&p, b.start);
        self.pending.push(Pending {
            seq: self.seq,
            offset: self.w.len(),
            from: p,
            handler: b.start,
            fault,
        });
        Ok(Transition::Async)
    }

    /// The flow goes on at `x` (a window's first block: `window`; else a return or jump
    /// after a handler's `rt_sigreturn`, see `pending_returned`): the newest pending entry
    /// that `x` resumes is resolved, and those after it never came back.
    ///
    /// `x` resumes an entry when it is inside the interrupted block after `rt_sigreturn`
    /// (the faulting instruction, restarted) and its handler serves faults, or when it is
    /// one of the block's successors (for an indirect branch at a window start: any
    /// target after `rt_sigreturn` that is not a handler; Go's `asyncPreempt` returns to
    /// the interrupted instruction by `ret`, so there a successor counts too).
    #[cold]
    #[inline(never)]
    fn resume_at(
        &mut self,
        x: u64,
        after_sigreturn: bool,
        window: bool,
    ) -> Result<(), EncodeError> {
        let found = self.pending.iter().enumerate().rev().find_map(|(k, p)| {
            let from = &p.from;
            if after_sigreturn && p.fault != FaultKind::No && (from.start..from.end).contains(&x) {
                return Some((k, Resumed::FaultAt(x)));
            }
            let successor = match from.kind {
                BlockEnd::Indirect | BlockEnd::Return => {
                    window && after_sigreturn && !self.handlers.contains(&x)
                }
                _ => next_of(from, x),
            };
            successor.then_some((k, Resumed::At(x)))
        });
        let Some((k, r)) = found else {
            return Ok(());
        };
        self.rets.clear();
        while self.pending.len() > k + 1 {
            self.resolve(self.pending.len() - 1, Resumed::Lost)?;
        }
        self.resolve(k, r)?;
        if self.pending.is_empty() {
            self.pending_returned = false;
        }
        Ok(())
    }

    /// Fills in pending entry `k`'s splice point.
    fn resolve(&mut self, k: usize, resumed: Resumed) -> Result<(), EncodeError> {
        if k >= self.pending.len() {
            return Ok(());
        }
        let p = self.pending.remove(k);
        // A handler of faults only, after a block with one instruction that can fault: the
        // fault was there, even if the handler never went back (siglongjmp).
        let resumed = match resumed {
            Resumed::Lost if p.fault == FaultKind::Sure && p.from.fault_sites == 1 => {
                Resumed::FaultAt(p.from.fault_at())
            }
            r => r,
        };
        let mut patch = PacketWriter::new(Vec::with_capacity(32), usize::MAX);
        match resumed {
            Resumed::At(x) => {
                match p.from.kind {
                    BlockEnd::Cond { target } => patch.branch(x == target)?,
                    BlockEnd::Indirect | BlockEnd::Return => patch.tip(x)?,
                    _ => {}
                }
                patch.async_disable(x)?;
                patch.enable(p.handler, None)?;
            }
            Resumed::FaultAt(x) => {
                self.stats.faults += 1;
                patch.async_disable(x)?;
                patch.enable(p.handler, None)?;
            }
            Resumed::Lost => {
                self.stats.unresolved += 1;
                if p.fault != FaultKind::No {
                    self.stats.unresolved_faults += 1;
                }
                patch.ovf()?;
                patch.fup(p.handler)?;
            }
        }
        patch.flush_tnt()?;
        let bytes = patch.into_sink();
        let lost = u32::from(resumed == Resumed::Lost);
        let len = bytes.len();
        let buf = if p.seq == self.seq {
            self.overflows += lost;
            self.w.sink_mut()
        } else {
            match self.held.iter_mut().find(|(s, _, _, _)| *s == p.seq) {
                Some((_, _, pt, ovf)) => {
                    self.held_bytes += len;
                    *ovf += lost;
                    pt
                }
                None => return Ok(()),
            }
        };
        let at = p.offset.min(buf.len());
        buf.splice(at..at, bytes);
        // Later splice points of the same window moved with the bytes inserted before them.
        for q in self.pending.iter_mut() {
            if q.seq == p.seq && q.offset >= at {
                q.offset += len;
            }
        }
        Ok(())
    }

    /// Every pending entry becomes an explicit loss.
    fn resolve_all_lost(&mut self) {
        while !self.pending.is_empty() {
            let _ = self.resolve(self.pending.len() - 1, Resumed::Lost);
        }
        self.pending_returned = false;
    }

    /// The block in flight ended with a syscall (or another far transfer the caller handles
    /// as a window end): TIP.PGD with the IP suppressed. The next [`Self::block`] starts a
    /// new window once [`Self::end_window`] was called.
    pub fn far_transfer(&mut self) -> Result<(), EncodeError> {
        if self.prev.take().is_some() {
            self.stats.far_transfers += 1;
            self.w.tip_pgd(None)?;
        }
        Ok(())
    }

    /// Ends the current window between two blocks: the last [`Self::block`] has not
    /// executed yet (FUP + TIP.PGD at its start); the next window enables there.
    pub fn cut(&mut self, meta: M, tsc: &mut dyn FnMut() -> u64) -> Result<(), EncodeError> {
        let Some(b) = self.prev.take() else {
            self.end_window(meta);
            return Ok(());
        };
        self.w.async_disable(b.start)?;
        self.end_window(meta);
        self.psb_plus(Some(tsc()), None)?;
        self.w.enable(b.start, None)?;
        self.prev = Some(b);
        Ok(())
    }

    /// Ends the current window at `ip` inside the last [`Self::block`] (from its start up to,
    /// not including, the instruction at `ip` executed: FUP(`ip`) + TIP.PGD); the next
    /// window enables at `ip` and goes on with that block. `ip` outside the block is taken
    /// as its start (then this is [`Self::cut`]).
    pub fn cut_at(
        &mut self,
        ip: u64,
        meta: M,
        tsc: &mut dyn FnMut() -> u64,
    ) -> Result<(), EncodeError> {
        let Some(b) = self.prev.take() else {
            self.end_window(meta);
            return Ok(());
        };
        let ip = if (b.start..b.end).contains(&ip) {
            ip
        } else {
            b.start
        };
        self.w.async_disable(ip)?;
        self.end_window(meta);
        self.psb_plus(Some(tsc()), None)?;
        self.w.enable(ip, None)?;
        self.prev = Some(b);
        Ok(())
    }

    /// Closes the current window's PT with `meta` (after [`Self::far_transfer`], or at the
    /// end of the thread: then a window still enabled just stops).
    pub fn end_window(&mut self, meta: M) {
        let _ = self.w.flush_tnt();
        let next = self
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(1 << 12));
        let pt = std::mem::replace(self.w.sink_mut(), next);
        self.w.restart();
        self.held_bytes += pt.len();
        self.held
            .push_back((self.seq, meta, pt, std::mem::take(&mut self.overflows)));
        self.seq += 1;
        self.stats.windows += 1;
        if !self.pending.is_empty()
            && (self.held.len() > MAX_HELD_WINDOWS || self.held_bytes > MAX_HELD_BYTES)
        {
            self.resolve_all_lost();
        }
    }

    /// The next window whose PT is final, in order.
    pub fn ready(&mut self) -> Option<(M, Vec<u8>)> {
        self.ready_window().map(|w| (w.meta, w.pt))
    }

    /// The next window whose PT is final, in order, with the number of OVF packets in it
    /// (asynchronous transfers whose interrupted IP never became known: trace lost there).
    pub fn ready_window(&mut self) -> Option<ReadyWindow<M>> {
        let seq = self.held.front()?.0;
        if self.pending.first().is_some_and(|p| p.seq <= seq) {
            return None;
        }
        let (_, meta, pt, overflows) = self.held.pop_front()?;
        self.held_bytes -= pt.len().min(self.held_bytes);
        Some(ReadyWindow {
            meta,
            pt,
            overflows,
        })
    }

    /// The program's signal handler entry points (from its `rt_sigaction` calls): a jump or
    /// return into one is a signal delivery, not a branch.
    pub fn set_signal_handlers(&mut self, handlers: &[u64]) {
        self.handlers.clear();
        self.handlers.extend_from_slice(handlers);
    }

    /// The handlers of synchronous signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP), each
    /// with whether it serves no other signal: an entry into one after a block with
    /// instructions that can fault may be a fault inside that block.
    pub fn set_fault_handlers(&mut self, handlers: &[(u64, bool)]) {
        self.fault_handlers.clear();
        self.fault_handlers.extend_from_slice(handlers);
        self.fault_handlers.sort_unstable();
        self.fault_handlers.dedup_by_key(|h| h.0);
    }

    /// The window just ended with `rt_sigreturn`: the next window resumes interrupted code.
    pub fn sigreturned(&mut self) {
        self.after_sigreturn = true;
        // A pending entry may still be resumed by a return (see `resume_at`).
        self.pending_returned = !self.pending.is_empty();
    }

    /// Gives a window's buffer back once its PT is written (its capacity is reused, so a
    /// long run does not regrow a buffer for every window).
    pub fn recycle(&mut self, mut pt: Vec<u8>) {
        if self.spare.len() < 2 {
            pt.clear();
            self.spare.push(pt);
        }
    }

    /// The thread ends: an unresolved asynchronous transfer becomes an explicit loss, and
    /// every window is ready.
    pub fn finish(&mut self) {
        self.resolve_all_lost();
    }
}

/// Return addresses of a PT decoder's return stack (libipt's: 64 entries, the oldest
/// dropped when a call finds it full), as the encoder knows them: always the top part of
/// the decoder's stack. Both push at the same near calls (but a call to the next
/// instruction) and pop at the same compressed returns, and the encoder may forget its part
/// at any time ([`RetStack::clear`]), which only leaves returns uncompressed. A return is
/// compressed when its target is on top, so the decoder pops exactly that address. (An
/// uncompressed return pops neither stack.)
struct RetStack {
    ips: [u64; RET_STACK],
    /// The slot the next push takes.
    top: usize,
    len: usize,
}

/// Entries of a decoder's return stack (libipt's `pt_retstack`; the SDM's 64).
const RET_STACK: usize = 64;

impl Default for RetStack {
    fn default() -> Self {
        RetStack {
            ips: [0; RET_STACK],
            top: 0,
            len: 0,
        }
    }
}

impl RetStack {
    #[inline(always)]
    fn push(&mut self, ip: u64) {
        if let Some(slot) = self.ips.get_mut(self.top) {
            *slot = ip;
        }
        self.top = (self.top + 1) % RET_STACK;
        self.len = (self.len + 1).min(RET_STACK);
    }

    /// Pops the top when it is `ip` (the return goes where the decoder's stack says).
    #[inline(always)]
    fn pop_if(&mut self, ip: u64) -> bool {
        let below = (self.top + RET_STACK - 1) % RET_STACK;
        if self.len == 0 || self.ips.get(below) != Some(&ip) {
            return false;
        }
        self.top = below;
        self.len -= 1;
        true
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

/// Whether `x` is where `b` goes next by its own last instruction: the fall-through, a
/// direct branch's target, either way of a conditional branch, the REP instruction again
/// or after it (an indirect branch's target is not known here; a far transfer's never).
fn next_of(b: &Block, x: u64) -> bool {
    match b.kind {
        BlockEnd::Fall => x == b.end,
        BlockEnd::Direct { target } | BlockEnd::Call { target } => x == target,
        BlockEnd::Cond { target } => x == b.end || x == target,
        BlockEnd::Rep { ip } => x == ip || x == b.end,
        BlockEnd::Indirect | BlockEnd::IndirectCall | BlockEnd::Return | BlockEnd::Far => false,
    }
}
