//! The committed C header must equal a fresh cbindgen generation from src/ffi.rs.
//! `DRPTTRACER_BLESS=1 cargo test --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_is_freshly_generated() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi.rs"))
        .generate()
        .expect("cbindgen generation")
        .write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("utf-8 header");
    let path = root.join("include/drpttracer.h");
    if std::env::var_os("DRPTTRACER_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/drpttracer.h differs from the cbindgen output of src/ffi.rs; \
         run `DRPTTRACER_BLESS=1 cargo test --test header` and commit the header"
    );
}
