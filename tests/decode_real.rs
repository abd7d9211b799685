//! Decoding against real process images and real kernel sideband records (software perf
//! events; no Intel PT needed): MMAP2 records from the kernel and synthesized from
//! /proc/self/maps put the right file bytes at the right addresses.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;

use drpttracer::decode::testgen::PtWriter;
use drpttracer::decode::{
    decode_insn, decode_window, AddressSpace, ExecMode, ImageSpec, InsnClass, Record, TraceParams,
    WindowOptions,
};
use drpttracer::perf::sideband_event::{rdtsc, SidebandEvent};
use drpttracer::sideband::record::SIDEBAND_SAMPLE_TYPE;
use drpttracer::sideband::synth::{synthesize_exec_mmap2, vdso_bytes};

fn no_gaps(recs: &[Record]) {
    let g: Vec<_> = recs
        .iter()
        .filter(|r| matches!(r, Record::Gap(_)))
        .collect();
    assert!(g.is_empty(), "{g:?}");
}

/// Addresses of the instructions at `bytes` (loaded at `pc`) up to the first one that is
/// not straight-line code; returns (straight-line pcs, address of the stopper).
fn straight_prefix(bytes: &[u8], pc: u64) -> (Vec<u64>, u64) {
    let mut out = vec![];
    let mut at = 0usize;
    loop {
        let i = decode_insn(&bytes[at..], pc + at as u64, ExecMode::Bit64).unwrap_or_else(|| {
            panic!(
                "undecodable at {:#x}: {:02x?}",
                pc + at as u64,
                &bytes[at..]
            )
        });
        if i.class != InsnClass::Other || out.len() == 12 {
            return (out, pc + at as u64);
        }
        out.push(pc + at as u64);
        at += usize::from(i.size);
    }
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn drpttracer_decode_probe(x: u64) -> u64 {
    (x.wrapping_mul(3).wrapping_add(7) ^ 0x55).rotate_left(3)
}

#[test]
fn own_binary_and_vdso_from_synthesized_mmap2() {
    let sb = synthesize_exec_mmap2(SIDEBAND_SAMPLE_TYPE, 1).expect("read /proc/self/maps");
    let f = drpttracer_decode_probe as *const () as usize as u64;
    assert_eq!(
        drpttracer_decode_probe(1),
        ((3u64 + 7) ^ 0x55).rotate_left(3)
    );
    let maps = drpttracer::sideband::synth::read_self_maps().unwrap();
    let m = maps
        .iter()
        .find(|m| m.start <= f && f < m.end && m.exec)
        .expect("mapping of f");
    let n = (m.end - f).min(512) as usize;
    // SAFETY: reading n bytes of this test binary's own code, inside its r-x mapping.
    let live = unsafe { std::slice::from_raw_parts(f as *const u8, n) }.to_vec();
    let (expect, stop) = straight_prefix(&live, f);
    assert!(!expect.is_empty());

    let (vbase, vbytes) = vdso_bytes().expect("vdso");
    use object::{Object, ObjectSymbol};
    let vfile = object::File::parse(&vbytes[..]).expect("vDSO is an ELF image");
    let sym = vfile
        .dynamic_symbols()
        .find(|s| s.name() == Ok("__vdso_clock_gettime") || s.name() == Ok("clock_gettime"))
        .expect("clock_gettime in the vDSO");
    let vpc = vbase + sym.address();
    let voff = sym.address() as usize;
    let (vexpect, vstop) = straight_prefix(&vbytes[voff..], vpc);

    let mut w = PtWriter::new();
    w.psb_plus(None, None).tip_pge(f).fup(stop).tip_pgd(None);
    if !vexpect.is_empty() {
        w.tip_pge(vpc).fup(vstop).tip_pgd(None);
    }
    let spec = ImageSpec {
        vdso: Some(vbytes.clone()),
        ..Default::default()
    };
    let recs = decode_window(
        &w.buf,
        Some((&sb, SIDEBAND_SAMPLE_TYPE)),
        &TraceParams::default(),
        &AddressSpace::new(),
        &spec,
        &WindowOptions {
            source: "real.pt".into(),
            ..Default::default()
        },
    )
    .unwrap();
    no_gaps(&recs);
    let mut all = expect.clone();
    all.extend(&vexpect);
    assert_eq!(common::pcs(&recs), all);
    // The bytes came from the binary's file on disk, through the MMAP2 file offset.
    for r in recs.iter().filter_map(|r| r.as_instruction()) {
        if r.pc >= f && r.pc < f + n as u64 {
            let o = (r.pc - f) as usize;
            assert_eq!(r.encoding(), &live[o..o + usize::from(r.size)]);
        }
    }
}

/// A software perf event recording this thread's sideband, and the kernel's TSC
/// conversion; `None` (having said SKIP and why) where this machine lacks either.
fn kernel_sideband() -> Option<(SidebandEvent, drpttracer::metadata::TimeConv)> {
    let tid = drpttracer::tracer::current_tid();
    let ev = match SidebandEvent::open(tid, 4) {
        Ok(ev) => ev,
        Err(e) => {
            println!("SKIP: cannot open a software perf event here: {e}");
            return None;
        }
    };
    let Some(conv) = ev.time_conv() else {
        println!("SKIP: the kernel publishes no TSC conversion (cap_user_time_zero)");
        return None;
    };
    Some((ev, conv))
}

/// A file holding `code` at offset 4096, between pages of int3.
fn code_page_file(code: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut bytes = vec![0xccu8; 4096];
    bytes.extend_from_slice(code);
    bytes.resize(8192, 0xcc);
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    f
}

/// Maps the code page of `f` ([`code_page_file`]) read-only and executable: where the
/// kernel chooses, or over our own mapping at `over` (`MAP_FIXED`).
fn map_code_page(
    f: &tempfile::NamedTempFile,
    over: Option<*mut libc::c_void>,
) -> *mut libc::c_void {
    let (at, fixed) = match over {
        Some(a) => (a, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: mapping one page of a file we own, PROT_READ|PROT_EXEC; with `over`, only
    // over a mapping of our own (the callers' earlier `map_code_page`).
    let p = unsafe {
        libc::mmap(
            at,
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | fixed,
            f.as_file().as_raw_fd(),
            4096,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p
}

#[test]
fn kernel_mmap2_records_switch_the_image_in_time() {
    let Some((ev, conv)) = kernel_sideband() else {
        return;
    };
    // Code at file offset 4096 of two files: A = nop; nop; jmp rax  B = xor; inc; jmp rax.
    let code_a = [0x90u8, 0x90, 0xff, 0xe0];
    let code_b = [0x31u8, 0xc0, 0xff, 0xc0, 0xff, 0xe0];
    let (fa, fb) = (code_page_file(&code_a), code_page_file(&code_b));
    ev.enable().unwrap();
    // (The second mapping replaces the first at the same address.)
    let addr = map_code_page(&fa, None);
    let tsc1 = rdtsc();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let again = map_code_page(&fb, Some(addr));
    assert_eq!(again, addr);
    std::thread::sleep(std::time::Duration::from_millis(2));
    let tsc2 = rdtsc();
    ev.disable().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let got = ev.drain(Some(&mut buf));
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(addr, 4096) };
    let sb = &buf[..got.copied];
    let addr = addr as u64;

    let mut w = PtWriter::new();
    w.psb_plus(Some(tsc1), None).tip_pge(addr).tip_pgd(None);
    w.psb_plus(Some(tsc2), None).tip_pge(addr).tip_pgd(None);
    let params = TraceParams {
        time: Some(conv),
        ..Default::default()
    };
    let recs = decode_window(
        &w.buf,
        Some((sb, SIDEBAND_SAMPLE_TYPE)),
        &params,
        &AddressSpace::new(),
        &ImageSpec::default(),
        &WindowOptions::default(),
    )
    .unwrap();
    no_gaps(&recs);
    assert_eq!(
        common::pcs(&recs),
        vec![addr, addr + 1, addr + 2, addr, addr + 2, addr + 4],
        "A (nop nop jmp) before the second MMAP2, B (xor inc jmp) after"
    );
    let ts: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Timestamp { perf_time, .. } => *perf_time,
            _ => None,
        })
        .collect();
    assert_eq!(ts.len(), 2);
}

/// Real kernel MMAP2 records of a library mapped while the program runs (a new address,
/// between two enables of one PSB segment): the fast decoder applies the mapping where
/// libipt's path does, decodes the window itself, and gives libipt's records.
#[test]
fn kernel_mmap2_of_code_mapped_mid_trace_stays_on_the_fast_decoder() {
    use drpttracer::decode::{DecoderKind, ImageResolver, PtDecoder, TraceDecoder};
    let Some((ev, conv)) = kernel_sideband() else {
        return;
    };
    // A = nop; nop; jmp rax  B = xor eax,eax; inc eax; jmp rax (at file offset 4096).
    let (fa, fb) = (
        code_page_file(&[0x90, 0x90, 0xff, 0xe0]),
        code_page_file(&[0x31, 0xc0, 0xff, 0xc0, 0xff, 0xe0]),
    );
    ev.enable().unwrap();
    let a = map_code_page(&fa, None);
    let tsc1 = rdtsc();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let b = map_code_page(&fb, None);
    std::thread::sleep(std::time::Duration::from_millis(2));
    let tsc2 = rdtsc();
    ev.disable().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let got = ev.drain(Some(&mut buf));
    for p in [a, b] {
        // SAFETY: unmapping our own mappings.
        unsafe { libc::munmap(p, 4096) };
    }
    let events =
        drpttracer::decode::sideband::parse_records("sb", &buf[..got.copied], SIDEBAND_SAMPLE_TYPE)
            .unwrap();
    let (a, b) = (a as u64, b as u64);
    let mut w = PtWriter::new();
    w.psb_plus(Some(tsc1), None).tip_pge(a).tip_pgd(None);
    w.tsc(tsc2).tip_pge(b).tip_pgd(None);
    let decode = |kind: DecoderKind| {
        let mut d = PtDecoder::new(
            &w.buf,
            TraceParams {
                time: Some(conv),
                ..Default::default()
            },
            AddressSpace::new(),
            events.clone(),
            ImageResolver::default(),
            WindowOptions {
                decoder: kind,
                ..Default::default()
            },
        )
        .unwrap();
        let recs: Vec<Record> = d.by_ref().collect();
        (recs, d.decoded_by())
    };
    let (fast, by) = decode(DecoderKind::Fast);
    let (libipt, _) = decode(DecoderKind::Libipt);
    no_gaps(&fast);
    assert_eq!(common::pcs(&fast), vec![a, a + 1, a + 2, b, b + 2, b + 4]);
    assert_eq!(fast, libipt);
    assert_eq!(by, ("fast", None));
}
