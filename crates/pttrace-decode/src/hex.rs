//! Lowercase hexadecimal digits without `fmt`, for the listings that print numbers by the
//! million (`dump`'s packets, `decode`'s instruction and access lines): a number put
//! through `fmt` costs hundreds of machine instructions.

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The 16 hexadecimal digits of `v` (zero-padded: `{v:016x}`) and how many of them are
/// significant (one for zero): `digits[16 - n..]` is `{v:x}`.
#[inline]
pub fn digits(v: u64) -> ([u8; 16], usize) {
    let mut d = [0u8; 16];
    for (k, c) in d.iter_mut().rev().enumerate() {
        *c = HEX[(v >> (4 * k) & 0xf) as usize];
    }
    (d, ((64 - (v | 1).leading_zeros()).div_ceil(4)) as usize)
}

/// `v` as `{v:0width$x}` appended to `s` (`width` at most 16). (Only the digits written
/// are computed: `digits` and a check of its bytes as text cost a `dump` line a tenth
/// more.)
#[inline]
pub fn push_padded(s: &mut String, v: u64, width: usize) {
    let push = |s: &mut String, k: usize| s.push(char::from(HEX[(v >> (4 * k) & 0xf) as usize]));
    if width >= 16 {
        // (All 16: a loop of known length, `dump`'s offsets.)
        (0..16).rev().for_each(|k| push(s, k));
    } else {
        let n = ((64 - (v | 1).leading_zeros()).div_ceil(4) as usize).max(width);
        (0..n).rev().for_each(|k| push(s, k));
    }
}

/// Byte `b`'s two digits (`{b:02x}`).
#[inline]
pub fn byte(b: u8) -> [u8; 2] {
    [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_those_fmt_writes() {
        for v in [0, 1, 0xf, 0x10, 0x1002, 0xdead_beef, 1 << 63, u64::MAX] {
            let (d, n) = digits(v);
            assert_eq!(std::str::from_utf8(&d).unwrap(), format!("{v:016x}"));
            assert_eq!(std::str::from_utf8(&d[16 - n..]).unwrap(), format!("{v:x}"));
            for width in [0, 1, 4, 8, 12, 16] {
                let mut s = "kept ".to_string();
                push_padded(&mut s, v, width);
                assert_eq!(s, format!("kept {v:0width$x}"));
            }
        }
        for b in [0u8, 9, 0xa, 0x7f, 0xff] {
            assert_eq!(std::str::from_utf8(&byte(b)).unwrap(), format!("{b:02x}"));
        }
    }
}
