//! `decode --format drmemtrace`, read by DynamoRIO's own analyzers (`drmemtrace_launcher`
//! from the build `scripts/dynamorio.sh` makes; without it each test prints `SKIP`): real
//! programs traced under QEMU pass the invariant checker, `basic_counts` counts exactly
//! the instructions pttrace decodes, the syscalls, one kernel event and transfer per
//! signal handled, one window per loss, and `view` shows the decoder's instructions; also
//! an assembly loop, data-dependent branches and indirect calls, 8 threads, JIT code
//! (rewritten in place) and a fork + exec chain.

mod shim_util;

use std::path::Path;
use std::process::Command;

use shim_util::{analyze, dynamorio_launcher as launcher, pttrace, qemu_available, text};

/// The number before `label` on a line of basic_counts' totals.
fn count(out: &str, label: &str) -> u64 {
    out.lines()
        .find(|l| {
            l.trim_start()
                .split_once(' ')
                .is_some_and(|(_, r)| r == label)
        })
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{label:?} not in:\n{out}"))
}

/// The pcs of the instruction records in `decode --format jsonl`'s output, in order.
fn insn_pcs(jsonl: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(jsonl)
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["type"] == "insn").then(|| {
                u64::from_str_radix(v["pc"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
            })
        })
        .collect()
}

/// Traces `prog args` under QEMU, writes its drmemtrace, and checks it with DynamoRIO:
/// returns (basic_counts' output, pttrace's instruction total, view's output).
fn check(l: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> (String, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile(name, dir.path());
    let one_thread = name != "threads" && !args.contains(&"threads");
    check_program(l, &prog, one_thread, args, env)
}

/// [`check`] of a program given by path; `one_thread`: its first instructions are
/// compared with DynamoRIO's `view`.
fn check_program(
    l: &Path,
    prog: &Path,
    one_thread: bool,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--quiet", "--backend", "qemu", "--out"])
        .arg(&out)
        .arg("--")
        .arg(prog)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let dm = dir.path().join("dm");
    let o = Command::new(pttrace())
        .args(["decode", "--keep-going", "--format", "drmemtrace", "--out"])
        .arg(&dm)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let checked = analyze(l, &dm, "invariant_checker");
    assert!(
        checked.contains("Trace invariant checks passed"),
        "{checked}"
    );
    let summary = Command::new(pttrace())
        .args(["decode", "--keep-going", "--format", "summary"])
        .arg(&out)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&summary.stdout).into_owned();
    let total = summary
        .lines()
        .find_map(|l| l.strip_prefix("total: "))
        .and_then(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let k = w.iter().position(|x| x.starts_with("instructions"))?;
            w.get(k - 1)?.parse().ok()
        })
        .unwrap_or_else(|| panic!("{summary}"));
    // The first instructions DynamoRIO shows are the decoder's first.
    let view = analyze(l, &dm, "view");
    let jsonl = Command::new(pttrace())
        .args(["decode", "--format", "jsonl"])
        .arg(&out)
        .output()
        .unwrap();
    let ours: Vec<u64> = insn_pcs(&jsonl.stdout).into_iter().take(20).collect();
    let theirs: Vec<u64> = view
        .lines()
        .filter_map(|l| {
            let at = l.split(" @ ").nth(1)?;
            u64::from_str_radix(at.split_whitespace().next()?.trim_start_matches("0x"), 16).ok()
        })
        .take(20)
        .collect();
    if one_thread {
        // (One thread: the first instructions in the file are the first decoded.)
        assert_eq!(theirs, ours);
    }
    (analyze(l, &dm, "basic_counts"), total, view)
}

/// One test, the programs one after another (under QEMU each takes two cores' worth).
#[test]
fn dynamorio_reads_pttrace_traces() {
    let Some(l) = launcher() else { return };
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    shim_util::plugin();

    // Syscalls: each followed by its number.
    let (counts, total, _) = check(&l, "names", &[], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    assert!(
        count(&counts, "total system call number markers") > 20,
        "{counts}"
    );
    assert_eq!(
        count(&counts, "total kernel transfer markers"),
        0,
        "{counts}"
    );

    // SIGALRM every 200 µs into a loop: each handled signal an event and its sigreturn a
    // transfer back.
    let (counts, total, _) = check(&l, "qemu_cases", &["alarm", "30"], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    let xfers = count(&counts, "total kernel transfer markers");
    assert!(xfers >= 60 && xfers % 2 == 0, "{counts}");
    assert!(
        !counts.contains("Total windows"),
        "no loss, no window: {counts}"
    );

    // A handler leaving by siglongjmp, traced without signal frames: the QEMU backend
    // writes OVF there, each a new window for DynamoRIO.
    let (counts, total, _) = check(&l, "sigjmp_loop", &[], &[("PTTRACE_QEMU_SIGFRAMES", "off")]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    let windows: u64 = counts
        .lines()
        .find_map(|l| l.trim().strip_prefix("Total windows: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{counts}"));
    assert!(windows > 1, "{counts}");

    // 17 threads.
    let (counts, total, _) = check(&l, "threads", &[], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    assert_eq!(count(&counts, "total threads"), 17, "{counts}");

    // An assembly loop; data-dependent branches, indirect calls through a table,
    // recursion and a libc callback; 8 threads; code rewritten at the same address. The
    // checker follows every conditional branch's taken/untaken marker and every indirect
    // branch's target marker to the next instruction.
    for args in [&["loop", "1000"][..], &["mix"], &["threads"], &["jit"]] {
        let (counts, total, _) = check(&l, "qemu_cases", args, &[]);
        assert_eq!(
            count(&counts, "total (fetched) instructions"),
            total,
            "{args:?}"
        );
        if args == ["threads"] {
            assert_eq!(count(&counts, "total threads"), 9, "{counts}");
        }
    }

    // A fork + exec chain: a shell runs a pipeline and a program (posix_spawn's failure
    // reporting cannot be traced here: QEMU runs vfork as fork), every image checked.
    let (counts, total, _) = check_program(
        &l,
        Path::new("/bin/sh"),
        false,
        &["-c", "echo a | cat; /bin/echo b"],
        &[],
    );
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
    assert!(count(&counts, "total threads") >= 4, "{counts}");

    // JIT code named in a perf map: instructions written at run time, their encodings
    // from the trace's code records.
    let (counts, total, _) = check(&l, "minijit", &[], &[]);
    assert_eq!(count(&counts, "total (fetched) instructions"), total);
}

/// The records of a drmemtrace `.zip` (its `chunk.*` members in order): (type, size,
/// addr) of each 12-byte entry.
fn entries(zip_path: &Path) -> Vec<(u16, u16, u64)> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::fs::File::open(zip_path).unwrap()).unwrap();
    let mut names: Vec<String> = z.file_names().map(str::to_string).collect();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        let mut bytes = Vec::new();
        z.by_name(&n).unwrap().read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() % 12, 0, "{n}");
        out.extend(bytes.chunks(12).map(|e| {
            (
                u16::from_le_bytes([e[0], e[1]]),
                u16::from_le_bytes([e[2], e[3]]),
                u64::from_le_bytes(e[4..12].try_into().unwrap()),
            )
        }));
    }
    out
}

/// The one `.zip` `decode --format drmemtrace` wrote into `dir`.
fn only_zip(dir: &Path) -> std::path::PathBuf {
    let zips: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(zips.len(), 1, "{zips:?}");
    zips[0].clone()
}

/// Instruction records (DynamoRIO's trace types 10-16 and the taken/untaken jumps).
fn is_instruction(ty: u16) -> bool {
    (10..=16).contains(&ty) || ty == 48 || ty == 49
}

/// An input that is not a trace directory (a single thread file given with `--ptt`)
/// becomes one thread's drmemtrace: its thread and process ids from the file, exactly the
/// instructions `decode --format jsonl` gives, in order, and no syscall numbers (such an
/// input does not say them) nor the file-type bit that promises them.
#[test]
fn a_single_input_becomes_one_threads_drmemtrace() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    let prog = shim_util::compile("names", dir.path());
    let trace = dir.path().join("trace");
    let o = Command::new(pttrace())
        .args(["run", "--quiet", "--backend", "qemu", "--out"])
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let file = std::fs::read_dir(&trace)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "ptt"))
        .unwrap();
    // <pid>-<nonce>-<tid>.ptt
    let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
    let ids: Vec<&str> = stem.split('-').collect();
    let (pid, tid): (u64, u64) = (ids[0].parse().unwrap(), ids[2].parse().unwrap());
    let o = Command::new(pttrace())
        .args(["decode", "--format", "jsonl", "--ptt"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let pcs = insn_pcs(&o.stdout);
    assert!(pcs.len() > 10_000, "{}", pcs.len());
    let dm = dir.path().join("dm");
    let o = Command::new(pttrace())
        .args(["decode", "--format", "drmemtrace", "--out"])
        .arg(&dm)
        .arg("--ptt")
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let zip = only_zip(&dm);
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with(&format!(
            "{}: {} instructions\n",
            zip.display(),
            pcs.len()
        )),
        "{}",
        text(&o)
    );
    let e = entries(&zip);
    let got: Vec<u64> = e
        .iter()
        .filter(|r| is_instruction(r.0))
        .map(|r| r.2)
        .collect();
    assert_eq!(got, pcs);
    assert_eq!(e.iter().find(|r| r.0 == 22).map(|r| r.2), Some(tid));
    assert_eq!(e.iter().find(|r| r.0 == 24).map(|r| r.2), Some(pid));
    // Markers (type 28) carry their kind in the size field: 9 file type, 25 syscall.
    let filetype = e.iter().find(|r| r.0 == 28 && r.1 == 9).unwrap().2;
    assert_eq!(filetype & 0x400, 0, "{filetype:#x}");
    assert_eq!(filetype & 0x240, 0x240, "{filetype:#x}");
    assert!(!e.iter().any(|r| r.0 == 28 && r.1 == 25));
}

/// Intel PT recorded on real hardware (DynamoRIO's own drpt2trace test: `hello` traced by
/// `perf` on a Skylake-SP, with perf's sideband), decoded into drmemtrace as DynamoRIO's
/// test expects it decoded: its 8 instructions in order, which DynamoRIO's `view` shows
/// with the disassembly of its template, its invariant checker accepts, and whose thread
/// is the one the sideband names; also with the ELF file given instead of the sideband.
#[test]
fn real_hardware_pt_becomes_drmemtrace_dynamorio_reads() {
    let Some(l) = launcher() else { return };
    // The launcher is in <dynamorio>/build/clients/bin64; DynamoRIO's sources in <dynamorio>/src.
    let data = l
        .ancestors()
        .nth(4)
        .unwrap()
        .join("src/clients/drcachesim/drpt2trace/test_simple.raw");
    if !data.join("pt.bin").is_file() {
        println!("SKIP: {} is missing", data.join("pt.bin").display());
        return;
    }
    let expected = [
        (0x401000u64, "mov    $0x00000001, %eax"),
        (0x401005, "mov    $0x00000001, %edi"),
        (0x40100a, "mov    $0x0000000000402000, %rsi"),
        (0x401014, "mov    $0x0000000e, %edx"),
        (0x401019, "syscall"),
        (0x40101b, "mov    $0x0000003c, %eax"),
        (0x401020, "mov    $0x00000000, %edi"),
        (0x401025, "syscall"),
    ];
    let common = [
        "--cpu",
        "6/85/4",
        "--mtc-freq",
        "3",
        "--nom-freq",
        "37",
        "--cpuid-15",
        "2,308",
        "--format",
        "drmemtrace",
    ];
    let sb = |n: &str| data.join(n).display().to_string();
    let sideband_args = vec![
        "--sideband".to_string(),
        sb("primary.sideband.pevent"),
        "--sideband".to_string(),
        sb("secondary.sideband.pevent"),
        "--sample-type".to_string(),
        "0x10086".to_string(),
        "--time-conv".to_string(),
        "31,581029125,18444502336406842448".to_string(),
        "--sysroot".to_string(),
        data.display().to_string(),
    ];
    let elf_args = vec!["--image".to_string(), sb("hello")];
    for (how, extra, tid) in [
        ("sideband", sideband_args, 223_991u64),
        ("ELF", elf_args, 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let dm = dir.path().join("dm");
        let o = Command::new(pttrace())
            .arg("decode")
            .arg("--pt")
            .arg(data.join("pt.bin"))
            .args(common)
            .args(&extra)
            .arg("--out")
            .arg(&dm)
            .output()
            .unwrap();
        assert!(o.status.success(), "{how}: {}", text(&o));
        let e = entries(&only_zip(&dm));
        let pcs: Vec<u64> = e
            .iter()
            .filter(|r| is_instruction(r.0))
            .map(|r| r.2)
            .collect();
        assert_eq!(
            pcs,
            expected.iter().map(|x| x.0).collect::<Vec<_>>(),
            "{how}"
        );
        assert_eq!(
            e.iter().find(|r| r.0 == 22).map(|r| r.2),
            Some(tid),
            "{how}"
        );
        let checked = analyze(&l, &dm, "invariant_checker");
        assert!(
            checked.contains("Trace invariant checks passed"),
            "{how}: {checked}"
        );
        let view = analyze(&l, &dm, "view");
        let shown: Vec<(u64, String)> = view
            .lines()
            .filter(|l| l.contains(" ifetch "))
            .map(|l| {
                let at = l.split(" @ ").nth(1).unwrap();
                let pc = u64::from_str_radix(
                    at.split_whitespace()
                        .next()
                        .unwrap()
                        .trim_start_matches("0x"),
                    16,
                )
                .unwrap();
                // The disassembly follows the encoding's hex bytes.
                let dis = at
                    .split_whitespace()
                    .skip(1)
                    .skip_while(|w| w.len() == 2 && u8::from_str_radix(w, 16).is_ok())
                    .collect::<Vec<_>>()
                    .join(" ");
                (pc, dis)
            })
            .collect();
        let want: Vec<(u64, String)> = expected
            .iter()
            .map(|(pc, d)| (*pc, d.split_whitespace().collect::<Vec<_>>().join(" ")))
            .collect();
        assert_eq!(shown, want, "{how}: {view}");
    }
}
