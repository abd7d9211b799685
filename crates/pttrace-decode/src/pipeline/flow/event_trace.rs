//! Event trace (Intel SDM, "Event Trace"): CFE packets name a control-flow event, EVD
//! packets before a CFE carry its data. None makes a record; what matters is how each
//! binds to the flow, as libipt 2.1.2 reads it (its event decoder, then its block
//! decoder):
//!
//! - An EVD is the data of the CFE after it: a CR2 that of an interrupt, a VMX exit
//!   qualification or reason that of a VM exit. Other types are ignored.
//! - While tracing is enabled, a CFE without IP of an interrupt, SMI, RSM, SIPI, INIT,
//!   VM exit or user interrupt is the event of the FUP after it: that FUP and its TIP or
//!   TIP.PGD are the asynchronous branch, read as usual.
//! - A CFE of an IRET, a VM entry or a UIRET binds to the next such instruction (with the
//!   IP bit, to the one at the IP of the FUP after it): its TIP or TIP.PGD is that
//!   instruction's target.
//! - A shutdown's CFE without IP, any CFE without IP while tracing is disabled: an event
//!   of its own (its time only). A CFE of a type libipt 2.1.2 does not know (SWINTR,
//!   newer ones) is ignored.
//!
//! What else a CFE can be (the IP bit on other events, an EVD or CFE where libipt finds
//! none expected) the fast decoder leaves to libipt.

use iced_x86::Mnemonic;

use super::{FBlock, Fallback, FlowState, PtDecoder};
use crate::wire::Pkt;

/// A CFE of an IRET (2), a VM entry (7) or a UIRET (13) waiting for its instruction (at
/// `at`, when the CFE has the IP bit).
#[derive(Clone, Copy, Debug)]
pub(super) struct CfeRet {
    ty: u8,
    at: Option<u64>,
}

/// CFE types libipt 2.1.2 knows.
const INTR: u8 = 1;
const IRET: u8 = 2;
const SMI: u8 = 3;
const RSM: u8 = 4;
const SIPI: u8 = 5;
const INIT: u8 = 6;
const VMENTRY: u8 = 7;
const VMEXIT: u8 = 8;
const VMEXIT_INTR: u8 = 9;
const SHUTDOWN: u8 = 10;
const UINTR: u8 = 12;
const UIRET: u8 = 13;

/// Whether libipt 2.1.2 passes `pkt` over as if it were not there: an EVD of a type it
/// does not know, a CFE of such a type without IP.
pub(super) fn ignored(pkt: Pkt) -> bool {
    match pkt {
        Pkt::Evd { ty } => ty > 2,
        Pkt::Cfe { ty, ip } => !ip && !known(ty),
        _ => false,
    }
}

fn known(ty: u8) -> bool {
    matches!(
        ty,
        INTR | IRET
            | SMI
            | RSM
            | SIPI
            | INIT
            | VMENTRY
            | VMEXIT
            | VMEXIT_INTR
            | SHUTDOWN
            | UINTR
            | UIRET
    )
}

/// The event an EVD run expects its CFE to be.
#[derive(PartialEq, Eq)]
enum Expected {
    Interrupt,
    VmExit { qualification: bool, reason: bool },
}

impl PtDecoder<'_> {
    /// An EVD of type `ty`, `pos` just past it: whether the EVDs after it and the CFE
    /// they lead to are what libipt expects (else the window goes to libipt).
    pub(super) fn flow_evds(&self, ty: u8, mut pos: usize) -> Result<(), Fallback> {
        let bad = Err("EVD not followed by the CFE of its event");
        let mut expected: Option<Expected> = None;
        let mut ty = ty;
        loop {
            match (ty, &mut expected) {
                (0, None) => expected = Some(Expected::Interrupt),
                (1 | 2, None) => {
                    expected = Some(Expected::VmExit {
                        qualification: ty == 1,
                        reason: ty == 2,
                    })
                }
                (1, Some(Expected::VmExit { qualification, .. })) if !*qualification => {
                    *qualification = true
                }
                (2, Some(Expected::VmExit { reason, .. })) if !*reason => *reason = true,
                (0..=2, Some(_)) => return bad,
                // (Other types: ignored.)
                _ => {}
            }
            match self.pkt(pos) {
                Some((Pkt::Evd { ty: next }, size)) => {
                    ty = next;
                    pos += size;
                }
                Some((Pkt::Cfe { ty: c, .. }, _)) => {
                    return match expected {
                        None => Ok(()),
                        Some(Expected::Interrupt) if c == INTR => Ok(()),
                        Some(Expected::VmExit { .. }) if matches!(c, VMEXIT | VMEXIT_INTR) => {
                            Ok(())
                        }
                        Some(_) => bad,
                    };
                }
                _ if expected.is_none() => return Ok(()),
                _ => return bad,
            }
        }
    }

    /// A CFE of type `ty` (`ip`: its IP bit) just read.
    pub(super) fn flow_cfe(
        &mut self,
        st: &mut FlowState,
        ty: u8,
        ip: bool,
    ) -> Result<(), Fallback> {
        if st.cfe_ret.is_some() {
            return Err("CFE while an IRET CFE waits for its instruction");
        }
        if !known(ty) {
            // (libipt 2.1.2 ignores other types, but takes the IP bit's FUP as theirs.)
            return if ip {
                Err("CFE of a type libipt 2.1.2 does not know, with IP")
            } else {
                Ok(())
            };
        }
        if !st.enabled || (ty == SHUTDOWN && !ip) {
            if ip {
                return Err("CFE with IP while tracing is disabled");
            }
            // An event of its own.
            self.flow_quiet_event(st);
            return Ok(());
        }
        match (ty, ip) {
            (IRET | VMENTRY | UIRET, false) => {
                st.cfe_ret = Some(CfeRet { ty, at: None });
                Ok(())
            }
            (IRET | VMENTRY | UIRET, true) => {
                // (PADs and timing packets before that FUP, as real hardware writes.)
                let end = "CFE at the end of the trace";
                let at = Self::flow_bound_fup(self.trace, st, end, "CFE not followed by its FUP")?;
                st.cfe_ret = Some(CfeRet { ty, at: Some(at) });
                Ok(())
            }
            (_, false) => {
                // The event of the asynchronous branch the FUP after it starts (PADs and
                // timing packets between, read as usual).
                let mut p = st.pos;
                loop {
                    match self.pkt(p) {
                        Some((
                            Pkt::Pad
                            | Pkt::Tsc(_)
                            | Pkt::Mtc(_)
                            | Pkt::Tma { .. }
                            | Pkt::Cyc(_)
                            | Pkt::Cbr(_),
                            size,
                        )) => p += size,
                        Some((Pkt::Fup(_), _)) => {
                            st.cfe_fup = true;
                            return Ok(());
                        }
                        _ => return Err("CFE not followed by its FUP"),
                    }
                }
            }
            (_, true) => Err("CFE with IP of an asynchronous event"),
        }
    }

    /// The TIP after the IRET CFE waiting in `st` resolves block `b`'s branch: it must be
    /// that CFE's instruction.
    #[cold]
    #[inline(never)]
    pub(super) fn flow_cfe_ret_tip(&self, st: &mut FlowState, b: FBlock) -> Result<(), Fallback> {
        match st.cfe_ret.take() {
            Some(c) if !self.flow_cfe_ret_at(b, c) => {
                Err("IRET CFE at a branch that is no far return")
            }
            _ => Ok(()),
        }
    }

    /// Whether block `b` (whose branch the TIP or TIP.PGD after CFE `c` resolves) ends with
    /// the instruction `c` binds to: an IRET (or ERETU, ERETS: beyond libipt 2.1.2, which
    /// decodes them as no branch), a VMLAUNCH or VMRESUME, a UIRET; at the CFE's IP.
    pub(super) fn flow_cfe_ret_at(&self, b: FBlock, c: CfeRet) -> bool {
        let Some(insn) = self.flow_last_insn(b) else {
            return false;
        };
        if c.at.is_some_and(|at| at != insn.pc) {
            return false;
        }
        let m = self.flow_mnemonic(insn.pc);
        match c.ty {
            IRET => matches!(
                m,
                Some(
                    Mnemonic::Iret
                        | Mnemonic::Iretd
                        | Mnemonic::Iretq
                        | Mnemonic::Eretu
                        | Mnemonic::Erets
                )
            ),
            VMENTRY => matches!(m, Some(Mnemonic::Vmlaunch | Mnemonic::Vmresume)),
            _ => m == Some(Mnemonic::Uiret),
        }
    }
}
