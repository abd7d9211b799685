//! Build script: compiles the bare C baseline loop of `benches/decode.rs` and links it
//! into the benchmarks only (the library and the binaries never see it).

fn main() {
    let src = "benches/c/bare_block_loop.c";
    println!("cargo:rerun-if-changed={src}");
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    cc::Build::new()
        .file(src)
        .opt_level(2)
        .cargo_metadata(false)
        .compile("pttracer_bench_bare");
    println!("cargo:rustc-link-arg-benches={out}/libpttracer_bench_bare.a");
}
