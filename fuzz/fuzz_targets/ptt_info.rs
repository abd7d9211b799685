//! A `.info` process info file: frames, the decoder's reading (metadata, maps, vDSO) and
//! the report's summary.
//! The input is a file, or a frame list made into one (see `pttrace_fuzz::ptt_input`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::ptt_input::read_process;
use pttrace_format::ptt::{self, FileKind};
use pttrace_format::summary;

fuzz_target!(|input: &[u8]| {
    let data: &[u8] = &pttrace_fuzz::ptt_input(FileKind::ProcessInfo, input);
    let name = "fuzz.info";
    let Ok(p) = ptt::parse(name, data) else {
        return;
    };
    for f in &p.frames {
        let _ = ptt::decode_process(f.payload);
        let _ = ptt::decode_vdso(f.payload);
        let _ = ptt::decode_clock(f.payload);
        let _ = ptt::decode_process_end(f.payload);
        let _ = ptt::decode_patched_sites(f.payload);
    }
    if let Err(e) = read_process(name, data) {
        assert!(e.offset < data.len() as u64, "{e}");
    }
    let path = pttrace_fuzz::write_scratch("p.info", data);
    if let Ok(s) = summary::summarize_process(&path) {
        assert_eq!(s.tail, p.tail);
    }
});
