//! Resynchronisation after a decode error (`WindowOptions::resync_on_error`, `pttrace
//! decode --resync-on-error`): libipt 2.2's `pt_blk_resync` scenarios (its
//! `test/src/ptxed-resync-*.ptt`), rebuilt packet by packet, each with the exact record
//! stream ptxed's expected output stands for; and the option changing nothing where the
//! trace has no error.

mod common;

use drpttracer::decode::testgen::PtWriter;
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{
    AddressSpace, DecoderKind, Gap, GapKind, ImageResolver, PtDecoder, Record, TraceParams,
    WindowOptions,
};
use iced_x86::code_asm::*;

const ORG: u64 = 0x10_0000;

/// A trace written packet by packet; `p[k]` is the offset of packet `pk` (the `.ptt`'s
/// numbering).
#[derive(Default)]
struct Trace {
    w: PtWriter,
    p: Vec<u64>,
}

impl Trace {
    /// The writer, the next packet's offset noted.
    fn at(&mut self) -> &mut PtWriter {
        self.p.push(self.w.buf.len() as u64);
        &mut self.w
    }
    /// A packet PtWriter does not write, as raw bytes.
    fn raw(&mut self, bytes: &[u8]) {
        self.at().buf.extend_from_slice(bytes);
    }
    fn mode_exec(&mut self, payload: u8) {
        self.raw(&[0x99, payload]);
    }
    /// MODE.TSX: begin (InTX), commit (neither), abort (TXAbort).
    fn mode_tsx(&mut self, intx: bool, abort: bool) {
        self.raw(&[0x99, 0x20 | u8::from(intx) | (u8::from(abort) << 1)]);
    }
    /// PTW with a 4-byte payload (IP bit: a FUP follows) or an 8-byte one.
    fn ptw4_ip(&mut self, v: u32) {
        let mut b = vec![0x02, 0x92];
        b.extend_from_slice(&v.to_le_bytes());
        self.raw(&b);
    }
    fn ptw8(&mut self, v: u64) {
        let mut b = vec![0x02, 0x32];
        b.extend_from_slice(&v.to_le_bytes());
        self.raw(&b);
    }
    fn psb_plus(&mut self, fup: u64) {
        self.at().psb();
        self.at().fup(fup);
        self.mode_exec(1);
        self.at().psbend();
    }
}

/// The code at `ORG` and each label's address (labels in `f`'s order of `set_label`).
fn asm(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> (AddressSpace, Vec<u64>) {
    let mut a = CodeAssembler::new(64).unwrap();
    f(&mut a).unwrap();
    let (code, ips) = common::assemble_at(&mut a, ORG);
    let mut s = AddressSpace::new();
    s.add_bytes("code", code, ORG);
    (s, ips)
}

/// The decoder of `trace` (source `t`), with `--resync-on-error` or not.
fn decoder<'a>(
    trace: &'a [u8],
    space: &AddressSpace,
    kind: DecoderKind,
    resync: bool,
) -> PtDecoder<'a> {
    decoder_with(trace, space, kind, resync, false)
}

/// [`decoder`], with iflags events (`--iflags-events`) or not.
fn decoder_with<'a>(
    trace: &'a [u8],
    space: &AddressSpace,
    kind: DecoderKind,
    resync: bool,
    iflags: bool,
) -> PtDecoder<'a> {
    PtDecoder::new(
        trace,
        TraceParams::default(),
        space.clone(),
        vec![],
        ImageResolver::default(),
        WindowOptions {
            source: "t".into(),
            decoder: kind,
            resync_on_error: resync,
            iflags_events: iflags,
            ..Default::default()
        },
    )
    .unwrap()
}

fn decode(trace: &[u8], space: &AddressSpace, kind: DecoderKind, resync: bool) -> Vec<Record> {
    decoder(trace, space, kind, resync).collect()
}

/// A record as the tests write them: instructions by address, the rest as they are.
#[derive(Debug, Clone, PartialEq)]
enum R {
    I(u64),
    Rec(Record),
}

fn view(recs: &[Record]) -> Vec<R> {
    recs.iter()
        .map(|r| match r {
            Record::Instruction(i) => R::I(i.pc),
            other => R::Rec(other.clone()),
        })
        .collect()
}

fn gap(ip: Option<u64>, off: u64, error: String) -> R {
    R::Rec(Record::Gap(Box::new(Gap {
        kind: GapKind::DecodeError,
        ip,
        pt_offset: off,
        source: "t".into(),
        error,
    })))
}

/// libipt's nomap gap at `ip`, PT offset `off`.
fn nomap(ip: u64, off: u64) -> R {
    gap(
        Some(ip),
        off,
        format!("no memory mapped at this address: no code image covers {ip:#x}"),
    )
}

/// libipt's failed query at the branch at `ip` (ptxed's `[off, ip: error: ...]`).
fn bad_query(ip: u64, off: u64) -> R {
    gap(Some(ip), off, "trace stream does not match query".into())
}

fn disabled(ip: Option<u64>) -> R {
    R::Rec(Record::TraceDisabled { ip })
}

fn xfer(from: u64, to: u64) -> R {
    R::Rec(Record::KernelXfer { from, to: Some(to) })
}

fn first_gap(recs: &[Record]) -> Option<usize> {
    recs.iter().position(|r| matches!(r, Record::Gap(_)))
}

/// The scenario decoded with `--resync-on-error` gives `want` (by the fast decoder itself);
/// without it, libipt's records (PSB resync), as before; up to and including the first
/// gap both agree with libipt.
fn check(c: &Case, want: &[R]) {
    let trace = &c.t.w.buf;
    let l = decode(trace, &c.space, DecoderKind::Libipt, false);
    let off = decode(trace, &c.space, DecoderKind::Fast, false);
    assert_eq!(view(&off), view(&l), "the default path changed");
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, true);
    let on: Vec<Record> = d.by_ref().collect();
    assert_eq!(view(&on), want);
    assert_eq!(d.decoded_by(), ("fast", None));
    assert!(d.warnings().is_empty(), "{:?}", d.warnings());
    let k = first_gap(&l).expect("the scenario has an error");
    assert_eq!(
        view(&on[..=k]),
        view(&l[..=k]),
        "up to the first gap: libipt's"
    );
}

/// One scenario: the trace, the code, the labels' addresses.
struct Case {
    t: Trace,
    space: AddressSpace,
    l: Vec<u64>,
}

const T: bool = true;
const N: bool = false;

fn bad_query_fup_tip() -> Case {
    let (space, l) = asm(|a| {
        let mut l3 = a.create_label();
        a.jnz(l3)?; // l0
        a.hlt()?; // l1
        a.jmp(rax)?; // l2
        a.set_label(&mut l3)?;
        a.hlt()?; // l3
        a.nop()?; // l4
        a.hlt() // l5
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().fup(l[2]);
    t.at().tip(l[4]);
    t.at().fup(l[5]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn bad_query_ovf() -> Case {
    let (space, l) = asm(|a| {
        let mut l3 = a.create_label();
        a.jnz(l3)?; // l0
        a.hlt()?; // l1
        a.jmp(rax)?; // l2
        a.set_label(&mut l3)?;
        a.hlt()?; // l3
        a.nop() // l4
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(l[4]);
    t.at().ovf();
    Case { t, space, l }
}

fn bad_query_tip() -> Case {
    let (space, l) = asm(|a| {
        let mut l1 = a.create_label();
        a.jnz(l1)?; // l0
        a.set_label(&mut l1)?;
        a.hlt()?; // l1
        a.jmp(rax)?; // l2
        a.nop()?; // l3
        a.hlt() // l4
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(l[3]);
    t.at().fup(l[4]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_fup_tip() -> Case {
    let (space, l) = asm(|a| {
        a.jmp(0x10_0100u64)?; // l0
        a.hlt()?; // l1
        a.nop()?; // l2
        a.hlt() // l3
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().fup(0x10_0200);
    t.at().tip(0x10_0300);
    t.at().fup(0x10_0400);
    t.at().tip(l[2]);
    t.at().fup(l[3]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_mode_exec_fup() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.cli()?; // l2
        a.hlt() // l3
    });
    let mut t = Trace::default();
    t.at().psb();
    t.at().fup(l[0]);
    t.mode_exec(0x05); // 64-bit, IF
    t.at().psbend();
    t.at().tip(0x10_0100);
    t.mode_exec(0x01);
    t.at().fup(l[2]);
    t.at().fup(l[3]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_mode_tsx_eos() -> Case {
    let (space, l) = asm(|a| a.jmp(0x10_0100u64));
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.mode_tsx(true, false);
    t.at().fup(0x10_0200);
    t.mode_tsx(false, false);
    t.at().fup(0x10_0300);
    Case { t, space, l }
}

fn nomap_mode_tsx_fup_tip() -> Case {
    let (space, l) = asm(|a| {
        a.jmp(0x10_0100u64)?; // l0
        a.hlt()?; // l1
        a.hlt()?; // l2
        a.nop()?; // l3
        a.hlt() // l4
    });
    let mut t = Trace::default();
    t.at().psb();
    t.at().fup(l[0]);
    t.mode_exec(0x01);
    t.mode_tsx(true, false);
    t.at().psbend();
    t.mode_tsx(false, true);
    t.at().fup(l[2]);
    t.at().tip(l[3]);
    t.at().fup(l[4]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_mode_tsx_tip_pgd() -> Case {
    let (space, l) = asm(|a| {
        a.jmp(0x10_0100u64)?; // l0
        a.hlt()?; // l1
        a.hlt() // l3
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.mode_tsx(true, false);
    t.at().fup(0x10_0200);
    t.mode_tsx(false, false);
    t.at().fup(0x10_0300);
    t.at().tip_pgd(Some(l[2]));
    Case { t, space, l }
}

fn nomap_ovf_fup() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.nop()?; // l2
        a.hlt() // l3
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(0x10_0100);
    t.at().tnt(&[T, N, T, T, N, N]);
    t.at().ovf();
    t.at().fup(l[2]);
    t.at().fup(l[3]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_psb() -> Case {
    let (space, l) = asm(|a| {
        a.call(0x10_0100u64)?; // l0
        a.nop()?; // l1
        a.hlt() // l2
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.psb_plus(0x10_0200);
    t.at().tnt(&[N, N, T, N, T]);
    t.psb_plus(l[1]);
    t.at().fup(l[2]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_ptw_fup() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.db(&[0xf3, 0x0f, 0xae, 0xe0])?; // l2: ptwrite eax
        a.hlt() // l3
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(0x10_0100);
    t.at().tnt(&[T, N, T, T, N, N]);
    t.ptw4_ip(0xabcd);
    t.at().fup(l[2]);
    t.at().fup(l[3]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_ptw_tip() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.jmp(rax)?; // l2
        a.nop()?; // l3
        a.hlt() // l4
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(0x10_0100);
    t.at().tnt(&[T, N, T, T, N, N]);
    t.ptw8(0x1234_5678);
    t.at().tip(l[3]);
    t.at().fup(l[4]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_tip() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.jmp(rax)?; // l2
        a.nop()?; // l3
        a.hlt() // l4
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(0x10_0100);
    t.at().tip(0x10_0200);
    t.at().tip(l[3]);
    t.at().fup(l[4]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn nomap_tip_pgd() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.jmp(rax)?; // l2
        a.nop() // l3
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(0x10_0100);
    t.at().tnt(&[N, T, T, N, N, T]);
    t.at().tnt(&[N, T, T, N, N, T]);
    t.at().tip(0x10_0200);
    t.at().tnt(&[N, T, T, N, N, T]);
    t.at().tip_pgd(Some(l[3]));
    Case { t, space, l }
}

fn nomap_tip_pge() -> Case {
    let (space, l) = asm(|a| {
        a.call(rax)?; // l0
        a.hlt()?; // l1
        a.nop()?; // l2
        a.hlt() // l3
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tip(0x10_0100);
    t.at().tip(0x10_0200);
    t.at().tnt(&[T, N, T, T, N, N]);
    t.at().tip_pge(l[2]);
    t.at().fup(l[3]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn psb_bad_status_psb() -> Case {
    let (space, l) = asm(|a| {
        let mut l2 = a.create_label();
        a.jge(l2)?; // l0
        a.hlt()?; // l1
        a.set_label(&mut l2)?;
        a.hlt()?; // l2
        a.nop()?; // l3
        a.hlt() // l4
    });
    let mut t = Trace::default();
    t.at().psb();
    t.at().fup(l[0]);
    t.mode_exec(0x02); // 32-bit
    t.at().psbend();
    t.at().tnt(&[T]);
    t.psb_plus(l[2]);
    t.at().tnt(&[T, N, N, T, N, T]);
    t.psb_plus(l[3]);
    t.at().fup(l[4]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

fn psb_nomap_psb() -> Case {
    let (space, l) = asm(|a| {
        a.nop()?; // l1
        a.hlt() // l2
    });
    let mut t = Trace::default();
    t.psb_plus(0x10_0100);
    t.psb_plus(0x10_0200);
    t.at().tnt(&[N, N, T, N, T]);
    t.psb_plus(l[0]);
    t.at().fup(l[1]);
    t.at().tip_pgd(None);
    Case { t, space, l }
}

// ptxed's expected output (test/src/ptxed-resync-*.ptt) is quoted above each test;
// `%pN` is the offset of packet N (`t.p[N]`), `%lN` label N. Events ptxed prints that
// make no record here (TSX, iflags, ptwrite, end of trace) have none.

/// `l0; [%p5, l0: error: trace stream does not match query]; [interrupt]; l4; [disabled]`
#[test]
fn resync_bad_query_fup_tip() {
    let c = bad_query_fup_tip();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            bad_query(l[0], p[5]),
            xfer(l[2], l[4]),
            R::I(l[4]),
            disabled(Some(l[5])),
        ],
    );
}

/// `l0; [%p4, l0: error: trace stream does not match query]; [overflow]`
#[test]
fn resync_bad_query_ovf() {
    let c = bad_query_ovf();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            bad_query(l[0], p[4]),
            R::Rec(Record::Overflow { ip: None }),
        ],
    );
}

/// `l0; [%p4, l0: error: trace stream does not match query]; l3; [disabled]`
#[test]
fn resync_bad_query_tip() {
    let c = bad_query_tip();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            bad_query(l[0], p[4]),
            R::I(l[3]),
            disabled(Some(l[4])),
        ],
    );
}

/// `l0; [%p5, 100100: nomap]; [interrupt, from: 100200, to: 100300];
/// [%p7, 100300: nomap]; [interrupt, from: 100400, to: l2]; l2; [disabled, at: l3]`
#[test]
fn resync_nomap_fup_tip() {
    let c = nomap_fup_tip();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[5]),
            xfer(0x10_0200, 0x10_0300),
            nomap(0x10_0300, p[7]),
            xfer(0x10_0400, l[2]),
            R::I(l[2]),
            disabled(Some(l[3])),
        ],
    );
}

/// ptxed runs this one with `--event:iflags`: `l0; [%p6, 100100: nomap]; [interrupts
/// disabled]; l2; [disabled]`: the MODE.Exec clears IF, an event to libipt there, bound
/// to its FUP (p6), where the event decoder stops and the resync goes on. Without
/// iflags events (`decode`'s, and libipt's default) the MODE.Exec changes nothing: no
/// event, its FUP passed with it; libipt reads on to the asynchronous disable (p7, p8),
/// reports the error at its TIP.PGD and resyncs there (libipt's own library, built from
/// the tree the scenario comes from, gives exactly this).
#[test]
fn resync_nomap_mode_exec_fup() {
    let c = nomap_mode_exec_fup();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[R::I(l[0]), nomap(0x10_0100, p[8]), disabled(Some(l[3]))],
    );
}

/// `l0; [%p5, 100100: nomap]; [begin transaction]; [%p7, 100200: nomap]; [committed];
/// [end of trace]`
#[test]
fn resync_nomap_mode_tsx_eos() {
    let c = nomap_mode_tsx_eos();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[R::I(l[0]), nomap(0x10_0100, p[5]), nomap(0x10_0200, p[7])],
    );
}

/// `l0; [%p6, 100100: nomap]; [aborted, ip: l2]; [interrupt, from: l2, to: l3]; l3;
/// [disabled, at: l4]`
#[test]
fn resync_nomap_mode_tsx_fup_tip() {
    let c = nomap_mode_tsx_fup_tip();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[6]),
            xfer(l[2], l[3]),
            R::I(l[3]),
            disabled(Some(l[4])),
        ],
    );
}

/// `l0; [%p5, 100100: nomap]; [begin transaction]; [%p7, 100200: nomap]; [committed];
/// [%eos, 100300: nomap]; [disabled]` (the third error: past the TIP.PGD, which libipt's
/// event decoder has read as the next event)
#[test]
fn resync_nomap_mode_tsx_tip_pgd() {
    let c = nomap_mode_tsx_tip_pgd();
    let (l, p) = (&c.l, &c.t.p);
    let eos = c.t.w.buf.len() as u64;
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[5]),
            nomap(0x10_0200, p[7]),
            nomap(0x10_0300, eos),
            disabled(None),
        ],
    );
}

/// `l0; [%p6, 100100: nomap]; [overflow]; l2; [disabled]`
#[test]
fn resync_nomap_ovf_fup() {
    let c = nomap_ovf_fup();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[6]),
            R::Rec(Record::Overflow { ip: Some(l[2]) }),
            R::I(l[2]),
            disabled(Some(l[3])),
        ],
    );
}

/// `l0; [%p7, 100100: nomap]; [%p9, 100200: nomap]; l1; [disabled]`
#[test]
fn resync_nomap_psb() {
    let c = nomap_psb();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[7]),
            nomap(0x10_0200, p[9]),
            R::I(l[1]),
            disabled(Some(l[2])),
        ],
    );
}

/// `l0; [%p6, 100100: nomap]; l2; [ptwrite: abcd]; [disabled]`
#[test]
fn resync_nomap_ptw_fup() {
    let c = nomap_ptw_fup();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[6]),
            R::I(l[2]),
            disabled(Some(l[3])),
        ],
    );
}

/// `l0; [%p6, 100100: nomap]; [ptwrite: 12345678]; l3; [disabled]`
#[test]
fn resync_nomap_ptw_tip() {
    let c = nomap_ptw_tip();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[6]),
            R::I(l[3]),
            disabled(Some(l[4])),
        ],
    );
}

/// `l0; [%p5, 100100: nomap]; [%p6, 100200: nomap]; l3; [disabled]`
#[test]
fn resync_nomap_tip() {
    let c = nomap_tip();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[5]),
            nomap(0x10_0200, p[6]),
            R::I(l[3]),
            disabled(Some(l[4])),
        ],
    );
}

/// `l0; [%p6, 100100: nomap]; [%p9, 100200: nomap]; [disabled]` (a disable the resync
/// search meets: libipt's resync takes it itself, and ptxed's `[disabled]` has no IP)
#[test]
fn resync_nomap_tip_pgd() {
    let c = nomap_tip_pgd();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[6]),
            nomap(0x10_0200, p[9]),
            disabled(None),
        ],
    );
}

/// `l0; [%p5, 100100: nomap]; [%p7, 100200: nomap]; [disabled]; [enabled]; l2;
/// [disabled]`
#[test]
fn resync_nomap_tip_pge() {
    let c = nomap_tip_pge();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[5]),
            nomap(0x10_0200, p[7]),
            disabled(None),
            R::Rec(Record::TraceEnabled { ip: l[2] }),
            R::I(l[2]),
            disabled(Some(l[3])),
        ],
    );
}

/// `[%p7, 100100: nomap]; [%p9, 100200: nomap]; l1; [disabled]`
#[test]
fn resync_psb_nomap_psb() {
    let c = psb_nomap_psb();
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            nomap(0x10_0100, p[7]),
            nomap(0x10_0200, p[9]),
            R::I(l[0]),
            disabled(Some(l[1])),
        ],
    );
}

/// `l0; [%p7, l2: error: bad status update]; [%p7, l2: resync error: bad status update];
/// l3; [disabled]`: 32-bit code, then a PSB+ saying 64-bit while it runs (libipt's bad
/// status update, at the PSB+'s MODE.Exec, reported where the code after the last trace
/// item starts); libipt resyncs at that PSB+, which fails again, then at the next PSB.
/// The fast decoder does all of it itself. Without the option the window goes to libipt
/// 2.1.2, whose gap has no IP, and which synchronizes at the next PSB too.
#[test]
fn resync_psb_bad_status_psb() {
    let c = psb_bad_status_psb();
    let (l, p) = (&c.l, &c.t.p);
    let trace = &c.t.w.buf;
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, true);
    let on: Vec<Record> = d.by_ref().collect();
    assert_eq!(
        view(&on),
        [
            R::I(l[0]),
            gap(Some(l[2]), p[7], "bad status update".into()),
            gap(Some(l[2]), p[7], "resync error: bad status update".into()),
            R::I(l[3]),
            disabled(Some(l[4])),
        ]
    );
    assert_eq!(d.decoded_by(), ("fast", None));
    assert!(d.warnings().is_empty(), "{:?}", d.warnings());
    let libipt = decode(trace, &c.space, DecoderKind::Libipt, false);
    assert_eq!(
        view(&libipt),
        [
            R::I(l[0]),
            gap(None, p[7], "bad status update".into()),
            R::I(l[3]),
            disabled(Some(l[4])),
        ]
    );
    assert_eq!(decode(trace, &c.space, DecoderKind::Fast, false), libipt);
}

/// Calls and compressed returns: `l0: call l4; l1: dec rcx; l2: jnz l0; l3: hlt;
/// l4: test al, 1; l5: jz l7; l6: nop; l7: ret`.
fn call_loop() -> (AddressSpace, Vec<u64>) {
    asm(|a| {
        let mut top = a.create_label();
        let mut f = a.create_label();
        let mut s = a.create_label();
        a.set_label(&mut top)?;
        a.call(f)?; // l0
        a.dec(rcx)?; // l1
        a.jnz(top)?; // l2
        a.hlt()?; // l3
        a.set_label(&mut f)?;
        a.test(al, 1)?; // l4
        a.jz(s)?; // l5
        a.nop()?; // l6
        a.set_label(&mut s)?;
        a.ret() // l7
    })
}

/// The text of the gap the fast decoder gives where it cannot go on after a resync.
fn beyond(why: &str) -> String {
    format!(
        "{why}: beyond the fast decoder after a resync on error (libipt 2.1.2 cannot go on \
         from there); decoding resumes at the next PSB"
    )
}

/// Mutant 58 of `decode_fast.rs`'s resync mutants, rebuilt: a TSC whose payload runs
/// over the start of a PSB (the rest of the PSB: a TNT.8 byte, then six `02 82` that are
/// no packet), a compressed return whose bit (from that TNT) says not taken, then a PSB+
/// with a TNT in it and a PSB+ cut by the end. Each failure keeps its gap: the bad
/// compressed return's (libipt's first gap, the same) was once dropped with the records
/// the later failures discarded. The records are those libipt 2.2's resync gives (checked
/// with `tests/c/libipt_resync.c`).
#[test]
fn resync_bad_retcomp_then_failing_psbs_keeps_every_gap() {
    let (space, l) = call_loop();
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.at().tsc(1000); // p1
    t.mode_exec(1); // p2
    t.at().fup(l[0]); // p3
    t.at().psbend(); // p4
                     // call, jz taken, ret (compressed), jnz taken.
    t.at().tnt(&[T, T, T]); // p5
                            // A TSC over the PSB's first 3 bytes.
    t.raw(&[0x19, 0xe8, 0x03, 0x00, 0x00, 0x02, 0x82, 0x02]); // p6
                                                              // The PSB's 4th byte: TNT.8 with N N N N N T: jz not taken, the ret not taken.
    t.raw(&[0x82]); // p7
    t.raw(&[0x02, 0x82].repeat(6)); // p8
                                    // The rest of that PSB+, and a loop iteration.
    t.at().tsc(1004); // p9
    t.mode_exec(1); // p10
    t.at().fup(l[0]); // p11
    t.at().psbend(); // p12
    t.at().tnt(&[T, T, T]); // p13
                            // A PSB+ with a TNT in it (the fast decoder leaves it to libipt).
    t.at().psb(); // p14
    t.at().tsc(2000); // p15
    t.at().tnt(&[T]); // p16
    t.at().psbend(); // p17
                     // A PSB+ cut by the end of the trace.
    t.at().psb(); // p18
    t.at().tsc(3000); // p19
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let end = c.t.w.buf.len() as u64;
    check(
        &c,
        &[
            R::Rec(Record::Timestamp {
                tsc: 1000,
                perf_time: None,
            }),
            R::I(l[0]),
            R::I(l[4]),
            R::I(l[5]),
            R::I(l[7]),
            R::I(l[1]),
            R::I(l[2]),
            R::I(l[0]),
            R::I(l[4]),
            R::I(l[5]),
            R::I(l[6]),
            R::I(l[7]),
            // (After the return, as libipt's block decoder leaves it.)
            gap(Some(l[7] + 1), p[8], "bad compressed return".into()),
            // libipt's resync meets the packet it cannot decode (ptxed's "resync error"),
            // then synchronizes forward: at the PSB the TSC ran over, 3 bytes back.
            gap(None, p[8], "resync error: unknown packet".into()),
            R::Rec(Record::Timestamp {
                tsc: 1004,
                perf_time: None,
            }),
            R::I(l[0]),
            R::I(l[4]),
            R::I(l[5]),
            R::I(l[7]),
            R::I(l[1]),
            R::I(l[2]),
            // The TNT in the next PSB+: libipt's context error there, its resync failing
            // the same way, then the PSB cut by the end.
            gap(None, p[16], "unexpected packet context".into()),
            gap(
                None,
                p[16],
                "resync error: unexpected packet context".into(),
            ),
            gap(None, end, beyond("PSB+ cut by the end of the trace")),
        ],
    );
}

/// With `--resync-on-error`, the window goes to libipt (`why`): its records are `want`,
/// libipt's without the option, with a warning that says why.
fn check_to_libipt(c: &Case, want: &[R], why: &str) {
    let trace = &c.t.w.buf;
    let l = decode(trace, &c.space, DecoderKind::Libipt, false);
    assert_eq!(view(&l), want, "libipt");
    assert_eq!(decode(trace, &c.space, DecoderKind::Fast, false), l);
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, true);
    let on: Vec<Record> = d.by_ref().collect();
    assert_eq!(on, l);
    assert_eq!(d.decoded_by(), ("libipt", Some(why)));
    assert_eq!(
        d.warnings(),
        [format!(
            "t: --resync-on-error: the fast decoder handed the window to libipt ({why}), \
             which resyncs at the next PSB after an error"
        )]
    );
}

/// A TIP to an address without code, then a packet libipt's event decoder fails at when
/// it reads ahead from the TIP: libipt reports that before it reads the code at the TIP's
/// target (no nomap gap). (Mutants 768 and 2009 of `decode_fast.rs`'s resync mutants.)
fn tip_to_nomap_then(next: impl FnOnce(&mut Trace)) -> Case {
    let (space, l) = asm(|a| {
        a.jmp(rax)?; // l0
        a.hlt() // l1
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tip(0x10_0100); // p4
    next(&mut t); // p5
    Case { t, space, l }
}

/// `l0; [%p5: unexpected packet context]; [disabled]; [enabled]`: a TIP.PGE while
/// tracing is enabled; libipt's resync takes it as the enable it is (the records libipt
/// 2.2's `pt_blk_resync` gives, `tests/c/libipt_resync.c` showed; `jmp rax` then waits for
/// a TIP the trace does not have).
#[test]
fn tip_to_nomap_then_tip_pge_resyncs_at_the_enable() {
    let c = tip_to_nomap_then(|t| {
        t.at().tip_pge(0x10_0000);
    });
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            gap(None, p[5], "unexpected packet context".into()),
            disabled(None),
            R::Rec(Record::TraceEnabled { ip: l[0] }),
        ],
    );
}

/// `l0; [%p5: ip has been suppressed]`: a FUP without IP bound to nothing (an
/// asynchronous branch's). libipt's event decoder fails at it, having no address to
/// branch from, and its resync fails there the same way (the records libipt 2.2's
/// `pt_blk_resync` gives, `tests/c/libipt_resync.c` showed).
#[test]
fn tip_to_nomap_then_fup_without_ip_fails_there() {
    let c = tip_to_nomap_then(|t| {
        t.raw(&[0x1d]);
        t.at().tip(0x10_0000);
    });
    let (l, p) = (&c.l, &c.t.p);
    let (off, on) = resync_fails(&[R::I(l[0])], p[5], "ip has been suppressed", &[]);
    check_both(&c, &off, &on);
}

/// `l0`: a MODE.Exec with CS.L and CS.D both set (p4) where `jmp rax` waits for its TIP,
/// which the fast decoder leaves to libipt: with the option too, the window is libipt's,
/// with a warning that says why.
#[test]
fn a_mode_exec_with_cs_l_and_cs_d_goes_to_libipt() {
    let (space, l) = asm(|a| {
        a.jmp(rax)?; // l0
        a.hlt() // l1
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.raw(&[0x99, 0x03]); // p4
    t.at().fup(l[0]); // p5
    t.at().tip(l[0]); // p6
    let c = Case { t, space, l };
    // (libipt decodes `jmp rax`; the code at its target, in the unknown mode the
    // MODE.Exec states, is not decoded before the trace ends.)
    check_to_libipt(&c, &[R::I(c.l[0])], "MODE.Exec with CS.L and CS.D set");
}

/// Code for the fast decoder's own errors below: `l0: jz l2; l1: nop; l2: jmp rax;
/// l3: hlt`.
fn jz_then_jmp_rax() -> (AddressSpace, Vec<u64>) {
    asm(|a| {
        let mut l2 = a.create_label();
        a.jz(l2)?; // l0
        a.nop()?; // l1
        a.set_label(&mut l2)?;
        a.jmp(rax)?; // l2
        a.hlt() // l3
    })
}

/// Both ways through a case the fast decoder decodes itself: without the option the
/// records are libipt 2.1.2's (`off`), with it `on` (what libipt 2.2's `pt_blk_resync`
/// gives, `tests/c/libipt_resync.c` showed).
fn check_both(c: &Case, off: &[R], on: &[R]) {
    let trace = &c.t.w.buf;
    let l = decode(trace, &c.space, DecoderKind::Libipt, false);
    assert_eq!(view(&l), off, "libipt");
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, false);
    assert_eq!(d.by_ref().collect::<Vec<_>>(), l);
    assert_eq!(d.decoded_by(), ("fast", None));
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, true);
    assert_eq!(view(&d.by_ref().collect::<Vec<_>>()), on);
    assert_eq!(d.decoded_by(), ("fast", None));
    assert!(d.warnings().is_empty(), "{:?}", d.warnings());
}

/// A decode error (no IP) that libipt's resync does not get past: the records without
/// the option (`before`, the gap of `what` at PT offset `at`, then `after`) and with it
/// (the same, with its resync's "resync error" gap right after that gap).
fn resync_fails(before: &[R], at: u64, what: &str, after: &[R]) -> (Vec<R>, Vec<R>) {
    let err = gap(None, at, what.into());
    let resync = gap(None, at, format!("resync error: {what}"));
    let with = |gaps: Vec<R>| {
        before
            .iter()
            .cloned()
            .chain(gaps)
            .chain(after.iter().cloned())
    };
    (
        with(vec![err.clone()]).collect(),
        with(vec![err, resync]).collect(),
    )
}

/// An unknown opcode where the indirect jump waits for its TIP: libipt's packet error
/// there (its gap), then the next PSB, with and without the option (its resync fails
/// the same way: a second gap).
#[test]
fn unknown_opcode_then_the_next_psb() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[true]); // p4
    t.raw(&[0x05]); // p5
    t.psb_plus(l[1]); // p6..p9
    t.at().tip_pgd(None); // p10
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let after = [R::I(l[1]), R::I(l[2]), disabled(None)];
    let (off, on) = resync_fails(&[R::I(l[0])], p[5], "unknown opcode", &after);
    check_both(&c, &off, &on);
}

/// The indirect jump with TNT bits left and a TNT, not a TIP, after them: libipt's bad
/// query at the jump, where its query decoder stands (the TNT after); with the option,
/// decoding goes on at the TIP after it, the TNTs passed, and runs past `hlt` to where
/// no code is (a nomap past the disable after it).
#[test]
fn indirect_branch_with_tnt_bits_left_and_no_tip() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[true, false]); // p4
    t.at().tnt(&[true]); // p5
    t.at().tip(l[3]); // p6
    t.at().tip_pgd(None); // p7
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let bad = gap(Some(l[2]), p[5], "trace stream does not match query".into());
    // (Past the TIP.PGD, read as the next event: the end of the trace.)
    let end = c.t.w.buf.len() as u64;
    check_both(
        &c,
        &[R::I(l[0]), R::I(l[2]), bad.clone()],
        &[
            R::I(l[0]),
            R::I(l[2]),
            bad,
            R::I(l[3]),
            nomap(l[3] + 1, end),
            disabled(None),
        ],
    );
}

/// A TNT while tracing is disabled (after a TIP.PGD): libipt's context error at it,
/// which its resync does not get past (a second gap), then the next PSB.
#[test]
fn tnt_while_tracing_is_disabled() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[true]); // p4
    t.at().tip_pgd(None); // p5
    t.at().tnt(&[true]); // p6
    t.psb_plus(l[1]); // p7..p10
    t.at().tip_pgd(None); // p11
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let err = |what: &str| gap(None, p[6], what.into());
    let head = [R::I(l[0]), R::I(l[2]), disabled(None)];
    let tail = [R::I(l[1]), R::I(l[2]), disabled(None)];
    let off: Vec<R> = head
        .iter()
        .cloned()
        .chain([err("unexpected packet context")])
        .chain(tail.clone())
        .collect();
    let on: Vec<R> = head
        .iter()
        .cloned()
        .chain([
            err("unexpected packet context"),
            err("resync error: unexpected packet context"),
        ])
        .chain(tail)
        .collect();
    check_both(&c, &off, &on);
}

fn iflags(enabled: bool, ip: u64) -> R {
    R::Rec(Record::InterruptFlag {
        enabled,
        ip: Some(ip),
    })
}

/// `recs` but the `iflags` records.
fn without_iflags(recs: &[R]) -> Vec<R> {
    recs.iter()
        .filter(|r| !matches!(r, R::Rec(Record::InterruptFlag { .. })))
        .cloned()
        .collect()
}

/// With iflags events, `c` decodes to `off` (and `on` with `--resync-on-error`) with
/// the fast decoder, by itself where `fast`; without `--resync-on-error` that is
/// libipt's. Without iflags events, to `plain` (both decoders).
fn check_iflags(c: &Case, off: &[R], on: &[R], fast: bool, plain: &[R]) {
    let trace = &c.t.w.buf;
    let l: Vec<Record> = decoder_with(trace, &c.space, DecoderKind::Libipt, false, true).collect();
    assert_eq!(view(&l), off, "libipt");
    let mut d = decoder_with(trace, &c.space, DecoderKind::Fast, false, true);
    assert_eq!(d.by_ref().collect::<Vec<_>>(), l);
    assert_eq!(d.decoded_by().0, if fast { "fast" } else { "libipt" });
    let mut d = decoder_with(trace, &c.space, DecoderKind::Fast, true, true);
    assert_eq!(view(&d.by_ref().collect::<Vec<_>>()), on);
    assert_eq!(d.decoded_by(), ("fast", None));
    for kind in [DecoderKind::Libipt, DecoderKind::Fast] {
        assert_eq!(
            view(&decode(trace, &c.space, kind, false)),
            plain,
            "{kind:?}"
        );
    }
}

/// libipt's `ptet-mode_exec-if`: a MODE.Exec before the TIP.PGE (tracing enabled with
/// interrupts off: its event after the enable), STI and CLI each with a MODE.Exec and
/// the FUP after the instruction: `[enabled]; [interrupts disabled]; l0; l1;
/// [interrupts enabled]; l2; l3; [interrupts disabled]; [disabled]`.
#[test]
fn iflags_events_where_the_flag_changes() {
    let (space, l) = asm(|a| {
        a.nop()?; // l0
        a.sti()?; // l1
        a.nop()?; // l2
        a.cli()?; // l3
        a.hlt() // l4
    });
    let mut t = Trace::default();
    t.at().psb();
    t.at().psbend();
    t.mode_exec(0x01);
    t.at().tip_pge(l[0]);
    t.mode_exec(0x05);
    t.at().fup(l[2]);
    t.mode_exec(0x01);
    t.at().fup(l[4]);
    t.at().fup(l[4]);
    t.at().tip_pgd(None);
    let c = Case { t, space, l };
    let l = &c.l;
    let want = [
        R::Rec(Record::TraceEnabled { ip: l[0] }),
        iflags(false, l[0]),
        R::I(l[0]),
        R::I(l[1]),
        iflags(true, l[2]),
        R::I(l[2]),
        R::I(l[3]),
        iflags(false, l[4]),
        disabled(Some(l[4])),
    ];
    check_iflags(&c, &want, &want, true, &without_iflags(&want));
}

/// `ptxed-resync-nomap-mode_exec-fup` with ptxed's `--event:iflags` (as the corpus runs
/// it): the MODE.Exec that clears IF is an event at its FUP, where libipt reports the
/// nomap and resyncs: `l0; [%p6, 100100: error: no memory mapped at this address];
/// [interrupts disabled]; l2; [disabled]`. (Without the option libipt has no event
/// there: `resync_nomap_mode_exec_fup`.)
#[test]
fn iflags_event_is_where_libipt_resyncs() {
    let c = nomap_mode_exec_fup();
    let (l, p) = (&c.l, &c.t.p);
    check_iflags(
        &c,
        &[R::I(l[0]), nomap(0x10_0100, p[6])],
        &[
            R::I(l[0]),
            nomap(0x10_0100, p[6]),
            iflags(false, l[2]),
            R::I(l[2]),
            disabled(Some(l[3])),
        ],
        false,
        &[R::I(l[0]), nomap(0x10_0100, p[8])],
    );
}

/// libipt forgets IF at an OVF (the MODE.Exec after it is an event though it states
/// the flag the PSB+ did); a PSB+ that states another IF than the trace before it is a
/// bad status update, as one that states another mode (with `--resync-on-error`, its
/// resync fails the same way, then the next PSB). (Records checked against libipt 2.3's
/// own resync with iflags events.)
#[test]
fn iflags_after_an_overflow_and_at_a_psb() {
    let (space, l) = asm(|a| {
        a.nop()?; // l0
        a.nop()?; // l1
        a.nop()?; // l2
        a.cli()?; // l3
        a.nop()?; // l4
        a.hlt() // l5
    });
    let mut t = Trace::default();
    t.at().psb();
    t.at().fup(l[0]);
    t.mode_exec(0x05);
    t.at().psbend();
    t.at().ovf();
    t.at().fup(l[1]);
    t.mode_exec(0x05);
    t.at().fup(l[2]);
    t.mode_exec(0x01);
    t.at().fup(l[4]);
    t.at().fup(l[5]);
    t.at().tip_pgd(None);
    let c = Case { t, space, l };
    let l = &c.l;
    let want = [
        R::Rec(Record::Overflow { ip: Some(l[1]) }),
        R::I(l[1]),
        iflags(true, l[2]),
        R::I(l[2]),
        R::I(l[3]),
        iflags(false, l[4]),
        R::I(l[4]),
        disabled(Some(l[5])),
    ];
    check_iflags(&c, &want, &want, true, &without_iflags(&want));

    let (space, l) = asm(|a| {
        let mut l3 = a.create_label();
        a.nop()?; // l0
        a.je(l3)?; // l1
        a.hlt()?; // l2
        a.set_label(&mut l3)?;
        a.nop()?; // l3
        a.hlt()?; // l4
        a.nop()?; // l5
        a.hlt() // l6
    });
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.at().fup(l[0]);
    t.mode_exec(0x05);
    t.at().psbend();
    t.at().tnt(&[T]); // p4
    t.at().psb(); // p5
    t.at().fup(l[4]);
    t.mode_exec(0x01); // p7
    t.at().psbend();
    t.psb_plus(l[5]); // p9..p12
    t.at().fup(l[6]);
    t.at().tip_pgd(None);
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let status = |what: &str| gap(Some(l[3]), p[7], what.into());
    let tail = [R::I(l[5]), disabled(Some(l[6]))];
    let off: Vec<R> = [R::I(l[0]), R::I(l[1])]
        .into_iter()
        .chain([gap(None, p[7], "bad status update".into())])
        .chain(tail.clone())
        .collect();
    let on: Vec<R> = [R::I(l[0]), R::I(l[1])]
        .into_iter()
        .chain([
            status("bad status update"),
            status("resync error: bad status update"),
        ])
        .chain(tail)
        .collect();
    let plain = [l[0], l[1], l[3], l[4], l[5]].map(R::I);
    let plain: Vec<R> = plain.into_iter().chain([disabled(Some(l[6]))]).collect();
    check_iflags(&c, &off, &on, false, &plain);
}

/// An indirect branch with a TNT bit left and, after that TNT packet, a MODE.Exec that
/// changes nothing with its FUP, then a TIP: libipt's event decoder passes the two (no
/// event) and takes the TIP as the branch's deferred target (here without code: its
/// nomap there). The fast decoder leaves that to libipt; it gave a bad query before.
#[test]
fn deferred_tip_after_a_mode_exec_that_changes_nothing() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T, T]); // p4
    t.mode_exec(0x01); // p5
    t.at().fup(l[0]); // p6
    t.at().tip(0x10_0100); // p7
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let trace = &c.t.w.buf;
    let lib = decode(trace, &c.space, DecoderKind::Libipt, false);
    assert_eq!(view(&lib), [R::I(l[0]), R::I(l[2]), nomap(0x10_0100, p[7])]);
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, false);
    assert_eq!(d.by_ref().collect::<Vec<_>>(), lib);
    assert_eq!(
        d.decoded_by(),
        (
            "libipt",
            Some("deferred TIP after a MODE.Exec that changes nothing")
        )
    );
}

/// A FUP bound to nothing with a TNT packet between it and its TIP: libipt's asynchronous
/// branch waits for that TIP, and its TNT bits take the flow on first; once they are
/// used up the branch is taken at the FUP's IP (here on the code walked after the last
/// bit). (Records checked against libipt 2.3's resync too.)
#[test]
fn fup_then_tnt_then_tip() {
    let (space, l) = asm(|a| {
        let mut l2 = a.create_label();
        a.jz(l2)?; // l0
        a.nop()?; // l1
        a.set_label(&mut l2)?;
        a.nop()?; // l2
        a.nop()?; // l3
        a.hlt()?; // l4
        a.nop()?; // l5
        a.hlt() // l6
    });
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.at().tnt(&[T]); // p5
    t.at().pad(); // p6
    t.at().tip(l[5]); // p7
    t.at().fup(l[6]); // p8
    t.at().tip_pgd(None); // p9
    let c = Case { t, space, l };
    let l = &c.l;
    let want = [
        R::I(l[0]),
        R::I(l[2]),
        xfer(l[3], l[5]),
        R::I(l[5]),
        disabled(Some(l[6])),
    ];
    check_both(&c, &want, &want);
}

/// The same with a second TNT bit an indirect jump takes before the asynchronous
/// branch's TIP: no TIP is left for it, libipt's bad query at that TIP; `--resync-on-error`
/// goes on at that asynchronous branch, from the FUP's IP to the TIP's target, as libipt
/// 2.3's resync (its events checked: the branch, then the disable).
#[test]
fn fup_then_tnt_bits_an_indirect_branch_takes() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.at().tnt(&[T, T]); // p5
    t.at().tip(l[3]); // p6
    t.at().fup(l[3]); // p7
    t.at().tip_pgd(None); // p8
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let off = [R::I(l[0]), R::I(l[2]), bad_query(l[2], p[6])];
    let on = [
        R::I(l[0]),
        R::I(l[2]),
        bad_query(l[2], p[6]),
        xfer(l[3], l[3]),
        disabled(Some(l[3])),
    ];
    check_both(&c, &off, &on);
}

/// The code of the FUP scenarios below: a conditional jump, then straight code.
fn jz_then_nops() -> (AddressSpace, Vec<u64>) {
    asm(|a| {
        let mut l2 = a.create_label();
        a.jz(l2)?; // l0
        a.nop()?; // l1
        a.set_label(&mut l2)?;
        a.nop()?; // l2
        a.nop()?; // l3
        a.nop()?; // l4
        a.hlt() // l5
    })
}

/// A FUP bound to nothing whose TIP never comes: an OVF or the end of the trace comes
/// first (a TNT packet between or not). libipt's asynchronous branch waits for that TIP,
/// and the overflow (whose events are dropped while tracing is enabled) or the end takes
/// it away: the records are those of the trace without the FUP, on the fast path.
/// (libipt 2.3's resync gives the same records.)
#[test]
fn fup_then_ovf_or_the_end_drops_the_fup() {
    let (space, l) = jz_then_nops();
    for (tnt, ovf) in [(false, true), (true, true), (false, false), (true, false)] {
        let build = |fup: bool| {
            let mut t = Trace::default();
            t.psb_plus(l[0]);
            if fup {
                t.at().fup(l[3]);
            }
            if tnt {
                t.at().tnt(&[T]);
            }
            t.at().pad();
            if ovf {
                t.at().tsc(0x1234);
                t.at().ovf();
                t.at().fup(l[3]);
                t.at().fup(l[4]);
                t.at().tip_pgd(None);
            }
            t
        };
        let c = Case {
            t: build(true),
            space: space.clone(),
            l: l.clone(),
        };
        let mut want = match tnt {
            true => vec![R::I(l[0])],
            false => vec![],
        };
        if ovf {
            want.extend([
                R::Rec(Record::Timestamp {
                    tsc: 0x1234,
                    perf_time: None,
                }),
                R::Rec(Record::Overflow { ip: Some(l[3]) }),
                R::I(l[3]),
                disabled(Some(l[4])),
            ]);
        }
        check_both(&c, &want, &want);
        let without = decode(&build(false).w.buf, &space, DecoderKind::Libipt, false);
        assert_eq!(
            view(&without),
            want,
            "tnt {tnt}, ovf {ovf}: without the FUP"
        );
    }
}

/// A FUP bound to nothing, then a PSB or a TIP.PGE where its TIP should be (a TNT
/// packet between or not): libipt's context error at that packet, reported at the query
/// that took the last trace item (the code after it not decoded). `--resync-on-error`:
/// at the PSB libipt 2.3's resync fails at once (then the next PSB), at the TIP.PGE it
/// fails there again first.
#[test]
fn fup_then_psb_or_tip_pge_is_a_context_error() {
    let (space, l) = jz_then_nops();
    for (tnt, psb) in [(false, true), (true, true), (false, false), (true, false)] {
        let mut t = Trace::default();
        t.psb_plus(l[0]); // p0..p3
        t.at().fup(l[3]); // p4
        if tnt {
            t.at().tnt(&[T]);
        }
        let at = t.w.buf.len() as u64;
        if psb {
            t.psb_plus(l[3]);
        } else {
            t.at().tip_pge(l[3]);
        }
        t.psb_plus(l[4]);
        t.at().fup(l[5]);
        t.at().tip_pgd(None);
        let c = Case {
            t,
            space: space.clone(),
            l: l.clone(),
        };
        let context = |what: &str| gap(None, at, what.into());
        let ran = match tnt {
            true => vec![R::I(l[0])],
            false => vec![],
        };
        let end = [R::I(l[4]), disabled(Some(l[5]))];
        let off: Vec<R> = ran
            .iter()
            .cloned()
            .chain([context("unexpected packet context")])
            .chain(end.clone())
            .collect();
        // (At the TIP.PGE libipt's resync takes the enable, disabled until then: ptxed's
        // `[disabled]`, then the same error.)
        let again = match psb {
            true => vec![],
            false => vec![disabled(None), context("unexpected packet context")],
        };
        let on: Vec<R> = ran
            .into_iter()
            .chain([context("unexpected packet context")])
            .chain(again)
            .chain([context("resync error: unexpected packet context")])
            .chain(end)
            .collect();
        check_both(&c, &off, &on);
    }
}

/// An interrupt into another mode: a MODE.Exec between the FUP and its TIP binds to that
/// TIP, as for a far branch. The code up to the FUP's IP runs in the mode before it, the
/// code at the target in the new one (32-bit here: `48 90` is `dec eax; nop`, not
/// `xchg rax, rax`); on the fast path.
#[test]
fn fup_then_a_mode_exec_then_its_tip() {
    let (space, l) = asm(|a| {
        a.db(&[0x48, 0x90])?; // l0
        a.db(&[0x48, 0x90])?; // l1
        a.db(&[0x48, 0x90])?; // l2
        a.hlt() // l3
    });
    for (payload, target) in [(1u8, vec![l[1]]), (2, vec![l[1], l[1] + 1])] {
        let mut t = Trace::default();
        t.psb_plus(l[0]);
        t.at().fup(l[1]);
        t.mode_exec(payload);
        t.at().tip(l[1]);
        t.at().fup(l[2]);
        t.at().tip_pgd(None);
        let c = Case {
            t,
            space: space.clone(),
            l: l.clone(),
        };
        let want: Vec<R> = [R::I(l[0]), xfer(l[1], l[1])]
            .into_iter()
            .chain(target.into_iter().map(R::I))
            .chain([disabled(Some(l[2]))])
            .collect();
        check_both(&c, &want, &want);
    }
}

/// A PSBEND outside a PSB+ met by the resync search: libipt's event decoder passes it
/// (no PSB+ events wait), and the resync goes on at the TIP after it. (libipt 2.3's
/// resync gives these records.)
#[test]
fn resync_passes_a_psbend_outside_a_psb_plus() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    t.at().psbend(); // p6
    t.at().tip(l[0]); // p7
    t.at().tnt(&[N]); // p8
    t.at().fup(l[2]); // p9
    t.at().tip_pgd(None); // p10
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    check(
        &c,
        &[
            R::I(l[0]),
            R::I(l[2]),
            nomap(0x10_0100, p[7]),
            R::I(l[0]),
            R::I(l[1]),
            disabled(Some(l[2])),
        ],
    );
}

/// A TRIG with the IP bit but no instruction count (libipt 2.2's event decoder refuses
/// it: a bad packet) met by the resync search: the resync fails there (a gap), then the
/// next PSB. (libipt 2.3's resync gives these records; libipt 2.1.2, which knows no
/// FUP-bound TRIG, says so in its gap: no comparison without the option.)
#[test]
fn resync_fails_at_a_trig_libipt_refuses() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    t.at().tnt(&[T]); // p6
    t.raw(&[0xd9, 0x80, 0x40]); // p7: TRIG, IP bit, no ICNT
    t.at().fup(l[1]); // p8
    t.at().tip(l[0]); // p9
    t.at().tnt(&[N]); // p10
    t.at().fup(l[2]); // p11
    t.at().tip_pgd(None); // p12
    t.psb_plus(l[1]); // p13..p16
    t.at().fup(l[2]); // p17
    t.at().tip_pgd(None); // p18
    let mut d = decoder(&t.w.buf, &space, DecoderKind::Fast, true);
    let on: Vec<Record> = d.by_ref().collect();
    let p = &t.p;
    assert_eq!(
        view(&on),
        [
            R::I(l[0]),
            R::I(l[2]),
            nomap(0x10_0100, p[7]),
            gap(None, p[7], "resync error: unknown packet".into()),
            R::I(l[1]),
            disabled(Some(l[2])),
        ]
    );
    assert_eq!(d.decoded_by(), ("fast", None));
}

/// A window's first PSB+ holding trace of code (a TNT): libipt's synchronization fails
/// there (its context error, ptxed's "sync error"), then it synchronizes at the next PSB.
/// With `--resync-on-error` the fast decoder does it itself (without, the window goes to
/// libipt 2.1.2, whose records are the same; libipt 2.3's resync gives them too).
#[test]
fn a_first_psb_plus_with_trace_of_code_is_a_sync_error() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.mode_exec(1); // p1
    t.at().fup(l[0]); // p2
    t.at().tnt(&[T]); // p3
    t.at().psbend(); // p4
    t.at().tnt(&[T]); // p5
    t.at().tip(l[3]); // p6
    t.psb_plus(l[1]); // p7..p10
    t.at().tip(l[3]); // p11
    t.at().fup(l[3]); // p12
    t.at().tip_pgd(None); // p13
    let p = &t.p;
    let want = [
        gap(None, p[3], "unexpected packet context".into()),
        R::I(l[1]),
        R::I(l[2]),
        disabled(Some(l[3])),
    ];
    let lib = decode(&t.w.buf, &space, DecoderKind::Libipt, false);
    assert_eq!(view(&lib), want);
    let mut d = decoder(&t.w.buf, &space, DecoderKind::Fast, true);
    assert_eq!(d.by_ref().collect::<Vec<_>>(), lib);
    assert_eq!(d.decoded_by(), ("fast", None));
}

/// The trace after an event that waits for its FUP in libipt's event queue (in
/// `jz_then_jmp_rax`): a PSB+ at `l[0]` (the code then runs to `l[2]`, disabled there),
/// and a second PSB+ at `l[1]` (on to `l[2]`, disabled). Seven packets.
fn two_psbs_after_a_waiting_event(t: &mut Trace, l: &[u64]) {
    t.psb_plus(l[0]);
    t.at().tnt(&[N]);
    t.at().fup(l[2]);
    t.at().tip_pgd(None);
    t.psb_plus(l[1]);
    t.at().fup(l[2]);
    t.at().tip_pgd(None);
}

/// The records of [`two_psbs_after_a_waiting_event`] (its first PSB at offset `psb`)
/// where an event still waits: libipt's context error at the PSB (no event is carried
/// across a PSB), its resync failing there too, then the second PSB+'s code.
fn context_error_then_the_next_psb(psb: u64, l: &[u64]) -> [R; 4] {
    let context = |what: &str| gap(None, psb, what.into());
    [
        context("unexpected packet context"),
        context("resync error: unexpected packet context"),
        R::I(l[1]),
        disabled(Some(l[2])),
    ]
}

/// A case only `--resync-on-error` changes, where it follows libipt 2.2, which the
/// bundled 2.1.2 does not (`what` names the case): without the option the fast
/// decoder's records are libipt 2.1.2's (returned); with it they are `want`, decoded by
/// the fast decoder itself, without a warning.
fn check_with_option(trace: &[u8], space: &AddressSpace, want: &[R], what: &str) -> Vec<Record> {
    let l = decode(trace, space, DecoderKind::Libipt, false);
    assert_eq!(decode(trace, space, DecoderKind::Fast, false), l, "{what}");
    let mut d = decoder(trace, space, DecoderKind::Fast, true);
    assert_eq!(view(&d.by_ref().collect::<Vec<_>>()), want, "{what}");
    assert_eq!(d.decoded_by(), ("fast", None), "{what}");
    assert!(d.warnings().is_empty(), "{what}: {:?}", d.warnings());
    l
}

/// [`check_with_option`] of a case whose first `n` records, an error last, are libipt
/// 2.1.2's without the option (no PSB after the error to go on at), and `on` with it.
fn check_error_then_resync(c: &Case, on: &[R], n: usize, what: &str) {
    let off = check_with_option(&c.t.w.buf, &c.space, on, what);
    assert_eq!(view(&off), on[..n], "{what}");
}

/// A MODE.TSX the resync search reads before the TIP it resumes at still waits for its
/// FUP in libipt's event queue: the next PSB is libipt's context error (no event is
/// carried across a PSB), its resync fails there too, then the next PSB. (libipt 2.3's
/// resync gives these records.)
#[test]
fn a_mode_tsx_read_by_the_resync_makes_the_next_psb_a_context_error() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    t.mode_tsx(true, false); // p6
    t.at().tip(l[0]); // p7
    t.at().tnt(&[N]); // p8
    t.at().tip(l[0]); // p9
    two_psbs_after_a_waiting_event(&mut t, &l); // p10..p22
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let walk = [R::I(l[0]), R::I(l[1]), R::I(l[2])];
    let want: Vec<R> = [R::I(l[0]), R::I(l[2]), nomap(0x10_0100, p[7])]
        .into_iter()
        .chain(walk)
        .chain(context_error_then_the_next_psb(p[10], l))
        .collect();
    check(&c, &want);
}

/// A TRIG with the IP bit and no FUP after it waits for a FUP in libipt 2.2's event
/// queue, as a MODE.TSX does: read by the resync search before the TIP it resumes at,
/// or while decoding, the next PSB is libipt's context error; met where libipt reports a
/// nomap, it is read past (the error past the TNT after it, the resync at the TIP after
/// that). (libipt 2.1.2 knows no TRIG with the IP bit: without the option the window goes
/// to it. libipt 2.3's resync gives these records.)
#[test]
fn a_trig_waiting_for_its_fup_after_an_error() {
    let (space, l) = jz_then_jmp_rax();
    let trig = |t: &mut Trace| t.raw(&[0xd9, 0xc0, 1, 0, 0]); // TRIG: IP, ICNT 0
    let walk = [R::I(l[0]), R::I(l[1]), R::I(l[2])];
    // Read by the resync search.
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    trig(&mut t); // p6
    t.at().tip(l[0]); // p7
    t.at().tnt(&[N]); // p8
    t.at().tip(l[0]); // p9
    two_psbs_after_a_waiting_event(&mut t, &l); // p10..
    let want: Vec<R> = [R::I(l[0]), R::I(l[2]), nomap(0x10_0100, t.p[7])]
        .into_iter()
        .chain(walk.clone())
        .chain(context_error_then_the_next_psb(t.p[10], &l))
        .collect();
    check_with_option(&t.w.buf, &space, &want, "read by the resync search");
    // Where libipt reports the nomap: read past, with the TNT after it.
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    trig(&mut t); // p6
    t.at().tnt(&[N, T]); // p7
    t.at().tip(l[0]); // p8
    t.at().tnt(&[N]); // p9
    t.at().tip(l[0]); // p10
    two_psbs_after_a_waiting_event(&mut t, &l); // p11..
    let want: Vec<R> = [R::I(l[0]), R::I(l[2]), nomap(0x10_0100, t.p[8])]
        .into_iter()
        .chain(walk.clone())
        .chain(context_error_then_the_next_psb(t.p[11], &l))
        .collect();
    check_with_option(&t.w.buf, &space, &want, "where libipt reports the nomap");
    // Met while decoding.
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    trig(&mut t); // p5
    t.at().tip(l[0]); // p6
    t.at().tnt(&[N]); // p7
    t.at().tip(l[0]); // p8
    two_psbs_after_a_waiting_event(&mut t, &l); // p9..
    let want: Vec<R> = [R::I(l[0]), R::I(l[2])]
        .into_iter()
        .chain(walk)
        .chain(context_error_then_the_next_psb(t.p[9], &l))
        .collect();
    check_with_option(&t.w.buf, &space, &want, "met while decoding");
}

/// With the option, a TRIG with an instruction count N (no IP bit) binds N instructions
/// from where the last trace item placed the code (a PSB+'s FUP, a TIP, a TNT's branch),
/// as libipt 2.2 reads it: short of the conditional branch that waits for trace, nothing
/// changes; from that branch on, its query fails (a bad query at the TNT after the TRIG),
/// then the resync. Without the option libipt 2.1.2 passes it. (libipt 2.3's resync
/// gives these records.)
#[test]
fn a_trig_with_an_instruction_count_reaching_a_branch_is_a_bad_query() {
    // Four NOPs, a JZ back to them, a NOP, a JMP RAX.
    let code = vec![0x90, 0x90, 0x90, 0x90, 0x74, 0xfa, 0x90, 0xff, 0xe0, 0xf4];
    let mut space = AddressSpace::new();
    space.add_bytes("code", code, ORG);
    let (block, jz, rest): (Vec<R>, u64, Vec<R>) = (
        (0..5).map(|k| R::I(ORG + k)).collect(),
        ORG + 4,
        vec![R::I(ORG + 6), R::I(ORG + 7), disabled(None)],
    );
    let trig = |t: &mut Trace, n: u8| t.raw(&[0xd9, 0x40, 1, n, 0]); // TRIG: ICNT n
    for n in [2u8, 4, 5, 7] {
        // (anchor, the trace, the records before the TRIG's block, the TNT after it)
        let mut cases = Vec::new();
        // A PSB+'s FUP.
        let mut t = Trace::default();
        t.psb_plus(ORG); // p0..p3
        trig(&mut t, n); // p4
        t.at().tnt(&[T]); // p5
        t.at().tnt(&[N]); // p6
        t.at().tip_pgd(None); // p7
        let tnt = t.p[5];
        let more: Vec<R> = block.iter().chain(&rest).cloned().collect();
        cases.push(("PSB+", t, vec![], tnt, more));
        // A TIP.
        let mut t = Trace::default();
        t.psb_plus(ORG + 7); // p0..p3
        t.at().tip(ORG); // p4
        trig(&mut t, n); // p5
        t.at().tnt(&[N]); // p6
        t.at().tip_pgd(None); // p7
        let tnt = t.p[6];
        cases.push(("TIP", t, vec![R::I(ORG + 7)], tnt, rest.clone()));
        // A TNT's branch.
        let mut t = Trace::default();
        t.psb_plus(ORG); // p0..p3
        t.at().tnt(&[T]); // p4
        trig(&mut t, n); // p5
        t.at().tnt(&[N]); // p6
        t.at().tip_pgd(None); // p7
        let tnt = t.p[6];
        cases.push(("TNT", t, block.clone(), tnt, rest.clone()));
        for (anchor, t, before, tnt, after) in cases {
            let passed: Vec<R> = before.iter().chain(&block).chain(&after).cloned().collect();
            let want: Vec<R> = if n < 5 {
                passed.clone()
            } else {
                let query = gap(Some(jz), tnt, "trace stream does not match query".into());
                before
                    .iter()
                    .chain(&block)
                    .cloned()
                    .chain([query, disabled(None)])
                    .collect()
            };
            let what = format!("{anchor}, ICNT {n}");
            let l = check_with_option(&t.w.buf, &space, &want, &what);
            assert_eq!(view(&l), passed, "{what}, libipt 2.1.2");
        }
    }
}

/// With the option, a MODE.Exec that changes nothing, outside a PSB+ while tracing is
/// enabled, and the FUP right after it bind nothing (libipt 2.2 drops its event of no
/// kind at the FUP): the code need not reach the FUP's IP, where it cannot without trace
/// (a conditional branch or an indirect jump waits before it), and the trace goes on. The
/// fast decoder decodes it itself (without the option the window goes to libipt 2.1.2,
/// whose records these are too). (libipt 2.3's resync gives these records.)
#[test]
fn a_mode_exec_that_changes_nothing_and_its_fup_bind_nothing() {
    let (space, l) = jz_then_jmp_rax();
    let quiet = |t: &mut Trace, fup: u64| {
        t.mode_exec(1);
        t.at().fup(fup);
    };
    // (the trace, its records)
    let mut cases: Vec<(Trace, Vec<R>)> = Vec::new();
    // The indirect jump waits for its TIP; the FUP's IP is before it.
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tnt(&[T]);
    quiet(&mut t, l[1]);
    t.at().tip(l[0]);
    t.at().tnt(&[N]);
    t.at().tip_pgd(None);
    let after = [R::I(l[0]), R::I(l[1]), R::I(l[2]), disabled(None)];
    cases.push((
        t,
        [R::I(l[0]), R::I(l[2])]
            .into_iter()
            .chain(after.clone())
            .collect(),
    ));
    // The same, with a PSBEND (a PSB+ without its PSB) after the FUP.
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    t.at().tnt(&[N]);
    quiet(&mut t, l[0]);
    t.at().psbend();
    t.at().tip(l[0]);
    t.at().tnt(&[N]);
    t.at().tip_pgd(None);
    let before = [R::I(l[0]), R::I(l[1]), R::I(l[2])];
    cases.push((t, before.into_iter().chain(after.clone()).collect()));
    // The conditional branch waits for its bit; the FUP's IP is past it.
    let mut t = Trace::default();
    t.psb_plus(l[0]);
    quiet(&mut t, l[2]);
    t.at().tnt(&[T]);
    t.at().tip(l[0]);
    t.at().tnt(&[N]);
    t.at().tip_pgd(None);
    cases.push((
        t,
        [R::I(l[0]), R::I(l[2])].into_iter().chain(after).collect(),
    ));
    for (k, (t, want)) in cases.iter().enumerate() {
        let l = check_with_option(&t.w.buf, &space, want, &format!("case {k}"));
        assert_eq!(view(&l), *want, "case {k}: libipt 2.1.2");
    }
}

/// With the option, a MODE.TSX abort met while decoding with no FUP before the next trace
/// item waits for a FUP in libipt 2.2's event queue (as a TRIG does): the next PSB is
/// libipt's context error, met while decoding or by the resync search after another
/// error (a nomap). (libipt 2.3's resync gives these records; without the option the
/// window goes to libipt 2.1.2.)
#[test]
fn a_tsx_abort_without_its_fup_waits_for_one() {
    let (space, l) = jz_then_jmp_rax();
    // Met while decoding, then the next PSB.
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.mode_tsx(true, true); // p5
    t.at().tip(l[0]); // p6
    t.at().tnt(&[N]); // p7
    t.at().tip(l[0]); // p8
    two_psbs_after_a_waiting_event(&mut t, &l); // p9..
    let want: Vec<R> = [R::I(l[0]), R::I(l[2]), R::I(l[0]), R::I(l[1]), R::I(l[2])]
        .into_iter()
        .chain(context_error_then_the_next_psb(t.p[9], &l))
        .collect();
    check_with_option(&t.w.buf, &space, &want, "met while decoding");
    // A nomap after it: the resync search meets the PSB.
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.mode_tsx(true, true); // p5
    t.at().tip(0x10_0100); // p6
    t.at().tnt(&[N]); // p7
    two_psbs_after_a_waiting_event(&mut t, &l); // p8..
    let [_, resync_error, rest @ ..] = context_error_then_the_next_psb(t.p[8], &l);
    let want: Vec<R> = [
        R::I(l[0]),
        R::I(l[2]),
        nomap(0x10_0100, t.p[8]),
        resync_error,
    ]
    .into_iter()
    .chain(rest)
    .collect();
    check_with_option(&t.w.buf, &space, &want, "a nomap after it");
}

/// With the option, a synchronization after an error at a PSB+ without MODE.Exec: libipt
/// 2.2's mode is unknown there, and it decodes on through its block cache, whose entries
/// keep the mode the code was decoded in. The fast decoder goes on through the blocks it
/// built before (in their mode), as far as they reach. (libipt 2.3's resync gives these
/// records; without the option the window goes to libipt 2.1.2.)
#[test]
fn a_psb_plus_without_mode_exec_after_an_error_decodes_on_through_code_met_before() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(l[0]); // p5
    t.at().tnt(&[N]); // p6
    t.at().tip(l[0]); // p7
    t.raw(&[0x05]); // p8: an unknown opcode
    t.at().psb(); // p9: a PSB+ without MODE.Exec
    t.at().fup(l[0]); // p10
    t.at().psbend(); // p11
    t.at().tnt(&[T]); // p12
    t.at().tip(l[0]); // p13
    t.at().tnt(&[N]); // p14
    t.at().tip_pgd(None); // p15
    let p = &t.p;
    let walk = [R::I(l[0]), R::I(l[2]), R::I(l[0]), R::I(l[1]), R::I(l[2])];
    let want: Vec<R> = walk
        .iter()
        .cloned()
        .chain([
            gap(None, p[8], "unknown opcode".into()),
            gap(None, p[8], "resync error: unknown opcode".into()),
        ])
        .chain(walk.iter().cloned())
        .chain([disabled(None)])
        .collect();
    check_with_option(&t.w.buf, &space, &want, "a PSB+ without MODE.Exec");
}

/// Trace of code (a TNT) right after a PSB+ while tracing is disabled. Passed while
/// decoding (after a disable; timing packets, a CBR or status in the PSB+ or not):
/// libipt's context error at the TNT, on the fast path. At a synchronization: libipt's
/// synchronization fails at the PSBEND where only timing packets come between (ptxed's
/// "sync error"; with `--resync-on-error` on the fast path, without through libipt),
/// at the TNT where an event (a CBR) does. Then the next PSB. (libipt 2.1.2 and 2.3 give
/// these records.)
#[test]
fn trace_right_after_a_psb_plus_while_tracing_is_disabled() {
    let (space, l) = jz_then_jmp_rax();
    let tail = |t: &mut Trace| {
        t.psb_plus(l[1]);
        t.at().fup(l[2]);
        t.at().tip_pgd(None);
    };
    for inside in [None, Some(0x1234u64)] {
        let mut t = Trace::default();
        t.psb_plus(l[0]); // p0..p3
        t.at().tnt(&[T]); // p4
        t.at().fup(l[2]); // p5
        t.at().tip_pgd(None); // p6
        t.at().psb(); // p7
        if let Some(tsc) = inside {
            t.at().tsc(tsc);
        }
        t.at().psbend();
        t.at().tnt(&[T]);
        let at = *t.p.last().unwrap();
        tail(&mut t);
        let c = Case {
            t,
            space: space.clone(),
            l: l.clone(),
        };
        let context = |what: &str| gap(None, at, what.into());
        let mut off = vec![
            R::I(l[0]),
            disabled(Some(l[2])),
            context("unexpected packet context"),
        ];
        let mut on = off.clone();
        on.push(context("resync error: unexpected packet context"));
        for v in [&mut off, &mut on] {
            // (The PSB+'s time comes with the next record.)
            if let Some(tsc) = inside {
                v.push(R::Rec(Record::Timestamp {
                    tsc,
                    perf_time: None,
                }));
            }
            v.extend([R::I(l[1]), disabled(Some(l[2]))]);
        }
        check_both(&c, &off, &on);
    }
    for cbr in [false, true] {
        let mut t = Trace::default();
        t.at().psb(); // p0
        t.mode_exec(1); // p1
        t.at().psbend(); // p2
        if cbr {
            t.raw(&[0x02, 0x03, 0x20, 0x00]); // p3: CBR
        }
        t.at().tsc(0x1234);
        t.at().tnt(&[T]);
        let tnt = *t.p.last().unwrap();
        tail(&mut t);
        let p = t.p.clone();
        let lib = decode(&t.w.buf, &space, DecoderKind::Libipt, false);
        let mut d = decoder(&t.w.buf, &space, DecoderKind::Fast, true);
        let on = view(&d.by_ref().collect::<Vec<_>>());
        assert_eq!(d.decoded_by(), ("fast", None), "cbr {cbr}");
        let rest = [R::I(l[1]), disabled(Some(l[2]))];
        if cbr {
            let context = |what: &str| gap(None, tnt, what.into());
            let want = context("unexpected packet context");
            assert_eq!(view(&lib), [&[want.clone()][..], &rest[..]].concat());
            let resync = context("resync error: unexpected packet context");
            assert_eq!(on, [&[want, resync][..], &rest[..]].concat());
        } else {
            let want = gap(None, p[2], "unexpected packet context".into());
            assert_eq!(view(&lib), [&[want][..], &rest[..]].concat());
            assert_eq!(view(&lib), on);
        }
    }
}

/// A TIP.PGE while tracing is enabled right after a PSB+ passed while decoding (timing
/// packets, or a MODE.Exec that changes nothing, between): the code up to the PSB+'s FUP
/// IP ran (the code walked without trace since the last trace item and the block
/// waiting for trace up to that IP), then libipt's context error at the TIP.PGE, on the
/// fast path. (It dropped that code before. libipt 2.1.2 and 2.3 give these records.)
#[test]
fn tip_pge_while_enabled_after_a_psb_plus_keeps_the_code_up_to_its_fup() {
    let (space, l) = asm(|a| {
        let (mut l2, mut l4, mut l8) = (a.create_label(), a.create_label(), a.create_label());
        a.jz(l2)?; // l0
        a.nop()?; // l1
        a.set_label(&mut l2)?;
        a.jmp(l4)?; // l2
        a.hlt()?; // l3
        a.set_label(&mut l4)?;
        a.nop()?; // l4
        a.nop()?; // l5
        a.jz(l8)?; // l6
        a.nop()?; // l7
        a.set_label(&mut l8)?;
        a.hlt() // l8
    });
    for mode_exec in [false, true] {
        let mut t = Trace::default();
        t.psb_plus(l[0]); // p0..p3
        t.at().tnt(&[T]); // p4
        t.psb_plus(l[5]); // p5..p8
        t.at().tsc(0x100); // p9
        if mode_exec {
            t.mode_exec(1);
        }
        t.at().tip_pge(l[7]);
        let pge = *t.p.last().unwrap();
        t.at().fup(l[8]);
        t.at().tip_pgd(None);
        let c = Case {
            t,
            space: space.clone(),
            l: l.clone(),
        };
        let context = gap(None, pge, "unexpected packet context".into());
        let off = [R::I(l[0]), R::I(l[2]), R::I(l[4]), context];
        // (With the option: the resync at the TIP.PGE, its enable.)
        let on: Vec<R> = off
            .iter()
            .cloned()
            .chain([
                R::Rec(Record::Timestamp {
                    tsc: 0x100,
                    perf_time: None,
                }),
                disabled(None),
                R::Rec(Record::TraceEnabled { ip: l[7] }),
                R::I(l[7]),
                disabled(Some(l[8])),
            ])
            .collect();
        check_both(&c, &off, &on);
    }
}

/// Two MODE.Execs in a PSB+ passed while the code runs: the same mode twice is as one
/// (on the fast path); a second of another mode is libipt's bad status update at it
/// (with `--resync-on-error` on the fast path; without, through libipt, as for one
/// MODE.Exec of another mode). (libipt 2.1.2 and 2.3 give these records.)
#[test]
fn two_mode_execs_in_a_psb_plus_passed_while_decoding() {
    let (space, l) = jz_then_jmp_rax();
    for second in [1u8, 2] {
        let mut t = Trace::default();
        t.psb_plus(l[0]); // p0..p3
        t.at().tnt(&[T]); // p4
        t.at().psb(); // p5
        t.mode_exec(1); // p6
        t.mode_exec(second); // p7
        t.at().fup(l[2]); // p8
        t.at().psbend(); // p9
        t.at().tip(l[1]); // p10
        t.at().fup(l[2]); // p11
        t.at().tip_pgd(None); // p12
        let c = Case {
            t,
            space: space.clone(),
            l: l.clone(),
        };
        let (l, p) = (&c.l, &c.t.p);
        if second == 1 {
            let want = [R::I(l[0]), R::I(l[2]), R::I(l[1]), disabled(Some(l[2]))];
            check_both(&c, &want, &want);
            continue;
        }
        let lib = decode(&c.t.w.buf, &c.space, DecoderKind::Libipt, false);
        // (ptxed's IP for it: where the code after the last trace item starts.)
        let bad = |what: &str| gap(Some(l[2]), p[7], what.into());
        let lib_bad = gap(None, p[7], "bad status update".into());
        assert_eq!(view(&lib), [R::I(l[0]), lib_bad]);
        let mut d = decoder(&c.t.w.buf, &c.space, DecoderKind::Fast, true);
        let on = view(&d.by_ref().collect::<Vec<_>>());
        assert_eq!(d.decoded_by(), ("fast", None));
        assert_eq!(
            on,
            [
                R::I(l[0]),
                bad("bad status update"),
                bad("resync error: bad status update")
            ]
        );
    }
}

/// After a resync on error, an OVF followed by trace of code (no FUP): libipt 2.2's
/// context error at the OVF (the code before it that waits for trace not decoded),
/// which its resync does not get past (a second gap), then the next PSB. (libipt 2.3's
/// resync gives these records.) (Without the option, and before a window's first resync, libipt 2.1.2's
/// records: the fast decoder leaves such an OVF to it.)
#[test]
fn ovf_then_trace_of_code_after_a_resync() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    t.at().tip(l[0]); // p6
    t.at().tnt(&[N]); // p7
    t.at().ovf(); // p8
    t.at().tnt(&[T]); // p9
    t.psb_plus(l[1]); // p10..p13
    t.at().fup(l[2]); // p14
    t.at().tip_pgd(None); // p15
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let trace = &c.t.w.buf;
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, true);
    let on: Vec<Record> = d.by_ref().collect();
    let context = |what: &str| gap(None, p[8], what.into());
    assert_eq!(
        view(&on),
        [
            R::I(l[0]),
            R::I(l[2]),
            nomap(0x10_0100, p[6]),
            R::I(l[0]),
            context("unexpected packet context"),
            context("resync error: unexpected packet context"),
            R::I(l[1]),
            disabled(Some(l[2])),
        ]
    );
    assert_eq!(d.decoded_by(), ("fast", None));
    let lib = decode(trace, &c.space, DecoderKind::Libipt, false);
    let mut d = decoder(trace, &c.space, DecoderKind::Fast, false);
    assert_eq!(d.by_ref().collect::<Vec<_>>(), lib);
}

/// `l0; [%p6: unknown opcode]`: an unknown opcode after an OVF, where libipt looks for
/// the FUP the OVF binds to: its packet error at the OVF (p5), where its decoder stays;
/// its resync fails there the same way; both then synchronize at the next PSB. (Records
/// as libipt 2.2's `pt_blk_resync` gives them, `tests/c/libipt_resync.c` showed.)
#[test]
fn an_unknown_opcode_after_an_ovf_fails_at_the_ovf() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[true]); // p4
    t.at().ovf(); // p5
    t.raw(&[0x05]); // p6
    t.psb_plus(l[1]); // p7..p10
    t.at().tip_pgd(None); // p11
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let after = [R::I(l[1]), R::I(l[2]), disabled(None)];
    let (off, on) = resync_fails(&[R::I(l[0])], p[5], "unknown opcode", &after);
    check_both(&c, &off, &on);
}

/// `l0; [overflow]; [%p8: expected tracing enabled event]`: an OVF bound to a FUP
/// without IP resolves with tracing disabled in libipt's block decoder, while its event
/// decoder takes the TNT after it as trace of code: the block decoder's next query fails
/// (no enable) past that TNT. libipt 2.1.2's pipeline ends there; its resync goes on at
/// the next PSB. (Records as libipt 2.2's `pt_blk_resync` gives them,
/// `tests/c/libipt_resync.c` showed.)
#[test]
fn a_fup_without_ip_after_an_ovf_resolves_it_disabled() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[true]); // p4
    t.at().ovf(); // p5
    t.raw(&[0x1d]); // p6
    t.at().tnt(&[true]); // p7
    t.psb_plus(l[1]); // p8..p11
    t.at().tip_pgd(None); // p12
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let off = [
        R::I(l[0]),
        R::Rec(Record::Overflow { ip: None }),
        gap(None, p[8], "expected tracing enabled event".into()),
    ];
    let on: Vec<R> = off
        .iter()
        .cloned()
        .chain([R::I(l[1]), R::I(l[2]), disabled(None)])
        .collect();
    check_both(&c, &off, &on);
}

/// `l0; [%p8: nomap]`, then with the option: the resync search after the nomap meets
/// two FUPs bound to nothing (p5, p6) and no TIP right after the second: libipt queues
/// two asynchronous branches and fails at the TIP (p8) with an internal error, its
/// resync there the same way; the first branch (from the first FUP's IP to the TIP's
/// target) is its resync's event before that error. (Records as libipt 2.3's
/// `pt_blk_resync` gives them, `tests/c/libipt_resync.c` showed, its events too.)
#[test]
fn two_fups_after_an_error_fail_at_the_tip() {
    let c = tip_to_nomap_then(|t| {
        t.at().fup(ORG); // p5
        t.at().fup(ORG + 2); // p6
        t.at().tnt(&[true, false]); // p7
        t.at().tip(ORG); // p8
    });
    let (l, p) = (&c.l, &c.t.p);
    let off = [R::I(l[0]), nomap(0x10_0100, p[8])];
    let internal = "internal error: two asynchronous branches (FUPs) wait for one TIP after \
                    an error, which libipt's decoder fails at";
    let on: Vec<R> = off
        .iter()
        .cloned()
        .chain([
            xfer(ORG, ORG),
            gap(None, p[8], internal.into()),
            gap(None, p[8], format!("resync error: {internal}")),
        ])
        .collect();
    check_both(&c, &off, &on);
}

/// With the option, a TRIG with the IP bit and an instruction count (p5): libipt 2.2
/// takes a FUP-bound TRIG's IP from its FUP and refuses a count (a bad packet there), its
/// resync failing the same way; the next PSB then. (Records as libipt 2.2's
/// `pt_blk_resync` gives them, `tests/c/libipt_resync.c` showed. libipt 2.1.2 knows no
/// FUP-bound TRIG: without the option, see `trig_packets_change_no_record_and_stay_fast`.)
#[test]
fn a_fup_bound_trig_with_an_instruction_count_is_refused() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[true]); // p4
    t.raw(&[0xd9, 0xc0, 1, 5, 0]); // p5: TRIG, IP and ICNTV, TRBV 1, ICNT 5
    t.at().fup(l[2]); // p6
    t.at().tip(l[3]); // p7
    t.psb_plus(l[1]); // p8..p11
    t.at().tip_pgd(None); // p12
    let (p, trace) = (t.p.clone(), t.w.buf);
    let what = "unknown packet: a TRIG with the IP bit and an instruction count, which \
                libipt 2.2 refuses (the FUP after it gives the IP)";
    let mut d = decoder(&trace, &space, DecoderKind::Fast, true);
    assert_eq!(
        view(&d.by_ref().collect::<Vec<_>>()),
        [
            R::I(l[0]),
            gap(None, p[5], what.into()),
            gap(None, p[5], format!("resync error: {what}")),
            R::I(l[1]),
            R::I(l[2]),
            disabled(None),
        ]
    );
    assert_eq!(d.decoded_by(), ("fast", None));
}

/// `l0; [%p9: nomap]`: after the TIP to unmapped code, a MODE.Exec that changes nothing,
/// its FUP and a PSBEND outside a PSB+ are no events to libipt 2.2: it reads on to the
/// TIP after the TNT, where it reports the nomap. (With the option; libipt 2.2's
/// `pt_blk_resync` showed it, `tests/c/libipt_resync.c`. Without, the window goes to
/// libipt 2.1.2, which stops at such a FUP after a TIP.PGE.)
#[test]
fn a_mode_exec_that_changes_nothing_is_passed_before_a_nomap() {
    let c = tip_to_nomap_then(|t| {
        t.mode_exec(1); // p5
        t.at().fup(ORG); // p6
        t.at().psbend(); // p7
        t.at().tnt(&[true]); // p8
        t.at().tip(ORG); // p9
    });
    let (l, p) = (&c.l, &c.t.p);
    let mut d = decoder(&c.t.w.buf, &c.space, DecoderKind::Fast, true);
    assert_eq!(
        view(&d.by_ref().collect::<Vec<_>>()),
        [R::I(l[0]), nomap(0x10_0100, p[9])]
    );
    assert_eq!(d.decoded_by(), ("fast", None));
}

/// `l0; [%p6: unknown opcode]`: after the TIP to unmapped code, an asynchronous branch's
/// FUP with a packet libipt cannot decode after it: its event decoder, reading on for the
/// branch's TIP, fails there before the code is read; its resync fails the same way.
/// (Records as libipt 2.1.2 gives them, and libipt 2.2's `pt_blk_resync`,
/// `tests/c/libipt_resync.c` showed.)
#[test]
fn an_unknown_opcode_after_a_fup_comes_before_a_nomap() {
    let c = tip_to_nomap_then(|t| {
        t.at().fup(ORG); // p5
        t.raw(&[0x35]); // p6
        t.psb_plus(ORG); // p7..p10
    });
    let (l, p) = (&c.l, &c.t.p);
    let (off, on) = resync_fails(&[R::I(l[0])], p[6], "unknown opcode", &[]);
    check_both(&c, &off, &on);
}

/// `l0; [%p7: nomap]`, then with the option: the resync search meets a FUP bound to
/// nothing, then a PSB where it waits for its TIP: libipt's context error there (it
/// carries no event across a PSB), its resync failing; the next PSB after it then (none).
/// (Records as libipt 2.2's `pt_blk_resync` gives them, `tests/c/libipt_resync.c`
/// showed.)
#[test]
fn a_psb_where_the_resyncs_fup_waits_fails_the_resync() {
    let c = tip_to_nomap_then(|t| {
        t.at().fup(ORG); // p5
        t.at().tnt(&[true]); // p6
        t.psb_plus(ORG); // p7..p10
        t.at().tip(ORG); // p11
    });
    let (l, p) = (&c.l, &c.t.p);
    let off = [R::I(l[0]), nomap(0x10_0100, p[7])];
    let mut on = off.to_vec();
    on.push(gap(
        None,
        p[7],
        "resync error: unexpected packet context".into(),
    ));
    check_both(&c, &off, &on);
}

/// `l0; [%p6: unexpected packet context]`: after the TIP to unmapped code, an
/// asynchronous branch's FUP and a TIP.PGE where it waits for its TIP: libipt's context
/// error at the TIP.PGE, before the code is read; its resync takes the enable (ptxed's
/// `[disabled]` until then) and meets the error once more, then fails. (Records as libipt
/// 2.1.2 gives them, and libipt 2.3's `pt_blk_resync`, `tests/c/libipt_resync.c`
/// showed.)
#[test]
fn a_tip_pge_where_a_fup_waits_comes_before_a_nomap() {
    let c = tip_to_nomap_then(|t| {
        t.at().fup(ORG + 1); // p5
        t.at().tip_pge(ORG); // p6
        t.at().tip(ORG); // p7
    });
    let (l, p) = (&c.l, &c.t.p);
    let context = || gap(None, p[6], "unexpected packet context".into());
    let off = [R::I(l[0]), context()];
    let on = [
        R::I(l[0]),
        context(),
        disabled(None),
        context(),
        gap(None, p[6], "resync error: unexpected packet context".into()),
    ];
    check_both(&c, &off, &on);
}

/// `l0; [%p4: bad query]`: a TIP without IP where `jz` waits for its bit: libipt's query
/// for the bit fails at the TIP (a bad query), whatever it says; libipt's resync fails at
/// that TIP (an internal error: it resumes at no IP); both then synchronize at the next
/// PSB. (Records as libipt 2.1.2 gives them, and libipt 2.2's `pt_blk_resync`,
/// `tests/c/libipt_resync.c` showed.)
#[test]
fn a_tip_without_ip_where_a_tnt_bit_is_needed_is_a_bad_query() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.raw(&[0x0d]); // p4: TIP, IP suppressed
    t.at().tnt(&[true]); // p5
    t.psb_plus(l[1]); // p6..p9
    t.at().tip_pgd(None); // p10
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let bad = gap(Some(l[0]), p[4], "trace stream does not match query".into());
    let after = [R::I(l[1]), R::I(l[2]), disabled(None)];
    let off: Vec<R> = [R::I(l[0]), bad.clone()]
        .into_iter()
        .chain(after.clone())
        .collect();
    let internal = "resync error: internal error: a TIP without IP where libipt's resync resumes";
    let on: Vec<R> = [R::I(l[0]), bad, gap(None, p[4], internal.into())]
        .into_iter()
        .chain(after)
        .collect();
    check_both(&c, &off, &on);
}

/// A PSB+ with two FUPs and two MODE.Execs of the same mode: libipt takes the last FUP's
/// IP, the second MODE.Exec changes nothing; at the synchronization (p0..p5) and passed
/// while `jmp rax` waits for its TIP (p8..p12), with and without the option. (Records as
/// libipt 2.1.2 gives them, and libipt 2.2's `pt_blk_resync`, `tests/c/libipt_resync.c`
/// showed.)
#[test]
fn a_psb_plus_with_two_fups_takes_the_last() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.at().fup(l[3]); // p1
    t.mode_exec(1); // p2
    t.at().fup(l[0]); // p3
    t.mode_exec(1); // p4
    t.at().psbend(); // p5
    t.at().tnt(&[true]); // p6
    t.at().tip(l[1]); // p7
    t.at().psb(); // p8
    t.at().fup(0x50_0000); // p9
    t.at().fup(l[2]); // p10
    t.mode_exec(1); // p11
    t.at().psbend(); // p12
    t.at().tip_pgd(None); // p13
    let c = Case { t, space, l };
    let l = &c.l;
    let want = [
        R::I(l[0]),
        R::I(l[2]),
        R::I(l[1]),
        R::I(l[2]),
        disabled(None),
    ];
    check_both(&c, &want, &want);
}

/// `l0; [%p7: unexpected packet context]`: an asynchronous branch's FUP (p4), a PSBEND
/// outside a PSB+ (p5: libipt's event decoder passes it) and a TNT: the bits go first, as
/// right after the FUP; the PSB where the FUP still waits for its TIP is libipt's context
/// error, its resync failing there. (Records as libipt 2.1.2 gives them, and libipt 2.2's
/// `pt_blk_resync`, `tests/c/libipt_resync.c` showed.)
#[test]
fn a_psbend_between_a_fup_and_its_tnt_is_passed() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[2]); // p4
    t.at().psbend(); // p5
    t.at().tnt(&[true]); // p6
    t.psb_plus(l[1]); // p7..p10
    t.at().tip_pgd(None); // p11
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let (off, on) = resync_fails(&[R::I(l[0])], p[7], "unexpected packet context", &[]);
    check_both(&c, &off, &on);
}

/// `jmp rax` with a TNT bit left and a TSC before the TIP after the TNT packet (a deferred
/// TIP): libipt's query decoder reads the TSC on the way to the TIP, its time the disable's
/// after the bit is used; the fast decoder takes it so too (it handed such windows to
/// libipt). (Records as libipt 2.1.2 gives them, and libipt 2.2's `pt_blk_resync`,
/// `tests/c/libipt_resync.c` showed.)
#[test]
fn timing_packets_before_a_deferred_tip_are_its_time() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.at().tsc(100); // p1
    t.at().fup(l[0]); // p2
    t.mode_exec(1); // p3
    t.at().psbend(); // p4
    t.at().tnt(&[true, false]); // p5
    t.at().tsc(200); // p6
    t.at().tip(l[0]); // p7
    t.at().tip_pgd(None); // p8
    t.at().tsc(300); // p9
    t.at().tip_pge(l[1]); // p10
    t.at().tip_pgd(None); // p11
    let c = Case { t, space, l };
    let l = &c.l;
    let tsc = |tsc| {
        R::Rec(Record::Timestamp {
            tsc,
            perf_time: None,
        })
    };
    let want = [
        tsc(100),
        R::I(l[0]),
        R::I(l[2]),
        R::I(l[0]),
        R::I(l[1]),
        R::I(l[2]),
        tsc(200),
        disabled(None),
        tsc(300),
        R::Rec(Record::TraceEnabled { ip: l[1] }),
        R::I(l[1]),
        R::I(l[2]),
        disabled(None),
    ];
    check_both(&c, &want, &want);
}

/// `l0 l2; [%p7: bad query]`: an asynchronous branch's FUP (p4), then TNT packets before
/// its TIP, a bit of the first still left at `jmp rax`: libipt's query for the jump's
/// target fails (the TIP is the asynchronous branch's), reported where its query decoder
/// stands, at the next TNT packet past the PAD. Without the option the next PSB then; with
/// it the resync resumes at the asynchronous branch (the FUP still waits in libipt's event
/// queue) to the TIP's target, where `jz` finds no bit (a second bad query, at the PSBEND
/// of the PSB+ after it). (Records as libipt 2.1.2 gives them, and libipt 2.3's
/// `pt_blk_resync`, `tests/c/libipt_resync.c` showed, its events too.)
#[test]
fn an_indirect_branch_among_the_tnts_before_an_asynchronous_tip_is_a_bad_query() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.at().tnt(&[true, true]); // p5
    t.at().pad(); // p6
    t.at().tnt(&[false]); // p7
    t.at().tip(l[0]); // p8
    t.psb_plus(l[1]); // p9..p12
    t.at().tip_pgd(None); // p13
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let bad = |ip: u64, at: u64| gap(Some(ip), at, "trace stream does not match query".into());
    let after = [R::I(l[1]), R::I(l[2]), disabled(None)];
    let off: Vec<R> = [R::I(l[0]), R::I(l[2]), bad(l[2], p[7])]
        .into_iter()
        .chain(after.clone())
        .collect();
    let on: Vec<R> = [
        R::I(l[0]),
        R::I(l[2]),
        bad(l[2], p[7]),
        xfer(l[3], l[0]),
        R::I(l[0]),
        bad(l[0], p[12]),
    ]
    .into_iter()
    .chain(after)
    .collect();
    check_both(&c, &off, &on);
}

/// `l0 l2; [%p7: bad query]`: an asynchronous branch's FUP (p4), a CYC, TNT packets, a CYC
/// and an unknown opcode where its TIP would be: timing packets between the FUP and its
/// TNTs are read as usual, the bits go first, and `jmp rax`, met while a bit is left, is
/// libipt's bad query where its query decoder stands (at the CYC past the TNT); libipt's
/// resync then fails at the unknown opcode; both go on at the next PSB. (Records as
/// libipt 2.1.2 gives them, and libipt 2.2's `pt_blk_resync`, `tests/c/libipt_resync.c`
/// showed.)
#[test]
fn timing_packets_after_an_asynchronous_fup_come_before_its_tnts() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.raw(&[0x03]); // p5: CYC
    t.at().tnt(&[true, true]); // p6
    t.raw(&[0x03]); // p7: CYC
    t.raw(&[0x05]); // p8: unknown opcode
    t.psb_plus(l[1]); // p9..p12
    t.at().tip_pgd(None); // p13
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let bad = gap(Some(l[2]), p[7], "trace stream does not match query".into());
    let after = [R::I(l[1]), R::I(l[2]), disabled(None)];
    let off: Vec<R> = [R::I(l[0]), R::I(l[2]), bad.clone()]
        .into_iter()
        .chain(after.clone())
        .collect();
    let on: Vec<R> = [
        R::I(l[0]),
        R::I(l[2]),
        bad,
        gap(None, p[8], "resync error: unknown opcode".into()),
    ]
    .into_iter()
    .chain(after)
    .collect();
    check_both(&c, &off, &on);
}

/// An interrupt's FUP (p5) with a TSC (p6) before the TNT packet ahead of its TIP: the TSC
/// is read as usual, its time the asynchronous branch's; the fast decoder keeps the
/// window (it handed it to libipt before). (Records as libipt 2.1.2 gives them.)
#[test]
fn a_tsc_between_an_interrupts_fup_and_its_tnt_is_the_branchs_time() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.at().tsc(100); // p1
    t.at().fup(l[0]); // p2
    t.mode_exec(1); // p3
    t.at().psbend(); // p4
    t.at().fup(l[2]); // p5
    t.at().tsc(200); // p6
    t.at().tnt(&[true]); // p7
    t.at().tip(l[1]); // p8
    t.at().tsc(300); // p9
    t.at().tip_pgd(None); // p10
    let c = Case { t, space, l };
    let l = &c.l;
    let tsc = |tsc| {
        R::Rec(Record::Timestamp {
            tsc,
            perf_time: None,
        })
    };
    let want = [
        tsc(100),
        R::I(l[0]),
        tsc(200),
        R::Rec(Record::KernelXfer {
            from: l[2],
            to: Some(l[1]),
        }),
        R::I(l[1]),
        R::I(l[2]),
        tsc(300),
        disabled(None),
    ];
    check_both(&c, &want, &want);
}

/// An asynchronous branch's FUP (p4) followed by a MODE.Exec that changes nothing (p5) and
/// the FUP right after it (p6), a PSBEND outside a PSB+ (p7) and a TNT (p8) (a PSB+ that
/// lost its PSB, in a mutated trace): with the option, libipt 2.2's event decoder drops
/// the MODE.Exec's event of no kind at that FUP, which binds nothing, and the branch goes
/// on waiting for its TIP. The TNT's second bit finds the indirect jump (a bad query);
/// the resync search resumes at the TIP.PGD (p9), the asynchronous disable at the first
/// FUP's IP; the TNT after it (p10) is a context error, where the resync fails. Without
/// the option: libipt 2.1.2's records (the window goes to it). (Records as libipt 2.3's
/// `pt_blk_resync` gives them, `tests/c/libipt_resync.c` showed: its instructions and
/// errors; the disable at the first FUP's IP is its event there, checked too.)
#[test]
fn a_mode_exec_that_changes_nothing_and_its_fup_leave_an_asynchronous_fup_waiting() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(0x413); // p4
    t.mode_exec(1); // p5
    t.at().fup(l[0]); // p6
    t.at().psbend(); // p7
    t.at().tnt(&[T, T]); // p8
    t.at().tip_pgd(None); // p9
    t.at().tnt(&[N]); // p10
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let on = [
        R::I(l[0]),
        R::I(l[2]),
        gap(Some(l[2]), p[9], "trace stream does not match query".into()),
        disabled(Some(0x413)),
        gap(None, p[10], "unexpected packet context".into()),
        gap(
            None,
            p[10],
            "resync error: unexpected packet context".into(),
        ),
    ];
    check_error_then_resync(&c, &on, 3, "FUP, MODE.Exec, FUP");
}

/// An asynchronous branch's FUP read while decoding (p4), TNT bits after it, and an error
/// before its TIP (the second bit finds `jmp rax`, and a PSB comes where the TIP would:
/// libipt's read-ahead for that TIP fails there, a bad query): the
/// FUP still waits in libipt's event queue, so the resync search that meets the next PSB
/// fails there (libipt carries no event across a PSB: its context error), then the PSB+
/// after, if any. (Records as libipt 2.3's `pt_blk_resync` gives them,
/// `tests/c/libipt_resync.c` showed; the window went to libipt 2.1.2, which resyncs at the
/// next PSB only.)
#[test]
fn a_psb_where_a_fup_read_before_the_error_waits_fails_the_resync() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.at().tnt(&[N, N]); // p5
    t.psb_plus(l[1]); // p6..p9
    t.at().tip_pgd(None); // p10
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let bad = gap(Some(l[2]), p[6], "trace stream does not match query".into());
    let on = [
        R::I(l[0]),
        R::I(l[1]),
        R::I(l[2]),
        bad,
        gap(None, p[6], "resync error: unexpected packet context".into()),
    ];
    check_error_then_resync(&c, &on, 4, "a FUP waits at a PSB");
}

/// The same with the error before the TNT packets end (`jmp rax` meets the second, whose
/// bits are no TIP: a bad query at the third): the FUP still waits when the resync search
/// meets the PSB, which fails it.
#[test]
fn a_psb_where_a_fup_read_before_an_error_among_its_tnts_waits_fails_the_resync() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.at().tnt(&[N]); // p5
    t.at().tnt(&[T]); // p6
    t.at().tnt(&[T]); // p7
    t.psb_plus(l[1]); // p8..p11
    t.at().tip_pgd(None); // p12
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let bad = gap(Some(l[2]), p[7], "trace stream does not match query".into());
    let on = [
        R::I(l[0]),
        R::I(l[1]),
        R::I(l[2]),
        bad,
        gap(None, p[8], "resync error: unexpected packet context".into()),
    ];
    let off = check_with_option(&c.t.w.buf, &c.space, &on, "a FUP waits at a PSB");
    // (Without the option, libipt 2.1.2: the same error, then the PSB+ after it.)
    let next_psb = [R::I(l[1]), R::I(l[2]), disabled(None)];
    assert_eq!(view(&off), [&on[..4], &next_psb[..]].concat());
}

/// An OVF whose FUP search meets a packet the end of the trace cuts (a TSC's first two
/// bytes): libipt's search meets the end there, and the overflow resolves with tracing
/// disabled, without IP (libipt 2.1.2, and 2.3's resync: `tests/c/libipt_resync.c`
/// showed); the fast decoder handed such windows to libipt, and after a resync left them
/// as beyond it.
#[test]
fn an_ovf_before_a_packet_the_end_cuts_resolves_disabled() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().tnt(&[T]); // p4
    t.at().tip(0x10_0100); // p5
    t.at().ovf(); // p6
    t.raw(&[0x19, 0x98]); // p7
    let c = Case { t, space, l };
    let l = &c.l;
    let want = [
        R::I(l[0]),
        R::I(l[2]),
        R::Rec(Record::Overflow { ip: None }),
    ];
    check_both(&c, &want, &want);
}

/// A PSB+ an OVF breaks before its MODE.Exec (a mutated trace), the OVF resolved at the
/// FUP after it: libipt's mode is unknown there, and its instructions say so; the fast
/// decoder, whose blocks have a mode, hands such a window to libipt (it had decoded the
/// code as 64-bit code where the end of the trace did not send the window to libipt).
#[test]
fn an_ovf_resolved_before_any_mode_exec_goes_to_libipt() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.at().psb(); // p0
    t.at().ovf(); // p1
    t.at().fup(l[0]); // p2
    t.at().tnt(&[T]); // p3
    t.at().tip_pgd(None); // p4
    let c = Case { t, space, l };
    let l = decode(&c.t.w.buf, &c.space, DecoderKind::Libipt, false);
    assert!(
        l.iter()
            .filter_map(|r| r.as_instruction())
            .all(|i| i.mode == drpttracer::decode::ExecMode::Unknown),
        "{l:?}"
    );
    for resync in [false, true] {
        let mut d = decoder(&c.t.w.buf, &c.space, DecoderKind::Fast, resync);
        assert_eq!(d.by_ref().collect::<Vec<_>>(), l);
        let why = "OVF resolved at a FUP while the mode is unknown";
        assert_eq!(d.decoded_by(), ("libipt", Some(why)));
    }
}

/// An asynchronous branch's FUP (p4) whose IP the code does not reach before its TIP (p6),
/// a TNT between: libipt's query fails at that TIP (a bad query), and its resync resumes
/// at that branch, its current event, from the FUP's IP to the TIP's target. (Records as
/// libipt 2.3's `pt_blk_resync` gives them, `tests/c/libipt_resync.c` showed, its events
/// too; the fast decoder resumed at the target without the branch.)
#[test]
fn an_asynchronous_branch_not_reached_after_its_tnts_is_where_the_resync_resumes() {
    let (space, l) = jz_then_jmp_rax();
    let mut t = Trace::default();
    t.psb_plus(l[0]); // p0..p3
    t.at().fup(l[3]); // p4
    t.at().tnt(&[T]); // p5
    t.at().tip(l[1]); // p6
    t.at().tip_pgd(None); // p7
    let c = Case { t, space, l };
    let (l, p) = (&c.l, &c.t.p);
    let on = [
        R::I(l[0]),
        R::I(l[2]),
        gap(Some(l[2]), p[6], "trace stream does not match query".into()),
        xfer(l[3], l[1]),
        R::I(l[1]),
        R::I(l[2]),
        disabled(None),
    ];
    check_error_then_resync(&c, &on, 3, "FUP not reached");
}
