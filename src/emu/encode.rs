//! Turns a captured step sequence into genuine Intel PT packets (runs outside any handler).
//!
//! Input: the first stepped instruction, the [`Step`] records of a window (each trap gives
//! the next instruction to execute) and TSCs. Each executed instruction is read from our own
//! memory and classified with iced-x86; packets are written with the shared encoder (`pttrace-encoder`, also used by the
//! QEMU plugin):
//! - PSB+ (PSB, TSC, MODE.Exec 64-bit, FUP when enabled, PSBEND) at the start and every
//!   [`PSB_PERIOD`] bytes, like hardware's psb_period;
//! - MODE.Exec + TIP.PGE at the first instruction, TNT (short up to 6, long up to 47 bits) for
//!   conditional branches, TIP for indirect jumps/calls and returns (no return compression),
//!   nothing for direct jumps/calls;
//! - far transfers to the kernel (`syscall`, `int n`…) as user-only hardware shows them:
//!   TIP.PGD (IP suppressed) at the instruction, TSC, TIP.PGE at the return address;
//! - a signal handler entered mid-window: FUP(interrupted IP) + TIP.PGD, then TIP.PGE at the
//!   resume IP (the handler itself is not stepped: the kernel clears TF for it);
//! - anything the classification cannot explain is encoded as an explicit gap (FUP + TIP.PGD,
//!   TIP.PGE at the next observed IP) and counted, never as a guessed path;
//! - the end: FUP(next IP) + TIP.PGD.
//!
//! IP payloads are compressed against the last IP like hardware does (update-16/32, sext-48).

use std::collections::HashMap;

pub use pttrace_encoder::{Class, Flow};
use pttrace_encoder::{EncodeError, PacketWriter, SliceSink};

use super::trap::{Step, STEP_SIGNAL, STEP_TRAP};
use crate::error::{Error, Result, Status};

/// Bytes of trace between two PSB+ (hardware's default psb_period is 2^11..2^12 bytes).
pub const PSB_PERIOD: u64 = pttrace_encoder::PSB_PERIOD as u64;

/// Worst-case bytes one instruction (plus a PSB+ before it) can add, and the closing
/// packets: the encoder stops early enough that the closing FUP + TIP.PGD always fits.
const PER_INSN_MAX: usize = 96;
const CLOSE_MAX: usize = 32;

/// Reads up to `buf.len()` bytes of our own memory at `addr` without faulting.
pub fn read_self(addr: u64, buf: &mut [u8]) -> usize {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: process_vm_readv on our own pid copies into `buf` (valid for its length) and
    // reports EFAULT instead of faulting when `addr` is unmapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n > 0 {
        return n as usize;
    }
    // The range may cross into an unmapped page: read up to the page end.
    let page_end = (addr | 0xfff) + 1;
    let first = (page_end - addr) as usize;
    if first < buf.len() {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: first,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: first,
        };
        // SAFETY: as above, with a shorter length.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n > 0 {
            return n as usize;
        }
    }
    0
}

/// Classifies the instruction at `ip` in our own memory.
pub fn classify(ip: u64) -> Option<Class> {
    let mut bytes = [0u8; 15];
    let n = read_self(ip, &mut bytes);
    if n == 0 {
        return None;
    }
    pttrace_encoder::classify_bytes(ip, &bytes[..n])
}

/// What encoding a window produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    /// PT bytes written at the start of the output.
    pub size: usize,
    /// Instructions the trace says were executed.
    pub instructions: u64,
    /// Explicit gaps (transfers the classification could not explain).
    pub gaps: u32,
    /// Asynchronous events encoded for signal handlers entered in the window.
    pub signals: u32,
    /// Syscalls/interrupts encoded as PGD/PGE pairs.
    pub far_transfers: u32,
    /// The output filled up before the window was fully encoded.
    pub out_of_space: bool,
    /// The executed IP sequence the packets encode (only when requested).
    pub ips: Option<Vec<u64>>,
    /// Steps encoded: all of them, or fewer when the output filled up; the rest continues
    /// in a window of its own from [`Encoded::next_ip`] (the instruction the encoded
    /// part's closing FUP names) at [`Encoded::next_tsc`].
    pub consumed: usize,
    pub next_ip: u64,
    pub next_tsc: u64,
}

/// The window's packet writer: the shared encoder over the caller's output buffer, with
/// the emulated backend's statuses.
struct Writer<'a> {
    w: PacketWriter<SliceSink<'a>>,
}

fn full(e: EncodeError) -> Error {
    Error::new(
        Status::OverwrittenPtTrace,
        format!("emulated backend: PT output full ({e})"),
    )
}

impl<'a> Writer<'a> {
    fn new(out: &'a mut [u8]) -> Result<Self> {
        Ok(Writer {
            w: PacketWriter::new(SliceSink::new(out), pttrace_encoder::PSB_PERIOD),
        })
    }

    fn offset(&self) -> usize {
        self.w.len()
    }

    fn flush_tnt(&mut self) -> Result<()> {
        self.w.flush_tnt().map_err(full)
    }

    fn branch(&mut self, taken: bool) -> Result<()> {
        self.w.branch(taken).map_err(full)
    }

    fn tip(&mut self, ip: u64) -> Result<()> {
        self.w.tip(ip).map_err(full)
    }

    /// TSC, MODE.Exec and TIP.PGE: hardware announces the execution mode with every enable.
    fn pge(&mut self, ip: u64, tsc: u64) -> Result<()> {
        self.w.enable(ip, Some(tsc)).map_err(full)
    }

    /// Synchronous disable at a far transfer (IP suppressed: the target is the kernel).
    fn pgd_far(&mut self) -> Result<()> {
        self.w.tip_pgd(None).map_err(full)
    }

    /// Asynchronous disable before the instruction at `ip` executes.
    fn async_pgd(&mut self, ip: u64, tsc: u64) -> Result<()> {
        self.w.tsc(tsc).map_err(full)?;
        self.w.async_disable(ip).map_err(full)
    }

    /// PSB+; `fup` is the next IP when tracing is enabled.
    fn psb(&mut self, tsc: u64, fup: Option<u64>) -> Result<()> {
        self.w.psb_plus(Some(tsc), fup).map_err(full)
    }

    fn psb_due(&self) -> bool {
        self.w.psb_due()
    }

    fn room_for_insn(&self) -> bool {
        self.offset() + PER_INSN_MAX + CLOSE_MAX <= self.w.sink().capacity()
    }
}

/// Encodes one window into `out`.
///
/// `first_ip` is the first stepped instruction, `start_tsc` the TSC when tracing began.
/// With `keep_ips` the executed IP sequence is returned too.
pub fn encode_window(
    first_ip: u64,
    start_tsc: u64,
    steps: &[Step],
    out: &mut [u8],
    keep_ips: bool,
) -> Result<Encoded> {
    let mut res = Encoded {
        ips: keep_ips.then(Vec::new),
        ..Default::default()
    };
    if out.len() < 2 * (PER_INSN_MAX + CLOSE_MAX) {
        return Err(Error::invalid(format!(
            "PT output of {} bytes is too small for the emulated backend (need at least {})",
            out.len(),
            2 * (PER_INSN_MAX + CLOSE_MAX)
        )));
    }
    let mut cache: HashMap<u64, Option<Class>> = HashMap::new();
    let mut w = Writer::new(out)?;
    w.psb(start_tsc, None)?;
    w.pge(first_ip, start_tsc)?;

    // `pending`: the next instruction to execute; `enabled`: packets are being generated.
    let mut pending = first_ip;
    let mut enabled = true;
    let mut last_tsc = start_tsc;
    let mut i = 0;
    while i < steps.len() {
        let s = steps[i];
        if !w.room_for_insn() {
            res.out_of_space = true;
            break;
        }
        if s.kind == STEP_SIGNAL {
            // A handler is entered before `pending` executes (the handler is not stepped).
            if enabled {
                let far_fall = match *cache.entry(pending).or_insert_with(|| classify(pending)) {
                    Some(c) if c.flow == Flow::Far => Some(pending + u64::from(c.len)),
                    _ => None,
                };
                if s.ip == pending {
                    w.async_pgd(pending, s.tsc)?;
                } else if far_fall == Some(s.ip) {
                    // Delivered on the return from a syscall: the syscall disabled tracing
                    // already; resume (later) after it.
                    w.pgd_far()?;
                    res.far_transfers += 1;
                    if let Some(ips) = res.ips.as_mut() {
                        ips.push(pending);
                    }
                    res.instructions += 1;
                    pending = s.ip;
                } else {
                    // Interrupted somewhere we did not expect: make the discontinuity explicit.
                    w.async_pgd(pending, s.tsc)?;
                    res.gaps += 1;
                }
                enabled = false;
            }
            res.signals += 1;
            last_tsc = s.tsc;
            i += 1;
            continue;
        }
        if s.kind != STEP_TRAP {
            i += 1;
            continue;
        }
        let next = s.ip;
        if !enabled {
            // Resuming after a signal handler: normally at the interrupted IP, then one
            // instruction ran before this trap. If that does not fit, resume at `next`.
            if step_fits(&mut cache, pending, next) {
                w.pge(pending, s.tsc)?;
            } else {
                res.gaps += 1;
                w.pge(next, s.tsc)?;
                pending = next;
                enabled = true;
                last_tsc = s.tsc;
                i += 1;
                continue;
            }
            enabled = true;
        }
        if w.psb_due() {
            w.psb(last_tsc, Some(pending))?;
        }
        let class = *cache.entry(pending).or_insert_with(|| classify(pending));
        let Some(class) = class else {
            // Unreadable code: the IP is known, its effect is not. Explicit gap.
            w.async_pgd(pending, s.tsc)?;
            w.pge(next, s.tsc)?;
            res.gaps += 1;
            pending = next;
            last_tsc = s.tsc;
            i += 1;
            continue;
        };
        let fall = pending.wrapping_add(u64::from(class.len));
        let mut executed = true;
        let mut consumed = true;
        match class.flow {
            Flow::Plain => {
                if next != fall {
                    executed = false;
                }
            }
            Flow::RepString => {
                if next == pending {
                    // One more iteration of the same instruction.
                    last_tsc = s.tsc;
                    i += 1;
                    continue;
                }
                if next != fall {
                    executed = false;
                }
            }
            Flow::Cond { target } => {
                if next == fall {
                    w.branch(false)?;
                } else if next == target {
                    w.branch(true)?;
                } else {
                    executed = false;
                }
            }
            Flow::Direct { target } => {
                if next != target {
                    executed = false;
                }
            }
            Flow::Indirect => w.tip(next)?,
            Flow::Far => {
                // The kernel ran; user-only hardware shows PGD here, PGE at the return.
                w.pgd_far()?;
                res.far_transfers += 1;
                if let Some(ips) = res.ips.as_mut() {
                    ips.push(pending);
                }
                res.instructions += 1;
                w.pge(fall, s.tsc)?;
                last_tsc = s.tsc;
                if next == fall {
                    pending = next;
                    i += 1;
                } else {
                    // The trap after the return came one instruction later: replay this
                    // record from the return address.
                    pending = fall;
                }
                continue;
            }
        }
        if executed {
            if let Some(ips) = res.ips.as_mut() {
                ips.push(pending);
            }
            res.instructions += 1;
        } else {
            // The observed successor cannot follow this instruction: explicit gap, and the
            // instruction is not claimed as executed.
            w.async_pgd(pending, s.tsc)?;
            w.pge(next, s.tsc)?;
            res.gaps += 1;
            consumed = true;
        }
        if consumed {
            pending = next;
            last_tsc = s.tsc;
            i += 1;
        }
    }
    if enabled {
        w.async_pgd(pending, last_tsc)?;
    } else {
        w.flush_tnt()?;
    }
    res.size = w.offset();
    res.consumed = i;
    res.next_ip = pending;
    res.next_tsc = last_tsc;
    Ok(res)
}

/// Whether executing the instruction at `ip` can lead to `next` (used when resuming).
fn step_fits(cache: &mut HashMap<u64, Option<Class>>, ip: u64, next: u64) -> bool {
    let Some(class) = *cache.entry(ip).or_insert_with(|| classify(ip)) else {
        return false;
    };
    let fall = ip.wrapping_add(u64::from(class.len));
    match class.flow {
        Flow::Plain => next == fall,
        Flow::RepString => next == fall || next == ip,
        Flow::Cond { target } => next == fall || next == target,
        Flow::Direct { target } => next == target,
        Flow::Indirect | Flow::Far => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libipt::enc_dec_builder::EncoderDecoderBuilder;
    use libipt::packet::Compression;
    use libipt::packet::{Packet, PacketDecoder};

    /// Machine code that is only read (classified), never executed.
    #[repr(C, align(64))]
    struct Code([u8; 11]);
    static CODE: Code = Code([
        0x48, 0xff, 0xc9, // 0: dec rcx
        0x75, 0xfb, //       3: jnz 0
        0xff, 0xd0, //       5: call rax
        0x0f, 0x05, //       7: syscall
        0x90, //             9: nop
        0xc3, //            10: ret
    ]);

    fn trap(ip: u64, tsc: u64) -> Step {
        Step {
            ip,
            tsc,
            kind: STEP_TRAP,
            arg: 0,
        }
    }

    /// Packets as (name, reconstructed IP or TNT bits) with last-IP decompression.
    fn packets(pt: &[u8]) -> Vec<(String, u64)> {
        let mut buf = pt.to_vec();
        // SAFETY: buf outlives the decoder.
        let mut dec: PacketDecoder<()> = unsafe {
            EncoderDecoderBuilder::<PacketDecoder<()>>::new()
                .buffer_from_raw(buf.as_mut_ptr(), buf.len())
        }
        .build()
        .unwrap();
        dec.sync_forward().unwrap();
        let mut last = 0u64;
        let mut ip = |raw: u64, c: Compression| -> u64 {
            let v = match c {
                Compression::Suppressed => return 0,
                Compression::Update16 => (last & !0xffff) | (raw & 0xffff),
                Compression::Update32 => (last & !0xffff_ffff) | (raw & 0xffff_ffff),
                Compression::Sext48 => ((raw << 16) as i64 >> 16) as u64,
                Compression::Update48 => (last & !0xffff_ffff_ffff) | (raw & 0xffff_ffff_ffff),
                Compression::Full => raw,
            };
            last = v;
            v
        };
        let mut out = Vec::new();
        while let Ok(p) = dec.decode_next() {
            out.push(match p {
                Packet::Psb(_) => {
                    ip(0, Compression::Full);
                    ("PSB".into(), 0)
                }
                Packet::Psbend(_) => ("PSBEND".into(), 0),
                Packet::Tsc(t) => ("TSC".into(), t.tsc()),
                Packet::Mode(_) => ("MODE".into(), 0),
                Packet::TipPge(t) => ("TIP.PGE".into(), ip(t.tippge(), t.compression())),
                Packet::TipPgd(t) => ("TIP.PGD".into(), ip(t.tippgd(), t.compression())),
                Packet::Tip(t) => ("TIP".into(), ip(t.tip(), t.compression())),
                Packet::Fup(t) => ("FUP".into(), ip(t.fup(), t.compression())),
                Packet::Tnt8(t) => (format!("TNT{}", t.bitsize()), u64::from(t.payload())),
                other => (format!("{other:?}"), 0),
            });
        }
        out
    }

    #[test]
    fn window_becomes_the_packets_hardware_would_write() {
        let b = CODE.0.as_ptr() as u64;
        // Executed: dec, jnz(taken), dec, jnz(not taken), call rax -> ret, ret -> syscall,
        // syscall (trap arrives after the next instruction), nop; stopped before ret.
        let steps = [
            trap(b + 3, 101),
            trap(b, 102),
            trap(b + 3, 103),
            trap(b + 5, 104),
            trap(b + 10, 105),
            trap(b + 7, 106),
            trap(b + 10, 107),
        ];
        let mut out = vec![0u8; 4096];
        let enc = encode_window(b, 100, &steps, &mut out, true).unwrap();
        assert_eq!(
            enc.ips.as_deref(),
            Some(&[b, b + 3, b, b + 3, b + 5, b + 10, b + 7, b + 9][..])
        );
        assert_eq!((enc.instructions, enc.gaps, enc.far_transfers), (8, 0, 1));
        assert_eq!(&out[..16], &[0x02, 0x82].repeat(8)[..]);
        let got = packets(&out[..enc.size]);
        let s = |n: &str, v: u64| (n.to_string(), v);
        assert_eq!(
            got,
            vec![
                s("PSB", 0),
                s("TSC", 100),
                s("MODE", 0),
                s("PSBEND", 0),
                s("TSC", 100),
                s("MODE", 0),
                s("TIP.PGE", b),
                s("TNT2", 0b10),  // taken, then not taken (oldest branch first)
                s("TIP", b + 10), // call rax
                s("TIP", b + 7),  // ret (no return compression)
                s("TIP.PGD", 0),  // syscall: IP suppressed
                s("TSC", 107),
                s("MODE", 0),
                s("TIP.PGE", b + 9), // back from the kernel at the return address
                s("TSC", 107),
                s("FUP", b + 10), // stopped before the ret
                s("TIP.PGD", 0),
            ]
        );
        // PSB+ and the closing PGD are one byte each where hardware uses one byte.
        assert_eq!(out[enc.size - 1], 0x01);
    }

    #[test]
    fn signal_and_rep_string_and_gap() {
        #[repr(C, align(64))]
        struct Rep([u8; 4]);
        static REP: Rep = Rep([0xf3, 0xa4, 0x90, 0x90]); // rep movsb; nop; nop
        let b = REP.0.as_ptr() as u64;
        let signal = Step {
            ip: b + 2,
            tsc: 5,
            kind: STEP_SIGNAL,
            arg: 10,
        };
        // rep movsb traps per iteration (3 iterations), a handler runs before the first nop,
        // then the nop; then an impossible successor (a gap) for the second nop.
        let steps = [
            trap(b, 1),
            trap(b, 2),
            trap(b + 2, 3),
            signal,
            trap(b + 3, 6),
            trap(b + 0x1000, 7),
        ];
        let mut out = vec![0u8; 4096];
        let enc = encode_window(b, 0, &steps, &mut out, true).unwrap();
        // The rep instruction counts once; the second nop is not claimed as executed.
        assert_eq!(enc.ips.as_deref(), Some(&[b, b + 2][..]));
        assert_eq!((enc.signals, enc.gaps), (1, 1));
        let got: Vec<String> = packets(&out[..enc.size])
            .into_iter()
            .map(|(n, v)| {
                if v == 0 {
                    n
                } else {
                    format!("{n}@{}", v.wrapping_sub(b))
                }
            })
            .filter(|n| !n.starts_with("TSC") && n != "MODE")
            .collect();
        assert_eq!(
            got,
            [
                "PSB",
                "PSBEND",
                "TIP.PGE@0",
                "FUP@2",
                "TIP.PGD",
                "TIP.PGE@2", // the handler: async disable, resume
                "FUP@3",
                "TIP.PGD",
                "TIP.PGE@4096", // the gap: explicit
                "FUP@4096",
                "TIP.PGD",
            ]
        );
    }
}
