//! What describes a trace besides its bytes and images: the CPU that recorded it (with
//! the errata that change how it decodes), its timing parameters and its address filters.
//! Plain data; [`crate::errata`] looks a CPU's errata up, and only the private `ipt` module turns
//! this into libipt's configuration.

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
    /// as ptxed's `--cpu`), as the CLI's `--cpu`. Family 0 is no CPU: taken as ptxed and
    /// ptdump take it (no erratum workarounds), with the warning
    /// [`crate::errata::cpu_warning`] gives, so that a mistyped `--cpu` is not silent.
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
        Ok((f, m, st))
    }
}

/// The errata of a CPU that change how its trace decodes (the bits of libipt's
/// `pt_errata`; what each means: libipt's `intel-pt.h` and the CPUs' specification
/// updates). Which CPU has which: [`crate::errata::of`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Errata {
    pub bdm70: bool,
    pub bdm64: bool,
    pub skd007: bool,
    pub skd022: bool,
    pub skd010: bool,
    pub skl014: bool,
    pub apl12: bool,
    pub apl11: bool,
    pub skl168: bool,
    pub skz84: bool,
}

impl Errata {
    /// The names of the errata set, in libipt's order.
    pub fn names(&self) -> Vec<&'static str> {
        [
            ("bdm70", self.bdm70),
            ("bdm64", self.bdm64),
            ("skd007", self.skd007),
            ("skd022", self.skd022),
            ("skd010", self.skd010),
            ("skl014", self.skl014),
            ("apl12", self.apl12),
            ("apl11", self.apl11),
            ("skl168", self.skl168),
            ("skz84", self.skz84),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| name)
        .collect()
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
    /// Whether the filters trace code at `ip` (libipt's `pt_filter_addr_check`): not in a
    /// stop range, and in a filter range where there is one (both ends included).
    pub fn traces(&self, ip: u64) -> bool {
        let within = |&&(_, a, b): &&(u8, u64, u64)| a <= ip && ip <= b;
        let of = |cfg: u8| self.ranges.iter().filter(move |r| r.0 == cfg);
        !of(2).any(|r| within(&r)) && (of(1).next().is_none() || of(1).any(|r| within(&r)))
    }

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
    fn cpu_parse() {
        assert_eq!(CpuParams::parse_cpu("6/0x9e/11"), Ok((6, 0x9e, 11)));
        assert!(CpuParams::parse_cpu("6/300/1").is_err());
        // Without a stepping, as ptxed takes it.
        assert_eq!(CpuParams::parse_cpu("6/92"), Ok((6, 92, 0)));
        assert!(CpuParams::parse_cpu("6").is_err());
        assert!(CpuParams::parse_cpu("6/1/2/3").is_err());
        // No CPU, as ptxed and ptdump take it (the caller warns).
        assert_eq!(CpuParams::parse_cpu("0/0"), Ok((0, 0, 0)));
    }

    #[test]
    fn errata_names_follow_libipts_order() {
        let e = Errata {
            skz84: true,
            bdm70: true,
            apl11: true,
            ..Default::default()
        };
        assert_eq!(e.names(), ["bdm70", "apl11", "skz84"]);
        assert!(Errata::default().names().is_empty());
    }
}
