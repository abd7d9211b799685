//! `/proc/<pid>/maps` text (an info file's `Maps` record): parsed and turned into the MMAP2
//! records of the initial image, which must read back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::sideband::parse_records;
use pttrace_format::maps::{encode_exec_mappings, MapsEntry};
use pttrace_format::perf_record::SIDEBAND_SAMPLE_TYPE;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let entries: Vec<MapsEntry> = text.lines().filter_map(MapsEntry::parse).collect();
    for e in &entries {
        let _ = (e.prot(), e.perf_name());
    }
    let sb = encode_exec_mappings(&entries, 1, 1, SIDEBAND_SAMPLE_TYPE, 0);
    let events = parse_records("maps", &sb, SIDEBAND_SAMPLE_TYPE).expect("own records read back");
    assert_eq!(events.len(), entries.iter().filter(|e| e.exec).count());
});
