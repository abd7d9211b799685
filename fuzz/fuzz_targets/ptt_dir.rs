//! A whole `pttrace run --out` directory: an info file and a thread file (the input's first
//! two bytes give the info file's length; each part is a file or a frame list, see
//! `ptt_input`), opened and decoded window by window with an empty sysroot.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::ptt_dir;
use pttrace_format::ptt::FileKind;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let n = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (info, thread) = rest.split_at(n);
    let info = pttrace_fuzz::ptt_input(FileKind::ProcessInfo, info);
    let thread = pttrace_fuzz::ptt_input(FileKind::Thread, thread);
    let dir = pttrace_fuzz::scratch_dir().join("out");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("1-00000001.info"), &info).unwrap();
    std::fs::write(dir.join("1-00000001-1.ptt"), &thread).unwrap();
    let Ok(mut t) = ptt_dir::open(&dir) else {
        return;
    };
    t.sysroot = Some(pttrace_fuzz::scratch_dir().join("no-sysroot"));
    for th in t.threads.clone() {
        let _ = t.decode_thread(&th, &mut |_, dec| {
            if let Some(d) = dec {
                let recs: Vec<_> = d.collect();
                pttrace_fuzz::check_gaps(&recs, "", thread.len() as u64);
            }
            Ok(())
        });
    }
});
