//! Snapshot (flight-recorder) mode on the shim's side (semantics in
//! [`crate::format::snapshot`]): the writer's per-thread rings and firings (`ring`), the
//! handler's side (`request`), the rings' SIGKILL-proof copy (`file`) and each thread's
//! overwrite-mode event on Intel PT hardware (`hw`). The rest of the shim reaches it through
//! two entry points only: [`writer_side`] (start-up, the writer thread, the drain of each
//! thread's windows) and [`handler_side`] (the SIGSYS handler, the patched syscall sites,
//! the single-step backend's window ends). Async-signal-safety is stated per module.

mod file;
mod hw;
mod request;
mod ring;

/// The entry point from the writer's side: start-up on the main thread, the writer thread's
/// polling, and the drain of each thread's windows (`super::output`).
pub mod writer_side {
    pub use super::file::remove;
    pub use super::hw::wanted as hardware_wanted;
    pub use super::request::on;
    pub use super::ring::{
        cut, cut_returned, end_drain, init, may_take, poll, push, push_plain, start_main_thread,
        thread_end,
    };
}

/// The entry point from the handler's side: the SIGSYS handler, the patched syscall sites
/// and the single-step backend's window ends. Async-signal-safe.
pub mod handler_side {
    pub use super::request::{await_thread_event, fire_if_trigger, flush_for_exit, on};
}
