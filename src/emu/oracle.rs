//! Decodes PT with libipt's instruction-flow decoder over this process's own memory.
//!
//! This is the emulator's oracle: the IP sequence libipt reconstructs from the packets and
//! the code bytes must equal the sequence the emulator observed. It reads code directly
//! from the running process (no files), so it only works for traces of this process whose
//! code is still mapped; the general decoder (`crate::decode`) works from files and sideband.

use libipt::enc_dec_builder::{Cpu, EncoderDecoderBuilder};
use libipt::error::PtErrorCode;
use libipt::event::EventType;
use libipt::image::Image;
use libipt::insn::InsnDecoder;

use super::encode::read_self;
use crate::error::{Error, Result, Status};

/// An event the decoder reported, in trace order relative to the instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OracleEvent {
    /// Tracing enabled at `ip` (after `index` instructions); `resumed` when it continues
    /// where an asynchronous disable left off.
    Enabled {
        index: usize,
        ip: u64,
        resumed: bool,
    },
    /// Tracing disabled by a far transfer (syscall) after `index` instructions.
    Disabled { index: usize },
    /// Tracing disabled asynchronously before the instruction at `at`.
    AsyncDisabled { index: usize, at: u64 },
    /// Any other event (Debug text).
    Other { index: usize, what: String },
}

/// The result of decoding a buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OracleDecode {
    pub ips: Vec<u64>,
    pub events: Vec<OracleEvent>,
    /// Decode errors (offset + libipt error), each followed by a resync.
    pub errors: Vec<String>,
    /// Number of PSBs the decoder synchronized on (1 for a clean decode).
    pub syncs: usize,
}

/// Decodes `pt` against the memory of this process.
pub fn decode_own_memory(pt: &[u8]) -> Result<OracleDecode> {
    let mut out = OracleDecode::default();
    if pt.is_empty() {
        return Ok(out);
    }
    let mut buf = pt.to_vec();
    let mut image = Image::new(Some("self")).map_err(|e| dec_err("image allocation", e))?;
    image.set_callback(Some(|dst: &mut [u8], ip: u64, _asid| {
        let n = read_self(ip, dst);
        if n == 0 {
            -(PtErrorCode::Nomap as i32)
        } else {
            n as i32
        }
    }));
    // SAFETY: `buf` outlives the decoder (both are locals; the decoder is dropped first).
    let builder = unsafe {
        EncoderDecoderBuilder::<InsnDecoder>::new().buffer_from_raw(buf.as_mut_ptr(), buf.len())
    };
    // This CPU, so libipt applies the errata workarounds a real decode of it would.
    let (family, model, stepping) = crate::metadata::cpu_identity();
    let mut dec: InsnDecoder = builder
        .cpu(Cpu::intel(family, model, stepping))
        .build()
        .map_err(|e| dec_err("decoder allocation", e))?;
    dec.set_image(Some(&mut image))
        .map_err(|e| dec_err("set_image", e))?;

    'sync: loop {
        let mut status = match dec.sync_forward() {
            Ok(s) => s,
            Err(e) if e.code() == PtErrorCode::Eos => break,
            Err(e) => {
                out.errors.push(format!("sync: {e:?}"));
                break;
            }
        };
        out.syncs += 1;
        loop {
            while status.event_pending() {
                match dec.event() {
                    Ok((ev, st)) => {
                        let index = out.ips.len();
                        out.events.push(match ev.event_type() {
                            EventType::Enabled(e) => OracleEvent::Enabled {
                                index,
                                ip: e.ip(),
                                resumed: e.resumed(),
                            },
                            EventType::Disabled(_) => OracleEvent::Disabled { index },
                            EventType::AsnycDisabled(e) => {
                                OracleEvent::AsyncDisabled { index, at: e.at() }
                            }
                            other => OracleEvent::Other {
                                index,
                                what: format!("{other:?}"),
                            },
                        });
                        status = st;
                    }
                    Err(e) => {
                        let off = dec.offset().unwrap_or(0);
                        out.errors.push(format!("event at offset {off}: {e:?}"));
                        continue 'sync;
                    }
                }
            }
            if status.eos() {
                break 'sync;
            }
            match dec.decode_next() {
                Ok((insn, st)) => {
                    out.ips.push(insn.ip());
                    status = st;
                }
                Err(e) if e.code() == PtErrorCode::Eos => break 'sync,
                Err(e) => {
                    let off = dec.offset().unwrap_or(0);
                    out.errors.push(format!(
                        "instruction {} at offset {off}: {e:?}",
                        out.ips.len()
                    ));
                    continue 'sync;
                }
            }
        }
    }
    drop(dec);
    Ok(out)
}

fn dec_err(what: &str, e: libipt::error::PtError) -> Error {
    Error::new(
        Status::FailedToReadPtData,
        format!("libipt {what} failed: {e:?}"),
    )
}
