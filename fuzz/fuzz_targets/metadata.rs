//! `pt_metadata_t` (18 bytes) and the 50-byte extended metadata record of an info file:
//! parsed, turned into decoder parameters (CPU errata, time conversion) and used to decode
//! a valid trace.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::ptt_input::read_process;
use pttrace_decode::{ImageResolver, PtDecoder, TraceParams, WindowOptions};
use pttrace_format::metadata::PtMetadata;
use pttrace_format::ptt::{self, FileKind, RecordType};

fuzz_target!(|data: &[u8]| {
    let mut params = TraceParams::default();
    if let Some(md) = PtMetadata::from_bytes(data) {
        assert_eq!(md.to_bytes()[..], data[..18]);
        params = TraceParams::from_pt_metadata(&md);
        if let Some(t) = params.time {
            let _ = t.perf_time_to_tsc(t.tsc_to_perf_time(u64::MAX));
        }
    }
    // The same bytes as an info file's Metadata record.
    let mut file = ptt::encode_header(FileKind::ProcessInfo).to_vec();
    file.extend(ptt::frame_vec(RecordType::Metadata, data).unwrap());
    match read_process("fuzz.info", &file) {
        Ok(p) => params = p.params,
        Err(e) => assert!(data.len() < 50, "{e}"),
    }
    let trace = pttrace_fuzz::loop_trace();
    if let Ok(dec) = PtDecoder::new(
        trace,
        params,
        pttrace_fuzz::loop_image().clone(),
        Vec::new(),
        ImageResolver::default(),
        WindowOptions::default(),
    ) {
        let recs: Vec<_> = dec.collect();
        pttrace_fuzz::check_gaps(&recs, "", trace.len() as u64);
    }
});
