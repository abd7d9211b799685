//! Helpers shared by the integration tests: locating the preload library, the QEMU plugin
//! and the `pttrace` binary, compiling the C test programs, running them traced, and
//! reading every file of a trace directory with the library's own reader.
#![allow(dead_code)]

use drpttracer::format::ptt::{self, FileKind, RecordType, Tail, Window};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A command's stdout then stderr, as text (for assertions and their messages).
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `qemu-x86_64` is on the PATH; prints the SKIP line when it is not.
pub fn qemu_available() -> bool {
    let found = in_path("qemu-x86_64").is_some();
    if !found {
        println!("SKIP: qemu-x86_64 is not installed (apt-get install qemu-user)");
    }
    found
}

/// Where `name` is in PATH.
pub fn in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|f| f.is_file())
}

/// Whether `tool --version` runs and succeeds.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The QEMU plugin of this build (target/<profile>/libpttrace_qemu.so, beside pttrace).
pub fn plugin() -> PathBuf {
    built_beside_pttrace("libpttrace_qemu.so", &["-p", "pttrace-qemu"])
}

/// libdrpttracer.so of this build (target/<profile>/, beside pttrace).
pub fn lib_path() -> PathBuf {
    built_beside_pttrace("libdrpttracer.so", &["-p", "drpttracer", "--lib"])
}

/// `file` in pttrace's folder, built with `cargo build ARGS` (same profile) when a plain
/// `cargo test` has not built it (another workspace member: `cargo test -p pttrace-cli`
/// alone builds only this package's dependencies).
fn built_beside_pttrace(file: &str, args: &[&str]) -> PathBuf {
    let dir = pttrace().parent().unwrap().to_path_buf();
    let so = dir.join(file);
    if !so.is_file() {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let mut c = Command::new(option_env!("CARGO").unwrap_or("cargo"));
        c.arg("build")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if release {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "cargo build {args:?}");
    }
    assert!(so.is_file(), "{} missing", so.display());
    so
}

/// `pttrace run --mode user --window thread --backend qemu` with this build's plugin, the
/// options `extra`, into `out`, of `cmd`, run to its end.
pub fn run_under_qemu(out: &Path, extra: &[&str], cmd: &[&OsStr]) -> Output {
    qemu_run_command(out, extra, cmd)
        .output()
        .expect("run pttrace")
}

/// The command [`run_under_qemu`] runs (to spawn it instead).
pub fn qemu_run_command(out: &Path, extra: &[&str], cmd: &[&OsStr]) -> Command {
    let mut c = Command::new(pttrace());
    c.args([
        "run",
        "--mode",
        "user",
        "--window",
        "thread",
        "--backend",
        "qemu",
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

pub fn pttrace() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pttrace"))
}

/// `pttrace view TRACE --out OUT EXTRA...`, which must succeed; its stdout.
pub fn view_into(trace: &Path, out: &Path, extra: &[&str]) -> String {
    let o = Command::new(pttrace())
        .arg("view")
        .arg(trace)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "pttrace view {} failed: {}",
        extra.join(" "),
        text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `pttrace COMMAND ARGS...`, which must succeed; its stdout.
pub fn pttrace_ok(command: &str, args: &[&OsStr]) -> String {
    let o = Command::new(pttrace())
        .arg(command)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "pttrace {command} failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `pttrace report DIR`, which must succeed; its stdout.
pub fn report(dir: &Path) -> String {
    pttrace_ok("report", &[dir.as_os_str()])
}

/// Compiles tests/progs/<name>.c into `dir` with the system C compiler.
pub fn compile(name: &str, dir: &Path) -> PathBuf {
    compile_with(name, dir, name, &[])
}

/// Compiles tests/progs/<name>.c into `dir/<out_name>` with extra compiler flags.
pub fn compile_with(name: &str, dir: &Path, out_name: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/progs")
        .join(format!("{name}.c"));
    let out = dir.join(out_name);
    let st = Command::new("cc")
        .args(["-O1", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed for {}", src.display());
    out
}

/// `tests/progs/calls.c` built as the call-structure tests read it (no inlining, frame
/// pointers, fixed addresses) into `dir/calls`.
pub fn compile_calls(dir: &Path) -> PathBuf {
    compile_with(
        "calls",
        dir,
        "calls",
        &["-O0", "-fno-inline", "-fno-omit-frame-pointer", "-no-pie"],
    )
}

/// tests/progs/many_calls.c (over 100 M instructions, 2.87 M calls, nothing inlined)
/// built into `dir` and traced whole by the QEMU backend into `dir/out`; the trace
/// directory.
#[allow(dead_code)]
pub fn trace_many_calls(dir: &Path) -> PathBuf {
    let prog = compile_with(
        "many_calls",
        dir,
        "many_calls",
        &["-fno-inline", "-fno-omit-frame-pointer"],
    );
    let trace = dir.join("out");
    let o = run_under_qemu(&trace, &[], &[prog.as_os_str()]);
    assert!(o.status.success(), "pttrace run: {}", text(&o));
    trace
}

/// The address of symbol `name` in the ELF file `exe`.
pub fn symbol(exe: &Path, name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    obj.symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("symbol {name} not in {}", exe.display()))
        .address()
}

/// Runs `prog args` with the shim preloaded, writing into `out`.
pub fn run_traced(out: &Path, prog: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_PRELOAD", lib_path())
        .env("PTTRACER_OUT", out);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run traced program")
}

/// One thread file, fully decoded.
#[derive(Debug)]
pub struct ThreadFile {
    pub name: String,
    pub header: ptt::ThreadHeader,
    pub windows: Vec<Window>,
    pub end: Option<(u32, u64, u64)>,
    pub dropped: u64,
    pub tail: Tail,
}

/// One process info file, decoded.
#[derive(Debug)]
pub struct InfoFile {
    pub name: String,
    pub process: ptt::ProcessRecord,
    pub cmdline: Vec<String>,
    pub exe: String,
    pub maps: String,
    pub vdso: Vec<u8>,
    pub metadata: Vec<u8>,
    pub end: Option<(u32, i32)>,
    pub tail: Tail,
}

#[derive(Debug, Default)]
pub struct TraceDir {
    pub infos: Vec<InfoFile>,
    pub threads: Vec<ThreadFile>,
}

impl TraceDir {
    pub fn threads_of(&self, pid: i32, nonce: u64) -> Vec<&ThreadFile> {
        self.threads
            .iter()
            .filter(|t| t.header.pid == pid && t.header.nonce == nonce)
            .collect()
    }
    pub fn count_nr(&self, nr: u64) -> usize {
        self.threads
            .iter()
            .flat_map(|t| &t.windows)
            .filter(|w| w.nr == nr)
            .count()
    }
}

/// Reads every `.info` and `.ptt` file in `dir`, panicking on anything malformed.
pub fn read_dir(dir: &Path) -> TraceDir {
    let mut td = TraceDir::default();
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for p in paths {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.ends_with(".info") || name.ends_with(".ptt")) {
            continue;
        }
        let data = std::fs::read(&p).unwrap();
        let parsed = ptt::parse(&name, &data).unwrap_or_else(|e| panic!("{e}"));
        match parsed.kind {
            FileKind::Thread => {
                let mut header = None;
                let mut windows = vec![];
                let mut end = None;
                let mut dropped = 0;
                for f in &parsed.frames {
                    match RecordType::from_raw(f.ty) {
                        Some(RecordType::ThreadHeader) => {
                            header = Some(ptt::decode_thread_header(f.payload).unwrap())
                        }
                        Some(RecordType::Window) => {
                            windows.push(ptt::decode_window(f.payload).unwrap().window)
                        }
                        Some(RecordType::End) => end = ptt::decode_end(f.payload),
                        Some(RecordType::Dropped) => {
                            dropped += ptt::decode_dropped(f.payload).unwrap().0
                        }
                        other => panic!("{name}: unexpected record {other:?} in a thread file"),
                    }
                }
                td.threads.push(ThreadFile {
                    header: header.unwrap_or_else(|| panic!("{name}: no ThreadHeader")),
                    name,
                    windows,
                    end,
                    dropped,
                    tail: parsed.tail,
                });
            }
            FileKind::ProcessInfo => {
                let mut info = InfoFile {
                    name: name.clone(),
                    process: ptt::ProcessRecord {
                        pid: 0,
                        ppid: 0,
                        nonce: 0,
                        start_tsc: 0,
                        start_monotonic_ns: 0,
                        mode: 0,
                        window: 0,
                        backend: 0,
                        pt_present: false,
                        pt_absent_reason: String::new(),
                    },
                    cmdline: vec![],
                    exe: String::new(),
                    maps: String::new(),
                    vdso: vec![],
                    metadata: vec![],
                    end: None,
                    tail: parsed.tail.clone(),
                };
                let mut have_process = false;
                for f in &parsed.frames {
                    match RecordType::from_raw(f.ty) {
                        Some(RecordType::Process) => {
                            info.process = ptt::decode_process(f.payload).unwrap();
                            have_process = true;
                        }
                        Some(RecordType::Cmdline) => {
                            info.cmdline = f
                                .payload
                                .split(|&b| b == 0)
                                .filter(|s| !s.is_empty())
                                .map(|s| String::from_utf8_lossy(s).into_owned())
                                .collect()
                        }
                        Some(RecordType::Exe) => {
                            info.exe = String::from_utf8_lossy(f.payload).into_owned()
                        }
                        Some(RecordType::Maps) => {
                            info.maps = String::from_utf8_lossy(f.payload).into_owned()
                        }
                        Some(RecordType::Vdso) => {
                            info.vdso = ptt::decode_vdso(f.payload).unwrap().1.to_vec()
                        }
                        Some(RecordType::Metadata) => info.metadata = f.payload.to_vec(),
                        Some(RecordType::ProcessEnd) => {
                            info.end = ptt::decode_process_end(f.payload)
                        }
                        _ => {}
                    }
                }
                assert!(have_process, "{name}: no Process record");
                td.infos.push(info);
            }
        }
    }
    td
}

/// DynamoRIO's analyzer launcher (`scripts/dynamorio.sh`'s build, or
/// `$PTTRACE_DYNAMORIO_DIR`), or None after printing why not.
pub fn dynamorio_launcher() -> Option<PathBuf> {
    let dir = match std::env::var_os("PTTRACE_DYNAMORIO_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/pttrace/dynamorio"),
    };
    let l = dir.join("build/clients/bin64/drmemtrace_launcher");
    if l.is_file() {
        Some(l)
    } else {
        println!(
            "SKIP: DynamoRIO's drmemtrace_launcher is not built in {} (run scripts/dynamorio.sh)",
            dir.display()
        );
        None
    }
}

/// The output of DynamoRIO's analyzer `tool` on the drmemtrace directory `dir` (it must
/// succeed).
pub fn analyze(launcher: &Path, dir: &Path, tool: &str) -> String {
    let o = Command::new(launcher)
        .arg("-indir")
        .arg(dir)
        .args(["-tool", tool])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{tool}: {t}");
    t
}
