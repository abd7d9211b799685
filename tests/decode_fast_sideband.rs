//! Sideband on the fast decoder: image changes during a window (a library mapped while
//! the program runs, code replaced at an address) are applied where libipt's path applies
//! them, at the first event whose time passes theirs, and the records equal libipt's
//! record for record. Where the change alters code the fast decoder already decoded, it
//! builds its blocks anew when the change came while tracing was off, and otherwise
//! hands the window to libipt, which starts over from the window's first image; so it
//! does after a decode error while sideband is pending.

mod common;

use drpttracer::decode::sideband::{encode_mmap2, parse_records, TEST_SAMPLE_TYPE};
use drpttracer::decode::testgen::PtWriter;
use drpttracer::decode::{
    AddressSpace, DecoderKind, ImageEvent, ImageResolver, PtDecoder, Record, TraceDecoder,
    TraceParams, WindowOptions,
};
use drpttracer::metadata::TimeConv;
use iced_x86::code_asm::*;

const MAIN: u64 = 0x40_0000;
const LIB: u64 = 0x70_0000;
/// Perf time = TSC.
fn params() -> TraceParams {
    TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    }
}

/// The records of `trace` by `kind`, and who decoded them.
fn decode(
    trace: &[u8],
    space: &AddressSpace,
    events: &[ImageEvent],
    kind: DecoderKind,
) -> (Vec<Record>, (&'static str, Option<&'static str>)) {
    let mut d = PtDecoder::new(
        trace,
        params(),
        space.clone(),
        events.to_vec(),
        ImageResolver::default(),
        WindowOptions {
            source: "sb.pt".into(),
            window_id: Some(1),
            decoder: kind,
            ..Default::default()
        },
    )
    .unwrap();
    let recs: Vec<Record> = d.by_ref().collect();
    (recs, d.decoded_by())
}

fn gap_ips(recs: &[Record]) -> Vec<Option<u64>> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Gap(g) => Some(g.ip),
            _ => None,
        })
        .collect()
}

/// The records of `trace` by the fast decoder, which must equal libipt's, and who gave
/// them.
fn fast_as_libipt(
    trace: &[u8],
    space: &AddressSpace,
    events: &[ImageEvent],
) -> (Vec<Record>, (&'static str, Option<&'static str>)) {
    let (libipt, _) = decode(trace, space, events, DecoderKind::Libipt);
    let (fast, by) = decode(trace, space, events, DecoderKind::Fast);
    assert_eq!(fast, libipt, "the fast decoder ({by:?}) and libipt differ");
    (fast, by)
}

/// What the fast decoder says when sideband changed code it decoded while walking.
const CODE_CHANGED: &str = "an image change (sideband) over code decoded before it in the window";

/// One MMAP2 of `file` (page offset 0x1000) at `LIB` at perf time `time`.
fn lib_mapped(file: &std::path::Path, time: u64) -> Vec<ImageEvent> {
    parse_records(
        "sb",
        &encode_mmap2(1, 1, LIB, 0x1000, 0x1000, file, time),
        TEST_SAMPLE_TYPE,
    )
    .unwrap()
}

/// A file holding `code` after a page of padding (mapped with page offset 0x1000).
fn code_file(dir: &std::path::Path, name: &str, code: &[u8]) -> std::path::PathBuf {
    let f = dir.join(name);
    let mut bytes = vec![0xccu8; 0x1000];
    bytes.extend_from_slice(code);
    std::fs::write(&f, bytes).unwrap();
    f
}

/// The main program: `a0: nop; a1: call rax; a2: jmp rbx; c0: ret`.
fn main_code() -> (Vec<u8>, Vec<u64>) {
    common::asm(MAIN, |a| {
        a.nop()?;
        a.call(rax)?;
        a.jmp(rbx)?;
        a.ret()
    })
}

/// Three rounds of `a0 a1 → callee (returns, compressed) → a2`, each enabled with its
/// own time: the first calls `c0` (main's own) at time 100; the second calls the
/// library at time 300, in the same PSB segment (only the enable moves the time); the
/// third, after a PSB at time 500, calls the library again.
fn rounds_trace(m: &[u64]) -> Vec<u8> {
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None)
        .tip_pge(m[0])
        .tip(m[3])
        .tnt(&[true])
        .tip_pgd(None);
    w.tsc(300).tip_pge(m[0]).tip(LIB).tnt(&[true]).tip_pgd(None);
    w.psb_plus(Some(500), None)
        .tip_pge(m[0])
        .tip(LIB)
        .tnt(&[true])
        .tip_pgd(None);
    w.buf
}

#[test]
fn a_library_mapped_mid_window_is_decoded_by_the_fast_decoder_from_that_time_on() {
    let dir = tempfile::tempdir().unwrap();
    let (main, m) = main_code();
    let (lib, l) = common::asm(LIB, |a| {
        a.inc(eax)?;
        a.ret()
    });
    let lib_file = code_file(dir.path(), "lib.so", &lib);
    let mut space = AddressSpace::new();
    space.add_bytes("main", main, MAIN);
    let trace = rounds_trace(&m);
    let round1 = [m[0], m[1], m[3], m[2]];
    let round_lib = [m[0], m[1], l[0], l[1], m[2]];

    // Mapped at time 200: before the second round's enable (300), which applies it.
    let events = lib_mapped(&lib_file, 200);
    let (fast, by) = fast_as_libipt(&trace, &space, &events);
    assert_eq!(by, ("fast", None));
    assert_eq!(gap_ips(&fast), []);
    let want: Vec<u64> = [&round1[..], &round_lib, &round_lib].concat();
    assert_eq!(common::pcs(&fast), want);
    // The library's bytes are the file's.
    let inc = fast
        .iter()
        .find_map(|r| r.as_instruction().filter(|i| i.pc == l[0]));
    assert_eq!(inc.map(|i| i.encoding().to_vec()), Some(lib[..2].to_vec()));

    // Without the sideband the library is never there: a gap where each round calls it.
    let (fast, by) = decode(&trace, &space, &[], DecoderKind::Fast);
    assert_eq!(by, ("fast", None));
    assert_eq!(gap_ips(&fast), [Some(LIB), Some(LIB)]);

    // Mapped at time 400: the second round (300) finds no code there (a decode error),
    // the third (500) does. After a decode error libipt's time can come from packets the
    // fast decoder does not read, so with sideband still pending the window goes to
    // libipt.
    let events = lib_mapped(&lib_file, 400);
    let (fast, by) = fast_as_libipt(&trace, &space, &events);
    assert_eq!(
        by,
        (
            "libipt",
            Some("a decode error while sideband events are pending")
        )
    );
    assert_eq!(gap_ips(&fast), [Some(LIB)]);
    let want: Vec<u64> = [&round1[..], &m[..2], &round_lib].concat();
    assert_eq!(common::pcs(&fast), want);
}

#[test]
fn code_replaced_while_tracing_is_off_is_decoded_anew_and_while_walked_goes_to_libipt() {
    let dir = tempfile::tempdir().unwrap();
    let (main, m) = main_code();
    let (lib_a, la) = common::asm(LIB, |a| {
        a.inc(eax)?;
        a.ret()
    });
    let (lib_b, lb) = common::asm(LIB, |a| {
        a.xor(eax, eax)?;
        a.nop()?;
        a.ret()
    });
    let (fa, fb) = (
        code_file(dir.path(), "a.so", &lib_a),
        code_file(dir.path(), "b.so", &lib_b),
    );
    let mut space = AddressSpace::new();
    space.add_bytes("main", main, MAIN);
    // Every round calls the library: version A mapped at 50, then at 400 B or A again,
    // applied at the third round's enable (500), while tracing is off.
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None)
        .tip_pge(m[0])
        .tip(LIB)
        .tnt(&[true])
        .tip_pgd(None);
    w.tsc(300).tip_pge(m[0]).tip(LIB).tnt(&[true]).tip_pgd(None);
    w.tsc(500).tip_pge(m[0]).tip(LIB).tnt(&[true]).tip_pgd(None);
    let round = |l: &[u64]| [&[m[0], m[1]][..], l, &[m[2]]].concat();
    let sideband = |second: &std::path::Path| {
        let mut sb = encode_mmap2(1, 1, LIB, 0x1000, 0x1000, &fa, 50);
        sb.extend(encode_mmap2(1, 1, LIB, 0x1000, 0x1000, second, 400));
        parse_records("sb", &sb, TEST_SAMPLE_TYPE).unwrap()
    };
    for (second, second_ips) in [(&fb, &lb), (&fa, &la)] {
        let events = sideband(second);
        let (fast, by) = fast_as_libipt(&w.buf, &space, &events);
        assert_eq!(by, ("fast", None));
        let want = [round(&la), round(&la), round(second_ips)].concat();
        assert_eq!(common::pcs(&fast), want);
        // (The last round's first instruction at LIB.)
        let xor = fast
            .iter()
            .rev()
            .find_map(|r| r.as_instruction().filter(|i| i.pc == LIB));
        let first = if second == &fb {
            &lib_b[..2]
        } else {
            &lib_a[..2]
        };
        assert_eq!(xor.map(|i| i.encoding().to_vec()), Some(first.to_vec()));
    }

    // The change applied while code is walked: an interrupt at a1 (time 500) into the
    // library, whose code changed after the fast decoder had decoded it; the window goes
    // to libipt, and the records are B's from the interrupt on.
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None)
        .tip_pge(m[0])
        .tip(LIB)
        .tnt(&[true])
        .tip(m[0]);
    w.tsc(500).fup(m[1]).tip(LIB).tip(m[2]).tip_pgd(None);
    let events = sideband(&fb);
    let (fast, by) = fast_as_libipt(&w.buf, &space, &events);
    assert_eq!(by, ("libipt", Some(CODE_CHANGED)));
    let want = [round(&la), vec![m[0]], lb.clone(), vec![m[2]]].concat();
    assert_eq!(common::pcs(&fast), want);
    assert_eq!(gap_ips(&fast), []);

    // The same with an event that moves no code (a CBR at time 500, after two rounds,
    // between a call's return and the jump back): the blocks walked on after it, and the
    // links they made to the library, are A's, so the window goes to libipt, whose third
    // round runs B.
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None)
        .tip_pge(m[0])
        .tip(LIB)
        .tnt(&[true])
        .tip(m[0])
        .tip(LIB)
        .tnt(&[true])
        .tsc(500);
    w.buf.extend_from_slice(&[0x02, 0x03, 0x20, 0x00]); // CBR 32
    w.tip(m[0]).tip(LIB).tnt(&[true]).tip_pgd(None);
    let (fast, by) = fast_as_libipt(&w.buf, &space, &events);
    assert_eq!(by, ("libipt", Some(CODE_CHANGED)));
    assert_eq!(
        common::pcs(&fast),
        [round(&la), round(&la), round(&lb)].concat()
    );
}
