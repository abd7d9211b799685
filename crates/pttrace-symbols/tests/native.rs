//! Symbolizing real binaries: a C program with split debug info (debuglink, build-id,
//! debuginfod cache, extra debug dirs), a C++ and a Rust program (demangling), and libc
//! with libc6-dbg.

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSymbol};
use pttrace_symbols::{
    build_id_path, DebugSearch, DebugSource, Module, NameOrigin, Symbolized, Symbolizer,
};

const C_SRC: &str = r#"#include <stdio.h>

static inline __attribute__((always_inline)) unsigned mix(unsigned x) {
    unsigned y = x * 2654435761u; /* MARK_MIX */
    return y ^ (y >> 13); /* MARK_MIX_RET */
}

static __attribute__((noinline)) unsigned helper(unsigned x) {
    unsigned s = 0;
    for (unsigned i = 0; i < x; i++) s += i * i + (s >> 3); /* MARK_HELPER */
    return s;
}

__attribute__((noinline)) unsigned outer(unsigned x) {
    unsigned a = mix(x); /* MARK_CALL */
    return a + helper(x & 15);
}

int main(int argc, char **argv) {
    (void)argv;
    printf("%u\n", outer((unsigned)argc));
    return 0;
}
"#;

fn tool(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(dir: &Path, prog: &str, args: &[&str]) {
    let out = Command::new(prog)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The 1-based line of the source line holding `marker`.
fn line_of(src: &str, marker: &str) -> u32 {
    let i = src
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker}"));
    i as u32 + 1
}

/// (address, size) of the first function symbol named `name` (or starting with `name.`:
/// GCC may clone a static function as `helper.isra.0`).
fn sym(path: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let f = object::File::parse(&*data).unwrap();
    f.symbols()
        .find(|s| {
            s.name()
                .is_ok_and(|n| n == name || n.starts_with(&format!("{name}.")))
                && s.size() > 0
        })
        .map(|s| (s.address(), s.size()))
        .unwrap_or_else(|| panic!("{}: no symbol {name}", path.display()))
}

fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    let f = object::File::parse(&*data).unwrap();
    f.build_id().unwrap().unwrap().to_vec()
}

/// A C program compiled `-O2 -g` in a fresh directory: (dir, source path, binary path).
struct CProg {
    dir: tempfile::TempDir,
}

impl CProg {
    fn build() -> Option<CProg> {
        if !tool("cc") || !tool("objcopy") {
            println!("SKIP: cc or objcopy (binutils) not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prog.c"), C_SRC).unwrap();
        run(
            dir.path(),
            "cc",
            &["-O2", "-g", "-Wl,--build-id", "-o", "prog.full", "prog.c"],
        );
        Some(CProg { dir })
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `prog.debug` (debug info only) and `NAME` (the program without debug info, with a
    /// debuglink to prog.debug); `strip_all` also drops `.symtab`.
    fn split(&self, name: &str, strip_all: bool) {
        let d = self.dir.path();
        run(
            d,
            "objcopy",
            &["--only-keep-debug", "prog.full", "prog.debug"],
        );
        let strip = if strip_all {
            "--strip-all"
        } else {
            "--strip-debug"
        };
        run(
            d,
            "objcopy",
            &[strip, "--add-gnu-debuglink=prog.debug", "prog.full", name],
        );
    }
}

/// Every ELF address of `outer` and `helper` names them exactly; `mix` is inlined into
/// `outer` as its own innermost frame with the call site's line; lines are right.
fn check_c_names_and_lines(m: &mut Module, full: &Path) {
    let (outer, outer_len) = sym(full, "outer");
    let (helper, helper_len) = sym(full, "helper");
    let (main, _) = sym(full, "main");
    let call = line_of(C_SRC, "MARK_CALL");
    let mix_lines = [line_of(C_SRC, "MARK_MIX"), line_of(C_SRC, "MARK_MIX_RET")];
    let helper_line = line_of(C_SRC, "MARK_HELPER");
    let file = std::fs::canonicalize(full.parent().unwrap())
        .unwrap()
        .join("prog.c");
    let file = file.to_str().unwrap();

    let addrs: Vec<u64> = (outer..outer + outer_len).collect();
    let res = m.resolve_many(&addrs);
    let mut inlined = 0;
    for (a, s) in addrs.iter().zip(&res) {
        assert_eq!(&*s.function, "outer", "{a:#x}: {s:?}");
        assert_eq!(s.origin, NameOrigin::Dwarf);
        assert_eq!(s.start, Some(outer));
        if s.frames.len() == 2 {
            inlined += 1;
            assert_eq!(&*s.frames[0].name, "mix", "{a:#x}");
            assert_eq!(&*s.frames[1].name, "outer");
            let inner = s.frames[0].location.as_ref().unwrap();
            let site = s.frames[1].location.as_ref().unwrap();
            assert_eq!(&*inner.file, file);
            assert!(mix_lines.contains(&inner.line), "{a:#x}: {inner}");
            assert_eq!(site.to_string(), format!("{file}:{call}"), "{a:#x}");
            assert_eq!(s.inlined().len(), 1);
            assert_eq!(s.location(), Some(inner));
        } else {
            assert_eq!(s.frames.len(), 1, "{a:#x}: {s:?}");
        }
    }
    assert!(inlined > 0, "no address of outer has mix inlined");

    let addrs: Vec<u64> = (helper..helper + helper_len).collect();
    let mut on_line = 0;
    for (a, s) in addrs.iter().zip(m.resolve_many(&addrs)) {
        assert_eq!(&*s.function, "helper", "{a:#x}");
        assert_eq!(s.frames.len(), 1);
        let loc = s.location().unwrap();
        assert_eq!(&*loc.file, file);
        on_line += usize::from(loc.line == helper_line);
    }
    assert!(on_line > 0, "no address of helper on line {helper_line}");
    assert_eq!(&*m.resolve(main).function, "main");

    // binutils' addr2line as an oracle for every address of outer and helper.
    if tool("addr2line") {
        let debug = full.parent().unwrap().join("prog.full");
        let addrs: Vec<u64> = (outer..outer + outer_len)
            .chain(helper..helper + helper_len)
            .collect();
        let mut args = vec![
            "-e".to_string(),
            debug.display().to_string(),
            "-i".into(),
            "-f".into(),
            "-a".into(),
        ];
        args.extend(addrs.iter().map(|a| format!("{a:#x}")));
        let out = Command::new("addr2line").args(&args).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut blocks: Vec<Vec<(String, String)>> = Vec::new();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if l.starts_with("0x") {
                blocks.push(Vec::new());
                continue;
            }
            let loc = lines.next().unwrap();
            let loc = loc.split(" (discriminator").next().unwrap().to_string();
            blocks.last_mut().unwrap().push((l.to_string(), loc));
        }
        assert_eq!(blocks.len(), addrs.len());
        for (a, want) in addrs.iter().zip(blocks) {
            let s = m.resolve(*a);
            let got: Vec<(String, String)> = s
                .frames
                .iter()
                .map(|f| {
                    let loc = f
                        .location
                        .as_ref()
                        .map_or("??:0".to_string(), |l| l.to_string());
                    (f.name.to_string(), loc)
                })
                .collect();
            assert_eq!(got, want, "addr2line disagrees at {a:#x}");
        }
    } else {
        println!("SKIP (oracle only): binutils addr2line not installed");
    }
}

#[test]
fn c_debuglink_in_an_extra_dir_then_build_id_in_an_extra_dir() {
    let Some(p) = CProg::build() else { return };
    p.split("prog", false);
    let full = p.p("prog.full");
    // The debuglink target lives only in an extra debug dir.
    let links = tempfile::tempdir().unwrap();
    std::fs::rename(p.p("prog.debug"), links.path().join("prog.debug")).unwrap();
    let mut search = DebugSearch::empty();
    search.add_debug_dir(links.path());
    let mut m = Module::open(&p.p("prog"), &search).unwrap();
    assert_eq!(
        m.debug().source,
        DebugSource::DebugLink(links.path().join("prog.debug"))
    );
    assert!(m.has_dwarf());
    check_c_names_and_lines(&mut m, &full);

    // Now only a copy under DIR/.build-id/xx/rest.debug (the debuglink target removed).
    let ids = tempfile::tempdir().unwrap();
    let target = build_id_path(ids.path(), &build_id(&full));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::rename(links.path().join("prog.debug"), &target).unwrap();
    let mut search = DebugSearch::empty();
    search.add_debug_dir(links.path()).add_debug_dir(ids.path());
    let mut m = Module::open(&p.p("prog"), &search).unwrap();
    assert_eq!(m.debug().source, DebugSource::BuildId(target.clone()));
    check_c_names_and_lines(&mut m, &full);
    let msg = m.debug().describe(m.name());
    assert_eq!(
        msg,
        format!("prog: DWARF from {} (build-id)", target.display())
    );
}

/// Where inlined frames can be: the program's own functions lie in its compilation units'
/// code, the C runtime's `_start` (no DWARF of it) between them; without DWARF nowhere.
#[test]
fn c_compilation_units_cover_the_programs_own_code() {
    let Some(p) = CProg::build() else { return };
    let full = p.p("prog.full");
    let m = Module::open(&full, &DebugSearch::empty()).unwrap();
    let (outer, outer_len) = sym(&full, "outer");
    let (main, _) = sym(&full, "main");
    let (start, _) = sym(&full, "_start");
    let (units, inside) = m.dwarf_region(outer);
    assert!(inside);
    assert!(
        units.start <= outer && outer + outer_len <= units.end,
        "{units:x?}"
    );
    // (main is in .text.startup at -O2: a range of the unit of its own.)
    let (main_units, inside) = m.dwarf_region(main);
    assert!(inside && main_units.contains(&main), "{main_units:x?}");
    let (gap, inside) = m.dwarf_region(start);
    assert!(!inside, "_start {start:#x} in a unit {gap:x?}");
    assert!(gap.contains(&start));
    for u in [&units, &main_units] {
        assert!(gap.end <= u.start || gap.start >= u.end, "{gap:x?} {u:x?}");
    }
    run(
        p.dir.path(),
        "objcopy",
        &["--strip-debug", "prog.full", "prog.nodebug"],
    );
    let m = Module::open(&p.p("prog.nodebug"), &DebugSearch::empty()).unwrap();
    assert_eq!(m.dwarf_region(outer), (0..u64::MAX, false));
}

#[test]
fn c_fully_stripped_binary_named_from_the_debug_file_or_stably_without_it() {
    let Some(p) = CProg::build() else { return };
    p.split("prog", true);
    let full = p.p("prog.full");
    // Beside the binary: names (and DWARF) come from prog.debug.
    let mut m = Module::open(&p.p("prog"), &DebugSearch::empty()).unwrap();
    assert_eq!(m.debug().source, DebugSource::DebugLink(p.p("prog.debug")));
    check_c_names_and_lines(&mut m, &full);

    // In BINDIR/.debug/: found there.
    std::fs::create_dir(p.p(".debug")).unwrap();
    std::fs::rename(p.p("prog.debug"), p.p(".debug/prog.debug")).unwrap();
    let m = Module::open(&p.p("prog"), &DebugSearch::empty()).unwrap();
    assert_eq!(
        m.debug().source,
        DebugSource::DebugLink(p.p(".debug/prog.debug"))
    );

    // A wrong file under the debuglink name is rejected for its CRC; the debuginfod cache
    // copy is used.
    let cache = tempfile::tempdir().unwrap();
    let id = build_id(&full);
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let cached = cache.path().join(&hex).join("debuginfo");
    std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
    std::fs::rename(p.p(".debug/prog.debug"), &cached).unwrap();
    std::fs::copy(&full, p.p("prog.debug")).unwrap();
    let mut search = DebugSearch::empty();
    search.add_debuginfod_cache(cache.path());
    let mut m = Module::open(&p.p("prog"), &search).unwrap();
    assert_eq!(m.debug().source, DebugSource::Debuginfod(cached.clone()));
    assert_eq!(m.debug().rejected.len(), 1);
    assert_eq!(m.debug().rejected[0].0, p.p("prog.debug"));
    assert!(
        m.debug().rejected[0]
            .1
            .contains("differs from the debuglink's"),
        "{:?}",
        m.debug().rejected
    );
    check_c_names_and_lines(&mut m, &full);

    // No debug file at all: no symbols either, so each function gets one stable name,
    // `prog+0xOFF` of its FDE start, for every address in it.
    std::fs::remove_file(p.p("prog.debug")).unwrap();
    let mut m = Module::open(&p.p("prog"), &DebugSearch::empty()).unwrap();
    assert_eq!(m.debug().source, DebugSource::None);
    assert_eq!(
        m.debug().describe("prog"),
        format!("prog: stripped, no debug file for build-id {}…", &hex[..12])
    );
    let (helper, len) = sym(&full, "helper");
    let off = m.addr_to_file_offset(helper).unwrap();
    let want = format!("prog+{off:#x}");
    for a in helper..helper + len {
        let s = m.resolve(a);
        assert_eq!(&*s.function, want, "{a:#x}");
        assert_eq!(s.origin, NameOrigin::EhFrame);
        assert_eq!(s.start, Some(helper));
        assert!(s.location().is_none());
    }
    // Its entry point is `_start` (where every process of it starts), over its FDE.
    let data = std::fs::read(p.p("prog")).unwrap();
    let entry = object::File::parse(&*data).unwrap().entry();
    let (start, len) = sym(&full, "_start");
    assert_eq!(start, entry);
    for a in [entry, entry + len - 1] {
        let s = m.resolve(a);
        assert_eq!((&*s.function, s.start), ("_start", Some(entry)), "{a:#x}");
    }
    assert_ne!(&*m.resolve(entry + len).function, "_start");

    // A stripped library's entry point (here a hidden function: no symbol left) is not
    // named so (it has a DT_SONAME: libc's entry prints its version).
    std::fs::write(
        p.p("e.c"),
        "int f(void) { return 1; }\n__attribute__((visibility(\"hidden\"))) int g(void) { return 2; }\n",
    )
    .unwrap();
    run(
        &p.p(""),
        "cc",
        &[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libe.so",
            "-Wl,-e,g",
            "-o",
            "libe.so",
            "e.c",
        ],
    );
    run(&p.p(""), "strip", &["libe.so"]);
    let data = std::fs::read(p.p("libe.so")).unwrap();
    let entry = object::File::parse(&*data).unwrap().entry();
    assert_ne!(entry, 0);
    let mut m = Module::open(&p.p("libe.so"), &DebugSearch::empty()).unwrap();
    assert_ne!(&*m.resolve(entry).function, "_start");
}

#[test]
fn c_strip_debug_keeps_symtab_names_and_says_so() {
    let Some(p) = CProg::build() else { return };
    p.split("prog", false);
    std::fs::remove_file(p.p("prog.debug")).unwrap();
    let mut m = Module::open(&p.p("prog"), &DebugSearch::empty()).unwrap();
    assert!(!m.has_dwarf());
    let hex: String = build_id(&p.p("prog.full"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        m.debug().describe("prog"),
        format!(
            "prog: no DWARF, names from .symtab, no debug file for build-id {}…",
            &hex[..12]
        )
    );
    let (outer, len) = sym(&p.p("prog"), "outer");
    for a in outer..outer + len {
        let s = m.resolve(a);
        assert_eq!(&*s.function, "outer");
        assert_eq!(s.origin, NameOrigin::Symbol);
        assert_eq!(s.frames.len(), 1);
    }
    // Address conversions: a run-time address in a mapping of the file.
    let off = m.addr_to_file_offset(outer).unwrap();
    let base = 0x5555_5555_0000u64;
    let runtime = base + off;
    assert_eq!(m.runtime_to_addr(runtime, base, 0), Some(outer));
    assert_eq!(
        m.runtime_to_addr(runtime, base + 0x1000, 0x1000),
        Some(outer)
    );
    assert_eq!(m.addr_to_runtime(outer, base, 0), Some(runtime));
    assert_eq!(m.file_offset_to_addr(off), Some(outer));
    // The symbolizer opens each file once and caches each address once.
    let mut z = Symbolizer::new(DebugSearch::empty());
    let a = z.resolve(&p.p("prog"), outer).unwrap();
    let b = z.resolve(&p.p("prog"), outer).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert_eq!(z.modules().count(), 1);
    let e = z.resolve(&p.p("nope"), 0).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}

fn names_at(path: &Path, syms: &[&str]) -> Vec<String> {
    let mut m = Module::open(path, &DebugSearch::empty()).unwrap();
    let data = std::fs::read(path).unwrap();
    let f = object::File::parse(&*data).unwrap();
    syms.iter()
        .map(|want| {
            let s = f
                .symbols()
                .find(|s| s.name().is_ok_and(|n| n == *want))
                .unwrap_or_else(|| panic!("no {want}"));
            // Inside the function, not at its first byte.
            let r: std::sync::Arc<Symbolized> = m.resolve(s.address() + s.size() / 2);
            r.function.to_string()
        })
        .collect()
}

#[test]
fn cpp_names_are_demangled_with_parameters() {
    if !tool("c++") {
        println!("SKIP: c++ not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("prog.cc"),
        r#"
namespace node {
__attribute__((noinline)) int Start(int argc, char** argv) { return argc * 7 + (argv != nullptr); }
}
template <typename T> __attribute__((noinline)) T twice(T x) { return x + x * x; }
int main(int argc, char** argv) {
    return node::Start(argc, argv) + (int)twice<long>(argc) + twice<int>(argc);
}
"#,
    )
    .unwrap();
    run(dir.path(), "c++", &["-O1", "-g", "-o", "prog", "prog.cc"]);
    let got = names_at(
        &dir.path().join("prog"),
        &[
            "_ZN4node5StartEiPPc",
            "_Z5twiceIlET_S0_",
            "_Z5twiceIiET_S0_",
        ],
    );
    assert_eq!(
        got,
        vec![
            "node::Start(int, char**)",
            "long twice<long>(long)",
            "int twice<int>(int)"
        ]
    );
    // Without DWARF, from the symbol table: the same names.
    run(
        dir.path(),
        "objcopy",
        &["--strip-debug", "prog", "prog.nodebug"],
    );
    let got2 = names_at(
        &dir.path().join("prog.nodebug"),
        &[
            "_ZN4node5StartEiPPc",
            "_Z5twiceIlET_S0_",
            "_Z5twiceIiET_S0_",
        ],
    );
    assert_eq!(got2, got);
}

#[test]
fn rust_legacy_and_v0_names_lose_their_hashes() {
    if !tool("rustc") {
        println!("SKIP: rustc not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("prog.rs"),
        r#"
mod m {
    #[inline(never)]
    pub fn work(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(31) ^ 7
    }
}
fn main() {
    println!("{}", m::work(std::env::args().count() as u64));
}
"#,
    )
    .unwrap();
    // Default mangling (legacy on stable) and v0, with and without DWARF.
    run(
        dir.path(),
        "rustc",
        &["-g", "-O", "-o", "legacy", "prog.rs"],
    );
    run(
        dir.path(),
        "rustc",
        &[
            "-g",
            "-O",
            "-C",
            "symbol-mangling-version=v0",
            "-o",
            "v0",
            "prog.rs",
        ],
    );
    for (bin, prefix) in [("legacy", "_ZN4prog1m4work17h"), ("v0", "_RNvNtCs")] {
        let path = dir.path().join(bin);
        let data = std::fs::read(&path).unwrap();
        let f = object::File::parse(&*data).unwrap();
        let s = f
            .symbols()
            .find(|s| {
                s.name().is_ok_and(|n| {
                    n.starts_with(prefix) && n.ends_with("work")
                        || n.starts_with(prefix) && n.contains("4work17h")
                })
            })
            .unwrap_or_else(|| panic!("{bin}: no {prefix}… symbol"));
        let raw = s.name().unwrap().to_string();
        let addr = s.address();
        drop(f);
        let mut m = Module::open(&path, &DebugSearch::empty()).unwrap();
        let r = m.resolve(addr);
        assert_eq!(&*r.function, "prog::m::work", "{bin} ({raw})");
        assert_eq!(r.origin, NameOrigin::Dwarf);
        // The innermost frame may be an inlined std function; the function itself is in
        // prog.rs.
        let last = r.frames.last().unwrap();
        assert_eq!(&*last.name, "prog::m::work");
        assert!(
            last.location.as_ref().unwrap().file.ends_with("prog.rs"),
            "{bin}: {r:?}"
        );
        // The symbol alone gives the same name.
        assert_eq!(pttrace_symbols::demangle(&raw), "prog::m::work");
        run(
            dir.path(),
            "objcopy",
            &["--strip-debug", bin, &format!("{bin}.nodebug")],
        );
        let mut m = Module::open(
            &dir.path().join(format!("{bin}.nodebug")),
            &DebugSearch::empty(),
        )
        .unwrap();
        let r = m.resolve(addr);
        assert_eq!(&*r.function, "prog::m::work", "{bin} without DWARF");
        assert_eq!(r.origin, NameOrigin::Symbol);
    }
}

/// The libc this test process runs with.
fn libc_path() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(PathBuf::from)
}

#[test]
fn libc_with_libc6_dbg() {
    let Some(libc) = libc_path() else {
        println!("SKIP: no libc.so mapped in this process");
        return;
    };
    let id = build_id(&libc);
    let debug = build_id_path(Path::new("/usr/lib/debug"), &id);
    if !debug.is_file() {
        println!(
            "SKIP: libc6-dbg not installed (no {} for {})",
            debug.display(),
            libc.display()
        );
        return;
    }
    let mut z = Symbolizer::new(DebugSearch::new());
    let m = z.module(&libc).unwrap();
    assert_eq!(m.debug().source, DebugSource::BuildId(debug.clone()));
    assert!(m.has_dwarf());
    // Names from the debug file's .symtab (asm memcpy variants) and DWARF (C functions).
    for (name, file_suffix) in [
        ("__memmove_avx_unaligned_erms", Some(".S")),
        ("__memcpy_avx_unaligned_erms", None),
        ("__libc_start_call_main", Some("libc_start_call_main.h")),
    ] {
        let (addr, size) = sym(&debug, name);
        let r = m.resolve(addr + size.min(8) / 2);
        // memcpy's avx variant is an alias of memmove's: perf (and we) call both the
        // longer name.
        let want = if name == "__memcpy_avx_unaligned_erms" {
            "__memmove_avx_unaligned_erms"
        } else {
            name
        };
        assert_eq!(&*r.function, want, "{name}");
        if let Some(suffix) = file_suffix {
            let loc = r.location().unwrap_or_else(|| panic!("{name}: no line"));
            assert!(loc.file.ends_with(suffix), "{name}: {loc}");
            assert!(loc.line > 0);
        }
    }
}

/// dwz moves shared DWARF into a supplementary file named by `.gnu_debugaltlink`: names and
/// inlined frames that live there still resolve; without it the module says why.
#[test]
fn dwz_supplementary_file() {
    if !tool("cc") || !tool("dwz") {
        println!("SKIP: cc or dwz not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = r#"struct big { int a, b, c; double d[4]; };
static inline __attribute__((always_inline)) int get(struct big *p) {
    return p->a + p->b; /* MARK_GET */
}
__attribute__((noinline)) int FN(struct big *p) { return get(p) * 3; }
int main(void) { struct big b = {1, 2, 3, {0}}; return FN(&b); }
"#;
    for f in ["fa", "fb"] {
        std::fs::write(dir.path().join(format!("{f}.c")), src.replace("FN", f)).unwrap();
        run(dir.path(), "cc", &["-O2", "-g", "-o", f, &format!("{f}.c")]);
    }
    let common = dir.path().join("common.debug");
    let common_s = common.to_str().unwrap();
    run(
        dir.path(),
        "dwz",
        &["-m", "common.debug", "-M", common_s, "fa", "fb"],
    );
    let fa = dir.path().join("fa");
    let (addr, len) = sym(&fa, "fa");
    let mut m = Module::open(&fa, &DebugSearch::empty()).unwrap();
    assert_eq!(
        m.debug().sup.as_deref(),
        Some(common.as_path()),
        "{:?}",
        m.debug()
    );
    assert_eq!(m.debug().dwarf_error, None);
    let get_line = line_of(src, "MARK_GET");
    let mut seen = 0;
    for a in addr..addr + len {
        let r = m.resolve(a);
        assert_eq!(&*r.function, "fa", "{a:#x}: {r:?}");
        if r.frames.len() == 2 {
            assert_eq!(&*r.frames[0].name, "get");
            assert_eq!(r.frames[0].location.as_ref().unwrap().line, get_line);
            seen += 1;
        }
    }
    assert!(seen > 0, "get is not seen inlined into fa");
    // The supplementary file gone: said so, and names still come from .symtab.
    std::fs::remove_file(&common).unwrap();
    let mut m = Module::open(&fa, &DebugSearch::empty()).unwrap();
    let err = m.debug().dwarf_error.clone().unwrap();
    assert!(
        err.starts_with(&format!("dwz supplementary file {common_s} (build-id ")),
        "{err}"
    );
    assert_eq!(&*m.resolve(addr).function, "fa");
}

#[test]
fn debian_package_hint_for_libc() {
    let Some(libc) = libc_path() else {
        println!("SKIP: no libc.so mapped in this process");
        return;
    };
    if !Path::new("/var/lib/dpkg/info").is_dir() {
        println!("SKIP: not a dpkg system");
        return;
    }
    assert_eq!(
        pttrace_symbols::debian_debug_package(&libc).as_deref(),
        Some("libc6-dbg")
    );
    // With libc6-dbg's files out of reach, the module gives the advice.
    let m = Module::open(&libc, &DebugSearch::empty()).unwrap();
    assert!(!m.has_dwarf());
    assert_eq!(m.advice().as_deref(), Some("libc.so.6: install libc6-dbg"));
    assert_eq!(m.debug().source, DebugSource::None);
    // Debian's libc has no .symtab: only .dynsym.
    let hex: String = build_id(&libc).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        m.debug().describe("libc.so.6"),
        format!(
            "libc.so.6: stripped, no debug file for build-id {}…",
            &hex[..12]
        )
    );
    assert_eq!(
        pttrace_symbols::debian_debug_package(Path::new("/nonexistent/x")),
        None
    );
}
