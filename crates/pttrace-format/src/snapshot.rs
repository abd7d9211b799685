//! Snapshot (flight-recorder) mode, `pttrace run --snapshot SIZE [--trigger SPEC]...`:
//! each thread keeps only its last SIZE bytes of PT in memory (a ring of whole windows) and
//! writes the ring into its `.ptt` file when a trigger fires.
//!
//! Triggers ([`Trigger`]):
//! - `exit`: a thread's ring is written when the thread ends (thread exit, `exit_group`,
//!   a fatal signal, `execve`). The default when no trigger is given.
//! - `signal:SIG` (`USR2`, `SIGUSR2` or a number): the signal sent to `pttrace run` itself
//!   (like `perf record -S`, the program never sees it); `pttrace run` appends a request
//!   line to the trace directory's [`REQUEST_FILE`], which every traced process polls.
//! - `syscall:NAME` (or a number): the thread enters that syscall; its snapshot ends with
//!   the window that ends at that syscall (with its return value).
//! - `addr:SYMBOL` or `addr:0xADDR`: execution reaches that address of the main
//!   executable (a symbol of its ELF `.symtab`/`.dynsym`, or an address as the ELF file
//!   gives it; a PIE's load bias is applied). The snapshot holds the trace up to, not
//!   including, the instruction at the address (where its last window's FUP points).
//!   After an `execve`, an `addr:SYMBOL` trigger is resolved again in the new image's
//!   executable (the info file notes where, or why it does not fire there); an
//!   `addr:0xADDR` trigger is not carried into the new image (noted at the exec).
//!
//! Each firing (but `exit`, which is per thread) has a number, per process image, from 1:
//! every thread of the process writes its ring as one snapshot with that number and
//! tracing goes on with an empty ring, so a window is written at most once and each
//! snapshot holds what came after the previous one (at most SIZE). Where each thread's
//! snapshot ends is defined: the thread where the trigger fired, at the trigger; a thread
//! inside a syscall when the firing is published, at that syscall (its window is the
//! snapshot's last, flagged [`crate::ptt::WF_SNAPSHOT_CUT`], without a return value); a
//! thread executing code, before the next block it executes (a window flagged
//! `WF_SNAPSHOT_CUT | WF_NO_SYSCALL`). The record's TSC is the cut's. The info file gets
//! a `Note` per firing (`snapshot N: trigger ... fired`) and one when every thread has
//! written it (`snapshot N: complete, written by K threads`).
//!
//! In a thread file, a `Snapshot` record (type 27, [`SnapshotRecord`]) comes before the
//! windows of its snapshot: the windows after it, up to the next `Snapshot` or `End`,
//! belong to it (it also counts them). Window indices jump at a snapshot (the windows
//! discarded from the ring): the record says how many. Files without `Snapshot` records
//! read as before; older readers skip the record (unknown types are skipped).

use crate::sysnames;

/// The file in the trace directory that `pttrace run` appends a line to for each
/// `signal:` trigger it receives (`signal SIGNAME`); the QEMU plugin polls it.
pub const REQUEST_FILE: &str = ".snapshot-requests";

/// How often the plugin looks at [`REQUEST_FILE`] (milliseconds).
pub const REQUEST_POLL_MS: u64 = 10;

/// Smallest snapshot size accepted.
pub const MIN_SIZE: u64 = 4096;
/// Largest snapshot size accepted (per thread, in memory).
pub const MAX_SIZE: u64 = 1 << 34;

/// Parses `--snapshot`'s size: [`parse_size_of`].
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size_of("--snapshot", s)
}

/// Parses a size like `65536`, `64K`, `64KiB`, `1M`, `2G` (binary multiples) between 4K
/// and 16G, given to the option `option` (which errors name).
pub fn parse_size_of(option: &str, s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{option} {s:?}: expected a size such as 65536, 64K or 1M"))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        u => {
            return Err(format!(
                "{option} {s:?}: unknown unit {u:?} (use K, M or G)"
            ))
        }
    };
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{option} {s:?}: too large"))?;
    if !(MIN_SIZE..=MAX_SIZE).contains(&v) {
        return Err(format!(
            "{option} {s:?}: {v} bytes is outside {MIN_SIZE}..={MAX_SIZE} (4K to 16G)"
        ));
    }
    Ok(v)
}

/// Where an `addr:` trigger points, as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddrSpec {
    Symbol(String),
    Value(u64),
}

/// An `addr:` trigger's address in an ELF executable's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfAddr {
    /// The address as linked.
    pub value: u64,
    /// The executable's lowest loaded page when it is position-independent (the run-time
    /// address is `value - pie_base + the load address of that page`).
    pub pie_base: Option<u64>,
    /// `value` lies in a loaded segment.
    pub loaded: bool,
}

/// Why an `addr:` trigger has no address in an ELF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElfAddrError {
    /// Not an ELF file (what the parser said).
    NotElf(String),
    /// An ELF file for another architecture.
    NotX86_64,
    /// No such symbol defined in `.symtab` or `.dynsym`.
    NoSymbol,
}

/// Resolves `spec` in the ELF file `data` (its `.symtab` and `.dynsym` definitions), as
/// `pttrace run` does for the program and the QEMU plugin for an exec'd image.
pub fn elf_address(data: &[u8], spec: &AddrSpec) -> Result<ElfAddr, ElfAddrError> {
    use object::{Architecture, Object, ObjectKind, ObjectSegment, ObjectSymbol};
    let obj = object::File::parse(data).map_err(|e| ElfAddrError::NotElf(e.to_string()))?;
    if obj.architecture() != Architecture::X86_64 {
        return Err(ElfAddrError::NotX86_64);
    }
    let loads: Vec<(u64, u64)> = obj
        .segments()
        .map(|s| (s.address(), s.address() + s.size()))
        .filter(|(a, b)| b > a)
        .collect();
    let pie_base = (obj.kind() == ObjectKind::Dynamic)
        .then(|| loads.iter().map(|(a, _)| *a).min().unwrap_or(0) & !0xfff);
    let value = match spec {
        AddrSpec::Value(v) => *v,
        AddrSpec::Symbol(name) => obj
            .symbols()
            .chain(obj.dynamic_symbols())
            .find(|s| s.is_definition() && s.name() == Ok(name.as_str()))
            .map(|s| s.address())
            .ok_or(ElfAddrError::NoSymbol)?,
    };
    let loaded = loads.iter().any(|(a, b)| (*a..*b).contains(&value));
    Ok(ElfAddr {
        value,
        pie_base,
        loaded,
    })
}

/// Where the executable `exe`'s first page (file offset 0) is mapped, from the text of
/// `/proc/PID/maps`.
pub fn exe_first_page(maps: &str, exe: &std::path::Path) -> Option<u64> {
    maps.lines()
        .filter_map(crate::maps::MapsEntry::parse)
        .find(|m| m.offset == 0 && std::path::Path::new(&m.path) == exe)
        .map(|m| m.start)
}

/// The run-time address of `a` when the executable's first page is mapped at
/// `first_page` (needed for a PIE only; `None` when a PIE's mapping is unknown).
pub fn runtime_address(a: &ElfAddr, first_page: Option<u64>) -> Option<u64> {
    match (a.pie_base, first_page) {
        (None, _) => Some(a.value),
        (Some(base), Some(start)) => Some(a.value.wrapping_sub(base).wrapping_add(start)),
        (Some(_), None) => None,
    }
}

/// A trigger as the user writes it (`--trigger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserTrigger {
    Exit,
    Signal(i32),
    Syscall(u64),
    Addr(AddrSpec),
}

/// Signal names `signal:` accepts (without `SIG`), with their numbers on x86-64 Linux.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("URG", 23),
    ("XCPU", 24),
    ("XFSZ", 25),
    ("VTALRM", 26),
    ("PROF", 27),
    ("WINCH", 28),
    ("IO", 29),
    ("PWR", 30),
    ("SYS", 31),
];

/// Signals that cannot be caught (`KILL`, `STOP`) or that report faults.
const UNUSABLE_SIGNALS: &[i32] = &[4, 5, 6, 7, 8, 9, 11, 19, 31];

/// `SIGUSR2`-style name of a signal number.
pub fn signal_name(sig: i32) -> String {
    match SIGNALS.iter().find(|(_, n)| *n == sig) {
        Some((name, _)) => format!("SIG{name}"),
        None if (34..=64).contains(&sig) => format!("SIGRTMIN+{}", sig - 34),
        None => format!("signal {sig}"),
    }
}

fn parse_signal(spec: &str, v: &str) -> Result<i32, String> {
    let up = v.trim().to_ascii_uppercase();
    let bare = up.strip_prefix("SIG").unwrap_or(&up);
    let n = match bare.parse::<i32>() {
        Ok(n) => n,
        Err(_) => SIGNALS
            .iter()
            .find(|(name, _)| *name == bare)
            .map(|(_, n)| *n)
            .ok_or_else(|| {
                format!(
                    "--trigger {spec:?}: unknown signal {v:?} (e.g. USR1, USR2, HUP, or a number)"
                )
            })?,
    };
    if !(1..=64).contains(&n) || UNUSABLE_SIGNALS.contains(&n) {
        return Err(format!(
            "--trigger {spec:?}: signal {n} cannot be used as a trigger (it cannot be caught \
             or reports a fault; use e.g. USR2)"
        ));
    }
    Ok(n)
}

fn parse_number(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

impl UserTrigger {
    /// Parses one `--trigger` value: `exit`, `signal:SIG`, `syscall:NAME`, `addr:SYMBOL`
    /// or `addr:0xADDR`.
    pub fn parse(spec: &str) -> Result<UserTrigger, String> {
        let (kind, v) = spec.split_once(':').unwrap_or((spec, ""));
        let usage = "(expected exit, signal:SIG, syscall:NAME, addr:SYMBOL or addr:0xADDR)";
        match kind.trim() {
            "exit" if v.is_empty() => Ok(UserTrigger::Exit),
            "signal" => parse_signal(spec, v).map(UserTrigger::Signal),
            "syscall" => {
                let v = v.trim();
                let nr = match v.parse::<u64>() {
                    Ok(n) if n < 1024 => n,
                    Ok(_) => return Err(format!("--trigger {spec:?}: no syscall number {v}")),
                    Err(_) => sysnames::number(v).ok_or_else(|| {
                        format!("--trigger {spec:?}: unknown x86-64 syscall {v:?}")
                    })?,
                };
                Ok(UserTrigger::Syscall(nr))
            }
            "addr" => {
                let v = v.trim();
                if v.is_empty() {
                    return Err(format!(
                        "--trigger {spec:?}: addr needs a symbol or an address (addr:main, \
                         addr:0x401136)"
                    ));
                }
                if v.starts_with(|c: char| c.is_ascii_digit()) {
                    parse_number(v)
                        .map(|a| UserTrigger::Addr(AddrSpec::Value(a)))
                        .ok_or_else(|| format!("--trigger {spec:?}: {v:?} is not an address"))
                } else {
                    Ok(UserTrigger::Addr(AddrSpec::Symbol(v.to_string())))
                }
            }
            _ => Err(format!("--trigger {spec:?}: unknown trigger {usage}")),
        }
    }
}

/// A trigger as the plugin gets it (an `addr:` resolved in the executable's ELF file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Exit,
    Signal(i32),
    Syscall(u64),
    /// `value` is an address of the ELF file; `pie_base` (a PIE: the page of its lowest
    /// `PT_LOAD` address) says to add the load bias, found from where the file's first
    /// page is mapped. `label` names it in notes and records.
    Addr {
        value: u64,
        pie_base: Option<u64>,
        label: String,
    },
}

/// Trigger kinds in a [`SnapshotRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum TriggerKind {
    Exit = 0,
    Signal = 1,
    Syscall = 2,
    Addr = 3,
    /// Not a trigger: the ring recovered from its file after the process was killed
    /// ([`crate::ringfile`]).
    Kill = 4,
}

impl TriggerKind {
    pub fn from_raw(v: u32) -> Option<TriggerKind> {
        Some(match v {
            0 => TriggerKind::Exit,
            1 => TriggerKind::Signal,
            2 => TriggerKind::Syscall,
            3 => TriggerKind::Addr,
            4 => TriggerKind::Kill,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            TriggerKind::Exit => "exit",
            TriggerKind::Signal => "signal",
            TriggerKind::Syscall => "syscall",
            TriggerKind::Addr => "addr",
            TriggerKind::Kill => "kill",
        }
    }
}

impl Trigger {
    pub fn kind(&self) -> TriggerKind {
        match self {
            Trigger::Exit => TriggerKind::Exit,
            Trigger::Signal(_) => TriggerKind::Signal,
            Trigger::Syscall(_) => TriggerKind::Syscall,
            Trigger::Addr { .. } => TriggerKind::Addr,
        }
    }

    /// How notes and records name it (`addr:marker`, `syscall:getppid`, `signal:SIGUSR2`).
    pub fn describe(&self) -> String {
        match self {
            Trigger::Exit => "exit".into(),
            Trigger::Signal(s) => format!("signal:{}", signal_name(*s)),
            Trigger::Syscall(nr) => match sysnames::name(*nr) {
                Some(n) => format!("syscall:{n}"),
                None => format!("syscall:{nr}"),
            },
            Trigger::Addr { label, .. } => format!("addr:{label}"),
        }
    }

    /// The plugin argument value (`trigger=` + this): `exit`, `signal:12`, `syscall:39`,
    /// `addr:0xVALUE:0xPIEBASE:LABEL` (PIE base empty for a fixed address).
    pub fn to_arg(&self) -> String {
        match self {
            Trigger::Exit => "exit".into(),
            Trigger::Signal(s) => format!("signal:{s}"),
            Trigger::Syscall(nr) => format!("syscall:{nr}"),
            Trigger::Addr {
                value,
                pie_base,
                label,
            } => format!(
                "addr:{value:#x}:{}:{label}",
                pie_base.map(|b| format!("{b:#x}")).unwrap_or_default()
            ),
        }
    }

    /// Reads back [`Trigger::to_arg`].
    pub fn from_arg(a: &str) -> Option<Trigger> {
        let (kind, rest) = a.split_once(':').unwrap_or((a, ""));
        Some(match kind {
            "exit" => Trigger::Exit,
            "signal" => Trigger::Signal(rest.parse().ok()?),
            "syscall" => Trigger::Syscall(rest.parse().ok()?),
            "addr" => {
                let mut it = rest.splitn(3, ':');
                let value = parse_number(it.next()?)?;
                let base = it.next()?;
                let pie_base = if base.is_empty() {
                    None
                } else {
                    Some(parse_number(base)?)
                };
                Trigger::Addr {
                    value,
                    pie_base,
                    label: it.next().unwrap_or("").to_string(),
                }
            }
            _ => return None,
        })
    }
}

/// Payload of a `Snapshot` record (thread files).
///
/// Layout: u64 number (per process image, from 1), u32 trigger kind ([`TriggerKind`]),
/// i32 tid of the thread where it fired (0: none, a request from `pttrace run`),
/// u64 TSC when the ring was written, u64 windows that follow, u64 their PT bytes,
/// u64 windows discarded from the ring since the previous snapshot, u64 their PT bytes,
/// u64 ring size (SIZE), then UTF-8 text: the trigger ([`Trigger::describe`] and where
/// it resolved).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotRecord {
    pub number: u64,
    pub kind: u32,
    pub fired_tid: i32,
    pub tsc: u64,
    pub windows: u64,
    pub pt_bytes: u64,
    pub discarded_windows: u64,
    pub discarded_pt_bytes: u64,
    pub ring_size: u64,
    pub trigger: String,
}

/// Fixed part of a `Snapshot` payload.
pub const SNAPSHOT_FIXED_SIZE: usize = 8 + 4 + 4 + 8 * 6;

impl SnapshotRecord {
    pub fn payload(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(SNAPSHOT_FIXED_SIZE + self.trigger.len());
        v.extend_from_slice(&self.number.to_le_bytes());
        v.extend_from_slice(&self.kind.to_le_bytes());
        v.extend_from_slice(&self.fired_tid.to_le_bytes());
        for x in [
            self.tsc,
            self.windows,
            self.pt_bytes,
            self.discarded_windows,
            self.discarded_pt_bytes,
            self.ring_size,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(self.trigger.as_bytes());
        v
    }

    pub fn decode(p: &[u8]) -> Option<SnapshotRecord> {
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(p.get(at..at + 8)?.try_into().ok()?))
        };
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(p.get(at..at + 4)?.try_into().ok()?))
        };
        Some(SnapshotRecord {
            number: u64_at(0)?,
            kind: u32_at(8)?,
            fired_tid: u32_at(12)? as i32,
            tsc: u64_at(16)?,
            windows: u64_at(24)?,
            pt_bytes: u64_at(32)?,
            discarded_windows: u64_at(40)?,
            discarded_pt_bytes: u64_at(48)?,
            ring_size: u64_at(56)?,
            trigger: String::from_utf8_lossy(p.get(SNAPSHOT_FIXED_SIZE..)?).into_owned(),
        })
    }

    /// One line for `pttrace report`.
    pub fn describe(&self) -> String {
        let fired = if self.fired_tid > 0 {
            format!(", fired in thread {}", self.fired_tid)
        } else {
            String::new()
        };
        format!(
            "snapshot {} ({}{fired}): {} windows, {} PT bytes of a {}-byte ring; {} windows \
             ({} PT bytes) discarded before it",
            self.number,
            self.trigger,
            self.windows,
            self.pt_bytes,
            self.ring_size,
            self.discarded_windows,
            self.discarded_pt_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_addresses_of_symbols_and_values() {
        // This test program: an x86-64 ELF file with `main` defined.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let main = elf_address(&exe, &AddrSpec::Symbol("main".into())).unwrap();
        assert!(main.loaded, "{main:?}");
        let same = elf_address(&exe, &AddrSpec::Value(main.value)).unwrap();
        assert_eq!(same, main);
        assert!(
            !elf_address(&exe, &AddrSpec::Value(u64::MAX))
                .unwrap()
                .loaded
        );
        assert_eq!(
            elf_address(&exe, &AddrSpec::Symbol("no such symbol here".into())),
            Err(ElfAddrError::NoSymbol)
        );
        assert!(matches!(
            elf_address(b"#!/bin/sh\n", &AddrSpec::Value(0)),
            Err(ElfAddrError::NotElf(_))
        ));
    }

    #[test]
    fn run_time_addresses_apply_the_pie_bias() {
        let maps = "555555554000-555555555000 r--p 00000000 08:01 42 /usr/bin/prog\n\
                    555555555000-555555556000 r-xp 00001000 08:01 42 /usr/bin/prog\n";
        let first = exe_first_page(maps, std::path::Path::new("/usr/bin/prog"));
        assert_eq!(first, Some(0x5555_5555_4000));
        assert_eq!(
            exe_first_page(maps, std::path::Path::new("/bin/other")),
            None
        );
        let pie = ElfAddr {
            value: 0x1139,
            pie_base: Some(0),
            loaded: true,
        };
        assert_eq!(runtime_address(&pie, first), Some(0x5555_5555_5139));
        assert_eq!(runtime_address(&pie, None), None);
        let fixed = ElfAddr {
            value: 0x401136,
            pie_base: None,
            loaded: true,
        };
        assert_eq!(runtime_address(&fixed, None), Some(0x401136));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("8192"), Ok(8192));
        assert_eq!(parse_size(" 2G "), Ok(2 << 30));
        for bad in ["", "K", "12Q", "-1", "1.5M", "100", "99999G"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.starts_with("--snapshot"), "{bad}: {e}");
            let e = parse_size_of("--limit", bad).unwrap_err();
            assert!(e.starts_with(&format!("--limit {bad:?}: ")), "{bad}: {e}");
        }
    }

    #[test]
    fn user_triggers() {
        assert_eq!(UserTrigger::parse("exit"), Ok(UserTrigger::Exit));
        assert_eq!(
            UserTrigger::parse("signal:USR2"),
            Ok(UserTrigger::Signal(12))
        );
        assert_eq!(
            UserTrigger::parse("signal:SIGUSR1"),
            Ok(UserTrigger::Signal(10))
        );
        assert_eq!(UserTrigger::parse("signal:40"), Ok(UserTrigger::Signal(40)));
        assert_eq!(
            UserTrigger::parse("syscall:getppid"),
            Ok(UserTrigger::Syscall(110))
        );
        assert_eq!(
            UserTrigger::parse("syscall:39"),
            Ok(UserTrigger::Syscall(39))
        );
        assert_eq!(
            UserTrigger::parse("addr:marker"),
            Ok(UserTrigger::Addr(AddrSpec::Symbol("marker".into())))
        );
        assert_eq!(
            UserTrigger::parse("addr:0x401136"),
            Ok(UserTrigger::Addr(AddrSpec::Value(0x401136)))
        );
        for bad in [
            "",
            "exit:now",
            "signal:KILL",
            "signal:SEGV",
            "signal:FOO",
            "syscall:nosuch",
            "syscall:5000",
            "addr:",
            "addr:0xzz",
            "when:1",
        ] {
            let e = UserTrigger::parse(bad).unwrap_err();
            assert!(e.starts_with("--trigger"), "{bad}: {e}");
        }
    }

    #[test]
    fn plugin_args_round_trip() {
        for t in [
            Trigger::Exit,
            Trigger::Signal(12),
            Trigger::Syscall(110),
            Trigger::Addr {
                value: 0x1139,
                pie_base: Some(0),
                label: "marker".into(),
            },
            Trigger::Addr {
                value: 0x401136,
                pie_base: None,
                label: "0x401136:x".into(),
            },
        ] {
            assert_eq!(Trigger::from_arg(&t.to_arg()), Some(t.clone()), "{t:?}");
        }
        assert_eq!(Trigger::from_arg("addr:zz::m"), None);
        assert_eq!(Trigger::Signal(12).describe(), "signal:SIGUSR2");
        assert_eq!(Trigger::Syscall(110).describe(), "syscall:getppid");
    }

    #[test]
    fn record_round_trip() {
        let r = SnapshotRecord {
            number: 3,
            kind: TriggerKind::Addr as u32,
            fired_tid: 77,
            tsc: 123,
            windows: 8,
            pt_bytes: 60000,
            discarded_windows: 900,
            discarded_pt_bytes: 7_000_000,
            ring_size: 65536,
            trigger: "addr:marker (0x401136)".into(),
        };
        let p = r.payload();
        assert_eq!(p.len(), SNAPSHOT_FIXED_SIZE + r.trigger.len());
        assert_eq!(SnapshotRecord::decode(&p), Some(r));
        assert_eq!(SnapshotRecord::decode(&p[..SNAPSHOT_FIXED_SIZE - 1]), None);
    }
}
