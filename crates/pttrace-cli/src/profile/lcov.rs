//! Line coverage in lcov's tracefile format (`genhtml FILE`): per source file, its
//! functions (`FN`/`FNDA`: the line of each function symbol's first instruction, how often
//! that instruction ran) and every line the binary's DWARF line tables hold (`DA`: the
//! count of the line's most executed instruction; 0 for a line never run), with branch
//! coverage (`BRDA`): each conditional branch of a line (found by disassembling the line's
//! code), in address order, as two branches: taken and not taken, with how often (`-`
//! where its line never ran, 0 where the line ran but the branch instruction did not).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::Counts;

#[derive(Default)]
struct File {
    /// Line -> count.
    lines: BTreeMap<u32, u64>,
    /// (line, name) -> entries.
    functions: BTreeMap<(u32, String), u64>,
    /// Line -> its conditional branches in address order: (executions, taken).
    branches: BTreeMap<u32, Vec<(u64, u64)>>,
}

/// Writes the coverage of `binary` from `counts` to `out`; says what was written.
pub fn write(
    out: &Path,
    binary: &Path,
    debug_dirs: &[PathBuf],
    counts: &Counts,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut search = pttrace_symbols::DebugSearch::new();
    for d in debug_dirs {
        search.add_debug_dir(d);
    }
    let module = pttrace_symbols::Module::open(binary, &search)
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    let rows = module.line_rows();
    if rows.is_empty() {
        return Err(format!(
            "{}: no DWARF line tables (build it with -g, or give its debug file's \
             directory with --debug-dir)",
            binary.display()
        )
        .into());
    }
    // Executed instructions in address order, to take each row's share in one pass.
    let mut executed: Vec<(u64, u64)> = counts.instructions.iter().map(|(&a, &n)| (a, n)).collect();
    executed.sort_unstable();
    let mut files: BTreeMap<&str, File> = BTreeMap::new();
    for r in &rows {
        let from = executed.partition_point(|&(a, _)| a < r.addr);
        let most = executed[from..]
            .iter()
            .take_while(|&&(a, _)| a < r.addr.saturating_add(r.size))
            .map(|&(_, n)| n)
            .max()
            .unwrap_or(0);
        let line = files
            .entry(&r.file)
            .or_default()
            .lines
            .entry(r.line)
            .or_insert(0);
        *line = (*line).max(most);
    }
    // Conditional branches, by disassembling each row's code.
    let mut taken: std::collections::HashMap<u64, u64> = Default::default();
    for (&(from, _), &n) in &counts.branches {
        *taken.entry(from).or_insert(0) += n;
    }
    if let Ok(map) = drpttracer::decode::image::Backing::map_file(binary) {
        use iced_x86::{Decoder, DecoderOptions, FlowControl};
        let bytes = map.bytes();
        for r in &rows {
            let Some(off) = module.addr_to_file_offset(r.addr) else {
                continue;
            };
            let Some(code) = usize::try_from(off)
                .ok()
                .and_then(|o| bytes.get(o..o.saturating_add(r.size as usize)))
            else {
                continue;
            };
            let mut d = Decoder::with_ip(64, code, r.addr, DecoderOptions::NONE);
            while d.can_decode() {
                let i = d.decode();
                if i.flow_control() == FlowControl::ConditionalBranch {
                    let ran = counts.instructions.get(&i.ip()).copied().unwrap_or(0);
                    let t = taken.get(&i.ip()).copied().unwrap_or(0).min(ran);
                    let f = files.entry(&r.file).or_default();
                    f.branches.entry(r.line).or_default().push((ran, t));
                }
            }
        }
    }
    for (start, _, name) in module.functions() {
        // The row holding the function's first instruction.
        let at = rows.partition_point(|r| r.addr <= start);
        let Some(r) = at.checked_sub(1).map(|k| &rows[k]) else {
            continue;
        };
        if start >= r.addr.saturating_add(r.size) {
            continue;
        }
        let entered = counts.instructions.get(&start).copied().unwrap_or(0);
        let name = pttrace_symbols::demangle(name).into_owned();
        let f = files.entry(&r.file).or_default();
        let e = f.functions.entry((r.line, name)).or_insert(0);
        *e = (*e).max(entered);
    }
    // Written whole at the end (a tracefile is a few MB even for libc).
    let mut w: Vec<u8> = Vec::new();
    let (mut lines, mut hit) = (0usize, 0usize);
    writeln!(w, "TN:")?;
    for (path, f) in &files {
        writeln!(w, "SF:{path}")?;
        for (line, name) in f.functions.keys() {
            writeln!(w, "FN:{line},{name}")?;
        }
        for ((_, name), n) in &f.functions {
            writeln!(w, "FNDA:{n},{name}")?;
        }
        writeln!(w, "FNF:{}", f.functions.len())?;
        writeln!(
            w,
            "FNH:{}",
            f.functions.values().filter(|&&n| n > 0).count()
        )?;
        let (mut brf, mut brh) = (0usize, 0usize);
        for (line, bs) in &f.branches {
            let line_ran = f.lines.get(line).is_some_and(|&n| n > 0);
            for (block, &(ran, t)) in bs.iter().enumerate() {
                for (k, n) in [t, ran - t].into_iter().enumerate() {
                    brf += 1;
                    brh += usize::from(n > 0);
                    if line_ran {
                        writeln!(w, "BRDA:{line},{block},{k},{n}")?;
                    } else {
                        writeln!(w, "BRDA:{line},{block},{k},-")?;
                    }
                }
            }
        }
        writeln!(w, "BRF:{brf}")?;
        writeln!(w, "BRH:{brh}")?;
        for (line, n) in &f.lines {
            writeln!(w, "DA:{line},{n}")?;
        }
        let h = f.lines.values().filter(|&&n| n > 0).count();
        writeln!(w, "LF:{}", f.lines.len())?;
        writeln!(w, "LH:{h}")?;
        writeln!(w, "end_of_record")?;
        lines += f.lines.len();
        hit += h;
    }
    crate::outfile::OutFile::create(out)
        .and_then(|mut f| {
            f.write_all(&w)?;
            f.commit()
        })
        .map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(format!(
        "{} source files, {hit} of {lines} lines run",
        files.len()
    ))
}
