//! Intel PT packets as they lie in the trace (Intel SDM vol. 3C, "Trace Packets"): our own
//! parser for the packets the fast flow decoder ([`crate::pipeline`]'s `flow` engine)
//! reads itself. Everything it does not handle comes back as [`Pkt::Other`] with the
//! packet's name; the flow engine then hands the window to libipt.

/// One packet, decoded. IP packets carry their raw compression and payload; the caller
/// applies them to its last IP ([`LastIp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pkt {
    Pad,
    /// `n` (1..=47) branch outcomes in `bits`, the oldest in bit `n - 1`.
    Tnt {
        bits: u64,
        n: u32,
    },
    Tip(IpPayload),
    TipPge(IpPayload),
    TipPgd(IpPayload),
    Fup(IpPayload),
    Tsc(u64),
    /// MODE.Exec: CS.L, CS.D and the interrupt flag.
    ModeExec {
        csl: bool,
        csd: bool,
        iflag: bool,
    },
    Psb,
    Psbend,
    /// CBR: the core:bus ratio (never 0: that is an error to libipt).
    Cbr(u8),
    /// CYC: core clock cycles since the last CYC-eligible packet (cycle-accurate mode).
    Cyc(u64),
    /// MTC: bits `mtc_freq..mtc_freq + 8` of the crystal clock (CTC).
    Mtc(u8),
    /// TMA: the CTC's low 16 bits and the fast counter at the preceding TSC.
    Tma {
        ctc: u16,
        fc: u16,
    },
    /// TRIG (trigger report): carries no control flow.
    Trig(Trig),
    /// OVF: the processor's internal buffers overflowed.
    Ovf,
    /// CFE (event trace): the event's type, and whether a FUP gives its IP.
    Cfe {
        ty: u8,
        ip: bool,
    },
    /// EVD (event trace): data of the next CFE's event, of type `ty` (0: CR2, 1: VMX
    /// exit qualification, 2: VMX exit reason).
    Evd {
        ty: u8,
    },
    /// MODE.TSX: a transaction begins or commits (`abort` false: the FUP after it gives
    /// where), or aborts (the FUP after it is the source of the branch to the handler).
    ModeTsx {
        abort: bool,
    },
    /// PWRE or PWRX (power event trace): a C-state entered or left; no control flow.
    Power,
    /// EXSTOP (power event trace): execution stopped; with `ip`, the FUP after it gives
    /// where.
    Exstop {
        ip: bool,
    },
    /// MWAIT (power event trace): the hints of an MWAIT, whose EXSTOP follows.
    Mwait,
    /// PTW: the operand of a PTWRITE; with `ip`, the FUP after it gives the PTWRITE's IP
    /// (else it binds to the next PTWRITE the code runs).
    Ptw {
        ip: bool,
    },
    /// MNT: a maintenance packet (model-specific payload); no control flow.
    Mnt,
    /// STOP (TraceStop): tracing stopped at a stop range or by the configuration.
    Stop,
    /// PIP: a CR3 change (MOV CR3, a far transfer, a VM entry or exit).
    Pip,
    /// VMCS: a VMCS pointer change (VMPTRLD, a VM entry or exit).
    Vmcs,
    /// A TMA with reserved bits set: an error to libipt, but on CPUs with erratum SKZ84
    /// (TSC offsetting or scaling in a VMX guest) a corrupted TMA and the bogus byte after
    /// it ([`parse_with`]).
    TmaReserved,
    /// What libipt's packet decoder reads as an invalid packet and its event decoder
    /// passes over: SKZ84's corrupted TMA, 8 bytes ([`parse_with`] only).
    Invalid,
    /// Any other packet (or a reserved encoding): its name.
    Other(&'static str),
}

/// The CPU errata that change how libipt's packet decoder reads the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WireErrata {
    /// SKD007: an OVF may overwrite the second byte of a 2-byte CYC.
    pub skd007: bool,
    /// SKZ84: a TMA may be corrupted and followed by a bogus byte.
    pub skz84: bool,
}

/// What a TMA with reserved bits is to libipt without erratum SKZ84.
pub(crate) const TMA_RESERVED: &str = "tma with reserved bits set";

/// The packet at `pos` as libipt's packet decoder reads it on a CPU with errata `e`:
/// [`parse`], but SKZ84's corrupted TMA is an [`Pkt::Invalid`] of 8 bytes (else
/// [`Pkt::Other`]), and under SKD007 a 2-byte CYC whose second byte is OVF's first
/// (`02`) with OVF's second (`f3`) after it is the OVF (its 3 bytes: the CYC's first
/// lost; libipt reports the OVF 1 byte in).
#[inline]
pub(crate) fn parse_with(t: &[u8], pos: usize, e: WireErrata) -> Option<(Pkt, usize)> {
    match parse(t, pos) {
        Some((Pkt::TmaReserved, n)) => Some(if e.skz84 {
            (Pkt::Invalid, n + 1)
        } else {
            (Pkt::Other(TMA_RESERVED), n)
        }),
        Some((Pkt::Cyc(v), 2)) if e.skd007 && skd007_ovf(t, pos, v) => Some((Pkt::Ovf, 3)),
        r => r,
    }
}

/// Whether the 2-byte CYC of value `v` at `pos` is an OVF under erratum SKD007 (libipt's
/// test: the CYC's payload bits 5 up are 1, the next byte is OVF's second).
#[inline]
pub(crate) fn skd007_ovf(t: &[u8], pos: usize, v: u64) -> bool {
    v >> 5 == 1 && t.get(pos + 2) == Some(&0xf3)
}

/// The IP payload of a TIP/TIP.PGE/TIP.PGD/FUP: IPBytes (0..=7) and the payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpPayload {
    pub ipc: u8,
    pub raw: u64,
}

/// A TRIG packet's fields (Intel SDM: opcode 0xD9; payload byte 1: IP bit 7, ICNTV bit 6,
/// MULT bit 5; byte 2: TRBV; then, when ICNTV is set, ICNT as 2 bytes little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trig {
    /// Which triggers fired (a bit each).
    pub trbv: u8,
    /// Instructions since the last IP packet (when ICNTV is set).
    pub icnt: Option<u16>,
    /// A FUP follows that gives the IP the trigger is attributed to.
    pub ip: bool,
    /// More triggers fired than TRBV reports.
    pub mult: bool,
}

/// TRIG's opcode (libipt 2.1.2 does not know it; see [`parse_trig`]).
pub(crate) const TRIG_OPCODE: u8 = 0xd9;

/// The TRIG packet at the start of `t` and its size (3, or 5 with ICNT); `None` when `t`
/// does not start with TRIG's opcode or ends inside the packet. The one definition of
/// TRIG's layout: our packet parser and the size we teach libipt both use it.
pub(crate) fn parse_trig(t: &[u8]) -> Option<(Trig, usize)> {
    let (&op, rest) = t.split_first()?;
    if op != TRIG_OPCODE {
        return None;
    }
    let (&flags, &trbv) = (rest.first()?, rest.get(1)?);
    let icntv = flags & 0x40 != 0;
    let icnt = if icntv {
        Some(u16::from_le_bytes([*rest.get(2)?, *rest.get(3)?]))
    } else {
        None
    };
    let trig = Trig {
        trbv,
        icnt,
        ip: flags & 0x80 != 0,
        mult: flags & 0x20 != 0,
    };
    Some((trig, if icntv { 5 } else { 3 }))
}

/// The 16 bytes of a PSB packet.
pub(crate) const PSB: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];

#[inline]
fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// A TIP packet with an IP at `pos` followed by at least 8 bytes of trace, as [`parse`]
/// reads it: its payload and size; `None` for anything else (then [`parse`] it). The
/// common case of an indirect branch's or a return's target, read in one step.
#[inline(always)]
pub(crate) fn tip_at(t: &[u8], pos: usize) -> Option<(IpPayload, usize)> {
    let w = t.get(pos..pos + 9)?;
    let b0 = *w.first()?;
    if b0 & 0x1f != 0x0d {
        return None;
    }
    let ipc = b0 >> 5;
    let len = ip_bytes(ipc).filter(|&n| n > 0)?;
    let mut b = [0u8; 8];
    b.copy_from_slice(w.get(1..9)?);
    Some((
        IpPayload {
            ipc,
            raw: masked(u64::from_le_bytes(b), len),
        },
        1 + len,
    ))
}

/// The payload bytes of an IP packet of IPBytes `ipc`; `None`: reserved.
#[inline(always)]
fn ip_bytes(ipc: u8) -> Option<usize> {
    match ipc {
        0 => Some(0),
        1 => Some(2),
        2 => Some(4),
        3 | 4 => Some(6),
        6 => Some(8),
        _ => None,
    }
}

/// The low `len` bytes (at most 8) of `v`.
#[inline(always)]
fn masked(v: u64, len: usize) -> u64 {
    v & u64::MAX.checked_shr(64 - 8 * len as u32).unwrap_or(0)
}

/// The packet at `pos` and its size; `None` when the buffer ends inside it (or at `pos`).
#[inline]
pub(crate) fn parse(t: &[u8], pos: usize) -> Option<(Pkt, usize)> {
    let b0 = *t.get(pos)?;
    if b0 & 1 == 0 {
        return match b0 {
            0x00 => Some((Pkt::Pad, 1)),
            0x02 => parse_ext(t, pos),
            _ => {
                // Short TNT: the highest set bit stops the outcomes below it (bit 0 is 0).
                let stop = 7 - b0.leading_zeros();
                let n = stop - 1;
                Some((
                    Pkt::Tnt {
                        bits: u64::from(b0 >> 1) & ((1 << n) - 1),
                        n,
                    },
                    1,
                ))
            }
        };
    }
    match b0 & 0x1f {
        0x0d | 0x11 | 0x01 | 0x1d => {
            let ipc = b0 >> 5;
            let Some(len) = ip_bytes(ipc) else {
                return Some((Pkt::Other("ip packet with reserved IPBytes"), 1));
            };
            let raw = match t.get(pos + 1..pos + 9) {
                // Eight bytes there (all but the trace's last bytes): one load, masked.
                Some(w) => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(w);
                    masked(u64::from_le_bytes(b), len)
                }
                _ => le(t.get(pos + 1..pos + 1 + len)?),
            };
            let p = IpPayload { ipc, raw };
            let pkt = match b0 & 0x1f {
                0x0d => Pkt::Tip(p),
                0x11 => Pkt::TipPge(p),
                0x01 => Pkt::TipPgd(p),
                _ => Pkt::Fup(p),
            };
            return Some((pkt, 1 + len));
        }
        _ => {}
    }
    match b0 {
        0x19 => Some((Pkt::Tsc(le(t.get(pos + 1..pos + 8)?)), 8)),
        0x99 => {
            let m = *t.get(pos + 1)?;
            match m >> 5 {
                0 => Some((
                    Pkt::ModeExec {
                        csl: m & 1 != 0,
                        csd: m & 2 != 0,
                        iflag: m & 4 != 0,
                    },
                    2,
                )),
                1 => Some((Pkt::ModeTsx { abort: m & 2 != 0 }, 2)),
                _ => Some((Pkt::Other("mode (reserved leaf)"), 2)),
            }
        }
        0x59 => Some((Pkt::Mtc(*t.get(pos + 1)?), 2)),
        TRIG_OPCODE => parse_trig(t.get(pos..)?).map(|(trig, n)| (Pkt::Trig(trig), n)),
        _ if b0 & 3 == 3 => parse_cyc(t, pos),
        _ => Some((Pkt::Other("unknown opcode"), 1)),
    }
}

/// A CYC packet (libipt's `pt_pkt_read_cyc`): the first byte holds 5 payload bits (from
/// bit 3) and, in bit 2, whether a byte follows; each following byte 7 more (from bit 1),
/// and in bit 0 whether another follows. A payload longer than 64 bits is an error to
/// libipt ([`Pkt::Other`]).
fn parse_cyc(t: &[u8], pos: usize) -> Option<(Pkt, usize)> {
    let b0 = *t.get(pos)?;
    let mut value = u64::from(b0 >> 3);
    let mut ext = b0 & 4 != 0;
    let mut shl = 5u32;
    let mut p = pos + 1;
    while ext {
        let b = *t.get(p)?;
        p += 1;
        ext = b & 1 != 0;
        let bits = u64::from(b >> 1) << shl;
        shl += 7;
        if shl > 64 {
            return Some((Pkt::Other("cyc payload over 64 bits"), p - pos));
        }
        value |= bits;
    }
    Some((Pkt::Cyc(value), p - pos))
}

#[cold]
fn parse_ext(t: &[u8], pos: usize) -> Option<(Pkt, usize)> {
    let b1 = *t.get(pos + 1)?;
    match b1 {
        0xa3 => {
            let payload = le(t.get(pos + 2..pos + 8)?);
            if payload == 0 {
                return Some((Pkt::Other("tnt.64 without stop bit"), 8));
            }
            let stop = 63 - payload.leading_zeros();
            Some((
                Pkt::Tnt {
                    bits: payload & ((1u64 << stop) - 1),
                    n: stop,
                },
                8,
            ))
        }
        0x82 => (t.get(pos..pos + 16)? == PSB)
            .then_some((Pkt::Psb, 16))
            .or(Some((Pkt::Other("broken psb"), 2))),
        0x23 => Some((Pkt::Psbend, 2)),
        0x03 => {
            let b = t.get(pos..pos + 4)?;
            // (A ratio of 0 is an error to libipt.)
            if b[2] == 0 {
                return Some((Pkt::Other("cbr with ratio 0"), 4));
            }
            Some((Pkt::Cbr(b[2]), 4))
        }
        0x73 => {
            // TMA: CTC (2 bytes), a reserved zero byte, FC (9 bits in 2 bytes).
            let b = t.get(pos..pos + 7)?;
            let ctc = u16::from_le_bytes([b[2], b[3]]);
            let fc = u16::from_le_bytes([b[5], b[6]]);
            if b[4] != 0 || fc > 0x1ff {
                return Some((Pkt::TmaReserved, 7));
            }
            Some((Pkt::Tma { ctc, fc }, 7))
        }
        0xf3 => Some((Pkt::Ovf, 2)),
        // PIP (CR3 and the NR bit in 6 bytes), VMCS (the VMCS base in 5 bytes).
        0x43 => t.get(pos..pos + 8).map(|_| (Pkt::Pip, 8)),
        0xc8 => t.get(pos..pos + 7).map(|_| (Pkt::Vmcs, 7)),
        // CFE: byte 2 holds IP (bit 7) and the type (bits 4:0); byte 3 the vector.
        0x13 => t.get(pos..pos + 4).map(|b| {
            let cfe = Pkt::Cfe {
                ty: b[2] & 0x1f,
                ip: b[2] & 0x80 != 0,
            };
            (cfe, 4)
        }),
        0x53 => t
            .get(pos..pos + 11)
            .map(|b| (Pkt::Evd { ty: b[2] & 0x3f }, 11)),
        // PWRE (2 payload bytes), PWRX (5), EXSTOP (bit 7: IP), MWAIT (hints, extensions:
        // 4 bytes each).
        0x22 => t.get(pos..pos + 4).map(|_| (Pkt::Power, 4)),
        0xa2 => t.get(pos..pos + 7).map(|_| (Pkt::Power, 7)),
        0x62 => Some((Pkt::Exstop { ip: false }, 2)),
        0xe2 => Some((Pkt::Exstop { ip: true }, 2)),
        0xc2 => t.get(pos..pos + 10).map(|_| (Pkt::Mwait, 10)),
        // MNT (0x88 after the opcode, 8 payload bytes), STOP.
        0xc3 => match *t.get(pos + 2)? {
            0x88 => t.get(pos..pos + 11).map(|_| (Pkt::Mnt, 11)),
            _ => Some((Pkt::Other("extended packet"), 2)),
        },
        0x83 => Some((Pkt::Stop, 2)),
        // PTW: bits 6:5 the payload's size (4 or 8 bytes; others reserved), bit 7 IP.
        b if b & 0x1f == 0x12 => {
            let payload = match (b >> 5) & 3 {
                0 => 4,
                1 => 8,
                _ => return Some((Pkt::Other("ptw with a reserved payload size"), 2)),
            };
            t.get(pos..pos + 2 + payload)
                .map(|_| (Pkt::Ptw { ip: b & 0x80 != 0 }, 2 + payload))
        }
        _ => Some((Pkt::Other("extended packet"), 2)),
    }
}

/// The offset of the first PSB at or after `from`.
pub(crate) fn find_psb(t: &[u8], from: usize) -> Option<usize> {
    let hay = t.get(from..)?;
    hay.windows(PSB.len())
        .position(|w| w == PSB)
        .map(|k| from + k)
}

/// Whether every packet of `trace` from its first PSB is one this parser reads and every
/// MODE.Exec says 64-bit (CS.L): what [`crate::ipt::only_64bit`] asks of libipt's packet
/// decoder, at a fraction of its cost (its decoder is called once per packet). Where
/// this parser does not read a packet it says `false`, so it never says `true` where
/// libipt's reading does not (`false` only costs the sharing it decides).
pub(crate) fn only_64bit(t: &[u8]) -> bool {
    let Some(mut p) = find_psb(t, 0) else {
        return true; // nothing decoded
    };
    loop {
        match parse(t, p) {
            // (The end, or a packet cut by it: libipt's end of the trace.)
            None => return true,
            Some((Pkt::ModeExec { csl: false, .. }, _)) => return false,
            Some((Pkt::Other(_) | Pkt::TmaReserved | Pkt::Invalid, _) | (_, 0)) => return false,
            Some((_, n)) => p += n,
        }
    }
}

/// The last-IP register IP packets are compressed against (libipt's `pt_last_ip`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LastIp {
    ip: u64,
}

impl LastIp {
    /// Applies `p`; the IP it gives, `None` when suppressed (IPBytes 0).
    #[inline]
    pub fn apply(&mut self, p: IpPayload) -> Option<u64> {
        const M16: u64 = 0xffff;
        const M32: u64 = 0xffff_ffff;
        const M48: u64 = 0xffff_ffff_ffff;
        self.ip = match p.ipc {
            0 => return None,
            1 => (self.ip & !M16) | (p.raw & M16),
            2 => (self.ip & !M32) | (p.raw & M32),
            3 => (((p.raw & M48) << 16) as i64 >> 16) as u64,
            4 => (self.ip & !M48) | (p.raw & M48),
            _ => p.raw,
        };
        Some(self.ip)
    }

    pub fn reset(&mut self) {
        *self = LastIp::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::PtWriter;

    /// Whether only 64-bit code is traced, as this parser reads it, against libipt's
    /// packet decoder: the same on clean traces (64-bit, a 32-bit MODE.Exec, none), and
    /// on 3,000 mutants never `true` where libipt's says `false` (and mostly the same).
    #[test]
    fn only_64bit_never_says_more_than_libipts_reading() {
        use crate::testgen::{mutate, LoopProgram, XorShift};
        let prog = LoopProgram::new(0x40_0000);
        let (loop64, _) = prog.trace(2_000, 300, 5);
        let mut w = PtWriter::new();
        w.psb_plus(Some(5), Some(0x1000));
        w.tnt(&[true, false]);
        // MODE.Exec: CS.D (32-bit), then a TIP.
        w.buf.extend_from_slice(&[0x99, 0x02]);
        w.tip(0x2000).tip_pgd(None);
        let mode32 = w.buf;
        for (t, want) in [(&loop64, true), (&mode32, false), (&Vec::new(), true)] {
            assert_eq!(only_64bit(t), want);
            assert_eq!(crate::ipt::only_64bit(t), want);
        }
        let mut rng = XorShift::new(64);
        let mut same = 0;
        for k in 0..3_000 {
            let m = mutate(&mut rng, if k % 2 == 0 { &loop64 } else { &mode32 });
            let (ours, libipt) = (only_64bit(&m), crate::ipt::only_64bit(&m));
            assert!(
                !ours || libipt,
                "mutant {k}: true where libipt's reading says false"
            );
            same += usize::from(ours == libipt);
        }
        assert!(same > 2_700, "{same} of 3,000 the same");
    }

    fn all(t: &[u8]) -> Vec<Pkt> {
        let mut pos = 0;
        let mut out = Vec::new();
        while let Some((p, n)) = parse(t, pos) {
            out.push(p);
            pos += n;
        }
        out
    }

    /// `tip_at` reads exactly the TIPs `parse` reads (payload and size) wherever 8 bytes
    /// follow, and nothing else: every position of random bytes and of TIPs of every
    /// IPBytes value (the reserved ones too).
    #[test]
    fn tip_at_is_parse_of_a_tip() {
        use crate::testgen::XorShift;
        let mut rng = XorShift::new(77);
        let mut t: Vec<u8> = (0..20_000).map(|_| rng.next_u64() as u8).collect();
        for ipc in 0..8u8 {
            t.push((ipc << 5) | 0x0d);
            t.extend((0..8).map(|_| rng.next_u64() as u8));
        }
        let mut tips = [0usize; 8];
        for pos in 0..t.len() {
            let parsed = parse(&t, pos);
            match (tip_at(&t, pos), parsed) {
                (Some((p, n)), Some((Pkt::Tip(q), m))) => {
                    assert_eq!((p, n), (q, m), "at {pos}");
                    tips[usize::from(p.ipc)] += 1;
                }
                (Some(x), other) => panic!("at {pos}: tip_at {x:?}, parse {other:?}"),
                (None, Some((Pkt::Tip(q), _))) => {
                    assert!(q.ipc == 0 || pos + 9 > t.len(), "at {pos}: {q:?}")
                }
                (None, _) => {}
            }
        }
        for ipc in [1, 2, 3, 4, 6] {
            assert!(tips[ipc] > 10, "{tips:?}");
        }
        assert_eq!((tips[0], tips[5], tips[7]), (0, 0, 0));
    }

    #[test]
    fn packets_of_the_encoder_parse_back() {
        let mut w = PtWriter::new();
        w.psb_plus(Some(0x1234_5678), Some(0x7fff_1234_5000))
            .tnt(&[true, false, true])
            .tnt(&[false; 10])
            .tip(0x7fff_1234_6000)
            .tip_pgd(None)
            .tip_pge(0x40_1000)
            .pad();
        let p = all(&w.buf);
        let mut last = LastIp::default();
        let ips: Vec<Option<u64>> = p
            .iter()
            .filter_map(|p| match p {
                Pkt::Tip(x) | Pkt::TipPge(x) | Pkt::TipPgd(x) | Pkt::Fup(x) => Some(last.apply(*x)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ips,
            [
                Some(0x7fff_1234_5000),
                Some(0x7fff_1234_6000),
                None,
                Some(0x40_1000)
            ]
        );
        assert_eq!(p[0], Pkt::Psb);
        assert_eq!(p[1], Pkt::Tsc(0x1234_5678));
        assert!(p.contains(&Pkt::Psbend));
        assert!(p.contains(&Pkt::Tnt { bits: 0b101, n: 3 }));
        assert!(p.contains(&Pkt::Tnt { bits: 0, n: 10 }));
        assert_eq!(p.last(), Some(&Pkt::Pad));
    }

    #[test]
    fn short_tnt_bits_and_packets_we_leave_to_libipt() {
        // 0b0000_1110: stop bit 3, outcomes bits 2..1 = 1,1.
        assert_eq!(parse(&[0x0e], 0), Some((Pkt::Tnt { bits: 3, n: 2 }, 1)));
        assert_eq!(parse(&[0x04], 0), Some((Pkt::Tnt { bits: 0, n: 1 }, 1)));
        assert_eq!(parse(&[0x02, 0xf3], 0), Some((Pkt::Ovf, 2)));
        assert_eq!(parse(&[0x59, 0x01], 0), Some((Pkt::Mtc(1), 2)));
        assert_eq!(parse(&[0x59], 0), None, "cut MTC");
        // TMA: CTC 0x1234, FC 0x1ff; a reserved bit set; cut.
        let tma = [0x02, 0x73, 0x34, 0x12, 0, 0xff, 0x01];
        assert_eq!(
            parse(&tma, 0),
            Some((
                Pkt::Tma {
                    ctc: 0x1234,
                    fc: 0x1ff
                },
                7
            ))
        );
        let bad = [0x02, 0x73, 0x34, 0x12, 0, 0xff, 0x03];
        assert_eq!(parse(&bad, 0), Some((Pkt::TmaReserved, 7)));
        // As libipt reads it: an error, or with SKZ84 an invalid packet and its bogus byte.
        let skz84 = WireErrata {
            skz84: true,
            ..Default::default()
        };
        assert_eq!(
            parse_with(&bad, 0, WireErrata::default()),
            Some((Pkt::Other(TMA_RESERVED), 7))
        );
        assert_eq!(parse_with(&bad, 0, skz84), Some((Pkt::Invalid, 8)));
        assert_eq!(parse_with(&tma, 0, skz84), parse(&tma, 0));
        // SKD007: a 2-byte CYC with payload 0x20..0x3f before an `f3` byte is an OVF; any
        // other CYC stays one, as does that one without the erratum.
        let skd007 = WireErrata {
            skd007: true,
            ..Default::default()
        };
        let hidden = [0xf7, 0x02, 0xf3];
        assert_eq!(parse_with(&hidden, 0, skd007), Some((Pkt::Ovf, 3)));
        assert_eq!(
            parse_with(&hidden, 0, WireErrata::default()),
            parse(&hidden, 0)
        );
        assert_eq!(parse(&hidden, 0), Some((Pkt::Cyc(0x1e | 1 << 5), 2)));
        for other in [[0xf7, 0x04, 0xf3], [0xf7, 0x02, 0xf7], [0xf3, 0x02, 0xf3]] {
            assert_eq!(
                parse_with(&other, 0, skd007),
                parse(&other, 0),
                "{other:x?}"
            );
        }
        assert_eq!(parse(&tma[..6], 0), None, "cut TMA");
        // CBR: a ratio of 0 is an error to libipt.
        assert_eq!(parse(&[0x02, 0x03, 24, 0], 0), Some((Pkt::Cbr(24), 4)));
        assert_eq!(
            parse(&[0x02, 0x03, 0, 0], 0),
            Some((Pkt::Other("cbr with ratio 0"), 4))
        );
        assert_eq!(
            parse(&[0x02, 0x13, 0x81, 0x0e], 0),
            Some((Pkt::Cfe { ty: 1, ip: true }, 4))
        );
        assert_eq!(
            parse(&[0x02, 0x13, 0x02, 0x00], 0),
            Some((Pkt::Cfe { ty: 2, ip: false }, 4))
        );
        assert_eq!(parse(&[0x02, 0x13, 0x81], 0), None, "cut CFE");
        let pip = [0x02, 0x43, 1, 0x40, 0x23, 1, 0, 0];
        assert_eq!(parse(&pip, 0), Some((Pkt::Pip, 8)));
        assert_eq!(parse(&pip[..7], 0), None, "cut PIP");
        let vmcs = [0x02, 0xc8, 0xe0, 0xcd, 0xab, 0, 0];
        assert_eq!(parse(&vmcs, 0), Some((Pkt::Vmcs, 7)));
        assert_eq!(parse(&vmcs[..6], 0), None, "cut VMCS");
        let evd = [0x02, 0x53, 0, 0xaa, 0x0b, 0xf0, 0, 0, 0, 0, 0];
        assert_eq!(parse(&evd, 0), Some((Pkt::Evd { ty: 0 }, 11)));
        assert_eq!(parse(&evd[..10], 0), None, "cut EVD");
        let mnt = [0x02, 0xc3, 0x88, 0, 0xa0, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse(&mnt, 0), Some((Pkt::Mnt, 11)));
        assert_eq!(parse(&mnt[..10], 0), None, "cut MNT");
        assert_eq!(parse(&[0x02, 0x83], 0), Some((Pkt::Stop, 2)));
        // PTW: 4 bytes without IP, 8 bytes with IP; payload size 2 is reserved.
        let ptw4 = [0x02, 0x12, 1, 2, 3, 4];
        assert_eq!(parse(&ptw4, 0), Some((Pkt::Ptw { ip: false }, 6)));
        assert_eq!(parse(&ptw4[..5], 0), None, "cut PTW");
        let ptw8 = [0x02, 0xb2, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(parse(&ptw8, 0), Some((Pkt::Ptw { ip: true }, 10)));
        assert_eq!(parse(&ptw8[..9], 0), None, "cut PTW");
        assert_eq!(
            parse(&[0x02, 0x52, 0, 0], 0),
            Some((Pkt::Other("ptw with a reserved payload size"), 2))
        );
        assert_eq!(parse(&[0x19, 1, 2, 3], 0), None, "cut TSC");
        assert_eq!(find_psb(&[0, 0, 0x02, 0x82], 0), None);
        let mut t = vec![0u8; 3];
        t.extend_from_slice(&PSB);
        assert_eq!(find_psb(&t, 0), Some(3));
        assert_eq!(find_psb(&t, 4), None);
    }

    #[test]
    fn cyc_payloads_and_sizes() {
        // 5 bits in the first byte.
        assert_eq!(parse(&[0x1f << 3 | 3], 0), Some((Pkt::Cyc(0x1f), 1)));
        assert_eq!(parse(&[0x03], 0), Some((Pkt::Cyc(0), 1)));
        // 0x0b: value 1, another byte; 0x05: value 2 << 5, another; 0x02: 1 << 12, last.
        assert_eq!(
            parse(&[0x0f, 0x05, 0x02, 0x59], 0),
            Some((Pkt::Cyc(1 | (2 << 5) | (1 << 12)), 3))
        );
        assert_eq!(parse(&[0x0f, 0x05], 0), None, "cut CYC");
        // 8 extension bytes: 5 + 56 bits; a 9th would pass 64 bits.
        let mut long = vec![0xff];
        long.extend_from_slice(&[0xff; 7]);
        long.push(0xfe);
        assert_eq!(parse(&long, 0), Some((Pkt::Cyc(u64::MAX >> 3), 9)));
        let mut over = vec![0xff];
        over.extend_from_slice(&[0xff; 8]);
        over.push(0x02);
        assert_eq!(
            parse(&over, 0),
            Some((Pkt::Other("cyc payload over 64 bits"), 10))
        );
    }

    /// Power event packets: their kinds and sizes (libipt's `ptps_*`); cut by the end of
    /// the buffer, none.
    #[test]
    fn power_event_packets_and_sizes() {
        let pwre = [0x02, 0x22, 0x01, 0x00];
        let pwrx = [0x02, 0xa2, 0x11, 0x01, 0, 0, 0];
        let mwait = [0x02, 0xc2, 7, 0, 0, 0, 1, 0, 0, 0];
        assert_eq!(parse(&pwre, 0), Some((Pkt::Power, 4)));
        assert_eq!(parse(&pwrx, 0), Some((Pkt::Power, 7)));
        assert_eq!(parse(&mwait, 0), Some((Pkt::Mwait, 10)));
        assert_eq!(
            parse(&[0x02, 0x62], 0),
            Some((Pkt::Exstop { ip: false }, 2))
        );
        assert_eq!(parse(&[0x02, 0xe2], 0), Some((Pkt::Exstop { ip: true }, 2)));
        assert_eq!(parse(&mwait[..9], 0), None);
        assert_eq!(parse(&pwrx[..6], 0), None);
    }

    #[test]
    fn trig_fields_and_sizes() {
        let trig = |trbv, icnt, ip, mult| Trig {
            trbv,
            icnt,
            ip,
            mult,
        };
        assert_eq!(
            parse(&[0xd9, 0x20, 0x05, 0x00], 0),
            Some((Pkt::Trig(trig(5, None, false, true)), 3))
        );
        assert_eq!(
            parse(&[0x00, 0xd9, 0x40, 0x01, 0x2c, 0x01], 1),
            Some((Pkt::Trig(trig(1, Some(300), false, false)), 5))
        );
        assert_eq!(
            parse(&[0xd9, 0xc0, 0x82, 0, 0], 0),
            Some((Pkt::Trig(trig(0x82, Some(0), true, false)), 5))
        );
        // Cut by the end: no packet (as libipt's end of stream).
        for cut in [&[0xd9][..], &[0xd9, 0x00], &[0xd9, 0x40, 0x01, 0x2c]] {
            assert_eq!(parse(cut, 0), None, "{cut:x?}");
        }
        assert_eq!(parse_trig(&[0x19, 0, 0]), None, "not a TRIG");
    }

    #[test]
    fn ip_payloads_read_alike_mid_trace_and_at_its_end() {
        // Each IPBytes size, as a TIP: at the trace's end (the byte-wise read), then with
        // 0xff bytes after it (the 8-byte load must mask them off).
        for (ipc, len) in [(0u8, 0usize), (1, 2), (2, 4), (3, 6), (4, 6), (6, 8)] {
            let payload = [0x11u8, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
            let mut t = vec![(ipc << 5) | 0x0d];
            t.extend_from_slice(&payload[..len]);
            let want = payload[..len]
                .iter()
                .rev()
                .fold(0u64, |a, &b| (a << 8) | u64::from(b));
            let pkt = Some((Pkt::Tip(IpPayload { ipc, raw: want }), 1 + len));
            assert_eq!(parse(&t, 0), pkt, "ipc {ipc} at the end");
            t.extend_from_slice(&[0xff; 9]);
            assert_eq!(parse(&t, 0), pkt, "ipc {ipc} mid-trace");
            // Cut inside the payload: no packet.
            if len > 0 {
                assert_eq!(parse(&t[..len], 0), None, "ipc {ipc} cut");
            }
        }
    }

    #[test]
    fn last_ip_compression() {
        let mut l = LastIp::default();
        let p = |ipc, raw| IpPayload { ipc, raw };
        assert_eq!(l.apply(p(3, 0xffff_8000_0000)), Some(0xffff_ffff_8000_0000));
        assert_eq!(l.apply(p(1, 0x1234)), Some(0xffff_ffff_8000_1234));
        assert_eq!(l.apply(p(2, 0xdead_beef)), Some(0xffff_ffff_dead_beef));
        assert_eq!(l.apply(p(4, 0x1111_2222_3333)), Some(0xffff_1111_2222_3333));
        assert_eq!(l.apply(p(6, 42)), Some(42));
        assert_eq!(l.apply(p(0, 0)), None);
    }
}
