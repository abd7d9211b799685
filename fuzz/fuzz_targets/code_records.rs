//! Code records (perf TEXT_POKE): parsed from a sideband stream and applied to an image,
//! and a record body alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::AddressSpace;
use pttrace_format::code;
use pttrace_format::perf_record::{Record, RecordIter, SIDEBAND_SAMPLE_TYPE};

fuzz_target!(|data: &[u8]| {
    if let Some((addr, bytes)) = code::parse_code_body(data) {
        assert_eq!(addr.to_le_bytes(), data[..8]);
        assert!(12 + bytes.len() <= data.len());
    }
    let mut pieces = Vec::new();
    for (_, r) in RecordIter::new(data, SIDEBAND_SAMPLE_TYPE).flatten() {
        if let Record::TextPoke { addr, bytes } = r.record {
            pieces.push((addr, bytes));
        }
    }
    let mut space = AddressSpace::new();
    space.add_bytes("text", vec![0x90; 0x1000], 0x40_0000);
    let refs: Vec<(u64, &[u8])> = pieces.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    space.add_code(&refs);
    assert!(space
        .segments()
        .windows(2)
        .all(|w| w[0].end() <= w[1].start));
    // The last piece (in address order) covering a byte wins.
    let mut sorted: Vec<&(u64, Vec<u8>)> = pieces.iter().collect();
    sorted.sort_by_key(|p| p.0);
    if let Some((addr, bytes)) = sorted.last() {
        if let (Some(&b), Some(_)) = (bytes.first(), addr.checked_add(bytes.len() as u64)) {
            let mut got = [0u8; 1];
            assert_eq!(space.read(*addr, &mut got), 1);
            assert_eq!(got[0], b);
        }
    }
});
