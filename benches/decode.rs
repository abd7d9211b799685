//! Decode throughput: our pipeline vs a bare C loop over libipt's block decoder
//! (benches/c/bare_block_loop.c, the same bundled libipt), and
//! parallel decode by PSB segments on 2 threads vs sequential. Prints figures and ratios.
//!
//! `cargo bench --bench decode [-- SIZE_MB]` (default 8 MB of PT). Ends with the memory
//! comparison (peak resident memory of the fast decoder against the libipt pipeline, each
//! in a process of its own); `-- --mem` runs that alone.

use std::ffi::CString;
use std::time::{Duration, Instant};

use drpttracer::decode::image::Backing;
use drpttracer::decode::parallel::{decode_parallel_compact, CHUNKS_PER_THREAD};
use drpttracer::decode::testgen::{CallProgram, CallTraceOptions, LoopProgram};
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{
    AddressSpace, DecoderKind, ImageResolver, PtDecoder, Record, TraceParams, WindowOptions,
};
use libipt_sys as sys;

/// Best and median of a set of timings.
#[derive(Clone, Copy)]
struct Stats {
    best: Duration,
    median: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats {
        best: v.first().copied().unwrap_or_default(),
        median: v.get(v.len() / 2).copied().unwrap_or_default(),
    }
}

/// Per-round ratios a[i] / b[i] of paired measurements.
struct Ratios(Vec<f64>);

fn paired(a: &[Duration], b: &[Duration]) -> Ratios {
    let mut v: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
        .collect();
    v.sort_by(f64::total_cmp);
    Ratios(v)
}

impl Ratios {
    fn text(&self) -> String {
        let v = &self.0;
        match (v.first(), v.get(v.len() / 2), v.last()) {
            (Some(lo), Some(med), Some(hi)) => {
                format!("{med:.2}x median of paired rounds (range {lo:.2}-{hi:.2}x)")
            }
            _ => "n/a".into(),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// CPU time of the calling thread (less disturbed by other load than wall time).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Thread CPU time of `f`.
fn cpu<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = thread_cpu();
    let r = f();
    (thread_cpu().saturating_sub(t), r)
}

/// What the C loop needs to know about libipt's ABI (see benches/c/bare_block_loop.c).
#[repr(C)]
struct BareLoopAbi {
    block: *mut sys::pt_block,
    block_size: usize,
    ninsn_offset: usize,
    event: *mut sys::pt_event,
    event_size: usize,
    status_event_pending: libc::c_int,
    status_eos: libc::c_int,
    error_eos: libc::c_int,
}

extern "C" {
    /// benches/c/bare_block_loop.c, compiled by build.rs and linked into the benches.
    fn pttracer_bench_bare_block_loop(
        dec: *mut sys::pt_block_decoder,
        abi: *const BareLoopAbi,
    ) -> u64;
}

/// The bare baseline: a ptxed-style C loop over libipt's block decoder (sync, drain events,
/// pt_blk_next, count instructions) on a decoder set up here.
fn bare_libipt(trace: &[u8], code_file: &CString, base: u64, code_len: u64) -> u64 {
    // SAFETY: plain C structs zero-initialised as libipt documents; the trace buffer and
    // the file name outlive the decoder, which is freed at the end of this function; the
    // C loop only uses the decoder and the buffers described by `abi`.
    unsafe {
        let mut cfg: sys::pt_config = std::mem::zeroed();
        cfg.size = std::mem::size_of::<sys::pt_config>();
        cfg.begin = trace.as_ptr().cast_mut();
        cfg.end = cfg.begin.add(trace.len());
        let dec = sys::pt_blk_alloc_decoder(&cfg);
        assert!(!dec.is_null());
        let img = sys::pt_blk_get_image(dec);
        let r =
            sys::pt_image_add_file(img, code_file.as_ptr(), 0, code_len, std::ptr::null(), base);
        assert_eq!(r, 0);
        let mut blk: sys::pt_block = std::mem::zeroed();
        let mut ev: sys::pt_event = std::mem::zeroed();
        let abi = BareLoopAbi {
            block: &mut blk,
            block_size: std::mem::size_of::<sys::pt_block>(),
            ninsn_offset: std::mem::offset_of!(sys::pt_block, ninsn),
            event: &mut ev,
            event_size: std::mem::size_of::<sys::pt_event>(),
            status_event_pending: sys::pt_status_flag_pts_event_pending as libc::c_int,
            status_eos: sys::pt_status_flag_pts_eos as libc::c_int,
            error_eos: sys::pt_error_code_pte_eos as libc::c_int,
        };
        let n = pttracer_bench_bare_block_loop(dec, &abi);
        sys::pt_blk_free_decoder(dec);
        n
    }
}

fn decoder<'a>(trace: &'a [u8], space: &AddressSpace) -> PtDecoder<'a> {
    PtDecoder::new(
        trace,
        TraceParams::default(),
        space.clone(),
        vec![],
        ImageResolver::default(),
        WindowOptions::default(),
    )
    .expect("decoder")
}

/// Consumes one record the way a tool would (count instructions, hash pc + first byte).
#[inline]
fn visit(r: &Record, n: &mut u64, h: &mut u64) {
    if let Record::Instruction(i) = r {
        *n += 1;
        *h = h.rotate_left(5) ^ i.pc ^ u64::from(i.bytes[0]);
    }
}

/// `visit` over a slice of records, the way a tool's hot loop would (totals in locals).
#[inline]
fn visit_slice(s: &[Record], n: &mut u64, h: &mut u64) {
    let (mut ln, mut lh) = (*n, *h);
    for r in s {
        visit(r, &mut ln, &mut lh);
    }
    (*n, *h) = (ln, lh);
}

/// Our pipeline through the record iterator (a copy per record).
fn ours_iter(trace: &[u8], space: &AddressSpace) -> (u64, u64) {
    let (mut n, mut h) = (0u64, 0u64);
    for r in decoder(trace, space) {
        visit(&r, &mut n, &mut h);
    }
    (n, h)
}

/// Our pipeline through `next_slice` (records visited in place).
fn ours_slices(trace: &[u8], space: &AddressSpace) -> (u64, u64) {
    let (mut n, mut h) = (0u64, 0u64);
    let mut dec = decoder(trace, space);
    while let Some(s) = dec.next_slice() {
        visit_slice(s, &mut n, &mut h);
    }
    (n, h)
}

/// Our pipeline through `for_each_slice` (records visited in place, internal iteration).
fn ours_each_slice(trace: &[u8], space: &AddressSpace) -> (u64, u64) {
    let (mut n, mut h) = (0u64, 0u64);
    decoder(trace, space).for_each_slice(|s| {
        visit_slice(s, &mut n, &mut h);
        std::ops::ControlFlow::<()>::Continue(())
    });
    (n, h)
}

/// Our pipeline through `Iterator::for_each` (a copy per record, internal iteration).
fn ours_for_each(trace: &[u8], space: &AddressSpace) -> (u64, u64) {
    let (mut n, mut h) = (0u64, 0u64);
    decoder(trace, space).for_each(|r| visit(&r, &mut n, &mut h));
    (n, h)
}

/// Sequential decode keeping every record (compact form, as the parallel decoder does).
fn sequential_collect(trace: &[u8], space: &AddressSpace) -> usize {
    decoder(trace, space).collect_compact().len()
}

fn main() {
    let mb: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(8);
    let args: Vec<String> = std::env::args().collect();
    if let Some(k) = args.iter().position(|a| a == "--mem-child") {
        let arg = |i: usize| args.get(k + i).map_or("", String::as_str);
        mem_child(arg(1), arg(2), arg(3), mb);
        return;
    }
    if args.iter().any(|a| a == "--mem") {
        memory_peaks(mb);
        return;
    }
    // For profilers: the many-window case's directory decode or its one-trace decode
    // alone (the traced run happens outside the profiled loop's count only in time).
    for (flag, which) in [("--profile-many-dir", true), ("--profile-many-one", false)] {
        if args.iter().any(|a| a == flag) {
            many_windows(Some(which));
            return;
        }
    }
    let prog = LoopProgram::new(0x40_0000);
    let t = Instant::now();
    let (trace, _) = prog.trace(mb << 20, 4096, 42);
    eprintln!(
        "generated {} bytes of PT in {:.2?}",
        trace.len(),
        t.elapsed()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let code_path = dir.path().join("loop.bin");
    std::fs::write(&code_path, &prog.code).expect("write code");
    let code_c = CString::new(code_path.to_str().expect("utf-8 path")).expect("path");
    let mut space = AddressSpace::new();
    let backing = Backing::map_file(&code_path).expect("map code");
    space.add_file_range(backing, 0, prog.code.len() as u64, prog.base);

    let opts = WindowOptions::default();
    let par = |threads: usize| {
        decode_parallel_compact(
            &trace,
            &TraceParams::default(),
            &space,
            &[],
            &ImageResolver::default(),
            &opts,
            threads,
        )
        .expect("parallel decode")
        .iter()
        .map(|c| c.len())
        .sum::<usize>()
    };
    // For profilers (perf, callgrind): one variant only, PROFILE_RUNS times (default 10);
    // `--profile-none` measures the set-up alone.
    let bare = || bare_libipt(&trace, &code_c, prog.base, prog.code.len() as u64);
    let hw_trace = if args.iter().any(|a| a.starts_with("--profile-hw")) {
        prog.trace_hw(trace.len(), 4096, 8, 42).0
    } else {
        Vec::new()
    };
    let profiles: [(&str, &dyn Fn()); 11] = [
        ("--profile-none", &|| {}),
        ("--profile-bare", &|| {
            std::hint::black_box(bare());
        }),
        ("--profile-iter", &|| {
            std::hint::black_box(ours_iter(&trace, &space));
        }),
        ("--profile-slices", &|| {
            std::hint::black_box(ours_slices(&trace, &space));
        }),
        ("--profile-each-slice", &|| {
            std::hint::black_box(ours_each_slice(&trace, &space));
        }),
        ("--profile-for-each", &|| {
            std::hint::black_box(ours_for_each(&trace, &space));
        }),
        ("--profile-seq", &|| {
            std::hint::black_box(sequential_collect(&trace, &space));
        }),
        ("--profile-par1", &|| {
            std::hint::black_box(par(1));
        }),
        ("--profile-par2", &|| {
            std::hint::black_box(par(2));
        }),
        ("--profile-hw", &|| {
            std::hint::black_box(ours_each_slice(&hw_trace, &space));
        }),
        ("--profile-hw-bare", &|| {
            std::hint::black_box(bare_libipt(
                &hw_trace,
                &code_c,
                prog.base,
                prog.code.len() as u64,
            ));
        }),
    ];
    if let Some((_, f)) = profiles
        .iter()
        .find(|(flag, _)| std::env::args().any(|a| a == *flag))
    {
        let runs: usize = std::env::var("PROFILE_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10);
        for _ in 0..runs {
            f();
        }
        return;
    }
    let runs = 15;
    // Interleaved rounds, thread CPU time of each (the machine is shared). Each round
    // measures every variant once, so the per-round ratios are paired measurements; their
    // median is the headline figure (robust against load that comes and goes).
    type Variant<'v> = (&'v str, &'v str, &'v dyn Fn() -> (u64, u64));
    let variants: [Variant; 4] = [
        (
            "for_each_slice()",
            "records visited in place, internal iteration",
            &|| ours_each_slice(&trace, &space),
        ),
        ("next_slice()", "records visited in place", &|| {
            ours_slices(&trace, &space)
        }),
        (
            "Iterator::for_each",
            "a copy per record, internal iteration",
            &|| ours_for_each(&trace, &space),
        ),
        ("Iterator::next", "a copy per record (for loop)", &|| {
            ours_iter(&trace, &space)
        }),
    ];
    // Each variant is measured next to its own run of the bare loop, the order of the
    // two alternating from round to round (drift in the machine's speed cancels out).
    let mut t_bare: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut n_bare = 0;
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut results = vec![(0, 0); variants.len()];
    for round in 0..runs {
        for (k, (_, _, f)) in variants.iter().enumerate() {
            let mut measure_bare = || {
                let (t, n) = cpu(bare);
                t_bare[k].push(t);
                n_bare = n;
            };
            if round % 2 == 0 {
                measure_bare();
            }
            let (t, r) = cpu(f);
            times[k].push(t);
            results[k] = r;
            if round % 2 == 1 {
                measure_bare();
            }
        }
    }
    let n_ours = results[0].0;
    assert!(
        results.iter().all(|r| *r == results[0]),
        "variants visited different records: {results:?}"
    );
    assert_eq!(
        n_ours, n_bare,
        "pipeline and bare libipt count different instructions"
    );
    let rate = |n: u64, t: Duration| n as f64 / t.as_secs_f64() / 1e6;
    println!(
        "trace: {} MB PT, {} instructions",
        trace.len() >> 20,
        n_ours
    );
    println!("single thread ({runs} interleaved rounds, thread CPU time; best / median):");
    let s_bare = stats(t_bare.concat());
    println!(
        "bare C libipt block loop      : {:>7.1} / {:>7.1} ms  {:>6.1} M insn/s  (count only)",
        ms(s_bare.best),
        ms(s_bare.median),
        rate(n_bare, s_bare.best),
    );
    for ((name, what, _), t) in variants.iter().zip(&times) {
        let st = stats(t.clone());
        println!(
            "pipeline, {name:<20}: {:>7.1} / {:>7.1} ms  {:>6.1} M insn/s  ({what})",
            ms(st.best),
            ms(st.median),
            rate(n_ours, st.best),
        );
    }
    println!("ratio pipeline / bare (goal >= 0.9x):");
    for (((name, _, _), t), b) in variants.iter().zip(&times).zip(&t_bare) {
        println!("  {name:<20}: {}", paired(b, t).text());
    }

    // What real hardware adds (PIP and VMCS in every PSB+, interrupts: FUP, PAD, TIP.PGD,
    // MODE.Exec, TIP.PGE): decoded by the fast decoder itself, against the bare loop.
    {
        let (hw, bits) = prog.trace_hw(trace.len(), 4096, 8, 42);
        let mut d = decoder(&hw, &space);
        let mut pcs = Vec::new();
        d.for_each_slice(|s| {
            pcs.extend(s.iter().filter_map(|r| r.as_instruction()).map(|i| i.pc));
            std::ops::ControlFlow::<()>::Continue(())
        });
        assert_eq!(d.decoded_by(), ("fast", None), "hardware-pattern stream");
        let want = prog.simulate(&bits);
        assert_eq!(
            pcs[..],
            want[..pcs.len()],
            "hardware-pattern stream: not the oracle's"
        );
        drop(pcs);
        let bare_hw = || bare_libipt(&hw, &code_c, prog.base, prog.code.len() as u64);
        let (mut tb, mut to) = (Vec::new(), Vec::new());
        let (mut nb, mut no) = (0, 0);
        for round in 0..runs {
            if round % 2 == 0 {
                let (t, n) = cpu(bare_hw);
                tb.push(t);
                nb = n;
            }
            let (t, r) = cpu(|| ours_each_slice(&hw, &space));
            to.push(t);
            no = r.0;
            if round % 2 == 1 {
                let (t, n) = cpu(bare_hw);
                tb.push(t);
                nb = n;
            }
        }
        assert_eq!(
            no, nb,
            "hardware-pattern stream: different instruction counts"
        );
        // (Every PSB+ has a MODE.Exec; the others come back from an interrupt.)
        let psbs = hw
            .windows(16)
            .filter(|p| p == &pttrace_encoder::packet::PSB)
            .count();
        let interrupts = hw.windows(2).filter(|p| p == &[0x99, 0x01]).count() - psbs;
        println!(
            "hardware patterns ({} MB PT, {no} instructions, PIP+VMCS in every PSB+, about \
             {interrupts} interrupts as FUP/PAD/TIP.PGD ... MODE.Exec/TIP.PGE), decoded by \
             the fast decoder: {:.1} vs bare {:.1} ms (medians); bare / fast {}",
            hw.len() >> 20,
            ms(stats(to.clone()).median),
            ms(stats(tb.clone()).median),
            paired(&tb, &to).text()
        );
    }

    // What this machine gives any PT decoder on 2 threads: bare libipt over the same PSB
    // segments as the 2-thread pipeline (no output), 1 thread vs 2 threads (one half each).
    let segs = drpttracer::decode::parallel::split_at_psbs(&trace, 2 * CHUNKS_PER_THREAD);
    let bare_segs = |threads: usize| {
        let per = segs.len().div_ceil(threads);
        std::thread::scope(|s| {
            let hs: Vec<_> = segs
                .chunks(per)
                .map(|part| {
                    let (trace, code_c, prog) = (&trace, &code_c, &prog);
                    s.spawn(move || {
                        part.iter()
                            .map(|seg| {
                                bare_libipt(
                                    &trace[seg.start..seg.end],
                                    code_c,
                                    prog.base,
                                    prog.code.len() as u64,
                                )
                            })
                            .sum::<u64>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum::<u64>()
        })
    };
    let wall = |f: &mut dyn FnMut() -> usize| {
        let t = Instant::now();
        let n = f();
        (t.elapsed(), n)
    };
    let (mut t_seq, mut t1, mut t2, mut tb1, mut tb2) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut n_seq = 0;
    // Paired measurements back to back, their order alternating from round to round.
    let pair = |round: usize, a: &mut dyn FnMut() -> usize, b: &mut dyn FnMut() -> usize| {
        if round % 2 == 0 {
            let ra = wall(a);
            (ra, wall(b))
        } else {
            let rb = wall(b);
            (wall(a), rb)
        }
    };
    for round in 0..runs {
        let ((ts, n), (tp, n2)) = pair(
            round,
            &mut || sequential_collect(&trace, &space),
            &mut || par(2),
        );
        t_seq.push(ts);
        t2.push(tp);
        n_seq = n;
        let (t, n1) = wall(&mut || par(1));
        t1.push(t);
        assert_eq!(n_seq, n1, "parallel and sequential record counts differ");
        assert_eq!(n_seq, n2, "parallel and sequential record counts differ");
        let ((b1, _), (b2, _)) = pair(round, &mut || bare_segs(1) as usize, &mut || {
            bare_segs(2) as usize
        });
        tb1.push(b1);
        tb2.push(b2);
    }
    let speedup = paired(&t_seq, &t2);
    let machine = paired(&tb1, &tb2);
    let (s_seq, s1, s2) = (stats(t_seq), stats(t1), stats(t2));
    println!("parallel ({runs} interleaved rounds, wall time; best / median):");
    println!(
        "sequential, all kept     : {:>7.1} / {:>7.1} ms   ({} records)",
        ms(s_seq.best),
        ms(s_seq.median),
        n_seq
    );
    println!(
        "PSB-parallel, 1 thread   : {:>7.1} / {:>7.1} ms   ({} segments: the cost of cutting the trace)",
        ms(s1.best),
        ms(s1.median),
        drpttracer::decode::parallel::split_at_psbs(&trace, CHUNKS_PER_THREAD).len()
    );
    println!(
        "PSB-parallel, 2 threads  : {:>7.1} / {:>7.1} ms",
        ms(s2.best),
        ms(s2.median)
    );
    println!(
        "2-thread speed-up        : {}   (goal >= 1.8x; {} CPUs online)",
        speedup.text(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "machine scaling          : {}   (bare libipt, same segments, no output, 1 vs 2 threads)",
        machine.text()
    );
    many_windows(None);
    memory_peaks(mb);
}

/// A trace of the memory comparison, its image and parameters: `loop`, the benchmark's
/// loop trace (`mb` MB), or `calls`, a generated trace of 10 M instructions over 16 images
/// whose functions call each other (return compression, timing packets).
fn mem_trace(which: &str, mb: usize) -> (Vec<u8>, AddressSpace, TraceParams) {
    let mut space = AddressSpace::new();
    if which == "loop" {
        let prog = LoopProgram::new(0x40_0000);
        space.add_bytes("loop", prog.code.clone(), prog.base);
        return (
            prog.trace(mb << 20, 4096, 42).0,
            space,
            TraceParams::default(),
        );
    }
    let prog = CallProgram::new(0x40_0000, 16, 8);
    let t = prog.trace(CallTraceOptions {
        ret_compression: true,
        timing: true,
        psb_every: 4096,
        min_insns: 10_000_000,
        seed: 0x5eed,
    });
    let params = TraceParams {
        cpu: CallProgram::timed_cpu(),
        time: Some(drpttracer::metadata::TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    (t.pt, prog.space(), params)
}

/// A field of /proc/self/status in kB.
fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One measurement of the memory comparison, in this process: the trace made, the heap
/// given back, the peak reset; then one decode; prints the peak resident memory above
/// where it started, then the anonymous and the file-backed resident memory above where
/// they started, read while the decode's decoder and output are still alive (in kB).
fn mem_child(which: &str, variant: &str, kind: &str, mb: usize) {
    let (trace, space, params) = mem_trace(which, mb);
    let kind: DecoderKind = kind.parse().expect("decoder kind");
    // SAFETY: malloc_trim only returns free heap memory to the system.
    unsafe { libc::malloc_trim(0) };
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak (clear_refs)");
    let base = status_kb("VmRSS");
    let (anon, file) = (status_kb("RssAnon"), status_kb("RssFile"));
    let opts = WindowOptions {
        decoder: kind,
        ..Default::default()
    };
    let dec = || {
        PtDecoder::new(
            &trace,
            params,
            space.clone(),
            vec![],
            ImageResolver::default(),
            opts.clone(),
        )
        .expect("decoder")
    };
    // (Read while what the decode made is alive.)
    let after = || {
        (
            status_kb("RssAnon").saturating_sub(anon),
            status_kb("RssFile").saturating_sub(file),
        )
    };
    let (n, (anon, file)) = match variant {
        "stream" => {
            let mut d = dec();
            let mut n = 0;
            while let Some(s) = d.next_slice() {
                n += s.len();
            }
            (n, after())
        }
        "compact" => {
            let c = dec().collect_compact();
            (c.len(), after())
        }
        _ => {
            let c = decode_parallel_compact(
                &trace,
                &params,
                &space,
                &[],
                &ImageResolver::default(),
                &opts,
                2,
            )
            .expect("parallel decode");
            (c.iter().map(|c| c.len()).sum::<usize>(), after())
        }
    };
    std::hint::black_box(n);
    println!("{} {anon} {file}", status_kb("VmHWM").saturating_sub(base));
}

/// Peak memory of the fast decoder against the libipt pipeline (the decoder before it),
/// each decode in a process of its own (median of 5), for a streamed decode (records
/// visited, none kept), a sequential decode keeping every record (compact) and PSB-parallel
/// decode on 2 threads. Goal: the fast decoder's peak no more than the libipt pipeline's.
/// Split as well into the anonymous memory the decode adds (its heap and stacks) and the
/// file-backed pages it touches (the program's own code: the two decoders run different
/// code), each read after the decode.
fn memory_peaks(mb: usize) {
    let exe = std::env::current_exe().expect("this benchmark's path");
    let peak = |which: &str, variant: &str, kind: &str| {
        let runs: Vec<[u64; 3]> = (0..5)
            .map(|_| {
                let o = std::process::Command::new(&exe)
                    .args(["--mem-child", which, variant, kind, &mb.to_string()])
                    .output()
                    .expect("run the measuring process");
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                let out = String::from_utf8_lossy(&o.stdout);
                let mut v = out.split_whitespace().map(|x| x.parse().unwrap_or(0));
                [(); 3].map(|_| v.next().unwrap_or(0))
            })
            .collect();
        [0, 1, 2].map(|k| {
            let mut v: Vec<u64> = runs.iter().map(|r| r[k]).collect();
            v.sort_unstable();
            v[2]
        })
    };
    println!();
    println!(
        "memory: peak resident memory of the decode (kB above the process's start, median of 5); \
         of it, after the decode: anonymous (heap, stacks) and file-backed (code pages touched)"
    );
    println!(
        "  trace  decode                  libipt pipeline   fast decoder   fast / libipt (goal <= 1.0)   anonymous: libipt / fast    file-backed: libipt / fast"
    );
    for which in ["loop", "calls"] {
        for (variant, what) in [
            ("stream", "streamed (next_slice)"),
            ("compact", "all kept (compact)"),
            ("parallel", "PSB-parallel, 2 thr."),
        ] {
            let [l, la, lf] = peak(which, variant, "libipt");
            let [f, fa, ff] = peak(which, variant, "fast");
            println!(
                "  {which:<6} {what:<23} {l:>12} kB {f:>11} kB   {:.2}                          \
                 {la:>7} / {fa:>7} kB ({:.2})   {lf:>5} / {ff:>5} kB",
                f as f64 / l.max(1) as f64,
                fa as f64 / la.max(1) as f64
            );
        }
    }
}

/// Instructions of `dec` (every record visited in place).
fn count_insns(dec: &mut PtDecoder<'_>) -> u64 {
    let mut n = 0u64;
    dec.for_each_slice(|s| {
        n += s.iter().filter(|r| r.as_instruction().is_some()).count() as u64;
        std::ops::ControlFlow::<()>::Continue(())
    });
    n
}

/// A real trace directory with hundreds of windows (`python3 -c pass` under the QEMU
/// backend) decoded window by window as `pttrace decode DIR` does, against the same PT
/// bytes concatenated into one trace with one decoder and the same image. Needs
/// qemu-x86_64 and the plugin (`cargo build --release -p pttrace-qemu`). `profile`: only
/// the directory decode (true) or the one-trace decode (false), PROFILE_RUNS times.
fn many_windows(profile: Option<bool>) {
    use drpttracer::decode::ptt_dir;
    use drpttracer::decode::ptt_input::{read_thread, read_windows};
    use drpttracer::decode::sideband::parse_records;
    let plugin =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libpttrace_qemu.so");
    if !plugin.is_file() {
        println!(
            "SKIP many-window case: {} not built (cargo build --release -p pttrace-qemu)",
            plugin.display()
        );
        return;
    }
    let pttrace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/pttrace");
    if !pttrace.is_file() {
        println!(
            "SKIP many-window case: {} not built (cargo build --release -p pttrace-cli)",
            pttrace.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("py");
    let o = std::process::Command::new(&pttrace)
        .args([
            "run",
            "--backend",
            "qemu",
            "--mode",
            "user",
            "--window",
            "thread",
        ])
        .arg("--qemu-plugin")
        .arg(&plugin)
        .arg("--out")
        .arg(&out)
        .args(["--", "/usr/bin/python3", "-c", "pass"])
        .output()
        .expect("run pttrace");
    if !o.status.success() {
        println!(
            "SKIP many-window case: pttrace run failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        return;
    }
    let trace = ptt_dir::open(&out).expect("trace directory");
    let th = trace
        .threads
        .iter()
        .max_by_key(|t| std::fs::metadata(&t.path).map_or(0, |m| m.len()))
        .expect("a thread");
    // The concatenation: every window's PT, and one image with every window's code.
    let input = read_thread(&th.path).expect("thread file");
    let name = th.path.display().to_string();
    let windows = read_windows(&name, &input.data).expect("windows");
    let mut img = trace.thread_image(th);
    let mut whole = Vec::new();
    for w in &windows {
        whole.extend_from_slice(w.pt);
        let evs = parse_records(
            &name,
            w.sideband,
            drpttracer::sideband::record::SIDEBAND_SAMPLE_TYPE,
        )
        .expect("sideband");
        img.resolver
            .apply_window(&mut img.space, &evs, &mut img.warnings);
    }
    if let Some(dir) = profile {
        let runs: usize = std::env::var("PROFILE_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10);
        for _ in 0..runs {
            if dir {
                trace
                    .decode_thread(th, &mut |_, dec| {
                        if let Some(d) = dec {
                            std::hint::black_box(count_insns(d));
                        }
                        Ok(())
                    })
                    .expect("decode");
            } else {
                let mut dec = PtDecoder::new(
                    &whole,
                    img.params,
                    img.space.clone(),
                    Vec::new(),
                    img.resolver.clone(),
                    WindowOptions::default(),
                )
                .expect("decoder");
                std::hint::black_box(count_insns(&mut dec));
            }
        }
        return;
    }
    let (mut t_dir, mut t_one) = (Vec::new(), Vec::new());
    let (mut n_dir, mut n_one) = (0, 0);
    for _ in 0..5 {
        let t = Instant::now();
        let mut n = 0u64;
        trace
            .decode_thread(th, &mut |_, dec| {
                if let Some(d) = dec {
                    n += count_insns(d);
                }
                Ok(())
            })
            .expect("decode");
        t_dir.push(t.elapsed());
        n_dir = n;
        let t = Instant::now();
        let mut dec = PtDecoder::new(
            &whole,
            img.params,
            img.space.clone(),
            Vec::new(),
            img.resolver.clone(),
            WindowOptions::default(),
        )
        .expect("decoder");
        n_one = count_insns(&mut dec);
        t_one.push(t.elapsed());
    }
    let rate = paired(&t_one, &t_dir);
    let (sd, so) = (stats(t_dir), stats(t_one));
    println!();
    println!(
        "many windows: python3 -c pass under QEMU, {} windows, {} PT bytes",
        windows.len(),
        whole.len()
    );
    println!(
        "window by window (decode DIR): {:>7.1} / {:>7.1} ms  {n_dir} instructions, {:.1} M insn/s",
        ms(sd.best),
        ms(sd.median),
        n_dir as f64 / sd.median.as_secs_f64() / 1e6
    );
    println!(
        "one concatenated trace       : {:>7.1} / {:>7.1} ms  {n_one} instructions, {:.1} M insn/s",
        ms(so.best),
        ms(so.median),
        n_one as f64 / so.median.as_secs_f64() / 1e6
    );
    println!(
        "many-window rate / single-trace rate: {} (goal >= 0.8x)",
        rate.text()
    );
}
