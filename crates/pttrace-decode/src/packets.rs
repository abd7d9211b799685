//! Packet-level listing of a PT stream in libipt's ptdump syntax (its default options), via
//! libipt's packet decoder.

use super::ipt::{empty_packet, format_packet, LastIpTrack, PacketDecoder};

mod time_columns;
use time_columns::TimeTrack;
pub use time_columns::{TimeColumn, TimeColumns};

/// One listed packet; a decode error at an offset (after which the lister resyncs at the
/// next PSB); or bytes the listing does not cover (ptdump skips them without a word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketLine {
    Packet {
        offset: u64,
        size: u32,
        name: &'static str,
        payload: String,
        /// ptdump's tracking column (PIP, VMCS, CFE, EVD): what it tracks, the value.
        tracking: Option<(&'static str, String)>,
    },
    Error {
        offset: u64,
        /// What failed, in ptdump's words: "error decoding packet" or "sync error".
        context: &'static str,
        error: String,
    },
    /// Bytes before the first PSB, or a trace without one.
    Unlisted { offset: u64, why: String },
    /// ptdump's diagnostic about what it tracks (the last IP, the time) at a packet,
    /// before the packet's line: not damage.
    Diagnostic { offset: u64, text: String },
}

impl PacketLine {
    /// The line as ptdump prints it: with the offset column unless `no_offset` (ptdump's
    /// `--no-offset`), and the packet's bytes in hex when `raw` holds them (`--raw`).
    pub fn ptdump_text(&self, no_offset: bool, raw: Option<&[u8]>) -> String {
        let mut s = String::new();
        self.write_ptdump(&mut s, no_offset, raw);
        s
    }

    /// [`Self::ptdump_text`] appended to `s` (a buffer a listing reuses: a line put
    /// together through `fmt` cost some 2,700 machine instructions).
    pub fn write_ptdump(&self, s: &mut String, no_offset: bool, raw: Option<&[u8]>) {
        match self {
            PacketLine::Packet {
                offset,
                name,
                payload,
                tracking,
                ..
            } => {
                // ptdump's columns: the offset padded to 17, the bytes to 33, the name to
                // 10 when a payload follows, the payload to 25 when a tracking column
                // follows (5 for its name); one space between columns.
                let mut sep = "";
                if !no_offset {
                    crate::hex::push_padded(s, *offset, 16);
                    s.push(' ');
                    sep = " ";
                }
                if let Some(bytes) = raw.filter(|b| !b.is_empty()) {
                    s.push_str(sep);
                    for &b in bytes {
                        s.extend(crate::hex::byte(b).map(char::from));
                    }
                    pad(s, 2 * bytes.len(), 33);
                    sep = " ";
                }
                s.push_str(sep);
                s.push_str(name);
                match tracking {
                    // (The name is padded only when a payload follows, as in ptdump.)
                    Some((id, value)) => {
                        if !payload.is_empty() {
                            pad(s, name.chars().count(), 10);
                        }
                        s.push(' ');
                        s.push_str(payload);
                        pad(s, payload.chars().count(), 25);
                        s.push(' ');
                        s.push_str(id);
                        pad(s, id.chars().count(), 5);
                        s.push_str(value);
                    }
                    None if payload.is_empty() => {}
                    None => {
                        pad(s, name.chars().count(), 10);
                        s.push(' ');
                        s.push_str(payload);
                    }
                }
            }
            PacketLine::Error {
                offset,
                context,
                error,
            } => {
                use std::fmt::Write;
                let _ = write!(s, "[{offset:x}: {context}: {error}]");
            }
            PacketLine::Unlisted { offset, why: text }
            | PacketLine::Diagnostic { offset, text } => {
                use std::fmt::Write;
                let _ = write!(s, "[{offset:x}: {text}]");
            }
        }
    }
}

/// Spaces after a column of `len` characters up to `width` (as `fmt`'s `{:<width}`).
fn pad(s: &mut String, len: usize, width: usize) {
    for _ in len..width {
        s.push(' ');
    }
}

impl std::fmt::Display for PacketLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.ptdump_text(false, None))
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
    /// ptdump's `--lastip`: IP packets show the last IP they make (tracking column `ip`).
    pub last_ip: bool,
    /// ptdump's `--exec-mode`: MODE.Exec shows its mode (tracking column `em`).
    pub exec_mode: bool,
    /// ptdump's `--no-pad`: PADs are not listed.
    pub no_pad: bool,
    /// ptdump's `--no-timing`: TSC, CBR, TMA, MTC and CYC are not listed.
    pub no_timing: bool,
    /// ptdump's `--no-cyc`: CYC is not listed (nor tracked for time).
    pub no_cyc: bool,
    /// ptdump's time columns (`--time`, `--tcal`).
    pub time: Option<TimeColumns>,
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
    let time_opts = opts.time.map(|mut t| {
        t.cfg.skl168 = opts
            .cpu
            .and_then(|c| crate::errata::of(&c))
            .is_some_and(|e| e.skl168);
        t
    });
    let mut notes = Vec::new();
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
            Err(e) if e.is_eos() => {
                if first {
                    out.push(PacketLine::Unlisted {
                        offset: 0,
                        why: "no PSB (sync point) in the trace".into(),
                    });
                }
                break;
            }
            Err(e) => {
                out.push(PacketLine::Error {
                    offset: 0,
                    context: "sync error",
                    error: e.text(),
                });
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
            out.push(PacketLine::Unlisted {
                offset: 0,
                why: format!("{sync} bytes before the first PSB skipped"),
            });
        }
        first = false;
        // (ptdump tracks the last IP and the time from each synchronization on.)
        let mut last_ip = LastIpTrack::default();
        let mut time = TimeTrack::default();
        loop {
            let offset = dec.offset().unwrap_or(sync);
            match dec.next(&mut pkt) {
                Ok(size) => {
                    let raw = usize::try_from(offset)
                        .ok()
                        .and_then(|o| trace.get(o..o.checked_add(size as usize)?))
                        .unwrap_or(&[]);
                    let mut text = format_packet(&pkt, raw);
                    let skip = match text.name {
                        "pad" => opts.no_pad,
                        "tsc" | "cbr" | "tma" | "mtc" => opts.no_timing,
                        "cyc" => opts.no_timing || opts.no_cyc,
                        _ => false,
                    };
                    if let (true, Some((ipc, ip))) = (opts.last_ip, text.ip) {
                        let column = last_ip.update(ipc, ip).unwrap_or_else(|e| {
                            notes.push(format!("error tracking last-ip: {e}"));
                            "<unavailable>".to_string()
                        });
                        text.tracking = Some(("ip", column));
                    }
                    // (With `--no-cyc`, CYCs are not tracked either.)
                    if let Some(t) = time_opts.filter(|_| !(text.name == "cyc" && opts.no_cyc)) {
                        if let Some(column) = time.packet(text.name, text.timing, &t, &mut notes) {
                            text.tracking = Some(column);
                        }
                    }
                    // (ptdump's diagnostics come before the packet's line.)
                    out.extend(
                        notes
                            .drain(..)
                            .map(|text| PacketLine::Diagnostic { offset, text }),
                    );
                    if let (true, Some(em)) = (opts.exec_mode, text.exec_mode) {
                        text.tracking = Some(("em", em.to_string()));
                    }
                    if skip {
                        continue;
                    }
                    out.push(PacketLine::Packet {
                        offset,
                        size,
                        name: text.name,
                        payload: text.payload,
                        tracking: text.tracking,
                    });
                }
                Err(e) if e.is_eos() => return out,
                Err(e) => {
                    out.push(PacketLine::Error {
                        offset,
                        context: "error decoding packet",
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

    /// A packet's line as `fmt` put it together (what `write_ptdump` replaced).
    fn by_fmt(
        offset: u64,
        name: &str,
        payload: &str,
        tracking: Option<(&str, &str)>,
        no_offset: bool,
        raw: Option<&[u8]>,
    ) -> String {
        let mut s = String::new();
        let mut sep = "";
        if !no_offset {
            s += &format!("{offset:016x} ");
            sep = " ";
        }
        if let Some(bytes) = raw.filter(|b| !b.is_empty()) {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            s += &format!("{sep}{hex:<33}");
            sep = " ";
        }
        s += &match tracking {
            Some((id, value)) if payload.is_empty() => {
                format!("{sep}{name} {payload:<25} {id:<5}{value}")
            }
            Some((id, value)) => format!("{sep}{name:<10} {payload:<25} {id:<5}{value}"),
            None if payload.is_empty() => format!("{sep}{name}"),
            None => format!("{sep}{name:<10} {payload}"),
        };
        s
    }

    #[test]
    fn packet_lines_are_those_fmt_made() {
        let raws: [Option<&[u8]>; 4] = [
            None,
            Some(&[]),
            Some(&[0x02, 0x43, 0x11, 0x22, 0x33, 0x44, 0x55]),
            Some(&[0xff; 20]),
        ];
        let tracking = [None, Some(("cr3", "0000000012345000")), Some(("vmcs", ""))];
        for offset in [0, 0x1234, u64::MAX] {
            for (name, payload) in [
                ("psb", ""),
                ("tnt.8", "!!.!"),
                ("fup", "3: ????????????1002"),
                ("a-name-longer-than-10", "x"),
                ("pip", "ü12345678901234567890123456"),
            ] {
                for t in tracking {
                    for no_offset in [false, true] {
                        for raw in raws {
                            let line = PacketLine::Packet {
                                offset,
                                size: 1,
                                name,
                                payload: payload.to_string(),
                                tracking: t.map(|(i, v)| (i, v.to_string())),
                            };
                            let mut s = "kept ".to_string();
                            line.write_ptdump(&mut s, no_offset, raw);
                            let want = by_fmt(offset, name, payload, t, no_offset, raw);
                            assert_eq!(s, format!("kept {want}"));
                        }
                    }
                }
            }
        }
    }

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
        assert_eq!(lines[1], "0000000000000010  tsc        1234");
        assert_eq!(lines[2], "0000000000000018  mode.exec  cs.l");
        assert_eq!(lines[3], "000000000000001a  fup        3: 0000000000401000");
        assert_eq!(lines[4], "0000000000000021  psbend");
        assert_eq!(lines[5], "0000000000000023  tnt.8      !.!");
        assert_eq!(lines[6], "0000000000000024  tip        3: 0000000000402000");
        assert_eq!(
            lines[7],
            format!("[{bad:x}: error decoding packet: unknown opcode]")
        );
        assert_eq!(lines[8], format!("{:016x}  psb", bad + 2));
        assert_eq!(lines.len(), 10);
    }

    #[test]
    fn power_packets_show_their_fields() {
        let mut w = PtWriter::new();
        w.psb_plus(None, None);
        let at = w.buf.len() as u64;
        // PWRE: hw, C2.1 (ptdump counts from one: c3.2); PWRX: last C1, deepest C6 (c2,
        // c7), woken by an interrupt and a store (ptdump's "bad": one reason at most).
        w.buf
            .extend_from_slice(&[0x02, 0x22, 0x08, 0x21, 0x02, 0xa2, 0x16, 0x05, 0, 0, 0]);
        let lines: Vec<String> = list_packets(&w.buf).iter().map(|l| l.to_string()).collect();
        assert!(
            lines.contains(&format!("{at:016x}  pwre       c3.2, hw")),
            "{lines:?}"
        );
        assert!(
            lines.contains(&format!("{:016x}  pwrx       bad: c2, c7", at + 4)),
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
                format!("{}  trig       05, mult", at(0)),
                format!("{}  trig       01, icnt: 300", at(3)),
                format!("{}  trig       82, ip, icnt: 0", at(8)),
                format!("{}  fup        3: 0000000000401234", at(13)),
                format!("{}  evd        0: 7fff12345000           type cr2", at(20)),
                format!("{}  cfe        1: 14, ip                 type intr", at(31)),
                format!("{}  cfe        2                         type iret", at(35)),
                format!("{}  cfe        5: 9a                     type sipi", at(39)),
                format!(
                    "{}  cfe        31                        type unknown",
                    at(43)
                ),
                format!("{}  evd        2: 30                     type vmxr", at(47)),
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

    /// ptdump's `--lastip`, `--exec-mode`, `--no-pad`, `--no-timing`, `--no-cyc` (lines as
    /// libipt's ptdump prints them for these bytes).
    #[test]
    fn ptdump_tracking_and_filter_options() {
        let mut t: Vec<u8> = [0x02, 0x82].repeat(8); // psb
        t.push(0x00); // pad
        t.extend_from_slice(&[0x19, 0x34, 0x12, 0, 0, 0, 0, 0]); // tsc 1234
        t.extend_from_slice(&[0x99, 0x01, 0x02, 0x23]); // mode.exec (64-bit), psbend
        t.extend_from_slice(&[0x01]); // tip.pgd, IP suppressed: no last IP yet
        t.extend_from_slice(&[0x2d, 0x34, 0x12]); // tip, update16 (from 0)
        t.extend_from_slice(&[0x61, 0, 0x10, 0x40, 0, 0, 0]); // tip.pgd sext48 0x401000
        t.extend_from_slice(&[0x11, 0x59, 0x07, 0x1b]); // tip.pge suppressed, mtc 7, cyc 3
        t.extend_from_slice(&[0x2d, 0x78, 0x56, 0x00]); // tip update16, pad
        let lines = |o: ListOptions| -> Vec<String> {
            list_packets_with(&t, o)
                .iter()
                .map(|l| l.to_string())
                .collect()
        };
        let with_last_ip = lines(ListOptions {
            last_ip: true,
            exec_mode: true,
            ..Default::default()
        });
        assert_eq!(
            with_last_ip,
            [
                "0000000000000000  psb",
                "0000000000000010  pad",
                "0000000000000011  tsc        1234",
                "0000000000000019  mode.exec  cs.l                      em   64-bit",
                "000000000000001b  psbend",
                "[1d: error tracking last-ip: no ip]",
                "000000000000001d  tip.pgd    0: ????????????????       ip   <unavailable>",
                "000000000000001e  tip        1: ????????????1234       ip   0000000000001234",
                "0000000000000021  tip.pgd    3: 0000000000401000       ip   0000000000401000",
                "0000000000000028  tip.pge    0: ????????????????       ip   <suppressed>",
                "0000000000000029  mtc        7",
                "000000000000002b  cyc        3",
                "000000000000002c  tip        1: ????????????5678       ip   0000000000405678",
                "000000000000002f  pad",
            ]
        );
        let names = |o: ListOptions| -> Vec<&'static str> {
            list_packets_with(&t, o)
                .iter()
                .filter_map(|l| match l {
                    PacketLine::Packet { name, .. } => Some(*name),
                    _ => None,
                })
                .collect()
        };
        let all = names(ListOptions::default());
        let without = |gone: &[&str]| -> Vec<&str> {
            all.iter().copied().filter(|n| !gone.contains(n)).collect()
        };
        let no_pad = ListOptions {
            no_pad: true,
            ..Default::default()
        };
        let no_timing = ListOptions {
            no_timing: true,
            ..Default::default()
        };
        let no_cyc = ListOptions {
            no_cyc: true,
            ..Default::default()
        };
        assert_eq!(names(no_pad), without(&["pad"]));
        assert_eq!(names(no_timing), without(&["tsc", "mtc", "cyc"]));
        assert_eq!(names(no_cyc), without(&["cyc"]));
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
        assert_eq!(synced[0], "[0: 3 bytes before the first PSB skipped]");
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
