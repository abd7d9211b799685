//! Decode errors in the fast decoder, and the resynchronisation after one: without
//! options at the PSB libipt 2.1.2's pipeline synchronizes at next (its gap at its
//! offset, so that the window's records stay libipt's); with
//! [`WindowOptions::resync_on_error`] as libipt 2.2's `pt_blk_resync` (ptxed
//! `--resync-on-error`) does it (libipt 2.1.2, the oracle of everything else, resyncs at
//! PSBs only). The rest of this note is about the latter.
//!
//! A decode error the fast decoder is sure of (no code at an IP: libipt's nomap; trace
//! that does not match the code: bad query, bad compressed return, compressed return
//! without call; a TIP.PGE while tracing is enabled) queues the gap record libipt gives
//! for it, then decoding goes on at the first trace packet from the error on that gives
//! an IP:
//! - TNT, timing, PAD, CBR: passed;
//! - TIP: decoding goes on at its target;
//! - TIP.PGD: tracing disabled (a `TraceDisabled` record);
//! - TIP.PGE: tracing disabled (`TraceDisabled` without IP: the state libipt reports),
//!   the TIP.PGE then enables it as usual;
//! - FUP + TIP / FUP + TIP.PGD (an asynchronous branch / disable): its record, decoding
//!   goes on at the TIP's target / tracing disabled;
//! - MODE.Exec that changes the execution mode, MODE.TSX, PTW with its IP bit: the FUP
//!   they bind to gives the IP (no record: none of them makes one), in the mode the
//!   MODE.Exec states; a TIP or TIP.PGD right after that FUP is its asynchronous branch or
//!   disable as above; a MODE.Exec that changes nothing is no event to libipt: it and its
//!   FUP are passed;
//! - OVF: the overflow as usual (resolved by the next FUP, or tracing disabled);
//! - PSB: a new synchronization there (libipt's `pt_blk_resync_at_sync`);
//! - a second FUP bound to nothing, no TIP right after it: libipt fails at the next TIP
//!   (an internal error: two asynchronous branches wait for it), its resync too.
//!
//! After the errors libipt's decoder does not get past — a PSB+ passed while decoding
//! that states another execution mode than the code's (a bad status update), a packet
//! its packet decoder refuses (also where it looks for an OVF's FUP: at the OVF; a TRIG
//! with the IP bit and an instruction count), trace of code inside a PSB+ or while
//! tracing is disabled (a context error), an asynchronous branch's FUP without IP — its
//! resync fails the same way (a second gap, ptxed's "resync error"), and decoding goes
//! on at the next PSB. An OVF bound to a FUP without IP resolves with tracing disabled;
//! trace of code right after it is libipt's "no enable" past it, whence the resync
//! searches.
//!
//! What the fast decoder does not handle (other packets, errata) is never
//! guessed at: before the first resynchronization of a window the window goes to libipt
//! as without the option (its records, PSB resync, and a warning that says why); after
//! one (the records are no longer libipt's to redo), a gap record names why and decoding
//! goes on at the next PSB.
//!
//! [`WindowOptions::resync_on_error`]: super::super::WindowOptions::resync_on_error

use super::{End, FBlock, Fallback, FlowState, PtDecoder, Stop};
use crate::records::{Gap, GapKind, Record};
use crate::wire::{self, LastIp, Pkt};

/// libipt's texts for the errors the fast decoder recognizes (`pt_errstr`).
const NOMAP: &str = "no memory mapped at this address";
/// libipt's error where its instruction-length decoder fails ([`End::BadInsn`]).
const BAD_INSN: &str = "unknown instruction";
const BAD_QUERY: &str = "trace stream does not match query";
const BAD_RETCOMP: &str = "bad compressed return";
const RETSTACK_EMPTY: &str = "compressed return without call";
const BAD_CONTEXT: &str = "unexpected packet context";
const BAD_STATUS: &str = "bad status update";
const BAD_OPC: &str = "unknown opcode";
const BAD_PACKET: &str = "unknown packet";
const IP_SUPPRESSED: &str = "ip has been suppressed";
const NO_ENABLE: &str = "expected tracing enabled event";
/// libipt's text (an internal error), said why.
const TIP_WITHOUT_IP: &str = "internal error: a TIP without IP where libipt's resync resumes";
/// libipt's text (an internal error), said why.
const TWO_FUPS: &str = "internal error: two asynchronous branches (FUPs) wait for one TIP \
     after an error, which libipt's decoder fails at";
/// What the fast decoder names a TRIG with the IP bit and an instruction count
/// ([`Pkt::Other`]'s text is the gap's: libipt's bad packet, said why).
pub(super) const TRIG_WITH_ICNT: &str =
    "unknown packet: a TRIG with the IP bit and an instruction \
     count, which libipt 2.2 refuses (the FUP after it gives the IP)";

/// A decode error the fast decoder stopped at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlowError {
    /// libipt's text.
    what: &'static str,
    /// The address without code (nomap).
    ip: Option<u64>,
    /// The gap's offset in the trace.
    offset: usize,
    /// Where the search for the resync point starts.
    resume: usize,
    /// How libipt's resync goes on from the error.
    resync: ResyncFrom,
}

/// How libipt's resync (ptxed's `--resync-on-error`) goes on after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResyncFrom {
    /// At the first packet from [`FlowError::resume`] on that gives an IP.
    Search,
    /// Its decoder stays failed there: its resync fails the same way (ptxed's "resync
    /// error"), then it synchronizes at the next PSB.
    Fails,
    /// As `Fails`, after the same error once more: the resync finds its packet, and
    /// decoding from there fails at once.
    FailsAgain,
    /// As `FailsAgain`, the resync at an enable (a TIP.PGE): its decoder is disabled
    /// until the enable is taken (ptxed's `[disabled]`), then fails again.
    FailsAgainAtEnable,
}

/// Where the first packet at or after `p` that is not a PTW starts, and that packet
/// with its size (`None` where nothing parses there).
fn packet_past_ptws(t: &[u8], mut p: usize, e: wire::WireErrata) -> (usize, Option<(Pkt, usize)>) {
    loop {
        match wire::parse_with(t, p, e) {
            Some((Pkt::Ptw { .. }, size)) => p += size,
            next => return (p, next),
        }
    }
}

/// libipt's error for a packet the wire parser names `what` ([`Pkt::Other`]); None for
/// one libipt's packet decoder decodes (what its event decoder makes of it: through
/// libipt).
pub(super) fn refused_text(what: &str) -> Option<&'static str> {
    match what {
        "unknown opcode" | "extended packet" => Some(BAD_OPC),
        TRIG_WITH_ICNT => Some(TRIG_WITH_ICNT),
        "cbr with ratio 0" => None,
        _ => Some(BAD_PACKET),
    }
}

/// What a FUP met in a resync search is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// Nothing: an asynchronous branch or disable (FUP + TIP / TIP.PGD).
    No,
    /// MODE.Exec, MODE.TSX (begin, commit) or PTW: the FUP alone gives the IP.
    Alone,
    /// A MODE.TSX abort: its FUP, with a TIP or TIP.PGD after it as the branch.
    Abort,
}

impl PtDecoder<'_> {
    /// Whether TRIG `t`, its next packet at `next`, is one libipt 2.2 (with the option,
    /// `resync`) queues for a FUP to come later: the IP bit set, an instruction count of
    /// 0 (others are a bad packet), no FUP right after it.
    fn trig_waits(&self, resync: bool, t: wire::Trig, next: usize) -> bool {
        resync && t.ip && t.icnt == Some(0) && !matches!(self.pkt(next), Some((Pkt::Fup(_), _)))
    }

    /// The flow reached a block that ends where no image has code (`b.fall`), or an
    /// instruction its code's end cuts: libipt walks the block and fails there (nomap,
    /// or its length decoder's error) unless the trace ends first or the next trace item
    /// binds to one of the block's instructions before.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_nomap(
        &mut self,
        st: &mut FlowState,
        b: FBlock,
    ) -> Result<Option<Stop>, Fallback> {
        if st.tnt_n == 0 && self.flow_nomap_binds(st, b)? {
            let item = self.flow_next_item(st)?;
            return self.flow_item_at(st, b, item);
        }
        self.flow_push_block(st, b, b.len);
        let what = match b.end {
            End::BadInsn => BAD_INSN,
            _ => NOMAP,
        };
        st.error = Some(FlowError {
            what,
            ip: Some(b.fall),
            offset: self.flow_gap_offset(st, st.pos),
            resume: st.pos,
            resync: ResyncFrom::Search,
        });
        Err(what)
    }

    /// Whether the trace after the block ending at unmapped code `b` ends, or its next
    /// item binds to an instruction of `b` (or is one the engine leaves to its usual
    /// handling: an OVF, a TIP.PGE, something it does not know): `false` where libipt
    /// fails at the unmapped address first. Event trace before that item binds where the
    /// item says; where libipt fails at the code first, its events come before the
    /// failure: that goes to libipt.
    fn flow_nomap_binds(&self, st: &FlowState, b: FBlock) -> Result<bool, Fallback> {
        const EVENTS: Fallback = "code without an image before event trace";
        let mut last = st.last_ip;
        let mut p = st.pos;
        let mut events = false;
        // (A MODE.Exec or MODE.TSX the next FUP is bound to.)
        let mut bound = false;
        // (An event at the address without code binds there: libipt takes it before it
        // reads the code.)
        let in_block =
            |ip: Option<u64>| ip.is_some_and(|ip| self.flow_event_index(b, ip).is_some());
        let binds = loop {
            let (at, next) = packet_past_ptws(self.trace, p, self.wire);
            p = at;
            // (The TIP of a FUP whose TNT bits were taken first: that FUP's.)
            // (A PSB or TIP.PGE instead of its TIP: libipt's context error at it comes
            // first.)
            if let Some((_, from)) = st.async_tip.filter(|a| a.0 == p) {
                break matches!(next, Some((Pkt::Psb | Pkt::TipPge(_), _))) || in_block(Some(from));
            }
            let Some((pkt, size)) = next else {
                break true;
            };
            match pkt {
                // (SKZ84's corrupted TMA: libipt's event decoder passes over it.)
                // (A PSBEND outside a PSB+: passed as libipt's event decoder passes it.)
                Pkt::Invalid
                | Pkt::Pad
                | Pkt::Psbend
                | Pkt::Tsc(_)
                | Pkt::Mtc(_)
                | Pkt::Tma { .. }
                | Pkt::Cyc(_)
                | Pkt::Cbr(_) => p += size,
                Pkt::ModeExec { .. } | Pkt::ModeTsx { .. } => {
                    bound = true;
                    p += size;
                }
                Pkt::Trig(t) if !t.ip => p += size,
                // (With the option, one with the IP bit and no FUP next: libipt 2.2 queues
                // it for a later FUP and reads on.)
                Pkt::Trig(t) if self.trig_waits(st.resync, t, p + size) => p += size,
                pkt if super::event_trace::ignored(pkt) => p += size,
                Pkt::Evd { .. } | Pkt::Cfe { ip: false, .. } => {
                    events = true;
                    p += size;
                }
                Pkt::Cfe { ip: true, .. } => return Err(EVENTS),
                // (A FUP without IP: libipt's event decoder fails at it, reading ahead
                // from the last trace item, before the code.)
                // (An asynchronous branch's the trace ends after: libipt meets the end
                // first.)
                Pkt::Fup(_) if !bound && p + size >= self.trace.len() => break true,
                // (An asynchronous branch's where the branch went to unmapped code, with
                // a packet libipt refuses, a TIP.PGE or a PSB after it: its event decoder,
                // reading on for the TIP, fails there first.)
                Pkt::Fup(ip) if !bound && b.len == 0 => {
                    let fails = match self.pkt(self.flow_past_timing_at(p + size)) {
                        Some((Pkt::Other(what), _)) => refused_text(what).is_some(),
                        Some((Pkt::TipPge(_) | Pkt::Psb, _)) => true,
                        _ => false,
                    };
                    break fails || last.apply(ip).is_none_or(|ip| in_block(Some(ip)));
                }
                Pkt::Fup(ip) => break last.apply(ip).is_none_or(|ip| in_block(Some(ip))),
                // (Without IP, one binds to a MOV CR3 before the code ends.)
                Pkt::TipPgd(ip) => {
                    break match last.apply(ip) {
                        Some(ip) => in_block(Some(ip)),
                        None => self.flow_pgd_binding(st, b).is_some(),
                    }
                }
                Pkt::Psb => {
                    // (A PSB+ that another packet than its own breaks off: libipt's
                    // packet error may come first.)
                    let Some((_, ovf)) = self.flow_psb_end(p) else {
                        return Err("a broken PSB+ after code without an image");
                    };
                    let fup = self.flow_psb_fup(p);
                    // (With erratum BDM70, libipt looks past a PSB+'s FUP for a TIP.PGE:
                    // where that fails or finds one, through libipt.)
                    if let (true, false, Some((_, after))) = (st.bdm70, ovf, fup) {
                        if self.flow_bdm70_applies(after)? {
                            return Err("erratum BDM70 after code without an image");
                        }
                    }
                    break fup.is_some_and(|(ip, _)| {
                        ip.is_some_and(|ip| self.flow_reachable(st, Some(b), ip))
                    });
                }
                // (A TIP.PGE while tracing is enabled: libipt takes its enable event
                // before the code at the block's start, and fails there.)
                Pkt::TipPge(_) => break true,
                Pkt::Tnt { .. } | Pkt::Tip(_) => break false,
                _ => break true,
            }
        };
        if !binds && events {
            return Err(EVENTS);
        }
        Ok(binds)
    }

    /// Where the PSB+ at `p` ends (past its PSBEND, or an OVF: `true`), with only the
    /// packets a PSB+ holds before it; none where another packet breaks it off.
    fn flow_psb_end(&self, mut p: usize) -> Option<(usize, bool)> {
        p += wire::PSB.len();
        while let Some((pkt, size)) = self.pkt(p) {
            match pkt {
                Pkt::Psbend => return Some((p + size, false)),
                Pkt::Ovf => return Some((p + size, true)),
                Pkt::Fup(_) | Pkt::Invalid => {}
                pkt if super::passed_in_psb(pkt) => {}
                _ => return None,
            }
            p += size;
        }
        None
    }

    /// The FUP of the PSB+ at `p`: its IP, and where the packet after it starts.
    fn flow_psb_fup(&self, mut p: usize) -> Option<(Option<u64>, usize)> {
        let mut last = LastIp::default();
        p += wire::PSB.len();
        while let Some((pkt, size)) = self.pkt(p) {
            match pkt {
                Pkt::Fup(ip) => return Some((last.apply(ip), p + size)),
                Pkt::Psbend | Pkt::Psb => return None,
                _ => p += size,
            }
        }
        None
    }

    /// Where libipt 2.1.2 reports an error found with the trace at `p`: its query decoder
    /// has read the events up to the next TIP-class packet (a FUP, MODE.Exec, a PSB+ up
    /// to its PSBEND), the FUP a MODE.TSX (or, with iflags events, a MODE.Exec that
    /// changes IF) binds to, or the TNT packet it takes bits from.
    fn flow_gap_offset(&self, st: &FlowState, mut p: usize) -> usize {
        let mut tsx = false;
        let mut iflag = st.iflag;
        loop {
            let (at, next) = packet_past_ptws(self.trace, p, self.wire);
            p = at;
            let Some((pkt, size)) = next else {
                return p;
            };
            match pkt {
                Pkt::Pad
                | Pkt::Tsc(_)
                | Pkt::Mtc(_)
                | Pkt::Tma { .. }
                | Pkt::Cyc(_)
                | Pkt::Cbr(_)
                | Pkt::Invalid => p += size,
                pkt if super::event_trace::ignored(pkt) => p += size,
                Pkt::ModeExec { iflag: f, .. } => {
                    tsx |= st.iflags && iflag != Some(f);
                    iflag = Some(f);
                    p += size;
                }
                Pkt::ModeTsx { .. } => {
                    tsx = true;
                    p += size;
                }
                Pkt::Fup(_) if tsx => return p,
                Pkt::Fup(_) => p += size,
                Pkt::Tnt { .. } => return p + size,
                Pkt::Psb => {
                    p += size;
                    while let Some((pkt, size)) = self.pkt(p) {
                        if pkt == Pkt::Psbend {
                            break;
                        }
                        p += size;
                    }
                    return p;
                }
                _ => return p,
            }
        }
    }

    /// The first packet from `p` on that is no PAD (libipt's event decoder passes PADs as
    /// it fetches a packet).
    pub(super) fn flow_past_pads(&self, mut p: usize) -> usize {
        while self.trace.get(p) == Some(&0) {
            p += 1;
        }
        p
    }

    /// Where libipt 2.1.2 reports a nomap, the trace read up to `p` (its query decoder
    /// holds the next event): past a TNT or TIP.PGD packet (and the PADs after it), at a
    /// TIP or at a FUP's TIP.PGD, at the PSBEND of a PSB+ with a FUP (its status events queued), at the end of
    /// the trace; PADs, timing packets and a FUP (waiting for its TIP) passed on the way.
    /// `resync` (libipt 2.2's resync, ptxed's `--resync-on-error`): TRIGs without IP
    /// passed too (libipt 2.2 knows them), and a MODE.Exec that changes nothing with the
    /// FUP it binds to (no event to libipt 2.2; libipt 2.1.2 stops at that FUP). `None`
    /// elsewhere (events libipt drains first: the fast decoder leaves those to
    /// libipt). (Found against libipt on the mutated traces of `tests/decode_fast.rs`.)
    fn flow_nomap_offset(&self, st: &FlowState, mut p: usize, resync: bool) -> Option<usize> {
        let mut fup = false;
        // (A MODE.Exec that changes nothing passed: the FUP it binds to is passed too.)
        let mut quiet_mode = false;
        loop {
            let Some((pkt, size)) = self.pkt(p) else {
                return (p >= self.trace.len()).then_some(p);
            };
            match pkt {
                Pkt::Pad
                | Pkt::Psbend
                | Pkt::Tsc(_)
                | Pkt::Mtc(_)
                | Pkt::Tma { .. }
                | Pkt::Cyc(_)
                | Pkt::Invalid => {}
                // (libipt 2.2, whose resync `--resync-on-error` follows, knows TRIG.)
                Pkt::Trig(t) if resync && !t.ip => {}
                Pkt::Trig(t) if self.trig_waits(resync, t, p + size) => {}
                Pkt::ModeExec { csl, csd, iflag }
                    if resync
                        && st.mode_known
                        && super::FlowMode::of(csl, csd) == Some(self.blocks.flow.mode)
                        && !(st.iflags && st.iflag != Some(iflag)) =>
                {
                    quiet_mode = true;
                }
                Pkt::Fup(_) if quiet_mode => quiet_mode = false,
                Pkt::Fup(_) => fup = true,
                pkt if super::event_trace::ignored(pkt) => {}
                Pkt::TipPgd(_) if !fup => return Some(self.flow_past_pads(p + size)),
                Pkt::Tnt { .. } => return Some(self.flow_past_pads(p + size)),
                // (The TIP or TIP.PGD of an asynchronous branch or disable.)
                Pkt::Tip(_) | Pkt::TipPgd(_) => return Some(p),
                // (One with a FUP: without, the status differs, libipt's error.)
                Pkt::Psb => {
                    let mut q = p + size;
                    let mut fup = false;
                    while let Some((pkt, size)) = self.pkt(q) {
                        match pkt {
                            Pkt::Psbend => return fup.then_some(q),
                            Pkt::Fup(_) => fup = true,
                            _ => {}
                        }
                        q += size;
                    }
                    return None;
                }
                _ => return None,
            }
            p += size;
        }
    }

    /// Trace that does not match the code at block `b`'s branch (`why`: what the engine
    /// met), the trace item that showed it starting at `item`: the block ran.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_bad_query(
        &mut self,
        st: &mut FlowState,
        b: FBlock,
        item: usize,
        why: Fallback,
    ) -> Fallback {
        let offset = self.flow_gap_offset(st, item);
        self.flow_query_failed(st, b, offset, item, why)
    }

    /// Block `b` ran to its branch, whose query libipt fails (a bad query): reported at
    /// trace offset `offset`, the resync searching from `resume` (`why`: what the engine
    /// met).
    #[cold]
    #[inline(never)]
    pub(super) fn flow_query_failed(
        &mut self,
        st: &mut FlowState,
        b: FBlock,
        offset: usize,
        resume: usize,
        why: Fallback,
    ) -> Fallback {
        self.flow_push_block(st, b, b.len);
        // (At the block's last instruction, the branch the trace did not answer, as
        // libipt's block decoder leaves its IP and ptxed reports it.)
        let ip = self.flow_last_insn(b).map(|i| i.pc);
        st.error = Some(FlowError {
            what: BAD_QUERY,
            ip,
            offset,
            resume,
            resync: ResyncFrom::Search,
        });
        why
    }

    /// A TIP.PGE while tracing is enabled, just read (at `st.item_at`), or a TIP.PGE or
    /// PSB at `at` while an asynchronous branch's FUP waits for its TIP (`why` says
    /// which): libipt's event decoder fails at it as its query decoder fetches it ahead,
    /// and the query decoder reports that, without IP, at the query that took the trace
    /// item before it (the last bit of its TNT, its TIP): nothing after that item ran,
    /// neither the block waiting for trace nor code walked without trace, but for the
    /// code up to the FUP IP of a PSB+ passed right before it. (libipt's
    /// resync, `resync`: at a TIP.PGE while tracing is enabled it takes the enable; where
    /// a FUP waits, it fails at a TIP.PGE again, at a PSB at once.)
    #[cold]
    #[inline(never)]
    pub(super) fn flow_context_ahead(
        &mut self,
        st: &mut FlowState,
        at: usize,
        resync: ResyncFrom,
        why: Fallback,
    ) -> Fallback {
        // (After a PSB+ with a FUP passed right before, the code up to its IP ran first.)
        if let (super::ReadOn::Nothing, Some(ip), false) = (st.read_on, st.psb_fup, st.psb_sync) {
            if self.flow_right_after_psb_past(st, true) {
                st.read_on = super::ReadOn::ToFup(ip);
            }
        }
        if !self.flow_read_on_ran(st, true) {
            return why;
        }
        st.async_tip = None;
        st.error = Some(FlowError {
            what: BAD_CONTEXT,
            ip: None,
            offset: at,
            resume: at,
            resync,
        });
        why
    }

    /// A PSB+ passed while decoding states another execution mode than the code's, or
    /// (with iflags events) another interrupt flag than the trace before (its MODE.Exec
    /// at `offset`; `at`: the block waiting for trace; `why` says which): libipt's bad
    /// status update. Without `--resync-on-error` the window goes to libipt; with it, libipt's
    /// `pt_blk_next` fails there before the code walked since the last trace item, and
    /// ptxed reports the error where that code starts (the target of the branch the last
    /// trace item decided).
    #[cold]
    #[inline(never)]
    pub(super) fn flow_bad_status(
        &mut self,
        st: &mut FlowState,
        at: Option<FBlock>,
        offset: usize,
        why: Fallback,
    ) -> Fallback {
        if !st.resync {
            return why;
        }
        let first = |recs: &[Record]| recs.iter().find_map(|r| r.as_instruction()).map(|i| i.pc);
        let arena = &self.blocks.arena;
        let walked = self.queue.since(st.committed).unwrap_or(&[]);
        let ip = walked
            .iter()
            .find_map(|item| match item {
                super::Item::Block(start, len) => {
                    first(arena.get(*start as usize..(*start + *len) as usize)?)
                }
                super::Item::Rec(_) => None,
            })
            .or_else(|| at.and_then(|b| first(self.flow_recs(b))));
        self.flow_drop_walked(st);
        st.error = Some(FlowError {
            what: BAD_STATUS,
            ip,
            offset,
            resume: offset,
            resync: ResyncFrom::Fails,
        });
        why
    }

    /// A packet libipt's packet decoder refuses (`what`: the wire parser's name for it),
    /// the next trace item the flow reads (at `st.item_at`): libipt's error there, the
    /// code walked since the last trace item decoded. Its resync then fails the same way;
    /// decoding goes on at the next PSB.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_bad_packet(&mut self, st: &mut FlowState, what: &'static str) -> Fallback {
        // What libipt read since the last trace item: a PSB+ with a FUP decodes the code
        // up to its IP first; after other events, through libipt. (With iflags events,
        // where libipt reports it right after a PSB+ depends on the PSB+'s status
        // events: through libipt.)
        if st.iflags && self.flow_right_after_psb(st) {
            return what;
        }
        if !self.flow_read_on_ran(st, false) {
            return what;
        }
        self.flow_bad_packet_at(st, what, st.item_at)
    }

    /// A FUP without IP bound to no event (an asynchronous branch's), just read (at
    /// `st.item_at`): libipt's event decoder has no address to branch from and fails
    /// there (ip suppressed), the code walked since the last trace item decoded; its
    /// resync then fails the same way.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_fup_without_ip(&mut self, st: &mut FlowState) -> Fallback {
        const WHY: Fallback = "FUP without IP";
        if !self.flow_read_on_ran(st, false) {
            return WHY;
        }
        st.error = Some(FlowError {
            what: IP_SUPPRESSED,
            ip: None,
            offset: st.item_at,
            resume: st.item_at,
            resync: ResyncFrom::Fails,
        });
        WHY
    }

    /// A TNT packet, just read, right after an overflow resolved at a FUP without IP
    /// (see `FlowState::ovf_unplaced`): libipt's block decoder, disabled, fails its next
    /// query (no enable) with its event decoder past that TNT; the resync searches from
    /// there.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_no_enable(&mut self, st: &mut FlowState) -> Fallback {
        st.error = Some(FlowError {
            what: NO_ENABLE,
            ip: None,
            offset: st.pos,
            resume: st.pos,
            resync: ResyncFrom::Search,
        });
        "trace of code after an overflow resolved at a FUP without IP"
    }

    /// A TIP without IP, just read (at `st.item_at`), where the block waiting for trace
    /// ends with a conditional branch (no TNT bits left, no asynchronous branch waiting):
    /// libipt's query for the branch's bit fails there (a bad query), whatever the TIP
    /// says. Elsewhere: through libipt.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_tip_without_ip(&mut self, st: &mut FlowState) -> Fallback {
        const WHY: Fallback = "TIP without IP";
        let b = match self.blocks.flow.blocks.get(st.cur as usize) {
            Some(&b) if st.enabled && b.end == super::End::Cond => b,
            _ => return WHY,
        };
        if st.tnt_n != 0 || st.async_tip.is_some() || !matches!(st.read_on, super::ReadOn::Nothing)
        {
            return WHY;
        }
        self.flow_bad_query(st, b, st.item_at, WHY)
    }

    /// A TRIG (no IP bit) with instruction count `n` read where the block the walk is at
    /// waits for trace at its end (with `--resync-on-error`, libipt 2.2's reading):
    /// libipt counts `n` instructions from where the last trace item placed the code (the
    /// start of that block, or of the blocks walked without trace before it) and binds
    /// the TRIG there. Where the count reaches the branch that waits for trace, its query
    /// fails (a bad query where its query decoder stands: the TNT or TIP after the TRIG,
    /// past PADs), as it does with nothing else to read. Elsewhere: through libipt.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_trig_icnt(&mut self, st: &mut FlowState, n: u16) -> Result<(), Fallback> {
        const WHY: Fallback = "TRIG with an instruction count";
        let b = match self.blocks.flow.blocks.get(st.cur as usize) {
            Some(&b) if st.enabled => b,
            _ => return Err(WHY),
        };
        if st.tnt_n != 0 || st.async_tip.is_some() || !matches!(st.read_on, super::ReadOn::Nothing)
        {
            return Err(WHY);
        }
        let insns = self
            .flow_recs(b)
            .iter()
            .filter(|r| matches!(r, Record::Instruction(_)))
            .count() as u64;
        if u64::from(n) < st.without_trace + insns {
            return Ok(());
        }
        let item = self.flow_past_pads(st.pos);
        let traced = matches!(
            b.end,
            End::Cond | End::Indirect | End::IndirectCall | End::Return
        );
        if !traced || !matches!(self.pkt(item), Some((Pkt::Tnt { .. } | Pkt::Tip(_), _))) {
            return Err(WHY);
        }
        Err(self.flow_query_failed(st, b, item, item, WHY))
    }

    /// A PSB (`pge`: a TIP.PGE) at `at` while an event waits for the packet it binds to
    /// (a FUP bound to nothing for its TIP; after a resync, a MODE.TSX or PTW for its
    /// FUP): [`Self::flow_context_ahead`]'s error, libipt's resync failing there at once
    /// at a PSB, after the same error once more at a TIP.PGE.
    pub(super) fn flow_fup_waits_at(
        &mut self,
        st: &mut FlowState,
        at: usize,
        pge: bool,
    ) -> Fallback {
        let resync = if pge {
            ResyncFrom::FailsAgainAtEnable
        } else {
            ResyncFrom::Fails
        };
        let why = "a PSB or TIP.PGE where a FUP waits for its TIP";
        self.flow_context_ahead(st, at, resync, why)
    }

    /// What libipt read since the last trace item ran before an error there: after a
    /// PSB+ with a FUP, the code up to its IP (the block waiting for trace up to it);
    /// after nothing else, nothing (`drop`: the code walked without trace dropped). False
    /// where libipt's records depend on more (other events read): through libipt.
    fn flow_read_on_ran(&mut self, st: &mut FlowState, drop: bool) -> bool {
        match st.read_on {
            super::ReadOn::Nothing => {
                if drop {
                    self.flow_drop_walked(st);
                }
            }
            super::ReadOn::ToFup(ip) => {
                let b = st
                    .enabled
                    .then(|| self.blocks.flow.blocks.get(st.cur as usize).copied())
                    .flatten();
                let Some((b, n)) = b.and_then(|b| Some((b, self.flow_index_of(b, ip)?))) else {
                    return false;
                };
                self.flow_push_block(st, b, n);
            }
            super::ReadOn::Other => return false,
        }
        true
    }

    /// A packet libipt's packet decoder refuses at `at` (`what`: the wire parser's name
    /// for it).
    pub(super) fn flow_bad_packet_at(
        &mut self,
        st: &mut FlowState,
        what: &'static str,
        at: usize,
    ) -> Fallback {
        let Some(text) = refused_text(what) else {
            return what;
        };
        st.error = Some(FlowError {
            what: text,
            ip: None,
            offset: at,
            resume: at,
            resync: ResyncFrom::Fails,
        });
        what
    }

    /// Trace of code (at `at`) where there is no code to trace (`why`: inside a PSB+
    /// passed while decoding, while tracing is disabled): libipt's context error there,
    /// its decoder failed from there on.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_context_at(
        &mut self,
        st: &mut FlowState,
        at: usize,
        why: Fallback,
    ) -> Fallback {
        st.error = Some(FlowError {
            what: BAD_CONTEXT,
            ip: None,
            offset: at,
            resume: at,
            resync: ResyncFrom::Fails,
        });
        why
    }

    /// A compressed return (block `b`'s) whose TNT bit says not taken.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_bad_retcomp(&mut self, st: &mut FlowState, b: FBlock) -> Fallback {
        self.flow_push_block(st, b, b.len);
        // (After the return, as libipt's block decoder and ptxed report it.)
        st.error = Some(FlowError {
            what: BAD_RETCOMP,
            ip: Some(b.fall),
            offset: self.flow_gap_offset(st, st.pos),
            resume: st.pos,
            resync: ResyncFrom::Search,
        });
        "compressed return not taken"
    }

    /// A compressed return (block `b`'s) with nothing on the return stack (its block
    /// queued).
    #[cold]
    #[inline(never)]
    pub(super) fn flow_retstack_empty(&mut self, st: &mut FlowState, b: FBlock) -> Fallback {
        st.error = Some(FlowError {
            what: RETSTACK_EMPTY,
            ip: Some(b.fall),
            offset: self.flow_gap_offset(st, st.pos),
            resume: st.pos,
            resync: ResyncFrom::Search,
        });
        "compressed return, empty return stack"
    }

    fn flow_gap(&mut self, offset: usize, ip: Option<u64>, error: String) {
        self.queue.push_rec(Record::Gap(Box::new(Gap {
            kind: GapKind::DecodeError,
            ip,
            pt_offset: self.opts.base_offset + offset as u64,
            source: self.opts.source.clone(),
            error,
        })));
    }

    /// The engine stopped with `r` (an error): a decode error queues its gap and decoding
    /// goes on at the resync point (with `--resync-on-error`, libipt 2.2's; else the PSB
    /// libipt 2.1.2's pipeline synchronizes at next); anything else goes to libipt (`Err`)
    /// before the window's first resync on error, and to the next PSB after it (a gap
    /// saying why). (Without the option, the records up to there are libipt's: it decodes
    /// the window from its start, the records handed out skipped.)
    #[cold]
    #[inline(never)]
    pub(super) fn flow_recover(
        &mut self,
        st: &mut FlowState,
        mut r: Result<Stop, Fallback>,
    ) -> Result<Stop, Fallback> {
        if self.part.is_some() {
            return r;
        }
        loop {
            let Err(why) = r else {
                return r;
            };
            if let Some(mut e) = st.error.take() {
                // (What the trace read before the error was to bind to is gone with it,
                // but for an asynchronous branch's FUP whose TIP is not read yet: it
                // still waits in libipt's event queue, for its resync, see
                // `flow_resync`.)
                let resume = e.resume;
                st.async_tip = st.async_tip.filter(|a| st.resync && a.0 >= resume);
                st.iflag_event = None;
                st.cfe_fup = false;
                // An error met with the bits of a deferred TIP's TNT: libipt's event
                // decoder stands elsewhere (without the option: through libipt; with
                // it, at the TIP).
                let deferred = st.deferred_tip.filter(|d| d.1 == e.resume);
                match deferred {
                    Some(_) if !st.resync => return Err(why),
                    Some((at, _)) => e.offset = at,
                    None => {}
                }
                // Where libipt reports the error: a bad query where the engine saw it; a
                // bad compressed return or one without call where its event decoder
                // stands, past the TNT packet the bit came from and the PADs after it; a
                // nomap where its query decoder stands with the next event fetched (or,
                // where the fast decoder is not sure of that: without the option the
                // window goes to libipt; with it, at the next trace item).
                match e.what {
                    _ if deferred.is_some() => {}
                    NOMAP | BAD_INSN => match self.flow_nomap_offset(st, e.resume, st.resync) {
                        Some(at) => e.offset = at,
                        None if !st.resync => return Err(why),
                        None => {}
                    },
                    BAD_QUERY if st.bdm64 && !st.resync => return Err(why),
                    BAD_QUERY | BAD_CONTEXT | BAD_STATUS | BAD_OPC | BAD_PACKET
                    | TRIG_WITH_ICNT => {}
                    _ => e.offset = self.flow_past_pads(e.resume),
                }
                self.flow_commit(st);
                let error = match e.ip {
                    Some(ip) if e.what == NOMAP => format!("{NOMAP}: no code image covers {ip:#x}"),
                    _ => e.what.to_string(),
                };
                self.flow_gap(e.offset, e.ip, error);
                self.flow_commit(st);
                r = if st.resync {
                    st.resynced = true;
                    self.flow_resync(st, e)
                } else {
                    self.flow_sync_after(st, e)
                };
                continue;
            }
            if !st.resync {
                return Err(why);
            }
            if !st.resynced {
                let msg = format!(
                    "{}: --resync-on-error: the fast decoder handed the window to libipt \
                     ({why}), which resyncs at the next PSB after an error",
                    self.opts.source
                );
                if !self.warnings.contains(&msg) {
                    self.warnings.push(msg);
                }
                return Err(why);
            }
            // Records from here on cannot come from libipt (it did not resync where we
            // did): the code walked without trace goes, a gap (decided: it stays should
            // the next PSB fail too, as every failure has its gap), and on at the next PSB.
            self.flow_drop_walked(st);
            self.flow_gap(
                st.pos,
                None,
                format!(
                    "{why}: beyond the fast decoder after a resync on error (libipt 2.1.2 \
                     cannot go on from there); decoding resumes at the next PSB"
                ),
            );
            self.flow_commit(st);
            let from = st.psb_tried.map_or(st.pos, |q| st.pos.max(q + 1));
            let Some(q) = wire::find_psb(self.trace, from) else {
                return Ok(Stop::Done);
            };
            st.psb_tried = Some(q);
            r = self.flow_sync_at(st, q, false);
        }
    }

    /// After error `e` (without `--resync-on-error`, or where its resync failed): where
    /// libipt's `pt_blk_sync_forward` goes, from its packet decoder's position (past the packet at the gap's offset, the
    /// one its event decoder holds): the first PSB from 15 bytes before there (one that
    /// packet may have cut into), the last of a run of PSB patterns (libipt's search
    /// ends there). Decoding starts over there, as libipt's, its clock and events reset.
    fn flow_sync_after(&mut self, st: &mut FlowState, e: FlowError) -> Result<Stop, Fallback> {
        // (A packet it refuses it has not read past: it searches from one byte on.)
        let held = match e.what {
            BAD_OPC | BAD_PACKET | TRIG_WITH_ICNT => 1,
            _ => self.pkt(e.offset).map_or(0, |(_, n)| n),
        };
        let Some(q) = self.flow_psb_from(e.offset + held) else {
            return Ok(Stop::Done);
        };
        st.clock = st.clock.reset();
        st.cfe_ret = None;
        st.mwait = false;
        st.bound_branch = [None; 2];
        st.tsx_abort = None;
        self.flow_sync_at(st, q, false)
    }

    /// The PSB libipt's `pt_blk_sync_forward` finds with its decoder at `pos`: the first
    /// from 15 bytes before (one the last packet may have cut into), the last of a run of
    /// PSB patterns (its search ends there).
    fn flow_psb_from(&self, pos: usize) -> Option<usize> {
        let q = wire::find_psb(self.trace, pos.saturating_sub(wire::PSB.len() - 1))?;
        Some(self.flow_psb_run_end(q))
    }

    /// The last PSB of the run of PSB patterns at `q`.
    fn flow_psb_run_end(&self, mut q: usize) -> usize {
        while self.trace.get(q + wire::PSB.len()..q + wire::PSB.len() + 2) == Some(&[0x02, 0x82]) {
            q += 2;
        }
        q
    }

    /// The PSB the window's first synchronization is at, the first at or after `q`
    /// (none: the trace ends first). With `--resync-on-error`, one whose PSB+ libipt's
    /// synchronization fails at is its "sync error" there, then the next PSB (as libipt
    /// 2.1.2 does too); without, those go to libipt.
    pub(super) fn flow_first_sync(&mut self, st: &mut FlowState, mut q: usize) -> Option<usize> {
        if !st.resync {
            return Some(q);
        }
        while let Some((at, text)) = self.flow_psb_refused(st, self.flow_psb_run_end(q)) {
            self.flow_gap(at, None, text.to_string());
            self.flow_commit(st);
            q = self.flow_psb_from(at + 1)?;
        }
        Some(q)
    }

    /// Where the PSB+ at `q` holds a packet libipt's packet decoder refuses or trace of
    /// code, where libipt's synchronization there fails and its error.
    fn flow_psb_refused(&self, st: &FlowState, q: usize) -> Option<(usize, &'static str)> {
        let mut p = q + wire::PSB.len();
        let mut fup_at = None;
        while let Some((pkt, size)) = self.pkt(p) {
            match pkt {
                // (Tracing disabled, trace of code right after it, timing packets at most
                // between: libipt's context error at the PSBEND, as the synchronization
                // looks for the events after it.)
                Pkt::Psbend if fup_at.is_none() => {
                    let next = self.pkt(self.flow_past_timing_at(p + size));
                    return matches!(next, Some((Pkt::Tnt { .. } | Pkt::Tip(_), _)))
                        .then_some((p, BAD_CONTEXT));
                }
                Pkt::Psbend | Pkt::Ovf | Pkt::Psb => return None,
                Pkt::Fup(_) => {
                    fup_at = Some(p);
                    p += size;
                }
                Pkt::Other(what) => {
                    let text = refused_text(what)?;
                    // (With erratum BDM70 libipt looks past the PSB+ FUP for a bad
                    // packet: it fails there.)
                    let at = if st.bdm70 { fup_at.unwrap_or(p) } else { p };
                    return Some((at, text));
                }
                // (Trace of code: its context error.)
                Pkt::Tnt { .. } | Pkt::Tip(_) | Pkt::TipPgd(_) | Pkt::TipPge(_) => {
                    return Some((p, BAD_CONTEXT))
                }
                _ => p += size,
            }
        }
        None
    }

    /// A synchronization at the PSB at `q` (after an error; `resync`: where the resync
    /// after it went). Where its PSB+ holds a packet libipt's packet decoder refuses or
    /// trace of code, libipt fails there (ptxed's "sync error" or "resync error": a gap)
    /// and goes on at the next PSB; before the window's first resync (its records still
    /// libipt's to redo), through libipt, before the PSB+ makes any record.
    fn flow_sync_at(
        &mut self,
        st: &mut FlowState,
        mut q: usize,
        resync: bool,
    ) -> Result<Stop, Fallback> {
        st.event_waits = false;
        while let Some((at, text)) = self.flow_psb_refused(st, q) {
            if !(st.resync && st.resynced) {
                return Err("a packet libipt refuses in the PSB+ of a synchronization");
            }
            let text = if resync {
                format!("resync error: {text}")
            } else {
                text.to_string()
            };
            self.flow_gap(at, None, text);
            self.flow_commit(st);
            let Some(next) = self.flow_psb_from(at + 1) else {
                return Ok(Stop::Done);
            };
            q = next;
        }
        st.pos = q;
        st.tnt_n = 0;
        self.pending_timestamp = true;
        self.flow_psb(st, true, None)?;
        Ok(Stop::Segment)
    }

    /// A packet libipt refuses (its error `text`) met by the resync search at `st.pos`:
    /// its resync fails there (ptxed's "resync error"), then it synchronizes forward.
    fn flow_resync_refused(
        &mut self,
        st: &mut FlowState,
        text: &'static str,
    ) -> Result<Stop, Fallback> {
        self.flow_gap(st.pos, None, format!("resync error: {text}"));
        self.flow_commit(st);
        let e = FlowError {
            what: text,
            ip: None,
            offset: st.pos,
            resume: st.pos,
            resync: ResyncFrom::Fails,
        };
        self.flow_sync_after(st, e)
    }

    /// Resumes after error `e` at the first packet from `e.resume` on that gives an IP.
    fn flow_resync(&mut self, st: &mut FlowState, e: FlowError) -> Result<Stop, Fallback> {
        // (The error kept it only where its TIP is not read yet.)
        let waiting = st.async_tip.take();
        if e.resync != ResyncFrom::Search {
            // libipt's decoder stays failed (its status error; at a bad status update
            // its resync at that PSB+, `pt_blk_resync_at_sync`, fails the same way):
            // ptxed's "resync error", then it synchronizes forward, at the next PSB.
            if e.resync == ResyncFrom::FailsAgainAtEnable {
                self.flow_event(st, Record::TraceDisabled { ip: None });
            }
            if matches!(
                e.resync,
                ResyncFrom::FailsAgain | ResyncFrom::FailsAgainAtEnable
            ) {
                self.flow_gap(e.offset, e.ip, e.what.to_string());
            }
            self.flow_gap(e.offset, e.ip, format!("resync error: {}", e.what));
            self.flow_commit(st);
            return self.flow_sync_after(st, e);
        }
        st.pos = e.resume;
        st.tnt_n = 0;
        st.tsx_abort = None;
        // A FUP that MODE.Exec, MODE.TSX or PTW binds to gives the IP by itself.
        let mut bound = Bound::No;
        let mut skip_fup = false;
        // (A FUP bound to nothing with no TIP right after it: libipt's asynchronous
        // branch from its IP, waiting for a TIP past the TNTs the resync ignores.)
        // (One read before the error whose TIP or TIP.PGD the error came before, or at:
        // libipt's resync resumes at that asynchronous branch's event, from the FUP's
        // IP, and a PSB before it fails the resync.)
        let mut from_fup = waiting.map(|a| a.1);
        // (An event read that binds to a FUP only: MODE.TSX, PTW with IP.)
        let mut fup_only = false;
        // (A TRIG with the IP bit read, its FUP not yet: the FUP, bound to it, is passed
        // with it, an event libipt's resync ignores; with none before the TIP, it waits
        // in libipt's queue as a MODE.TSX does.)
        let mut trig = false;
        loop {
            let Some((pkt, size)) = self.pkt(st.pos) else {
                if st.pos >= self.trace.len() {
                    return Ok(Stop::Done);
                }
                return Err("packet cut by the end of the trace");
            };
            match pkt {
                Pkt::Pad | Pkt::Tnt { .. } | Pkt::Psbend => st.pos += size,
                Pkt::Trig(t) if !t.ip => st.pos += size,
                // (With the IP bit but an instruction count other than 0: a packet libipt
                // refuses, as below.)
                Pkt::Trig(t) if t.icnt != Some(0) => {
                    return self.flow_resync_refused(st, BAD_PACKET)
                }
                Pkt::Trig(_) => {
                    trig = true;
                    st.pos += size;
                }
                Pkt::Fup(p) if trig => {
                    st.pos += size;
                    st.last_ip.apply(p);
                    trig = false;
                }
                Pkt::Ptw { ip } => {
                    if ip {
                        bound = Bound::Alone;
                        fup_only = true;
                    }
                    st.pos += size;
                }
                Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_) | Pkt::Cbr(_) => {
                    st.clock.on_timing(pkt, false, st.clock_cfg)?;
                    st.pos += size;
                }
                Pkt::ModeExec { csl, csd, iflag } => {
                    let mode =
                        super::FlowMode::of(csl, csd).ok_or("MODE.Exec with CS.L and CS.D set")?;
                    st.pos += size;
                    if st.take_iflag(iflag) {
                        // (An IF event, with iflags events: its record at the FUP it
                        // binds to, where decoding goes on.)
                        st.iflag_event = Some(iflag);
                        self.blocks.flow.mode = mode;
                        st.mode_known = true;
                        self.blocks.flow.cached_only = false;
                        bound = Bound::Alone;
                    } else if mode == self.blocks.flow.mode {
                        // (One that changes no mode is no event to libipt: the FUP it
                        // binds to is passed with it.)
                        skip_fup = true;
                    } else {
                        // (The mode of the code at the IP it binds to.)
                        self.blocks.flow.mode = mode;
                        st.mode_known = true;
                        self.blocks.flow.cached_only = false;
                        bound = Bound::Alone;
                    }
                }
                Pkt::ModeTsx { abort } => {
                    // (An abort's FUP is the source of the branch a TIP after it gives.)
                    bound = if abort { Bound::Abort } else { Bound::Alone };
                    fup_only = true;
                    st.pos += size;
                }
                Pkt::Tip(_) | Pkt::TipPgd(_) | Pkt::TipPge(_) if st.iflag_event.is_some() => {
                    return Err("an IF event not bound to a FUP after an error")
                }
                // (Without IP, bound to nothing: libipt's resync fails there, an
                // internal error.)
                Pkt::Tip(p) if p.ipc == 0 && from_fup.is_none() && !fup_only => {
                    return self.flow_resync_refused(st, TIP_WITHOUT_IP);
                }
                Pkt::Tip(p) => {
                    st.pos += size;
                    let ip = st.last_ip.apply(p).ok_or("TIP without IP")?;
                    // (libipt's resync leaves a MODE.TSX or PTW waiting for its FUP in its
                    // event decoder's queue.)
                    st.event_waits |= fup_only || trig;
                    if let Some(from) = from_fup {
                        self.flow_event(st, Record::KernelXfer { from, to: Some(ip) });
                    }
                    return self.flow_resume_at(st, ip);
                }
                Pkt::TipPgd(p) => {
                    st.pos += size;
                    st.last_ip.apply(p);
                    // (libipt's resync takes a disable itself, and ptxed says "[disabled]"
                    // without IP; an asynchronous one is its event, at the FUP's IP.)
                    self.flow_event(st, Record::TraceDisabled { ip: from_fup });
                    st.enabled = false;
                    return Ok(Stop::Segment);
                }
                Pkt::TipPge(_) => {
                    // (The TIP.PGE itself enables tracing as usual.)
                    self.flow_event(st, Record::TraceDisabled { ip: None });
                    st.enabled = false;
                    return Ok(Stop::Segment);
                }
                Pkt::Fup(p) if skip_fup && bound == Bound::No => {
                    st.pos += size;
                    st.last_ip.apply(p);
                    skip_fup = false;
                }
                Pkt::Fup(p) => {
                    st.pos += size;
                    let from = st.last_ip.apply(p).ok_or("FUP without IP")?;
                    if (e.what == NOMAP || e.what == BAD_INSN) && e.ip == Some(from) {
                        // (libipt takes an event at the IP before reading its code.)
                        return Err("event at the address without code");
                    }
                    let tip_next =
                        matches!(self.pkt(st.pos), Some((Pkt::Tip(_) | Pkt::TipPgd(_), _)));
                    if bound == Bound::No && !tip_next && from_fup.is_none() {
                        from_fup = Some(from);
                        continue;
                    }
                    if let (Bound::No, false, Some(first)) = (bound, tip_next, from_fup) {
                        return self.flow_resync_two_fups(st, first);
                    }
                    return self.flow_resync_fup(st, from, bound);
                }
                Pkt::Ovf => {
                    // (It drops an asynchronous branch waiting for its TIP.)
                    st.pos += size;
                    st.enabled = true;
                    if let Err(why) = self.flow_ovf(st) {
                        // (An error there, trace of code after it: the resync fails, as
                        // below.)
                        return match st.error.take() {
                            Some(e) => self.flow_resync(st, e),
                            None => Err(why),
                        };
                    }
                    return Ok(Stop::Segment);
                }
                // (Where a FUP waits for its TIP: libipt's context error, as while
                // decoding; it carries no event across a PSB.)
                // (A FUP, or an event read before the error, waiting: libipt carries no
                // event across a PSB.)
                Pkt::Psb if from_fup.is_some() || st.event_waits => {
                    return self.flow_resync_refused(st, BAD_CONTEXT)
                }
                Pkt::Psb => return self.flow_sync_at(st, st.pos, true),
                Pkt::Other(what) => {
                    // (A packet libipt cannot decode: its resync fails there, ptxed's
                    // "resync error", then its synchronization forward.)
                    let Some(text) = refused_text(what) else {
                        return Err(what);
                    };
                    return self.flow_resync_refused(st, text);
                }
                Pkt::Cfe { .. } => return Err("cfe"),
                Pkt::Evd { .. } => return Err("evd"),
                _ => return Err("packet the fast decoder leaves to libipt after an error"),
            }
        }
    }

    /// A second FUP bound to nothing (just read) while the resync search's first waits for
    /// its TIP, no TIP right after it: libipt's event decoder queues a second
    /// asynchronous branch, and its block decoder fails at the next TIP (past TNTs, PADs
    /// and timing packets) with an internal error, its resync there the same way. The
    /// first asynchronous branch (from `from`, the first FUP's IP) to that TIP's target is
    /// the resync's event before that error. Anything else first: beyond the fast decoder.
    fn flow_resync_two_fups(&mut self, st: &mut FlowState, from: u64) -> Result<Stop, Fallback> {
        let mut q = st.pos;
        let to = loop {
            match self.pkt(q) {
                Some((
                    Pkt::Pad | Pkt::Tnt { .. } | Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Cyc(_),
                    size,
                )) => q += size,
                Some((Pkt::Tip(p), _)) => {
                    let mut last = st.last_ip;
                    break last.apply(p);
                }
                _ => return Err("two FUPs without TIP after an error"),
            }
        };
        self.flow_event(st, Record::KernelXfer { from, to });
        let e = FlowError {
            what: TWO_FUPS,
            ip: None,
            offset: q,
            resume: q,
            resync: ResyncFrom::FailsAgain,
        };
        self.flow_resync(st, e)
    }

    /// The resync point is the FUP at `from` (just read): with a TIP or TIP.PGD after it,
    /// an asynchronous branch or disable (as well as the end of the transaction a MODE.TSX
    /// abort before it tells); bound to MODE.Exec, MODE.TSX (no abort) or PTW, the IP
    /// decoding goes on at.
    fn flow_resync_fup(
        &mut self,
        st: &mut FlowState,
        from: u64,
        bound: Bound,
    ) -> Result<Stop, Fallback> {
        if bound == Bound::Alone {
            if let Some(enabled) = st.iflag_event.take() {
                let ip = Some(from);
                self.flow_event(st, Record::InterruptFlag { enabled, ip });
            }
            return self.flow_resume_at(st, from);
        }
        match self.pkt(st.pos) {
            Some((Pkt::Tip(p), size)) => {
                st.pos += size;
                let to = st.last_ip.apply(p).ok_or("FUP+TIP without IP")?;
                self.flow_event(st, Record::KernelXfer { from, to: Some(to) });
                self.flow_resume_at(st, to)
            }
            Some((Pkt::TipPgd(p), size)) => {
                if st.skd022 && self.flow_is_vmentry(from) {
                    return Err("erratum SKD022");
                }
                st.pos += size;
                st.last_ip.apply(p);
                self.flow_event(st, Record::TraceDisabled { ip: Some(from) });
                st.enabled = false;
                Ok(Stop::Segment)
            }
            _ if bound == Bound::Abort => self.flow_resume_at(st, from),
            _ => Err("FUP without TIP after an error"),
        }
    }

    /// Decoding goes on at `ip`, tracing enabled, with no trace pending.
    fn flow_resume_at(&mut self, st: &mut FlowState, ip: u64) -> Result<Stop, Fallback> {
        st.enabled = true;
        st.cur = self.flow_block(ip)?;
        self.flow_commit(st);
        Ok(Stop::Segment)
    }
}
