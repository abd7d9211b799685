//! The flight recorder's ring of whole windows (snapshot mode, see [`crate::snapshot`]),
//! shared by the backends that keep one: the QEMU plugin (one ring per guest thread, on
//! its worker) and the LD_PRELOAD shim's single-step backend (one per traced thread, on
//! the shim's writer thread).
//!
//! A backend cuts its windows at about `size / 8` bytes of PT ([`cut_size`]) and pushes
//! each finished window; the ring keeps the newest windows whose PT fits `size` (the
//! newest always stays) and counts what it drops. A snapshot [`Ring::take`]s the windows
//! (oldest first) and the counts for its `Snapshot` record; the ring goes on empty.

use std::collections::VecDeque;

use crate::snapshot::SnapshotRecord;

/// What the ring needs of a window's metadata: its sideband, which the decoder needs even
/// when the window itself is dropped (code records, mappings): the sideband of dropped
/// windows goes into the first window a snapshot writes.
pub trait RingWindow {
    fn sideband_mut(&mut self) -> &mut Vec<u8>;
}

/// PT bytes per window at which a backend cuts its windows for a ring of `size` bytes
/// (the ring then holds 7/8 to all of `size`).
pub fn cut_size(size: u64) -> u64 {
    (size / 8).max(1024)
}

/// A thread's last windows, oldest first.
pub struct Ring<M> {
    /// Most PT bytes kept.
    pub size: u64,
    windows: VecDeque<(M, Vec<u8>)>,
    pt_bytes: u64,
    /// Windows (and their PT bytes) dropped since the last snapshot.
    discarded_windows: u64,
    discarded_pt: u64,
    dropped_sideband: Vec<u8>,
}

/// The content of a ring at a snapshot.
pub struct Taken<M> {
    /// The windows, oldest first; the first one carries the sideband of the windows
    /// dropped before it.
    pub windows: VecDeque<(M, Vec<u8>)>,
    pub pt_bytes: u64,
    pub discarded_windows: u64,
    pub discarded_pt: u64,
    pub ring_size: u64,
}

impl<M> Taken<M> {
    /// The `Snapshot` record that precedes these windows.
    pub fn record(
        &self,
        number: u64,
        kind: u32,
        fired_tid: i32,
        tsc: u64,
        trigger: String,
    ) -> SnapshotRecord {
        SnapshotRecord {
            number,
            kind,
            fired_tid,
            tsc,
            windows: self.windows.len() as u64,
            pt_bytes: self.pt_bytes,
            discarded_windows: self.discarded_windows,
            discarded_pt_bytes: self.discarded_pt,
            ring_size: self.ring_size,
            trigger,
        }
    }
}

impl<M: RingWindow> Ring<M> {
    pub fn new(size: u64) -> Ring<M> {
        Ring {
            size,
            windows: VecDeque::new(),
            pt_bytes: 0,
            discarded_windows: 0,
            discarded_pt: 0,
            dropped_sideband: Vec::new(),
        }
    }

    /// Windows and PT bytes dropped since the last snapshot, and their sideband.
    pub fn discarded(&self) -> (u64, u64, &[u8]) {
        (
            self.discarded_windows,
            self.discarded_pt,
            &self.dropped_sideband,
        )
    }

    /// Starts the counts of dropped windows (and their sideband) from these (a ring read
    /// back from its file, [`crate::ringfile`]).
    pub fn set_discarded(&mut self, windows: u64, pt: u64, sideband: Vec<u8>) {
        self.discarded_windows = windows;
        self.discarded_pt = pt;
        self.dropped_sideband = sideband;
    }

    /// PT bytes held now.
    pub fn pt_bytes(&self) -> u64 {
        self.pt_bytes
    }

    /// Windows held now.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Adds a finished window; drops the oldest ones while the PT held exceeds `size` (the
    /// newest window always stays). Hands dropped PT buffers to `reuse`.
    pub fn push(&mut self, meta: M, pt: Vec<u8>, mut reuse: impl FnMut(Vec<u8>)) {
        self.pt_bytes += pt.len() as u64;
        self.windows.push_back((meta, pt));
        while self.pt_bytes > self.size && self.windows.len() > 1 {
            let Some((mut meta, pt)) = self.windows.pop_front() else {
                break;
            };
            self.pt_bytes -= pt.len() as u64;
            self.discarded_windows += 1;
            self.discarded_pt += pt.len() as u64;
            self.dropped_sideband
                .extend_from_slice(meta.sideband_mut().as_slice());
            reuse(pt);
        }
    }

    /// Empties the ring for a snapshot: its windows (the dropped windows' sideband put in
    /// front of the first one's) and counts; the counts start again from zero.
    pub fn take(&mut self) -> Taken<M> {
        let mut windows = std::mem::take(&mut self.windows);
        let dropped = std::mem::take(&mut self.dropped_sideband);
        if !dropped.is_empty() {
            if let Some((meta, _)) = windows.front_mut() {
                let sb = meta.sideband_mut();
                let mut all = dropped;
                all.extend_from_slice(sb);
                *sb = all;
            } else {
                // Nothing to carry it: keep it for the next window.
                self.dropped_sideband = dropped;
            }
        }
        let t = Taken {
            windows,
            pt_bytes: self.pt_bytes,
            discarded_windows: self.discarded_windows,
            discarded_pt: self.discarded_pt,
            ring_size: self.size,
        };
        self.pt_bytes = 0;
        self.discarded_windows = 0;
        self.discarded_pt = 0;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct W(u32, Vec<u8>);
    impl RingWindow for W {
        fn sideband_mut(&mut self) -> &mut Vec<u8> {
            &mut self.1
        }
    }

    fn ids(t: &Taken<W>) -> Vec<u32> {
        t.windows.iter().map(|(w, _)| w.0).collect()
    }

    #[test]
    fn keeps_the_newest_whole_windows_that_fit_and_counts_the_rest() {
        let mut r: Ring<W> = Ring::new(100);
        let mut reused = 0;
        for i in 0..10u32 {
            r.push(W(i, vec![i as u8]), vec![0; 30], |_| reused += 1);
        }
        // 30 bytes each: three fit in 100.
        assert_eq!(r.len(), 3);
        assert_eq!(r.pt_bytes(), 90);
        assert_eq!(reused, 7);
        let t = r.take();
        assert_eq!(ids(&t), [7, 8, 9]);
        assert_eq!(
            (t.pt_bytes, t.discarded_windows, t.discarded_pt),
            (90, 7, 210)
        );
        // The dropped windows' sideband, oldest first, then the first kept one's own.
        assert_eq!(t.windows[0].0 .1, [0, 1, 2, 3, 4, 5, 6, 7]);
        let rec = t.record(3, 2, 77, 5, "syscall:getppid".into());
        assert_eq!(
            (
                rec.windows,
                rec.pt_bytes,
                rec.discarded_windows,
                rec.ring_size
            ),
            (3, 90, 7, 100)
        );
        // Empty afterwards, counts from zero.
        assert!(r.is_empty());
        let t = r.take();
        assert!(t.windows.is_empty());
        assert_eq!((t.pt_bytes, t.discarded_windows, t.discarded_pt), (0, 0, 0));
    }

    #[test]
    fn the_newest_window_stays_even_when_larger_than_the_ring() {
        let mut r: Ring<W> = Ring::new(100);
        r.push(W(1, vec![]), vec![0; 10], |_| {});
        r.push(W(2, vec![]), vec![0; 500], |_| {});
        let t = r.take();
        assert_eq!(ids(&t), [2]);
        assert_eq!((t.pt_bytes, t.discarded_windows), (500, 1));
    }

    #[test]
    fn a_snapshot_carries_only_the_sideband_dropped_since_the_previous_one() {
        let mut r: Ring<W> = Ring::new(10);
        r.push(W(1, vec![1]), vec![0; 10], |_| {});
        r.push(W(2, vec![2]), vec![0; 10], |_| {});
        let t = r.take();
        assert_eq!(t.windows[0].0 .1, [1, 2]);
        r.push(W(3, vec![3]), vec![0; 10], |_| {});
        r.push(W(4, vec![4]), vec![0; 10], |_| {});
        let t = r.take();
        assert_eq!(t.windows[0].0 .1, [3, 4]);
        assert_eq!(cut_size(64 * 1024), 8192);
        assert_eq!(cut_size(4096), 1024);
    }
}
