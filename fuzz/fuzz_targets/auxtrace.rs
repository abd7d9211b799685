//! PT wrapped in perf AUXTRACE records (a bare record stream or a perf.data file).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_format::auxtrace;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = auxtrace::unwrap(data) {
        let mut pt = Vec::new();
        for c in &a.chunks {
            assert!(c.file_offset + c.len <= data.len());
            pt.extend_from_slice(&data[c.file_offset..c.file_offset + c.len]);
        }
        assert_eq!(a.pt, pt);
        assert_eq!(a.file_offset(pt.len() as u64), None);
        let _ = a.cpu();
    }
});
