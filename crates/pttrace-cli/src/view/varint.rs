//! Varints (LEB128: protobuf's, and the spill and kept-calls files') written in place,
//! into a buffer's room through a cursor that stays in a register: a push per byte made
//! the vector's length be read back from memory after each byte's store. (They are read,
//! and appended where records are put together piece by piece, by `pttrace_format::leb128`.)

/// Writes varint `v` into `w` at `*n`, moving `*n` past it (up to 10 bytes; bytes that
/// would fall past `w` are dropped, which callers rule out by giving room enough).
#[inline(always)]
pub(super) fn put_at(w: &mut [u8], n: &mut usize, mut v: u64) {
    while v >= 0x80 {
        if let Some(b) = w.get_mut(*n) {
            *b = (v as u8) | 0x80;
        }
        *n += 1;
        v >>= 7;
    }
    if let Some(b) = w.get_mut(*n) {
        *b = v as u8;
    }
    *n += 1;
}

/// Writes byte `b` into `w` at `*n`, moving `*n` past it.
#[inline(always)]
pub(super) fn put_byte(w: &mut [u8], n: &mut usize, b: u8) {
    if let Some(x) = w.get_mut(*n) {
        *x = b;
    }
    *n += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use pttrace_format::leb128;

    #[test]
    fn varints_are_leb128_in_place() {
        let mut w = [0xeeu8; 16];
        let mut n = 1;
        put_at(&mut w, &mut n, 0);
        put_at(&mut w, &mut n, 0x7f);
        put_at(&mut w, &mut n, 300);
        put_byte(&mut w, &mut n, 9);
        put_at(&mut w, &mut n, u64::MAX);
        assert_eq!(n, 1 + 1 + 1 + 2 + 1 + 10);
        assert_eq!(w[..6], [0xee, 0x00, 0x7f, 0xac, 0x02, 9]);
        assert_eq!(w[6..15], [0xff; 9]);
        assert_eq!(w[15], 0x01);
        // Appended by the formats' appender: the same bytes.
        let mut v = vec![0xee];
        for x in [0, 0x7f, 300] {
            leb128::push(&mut v, x);
        }
        assert_eq!(v, w[..5]);
        // Read back by the formats' reader.
        let mut at = 1;
        let back: Vec<Option<u64>> = (0..3).map(|_| leb128::read(&w, &mut at)).collect();
        assert_eq!(back, [Some(0), Some(0x7f), Some(300)]);
        at += 1;
        assert_eq!((leb128::read(&w, &mut at), at), (Some(u64::MAX), 16));
        // Cut short, or eleven bytes long: none.
        assert_eq!(leb128::read(&w[..15], &mut 6), None);
        assert_eq!(leb128::read(&[0x80; 11], &mut 0), None);
        // Past the room: dropped, the cursor still moved.
        let mut short = [0u8; 1];
        let mut n = 0;
        put_at(&mut short, &mut n, 300);
        assert_eq!((short, n), ([0xac], 2));
    }
}
