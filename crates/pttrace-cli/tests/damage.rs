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
    damaged_at(args, file, named, Some(byte), what)
}

/// [`damaged_in`] where `byte` is `None` for damage of a whole file (no byte printed).
fn damaged_at(args: &[&str], file: &Path, named: &Path, byte: Option<u64>, what: &str) -> Output {
    let o = pt_cmd(args, file);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
    let cmd = args[0];
    let at = byte.map_or(String::new(), |b| format!("byte {b}: "));
    let want = format!("pttrace {cmd}: damaged: {}: {at}{what}", named.display());
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

/// Copies the info files beside `ptt` into `dir`, with the kernel side (`kernel.raw/`).
fn copy_info(ptt: &Path, dir: &Path) {
    for e in std::fs::read_dir(ptt.parent().unwrap()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "info") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    copy_kernel_raw(ptt.parent().unwrap(), dir);
}

/// Copies `from/kernel.raw/` (the kernel side of threads traced in kernel mode) into `to`.
fn copy_kernel_raw(from: &Path, to: &Path) {
    let Ok(rd) = std::fs::read_dir(from.join("kernel.raw")) else {
        return;
    };
    std::fs::create_dir_all(to.join("kernel.raw")).unwrap();
    for e in rd {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join("kernel.raw").join(p.file_name().unwrap())).unwrap();
    }
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
    copy_info(&good, &flip_dir);
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
    copy_info(&good, &torn_dir);
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
            "{}: the info file of process {b_pid} image {b_nonce}, but {} was written by \
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
    all_readers_say_at(dir, named, Some(byte), what);
}

fn all_readers_say_at(dir: &Path, named: &Path, byte: Option<u64>, what: &str) {
    damaged_at(&["report"], dir, named, byte, what);
    damaged_at(&["decode", "--format", "summary"], dir, named, byte, what);
    damaged_at(&["view", "--format", "folded"], dir, named, byte, what);
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
        copy_kernel_raw(&good_dir, &d);
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

    // 1b. The info file cut at its last record boundary (its ProcessEnd gone) while its
    // thread ended by exit_group.
    let d1b = copy("info-cut");
    let info1b = d1b.join(info.file_name().unwrap());
    let data = std::fs::read(&info1b).unwrap();
    let frames = ptt::parse("x", &data).unwrap().frames;
    let last = frames.last().unwrap();
    assert_eq!(last.ty, ptt::RecordType::ProcessEnd as u16);
    std::fs::write(&info1b, &data[..last.offset]).unwrap();
    all_readers_say(
        &d1b,
        &info1b,
        last.offset as u64,
        "the file ends without its ProcessEnd record although a thread of the process ended \
         by exit_group: its last records are missing",
    );

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

    // The kernel side's files: a `.raw.pt` cut inside a syscall PDB, a `kallsyms` byte
    // that is not UTF-8.
    let dk = tmp.path().join("kernel");
    std::fs::create_dir(&dk).unwrap();
    for e in std::fs::read_dir(&good_dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dk.join(p.file_name().unwrap())).unwrap();
        }
    }
    let kdir = dk.join("kernel.raw");
    std::fs::create_dir(&kdir).unwrap();
    let src = good_dir.join("kernel.raw");
    let raw: PathBuf = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".raw.pt"))
        .expect("a kernel.raw/<tid>.raw.pt");
    let data = std::fs::read(&raw).unwrap();
    let f = pdb::parse(&data).unwrap();
    assert!(f.windows.len() > 2, "{} windows", f.windows.len());
    // The second window's PDB starts where the first one's PT ends.
    let second = f.windows[1].pt.start - 48 - 8 * f.windows[1].args.len();
    let cut_raw = kdir.join(raw.file_name().unwrap());
    std::fs::write(&cut_raw, &data[..second + 20]).unwrap();
    all_readers_say(
        &dk,
        &cut_raw,
        // Its third entry (the PT data boundary) is cut.
        second as u64 + 16,
        "file ends inside a PDB header (truncated file?)",
    );
    std::fs::copy(&raw, &cut_raw).unwrap();
    let mut ks = std::fs::read(src.join("kallsyms")).unwrap();
    ks[100] = 0xff;
    std::fs::write(kdir.join("kallsyms"), &ks).unwrap();
    let line = ks[..100].iter().filter(|&&b| b == b'\n').count() + 1;
    all_readers_say(
        &dk,
        &kdir.join("kallsyms"),
        100,
        &format!("not UTF-8 text (line {line})"),
    );
    // The thread's kernel side deleted (kallsyms whole again).
    std::fs::copy(src.join("kallsyms"), kdir.join("kallsyms")).unwrap();
    std::fs::remove_file(&cut_raw).unwrap();
    all_readers_say_at(
        &dk,
        &cut_raw,
        None,
        "missing: the kernel side of a thread traced in kernel mode (deleted?): its kernel \
         windows are lost",
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

/// A spool as the shim leaves it when its process is killed: `windows` queued, published
/// in entries 0, 1, ... (each entry: u64 seq = slot + 1, the 96-byte window, its check).
fn spool_of(h: &ptt::ThreadHeader, windows: &[ptt::Window]) -> Vec<u8> {
    use drpttracer::format::spool;
    let cap = 8usize;
    let mut b = vec![0u8; spool::file_len(cap)];
    b[..8].copy_from_slice(&spool::MAGIC);
    b[spool::OFF_VERSION..][..4].copy_from_slice(&spool::VERSION.to_le_bytes());
    b[spool::OFF_ENTRY_SIZE..][..4].copy_from_slice(&(spool::ENTRY_SIZE as u32).to_le_bytes());
    b[spool::OFF_CAP..][..8].copy_from_slice(&(cap as u64).to_le_bytes());
    b[spool::OFF_PID..][..4].copy_from_slice(&h.pid.to_le_bytes());
    b[spool::OFF_TID..][..4].copy_from_slice(&h.tid.to_le_bytes());
    b[spool::OFF_NONCE..][..8].copy_from_slice(&h.nonce.to_le_bytes());
    b[spool::OFF_START_TSC..][..8].copy_from_slice(&h.start_tsc.to_le_bytes());
    b[spool::OFF_MODE..][..4].copy_from_slice(&[h.mode, h.window, h.backend, h.pt_present as u8]);
    // Free entries hold seq = their slot, as the shim sets them up.
    for i in windows.len()..cap {
        let at = spool::ENTRIES_OFFSET + i * spool::ENTRY_SIZE;
        b[at..at + 8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    for (i, w) in windows.iter().enumerate() {
        let at = spool::ENTRIES_OFFSET + i * spool::ENTRY_SIZE;
        b[at..at + 8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        let mut f = Vec::new();
        for v in
            [w.index, w.nr]
                .into_iter()
                .chain(w.args)
                .chain([w.ret as u64, w.tsc_start, w.tsc_end])
        {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(&w.flags.to_le_bytes());
        f.extend_from_slice(&w.depth.to_le_bytes());
        f.extend_from_slice(&spool::window_check(w).to_le_bytes());
        b[at + 8..at + 8 + f.len()].copy_from_slice(&f);
    }
    b
}

#[test]
fn a_damaged_spool_is_reported_by_every_directory_reader() {
    // A killed process's thread file ends 4 windows early; its spool holds them. One
    // entry lost (its sequence number damaged) leaves a gap every reader names, in the
    // spool, at that entry's successor.
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ptt_file) = traced_ls(tmp.path(), "t");
    let data = std::fs::read(&ptt_file).unwrap();
    let parsed = ptt::parse("x", &data).unwrap();
    let header = parsed
        .frames
        .iter()
        .find(|f| f.ty == ptt::RecordType::ThreadHeader as u16)
        .and_then(|f| ptt::decode_thread_header(f.payload))
        .unwrap();
    let windows: Vec<_> = parsed
        .frames
        .iter()
        .filter(|f| f.ty == ptt::RecordType::Window as u16)
        .collect();
    assert!(windows.len() > 6);
    let cut = windows[windows.len() - 4].offset;
    let queued: Vec<ptt::Window> = windows[windows.len() - 4..]
        .iter()
        .map(|f| ptt::decode_window(f.payload).unwrap().window)
        .collect();
    std::fs::write(&ptt_file, &data[..cut]).unwrap();
    let spool_file = drpttracer::format::spool::path_for(&ptt_file);
    let mut sp = spool_of(&header, &queued);
    std::fs::write(&spool_file, &sp).unwrap();
    // Undamaged: the spool completes the file, nothing to say.
    for args in [
        &["report"][..],
        &["decode", "--format", "summary"],
        &["view", "--format", "folded"],
    ] {
        let o = pt_cmd(args, &dir);
        assert!(o.status.success(), "{args:?}: {o:?}");
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("damaged"),
            "{o:?}"
        );
    }
    // Entry 1 (the second queued window) no longer published.
    let e1 = drpttracer::format::spool::ENTRIES_OFFSET + drpttracer::format::spool::ENTRY_SIZE;
    sp[e1] ^= 0x01;
    std::fs::write(&spool_file, &sp).unwrap();
    let e2 = (e1 + drpttracer::format::spool::ENTRY_SIZE) as u64;
    let what = format!(
        "window {} follows window {}: windows missing (a spool entry lost)",
        queued[2].index, queued[0].index
    );
    all_readers_say(&dir, &spool_file, e2, &what);
    // Entry 1 published again, with one bit of its window's return value flipped: its
    // checksum tells, and the window is left out.
    sp[e1] ^= 0x01;
    sp[e1 + 8 + 8 * 8] ^= 0x10;
    std::fs::write(&spool_file, &sp).unwrap();
    all_readers_say(
        &dir,
        &spool_file,
        e1 as u64,
        "a queued window's entry fails its checksum (damaged after it was written): that \
         window is left out",
    );
}

#[test]
fn stray_and_orphan_files_are_reported_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ptt_file) = traced_ls(tmp.path(), "t");
    // 6. A truncated thread file and a truncated info file under names that do not follow
    // `<pid>-<nonce>[-<tid>]` (stray files): every reader reads and reports them alike.
    let d6 = tmp.path().join("stray");
    std::fs::create_dir(&d6).unwrap();
    copy_kernel_raw(&dir, &d6);
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, d6.join(p.file_name().unwrap())).unwrap();
        }
    }
    let data = std::fs::read(&ptt_file).unwrap();
    let junk = d6.join("junk.ptt");
    std::fs::write(&junk, &data[..40]).unwrap();
    let what = "incomplete record: the file ends 24 bytes into it (writer killed?); the \
                records before it were read";
    all_readers_say(&d6, &junk, 16, what);

    // 5. A thread file deleted: the info file says the image existed. (`sh` runs `ls` in
    // a child: two images; the child's file goes.)
    let d5 = tmp.path().join("deleted");
    let o = run_traced(
        &d5,
        Path::new("/bin/sh"),
        &["-c", "/bin/ls / >/dev/null"],
        &[],
    );
    assert!(o.status.success(), "{o:?}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&d5)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ptt"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    let gone = files.pop().unwrap();
    std::fs::remove_file(&gone).unwrap();
    all_readers_say_at(
        &d5,
        &gone,
        None,
        "missing: the main thread's file of the image that the info file beside it \
         describes (deleted?): its windows are lost",
    );

    // 9. Two of 17 thread files deleted, none the main thread's: the info file's
    // ProcessEnd record counts the image's thread files (at its byte).
    let d9 = tmp.path().join("thread-files");
    let prog = compile("threads", tmp.path());
    let o = run_traced(&d9, &prog, &[], &[]);
    assert!(o.status.success(), "{o:?}");
    let info = std::fs::read_dir(&d9)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "info"))
        .unwrap();
    let pid = info.file_stem().unwrap().to_string_lossy();
    let pid = pid.split('-').next().unwrap().to_string();
    let mut workers: Vec<PathBuf> = std::fs::read_dir(&d9)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ptt"))
        .filter(|p| !p.to_string_lossy().ends_with(&format!("-{pid}.ptt")))
        .collect();
    assert_eq!(workers.len(), 16, "{workers:?}");
    workers.sort();
    for gone in &workers[..2] {
        std::fs::remove_file(gone).unwrap();
    }
    let data = std::fs::read(&info).unwrap();
    let frames = ptt::parse(&info.display().to_string(), &data).unwrap();
    let end = frames
        .frames
        .iter()
        .find(|f| f.ty == ptt::RecordType::ProcessEnd as u16)
        .unwrap();
    all_readers_say(
        &d9,
        &info,
        end.offset as u64,
        "the ProcessEnd record counts 17 thread files for this image, 15 are here: 2 \
         missing (deleted?), their windows are lost",
    );
    // Undamaged, the same directory before: nothing said.
    let o = pt_cmd(&["report"], &dir);
    assert!(o.status.success(), "{o:?}");

    // 8. A thread file whose process's info file is missing (no byte applies).
    let d8 = tmp.path().join("orphan");
    std::fs::create_dir(&d8).unwrap();
    copy_kernel_raw(&dir, &d8);
    let t8 = d8.join(ptt_file.file_name().unwrap());
    std::fs::copy(&ptt_file, &t8).unwrap();
    let name = ptt_file.file_name().unwrap().to_string_lossy().into_owned();
    let mut parts = name.split('-');
    let (pid, nonce) = (parts.next().unwrap(), parts.next().unwrap());
    all_readers_say_at(
        &d8,
        &t8,
        None,
        &format!(
            "its process's info file {pid}-{nonce}.info is missing: the process's maps, \
             vDSO and end are unknown"
        ),
    );
}
