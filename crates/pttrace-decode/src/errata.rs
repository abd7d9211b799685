//! Which errata a CPU has: libipt 2.1.2's list (asked through the private `ipt` module), then the
//! newer models libipt's later lists add; and the warning for a CPU in neither.

use crate::config::{CpuParams, Errata};
use crate::ipt;

/// The errata of `cpu`: libipt 2.1.2's own list, else the newer models libipt's later
/// lists add; `None` for a CPU in neither (or family 0, no CPU).
pub fn of(cpu: &CpuParams) -> Option<Errata> {
    if cpu.family == 0 {
        return None;
    }
    ipt::libipt_errata(cpu.family, cpu.model, cpu.stepping).or_else(|| newer(cpu.family, cpu.model))
}

/// Errata of processors newer than libipt 2.1.2's list, as libipt's later lists
/// (`pt_cpu_errata`) give them, for the errata 2.1.2 can express (all of them): family 6
/// model 0xd5 and family 18 (0x12) models 1 and 3 have BDM70, SKD022 and APL11.
fn newer(family: u16, model: u8) -> Option<Errata> {
    match (family, model) {
        (6, 0xd5) | (0x12, 0x01 | 0x03) => Some(Errata {
            bdm70: true,
            skd022: true,
            apl11: true,
            ..Default::default()
        }),
        _ => None,
    }
}

/// A warning when no Intel processor with PT has this family (6, and 18/19 for newer
/// cores), or when the model is in no erratum list this decoder has (libipt 2.1.2's and
/// the newer models'): no erratum workaround is applied then (ptxed reports the latter as a
/// configuration error and decodes on, too).
pub fn cpu_warning(family: u16, model: u8) -> Option<String> {
    if family == 0 {
        return Some(
            "family 0 is no CPU: decoding without erratum workarounds, as ptxed and ptdump \
             do (give the family/model of the machine that recorded the trace, \
             /proc/cpuinfo's 'cpu family'/'model' there, e.g. 6/85)"
                .to_string(),
        );
    }
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
    of(&cpu).is_none().then(|| {
        format!(
            "CPU {family}/{model} ({family:#x}/{model:#x}) is in no erratum list this \
             decoder knows (libipt 2.1.2's and the newer models it adds): no erratum \
             workarounds are applied"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the errata CPU (family, model) has.
    fn errata_set(c: (u16, u8)) -> Vec<&'static str> {
        let cpu = CpuParams {
            family: c.0,
            model: c.1,
            ..Default::default()
        };
        of(&cpu).unwrap_or_default().names()
    }

    #[test]
    fn libipts_list_gives_known_cpus_their_errata() {
        // Kaby Lake has SKD007 and SKD022 (same facts libipt's own tests assert).
        let kbl = CpuParams {
            family: 6,
            model: 0x9e,
            stepping: 11,
            ..Default::default()
        };
        let e = of(&kbl).unwrap();
        assert!(e.skd007 && e.skd022, "{e:?}");
        assert_eq!(of(&CpuParams::default()), None, "family 0 is no CPU");
        assert_eq!(cpu_warning(6, 85), None);
        assert!(cpu_warning(25, 1)
            .unwrap()
            .starts_with("CPU family 25 (model 1) has no Intel PT processor"));
    }

    #[test]
    fn newer_cpus_get_their_errata_unknown_ones_a_warning() {
        // Newer than libipt 2.1.2's list (facts from libipt's later list).
        for cpu in [(6, 0xd5), (18, 1), (18, 3)] {
            assert_eq!(
                ipt::libipt_errata(cpu.0, cpu.1, 0),
                None,
                "libipt 2.1.2 lists {cpu:?} itself now"
            );
            assert_eq!(errata_set(cpu), ["bdm70", "skd022", "apl11"], "{cpu:?}");
            assert_eq!(cpu_warning(cpu.0, cpu.1), None, "{cpu:?}");
        }
        // libipt 2.1.2's own: family 19 model 1, 6/0x5c (no warning either).
        assert_eq!(errata_set((19, 1)), ["bdm70", "skd022", "skz84"]);
        assert_eq!(errata_set((6, 0x5c)), ["apl12", "apl11"]);
        assert_eq!(cpu_warning(19, 1), None);
        // Known families, models in no list: no errata, and a warning saying so.
        for (f, m) in [(18, 2), (19, 5), (6, 0x3c)] {
            assert_eq!(errata_set((f, m)), Vec::<&str>::new());
            let w = cpu_warning(f, m).unwrap();
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
