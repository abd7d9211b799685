//! What this machine allows: Intel PT (PMU, caps), perf permissions and memory limits,
//! kernel image access, Syscall User Dispatch, and which backend each mode resolves to.
//! `pttrace check` prints this; the shim stores it with its output.

use std::fmt;

use crate::metadata::{cpu_has_intel_pt, cpu_identity, BackendKind};
use crate::perf::event::perf_event_paranoid;
use crate::perf::pmu::IntelPtPmu;
use crate::tracer::{BackendChoice, Mode};

/// Whether this process runs under DynamoRIO (its `libdynamorio.so` is mapped): then this
/// library is loaded by DynamoRIO's private loader for a client, or runs in an application
/// whose code executes from DynamoRIO's code cache. Read once from /proc/self/maps.
pub fn inside_dynamorio() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static KNOWN: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 no, 2 yes
    match KNOWN.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = maps_show_dynamorio(&std::fs::read("/proc/self/maps").unwrap_or_default());
            KNOWN.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Whether a /proc/PID/maps text maps DynamoRIO's core library.
fn maps_show_dynamorio(maps: &[u8]) -> bool {
    maps.split(|&b| b == b'\n').any(|line| {
        let path = line.rsplit(|&b| b == b'/').next().unwrap_or(b"");
        path == b"libdynamorio.so" || path.starts_with(b"libdynamorio.so.")
    })
}

/// One probed fact: a name, whether it is fine, and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub what: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// Everything `pttrace check` reports.
#[derive(Debug, Clone)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Backend per mode, or why the mode cannot be traced.
    pub modes: Vec<(Mode, Result<BackendKind, String>)>,
    pub pt_usable: bool,
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const PR_SET_SYSCALL_USER_DISPATCH: i32 = 59;
const PR_SYS_DISPATCH_OFF: libc::c_ulong = 0;

fn has_capability(bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1u64 << bit) != 0)
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether Syscall User Dispatch can be configured in this kernel.
pub fn syscall_user_dispatch_available() -> Result<(), String> {
    // SAFETY: turning dispatch OFF for the calling thread has no effect beyond the check.
    let r = unsafe {
        libc::prctl(
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_OFF,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "prctl(PR_SET_SYSCALL_USER_DISPATCH) failed: {} (kernel < 5.11 or \
             CONFIG_GENERIC_ENTRY without it)",
            std::io::Error::last_os_error()
        ))
    }
}

/// Probes the machine.
pub fn probe() -> Report {
    let mut f = Vec::new();
    let (fam, model, step) = cpu_identity();
    let cpuid_pt = cpu_has_intel_pt();
    f.push(Finding {
        what: "cpu",
        ok: true,
        detail: format!(
            "family {fam} model {model} stepping {step}; cpuid.07H:EBX[25] (Intel PT) = {}",
            u8::from(cpuid_pt)
        ),
    });
    let pmu = IntelPtPmu::probe();
    match &pmu {
        Ok(p) => {
            let caps: Vec<String> = p.caps.iter().map(|(k, v)| format!("{k}={v}")).collect();
            f.push(Finding {
                what: "intel_pt PMU",
                ok: true,
                detail: format!("type {} at {}", p.pmu_type, p.dir.display()),
            });
            f.push(Finding {
                what: "intel_pt caps",
                ok: true,
                detail: caps.join(" "),
            });
        }
        Err(e) => f.push(Finding {
            what: "intel_pt PMU",
            ok: false,
            detail: e.message.clone(),
        }),
    }
    let paranoid = perf_event_paranoid();
    let privileged = has_capability(CAP_PERFMON) || has_capability(CAP_SYS_ADMIN);
    let kernel_allowed = privileged || paranoid.is_some_and(|p| p <= 1);
    f.push(Finding {
        what: "perf_event_paranoid",
        ok: paranoid.is_some_and(|p| p <= 2),
        detail: format!(
            "{} ({}); CAP_PERFMON/CAP_SYS_ADMIN: {}",
            paranoid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "unreadable".into()),
            if kernel_allowed {
                "kernel tracing allowed"
            } else {
                "user-only tracing of own threads; kernel tracing needs <= 1 or a capability"
            },
            if privileged { "yes" } else { "no" }
        ),
    });
    // SAFETY: getrlimit writes into the struct we pass.
    let memlock = unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) == 0).then_some(r.rlim_cur)
    };
    let mlock_kb = read_trim("/proc/sys/kernel/perf_event_mlock_kb");
    f.push(Finding {
        what: "locked memory",
        ok: true,
        detail: format!(
            "RLIMIT_MEMLOCK {} + perf_event_mlock_kb {} KiB per user bound the AUX + DATA rings",
            match memlock {
                Some(libc::RLIM_INFINITY) => "unlimited".to_string(),
                Some(v) => format!("{} KiB", v / 1024),
                None => "unknown".into(),
            },
            mlock_kb.unwrap_or_else(|| "?".into())
        ),
    });
    let kcore = std::fs::File::open("/proc/kcore");
    f.push(Finding {
        what: "/proc/kcore",
        ok: kcore.is_ok(),
        detail: match kcore {
            Ok(_) => "readable (kernel code can be saved for decoding)".into(),
            Err(e) => format!("{e}: kernel-mode traces cannot be decoded without a kernel image"),
        },
    });
    let kallsyms_ok = std::fs::read_to_string("/proc/kallsyms")
        .ok()
        .and_then(|s| s.lines().next().map(|l| !l.starts_with("0000000000000000")))
        .unwrap_or(false);
    f.push(Finding {
        what: "/proc/kallsyms",
        ok: kallsyms_ok,
        detail: if kallsyms_ok {
            "addresses visible".into()
        } else {
            "addresses hidden (kptr_restrict) or unreadable: no kernel symbol names".into()
        },
    });
    let sud = syscall_user_dispatch_available();
    f.push(Finding {
        what: "syscall user dispatch",
        ok: sud.is_ok(),
        detail: match sud {
            Ok(()) => "available (the shim intercepts raw syscall instructions)".into(),
            Err(e) => e,
        },
    });
    let choice = BackendChoice::from_env();
    let modes = [Mode::UserOnly, Mode::KernelOnly, Mode::UserAndKernel]
        .into_iter()
        .map(|m| {
            let r = match &choice {
                Err(e) => Err(e.message.clone()),
                Ok(c) => match c.resolve(m) {
                    Ok(BackendKind::Hardware) => match &pmu {
                        Ok(_) if m.traces_kernel() && !kernel_allowed => Err(
                            "hardware, but kernel tracing is not permitted (perf_event_paranoid)"
                                .into(),
                        ),
                        Ok(_) => Ok(BackendKind::Hardware),
                        Err(_) if m.traces_kernel() => Err(
                            "unavailable: kernel tracing needs Intel PT hardware (the emulated \
                             backend traces user mode only)"
                                .into(),
                        ),
                        Err(e) => Err(format!("hardware forced but unavailable: {}", e.message)),
                    },
                    Ok(BackendKind::Emulated) if m.traces_kernel() => {
                        Err("unavailable: the emulated backend traces user mode only".into())
                    }
                    Ok(k) => Ok(k),
                    Err(e) => Err(e.message),
                },
            };
            (m, r)
        })
        .collect();
    Report {
        findings: f,
        modes,
        pt_usable: pmu.is_ok(),
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Intel PT hardware: {}",
            if self.pt_usable {
                "usable"
            } else {
                "NOT usable"
            }
        )?;
        for x in &self.findings {
            writeln!(
                f,
                "  [{}] {:<24} {}",
                if x.ok { " ok " } else { "FAIL" },
                x.what,
                x.detail
            )?;
        }
        writeln!(
            f,
            "Backend per mode in the LD_PRELOAD shim and the C API (PTTRACER_BACKEND=auto):"
        )?;
        for (m, r) in &self.modes {
            match r {
                Ok(k) => writeln!(f, "  {:<12} {}", m.name(), k.name())?,
                Err(e) => writeln!(f, "  {:<12} {}", m.name(), e)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamorio_is_recognised_by_its_core_library_only() {
        let dr = b"7f00-7f10 r-xp 00000000 08:01 42 /opt/dr/lib64/release/libdynamorio.so\n";
        assert!(maps_show_dynamorio(dr));
        assert!(maps_show_dynamorio(
            b"1-2 r-xp 0 0:0 1 /x/libdynamorio.so.11.3\n"
        ));
        let plain = b"1-2 r-xp 0 0:0 1 /usr/lib/libc.so.6\n3-4 ---p 0 0:0 0 \n";
        assert!(!maps_show_dynamorio(plain));
        assert!(!maps_show_dynamorio(
            b"1-2 r-xp 0 0:0 1 /x/libdynamorio_static.a\n"
        ));
        assert!(!inside_dynamorio(), "the test runs outside DynamoRIO");
    }
}
