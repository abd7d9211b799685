//! The guest's file mappings, as the `Maps` records of the process image's info file
//! (`/proc/self/maps` lines), from which readers name the code.
//!
//! Guest memory is host memory here (QEMU's own `/proc/self/maps`, below the host's own
//! areas at 0x7000_0000_0000 and up, and not QEMU's executable). QEMU maps guest code
//! without PROT_EXEC (it never runs it natively), so a mapping is marked executable (`x`)
//! here when a translated block starts in it: readers take executable file mappings as
//! code images.
//!
//! The record is written when the process image ends (exit, exec), and also as soon as
//! code first runs in a file mapping the last record did not mark as code ([`Written`]):
//! a process that dies of a signal (a crash, `abort()`, SIGTERM, SIGKILL), which ends
//! QEMU without its exit callbacks, still has its code named. Readers take the last
//! record. A handful of records per process (one per library whose code runs).

use std::path::Path;

use pttrace_format::maps::MapsEntry;

/// Where QEMU's own (host) mappings start.
const HOST_AREAS: u64 = 0x7000_0000_0000;

/// A range of guest memory the last written record accounts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u64,
    end: u64,
    /// Code there is named by that record: a file mapping it marked as code, or memory no
    /// file backs (named otherwise: perf maps, or by address).
    settled: bool,
}

/// What the last `Maps` record written says, to tell when code runs where it says too
/// little.
#[derive(Default)]
pub struct Written {
    /// By start address.
    ranges: Vec<Range>,
    /// Where code ran that no guest mapping holds (a mapping among the host's areas, such
    /// as node's copy of its builtins, or none), by start address: nothing a record can
    /// say of it, kept from record to record.
    elsewhere: Vec<(u64, u64)>,
}

/// Whether one of `ranges` (by start, not overlapping) holds `addr` and is `ok`.
fn held<T>(
    ranges: &[T],
    addr: u64,
    bounds: impl Fn(&T) -> (u64, u64),
    ok: impl Fn(&T) -> bool,
) -> bool {
    let i = ranges.partition_point(|r| bounds(r).0 <= addr);
    i.checked_sub(1)
        .and_then(|i| ranges.get(i))
        .is_some_and(|r| addr < bounds(r).1 && ok(r))
}

impl Written {
    /// Whether code at `addr` is accounted for by the last record (`false` before any).
    pub fn covers(&self, addr: u64) -> bool {
        held(&self.ranges, addr, |r| (r.start, r.end), |r| r.settled)
            || held(&self.elsewhere, addr, |&r| r, |_| true)
    }

    /// The record's text now, with code marked where `ran` says a block started, and
    /// remembered as the last written; `addr`, where code runs (if any), is accounted for
    /// from now on even where no mapping lists it (no record is written again for it).
    pub fn take(&mut self, ran: impl Fn(u64, u64) -> bool, addr: Option<u64>) -> String {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let (out, ranges) = guest_maps(&text, &own_exe(), ran);
        if let Some(addr) = addr.filter(|&a| !ranges.iter().any(|r| r.start <= a && a < r.end)) {
            let page = addr & !0xfff;
            let area = text
                .lines()
                .filter_map(MapsEntry::parse)
                .find(|m| m.start <= addr && addr < m.end)
                .map_or((page, page.saturating_add(0x1000)), |m| (m.start, m.end));
            self.elsewhere.push(area);
            self.elsewhere.sort_unstable();
        }
        self.ranges = ranges;
        out
    }
}

/// QEMU's executable, whose mappings are not the guest's.
fn own_exe() -> std::path::PathBuf {
    std::fs::read_link("/proc/self/exe").unwrap_or_default()
}

/// The record's text now, with code marked where `ran` says a block started (for the
/// record written at the end).
pub fn guest_file_maps(ran: impl Fn(u64, u64) -> bool) -> String {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    guest_maps(&text, &own_exe(), ran).0
}

/// From `/proc/self/maps` text: the guest's file mapping lines (those `ran` says code ran
/// in marked `x`), and every guest range with whether it is settled ([`Range`]).
fn guest_maps(text: &str, exe: &Path, ran: impl Fn(u64, u64) -> bool) -> (String, Vec<Range>) {
    let mut out = String::new();
    let mut ranges = Vec::new();
    for line in text.lines() {
        let Some(m) = MapsEntry::parse(line) else {
            continue;
        };
        if m.start >= HOST_AREAS || Path::new(&m.path) == exe {
            continue;
        }
        let file = m.path.starts_with('/');
        let mut code = m.exec;
        if file {
            match line.split_once(' ') {
                Some((range, rest)) if !m.exec && ran(m.start, m.end) && rest.len() > 3 => {
                    code = true;
                    out.push_str(range);
                    out.push(' ');
                    out.push_str(&rest[..2]);
                    out.push('x');
                    out.push_str(&rest[3..]);
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        ranges.push(Range {
            start: m.start,
            end: m.end,
            settled: !file || code,
        });
    }
    ranges.sort_unstable_by_key(|r| r.start);
    (out, ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
4000000000-4000001000 r--p 00000000 08:01 100 /usr/bin/prog
4000001000-4000002000 r--p 00001000 08:01 100 /usr/bin/prog
4000800000-4000900000 rw-p 00000000 00:00 0 
4001000000-4001010000 r--p 00010000 08:01 200 /usr/lib/libc.so.6
55d000000000-55d000100000 r-xp 00000000 08:01 300 /usr/bin/qemu-x86_64
7f0000000000-7f0000010000 r-xp 00000000 08:01 400 /usr/lib/host.so
";

    #[test]
    fn file_mappings_where_code_ran_are_marked_and_the_rest_is_accounted_for() {
        let exe = Path::new("/usr/bin/qemu-x86_64");
        let ran = |a: u64, _| a == 0x40_0000_1000;
        let (text, ranges) = guest_maps(MAPS, exe, ran);
        assert_eq!(
            text,
            "4000000000-4000001000 r--p 00000000 08:01 100 /usr/bin/prog\n\
             4000001000-4000002000 r-xp 00001000 08:01 100 /usr/bin/prog\n\
             4001000000-4001010000 r--p 00010000 08:01 200 /usr/lib/libc.so.6\n"
        );
        let mut w = Written {
            ranges,
            elsewhere: vec![(0x55d0_0000_0000, 0x55d0_0010_0000)],
        };
        // Marked code, and anonymous memory: accounted for.
        assert!(w.covers(0x40_0000_1000) && w.covers(0x40_0000_1fff));
        assert!(w.covers(0x40_0080_0010));
        // A file mapping not marked (libc's code ran only after), one not listed yet,
        // QEMU's own: not.
        assert!(!w.covers(0x40_0100_0000));
        assert!(!w.covers(0x40_0000_0010));
        assert!(!w.covers(0x40_0200_0000));
        assert!(!Written::default().covers(0x40_0000_1000));
        // Code already seen among QEMU's own areas: accounted for, whatever the record.
        assert!(w.covers(0x55d0_0000_0010));
        w.ranges.clear();
        assert!(w.covers(0x55d0_0000_0010));
    }
}
