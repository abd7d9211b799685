//! CPU and timing parameters -> libipt's `pt_config` (with the CPU's errata applied).

use pttrace_format::metadata::{ExtMetadata, PtMetadata, TimeConv};

/// What libipt needs to know about the CPU that recorded a trace (REFERENCE §3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuParams {
    /// Family/model/stepping; all zero = unknown CPU (no errata workarounds).
    pub family: u16,
    pub model: u8,
    pub stepping: u8,
    /// The `mtc_period` config value of the PT event.
    pub mtc_freq: u8,
    /// Nominal (max non-turbo) frequency ratio.
    pub nom_freq: u8,
    /// cpuid leaf 0x15 eax/ebx (TSC / core crystal clock ratio).
    pub cpuid_0x15_eax: u32,
    pub cpuid_0x15_ebx: u32,
}

impl CpuParams {
    /// CPU identity from DynamoRIO's 18-byte metadata (no MTC/nominal frequency there).
    pub fn from_pt_metadata(m: &PtMetadata) -> Self {
        let (family, model, stepping) = (m.cpu_family, m.cpu_model, m.cpu_stepping);
        CpuParams {
            family,
            model,
            stepping,
            ..Default::default()
        }
    }

    /// Everything from the extended metadata.
    pub fn from_ext_metadata(m: &ExtMetadata) -> Self {
        CpuParams {
            mtc_freq: m.mtc_freq,
            nom_freq: m.nom_freq,
            cpuid_0x15_eax: m.cpuid_0x15_eax,
            cpuid_0x15_ebx: m.cpuid_0x15_ebx,
            ..Self::from_pt_metadata(&m.base)
        }
    }

    /// Parses `FAMILY/MODEL[/STEPPING]` (decimal or 0x-hex each; stepping 0 when left out,
    /// as ptxed's `--cpu`), as the CLI's `--cpu`. Family 0 is no CPU: refused, so that a
    /// mistyped `--cpu` cannot silently turn every erratum workaround off.
    pub fn parse_cpu(s: &str) -> Result<(u16, u8, u8), String> {
        let parts: Vec<&str> = s.split('/').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(format!(
                "--cpu '{s}': expected FAMILY/MODEL[/STEPPING], e.g. 6/85/7 or 6/92"
            ));
        }
        let num = |p: &str| -> Result<u64, String> {
            let p = p.trim();
            let r = match p.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => p.parse(),
            };
            r.map_err(|_| format!("--cpu '{s}': '{p}' is not a number"))
        };
        let st = match parts.get(2) {
            Some(p) => num(p)?,
            None => 0,
        };
        let (f, m) = (num(parts[0])?, num(parts[1])?);
        let f = u16::try_from(f).map_err(|_| format!("--cpu '{s}': family {f} > 65535"))?;
        let m = u8::try_from(m).map_err(|_| format!("--cpu '{s}': model {m} > 255"))?;
        let st = u8::try_from(st).map_err(|_| format!("--cpu '{s}': stepping {st} > 255"))?;
        if f == 0 {
            return Err(format!(
                "--cpu '{s}': family 0 is no CPU; give the family/model of the machine that \
                 recorded the trace (/proc/cpuinfo there: 'cpu family'/'model'), e.g. 6/85"
            ));
        }
        Ok((f, m, st))
    }

    /// A warning when no Intel processor with PT has this family (6, and 18/19 for newer
    /// cores), or when the model is in no erratum list this decoder has (libipt 2.1.2's
    /// and [`newer_errata`]'s): no erratum workaround is applied then (ptxed reports the
    /// latter as a configuration error and decodes on, too).
    pub fn cpu_warning(family: u16, model: u8) -> Option<String> {
        if !matches!(family, 6 | 18 | 19) {
            return Some(format!(
                "CPU family {family} (model {model}) has no Intel PT processor known to this \
                 decoder (families 6, 18, 19): no erratum workarounds are applied"
            ));
        }
        let cpu = CpuParams {
            family,
            model,
            ..Default::default()
        };
        cpu.errata().is_none().then(|| {
            format!(
                "CPU {family}/{model} ({family:#x}/{model:#x}) is in no erratum list this \
                 decoder knows (libipt 2.1.2's and the newer models it adds): no erratum \
                 workarounds are applied"
            )
        })
    }

    /// libipt's errata for this CPU: libipt 2.1.2's own list, else [`newer_errata`];
    /// `None` for a CPU in neither (or family 0).
    fn errata(self) -> Option<libipt_sys::pt_errata> {
        if self.family == 0 {
            return None;
        }
        // SAFETY: pt_cpu and pt_errata are plain C structs; all-zero is valid for both.
        let (mut cpu, mut errata): (libipt_sys::pt_cpu, libipt_sys::pt_errata) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        cpu.vendor = libipt_sys::pt_cpu_vendor_pcv_intel;
        cpu.family = self.family;
        cpu.model = self.model;
        cpu.stepping = self.stepping;
        // SAFETY: both pointers are to live, properly typed locals.
        if unsafe { libipt_sys::pt_cpu_errata(&mut errata, &cpu) } >= 0 {
            return Some(errata);
        }
        newer_errata(self.family, self.model)
    }

    /// Builds libipt's configuration (without a trace buffer), errata derived from the CPU.
    pub(crate) fn to_pt_config(self) -> libipt_sys::pt_config {
        // SAFETY: pt_config is a plain C struct for which all-zero is the documented
        // "no options" value (libipt's pt_config_init does exactly this).
        let mut cfg: libipt_sys::pt_config = unsafe { std::mem::zeroed() };
        cfg.size = std::mem::size_of::<libipt_sys::pt_config>();
        if self.family != 0 {
            cfg.cpu.vendor = libipt_sys::pt_cpu_vendor_pcv_intel;
            cfg.cpu.family = self.family;
            cfg.cpu.model = self.model;
            cfg.cpu.stepping = self.stepping;
            // (An unknown CPU: zeroed errata = no workarounds; `cpu_warning` says so.)
            if let Some(errata) = self.errata() {
                cfg.errata = errata;
            }
        }
        cfg.mtc_freq = self.mtc_freq;
        cfg.nom_freq = self.nom_freq;
        cfg.cpuid_0x15_eax = self.cpuid_0x15_eax;
        cfg.cpuid_0x15_ebx = self.cpuid_0x15_ebx;
        cfg
    }
}

/// Errata of processors newer than libipt 2.1.2's list, as libipt's later lists
/// (`pt_cpu_errata`) give them, for the errata 2.1.2's `pt_errata` can express (all of
/// them): family 6 model 0xd5 and family 18 (0x12) models 1 and 3 have BDM70, SKD022 and
/// APL11.
fn newer_errata(family: u16, model: u8) -> Option<libipt_sys::pt_errata> {
    match (family, model) {
        (6, 0xd5) | (0x12, 0x01 | 0x03) => {
            // SAFETY: pt_errata is a plain C bit-field struct; all-zero = no errata.
            let mut e: libipt_sys::pt_errata = unsafe { std::mem::zeroed() };
            e.set_bdm70(1);
            e.set_skd022(1);
            e.set_apl11(1);
            Some(e)
        }
        _ => None,
    }
}

/// The address filters the trace was captured with (IA32_RTIT_CTL's ADDRn_CFG and the
/// IA32_RTIT_ADDRn_A/B ranges, n = 0..3). libipt needs them where erratum SKL014 lets a
/// TIP.PGD lose its IP on a direct branch out of a filtered range: the branch whose target
/// lies outside the filters is where tracing stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddrFilter {
    /// Per range: (cfg: 0 off, 1 filter = trace inside, 2 stop = stop inside, a, b).
    pub ranges: [(u8, u64, u64); 4],
}

impl AddrFilter {
    /// Sets the range a CLI `--filter [N:]CFG,A,B` names (N 0..3, default 0; CFG `off`,
    /// `filter`, `stop` or 0/1/2; A and B decimal or 0x-hex, A <= B).
    pub fn set(&mut self, spec: &str) -> Result<(), String> {
        let bad = |what: &str| format!("--filter '{spec}': {what}");
        let (n, rest) = match spec.split_once(':') {
            Some((n, r)) => (
                n.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n < 4)
                    .ok_or_else(|| bad("the range number is 0, 1, 2 or 3"))?,
                r,
            ),
            None => (0, spec),
        };
        let v: Vec<&str> = rest.split(',').map(str::trim).collect();
        let [cfg, a, b] = v[..] else {
            return Err(bad("expected [N:]CFG,A,B, e.g. 0:filter,0x401000,0x401fff"));
        };
        let cfg = match cfg {
            "off" | "0" => 0,
            "filter" | "1" => 1,
            "stop" | "2" => 2,
            _ => return Err(bad("CFG is off, filter or stop")),
        };
        let num = |t: &str| -> Result<u64, String> {
            match t.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            }
            .map_err(|_| bad(&format!("'{t}' is not an address")))
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(bad("A is above B"));
        }
        self.ranges[n] = (cfg, a, b);
        Ok(())
    }

    fn apply(&self, cfg: &mut libipt_sys::pt_config) {
        let mut bits = 0u64;
        for (n, (c, _, _)) in self.ranges.iter().enumerate() {
            bits |= u64::from(*c & 0xf) << (4 * n);
        }
        cfg.addr_filter.config.addr_cfg = bits;
        let f = &mut cfg.addr_filter;
        (f.addr0_a, f.addr0_b) = (self.ranges[0].1, self.ranges[0].2);
        (f.addr1_a, f.addr1_b) = (self.ranges[1].1, self.ranges[1].2);
        (f.addr2_a, f.addr2_b) = (self.ranges[2].1, self.ranges[2].2);
        (f.addr3_a, f.addr3_b) = (self.ranges[3].1, self.ranges[3].2);
    }
}

/// Everything describing one trace besides its bytes and images.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceParams {
    pub cpu: CpuParams,
    /// TSC -> perf time conversion (to order sideband records against the trace).
    pub time: Option<TimeConv>,
    /// Address filters of the capture (none by default).
    pub filter: AddrFilter,
}

impl TraceParams {
    pub fn from_pt_metadata(m: &PtMetadata) -> Self {
        let (time_shift, time_mult, time_zero) = (m.time_shift, m.time_mult, m.time_zero);
        TraceParams {
            cpu: CpuParams::from_pt_metadata(m),
            time: (time_mult != 0).then_some(TimeConv {
                time_shift,
                time_mult,
                time_zero,
            }),
            filter: AddrFilter::default(),
        }
    }

    /// libipt's configuration: the CPU's, with the address filters.
    pub(crate) fn to_pt_config(self) -> libipt_sys::pt_config {
        let mut cfg = self.cpu.to_pt_config();
        self.filter.apply(&mut cfg);
        cfg
    }

    pub fn from_ext_metadata(m: &ExtMetadata) -> Self {
        TraceParams {
            cpu: CpuParams::from_ext_metadata(m),
            ..Self::from_pt_metadata(&m.base)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_parse_and_errata() {
        assert_eq!(CpuParams::parse_cpu("6/0x9e/11"), Ok((6, 0x9e, 11)));
        assert!(CpuParams::parse_cpu("6/300/1").is_err());
        // Without a stepping, as ptxed takes it.
        assert_eq!(CpuParams::parse_cpu("6/92"), Ok((6, 92, 0)));
        assert!(CpuParams::parse_cpu("6").is_err());
        assert!(CpuParams::parse_cpu("6/1/2/3").is_err());
        let e = CpuParams::parse_cpu("0/0/0").unwrap_err();
        assert!(e.starts_with("--cpu '0/0/0': family 0 is no CPU"), "{e}");
        assert_eq!(CpuParams::cpu_warning(6, 85), None);
        assert!(CpuParams::cpu_warning(25, 1)
            .unwrap()
            .starts_with("CPU family 25 (model 1) has no Intel PT processor"));
        let c = CpuParams {
            family: 6,
            model: 0x9e,
            stepping: 11,
            ..Default::default()
        };
        let cfg = c.to_pt_config();
        // Kaby Lake has SKD007 and SKD022 (same facts libipt's own tests assert).
        assert_eq!(cfg.errata.skd007(), 1);
        assert_eq!(cfg.errata.skd022(), 1);
        let unknown = CpuParams::default().to_pt_config();
        assert_eq!(unknown.errata.skd007(), 0);
    }

    /// The names of the errata `to_pt_config` sets for CPU (family, model).
    fn errata_set(c: (u16, u8)) -> Vec<&'static str> {
        let e = CpuParams {
            family: c.0,
            model: c.1,
            ..Default::default()
        }
        .to_pt_config()
        .errata;
        [
            ("bdm70", e.bdm70()),
            ("bdm64", e.bdm64()),
            ("skd007", e.skd007()),
            ("skd022", e.skd022()),
            ("skd010", e.skd010()),
            ("skl014", e.skl014()),
            ("apl12", e.apl12()),
            ("apl11", e.apl11()),
            ("skl168", e.skl168()),
            ("skz84", e.skz84()),
        ]
        .into_iter()
        .filter(|(_, v)| *v != 0)
        .map(|(n, _)| n)
        .collect()
    }

    #[test]
    fn newer_cpus_get_their_errata_unknown_ones_a_warning() {
        // Newer than libipt 2.1.2's list (facts from libipt's later list).
        for cpu in [(6, 0xd5), (18, 1), (18, 3)] {
            // SAFETY: plain C structs, all-zero valid; pointers to live locals.
            let known = unsafe {
                let mut c: libipt_sys::pt_cpu = std::mem::zeroed();
                let mut e: libipt_sys::pt_errata = std::mem::zeroed();
                c.vendor = libipt_sys::pt_cpu_vendor_pcv_intel;
                (c.family, c.model) = cpu;
                libipt_sys::pt_cpu_errata(&mut e, &c) >= 0
            };
            assert!(!known, "libipt 2.1.2 lists {cpu:?} itself now");
            assert_eq!(errata_set(cpu), ["bdm70", "skd022", "apl11"], "{cpu:?}");
            assert_eq!(CpuParams::cpu_warning(cpu.0, cpu.1), None, "{cpu:?}");
        }
        // libipt 2.1.2's own: family 19 model 1, 6/0x5c (no warning either).
        assert_eq!(errata_set((19, 1)), ["bdm70", "skd022", "skz84"]);
        assert_eq!(errata_set((6, 0x5c)), ["apl12", "apl11"]);
        assert_eq!(CpuParams::cpu_warning(19, 1), None);
        // Known families, models in no list: no errata, and a warning saying so.
        for (f, m) in [(18, 2), (19, 5), (6, 0x3c)] {
            assert_eq!(errata_set((f, m)), Vec::<&str>::new());
            let w = CpuParams::cpu_warning(f, m).unwrap();
            assert_eq!(
                w,
                format!(
                    "CPU {f}/{m} ({f:#x}/{m:#x}) is in no erratum list this decoder knows \
                     (libipt 2.1.2's and the newer models it adds): no erratum workarounds \
                     are applied"
                )
            );
        }
    }
}
