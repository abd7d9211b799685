//! The emulated PT backend end to end: real windows of this process are single-stepped,
//! encoded to PT, decoded again with libipt over our own memory, and compared with both the
//! sequence the emulator observed and what the traced code is known to do.
//!
//! Every test traces only its own thread, so the harness may run them in parallel.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use drpttracer::emu::{self, oracle, WindowReport};
use drpttracer::sideband::record::{Record, RecordIter, SIDEBAND_SAMPLE_TYPE};
use drpttracer::{BackendChoice, BackendKind, Mode, OutputBuffers, Status, Tracer, TracerConfig};
use iced_x86::{Decoder, DecoderOptions, Mnemonic};

fn tracer(pt_shift: u32) -> Tracer {
    Tracer::new(TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: pt_shift,
        sideband_size_shift: 4,
        backend: BackendChoice::Emulated,
    })
    .expect("emulated tracer")
}

/// Runs `f` inside one window; returns its result, the window's status, the output and the
/// emulator's report.
fn trace<R>(
    t: &mut Tracer,
    out: &mut OutputBuffers,
    f: impl FnOnce() -> R,
) -> (R, Status, WindowReport) {
    emu::keep_observed_ips(true);
    t.start().expect("start");
    let r = f();
    let cap = t.stop(out).expect("stop");
    let rep = emu::take_last_window().expect("window report");
    (r, cap.status(), rep)
}

/// Decodes and checks the oracle: libipt reproduces exactly what the emulator observed.
fn decode_exact(out: &OutputBuffers, rep: &WindowReport) -> oracle::OracleDecode {
    let d = oracle::decode_own_memory(out.pt_data()).expect("decode");
    assert!(d.errors.is_empty(), "decode errors: {:?}", d.errors);
    let ips = rep.ips.as_ref().expect("observed ips");
    assert_eq!(ips.len() as u64, rep.instructions);
    if d.ips != *ips {
        let n = d.ips.len().min(ips.len());
        let at = (0..n).find(|&i| d.ips[i] != ips[i]).unwrap_or(n);
        panic!(
            "decoded {} instructions, observed {}; first difference at {at}",
            d.ips.len(),
            ips.len()
        );
    }
    assert_eq!(rep.gaps, 0, "unexplained transfers in the window");
    d
}

fn count(ips: &[u64], ip: u64) -> usize {
    ips.iter().filter(|&&x| x == ip).count()
}

fn mnemonic_at(ip: u64) -> Mnemonic {
    let mut b = [0u8; 15];
    let n = emu::encode::read_self(ip, &mut b);
    Decoder::with_ip(64, &b[..n], ip, DecoderOptions::NONE)
        .decode()
        .mnemonic()
}

// ---- a function with known control flow ----

#[inline(never)]
fn on_odd(x: u64) -> u64 {
    std::hint::black_box(x * 3)
}

#[inline(never)]
fn leaf_a(x: u64) -> u64 {
    std::hint::black_box(x + 1)
}
#[inline(never)]
fn leaf_b(x: u64) -> u64 {
    std::hint::black_box(x + 2)
}
#[inline(never)]
fn leaf_c(x: u64) -> u64 {
    std::hint::black_box(x + 3)
}

#[inline(never)]
fn recurse(depth: u32) -> u64 {
    if depth == 0 {
        return 1;
    }
    std::hint::black_box(recurse(depth - 1)) + 1
}

const DATA: [u64; 9] = [4, 7, 1, 8, 9, 12, 15, 2, 3];
const ORDER: [usize; 7] = [2, 0, 1, 1, 2, 0, 2];
const DEPTH: u32 = 6;

#[inline(never)]
fn known_flow(data: &[u64], order: &[usize], table: &[fn(u64) -> u64; 3]) -> u64 {
    let mut s = 0u64;
    for &x in data {
        if x % 2 == 1 {
            s += on_odd(x);
        } else {
            s += x;
        }
    }
    for &k in order {
        s = table[k](s);
    }
    s += recurse(DEPTH);
    let msg = b"emulated\0";
    // SAFETY: NUL-terminated byte string.
    s += unsafe { libc::strlen(msg.as_ptr().cast()) } as u64;
    // SAFETY: getppid has no preconditions.
    s += unsafe { libc::getppid() } as u64 & 1;
    s
}

fn libc_ranges() -> Vec<(u64, u64)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("libc.so") && l.split_whitespace().nth(1).unwrap().contains('x'))
        .map(|l| {
            let r = l.split_whitespace().next().unwrap();
            let (a, b) = r.split_once('-').unwrap();
            (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            )
        })
        .collect()
}

#[test]
fn known_control_flow_decodes_exactly() {
    let mut t = tracer(6);
    let mut out = OutputBuffers::new(6, 4).unwrap();
    assert_eq!(t.backend_kind(), BackendKind::Emulated);
    let table: [fn(u64) -> u64; 3] = [leaf_a, leaf_b, leaf_c];
    let data = std::hint::black_box(DATA);
    let order = std::hint::black_box(ORDER);
    let (r, status, rep) = trace(&mut t, &mut out, || known_flow(&data, &order, &table));
    assert_eq!(status, Status::Success);
    let expect = known_flow(&DATA, &ORDER, &table);
    assert_eq!(r, expect);

    let d = decode_exact(&out, &rep);
    let ips = &d.ips;
    // Exact iteration counts: on_odd ran once per odd element.
    let odd = DATA.iter().filter(|x| *x % 2 == 1).count();
    assert_eq!(count(ips, on_odd as *const () as u64), odd);
    // Indirect calls: the table targets were entered in ORDER.
    let entries = [
        leaf_a as *const () as u64,
        leaf_b as *const () as u64,
        leaf_c as *const () as u64,
    ];
    let seen: Vec<usize> = ips
        .iter()
        .filter_map(|ip| entries.iter().position(|e| e == ip))
        .collect();
    assert_eq!(seen, ORDER.to_vec());
    // Recursion: DEPTH + 1 activations, and as many returns out of `recurse`.
    let rec = recurse as *const () as u64;
    assert_eq!(count(ips, rec), DEPTH as usize + 1);
    // The libc call ran inside libc.
    let libc = libc_ranges();
    assert!(
        ips.iter()
            .any(|ip| libc.iter().any(|(a, b)| ip >= a && ip < b)),
        "no instruction of libc in the trace"
    );
    // The syscall: a `syscall` instruction followed by a disable and a re-enable right after it.
    let sys: Vec<usize> = (0..ips.len())
        .filter(|&i| mnemonic_at(ips[i]) == Mnemonic::Syscall)
        .collect();
    assert!(!sys.is_empty(), "no syscall instruction in the trace");
    for &i in &sys {
        assert!(
            d.events
                .iter()
                .any(|e| matches!(e, oracle::OracleEvent::Disabled { index } if *index == i + 1)),
            "no disable after the syscall at instruction {i}"
        );
        assert_eq!(
            ips[i + 1],
            ips[i] + 2,
            "execution resumes after the syscall"
        );
    }
    assert_eq!(rep.far_transfers as usize, sys.len());
    // The trace ends with an asynchronous disable at the next instruction.
    assert!(matches!(
        d.events.last(),
        Some(oracle::OracleEvent::AsyncDisabled { index, .. }) if *index == ips.len()
    ));
    // Reusing the handle: a second window decodes too.
    let (_, status, rep2) = trace(&mut t, &mut out, || leaf_b(std::hint::black_box(1)));
    assert_eq!(status, Status::Success);
    let d2 = decode_exact(&out, &rep2);
    assert_eq!(count(&d2.ips, leaf_b as *const () as u64), 1);
}

// ---- an assembly loop with an exactly known instruction count ----

/// Runs `n` iterations of dec/jnz; returns the address of the `dec`.
#[inline(never)]
fn asm_loop(n: u64) -> u64 {
    let dec_at: u64;
    // SAFETY: register-only loop; clobbers only the declared registers and flags.
    unsafe {
        core::arch::asm!(
            "lea {at}, [rip + 3f]",
            "3:",
            "dec {cnt}",
            "jnz 3b",
            at = out(reg) dec_at,
            cnt = inout(reg) n => _,
        );
    }
    dec_at
}

#[test]
fn asm_loop_count_is_exact() {
    const N: u64 = 1000;
    let mut t = tracer(6);
    let mut out = OutputBuffers::new(6, 4).unwrap();
    let (dec_at, status, rep) = trace(&mut t, &mut out, || asm_loop(std::hint::black_box(N)));
    assert_eq!(status, Status::Success);
    let d = decode_exact(&out, &rep);
    assert_eq!(mnemonic_at(dec_at), Mnemonic::Dec);
    let dec_len = {
        let mut b = [0u8; 15];
        let n = emu::encode::read_self(dec_at, &mut b);
        Decoder::with_ip(64, &b[..n], dec_at, DecoderOptions::NONE)
            .decode()
            .len() as u64
    };
    let jnz_at = dec_at + dec_len;
    assert_eq!(mnemonic_at(jnz_at), Mnemonic::Jne);
    assert_eq!(count(&d.ips, dec_at), N as usize);
    assert_eq!(count(&d.ips, jnz_at), N as usize);
    // The loop body is one contiguous run of 2N instructions.
    let first = d.ips.iter().position(|&ip| ip == dec_at).unwrap();
    assert!(d.ips[first..first + 2 * N as usize]
        .chunks(2)
        .all(|c| c == [dec_at, jnz_at]));
    assert_ne!(d.ips[first + 2 * N as usize], dec_at);
    // The PT starts with a PSB and carries exactly N TNT bits for this loop (the bits of
    // other conditional branches in the window are counted from the decoded sequence).
    assert_eq!(&out.pt_data()[..16], &[0x02, 0x82].repeat(8)[..]);
    let cond_in_window = d
        .ips
        .iter()
        .filter(|&&ip| {
            let mut b = [0u8; 15];
            let n = emu::encode::read_self(ip, &mut b);
            Decoder::with_ip(64, &b[..n], ip, DecoderOptions::NONE)
                .decode()
                .flow_control()
                == iced_x86::FlowControl::ConditionalBranch
        })
        .count();
    assert_eq!(tnt_bits(out.pt_data()), cond_in_window);
    assert!(cond_in_window >= N as usize);
}

/// Total TNT bits in a PT buffer (short and long TNT packets), using libipt's packet decoder.
fn tnt_bits(pt: &[u8]) -> usize {
    use libipt::enc_dec_builder::EncoderDecoderBuilder;
    use libipt::packet::{Packet, PacketDecoder};
    let mut buf = pt.to_vec();
    // SAFETY: buf outlives the decoder.
    let mut dec: PacketDecoder<()> = unsafe {
        EncoderDecoderBuilder::<PacketDecoder<()>>::new()
            .buffer_from_raw(buf.as_mut_ptr(), buf.len())
    }
    .build()
    .unwrap();
    dec.sync_forward().unwrap();
    let mut bits = 0;
    while let Ok(p) = dec.decode_next() {
        match p {
            Packet::Tnt8(t) => bits += t.bitsize() as usize,
            Packet::Tnt64(t) => bits += t.bitsize() as usize,
            _ => {}
        }
    }
    bits
}

// ---- concurrent threads, each with its own handle ----

#[test]
fn concurrent_threads_decode_exactly() {
    const THREADS: usize = 3;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|k| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut t = tracer(6);
                let mut out = OutputBuffers::new(6, 4).unwrap();
                let n = 200 + 100 * k as u64;
                barrier.wait();
                let (dec_at, status, rep) = trace(&mut t, &mut out, || {
                    let at = asm_loop(std::hint::black_box(n));
                    let data: Vec<u64> = (0..(5 + k as u64)).collect();
                    let table: [fn(u64) -> u64; 3] = [leaf_a, leaf_b, leaf_c];
                    let order = [k % 3, (k + 1) % 3];
                    known_flow(&data, &order, &table);
                    at
                });
                assert_eq!(status, Status::Success);
                let d = decode_exact(&out, &rep);
                assert_eq!(count(&d.ips, dec_at), n as usize);
                let odd = (0..(5 + k as u64)).filter(|x| x % 2 == 1).count();
                assert_eq!(count(&d.ips, on_odd as *const () as u64), odd);
                d.ips.len()
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().expect("tracing thread") > 0);
    }
}

// ---- signals delivered mid-window ----

static USR1_HITS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_usr1(_sig: libc::c_int) {
    USR1_HITS.fetch_add(1, Ordering::SeqCst);
}

fn install_usr1() {
    // SAFETY: a plain handler that only touches an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

#[inline(never)]
fn spin_until(hits: u32) -> u64 {
    let mut n = 0u64;
    while USR1_HITS.load(Ordering::SeqCst) < hits {
        n = std::hint::black_box(n + 1);
    }
    n
}

#[test]
fn signals_mid_window_are_explicit_async_events() {
    install_usr1();
    let mut t = tracer(8);
    let mut out = OutputBuffers::new(8, 4).unwrap();
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    USR1_HITS.store(0, Ordering::SeqCst);
    const ASYNC: u32 = 3;
    let sender = std::thread::spawn(move || {
        for i in 1..=ASYNC as usize {
            while s2.load(Ordering::SeqCst) < i {
                std::thread::yield_now();
            }
            // SAFETY: `me` is the traced thread, alive until this thread is joined.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
        }
    });
    let (_, status, rep) = trace(&mut t, &mut out, || {
        // One synchronous signal: raised by this thread (delivered on a syscall return).
        // SAFETY: raise is always safe to call.
        unsafe { libc::raise(libc::SIGUSR1) };
        // Then asynchronous ones from another thread while this one runs user code.
        for i in 1..=ASYNC {
            started.store(i as usize, Ordering::SeqCst);
            spin_until(1 + i);
        }
    });
    sender.join().unwrap();
    assert_eq!(status, Status::Success);
    assert_eq!(USR1_HITS.load(Ordering::SeqCst), 1 + ASYNC);
    let d = decode_exact(&out, &rep);
    assert_eq!(rep.signals, 1 + ASYNC, "one explicit event per handler run");
    // The handler was not stepped: its code never appears.
    assert_eq!(count(&d.ips, on_usr1 as *const () as u64), 0);
    // Every handler run is a disable followed by a re-enable that resumes the flow.
    let resumed = d
        .events
        .iter()
        .filter(|e| matches!(e, oracle::OracleEvent::Enabled { resumed: true, .. }))
        .count();
    assert!(resumed >= (1 + ASYNC) as usize);
    let async_dis = d
        .events
        .iter()
        .filter(|e| matches!(e, oracle::OracleEvent::AsyncDisabled { .. }))
        .count();
    // ASYNC signals in user code + the final stop (the raised one lands on a syscall return,
    // where tracing is already disabled by the syscall).
    assert!(async_dis > ASYNC as usize, "{async_dis} async disables");
}

// ---- a window larger than the buffer ----

#[test]
fn overlong_window_reports_overwritten_and_still_decodes() {
    // 2 pages of PT ring: 8192 steps at most; the loop needs 2 * 20000.
    let mut t = tracer(1);
    let mut out = OutputBuffers::new(4, 4).unwrap();
    let (dec_at, status, rep) = trace(&mut t, &mut out, || asm_loop(std::hint::black_box(20000)));
    assert_eq!(status, Status::OverwrittenPtTrace);
    assert!(rep.steps_overflowed);
    let d = decode_exact(&out, &rep);
    let n = count(&d.ips, dec_at);
    assert!(n > 1000 && n < 20000, "{n} iterations captured");
    assert!(out.pt_size > 0 && out.pt_size <= 2 * 4096);
    // Stepping stopped early: the thread is not stepped any more.
    let (_, status, rep) = trace(&mut t, &mut out, || asm_loop(std::hint::black_box(10)));
    assert_eq!(status, Status::Success);
    let d = decode_exact(&out, &rep);
    assert_eq!(count(&d.ips, dec_at), 10);
}

#[test]
fn output_smaller_than_window_is_reported_and_decodes() {
    let mut t = tracer(6);
    // The caller's PT buffer (1 page) is smaller than the handle's ring (64 pages).
    let mut out = OutputBuffers::new(1, 4).unwrap();
    let many = || {
        let mut s = 0;
        for i in 0..1500u64 {
            s += [leaf_a, leaf_b, leaf_c][(i % 3) as usize](i);
        }
        s
    };
    let (_, status, rep) = trace(&mut t, &mut out, many);
    assert_eq!(status, Status::FailedToReadPtData);
    assert!(rep.out_of_space);
    decode_exact(&out, &rep);
}

// ---- sideband and metadata ----

#[test]
fn sideband_has_synthesized_and_live_mmap2_and_metadata_is_emulated() {
    let mut t = tracer(4);
    let mut out = OutputBuffers::new(4, 4).unwrap();
    let page = 4096usize;
    let f = tempfile::tempfile().unwrap();
    f.set_len(page as u64).unwrap();
    let (addr, status, _rep) = trace(&mut t, &mut out, || {
        use std::os::fd::AsRawFd;
        // SAFETY: maps one page of our temp file, executable, unmapped below.
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        }
    });
    assert_eq!(status, Status::Success);
    assert_ne!(addr, libc::MAP_FAILED);
    let recs: Vec<_> = RecordIter::new(out.sideband_data(), SIDEBAND_SAMPLE_TYPE)
        .map(|r| r.expect("sideband parses").1)
        .collect();
    let this_exe = known_flow as *const () as u64;
    let mut synthesized_self = false;
    let mut live = false;
    for r in &recs {
        if let Record::Mmap2(m) = &r.record {
            if m.addr <= this_exe && this_exe < m.addr + m.len {
                synthesized_self = true;
            }
            if m.addr == addr as u64 && m.len == page as u64 {
                live = true;
            }
        }
    }
    // SAFETY: unmapping the page mapped above.
    unsafe { libc::munmap(addr, page) };
    assert!(synthesized_self, "no MMAP2 covering this test's code");
    assert!(
        live,
        "no MMAP2 record from the kernel for the mapping made in the window"
    );
    let m = t.ext_metadata();
    assert_eq!(m.backend, BackendKind::Emulated);
    assert!(m.time_zero_valid);
    assert_eq!(m.sideband_sample_type, SIDEBAND_SAMPLE_TYPE);
    let mult = m.base.time_mult;
    assert_ne!(mult, 0);
}

#[test]
fn kernel_modes_are_refused() {
    for mode in [Mode::KernelOnly, Mode::UserAndKernel] {
        let e = Tracer::new(TracerConfig {
            mode,
            pt_size_shift: 2,
            sideband_size_shift: 2,
            backend: BackendChoice::Emulated,
        })
        .unwrap_err();
        assert_eq!(e.status, Status::FailedToOpenPerfEvent);
        assert!(e.message.contains("kernel"), "{}", e.message);
    }
}

// ---- fork and threads created inside a window ----

#[test]
fn fork_and_thread_creation_inside_a_window() {
    let mut t = tracer(10);
    let mut out = OutputBuffers::new(10, 4).unwrap();
    let ((child_status, joined), status, rep) = trace(&mut t, &mut out, || {
        // SAFETY: the child only calls async-signal-safe _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: immediate exit of the child.
            unsafe { libc::_exit(7) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        let h = std::thread::spawn(|| leaf_c(std::hint::black_box(4)));
        let joined = h.join().unwrap();
        // posix_spawn: a vfork-style child sharing our memory (and TLS) until it execs.
        let spawned = std::process::Command::new("true").status().unwrap();
        assert!(spawned.success());
        (st, joined)
    });
    assert_eq!(status, Status::Success);
    // The child inherited TF, was not traced and exited normally (not killed by SIGTRAP).
    assert!(
        libc::WIFEXITED(child_status),
        "child status {child_status:#x}"
    );
    assert_eq!(libc::WEXITSTATUS(child_status), 7);
    assert_eq!(joined, 7);
    // The vfork-style child ran on our memory and TLS: its traps reached our handler, were
    // recognised as another thread's and its stepping was stopped.
    assert!(rep.foreign_traps >= 1, "{rep:?}");
    let d = decode_exact(&out, &rep);
    // The new thread's code is not in this thread's trace.
    assert_eq!(count(&d.ips, leaf_c as *const () as u64), 0);
}

// ---- periodic PSB+: every segment decodes on its own ----

#[test]
fn every_psb_segment_decodes_independently() {
    let mut t = tracer(8);
    let mut out = OutputBuffers::new(8, 4).unwrap();
    let table: [fn(u64) -> u64; 3] = [leaf_a, leaf_b, leaf_c];
    let (_, status, rep) = trace(&mut t, &mut out, || {
        let mut s = 0;
        for i in 0..1500u64 {
            s = table[(i % 3) as usize](s);
        }
        s
    });
    assert_eq!(status, Status::Success);
    let full = decode_exact(&out, &rep);
    let pt = out.pt_data();
    let pattern = [0x02u8, 0x82].repeat(8);
    let psbs: Vec<usize> = (0..pt.len().saturating_sub(16))
        .filter(|&i| pt[i..i + 16] == pattern[..])
        .collect();
    assert!(psbs.len() >= 3, "{} PSBs in {} bytes", psbs.len(), pt.len());
    // Consecutive PSBs are about one PSB period apart, like hardware's psb_period.
    for w in psbs.windows(2) {
        assert!(w[1] - w[0] >= emu::encode::PSB_PERIOD as usize);
        assert!(w[1] - w[0] < emu::encode::PSB_PERIOD as usize + 256);
    }
    for &off in &psbs[1..] {
        let seg = oracle::decode_own_memory(&pt[off..]).unwrap();
        assert!(seg.errors.is_empty(), "segment at {off}: {:?}", seg.errors);
        assert!(!seg.ips.is_empty());
        let tail = &full.ips[full.ips.len() - seg.ips.len()..];
        assert_eq!(
            seg.ips, tail,
            "segment at {off} is not a suffix of the window"
        );
    }
}

// ---- stepping that ends before stop ----

#[test]
fn stepping_cleared_by_traced_code_is_reported_as_lost() {
    let mut t = tracer(4);
    let mut out = OutputBuffers::new(4, 4).unwrap();
    let (_, status, rep) = trace(&mut t, &mut out, || {
        asm_loop(std::hint::black_box(5));
        // Code that restores flags saved without TF (here: clears TF directly).
        // SAFETY: balanced pushfq/popfq clearing TF.
        unsafe { core::arch::asm!("pushfq", "and qword ptr [rsp], -257", "popfq") };
        asm_loop(std::hint::black_box(7))
    });
    assert_eq!(status, Status::OverwrittenPtTrace);
    assert!(rep.stepping_lost && !rep.steps_overflowed);
    let d = decode_exact(&out, &rep);
    // The first loop is in the trace, the second (after TF was cleared) is not.
    let dec_at = asm_loop(1);
    assert_eq!(count(&d.ips, dec_at), 5);
}

// ---- decoding from files named by the sideband, like a hardware trace ----

/// Decodes `pt` with an image built only from the window's MMAP2 records (files on disk)
/// and the saved vDSO bytes, not from this process's memory.
fn decode_from_sideband(pt: &[u8], sideband: &[u8]) -> (Vec<u64>, usize) {
    use libipt::enc_dec_builder::EncoderDecoderBuilder;
    use libipt::image::Image;
    use libipt::insn::InsnDecoder;
    let mut image = Image::new(Some("sideband")).unwrap();
    let mut sections = 0;
    let vdso_file = tempfile::NamedTempFile::new().unwrap();
    let (vdso_addr, vdso) = drpttracer::sideband::synth::vdso_bytes().unwrap();
    std::fs::write(vdso_file.path(), &vdso).unwrap();
    for r in RecordIter::new(sideband, SIDEBAND_SAMPLE_TYPE) {
        let (_, r) = r.unwrap();
        let Record::Mmap2(m) = r.record else { continue };
        if m.prot & libc::PROT_EXEC as u32 == 0 {
            continue;
        }
        if m.filename == "[vdso]" {
            image
                .add_file(
                    vdso_file.path().to_str().unwrap(),
                    m.addr - vdso_addr,
                    m.len,
                    None,
                    m.addr,
                )
                .unwrap();
        } else if m.filename.starts_with('/') {
            image
                .add_file(&m.filename, m.pgoff, m.len, None, m.addr)
                .unwrap();
        } else {
            continue;
        }
        sections += 1;
    }
    let mut buf = pt.to_vec();
    // SAFETY: buf outlives the decoder.
    let mut dec: InsnDecoder = unsafe {
        EncoderDecoderBuilder::<InsnDecoder>::new().buffer_from_raw(buf.as_mut_ptr(), buf.len())
    }
    .build()
    .unwrap();
    dec.set_image(Some(&mut image)).unwrap();
    let mut ips = Vec::new();
    let mut status = dec.sync_forward().unwrap();
    loop {
        while status.event_pending() {
            status = dec.event().unwrap().1;
        }
        if status.eos() {
            break;
        }
        match dec.decode_next() {
            Ok((insn, st)) => {
                ips.push(insn.ip());
                status = st;
            }
            Err(e) if e.code() == libipt::error::PtErrorCode::Eos => break,
            Err(e) => panic!("decode error after {} instructions: {e:?}", ips.len()),
        }
    }
    (ips, sections)
}

#[test]
fn trace_decodes_from_sideband_images_alone() {
    let mut t = tracer(6);
    let mut out = OutputBuffers::new(6, 4).unwrap();
    let table: [fn(u64) -> u64; 3] = [leaf_a, leaf_b, leaf_c];
    let (_, status, rep) = trace(&mut t, &mut out, || {
        known_flow(&std::hint::black_box(DATA), &ORDER, &table)
    });
    assert_eq!(status, Status::Success);
    let (ips, sections) = decode_from_sideband(out.pt_data(), out.sideband_data());
    assert!(
        sections >= 2,
        "{sections} executable sections in the sideband"
    );
    assert_eq!(Some(&ips), rep.ips.as_ref());
}

// ---- misuse on one thread ----

#[test]
fn second_window_on_the_same_thread_is_refused_and_drop_ends_stepping() {
    let mut a = tracer(4);
    let mut b = tracer(4);
    let mut out = OutputBuffers::new(4, 4).unwrap();
    emu::keep_observed_ips(true);
    a.start().unwrap();
    let e = b.start().unwrap_err();
    leaf_a(std::hint::black_box(1));
    let cap = a.stop(&mut out).unwrap();
    assert_eq!(e.status, Status::FailedToStartTracing);
    assert!(e.message.contains("TF"), "{}", e.message);
    assert_eq!(cap.status(), Status::Success);
    let rep = emu::take_last_window().unwrap();
    let d = decode_exact(&out, &rep);
    assert_eq!(count(&d.ips, leaf_a as *const () as u64), 1);

    // A handle dropped while its window is open stops the stepping of its thread.
    b.start().unwrap();
    assert!(emu::trap::tf_is_set());
    drop(b);
    assert!(!emu::trap::tf_is_set());
}

// ---- the project's decoder (crate::decode) on an emulated window ----

#[test]
fn project_decoder_reproduces_the_window_from_pt_and_sideband() {
    use drpttracer::decode::{decode_window, ImageSpec, Record as Rec, TraceParams, WindowOptions};
    let mut t = tracer(6);
    let mut out = OutputBuffers::new(6, 4).unwrap();
    let table: [fn(u64) -> u64; 3] = [leaf_a, leaf_b, leaf_c];
    let (_, status, rep) = trace(&mut t, &mut out, || {
        known_flow(&std::hint::black_box(DATA), &ORDER, &table)
    });
    assert_eq!(status, Status::Success);
    let params = TraceParams::from_ext_metadata(&t.ext_metadata());
    let (_, vdso) = drpttracer::sideband::synth::vdso_bytes().unwrap();
    let spec = ImageSpec {
        vdso: Some(vdso),
        ..Default::default()
    };
    let image = spec.load().unwrap();
    let recs = decode_window(
        out.pt_data(),
        Some((out.sideband_data(), SIDEBAND_SAMPLE_TYPE)),
        &params,
        &image,
        &spec,
        &WindowOptions {
            source: "emulated window".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let gaps: Vec<_> = recs.iter().filter(|r| matches!(r, Rec::Gap(_))).collect();
    assert!(gaps.is_empty(), "{gaps:?}");
    let ips: Vec<u64> = recs
        .iter()
        .filter_map(|r| r.as_instruction().map(|i| i.pc))
        .collect();
    assert_eq!(Some(&ips), rep.ips.as_ref());
    let syscalls = recs
        .iter()
        .filter(|r| matches!(r, Rec::Syscall { .. }))
        .count();
    assert_eq!(syscalls, rep.far_transfers as usize);
    // TSC packets convert to perf time (the sideband's clock).
    assert!(recs.iter().any(|r| matches!(
        r,
        Rec::Timestamp {
            perf_time: Some(_),
            ..
        }
    )));
}

// ---- code that blocks every signal inside a window ----

#[test]
fn blocking_all_signals_inside_a_window_keeps_stepping_and_mask_semantics() {
    let mut t = tracer(8);
    let mut out = OutputBuffers::new(8, 4).unwrap();
    let ((old_has_usr2, during_has_usr2, during_has_trap, after_has_usr2), status, rep) =
        trace(&mut t, &mut out, || {
            // SAFETY: plain signal-mask manipulation of this thread, restored below.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                let mut during: libc::sigset_t = std::mem::zeroed();
                let mut after: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut during);
                let x = leaf_b(std::hint::black_box(3));
                libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut after);
                std::hint::black_box(x);
                (
                    libc::sigismember(&old, libc::SIGUSR2),
                    libc::sigismember(&during, libc::SIGUSR2),
                    libc::sigismember(&during, libc::SIGTRAP),
                    libc::sigismember(&after, libc::SIGUSR2),
                )
            }
        });
    assert_eq!(status, Status::Success);
    // The application's view: old mask returned, everything blocked, then restored —
    // except SIGTRAP, which stays deliverable so stepping (and the process) survive.
    assert_eq!((old_has_usr2, during_has_usr2, after_has_usr2), (0, 1, 0));
    assert_eq!(during_has_trap, 0);
    let d = decode_exact(&out, &rep);
    assert_eq!(count(&d.ips, leaf_b as *const () as u64), 1);
}

// ---- a fault whose handler moves the resume point ----

extern "C" fn skip_fault(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO delivery; skips the 8-byte faulting load below.
    unsafe {
        let uc = ctx.cast::<libc::ucontext_t>();
        (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] += 8;
    }
}

#[inline(never)]
fn faulting_load() -> u64 {
    let at: u64;
    // SAFETY: the load from address 0 faults; the test's SIGSEGV handler skips it.
    unsafe {
        core::arch::asm!(
            "lea {at}, [rip + 2f]",
            "2:",
            ".byte 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0", // mov rax, [0]
            "nop",
            "nop",
            at = out(reg) at,
            out("rax") _,
        );
    }
    at
}

#[test]
fn handler_that_moves_the_resume_point_is_an_explicit_gap() {
    // SAFETY: swaps this process's SIGSEGV disposition for the test and restores it.
    let old = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        let mut old: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = skip_fault
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGSEGV, &sa, &mut old);
        old
    };
    let mut t = tracer(4);
    let mut out = OutputBuffers::new(4, 4).unwrap();
    let (at, status, rep) = trace(&mut t, &mut out, faulting_load);
    // SAFETY: restores the previous disposition.
    unsafe { libc::sigaction(libc::SIGSEGV, &old, std::ptr::null_mut()) };
    assert_eq!(status, Status::Success);
    assert_eq!(rep.signals, 1);
    // The load never completed and execution resumed elsewhere: an explicit gap, and
    // neither the faulting load is claimed as executed nor a made-up path invented.
    assert_eq!(rep.gaps, 1);
    let d = oracle::decode_own_memory(out.pt_data()).unwrap();
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(Some(&d.ips), rep.ips.as_ref());
    assert_eq!(count(&d.ips, at), 0);
    assert!(d
        .events
        .iter()
        .any(|e| matches!(e, oracle::OracleEvent::AsyncDisabled { at: a, .. } if *a == at)));
}
