//! The block-level flow encoder (`pttrace_encoder::flow`, what the QEMU plugin runs) on
//! synthetic block sequences, decoded by our libipt-based decoder: ordinary flow, a signal
//! after a conditional branch resolved when the flow comes back, and one that never comes
//! back (an explicit overflow, never a guessed branch).

mod common;

use drpttracer::decode::packets::{list_packets, PacketLine};
use drpttracer::decode::{
    decode_window, AddressSpace, DecoderKind, ImageSpec, Record, TraceParams, WindowOptions,
};
use iced_x86::code_asm::*;
use pttrace_encoder::{
    can_fault, classify_bytes, Block, BlockEnd, FlowEncoder, InstructionInfoFactory, Transition,
};

const BASE: u64 = 0x40_1000;

/// The program: every label starts a block.
///   A: cmp rax,0 ; jz T        (conditional)
///   F: nop ; jmp J             (direct)
///   T: nop ; nop               (plain end: falls into J)
///   J: ret                     (indirect)
///   H: inc rbx ; syscall       (a signal handler calling rt_sigreturn)
///   M: mov eax,[rdi] ; mov [rsi],eax ; nop ; jmp J   (two instructions that can fault)
///   S: nop ; mov eax,[rdi] ; nop ; jmp J             (one)
struct Prog {
    code: Vec<u8>,
    ips: Vec<u64>,
    a: Block,
    f: Block,
    t: Block,
    j: Block,
    h: Block,
    m: Block,
    s: Block,
}

fn prog() -> Prog {
    let mut c = CodeAssembler::new(64).unwrap();
    let mut t = c.create_label();
    let mut j = c.create_label();
    let mut h = c.create_label();
    c.cmp(rax, 0).unwrap();
    c.jz(t).unwrap();
    c.nop().unwrap();
    c.jmp(j).unwrap();
    c.set_label(&mut t).unwrap();
    c.nop().unwrap();
    c.nop().unwrap();
    c.set_label(&mut j).unwrap();
    c.ret().unwrap();
    c.set_label(&mut h).unwrap();
    c.inc(rbx).unwrap();
    c.syscall().unwrap();
    c.mov(eax, dword_ptr(rdi)).unwrap();
    c.mov(dword_ptr(rsi), eax).unwrap();
    c.nop().unwrap();
    c.jmp(j).unwrap();
    c.nop().unwrap();
    c.mov(eax, dword_ptr(rdi)).unwrap();
    c.nop().unwrap();
    c.jmp(j).unwrap();
    let (code, ips) = assemble(&mut c);
    // Blocks from instruction index ranges [first, last], with their fault sites (as the
    // QEMU plugin finds them).
    let block = |first: usize, last: usize| {
        let ip = ips[last];
        let off = (ip - BASE) as usize;
        let class = classify_bytes(ip, &code[off..]).unwrap();
        let kind = BlockEnd::from_flow(class.flow, ip);
        let mut info = InstructionInfoFactory::new();
        let sites: Vec<u64> = ips[first..=last]
            .iter()
            .copied()
            .filter(|&i| i != ip || kind != BlockEnd::Far)
            .filter(|&i| can_fault(i, &code[(i - BASE) as usize..], &mut info))
            .collect();
        Block::new(ips[first], ip + u64::from(class.len), kind)
            .with_fault_sites(sites.len() as u32, sites.first().copied().unwrap_or(0))
    };
    Prog {
        a: block(0, 1),
        f: block(2, 3),
        t: block(4, 5),
        j: block(6, 6),
        h: block(7, 8),
        m: block(9, 12),
        s: block(13, 16),
        code,
        ips,
    }
}

/// The code at `BASE` and each instruction's address.
fn assemble(c: &mut CodeAssembler) -> (Vec<u8>, Vec<u64>) {
    common::assemble_at(c, BASE)
}

fn decode(pt: &[u8], p: &Prog) -> Vec<Record> {
    decode_code(pt, &p.code, DecoderKind::Fast)
}

/// `pt` decoded over `code` (at `BASE`) by `decoder`.
fn decode_code(pt: &[u8], code: &[u8], decoder: DecoderKind) -> Vec<Record> {
    let mut space = AddressSpace::new();
    space.add_bytes("prog", code.to_vec(), BASE);
    decode_window(
        pt,
        None,
        &TraceParams::default(),
        &space,
        &ImageSpec::default(),
        &WindowOptions {
            source: "flow.pt".into(),
            decoder,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The tracing-disabled and -enabled records, in order.
fn on_off(recs: &[Record]) -> Vec<&Record> {
    recs.iter()
        .filter(|r| {
            matches!(
                r,
                Record::TraceDisabled { .. } | Record::TraceEnabled { .. }
            )
        })
        .collect()
}

fn ins(p: &Prog, b: &Block) -> Vec<u64> {
    ins_of(&p.ips, b)
}

/// The addresses among `ips` inside block `b`.
fn ins_of(ips: &[u64], b: &Block) -> Vec<u64> {
    ips.iter()
        .copied()
        .filter(|&ip| ip >= b.start && ip < b.end)
        .collect()
}

fn no_tsc() -> impl FnMut() -> u64 {
    let mut t = 1000;
    move || {
        t += 1;
        t
    }
}

#[test]
fn ordinary_flow_decodes_to_the_executed_blocks() {
    let p = prog();
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    let mut tsc = no_tsc();
    // A (taken) T J(ret to A) A (not taken) F J(ret to H) H: syscall ends the window.
    let seq = [&p.a, &p.t, &p.j, &p.a, &p.f, &p.j, &p.h];
    let mut kinds = vec![];
    for b in seq {
        kinds.push(enc.block(b, &mut tsc).unwrap());
    }
    assert_eq!(kinds[0], Transition::WindowStart);
    assert!(
        kinds[1..].iter().all(|k| *k == Transition::Flow),
        "{kinds:?}"
    );
    enc.far_transfer().unwrap();
    enc.end_window(7);
    let (meta, pt) = enc.ready().unwrap();
    assert_eq!(meta, 7);
    let want: Vec<u64> = seq.iter().flat_map(|b| ins(&p, b)).collect();
    let recs = decode(&pt, &p);
    assert_eq!(common::pcs(&recs), want);
    assert!(!recs
        .iter()
        .any(|r| matches!(r, Record::Gap(_) | Record::Overflow { .. })));
}

#[test]
fn a_signal_after_a_conditional_branch_is_filled_in_when_the_flow_returns() {
    let p = prog();
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    let mut tsc = no_tsc();
    // A runs, then (before its successor) the handler H, whose rt_sigreturn ends the
    // window; the flow then resumes at F: the jz was not taken.
    enc.block(&p.a, &mut tsc).unwrap();
    assert_eq!(enc.block(&p.h, &mut tsc).unwrap(), Transition::Async);
    enc.far_transfer().unwrap();
    enc.end_window(1);
    assert!(
        enc.ready().is_none(),
        "held until the interrupted IP is known"
    );
    assert_eq!(enc.block(&p.f, &mut tsc).unwrap(), Transition::WindowStart);
    enc.block(&p.j, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(2);
    let (m1, pt1) = enc.ready().unwrap();
    let (m2, pt2) = enc.ready().unwrap();
    assert_eq!((m1, m2), (1, 2));
    let r1 = decode(&pt1, &p);
    let mut want = ins(&p, &p.a);
    want.extend(ins(&p, &p.h));
    assert_eq!(common::pcs(&r1), want);
    // The explicit asynchronous event: disabled at F (the jz's fall-through), enabled in H.
    let events = on_off(&r1);
    assert!(matches!(events[1], Record::TraceDisabled { ip: Some(ip) } if *ip == p.f.start));
    assert!(matches!(events[2], Record::TraceEnabled { ip } if *ip == p.h.start));
    let mut want2 = ins(&p, &p.f);
    want2.extend(ins(&p, &p.j));
    assert_eq!(common::pcs(&decode(&pt2, &p)), want2);
    assert_eq!(enc.stats().unresolved, 0);
}

#[test]
fn a_signal_whose_flow_never_returns_is_an_explicit_overflow() {
    let p = prog();
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    let mut tsc = no_tsc();
    enc.block(&p.a, &mut tsc).unwrap();
    enc.block(&p.h, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(1);
    // The thread ends (the handler longjmp'd elsewhere and exited, say).
    enc.finish();
    let (_, pt) = enc.ready().unwrap();
    let recs = decode(&pt, &p);
    let ips = common::pcs(&recs);
    assert!(
        ips.ends_with(&ins(&p, &p.h)),
        "the handler is decoded: {ips:x?}"
    );
    assert!(
        recs.iter()
            .any(|r| matches!(r, Record::Overflow { ip: Some(ip) } if *ip == p.h.start)),
        "{recs:?}"
    );
    // Neither successor of the jz is claimed.
    assert!(!ips.contains(&p.f.start) && !ips.contains(&p.t.start));
    assert_eq!(enc.stats().unresolved, 1);
}

#[test]
fn a_return_into_a_signal_handler_is_an_asynchronous_entry() {
    let p = prog();
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    let mut tsc = no_tsc();
    // J (ret) is followed by the handler: the signal came before the return's target ran.
    enc.block(&p.a, &mut tsc).unwrap(); // jz taken
    enc.block(&p.t, &mut tsc).unwrap();
    enc.block(&p.j, &mut tsc).unwrap();
    assert_eq!(enc.block(&p.h, &mut tsc).unwrap(), Transition::Async);
    enc.far_transfer().unwrap();
    enc.sigreturned();
    enc.end_window(1);
    assert!(enc.ready().is_none());
    // rt_sigreturn resumes at the return's target, A.
    assert_eq!(enc.block(&p.a, &mut tsc).unwrap(), Transition::WindowStart);
    enc.block(&p.f, &mut tsc).unwrap(); // jz not taken
    enc.far_transfer().unwrap();
    enc.end_window(2);
    let (_, pt1) = enc.ready().unwrap();
    let (_, pt2) = enc.ready().unwrap();
    let r1 = decode(&pt1, &p);
    let mut want: Vec<u64> = [&p.a, &p.t, &p.j, &p.h]
        .iter()
        .flat_map(|b| ins(&p, b))
        .collect();
    assert_eq!(common::pcs(&r1), want);
    let events = on_off(&r1);
    assert!(matches!(events[1], Record::TraceDisabled { ip: Some(ip) } if *ip == p.a.start));
    assert!(matches!(events[2], Record::TraceEnabled { ip } if *ip == p.h.start));
    want = [&p.a, &p.f].iter().flat_map(|b| ins(&p, b)).collect();
    assert!(common::pcs(&decode(&pt2, &p)).starts_with(&want));
    // An indirect *call* to a handler's address is an ordinary call.
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    let call = Block::new(p.j.start, p.j.end, BlockEnd::IndirectCall);
    enc.block(&call, &mut tsc).unwrap();
    assert_eq!(enc.block(&p.h, &mut tsc).unwrap(), Transition::Flow);
}

#[test]
fn a_signal_whose_handler_returns_elsewhere_is_filled_in_at_the_return_to_the_interrupted_flow() {
    // Go's asynchronous preemption: the handler H rewrites the saved context, so after its
    // rt_sigreturn the flow resumes at J (asyncPreempt), whose return lands where A was
    // interrupted: F, the jz's fall-through.
    let p = prog();
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    let mut tsc = no_tsc();
    enc.block(&p.a, &mut tsc).unwrap();
    assert_eq!(enc.block(&p.h, &mut tsc).unwrap(), Transition::Async);
    enc.far_transfer().unwrap();
    enc.end_window(1);
    enc.sigreturned();
    assert_eq!(enc.block(&p.j, &mut tsc).unwrap(), Transition::WindowStart);
    assert!(
        enc.ready().is_none(),
        "still held: J is not a successor of A"
    );
    assert_eq!(enc.block(&p.f, &mut tsc).unwrap(), Transition::Flow);
    enc.block(&p.j, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(2);
    let w1 = enc.ready_window().unwrap();
    let w2 = enc.ready_window().unwrap();
    assert_eq!((w1.meta, w2.meta), (1, 2));
    assert_eq!((w1.overflows, w2.overflows), (0, 0));
    let r1 = decode(&w1.pt, &p);
    let mut want = ins(&p, &p.a);
    want.extend(ins(&p, &p.h));
    assert_eq!(common::pcs(&r1), want);
    let events = on_off(&r1);
    assert!(matches!(events[1], Record::TraceDisabled { ip: Some(ip) } if *ip == p.f.start));
    assert!(matches!(events[2], Record::TraceEnabled { ip } if *ip == p.h.start));
    let mut want2 = ins(&p, &p.j);
    want2.extend(ins(&p, &p.f));
    want2.extend(ins(&p, &p.j));
    assert_eq!(common::pcs(&decode(&w2.pt, &p)), want2);
    assert_eq!(enc.stats().unresolved, 0);

    // Without rt_sigreturn (a longjmp out of the handler) a return to F proves nothing: the
    // entry stays unresolved and becomes an explicit overflow.
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.block(&p.a, &mut tsc).unwrap();
    enc.block(&p.h, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(1);
    enc.block(&p.j, &mut tsc).unwrap();
    enc.block(&p.f, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(2);
    enc.finish();
    let w1 = enc.ready_window().unwrap();
    assert_eq!(w1.overflows, 1);
    assert_eq!(enc.stats().unresolved, 1);
}

/// The instruction addresses of `b` before `x`.
fn ins_before(p: &Prog, b: &Block, x: u64) -> Vec<u64> {
    ins(p, b).into_iter().filter(|&i| i < x).collect()
}

/// Runs `seq` (J first: its `ret` goes to the next block by TIP), then the handler H,
/// whose rt_sigreturn ends the window.
fn into_handler<'b>(
    enc: &mut FlowEncoder<'b, u32>,
    seq: &[&'b Block],
    h: &'b Block,
    tsc: &mut dyn FnMut() -> u64,
) {
    for b in seq {
        enc.block(b, tsc).unwrap();
    }
    assert_eq!(enc.block(h, tsc).unwrap(), Transition::Async);
    enc.far_transfer().unwrap();
    enc.sigreturned();
    enc.end_window(1);
}

/// The asynchronous-event pair of a decoded window: (disabled at, enabled at).
fn async_event(recs: &[Record]) -> Option<(u64, u64)> {
    let ev = on_off(recs);
    ev.windows(2).find_map(|w| match (w[0], w[1]) {
        (Record::TraceDisabled { ip: Some(a) }, Record::TraceEnabled { ip: b }) => Some((*a, *b)),
        _ => None,
    })
}

#[test]
fn a_fault_inside_a_block_is_traced_at_the_faulting_instruction() {
    let p = prog();
    let store = p.ips[10]; // M's `mov [rsi],eax`
    assert_eq!((p.m.fault_sites(), p.s.fault_sites()), (2, 1));
    assert_eq!(
        (p.a.fault_sites(), p.j.fault_sites()),
        (0, 1),
        "ret reads the stack"
    );
    assert_eq!(p.s.fault_at(), p.ips[14]);

    // 1. H serves SIGSEGV and SIGALRM alike. M's store faults; H fixes the cause and its
    // rt_sigreturn restarts the store: the flow resumes inside M, which tells the fault.
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    enc.set_fault_handlers(&[(p.h.start, false)]);
    let mut tsc = no_tsc();
    into_handler(&mut enc, &[&p.j, &p.m], &p.h, &mut tsc);
    assert!(enc.ready().is_none(), "held until the flow resumes");
    let rest = Block::new(store, p.m.end, p.m.kind);
    assert_eq!(enc.block(&rest, &mut tsc).unwrap(), Transition::WindowStart);
    enc.block(&p.j, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(2);
    let w1 = enc.ready_window().unwrap();
    let w2 = enc.ready_window().unwrap();
    assert_eq!((w1.overflows, w2.overflows), (0, 0));
    let r1 = decode(&w1.pt, &p);
    let want = [ins(&p, &p.j), ins_before(&p, &p.m, store), ins(&p, &p.h)].concat();
    assert_eq!(
        common::pcs(&r1),
        want,
        "M up to the store, then the handler"
    );
    assert_eq!(async_event(&r1), Some((store, p.h.start)));
    let r2 = decode(&w2.pt, &p);
    assert_eq!(common::pcs(&r2), [ins(&p, &rest), ins(&p, &p.j)].concat());
    assert_eq!((enc.stats().faults, enc.stats().unresolved), (1, 0));

    // 2. A handler of SIGSEGV only that leaves by siglongjmp (the flow never comes back):
    // after S, with one instruction that can fault, the fault was there.
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    enc.set_fault_handlers(&[(p.h.start, true)]);
    into_handler(&mut enc, &[&p.j, &p.s], &p.h, &mut tsc);
    enc.block(&p.a, &mut tsc).unwrap(); // elsewhere
    enc.finish();
    let w = enc.ready_window().unwrap();
    assert_eq!(w.overflows, 0);
    let r = decode(&w.pt, &p);
    let load = p.ips[14];
    assert_eq!(
        common::pcs(&r),
        [ins(&p, &p.j), ins_before(&p, &p.s, load), ins(&p, &p.h)].concat()
    );
    assert_eq!(async_event(&r), Some((load, p.h.start)));

    // 3. The same after M (two instructions that can fault): which one faulted is unknown,
    // so M's instructions are an explicit loss, counted as an unresolved fault.
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    enc.set_fault_handlers(&[(p.h.start, true)]);
    into_handler(&mut enc, &[&p.j, &p.m], &p.h, &mut tsc);
    enc.finish();
    let w = enc.ready_window().unwrap();
    assert_eq!(w.overflows, 1);
    let r = decode(&w.pt, &p);
    assert_eq!(common::pcs(&r), [ins(&p, &p.j), ins(&p, &p.h)].concat());
    assert!(r
        .iter()
        .any(|x| matches!(x, Record::Overflow { ip: Some(ip) } if *ip == p.h.start)));
    assert_eq!(
        (enc.stats().unresolved, enc.stats().unresolved_faults),
        (1, 1)
    );

    // 4. A handler of asynchronous signals only after M: a signal between blocks, at M's
    // successor J, written at once (nothing held).
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    into_handler(&mut enc, &[&p.j, &p.m], &p.h, &mut tsc);
    let w = enc.ready_window().unwrap();
    let r = decode(&w.pt, &p);
    assert_eq!(
        common::pcs(&r),
        [ins(&p, &p.j), ins(&p, &p.m), ins(&p, &p.h)].concat()
    );
    assert_eq!(async_event(&r), Some((p.j.start, p.h.start)));
}

#[test]
fn a_signal_in_the_code_a_handler_resumed_in_is_resolved_on_its_own() {
    // Go: H's rt_sigreturn resumes in J (asyncPreempt) instead of A's successor; a second
    // signal interrupts M there before J returns to A's successor F. Both entries resolve,
    // the inner first, each at its own splice point.
    let p = prog();
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    enc.set_signal_handlers(&[p.h.start]);
    enc.set_fault_handlers(&[(p.h.start, false)]);
    let mut tsc = no_tsc();
    enc.block(&p.a, &mut tsc).unwrap();
    enc.block(&p.h, &mut tsc).unwrap(); // signal 1 after A's jz
    enc.far_transfer().unwrap();
    enc.sigreturned();
    enc.end_window(1);
    enc.block(&p.j, &mut tsc).unwrap(); // resumed in J, which returns to M
    enc.block(&p.m, &mut tsc).unwrap();
    enc.block(&p.h, &mut tsc).unwrap(); // signal 2 after M
    enc.far_transfer().unwrap();
    enc.sigreturned();
    enc.end_window(2);
    assert!(enc.ready().is_none());
    // Back at M's successor J (signal 2 between blocks), whose return goes to F (A's
    // fall-through: signal 1 resolved, the jz not taken).
    assert_eq!(enc.block(&p.j, &mut tsc).unwrap(), Transition::WindowStart);
    enc.block(&p.f, &mut tsc).unwrap();
    enc.far_transfer().unwrap();
    enc.end_window(3);
    let ws: Vec<_> = std::iter::from_fn(|| enc.ready_window()).collect();
    assert_eq!(ws.len(), 3);
    assert!(ws.iter().all(|w| w.overflows == 0));
    let r1 = decode(&ws[0].pt, &p);
    assert_eq!(common::pcs(&r1), [ins(&p, &p.a), ins(&p, &p.h)].concat());
    assert_eq!(async_event(&r1), Some((p.f.start, p.h.start)));
    let r2 = decode(&ws[1].pt, &p);
    assert_eq!(
        common::pcs(&r2),
        [ins(&p, &p.j), ins(&p, &p.m), ins(&p, &p.h)].concat()
    );
    assert_eq!(async_event(&r2), Some((p.j.start, p.h.start)));
    assert!(
        common::pcs(&decode(&ws[2].pt, &p)).starts_with(&[ins(&p, &p.j), ins(&p, &p.f)].concat())
    );
    assert_eq!(enc.stats().unresolved, 0);
}

/// A program of calls and returns, its blocks classified as the QEMU plugin classifies
/// them (calls and returns known: return compression).
///   C1: call F            C2: call F          C3: call rax (F)
///   C4: call X (the next instruction: no return address for a decoder)
///   X:  jmp F             E:  syscall         F:  nop ; ret
///   M:  call R            N:  syscall         (main of a recursion)
///   R:  dec rcx ; jz B    R2: call R          A: ret              B: ret
struct Calls {
    code: Vec<u8>,
    ips: Vec<u64>,
    blocks: Vec<Block>,
}

impl Calls {
    fn block(&self, name: &str) -> &Block {
        let i = [
            "C1", "C2", "C3", "C4", "X", "E", "F", "M", "N", "R", "R2", "A", "B",
        ]
        .iter()
        .position(|n| *n == name)
        .unwrap();
        &self.blocks[i]
    }

    fn ins(&self, b: &Block) -> Vec<u64> {
        ins_of(&self.ips, b)
    }
}

fn calls() -> Calls {
    let mut c = CodeAssembler::new(64).unwrap();
    let mut f = c.create_label();
    let mut x = c.create_label();
    let mut r = c.create_label();
    let mut b = c.create_label();
    // Block boundaries: indexes of each block's first and last instruction.
    c.call(f).unwrap(); // 0 C1
    c.call(f).unwrap(); // 1 C2
    c.call(rax).unwrap(); // 2 C3
    c.call(x).unwrap(); // 3 C4
    c.set_label(&mut x).unwrap();
    c.jmp(f).unwrap(); // 4 X
    c.syscall().unwrap(); // 5 E
    c.set_label(&mut f).unwrap();
    c.nop().unwrap(); // 6 F
    c.ret().unwrap(); // 7
    c.call(r).unwrap(); // 8 M
    c.syscall().unwrap(); // 9 N
    c.set_label(&mut r).unwrap();
    c.dec(rcx).unwrap(); // 10 R
    c.jz(b).unwrap(); // 11
    c.call(r).unwrap(); // 12 R2
    c.ret().unwrap(); // 13 A
    c.set_label(&mut b).unwrap();
    c.ret().unwrap(); // 14 B
    let (code, ips) = assemble(&mut c);
    let block = |first: usize, last: usize| {
        let ip = ips[last];
        let class = classify_bytes(ip, &code[(ip - BASE) as usize..]).unwrap();
        Block::new(
            ips[first],
            ip + u64::from(class.len),
            BlockEnd::from_class(&class, ip),
        )
    };
    let blocks = [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 4),
        (5, 5),
        (6, 7),
        (8, 8),
        (9, 9),
        (10, 11),
        (12, 12),
        (13, 13),
        (14, 14),
    ]
    .iter()
    .map(|&(a, b)| block(a, b))
    .collect();
    Calls { code, ips, blocks }
}

/// The packets of `pt` but the PSB+'s and the timing ones, as ptdump names them with their
/// payloads.
fn flow_packets(pt: &[u8]) -> Vec<String> {
    listed(pt, false)
}

/// [`flow_packets`] with a "psb" line for each PSB.
fn flow_packets_and_psbs(pt: &[u8]) -> Vec<String> {
    listed(pt, true)
}

fn listed(pt: &[u8], psbs: bool) -> Vec<String> {
    list_packets(pt)
        .into_iter()
        .filter_map(|l| match l {
            PacketLine::Packet { name, payload, .. } => Some((name, payload)),
            _ => None,
        })
        .filter(|(n, _)| {
            (psbs && *n == "psb")
                || !matches!(*n, "psb" | "psbend" | "tsc" | "mode.exec" | "fup" | "pad")
        })
        .map(|(n, p)| format!("{n} {p}").trim_end().to_string())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Encodes `seq` as one window ended by E's or N's syscall; checks that both decoders give
/// the blocks' instructions; returns the PT.
fn encode_calls(p: &Calls, seq: &[&str], psb_period: usize) -> Vec<u8> {
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(psb_period);
    let mut tsc = no_tsc();
    for name in seq {
        enc.block(p.block(name), &mut tsc).unwrap();
    }
    enc.far_transfer().unwrap();
    enc.end_window(0);
    let (_, pt) = enc.ready().unwrap();
    let want: Vec<u64> = seq.iter().flat_map(|n| p.ins(p.block(n))).collect();
    for kind in [DecoderKind::Fast, DecoderKind::Libipt] {
        let recs = decode_code(&pt, &p.code, kind);
        assert_eq!(common::pcs(&recs), want, "{kind:?}");
        assert!(
            !recs.iter().any(|r| matches!(r, Record::Gap(_))),
            "{kind:?}: {recs:?}"
        );
    }
    pt
}

#[test]
fn returns_to_the_address_on_top_of_the_decoders_return_stack_are_tnt_bits() {
    let p = calls();
    // Two direct calls and an indirect one return by a taken bit each; the call to the next
    // instruction pushes nothing (libipt's rule for position-independent code), so F's
    // return to X goes by TIP, as does the one with nothing on the stack.
    let pt = encode_calls(
        &p,
        &[
            "C1", "F", "C2", "F", "C3", "F", "C4", "X", "F", "X", "F", "E",
        ],
        4096,
    );
    // (IPs compressed against the last one: the low 16 bits.)
    let tip = |b: &str| format!("tip 1: ????????????{:04x}", p.block(b).start & 0xffff);
    assert_eq!(
        flow_packets(&pt),
        [
            format!("tip.pge 3: {:016x}", p.block("C1").start),
            "tnt.8 !!".to_string(),
            tip("F"),
            "tnt.8 !".to_string(),
            tip("X"),
            tip("E"),
            "tip.pgd 0: ????????????????".to_string(),
        ]
    );
}

#[test]
fn returns_deeper_than_the_decoders_64_entry_stack_and_returns_across_a_psb_go_by_tip() {
    let p = calls();
    // main calls R, which recurses 70 times, then returns all the way: 71 calls, 71
    // returns. The 64 newest return addresses are on a decoder's stack: B's return and 63
    // of A's are taken bits, the other 6 of A's and the return to N (their addresses were
    // dropped) go by TIP.
    let mut seq = vec!["M"];
    for _ in 0..70 {
        seq.extend(["R", "R2"]);
    }
    seq.extend(["R", "B"]);
    seq.extend(["A"; 70]);
    seq.push("N");
    let pt = encode_calls(&p, &seq, 1 << 20);
    let packets = flow_packets(&pt);
    let tips: Vec<&String> = packets.iter().filter(|l| l.starts_with("tip ")).collect();
    let a = p.block("A").start & 0xffff;
    let n = p.block("N").start & 0xffff;
    let mut want = vec![format!("tip 1: ????????????{a:04x}"); 6];
    want.push(format!("tip 1: ????????????{n:04x}"));
    assert_eq!(tips, want.iter().collect::<Vec<_>>());
    // Every bit: 70 jz not taken, one taken, 64 returns.
    let bits: String = packets
        .iter()
        .filter_map(|l| l.strip_prefix("tnt.8 ").or(l.strip_prefix("tnt.64 ")))
        .collect();
    assert_eq!(bits, format!("{}!{}", ".".repeat(70), "!".repeat(64)));

    // A PSB+ lets a decoder start there: no return after it is compressed against a call
    // before it. With a PSB+ after every block that wrote a packet: C2's call writes none,
    // so F's return to C3 is compressed against it; every other return follows a PSB+.
    let seq = ["C1", "F", "C2", "F", "C3", "F", "E"];
    let pt = encode_calls(&p, &seq, 1);
    let tip = |b: &str| format!("tip 1: ????????????{:04x}", p.block(b).start & 0xffff);
    assert_eq!(
        flow_packets_and_psbs(&pt),
        [
            "psb".to_string(),
            format!("tip.pge 3: {:016x}", p.block("C1").start),
            "psb".to_string(),
            tip("C2"),
            "psb".to_string(),
            "tnt.8 !".to_string(),
            tip("F"),
            "psb".to_string(),
            tip("E"),
            "psb".to_string(),
            "tip.pgd 0: ????????????????".to_string(),
        ]
    );
    // And a window cut between a call and its return (the block after the call, F, begins
    // the next window, after a PSB+): that return by TIP.
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(4096);
    let mut tsc = no_tsc();
    enc.block(p.block("C1"), &mut tsc).unwrap();
    enc.block(p.block("F"), &mut tsc).unwrap();
    enc.cut(0, &mut tsc).unwrap();
    let seq = ["C2", "F", "C3", "F", "E"];
    for b in seq {
        enc.block(p.block(b), &mut tsc).unwrap();
    }
    enc.far_transfer().unwrap();
    enc.end_window(1);
    let (_, first) = enc.ready().unwrap();
    let (_, second) = enc.ready().unwrap();
    let lib = |pt: &[u8]| common::pcs(&decode_code(pt, &p.code, DecoderKind::Libipt));
    assert_eq!(lib(&first), p.ins(p.block("C1")));
    let want: Vec<u64> = std::iter::once("F")
        .chain(seq)
        .flat_map(|b| p.ins(p.block(b)))
        .collect();
    assert_eq!(lib(&second), want);
    assert_eq!(
        flow_packets(&second),
        [
            format!("tip.pge 3: {:016x}", p.block("F").start),
            tip("C2"),
            "tnt.8 !".to_string(),
            tip("F"),
            tip("E"),
            "tip.pgd 0: ????????????????".to_string(),
        ]
    );
}

/// A small deterministic generator (xorshift): numbers below `m`.
fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    }
}

/// What a worker hands the encoder, in order (as the QEMU plugin's log does).
#[derive(Clone, Copy, Debug)]
enum Step {
    Block(usize),
    /// A syscall: the window ends (`rt_sigreturn` when `sigreturn`).
    Syscall {
        sigreturn: bool,
    },
    /// The next block enters a signal handler that interrupted the thread at `rip`.
    SignalEntry(u64),
}

/// The same steps through [`FlowEncoder::block`] alone, or with the runs of blocks through
/// [`FlowEncoder::plain_run`] (as the QEMU worker does), windows cut past `limit` bytes: the
/// windows, their bytes and the counters.
fn encode_steps(
    blocks: &[Block],
    steps: &[Step],
    handler: u64,
    runs: bool,
    limit: usize,
) -> (Vec<(u32, Vec<u8>)>, pttrace_encoder::FlowStats) {
    let mut enc: FlowEncoder<u32> = FlowEncoder::new(256);
    enc.set_signal_handlers(&[handler]);
    let mut tsc = 1000u64;
    let mut meta = 0u32;
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&step) = steps.get(i) {
        // (The time moves at syscalls, as the worker's does at tags.)
        if !matches!(step, Step::Block(_)) {
            tsc += 3;
        }
        let t = tsc;
        match step {
            Step::Block(k) => {
                if runs {
                    let (n, r) = enc.plain_run(
                        |j| match steps.get(i + j) {
                            Some(Step::Block(k)) => blocks.get(*k),
                            _ => None,
                        },
                        t,
                        limit,
                    );
                    if n > 0 || r.is_err() {
                        i += n + usize::from(r.is_err());
                        if enc.window_len() > limit {
                            meta += 1;
                            enc.cut(meta, &mut move || t).unwrap();
                        }
                        continue;
                    }
                }
                enc.block(&blocks[k], &mut move || t).unwrap();
                if enc.window_len() > limit {
                    meta += 1;
                    enc.cut(meta, &mut move || t).unwrap();
                }
            }
            Step::Syscall { sigreturn } => {
                enc.far_transfer().unwrap();
                meta += 1;
                enc.end_window(meta);
                if sigreturn {
                    enc.sigreturned();
                }
            }
            Step::SignalEntry(rip) => enc.signal_entry(rip, Some(false)),
        }
        while let Some((m, pt)) = enc.ready() {
            out.push((m, pt));
        }
        i += 1;
    }
    enc.finish();
    while let Some((m, pt)) = enc.ready() {
        out.push((m, pt));
    }
    (out, enc.stats())
}

/// The hot path of the QEMU worker ([`FlowEncoder::plain_run`]) writes the same bytes as
/// [`FlowEncoder::block`] on random walks over blocks of every kind: branches both ways,
/// calls and returns (compressed or not: deep recursion, returns elsewhere), indirect
/// jumps and calls, REP iterations, signal handlers entered between blocks (with and
/// without the signal frame's IP) and left by `rt_sigreturn`, syscalls, windows cut at a
/// size, and a PSB+ every 256 bytes.
#[test]
fn plain_runs_write_what_block_by_block_writes() {
    const N: u64 = 24;
    let at = |k: u64| 0x40_0000 + k * 0x40;
    // Block k spans [at(k), at(k) + 0x20); the one after a call is at(k) + 0x20, block
    // k + N (the return site), which falls into block k + 1.
    let mut blocks = Vec::new();
    let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
    for k in 0..N {
        let (start, end) = (at(k), at(k) + 0x20);
        let other = at(rand(N));
        let kind = match k % 9 {
            0 | 1 => BlockEnd::Cond { target: other },
            2 => BlockEnd::Fall,
            3 => BlockEnd::Direct { target: other },
            4 => BlockEnd::Call { target: other },
            5 => BlockEnd::Return,
            6 => BlockEnd::Indirect,
            7 => BlockEnd::IndirectCall,
            _ => BlockEnd::Rep { ip: end - 2 },
        };
        blocks.push(Block::new(start, end, kind));
    }
    for k in 0..N {
        // Return sites: from after block k to the next block's start.
        blocks.push(Block::new(at(k) + 0x20, at(k + 1), BlockEnd::Fall));
    }
    // The handler (its own block, far from the rest) and the REP iteration's block.
    let handler = 0x50_0000;
    blocks.push(Block::new(handler, handler + 8, BlockEnd::Return));
    let h = blocks.len() - 1;
    for seed in 0..40u64 {
        let mut steps = vec![];
        let mut stack: Vec<u64> = vec![];
        let mut cur = (seed % N) as usize;
        let mut r = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for _ in 0..3000 {
            steps.push(Step::Block(cur));
            let b = blocks[cur];
            let roll = r(100);
            if roll < 2 {
                // A signal between this block and its successor: the handler runs and
                // returns by rt_sigreturn; the flow resumes at a successor.
                if r(2) == 0 {
                    let rip = match b.kind {
                        BlockEnd::Cond { target } if r(2) == 0 => target,
                        BlockEnd::Direct { target } | BlockEnd::Call { target } => target,
                        _ => b.end,
                    };
                    steps.push(Step::SignalEntry(rip));
                }
                steps.push(Step::Block(h));
                steps.push(Step::Syscall { sigreturn: true });
            } else if roll < 4 {
                steps.push(Step::Syscall { sigreturn: false });
            }
            let next = match b.kind {
                BlockEnd::Cond { target } => {
                    if r(2) == 0 {
                        target
                    } else {
                        b.end
                    }
                }
                BlockEnd::Fall => b.end,
                BlockEnd::Direct { target } => target,
                BlockEnd::Call { target } => {
                    stack.push(b.end);
                    target
                }
                BlockEnd::IndirectCall => {
                    stack.push(b.end);
                    at(r(N))
                }
                BlockEnd::Return => match stack.pop() {
                    Some(ret) if r(10) != 0 => ret,
                    _ => at(r(N)),
                },
                BlockEnd::Rep { ip } => {
                    if r(3) == 0 {
                        ip
                    } else {
                        b.end
                    }
                }
                BlockEnd::Indirect | BlockEnd::Far => at(r(N)),
            };
            // (A REP iteration's block starts at the REP instruction: one of its own.)
            cur = match blocks.iter().position(|x| x.start == next) {
                Some(k) => k,
                None => {
                    blocks.push(Block::new(next, b.end, b.kind));
                    blocks.len() - 1
                }
            };
        }
        for limit in [usize::MAX, 700] {
            let want = encode_steps(&blocks, &steps, handler, false, limit);
            let got = encode_steps(&blocks, &steps, handler, true, limit);
            assert!(want.0.len() > 10, "seed {seed}: {} windows", want.0.len());
            assert_eq!(got.1, want.1, "seed {seed}, limit {limit}: counters");
            assert_eq!(got.0.len(), want.0.len(), "seed {seed}, limit {limit}");
            for (k, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
                assert!(
                    g == w,
                    "seed {seed}, limit {limit}: window {k} (meta {} / {}) differs: {} vs {} bytes\n{:02x?}\n{:02x?}",
                    g.0,
                    w.0,
                    g.1.len(),
                    w.1.len(),
                    g.1,
                    w.1
                );
            }
        }
    }
}
