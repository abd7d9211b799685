//! `pttrace decode` / `pttrace dump` on files: exact output for a small trace.

use std::process::Command;

use drpttracer::decode::testgen::PtWriter;
use drpttracer::format::{auxtrace, pdb};
use drpttracer::metadata::PtMetadata;

/// A minimal ELF64 executable: one R+X PT_LOAD with `code` at `vaddr`.
fn exe_elf(vaddr: u64, code: &[u8]) -> Vec<u8> {
    let mut e = vec![0u8; 0x1000];
    e[..4].copy_from_slice(b"\x7fELF");
    e[4] = 2;
    e[5] = 1;
    e[6] = 1;
    e[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e[18..20].copy_from_slice(&62u16.to_le_bytes());
    e[20..24].copy_from_slice(&1u32.to_le_bytes());
    e[24..32].copy_from_slice(&vaddr.to_le_bytes());
    e[32..40].copy_from_slice(&64u64.to_le_bytes());
    e[52..54].copy_from_slice(&64u16.to_le_bytes());
    e[54..56].copy_from_slice(&56u16.to_le_bytes());
    e[56..58].copy_from_slice(&1u16.to_le_bytes());
    let ph = 64;
    e[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
    e[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    e[ph + 8..ph + 16].copy_from_slice(&0x1000u64.to_le_bytes());
    e[ph + 16..ph + 24].copy_from_slice(&vaddr.to_le_bytes());
    e[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    e[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    e.extend_from_slice(code);
    e
}

fn pttrace(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pttrace"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn decode_and_dump_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = 0x40_1000u64;
    // nop; add eax,2 (83 c0 02); jmp rax (ff e0)
    let code = [0x90, 0x83, 0xc0, 0x02, 0xff, 0xe0];
    let exe = dir.path().join("prog");
    std::fs::write(&exe, exe_elf(base, &code)).unwrap();
    let mut w = PtWriter::new();
    w.psb_plus(Some(0x100), None).tip_pge(base).tip_pgd(None);
    let pt = dir.path().join("t.pt");
    std::fs::write(&pt, &w.buf).unwrap();
    let (ptp, exep) = (pt.to_str().unwrap(), exe.to_str().unwrap());

    let (ok, out, err) = pttrace(&["decode", "--pt", ptp, "--image", exep, "--format", "disasm"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "[timestamp tsc=0x100]",
            "[enabled at 0x401000]",
            "0000000000401000  90                              nop",
            "0000000000401001  83 c0 02                        add eax,2",
            "0000000000401004  ff e0                           jmp rax",
            "[disabled]",
        ]
    );
    let (ok, out, _) = pttrace(&[
        "decode",
        "--pt",
        ptp,
        "--image",
        &format!("{exep}@0x401000"),
        "--format",
        "disasm",
        "--syntax",
        "att",
    ]);
    assert!(ok);
    assert!(
        out.contains("add $2,%eax") && out.contains("jmp *%rax"),
        "{out}"
    );
    // Symbols from a kallsyms-format file.
    let ks = dir.path().join("syms");
    std::fs::write(&ks, "0000000000401000 T entry\n").unwrap();
    let (ok, out, _) = pttrace(&[
        "decode",
        "--pt",
        ptp,
        "--image",
        exep,
        "--kallsyms",
        ks.to_str().unwrap(),
    ]);
    assert!(ok);
    assert!(
        out.contains("0000000000401001 <entry+0x1>  83 c0 02"),
        "{out}"
    );
    let (ok, out, _) = pttrace(&["decode", "--pt", ptp, "--image", exep, "--format", "jsonl"]);
    assert!(ok);
    let (ok, out2, _) = pttrace(&[
        "decode",
        "--pt",
        ptp,
        "--image",
        exep,
        "--format",
        "jsonl",
        "--threads",
        "2",
    ]);
    assert!(ok);
    assert_eq!(out2, out);
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 6);
    assert_eq!(v[3]["type"], "insn");
    assert_eq!(v[3]["pc"], "0x401001");
    assert_eq!(v[3]["bytes"], "83c002");
    assert_eq!(v[4]["class"], "jump");

    // The same PT in AUXTRACE records and in a .raw.pt window: identical records.
    let aux = dir.path().join("t.aux");
    std::fs::write(&aux, auxtrace::wrap(&w.buf, 7, 1, 2)).unwrap();
    let (ok, out_aux, err) = pttrace(&[
        "decode",
        "--auxtrace",
        aux.to_str().unwrap(),
        "--image",
        exep,
        "--format",
        "jsonl",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out_aux.lines().skip(1).collect::<Vec<_>>(),
        out.lines().collect::<Vec<_>>()
    );
    assert_eq!(out_aux.lines().next(), Some(r#"{"cpu":2,"type":"cpu"}"#));
    let mut pw = pdb::PdbWriter::new(1, 1, &PtMetadata::default());
    pw.syscall(1, 1, 0, 0, &[], &w.buf)
        .syscall(1, 1, 0, 1, &[9], &w.buf);
    let raw = dir.path().join("1.raw.pt");
    std::fs::write(&raw, &pw.buf).unwrap();
    let (ok, sum, err) = pttrace(&[
        "decode",
        "--raw-pt",
        raw.to_str().unwrap(),
        "--image",
        exep,
        "--format",
        "summary",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        sum.lines().collect::<Vec<_>>(),
        [
            "window 0: 3 instructions, 0 gaps, 0 overflows",
            "window 1: 3 instructions, 0 gaps, 0 overflows",
            "total: 6 instructions, 0 gaps, 0 overflows",
            "decoded by: fast: 2"
        ]
    );
    // A TIP.PGE with no MODE.Exec since the synchronization: the fast decoder hands the
    // window to libipt, and the summary says so and why.
    let mut w2 = PtWriter::new();
    w2.psb()
        .tsc(0x100)
        .psbend()
        .tip_pge(base)
        .fup(base + 1)
        .tip_pgd(None);
    let fup = dir.path().join("fup.pt");
    std::fs::write(&fup, &w2.buf).unwrap();
    let (ok, sum, err) = pttrace(&[
        "decode",
        "--pt",
        fup.to_str().unwrap(),
        "--image",
        exep,
        "--format",
        "summary",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        sum.lines().collect::<Vec<_>>(),
        [
            "trace: 1 instruction, 0 gaps, 0 overflows",
            "total: 1 instruction, 0 gaps, 0 overflows",
            "decoded by: libipt (TIP.PGE with no MODE.Exec since the synchronization): 1"
        ]
    );
    // Without the image: a gap naming the file, offset and address.
    let (ok, sum, _) = pttrace(&["decode", "--pt", ptp, "--format", "summary"]);
    assert!(ok);
    assert!(sum.contains(&format!("gap: {ptp}: PT offset 0x")), "{sum}");
    assert!(sum.contains("0x401000"), "{sum}");

    let (ok, out, err) = pttrace(&["dump", ptp]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "0000000000000000  psb",
            "0000000000000010  tsc        100",
            "0000000000000018  mode.exec  cs.l",
            "000000000000001a  psbend",
            "000000000000001c  tip.pge    3: 0000000000401000",
            "0000000000000023  tip.pgd    0: ????????????????",
        ]
    );
    // ptdump's time column: the TSC as the time, the MTC frequency and CPUID 0x15 taken
    // (they change nothing in this trace: no MTC); and a note where they are given alone.
    let (ok, out, err) = pttrace(&[
        "dump",
        ptp,
        "--time",
        "--time-delta",
        "--mtc-freq",
        "3",
        "--cpuid-0x15.eax",
        "2",
        "--cpuid-0x15.ebx",
        "188",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().nth(1),
        Some("0000000000000010  tsc        100                       tsc  +100")
    );
    let (ok, _, err) = pttrace(&["dump", ptp, "--mtc-freq", "3"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("--mtc-freq changes nothing without --time or --tcal"),
        "{err}"
    );
    let (ok, _, err) = pttrace(&["dump", ptp, "--time", "--tcal"]);
    assert!(!ok && err.contains("--tcal"), "{err}");
    let (ok, out2, _) = pttrace(&["dump", "--raw-pt", raw.to_str().unwrap()]);
    assert!(ok);
    assert_eq!(
        out2.lines().filter(|l| l.starts_with("# syscall")).count(),
        2
    );
    // Errors name the file.
    let (ok, _, err) = pttrace(&["decode", "--raw-pt", ptp]);
    assert!(!ok);
    assert!(err.contains(ptp) && err.contains("offset"), "{err}");
}

#[test]
fn threads_give_identical_output() {
    let dir = tempfile::tempdir().unwrap();
    let prog = drpttracer::decode::testgen::LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(50_000, 500, 17);
    let exe = dir.path().join("loop");
    std::fs::write(&exe, exe_elf(prog.base, &prog.code)).unwrap();
    let pt = dir.path().join("loop.pt");
    std::fs::write(&pt, &trace).unwrap();
    let run = |threads: &str| {
        let (ok, out, err) = pttrace(&[
            "decode",
            "--pt",
            pt.to_str().unwrap(),
            "--image",
            exe.to_str().unwrap(),
            "--format",
            "jsonl",
            "--threads",
            threads,
        ]);
        assert!(ok, "{err}");
        out
    };
    let one = run("1");
    assert!(one.lines().count() > 50_000);
    assert!(!one.contains("\"gap\""));
    assert_eq!(run("3"), one);
    // The summary says who decoded the trace: the fast decoder, on one thread or on
    // segments cut at PSBs.
    let by = |threads: &str| {
        let (ok, out, err) = pttrace(&[
            "decode",
            "--pt",
            pt.to_str().unwrap(),
            "--image",
            exe.to_str().unwrap(),
            "--format",
            "summary",
            "--threads",
            threads,
        ]);
        assert!(ok, "{err}");
        out.lines().last().unwrap_or("").to_string()
    };
    assert_eq!(by("1"), "decoded by: fast: 1");
    assert_eq!(by("3"), "decoded by: fast (PSB-parallel): 1");
}

/// `--decoder check`: both decoders on every window, compared; the summary names what was
/// compared and which decoder gave the fast side's records.
#[test]
fn decoder_check_compares_fast_and_libipt() {
    let dir = tempfile::tempdir().unwrap();
    let prog = drpttracer::decode::testgen::LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(30_000, 700, 23);
    let exe = dir.path().join("loop");
    std::fs::write(&exe, exe_elf(prog.base, &prog.code)).unwrap();
    let pt = dir.path().join("loop.pt");
    std::fs::write(&pt, &trace).unwrap();
    let args = |decoder: &'static str| {
        vec![
            "decode".to_string(),
            "--pt".into(),
            pt.display().to_string(),
            "--image".into(),
            exe.display().to_string(),
            "--format".into(),
            "jsonl".into(),
            "--decoder".into(),
            decoder.into(),
        ]
    };
    let run = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        pttrace(&a)
    };
    let (ok, jsonl, err) = run(args("libipt"));
    assert!(ok, "{err}");
    let records = jsonl.lines().count();
    let (ok, out, err) = run(args("check"));
    assert!(ok, "{err}");
    assert_eq!(
        out,
        format!(
            "check: the fast decoder and libipt agree: 1 window, {records} records \
             (decoded by fast: 1)\n"
        )
    );
    let mut two = args("check");
    two.extend(["--threads".to_string(), "2".to_string()]);
    let (ok, _, err) = run(two);
    assert!(!ok);
    assert!(
        err.contains("--decoder check compares on one thread"),
        "{err}"
    );
}

#[test]
fn decodes_pttrace_thread_files_with_their_info_file() {
    use drpttracer::format::ptt::{
        encode_frame, encode_header, encode_window, FileKind, RecordType, Window,
    };
    let dir = tempfile::tempdir().unwrap();
    let base = 0x40_1000u64;
    let code = [0x90, 0x83, 0xc0, 0x02, 0xff, 0xe0]; // nop; add eax,2; jmp rax
    let exe = dir.path().join("prog");
    std::fs::write(&exe, exe_elf(base, &code)).unwrap();
    let frame = |ty, payload: &[u8]| {
        let mut buf = vec![0u8; payload.len() + 64];
        let n = encode_frame(&mut buf, ty, |c| c.bytes(payload)).unwrap();
        buf.truncate(n);
        buf
    };
    // Info file: Process, Metadata (cpu 6/85/4, no time), Maps, Vdso.
    let mut info = encode_header(FileKind::ProcessInfo).to_vec();
    let mut process = vec![0u8; 40];
    process[0..4].copy_from_slice(&77u32.to_le_bytes());
    info.extend(frame(RecordType::Process, &process));
    let md = PtMetadata {
        cpu_family: 6,
        cpu_model: 85,
        cpu_stepping: 4,
        ..Default::default()
    };
    let mut meta = md.to_bytes().to_vec();
    meta.extend_from_slice(&[0u8; 24]);
    meta.extend_from_slice(&drpttracer::sideband::record::SIDEBAND_SAMPLE_TYPE.to_le_bytes());
    assert_eq!(meta.len(), 50);
    info.extend(frame(RecordType::Metadata, &meta));
    let maps = format!(
        "00401000-00402000 r-xp 00001000 08:01 1234 {}\n",
        exe.display()
    );
    info.extend(frame(RecordType::Maps, maps.as_bytes()));
    std::fs::write(dir.path().join("77-00000000000000ab.info"), &info).unwrap();
    // Thread file: two windows; the second with a corrupt PT byte range.
    let mut w = PtWriter::new();
    w.psb_plus(None, None).tip_pge(base).tip_pgd(None);
    let mut bad = w.buf.clone();
    bad.truncate(20);
    bad.extend_from_slice(&[0x02, 0xff, 0x02, 0xff]);
    let mut thread = encode_header(FileKind::Thread).to_vec();
    for (k, pt) in [w.buf.clone(), bad].iter().enumerate() {
        let mut buf = vec![0u8; pt.len() + 256];
        let flags = if k == 1 {
            drpttracer::format::ptt::WF_PT_LOST
        } else {
            0
        };
        let win = Window {
            index: k as u64,
            nr: 39,
            flags,
            ..Default::default()
        };
        let n = encode_window(&mut buf, &win, pt, &[]).unwrap();
        thread.extend_from_slice(&buf[..n]);
    }
    let tf = dir.path().join("77-00000000000000ab-78.ptt");
    std::fs::write(&tf, &thread).unwrap();
    let (ok, dump, err) = pttrace(&["dump", "--ptt", tf.to_str().unwrap()]);
    assert!(!ok, "the corrupt window is an error: {err}");
    assert_eq!(
        dump.lines().filter(|l| l.starts_with("# window")).count(),
        2,
        "{dump}"
    );
    assert!(
        dump.contains(": error decoding packet: unknown opcode]"),
        "{dump}"
    );
    let (ok, out, err) = pttrace(&[
        "decode",
        "--ptt",
        tf.to_str().unwrap(),
        "--format",
        "summary",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "window 0: 3 instructions, 0 gaps, 0 overflows",
        "{out}"
    );
    assert_eq!(
        lines[1], "window 1: 0 instructions, 2 gaps, 0 overflows",
        "{out}"
    );
    assert!(lines[2].contains("PT data lost at capture"), "{out}");
    let lines: Vec<&str> = lines
        .into_iter()
        .filter(|l| !l.contains("lost at capture"))
        .collect();
    // The gap's offset is a file offset inside the second window's PT.
    let second_pt = thread.len() - 4 - 24; // before the CRC: the window's 24 PT bytes
    let off = lines[2]
        .split("PT offset 0x")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap();
    let off = usize::from_str_radix(off, 16).unwrap();
    assert!(
        (second_pt..second_pt + 24).contains(&off),
        "{out} {second_pt:#x}"
    );
    assert!(lines[2].contains("window 1, syscall 39"), "{out}");
}

#[test]
fn sideband_files_drive_the_image() {
    use drpttracer::decode::sideband::{encode_mmap2, TEST_SAMPLE_TYPE};
    let dir = tempfile::tempdir().unwrap();
    let addr = 0x50_0000u64;
    let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    std::fs::write(&a, [0x90u8, 0xff, 0xe0]).unwrap(); // nop; jmp rax
    std::fs::write(&b, [0x31u8, 0xc0, 0xff, 0xe0]).unwrap(); // xor eax,eax; jmp rax
                                                             // Two sideband streams: the primary maps A early, the secondary maps B later.
    let (s1, s2) = (dir.path().join("sb1"), dir.path().join("sb2"));
    std::fs::write(&s1, encode_mmap2(1, 1, addr, 0x1000, 0, &a, 50)).unwrap();
    std::fs::write(&s2, encode_mmap2(1, 1, addr, 0x1000, 0, &b, 200)).unwrap();
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None).tip_pge(addr).tip_pgd(None);
    w.psb_plus(Some(300), None).tip_pge(addr).tip_pgd(None);
    let pt = dir.path().join("t.pt");
    std::fs::write(&pt, &w.buf).unwrap();
    let st = format!("{TEST_SAMPLE_TYPE:#x}");
    // `decode` of the trace with these sideband files, then `more` arguments.
    let decode = |sidebands: &[&std::path::Path], more: &[&str]| {
        let mut args = vec!["decode", "--pt", pt.to_str().unwrap()];
        for s in sidebands {
            args.extend(["--sideband", s.to_str().unwrap()]);
        }
        args.extend([
            "--sample-type",
            &st,
            "--time-conv",
            "0,1,0",
            "--cpu",
            "6/85/4",
        ]);
        args.extend(more);
        let (ok, out, err) = pttrace(&args);
        assert!(ok, "{err}");
        out
    };
    let out = decode(&[&s1, &s2], &[]);
    let insns: Vec<&str> = out.lines().filter(|l| l.starts_with("0000")).collect();
    assert_eq!(insns.len(), 4, "{out}");
    assert!(
        insns[0].ends_with("nop") && insns[2].ends_with("xor eax,eax"),
        "{out}"
    );
    // Who decoded it: the fast decoder follows sideband that maps code during the trace;
    // here the code at `addr` changed after it was decoded, while tracing was off (at the
    // second PSB+), so its blocks are built anew there.
    let summary = |sidebands: &[&std::path::Path]| {
        let out = decode(sidebands, &["--format", "summary"]);
        out.lines().last().unwrap_or_default().to_string()
    };
    assert_eq!(summary(&[&s1, &s2]), "decoded by: fast: 1");
    assert_eq!(summary(&[&s1]), "decoded by: fast: 1");
}

#[test]
fn raw_pt_finds_kcore_and_kallsyms_beside_kernel_raw() {
    let dir = tempfile::tempdir().unwrap();
    let kbase = 0xffff_ffff_8100_0000u64;
    let code = [0x90u8, 0x48, 0x0f, 0x07]; // nop; sysretq
    std::fs::write(dir.path().join("kcore"), exe_elf(kbase, &code)).unwrap();
    std::fs::write(
        dir.path().join("kallsyms"),
        "ffffffff81000000 T entry_SYSCALL_64\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("kernel.raw")).unwrap();
    let mut w = PtWriter::new();
    w.psb_plus(None, None).tip_pge(kbase).tip_pgd(None);
    let mut pw = pdb::PdbWriter::new(5, 6, &PtMetadata::default());
    pw.syscall(5, 6, 39, 0, &[], &w.buf);
    let raw = dir.path().join("kernel.raw/6.raw.pt");
    std::fs::write(&raw, &pw.buf).unwrap();
    let (ok, out, err) = pttrace(&["decode", "--raw-pt", raw.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        err.contains("using kcore") && err.contains("using kallsyms"),
        "{err}"
    );
    let insns: Vec<&str> = out.lines().filter(|l| l.starts_with("ffff")).collect();
    assert_eq!(
        insns,
        [
            "ffffffff81000000 <entry_SYSCALL_64>  90                              nop",
            "ffffffff81000001 <entry_SYSCALL_64+0x1>  48 0f 07                        sysretq",
        ],
        "{out}"
    );
}

#[test]
fn garbage_inputs_fail_cleanly_never_panic() {
    use drpttracer::decode::testgen::XorShift;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = XorShift::new(4242);
    let prog = drpttracer::decode::testgen::LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(3000, 300, 1);
    let mut pw = pdb::PdbWriter::new(1, 1, &PtMetadata::default());
    pw.syscall(1, 1, 0, 0, &[1], &trace);
    let seeds: Vec<Vec<u8>> = vec![
        trace.clone(),
        auxtrace::wrap(&trace, 500, 1, 0),
        pw.buf.clone(),
    ];
    let f = dir.path().join("in");
    for n in 0..60 {
        let mut data = seeds[n % 3].clone();
        for _ in 0..1 + rng.below(8) {
            let at = rng.below(data.len() as u64) as usize;
            data[at] = rng.next_u64() as u8;
        }
        if n % 7 == 0 {
            data.truncate(rng.below(data.len() as u64) as usize);
        }
        std::fs::write(&f, &data).unwrap();
        let p = f.to_str().unwrap();
        for args in [
            vec!["decode", "--pt", p, "--format", "jsonl"],
            vec!["decode", "--auxtrace", p, "--format", "summary"],
            vec![
                "decode",
                "--raw-pt",
                p,
                "--format",
                "disasm",
                "--threads",
                "2",
            ],
            vec!["decode", "--ptt", p],
            vec![
                "decode",
                "--pt",
                p,
                "--sideband",
                p,
                "--sample-type",
                "0x10086",
            ],
            vec![
                "decode",
                "--pt",
                p,
                "--image",
                p,
                "--kcore",
                p,
                "--kallsyms",
                p,
            ],
            vec!["dump", p],
            vec!["dump", "--raw-pt", p],
            vec!["dump", "--auxtrace", p],
        ] {
            let out = Command::new(env!("CARGO_BIN_EXE_pttrace"))
                .args(&args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("panicked"), "{args:?}: {err}");
            assert_ne!(out.status.code(), Some(101), "{args:?}: {err}");
            if !out.status.success() {
                // Failures say which file (and usually where) went wrong.
                assert!(err.contains(p) || err.contains("offset"), "{args:?}: {err}");
            }
        }
    }
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_without_a_panic() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    // Many PSBs: `pttrace dump` prints far more than a pipe buffer holds.
    let mut w = PtWriter::new();
    for _ in 0..20_000 {
        w.psb().psbend();
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("many.pt");
    std::fs::write(&f, &w.buf).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pttrace"))
        .args(["dump", f.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little, like `head`, then close the pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 256];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGPIPE), "{st:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `--raw FILE[:FROM[-TO]]@BASE` (ptxed's raw images): the loop program's bytes, alone or
/// inside a larger file, decode to exactly the oracle's instructions; bad ranges are named.
#[test]
fn raw_code_files_at_an_address() {
    use drpttracer::decode::testgen::LoopProgram;
    let dir = tempfile::tempdir().unwrap();
    let prog = LoopProgram::new(0x40_0000);
    let (trace, bits) = prog.trace(2000, 300, 3);
    let expect = prog.simulate(&bits);
    let pt = dir.path().join("t.pt");
    std::fs::write(&pt, &trace).unwrap();
    let alone = dir.path().join("code.bin");
    std::fs::write(&alone, &prog.code).unwrap();
    let mut padded = vec![0xccu8; 16];
    padded.extend_from_slice(&prog.code);
    padded.extend_from_slice(&[0xcc; 8]);
    let inside = dir.path().join("padded.bin");
    std::fs::write(&inside, &padded).unwrap();
    let end = 16 + prog.code.len();
    let specs = [
        format!("{}@0x400000", alone.display()),
        format!("{}:16@0x400000", inside.display()),
        format!("{}:0x10-{end:#x}@0x400000", inside.display()),
    ];
    for spec in &specs {
        let (ok, out, err) = pttrace(&[
            "decode",
            "--pt",
            pt.to_str().unwrap(),
            "--raw",
            spec,
            "--format",
            "jsonl",
        ]);
        assert!(ok, "{spec}: {err}");
        let pcs: Vec<u64> = out
            .lines()
            .filter_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert_ne!(v["type"], "gap", "{spec}: {l}");
                (v["type"] == "insn")
                    .then(|| u64::from_str_radix(&v["pc"].as_str().unwrap()[2..], 16).unwrap())
            })
            .collect();
        assert_eq!(pcs.len() + 4, expect.len(), "{spec}");
        assert_eq!(&pcs[..], &expect[..pcs.len()], "{spec}");
    }
    let (ok, _, err) = pttrace(&[
        "decode",
        "--pt",
        pt.to_str().unwrap(),
        "--raw",
        &format!("{}:16-9999@0x400000", inside.display()),
    ]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "--raw '{}:16-9999@0x400000': range 0x10..0x270f is not inside the file ({} bytes)",
            inside.display(),
            padded.len()
        )),
        "{err}"
    );
    let (ok, _, err) = pttrace(&["decode", "--pt", pt.to_str().unwrap(), "--raw", "x.bin"]);
    assert!(!ok);
    assert!(
        err.contains("--raw 'x.bin': expected FILE[:FROM[-TO]]@BASE"),
        "{err}"
    );
}

/// `pttrace dump` of packets newer than libipt 2.1.2 (TRIG) and event-trace packets
/// (EVD, CFE): their fields, where 2.1.2 alone says "unknown opcode" or "other type".
#[test]
fn dump_prints_trig_cfe_and_evd_fields() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = PtWriter::new();
    w.psb().psbend();
    w.buf.extend_from_slice(&[0xd9, 0x60, 0x03, 0x10, 0x00]); // TRIG: ICNTV, MULT
    w.buf.extend_from_slice(&[0x02, 0x53, 0x00]); // EVD CR2
    w.buf.extend_from_slice(&0xdead_b000u64.to_le_bytes());
    w.buf.extend_from_slice(&[0x02, 0x13, 0x01, 0x0e]); // CFE INTR vector 14
    w.tip_pge(0x401000);
    let p = dir.path().join("t.pt");
    std::fs::write(&p, &w.buf).unwrap();
    let (ok, out, err) = pttrace(&["dump", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "0000000000000000  psb",
            "0000000000000010  psbend",
            "0000000000000012  trig       03, mult, icnt: 16",
            "0000000000000017  evd        0: deadb000               type cr2",
            "0000000000000022  cfe        1: 14                     type intr",
            "0000000000000026  tip.pge    3: 0000000000401000",
        ]
    );
    // ptdump's --no-offset and --raw columns (lines as libipt's ptdump prints them).
    let (ok, out, err) = pttrace(&["dump", "--no-offset", "--raw", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "02820282028202820282028202820282  psb",
            "0223                              psbend",
            "d960031000                        trig       03, mult, icnt: 16",
            "02530000b0adde00000000            evd        0: deadb000               type cr2",
            "0213010e                          cfe        1: 14                     type intr",
            "71001040000000                    tip.pge    3: 0000000000401000",
        ]
    );
}
