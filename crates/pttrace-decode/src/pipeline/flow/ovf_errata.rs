//! The overflow errata libipt 2.1.2 works around, read as libipt reads them.
//!
//! - SKD010 (Skylake to Coffee Lake clients): the FUP that resolves an OVF while tracing
//!   is enabled may be lost. libipt looks past an OVF no FUP resolves for a sign that
//!   tracing is in fact enabled (a FUP, a TIP, a PSB+ with a FUP; a TIP.PGD says it was
//!   disabled there) and resumes there ([`Skd010`]).
//! - APL12 (Goldmont): an OVF that resolves while tracing is disabled may still be
//!   followed by a FUP. libipt looks past that FUP for a sign that tracing is disabled
//!   (a TIP.PGE, STOP, or a PSB+ without a FUP) and then resumes after the FUP, disabled.
//! - APL11 (Goldmont to Raptor Lake): an extra TIP.PGD after an OVF; libipt resumes after
//!   it, disabled.
//!
//! Where libipt finds the erratum does not apply, the OVF resolves as on any CPU. What
//! the fast decoder cannot tell goes to libipt.

use super::{Fallback, PtDecoder};
use crate::wire::{IpPayload, LastIp, Pkt};

/// What libipt's look-ahead for erratum SKD010 finds after an OVF no FUP resolves.
pub(super) enum Skd010 {
    /// Tracing disabled, or no way to recover: the OVF resolves as written.
    AsWritten,
    /// Tracing was enabled: libipt resumes at `ip` (the last IP then `last`), the timing
    /// packets up to `silent_until` applied without their events, reading on from
    /// `read_from`.
    Resume {
        ip: u64,
        last: LastIp,
        silent_until: usize,
        read_from: usize,
    },
    /// Tracing was disabled at a TIP.PGD: libipt goes on disabled after it (at `.0`), the
    /// timing packets before it applied without their events.
    DisabledAfter(usize),
    /// What the fast decoder leaves to libipt.
    Unsure,
}

/// What a PSB+ holds, to libipt's search for its FUP.
enum Header {
    Fup(IpPayload),
    NoFup,
    /// The trace ends first (or cuts a packet).
    End,
    /// A packet libipt does not expect there (its search fails).
    Bad,
}

impl PtDecoder<'_> {
    /// SKD010 at an OVF at `pos` (just past it) that no FUP resolves: what libipt's
    /// look-ahead finds.
    pub(super) fn flow_skd010(&self, mut pos: usize) -> Skd010 {
        // (A MODE.TSX: where it lies; a second one says tracing is disabled.)
        let mut tsx: Option<usize> = None;
        let mut last = LastIp::default();
        loop {
            let Some((pkt, size)) = self.pkt(pos) else {
                // (The end of the trace, a packet cut by it: libipt takes it as written.)
                return Skd010::AsWritten;
            };
            let at = pos;
            pos += size;
            match pkt {
                Pkt::TipPge(_) | Pkt::Ovf | Pkt::Stop => return Skd010::AsWritten,
                Pkt::TipPgd(_) if tsx.is_none() => return Skd010::DisabledAfter(pos),
                // (TNT bits: it applies, but libipt cannot recover, so goes on as
                // written.)
                Pkt::Tnt { .. } => return Skd010::AsWritten,
                Pkt::ModeTsx { .. } if tsx.is_some() => return Skd010::AsWritten,
                // (An abort's binds its FUP as a begin's does, for libipt here: not as
                // the fast decoder reads it.)
                Pkt::ModeTsx { abort: true } => return Skd010::Unsure,
                Pkt::ModeTsx { abort: false } => tsx = Some(at),
                // Tracing was enabled: the FUP binds to the MODE.TSX before it, or
                // starts an asynchronous branch (read again); the TIP is read past.
                Pkt::Fup(p) => {
                    let Some(ip) = last.apply(p) else {
                        return Skd010::Unsure;
                    };
                    let read_from = match tsx {
                        None => at,
                        // (The packets between are read again: timing only.)
                        Some(t) if self.flow_only_time_between(t, at) => t,
                        Some(_) => return Skd010::Unsure,
                    };
                    return Skd010::Resume {
                        ip,
                        last,
                        silent_until: read_from,
                        read_from,
                    };
                }
                Pkt::Tip(p) if tsx.is_none() => {
                    let Some(ip) = last.apply(p) else {
                        return Skd010::Unsure;
                    };
                    return Skd010::Resume {
                        ip,
                        last,
                        silent_until: at,
                        read_from: pos,
                    };
                }
                Pkt::Psb if tsx.is_none() => {
                    return match self.flow_header_fup(pos) {
                        Header::NoFup | Header::End => Skd010::AsWritten,
                        Header::Fup(p) => match last.apply(p) {
                            Some(ip) => Skd010::Resume {
                                ip,
                                last,
                                silent_until: at,
                                read_from: at,
                            },
                            None => Skd010::Unsure,
                        },
                        Header::Bad => Skd010::Unsure,
                    }
                }
                // Bound to a FUP after them, a TRIG (libipt's unknown packet): libipt
                // stops looking.
                Pkt::Exstop { ip: true }
                | Pkt::Mwait
                | Pkt::Ptw { ip: true }
                | Pkt::Cfe { ip: true, .. }
                | Pkt::Trig(_) => return Skd010::AsWritten,
                Pkt::Pad
                | Pkt::Mnt
                | Pkt::Power
                | Pkt::Evd { .. }
                | Pkt::Exstop { ip: false }
                | Pkt::Ptw { ip: false }
                | Pkt::Cfe { ip: false, .. }
                | Pkt::Pip
                | Pkt::Vmcs
                | Pkt::ModeExec { .. }
                | Pkt::Tsc(_)
                | Pkt::Cbr(_)
                | Pkt::Tma { .. }
                | Pkt::Mtc(_)
                | Pkt::Cyc(_) => {}
                _ => return Skd010::Unsure,
            }
        }
    }

    /// Whether the packets from `from` up to `to` are PADs and timing packets without
    /// events (no CBR).
    fn flow_only_time_between(&self, mut from: usize, to: usize) -> bool {
        // (Past the MODE.TSX at `from`.)
        let mut first = true;
        while from < to {
            let Some((pkt, size)) = self.pkt(from) else {
                return false;
            };
            if !first
                && !matches!(
                    pkt,
                    Pkt::Pad | Pkt::Tsc(_) | Pkt::Mtc(_) | Pkt::Tma { .. } | Pkt::Cyc(_)
                )
            {
                return false;
            }
            first = false;
            from += size;
        }
        true
    }

    /// APL12 at the FUP that resolves an OVF, `pos` just past that FUP: whether libipt
    /// finds tracing disabled after all.
    pub(super) fn flow_apl12_applies(&self, mut pos: usize) -> Result<bool, Fallback> {
        const BAD: Fallback = "erratum APL12: libipt's look-ahead fails";
        loop {
            // (The end of the trace, a packet cut by it: as written.)
            let Some((pkt, size)) = self.pkt(pos) else {
                return Ok(false);
            };
            pos += size;
            // (Ok(true): the erratum applies, libipt's recovery; Ok(false): as written.)
            return match pkt {
                Pkt::Tnt { .. }
                | Pkt::Tip(_)
                | Pkt::TipPgd(_)
                | Pkt::Psbend
                | Pkt::Ovf
                | Pkt::Trig(_) => Ok(false),
                Pkt::Stop | Pkt::TipPge(_) => Ok(true),
                Pkt::Psb => match self.flow_header_fup(pos) {
                    Header::Fup(_) | Header::End => Ok(false),
                    Header::NoFup => Ok(true),
                    Header::Bad => Err(BAD),
                },
                Pkt::Pad
                | Pkt::Fup(_)
                | Pkt::Tsc(_)
                | Pkt::Cbr(_)
                | Pkt::Tma { .. }
                | Pkt::Mtc(_)
                | Pkt::Cyc(_)
                | Pkt::Exstop { .. }
                | Pkt::Mwait
                | Pkt::Power
                | Pkt::Ptw { .. }
                | Pkt::Mnt
                | Pkt::Pip
                | Pkt::Vmcs
                | Pkt::ModeExec { .. }
                | Pkt::ModeTsx { .. }
                | Pkt::Cfe { .. }
                | Pkt::Evd { .. } => continue,
                _ => Err(BAD),
            };
        }
    }

    /// What libipt's search for the FUP of the PSB+ whose first packet after the PSB is
    /// at `pos` finds.
    fn flow_header_fup(&self, mut pos: usize) -> Header {
        loop {
            // (A packet cut by the end: the end, to libipt.)
            let Some((pkt, size)) = self.pkt(pos) else {
                return Header::End;
            };
            pos += size;
            match pkt {
                Pkt::Fup(p) => return Header::Fup(p),
                Pkt::Psbend | Pkt::Ovf => return Header::NoFup,
                // (SKZ84's corrupted TMA: passed over, as libipt's search does.)
                Pkt::Invalid => {}
                p if super::passed_in_psb(p) => {}
                _ => return Header::Bad,
            }
        }
    }
}
