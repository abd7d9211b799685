//! `decode`'s lines, made without `fmt`: an instruction's (`--format disasm`: address,
//! symbol, bytes, disassembly; `--format jsonl`: the record as JSON), made once per
//! instruction and kept ([`KeptLines`]), and a load's or store's (`--format jsonl` of a
//! `run --memory` trace). A trace runs the same instructions over and over, and a
//! disassembly line put together through `fmt`, byte by byte, cost some 6,800 machine
//! instructions (`sh` pipeline: 5.5 M lines, 37 G), a JSON line through
//! `serde_json::Value` more.

use drpttracer::decode::hex::{byte, digits};
use drpttracer::decode::records::{ExecMode, InsnClass, Instruction};
use drpttracer::format::memory::Access;

/// The lines made, by instruction: direct-mapped by address, each kept with the address,
/// mode, encoding and class it was made for (code rewritten in place, as JIT compilers do,
/// gets a line of its own), and a context of the caller's (the thread a JSON line names).
/// The names in a line are those of the symbols the printer had when it was made:
/// [`KeptLines::clear`] when they change.
pub(super) struct KeptLines {
    slots: Vec<Slot>,
}

#[derive(Default)]
struct Slot {
    key: Option<Key>,
    line: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    pc: u64,
    size: u8,
    bytes: [u8; 15],
    mode: ExecMode,
    class: InsnClass,
    context: i64,
}

impl Key {
    fn of(i: &Instruction, context: i64) -> Self {
        Key {
            pc: i.pc,
            size: i.size,
            bytes: i.bytes,
            mode: i.mode,
            class: i.class,
            context,
        }
    }
}

/// Lines kept: on `java -cp . Hello` under QEMU (82 M instructions) 2^14 slots missed 8 M
/// times, 2^16 3 M times; on node (570 M) 22 M and 4 M times.
const SLOTS: usize = 1 << 16;

impl KeptLines {
    pub(super) fn new() -> Self {
        KeptLines { slots: Vec::new() }
    }

    /// Forgets every line (the names they hold changed).
    pub(super) fn clear(&mut self) {
        for s in &mut self.slots {
            s.key = None;
        }
    }

    /// The line of `i` in `context` (with its newline), made by `make` into an empty
    /// buffer when it is not kept.
    pub(super) fn line(
        &mut self,
        i: &Instruction,
        context: i64,
        make: impl FnOnce(&mut Vec<u8>),
    ) -> &[u8] {
        if self.slots.is_empty() {
            self.slots.resize_with(SLOTS, Slot::default);
        }
        let key = Key::of(i, context);
        let at = (i.pc ^ (i.pc >> 14)) as usize % SLOTS;
        let Some(slot) = self.slots.get_mut(at) else {
            return &[];
        };
        if slot.key != Some(key) {
            slot.line.clear();
            make(&mut slot.line);
            slot.key = Some(key);
        }
        &slot.line
    }
}

/// `v` in lowercase hexadecimal, without leading zeros (one `0` for zero).
fn hex(out: &mut Vec<u8>, v: u64) {
    let (d, n) = digits(v);
    out.extend_from_slice(d.get(16 - n..).unwrap_or(&[]));
}

/// Appends the line of the instruction at `pc` (`encoding`, disassembled as `text`) inside
/// function `sym` (its name and the offset from its start; none: no name), with its
/// newline: `{pc:016x} <{name}+{off:#x}>  {bytes:<31} {text}`, the offset left out where
/// it is 0, the name where there is none (each byte `xx` and a space).
pub(super) fn format_line(
    out: &mut Vec<u8>,
    pc: u64,
    encoding: &[u8],
    sym: Option<(&str, u64)>,
    text: &str,
) {
    out.extend_from_slice(&digits(pc).0);
    if let Some((name, off)) = sym {
        out.extend_from_slice(b" <");
        out.extend_from_slice(name.as_bytes());
        if off != 0 {
            out.extend_from_slice(b"+0x");
            hex(out, off);
        }
        out.push(b'>');
    }
    out.extend_from_slice(b"  ");
    for &b in encoding {
        out.extend_from_slice(&byte(b));
        out.push(b' ');
    }
    // (The bytes' column is 31 characters wide, wider where they need it.)
    let pad = 31usize.saturating_sub(3 * encoding.len());
    out.resize(out.len() + pad, b' ');
    out.push(b' ');
    out.extend_from_slice(text.as_bytes());
    out.push(b'\n');
}

/// Appends the JSON line of access `a` by thread `tid`, with its newline:
/// `{"type":"read"|"write","addr":"0x…","size":N,"pc":"0x…","tid":T}`. (Put together in
/// a buffer of its own, pieces of known length copied without a call each.)
pub(super) fn access_line(out: &mut Vec<u8>, a: &Access, tid: i32) {
    let mut b = [0u8; 128];
    let mut n = 0;
    let mut put = |b: &mut [u8; 128], piece: &[u8]| {
        if let Some(to) = b.get_mut(n..n + piece.len()) {
            to.copy_from_slice(piece);
        }
        n += piece.len();
    };
    if a.store {
        put(&mut b, br#"{"type":"write","addr":"0x"#);
    } else {
        put(&mut b, br#"{"type":"read","addr":"0x"#);
    }
    let (d, len) = digits(a.addr);
    put(&mut b, d.get(16 - len..).unwrap_or(&[]));
    put(&mut b, br#"","size":"#);
    let mut num = itoa::Buffer::new();
    put(&mut b, num.format(a.size()).as_bytes());
    put(&mut b, br#","pc":"0x"#);
    let (d, len) = digits(a.pc);
    put(&mut b, d.get(16 - len..).unwrap_or(&[]));
    put(&mut b, br#"","tid":"#);
    put(&mut b, num.format(tid).as_bytes());
    put(&mut b, b"}\n");
    out.extend_from_slice(b.get(..n).unwrap_or(&[]));
}

#[cfg(test)]
mod tests {
    use super::*;
    use drpttracer::decode::records::{ExecMode, InsnClass};

    /// The line as `fmt` puts it together (what `format_line` replaced).
    fn by_fmt(pc: u64, encoding: &[u8], sym: Option<(&str, u64)>, text: &str) -> String {
        let bytes: String = encoding.iter().map(|b| format!("{b:02x} ")).collect();
        match sym {
            Some((name, 0)) => format!("{pc:016x} <{name}>  {bytes:<31} {text}\n"),
            Some((name, off)) => format!("{pc:016x} <{name}+{off:#x}>  {bytes:<31} {text}\n"),
            None => format!("{pc:016x}  {bytes:<31} {text}\n"),
        }
    }

    #[test]
    fn lines_are_those_fmt_made() {
        let encodings: [&[u8]; 6] = [
            &[],
            &[0x90],
            &[0x48, 0x89, 0xe7],
            &[0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0x66, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0],
            &[
                0xf0, 0x66, 0x2e, 0x67, 0x26, 0x48, 0x81, 0x84, 0xff, 1, 2, 3, 4, 5, 6,
            ],
        ];
        let syms = [
            None,
            Some(("_start", 0)),
            Some(("_dl_start", 0x14)),
            Some(("f", 0xabcdef)),
            Some(("ü<x>", u64::MAX)),
        ];
        for pc in [0, 0x40_0000, 0x0040_0081_bb70, u64::MAX] {
            for e in encodings {
                for s in syms {
                    let mut out = b"kept ".to_vec();
                    format_line(&mut out, pc, e, s, "mov rdi,rsp    ; a.c:3");
                    let want = by_fmt(pc, e, s, "mov rdi,rsp    ; a.c:3");
                    assert_eq!(String::from_utf8(out).unwrap(), format!("kept {want}"));
                }
            }
        }
        let mut out = Vec::new();
        for v in [0, 1, 0xf, 0x10, 0xdead_beef, 1 << 63, u64::MAX] {
            out.clear();
            hex(&mut out, v);
            assert_eq!(String::from_utf8(out.clone()).unwrap(), format!("{v:x}"));
        }
    }

    #[test]
    fn access_lines_are_those_fmt_made() {
        for (store, addr, shift, pc, tid) in [
            (false, 0, 0, 0, 0),
            (true, 0x0040_080d_7e8f, 3, 0x0040_0282_8b73, 26648),
            (false, u64::MAX, 15, u64::MAX, i32::MAX),
            (true, 1, 4, 0x10, -1),
        ] {
            let a = Access {
                pc,
                addr,
                size_shift: shift,
                store,
                again: false,
            };
            let mut out = b"kept ".to_vec();
            access_line(&mut out, &a, tid);
            let want = format!(
                "{{\"type\":\"{}\",\"addr\":\"{:#x}\",\"size\":{},\"pc\":\"{:#x}\",\"tid\":{}}}\n",
                if a.store { "write" } else { "read" },
                a.addr,
                a.size(),
                a.pc,
                tid
            );
            assert_eq!(String::from_utf8(out).unwrap(), format!("kept {want}"));
        }
    }

    fn insn(pc: u64, bytes: &[u8], mode: ExecMode) -> Instruction {
        let mut b = [0u8; 15];
        b[..bytes.len()].copy_from_slice(bytes);
        Instruction {
            pc,
            size: bytes.len() as u8,
            bytes: b,
            class: InsnClass::Other,
            mode,
        }
    }

    #[test]
    fn a_line_is_made_once_per_instruction_until_cleared() {
        let mut lines = KeptLines::new();
        let mut made = 0;
        let mut line = |lines: &mut KeptLines, i: &Instruction| -> String {
            let l = lines.line(i, 0, |out| {
                made += 1;
                format_line(out, i.pc, i.encoding(), None, &format!("#{made}"));
            });
            String::from_utf8(l.to_vec()).unwrap()
        };
        let nop = insn(0x1000, &[0x90], ExecMode::Bit64);
        let first = line(&mut lines, &nop);
        assert!(first.ends_with(" #1\n"), "{first}");
        assert_eq!(line(&mut lines, &nop), first);
        // Other bytes at that address (rewritten code), another mode: lines of their own.
        let int3 = insn(0x1000, &[0xcc], ExecMode::Bit64);
        assert!(line(&mut lines, &int3).ends_with(" #2\n"));
        let nop32 = insn(0x1000, &[0x90], ExecMode::Bit32);
        assert!(line(&mut lines, &nop32).ends_with(" #3\n"));
        // The unknown mode, which JSON names apart from 64-bit (its code decoded as
        // 64-bit code), too.
        assert!(line(&mut lines, &nop).ends_with(" #4\n"));
        let unknown = insn(0x1000, &[0x90], ExecMode::Unknown);
        assert!(line(&mut lines, &unknown).ends_with(" #5\n"));
        // Another context (thread): a line of its own.
        let l = lines.line(&nop32, 7, |out| out.extend_from_slice(b"in 7\n"));
        assert_eq!(l, b"in 7\n");
        let l = lines.line(&nop32, 7, |out| out.extend_from_slice(b"again\n"));
        assert_eq!(l, b"in 7\n");
        // An address in the same slot replaces it; the first is made again after it.
        // (The slot held the context 7 line; the nop's context 0 is made again.)
        assert!(line(&mut lines, &nop).ends_with(" #6\n"));
        let other = insn(
            0x1000 + (SLOTS as u64) * (1 << 14),
            &[0x90],
            ExecMode::Bit64,
        );
        let at = |pc: u64| (pc ^ (pc >> 14)) as usize % SLOTS;
        assert_eq!(at(other.pc), at(nop.pc));
        assert!(line(&mut lines, &other).ends_with(" #7\n"));
        assert!(line(&mut lines, &nop).ends_with(" #8\n"));
        assert!(line(&mut lines, &nop).ends_with(" #8\n"));
        lines.clear();
        assert!(line(&mut lines, &nop).ends_with(" #9\n"));
    }
}
