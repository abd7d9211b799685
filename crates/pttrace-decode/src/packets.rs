//! Packet-level listing of a PT stream (like libipt's ptdump), via libipt's packet decoder.

use super::ipt::{empty_packet, format_packet, PacketDecoder};

/// One listed packet, or a decode error at an offset (after which the lister resyncs at
/// the next PSB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketLine {
    Packet {
        offset: u64,
        size: u32,
        name: &'static str,
        payload: String,
    },
    Error {
        offset: u64,
        error: String,
    },
}

impl std::fmt::Display for PacketLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PacketLine::Packet {
                offset,
                name,
                payload,
                ..
            } => {
                if payload.is_empty() {
                    write!(f, "{offset:016x}  {name}")
                } else {
                    write!(f, "{offset:016x}  {name:<10} {payload}")
                }
            }
            PacketLine::Error { offset, error } => write!(f, "{offset:016x}  [error: {error}]"),
        }
    }
}

/// How to list packets (ptdump's options).
#[derive(Debug, Clone, Copy, Default)]
pub struct ListOptions {
    /// The CPU that recorded the trace (its errata change how some packets are read).
    pub cpu: Option<crate::CpuParams>,
    /// Start at byte 0 instead of the first PSB (ptdump's `--no-sync`); after an error the
    /// listing resumes at the next PSB as usual.
    pub no_sync: bool,
}

/// Lists every packet of `trace` (from its first PSB on). Bytes before the first PSB are
/// reported as one error line when present.
pub fn list_packets(trace: &[u8]) -> Vec<PacketLine> {
    list_packets_with(trace, ListOptions::default())
}

/// [`list_packets`] with ptdump's options.
pub fn list_packets_with(trace: &[u8], opts: ListOptions) -> Vec<PacketLine> {
    let mut out = Vec::new();
    let made = match opts.cpu {
        Some(cpu) => {
            let errata = crate::errata::of(&cpu).unwrap_or_default();
            PacketDecoder::with_cpu(trace, &cpu, errata)
        }
        None => PacketDecoder::new(trace),
    };
    let Ok(mut dec) = made else {
        return out;
    };
    let mut pkt = empty_packet();
    let mut first = true;
    loop {
        let synced = if first && opts.no_sync {
            dec.sync_set(0)
        } else {
            dec.sync_forward()
        };
        match synced {
            Ok(_) => {}
            Err(e) => {
                if first && !e.is_eos() {
                    out.push(PacketLine::Error {
                        offset: 0,
                        error: e.text(),
                    });
                } else if first {
                    out.push(PacketLine::Error {
                        offset: 0,
                        error: "no PSB (sync point) in the trace".into(),
                    });
                }
                break;
            }
        }
        let sync = if first && opts.no_sync {
            0
        } else {
            let Some(sync) = dec.sync_offset() else { break };
            sync
        };
        if first && sync > 0 {
            out.push(PacketLine::Error {
                offset: 0,
                error: format!("{sync} bytes before the first PSB skipped"),
            });
        }
        first = false;
        loop {
            let offset = dec.offset().unwrap_or(sync);
            match dec.next(&mut pkt) {
                Ok(size) => {
                    let raw = usize::try_from(offset)
                        .ok()
                        .and_then(|o| trace.get(o..o.checked_add(size as usize)?))
                        .unwrap_or(&[]);
                    let (name, payload) = format_packet(&pkt, raw);
                    out.push(PacketLine::Packet {
                        offset,
                        size,
                        name,
                        payload,
                    });
                }
                Err(e) if e.is_eos() => return out,
                Err(e) => {
                    out.push(PacketLine::Error {
                        offset,
                        error: e.text(),
                    });
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::PtWriter;

    #[test]
    fn lists_packets_with_offsets_and_errors() {
        let mut w = PtWriter::new();
        w.psb_plus(Some(0x1234), Some(0x401000))
            .tnt(&[true, false, true])
            .tip(0x402000);
        let bad = w.buf.len() as u64;
        w.buf.extend_from_slice(&[0x02, 0xff]);
        w.psb().psbend();
        let lines: Vec<String> = list_packets(&w.buf).iter().map(|l| l.to_string()).collect();
        assert_eq!(lines[0], "0000000000000000  psb");
        assert_eq!(lines[1], "0000000000000010  tsc        0x1234");
        assert_eq!(lines[2], "0000000000000018  mode.exec  64-bit");
        assert_eq!(lines[3], "000000000000001a  fup        sext48: 0x401000");
        assert_eq!(lines[4], "0000000000000021  psbend");
        assert_eq!(lines[5], "0000000000000023  tnt.8      !.!");
        assert_eq!(lines[6], "0000000000000024  tip        sext48: 0x402000");
        assert_eq!(lines[7], format!("{bad:016x}  [error: unknown opcode]"));
        assert_eq!(lines[8], format!("{:016x}  psb", bad + 2));
        assert_eq!(lines.len(), 10);
    }

    #[test]
    fn power_packets_show_their_fields() {
        let mut w = PtWriter::new();
        w.psb_plus(None, None);
        let at = w.buf.len() as u64;
        // PWRE: hw, C2.1; PWRX: last C1, deepest C6, woken by an interrupt and a store.
        w.buf
            .extend_from_slice(&[0x02, 0x22, 0x08, 0x21, 0x02, 0xa2, 0x16, 0x05, 0, 0, 0]);
        let lines: Vec<String> = list_packets(&w.buf).iter().map(|l| l.to_string()).collect();
        assert!(
            lines.contains(&format!("{at:016x}  pwre       c2.1, hw")),
            "{lines:?}"
        );
        assert!(
            lines.contains(&format!(
                "{:016x}  pwrx       last c1, deepest c6, wake: int,st",
                at + 4
            )),
            "{lines:?}"
        );
    }

    #[test]
    fn trig_cfe_and_evd_show_their_fields() {
        let mut w = PtWriter::new();
        w.psb_plus(None, Some(0x401000));
        let at_usize = w.buf.len();
        let at = at_usize as u64;
        w.buf.extend_from_slice(&[
            0xd9, 0x20, 0x05, // TRIG: TRBV 5, MULT
            0xd9, 0x40, 0x01, 0x2c, 0x01, // TRIG: TRBV 1, ICNT 300
            0xd9, 0xc0, 0x82, 0, 0, // TRIG: TRBV 0x82, ICNT 0, IP (a FUP follows)
        ]);
        w.fup(0x401234);
        w.buf.extend_from_slice(&[0x02, 0x53, 0x00]); // EVD: CR2
        w.buf.extend_from_slice(&0x7fff_1234_5000u64.to_le_bytes());
        w.buf.extend_from_slice(&[0x02, 0x13, 0x81, 0x0e]); // CFE: INTR, vector 14, IP
        w.buf.extend_from_slice(&[0x02, 0x13, 0x02, 0x00]); // CFE: IRET
        w.buf.extend_from_slice(&[0x02, 0x13, 0x05, 0x9a]); // CFE: SIPI, vector 0x9a
        w.buf.extend_from_slice(&[0x02, 0x13, 0x1f, 0x07]); // CFE: a type of no name
        w.buf.extend_from_slice(&[0x02, 0x53, 0x02]); // EVD: VMX exit reason
        w.buf.extend_from_slice(&48u64.to_le_bytes());
        w.tnt(&[true]);
        let lines: Vec<String> = list_packets(&w.buf).iter().map(|l| l.to_string()).collect();
        let k = lines
            .iter()
            .position(|l| l.starts_with(&format!("{at:016x}")))
            .unwrap();
        let at = |d: u64| format!("{:016x}", at + d);
        assert_eq!(
            lines[k..],
            [
                format!("{}  trig       trbv 0x05, mult", at(0)),
                format!("{}  trig       trbv 0x01, icnt 300", at(3)),
                format!("{}  trig       trbv 0x82, icnt 0, ip", at(8)),
                format!("{}  fup        sext48: 0x401234", at(13)),
                format!("{}  evd        cr2 0x7fff12345000", at(20)),
                format!("{}  cfe        intr, vector 14, ip", at(31)),
                format!("{}  cfe        iret", at(35)),
                format!("{}  cfe        sipi, vector 0x9a", at(39)),
                format!("{}  cfe        type 31, vector 7", at(43)),
                format!("{}  evd        vmx exit reason 0x30", at(47)),
                format!("{}  tnt.8      !", at(58)),
            ]
        );
        // The second TRIG cut by the end of the trace: libipt's end of stream, no line.
        let cut: Vec<String> = list_packets(&w.buf[..at_usize + 7])
            .iter()
            .map(|l| l.to_string())
            .collect();
        assert_eq!(cut, lines[..=k]);
    }

    #[test]
    fn no_sync_lists_from_byte_zero_and_cpu_is_taken() {
        let mut w = PtWriter::new();
        w.pad().pad().tnt(&[true]);
        w.psb_plus(None, Some(0x401000));
        let text = |o: ListOptions| -> Vec<String> {
            list_packets_with(&w.buf, o)
                .iter()
                .map(|l| l.to_string())
                .collect()
        };
        let synced = text(ListOptions::default());
        assert_eq!(
            synced[0],
            "0000000000000000  [error: 3 bytes before the first PSB skipped]"
        );
        assert_eq!(synced[1], "0000000000000003  psb");
        let raw = text(ListOptions {
            no_sync: true,
            ..Default::default()
        });
        assert_eq!(raw[0], "0000000000000000  pad");
        assert_eq!(raw[1], "0000000000000001  pad");
        assert_eq!(raw[2], "0000000000000002  tnt.8      !");
        assert_eq!(&raw[3..], &synced[1..]);
        // A CPU changes nothing in this stream (no erratum applies to these packets).
        let cpu = crate::CpuParams {
            family: 6,
            model: 85,
            stepping: 7,
            ..Default::default()
        };
        assert_eq!(
            text(ListOptions {
                cpu: Some(cpu),
                ..Default::default()
            }),
            synced
        );
    }
}
