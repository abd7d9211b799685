//! Snapshot (flight-recorder) mode on the hardware backend: from an overwrite-mode AUX
//! area to the `Snapshot` record (type 27) and window that the other backends write, so
//! that `pttrace decode`, `report` and `view` read them unchanged.
//!
//! Normal context only (it allocates): the caller is the traced thread or a writer thread,
//! with the event disabled ([`super::hardware::HardwareSnapshot::write_snapshot`] does
//! disable, [`SnapshotCursor::write`], enable).
//!
//! At a firing, with the event disabled: in overwrite mode the kernel ignores `aux_tail`
//! (not used here), and Intel PT's `aux_head` is an *offset within the area*, not an
//! ever-increasing count (`pt_buffer_reset_offsets` masks it in snapshot mode; perf's
//! `intel_pt_find_snapshot` says so and detects wrapping from the data). So whether the
//! kernel went round since the previous snapshot is told from the data, as perf does: the
//! area starts zero-filled, and the cursor keeps a copy of up to [`REF_MAX`] bytes just
//! before the previous head (zeros at first: perf's "first wrap" test of the area's end);
//! if the part of them that a write of `head - previous head` bytes does not reach is
//! unchanged, exactly those bytes are new, otherwise the kernel lapped and the whole area
//! is new (oldest at the head). Of the new bytes the last `min(SIZE, new)` are kept, in
//! order (read in two pieces when they wrap). What precedes the first PSB in them cannot
//! be decoded (no packet boundary, no IP, no mode), so the snapshot's PT starts at that
//! PSB. The result is one `Snapshot` record (built by the shared
//! [`crate::format::snapshot_ring::Taken`]) and one window flagged
//! `WF_NO_SYSCALL | WF_SNAPSHOT_CUT` (`WF_PT_LOST` where the kernel reported TRUNCATED,
//! PARTIAL or COLLISION) holding that PT and the sideband that arrived since the previous
//! snapshot. Kept bytes without a PSB give an explicit empty snapshot: the record, no
//! window, and the reason appended to its trigger text (never bytes a decoder would have
//! to guess at).

use std::collections::VecDeque;
use std::io::{self, Write};

use pttrace_encoder::packet::PSB;

use crate::format::ptt::{
    frame_vec, window_frame_parts, RecordType, Window, WF_NO_SYSCALL, WF_PT_LOST, WF_SNAPSHOT_CUT,
};
use crate::format::snapshot::{SnapshotRecord, TriggerKind};
use crate::format::snapshot_ring::Taken;
use crate::perf::ring::AUX_LOSS_FLAGS;
use crate::perf::ring::{copy_ring_records, ControlPage, RingMemory};

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

/// Most bytes compared behind the previous head to tell whether the kernel lapped (at
/// most half the area).
pub const REF_MAX: usize = 4096;

/// The PT of one snapshot, cut at its first PSB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptPt {
    /// The PT from the first PSB on (empty when there is none).
    pub pt: Vec<u8>,
    /// New bytes (written since the previous snapshot) not in `pt`: beyond SIZE or before
    /// the PSB. A lower bound when `lapped` (what the kernel overwrote is not counted).
    pub discarded: u64,
    /// The kernel went round the area since the previous snapshot (or, at the first, ever):
    /// the whole area was new and older PT is gone.
    pub lapped: bool,
    /// Why `pt` is empty, if it is.
    pub empty_reason: Option<String>,
}

/// Offset of the first complete PSB in `bytes`.
pub fn first_psb(bytes: &[u8]) -> Option<usize> {
    bytes.windows(PSB.len()).position(|w| w == PSB)
}

/// Where the previous snapshot ended in an area: the head offset and a copy of the bytes
/// just before it (`None`: nothing taken yet, the area as allocated, zero-filled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AreaMark {
    pub head: usize,
    pub reference: Option<Vec<u8>>,
}

impl AreaMark {
    /// The new bytes of `aux` (head offset `head`): `(start offset, length, lapped)`.
    pub fn new_bytes(&self, aux: &RingMemory, head: usize) -> (usize, usize, bool) {
        let size = aux.len();
        let head = head & (size - 1);
        let d = (head + size - self.head) & (size - 1);
        let untouched = if d == 0 { size } else { size - d };
        let r = REF_MAX.min(size / 2).max(1);
        let m = r.min(untouched);
        let mut now = vec![0u8; m];
        aux.read_at((self.head + size - m) as u64, &mut now);
        let same = match &self.reference {
            Some(reference) => reference.get(reference.len().saturating_sub(m)..) == Some(&now[..]),
            None => now.iter().all(|&b| b == 0),
        };
        if same {
            (self.head, d, false)
        } else {
            (head, size, true)
        }
    }

    /// The mark after taking everything up to `head`.
    pub fn at(aux: &RingMemory, head: usize) -> AreaMark {
        let size = aux.len();
        let head = head & (size - 1);
        let r = REF_MAX.min(size / 2).max(1);
        let mut reference = vec![0u8; r];
        aux.read_at((head + size - r) as u64, &mut reference);
        AreaMark {
            head,
            reference: Some(reference),
        }
    }
}

/// The PT of a snapshot of an overwrite-mode area `aux` whose head offset is `aux_head`:
/// the last `min(size, new)` of the bytes newer than `mark`, from their first PSB on.
pub fn kept_pt(aux: &RingMemory, aux_head: u64, mark: &AreaMark, size: u64) -> KeptPt {
    let head = (aux_head as usize) & (aux.len() - 1);
    let (start, len, lapped) = mark.new_bytes(aux, head);
    let keep = usize::try_from(size).unwrap_or(usize::MAX).min(len);
    let mut buf = vec![0u8; keep];
    aux.read_at((start + len - keep) as u64, &mut buf);
    let (pt, empty_reason) = if keep == 0 {
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
                    "no PSB in the last {keep} bytes of PT (the decoder cannot start without \
                     one; use a larger --snapshot SIZE)"
                )),
            ),
        }
    };
    KeptPt {
        discarded: (len - pt.len()) as u64,
        lapped,
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
    /// The kernel went round the area since the previous snapshot (older PT is gone).
    pub lapped: bool,
    pub empty_reason: Option<String>,
}

/// A thread's snapshot state between firings: SIZE, where the previous snapshot ended,
/// the next window index, the sideband not yet written.
#[derive(Debug, Clone)]
pub struct SnapshotCursor {
    size: u64,
    mark: AreaMark,
    next_index: u64,
    sideband: Vec<u8>,
}

impl SnapshotCursor {
    /// A cursor for snapshots of at most `size` PT bytes; `sideband` (e.g. the synthesized
    /// executable mappings) goes into the first window written.
    pub fn new(size: u64, sideband: Vec<u8>) -> Self {
        SnapshotCursor {
            size,
            mark: AreaMark::default(),
            next_index: 0,
            sideband,
        }
    }

    /// Where the previous snapshot ended.
    pub fn mark(&self) -> &AreaMark {
        &self.mark
    }

    /// Sideband (perf records from the DATA ring) to carry in the next window written.
    pub fn add_sideband(&mut self, records: &[u8]) {
        self.sideband.extend_from_slice(records);
    }

    /// The seam: with the event disabled, writes the snapshot of `aux` (head offset
    /// `aux_head`, as the control page gives it) for `firing` into `out` (a thread file:
    /// `Snapshot` record, then the window) and moves on past `aux_head`. `pt_lost`: the kernel reported loss since the previous
    /// snapshot (AUX TRUNCATED/PARTIAL/COLLISION).
    pub fn write(
        &mut self,
        aux: &RingMemory,
        aux_head: u64,
        firing: &Firing,
        pt_lost: bool,
        out: &mut impl Write,
    ) -> io::Result<Written> {
        let kept = kept_pt(aux, aux_head, &self.mark, self.size);
        self.mark = AreaMark::at(aux, aux_head as usize);
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
            lapped: kept.lapped,
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

    /// Snapshot number `number` of the simulated rings, written into `out`.
    fn fire(
        sim: &mut SimMapping,
        cursor: &mut SnapshotCursor,
        number: u64,
        out: &mut Vec<u8>,
    ) -> Written {
        snapshot_from_rings(
            &sim.ctl(),
            &sim.aux(),
            &sim.data(),
            cursor,
            &firing(number),
            out,
        )
        .unwrap()
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
            sim.produce_aux_overwrite(pos, c);
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
        let w = fire(&mut sim, &mut cursor, 1, &mut out);
        assert_eq!(w.empty_reason, None);
        assert_eq!(cursor.mark().head, head % aux_len);
        assert_eq!(w.lapped, head >= aux_len);
        let new = head.min(aux_len);
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
                (new - (head - psb)) as u64
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
        sim.produce_aux_overwrite(0, &stream);
        let mut cursor = SnapshotCursor::new(4096, b"SB".to_vec());
        let mut out = Vec::new();
        let w = fire(&mut sim, &mut cursor, 1, &mut out);
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
                discarded_pt_bytes: 4096,
                ring_size: 4096,
                trigger: format!("signal:SIGUSR2; empty: {why}"),
            }]
        );
        // Nothing new: empty again, saying so; the sideband still waits for a window.
        let mut out = Vec::new();
        let w = fire(&mut sim, &mut cursor, 2, &mut out);
        assert_eq!(
            w.empty_reason.as_deref(),
            Some("no PT was written since the previous snapshot")
        );
        assert_eq!((w.record.discarded_pt_bytes, w.record.windows), (0, 0));
        // Then a PSB+ and more loop: the window carries the sideband kept for it.
        let (more, _) = prog.trace(3000, 1 << 20, 8);
        sim.produce_aux_overwrite(stream.len() as u64, &more);
        let mut out = Vec::new();
        fire(&mut sim, &mut cursor, 3, &mut out);
        let (snaps, wins) = read_back(&out);
        assert_eq!((snaps[0].number, snaps[0].windows), (3, 1));
        assert_eq!(wins[0].1, more);
        assert_eq!(wins[0].2, b"SB");
        assert_eq!(wins[0].0.tsc_start, 1_000_000, "the PSB+'s TSC");
    }

    /// Consecutive snapshots: each holds only what came after the previous one (new bytes
    /// across the area's end without a lap; then exactly two laps, the head back at the
    /// same offset, told from the data); window indices count on; the DATA ring's records
    /// become the sideband; loss is flagged.
    #[test]
    fn consecutive_snapshots_laps_sideband_and_loss() {
        let prog = LoopProgram::new(BASE);
        let (stream, _) = prog.trace(50_000, 600, 9);
        let psbs = psb_offsets(&stream);
        let aux = 8192usize;
        let mut sim = SimMapping::new(4096, aux);
        let first_end = psbs[psbs.len() * 2 / 5] + 5;
        let second_end = first_end + 5000;
        let third_end = second_end + 2 * aux;
        assert!(
            first_end % aux + 5000 > aux,
            "the second chunk crosses the area's end"
        );
        assert!(third_end <= stream.len());
        let sample = SampleId {
            pid: Some(10),
            tid: Some(11),
            time: Some(3),
            cpu: Some(0),
            identifier: Some(4),
            ..Default::default()
        };
        let rec1 = encode_aux(0, 0, PERF_AUX_FLAG_OVERWRITE, &sample, SIDEBAND_SAMPLE_TYPE);
        let rec2 = encode_aux(0, 0, PERF_AUX_FLAG_COLLISION, &sample, SIDEBAND_SAMPLE_TYPE);
        let mut cursor = SnapshotCursor::new(aux as u64, Vec::new());
        let mut out = Vec::new();
        let mut lapped = Vec::new();
        let mut pos = 0usize;
        let mut dpos = 0u64;
        for (n, end, rec) in [
            (1u64, first_end, &rec1),
            (2, second_end, &rec2),
            (3, third_end, &rec1),
        ] {
            sim.produce_aux_overwrite(pos as u64, &stream[pos..end]);
            sim.produce_data(dpos, rec);
            dpos += rec.len() as u64;
            pos = end;
            let w = fire(&mut sim, &mut cursor, n, &mut out);
            assert!(w.window.is_some());
            lapped.push(w.lapped);
        }
        assert_eq!(lapped, [true, false, true]);
        assert_eq!(
            sim.ctl().aux_head() as usize,
            second_end % aux,
            "the head came back"
        );
        let (snaps, wins) = read_back(&out);
        assert_eq!(snaps.len(), 3);
        let p1 = *psbs.iter().find(|&&o| o >= first_end - aux).unwrap();
        let p2 = *psbs.iter().find(|&&o| o >= first_end).unwrap();
        let p3 = *psbs.iter().find(|&&o| o >= third_end - aux).unwrap();
        assert_eq!(wins[0].1, &stream[p1..first_end]);
        assert_eq!(wins[1].1, &stream[p2..second_end], "only what came after");
        assert_eq!(
            wins[2].1,
            &stream[p3..third_end],
            "the whole area after laps"
        );
        let idx: Vec<u64> = wins.iter().map(|w| w.0.index).collect();
        assert_eq!(idx, [0, 1, 2]);
        let flags: Vec<u32> = wins.iter().map(|w| w.0.flags).collect();
        let cut = WF_NO_SYSCALL | WF_SNAPSHOT_CUT;
        assert_eq!(flags, [cut, cut | WF_PT_LOST, cut]);
        let sbs: Vec<&[u8]> = wins.iter().map(|w| w.2.as_slice()).collect();
        assert_eq!(sbs, [&rec1[..], &rec2[..], &rec1[..]]);
        assert_eq!(snaps[1].discarded_pt_bytes, (p2 - first_end) as u64);
        assert_eq!(snaps[2].discarded_pt_bytes, (aux - (third_end - p3)) as u64);
        for (k, (a, b)) in [(p2, second_end), (p3, third_end)].into_iter().enumerate() {
            assert_eq!(pcs(&prog, &wins[k + 1].1), pcs(&prog, &stream[a..b]));
        }
        assert_eq!(first_psb(&[0x02, 0x82]), None);
    }

    /// What `pttrace decode`/`view` read: a trace directory (info file with the loop
    /// program's mapping, the thread file with two snapshots, the second empty, and a
    /// third) decodes through `ptt_dir` to exactly the kept tails.
    #[test]
    fn written_snapshots_decode_through_the_trace_directory_reader() {
        use crate::decode::ptt_dir;
        use crate::format::ptt::{process_payload, ProcessRecord};
        let prog = LoopProgram::new(BASE);
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("loop.bin");
        std::fs::write(&code, &prog.code).unwrap();
        let mut info = encode_header(FileKind::ProcessInfo).to_vec();
        let p = ProcessRecord {
            pid: 77,
            ppid: 1,
            nonce: 0xab,
            start_tsc: 1,
            start_monotonic_ns: 1,
            mode: 0,
            window: 1,
            backend: 0,
            pt_present: true,
            pt_absent_reason: String::new(),
        };
        info.extend(frame_vec(RecordType::Process, &process_payload(&p)).unwrap());
        let md = crate::metadata::PtMetadata {
            cpu_family: 6,
            cpu_model: 85,
            cpu_stepping: 4,
            ..Default::default()
        };
        let mut meta = md.to_bytes().to_vec();
        meta.extend_from_slice(&[0u8; 24]);
        meta.extend_from_slice(&SIDEBAND_SAMPLE_TYPE.to_le_bytes());
        info.extend(frame_vec(RecordType::Metadata, &meta).unwrap());
        let maps = format!(
            "00400000-00401000 r-xp 00000000 08:01 1 {}\n",
            code.display()
        );
        info.extend(frame_vec(RecordType::Maps, maps.as_bytes()).unwrap());
        std::fs::write(dir.path().join("77-00000000000000ab.info"), &info).unwrap();

        let (stream, _) = prog.trace(60_000, 700, 11);
        let psbs = psb_offsets(&stream);
        let mut sim = SimMapping::new(4096, 8192);
        let mut cursor = SnapshotCursor::new(8192, Vec::new());
        let mut body = Vec::new();
        let mut expect = Vec::new();
        let mut pos = 0usize;
        for (n, end) in [(1u64, 30_000usize), (2, 30_000), (3, stream.len())] {
            sim.produce_aux_overwrite(pos as u64, &stream[pos..end]);
            let w = fire(&mut sim, &mut cursor, n, &mut body);
            if end > pos {
                let psb = *psbs.iter().find(|&&o| o >= end - 8192).unwrap();
                expect.push(pcs(&prog, &stream[psb..end]));
            } else {
                assert!(w.window.is_none());
            }
            pos = end;
        }
        let mut v = encode_header(FileKind::Thread).to_vec();
        let h = ThreadHeader {
            pid: 77,
            tid: 78,
            mode: 0,
            window: 1,
            backend: 0,
            pt_present: true,
            nonce: 0xab,
            start_tsc: 1,
            pt_absent_reason: String::new(),
        };
        v.extend(frame_vec(RecordType::ThreadHeader, &thread_header_payload(&h)).unwrap());
        v.extend_from_slice(&body);
        v.extend(frame_vec(RecordType::End, &end_payload(EndReason::ThreadExit, 2, 0)).unwrap());
        std::fs::write(dir.path().join("77-00000000000000ab-78.ptt"), &v).unwrap();

        let t = ptt_dir::open(dir.path()).unwrap();
        assert_eq!(t.threads.len(), 1);
        let decoded = t.collect_thread(&t.threads[0]).unwrap();
        let got: Vec<Vec<u64>> = decoded
            .iter()
            .map(|(_, recs)| {
                recs.iter()
                    .filter_map(|r| r.as_instruction().map(|i| i.pc))
                    .collect()
            })
            .collect();
        assert_eq!(got.len(), 2);
        assert!(got[0].len() > 1000 && got[1].len() > 1000);
        assert_eq!(got, expect);
    }
}
