//! `pttrace view`'s pictures in a real browser: tests/progs/calls.c (main calls a() three
//! times, a calls b, then main calls c), traced whole by the QEMU backend, viewed, then
//! tests/browser/render.mjs opens them in headless Chromium (Debian's `chromium`, driven by
//! the npm package playwright-core):
//! - flamegraph.svg: frames titled main, a, b, c; a click on main zooms, and then the four
//!   names are drawn as frame labels; no console or page errors;
//! - timeline.json in speedscope (the npm package, offline): it loads without an error, the
//!   thread's profile is shown by name, the time-order flame chart is not blank, and its
//!   Sandwich table lists exactly the functions of the thread's call spans (and of its
//!   inlined code's spans), with main, a, b
//!   and c's self and total weights equal to the collapsed stacks' instruction counts.
//!
//! Also the bounded timeline of a large trace (tests/progs/many_calls.c, 2.87 M calls):
//! speedscope loads and draws it, the flame graph too.
//!
//! The screenshots are left in target/browser/*.png (with result.json, what the script
//! found) for a person to look at.
//!
//! Needs qemu-x86_64, chromium, node and tests/browser/node_modules, all installed by
//! scripts/setup.sh. Without them the test fails, naming what is missing; with
//! PTTRACE_SKIP_BROWSER=1 it prints `SKIP: <reason>` and passes instead.
//! PTTRACE_CHROMIUM=PATH names another Chromium than /usr/bin/chromium.

mod shim_util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use shim_util::{pttrace, run_under_qemu, text, view_into};

const NAMES: [&str; 4] = ["main", "a", "b", "c"];

fn on_path(exe: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(exe).is_file()))
}

fn chromium() -> PathBuf {
    std::env::var_os("PTTRACE_CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from)
}

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// What this test needs and is not installed.
fn missing() -> Vec<String> {
    let mut out = Vec::new();
    if !on_path("qemu-x86_64") {
        out.push("qemu-x86_64 (apt-get install qemu-user)".to_string());
    }
    if !chromium().is_file() {
        out.push(format!(
            "{} (apt-get install chromium)",
            chromium().display()
        ));
    }
    if !on_path("node") {
        out.push("node (Node.js >= 18)".to_string());
    }
    for pkg in ["playwright-core", "speedscope"] {
        let dir = browser_dir().join("node_modules").join(pkg);
        if !dir.join("package.json").is_file() {
            out.push(format!("{} (npm ci in tests/browser)", dir.display()));
        }
    }
    out
}

/// A speedscope weight such as `2.13ms (2.1%)` or `23.00µs (0.02%)`, in microseconds (the
/// unit of the timeline's `ts`, here one instruction each).
fn micros(text: &str) -> f64 {
    let v = text.split_whitespace().next().unwrap_or("");
    let (num, scale) = if let Some(n) = v.strip_suffix("µs") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix("ns") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e6)
    } else {
        panic!("no unit in the weight {text:?}")
    };
    num.parse::<f64>()
        .unwrap_or_else(|_| panic!("bad weight {text:?}"))
        * scale
}

#[test]
fn micros_reads_speedscope_weights() {
    assert_eq!(micros("23.00µs (0.02%)"), 23.0);
    assert_eq!(micros("2.13ms (2.1%)"), 2130.0);
    assert_eq!(micros("1.50s (50%)"), 1.5e6);
}

#[test]
fn flamegraph_and_speedscope_render_in_chromium() {
    if !browser_available() {
        return;
    }

    // The program, traced and viewed.
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile_calls(dir.path());
    let trace = dir.path().join("out");
    let o = run_under_qemu(&trace, &[], &[prog.as_os_str()]);
    assert!(o.status.success(), "pttrace run: {o:?}");
    let view = view_of(&trace, &dir.path().join("view"), &[]);

    // What the browser must show, from the files themselves: the thread's name and the
    // functions of its call spans; the instructions of main, a, b, c (self and total).
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(view.join("timeline.json")).unwrap())
            .unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let main_span = events
        .iter()
        .find(|e| e["ph"] == "X" && e["name"] == "main")
        .expect("a main span");
    let tid = main_span["tid"].as_i64().unwrap();
    let thread_name = events
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == tid)
        .and_then(|e| e["args"]["name"].as_str())
        .expect("the thread's name")
        .to_string();
    assert_eq!(thread_name, format!("calls {tid}"));
    let functions: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == tid)
        .filter(|e| {
            e["cat"]
                .as_str()
                .is_some_and(|c| c.starts_with("call") || c == "inlined")
        })
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let folded = std::fs::read_to_string(view.join("stacks.folded")).unwrap();
    let mut self_n: BTreeMap<&str, u64> = BTreeMap::new();
    let mut total_n: BTreeMap<&str, u64> = BTreeMap::new();
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        *self_n.entry(frames[frames.len() - 1]).or_default() += n;
        for f in frames.iter().collect::<BTreeSet<_>>() {
            *total_n.entry(f).or_default() += n;
        }
    }

    // The browser.
    let (shots, r) = render(&view, "browser", &NAMES, "b", &thread_name);

    // The flame graph: every name titled, and drawn once zoomed into main.
    assert_eq!(r["flamegraph"]["root"], "svg");
    assert_eq!(r["flamegraph"]["titled"], serde_json::json!(NAMES));
    assert_eq!(r["flamegraph"]["drawnZoomed"], serde_json::json!(NAMES));
    assert_eq!(r["flamegraph"]["problems"], serde_json::json!([]));

    // speedscope: the thread's profile (first of two: the thread, then its windows).
    let s = &r["speedscope"];
    assert_eq!(s["error"], false);
    assert_eq!(s["problems"], serde_json::json!([]));
    let toolbar: Vec<&str> = s["toolbar"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let profile = format!("(pid {tid}), {thread_name} (tid {tid}) (1/2)");
    assert!(
        toolbar.iter().any(|l| l.contains(&profile)),
        "{profile} not in {toolbar:?}"
    );
    // Its Sandwich table: exactly the thread's functions, with our weights.
    let rows = s["sandwich"].as_object().unwrap();
    let listed: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(listed, functions);
    for name in NAMES {
        for (col, want) in [("self", self_n[name]), ("total", total_n[name])] {
            let cell = rows[name][col].as_str().unwrap();
            let got = micros(cell);
            let want = want as f64;
            assert!(
                (got - want).abs() <= want * 0.005,
                "{name}: speedscope's {col} {cell}, the folded stacks {want} instructions"
            );
        }
    }

    // The screenshots: PNG files, not blank.
    for name in [
        "flamegraph",
        "flamegraph-zoom-main",
        "speedscope-time-order",
        "speedscope-time-order-chart",
        "speedscope-sandwich",
        "speedscope-sandwich-b",
    ] {
        let file = shots.join(format!("{name}.png"));
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(data.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", file.display());
        let info = &r["screenshots"][name];
        assert!(
            info["colours"].as_u64().unwrap() >= 8 && info["ink"].as_f64().unwrap() > 0.05,
            "{name} looks blank: {info}"
        );
    }
    println!("screenshots: {}", shots.display());
}

/// Whether chromium, node and the npm packages are there; without them the test fails
/// naming what is missing, or with PTTRACE_SKIP_BROWSER=1 prints SKIP and passes.
fn browser_available() -> bool {
    let missing = missing();
    if missing.is_empty() {
        return true;
    }
    let reason = format!(
        "not installed: {}: run scripts/setup.sh",
        missing.join(", ")
    );
    if std::env::var_os("PTTRACE_SKIP_BROWSER").is_some_and(|v| v == "1") {
        println!("SKIP: {reason}");
        return false;
    }
    panic!("{reason} (or set PTTRACE_SKIP_BROWSER=1 to skip this test)");
}

/// `pttrace view` of `trace` into `out` with the options `extra`; `out`.
fn view_of(trace: &Path, out: &Path, extra: &[&str]) -> PathBuf {
    view_into(trace, out, extra);
    out.to_path_buf()
}

/// Opens `view`'s flame graph and timeline.json (in speedscope) in Chromium through
/// render.mjs, screenshots into target/`shots`; what it found (no failures asserted).
fn render(
    view: &Path,
    shots: &str,
    names: &[&str],
    select: &str,
    profile: &str,
) -> (PathBuf, Value) {
    let target = pttrace()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let shots = target.join(shots);
    let _ = std::fs::remove_dir_all(&shots);
    let o = Command::new("node")
        .arg(browser_dir().join("render.mjs"))
        .arg("--view")
        .arg(view)
        .arg("--out")
        .arg(&shots)
        .args(["--names", &names.join(","), "--select", select])
        .args(["--profile", profile])
        .arg("--chromium")
        .arg(chromium())
        .output()
        .unwrap();
    let text = text(&o);
    println!("{text}");
    assert!(o.status.success(), "render.mjs failed:\n{text}");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(shots.join("result.json")).unwrap()).unwrap();
    assert_eq!(r["failures"], serde_json::json!([]));
    (shots, r)
}

/// The bounded timeline of a large trace renders: tests/progs/many_calls.c (101 M
/// instructions, 2.87 M calls) viewed with `--limit 24M`, whose timeline.json keeps the
/// longest calls (every `top`, within the limit) and says what it merged: Chromium draws
/// its flame graph and speedscope loads the JSON, draws it, and lists main and top.
#[test]
fn a_large_bounded_timeline_renders_in_chromium() {
    if !browser_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = shim_util::trace_many_calls(dir.path());
    let view = view_of(&trace, &dir.path().join("view"), &["--limit", "24M"]);
    let path = view.join("timeline.json");
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        size > 4 << 20 && size <= 24 << 20,
        "timeline.json: {size} bytes"
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(json["otherData"]["merged_calls"].as_u64().unwrap() > 0);
    let events = json["traceEvents"].as_array().unwrap();
    let tops = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "top")
        .count();
    assert_eq!(tops, 70_000);
    let tid = events
        .iter()
        .find(|e| e["ph"] == "X" && e["name"] == "main")
        .and_then(|e| e["tid"].as_i64())
        .expect("a main span");
    let (shots, r) = render(
        &view,
        "browser-large",
        &["main", "top"],
        "top",
        &format!("many_calls {tid}"),
    );
    let s = &r["speedscope"];
    assert_eq!(s["error"], false);
    assert_eq!(s["problems"], serde_json::json!([]));
    let rows = s["sandwich"].as_object().unwrap();
    assert!(
        rows.contains_key("main") && rows.contains_key("top"),
        "{rows:?}"
    );
    for name in ["flamegraph", "speedscope-time-order-chart"] {
        let info = &r["screenshots"][name];
        assert!(
            info["colours"].as_u64().unwrap() >= 8 && info["ink"].as_f64().unwrap() > 0.05,
            "{name} looks blank: {info}"
        );
    }
    println!("screenshots: {}", shots.display());
}
