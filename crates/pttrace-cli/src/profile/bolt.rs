//! BOLT's pre-aggregated profile (`llvm-bolt BIN -pa -p FILE`, or `perf2bolt -pa`): one
//! line per distinct taken branch, `B <source> <target> <count> <mispredictions>`, and per
//! distinct straight-line run, `F <first> <last> <count>` (from a taken branch's target
//! to the next taken branch's source, as consecutive LBR entries give them to BOLT);
//! addresses in hex, at the binary's link-time addresses (a non-PIE executable's run-time
//! ones). A trace has no mispredictions: 0.

use std::io::Write;
use std::path::Path;

use super::Counts;

/// Writes `counts` to `out`; says what was written.
pub fn write(out: &Path, counts: &Counts) -> std::io::Result<String> {
    let mut branches: Vec<_> = counts.branches.iter().collect();
    branches.sort_unstable();
    let mut runs: Vec<_> = counts.runs.iter().collect();
    runs.sort_unstable();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out)?);
    for ((from, to), n) in &branches {
        writeln!(w, "B {from:x} {to:x} {n} 0")?;
    }
    for ((first, last), n) in &runs {
        writeln!(w, "F {first:x} {last:x} {n}")?;
    }
    w.flush()?;
    let taken: u64 = branches.iter().map(|(_, n)| **n).sum();
    Ok(format!(
        "{} branches ({taken} taken), {} straight-line runs",
        branches.len(),
        runs.len()
    ))
}
