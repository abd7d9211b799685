//! `profile.speedscope.json`: speedscope's own format, written as the spans are read.

use std::io::{BufWriter, Write};

use super::frames::Names;
use super::{thread_track_names, Who};

/// `profile.speedscope.json`: speedscope's own format (a shared frame table, one evented
/// profile per thread image: open/close events), with the axis unit speedscope shows
/// ("none" for instructions, where the Chrome JSON gets "ms"), the calls of the JSON
/// timeline.
pub(super) struct Speedscope {
    pub(super) w: BufWriter<crate::outfile::OutFile>,
    pub(super) unit: &'static str,
    /// Frame index + 1 of each name id (0: none yet).
    pub(super) frames: Vec<usize>,
    pub(super) order: Vec<u32>,
    /// No event written yet in the profile being written.
    pub(super) first: bool,
}

impl Speedscope {
    pub(super) fn start(&mut self) -> std::io::Result<()> {
        write!(
            self.w,
            "{{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\
             \"exporter\":\"pttrace view\",\"profiles\":["
        )
    }

    pub(super) fn profile_start(
        &mut self,
        k: usize,
        views: &[Who],
        v: &Who,
        t0: u64,
        end: u64,
    ) -> std::io::Result<()> {
        if k > 0 {
            self.w.write_all(b",")?;
        }
        let (name, _) = thread_track_names(views, v);
        write!(self.w, "{{\"type\":\"evented\",\"name\":")?;
        serde_json::to_writer(&mut self.w, &name).map_err(std::io::Error::other)?;
        write!(
            self.w,
            ",\"unit\":\"{}\",\"startValue\":{t0},\"endValue\":{},\"events\":[",
            self.unit,
            end.max(t0)
        )?;
        self.first = true;
        Ok(())
    }

    pub(super) fn edge(&mut self, name: u32, open: bool, at: u64) -> std::io::Result<()> {
        let k = name as usize;
        if self.frames.len() <= k {
            self.frames.resize(k + 1, 0);
        }
        let frame = match self.frames.get(k).copied().unwrap_or(0) {
            0 => {
                self.order.push(name);
                if let Some(f) = self.frames.get_mut(k) {
                    *f = self.order.len();
                }
                self.order.len() - 1
            }
            f => f - 1,
        };
        if !std::mem::take(&mut self.first) {
            self.w.write_all(b",")?;
        }
        let ty: &[u8] = if open {
            b"{\"type\":\"O\",\"frame\":"
        } else {
            b"{\"type\":\"C\",\"frame\":"
        };
        let mut num = itoa::Buffer::new();
        self.w.write_all(ty)?;
        self.w.write_all(num.format(frame).as_bytes())?;
        self.w.write_all(b",\"at\":")?;
        self.w.write_all(num.format(at).as_bytes())?;
        self.w.write_all(b"}")
    }

    pub(super) fn profile_end(&mut self) -> std::io::Result<()> {
        self.w.write_all(b"]}")
    }

    pub(super) fn finish(mut self, names: &Names) -> std::io::Result<()> {
        self.w.write_all(b"],\"shared\":{\"frames\":[")?;
        for (k, &name) in self.order.iter().enumerate() {
            if k > 0 {
                self.w.write_all(b",")?;
            }
            self.w.write_all(b"{\"name\":")?;
            serde_json::to_writer(&mut self.w, names.get(name)).map_err(std::io::Error::other)?;
            self.w.write_all(b"}")?;
        }
        self.w.write_all(b"]}}\n")?;
        crate::outfile::commit_buffered(self.w)
    }
}
