//! Stopping `pttrace run` as users do: Ctrl-C at a terminal (the terminal's SIGINT to the
//! whole foreground group), `kill -INT PID` or `kill PID` / `timeout` (to pttrace run
//! alone). Each time the program gets the signal (once: the terminal's is not passed on
//! again), pttrace run waits for it to end, writes its summary and exits with the
//! program's status, and the trace directory is whole. And the program starts with no
//! signal blocked, snapshot triggers included (pttrace run blocks the signals its own
//! threads take). With the machine's default backend (QEMU here).

mod shim_util;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use shim_util::{pttrace, qemu_available, text};

/// Writes `dir/wait.sh`, a shell script that ends with status 4 on SIGINT and 3 on
/// SIGTERM (logging each signal it took to `log`), and else waits for a minute; `ready`
/// appears once its traps are set. Returns its path.
fn waiting_script(dir: &Path, ready: &Path, log: &Path) -> PathBuf {
    let path = dir.join("wait.sh");
    let text = format!(
        "trap 'echo INT >> {log}; kill $!; exit 4' INT\n\
         trap 'echo TERM >> {log}; kill $!; exit 3' TERM\n\
         sleep 60 &\n\
         touch {ready}\n\
         wait\n",
        log = log.display(),
        ready = ready.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn setup() {
    if qemu_available() {
        shim_util::plugin();
    }
}

/// Waits (at most two minutes) for `path` to exist.
fn wait_for_file(path: &Path, child: &mut Child) {
    let start = Instant::now();
    while !path.exists() {
        if let Ok(Some(s)) = child.try_wait() {
            panic!("pttrace run ended ({s}) before {} appeared", path.display());
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pttrace report DIR`: nothing damaged (exit status 0), and the script's process ended
/// by `exit` with `status`. (The `sleep` it kills, and in the terminal's case anything
/// else in the foreground group then, end without a ProcessEnd record: killed.)
fn assert_whole(out: &Path, status: i32) {
    let o = Command::new(pttrace())
        .arg("report")
        .arg(out)
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(!t.contains("damaged"), "{t}");
    assert!(
        t.contains(&format!("ended: exit_group (status {status})")),
        "{t}"
    );
}

fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (dir.join("out"), dir.join("ready"), dir.join("signals.log"))
}

#[test]
fn ctrl_c_at_a_terminal_reaches_the_program_once_and_the_summary_follows() {
    setup();
    // (`script` needs a pseudo-terminal: /dev/ptmx.)
    match Command::new("script")
        .args(["-q", "-e", "-c", "true", "/dev/null"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            println!(
                "SKIP: `script` cannot run a command on a pseudo-terminal here: {}",
                text(&o)
            );
            return;
        }
        Err(e) => {
            println!("SKIP: `script` (util-linux, Debian's bsdutils) cannot be run: {e}");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, ready, log) = paths(dir.path());
    // `script` runs the command on a pseudo-terminal of its own, in the foreground, and
    // copies its input there: a 0x03 byte is Ctrl-C, the terminal's SIGINT to the group.
    // It runs the line with `$SHELL -c`: `exec` makes pttrace run the shell's process
    // whatever the shell (dash, when it is $SHELL, would stay and die of the SIGINT
    // itself, and `script` would report that: 130).
    let line = format!(
        "exec {} run -o {} -- sh {}",
        pttrace().display(),
        out.display(),
        waiting_script(dir.path(), &ready, &log).display()
    );
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut child);
    child.stdin.as_mut().unwrap().write_all(&[0x03]).unwrap();
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    // (Without the handling, pttrace run died of the SIGINT: status 130, no summary.)
    assert_eq!(o.status.code(), Some(4), "{t}");
    assert!(
        t.contains("pttrace run: SIGINT from the terminal, which sent it to sh too"),
        "{t}"
    );
    assert!(t.contains("total: "), "{t}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "INT\n", "{t}");
    assert_whole(&out, 4);
}

#[test]
fn a_signal_sent_to_pttrace_run_alone_is_passed_on_and_the_summary_follows() {
    setup();
    for (sig, name, status, logged) in [
        (libc::SIGINT, "SIGINT", 4, "INT\n"),
        (libc::SIGTERM, "SIGTERM", 3, "TERM\n"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (out, ready, log) = paths(dir.path());
        let mut child = Command::new(pttrace())
            .args(["run", "-o"])
            .arg(&out)
            .args(["--", "sh"])
            .arg(waiting_script(dir.path(), &ready, &log))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_file(&ready, &mut child);
        // SAFETY: kill with the id of a child not yet waited for.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let o: Output = child.wait_with_output().unwrap();
        let t = text(&o);
        // (Without the handling, pttrace run died of the signal at once and the program
        // went on, unaware of it.)
        assert_eq!(o.status.code(), Some(status), "{name}: {t}");
        assert!(
            t.contains(&format!("pttrace run: {name}: passed on to sh (pid ")),
            "{name}: {t}"
        );
        assert!(t.contains("total: "), "{name}: {t}");
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            logged,
            "{name}: {t}"
        );
        assert_whole(&out, status);
    }
}

#[test]
fn the_program_starts_with_no_signal_blocked_snapshot_triggers_included() {
    setup();
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        println!("SKIP: /usr/bin/python3 is not installed");
        return;
    }
    let script = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))";
    let dir = tempfile::tempdir().unwrap();
    for (k, opts) in [
        &[][..],
        &["--snapshot", "64K", "--trigger", "signal:USR2"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let o = Command::new(pttrace())
            .args(["run", "-o"])
            .arg(dir.path().join(format!("out{k}")))
            .args(opts)
            .arg("--")
            .arg(python)
            .args(["-c", script])
            .output()
            .unwrap();
        // (The snapshot trigger's SIGUSR2, 12, was blocked in the program before.)
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "[]\n",
            "{opts:?}: {}",
            text(&o)
        );
        assert_eq!(o.status.code(), Some(0), "{opts:?}: {}", text(&o));
    }
}
