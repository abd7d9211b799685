//! Helpers shared by the integration tests (a directory, so cargo does not build it as a
//! test of its own).

use drpttracer::decode::{
    AddressSpace, ImageResolver, PtDecoder, Record, TraceDecoder, TraceParams, WindowOptions,
};
use iced_x86::code_asm::CodeAssembler;
use iced_x86::BlockEncoderOptions;

// (Each test crate uses some of these helpers: the others are dead code there.)

/// Assembles `a`'s instructions at `base`: the code and each instruction's address.
#[allow(dead_code)]
pub fn assemble_at(a: &mut CodeAssembler, base: u64) -> (Vec<u8>, Vec<u64>) {
    let r = a
        .assemble_options(base, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .unwrap();
    let ips = r
        .inner
        .new_instruction_offsets
        .iter()
        .map(|&o| base + u64::from(o))
        .collect();
    (r.inner.code_buffer, ips)
}

/// Assembles `f`'s 64-bit instructions at `base`: the code and each instruction's address.
#[allow(dead_code)]
pub fn asm(
    base: u64,
    f: impl FnOnce(&mut CodeAssembler) -> Result<(), iced_x86::IcedError>,
) -> (Vec<u8>, Vec<u64>) {
    let mut a = CodeAssembler::new(64).unwrap();
    f(&mut a).unwrap();
    assemble_at(&mut a, base)
}

/// The addresses of the instruction records, in order.
#[allow(dead_code)]
pub fn pcs(recs: &[Record]) -> Vec<u64> {
    recs.iter()
        .filter_map(|r| r.as_instruction())
        .map(|i| i.pc)
        .collect()
}

/// The records of `trace` decoded as one window with `params` and `opts`, and which
/// decoder gave them ([`TraceDecoder::decoded_by`]).
#[allow(dead_code)]
pub fn decode_window(
    trace: &[u8],
    space: &AddressSpace,
    params: TraceParams,
    opts: WindowOptions,
) -> (Vec<Record>, (&'static str, Option<&'static str>)) {
    let mut d = PtDecoder::new(
        trace,
        params,
        space.clone(),
        vec![],
        ImageResolver::default(),
        opts,
    )
    .unwrap();
    let recs: Vec<Record> = d.by_ref().collect();
    (recs, d.decoded_by())
}
