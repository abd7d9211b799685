//! How an instruction transfers control, from its bytes (iced-x86).

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};

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
    /// A call (direct or indirect): control comes back after it by a return.
    pub call: bool,
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
        call: matches!(
            insn.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall
        ),
    })
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
    }
}
