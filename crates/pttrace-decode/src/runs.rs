//! Instructions as runs of straight-line code: what a consumer that follows control flow
//! (the call-stack reconstruction) needs of each instruction record, in a few bytes
//! instead of a record. A decoder makes the runs of each cached block once
//! ([`BlockRuns`]) and hands them out with the block's records each time it recurs.

use crate::records::{InsnClass, Record};

/// Whether an instruction of class `class` ends a [`Run`]: a call, return, jump or
/// conditional jump (what places the next instruction elsewhere than after it).
#[inline(always)]
pub fn transfers(class: InsnClass) -> bool {
    matches!(
        class,
        InsnClass::Call | InsnClass::Return | InsnClass::Jump | InsnClass::CondJump
    )
}

/// A run of straight-line code: `len` instructions at consecutive addresses from `first`,
/// ending with the one at `last` (`last_size` bytes, of class `last_class`); only the last
/// may be a call, return or jump. Their sizes are in [`Runs::sizes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first: u64,
    pub last: u64,
    pub len: u32,
    pub last_size: u8,
    pub last_class: InsnClass,
}

/// Instruction records gathered as [`Run`]s, with each instruction's size. A run ends
/// after a call, return or jump, before an address that does not follow the last one,
/// and where the records given end (the runs of two `add_instructions` calls are never
/// joined).
#[derive(Debug, Default, Clone)]
pub struct Runs {
    pub runs: Vec<Run>,
    /// Each instruction's size, the runs' one after the other.
    pub sizes: Vec<u8>,
}

impl Runs {
    /// Adds the instruction records at the start of `recs` (up to the first other record)
    /// and returns how many there were.
    pub fn add_instructions(&mut self, recs: &[Record]) -> usize {
        let base = self.sizes.len();
        self.sizes.resize(base + recs.len(), 0);
        let sizes = self.sizes.get_mut(base..).unwrap_or(&mut []);
        // The open run's first record, and the address after the last instruction.
        let mut first = 0usize;
        let mut next = match recs.first() {
            Some(Record::Instruction(i)) => i.pc,
            _ => 0,
        };
        let mut end = recs.len();
        for (k, (r, size)) in recs.iter().zip(sizes.iter_mut()).enumerate() {
            let Record::Instruction(i) = r else {
                end = k;
                break;
            };
            *size = i.size;
            if i.pc != next {
                push_run(&mut self.runs, recs, first, k);
                first = k;
            }
            next = i.pc.wrapping_add(u64::from(i.size));
            if transfers(i.class) {
                push_run(&mut self.runs, recs, first, k + 1);
                first = k + 1;
            }
        }
        if first < end {
            push_run(&mut self.runs, recs, first, end);
        }
        self.sizes.truncate(base + end);
        end
    }

    /// Adds runs made elsewhere (`sizes`: their instructions' sizes).
    #[inline]
    pub fn extend(&mut self, runs: &[Run], sizes: &[u8]) {
        self.runs.extend_from_slice(runs);
        self.sizes.extend_from_slice(sizes);
    }

    /// Instructions gathered.
    pub fn instructions(&self) -> usize {
        self.sizes.len()
    }

    pub fn clear(&mut self) {
        self.runs.clear();
        self.sizes.clear();
    }
}

/// Adds the run of instruction records `recs[from..to]` (nothing when it is empty).
#[inline(always)]
fn push_run(runs: &mut Vec<Run>, recs: &[Record], from: usize, to: usize) {
    let run = recs.get(from..to).unwrap_or(&[]);
    let (Some(Record::Instruction(a)), Some(Record::Instruction(b))) = (run.first(), run.last())
    else {
        return;
    };
    runs.push(Run {
        first: a.pc,
        last: b.pc,
        len: run.len() as u32,
        last_size: b.size,
        last_class: b.class,
    });
}

/// The runs of the blocks of a decoder's record arena, by the block's place in it, made
/// when first asked for. Cleared with the arena (the records of a place never change
/// until then).
#[derive(Debug, Default)]
pub struct BlockRuns {
    /// By arena place: 1 + the index in `blocks` of the block that starts there (0: none
    /// made yet).
    at: Vec<u32>,
    /// Each block made: its length in records, its first run in `all` and their number,
    /// its first size in `all`.
    blocks: Vec<(u32, u32, u32, u32)>,
    all: Runs,
    /// The runs of a block asked for with another length than the one made at its
    /// place (a part of it), made each time.
    other: Runs,
}

impl BlockRuns {
    /// The block made at arena place `start`, if any: its length in records, its first
    /// run and their number, its first size (see `blocks`).
    #[inline(always)]
    fn made_at(&self, start: u32) -> Option<(u32, u32, u32, u32)> {
        self.at
            .get(start as usize)
            .and_then(|&k| k.checked_sub(1))
            .and_then(|k| self.blocks.get(k as usize))
            .copied()
    }

    /// The runs of the block of records `arena[start..start + len]`, made now if they were
    /// not yet; `None` when the block holds other records than instructions (or is not in
    /// the arena).
    #[inline]
    pub fn get(&mut self, arena: &[Record], start: u32, len: u32) -> Option<(&[Run], &[u8])> {
        let (s, n) = (start as usize, len as usize);
        let (_, run0, runs, size0) = match self.made_at(start) {
            Some(b) if b.0 == len => b,
            None => self.make(arena.get(s..s.checked_add(n)?)?, start, len)?,
            Some(_) => {
                let recs = arena.get(s..s.checked_add(n)?)?;
                self.other.clear();
                if self.other.add_instructions(recs) != n {
                    return None;
                }
                return Some((&self.other.runs, &self.other.sizes));
            }
        };
        let (r, z) = (run0 as usize, size0 as usize);
        Some((
            self.all.runs.get(r..r + runs as usize)?,
            self.all.sizes.get(z..z + n)?,
        ))
    }

    /// Appends the runs of the block of records `arena[start..start + len]` (see
    /// [`Self::get`]) to `out`; false when the block has none (nothing is appended).
    ///
    /// (Once per block a decoder hands out: a block's single run is pushed, not copied as
    /// a slice, and up to 16 sizes go as one fixed-size copy where the sizes kept have 16
    /// bytes from the block's first: two calls of `memcpy` per block were a tenth of the
    /// decoding thread's time under `view`.)
    #[inline]
    pub fn append_to(&mut self, arena: &[Record], start: u32, len: u32, out: &mut Runs) -> bool {
        let (run0, runs, size0) = match self.made_at(start) {
            Some(b) if b.0 == len => (b.1 as usize, b.2 as usize, b.3 as usize),
            _ => {
                let Some((r, z)) = self.get(arena, start, len) else {
                    return false;
                };
                out.extend(r, z);
                return true;
            }
        };
        let n = len as usize;
        let (Some(block_runs), Some(sizes)) = (
            self.all.runs.get(run0..run0 + runs),
            self.all.sizes.get(size0..size0 + n),
        ) else {
            return false;
        };
        match block_runs {
            [one] => out.runs.push(*one),
            more => out.runs.extend_from_slice(more),
        }
        let padded = self
            .all
            .sizes
            .get(size0..size0 + 16)
            .and_then(|w| <&[u8; 16]>::try_from(w).ok());
        match padded {
            Some(w) if n <= 16 => {
                let end = out.sizes.len() + n;
                out.sizes.extend_from_slice(w);
                out.sizes.truncate(end);
            }
            _ => out.sizes.extend_from_slice(sizes),
        }
        true
    }

    #[cold]
    #[inline(never)]
    fn make(&mut self, recs: &[Record], start: u32, len: u32) -> Option<(u32, u32, u32, u32)> {
        let (run0, size0) = (self.all.runs.len(), self.all.sizes.len());
        if self.all.add_instructions(recs) != recs.len() {
            self.all.runs.truncate(run0);
            self.all.sizes.truncate(size0);
            return None;
        }
        let runs = self.all.runs.len() - run0;
        let b = (
            len,
            u32::try_from(run0).ok()?,
            u32::try_from(runs).ok()?,
            u32::try_from(size0).ok()?,
        );
        let k = u32::try_from(self.blocks.len() + 1).ok()?;
        let s = start as usize;
        if self.at.len() <= s {
            self.at.resize(s + 1, 0);
        }
        if let Some(slot) = self.at.get_mut(s) {
            *slot = k;
        }
        self.blocks.push(b);
        Some(b)
    }

    /// Forgets every block (the arena was cleared).
    pub fn clear(&mut self) {
        self.at.clear();
        self.blocks.clear();
        self.all.clear();
        self.other.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::instruction;

    fn run(first: u64, last: u64, len: u32, last_size: u8, last_class: InsnClass) -> Run {
        Run {
            first,
            last,
            len,
            last_size,
            last_class,
        }
    }

    /// A run ends after a call, return or jump, before an address that does not follow,
    /// at the first record that is no instruction, and where the records end; each
    /// instruction's size is kept.
    #[test]
    fn runs_end_at_transfers_discontinuities_and_other_records() {
        let i = instruction;
        let recs = [
            i(0x1000, 2, InsnClass::Other),
            i(0x1002, 5, InsnClass::Call),
            i(0x2000, 1, InsnClass::Other),
            i(0x2001, 3, InsnClass::FarCall),
            i(0x2004, 2, InsnClass::CondJump),
            i(0x2006, 4, InsnClass::Other),
            // Not where the last one ends: a new run.
            i(0x3000, 1, InsnClass::Other),
            i(0x3001, 1, InsnClass::Ptwrite),
            Record::Syscall { pc: 0x3002 },
            i(0x4000, 1, InsnClass::Return),
        ];
        let mut runs = Runs::default();
        assert_eq!(runs.add_instructions(&recs), 8);
        assert_eq!(
            runs.runs,
            [
                run(0x1000, 0x1002, 2, 5, InsnClass::Call),
                run(0x2000, 0x2004, 3, 2, InsnClass::CondJump),
                run(0x2006, 0x2006, 1, 4, InsnClass::Other),
                run(0x3000, 0x3001, 2, 1, InsnClass::Ptwrite),
            ]
        );
        assert_eq!(runs.sizes, [2, 5, 1, 3, 2, 4, 1, 1]);
        assert_eq!(runs.add_instructions(&recs[9..]), 1);
        assert_eq!(
            runs.runs.last(),
            Some(&run(0x4000, 0x4000, 1, 1, InsnClass::Return))
        );
        assert_eq!(runs.instructions(), 9);
        runs.clear();
        assert_eq!((runs.runs.len(), runs.instructions()), (0, 0));
    }

    /// A block's runs are made once and handed out for that place and length; another
    /// length at the place is made each time, a block with other records has none, and a
    /// cleared table makes them again.
    #[test]
    fn block_runs_are_made_once_per_place() {
        let arena = [
            instruction(0x1000, 2, InsnClass::Other),
            instruction(0x1002, 2, InsnClass::CondJump),
            instruction(0x1004, 3, InsnClass::Return),
            instruction(0x2000, 1, InsnClass::FarCall),
            Record::Syscall { pc: 0x2000 },
            instruction(0x2001, 5, InsnClass::Call),
        ];
        let mut b = BlockRuns::default();
        let whole = |b: &mut BlockRuns| b.get(&arena, 0, 3).map(|(r, s)| (r.to_vec(), s.to_vec()));
        let want_runs = vec![
            run(0x1000, 0x1002, 2, 2, InsnClass::CondJump),
            run(0x1004, 0x1004, 1, 3, InsnClass::Return),
        ];
        assert_eq!(whole(&mut b), Some((want_runs.clone(), vec![2, 2, 3])));
        assert_eq!((b.blocks.len(), b.all.runs.len()), (1, 2));
        // Asked again: the same runs, nothing made.
        assert_eq!(whole(&mut b), Some((want_runs.clone(), vec![2, 2, 3])));
        assert_eq!((b.blocks.len(), b.all.runs.len()), (1, 2));
        // A part of it at the same place: made apart, the block's runs kept.
        let part = b.get(&arena, 0, 1).map(|(r, s)| (r.to_vec(), s.to_vec()));
        assert_eq!(
            part,
            Some((vec![run(0x1000, 0x1000, 1, 2, InsnClass::Other)], vec![2]))
        );
        assert_eq!(whole(&mut b), Some((want_runs.clone(), vec![2, 2, 3])));
        // A syscall marker inside: no runs, and nothing kept of the attempt.
        assert!(b.get(&arena, 3, 3).is_none());
        assert_eq!(
            (b.blocks.len(), b.all.runs.len(), b.all.sizes.len()),
            (1, 2, 3)
        );
        // Beyond the arena: none.
        assert!(b.get(&arena, 5, 4).is_none());
        b.clear();
        assert_eq!((b.blocks.len(), b.all.runs.len()), (0, 0));
        assert_eq!(whole(&mut b), Some((want_runs, vec![2, 2, 3])));
    }

    /// `append_to` appends what `get` gives, whatever a block's runs and sizes: one run or
    /// several, up to 16 sizes or more, the last block of the sizes kept (fewer than 16
    /// bytes after its first), a part of a block, a block with other records (none).
    #[test]
    fn appended_runs_are_the_blocks_runs() {
        let mut arena = Vec::new();
        let mut blocks = Vec::new();
        let mut pc = 0x4000u64;
        // Blocks of 1..=20 instructions; every third has a jump inside (two runs).
        for n in 1..=20u32 {
            let start = arena.len() as u32;
            for k in 0..n {
                let size = (1 + (k + n) % 7) as u8;
                let class = match k {
                    _ if k + 1 == n => InsnClass::CondJump,
                    1 if n % 3 == 0 => InsnClass::Jump,
                    _ => InsnClass::Other,
                };
                arena.push(instruction(pc, size, class));
                pc += u64::from(size);
            }
            blocks.push((start, n));
            pc += 0x40;
        }
        arena.push(Record::Syscall { pc });
        blocks.push((arena.len() as u32 - 3, 3));
        let expected = |b: &mut BlockRuns, s: u32, n: u32| {
            let mut want = Runs::default();
            let got = b.get(&arena, s, n).map(|(r, z)| want.extend(r, z));
            (got.is_some(), want)
        };
        let mut b = BlockRuns::default();
        // Made first through `get` (in order, so that the last ones end the sizes kept),
        // then appended after what `out` already holds; parts of blocks too.
        let mut out = Runs::default();
        let mut want = Runs::default();
        for round in 0..2 {
            for &(s, n) in blocks.iter().rev() {
                let cut = if round == 1 && n > 2 { n - 1 } else { n };
                let (has, w) = expected(&mut b, s, cut);
                assert_eq!(b.append_to(&arena, s, cut, &mut out), has, "block at {s}");
                want.runs.extend_from_slice(&w.runs);
                want.sizes.extend_from_slice(&w.sizes);
                assert_eq!((&out.runs, &out.sizes), (&want.runs, &want.sizes));
            }
        }
        assert!(out.runs.len() > blocks.len() * 2);
    }
}
