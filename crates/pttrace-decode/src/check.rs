//! The oracle check: one window decoded by the fast decoder and by libipt alone, record
//! for record, stopping at the first record where they differ (`pttrace decode --decoder
//! check`).

use crate::decoder::TraceDecoder;
use crate::records::Record;

/// Two decoders of one window gave the same records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// Records compared.
    pub records: u64,
    /// Which decoder gave the fast side's records (see [`TraceDecoder::decoded_by`]).
    pub decoded_by: (&'static str, Option<&'static str>),
}

/// Where two decoders of one window first differ.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// Index of the first differing record in the window (0-based; window and CPU
    /// markers count).
    pub record: u64,
    /// Each side's record there (`None`: that side had ended).
    pub fast: Option<Record>,
    pub libipt: Option<Record>,
    /// The fast side's position in the PT stream after it gave its record.
    pub pt_offset: u64,
    pub decoded_by: (&'static str, Option<&'static str>),
}

/// Decodes the window with both decoders (`fast` the one under test, e.g. a
/// [`crate::PtDecoder`] made with [`crate::DecoderKind::Fast`]; `reference` the oracle, one
/// made with [`crate::DecoderKind::Libipt`] from the same inputs) and compares their
/// records one by one.
pub fn compare(
    fast: impl TraceDecoder,
    reference: impl TraceDecoder,
) -> Result<Agreement, Box<Difference>> {
    let (mut fast, mut reference) = (fast.records(), reference.records());
    let mut index = 0u64;
    loop {
        let (a, b) = (fast.next(), reference.next());
        if a != b {
            let dec = fast.decoder();
            return Err(Box::new(Difference {
                record: index,
                pt_offset: dec.position(),
                decoded_by: dec.decoded_by(),
                fast: a,
                libipt: b,
            }));
        }
        if a.is_none() {
            return Ok(Agreement {
                records: index,
                decoded_by: fast.decoder().decoded_by(),
            });
        }
        index += 1;
    }
}
