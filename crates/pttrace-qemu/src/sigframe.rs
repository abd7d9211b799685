//! Where a signal interrupted its thread, read from the signal frame at the handler's first
//! block. QEMU's plugin API v1 (7.2) shows no registers, so which instruction a signal
//! interrupted (a fault inside a block, or the end of a block whose branch way is not known
//! yet) is otherwise known only when the flow returns there. The frame holds it: at the
//! handler's entry the guest's stack pointer points at the frame QEMU built as the kernel
//! does (`pretcode`, then the `ucontext` with the interrupted `rip`, then the `siginfo`).
//!
//! The stack pointer comes from QEMU's CPU state: translated code keeps the CPU state
//! pointer in `rbp` (TCG's `TCG_AREG0` on x86-64 hosts) and calls block callbacks directly,
//! and the state begins with the 16 general registers. The trampoline below hands `rbp` to
//! [`handler_entry`] before any Rust code runs. Nothing here is trusted blindly: every read
//! goes through `process_vm_readv` (a wrong pointer reads nothing), the frame counts only
//! when its return address is a restorer the program installed, and the flow encoder
//! takes its `rip` only where it is a successor of the interrupted block or an instruction
//! inside it; otherwise it infers the interrupted instruction as before. QEMU writes the
//! `siginfo` into the frame only for SA_SIGINFO handlers: there it also tells a fault
//! (`si_code` 1..127 of a fault signal) from an asynchronous signal.

use std::ffi::{c_uint, c_void};

use crate::exec::read_memory;
use crate::{global, guarded, BlockInfo};

// The callback QEMU calls for a handler's first block: (vcpu, udata) as any block callback,
// plus the CPU state pointer from rbp as the third argument.
std::arch::global_asm!(
    ".globl pttrace_qemu_handler_entry",
    ".type pttrace_qemu_handler_entry,@function",
    "pttrace_qemu_handler_entry:",
    "mov rdx, rbp",
    "jmp {entry}",
    entry = sym handler_entry,
);

// SAFETY: the symbol is the trampoline above, which takes a block callback's arguments.
unsafe extern "C" {
    pub safe fn pttrace_qemu_handler_entry(vcpu: c_uint, udata: *mut c_void);
}

/// Offsets in the x86-64 signal frame (the kernel's `struct rt_sigframe`).
const FRAME_RIP: usize = 8 + 40 + 16 * 8;
const FRAME_SIGINFO: usize = 8 + 304;
const FRAME_LEN: usize = FRAME_SIGINFO + 16;
/// Index of rsp among the CPU state's general registers.
const REG_RSP: u64 = 4;
/// Index of rdi: a handler's first argument, the signal number.
const REG_RDI: u64 = 7;

/// What a signal frame says: the interrupted instruction, and whether the signal is a
/// synchronous fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGTRAP raised by an
/// instruction: `si_code` between 1 and 127), when the frame holds a `siginfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted {
    pub rip: u64,
    pub fault: Option<bool>,
}

/// Parses a frame read at the handler's entry for the handler at `handler`.
pub fn parse_frame(
    frame: &[u8; FRAME_LEN],
    handler: u64,
    is_restorer: impl Fn(u64) -> bool,
    handler_of: impl Fn(usize) -> (u64, bool),
) -> Option<Interrupted> {
    let word = |at: usize| u64::from_le_bytes(frame[at..at + 8].try_into().unwrap_or([0; 8]));
    let int = |at: usize| i32::from_le_bytes(frame[at..at + 4].try_into().unwrap_or([0; 4]));
    if !is_restorer(word(0)) {
        return None;
    }
    let rip = word(FRAME_RIP);
    let with_siginfo = (1..65).any(|sig| handler_of(sig) == (handler, true));
    if !with_siginfo {
        return Some(Interrupted { rip, fault: None });
    }
    let signo = int(FRAME_SIGINFO);
    if !(1..65).contains(&signo) || handler_of(signo as usize) != (handler, true) {
        return None;
    }
    let code = int(FRAME_SIGINFO + 8);
    let fault = matches!(
        signo,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP
    ) && (1..0x80).contains(&code);
    Some(Interrupted {
        rip,
        fault: Some(fault),
    })
}

extern "C" fn handler_entry(vcpu: c_uint, udata: *mut c_void, env: u64) {
    guarded(|| {
        // SAFETY: udata is the leaked `BlockInfo` registered with this callback.
        let b = unsafe { &*(udata as *const BlockInfo) };
        let Some(g) = global() else { return };
        let mut rsp = [0u8; 8];
        if env == 0 || read_memory(env + REG_RSP * 8, &mut rsp) != 8 {
            return;
        }
        let mut frame = [0u8; FRAME_LEN];
        if read_memory(u64::from_le_bytes(rsp), &mut frame) != FRAME_LEN {
            return;
        }
        let found = parse_frame(
            &frame,
            b.block.start,
            |a| g.is_restorer(a),
            |sig| g.handler_of(sig),
        );
        // Without a siginfo in the frame, the signal number (the handler's first
        // argument) still tells the signals faults raise from the others.
        let mut rdi = [0u8; 8];
        let fault_signal = read_memory(env + REG_RDI * 8, &mut rdi) == 8
            && matches!(
                i32::try_from(u64::from_le_bytes(rdi)).unwrap_or(0),
                libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP
            );
        if let (Some(i), Some(mut f)) = (found, g.feeder(vcpu)) {
            f.interrupted(i.rip, i.fault, fault_signal);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(pretcode: u64, rip: u64, signo: i32, code: i32) -> [u8; FRAME_LEN] {
        let mut f = [0u8; FRAME_LEN];
        f[..8].copy_from_slice(&pretcode.to_le_bytes());
        f[FRAME_RIP..FRAME_RIP + 8].copy_from_slice(&rip.to_le_bytes());
        f[FRAME_SIGINFO..FRAME_SIGINFO + 4].copy_from_slice(&signo.to_le_bytes());
        f[FRAME_SIGINFO + 8..FRAME_SIGINFO + 12].copy_from_slice(&code.to_le_bytes());
        f
    }

    #[test]
    fn frames_are_believed_only_when_restorer_and_signal_match() {
        let restorer = |a| a == 0x7000;
        // 0x5000 handles SIGSEGV and SIGALRM with SA_SIGINFO, 0x6000 SIGUSR1 without.
        let handler_of = |sig| match sig {
            11 | 14 => (0x5000, true),
            10 => (0x6000, false),
            _ => (0, false),
        };
        let p = |f: &[u8; FRAME_LEN]| parse_frame(f, 0x5000, restorer, handler_of);
        // SIGSEGV, SEGV_MAPERR: a fault.
        assert_eq!(
            p(&frame(0x7000, 0x1234, 11, 1)),
            Some(Interrupted {
                rip: 0x1234,
                fault: Some(true)
            })
        );
        // SIGSEGV sent by kill (SI_USER) or tgkill (SI_TKILL): asynchronous.
        assert_eq!(
            p(&frame(0x7000, 0x1234, 11, 0)),
            Some(Interrupted {
                rip: 0x1234,
                fault: Some(false)
            })
        );
        assert_eq!(
            p(&frame(0x7000, 0x1234, 11, -6)).map(|i| i.fault),
            Some(Some(false))
        );
        // SIGALRM from a timer (SI_KERNEL is 0x80): asynchronous.
        assert_eq!(
            p(&frame(0x7000, 0x99, 14, 0x80)).map(|i| i.fault),
            Some(Some(false))
        );
        // Not a frame: another return address, a signal of another handler, garbage.
        assert_eq!(p(&frame(0x7008, 0x1234, 11, 1)), None);
        assert_eq!(p(&frame(0x7000, 0x1234, 10, 1)), None);
        assert_eq!(p(&frame(0x7000, 0x1234, 1000, 1)), None);
        // Without SA_SIGINFO there is no siginfo to read: the rip alone.
        let q = parse_frame(&frame(0x7000, 0x42, 0, 0), 0x6000, restorer, handler_of);
        assert_eq!(
            q,
            Some(Interrupted {
                rip: 0x42,
                fault: None
            })
        );
    }
}
