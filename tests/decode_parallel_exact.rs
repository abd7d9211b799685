//! PSB-parallel decode is record-for-record the sequential decode (issue 13, point 2):
//! the whole record streams are compared (timestamps, gaps with their offsets and texts,
//! everything), on valid traces with many PSBs and timing packets and on mutated ones.

mod common;

use drpttracer::decode::parallel::{decode_parallel, decode_parallel_compact, split_at_psbs};
use drpttracer::decode::sideband::{encode_mmap2, parse_records, TEST_SAMPLE_TYPE};
use drpttracer::decode::testgen::{
    mutate, LoopProgram, PtWriter, XorShift, FUNC_CONDS, LOOP_CONDS,
};
use drpttracer::decode::{
    decode_insn, AddressSpace, CpuParams, DecoderKind, ExecMode, ImageEvent, ImageResolver,
    InsnClass, PtDecoder, Record, TraceDecoder, TraceParams, WindowOptions,
};
use drpttracer::metadata::TimeConv;

/// Everything but the trace bytes.
struct Setup {
    space: AddressSpace,
    events: Vec<ImageEvent>,
    params: TraceParams,
    opts: WindowOptions,
}

fn sequential(trace: &[u8], s: &Setup) -> Vec<Record> {
    PtDecoder::new(
        trace,
        s.params,
        s.space.clone(),
        s.events.clone(),
        ImageResolver::default(),
        s.opts.clone(),
    )
    .unwrap()
    .collect()
}

/// Fails with the first differing index and the records around it.
fn assert_same(seq: &[Record], par: &[Record], what: &str) {
    if seq == par {
        return;
    }
    let first = seq
        .iter()
        .zip(par)
        .position(|(a, b)| a != b)
        .unwrap_or(seq.len().min(par.len()));
    let show = |v: &[Record]| {
        let lo = first.saturating_sub(4);
        let hi = (first + 5).min(v.len());
        (lo..hi)
            .map(|k| format!("  {k:>7}{} {:?}", if k == first { '>' } else { ' ' }, v[k]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    panic!(
        "{what}: parallel differs from sequential at record {first} \
         (sequential {} records, parallel {}):\nsequential:\n{}\nparallel:\n{}",
        seq.len(),
        par.len(),
        show(seq),
        show(par)
    );
}

/// The sequential fast decoder's records and who decoded them.
fn fast_sequential(trace: &[u8], s: &Setup) -> (Vec<Record>, (&'static str, Option<&'static str>)) {
    let mut d = PtDecoder::new(
        trace,
        s.params,
        s.space.clone(),
        s.events.clone(),
        ImageResolver::default(),
        WindowOptions {
            decoder: DecoderKind::Fast,
            ..s.opts.clone()
        },
    )
    .unwrap();
    let recs = d.by_ref().collect();
    (recs, d.decoded_by())
}

/// Compares `decode_parallel` on `threads` threads (and `decode_parallel_compact` on 2
/// when `compact`) with the sequential decode; returns the sequential records. With
/// sideband events both are libipt's (the fast decoder follows sideband in one pass: it
/// is compared with them here too).
fn check(trace: &[u8], s: &Setup, what: &str, threads: &[usize], compact: bool) -> Vec<Record> {
    let libipt;
    let s = if s.events.is_empty() {
        s
    } else {
        libipt = Setup {
            space: s.space.clone(),
            events: s.events.clone(),
            params: s.params,
            opts: WindowOptions {
                decoder: DecoderKind::Libipt,
                ..s.opts.clone()
            },
        };
        &libipt
    };
    let seq = sequential(trace, s);
    if !s.events.is_empty() {
        let (fast, _) = fast_sequential(trace, s);
        assert_same(&seq, &fast, &format!("{what}, the fast decoder"));
    }
    for &n in threads {
        let par = decode_parallel(
            trace,
            &s.params,
            &s.space,
            &s.events,
            &ImageResolver::default(),
            &s.opts,
            n,
        )
        .unwrap();
        assert_same(&seq, &par, &format!("{what}, {n} threads"));
    }
    if !compact {
        return seq;
    }
    let chunks = decode_parallel_compact(
        trace,
        &s.params,
        &s.space,
        &s.events,
        &ImageResolver::default(),
        &s.opts,
        2,
    )
    .unwrap();
    let flat: Vec<Record> = chunks.iter().flat_map(|c| c.iter().cloned()).collect();
    assert_same(&seq, &flat, &format!("{what}, compact, 2 threads"));
    seq
}

const BASE: u64 = 0x40_0000;
/// CTC bits per MTC period (`mtc_freq`) of the timed traces' CPU.
const MTC_FREQ: u8 = 2;

/// CPU parameters under which MTC packets advance libipt's time (TMA + cpuid 0x15).
fn timed_cpu() -> CpuParams {
    CpuParams {
        mtc_freq: MTC_FREQ,
        nom_freq: 0,
        cpuid_0x15_eax: 1,
        cpuid_0x15_ebx: 3,
        ..Default::default()
    }
}

fn time_conv() -> Option<TimeConv> {
    Some(TimeConv {
        time_shift: 0,
        time_mult: 1,
        time_zero: 0,
    })
}

/// The addresses of the instructions from `pc` on that execute without trace (up to and
/// including the first conditional branch; direct jumps followed).
fn straight_line(prog: &LoopProgram, mut pc: u64) -> Vec<u64> {
    let mut out = Vec::new();
    loop {
        let off = (pc - prog.base) as usize;
        let info = decode_insn(&prog.code[off..], pc, ExecMode::Bit64).unwrap();
        out.push(pc);
        match info.class {
            InsnClass::CondJump => return out,
            _ => pc = info.direct_target.unwrap_or(pc + u64::from(info.size)),
        }
    }
}

/// A CYC packet with payload `v`: 5 bits in the first byte, 7 in each following one (bit
/// 2, then bit 0, says another byte follows).
fn cyc_packet(v: u64) -> Vec<u8> {
    let mut out = vec![(((v & 0x1f) as u8) << 3) | 0x03];
    let mut rest = v >> 5;
    let mut last = 0;
    while rest != 0 {
        out[last] |= if last == 0 { 0x04 } else { 0x01 };
        out.push(((rest & 0x7f) as u8) << 1);
        last = out.len() - 1;
        rest >>= 7;
    }
    out
}

/// A valid trace of the loop program with timing: PSB+ (TSC, TMA, CBR, MODE, FUP) every
/// `psb_every` bytes or so, MTC and stand-alone TSC packets (some right before a PSB, so
/// that a segment boundary falls right after them), CYC packets when `cyc`, tracing
/// disabled at returns (TIP.PGD) and re-enabled with TSC + TIP.PGE (PSBs without FUP fall
/// into those stretches), asynchronous branches (FUP + TIP), PADs. Some PSB+ come while
/// the program runs straight-line code: their FUP is an instruction ahead of the last
/// branch target (as when hardware sends a PSB in the middle of a block).
struct TimedGen<'a> {
    prog: &'a LoopProgram,
    rng: XorShift,
    w: PtWriter,
    tsc: u64,
    ctc: u32,
    cyc: bool,
    psb_every: usize,
    last_psb: usize,
}

impl TimedGen<'_> {
    fn raw(&mut self, b: &[u8]) {
        self.w.buf.extend_from_slice(b);
    }

    fn tsc(&mut self) {
        self.tsc += 10 + self.rng.below(500);
        let t = self.tsc;
        self.w.tsc(t);
    }

    fn mtc(&mut self) {
        self.ctc = self.ctc.wrapping_add(1 << MTC_FREQ);
        self.tsc += 3 << MTC_FREQ;
        let payload = (self.ctc >> MTC_FREQ) as u8;
        self.raw(&[0x59, payload]);
    }

    fn cyc(&mut self) {
        // Mostly 5-bit payloads (one byte), sometimes up to 19 bits (two or three bytes).
        let v = if self.rng.below(4) == 0 {
            1 + self.rng.below(1 << 19)
        } else {
            1 + self.rng.below(31)
        };
        let b = cyc_packet(v);
        self.raw(&b);
    }

    /// Random timing packets (possibly none).
    fn timing(&mut self) {
        for _ in 0..self.rng.below(3) {
            match self.rng.below(if self.cyc { 5 } else { 4 }) {
                0 | 1 => self.mtc(),
                2 => self.tsc(),
                3 => self.raw(&[0]), // PAD
                _ => self.cyc(),
            }
        }
    }

    /// PSB+ with TSC and TMA (and sometimes CBR); FUP at `fup` when tracing is enabled.
    fn psb(&mut self, fup: Option<u64>) {
        self.last_psb = self.w.buf.len();
        self.w.psb();
        self.tsc += 100;
        let t = self.tsc;
        self.w.tsc(t);
        let ctc = (self.ctc & 0xffff) as u16;
        let fc = self.rng.below(0x200) as u16;
        let [c0, c1] = ctc.to_le_bytes();
        let [f0, f1] = fc.to_le_bytes();
        self.raw(&[0x02, 0x73, c0, c1, 0, f0, f1]);
        if self.rng.below(2) == 0 {
            let ratio = 20 + self.rng.below(10) as u8;
            self.raw(&[0x02, 0x03, ratio, 0]);
        }
        self.w.mode64();
        if let Some(ip) = fup {
            self.w.fup(ip);
        }
        self.w.psbend();
    }

    /// A PSB+ if one is due, sometimes right after timing packets; with tracing enabled
    /// at the branch target `at`, its FUP is `at` or (when `ahead`) sometimes an
    /// instruction straight ahead of it.
    fn maybe_psb(&mut self, at: Option<u64>, ahead: bool) {
        if self.w.buf.len() - self.last_psb >= self.psb_every && self.rng.below(3) != 0 {
            if self.rng.below(2) == 0 {
                self.tsc();
                if self.rng.below(2) == 0 {
                    self.mtc();
                }
            }
            let fup = at.map(|ip| {
                if ahead && self.rng.below(3) == 0 {
                    let run = straight_line(self.prog, ip);
                    run[self.rng.below(run.len() as u64) as usize]
                } else {
                    ip
                }
            });
            self.psb(fup);
        }
    }

    fn build(mut self, size: usize) -> Vec<u8> {
        let p = self.prog;
        self.psb(None);
        self.tsc();
        self.w.mode64().tip_pge(p.top);
        while self.w.buf.len() < size {
            self.timing();
            let outer: Vec<bool> = (0..LOOP_CONDS).map(|_| self.rng.below(2) == 1).collect();
            let inner: Vec<bool> = (0..FUNC_CONDS).map(|_| self.rng.below(2) == 1).collect();
            self.w.tnt(&outer).tip(p.func);
            self.maybe_psb(Some(p.func), true);
            self.timing();
            self.w.tnt(&inner);
            match self.rng.below(8) {
                0 => {
                    // Disabled at the return, enabled again after it later.
                    self.w.tip_pgd(None);
                    self.timing();
                    self.maybe_psb(None, false);
                    self.timing();
                    self.tsc();
                    self.w.mode64().tip_pge(p.after_call);
                }
                1 => {
                    // An asynchronous branch right after the return: after_call -> top
                    // (sometimes right after a PSB+).
                    self.w.tip(p.after_call);
                    self.maybe_psb(Some(p.after_call), false);
                    self.timing();
                    self.w.fup(p.after_call).tip(p.top);
                    self.maybe_psb(Some(p.top), true);
                    continue;
                }
                _ => {
                    self.w.tip(p.after_call);
                }
            }
            self.maybe_psb(Some(p.after_call), true);
        }
        self.w.buf
    }
}

/// The payload size of the IP packet (TIP, TIP.PGE, TIP.PGD, FUP) at `p`.
fn wire_ip_len(t: &[u8], p: usize) -> usize {
    match t[p] >> 5 {
        0 => 0,
        1 => 2,
        2 => 4,
        3 | 4 => 6,
        _ => 8,
    }
}

fn timed_trace(prog: &LoopProgram, size: usize, psb_every: usize, seed: u64, cyc: bool) -> Vec<u8> {
    TimedGen {
        prog,
        rng: XorShift::new(seed),
        w: PtWriter::new(),
        tsc: 1_000_000,
        ctc: 0,
        cyc,
        psb_every,
        last_psb: 0,
    }
    .build(size)
}

/// The loop program's image, and sideband that maps the same code from a file at several
/// times within the traces' time range (the image changes over time, its bytes do not),
/// plus a mapping elsewhere.
fn image_and_events(prog: &LoopProgram, dir: &std::path::Path) -> (AddressSpace, Vec<ImageEvent>) {
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let file = dir.join("loop.bin");
    std::fs::write(&file, &prog.code).unwrap();
    let mut sb = Vec::new();
    for t in [1_000_500u64, 1_004_000, 1_020_000, 1_050_000] {
        sb.extend(encode_mmap2(1, 1, prog.base, 0x1000, 0, &file, t));
    }
    sb.extend(encode_mmap2(1, 1, 0x80_0000, 0x1000, 0, &file, 1_010_000));
    let events = parse_records("sb", &sb, TEST_SAMPLE_TYPE).unwrap();
    (space, events)
}

/// [`image_and_events`], then the loop's code mapped again with each short conditional
/// jump's condition inverted (`jz` for `jnz`...: the same instruction bounds, other
/// branches taken) at three times in the traces' range, and back: code the fast decoder
/// decoded changes under it, while tracing is on or off.
fn image_and_changing_events(
    prog: &LoopProgram,
    dir: &std::path::Path,
) -> (AddressSpace, Vec<ImageEvent>) {
    let (space, _) = image_and_events(prog, dir);
    let mut inverted = prog.code.clone();
    let mut off = 0;
    while off < inverted.len() {
        let pc = prog.base + off as u64;
        let Some(info) = decode_insn(&prog.code[off..], pc, ExecMode::Bit64) else {
            break;
        };
        if info.class == InsnClass::CondJump && (0x70..0x80).contains(&inverted[off]) {
            inverted[off] ^= 1;
        }
        off += usize::from(info.size);
    }
    assert_ne!(inverted, prog.code);
    let (same, other) = (dir.join("loop.bin"), dir.join("inverted.bin"));
    std::fs::write(&same, &prog.code).unwrap();
    std::fs::write(&other, &inverted).unwrap();
    let mut sb = Vec::new();
    for (t, f) in [
        (1_002_000u64, &other),
        (1_006_000, &same),
        (1_012_000, &other),
        (1_030_000, &same),
    ] {
        sb.extend(encode_mmap2(1, 1, prog.base, 0x1000, 0, f, t));
    }
    (space, parse_records("sb", &sb, TEST_SAMPLE_TYPE).unwrap())
}

fn count<F: Fn(&Record) -> bool>(recs: &[Record], f: F) -> usize {
    recs.iter().filter(|r| f(r)).count()
}

#[test]
fn parallel_equals_sequential_on_valid_traces() {
    let prog = LoopProgram::new(BASE);
    let dir = tempfile::tempdir().unwrap();
    let (space, events) = image_and_events(&prog, dir.path());
    let mut cases = 0;
    // The generator's own traces: PSB+ with TSC and FUP, small PSB periods.
    for (size, psb_every, seed) in [(40_000, 40, 1u64), (30_000, 100, 2), (20_000, 300, 3)] {
        let (trace, _) = prog.trace(size, psb_every, seed);
        assert!(split_at_psbs(&trace, 64).len() > 20);
        for (time, window) in [(None, Some(0)), (time_conv(), None)] {
            let s = Setup {
                space: space.clone(),
                events: if time.is_some() {
                    events.clone()
                } else {
                    vec![]
                },
                params: TraceParams {
                    time,
                    ..Default::default()
                },
                opts: WindowOptions {
                    source: "loop.pt".into(),
                    window_id: window,
                    cpu: Some(3),
                    base_offset: 0x100,
                    ..Default::default()
                },
            };
            let what = format!("loop {size}/{psb_every}/{seed}");
            let seq = check(&trace, &s, &what, &[2, 3, 4], true);
            if !s.events.is_empty() {
                assert_eq!(fast_sequential(&trace, &s).1, ("fast", None), "{what}");
            }
            assert_eq!(count(&seq, |r| matches!(r, Record::Gap(_))), 0);
            cases += 1;
        }
    }
    // Timed traces: MTC-driven time, timestamps at enable/disable/async events, PSBs
    // right after TSC/MTC, PSBs while tracing is disabled; with and without CYC.
    for (size, psb_every, seed, cyc) in [
        (30_000, 60, 11u64, false),
        (30_000, 150, 12, false),
        (20_000, 40, 13, true),
    ] {
        let trace = timed_trace(&prog, size, psb_every, seed, cyc);
        assert!(split_at_psbs(&trace, 64).len() > 30);
        let s = Setup {
            space: space.clone(),
            events: events.clone(),
            params: TraceParams {
                cpu: timed_cpu(),
                time: time_conv(),
                ..Default::default()
            },
            opts: WindowOptions {
                source: "timed.pt".into(),
                window_id: Some(7),
                ..Default::default()
            },
        };
        let what = format!("timed {size}/{psb_every}/{seed}/cyc {cyc}");
        let seq = check(&trace, &s, &what, &[2, 3, 4], true);
        // The sideband's times fall inside the trace's: the fast decoder applies each where
        // libipt does, and keeps its blocks (the remapped bytes are the same).
        assert_eq!(fast_sequential(&trace, &s).1, ("fast", None), "{what}");
        assert_eq!(count(&seq, |r| matches!(r, Record::Gap(_))), 0, "{what}");
        // Plenty of timestamps, enable/disable and async-branch records to get right.
        let ts = count(&seq, |r| matches!(r, Record::Timestamp { .. }));
        assert!(ts > 50, "{what}: {ts} timestamps");
        let enabled = count(&seq, |r| matches!(r, Record::TraceEnabled { .. }));
        let xfers = count(&seq, |r| matches!(r, Record::KernelXfer { .. }));
        assert!(
            enabled > 10 && xfers > 10,
            "{what}: {enabled} enabled, {xfers} xfers"
        );
        cases += 1;
    }
    assert_eq!(cases, 9);
    // Sideband that changes the code under the decoders (conditions inverted and back):
    // every record libipt's, sequentially and PSB-parallel, and the fast decoder's too.
    let changing_dir = tempfile::tempdir().unwrap();
    let (space, changing) = image_and_changing_events(&prog, changing_dir.path());
    for (size, psb_every, seed) in [(30_000, 60, 31u64), (30_000, 150, 32)] {
        let trace = timed_trace(&prog, size, psb_every, seed, false);
        let s = Setup {
            space: space.clone(),
            events: changing.clone(),
            params: TraceParams {
                cpu: timed_cpu(),
                time: time_conv(),
                ..Default::default()
            },
            opts: WindowOptions {
                source: "changing.pt".into(),
                ..Default::default()
            },
        };
        let what = format!("changing code {size}/{psb_every}/{seed}");
        let seq = check(&trace, &s, &what, &[2, 3], true);
        let (_, by) = fast_sequential(&trace, &s);
        println!(
            "{what}: {} instructions, {} gaps, decoded by {by:?}",
            count(&seq, |r| r.as_instruction().is_some()),
            count(&seq, |r| matches!(r, Record::Gap(_)))
        );
    }
}

/// 1,200 mutants (`testgen::mutate`: bit flips, random runs, truncation, insertion,
/// deletion, duplicated chunks) of five traces (untimed, timed with sideband, MTC-timed,
/// with CYC, MTC-timed with sideband that changes the code), each decoded on 2, 3 or 4 threads (every fourth also compact) and compared
/// whole with the sequential decode. `MUTANTS=n SEED=s` run other sets (a stress test).
#[test]
fn parallel_equals_sequential_on_mutated_traces() {
    let prog = LoopProgram::new(BASE);
    let dir = tempfile::tempdir().unwrap();
    let (space, events) = image_and_events(&prog, dir.path());
    let changing_dir = tempfile::tempdir().unwrap();
    let (_, changing) = image_and_changing_events(&prog, changing_dir.path());
    let bases = [
        (prog.trace(4000, 120, 99).0, TraceParams::default(), vec![]),
        (
            prog.trace(4000, 200, 98).0,
            TraceParams {
                time: time_conv(),
                ..Default::default()
            },
            events.clone(),
        ),
        (
            timed_trace(&prog, 4000, 80, 97, false),
            TraceParams {
                cpu: timed_cpu(),
                time: time_conv(),
                ..Default::default()
            },
            events.clone(),
        ),
        (
            timed_trace(&prog, 4000, 120, 96, true),
            TraceParams {
                cpu: timed_cpu(),
                time: time_conv(),
                ..Default::default()
            },
            events,
        ),
        (
            timed_trace(&prog, 4000, 80, 95, false),
            TraceParams {
                cpu: timed_cpu(),
                time: time_conv(),
                ..Default::default()
            },
            changing,
        ),
    ];
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9a7a_11e1);
    let total: usize = std::env::var("MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1200);
    let mut rng = XorShift::new(seed);
    let (mut mutants, mut gaps, mut timestamps, mut insns) = (0usize, 0usize, 0usize, 0usize);
    for n in 0..total {
        let (base, params, events) = &bases[n % bases.len()];
        let t = mutate(&mut rng, base);
        let s = Setup {
            space: space.clone(),
            events: events.clone(),
            params: *params,
            opts: WindowOptions {
                source: format!("mutant{n}"),
                window_id: Some(n as u64),
                ..Default::default()
            },
        };
        let threads = [2 + n % 3];
        let seq = check(&t, &s, &format!("mutant {n}"), &threads, n % 4 == 0);
        mutants += 1;
        gaps += count(&seq, |r| matches!(r, Record::Gap(_)));
        timestamps += count(&seq, |r| matches!(r, Record::Timestamp { .. }));
        insns += count(&seq, |r| r.as_instruction().is_some());
    }
    assert_eq!(mutants, total);
    println!("{mutants} mutants: {gaps} gaps, {timestamps} timestamps, {insns} instructions");
    if total >= 1200 {
        // The mutations exercised error paths as well as long decodes.
        assert!(gaps > 300, "{gaps} gaps");
        assert!(timestamps > 10_000, "{timestamps} timestamps");
        assert!(insns > 500_000, "{insns} instructions");
    }
}

/// TRIG packets (libipt 2.1.2 steps over them through the size we teach it, in every
/// segment decoder too): the parallel decode of a trace with a TRIG after each PSB+ and
/// TNT run is the sequential one, and both are the records of the trace without them.
#[test]
fn parallel_with_trig_packets_equals_sequential_and_the_plain_trace() {
    use drpttracer::decode::packets::{list_packets, PacketLine};
    let prog = LoopProgram::new(BASE);
    let (plain, _) = prog.trace(30_000, 100, 5);
    // After every PSBEND and every 7th TNT: TRIG (TRBV 1), with ICNT every other time.
    let mut with_trig = Vec::with_capacity(plain.len() * 2);
    let mut copied = 0usize;
    let (mut added, mut tnts) = (0usize, 0usize);
    for line in list_packets(&plain) {
        let PacketLine::Packet {
            offset, size, name, ..
        } = line
        else {
            panic!("{line}");
        };
        let end = offset as usize + size as usize;
        let at = match name {
            "psbend" => true,
            "tnt.8" | "tnt.64" => {
                tnts += 1;
                tnts % 7 == 0
            }
            _ => false,
        };
        if at {
            with_trig.extend_from_slice(&plain[copied..end]);
            copied = end;
            if added % 2 == 0 {
                with_trig.extend_from_slice(&[0xd9, 0x00, 0x01]);
            } else {
                with_trig.extend_from_slice(&[0xd9, 0x40, 0x01, 0x05, 0x00]);
            }
            added += 1;
        }
    }
    with_trig.extend_from_slice(&plain[copied..]);
    assert!(added > 300, "{added}");
    let s = Setup {
        space: {
            let mut space = AddressSpace::new();
            space.add_bytes("loop", prog.code.clone(), prog.base);
            space
        },
        events: vec![],
        params: TraceParams::default(),
        opts: WindowOptions {
            source: "trig.pt".into(),
            ..Default::default()
        },
    };
    assert!(split_at_psbs(&with_trig, 64).len() > 20);
    let expected = check(&plain, &s, "plain", &[2], false);
    let seq = check(&with_trig, &s, "with TRIG", &[2, 4], true);
    assert_same(&expected, &seq, "with TRIG against plain");
    assert!(count(&seq, |r| r.as_instruction().is_some()) > 30_000);
    assert_eq!(count(&seq, |r| matches!(r, Record::Gap(_))), 0);
}

/// The fast decoder keeps libipt's time (TSC, TMA, MTC through CPUID 0x15's ratio, CYC
/// through the calibrated cycle ratio): on the timed traces (no sideband, so it decodes
/// them itself), without and with CYC packets, with MTC frequencies where TMA holds every
/// MTC bit (2) and where it does not (9, the first MTC after a TMA estimating the rest),
/// with and without the ratio, with and without the nominal frequency (CBR calibrates
/// cycles then), its records (timestamps included) equal libipt's, sequentially and on 2
/// and 3 threads; so do those of 900 mutants, wherever it hands a window to libipt.
#[test]
fn fast_decoder_keeps_libipt_time_on_timed_traces() {
    use drpttracer::decode::parallel::decode_parallel_stats;
    use drpttracer::decode::DecoderKind;
    let prog = LoopProgram::new(BASE);
    let mut space = AddressSpace::new();
    space.add_bytes("loop", prog.code.clone(), prog.base);
    let opts = |decoder: DecoderKind| WindowOptions {
        source: "timed.pt".into(),
        window_id: Some(7),
        decoder,
        ..Default::default()
    };
    let timed = |cpu: CpuParams| TraceParams {
        cpu,
        time: time_conv(),
        ..Default::default()
    };
    let decode = |trace: &[u8], params: TraceParams, kind: DecoderKind| {
        common::decode_window(trace, &space, params, opts(kind))
    };
    // PSB-parallel decode with the fast decoder: its records exactly `want`, its stats.
    let parallel =
        |trace: &[u8], params: &TraceParams, threads: usize, want: &[Record], what: &str| {
            let (chunks, stats) = decode_parallel_stats(
                trace,
                params,
                &space,
                &[],
                &ImageResolver::default(),
                &opts(DecoderKind::Fast),
                threads,
            )
            .unwrap();
            let par: Vec<Record> = chunks.iter().flat_map(|c| c.iter().cloned()).collect();
            assert_same(want, &par, &format!("{what}, {threads} threads"));
            stats
        };
    let cpus = [
        timed_cpu(),
        CpuParams {
            mtc_freq: 9,
            ..timed_cpu()
        },
        CpuParams {
            cpuid_0x15_eax: 0,
            cpuid_0x15_ebx: 0,
            ..timed_cpu()
        },
        CpuParams {
            nom_freq: 24,
            ..timed_cpu()
        },
        CpuParams {
            mtc_freq: 9,
            nom_freq: 30,
            cpuid_0x15_eax: 0,
            cpuid_0x15_ebx: 0,
            ..timed_cpu()
        },
    ];
    let traces = [
        timed_trace(&prog, 30_000, 60, 21, false),
        timed_trace(&prog, 30_000, 150, 22, false),
        timed_trace(&prog, 30_000, 60, 23, true),
        timed_trace(&prog, 30_000, 400, 24, true),
    ];
    let mut redecoded_cyc = 0;
    for (t, trace) in traces.iter().enumerate() {
        for (c, cpu) in cpus.iter().enumerate() {
            let params = timed(*cpu);
            let what = format!("timed trace {t}, cpu {c}");
            let (want, _) = decode(trace, params, DecoderKind::Libipt);
            let (got, by) = decode(trace, params, DecoderKind::Fast);
            assert_same(&want, &got, &what);
            assert_eq!(by, ("fast", None), "{what}");
            let ts: Vec<u64> = want
                .iter()
                .filter_map(|r| match r {
                    Record::Timestamp { tsc, .. } => Some(*tsc),
                    _ => None,
                })
                .collect();
            assert!(ts.len() > 50, "{what}: {} timestamps", ts.len());
            for threads in [2, 3] {
                let stats = parallel(trace, &params, threads, &want, &what);
                // Without CYC packets the calibration of cycle-accurate time never shows
                // in a timestamp: segments join on the time alone (each one here). With
                // them the calibration carried over a cut's PSB must be equal too: each
                // segment's decoder warms its clock up on the trace before its PSB, which
                // settles it where MTCs (with CPUID 0x15's ratio) or a CBR (with the
                // nominal frequency) calibrate: every segment joins. Without either
                // (cpu 2) the odd cut is not settled there: decoded again, exactly.
                assert_eq!(stats.by, "fast", "{what}: {stats:?}");
                assert_eq!(
                    stats.joined + stats.redecoded + 1,
                    stats.segments,
                    "{what}: {stats:?}"
                );
                if t < 2 || c != 2 {
                    assert_eq!(stats.joined + 1, stats.segments, "{what}: {stats:?}");
                } else {
                    assert!(stats.redecoded * 10 <= stats.segments, "{what}: {stats:?}");
                    redecoded_cyc += stats.redecoded;
                }
            }
        }
    }
    // (The path where a warmed-up clock is not the one pass's was taken, and decoded
    // exactly.)
    assert!(redecoded_cyc > 0);

    // MTC advanced the time between TSCs: timestamps a TSC packet never gave (not only
    // the generator's TSC values).
    let params = timed(timed_cpu());
    let (recs, _) = decode(&traces[0], params, DecoderKind::Fast);
    let (untimed, _) = decode(
        &traces[0],
        TraceParams {
            cpu: CpuParams {
                cpuid_0x15_eax: 0,
                ..timed_cpu()
            },
            ..params
        },
        DecoderKind::Fast,
    );
    assert_ne!(recs, untimed, "MTC changed no timestamp");

    // CYC moved the time between MTCs: other timestamps than without CYC packets.
    // (The trace without its CYC packets: the generator writes only these packets.)
    let strip = |t: &[u8]| -> Vec<u8> {
        let mut out = Vec::new();
        let mut p = 0;
        while p < t.len() {
            let b = t[p];
            let n = match (b, t.get(p + 1).copied().unwrap_or(0)) {
                (0x02, 0x73) => 7,
                (0x02, 0x03) => 4,
                (0x02, 0x82) => 16,
                (0x02, 0xa3) => 8,
                (0x02, _) => 2,
                (0x19, _) => 8,
                (0x59 | 0x99, _) => 2,
                _ if b & 3 == 3 => {
                    let mut n = 1;
                    let mut ext = b & 4 != 0;
                    while ext {
                        ext = t[p + n] & 1 != 0;
                        n += 1;
                    }
                    p += n;
                    continue;
                }
                _ if b & 1 == 0 => 1,
                _ => 1 + wire_ip_len(t, p),
            };
            out.extend_from_slice(&t[p..p + n]);
            p += n;
        }
        out
    };

    // CYC packets first met after the first segment (a CYC trace whose first half lost
    // its CYC packets): a segment joins only with the calibration equal too where a CYC
    // may follow, which the warmed-up clocks have. The records are exactly one pass's
    // (and libipt's).
    let cyc_trace = &traces[2];
    let psb = [0x02u8, 0x82].repeat(8);
    let half = cyc_trace.len() / 2;
    let k = half
        + cyc_trace[half..]
            .windows(psb.len())
            .position(|w| w == &psb[..])
            .expect("a PSB in the second half");
    let mixed: Vec<u8> = [strip(&cyc_trace[..k]), cyc_trace[k..].to_vec()].concat();
    assert!(
        mixed.len() < cyc_trace.len(),
        "CYC packets in the first half"
    );
    for (c, cpu) in cpus.iter().enumerate() {
        let params = timed(*cpu);
        let what = format!("no CYC then CYC, cpu {c}");
        let (want, _) = decode(&mixed, params, DecoderKind::Libipt);
        let (got, by) = decode(&mixed, params, DecoderKind::Fast);
        assert_same(&want, &got, &what);
        assert_eq!(by, ("fast", None), "{what}");
        for threads in [2, 3] {
            let stats = parallel(&mixed, &params, threads, &want, &what);
            assert_eq!(stats.by, "fast", "{what}: {stats:?}");
            assert_eq!(stats.joined + 1, stats.segments, "{what}: {stats:?}");
        }
    }
    let cyc_trace = &traces[2];
    let plain = strip(cyc_trace);
    assert!(plain.len() < cyc_trace.len());
    let with = decode(cyc_trace, timed(cpus[3]), DecoderKind::Fast).0;
    let without = decode(&plain, timed(cpus[3]), DecoderKind::Fast).0;
    let stamps = |r: &[Record]| -> Vec<u64> {
        r.iter()
            .filter_map(|r| match r {
                Record::Timestamp { tsc, .. } => Some(*tsc),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        with.iter().filter(|r| r.as_instruction().is_some()).count(),
        without
            .iter()
            .filter(|r| r.as_instruction().is_some())
            .count()
    );
    assert_ne!(stamps(&with), stamps(&without), "CYC changed no timestamp");

    let mut rng = XorShift::new(0x71e);
    let mut by = std::collections::BTreeMap::new();
    for k in 0..900 {
        let base = &traces[k % 4];
        let m = mutate(&mut rng, base);
        let params = timed(cpus[k % 5]);
        let (want, _) = decode(&m, params, DecoderKind::Libipt);
        let (got, b) = decode(&m, params, DecoderKind::Fast);
        if want != got {
            let _ = std::fs::write(std::env::temp_dir().join("timed_mutant.pt"), &m);
        }
        assert_same(&want, &got, &format!("mutant {k} (cpu {})", k % 5));
        *by.entry(b.1.unwrap_or("fast")).or_insert(0) += 1;
    }
    eprintln!("timed mutants: {by:?}");
    assert!(by.get("fast").copied().unwrap_or(0) > 30, "{by:?}");
}
