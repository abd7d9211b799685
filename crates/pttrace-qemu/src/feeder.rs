//! The vCPU side of a guest thread: QEMU's callbacks append to a log, and a worker thread
//! ([`crate::thread::run`]) encodes it, so PT encoding runs on another core while QEMU
//! emulates. The execution callback only stores the block descriptor's address, through
//! the vCPU's [`crate::cursor`] while the chunk has room; the other callbacks reach the
//! log through an [`OpenLog`], which counts the words the cursor wrote into the chunk
//! and hands the cursor back when done.
//!
//! Log entries (u64 words): a block descriptor's address (8-byte aligned, low 3 bits 0);
//! `TAG_SYSCALL, nr, a1..a6, tsc`; `TAG_RET, ret, tsc`; `TAG_SIGNAL, rip, fault`; `TAG_TSC, tsc` (at the start of each
//! chunk: the time for packets written from it); with `memory=on`, a load or store after
//! its block (`TAG_MEMORY`: its instruction's offset in the block, size, kind and address
//! in one word). A chunk holds [`CHUNK`] words; at most
//! [`CHUNKS`] are in flight per thread (the vCPU waits for the worker beyond that: memory
//! stays bounded). At every syscall return the vCPU waits until the worker has written the
//! window, so a program killed later keeps every window up to its last syscall, as
//! without the worker.
//!
//! Snapshot mode: a firing another thread or `pttrace run` publishes
//! ([`crate::Global::publish`]) is taken by each thread at a well-defined point of its
//! log. A thread executing code takes it at its next block: `TAG_SNAP, firing, tsc` goes
//! into its log before that block, and the worker cuts the window there. A thread inside a
//! syscall has handed its whole log over at the syscall's entry, so the publisher sends
//! its worker the firing directly: the snapshot ends at that syscall. Which of the two
//! applies is decided under the thread's [`Share`] lock, which the vCPU takes at each
//! syscall entry and return.

use std::ops::{Deref, DerefMut};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use std::sync::atomic::Ordering;

use pttrace_format::ptt::EndReason;

use crate::log::{
    block_all_signals, lock, restore_signals, Firing, Msg, Share, ShareState, CHUNK, CHUNKS,
    TAG_MEMORY, TAG_MEMORY_WIDE, TAG_RET, TAG_SIGNAL, TAG_SNAP, TAG_SYSCALL, TAG_TSC,
};
use crate::thread::Thread;
use crate::{cursor, rdtsc, say, Global};

/// Room a multi-word entry needs (a chunk never splits one).
const LONGEST_ENTRY: usize = 9;

/// `memory=on`: what QEMU's memory-access descriptions say, direct-mapped by a hash of the
/// description. Each entry: [`MEMINFO_VALID`], the description, what it says (8 bits).
pub struct MemInfos([u64; MEMINFO_SLOTS]);

impl Default for MemInfos {
    fn default() -> Self {
        MemInfos([0; MEMINFO_SLOTS])
    }
}

impl MemInfos {
    /// What `info` says, asking `ask` when it is not in the table.
    #[inline(always)]
    pub fn get(&mut self, info: u32, ask: fn(u32) -> u8) -> u8 {
        // Fibonacci hashing: the top bits of the product depend on every bit of `info`.
        let home = (info.wrapping_mul(0x9e37_79b9) >> (32 - MEMINFO_BITS)) as usize;
        let key = MEMINFO_VALID | u64::from(info) << 8;
        match self.0.get(home) {
            Some(&e) if e & !0xff == key => e as u8,
            _ => self.probe(home, key, info, ask),
        }
    }

    /// [`MemInfos::get`] of a description not in its home entry: linear probing over a
    /// few entries (the table never empties, so the first empty entry ends the search).
    #[cold]
    #[inline(never)]
    fn probe(&mut self, home: usize, key: u64, info: u32, ask: fn(u32) -> u8) -> u8 {
        for k in 0..MEMINFO_PROBES {
            let Some(slot) = self.0.get_mut((home + k) % MEMINFO_SLOTS) else {
                break;
            };
            if *slot & !0xff == key {
                return *slot as u8;
            }
            if *slot == 0 {
                let v = ask(info);
                *slot = key | u64::from(v);
                return v;
            }
        }
        // Every probed entry holds another description: this one takes its home entry.
        let v = ask(info);
        if let Some(slot) = self.0.get_mut(home) {
            *slot = key | u64::from(v);
        }
        v
    }
}

/// The one-word log entry of a load or store by the instruction at `offset` in the last
/// block (`kind`: as [`Feeder::meminfo`] gives it), when its offset and address fit one.
#[inline(always)]
pub fn memory_word(offset: u64, addr: u64, kind: u8) -> Option<u64> {
    narrow_memory_word(offset, u64::from(kind & 0xf) << 12, addr)
}

/// The one-word log entry of a load or store ([`TAG_MEMORY`]; `kind` already at bit 12),
/// when its offset and address fit one.
#[inline(always)]
fn narrow_memory_word(offset: u64, kind: u64, addr: u64) -> Option<u64> {
    ((addr >> 48 | offset >> 9) == 0).then_some(TAG_MEMORY | offset << 3 | kind | addr << 16)
}

/// `memory=on`: log2 of the entries of a vCPU's table of memory-access descriptions.
const MEMINFO_BITS: u32 = 6;
const MEMINFO_SLOTS: usize = 1 << MEMINFO_BITS;
/// Entries looked at for a description before it displaces another.
const MEMINFO_PROBES: usize = 8;
/// In a [`Feeder::meminfo`] entry: filled (above the description's 32 bits, which sit
/// above the 8 bits of what it says).
const MEMINFO_VALID: u64 = 1 << 40;

/// A vCPU's end of its worker.
pub struct Feeder {
    buf: Vec<u64>,
    tx: Sender<Msg>,
    free: Receiver<Vec<u64>>,
    pub tid: i32,
    pub pid: i32,
    /// The last syscall entered (number, arguments, TSC): a fork child's first window.
    pub last_syscall: Option<(u64, [u64; 6], u64)>,
    /// `Thread::uid` of the worker (its entry in `Global::workers`).
    uid: u64,
    finished: bool,
    dead: bool,
    /// Snapshot mode: the share with the publishers, and `Global::published` when last
    /// looked at.
    share: Option<Share>,
    pub seen: u64,
    /// `memory=on`: QEMU's memory-access descriptions seen, with what they say (size shift
    /// and store bit, as [`Feeder::memory`] takes them). A program uses a dozen or so,
    /// and asking QEMU twice per access cost more than the rest of recording it; the
    /// 4-entry table this replaces missed on a third of the accesses of a python loop.
    meminfo: MemInfos,
    /// The vCPU's index (its [`crate::cursor`]).
    vcpu: usize,
}

/// A vCPU's log open outside the block fast path: the words the vCPU's cursor wrote are
/// in the chunk, and the cursor goes on after what is logged here once this is dropped.
pub struct OpenLog<'a>(&'a mut Feeder);

impl<'a> OpenLog<'a> {
    pub fn new(f: &'a mut Feeder) -> OpenLog<'a> {
        f.take_cursor();
        OpenLog(f)
    }
}

impl Deref for OpenLog<'_> {
    type Target = Feeder;
    fn deref(&self) -> &Feeder {
        self.0
    }
}

impl DerefMut for OpenLog<'_> {
    fn deref_mut(&mut self) -> &mut Feeder {
        self.0
    }
}

impl Drop for OpenLog<'_> {
    fn drop(&mut self) {
        self.0.give_cursor();
    }
}

impl Feeder {
    /// Starts the worker of `t` (created on the thread of vCPU `vcpu`).
    pub fn start(t: Thread, vcpu: usize) -> Feeder {
        let (tx, rx) = mpsc::channel();
        let (free_tx, free) = mpsc::channel();
        for _ in 1..CHUNKS {
            let _ = free_tx.send(Vec::with_capacity(CHUNK));
        }
        let (tid, pid, uid) = (t.tid, t.pid, t.uid);
        // The worker must never take a signal: QEMU's host handlers expect a vCPU thread (a
        // process-directed SIGALRM delivered to the worker would crash QEMU). A new thread
        // starts with its creator's mask: block everything around the spawn.
        let old = block_all_signals();
        let spawned = std::thread::Builder::new()
            .name(format!("pttrace-{tid}"))
            .spawn(move || crate::thread::run(t, rx, free_tx));
        restore_signals(&old);
        let dead = match spawned {
            Ok(_) => false,
            Err(e) => {
                say(&format!(
                    "cannot start the encoder thread of {tid}: {e}; it is not traced"
                ));
                true
            }
        };
        let mut share = None;
        let mut seen = 0;
        if let Some(g) = crate::global().filter(|g| g.cfg.publishes()) {
            // Firings published before the thread existed are not its own.
            let mut w = g.workers.lock().unwrap_or_else(|e| e.into_inner());
            seen = g.published.load(Ordering::SeqCst);
            if !dead {
                let s: Share = Arc::new(Mutex::new(ShareState {
                    in_syscall: false,
                    taken: seen,
                }));
                w.push(crate::Worker {
                    uid,
                    tx: tx.clone(),
                    share: Arc::clone(&s),
                });
                share = Some(s);
            }
        }
        let mut f = Feeder {
            buf: Vec::with_capacity(CHUNK),
            tx,
            free,
            tid,
            pid,
            last_syscall: None,
            uid,
            finished: false,
            dead,
            share,
            seen,
            meminfo: MemInfos::default(),
            vcpu,
        };
        f.buf.push(TAG_TSC);
        f.buf.push(rdtsc());
        f
    }

    /// The words the vCPU's cursor wrote are the chunk's; the cursor refuses writes until
    /// [`Self::give_cursor`].
    pub fn take_cursor(&mut self) {
        let len = cursor::taken(
            self.vcpu,
            self.buf.as_ptr(),
            self.buf.len(),
            self.buf.capacity(),
        );
        cursor::reset(self.vcpu);
        // SAFETY: `taken` counts the words written through the cursor right after the
        // chunk's `len` (initialized u64s), within its capacity.
        unsafe { self.buf.set_len(len) };
    }

    /// The vCPU's cursor writes after the chunk's words, up to its room (none when a
    /// firing waits to be taken or the log is finished).
    pub fn give_cursor(&mut self) {
        if self.finished {
            return;
        }
        let end = self.buf.capacity().min(CHUNK);
        let seen = self.seen;
        cursor::hand_back(
            self.vcpu,
            self.buf.as_mut_ptr(),
            self.buf.len(),
            end,
            || crate::global().is_some_and(|g| g.published.load(Ordering::SeqCst) != seen),
        );
    }

    /// One executed block (the slow path: [`crate::cursor::write`] comes first).
    #[inline(always)]
    pub fn block(&mut self, addr: u64) {
        if self.has_room() {
            self.buf.push(addr);
        } else {
            self.block_slow(addr);
        }
    }

    /// [`Feeder::block`] when the chunk is full.
    #[cold]
    #[inline(never)]
    fn block_slow(&mut self, addr: u64) {
        if self.buf.len() >= CHUNK {
            self.flush();
        }
        self.buf.push(addr);
    }

    /// What QEMU's memory-access description `info` says (`ask` asks QEMU): the size
    /// shift in bits 0-2 and the store bit in bit 3.
    #[inline(always)]
    pub fn meminfo(&mut self, info: u32, ask: fn(u32) -> u8) -> u8 {
        self.meminfo.get(info, ask)
    }

    /// A load or store of the last block's instruction at `offset` from its start
    /// (`memory=on`): one word (two for an offset of 512 or more or an address of 48 bits
    /// or more). `kind`: as [`Feeder::meminfo`] gives it.
    #[inline(always)]
    pub fn memory(&mut self, offset: u64, addr: u64, kind: u8) {
        let kind = u64::from(kind & 0xf) << 12;
        match narrow_memory_word(offset, kind, addr) {
            Some(w) if self.has_room() => self.buf.push(w),
            _ => self.memory_slow(offset, kind, addr),
        }
    }

    /// The chunk has room for a word, its capacity checked too so that a push after it
    /// needs no growing path (a chunk has CHUNK words of room).
    #[inline(always)]
    fn has_room(&self) -> bool {
        self.buf.len() < self.buf.capacity().min(CHUNK)
    }

    /// [`Feeder::memory`] when the chunk is full, or the offset or the address wide.
    #[cold]
    #[inline(never)]
    fn memory_slow(&mut self, offset: u64, kind: u64, addr: u64) {
        if self.buf.len() + 2 > CHUNK {
            self.flush();
        }
        match narrow_memory_word(offset, kind, addr) {
            Some(w) => self.buf.push(w),
            None => {
                self.buf.push(TAG_MEMORY_WIDE | kind | offset << 16);
                self.buf.push(addr);
            }
        }
    }

    /// The next block enters a signal handler, interrupting the thread at `rip` (`fault`:
    /// by a synchronous fault there, if known; `fault_signal`: the signal is one faults
    /// raise, SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGTRAP).
    pub fn interrupted(&mut self, rip: u64, fault: Option<bool>, fault_signal: bool) {
        self.room();
        self.buf.push(TAG_SIGNAL);
        self.buf.push(rip);
        self.buf.push(match (fault, fault_signal) {
            (Some(false), _) => 0,
            (Some(true), _) => 1,
            (None, false) => 2,
            (None, true) => 3,
        });
    }

    fn room(&mut self) {
        if self.buf.len() + LONGEST_ENTRY > CHUNK {
            self.flush();
        }
    }

    pub fn syscall(&mut self, nr: u64, args: [u64; 6]) {
        self.room();
        let tsc = rdtsc();
        self.buf.push(TAG_SYSCALL);
        self.buf.push(nr);
        self.buf.extend_from_slice(&args);
        self.buf.push(tsc);
        self.last_syscall = Some((nr, args, tsc));
        if self.share.is_some() {
            self.enter_syscall();
        }
    }

    /// Snapshot mode, at a syscall's entry: the log goes to the worker, then the thread
    /// counts as inside the syscall (firings published from now on are sent to the worker
    /// directly); firings published before and not taken yet are sent now.
    #[cold]
    #[inline(never)]
    fn enter_syscall(&mut self) {
        self.flush();
        let (Some(share), Some(g)) = (self.share.as_ref(), crate::global()) else {
            return;
        };
        if self.dead {
            return;
        }
        let mut st = lock(share);
        st.in_syscall = true;
        if g.published.load(Ordering::SeqCst) > st.taken {
            for f in g.claim(&mut st, self.uid) {
                let _ = self.tx.send(Msg::Snapshot(f));
            }
        }
    }

    /// Snapshot mode: firings published since [`Self::seen`] are taken here, before the
    /// next block (the vCPU is executing code).
    #[cold]
    #[inline(never)]
    pub fn take_firings(&mut self, g: &Global) {
        self.seen = g.published.load(Ordering::SeqCst);
        let Some(share) = self.share.as_ref() else {
            return;
        };
        if self.dead {
            return;
        }
        let taken = {
            let mut st = lock(share);
            // Executing code: not inside a syscall (even if its return was not seen).
            st.in_syscall = false;
            g.claim(&mut st, self.uid)
        };
        if taken.is_empty() {
            return;
        }
        self.log_firings(taken);
        self.flush();
    }

    fn log_firings(&mut self, taken: Vec<Arc<Firing>>) {
        for f in taken {
            if self.buf.len() + 3 > CHUNK {
                self.flush();
            }
            self.buf.push(TAG_SNAP);
            self.buf.push(Arc::into_raw(f) as u64);
            self.buf.push(rdtsc());
        }
    }

    /// Syscall return: the window is written before the guest goes on.
    pub fn ret(&mut self, ret: i64) {
        if let Some(s) = self.share.as_ref() {
            lock(s).in_syscall = false;
        }
        self.room();
        self.buf.push(TAG_RET);
        self.buf.push(ret as u64);
        self.buf.push(rdtsc());
        self.sync();
    }

    /// Hands the current chunk to the worker and takes a free one (waiting for the worker
    /// when every chunk is in flight).
    #[cold]
    #[inline(never)]
    fn flush(&mut self) {
        if self.dead {
            self.buf.clear();
            return;
        }
        let next = match self.free.recv() {
            Ok(v) => v,
            Err(_) => {
                self.dead = true;
                Vec::with_capacity(CHUNK)
            }
        };
        // (The cursor's stores are plain ones: the channel's send orders them before the
        // chunk reaches the worker.)
        let full = std::mem::replace(&mut self.buf, next);
        if self.tx.send(Msg::Chunk(full)).is_err() {
            self.dead = true;
        }
        self.buf.push(TAG_TSC);
        self.buf.push(rdtsc());
    }

    /// Waits until the worker has processed everything logged so far.
    pub fn sync(&mut self) {
        self.request(Msg::Sync);
    }

    /// Ends the thread's files (`reason`) once everything logged is encoded; waits for it.
    pub fn finish(&mut self, reason: EndReason) {
        if self.finished {
            return;
        }
        self.finished = true;
        if let (Some(g), Some(share)) = (crate::global(), self.share.as_ref()) {
            // Firings published before the thread left the list are still its own.
            let taken = {
                let mut w = g.workers.lock().unwrap_or_else(|e| e.into_inner());
                w.retain(|x| x.uid != self.uid);
                let mut st = lock(share);
                g.claim(&mut st, self.uid)
            };
            if !self.dead {
                self.log_firings(taken);
            }
        }
        self.request(|ack| Msg::Finish(reason, ack));
    }

    /// Hands over the log, sends the message `make` builds and waits for its answer.
    fn request(&mut self, make: impl FnOnce(SyncSender<()>) -> Msg) {
        self.flush();
        if self.dead {
            return;
        }
        let (ack_tx, ack) = mpsc::sync_channel(1);
        if self.tx.send(make(ack_tx)).is_ok() {
            let _ = ack.recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MemInfos;

    /// QEMU 7.2's descriptions (`rw << 16 | memop << 4 | mmu_idx`, user mode's mmu index)
    /// for every size, signed or not, load or store, little- or big-endian: each is asked
    /// for once however they interleave, and what each says is the asked value.
    #[test]
    fn each_description_is_asked_for_once() {
        let mut infos = Vec::new();
        for rw in [1u32, 2] {
            for memop in 0u32..16 {
                infos.push(rw << 16 | memop << 4 | 1);
            }
        }
        fn say(info: u32) -> u8 {
            (info >> 4 & 7) as u8 | u8::from(info >> 16 == 2) << 3
        }
        let mut table = MemInfos::default();
        thread_local! {
            static ASKED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        fn ask(info: u32) -> u8 {
            ASKED.with(|a| a.borrow_mut().push(info));
            say(info)
        }
        for round in 0..50 {
            for (k, &info) in infos.iter().enumerate() {
                // A different order each round.
                let info = if round % 2 == 0 {
                    info
                } else {
                    infos[(k * 7 + round) % infos.len()]
                };
                let v = table.get(info, ask);
                assert_eq!(v, say(info), "{info:#x}");
            }
        }
        let mut asked = ASKED.with(|a| a.take());
        asked.sort_unstable();
        let mut all = infos.clone();
        all.sort_unstable();
        assert_eq!(asked, all, "each description asked for exactly once");
    }
}
