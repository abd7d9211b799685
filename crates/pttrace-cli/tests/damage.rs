//! Damaged input is reported the same way by every reader (issue 13, point 3): each
//! damaged place as `pttrace CMD: damaged: FILE: byte N: WHAT`, exit status 1, and exit 0
//! with `--keep-going` (what could be read is still used). And `--info` must belong to the
//! thread file it is given for.

mod shim_util;

use drpttracer::decode::testgen::LoopProgram;
use drpttracer::format::ptt;
use drpttracer::format::{auxtrace, pdb};
use drpttracer::metadata::PtMetadata;
use shim_util::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pt_cmd(args: &[&str], file: &Path) -> Output {
    Command::new(pttrace())
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

/// Runs `args FILE` without and with --keep-going: status 1 and `damaged` naming FILE, the
/// byte and `what`; then status 0 saying it continued.
fn damaged(args: &[&str], file: &Path, byte: u64, what: &str) -> Output {
    damaged_in(args, file, file, byte, what)
}

/// [`damaged`] for an input (a directory) whose damaged file is `named`.
fn damaged_in(args: &[&str], file: &Path, named: &Path, byte: u64, what: &str) -> Output {
    let o = pt_cmd(args, file);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
    let cmd = args[0];
    let want = format!(
        "pttrace {cmd}: damaged: {}: byte {byte}: {what}",
        named.display()
    );
    assert!(err.contains(&want), "{args:?}: want {want:?} in\n{err}");
    assert!(err.contains("pass --keep-going"), "{err}");
    let mut k = vec![args[0], "--keep-going"];
    k.extend_from_slice(&args[1..]);
    let o2 = pt_cmd(&k, file);
    assert!(o2.status.success(), "{k:?}: {o2:?}");
    let err2 = String::from_utf8_lossy(&o2.stderr);
    assert!(err2.contains(&want), "{err2}");
    assert!(
        err2.contains("continued past 1 damaged place (--keep-going)"),
        "{err2}"
    );
    o2
}

/// A real trace directory of `ls /` and its one thread file.
fn traced_ls(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let out = dir.join(name);
    let o = run_traced(&out, Path::new("/bin/ls"), &["/"], &[]);
    assert!(o.status.success(), "{o:?}");
    let ptt = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "ptt"))
        .unwrap();
    (out, ptt)
}

#[test]
fn a_damaged_thread_file_fails_decode_dump_and_report_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = traced_ls(tmp.path(), "t");
    let data = std::fs::read(&good).unwrap();
    let frames = ptt::parse("x", &data).unwrap().frames;
    let last = frames.last().unwrap().offset as u64;
    assert!(frames.len() > 3);

    // A flipped byte in the first frame (the ThreadHeader at byte 16).
    let flip_dir = tmp.path().join("flip");
    std::fs::create_dir(&flip_dir).unwrap();
    let flipped = flip_dir.join(good.file_name().unwrap());
    let mut d = data.clone();
    d[30] ^= 0x20;
    std::fs::write(&flipped, &d).unwrap();
    let what = format!(
        "corrupt record (bad checksum or length): the {} bytes from here were not read",
        data.len() - 16
    );
    damaged(
        &["decode", "--format", "summary", "--ptt"],
        &flipped,
        16,
        &what,
    );
    damaged(&["dump", "--ptt"], &flipped, 16, &what);
    damaged_in(&["report"], &flip_dir, &flipped, 16, &what);

    // A record torn 30 bytes in (as a writer killed mid-write leaves it, without a spool).
    let torn_dir = tmp.path().join("torn");
    std::fs::create_dir(&torn_dir).unwrap();
    let torn = torn_dir.join(good.file_name().unwrap());
    std::fs::write(&torn, &data[..last as usize + 30]).unwrap();
    let what = "incomplete record: the file ends 30 bytes into it (writer killed?); the \
                records before it were read";
    let o = damaged(
        &["decode", "--format", "summary", "--ptt"],
        &torn,
        last,
        what,
    );
    // What could be read was: every window but the torn one.
    let windows = frames
        .iter()
        .filter(|f| f.ty == ptt::RecordType::Window as u16)
        .count();
    let out = String::from_utf8_lossy(&o.stdout);
    let listed = out.lines().filter(|l| l.starts_with("window ")).count();
    assert!(listed == windows || listed + 1 == windows, "{out}");
    damaged(&["dump", "--ptt"], &torn, last, what);
    // The directory decoder reports it the same way.
    let o = pt_cmd(&["decode", "--format", "summary"], &torn_dir);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!(
        "pttrace decode: damaged: {}: byte {last}: {what}",
        torn.display()
    )));

    // Undamaged: exit 0 and no damage line.
    for args in [&["decode", "--ptt"][..], &["dump", "--ptt"][..]] {
        let o = pt_cmd(args, &good);
        assert!(o.status.success(), "{args:?}: {o:?}");
        assert!(!String::from_utf8_lossy(&o.stderr).contains("damaged"));
    }
}

#[test]
fn damaged_containers_keep_what_precedes_the_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = LoopProgram::new(0x40_0000);
    let (pt, _) = prog.trace(1500, 300, 5);

    // DynamoRIO .raw.pt: two syscall windows, the second cut short.
    let mut w = pdb::PdbWriter::new(1, 2, &PtMetadata::default());
    w.syscall(1, 2, 0, 0, &[7], &pt)
        .syscall(1, 2, 1, 1, &[], &pt);
    let second = 24 + 18 + 56 + pt.len();
    let cut = &w.buf[..w.buf.len() - 10];
    let raw = tmp.path().join("1.raw.pt");
    std::fs::write(&raw, cut).unwrap();
    let want_len = w.buf.len() - second;
    let what = format!(
        "PDB of {want_len} bytes runs past the end of the file ({} bytes left)",
        want_len - 10
    );
    let o = damaged(&["dump", "--raw-pt"], &raw, (second + 16) as u64, &what);
    // The first window is listed in full.
    assert!(String::from_utf8_lossy(&o.stdout).contains("# syscall #0 sysnum 0"));
    damaged(
        &["decode", "--format", "summary", "--raw-pt"],
        &raw,
        (second + 16) as u64,
        &what,
    );

    // perf AUXTRACE: the second record's payload cut short.
    let wrapped = auxtrace::wrap(&pt, 256, 1, 0);
    let aux = tmp.path().join("pt.aux");
    let n_records = pt.len().div_ceil(256);
    assert!(n_records > 2);
    let second_rec = 48 + 256;
    std::fs::write(&aux, &wrapped[..second_rec + 48 + 100]).unwrap();
    let what = "AUXTRACE payload of 256 bytes runs past the end (100 bytes left)";
    let o = damaged(&["dump", "--auxtrace"], &aux, second_rec as u64, what);
    assert!(!o.stdout.is_empty());
}

#[test]
fn an_info_file_of_another_process_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, a_ptt) = traced_ls(tmp.path(), "a");
    let (b, _) = traced_ls(tmp.path(), "b");
    let info_of = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "info"))
            .unwrap()
    };
    let (a_info, b_info) = (info_of(&a), info_of(&b));
    let o = Command::new(pttrace())
        .args(["decode", "--ptt"])
        .arg(&a_ptt)
        .arg("--info")
        .arg(&b_info)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    let b_name = b_info.file_name().unwrap().to_string_lossy().into_owned();
    let (b_pid, b_nonce) = b_name.trim_end_matches(".info").split_once('-').unwrap();
    assert!(
        err.contains(&format!(
            "{}: offset 0x0: the info file of process {b_pid} image {b_nonce}, but {} was written by \
             process",
            b_info.display(),
            a_ptt.display()
        )),
        "{err}"
    );
    // Its own info file is accepted.
    let o = Command::new(pttrace())
        .args(["decode", "--ptt"])
        .arg(&a_ptt)
        .arg("--info")
        .arg(&a_info)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
}

/// Every reader of a directory reports its damage from the same check (the one reader of
/// trace directories): the same line from `report`, `decode DIR` and `view DIR`.
fn all_readers_say(dir: &Path, named: &Path, byte: u64, what: &str) {
    damaged_in(&["report"], dir, named, byte, what);
    damaged_in(&["decode", "--format", "summary"], dir, named, byte, what);
    damaged_in(&["view", "--format", "folded"], dir, named, byte, what);
}

#[test]
fn damage_every_directory_reader_reports_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let (good_dir, good) = traced_ls(tmp.path(), "t");
    let info = std::fs::read_dir(&good_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "info"))
        .unwrap();
    let copy = |name: &str| -> PathBuf {
        let d = tmp.path().join(name);
        std::fs::create_dir(&d).unwrap();
        for f in [&good, &info] {
            std::fs::copy(f, d.join(f.file_name().unwrap())).unwrap();
        }
        d
    };

    // 1. A byte of the info file set to 0xff (its second record).
    let d1 = copy("info");
    let info1 = d1.join(info.file_name().unwrap());
    let mut data = std::fs::read(&info1).unwrap();
    let frames = ptt::parse("x", &data).unwrap().frames;
    let second = frames[1].offset;
    data[second + 20] = 0xff;
    std::fs::write(&info1, &data).unwrap();
    let what = format!(
        "corrupt record (bad checksum or length): the {} bytes from here were not read",
        data.len() - second
    );
    all_readers_say(&d1, &info1, second as u64, &what);

    // 2. The thread file cut exactly at a record boundary: its last window and End record
    // are gone, while the info file says the process ended.
    let d2 = copy("cut");
    let t2 = d2.join(good.file_name().unwrap());
    let data = std::fs::read(&t2).unwrap();
    let frames = ptt::parse("x", &data).unwrap().frames;
    let cut = frames[frames.len() - 2].offset;
    std::fs::write(&t2, &data[..cut]).unwrap();
    all_readers_say(
        &d2,
        &t2,
        cut as u64,
        "the file ends without its End record although its process ended (exit_group): \
         its last windows are missing",
    );

    // 3. Two windows swapped (each record's checksum still valid).
    let d3 = copy("swap");
    let t3 = d3.join(good.file_name().unwrap());
    let data = std::fs::read(&t3).unwrap();
    let frames = ptt::parse("x", &data).unwrap().frames;
    let windows: Vec<_> = frames
        .iter()
        .filter(|f| f.ty == ptt::RecordType::Window as u16)
        .collect();
    assert!(windows.len() > 4);
    let (a, b, c) = (windows[1].offset, windows[2].offset, windows[3].offset);
    let mut swapped = data[..a].to_vec();
    swapped.extend_from_slice(&data[b..c]);
    swapped.extend_from_slice(&data[a..b]);
    swapped.extend_from_slice(&data[c..]);
    std::fs::write(&t3, &swapped).unwrap();
    all_readers_say(
        &d3,
        &t3,
        a as u64,
        "window 2 follows window 0: windows missing (the first of 3 places where the \
         indices jump)",
    );
}
