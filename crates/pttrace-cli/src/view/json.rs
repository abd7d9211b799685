//! `timeline.json`: Chrome Trace Event JSON, written as the spans are read.

use std::io::{BufWriter, Write};
use std::path::Path;

use super::{
    pids, process_name, thread_track_names, window_name, Axis, Event, ThreadView, Ts, Who,
    WINDOW_TRACK,
};

/// `timeline.json`: Chrome Trace Event JSON.
pub(super) struct Json {
    pub(super) w: BufWriter<crate::outfile::OutFile>,
    pub(super) n: u64,
    /// Each name id's JSON string, once written.
    pub(super) escaped: Vec<Option<Box<[u8]>>>,
}

impl Json {
    pub(super) fn emit(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        if self.n > 0 {
            self.w.write_all(b",\n")?;
        }
        self.n += 1;
        serde_json::to_writer(&mut self.w, e).map_err(std::io::Error::other)
    }

    /// The file's start; process names (the command lines of the images a pid ran, in
    /// order) and thread names (the commands a thread ran), with its windows' track.
    pub(super) fn start(&mut self, views: &[Who]) -> std::io::Result<()> {
        self.w.write_all(b"{\"traceEvents\":[\n")?;
        for pid in pids(views) {
            let name = process_name(views, pid);
            let mut e = Event::new("process_name", "M", pid, None);
            e.args = Some(serde_json::json!({ "name": name }));
            self.emit(&e)?;
        }
        let mut sort_index = 0u64;
        let mut named: Vec<(i32, i32)> = Vec::new();
        for v in views {
            let tid = i64::from(v.tid);
            if named.contains(&(v.pid, v.tid)) {
                continue;
            }
            named.push((v.pid, v.tid));
            let (thread, windows) = thread_track_names(views, v);
            let tracks = [(tid, thread), (WINDOW_TRACK + tid, windows)];
            for (t, name) in tracks {
                let mut e = Event::new("thread_name", "M", v.pid, Some(t));
                e.args = Some(serde_json::json!({ "name": name }));
                self.emit(&e)?;
                let mut e = Event::new("thread_sort_index", "M", v.pid, Some(t));
                e.args = Some(serde_json::json!({ "sort_index": sort_index }));
                sort_index += 1;
                self.emit(&e)?;
            }
        }
        Ok(())
    }

    /// A call: a complete (`X`) event. How an unusual span began or ended goes into its
    /// categories, not its args: speedscope names a frame by its name and args together,
    /// so args would split one function into several in its Left Heavy and Sandwich views.
    /// (Written by hand, as serde would write an [`Event`]: a call costs a fraction of the
    /// time; names are escaped once, the category and the thread's ids come written.)
    pub(super) fn call(
        &mut self,
        (id, name): (u32, &str),
        category: &JsonText,
        ts: Ts,
        dur: Ts,
        thread: &JsonText,
    ) -> std::io::Result<()> {
        if self.n > 0 {
            self.w.write_all(b",\n")?;
        }
        self.n += 1;
        let k = id as usize;
        if self.escaped.len() <= k {
            self.escaped.resize(k + 1, None);
        }
        if self.escaped.get(k).is_some_and(Option::is_none) {
            let e = serde_json::to_vec(name).map_err(std::io::Error::other)?;
            if let Some(slot) = self.escaped.get_mut(k) {
                *slot = Some(e.into_boxed_slice());
            }
        }
        let w = &mut self.w;
        w.write_all(b"{\"name\":")?;
        if let Some(Some(e)) = self.escaped.get(k) {
            w.write_all(e)?;
        }
        w.write_all(b",\"cat\":")?;
        w.write_all(category.0.as_bytes())?;
        w.write_all(b",\"ph\":\"X\",\"ts\":")?;
        let mut num = itoa::Buffer::new();
        for (k, t) in [ts, dur].into_iter().enumerate() {
            if k == 1 {
                w.write_all(b",\"dur\":")?;
            }
            match t {
                Ts::I(i) => w.write_all(num.format(i).as_bytes())?,
                Ts::F(f) => serde_json::to_writer(&mut *w, &f).map_err(std::io::Error::other)?,
            }
        }
        w.write_all(thread.0.as_bytes())
    }

    pub(super) fn windows_and_gaps(
        &mut self,
        v: &ThreadView,
        tid: i64,
        axis: &Axis,
    ) -> std::io::Result<()> {
        let axis_of = |v: &ThreadView, s: u64, e: u64| axis.place(&v.clock, s, e);
        for (win, start, end) in &v.windows {
            let name = window_name(win);
            let (ts, dur) = axis_of(v, *start, *end);
            let mut e = Event::new(&name, "X", v.who.pid, Some(WINDOW_TRACK + tid));
            e.cat = Some("syscall");
            e.ts = Some(ts);
            e.dur = Some(dur);
            e.args = Some(serde_json::json!({
                "window": win.index,
                "nr": win.nr,
                "ret": win.ret,
                "flags": win.flag_names().join(","),
                "instructions": end - start,
            }));
            self.emit(&e)?;
        }
        for m in &v.markers {
            let (ts, _) = axis_of(v, m.at, m.at);
            let mut e = Event::new("gap", "i", v.who.pid, Some(tid));
            e.cat = Some("gap");
            e.ts = Some(ts);
            e.s = Some("t");
            e.args = Some(serde_json::json!({ "what": m.what }));
            self.emit(&e)?;
        }
        Ok(())
    }

    pub(super) fn finish(
        mut self,
        views: &[ThreadView],
        axis: &Axis,
        (trace, part): (&Path, &str),
        merged: u64,
        merge_below: u64,
    ) -> std::io::Result<()> {
        let insns: u64 = views.iter().map(|v| v.instructions).sum();
        let (unit, axis_name, note) = match axis {
            Axis::Instructions { why } => (
                None,
                "instructions",
                format!(
                    "{why}: ts and dur count instructions (1 unit = 1 instruction), each \
                     thread from 0 (a thread continues its count across execve)"
                ),
            ),
            Axis::Nanoseconds { .. } => (
                Some("ns"),
                "ns",
                "TSC converted to nanoseconds with the trace's time conversion, from the \
                 first timestamp, interpolated by instruction between timestamps"
                    .to_string(),
            ),
        };
        let mut tail = serde_json::json!({
            "otherData": {
                "time_axis": axis_name,
                "time_axis_note": note,
                "trace": trace.display().to_string(),
                "part": part,
                "instructions": insns,
                "tool": "pttrace view",
                "merged_calls": merged,
                "merged_below_instructions": merge_below,
                "merged_note": if merged == 0 {
                    "every call is in this file".to_string()
                } else {
                    format!(
                        "{merged} calls shorter than {merge_below} instructions are merged \
                         into their callers (their time counts in the caller's span) to keep \
                         this file within --limit; timeline.pftrace and `pttrace view --full` \
                         have every call"
                    )
                },
            }
        });
        if let (Some(u), Some(o)) = (unit, tail.as_object_mut()) {
            o.insert("displayTimeUnit".into(), u.into());
        }
        self.w.write_all(b"\n]")?;
        if let Some(o) = tail.as_object() {
            for (k, v) in o {
                self.w.write_all(b",")?;
                serde_json::to_writer(&mut self.w, k).map_err(std::io::Error::other)?;
                self.w.write_all(b":")?;
                serde_json::to_writer(&mut self.w, v).map_err(std::io::Error::other)?;
            }
        }
        self.w.write_all(b"}\n")?;
        crate::outfile::commit_buffered(self.w)
    }
}

/// Text already written as JSON, for [`Json::call`]: a category (a string) or a call's
/// tail with the thread's ids ([`JsonText::thread`]).
pub(super) struct JsonText(String);

impl JsonText {
    /// `s` as a JSON string.
    pub(super) fn string(s: &str) -> std::io::Result<JsonText> {
        serde_json::to_string(s)
            .map(JsonText)
            .map_err(std::io::Error::other)
    }

    /// The end of a call of thread `tid` of process `pid`: its ids, then `}`.
    pub(super) fn thread(pid: i32, tid: i64) -> JsonText {
        JsonText(format!(",\"pid\":{pid},\"tid\":{tid}}}"))
    }
}
