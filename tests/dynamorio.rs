//! Our libdrpttracer.so inside DynamoRIO, next to DynamoRIO's own drpttracer.
//!
//! Needs the DynamoRIO build that `scripts/dynamorio.sh` makes in
//! `${PTTRACE_DYNAMORIO_DIR:-$HOME/.cache/pttrace/dynamorio}`; without it every test prints
//! `SKIP: ...` and passes. With it:
//! - drmemtrace `-offline -enable_kernel_tracing` on /bin/ls with DynamoRIO's library and
//!   with ours (PTTRACER_BACKEND unset, and =emulated) ends the same way: same exit status,
//!   same output ("Failed to initialize drpttracer." on a machine without Intel PT), no crash;
//! - a client of our own (c_tests/dynamorio/client.c) calls every drpttracer.h function from
//!   DynamoRIO's thread and syscall events over 1,000 thread lifetimes
//!   (c_tests/dynamorio/threads.c), checks each status against DynamoRIO's library and
//!   checks for leaks (fds, VmRSS, live outputs/handles);
//! - DynamoRIO's drmemtrace sources that include drpttracer headers (trace_entry.h,
//!   syscall_pt_trace.cpp) compile with our include/ instead of DynamoRIO's ext/drpttracer.
//!
//! The library tested is the cdylib cargo built for this test run
//! (target/<profile>/libdrpttracer.so); drmemtrace and the client load it through
//! DynamoRIO's private loader, which looks in the client's own folder first, so the
//! DynamoRIO build tree is never modified.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What the client expects from our library when PTTRACER_BACKEND is unset (no Intel PT
/// here: init fails, as DynamoRIO's library's does).
const CLIENT_OPTIONS_UNSET: &[&str] = &["expect_init=0"];
/// ... and with PTTRACER_BACKEND=emulated: inside DynamoRIO the single-stepping backend is
/// refused by drpttracer_init (DynamoRIO owns the signals and runs the code cache). Were it
/// refused at create_handle instead, this would be
/// `["expect_init=1", "expect_handle=ERROR_FAILED_TO_OPEN_PERF_EVENT"]`.
const CLIENT_OPTIONS_EMULATED: &[&str] = &["expect_init=0"];

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

struct DynamoRio {
    src: PathBuf,
    build: PathBuf,
}

impl DynamoRio {
    fn drrun(&self) -> PathBuf {
        self.build.join("bin64/drrun")
    }
}

/// The cache `scripts/dynamorio.sh` builds, or None (after printing why) when absent.
fn dynamorio() -> Option<DynamoRio> {
    let dir = match std::env::var_os("PTTRACE_DYNAMORIO_DIR") {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".cache/pttrace/dynamorio"),
            None => {
                println!("SKIP: HOME is not set (run scripts/dynamorio.sh)");
                return None;
            }
        },
    };
    let dr = DynamoRio {
        src: dir.join("src"),
        build: dir.join("build"),
    };
    let needed = [
        dir.join("stamp"),
        dr.drrun(),
        dr.build.join("clients/lib64/release/libdrmemtrace.so"),
        dr.build.join("ext/lib64/release/libdrpttracer.so"),
        dr.build.join("cmake/DynamoRIOConfig.cmake"),
        dr.src.join("clients/drcachesim/common/trace_entry.h"),
    ];
    if let Some(missing) = needed.iter().find(|p| !p.exists()) {
        println!(
            "SKIP: no DynamoRIO build in {} ({} is missing) (run scripts/dynamorio.sh)",
            dir.display(),
            missing.display()
        );
        return None;
    }
    Some(dr)
}

/// libdrpttracer.so of this build (cargo builds the cdylib for integration tests):
/// target/<profile>/deps/<test> -> target/<profile>/libdrpttracer.so.
fn our_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    for dir in exe.ancestors().skip(1).take(3) {
        let cand = dir.join("libdrpttracer.so");
        if cand.is_file() {
            return cand;
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let fallback = target.join("debug/libdrpttracer.so");
    assert!(
        fallback.is_file(),
        "libdrpttracer.so not found near {} nor at {}",
        exe.display(),
        fallback.display()
    );
    fallback
}

fn our_include() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

fn have_tool(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

struct Run {
    /// Exit code, or 128 + signal.
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "exit {}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion (killed after RUN_TIMEOUT), capturing its output.
fn run(cmd: &mut Command) -> Run {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish in {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Run {
        code,
        stdout: String::from_utf8_lossy(&t_out.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t_err.join().unwrap()).into_owned(),
    }
}

fn assert_no_crash(r: &Run, what: &str) {
    for bad in [
        "internal crash",
        "SIGSEGV",
        "Received SIG",
        "Program aborted",
    ] {
        assert!(
            !r.stderr.contains(bad) && !r.stdout.contains(bad),
            "{what}: DynamoRIO reports a crash ({bad:?}):\n{}",
            r.describe()
        );
    }
}

// ---- (b) drmemtrace -enable_kernel_tracing, DynamoRIO's library vs ours -----------------

/// A folder holding a copy of drmemtrace's client and the given libdrpttracer.so: run with
/// `drrun -c <folder>/libdrmemtrace.so`, it loads that libdrpttracer.so (the private loader
/// searches the client's folder before DynamoRIO's ext/lib64).
fn drmemtrace_with(dr: &DynamoRio, lib: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let client = dir.join("libdrmemtrace.so");
    std::fs::copy(
        dr.build.join("clients/lib64/release/libdrmemtrace.so"),
        &client,
    )
    .unwrap();
    std::fs::copy(lib, dir.join("libdrpttracer.so")).unwrap();
    client
}

fn run_drmemtrace(
    dr: &DynamoRio,
    client: Option<&Path>,
    outdir: &Path,
    backend: Option<&str>,
) -> Run {
    std::fs::create_dir_all(outdir).unwrap();
    let mut cmd = Command::new(dr.drrun());
    match client {
        Some(c) => cmd.arg("-c").arg(c),
        None => cmd.args(["-t", "drmemtrace"]),
    };
    cmd.args(["-offline", "-enable_kernel_tracing", "-outdir"])
        .arg(outdir)
        .args(["--", "/bin/ls", "/"]);
    cmd.env_remove("PTTRACER_BACKEND");
    if let Some(b) = backend {
        cmd.env("PTTRACER_BACKEND", b);
    }
    run(&mut cmd)
}

#[test]
fn drmemtrace_kernel_tracing_ends_as_with_dynamorios_library() {
    let Some(dr) = dynamorio() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();

    // The way a user runs it, with DynamoRIO's library.
    let reference = run_drmemtrace(&dr, None, &t.join("out-t"), None);
    assert_no_crash(&reference, "-t drmemtrace with DynamoRIO's libdrpttracer");
    // The same client, loaded with -c from a folder, with DynamoRIO's library: the route
    // used for ours must give the same as -t.
    let dr_client = drmemtrace_with(
        &dr,
        &dr.build.join("ext/lib64/release/libdrpttracer.so"),
        &t.join("dr"),
    );
    let dr_run = run_drmemtrace(&dr, Some(&dr_client), &t.join("out-dr"), None);
    assert_eq!(
        (dr_run.code, &dr_run.stdout, &dr_run.stderr),
        (reference.code, &reference.stdout, &reference.stderr),
        "-c <copy of libdrmemtrace.so> differs from -t drmemtrace:\n{}\n=== -t:\n{}",
        dr_run.describe(),
        reference.describe()
    );
    if !Path::new("/sys/bus/event_source/devices/intel_pt").exists() {
        // What DynamoRIO's library gives without Intel PT (tracer.cpp's FATAL).
        assert_eq!(reference.code, 255, "{}", reference.describe());
        assert_eq!(
            reference.stderr.trim(),
            "Failed to initialize drpttracer.",
            "{}",
            reference.describe()
        );
    }

    let ours = drmemtrace_with(&dr, &our_lib(), &t.join("ours"));
    if Path::new("/sys/bus/event_source/devices/intel_pt").exists() {
        // With Intel PT: kernel syscall traces that DynamoRIO's post-processor reads.
        let out = t.join("out-ours-pt");
        let r = run_drmemtrace(&dr, Some(&ours), &out, None);
        assert_no_crash(&r, "drmemtrace with our libdrpttracer on Intel PT");
        assert_eq!(r.code, 0, "{}", r.describe());
        let dir = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with(".dir"))
            .expect("drmemtrace.*.dir");
        let kernel = dir.join("raw/kernel.raw");
        assert!(
            std::fs::read_dir(&kernel).is_ok_and(|mut d| d.next().is_some()),
            "no per-thread .raw.pt files in {}",
            kernel.display()
        );
        let post = run(Command::new(dr.build.join("clients/bin64/drraw2trace"))
            .arg("-indir")
            .arg(&dir));
        assert_eq!(post.code, 0, "drraw2trace: {}", post.describe());
        return;
    }
    println!(
        "SKIP: no intel_pt PMU here: the Intel PT half (drmemtrace writing kernel syscall \
         traces through our library, post-processed by drraw2trace) needs one"
    );
    for backend in [None, Some("emulated")] {
        let what = format!(
            "drmemtrace with our libdrpttracer (PTTRACER_BACKEND={})",
            backend.unwrap_or("<unset>")
        );
        let r = run_drmemtrace(
            &dr,
            Some(&ours),
            &t.join(format!("out-ours-{}", backend.unwrap_or("unset"))),
            backend,
        );
        assert_no_crash(&r, &what);
        assert_eq!(
            (r.code, &r.stdout, &r.stderr),
            (reference.code, &reference.stdout, &reference.stderr),
            "{what} ends differently from DynamoRIO's library:\n{}\n=== DynamoRIO's:\n{}",
            r.describe(),
            reference.describe()
        );
    }
}

// ---- (c) our own client over 1,000 thread lifetimes -----------------------------------

/// Builds c_tests/dynamorio (client + thread program) against our library, once per test
/// binary run, in CARGO_TARGET_TMPDIR/dynamorio-client.
fn client_build(dr: &DynamoRio) -> &'static Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c_tests/dynamorio");
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dynamorio-client");
        let configure = run(Command::new("cmake")
            .arg("-S")
            .arg(&src)
            .arg("-B")
            .arg(&bin)
            .arg(format!(
                "-DDynamoRIO_DIR={}",
                dr.build.join("cmake").display()
            ))
            .arg(format!("-DDRPTTRACER_LIBRARY={}", our_lib().display()))
            .arg(format!(
                "-DDRPTTRACER_INCLUDE_DIR={}",
                our_include().display()
            )));
        if configure.code != 0 {
            return Err(format!("cmake configure failed:\n{}", configure.describe()));
        }
        let build = run(Command::new("cmake")
            .arg("--build")
            .arg(&bin)
            .args(["-j", "2"]));
        if build.code != 0 {
            return Err(format!("cmake --build failed:\n{}", build.describe()));
        }
        Ok(bin)
    })
}

/// `drpttracer-client: threads=N calls=N mismatches=N ... leak=no` as key -> value.
fn summary(r: &Run) -> Option<Vec<(String, String)>> {
    let line = r
        .stderr
        .lines()
        .find(|l| l.starts_with("drpttracer-client: threads="))?;
    Some(
        line["drpttracer-client: ".len()..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn run_client(backend: Option<&str>, options: &[&str]) {
    let Some(dr) = dynamorio() else { return };
    if !have_tool("cmake") || !have_tool("cc") {
        println!("SKIP: cmake or cc missing (run scripts/dynamorio.sh)");
        return;
    }
    let bin = match client_build(&dr) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let what = format!(
        "client over 1,000 thread lifetimes (PTTRACER_BACKEND={})",
        backend.unwrap_or("<unset>")
    );
    let mut cmd = Command::new(dr.drrun());
    cmd.arg("-c")
        .arg(bin.join("libdrpttracer_client.so"))
        .args(options)
        .arg("--")
        .arg(bin.join("drpttracer_threads"))
        .args(["125", "8"]);
    cmd.env_remove("PTTRACER_BACKEND");
    if let Some(b) = backend {
        cmd.env("PTTRACER_BACKEND", b);
    }
    let started = Instant::now();
    let r = run(&mut cmd);
    println!("{what}: {:?}\n{}", started.elapsed(), r.stderr);
    assert_no_crash(&r, &what);
    let s = summary(&r).unwrap_or_else(|| panic!("{what}: no summary line:\n{}", r.describe()));
    let get = |k: &str| {
        s.iter()
            .find(|(kk, _)| kk == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{what}: summary has no {k}:\n{}", r.describe()))
    };
    assert_eq!(get("mismatches"), "0", "{what}:\n{}", r.describe());
    assert_eq!(get("leak"), "no", "{what}:\n{}", r.describe());
    assert_eq!(get("outputs_live"), "0", "{what}:\n{}", r.describe());
    assert_eq!(get("handles_live"), "0", "{what}:\n{}", r.describe());
    let threads: u32 = get("threads").parse().unwrap();
    assert!(
        threads >= 1001,
        "{what}: {threads} threads seen:\n{}",
        r.describe()
    );
    assert!(
        r.stdout.contains("threads: 1000 thread lifetimes"),
        "{what}:\n{}",
        r.describe()
    );
    assert_eq!(r.code, 0, "{what}:\n{}", r.describe());
}

#[test]
fn client_calls_every_function_backend_unset() {
    run_client(None, CLIENT_OPTIONS_UNSET);
}

#[test]
fn client_calls_every_function_backend_emulated() {
    run_client(Some("emulated"), CLIENT_OPTIONS_EMULATED);
}

// ---- (d) drmemtrace's sources compile with our headers ---------------------------------

/// `c++ -std=c++17 -fsyntax-only -H` of `file` with `args`; returns the headers it read.
fn syntax_check(file: &Path, args: &[String]) -> Vec<String> {
    let r = run(Command::new("c++")
        .args(["-std=c++17", "-fsyntax-only", "-H"])
        .args(args)
        .arg(file));
    assert_eq!(
        r.code,
        0,
        "c++ -fsyntax-only {} failed:\n{}",
        file.display(),
        r.describe()
    );
    r.stderr
        .lines()
        .filter(|l| l.starts_with('.'))
        .map(|l| l.trim_start_matches('.').trim().to_string())
        .collect()
}

fn assert_drpttracer_headers_are_ours(headers: &[String], what: &str) {
    let ours = our_include();
    let pt: Vec<&String> = headers
        .iter()
        .filter(|h| h.contains("drpttracer"))
        .collect();
    assert!(
        pt.iter().any(|h| h.ends_with("drpttracer_shared.h")),
        "{what}: drpttracer_shared.h was not read: {pt:?}"
    );
    for h in pt {
        assert!(
            Path::new(h).starts_with(&ours),
            "{what}: {h} is not from {}",
            ours.display()
        );
    }
}

#[test]
fn drmemtrace_sources_compile_with_our_headers() {
    let Some(dr) = dynamorio() else { return };
    if !have_tool("c++") {
        println!("SKIP: c++ missing");
        return;
    }
    let ours = our_include();
    let s = &dr.src;
    let inc = |p: &Path| format!("-I{}", p.display());
    // trace_entry.h includes drpttracer_shared.h (when built with the PT tracer or
    // post-processor) and utils.h, which includes dr_project_wide_defines.h: nothing else
    // from DynamoRIO, and nothing from its ext/.
    let common = [
        "-DBUILD_PT_TRACER".to_string(),
        inc(&ours),
        inc(&s.join("clients/drcachesim/common")),
        inc(&s.join("common")),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let tu = tmp.path().join("trace_entry_check.cpp");
    std::fs::write(
        &tu,
        "#include <cstddef>\n\
         #include \"trace_entry.h\"\n\
         static_assert(sizeof(pt_metadata_t) == 18, \"pt_metadata_t is 18 packed bytes\");\n\
         static_assert(offsetof(pt_metadata_t, time_shift) == 4, \"layout\");\n\
         static_assert(offsetof(pt_metadata_t, time_zero) == 10, \"layout\");\n\
         static_assert(sizeof(dynamorio::drmemtrace::pt_metadata_buf_t) >= 18, \"used\");\n",
    )
    .unwrap();
    let headers = syntax_check(&s.join("clients/drcachesim/common/trace_entry.h"), &common);
    assert_drpttracer_headers_are_ours(&headers, "trace_entry.h");
    let headers = syntax_check(&tu, &common);
    assert_drpttracer_headers_are_ours(&headers, "trace_entry.h + layout checks");

    // syscall_pt_trace.cpp also needs dr_api.h (the build's include/, which has no
    // drpttracer header) and drmemtrace.h (tracer/); drpttracer.h must come from ours.
    let mut args = vec!["-DLINUX".to_string(), "-DX86_64".to_string()];
    args.extend(common.iter().cloned());
    args.push(inc(&dr.build.join("include")));
    args.push(inc(&s.join("clients/drcachesim/tracer")));
    let headers = syntax_check(
        &s.join("clients/drcachesim/tracer/syscall_pt_trace.cpp"),
        &args,
    );
    assert_drpttracer_headers_are_ours(&headers, "syscall_pt_trace.cpp");
    assert!(
        headers.iter().any(|h| h.ends_with("/drpttracer.h")),
        "syscall_pt_trace.cpp did not read drpttracer.h: {headers:?}"
    );
}
