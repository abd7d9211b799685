//! Synthetic code and PT traces for tests and benchmarks.
//!
//! [`PtWriter`] emits genuine PT packets through the shared encoder (`pttrace-encoder`).
//! [`LoopProgram`] is a small x86-64 program (assembled with iced-x86) whose every
//! conditional-branch outcome sequence is a valid execution, so random TNT bits give a
//! valid trace of any length; [`LoopProgram::simulate`] is the oracle for the expected
//! instruction addresses.

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use pttrace_encoder::PacketWriter;

use super::insn::decode_insn;
use super::records::{ExecMode, InsnClass};

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
        let mut rng = XorShift::new(seed);
        let mut w = PtWriter::new();
        let mut bits = Vec::new();
        let mut tsc = 1_000_000u64;
        w.psb_plus(Some(tsc), None).tip_pge(self.top);
        let mut last_psb = 0usize;
        while w.buf.len() < size {
            let outer: Vec<bool> = (0..LOOP_CONDS).map(|_| rng.below(2) == 1).collect();
            let inner: Vec<bool> = (0..FUNC_CONDS).map(|_| rng.below(2) == 1).collect();
            w.tnt(&outer).tip(self.func);
            // PSBs land after either TIP, so chunks start in the loop or in the function.
            if w.buf.len() - last_psb >= psb_every && rng.below(2) == 0 {
                tsc += 1000;
                last_psb = w.buf.len();
                w.psb_plus(Some(tsc), Some(self.func));
            }
            w.tnt(&inner).tip(self.after_call);
            bits.extend(outer);
            bits.extend(inner);
            if w.buf.len() - last_psb >= psb_every {
                tsc += 1000;
                last_psb = w.buf.len();
                w.psb_plus(Some(tsc), Some(self.after_call));
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
