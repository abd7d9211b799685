//! `pttrace profile`: BOLT's pre-aggregated profile with exact counts (a loop whose
//! branches are at labels), and lcov line coverage equal to gcov's on the same program
//! (gcov through `lcov --capture`; SKIP without lcov).

mod shim_util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use shim_util::{compile_with, have, pttrace, qemu_available, run_under_qemu, symbol, text};

/// `tests/progs/<name>.c` built with `flags` into `dir` and traced whole by the QEMU
/// backend into `dir/trace`: the program and the trace.
fn traced(dir: &Path, name: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    shim_util::plugin();
    let prog = compile_with(name, dir, name, flags);
    let trace = dir.join("trace");
    let o = run_under_qemu(&trace, &[], &[prog.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o));
    (prog, trace)
}

/// Runs `pttrace profile trace --format <format> -o out` (must succeed); its file.
fn profile(trace: &Path, format: &str, out: &Path) -> String {
    let o = Command::new(pttrace())
        .arg("profile")
        .arg(trace)
        .args(["--format", format, "-o"])
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn bolt_profile_counts_every_branch_and_run_of_a_loop_exactly() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (prog, trace) = traced(dir.path(), "branches", &["-no-pie"]);
    let at = |name: &str| symbol(&prog, name);
    let (entry, head, skip, skip_to, back, exit) = (
        at("count_loop"),
        at("loop_head"),
        at("skip_branch"),
        at("skip_target"),
        at("back_branch"),
        at("loop_exit"),
    );
    // `mov %ecx, %eax` (2 bytes), then `ret`.
    let ret = exit + 2;
    let text = profile(&trace, "bolt", &dir.path().join("prof.pa"));
    let inside = |a: u64| (entry..=ret).contains(&a);
    let mut got: BTreeSet<String> = BTreeSet::new();
    let (mut calls_in, mut rets_out) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let addr = |k: usize| u64::from_str_radix(f[k], 16).unwrap();
        match f[0] {
            "B" => {
                assert_eq!(f.len(), 5, "{line}");
                assert_eq!(f[4], "0", "no mispredictions in a trace: {line}");
                match (inside(addr(1)), inside(addr(2))) {
                    (true, true) => {
                        got.insert(line.to_string());
                    }
                    (false, true) => calls_in.push(line.to_string()),
                    (true, false) => rets_out.push((addr(1), f[3].to_string())),
                    _ => {}
                }
            }
            "F" => {
                assert_eq!(f.len(), 4, "{line}");
                if inside(addr(1)) || inside(addr(2)) {
                    got.insert(line.to_string());
                }
            }
            _ => panic!("not a pre-aggregated line: {line}"),
        }
    }
    // 3000 iterations: skip_branch taken unless the counter reaches 3 (2000 of 3000);
    // back_branch taken but on the last. Straight-line runs: from the entry or a branch's
    // target to the next taken branch (or the final ret).
    let want: BTreeSet<String> = [
        format!("B {skip:x} {skip_to:x} 2000 0"),
        format!("B {back:x} {head:x} 2999 0"),
        format!("F {entry:x} {skip:x} 1"),
        format!("F {head:x} {skip:x} 1999"),
        format!("F {skip_to:x} {back:x} 2000"),
        format!("F {head:x} {back:x} 999"),
        format!("F {head:x} {ret:x} 1"),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want, "profile:\n{text}");
    assert_eq!(calls_in.len(), 1, "one call into count_loop: {calls_in:?}");
    assert!(
        calls_in[0].contains(&format!(" {entry:x} 1 0")),
        "{calls_in:?}"
    );
    assert_eq!(rets_out, vec![(ret, "1".to_string())]);

    // Two processes of the same binary (under a shell, named with --binary): twice the
    // counts.
    let twice = dir.path().join("twice");
    let line = format!("{p} && {p}", p = prog.display());
    let o = run_under_qemu(
        &twice,
        &[],
        &["/bin/sh".as_ref(), "-c".as_ref(), line.as_ref()],
    );
    assert!(o.status.success(), "{}", shim_util::text(&o));
    let out = dir.path().join("twice.pa");
    let o = Command::new(pttrace())
        .arg("profile")
        .arg(&twice)
        .args(["--format", "bolt", "-o"])
        .arg(&out)
        .arg("--binary")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", shim_util::text(&o));
    let both = std::fs::read_to_string(&out).unwrap();
    for l in [
        format!("B {skip:x} {skip_to:x} 4000 0"),
        format!("B {back:x} {head:x} 5998 0"),
        format!("F {head:x} {skip:x} 3998"),
    ] {
        assert!(both.lines().any(|x| x == l), "{l} not in\n{both}");
    }

    // BOLT 16 reads it, where installed.
    if have("llvm-bolt-16") {
        let o = Command::new("llvm-bolt-16")
            .arg(&prog)
            .arg("-o")
            .arg(dir.path().join("bolted"))
            .arg("-pa")
            .arg("-p")
            .arg(dir.path().join("prof.pa"))
            .output()
            .unwrap();
        let all = text_of(&o);
        assert!(o.status.success(), "{all}");
        assert!(
            all.contains(&format!(
                "read {} aggregated LBR entries",
                text.lines().count()
            )),
            "{all}"
        );
        assert!(all.contains("have non-empty execution profile"), "{all}");
    } else {
        println!("SKIP: llvm-bolt-16 is not installed (apt-get install bolt-16)");
    }
}

fn text_of(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `DA` lines of `file` in an lcov tracefile: line -> count.
fn lines_of(info: &str, file: &str) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    let mut current = false;
    for l in info.lines() {
        if let Some(sf) = l.strip_prefix("SF:") {
            current = sf.ends_with(file);
        } else if let (true, Some(da)) = (current, l.strip_prefix("DA:")) {
            let mut f = da.split(',');
            let line = f.next().unwrap().parse().unwrap();
            let n = f.next().unwrap().parse().unwrap();
            out.insert(line, n);
        }
    }
    out
}

/// The `BRDA` counts of an lcov tracefile by line, sorted.
fn branches_of(info: &str) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for da in info.lines().filter_map(|l| l.strip_prefix("BRDA:")) {
        let f: Vec<&str> = da.split(',').collect();
        out.entry(f[0].parse().unwrap())
            .or_default()
            .push(f[3].to_string());
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[test]
fn lcov_coverage_equals_gcov_line_for_line() {
    if !qemu_available() {
        return;
    }
    if !have("lcov") || !have("gcov") {
        println!("SKIP: lcov or gcov is not installed (apt-get install lcov)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The program as gcov sees it: built with --coverage, run, its counts captured.
    let gdir = dir.path().join("gcov");
    std::fs::create_dir(&gdir).unwrap();
    let instrumented = compile_with("coverage", &gdir, "coverage", &["-O0", "-g", "--coverage"]);
    let o = Command::new(&instrumented)
        .current_dir(&gdir)
        .output()
        .unwrap();
    assert!(o.status.success());
    let gcov_info = gdir.join("gcov.info");
    let o = Command::new("lcov")
        .args([
            "--quiet",
            "--rc",
            "lcov_branch_coverage=1",
            "--capture",
            "--directory",
        ])
        .arg(&gdir)
        .arg("--output-file")
        .arg(&gcov_info)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    let gcov_text = std::fs::read_to_string(&gcov_info).unwrap();
    let gcov = lines_of(&gcov_text, "coverage.c");
    // The same program built without instrumentation, traced.
    let (_, trace) = traced(dir.path(), "coverage", &["-O0", "-g", "-no-pie"]);
    let info = profile(&trace, "lcov", &dir.path().join("trace.info"));
    assert!(info.starts_with("TN:\n"), "{info}");
    assert!(info.contains("FNDA:0,never_called"), "{info}");
    let ours = lines_of(&info, "coverage.c");
    assert!(!gcov.is_empty() && !ours.is_empty());
    // Every line gcov counts has the same count here (so the same lines ran and the same
    // never did).
    for (line, n) in &gcov {
        assert_eq!(
            ours.get(line),
            Some(n),
            "line {line}: gcov {n}, pttrace {ours:?}"
        );
    }
    // What gcov does not list: the closing braces of the functions that return a value
    // (their epilogue has a line of its own in DWARF; gcov counts it with the return).
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/coverage.c"),
    )
    .unwrap();
    let source: Vec<&str> = src.lines().collect();
    // Functions: where each begins and how often it was entered.
    let functions = |t: &str| -> BTreeSet<String> {
        t.lines()
            .filter(|l| l.starts_with("FN:") || l.starts_with("FNDA:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(functions(&info), functions(&gcov_text));
    // Branch coverage: per line, the same counts (gcov numbers a line's branch edges in
    // its own order; here each conditional branch is taken, then not taken).
    let (gb, ob) = (branches_of(&gcov_text), branches_of(&info));
    assert!(gb.len() >= 6, "gcov's branches: {gb:?}");
    assert_eq!(ob, gb, "branch counts per line: pttrace, then gcov");
    let extra: Vec<u32> = ours
        .keys()
        .filter(|l| !gcov.contains_key(l))
        .copied()
        .collect();
    assert_eq!(extra.len(), 2, "lines only pttrace lists: {extra:?}");
    for l in extra {
        assert_eq!(source[l as usize - 1].trim(), "}", "line {l}");
        assert!(ours[&l] > 0, "line {l} ran");
    }
}
