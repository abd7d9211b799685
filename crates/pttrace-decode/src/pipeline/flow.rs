//! The fast decoder: our own flow reconstruction, libipt kept as the oracle.
//!
//! It walks the packets itself ([`crate::wire`]) and the code through a table of basic
//! blocks built once per image (iced-x86 via the instruction cache): a block runs from an
//! address to the first instruction that needs trace (conditional branch, indirect jump
//! or call, return, syscall) or to a direct call, following direct jumps; each block's
//! records lie in the decoder's block arena, so a block costs one queue entry, and a
//! block's successors are linked once found, so a TNT bit costs no lookup.
//!
//! It gives exactly libipt's records (same markers, same timestamps, same stop at the end
//! of the trace) for what it handles: PSB+ (TSC, TMA, MTC, CYC, CBR, MODE.Exec, FUP),
//! TNT, TIP, TIP.PGE/PGD, FUP+TIP and FUP+TIP.PGD, TSC, TMA, MTC, CYC (libipt's
//! cycle-accurate time, its calibration included: [`Clock`]), CBR, PAD, TRIG, OVF,
//! 64-bit code (ERETU, ERETS
//! and JMPABS included, which libipt 2.1.2 does not know), return compression,
//! sideband applied where libipt's path applies it ([`sideband`]). Anything else — another packet, an error, an IP it cannot
//! reach without trace, code it cannot read — hands the window to libipt: the records of
//! the current PSB segment are dropped and libipt decodes the window from its start, its
//! first records (those already handed out, which equal ours) skipped. Records are handed
//! out one PSB segment at a time, and only those the trace before the PSB determines, so
//! what was handed out is always what libipt gives too.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

use super::{Item, PtDecoder, Record};

mod event_trace;
mod ovf_errata;
mod resync;
mod sideband;
use crate::insn::{AddrHasher, ArenaTied};
use crate::records::{ExecMode, InsnClass};
use crate::timing::{Calibration, Time, TimeCfg, TimeError};
use crate::wire::{self, LastIp, Pkt};
use event_trace::CfeRet;
pub(crate) use resync::{FlowError, ResyncFrom};

/// Which decoder a [`super::PtDecoder`] runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DecoderKind {
    /// Our own flow reconstruction where it applies, libipt for the rest (same records).
    #[default]
    Fast,
    /// libipt's block decoder only.
    Libipt,
}

impl std::str::FromStr for DecoderKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(DecoderKind::Fast),
            "libipt" => Ok(DecoderKind::Libipt),
            other => Err(format!("--decoder '{other}': expected fast or libipt")),
        }
    }
}

const NO_BLOCK: u32 = u32::MAX;
/// Instructions a block takes at most (longer straight-line code continues in the next).
const MAX_BLOCK_INSNS: u32 = 256;
/// Queued items after which a run stops to hand them out ([`Stop::Yield`]).
const FLOW_YIELD_ITEMS: usize = 256;

/// Why a PSB+ passed while decoding is libipt's bad status update.
const MODE_STATUS: Fallback = "a PSB+ states another execution mode";
const IFLAG_STATUS: Fallback = "a PSB+ states another interrupt flag (iflags events)";

/// How a block ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Conditional branch: a TNT bit chooses `target` or `fall`.
    Cond,
    /// Indirect jump: a TIP.
    Indirect,
    /// Indirect call: a TIP; `fall` is pushed for return compression.
    IndirectCall,
    /// Near return: a TNT bit (compressed) or a TIP.
    Return,
    /// System call: a TIP or TIP.PGD.
    Syscall,
    /// Length limit: on at `fall` without trace.
    Continue,
    /// No code at `fall` (no image covers it): libipt's nomap error when the walk gets
    /// there, unless an event binds to one of the block's instructions first.
    Nomap,
    /// The instruction at `fall` is cut by the end of its code (no image covers the
    /// bytes after): libipt's "unknown instruction" (its length decoder's error) as
    /// [`End::Nomap`]'s error is met.
    BadInsn,
}

impl End {
    /// Whether the block stops where there is no instruction to decode.
    #[inline]
    fn no_code(self) -> bool {
        matches!(self, End::Nomap | End::BadInsn)
    }
}

/// Straight-line code up to a branch that needs trace, through direct jumps and direct
/// calls (as libipt's blocks: one block, one output slice, where a call's callee follows).
#[derive(Debug, Clone, Copy)]
struct FBlock {
    /// Its records in the block arena.
    start: u32,
    len: u32,
    end: End,
    /// Its direct calls that push a return address: `ncalls` entries of the table's
    /// `calls` from `calls`.
    ncalls: u16,
    calls: u32,
    fall: u64,
    /// A conditional branch's target; for an indirect branch or a return, the block key
    /// ([`mode_key`]) it went to last ([`PtDecoder::flow_target`]).
    target: u64,
    /// Linked successors: [fall, target].
    next: [u32; 2],
}

/// The blocks built for one image generation (their records in the [`BlockCache`]'s
/// arena: cleared with it).
///
/// [`BlockCache`]: crate::insn::BlockCache
#[derive(Default)]
pub(crate) struct FlowTable {
    /// The blocks by their start ([`mode_key`]: the address and the execution mode).
    map: HashMap<u64, u32, BuildHasherDefault<AddrHasher>>,
    /// The execution mode of the code the decoder walks (MODE.Exec's), 64-bit until a
    /// MODE.Exec says otherwise.
    mode: FlowMode,
    /// With `--resync-on-error`, after a synchronization at a PSB+ without MODE.Exec:
    /// libipt 2.2's mode is unknown there, and it decodes on only through its block
    /// cache, whose entries keep the mode of the code they were decoded in. The blocks
    /// built before (in [`FlowTable::mode`]) stand for those entries: a block not built
    /// yet is beyond the fast decoder until a MODE.Exec.
    cached_only: bool,
    blocks: Vec<FBlock>,
    /// The direct calls inside blocks: (the block's records up to and including the
    /// call, the return address the call pushes).
    calls: Vec<(u32, u64)>,
    /// Runs decided by the next bits of a TNT packet, by [`memo_key`].
    memo: HashMap<u64, MemoRun, BuildHasherDefault<AddrHasher>>,
    /// The return addresses memoized runs push, in order.
    memo_rets: Vec<u64>,
    /// Records the memoized runs copied into the arena.
    memo_records: usize,
    /// Direct-mapped front of `memo` for the hot loop (hits without hashing): by
    /// [`memo_slot`], the key ([`NO_MEMO`]: none) and the run; made on first use.
    memo_front: Vec<(u64, MemoRun)>,
    /// The pages ([`CODE_PAGE`]) the blocks' code was read from (an instruction's 15
    /// bytes, or the address found without code): what an image change mid-window must
    /// leave as it was for the blocks to stay ([`sideband`]).
    pages: HashSet<u64, BuildHasherDefault<AddrHasher>>,
}

/// Code met after a synchronization without MODE.Exec that the blocks built before do
/// not hold ([`FlowTable::cached_only`]).
const NOT_BUILT: Fallback = "code not met before the mode became unknown";

/// The unit of [`FlowTable::pages`].
const CODE_PAGE: u64 = 1 << 12;

/// Misses of a full memo after which how often it missed is looked at: where that many
/// came within [`MEMO_DENSE`] bytes of trace (code whose TNT patterns rarely repeat: an
/// interpreter's), the memo is not looked up in the next [`MEMO_SKIP`] bytes.
const MEMO_LOOK: u32 = 1 << 10;
const MEMO_DENSE: usize = 2 << 10;
const MEMO_SKIP: usize = 64 << 10;

/// The execution modes the fast decoder walks code in (MODE.Exec's CS.L / CS.D).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum FlowMode {
    #[default]
    Bit64,
    Bit32,
    Bit16,
}

impl FlowMode {
    /// The mode MODE.Exec's bits give (CS.L and CS.D both set is reserved).
    fn of(csl: bool, csd: bool) -> Option<FlowMode> {
        match (csl, csd) {
            (true, false) => Some(FlowMode::Bit64),
            (false, true) => Some(FlowMode::Bit32),
            (false, false) => Some(FlowMode::Bit16),
            (true, true) => None,
        }
    }

    fn exec_mode(self) -> ExecMode {
        match self {
            FlowMode::Bit64 => ExecMode::Bit64,
            FlowMode::Bit32 => ExecMode::Bit32,
            FlowMode::Bit16 => ExecMode::Bit16,
        }
    }
}

/// A block's key: its address, and for 32- and 16-bit code a bit no canonical 64-bit
/// address has in that position with the bits above it clear (bit 62, bit 61).
#[inline(always)]
fn mode_key(ip: u64, mode: FlowMode) -> u64 {
    match mode {
        FlowMode::Bit64 => ip,
        FlowMode::Bit32 => ip | 1 << 62,
        FlowMode::Bit16 => ip | 1 << 61,
    }
}

impl ArenaTied for FlowTable {
    fn clear(&mut self) {
        self.cached_only = false;
        self.map.clear();
        self.blocks.clear();
        self.calls.clear();
        self.memo.clear();
        self.memo_rets.clear();
        self.memo_records = 0;
        self.memo_front.fill((NO_MEMO, MemoRun::default()));
        self.pages.clear();
    }
}

/// The blocks the next bits of a TNT packet take from a conditional block, as one step
/// (libxdc's idea, with every record kept): their records copied one after the other
/// into the arena (one output slice instead of one per block), the return addresses
/// their direct calls push, the block after the last bit's branch, and the bits
/// consumed. `bits` 0: no run from there (an indirect branch, a return or unmapped code
/// comes first, or the walk needs what only the per-bit loop does: building a block
/// that fails, a stretch without trace too long).
#[derive(Debug, Clone, Copy, Default)]
struct MemoRun {
    start: u32,
    len: u32,
    rets: u32,
    nrets: u32,
    next: u32,
    bits: u32,
}

/// Bits a memoized run consumes at most (a short TNT packet's).
const MEMO_BITS: u32 = 6;
/// Records all memoized runs may copy into the arena, and runs (or places without one)
/// memoized, before no new ones are made until the cache starts over: 32 KiB of records
/// and a 32 KiB table, so that a streamed decode's memory stays that of the libipt
/// pipeline's (runs are copies; a program with many branches would otherwise fill
/// megabytes with them), while a hot loop's runs fit.
const MEMO_RECORDS: usize = 1024;
const MEMO_RUNS: usize = 512;

/// A memoized run's key: the block it starts at, and the next `n` bits (the first one
/// the highest).
#[inline(always)]
fn memo_key(block: u32, n: u32, bits: u64) -> u64 {
    (u64::from(block) << 16) | (u64::from(n) << 8) | bits
}

/// Slots of [`FlowTable::memo_front`], and the key of an empty one (no [`memo_key`]).
const MEMO_FRONT: usize = 1 << 9;
const NO_MEMO: u64 = u64::MAX;

/// The slot of a memo key in [`FlowTable::memo_front`] (Fibonacci hashing).
#[inline(always)]
fn memo_slot(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - MEMO_FRONT.trailing_zeros())) as usize
}

/// libipt's return stack: 64 entries, the oldest overwritten when full.
#[derive(Clone)]
struct RetStack {
    slots: [u64; 64],
    top: usize,
    len: usize,
}

impl RetStack {
    fn new() -> Self {
        RetStack {
            slots: [0; 64],
            top: 0,
            len: 0,
        }
    }
    #[inline]
    fn push(&mut self, ip: u64) {
        self.slots[self.top] = ip;
        self.top = (self.top + 1) % 64;
        self.len = (self.len + 1).min(64);
    }
    #[inline]
    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        self.top = (self.top + 63) % 64;
        Some(self.slots[self.top])
    }

    /// This stack (of a decoder that started empty and never popped it empty) on top of
    /// `below` (what the stack held where that decoder started): the stack one decoder
    /// running through both would have.
    fn stacked_on(&self, below: &RetStack) -> RetStack {
        let mut out = below.clone();
        for k in 0..self.len {
            out.push(self.slots[(self.top + 64 - self.len + k) % 64]);
        }
        out
    }
}

/// Takes a TNT packet at the trace position straight into `st` (the common case of the
/// hot loop, without the general packet reader); whether there was one.
#[inline(always)]
fn tnt_here(trace: &[u8], st: &mut FlowState) -> bool {
    match trace.get(st.pos) {
        Some(&b) if short_tnt(b) => {
            let n = 6 - b.leading_zeros();
            st.tnt = u64::from(b >> 1) & ((1 << n) - 1);
            st.tnt_n = n;
            st.pos += 1;
            st.read_on = ReadOn::Nothing;
            true
        }
        _ => false,
    }
}

/// Whether `b` is the header byte of a short TNT packet (bit 0 clear, not PAD or the
/// extended-opcode byte 0x02).
#[inline(always)]
fn short_tnt(b: u8) -> bool {
    b & 1 == 0 && b > 2
}

/// Reads a TIP at the trace position in place, as [`PtDecoder::flow_next_item`] would
/// read it there (its IP, the position past it; `None`: anything else, or an IRET CFE or
/// MWAIT waiting, which that checks).
#[inline(always)]
fn tip_here(trace: &[u8], st: &mut FlowState) -> Option<u64> {
    if st.cfe_ret.is_some() || st.mwait || st.async_tip.is_some() {
        return None;
    }
    let (p, size) = wire::tip_at(trace, st.pos)?;
    let ip = st.last_ip.apply(p)?;
    st.item_at = st.pos;
    st.pos += size;
    st.read_on = ReadOn::Nothing;
    Some(ip)
}

/// The trace's time as libipt 2.1.2's event decoder keeps it: [`Time`] and its
/// [`Calibration`] (the model `dump`'s time columns use too), fed the timing packets as
/// that decoder feeds them. An error libipt's decoder reports (a TMA out of place, a CTC
/// that wrapped more than once, a calibration overflow, a CBR of 0) hands the window to
/// libipt; a configuration error (no CPUID 0x15 ratio) leaves the time where it is, as
/// libipt's decoder ignores it. (2.1.2's decoder never arms the SKL168 check.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Clock {
    time: Time,
    tcal: Calibration,
    /// A CYC packet came (since this clock started: a decoder's own part of the trace).
    met_cyc: bool,
}

/// libipt's decoder: a configuration error is ignored, any other hands the window over.
fn as_decoder(r: Result<(), TimeError>, what: Fallback) -> Result<(), Fallback> {
    match r {
        Ok(()) | Err(TimeError::BadConfig) => Ok(()),
        Err(_) => Err(what),
    }
}

impl Clock {
    /// Whether the times this clock and `o` give from here on are the same: equal in
    /// everything, the cycle-accurate calibration included only where `calibration` (a
    /// CYC packet may come: without one it never shows in a time).
    pub fn joins(&self, o: &Clock, calibration: bool) -> bool {
        self.time.same_course(&o.time) && (!calibration || self.tcal.same_course(&o.tcal))
    }

    /// The clock of a decoder of the whole trace at the end of `pt` (trace from a PSB),
    /// as far as `pt` tells: its timing packets (and OVFs) applied, as the decoder
    /// applies them, to a clock that knew nothing. A decoder that starts at a later PSB
    /// warms its clock up on some trace before it, so that the cycle-accurate
    /// calibration carried over that PSB is known where that trace settles it (an MTC
    /// with cycles after another one, a PSB+ CBR with the nominal frequency...); whether
    /// it did is what the join at the cut checks ([`Clock::joins`]). A default clock
    /// where the packets cannot be read.
    pub fn warmed_up(pt: &[u8], cfg: TimeCfg, e: wire::WireErrata) -> Clock {
        let mut c = Clock::default();
        let (mut p, mut header) = (0, false);
        while p < pt.len() {
            let Some((pkt, n)) = wire::parse_with(pt, p, e).filter(|&(_, n)| n > 0) else {
                return Clock::default();
            };
            p += n;
            match pkt {
                Pkt::Psb => header = true,
                Pkt::Psbend => header = false,
                Pkt::Ovf => c.on_ovf(),
                _ => {
                    if c.on_timing(pkt, header, cfg).is_err() {
                        return Clock::default();
                    }
                }
            }
        }
        c.met_cyc = false;
        c
    }

    /// The clock after libipt's decoder reset (a synchronization after an error): no
    /// time, no calibration (whether a CYC came is kept).
    fn reset(&self) -> Clock {
        Clock {
            met_cyc: self.met_cyc,
            ..Clock::default()
        }
    }

    /// A CYC packet came since this clock started.
    pub fn met_cyc(&self) -> bool {
        self.met_cyc
    }

    /// The time, once a TSC packet gave one.
    #[inline]
    pub fn now(&self) -> Option<u64> {
        self.time.tsc().ok()
    }

    /// Applies `pkt` where it is a timing packet (TSC, TMA, MTC, CYC, CBR), in a PSB+
    /// (`header`) or not, as libipt's event decoder does; whether it was one.
    #[inline]
    fn on_timing(&mut self, pkt: Pkt, header: bool, cfg: TimeCfg) -> Result<bool, Fallback> {
        match pkt {
            Pkt::Tsc(t) => self.on_tsc(t, header)?,
            Pkt::Mtc(c) => self.on_mtc(c, &cfg)?,
            Pkt::Tma { ctc, fc } => self.on_tma(ctc, fc, &cfg)?,
            Pkt::Cyc(c) => self.on_cyc(c, &cfg)?,
            Pkt::Cbr(r) => self.on_cbr(r, header, &cfg)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn on_tsc(&mut self, tsc: u64, header: bool) -> Result<(), Fallback> {
        if header {
            as_decoder(self.tcal.header_tsc(tsc), "TSC calibration failed")?;
        } else {
            self.tcal.tsc_packet(tsc);
        }
        self.time.tsc_packet(tsc);
        Ok(())
    }

    #[inline(never)]
    fn on_cbr(&mut self, ratio: u8, header: bool, cfg: &TimeCfg) -> Result<(), Fallback> {
        let cal = if header {
            self.tcal.header_cbr(ratio, cfg)
        } else {
            self.tcal.cbr_packet(ratio, cfg)
        };
        as_decoder(cal, "CBR of 0")?;
        as_decoder(self.time.cbr_packet(ratio), "CBR of 0")
    }

    /// An OVF: libipt resets its decoder, the time kept, the calibration not.
    pub fn on_ovf(&mut self) {
        self.tcal = Calibration::default();
    }

    #[inline(never)]
    fn on_tma(&mut self, ctc: u16, fc: u16, cfg: &TimeCfg) -> Result<(), Fallback> {
        if cfg.mtc_freq > 15 {
            return Err("MTC frequency out of range");
        }
        as_decoder(self.time.tma_packet(ctc, fc, cfg), "TMA out of place")
    }

    #[inline(never)]
    fn on_mtc(&mut self, payload: u8, cfg: &TimeCfg) -> Result<(), Fallback> {
        if cfg.mtc_freq > 15 {
            return Err("MTC frequency out of range");
        }
        as_decoder(self.tcal.mtc_packet(payload, cfg), "MTC calibration failed")?;
        as_decoder(self.time.mtc_packet(payload, cfg), "MTC out of place")
    }

    /// A CYC: its cycles count toward the calibration, and move the time by the ratio
    /// calibrated so far (lost before any calibration, as in libipt).
    #[inline(never)]
    fn on_cyc(&mut self, cyc: u64, cfg: &TimeCfg) -> Result<(), Fallback> {
        self.met_cyc = true;
        self.tcal.cyc_packet(cyc);
        let fcr = self.tcal.fcr().unwrap_or(0);
        as_decoder(
            self.time.cyc_packet(cyc, cfg, fcr),
            "CTC wrapped more than once",
        )
    }
}

/// Whether `r` is the instruction at `ip`.
#[inline]
fn is_insn_at(r: &Record, ip: u64) -> bool {
    matches!(r, Record::Instruction(i) if i.pc == ip)
}

/// Why the fast decoder handed a window to libipt.
pub(crate) type Fallback = &'static str;

/// Where a run of the engine stopped.
enum Stop {
    /// At a PSB with nothing tentative queued: the records so far can be handed out.
    Segment,
    /// [`FLOW_YIELD_ITEMS`] queued, nothing tentative: handed out before decoding on, so
    /// that a streamed decode holds few records however far apart the PSBs are.
    Yield,
    /// The trace ended.
    Done,
}

/// What a decoder of part of a trace did at a PSB.
enum Cut {
    /// Not a cut: nothing done.
    No,
    /// Passed the cut's PSB+ (as at any PSB), but cannot stop there.
    Passed,
    /// Passed it and stopped, its handoff made.
    Stopped,
}

/// The trace item a branch waits for.
enum TraceItem {
    Tnt,
    Tip(u64),
    Pgd(Option<u64>),
    /// FUP `from` + TIP `to` (`Some`) or + TIP.PGD (`None`, its IP in
    /// [`FlowState::pgd_ip`]).
    Async {
        from: u64,
        to: Option<u64>,
    },
    Pge(u64),
    /// The FUP an event binds to (EXSTOP with IP): the code runs to its IP and on.
    Bound(u64),
    /// A PTW: the code runs through the PTWRITE it binds to (at the IP of the FUP after
    /// it, or the next PTWRITE) and on.
    Ptw(Option<u64>),
    /// A PIP or VMCS outside a PSB+ and an asynchronous branch: the instruction it binds to
    /// (libipt's `pt_insn_binds_to_pip`/`_vmcs`).
    Binds(Binding),
    Psb,
    Ovf,
    /// The trace ended; what came after the last trace item.
    End(ReadOn),
}

/// What a PIP or VMCS packet binds to while tracing is enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    /// PIP (a CR3 change): MOV CR3, VMLAUNCH, VMRESUME or a far transfer.
    Pip,
    /// VMCS (a VMCS pointer change): VMPTRLD, VMLAUNCH, VMRESUME or a far transfer.
    Vmcs,
}

impl Binding {
    /// Whether it binds to `i`: `Some(true)` at a branch (VMLAUNCH, VMRESUME, a far
    /// transfer: the event comes before it, the branch then takes its trace),
    /// `Some(false)` at MOV CR3 or VMPTRLD (the event comes after it), `None` elsewhere.
    fn binds_to(self, i: &crate::records::Instruction) -> Option<bool> {
        if matches!(
            i.class,
            InsnClass::FarCall | InsnClass::FarReturn | InsnClass::FarJump
        ) {
            // (VMLAUNCH and VMRESUME are far returns, as libipt classifies them.)
            return Some(true);
        }
        let binds = match self {
            Binding::Pip => is_mov_cr3(i),
            Binding::Vmcs => {
                let insn =
                    iced_x86::Decoder::with_ip(i.mode.bitness(), i.encoding(), i.pc, 0).decode();
                insn.mnemonic() == iced_x86::Mnemonic::Vmptrld
            }
        };
        binds.then_some(false)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Whether `i` is a MOV to CR3 (libipt's `PTI_INST_MOV_CR3`).
fn is_mov_cr3(i: &crate::records::Instruction) -> bool {
    use iced_x86::{Code, Register};
    let insn = iced_x86::Decoder::with_ip(i.mode.bitness(), i.encoding(), i.pc, 0).decode();
    matches!(insn.code(), Code::Mov_cr_r64 | Code::Mov_cr_r32)
        && insn.op0_register() == Register::CR3
}

/// Instructions libipt walks from a branch to a TSX abort's IP before it takes erratum
/// BDM64 to apply.
const BDM64_STEPS: u64 = 0x100;

/// The target of a direct near jump or call (none: an indirect one).
fn direct_target(i: &crate::records::Instruction) -> Option<u64> {
    let insn = iced_x86::Decoder::with_ip(i.mode.bitness(), i.encoding(), i.pc, 0).decode();
    matches!(
        insn.op0_kind(),
        iced_x86::OpKind::NearBranch16
            | iced_x86::OpKind::NearBranch32
            | iced_x86::OpKind::NearBranch64
    )
    .then(|| insn.near_branch_target())
}

/// What came after the last trace item (TNT, TIP...) where the trace ends: after PADs and
/// timing packets libipt knew the trace ended when it took the item and stops there;
/// after a PSB+ it decodes on without trace to the PSB+'s FUP IP and stops there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadOn {
    /// PAD, TSC, TMA, MTC, TRIG at most.
    Nothing,
    /// A PSB+ with this FUP (and maybe timing packets).
    ToFup(u64),
    /// Others (a CBR): the fast decoder leaves these ends to libipt.
    Other,
}

/// The engine's state between runs (one PSB segment each).
pub(crate) struct FlowState {
    pub pos: usize,
    last_ip: LastIp,
    clock: Clock,
    clock_cfg: TimeCfg,
    tnt: u64,
    tnt_n: u32,
    ret: RetStack,
    enabled: bool,
    synced: bool,
    /// A MODE.Exec came since the synchronization (libipt's mode is unknown before).
    mode_known: bool,
    /// Interrupt flag changes are events ([`super::WindowOptions::iflags_events`]).
    pub iflags: bool,
    /// The interrupt flag the last MODE.Exec stated (none: no MODE.Exec since the
    /// synchronization or the last OVF, where libipt forgets it).
    iflag: Option<bool>,
    /// A MODE.Exec that changes IF was read: the IF event for the FUP (or, while tracing
    /// is disabled, the TIP.PGE) it binds to, with the flag it sets.
    iflag_event: Option<bool>,
    /// The TNT bits after a FUP are taken before it: where its TIP or TIP.PGD starts (the
    /// trace position: the asynchronous branch is read there), and the FUP's IP
    /// ([`PtDecoder::flow_fup_before_tnt`]).
    async_tip: Option<(usize, u64)>,
    /// The block the decoder is at (while enabled).
    cur: u32,
    /// Queue position after the last record the trace decided: what follows it is
    /// tentative (code walked without trace, dropped if the trace ends).
    committed: u64,
    /// Instructions walked since the trace last moved.
    without_trace: u64,
    /// What was read since the last trace item.
    read_on: ReadOn,
    /// Errata the engine checks for.
    bdm70: bool,
    skd022: bool,
    /// BDM64 (a TSX abort's trace may not match the code): where the abort's IP cannot be
    /// reached from the branch before it, libipt takes that branch to have gone there.
    pub bdm64: bool,
    /// Queue position at the last event libipt reports (with a record or not) or PSB: a
    /// block whose branch took trace after it (`committed` past it) ended libipt's block
    /// at that branch.
    event_at: u64,
    /// A MODE.TSX abort was read, its FUP next: whether a branch that took trace came
    /// last before it, with no event after it (libipt's block is not empty: BDM64 may
    /// apply), and its offset.
    tsx_abort: Option<(bool, usize)>,
    /// SKL014 with the address filters the trace was captured with: a TIP.PGD without IP
    /// may also come from a direct jump or call out of the filtered ranges.
    pub skl014: Option<crate::config::AddrFilter>,
    /// How libipt reads the packets on this CPU (errata SKD007, SKZ84).
    pub wire: wire::WireErrata,
    /// The full memo's misses counted from trace position `memo_miss_from`, and where
    /// it is looked up again ([`MEMO_LOOK`]).
    memo_misses: u32,
    memo_miss_from: usize,
    memo_skip_until: usize,
    /// Records the decoder had queued before the engine started (window id, cpu).
    pub initial_records: u64,
    /// Parallel decode: the cuts where this decoder may stop (offset of the cut's PSB in
    /// this decoder's buffer, the segment starting there), ascending; the first not
    /// passed yet.
    cuts: Vec<(usize, usize)>,
    next_cut: usize,
    /// Resuming from a [`Handoff`]: where decoding goes on (tracing enabled).
    resume: Option<u64>,
    /// The last run stopped in the middle of the trace ([`Stop::Yield`]): the next goes
    /// on where it was (the packet there, even a PSB, is the block's to read).
    yielded: bool,
    /// Synchronizing at a cut, not at the trace's start: the sequential decoder passes
    /// that PSB+ without a sync-point timestamp.
    at_cut: bool,
    /// Where the last trace item read ([`PtDecoder::flow_next_item`]) starts.
    item_at: usize,
    /// An MWAIT was read: its EXSTOP comes next.
    mwait: bool,
    /// The queue position when a PIP (`[0]`) or VMCS (`[1]`) last bound to a branch
    /// (libipt binds at most one of each to an instruction).
    bound_branch: [Option<u64>; 2],
    /// Resynchronize after a decode error as libipt 2.2's `pt_blk_resync`
    /// ([`super::WindowOptions::resync_on_error`]).
    pub resync: bool,
    /// The decode error the engine stopped at (a gap, not something to hand to libipt).
    error: Option<FlowError>,
    /// It resynchronized after an error: its records no longer are libipt's.
    resynced: bool,
    /// The PSB a resynchronization at the next PSB tried last.
    psb_tried: Option<usize>,
    /// A CFE of an IRET, a VM entry or a UIRET was read: the next trace item is the TIP
    /// or TIP.PGD of that instruction.
    cfe_ret: Option<CfeRet>,
    /// After a resync at a TIP, a MODE.TSX, PTW or TRIG the resync search read still
    /// waits for its FUP: libipt 2.2's resync leaves it in its event decoder's queue (a
    /// TRIG with the IP bit and no FUP after it too, met anywhere with the option). A PSB
    /// is then libipt's context error (no event is carried across a PSB), a FUP goes
    /// beyond the fast decoder, an OVF drops it.
    event_waits: bool,
    /// An overflow resolved at a FUP without IP, no trace item read since: libipt's block
    /// decoder takes it as resolved with tracing disabled, its event decoder as enabled,
    /// so trace of code next is libipt's "no enable" at the block decoder's next query
    /// (not the context error of trace while tracing is disabled).
    ovf_unplaced: bool,
    /// The CFE of an asynchronous event was read: the next FUP is its branch's, which
    /// libipt binds the event to (not a FUP bound to nothing).
    cfe_fup: bool,
    /// The IP of the TIP.PGD of the last asynchronous disable read (none: suppressed).
    pgd_ip: Option<u64>,
    /// Where the last deferred TIP taken starts and ends (the TNT bits before it still
    /// used while the trace is read no further): libipt's error offsets there are not the
    /// engine's.
    deferred_tip: Option<(usize, usize)>,
    /// The FUP IP of the PSB+ the flow passed last (for the disable after it).
    psb_fup: Option<u64>,
    /// Where the last PSBEND starts, and the packet after it.
    psbend: Option<(usize, usize)>,
    /// Whether the last PSB+ read was a synchronization's (not passed while decoding).
    psb_sync: bool,
    /// SKD010 and APL12 (how an overflow resolves): where libipt's look-ahead finds the
    /// erratum applies, the window goes to libipt ([`ovf_errata`]).
    pub skd010: bool,
    pub apl12: bool,
    /// APL11: an OVF followed by a TIP.PGD (timing packets between) resolves disabled
    /// after it (as with SKD010).
    pub apl11: bool,
}

/// Where a decoder of part of a trace stopped (parallel decode): the engine's state right
/// after the PSB+ of a cut, the instructions of the block waiting there up to the PSB+'s
/// FUP IP included in its records, as one decoder of the whole trace has it there.
#[derive(Clone)]
pub(crate) struct Handoff {
    /// The segment that starts at the cut.
    pub cut: usize,
    /// Offset after the PSB+, from the cut's PSB.
    pos: usize,
    pub enabled: bool,
    /// The FUP IP, where decoding goes on (tracing enabled).
    pub ip: Option<u64>,
    last_ip: LastIp,
    pub clock: Clock,
    ret: RetStack,
    pub tsc: Option<u64>,
    pub pending_timestamp: bool,
    pub last_timestamp: Option<u64>,
    /// No timestamp emitted since the decoder started at a cut: `last_timestamp` is the
    /// one before (see [`Handoff::after`]).
    pub ts_unknown: bool,
}

impl Handoff {
    /// This handoff of a decoder that started at `before`'s cut, which joined there:
    /// with what the decoder could not know (the return stack below its start, the last
    /// timestamp where it emitted none) taken from `before`.
    pub fn after(mut self, before: &Handoff) -> Handoff {
        self.ret = self.ret.stacked_on(&before.ret);
        if self.ts_unknown {
            self.ts_unknown = false;
            self.last_timestamp = before.last_timestamp;
        }
        self
    }
}

/// How a decoder that synchronized at a cut started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CutStart {
    pub enabled: bool,
    pub ip: Option<u64>,
    pub clock: Clock,
    pub tsc: Option<u64>,
}

impl CutStart {
    /// Whether a decoder that synchronized at the cut gives the records one decoder of the
    /// whole trace gives after `h`, the same cut passed (its first timestamp aside, which
    /// it emits whatever it is; and it must not run out of return stack, where it fails).
    pub fn joins(&self, h: &Handoff, calibration: bool) -> bool {
        self.enabled == h.enabled
            && self.ip == h.ip
            && self.clock.joins(&h.clock, calibration)
            && self.tsc == h.tsc
            && !h.pending_timestamp
    }
}

/// A decoder of part of a trace: how it started and how it ended.
pub(crate) type PartReport = crate::decoder::PartReport<CutStart, Handoff>;

/// Where a decoder of part of a trace starts.
pub(crate) type PartStart = crate::decoder::PartStart<Handoff>;

impl crate::decoder::CutHandoff for Handoff {
    fn cut(&self) -> usize {
        self.cut
    }

    fn last_timestamp(&self) -> Option<u64> {
        self.last_timestamp
    }

    fn after(self, before: &Handoff) -> Handoff {
        Handoff::after(self, before)
    }
}

impl crate::decoder::CutJoin<Handoff> for CutStart {
    fn joins(&self, h: &Handoff, calibration: bool) -> bool {
        CutStart::joins(self, h, calibration)
    }
}

impl FlowState {
    /// Takes the interrupt flag a MODE.Exec outside a PSB+ states: whether it is an IF
    /// event to libipt (with iflags events: the flag changed, or was not known).
    fn take_iflag(&mut self, iflag: bool) -> bool {
        let event = self.iflags && self.iflag != Some(iflag);
        self.iflag = Some(iflag);
        event
    }

    /// A CYC packet came since this engine's clock started (its part of the trace).
    pub fn met_cyc(&self) -> bool {
        self.clock.met_cyc()
    }

    pub fn new(bdm70: bool, skd022: bool, clock_cfg: TimeCfg) -> Self {
        FlowState {
            pos: 0,
            last_ip: LastIp::default(),
            clock: Clock::default(),
            clock_cfg,
            tnt: 0,
            tnt_n: 0,
            ret: RetStack::new(),
            enabled: false,
            synced: false,
            mode_known: false,
            iflags: false,
            iflag: None,
            iflag_event: None,
            async_tip: None,
            cur: NO_BLOCK,
            committed: 0,
            without_trace: 0,
            read_on: ReadOn::Nothing,
            bdm70,
            skd022,
            skd010: false,
            apl12: false,
            apl11: false,
            initial_records: 0,
            cuts: Vec::new(),
            next_cut: 0,
            resume: None,
            yielded: false,
            at_cut: false,
            cfe_ret: None,
            cfe_fup: false,
            event_waits: false,
            ovf_unplaced: false,
            pgd_ip: None,
            deferred_tip: None,
            psb_fup: None,
            psbend: None,
            psb_sync: false,
            mwait: false,
            bound_branch: [None; 2],
            bdm64: false,
            event_at: 0,
            wire: wire::WireErrata::default(),
            memo_misses: 0,
            memo_miss_from: 0,
            memo_skip_until: 0,
            tsx_abort: None,
            skl014: None,
            item_at: 0,
            resync: false,
            error: None,
            resynced: false,
            psb_tried: None,
        }
    }

    /// The engine of a decoder of part of a trace, starting at `start`, stopping at the
    /// first of `cuts` it can; `before`: trace up to a cut's PSB to warm the clock up on
    /// ([`Clock::warmed_up`]).
    pub fn for_part(mut self, start: &PartStart, cuts: Vec<(usize, usize)>, before: &[u8]) -> Self {
        self.cuts = cuts;
        match start {
            PartStart::Trace => {}
            PartStart::Cut => {
                self.at_cut = true;
                self.clock = Clock::warmed_up(before, self.clock_cfg, self.wire);
            }
            PartStart::Handoff(h) => {
                self.read_on = h.ip.map_or(ReadOn::Nothing, ReadOn::ToFup);
                self.pos = h.pos;
                self.last_ip = h.last_ip;
                self.clock = h.clock;
                self.ret = h.ret.clone();
                self.enabled = h.enabled;
                self.synced = true;
                // (Handoffs are made in 64-bit code only.)
                self.mode_known = true;
                self.resume = h.ip;
            }
        }
        self
    }
}

impl<'a> PtDecoder<'a> {
    /// A fast decoder of part of a trace for parallel decode: `pt` starts at the trace's
    /// start ([`PartStart::Trace`]) or at a cut's PSB (`before`: some trace up to it,
    /// from an earlier PSB, to warm the clock up on); it stops at the first of `cuts`
    /// where it can, or at the end. Without sideband events or address filters.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_part(
        pt: &'a [u8],
        before: &[u8],
        params: crate::TraceParams,
        image: crate::AddressSpace,
        resolver: crate::ImageResolver,
        opts: super::WindowOptions,
        start: PartStart,
        cuts: Vec<(usize, usize)>,
    ) -> Result<Self, crate::DecodeError> {
        // (Whether the trace has TSC packets matters to sideband only: it has none.)
        let mut d = Self::new_inner(pt, params, image, Vec::new(), resolver, opts, false)?;
        d.part = Some(Box::default());
        // (What it will most likely decode: its segment. The output's reservation follows.)
        if let Some(&(next, _)) = cuts.first() {
            d.pt_len = d.pt_len.min(next + next / 4);
        }
        match d.flow.take() {
            Some(f) => d.flow = Some(Box::new(f.for_part(&start, cuts, before))),
            None => {
                if let Some(p) = d.part.as_mut() {
                    p.failed = Some("not a trace for the fast decoder");
                }
            }
        }
        match &start {
            PartStart::Trace => {}
            PartStart::Cut => d.ts_unknown = true,
            PartStart::Handoff(h) => {
                d.tsc = h.tsc;
                d.pending_timestamp = h.pending_timestamp;
                d.last_timestamp = h.last_timestamp;
                d.ts_unknown = h.ts_unknown;
            }
        }
        Ok(d)
    }

    /// Decodes to the end or the cut where it stops: the records (as
    /// [`collect_compact`](Self::collect_compact)) and how it started and ended.
    pub(crate) fn collect_part(&mut self) -> (super::CompactRecords, PartReport) {
        let recs = self.collect_compact_mut();
        let mut report = self.part.take().map(|p| *p).unwrap_or_default();
        report.timestamped = self.last_timestamp.is_some() && !self.ts_unknown;
        (recs, report)
    }
}

impl PtDecoder<'_> {
    /// Runs the fast engine to the next PSB segment boundary or the end: `Ok(true)` when
    /// the trace ended, `Err` when the window must go to libipt (nothing of this run
    /// should be handed out then).
    pub(super) fn flow_run(&mut self) -> Result<bool, Fallback> {
        let generation = self
            .shared
            .space
            .try_borrow()
            .map_err(|_| "image busy")?
            .generation();
        // (The queue is empty: the arena may start over.)
        self.blocks.validate(generation);
        let Some(mut st) = self.flow.take() else {
            return Ok(true);
        };
        st.committed = self.queue.pushed;
        let mut r = self.flow_segment(&mut st);
        if r.is_err() && (st.resync || st.error.is_some()) {
            r = if self.timeline.is_done() {
                self.flow_recover(&mut st, r)
            } else {
                // (libipt's time after a decode error can come from packets the fast
                // decoder does not read there: sideband applied after it could differ.)
                Err("a decode error while sideband events are pending")
            };
        }
        if matches!(r, Ok(Stop::Segment)) && !st.cuts.is_empty() {
            let at = st
                .enabled
                .then(|| self.blocks.flow.blocks.get(st.cur as usize).copied())
                .flatten();
            r = match self.flow_cut(&mut st, at) {
                Ok(Cut::Stopped) => Ok(Stop::Done),
                Ok(_) => Ok(Stop::Segment),
                Err(e) => Err(e),
            };
        }
        if let Some(why) = self.sideband_failed {
            // (Nothing decoded after that change is handed out.)
            r = Err(why);
        }
        self.flow = Some(st);
        match r? {
            Stop::Segment | Stop::Yield => Ok(false),
            Stop::Done => Ok(true),
        }
    }

    /// At a PSB of a decoder of part of a trace, the decoder waiting for trace in block
    /// `at` (tracing enabled): where it is a cut, passes its PSB+ as one decoder of the
    /// whole trace does, adds the instructions of `at` before the FUP IP (where the next
    /// decoder starts; code walked without trace before `at` is confirmed by it), and
    /// stops there with its [`Handoff`].
    fn flow_cut(&mut self, st: &mut FlowState, at: Option<FBlock>) -> Result<Cut, Fallback> {
        while st.cuts.get(st.next_cut).is_some_and(|c| c.0 < st.pos) {
            st.next_cut += 1;
        }
        let Some(&(off, cut)) = st.cuts.get(st.next_cut) else {
            return Ok(Cut::No);
        };
        if off != st.pos {
            return Ok(Cut::No);
        }
        st.next_cut += 1;
        let fup = self.flow_psb(st, false, at)?;
        if self.blocks.flow.mode != FlowMode::Bit64 {
            // (A handoff carries no execution mode: 32- and 16-bit code is not split.)
            return Ok(Cut::Passed);
        }
        let ip = match (at, fup) {
            (Some(b), Some(ip)) => {
                let n = self.flow_index_of(b, ip);
                let last = self.flow_recs(b).iter().rposition(|r| is_insn_at(r, ip));
                let Some(n) = n.filter(|&n| Some(n as usize) == last) else {
                    // (The FUP IP in code walked before `at`, or twice in `at`: not a
                    // place to split.)
                    return Ok(Cut::Passed);
                };
                self.flow_push_block(st, b, n);
                Some(ip)
            }
            (None, None) if self.queue.pushed == st.committed => None,
            _ => return Ok(Cut::Passed),
        };
        self.flow_commit(st);
        if let Some(part) = self.part.as_mut() {
            part.end = Some(Handoff {
                cut,
                pos: st.pos - off,
                enabled: st.enabled,
                ip,
                last_ip: st.last_ip,
                clock: st.clock,
                ret: st.ret.clone(),
                tsc: self.tsc,
                pending_timestamp: self.pending_timestamp,
                last_timestamp: self.last_timestamp,
                ts_unknown: self.ts_unknown,
            });
        }
        Ok(Cut::Stopped)
    }

    fn flow_segment(&mut self, st: &mut FlowState) -> Result<Stop, Fallback> {
        if !st.synced {
            let Some(p) = wire::find_psb(self.trace, 0) else {
                return Ok(Stop::Done);
            };
            let Some(p) = self.flow_first_sync(st, p) else {
                return Ok(Stop::Done);
            };
            st.pos = p;
            st.synced = true;
            self.pending_timestamp = !st.at_cut;
            let fup = self.flow_psb(st, true, None)?;
            if let Some(part) = self.part.as_mut() {
                part.start = Some(CutStart {
                    enabled: st.enabled,
                    ip: fup.filter(|_| st.enabled),
                    clock: st.clock,
                    tsc: self.tsc,
                });
            }
        } else if let Some(ip) = st.resume.take() {
            st.cur = self.flow_block(ip)?;
        } else if !std::mem::take(&mut st.yielded)
            && self.pkt(st.pos).is_some_and(|(p, _)| p == Pkt::Psb)
        {
            // A segment starts at the PSB where the last one stopped.
            let at = st
                .enabled
                .then(|| self.blocks.flow.blocks.get(st.cur as usize).copied())
                .flatten();
            st.psb_fup = self.flow_psb(st, false, at)?;
        }
        loop {
            if !st.enabled {
                let ovf_unplaced = std::mem::take(&mut st.ovf_unplaced);
                match self.flow_next_item(st)? {
                    TraceItem::Pge(ip) => {
                        if !st.mode_known {
                            // (Hardware writes a MODE.Exec before each TIP.PGE.)
                            return Err("TIP.PGE with no MODE.Exec since the synchronization");
                        }
                        self.flow_event(st, Record::TraceEnabled { ip });
                        if let Some(enabled) = st.iflag_event.take() {
                            let ip = Some(ip);
                            self.flow_event(st, Record::InterruptFlag { enabled, ip });
                        }
                        self.flow_blocks_anew_for_sideband();
                        st.enabled = true;
                        st.cur = self.flow_block(ip)?;
                    }
                    TraceItem::Psb => {
                        if self.queue.pushed == st.committed {
                            return Ok(Stop::Segment);
                        }
                        self.flow_psb(st, false, None)?;
                    }
                    TraceItem::End(_) => return Ok(Stop::Done),
                    // (An overflow while tracing is disabled resolves as one while it is
                    // enabled: at the FUP after it, or disabled.)
                    TraceItem::Ovf => self.flow_ovf(st)?,
                    // (Trace of code: libipt's context error at it. Right after the
                    // PSB+ of a synchronization, timing packets at most between, libipt's
                    // synchronization fails instead, at the PSBEND: through libipt, or
                    // with `--resync-on-error` at the synchronization, `flow_psb_refused`.)
                    TraceItem::Tnt if ovf_unplaced => return Err(self.flow_no_enable(st)),
                    TraceItem::Tnt | TraceItem::Tip(_) => {
                        if st.psb_sync && self.flow_right_after_psb_past(st, false) {
                            return Err("trace after a PSB+ while tracing is disabled");
                        }
                        return Err(self.flow_context_at(
                            st,
                            st.item_at,
                            "trace while tracing is disabled",
                        ));
                    }
                    _ => return Err("trace while tracing is disabled"),
                }
                continue;
            }
            match self.flow_hot(st)? {
                Some(stop) => return Ok(stop),
                None => continue,
            }
        }
    }

    /// Whether the last trace item read comes right after a PSB+ (timing packets, PADs
    /// and CBRs between them at most).
    fn flow_right_after_psb(&self, st: &FlowState) -> bool {
        st.psbend.is_some_and(|(_, mut p)| {
            while let Some((Pkt::Pad | Pkt::Tsc(_) | Pkt::Mtc(_), n))
            | Some((Pkt::Tma { .. } | Pkt::Cyc(_) | Pkt::Cbr(_), n)) = self.pkt(p)
            {
                p += n;
            }
            p == st.item_at
        })
    }

    /// Whether the last trace item read comes right after a PSB+, PADs and timing packets
    /// between at most (and MODE.Execs, with `modes`).
    fn flow_right_after_psb_past(&self, st: &FlowState, modes: bool) -> bool {
        st.psbend.is_some_and(|(_, mut p)| loop {
            p = self.flow_past_timing_at(p);
            match self.pkt(p) {
                Some((Pkt::ModeExec { .. }, n)) if modes => p += n,
                _ => return p == st.item_at,
            }
        })
    }

    /// Decodes from the current block while the trace is TNT and TIP; returns at a
    /// segment boundary or the end (`Some`), or after an event (`None`).
    #[inline]
    fn flow_hot(&mut self, st: &mut FlowState) -> Result<Option<Stop>, Fallback> {
        loop {
            // (The block is copied where it is used: a memoized run needs its index only.)
            let end = self
                .blocks
                .flow
                .blocks
                .get(st.cur as usize)
                .ok_or("no block")?
                .end;
            match end {
                End::Nomap | End::BadInsn => return self.flow_nomap(st, self.flow_cur(st)?),
                End::Continue => {
                    let b = self.flow_cur(st)?;
                    st.without_trace += u64::from(b.len);
                    if st.without_trace > super::MAX_INSNS_WITHOUT_TRACE {
                        return Err("too many instructions without trace");
                    }
                    self.flow_push_block(st, b, b.len);
                    st.cur = self.flow_link(st.cur, 0, b.fall)?;
                    continue;
                }
                End::Cond => {
                    if st.tnt_n == 0 && !tnt_here(self.trace, st) {
                        match self.flow_next_item(st)? {
                            TraceItem::Tnt => {}
                            other => return self.flow_item_at(st, self.flow_cur(st)?, other),
                        }
                    }
                    if st.tnt_n > 1 {
                        if let Some(run) = self.flow_memo(st) {
                            st.tnt_n -= run.bits;
                            self.flow_push(run.start, run.len);
                            if run.nrets != 0 {
                                self.flow_memo_rets(st, run);
                            }
                            self.flow_commit(st);
                            st.cur = run.next;
                            if self.flow_yield(st) {
                                return Ok(Some(Stop::Yield));
                            }
                            continue;
                        }
                    }
                    let b = self.flow_cur(st)?;
                    st.tnt_n -= 1;
                    let taken = (st.tnt >> st.tnt_n) & 1 != 0;
                    self.flow_push_block(st, b, b.len);
                    self.flow_commit(st);
                    let (next, k) = if taken { (b.target, 1) } else { (b.fall, 0) };
                    st.cur = self.flow_link(st.cur, k, next)?;
                    if self.flow_yield(st) {
                        return Ok(Some(Stop::Yield));
                    }
                }
                End::Return => {
                    let b = self.flow_cur(st)?;
                    if st.tnt_n == 0 && !tnt_here(self.trace, st) {
                        let item = match tip_here(self.trace, st) {
                            Some(ip) => TraceItem::Tip(ip),
                            None => self.flow_next_item(st)?,
                        };
                        match item {
                            TraceItem::Tnt => {}
                            TraceItem::Tip(_) if st.cfe_ret.is_some() => {
                                return Err("IRET CFE at a near return")
                            }
                            TraceItem::Tip(ip) => {
                                self.flow_push_block(st, b, b.len);
                                self.flow_commit(st);
                                st.cur = self.flow_target(st.cur, ip)?;
                                if self.flow_yield(st) {
                                    return Ok(Some(Stop::Yield));
                                }
                                continue;
                            }
                            other => return self.flow_item_at(st, b, other),
                        }
                    }
                    st.tnt_n -= 1;
                    if (st.tnt >> st.tnt_n) & 1 == 0 {
                        return Err(self.flow_bad_retcomp(st, b));
                    }
                    // (The block's own calls first: a callee's return may end it.)
                    self.flow_push_block(st, b, b.len);
                    let Some(ip) = st.ret.pop() else {
                        return Err(self.flow_retstack_empty(st, b));
                    };
                    self.flow_commit(st);
                    st.cur = self.flow_target(st.cur, ip)?;
                    if self.flow_yield(st) {
                        return Ok(Some(Stop::Yield));
                    }
                }
                End::Indirect | End::IndirectCall | End::Syscall => {
                    let b = self.flow_cur(st)?;
                    let item = if st.tnt_n != 0 {
                        self.flow_deferred_tip(st, b)?
                    } else if let Some(ip) = tip_here(self.trace, st) {
                        TraceItem::Tip(ip)
                    } else {
                        match self.flow_next_item(st)? {
                            TraceItem::Tnt => self.flow_deferred_tip(st, b)?,
                            item => item,
                        }
                    };
                    match item {
                        TraceItem::Tip(ip) => {
                            if st.cfe_ret.is_some() {
                                self.flow_cfe_ret_tip(st, b)?;
                            }
                            self.flow_push_block(st, b, b.len);
                            if b.end == End::IndirectCall {
                                st.ret.push(b.fall);
                            }
                            self.flow_commit(st);
                            st.cur = self.flow_target(st.cur, ip)?;
                            if self.flow_yield(st) {
                                return Ok(Some(Stop::Yield));
                            }
                        }
                        other => return self.flow_item_at(st, b, other),
                    }
                }
            }
        }
    }

    /// Whether the walk is at a block without code (a branch to unmapped code), nothing
    /// walked since the last trace item.
    fn flow_at_unmapped(&self, st: &FlowState) -> bool {
        st.without_trace == 0
            && self.queue.pushed == st.committed
            && self
                .flow_cur(st)
                .is_ok_and(|b| b.end.no_code() && b.len == 0)
    }

    /// The block the walk is at.
    #[inline(always)]
    fn flow_cur(&self, st: &FlowState) -> Result<FBlock, Fallback> {
        self.blocks
            .flow
            .blocks
            .get(st.cur as usize)
            .copied()
            .ok_or("no block")
    }

    /// An indirect branch with TNT bits pending (those of the TNT packet just read, or
    /// left of one): a deferred TIP. Real hardware may write a TIP after the TNT packet
    /// that holds the bits of the branches after it; libipt reads ahead past that TNT
    /// (PADs between) to the TIP, takes its IP as the branch's target and keeps the bits.
    /// Where the next event is no TIP, libipt's query fails (block `b`'s branch: a bad
    /// query). (Timing packets before the TIP: libipt takes them as its time.)
    #[cold]
    #[inline(never)]
    fn flow_deferred_tip(&mut self, st: &mut FlowState, b: FBlock) -> Result<TraceItem, Fallback> {
        if let Some((tip_at, _)) = st.async_tip {
            // (Bits of a FUP's TNT packets left: its asynchronous branch takes the TIP
            // after them, libipt's query decoder stands at the next of those packets, or
            // at the TIP. A TIP.PGE in its place, or a PSB without the option: through
            // libipt.)
            let why = "indirect branch with the TNT bits before an asynchronous branch's TIP";
            // (With the option, a PSB in the TIP's place too: libipt's read-ahead fails at
            // it, and its resync, the FUP still waiting, fails there again.)
            let tip = match self.pkt(tip_at) {
                Some((Pkt::Tip(_) | Pkt::TipPgd(_), _)) => true,
                Some((Pkt::Other(what), _)) => resync::refused_text(what).is_some(),
                Some((Pkt::Psb, _)) => st.resync,
                _ => false,
            };
            let mut q = st.pos;
            while let Some((
                Pkt::Tnt { .. }
                | Pkt::Pad
                | Pkt::Tsc(_)
                | Pkt::Mtc(_)
                | Pkt::Tma { .. }
                | Pkt::Cyc(_),
                size,
            )) = self.pkt(q).filter(|_| q < tip_at)
            {
                q += size;
            }
            if q != tip_at || !tip {
                return Err(why);
            }
            let at = self.flow_past_pads(st.pos);
            return Err(self.flow_query_failed(st, b, at, at, why));
        }
        let mut p = st.pos;
        while let Some((Pkt::Pad, size)) = self.pkt(p) {
            p += size;
        }
        let Some((Pkt::Tip(payload), size)) = self.pkt(p) else {
            let mut q = self.flow_past_timing_at(p);
            // (A MODE.Exec that is no event to libipt and the FUP it binds to: its event
            // decoder passes both, looking for the TIP.)
            let mut quiet_mode = false;
            if let Some((Pkt::ModeExec { csl, csd, iflag }, size)) = self.pkt(q) {
                let same = self.flow_mode_unchanged(st, csl, csd, iflag);
                if let (true, Some((Pkt::Fup(_), fup))) = (same, self.pkt(q + size)) {
                    q = self.flow_past_timing_at(q + size + fup);
                    quiet_mode = true;
                }
            }
            match self.pkt(q) {
                Some((Pkt::Tip(_), _)) if quiet_mode => {
                    return Err("deferred TIP after a MODE.Exec that changes nothing")
                }
                // (Timing packets first: libipt's query decoder reads them on the way,
                // its time theirs from then on.)
                Some((Pkt::Tip(payload), size)) => {
                    let mut t = p;
                    while t < q {
                        let (pkt, n) = self.pkt(t).ok_or("deferred TIP after timing packets")?;
                        st.clock.on_timing(pkt, false, st.clock_cfg)?;
                        t += n;
                    }
                    let ip = st.last_ip.apply(payload).ok_or("TIP without IP")?;
                    st.pos = q + size;
                    st.deferred_tip = Some((q, st.pos));
                    return Ok(TraceItem::Tip(ip));
                }
                // (libipt's text names what 2.1.2 does not know.)
                Some((Pkt::Trig(_), _)) => return Err("TRIG after TNT bits at an indirect branch"),
                _ => {}
            }
            // (Erratum SKD007's OVF in a CYC: libipt stands at its second byte.)
            let at = match (self.pkt(p), wire::parse(self.trace, p)) {
                (Some((Pkt::Ovf, _)), Some((Pkt::Cyc(_), _))) => p + 1,
                _ => p,
            };
            // (libipt's query for the branch's target fails, a bad query, its query
            // decoder past the TNT it took the bits from and the PADs after it.)
            let why = "indirect branch with TNT bits pending, no TIP after them";
            return Err(self.flow_query_failed(st, b, at, at, why));
        };
        let ip = st.last_ip.apply(payload).ok_or("TIP without IP")?;
        st.pos = p + size;
        st.deferred_tip = Some((p, st.pos));
        Ok(TraceItem::Tip(ip))
    }

    /// The memoized run from the conditional block `st.cur` for the pending TNT bits (up
    /// to [`MEMO_BITS`]), made on first use; `None` where there is none.
    #[inline(always)]
    fn flow_memo(&mut self, st: &mut FlowState) -> Option<MemoRun> {
        let n = st.tnt_n.min(MEMO_BITS);
        let bits = (st.tnt >> (st.tnt_n - n)) & ((1 << n) - 1);
        if st.pos < st.memo_skip_until {
            return None;
        }
        let key = memo_key(st.cur, n, bits);
        let slot = memo_slot(key);
        if let Some(&(k, r)) = self.blocks.flow.memo_front.get(slot) {
            if k == key {
                return (r.bits > 0).then_some(r);
            }
        }
        self.flow_memo_slow(st, n, bits, key)
    }

    /// [`Self::flow_memo`] past its front cache: the memo (the run put in front), or a
    /// new run.
    #[inline(never)]
    fn flow_memo_slow(
        &mut self,
        st: &mut FlowState,
        n: u32,
        bits: u64,
        key: u64,
    ) -> Option<MemoRun> {
        match self.blocks.flow.memo.get(&key) {
            Some(&r) => {
                self.flow_memo_front(key, r);
                (r.bits > 0).then_some(r)
            }
            None => self.flow_memo_make(st, n, bits, key),
        }
    }

    /// Puts `run` in front of the memo.
    fn flow_memo_front(&mut self, key: u64, run: MemoRun) {
        let front = &mut self.blocks.flow.memo_front;
        if front.is_empty() {
            front.resize(MEMO_FRONT, (NO_MEMO, MemoRun::default()));
        }
        if let Some(e) = front.get_mut(memo_slot(key)) {
            *e = (key, run);
        }
    }

    /// Walks from block `from` as the per-bit loop would for the `n` bits `bits`, and
    /// keeps what it did up to the last bit whose branch it could follow.
    #[cold]
    #[inline(never)]
    fn flow_memo_make(
        &mut self,
        st: &mut FlowState,
        n: u32,
        bits: u64,
        key: u64,
    ) -> Option<MemoRun> {
        let from = st.cur;
        let full = self.blocks.flow.memo_records >= MEMO_RECORDS
            || self.blocks.flow.memo.len() >= MEMO_RUNS;
        if full {
            if st.memo_misses == 0 {
                st.memo_miss_from = st.pos;
            }
            st.memo_misses += 1;
            if st.memo_misses >= MEMO_LOOK {
                if st.pos.saturating_sub(st.memo_miss_from) < MEMO_DENSE {
                    st.memo_skip_until = st.pos + MEMO_SKIP;
                }
                st.memo_misses = 0;
            }
            return None;
        }
        // (records start, length, the block) of the walk, and how far it is good: the
        // blocks up to a conditional branch followed, the bits, the block after.
        let mut walk: Vec<(u32, u32, u32)> = Vec::new();
        let (mut good, mut used, mut next) = (0usize, 0u32, NO_BLOCK);
        let mut cur = from;
        let mut without = 0u64;
        while used < n {
            let Some(&b) = self.blocks.flow.blocks.get(cur as usize) else {
                break;
            };
            let (k, ip) = match b.end {
                End::Continue => {
                    without += u64::from(b.len);
                    if without > super::MAX_INSNS_WITHOUT_TRACE {
                        break;
                    }
                    (0, b.fall)
                }
                End::Cond => {
                    let taken = (bits >> (n - used - 1)) & 1 != 0;
                    if taken {
                        (1, b.target)
                    } else {
                        (0, b.fall)
                    }
                }
                _ => break,
            };
            walk.push((b.start, b.len, cur));
            let Ok(to) = self.flow_link(cur, k, ip) else {
                break;
            };
            cur = to;
            if b.end == End::Cond {
                used += 1;
                without = 0;
                good = walk.len();
                next = cur;
            }
        }
        let mut run = MemoRun {
            start: 0,
            len: 0,
            rets: 0,
            nrets: 0,
            next,
            bits: used,
        };
        if used > 0 {
            let t = &mut self.blocks;
            let (Ok(start), Ok(rets)) = (
                u32::try_from(t.arena.len()),
                u32::try_from(t.flow.memo_rets.len()),
            ) else {
                return None;
            };
            run.start = start;
            run.rets = rets;
            let walked = walk.get(..good).unwrap_or(&[]);
            // Blocks whose records already lie one after the other in the arena (built in
            // the order walked) are that range: nothing copied, and the output's entries
            // still join it with its neighbours.
            let contiguous = walked.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0);
            if let (true, Some(&(s, _, _))) = (contiguous, walked.first()) {
                run.start = s;
            }
            for &(s, l, blk) in walked {
                let (s, l) = (s as usize, l as usize);
                if s + l > t.arena.len() {
                    return None;
                }
                if !contiguous {
                    t.arena.extend_from_within(s..s + l);
                }
                run.len += l as u32;
                if let Some(b) = t.flow.blocks.get(blk as usize) {
                    let (first, count) = (b.calls as usize, usize::from(b.ncalls));
                    if let Some(calls) = t.flow.calls.get(first..first + count) {
                        t.flow.memo_rets.extend(calls.iter().map(|c| c.1));
                    }
                }
            }
            run.nrets = t.flow.memo_rets.len() as u32 - rets;
            if !contiguous {
                t.flow.memo_records += run.len as usize;
            }
        }
        self.blocks.flow.memo.insert(key, run);
        self.flow_memo_front(key, run);
        (run.bits > 0).then_some(run)
    }

    #[cold]
    #[inline(never)]
    fn flow_memo_rets(&mut self, st: &mut FlowState, run: MemoRun) {
        let (first, count) = (run.rets as usize, run.nrets as usize);
        for &ret in self
            .blocks
            .flow
            .memo_rets
            .get(first..first + count)
            .unwrap_or(&[])
        {
            st.ret.push(ret);
        }
    }

    /// Whether to hand out what is queued before decoding on (all of it decided by the
    /// trace, and [`FLOW_YIELD_ITEMS`] of it).
    #[inline(always)]
    fn flow_yield(&self, st: &mut FlowState) -> bool {
        if self.queue.len() < FLOW_YIELD_ITEMS {
            return false;
        }
        st.yielded = true;
        true
    }

    /// A trace item other than the one block `b`'s branch takes: a disable, an
    /// asynchronous event, a PSB, the end.
    #[cold]
    fn flow_item_at(
        &mut self,
        st: &mut FlowState,
        b: FBlock,
        item: TraceItem,
    ) -> Result<Option<Stop>, Fallback> {
        match item {
            TraceItem::End(ReadOn::Nothing) => {
                // What was walked without trace never ran as far as the trace tells.
                self.flow_drop_walked(st);
                Ok(Some(Stop::Done))
            }
            TraceItem::End(read_on) => {
                // libipt read on past the last trace item: the code walked, and this
                // block up to the FUP IP.
                let ReadOn::ToFup(ip) = read_on else {
                    return Err("the trace ends after a status packet");
                };
                let n = self
                    .flow_index_of(b, ip)
                    .ok_or("the trace ends after a PSB+ whose FUP IP was walked")?;
                self.flow_push_block(st, b, n);
                Ok(Some(Stop::Done))
            }
            TraceItem::Psb => {
                if self.queue.pushed == st.committed {
                    // Stop before the PSB: the next run starts there.
                    return Ok(Some(Stop::Segment));
                }
                if !st.cuts.is_empty() {
                    match self.flow_cut(st, Some(b))? {
                        Cut::Stopped => return Ok(Some(Stop::Done)),
                        Cut::Passed => return Ok(None),
                        Cut::No => {}
                    }
                }
                st.psb_fup = self.flow_psb(st, false, Some(b))?;
                Ok(None)
            }
            TraceItem::Pgd(ip) => {
                // A disable binds to the first instruction that needs trace, or to its
                // IP where the code reaches it before; without IP, to a MOV CR3 before
                // (libipt's `pt_insn_changes_cr3`: it runs, then tracing is off).
                let n = match ip {
                    Some(ip) => {
                        self.flow_not_walked(st, ip)?;
                        self.flow_index_of(b, ip).unwrap_or(b.len)
                    }
                    None => {
                        let binding = self.flow_pgd_binding(st, b);
                        // (Where a PSB+ just passed says the code ran past that
                        // instruction, libipt binds the disable after its FUP IP.)
                        let fup = st.psb_fup.take().and_then(|ip| self.flow_index_of(b, ip));
                        if binding.zip(fup).is_some_and(|(k, f)| k < f) {
                            return Err("a disable without IP after a PSB+ FUP past its binding");
                        }
                        // (With SKL014 the branch it binds to may lie in code walked
                        // without trace.)
                        if binding.is_some() || st.skl014.is_some() {
                            self.flow_nothing_walked(st)?;
                        }
                        binding.map_or(b.len, |k| k + 1)
                    }
                };
                // (After an IRET CFE: the disable binds to that instruction, which runs.)
                if let Some(c) = st.cfe_ret.take() {
                    if n != b.len || !self.flow_cfe_ret_at(b, c) {
                        return Err("IRET CFE at a disable not bound to its instruction");
                    }
                }
                self.flow_push_block(st, b, n);
                if n == b.len && b.end == End::IndirectCall {
                    // (libipt logs a call's return address as it decodes the call.)
                    st.ret.push(b.fall);
                }
                self.flow_event(st, Record::TraceDisabled { ip });
                st.enabled = false;
                Ok(None)
            }
            TraceItem::Async { from, to } => {
                let pgd_ip = st.pgd_ip;
                self.flow_not_walked(st, from)?;
                // Erratum BDM64: where the IP of a transaction's abort cannot be reached
                // from the branch that took the last trace (within libipt's 256
                // instructions, through direct branches), that branch went there.
                let abort = st.tsx_abort.take();
                let bdm64 = abort.is_some_and(|a| a.0)
                    && st.bdm64
                    && !matches!(b.end, End::Continue | End::Nomap | End::BadInsn);
                let walked = st.without_trace;
                let (n, jumped) = match self.flow_event_index(b, from) {
                    Some(n) if !(bdm64 && walked + u64::from(n) > BDM64_STEPS) => (n, false),
                    // (None of the code walked or of the block runs.)
                    _ if bdm64 && walked == 0 => (0, true),
                    _ if bdm64 => return Err("erratum BDM64 after code walked without trace"),
                    _ => {
                        // (From the MODE.TSX of an abort: libipt fails at the abort's
                        // FUP; at an interrupt's, at its TIP.)
                        let at = abort.map_or(st.item_at, |a| a.1);
                        // (A FUP whose TNT packets came before this TIP or TIP.PGD: the
                        // branch is libipt's current event there, where its resync
                        // resumes, as where the FUP still waits.)
                        let tip_here = matches!(
                            self.pkt(st.item_at),
                            Some((Pkt::Tip(_) | Pkt::TipPgd(_), _))
                        );
                        if abort.is_none() && st.resync && tip_here {
                            st.async_tip = Some((st.item_at, from));
                        }
                        return Err(self.flow_bad_query(
                            st,
                            b,
                            at,
                            "asynchronous event IP not reached without trace",
                        ));
                    }
                };
                self.flow_push_block(st, b, n);
                match to {
                    Some(to) => {
                        self.flow_event(st, Record::KernelXfer { from, to: Some(to) });
                        st.cur = self.flow_block(to)?;
                    }
                    // Erratum SKD022: the FUP of an asynchronous disable at a VMLAUNCH or
                    // VMRESUME may be bogus. libipt then takes it as a synchronous disable
                    // (at the TIP.PGD's IP): it binds to the VM entry, which runs (unless
                    // that IP is the entry's own).
                    None if st.skd022 && pgd_ip != Some(from) && self.flow_is_vmentry(from) => {
                        if jumped || n + 1 != b.len || self.flow_mnemonic(from).is_none() {
                            return Err("erratum SKD022 at a VM entry that ends no block");
                        }
                        // (The entry itself, after the code before it.)
                        self.flow_push(b.start + n, 1);
                        self.flow_event(st, Record::TraceDisabled { ip: pgd_ip });
                        st.enabled = false;
                    }
                    None => {
                        self.flow_event(st, Record::TraceDisabled { ip: Some(from) });
                        st.enabled = false;
                    }
                }
                Ok(None)
            }
            TraceItem::Bound(at) => {
                self.flow_not_walked(st, at)?;
                let n = self
                    .flow_event_index(b, at)
                    .ok_or("event IP not reached without trace")?;
                self.flow_bound_event(st, b, n, at)?;
                Ok(None)
            }
            TraceItem::Ptw(at) => {
                let n = match at {
                    Some(at) => {
                        self.flow_not_walked(st, at)?;
                        self.flow_index_of(b, at)
                            .ok_or("PTWRITE IP not reached without trace")?
                    }
                    None => {
                        self.flow_nothing_walked(st)?;
                        self.flow_first_binding(b, |i| {
                            (i.class == InsnClass::Ptwrite).then_some(false)
                        })
                        .ok_or("no PTWRITE before the branch a PTW binds to")?
                        .0
                    }
                };
                let ptwrite = self
                    .flow_recs(b)
                    .get(n as usize)
                    .and_then(|r| r.as_instruction())
                    .filter(|i| i.class == InsnClass::Ptwrite)
                    .ok_or("the IP a PTW binds to is no PTWRITE")?;
                let next = ptwrite.pc.wrapping_add(u64::from(ptwrite.size));
                self.flow_bound_event(st, b, n + 1, next)?;
                Ok(None)
            }
            TraceItem::Binds(binding) => {
                self.flow_nothing_walked(st)?;
                let (n, branch) = self
                    .flow_first_binding(b, |i| binding.binds_to(i))
                    .ok_or("no instruction before the branch a PIP or VMCS binds to")?;
                let insn = *self
                    .flow_recs(b)
                    .get(n as usize)
                    .and_then(|r| r.as_instruction())
                    .ok_or("no instruction")?;
                if branch {
                    // The event first, then the branch (libipt postpones it).
                    let bound = &mut st.bound_branch[binding.index()];
                    if n == 0 && *bound == Some(self.queue.pushed) {
                        return Err("two PIPs or VMCSs bound to one branch");
                    }
                    self.flow_bound_event(st, b, n, insn.pc)?;
                    st.bound_branch[binding.index()] = Some(self.queue.pushed);
                } else {
                    let next = insn.pc.wrapping_add(u64::from(insn.size));
                    self.flow_bound_event(st, b, n + 1, next)?;
                }
                Ok(None)
            }
            TraceItem::Ovf => {
                // (libipt takes the overflow before walking the block waiting for trace:
                // none of it ran as far as the trace tells.)
                self.flow_ovf(st)?;
                Ok(None)
            }
            // (libipt 2.1.2 takes the TIP after the TNT for the indirect branch and keeps
            // the bits for later: not an error to resync at.)
            TraceItem::Tnt => Err("TNT where the code needs a TIP"),
            TraceItem::Tip(_) => {
                Err(self.flow_bad_query(st, b, st.item_at, "TIP where the code needs a TNT bit"))
            }
            TraceItem::Pge(_) => {
                if st.async_tip.is_some() {
                    return Err(self.flow_fup_waits_at(st, st.item_at, true));
                }
                let why = "TIP.PGE while tracing is enabled";
                Err(self.flow_context_ahead(st, st.item_at, ResyncFrom::Search, why))
            }
        }
    }

    /// An OVF just read (tracing enabled, the block waiting for trace not walked): the
    /// overflow resolves at the first FUP after it (only timing packets between: tracing
    /// resumes at its IP) or, at an enable, a mode, a power event, a PSB or the end, with
    /// tracing disabled (a TIP.PGE or a PSB+ with a FUP enables it later). The `Overflow`
    /// record has the time before the OVF, as libipt's event. Anything else (pending TNT
    /// bits, code walked without trace, other packets on the way, an OVF erratum that
    /// applies) goes to libipt.
    fn flow_ovf(&mut self, st: &mut FlowState) -> Result<(), Fallback> {
        if st.tnt_n != 0 || self.queue.pushed != st.committed {
            return Err("OVF with trace or walked code pending");
        }
        // (libipt forgets the interrupt flag: the next MODE.Exec states it anew.)
        st.iflag = None;
        // Where it resolves; with erratum APL11, past a TIP.PGD (only timing packets
        // before it): tracing was disabled there (libipt's recovery). (SKD010's look-ahead
        // decides past a TIP.PGD or a TIP.)
        let mut p = st.pos;
        let mut disabled_after = None;
        let mut unknown = false;
        let fup = loop {
            // (The end of the trace, or a packet it cuts: libipt's search for the FUP
            // meets the end; resolved disabled.)
            let Some((pkt, size)) = self.pkt(p) else {
                break None;
            };
            match pkt {
                Pkt::Pad
                | Pkt::Tsc(_)
                | Pkt::Mtc(_)
                | Pkt::Tma { .. }
                | Pkt::Cyc(_)
                | Pkt::Cbr(_)
                | Pkt::Mnt => p += size,
                Pkt::Trig(_) => {
                    unknown = true;
                    p += size;
                }
                Pkt::Fup(ip) => break Some((ip, p + size)),
                // (libipt's errata searches stop at an unknown packet: its error stands.)
                Pkt::TipPgd(_) if st.apl11 && !unknown => {
                    disabled_after = Some(p + size);
                    break None;
                }
                Pkt::TipPgd(_) | Pkt::Tip(_) if st.skd010 && !unknown => break None,
                // (As libipt: an enable, a mode, status, a power event, PTW, event trace
                // or another OVF first: resolved disabled.)
                Pkt::TipPge(_)
                | Pkt::ModeExec { .. }
                | Pkt::ModeTsx { .. }
                | Pkt::Pip
                | Pkt::Vmcs
                | Pkt::Stop
                | Pkt::Ovf
                | Pkt::Power
                | Pkt::Exstop { .. }
                | Pkt::Mwait
                | Pkt::Ptw { .. }
                | Pkt::Cfe { .. }
                | Pkt::Evd { .. }
                | Pkt::Psb => break None,
                // (Trace of code after a resync on error, where libipt 2.1.2's records no
                // longer apply: libipt 2.2's context error at the OVF, which its resync
                // does not get past.)
                Pkt::Tnt { .. } | Pkt::Tip(_)
                    if st.resynced
                        && self.trace.get(st.pos.wrapping_sub(2)..st.pos)
                            == Some(&[0x02, 0xf3]) =>
                {
                    let why = "OVF followed by trace of code";
                    return Err(self.flow_context_at(st, st.pos - 2, why));
                }
                // (A packet libipt's packet decoder refuses, looking for the FUP: its
                // error at the OVF, where its decoder stays.)
                Pkt::Other(what)
                    if self.trace.get(st.pos.wrapping_sub(2)..st.pos) == Some(&[0x02, 0xf3]) =>
                {
                    return Err(self.flow_bad_packet_at(st, what, st.pos - 2));
                }
                _ => return Err("OVF resolved by a packet the fast decoder leaves to libipt"),
            }
        };
        let skd010 = match fup {
            None if st.skd010 => self.flow_skd010(st.pos),
            _ => ovf_errata::Skd010::AsWritten,
        };
        let apl12 = match fup {
            Some((_, after)) if st.apl12 => self.flow_apl12_applies(after)?,
            _ => false,
        };
        st.last_ip.reset();
        st.clock.on_ovf();
        match skd010 {
            ovf_errata::Skd010::AsWritten => {}
            ovf_errata::Skd010::DisabledAfter(after) => disabled_after = Some(after),
            ovf_errata::Skd010::Unsure => {
                return Err("OVF without FUP where erratum SKD010 applies")
            }
            // Tracing was enabled, the OVF's FUP lost: libipt resumes at the next IP
            // the trace gives (a FUP, a TIP, a PSB+'s FUP), the overflow at the OVF's
            // time, the timing packets on the way applied without their events.
            ovf_errata::Skd010::Resume {
                ip,
                last,
                silent_until,
                read_from,
            } => {
                let at_ovf = st.clock.now();
                self.flow_time_silently(st, silent_until)?;
                self.flow_event_at(st, at_ovf, Record::Overflow { ip: Some(ip) });
                st.last_ip = last;
                st.pos = read_from;
                st.enabled = true;
                st.cur = self.flow_block(ip)?;
                return Ok(());
            }
        }
        if let (true, Some((_, after))) = (apl12, fup) {
            // APL12: the FUP is extra, tracing disabled. libipt resumes after it, the
            // timing packets up to it applied (no events), the overflow at that time.
            self.flow_time_silently(st, after)?;
            self.flow_event(st, Record::Overflow { ip: None });
            st.enabled = false;
            return Ok(());
        }
        let Some((p, after)) = fup else {
            // (A standalone event, before what follows.)
            self.flow_event(st, Record::Overflow { ip: None });
            st.enabled = false;
            if let Some(after) = disabled_after {
                // Tracing goes on disabled after the TIP.PGD, its IP unseen; the timing
                // packets before it move the time on, their events dropped (libipt's
                // recovery).
                self.flow_time_silently(st, after)?;
            }
            return Ok(());
        };
        // (A FUP without IP: the overflow resolved while tracing was disabled, as libipt
        // takes it.)
        let ip = st.last_ip.apply(p);
        // (No MODE.Exec read yet, a PSB+ broken by the OVF: libipt's mode is unknown, its
        // instructions say so.)
        if ip.is_some() && !st.mode_known {
            return Err("OVF resolved at a FUP while the mode is unknown");
        }
        // Bound to the FUP: the timing packets up to it move the time on, and the events
        // among them (CBR, MNT) come before the overflow's, which has the OVF's time.
        let at_ovf = st.clock.now();
        while let Some((pkt, size)) = self.pkt(st.pos).filter(|_| st.pos < after) {
            st.clock.on_timing(pkt, false, st.clock_cfg)?;
            if matches!(pkt, Pkt::Cbr(_) | Pkt::Mnt) {
                self.flow_quiet_event(st);
            }
            st.pos += size;
        }
        self.flow_event_at(st, at_ovf, Record::Overflow { ip });
        // (Whether tracing was enabled before or not.)
        st.enabled = ip.is_some();
        st.ovf_unplaced = ip.is_none();
        if let Some(ip) = ip {
            st.cur = self.flow_block(ip)?;
        }
        Ok(())
    }

    /// Reads the packets up to `to`: the timing ones move the clock on, without the events
    /// they make otherwise (libipt's errata recoveries skip them so).
    fn flow_time_silently(&mut self, st: &mut FlowState, to: usize) -> Result<(), Fallback> {
        while let Some((pkt, size)) = self.pkt(st.pos).filter(|_| st.pos < to) {
            st.clock.on_timing(pkt, false, st.clock_cfg)?;
            st.pos += size;
        }
        Ok(())
    }

    /// Events binding to an IP walk from the last trace item: where that IP lies in code
    /// walked since in blocks before the current one (a block longer than
    /// `MAX_BLOCK_INSNS`), libipt decodes the window.
    fn flow_not_walked(&self, st: &FlowState, ip: u64) -> Result<(), Fallback> {
        if self.flow_reachable(st, None, ip) {
            return Err("event IP in code walked without trace");
        }
        Ok(())
    }

    /// An event bound to an instruction of block `b`: the block's first `n` records ran,
    /// the event (no record) takes the time, and decoding goes on at `ip`.
    fn flow_bound_event(
        &mut self,
        st: &mut FlowState,
        b: FBlock,
        n: u32,
        ip: u64,
    ) -> Result<(), Fallback> {
        self.flow_push_block(st, b, n);
        self.flow_commit(st);
        match st.iflag_event.take() {
            Some(enabled) => {
                let rec = Record::InterruptFlag {
                    enabled,
                    ip: Some(ip),
                };
                self.flow_event(st, rec);
            }
            None => self.flow_quiet_event(st),
        }
        st.cur = self.flow_block(ip)?;
        Ok(())
    }

    /// Drops the records of code walked without trace since the last trace item.
    fn flow_drop_walked(&mut self, st: &FlowState) {
        let tentative = self.queue.pushed.saturating_sub(st.committed);
        self.queue.truncate_last(tentative as usize);
    }

    /// Events binding to the next instruction of a kind walk from the last trace item:
    /// where code was walked since, libipt decodes the window.
    fn flow_nothing_walked(&self, st: &FlowState) -> Result<(), Fallback> {
        if self.queue.pushed != st.committed {
            return Err("event bound to an instruction after code walked without trace");
        }
        Ok(())
    }

    /// The index among block `b`'s records of its first instruction that `binds` (with
    /// what `binds` says of it).
    fn flow_first_binding(
        &self,
        b: FBlock,
        binds: impl Fn(&crate::records::Instruction) -> Option<bool>,
    ) -> Option<(u32, bool)> {
        self.flow_recs(b)
            .iter()
            .enumerate()
            .find_map(|(k, r)| Some((k as u32, binds(r.as_instruction()?)?)))
    }

    /// The instruction of block `b` a TIP.PGD without IP binds to before the branch that
    /// ends it, the disable coming after it: a MOV CR3 (libipt's `pt_insn_changes_cr3`)
    /// or, with erratum SKL014 and address filters, a direct jump or call whose target
    /// the filters do not trace (libipt's `pt_blk_proceed_skl014`), whichever comes first.
    fn flow_pgd_binding(&self, st: &FlowState, b: FBlock) -> Option<u32> {
        self.flow_first_binding(b, |i| {
            let leaves = st.skl014.as_ref().is_some_and(|f| {
                matches!(i.class, InsnClass::Call | InsnClass::Jump)
                    && direct_target(i).is_some_and(|t| !f.traces(t))
            });
            (leaves || is_mov_cr3(i)).then_some(false)
        })
        .map(|(k, _)| k)
    }

    /// Records of block `b` before its instruction at `ip`.
    fn flow_index_of(&self, b: FBlock, ip: u64) -> Option<u32> {
        self.flow_recs(b)
            .iter()
            .position(|r| is_insn_at(r, ip))
            .map(|k| k as u32)
    }

    /// Where in block `b` an event at `ip` binds: before its instruction at `ip`, or at
    /// its end where the block stops at `ip` for want of code (libipt takes the event
    /// there before it reads the code).
    fn flow_event_index(&self, b: FBlock, ip: u64) -> Option<u32> {
        self.flow_index_of(b, ip)
            .or((b.end.no_code() && b.fall == ip).then_some(b.len))
    }

    /// The packet at `pos`, as libipt reads it on this CPU ([`wire::parse_with`]).
    #[inline]
    fn pkt(&self, pos: usize) -> Option<(Pkt, usize)> {
        wire::parse_with(self.trace, pos, self.wire)
    }

    /// Block `b`'s records.
    fn flow_recs(&self, b: FBlock) -> &[Record] {
        self.blocks
            .arena
            .get(b.start as usize..(b.start + b.len) as usize)
            .unwrap_or(&[])
    }

    fn flow_is_vmentry(&self, ip: u64) -> bool {
        matches!(
            self.flow_mnemonic(ip),
            None | Some(iced_x86::Mnemonic::Vmlaunch | iced_x86::Mnemonic::Vmresume)
        )
    }

    /// The mnemonic of the 64-bit instruction at `ip` (none: the image is busy).
    fn flow_mnemonic(&self, ip: u64) -> Option<iced_x86::Mnemonic> {
        let space = self.shared.space.try_borrow().ok()?;
        let mut buf = [0u8; 15];
        let n = space.read(ip, &mut buf);
        Some(
            iced_x86::Decoder::with_ip(64, &buf[..n], ip, 0)
                .decode()
                .mnemonic(),
        )
    }

    // (Always inlined: once per block and memoized run; the compiler's own choice has
    // flipped with unrelated changes elsewhere.)
    #[inline(always)]
    fn flow_push(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        if self.pending_timestamp {
            self.flush_pending_timestamp();
        }
        self.queue.push_back(Item::Block(start, len));
    }

    /// The first `n` records of block `b` executed: queued, and the return addresses of
    /// the direct calls among them pushed.
    #[inline(always)]
    fn flow_push_block(&mut self, st: &mut FlowState, b: FBlock, n: u32) {
        self.flow_push(b.start, n);
        if b.ncalls != 0 {
            self.flow_block_calls(st, b, n);
        }
    }

    #[cold]
    #[inline(never)]
    fn flow_block_calls(&mut self, st: &mut FlowState, b: FBlock, n: u32) {
        let (first, count) = (b.calls as usize, usize::from(b.ncalls));
        let calls = self
            .blocks
            .flow
            .calls
            .get(first..first + count)
            .unwrap_or(&[]);
        for &(_, ret) in calls.iter().take_while(|c| c.0 <= n) {
            st.ret.push(ret);
        }
    }

    #[inline]
    fn flow_commit(&mut self, st: &mut FlowState) {
        st.committed = self.queue.pushed;
        st.without_trace = 0;
    }

    /// An event record (with its timestamp, as the libipt pipeline gives one).
    fn flow_event(&mut self, st: &mut FlowState, rec: Record) {
        self.flow_event_at(st, st.clock.now(), rec);
    }

    /// An event record of time `time` (the trace's time when the event happened).
    fn flow_event_at(&mut self, st: &mut FlowState, time: Option<u64>, rec: Record) {
        match time {
            Some(t) => {
                self.tsc = Some(t);
                self.timestamp(t);
                if self.sideband_start.is_some() {
                    // (Tracing off, or going off: no block walked until it is on again.)
                    let off = !st.enabled || matches!(rec, Record::TraceDisabled { .. });
                    self.flow_sideband(off);
                }
            }
            None => self.flush_pending_timestamp(),
        }
        self.queue.push_rec(rec);
        self.flow_commit(st);
        st.event_at = self.queue.pushed;
    }

    /// An event that makes no record (status updates, CBR, MODE.Exec): the decoder's
    /// time moves to the trace's.
    #[inline]
    fn flow_quiet_event(&mut self, st: &mut FlowState) {
        self.flow_quiet_event_at(st, !st.enabled);
    }

    /// [`Self::flow_quiet_event`] where the caller tells whether a block is held after it
    /// (`off`: none, for sideband applied there).
    #[inline]
    fn flow_quiet_event_at(&mut self, st: &mut FlowState, off: bool) {
        if let Some(t) = st.clock.now() {
            self.tsc = Some(t);
            if self.sideband_start.is_some() {
                self.flow_sideband(off);
            }
        }
        st.event_at = self.queue.pushed;
    }

    /// The successor `k` of block `from`, at `ip` (linked on first use).
    #[inline(always)]
    fn flow_link(&mut self, from: u32, k: usize, ip: u64) -> Result<u32, Fallback> {
        let linked = self
            .blocks
            .flow
            .blocks
            .get(from as usize)
            .map_or(NO_BLOCK, |b| b.next[k]);
        if linked != NO_BLOCK {
            return Ok(linked);
        }
        self.flow_link_new(from, k, ip)
    }

    #[cold]
    #[inline(never)]
    fn flow_link_new(&mut self, from: u32, k: usize, ip: u64) -> Result<u32, Fallback> {
        let to = self.flow_block(ip)?;
        if let Some(b) = self.blocks.flow.blocks.get_mut(from as usize) {
            b.next[k] = to;
        }
        Ok(to)
    }

    /// The block at `ip` where block `from` (which ends in an indirect branch or a
    /// return) went: the one it went to last time when `ip` is the same (a block of that
    /// kind keeps it in `target` and `next[1]`, which only conditional blocks use
    /// otherwise), without a lookup.
    #[inline(always)]
    fn flow_target(&mut self, from: u32, ip: u64) -> Result<u32, Fallback> {
        let key = mode_key(ip, self.blocks.flow.mode);
        if let Some(b) = self.blocks.flow.blocks.get(from as usize) {
            if b.target == key && b.next[1] != NO_BLOCK {
                return Ok(b.next[1]);
            }
        }
        self.flow_target_new(from, ip, key)
    }

    #[inline(never)]
    fn flow_target_new(&mut self, from: u32, ip: u64, key: u64) -> Result<u32, Fallback> {
        let to = self.flow_block(ip)?;
        if let Some(b) = self.blocks.flow.blocks.get_mut(from as usize) {
            if !matches!(b.end, End::Cond | End::Continue | End::Nomap | End::BadInsn) {
                (b.target, b.next[1]) = (key, to);
            }
        }
        Ok(to)
    }

    /// The block at `ip`, built on first use.
    #[inline]
    fn flow_block(&mut self, ip: u64) -> Result<u32, Fallback> {
        if self.sideband_rebuild {
            // (Tracing enabled otherwise than by a TIP.PGE: see `sideband`.)
            return Err(sideband::CODE_CHANGED);
        }
        let key = mode_key(ip, self.blocks.flow.mode);
        if let Some(&b) = self.blocks.flow.map.get(&key) {
            return Ok(b);
        }
        self.flow_build(ip)
    }

    #[cold]
    fn flow_build(&mut self, ip: u64) -> Result<u32, Fallback> {
        if let Some(why) = self.sideband_failed {
            return Err(why);
        }
        if self.blocks.flow.cached_only {
            return Err(NOT_BUILT);
        }
        let space = self.shared.space.try_borrow().map_err(|_| "image busy")?;
        let mut page = u64::MAX;
        let start = self.blocks.arena.len();
        let calls = self.blocks.flow.calls.len();
        let mut pc = ip;
        let mut n = 0u32;
        let flow_mode = self.blocks.flow.mode;
        let mode = flow_mode.exec_mode();
        // The code the block's instructions are in (a direct jump or call may go to
        // another segment's).
        let mut code: Option<crate::insn::SegmentCode<'_>> = None;
        let (end, fall, target) = loop {
            // (Decoded here, not through the instruction cache: each block is built once
            // and keeps its records, so a cache would only hold them a second time.)
            if !code.as_ref().is_some_and(|c| c.holds(pc)) {
                code = crate::insn::SegmentCode::at(&space, pc, mode);
            }
            let decoded = code.as_mut().and_then(|c| c.decode(pc));
            // (An instruction's bytes alone decide it: later bytes do not matter.)
            let last = pc.wrapping_add(decoded.as_ref().map_or(1, |i| u64::from(i.size)) - 1);
            for p in [pc / CODE_PAGE, last / CODE_PAGE] {
                if p != page {
                    self.blocks.flow.pages.insert(p);
                    page = p;
                }
            }
            let Some(info) = decoded else {
                if space.read(pc, &mut [0u8; 1]) == 0 {
                    break (End::Nomap, pc, 0);
                }
                // An instruction its code's end cuts, nothing mapped after: libipt's
                // length decoder fails there too (where code follows, libipt reads the
                // rest of the instruction from it: the window goes to libipt).
                if let Some(end) = code.as_ref().and_then(|c| c.cut_at_end(pc)) {
                    if space.read(end, &mut [0u8; 1]) == 0 {
                        self.blocks.flow.pages.insert(end / CODE_PAGE);
                        break (End::BadInsn, pc, 0);
                    }
                }
                return Err("code not readable or not decodable");
            };
            if info.class == InsnClass::Unknown {
                return Err("unknown instruction");
            }
            info.push_records(&mut self.blocks.arena, pc, mode);
            n += 1;
            let next = pc.wrapping_add(u64::from(info.size));
            match (info.class, info.direct_target) {
                // (ptwrite without PTW packets is straight-line code to libipt too; a PTW
                // packet goes to libipt.)
                (InsnClass::Other | InsnClass::Ptwrite, _) => pc = next,
                (InsnClass::Jump, Some(t)) => pc = t,
                (InsnClass::Call, Some(t)) => {
                    // (A call to the next instruction pushes nothing, as in libipt.)
                    if t != next {
                        let upto = u32::try_from(self.blocks.arena.len() - start)
                            .map_err(|_| "block too large")?;
                        self.blocks.flow.calls.push((upto, next));
                    }
                    pc = t;
                }
                (InsnClass::Jump, None) => break (End::Indirect, next, 0),
                (InsnClass::Call, None) => break (End::IndirectCall, next, 0),
                (InsnClass::Return, _) => break (End::Return, next, 0),
                (InsnClass::CondJump, _) => {
                    let Some(c) = code.as_ref() else {
                        return Err("code not readable or not decodable");
                    };
                    break (End::Cond, next, c.last_branch_target());
                }
                (InsnClass::FarCall, _) if info.is_syscall => break (End::Syscall, next, 0),
                // Far transfers (INT n, INT3, far call/jump/return, IRET, ERETU/ERETS,
                // SYSRET): their target comes from a TIP, as an indirect branch's does
                // (libipt's reading too); they push and pop no near return address.
                (InsnClass::FarCall | InsnClass::FarJump | InsnClass::FarReturn, _) => {
                    break (End::Indirect, next, 0)
                }
                _ => return Err("instruction the fast decoder leaves to libipt"),
            }
            if n >= MAX_BLOCK_INSNS {
                break (End::Continue, pc, 0);
            }
        };
        drop(space);
        let len = self.blocks.arena.len() - start;
        let (Ok(start), Ok(len)) = (u32::try_from(start), u32::try_from(len)) else {
            return Err("block arena too large");
        };
        let idx = u32::try_from(self.blocks.flow.blocks.len()).map_err(|_| "too many blocks")?;
        let ncalls = u16::try_from(self.blocks.flow.calls.len() - calls)
            .map_err(|_| "too many calls in a block")?;
        let calls = u32::try_from(calls).map_err(|_| "too many calls")?;
        self.blocks.flow.blocks.push(FBlock {
            start,
            len,
            end,
            ncalls,
            calls,
            fall,
            target,
            next: [NO_BLOCK; 2],
        });
        self.blocks.flow.map.insert(mode_key(ip, flow_mode), idx);
        Ok(idx)
    }

    /// Reads packets up to the next trace item (time, CBR, MODE.Exec applied on the way).
    /// After an IRET CFE only a TIP or TIP.PGD may come (the far return's target), or a
    /// PIP or VMCS bound to that far return.
    #[inline]
    fn flow_next_item(&mut self, st: &mut FlowState) -> Result<TraceItem, Fallback> {
        let item = self.flow_read_item(st)?;
        if st.cfe_ret.is_some()
            && !matches!(
                item,
                TraceItem::Tip(_) | TraceItem::Pgd(_) | TraceItem::Binds(_)
            )
        {
            return Err("IRET CFE not followed by a TIP or TIP.PGD");
        }
        if st.mwait {
            return Err("MWAIT not followed by its EXSTOP");
        }
        Ok(item)
    }

    fn flow_read_item(&mut self, st: &mut FlowState) -> Result<TraceItem, Fallback> {
        loop {
            st.item_at = st.pos;
            // (The packets libipt reads otherwise under errata SKD007 and SKZ84 are
            // rare here: checked below.)
            // (A packet the end of the trace cuts is the end to libipt's packet decoder.)
            let Some((pkt, size)) = wire::parse(self.trace, st.pos) else {
                return Ok(TraceItem::End(st.read_on));
            };
            st.pos += size;
            // (Trace items set `read_on` to `Nothing`; timing packets leave it; events
            // (a CBR...) make it `Other`.)
            match pkt {
                Pkt::Tnt { bits, n } => {
                    st.tnt = bits;
                    st.tnt_n = n;
                    st.read_on = ReadOn::Nothing;
                    return Ok(TraceItem::Tnt);
                }
                Pkt::Tip(p) => {
                    let Some(ip) = st.last_ip.apply(p) else {
                        return Err(self.flow_tip_without_ip(st));
                    };
                    st.read_on = ReadOn::Nothing;
                    if let Some((_, from)) = st.async_tip.take() {
                        return Ok(TraceItem::Async { from, to: Some(ip) });
                    }
                    return Ok(TraceItem::Tip(ip));
                }
                Pkt::Pad => {}
                Pkt::Cyc(v)
                    if size == 2
                        && self.wire.skd007
                        && wire::skd007_ovf(self.trace, st.item_at, v) =>
                {
                    // (Erratum SKD007: an OVF that overwrote the CYC's second byte, at
                    // that byte.)
                    st.item_at += 1;
                    st.pos += 1;
                    if let Some(item) = self.flow_rare_packet(st, Pkt::Ovf)? {
                        return Ok(item);
                    }
                }
                Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_) => {
                    st.clock.on_timing(pkt, false, st.clock_cfg)?;
                }
                Pkt::Cbr(_) => {
                    st.clock.on_timing(pkt, false, st.clock_cfg)?;
                    st.read_on = ReadOn::Other;
                    self.flow_quiet_event(st);
                }
                Pkt::TipPgd(p) => {
                    st.read_on = ReadOn::Nothing;
                    if let Some((_, from)) = st.async_tip.take() {
                        st.pgd_ip = st.last_ip.apply(p);
                        return Ok(TraceItem::Async { from, to: None });
                    }
                    return Ok(TraceItem::Pgd(st.last_ip.apply(p)));
                }
                // (While tracing is enabled: libipt's error at the next query.)
                Pkt::TipPge(p) => {
                    let ip = st.last_ip.apply(p).ok_or("TIP.PGE without IP")?;
                    st.read_on = ReadOn::Nothing;
                    return Ok(TraceItem::Pge(ip));
                }
                Pkt::Fup(p) => {
                    if !st.enabled {
                        return Err("FUP while tracing is disabled");
                    }
                    if st.event_waits {
                        return Err("a FUP a MODE.TSX, PTW or TRIG waits for");
                    }
                    let Some(from) = st.last_ip.apply(p) else {
                        if st.tsx_abort.is_none() && !st.cfe_fup {
                            return Err(self.flow_fup_without_ip(st));
                        }
                        return Err("FUP without IP");
                    };
                    // (What follows a FUP bound to nothing, as libipt reads it, applies
                    // neither to a MODE.TSX abort's nor to the FUP of a CFE.)
                    let alone = st.tsx_abort.is_none() && !std::mem::take(&mut st.cfe_fup);
                    // (A TNT next, past PADs, timing packets and PSBENDs outside a PSB+,
                    // which libipt's event decoder passes: see there.)
                    let mut first = self.flow_past_pads(st.pos);
                    while let Some((
                        Pkt::Psbend | Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_),
                        n,
                    )) = self.pkt(first)
                    {
                        first = self.flow_past_pads(first + n);
                    }
                    let tnt_next = match self.trace.get(first..) {
                        Some([2, 0xa3, ..]) => true,
                        Some([b, ..]) => short_tnt(*b),
                        _ => false,
                    };
                    if tnt_next {
                        if let Some(item) = self.flow_fup_before_tnt(st, from, first, alone) {
                            return Ok(item);
                        }
                    }
                    // The TIP or TIP.PGD of the asynchronous branch, with PADs and timing
                    // packets (MTC, CYC, TSC, TMA) before it as real hardware writes them
                    // (their time is the branch's, as libipt's query decoder reads them).
                    // A PIP or VMCS between them (a VM exit or entry, a task switch) binds
                    // to that TIP: its event comes after the branch, at its target. So
                    // does a MODE.Exec (an interrupt into another mode): the code up to
                    // the FUP's IP, whose blocks are built already, runs in the mode
                    // before it, the code at the TIP's target in its mode.
                    // (With a TIP.PGD, they come after the disable: no code.)
                    let end = "FUP at the end of the trace";
                    // (One bound to nothing that the end of the trace or an OVF follows:
                    // dropped. libipt's asynchronous branch waits for its TIP, and the end
                    // or an overflow, which drops the events waiting while tracing is
                    // enabled, comes first; the records are those of the trace without
                    // the FUP. Under erratum SKD007 a CYC may hide the OVF: as before.)
                    let plain = alone && !self.wire.skd007;
                    let (mut next, mut next_at) =
                        match Self::flow_past_timing_from(self.trace, st, end) {
                            Err(_) if plain && st.pos >= self.trace.len() => {
                                return Ok(TraceItem::End(st.read_on))
                            }
                            Ok((Pkt::Ovf, at)) if plain => {
                                st.item_at = at;
                                st.read_on = ReadOn::Nothing;
                                return Ok(TraceItem::Ovf);
                            }
                            next => next?,
                        };
                    loop {
                        match next {
                            Pkt::Pip | Pkt::Vmcs => {}
                            // (With the option, libipt 2.2's reading, as where no FUP
                            // waits: a MODE.Exec that changes nothing is an event of no
                            // kind, dropped at the FUP right after it, which binds
                            // nothing; the asynchronous branch goes on waiting for its
                            // TIP. A PSBEND outside a PSB+ is passed.)
                            Pkt::ModeExec { csl, csd, iflag }
                                if alone
                                    && st.resync
                                    && st.iflag_event.is_none()
                                    && self.flow_mode_unchanged(st, csl, csd, iflag)
                                    && matches!(self.pkt(st.pos), Some((Pkt::Fup(_), _))) =>
                            {
                                st.take_iflag(iflag);
                                if let Some((Pkt::Fup(p), size)) = self.pkt(st.pos) {
                                    st.pos += size;
                                    st.last_ip.apply(p).ok_or("FUP without IP")?;
                                }
                            }
                            Pkt::Psbend if alone && st.resync => {}
                            Pkt::Tnt { .. } if alone && st.resync => {
                                if let Some(item) =
                                    self.flow_fup_before_tnt(st, from, next_at, alone)
                                {
                                    return Ok(item);
                                }
                                break;
                            }
                            Pkt::ModeExec { csl, csd, iflag } if alone => {
                                self.flow_async_mode(st, csl, csd, iflag)?
                            }
                            // (libipt's context error, as at a TIP.PGE while tracing is
                            // enabled; after the TIP.PGE's IP.)
                            Pkt::Psb if plain => {
                                return Err(self.flow_fup_waits_at(st, next_at, false))
                            }
                            Pkt::TipPge(p) if plain && st.last_ip.apply(p).is_some() => {
                                return Err(self.flow_fup_waits_at(st, next_at, true))
                            }
                            _ => break,
                        }
                        (next, next_at) = Self::flow_past_timing_from(self.trace, st, end)?;
                    }
                    st.read_on = ReadOn::Nothing;
                    return match next {
                        Pkt::Tip(p) => {
                            let to = st.last_ip.apply(p).ok_or("FUP+TIP without IP")?;
                            Ok(TraceItem::Async { from, to: Some(to) })
                        }
                        Pkt::TipPgd(p) => {
                            st.pgd_ip = st.last_ip.apply(p);
                            Ok(TraceItem::Async { from, to: None })
                        }
                        // (A packet libipt refuses, where a branch went to unmapped code:
                        // its event decoder, reading on for the TIP, fails there before
                        // the code is read. Where code ran since, libipt reports it at a
                        // later query: through libipt.)
                        Pkt::Other(what) if plain && self.flow_at_unmapped(st) => {
                            Err(self.flow_bad_packet_at(st, what, next_at))
                        }
                        _ => Err("FUP not followed by TIP or TIP.PGD"),
                    };
                }
                Pkt::Psb => {
                    // (Left for `flow_psb`, which reads the PSB+.)
                    st.pos -= size;
                    if st.async_tip.is_some() || st.event_waits {
                        return Err(self.flow_fup_waits_at(st, st.pos, false));
                    }
                    return Ok(TraceItem::Psb);
                }
                _ => {
                    if let Some(item) = self.flow_rare_packet(st, pkt)? {
                        return Ok(item);
                    }
                }
            }
        }
    }

    /// A FUP bound to nothing (just read, from `from`; its next packet past PADs, timing
    /// packets and PSBENDs outside a PSB+ at `first`) with TNT packets between it and its
    /// TIP or TIP.PGD (PADs among them at most): libipt's asynchronous branch waits for that
    /// TIP, and its block decoder is told of it only once the TNT bits are used up; they
    /// take the flow on first, even past the FUP's IP. So the first TNT packet is the next
    /// item, the others are read after it as usual, and the TIP then ends the asynchronous
    /// branch ([`FlowState::async_tip`]). (An indirect branch met while the bits last finds
    /// no TIP: [`Self::flow_deferred_tip`].) Where an OVF or the end of the trace comes
    /// instead of that TIP, the bits are read as usual and the FUP is dropped: libipt's
    /// asynchronous branch waits for its TIP, and an overflow (tracing enabled: its events
    /// are dropped) or the end comes first; the records are those of the trace without
    /// the FUP.
    #[cold]
    #[inline(never)]
    fn flow_fup_before_tnt(
        &mut self,
        st: &mut FlowState,
        from: u64,
        first: usize,
        alone: bool,
    ) -> Option<TraceItem> {
        if st.tnt_n != 0 {
            return None;
        }
        let (Pkt::Tnt { bits, n }, size) = self.pkt(first)? else {
            return None;
        };
        let mut p = first + size;
        let tip_at = loop {
            // (The end of the trace, or an OVF: the FUP is dropped, as below.)
            if alone && p >= self.trace.len() {
                break None;
            }
            match self.pkt(p)? {
                (Pkt::Pad | Pkt::Tnt { .. }, size) => p += size,
                // (Read as usual after the first TNT, the branch's time as without TNT.)
                (Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_), size) => p += size,
                (Pkt::Tip(_) | Pkt::TipPgd(_), _) => break Some(p),
                // (A TIP.PGE or PSB instead: libipt's context error at it, when it is read
                // after the bits; a packet libipt refuses: its error there.)
                (Pkt::TipPge(_) | Pkt::Psb, _) if alone => break Some(p),
                (Pkt::Other(what), _) if alone && resync::refused_text(what).is_some() => {
                    break Some(p)
                }
                (Pkt::Ovf, _) if alone && !self.wire.skd007 => break None,
                _ => return None,
            }
        };
        // (The timing packets before the first TNT, read as usual.)
        let mut clock = st.clock;
        let mut t = st.pos;
        while t < first {
            let (pkt, size) = self.pkt(t)?;
            clock.on_timing(pkt, false, st.clock_cfg).ok()?;
            t += size;
        }
        st.clock = clock;
        (st.tnt, st.tnt_n) = (bits, n);
        st.async_tip = tip_at.map(|at| (at, from));
        st.pos = self.flow_past_pads(first + size);
        st.read_on = ReadOn::Nothing;
        Some(TraceItem::Tnt)
    }

    /// Whether a MODE.Exec (`csl`, `csd`, `iflag`) read now would change nothing: the
    /// mode known and the same, no IF event.
    fn flow_mode_unchanged(&self, st: &FlowState, csl: bool, csd: bool, iflag: bool) -> bool {
        st.mode_known
            && FlowMode::of(csl, csd) == Some(self.blocks.flow.mode)
            && !(st.iflags && st.iflag != Some(iflag))
    }

    /// A MODE.Exec between an asynchronous branch's FUP and its TIP or TIP.PGD: the mode
    /// of the blocks built from then on, the branch's target first. (An IF event bound
    /// there goes to libipt, as at other TIPs.)
    #[cold]
    #[inline(never)]
    fn flow_async_mode(
        &mut self,
        st: &mut FlowState,
        csl: bool,
        csd: bool,
        iflag: bool,
    ) -> Result<(), Fallback> {
        let mode = FlowMode::of(csl, csd).ok_or("MODE.Exec with CS.L and CS.D set")?;
        st.mode_known = true;
        self.blocks.flow.cached_only = false;
        if st.take_iflag(iflag) {
            return Err("an IF event not bound to a FUP or TIP.PGE");
        }
        self.blocks.flow.mode = mode;
        Ok(())
    }

    /// The packets [`Self::flow_read_item`] meets rarely (events, status, what binds to a
    /// FUP or an instruction): the trace item they make, if any.
    #[cold]
    #[inline(never)]
    fn flow_rare_packet(
        &mut self,
        st: &mut FlowState,
        pkt: Pkt,
    ) -> Result<Option<TraceItem>, Fallback> {
        match pkt {
            // (With `--resync-on-error`, libipt 2.2's rule, which 2.1.2 does not know: a
            // TRIG with the IP bit takes its IP from the FUP, so an instruction count
            // other than 0, or none, is a bad packet.)
            Pkt::Trig(t) if st.resync && t.ip && t.icnt != Some(0) => {
                return Err(self.flow_bad_packet(st, resync::TRIG_WITH_ICNT));
            }
            // A TRIG carries no control flow: stepped over (libipt through the size
            // [`crate::ipt`] teaches it). One with the IP bit is bound to the FUP
            // right after it, which gives the trigger's IP and nothing else (Intel
            // SDM; libipt 2.2 and ptxed read it so): that FUP is stepped over too,
            // its IP kept for IP compression, whether tracing is enabled or not.
            // (libipt 2.1.2 knows no FUP-bound TRIG: its path stops with a gap.)
            Pkt::Trig(t) if t.ip => match self.pkt(st.pos) {
                Some((Pkt::Fup(p), size)) => {
                    st.pos += size;
                    st.last_ip.apply(p).ok_or("TRIG's FUP without IP")?;
                }
                // (With the option, as libipt 2.2: it waits in the event queue for a later
                // FUP, as a MODE.TSX read by the resync does.)
                Some(_) if st.resync => st.event_waits = true,
                Some(_) => return Err("TRIG with the IP bit not followed by a FUP"),
                None => return Err("TRIG with the IP bit at the end of the trace"),
            },
            // (With the option, libipt 2.2's rule: one with an instruction count binds
            // that many instructions past the start of the code the last trace item
            // placed, which may lie past the branch that waits for trace.)
            Pkt::Trig(t) if st.resync => {
                if let Some(n) = t.icnt.filter(|&n| n > 0) {
                    self.flow_trig_icnt(st, n)?;
                }
            }
            Pkt::Trig(_) => {}
            Pkt::ModeExec { csl, csd, iflag } => {
                let mode = FlowMode::of(csl, csd).ok_or("MODE.Exec with CS.L and CS.D set")?;
                let known = std::mem::replace(&mut st.mode_known, true);
                self.blocks.flow.cached_only = false;
                let if_event = st.take_iflag(iflag);
                // (The next trace item, past timing packets: looked for only where
                // something binds to it.)
                let next = || self.pkt(self.flow_past_timing_at(st.pos)).map(|n| n.0);
                if if_event {
                    // An IF event (with iflags events): libipt's record at the FUP it
                    // binds to, or after the enable a TIP.PGE makes. (Bound to a TIP or
                    // TIP.PGD, or elsewhere: through libipt.)
                    match (st.enabled, next()) {
                        (true, Some(Pkt::Fup(_))) | (false, Some(Pkt::TipPge(_))) => {
                            st.iflag_event = Some(iflag)
                        }
                        _ => return Err("an IF event not bound to a FUP or TIP.PGE"),
                    }
                }
                if !st.enabled {
                    // (The mode of the code tracing is enabled in next.)
                    self.blocks.flow.mode = mode;
                    self.flow_quiet_event(st);
                    return Ok(None);
                }
                // While tracing is enabled (libipt's reading): bound to the next TIP
                // or TIP.PGD (a far branch into the mode: the code at its target
                // runs in it) or FUP (the code runs to its IP, in the mode from
                // there). The blocks the item's target starts are built after the
                // mode is set; the block waiting for it was built before.
                let next = next();
                let before = std::mem::replace(&mut self.blocks.flow.mode, mode);
                match next {
                    // (Bound to a disable without IP, libipt takes a new mode at once:
                    // the code up to the disable runs in it.)
                    Some(Pkt::TipPgd(p)) if p.ipc == 0 && mode != before => {
                        return Err("MODE.Exec bound to a TIP.PGD without IP")
                    }
                    Some(Pkt::Tip(_) | Pkt::TipPgd(_)) => {}
                    // (With the option, libipt 2.2's reading: one that changes nothing is
                    // an event of no kind, dropped at the FUP right after it, which then
                    // binds nothing: the code need not reach its IP.)
                    Some(Pkt::Fup(_))
                        if st.resync
                            && known
                            && mode == before
                            && st.iflag_event.is_none()
                            && st.async_tip.is_none()
                            && matches!(st.read_on, ReadOn::Nothing)
                            && matches!(self.pkt(st.pos), Some((Pkt::Fup(_), _))) =>
                    {
                        if let Some((Pkt::Fup(p), size)) = self.pkt(st.pos) {
                            st.pos += size;
                            st.last_ip.apply(p);
                        }
                    }
                    Some(Pkt::Fup(_)) => {
                        let end = "MODE.Exec at the end of the trace";
                        let missing = "MODE.Exec not followed by its FUP";
                        let at = Self::flow_bound_fup(self.trace, st, end, missing)?;
                        st.read_on = ReadOn::Other;
                        return Ok(Some(TraceItem::Bound(at)));
                    }
                    // (One that changes nothing before a TIP.PGE: libipt fails at the
                    // TIP.PGE first, its context error as without it; no time moves.)
                    Some(Pkt::TipPge(_)) if mode == before && st.iflag_event.is_none() => {}
                    _ => return Err("MODE.Exec while tracing is enabled, not bound"),
                }
            }
            // (libipt's event decoder publishes the PSB+ events a PSBEND ends: outside a
            // PSB+ there are none, and it goes on.)
            Pkt::Psbend => {}
            Pkt::Ovf => {
                st.read_on = ReadOn::Nothing;
                st.event_waits = false;
                return Ok(Some(TraceItem::Ovf));
            }
            // Event trace (CFE, with EVDs before it): see `event_trace`.
            Pkt::Evd { ty } => {
                st.read_on = ReadOn::Other;
                self.flow_evds(ty, st.pos)?;
            }
            Pkt::Cfe { ty, ip } => {
                st.read_on = ReadOn::Other;
                self.flow_cfe(st, ty, ip)?;
            }
            // Power event trace (Intel SDM): no control flow. PWRE, PWRX and an EXSTOP
            // without IP are events of their own (libipt's standalone events, time
            // only, as a CBR); an MWAIT waits for its EXSTOP; an EXSTOP with IP (and
            // the MWAIT before it) binds to the FUP after it: the code runs to that
            // IP and on from there (no branch).
            Pkt::Power | Pkt::Exstop { ip: false } => {
                st.mwait = false;
                st.read_on = ReadOn::Other;
                self.flow_quiet_event(st);
            }
            Pkt::Mwait => {
                if std::mem::replace(&mut st.mwait, true) {
                    return Err("two MWAITs");
                }
            }
            // MODE.TSX (Intel SDM, "Transactional Synchronization Extensions"): a
            // begin or commit binds to the FUP after it, as an EXSTOP with IP; an
            // abort's FUP is the source of the asynchronous branch (its TIP) to the
            // abort handler, read as any FUP. (Transactions make no record.)
            // (While tracing is disabled: the state the next enable starts in, or a
            // begin or commit at the FUP's IP; no code.)
            Pkt::ModeTsx { abort } if !st.enabled => {
                self.flow_quiet_event(st);
                if let (false, Some((Pkt::Fup(p), size))) = (abort, self.pkt(st.pos)) {
                    st.pos += size;
                    st.last_ip.apply(p);
                }
            }
            Pkt::ModeTsx { abort: true } => {
                st.tsx_abort = Some((st.event_at < st.committed, st.item_at));
                self.flow_quiet_event(st);
                if !matches!(self.pkt(st.pos), Some((Pkt::Fup(_), _))) {
                    // (With the option, as libipt 2.2 where no FUP comes before the next
                    // trace item: it waits in the event queue for a later FUP.)
                    let next = self.pkt(self.flow_past_timing_at(st.pos)).map(|n| n.0);
                    if !st.resync || matches!(next, Some(Pkt::Fup(_))) {
                        return Err("MODE.TSX abort not followed by its FUP");
                    }
                    st.tsx_abort = None;
                    st.event_waits = true;
                }
            }
            Pkt::Exstop { ip: true } | Pkt::ModeTsx { abort: false } => {
                let exstop = pkt == (Pkt::Exstop { ip: true });
                if exstop {
                    st.mwait = false;
                }
                let end = "EXSTOP with IP or MODE.TSX at the end of the trace";
                let p = match Self::flow_past_timing(self.trace, st, end)? {
                    Pkt::Fup(p) => p,
                    // An OVF before the FUP: the EXSTOP (and its MWAIT) without IP, no
                    // code; then the overflow.
                    Pkt::Ovf if exstop => {
                        self.flow_quiet_event(st);
                        st.read_on = ReadOn::Nothing;
                        return Ok(Some(TraceItem::Ovf));
                    }
                    _ => return Err("EXSTOP with IP or MODE.TSX not followed by its FUP"),
                };
                let at = st.last_ip.apply(p).ok_or("FUP without IP")?;
                st.read_on = ReadOn::Other;
                if st.enabled {
                    return Ok(Some(TraceItem::Bound(at)));
                }
                // (While tracing is disabled: an event at that IP, no code.)
                self.flow_quiet_event(st);
            }
            // PTW (a PTWRITE's operand; libipt's reading): with the IP bit, the FUP
            // after it gives the PTWRITE's IP; without, it binds to the next PTWRITE
            // the code runs. The code runs through that PTWRITE and on (no branch,
            // no record). (While tracing is disabled: an event, no code.)
            Pkt::Ptw { ip } => {
                let at = if ip {
                    let end = "PTW at the end of the trace";
                    let missing = "PTW with the IP bit not followed by its FUP";
                    Some(Self::flow_bound_fup(self.trace, st, end, missing)?)
                } else {
                    None
                };
                st.read_on = ReadOn::Other;
                if st.enabled {
                    return Ok(Some(TraceItem::Ptw(at)));
                }
                self.flow_quiet_event(st);
            }
            // MNT: an event of its own (time only, as a CBR); STOP: tracing stopped
            // (it comes after the disable).
            Pkt::Mnt => {
                st.read_on = ReadOn::Other;
                self.flow_quiet_event(st);
            }
            Pkt::Stop => {
                if st.enabled {
                    return Err("STOP while tracing is enabled");
                }
                self.flow_quiet_event(st);
            }
            // A PIP or VMCS outside a PSB+ and an asynchronous branch (MOV CR3,
            // VMPTRLD, a system call into traced OS code...): bound to an instruction
            // (no record; the image stays the one given). (While tracing is
            // disabled: an event, no code.)
            Pkt::Pip | Pkt::Vmcs => {
                st.read_on = ReadOn::Other;
                if st.enabled {
                    let binding = if pkt == Pkt::Pip {
                        Binding::Pip
                    } else {
                        Binding::Vmcs
                    };
                    return Ok(Some(TraceItem::Binds(binding)));
                }
                self.flow_quiet_event(st);
            }
            Pkt::Other(what) => return Err(self.flow_bad_packet(st, what)),
            // A TMA with reserved bits, read as libipt reads it on this CPU: with erratum
            // SKZ84 a corrupted TMA and the bogus byte after it, an invalid packet its
            // event decoder passes over (no time; where the trace ends after it, libipt's
            // reading on is not the fast decoder's); else libipt's error.
            Pkt::TmaReserved | Pkt::Invalid => match self.pkt(st.item_at) {
                Some((Pkt::Invalid, size)) => {
                    st.pos = st.item_at + size;
                    st.read_on = ReadOn::Other;
                }
                _ => return Err(wire::TMA_RESERVED),
            },
            // (The packets flow_read_item takes itself.)
            Pkt::Tnt { .. }
            | Pkt::Tip(_)
            | Pkt::Pad
            | Pkt::Tsc(_)
            | Pkt::Mtc(_)
            | Pkt::Tma { .. }
            | Pkt::Cyc(_)
            | Pkt::Cbr(_)
            | Pkt::TipPgd(_)
            | Pkt::TipPge(_)
            | Pkt::Fup(_)
            | Pkt::Psb => {}
        }
        Ok(None)
    }

    /// The first packet from `p` on that is no PAD or timing packet (TSC, MTC, TMA, CYC),
    /// where it starts (nothing applied: [`Self::flow_past_timing`] reads them).
    fn flow_past_timing_at(&self, mut p: usize) -> usize {
        while let Some((Pkt::Pad | Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_), n)) =
            self.pkt(p)
        {
            p += n;
        }
        p
    }

    /// The next packet that is no PAD or timing packet (read past it), the timing packets
    /// before it applied to the clock: what a FUP or an event's FUP is bound to, with
    /// what real hardware writes between them; `end` where the trace ends first.
    fn flow_past_timing(trace: &[u8], st: &mut FlowState, end: Fallback) -> Result<Pkt, Fallback> {
        Ok(Self::flow_past_timing_from(trace, st, end)?.0)
    }

    /// [`Self::flow_past_timing`], with where the packet starts.
    fn flow_past_timing_from(
        trace: &[u8],
        st: &mut FlowState,
        end: Fallback,
    ) -> Result<(Pkt, usize), Fallback> {
        loop {
            let Some((next, size)) = wire::parse_with(trace, st.pos, st.wire) else {
                return Err(end);
            };
            st.pos += size;
            match next {
                Pkt::Pad => {}
                Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_) => {
                    st.clock.on_timing(next, false, st.clock_cfg)?;
                }
                _ => return Ok((next, st.pos - size)),
            }
        }
    }

    /// The IP of the FUP an event binds to, after PADs and timing packets (applied);
    /// `end` where the trace ends first, `missing` where another packet comes.
    fn flow_bound_fup(
        trace: &[u8],
        st: &mut FlowState,
        end: Fallback,
        missing: Fallback,
    ) -> Result<u64, Fallback> {
        let Pkt::Fup(p) = Self::flow_past_timing(trace, st, end)? else {
            return Err(missing);
        };
        st.last_ip.apply(p).ok_or("FUP without IP")
    }

    /// The PSB+ at `st.pos`: its status applied as libipt does (a synchronization sets the IP; a PSB+ passed
    /// while decoding must agree with the state).
    fn flow_psb(
        &mut self,
        st: &mut FlowState,
        sync: bool,
        at: Option<FBlock>,
    ) -> Result<Option<u64>, Fallback> {
        st.ovf_unplaced = false;
        let mut psb_at = st.pos;
        if self.pkt(st.pos).is_some_and(|(p, _)| p == Pkt::Psb) {
            st.pos += wire::PSB.len();
        } else {
            psb_at = psb_at.saturating_sub(wire::PSB.len());
        }
        if st.tnt_n != 0 {
            return Err("TNT bits left at a PSB");
        }
        st.event_at = self.queue.pushed;
        st.last_ip.reset();
        let mut fup = None;
        // (Where libipt's BDM70 search starts.)
        let mut after_fup = st.pos;
        let mut mode = None;
        let mut psb_iflag = None;
        // (Where its MODE.Exec and its FUP start.)
        let (mut mode_at, mut fup_at) = (st.pos, st.pos);
        // (An OVF ends the PSB+ as its PSBEND would, and then resolves.)
        let mut ovf = false;
        loop {
            let Some((pkt, size)) = self.pkt(st.pos) else {
                return Err("PSB+ cut by the end of the trace");
            };
            let pkt_at = st.pos;
            st.pos += size;
            match pkt {
                // (MODE.TSX, PIP and VMCS in a PSB+ are status libipt makes no record
                // of: the CR3 and VMCS of the code that runs, which real hardware states
                // in every PSB+ of a VMX guest or a trace with OS code; MNT is an event
                // of the PSB+'s time.)
                // (SKZ84's corrupted TMA: passed over.)
                Pkt::Pad | Pkt::ModeTsx { .. } | Pkt::Pip | Pkt::Vmcs | Pkt::Mnt | Pkt::Invalid => {
                }
                // (libipt finds no TRIG in a PSB+: its context error, through libipt.)
                Pkt::Trig(_) => return Err("TRIG in a PSB+"),
                Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_) | Pkt::Cbr(_) => {
                    st.clock.on_timing(pkt, true, st.clock_cfg)?;
                }
                Pkt::Fup(p) => {
                    fup = Some(st.last_ip.apply(p).ok_or("PSB+ FUP without IP")?);
                    after_fup = st.pos;
                    fup_at = pkt_at;
                }
                Pkt::ModeExec { csl, csd, iflag } => {
                    let m = FlowMode::of(csl, csd).ok_or("MODE.Exec with CS.L and CS.D set")?;
                    let Some(first) = mode else {
                        mode_at = pkt_at;
                        psb_iflag = Some(iflag);
                        mode = Some(m);
                        continue;
                    };
                    // A second one, as libipt reads it: the same mode and IF as the
                    // first change nothing; in a PSB+ passed while the code runs,
                    // another mode, where the first is the code's, is the bad status
                    // update, at it. (Another mode at a synchronization or while tracing
                    // is disabled, or with another IF under iflags events: through
                    // libipt.)
                    let same_if = !st.iflags || psb_iflag == Some(iflag);
                    if m == first && same_if {
                        continue;
                    }
                    if sync || !st.enabled || !st.mode_known || !same_if {
                        return Err("two MODE.Execs in a PSB+");
                    }
                    if m != first && first == self.blocks.flow.mode {
                        mode_at = pkt_at;
                        mode = Some(m);
                    }
                }
                Pkt::Psbend => {
                    st.psbend = Some((pkt_at, st.pos));
                    st.psb_sync = sync;
                    break;
                }
                Pkt::Ovf => {
                    ovf = true;
                    break;
                }
                // A packet libipt's packet decoder refuses, or trace of code, in a PSB+
                // passed while decoding: libipt's error at it (a MODE.Exec before it that
                // states another mode fails first). (In the PSB+ of a synchronization:
                // libipt's sync error, through libipt.)
                Pkt::Other(_) | Pkt::Tnt { .. } | Pkt::Tip(_) | Pkt::TipPgd(_) | Pkt::TipPge(_)
                    if !sync =>
                {
                    if mode.is_some_and(|m| st.mode_known && m != self.blocks.flow.mode) {
                        return Err(self.flow_bad_status(st, at, mode_at, MODE_STATUS));
                    }
                    if st.iflags && st.iflag.is_some_and(|f| psb_iflag.is_some_and(|p| p != f)) {
                        return Err(self.flow_bad_status(st, at, mode_at, IFLAG_STATUS));
                    }
                    let Pkt::Other(what) = pkt else {
                        return Err(self.flow_context_at(st, pkt_at, "trace of code in a PSB+"));
                    };
                    // (With erratum BDM70 libipt looks past a PSB+ FUP: it fails there.)
                    let at = if st.bdm70 && fup.is_some() {
                        fup_at
                    } else {
                        pkt_at
                    };
                    return Err(self.flow_bad_packet_at(st, what, at));
                }
                _ => return Err("packet the fast decoder leaves to libipt in a PSB+"),
            }
        }
        // (With iflags events, libipt also checks the interrupt flag a PSB+ passed in the
        // flow states against the one it knows.)
        if let (Some(now), Some(before), true) = (psb_iflag, st.iflag, st.iflags && !sync) {
            if now != before && st.enabled {
                return Err(self.flow_bad_status(st, at, mode_at, IFLAG_STATUS));
            }
            if now != before {
                return Err("a PSB+ that states another IF while tracing is disabled");
            }
        }
        match (sync, psb_iflag) {
            (_, Some(f)) => st.iflag = Some(f),
            (true, None) => st.iflag = None,
            (false, None) => {}
        }
        match mode {
            // A PSB+ in the middle of the flow states the mode the code runs in.
            Some(m) if !sync && st.enabled && m != self.blocks.flow.mode => {
                return Err(self.flow_bad_status(st, at, mode_at, MODE_STATUS));
            }
            Some(m) => {
                self.blocks.flow.mode = m;
                st.mode_known = true;
                self.blocks.flow.cached_only = false;
            }
            // (Without MODE.Exec: the mode goes on, but only 64-bit is assumed.)
            None if self.blocks.flow.mode != FlowMode::Bit64 => {
                return Err("a PSB+ without MODE.Exec after code other than 64-bit")
            }
            // (libipt's synchronization forgets the mode.)
            None if sync => st.mode_known = false,
            None => {}
        }
        // Erratum BDM70: a PSB+ FUP followed by a TIP.PGE was written while tracing was
        // disabled. libipt then takes the PSB+ as disabled, its FUP's IP unseen.
        // (Not with an OVF after the FUP: libipt's search stops at it.)
        if st.bdm70 && !ovf && fup.is_some() && self.flow_bdm70_applies(after_fup)? {
            fup = None;
            st.last_ip.reset();
        }
        // libipt synchronizes at a PSB+ to decode what follows; one it passes (or the
        // one a segment's decoder starts at, which one pass passes) tells it that the
        // trace goes on after the last item.
        st.read_on = match fup {
            Some(ip) if !sync || st.at_cut => ReadOn::ToFup(ip),
            _ => ReadOn::Nothing,
        };
        // The status update events (their time: the PSB+'s). No block is held after them
        // where tracing is off, or where the decoder synchronizes here.
        self.flow_quiet_event_at(st, sync || fup.is_none());
        if sync {
            st.ret = RetStack::new();
            match fup {
                Some(ip) => {
                    const NO_MODE: Fallback = "no MODE.Exec at the synchronization point";
                    if mode.is_none() && !st.resync {
                        return Err(NO_MODE);
                    }
                    self.blocks.flow.cached_only = mode.is_none();
                    st.enabled = true;
                    self.flow_blocks_anew_for_sideband();
                    st.cur = self.flow_block(ip).map_err(|e| match e {
                        NOT_BUILT => NO_MODE,
                        e => e,
                    })?;
                }
                None => st.enabled = false,
            }
            if ovf {
                if st.at_cut {
                    return Err("OVF inside the PSB+ of a cut");
                }
                self.flow_ovf(st)?;
            }
        } else if ovf {
            return Err("OVF inside a PSB+ passed while decoding");
        } else if st.enabled != fup.is_some() {
            return Err("PSB+ status differs from the decoder's");
        } else if let (Some(ip), Some(_)) = (fup, mode) {
            // libipt binds the PSB+'s MODE.Exec to its FUP IP and walks there without
            // trace: from the last trace item through the code walked since, up to the
            // branch that waits for trace.
            if !self.flow_reachable(st, at, ip) {
                // (libipt walks the block waiting for trace to its branch, whose query
                // meets the PSB+'s status instead: a bad query at its PSBEND; its resync
                // is at that PSB+, whose status sends decoding on at the FUP IP.)
                let why = "PSB+ FUP IP not reached without trace";
                return Err(match (at, st.psbend) {
                    (Some(b), Some((end, _))) => self.flow_query_failed(st, b, end, psb_at, why),
                    _ => why,
                });
            }
        }
        Ok(fup)
    }

    /// Block `b`'s last instruction (the branch it ends with).
    fn flow_last_insn(&self, b: FBlock) -> Option<&crate::records::Instruction> {
        self.flow_recs(b)
            .iter()
            .rev()
            .find_map(|r| r.as_instruction())
    }

    /// Whether `ip` is an instruction walked since the last trace item, or one of block
    /// `at`'s (the block waiting for trace).
    fn flow_reachable(&self, st: &FlowState, at: Option<FBlock>, ip: u64) -> bool {
        let arena = &self.blocks.arena;
        let walked = self.queue.since(st.committed).unwrap_or(&[]);
        walked.iter().any(|item| match item {
            Item::Block(start, len) => arena
                .get(*start as usize..(*start + *len) as usize)
                .is_some_and(|recs| recs.iter().any(|r| is_insn_at(r, ip))),
            Item::Rec(_) => false,
        }) || at.is_some_and(|b| self.flow_index_of(b, ip).is_some())
    }

    /// BDM70: a PSB+ FUP followed by TIP.PGE means tracing was disabled at the PSB+.
    /// libipt's search: status, timing and PAD packets passed, a TIP.PGE says it applies,
    /// any other packet (a TRIG: libipt's unknown packet) or the end that it does not. A
    /// packet the fast decoder does not know (libipt's error): through libipt.
    pub(super) fn flow_bdm70_applies(&self, mut pos: usize) -> Result<bool, Fallback> {
        while let Some((p, size)) = self.pkt(pos) {
            match p {
                p if passed_in_psb(p) || p == Pkt::Psbend => pos += size,
                Pkt::TipPge(_) => return Ok(true),
                Pkt::Other(_) => {
                    return Err("erratum BDM70: a packet the fast decoder leaves to libipt")
                }
                _ => return Ok(false),
            }
        }
        Ok(false)
    }
}
/// What libipt's searches through a PSB+ (for its FUP, for erratum BDM70) pass over: PAD,
/// timing packets, MODE, PIP, VMCS, MNT.
fn passed_in_psb(p: Pkt) -> bool {
    matches!(
        p,
        Pkt::Pad
            | Pkt::Tsc(_)
            | Pkt::Mtc(_)
            | Pkt::Tma { .. }
            | Pkt::Cyc(_)
            | Pkt::Cbr(_)
            | Pkt::ModeExec { .. }
            | Pkt::ModeTsx { .. }
            | Pkt::Pip
            | Pkt::Vmcs
            | Pkt::Mnt
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decoder's clock is libipt's time model (tested in `timing`) with libipt's
    /// decoder's error handling: configuration errors ignored, the others hand the window
    /// over.
    #[test]
    fn clock_ignores_configuration_errors_and_hands_over_the_others() {
        let cfg = TimeCfg {
            mtc_freq: 2,
            cpuid_0x15_eax: 1,
            cpuid_0x15_ebx: 3,
            ..Default::default()
        };
        let mut c = Clock::default();
        assert_eq!(c.on_timing(Pkt::Mtc(7), false, cfg), Ok(true));
        assert_eq!(c.now(), None);
        c.on_timing(Pkt::Tsc(1000), true, cfg).unwrap();
        c.on_timing(Pkt::Tma { ctc: 0x10, fc: 5 }, true, cfg)
            .unwrap();
        c.on_timing(Pkt::Mtc(5), false, cfg).unwrap();
        assert_eq!(c.now(), Some(995 + 12));
        // Without CPUID 0x15's ratio: the time stays, decoding goes on.
        let no_ratio = TimeCfg {
            cpuid_0x15_ebx: 0,
            ..cfg
        };
        assert_eq!(c.on_timing(Pkt::Mtc(6), false, no_ratio), Ok(true));
        assert_eq!(c.now(), Some(995 + 12));
        // A second TMA, a CBR of 0: libipt's decoder fails, the window goes to it.
        assert_eq!(
            c.on_timing(Pkt::Tma { ctc: 0, fc: 0 }, false, cfg),
            Err("TMA out of place")
        );
        assert_eq!(c.on_timing(Pkt::Cbr(0), false, cfg), Err("CBR of 0"));
        assert!(!c.met_cyc());
        assert_eq!(c.on_timing(Pkt::Cyc(3), false, cfg), Ok(true));
        assert!(c.met_cyc());
        assert_eq!(c.on_timing(Pkt::Pad, false, cfg), Ok(false));
    }
}
