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

use pttrace_format::memory::Access;

/// A window's accesses, handed out instruction by instruction.
pub struct AccessJoin<'a> {
    list: &'a [Access],
    next: usize,
}

impl<'a> AccessJoin<'a> {
    pub fn new(list: &'a [Access]) -> Self {
        AccessJoin { list, next: 0 }
    }

    /// The accesses of the instruction at `pc`, executed next.
    #[inline]
    pub fn of(&mut self, pc: u64) -> &'a [Access] {
        let start = self.next;
        while self
            .list
            .get(self.next)
            .is_some_and(|a| a.pc == pc && (self.next == start || !a.again))
        {
            self.next += 1;
        }
        self.list.get(start..self.next).unwrap_or(&[])
    }

    /// Accesses not joined to any instruction (so far).
    pub fn left(&self) -> usize {
        self.list.len() - self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut j = AccessJoin::new(&list);
        assert_eq!(j.of(0x10), &list[0..1]);
        assert_eq!(j.of(0x14), &[]);
        assert_eq!(j.of(0x18), &list[1..3]);
        assert_eq!(j.of(0x20), &list[3..7]);
        assert_eq!(j.left(), 1);
        assert_eq!(j.of(0x14), &[]);
        assert_eq!(j.of(0x10), &list[7..8]);
        assert_eq!(j.left(), 0);
    }

    #[test]
    fn a_loop_whose_only_access_is_one_instruction_gives_each_execution_its_own() {
        let again = |addr| Access {
            again: true,
            ..a(0x10, addr, true)
        };
        let list = [a(0x10, 0x100, true), again(0x108), again(0x110)];
        let mut j = AccessJoin::new(&list);
        for k in 0..3 {
            assert_eq!(j.of(0x10), &list[k..k + 1]);
            assert_eq!(j.of(0x14), &[]);
        }
        assert_eq!(j.left(), 0);
    }

    #[test]
    fn an_access_of_an_instruction_never_decoded_is_left() {
        let list = [a(0x99, 0x1, false), a(0x10, 0x100, false)];
        let mut j = AccessJoin::new(&list);
        assert_eq!(j.of(0x10), &[]);
        assert_eq!(j.left(), 2);
    }
}
