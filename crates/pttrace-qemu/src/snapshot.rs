//! Snapshot (flight-recorder) mode in the plugin (semantics in
//! [`pttrace_format::snapshot`]): per thread a [`Ring`] (`pttrace_format::snapshot_ring`) of finished windows holding about
//! the last `snapshot=` bytes of PT, written into the thread's file when a trigger fires.
//!
//! - `addr:` triggers are resolved at the first translated block (the guest's executable
//!   is mapped by then); a block containing such an address carries it
//!   ([`crate::BlockInfo::trigger`]), and the worker cuts the window at the address and
//!   fires ([`crate::thread::Thread`]).
//! - `syscall:` triggers fire in the worker once the window ending at that syscall is final.
//! - `signal:` requests come from `pttrace run` through the trace directory's request file,
//!   polled by a watcher thread of each process image ([`start_watcher`]).
//! - `exit` fires in each thread's worker when the thread ends.
//!
//! A firing gets the next number of the process image ([`crate::Global::next_snapshot`]);
//! the worker where it fired writes its ring at once and every other thread takes it at a
//! well-defined point of its log ([`Global::publish`], [`crate::feeder`]): its snapshot
//! ends there, the last window flagged `WF_SNAPSHOT_CUT`. When every thread has written
//! it, a `snapshot N: complete` note goes into the info file.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pttrace_format::snapshot::{
    elf_address, AddrSpec, ElfAddr, ElfAddrError, Trigger, TriggerKind, REQUEST_POLL_MS,
};

use crate::log::{
    block_all_signals, complete_note, lock, restore_signals, Firing, Msg, ShareState,
};
use crate::{say, Global};

/// Firings kept for threads that have not taken them yet.
const KEPT_FIRINGS: usize = 256;

/// Where `addr:` triggers point in this process: (run-time address, trigger index).
pub fn resolve_addresses(g: &Global) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let needs_bias = g.cfg.triggers.iter().any(|t| {
        matches!(
            t,
            Trigger::Addr {
                pie_base: Some(_),
                ..
            }
        )
    });
    let exe_start = if needs_bias { exe_first_page() } else { None };
    for (i, t) in g.cfg.triggers.iter().enumerate() {
        let Trigger::Addr {
            value, pie_base, ..
        } = t
        else {
            continue;
        };
        let a = ElfAddr {
            value: *value,
            pie_base: *pie_base,
            loaded: true,
        };
        let at = pttrace_format::snapshot::runtime_address(&a, exe_start);
        match at {
            Some(a) => {
                g.note(&format!(
                    "snapshot trigger {} is address {a:#x}",
                    t.describe()
                ));
                out.push((a, i as u32));
            }
            None => {
                let msg = format!(
                    "snapshot trigger {}: the executable's mapping was not found; it never fires",
                    t.describe()
                );
                say(&msg);
                g.note(&msg);
            }
        }
    }
    out
}

/// Resolves the `addr:SYMBOL` triggers carried from the image before an exec in this
/// image's executable (its ELF `.symtab`/`.dynsym`, like `pttrace run` does for the first
/// one) into `cfg.triggers`; returns the notes saying what became of each.
pub fn resolve_carried(cfg: &mut crate::Config) -> Vec<String> {
    if cfg.addr_symbols.is_empty() || cfg.snapshot.is_none() {
        return Vec::new();
    }
    let (_, exe) = crate::guest_cmdline();
    let data = std::fs::read(&exe);
    let mut notes = Vec::new();
    for name in &cfg.addr_symbols {
        let found = data.as_ref().map_err(|e| e.to_string()).and_then(|d| {
            elf_address(d, &AddrSpec::Symbol(name.clone())).map_err(|e| match e {
                ElfAddrError::NotElf(e) => format!("not an ELF file ({e})"),
                ElfAddrError::NotX86_64 => "not an x86-64 ELF file".to_string(),
                ElfAddrError::NoSymbol => format!("no symbol {name:?} defined (.symtab/.dynsym)"),
            })
        });
        match found {
            Ok(ElfAddr {
                value, pie_base, ..
            }) => {
                notes.push(format!(
                    "snapshot trigger addr:{name} carried into this image: symbol of {exe} at \
                     {value:#x}"
                ));
                cfg.triggers.push(Trigger::Addr {
                    value,
                    pie_base,
                    label: name.clone(),
                });
            }
            Err(why) => notes.push(format!(
                "snapshot trigger addr:{name} (carried from the image before exec) does not \
                 fire in this image: {exe}: {why}"
            )),
        }
    }
    notes
}

/// Where the guest executable's first page (file offset 0) is mapped.
fn exe_first_page() -> Option<u64> {
    let (_, exe) = crate::guest_cmdline();
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    pttrace_format::snapshot::exe_first_page(&maps, Path::new(&exe))
}

impl Global {
    /// The next snapshot number of this process image.
    pub fn next_snapshot(&self) -> u64 {
        self.snapshot_no.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The number of the process-wide `exit` snapshot (one for every thread ending with
    /// the process); the first caller also notes it in the info file.
    pub fn exit_snapshot(&self, tid: i32) -> u64 {
        let mut n = self.exit_no.load(Ordering::Acquire);
        if n == 0 {
            let mine = self.next_snapshot();
            n = match self
                .exit_no
                .compare_exchange(0, mine, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.note(&format!(
                        "snapshot {mine}: trigger exit fired (process end, first in thread {tid})"
                    ));
                    mine
                }
                Err(other) => other,
            };
        }
        n
    }

    /// Publishes a firing (`tid`, `except`: where it fired, see [`Firing`]) with the next
    /// number, noting `note` (after `snapshot N: `) in the info file. Every thread listed
    /// in `workers` but `except` takes it at a well-defined point ([`crate::feeder`]):
    /// threads inside a syscall now (their worker gets it), the others at their next
    /// block or syscall.
    pub fn publish(&self, kind: TriggerKind, tid: i32, text: String, except: u64) -> Arc<Firing> {
        // The workers' list is held throughout: a thread that starts or ends meanwhile
        // either counts and takes the firing, or neither.
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let others = workers.iter().filter(|w| w.uid != except).count();
        let threads = others + usize::from(except != 0);
        let f = {
            let mut list = self.firings.lock().unwrap_or_else(|e| e.into_inner());
            let number = self.next_snapshot();
            let where_ = if tid > 0 {
                format!(" in thread {tid}")
            } else {
                String::new()
            };
            self.note(&format!(
                "snapshot {}: trigger {} fired{where_}",
                number, text
            ));
            let f = Arc::new(Firing::published(number, kind, tid, text, except, threads));
            list.push(Arc::clone(&f));
            if list.len() > KEPT_FIRINGS {
                list.remove(0);
            }
            self.published.store(number, Ordering::SeqCst);
            // (Each vCPU executing code takes it at its next block, on the slow path.)
            crate::cursor::refuse_all();
            f
        };
        if threads == 0 {
            self.note(&complete_note(f.number, 0));
        }
        for w in workers.iter().filter(|w| w.uid != except) {
            let mut st = lock(&w.share);
            if st.in_syscall {
                for x in self.claim(&mut st, w.uid) {
                    let _ = w.tx.send(Msg::Snapshot(x));
                }
            }
        }
        f
    }

    /// The firings published and not yet taken by thread `uid` (those not meant for it
    /// skipped); all count as taken from now on. Called with the thread's share locked.
    pub fn claim(&self, st: &mut ShareState, uid: u64) -> Vec<Arc<Firing>> {
        let list = self.firings.lock().unwrap_or_else(|e| e.into_inner());
        let out = list
            .iter()
            .filter(|f| f.number > st.taken && f.except != uid)
            .cloned()
            .collect();
        if let Some(last) = list.last() {
            st.taken = st.taken.max(last.number);
        }
        out
    }

    /// A firing that is not any thread's own (a request from `pttrace run`).
    fn fire_request(&self, sig: i32) {
        let t = Trigger::Signal(sig);
        let text = format!("{} (sent to pttrace run)", t.describe());
        self.publish(TriggerKind::Signal, 0, text, 0);
    }
}

/// Starts the thread that polls the request file (signal triggers), with every signal
/// blocked (QEMU's host handlers expect vCPU threads). Requests already in the file when
/// the process image started (an exec) or before its fork (inherited `request_seen`) are
/// not taken again.
pub fn start_watcher(g: &'static Global) {
    let Some(path) = g.cfg.request.clone() else {
        return;
    };
    let signals: Vec<i32> = g
        .cfg
        .triggers
        .iter()
        .filter_map(|t| match t {
            Trigger::Signal(s) => Some(*s),
            _ => None,
        })
        .collect();
    if signals.is_empty() {
        return;
    }
    let old = block_all_signals();
    let r = std::thread::Builder::new()
        .name("pttrace-snap".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(REQUEST_POLL_MS));
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            let seen = g.request_seen.load(Ordering::Relaxed);
            if len <= seen {
                continue;
            }
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            let Some(new) = data.get(seen as usize..) else {
                continue;
            };
            // Whole lines only: a line being appended is taken at the next poll.
            let Some(end) = new.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            g.request_seen
                .store(seen + end as u64 + 1, Ordering::Relaxed);
            for line in new[..end].split(|b| *b == b'\n') {
                // `signal <number>`: fire for the triggers asked for.
                let sig = std::str::from_utf8(line)
                    .ok()
                    .and_then(|l| l.strip_prefix("signal "))
                    .and_then(|n| n.trim().parse::<i32>().ok());
                if let Some(s) = sig.filter(|s| signals.contains(s)) {
                    g.fire_request(s);
                }
            }
        });
    restore_signals(&old);
    if let Err(e) = r {
        say(&format!(
            "cannot start the snapshot request watcher: {e}; signal triggers will not fire"
        ));
    }
}

/// Length of the request file now (requests before this are not for this image).
pub fn request_file_len(g: &Global) -> u64 {
    g.cfg
        .request
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len())
}
