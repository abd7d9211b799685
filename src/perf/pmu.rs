//! The `intel_pt` PMU as the kernel describes it in sysfs.
//!
//! `/sys/bus/event_source/devices/intel_pt/` holds `type` (the perf_event_attr.type),
//! `format/<term>` files (`config:N` or `config:N-M`: where each term's bits go in
//! attr.config / config1 / config2), `caps/<cap>` files (decimal or hex capability values)
//! and `max_nonturbo_ratio` / `tsc_art_ratio`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Status};

/// Where the kernel lists PMUs.
pub const EVENT_SOURCE_DIR: &str = "/sys/bus/event_source/devices";

/// Which attr word a format term lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigWord {
    Config,
    Config1,
    Config2,
}

/// A format term: bits `lo..=hi` of one config word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatTerm {
    pub word: ConfigWord,
    pub lo: u32,
    pub hi: u32,
}

impl FormatTerm {
    /// Parses `config:N`, `config:N-M`, `config1:…`, `config2:…`.
    pub fn parse(text: &str) -> Option<FormatTerm> {
        let (word, bits) = text.trim().split_once(':')?;
        let word = match word {
            "config" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            _ => return None,
        };
        // Only the first range is used; PT terms are contiguous.
        let bits = bits.split(',').next()?;
        let (lo, hi) = match bits.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let v = bits.parse().ok()?;
                (v, v)
            }
        };
        if lo > hi || hi > 63 {
            return None;
        }
        Some(FormatTerm { word, lo, hi })
    }

    /// Places `value` into this term's bits of `word`; `None` when it does not fit.
    pub fn encode(&self, value: u64) -> Option<u64> {
        let width = self.hi - self.lo + 1;
        if width < 64 && value >> width != 0 {
            return None;
        }
        Some(value << self.lo)
    }
}

/// The `intel_pt` PMU description read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntelPtPmu {
    pub dir: PathBuf,
    pub pmu_type: u32,
    pub format: BTreeMap<String, FormatTerm>,
    pub caps: BTreeMap<String, u64>,
    pub max_nonturbo_ratio: Option<u32>,
    pub tsc_art_ratio: Option<(u32, u32)>,
}

fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

impl IntelPtPmu {
    /// Reads the PMU from the standard sysfs location.
    pub fn probe() -> Result<IntelPtPmu> {
        IntelPtPmu::from_dir(&Path::new(EVENT_SOURCE_DIR).join("intel_pt"))
    }

    /// Reads a PMU description from `dir` (tests point this at a fake tree).
    pub fn from_dir(dir: &Path) -> Result<IntelPtPmu> {
        let type_path = dir.join("type");
        let type_text = std::fs::read_to_string(&type_path).map_err(|e| {
            let listed = std::fs::read_dir(dir.parent().unwrap_or(Path::new("/")))
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            Error::new(
                Status::FailedToOpenPerfEvent,
                format!(
                    "no intel_pt PMU ({}: {e}): this CPU or VM does not expose Intel PT \
                     (PMUs present: {listed}); use the emulated backend for user-mode tracing \
                     (PTTRACER_BACKEND=emulated) or run on bare metal / a VM with PT passthrough",
                    type_path.display()
                ),
            )
        })?;
        let pmu_type = type_text.trim().parse::<u32>().map_err(|_| {
            Error::new(
                Status::FailedToOpenPerfEvent,
                format!(
                    "{}: {:?} is not a PMU type number",
                    type_path.display(),
                    type_text.trim()
                ),
            )
        })?;
        let mut format = BTreeMap::new();
        if let Ok(rd) = std::fs::read_dir(dir.join("format")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(term) = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|t| FormatTerm::parse(&t))
                {
                    format.insert(name, term);
                }
            }
        }
        let mut caps = BTreeMap::new();
        if let Ok(rd) = std::fs::read_dir(dir.join("caps")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(v) = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|t| parse_number(&t))
                {
                    caps.insert(name, v);
                }
            }
        }
        let max_nonturbo_ratio = std::fs::read_to_string(dir.join("max_nonturbo_ratio"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        let tsc_art_ratio = std::fs::read_to_string(dir.join("tsc_art_ratio"))
            .ok()
            .and_then(|t| {
                let (a, b) = t.trim().split_once(':')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            });
        Ok(IntelPtPmu {
            dir: dir.to_path_buf(),
            pmu_type,
            format,
            caps,
            max_nonturbo_ratio,
            tsc_art_ratio,
        })
    }

    /// A capability value (0 when absent).
    pub fn cap(&self, name: &str) -> u64 {
        self.caps.get(name).copied().unwrap_or(0)
    }

    /// Sets format term `name` to `value` in `config` (only `config`-word terms).
    pub fn set_term(&self, config: &mut u64, name: &str, value: u64) -> Result<()> {
        let term = self.format.get(name).ok_or_else(|| {
            Error::new(
                Status::FailedToOpenPerfEvent,
                format!(
                    "the intel_pt PMU has no '{name}' format term ({}/format)",
                    self.dir.display()
                ),
            )
        })?;
        if term.word != ConfigWord::Config {
            return Err(Error::new(
                Status::FailedToOpenPerfEvent,
                format!("intel_pt format term '{name}' is not in attr.config"),
            ));
        }
        let bits = term.encode(value).ok_or_else(|| {
            Error::new(
                Status::FailedToOpenPerfEvent,
                format!("value {value} does not fit intel_pt format term '{name}'"),
            )
        })?;
        let width = term.hi - term.lo + 1;
        let mask = if width == 64 {
            u64::MAX
        } else {
            ((1u64 << width) - 1) << term.lo
        };
        *config = (*config & !mask) | bits;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_terms_parse_and_encode() {
        let t = FormatTerm::parse("config:11\n").unwrap();
        assert_eq!((t.word, t.lo, t.hi), (ConfigWord::Config, 11, 11));
        assert_eq!(t.encode(1), Some(1 << 11));
        assert_eq!(t.encode(2), None);
        let t = FormatTerm::parse("config:14-17").unwrap();
        assert_eq!(t.encode(0xf), Some(0xf << 14));
        assert_eq!(t.encode(0x10), None);
        assert_eq!(
            FormatTerm::parse("config1:0-63").unwrap().word,
            ConfigWord::Config1
        );
        assert_eq!(FormatTerm::parse("bogus:1"), None);
        assert_eq!(FormatTerm::parse("config:9-3"), None);
    }

    #[test]
    fn reads_a_fake_sysfs_tree() {
        let d = tempfile::tempdir().unwrap();
        let pmu = d.path().join("intel_pt");
        std::fs::create_dir_all(pmu.join("format")).unwrap();
        std::fs::create_dir_all(pmu.join("caps")).unwrap();
        std::fs::write(pmu.join("type"), "9\n").unwrap();
        std::fs::write(pmu.join("format/noretcomp"), "config:11\n").unwrap();
        std::fs::write(pmu.join("format/tsc"), "config:10\n").unwrap();
        std::fs::write(pmu.join("format/mtc_period"), "config:14-17\n").unwrap();
        std::fs::write(pmu.join("caps/mtc"), "1\n").unwrap();
        std::fs::write(pmu.join("caps/mtc_periods"), "249\n").unwrap();
        std::fs::write(pmu.join("max_nonturbo_ratio"), "24\n").unwrap();
        std::fs::write(pmu.join("tsc_art_ratio"), "2:182\n").unwrap();
        let p = IntelPtPmu::from_dir(&pmu).unwrap();
        assert_eq!(p.pmu_type, 9);
        assert_eq!(p.cap("mtc_periods"), 249);
        assert_eq!(p.cap("absent"), 0);
        assert_eq!(p.max_nonturbo_ratio, Some(24));
        assert_eq!(p.tsc_art_ratio, Some((2, 182)));
        let mut c = 0;
        p.set_term(&mut c, "noretcomp", 1).unwrap();
        p.set_term(&mut c, "tsc", 1).unwrap();
        p.set_term(&mut c, "mtc_period", 3).unwrap();
        assert_eq!(c, (1 << 11) | (1 << 10) | (3 << 14));
        let e = p.set_term(&mut c, "cyc", 1).unwrap_err();
        assert!(e.message.contains("'cyc'"), "{}", e.message);
    }

    #[test]
    fn missing_pmu_is_an_actionable_error() {
        let d = tempfile::tempdir().unwrap();
        let e = IntelPtPmu::from_dir(&d.path().join("intel_pt")).unwrap_err();
        assert_eq!(e.status, Status::FailedToOpenPerfEvent);
        assert!(e.message.contains("no intel_pt PMU"), "{}", e.message);
        assert!(e.message.contains("emulated"), "{}", e.message);
    }
}
