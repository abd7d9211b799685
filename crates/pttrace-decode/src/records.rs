//! drmemtrace-style decoded records (REFERENCE §6).
//!
//! Instructions carry pc, length and the raw encoding; branch targets are implied by the
//! next instruction record. Everything else is a marker. Gaps (decode errors, unmapped
//! code, lost trace) are explicit [`Record::Gap`] records, never silent.

use serde::Serialize;

/// libipt-style instruction class (computed from the instruction bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InsnClass {
    /// Not a control-flow instruction.
    Other,
    /// Near call (direct or indirect).
    Call,
    /// Near return.
    Return,
    /// Near unconditional jump (direct or indirect).
    Jump,
    /// Conditional jump (jcc, jrcxz, loop).
    CondJump,
    /// Far call, syscall, sysenter, int n.
    FarCall,
    /// Far return, sysret, sysexit, iret.
    FarReturn,
    /// Far jump.
    FarJump,
    /// ptwrite.
    Ptwrite,
    /// The bytes do not decode.
    Unknown,
}

impl InsnClass {
    pub fn name(self) -> &'static str {
        match self {
            InsnClass::Other => "other",
            InsnClass::Call => "call",
            InsnClass::Return => "return",
            InsnClass::Jump => "jump",
            InsnClass::CondJump => "cond_jump",
            InsnClass::FarCall => "far_call",
            InsnClass::FarReturn => "far_return",
            InsnClass::FarJump => "far_jump",
            InsnClass::Ptwrite => "ptwrite",
            InsnClass::Unknown => "unknown",
        }
    }
}

/// Execution mode of an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ExecMode {
    #[serde(rename = "16")]
    Bit16,
    #[serde(rename = "32")]
    Bit32,
    #[serde(rename = "64")]
    Bit64,
    #[serde(rename = "unknown")]
    Unknown,
}

impl ExecMode {
    /// Bitness for iced-x86 (unknown decodes as 64-bit).
    pub fn bitness(self) -> u32 {
        match self {
            ExecMode::Bit16 => 16,
            ExecMode::Bit32 => 32,
            ExecMode::Bit64 | ExecMode::Unknown => 64,
        }
    }
}

/// One executed instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Instruction {
    pub pc: u64,
    pub size: u8,
    /// The encoding; only `bytes[..size]` is meaningful, the rest is zero.
    pub bytes: [u8; 15],
    pub class: InsnClass,
    pub mode: ExecMode,
}

impl Instruction {
    /// The instruction's encoding (`size` bytes).
    pub fn encoding(&self) -> &[u8] {
        &self.bytes[..usize::from(self.size).min(15)]
    }
}

/// Why a gap record was emitted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GapKind {
    /// libipt reported a decode error (bad packet, no memory at an IP, ...).
    DecodeError,
    /// The capture lost trace data (AUX truncated/overwritten, sideband LOST records).
    LostData,
}

/// A gap: `pt_offset` is the offset in the PT stream of the input named by `source`
/// where the problem was detected; `ip` the address involved, when known.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gap {
    pub kind: GapKind,
    pub ip: Option<u64>,
    pub pt_offset: u64,
    pub source: String,
    pub error: String,
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: PT offset {:#x}: {}",
            self.source, self.pt_offset, self.error
        )?;
        if let Some(ip) = self.ip {
            write!(f, " (ip {ip:#x})")?;
        }
        Ok(())
    }
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Record {
    /// Start of a traced window (ordinal within the input).
    WindowId(u64),
    /// The trace's TSC at this point (from a PSB+ or an event), and its perf time when the
    /// time conversion is known.
    Timestamp { tsc: u64, perf_time: Option<u64> },
    /// The CPU the following records were captured on.
    Cpu(u32),
    /// Tracing (re)enabled at `ip` (TIP.PGE, or a PSB+ after a gap).
    TraceEnabled { ip: u64 },
    /// Tracing disabled; `ip` is where it was disabled when the trace says so.
    TraceDisabled { ip: Option<u64> },
    /// An asynchronous transfer (interrupt, exception, kernel entry) from `from` to `to`.
    KernelXfer { from: u64, to: Option<u64> },
    /// A system-call instruction executed at `pc` (syscall, sysenter, int 0x80).
    Syscall { pc: u64 },
    /// The hardware's internal buffer overflowed; trace resumes at `ip` when known.
    Overflow { ip: Option<u64> },
    /// Interrupts were `enabled` or disabled (the IF flag a MODE.Exec states) from `ip`
    /// on: libipt's iflags event, only with [`crate::WindowOptions::iflags_events`]
    /// (ptxed's `--event:iflags`). Where the trace states it without a change (a PSB+),
    /// no record.
    InterruptFlag { enabled: bool, ip: Option<u64> },
    /// Missing or undecodable trace (boxed: rare, and keeps `Record` small).
    Gap(Box<Gap>),
    /// An executed instruction.
    Instruction(Instruction),
}

impl Record {
    /// The instruction, when this is an instruction record.
    pub fn as_instruction(&self) -> Option<&Instruction> {
        match self {
            Record::Instruction(i) => Some(i),
            _ => None,
        }
    }

    /// A one-line JSON object for `--format jsonl`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let hex = |v: u64| format!("{v:#x}");
        match self {
            Record::WindowId(n) => json!({"type": "window", "id": n}),
            Record::Timestamp { tsc, perf_time } => {
                json!({"type": "timestamp", "tsc": tsc, "perf_time": perf_time})
            }
            Record::Cpu(c) => json!({"type": "cpu", "cpu": c}),
            Record::TraceEnabled { ip } => json!({"type": "enabled", "ip": hex(*ip)}),
            Record::TraceDisabled { ip } => json!({"type": "disabled", "ip": ip.map(hex)}),
            Record::KernelXfer { from, to } => {
                json!({"type": "kernel_xfer", "from": hex(*from), "to": to.map(hex)})
            }
            Record::Syscall { pc } => json!({"type": "syscall", "pc": hex(*pc)}),
            Record::Overflow { ip } => json!({"type": "overflow", "ip": ip.map(hex)}),
            Record::InterruptFlag { enabled, ip } => {
                json!({"type": "iflags", "enabled": enabled, "ip": ip.map(hex)})
            }
            Record::Gap(g) => json!({"type": "gap", "kind": g.kind, "ip": g.ip.map(hex),
                        "pt_offset": g.pt_offset, "source": g.source, "error": g.error}),
            Record::Instruction(i) => {
                let bytes: String = i.encoding().iter().map(|b| format!("{b:02x}")).collect();
                json!({"type": "insn", "pc": hex(i.pc), "size": i.size, "bytes": bytes,
                       "class": i.class, "mode": i.mode})
            }
        }
    }
}
