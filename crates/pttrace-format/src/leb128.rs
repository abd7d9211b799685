//! Unsigned LEB128 varints (protobuf's), as the formats here and `view`'s files write
//! them: the one reader and appender of them.

/// The varint at `b[*pos..]`, moving `*pos` past it; `None` when `b` ends within it or it
/// runs past 10 bytes.
#[inline(always)]
pub fn read(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let c = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(c & 0x7f) << shift;
        if c & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Appends varint `v` to `out`.
#[inline]
pub fn push(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_read_back_as_pushed() {
        let mut b = vec![0xee];
        for v in [0, 0x7f, 300, u64::MAX] {
            push(&mut b, v);
        }
        assert_eq!(b[..5], [0xee, 0x00, 0x7f, 0xac, 0x02]);
        assert_eq!(b[5..14], [0xff; 9]);
        assert_eq!(b[14], 0x01);
        let mut at = 1;
        let back: Vec<Option<u64>> = (0..4).map(|_| read(&b, &mut at)).collect();
        assert_eq!(back, [Some(0), Some(0x7f), Some(300), Some(u64::MAX)]);
        assert_eq!(at, b.len());
        // Cut short, or eleven bytes long: none.
        assert_eq!(read(&b[..14], &mut 5), None);
        assert_eq!(read(&[0x80; 11], &mut 0), None);
    }
}
