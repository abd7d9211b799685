//! The C API's process-wide state: the init count, the live handles (each owned by the
//! thread that made it), the live outputs, and the clean-up of handles whose thread exits.
//!
//! Written to work the same in a normal process and under DynamoRIO's private loader:
//! plain statics with std's futex-based mutexes (no lazy statics that park threads through
//! thread-local data, no `thread_local!` with a destructor: see [`super::last_error`]).
//! A handle pointer handed to C is a registry key, never dereferenced.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::error::{Error, Result, Status};
use crate::tracer::{current_tid, Tracer};

/// A live handle's tracer; lookups clone it so no registry lock is held while tracing.
pub type SharedTracer = Arc<Mutex<Tracer>>;

struct HandleEntry {
    owner_tid: i32,
    tracer: SharedTracer,
}

static INIT_COUNT: Mutex<u64> = Mutex::new(0);
static HANDLES: Mutex<BTreeMap<usize, HandleEntry>> = Mutex::new(BTreeMap::new());
/// Outputs by the address handed to C; the box owns the C struct and its buffers.
static OUTPUTS: Mutex<BTreeMap<usize, Box<dyn Send>>> = Mutex::new(BTreeMap::new());

/// Locks `m`, also after a panic elsewhere poisoned it (the state stays consistent: every
/// update is a single insert or remove).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One more `drpttracer_init`. The first one (count 0 -> 1) runs `can_trace` and counts
/// only if it succeeds; later ones count without checking, as DynamoRIO's library does.
pub fn init(can_trace: impl FnOnce() -> Result<()>) -> Result<()> {
    let mut n = lock(&INIT_COUNT);
    if *n == 0 {
        can_trace()?;
    }
    *n += 1;
    Ok(())
}

/// One `drpttracer_exit`; the last one destroys every remaining handle and output.
pub fn exit() {
    let mut n = lock(&INIT_COUNT);
    if *n == 0 {
        return;
    }
    *n -= 1;
    if *n == 0 {
        let handles = std::mem::take(&mut *lock(&HANDLES));
        let outputs = std::mem::take(&mut *lock(&OUTPUTS));
        drop(n);
        drop(handles);
        drop(outputs);
    }
}

pub fn require_init() -> Result<()> {
    if *lock(&INIT_COUNT) == 0 {
        return Err(Error::new(
            Status::Error,
            "drpttracer is not initialized: call drpttracer_init() first (and check that it \
             returned true)",
        ));
    }
    Ok(())
}

/// Registers a tracer made by the calling thread; returns the handle for C.
pub fn insert_handle(tracer: Tracer, clean_up_at_thread_exit: bool) -> *mut c_void {
    let owner_tid = tracer.owner_tid();
    let tracer = Arc::new(Mutex::new(tracer));
    let key = Arc::as_ptr(&tracer) as usize;
    if clean_up_at_thread_exit {
        thread_exit::arm();
    }
    lock(&HANDLES).insert(key, HandleEntry { owner_tid, tracer });
    key as *mut c_void
}

/// The tracer of `handle`, which must be live and belong to the calling thread.
pub fn lookup(handle: *mut c_void, what: &str) -> Result<SharedTracer> {
    let map = lock(&HANDLES);
    entry(&map, handle, what).map(|e| e.tracer.clone())
}

/// Removes `handle` (live, the calling thread's); its tracer goes when the last lookup
/// that cloned it does.
pub fn remove_handle(handle: *mut c_void, what: &str) -> Result<()> {
    let mut map = lock(&HANDLES);
    entry(&map, handle, what)?;
    let removed = map.remove(&(handle as usize));
    drop(map);
    drop(removed);
    Ok(())
}

fn entry<'a>(
    map: &'a BTreeMap<usize, HandleEntry>,
    handle: *mut c_void,
    what: &str,
) -> Result<&'a HandleEntry> {
    if handle.is_null() {
        return Err(Error::invalid("tracer_handle is NULL"));
    }
    let Some(entry) = map.get(&(handle as usize)) else {
        return Err(Error::invalid(format!(
            "tracer_handle {handle:p} is not a live handle (never created, or already destroyed)"
        )));
    };
    let tid = current_tid();
    if entry.owner_tid != tid {
        return Err(Error::invalid(format!(
            "{what}: tracer_handle {handle:p} belongs to thread {} but was used from thread \
             {tid}; handles are per thread",
            entry.owner_tid
        )));
    }
    Ok(entry)
}

/// Registers an output under the address handed to C (`key`), owned by `owner`.
pub fn insert_output(key: usize, owner: Box<dyn Send>) {
    lock(&OUTPUTS).insert(key, owner);
}

/// Frees the output registered under `key`; false when there is none.
pub fn remove_output(key: usize) -> bool {
    let removed = lock(&OUTPUTS).remove(&key);
    removed.is_some()
}

/// Destroys every handle of thread `tid` (their tracers are dropped outside the lock).
fn remove_handles_of(tid: i32) {
    let gone: Vec<HandleEntry> = {
        let mut map = lock(&HANDLES);
        let keys: Vec<usize> = map
            .iter()
            .filter(|(_, e)| e.owner_tid == tid)
            .map(|(&k, _)| k)
            .collect();
        keys.iter().filter_map(|k| map.remove(k)).collect()
    };
    drop(gone);
}

/// Destroys a thread's handles when it exits, through a POSIX thread-specific key with a
/// destructor (not a Rust TLS destructor: see the module doc). Not armed under DynamoRIO,
/// whose threads do not exit through the private libc this library runs on there; its
/// clients destroy their handles in their thread-exit event, as with DynamoRIO's library.
mod thread_exit {
    use super::*;

    static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();

    thread_local! {
        /// This thread's key value is set (const, no destructor).
        static ARMED: Cell<bool> = const { Cell::new(false) };
    }

    pub fn arm() {
        if ARMED.try_with(Cell::get).unwrap_or(true) {
            return;
        }
        let key = KEY.get_or_init(|| {
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: `key` is a valid out pointer; the destructor is a plain C function.
            let rc = unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) };
            (rc == 0).then_some(key)
        });
        if let Some(key) = *key {
            // Any non-NULL value makes the C library call the destructor at thread exit.
            // SAFETY: `key` was created above; the value is never dereferenced.
            if unsafe { libc::pthread_setspecific(key, 1 as *const c_void) } == 0 {
                let _ = ARMED.try_with(|a| a.set(true));
            }
        }
    }

    extern "C" fn on_thread_exit(_value: *mut c_void) {
        // No panic may unwind into the C library's thread exit.
        let _ = std::panic::catch_unwind(|| remove_handles_of(current_tid()));
    }
}
