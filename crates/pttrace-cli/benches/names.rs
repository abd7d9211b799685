//! What naming costs against decoding, on a trace of over a billion instructions: a node
//! JIT loop (`--perf-basic-prof`: JIT code named from the perf map, V8's builtins from its
//! copy, libc through libc6-dbg's DWARF) traced once under QEMU, then in each round
//! `pttrace decode DIR --format summary` timed and `pttrace view DIR` (its `names:` line:
//! distinct addresses named and the time that took, set-up included). Prints the median
//! ratio; the goal is at most 10% of the decode time.
//!
//! Run: `cargo bench --bench names` (optional argument: rounds, default 3).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const SCRIPT: &str = "function fib(n){ return n < 2 ? n : fib(n-1) + fib(n-2); }
let s = 0; const a = [];
for (let i = 0; i < 30000; i++) { s += fib(12); a.push(String(i)); }
a.sort(); console.log(s, a.length);";

fn pttrace() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pttrace"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Instructions of the trace, from `decode --format summary`'s total line.
fn instructions(summary: &str) -> u64 {
    summary
        .lines()
        .rfind(|l| l.starts_with("total:"))
        .and_then(|l| l.split(',').find(|p| p.trim().ends_with("instructions")))
        .and_then(|p| p.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// (distinct addresses, seconds) of `view`'s `names:` line.
fn names_line(out: &str) -> (u64, f64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("names:"))
        .unwrap_or_else(|| panic!("no names line in {out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let addrs = words.get(1).and_then(|w| w.parse().ok()).unwrap_or(0);
    let secs = words
        .iter()
        .position(|w| *w == "s")
        .and_then(|i| words.get(i - 1))
        .and_then(|w| w.parse().ok())
        .unwrap_or(0.0);
    (addrs, secs)
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let have = |c: &str| Command::new(c).arg("--version").output().is_ok();
    if !have("qemu-x86_64") || !have("node") {
        println!(
            "SKIP: needs qemu-x86_64 (apt-get install qemu-user) and node (apt-get install nodejs)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("jitloop.js");
    std::fs::write(&script, SCRIPT).unwrap();
    let trace = dir.path().join("trace");
    let st = Command::new(pttrace())
        .args(["run", "--quiet", "--backend", "qemu", "-o"])
        .arg(&trace)
        .args(["--", "node", "--perf-basic-prof"])
        .arg(&script)
        .stdout(Stdio::null())
        .status()
        .expect("pttrace run");
    assert!(st.success(), "pttrace run failed: {st}");
    let view_dir = dir.path().join("view");
    let (mut decode_s, mut names_s, mut ratios) = (vec![], vec![], vec![]);
    let (mut insns, mut addrs) = (0, 0);
    for _ in 0..rounds {
        let t = Instant::now();
        let o = Command::new(pttrace())
            .args(["decode", "--format", "summary"])
            .arg(&trace)
            .output()
            .expect("decode");
        let d = t.elapsed().as_secs_f64();
        assert!(o.status.success(), "decode failed");
        insns = instructions(&String::from_utf8_lossy(&o.stdout));
        let o = Command::new(pttrace())
            .arg("view")
            .arg(&trace)
            .arg("-o")
            .arg(&view_dir)
            .output()
            .expect("view");
        assert!(o.status.success(), "view failed");
        let (a, n) = names_line(&String::from_utf8_lossy(&o.stdout));
        addrs = a;
        decode_s.push(d);
        names_s.push(n);
        ratios.push(n / d);
    }
    let _ = std::fs::remove_dir_all(Path::new(&view_dir));
    println!(
        "names on a node JIT loop under QEMU ({insns} instructions, {addrs} distinct addresses named), {rounds} rounds (median):"
    );
    println!(
        "  decode --format summary {:.2} s, naming in view {:.2} s -> {:.1}% of the decode time ({:.1}%..{:.1}%; goal <= 10%)",
        median(decode_s),
        median(names_s),
        100.0 * median(ratios.clone()),
        100.0 * ratios.iter().cloned().fold(f64::MAX, f64::min),
        100.0 * ratios.iter().cloned().fold(0.0, f64::max)
    );
}
