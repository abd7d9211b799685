//! V8's embedded builtins run from a copy: where the machine has enough memory, V8 (node,
//! chromium) copies the code of its builtins, embedded in the executable between the
//! symbols `v8_Default_embedded_blob_code_` and `+ v8_Default_embedded_blob_code_size_`
//! (a `u32` in read-only data), into anonymous memory next to its JIT code so that JIT
//! code reaches them with short calls ("short builtin calls"). The copy has no symbols and
//! perf maps name the builtins at their addresses in the executable, so code run in the
//! copy stays unnamed unless it is mapped back. The copy starts on a page, and its bytes
//! are the blob's: code bytes seen at one address of the copy place it.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol};

const BLOB_START: &str = "v8_Default_embedded_blob_code_";
const BLOB_SIZE: &str = "v8_Default_embedded_blob_code_size_";

/// The copy starts on a page of at least this size.
const PAGE: u64 = 4096;

/// Fewest code bytes that may place the copy (shorter runs repeat inside the blob).
const MIN_MATCH: usize = 16;

/// The embedded builtins of one ELF file.
#[derive(Debug, Clone)]
pub struct EmbeddedBlob {
    /// The blob's first byte, as an address of the ELF file.
    pub vaddr: u64,
    code: Vec<u8>,
}

impl EmbeddedBlob {
    /// The blob of the ELF file at `path`; `None` where it has none (not V8, or its symbol
    /// table was stripped).
    pub fn of_file(path: &Path) -> Option<Self> {
        let buf = crate::elf::map_file(path).ok()?;
        let obj = object::File::parse(buf.as_slice()).ok()?;
        let (mut start, mut size_at) = (None, None);
        for s in obj.symbols() {
            match s.name() {
                Ok(BLOB_START) => start = Some(s.address()),
                Ok(BLOB_SIZE) => size_at = Some(s.address()),
                _ => {}
            }
            if start.is_some() && size_at.is_some() {
                break;
            }
        }
        let (vaddr, size_at) = (start?, size_at?);
        let size = u32::from_le_bytes(read_at(&obj, size_at, 4)?.try_into().ok()?);
        let code = read_at(&obj, vaddr, size as usize)?.to_vec();
        Some(EmbeddedBlob { vaddr, code })
    }

    /// The blob's size in bytes.
    pub fn len(&self) -> usize {
        self.code.len()
    }

    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }

    /// Where the copy that holds `bytes` at `addr` starts, when exactly one page-aligned
    /// placement of the blob has those bytes there (at least [`MIN_MATCH`] of them).
    pub fn copy_start(&self, addr: u64, bytes: &[u8]) -> Option<u64> {
        if bytes.len() < MIN_MATCH || bytes.len() > self.code.len() {
            return None;
        }
        // Offsets in the blob that put its copy's start on a page: congruent to `addr`.
        let first = (addr % PAGE) as usize;
        let mut found = None;
        for off in (first..=self.code.len() - bytes.len()).step_by(PAGE as usize) {
            if self.code.get(off..off + bytes.len()) == Some(bytes) {
                if found.is_some() {
                    return None;
                }
                // (A copy would start below address 0: no placement.)
                found = Some(addr.checked_sub(off as u64)?);
            }
        }
        found
    }

    /// Whether a copy of the blob starting at `copy` holds `bytes` at `addr`.
    pub fn holds(&self, copy: u64, addr: u64, bytes: &[u8]) -> bool {
        addr.checked_sub(copy)
            .and_then(|off| usize::try_from(off).ok())
            .and_then(|off| self.code.get(off..off.checked_add(bytes.len())?))
            == Some(bytes)
    }
}

/// `len` bytes of the section holding address `addr` of the ELF file.
fn read_at<'d>(obj: &object::File<'d>, addr: u64, len: usize) -> Option<&'d [u8]> {
    let sec = obj
        .sections()
        .find(|s| addr >= s.address() && addr - s.address() < s.size())?;
    let data = sec.data().ok()?;
    let off = usize::try_from(addr - sec.address()).ok()?;
    data.get(off..off.checked_add(len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(code: Vec<u8>) -> EmbeddedBlob {
        EmbeddedBlob {
            vaddr: 0x18c_4000,
            code,
        }
    }

    /// Bytes that do not repeat at any page offset: each 8-byte word holds its index.
    fn distinct(len: usize) -> Vec<u8> {
        (0..len / 8)
            .flat_map(|i| (i as u64 * 0x9e37_79b9 + 7).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_copy_is_placed_by_its_bytes_on_a_page() {
        let b = blob(distinct(3 * 4096));
        let copy = 0x7f2d_dbe4_0000u64;
        let (off, len) = (4096 + 0x2c0, 24);
        let bytes = &b.code[off..off + len];
        assert_eq!(b.copy_start(copy + off as u64, bytes), Some(copy));
        // The same bytes at an address that would not put the copy on a page.
        assert_eq!(b.copy_start(copy + off as u64 + 8, bytes), None);
        // Too short to place it.
        assert_eq!(b.copy_start(copy + off as u64, &bytes[..8]), None);
        // Bytes that are not the blob's.
        assert_eq!(b.copy_start(copy + off as u64, &[0xcc; 24]), None);
        // The blob's bytes at an address too low for a copy to hold them there.
        assert_eq!(b.copy_start(0x2c0, bytes), None);
        // Once placed, a shorter run confirms it, at its own place only.
        assert!(b.holds(copy, copy + off as u64, &bytes[..8]));
        assert!(!b.holds(copy, copy + off as u64 + 8, &bytes[..8]));
        assert!(!b.holds(copy, copy - 8, &bytes[..8]));
        assert!(!b.holds(copy, copy + 3 * 4096 - 4, &bytes[..8]));
    }

    #[test]
    fn bytes_found_at_two_placements_place_nothing() {
        let mut code = distinct(3 * 4096);
        let run: Vec<u8> = code[0x40..0x40 + 32].to_vec();
        code[2 * 4096 + 0x40..2 * 4096 + 0x40 + 32].copy_from_slice(&run);
        let b = blob(code);
        assert_eq!(b.copy_start(0x7000_0040, &run), None);
    }
}
