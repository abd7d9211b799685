//! `pttrace view` on a real traced program with a known call structure
//! (tests/progs/calls.c: main calls a() three times, a calls b, then main calls c), traced
//! whole by the QEMU backend: the timeline JSON holds exactly those spans with the right
//! nesting, names, start points and lengths; the collapsed stacks hold exactly those
//! stacks with the instruction counts of `pttrace decode --format jsonl` for the same
//! trace; the flame graph names them; the Perfetto protobuf timeline, read back by a reader
//! that follows Perfetto's schema, holds exactly the JSON's slices, windows and names.
//! Needs `qemu-x86_64` (Debian's qemu-user); prints `SKIP: <reason>` without it.

mod pftrace_reader;
mod shim_util;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use shim_util::{pttrace, qemu_available, run_under_qemu, view_into};

fn ok(o: &Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{what} failed: {text}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The calls program built in `dir` and traced under QEMU into `dir/out`, run by the
/// command `cmd` makes of its path: (program, trace).
fn traced_calls(dir: &Path, cmd: impl FnOnce(&Path) -> Vec<String>) -> (PathBuf, PathBuf) {
    let prog = shim_util::compile_calls(dir);
    let trace = dir.join("out");
    let cmd = cmd(&prog);
    let args: Vec<&std::ffi::OsStr> = cmd.iter().map(std::ffi::OsStr::new).collect();
    ok(&run_under_qemu(&trace, &[], &args), "pttrace run");
    (prog, trace)
}

/// The calls program run twice by a shell (`sh -c 'calls && calls'`: five thread images,
/// the shell, and each child as the shell then the program), traced into `dir/out`.
fn traced_calls_twice(dir: &Path) -> PathBuf {
    traced_calls(dir, |p| {
        let script = format!("{p} && {p}", p = p.display());
        vec!["/bin/sh".into(), "-c".into(), script]
    })
    .1
}

/// tests/progs/`name`.c built in `dir` and run with `args` under QEMU, traced into
/// `dir/out`: the trace.
fn traced_prog(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let prog = shim_util::compile(name, dir);
    let trace = dir.join("out");
    let mut cmd = vec![prog.as_os_str()];
    cmd.extend(args.iter().map(OsStr::new));
    ok(&run_under_qemu(&trace, &[], &cmd), "pttrace run");
    trace
}

/// (address, size) of each function symbol of `exe`.
fn functions(exe: &Path, names: &[&str]) -> BTreeMap<String, (u64, u64)> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    names
        .iter()
        .map(|n| {
            let s = obj
                .symbols()
                .find(|s| s.name() == Ok(n))
                .unwrap_or_else(|| panic!("{n} not in {}", exe.display()));
            assert!(s.size() > 0, "{n} has no size");
            (n.to_string(), (s.address(), s.size()))
        })
        .collect()
}

/// The instruction addresses of `pttrace decode DIR --format jsonl`, per thread id.
fn decoded_pcs(dir: &Path) -> BTreeMap<i64, Vec<u64>> {
    let o = Command::new(pttrace())
        .args(["decode", "--format", "jsonl"])
        .arg(dir)
        .output()
        .unwrap();
    let text = ok(&o, "pttrace decode --format jsonl");
    let mut out: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if v["type"] == "insn" {
            let pc = v["pc"].as_str().unwrap();
            let pc = u64::from_str_radix(pc.trim_start_matches("0x"), 16).unwrap();
            out.entry(v["tid"].as_i64().unwrap()).or_default().push(pc);
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
struct Span {
    name: String,
    ts: u64,
    dur: u64,
}

#[test]
fn calls_program_spans_stacks_and_flamegraph() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (prog, trace) = traced_calls(dir.path(), |p| vec![p.display().to_string()]);

    let o = Command::new(pttrace())
        .arg("view")
        .arg(&trace)
        .output()
        .unwrap();
    let stdout = ok(&o, "pttrace view");
    // Every return went where an open call expected it.
    assert!(!stdout.contains("no open call expected"), "{stdout}");
    let view = trace.join("view");
    for f in [
        "timeline.json",
        "timeline.pftrace",
        "flamegraph.svg",
        "stacks.folded",
    ] {
        let p = view.join(f);
        assert!(
            stdout.contains(&p.display().to_string()),
            "{f} not named in: {stdout}"
        );
    }

    // The expected figures, from the decoder's own instruction stream.
    let pcs = decoded_pcs(&trace);
    assert_eq!(pcs.len(), 1, "one thread: {:?}", pcs.keys());
    let (&tid, pcs) = pcs.iter().next().unwrap();
    let funcs = functions(&prog, &["main", "a", "b", "c"]);
    let count = |f: &str| {
        let (start, size) = funcs[f];
        pcs.iter()
            .filter(|&&pc| (start..start + size).contains(&pc))
            .count() as u64
    };
    let entries = |f: &str| -> Vec<u64> {
        let start = funcs[f].0;
        (0..pcs.len() as u64)
            .filter(|&i| pcs[i as usize] == start)
            .collect()
    };
    let (nm, na, nb, nc) = (count("main"), count("a"), count("b"), count("c"));
    assert_eq!(na % 3, 0);
    assert_eq!(nb % 3, 0);
    // b runs its 100-iteration loop: far more than a's few instructions.
    assert!(
        nb > 300 && nc > 150 && na > 0 && nm > 0,
        "{nm} {na} {nb} {nc}"
    );
    let (a_at, b_at, c_at, main_at) = (entries("a"), entries("b"), entries("c"), entries("main"));
    assert_eq!(
        (a_at.len(), b_at.len(), c_at.len(), main_at.len()),
        (3, 3, 1, 1)
    );

    // Timeline: exactly main > a > b (x3), main > c on the thread's track, at the
    // instructions where the decoder shows each function entered.
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(view.join("timeline.json")).unwrap())
            .unwrap();
    assert_eq!(json["otherData"]["time_axis"], "instructions");
    let events = json["traceEvents"].as_array().unwrap();
    let mut spans: Vec<Span> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"].as_i64() == Some(tid) && e["cat"] == "call")
        .filter(|e| ["main", "a", "b", "c"].contains(&e["name"].as_str().unwrap()))
        .map(|e| Span {
            name: e["name"].as_str().unwrap().to_string(),
            ts: e["ts"].as_u64().unwrap(),
            dur: e["dur"].as_u64().unwrap(),
        })
        .collect();
    spans.sort_by_key(|s| s.ts);
    let span = |name: &str, ts: u64, dur: u64| Span {
        name: name.into(),
        ts,
        dur,
    };
    let expected = vec![
        span("main", main_at[0], nm + na + nb + nc),
        span("a", a_at[0], (na + nb) / 3),
        span("b", b_at[0], nb / 3),
        span("a", a_at[1], (na + nb) / 3),
        span("b", b_at[1], nb / 3),
        span("a", a_at[2], (na + nb) / 3),
        span("b", b_at[2], nb / 3),
        span("c", c_at[0], nc),
    ];
    assert_eq!(spans, expected);
    // Nesting: each b inside its a, each a and c inside main, siblings apart.
    let inside = |x: &Span, y: &Span| y.ts <= x.ts && x.ts + x.dur <= y.ts + y.dur;
    for k in 0..3 {
        assert!(inside(&spans[2 + 2 * k], &spans[1 + 2 * k]));
        assert!(inside(&spans[1 + 2 * k], &spans[0]));
    }
    assert!(inside(&spans[7], &spans[0]));
    assert!(spans[5].ts + spans[5].dur <= spans[7].ts);
    // The thread and its windows are named; the windows cover every instruction and the
    // last one ends at exit_group.
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec![
            format!("calls {tid}"),
            format!("calls {tid} windows (user code up to each syscall)")
        ]
    );
    let windows: Vec<&Value> = events.iter().filter(|e| e["cat"] == "syscall").collect();
    let covered: u64 = windows.iter().map(|e| e["dur"].as_u64().unwrap()).sum();
    assert_eq!(covered, pcs.len() as u64);
    assert_eq!(windows.last().unwrap()["name"], "exit_group");

    // The protobuf timeline: the same slices as the JSON, on the same named tracks.
    let pf = pftrace_reader::read(&std::fs::read(view.join("timeline.pftrace")).unwrap()).unwrap();
    let track_of = |tid_wanted: i64, windows: bool| -> u64 {
        let thread = pf
            .tracks
            .iter()
            .find(|(_, t)| {
                matches!(t.kind, pftrace_reader::TrackKind::Thread { tid, .. }
                    if i64::from(tid) == tid_wanted)
            })
            .map(|(u, _)| *u)
            .unwrap();
        if !windows {
            return thread;
        }
        let pid_track = pf
            .tracks
            .iter()
            .find(|(_, t)| matches!(t.kind, pftrace_reader::TrackKind::Process { .. }))
            .map(|(u, _)| *u)
            .unwrap();
        pf.tracks
            .iter()
            .find(|(_, t)| t.kind == pftrace_reader::TrackKind::Other { parent: pid_track })
            .map(|(u, _)| *u)
            .unwrap()
    };
    let (thread_track, window_track) = (track_of(tid, false), track_of(tid, true));
    assert_eq!(pf.tracks[&thread_track].name, names[0]);
    assert_eq!(pf.tracks[&window_track].name, names[1]);
    let mut from_json: Vec<pftrace_reader::Slice> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| pftrace_reader::Slice {
            track: if e["cat"] == "syscall" {
                window_track
            } else {
                thread_track
            },
            ts: e["ts"].as_u64().unwrap(),
            dur: e["dur"].as_u64().unwrap(),
            name: e["name"].as_str().unwrap().to_string(),
            categories: vec![e["cat"].as_str().unwrap().to_string()],
        })
        .collect();
    let mut from_pf = pf.slices.clone();
    from_json.sort();
    from_pf.sort();
    assert_eq!(from_pf.len(), from_json.len());
    assert_eq!(from_pf, from_json);
    assert!(pf.instants.is_empty(), "no gap: {:?}", pf.instants);
    assert_eq!(
        json["otherData"]["merged_calls"], 0,
        "the default limit holds all"
    );

    // speedscope's own format: one evented profile, the axis unit "none" (instructions),
    // open/close events properly nested, the same calls as the JSON timeline.
    let ss: Value = serde_json::from_str(
        &std::fs::read_to_string(view.join("profile.speedscope.json")).unwrap(),
    )
    .unwrap();
    let frames = ss["shared"]["frames"].as_array().unwrap();
    let profiles = ss["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1);
    let p = &profiles[0];
    assert_eq!(
        (p["type"].as_str(), p["unit"].as_str()),
        (Some("evented"), Some("none"))
    );
    assert_eq!(p["name"], names[0]);
    let mut open: Vec<(u64, u64)> = Vec::new();
    let mut from_ss: Vec<(String, u64, u64)> = Vec::new();
    let mut last = 0;
    for e in p["events"].as_array().unwrap() {
        let (frame, at) = (e["frame"].as_u64().unwrap(), e["at"].as_u64().unwrap());
        assert!(at >= last, "events in time order");
        last = at;
        match e["type"].as_str().unwrap() {
            "O" => open.push((frame, at)),
            "C" => {
                let (f, b) = open.pop().expect("a close without an open");
                assert_eq!(f, frame, "closes the innermost open frame");
                let name = frames[f as usize]["name"].as_str().unwrap().to_string();
                from_ss.push((name, b, at - b));
            }
            t => panic!("event type {t}"),
        }
    }
    assert!(open.is_empty());
    from_ss.sort();
    let mut json_calls: Vec<(String, u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "syscall")
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            (name, e["ts"].as_u64().unwrap(), e["dur"].as_u64().unwrap())
        })
        .collect();
    json_calls.sort();
    assert_eq!(from_ss, json_calls);

    // A timeline bounded to 120 KiB: the shortest calls merged into their callers, every
    // call at least as long as the stated threshold kept, exactly.
    let small = dir.path().join("small");
    let o = Command::new(pttrace())
        .args(["view", "--timeline-limit", "120K", "-o"])
        .arg(&small)
        .arg(&trace)
        .output()
        .unwrap();
    let said = ok(&o, "pttrace view --timeline-limit");
    let bounded: Value =
        serde_json::from_str(&std::fs::read_to_string(small.join("timeline.json")).unwrap())
            .unwrap();
    let size = std::fs::metadata(small.join("timeline.json"))
        .unwrap()
        .len();
    assert!(size <= 120 << 10, "{size} bytes");
    let below = bounded["otherData"]["merged_below_instructions"]
        .as_u64()
        .unwrap();
    let merged = bounded["otherData"]["merged_calls"].as_u64().unwrap();
    assert!(below > 0 && merged > 0, "{}", bounded["otherData"]);
    assert!(said.contains(&format!(
        "{merged} calls shorter than {below} instructions merged"
    )));
    let calls_of = |v: &Value| -> Vec<(String, u64, u64)> {
        let mut c: Vec<_> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] != "syscall")
            .map(|e| {
                let (ts, dur) = (e["ts"].as_u64().unwrap(), e["dur"].as_u64().unwrap());
                (e["name"].as_str().unwrap().to_string(), ts, dur)
            })
            .collect();
        c.sort();
        c
    };
    let all = calls_of(&json);
    let kept = calls_of(&bounded);
    let want: Vec<_> = all.iter().filter(|c| c.2 >= below).cloned().collect();
    assert_eq!(kept, want);
    assert_eq!(kept.len() as u64 + merged, all.len() as u64);
    assert!(kept.iter().any(|c| c.0 == "main"));
    let calls = from_json.len() - windows.len();
    let bytes = std::fs::metadata(view.join("timeline.pftrace"))
        .unwrap()
        .len();
    println!(
        "timeline.pftrace: {bytes} bytes for {calls} calls and {} windows",
        windows.len()
    );

    // Collapsed stacks: the program's functions under one common prefix (the loader and
    // libc frames that called main), with the decoder's exact counts.
    let folded = std::fs::read_to_string(view.join("stacks.folded")).unwrap();
    let mut total = 0u64;
    let mut ours: BTreeMap<String, u64> = BTreeMap::new();
    let mut prefixes = Vec::new();
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        let frames: Vec<&str> = stack.split(';').collect();
        assert_eq!(frames[0], "calls", "{line}");
        if let Some(k) = frames.iter().position(|f| *f == "main") {
            prefixes.push(frames[..k].join(";"));
            *ours.entry(frames[k..].join(";")).or_default() += n;
        } else {
            assert!(
                !frames.iter().any(|f| ["a", "b", "c"].contains(f)),
                "{line}"
            );
        }
    }
    assert_eq!(total, pcs.len() as u64);
    prefixes.dedup();
    assert_eq!(prefixes.len(), 1, "{prefixes:?}");
    let expected: BTreeMap<String, u64> = [
        ("main", nm),
        ("main;a", na),
        ("main;a;b", nb),
        ("main;c", nc),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(ours, expected);

    // The flame graph draws them.
    let svg = std::fs::read_to_string(view.join("flamegraph.svg")).unwrap();
    assert!(svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
    // (inferno groups digits by thousands)
    let grouped = |n: u64| {
        let d = n.to_string();
        let mut s = String::new();
        for (i, ch) in d.chars().enumerate() {
            if i > 0 && (d.len() - i) % 3 == 0 {
                s.push(',');
            }
            s.push(ch);
        }
        s
    };
    assert_eq!(grouped(1234567), "1,234,567");
    for (name, n) in [("main", nm + na + nb + nc), ("b", nb), ("c", nc)] {
        let title = format!("<title>{name} ({} instructions", grouped(n));
        assert!(svg.contains(&title), "{title} not in the SVG");
    }

    // --format folded prints the same stacks; one .ptt file alone gives the same result.
    let o = Command::new(pttrace())
        .args(["view", "--format", "folded"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(ok(&o, "pttrace view --format folded"), folded);
    let ptt = std::fs::read_dir(&trace)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "ptt"))
        .unwrap();
    let single = dir.path().join("single");
    let o = Command::new(pttrace())
        .arg("view")
        .arg(&ptt)
        .arg("--out")
        .arg(&single)
        .output()
        .unwrap();
    ok(&o, "pttrace view FILE.ptt");
    assert_eq!(
        std::fs::read_to_string(single.join("stacks.folded")).unwrap(),
        folded
    );
}

/// The call spans (`X` events of calls and inlined code; windows and gaps left out) of a
/// timeline.json.
fn call_spans(path: &Path) -> Vec<(String, u64, u64)> {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out: Vec<(String, u64, u64)> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let cat = e["cat"].as_str().unwrap_or("");
            e["ph"] == "X" && (cat.starts_with("call") || cat == "inlined")
        })
        .map(|e| {
            let ts = e["ts"].as_u64().unwrap();
            (
                e["name"].as_str().unwrap().to_string(),
                ts,
                ts + e["dur"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// `pttrace decode --format summary` of `trace`.
fn decode_summary(trace: &Path) -> String {
    ok(
        &Command::new(pttrace())
            .args(["decode", "--format", "summary"])
            .arg(trace)
            .output()
            .unwrap(),
        "pttrace decode",
    )
}

/// The instructions of collapsed stacks (`a;b;c N` lines).
fn folded_total(folded: &str) -> u64 {
    folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

/// `--range insn:A..B` gives exactly the calls of the whole timeline cut to [A, B), and
/// stacks counting exactly the instructions A..B; `--range window:N..M` those of the
/// windows; `--tid` of a thread the trace lacks is refused by name.
#[test]
fn range_cuts_a_part_in_full_detail() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (prog, trace) = traced_calls(dir.path(), |p| vec![p.display().to_string()]);
    let pcs = decoded_pcs(&trace);
    let (&tid, pcs) = pcs.iter().next().unwrap();
    let view = |extra: &[&str], out: &str| -> PathBuf {
        let o = dir.path().join(out);
        view_into(&trace, &o, extra);
        o
    };
    let whole = call_spans(&view(&[], "whole").join("timeline.json"));
    let funcs = functions(&prog, &["main", "a", "b", "c"]);
    let leaf_of = |pc: u64| {
        funcs
            .iter()
            .find(|(_, &(s, n))| (s..s + n).contains(&pc))
            .map(|(f, _)| f.clone())
    };
    let (a, b) = (pcs.len() as u64 / 3, 2 * pcs.len() as u64 / 3);
    let range = format!("insn:{a}..{b}");
    let part = view(&["--range", &range, "--tid", &tid.to_string()], "part");
    let mut want: Vec<(String, u64, u64)> = whole
        .iter()
        .filter(|(_, s, e)| *e > a && *s < b)
        .map(|(n, s, e)| (n.clone(), *s.max(&a), *e.min(&b)))
        .collect();
    want.sort();
    assert_eq!(call_spans(&part.join("timeline.json")), want);
    // The stacks: each of the program's functions as a leaf exactly as often as the
    // decoder shows its instructions in [a, b).
    let folded = std::fs::read_to_string(part.join("stacks.folded")).unwrap();
    let mut leaf: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0;
    for l in folded.lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        let f = stack.rsplit(';').next().unwrap();
        if funcs.contains_key(f) {
            *leaf.entry(f.to_string()).or_default() += n;
        }
    }
    assert_eq!(total, b - a);
    let mut want_leaf: BTreeMap<String, u64> = BTreeMap::new();
    for &pc in &pcs[a as usize..b as usize] {
        if let Some(f) = leaf_of(pc) {
            *want_leaf.entry(f).or_default() += 1;
        }
    }
    assert_eq!(leaf, want_leaf);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(part.join("timeline.json")).unwrap())
            .unwrap();
    assert_eq!(
        json["otherData"]["part"],
        format!("instructions {a}..{b} of each thread, thread {tid} only (calls cut to it)")
    );

    // Windows 1 to 2: their instructions, as the decoder counts them per window.
    let summary = decode_summary(&trace);
    let per_window: u64 = summary
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = ["window 1 ", "window 2 "]
                .iter()
                .find_map(|p| l.strip_prefix(p))?;
            let (_, n) = rest.split_once("): ")?;
            n.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    assert!(per_window > 0, "{summary}");
    let part = view(&["--range", "window:1..2"], "windows");
    let folded = std::fs::read_to_string(part.join("stacks.folded")).unwrap();
    assert_eq!(folded_total(&folded), per_window, "{summary}");

    let o = Command::new(pttrace())
        .args(["view", "--tid", "1"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--tid 1: no thread of the trace has that id"),
        "{o:?}"
    );
    // A range past the trace's end is refused, saying how far the trace goes, and leaves
    // no file (before: exit 0 and an empty view).
    let windows = summary
        .lines()
        .filter(|l| l.trim_start().starts_with("window "))
        .count();
    let insns = pcs.len() as u64;
    for (range, says) in [
        (
            format!("window:{windows}..{}", windows + 5),
            format!("the most windows a thread image has is {windows}, counted from 0"),
        ),
        (
            format!("insn:{}..{}", insns + 10, insns + 20),
            format!("the longest thread image ends at instruction {insns}"),
        ),
    ] {
        let out = dir.path().join("past");
        let o = Command::new(pttrace())
            .args(["view", "--range", &range, "--out"])
            .arg(&out)
            .arg(&trace)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!(
                "--range {range}: no instruction is in that part of the trace ({says})"
            )),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&out).map_or(0, Iterator::count), 0);
    }
}

/// A return to an address no call pushed (`push` + `ret`, what JITs and interpreters do)
/// is said: that one, then the two returns it put out of step (`detour`'s own, then
/// `main`'s; `__libc_start_call_main` then calls `exit`).
#[test]
fn returns_no_call_expected_are_said() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = traced_prog(dir.path(), "own_return", &[]);
    let stdout = view_into(&trace, &dir.path().join("view"), &[]);
    assert!(
        stdout.contains(
            "(3 returns in 1 thread image went where no open call expected: code that makes \
             its own return addresses"
        ),
        "{stdout}"
    );
}

/// The call spans of a timeline.json by thread: (start, end, name), sorted by start then
/// by length (longest first).
fn spans_by_tid(path: &Path) -> BTreeMap<i64, Vec<(u64, u64, String)>> {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut by_tid: BTreeMap<i64, Vec<(u64, u64, String)>> = BTreeMap::new();
    for e in json["traceEvents"].as_array().unwrap() {
        let cat = e["cat"].as_str().unwrap_or("");
        if e["ph"] == "X" && cat.starts_with("call") {
            let ts = e["ts"].as_u64().unwrap();
            by_tid.entry(e["tid"].as_i64().unwrap()).or_default().push((
                ts,
                ts + e["dur"].as_u64().unwrap(),
                e["name"].as_str().unwrap().to_string(),
            ));
        }
    }
    for spans in by_tid.values_mut() {
        spans.sort_by_key(|(s, e, _)| (*s, std::cmp::Reverse(*e)));
    }
    by_tid
}

/// The spans no other span holds (sorted as [`spans_by_tid`] sorts), one after the other.
fn roots_of(spans: &[(u64, u64, String)]) -> Vec<(u64, u64, String)> {
    let mut roots: Vec<(u64, u64, String)> = Vec::new();
    for sp in spans {
        if roots.last().is_none_or(|r| sp.0 >= r.1) {
            roots.push(sp.clone());
        }
    }
    roots
}

/// A forked child's first instruction is the one after `fork` in its parent's code, in
/// its parent's frames: it starts with them (as gdb shows the child's stack), returns
/// through them as they expect, and its stacks go down to `_start` as its parent's do.
#[test]
fn a_forked_child_starts_in_its_parent_s_frames() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = traced_prog(dir.path(), "fork_stack", &[]);
    let view = dir.path().join("view");
    let stdout = view_into(&trace, &view, &["--full"]);
    assert!(!stdout.contains("no open call expected"), "{stdout}");
    let by_tid = spans_by_tid(&view.join("timeline.json"));
    assert_eq!(by_tid.len(), 2, "{:?}", by_tid.keys());
    let t = drpttracer::decode::ptt_dir::open(&trace).unwrap();
    let parent = i64::from(t.processes[0].pid);
    let child = *by_tid.keys().find(|&&k| k != parent).unwrap();
    let spans = &by_tid[&child];
    // The inherited frames, open from the child's first instruction: _start down to
    // level2 (and libc's fork under it), each ended by a return.
    let at_start: Vec<&str> = spans
        .iter()
        .filter(|(s, _, _)| *s == 0)
        .map(|(_, _, n)| n.as_str())
        .collect();
    assert_eq!(
        at_start[..6],
        [
            "_start",
            "__libc_start_main",
            "__libc_start_call_main",
            "main",
            "level1",
            "level2"
        ],
        "{spans:?}"
    );
    let roots: Vec<String> = roots_of(spans).into_iter().map(|r| r.2).collect();
    assert_eq!(roots, ["_start"], "{spans:?}");
    let end_of = |name: &str| {
        spans
            .iter()
            .find(|(s, _, n)| *s == 0 && n == name)
            .unwrap()
            .1
    };
    assert!(end_of("level2") < end_of("level1") && end_of("level1") < end_of("main"));
    // The parent's stacks as before: _start, ld.so's then the program's.
    let names: Vec<String> = roots_of(&by_tid[&parent])
        .into_iter()
        .map(|r| r.2)
        .collect();
    assert_eq!(names, ["_start", "_start"]);
    // Every folded stack of both processes starts at _start.
    let folded = std::fs::read_to_string(view.join("stacks.folded")).unwrap();
    for line in folded.lines() {
        assert!(line.starts_with("fork_stack;_start"), "{line}");
    }
}

/// A thread the program created is traced from its first instruction (the child's side
/// of `clone`): the frame it starts in has no caller. Returns to addresses no call pushed,
/// more of them than the thread has frames, never close it: every instruction of the
/// thread stays under it, as every one of the main thread stays under `_start`.
#[test]
fn a_created_thread_keeps_its_first_frame_whatever_it_returns_to() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = traced_prog(dir.path(), "own_return", &["thread"]);
    let view = dir.path().join("view");
    let stdout = view_into(&trace, &view, &["--full"]);
    // Counted while frames whose return addresses were seen are left: the first three
    // made-up returns (out of detours, worker, start_thread); the rest leave implied
    // frames.
    assert!(
        stdout.contains("(3 returns in 1 thread image went where no open call expected"),
        "{stdout}"
    );
    let by_tid = spans_by_tid(&view.join("timeline.json"));
    assert_eq!(by_tid.len(), 2, "{:?}", by_tid.keys());
    let t = drpttracer::decode::ptt_dir::open(&trace).unwrap();
    let pid = i64::from(t.processes[0].pid);
    for (tid, spans) in &by_tid {
        let roots = roots_of(spans);
        let names: Vec<&str> = roots.iter().map(|r| r.2.as_str()).collect();
        if *tid == pid {
            // ld.so's entry point, then the program's (ld.so jumps there).
            assert_eq!(names, ["_start", "_start"], "{roots:?}");
        } else {
            // One frame from the thread's first instruction to its last.
            assert_eq!(roots.len(), 1, "thread {tid}: {roots:?}");
            assert!(
                names[0].contains("clone"),
                "thread {tid} starts in {names:?}"
            );
            assert_eq!(roots[0].0, 0);
            assert!(
                spans.iter().any(|(_, _, n)| n == "detours"),
                "thread {tid}: {spans:?}"
            );
        }
    }
    // Every stack of both threads is under their first frames.
    let folded = std::fs::read_to_string(view.join("stacks.folded")).unwrap();
    for line in folded.lines() {
        let stack = line.rsplit_once(' ').map_or(line, |(s, _)| s);
        let first = stack.split(';').nth(1).unwrap_or("");
        assert!(
            first == "_start" || first.contains("clone"),
            "{line}\n{folded}"
        );
    }
}

/// A program a shell runs twice maps the same files at the same places both times (QEMU
/// places them alike): its two process images share one set of names, and each shows
/// exactly the calls the program makes, with the same names and lengths.
#[test]
fn images_of_the_same_files_share_their_names_and_show_the_same_calls() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = traced_calls_twice(dir.path());
    let view = dir.path().join("view");
    let stdout = view_into(&trace, &view, &["--full"]);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("names:"))
        .unwrap_or_default();
    let (images, namers) = line
        .split_once(" process images; ")
        .and_then(|(a, b)| {
            let images: usize = a.rsplit('(').next()?.parse().ok()?;
            let namers: usize = b.split(' ').next()?.parse().ok()?;
            Some((images, namers))
        })
        .unwrap_or_else(|| panic!("{stdout}"));
    let t = drpttracer::decode::ptt_dir::open(&trace).unwrap();
    let distinct: std::collections::BTreeSet<(i32, u64)> = t
        .threads
        .iter()
        .map(|th| (th.header.pid, th.header.nonce))
        .collect();
    assert_eq!(images, distinct.len(), "{stdout}");
    assert!(namers < images, "{stdout}");
    // The calls program's spans in each thread that ran it, from its main's start.
    let program = ["main", "a", "b", "c"];
    let runs: Vec<Vec<(u64, u64, String)>> = spans_by_tid(&view.join("timeline.json"))
        .into_values()
        .filter_map(|spans| {
            let main = spans.iter().find(|s| s.2 == "main")?.0;
            Some(
                spans
                    .into_iter()
                    .filter(|s| program.contains(&s.2.as_str()))
                    .map(|(b, e, n)| (b - main, e - main, n))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let names: Vec<&str> = runs[0].iter().map(|s| s.2.as_str()).collect();
    assert_eq!(names, ["main", "a", "b", "a", "b", "a", "b", "c"]);
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn missing_input_is_named() {
    let o = Command::new(pttrace())
        .args(["view", "/nonexistent/trace-dir"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("pttrace view: /nonexistent/trace-dir: cannot open"),
        "{err}"
    );
}

/// `decode` and `view` of a large directory show a progress bar when stderr is a terminal
/// (run under a pseudo-terminal with `script`), and nothing on stderr otherwise.
#[test]
fn progress_bar_only_on_a_terminal() {
    if !qemu_available() {
        return;
    }
    if Command::new("script").arg("--version").output().is_err() {
        println!("SKIP: script (util-linux) not installed: no pseudo-terminal to test with");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("py");
    let py: [&std::ffi::OsStr; 3] = ["/usr/bin/python3".as_ref(), "-c".as_ref(), "pass".as_ref()];
    let o = run_under_qemu(&out, &[], &py);
    ok(&o, "pttrace run python3");
    let size: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(size > 2 << 20, "{size} bytes: too small for a bar");
    let views = dir.path().join("views");
    for args in [
        format!("decode {} --format summary", out.display()),
        format!("view {} --out {}", out.display(), views.display()),
    ] {
        // Not a terminal: stderr stays empty (the same bar serves both commands: checked
        // once, the debug build is slow on this trace).
        if args.starts_with("decode") {
            let argv: Vec<&str> = args.split(' ').collect();
            let o = Command::new(pttrace()).args(&argv).output().unwrap();
            ok(&o, &args);
            assert!(
                o.stderr.is_empty(),
                "{args}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        // A terminal: the bar (redrawn in place) counts up to the total.
        let cmd = format!("{} {args} > /dev/null", pttrace().display());
        let o = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let tty = String::from_utf8_lossy(&o.stdout);
        assert!(tty.contains("ETA") && tty.contains("MiB"), "{args}: {tty}");
    }
}

/// The files of `dir` by name, with their bytes.
fn files_of(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// A `view` killed (SIGKILL: nothing of it runs after) at any point leaves only files
/// written whole: each one there is byte for byte the one a finished `view` writes, and
/// no temporary file is left. (Before, a kill left `.timeline.pftrace.partial` and the
/// JSON timelines cut short under their own names.)
#[test]
fn a_view_killed_leaves_only_whole_files() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("out");
    let sh: [&OsStr; 3] = [
        "/bin/sh".as_ref(),
        "-c".as_ref(),
        "ls /usr/bin | sort | head -5 | wc -l".as_ref(),
    ];
    ok(&run_under_qemu(&trace, &[], &sh), "pttrace run sh");
    let full = dir.path().join("full");
    let start = std::time::Instant::now();
    view_into(&trace, &full, &[]);
    let took = start.elapsed();
    let whole = files_of(&full);
    assert_eq!(
        whole.keys().collect::<Vec<_>>(),
        [
            "flamegraph.svg",
            "profile.speedscope.json",
            "stacks.folded",
            "timeline.json",
            "timeline.pftrace"
        ],
        "{}",
        full.display()
    );
    let mut killed_running = 0;
    for (k, part) in [0.2, 0.4, 0.6, 0.8, 0.95].iter().enumerate() {
        let out = dir.path().join(format!("cut{k}"));
        let mut child = Command::new(pttrace())
            .arg("view")
            .arg(&trace)
            .arg("--out")
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(took.mul_f64(*part));
        if child.try_wait().unwrap().is_none() {
            killed_running += 1;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if !out.exists() {
            continue;
        }
        for (name, bytes) in files_of(&out) {
            let Some(want) = whole.get(&name) else {
                panic!(
                    "killed at {part} of its time, view left {name} in {}",
                    out.display()
                );
            };
            assert!(
                bytes == *want,
                "killed at {part} of its time, view left {name} with {} bytes, not the {} of \
                 the whole file",
                bytes.len(),
                want.len()
            );
        }
    }
    assert!(killed_running > 0, "every view ended before it was killed");
}

/// Runs `cmd` and waits for it with `wait4`: its output and its peak resident memory in
/// bytes.
// The child is reaped by wait4, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn run_measured(cmd: &mut Command) -> (Output, u64) {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        err.read_to_end(&mut v).unwrap();
        v
    });
    let mut stdout = Vec::new();
    out.read_to_end(&mut stdout).unwrap();
    let stderr = err_reader.join().unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child (not waited for by anyone else), with valid pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let o = Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout,
        stderr,
    };
    (o, usage.ru_maxrss as u64 * 1024)
}

/// A trace of over 100 M instructions and 2.8 M calls (tests/progs/many_calls.c: 70,000
/// calls of `top`, each calling `mid` 8 times, each calling `leaf` 4 times): `view` stays
/// within 1 GiB; `timeline.pftrace` has every call (and libc's inlined code); the bounded `timeline.json` stays within
/// `--limit` and holds exactly the calls at least as long as the length it says it merged
/// below (the others merged into their callers); `stacks.folded` counts every instruction;
/// `--range` gives exactly the calls of that part, cut to it.
#[test]
fn a_large_trace_is_viewed_in_bounded_memory_and_bounded_files() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = shim_util::trace_many_calls(dir.path());
    let summary = decode_summary(&trace);
    let total: u64 = summary
        .lines()
        .find_map(|l| l.strip_prefix("total: "))
        .and_then(|l| l.split(", ").find_map(|f| f.strip_suffix(" instructions")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(total >= 100_000_000, "{total} instructions");

    let limit: u64 = 16 << 20;
    let view = dir.path().join("view");
    let (o, rss) = run_measured(
        Command::new(pttrace())
            .arg("view")
            .arg(&trace)
            .arg("--out")
            .arg(&view)
            .args(["--limit", "16M"]),
    );
    let said = ok(&o, "pttrace view");
    assert!(rss <= 1 << 30, "view peak RSS {rss} bytes");
    println!("view: peak RSS {} MiB\n{said}", rss >> 20);

    // Every call in the protobuf timeline.
    let pf = pftrace_reader::read(&std::fs::read(view.join("timeline.pftrace")).unwrap()).unwrap();
    let calls: Vec<(String, u64, u64)> = pf
        .slices
        .iter()
        .filter(|s| {
            s.categories
                .iter()
                .any(|c| c.starts_with("call") || c == "inlined")
        })
        .map(|s| (s.name.clone(), s.ts, s.ts + s.dur))
        .collect();
    let count = |f: &str| calls.iter().filter(|c| c.0 == f).count();
    assert_eq!(
        (count("top"), count("mid"), count("leaf")),
        (70_000, 560_000, 2_240_000)
    );
    assert!(
        said.contains(&format!("{} function spans", calls.len())),
        "{said}"
    );

    // The bounded JSON: within the limit, saying what it merged, holding exactly the calls
    // at least that long.
    let json_path = view.join("timeline.json");
    let size = std::fs::metadata(&json_path).unwrap().len();
    assert!(size <= limit, "timeline.json: {size} bytes");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let other = &json["otherData"];
    let below = other["merged_below_instructions"].as_u64().unwrap();
    let merged = other["merged_calls"].as_u64().unwrap();
    assert!(below > 0 && merged > 0, "{other}");
    let mut kept: Vec<(String, u64, u64)> = calls
        .iter()
        .filter(|c| c.2 - c.1 >= below)
        .cloned()
        .collect();
    kept.sort();
    assert_eq!(call_spans(&json_path), kept);
    assert_eq!(merged, (calls.len() - kept.len()) as u64);
    assert!(
        other["merged_note"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{merged} calls shorter than {below} instructions")),
        "{other}"
    );
    // The stacks: every instruction, within the limit.
    let folded = std::fs::read_to_string(view.join("stacks.folded")).unwrap();
    assert!(folded.len() as u64 <= limit);
    assert_eq!(folded_total(&folded), total);

    // A part in full detail: the calls of the whole cut to it.
    let (a, b) = (total / 2, total / 2 + 200_000);
    let part = dir.path().join("part");
    view_into(&trace, &part, &["--range", &format!("insn:{a}..{b}")]);
    let mut want: Vec<(String, u64, u64)> = calls
        .iter()
        .filter(|(_, s, e)| *e > a && *s < b)
        .map(|(n, s, e)| (n.clone(), *s.max(&a), *e.min(&b)))
        .collect();
    want.sort();
    assert!(want.len() > 1000, "{} calls in the part", want.len());
    assert_eq!(call_spans(&part.join("timeline.json")), want);
}

/// `trace` copied to `to` with every thread file's header saying the hardware backend
/// (the frame rewritten with its CRC); the rest of the files as they are.
fn as_hardware(trace: &Path, to: &Path) {
    use drpttracer::format::ptt;
    std::fs::create_dir_all(to).unwrap();
    let mut threads = 0;
    for e in std::fs::read_dir(trace).unwrap() {
        let p = e.unwrap().path();
        if !p.is_file() {
            continue;
        }
        let mut data = std::fs::read(&p).unwrap();
        if p.extension().is_some_and(|x| x == "ptt") {
            let name = p.display().to_string();
            let parsed = ptt::parse(&name, &data).unwrap();
            let f = parsed
                .frames
                .iter()
                .find(|f| f.ty == ptt::RecordType::ThreadHeader as u16)
                .unwrap();
            let mut h = ptt::decode_thread_header(f.payload).unwrap();
            assert_ne!(ptt::backend_name(h.backend), "hardware");
            h.backend = 0;
            assert_eq!(ptt::backend_name(h.backend), "hardware");
            let frame = ptt::frame_vec(
                ptt::RecordType::ThreadHeader,
                &ptt::thread_header_payload(&h),
            )
            .unwrap();
            let at = f.offset;
            assert_eq!(frame.len(), f.payload.len() + ptt::FRAME_OVERHEAD);
            data[at..at + frame.len()].copy_from_slice(&frame);
            threads += 1;
        }
        std::fs::write(to.join(p.file_name().unwrap()), data).unwrap();
    }
    assert!(threads >= 3, "{threads} thread files");
}

/// timeline.pftrace is written on a thread of its own: each thread image's part while the
/// next image is decoded when the axis is sure to be instructions (software backends),
/// else once every image is decoded (hardware: the axis may be time). Both ways write the
/// same files: a shell running the calls program twice (five thread images: the shell,
/// and each child as the shell then the program, the later ones adding frames and names
/// after the first ones were written), once as recorded and once with
/// its thread headers saying hardware (no TSC conversion: still the instruction axis).
#[test]
fn pftrace_streamed_or_written_after_decoding_is_the_same() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = traced_calls_twice(dir.path());
    let hw = dir.path().join("hw");
    as_hardware(&trace, &hw);
    let view = |t: &Path, out: &str| -> PathBuf {
        let o = dir.path().join(out);
        let said = view_into(t, &o, &[]);
        assert!(said.contains("(5 thread images: execve)"), "{said}");
        o
    };
    let (streamed, after) = (view(&trace, "streamed"), view(&hw, "after"));
    for f in [
        "timeline.pftrace",
        "timeline.json",
        "profile.speedscope.json",
        "stacks.folded",
    ] {
        let (a, mut b) = (
            std::fs::read(streamed.join(f)).unwrap(),
            std::fs::read(after.join(f)).unwrap(),
        );
        if f == "timeline.json" {
            // It names the trace it was made from.
            let text = String::from_utf8(b).unwrap();
            let (from, to) = (hw.display().to_string(), trace.display().to_string());
            assert!(text.contains(&from));
            b = text.replace(&from, &to).into_bytes();
        }
        assert!(a.len() > 100, "{f}: {} bytes", a.len());
        assert!(a == b, "{f} differs: {} and {} bytes", a.len(), b.len());
    }
    // Each image's calls are in both: main, a, b and c, twice.
    let spans = call_spans(&streamed.join("timeline.json"));
    let mains = spans.iter().filter(|s| s.0 == "main").count();
    assert_eq!(mains, 2, "{spans:?}");
    // No partial file is left.
    let left: Vec<_> = std::fs::read_dir(&streamed)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
