//! The seam between a decoder of one trace and what consumes its records.
//!
//! A [`TraceDecoder`] synchronizes on its trace by itself and hands out the records in
//! order, as slices, until the end: [`TraceDecoder::next_slice`] is the one thing a
//! decoder must provide. Everything a consumer does is built on it — a loop over the
//! slices ([`TraceDecoder::for_each_slice`]), one record at a time ([`Records`]), the
//! whole window kept compactly ([`TraceDecoder::collect_compact`]), the oracle comparison
//! ([`crate::check::compare`]) — and a decoder overrides what it can do faster (the
//! pipeline's [`crate::PtDecoder`] refers to its cached blocks instead of copying them).
//! libipt's raw types never cross this seam (they stay in the `ipt` module).

use std::ops::ControlFlow;

use crate::compact::CompactRecords;
use crate::records::Record;

/// A decoder of one trace (one window of PT).
pub trait TraceDecoder {
    /// The next records in order (never an empty slice); `None` once the trace is done.
    fn next_slice(&mut self) -> Option<&[Record]>;

    /// Where the decoder is in the PT stream: the byte offset in its input.
    fn position(&self) -> u64;

    /// Which decoder gave (or gives) the records: `"fast"`, or `"libipt"` with the reason
    /// the fast decoder handed the trace over (`None` when it never ran).
    fn decoded_by(&self) -> (&'static str, Option<&'static str>);

    /// Hands every slice to `f` until the end or until `f` breaks (its value returned).
    fn for_each_slice<B>(&mut self, mut f: impl FnMut(&[Record]) -> ControlFlow<B>) -> Option<B>
    where
        Self: Sized,
    {
        while let Some(s) = self.next_slice() {
            if let ControlFlow::Break(b) = f(s) {
                return Some(b);
            }
        }
        None
    }

    /// Decodes to the end and keeps every record.
    fn collect_compact(mut self) -> CompactRecords
    where
        Self: Sized,
    {
        let mut out = CompactRecords::default();
        while let Some(s) = self.next_slice() {
            out.push_copies(s);
        }
        out
    }

    /// The records one at a time.
    fn records(self) -> Records<Self>
    where
        Self: Sized,
    {
        Records {
            dec: self,
            buf: Vec::new(),
            at: 0,
        }
    }
}

/// The records of a [`TraceDecoder`] one at a time (each slice copied out once).
pub struct Records<D> {
    dec: D,
    /// The decoder's current slice, and the next record in it.
    buf: Vec<Record>,
    at: usize,
}

impl<D: TraceDecoder> Records<D> {
    /// The decoder (for its position while iterating).
    pub fn decoder(&self) -> &D {
        &self.dec
    }
}

impl<D: TraceDecoder> Iterator for Records<D> {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        if self.at >= self.buf.len() {
            let s = self.dec.next_slice()?;
            self.buf.clear();
            self.buf.extend_from_slice(s);
            self.at = 0;
        }
        let r = self.buf.get(self.at).cloned();
        self.at += 1;
        r
    }
}

/// A decoder lent out is a decoder (consumers that take one by value can be given
/// `&mut dec` and the caller keeps it, e.g. to ask its warnings afterwards).
impl<D: TraceDecoder> TraceDecoder for &mut D {
    #[inline]
    fn next_slice(&mut self) -> Option<&[Record]> {
        (**self).next_slice()
    }

    fn position(&self) -> u64 {
        (**self).position()
    }

    fn decoded_by(&self) -> (&'static str, Option<&'static str>) {
        (**self).decoded_by()
    }

    #[inline]
    fn for_each_slice<B>(&mut self, f: impl FnMut(&[Record]) -> ControlFlow<B>) -> Option<B> {
        (**self).for_each_slice(f)
    }
}
