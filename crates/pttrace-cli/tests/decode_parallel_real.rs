//! Parallel decode is record-for-record the sequential decode on a real program's trace
//! (issue 13, point 2): `/bin/ls /` traced whole by the QEMU backend; its long windows
//! hold several PSBs, so the parallel decoder really cuts them.
//! - the library: every window, with the image `pttrace decode DIR` builds (mappings,
//!   vDSO, the code QEMU captured), `decode_parallel` on 2, 3 and 4 threads against one
//!   `PtDecoder` pass, whole record streams compared;
//! - the CLI: `pttrace decode --ptt FILE --format jsonl` (every record, timestamps and
//!   gaps included) on 1, 2 and 4 threads, outputs compared.
//!
//! Needs `qemu-x86_64` (Debian's qemu-user); prints `SKIP: <reason>` without it.

mod shim_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use drpttracer::decode::parallel::{decode_parallel, split_at_psbs};
use drpttracer::decode::ptt_dir::{CarriedCaches, PttWindowInfo};
use drpttracer::decode::sideband::parse_records;
use drpttracer::decode::{ptt_dir, ptt_input, PtDecoder, Record, WindowOptions};
use drpttracer::sideband::record::SIDEBAND_SAMPLE_TYPE;
use shim_util::{pttrace, qemu_available, run_under_qemu};

/// `pttrace decode --ptt FILE --format jsonl --threads N`: its output.
fn decode(ptt: &Path, threads: usize) -> String {
    let o = Command::new(pttrace())
        .arg("decode")
        .arg("--ptt")
        .arg(ptt)
        .args(["--format", "jsonl", "--threads", &threads.to_string()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "decode {} --threads {threads}: {}",
        ptt.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Fails with the first differing line and the lines around it (`one` as `--threads 1`
/// gives it, `many` in parallel, or any two outputs `what` names).
fn assert_same_lines(one: &str, many: &str, what: &str) {
    if one == many {
        return;
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (one.lines().collect(), many.lines().collect());
    let first = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let show = |v: &[&str]| {
        let lo = first.saturating_sub(3);
        (lo..(first + 4).min(v.len()))
            .map(|k| format!("  {k:>7}{} {}", if k == first { '>' } else { ' ' }, v[k]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    panic!(
        "{what}: the outputs differ at line {first} ({} vs {} lines):\n\
         first (--threads 1):\n{}\nsecond (parallel):\n{}",
        a.len(),
        b.len(),
        show(&a),
        show(&b)
    );
}

/// `/bin/ls /` traced by the QEMU backend into `dir`: the trace directory and its thread
/// files; `None` (after `SKIP:`) without QEMU or /bin/ls.
fn trace_ls(dir: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    if !qemu_available() {
        return None;
    }
    if !Path::new("/bin/ls").is_file() {
        println!("SKIP: /bin/ls not found");
        return None;
    }
    let out = dir.join("ls");
    let o = run_under_qemu(&out, &[], &["/bin/ls".as_ref(), "/".as_ref()]);
    assert!(
        o.status.success(),
        "pttrace run: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ptt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no thread file in {}", out.display());
    Some((out, files))
}

/// Windows of `files` that parallel decode on 2 threads cuts (it wants 32 chunks).
fn cut_windows(files: &[PathBuf]) -> usize {
    let mut n = 0;
    for f in files {
        let input = ptt_input::read_thread(f).unwrap();
        let name = f.display().to_string();
        for w in ptt_input::read_windows(&name, &input.data).unwrap() {
            n += usize::from(split_at_psbs(w.pt, 32).len() >= 2);
        }
    }
    n
}

/// Fails with the first differing record and the records around it.
fn assert_same_records(seq: &[Record], par: &[Record], what: &str) {
    if seq == par {
        return;
    }
    let first = seq
        .iter()
        .zip(par)
        .position(|(a, b)| a != b)
        .unwrap_or(seq.len().min(par.len()));
    let show = |v: &[Record]| {
        let lo = first.saturating_sub(3);
        (lo..(first + 4).min(v.len()))
            .map(|k| format!("  {k:>7}{} {:?}", if k == first { '>' } else { ' ' }, v[k]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    panic!(
        "{what}: parallel differs from sequential at record {first} ({} vs {} records):\n\
         sequential:\n{}\nparallel:\n{}",
        seq.len(),
        par.len(),
        show(seq),
        show(par)
    );
}

#[test]
fn parallel_decode_equals_sequential_on_every_window_of_ls() {
    let dir = tempfile::tempdir().unwrap();
    let Some((out, files)) = trace_ls(dir.path()) else {
        return;
    };
    let cut = cut_windows(&files);
    assert!(cut >= 1, "no window with two PSBs to cut at");
    // The image as `pttrace decode DIR` builds it (ptt_dir::thread_image: the process's
    // executable mappings and vDSO), then each window's sideband, the captured code last.
    let trace = ptt_dir::open(&out).unwrap();
    let (mut windows, mut records, mut timestamps) = (0, 0, 0);
    for th in &trace.threads {
        assert!(trace.process_of(th).is_some(), "process info");
        let ptt_dir::ThreadImage {
            params,
            mut space,
            mut resolver,
            ..
        } = trace.thread_image(th);
        let input = ptt_input::read_thread(&th.path).unwrap();
        let name = th.path.display().to_string();
        for w in ptt_input::read_windows(&name, &input.data).unwrap() {
            if !w.sideband.is_empty() {
                let events = parse_records("sb", w.sideband, SIDEBAND_SAMPLE_TYPE).unwrap();
                resolver.apply_window(&mut space, &events, &mut Vec::new());
            }
            if w.pt.is_empty() {
                continue;
            }
            let opts = WindowOptions {
                source: format!("{name} window {}", w.window.index),
                window_id: Some(w.window.index),
                cpu: None,
                base_offset: w.pt_file_offset,
                ..Default::default()
            };
            let seq: Vec<Record> = PtDecoder::new(
                w.pt,
                params,
                space.clone(),
                vec![],
                resolver.clone(),
                opts.clone(),
            )
            .unwrap()
            .collect();
            assert!(
                !seq.iter().any(|r| matches!(r, Record::Gap(_))),
                "{name} window {}: gaps",
                w.window.index
            );
            for threads in [2, 3, 4] {
                let par =
                    decode_parallel(w.pt, &params, &space, &[], &resolver, &opts, threads).unwrap();
                let what = format!("{name} window {}, {threads} threads", w.window.index);
                assert_same_records(&seq, &par, &what);
            }
            windows += 1;
            records += seq.len();
            timestamps += seq
                .iter()
                .filter(|r| matches!(r, Record::Timestamp { .. }))
                .count();
        }
    }
    assert!(
        windows > 50 && timestamps > 50,
        "{windows} windows, {timestamps} timestamps"
    );
    println!(
        "{windows} windows ({cut} cut into PSB segments), {records} records, {timestamps} \
         timestamps: identical on 2, 3 and 4 threads"
    );
}

#[test]
fn cli_threads_give_identical_output_on_ls() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_, files)) = trace_ls(dir.path()) else {
        return;
    };
    let cut = cut_windows(&files);
    assert!(cut >= 1, "no window with two PSBs to cut at");
    let mut lines = 0;
    for f in &files {
        let one = decode(f, 1);
        assert!(one.contains(r#""type":"timestamp""#), "{}", f.display());
        assert!(one.contains(r#""type":"insn""#), "{}", f.display());
        for threads in [2, 4] {
            let what = format!("{} --threads {threads}", f.display());
            assert_same_lines(&one, &decode(f, threads), &what);
        }
        lines += one.lines().count();
    }
    println!(
        "{} thread files ({cut} windows cut into PSB segments), {lines} lines identical on \
         1, 2 and 4 threads",
        files.len()
    );
}

/// The instruction addresses and gaps of a jsonl decode, for thread `tid` when the output
/// is a directory's (which tags each record with its tid).
fn insns_and_gaps(jsonl: &str, tid: Option<i64>) -> (Vec<String>, usize) {
    let (mut pcs, mut gaps) = (Vec::new(), 0);
    for l in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if tid.is_some_and(|t| v["tid"].as_i64() != Some(t)) {
            continue;
        }
        match v["type"].as_str() {
            Some("insn") => pcs.push(v["pc"].as_str().unwrap().to_string()),
            Some("gap") => gaps += 1,
            _ => {}
        }
    }
    (pcs, gaps)
}

/// `decode --ptt FILE` gives each thread exactly what `decode DIR` gives it: the window
/// sideband (mappings, then the executed code) changes the image before the window in
/// both (it used to be applied as timed events in `--ptt`, which left ~140 gaps).
#[test]
fn decode_of_one_thread_file_equals_the_directory_decode() {
    let dir = tempfile::tempdir().unwrap();
    let Some((out, files)) = trace_ls(dir.path()) else {
        return;
    };
    let o = Command::new(pttrace())
        .arg("decode")
        .arg(&out)
        .args(["--format", "jsonl"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let all = String::from_utf8(o.stdout).unwrap();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let tid: i64 = name
            .trim_end_matches(".ptt")
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let (want, want_gaps) = insns_and_gaps(&all, Some(tid));
        let (got, got_gaps) = insns_and_gaps(&decode(f, 1), None);
        assert!(!want.is_empty());
        assert_eq!(want_gaps, 0, "{name}");
        assert_eq!(got_gaps, 0, "{name}");
        assert_eq!(got, want, "{name}");
        // Every record, not only the instructions: the same image from the same start.
        let tag = format!(r#","tid":{tid}"#);
        let dir_lines: Vec<String> = all
            .lines()
            .filter(|l| !l.contains(r#""type":"thread""#) && l.contains(&tag))
            .map(|l| l.replace(&tag, ""))
            .collect();
        let file_lines: Vec<String> = decode(f, 1).lines().map(String::from).collect();
        assert!(file_lines == dir_lines, "{name}: records differ");
    }
    // A thread file as the input of decode and dump, named by its path and by its name
    // alone in its directory: the same output (the name alone was not found among the
    // directory's files, which it lists as `./NAME`).
    let f = &files[0];
    for cmd in [&["decode", "--format", "jsonl"][..], &["dump"]] {
        let run = |file: &Path, cwd: &Path| {
            let o = Command::new(pttrace())
                .args(&cmd[..1])
                .arg(file)
                .args(&cmd[1..])
                .current_dir(cwd)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            assert!(o.status.success(), "{cmd:?} {}: {err}", file.display());
            String::from_utf8(o.stdout).unwrap()
        };
        let by_path = run(f, Path::new("/"));
        let by_name = run(Path::new(f.file_name().unwrap()), &out);
        assert!(!by_path.is_empty(), "{cmd:?}");
        // (Named as given: `./NAME` and `DIR/NAME`.)
        let dir = format!("{}/", out.display());
        assert_same_lines(
            &by_path.replace(&dir, ""),
            &by_name.replace("./", ""),
            &format!("{cmd:?} of {}, by path and by name", f.display()),
        );
    }
    // The oracle check: both decoders on every window, the fast one decoding all of them.
    let check = |input: &[&std::ffi::OsStr]| {
        let o = Command::new(pttrace())
            .arg("decode")
            .args(input)
            .args(["--decoder", "check"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let records = all
        .lines()
        .filter(|l| !l.contains(r#""type":"thread""#))
        .count();
    let windows = all
        .lines()
        .filter(|l| l.contains(r#""type":"window""#))
        .count();
    assert_eq!(
        check(&[out.as_os_str()]),
        format!(
            "check: the fast decoder and libipt agree: {windows} windows, {records} records \
             (decoded by fast: {windows})\n"
        )
    );
    for f in &files {
        let out = check(&["--ptt".as_ref(), f.as_os_str()]);
        assert!(
            out.starts_with("check: the fast decoder and libipt agree: ")
                && out.ends_with(")\n")
                && out.contains("(decoded by fast: ")
                && !out.contains("libipt ("),
            "{}: {out}",
            f.display()
        );
    }
}

/// Windows decoded one after the other hand their caches on (decoded instructions, block
/// records, libipt's file sections): the records are exactly those of every window
/// decoded with caches of its own.
#[test]
fn shared_caches_change_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let Some((out, _)) = trace_ls(dir.path()) else {
        return;
    };
    let collect = |private: bool| {
        let mut t = drpttracer::decode::ptt_dir::open(&out).unwrap();
        t.private_caches = private;
        let mut all = Vec::new();
        for th in &t.threads {
            t.decode_thread(th, &mut |_, dec| {
                if let Some(d) = dec {
                    all.extend(d.by_ref());
                }
                Ok(())
            })
            .unwrap();
        }
        all
    };
    let shared = collect(false);
    assert!(shared.len() > 100_000, "{}", shared.len());
    assert_eq!(shared, collect(true));
}

/// Threads of images that hold the same code (a program a shell runs twice, placed alike
/// by QEMU) hand their decoder caches on ([`PttTrace::decode_thread_carrying`]): the
/// second run starts from the first one's, and every thread's records are exactly those
/// it has decoded alone.
#[test]
fn caches_carried_between_images_of_the_same_code_change_no_record() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("twice");
    let o = run_under_qemu(
        &out,
        &[],
        &[
            "/bin/sh".as_ref(),
            "-c".as_ref(),
            "/bin/ls /; /bin/ls /; true".as_ref(),
        ],
    );
    assert!(
        o.status.success(),
        "pttrace run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let t = drpttracer::decode::ptt_dir::open(&out).unwrap();
    let records = |th, carried: Option<&mut CarriedCaches>| {
        let mut all = Vec::new();
        let mut keep = |_: &PttWindowInfo, dec: Option<&mut PtDecoder<'_>>| {
            if let Some(d) = dec {
                all.extend(d.by_ref());
            }
            Ok(())
        };
        match carried {
            Some(c) => t.decode_thread_carrying(th, c, &mut keep),
            None => t.decode_thread(th, &mut keep),
        }
        .unwrap();
        all
    };
    // A carrier per command line (as `decode` and `view` keep one per set of mappings):
    // a thread takes its caches only when its first window's image holds the code the
    // last thread's decoding left there.
    let mut carriers: std::collections::HashMap<String, CarriedCaches> = Default::default();
    let mut ls_images = 0;
    for th in &t.threads {
        let cmd = t
            .process_of(th)
            .map(|p| p.cmdline.clone())
            .unwrap_or_default();
        let alone = records(th, None);
        let carried = carriers.entry(cmd.clone()).or_default();
        let taken = carried.taken();
        let with = records(th, Some(carried));
        assert!(with == alone, "{}: records differ", th.path.display());
        if cmd == "/bin/ls /" {
            ls_images += 1;
            let want = taken + u32::from(ls_images == 2);
            assert_eq!(carried.taken(), want, "ls image {ls_images}");
        }
    }
    assert_eq!(ls_images, 2);
}
