//! Perf maps and jitdump files: every record kind, overlaps, time, truncation at every byte
//! of the last line/record, garbage, and (when node is installed) real files from node.

use std::path::Path;

use pttrace_symbols::{JitDump, PerfMap, SymbolError, Truncation};

const MAP: &str = "7f0000001000 100 LazyCompile:~hot /tmp/t.js:1\n\
0x7f0000001100 0x40 Builtin:ArgumentsAdaptorTrampoline\n\
\n\
7f0000001020 20 JS:*hot /tmp/t.js:1 (optimized)\n\
7f0000002000 0 empty\n\
7f0000003000 10 last one\n";

#[test]
fn perf_map_names_with_spaces_and_the_latest_load_wins() {
    let m = PerfMap::parse(Path::new("/tmp/perf-1.map"), MAP.as_bytes()).unwrap();
    assert_eq!(m.entries().len(), 5);
    assert!(m.truncated().is_none());
    let name = |a: u64| m.lookup(a).map(|s| s.name.as_str());
    assert_eq!(name(0x7f00_0000_1000), Some("LazyCompile:~hot /tmp/t.js:1"));
    assert_eq!(name(0x7f00_0000_101f), Some("LazyCompile:~hot /tmp/t.js:1"));
    // The later entry covers 0x1020..0x1040 of the earlier one.
    assert_eq!(
        name(0x7f00_0000_1020),
        Some("JS:*hot /tmp/t.js:1 (optimized)")
    );
    assert_eq!(
        name(0x7f00_0000_103f),
        Some("JS:*hot /tmp/t.js:1 (optimized)")
    );
    assert_eq!(name(0x7f00_0000_1040), Some("LazyCompile:~hot /tmp/t.js:1"));
    assert_eq!(name(0x7f00_0000_10ff), Some("LazyCompile:~hot /tmp/t.js:1"));
    assert_eq!(
        name(0x7f00_0000_1100),
        Some("Builtin:ArgumentsAdaptorTrampoline")
    );
    assert_eq!(name(0x7f00_0000_1140), None);
    assert_eq!(name(0x7f00_0000_2000), None, "size 0 covers nothing");
    assert_eq!(name(0x7f00_0000_300f), Some("last one"));
    assert_eq!(name(0x7f00_0000_0fff), None);
    let s = m.lookup(0x7f00_0000_1100).unwrap();
    assert_eq!((s.start, s.size), (0x7f00_0000_1100, 0x40));
}

#[test]
fn perf_map_truncated_at_every_byte_of_the_last_line() {
    let last_start = MAP[..MAP.len() - 1].rfind('\n').unwrap() + 1;
    for cut in last_start..MAP.len() {
        let m = PerfMap::parse(Path::new("m"), &MAP.as_bytes()[..cut]).unwrap();
        assert_eq!(m.entries().len(), 4, "cut at {cut}");
        assert_eq!(m.lookup(0x7f00_0000_3000), None, "cut at {cut}");
        let t = m.truncated();
        if cut == last_start {
            assert_eq!(t, None);
        } else {
            assert_eq!(
                t,
                Some(&Truncation {
                    offset: last_start as u64,
                    line: Some(6),
                    len: (cut - last_start) as u64
                }),
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn perf_map_garbage_names_file_line_and_offset() {
    let text = "1000 10 a\n2000 zz b\n";
    let e = PerfMap::parse(Path::new("/tmp/perf-7.map"), text.as_bytes()).unwrap_err();
    assert!(
        matches!(
            &e,
            SymbolError::Format {
                offset: 10,
                line: Some(2),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "/tmp/perf-7.map: byte offset 10 (line 2): bad size 'zz' (expected hex)"
    );
    let e = PerfMap::parse(Path::new("m"), b"1000\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "m: byte offset 0 (line 1): expected 'START SIZE NAME'"
    );
    let e = PerfMap::parse(Path::new("m"), b"1000 10 a\nq1 2 x\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "m: byte offset 10 (line 2): bad start address 'q1' (expected hex)"
    );
}

/// A jitdump writer for tests.
struct W {
    big: bool,
    out: Vec<u8>,
}

impl W {
    fn new(big: bool, pid: u32) -> W {
        let mut w = W {
            big,
            out: Vec::new(),
        };
        w.u32(0x4A69_5444);
        w.u32(1);
        w.u32(40);
        w.u32(62);
        w.u32(0);
        w.u32(pid);
        w.u64(1000);
        w.u64(0);
        w
    }
    fn u32(&mut self, v: u32) {
        let b = if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.out.extend_from_slice(&b);
    }
    fn u64(&mut self, v: u64) {
        let b = if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.out.extend_from_slice(&b);
    }
    fn record(&mut self, id: u32, ts: u64, body: impl FnOnce(&mut W)) {
        let at = self.out.len();
        self.u32(id);
        self.u32(0);
        self.u64(ts);
        body(self);
        let size = (self.out.len() - at) as u32;
        let b = if self.big {
            size.to_be_bytes()
        } else {
            size.to_le_bytes()
        };
        self.out[at + 4..at + 8].copy_from_slice(&b);
    }
    fn load(&mut self, ts: u64, addr: u64, index: u64, name: &str, code: &[u8]) {
        self.record(0, ts, |w| {
            w.u32(7);
            w.u32(8);
            w.u64(addr);
            w.u64(addr);
            w.u64(code.len() as u64);
            w.u64(index);
            w.out.extend_from_slice(name.as_bytes());
            w.out.push(0);
            w.out.extend_from_slice(code);
        });
    }
}

/// A dump with one record of every kind (and an unknown one); the last record is a load.
fn sample(big: bool) -> (Vec<u8>, usize) {
    let mut w = W::new(big, 7);
    w.record(2, 2000, |w| {
        w.u64(0x1000);
        w.u64(3);
        for (addr, line, file) in [
            (0x1000u64, 10u32, &b"a.js"[..]),
            (0x1008, 11, &[0xff][..]),
            (0x1010, 20, b"b.js"),
        ] {
            w.u64(addr);
            w.u32(line);
            w.u32(0);
            w.out.extend_from_slice(file);
            w.out.push(0);
        }
    });
    w.record(4, 2500, |w| {
        w.u64(8);
        w.u64(4);
        w.u64(8);
        w.out.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    });
    w.load(3000, 0x1000, 1, "JS:~first a.js:10", &[0x90; 0x20]);
    w.record(99, 3500, |w| w.u64(5));
    w.record(1, 4000, |w| {
        w.u32(7);
        w.u32(8);
        w.u64(0x5000);
        w.u64(0x1000);
        w.u64(0x5000);
        w.u64(0x20);
        w.u64(1);
    });
    w.record(3, 4500, |_| {});
    let last = w.out.len();
    w.load(5000, 0x1010, 2, "JS:*second with spaces", &[0xc3; 0x10]);
    (w.out, last)
}

fn check_sample(d: &JitDump) {
    assert_eq!(d.header.pid, 7);
    assert_eq!(d.header.version, 1);
    assert_eq!(d.header.elf_mach, 62);
    assert_eq!(d.header.timestamp, 1000);
    let l = &d.loads[0];
    assert_eq!(
        (l.pid, l.tid, l.vma, l.code_addr, l.code_size, l.code_index),
        (7, 8, 0x1000, 0x1000, 0x20, 1)
    );
    assert_eq!(l.name, "JS:~first a.js:10");
    assert_eq!(d.code(l), &[0x90; 0x20][..]);
    let lines: Vec<(u64, u32, &str)> = l.debug.iter().map(|e| (e.addr, e.line, &*e.file)).collect();
    assert_eq!(
        lines,
        vec![
            (0x1000, 10, "a.js"),
            (0x1008, 11, "a.js"),
            (0x1010, 20, "b.js")
        ]
    );
    assert_eq!(l.unwinding, Some(0));
    let u = &d.unwinding[0];
    assert_eq!(
        (u.unwind_data_size, u.eh_frame_hdr_size, u.mapped_size),
        (8, 4, 8)
    );
    assert_eq!(d.unwinding_data(u), &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(d.moves.len(), 1);
    assert_eq!(d.moves[0].new_code_addr, 0x5000);
    assert_eq!(d.moves[0].code_index, 1);
    assert_eq!(d.closed, Some(4500));
    assert_eq!(d.unknown.len(), 1);
    assert_eq!(d.unknown[0].1, 99);
}

#[test]
fn jitdump_every_record_kind_and_lookup_by_time() {
    for big in [false, true] {
        let (bytes, _) = sample(big);
        let d = JitDump::parse(Path::new("jit-7.dump"), bytes).unwrap();
        assert_eq!(d.header.big_endian, big);
        check_sample(&d);
        assert_eq!(d.loads.len(), 2);
        assert_eq!(d.loads[1].name, "JS:*second with spaces");
        assert!(d.truncated().is_none());
        let name = |a: u64, t: Option<u64>| d.lookup(a, t).map(|h| h.name().to_string());
        // Latest placement wins without a time: `second` overlays 0x1010..0x1020, `first`
        // has moved to 0x5000.
        assert_eq!(name(0x1000, None).as_deref(), Some("JS:~first a.js:10"));
        assert_eq!(
            name(0x1010, None).as_deref(),
            Some("JS:*second with spaces")
        );
        assert_eq!(name(0x5008, None).as_deref(), Some("JS:~first a.js:10"));
        assert_eq!(name(0x5020, None), None);
        // By time.
        assert_eq!(name(0x1010, Some(2999)), None, "before the load");
        assert_eq!(
            name(0x1010, Some(3000)).as_deref(),
            Some("JS:~first a.js:10")
        );
        assert_eq!(
            name(0x1010, Some(3999)).as_deref(),
            Some("JS:~first a.js:10")
        );
        assert_eq!(name(0x1010, Some(4000)), None, "moved away");
        assert_eq!(name(0x5010, Some(3999)), None, "not moved yet");
        assert_eq!(
            name(0x5010, Some(4000)).as_deref(),
            Some("JS:~first a.js:10")
        );
        assert_eq!(
            name(0x1010, Some(5000)).as_deref(),
            Some("JS:*second with spaces")
        );
        // Lines follow the moved code.
        let h = d.lookup(0x500c, Some(4100)).unwrap();
        assert_eq!(h.start, 0x5000);
        let e = h.line(0x500c).unwrap();
        assert_eq!((e.line, &*e.file), (11, "a.js"));
        let h = d.lookup(0x1004, None).unwrap();
        assert_eq!(h.line(0x1004).unwrap().line, 10);
        assert!(d.lookup(0x1010, None).unwrap().line(0x1010).is_none());
    }
}

#[test]
fn jitdump_truncated_at_every_byte_of_the_last_record() {
    let (bytes, last) = sample(false);
    for cut in last..bytes.len() {
        let d = JitDump::parse(Path::new("jit-7.dump"), bytes[..cut].to_vec())
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        check_sample(&d);
        assert_eq!(d.loads.len(), 1, "cut at {cut}");
        if cut == last {
            assert!(d.truncated().is_none());
        } else {
            assert_eq!(
                d.truncated(),
                Some(&Truncation {
                    offset: last as u64,
                    line: None,
                    len: (cut - last) as u64
                }),
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn jitdump_garbage_names_file_and_offset() {
    let p = Path::new("/tmp/jit-9.dump");
    let e = JitDump::parse(
        p,
        b"ELF\x7f and more bytes than a header has, surely".to_vec(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "/tmp/jit-9.dump: byte offset 0: not a jitdump file: magic 0x7f464c45"
    );
    let (mut bytes, _) = sample(false);
    bytes.truncate(30);
    let e = JitDump::parse(p, bytes).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/tmp/jit-9.dump: byte offset 0: truncated file header (30 of 40 bytes)"
    );
    // A record claiming 8 bytes (less than its own header).
    let mut w = W::new(false, 9);
    w.load(1, 0x10, 1, "ok", &[0xc3]);
    let bad = w.out.len();
    w.u32(0);
    w.u32(8);
    w.u64(0);
    let e = JitDump::parse(p, w.out).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "/tmp/jit-9.dump: byte offset {bad}: record size 8 smaller than the record header (16)"
        )
    );
    // A load whose name runs to the end of the record.
    let mut w = W::new(false, 9);
    w.record(0, 1, |w| {
        w.u32(1);
        w.u32(1);
        w.u64(0x10);
        w.u64(0x10);
        w.u64(0);
        w.u64(1);
        w.out.extend_from_slice(b"no-nul");
    });
    let e = JitDump::parse(p, w.out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/tmp/jit-9.dump: byte offset 40: JIT_CODE_LOAD name is not NUL-terminated within the record"
    );
    // Code larger than the record.
    let mut w = W::new(false, 9);
    w.record(0, 1, |w| {
        w.u32(1);
        w.u32(1);
        w.u64(0x10);
        w.u64(0x10);
        w.u64(100);
        w.u64(1);
        w.out.extend_from_slice(b"f\0\xc3");
    });
    let e = JitDump::parse(p, w.out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/tmp/jit-9.dump: byte offset 40: JIT_CODE_LOAD code size 100 exceeds the 1 bytes left in the record"
    );
    // A move record too short for its fields.
    let mut w = W::new(false, 9);
    w.record(1, 1, |w| w.u64(1));
    let e = JitDump::parse(p, w.out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/tmp/jit-9.dump: byte offset 40: JIT_CODE_MOVE record of 24 bytes is too short"
    );
    // Debug entries running past the record.
    let mut w = W::new(false, 9);
    w.record(2, 1, |w| {
        w.u64(0x10);
        w.u64(2);
        w.u64(0x10);
        w.u32(1);
        w.u32(0);
        w.out.extend_from_slice(b"a.js\0");
    });
    let e = JitDump::parse(p, w.out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/tmp/jit-9.dump: byte offset 93: JIT_CODE_DEBUG_INFO entry 1 of 2 overruns the record"
    );
}

/// Real files: `node --perf-prof --perf-basic-prof` writes `jit-PID.dump` (in the working
/// directory) and `/tmp/perf-PID.map`.
#[test]
fn node_jitdump_and_perf_map() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("t.js");
    std::fs::write(
        &script,
        "function hotLoop(n){let s=0;for(let i=0;i<n;i++){s+=i*i%7;}return s;}\n\
         let t=0;for(let k=0;k<300;k++){t+=hotLoop(20000);}console.log(t);\n",
    )
    .unwrap();
    let out = std::process::Command::new("node")
        .args(["--perf-prof", "--perf-basic-prof", "t.js"])
        .current_dir(dir.path())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            println!(
                "SKIP: node --perf-prof failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return;
        }
        Err(e) => {
            println!("SKIP: node not installed ({e})");
            return;
        }
    };
    let dump = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("jit-"))
        });
    let Some(dump) = dump else {
        println!("SKIP: this node writes no jitdump");
        return;
    };
    let pid: u32 = dump
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix("jit-"))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let map_path = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let map = PerfMap::open(&map_path);
    let _ = std::fs::remove_file(&map_path);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "11999400");
    let d = JitDump::open(&dump).unwrap();
    assert_eq!(d.header.pid, pid);
    assert_eq!(d.header.elf_mach, 62);
    assert!(d.truncated().is_none());
    assert!(d.loads.len() > 100, "{} loads", d.loads.len());
    let hot = d
        .loads
        .iter()
        .find(|l| l.name.contains("hotLoop"))
        .expect("a load of hotLoop");
    assert!(hot.code_size > 0);
    assert_eq!(d.code(hot).len() as u64, hot.code_size);
    let h = d.lookup(hot.code_addr, Some(hot.timestamp)).unwrap();
    assert_eq!(h.name(), hot.name);
    // The perf map names the same code.
    let map = map.unwrap();
    assert!(map.truncated().is_none());
    let e = map
        .entries()
        .iter()
        .find(|e| e.start == hot.code_addr)
        .expect("hotLoop in the perf map");
    assert!(e.name.contains("hotLoop"), "{}", e.name);
    assert_eq!(e.size, hot.code_size);
}
