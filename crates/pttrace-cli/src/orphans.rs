//! Processes the program started and left running when it ended (a daemon, a background
//! job). Their trace goes on into the directory after `pttrace run` has written its
//! summary, so the summary names them. To find them, `pttrace run` becomes their reaper
//! before it starts the program (`PR_SET_CHILD_SUBREAPER`): a process whose parent ends is
//! then re-parented to `pttrace run` rather than to init, and is one of its children.

use std::path::Path;

/// Makes this process the reaper of its descendants whose parents end.
pub fn adopt() {
    // SAFETY: prctl with an option and an integer argument; it changes only this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// This process's children that are still running (ended ones not reaped yet left out),
/// each with its command line: the program's under QEMU (`qemu`: read from QEMU's own
/// command line), else as the kernel has it.
pub fn still_running(qemu: bool) -> Vec<(i32, String)> {
    let mut pids: Vec<i32> = Vec::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                pids.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter(|&pid| !ended(pid))
        .map(|pid| (pid, cmdline(pid, qemu)))
        .collect()
}

/// Whether `pid` has ended (a zombie) or is gone.
fn ended(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // (The state follows the command name, which is in parentheses and may hold any.)
    stat.rsplit_once(')')
        .is_none_or(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
}

/// The command line of `pid`, its arguments separated by spaces.
fn cmdline(pid: i32, qemu: bool) -> String {
    let raw = std::fs::read(Path::new(&format!("/proc/{pid}/cmdline"))).unwrap_or_default();
    let args = if qemu {
        pttrace_format::launch::guest_cmdline(&raw).0
    } else {
        raw
    };
    args.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
