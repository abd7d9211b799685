//! How an instruction transfers control, from its bytes (iced-x86).

use iced_x86::{Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess};

/// How an instruction transfers control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Falls through to the next instruction.
    Plain,
    /// A string instruction with a REP prefix (it may execute as several iterations).
    RepString,
    /// Conditional branch (jcc, loop, jrcxz): one TNT bit.
    Cond { target: u64 },
    /// Direct jmp/call: no packet.
    Direct { target: u64 },
    /// Indirect jmp/call and near return: TIP.
    Indirect,
    /// Far transfer into the kernel (syscall, sysenter, int n, int3, into, int1, far jmp/call).
    Far,
}

/// A classified instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub len: u8,
    pub flow: Flow,
    /// A near call (direct or indirect): control comes back after it by a return. (A
    /// far call is not one: PT decoders keep no return address for it.)
    pub call: bool,
    /// A near return (`ret`, `ret imm16`): its target may be compressed against the
    /// decoder's return stack. (Far returns and `iret` are not.)
    pub ret: bool,
}

/// Classifies the instruction whose bytes start `bytes` (64-bit code at `ip`); `None` when
/// the bytes do not hold a valid instruction.
pub fn classify_bytes(ip: u64, bytes: &[u8]) -> Option<Class> {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let insn = dec.decode();
    if insn.is_invalid() {
        return None;
    }
    let flow = match insn.flow_control() {
        FlowControl::Next | FlowControl::Exception | FlowControl::XbeginXabortXend => {
            if insn.is_string_instruction()
                && (insn.has_rep_prefix() || insn.has_repe_prefix() || insn.has_repne_prefix())
            {
                Flow::RepString
            } else {
                Flow::Plain
            }
        }
        FlowControl::ConditionalBranch => Flow::Cond {
            target: insn.near_branch_target(),
        },
        FlowControl::UnconditionalBranch | FlowControl::Call => match insn.mnemonic() {
            Mnemonic::Syscall | Mnemonic::Sysenter => Flow::Far,
            _ if insn.near_branch_target() != 0 => Flow::Direct {
                target: insn.near_branch_target(),
            },
            _ => Flow::Far,
        },
        FlowControl::IndirectBranch | FlowControl::IndirectCall | FlowControl::Return => {
            Flow::Indirect
        }
        FlowControl::Interrupt => Flow::Far,
    };
    Some(Class {
        len: insn.len() as u8,
        flow,
        call: insn.is_call_near() || insn.is_call_near_indirect(),
        ret: insn.mnemonic() == Mnemonic::Ret,
    })
}

/// Whether the instruction whose bytes start `bytes` can fault synchronously in user mode
/// (a signal delivered at it: SIGSEGV or SIGBUS from a memory access, implicit ones such as
/// `push` or `ret` included; SIGFPE from a division; SIGILL from an undefined or a
/// privileged instruction). Invalid bytes can fault (SIGILL). `lea`, hinting `nop`s and
/// prefetches access no memory.
pub fn can_fault(ip: u64, bytes: &[u8], info: &mut InstructionInfoFactory) -> bool {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let insn = dec.decode();
    if insn.is_invalid() {
        return true;
    }
    match insn.mnemonic() {
        Mnemonic::Div
        | Mnemonic::Idiv
        | Mnemonic::Ud0
        | Mnemonic::Ud1
        | Mnemonic::Ud2
        | Mnemonic::Hlt
        | Mnemonic::In
        | Mnemonic::Out
        | Mnemonic::Insb
        | Mnemonic::Insw
        | Mnemonic::Insd
        | Mnemonic::Outsb
        | Mnemonic::Outsw
        | Mnemonic::Outsd
        | Mnemonic::Cli
        | Mnemonic::Sti => return true,
        Mnemonic::Prefetchnta
        | Mnemonic::Prefetcht0
        | Mnemonic::Prefetcht1
        | Mnemonic::Prefetcht2
        | Mnemonic::Prefetchw => return false,
        _ => {}
    }
    info.info(&insn)
        .used_memory()
        .iter()
        .any(|m| m.access() != OpAccess::NoMemAccess)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_common_instructions() {
        let c = |b: &[u8]| classify_bytes(0x1000, b).map(|c| (c.len, c.flow));
        assert_eq!(c(&[0x90]), Some((1, Flow::Plain)));
        assert_eq!(c(&[0x74, 0x05]), Some((2, Flow::Cond { target: 0x1007 })));
        assert_eq!(
            c(&[0xe8, 0, 0, 0, 0]),
            Some((5, Flow::Direct { target: 0x1005 }))
        );
        assert_eq!(c(&[0xeb, 0xfe]), Some((2, Flow::Direct { target: 0x1000 })));
        assert_eq!(c(&[0xc3]), Some((1, Flow::Indirect)));
        assert_eq!(c(&[0xff, 0xd0]), Some((2, Flow::Indirect)));
        assert_eq!(c(&[0x0f, 0x05]), Some((2, Flow::Far)));
        assert_eq!(c(&[0xcc]), Some((1, Flow::Far)));
        assert_eq!(c(&[0xf3, 0xa4]), Some((2, Flow::RepString)));
        assert_eq!(c(&[0xf3, 0x48, 0xab]), Some((3, Flow::RepString)));
        assert_eq!(c(&[0xa4]), Some((1, Flow::Plain)));
        assert_eq!(c(&[0x0f, 0xa2]), Some((2, Flow::Plain)));
        assert_eq!(c(&[0x0f]), None);
        let call = |b: &[u8]| classify_bytes(0x1000, b).map(|c| c.call);
        assert_eq!(call(&[0xff, 0xd0]), Some(true));
        assert_eq!(call(&[0xe8, 0, 0, 0, 0]), Some(true));
        assert_eq!(call(&[0xc3]), Some(false));
        assert_eq!(call(&[0xff, 0xe0]), Some(false));
        // call far [rax]: no return address for the decoder's return stack.
        assert_eq!(call(&[0xff, 0x18]), Some(false));
        let ret = |b: &[u8]| classify_bytes(0x1000, b).map(|c| c.ret);
        assert_eq!(ret(&[0xc3]), Some(true));
        assert_eq!(ret(&[0xc2, 0x08, 0x00]), Some(true));
        assert_eq!(ret(&[0xcb]), Some(false)); // retf
        assert_eq!(ret(&[0x48, 0xcf]), Some(false)); // iretq
        assert_eq!(ret(&[0xff, 0xe0]), Some(false));
    }

    #[test]
    fn instructions_that_can_fault() {
        let mut info = InstructionInfoFactory::new();
        let mut f = |b: &[u8]| can_fault(0x1000, b, &mut info);
        assert!(!f(&[0x90])); // nop
        assert!(!f(&[0x48, 0x01, 0xd8])); // add rax,rbx
        assert!(!f(&[0x48, 0x8d, 0x44, 0x24, 0x08])); // lea rax,[rsp+8]
        assert!(!f(&[0x0f, 0x1f, 0x44, 0x00, 0x00])); // nop dword [rax+rax]
        assert!(!f(&[0x0f, 0x18, 0x08])); // prefetcht0 [rax]
        assert!(!f(&[0x74, 0x05])); // jz
        assert!(f(&[0x8b, 0x07])); // mov eax,[rdi]
        assert!(f(&[0x89, 0x07])); // mov [rdi],eax
        assert!(f(&[0x55])); // push rbp
        assert!(f(&[0xc3])); // ret
        assert!(f(&[0xe8, 0, 0, 0, 0])); // call
        assert!(f(&[0xa4])); // movsb
        assert!(f(&[0x48, 0xf7, 0xf1])); // div rcx
        assert!(f(&[0x0f, 0x0b])); // ud2
        assert!(f(&[0xf4])); // hlt
        assert!(f(&[0x0f])); // invalid
    }
}
