//! libipt's own test corpus (`test/src/*.ptt`): `pttrace dump` against libipt's ptdump
//! built from the same tree (every listing byte for byte the same), and `pttrace decode`
//! against the ptxed expectations pttc writes (the same instructions, and the same errors
//! at the same trace offsets and IPs), but for the cases listed with why.
//!
//! Needs the tools `scripts/libipt.sh` builds (pttc, ptdump, from libipt's source, into
//! `~/.cache/pttrace/libipt` or `$PTTRACE_LIBIPT_DIR`); without them the test prints
//! `SKIP: ...` and passes. Each `.ptt` is assembled by pttc once per CPU it names (`; cpu`
//! lines), with the ptdump options it names (`; opt:ptdump`), its time columns
//! (`--time`, `--tcal`, `--time-delta`, ...) included.

use std::path::{Path, PathBuf};
use std::process::Command;

fn pttrace() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pttrace"))
}

/// The cache folder with pttc, ptdump and the corpus, or None after printing why.
fn libipt() -> Option<PathBuf> {
    let dir = match std::env::var_os("PTTRACE_LIBIPT_DIR") {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".cache/pttrace/libipt"),
            None => {
                println!("SKIP: HOME is not set (run scripts/libipt.sh)");
                return None;
            }
        },
    };
    let needed = [
        dir.join("stamp"),
        dir.join("build/bin/pttc"),
        dir.join("build/bin/ptdump"),
        dir.join("src/test/src"),
    ];
    if let Some(missing) = needed.iter().find(|p| !p.exists()) {
        println!(
            "SKIP: no libipt tools in {} ({} is missing) (run scripts/libipt.sh)",
            dir.display(),
            missing.display()
        );
        return None;
    }
    if Command::new("yasm").arg("--version").output().is_err() {
        println!("SKIP: yasm is missing (pttc assembles the corpus with it: apt-get install yasm)");
        return None;
    }
    Some(dir)
}

/// The values of the `; NAME ...` directive lines of a .ptt.
fn directives(ptt: &str, name: &str) -> Vec<String> {
    ptt.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix(';')?.trim_start();
            let value = rest.strip_prefix(name)?;
            value
                .starts_with([' ', '\t'])
                .then(|| value.trim().to_string())
        })
        .collect()
}

/// The case's ptdump options, every one of which `pttrace dump` has (a new one in the
/// corpus fails the test, to be added).
fn ptdump_options(opts: &[String]) -> Vec<String> {
    const FLAGS: [&str; 14] = [
        "--no-sync",
        "--no-offset",
        "--raw",
        "--lastip",
        "--exec-mode",
        "--no-pad",
        "--no-timing",
        "--no-cyc",
        "--time",
        "--tcal",
        "--time-delta",
        "--no-tcal",
        "--no-wall-clock",
        "--keep-tcal-on-ovf",
    ];
    const WITH_VALUE: [&str; 5] = [
        "--cpu",
        "--mtc-freq",
        "--nom-freq",
        "--cpuid-0x15.eax",
        "--cpuid-0x15.ebx",
    ];
    let words: Vec<&str> = opts.iter().flat_map(|o| o.split_whitespace()).collect();
    let mut kept = Vec::new();
    let mut k = 0;
    while k < words.len() {
        let w = words[k];
        if WITH_VALUE.contains(&w) && k + 1 < words.len() {
            kept.extend([w.to_string(), words[k + 1].to_string()]);
            k += 1;
        } else {
            assert!(
                FLAGS.contains(&w),
                "ptdump option {w} is new to pttrace dump"
            );
            kept.push(w.to_string());
        }
        k += 1;
    }
    kept
}

/// A .ptt assembled by pttc for one of its CPUs, in a folder of its own.
struct Case {
    stem: String,
    text: String,
    cpu: Option<String>,
    work: tempfile::TempDir,
    /// The files pttc wrote.
    names: Vec<String>,
}

/// Every .ptt of the corpus, assembled once per CPU it names.
fn cases(dir: &Path) -> (usize, Vec<Case>) {
    let pttc = dir.join("build/bin/pttc");
    let mut ptts: Vec<PathBuf> = std::fs::read_dir(dir.join("src/test/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ptt"))
        .collect();
    ptts.sort();
    assert!(ptts.len() > 200, "{} .ptt files", ptts.len());
    let mut out = Vec::new();
    for ptt in &ptts {
        let text = std::fs::read_to_string(ptt).unwrap();
        let stem = ptt.file_stem().unwrap().to_string_lossy().to_string();
        let mut cpus: Vec<Option<String>> =
            directives(&text, "cpu").into_iter().map(Some).collect();
        if cpus.is_empty() {
            cpus.push(None);
        }
        for cpu in cpus {
            let work = tempfile::tempdir().unwrap();
            std::fs::copy(ptt, work.path().join(format!("{stem}.ptt"))).unwrap();
            let mut args: Vec<String> = cpu
                .iter()
                .flat_map(|c| ["--cpu".to_string(), c.clone()])
                .collect();
            args.push(format!("{stem}.ptt"));
            let (ok, out_text) = run(&pttc, &args, work.path());
            assert!(ok, "pttc {args:?}: {out_text}");
            let names = std::fs::read_dir(work.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect();
            out.push(Case {
                stem: stem.clone(),
                text: text.clone(),
                cpu,
                work,
                names,
            });
        }
    }
    (ptts.len(), out)
}

fn run(cmd: &Path, args: &[String], cwd: &Path) -> (bool, String) {
    let o = Command::new(cmd)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn every_corpus_listing_is_ptdumps() {
    let Some(dir) = libipt() else { return };
    let ptdump = dir.join("build/bin/ptdump");
    let (files, all) = cases(&dir);
    let (mut cases, mut timed, mut differ) = (0usize, 0usize, Vec::new());
    for c in &all {
        // The traces of the cases with a ptdump expectation.
        if !c
            .names
            .iter()
            .any(|n| n.contains("ptdump") && n.ends_with(".exp"))
        {
            continue;
        }
        let opts = ptdump_options(&directives(&c.text, "opt:ptdump"));
        let time_columns = opts.iter().any(|o| o == "--time" || o == "--tcal");
        for pt in c.names.iter().filter(|n| n.ends_with(".pt")) {
            let mut args: Vec<String> = c
                .cpu
                .iter()
                .flat_map(|c| ["--cpu".to_string(), c.clone()])
                .collect();
            args.extend(opts.iter().cloned());
            args.push(pt.clone());
            let reference = Command::new(&ptdump)
                .args(&args)
                .current_dir(c.work.path())
                .output()
                .unwrap();
            let mut ours_args = vec!["dump".to_string(), "--keep-going".to_string()];
            ours_args.extend(args.iter().cloned());
            let ours = Command::new(pttrace())
                .args(&ours_args)
                .current_dir(c.work.path())
                .output()
                .unwrap();
            assert!(
                ours.status.success(),
                "{} {ours_args:?}: {}",
                c.stem,
                String::from_utf8_lossy(&ours.stderr)
            );
            cases += 1;
            timed += usize::from(time_columns);
            if reference.stdout != ours.stdout {
                differ.push(format!(
                    "{} {args:?}:\n--- ptdump\n{}--- pttrace dump\n{}",
                    c.stem,
                    String::from_utf8_lossy(&reference.stdout),
                    String::from_utf8_lossy(&ours.stdout)
                ));
            }
        }
    }
    println!(
        "{cases} ptdump cases of {files} .ptt files compared ({timed} with time columns); \
         {} differ",
        differ.len()
    );
    assert!(cases > 400, "{cases} cases");
    assert!(timed > 40, "{timed} cases with time columns");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// `decode`'s arguments for ptxed's options (None for a case ptxed runs `--quiet`);
/// ptxed's display options (`--event:*`, `--block:*`, `--stat`, decoder choice) change
/// nothing compared here.
fn decode_args(c: &Case, dir: &Path) -> Option<Vec<String>> {
    let org = c.text.lines().find_map(|l| {
        let v = l.trim().strip_prefix("org")?.trim();
        u64::from_str_radix(v.strip_prefix("0x")?, 16).ok()
    })?;
    let d = dir.display();
    let mut args = vec![
        "decode".to_string(),
        "--keep-going".into(),
        "--format".into(),
        "jsonl".into(),
        "--pt".into(),
        format!("{d}/{}.pt", c.stem),
        "--raw".into(),
        format!("{d}/{}.bin@{org:#x}", c.stem),
    ];
    let mut cpu = c.cpu.clone();
    let (mut eax, mut ebx) = (None, None);
    let mut filters: std::collections::BTreeMap<String, [String; 3]> = Default::default();
    let opts: Vec<String> = directives(&c.text, "opt:ptxed")
        .iter()
        .flat_map(|o| o.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect();
    let mut k = 0;
    while k < opts.len() {
        let (o, v) = (
            opts[k].as_str(),
            opts.get(k + 1).cloned().unwrap_or_default(),
        );
        match o {
            "--quiet" => return None,
            "--resync-on-error" => args.push(o.into()),
            "--event:iflags" => args.push("--iflags-events".into()),
            "--cpu" => cpu = Some(v),
            "--mtc-freq" | "--nom-freq" => args.extend([o.to_string(), v]),
            "--cpuid-0x15.eax" => eax = Some(v),
            "--cpuid-0x15.ebx" => ebx = Some(v),
            "--raw" => {
                // ptxed's FILE[:FROM]:BASE as ours FILE[:FROM]@BASE.
                let parts: Vec<&str> = v.split(':').collect();
                let raw = match parts[..] {
                    [f, from, base] => {
                        let from = u64::from_str_radix(from.trim_start_matches("0x"), 16).ok()?;
                        format!("{d}/{f}:{from}@{base}")
                    }
                    [f, base] => format!("{d}/{f}@{base}"),
                    _ => return None,
                };
                args.extend(["--raw".to_string(), raw]);
            }
            _ if o.starts_with("--filter:addr") => {
                let (n, field) = o["--filter:addr".len()..].split_once('_')?;
                let f = filters.entry(n.to_string()).or_default();
                let at = ["cfg", "a", "b"].iter().position(|x| *x == field)?;
                f[at] = v;
            }
            _ => {
                k += 1;
                continue;
            }
        }
        k += if matches!(o, "--resync-on-error" | "--event:iflags") {
            1
        } else {
            2
        };
    }
    if let (Some(a), Some(b)) = (eax, ebx) {
        args.extend(["--cpuid-15".to_string(), format!("{a},{b}")]);
    }
    for (n, [cfg, a, b]) in filters {
        let cfg = match cfg.as_str() {
            "1" => "filter",
            "2" => "stop",
            _ => "off",
        };
        args.extend(["--filter".to_string(), format!("{n}:{cfg},{a},{b}")]);
    }
    if let Some(c) = cpu {
        args.extend(["--cpu".to_string(), c]);
    }
    Some(args)
}

/// An instruction (its address), or a change of the interrupt flag (ptxed's iflags event,
/// `--event:iflags`; `decode --iflags-events`), in the order decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Insn(u64),
    Interrupts(bool),
}

/// Instructions, iflags events and errors (trace offset, IP) of a ptxed expectation.
fn ptxed_flow(exp: &str) -> (Vec<Step>, Vec<(u64, u64)>) {
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let mut insns = Vec::new();
    let mut errors = Vec::new();
    for l in exp.lines().map(str::trim) {
        // (`? ` marks an instruction executed speculatively: TSX.)
        let insn = l.strip_prefix("? ").unwrap_or(l);
        if insn.len() == 16 {
            if let Some(pc) = hex(insn) {
                insns.push(Step::Insn(pc));
                continue;
            }
        }
        if let Some(what) = l.strip_prefix("[interrupts ") {
            insns.push(Step::Interrupts(what.starts_with("enabled")));
            continue;
        }
        let Some(rest) = l.strip_prefix('[') else {
            continue;
        };
        let Some((off, rest)) = rest.split_once(", ") else {
            continue;
        };
        let Some((ip, rest)) = rest.split_once(": ") else {
            continue;
        };
        if rest.starts_with("error:") || rest.starts_with("resync error:") {
            if let (Some(off), Some(ip)) = (hex(off), hex(ip)) {
                errors.push((off, ip));
            }
        }
    }
    (insns, errors)
}

/// Instructions, iflags records and gaps (trace offset, IP or 0) of `decode --format
/// jsonl` output.
fn decoded_flow(jsonl: &str) -> (Vec<Step>, Vec<(u64, u64)>) {
    let hex = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    let mut insns = Vec::new();
    let mut gaps = Vec::new();
    for l in jsonl.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        match v["type"].as_str() {
            Some("insn") => insns.extend(hex(&v["pc"]).map(Step::Insn)),
            Some("iflags") => insns.push(Step::Interrupts(v["enabled"] == true)),
            Some("gap") if v["kind"] != "overflow" => gaps.push((
                v["pt_offset"].as_u64().unwrap_or(0),
                hex(&v["ip"]).unwrap_or(0),
            )),
            _ => {}
        }
    }
    (insns, gaps)
}

#[test]
fn every_corpus_decode_is_ptxeds() {
    let Some(dir) = libipt() else { return };
    let (files, all) = cases(&dir);
    let (mut compared, mut differ) = (0usize, 0usize);
    let mut report = Vec::new();
    for c in &all {
        let exps: Vec<&String> = c
            .names
            .iter()
            .filter(|n| n.starts_with(&format!("{}-ptxed", c.stem)) && n.ends_with(".exp"))
            .collect();
        if exps.is_empty() {
            continue;
        }
        let Some(args) = decode_args(c, c.work.path()) else {
            continue;
        };
        let o = Command::new(pttrace())
            .args(&args)
            .current_dir(c.work.path())
            .output()
            .unwrap();
        let got = decoded_flow(&String::from_utf8_lossy(&o.stdout));
        for exp in exps {
            let want = ptxed_flow(&std::fs::read_to_string(c.work.path().join(exp)).unwrap());
            compared += 1;
            if got != want {
                differ += 1;
                report.push(format!(
                    "{} {args:?}:\n  ptxed: {:x?}\n  ours:  {:x?}\n  {}",
                    c.stem,
                    want,
                    got,
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
    }
    println!(
        "{compared} ptxed cases of {files} .ptt files compared: instructions, iflags events, \
         errors at their trace offsets and IPs; {differ} differ"
    );
    assert!(compared > 400, "{compared} cases");
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The corpus cases where the fast decoder follows what libipt 2.1.2 cannot (README,
/// "Packets and instructions newer than libipt 2.1.2"): the decoders differ on purpose.
const BEYOND_LIBIPT_2_1_2: [&str; 7] = [
    "int-eretu-cpl_0",
    "int-eretu",
    "ptet-int-eretu",
    "ptet-int-int-erets-eretu",
    "tip-jmpabs",
    "tip_pgd-jmpabs",
    "trig-fup",
];

/// Corpus cases of what real hardware writes that the fast decoder decodes itself: PTW,
/// PIP and VMCS outside a PSB+, MODE.Exec while tracing, MNT, STOP, an OVF with timing, an
/// EXSTOP with IP cut off by an OVF, a TIP.PGD without IP after MOV CR3, a PSB+ FUP
/// before a TIP.PGE on a CPU with erratum BDM70, OVFs on CPUs with errata SKD010, APL11
/// or APL12 (libipt's recoveries), an asynchronous disable at a VM entry on a CPU with
/// erratum SKD022, event trace of every kind libipt 2.1.2 knows, an OVF that ends the
/// PSB+ of the synchronization, a deferred TIP.
const FAST_PATTERNS: [&str; 57] = [
    "ptw",
    "ptw-fup",
    "tip_pge-ptw-tip_pgd",
    "tip_pge-ptw-fup-tip_pgd",
    "psb-fup-ptw-trig",
    "pip-far_call",
    "vmcs-far_call",
    "pip_mov_cr3-pip_mov_cr3",
    "pip-vmcs-tip_pgd",
    "fup-pip-vmcs-tip",
    "fup-pip-vmcs-tip_pgd",
    "psb-pip-psb",
    "psb-pip-tip_pge",
    "tip_pgd-pip-tip_pge",
    "psb-vmcs",
    "mode_exec-tip",
    "ptet-mode_exec-spurious",
    "ovf-mnt-fup",
    "ovf-mnt-tip_pge",
    "psb-mnt-psbend",
    "psb-mnt-fup-psbend",
    "psb-stop",
    "tip_pgd-stop",
    "fup-tip_pgd-stop",
    "tip_pgd-psb-stop",
    "ovf-timing-fup",
    "mwait-pwre-exstop_ip-ovf",
    "tip_pgd_noip-mov_cr3",
    "bdm70-psb_fup-tip_pge",
    "bdm70-tip_pgd-psb_fup-tip_pge",
    "apl11",
    "skd010-tip_pgd",
    "skd010-tip",
    "skd010-psb",
    "skd010-mode_tsx-fup",
    "apl12-psb",
    "apl12-tip_pge",
    "psb-ovf-fup",
    "psb-ovf-tip_pge",
    "call_indirect_deferred-ret_compressed",
    "skd022",
    "ptet-int-iret",
    "ptet-int-iret-cpl_0",
    "ptet-int-iret-cpl_3",
    "ptet-smi-rsm",
    "ptet-init-sipi",
    "ptet-uint-uiret",
    "ptet-vmexit-vmentry",
    "ptet-vmexit-vmentry-root",
    "ptet-vmexit-vmentry-nonroot",
    "skl014-call",
    "skl014-jmp",
    "skl014-jmp-jmp",
    "bdm64-tnt-cond-xabort",
    "bdm64-tnt-ind_call-xabort",
    "skz84",
    "skd007",
];

/// `decode --decoder check` on every corpus case ptxed decodes (with ptxed's options but
/// `--resync-on-error`, which `check` refuses): the fast decoder's records are libipt's,
/// record for record (events, timestamps and all), but where libipt 2.1.2 cannot follow;
/// and the real-hardware patterns above stay on the fast path.
#[test]
fn every_corpus_case_decodes_alike_with_both_decoders() {
    let Some(dir) = libipt() else { return };
    let (_, all) = cases(&dir);
    let (mut checked, mut differ, mut fast) = (0usize, Vec::new(), Vec::new());
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for c in &all {
        let Some(mut args) = decode_args(c, c.work.path()) else {
            continue;
        };
        if args.iter().any(|a| a == "--resync-on-error") {
            continue;
        }
        let k = args.iter().position(|a| a == "--format").unwrap();
        args.splice(k..k + 2, ["--decoder".to_string(), "check".into()]);
        let o = Command::new(pttrace())
            .args(&args)
            .current_dir(c.work.path())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        checked += 1;
        let Some(decoders) = out
            .lines()
            .find(|l| l.starts_with("check: the fast decoder and libipt agree"))
            .and_then(|l| l.split_once("(decoded by ")?.1.strip_suffix(')'))
        else {
            differ.push(format!(
                "{}: {out}{}",
                c.stem,
                String::from_utf8_lossy(&o.stderr)
            ));
            continue;
        };
        let fast_only = decoders.starts_with("fast: ") && !decoders.contains("libipt");
        if fast_only {
            fast.push(c.stem.clone());
        }
        *by.entry(if fast_only {
            "fast".into()
        } else {
            decoders.to_string()
        })
        .or_default() += 1;
    }
    println!("{checked} corpus cases checked; decoded by:");
    for (who, n) in &by {
        println!("  {n:4} {who}");
    }
    let differ_stems: Vec<&str> = differ
        .iter()
        .map(|d| d.split(':').next().unwrap())
        .collect();
    assert_eq!(differ_stems, BEYOND_LIBIPT_2_1_2, "{}", differ.join("\n"));
    for stem in FAST_PATTERNS {
        assert!(
            fast.iter().any(|f| f == stem),
            "{stem} is not decoded by the fast decoder alone"
        );
    }
    assert!(checked > 200, "{checked} cases");
}
