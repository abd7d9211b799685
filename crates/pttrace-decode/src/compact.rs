//! A whole window's records kept cheaply: one 8-byte entry per block, referring to the
//! records in the decoder's arenas (blocks are shared, not copied), markers on their own.

use crate::records::Record;
#[cfg(test)]
use crate::records::{ExecMode, Instruction};

/// One entry of [`CompactRecords`], packed into 8 bytes (a decode keeps one per block, so
/// this halves the memory a whole window's records take): bit 63 set: a marker, bits 0..32
/// its index in `markers`; clear: a block, `start` (bits 0..24) and `len` (bits 24..41)
/// in arena `arena` (bits 41..63).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CItem(u64);

/// What a [`CItem`] holds.
enum CItemKind {
    Rec(u32),
    Block { arena: u32, start: u32, len: u32 },
}

const CITEM_REC: u64 = 1 << 63;
const CITEM_START_BITS: u32 = 24;
const CITEM_LEN_BITS: u32 = 17;
const CITEM_ARENA_BITS: u32 = 22;

impl CItem {
    /// No records (a block of length 0).
    const EMPTY: CItem = CItem(0);

    fn rec(i: u32) -> CItem {
        CItem(CITEM_REC | u64::from(i))
    }

    /// A block reference, if its fields fit (always for the decoder's arenas: a block has
    /// at most 2 * 65535 + 1 records and an arena is cut near 2^22 records).
    fn block(arena: u32, start: u32, len: u32) -> Option<CItem> {
        let fits = u64::from(start) < 1 << CITEM_START_BITS
            && u64::from(len) < 1 << CITEM_LEN_BITS
            && u64::from(arena) < 1 << CITEM_ARENA_BITS;
        fits.then(|| {
            CItem(
                u64::from(start)
                    | u64::from(len) << CITEM_START_BITS
                    | u64::from(arena) << (CITEM_START_BITS + CITEM_LEN_BITS),
            )
        })
    }

    #[inline]
    fn kind(self) -> CItemKind {
        if self.0 & CITEM_REC != 0 {
            CItemKind::Rec(self.0 as u32)
        } else {
            CItemKind::Block {
                start: (self.0 & ((1 << CITEM_START_BITS) - 1)) as u32,
                len: ((self.0 >> CITEM_START_BITS) & ((1 << CITEM_LEN_BITS) - 1)) as u32,
                arena: (self.0 >> (CITEM_START_BITS + CITEM_LEN_BITS)) as u32,
            }
        }
    }
}

/// A decoded record sequence in compact form (see [`crate::TraceDecoder::collect_compact`]).
/// Equal when the record sequences are (however they are stored).
#[derive(Debug, Clone, Default)]
pub struct CompactRecords {
    items: Vec<CItem>,
    markers: Vec<Record>,
    arenas: Vec<Vec<Record>>,
    /// Records referenced by `items` (kept, so that counting is not a walk).
    records: usize,
}

impl PartialEq for CompactRecords {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for CompactRecords {}

impl CompactRecords {
    fn item_slice(&self, it: &CItem) -> &[Record] {
        match it.kind() {
            CItemKind::Rec(i) => self
                .markers
                .get(i as usize)
                .map_or(&[][..], std::slice::from_ref),
            CItemKind::Block { arena, start, len } => {
                let (s, l) = (start as usize, len as usize);
                self.arenas
                    .get(arena as usize)
                    .and_then(|a| a.get(s..s + l))
                    .unwrap_or(&[])
            }
        }
    }

    /// Appends a reference to `len` records at `start` of arena `arena` (whose records are
    /// `recs`), or copies of them where the reference does not fit.
    /// A block that continues the last one in the arena (blocks built one after the other
    /// and executed in that order) extends its reference.
    #[inline]
    pub(crate) fn push_block(&mut self, arena: u32, start: u32, len: u32, recs: &[Record]) {
        if let Some(last) = self.items.last_mut() {
            if let CItemKind::Block {
                arena: a,
                start: s,
                len: l,
            } = last.kind()
            {
                if a == arena && s + l == start {
                    if let Some(joined) = CItem::block(arena, s, l + len) {
                        *last = joined;
                        self.records += len as usize;
                        return;
                    }
                }
            }
        }
        match CItem::block(arena, start, len) {
            Some(it) => {
                self.items.push(it);
                self.records += len as usize;
            }
            None => {
                let (s, l) = (start as usize, len as usize);
                for r in recs.get(s..s + l).unwrap_or(&[]) {
                    self.push_marker(r.clone());
                }
            }
        }
    }

    pub(crate) fn push_marker(&mut self, r: Record) {
        self.items.push(CItem::rec(self.markers.len() as u32));
        self.markers.push(r);
        self.records += 1;
    }

    /// Room for `n` more entries.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.items.reserve(n);
    }

    /// Hands over the arenas the block references point into (arena `k` is the `k`th).
    pub(crate) fn set_arenas(&mut self, arenas: Vec<Vec<Record>>) {
        self.arenas = arenas;
    }

    /// Appends copies of `recs` (for decoders whose records live nowhere to refer to),
    /// kept in arenas of this collection's own.
    pub fn push_copies(&mut self, recs: &[Record]) {
        // (A reference holds up to 2^17 - 1 records from a start below 2^24.)
        for chunk in recs.chunks((1 << CITEM_LEN_BITS) - 1) {
            let full = |a: &Vec<Record>| a.len() + chunk.len() >= 1 << CITEM_START_BITS;
            if self.arenas.last().is_none_or(full) {
                self.arenas.push(Vec::with_capacity(chunk.len()));
            }
            let k = self.arenas.len() - 1;
            let reference = self.arenas.last_mut().and_then(|arena| {
                let start = arena.len();
                let it = CItem::block(k as u32, start as u32, chunk.len() as u32)?;
                arena.extend_from_slice(chunk);
                Some((it, start as u32))
            });
            match reference {
                Some((_, start)) => self.push_block(k as u32, start, chunk.len() as u32, &[]),
                // (More arenas than a reference can name: copies as markers.)
                None => chunk.iter().for_each(|r| self.push_marker(r.clone())),
            }
        }
    }

    /// The records as consecutive slices.
    pub fn slices(&self) -> impl Iterator<Item = &[Record]> + '_ {
        self.items.iter().map(|it| self.item_slice(it))
    }

    /// The records in order.
    pub fn iter(&self) -> impl Iterator<Item = &Record> + '_ {
        self.slices().flatten()
    }

    /// Number of records.
    #[inline]
    pub fn len(&self) -> usize {
        self.records
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The records, copied out.
    pub fn to_vec(&self) -> Vec<Record> {
        let mut v = Vec::with_capacity(self.len());
        for s in self.slices() {
            v.extend_from_slice(s);
        }
        v
    }

    /// The last record.
    pub fn last(&self) -> Option<&Record> {
        self.items
            .iter()
            .rev()
            .find_map(|it| self.item_slice(it).last())
    }

    /// Drops the first marker for which `find` holds, wherever it is.
    pub(crate) fn drop_first_marker(&mut self, find: impl Fn(&Record) -> bool) {
        let hit = self.items.iter().position(|it| match it.kind() {
            CItemKind::Rec(i) => self.markers.get(i as usize).is_some_and(&find),
            CItemKind::Block { .. } => false,
        });
        if let Some(k) = hit {
            self.items[k] = CItem::EMPTY;
            self.records -= 1;
        }
    }

    /// The first marker for which `find` holds.
    pub(crate) fn first_marker(&self, find: impl Fn(&Record) -> bool) -> Option<&Record> {
        self.items.iter().find_map(|it| match it.kind() {
            CItemKind::Rec(i) => self.markers.get(i as usize).filter(|r| find(r)),
            CItemKind::Block { .. } => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::InsnClass;

    fn insn(pc: u64) -> Record {
        Record::Instruction(Instruction {
            pc,
            size: 1,
            bytes: [0x90, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            class: InsnClass::Other,
            mode: ExecMode::Bit64,
        })
    }

    #[test]
    fn compact_items_pack_into_eight_bytes_and_round_trip() {
        assert_eq!(std::mem::size_of::<CItem>(), 8);
        let max = |bits: u32| (1u32 << bits) - 1;
        let (a, s, l) = (
            max(CITEM_ARENA_BITS),
            max(CITEM_START_BITS),
            max(CITEM_LEN_BITS),
        );
        match CItem::block(a, s, l).map(CItem::kind) {
            Some(CItemKind::Block { arena, start, len }) => {
                assert_eq!((arena, start, len), (a, s, l))
            }
            _ => panic!("block did not round-trip"),
        }
        assert!(CItem::block(a + 1, 0, 1).is_none());
        assert!(CItem::block(0, s + 1, 1).is_none());
        assert!(CItem::block(0, 0, l + 1).is_none());
        assert!(matches!(
            CItem::rec(u32::MAX).kind(),
            CItemKind::Rec(u32::MAX)
        ));
    }

    #[test]
    fn compact_records_reference_blocks_and_copy_what_does_not_fit() {
        let arena: Vec<Record> = (0..6).map(|k| insn(0x1000 + k)).collect();
        let mut c = CompactRecords::default();
        c.push_block(0, 1, 3, &arena);
        c.push_marker(Record::Timestamp {
            tsc: 7,
            perf_time: None,
        });
        // An arena index beyond the packed range: the records are copied instead.
        c.push_block(1 << CITEM_ARENA_BITS, 4, 2, &arena);
        c.arenas.push(arena.clone());
        let want: Vec<Record> = [
            &arena[1..4],
            &[Record::Timestamp {
                tsc: 7,
                perf_time: None,
            }],
            &arena[4..6],
        ]
        .concat();
        assert_eq!(c.to_vec(), want);
        assert_eq!(c.len(), 6);
    }

    #[test]
    fn copies_join_into_references_of_at_most_the_packed_length() {
        let max = (1usize << CITEM_LEN_BITS) - 1;
        let recs: Vec<Record> = (0..max as u64 + 10).map(|k| insn(0x1000 + k)).collect();
        let mut c = CompactRecords::default();
        c.push_copies(&recs[..3]);
        c.push_copies(&recs[3..5]);
        c.push_copies(&recs[5..]);
        // One arena; consecutive copies join while the reference can hold them.
        assert_eq!(c.arenas.len(), 1);
        let lens: Vec<usize> = c.slices().map(<[Record]>::len).collect();
        assert_eq!(lens, [5, max, 5]);
        assert_eq!(c.to_vec(), recs);
        assert_eq!(c.len(), recs.len());
        c.push_copies(&[]);
        assert_eq!(c.len(), recs.len());
        assert_eq!(c.slices().count(), 3);
    }

    #[test]
    fn compact_records_find_and_drop_the_first_marker_in_place() {
        let ts = |tsc| Record::Timestamp {
            tsc,
            perf_time: None,
        };
        let is_ts = |r: &Record| matches!(r, Record::Timestamp { .. });
        let arena: Vec<Record> = (0..3).map(|k| insn(0x2000 + k)).collect();
        let mut c = CompactRecords::default();
        c.push_marker(Record::Cpu(3));
        c.push_block(0, 0, 3, &arena);
        c.push_marker(ts(1));
        c.push_marker(ts(2));
        c.arenas.push(arena.clone());
        let items = c.items.len();
        // Found after a block; dropped in place (no item moved), the later one stays.
        assert_eq!(c.first_marker(is_ts), Some(&ts(1)));
        c.drop_first_marker(is_ts);
        let want: Vec<Record> = [&[Record::Cpu(3)][..], &arena, &[ts(2)]].concat();
        assert_eq!(c.to_vec(), want);
        assert_eq!((c.len(), c.items.len()), (5, items));
        assert_eq!(c.first_marker(is_ts), Some(&ts(2)));
        c.drop_first_marker(|r| matches!(r, Record::Cpu(_)));
        c.drop_first_marker(is_ts);
        assert_eq!(c.first_marker(is_ts), None);
        assert_eq!(c.to_vec(), arena);
        // Equality is by records, not by how they are stored.
        let mut d = CompactRecords::default();
        d.push_block(0, 0, 3, &arena);
        d.arenas.push(arena);
        assert_eq!(c, d);
        assert_ne!(c, CompactRecords::default());
    }
}

#[cfg(test)]
mod fast_decoder_entries {
    use crate::testgen::{CallProgram, CallTraceOptions};
    use crate::{DecoderKind, ImageResolver, TraceDecoder, TraceParams, WindowOptions};

    /// The fast decoder's memoized runs of blocks built one after the other are those
    /// blocks' records where they lie (nothing copied): its whole-trace output then has
    /// the libipt pipeline's entries within 1% (copies broke the joins of contiguous
    /// blocks: 2.4% more entries, 430 KB on the 10 M-instruction call trace).
    #[test]
    fn memoized_runs_do_not_cost_the_compact_output_entries() {
        let prog = CallProgram::new(0x40_0000, 16, 8);
        let t = prog.trace(CallTraceOptions {
            ret_compression: true,
            timing: true,
            psb_every: 4096,
            min_insns: 2_000_000,
            seed: 0x5eed,
        });
        let params = TraceParams {
            cpu: CallProgram::timed_cpu(),
            ..Default::default()
        };
        let entries = |decoder: DecoderKind| {
            let opts = WindowOptions {
                decoder,
                ..Default::default()
            };
            let d = crate::pipeline::PtDecoder::new(
                &t.pt,
                params,
                prog.space(),
                vec![],
                ImageResolver::default(),
                opts,
            )
            .unwrap();
            let c = d.collect_compact();
            (c.items.len(), c)
        };
        let (libipt, want) = entries(DecoderKind::Libipt);
        let (fast, got) = entries(DecoderKind::Fast);
        assert!(got == want);
        assert!(libipt > 400_000, "{libipt} entries");
        assert!(
            fast * 100 <= libipt * 101,
            "{fast} entries for libipt's {libipt}"
        );
    }
}
