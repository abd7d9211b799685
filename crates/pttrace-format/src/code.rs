//! Code records: the bytes of executed instructions, carried in a window's sideband.
//!
//! Software backends see every instruction they execute, so their traces carry the code
//! itself. Each record is a perf `PERF_RECORD_TEXT_POKE` (type 20, the record perf uses for
//! code modified at run time), so perf-style sideband readers understand it:
//!
//! ```text
//! u32 type (= 20) | u16 misc (= PERF_RECORD_MISC_USER, 2) | u16 size
//! u64 addr | u16 old_len (= 0) | u16 new_len | new_len code bytes | zero padding to 8 bytes
//! sample_id: u32 pid, u32 tid | u64 time | u32 cpu, u32 reserved | u64 identifier
//! ```
//! (`sample_type` = TID | TIME | CPU | IDENTIFIER, as every sideband stream of pttrace.)
//! A window's code records are applied to the image before the window's PT is decoded and
//! stay for the following windows of the thread; a later record for the same addresses
//! replaces the bytes (self-modifying or JIT-generated code).

/// `PERF_RECORD_TEXT_POKE`.
pub const PERF_RECORD_TEXT_POKE: u32 = 20;
/// `PERF_RECORD_MISC_USER`.
pub const MISC_USER: u16 = 2;
/// Bytes of the sample_id trailer (TID, TIME, CPU, IDENTIFIER).
pub const SAMPLE_ID_SIZE: usize = 32;
/// Most code bytes one record carries (its size is a u16).
pub const MAX_CODE: usize = 65535 - 8 - 12 - 8 - SAMPLE_ID_SIZE;

/// Who wrote a record and when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleId {
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: u32,
    pub id: u64,
}

/// Appends one code record for `code` at `addr`; `None` (nothing appended) when the code is
/// longer than [`MAX_CODE`].
pub fn push_code_record(out: &mut Vec<u8>, addr: u64, code: &[u8], s: &SampleId) -> Option<()> {
    if code.len() > MAX_CODE {
        return None;
    }
    let body = 8 + 4 + code.len();
    let pad = (8 - body % 8) % 8;
    let size = 8 + body + pad + SAMPLE_ID_SIZE;
    out.reserve(size);
    out.extend_from_slice(&PERF_RECORD_TEXT_POKE.to_le_bytes());
    out.extend_from_slice(&MISC_USER.to_le_bytes());
    out.extend_from_slice(&(size as u16).to_le_bytes());
    out.extend_from_slice(&addr.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(code.len() as u16).to_le_bytes());
    out.extend_from_slice(code);
    out.extend(std::iter::repeat_n(0u8, pad));
    out.extend_from_slice(&s.pid.to_le_bytes());
    out.extend_from_slice(&s.tid.to_le_bytes());
    out.extend_from_slice(&s.time.to_le_bytes());
    out.extend_from_slice(&s.cpu.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&s.id.to_le_bytes());
    Some(())
}

/// The body of a TEXT_POKE record (after the 8-byte header, before the sample_id):
/// the address and the new bytes; `None` when the lengths do not fit the body.
pub fn parse_code_body(body: &[u8]) -> Option<(u64, &[u8])> {
    let addr = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    let old = usize::from(u16::from_le_bytes(body.get(8..10)?.try_into().ok()?));
    let new = usize::from(u16::from_le_bytes(body.get(10..12)?.try_into().ok()?));
    let bytes = body.get(12 + old..12 + old + new)?;
    Some((addr, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_layout_is_perf_text_poke() {
        let mut out = Vec::new();
        let s = SampleId {
            pid: 7,
            tid: 8,
            time: 9,
            cpu: 1,
            id: 2,
        };
        push_code_record(&mut out, 0x401000, &[0x90, 0xc3, 0xcc], &s).unwrap();
        // 8 header + 8 addr + 4 lens + 3 code + 1 pad + 32 sample_id
        assert_eq!(out.len(), 56);
        assert_eq!(&out[..8], &[20, 0, 0, 0, 2, 0, 56, 0]);
        assert_eq!(&out[8..16], &0x401000u64.to_le_bytes());
        assert_eq!(&out[16..23], &[0, 0, 3, 0, 0x90, 0xc3, 0xcc]);
        assert_eq!(out[23], 0);
        assert_eq!(&out[24..32], &[7, 0, 0, 0, 8, 0, 0, 0]);
        assert_eq!(&out[32..40], &9u64.to_le_bytes());
        assert_eq!(&out[40..48], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[48..56], &2u64.to_le_bytes());
        assert_eq!(
            parse_code_body(&out[8..24]),
            Some((0x401000, &[0x90u8, 0xc3, 0xcc][..]))
        );
        assert_eq!(parse_code_body(&out[8..18]), None);
        assert!(push_code_record(&mut out, 0, &vec![0; MAX_CODE + 1], &s).is_none());
        assert_eq!(out.len(), 56);
    }
}
