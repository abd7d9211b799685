//! Snapshot (flight-recorder) mode on the shim's side (semantics in
//! [`crate::format::snapshot`]): the writer's per-thread rings and firings
//! ([`ring`]: entry points `init`, `push`, `cut`, `poll`, `end_drain`, `thread_end` from
//! the writer), the handler's side ([`request`]: `fire_if_trigger`, `flush_for_exit`,
//! `await_thread_event` from the SIGSYS handler and the patched sites), the rings'
//! SIGKILL-proof copy ([`file`]) and each thread's overwrite-mode event on Intel PT hardware
//! ([`hw`]). Async-signal-safety is stated per module.

pub mod file;
pub mod hw;
pub mod request;
pub mod ring;
