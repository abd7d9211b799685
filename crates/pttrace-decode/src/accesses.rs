//! Joins a window's loads and stores (the QEMU backend's `--memory`,
//! [`pttrace_format::memory`]) to its decoded instructions.
//!
//! The accesses are in execution order, each naming the instruction that made it. After
//! each decoded instruction come the accesses at the head of the stream whose pc is its
//! address, up to one that starts another execution of it (`again`): one instruction's
//! loads and stores, or a `rep` string instruction's for all its iterations (one
//! instruction for PT). An access whose instruction the decoder never shows
//! (a gap, an access of an instruction that then faulted) holds up the ones after it until
//! that pc is executed again; what is left at the window's end is counted
//! ([`AccessJoin::left`]) for the reader to report.

use pttrace_format::memory::{parse_body, Access, Packed};

/// A window's accesses, handed out instruction by instruction (inflated a record at a
/// time: memory stays one record's worth, not the window's millions).
pub struct AccessJoin<'a> {
    records: Box<dyn Iterator<Item = &'a [u8]> + 'a>,
    /// The current record's accesses, and the next one not handed out.
    buf: Vec<Access>,
    next: usize,
    /// Accesses handed out, of all the window's (those of a record that does not inflate
    /// stay out: counted by [`Self::left`]).
    joined: u64,
    total: u64,
}

impl<'a> AccessJoin<'a> {
    pub fn new(packed: &'a Packed) -> Self {
        AccessJoin {
            records: Box::new(packed.records()),
            buf: Vec::new(),
            next: 0,
            joined: 0,
            total: packed.len(),
        }
    }

    /// The next access not handed out (inflating the next record when needed).
    #[inline]
    fn peek(&mut self) -> Option<Access> {
        if self.next == self.buf.len() {
            self.refill();
        }
        self.buf.get(self.next).copied()
    }

    #[cold]
    fn refill(&mut self) {
        self.buf.clear();
        self.next = 0;
        for body in self.records.by_ref() {
            let before = self.buf.len();
            if parse_body(body, &mut self.buf).is_err() {
                // A damaged record (inside a frame whose CRC held: a writer's bug): its
                // accesses are left out.
                self.buf.truncate(before);
                continue;
            }
            if !self.buf.is_empty() {
                return;
            }
        }
    }

    /// The accesses of the instruction at `pc`, executed next.
    #[inline]
    pub fn of(&mut self, pc: u64, out: &mut Vec<Access>) {
        out.clear();
        if self.joined == self.total {
            // Every access handed out (or none recorded): nothing to inflate.
            return;
        }
        while let Some(a) = self.peek() {
            if a.pc != pc || (!out.is_empty() && a.again) {
                break;
            }
            out.push(a);
            self.next += 1;
        }
        self.joined += out.len() as u64;
    }

    /// Accesses not joined to any instruction (so far, or at the window's end).
    pub fn left(&self) -> u64 {
        self.total - self.joined
    }

    /// At the end of window `window`: what was left out, if anything (for the reader's
    /// damage report).
    pub fn left_out(&self, window: u64) -> Option<String> {
        (self.left() > 0).then(|| {
            format!(
                "window {window}: {} of its {} loads and stores match no decoded instruction \
                 (left out)",
                self.left(),
                self.total
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(j: &mut AccessJoin<'_>, pc: u64) -> Vec<Access> {
        let mut out = Vec::new();
        j.of(pc, &mut out);
        out
    }

    fn a(pc: u64, addr: u64, store: bool) -> Access {
        Access {
            pc,
            addr,
            size_shift: 3,
            store,
            again: false,
        }
    }

    #[test]
    fn accesses_follow_their_instructions() {
        // 0x10 loads, 0x14 nothing, 0x18 loads and stores, a rep at 0x20 three times, 0x10
        // again.
        let list = [
            a(0x10, 0x100, false),
            a(0x18, 0x200, false),
            a(0x18, 0x200, true),
            a(0x20, 0x300, false),
            a(0x20, 0x400, true),
            a(0x20, 0x301, false),
            a(0x20, 0x401, true),
            a(0x10, 0x108, false),
        ];
        let packed = Packed::of(&list);
        let mut j = AccessJoin::new(&packed);
        assert_eq!(of(&mut j, 0x10), &list[0..1]);
        assert_eq!(of(&mut j, 0x14), &[]);
        assert_eq!(of(&mut j, 0x18), &list[1..3]);
        assert_eq!(of(&mut j, 0x20), &list[3..7]);
        assert_eq!(j.left(), 1);
        assert_eq!(of(&mut j, 0x14), &[]);
        assert_eq!(of(&mut j, 0x10), &list[7..8]);
        assert_eq!(j.left(), 0);
    }

    #[test]
    fn a_loop_whose_only_access_is_one_instruction_gives_each_execution_its_own() {
        let again = |addr| Access {
            again: true,
            ..a(0x10, addr, true)
        };
        let list = [a(0x10, 0x100, true), again(0x108), again(0x110)];
        let packed = Packed::of(&list);
        let mut j = AccessJoin::new(&packed);
        for k in 0..3 {
            assert_eq!(of(&mut j, 0x10), &list[k..k + 1]);
            assert_eq!(of(&mut j, 0x14), &[]);
        }
        assert_eq!(j.left(), 0);
    }

    #[test]
    fn an_access_of_an_instruction_never_decoded_is_left() {
        let list = [a(0x99, 0x1, false), a(0x10, 0x100, false)];
        let packed = Packed::of(&list);
        let mut j = AccessJoin::new(&packed);
        assert_eq!(of(&mut j, 0x10), &[]);
        assert_eq!(j.left(), 2);
        assert_eq!(
            j.left_out(7).as_deref(),
            Some("window 7: 2 of its 2 loads and stores match no decoded instruction (left out)")
        );
    }

    #[test]
    fn accesses_across_records_join_as_one_stream() {
        // Enough accesses for several records; each instruction executes once.
        let list: Vec<Access> = (0..40_000u64)
            .map(|i| a(0x1000 + 4 * i, i * 8, i % 3 == 0))
            .collect();
        let packed = Packed::of(&list);
        assert!(packed.records().count() > 1);
        let mut j = AccessJoin::new(&packed);
        for x in &list {
            assert_eq!(of(&mut j, x.pc), &[*x]);
        }
        assert_eq!(j.left(), 0);
    }
}
