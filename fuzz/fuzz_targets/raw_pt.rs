//! Raw PT: the record decoder over a fixed image, and the packet listing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::packets::{list_packets, PacketLine};
use pttrace_decode::{ImageResolver, PtDecoder, Record, TraceParams, WindowOptions};
use pttrace_format::metadata::TimeConv;

fuzz_target!(|data: &[u8]| {
    let params = TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    let opts = WindowOptions {
        source: "fuzz.pt".into(),
        window_id: Some(0),
        ..Default::default()
    };
    if let Ok(dec) = PtDecoder::new(
        data,
        params,
        pttrace_fuzz::loop_image().clone(),
        Vec::new(),
        ImageResolver::default(),
        opts,
    ) {
        let recs: Vec<Record> = dec.collect();
        pttrace_fuzz::check_gaps(&recs, "fuzz.pt", data.len() as u64);
    }
    for l in list_packets(data) {
        match l {
            PacketLine::Packet { offset, size, .. } => {
                assert!(offset + u64::from(size) <= data.len() as u64)
            }
            PacketLine::Error { offset, .. } => assert!(offset <= data.len() as u64),
        }
    }
});
