//! Helpers shared by the integration tests (a directory, so cargo does not build it as a
//! test of its own).

use iced_x86::code_asm::CodeAssembler;
use iced_x86::BlockEncoderOptions;

/// Assembles `a`'s instructions at `base`: the code and each instruction's address.
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
