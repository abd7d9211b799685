//! Resolves 1 M addresses spread over libc's text, cold then cached, and prints the cost per
//! address. `cargo run --release -p pttrace-symbols --example libc_bench [LIB] [N]`.

use std::path::PathBuf;
use std::time::Instant;

use pttrace_symbols::{DebugSearch, Module, NameOrigin};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let lib = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/lib/x86_64-linux-gnu/libc.so.6".to_string()),
    );
    let n: usize = args.next().map_or(Ok(1_000_000), |s| s.parse())?;

    let t = Instant::now();
    let mut m = Module::open(&lib, &DebugSearch::new())?;
    let open = t.elapsed();
    println!("{}", m.debug().describe(m.name()));
    println!(
        "open: {:.1} ms ({} symbols, DWARF: {})",
        open.as_secs_f64() * 1e3,
        m.symbol_count(),
        m.has_dwarf()
    );

    // The text: the executable PT_LOAD, through file offsets.
    let data = std::fs::read(&lib)?;
    let (lo, hi) = text_range(&data).ok_or("no .text")?;
    // A fixed pseudo-random sequence over the text.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let addrs: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + x % (hi - lo)
        })
        .collect();
    let mut uniq = addrs.clone();
    uniq.sort_unstable();
    uniq.dedup();

    let t = Instant::now();
    let cold = m.resolve_many(&addrs);
    let cold_t = t.elapsed();
    let t = Instant::now();
    let warm = m.resolve_many(&addrs);
    let warm_t = t.elapsed();
    assert_eq!(cold.len(), warm.len());
    let t = Instant::now();
    let mut single = 0usize;
    for &a in &addrs {
        single += m.resolve(a).frames.len();
    }
    let single_t = t.elapsed();

    // Cold again, one address at a time in the given (random) order.
    let mut m2 = Module::open(&lib, &DebugSearch::new())?;
    let t = Instant::now();
    for &a in &addrs {
        m2.resolve(a);
    }
    let cold1_t = t.elapsed();
    println!(
        "cold   resolve one by one, random order: {:.3} s = {:.2} us/address",
        cold1_t.as_secs_f64(),
        cold1_t.as_secs_f64() * 1e6 / n as f64
    );

    let mut by_origin = std::collections::BTreeMap::new();
    let mut inl = 0usize;
    let mut lines = 0usize;
    for s in &cold {
        *by_origin.entry(format!("{:?}", s.origin)).or_insert(0usize) += 1;
        inl += usize::from(!s.inlined().is_empty());
        lines += usize::from(s.location().is_some());
    }
    println!(
        "{n} addresses ({} distinct) over [{lo:#x}, {hi:#x})",
        uniq.len()
    );
    println!(
        "cold   resolve_many: {:.3} s = {:.2} us/address ({:.2} us per distinct address)",
        cold_t.as_secs_f64(),
        cold_t.as_secs_f64() * 1e6 / n as f64,
        cold_t.as_secs_f64() * 1e6 / uniq.len() as f64
    );
    println!(
        "cached resolve_many: {:.3} s = {:.0} ns/address",
        warm_t.as_secs_f64(),
        warm_t.as_secs_f64() * 1e9 / n as f64
    );
    println!(
        "cached resolve:      {:.3} s = {:.0} ns/address ({single} frames)",
        single_t.as_secs_f64(),
        single_t.as_secs_f64() * 1e9 / n as f64
    );
    println!("origins: {by_origin:?}; with inlined frames: {inl}; with a line: {lines}");
    let unnamed = cold
        .iter()
        .filter(|s| !matches!(s.origin, NameOrigin::Dwarf | NameOrigin::Symbol))
        .take(3)
        .map(|s| s.function.to_string())
        .collect::<Vec<_>>();
    println!("examples of unnamed: {unnamed:?}");
    for s in cold.iter().filter(|s| s.frames.len() > 2).take(2) {
        for f in &s.frames {
            let loc = f
                .location
                .as_ref()
                .map(|l| l.to_string())
                .unwrap_or_default();
            println!("  {} at {loc}", f.name);
        }
        println!("  --");
    }
    Ok(())
}

fn text_range(data: &[u8]) -> Option<(u64, u64)> {
    use object::{Object, ObjectSection};
    let f = object::File::parse(data).ok()?;
    let s = f.section_by_name(".text")?;
    Some((s.address(), s.address() + s.size()))
}
