//! Per-address instruction facts (length, class, direct target), decoded once with
//! iced-x86 and cached until the image changes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

use super::image::AddressSpace;
use super::records::{ExecMode, InsnClass};

/// What the block expander needs to know about one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsnInfo {
    pub size: u8,
    pub bytes: [u8; 15],
    pub class: InsnClass,
    /// Target of a direct near jump/call (the block decoder follows these without trace).
    pub direct_target: Option<u64>,
    /// syscall / sysenter / int 0x80.
    pub is_syscall: bool,
    /// The name of a branch libipt 2.1.2's instruction decoder does not know (ERETU,
    /// ERETS, JMPABS): it walks on past these as if they were no branch.
    pub beyond_libipt: Option<&'static str>,
}

impl InsnInfo {
    /// An instruction of `size` bytes (`raw`) that is no branch, none libipt takes as one.
    fn plain(size: usize, raw: [u8; 15]) -> Self {
        InsnInfo {
            size: size as u8,
            bytes: raw,
            class: InsnClass::Other,
            direct_target: None,
            is_syscall: false,
            beyond_libipt: None,
        }
    }
}

/// The first `size` (at most 15) bytes of `bytes`, as [`InsnInfo::bytes`] holds them;
/// `None` when `bytes` has fewer.
fn raw_bytes(bytes: &[u8], size: usize) -> Option<[u8; 15]> {
    let mut raw = [0u8; 15];
    raw.get_mut(..size)?.copy_from_slice(bytes.get(..size)?);
    Some(raw)
}

/// JMPABS (APX): a REX2 prefix (0xD5, payload with M0 = 0 and W = 0), opcode 0xA1 and a
/// 64-bit absolute target, 11 bytes, 64-bit mode only. iced-x86 1.22 knows no APX. The
/// jump is direct, but Intel PT reports its target with a TIP like an indirect jump's
/// (libipt's later versions decode it so), which is how our decoder takes it.
fn jmpabs(bytes: &[u8], mode: ExecMode) -> Option<InsnInfo> {
    if mode != ExecMode::Bit64 {
        return None;
    }
    match bytes {
        [0xd5, payload, 0xa1, ..] if payload & 0x88 == 0 => Some(InsnInfo {
            size: 11,
            bytes: raw_bytes(bytes, 11)?,
            class: InsnClass::Jump,
            direct_target: None,
            is_syscall: false,
            beyond_libipt: Some("JMPABS"),
        }),
        _ => None,
    }
}

/// A near branch's target as libipt computes it: the next instruction's address plus the
/// displacement, in 64 bits. iced-x86 wraps it to the mode's width (16 or 32 bits); the
/// two differ only for code near the top of a smaller address space, or beyond it.
pub(crate) fn branch_target(insn: &Instruction, mode: ExecMode) -> u64 {
    let target = insn.near_branch_target();
    let next = insn.next_ip();
    let disp = target.wrapping_sub(next);
    let disp = match mode {
        ExecMode::Bit32 => disp as u32 as i32 as i64,
        ExecMode::Bit16 => disp as u16 as i16 as i64,
        _ => return target,
    };
    // (`next_ip` is wrapped too: the unwrapped one is the instruction's address plus
    // its size.)
    insn.ip()
        .wrapping_add(insn.len() as u64)
        .wrapping_add(disp as u64)
}

/// Classifies the instruction at the start of `bytes` (decoded at `pc`).
pub fn decode_insn(bytes: &[u8], pc: u64, mode: ExecMode) -> Option<InsnInfo> {
    if let Some(info) = jmpabs(bytes, mode) {
        return Some(info);
    }
    let mut dec = Decoder::with_ip(mode.bitness(), bytes, pc, DecoderOptions::NONE);
    let insn = dec.decode();
    classify(&insn, bytes, mode)
}

/// The code of one segment of an address space, its instructions decoded one after the
/// other through one iced-x86 decoder. (Making a decoder costs more than decoding an
/// instruction with it: on a java trace, whose JIT code makes the fast decoder build
/// many blocks, making one per instruction was a quarter of the decoding thread's
/// machine instructions.)
pub(crate) struct SegmentCode<'a> {
    start: u64,
    bytes: &'a [u8],
    dec: Decoder<'a>,
    /// The instruction decoded last.
    insn: Instruction,
    mode: ExecMode,
}

impl<'a> SegmentCode<'a> {
    /// The code of the segment of `space` that maps `pc`, decoded in `mode`.
    pub(crate) fn at(space: &'a AddressSpace, pc: u64, mode: ExecMode) -> Option<Self> {
        let seg = space.find(pc)?;
        let bytes = seg.bytes();
        Some(SegmentCode {
            start: seg.start,
            bytes,
            dec: Decoder::with_ip(mode.bitness(), bytes, seg.start, DecoderOptions::NONE),
            insn: Instruction::default(),
            mode,
        })
    }

    /// Whether its bytes hold `pc`.
    #[inline]
    pub(crate) fn holds(&self, pc: u64) -> bool {
        pc.wrapping_sub(self.start) < self.bytes.len() as u64
    }

    /// The instruction at `pc`: what [`decode_insn`] gives for the bytes from `pc` to the
    /// segment's end (what [`AddressSpace::read`] reads there); `None` when the segment
    /// has no byte at `pc` or they decode to no instruction.
    pub(crate) fn decode(&mut self, pc: u64) -> Option<InsnInfo> {
        let pos = usize::try_from(pc.checked_sub(self.start)?).ok()?;
        let bytes = self.bytes.get(pos..).filter(|b| !b.is_empty())?;
        if let Some(info) = jmpabs(bytes, self.mode) {
            return Some(info);
        }
        self.dec.set_position(pos).ok()?;
        self.dec.set_ip(pc);
        self.dec.decode_out(&mut self.insn);
        classify(&self.insn, bytes, self.mode)
    }

    /// Where the segment ends (the address after its last byte), when the instruction at
    /// `pc` has bytes beyond it: what the segment's bytes from `pc` on begin, followed by
    /// any bytes, needs more than the segment has. (A length decoder that reads only the
    /// segment's bytes fails there, as libipt's does.) `None` when it fits, or the bytes
    /// begin no instruction whatever follows.
    pub(crate) fn cut_at_end(&self, pc: u64) -> Option<u64> {
        let pos = usize::try_from(pc.checked_sub(self.start)?).ok()?;
        let rest = self
            .bytes
            .get(pos..)
            .filter(|b| !b.is_empty() && b.len() < 15)?;
        let mut padded = [0u8; 15];
        padded.get_mut(..rest.len())?.copy_from_slice(rest);
        let info = decode_insn(&padded, pc, self.mode)?;
        (usize::from(info.size) > rest.len()).then(|| self.start + self.bytes.len() as u64)
    }

    /// The target of the near branch [`Self::decode`] decoded last, as libipt computes it.
    pub(crate) fn last_branch_target(&self) -> u64 {
        branch_target(&self.insn, self.mode)
    }
}

/// [`InsnInfo`] of `insn`, decoded from the start of `bytes` in `mode`; `None` when it is
/// invalid.
fn classify(insn: &Instruction, bytes: &[u8], mode: ExecMode) -> Option<InsnInfo> {
    if insn.is_invalid() {
        return match mode {
            ExecMode::Bit64 => invalid_in_64_bit(bytes),
            _ => None,
        };
    }
    let size = insn.len().min(15);
    let raw = raw_bytes(bytes, size)?;
    // Most instructions: no branch, none of those below that are one to libipt (what
    // `classify_branch` would find for them, found sooner).
    if plain(insn) {
        return Some(InsnInfo::plain(size, raw));
    }
    Some(classify_branch(insn, raw, mode))
}

/// An instruction of an opcode that is invalid in 64-bit mode (the processor faults on
/// it; iced-x86 decodes none) to which libipt's instruction-length decoder gives a
/// length and which it takes as no branch, so that its decoders walk on past it:
/// PUSH/POP of ES, CS, SS, DS, DAA, DAS, AAA, AAS, PUSHA, POPA, INTO, SALC and AAM (and
/// 82, the alias of 80; CALL and JMP far with a pointer, 9A and EA, as no branch). Code
/// reached by a damaged trace (a jump into the middle of an instruction) meets these;
/// decoded as libipt decodes them, such a trace gives libipt's instructions. (D5, AAD,
/// is left out: libipt 2.3 reads it as APX's REX2 prefix in 64-bit mode, 2.1.2 as AAD.)
fn invalid_in_64_bit(bytes: &[u8]) -> Option<InsnInfo> {
    let max = bytes.len().min(15);
    // Legacy prefixes, each of which drops a REX before it; a REX right before the opcode.
    let (mut at, mut osz, mut rex_w) = (0usize, false, false);
    let opcode = loop {
        let b = *bytes.get(at).filter(|_| at < max)?;
        match b {
            0x66 => (osz, rex_w) = (true, false),
            0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x67 | 0xf0 | 0xf2 | 0xf3 => rex_w = false,
            0x40..=0x4f => rex_w = b & 8 != 0,
            _ => break b,
        }
        at += 1;
    };
    at += 1;
    let tail = match opcode {
        0x06 | 0x07 | 0x0e | 0x16 | 0x17 | 0x1e | 0x1f | 0x27 | 0x2f | 0x37 | 0x3f | 0x60
        | 0x61 | 0xce | 0xd6 => 0,
        0xd4 => 1,
        // The pointer's offset (its operand size: 16 bits with an operand-size prefix and
        // no REX.W) and segment.
        0x9a | 0xea => {
            if osz && !rex_w {
                4
            } else {
                6
            }
        }
        // ModRM (with SIB and displacement), then an 8-bit immediate.
        0x82 => modrm_bytes(bytes.get(at..max)?)? + 1,
        _ => return None,
    };
    let size = at + tail;
    if size > max {
        return None;
    }
    Some(InsnInfo::plain(size, raw_bytes(bytes, size)?))
}

/// Bytes of the ModRM byte at the start of `b` with its SIB byte and displacement, in
/// 64-bit mode (32- and 64-bit addressing encode them alike); `None` when `b` is empty.
fn modrm_bytes(b: &[u8]) -> Option<usize> {
    let modrm = *b.first()?;
    let (md, rm) = (modrm >> 6, modrm & 7);
    if md == 3 {
        return Some(1);
    }
    let sib = rm == 4;
    let disp = match md {
        1 => 1,
        2 => 4,
        // mod 0: RIP-relative (rm 5), or a SIB without base (its base 5).
        _ if rm == 5 => 4,
        _ if sib && b.get(1)? & 7 == 5 => 4,
        _ => 0,
    };
    Some(1 + usize::from(sib) + disp)
}

/// Whether `insn` is no branch and none of the instructions libipt takes as one.
#[inline]
fn plain(insn: &Instruction) -> bool {
    insn.flow_control() == FlowControl::Next
        && !matches!(
            insn.code(),
            Code::Syscall | Code::Sysenter | Code::Int_imm8 | Code::Eretu | Code::Erets
        )
        && insn.mnemonic() != Mnemonic::Ptwrite
        && !far_return_to_libipt(insn.mnemonic())
}

/// SYSRET, SYSEXIT, the VM entries and UIRET: far returns to libipt, their target from a
/// TIP (iced-x86's flow control says otherwise).
#[inline]
fn far_return_to_libipt(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Sysret
            | Mnemonic::Sysretq
            | Mnemonic::Sysexit
            | Mnemonic::Sysexitq
            | Mnemonic::Vmlaunch
            | Mnemonic::Vmresume
            | Mnemonic::Uiret
    )
}

/// [`InsnInfo`] of a valid `insn` ([`classify`]), whose bytes are `raw`.
fn classify_branch(insn: &Instruction, raw: [u8; 15], mode: ExecMode) -> InsnInfo {
    let size = insn.len().min(15);
    let direct = matches!(
        insn.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    );
    let far = matches!(insn.op0_kind(), OpKind::FarBranch16 | OpKind::FarBranch32)
        || matches!(
            insn.mnemonic(),
            Mnemonic::Jmpe | Mnemonic::Retf | Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq
        );
    let is_syscall = matches!(insn.code(), Code::Syscall | Code::Sysenter)
        || (insn.code() == Code::Int_imm8 && insn.immediate8() == 0x80);
    let class = match insn.flow_control() {
        // (SYSRET and SYSEXIT among these: far returns, below.)
        FlowControl::Next | FlowControl::Exception => match insn.mnemonic() {
            Mnemonic::Ptwrite => InsnClass::Ptwrite,
            _ => InsnClass::Other,
        },
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
            if far || insn.is_jmp_far_indirect() {
                InsnClass::FarJump
            } else {
                InsnClass::Jump
            }
        }
        FlowControl::ConditionalBranch => InsnClass::CondJump,
        FlowControl::Call | FlowControl::IndirectCall => {
            if far || insn.is_call_far_indirect() {
                InsnClass::FarCall
            } else {
                InsnClass::Call
            }
        }
        FlowControl::Return => {
            if far {
                InsnClass::FarReturn
            } else {
                InsnClass::Return
            }
        }
        FlowControl::Interrupt => match insn.mnemonic() {
            Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq => InsnClass::FarReturn,
            _ => InsnClass::FarCall,
        },
        FlowControl::XbeginXabortXend => InsnClass::Other,
    };
    // ERETU / ERETS (FRED): far returns, their target from a TIP (iced-x86's flow
    // control does not say far).
    let beyond_libipt = match insn.code() {
        Code::Eretu => Some("ERETU"),
        Code::Erets => Some("ERETS"),
        _ => None,
    };
    let class = if is_syscall {
        InsnClass::FarCall
    } else if beyond_libipt.is_some() || far_return_to_libipt(insn.mnemonic()) {
        InsnClass::FarReturn
    } else {
        class
    };
    let direct_target = (direct && matches!(class, InsnClass::Jump | InsnClass::Call))
        .then(|| branch_target(insn, mode));
    InsnInfo {
        size: size as u8,
        bytes: raw,
        class,
        direct_target,
        is_syscall,
        beyond_libipt,
    }
}

impl InsnInfo {
    /// The records of this instruction executed at `pc` in `mode`: the instruction, and a
    /// syscall marker after a system call.
    #[inline]
    pub(crate) fn push_records(
        &self,
        out: &mut Vec<crate::records::Record>,
        pc: u64,
        mode: ExecMode,
    ) {
        out.push(crate::records::Record::Instruction(
            crate::records::Instruction {
                pc,
                size: self.size,
                bytes: self.bytes,
                class: self.class,
                mode,
            },
        ));
        if self.is_syscall {
            out.push(crate::records::Record::Syscall { pc });
        }
    }
}

/// A fast hasher for code addresses (multiplicative, no DoS concern: keys are ours).
#[derive(Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// Identity of a libipt block: the same start, length and mode always expand to the same
/// instructions (for one image generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockKey {
    pub ip: u64,
    pub ninsn: u16,
    pub mode: u8,
}

impl std::hash::Hash for BlockKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.ip ^ (u64::from(self.ninsn) << 40) ^ (u64::from(self.mode) << 58));
    }
}

/// Data built on a [`BlockCache`]'s arena by a layer above (the fast decoder's block
/// table): kept in the cache and cleared with it when the image generation changes.
pub trait ArenaTied: Default {
    fn clear(&mut self);
}

/// Cache of expanded blocks: each block's records live in one arena; the map gives a
/// block's (start, len) in it and the address after the block. `T` is what a layer above
/// keeps on the same arena ([`ArenaTied`]).
#[derive(Default)]
pub struct BlockCache<T: ArenaTied> {
    generation: Option<u64>,
    map: HashMap<BlockKey, (u32, u32, u64), BuildHasherDefault<AddrHasher>>,
    /// Direct-mapped front cache of `map` for the hot path (hits without hashing). A
    /// fixed-size array, so the slot index needs no bounds check. Made on first use: the
    /// fast decoder has blocks of its own and needs it only where it hands over to libipt.
    l1: Option<Box<[L1Entry; L1_SIZE]>>,
    pub arena: Vec<super::records::Record>,
    /// Keep replaced arenas here instead of dropping them (compact collection).
    pub retire: bool,
    pub retired: Vec<Vec<super::records::Record>>,
    /// The fast decoder's blocks (their records in `arena`).
    pub flow: T,
    /// The runs of the blocks in `arena`, made when a consumer asks for them.
    pub runs: crate::runs::BlockRuns,
}

/// A front-cache entry, 16 bytes (4 per cache line): the key exactly, the block's arena
/// start, and its record count as `ninsn + extra` (syscall markers add records).
#[derive(Debug, Clone, Copy)]
struct L1Entry {
    ip: u64,
    start: u32,
    ninsn: u16,
    extra: u8,
    mode: u8,
}

impl L1Entry {
    /// An unused slot: mode 255 and no instructions, which no block libipt returns has
    /// (its modes are 0..=3) and which `fill_l1` never stores, so nothing matches it.
    const UNUSED: L1Entry = L1Entry {
        ip: 0,
        start: 0,
        ninsn: 0,
        extra: 0,
        mode: u8::MAX,
    };
}

const L1_SIZE: usize = 4096;

/// An empty front cache, built in place on the heap (not on the stack and copied: every
/// decoder, and every part of a PSB-parallel decode, makes one or more).
fn new_l1() -> Box<[L1Entry; L1_SIZE]> {
    vec![L1Entry::UNUSED; L1_SIZE]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| Box::new([L1Entry::UNUSED; L1_SIZE]))
}

/// Front-cache slot of a block at `ip`: a multiplicative hash of the address's low bits
/// (blocks at one address with other lengths share the slot; they are rare).
#[inline]
fn l1_slot(ip: u64) -> usize {
    ((ip as u32).wrapping_mul(0x9E37_79B1) >> 20) as usize & (L1_SIZE - 1)
}

/// Arena size (records) at which the cache starts over.
const ARENA_LIMIT: usize = 1 << 22;

impl<T: ArenaTied> BlockCache<T> {
    /// Drops everything when the image changed or the arena grew too big. Callers make
    /// sure no queued item still refers to the arena.
    #[inline]
    pub fn validate(&mut self, generation: u64) {
        if !self.is_valid(generation) {
            self.reset(generation);
        }
    }

    /// Whether `validate(generation)` would keep everything (the cache is current).
    #[inline]
    pub fn is_valid(&self, generation: u64) -> bool {
        self.generation == Some(generation) && self.arena.len() <= ARENA_LIMIT
    }

    /// Keeps the fast decoder's blocks (their records, table and runs) for the image's
    /// `generation`: the caller checked that their code is the same in it. The blocks of
    /// libipt's path are dropped.
    #[cold]
    pub fn keep_for(&mut self, generation: u64) {
        self.map.clear();
        if let Some(l1) = &mut self.l1 {
            l1.fill(L1Entry::UNUSED);
        }
        self.generation = Some(generation);
    }

    #[cold]
    fn reset(&mut self, generation: u64) {
        self.flow.clear();
        self.runs.clear();
        if self.retire && !self.arena.is_empty() {
            self.retired.push(std::mem::take(&mut self.arena));
        } else {
            self.arena.clear();
        }
        self.keep_for(generation);
    }

    /// (start, len, next ip) of a cached block.
    pub fn get(&self, k: &BlockKey) -> Option<(u32, u32, u64)> {
        self.map.get(k).copied()
    }

    /// The arena range (start, len) of a cached block: the hot path's lookup, through
    /// the front cache. `mode` is libipt's raw mode (folded as in [`BlockKey`] for the
    /// map). `None` for blocks not cached, and for the (in practice nonexistent) blocks
    /// the front cache cannot hold (over 255 syscall markers, a mode libipt never
    /// returns): callers take their ordinary path for those. Empty blocks (`ninsn == 0`)
    /// are never cached, so they get `None` in every mode libipt returns (an empty block
    /// at address 0 in the impossible raw mode 255 would match an unused slot).
    #[inline]
    pub fn get_fast(&mut self, ip: u64, ninsn: u16, mode: u32) -> Option<(u32, u32)> {
        let slot = l1_slot(ip);
        let hit = self.l1.as_ref().is_some_and(|l1| {
            let e = &l1[slot];
            e.ip == ip && e.ninsn == ninsn && u32::from(e.mode) == mode
        });
        if !hit && !self.fill_l1(slot, ip, ninsn, mode) {
            return None;
        }
        let e = &self.l1.as_ref()?[slot];
        Some((e.start, u32::from(e.ninsn) + u32::from(e.extra)))
    }

    /// `get_fast` past the front cache: looks the block up in the map and, when the front
    /// cache can hold it, puts it in `slot`. Whether `slot` now holds exactly this block.
    #[cold]
    #[inline(never)]
    fn fill_l1(&mut self, slot: usize, ip: u64, ninsn: u16, mode: u32) -> bool {
        // (Keys hold libipt's modes 0..=3, and 4 for anything else: see `block_key`.)
        let mode = match u8::try_from(mode) {
            Ok(m @ 0..=4) if ninsn > 0 => m,
            _ => return false,
        };
        let k = BlockKey { ip, ninsn, mode };
        let Some(&(start, len, _)) = self.map.get(&k) else {
            return false;
        };
        let extra = len
            .checked_sub(u32::from(ninsn))
            .and_then(|x| u8::try_from(x).ok());
        match extra {
            Some(extra) if start.checked_add(len).is_some() => {
                self.l1.get_or_insert_with(new_l1)[slot] = L1Entry {
                    ip,
                    start,
                    ninsn,
                    extra,
                    mode,
                };
                true
            }
            _ => false,
        }
    }

    pub fn insert(&mut self, k: BlockKey, v: (u32, u32, u64)) {
        self.map.insert(k, v);
    }
}

/// Cache of [`InsnInfo`] by (address, mode), valid for one image generation.
#[derive(Default)]
pub struct InsnCache {
    generation: Option<u64>,
    map: AddrMap<InsnInfo>,
}

impl InsnCache {
    /// Keeps the instructions, when they are those of the image of generation `from`, for
    /// an image of generation `to` whose code the caller checked is the same (else they
    /// go at the next lookup, as for any other image).
    pub fn carry(&mut self, from: u64, to: u64) {
        if self.generation == Some(from) {
            self.generation = Some(to);
        }
    }

    /// The instruction at `pc`, `None` if unmapped or undecodable.
    pub fn get(&mut self, space: &AddressSpace, pc: u64, mode: ExecMode) -> Option<InsnInfo> {
        if self.generation != Some(space.generation()) {
            self.map.clear();
            self.generation = Some(space.generation());
        }
        // Mode is folded into the key's top bits (user/kernel addresses never use them
        // with different modes in practice; 16/32-bit code lives below 4 GiB).
        let key = pc ^ ((mode as u64) << 62);
        if let Some(i) = self.map.get(&key) {
            return Some(*i);
        }
        let info = decode_at(space, pc, mode)?;
        self.map.insert(key, info);
        Some(info)
    }
}

/// The instruction at `pc` in `space`, decoded now (no cache): `None` if unmapped or
/// undecodable. For callers that keep what they decode themselves (the fast decoder's
/// blocks), so that the instructions are not held twice.
pub fn decode_at(space: &AddressSpace, pc: u64, mode: ExecMode) -> Option<InsnInfo> {
    let mut buf = [0u8; 15];
    let n = space.read(pc, &mut buf);
    decode_insn(&buf[..n], pc, mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`classify`] finds sooner for the instructions [`plain`] takes is what
    /// [`classify_branch`] finds for them: every one-byte opcode and every opcode of the
    /// 0F, 0F 01, and F3/66/F2 0F maps, with every ModRM byte, in 64- and 32-bit mode.
    #[test]
    fn plain_instructions_are_those_classify_branch_finds_plain() {
        let (mut plain_seen, mut other_seen) = (0, 0);
        let maps: [&[u8]; 6] = [
            &[],
            &[0x0f],
            &[0x0f, 0x01],
            &[0xf3, 0x0f],
            &[0x66, 0x0f],
            &[0xf2, 0x0f],
        ];
        for mode in [ExecMode::Bit64, ExecMode::Bit32] {
            for map in maps {
                for op in 0..=255u8 {
                    for modrm in 0..=255u8 {
                        let bytes: Vec<u8> = [map, &[op, modrm], &[0x11; 12]].concat();
                        let mut dec = Decoder::with_ip(mode.bitness(), &bytes, 0x1000, 0);
                        let insn = dec.decode();
                        if insn.is_invalid() || !plain(&insn) {
                            other_seen += 1;
                            continue;
                        }
                        plain_seen += 1;
                        let mut raw = [0u8; 15];
                        raw[..insn.len()].copy_from_slice(&bytes[..insn.len()]);
                        let full = classify_branch(&insn, raw, mode);
                        assert_eq!(
                            (
                                full.class,
                                full.direct_target,
                                full.is_syscall,
                                full.beyond_libipt
                            ),
                            (InsnClass::Other, None, false, None),
                            "{mode:?} {:02x?}: {insn}",
                            &bytes[..insn.len()]
                        );
                    }
                }
            }
        }
        assert!(
            plain_seen > 100_000 && other_seen > 10_000,
            "{plain_seen} {other_seen}"
        );
    }

    /// Opcodes invalid in 64-bit mode, which iced-x86 does not decode, get libipt's
    /// lengths as instructions of no branch; in 32-bit mode they are what iced-x86
    /// decodes; cut by the bytes' end, or D5 (REX2 to libipt 2.3), they are none.
    #[test]
    fn opcodes_invalid_in_64_bit_mode_get_libipts_lengths() {
        let cases: &[(&[u8], usize)] = &[
            (&[0x06], 1),
            (&[0x07], 1),
            (&[0x0e], 1),
            (&[0x16], 1),
            (&[0x17], 1),
            (&[0x1e], 1),
            (&[0x1f], 1),
            (&[0x27], 1),
            (&[0x2f], 1),
            (&[0x37], 1),
            (&[0x3f], 1),
            (&[0x60], 1),
            (&[0x61], 1),
            (&[0xce], 1),
            (&[0xd6], 1),
            (&[0xd4, 0x0a], 2),
            (&[0xea, 1, 2, 3, 4, 5, 6], 7),
            (&[0x9a, 1, 2, 3, 4, 5, 6], 7),
            (&[0x66, 0x9a, 1, 2, 3, 4], 6),
            (&[0x66, 0x48, 0xea, 1, 2, 3, 4, 5, 6], 9),
            // A prefix after REX.W drops it: a 16-bit offset.
            (&[0x48, 0x66, 0xea, 1, 2, 3, 4], 7),
            (&[0x82, 0xc0, 0x01], 3),
            (&[0x82, 0x00, 0x01], 3),
            (&[0x82, 0x40, 0x08, 0x01], 4),
            (&[0x82, 0x80, 1, 2, 3, 4, 0x01], 7),
            (&[0x82, 0x05, 1, 2, 3, 4, 0x01], 7),
            (&[0x82, 0x04, 0x24, 0x01], 4),
            (&[0x82, 0x04, 0x25, 1, 2, 3, 4, 0x01], 8),
            (&[0x82, 0x44, 0x24, 0x08, 0x01], 5),
            (&[0x67, 0xf0, 0x2e, 0x41, 0x27], 5),
        ];
        for &(bytes, len) in cases {
            let mut padded = bytes.to_vec();
            padded.extend_from_slice(&[0x90; 4]);
            let insn = Decoder::with_ip(64, &padded, 0x1000, 0).decode();
            assert!(insn.is_invalid(), "{bytes:02x?} decodes in 64-bit mode");
            let info = decode_insn(&padded, 0x1000, ExecMode::Bit64);
            let got = info.map(|i| (i.size as usize, i.class, i.direct_target, i.is_syscall));
            assert_eq!(
                got,
                Some((len, InsnClass::Other, None, false)),
                "{bytes:02x?}"
            );
            assert_eq!(
                info.map(|i| i.bytes[..len].to_vec()),
                Some(padded[..len].to_vec())
            );
            // Without their last byte, they are none.
            assert_eq!(
                decode_insn(&bytes[..len - 1], 0x1000, ExecMode::Bit64),
                None
            );
        }
        // 32-bit mode: iced-x86's instructions (EA a far jump).
        let far = decode_insn(&[0xea, 1, 2, 3, 4, 5, 6], 0x1000, ExecMode::Bit32);
        assert_eq!(
            far.map(|i| (i.size, i.class)),
            Some((7, InsnClass::FarJump))
        );
        assert_eq!(decode_insn(&[0xd5, 0x0a], 0x1000, ExecMode::Bit64), None);
        // An opcode that is not one of them.
        assert_eq!(
            decode_insn(&[0x0f, 0x04, 0x90], 0x1000, ExecMode::Bit64),
            None
        );
    }

    /// An instruction is cut by its segment's end where the bytes it begins with need more
    /// than the segment has, whatever follows: a valid one, or one invalid in 64-bit mode
    /// with libipt's length; not where the segment holds it, nor where the bytes begin no
    /// instruction, nor 15 bytes or more before the end.
    #[test]
    fn instructions_cut_by_the_segments_end() {
        const P: u64 = 0x40_0000;
        let cut = |tail: &[u8], mode: ExecMode| {
            let code = [&[0x90; 20][..], tail].concat();
            let mut space = AddressSpace::new();
            space.add_bytes("code", code.clone(), P);
            let seg = SegmentCode::at(&space, P, mode).expect("the segment");
            (seg.cut_at_end(P + 20), P + code.len() as u64)
        };
        for tail in [&[0x48, 0x83][..], &[0xb8, 1, 2], &[0x0f], &[0xea, 1, 2, 3]] {
            let (got, end) = cut(tail, ExecMode::Bit64);
            assert_eq!(got, Some(end), "{tail:02x?}");
        }
        for tail in [&[0x48, 0x83, 0xc0, 1][..], &[0x0f, 0x04], &[0xd5, 0x0a]] {
            assert_eq!(cut(tail, ExecMode::Bit64).0, None, "{tail:02x?}");
        }
        // EA in 32-bit mode: a far jump, 7 bytes; in 16-bit mode 5.
        assert!(cut(&[0xea, 1, 2, 3, 4], ExecMode::Bit32).0.is_some());
        assert_eq!(cut(&[0xea, 1, 2, 3, 4], ExecMode::Bit16).0, None);
        // Far from the end: the bytes there decide, not the end.
        let (got, _) = cut(
            &[0x48, 0x83, 0xc0, 1, 0x90, 0x90, 0x90, 0x90],
            ExecMode::Bit64,
        );
        assert_eq!(got, None);
        let mut space = AddressSpace::new();
        space.add_bytes("code", [0x48, 0x83, 0xc0, 1].repeat(5), P);
        let seg = SegmentCode::at(&space, P, ExecMode::Bit64).expect("the segment");
        assert_eq!(seg.cut_at_end(P + 4), None);
        assert_eq!(seg.cut_at_end(P + 21), None);
    }

    /// A segment's instructions decoded one after the other through one decoder are
    /// those [`decode_at`] decodes one at a time: at every byte offset (instruction
    /// starts or not), up to the segment's end (instructions cut there), in each mode;
    /// nothing outside the segment; a conditional branch's target as libipt computes it.
    #[test]
    fn segment_code_decodes_as_decode_at() {
        const P: u64 = 0x40_0000;
        // mov eax, imm32; jne -2 (rel8); call rel32; jmpabs (APX); jcc rel32; ret; and a
        // mov eax, imm32 cut by the segment's end.
        let code: Vec<u8> = [
            &[0xb8, 1, 2, 3, 4][..],
            &[0x75, 0xfe],
            &[0xe8, 0x10, 0, 0, 0],
            &[0xd5, 0x00, 0xa1, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0x0f, 0x85, 0xf0, 0xff, 0xff, 0xff],
            &[0xc3],
            &[0xb8, 1, 2],
        ]
        .concat();
        let mut space = AddressSpace::new();
        space.add_bytes("code", code.clone(), P);
        for mode in [ExecMode::Bit64, ExecMode::Bit32, ExecMode::Bit16] {
            let mut seg = SegmentCode::at(&space, P, mode).expect("the segment");
            for pc in P..P + code.len() as u64 {
                assert!(seg.holds(pc));
                let want = decode_at(&space, pc, mode);
                assert_eq!(seg.decode(pc), want, "{mode:?} at {pc:#x}");
                if want.is_some_and(|i| i.class == InsnClass::CondJump) {
                    let mut one =
                        Decoder::with_ip(mode.bitness(), &code[(pc - P) as usize..], pc, 0);
                    assert_eq!(seg.last_branch_target(), branch_target(&one.decode(), mode));
                }
            }
            let end = P + code.len() as u64;
            assert!(!seg.holds(end) && !seg.holds(P - 1));
            assert_eq!(seg.decode(end), None);
            assert!(SegmentCode::at(&space, end, mode).is_none());
        }
        // (Each kind of instruction above is there, as the test means.)
        let classes: Vec<InsnClass> = [0u64, 5, 7, 12, 23, 29]
            .iter()
            .map(|&o| decode_at(&space, P + o, ExecMode::Bit64).map(|i| i.class))
            .collect::<Option<_>>()
            .expect("instructions");
        assert_eq!(
            classes,
            [
                InsnClass::Other,
                InsnClass::CondJump,
                InsnClass::Call,
                InsnClass::Jump,
                InsnClass::CondJump,
                InsnClass::Return
            ]
        );
        assert_eq!(decode_at(&space, P + 30, ExecMode::Bit64), None);
    }

    /// Instructions carried to another image are those of the image they came from only:
    /// decoded for an older image (another generation), they go at the next lookup.
    #[test]
    fn instructions_carried_are_only_those_of_the_image_they_came_from() {
        const P: u64 = 0x40_0000;
        let space = |byte: u8| {
            let mut s = AddressSpace::new();
            s.add_bytes("code", vec![byte, 0xf4], P);
            s
        };
        let (nop, ret) = (space(0x90), space(0xc3));
        let class =
            |c: &mut InsnCache, s: &AddressSpace| c.get(s, P, ExecMode::Bit64).map(|i| i.class);
        let mut c = InsnCache::default();
        assert_eq!(class(&mut c, &nop), Some(InsnClass::Other));
        // Carried from the generation it was built for: kept (the caller vouched for the
        // code; here it is not the same, which shows what was kept).
        c.carry(nop.generation(), ret.generation());
        assert_eq!(class(&mut c, &ret), Some(InsnClass::Other));
        // Carried from a generation it was not built for: it starts over.
        let mut c = InsnCache::default();
        assert_eq!(class(&mut c, &nop), Some(InsnClass::Other));
        let later = space(0x90);
        c.carry(later.generation(), ret.generation());
        assert_eq!(class(&mut c, &ret), Some(InsnClass::Return));
    }

    /// A block cache without the fast decoder's table.
    #[derive(Default)]
    struct NoFlow;
    impl ArenaTied for NoFlow {
        fn clear(&mut self) {}
    }

    #[test]
    fn block_cache_front_cache_hits_exact_keys_only() {
        let mut c = BlockCache::<NoFlow>::default();
        c.validate(1);
        let key = |ip, ninsn| BlockKey { ip, ninsn, mode: 3 };
        c.insert(key(0x1000, 4), (10, 5, 0x1020)); // 4 instructions + a syscall marker
                                                   // More syscall markers than the front cache holds:
        c.insert(key(0x2000, 2), (20, 302, 0x2010));
        // The front cache is made by the first block it holds (not for misses, nor for
        // blocks it cannot hold): a decoder that never asks keeps its 64 KiB.
        assert_eq!(c.get_fast(0x5000, 4, 3), None);
        assert_eq!(c.get_fast(0x2000, 2, 3), None);
        assert!(c.l1.is_none());
        // Twice each: the first fills the front cache, the second hits it.
        for _ in 0..2 {
            assert_eq!(c.get_fast(0x1000, 4, 3), Some((10, 5)));
            assert_eq!(c.get_fast(0x1000, 3, 3), None, "other length");
            assert_eq!(c.get_fast(0x1000, 4, 2), None, "other mode");
            assert_eq!(c.get_fast(0x1001, 4, 3), None, "other address");
            assert_eq!(c.get_fast(0x1000, 4, 3 + 256), None, "mode beyond u8");
            // Not in the front cache: the caller's ordinary path (the map) serves it.
            assert_eq!(c.get_fast(0x2000, 2, 3), None);
            assert_eq!(c.get(&key(0x2000, 2)), Some((20, 302, 0x2010)));
        }
        // A new image generation empties both levels.
        c.validate(2);
        assert_eq!(c.get_fast(0x1000, 4, 3), None);
        assert_eq!(c.get(&key(0x1000, 4)), None);
        c.insert(key(0x1000, 4), (0, 4, 0x1010));
        assert_eq!(c.get_fast(0x1000, 4, 3), Some((0, 4)));
        // Empty blocks are never cached, and in the modes libipt returns (0..=3) they do
        // not match unused slots (ip 0, no instructions, mode 255) either.
        c.insert(key(0x3000, 0), (0, 0, 0x3000));
        for (ip, mode) in [(0x3000, 3), (0, 0), (0, 3)] {
            assert_eq!(c.get_fast(ip, 0, mode), None);
        }
    }

    #[test]
    fn classes() {
        let m = ExecMode::Bit64;
        let c = |b: &[u8]| decode_insn(b, 0x1000, m).unwrap();
        assert_eq!(c(&[0x90]).class, InsnClass::Other);
        assert_eq!(c(&[0xc3]).class, InsnClass::Return);
        let call = c(&[0xe8, 0x10, 0, 0, 0]);
        assert_eq!(call.class, InsnClass::Call);
        assert_eq!(call.direct_target, Some(0x1015));
        assert_eq!(c(&[0xff, 0xd0]).class, InsnClass::Call); // call rax
        assert_eq!(c(&[0xff, 0xd0]).direct_target, None);
        assert_eq!(c(&[0xeb, 0xfe]).direct_target, Some(0x1000));
        assert_eq!(c(&[0x74, 0x02]).class, InsnClass::CondJump);
        assert_eq!(c(&[0x74, 0x02]).direct_target, None);
        let sc = c(&[0x0f, 0x05]);
        assert_eq!((sc.class, sc.is_syscall), (InsnClass::FarCall, true));
        assert_eq!(c(&[0x48, 0xcf]).class, InsnClass::FarReturn); // iretq
        assert_eq!(c(&[0x0f, 0x07]).class, InsnClass::FarReturn); // sysret
                                                                  // VMLAUNCH, VMRESUME, UIRET: far returns, as libipt classifies them.
        for b in [[0x0f, 0x01, 0xc2], [0x0f, 0x01, 0xc3]] {
            assert_eq!(c(&b).class, InsnClass::FarReturn, "{b:x?}");
        }
        assert_eq!(c(&[0xf3, 0x0f, 0x01, 0xec]).class, InsnClass::FarReturn);
        // MOV CR3 and VMPTRLD are no branches.
        assert_eq!(c(&[0x0f, 0x22, 0xd8]).class, InsnClass::Other); // mov cr3, rax
        assert_eq!(c(&[0x0f, 0xc7, 0x30]).class, InsnClass::Other); // vmptrld [rax]
        assert!(decode_insn(&[0x0f], 0, m).is_none());
        // FRED's far returns and APX's absolute jump (libipt 2.1.2 knows neither).
        for (b, name) in [
            ([0xf3, 0x0f, 0x01, 0xca], "ERETU"),
            ([0xf2, 0x0f, 0x01, 0xca], "ERETS"),
        ] {
            let i = c(&b);
            assert_eq!(
                (i.class, i.size, i.direct_target),
                (InsnClass::FarReturn, 4, None)
            );
            assert_eq!(i.beyond_libipt, Some(name));
        }
        let clac = c(&[0x0f, 0x01, 0xca]); // the same bytes without F2/F3: CLAC
        assert_eq!((clac.class, clac.beyond_libipt), (InsnClass::Other, None));
        let mut abs = vec![0xd5, 0x00, 0xa1];
        abs.extend_from_slice(&0x7f00_1234_5678u64.to_le_bytes());
        let j = c(&abs);
        assert_eq!(
            (j.class, j.size, j.direct_target),
            (InsnClass::Jump, 11, None)
        );
        assert_eq!(
            (j.beyond_libipt, &j.bytes[..11]),
            (Some("JMPABS"), &abs[..])
        );
        // REX2.W = 1 or map 1: not JMPABS (and nothing iced-x86 decodes); cut: none.
        for payload in [0x08, 0x80] {
            abs[1] = payload;
            assert!(decode_insn(&abs, 0x1000, m).is_none());
        }
        abs[1] = 0;
        assert!(decode_insn(&abs[..10], 0x1000, m).is_none());
        assert!(
            decode_insn(&abs, 0x1000, ExecMode::Bit32).is_none_or(|i| i.beyond_libipt.is_none())
        );
    }
}
