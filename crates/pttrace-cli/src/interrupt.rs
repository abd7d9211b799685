//! The signals that stop a command line (SIGINT, SIGQUIT, SIGTERM, SIGHUP) while `pttrace
//! run`'s program runs. `pttrace run` does not die of them: it waits for the program to end
//! and then writes its summary, as `perf record` does, so that Ctrl-C, `kill PID` or
//! `timeout` leave a finished trace directory and say what it holds.
//!
//! - A signal the terminal sent (Ctrl-C, Ctrl-\, a hang-up: `si_code` is `SI_KERNEL`) went
//!   to the whole foreground process group, the program included: it is not passed on
//!   again.
//! - A signal a process sent (`kill -INT PID`, `timeout`: `SI_USER`, `SI_QUEUE`,
//!   `SI_TKILL`) was meant for the recording: it is passed on to what `pttrace run`
//!   started (the program, or QEMU, which hands it to the program's handler as the kernel
//!   would). One that comes before the program started is passed on once it has.
//! - Once the program has ended (the summary is being written), such a signal ends
//!   `pttrace run` as it would have without this module, except the first from the
//!   terminal: that may be the one that ended the program, taken only after the program
//!   was waited for.
//!
//! The signals go to a thread of their own (`sigwaitinfo`), not to a handler: nothing here
//! runs in signal context. They are blocked in the calling thread before any other thread
//! starts, so every thread inherits the mask; the program starts with an empty mask
//! ([`child::unblock_signals`]). The program is named by a pidfd, so that a signal never
//! reaches another process that got its id after it ended.

mod child;

pub use child::unblock_signals;

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

/// The signals handled here.
const STOPPING: [libc::c_int; 4] = [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP];

/// What the signal thread knows of the program.
struct Shared {
    /// A pidfd of the program (-1: not started yet, or none could be opened).
    pidfd: AtomicI32,
    /// The program's id (0: not started yet); signals go by `pidfd` where there is one.
    pid: AtomicI32,
    /// A signal to pass on once the program has started (0: none).
    pending: AtomicI32,
    /// The program has ended (been waited for).
    ended: AtomicBool,
}

/// The handling started by [`start`]; tell it when the program starts and ends.
pub struct Stopping {
    shared: Arc<Shared>,
}

/// `SIGINT` for 2, as `kill -l` names them.
fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// The signal set of `sigs`.
fn set_of(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: the set is initialized by sigemptyset before signals are added to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks `sigs` in the calling thread (and so in the threads it starts after, which
/// inherit its mask), for a thread that takes them with `sigwait`; their set.
pub fn block(sigs: &[libc::c_int]) -> libc::sigset_t {
    let set = set_of(sigs);
    // SAFETY: a valid set; pthread_sigmask changes only this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    set
}

/// Blocks the stopping signals in this thread (before any other thread exists) and starts
/// the thread that takes them; `prog` names the program in its messages, which go to
/// stderr unless `quiet`.
pub fn start(prog: &str, quiet: bool) -> Result<Stopping, String> {
    let set = block(&STOPPING);
    let shared = Arc::new(Shared {
        pidfd: AtomicI32::new(-1),
        pid: AtomicI32::new(0),
        pending: AtomicI32::new(0),
        ended: AtomicBool::new(false),
    });
    let theirs = shared.clone();
    let prog = prog.to_string();
    std::thread::Builder::new()
        .name("pttrace-stop".into())
        .spawn(move || take_signals(&set, &theirs, &prog, quiet))
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(Stopping { shared })
}

/// The signal thread: takes each stopping signal and does what the module says.
fn take_signals(set: &libc::sigset_t, shared: &Shared, prog: &str, quiet: bool) {
    // (Every other signal stays away from this thread: signals blocked in the process
    // later, such as snapshot triggers, are taken by their own threads.)
    // SAFETY: the set is initialized by sigfillset before use; only this thread's mask
    // changes.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    let say = |text: String| {
        if !quiet {
            eprintln!("pttrace run: {text}");
        }
    };
    let mut ended_by_terminal = false;
    loop {
        // SAFETY: all-zero bytes are a valid siginfo_t (plain integers and unions of them).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid signal set and `info` a valid out-pointer.
        let sig = unsafe { libc::sigwaitinfo(set, &mut info) };
        if sig < 0 {
            // (EINTR: a signal outside the set, handled elsewhere.)
            continue;
        }
        if shared.ended.load(Ordering::SeqCst) {
            // (A terminal's signal that ended the program can be taken here only after
            // the program was waited for: the first after the end is that one.)
            if info.si_code == libc::SI_KERNEL && !std::mem::replace(&mut ended_by_terminal, true) {
                say(format!(
                    "{} from the terminal, which sent it to {prog} too ({prog} has ended)",
                    name(sig)
                ));
                continue;
            }
            // The program has ended: the signal does what it would have done.
            let one = set_of(&[sig]);
            // SAFETY: resetting a disposition, unblocking the signal in this thread and
            // raising it in this thread; nothing else is touched.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
                libc::raise(sig);
            }
            continue;
        }
        if info.si_code == libc::SI_KERNEL {
            say(format!(
                "{} from the terminal, which sent it to {prog} too: waiting for {prog} to end",
                name(sig)
            ));
            continue;
        }
        // (Left for `started` to send when the program has not started yet; whichever of
        // the two takes it back sends it, once.)
        shared.pending.store(sig, Ordering::SeqCst);
        if shared.pid.load(Ordering::SeqCst) == 0 {
            say(format!("{}: passed on to {prog} once it starts", name(sig)));
            continue;
        }
        let sig = shared.pending.swap(0, Ordering::SeqCst);
        if sig == 0 {
            continue;
        }
        match send(shared, sig) {
            Ok(pid) => say(format!(
                "{}: passed on to {prog} (pid {pid}); waiting for it to end",
                name(sig)
            )),
            Err(e) => say(format!(
                "{}: cannot pass it on to {prog}: {e}; waiting for it to end",
                name(sig)
            )),
        }
    }
}

/// Sends `sig` to the program (started: its id is known); its id, or the error.
fn send(shared: &Shared, sig: libc::c_int) -> Result<i32, std::io::Error> {
    let pid = shared.pid.load(Ordering::SeqCst);
    let fd = shared.pidfd.load(Ordering::SeqCst);
    // SAFETY: pidfd_send_signal with a pidfd this module opened (never closed) and no
    // siginfo; kill with the program's id where no pidfd could be opened.
    let r = unsafe {
        if fd >= 0 {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } else {
            libc::c_long::from(libc::kill(pid, sig))
        }
    };
    if r == 0 {
        Ok(pid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Stopping {
    /// The program started as process `pid`: a signal that came before goes to it now.
    pub fn started(&self, pid: u32) {
        let Ok(pid) = i32::try_from(pid) else {
            return;
        };
        // SAFETY: pidfd_open with a process id and no flags; its result is a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        self.shared
            .pidfd
            .store(i32::try_from(fd).unwrap_or(-1), Ordering::SeqCst);
        self.shared.pid.store(pid, Ordering::SeqCst);
        let sig = self.shared.pending.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // (The thread said so when it took the signal.)
            let _ = send(&self.shared, sig);
        }
    }

    /// The program has ended (it was waited for): a stopping signal now ends pttrace.
    pub fn ended(&self) {
        self.shared.ended.store(true, Ordering::SeqCst);
    }
}
