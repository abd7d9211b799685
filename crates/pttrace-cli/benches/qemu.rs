//! The QEMU backend against bare QEMU and against the single-step backend, side by side in
//! one run (paired rounds in alternating order; medians of the per-round ratios, since
//! this VM's speed drifts):
//! - a CPU-bound `/usr/bin/python3 -c 'sum(i*i for i in range(3*10**6))'`: native, bare
//!   `qemu-x86_64`, and `pttrace run --backend qemu` (capture, encode, files written);
//! - the floor of a TCG plugin (API v1) on that loop: `benches/floor_plugin.c`, whose
//!   execution callback only stores the block's address, against bare QEMU in the same
//!   rounds (what QEMU's callback costs before a tracer does anything);
//! - a node JIT loop (when `node` is installed): bare QEMU vs traced;
//! - `/usr/bin/python3 -c pass` (start-up, translation-bound): bare QEMU vs traced;
//! - instructions traced per second (instructions from decoding the trace once), PT bytes
//!   per instruction, peak memory of the traced run;
//! - the single-step backend's rate on `qemu_cases loop` in the same run;
//! - `--memory` (every load and store recorded) against the instruction-only capture of the
//!   python loop, and the bytes it adds per access.
//!
//! Run: `cargo bench --bench qemu` (optional argument: rounds, default 5).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const PY: &str = "/usr/bin/python3";
const LOOP: &str = "sum(i*i for i in range(3*10**6))";
const NODE_LOOP: &str = "let s = 0; for (let i = 0; i < 5e7; i++) s += i % 7; console.log(s)";

fn pttrace() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pttrace"))
}

fn plugin() -> PathBuf {
    let dir = pttrace().parent().unwrap().to_path_buf();
    let so = dir.join("libpttrace_qemu.so");
    if !so.is_file() {
        let st = Command::new(option_env!("CARGO").unwrap_or("cargo"))
            .args(["build", "--release", "-p", "pttrace-qemu"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build -p pttrace-qemu");
        assert!(st.success());
    }
    so
}

/// Wall seconds of a command (output discarded); panics when it fails.
fn timed(c: &mut Command) -> f64 {
    let t = Instant::now();
    let st = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run");
    let s = t.elapsed().as_secs_f64();
    assert!(st.success(), "{c:?} failed: {st}");
    s
}

fn traced(out: &Path, backend: &str, cmd: &[&str]) -> Command {
    traced_with(out, backend, &[], cmd)
}

fn traced_with(out: &Path, backend: &str, extra: &[&str], cmd: &[&str]) -> Command {
    let _ = std::fs::remove_dir_all(out);
    let mut c = Command::new(pttrace());
    c.args([
        "run",
        "--mode",
        "user",
        "--window",
        "thread",
        "--backend",
        backend,
    ])
    .arg("--qemu-plugin")
    .arg(plugin())
    .args(extra)
    .arg("--out")
    .arg(out)
    .arg("--")
    .args(cmd);
    c
}

/// (bare, traced) seconds of one round, the order alternating with the round number.
fn paired(round: usize, bare: &mut Command, out: &Path, cmd: &[&str]) -> (f64, f64) {
    if round % 2 == 0 {
        let x = timed(bare);
        (x, timed(&mut traced(out, "qemu", cmd)))
    } else {
        let y = timed(&mut traced(out, "qemu", cmd));
        (timed(bare), y)
    }
}

/// `benches/floor_plugin.c` built into `dir`.
fn floor_plugin(dir: &Path) -> PathBuf {
    let so = dir.join("floor_plugin.so");
    let st = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/floor_plugin.c"))
        .status()
        .expect("cc");
    assert!(st.success(), "cc benches/floor_plugin.c");
    so
}

/// The median and the range of ratios, as the lines print them.
fn ratio_text(r: &[f64]) -> String {
    format!(
        "{:.2}x ({:.2}..{:.2})",
        median(r.to_vec()),
        r.iter().cloned().fold(f64::MAX, f64::min),
        r.iter().cloned().fold(0.0, f64::max)
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Bytes of the files of a trace directory.
fn dir_bytes(out: &Path) -> u64 {
    std::fs::read_dir(out)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// (instructions, PT bytes) of a trace directory, by decoding it.
fn decoded(out: &Path) -> (u64, u64) {
    let (i, p, _) = decoded_all(out);
    (i, p)
}

/// (instructions, PT bytes, loads and stores) of a trace directory, by decoding it.
fn decoded_all(out: &Path) -> (u64, u64, u64) {
    let o = Command::new(pttrace())
        .arg("decode")
        .arg(out)
        .args(["--format", "summary"])
        .output()
        .expect("decode");
    let text = String::from_utf8_lossy(&o.stdout);
    let total = text
        .lines()
        .rfind(|l| l.starts_with("total:"))
        .unwrap_or_else(|| panic!("no total in {text}"))
        .to_string();
    let field = |name: &str| -> u64 {
        total
            .split(',')
            .find(|p| p.trim().ends_with(name))
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (
        field("instructions"),
        field("PT bytes"),
        field("loads and stores"),
    )
}

/// Peak RSS (KiB) of the children waited for so far.
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage writes into the struct we pass.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut r);
        r.ru_maxrss
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    if Command::new("qemu-x86_64")
        .arg("--version")
        .output()
        .is_err()
        || !Path::new(PY).exists()
    {
        println!("SKIP: needs qemu-x86_64 (apt-get install qemu-user) and {PY}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let floor = floor_plugin(dir.path());
    let mut floor_arg = std::ffi::OsString::from("file=");
    floor_arg.push(&floor);
    let node = ["/usr/bin/node", "/usr/bin/nodejs"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let (mut f_bare, mut f_floor, mut f_ratio) = (vec![], vec![], vec![]);
    let (mut n_bare, mut n_ours, mut n_ratio) = (vec![], vec![], vec![]);

    let (mut native, mut bare, mut ours, mut ratio) = (vec![], vec![], vec![], vec![]);
    let (mut s_bare, mut s_ours, mut s_ratio) = (vec![], vec![], vec![]);
    let (mut m_plain, mut m_mem, mut m_ratio) = (vec![], vec![], vec![]);
    let loop_cmd = [PY, "-c", LOOP];
    // One traced loop run for the counts and the memory figure, first: the peak RSS of
    // the children waited for is then this run's (node's runs come later).
    let before = children_max_rss_kib();
    let t_loop = timed(&mut traced(&out, "qemu", &[PY, "-c", LOOP]));
    let rss = children_max_rss_kib().max(before);
    let (insns, pt) = decoded(&out);
    let plain_bytes = dir_bytes(&out);
    for r in 0..rounds {
        // --memory against the instruction-only capture, in alternating order.
        let plain = || timed(&mut traced(&out, "qemu", &loop_cmd));
        let memory = || timed(&mut traced_with(&out, "qemu", &["--memory"], &loop_cmd));
        let (p, m) = if r % 2 == 0 {
            let p = plain();
            (p, memory())
        } else {
            let m = memory();
            (plain(), m)
        };
        m_plain.push(p);
        m_mem.push(m);
        m_ratio.push(m / p);
        let (x, y) = paired(
            r,
            Command::new("qemu-x86_64").args([PY, "-c", LOOP]),
            &out,
            &[PY, "-c", LOOP],
        );
        native.push(timed(Command::new(PY).args(["-c", LOOP])));
        bare.push(x);
        ours.push(y);
        ratio.push(y / x);
        let (x, y) = paired(
            r,
            Command::new("qemu-x86_64").args([PY, "-c", "pass"]),
            &out,
            &[PY, "-c", "pass"],
        );
        s_bare.push(x);
        s_ours.push(y);
        s_ratio.push(y / x);
        let mut bare = Command::new("qemu-x86_64");
        bare.args([PY, "-c", LOOP]);
        let mut with_floor = Command::new("qemu-x86_64");
        with_floor
            .arg("-plugin")
            .arg(&floor_arg)
            .args([PY, "-c", LOOP]);
        let (x, y) = if r % 2 == 0 {
            let x = timed(&mut bare);
            (x, timed(&mut with_floor))
        } else {
            let y = timed(&mut with_floor);
            (timed(&mut bare), y)
        };
        f_bare.push(x);
        f_floor.push(y);
        f_ratio.push(y / x);
        if let Some(node) = node {
            let (x, y) = paired(
                r,
                Command::new("qemu-x86_64").args([node, "-e", NODE_LOOP]),
                &out,
                &[node, "-e", NODE_LOOP],
            );
            n_bare.push(x);
            n_ours.push(y);
            n_ratio.push(y / x);
        }
    }
    let t_mem = timed(&mut traced_with(&out, "qemu", &["--memory"], &loop_cmd));
    let mem_bytes = dir_bytes(&out);
    let (_, _, accesses) = decoded_all(&out);

    // The single-step backend in the same run, on a loop it can finish.
    let prog = dir.path().join("qc");
    let st = Command::new("cc")
        .args(["-O1", "-no-pie", "-o"])
        .arg(&prog)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/qemu_cases.c"))
        .arg("-pthread")
        .status()
        .unwrap();
    assert!(st.success());
    let step_out = dir.path().join("step");
    let t_step = timed(&mut traced(
        &step_out,
        "emulated",
        &[prog.to_str().unwrap(), "loop", "200000"],
    ));
    let (step_insns, _) = decoded(&step_out);
    let step_rate = step_insns as f64 / t_step;
    let qemu_rate = insns as f64 / t_loop;

    println!("QEMU backend, {rounds} paired rounds (median; min..max of the ratios):");
    println!(
        "  python loop: native {:.2} s, bare qemu-x86_64 {:.2} s, traced {:.2} s -> traced/bare {:.2}x ({:.2}..{:.2})",
        median(native),
        median(bare),
        median(ours),
        median(ratio.clone()),
        ratio.iter().cloned().fold(f64::MAX, f64::min),
        ratio.iter().cloned().fold(0.0, f64::max)
    );
    println!(
        "  the same loop under a plugin whose callback only stores the block (benches/floor_plugin.c): bare {:.2} s, floor {:.2} s -> floor/bare {}",
        median(f_bare),
        median(f_floor),
        ratio_text(&f_ratio)
    );
    if node.is_some() {
        println!(
            "  node JIT loop: bare {:.2} s, traced {:.2} s -> traced/bare {}",
            median(n_bare),
            median(n_ours),
            ratio_text(&n_ratio)
        );
    }
    println!(
        "  python -c pass: bare {:.3} s, traced {:.3} s -> traced/bare {:.2}x ({:.2}..{:.2})",
        median(s_bare),
        median(s_ours),
        median(s_ratio.clone()),
        s_ratio.iter().cloned().fold(f64::MAX, f64::min),
        s_ratio.iter().cloned().fold(0.0, f64::max)
    );
    println!(
        "  traced loop: {insns} instructions in {t_loop:.2} s = {:.0} M instructions/s; {pt} PT bytes = {:.3} bytes/instruction; peak RSS {} MiB",
        qemu_rate / 1e6,
        pt as f64 / insns.max(1) as f64,
        rss / 1024
    );
    println!(
        "  single-step backend (same run): {step_insns} instructions in {t_step:.2} s = {:.3} M instructions/s -> QEMU backend {:.0}x faster",
        step_rate / 1e6,
        qemu_rate / step_rate
    );
    println!(
        "  --memory on the python loop: instruction-only {:.2} s, with loads and stores {:.2} s -> {:.2}x ({:.2}..{:.2}); {accesses} loads and stores ({:.2} per instruction) in {t_mem:.2} s, {} MB of files against {} MB = {:.2} bytes per access",
        median(m_plain),
        median(m_mem),
        median(m_ratio.clone()),
        m_ratio.iter().cloned().fold(f64::MAX, f64::min),
        m_ratio.iter().cloned().fold(0.0, f64::max),
        accesses as f64 / insns.max(1) as f64,
        mem_bytes / 1_000_000,
        plain_bytes / 1_000_000,
        mem_bytes.saturating_sub(plain_bytes) as f64 / accesses.max(1) as f64
    );
}
