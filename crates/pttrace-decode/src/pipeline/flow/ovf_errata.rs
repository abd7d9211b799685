//! The overflow errata libipt 2.1.2 works around, and whether one would change how an
//! OVF resolves. Where it would not, the fast decoder resolves the OVF itself; where it
//! would, or where it cannot tell, the window goes to libipt.
//!
//! - SKD010 (Skylake to Coffee Lake clients): the FUP that resolves an OVF while tracing
//!   is enabled may be lost. libipt then looks past the OVF for a sign that tracing is
//!   in fact enabled (a FUP, TIP, TIP.PGD, TNT, or a PSB+ with a FUP) and resumes there.
//! - APL12 (Goldmont): an OVF that resolves while tracing is disabled may still be
//!   followed by a FUP. libipt looks past that FUP for a sign that tracing is disabled
//!   (a TIP.PGE, STOP, or a PSB+ without a FUP) and then drops it.
//! - APL11 (Goldmont to Raptor Lake): an extra TIP.PGD after an OVF. libipt handles it
//!   where its search for the OVF's FUP meets a packet that needs tracing enabled, which
//!   the fast decoder leaves to libipt in any case.

use super::PtDecoder;
use crate::wire::{self, Pkt};

/// What libipt's look-ahead concludes.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// The trace is as written: the OVF resolves as usual.
    AsWritten,
    /// The erratum applies, or libipt's search fails: libipt's own recovery.
    Applies,
}

/// What a PSB+ holds, to libipt's search for its FUP.
enum Header {
    Fup,
    NoFup,
    /// The trace ends first.
    End,
    /// A packet libipt does not expect there (its search fails).
    Bad,
}

impl PtDecoder<'_> {
    /// SKD010 at an OVF at `pos` (just past it) that no FUP resolves: whether libipt finds
    /// tracing enabled after all.
    pub(super) fn flow_skd010_applies(&self, mut pos: usize) -> bool {
        let mut tsx = false;
        loop {
            let Some((pkt, size)) = wire::parse(self.trace, pos) else {
                // (The end of the trace: libipt takes it as written.)
                return pos < self.trace.len();
            };
            pos += size;
            let seen = match pkt {
                Pkt::TipPge(_) | Pkt::Ovf | Pkt::Stop => Seen::AsWritten,
                Pkt::TipPgd(_) | Pkt::Fup(_) | Pkt::Tip(_) | Pkt::Psbend => Seen::Applies,
                // (TNT bits: applies, but libipt cannot recover, so goes on as written.)
                Pkt::Tnt { .. } => Seen::AsWritten,
                Pkt::ModeTsx { .. } if tsx => Seen::AsWritten,
                Pkt::ModeTsx { .. } => {
                    tsx = true;
                    continue;
                }
                Pkt::Psb => match self.flow_header_fup(pos) {
                    Header::NoFup | Header::End => Seen::AsWritten,
                    Header::Fup | Header::Bad => Seen::Applies,
                },
                // Bound to a FUP after them, a TRIG (libipt's unknown packet): libipt
                // stops looking.
                Pkt::Exstop { ip: true }
                | Pkt::Mwait
                | Pkt::Ptw { ip: true }
                | Pkt::Cfe { ip: true, .. }
                | Pkt::Trig(_) => Seen::AsWritten,
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
                | Pkt::Cyc(_) => continue,
                _ => Seen::Applies,
            };
            return seen == Seen::Applies;
        }
    }

    /// APL12 at the FUP that resolves an OVF, `pos` just past that FUP: whether libipt
    /// finds tracing disabled after all.
    pub(super) fn flow_apl12_applies(&self, mut pos: usize) -> bool {
        loop {
            let Some((pkt, size)) = wire::parse(self.trace, pos) else {
                return pos < self.trace.len();
            };
            pos += size;
            let seen = match pkt {
                Pkt::Tnt { .. }
                | Pkt::Tip(_)
                | Pkt::TipPgd(_)
                | Pkt::Psbend
                | Pkt::Ovf
                | Pkt::Trig(_) => Seen::AsWritten,
                Pkt::Stop | Pkt::TipPge(_) => Seen::Applies,
                Pkt::Psb => match self.flow_header_fup(pos) {
                    Header::Fup | Header::End => Seen::AsWritten,
                    Header::NoFup | Header::Bad => Seen::Applies,
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
                _ => Seen::Applies,
            };
            return seen == Seen::Applies;
        }
    }

    /// What libipt's search for the FUP of the PSB+ whose first packet after the PSB is
    /// at `pos` finds.
    fn flow_header_fup(&self, mut pos: usize) -> Header {
        loop {
            let Some((pkt, size)) = wire::parse(self.trace, pos) else {
                return if pos >= self.trace.len() {
                    Header::End
                } else {
                    Header::Bad
                };
            };
            pos += size;
            match pkt {
                Pkt::Fup(_) => return Header::Fup,
                Pkt::Psbend | Pkt::Ovf => return Header::NoFup,
                Pkt::ModeExec { .. }
                | Pkt::ModeTsx { .. }
                | Pkt::Pip
                | Pkt::Vmcs
                | Pkt::Mnt
                | Pkt::Tsc(_)
                | Pkt::Cbr(_)
                | Pkt::Tma { .. }
                | Pkt::Mtc(_)
                | Pkt::Cyc(_)
                | Pkt::Pad => {}
                _ => return Header::Bad,
            }
        }
    }
}
