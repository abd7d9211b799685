//! Every frame named: a stripped program whose debug info was split off is named from its
//! debug file, found with `--debug-dir` by `.gnu_debuglink` or by build-id; its
//! `always_inline` function is a frame of its own nested in its caller; `decode --srcline`
//! gives each instruction's file:line as binutils' addr2line does.

mod shim_util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use shim_util::{have, pttrace, text};

fn ok(c: &mut Command) -> String {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `pttrace run --quiet --out OUT --` with no other flags (the machine's default backend),
/// the program to be appended.
fn run_quiet(out: &Path) -> Command {
    let mut c = Command::new(pttrace());
    c.args(["run", "--quiet", "--out"]).arg(out).arg("--");
    c
}

/// `view --format folded` of `trace` (it must succeed).
fn folded(trace: &Path) -> String {
    folded_and_said(trace).0
}

/// `view --format folded` of `trace` (it must succeed): the stacks, and what it said on
/// stderr.
fn folded_and_said(trace: &Path) -> (String, String) {
    let o = Command::new(pttrace())
        .args(["view", "--format", "folded"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The test program built `-O2 -g -no-pie`, then split: (stripped binary with a
/// debuglink, its debug file).
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let full = shim_util::compile_with("names", dir, "names.full", &["-O2", "-g", "-no-pie"]);
    let debug = dir.join("names.debug");
    let exe = dir.join("names");
    ok(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    ok(Command::new("objcopy")
        .args(["--strip-all", "--add-gnu-debuglink"])
        .arg(&debug)
        .arg(&full)
        .arg(&exe));
    (exe, debug)
}

/// Line number of the line holding `marker` in tests/progs/names.c.
fn line_of(marker: &str) -> u32 {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/names.c");
    let text = std::fs::read_to_string(src).unwrap();
    text.lines().position(|l| l.contains(marker)).unwrap() as u32 + 1
}

#[test]
fn a_split_stripped_program_is_named_from_its_debug_file_with_inlined_frames_and_lines() {
    if !have("objcopy") || !have("addr2line") {
        println!("SKIP: binutils (objcopy, addr2line) not installed");
        return;
    }
    if shim_util::qemu_available() {
        shim_util::plugin();
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let (exe, debug) = build(&bin);
    // The debug file lives elsewhere: found by its debuglink name in a --debug-dir.
    let by_link = tmp.path().join("debug-by-link");
    std::fs::create_dir(&by_link).unwrap();
    std::fs::rename(&debug, by_link.join("names.debug")).unwrap();
    // ... and in a build-id tree of another --debug-dir.
    let by_id = tmp.path().join("debug-by-id");
    let id = {
        let o = ok(Command::new("readelf").arg("-n").arg(&exe));
        o.lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
            .expect("a build-id note")
    };
    let id_dir = by_id.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&id_dir).unwrap();
    std::fs::copy(
        by_link.join("names.debug"),
        id_dir.join(format!("{}.debug", &id[2..])),
    )
    .unwrap();

    let out = tmp.path().join("trace");
    let o = run_quiet(&out).arg(&exe).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));

    // report names the stripped program and what would fix it, before any decoding.
    let report = ok(Command::new(pttrace()).arg("report").arg(&out));
    assert!(
        report.contains(&format!(
            "  no symbols: names: stripped, no debug file for build-id {}…",
            &id[..12]
        )),
        "{report}"
    );
    for dir in [&by_link, &by_id] {
        // Without the debug dir: no names for the program's code, and view says why.
        let (_, err) = folded_and_said(&out);
        assert!(
            err.contains(&format!(
                "pttrace view: code without symbols named module+0xOFFSET: names: stripped, \
                 no debug file for build-id {}…",
                &id[..12]
            )),
            "{err}"
        );
        // With it: main > outer > helper > mix (inlined), mix also inlined into outer.
        let folded = ok(Command::new(pttrace())
            .args(["view", "--format", "folded", "--debug-dir"])
            .arg(dir)
            .arg(&out));
        let stacks: BTreeMap<String, u64> = folded
            .lines()
            .map(|l| {
                let (s, n) = l.rsplit_once(' ').unwrap();
                (s.to_string(), n.parse().unwrap())
            })
            .collect();
        let ends = |suffix: &str| {
            stacks
                .iter()
                .filter(|(s, _)| s.ends_with(suffix))
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        assert!(
            ends(";main;outer;helper;mix (inlined)") > 1000,
            "{dir:?}: {folded}"
        );
        assert!(ends(";main;outer;helper") > 1000, "{folded}");
        assert!(ends(";main;outer;mix (inlined)") > 0, "{folded}");
        assert!(
            stacks.keys().all(|s| !s.contains(";names+0x")),
            "no frame of the program unnamed: {folded}"
        );
    }

    // The timeline: mix's inlined code as spans of their own (category `inlined`), each
    // inside the helper or outer call it was inlined into, one per loop iteration.
    let view_dir = tmp.path().join("view");
    ok(Command::new(pttrace())
        .args(["view", "--debug-dir"])
        .arg(&by_link)
        .arg("--out")
        .arg(&view_dir)
        .arg(&out));
    let timeline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(view_dir.join("timeline.json")).unwrap()).unwrap();
    let spans: Vec<(String, String, u64, u64)> = timeline["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "window")
        .map(|e| {
            let ts = e["ts"].as_u64().unwrap();
            (
                e["name"].as_str().unwrap().to_string(),
                e["cat"].as_str().unwrap().to_string(),
                ts,
                ts + e["dur"].as_u64().unwrap(),
            )
        })
        .collect();
    // The innermost span holding each inlined span (one thread: every span is nested).
    let parent_of = |i: usize| -> &str {
        let (_, _, s, e) = &spans[i];
        spans
            .iter()
            .enumerate()
            .filter(|&(j, (_, _, ps, pe))| j != i && ps <= s && e <= pe && (ps, pe) != (s, e))
            .min_by_key(|(_, (_, _, ps, pe))| pe - ps)
            .map_or("", |(_, (n, ..))| n.as_str())
    };
    let mut under: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, (name, cat, ..)) in spans.iter().enumerate() {
        if name == "mix (inlined)" {
            assert_eq!(cat, "inlined");
            *under.entry(parent_of(i)).or_default() += 1;
        }
    }
    assert!(under.get("helper").is_some_and(|&n| n >= 1001), "{under:?}");
    assert!(under.get("outer").is_some_and(|&n| n >= 1), "{under:?}");
    assert_eq!(under.len(), 2, "{under:?}");

    // decode --srcline: each instruction of the program's own code gets the line addr2line
    // gives (the innermost, inlined frame's).
    let jsonl = ok(Command::new(pttrace())
        .args(["decode", "--format", "jsonl", "--srcline", "--debug-dir"])
        .arg(&by_link)
        .arg(&out));
    let mut got: BTreeMap<u64, String> = BTreeMap::new();
    for l in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["type"] != "insn" {
            continue;
        }
        let pc =
            u64::from_str_radix(v["pc"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        // -no-pie: the program's code is at its link-time addresses.
        if !(0x401000..0x402000).contains(&pc) {
            continue;
        }
        let src = v["src"].as_str().unwrap_or("").to_string();
        got.insert(pc, src);
    }
    assert!(got.len() > 20, "{} instructions of the program", got.len());
    let addrs: Vec<String> = got.keys().map(|a| format!("{a:#x}")).collect();
    let oracle = ok(Command::new("addr2line")
        .arg("-e")
        .arg(by_link.join("names.debug"))
        .args(&addrs));
    let mut lines_seen = std::collections::BTreeSet::new();
    for ((pc, src), want) in got.iter().zip(oracle.lines()) {
        // addr2line: "/dir/names.c:9 (discriminator 1)"; ours: "/dir/names.c:9".
        let want = want.split(" (").next().unwrap();
        // "??:?", "crtstuff.c:?": no line for the address (.init, .plt, crt code).
        let no_line = want.starts_with("??") || want.ends_with(":?") || want.ends_with(":0");
        let want = if no_line { "" } else { want };
        let want_tail = want.rsplit('/').next().unwrap();
        let got_tail = src.rsplit('/').next().unwrap();
        assert_eq!(got_tail, want_tail, "{pc:#x}");
        if let Some(line) = got_tail.strip_prefix("names.c:") {
            lines_seen.insert(line.parse::<u32>().unwrap());
        }
    }
    assert!(lines_seen.contains(&line_of("MIX_LINE")), "{lines_seen:?}");
    assert!(
        lines_seen.contains(&line_of("HELPER_LOOP")),
        "{lines_seen:?}"
    );
}

/// JIT code named from the program's perf map, which `pttrace run` keeps with the trace
/// (the one in /tmp may be gone or rewritten by the next run).
#[test]
fn jit_code_is_named_from_the_perf_map_kept_with_the_trace() {
    if shim_util::qemu_available() {
        shim_util::plugin();
    } else {
        // The single-step backend does not follow code written at run time.
        println!("SKIP: qemu-x86_64 is not installed (JIT code is traced under QEMU)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = shim_util::compile("minijit", tmp.path());
    let out = tmp.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // sum of 2i+1 for i < 1000
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1000000\n");
    let kept: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("perf-"))
        })
        .collect();
    assert_eq!(kept.len(), 1, "{}", text(&o));
    let name = kept[0].file_name().unwrap().to_owned();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "JIT symbols of process {} kept: {}",
            name.to_string_lossy()
                .trim_start_matches("perf-")
                .trim_end_matches(".map"),
            kept[0].display()
        )),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_file(Path::new("/tmp").join(&name));
    jit_stack_is(&out, "jitted double (2x+1)");
    // Named: view has nothing to say of JIT code.
    let o = Command::new(pttrace())
        .args(["view", "--format", "folded"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("JIT code"),
        "{}",
        text(&o)
    );
}

/// JIT code without a perf map or jitdump is named by its addresses, and `view` says so
/// once per program with how to get names (a program it does not know: a perf map).
#[test]
fn jit_code_without_names_is_said_with_how_to_name_it() {
    if shim_util::qemu_available() {
        shim_util::plugin();
    } else {
        println!("SKIP: qemu-x86_64 is not installed (JIT code is traced under QEMU)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = shim_util::compile("minijit", tmp.path());
    let out = tmp.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg("unnamed")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // 100 copies of 2x+1, each called for x = 0..9 (a sum of 100)
    assert_eq!(String::from_utf8_lossy(&o.stdout), "10000\n");
    let o = Command::new(pttrace())
        .args(["view", "--format", "folded"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("JIT code")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    let n: u64 = lines[0]
        .strip_prefix("pttrace view: JIT code named by address: ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", lines[0]));
    // Each copy's two instructions, at least its first.
    assert!((100..=200).contains(&n), "{}", lines[0]);
    assert!(
        lines[0].ends_with(
            "addresses of minijit outside any file, without a perf map or jitdump to name \
             them; have it write a perf map (/tmp/perf-PID.map: address, size and name per line)"
        ),
        "{}",
        lines[0]
    );
    // The copies are named by their addresses in the stacks.
    let stacks = String::from_utf8_lossy(&o.stdout).into_owned();
    let jit = stacks.lines().filter(|l| l.contains(";main;0x")).count();
    assert_eq!(jit, 100, "{stacks}");

    // A perf map of the same process id left by an earlier process (written before this
    // one started) is not this process's: its names are not used. Written since, it is.
    let pid: i32 = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .find_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".info")?.split('-').next()?.parse().ok()
        })
        .unwrap();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    if map.exists() {
        println!("SKIP (stale map part): {} exists", map.display());
        return;
    }
    // (The map names the copies' addresses, as the JIT's own would.)
    let addrs: Vec<u64> = stacks
        .lines()
        .filter_map(|l| l.split(";main;0x").nth(1)?.split([';', ' ']).next())
        .filter_map(|a| u64::from_str_radix(a, 16).ok())
        .collect();
    let (lo, hi) = (*addrs.iter().min().unwrap(), *addrs.iter().max().unwrap());
    std::fs::write(
        &map,
        format!("{lo:x} {:x} stale_names_of_another_process\n", hi - lo + 32),
    )
    .unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&map)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let stale = folded(&out);
    std::fs::File::options()
        .write(true)
        .open(&map)
        .unwrap()
        .set_modified(std::time::SystemTime::now())
        .unwrap();
    let fresh = folded(&out);
    let _ = std::fs::remove_file(&map);
    assert!(!stale.contains("stale_names"), "{stale}");
    assert_eq!(
        stale.lines().filter(|l| l.contains(";main;0x")).count(),
        100,
        "{stale}"
    );
    assert!(
        fresh.contains(";main;stale_names_of_another_process"),
        "{fresh}"
    );
}

/// The mini JIT's code is one stack in `view`'s folded stacks, named `name` under main:
/// 1000 calls of 2 instructions each.
fn jit_stack_is(trace: &Path, name: &str) {
    let folded = folded(trace);
    let jit: Vec<&str> = folded
        .lines()
        .filter(|l| l.contains("jitted double"))
        .collect();
    assert_eq!(jit.len(), 1, "{folded}");
    assert!(
        jit[0].ends_with(&format!(";main;{name} 2000")),
        "{}",
        jit[0]
    );
}

/// Code run from an anonymous copy of a file's code, as V8 runs its embedded builtins
/// (node's "short builtin calls"): named by the file's symbols where the copy's bytes
/// place it, with exact counts (1000 calls of a 29-instruction function, each calling a
/// 5-instruction one 3 times), where it was a bare address before.
#[test]
fn code_run_from_a_copy_of_v8_builtins_is_named() {
    if shim_util::qemu_available() {
        shim_util::plugin();
    } else {
        println!(
            "SKIP: qemu-x86_64 is not installed (code written at run time is traced under QEMU)"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = shim_util::compile("builtins_copy", tmp.path());
    let out = tmp.path().join("trace");
    let o = run_quiet(&out).arg(&exe).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1001502500\n");
    let folded = folded(&out);
    let copied: Vec<&str> = folded
        .lines()
        .filter(|l| {
            // What main calls that is not libc's: the copy's frames, named or not.
            l.split_once(";main;").is_some_and(|(_, callee)| {
                callee.starts_with("Builtins_")
                    || callee.starts_with("0x")
                    || callee.contains("+0x")
            })
        })
        .collect();
    assert_eq!(
        copied,
        [
            "builtins_copy;_start;__libc_start_main;__libc_start_call_main;main;Builtins_SumSquares 29000",
            "builtins_copy;_start;__libc_start_main;__libc_start_call_main;main;Builtins_SumSquares;Builtins_Square 15000",
        ],
        "{folded}"
    );
}

/// node with `--perf-basic-prof` under QEMU (its start-up, ~0.6 G instructions, and a hot
/// JS loop): the JS function has its exact perf-map names (baseline `^` or optimized `*`),
/// V8's builtins run from their copy are named (over 0.1% of the instructions), and at most
/// 1% of the instructions are in frames without a name.
#[test]
fn node_jit_code_and_builtins_are_named() {
    if !shim_util::qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed (JIT code is traced under QEMU)");
        return;
    }
    if !have("node") {
        println!("SKIP: node is not installed");
        return;
    }
    shim_util::plugin();
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("hot.js");
    std::fs::write(
        &script,
        "function hotLoop(n){ let s=0; for (let i=0;i<n;i++) s+=i%7; return s; }\n\
         let t=0; for (let k=0;k<200;k++) t+=hotLoop(1000); console.log(t);\n",
    )
    .unwrap();
    let out = tmp.path().join("trace");
    // (node writes its V8 log beside it: in the temporary directory.)
    let o = run_quiet(&out)
        .current_dir(tmp.path())
        .args(["node", "--perf-basic-prof"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "599400\n");
    let folded = folded(&out);
    let (mut total, mut unnamed) = (0u64, 0u64);
    let mut hot = std::collections::BTreeSet::new();
    let mut builtins = 0u64;
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let leaf = stack.rsplit(';').next().unwrap();
        total += n;
        if leaf.starts_with("0x") || leaf.contains("+0x") {
            unnamed += n;
        }
        if leaf.starts_with("Builtin:") {
            builtins += n;
        }
        for f in stack.split(';').filter(|f| f.contains("hotLoop")) {
            hot.insert(f.to_string());
        }
    }
    let at = format!("{}:1:17", script.display());
    let names: std::collections::BTreeSet<String> =
        [format!("JS:^hotLoop {at}"), format!("JS:*hotLoop {at}")].into();
    assert!(!hot.is_empty() && hot.is_subset(&names), "{hot:?}");
    println!("{total} instructions: {builtins} in builtins, {unnamed} unnamed");
    assert!(total > 100_000_000, "{total}");
    // (How long the main thread runs builtins varies with V8's tiering, which its
    // concurrent compiler threads decide: 0.97% to 2.3% of the instructions seen here;
    // without their names there would be none.)
    assert!(builtins > total / 1000, "builtins {builtins} of {total}");
    assert!(
        unnamed * 100 <= total,
        "{unnamed} of {total} instructions unnamed"
    );
}

/// JIT code named from the program's jitdump (`jit-PID.dump` in its working directory, as
/// node --perf-prof writes it), which `pttrace run` keeps with the trace.
#[test]
fn jit_code_is_named_from_the_jitdump_kept_with_the_trace() {
    if shim_util::qemu_available() {
        shim_util::plugin();
    } else {
        println!("SKIP: qemu-x86_64 is not installed (JIT code is traced under QEMU)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = shim_util::compile("minijit", tmp.path());
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let out = tmp.path().join("trace");
    let o = Command::new(pttrace())
        .current_dir(&cwd)
        .args(["run", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg("jitdump")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1000000\n");
    let written: Vec<PathBuf> = std::fs::read_dir(&cwd)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let name = written[0].file_name().unwrap().to_owned();
    assert!(name.to_string_lossy().starts_with("jit-"), "{name:?}");
    let kept = out.join(&name);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("kept: {}", kept.display())),
        "{}",
        text(&o)
    );
    // Only the kept copy names the code now.
    std::fs::remove_file(&written[0]).unwrap();
    jit_stack_is(&out, "jitted double (2x+1) via jitdump");
}

/// A program that dies of a signal under QEMU (a crash, `raise(SIGTERM)`) still has its
/// code named: QEMU ends on a fatal signal without its exit callbacks, where the plugin had
/// written the process image's mappings, so every frame was a bare address (`python3 -c
/// 'import os; os.abort()'` showed `0x4002820b70;…` under `_start`). The mappings are now
/// written as code first runs in each file. (`view` also says where its trace stops.)
#[test]
fn a_program_killed_by_a_signal_under_qemu_is_named() {
    if !shim_util::qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile("fatal", dir.path());
    for (how, status) in [("segv", 139), ("term", 143)] {
        let out = dir.path().join(how);
        let o = shim_util::qemu_run_command(&out, &["--quiet"], &[prog.as_ref(), how.as_ref()])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(status), "{}", text(&o));
        // Said after the signal: the trace stops at the last system call.
        let said = text(&o);
        let killed = format!("was killed by signal {} (", status - 128);
        let after = said
            .split_once(killed.as_str())
            .map(|(_, a)| a)
            .unwrap_or("");
        assert!(
            after.lines().nth(1)
                == Some(
                    "pttrace run: under QEMU a process killed by a signal keeps its trace up \
                     to its last system call: the code it ran after is not in the trace"
                ),
            "{said}"
        );
        let report = ok(Command::new(pttrace()).arg("report").arg(&out));
        let image = report
            .split("\nprocess ")
            .find(|p| p.contains(&format!("{} {how}", prog.display())))
            .unwrap_or_else(|| panic!("{report}"));
        assert!(
            image.contains("ended: no ProcessEnd record") && !image.contains(", 0 mappings,"),
            "{image}"
        );
        let (folded, err) = folded_and_said(&out);
        assert!(!err.contains("named by address"), "{err}");
        // And it says that the trace stops at the last syscall (the rest died with QEMU).
        assert!(
            err.contains(
                ": no End record: the thread was killed (by a signal, or by another thread's \
                 execve) or is still running; its trace stops at the end of its last window"
            ),
            "{err}"
        );
        let lines: Vec<&str> = folded.lines().filter(|l| l.starts_with("fatal;")).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("fatal;_start;__libc_start_main;")
                    && l.contains(";main;getppid")),
            "{folded}"
        );
        let bare: Vec<&&str> = lines
            .iter()
            .filter(|l| {
                l.split(';').any(|f| {
                    f.starts_with("0x") && f.split(' ').next().is_some_and(|a| a.len() > 2)
                })
            })
            .collect();
        assert!(bare.is_empty(), "frames named by address: {bare:?}");
    }
}
