//! The decoder's output queue: records and references to cached blocks' records, in
//! order, between the decoder that produces them and the consumer that takes them.

use crate::records::Record;

/// A queued output unit: one record, or a (shared, cached) block's records. Plain data:
/// emptying the queue drops nothing item by item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    /// A marker: its index among the queue's records (markers are rare).
    Rec(u32),
    /// `len` records at `start` in the block cache's arena.
    Block(u32, u32),
}

/// An item drained from the queue, its record taken out.
pub(crate) enum Drained {
    Rec(Record),
    Block(u32, u32),
}

/// FIFO of [`Item`]s: a vector and a read position, emptied when fully read (cheaper
/// than a ring buffer for the fill-then-drain pattern of the decoder), and the records
/// of its `Rec` items.
pub(crate) struct ItemQueue {
    items: Vec<Item>,
    head: usize,
    recs: Vec<Record>,
    /// Items pushed so far (a position in the stream of items that draining leaves valid).
    pub(crate) pushed: u64,
    /// Records pushed so far (a block item counts its records).
    pub(crate) records: u64,
}

impl ItemQueue {
    pub(crate) fn with_capacity(n: usize) -> Self {
        ItemQueue {
            items: Vec::with_capacity(n),
            head: 0,
            recs: Vec::new(),
            pushed: 0,
            records: 0,
        }
    }

    /// Queues a record.
    #[inline]
    pub(crate) fn push_rec(&mut self, r: Record) {
        self.empty_if_read();
        let i = u32::try_from(self.recs.len()).unwrap_or(u32::MAX);
        self.recs.push(r);
        self.push_back(Item::Rec(i));
    }

    /// The record of a `Rec` item.
    #[inline]
    pub(crate) fn rec(&self, i: u32) -> Option<&Record> {
        self.recs.get(i as usize)
    }

    /// The record of a `Rec` item handed out (taken out of the queue).
    #[inline]
    pub(crate) fn take_rec(&mut self, i: u32) -> Record {
        self.recs
            .get_mut(i as usize)
            .map_or(Record::WindowId(0), |r| {
                std::mem::replace(r, Record::WindowId(0))
            })
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head >= self.items.len()
    }

    /// Items queued (not handed out yet).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.items.len().saturating_sub(self.head)
    }

    /// Starts over when everything queued was read.
    #[inline(always)]
    fn empty_if_read(&mut self) {
        if self.head > 0 && self.head >= self.items.len() {
            self.items.clear();
            self.recs.clear();
            self.head = 0;
        }
    }

    // (Always inlined: the fast decoder pushes once per block, and the compiler's own
    // choice here has flipped with unrelated changes, costing a third of its speed.)
    #[inline(always)]
    pub(crate) fn push_back(&mut self, item: Item) {
        self.empty_if_read();
        self.records += match item {
            Item::Rec(_) => 1,
            Item::Block(_, len) => u64::from(len),
        };
        self.items.push(item);
        self.pushed += 1;
    }

    /// The items pushed after the queue had seen `pushed` pushes, if all are still queued.
    pub(crate) fn since(&self, pushed: u64) -> Option<&[Item]> {
        let n = usize::try_from(self.pushed.checked_sub(pushed)?).ok()?;
        let queued = self.items.len().checked_sub(self.head)?;
        (n <= queued).then(|| &self.items[self.items.len() - n..])
    }

    /// Drops the last `n` queued items (never one handed out already). `pushed` and
    /// `records` count what is left, so that positions taken before the dropped items
    /// still measure the items queued after them.
    pub(crate) fn truncate_last(&mut self, n: usize) {
        let keep = self.items.len().saturating_sub(n).max(self.head);
        let mut first_rec = None;
        for item in self.items.drain(keep..) {
            self.pushed -= 1;
            self.records -= match item {
                Item::Rec(i) => {
                    first_rec.get_or_insert(i);
                    1
                }
                Item::Block(_, len) => u64::from(len),
            };
        }
        // (Records are queued in order: the dropped ones are the last.)
        if let Some(i) = first_rec {
            self.recs.truncate(i as usize);
        }
    }

    #[inline]
    pub(crate) fn front(&self) -> Option<&Item> {
        self.items.get(self.head)
    }

    /// The front item if it is a block (start, len), removed.
    #[inline]
    pub(crate) fn pop_block(&mut self) -> Option<(u32, u32)> {
        match self.items.get(self.head) {
            Some(&Item::Block(start, len)) => {
                self.head += 1;
                Some((start, len))
            }
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<Item> {
        let item = *self.items.get(self.head)?;
        self.head += 1;
        Some(item)
    }

    /// Drops the first `n` queued records (a block's first ones from its front); returns
    /// how many of the `n` were not queued.
    pub(crate) fn skip_records(&mut self, mut n: u64) -> u64 {
        while n > 0 {
            let Some(front) = self.items.get_mut(self.head) else {
                return n;
            };
            match front {
                Item::Rec(_) => {
                    self.head += 1;
                    n -= 1;
                }
                Item::Block(start, len) => {
                    let k = u32::try_from(n.min(u64::from(*len))).unwrap_or(*len);
                    if k == *len {
                        self.head += 1;
                    } else {
                        *start += k;
                        *len -= k;
                    }
                    n -= u64::from(k);
                }
            }
        }
        0
    }

    /// Removes and returns every queued item, in order, with its record.
    pub(crate) fn drain(&mut self) -> Vec<Drained> {
        let head = std::mem::take(&mut self.head);
        let items: Vec<Item> = self.items.drain(..).skip(head).collect();
        let out = items
            .into_iter()
            .map(|item| match item {
                Item::Rec(i) => Drained::Rec(self.take_rec(i)),
                Item::Block(start, len) => Drained::Block(start, len),
            })
            .collect();
        self.recs.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_queue_hands_out_what_was_pushed_since_a_position() {
        let mut q = ItemQueue::with_capacity(4);
        q.push_back(Item::Block(0, 1));
        let mark = q.pushed;
        assert_eq!(q.since(mark).map(<[Item]>::len), Some(0));
        q.push_back(Item::Block(1, 2));
        q.push_rec(Record::Cpu(1));
        assert!(matches!(
            q.since(mark),
            Some([Item::Block(1, 2), Item::Rec(_)])
        ));
        // Once items after the position were consumed, there is no answer.
        assert!(q.pop_block().is_some());
        assert!(q.pop_block().is_some());
        assert!(q.since(mark).is_none());
        assert_eq!(q.since(q.pushed - 1).map(<[Item]>::len), Some(1));
        // Truncating never reaches into consumed items.
        q.truncate_last(5);
        assert!(q.is_empty());
        q.push_back(Item::Block(3, 1));
        let mark = q.pushed;
        q.push_back(Item::Block(4, 2));
        q.push_rec(Record::Cpu(2));
        let (pushed, records) = (q.pushed, q.records);
        q.truncate_last(2);
        // The counts follow: a position taken before the dropped items measures what was
        // queued after it (and truncating what that measures drops nothing before it).
        assert_eq!((q.pushed, q.records), (pushed - 2, records - 3));
        assert_eq!(q.since(mark).map(<[Item]>::len), Some(0));
        q.push_rec(Record::Cpu(3));
        assert!(matches!(q.since(mark), Some([Item::Rec(_)])));
        q.truncate_last(usize::try_from(q.pushed - mark).unwrap());
        assert!(matches!(q.pop_front(), Some(Item::Block(3, 1))));
        assert!(q.pop_front().is_none());
    }
}
