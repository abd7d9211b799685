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
//!
//! PSB-parallel decode ([`crate::parallel`]) is built on a second, crate-internal seam:
//! [`PartDecoding`] makes decoders of parts of one trace (from its start, from a PSB cut,
//! or from the state another decoder handed over at a cut, [`PartStart`]) that stop at a
//! later cut and report how they started and ended ([`PartReport`]); the parallel driver
//! and the stitching of the parts into the one-pass result are generic over it.

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

/// Where a decoder of part of a trace starts (`H`: the state decoders hand over at cuts).
pub(crate) enum PartStart<H> {
    /// At the trace's start, as sequential decode.
    Trace,
    /// Synchronizing at the cut its buffer starts with.
    Cut,
    /// Where another decoder handed off (its buffer starts at that cut's PSB).
    Handoff(Box<H>),
}

/// A decoder's state where it stopped at a cut: exactly what one decoder of the whole
/// trace has there.
pub(crate) trait CutHandoff: Sized {
    /// The part (segment index) that starts at the cut.
    fn cut(&self) -> usize;

    /// The last timestamp emitted before the cut (a decoder started at the cut emits its
    /// first one whatever it is: the stitching drops it where it repeats this one).
    fn last_timestamp(&self) -> Option<u64>;

    /// This handoff of a decoder that started at `before`'s cut and joined there, with
    /// what it could not know taken from `before`.
    fn after(self, before: &Self) -> Self;
}

/// How a decoder that synchronized at a cut started: whether its records are the ones
/// one decoder of the whole trace gives after handoff `H` at that cut. `calibration`:
/// state the decoder calibrates over the trace (cycle-accurate time) must be equal too;
/// false where no part from the cut on uses it ([`PartReport::calibrated`]).
pub(crate) trait CutJoin<H> {
    fn joins(&self, h: &H, calibration: bool) -> bool;
}

/// A decoder of part of a trace: how it started (`S`, when it synchronized at a cut) and
/// how it ended (`H`, when it stopped at a later cut).
pub(crate) struct PartReport<S, H> {
    /// It emitted a timestamp.
    pub timestamped: bool,
    /// Its records may depend on state calibrated over the trace before it (cycle-accurate
    /// time: it met a CYC packet), or it cannot tell.
    pub calibrated: bool,
    pub start: Option<S>,
    pub end: Option<H>,
    /// It cannot give this part's records (why): the caller decodes another way.
    pub failed: Option<&'static str>,
}

impl<S, H> Default for PartReport<S, H> {
    fn default() -> Self {
        PartReport {
            timestamped: false,
            calibrated: false,
            start: None,
            end: None,
            failed: None,
        }
    }
}

/// A part's records and its decoder's report.
pub(crate) type DecodedPart<P> = (
    CompactRecords,
    PartReport<<P as PartDecoding>::Start, <P as PartDecoding>::Handoff>,
);

/// What PSB-parallel decode needs of a decoder: decoders of parts of one trace, each run
/// on one thread with that thread's reusable `Caches`.
pub(crate) trait PartDecoding: Sync + Sized {
    type Handoff: CutHandoff + Send;
    type Start: CutJoin<Self::Handoff> + Send;
    type Caches: Default;

    /// Decodes from byte `from` of the trace, starting as `start` says, on to the first of
    /// `cuts` (offsets from `from`, part indices) where it can stop, or the end. `part`:
    /// the index of the part it starts in.
    fn decode_part(
        &self,
        part: usize,
        from: usize,
        start: PartStart<Self::Handoff>,
        cuts: Vec<(usize, usize)>,
        caches: &mut Self::Caches,
    ) -> Result<DecodedPart<Self>, crate::DecodeError>;
}
