//! Copies of kernel symbols and text beside the kernel-mode trace (normal context, at
//! start-up), as DynamoRIO does: `kernel.raw/kallsyms` (a copy of /proc/kallsyms) and
//! `kernel.raw/kcore` (an ELF core file with one PT_LOAD segment holding the kernel text
//! `_stext`..`_etext`, read from /proc/kcore). Each is copied once per output directory;
//! what could not be copied is reported with its reason (the info file's `Config` record).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Largest kernel text copied (a sanity bound on `_etext - _stext`).
const MAX_TEXT: u64 = 256 << 20;

/// `_stext` and `_etext` from kallsyms text.
pub fn text_range(kallsyms: &str) -> Option<(u64, u64)> {
    let mut s = None;
    let mut e = None;
    for line in kallsyms.lines() {
        let mut it = line.split_whitespace();
        let (Some(addr), Some(_), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let Ok(a) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        match name {
            "_stext" => s = Some(a),
            "_etext" => e = Some(a),
            _ => {}
        }
    }
    match (s, e) {
        (Some(s), Some(e)) if s != 0 && e > s => Some((s, e)),
        _ => None,
    }
}

fn rd_u16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |x| u16::from_le_bytes([x[0], x[1]]))
}
fn rd_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|x| x.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
fn rd_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|x| x.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Reads `[start, end)` of kernel virtual memory from an ELF core file (/proc/kcore).
pub fn read_core_range(core: &File, start: u64, end: u64) -> Result<Vec<u8>, String> {
    let mut eh = [0u8; 64];
    core.read_exact_at(&mut eh, 0)
        .map_err(|e| format!("cannot read the ELF header: {e}"))?;
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 {
        return Err("not an ELF64 file".into());
    }
    let phoff = rd_u64(&eh, 0x20);
    let phentsize = u64::from(rd_u16(&eh, 0x36));
    let phnum = u64::from(rd_u16(&eh, 0x38));
    if phentsize < 56 {
        return Err(format!("program header size {phentsize} < 56"));
    }
    for i in 0..phnum {
        let mut ph = [0u8; 56];
        core.read_exact_at(&mut ph, phoff + i * phentsize)
            .map_err(|e| format!("cannot read program header {i}: {e}"))?;
        if rd_u32(&ph, 0) != 1 {
            continue; // not PT_LOAD
        }
        let (off, vaddr, filesz) = (rd_u64(&ph, 8), rd_u64(&ph, 16), rd_u64(&ph, 32));
        if start >= vaddr && end <= vaddr.saturating_add(filesz) {
            let mut out = vec![0u8; (end - start) as usize];
            core.read_exact_at(&mut out, off + (start - vaddr))
                .map_err(|e| format!("cannot read the kernel text: {e}"))?;
            return Ok(out);
        }
    }
    Err(format!(
        "no PT_LOAD segment covers the kernel text {start:#x}..{end:#x}"
    ))
}

/// A minimal ELF64 core file with one PT_LOAD (R+X) of `text` at `vaddr`.
pub fn core_elf(vaddr: u64, text: &[u8]) -> Vec<u8> {
    const DATA_OFF: u64 = 4096;
    let mut b = vec![0u8; DATA_OFF as usize];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // ELFCLASS64
    b[5] = 1; // little endian
    b[6] = 1; // EV_CURRENT
    b[16..18].copy_from_slice(&4u16.to_le_bytes()); // ET_CORE
    b[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    b[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    b[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
    let ph = &mut b[64..120];
    ph[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    ph[4..8].copy_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    ph[8..16].copy_from_slice(&DATA_OFF.to_le_bytes());
    ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
    ph[24..32].copy_from_slice(&0u64.to_le_bytes()); // p_paddr
    ph[32..40].copy_from_slice(&(text.len() as u64).to_le_bytes());
    ph[40..48].copy_from_slice(&(text.len() as u64).to_le_bytes());
    ph[48..56].copy_from_slice(&4096u64.to_le_bytes());
    b.extend_from_slice(text);
    b
}

/// Copies kallsyms and the kernel text into `dir` unless already there; returns one
/// status line per file for the info file.
pub fn copy_into(dir: &Path, kallsyms_src: &Path, kcore_src: &Path) -> String {
    let mut notes = String::new();
    if let Err(e) = std::fs::create_dir_all(dir) {
        return format!("# kallsyms, kcore: cannot create {}: {e}\n", dir.display());
    }
    let ks_dst = dir.join("kallsyms");
    let kc_dst = dir.join("kcore");
    // Every traced process calls this: decide from cheap checks before reading kallsyms.
    let core = if kc_dst.exists() {
        notes.push_str("# kcore: already present\n");
        None
    } else {
        match File::open(kcore_src) {
            Ok(f) => Some(f),
            Err(e) => {
                notes.push_str(&format!(
                    "# kcore: not copied: {}: {e}\n",
                    kcore_src.display()
                ));
                None
            }
        }
    };
    let need_syms = !ks_dst.exists() || core.is_some();
    let syms = if need_syms {
        std::fs::read_to_string(kallsyms_src)
            .map_err(|e| format!("{}: {e}", kallsyms_src.display()))
    } else {
        Err(String::new())
    };
    if ks_dst.exists() {
        notes.push_str("# kallsyms: already present\n");
    } else {
        match &syms {
            Ok(text) => match std::fs::write(&ks_dst, text) {
                Ok(()) => notes.push_str("# kallsyms: copied\n"),
                Err(e) => notes.push_str(&format!(
                    "# kallsyms: cannot write {}: {e}\n",
                    ks_dst.display()
                )),
            },
            Err(e) => notes.push_str(&format!("# kallsyms: not copied: {e}\n")),
        }
    }
    let Some(core) = core else {
        return notes;
    };
    let result = (|| -> Result<usize, String> {
        let syms = syms.as_ref().map_err(|e| format!("no kallsyms ({e})"))?;
        let (s, e) = text_range(syms).ok_or(
            "kallsyms has no nonzero _stext/_etext (kernel.kptr_restrict hides addresses)",
        )?;
        if e - s > MAX_TEXT {
            return Err(format!(
                "kernel text of {} bytes is implausibly large",
                e - s
            ));
        }
        let text = read_core_range(&core, s, e)?;
        let mut f = File::create(&kc_dst).map_err(|err| format!("{}: {err}", kc_dst.display()))?;
        f.write_all(&core_elf(s, &text))
            .map_err(|err| format!("{}: {err}", kc_dst.display()))?;
        Ok(text.len())
    })();
    match result {
        Ok(n) => notes.push_str(&format!("# kcore: copied {n} bytes of kernel text\n")),
        Err(e) => notes.push_str(&format!("# kcore: not copied: {e}\n")),
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_range_from_kallsyms() {
        let k = "ffffffff81000000 T _text\nffffffff81000000 T _stext\nffffffff82209988 T _etext\n";
        assert_eq!(
            text_range(k),
            Some((0xffffffff81000000, 0xffffffff82209988))
        );
        let hidden = "0000000000000000 T _stext\n0000000000000000 T _etext\n";
        assert_eq!(text_range(hidden), None);
    }

    #[test]
    fn kernel_text_is_extracted_from_a_core_file_into_a_loadable_elf() {
        // A fake /proc/kcore: two PT_LOAD segments; the text lies in the second.
        let tmp = tempfile::tempdir().unwrap();
        let text: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut core = core_elf(0xffff_8880_0000_0000, &[0xAA; 100]);
        // Append a second program header by rebuilding: header with 2 entries.
        core[56..58].copy_from_slice(&2u16.to_le_bytes());
        let data2_off = core.len() as u64;
        let vaddr2 = 0xffff_ffff_8100_0000u64;
        let mut ph2 = [0u8; 56];
        ph2[0..4].copy_from_slice(&1u32.to_le_bytes());
        ph2[8..16].copy_from_slice(&data2_off.to_le_bytes());
        ph2[16..24].copy_from_slice(&vaddr2.to_le_bytes());
        ph2[32..40].copy_from_slice(&0x10000u64.to_le_bytes());
        core[120..176].copy_from_slice(&ph2);
        let mut seg = vec![0u8; 0x10000];
        seg[0x100..0x100 + text.len()].copy_from_slice(&text);
        core.extend_from_slice(&seg);
        let kcore = tmp.path().join("kcore.src");
        std::fs::write(&kcore, &core).unwrap();
        let ksyms = tmp.path().join("kallsyms.src");
        std::fs::write(
            &ksyms,
            format!(
                "{:016x} T _stext\n{:016x} T _etext\n",
                vaddr2 + 0x100,
                vaddr2 + 0x100 + text.len() as u64
            ),
        )
        .unwrap();
        let out = tmp.path().join("kernel.raw");
        let notes = copy_into(&out, &ksyms, &kcore);
        assert!(notes.contains("# kallsyms: copied"), "{notes}");
        assert!(notes.contains("# kcore: copied 5000 bytes"), "{notes}");
        // The copy is an ELF whose only PT_LOAD maps exactly the text at _stext.
        let f = File::open(out.join("kcore")).unwrap();
        let got = read_core_range(&f, vaddr2 + 0x100, vaddr2 + 0x100 + 5000).unwrap();
        assert_eq!(got, text);
        let bytes = std::fs::read(out.join("kcore")).unwrap();
        assert_eq!(rd_u16(&bytes, 0x38), 1);
        assert_eq!(rd_u64(&bytes, 64 + 16), vaddr2 + 0x100);
        // A second call leaves both alone.
        assert!(copy_into(&out, &ksyms, &kcore).contains("# kcore: already present"));
        // Without a readable core the reason is given.
        let out2 = tmp.path().join("other");
        let notes = copy_into(&out2, &ksyms, &tmp.path().join("missing"));
        assert!(
            notes.contains("# kcore: not copied:") && notes.contains("missing"),
            "{notes}"
        );
    }
}
