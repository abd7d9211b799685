//! `/proc/kallsyms` text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pttrace_decode::Symbols;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut syms = Symbols::new();
    match syms.add_kallsyms(std::path::Path::new("kallsyms"), &text) {
        Ok(n) => {
            assert!(syms.len() <= n);
            let _ = syms.lookup(0xffff_ffff_8100_0000);
        }
        Err(e) => {
            assert!(e.offset < text.len() as u64, "{e}");
            assert!(e.to_string().starts_with("kallsyms"), "{e}");
        }
    }
});
