//! Synthetic code and PT traces for tests and benchmarks.
//!
//! [`PtWriter`] emits genuine PT packets through the shared encoder (`pttrace-encoder`).
//! [`LoopProgram`] is a small x86-64 program (assembled with iced-x86) whose every
//! conditional-branch outcome sequence is a valid execution, so random TNT bits give a
//! valid trace of any length; [`LoopProgram::simulate`] is the oracle for the expected
//! instruction addresses. [`CallProgram`] is a program of many images whose functions call
//! each other; its traces (return compression on or off, timing packets) come with the
//! address of every instruction they execute.

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use pttrace_encoder::packet::Sink;
use pttrace_encoder::PacketWriter;

use super::insn::decode_insn;
use super::records::{ExecMode, InsnClass, Instruction, Record};

/// Deterministic xorshift64* RNG (tests and benches; no external crate).
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// An instruction record of 64-bit code at `pc` (encoding bytes zero: for tests of what
/// reads records by address and class only).
pub fn instruction(pc: u64, size: u8, class: InsnClass) -> Record {
    Record::Instruction(Instruction {
        pc,
        size,
        bytes: [0; 15],
        class,
        mode: ExecMode::Bit64,
    })
}

/// A deterministic random mutant of `base` (robustness tests, fuzz seeds): 1 to 4 rounds of
/// a bit flip, a random run, a truncation, an insertion, a deletion, or a chunk duplicated
/// elsewhere (valid structures in the wrong place).
pub fn mutate(rng: &mut XorShift, base: &[u8]) -> Vec<u8> {
    let mut t = base.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        if t.is_empty() {
            t.push(rng.next_u64() as u8);
        }
        let at = rng.below(t.len() as u64) as usize;
        match rng.below(6) {
            0 => t[at] ^= 1 << rng.below(8),
            1 => {
                let n = (1 + rng.below(16) as usize).min(t.len() - at);
                for b in &mut t[at..at + n] {
                    *b = rng.next_u64() as u8;
                }
            }
            2 => t.truncate(at),
            3 => {
                let n = 1 + rng.below(8) as usize;
                let ins: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                t.splice(at..at, ins);
            }
            4 => {
                let n = (1 + rng.below(32) as usize).min(t.len() - at);
                t.drain(at..at + n);
            }
            _ => {
                let n = (1 + rng.below(64) as usize).min(t.len() - at);
                let chunk = t[at..at + n].to_vec();
                let to = rng.below(t.len() as u64) as usize;
                t.splice(to..to, chunk);
            }
        }
    }
    t
}

/// Appends PT packets to a byte vector using libipt's encoder.
#[derive(Debug, Default, Clone)]
pub struct PtWriter {
    pub buf: Vec<u8>,
}

impl PtWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer of the shared encoder appending to `buf`, with no last IP: every IP
    /// packet it writes carries the address sign-extended from 48 bits (or in full).
    fn w(&mut self) -> PacketWriter<&mut Vec<u8>> {
        PacketWriter::new(&mut self.buf, usize::MAX)
    }

    /// Writes into a growable vector: cannot fail.
    fn done(&mut self, r: Result<(), pttrace_encoder::EncodeError>) -> &mut Self {
        debug_assert!(r.is_ok());
        self
    }

    pub fn psb(&mut self) -> &mut Self {
        self.buf.extend_from_slice(&pttrace_encoder::packet::PSB);
        self
    }
    pub fn psbend(&mut self) -> &mut Self {
        self.buf.extend_from_slice(&pttrace_encoder::packet::PSBEND);
        self
    }
    pub fn tsc(&mut self, tsc: u64) -> &mut Self {
        let r = self.w().tsc(tsc);
        self.done(r)
    }
    pub fn mode64(&mut self) -> &mut Self {
        let r = self.w().mode_exec64();
        self.done(r)
    }
    pub fn fup(&mut self, ip: u64) -> &mut Self {
        let r = self.w().fup(ip);
        self.done(r)
    }
    pub fn tip(&mut self, ip: u64) -> &mut Self {
        let r = self.w().tip(ip);
        self.done(r)
    }
    pub fn tip_pge(&mut self, ip: u64) -> &mut Self {
        let r = self.w().tip_pge(ip);
        self.done(r)
    }
    pub fn tip_pgd(&mut self, ip: Option<u64>) -> &mut Self {
        let r = self.w().tip_pgd(ip);
        self.done(r)
    }
    pub fn ovf(&mut self) -> &mut Self {
        let r = self.w().ovf();
        self.done(r)
    }
    pub fn pad(&mut self) -> &mut Self {
        self.buf.push(0);
        self
    }
    /// One TNT packet with `bits` (true = taken) in execution order: short TNT for up to
    /// 6 bits, long TNT for 7..=47.
    pub fn tnt(&mut self, bits: &[bool]) -> &mut Self {
        assert!(
            !bits.is_empty() && bits.len() <= 47,
            "TNT holds 1..=47 bits"
        );
        let mut w = self.w();
        let mut r = Ok(());
        for &b in bits {
            r = r.and(w.branch(b));
        }
        r = r.and(w.flush_tnt());
        self.done(r)
    }
    /// A PSB+ header: PSB, TSC, MODE.Exec (64-bit), optional FUP (tracing enabled), PSBEND.
    pub fn psb_plus(&mut self, tsc: Option<u64>, fup: Option<u64>) -> &mut Self {
        self.psb();
        if let Some(t) = tsc {
            self.tsc(t);
        }
        self.mode64();
        if let Some(ip) = fup {
            self.fup(ip);
        }
        self.psbend()
    }
}

/// The benchmark/test loop program: 4 conditional skips, an indirect call to a function
/// with 2 conditional skips, a return (TIP, no return compression), a direct jump back.
#[derive(Debug, Clone)]
pub struct LoopProgram {
    pub base: u64,
    pub code: Vec<u8>,
    pub top: u64,
    pub func: u64,
    pub after_call: u64,
}

/// Conditional branches per iteration outside / inside the function.
pub const LOOP_CONDS: usize = 4;
pub const FUNC_CONDS: usize = 2;

impl LoopProgram {
    pub fn new(base: u64) -> Self {
        Self::build(base).expect("assemble loop program")
    }

    fn build(base: u64) -> Result<Self, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        let mut top = a.create_label();
        let mut func = a.create_label();
        let mut after_call = a.create_label();
        a.set_label(&mut top)?;
        a.add(rax, 1)?;
        for k in 0..LOOP_CONDS {
            let mut skip = a.create_label();
            a.test(rax, 1 << k)?;
            a.jz(skip)?;
            a.add(rbx, k as i32 + 1)?;
            a.set_label(&mut skip)?;
            a.nop()?;
        }
        a.call(rcx)?;
        a.set_label(&mut after_call)?;
        a.sub(rdx, 1)?;
        a.jmp(top)?;
        a.set_label(&mut func)?;
        a.add(rdx, 2)?;
        for k in 0..FUNC_CONDS {
            let mut skip = a.create_label();
            a.cmp(rdx, k as i32 + 5)?;
            a.jb(skip)?;
            a.xor(r8, r8)?;
            a.set_label(&mut skip)?;
            a.nop()?;
        }
        a.ret()?;
        let res = a.assemble_options(base, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
        Ok(LoopProgram {
            base,
            top: res.label_ip(&top)?,
            func: res.label_ip(&func)?,
            after_call: res.label_ip(&after_call)?,
            code: res.inner.code_buffer,
        })
    }

    /// A trace of about `size` bytes: PSB+ then TIP.PGE at the loop top, iterations with
    /// random branch outcomes, a PSB+ (with TSC and FUP) roughly every `psb_every` bytes.
    /// Returns the trace and the branch outcomes used (for [`simulate`](Self::simulate)).
    pub fn trace(&self, size: usize, psb_every: usize, seed: u64) -> (Vec<u8>, Vec<bool>) {
        self.generate(size, psb_every, None, seed)
    }

    /// [`trace`](Self::trace) with what real hardware adds to a user-mode trace: every
    /// PSB+ states CR3 (PIP) and the VMCS (a VMX guest), and about one iteration in
    /// `interrupt_every` is interrupted at the function's entry — FUP, a PAD, TIP.PGD
    /// (the kernel is not traced), then MODE.Exec and TIP.PGE back at the same address.
    /// The same branches as `trace` for the same seed: [`simulate`](Self::simulate) is its
    /// oracle too.
    pub fn trace_hw(
        &self,
        size: usize,
        psb_every: usize,
        interrupt_every: u64,
        seed: u64,
    ) -> (Vec<u8>, Vec<bool>) {
        self.generate(size, psb_every, Some(interrupt_every), seed)
    }

    /// [`trace`](Self::trace), and with `interrupt_every` [`trace_hw`](Self::trace_hw)'s
    /// additions (their randomness apart, so that the branches stay `trace`'s).
    fn generate(
        &self,
        size: usize,
        psb_every: usize,
        interrupt_every: Option<u64>,
        seed: u64,
    ) -> (Vec<u8>, Vec<bool>) {
        let mut rng = XorShift::new(seed);
        let mut irq = XorShift::new(seed ^ 0x5eed);
        let hw = interrupt_every.is_some();
        let mut w = PtWriter::new();
        let mut bits = Vec::new();
        let mut tsc = 1_000_000u64;
        let psb_plus = |w: &mut PtWriter, tsc: u64, fup: Option<u64>| {
            if !hw {
                w.psb_plus(Some(tsc), fup);
                return;
            }
            w.psb().tsc(tsc);
            // PIP: CR3 0x12340000 (NR: a VMX non-root guest); VMCS 0xabcde0000.
            w.buf
                .extend_from_slice(&[0x02, 0x43, 0x01, 0x40, 0x23, 0x01, 0, 0]);
            w.buf
                .extend_from_slice(&[0x02, 0xc8, 0xe0, 0xcd, 0xab, 0, 0]);
            w.mode64();
            if let Some(ip) = fup {
                w.fup(ip);
            }
            w.psbend();
        };
        psb_plus(&mut w, tsc, None);
        w.tip_pge(self.top);
        let mut last_psb = 0usize;
        while w.buf.len() < size {
            let outer: Vec<bool> = (0..LOOP_CONDS).map(|_| rng.below(2) == 1).collect();
            let inner: Vec<bool> = (0..FUNC_CONDS).map(|_| rng.below(2) == 1).collect();
            w.tnt(&outer).tip(self.func);
            if let Some(every) = interrupt_every {
                if irq.below(every.max(1)) == 0 {
                    w.fup(self.func).pad().tip_pgd(None);
                    w.mode64().tip_pge(self.func);
                }
            }
            // PSBs land after either TIP, so chunks start in the loop or in the function.
            if w.buf.len() - last_psb >= psb_every && rng.below(2) == 0 {
                tsc += 1000;
                last_psb = w.buf.len();
                psb_plus(&mut w, tsc, Some(self.func));
            }
            w.tnt(&inner).tip(self.after_call);
            bits.extend(outer);
            bits.extend(inner);
            if w.buf.len() - last_psb >= psb_every {
                tsc += 1000;
                last_psb = w.buf.len();
                psb_plus(&mut w, tsc, Some(self.after_call));
            }
        }
        (w.buf, bits)
    }

    /// The instruction addresses the trace made of `bits` executes (the oracle), up to the
    /// last resolved branch.
    pub fn simulate(&self, bits: &[bool]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut pc = self.top;
        let mut next_bit = 0usize;
        let mut returns_left = bits.len() / (LOOP_CONDS + FUNC_CONDS);
        loop {
            let off = (pc - self.base) as usize;
            let Some(info) = self
                .code
                .get(off..)
                .and_then(|b| decode_insn(b, pc, ExecMode::Bit64))
            else {
                return out;
            };
            let fall = pc + u64::from(info.size);
            match info.class {
                InsnClass::CondJump => {
                    let Some(&taken) = bits.get(next_bit) else {
                        return out;
                    };
                    out.push(pc);
                    next_bit += 1;
                    pc = if taken {
                        let i = iced_x86::Decoder::with_ip(64, &info.bytes, pc, 0).decode();
                        i.near_branch_target()
                    } else {
                        fall
                    };
                }
                InsnClass::Call if info.direct_target.is_none() => {
                    out.push(pc);
                    pc = self.func;
                }
                InsnClass::Return => {
                    if returns_left == 0 {
                        return out;
                    }
                    out.push(pc);
                    returns_left -= 1;
                    pc = self.after_call;
                }
                _ => {
                    out.push(pc);
                    pc = info.direct_target.unwrap_or(fall);
                }
            }
        }
    }
}

/// How a [`CallProgram`] trace is written.
#[derive(Debug, Clone, Copy)]
pub struct CallTraceOptions {
    /// Returns whose call was seen since the last PSB are one taken TNT bit (hardware's
    /// return compression); otherwise, and for returns whose call came before the last
    /// PSB (hardware starts its compression afresh at every PSB), a TIP.
    pub ret_compression: bool,
    /// TSC + TMA (and sometimes CBR) in every PSB+, MTC packets on the way, now and then a
    /// TSC of its own. CPU parameters that give MTC meaning: [`CallProgram::timed_cpu`].
    pub timing: bool,
    /// A PSB+ (with a FUP of the next instruction) after roughly this many bytes.
    pub psb_every: usize,
    /// At least this many instructions; the trace ends right after a conditional branch.
    pub min_insns: usize,
    pub seed: u64,
}

/// A generated trace of a [`CallProgram`] and its oracle.
#[derive(Debug, Clone)]
pub struct CallTrace {
    pub pt: Vec<u8>,
    /// The address of every instruction the trace executes, in order.
    pub ips: Vec<u64>,
    /// Calls, returns written as TIP, returns compressed to a TNT bit, indirect branches
    /// other than returns, PSBs, MTC packets.
    pub calls: u64,
    pub tip_returns: u64,
    pub compressed_returns: u64,
    pub indirect: u64,
    pub psbs: u64,
    pub mtcs: u64,
    /// Interrupts (tracing disabled and enabled again at the same instruction).
    pub interrupts: u64,
}

/// What one instruction of a [`CallProgram`] does to the flow.
#[derive(Debug, Clone, Copy)]
enum Step {
    Plain,
    /// A conditional branch deciding what the function does next.
    Cond {
        target: u64,
        role: Choice,
    },
    DirectCall {
        target: u64,
    },
    DirectJump {
        target: u64,
    },
    IndirectCall,
    IndirectJump,
    Return,
}

/// The decision a [`CallProgram`] function's conditional branch (taken) stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Return,
    Indirect,
    IndirectTail,
    Tail,
    Skip,
}

/// A program of many images whose functions call each other across images (tests and
/// benchmarks of decoders on realistic flow: calls, returns at any depth, tail calls,
/// indirect calls and jumps): every function is a loop that at each turn returns, or
/// calls (directly a fixed function of another image, or indirectly any function), or
/// tail-calls (directly or indirectly), each decided by a conditional branch; any
/// sequence of decisions is a valid execution (a trace generator picks them, the
/// register values do not matter to a decoder).
///
/// ```text
/// f:    push rbx
/// top:  add rax, 1 ; test rax, 1 ; jz ret      (return)
///       test rax, 2 ; jz ind                   (indirect call or tail call)
///       test rax, 4 ; jz tail                  (direct tail call)
///       test rax, 8 ; jz skip ; add rbx, 1     (a branch that skips an instruction)
/// skip: call g      ; jmp top                  (g: a fixed function of another image)
/// ind:  test rax, 16 ; jz itail ; call rcx ; jmp top
/// itail: pop rbx ; jmp rdx
/// tail: pop rbx ; jmp h                        (h: another fixed function)
/// ret:  pop rbx ; ret
/// ```
#[derive(Debug, Clone)]
pub struct CallProgram {
    /// (base address, code) of each image.
    pub images: Vec<(u64, Vec<u8>)>,
    /// Function entries.
    pub funcs: Vec<u64>,
    /// The deepest call nesting a trace reaches (within every decoder's return stack).
    pub max_depth: usize,
    /// Per image: the step of the instruction starting at each offset.
    steps: Vec<Vec<Option<(u8, Step)>>>,
}

/// The role of each decision branch of a function, by address.
type BranchRoles = Vec<(u64, Choice)>;

/// CTC bits per MTC period of [`CallProgram::timed_cpu`].
pub const CALL_MTC_FREQ: u8 = 3;

/// Bytes reserved for each [`CallProgram`] function.
const CALL_FUNC_SPACE: u64 = 0x100;

impl CallProgram {
    /// `images` images (at least 2) of `per_image` functions each, the first image at
    /// `base`, one every 1 MiB.
    pub fn new(base: u64, images: usize, per_image: usize) -> Self {
        Self::build(base, images.max(2), per_image.max(1)).expect("assemble call program")
    }

    fn build(base: u64, nimg: usize, per: usize) -> Result<Self, IcedError> {
        let n = nimg * per;
        let image_base = |m: usize| base + (m as u64) * 0x10_0000;
        let entry = |j: usize| image_base(j / per) + (j % per) as u64 * CALL_FUNC_SPACE;
        let mut images = Vec::new();
        let mut steps = Vec::new();
        for m in 0..nimg {
            let mut code = vec![0xccu8; per * CALL_FUNC_SPACE as usize];
            let mut roles = std::collections::HashMap::new();
            for k in 0..per {
                let j = m * per + k;
                // The direct callee lies in another image; the tail-callee is the next
                // image's function after it.
                let g = entry((j + per * (1 + j % (nimg - 1))) % n);
                let h = entry((j + per + 1) % n);
                let (bytes, func_roles) = Self::function(entry(j), g, h)?;
                let at = k * CALL_FUNC_SPACE as usize;
                code[at..at + bytes.len()].copy_from_slice(&bytes);
                roles.extend(func_roles);
            }
            steps.push(Self::steps_of(&code, image_base(m), &roles));
            images.push((image_base(m), code));
        }
        Ok(CallProgram {
            images,
            funcs: (0..n).map(entry).collect(),
            max_depth: 40,
            steps,
        })
    }

    /// One function at `at` (see the type's layout) calling `g` and tail-calling `h`; its
    /// code and the role of each conditional branch (by address).
    fn function(at: u64, g: u64, h: u64) -> Result<(Vec<u8>, BranchRoles), IcedError> {
        let mut a = CodeAssembler::new(64)?;
        let mut top = a.create_label();
        let mut ret = a.create_label();
        let mut ind = a.create_label();
        let mut itail = a.create_label();
        let mut tail = a.create_label();
        let mut skip = a.create_label();
        let mut conds = Vec::new();
        a.push(rbx)?;
        a.set_label(&mut top)?;
        a.add(rax, 1)?;
        for (bit, label, role) in [
            (1, ret, Choice::Return),
            (2, ind, Choice::Indirect),
            (4, tail, Choice::Tail),
            (8, skip, Choice::Skip),
        ] {
            a.test(rax, bit)?;
            let mut here = a.create_label();
            a.set_label(&mut here)?;
            a.jz(label)?;
            conds.push((here, role));
        }
        a.add(rbx, 1)?;
        a.set_label(&mut skip)?;
        a.call(g)?;
        a.jmp(top)?;
        a.set_label(&mut ind)?;
        a.test(rax, 16)?;
        let mut here = a.create_label();
        a.set_label(&mut here)?;
        a.jz(itail)?;
        conds.push((here, Choice::IndirectTail));
        a.call(rcx)?;
        a.jmp(top)?;
        a.set_label(&mut itail)?;
        a.pop(rbx)?;
        a.jmp(rdx)?;
        a.set_label(&mut tail)?;
        a.pop(rbx)?;
        a.jmp(h)?;
        a.set_label(&mut ret)?;
        a.pop(rbx)?;
        a.ret()?;
        let res = a.assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
        let roles = conds
            .iter()
            .map(|(l, role)| Ok((res.label_ip(l)?, *role)))
            .collect::<Result<Vec<_>, IcedError>>()?;
        assert!(
            res.inner.code_buffer.len() <= CALL_FUNC_SPACE as usize,
            "function too large"
        );
        Ok((res.inner.code_buffer, roles))
    }

    /// The step of every instruction of an image (functions decoded from their entries).
    fn steps_of(
        code: &[u8],
        base: u64,
        roles: &std::collections::HashMap<u64, Choice>,
    ) -> Vec<Option<(u8, Step)>> {
        let mut steps = vec![None; code.len()];
        for entry in (0..code.len()).step_by(CALL_FUNC_SPACE as usize) {
            let mut off = entry;
            while let Some(info) = code
                .get(off..)
                .filter(|b| b.first() != Some(&0xcc))
                .and_then(|b| decode_insn(b, base + off as u64, ExecMode::Bit64))
            {
                let pc = base + off as u64;
                let step = match (info.class, info.direct_target) {
                    (InsnClass::CondJump, _) => {
                        let i = iced_x86::Decoder::with_ip(64, &info.bytes, pc, 0).decode();
                        Step::Cond {
                            target: i.near_branch_target(),
                            role: roles[&pc],
                        }
                    }
                    (InsnClass::Call, Some(target)) => Step::DirectCall { target },
                    (InsnClass::Call, None) => Step::IndirectCall,
                    (InsnClass::Jump, Some(target)) => Step::DirectJump { target },
                    (InsnClass::Jump, None) => Step::IndirectJump,
                    (InsnClass::Return, _) => Step::Return,
                    _ => Step::Plain,
                };
                steps[off] = Some((info.size, step));
                off += usize::from(info.size);
            }
        }
        steps
    }

    /// An image holding every function of the program.
    pub fn space(&self) -> super::AddressSpace {
        let mut space = super::AddressSpace::new();
        for (k, (base, code)) in self.images.iter().enumerate() {
            space.add_bytes(&format!("image{k}"), code.clone(), *base);
        }
        space
    }

    /// CPU parameters under which the MTC packets of a timed trace advance time (TMA and
    /// CPUID 0x15's TSC/crystal ratio 3).
    pub fn timed_cpu() -> super::CpuParams {
        super::CpuParams {
            mtc_freq: CALL_MTC_FREQ,
            cpuid_0x15_eax: 1,
            cpuid_0x15_ebx: 3,
            ..Default::default()
        }
    }

    fn step(&self, pc: u64) -> (u8, Step) {
        let m = ((pc - self.images[0].0) >> 20) as usize;
        self.steps[m][(pc - self.images[m].0) as usize].expect("an instruction of the program")
    }

    /// A valid trace of at least `o.min_insns` instructions with random decisions,
    /// starting (PSB+, TIP.PGE) in the first function.
    pub fn trace(&self, o: CallTraceOptions) -> CallTrace {
        CallGen::new(self, o).run()
    }
}

/// The state of one [`CallProgram::trace`].
struct CallGen<'p> {
    prog: &'p CallProgram,
    o: CallTraceOptions,
    rng: XorShift,
    w: PacketWriter<Vec<u8>>,
    out: CallTrace,
    /// Return addresses; those below `floor` were pushed before the last PSB.
    stack: Vec<u64>,
    floor: usize,
    tsc: u64,
    ctc: u32,
    last_psb: usize,
}

impl<'p> CallGen<'p> {
    fn new(prog: &'p CallProgram, o: CallTraceOptions) -> Self {
        CallGen {
            prog,
            o,
            rng: XorShift::new(o.seed),
            w: PacketWriter::new(Vec::new(), usize::MAX),
            out: CallTrace {
                pt: Vec::new(),
                ips: Vec::with_capacity(o.min_insns + 64),
                calls: 0,
                tip_returns: 0,
                compressed_returns: 0,
                indirect: 0,
                psbs: 0,
                mtcs: 0,
                interrupts: 0,
            },
            stack: Vec::new(),
            floor: 0,
            tsc: 1_000_000,
            ctc: 0,
            last_psb: 0,
        }
    }

    fn raw(&mut self, bytes: &[u8]) {
        let r = self
            .w
            .flush_tnt()
            .and_then(|()| self.w.sink_mut().put(bytes));
        debug_assert!(r.is_ok());
    }

    fn ok(r: Result<(), pttrace_encoder::EncodeError>) {
        debug_assert!(r.is_ok(), "writing into a vector");
    }

    /// PSB+ (TSC, TMA, sometimes CBR when timed), MODE.Exec, FUP(`ip`) when given.
    fn psb(&mut self, ip: Option<u64>) {
        self.raw(&pttrace_encoder::packet::PSB);
        self.w.forget_last_ip();
        if self.o.timing {
            self.tsc += 50;
            Self::ok(self.w.tsc(self.tsc));
            let [c0, c1] = ((self.ctc & 0xffff) as u16).to_le_bytes();
            let [f0, f1] = (self.rng.below(0x100) as u16).to_le_bytes();
            self.raw(&[0x02, 0x73, c0, c1, 0, f0, f1]);
            if self.rng.below(4) == 0 {
                let ratio = 20 + self.rng.below(10) as u8;
                self.raw(&[0x02, 0x03, ratio, 0]);
            }
        }
        Self::ok(self.w.mode_exec64());
        if let Some(ip) = ip {
            Self::ok(self.w.fup(ip));
        }
        self.raw(&pttrace_encoder::packet::PSBEND);
        self.last_psb = self.w.len();
        self.floor = self.stack.len();
        self.out.psbs += 1;
    }

    /// Timing packets now and then (MTC mostly, sometimes a TSC), when timed.
    fn timing(&mut self) {
        if !self.o.timing || self.rng.below(8) != 0 {
            return;
        }
        if self.rng.below(6) == 0 {
            self.tsc += 10 + self.rng.below(100);
            Self::ok(self.w.tsc(self.tsc));
        } else {
            self.ctc = self.ctc.wrapping_add(1 << CALL_MTC_FREQ);
            self.tsc += 3 << CALL_MTC_FREQ;
            let payload = (self.ctc >> CALL_MTC_FREQ) as u8;
            self.raw(&[0x59, payload]);
            self.out.mtcs += 1;
        }
    }

    /// Before the instruction at `pc` (a branch target): a PSB+ when one is due, and now
    /// and then an interrupt (user-only tracing: FUP + TIP.PGD there, TIP.PGE back there,
    /// with a TSC first when timed).
    fn maybe_psb(&mut self, pc: u64) {
        if self.w.len() - self.last_psb >= self.o.psb_every {
            self.psb(Some(pc));
        }
        if self.rng.below(64) == 0 {
            Self::ok(self.w.async_disable(pc));
            self.out.interrupts += 1;
            self.timing();
            let tsc = self.o.timing.then(|| {
                self.tsc += 200;
                self.tsc
            });
            Self::ok(self.w.enable(pc, tsc));
        }
    }

    /// Whether the conditional branch of `role` is taken.
    fn decide(&mut self, role: Choice) -> bool {
        let depth = self.stack.len();
        match role {
            Choice::Return if depth == 0 => false,
            Choice::Return if depth >= self.prog.max_depth => true,
            Choice::Return => self.rng.below(10) < 4,
            Choice::Indirect => self.rng.below(4) == 0,
            Choice::IndirectTail | Choice::Skip => self.rng.below(2) == 0,
            Choice::Tail => self.rng.below(5) == 0,
        }
    }

    fn any_function(&mut self) -> u64 {
        let k = self.rng.below(self.prog.funcs.len() as u64) as usize;
        self.prog.funcs[k]
    }

    fn run(mut self) -> CallTrace {
        let mut pc = self.prog.funcs[0];
        self.psb(None);
        if self.o.timing {
            self.tsc += 20;
            Self::ok(self.w.tsc(self.tsc));
        }
        Self::ok(self.w.mode_exec64());
        Self::ok(self.w.tip_pge(pc));
        loop {
            let (size, step) = self.prog.step(pc);
            self.out.ips.push(pc);
            let next = pc + u64::from(size);
            pc = match step {
                Step::Plain => next,
                Step::Cond { target, role } => {
                    let taken = self.decide(role);
                    Self::ok(self.w.branch(taken));
                    if self.out.ips.len() >= self.o.min_insns {
                        Self::ok(self.w.flush_tnt());
                        break;
                    }
                    if taken {
                        target
                    } else {
                        next
                    }
                }
                Step::DirectCall { target } => {
                    self.stack.push(next);
                    self.out.calls += 1;
                    target
                }
                Step::DirectJump { target } => target,
                Step::IndirectCall | Step::IndirectJump => {
                    let to = self.any_function();
                    if matches!(step, Step::IndirectCall) {
                        self.stack.push(next);
                        self.out.calls += 1;
                    }
                    self.out.indirect += 1;
                    Self::ok(self.w.tip(to));
                    self.timing();
                    self.maybe_psb(to);
                    to
                }
                Step::Return => {
                    let to = self.stack.pop().expect("returns only with a caller");
                    if self.o.ret_compression && self.stack.len() >= self.floor {
                        Self::ok(self.w.branch(true));
                        self.out.compressed_returns += 1;
                    } else {
                        self.floor = self.floor.min(self.stack.len());
                        Self::ok(self.w.tip(to));
                        self.out.tip_returns += 1;
                        self.timing();
                        self.maybe_psb(to);
                    }
                    to
                }
            };
        }
        self.out.pt = self.w.into_sink();
        self.out
    }
}
