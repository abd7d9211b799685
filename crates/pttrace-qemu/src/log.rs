//! What a guest thread's vCPU hands its worker ([`crate::feeder`] to [`crate::thread`]):
//! the log's words and tags, the messages, the snapshot firings they carry, and the state a
//! vCPU shares with the threads that publish firings ([`crate::snapshot`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard};

use pttrace_format::ptt::EndReason;
use pttrace_format::snapshot::TriggerKind;

use crate::Global;

pub const TAG_SYSCALL: u64 = 1;
pub const TAG_RET: u64 = 2;
pub const TAG_TSC: u64 = 3;
/// `TAG_SNAP, Arc<Firing> (raw), tsc`: take the firing here.
pub const TAG_SNAP: u64 = 4;
/// `TAG_SIGNAL, rip, fault`: the next block is a signal handler's entry, interrupting
/// the thread at `rip` (`fault`: 1 a synchronous fault of the instruction there, 0 an
/// asynchronous signal, 2 not known).
pub const TAG_SIGNAL: u64 = 5;
/// `TAG_MEMORY | offset << 3 | log2 size << 12 | store << 15 | address << 16`: a load or
/// store of the instruction at `offset` (< 512) from the start of the block logged last
/// (`memory=on`; tells itself from the exact tags and block addresses by its low 3 bits).
pub const TAG_MEMORY: u64 = 6;
/// `TAG_MEMORY_WIDE | log2 size << 12 | store << 15 | offset << 16, address`: the same for
/// an offset of 512 or more or an address of 48 bits or more.
pub const TAG_MEMORY_WIDE: u64 = 7;
/// Words per chunk (512 KiB).
pub const CHUNK: usize = 1 << 16;
/// Chunks per thread.
pub const CHUNKS: usize = 4;

pub fn block_all_signals() -> libc::sigset_t {
    // SAFETY: sigfillset/pthread_sigmask write into the sets we pass.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

pub fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: `old` is the mask pthread_sigmask returned.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// What the vCPU sends its worker.
pub enum Msg {
    Chunk(Vec<u64>),
    /// Answered once everything sent before is processed.
    Sync(SyncSender<()>),
    /// End the thread's files, then answer and stop.
    Finish(EndReason, SyncSender<()>),
    /// Snapshot mode: a trigger fired (in another thread, or a request): write the ring.
    Snapshot(Arc<Firing>),
}

/// Snapshot mode: what a vCPU shares with the publishers of firings.
#[derive(Default)]
pub struct ShareState {
    /// The vCPU is inside a syscall, its log up to the syscall's entry handed over.
    pub in_syscall: bool,
    /// The last firing number this thread has taken (or was not meant for it).
    pub taken: u64,
}

pub type Share = Arc<Mutex<ShareState>>;

/// Locks a share (a poisoned lock still holds consistent state: two plain fields).
pub fn lock(s: &Share) -> MutexGuard<'_, ShareState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// One firing, as every worker of the process gets it.
#[derive(Debug)]
pub struct Firing {
    pub number: u64,
    pub kind: TriggerKind,
    /// Thread where it fired (0: a request from `pttrace run`).
    pub tid: i32,
    pub text: String,
    /// `Thread::uid` of the thread where it fired (it writes its own ring at once; 0: none).
    pub except: u64,
    /// Threads that have still to write it, of `threads`.
    remaining: AtomicUsize,
    threads: usize,
}

impl Firing {
    /// A firing of one thread only (`exit`), never published.
    pub fn own(number: u64, kind: TriggerKind, tid: i32, text: String) -> Firing {
        Firing {
            number,
            kind,
            tid,
            text,
            except: 0,
            remaining: AtomicUsize::new(0),
            threads: 1,
        }
    }

    /// A firing published to every thread of the process image but `except`.
    pub fn published(
        number: u64,
        kind: TriggerKind,
        tid: i32,
        text: String,
        except: u64,
        threads: usize,
    ) -> Firing {
        Firing {
            number,
            kind,
            tid,
            text,
            except,
            remaining: AtomicUsize::new(threads),
            threads,
        }
    }

    /// A thread has written its ring for this firing; the last one notes that the
    /// snapshot is complete.
    pub fn done(&self, g: &Global) {
        let before = self
            .remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if before == Ok(1) {
            g.note(&complete_note(self.number, self.threads));
        }
    }
}

pub fn complete_note(number: u64, threads: usize) -> String {
    let s = if threads == 1 { "" } else { "s" };
    format!("snapshot {number}: complete, written by {threads} thread{s}")
}
