//! The Intel PT encoder shared by every software backend of pttrace: the single-step
//! backend (one instruction at a time) and the QEMU plugin (one translated block at a time)
//! write their packets through [`packet::PacketWriter`]; [`classify`] tells how an
//! instruction transfers control; [`flow::FlowEncoder`] turns an executed block sequence
//! into windows of PT.
//!
//! The crate has no C dependencies (libipt decodes what it writes in the tests of the
//! `drpttracer` crate) and never panics on its inputs.

pub mod classify;
pub mod flow;
pub mod packet;

pub use classify::{can_fault, classify_bytes, Class, Flow};
pub use flow::{Block, BlockEnd, FlowEncoder, FlowStats, ReadyWindow, Transition};
pub use iced_x86::InstructionInfoFactory;
pub use packet::{IpPacket, PacketWriter, Sink, SliceSink};

/// Bytes of trace between two PSB+ (hardware's psb_period is 2^11..2^16 bytes).
pub const PSB_PERIOD: usize = 4096;

/// Why encoding stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("PT output full: {needed} more bytes at offset {at} of a {capacity}-byte buffer")]
    OutputFull {
        needed: usize,
        at: usize,
        capacity: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> PacketWriter<Vec<u8>> {
        PacketWriter::new(Vec::new(), PSB_PERIOD)
    }

    #[test]
    fn tnt_bits_oldest_first_short_and_long() {
        let mut w = writer();
        w.branch(true).unwrap();
        w.flush_tnt().unwrap();
        assert_eq!(w.sink(), &vec![0b0000_0110]);
        let mut w = writer();
        for t in [true, false, false, true, true, false] {
            w.branch(t).unwrap();
        }
        w.flush_tnt().unwrap();
        // stop bit, then 1 0 0 1 1 0 (oldest first), then the clear bit 0
        assert_eq!(w.sink(), &vec![0b1100_1100]);
        let mut w = writer();
        for i in 0..47 {
            w.branch(i % 3 == 0).unwrap();
        }
        // 47 bits flush by themselves as one long TNT
        let s = w.sink().clone();
        assert_eq!(s.len(), 8);
        assert_eq!(&s[..2], &[0x02, 0xa3]);
        let mut payload = [0u8; 8];
        payload[..6].copy_from_slice(&s[2..]);
        let p = u64::from_le_bytes(payload);
        assert_eq!(p >> 47, 1, "stop bit at 47");
        for i in 0..47u64 {
            assert_eq!(
                (p >> (46 - i)) & 1,
                u64::from(i % 3 == 0),
                "bit of branch {i}"
            );
        }
    }

    #[test]
    fn ip_compression_like_hardware() {
        let mut w = writer();
        w.tip(0x7f12_3456_7890).unwrap(); // no last IP: sext-48
        w.tip(0x7f12_3456_1234).unwrap(); // same upper 48: update-16
        w.tip(0x7f12_0000_0001).unwrap(); // same upper 32: update-32
        w.tip(0xffff_8000_0000_0000).unwrap(); // kernel: sext-48 fits
        w.tip(0x1234_5678_9abc_def0).unwrap(); // full
        w.tip_pgd(None).unwrap();
        assert_eq!(
            w.sink(),
            &vec![
                0x6d, 0x90, 0x78, 0x56, 0x34, 0x12, 0x7f, //
                0x2d, 0x34, 0x12, //
                0x4d, 0x01, 0x00, 0x00, 0x00, //
                0x6d, 0, 0, 0, 0, 0x00, 0x80, //
                0xcd, 0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12, //
                0x01,
            ]
        );
    }

    #[test]
    fn psb_plus_layout_and_period() {
        let mut w = PacketWriter::new(Vec::new(), 64);
        assert!(!w.psb_due());
        w.psb_plus(Some(0x0011_2233_4455_6677), Some(0x401000))
            .unwrap();
        let mut want = packet::PSB.to_vec();
        want.extend([0x19, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        want.extend([0x99, 0x01]);
        want.extend([0x7d, 0x00, 0x10, 0x40, 0, 0, 0]);
        want.extend([0x02, 0x23]);
        assert_eq!(w.sink(), &want);
        for _ in 0..31 {
            w.tip(0x401000).unwrap();
        }
        assert!(w.psb_due());
    }

    #[test]
    fn full_slice_reports_and_writes_nothing_partial() {
        let mut buf = [0u8; 4];
        let mut w = PacketWriter::new(SliceSink::new(&mut buf), PSB_PERIOD);
        assert!(w.tip(0x10).is_err(), "7 bytes (sext-48) do not fit in 4");
        assert_eq!(w.len(), 0);
        w.tip_pgd(None).unwrap();
        assert_eq!(w.len(), 1);
        let mut buf = [0u8; 2];
        let mut w = PacketWriter::new(SliceSink::new(&mut buf), PSB_PERIOD);
        assert_eq!(
            w.tsc(1),
            Err(EncodeError::OutputFull {
                needed: 8,
                at: 0,
                capacity: 2
            })
        );
        assert_eq!(w.len(), 0);
    }
}
