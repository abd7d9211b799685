//! DynamoRIO's `<tid>.raw.pt` (PT Data Buffers).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_format::pdb;

fuzz_target!(|data: &[u8]| match pdb::parse(data) {
    Ok(f) => {
        let mut pos = 42;
        for w in &f.windows {
            assert_eq!(w.pt.start, pos + 48 + 8 * w.args.len());
            assert!(w.pt.start <= w.pt.end && w.pt.end <= data.len());
            pos = w.pt.end;
        }
        assert_eq!(pos, data.len());
    }
    Err(e) => assert!(e.offset <= data.len() as u64, "{e}"),
});
