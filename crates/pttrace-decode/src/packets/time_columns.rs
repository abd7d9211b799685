//! ptdump's time columns (`--time`, `--tcal` and their options): what libipt's time model
//! ([`crate::timing`]) says after each timing packet, with ptdump's diagnostics.

use crate::timing::{Calibration, Time, TimeCfg, TimeError, TimingPacket, FCR_SHIFT};

/// Which time column the timing packets show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeColumn {
    /// ptdump's `--time`: the estimated TSC (column `tsc`).
    Tsc,
    /// ptdump's `--tcal`: the fast-counter:cycles ratio (column `fcr`).
    Fcr,
}

/// ptdump's time-tracking options: the timing packets show the time (or its calibration)
/// libipt estimates after them, with libipt's diagnostics where it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeColumns {
    pub column: TimeColumn,
    /// `--time-delta`: the change since the last shown value.
    pub delta: bool,
    /// `--no-tcal`: no calibration (CYCs then never move the time).
    pub no_tcal: bool,
    /// `--no-wall-clock`: before the first TSC, the time counted from 0 rather than an
    /// error.
    pub no_wall_clock: bool,
    /// `--keep-tcal-on-ovf`: an OVF keeps the calibrated ratio.
    pub keep_tcal_on_ovf: bool,
    /// The CPU parameters (MTC frequency, CPUID 0x15, nominal frequency); SKL168 is taken
    /// from the errata of [`ListOptions::cpu`].
    pub cfg: TimeCfg,
}

/// ptdump's time tracking over one synchronized run of packets.
#[derive(Debug, Default)]
pub(super) struct TimeTrack {
    time: Time,
    tcal: Calibration,
    in_header: bool,
    /// The last shown values (for `--time-delta`).
    shown_tsc: u64,
    shown_fcr: u64,
}

impl TimeTrack {
    /// Follows the packet `name` (with its timing values); ptdump's diagnostics go to
    /// `notes`; the time column the packet's line shows.
    pub(super) fn packet(
        &mut self,
        name: &str,
        timing: Option<TimingPacket>,
        opts: &TimeColumns,
        notes: &mut Vec<String>,
    ) -> Option<(&'static str, String)> {
        let cfg = &opts.cfg;
        let calibrate = !opts.no_tcal;
        let mut note = |what: &str, r: Result<(), TimeError>| {
            if let Err(e) = r {
                notes.push(format!("{what}: {}", e.libipt_text()));
            }
        };
        let (mut show_time, mut show_fcr) = (true, true);
        match (name, timing) {
            ("psb", _) => {
                self.tcal.psb(cfg);
                self.in_header = true;
                return None;
            }
            ("psbend", _) => {
                self.in_header = false;
                return None;
            }
            ("ovf", _) => {
                if opts.keep_tcal_on_ovf {
                    self.tcal.ovf_keeping_ratio();
                } else {
                    self.tcal = Calibration::default();
                }
                return None;
            }
            (_, Some(TimingPacket::Tsc(tsc))) => {
                if calibrate {
                    if self.in_header {
                        note("error calibrating time", self.tcal.header_tsc(tsc));
                    } else {
                        self.tcal.tsc_packet(tsc);
                    }
                }
                self.time.tsc_packet(tsc);
            }
            (_, Some(TimingPacket::Cbr(ratio))) => {
                if calibrate {
                    let r = if self.in_header {
                        self.tcal.header_cbr(ratio, cfg)
                    } else {
                        self.tcal.cbr_packet(ratio, cfg)
                    };
                    note("error calibrating time", r);
                }
                note("error updating time", self.time.cbr_packet(ratio));
                // (No time update at a CBR.)
                show_time = false;
            }
            (_, Some(TimingPacket::Tma { ctc, fc })) => {
                note("error updating time", self.time.tma_packet(ctc, fc, cfg));
                show_fcr = false;
            }
            (_, Some(TimingPacket::Mtc(payload))) => {
                if calibrate {
                    note("error calibrating time", self.tcal.mtc_packet(payload, cfg));
                }
                note("error updating time", self.time.mtc_packet(payload, cfg));
            }
            (_, Some(TimingPacket::Cyc(cyc))) => {
                let mut fcr = 0;
                if calibrate {
                    match self.tcal.fcr() {
                        Some(f) => fcr = f,
                        None => note("calibration error", Err(TimeError::NoTime)),
                    }
                    self.tcal.cyc_packet(cyc);
                }
                match self.time.cyc_packet(cyc, cfg, fcr) {
                    Err(e) => note("error updating time", Err(e)),
                    Ok(()) if fcr == 0 => notes.push("error updating time: no calibration".into()),
                    Ok(()) => {}
                }
                show_fcr = false;
            }
            _ => return None,
        }
        match opts.column {
            TimeColumn::Tsc if show_time => Some(("tsc", self.tsc_column(opts, notes))),
            TimeColumn::Fcr if show_fcr => Some(("fcr", self.fcr_column(opts, notes))),
            _ => None,
        }
    }

    /// ptdump's `tsc` column.
    fn tsc_column(&mut self, opts: &TimeColumns, notes: &mut Vec<String>) -> String {
        let tsc = match self.time.tsc() {
            Ok(t) => t,
            Err(relative) if opts.no_wall_clock => relative,
            Err(_) => {
                notes.push(format!(
                    "error printing time: {}",
                    TimeError::NoTime.libipt_text()
                ));
                return "<unavailable>".into();
            }
        };
        if !opts.delta {
            return format!("{tsc:016x}");
        }
        let last = std::mem::replace(&mut self.shown_tsc, tsc);
        if last <= tsc {
            format!("+{:x}", tsc - last)
        } else {
            format!("-{:x}", last - tsc)
        }
    }

    /// ptdump's `fcr` column: the ratio as a decimal number.
    fn fcr_column(&mut self, opts: &TimeColumns, notes: &mut Vec<String>) -> String {
        let Some(fcr) = self.tcal.fcr() else {
            notes.push(format!(
                "error printing time: {}",
                TimeError::NoTime.libipt_text()
            ));
            return "<unavailable>".into();
        };
        let ratio = |f: u64| f as f64 / f64::from(1u32 << FCR_SHIFT);
        if opts.delta {
            let last = std::mem::replace(&mut self.shown_fcr, fcr);
            format!("{:+.3}", ratio(fcr) - ratio(last))
        } else {
            format!("{:.3}", ratio(fcr))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packets::{list_packets_with, ListOptions};

    /// ptdump's `--time`, `--time-delta` and `--tcal` columns, with its diagnostics (the
    /// lines libipt's ptdump prints for these bytes with `--mtc-freq 4 --cpuid-0x15.eax 1
    /// --cpuid-0x15.ebx 4`: one CTC tick is 4 TSC ticks).
    #[test]
    fn time_columns_follow_libipts_time_and_calibration() {
        let mut t: Vec<u8> = [0x02, 0x82].repeat(8); // psb
        t.extend_from_slice(&[0x19, 0x00, 0x10, 0, 0, 0, 0, 0]); // tsc 1000
        t.extend_from_slice(&[0x02, 0x73, 0x10, 0x00, 0x00, 0x00, 0x00]); // tma 10, 0
        t.extend_from_slice(&[0x02, 0x23]); // psbend
        t.extend_from_slice(&[0x59, 0x01]); // mtc 1: CTC 0x10, the TMA's
        t.extend_from_slice(&[0x07, 0x02]); // cyc 0x20, uncalibrated: lost
        t.extend_from_slice(&[0x59, 0x02]); // mtc 2: 0x10 CTC = 0x40 TSC ticks, / 0x20
        t.extend_from_slice(&[0x03 | 10 << 3]); // cyc 0xa: * 2.0 = 0x14 ticks
        t.extend_from_slice(&[0x02, 0x03, 0x08, 0x00]); // cbr 8
        t.extend_from_slice(&[0x02, 0xf3]); // ovf
        t.extend_from_slice(&[0x03 | 1 << 3]); // cyc 1: the calibration gone
        let lines = |column, delta| -> Vec<String> {
            let time = TimeColumns {
                column,
                delta,
                no_tcal: false,
                no_wall_clock: false,
                keep_tcal_on_ovf: false,
                cfg: TimeCfg {
                    mtc_freq: 4,
                    cpuid_0x15_eax: 1,
                    cpuid_0x15_ebx: 4,
                    ..Default::default()
                },
            };
            list_packets_with(
                &t,
                ListOptions {
                    time: Some(time),
                    ..Default::default()
                },
            )
            .iter()
            .map(|l| l.to_string())
            .collect()
        };
        assert_eq!(
            lines(TimeColumn::Tsc, false),
            [
                "0000000000000000  psb",
                "0000000000000010  tsc        1000                      tsc  0000000000001000",
                "0000000000000018  tma        10, 0                     tsc  0000000000001000",
                "000000000000001f  psbend",
                "0000000000000021  mtc        1                         tsc  0000000000001000",
                "[23: calibration error: no timing information]",
                "[23: error updating time: no calibration]",
                "0000000000000023  cyc        20                        tsc  0000000000001000",
                "0000000000000025  mtc        2                         tsc  0000000000001040",
                "0000000000000027  cyc        a                         tsc  0000000000001054",
                "0000000000000028  cbr        8",
                "000000000000002c  ovf",
                "[2e: calibration error: no timing information]",
                "[2e: error updating time: no calibration]",
                "000000000000002e  cyc        1                         tsc  0000000000001054",
            ]
        );
        let delta = lines(TimeColumn::Tsc, true);
        let columns: Vec<&str> = delta
            .iter()
            .filter_map(|l| l.rsplit_once(" tsc  ").map(|c| c.1))
            .collect();
        assert_eq!(columns, ["+1000", "+0", "+0", "+0", "+40", "+14", "+0"]);
        assert_eq!(
            lines(TimeColumn::Fcr, false),
            [
                "0000000000000000  psb",
                "[10: error printing time: no timing information]",
                "0000000000000010  tsc        1000                      fcr  <unavailable>",
                "0000000000000018  tma        10, 0",
                "000000000000001f  psbend",
                "[21: error printing time: no timing information]",
                "0000000000000021  mtc        1                         fcr  <unavailable>",
                "[23: calibration error: no timing information]",
                "[23: error updating time: no calibration]",
                "0000000000000023  cyc        20",
                "0000000000000025  mtc        2                         fcr  2.000",
                "0000000000000027  cyc        a",
                "[28: error printing time: no timing information]",
                "0000000000000028  cbr        8                         fcr  <unavailable>",
                "000000000000002c  ovf",
                "[2e: calibration error: no timing information]",
                "[2e: error updating time: no calibration]",
                "000000000000002e  cyc        1",
            ]
        );
    }
}
