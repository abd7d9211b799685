//! The shim's `.spool` files (`pttrace_format::spool`): parsing, and completing a thread
//! file with what a spool holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_format::ptt::{self, FileKind, RecordType, Tail};
use pttrace_format::spool;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(sp)) = spool::parse("s.spool", data) else {
        return;
    };
    assert!(sp.pending.len() as u64 <= sp.cap);
    assert!(sp.in_flight.len() <= spool::IN_FLIGHT_SLOTS);
    let file = ptt::encode_header(FileKind::Thread).to_vec();
    let parsed = ptt::parse("t.ptt", &file).expect("a bare header parses");
    if let Some(r) = spool::recover(&sp, &parsed, file.len()) {
        let mut merged = file[..r.keep].to_vec();
        merged.extend_from_slice(&r.frames);
        let m = ptt::parse("m", &merged).expect("recovered frames parse");
        assert_eq!(m.tail, Tail::Clean);
        let last = m.frames.last().expect("a Recovered record");
        assert_eq!(last.ty, RecordType::Recovered as u16);
        assert_eq!(spool::Recovered::decode(last.payload), Some(r.recovered));
    }
});
