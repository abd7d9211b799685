//! Opening the containers a trace comes in, one function per container: raw PT, perf
//! AUXTRACE records, DynamoRIO's `<tid>.raw.pt`, and a `pttrace run` thread file with its
//! process info file. Each gives the bytes, the windows to decode in them, the trace
//! parameters the container carries, and what was damaged in it (decoding goes on with
//! what precedes the damage; the caller decides whether that is acceptable).

use std::ops::Range;
use std::path::{Path, PathBuf};

use pttrace_format::ptt::{
    self, ThreadHeader, WF_CAPTURE_ERROR, WF_PT_ABSENT, WF_PT_DROPPED, WF_PT_LOST, WF_SIDEBAND_LOST,
};
use pttrace_format::spool::Recovered;
use pttrace_format::{auxtrace, pdb};

use super::config::TraceParams;
use super::ptt_input::{self, PttProcess};
use super::DecodeError;

/// One unit of decoding in an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputWindow {
    /// What to call it in records and messages.
    pub name: String,
    /// Its PT bytes in [`Input::data`].
    pub pt: Range<usize>,
    /// Its id (a `WindowId` record), when the container numbers windows.
    pub id: Option<u64>,
    pub cpu: Option<u32>,
    /// File offset of its first PT byte (gap offsets become file offsets).
    pub base_offset: u64,
    /// Its own sideband records in [`Input::data`] (pttrace thread files).
    pub sideband: Option<Range<usize>>,
    /// Capture-side loss reported for it (a `LostData` gap).
    pub lost: Option<String>,
}

/// A damaged place in an input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDamage {
    pub file: String,
    pub offset: u64,
    pub what: String,
}

impl InputDamage {
    pub fn at(file: impl Into<String>, offset: u64, what: impl Into<String>) -> Self {
        InputDamage {
            file: file.into(),
            offset,
            what: what.into(),
        }
    }
}

/// An opened input.
#[derive(Debug, Clone, Default)]
pub struct Input {
    pub data: Vec<u8>,
    pub windows: Vec<InputWindow>,
    /// The parameters the container carries (default when none).
    pub params: TraceParams,
    /// The process info of a thread file.
    pub process: Option<PttProcess>,
    /// What the thread file's spool gave (see `pttrace_format::spool`).
    pub recovered: Option<Recovered>,
    pub damage: Vec<InputDamage>,
    /// Things the user should know that are not damage (a missing info file...).
    pub warnings: Vec<String>,
    /// (pid, tid) of a thread file's thread, from its header.
    pub thread: Option<(i32, i32)>,
}

fn read(path: &Path) -> Result<Vec<u8>, DecodeError> {
    std::fs::read(path).map_err(|e| DecodeError::whole(path.display(), format!("cannot read: {e}")))
}

/// Raw PT packets: one window, the whole file.
pub fn open_raw(path: &Path) -> Result<Input, DecodeError> {
    let data = read(path)?;
    let w = InputWindow {
        name: path.display().to_string(),
        pt: 0..data.len(),
        id: None,
        cpu: None,
        base_offset: 0,
        sideband: None,
        lost: None,
    };
    Ok(Input {
        data,
        windows: vec![w],
        ..Default::default()
    })
}

/// PT in perf `PERF_RECORD_AUXTRACE` records (a bare stream or perf.data), unwrapped into
/// one window; the records before a damaged one are kept.
pub fn open_auxtrace(path: &Path) -> Result<Input, DecodeError> {
    let raw = read(path)?;
    let name = path.display().to_string();
    let (a, damage) = auxtrace::unwrap_prefix(&raw);
    if a.chunks.is_empty() {
        return Err(match damage {
            Some(e) => DecodeError::new(&name, e.offset, e.message),
            None => DecodeError::new(&name, 0, "no PERF_RECORD_AUXTRACE records"),
        });
    }
    let w = InputWindow {
        name: format!("{name} (PT unwrapped from AUXTRACE records)"),
        pt: 0..a.pt.len(),
        id: None,
        cpu: a.cpu(),
        base_offset: 0,
        sideband: None,
        lost: None,
    };
    Ok(Input {
        windows: vec![w],
        damage: damage
            .map(|e| InputDamage::at(name, e.offset, e.message))
            .into_iter()
            .collect(),
        data: a.pt,
        ..Default::default()
    })
}

/// DynamoRIO's per-thread kernel file (`<tid>.raw.pt`): a window per syscall PDB, the
/// parameters from its `pt_metadata`; the PDBs before a damaged one are kept.
pub fn open_dr_raw(path: &Path) -> Result<Input, DecodeError> {
    let data = read(path)?;
    let name = path.display().to_string();
    let (f, damage) =
        pdb::parse_prefix(&data).map_err(|e| DecodeError::new(&name, e.offset, e.message))?;
    let windows = f
        .windows
        .iter()
        .enumerate()
        .map(|(k, w)| InputWindow {
            name: format!("{name} (syscall #{} sysnum {})", w.syscall_idx, w.sysnum),
            pt: w.pt.clone(),
            id: Some(k as u64),
            cpu: None,
            base_offset: 0,
            sideband: None,
            lost: None,
        })
        .collect();
    Ok(Input {
        windows,
        params: TraceParams::from_pt_metadata(&f.metadata),
        damage: damage
            .map(|e| InputDamage::at(name, e.offset, e.message))
            .into_iter()
            .collect(),
        data,
        ..Default::default()
    })
}

/// A `pttrace run` thread file (its spool merged), with its process info file: `info`,
/// or `<pid>-<nonce>.info` beside it. An info file of another process image is an error
/// (its mappings and vDSO would decode into gaps without saying why).
pub fn open_thread_file(path: &Path, info: Option<&Path>) -> Result<Input, DecodeError> {
    let t = ptt_input::read_thread(path)?;
    let name = path.display().to_string();
    let mut input = Input {
        recovered: t.recovered,
        thread: t.header.as_ref().map(|h| (h.pid, h.tid)),
        ..Default::default()
    };
    if let Some((offset, what)) = tail_damage(&t.tail) {
        input.damage.push(InputDamage::at(&name, offset, what));
    }
    let info: Option<PathBuf> = info
        .map(Path::to_path_buf)
        .or_else(|| ptt_input::info_path_for(path));
    match info {
        Some(i) if i.exists() => {
            let p = ptt_input::read_process(&i.display().to_string(), &read(&i)?)?;
            check_identity(&i, &p, path, t.header.as_ref())?;
            input.params = p.params;
            input.process = Some(p);
        }
        Some(i) => input.warnings.push(format!(
            "{} not found: no CPU/time parameters, initial mappings or vDSO (give --info)",
            i.display()
        )),
        None => {}
    }
    let data = t.data;
    let base = data.as_ptr() as usize;
    input.windows = ptt_input::read_windows(&name, &data)?
        .iter()
        .map(|w| {
            let pt_at = w.pt.as_ptr() as usize - base;
            let sb_at = w.sideband.as_ptr() as usize - base;
            InputWindow {
                name: format!(
                    "{name} (window {}, syscall {})",
                    w.window.index, w.window.nr
                ),
                pt: pt_at..pt_at + w.pt.len(),
                id: Some(w.window.index),
                cpu: None,
                base_offset: w.pt_file_offset,
                sideband: Some(sb_at..sb_at + w.sideband.len()),
                lost: lost_text(w.window.flags),
            }
        })
        .collect();
    input.data = data;
    Ok(input)
}

/// What a damaged frame tail of a trace file means, with its offset.
pub fn tail_damage(t: &ptt::Tail) -> Option<(u64, String)> {
    match *t {
        ptt::Tail::Clean => None,
        ptt::Tail::Truncated { offset, bytes } => Some((
            offset as u64,
            format!(
                "incomplete record: the file ends {bytes} bytes into it (writer killed?); \
                 the records before it were read"
            ),
        )),
        ptt::Tail::Corrupt { offset, bytes } => Some((
            offset as u64,
            format!(
                "corrupt record (bad checksum or length): the {bytes} bytes from here were \
                 not read"
            ),
        )),
    }
}

fn check_identity(
    info: &Path,
    p: &PttProcess,
    thread: &Path,
    header: Option<&ThreadHeader>,
) -> Result<(), DecodeError> {
    let (Some((pid, nonce)), Some(h)) = (p.identity, header) else {
        return Ok(());
    };
    if (pid, nonce) == (h.pid, h.nonce) {
        return Ok(());
    }
    Err(DecodeError::whole(
        info.display(),
        format!(
            "the info file of process {pid} image {nonce:08x}, but {} was written by process \
             {} image {:08x}: give that image's info file (<pid>-<nonce>.info) with --info, \
             or leave --info out to use the one beside the thread file",
            thread.display(),
            h.pid,
            h.nonce
        ),
    ))
}

/// What a pttrace window's flags say was lost at capture time.
pub fn lost_text(flags: u32) -> Option<String> {
    let mut v = vec![];
    if flags & WF_PT_ABSENT != 0 {
        v.push("no PT captured for this window (see the thread header for why)");
    }
    if flags & WF_CAPTURE_ERROR != 0 {
        v.push("starting or stopping the capture failed for this window");
    }
    if flags & WF_PT_LOST != 0 {
        v.push("PT data lost at capture (ring overwritten or truncated)");
    }
    if flags & WF_PT_DROPPED != 0 {
        v.push("PT dropped by the shim (did not fit its buffer)");
    }
    if flags & WF_SIDEBAND_LOST != 0 {
        v.push("sideband records lost at capture");
    }
    (!v.is_empty()).then(|| v.join("; "))
}
