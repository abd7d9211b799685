//! The QEMU command line the plugin reads back (`/proc/self/cmdline`), and the first bytes
//! of a program `pttrace run` inspects (ELF or `#!` script), read from a file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_format::launch::{self, Program};

fuzz_target!(|data: &[u8]| {
    let (cmd, prog) = launch::guest_cmdline(data);
    assert_eq!(cmd.last(), Some(&0));
    assert!(prog.is_empty() || data.split(|b| *b == 0).any(|a| a == prog));
    let path = pttrace_fuzz::write_scratch("program", data);
    match launch::inspect(&path).expect("read the scratch file") {
        Program::X86_64 => assert!(data.starts_with(b"\x7fELF")),
        Program::Script { interp, .. } => {
            assert!(data.starts_with(b"#!"));
            assert!(!interp.contains(&b' ') && !interp.contains(&b'\n'));
        }
        Program::Other(why) => assert!(!why.is_empty()),
    }
});
