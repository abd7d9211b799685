//! Per-address instruction facts (length, class, direct target), decoded once with
//! iced-x86 and cached until the image changes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind};

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
}

/// Classifies the instruction at the start of `bytes` (decoded at `pc`).
pub fn decode_insn(bytes: &[u8], pc: u64, mode: ExecMode) -> Option<InsnInfo> {
    let mut dec = Decoder::with_ip(mode.bitness(), bytes, pc, DecoderOptions::NONE);
    let insn = dec.decode();
    if insn.is_invalid() {
        return None;
    }
    let size = insn.len().min(15);
    let mut raw = [0u8; 15];
    raw[..size].copy_from_slice(bytes.get(..size)?);
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
        FlowControl::Next | FlowControl::Exception => match insn.mnemonic() {
            Mnemonic::Ptwrite => InsnClass::Ptwrite,
            Mnemonic::Sysret | Mnemonic::Sysretq | Mnemonic::Sysexit | Mnemonic::Sysexitq => {
                InsnClass::FarReturn
            }
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
    let class = if is_syscall {
        InsnClass::FarCall
    } else if matches!(
        insn.mnemonic(),
        Mnemonic::Sysret | Mnemonic::Sysretq | Mnemonic::Sysexit | Mnemonic::Sysexitq
    ) {
        InsnClass::FarReturn
    } else {
        class
    };
    let direct_target = (direct && matches!(class, InsnClass::Jump | InsnClass::Call))
        .then(|| insn.near_branch_target());
    Some(InsnInfo {
        size: size as u8,
        bytes: raw,
        class,
        direct_target,
        is_syscall,
    })
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

/// Cache of expanded blocks: each block's records live in one arena; the map gives a
/// block's (start, len) in it and the address after the block.
#[derive(Default)]
pub struct BlockCache {
    generation: Option<u64>,
    map: HashMap<BlockKey, (u32, u32, u64), BuildHasherDefault<AddrHasher>>,
    /// Direct-mapped front cache of `map` for the hot path (hits without hashing).
    l1: Vec<L1Entry>,
    pub arena: Vec<super::records::Record>,
    /// Keep replaced arenas here instead of dropping them (compact collection).
    pub retire: bool,
    pub retired: Vec<Vec<super::records::Record>>,
}

/// A front-cache entry, 16 bytes (4 per cache line): the key exactly, the block's arena
/// start, and its record count as `ninsn + extra` (syscall markers add records).
#[derive(Debug, Clone, Copy, Default)]
struct L1Entry {
    ip: u64,
    start: u32,
    ninsn: u16,
    extra: u8,
    mode: u8,
}

const L1_SIZE: usize = 4096;

#[inline]
fn l1_slot(k: &BlockKey) -> usize {
    let h = (k.ip ^ (u64::from(k.ninsn) << 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 52) as usize & (L1_SIZE - 1)
}

/// Arena size (records) at which the cache starts over.
const ARENA_LIMIT: usize = 1 << 22;

impl BlockCache {
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

    #[cold]
    fn reset(&mut self, generation: u64) {
        self.map.clear();
        if self.retire && !self.arena.is_empty() {
            self.retired.push(std::mem::take(&mut self.arena));
        } else {
            self.arena.clear();
        }
        self.l1.clear();
        self.generation = Some(generation);
    }

    /// (start, len, next ip) of a cached block.
    pub fn get(&self, k: &BlockKey) -> Option<(u32, u32, u64)> {
        self.map.get(k).copied()
    }

    /// (start, len) of a cached block: the hot path's lookup, front cache first.
    #[inline]
    pub fn get_fast(&mut self, k: BlockKey) -> Option<(u32, u32)> {
        let slot = l1_slot(&k);
        if let Some(e) = self.l1.get(slot) {
            if e.ip == k.ip && e.ninsn == k.ninsn && e.mode == k.mode && e.ninsn != 0 {
                return Some((e.start, u32::from(e.ninsn) + u32::from(e.extra)));
            }
        }
        self.get_fast_slow(k, slot)
    }

    /// `get_fast` past the front cache: the map, then fill the front cache slot.
    #[cold]
    #[inline(never)]
    fn get_fast_slow(&mut self, k: BlockKey, slot: usize) -> Option<(u32, u32)> {
        let (start, len, _) = *self.map.get(&k)?;
        let extra = len
            .checked_sub(u32::from(k.ninsn))
            .and_then(|x| u8::try_from(x).ok());
        if let Some(extra) = extra {
            if self.l1.is_empty() {
                self.l1.resize(L1_SIZE, L1Entry::default());
            }
            if let Some(e) = self.l1.get_mut(slot) {
                *e = L1Entry {
                    ip: k.ip,
                    start,
                    ninsn: k.ninsn,
                    extra,
                    mode: k.mode,
                };
            }
        }
        Some((start, len))
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
        let mut buf = [0u8; 15];
        let n = space.read(pc, &mut buf);
        let info = decode_insn(&buf[..n], pc, mode)?;
        self.map.insert(key, info);
        Some(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(decode_insn(&[0x0f], 0, m).is_none());
    }
}
