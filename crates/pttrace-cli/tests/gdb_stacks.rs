//! Stacks that are right, with a debugger as the reference: a C++ program (recursion,
//! longjmp, an exception crossing frames, a signal handler, a second thread, then an exec
//! into a second image) runs traced under QEMU with QEMU's gdb stub on, and gdb stops at
//! each of its 26 calls of `probe` (22 before the exec, 4 after it, in a second session).
//! At each stop, the function names of gdb's `bt` (past main) equal the stack that
//! `pttrace view` shows at the same execution of `probe` (the same thread's k-th) in
//! the JSON timeline, the protobuf timeline and the folded stacks.

#[allow(dead_code)]
mod pftrace_reader;
mod shim_util;

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use shim_util::{have, pttrace, qemu_available, text};

/// gdb's stops: (gdb thread number, frame names innermost first, `<signal handler
/// called>` left out).
fn gdb_stops(out: &str) -> Vec<(usize, Vec<String>)> {
    let mut stops: Vec<(usize, Vec<String>)> = Vec::new();
    for l in out.lines() {
        if let Some(n) = l.strip_prefix("HIT ") {
            stops.push((n.trim().parse().unwrap(), Vec::new()));
            continue;
        }
        let Some(rest) = l.strip_prefix('#') else {
            continue;
        };
        let Some(last) = stops.last_mut() else {
            continue;
        };
        // "#1  0x0000000000401fa1 in fact (n=...) at f.cpp:19" or "#0  probe (tag=..."
        let rest = rest
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start();
        let rest = match rest.split_once(" in ") {
            Some((addr, f)) if addr.starts_with("0x") => f,
            _ => rest,
        };
        if rest.starts_with("<signal handler called>") {
            continue;
        }
        last.1
            .push(rest.split_whitespace().next().unwrap().to_string());
    }
    stops
}

/// The innermost-first names of the spans holding instruction `i`, as (ts, end, name).
fn stack_at(spans: &[(u64, u64, String)], i: u64) -> Vec<String> {
    let mut open: Vec<&(u64, u64, String)> =
        spans.iter().filter(|(s, e, _)| *s <= i && i < *e).collect();
    open.sort_by_key(|(s, e, _)| (std::cmp::Reverse(*s), *e));
    open.iter().map(|(_, _, n)| n.clone()).collect()
}

/// gdb names a C++ function without its parameters, an inlined one without our
/// ` (inlined)`, and picks one of several names of an address (`clone` for `__clone`):
/// equal when the names match without parameters, or when both are symbols of the same
/// address.
fn same_function(gdb: &str, ours: &str, addr_of: &HashMap<String, u64>) -> bool {
    let ours = ours.strip_suffix(" (inlined)").unwrap_or(ours);
    let plain = ours.split('(').next().unwrap_or(ours);
    plain == gdb || (addr_of.get(gdb).is_some() && addr_of.get(gdb) == addr_of.get(plain))
}

#[test]
fn stacks_equal_gdbs_backtraces() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    if !have("gdb") || !have("g++") {
        println!("SKIP: gdb or g++ is not installed (scripts/setup.sh installs them)");
        return;
    }
    shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/stacks.cpp");
    let exe = dir.path().join("stacks");
    // Static: gdb reads every function's name and unwind data from the one file (QEMU's
    // stub does not report shared libraries).
    let st = Command::new("g++")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-static",
            "-pthread",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    let addr_of: HashMap<String, u64> = {
        use object::{Object, ObjectSymbol};
        let data = std::fs::read(&exe).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        obj.symbols()
            .filter(|s| s.is_definition())
            .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
            .collect()
    };

    // QEMU with its gdb stub on a free port, through a wrapper given as --qemu.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let qemu = shim_util::in_path("qemu-x86_64").expect("qemu-x86_64 in PATH");
    let wrapper = dir.path().join("qemu-gdb.sh");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {} -g {port} \"$@\"\n", qemu.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = dir.path().join("trace");
    let mut run = Command::new(pttrace())
        .args(["run", "--quiet", "--backend", "qemu", "--qemu"])
        .arg(&wrapper)
        .arg("--out")
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = dir.path().join("cmds.gdb");
    std::fs::write(
        &script,
        format!(
            "set pagination off\nset confirm off\nset backtrace past-main on\n\
             set backtrace past-entry on\ntarget remote 127.0.0.1:{port}\n\
             handle SIGUSR1 nostop noprint pass\nbreak probe\ncommands\nsilent\n\
             printf \"HIT %d\\n\", $_thread\nbt\ncontinue\nend\ncontinue\n"
        ),
    )
    .unwrap();
    // The stub listens once QEMU has started: retry the connection for a while. The
    // program's exec starts a new QEMU (the plugin's), whose stub listens on the same
    // port: a second gdb session follows the second image (gdb's first one ends with the
    // connection).
    let session = || {
        for _ in 0..50 {
            let o = Command::new("gdb")
                .args(["-batch", "-nx", "-x"])
                .arg(&script)
                .arg(&exe)
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            if out.contains("HIT ") {
                return out;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        String::new()
    };
    let first = session();
    let second = session();
    let gdb_out = format!("{first}{second}");
    let mut stdout = String::new();
    for l in std::io::BufReader::new(run.stdout.take().unwrap()).lines() {
        stdout.push_str(&l.unwrap());
    }
    let status = run.wait().unwrap();
    assert!(status.success(), "pttrace run: {status:?}\n{gdb_out}");
    assert_eq!(stdout, "946120");
    // 22 stops in the first image, 4 in the exec'd one (all in thread 1).
    let stops = gdb_stops(&gdb_out);
    assert_eq!(stops.len(), 26, "{gdb_out}");
    assert_eq!(gdb_stops(&second).len(), 4, "{second}");

    // Our side: the three stack views, and where each thread entered probe (the start of
    // each of its `probe` spans; gdb's breakpoint after probe's prologue has the same
    // stack).
    let view = dir.path().join("view");
    let o = Command::new(pttrace())
        .arg("view")
        .arg(&out)
        .arg("--out")
        .arg(&view)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // Recursion, longjmp, a C++ exception, a signal, threads, exec: every return went
    // where an open call expected (no "stacks there may be wrong" line).
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(!said.contains("no open call expected"), "{said}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(view.join("timeline.json")).unwrap()).unwrap();
    let mut json_spans: HashMap<i64, Vec<(u64, u64, String)>> = HashMap::new();
    for e in json["traceEvents"].as_array().unwrap() {
        let cat = e["cat"].as_str().unwrap_or("");
        if e["ph"] == "X" && (cat.starts_with("call") || cat == "inlined") {
            let ts = e["ts"].as_u64().unwrap();
            json_spans
                .entry(e["tid"].as_i64().unwrap())
                .or_default()
                .push((
                    ts,
                    ts + e["dur"].as_u64().unwrap(),
                    e["name"].as_str().unwrap().to_string(),
                ));
        }
    }
    let mut hits: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for (tid, spans) in &json_spans {
        let mut starts: Vec<u64> = spans
            .iter()
            .filter(|(_, _, n)| n == "probe")
            .map(|(s, _, _)| *s)
            .collect();
        starts.sort_unstable();
        hits.insert(*tid, starts);
    }
    // gdb numbers threads in creation order: the main thread (its tid is the pid) first.
    // (Sorting tids would not do: they wrap around at pid_max.)
    let mut tids: Vec<i64> = hits.keys().copied().collect();
    assert_eq!(tids.len(), 2, "{tids:?}");
    let pid = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["pid"].as_i64())
        .unwrap();
    tids.sort_by_key(|&t| t != pid);
    assert_eq!(tids[0], pid, "{tids:?}");
    let pf = pftrace_reader::read(&std::fs::read(view.join("timeline.pftrace")).unwrap()).unwrap();
    let mut pf_spans: HashMap<i64, Vec<(u64, u64, String)>> = HashMap::new();
    for s in &pf.slices {
        if let pftrace_reader::TrackKind::Thread { tid, .. } = pf.tracks[&s.track].kind {
            pf_spans
                .entry(i64::from(tid))
                .or_default()
                .push((s.ts, s.ts + s.dur, s.name.clone()));
        }
    }
    let folded = std::fs::read_to_string(view.join("stacks.folded")).unwrap();
    let folded: Vec<&str> = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect();

    let mut kth: HashMap<usize, usize> = HashMap::new();
    for (n, (thread, frames)) in stops.iter().enumerate() {
        let tid = tids[thread - 1];
        let k = kth.entry(*thread).or_default();
        let i = hits[&tid][*k];
        *k += 1;
        let ours = stack_at(&json_spans[&tid], i);
        let same = |ours: &[String]| {
            ours.len() == frames.len()
                && frames
                    .iter()
                    .zip(ours)
                    .all(|(g, o)| same_function(g, o, &addr_of))
        };
        assert!(
            same(&ours),
            "stop {n} (thread {thread}): gdb {frames:?}\ntimeline.json {ours:?}"
        );
        assert_eq!(
            stack_at(&pf_spans[&tid], i),
            ours,
            "stop {n}: timeline.pftrace"
        );
        // The folded stacks hold this stack (outermost first, under the command name).
        let path: Vec<&str> = ours.iter().rev().map(String::as_str).collect();
        let line = format!("stacks;{}", path.join(";"));
        assert!(
            folded.contains(&line.as_str()),
            "stop {n}: {line} not folded"
        );
    }
}
