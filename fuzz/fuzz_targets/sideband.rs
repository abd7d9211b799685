//! perf sideband records (MMAP, MMAP2, COMM, LOST, AUX, TEXT_POKE...) with one of several
//! sample_id layouts (the input's first byte picks it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::sideband::parse_records;
use pttrace_format::perf_record::{self as perf, RecordIter};

const SAMPLE_TYPES: [u64; 4] = [
    perf::SIDEBAND_SAMPLE_TYPE,
    0,
    perf::PERF_SAMPLE_TID | perf::PERF_SAMPLE_TIME,
    perf::SIDEBAND_SAMPLE_TYPE | perf::PERF_SAMPLE_ID | perf::PERF_SAMPLE_STREAM_ID,
];

fuzz_target!(|data: &[u8]| {
    let Some((k, d)) = pttrace_fuzz::split_selector(data, SAMPLE_TYPES.len()) else {
        return;
    };
    let st = SAMPLE_TYPES[k];
    let mut pos = 0;
    for item in RecordIter::new(d, st) {
        match item {
            Ok((at, r)) => {
                assert_eq!(at, pos);
                pos += usize::from(r.header.size);
                assert!(pos <= d.len());
            }
            Err(e) => assert_eq!(e.offset, pos),
        }
    }
    match parse_records("fuzz.sb", d, st) {
        Ok(ev) => assert!(ev
            .windows(2)
            .all(|w| w[0].time.unwrap_or(0) <= w[1].time.unwrap_or(0))),
        Err(e) => assert!(e.offset < d.len() as u64, "{e}"),
    }
});
