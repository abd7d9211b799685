//! `pttrace run --memory` (QEMU backend): every load and store, joined to its instruction
//! by `decode --format jsonl` and `--format drmemtrace` (DynamoRIO's own analyzers, which
//! print `SKIP` where `scripts/dynamorio.sh` has not built them).

mod shim_util;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use shim_util::{
    analyze, dynamorio_launcher as launcher, pttrace, qemu_available, run_under_qemu, symbol, text,
};

/// `tests/progs/<name>.c` built (`-no-pie`) and traced with `--memory` into a new
/// directory, which must succeed: the directory, the program, the trace and the run's
/// output; `None` (after printing SKIP) without QEMU.
fn trace_prog(name: &str) -> Option<(tempfile::TempDir, PathBuf, PathBuf, Output)> {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return None;
    }
    shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile_with(name, dir.path(), name, &["-no-pie"]);
    let trace = dir.path().join("trace");
    let o = run_under_qemu(&trace, &["--memory"], &[prog.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o));
    Some((dir, prog, trace, o))
}

/// `tests/progs/mem_array.c` traced ([`trace_prog`]): the directory, the trace and where
/// the program's array is.
fn trace_array() -> Option<(tempfile::TempDir, PathBuf, u64)> {
    let (dir, _prog, trace, arr) = trace_array_prog()?;
    Some((dir, trace, arr))
}

/// [`trace_array`], with the program.
fn trace_array_prog() -> Option<(tempfile::TempDir, PathBuf, PathBuf, u64)> {
    let (dir, prog, trace, _) = trace_prog("mem_array")?;
    let arr = symbol(&prog, "arr");
    Some((dir, prog, trace, arr))
}

/// The records of `decode --format jsonl` of `trace` (it must succeed).
fn jsonl(trace: &Path) -> Vec<Value> {
    let o = Command::new(pttrace())
        .args(["decode", "--format", "jsonl"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A `0x…` address of a JSON record.
fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn loads_and_stores_of_a_known_array_follow_their_instructions() {
    let Some((_dir, prog, trace, arr)) = trace_array_prog() else {
        return;
    };
    let (far_cell, far_access) = (symbol(&prog, "far_cell"), symbol(&prog, "far_access"));
    // The far cell's accesses: (read or write, pc).
    let mut far: Vec<(bool, u64)> = Vec::new();
    // Every access comes after its instruction (or after another access of it).
    let (mut last_pc, mut accesses, mut insns) = (None, 0u64, 0u64);
    // The array's accesses: (read or write, address, pc), in order.
    let mut seen: Vec<(bool, u64, u64)> = Vec::new();
    for v in jsonl(&trace) {
        match v["type"].as_str().unwrap() {
            "insn" => {
                last_pc = Some(hex(&v["pc"]));
                insns += 1;
            }
            t @ ("read" | "write") => {
                accesses += 1;
                let pc = hex(&v["pc"]);
                assert_eq!(Some(pc), last_pc, "{v}");
                let addr = hex(&v["addr"]);
                if addr == far_cell {
                    far.push((t == "write", pc));
                }
                if (arr..arr + 8000).contains(&addr) {
                    assert_eq!(v["size"], 8, "{v}");
                    seen.push((t == "write", addr, pc));
                }
            }
            _ => {}
        }
    }
    assert!(insns > 50_000 && accesses > 10_000, "{insns} {accesses}");
    // Three passes; in each, element i read then written, i in order; then the last
    // element read for the exit status.
    let mut expected: Vec<(bool, u64)> = (0..3)
        .flat_map(|_| (0..1000u64).flat_map(|i| [(false, arr + 8 * i), (true, arr + 8 * i)]))
        .collect();
    expected.push((false, arr + 8 * 999));
    let got: Vec<(bool, u64)> = seen.iter().map(|&(w, a, _)| (w, a)).collect();
    assert_eq!(got.len(), expected.len());
    assert!(
        got == expected,
        "the array's accesses are not the program's"
    );
    // One load instruction and one store instruction made the loop's.
    let pcs = |write: bool| {
        let mut p: Vec<u64> = seen[..6000]
            .iter()
            .filter(|s| s.0 == write)
            .map(|s| s.2)
            .collect();
        p.dedup();
        p
    };
    assert_eq!(pcs(false).len(), 1);
    assert_eq!(pcs(true).len(), 1);
    assert!(pcs(false)[0] < pcs(true)[0]);
    // The far cell: read then written, twice, by instructions 600 bytes into their block
    // (150 four-byte nops before them; each access came right after its own instruction,
    // checked above), then read by main.
    let kinds: Vec<bool> = far.iter().map(|f| f.0).collect();
    assert_eq!(kinds, [false, true, false, true, false], "{far:x?}");
    for &(_, pc) in &far[..4] {
        assert!(
            pc >= far_access + 600 && pc < far_access + 620,
            "{pc:#x} {far_access:#x}"
        );
    }
}

#[test]
fn memory_alone_picks_the_qemu_backend() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let plugin = shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--memory", "--qemu-plugin"])
        .arg(&plugin)
        .arg("--out")
        .arg(&out)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("under QEMU")
            && t.contains("--memory: QEMU is the backend that sees loads and stores"),
        "{t}"
    );
    let s = Command::new(pttrace())
        .args(["decode", "--format", "summary"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(text(&s).contains("loads and stores"), "{}", text(&s));
}

#[test]
fn memory_needs_the_qemu_backend() {
    let o = Command::new(pttrace())
        .args([
            "run",
            "--backend",
            "emulated",
            "--memory",
            "--",
            "/bin/true",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("--memory needs the QEMU backend"), "{t}");
}

fn drmemtrace(trace: &Path, out: &Path) {
    let o = Command::new(pttrace())
        .args(["decode", "--format", "drmemtrace", "--out"])
        .arg(out)
        .arg(trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn dynamorio_reads_the_loads_and_stores() {
    let Some(l) = launcher() else { return };
    let Some((dir, trace, arr)) = trace_array() else {
        return;
    };
    let dm = dir.path().join("dm");
    drmemtrace(&trace, &dm);
    let checked = analyze(&l, &dm, "invariant_checker");
    assert!(
        checked.contains("Trace invariant checks passed"),
        "{checked}"
    );
    // DynamoRIO's view lists the array's 6,001 accesses, 8 bytes each.
    let view = analyze(&l, &dm, "view");
    let (mut reads, mut writes) = (0, 0);
    for line in view.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let Some(k) = w.iter().position(|x| *x == "read" || *x == "write") else {
            continue;
        };
        let (Some(size), Some(at)) = (w.get(k + 1), w.get(k + 4)) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(at.trim_start_matches("0x"), 16) else {
            continue;
        };
        if (arr..arr + 8000).contains(&addr) {
            assert_eq!(*size, "8", "{line}");
            if w[k] == "read" {
                reads += 1;
            } else {
                writes += 1;
            }
        }
    }
    assert_eq!((reads, writes), (3001, 3000));
    let counts = analyze(&l, &dm, "basic_counts");
    assert!(counts.contains("total data loads"), "{counts}");
    // The cache simulator runs on them.
    let cache = analyze(&l, &dm, "cache");
    assert!(cache.contains("L1D0"), "{cache}");

    // Wide accesses QEMU splits, rep strings, atomics and xsave in real code: the
    // checker passes on programs with every kind (their records one per operand).
    let prog = shim_util::compile_with("qemu_cases", dir.path(), "qemu_cases", &["-no-pie"]);
    for case in ["rep", "mix", "threads"] {
        let t = dir.path().join(format!("t-{case}"));
        let o = run_under_qemu(&t, &["--memory"], &[prog.as_os_str(), case.as_ref()]);
        assert!(o.status.success(), "{}", text(&o));
        let d = dir.path().join(format!("d-{case}"));
        drmemtrace(&t, &d);
        let checked = analyze(&l, &d, "invariant_checker");
        assert!(
            checked.contains("Trace invariant checks passed"),
            "{case}: {checked}"
        );
    }
}

/// A read-modify-write whose store faults (`tests/progs/mem_fault.c`: `addl $1, (page)`
/// on a read-only page, a plain SIGSEGV handler that makes it writable): the first
/// attempt's load, which QEMU reports before the store faults, is dropped since the
/// instruction did not retire; the instruction comes once, with its load and store of the
/// run that retired, and every access joins its instruction (no damage).
#[test]
fn a_faulting_instructions_accesses_are_dropped() {
    let Some((_dir, prog, trace, o)) = trace_prog("mem_fault") else {
        return;
    };
    assert_eq!(String::from_utf8_lossy(&o.stdout), "6 1\n");
    let add = symbol(&prog, "bump_add");
    let at_add: Vec<(String, u64, u64)> = jsonl(&trace)
        .into_iter()
        .filter(|v| v["pc"].is_string() && hex(&v["pc"]) == add)
        .map(|v| {
            let t = v["type"].as_str().unwrap().to_string();
            let addr = if v["addr"].is_string() {
                hex(&v["addr"])
            } else {
                0
            };
            (t, addr, v["size"].as_u64().unwrap_or(0))
        })
        .collect();
    assert_eq!(at_add.len(), 3, "{at_add:?}");
    let page = at_add[1].1;
    assert_eq!(
        at_add,
        [
            ("insn".to_string(), 0, 3),
            ("read".to_string(), page, 4),
            ("write".to_string(), page, 4)
        ],
    );
}
