//! The shim on real programs: /bin/ls, a shell pipeline (fork + exec), raw `syscall`
//! instructions, inertness without configuration and invalid configuration.

mod shim_util;

use drpttracer::format::ptt::{self, Tail, WF_FORK_CHILD, WF_NO_RETURN, WF_PT_ABSENT};
use shim_util::*;

const NR_GETPPID: u64 = 110;
const NR_EXECVE: u64 = 59;
const NR_EXIT_GROUP: u64 = 231;

#[test]
fn ls_writes_parseable_info_and_thread_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("trace");
    let o = run_traced(&out, std::path::Path::new("/bin/ls"), &["/"], &[]);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("usr"));
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let td = read_dir(&out);
    assert_eq!(td.infos.len(), 1);
    let info = &td.infos[0];
    assert_eq!(info.cmdline, vec!["/bin/ls", "/"]);
    assert!(info.exe.ends_with("/ls"), "{}", info.exe);
    assert!(info.maps.contains("[vdso]") && info.maps.contains("libdrpttracer.so"));
    // The saved vDSO is an ELF image.
    assert_eq!(&info.vdso[..4], b"\x7fELF");
    assert_eq!(info.metadata.len(), 50);
    let (fam, model, step) = drpttracer::metadata::cpu_identity();
    let meta = drpttracer::PtMetadata::from_bytes(&info.metadata).unwrap();
    assert_eq!(
        (meta.cpu_family, meta.cpu_model, meta.cpu_stepping),
        (fam, model, step)
    );
    // No PT on this machine: the reason is stored once, in the info and thread headers.
    if !info.process.pt_present {
        assert!(!info.process.pt_absent_reason.is_empty());
    }
    assert_eq!(
        info.end.map(|e| e.0),
        Some(ptt::EndReason::ExitGroup as u32)
    );
    assert_eq!(info.tail, Tail::Clean);
    assert_eq!(td.threads.len(), 1);
    let t = &td.threads[0];
    assert_eq!(t.header.pid, info.process.pid);
    assert_eq!(t.header.tid, info.process.pid);
    assert_eq!(t.tail, Tail::Clean);
    assert_eq!(t.end.map(|e| e.0), Some(ptt::EndReason::ExitGroup as u32));
    assert_eq!(t.dropped, 0);
    // Window indices are dense, timestamps ordered, the last window is exit_group.
    for (i, w) in t.windows.iter().enumerate() {
        assert_eq!(w.index, i as u64);
        assert!(w.tsc_end >= w.tsc_start);
        assert!(w.flags & WF_PT_ABSENT != 0);
    }
    let last = t.windows.last().unwrap();
    assert_eq!(last.nr, NR_EXIT_GROUP);
    assert!(last.flags & WF_NO_RETURN != 0);
    // ls reads the directory and writes its listing.
    let names: Vec<_> = t
        .windows
        .iter()
        .filter_map(|w| drpttracer::shim::sysnames::name(w.nr))
        .collect();
    for n in ["openat", "getdents64", "write", "close"] {
        assert!(names.contains(&n), "no {n} window in {names:?}");
    }
    // kernel mode also writes DynamoRIO's per-thread file: a metadata PDB then one PDB
    // per window (48-byte header + 6 args, no PT here).
    let raw = std::fs::read(out.join(format!("kernel.raw/{}.raw.pt", t.header.tid))).unwrap();
    let u = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(u(0) >> 59, 0); // PID
    assert_eq!(u(0) & ((1 << 59) - 1), t.header.pid as u64);
    assert_eq!(u(1) >> 59, 1); // THREAD_ID
    assert_eq!(u(2), (2 << 59) | 18); // PT_METADATA_BOUNDARY = 18
    assert_eq!(&raw[24..42], &info.metadata[..18]);
    let pdb = 48 + 6 * 8;
    assert_eq!(raw.len(), 42 + pdb * t.windows.len());
    // The decoder's reader parses it, and the project's allocating writer produces the
    // same bytes for the same windows.
    let parsed = drpttracer::format::pdb::parse(&raw).unwrap();
    assert_eq!(parsed.tid, t.header.tid as u64);
    assert_eq!(parsed.metadata, meta);
    assert_eq!(parsed.windows.len(), t.windows.len());
    let mut wr =
        drpttracer::format::pdb::PdbWriter::new(t.header.pid as u64, t.header.tid as u64, &meta);
    for (p, w) in parsed.windows.iter().zip(&t.windows) {
        assert_eq!(
            (p.sysnum, p.syscall_idx, &p.args[..]),
            (w.nr, w.index, &w.args[..])
        );
        assert!(p.pt.is_empty());
        wr.syscall(
            t.header.pid as u64,
            t.header.tid as u64,
            w.nr,
            w.index,
            &w.args,
            &[],
        );
    }
    assert_eq!(wr.buf, raw);
    // Kernel symbols are copied beside it where readable (kcore only where /proc/kcore is).
    if std::fs::read("/proc/kallsyms").is_ok_and(|k| !k.is_empty()) {
        assert!(
            std::fs::metadata(out.join("kernel.raw/kallsyms"))
                .unwrap()
                .len()
                > 0
        );
    }
    if std::fs::File::open("/proc/kcore").is_err() {
        assert!(!out.join("kernel.raw/kcore").exists());
    }
    for (i, w) in t.windows.iter().enumerate() {
        let b = 42 + i * pdb;
        let e = |k: usize| u64::from_le_bytes(raw[b + k * 8..b + k * 8 + 8].try_into().unwrap());
        assert_eq!(e(2), (3 << 59) | pdb as u64); // PT_DATA_BOUNDARY = 48 + 8*6 + 0
        assert_eq!(e(3), (4 << 59) | w.nr);
        assert_eq!(e(4), (5 << 59) | w.index);
        assert_eq!(e(5), (6 << 59) | 6);
        for (k, a) in w.args.iter().enumerate() {
            assert_eq!(e(6 + k), *a);
        }
    }
}

#[test]
fn shell_pipeline_traces_every_process_image() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("trace");
    let o = run_traced(
        &out,
        std::path::Path::new("/bin/sh"),
        &["-c", "ls / | wc -l"],
        &[],
    );
    assert!(o.status.success(), "{o:?}");
    let n: usize = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(n > 5);
    let td = read_dir(&out);
    // The shell, two forked children before exec, and ls and wc after exec.
    let by_cmd = |c: &str| {
        td.infos
            .iter()
            .filter(|i| i.cmdline.first().map(String::as_str) == Some(c))
            .count()
    };
    assert_eq!(
        by_cmd("ls"),
        1,
        "{:#?}",
        td.infos.iter().map(|i| &i.cmdline).collect::<Vec<_>>()
    );
    assert_eq!(by_cmd("wc"), 1);
    assert_eq!(by_cmd("/bin/sh"), 3);
    let shell = td
        .infos
        .iter()
        .find(|i| {
            i.cmdline[0] == "/bin/sh"
                && i.process.ppid != 0
                && !td.infos.iter().any(|p| p.process.pid == i.process.ppid)
        })
        .expect("the top shell");
    for info in &td.infos {
        assert_eq!(info.tail, Tail::Clean, "{}", info.name);
        let threads = td.threads_of(info.process.pid, info.process.nonce);
        assert_eq!(
            threads.len(),
            1,
            "{}: one thread file per process image",
            info.name
        );
        let t = threads[0];
        assert_eq!(t.tail, Tail::Clean);
        assert!(!t.windows.is_empty());
        if info.cmdline[0] == "/bin/sh" && info.process.pid != shell.process.pid {
            // A forked child: parent is the shell, first window is its side of the fork,
            // last is the successful execve, and the file ends with End(exec).
            assert_eq!(info.process.ppid, shell.process.pid);
            let first = &t.windows[0];
            assert!(
                first.flags & WF_FORK_CHILD != 0 && first.ret == 0,
                "{first:?}"
            );
            let last = t.windows.last().unwrap();
            assert_eq!(last.nr, NR_EXECVE);
            assert!(last.flags & WF_NO_RETURN != 0);
            assert_eq!(t.end.map(|e| e.0), Some(ptt::EndReason::Exec as u32));
        } else {
            assert_eq!(t.end.map(|e| e.0), Some(ptt::EndReason::ExitGroup as u32));
        }
    }
    // After exec the same pid has a new image (different nonce) whose parent is the shell.
    for c in ["ls", "wc"] {
        let img = td.infos.iter().find(|i| i.cmdline[0] == c).unwrap();
        assert_eq!(img.process.ppid, shell.process.pid);
        assert!(td
            .infos
            .iter()
            .any(|i| i.process.pid == img.process.pid && i.process.nonce != img.process.nonce));
    }
    // The shell's fork windows returned the children's pids.
    let sh_t = td.threads_of(shell.process.pid, shell.process.nonce)[0];
    let mut child_pids: Vec<i64> = sh_t
        .windows
        .iter()
        .filter(|w| matches!(w.nr, 56 | 57 | 58 | 435) && w.ret > 0)
        .map(|w| w.ret)
        .collect();
    child_pids.sort();
    let mut ls_wc: Vec<i64> = td
        .infos
        .iter()
        .filter(|i| i.cmdline[0] == "ls" || i.cmdline[0] == "wc")
        .map(|i| i.process.pid as i64)
        .collect();
    ls_wc.sort();
    assert_eq!(child_pids, ls_wc);
}

#[test]
fn raw_syscall_instructions_are_intercepted_with_their_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("raw_syscall", tmp.path());
    let out = tmp.path().join("trace");
    let o = run_traced(&out, &prog, &[], &[]);
    assert!(o.status.success(), "{o:?}");
    let td = read_dir(&out);
    assert_eq!(td.threads.len(), 1);
    let ppid: Vec<_> = td.threads[0]
        .windows
        .iter()
        .filter(|w| w.nr == NR_GETPPID)
        .collect();
    assert_eq!(ppid.len(), 100);
    let parent = std::process::id() as i64;
    assert_eq!(ppid[0].args, [0; 6]);
    for (i, w) in ppid.iter().enumerate().skip(1) {
        assert_eq!(
            w.args,
            [0x1111 + i as u64, 0x2222, 0x3333, 0x4444, 0x5555, 0x6666]
        );
        assert_eq!(w.ret, parent);
    }
}

#[test]
fn filter_records_only_selected_syscalls() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("raw_syscall", tmp.path());
    let out = tmp.path().join("trace");
    let o = run_traced(&out, &prog, &[], &[("PTTRACER_SYSCALLS", "getppid")]);
    assert!(o.status.success());
    let td = read_dir(&out);
    let w = &td.threads[0].windows;
    assert_eq!(w.len(), 100);
    assert!(w.iter().all(|w| w.nr == NR_GETPPID));
}

#[test]
fn inert_without_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("/bin/sh")
        .args(["-c", "ls / | wc -l"])
        .current_dir(tmp.path())
        .env("LD_PRELOAD", lib_path())
        .env_remove("PTTRACER_OUT")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn invalid_configuration_is_reported_and_the_program_still_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("trace");
    let o = run_traced(
        &out,
        std::path::Path::new("/bin/echo"),
        &["hello"],
        &[("PTTRACER_MODE", "kernal")],
    );
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("PTTRACER_MODE=\"kernal\"") && err.contains("tracing disabled"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn posix_spawn_children_get_their_own_files_before_and_after_exec() {
    use drpttracer::format::ptt::{EndReason, WF_NESTED, WF_VFORK_CHILD};
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("spawn", tmp.path());
    let out = tmp.path().join("trace");
    let o = run_traced(&out, &prog, &[], &[]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    for line in ["spawn ok", "spawn missing ok", "spawnp ok", "system ok"] {
        assert!(text.contains(line), "{text}");
    }
    let td = read_dir(&out);
    let main = td
        .infos
        .iter()
        .find(|i| {
            i.exe.ends_with("/spawn")
                && i.process.ppid != 0
                && !td.infos.iter().any(|p| p.process.pid == i.process.ppid)
        })
        .unwrap();
    let parent = main.process.pid;
    let t = td.threads_of(parent, main.process.nonce);
    assert_eq!(t.len(), 1);
    // The parent's file holds only its own windows, numbered without gaps.
    for (i, w) in t[0].windows.iter().enumerate() {
        assert_eq!(w.index, i as u64);
        assert_eq!(w.flags & WF_VFORK_CHILD, 0, "{w:?}");
    }
    let last = t[0].windows.last().unwrap();
    assert_eq!(last.nr, NR_EXIT_GROUP);
    assert_eq!(last.flags & WF_NESTED, 0, "{last:?}");
    assert_eq!(last.depth, 0);

    // Each child ran on the parent's memory before exec: an image of its own (the parent's
    // exe, ppid = parent), every window flagged and numbered from 0, the files ended.
    let pre: Vec<_> = td
        .infos
        .iter()
        .filter(|i| i.process.ppid == parent && i.exe.ends_with("/spawn"))
        .collect();
    assert_eq!(pre.len(), 4, "echo, missing, spawnp echo, system's sh");
    let mut outcomes = vec![];
    for info in &pre {
        let pid = info.process.pid;
        let th = td.threads_of(pid, info.process.nonce);
        assert_eq!(th.len(), 1, "{}", info.name);
        let w = &th[0].windows;
        for (i, w) in w.iter().enumerate() {
            assert_eq!(w.index, i as u64, "{}", info.name);
            assert!(w.flags & WF_VFORK_CHILD != 0, "{}: {w:?}", info.name);
        }
        let execs: Vec<_> = w.iter().filter(|w| w.nr == NR_EXECVE).collect();
        let end = th[0].end.unwrap().0;
        assert_eq!(info.end.unwrap().0, end, "{}", info.name);
        assert_eq!(th[0].end.unwrap().1, w.len() as u64, "{}", info.name);
        // The image the child exec'd into, if any (same pid, another nonce).
        let after = td
            .infos
            .iter()
            .find(|i| i.process.pid == pid && i.process.nonce != info.process.nonce)
            .map(|i| i.cmdline.join(" "));
        let failed = execs.iter().filter(|w| w.ret == -2).count();
        let no_return = execs.iter().filter(|w| w.flags & WF_NO_RETURN != 0).count();
        outcomes.push((after, failed, no_return, end, info.end.unwrap().1));
        if no_return == 1 {
            // A successful exec is the child's last window.
            assert!(w.last().unwrap().flags & WF_NO_RETURN != 0);
            assert_eq!(w.last().unwrap().nr, NR_EXECVE);
        }
    }
    outcomes.sort();
    let exec = EndReason::Exec as u32;
    let exit = EndReason::ExitGroup as u32;
    assert_eq!(
        outcomes,
        vec![
            (None, 1, 0, exit, 127),
            (Some("echo spawned".to_string()), 0, 1, exec, 0),
            (Some("echo spawnp".to_string()), 1, 1, exec, 0),
            (Some("sh -c echo system ok".to_string()), 0, 1, exec, 0),
        ]
    );
    // `pttrace report` labels those images.
    let o = std::process::Command::new(pttrace())
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        text.matches("vfork-style child (posix_spawn): ran on its parent's memory")
            .count(),
        4,
        "{text}"
    );
}

#[test]
fn thread_windows_cover_user_time_between_syscalls() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("raw_syscall", tmp.path());
    let out = tmp.path().join("trace");
    let o = run_traced(&out, &prog, &[], &[("PTTRACER_WINDOW", "thread")]);
    assert!(o.status.success(), "{o:?}");
    let td = read_dir(&out);
    assert_eq!(td.infos[0].process.window, 1);
    let w = &td.threads[0].windows;
    assert!(w.len() > 100);
    // A thread window runs from the previous syscall's return to this syscall's entry, so
    // consecutive windows do not overlap.
    for pair in w.windows(2) {
        assert!(pair[0].tsc_end <= pair[1].tsc_start, "{pair:?}");
        assert!(pair[1].tsc_start <= pair[1].tsc_end, "{pair:?}");
    }
}

#[test]
fn fork_vfork_and_raw_clone_vfork_children_are_traced() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("vfork", tmp.path());
    for mode in ["0", "1", "2"] {
        let out = tmp.path().join(format!("trace{mode}"));
        let o = run_traced(&out, &prog, &[mode], &[]);
        assert!(o.status.success(), "{o:?}");
        let child: i32 = String::from_utf8_lossy(&o.stdout)
            .trim()
            .strip_prefix("child ")
            .unwrap()
            .parse()
            .unwrap();
        let td = read_dir(&out);
        let t = td
            .threads
            .iter()
            .find(|t| t.header.pid == child)
            .unwrap_or_else(|| panic!("mode {mode}: no thread file for child {child}"));
        // Its side of the fork first (glibc's fork child then re-registers its robust
        // list), 3 getppid, exit_group last.
        assert!(t.windows[0].flags & WF_FORK_CHILD != 0 && t.windows[0].ret == 0);
        assert_eq!(t.windows.iter().filter(|w| w.nr == NR_GETPPID).count(), 3);
        assert_eq!(t.windows.last().unwrap().nr, NR_EXIT_GROUP);
        assert!(t.windows.len() <= 6, "mode {mode}: {:?}", t.windows);
    }
}

#[test]
fn exec_with_an_emptied_environment_stays_traced() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("trace");
    let o = run_traced(
        &out,
        std::path::Path::new("/usr/bin/env"),
        // env searches PATH: the first execve fails (ENOENT), the second succeeds.
        &["-i", "PATH=/nonexistent:/bin", "echo", "clean"],
        &[("PTTRACER_SYSCALLS", "write,execve")],
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "clean\n");
    let td = read_dir(&out);
    let echo = td
        .infos
        .iter()
        .find(|i| i.cmdline.first().map(String::as_str) == Some("echo"))
        .expect("echo, exec'd with an empty environment, is traced");
    let t = td.threads_of(echo.process.pid, echo.process.nonce)[0];
    assert!(
        t.windows.iter().any(|w| w.nr == 1 && w.ret == 6),
        "echo's write of \"clean\\n\""
    );
    // The carried-over configuration is the original one (the filter included).
    assert!(t.windows.iter().all(|w| w.nr == 1 || w.nr == NR_EXECVE));
    // env's own file: the failed execve is a normal window (the pre-written one was
    // retracted), then the successful one, and the file is intact.
    let env = td.infos.iter().find(|i| i.exe.ends_with("/env")).unwrap();
    let t = td.threads_of(env.process.pid, env.process.nonce)[0];
    assert_eq!(t.tail, Tail::Clean);
    let execs: Vec<_> = t.windows.iter().filter(|w| w.nr == NR_EXECVE).collect();
    assert_eq!(execs.len(), 2, "{execs:?}");
    assert_eq!(execs[0].ret, -(libc::ENOENT as i64));
    assert_eq!(execs[0].flags & WF_NO_RETURN, 0);
    assert!(execs[1].flags & WF_NO_RETURN != 0);
    assert_eq!(t.end.map(|e| e.0), Some(ptt::EndReason::Exec as u32));
    for (i, w) in t.windows.iter().enumerate() {
        assert_eq!(w.index, i as u64);
    }
    // The tid's DynamoRIO file holds env's metadata PDB and its two execve PDBs (the one
    // written before the failed call was retracted), then echo's (appended, same tid).
    let raw = std::fs::read(out.join(format!("kernel.raw/{}.raw.pt", t.header.tid))).unwrap();
    let pdb = 48 + 6 * 8;
    let sysnums: Vec<u64> = (0..)
        .map(|i| 42 + i * pdb)
        .take_while(|&b| b + pdb <= raw.len())
        .map(|b| u64::from_le_bytes(raw[b + 24..b + 32].try_into().unwrap()))
        .collect();
    assert_eq!(
        &sysnums[..2],
        &[(4 << 59) | NR_EXECVE, (4 << 59) | NR_EXECVE]
    );
}

/// Kernel-mode syscall windows with hardware Intel PT: only where a kernel-mode `intel_pt`
/// event can be opened; otherwise prints `SKIP: <reason>` and checks that the files say why
/// PT is absent.
#[test]
fn kernel_syscall_windows_carry_hardware_pt_where_intel_pt_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = compile("bench_loop", tmp.path());
    let out = tmp.path().join("trace");
    let o = run_traced(&out, &prog, &["100"], &[("PTTRACER_MODE", "kernel")]);
    assert!(o.status.success(), "{o:?}");
    let td = read_dir(&out);
    let info = &td.infos[0].process;
    let probe = drpttracer::Tracer::new(drpttracer::TracerConfig {
        mode: drpttracer::Mode::KernelOnly,
        pt_size_shift: 6,
        sideband_size_shift: 4,
        backend: drpttracer::BackendChoice::Hardware,
    });
    if let Err(e) = probe {
        println!("SKIP: no kernel-mode Intel PT here: {}", e.message);
        assert!(!info.pt_present);
        assert!(!info.pt_absent_reason.is_empty(), "{info:?}");
        return;
    }
    assert!(info.pt_present, "{}", info.pt_absent_reason);
    // Every getppid window of the loop carries kernel PT, starting with a PSB.
    let name = &td.threads[0].name;
    let data = std::fs::read(out.join(name)).unwrap();
    let parsed = ptt::parse(name, &data).unwrap();
    let mut with_pt = 0;
    for f in &parsed.frames {
        if ptt::RecordType::from_raw(f.ty) != Some(ptt::RecordType::Window) {
            continue;
        }
        let w = ptt::decode_window(f.payload).unwrap();
        if w.window.nr == NR_GETPPID {
            assert_eq!(w.window.flags & WF_PT_ABSENT, 0, "{:?}", w.window);
            assert!(w.pt.len() > 16, "{:?}", w.window);
            assert_eq!(&w.pt[..16], &[2, 0x82].repeat(8)[..]);
            with_pt += 1;
        }
    }
    assert_eq!(with_pt, 100);
}
