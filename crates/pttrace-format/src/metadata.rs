//! Trace metadata: the CPU identity and the TSC <-> perf-time conversion a decoder needs.
//!
//! [`PtMetadata`] is byte-for-byte DynamoRIO's packed 18-byte `pt_metadata_t`.
//! [`ExtMetadata`] adds what libipt also wants (cpuid leaf 0x15, nominal and MTC
//! frequencies), plus how the trace was captured (backend, perf type/config).

use raw_cpuid::CpuId;

/// DynamoRIO's `pt_metadata_t`: packed, little-endian, 18 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, packed)]
pub struct PtMetadata {
    pub cpu_family: u16,
    pub cpu_model: u8,
    pub cpu_stepping: u8,
    pub time_shift: u16,
    pub time_mult: u32,
    pub time_zero: u64,
}

/// Size of the packed [`PtMetadata`] on disk and in memory.
pub const PT_METADATA_SIZE: usize = 18;

impl PtMetadata {
    /// The 18-byte little-endian encoding used by DynamoRIO's files.
    pub fn to_bytes(&self) -> [u8; PT_METADATA_SIZE] {
        let mut b = [0u8; PT_METADATA_SIZE];
        // Copy out of the packed struct before borrowing the fields.
        let (fam, model, step, shift, mult, zero) = (
            self.cpu_family,
            self.cpu_model,
            self.cpu_stepping,
            self.time_shift,
            self.time_mult,
            self.time_zero,
        );
        b[0..2].copy_from_slice(&fam.to_le_bytes());
        b[2] = model;
        b[3] = step;
        b[4..6].copy_from_slice(&shift.to_le_bytes());
        b[6..10].copy_from_slice(&mult.to_le_bytes());
        b[10..18].copy_from_slice(&zero.to_le_bytes());
        b
    }

    /// Parses the 18-byte encoding; `None` when `b` is shorter than 18 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; PT_METADATA_SIZE] = b.get(..PT_METADATA_SIZE)?.try_into().ok()?;
        Some(PtMetadata {
            cpu_family: u16::from_le_bytes([b[0], b[1]]),
            cpu_model: b[2],
            cpu_stepping: b[3],
            time_shift: u16::from_le_bytes([b[4], b[5]]),
            time_mult: u32::from_le_bytes([b[6], b[7], b[8], b[9]]),
            time_zero: u64::from_le_bytes([b[10], b[11], b[12], b[13], b[14], b[15], b[16], b[17]]),
        })
    }

    /// Converts a TSC value to perf time (ns) with this metadata's conversion parameters.
    pub fn tsc_to_perf_time(&self, tsc: u64) -> u64 {
        let conv = TimeConv {
            time_shift: self.time_shift,
            time_mult: self.time_mult,
            time_zero: self.time_zero,
        };
        conv.tsc_to_perf_time(tsc)
    }
}

/// The TSC <-> perf time conversion published in `perf_event_mmap_page`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeConv {
    pub time_shift: u16,
    pub time_mult: u32,
    pub time_zero: u64,
}

impl TimeConv {
    /// `time_zero + (tsc >> shift) * mult + (((tsc & mask) * mult) >> shift)`, wrapping.
    pub fn tsc_to_perf_time(&self, tsc: u64) -> u64 {
        let shift = u32::from(self.time_shift).min(63);
        let mult = u64::from(self.time_mult);
        let quot = tsc >> shift;
        let rem = tsc & ((1u64 << shift) - 1);
        self.time_zero
            .wrapping_add(quot.wrapping_mul(mult))
            .wrapping_add(rem.wrapping_mul(mult) >> shift)
    }

    /// Inverse of [`tsc_to_perf_time`](Self::tsc_to_perf_time) (exact up to rounding).
    pub fn perf_time_to_tsc(&self, time: u64) -> u64 {
        if self.time_mult == 0 {
            return 0;
        }
        let t = u128::from(time.wrapping_sub(self.time_zero));
        let shift = u32::from(self.time_shift).min(63);
        ((t << shift) / u128::from(self.time_mult)) as u64
    }
}

/// Which capture backend produced a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BackendKind {
    /// perf_event_open on the `intel_pt` PMU.
    Hardware = 0,
    /// Software single-stepping that emits genuine PT packets.
    Emulated = 1,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Hardware => "hardware",
            BackendKind::Emulated => "emulated",
        }
    }
}

/// Everything a decoder needs beyond [`PtMetadata`], plus how the trace was captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtMetadata {
    pub base: PtMetadata,
    pub cpuid_0x15_eax: u32,
    pub cpuid_0x15_ebx: u32,
    /// Nominal (max non-turbo) frequency ratio, `max_nonturbo_ratio` in sysfs.
    pub nom_freq: u8,
    /// MTC frequency (the `mtc_period` config value).
    pub mtc_freq: u8,
    /// Whether the time conversion is valid: the kernel published it (`cap_user_time_zero`)
    /// or the emulated backend measured it against kernel record timestamps.
    pub time_zero_valid: bool,
    pub backend: BackendKind,
    /// `perf_event_attr.type` and `.config` of the PT event (0 for the emulated backend).
    pub perf_type: u32,
    pub perf_config: u64,
    /// `sample_type` of the sideband records (their sample_id trailers).
    pub sideband_sample_type: u64,
}

/// Size of the `Metadata` record of a process info file (see [`crate::ptt`]).
pub const METADATA_RECORD_SIZE: usize = 50;

impl ExtMetadata {
    /// The `Metadata` record of a process info file.
    pub fn record_bytes(&self) -> [u8; METADATA_RECORD_SIZE] {
        self.record_bytes_with_backend(self.backend as u32 as u8)
    }

    /// The `Metadata` record with another backend byte (the QEMU plugin's, which is not a
    /// handle backend).
    pub fn record_bytes_with_backend(&self, backend: u8) -> [u8; METADATA_RECORD_SIZE] {
        let mut b = [0u8; METADATA_RECORD_SIZE];
        b[0..18].copy_from_slice(&self.base.to_bytes());
        b[18..22].copy_from_slice(&self.cpuid_0x15_eax.to_le_bytes());
        b[22..26].copy_from_slice(&self.cpuid_0x15_ebx.to_le_bytes());
        b[26] = self.nom_freq;
        b[27] = self.mtc_freq;
        b[28] = u8::from(self.time_zero_valid);
        b[29] = backend;
        b[30..34].copy_from_slice(&self.perf_type.to_le_bytes());
        b[34..42].copy_from_slice(&self.perf_config.to_le_bytes());
        b[42..50].copy_from_slice(&self.sideband_sample_type.to_le_bytes());
        b
    }

    /// Metadata for traces of this CPU captured by `backend`: CPU identity and cpuid 0x15
    /// from cpuid, the time conversion `conv` (None: not known), no PT event parameters
    /// (set `perf_type`, `perf_config`, `nom_freq`, `mtc_freq` where there is one).
    pub fn for_this_cpu(backend: BackendKind, conv: Option<TimeConv>) -> ExtMetadata {
        let (cpu_family, cpu_model, cpu_stepping) = cpu_identity();
        let (cpuid_0x15_eax, cpuid_0x15_ebx) = cpuid_0x15();
        let tc = conv.unwrap_or_default();
        ExtMetadata {
            base: PtMetadata {
                cpu_family,
                cpu_model,
                cpu_stepping,
                time_shift: tc.time_shift,
                time_mult: tc.time_mult,
                time_zero: tc.time_zero,
            },
            cpuid_0x15_eax,
            cpuid_0x15_ebx,
            nom_freq: 0,
            mtc_freq: 0,
            time_zero_valid: conv.is_some(),
            backend,
            perf_type: 0,
            perf_config: 0,
            sideband_sample_type: crate::perf_record::SIDEBAND_SAMPLE_TYPE,
        }
    }
}

/// The CPU's family/model/stepping computed the way the kernel and `/proc/cpuinfo` do.
pub fn cpu_identity() -> (u16, u8, u8) {
    let cpuid = CpuId::new();
    match cpuid.get_feature_info() {
        Some(fi) => {
            let base_family = u16::from(fi.base_family_id());
            let family = if base_family == 0xf {
                base_family + u16::from(fi.extended_family_id())
            } else {
                base_family
            };
            let mut model = fi.base_model_id();
            if base_family == 0x6 || base_family == 0xf {
                model |= fi.extended_model_id() << 4;
            }
            (family, model, fi.stepping_id())
        }
        None => (0, 0, 0),
    }
}

/// cpuid leaf 0x15 (TSC / core crystal clock ratio): (eax, ebx), zeros when absent.
pub fn cpuid_0x15() -> (u32, u32) {
    let cpuid = CpuId::new();
    match cpuid.get_tsc_info() {
        Some(t) => (t.denominator(), t.numerator()),
        None => (0, 0),
    }
}

/// Whether this CPU advertises Intel PT in cpuid leaf 7 (EBX bit 25).
pub fn cpu_has_intel_pt() -> bool {
    CpuId::new()
        .get_extended_feature_info()
        .is_some_and(|f| f.has_processor_trace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_record_layout() {
        let m = ExtMetadata {
            base: PtMetadata {
                cpu_family: 6,
                cpu_model: 0x8f,
                cpu_stepping: 8,
                time_shift: 10,
                time_mult: 0x1234,
                time_zero: 0x1122_3344_5566_7788,
            },
            cpuid_0x15_eax: 2,
            cpuid_0x15_ebx: 0x9c,
            nom_freq: 0x1f,
            mtc_freq: 3,
            time_zero_valid: true,
            backend: BackendKind::Emulated,
            perf_type: 9,
            perf_config: 0x300e601,
            sideband_sample_type: 0x10086,
        };
        let b = m.record_bytes();
        assert_eq!(&b[..18], &m.base.to_bytes());
        assert_eq!(&b[18..26], &[2, 0, 0, 0, 0x9c, 0, 0, 0]);
        assert_eq!(&b[26..30], &[0x1f, 3, 1, 1]);
        assert_eq!(&b[30..34], &9u32.to_le_bytes());
        assert_eq!(&b[34..42], &0x300e601u64.to_le_bytes());
        assert_eq!(&b[42..50], &0x10086u64.to_le_bytes());
        assert_eq!(m.record_bytes_with_backend(2)[29], 2);
    }

    #[test]
    fn pt_metadata_is_18_packed_bytes() {
        assert_eq!(std::mem::size_of::<PtMetadata>(), 18);
        assert_eq!(std::mem::align_of::<PtMetadata>(), 1);
        let m = PtMetadata {
            cpu_family: 0x0106,
            cpu_model: 0x55,
            cpu_stepping: 7,
            time_shift: 31,
            time_mult: 0x1122_3344,
            time_zero: 0x0102_0304_0506_0708,
        };
        let b = m.to_bytes();
        assert_eq!(
            b,
            [0x06, 0x01, 0x55, 7, 31, 0, 0x44, 0x33, 0x22, 0x11, 8, 7, 6, 5, 4, 3, 2, 1]
        );
        // The in-memory layout is the on-disk layout.
        // SAFETY: PtMetadata is repr(C, packed) plain data of exactly 18 bytes.
        let raw: [u8; 18] = unsafe { std::mem::transmute(m) };
        assert_eq!(raw, b);
        assert_eq!(PtMetadata::from_bytes(&b), Some(m));
        assert_eq!(PtMetadata::from_bytes(&b[..17]), None);
    }

    #[test]
    fn tsc_conversion_matches_formula_and_inverts() {
        let c = TimeConv {
            time_shift: 31,
            time_mult: 1_431_655_765, // 2/3 ns per cycle (3 GHz)
            time_zero: 1_000,
        };
        let tsc = 3_000_000_000u64;
        let t = c.tsc_to_perf_time(tsc);
        let expect =
            1_000 + (tsc >> 31) * 1_431_655_765 + (((tsc & ((1 << 31) - 1)) * 1_431_655_765) >> 31);
        assert_eq!(t, expect);
        let back = c.perf_time_to_tsc(t);
        assert!(back.abs_diff(tsc) <= 2, "{back} vs {tsc}");
    }

    #[test]
    fn family_model_stepping_match_proc_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("read /proc/cpuinfo");
        let field = |name: &str| -> u32 {
            info.lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no '{name}' in /proc/cpuinfo"))
        };
        let (fam, model, step) = cpu_identity();
        assert_eq!(u32::from(fam), field("cpu family"));
        assert_eq!(u32::from(model), field("model"));
        assert_eq!(u32::from(step), field("stepping"));
    }
}
