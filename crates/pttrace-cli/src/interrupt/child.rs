//! Runs in `pttrace run`'s program between fork and exec, so it is async-signal-safe: no
//! allocation, no locks, no std I/O; `sigemptyset` and `pthread_sigmask` only.
//!
//! std's spawn leaves the child the signal mask of the thread that spawns it, and `pttrace
//! run` blocks the signals its own threads take ([`super::start`], snapshot triggers): the
//! program must start with none blocked, as it would without pttrace.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes `cmd`'s process start with an empty signal mask.
pub fn unblock_signals(cmd: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // sigemptyset and pthread_sigmask (async-signal-safe) on a set on its own stack.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            // (An error number, not a message: nothing is allocated here.)
            match libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) {
                0 => Ok(()),
                e => Err(std::io::Error::from_raw_os_error(e)),
            }
        });
    }
}
