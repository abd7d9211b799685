//! Snapshot (flight-recorder) mode on the hardware backend: from an overwrite-mode AUX
//! area to the `Snapshot` record (type 27) and window that the other backends write, so
//! that `pttrace decode`, `report` and `view` read them unchanged.
//!
//! Normal context only (it allocates): the caller is the traced thread or a writer thread,
//! with the event disabled ([`super::hardware::HardwareSnapshot::write_snapshot`] does
//! disable, [`SnapshotCursor::write`], enable).
//!
//! At a firing: `aux_head` is the kernel's head (in overwrite mode the kernel ignores
//! `aux_tail`, and it is not used here). The valid bytes are the last `aux_size` before
//! the head, or fewer when the area never wrapped, and only those newer than the previous
//! snapshot's head; of them the last `min(SIZE, valid)` are kept, in order (copied in two
//! pieces when they wrap). What precedes the first PSB in them cannot be decoded (no
//! packet boundary, no IP, no mode), so the snapshot's PT starts at that PSB. The result
//! is one `Snapshot` record (built by the shared [`crate::format::snapshot_ring::Taken`])
//! and one window flagged `WF_NO_SYSCALL | WF_SNAPSHOT_CUT` (`WF_PT_LOST` where the
//! kernel reported TRUNCATED, PARTIAL or COLLISION) holding that PT and the sideband that
//! arrived since the previous snapshot. Kept bytes without a PSB give an explicit empty
//! snapshot: the record, no window, and the reason appended to its trigger text (never
//! bytes a decoder would have to guess at).

use std::collections::VecDeque;
use std::io::{self, Write};

use pttrace_encoder::packet::PSB;

use crate::format::ptt::{
    frame_vec, window_frame_parts, RecordType, Window, WF_NO_SYSCALL, WF_PT_LOST, WF_SNAPSHOT_CUT,
};
use crate::format::snapshot::{SnapshotRecord, TriggerKind};
use crate::format::snapshot_ring::Taken;
use crate::perf::hardware::AUX_LOSS_FLAGS;
use crate::perf::ring::{copy_overwrite_snapshot, copy_ring_records, ControlPage, RingMemory};

/// One trigger firing, as the caller numbers and names it (the same numbering per process
/// image and the same texts as the other backends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    pub number: u64,
    pub kind: TriggerKind,
    /// The thread where it fired (0: a request from `pttrace run`).
    pub fired_tid: i32,
    /// [`crate::format::snapshot::Trigger::describe`] and where it resolved.
    pub trigger: String,
    /// TSC of the cut (when the event was disabled).
    pub tsc: u64,
}

/// The PT of one snapshot, cut at its first PSB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptPt {
    /// The PT from the first PSB on (empty when there is none).
    pub pt: Vec<u8>,
    /// Bytes the kernel wrote since the previous snapshot (`aux_head - since`, or since
    /// the start) that are not in `pt`: overwritten, beyond SIZE, or before the PSB.
    pub discarded: u64,
    /// Bytes copied out of the area (`pt` and what preceded its PSB).
    pub copied: usize,
    /// Why `pt` is empty, if it is.
    pub empty_reason: Option<String>,
}

/// Offset of the first complete PSB in `bytes`.
pub fn first_psb(bytes: &[u8]) -> Option<usize> {
    bytes.windows(PSB.len()).position(|w| w == PSB)
}

/// The PT of a snapshot of an overwrite-mode area `aux` whose head is `aux_head`: the last
/// `min(size, valid)` bytes newer than `since`, from their first PSB on.
pub fn kept_pt(aux: &RingMemory, aux_head: u64, since: u64, size: u64) -> KeptPt {
    let want = usize::try_from(size).unwrap_or(usize::MAX).min(aux.len());
    let mut buf = vec![0u8; want];
    let c = copy_overwrite_snapshot(aux, aux_head, since, &mut buf);
    buf.truncate(c.copied);
    let written = if since <= aux_head {
        aux_head - since
    } else {
        aux_head
    };
    let (pt, empty_reason) = if c.copied == 0 {
        (
            Vec::new(),
            Some("no PT was written since the previous snapshot".to_string()),
        )
    } else {
        match first_psb(&buf) {
            Some(at) => (buf.split_off(at), None),
            None => (
                Vec::new(),
                Some(format!(
                    "no PSB in the last {} bytes of PT (the decoder cannot start without \
                     one; use a larger --snapshot SIZE)",
                    c.copied
                )),
            ),
        }
    };
    KeptPt {
        discarded: written.saturating_sub(pt.len() as u64),
        copied: c.copied,
        pt,
        empty_reason,
    }
}

/// What a snapshot wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub record: SnapshotRecord,
    /// The window written (`None` for an empty snapshot).
    pub window: Option<Window>,
    pub pt_bytes: usize,
    pub empty_reason: Option<String>,
}

/// A thread's snapshot state between firings: SIZE, the head the previous snapshot ended
/// at, the next window index, the sideband not yet written.
#[derive(Debug, Clone)]
pub struct SnapshotCursor {
    size: u64,
    since: u64,
    next_index: u64,
    sideband: Vec<u8>,
}

impl SnapshotCursor {
    /// A cursor for snapshots of at most `size` PT bytes; `sideband` (e.g. the synthesized
    /// executable mappings) goes into the first window written.
    pub fn new(size: u64, sideband: Vec<u8>) -> Self {
        SnapshotCursor {
            size,
            since: 0,
            next_index: 0,
            sideband,
        }
    }

    /// The head the previous snapshot ended at (0 before the first).
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Sideband (perf records from the DATA ring) to carry in the next window written.
    pub fn add_sideband(&mut self, records: &[u8]) {
        self.sideband.extend_from_slice(records);
    }

    /// The seam: with the event disabled, writes the snapshot of `aux` (head `aux_head`)
    /// for `firing` into `out` (a thread file: `Snapshot` record, then the window) and
    /// moves on past `aux_head`. `pt_lost`: the kernel reported loss since the previous
    /// snapshot (AUX TRUNCATED/PARTIAL/COLLISION).
    pub fn write(
        &mut self,
        aux: &RingMemory,
        aux_head: u64,
        firing: &Firing,
        pt_lost: bool,
        out: &mut impl Write,
    ) -> io::Result<Written> {
        let kept = kept_pt(aux, aux_head, self.since, self.size);
        self.since = aux_head;
        let window = (!kept.pt.is_empty()).then(|| Window {
            index: self.next_index,
            nr: u64::MAX,
            tsc_start: psb_tsc(&kept.pt).unwrap_or(firing.tsc),
            tsc_end: firing.tsc,
            flags: WF_NO_SYSCALL | WF_SNAPSHOT_CUT | if pt_lost { WF_PT_LOST } else { 0 },
            ..Window::default()
        });
        let mut trigger = firing.trigger.clone();
        if let Some(why) = &kept.empty_reason {
            trigger.push_str(&format!("; empty: {why}"));
        }
        let taken: Taken<()> = Taken {
            windows: VecDeque::new(),
            pt_bytes: kept.pt.len() as u64,
            discarded_windows: 0,
            discarded_pt: kept.discarded,
            ring_size: self.size,
        };
        let mut record = taken.record(
            firing.number,
            firing.kind as u32,
            firing.fired_tid,
            firing.tsc,
            trigger,
        );
        record.windows = u64::from(window.is_some());
        let frame = frame_vec(RecordType::Snapshot, &record.payload())
            .ok_or_else(|| io::Error::other("Snapshot record too large"))?;
        out.write_all(&frame)?;
        if let Some(w) = &window {
            let (head, crc) = window_frame_parts(w, &kept.pt, &self.sideband).ok_or_else(|| {
                io::Error::other(format!(
                    "a snapshot window of {} PT bytes does not fit a Window record",
                    kept.pt.len()
                ))
            })?;
            out.write_all(&head)?;
            out.write_all(&kept.pt)?;
            out.write_all(&self.sideband)?;
            out.write_all(&crc)?;
            self.next_index += 1;
            self.sideband.clear();
        }
        Ok(Written {
            record,
            window,
            pt_bytes: kept.pt.len(),
            empty_reason: kept.empty_reason,
        })
    }
}

/// The TSC of the PSB+ that `pt` starts with (its TSC packet, `0x19` and 7 bytes, right
/// after the PSB), if it has one there.
fn psb_tsc(pt: &[u8]) -> Option<u64> {
    let rest = pt.get(PSB.len()..)?;
    if *rest.first()? != 0x19 {
        return None;
    }
    let mut b = [0u8; 8];
    b[..7].copy_from_slice(rest.get(1..8)?);
    Some(u64::from_le_bytes(b))
}

/// [`SnapshotCursor::write`] on an event's mappings (the event disabled): the DATA ring's
/// records since the previous snapshot go into the window's sideband (and their AUX
/// flags decide `WF_PT_LOST`; `PERF_AUX_FLAG_OVERWRITE` is normal here), then the AUX
/// area's snapshot is written. Used on the real mappings and on simulated ones in tests.
pub fn snapshot_from_rings(
    ctl: &ControlPage,
    aux: &RingMemory,
    data: &RingMemory,
    cursor: &mut SnapshotCursor,
    firing: &Firing,
    out: &mut impl Write,
) -> io::Result<Written> {
    let data_head = ctl.data_head();
    let mut records = vec![0u8; data.len()];
    let rw = copy_ring_records(data, ctl.data_tail(), data_head, Some(&mut records));
    ctl.set_data_tail(data_head);
    cursor.add_sideband(&records[..rw.copied]);
    let lost = rw.aux_flags & AUX_LOSS_FLAGS != 0;
    cursor.write(aux, ctl.aux_head(), firing, lost, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::packets::{list_packets, PacketLine};
    use crate::decode::testgen::LoopProgram;
    use crate::decode::{AddressSpace, ImageResolver, PtDecoder, Record, TraceParams};
    use crate::format::ptt::{
        decode_window, encode_header, end_payload, parse, thread_header_payload, EndReason,
        FileKind, ThreadHeader,
    };
    use crate::format::summary::summarize_thread;
    use crate::perf::ring::sim::SimMapping;
    use crate::sideband::record::{
        encode_aux, SampleId, PERF_AUX_FLAG_COLLISION, PERF_AUX_FLAG_OVERWRITE,
        SIDEBAND_SAMPLE_TYPE,
    };

    const BASE: u64 = 0x40_0000;

    /// The instruction addresses a decoder gives for `pt` of the loop program; gaps other
    /// than at the very end of the data are failures.
    fn pcs(prog: &LoopProgram, pt: &[u8]) -> Vec<u64> {
        let mut space = AddressSpace::new();
        space.add_bytes("loop", prog.code.clone(), prog.base);
        let dec = PtDecoder::new(
            pt,
            TraceParams::default(),
            space,
            vec![],
            ImageResolver::default(),
            Default::default(),
        )
        .unwrap();
        let recs: Vec<Record> = dec.collect();
        let mut out = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            match r {
                Record::Gap(g) => assert_eq!(i + 1, recs.len(), "gap before the end: {g:?}"),
                r => out.extend(r.as_instruction().map(|x| x.pc)),
            }
        }
        out
    }

    /// PSB offsets of `stream`, from libipt's packet decoder over the whole stream (an
    /// oracle independent of [`first_psb`]).
    fn psb_offsets(stream: &[u8]) -> Vec<usize> {
        list_packets(stream)
            .into_iter()
            .filter_map(|l| match l {
                PacketLine::Packet {
                    offset,
                    name: "psb",
                    ..
                } => Some(offset as usize),
                _ => None,
            })
            .collect()
    }

    fn firing(number: u64) -> Firing {
        Firing {
            number,
            kind: TriggerKind::Signal,
            fired_tid: 0,
            trigger: "signal:SIGUSR2".into(),
            tsc: 5_000_000 + number,
        }
    }

    /// A thread file: header, `ThreadHeader`, what `body` writes, `End`.
    fn thread_file(body: &[u8], windows: u64) -> tempfile::NamedTempFile {
        let mut v = encode_header(FileKind::Thread).to_vec();
        let h = ThreadHeader {
            pid: 10,
            tid: 11,
            mode: 0,
            window: 1,
            backend: 0,
            pt_present: true,
            nonce: 1,
            start_tsc: 1,
            pt_absent_reason: String::new(),
        };
        v.extend(frame_vec(RecordType::ThreadHeader, &thread_header_payload(&h)).unwrap());
        v.extend_from_slice(body);
        v.extend(
            frame_vec(
                RecordType::End,
                &end_payload(EndReason::ThreadExit, windows, 0),
            )
            .unwrap(),
        );
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&v).unwrap();
        f
    }

    /// A window read back: its record, PT and sideband.
    type ReadWindow = (Window, Vec<u8>, Vec<u8>);

    /// The snapshots and windows of a written thread file, read back by the readers
    /// `pttrace report` and `decode` use.
    fn read_back(body: &[u8]) -> (Vec<SnapshotRecord>, Vec<ReadWindow>) {
        let f = thread_file(body, 0);
        let s = summarize_thread(f.path()).unwrap();
        let data = std::fs::read(f.path()).unwrap();
        let parsed = parse("t", &data).unwrap();
        let wins: Vec<_> = parsed
            .frames
            .iter()
            .filter(|fr| fr.ty == RecordType::Window as u16)
            .map(|fr| {
                let w = decode_window(fr.payload).unwrap();
                (w.window, w.pt.to_vec(), w.sideband.to_vec())
            })
            .collect();
        assert_eq!(s.windows, wins.len() as u64);
        (s.snapshots, wins)
    }

    /// The kernel writes `stream` into an overwrite-mode area of `aux_len` bytes (in pieces
    /// of `piece` bytes, at byte count `start`); a snapshot of SIZE `size` is written. The
    /// window's PT must be exactly the stream from its first PSB in the last min(SIZE,
    /// area) bytes, and decode to exactly the instructions that PT ends the trace with.
    fn check_case(
        prog: &LoopProgram,
        stream: &[u8],
        aux_len: usize,
        size: u64,
        piece: usize,
    ) -> Vec<u64> {
        let mut sim = SimMapping::new(4096, aux_len);
        let mut pos = 0u64;
        for c in stream.chunks(piece) {
            sim.produce_aux(pos, c);
            pos += c.len() as u64;
        }
        let head = stream.len();
        let keep = (size as usize).min(aux_len).min(head);
        let psb = *psb_offsets(stream)
            .iter()
            .find(|&&o| o >= head - keep && o + PSB.len() <= head)
            .expect("the case has a PSB in the kept bytes");
        let mut cursor = SnapshotCursor::new(size, b"SYNTH".to_vec());
        let mut out = Vec::new();
        let w = snapshot_from_rings(
            &sim.ctl(),
            &sim.aux(),
            &sim.data(),
            &mut cursor,
            &firing(1),
            &mut out,
        )
        .unwrap();
        assert_eq!(w.empty_reason, None);
        assert_eq!(cursor.since(), head as u64);
        let (snaps, wins) = read_back(&out);
        assert_eq!(snaps.len(), 1);
        let r = &snaps[0];
        assert_eq!(
            (
                r.number,
                r.kind,
                r.windows,
                r.pt_bytes,
                r.discarded_pt_bytes
            ),
            (
                1,
                TriggerKind::Signal as u32,
                1,
                (head - psb) as u64,
                psb as u64
            )
        );
        assert_eq!(
            (r.ring_size, r.tsc, r.trigger.as_str()),
            (size, 5_000_001, "signal:SIGUSR2")
        );
        assert_eq!(wins.len(), 1);
        let (win, pt, sb) = &wins[0];
        assert_eq!(win.flags, WF_NO_SYSCALL | WF_SNAPSHOT_CUT);
        assert_eq!((win.index, win.tsc_end), (0, 5_000_001));
        assert_eq!(sb, b"SYNTH");
        assert_eq!(pt.as_slice(), &stream[psb..], "PT bytes from the PSB on");
        let got = pcs(prog, pt);
        let expect = pcs(prog, &stream[psb..head]);
        assert!(got.len() > 50, "{} instructions", got.len());
        assert_eq!(got, expect);
        got
    }

    #[test]
    fn not_wrapped_keeps_everything() {
        let prog = LoopProgram::new(BASE);
        let (stream, bits) = prog.trace(6000, 700, 1);
        let got = check_case(&prog, &stream, 16384, 16384, 1000);
        // From byte 0: exactly the oracle's instructions.
        let oracle = prog.simulate(&bits);
        assert_eq!(&got[..], &oracle[..got.len()]);
        assert_eq!(got.len() + 4, oracle.len());
    }

    /// Wrapped once, many times, with SIZE below the area, and SIZE above it: the kept
    /// tail decodes to exactly the end of the whole trace's instructions.
    #[test]
    fn wrapped_once_and_many_times_keeps_the_decodable_tail() {
        let prog = LoopProgram::new(BASE);
        for (len, aux, size, piece, seed) in [
            (12_000usize, 8192usize, 8192u64, 977usize, 2u64),
            (200_000, 8192, 8192, 4096, 3),
            (200_000, 8192, 4096, 333, 4),
            (50_000, 4096, 65536, 10_000, 5),
        ] {
            let (stream, bits) = prog.trace(len, 700, seed);
            let full = pcs(&prog, &stream);
            let oracle = prog.simulate(&bits);
            assert_eq!(&full[..], &oracle[..full.len()]);
            let got = check_case(&prog, &stream, aux, size, piece);
            assert!(
                full.ends_with(&got),
                "case {len}/{aux}/{size}: not the trace's end"
            );
            assert!(got.len() < full.len(), "only the tail");
        }
    }

    #[test]
    fn a_psb_straddling_the_wrap_point() {
        let prog = LoopProgram::new(BASE);
        let aux = 4096usize;
        let (trace, _) = prog.trace(30_000, 500, 6);
        // The first PSB of the last `aux` bytes, shifted by PADs so that the ring's end
        // falls in its middle.
        let p = *psb_offsets(&trace)
            .iter()
            .find(|&&o| o >= trace.len() - aux)
            .unwrap();
        let pad = (aux - (p + 8) % aux) % aux;
        let mut stream = vec![0u8; pad];
        stream.extend_from_slice(&trace);
        let at = (pad + p) % aux;
        assert!(at + PSB.len() > aux, "the PSB is at ring position {at}");
        let got = check_case(&prog, &stream, aux, aux as u64, 1500);
        assert!(pcs(&prog, &stream).ends_with(&got));
    }

    #[test]
    fn no_psb_in_the_kept_bytes_gives_an_explicit_empty_snapshot() {
        let prog = LoopProgram::new(BASE);
        let (stream, _) = prog.trace(100_000, 1 << 20, 7);
        assert_eq!(psb_offsets(&stream), [0], "one PSB, at the start");
        let mut sim = SimMapping::new(4096, 4096);
        sim.produce_aux(0, &stream);
        let mut cursor = SnapshotCursor::new(4096, b"SB".to_vec());
        let mut out = Vec::new();
        let w = snapshot_from_rings(
            &sim.ctl(),
            &sim.aux(),
            &sim.data(),
            &mut cursor,
            &firing(1),
            &mut out,
        )
        .unwrap();
        let why = "no PSB in the last 4096 bytes of PT (the decoder cannot start without one; \
                   use a larger --snapshot SIZE)";
        assert_eq!(w.empty_reason.as_deref(), Some(why));
        assert_eq!(w.window, None);
        let (snaps, wins) = read_back(&out);
        assert!(wins.is_empty());
        assert_eq!(
            snaps,
            [SnapshotRecord {
                number: 1,
                kind: TriggerKind::Signal as u32,
                fired_tid: 0,
                tsc: 5_000_001,
                windows: 0,
                pt_bytes: 0,
                discarded_windows: 0,
                discarded_pt_bytes: stream.len() as u64,
                ring_size: 4096,
                trigger: format!("signal:SIGUSR2; empty: {why}"),
            }]
        );
        // Nothing new: empty again, saying so; the sideband still waits for a window.
        let mut out = Vec::new();
        let w = snapshot_from_rings(
            &sim.ctl(),
            &sim.aux(),
            &sim.data(),
            &mut cursor,
            &firing(2),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            w.empty_reason.as_deref(),
            Some("no PT was written since the previous snapshot")
        );
        assert_eq!((w.record.discarded_pt_bytes, w.record.windows), (0, 0));
        // Then a PSB+ and more loop: the window carries the sideband kept for it.
        let (more, _) = prog.trace(3000, 1 << 20, 8);
        sim.produce_aux(stream.len() as u64, &more);
        let mut out = Vec::new();
        snapshot_from_rings(
            &sim.ctl(),
            &sim.aux(),
            &sim.data(),
            &mut cursor,
            &firing(3),
            &mut out,
        )
        .unwrap();
        let (snaps, wins) = read_back(&out);
        assert_eq!((snaps[0].number, snaps[0].windows), (3, 1));
        assert_eq!(wins[0].1, more);
        assert_eq!(wins[0].2, b"SB");
        assert_eq!(wins[0].0.tsc_start, 1_000_000, "the PSB+'s TSC");
    }

    /// Consecutive snapshots: each holds only what came after the previous one; window
    /// indices count on; the DATA ring's records become the sideband; loss is flagged.
    #[test]
    fn consecutive_snapshots_sideband_and_loss() {
        let prog = LoopProgram::new(BASE);
        let (stream, _) = prog.trace(40_000, 600, 9);
        let psbs = psb_offsets(&stream);
        let mut sim = SimMapping::new(4096, 8192);
        let first_end = psbs[psbs.len() / 2] + 5;
        sim.produce_aux(0, &stream[..first_end]);
        let sample = SampleId {
            pid: Some(10),
            tid: Some(11),
            time: Some(3),
            cpu: Some(0),
            identifier: Some(4),
            ..Default::default()
        };
        let rec1 = encode_aux(
            0,
            8192,
            PERF_AUX_FLAG_OVERWRITE,
            &sample,
            SIDEBAND_SAMPLE_TYPE,
        );
        sim.produce_data(0, &rec1);
        let rec2 = encode_aux(0, 0, PERF_AUX_FLAG_COLLISION, &sample, SIDEBAND_SAMPLE_TYPE);
        let mut cursor = SnapshotCursor::new(8192, Vec::new());
        let mut out = Vec::new();
        for n in 1..=2u64 {
            let w = snapshot_from_rings(
                &sim.ctl(),
                &sim.aux(),
                &sim.data(),
                &mut cursor,
                &firing(n),
                &mut out,
            )
            .unwrap();
            assert!(w.window.is_some());
            if n == 1 {
                // 2000 bytes more, then a COLLISION.
                let second_end = first_end + 2000;
                sim.produce_aux(first_end as u64, &stream[first_end..second_end]);
                sim.produce_data(rec1.len() as u64, &rec2);
            }
        }
        let (snaps, wins) = read_back(&out);
        assert_eq!(snaps.len(), 2);
        let second_end = first_end + 2000;
        let p1 = *psbs.iter().find(|&&o| o >= first_end - 8192).unwrap();
        let p2 = *psbs.iter().find(|&&o| o >= first_end).unwrap();
        assert_eq!(wins[0].1, &stream[p1..first_end]);
        assert_eq!(wins[1].1, &stream[p2..second_end], "only what came after");
        assert_eq!((wins[0].0.index, wins[1].0.index), (0, 1));
        assert_eq!(wins[0].0.flags, WF_NO_SYSCALL | WF_SNAPSHOT_CUT);
        assert_eq!(
            wins[1].0.flags,
            WF_NO_SYSCALL | WF_SNAPSHOT_CUT | WF_PT_LOST
        );
        assert_eq!(wins[0].2, rec1);
        assert_eq!(wins[1].2, rec2);
        assert_eq!(snaps[1].discarded_pt_bytes, (p2 - first_end) as u64);
        assert_eq!(pcs(&prog, &wins[1].1), pcs(&prog, &stream[p2..second_end]));
        assert_eq!(first_psb(&[0x02, 0x82]), None);
    }
}
