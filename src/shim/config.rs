//! Shim configuration from `PTTRACER_*` environment variables (normal context only).
//!
//! | variable               | values                                       | default   |
//! |------------------------|----------------------------------------------|-----------|
//! | `PTTRACER_OUT`         | output directory (created if missing)        | unset = shim inert |
//! | `PTTRACER_MODE`        | `kernel`, `user`, `user_kernel`              | `kernel`  |
//! | `PTTRACER_WINDOW`      | `syscall`, `thread`                          | `syscall` |
//! | `PTTRACER_SYSCALLS`    | comma list of names/numbers; `!x`/`-x` excludes | all    |
//! | `PTTRACER_PT_SHIFT`    | PT ring = 2^n pages, 1..=24                  | 8         |
//! | `PTTRACER_SB_SHIFT`    | sideband ring = 2^n pages, 1..=24            | 4         |
//! | `PTTRACER_QUEUE`       | windows buffered per thread (power of two, 64..=1048576; 104 bytes each, in the spool) | 2048 |
//! | `PTTRACER_BACKPRESSURE`| `block` or `drop`                            | `block`   |
//! | `PTTRACER_BACKEND`     | `auto`, `hardware`, `emulated`               | `auto`    |
//! | `PTTRACER_SPOOL`       | `on`: each thread's queue in a `<pid>-<nonce>-<tid>.spool` file mapping, so a SIGKILL loses nothing (see `shim::spool`); `off`: in memory | `on` |
//! | `PTTRACER_REWRITE`     | `sites`: patch `mov $nr,%eax; syscall` sites into jumps to recording stubs; `all`: also every other site via a page-0 trampoline (needs root); `off` (see `shim::rewrite`) | `sites` |
//! | `PTTRACER_SNAPSHOT`    | snapshot (flight-recorder) mode: PT bytes kept per thread (`64K`, `1M`; emulated backend, see `shim::snapshot::ring`) | off |
//! | `PTTRACER_TRIGGERS`    | comma list of snapshot triggers (`exit`, `signal:USR2`, `syscall:getppid`, `addr:marker`, `addr:0x401136`) | `exit` |
//!
//! `PTTRACER_SYSCALLS`: with at least one plain entry only the listed syscalls are
//! recorded; `!name` entries are never recorded. Every syscall is still intercepted
//! (the filter only decides what is written).

use crate::format::snapshot::{parse_size, AddrSpec, Trigger, UserTrigger};
use crate::tracer::{BackendChoice, Mode};
use std::path::PathBuf;

/// Window kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// One window per syscall, from entry to exit.
    Syscall,
    /// The thread's user execution between syscalls.
    Thread,
}

impl WindowKind {
    pub fn name(self) -> &'static str {
        match self {
            WindowKind::Syscall => "syscall",
            WindowKind::Thread => "thread",
        }
    }
    pub fn code(self) -> u8 {
        match self {
            WindowKind::Syscall => 0,
            WindowKind::Thread => 1,
        }
    }
}

/// What happens when a thread's window queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// The application thread waits for the writer (no loss).
    Block,
    /// The window is dropped and counted; the count is written as a `Dropped` record.
    Drop,
}

/// Number of syscall numbers the filter covers (x86-64 numbers are < 1024).
pub const FILTER_BITS: usize = 1024;

/// Which syscalls are recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallFilter {
    bits: [u64; FILTER_BITS / 64],
    /// Numbers >= FILTER_BITS are recorded iff this is set.
    pub others: bool,
}

impl Default for SyscallFilter {
    fn default() -> Self {
        SyscallFilter {
            bits: [u64::MAX; FILTER_BITS / 64],
            others: true,
        }
    }
}

impl SyscallFilter {
    /// Whether windows of syscall `nr` are recorded. Async-signal-safe.
    #[inline]
    pub fn records(&self, nr: u64) -> bool {
        if nr < FILTER_BITS as u64 {
            let i = nr as usize;
            self.bits
                .get(i / 64)
                .is_some_and(|w| w & (1 << (i % 64)) != 0)
        } else {
            self.others
        }
    }

    fn set(&mut self, nr: u64, on: bool) {
        if nr < FILTER_BITS as u64 {
            let i = nr as usize;
            if let Some(w) = self.bits.get_mut(i / 64) {
                if on {
                    *w |= 1 << (i % 64)
                } else {
                    *w &= !(1 << (i % 64))
                }
            }
        }
    }

    /// Parses `read,write,!getppid,39`.
    pub fn parse(spec: &str) -> Result<SyscallFilter, String> {
        let mut include = Vec::new();
        let mut exclude = Vec::new();
        for raw in spec.split(',') {
            let item = raw.trim();
            if item.is_empty() {
                continue;
            }
            let (neg, name) = match item.strip_prefix('!').or_else(|| item.strip_prefix('-')) {
                Some(rest) => (true, rest.trim()),
                None => (false, item),
            };
            let nr = match name.parse::<u64>() {
                Ok(n) if n < FILTER_BITS as u64 => n,
                Ok(n) => {
                    return Err(format!(
                        "PTTRACER_SYSCALLS: syscall number {n} is out of range 0..{FILTER_BITS}"
                    ))
                }
                Err(_) => super::sysnames::number(name).ok_or_else(|| {
                    format!(
                        "PTTRACER_SYSCALLS: {name:?} is not an x86-64 syscall name or number \
                         (examples: read, getppid, 39, !futex)"
                    )
                })?,
            };
            if neg {
                exclude.push(nr)
            } else {
                include.push(nr)
            }
        }
        let mut f = SyscallFilter::default();
        if !include.is_empty() {
            f = SyscallFilter {
                bits: [0; FILTER_BITS / 64],
                others: false,
            };
            for n in include {
                f.set(n, true);
            }
        }
        for n in exclude {
            f.set(n, false);
        }
        Ok(f)
    }
}

/// The shim's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShimConfig {
    pub out_dir: PathBuf,
    pub mode: Mode,
    pub window: WindowKind,
    pub filter: SyscallFilter,
    pub filter_spec: String,
    pub pt_shift: u32,
    pub sb_shift: u32,
    pub queue: usize,
    pub backpressure: Backpressure,
    /// Keep each thread's queue in a `.spool` file so a SIGKILL loses nothing
    /// (`PTTRACER_SPOOL=on`, the default; `off`: in memory only).
    pub spool: bool,
    pub backend: BackendChoice,
    pub rewrite: RewriteKind,
    /// Snapshot (flight-recorder) mode: PT bytes kept per thread (`PTTRACER_SNAPSHOT`).
    pub snapshot: Option<u64>,
    /// Snapshot triggers (`PTTRACER_TRIGGERS`; `exit` when none is given).
    pub triggers: Vec<UserTrigger>,
}

/// Which syscall sites the shim patches into direct calls (see `shim::rewrite`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewriteKind {
    /// Every syscall takes the SIGSYS path.
    Off,
    /// Sites of the form `mov $nr,%eax; syscall` jump to per-site stubs (no privileges).
    Sites,
    /// `Sites`, plus every other site through a trampoline at page 0 (zpoline; needs
    /// CAP_SYS_RAWIO or vm.mmap_min_addr=0).
    All,
}

impl RewriteKind {
    pub fn parse(v: &str) -> Result<RewriteKind, String> {
        match v.trim() {
            "" | "sites" => Ok(RewriteKind::Sites),
            "0" | "no" | "off" => Ok(RewriteKind::Off),
            "1" | "yes" | "on" | "all" => Ok(RewriteKind::All),
            o => Err(format!(
                "{ENV_REWRITE}={o:?} is not a rewrite level: use sites, all or off"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RewriteKind::Off => "off",
            RewriteKind::Sites => "sites",
            RewriteKind::All => "all",
        }
    }
}

pub const ENV_OUT: &str = "PTTRACER_OUT";
pub const ENV_MODE: &str = "PTTRACER_MODE";
pub const ENV_WINDOW: &str = "PTTRACER_WINDOW";
pub const ENV_SYSCALLS: &str = "PTTRACER_SYSCALLS";
pub const ENV_PT_SHIFT: &str = "PTTRACER_PT_SHIFT";
pub const ENV_SB_SHIFT: &str = "PTTRACER_SB_SHIFT";
pub const ENV_QUEUE: &str = "PTTRACER_QUEUE";
pub const ENV_BACKPRESSURE: &str = "PTTRACER_BACKPRESSURE";
pub const ENV_BACKEND: &str = crate::tracer::BACKEND_ENV;
pub const ENV_REWRITE: &str = "PTTRACER_REWRITE";
pub const ENV_SPOOL: &str = "PTTRACER_SPOOL";
pub const ENV_SNAPSHOT: &str = "PTTRACER_SNAPSHOT";
pub const ENV_TRIGGERS: &str = "PTTRACER_TRIGGERS";

/// Every variable the shim reads, in the order `Config` records list them.
pub const ALL_VARS: [&str; 13] = [
    ENV_OUT,
    ENV_MODE,
    ENV_WINDOW,
    ENV_SYSCALLS,
    ENV_PT_SHIFT,
    ENV_SB_SHIFT,
    ENV_QUEUE,
    ENV_BACKPRESSURE,
    ENV_BACKEND,
    ENV_REWRITE,
    ENV_SPOOL,
    ENV_SNAPSHOT,
    ENV_TRIGGERS,
];

pub fn parse_mode(v: &str) -> Result<Mode, String> {
    match v.trim() {
        "" | "kernel" => Ok(Mode::KernelOnly),
        "user" => Ok(Mode::UserOnly),
        "user_kernel" | "user-kernel" => Ok(Mode::UserAndKernel),
        o => Err(format!(
            "{ENV_MODE}={o:?} is not a mode: use kernel, user or user_kernel"
        )),
    }
}

pub fn parse_window(v: &str) -> Result<WindowKind, String> {
    match v.trim() {
        "" | "syscall" => Ok(WindowKind::Syscall),
        "thread" => Ok(WindowKind::Thread),
        o => Err(format!(
            "{ENV_WINDOW}={o:?} is not a window kind: use syscall or thread"
        )),
    }
}

fn parse_num(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let n: u64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{name}={v:?} is not a number (expected {lo}..={hi})"))?;
    if n < lo || n > hi {
        return Err(format!("{name}={n} is out of range {lo}..={hi}"));
    }
    Ok(n)
}

impl ShimConfig {
    /// Reads the configuration from `get` (e.g. `|k| std::env::var(k).ok()`).
    /// `Ok(None)`: `PTTRACER_OUT` is unset or empty, the shim stays inert.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<ShimConfig>, String> {
        let out = match get(ENV_OUT) {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => return Ok(None),
        };
        let mode = parse_mode(&get(ENV_MODE).unwrap_or_default())?;
        let window = parse_window(&get(ENV_WINDOW).unwrap_or_default())?;
        let filter_spec = get(ENV_SYSCALLS).unwrap_or_default();
        let filter = SyscallFilter::parse(&filter_spec)?;
        let num = |name: &str, def: u64, lo: u64, hi: u64| -> Result<u64, String> {
            match get(name) {
                Some(v) if !v.trim().is_empty() => parse_num(name, &v, lo, hi),
                _ => Ok(def),
            }
        };
        let max = u64::from(crate::tracer::MAX_SIZE_SHIFT);
        let pt_shift = num(ENV_PT_SHIFT, 8, 1, max)? as u32;
        let sb_shift = num(ENV_SB_SHIFT, 4, 1, max)? as u32;
        let queue = num(ENV_QUEUE, 2048, 64, 1 << 20)? as usize;
        if !queue.is_power_of_two() {
            return Err(format!(
                "{ENV_QUEUE}={queue} must be a power of two (e.g. 4096, 8192)"
            ));
        }
        let backpressure = match get(ENV_BACKPRESSURE).unwrap_or_default().trim() {
            "" | "block" => Backpressure::Block,
            "drop" => Backpressure::Drop,
            o => {
                return Err(format!(
                    "{ENV_BACKPRESSURE}={o:?} is not a policy: use block or drop"
                ))
            }
        };
        let spool = match get(ENV_SPOOL).unwrap_or_default().trim() {
            "" | "on" | "1" => true,
            "off" | "0" => false,
            o => return Err(format!("{ENV_SPOOL}={o:?} is not a setting: use on or off")),
        };
        let backend =
            BackendChoice::parse(&get(ENV_BACKEND).unwrap_or_default()).map_err(|e| e.message)?;
        let rewrite = RewriteKind::parse(&get(ENV_REWRITE).unwrap_or_default())?;
        let (snapshot, triggers) = parse_snapshot(
            get(ENV_SNAPSHOT).unwrap_or_default().trim(),
            get(ENV_TRIGGERS).unwrap_or_default().trim(),
        )?;
        Ok(Some(ShimConfig {
            out_dir: out,
            mode,
            window,
            filter,
            filter_spec,
            pt_shift,
            sb_shift,
            queue,
            backpressure,
            spool,
            backend,
            rewrite,
            snapshot,
            triggers,
        }))
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Option<ShimConfig>, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// `NAME=value` lines describing the effective settings (for the `Config` record).
    pub fn describe(&self) -> String {
        format!(
            "{ENV_OUT}={}\n{ENV_MODE}={}\n{ENV_WINDOW}={}\n{ENV_SYSCALLS}={}\n{ENV_PT_SHIFT}={}\n\
             {ENV_SB_SHIFT}={}\n{ENV_QUEUE}={}\n{ENV_BACKPRESSURE}={}\n\
             {ENV_BACKEND}={:?}\n{ENV_REWRITE}={}\n{ENV_SPOOL}={}\n",
            self.out_dir.display(),
            self.mode.name(),
            self.window.name(),
            self.filter_spec,
            self.pt_shift,
            self.sb_shift,
            self.queue,
            match self.backpressure {
                Backpressure::Block => "block",
                Backpressure::Drop => "drop",
            },
            self.backend,
            self.rewrite.name(),
            if self.spool { "on" } else { "off" },
        ) + &self.describe_snapshot()
    }

    /// The snapshot settings' lines (`pttrace report` prints them), empty without.
    fn describe_snapshot(&self) -> String {
        let Some(size) = self.snapshot else {
            return String::new();
        };
        let t: Vec<String> = self.triggers.iter().map(describe_trigger).collect();
        format!("{ENV_SNAPSHOT}={size}\n{ENV_TRIGGERS}={}\n", t.join(","))
    }
}

/// How notes and the `Config` record name a trigger (`addr:marker`, `syscall:getppid`).
pub fn describe_trigger(t: &UserTrigger) -> String {
    match t {
        UserTrigger::Exit => Trigger::Exit.describe(),
        UserTrigger::Signal(s) => Trigger::Signal(*s).describe(),
        UserTrigger::Syscall(nr) => Trigger::Syscall(*nr).describe(),
        UserTrigger::Addr(AddrSpec::Symbol(s)) => format!("addr:{s}"),
        UserTrigger::Addr(AddrSpec::Value(v)) => format!("addr:{v:#x}"),
    }
}

/// `PTTRACER_SNAPSHOT` (a size, see [`parse_size`]) and `PTTRACER_TRIGGERS` (a comma list
/// of `--trigger` values; `exit` when empty). Triggers without a size are an error.
fn parse_snapshot(size: &str, triggers: &str) -> Result<(Option<u64>, Vec<UserTrigger>), String> {
    if size.is_empty() {
        if !triggers.is_empty() {
            return Err(format!(
                "{ENV_TRIGGERS}={triggers:?} needs {ENV_SNAPSHOT}=SIZE (triggers write the \
                 flight recorder's ring)"
            ));
        }
        return Ok((None, Vec::new()));
    }
    let size = parse_size(size).map_err(|e| format!("{ENV_SNAPSHOT}: {e}"))?;
    let mut list = triggers
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| UserTrigger::parse(t).map_err(|e| format!("{ENV_TRIGGERS}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if list.is_empty() {
        list.push(UserTrigger::Exit);
    }
    Ok((Some(size), list))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Option<ShimConfig>, String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ShimConfig::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn inert_without_out() {
        assert_eq!(cfg(&[]), Ok(None));
        assert_eq!(cfg(&[(ENV_OUT, ""), (ENV_MODE, "bogus")]), Ok(None));
    }

    #[test]
    fn defaults_and_values() {
        let c = cfg(&[(ENV_OUT, "/tmp/x")]).unwrap().unwrap();
        assert_eq!(c.mode, Mode::KernelOnly);
        assert_eq!(c.window, WindowKind::Syscall);
        assert_eq!(c.backpressure, Backpressure::Block);
        assert_eq!(c.rewrite, RewriteKind::Sites);
        assert!(c.filter.records(0) && c.filter.records(435) && c.filter.records(5000));
        let c = cfg(&[
            (ENV_OUT, "/tmp/x"),
            (ENV_MODE, "user_kernel"),
            (ENV_WINDOW, "thread"),
            (ENV_QUEUE, "1024"),
            (ENV_BACKPRESSURE, "drop"),
            (ENV_BACKEND, "emulated"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.mode, Mode::UserAndKernel);
        assert_eq!(c.window, WindowKind::Thread);
        assert_eq!(c.queue, 1024);
        assert_eq!(c.backpressure, Backpressure::Drop);
        assert_eq!(c.backend, BackendChoice::Emulated);
        for (v, k) in [
            ("off", RewriteKind::Off),
            ("0", RewriteKind::Off),
            ("sites", RewriteKind::Sites),
            ("all", RewriteKind::All),
            ("1", RewriteKind::All),
        ] {
            let c = cfg(&[(ENV_OUT, "/x"), (ENV_REWRITE, v)]).unwrap().unwrap();
            assert_eq!(c.rewrite, k, "{v}");
            assert!(c
                .describe()
                .contains(&format!("PTTRACER_REWRITE={}\n", k.name())));
        }
    }

    #[test]
    fn invalid_values_are_named() {
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_MODE, "kernal")]).unwrap_err();
        assert!(e.contains("PTTRACER_MODE=\"kernal\""), "{e}");
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_QUEUE, "1000")]).unwrap_err();
        assert!(e.contains("power of two"), "{e}");
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_SYSCALLS, "getppid,nosuch")]).unwrap_err();
        assert!(e.contains("\"nosuch\""), "{e}");
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_PT_SHIFT, "0")]).unwrap_err();
        assert!(e.contains("PTTRACER_PT_SHIFT=0 is out of range"), "{e}");
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_BACKEND, "gpu")]).unwrap_err();
        assert!(e.contains("gpu"), "{e}");
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_REWRITE, "some")]).unwrap_err();
        assert!(e.contains("PTTRACER_REWRITE=\"some\""), "{e}");
        let e = cfg(&[(ENV_OUT, "/x"), (ENV_SPOOL, "maybe")]).unwrap_err();
        assert_eq!(
            e,
            "PTTRACER_SPOOL=\"maybe\" is not a setting: use on or off"
        );
        let c = cfg(&[(ENV_OUT, "/x"), (ENV_SPOOL, "off")])
            .unwrap()
            .unwrap();
        assert!(!c.spool && c.describe().contains("PTTRACER_SPOOL=off\n"));
    }

    #[test]
    fn filter_include_and_exclude() {
        let f = SyscallFilter::parse("getppid, 39").unwrap();
        assert!(f.records(110) && f.records(39));
        assert!(!f.records(0) && !f.records(5000));
        let f = SyscallFilter::parse("!futex,-1").unwrap();
        assert!(!f.records(202) && !f.records(1));
        assert!(f.records(0) && f.records(5000));
        let f = SyscallFilter::parse("read,write,!write").unwrap();
        assert!(f.records(0) && !f.records(1));
    }
}
