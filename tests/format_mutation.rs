//! Deterministic mutation test of every input format the tools read (issue 13).
//!
//! For each format a realistic valid input is built with the crates' own writers and parsed
//! once with exact expectations; then deterministic mutants (xorshift with a fixed seed per
//! format: bit flips, random runs, truncation, insertion, deletion, duplicated chunks) must
//! parse without a panic, either to `Ok` or to an error that names the input (where the API
//! takes a name) and whose offset lies inside it, and whatever a parser returns (frames, PT
//! ranges, chunks, records) must lie inside the input. A panicking case is reported with
//! its format, seed, case number and input bytes in hex (see `mutants`).
//!
//! Cases per format:
//! - raw PT (`PtDecoder` over a fixed image, `packets::list_packets`): 2,000;
//! - ptt thread file (`ptt::parse`, the frame decoders, `ptt_input::read_windows`, the
//!   windows' sideband): 4,000, half byte-level, half payload-level (one frame's payload
//!   mutated and re-framed with a valid CRC, so that the payload decoders see it); 400 of
//!   them also through `ptt::stream_frames` and `summary::summarize_thread` on a file;
//! - ptt process info file (`ptt::parse`, `ptt_input::read_process`): 4,000, the same two
//!   kinds; 400 of them also through `summary::summarize_process` on a file;
//! - ptt output directory (`ptt_dir::open` + `collect_thread`: info, thread file, maps,
//!   sideband, code records and PT together): 300;
//! - DynamoRIO `.raw.pt` (`pdb::parse`): 3,000;
//! - perf AUXTRACE (`auxtrace::unwrap`), plain stream and perf.data form: 3,000;
//! - perf sideband records (`sideband::parse_records`, `perf_record::RecordIter`): 3,000;
//! - code records (TEXT_POKE through `RecordIter`, `code::parse_code_body`,
//!   `AddressSpace::add_code`): 3,000;
//! - `/proc/<pid>/maps` text (`MapsEntry::parse`, `encode_exec_mappings`): 3,000;
//! - kallsyms text (`Symbols::add_kallsyms`): 3,000;
//! - `pt_metadata` (`PtMetadata::from_bytes`, time conversion, libipt configuration):
//!   2,000, and the 50-byte extended metadata record of an info file
//!   (`ptt_input::read_process`): 2,000;
//! - QEMU command line (`launch::guest_cmdline`): 2,000; program heads
//!   (`launch::inspect`, from a file): 400;
//! - the shim's spools (`spool::parse`, `spool::recover` completing a torn thread file):
//!   2,000.
//!
//! The valid inputs are also the fuzz targets' seed corpora (`fuzz/seeds/`, written by the
//! ignored `write_fuzz_seeds`).
//!
//! Panics found and fixed (reproducers in the tests at the end): a maps line whose end is
//! below its start made `maps::encode_exec_mappings` (and so `ptt_input::read_process`)
//! and `ptt_dir`'s `decode_thread` subtract with overflow (such a line is no mapping now);
//! `auxtrace::unwrap` overflowed on a perf.data data offset near `u64::MAX` (now an error
//! at byte 40); `summary::summarize_thread` and `ptt_dir`'s `decode_thread` overflowed on
//! `Dropped` counts adding up past `u64::MAX` (they saturate).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use drpttracer::decode::packets::{list_packets, PacketLine};
use drpttracer::decode::sideband::{parse_records, ImageChange, ImageEvent};
use drpttracer::decode::testgen::{mutate, LoopProgram, XorShift};
use drpttracer::decode::{
    ptt_dir, ptt_input, AddressSpace, ImageResolver, PtDecoder, Record, Symbols, TraceParams,
    WindowOptions,
};
use drpttracer::format::ptt::{self, FileKind, FormatError, RecordType, Tail};
use drpttracer::format::{auxtrace, code, launch, pdb, summary};
use drpttracer::metadata::{BackendKind, ExtMetadata, PtMetadata, TimeConv};
use pttrace_format::maps::{encode_exec_mappings, MapsEntry};
use pttrace_format::perf_record::{self as perf, Mapping, RecordIter, SIDEBAND_SAMPLE_TYPE as ST};

// ---------------------------------------------------------------------------------------
// Mutation harness
// ---------------------------------------------------------------------------------------

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// What a parser made of a mutant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Rejected,
}
use Outcome::{Accepted, Rejected};

/// Runs `check` on `count` mutants made by `make` from an rng seeded with `seed`. A panic
/// (an assertion included) is caught and reported with the format, seed, case number and
/// the input in hex, after the other cases ran. Returns (accepted, rejected).
fn mutants(
    format: &str,
    seed: u64,
    count: usize,
    mut make: impl FnMut(&mut XorShift) -> Vec<u8>,
    mut check: impl FnMut(usize, &[u8]) -> Outcome,
) -> (usize, usize) {
    let mut rng = XorShift::new(seed);
    let (mut ok, mut err) = (0, 0);
    let mut failed = Vec::new();
    for case in 0..count {
        let m = make(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| check(case, &m))) {
            Ok(Accepted) => ok += 1,
            Ok(Rejected) => err += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!(
                    "{format} seed {seed:#x} case {case}: {msg}\n  input ({} bytes): {}",
                    m.len(),
                    hex(&m)
                ));
                if failed.len() >= 5 {
                    break;
                }
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} mutant(s) panicked:\n{}",
        failed.len(),
        failed.join("\n")
    );
    (ok, err)
}

// ---------------------------------------------------------------------------------------
// Shared inputs
// ---------------------------------------------------------------------------------------

const PID: u32 = 4242;
const TID: u32 = 4243;
const NONCE: u64 = 0x0bad_cafe;

fn loop_prog() -> LoopProgram {
    LoopProgram::new(0x40_0000)
}

fn loop_space(prog: &LoopProgram) -> AddressSpace {
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    space
}

/// The decode of a loop-program trace made of `bits` is exactly the oracle's up to the
/// final return, where the trace ends (the oracle runs on 4 instructions to the next
/// branch that would need trace; the decoder stops at the end of the trace).
fn assert_loop_decode(prog: &LoopProgram, recs: &[Record], bits: &[bool]) {
    let gaps: Vec<&Record> = recs
        .iter()
        .filter(|r| matches!(r, Record::Gap(_)))
        .collect();
    assert!(gaps.is_empty(), "{gaps:?}");
    let expect = prog.simulate(bits);
    let got = common::pcs(recs);
    assert!(expect.len() > 20, "{}", expect.len());
    assert_eq!(got.len() + 4, expect.len());
    assert_eq!(&got[..], &expect[..got.len()]);
}

/// Every gap lies inside `len` bytes and names `source`.
fn check_gaps(recs: &[Record], source: &str, len: u64) {
    for r in recs {
        if let Record::Gap(g) = r {
            assert!(g.pt_offset <= len, "{g} beyond {len}");
            assert!(!g.error.is_empty(), "{g}");
            assert_eq!(g.source, source);
            assert!(g.to_string().starts_with(source), "{g}");
        }
    }
}

fn metadata() -> PtMetadata {
    PtMetadata {
        cpu_family: 6,
        cpu_model: 0x55,
        cpu_stepping: 4,
        time_shift: 10,
        time_mult: 500,
        time_zero: 7,
    }
}

fn ext_metadata() -> ExtMetadata {
    ExtMetadata {
        base: metadata(),
        cpuid_0x15_eax: 2,
        cpuid_0x15_ebx: 0x11c,
        nom_freq: 0x1c,
        mtc_freq: 3,
        time_zero_valid: true,
        backend: BackendKind::Emulated,
        perf_type: 0,
        perf_config: 0,
        sideband_sample_type: ST,
    }
}

fn sample(time: u64) -> perf::SampleId {
    perf::SampleId {
        pid: Some(PID),
        tid: Some(TID),
        time: Some(time),
        cpu: Some(1),
        identifier: Some(7),
        ..Default::default()
    }
}

fn code_sample(time: u64) -> code::SampleId {
    code::SampleId {
        pid: PID,
        tid: TID,
        time,
        cpu: 1,
        id: 7,
    }
}

fn mapping(addr: u64, len: u64, pgoff: u64, prot: u32, filename: &str) -> Mapping {
    Mapping {
        pid: PID,
        tid: TID,
        addr,
        len,
        pgoff,
        maj: 8,
        min: 1,
        ino: 1234,
        ino_generation: 0,
        prot,
        flags: 2,
        filename: filename.into(),
    }
}

const MAPS: &str = "\
00400000-00401000 r--p 00000000 08:01 1234 /bin/prog
00401000-00452000 r-xp 00001000 08:01 1234 /bin/prog
7f1c2a000000-7f1c2a1d0000 r-xp 00028000 08:01 5678 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a400000-7f1c2a401000 rw-p 00000000 00:00 0 
7ffd10000000-7ffd10002000 r-xp 00000000 00:00 0                          [vdso]
7ffd20000000-7ffd20021000 rw-p 00000000 00:00 0                          [stack]
7f1c2b000000-7f1c2b001000 r-xs 00000000 00:05 99 /tmp/a file with spaces
";

const VDSO_ADDR: u64 = 0x7ffd_1000_0000;

fn entry(
    range: (u64, u64),
    perms: &str,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
    path: &str,
) -> MapsEntry {
    let p = perms.as_bytes();
    MapsEntry {
        start: range.0,
        end: range.1,
        read: p[0] == b'r',
        write: p[1] == b'w',
        exec: p[2] == b'x',
        shared: p[3] == b's',
        offset,
        maj: dev.0,
        min: dev.1,
        inode,
        path: path.into(),
    }
}

fn maps_entries() -> Vec<MapsEntry> {
    vec![
        entry((0x40_0000, 0x40_1000), "r--p", 0, (8, 1), 1234, "/bin/prog"),
        entry(
            (0x40_1000, 0x45_2000),
            "r-xp",
            0x1000,
            (8, 1),
            1234,
            "/bin/prog",
        ),
        entry(
            (0x7f1c_2a00_0000, 0x7f1c_2a1d_0000),
            "r-xp",
            0x28000,
            (8, 1),
            5678,
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ),
        entry(
            (0x7f1c_2a40_0000, 0x7f1c_2a40_1000),
            "rw-p",
            0,
            (0, 0),
            0,
            "",
        ),
        entry(
            (VDSO_ADDR, 0x7ffd_1000_2000),
            "r-xp",
            0,
            (0, 0),
            0,
            "[vdso]",
        ),
        entry(
            (0x7ffd_2000_0000, 0x7ffd_2002_1000),
            "rw-p",
            0,
            (0, 0),
            0,
            "[stack]",
        ),
        entry(
            (0x7f1c_2b00_0000, 0x7f1c_2b00_1000),
            "r-xs",
            0,
            (0, 5),
            99,
            "/tmp/a file with spaces",
        ),
    ]
}

/// Whether `text` has an executable maps line whose end is below its start (the
/// reproducer of a fixed panic; such lines are not parsed any more).
fn inverted_exec_mapping(text: &[u8]) -> bool {
    String::from_utf8_lossy(text).lines().any(|l| {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            return false;
        };
        let Some((a, b)) = range.split_once('-') else {
            return false;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            return false;
        };
        perms.as_bytes().get(2) == Some(&b'x') && b < a
    })
}

fn vdso_bytes() -> Vec<u8> {
    (0..64u8).map(|i| i.wrapping_mul(37)).collect()
}

// ---------------------------------------------------------------------------------------
// ptt files: building, byte-level and payload-level mutation, generic checks
// ---------------------------------------------------------------------------------------

/// A frame of raw type `ty` (any value, unlike `ptt::frame_vec`) with a valid CRC.
fn frame(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 12);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(payload);
    let crc = ptt::crc32(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

fn ptt_file(kind: FileKind, frames: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut f = ptt::encode_header(kind).to_vec();
    for (ty, p) in frames {
        f.extend(frame(*ty, p));
    }
    f
}

/// The payload of a `Window` frame (`encode_window` without the frame around it).
fn window_payload(w: &ptt::Window, pt: &[u8], sb: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; ptt::WINDOW_HEAD_SIZE + pt.len() + sb.len() + 4];
    let n = ptt::encode_window(&mut buf, w, pt, sb).unwrap();
    assert_eq!(n, buf.len());
    buf[8..n - 4].to_vec()
}

/// Half the time the file's bytes, half the time one frame's payload (sometimes its type,
/// sometimes a frame dropped or doubled), re-framed with a valid CRC.
fn mutate_ptt(rng: &mut XorShift, kind: FileKind, frames: &[(u16, Vec<u8>)]) -> Vec<u8> {
    if rng.below(2) == 0 {
        return mutate(rng, &ptt_file(kind, frames));
    }
    let mut fr = frames.to_vec();
    let k = rng.below(fr.len() as u64) as usize;
    match rng.below(10) {
        0 => fr[k].0 = rng.below(30) as u16,
        1 => {
            fr.remove(k);
        }
        2 => {
            let dup = fr[k].clone();
            let to = rng.below(fr.len() as u64) as usize;
            fr.insert(to, dup);
        }
        _ => fr[k].1 = mutate(rng, &fr[k].1),
    }
    ptt_file(kind, &fr)
}

/// `ptt::parse` of a mutant: an error names the file (and an offset inside it); frames
/// are contiguous from the header on, lie inside the file with their CRC, and the tail
/// verdict covers exactly the rest.
fn check_ptt_parse<'a>(name: &str, data: &'a [u8]) -> Option<ptt::ParsedFile<'a>> {
    let p = match ptt::parse(name, data) {
        Ok(p) => p,
        Err(e) => {
            assert!(e.to_string().starts_with(name), "{e}");
            match e {
                FormatError::ShortHeader(_, n) => {
                    assert_eq!(n, data.len());
                    assert!(n < ptt::HEADER_SIZE);
                }
                FormatError::BadMagic(_) => assert_ne!(&data[..8], &ptt::MAGIC),
                FormatError::Version(_, v) => assert_ne!(v, ptt::VERSION),
                FormatError::Kind(_, k) => assert!(k != 1 && k != 2),
                FormatError::Record { offset, .. } => assert!(offset < data.len()),
            }
            return None;
        }
    };
    let mut end = ptt::HEADER_SIZE;
    for f in &p.frames {
        assert_eq!(f.offset, end);
        let stop = f.offset + 8 + f.payload.len();
        assert!(stop + 4 <= data.len());
        assert_eq!(&data[f.offset + 8..stop], f.payload);
        assert_eq!(
            u16::from_le_bytes([data[f.offset + 4], data[f.offset + 5]]),
            f.ty
        );
        let crc = u32::from_le_bytes(data[stop..stop + 4].try_into().unwrap());
        assert_eq!(ptt::crc32(&data[f.offset..stop]), crc);
        end = stop + 4;
    }
    match p.tail {
        Tail::Clean => assert_eq!(end, data.len()),
        Tail::Truncated { offset, bytes } | Tail::Corrupt { offset, bytes } => {
            assert_eq!(offset, end);
            assert!(bytes > 0);
            assert_eq!(offset + bytes, data.len());
        }
    }
    Some(p)
}

/// Every frame decoder on every frame's payload: what they return lies inside it.
fn decode_all_frames(p: &ptt::ParsedFile<'_>) {
    for f in &p.frames {
        let pl = f.payload;
        if let Some(w) = ptt::decode_window(pl) {
            let base = pl.as_ptr() as usize;
            assert_eq!(w.pt.as_ptr() as usize - base, ptt::WINDOW_FIXED_SIZE);
            assert_eq!(
                w.sideband.as_ptr() as usize - base,
                ptt::WINDOW_FIXED_SIZE + w.pt.len()
            );
            assert_eq!(
                ptt::WINDOW_FIXED_SIZE + w.pt.len() + w.sideband.len(),
                pl.len()
            );
        } else {
            assert!(pl.len() < ptt::WINDOW_FIXED_SIZE || window_lens_mismatch(pl));
        }
        assert_eq!(ptt::decode_thread_header(pl).is_some(), pl.len() >= 28);
        assert_eq!(ptt::decode_process(pl).is_some(), pl.len() >= 40);
        assert_eq!(ptt::decode_end(pl).is_some(), pl.len() >= 24);
        assert_eq!(ptt::decode_dropped(pl).is_some(), pl.len() >= 16);
        assert_eq!(ptt::decode_clock(pl).is_some(), pl.len() >= 16);
        assert_eq!(ptt::decode_process_end(pl).is_some(), pl.len() >= 8);
        let _ = ptt::decode_patched_sites(pl);
        match ptt::decode_vdso(pl) {
            Some((_, b)) => assert_eq!(b.len() + 8, pl.len()),
            None => assert!(pl.len() < 8),
        }
    }
}

/// A window payload whose PT and sideband lengths do not add up to its size.
fn window_lens_mismatch(pl: &[u8]) -> bool {
    let pt = u64::from(u32::from_le_bytes(pl[96..100].try_into().unwrap()));
    let sb = u64::from(u32::from_le_bytes(pl[100..104].try_into().unwrap()));
    ptt::WINDOW_FIXED_SIZE as u64 + pt + sb != pl.len() as u64
}

// ---------------------------------------------------------------------------------------
// Raw PT
// ---------------------------------------------------------------------------------------

/// The raw PT input: a loop-program trace with a PSB+ every ~250 bytes, and its branches.
fn raw_pt_input(prog: &LoopProgram) -> (Vec<u8>, Vec<bool>) {
    prog.trace(1500, 250, 11)
}

#[test]
fn raw_pt_mutants() {
    let prog = loop_prog();
    let (base, bits) = raw_pt_input(&prog);
    let space = loop_space(&prog);
    let params = TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    // A mapping of a file that does not exist, at the program's address, before the trace.
    let sb = perf::encode_mmap2(
        &mapping(0x40_0000, 0x1000, 0, 5, "/nonexistent/x"),
        &sample(5),
        ST,
    );
    let events = parse_records("sb", &sb, ST).unwrap();
    let name = "trace.pt";
    let decode = |t: &[u8]| -> Vec<Record> {
        PtDecoder::new(
            t,
            params,
            space.clone(),
            events.clone(),
            ImageResolver::default(),
            WindowOptions {
                source: name.into(),
                ..Default::default()
            },
        )
        .unwrap()
        .collect()
    };
    // The valid trace: exactly the oracle's instructions; packets contiguous, no errors.
    assert_loop_decode(&prog, &decode(&base), &bits);
    let lines = list_packets(&base);
    let mut at = 0u64;
    for l in &lines {
        match l {
            PacketLine::Packet { offset, size, .. } => {
                assert_eq!(*offset, at);
                at += u64::from(*size);
            }
            PacketLine::Error { .. }
            | PacketLine::Unlisted { .. }
            | PacketLine::Diagnostic { .. } => panic!("{l}"),
        }
    }
    assert_eq!(at, base.len() as u64);
    assert!(matches!(&lines[0], PacketLine::Packet { name: "psb", .. }));

    let (mut gaps, mut insns) = (0usize, 0usize);
    mutants(
        "raw PT",
        0x5eed_0001,
        2000,
        |rng| mutate(rng, &base),
        |_, t| {
            let recs = decode(t);
            check_gaps(&recs, name, t.len() as u64);
            gaps += recs.iter().filter(|r| matches!(r, Record::Gap(_))).count();
            insns += recs.iter().filter(|r| r.as_instruction().is_some()).count();
            // Packets follow each other inside the trace; after an error the listing
            // resyncs at a PSB (found by libipt, possibly inside bytes already listed).
            let mut next: Option<u64> = None;
            for l in list_packets(t) {
                match l {
                    PacketLine::Packet {
                        offset, size, name, ..
                    } => {
                        match next {
                            Some(n) => assert_eq!(offset, n),
                            None => assert_eq!(name, "psb"),
                        }
                        assert!(offset + u64::from(size) <= t.len() as u64);
                        next = Some(offset + u64::from(size));
                    }
                    PacketLine::Error {
                        offset,
                        error,
                        context,
                    } => {
                        assert!(offset <= t.len() as u64, "{offset}");
                        assert!(!error.is_empty());
                        assert!(matches!(context, "error decoding packet" | "sync error"));
                        next = None;
                    }
                    PacketLine::Unlisted { offset, why } => {
                        assert_eq!(offset, 0);
                        assert!(!why.is_empty());
                        next = None;
                    }
                    // (Only with the last-IP or time columns, not asked for here.)
                    PacketLine::Diagnostic { .. } => panic!("{l}"),
                }
            }
            Accepted
        },
    );
    // The mutations exercised both decoding and its error paths.
    assert!(gaps > 500, "{gaps}");
    assert!(insns > 50_000, "{insns}");
}

// ---------------------------------------------------------------------------------------
// ptt thread file
// ---------------------------------------------------------------------------------------

struct ThreadInput {
    frames: Vec<(u16, Vec<u8>)>,
    header: ptt::ThreadHeader,
    windows: Vec<(ptt::Window, Vec<u8>, Vec<u8>)>,
    bits: Vec<Vec<bool>>,
}

/// The loads and stores window 0 of [`thread_input`] carries.
fn window_accesses(prog: &LoopProgram) -> Vec<drpttracer::format::memory::Access> {
    (0..5u64)
        .map(|i| drpttracer::format::memory::Access {
            pc: prog.base + i,
            addr: 0x7ffd_0000_1000 - 8 * i,
            size_shift: 3,
            store: i % 2 == 0,
            again: i == 4,
        })
        .collect()
}

fn thread_input(prog: &LoopProgram) -> ThreadInput {
    let header = ptt::ThreadHeader {
        pid: PID as i32,
        tid: TID as i32,
        mode: 0,
        window: 1,
        backend: ptt::BACKEND_QEMU,
        pt_present: true,
        nonce: NONCE,
        start_tsc: 1000,
        pt_absent_reason: String::new(),
    };
    let (pt0, bits0) = prog.trace(400, 200, 1);
    let (pt1, bits1) = prog.trace(300, 150, 2);
    // Window 0's sideband: the executed code (QEMU's code record), a mapping of a file
    // that is not there, and loads and stores (`run --memory`).
    let mut sb0 = Vec::new();
    code::push_code_record(&mut sb0, prog.base, &prog.code, &code_sample(1100)).unwrap();
    sb0.extend(perf::encode_mmap2(
        &mapping(0x7f00_0000_0000, 0x1000, 0, 5, "/nonexistent/lib.so"),
        &sample(1100),
        ST,
    ));
    let mut enc = drpttracer::format::memory::Encoder::default();
    for a in window_accesses(prog) {
        enc.push(a, &mut sb0);
    }
    enc.finish(&mut sb0);
    let win = |index: u64, nr: u64, ret: i64, flags: u32| ptt::Window {
        index,
        nr,
        args: [3, 0x7ffd_0000_1000, 64, index, 0, 0],
        ret,
        tsc_start: 1100 + 100 * index,
        tsc_end: 1150 + 100 * index,
        flags,
        depth: 0,
    };
    let windows = vec![
        (win(0, 0, 64, 0), pt0, sb0),
        (win(1, 1, 64, ptt::WF_PT_LOST), pt1, Vec::new()),
        (
            win(2, 60, 0, ptt::WF_NO_RETURN | ptt::WF_NO_SYSCALL),
            Vec::new(),
            Vec::new(),
        ),
    ];
    let mut dropped = [0u8; 16];
    dropped[..8].copy_from_slice(&2u64.to_le_bytes());
    dropped[8..].copy_from_slice(&2u64.to_le_bytes());
    let wp = |k: usize| {
        let (w, pt, sb) = &windows[k];
        (RecordType::Window as u16, window_payload(w, pt, sb))
    };
    let frames = vec![
        (
            RecordType::ThreadHeader as u16,
            ptt::thread_header_payload(&header),
        ),
        wp(0),
        wp(1),
        (RecordType::Dropped as u16, dropped.to_vec()),
        wp(2),
        (
            RecordType::End as u16,
            ptt::end_payload(ptt::EndReason::ThreadExit, 3, 2).to_vec(),
        ),
    ];
    ThreadInput {
        frames,
        header,
        windows,
        bits: vec![bits0, bits1],
    }
}

/// `read_windows` of a file `ptt::parse` accepted as a thread file: exactly its Window
/// frames, or an error at the first malformed one.
fn check_read_windows(name: &str, data: &[u8], p: &ptt::ParsedFile<'_>) -> Outcome {
    let r = ptt_input::read_windows(name, data);
    if p.kind != FileKind::Thread {
        let e = r.unwrap_err();
        assert_eq!((e.source_name.as_str(), e.offset), (name, 12));
        return Rejected;
    }
    let wf: Vec<&ptt::Frame<'_>> = p
        .frames
        .iter()
        .filter(|f| f.ty == RecordType::Window as u16)
        .collect();
    match wf.iter().find(|f| ptt::decode_window(f.payload).is_none()) {
        Some(bad) => {
            let e = r.unwrap_err();
            assert!(e.to_string().starts_with(name), "{e}");
            assert_eq!(e.offset, bad.offset as u64);
            Rejected
        }
        None => {
            let ws = r.unwrap();
            assert_eq!(ws.len(), wf.len());
            for (w, f) in ws.iter().zip(&wf) {
                let at = w.pt_file_offset as usize;
                assert_eq!(at, f.offset + 8 + ptt::WINDOW_FIXED_SIZE);
                assert_eq!(&data[at..at + w.pt.len()], w.pt);
                let sb_at = at + w.pt.len();
                assert_eq!(&data[sb_at..sb_at + w.sideband.len()], w.sideband);
                // The window's sideband as the decoder reads it.
                let src = format!("{name} window {}", w.window.index);
                if let Err(e) = parse_records(&src, w.sideband, ST) {
                    assert!(e.to_string().starts_with(&src), "{e}");
                    assert!(e.offset < w.sideband.len() as u64);
                }
            }
            Accepted
        }
    }
}

#[test]
fn ptt_thread_file_mutants() {
    let prog = loop_prog();
    let input = thread_input(&prog);
    let base = ptt_file(FileKind::Thread, &input.frames);
    let name = "4242-0badcafe-4243.ptt";

    // The valid file, exactly.
    let p = check_ptt_parse(name, &base).unwrap();
    assert_eq!(
        (p.kind, p.version, &p.tail),
        (FileKind::Thread, 1, &Tail::Clean)
    );
    let types: Vec<u16> = p.frames.iter().map(|f| f.ty).collect();
    assert_eq!(types, [1, 2, 2, 3, 2, 4]);
    assert_eq!(
        ptt::decode_thread_header(p.frames[0].payload).unwrap(),
        input.header
    );
    for (f, (w, pt, sb)) in [1, 2, 4].iter().map(|&k| &p.frames[k]).zip(&input.windows) {
        let got = ptt::decode_window(f.payload).unwrap();
        assert_eq!(
            got,
            ptt::WindowRecord {
                window: *w,
                pt,
                sideband: sb
            }
        );
    }
    assert_eq!(ptt::decode_dropped(p.frames[3].payload), Some((2, 2)));
    assert_eq!(ptt::decode_end(p.frames[5].payload), Some((0, 3, 2)));
    let ws = ptt_input::read_windows(name, &base).unwrap();
    assert_eq!(ws.len(), 3);
    for (w, (win, pt, sb)) in ws.iter().zip(&input.windows) {
        assert_eq!((&w.window, w.pt, w.sideband), (win, &pt[..], &sb[..]));
        let at = w.pt_file_offset as usize;
        assert_eq!(&base[at..at + pt.len()], &pt[..]);
    }
    let events = parse_records(name, ws[0].sideband, ST).unwrap();
    assert_eq!(
        events.iter().map(|e| &e.change).collect::<Vec<_>>(),
        [
            &ImageChange::Code {
                addr: prog.base,
                bytes: prog.code.clone()
            },
            &ImageChange::Map {
                addr: 0x7f00_0000_0000,
                len: 0x1000,
                pgoff: 0,
                filename: "/nonexistent/lib.so".into()
            }
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, &base).unwrap();
    let s = summary::summarize_thread(&path).unwrap();
    assert_eq!(s.file, path.display().to_string());
    assert_eq!(s.header.as_ref(), Some(&input.header));
    assert_eq!(
        (s.windows, s.lossy_windows, s.vfork_child_windows),
        (3, 1, 0)
    );
    assert_eq!(
        (s.pt_bytes, s.sideband_bytes),
        (
            (input.windows[0].1.len() + input.windows[1].1.len()) as u64,
            input.windows[0].2.len() as u64
        )
    );
    assert_eq!(s.dropped, 2);
    assert_eq!(s.per_syscall, [(0, 1), (1, 1)].into_iter().collect());
    assert_eq!((s.end, &s.tail), (Some((0, 3, 2)), &Tail::Clean));

    let (ok, err) = mutants(
        "ptt thread file",
        0x5eed_0002,
        4000,
        |rng| mutate_ptt(rng, FileKind::Thread, &input.frames),
        |case, data| {
            let Some(p) = check_ptt_parse(name, data) else {
                return Rejected;
            };
            decode_all_frames(&p);
            let out = check_read_windows(name, data, &p);
            if case % 10 == 0 {
                check_streaming(&path, data, &p);
            }
            out
        },
    );
    assert!(ok > 1000 && err > 500, "{ok} {err}");
}

/// The streaming reader and `summarize_thread` on `data` written to `path` agree with
/// `ptt::parse` (`p`).
fn check_streaming(path: &Path, data: &[u8], p: &ptt::ParsedFile<'_>) {
    std::fs::write(path, data).unwrap();
    let shown = path.display().to_string();
    let mut seen = Vec::new();
    let r = ptt::stream_frames(path, FileKind::Thread, |f| {
        seen.push((f.offset, f.ty, f.payload.to_vec()));
        Ok(())
    });
    let s = summary::summarize_thread(path);
    if p.kind != FileKind::Thread {
        for e in [r.unwrap_err(), s.unwrap_err()] {
            assert!(matches!(e, FormatError::Record { offset: 12, .. }), "{e}");
            assert!(e.to_string().starts_with(&shown), "{e}");
        }
        return;
    }
    let want: Vec<_> = p
        .frames
        .iter()
        .map(|f| (f.offset, f.ty, f.payload.to_vec()))
        .collect();
    assert_eq!(seen, want);
    assert_eq!(r.unwrap(), p.tail);
    // summarize_thread fails at a frame whose record it cannot decode, no later than the
    // first ThreadHeader, Window, Dropped or End that does not decode.
    let bad = p.frames.iter().find(|f| {
        let pl = f.payload;
        match RecordType::from_raw(f.ty) {
            Some(RecordType::ThreadHeader) => ptt::decode_thread_header(pl).is_none(),
            Some(RecordType::Window) => ptt::decode_window(pl).is_none(),
            Some(RecordType::Dropped) => ptt::decode_dropped(pl).is_none(),
            Some(RecordType::End) => ptt::decode_end(pl).is_none(),
            _ => false,
        }
    });
    match s {
        Ok(s) => {
            assert!(bad.is_none(), "{bad:?}");
            assert_eq!(s.tail, p.tail);
            let windows = p
                .frames
                .iter()
                .filter(|f| f.ty == RecordType::Window as u16)
                .count();
            assert_eq!(s.windows, windows as u64);
        }
        Err(e) => {
            assert!(e.to_string().starts_with(&shown), "{e}");
            let FormatError::Record { offset, .. } = e else {
                panic!("{e}");
            };
            assert!(p.frames.iter().any(|f| f.offset == offset), "{offset}");
            assert!(bad.is_none_or(|b| offset <= b.offset), "{offset} {bad:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// ptt process info file
// ---------------------------------------------------------------------------------------

fn process_record() -> ptt::ProcessRecord {
    ptt::ProcessRecord {
        pid: PID as i32,
        ppid: 1,
        nonce: NONCE,
        start_tsc: 1000,
        start_monotonic_ns: 5_000_000,
        mode: 0,
        window: 1,
        backend: ptt::BACKEND_QEMU,
        pt_present: true,
        pt_absent_reason: String::new(),
    }
}

fn info_frames() -> Vec<(u16, Vec<u8>)> {
    let clock = |ns: u64, tsc: u64| {
        let mut v = ns.to_le_bytes().to_vec();
        v.extend_from_slice(&tsc.to_le_bytes());
        (RecordType::Clock as u16, v)
    };
    let mut vdso = VDSO_ADDR.to_le_bytes().to_vec();
    vdso.extend(vdso_bytes());
    vec![
        (
            RecordType::Process as u16,
            ptt::process_payload(&process_record()),
        ),
        (
            RecordType::Cmdline as u16,
            b"/bin/prog\0-v\0file name\0".to_vec(),
        ),
        (RecordType::Exe as u16, b"/bin/prog".to_vec()),
        (RecordType::Maps as u16, MAPS.as_bytes().to_vec()),
        (RecordType::Vdso as u16, vdso),
        (
            RecordType::Metadata as u16,
            ext_metadata()
                .record_bytes_with_backend(ptt::BACKEND_QEMU)
                .to_vec(),
        ),
        clock(1, 1000),
        (
            RecordType::Config as u16,
            b"PTTRACER_MODE=user\nPTTRACER_WINDOW=thread\n".to_vec(),
        ),
        clock(2_000_000, 3000),
        (
            RecordType::ProcessEnd as u16,
            ptt::process_end_payload(ptt::EndReason::ExitGroup, 0, 7, 1).to_vec(),
        ),
        (
            RecordType::Note as u16,
            b"execve of /bin/x not traced".to_vec(),
        ),
    ]
}

/// The image events `read_process` makes of the exec lines of `MAPS` (time 0, cpu 0).
fn maps_events() -> Vec<ImageEvent> {
    maps_entries()
        .into_iter()
        .filter(|m| m.exec)
        .map(|m| ImageEvent {
            time: Some(0),
            cpu: Some(0),
            change: ImageChange::Map {
                addr: m.start,
                len: m.end - m.start,
                pgoff: m.offset,
                filename: m.path,
            },
        })
        .collect()
}

/// `read_process` of a file `ptt::parse` accepted: an error exactly at the first frame
/// whose record is malformed, else the values of the last Metadata and Vdso records.
fn check_read_process(name: &str, data: &[u8], p: &ptt::ParsedFile<'_>) -> Outcome {
    let r = ptt_input::read_process(name, data);
    if p.kind != FileKind::ProcessInfo {
        let e = r.unwrap_err();
        assert_eq!((e.source_name.as_str(), e.offset), (name, 12));
        return Rejected;
    }
    let bad = p.frames.iter().find(|f| {
        let n = f.payload.len();
        match RecordType::from_raw(f.ty) {
            Some(RecordType::Process) => n < 40,
            Some(RecordType::Metadata) => n < 50,
            Some(RecordType::Vdso) => n < 8,
            _ => false,
        }
    });
    if let Some(bad) = bad {
        let e = r.unwrap_err();
        assert!(e.to_string().starts_with(name), "{e}");
        assert_eq!(e.offset, bad.offset as u64, "{e}");
        return Rejected;
    }
    let got = r.unwrap();
    let last = |ty: RecordType| p.frames.iter().rev().find(|f| f.ty == ty as u16);
    if let Some(m) = last(RecordType::Metadata) {
        let b = m.payload;
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let c = &got.params.cpu;
        assert_eq!((c.family, c.model, c.stepping), (u16_at(0), b[2], b[3]));
        assert_eq!(
            (c.cpuid_0x15_eax, c.cpuid_0x15_ebx),
            (u32_at(18), u32_at(22))
        );
        assert_eq!((c.nom_freq, c.mtc_freq), (b[26], b[27]));
        assert_eq!(got.sideband_sample_type, u64_at(42));
        let time = (b[28] != 0 && u32_at(6) != 0).then_some(TimeConv {
            time_shift: u16_at(4),
            time_mult: u32_at(6),
            time_zero: u64_at(10),
        });
        assert_eq!(got.params.time, time);
    } else {
        assert_eq!(got.params, TraceParams::default());
    }
    match last(RecordType::Vdso) {
        Some(v) => assert_eq!(
            got.vdso,
            Some((
                u64::from_le_bytes(v.payload[..8].try_into().unwrap()),
                v.payload[8..].to_vec()
            ))
        ),
        None => assert_eq!(got.vdso, None),
    }
    for ev in &got.initial_events {
        assert_eq!((ev.time, ev.cpu), (Some(0), Some(0)));
        assert!(matches!(ev.change, ImageChange::Map { .. }), "{ev:?}");
    }
    Accepted
}

#[test]
fn ptt_info_file_mutants() {
    let frames = info_frames();
    let base = ptt_file(FileKind::ProcessInfo, &frames);
    let name = "4242-0badcafe.info";

    let p = check_ptt_parse(name, &base).unwrap();
    assert_eq!((p.kind, &p.tail), (FileKind::ProcessInfo, &Tail::Clean));
    assert_eq!(p.frames.len(), frames.len());
    assert_eq!(
        ptt::decode_process(p.frames[0].payload),
        Some(process_record())
    );
    let got = ptt_input::read_process(name, &base).unwrap();
    assert_eq!(got.params, TraceParams::from_ext_metadata(&ext_metadata()));
    assert_eq!(got.sideband_sample_type, ST);
    assert_eq!(got.vdso, Some((VDSO_ADDR, vdso_bytes())));
    assert_eq!(got.initial_events, maps_events());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, &base).unwrap();
    let s = summary::summarize_process(&path).unwrap();
    assert_eq!(s.file, path.display().to_string());
    assert_eq!(s.process, Some(process_record()));
    assert_eq!(s.cmdline, ["/bin/prog", "-v", "file name"]);
    assert_eq!(
        (s.exe.as_str(), s.maps_lines, s.vdso_bytes),
        ("/bin/prog", 7, 64)
    );
    assert!(s.has_metadata);
    assert_eq!(s.config, "PTTRACER_MODE=user\nPTTRACER_WINDOW=thread\n");
    assert_eq!((s.end, s.patched_sites), (Some((1, 0)), 7));
    assert_eq!(s.clocks, [(1, 1000), (2_000_000, 3000)]);
    assert_eq!(s.notes, ["execve of /bin/x not traced"]);
    assert_eq!(s.tail, Tail::Clean);

    let (ok, err) = mutants(
        "ptt info file",
        0x5eed_0003,
        4000,
        |rng| mutate_ptt(rng, FileKind::ProcessInfo, &frames),
        |case, data| {
            let Some(p) = check_ptt_parse(name, data) else {
                return Rejected;
            };
            decode_all_frames(&p);
            if case % 10 == 0 {
                std::fs::write(&path, data).unwrap();
                match summary::summarize_process(&path) {
                    Ok(s) => {
                        assert_eq!(p.kind, FileKind::ProcessInfo);
                        assert_eq!(s.tail, p.tail);
                    }
                    Err(e) => {
                        assert!(matches!(e, FormatError::Record { offset: 12, .. }), "{e}");
                        assert!(e.to_string().starts_with(&path.display().to_string()));
                    }
                }
            }
            check_read_process(name, data, &p)
        },
    );
    assert!(ok > 2000 && err > 150, "{ok} {err}");
}

#[test]
fn ext_metadata_record_mutants() {
    let md = ext_metadata().record_bytes();
    let name = "md.info";
    let frames = |payload: Vec<u8>| {
        vec![
            (
                RecordType::Process as u16,
                ptt::process_payload(&process_record()),
            ),
            (RecordType::Metadata as u16, payload),
        ]
    };
    let base = ptt_file(FileKind::ProcessInfo, &frames(md.to_vec()));
    let got = ptt_input::read_process(name, &base).unwrap();
    assert_eq!(got.params, TraceParams::from_ext_metadata(&ext_metadata()));
    let (ok, err) = mutants(
        "ext metadata record",
        0x5eed_0004,
        2000,
        |rng| ptt_file(FileKind::ProcessInfo, &frames(mutate(rng, &md))),
        |_, data| check_read_process(name, data, &check_ptt_parse(name, data).unwrap()),
    );
    assert!(ok > 300 && err > 300, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// ptt output directory: info + thread file decoded together
// ---------------------------------------------------------------------------------------

#[test]
fn ptt_directory_mutants() {
    let prog = loop_prog();
    let input = thread_input(&prog);
    let info = info_frames();
    let dir = tempfile::tempdir().unwrap();
    let sysroot = dir.path().join("sysroot");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let info_path = out.join("4242-0badcafe.info");
    let thread_path = out.join("4242-0badcafe-4243.ptt");
    let write = |i: &[u8], t: &[u8]| {
        std::fs::write(&info_path, i).unwrap();
        std::fs::write(&thread_path, t).unwrap();
    };
    let open = || {
        ptt_dir::open(&out).map(|mut t| {
            t.sysroot = Some(sysroot.clone());
            t
        })
    };
    let info_base = ptt_file(FileKind::ProcessInfo, &info);
    let thread_base = ptt_file(FileKind::Thread, &input.frames);

    // The valid pair, exactly.
    write(&info_base, &thread_base);
    let t = open().unwrap();
    assert_eq!(t.processes.len(), 1);
    let pr = &t.processes[0];
    assert_eq!((pr.pid, pr.nonce), (PID as i32, NONCE));
    assert_eq!(pr.maps, maps_entries());
    assert_eq!(pr.vdso, Some((VDSO_ADDR, vdso_bytes())));
    assert_eq!(pr.metadata, Some(metadata()));
    assert_eq!(pr.cmdline, "/bin/prog -v file name");
    assert_eq!(t.threads.len(), 1);
    assert_eq!(t.threads[0].header, input.header);
    let windows = t.collect_thread(&t.threads[0]).unwrap();
    assert_eq!(windows.len(), 3);
    for (k, (info, recs)) in windows.iter().enumerate() {
        let (w, pt, sb) = &input.windows[k];
        assert_eq!(
            *info,
            ptt_dir::PttWindowInfo {
                pid: PID as i32,
                tid: TID as i32,
                index: w.index,
                nr: w.nr,
                ret: w.ret,
                flags: w.flags,
                pt_len: pt.len(),
                sideband_len: sb.len(),
                memory: if k == 0 {
                    drpttracer::format::memory::Packed::of(&window_accesses(&prog))
                } else {
                    Default::default()
                },
            }
        );
        match input.bits.get(k) {
            // Window 1 has no code record of its own: it decodes with the code that window
            // 0's sideband put into the image.
            Some(bits) => {
                assert_eq!(recs[0], Record::WindowId(k as u64));
                assert_loop_decode(&prog, recs, bits);
            }
            None => assert!(recs.is_empty()),
        }
    }
    let stats = t.decode_thread(&t.threads[0], &mut |_, _| Ok(())).unwrap();
    let missing = |p: &str| format!("cannot open {}", sysroot.join(p).display());
    assert_eq!(
        (stats.windows, stats.windows_with_pt, stats.dropped),
        (3, 2, 2)
    );
    assert_eq!(stats.bad_tail, None);
    assert_eq!(
        stats.warnings,
        [
            missing("bin/prog"),
            missing("usr/lib/x86_64-linux-gnu/libc.so.6"),
            missing("tmp/a file with spaces"),
            missing("nonexistent/lib.so"),
        ]
    );

    let (mut gaps, mut insns) = (0usize, 0usize);
    let (ok, err) = mutants(
        "ptt directory (info file + thread file, one mutated; first byte: 0 info, 1 thread)",
        0x5eed_0005,
        300,
        |rng| {
            let which = rng.below(2) as u8;
            let mut m = vec![which];
            m.extend(if which == 0 {
                mutate_ptt(rng, FileKind::ProcessInfo, &info)
            } else {
                mutate_ptt(rng, FileKind::Thread, &input.frames)
            });
            m
        },
        |_, m| {
            let (i, th) = if m[0] == 0 {
                (&m[1..], &thread_base[..])
            } else {
                (&info_base[..], &m[1..])
            };
            write(i, th);
            // A directory's unusable files are left out and named (`skipped`).
            let t = match open().and_then(|t| match t.skipped.first() {
                Some(e) if t.threads.is_empty() => Err(e.clone()),
                _ => Ok(t),
            }) {
                Ok(t) => t,
                Err(e) => {
                    let s = e.to_string();
                    assert!(s.starts_with(&out.display().to_string()), "{s}");
                    // An offset inside the mutated file or at its end (a missing record):
                    // `m` is the file and one selector byte.
                    assert!(e.offset < m.len() as u64, "{s}");
                    return Rejected;
                }
            };
            let th_path = thread_path.display().to_string();
            let r = t.decode_thread(&t.threads[0], &mut |info, dec| {
                if let Some(d) = dec {
                    let recs: Vec<Record> = d.collect();
                    let src = format!("{th_path} window {}", info.index);
                    check_gaps(&recs, &src, th.len() as u64);
                    gaps += recs.iter().filter(|r| matches!(r, Record::Gap(_))).count();
                    insns += common::pcs(&recs).len();
                }
                Ok(())
            });
            match r {
                Ok(stats) => {
                    assert!(stats.windows_with_pt <= stats.windows);
                    Accepted
                }
                Err(e) => {
                    assert!(e.to_string().starts_with(&th_path), "{e}");
                    assert!(e.offset < th.len() as u64, "{e}");
                    Rejected
                }
            }
        },
    );
    assert!(ok > 100 && err > 20, "{ok} {err}");
    assert!(gaps >= 5 && insns > 100_000, "{gaps} {insns}");
}

// ---------------------------------------------------------------------------------------
// DynamoRIO .raw.pt
// ---------------------------------------------------------------------------------------

/// A `.raw.pt` file of three syscalls (3 arguments and PT, no arguments and PT, 6
/// arguments and no PT), and the two PT windows.
fn pdb_input(prog: &LoopProgram) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (pt0, _) = prog.trace(300, 150, 3);
    let (pt1, _) = prog.trace(200, 100, 4);
    let mut w = pdb::PdbWriter::new(u64::from(PID), u64::from(TID), &metadata());
    w.syscall(
        u64::from(PID),
        u64::from(TID),
        0,
        0,
        &[3, 0x7ffd_0000, 64],
        &pt0,
    )
    .syscall(u64::from(PID), u64::from(TID), 1, 1, &[], &pt1)
    .syscall(u64::from(PID), u64::from(TID), 60, 2, &[0; 6], &[]);
    (w.buf, pt0, pt1)
}

#[test]
fn pdb_mutants() {
    let prog = loop_prog();
    let (base, pt0, pt1) = pdb_input(&prog);

    let f = pdb::parse(&base).unwrap();
    let p0 = 42 + 48 + 24;
    let p1 = p0 + pt0.len() + 48;
    let p2 = p1 + pt1.len() + 48 + 48;
    let win = |sysnum, syscall_idx, args: &[u64], pt| pdb::SyscallPdb {
        pid: u64::from(PID),
        tid: u64::from(TID),
        sysnum,
        syscall_idx,
        args: args.to_vec(),
        pt,
    };
    assert_eq!(
        f,
        pdb::RawPtFile {
            pid: u64::from(PID),
            tid: u64::from(TID),
            metadata: metadata(),
            windows: vec![
                win(0, 0, &[3, 0x7ffd_0000, 64], p0..p0 + pt0.len()),
                win(1, 1, &[], p1..p1 + pt1.len()),
                win(60, 2, &[0; 6], p2..p2),
            ],
        }
    );
    assert_eq!(p2, base.len());

    let (ok, err) = mutants(
        "pdb .raw.pt",
        0x5eed_0006,
        3000,
        |rng| mutate(rng, &base),
        |_, d| match pdb::parse(d) {
            Ok(f) => {
                assert_eq!(Some(f.metadata), PtMetadata::from_bytes(&d[24..]));
                let entry = |at: usize| {
                    pdb::split_entry(u64::from_le_bytes(d[at..at + 8].try_into().unwrap())).1
                };
                assert_eq!((f.pid, f.tid), (entry(0), entry(8)));
                // PDBs follow each other from the metadata on, each inside the file.
                let mut pos = 42;
                for w in &f.windows {
                    let start = pos + 48 + 8 * w.args.len();
                    assert_eq!(w.pt.start, start);
                    assert!(w.pt.start <= w.pt.end && w.pt.end <= d.len());
                    assert_eq!((w.pid, w.tid), (entry(pos), entry(pos + 8)));
                    for (k, a) in w.args.iter().enumerate() {
                        let at = pos + 48 + 8 * k;
                        assert_eq!(*a, u64::from_le_bytes(d[at..at + 8].try_into().unwrap()));
                    }
                    pos = w.pt.end;
                }
                assert_eq!(pos, d.len());
                Accepted
            }
            Err(e) => {
                assert!(e.offset <= d.len() as u64, "{e} in {} bytes", d.len());
                assert!(e.to_string().contains(&format!("{:#x}", e.offset)), "{e}");
                Rejected
            }
        },
    );
    assert!(ok > 200 && err > 1000, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// perf AUXTRACE
// ---------------------------------------------------------------------------------------

/// A perf.data file: the 104-byte `PERFILE2` header whose data section holds `data`,
/// then a feature section that is not part of the data.
fn perf_data(data: &[u8]) -> Vec<u8> {
    let mut f = b"PERFILE2".to_vec();
    for v in [104u64, 136, 0, 0, 104, data.len() as u64, 0, 0] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    f.resize(104, 0);
    f.extend_from_slice(data);
    f.extend_from_slice(&[0xee; 40]);
    f
}

/// An AUXTRACE stream: a COMM record, two AUXTRACE records (256 + 244 bytes of PT), a
/// LOST record, one more AUXTRACE record (200 bytes).
struct AuxInput {
    pt: Vec<u8>,
    stream: Vec<u8>,
    /// Length of the COMM record.
    comm: usize,
    lost: Vec<u8>,
}

fn aux_input(prog: &LoopProgram) -> AuxInput {
    let (pt, _) = prog.trace(700, 200, 5);
    let mut stream = perf::encode_comm(PID, TID, "prog", true, &sample(1), ST);
    let comm = stream.len();
    stream.extend(auxtrace::wrap(&pt[..500], 256, TID, 3));
    let lost = perf::encode_lost(7, 1, &sample(2), ST);
    stream.extend(&lost);
    let mut second = auxtrace::wrap(&pt[500..], 256, TID, 3);
    // The second run continues the AUX stream: its offset field says so.
    second[16..24].copy_from_slice(&500u64.to_le_bytes());
    stream.extend(second);
    AuxInput {
        pt,
        stream,
        comm,
        lost,
    }
}

#[test]
fn auxtrace_mutants() {
    let prog = loop_prog();
    let AuxInput {
        pt,
        stream,
        comm,
        lost,
    } = aux_input(&prog);
    let file = perf_data(&stream);

    // The chunks: 256 + 244 bytes, LOST, 200 bytes.
    let chunk = |file_offset, len, aux_offset| auxtrace::AuxChunk {
        file_offset,
        len,
        aux_offset,
        idx: 0,
        tid: TID,
        cpu: 3,
    };
    let c0 = comm + 48;
    let c1 = c0 + 256 + 48;
    let c2 = c1 + 244 + lost.len() + 48;
    let want = |shift: usize| auxtrace::AuxTrace {
        pt: pt.clone(),
        chunks: vec![
            chunk(c0 + shift, 256, 0),
            chunk(c1 + shift, 244, 256),
            chunk(c2 + shift, 200, 500),
        ],
    };
    assert_eq!(auxtrace::unwrap(&stream).unwrap(), want(0));
    let a = auxtrace::unwrap(&file).unwrap();
    assert_eq!(a, want(104));
    assert_eq!(a.cpu(), Some(3));
    assert_eq!(a.file_offset(300), Some((c1 + 104 + 44) as u64));
    assert_eq!(a.file_offset(700), None);

    let (ok, err) = mutants(
        "perf AUXTRACE",
        0x5eed_0007,
        3000,
        |rng| {
            if rng.below(2) == 0 {
                mutate(rng, &stream)
            } else {
                mutate(rng, &file)
            }
        },
        |_, d| match auxtrace::unwrap(d) {
            Ok(a) => {
                let mut pt = Vec::new();
                for c in &a.chunks {
                    assert!(c.file_offset >= 48 && c.file_offset + c.len <= d.len());
                    let at = pt.len() as u64;
                    pt.extend_from_slice(&d[c.file_offset..c.file_offset + c.len]);
                    if c.len > 0 {
                        assert_eq!(a.file_offset(at), Some(c.file_offset as u64));
                    }
                }
                assert_eq!(a.pt, pt);
                assert_eq!(a.file_offset(pt.len() as u64), None);
                Accepted
            }
            Err(e) => {
                // The perf.data header's missing field is named by its offset (40 or 48),
                // which a file shorter than the header does not reach.
                let header = e.message.contains("perf.data header truncated");
                assert!(
                    e.offset < d.len() as u64 || (header && d.len() < 56),
                    "{e} in {} bytes",
                    d.len()
                );
                assert!(e.to_string().contains(&format!("{:#x}", e.offset)), "{e}");
                Rejected
            }
        },
    );
    assert!(ok > 200 && err > 1000, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// perf sideband records
// ---------------------------------------------------------------------------------------

/// A sideband stream of COMM (exec), MMAP2 (exec), MMAP2 (data), TEXT_POKE, LOST, AUX
/// (truncated), AUX (complete), COMM and MMAP2 records (the last one the earliest), and its
/// three mappings (libc, data, program).
fn sideband_input() -> (Vec<u8>, [Mapping; 3]) {
    let mut sb = perf::encode_comm(PID, TID, "prog", true, &sample(5), ST);
    let libc = mapping(
        0x7f00_0000_0000,
        0x1d_0000,
        0x28000,
        5,
        "/usr/lib/libc.so.6",
    );
    sb.extend(perf::encode_mmap2(&libc, &sample(10), ST));
    let data = mapping(0x60_0000, 0x1000, 0, 3, "/data");
    sb.extend(perf::encode_mmap2(&data, &sample(11), ST));
    code::push_code_record(&mut sb, 0x40_1000, &[0x90, 0xc3], &code_sample(12)).unwrap();
    sb.extend(perf::encode_lost(7, 3, &sample(13), ST));
    sb.extend(perf::encode_aux(
        0,
        0x1000,
        perf::PERF_AUX_FLAG_TRUNCATED,
        &sample(14),
        ST,
    ));
    sb.extend(perf::encode_aux(0x1000, 0x1000, 0, &sample(15), ST));
    sb.extend(perf::encode_comm(
        PID,
        TID + 1,
        "worker",
        false,
        &sample(16),
        ST,
    ));
    let prog_map = mapping(0x40_0000, 0x1000, 0, 5, "/bin/prog");
    sb.extend(perf::encode_mmap2(&prog_map, &sample(3), ST));
    (sb, [libc, data, prog_map])
}

#[test]
fn sideband_mutants() {
    let (sb, [libc, data, prog_map]) = sideband_input();
    let name = "perf-sideband.bin";

    // The valid stream: every record, then the image events sorted by time.
    let recs: Vec<perf::Record> = RecordIter::new(&sb, ST)
        .map(|r| r.unwrap().1.record)
        .collect();
    assert_eq!(
        recs,
        [
            perf::Record::Comm {
                pid: PID,
                tid: TID,
                comm: "prog".into(),
                exec: true
            },
            perf::Record::Mmap2(libc.clone()),
            perf::Record::Mmap2(data),
            perf::Record::TextPoke {
                addr: 0x40_1000,
                bytes: vec![0x90, 0xc3]
            },
            perf::Record::Lost { id: 7, lost: 3 },
            perf::Record::Aux {
                aux_offset: 0,
                aux_size: 0x1000,
                flags: 1
            },
            perf::Record::Aux {
                aux_offset: 0x1000,
                aux_size: 0x1000,
                flags: 0
            },
            perf::Record::Comm {
                pid: PID,
                tid: TID + 1,
                comm: "worker".into(),
                exec: false
            },
            perf::Record::Mmap2(prog_map.clone()),
        ]
    );
    let ev = |time, change| ImageEvent {
        time: Some(time),
        cpu: Some(1),
        change,
    };
    let map = |m: &Mapping| ImageChange::Map {
        addr: m.addr,
        len: m.len,
        pgoff: m.pgoff,
        filename: m.filename.clone(),
    };
    assert_eq!(
        parse_records(name, &sb, ST).unwrap(),
        [
            ev(3, map(&prog_map)),
            ev(
                5,
                ImageChange::Exec {
                    comm: "prog".into()
                }
            ),
            ev(10, map(&libc)),
            ev(
                12,
                ImageChange::Code {
                    addr: 0x40_1000,
                    bytes: vec![0x90, 0xc3]
                }
            ),
            ev(
                13,
                ImageChange::Lost {
                    what: "3 sideband records lost".into()
                }
            ),
            ev(
                14,
                ImageChange::Lost {
                    what: "AUX flags 0x1: trace truncated or overwritten".into()
                }
            ),
        ]
    );

    let sample_types = [
        ST,
        ST,
        ST,
        perf::PERF_SAMPLE_TID | perf::PERF_SAMPLE_TIME,
        0,
        ST | perf::PERF_SAMPLE_ID | perf::PERF_SAMPLE_STREAM_ID,
    ];
    let (ok, err) = mutants(
        "perf sideband (first byte: sample_type index)",
        0x5eed_0008,
        3000,
        |rng| {
            let mut m = vec![rng.below(sample_types.len() as u64) as u8];
            m.extend(mutate(rng, &sb));
            m
        },
        |_, m| {
            let (st, d) = (sample_types[usize::from(m[0])], &m[1..]);
            // The raw records: contiguous, each inside the buffer, up to the end or to
            // one error right after the last good record.
            let mut pos = 0usize;
            let mut failed = false;
            for item in RecordIter::new(d, st) {
                assert!(!failed);
                match item {
                    Ok((at, r)) => {
                        assert_eq!(at, pos);
                        pos += usize::from(r.header.size);
                        assert!(pos <= d.len());
                    }
                    Err(e) => {
                        assert_eq!(e.offset, pos, "{e}");
                        failed = true;
                    }
                }
            }
            assert!(failed || pos == d.len());
            match parse_records(name, d, st) {
                Ok(events) => {
                    assert!(!failed);
                    let times: Vec<u64> = events.iter().map(|e| e.time.unwrap_or(0)).collect();
                    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
                    Accepted
                }
                Err(e) => {
                    assert!(failed);
                    assert_eq!(e.source_name, name);
                    assert!(e.to_string().starts_with(name), "{e}");
                    assert_eq!(e.offset, pos as u64);
                    assert!(e.offset < d.len() as u64);
                    Rejected
                }
            }
        },
    );
    assert!(ok > 150 && err > 2000, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// Code records
// ---------------------------------------------------------------------------------------

/// The image bytes `pieces` leave over a 0x90-filled segment at 0x40_0000..0x40_4000 when
/// applied with `add_code` (sorted by address, a later piece wins where pieces overlap).
fn code_oracle(pieces: &[(u64, Vec<u8>)]) -> std::collections::BTreeMap<u64, u8> {
    let mut sorted: Vec<&(u64, Vec<u8>)> = pieces.iter().collect();
    sorted.sort_by_key(|p| p.0);
    let mut img = std::collections::BTreeMap::new();
    for (addr, bytes) in sorted {
        if addr.checked_add(bytes.len() as u64).is_none() {
            continue;
        }
        for (i, b) in bytes.iter().enumerate() {
            img.insert(addr + i as u64, *b);
        }
    }
    img
}

fn check_code_image(pieces: &[(u64, Vec<u8>)]) {
    let mut space = AddressSpace::new();
    space.add_bytes("text", vec![0x90; 0x4000], 0x40_0000);
    let refs: Vec<(u64, &[u8])> = pieces.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    space.add_code(&refs);
    let img = code_oracle(pieces);
    for (&addr, &want) in &img {
        let mut b = [0u8; 1];
        assert_eq!(space.read(addr, &mut b), 1, "{addr:#x}");
        assert_eq!(b[0], want, "{addr:#x}");
    }
    for addr in [0x40_0000u64, 0x40_0fff, 0x40_2345, 0x40_3fff] {
        let mut b = [0u8; 1];
        assert_eq!(space.read(addr, &mut b), 1);
        assert_eq!(b[0], img.get(&addr).copied().unwrap_or(0x90), "{addr:#x}");
    }
    // Segments stay sorted and disjoint.
    let segs = space.segments();
    assert!(segs.windows(2).all(|w| w[0].end() <= w[1].start));
}

/// Five code records (two overlapping, one at the end of the text segment, one far away),
/// their (address, bytes), the stream and each record's body.
#[allow(clippy::type_complexity)]
fn code_input() -> (Vec<(u64, Vec<u8>)>, Vec<u8>, Vec<Vec<u8>>) {
    let pieces: Vec<(u64, Vec<u8>)> = vec![
        (0x40_1000, (0..16).collect()),
        (0x40_1008, vec![0xcc; 12]),
        (0x40_2000, vec![0xc3]),
        (0x40_3ffc, vec![0x0f, 0x05, 0x90, 0x90, 0xeb, 0xfe]),
        (0x7fff_ffff_f000, (0..40).map(|i| i * 3).collect()),
    ];
    let mut base = Vec::new();
    let mut bodies = Vec::new();
    for (k, (addr, bytes)) in pieces.iter().enumerate() {
        let at = base.len();
        code::push_code_record(&mut base, *addr, bytes, &code_sample(100 + k as u64)).unwrap();
        let size = usize::from(u16::from_le_bytes([base[at + 6], base[at + 7]]));
        bodies.push(base[at + 8..at + size - code::SAMPLE_ID_SIZE].to_vec());
    }
    (pieces, base, bodies)
}

#[test]
fn code_record_mutants() {
    let (pieces, base, bodies) = code_input();
    // The valid records, exactly.
    let parsed: Vec<perf::ParsedRecord> =
        RecordIter::new(&base, ST).map(|r| r.unwrap().1).collect();
    assert_eq!(parsed.len(), pieces.len());
    for (k, (r, (addr, bytes))) in parsed.iter().zip(&pieces).enumerate() {
        assert_eq!(
            r.record,
            perf::Record::TextPoke {
                addr: *addr,
                bytes: bytes.clone()
            }
        );
        assert_eq!(r.sample.time, Some(100 + k as u64));
        assert_eq!((r.sample.pid, r.sample.tid), (Some(PID), Some(TID)));
        assert_eq!((r.sample.cpu, r.sample.identifier), (Some(1), Some(7)));
        assert_eq!(
            code::parse_code_body(&bodies[k]),
            Some((*addr, bytes.as_slice()))
        );
    }
    check_code_image(&pieces);
    let img = code_oracle(&pieces);
    assert_eq!(img[&0x40_1007], 7);
    assert_eq!(img[&0x40_1008], 0xcc);

    let (ok, err) = mutants(
        "code records",
        0x5eed_0009,
        3000,
        |rng| {
            // A record stream, or one record's body alone.
            if rng.below(3) > 0 {
                let mut m = vec![0u8];
                m.extend(mutate(rng, &base));
                m
            } else {
                let k = rng.below(bodies.len() as u64) as usize;
                let mut m = vec![1u8];
                m.extend(mutate(rng, &bodies[k]));
                m
            }
        },
        |_, m| {
            let d = &m[1..];
            if m[0] == 1 {
                return match code::parse_code_body(d) {
                    Some((addr, bytes)) => {
                        assert_eq!(addr, u64::from_le_bytes(d[..8].try_into().unwrap()));
                        let old = usize::from(u16::from_le_bytes([d[8], d[9]]));
                        let new = usize::from(u16::from_le_bytes([d[10], d[11]]));
                        assert_eq!(bytes, &d[12 + old..12 + old + new]);
                        Accepted
                    }
                    None => Rejected,
                };
            }
            let mut pieces = Vec::new();
            let mut failed = false;
            for item in RecordIter::new(d, ST) {
                match item {
                    Ok((at, r)) => {
                        if let perf::Record::TextPoke { addr, bytes } = r.record {
                            assert!(bytes.len() + 20 <= usize::from(r.header.size));
                            assert!(at + usize::from(r.header.size) <= d.len());
                            pieces.push((addr, bytes));
                        }
                    }
                    Err(e) => {
                        assert!(e.offset < d.len(), "{e}");
                        failed = true;
                    }
                }
            }
            check_code_image(&pieces);
            if failed {
                Rejected
            } else {
                Accepted
            }
        },
    );
    assert!(ok > 300 && err > 1000, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// /proc/<pid>/maps
// ---------------------------------------------------------------------------------------

fn maps_line(e: &MapsEntry) -> String {
    let flag = |on: bool, c: char| if on { c } else { '-' };
    format!(
        "{:x}-{:x} {}{}{}{} {:08x} {:02x}:{:02x} {} {}",
        e.start,
        e.end,
        flag(e.read, 'r'),
        flag(e.write, 'w'),
        flag(e.exec, 'x'),
        if e.shared { 's' } else { 'p' },
        e.offset,
        e.maj,
        e.min,
        e.inode,
        e.path
    )
}

#[test]
fn maps_mutants() {
    let lines: Vec<Option<MapsEntry>> = MAPS.lines().map(MapsEntry::parse).collect();
    assert_eq!(
        lines,
        maps_entries().into_iter().map(Some).collect::<Vec<_>>()
    );
    let sb = encode_exec_mappings(&maps_entries(), PID, PID, ST, 0);
    assert_eq!(parse_records("maps", &sb, ST).unwrap(), maps_events());
    assert_eq!(MapsEntry::parse("garbage"), None);

    let (ok, err) = mutants(
        "maps",
        0x5eed_000a,
        3000,
        |rng| mutate(rng, MAPS.as_bytes()),
        |_, d| {
            let text = String::from_utf8_lossy(d);
            let mut entries = Vec::new();
            let mut rejected = false;
            for line in text.lines() {
                match MapsEntry::parse(line) {
                    Some(e) => {
                        // What parses, prints and parses back the same.
                        assert_eq!(MapsEntry::parse(&maps_line(&e)).as_ref(), Some(&e));
                        assert_eq!(e.path, e.path.trim());
                        entries.push(e);
                    }
                    None => rejected = true,
                }
            }
            assert!(entries.iter().all(|m| m.start < m.end));
            let sb = encode_exec_mappings(&entries, PID, PID, ST, 0);
            let events = parse_records("maps", &sb, ST).unwrap();
            let want: Vec<ImageChange> = entries
                .iter()
                .filter(|m| m.exec)
                .map(|m| ImageChange::Map {
                    addr: m.start,
                    len: m.end - m.start,
                    pgoff: m.offset,
                    // The record's name is a C string.
                    filename: m.perf_name().split('\0').next().unwrap().to_string(),
                })
                .collect();
            let got: Vec<ImageChange> = events.into_iter().map(|e| e.change).collect();
            assert_eq!(got, want);
            if rejected {
                Rejected
            } else {
                Accepted
            }
        },
    );
    assert!(ok > 300 && err > 1000, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// kallsyms
// ---------------------------------------------------------------------------------------

const KALLSYMS: &str = "\
0000000000000000 A fixed_percpu_data
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81001000 t secondary_startup_64_no_verify
ffffffff81002000 D some_data
ffffffff81003000 W weak_fn
ffffffffc0a01000 t ext4_fill_super\t[ext4]

ffffffff81004000 T last_fn\r
";

/// What `add_kallsyms` must make of `text`: the addresses of its text symbols, or the
/// byte offset of the first line that is not `ADDR TYPE NAME`.
fn kallsyms_oracle(text: &str) -> Result<Vec<u64>, u64> {
    let mut at = 0u64;
    let mut addrs = Vec::new();
    for line in text.split_inclusive('\n') {
        let start = at;
        at += line.len() as u64;
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f.len() < 3 {
            return Err(start);
        }
        let addr = u64::from_str_radix(f[0], 16).map_err(|_| start)?;
        if ["t", "T", "w", "W"].contains(&f[1]) && addr != 0 {
            addrs.push(addr);
        }
    }
    Ok(addrs)
}

#[test]
fn kallsyms_mutants() {
    let path = Path::new("/proc/kallsyms");
    let mut syms = Symbols::new();
    assert_eq!(syms.add_kallsyms(path, KALLSYMS), Ok(6));
    assert_eq!(syms.len(), 5);
    assert_eq!(syms.lookup(0xffff_ffff_8100_0010), Some(("_stext", 0x10)));
    assert_eq!(
        syms.lookup(0xffff_ffff_8100_1004),
        Some(("secondary_startup_64_no_verify", 4))
    );
    assert_eq!(syms.lookup(0xffff_ffff_8100_3000), Some(("weak_fn", 0)));
    assert_eq!(
        syms.lookup(0xffff_ffff_c0a0_1000),
        Some(("ext4_fill_super", 0))
    );
    assert_eq!(syms.lookup(0xffff_ffff_8100_4001), Some(("last_fn", 1)));
    assert_eq!(syms.lookup(0x1000), None);

    let (ok, err) = mutants(
        "kallsyms",
        0x5eed_000b,
        3000,
        |rng| mutate(rng, KALLSYMS.as_bytes()),
        |_, d| {
            let text = String::from_utf8_lossy(d);
            let mut syms = Symbols::new();
            let r = syms.add_kallsyms(path, &text);
            match (r, kallsyms_oracle(&text)) {
                (Ok(n), Ok(addrs)) => {
                    assert_eq!(n, addrs.len());
                    for a in addrs {
                        assert_eq!(syms.lookup(a).map(|s| s.1), Some(0), "{a:#x}");
                    }
                    Accepted
                }
                (Err(e), Err(at)) => {
                    assert_eq!(e.offset, at);
                    assert!(e.offset < text.len() as u64);
                    let s = e.to_string();
                    assert!(s.starts_with("/proc/kallsyms"), "{s}");
                    assert!(s.contains("kallsyms line "), "{s}");
                    Rejected
                }
                (r, o) => panic!("add_kallsyms {r:?}, expected {o:?}"),
            }
        },
    );
    assert!(ok > 500 && err > 500, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// pt_metadata
// ---------------------------------------------------------------------------------------

#[test]
fn pt_metadata_mutants() {
    let md = metadata();
    let bytes = md.to_bytes();
    assert_eq!(PtMetadata::from_bytes(&bytes), Some(md));
    assert_eq!(PtMetadata::from_bytes(&bytes[..17]), None);
    let params = TraceParams::from_pt_metadata(&md);
    assert_eq!(
        params.time,
        Some(TimeConv {
            time_shift: 10,
            time_mult: 500,
            time_zero: 7
        })
    );
    assert_eq!(md.tsc_to_perf_time(1 << 20), 7 + 500 * 1024);
    let prog = loop_prog();
    let (pt, bits) = prog.trace(300, 150, 6);
    let space = loop_space(&prog);
    let decode = |params: TraceParams| -> Vec<Record> {
        PtDecoder::new(
            &pt,
            params,
            space.clone(),
            vec![],
            ImageResolver::default(),
            WindowOptions {
                source: "md.pt".into(),
                ..Default::default()
            },
        )
        .unwrap()
        .collect()
    };
    assert_loop_decode(&prog, &decode(params), &bits);

    let (ok, err) = mutants(
        "pt_metadata",
        0x5eed_000c,
        2000,
        |rng| mutate(rng, &bytes),
        |case, d| {
            let Some(m) = PtMetadata::from_bytes(d) else {
                assert!(d.len() < 18);
                return Rejected;
            };
            assert_eq!(m.to_bytes()[..], d[..18]);
            let p = TraceParams::from_pt_metadata(&m);
            if let Some(t) = p.time {
                for tsc in [0, 1, 1 << 40, u64::MAX] {
                    let _ = t.perf_time_to_tsc(t.tsc_to_perf_time(tsc));
                }
            }
            // Any CPU identity configures libipt (errata) and decodes the same trace.
            if case % 10 == 0 {
                let recs = decode(p);
                check_gaps(&recs, "md.pt", pt.len() as u64);
            }
            Accepted
        },
    );
    assert!(ok > 1000 && err > 100, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// QEMU launch: the guest command line and program heads
// ---------------------------------------------------------------------------------------

/// QEMU's `/proc/self/cmdline` as `pttrace run` starts it (`Plugin::command`).
fn qemu_cmdline() -> Vec<u8> {
    let plugin = launch::Plugin {
        plugin: b"/lib/pttrace,qemu.so",
        out: b"/tmp/out",
        qemu: b"/usr/bin/qemu-x86_64",
        oracle: false,
        cut: Some(4096),
        extra: Vec::new(),
    };
    let run = launch::Run {
        program: b"/bin/prog".to_vec(),
        argv0: b"prog".to_vec(),
        args: vec![b"-v".to_vec(), b"file name".to_vec()],
    };
    let (argv, _) = plugin.command([b"LD_BIND_NOW=1".to_vec()], run);
    let raw: Vec<u8> = argv
        .iter()
        .flat_map(|a| a.iter().copied().chain([0]))
        .collect();
    raw
}

/// The first bytes of a `#!` script and of an x86-64 ELF executable.
fn program_heads() -> (Vec<u8>, Vec<u8>) {
    let script = b"#! /usr/bin/env  python3 -u \nprint('hi')\n".to_vec();
    let mut elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0\x3e\0\x01\0\0\0".to_vec();
    elf.resize(64, 0);
    (script, elf)
}

#[test]
fn launch_mutants() {
    let raw = qemu_cmdline();
    assert_eq!(
        launch::guest_cmdline(&raw),
        (b"prog\0-v\0file name\0".to_vec(), b"/bin/prog".to_vec())
    );
    let (ok, _) = mutants(
        "QEMU command line",
        0x5eed_000d,
        2000,
        |rng| mutate(rng, &raw),
        |_, d| {
            let (cmd, prog) = launch::guest_cmdline(d);
            let args: Vec<&[u8]> = d.split(|b| *b == 0).collect();
            assert_eq!(cmd.last(), Some(&0));
            assert!(prog.is_empty() || args.contains(&prog.as_slice()));
            for a in cmd[..cmd.len() - 1].split(|b| *b == 0) {
                assert!(a.is_empty() || args.contains(&a), "{a:?}");
            }
            Accepted
        },
    );
    assert_eq!(ok, 2000);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("program");
    let (script, elf) = program_heads();
    std::fs::write(&path, &script).unwrap();
    assert_eq!(
        launch::inspect(&path).unwrap(),
        launch::Program::Script {
            interp: b"/usr/bin/env".to_vec(),
            arg: Some(b"python3 -u".to_vec())
        }
    );
    std::fs::write(&path, &elf).unwrap();
    assert_eq!(launch::inspect(&path).unwrap(), launch::Program::X86_64);
    let (ok, err) = mutants(
        "program head",
        0x5eed_000e,
        400,
        |rng| {
            if rng.below(2) == 0 {
                mutate(rng, &script)
            } else {
                mutate(rng, &elf)
            }
        },
        |_, d| {
            std::fs::write(&path, d).unwrap();
            match launch::inspect(&path).unwrap() {
                launch::Program::X86_64 => {
                    assert!(d.starts_with(b"\x7fELF") && d[4] == 2 && d[18..20] == [62, 0]);
                    Accepted
                }
                launch::Program::Script { interp, arg } => {
                    assert!(d.starts_with(b"#!"));
                    assert!(!interp.iter().any(|b| b" \t\n".contains(b)), "{interp:?}");
                    if let Some(a) = arg {
                        assert!(!a.is_empty() && !a.contains(&b'\n'));
                        assert_eq!(a.trim_ascii(), &a[..]);
                    }
                    Accepted
                }
                launch::Program::Other(why) => {
                    assert!(!why.is_empty());
                    let x86 = d.starts_with(b"\x7fELF")
                        && d.get(4) == Some(&2)
                        && d.get(18..20) == Some(&[62, 0][..]);
                    assert!(!x86 && !d.starts_with(b"#!"));
                    Rejected
                }
            }
        },
    );
    assert!(ok > 100 && err > 50, "{ok} {err}");
}

// ---------------------------------------------------------------------------------------
// Seed corpora of the fuzz targets
// ---------------------------------------------------------------------------------------

/// Writes the valid inputs above into `fuzz/seeds/<target>/`, the seed corpora of the fuzz
/// targets (see `fuzz/README.md`), after checking that each reader takes its seed whole.
#[test]
#[ignore = "writes fuzz/seeds/: cargo test --test format_mutation -- --ignored write_fuzz_seeds"]
fn write_fuzz_seeds() {
    let prog = loop_prog();
    let thread = ptt_file(FileKind::Thread, &thread_input(&prog).frames);
    let info = ptt_file(FileKind::ProcessInfo, &info_frames());
    let mut dir_seed = u16::try_from(info.len()).unwrap().to_le_bytes().to_vec();
    dir_seed.extend(&info);
    dir_seed.extend(&thread);
    let aux = aux_input(&prog).stream;
    let (_, code_stream, bodies) = code_input();
    let mut sb = vec![0u8];
    sb.extend(sideband_input().0);
    let (script, elf) = program_heads();
    let seeds: Vec<(&str, &str, Vec<u8>)> = vec![
        ("raw_pt", "loop.pt", raw_pt_input(&prog).0),
        ("ptt_thread", "thread.ptt", thread.clone()),
        ("ptt_info", "process.info", info.clone()),
        ("ptt_dir", "info-then-thread", dir_seed),
        ("pdb", "syscalls.raw.pt", pdb_input(&prog).0),
        ("auxtrace", "stream", aux.clone()),
        ("auxtrace", "perf.data", perf_data(&aux)),
        ("sideband", "records", sb),
        ("code_records", "records", code_stream),
        ("code_records", "body", bodies[0].clone()),
        ("maps", "maps", MAPS.into()),
        ("kallsyms", "kallsyms", KALLSYMS.into()),
        ("metadata", "pt_metadata", metadata().to_bytes().to_vec()),
        (
            "metadata",
            "ext_metadata",
            ext_metadata().record_bytes().to_vec(),
        ),
        ("launch", "cmdline", qemu_cmdline()),
        ("launch", "script", script),
        ("launch", "elf", elf),
        ("spool", "killed.spool", spool_input().0),
    ];
    for (target, name, data) in &seeds {
        match *target {
            "ptt_thread" | "ptt_info" => {
                assert_eq!(ptt::parse(name, data).unwrap().tail, Tail::Clean)
            }
            "pdb" => assert_eq!(pdb::parse(data).unwrap().windows.len(), 3),
            "auxtrace" => assert_eq!(auxtrace::unwrap(data).unwrap().pt.len(), 700),
            "sideband" => assert_eq!(parse_records(name, &data[1..], ST).unwrap().len(), 6),
            "code_records" if *name == "records" => {
                assert_eq!(parse_records(name, data, ST).unwrap().len(), 5)
            }
            _ => {}
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/seeds")
            .join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), data).unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Panics the mutation test and the fuzz targets found (fixed): their reproducers
// ---------------------------------------------------------------------------------------

/// Mutant `maps` seed 0x5eed000a case 348 (462 bytes): its third line,
/// `7f1c2a400000-7f1c2a1d0000 r-xp 00028000 08:01 5678 /usr/lib/h86_64-linux-gnu/libc.so.6`,
/// is executable with its end below its start.
const INVERTED_MAPS_HEX: &str = concat!(
    "30303020722d2d702030303030303030302030383a30312031323334202f62696e2f70726f670a30",
    "303430313030302d303034353230303020722d78702030303030313030302030383a303120313233",
    "34202f62696e2f70726f670a3766316332613430303030302d37663163326131643030303020722d",
    "78702030303032383030302030383a30312035363738202f7573722f6c69622f6838365f36342d6c",
    "696e75782d676e752f6c6962632e736f2e360a3766316332613430303030302d3766316332613430",
    "313030302072772d702030303030303030302030303a30302030200a376666643130303030303030",
    "2d37666664313030303230303020722d78702030303030303030302030303a303020302020202020",
    "2020202020202020202020202020202020202020205b7664736f5d0a376666643230303030303030",
    "2d3766666432303032313030302072772d702030303030303030302030303a303020302020202020",
    "2020202020202020202020202020202020202020205b737461636b5d0a3766316332623030303030",
    "302d37663163326230303130303020722d78732030303030303030302030303a3035203939202f74",
    "6d702f612066696c652077697468207370616365730a",
);

fn inverted_maps() -> Vec<u8> {
    let m = unhex(INVERTED_MAPS_HEX);
    assert_eq!(m.len(), 462);
    assert!(inverted_exec_mapping(&m));
    m
}

/// An executable maps line whose end is below its start made `encode_exec_mappings`
/// compute `end - start` and panic; such a line is not a mapping (the kernel never writes
/// one): it is not parsed, and the other lines are.
#[test]
fn inverted_maps_line_is_not_a_mapping() {
    let text = String::from_utf8(inverted_maps()).unwrap();
    let bad = text.lines().nth(2).unwrap();
    assert!(bad.starts_with("7f1c2a400000-7f1c2a1d0000 r-xp"), "{bad}");
    assert_eq!(MapsEntry::parse(bad), None);
    let entries: Vec<MapsEntry> = text.lines().filter_map(MapsEntry::parse).collect();
    assert!(!entries.iter().any(|m| m.end == 0x7f1c_2a1d_0000));
    assert!(!entries.is_empty());
    assert!(entries.iter().all(|m| m.start < m.end));
    let sb = encode_exec_mappings(&entries, PID, PID, ST, 0);
    let recs = parse_records("maps", &sb, ST).unwrap();
    assert_eq!(recs.len(), entries.iter().filter(|m| m.exec).count());
}

/// The same maps text in an info file's `Maps` record (`ptt_input::read_process` panicked
/// through `encode_exec_mappings`): read, without the bad line.
#[test]
fn inverted_maps_line_in_read_process() {
    let mut frames = info_frames();
    frames[3].1 = inverted_maps();
    let data = ptt_file(FileKind::ProcessInfo, &frames);
    let p = ptt_input::read_process("x.info", &data).unwrap();
    let text = String::from_utf8(inverted_maps()).unwrap();
    let exec = text
        .lines()
        .filter_map(MapsEntry::parse)
        .filter(|m| m.exec)
        .count();
    assert_eq!(p.initial_events.len(), exec);
}

/// The same maps text in the info file of a `pttrace run --out` directory
/// (`PttTrace::decode_thread` computed `m.end - m.start` and panicked): decodes.
#[test]
fn inverted_maps_line_in_ptt_dir() {
    let prog = loop_prog();
    let mut frames = info_frames();
    frames[3].1 = inverted_maps();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("4242-0badcafe.info"),
        ptt_file(FileKind::ProcessInfo, &frames),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("4242-0badcafe-4243.ptt"),
        ptt_file(FileKind::Thread, &thread_input(&prog).frames),
    )
    .unwrap();
    let mut t = ptt_dir::open(dir.path()).unwrap();
    t.sysroot = Some(dir.path().join("sysroot"));
    t.collect_thread(&t.threads[0]).unwrap();
}

/// Found by reading `auxtrace::unwrap` (a random mutant is unlikely to hit it): a perf.data
/// header whose data section offset is within 8 of `u64::MAX` makes `pos + 8` overflow
/// (panic in debug builds). 56 bytes: "PERFILE2", zeros, data offset
/// 0xffff_ffff_ffff_fffc at byte 40, data size 0 at byte 48.
#[test]
fn perf_data_offset_near_u64_max_is_named() {
    let data = unhex(concat!(
        "50455246494c4532", // PERFILE2
        "0000000000000000000000000000000000000000000000000000000000000000",
        "fcffffffffffffff", // data offset
        "0000000000000000", // data size
    ));
    assert_eq!(data.len(), 56);
    let e = auxtrace::unwrap(&data).unwrap_err();
    assert_eq!(
        e.to_string(),
        "offset 0x28: perf.data data section offset 18446744073709551612 is past the end of \
         the file (56 bytes)"
    );
}

/// A thread file whose `Dropped` records (after window 1) count `u64::MAX` windows and then
/// 2 more.
fn dropped_overflow_file() -> Vec<u8> {
    let dropped = |n: u64| {
        let mut p = n.to_le_bytes().to_vec();
        p.extend_from_slice(&n.to_le_bytes());
        (RecordType::Dropped as u16, p)
    };
    let mut frames = thread_input(&loop_prog()).frames;
    frames.insert(3, dropped(u64::MAX));
    ptt_file(FileKind::Thread, &frames)
}

/// Found by the `ptt_thread` fuzz target: `Dropped` counts that add up past `u64::MAX` make
/// `summary::summarize_thread` overflow (`s.dropped += n`, a panic in debug builds).
#[test]
fn dropped_counts_saturate_in_summarize_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("4242-0badcafe-4243.ptt");
    std::fs::write(&path, dropped_overflow_file()).unwrap();
    let s = summary::summarize_thread(&path).unwrap();
    assert_eq!(s.dropped, u64::MAX);
}

/// The same file in a `pttrace run --out` directory: `ptt_dir`'s `decode_thread` overflows
/// the same way (`stats.dropped += n`).
#[test]
fn dropped_counts_saturate_in_ptt_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("4242-0badcafe.info"),
        ptt_file(FileKind::ProcessInfo, &info_frames()),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("4242-0badcafe-4243.ptt"),
        dropped_overflow_file(),
    )
    .unwrap();
    let mut t = ptt_dir::open(dir.path()).unwrap();
    t.sysroot = Some(dir.path().join("sysroot"));
    t.collect_thread(&t.threads[0]).unwrap();
}

// ---------------------------------------------------------------------------------------
// Spools (the shim's SIGKILL-proof queues, `pttrace_format::spool`)
// ---------------------------------------------------------------------------------------

/// A spool of 8 entries as a killed shim leaves it: windows 0..3 released, 3..6 published,
/// `kill` in flight at depth 0 and a finished `getppid` (window 5) still marked at depth 1.
fn spool_input() -> (Vec<u8>, Vec<ptt::Window>) {
    use drpttracer::format::spool::*;
    let cap = 8usize;
    let mut b = vec![0u8; file_len(cap)];
    let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(&mut b, 0, &MAGIC);
    put(&mut b, OFF_VERSION, &VERSION.to_le_bytes());
    put(&mut b, OFF_ENTRY_SIZE, &(ENTRY_SIZE as u32).to_le_bytes());
    put(&mut b, OFF_CAP, &(cap as u64).to_le_bytes());
    put(&mut b, OFF_PID, &PID.to_le_bytes());
    put(&mut b, OFF_TID, &TID.to_le_bytes());
    put(&mut b, OFF_NONCE, &NONCE.to_le_bytes());
    let ws: Vec<ptt::Window> = (0..6u64)
        .map(|i| ptt::Window {
            index: i,
            nr: 110,
            args: [i, 0, 0, 0, 0, 0],
            ret: 1,
            tsc_start: 100 * (i + 1),
            tsc_end: 100 * (i + 1) + 5,
            flags: ptt::WF_PT_ABSENT,
            depth: 0,
        })
        .collect();
    for (pos, w) in ws.iter().enumerate() {
        let at = ENTRIES_OFFSET + pos * ENTRY_SIZE;
        let seq = if pos < 3 { pos + cap } else { pos + 1 };
        put(&mut b, at, &(seq as u64).to_le_bytes());
        let mut f = Vec::new();
        for v in [w.index, w.nr] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        for a in w.args {
            f.extend_from_slice(&a.to_le_bytes());
        }
        for v in [w.ret as u64, w.tsc_start, w.tsc_end] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(&w.flags.to_le_bytes());
        f.extend_from_slice(&w.depth.to_le_bytes());
        f.extend_from_slice(&window_check(w).to_le_bytes());
        put(&mut b, at + 8, &f);
    }
    for pos in ws.len()..cap {
        let at = ENTRIES_OFFSET + pos * ENTRY_SIZE;
        put(&mut b, at, &(pos as u64).to_le_bytes());
    }
    let fl = |b: &mut Vec<u8>, d: usize, t0: u64, nr: u64| {
        let at = OFF_IN_FLIGHT + d * IN_FLIGHT_SIZE;
        put(b, at, &t0.to_le_bytes());
        put(b, at + 8, &nr.to_le_bytes());
    };
    fl(&mut b, 0, 9000, 62);
    fl(&mut b, 1, ws[5].tsc_start, 110);
    (b, ws)
}

#[test]
fn spool_mutants() {
    use drpttracer::format::spool;
    let (base, ws) = spool_input();
    // The thread file the spool completes: windows 0..3 written, the write of 3 torn.
    let thread = |upto: usize| {
        let mut frames = vec![];
        for w in &ws[..upto] {
            frames.push((RecordType::Window as u16, window_payload(w, &[], &[])));
        }
        ptt_file(FileKind::Thread, &frames)
    };
    let mut file = thread(4);
    file.truncate(file.len() - 20);
    let parsed = ptt::parse("t.ptt", &file).unwrap();
    let sp = spool::parse("s.spool", &base).unwrap().unwrap();
    assert_eq!(sp.pending, ws[3..].to_vec());
    assert_eq!(sp.in_flight.len(), 2);
    let r = spool::recover(&sp, &parsed, file.len()).unwrap();
    let mut merged = file[..r.keep].to_vec();
    merged.extend_from_slice(&r.frames);
    let m = ptt::parse("m", &merged).unwrap();
    assert_eq!(m.tail, Tail::Clean);
    let windows: Vec<u64> = m
        .frames
        .iter()
        .filter(|f| f.ty == RecordType::Window as u16)
        .map(|f| ptt::decode_window(f.payload).unwrap().window.index)
        .collect();
    assert_eq!(windows, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(r.recovered.windows, 3);
    assert_eq!(
        r.recovered
            .in_flight
            .iter()
            .map(|f| f.nr)
            .collect::<Vec<_>>(),
        vec![62]
    );

    let (ok, err) = mutants(
        "spool",
        0x5eed_0101,
        2000,
        |rng| {
            // Mutate the header and the used entries, where the information is.
            let mut m = mutate(rng, &base[..spool::ENTRIES_OFFSET + 8 * spool::ENTRY_SIZE]);
            if m.len() >= spool::ENTRIES_OFFSET && rng.below(2) == 0 {
                m.resize(base.len(), 0);
            }
            m
        },
        |_, d| match spool::parse("s.spool", d) {
            Ok(None) => Rejected,
            Ok(Some(sp)) => {
                assert!(sp.pending.len() as u64 <= sp.cap);
                assert!(sp.in_flight.len() <= spool::IN_FLIGHT_SLOTS);
                assert!(sp.pending.windows(2).all(|w| w[0].index < w[1].index));
                // Whatever it holds completes a thread file into a clean one.
                if let Some(r) = spool::recover(&sp, &parsed, file.len()) {
                    let mut merged = file[..r.keep].to_vec();
                    merged.extend_from_slice(&r.frames);
                    let m = ptt::parse("m", &merged).unwrap();
                    assert_eq!(m.tail, Tail::Clean);
                    let last = m.frames.last().unwrap();
                    assert_eq!(last.ty, RecordType::Recovered as u16);
                    assert_eq!(
                        spool::Recovered::decode(last.payload).as_ref(),
                        Some(&r.recovered)
                    );
                }
                Accepted
            }
            Err(e) => {
                let s = e.to_string();
                assert!(s.starts_with("s.spool"), "{s}");
                if let FormatError::Record { offset, .. } = e {
                    assert!(offset <= d.len(), "{s}");
                }
                Rejected
            }
        },
    );
    assert!(ok > 200 && err > 200, "{ok} {err}");
}
