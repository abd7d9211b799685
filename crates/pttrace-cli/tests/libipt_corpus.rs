//! libipt's own test corpus (`test/src/*.ptt`) through `pttrace dump`, against libipt's
//! ptdump built from the same tree: every listing byte for byte the same.
//!
//! Needs the tools `scripts/libipt.sh` builds (pttc, ptdump, from libipt's source, into
//! `~/.cache/pttrace/libipt` or `$PTTRACE_LIBIPT_DIR`); without them the test prints
//! `SKIP: ...` and passes. Each `.ptt` is assembled by pttc once per CPU it names (`; cpu`
//! lines), with the ptdump options it names (`; opt:ptdump`). ptdump's time-tracking
//! options (`--time`, `--tcal`, `--lastip`, `--exec-mode`, ...) add columns that `pttrace
//! dump` does not have: both listings are made without them, and the test says how many
//! cases that concerns.

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

/// ptdump's options that `pttrace dump` has too, and whether any were left out.
fn shared_options(opts: &[String]) -> (Vec<String>, bool) {
    const SHARED: [&str; 3] = ["--no-sync", "--no-offset", "--raw"];
    const WITH_VALUE: [&str; 4] = [
        "--mtc-freq",
        "--nom-freq",
        "--cpuid-0x15.eax",
        "--cpuid-0x15.ebx",
    ];
    let words: Vec<&str> = opts.iter().flat_map(|o| o.split_whitespace()).collect();
    let (mut kept, mut dropped) = (Vec::new(), false);
    let mut k = 0;
    while k < words.len() {
        let w = words[k];
        if SHARED.contains(&w) {
            kept.push(w.to_string());
        } else if WITH_VALUE.contains(&w) {
            // Time calibration: only the tracking columns use it.
            k += 1;
        } else {
            dropped = true;
        }
        k += 1;
    }
    (kept, dropped)
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
    let pttc = dir.join("build/bin/pttc");
    let ptdump = dir.join("build/bin/ptdump");
    let mut ptts: Vec<PathBuf> = std::fs::read_dir(dir.join("src/test/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ptt"))
        .collect();
    ptts.sort();
    assert!(ptts.len() > 200, "{} .ptt files", ptts.len());
    let (mut cases, mut without_tracking, mut differ) = (0usize, 0usize, Vec::new());
    for ptt in &ptts {
        let text = std::fs::read_to_string(ptt).unwrap();
        let stem = ptt.file_stem().unwrap().to_string_lossy().to_string();
        let mut cpus: Vec<Option<String>> =
            directives(&text, "cpu").into_iter().map(Some).collect();
        if cpus.is_empty() {
            cpus.push(None);
        }
        let (opts, dropped) = shared_options(&directives(&text, "opt:ptdump"));
        for cpu in cpus {
            let work = tempfile::tempdir().unwrap();
            std::fs::copy(ptt, work.path().join(format!("{stem}.ptt"))).unwrap();
            let cpu_args: Vec<String> = cpu
                .iter()
                .flat_map(|c| ["--cpu".to_string(), c.clone()])
                .collect();
            let mut args = cpu_args.clone();
            args.push(format!("{stem}.ptt"));
            let (ok, out) = run(&pttc, &args, work.path());
            assert!(ok, "pttc {args:?}: {out}");
            // The traces of the cases with a ptdump expectation.
            let names: Vec<String> = std::fs::read_dir(work.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect();
            if !names
                .iter()
                .any(|n| n.contains("ptdump") && n.ends_with(".exp"))
            {
                continue;
            }
            for pt in names.iter().filter(|n| n.ends_with(".pt")) {
                let mut args = cpu_args.clone();
                args.extend(opts.iter().cloned());
                args.push(pt.clone());
                let reference = Command::new(&ptdump)
                    .args(&args)
                    .current_dir(work.path())
                    .output()
                    .unwrap();
                let mut ours_args = vec!["dump".to_string(), "--keep-going".to_string()];
                ours_args.extend(args.iter().cloned());
                let ours = Command::new(pttrace())
                    .args(&ours_args)
                    .current_dir(work.path())
                    .output()
                    .unwrap();
                assert!(
                    ours.status.success(),
                    "{stem} {ours_args:?}: {}",
                    String::from_utf8_lossy(&ours.stderr)
                );
                cases += 1;
                without_tracking += usize::from(dropped);
                if reference.stdout != ours.stdout {
                    differ.push(format!(
                        "{stem} {args:?}:\n--- ptdump\n{}--- pttrace dump\n{}",
                        String::from_utf8_lossy(&reference.stdout),
                        String::from_utf8_lossy(&ours.stdout)
                    ));
                }
            }
        }
    }
    println!(
        "{cases} ptdump cases of {} .ptt files compared ({without_tracking} without ptdump's \
         time-tracking options, which pttrace dump does not have); {} differ",
        ptts.len(),
        differ.len()
    );
    assert!(cases > 400, "{cases} cases");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
