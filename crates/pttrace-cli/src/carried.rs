//! Decoder caches handed from thread to thread of the same code: the threads of process
//! images that share their names ([`SharedImages`]: the same files at the same places)
//! decode the same code, so each starts from the caches the last one left
//! ([`PttTrace::decode_thread_carrying`]). A set's caches are kept until its last thread,
//! and only for a few sets at a time (each can hold a thread's whole block cache).
//!
//! [`PttTrace::decode_thread_carrying`]: drpttracer::decode::ptt_dir::PttTrace::decode_thread_carrying

use std::collections::HashMap;

use drpttracer::decode::ptt_dir::{CarriedCaches, PttThread};

use crate::names::SharedImages;

/// Sets of caches kept at most (the least recently used goes first).
const KEPT: usize = 4;

/// The caches carried for each set of process images still to decode.
pub struct Carriers<T = CarriedCaches> {
    /// Threads still to decode, by the image whose names their image uses.
    left: HashMap<(i32, u64), usize>,
    /// Caches kept, least recently used first.
    kept: Vec<((i32, u64), T)>,
}

impl<T: Default> Carriers<T> {
    /// For `threads`, to be decoded in this order, grouped as `shared` says.
    pub fn new<'t>(shared: &SharedImages, threads: impl Iterator<Item = &'t PttThread>) -> Self {
        Self::of_sets(threads.map(|th| shared.names_of((th.header.pid, th.header.nonce))))
    }

    /// For threads of these sets, to be decoded in this order.
    fn of_sets(sets: impl Iterator<Item = (i32, u64)>) -> Self {
        let mut left: HashMap<(i32, u64), usize> = HashMap::new();
        for set in sets {
            *left.entry(set).or_default() += 1;
        }
        Carriers {
            left,
            kept: Vec::new(),
        }
    }

    /// The caches for the next thread of set `key` (empty ones when none are kept).
    pub fn take(&mut self, key: (i32, u64)) -> T {
        match self.kept.iter().position(|(k, _)| *k == key) {
            Some(i) => self.kept.remove(i).1,
            None => T::default(),
        }
    }

    /// What a thread of set `key` left, kept while the set has threads to decode.
    pub fn give_back(&mut self, key: (i32, u64), caches: T) {
        let left = self.left.entry(key).or_default();
        *left = left.saturating_sub(1);
        if *left == 0 {
            return;
        }
        if self.kept.len() >= KEPT {
            self.kept.remove(0);
        }
        self.kept.push((key, caches));
    }
}

#[cfg(test)]
mod tests {
    use super::{Carriers, KEPT};

    /// A set's caches go to its next thread, and after its last thread nowhere; at most
    /// [`KEPT`] sets are kept, the least recently used going first.
    #[test]
    fn a_sets_caches_go_to_its_next_thread_until_its_last() {
        let (a, b) = ((1, 1), (2, 2));
        let mut c: Carriers<u32> = Carriers::of_sets([a, b, a, b, a].into_iter());
        assert_eq!(c.take(a), 0);
        c.give_back(a, 11);
        assert_eq!(c.take(b), 0);
        c.give_back(b, 21);
        assert_eq!(c.take(a), 11);
        c.give_back(a, 12);
        assert_eq!(c.take(b), 21);
        // b's last thread: nothing kept for it.
        c.give_back(b, 22);
        assert_eq!(c.take(b), 0);
        assert_eq!(c.take(a), 12);
        c.give_back(a, 13);
        assert_eq!(c.take(a), 0);
        // More sets than are kept: the least recently used is dropped.
        let sets: Vec<(i32, u64)> = (0..=KEPT as i32).map(|k| (k, 0)).collect();
        let order = sets.iter().chain(&sets).copied();
        let mut c: Carriers<u32> = Carriers::of_sets(order);
        for (k, &s) in sets.iter().enumerate() {
            assert_eq!(c.take(s), 0);
            c.give_back(s, k as u32 + 1);
        }
        assert_eq!(c.take(sets[0]), 0, "the first set was dropped");
        for (k, &s) in sets.iter().enumerate().skip(1) {
            assert_eq!(c.take(s), k as u32 + 1);
        }
    }
}
