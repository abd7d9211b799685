//! Exact decoded instruction sequences for hand-built traces (libipt's packet encoder)
//! over code assembled here with iced-x86 (disassembly asserted).

mod common;

use drpttracer::decode::sideband::{encode_mmap2, TEST_SAMPLE_TYPE};
use drpttracer::decode::testgen::PtWriter;
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{
    decode_window, AddressSpace, Gap, ImageResolver, ImageSpec, PtDecoder, Record, Symbols,
    TraceParams, WindowOptions,
};
use drpttracer::metadata::TimeConv;
use iced_x86::code_asm::*;
use iced_x86::{Decoder, Formatter, IntelFormatter};

const BASE: u64 = 0x40_1000;

/// Intel-syntax disassembly of `code` at `base`, one string per instruction.
fn disasm(code: &[u8], base: u64) -> Vec<String> {
    let mut d = Decoder::with_ip(64, code, base, 0);
    let mut f = IntelFormatter::new();
    let mut out = vec![];
    for i in d.iter() {
        let mut s = String::new();
        f.format(&i, &mut s);
        out.push(s);
    }
    out
}

fn image(code: &[u8], base: u64) -> AddressSpace {
    let mut s = AddressSpace::new();
    s.add_bytes("test", code.to_vec(), base);
    s
}

fn decode(trace: &[u8], space: &AddressSpace) -> Vec<Record> {
    decode_window(
        trace,
        None,
        &TraceParams::default(),
        space,
        &ImageSpec::default(),
        &WindowOptions {
            source: "test.pt".into(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Non-instruction records, for asserting markers.
fn markers(recs: &[Record]) -> Vec<Record> {
    recs.iter()
        .filter(|r| r.as_instruction().is_none())
        .cloned()
        .collect()
}

fn gaps(recs: &[Record]) -> Vec<Gap> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Gap(g) => Some((**g).clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn straight_line_with_async_disable() {
    let (code, ips) = common::asm(BASE, |a| {
        a.mov(eax, 1)?;
        a.add(eax, 2)?;
        a.nop()?;
        a.mov(ebx, eax)?;
        a.xor(ecx, ecx)?;
        a.int3()
    });
    assert_eq!(
        disasm(&code, BASE),
        [
            "mov eax,1",
            "add eax,2",
            "nop",
            "mov ebx,eax",
            "xor ecx,ecx",
            "int3"
        ]
    );
    let mut w = PtWriter::new();
    w.psb_plus(Some(10), None)
        .tip_pge(ips[0])
        .fup(ips[4])
        .tip_pgd(None);
    let recs = decode(&w.buf, &image(&code, BASE));
    assert_eq!(common::pcs(&recs), &ips[..4]);
    let insn = recs[2].as_instruction().unwrap();
    assert_eq!(insn.encoding(), &code[..5]);
    assert_eq!(
        markers(&recs),
        vec![
            Record::Timestamp {
                tsc: 10,
                perf_time: None
            },
            Record::TraceEnabled { ip: ips[0] },
            Record::TraceDisabled { ip: Some(ips[4]) },
        ]
    );
}

/// `n` conditional skips; returns code, ips, and per branch (jcc index, skipped index).
fn cond_chain(n: usize) -> (Vec<u8>, Vec<u64>) {
    common::asm(BASE, |a| {
        for k in 0..n {
            let mut skip = a.create_label();
            a.test(eax, 1 << (k % 31))?;
            a.jz(skip)?;
            a.inc(ecx)?;
            a.set_label(&mut skip)?;
            a.nop()?;
        }
        a.jmp(rax)
    })
}

fn expect_cond_chain(ips: &[u64], bits: &[bool]) -> Vec<u64> {
    let mut out = vec![];
    for (k, &taken) in bits.iter().enumerate() {
        let i = 4 * k;
        out.push(ips[i]); // test
        out.push(ips[i + 1]); // jz
        if !taken {
            out.push(ips[i + 2]); // inc
        }
        out.push(ips[i + 3]); // nop
    }
    out.push(ips[4 * bits.len()]); // jmp rax
    out
}

#[test]
fn conditional_branches_short_and_long_tnt() {
    for n in [3usize, 6, 7, 40, 47] {
        let (code, ips) = cond_chain(n);
        let d = disasm(&code, BASE);
        assert_eq!(d[0], "test eax,1");
        assert!(d[1].starts_with("je short "), "{}", d[1]);
        assert_eq!(d[2], "inc ecx");
        assert_eq!(d.last().unwrap(), "jmp rax");
        let bits: Vec<bool> = (0..n).map(|k| (k * 7 + 3) % 3 == 0).collect();
        let mut w = PtWriter::new();
        w.psb_plus(None, None)
            .tip_pge(ips[0])
            .tnt(&bits)
            .tip_pgd(None);
        // 1..=6 bits fit a short TNT (1 byte), more need a long TNT (8 bytes).
        let tnt_len = if n <= 6 { 1 } else { 8 };
        let before = {
            let mut w2 = PtWriter::new();
            w2.psb_plus(None, None).tip_pge(ips[0]);
            w2.buf.len()
        };
        assert_eq!(w.buf.len(), before + tnt_len + 1);
        let recs = decode(&w.buf, &image(&code, BASE));
        assert!(gaps(&recs).is_empty(), "{:?}", gaps(&recs));
        assert_eq!(common::pcs(&recs), expect_cond_chain(&ips, &bits), "n={n}");
        assert_eq!(recs.last(), Some(&Record::TraceDisabled { ip: None }));
    }
}

#[test]
fn indirect_call_and_jump_use_tip() {
    let mut labels = vec![];
    let (code, ips) = common::asm(BASE, |a| {
        let mut f = a.create_label();
        let mut t = a.create_label();
        a.call(rax)?; // 0
        a.int3()?; // 1 (never reached)
        a.set_label(&mut f)?;
        a.nop()?; // 2
        a.jmp(rbx)?; // 3
        a.int3()?; // 4
        a.set_label(&mut t)?;
        a.add(eax, 1)?; // 5
        a.jmp(rcx)?; // 6
        labels.push(0);
        Ok(())
    });
    assert_eq!(
        disasm(&code, BASE),
        [
            "call rax",
            "int3",
            "nop",
            "jmp rbx",
            "int3",
            "add eax,1",
            "jmp rcx"
        ]
    );
    let mut w = PtWriter::new();
    w.psb_plus(None, None)
        .tip_pge(ips[0])
        .tip(ips[2])
        .tip(ips[5])
        .tip_pgd(None);
    let recs = decode(&w.buf, &image(&code, BASE));
    assert_eq!(
        common::pcs(&recs),
        vec![ips[0], ips[2], ips[3], ips[5], ips[6]]
    );
    let classes: Vec<_> = recs
        .iter()
        .filter_map(|r| r.as_instruction())
        .map(|i| i.class)
        .collect();
    use drpttracer::decode::InsnClass::*;
    assert_eq!(classes, vec![Call, Other, Jump, Other, Jump]);
}

#[test]
fn returns_without_return_compression() {
    let (code, ips) = common::asm(BASE, |a| {
        let mut f = a.create_label();
        let mut g = a.create_label();
        a.call(f)?; // 0: direct call, no trace
        a.call(g)?; // 1
        a.jmp(rax)?; // 2
        a.set_label(&mut f)?;
        a.nop()?; // 3
        a.ret()?; // 4: TIP back to 1
        a.set_label(&mut g)?;
        a.inc(ecx)?; // 5
        a.ret()?; // 6: TIP back to 2
        Ok(())
    });
    let d = disasm(&code, BASE);
    assert!(d[0].starts_with("call "), "{d:?}");
    assert_eq!(&d[2..], ["jmp rax", "nop", "ret", "inc ecx", "ret"]);
    let mut w = PtWriter::new();
    w.psb_plus(None, None)
        .tip_pge(ips[0])
        .tip(ips[1])
        .tip(ips[2])
        .tip_pgd(None);
    let recs = decode(&w.buf, &image(&code, BASE));
    assert!(gaps(&recs).is_empty(), "{:?}", gaps(&recs));
    assert_eq!(
        common::pcs(&recs),
        vec![ips[0], ips[3], ips[4], ips[1], ips[5], ips[6], ips[2]]
    );
}

#[test]
fn enable_disable_tip_pge_pgd() {
    let (code, ips) = common::asm(BASE, |a| {
        a.nop()?; // 0
        a.jmp(rax)?; // 1
        a.inc(ecx)?; // 2
        a.inc(edx)?; // 3
        a.jmp(rbx) // 4
    });
    let mut w = PtWriter::new();
    w.psb_plus(Some(5), None)
        .tip_pge(ips[0])
        .tip_pgd(None)
        .tsc(9)
        .tip_pge(ips[3])
        .tip_pgd(Some(ips[0]));
    let recs = decode(&w.buf, &image(&code, BASE));
    let insn = |k: usize| {
        Record::Instruction(
            *recs
                .iter()
                .filter_map(|r| r.as_instruction())
                .find(|i| i.pc == ips[k])
                .unwrap(),
        )
    };
    assert_eq!(
        recs,
        vec![
            Record::Timestamp {
                tsc: 5,
                perf_time: None
            },
            Record::TraceEnabled { ip: ips[0] },
            insn(0),
            insn(1),
            Record::TraceDisabled { ip: None },
            Record::Timestamp {
                tsc: 9,
                perf_time: None
            },
            Record::TraceEnabled { ip: ips[3] },
            insn(3),
            insn(4),
            Record::TraceDisabled { ip: Some(ips[0]) },
        ]
    );
}

#[test]
fn corrupt_range_gives_gap_then_resyncs_at_next_psb() {
    let (code, ips) = cond_chain(4);
    let mut w = PtWriter::new();
    w.psb_plus(Some(1), None)
        .tip_pge(ips[0])
        .tnt(&[true, false]);
    let bad_at = w.buf.len();
    // 0x02 0xff: an extended opcode libipt does not know.
    w.buf
        .extend_from_slice(&[0x02, 0xff, 0x13, 0x37, 0x02, 0xff]);
    let psb_at = w.buf.len();
    w.psb_plus(Some(2), Some(ips[8]))
        .tnt(&[false, true])
        .tip_pgd(None);
    let recs = decode(&w.buf, &image(&code, BASE));
    let g = gaps(&recs);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0].pt_offset, bad_at as u64, "{}", g[0]);
    assert_eq!(g[0].source, "test.pt");
    assert!(g[0].error.contains("unknown opcode"), "{}", g[0].error);
    let gap_idx = recs
        .iter()
        .position(|r| matches!(r, Record::Gap(_)))
        .unwrap();
    // Before: branch 0 (taken), then branch 1's jz: libipt reads ahead past the TNT and
    // fails on the bad packet before handing out the TNT's second bit.
    let before = common::pcs(&recs[..gap_idx]);
    assert_eq!(before, vec![ips[0], ips[1], ips[3], ips[4], ips[5]]);
    // After: resync at the PSB (timestamp 2), branches 2 (not taken) and 3 (taken).
    assert_eq!(
        recs[gap_idx + 1],
        Record::Timestamp {
            tsc: 2,
            perf_time: None
        }
    );
    let after = common::pcs(&recs[gap_idx..]);
    assert_eq!(
        after,
        vec![ips[8], ips[9], ips[10], ips[11], ips[12], ips[13], ips[15], ips[16]]
    );
    assert!(psb_at > bad_at);
}

#[test]
fn missing_image_is_a_gap_with_the_address() {
    let (code, ips) = cond_chain(1);
    let mut w = PtWriter::new();
    w.psb_plus(None, None)
        .tip_pge(ips[0])
        .tnt(&[true])
        .tip(0x7777_0000)
        .tip_pgd(None);
    let recs = decode(&w.buf, &image(&code, BASE));
    let g = gaps(&recs);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0].ip, Some(0x7777_0000));
    assert!(g[0].error.contains("0x77770000"), "{}", g[0].error);
    assert_eq!(common::pcs(&recs), vec![ips[0], ips[1], ips[3], ips[4]]);
}

#[test]
fn image_switch_via_later_mmap2_at_same_address() {
    let dir = tempfile::tempdir().unwrap();
    let addr = 0x50_0000u64;
    let (code_a, ips_a) = common::asm(addr, |a| {
        a.nop()?;
        a.nop()?;
        a.jmp(rax)
    });
    let (code_b, ips_b) = common::asm(addr, |a| {
        a.xor(eax, eax)?;
        a.inc(eax)?;
        a.mov(ebx, 5)?;
        a.jmp(rax)
    });
    assert_eq!(
        disasm(&code_b, addr),
        ["xor eax,eax", "inc eax", "mov ebx,5", "jmp rax"]
    );
    // Files with some leading bytes: the mapping uses a page offset of 0x1000.
    let (fa, fb) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    for (f, c) in [(&fa, &code_a), (&fb, &code_b)] {
        let mut bytes = vec![0xccu8; 0x1000];
        bytes.extend_from_slice(c);
        std::fs::write(f, bytes).unwrap();
    }
    let mut sb = encode_mmap2(1, 1, addr, 0x1000, 0x1000, &fa, 50);
    sb.extend(encode_mmap2(1, 1, addr, 0x1000, 0x1000, &fb, 200));
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None).tip_pge(addr).tip_pgd(None);
    w.psb_plus(Some(300), None).tip_pge(addr).tip_pgd(None);
    let params = TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    let recs = decode_window(
        &w.buf,
        Some((&sb, TEST_SAMPLE_TYPE)),
        &params,
        &AddressSpace::new(),
        &ImageSpec::default(),
        &WindowOptions {
            source: "switch.pt".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(gaps(&recs).is_empty(), "{:?}", gaps(&recs));
    let mut expect = ips_a.clone();
    expect.extend(&ips_b);
    assert_eq!(common::pcs(&recs), expect);
    let second = recs
        .iter()
        .filter_map(|r| r.as_instruction())
        .nth(3)
        .unwrap();
    assert_eq!(second.encoding(), &code_b[..2]);
    // Decoding the two PSB segments on two threads: each starts with the image of its time.
    let events = drpttracer::decode::sideband::parse_records("sb", &sb, TEST_SAMPLE_TYPE).unwrap();
    assert_eq!(
        drpttracer::decode::parallel::split_at_psbs(&w.buf, 2).len(),
        2
    );
    let par = drpttracer::decode::parallel::decode_parallel(
        &w.buf,
        &params,
        &AddressSpace::new(),
        &events,
        &Default::default(),
        &WindowOptions {
            source: "switch.pt".into(),
            ..Default::default()
        },
        2,
    )
    .unwrap();
    assert_eq!(par, recs);
}

#[test]
fn exec_comm_resets_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let addr = 0x60_0000u64;
    let (code, ips) = common::asm(addr, |a| {
        a.nop()?;
        a.jmp(rax)
    });
    let f = dir.path().join("c.bin");
    std::fs::write(&f, &code).unwrap();
    let mut sb = encode_mmap2(1, 1, addr, 0x1000, 0, &f, 10);
    // COMM with the exec flag at time 200 (the lead's encoder, project sample_type).
    use drpttracer::sideband::record::{encode_comm, SampleId};
    let sample = SampleId {
        pid: Some(1),
        tid: Some(1),
        time: Some(200),
        cpu: Some(0),
        identifier: Some(0),
        ..Default::default()
    };
    let comm = encode_comm(1, 1, "newprog", true, &sample, TEST_SAMPLE_TYPE);
    sb.extend(comm);
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None).tip_pge(addr).tip_pgd(None);
    w.psb_plus(Some(300), None).tip_pge(addr).tip_pgd(None);
    let params = TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    let recs = decode_window(
        &w.buf,
        Some((&sb, TEST_SAMPLE_TYPE)),
        &params,
        &AddressSpace::new(),
        &ImageSpec::default(),
        &WindowOptions::default(),
    )
    .unwrap();
    assert_eq!(common::pcs(&recs), ips);
    let g = gaps(&recs);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0].ip, Some(addr));
}

#[test]
fn auxtrace_and_raw_pt_variants_decode_identically() {
    use drpttracer::format::{auxtrace, pdb};
    use drpttracer::metadata::PtMetadata;
    let prog = drpttracer::decode::testgen::LoopProgram::new(0x40_0000);
    let (trace, _) = prog.trace(6000, 1000, 11);
    let space = image(&prog.code, prog.base);
    let opts = WindowOptions {
        source: "x".into(),
        ..Default::default()
    };
    let run = |pt: &[u8]| {
        decode_window(
            pt,
            None,
            &TraceParams::default(),
            &space,
            &ImageSpec::default(),
            &opts,
        )
        .unwrap()
    };
    let raw = run(&trace);
    assert!(common::pcs(&raw).len() > 1000);
    let wrapped = auxtrace::wrap(&trace, 1024, 7, 0);
    let un = auxtrace::unwrap(&wrapped).unwrap();
    assert_eq!(un.pt, trace);
    assert_eq!(run(&un.pt), raw);
    let md = PtMetadata {
        cpu_family: 6,
        cpu_model: 0x55,
        cpu_stepping: 4,
        ..Default::default()
    };
    let mut w = pdb::PdbWriter::new(7, 7, &md);
    w.syscall(7, 7, 39, 0, &[1, 2], &trace);
    w.syscall(7, 7, 60, 1, &[], &trace[..0]);
    let f = pdb::parse(&w.buf).unwrap();
    assert_eq!(f.windows.len(), 2);
    let params = TraceParams::from_pt_metadata(&f.metadata);
    let from_pdb = decode_window(
        &w.buf[f.windows[0].pt.clone()],
        None,
        &params,
        &space,
        &ImageSpec::default(),
        &opts,
    )
    .unwrap();
    assert_eq!(from_pdb, raw);
    assert!(decode_window(
        &w.buf[f.windows[1].pt.clone()],
        None,
        &params,
        &space,
        &ImageSpec::default(),
        &opts
    )
    .unwrap()
    .is_empty());
}

/// A minimal ELF64 core-style file (kcore) with one PT_LOAD at `vaddr`.
fn kcore_elf(vaddr: u64, code: &[u8]) -> Vec<u8> {
    let mut e = vec![0u8; 64 + 56];
    e[..4].copy_from_slice(b"\x7fELF");
    e[4] = 2; // ELFCLASS64
    e[5] = 1; // little endian
    e[6] = 1; // EV_CURRENT
    e[16..18].copy_from_slice(&4u16.to_le_bytes()); // ET_CORE
    e[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    e[20..24].copy_from_slice(&1u32.to_le_bytes());
    e[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    e[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    e[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    e[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
    let ph = 64;
    let off = 0x1000u64;
    e[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e[ph + 4..ph + 8].copy_from_slice(&7u32.to_le_bytes()); // RWX
    e[ph + 8..ph + 16].copy_from_slice(&off.to_le_bytes());
    e[ph + 16..ph + 24].copy_from_slice(&vaddr.to_le_bytes());
    e[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    e[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    e.resize(off as usize, 0);
    e.extend_from_slice(code);
    e
}

#[test]
fn kernel_address_from_kcore_with_kallsyms_symbol() {
    let dir = tempfile::tempdir().unwrap();
    let kbase = 0xffff_ffff_8100_0000u64;
    let (code, ips) = common::asm(kbase, |a| {
        a.push(rbp)?;
        a.mov(rbp, rsp)?;
        a.nop()?;
        a.pop(rbp)?;
        a.sysretq()
    });
    assert_eq!(
        disasm(&code, kbase),
        ["push rbp", "mov rbp,rsp", "nop", "pop rbp", "sysretq"]
    );
    let kcore = dir.path().join("kcore");
    std::fs::write(&kcore, kcore_elf(kbase, &code)).unwrap();
    let kallsyms = "ffffffff80ffff00 T before_func\nffffffff81000000 T entry_SYSCALL_test\nffffffff81001000 t next_func\n";
    let spec = ImageSpec {
        kcore: Some(kcore.clone()),
        ..Default::default()
    };
    let space = spec.load().unwrap();
    let mut syms = Symbols::new();
    syms.add_kallsyms(&dir.path().join("kallsyms"), kallsyms)
        .unwrap();
    let mut w = PtWriter::new();
    w.psb_plus(None, None).tip_pge(ips[0]).tip_pgd(None);
    let recs = decode_window(
        &w.buf,
        None,
        &TraceParams::default(),
        &space,
        &spec,
        &WindowOptions::default(),
    )
    .unwrap();
    assert!(gaps(&recs).is_empty(), "{:?}", gaps(&recs));
    assert_eq!(common::pcs(&recs), ips);
    let last = recs
        .iter()
        .rev()
        .filter_map(|r| r.as_instruction())
        .next()
        .unwrap();
    assert_eq!(last.class, drpttracer::decode::InsnClass::FarReturn);
    assert_eq!(
        syms.lookup(ips[2]),
        Some(("entry_SYSCALL_test", ips[2] - kbase))
    );
}

#[test]
fn aux_truncation_in_sideband_is_a_lost_data_gap() {
    use drpttracer::decode::GapKind;
    use drpttracer::sideband::record::{encode_aux, SampleId};
    let (code, ips) = cond_chain(1);
    let sample = SampleId {
        pid: Some(1),
        tid: Some(1),
        time: Some(150),
        cpu: Some(0),
        identifier: Some(0),
        ..Default::default()
    };
    let sb = encode_aux(0, 4096, 0x1, &sample, TEST_SAMPLE_TYPE);
    let mut w = PtWriter::new();
    w.psb_plus(Some(100), None)
        .tip_pge(ips[0])
        .tnt(&[true])
        .tip_pgd(None);
    w.psb_plus(Some(200), None)
        .tip_pge(ips[0])
        .tnt(&[false])
        .tip_pgd(None);
    let params = TraceParams {
        time: Some(TimeConv {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
        }),
        ..Default::default()
    };
    let recs = decode_window(
        &w.buf,
        Some((&sb, TEST_SAMPLE_TYPE)),
        &params,
        &image(&code, BASE),
        &ImageSpec::default(),
        &WindowOptions {
            source: "aux.pt".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let g = gaps(&recs);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0].kind, GapKind::LostData);
    assert!(g[0].error.contains("truncated"), "{}", g[0].error);
    // Parallel decode gives the same records.
    let events = drpttracer::decode::sideband::parse_records("sb", &sb, TEST_SAMPLE_TYPE).unwrap();
    let par = drpttracer::decode::parallel::decode_parallel(
        &w.buf,
        &params,
        &image(&code, BASE),
        &events,
        &Default::default(),
        &WindowOptions {
            source: "aux.pt".into(),
            ..Default::default()
        },
        2,
    )
    .unwrap();
    assert_eq!(par, recs);
    // The gap sits between the two enabled stretches (after the first, before the second).
    let gi = recs
        .iter()
        .position(|r| matches!(r, Record::Gap(_)))
        .unwrap();
    assert_eq!(
        common::pcs(&recs[..gi]),
        vec![ips[0], ips[1], ips[3], ips[4]]
    );
    assert_eq!(
        common::pcs(&recs[gi..]),
        vec![ips[0], ips[1], ips[2], ips[3], ips[4]]
    );
}

#[test]
fn syscall_and_interrupt_are_visible() {
    let kbase = 0xffff_ffff_8100_0000u64;
    let (ucode, u) = common::asm(BASE, |a| {
        a.nop()?; // 0
        a.syscall()?; // 1
        a.nop()?; // 2
        a.nop()?; // 3
        a.jmp(rax) // 4
    });
    let (kcode, k) = common::asm(kbase, |a| {
        a.nop()?; // 0
        a.iretq() // 1
    });
    assert_eq!(disasm(&kcode, kbase), ["nop", "iretq"]);
    let mut space = image(&ucode, BASE);
    space.add_bytes("kernel", kcode.clone(), kbase);
    let mut w = PtWriter::new();
    // User-only view of a syscall: disabled after it, re-enabled at the next instruction.
    w.psb_plus(None, None)
        .tip_pge(u[0])
        .tip_pgd(None)
        .tip_pge(u[2]);
    // Then an interrupt (user+kernel view): FUP at the interrupted IP, TIP to the handler,
    // and the handler's iretq returns (TIP) to the interrupted IP.
    w.fup(u[3]).tip(k[0]).tip(u[3]).tip_pgd(None);
    let recs = decode(&w.buf, &space);
    assert!(gaps(&recs).is_empty(), "{:?}", gaps(&recs));
    let summary: Vec<String> = recs
        .iter()
        .map(|r| match r {
            Record::Instruction(i) => format!("insn {:#x}", i.pc),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            "TraceEnabled { ip: 4198400 }".to_string(),
            format!("insn {:#x}", u[0]),
            format!("insn {:#x}", u[1]),
            format!("Syscall {{ pc: {} }}", u[1]),
            "TraceDisabled { ip: None }".to_string(),
            format!("TraceEnabled {{ ip: {} }}", u[2]),
            format!("insn {:#x}", u[2]),
            format!("KernelXfer {{ from: {}, to: Some({}) }}", u[3], k[0]),
            format!("insn {:#x}", k[0]),
            format!("insn {:#x}", k[1]),
            format!("insn {:#x}", u[3]),
            format!("insn {:#x}", u[4]),
            "TraceDisabled { ip: None }".to_string(),
        ]
    );
}

#[test]
fn overflow_is_a_marker_and_decoding_resumes_at_its_fup() {
    let (code, ips) = cond_chain(2);
    let mut w = PtWriter::new();
    w.psb_plus(None, None).tip_pge(ips[0]).tnt(&[true]);
    w.ovf().fup(ips[4]).tnt(&[false]).tip_pgd(None);
    let recs = decode(&w.buf, &image(&code, BASE));
    assert!(gaps(&recs).is_empty(), "{:?}", gaps(&recs));
    let ovf = recs
        .iter()
        .position(|r| matches!(r, Record::Overflow { .. }))
        .unwrap();
    assert_eq!(recs[ovf], Record::Overflow { ip: Some(ips[4]) });
    // Before: up to branch 0 (its bit consumed); where execution went between that and
    // the overflow is unknown, so nothing more is claimed.
    assert_eq!(common::pcs(&recs[..ovf]), vec![ips[0], ips[1]]);
    // After: resumes at the FUP, branch 1 not taken.
    assert_eq!(
        common::pcs(&recs[ovf..]),
        vec![ips[4], ips[5], ips[6], ips[7], ips[8]]
    );
}

#[test]
fn endless_loop_of_direct_branches_ends_in_a_gap() {
    // A loop that needs no trace: libipt could decode it forever. The decoder gives up
    // after 2^22 instructions without the trace position moving (a gap that says so),
    // then resyncs; with no PSB left, decoding ends.
    let (code, ips) = common::asm(BASE, |a| {
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        a.nop()?;
        a.add(eax, 1)?;
        a.jmp(top)
    });
    assert_eq!(
        disasm(&code, BASE),
        ["nop", "add eax,1", "jmp short 0000000000401000h"]
    );
    let mut w = PtWriter::new();
    w.psb_plus(Some(10), None)
        .tip_pge(ips[0])
        .tnt(&[true, false]);
    let space = image(&code, BASE);
    let mk = || {
        PtDecoder::new(
            &w.buf,
            TraceParams::default(),
            space.clone(),
            vec![],
            ImageResolver::default(),
            WindowOptions {
                source: "loop.pt".into(),
                ..Default::default()
            },
        )
        .unwrap()
    };
    // The same through the decoder's fast loop and through the iterator.
    let mut by_slices = (0u64, vec![]);
    mk().for_each_slice(|s| {
        for r in s {
            match r {
                Record::Instruction(i) => {
                    assert_eq!(i.pc, ips[by_slices.0 as usize % 3]);
                    by_slices.0 += 1;
                }
                other => by_slices.1.push(other.clone()),
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    let mut by_iter = (0u64, vec![]);
    for r in mk() {
        match r {
            Record::Instruction(_) => by_iter.0 += 1,
            other => by_iter.1.push(other),
        }
    }
    assert_eq!(by_slices, by_iter);
    let (n, markers) = by_slices;
    // The limit counts from the first progress check and is checked every 2^16
    // instructions or more (libipt makes blocks of up to 65535 instructions here): at
    // most two check intervals of two such blocks each beyond 2^22.
    assert!(
        (1 << 22..(1 << 22) + (1 << 18)).contains(&n),
        "{n} instructions"
    );
    let gaps: Vec<&Gap> = markers
        .iter()
        .filter_map(|r| match r {
            Record::Gap(g) => Some(&**g),
            _ => None,
        })
        .collect();
    assert_eq!(gaps.len(), 1, "{markers:?}");
    assert!(
        gaps[0].error.contains("4194304 instructions without trace"),
        "{}",
        gaps[0].error
    );
    assert_eq!(gaps[0].source, "loop.pt");
    assert_eq!(
        markers.last(),
        Some(&Record::Gap(Box::new(gaps[0].clone())))
    );
}

/// The decoder stops where the trace stops (libipt's `pts_eos`, where ptxed prints
/// `[end of trace]`): nothing after the last instruction the trace accounts for, whatever
/// code follows in the image (here `nop; nop; hlt…`, which needs no trace to walk).
#[test]
fn the_decode_stops_where_the_trace_stops() {
    // 0: nop; 1: jz +2; 3: nop; 4: nop; 5: jmp rax; 7: hlt × 5
    let base = 0x40_1000u64;
    let code = [
        0x90, 0x74, 0x02, 0x90, 0x90, 0xff, 0xe0, 0xf4, 0xf4, 0xf4, 0xf4, 0xf4,
    ];
    let space = image(&code, base);
    let insns = |recs: &[Record]| {
        common::pcs(recs)
            .iter()
            .map(|p| p - base)
            .collect::<Vec<_>>()
    };
    let no_gaps = |recs: &[Record]| {
        assert!(
            !recs.iter().any(|r| matches!(r, Record::Gap(_))),
            "{recs:?}"
        )
    };

    // A TNT (jz not taken), then the end of the stream.
    let mut w = PtWriter::new();
    w.psb().mode64().psbend().tip_pge(base).tnt(&[false]);
    let recs = decode(&w.buf, &space);
    no_gaps(&recs);
    assert_eq!(insns(&recs), vec![0, 1]);

    // A TNT (taken), then a TIP for `jmp rax` back to the start, then the end.
    let mut w = PtWriter::new();
    w.psb()
        .mode64()
        .psbend()
        .tip_pge(base)
        .tnt(&[true])
        .tip(base);
    let recs = decode(&w.buf, &space);
    no_gaps(&recs);
    assert_eq!(insns(&recs), vec![0, 1, 5]);

    // An asynchronous branch (FUP+TIP) as the last packets: the interrupted instruction
    // (the jz) was not executed, and nothing at the handler is known.
    let mut w = PtWriter::new();
    w.psb()
        .mode64()
        .psbend()
        .tip_pge(base)
        .fup(base + 1)
        .tip(base + 7);
    let recs = decode(&w.buf, &space);
    no_gaps(&recs);
    assert_eq!(insns(&recs), vec![0]);

    // A PSB+ that ends the stream, with no enable: nothing at all, not a gap.
    let mut w = PtWriter::new();
    w.psb().mode64().psbend();
    let recs = decode(&w.buf, &space);
    assert!(
        recs.iter().all(|r| r.as_instruction().is_none()),
        "{recs:?}"
    );
    no_gaps(&recs);
}

/// The same end in PSB-parallel decode: the last segment stops where the trace does, and
/// the whole equals the sequential decode.
#[test]
fn the_last_psb_segment_stops_where_the_trace_stops() {
    let base = 0x40_1000u64;
    let code = [
        0x90, 0x74, 0x02, 0x90, 0x90, 0xff, 0xe0, 0xf4, 0xf4, 0xf4, 0xf4, 0xf4,
    ];
    let space = image(&code, base);
    let mut w = PtWriter::new();
    w.psb().mode64().psbend().tip_pge(base);
    for _ in 0..200 {
        w.tnt(&[true]).tip(base);
    }
    w.psb_plus(None, Some(base)).tnt(&[false]);
    let seq = decode(&w.buf, &space);
    let par = drpttracer::decode::parallel::decode_parallel(
        &w.buf,
        &TraceParams::default(),
        &space,
        &[],
        &ImageResolver::default(),
        &WindowOptions {
            source: "test.pt".into(),
            ..Default::default()
        },
        2,
    )
    .unwrap();
    assert_eq!(par, seq);
    let p = common::pcs(&seq);
    assert_eq!(p.len(), 3 * 200 + 2, "{:?}", &p[p.len() - 5..]);
    assert_eq!(&p[p.len() - 2..], &[base, base + 1]);
}

/// Address filters (`--filter`): on a CPU with erratum SKL014 a direct branch out of a
/// filtered range can end tracing with a TIP.PGD that lost its IP; knowing the filter,
/// the decoder binds the disable to the branch whose target leaves the range.
#[test]
fn address_filters_place_a_suppressed_disable_skl014() {
    let base = 0x40_1000u64;
    // 0: nop; 1: jmp +0x1e (to 0x21, outside the filter); 0x21..: hlt
    let mut code = vec![0x90, 0xeb, 0x1e];
    code.resize(0x40, 0xf4);
    let space = image(&code, base);
    let mut w = PtWriter::new();
    w.psb().mode64().psbend().tip_pge(base).tip_pgd(None);
    let run = |filter: &[&str]| {
        let mut params = TraceParams::default();
        params.cpu.family = 6;
        params.cpu.model = 78; // Skylake: SKL014
        params.cpu.stepping = 3;
        for f in filter {
            params.filter.set(f).unwrap();
        }
        decode_window(
            &w.buf,
            None,
            &params,
            &space,
            &ImageSpec::default(),
            &WindowOptions {
                source: "test.pt".into(),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let with = run(&["0:filter,0x401000,0x40100f"]);
    assert_eq!(common::pcs(&with), vec![base, base + 1], "{with:?}");
    assert!(
        !with.iter().any(|r| matches!(r, Record::Gap(_))),
        "{with:?}"
    );
    assert!(
        matches!(with.last(), Some(Record::TraceDisabled { .. })),
        "{with:?}"
    );
    // Without the filter the disable cannot be placed: the decoder runs on into code the
    // trace does not cover and reports it.
    let without = run(&[]);
    assert_ne!(without, with);
    assert!(
        without.iter().any(|r| matches!(r, Record::Gap(_))),
        "{without:?}"
    );
    // The option's errors name it.
    let mut f = drpttracer::decode::AddrFilter::default();
    assert_eq!(
        f.set("4:filter,1,2").unwrap_err(),
        "--filter '4:filter,1,2': the range number is 0, 1, 2 or 3"
    );
    assert_eq!(
        f.set("filter,9,2").unwrap_err(),
        "--filter 'filter,9,2': A is above B"
    );
    assert_eq!(
        f.set("maybe,1,2").unwrap_err(),
        "--filter 'maybe,1,2': CFG is off, filter or stop"
    );
    f.set("1:stop,0x10,0x20").unwrap();
    assert_eq!(f.ranges[1], (2, 0x10, 0x20));
}
