//! Snapshot ring files: a thread's flight-recorder ring ([`crate::snapshot_ring`]) kept
//! where SIGKILL cannot take it away, like the window queue's spool ([`crate::spool`]).
//!
//! In snapshot mode the LD_PRELOAD shim's writer thread keeps, beside each thread's ring
//! in memory, a copy of its windows in a `MAP_SHARED` mapping of
//! `<pid>-<nonce>-<tid>.snapring` (next to the `.spool`): every window pushed into the ring
//! is appended there as its `.ptt` `Window` frame, the oldest frames go when the ring
//! drops them (or when the file needs the room), and a snapshot empties it. The kernel
//! keeps every store in the page cache when the process dies, so after a SIGKILL the file
//! holds the ring as it was at the writer's last pass. The file is removed with the
//! thread's spool once its `End` record is written.
//!
//! Recovery ([`crate::spool::read_thread_file`] in memory, [`crate::spool::salvage`] for
//! good) writes the ring as one more snapshot of the thread, numbered after the process's
//! last firing, with trigger kind [`crate::snapshot::TriggerKind::Kill`]: the ring's windows
//! (those not already written by an earlier firing), then the windows still queued in the
//! spool (metadata only: their PT was in the process's memory, so they are flagged
//! `WF_RECOVERED | WF_PT_DROPPED`), trimmed to the ring's SIZE as the ring would trim them.
//!
//! # Layout (little-endian; plain stores by the writer thread, published by `end`)
//!
//! ```text
//! 0     "PTTSNAPR"          written last when the file is set up (zero: not ready)
//! 8     u32 version (=1)    12  u32 reserved
//! 16    u64 data capacity C (bytes, a multiple of 4096)
//! 24    u64 ring size SIZE  (PT bytes the ring keeps)
//! 32    u64 start           logical offset of the oldest frame kept
//! 40    u64 end             logical offset past the last complete frame
//! 48    u64 windows discarded from the ring since the last snapshot
//! 56    u64 their PT bytes
//! 64    i32 pid             68  i32 tid
//! 72    u64 nonce
//! 80    u64 next window index of the ring
//! 88    u64 carry: bits 0..32 length, bits 32..: 1 = slot A, 2 = slot B, 0 = none
//! 4096  carry slot A        [CARRY_SIZE] the sideband of the windows the ring dropped
//! 4096+CARRY_SIZE  carry slot B
//! DATA_OFFSET      data[C]  frames, each at `offset mod C`, wrapping at the end
//! ```
//! A frame is a whole `.ptt` `Window` frame (its length, type and CRC included), so a
//! frame torn by the death (never the case below `end`) is detected.

use crate::ptt::{self, decode_window, FormatError, RecordType, Window};
use crate::snapshot_ring::{Ring, RingWindow};
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"PTTSNAPR";
pub const VERSION: u32 = 1;
pub const OFF_VERSION: usize = 8;
pub const OFF_CAP: usize = 16;
pub const OFF_SIZE: usize = 24;
pub const OFF_START: usize = 32;
pub const OFF_END: usize = 40;
pub const OFF_DISCARDED: usize = 48;
pub const OFF_DISCARDED_PT: usize = 56;
pub const OFF_PID: usize = 64;
pub const OFF_TID: usize = 68;
pub const OFF_NONCE: usize = 72;
pub const OFF_NEXT_INDEX: usize = 80;
pub const OFF_CARRY: usize = 88;
pub const CARRY_OFFSET: usize = 4096;
pub const CARRY_SIZE: usize = 64 * 1024;
pub const DATA_OFFSET: usize = CARRY_OFFSET + 2 * CARRY_SIZE;

/// Data bytes of the file for a ring of `size` PT bytes: twice the PT, for the frames'
/// own bytes (window fields, sideband), and some slack.
pub fn capacity_for(size: u64) -> u64 {
    (size.saturating_mul(2) + 256 * 1024).next_multiple_of(4096)
}

/// Bytes of the file for `cap` data bytes.
pub fn file_len(cap: u64) -> u64 {
    DATA_OFFSET as u64 + cap
}

/// The ring file of a thread file (`X.ptt` -> `X.snapring`).
pub fn path_for(ptt: &Path) -> PathBuf {
    ptt.with_extension("snapring")
}

/// A ring file's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingFile {
    pub pid: i32,
    pub tid: i32,
    pub nonce: u64,
    pub size: u64,
    pub next_index: u64,
    pub discarded_windows: u64,
    pub discarded_pt: u64,
    /// Sideband of the windows dropped from the ring.
    pub carry: Vec<u8>,
    /// The kept windows' frames (whole `.ptt` frames), oldest first.
    pub frames: Vec<Vec<u8>>,
    /// A frame below `end` was not a valid `Window` frame (the windows from it on are
    /// not in `frames`).
    pub damaged: bool,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// `len` bytes of the data area from logical offset `off` (wrapping).
fn data_at(data: &[u8], cap: u64, off: u64, len: usize) -> Option<Vec<u8>> {
    let area = data.get(DATA_OFFSET..DATA_OFFSET + cap as usize)?;
    if len as u64 > cap {
        return None;
    }
    let at = (off % cap) as usize;
    let first = len.min(area.len() - at);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&area[at..at + first]);
    v.extend_from_slice(&area[..len - first]);
    Some(v)
}

/// Parses a ring file (`name` for messages). `Ok(None)`: never set up (magic still zero).
pub fn parse(name: &str, data: &[u8]) -> Result<Option<RingFile>, FormatError> {
    let bad = |offset: usize, what: String| FormatError::Record {
        path: name.to_string(),
        offset,
        what,
    };
    if data.len() < 8 || data[..8] == [0; 8] {
        return Ok(None);
    }
    if data[..8] != MAGIC {
        return Err(FormatError::BadMagic(name.to_string()));
    }
    let version = le_u32(data, OFF_VERSION);
    if version != VERSION {
        return Err(FormatError::Version(name.to_string(), version));
    }
    let cap = le_u64(data, OFF_CAP);
    if cap == 0 || cap % 4096 != 0 || cap > 1 << 40 {
        return Err(bad(
            OFF_CAP,
            format!("data capacity {cap} is not a multiple of 4096 in 4096..=2^40"),
        ));
    }
    if (data.len() as u64) < file_len(cap) {
        return Err(bad(
            0,
            format!(
                "file is {} bytes; a data area of {cap} bytes needs {}",
                data.len(),
                file_len(cap)
            ),
        ));
    }
    let (start, end) = (le_u64(data, OFF_START), le_u64(data, OFF_END));
    if start > end || end - start > cap {
        return Err(bad(
            OFF_START,
            format!("frames from {start} to {end} do not fit a data area of {cap} bytes"),
        ));
    }
    let carry_word = le_u64(data, OFF_CARRY);
    let carry_len = (carry_word & 0xffff_ffff) as usize;
    let carry = match carry_word >> 32 {
        0 => Vec::new(),
        s @ (1 | 2) if carry_len <= CARRY_SIZE => {
            let at = CARRY_OFFSET + (s as usize - 1) * CARRY_SIZE;
            data[at..at + carry_len].to_vec()
        }
        _ => {
            return Err(bad(
                OFF_CARRY,
                format!("carry word {carry_word:#x} names no slot of {CARRY_SIZE} bytes"),
            ))
        }
    };
    let mut frames = Vec::new();
    let mut damaged = false;
    let mut off = start;
    while off < end {
        let head = data_at(data, cap, off, 8).unwrap_or_default();
        let plen = le_u32(&head, 0) as usize;
        let total = plen + ptt::FRAME_OVERHEAD;
        let frame = (off + total as u64 <= end)
            .then(|| data_at(data, cap, off, total))
            .flatten();
        let valid = frame.as_ref().is_some_and(|f| {
            le_u32(f, 4) as u16 == RecordType::Window as u16
                && ptt::crc32(&f[..total - 4]) == le_u32(f, total - 4)
                && decode_window(&f[8..total - 4]).is_some()
        });
        match frame {
            Some(f) if valid => frames.push(f),
            _ => {
                damaged = true;
                break;
            }
        }
        off += total as u64;
    }
    Ok(Some(RingFile {
        pid: le_u32(data, OFF_PID) as i32,
        tid: le_u32(data, OFF_TID) as i32,
        nonce: le_u64(data, OFF_NONCE),
        size: le_u64(data, OFF_SIZE),
        next_index: le_u64(data, OFF_NEXT_INDEX),
        discarded_windows: le_u64(data, OFF_DISCARDED),
        discarded_pt: le_u64(data, OFF_DISCARDED_PT),
        carry,
        frames,
        damaged,
    }))
}

/// The window of a ring file frame.
pub fn frame_window(f: &[u8]) -> Option<Window> {
    decode_window(f.get(8..f.len().checked_sub(4)?)?).map(|w| w.window)
}

/// A window of a recovered snapshot: its fields, PT and sideband.
struct Kept {
    w: Window,
    pt: Vec<u8>,
    sideband: Vec<u8>,
    /// From the spool's queue (no PT), not from the ring file.
    queued: bool,
}

impl RingWindow for Kept {
    fn sideband_mut(&mut self) -> &mut Vec<u8> {
        &mut self.sideband
    }
}

/// What a ring file recovers for a thread file.
pub struct RingRecovery {
    /// The `Snapshot` frame and its windows' frames.
    pub frames: Vec<u8>,
    pub record: crate::snapshot::SnapshotRecord,
    /// How many of `windows` came from the ring file, and from the spool (without PT):
    /// the windows kept, not those read (the oldest of them may not fit the ring's size).
    pub from_ring: u64,
    pub from_spool: u64,
    /// The windows written (as in `frames`).
    pub windows: Vec<Window>,
}

/// What the info file's note on a recovered snapshot says.
pub const RECOVERED_NOTE: &str = "recovered after the process was killed, the ring";

/// Text of the recovered snapshot's trigger.
pub const KILL_TRIGGER: &str = "kill (recovered after the process was killed)";

/// The snapshot `ring` recovers for a thread file whose last window index written is
/// `last_written` (`None`: none): the ring's windows after it, then `queued` (the spool's
/// windows, not in the ring yet), numbered on from the ring and trimmed to SIZE as the ring
/// would; snapshot `number`. `None` when there is nothing to write.
pub fn recover(
    ring: &RingFile,
    last_written: Option<u64>,
    queued: &[Window],
    number: u64,
) -> Option<RingRecovery> {
    let mut r: Ring<Kept> = Ring::new(ring.size.max(1));
    r.set_discarded(
        ring.discarded_windows,
        ring.discarded_pt,
        ring.carry.clone(),
    );
    let mut next = ring.next_index;
    let mut seen: Vec<(u64, u64)> = Vec::new();
    for f in &ring.frames {
        let Some(wr) = f
            .get(8..f.len() - 4)
            .and_then(decode_window)
            .filter(|w| last_written.is_none_or(|l| w.window.index > l))
        else {
            continue;
        };
        next = next.max(wr.window.index + 1);
        seen.push((wr.window.nr, wr.window.tsc_end));
        r.push(
            Kept {
                w: wr.window,
                pt: wr.pt.to_vec(),
                sideband: wr.sideband.to_vec(),
                queued: false,
            },
            wr.pt.to_vec(),
            drop,
        );
    }
    for q in queued {
        // Taken into the ring already (the death came before the queue entry's release).
        if seen.contains(&(q.nr, q.tsc_end)) {
            continue;
        }
        let mut w = *q;
        w.index = next;
        next += 1;
        w.flags |= ptt::WF_RECOVERED;
        if w.flags & ptt::WF_PT_ABSENT == 0 {
            w.flags |= ptt::WF_PT_DROPPED;
        }
        r.push(
            Kept {
                w,
                pt: Vec::new(),
                sideband: Vec::new(),
                queued: true,
            },
            Vec::new(),
            drop,
        );
    }
    if r.is_empty() {
        return None;
    }
    let taken = r.take();
    let tsc = taken.windows.back().map_or(0, |(k, _)| k.w.tsc_end);
    let record = taken.record(
        number,
        crate::snapshot::TriggerKind::Kill as u32,
        0,
        tsc,
        KILL_TRIGGER.to_string(),
    );
    let mut frames = ptt::frame_vec(RecordType::Snapshot, &record.payload())?;
    let windows = taken.windows.iter().map(|(k, _)| k.w).collect();
    let from_spool = taken.windows.iter().filter(|(k, _)| k.queued).count() as u64;
    let from_ring = taken.windows.len() as u64 - from_spool;
    for (k, _) in &taken.windows {
        let mut buf = vec![0u8; ptt::WINDOW_HEAD_SIZE + k.pt.len() + k.sideband.len() + 4];
        let n = ptt::encode_window(&mut buf, &k.w, &k.pt, &k.sideband)?;
        frames.extend_from_slice(&buf[..n]);
    }
    Some(RingRecovery {
        frames,
        record,
        from_ring,
        from_spool,
        windows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(index: u64, nr: u64, t: u64, flags: u32) -> Window {
        Window {
            index,
            nr,
            tsc_start: t,
            tsc_end: t + 1,
            flags,
            ..Window::default()
        }
    }

    fn frame(w: &Window, pt: &[u8], sb: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; ptt::WINDOW_HEAD_SIZE + pt.len() + sb.len() + 4];
        let n = ptt::encode_window(&mut buf, w, pt, sb).unwrap();
        buf.truncate(n);
        buf
    }

    /// A ring file with `frames` starting at logical offset `start` of a `cap`-byte area.
    fn file(cap: u64, start: u64, frames: &[Vec<u8>], carry: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; file_len(cap) as usize];
        b[..8].copy_from_slice(&MAGIC);
        b[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[OFF_CAP..OFF_CAP + 8].copy_from_slice(&cap.to_le_bytes());
        b[OFF_SIZE..OFF_SIZE + 8].copy_from_slice(&100u64.to_le_bytes());
        b[OFF_DISCARDED..OFF_DISCARDED + 8].copy_from_slice(&5u64.to_le_bytes());
        b[OFF_DISCARDED_PT..OFF_DISCARDED_PT + 8].copy_from_slice(&250u64.to_le_bytes());
        b[OFF_NEXT_INDEX..OFF_NEXT_INDEX + 8].copy_from_slice(&35u64.to_le_bytes());
        let mut off = start;
        for f in frames {
            for (i, byte) in f.iter().enumerate() {
                let at = DATA_OFFSET + ((off + i as u64) % cap) as usize;
                b[at] = *byte;
            }
            off += f.len() as u64;
        }
        b[OFF_START..OFF_START + 8].copy_from_slice(&start.to_le_bytes());
        b[OFF_END..OFF_END + 8].copy_from_slice(&off.to_le_bytes());
        if !carry.is_empty() {
            let at = CARRY_OFFSET + CARRY_SIZE;
            b[at..at + carry.len()].copy_from_slice(carry);
            let word = carry.len() as u64 | (2u64 << 32);
            b[OFF_CARRY..OFF_CARRY + 8].copy_from_slice(&word.to_le_bytes());
        }
        b
    }

    #[test]
    fn frames_wrapping_the_data_area_are_read_back_in_order() {
        let fs: Vec<Vec<u8>> = (0..3)
            .map(|i| frame(&win(30 + i, u64::MAX, 10 * i, 0), &[i as u8; 40], &[]))
            .collect();
        // Starting 50 bytes before the end of the area: the first frame wraps.
        let cap = 4096;
        let data = file(cap, 3 * cap - 50, &fs, b"MAPS");
        let r = parse("r", &data).unwrap().unwrap();
        assert_eq!(r.frames, fs);
        assert!(!r.damaged);
        assert_eq!(r.carry, b"MAPS");
        assert_eq!((r.discarded_windows, r.discarded_pt), (5, 250));
        // A frame torn in the middle: the ones before it stay.
        let mut torn = data.clone();
        let second = DATA_OFFSET + ((3 * cap - 50 + fs[0].len() as u64 + 20) % cap) as usize;
        torn[second] ^= 0xff;
        let r = parse("r", &torn).unwrap().unwrap();
        assert_eq!(r.frames, fs[..1].to_vec());
        assert!(r.damaged);
        // Bad fields are named.
        let mut b = data.clone();
        b[OFF_CAP] = 1;
        let e = parse("r", &b).unwrap_err().to_string();
        assert!(
            e.contains("r: record at offset 16: data capacity 4097"),
            "{e}"
        );
        assert_eq!(parse("r", &[0u8; 64]).unwrap(), None);
    }

    #[test]
    fn recovery_writes_the_unwritten_ring_then_the_queue_trimmed_to_size() {
        // Windows 30..34 in the ring (40 PT bytes each, ring size 100), 30 already written
        // by a firing; two windows queued, the first of them also taken into the ring (33's
        // twin: same syscall and end).
        let ws: Vec<Window> = (0..5)
            .map(|i| win(30 + i, if i == 3 { 39 } else { u64::MAX }, 10 * i, 0))
            .collect();
        let fs: Vec<Vec<u8>> = ws
            .iter()
            .enumerate()
            .map(|(i, w)| frame(w, &[i as u8; 40], if i == 1 { b"SB1" } else { &[] }))
            .collect();
        let data = file(4096, 0, &fs, b"OLD");
        let ring = parse("r", &data).unwrap().unwrap();
        let mut twin = ws[3];
        twin.index = 7;
        let q = win(8, 39, 1000, 0);
        let rec = recover(&ring, Some(30), &[twin, q], 6).unwrap();
        // 100 bytes hold two windows of 40 and the queued one (no PT): 31 and 32 go.
        assert_eq!((rec.from_ring, rec.from_spool), (2, 1));
        let mut whole = ptt::encode_header(ptt::FileKind::Thread).to_vec();
        whole.extend_from_slice(&rec.frames);
        let parsed = ptt::parse("t", &whole).unwrap();
        assert_eq!(parsed.tail, ptt::Tail::Clean);
        let pf: Vec<(u16, &[u8])> = parsed.frames.iter().map(|f| (f.ty, f.payload)).collect();
        let snap = crate::snapshot::SnapshotRecord::decode(pf[0].1).unwrap();
        assert_eq!(pf[0].0, RecordType::Snapshot as u16);
        assert_eq!(snap, rec.record);
        assert_eq!(
            (snap.number, snap.kind, snap.windows, snap.pt_bytes),
            (6, crate::snapshot::TriggerKind::Kill as u32, 3, 80)
        );
        assert_eq!((snap.discarded_windows, snap.discarded_pt_bytes), (7, 330));
        assert_eq!(snap.trigger, KILL_TRIGGER);
        let got: Vec<(Window, Vec<u8>, Vec<u8>)> = pf[1..]
            .iter()
            .map(|(ty, p)| {
                assert_eq!(*ty, RecordType::Window as u16);
                let w = decode_window(p).unwrap();
                (w.window, w.pt.to_vec(), w.sideband.to_vec())
            })
            .collect();
        let mut qw = q;
        qw.index = 35;
        qw.flags = ptt::WF_RECOVERED | ptt::WF_PT_DROPPED;
        assert_eq!(
            got,
            vec![
                // The sideband carried: the file's, then the dropped windows'.
                (ws[3], vec![3; 40], b"OLDSB1".to_vec()),
                (ws[4], vec![4; 40], vec![]),
                (qw, vec![], vec![]),
            ]
        );
        // Everything written already and nothing queued: nothing to recover.
        assert!(recover(&ring, Some(34), &[], 6).is_none());
    }
}
