//! A `.ptt` thread file: frames, their records, the windows as the decoder reads them
//! (with their sideband), and the streaming reader and summary on a file.
//! The input is a file, or a frame list made into one (see `pttrace_fuzz::ptt_input`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::ptt_input::read_windows;
use pttrace_decode::sideband::parse_records;
use pttrace_format::perf_record::SIDEBAND_SAMPLE_TYPE;
use pttrace_format::ptt::{self, FileKind, Tail};
use pttrace_format::summary;

fuzz_target!(|input: &[u8]| {
    let data: &[u8] = &pttrace_fuzz::ptt_input(FileKind::Thread, input);
    let name = "fuzz.ptt";
    let Ok(p) = ptt::parse(name, data) else {
        return;
    };
    let mut end = ptt::HEADER_SIZE;
    for f in &p.frames {
        assert_eq!(f.offset, end);
        end = f.offset + ptt::FRAME_OVERHEAD + f.payload.len();
        assert!(end <= data.len());
        let _ = ptt::decode_thread_header(f.payload);
        let _ = ptt::decode_dropped(f.payload);
        let _ = ptt::decode_end(f.payload);
        if let Some(w) = ptt::decode_window(f.payload) {
            assert_eq!(
                ptt::WINDOW_FIXED_SIZE + w.pt.len() + w.sideband.len(),
                f.payload.len()
            );
        }
    }
    match p.tail {
        Tail::Clean => assert_eq!(end, data.len()),
        Tail::Truncated { offset, bytes } | Tail::Corrupt { offset, bytes } => {
            assert_eq!((offset, offset + bytes), (end, data.len()))
        }
    }
    if let Ok(ws) = read_windows(name, data) {
        for w in ws {
            let at = w.pt_file_offset as usize;
            assert_eq!(&data[at..at + w.pt.len()], w.pt);
            if let Err(e) = parse_records(name, w.sideband, SIDEBAND_SAMPLE_TYPE) {
                assert!(e.offset < w.sideband.len() as u64, "{e}");
            }
        }
    }
    let path = pttrace_fuzz::write_scratch("t.ptt", data);
    let mut frames = 0;
    let tail = ptt::stream_frames(&path, FileKind::Thread, |_| {
        frames += 1;
        Ok(())
    });
    if p.kind == FileKind::Thread {
        assert_eq!(tail, Ok(p.tail.clone()));
        assert_eq!(frames, p.frames.len());
    }
    let _ = summary::summarize_thread(&path);
});
