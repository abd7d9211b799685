//! The trace's time as libipt estimates it (its `pt_time` and `pt_time_cal`, the same in
//! 2.1.2 and 2.2): one model for the fast decoder's clock and for `dump`'s time columns
//! (ptdump's `--time` and `--tcal`).
//!
//! - [`Time`]: the estimated TSC. A TSC packet sets it; the TMA after it tells where in the
//!   crystal clock's (CTC) period it came; each MTC moves it on by the CTC ticks since the
//!   last one, converted to TSC ticks with CPUID leaf 0x15's ratio; each CYC in between
//!   moves it on by its core cycles times the calibrated fast-counter:cycles ratio.
//! - [`Calibration`]: that ratio (`fcr`, fixed point with [`FCR_SHIFT`] fraction bits), from
//!   the cycles counted between two MTCs, between two PSB+ TSCs where no MTC came, or from
//!   a CBR and the nominal frequency.
//!
//! Every update returns libipt's error where libipt returns one ([`TimeError`]), after
//! changing the state as libipt does, so that a caller that goes on (ptdump) and one that
//! stops (the fast decoder hands the window to libipt) both see libipt's behaviour.

/// The CPU parameters the trace's time depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeCfg {
    /// The MTC frequency (`mtc_period` of the PT event): an MTC every 2^N CTC ticks.
    pub mtc_freq: u8,
    /// CPUID leaf 0x15: TSC ticks per crystal clock (CTC) tick are `ebx / eax`.
    pub cpuid_0x15_eax: u32,
    pub cpuid_0x15_ebx: u32,
    /// The nominal core:bus ratio (0 when unknown): with a CBR it calibrates cycles.
    pub nom_freq: u8,
    /// The CPU has erratum SKL168 (CYC packets dropped right before a PSB): the first MTC
    /// after a PSB does not calibrate where it looks affected.
    pub skl168: bool,
}

impl TimeCfg {
    /// The CPU parameters of a trace.
    pub fn of(cpu: &crate::CpuParams, errata: &crate::config::Errata) -> Self {
        TimeCfg {
            mtc_freq: cpu.mtc_freq,
            cpuid_0x15_eax: cpu.cpuid_0x15_eax,
            cpuid_0x15_ebx: cpu.cpuid_0x15_ebx,
            nom_freq: cpu.nom_freq,
            skl168: errata.skl168,
        }
    }

    /// Bits of the CTC an MTC covers (its 8 payload bits shifted by the frequency); `None`
    /// for a frequency whose CTC does not fit 32 bits.
    fn mtc_bits(&self) -> Option<u32> {
        let bits = u32::from(self.mtc_freq) + MTC_BITS;
        (bits < 32).then_some(bits)
    }
}

/// A timing packet's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingPacket {
    Tsc(u64),
    /// The core:bus ratio.
    Cbr(u8),
    /// The CTC and the fast counter at the TSC before it.
    Tma {
        ctc: u16,
        fc: u16,
    },
    /// The payload: CTC bits `mtc_freq..mtc_freq + 8`.
    Mtc(u8),
    /// Core cycles since the last CYC-eligible packet.
    Cyc(u64),
}

/// Why libipt's time tracking refused an update (its error codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeError {
    /// `pte_bad_packet`: a CTC or TSC that wrapped more than once, a CBR of 0.
    BadPacket,
    /// `pte_bad_config`: CPUID leaf 0x15's ratio is missing (0), or the MTC frequency
    /// makes no CTC.
    BadConfig,
    /// `pte_bad_context`: a TMA without a TSC before it, or a second one.
    BadContext,
    /// `pte_internal`: an MTC between TSC and TMA seen as the TMA comes, a calibration
    /// that would overflow, a TMA with more CTC bits than it has.
    Internal,
    /// `pte_no_time`: no TSC yet, or no calibration yet.
    NoTime,
}

impl TimeError {
    /// libipt's text for it (`pt_errstr`).
    pub fn libipt_text(self) -> &'static str {
        match self {
            TimeError::BadPacket => "unknown packet",
            TimeError::BadConfig => "bad configuration",
            TimeError::BadContext => "unexpected packet context",
            TimeError::Internal => "internal error",
            TimeError::NoTime => "no timing information",
        }
    }
}

/// Fraction bits of the fast-counter:cycles ratio (libipt's `pt_tcal_fcr_shr`).
pub const FCR_SHIFT: u32 = 8;
/// Bits of a TSC packet's payload.
const TSC_BITS: u32 = 56;
/// Bits of the CTC an MTC payload holds, and that a TMA holds.
const MTC_BITS: u32 = 8;
const TMA_CTC_BITS: u32 = 16;
const TMA_CTC_MASK: u32 = (1 << TMA_CTC_BITS) - 1;

/// CTC ticks from `last` to `ctc`, one wrap-around of the MTC's CTC bits corrected.
fn ctc_delta(ctc: u32, last: u32, cfg: &TimeCfg) -> Result<u32, TimeError> {
    let mut now = ctc;
    if now < last {
        let bits = cfg.mtc_bits().ok_or(TimeError::BadConfig)?;
        now = now.wrapping_add(1 << bits);
        if now < last {
            return Err(TimeError::BadPacket);
        }
    }
    Ok(now - last)
}

/// CTC ticks in fast-counter (TSC) ticks, by CPUID leaf 0x15's ratio.
fn ctc_to_fc(ctc: u64, cfg: &TimeCfg) -> Result<u64, TimeError> {
    if cfg.cpuid_0x15_eax == 0 || cfg.cpuid_0x15_ebx == 0 {
        return Err(TimeError::BadConfig);
    }
    Ok(ctc.wrapping_mul(u64::from(cfg.cpuid_0x15_ebx)) / u64::from(cfg.cpuid_0x15_eax))
}

/// The CTC an MTC's payload stands for.
fn mtc_ctc(payload: u8, cfg: &TimeCfg) -> u32 {
    u32::from(payload)
        .checked_shl(u32::from(cfg.mtc_freq))
        .unwrap_or(0)
}

/// The estimated time (libipt's `struct pt_time`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Time {
    /// The estimate.
    tsc: u64,
    /// The TSC at the last CTC reference (an MTC, or the TSC less the TMA's fast counter).
    base: u64,
    /// Fast-counter ticks since the reference.
    fc: u64,
    /// The CTC at the last MTC or TMA.
    ctc: u32,
    /// The CTC where the cycles of the next CYC started counting.
    ctc_cyc: u32,
    /// MTC and CYC updates lost since the last TSC (or MTC, for CYCs).
    lost_mtc: u32,
    lost_cyc: u32,
    /// The last core:bus ratio.
    cbr: u8,
    have_tsc: bool,
    have_cbr: bool,
    have_tma: bool,
    have_mtc: bool,
}

impl Time {
    /// The estimate: `Ok` once a TSC packet gave one; before, `Err` with the time counted
    /// from 0 by the MTCs and CYCs (ptdump's `--no-wall-clock` shows it).
    pub fn tsc(&self) -> Result<u64, u64> {
        if self.have_tsc {
            Ok(self.tsc)
        } else {
            Err(self.tsc)
        }
    }

    /// The part of the state the times from here on depend on (not what was lost, nor the
    /// core:bus ratio): two clocks equal in it give the same times from here on.
    pub fn same_course(&self, o: &Time) -> bool {
        let strip = |t: &Time| Time {
            lost_mtc: 0,
            cbr: 0,
            have_cbr: false,
            ..*t
        };
        strip(self) == strip(o)
    }

    /// A TSC packet: the full time, and recovery from earlier losses.
    pub fn tsc_packet(&mut self, tsc: u64) {
        *self = Time {
            tsc,
            base: tsc,
            have_tsc: true,
            ctc_cyc: self.ctc_cyc,
            cbr: self.cbr,
            have_cbr: self.have_cbr,
            ..Time::default()
        };
    }

    /// A CBR packet (the core:bus ratio).
    pub fn cbr_packet(&mut self, ratio: u8) -> Result<(), TimeError> {
        if ratio == 0 {
            return Err(TimeError::BadPacket);
        }
        self.have_cbr = true;
        self.cbr = ratio;
        Ok(())
    }

    /// A TMA packet: the CTC and the fast counter at the TSC before it. With all the CTC
    /// bits an MTC has, it serves as the first MTC; otherwise the next MTC supplies the
    /// bits above it.
    pub fn tma_packet(&mut self, ctc: u16, fc: u16, cfg: &TimeCfg) -> Result<(), TimeError> {
        if !self.have_tsc || self.have_tma {
            return Err(TimeError::BadContext);
        }
        if self.have_mtc {
            return Err(TimeError::Internal);
        }
        let Some(bits) = cfg.mtc_bits() else {
            return Err(TimeError::BadConfig);
        };
        self.have_tma = true;
        self.base = self.base.wrapping_sub(u64::from(fc));
        self.fc = self.fc.wrapping_add(u64::from(fc));
        if bits <= TMA_CTC_BITS {
            self.have_mtc = true;
        }
        self.ctc = u32::from(ctc) & ((1 << bits) - 1);
        self.ctc_cyc = self.ctc;
        Ok(())
    }

    /// An MTC packet: the time moves on by the CTC ticks since the last MTC or TMA. MTCs
    /// between a TSC and its TMA do not count; the first MTC without a TMA before it only
    /// starts the count.
    pub fn mtc_packet(&mut self, payload: u8, cfg: &TimeCfg) -> Result<(), TimeError> {
        let (had_tsc, had_tma, had_mtc) = (self.have_tsc, self.have_tma, self.have_mtc);
        if had_tsc && !had_tma {
            return Ok(());
        }
        let mut last = self.ctc;
        let ctc = mtc_ctc(payload, cfg);
        // Where the fast counter would have been reset: the next CYC's cycles count from
        // here.
        if self.fc != 0 || self.lost_cyc != 0 || !had_mtc {
            self.ctc_cyc = ctc;
        }
        self.have_mtc = true;
        self.fc = 0;
        self.ctc = ctc;
        self.lost_cyc = 0;
        if !had_mtc {
            if !had_tma {
                return Ok(());
            }
            // The first MTC after a TMA that held too few CTC bits: the bits above the
            // TMA's are this MTC's, one TMA period back where its low bits are below the
            // TMA's (no MTC lost around the TMA assumed).
            if last & !TMA_CTC_MASK != 0 {
                return Err(TimeError::Internal);
            }
            let mut high = ctc & !TMA_CTC_MASK;
            if ctc & TMA_CTC_MASK < last {
                high = high.wrapping_sub(1 << TMA_CTC_BITS)
                    & 0xffu32.checked_shl(u32::from(cfg.mtc_freq)).unwrap_or(0);
            }
            last |= high;
        }
        let delta = match ctc_delta(ctc, last, cfg) {
            Ok(d) => d,
            Err(e) => {
                self.lost_mtc = self.lost_mtc.wrapping_add(1);
                return Err(e);
            }
        };
        let ticks = ctc_to_fc(u64::from(delta), cfg)?;
        self.base = self.base.wrapping_add(ticks);
        self.tsc = self.base;
        Ok(())
    }

    /// A CYC packet of `cyc` core cycles, with the calibration `fcr` (0: none yet, the
    /// CYC is lost). The first CYC after an MTC whose cycles began in an earlier MTC
    /// period counts only those of the current one (the earlier periods' estimated by the
    /// ratio; all of them, where it has fewer).
    pub fn cyc_packet(&mut self, cyc: u64, cfg: &TimeCfg, fcr: u64) -> Result<(), TimeError> {
        if fcr == 0 {
            self.lost_cyc = self.lost_cyc.wrapping_add(1);
            return Ok(());
        }
        let mut cyc = cyc;
        if self.fc == 0 && self.ctc != self.ctc_cyc {
            let delta = ctc_delta(self.ctc, self.ctc_cyc, cfg)?;
            let fc = ctc_to_fc(u64::from(delta), cfg)?;
            let old = (fc << FCR_SHIFT) / fcr;
            cyc = cyc.max(old) - old;
        }
        self.fc = self.fc.wrapping_add(cyc.wrapping_mul(fcr) >> FCR_SHIFT);
        self.tsc = self.base.wrapping_add(self.fc);
        Ok(())
    }
}

/// The calibration of cycle-accurate time (libipt's `struct pt_time_cal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    fcr: u64,
    /// The range of the ratios set (empty: never set).
    min_fcr: u64,
    max_fcr: u64,
    /// The last TSC, and the cycles since it.
    tsc: u64,
    cyc_tsc: u64,
    /// The CTC of the MTC the count started at, and the cycles since.
    ctc: u32,
    cyc_mtc: u64,
    /// MTCs that did not calibrate since the last one that did.
    lost_mtc: u32,
    have_mtc: bool,
    /// A PSB came on a CPU with SKL168: the next MTC checks for its lost cycles.
    check_skl168: bool,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            fcr: 0,
            min_fcr: u64::MAX,
            max_fcr: 0,
            tsc: 0,
            cyc_tsc: 0,
            ctc: 0,
            cyc_mtc: 0,
            lost_mtc: 0,
            have_mtc: false,
            check_skl168: false,
        }
    }
}

impl Calibration {
    /// The ratio, `None` before any calibration (libipt's `pte_no_time`).
    pub fn fcr(&self) -> Option<u64> {
        (self.min_fcr <= self.max_fcr).then_some(self.fcr)
    }

    /// What shows in times from here on: the ratio and the state the next calibrations
    /// start from (not the ratio's range, which only says whether it was ever set, nor
    /// the count of MTCs lost): two calibrations equal in it give the same times.
    pub fn same_course(&self, o: &Calibration) -> bool {
        let key = |c: &Calibration| {
            (
                c.fcr().unwrap_or(0),
                c.tsc,
                c.cyc_tsc,
                c.cyc_mtc,
                c.ctc,
                c.have_mtc,
                c.check_skl168,
            )
        };
        key(self) == key(o)
    }

    fn set_fcr(&mut self, fcr: u64) {
        self.fcr = fcr;
        self.min_fcr = self.min_fcr.min(fcr);
        self.max_fcr = self.max_fcr.max(fcr);
    }

    /// A PSB: on a CPU with SKL168 the next MTC is checked for lost cycles.
    pub fn psb(&mut self, cfg: &TimeCfg) {
        if cfg.skl168 {
            self.check_skl168 = true;
        }
    }

    /// A TSC outside PSB+ (it may follow lost time): kept for the next PSB+'s TSC, not
    /// used to calibrate.
    pub fn tsc_packet(&mut self, tsc: u64) {
        self.tsc = tsc;
        self.cyc_tsc = 0;
    }

    /// A TSC in PSB+: calibrates from the cycles since the last TSC, where no MTC came.
    pub fn header_tsc(&mut self, tsc: u64) -> Result<(), TimeError> {
        let (last, cyc) = (self.tsc, self.cyc_tsc);
        self.tsc = tsc;
        self.cyc_tsc = 0;
        if last == 0 || cyc == 0 || self.have_mtc {
            return Ok(());
        }
        let mut t = tsc;
        if t < last {
            t = t.wrapping_add(1 << TSC_BITS);
            if t < last {
                return Err(TimeError::BadPacket);
            }
        }
        let delta = t - last;
        if delta & !(u64::MAX >> FCR_SHIFT) != 0 {
            return Err(TimeError::Internal);
        }
        self.set_fcr((delta << FCR_SHIFT) / cyc);
        Ok(())
    }

    /// A CBR outside PSB+ (a frequency change): calibration starts over from it.
    pub fn cbr_packet(&mut self, ratio: u8, cfg: &TimeCfg) -> Result<(), TimeError> {
        *self = Calibration::default();
        self.header_cbr(ratio, cfg)
    }

    /// A CBR in PSB+: with the nominal frequency known, it gives the ratio.
    pub fn header_cbr(&mut self, ratio: u8, cfg: &TimeCfg) -> Result<(), TimeError> {
        if cfg.nom_freq == 0 {
            return Ok(());
        }
        if ratio == 0 {
            return Err(TimeError::BadPacket);
        }
        self.set_fcr((u64::from(cfg.nom_freq) << FCR_SHIFT) / u64::from(ratio));
        Ok(())
    }

    /// An MTC: the ratio of the CTC ticks (in fast-counter ticks) to the cycles counted
    /// since the last MTC; without cycles the next MTC calibrates over both periods.
    pub fn mtc_packet(&mut self, payload: u8, cfg: &TimeCfg) -> Result<(), TimeError> {
        let (last, cyc, check_skl168) = (self.ctc, self.cyc_mtc, self.check_skl168);
        self.check_skl168 = false;
        let ctc = mtc_ctc(payload, cfg);
        if !self.have_mtc {
            self.cyc_mtc = 0;
            self.ctc = ctc;
            self.have_mtc = true;
            return Ok(());
        }
        if cyc == 0 {
            return Ok(());
        }
        self.cyc_mtc = 0;
        self.ctc = ctc;
        // Counted as lost until it calibrates.
        self.lost_mtc = self.lost_mtc.wrapping_add(1);
        let delta = ctc_delta(ctc, last, cfg)?;
        let fc = ctc_to_fc(u64::from(delta), cfg)?;
        if fc & !(u64::MAX >> FCR_SHIFT) != 0 {
            return Err(TimeError::Internal);
        }
        let fcr = (fc << FCR_SHIFT) / cyc;
        if check_skl168 && self.skl168_hit(delta, fc, cyc, cfg) {
            return Ok(());
        }
        self.set_fcr(fcr);
        self.lost_mtc = 0;
        Ok(())
    }

    /// SKL168 (CYC packets dropped right before a PSB): whether the first MTC after a PSB
    /// must not calibrate: MTCs were lost since the PSB, or (at MTC frequencies below 10,
    /// with a ratio known) the cycles look short by a lost 4096-cycle wrap CYC.
    fn skl168_hit(&self, ctc_delta: u32, fc: u64, cyc: u64, cfg: &TimeCfg) -> bool {
        if 1u64 << cfg.mtc_freq.min(63) < u64::from(ctc_delta) {
            return true;
        }
        match self.fcr() {
            // (A little under the 4096 cycles of a wrap, for the usual variation.)
            Some(fcr) if cfg.mtc_freq < 10 => {
                (fcr.wrapping_mul(cyc.wrapping_add(0xf00)) >> FCR_SHIFT) < fc
            }
            _ => false,
        }
    }

    /// A CYC packet: its cycles count toward the next calibration.
    pub fn cyc_packet(&mut self, cyc: u64) {
        self.cyc_mtc = self.cyc_mtc.wrapping_add(cyc);
        self.cyc_tsc = self.cyc_tsc.wrapping_add(cyc);
    }

    /// An OVF where the ratio is kept (ptdump's `--keep-tcal-on-ovf`): the counts start
    /// over.
    pub fn ovf_keeping_ratio(&mut self) {
        self.tsc = 0;
        self.cyc_tsc = 0;
        self.cyc_mtc = 0;
        self.ctc = 0;
        self.have_mtc = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mtc_freq: u8, eax: u32, ebx: u32) -> TimeCfg {
        TimeCfg {
            mtc_freq,
            cpuid_0x15_eax: eax,
            cpuid_0x15_ebx: ebx,
            ..Default::default()
        }
    }

    #[test]
    fn time_follows_tsc_tma_and_mtc() {
        let c = cfg(2, 1, 3);
        let mut t = Time::default();
        assert_eq!(t.tsc(), Err(0));
        // An MTC before any TSC or TMA: nothing to measure from.
        t.mtc_packet(7, &c).unwrap();
        assert_eq!(t.tsc(), Err(0));
        t.tsc_packet(1000);
        // MTCs between a TSC and its TMA do not count.
        t.mtc_packet(9, &c).unwrap();
        assert_eq!(t.tsc(), Ok(1000));
        // TMA: CTC 0x10 at the TSC, 5 fast-counter ticks after the CTC tick; 10 CTC
        // bits per MTC fit in TMA's 16, so it serves as the first MTC.
        t.tma_packet(0x10, 5, &c).unwrap();
        assert_eq!(t.tsc(), Ok(1000));
        assert_eq!(t.tma_packet(0x10, 5, &c), Err(TimeError::BadContext));
        // MTC payload 5: CTC 0x14, 4 ticks on from 0x10, 3 TSC ticks each, from the CTC
        // tick before the TSC (1000 - 5).
        t.mtc_packet(5, &c).unwrap();
        assert_eq!(t.tsc(), Ok(995 + 12));
        // Payload 3 (CTC 0x0c): wrapped once (10 bits): 0x400 + 0x0c - 0x14 ticks.
        t.mtc_packet(3, &c).unwrap();
        assert_eq!(t.tsc(), Ok(1007 + (0x400 + 0x0c - 0x14) * 3));
        // Without the ratio: libipt's configuration error, the time where it was.
        let before = t.tsc();
        assert_eq!(t.mtc_packet(4, &cfg(2, 1, 0)), Err(TimeError::BadConfig));
        assert_eq!(t.tsc(), before);

        // 17 CTC bits per MTC (mtc_freq 9): the first MTC after the TMA takes the bits
        // above TMA's 16 from its own, one period back when its low bits are smaller.
        let c9 = cfg(9, 1, 3);
        let mut t = Time::default();
        t.tsc_packet(5000);
        t.tma_packet(0xff00, 0, &c9).unwrap();
        // Payload 0x81: CTC 0x10200; low 16 bits 0x0200 < 0xff00: the TMA was at
        // 0x0ff00, 0x300 ticks before.
        t.mtc_packet(0x81, &c9).unwrap();
        assert_eq!(t.tsc(), Ok(5000 + 0x300 * 3));
        // A TMA before any TSC.
        assert_eq!(
            Time::default().tma_packet(1, 1, &c9),
            Err(TimeError::BadContext)
        );
    }

    #[test]
    fn cycles_move_the_time_by_the_calibrated_ratio() {
        // One CTC tick = 4 TSC ticks; MTC every 2^4 CTC ticks.
        let c = cfg(4, 1, 4);
        let (mut t, mut cal) = (Time::default(), Calibration::default());
        t.tsc_packet(0x1000);
        t.tma_packet(0x10, 0, &c).unwrap();
        cal.mtc_packet(1, &c).unwrap();
        assert_eq!(cal.fcr(), None);
        // No calibration yet: the CYC is lost.
        cal.cyc_packet(32);
        t.cyc_packet(32, &c, 0).unwrap();
        assert_eq!(t.tsc(), Ok(0x1000));
        // MTC 2: 16 CTC ticks = 64 TSC ticks over the 32 cycles: ratio 2.0.
        cal.mtc_packet(2, &c).unwrap();
        assert_eq!(cal.fcr(), Some(2 << FCR_SHIFT));
        t.mtc_packet(2, &c).unwrap();
        assert_eq!(t.tsc(), Ok(0x1000 + 16 * 4));
        // 10 cycles on: 20 TSC ticks.
        cal.cyc_packet(10);
        t.cyc_packet(10, &c, cal.fcr().unwrap()).unwrap();
        assert_eq!(t.tsc(), Ok(0x1000 + 64 + 20));
        // A CBR with the nominal frequency 4 and ratio 8: 0.5 per cycle.
        let nom = TimeCfg { nom_freq: 4, ..c };
        cal.cbr_packet(8, &nom).unwrap();
        assert_eq!(cal.fcr(), Some(1 << (FCR_SHIFT - 1)));
        assert_eq!(cal.header_cbr(0, &nom), Err(TimeError::BadPacket));
    }

    #[test]
    fn a_header_tsc_calibrates_where_no_mtc_came() {
        let mut cal = Calibration::default();
        cal.header_tsc(1000).unwrap();
        cal.cyc_packet(100);
        cal.cyc_packet(100);
        cal.header_tsc(1500).unwrap();
        // 500 TSC ticks over 200 cycles.
        assert_eq!(cal.fcr(), Some((500 << FCR_SHIFT) / 200));
        // A TSC that wrapped twice.
        cal.cyc_packet(1);
        assert_eq!(cal.header_tsc(10), Ok(()));
        cal.cyc_packet(1);
        cal.tsc_packet(1 << 57);
        cal.cyc_packet(1);
        assert_eq!(cal.header_tsc(5), Err(TimeError::BadPacket));
    }

    #[test]
    fn skl168_skips_the_first_mtc_after_a_psb_when_mtcs_were_lost() {
        let c = TimeCfg {
            skl168: true,
            ..cfg(4, 1, 4)
        };
        let mut cal = Calibration::default();
        cal.mtc_packet(1, &c).unwrap();
        cal.cyc_packet(32);
        cal.mtc_packet(2, &c).unwrap();
        assert_eq!(cal.fcr(), Some(2 << FCR_SHIFT));
        // After a PSB, an MTC two periods on (one lost) does not calibrate.
        cal.psb(&c);
        cal.cyc_packet(100);
        cal.mtc_packet(4, &c).unwrap();
        assert_eq!(cal.fcr(), Some(2 << FCR_SHIFT));
        assert_eq!(cal.lost_mtc, 1);
        // The next one does (check only once): 16 CTC = 64 TSC over 16 cycles.
        cal.cyc_packet(16);
        cal.mtc_packet(5, &c).unwrap();
        assert_eq!(cal.fcr(), Some(4 << FCR_SHIFT));
        assert_eq!(cal.lost_mtc, 0);
    }
}
