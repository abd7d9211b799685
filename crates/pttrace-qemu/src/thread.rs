//! The worker side of a guest thread: its block-level PT encoder, its windows and files.
//! Each guest thread's vCPU hands its executed block sequence and syscall events to its own
//! worker thread ([`crate::feeder`]), which runs [`run`]: encoding happens on another core
//! while QEMU emulates.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use pttrace_encoder::{FlowEncoder, PSB_PERIOD};
use pttrace_format::code::{push_code_record, SampleId};
use pttrace_format::ptt::{self, EndReason, FileKind, RecordType, Window};
use pttrace_format::snapshot::{Trigger, TriggerKind};

use crate::files::TraceFile;
use crate::log::{
    Firing, Msg, TAG_MEMORY, TAG_MEMORY_WIDE, TAG_RET, TAG_SIGNAL, TAG_SNAP, TAG_SYSCALL, TAG_TSC,
};
use crate::memory::ThreadMemory;
use crate::{gettid, rdtsc, say, BlockInfo, Global, QEMU_ESIGRETURN};

/// Window metadata carried with the PT until the window is final.
pub struct WinMeta {
    w: Window,
    pub sideband: Vec<u8>,
}

/// A thread's ring of its last windows (shared with the shim's single-step backend).
pub type Ring = pttrace_format::snapshot_ring::Ring<WinMeta>;

impl pttrace_format::snapshot_ring::RingWindow for WinMeta {
    fn sideband_mut(&mut self) -> &mut Vec<u8> {
        &mut self.sideband
    }
}

/// One guest thread's encoder and files; owned by its worker thread.
pub struct Thread {
    /// Unique per thread state of this process image (never 0).
    pub uid: u64,
    pub tid: i32,
    pub pid: i32,
    file: Option<TraceFile>,
    path: PathBuf,
    enc: FlowEncoder<'static, WinMeta>,
    /// Bit per block id: its code is in this thread's file already.
    sent: Vec<u64>,
    sideband: Vec<u8>,
    index: u64,
    win_tsc: u64,
    in_syscall: Option<WinMeta>,
    /// The oracle file and its pending bytes (tests: the executed block sequence).
    oracle: Option<(TraceFile, Vec<u8>)>,
    written: u64,
    failed: bool,
    /// PT bytes per window before a cut.
    cut: usize,
    /// Latest TSC the vCPU reported (timestamps of packets written now).
    last_tsc: u64,
    /// `Global::handlers_gen` last copied into the encoder.
    handlers_gen: u64,
    /// Snapshot mode: the last windows, written when a trigger fires.
    ring: Option<Ring>,
    /// A `syscall:` trigger (its index) fires once the window ending at it is final.
    syscall_trigger: Option<u32>,
    /// A snapshot ended the window of the syscall in flight (its return ends nothing).
    cut_syscall: bool,
    /// `memory=on`: the thread's loads and stores.
    memory: Option<ThreadMemory>,
}

impl Thread {
    /// The state of the calling (vCPU) thread: its file with its header.
    pub fn new(g: &Global) -> Thread {
        let tid = gettid();
        let pid = g.pid.load(Ordering::Relaxed);
        let nonce = g.nonce.load(Ordering::Relaxed);
        let path = g.cfg.out.join(format!("{pid}-{nonce:08x}-{tid}.ptt"));
        let tsc = rdtsc();
        let file = TraceFile::create(&path).and_then(|mut f| {
            f.append(&[&ptt::encode_header(FileKind::Thread)])?;
            let h = ptt::ThreadHeader {
                pid,
                tid,
                mode: 0,
                window: 1,
                backend: ptt::BACKEND_QEMU,
                pt_present: true,
                nonce,
                start_tsc: g.start_tsc.load(Ordering::Relaxed),
                pt_absent_reason: String::new(),
            };
            f.frame(RecordType::ThreadHeader, &ptt::thread_header_payload(&h))?;
            Ok(f)
        });
        let (file, failed) = match file {
            Ok(f) => {
                g.thread_files.fetch_add(1, Ordering::Release);
                (Some(f), false)
            }
            Err(e) => {
                say(&format!("cannot create {}: {e}", path.display()));
                (None, true)
            }
        };
        let oracle = if g.cfg.oracle {
            TraceFile::create(&path.with_extension("oracle"))
                .ok()
                .map(|f| (f, Vec::with_capacity(1 << 16)))
        } else {
            None
        };
        Thread {
            uid: g.next_uid.fetch_add(1, Ordering::Relaxed),
            tid,
            pid,
            file,
            path,
            enc: FlowEncoder::new(PSB_PERIOD),
            sent: Vec::new(),
            sideband: Vec::new(),
            index: 0,
            win_tsc: tsc,
            last_tsc: tsc,
            cut: g.cfg.cut,
            handlers_gen: 0,
            in_syscall: None,
            oracle,
            written: 0,
            failed,
            ring: g.cfg.snapshot.map(Ring::new),
            syscall_trigger: None,
            cut_syscall: false,
            memory: g.cfg.memory.then(ThreadMemory::default),
        }
    }

    /// `memory=on`: the window's loads and stores go into its sideband (it ends).
    fn end_memory(&mut self) {
        if let Some(m) = self.memory.as_mut() {
            m.end_window(&mut self.sideband);
        }
    }

    fn sample(&self) -> SampleId {
        SampleId {
            pid: self.pid as u32,
            tid: self.tid as u32,
            time: self.last_tsc,
            cpu: 0,
            id: 0,
        }
    }

    /// The block's code is in this thread's file from now on; true when it was not yet.
    /// (`owner` remembers the last thread that claimed it: a thread that finds itself
    /// there needs no look-up in its own set.)
    #[cold]
    #[inline(never)]
    fn claim(&mut self, b: &BlockInfo) -> bool {
        b.owner.store(self.uid, Ordering::Relaxed);
        self.first_time(b.id)
    }

    #[cold]
    #[inline(never)]
    fn syscall_without_return(&mut self) {
        if let Some(mut meta) = self.in_syscall.take() {
            // The syscall did not return through QEMU's syscall-return hook.
            meta.w.flags |= ptt::WF_NO_RETURN;
            if meta.w.nr == libc::SYS_rt_sigreturn as u64 {
                self.enc.sigreturned();
            }
            self.enc.end_window(meta);
            self.drain();
            self.fire_syscall_trigger();
        }
    }

    /// A block this thread executes for the first time: its code goes into the window's
    /// sideband; code that replaces other code executed before cuts the window first.
    #[cold]
    #[inline(never)]
    fn first_execution(&mut self, b: &'static BlockInfo, tsc: &mut dyn FnMut() -> u64) {
        let cut_first = b.replaces && self.enc.in_window();
        if self.enc.block(&b.block, tsc).is_err() {
            return;
        }
        if cut_first {
            // New code at addresses executed before: only the next window sees it.
            self.cut(tsc);
        }
        let s = self.sample();
        if push_code_record(&mut self.sideband, b.block.start, &b.code, &s).is_none() {
            say("block larger than a code record; its code is missing from the trace");
        }
    }

    #[cold]
    #[inline(never)]
    fn record_oracle(&mut self, b: &BlockInfo, first: bool) {
        let Some((f, o)) = self.oracle.as_mut() else {
            return;
        };
        if first {
            o.extend_from_slice(&((1u64 << 63) | b.lens.len() as u64).to_le_bytes());
            let mut ip = b.block.start;
            for l in b.lens.iter() {
                o.extend_from_slice(&ip.to_le_bytes());
                ip += u64::from(*l);
            }
        }
        o.extend_from_slice(&b.block.start.to_le_bytes());
        if o.len() >= 1 << 16 {
            let _ = f.append(&[o]);
            o.clear();
        }
    }

    /// Ends the window between two blocks (PT size reached, or code replaced).
    #[cold]
    #[inline(never)]
    fn cut(&mut self, tsc: &mut dyn FnMut() -> u64) {
        let meta = self.no_syscall_meta();
        let _ = self.enc.cut(meta, tsc);
        self.drain();
    }

    /// Marks block `id` as sent; true when it was not yet.
    #[inline]
    fn first_time(&mut self, id: u32) -> bool {
        let (w, bit) = ((id >> 6) as usize, 1u64 << (id & 63));
        match self.sent.get_mut(w) {
            Some(word) if *word & bit != 0 => false,
            Some(word) => {
                *word |= bit;
                true
            }
            None => self.grow_sent(w, bit),
        }
    }

    #[cold]
    #[inline(never)]
    fn grow_sent(&mut self, w: usize, bit: u64) -> bool {
        self.sent.resize(w + 1024, 0);
        self.sent[w] |= bit;
        true
    }

    fn no_syscall_meta(&mut self) -> WinMeta {
        let w = Window {
            index: self.index,
            nr: u64::MAX,
            tsc_start: self.win_tsc,
            tsc_end: self.last_tsc,
            flags: ptt::WF_NO_SYSCALL,
            ..Window::default()
        };
        self.index += 1;
        self.win_tsc = w.tsc_end;
        self.end_memory();
        WinMeta {
            w,
            sideband: std::mem::take(&mut self.sideband),
        }
    }

    /// Writes every window whose PT is final (into the ring in snapshot mode).
    fn drain(&mut self) {
        while let Some(w) = self.enc.ready_window() {
            let mut meta = w.meta;
            if w.overflows > 0 {
                meta.w.flags |= ptt::WF_PT_OVERFLOW;
            }
            self.emit(meta, w.pt);
        }
    }

    /// A final window: written, or kept in the ring.
    fn emit(&mut self, meta: WinMeta, pt: Vec<u8>) {
        match self.ring.as_mut() {
            Some(r) => {
                let enc = &mut self.enc;
                r.push(meta, pt, |b| enc.recycle(b));
            }
            None => {
                self.write_window(&meta, &pt);
                self.enc.recycle(pt);
            }
        }
    }

    /// Snapshot mode: writes the ring as snapshot `f` (a `Snapshot` record, then its
    /// windows, the first carrying the code of the windows dropped before it) and empties
    /// it; tracing goes on.
    fn write_snapshot(&mut self, f: &Firing) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let taken = ring.take();
        let rec = taken.record(
            f.number,
            f.kind as u32,
            f.tid,
            self.last_tsc,
            f.text.clone(),
        );
        if let (Some(file), false) = (self.file.as_mut(), self.failed) {
            if let Err(e) = file.frame(RecordType::Snapshot, &rec.payload()) {
                self.failed = true;
                say(&format!(
                    "writing {} failed at snapshot {}: {e}",
                    self.path.display(),
                    f.number
                ));
            }
        }
        for (meta, pt) in taken.windows {
            self.write_window(&meta, &pt);
            self.enc.recycle(pt);
        }
    }

    /// A trigger fired in this thread: a new snapshot number, a note, this thread's ring
    /// written and every other thread told.
    fn fire(&mut self, kind: TriggerKind, text: String) {
        let Some(g) = crate::global() else { return };
        let f = g.publish(kind, self.tid, text, self.uid);
        self.write_snapshot(&f);
        f.done(g);
    }

    /// Another thread's firing or a request, taken where the vCPU met it (see
    /// [`crate::feeder`]): everything logged before is encoded; the window in flight ends
    /// here (`WF_SNAPSHOT_CUT`: at the syscall the thread is in, or between the last block
    /// and the next), then the ring is written.
    fn take_request(&mut self, f: &Firing) {
        if self.ring.is_some() {
            if let Some(mut meta) = self.in_syscall.take() {
                // Inside a syscall: its window is final but for the return value.
                meta.w.flags |= ptt::WF_SNAPSHOT_CUT;
                self.enc.end_window(meta);
                self.cut_syscall = true;
                self.drain();
            } else if self.enc.in_window() {
                let mut meta = self.no_syscall_meta();
                meta.w.flags |= ptt::WF_SNAPSHOT_CUT;
                let last = self.last_tsc;
                let _ = self.enc.cut(meta, &mut move || last);
                self.drain();
            }
            self.write_snapshot(f);
        }
        if let Some(g) = crate::global() {
            f.done(g);
        }
    }

    /// The `addr:` trigger `idx` at `addr` in the block just encoded: the window ends at
    /// `addr` (the instruction there not executed yet) and the snapshot is taken.
    #[cold]
    #[inline(never)]
    fn fire_addr(&mut self, addr: u64, idx: u32, tsc: &mut dyn FnMut() -> u64) {
        if self.ring.is_none() {
            return;
        }
        let meta = self.no_syscall_meta();
        let _ = self.enc.cut_at(addr, meta, tsc);
        self.drain();
        let what = crate::global()
            .and_then(|g| g.cfg.triggers.get(idx as usize))
            .map_or_else(|| "addr".to_string(), Trigger::describe);
        self.fire(TriggerKind::Addr, format!("{what} ({addr:#x})"));
    }

    fn fire_syscall_trigger(&mut self) {
        let Some(idx) = self.syscall_trigger.take() else {
            return;
        };
        let what = crate::global()
            .and_then(|g| g.cfg.triggers.get(idx as usize))
            .map_or_else(|| "syscall".to_string(), Trigger::describe);
        self.fire(TriggerKind::Syscall, what);
    }

    /// Appends one `Window` frame, written in place from the PT and sideband buffers.
    pub fn write_window(&mut self, meta: &WinMeta, pt: &[u8]) {
        if self.failed {
            return;
        }
        let Some(f) = self.file.as_mut() else {
            return;
        };
        let Some((head, crc)) = ptt::window_frame_parts(&meta.w, pt, &meta.sideband) else {
            say(&format!(
                "{}: window {} is too large for one record; dropped",
                self.path.display(),
                meta.w.index
            ));
            return;
        };
        let parts: [&[u8]; 4] = [&head, pt, &meta.sideband, &crc];
        match f.append(&parts) {
            Ok(()) => self.written += 1,
            Err(e) => {
                // `append` cut the partial frame off: what is written stays whole.
                self.failed = true;
                say(&format!(
                    "writing {} failed at window {}: {e}; the {} windows before it are kept, later ones are lost",
                    self.path.display(),
                    meta.w.index,
                    self.written
                ));
            }
        }
    }

    /// Ends the thread's file (`reason`); the thread makes no more windows.
    pub fn finish(&mut self, reason: EndReason) {
        if let Some(mut meta) = self.in_syscall.take() {
            meta.w.flags |= ptt::WF_NO_RETURN;
            self.enc.end_window(meta);
        } else if self.enc.in_window() {
            let _ = self.enc.far_transfer();
            let meta = self.no_syscall_meta();
            self.enc.end_window(meta);
        }
        self.enc.finish();
        self.drain();
        self.fire_syscall_trigger();
        let st = self.enc.stats();
        if st.unresolved > 0 {
            if let Some(g) = crate::global() {
                // Why this thread's OVF packets were written (the info file's notes).
                g.note(&format!(
                    "thread {}: {} signal deliveries written as overflows (OVF): the \
                     interrupted instruction stayed unknown, as neither the signal frame nor \
                     the flow after the handler told it; {} of them may have been faults \
                     inside a block with several instructions that can fault, the others came \
                     after a branch whose way the handler never returned to",
                    self.tid, st.unresolved, st.unresolved_faults
                ));
            }
        }
        if let Some(g) = crate::global() {
            if g.cfg.has_trigger(|t| *t == Trigger::Exit) {
                let (number, text) = if reason == EndReason::ThreadExit {
                    let n = g.next_snapshot();
                    g.note(&format!(
                        "snapshot {n}: trigger exit fired (thread {} ended)",
                        self.tid
                    ));
                    (n, "exit (thread exit)".to_string())
                } else {
                    (
                        g.exit_snapshot(self.tid),
                        format!("exit ({})", reason.name()),
                    )
                };
                self.write_snapshot(&Firing::own(number, TriggerKind::Exit, self.tid, text));
            }
        }
        if let Some(f) = self.file.as_mut() {
            if !self.failed {
                let payload = ptt::end_payload(reason, self.written, 0);
                let _ = f.frame(RecordType::End, &payload);
            }
        }
        self.file = None;
        if let Some((mut f, pending)) = self.oracle.take() {
            let _ = f.append(&[&pending]);
        }
    }

    /// Processes one chunk of the vCPU's log (see [`crate::feeder`] for its entries).
    fn consume(&mut self, words: &[u64]) {
        if let Some(g) = crate::global() {
            let gen = g.handlers_gen.load(Ordering::Acquire);
            if gen != self.handlers_gen {
                self.handlers_gen = gen;
                self.enc.set_signal_handlers(&g.signal_handlers());
                self.enc.set_fault_handlers(&g.fault_handlers());
            }
        }
        let mut i = 0;
        while let Some(&w) = words.get(i) {
            if let Some(b) = block_of(w) {
                if self.memory.is_none() && self.in_syscall.is_none() {
                    let n = self.plain_blocks(words.get(i..).unwrap_or(&[]));
                    if n > 0 {
                        i += n;
                        continue;
                    }
                    // (This block is not one for the hot path.)
                }
                if let Some(m) = self.memory.as_mut() {
                    m.block(b);
                }
                self.on_block(b);
                i += 1;
                continue;
            }
            if w & 7 >= TAG_MEMORY {
                let (offset, addr) = if w & 7 == TAG_MEMORY_WIDE {
                    let Some(&a) = words.get(i + 1) else {
                        return;
                    };
                    i += 1;
                    (w >> 16, a)
                } else {
                    ((w >> 3) & 0x1ff, w >> 16)
                };
                i += 1;
                if let Some(m) = self.memory.as_mut() {
                    m.access(offset, (w >> 12) & 0xf, addr, &mut self.sideband);
                }
                continue;
            }
            match w {
                TAG_SYSCALL => {
                    let Some(e) = words.get(i + 1..i + 9) else {
                        return;
                    };
                    self.on_syscall(e[0], [e[1], e[2], e[3], e[4], e[5], e[6]], e[7]);
                    i += 9;
                }
                TAG_RET => {
                    let Some(e) = words.get(i + 1..i + 3) else {
                        return;
                    };
                    self.on_ret(e[0] as i64, e[1]);
                    i += 3;
                }
                TAG_SNAP => {
                    let Some(e) = words.get(i + 1..i + 3) else {
                        return;
                    };
                    // SAFETY: the vCPU logged this word from Arc::into_raw of a Firing,
                    // and each logged word is consumed exactly once.
                    let f = unsafe { Arc::from_raw(e[0] as *const Firing) };
                    self.last_tsc = e[1];
                    self.take_request(&f);
                    i += 3;
                }
                TAG_SIGNAL => {
                    let Some(e) = words.get(i + 1..i + 3) else {
                        return;
                    };
                    let fault = match e[1] {
                        0 => Some(false),
                        1 => Some(true),
                        _ => None,
                    };
                    if let Some(m) = self.memory.as_mut() {
                        // A signal faults raise, the frame not saying whether it was
                        // raised so: taken as a fault (see ThreadMemory::signal).
                        m.signal(e[0], fault, e[1] == 3);
                    }
                    self.enc.signal_entry(e[0], fault);
                    i += 3;
                }
                TAG_TSC => {
                    if let Some(&t) = words.get(i + 1) {
                        self.last_tsc = t;
                    }
                    i += 2;
                }
                _ => return,
            }
        }
    }

    /// The hot path of [`Self::consume`] (no memory accesses or syscall in flight: the
    /// caller checks): the block words at the start of `words` whose blocks have their
    /// code in this thread's file already and hold no trigger, as many as
    /// [`FlowEncoder::plain_run`] takes, each handled as [`Self::on_block`] would. Returns
    /// how many words it took; the word it stopped at needs [`Self::on_block`] (or is a
    /// tag).
    fn plain_blocks(&mut self, words: &[u64]) -> usize {
        let (uid, cut, tsc) = (self.uid, self.cut, self.last_tsc);
        let block = |k: usize| words.get(k).and_then(|&w| block_of(w));
        let (n, r) = self.enc.plain_run(
            |k| {
                block(k)
                    .filter(|b| b.owner.load(Ordering::Relaxed) == uid && b.trigger.is_none())
                    .map(|b| &b.block)
            },
            tsc,
            cut,
        );
        if self.oracle.is_some() {
            // (Every block taken: another thread may have claimed one since.)
            for k in 0..n {
                if let Some(b) = block(k) {
                    self.record_oracle(b, false);
                }
            }
        }
        if r.is_err() {
            // (As `on_block`: the block it failed on is done with.)
            return n + 1;
        }
        if self.enc.window_len() > cut {
            self.cut(&mut move || tsc);
        }
        n
    }

    /// One executed block.
    #[inline]
    fn on_block(&mut self, b: &'static BlockInfo) {
        if self.in_syscall.is_some() {
            self.syscall_without_return();
        }
        let last = self.last_tsc;
        let mut tsc = move || last;
        // Fast path: the block was last claimed by this thread, so its code is in the file.
        let first = b.owner.load(Ordering::Relaxed) != self.uid && self.claim(b);
        if first {
            self.first_execution(b, &mut tsc);
        } else if self.enc.block(&b.block, &mut tsc).is_err() {
            return;
        }
        if self.oracle.is_some() {
            self.record_oracle(b, first);
        }
        if let Some((addr, idx)) = b.trigger {
            self.fire_addr(addr, idx, &mut tsc);
        }
        if self.enc.window_len() > self.cut {
            // (This block goes into the next window, and so do its loads and stores,
            // which come after it in the log.)
            self.cut(&mut tsc);
        }
    }

    /// Syscall entry: the window in flight ends (TIP.PGD); it is written at the return.
    fn on_syscall(&mut self, nr: u64, args: [u64; 6], tsc: u64) {
        self.cut_syscall = false;
        if let Some(mut meta) = self.in_syscall.take() {
            meta.w.flags |= ptt::WF_NO_RETURN;
            self.enc.end_window(meta);
        }
        let _ = self.enc.far_transfer();
        self.last_tsc = tsc;
        self.end_memory();
        let meta = WinMeta {
            w: Window {
                index: self.index,
                nr,
                args,
                ret: 0,
                tsc_start: self.win_tsc,
                tsc_end: tsc,
                flags: 0,
                depth: 0,
            },
            sideband: std::mem::take(&mut self.sideband),
        };
        self.index += 1;
        self.in_syscall = Some(meta);
        if self.ring.is_some() {
            if let Some(g) = crate::global() {
                self.syscall_trigger = g
                    .cfg
                    .triggers
                    .iter()
                    .position(|t| *t == Trigger::Syscall(nr))
                    .map(|i| i as u32);
            }
        }
    }

    /// Syscall return: the window is complete.
    fn on_ret(&mut self, ret: i64, tsc: u64) {
        let Some(mut meta) = self.in_syscall.take() else {
            if std::mem::take(&mut self.cut_syscall) {
                // Its window went into a snapshot: the next one starts after the return.
                if ret == QEMU_ESIGRETURN {
                    self.enc.sigreturned();
                }
                self.win_tsc = tsc;
                self.last_tsc = tsc;
                self.fire_syscall_trigger();
            }
            return;
        };
        meta.w.ret = ret;
        if ret == QEMU_ESIGRETURN {
            meta.w.flags |= ptt::WF_NO_RETURN;
            self.enc.sigreturned();
        }
        self.enc.end_window(meta);
        self.drain();
        self.win_tsc = tsc;
        self.last_tsc = tsc;
        self.fire_syscall_trigger();
    }

    /// The child's side of a fork, as the first window of the child's new file: the
    /// syscall with return value 0 and no PT (the parent's file has that code).
    pub fn write_fork_child_window(&mut self, nr: u64, args: [u64; 6], tsc: u64) {
        let meta = WinMeta {
            w: Window {
                index: 0,
                nr,
                args,
                ret: 0,
                tsc_start: tsc,
                tsc_end: tsc,
                flags: ptt::WF_FORK_CHILD,
                depth: 0,
            },
            sideband: Vec::new(),
        };
        self.index = 1;
        self.emit(meta, Vec::new());
        self.win_tsc = rdtsc();
    }
}

/// The block descriptor a log word names, when it is one (an untagged word).
#[inline(always)]
fn block_of(w: u64) -> Option<&'static BlockInfo> {
    if w & 7 != 0 {
        return None;
    }
    // SAFETY: untagged entries are pointers to leaked, never freed BlockInfo.
    Some(unsafe { &*(w as *const BlockInfo) })
}

/// The worker loop: encodes the chunks of its vCPU's log in order, answers syncs, and ends
/// the files on `Finish`. Used chunks go back to the vCPU through `free`.
pub fn run(mut t: Thread, rx: Receiver<Msg>, free: Sender<Vec<u64>>) {
    while let Ok(m) = rx.recv() {
        match m {
            Msg::Chunk(mut v) => {
                t.consume(&v);
                v.clear();
                let _ = free.send(v);
            }
            Msg::Sync(ack) => {
                let _ = ack.send(());
            }
            Msg::Snapshot(f) => t.take_request(&f),
            Msg::Finish(reason, ack) => {
                t.finish(reason);
                let _ = ack.send(());
                return;
            }
        }
    }
}
