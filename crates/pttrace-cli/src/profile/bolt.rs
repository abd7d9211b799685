//! BOLT's pre-aggregated profile (`llvm-bolt BIN -pa -p FILE`, or `perf2bolt -pa`): one
//! line per distinct taken branch, `B <source> <target> <count> <mispredictions>`, and per
//! distinct straight-line run, `F <first> <last> <count>` (from a taken branch's target
//! to the next taken branch's source, as consecutive LBR entries give them to BOLT);
//! addresses in hex, at the binary's link-time addresses (a non-PIE executable's run-time
//! ones). A trace has no mispredictions: 0. Runs inside PLT stubs (one `jmp *GOT` each)
//! are left out: BOLT has no control flow for them and counts them as mismatching.

use std::io::Write;
use std::path::Path;

use super::Counts;

/// Writes `counts` of `binary` to `out`; says what was written.
pub fn write(out: &Path, binary: &Path, counts: &Counts) -> std::io::Result<String> {
    let plt = plt_sections(binary);
    let in_plt = |a: u64| plt.iter().any(|&(lo, hi)| a >= lo && a < hi);
    let mut branches: Vec<_> = counts.branches.iter().collect();
    branches.sort_unstable();
    let mut runs: Vec<_> = counts
        .runs
        .iter()
        .filter(|((first, _), _)| !in_plt(*first))
        .collect();
    runs.sort_unstable();
    let mut w = std::io::BufWriter::new(crate::outfile::OutFile::create(out)?);
    for ((from, to), n) in &branches {
        writeln!(w, "B {from:x} {to:x} {n} 0")?;
    }
    for ((first, last), n) in &runs {
        writeln!(w, "F {first:x} {last:x} {n}")?;
    }
    crate::outfile::commit_buffered(w)?;
    let taken: u64 = branches.iter().map(|(_, n)| **n).sum();
    Ok(format!(
        "{} branches ({taken} taken), {} straight-line runs ({} in PLT stubs left out)",
        branches.len(),
        runs.len(),
        counts.runs.len() - runs.len()
    ))
}

/// The link-time ranges of `binary`'s PLT sections (`.plt`, `.plt.got`, `.plt.sec`).
fn plt_sections(binary: &Path) -> Vec<(u64, u64)> {
    use object::{Object, ObjectSection};
    let Ok(map) = drpttracer::decode::image::Backing::map_file(binary) else {
        return Vec::new();
    };
    let Ok(obj) = object::File::parse(map.bytes()) else {
        return Vec::new();
    };
    obj.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
        .map(|s| (s.address(), s.address().saturating_add(s.size())))
        .collect()
}
