//! The QEMU backend end to end: real programs run by `pttrace run --backend qemu`, decoded
//! with our decoder, compared with the block sequence QEMU executed (the plugin's oracle
//! files) and with what each program is known to do. Needs `qemu-x86_64` (Debian's
//! qemu-user, installed by scripts/setup.sh); prints `SKIP: <reason>` without it.

mod shim_util;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use drpttracer::decode::ptt_dir::{self, PttTrace};
use drpttracer::decode::Record;
use drpttracer::format::ptt::Tail;
use shim_util::{plugin, pttrace, qemu_available, run_under_qemu, symbol, text};
use std::ffi::OsStr;

/// tests/progs/qemu_cases.c built without PIE (symbols = run-time addresses).
fn build(dir: &Path, extra: &[&str]) -> PathBuf {
    let mut flags = vec!["-no-pie"];
    flags.extend_from_slice(extra);
    let name = if extra.is_empty() { "qc" } else { "qc-static" };
    shim_util::compile_with("qemu_cases", dir, name, &flags)
}

/// A traced run of one case of qemu_cases: (its directory, the program, the trace
/// directory, pttrace's output); `None` (after `SKIP:`) without QEMU.
fn run_case(args: &[&str]) -> Option<(tempfile::TempDir, PathBuf, PathBuf, Output)> {
    run_case_env(args, &[])
}

/// [`run_case`] with environment variables for pttrace (and the plugin).
fn run_case_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<(tempfile::TempDir, PathBuf, PathBuf, Output)> {
    if !qemu_available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = build(dir.path(), &[]);
    let out = dir.path().join("out");
    let mut cmd: Vec<&OsStr> = vec![prog.as_os_str()];
    cmd.extend(args.iter().map(OsStr::new));
    let o = shim_util::qemu_run_command(&out, &["--qemu-oracle"], &cmd)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Some((dir, prog, out, o))
}

fn run_qemu(out: &Path, cmd: &[&str]) -> Output {
    let cmd: Vec<&OsStr> = cmd.iter().map(OsStr::new).collect();
    run_under_qemu(out, &["--qemu-oracle"], &cmd)
}

/// One decoded thread: its file and every record of every window, in order.
struct Decoded {
    path: PathBuf,
    pid: i32,
    tid: i32,
    records: Vec<Record>,
    windows: Vec<ptt_dir::PttWindowInfo>,
}

impl Decoded {
    fn ips(&self) -> Vec<u64> {
        self.records
            .iter()
            .filter_map(|r| r.as_instruction().map(|i| i.pc))
            .collect()
    }
    fn count(&self, pc: u64) -> usize {
        self.ips().iter().filter(|&&p| p == pc).count()
    }
    fn gaps(&self) -> Vec<String> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Gap(g) => Some(g.to_string()),
                _ => None,
            })
            .collect()
    }
}

fn decode(out: &Path) -> (PttTrace, Vec<Decoded>) {
    let t = ptt_dir::open(out).unwrap();
    let threads = t
        .threads
        .iter()
        .map(|th| {
            let wins = t.collect_thread(th).unwrap();
            Decoded {
                path: th.path.clone(),
                pid: th.header.pid,
                tid: th.header.tid,
                windows: wins.iter().map(|(w, _)| w.clone()).collect(),
                records: wins.into_iter().flat_map(|(_, r)| r).collect(),
            }
        })
        .collect();
    (t, threads)
}

/// The instruction addresses QEMU executed (the thread's `.oracle` file: block
/// definitions and executed block starts), as PT counts them: a REP string instruction
/// that QEMU runs as one block per iteration is one instruction.
fn oracle_ips(ptt_file: &Path, rep: &HashSet<u64>) -> Vec<u64> {
    let raw = std::fs::read(ptt_file.with_extension("oracle")).expect("oracle file");
    let vals: Vec<u64> = raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut defs: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut out: Vec<u64> = Vec::new();
    let mut i = 0;
    while i < vals.len() {
        let v = vals[i];
        if v >> 63 == 1 {
            let n = (v & 0xffff) as usize;
            let ips = vals[i + 1..i + 1 + n].to_vec();
            defs.insert(ips[0], ips);
            i += 1 + n;
            continue;
        }
        i += 1;
        if out.last() == Some(&v) && rep.contains(&v) {
            continue; // next iteration of the same REP instruction
        }
        out.extend_from_slice(&defs[&v]);
    }
    out
}

/// REP string instructions among the decoded ones.
fn rep_addresses(d: &Decoded) -> HashSet<u64> {
    use iced_x86::{Decoder, DecoderOptions};
    d.records
        .iter()
        .filter_map(|r| r.as_instruction())
        .filter(|i| {
            let insn = Decoder::with_ip(64, i.encoding(), i.pc, DecoderOptions::NONE).decode();
            insn.is_string_instruction() && (insn.has_rep_prefix() || insn.has_repne_prefix())
        })
        .map(|i| i.pc)
        .collect()
}

/// The executed instructions `want` as Intel PT counts a REP string instruction that an
/// asynchronous event interrupted between two iterations (QEMU runs one iteration per
/// block, and its log holds the instruction before and after the handler): not executed
/// there (its FUP is the instruction's own address, and it runs again after the handler),
/// as the thread's decoded records place each interruption, at the instruction it stopped
/// before. (That the flow then resumes at that instruction is checked on its own, by
/// [`assert_async_deliveries`].)
fn without_interrupted_reps(want: Vec<u64>, d: &Decoded, rep: &HashSet<u64>) -> Vec<u64> {
    let mut interrupted: HashMap<usize, u64> = HashMap::new();
    let mut n = 0;
    for r in &d.records {
        match r {
            Record::TraceDisabled { ip: Some(at) } if rep.contains(at) => {
                interrupted.insert(n, *at);
            }
            _ if r.as_instruction().is_some() => n += 1,
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(want.len());
    for pc in want {
        if interrupted.get(&out.len()) == Some(&pc) {
            // (Once: the same position then holds the handler's first instruction.)
            interrupted.remove(&out.len());
            continue;
        }
        out.push(pc);
    }
    out
}

/// Every thread decodes without gaps to exactly the instructions QEMU executed.
fn assert_equals_oracle(threads: &[Decoded]) {
    for d in threads {
        assert!(
            d.gaps().is_empty(),
            "{}: gaps {:?}",
            d.path.display(),
            d.gaps()
        );
        let got = d.ips();
        let rep = rep_addresses(d);
        let want = without_interrupted_reps(oracle_ips(&d.path, &rep), d, &rep);
        if got.len() != want.len() {
            // (Where the two part, and the addresses around.)
            let k = (0..got.len().min(want.len()))
                .find(|&k| got[k] != want[k])
                .unwrap_or(got.len().min(want.len()));
            let around = |v: &[u64]| {
                v.get(k.saturating_sub(3)..(k + 4).min(v.len()))
                    .unwrap_or(&[])
                    .iter()
                    .map(|a| format!("{a:#x}"))
                    .collect::<Vec<_>>()
            };
            panic!(
                "{}: instruction count {} decoded, {} executed; first difference at {k}: \
                 decoded {:?}, executed {:?}",
                d.path.display(),
                got.len(),
                want.len(),
                around(&got),
                around(&want)
            );
        }
        if let Some(k) = (0..got.len()).find(|&k| got[k] != want[k]) {
            panic!(
                "{}: instruction {k} decoded at {:#x}, executed at {:#x}",
                d.path.display(),
                got[k],
                want[k]
            );
        }
    }
}

#[test]
fn asm_loop_count_is_exact_dynamic_and_static() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for extra in [&[][..], &["-static"][..]] {
        let prog = build(dir.path(), extra);
        let out = dir.path().join(format!("out{}", extra.len()));
        let o = run_qemu(&out, &[prog.to_str().unwrap(), "loop", "1000"]);
        assert!(o.status.success(), "{}", text(&o));
        let (_, threads) = decode(&out);
        assert_eq!(threads.len(), 1);
        let d = &threads[0];
        let head = symbol(&prog, "pt_loop_head");
        // test cl,1 (3) | jz (2) | nop (1) | dec rcx (3) | jnz (2)
        assert_eq!(d.count(head), 1000);
        assert_eq!(d.count(head + 3), 1000);
        assert_eq!(d.count(head + 5), 500, "nop: jz not taken for odd rcx");
        assert_eq!(d.count(head + 6), 1000);
        assert_eq!(d.count(head + 9), 1000);
        // The loop sits in the window that ends with gettid, after the getppid window.
        let w = d
            .windows
            .iter()
            .position(|w| w.nr == libc::SYS_gettid as u64)
            .unwrap();
        assert_eq!(d.windows[w - 1].nr, libc::SYS_getppid as u64);
        assert_equals_oracle(&threads);
    }
}

#[test]
fn branches_indirect_calls_recursion_libc_and_syscalls_equal_what_ran() {
    let Some((_dir, prog, out, o)) = run_case(&["mix"]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("odd=34 fib=144 sorted=0,15 len=15 sink=-23"),
        "{}",
        text(&o)
    );
    let (t, threads) = decode(&out);
    let d = &threads[0];
    for f in ["fn_a", "fn_b", "fn_c"] {
        assert_eq!(
            d.count(symbol(&prog, f)),
            10,
            "{f}: called through the table"
        );
    }
    assert_eq!(
        d.count(symbol(&prog, "fib")),
        465,
        "fib(12) makes 465 calls"
    );
    // The info file names the guest's mappings: symbols of the program and of libc.
    let syms = t.processes[0].symbols(None);
    assert_eq!(
        syms.lookup(symbol(&prog, "fib")).map(|(n, _)| n),
        Some("fib")
    );
    let qsort = d
        .records
        .iter()
        .filter_map(|r| r.as_instruction())
        .find(|i| {
            syms.lookup(i.pc)
                .is_some_and(|(n, _)| n.starts_with("qsort"))
        });
    assert!(qsort.is_some(), "libc's qsort named in the trace");
    let cmp_calls = d.count(symbol(&prog, "cmp"));
    assert!(cmp_calls > 16, "qsort calls back: {cmp_calls}");
    let getppid = d
        .windows
        .iter()
        .filter(|w| w.nr == libc::SYS_getppid as u64)
        .count();
    assert_eq!(getppid, 5);
    assert_equals_oracle(&threads);
}

/// The number after `key=` in a program's output.
fn printed(t: &str, key: &str) -> usize {
    t.split(&format!("{key}="))
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {t}"))
}

#[test]
fn signals_mid_loop_decode_with_async_markers_and_resume_where_interrupted() {
    // setitimer: SIGALRM interrupts a loop 1,000 times.
    let Some((_dir, prog, out, o)) = run_case(&["alarm", "1000"]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let alarms = printed(&text(&o), "alarms");
    assert!(alarms >= 1000, "{alarms}");
    assert_async_deliveries(&prog, &out, "on_alarm", alarms);
}

/// SIGALRM between two iterations of a REP string instruction: QEMU runs each iteration
/// as a block, so the signal interrupts the instruction before it is done; Intel PT shows
/// it as an interruption at the REP instruction (not executed yet), which runs from the
/// start again after the handler and counts once.
#[test]
fn signals_between_rep_iterations_interrupt_the_rep_instruction() {
    let Some((_dir, prog, out, o)) = run_case(&["repalarm", "200"]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let alarms = printed(&text(&o), "alarms");
    assert!(alarms >= 200, "{alarms}");
    let threads = assert_async_deliveries(&prog, &out, "on_alarm", alarms);
    let rep = symbol(&prog, "rep_copy_at");
    let inside = threads[0]
        .records
        .iter()
        .filter(|r| matches!(r, Record::TraceDisabled { ip: Some(at) } if *at == rep))
        .count();
    // (Most land inside it: 89 to 105 of about 200 in runs here.)
    assert!(
        inside >= 10,
        "{inside} of {alarms} signals interrupted the copy"
    );
}

#[test]
fn signals_from_another_thread_land_in_a_tight_loop_exactly() {
    // pthread_kill: SIGUSR1 from a second thread into the main thread's loop.
    let Some((_dir, prog, out, o)) = run_case(&["pkill"]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let handled = printed(&text(&o), "usr1");
    assert!(handled > 0);
    assert_async_deliveries(&prog, &out, "on_usr1", handled);
}

/// Each of the `delivered` runs of the handler `handler` in the main thread is an
/// asynchronous entry (disabled at the interrupted instruction, enabled at the handler's
/// first one, resumed exactly there after rt_sigreturn) or the first block of a window;
/// every thread equals what QEMU executed. Returns the decoded threads.
fn assert_async_deliveries(
    prog: &Path,
    out: &Path,
    handler: &str,
    delivered: usize,
) -> Vec<Decoded> {
    let (_, threads) = decode(out);
    let d = &threads[0];
    assert_equals_oracle(&threads);
    let handler = symbol(prog, handler);
    assert_eq!(d.count(handler), delivered, "one handler run per signal");
    // Each asynchronous entry: TraceDisabled at the interrupted IP, TraceEnabled in the
    // handler; after the handler's rt_sigreturn the flow resumes exactly there.
    let recs = &d.records;
    let mut async_entries = 0;
    for (k, r) in recs.iter().enumerate() {
        let Record::TraceDisabled { ip: Some(at) } = r else {
            continue;
        };
        let Some(Record::TraceEnabled { ip }) = recs[k + 1..]
            .iter()
            .find(|r| !matches!(r, Record::Timestamp { .. }))
        else {
            panic!("async disable at {at:#x} without an enable");
        };
        assert_eq!(*ip, handler, "entered the handler");
        // After the handler's rt_sigreturn; a signal that arrived meanwhile runs the
        // handler again right at that return (a new window in the handler), and only the
        // last sigreturn goes back to the interrupted flow.
        let mut from = k;
        let resumed = loop {
            let sigreturn = recs[from..]
                .iter()
                .position(|r| matches!(r, Record::Syscall { .. }))
                .map(|p| p + from)
                .unwrap();
            let (p, next) = recs[sigreturn..]
                .iter()
                .enumerate()
                .find_map(|(p, r)| r.as_instruction().map(|i| (p + sigreturn, i)))
                .unwrap();
            if next.pc != handler {
                break next;
            }
            from = p;
        };
        assert_eq!(resumed.pc, *at, "resumed at the interrupted instruction");
        async_entries += 1;
    }
    // Every handler run begins with an enable in the handler: after an asynchronous
    // disable, or as the first block of a window (delivered at a syscall's return, as
    // hardware shows it) -- never as the target of a branch of the interrupted code.
    let mut window_starts = 0;
    for (k, r) in recs.iter().enumerate() {
        if r.as_instruction().is_some_and(|i| i.pc == handler) {
            let before = recs[..k]
                .iter()
                .rev()
                .find(|r| !matches!(r, Record::Timestamp { .. }))
                .unwrap();
            assert!(
                matches!(before, Record::TraceEnabled { ip } if *ip == handler),
                "handler entered by {before:?}"
            );
            let disabled = recs[..k]
                .iter()
                .rev()
                .find(|r| matches!(r, Record::TraceDisabled { .. } | Record::WindowId(_)))
                .unwrap();
            if matches!(disabled, Record::WindowId(_)) {
                window_starts += 1;
            }
        }
    }
    assert!(async_entries > 0);
    assert_eq!(
        async_entries + window_starts,
        delivered,
        "every delivery accounted for"
    );
    threads
}

/// Faults in code written at run time: the trace shows the instructions up to the
/// faulting one, the transfer to the SIGSEGV handler at that instruction (as PT shows an
/// asynchronous event), the handler from its first instruction, and -- when the handler
/// makes the page readable and returns -- the faulting instruction restarted. Both with
/// the signal frames (the faulting instruction read there) and without (inferred: the
/// restart inside the block, the one instruction that can fault in the other).
#[test]
fn faults_in_jit_code_are_traced_at_the_faulting_instruction() {
    jit_faults(&[]);
    jit_faults(&[("PTTRACE_QEMU_SIGFRAMES", "off")]);
}

fn jit_faults(env: &[(&str, &str)]) {
    let Some((_dir, prog, out, o)) = run_case_env(&["jitfault"], env) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("out=1 segvs=2"), "{t}");
    let jit = t
        .split("jit=0x")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap();
    let (fix, jump) = (symbol(&prog, "on_segv_fix"), symbol(&prog, "on_segv_jump"));
    let (_, threads) = decode(&out);
    let d = &threads[0];
    assert!(d.gaps().is_empty(), "{:?}", d.gaps());
    assert!(
        !d.records
            .iter()
            .any(|r| matches!(r, Record::Overflow { .. })),
        "no loss"
    );
    let in_jit = |ip: u64| (jit..jit + 128).contains(&ip);
    let mut seen = Vec::new();
    for r in &d.records {
        match r {
            Record::TraceDisabled { ip: Some(ip) } if in_jit(*ip) => {
                seen.push(format!("fault at +{}", ip - jit))
            }
            Record::TraceEnabled { ip } if *ip == fix => seen.push("on_segv_fix".into()),
            Record::TraceEnabled { ip } if *ip == jump => seen.push("on_segv_jump".into()),
            _ => {
                if let Some(i) = r.as_instruction().filter(|i| in_jit(i.pc)) {
                    seen.push(format!("+{}", i.pc - jit));
                }
            }
        }
    }
    assert_eq!(
        seen,
        [
            // nop; mov eax,[rdi] faults; the handler; the load restarted, add, store, ret.
            "+0",
            "fault at +1",
            "on_segv_fix",
            "+1",
            "+3",
            "+6",
            "+8",
            // mov eax,[rdi] faults at once; the handler leaves by siglongjmp.
            "fault at +64",
            "on_segv_jump",
        ]
    );
}

#[test]
fn eight_threads_have_their_own_files_and_exact_loops() {
    let Some((_dir, prog, out, o)) = run_case(&["threads"]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let (_, threads) = decode(&out);
    assert_eq!(threads.len(), 9, "main + 8 workers");
    let head = symbol(&prog, "pt_loop_head");
    let mut counts: Vec<usize> = threads.iter().map(|d| d.count(head)).collect();
    counts.sort();
    assert_eq!(counts, vec![0, 100, 200, 300, 400, 500, 600, 700, 800]);
    let pid = threads[0].pid;
    assert!(threads.iter().all(|d| d.pid == pid));
    assert_eq!(
        threads.iter().map(|d| d.tid).collect::<HashSet<_>>().len(),
        9
    );
    assert_equals_oracle(&threads);
    // run's summary lists the first thread and counts the eight others (nothing lost in
    // them), with their windows and PT bytes; report lists every one.
    let said = String::from_utf8_lossy(&o.stderr);
    let lines = |text: &str| text.lines().filter(|l| l.starts_with("  thread ")).count();
    assert_eq!(lines(&said), 1, "{said}");
    let t = ptt_dir::open(&out).unwrap();
    let (mut windows, mut pt) = (0u64, 0u64);
    for th in t.threads.iter().filter(|th| th.header.tid != th.header.pid) {
        let s = drpttracer::format::summary::summarize_thread(&th.path).unwrap();
        (windows, pt) = (windows + s.windows, pt + s.pt_bytes);
    }
    assert!(
        said.contains(&format!(
            "  … and 8 more threads: {windows} windows, {pt} PT bytes, nothing lost, each \
             ended (`pttrace report` lists each)"
        )),
        "{said}"
    );
    assert_eq!(lines(&shim_util::report(&out)), 9);
}

/// `strace -f -c` counts per syscall name.
fn strace_counts(cmd: &[&str]) -> HashMap<String, u64> {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("strace.txt");
    let st = Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(&f)
        .args(cmd)
        .output()
        .expect("run strace");
    assert!(st.status.success());
    let mut m = HashMap::new();
    for line in std::fs::read_to_string(&f).unwrap().lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors,] syscall
        if cols.len() >= 5 && cols[0].parse::<f64>().is_ok() {
            let name = cols[cols.len() - 1].to_string();
            if let Ok(n) = cols[3].parse() {
                m.insert(name, n);
            }
        }
    }
    m
}

#[test]
fn fork_and_exec_chain_is_traced_image_by_image_and_counts_match_strace() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cmd = ["/bin/sh", "-c", "ls / | wc -l"];
    let o = run_qemu(&out, &cmd);
    assert!(o.status.success(), "{}", text(&o));
    let (t, threads) = decode(&out);
    // sh, the two forked sh children, and the images they exec'd: ls and wc.
    let mut cmdlines: Vec<&str> = t.processes.iter().map(|p| p.cmdline.as_str()).collect();
    cmdlines.sort();
    assert_eq!(
        cmdlines,
        vec!["/bin/sh -c ls / | wc -l"; 3]
            .into_iter()
            .chain(["ls /", "wc -l"])
            .collect::<Vec<_>>()
    );
    assert_eq!(threads.len(), 5);
    assert_equals_oracle(&threads);
    // Syscalls after start-up, per name, against strace of the same command (strace also
    // counts sh's own first execve, which pttrace made).
    let mut ours: HashMap<u64, u64> = HashMap::new();
    for th in &t.threads {
        let s = drpttracer::format::summary::summarize_thread(&th.path).unwrap();
        assert_eq!(s.tail, Tail::Clean);
        for (nr, n) in s.per_syscall {
            *ours.entry(nr).or_default() += n;
        }
    }
    let theirs = strace_counts(&cmd);
    for (name, nr, adjust) in [
        ("clone", libc::SYS_clone, 0),
        ("wait4", libc::SYS_wait4, 0),
        ("pipe2", libc::SYS_pipe2, 0),
        ("dup2", libc::SYS_dup2, 0),
        ("getdents64", libc::SYS_getdents64, 0),
        ("execve", libc::SYS_execve, 1),
    ] {
        let want = theirs.get(name).copied().unwrap_or(0) - adjust;
        assert_eq!(ours.get(&(nr as u64)).copied().unwrap_or(0), want, "{name}");
    }
}

/// A process that runs four programs one after the other (`execve`): every reader lists
/// its images in the order they ran, not by their image ids (random: with four images the
/// id order is the run order once in 24).
#[test]
fn an_exec_chain_is_listed_in_the_order_it_ran() {
    if !qemu_available() {
        println!("SKIP: qemu-x86_64 is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let third = "exec /bin/echo chained";
    let second = format!("exec /bin/sh -c '{third}'");
    let first = format!("exec /bin/sh -c \"{second}\"");
    let o = run_qemu(&out, &["/bin/sh", "-c", &first]);
    assert!(o.status.success(), "{}", text(&o));
    let want = [
        format!("/bin/sh -c {first}"),
        format!("/bin/sh -c {second}"),
        format!("/bin/sh -c {third}"),
        "/bin/echo chained".to_string(),
    ];
    let t = ptt_dir::open(&out).unwrap();
    let pids: HashSet<i32> = t.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids.len(), 1, "one process");
    let cmdlines: Vec<&str> = t.processes.iter().map(|p| p.cmdline.as_str()).collect();
    assert_eq!(cmdlines, want);
    let cmdline_of = |nonce: u64| {
        t.processes
            .iter()
            .find(|p| p.nonce == nonce)
            .map(|p| p.cmdline.as_str())
    };
    let threads: Vec<_> = t
        .threads
        .iter()
        .map(|th| cmdline_of(th.header.nonce))
        .collect();
    assert_eq!(
        threads,
        want.iter().map(|c| Some(c.as_str())).collect::<Vec<_>>()
    );
    // What `report` and `decode` print, one line per image, in the same order.
    let lines = |args: &[&str], prefix: &str| -> Vec<String> {
        let o = Command::new(pttrace())
            .args(args)
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.rsplit_once("): ").map_or("", |(_, c)| c).to_string())
            .collect()
    };
    assert_eq!(lines(&["report"], "process "), want);
    let printed: Vec<String> = lines(&["decode", "--format", "summary"], "thread ");
    assert_eq!(printed, want);
}

#[test]
fn jit_code_rewritten_at_the_same_address_decodes_both_versions() {
    let Some((_dir, _, out, o)) = run_case(&["jit"]) else {
        return;
    };
    let t = text(&o);
    assert!(o.status.success() && t.contains("r1=1 r2=5"), "{t}");
    let at = t
        .split("jit=0x")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap();
    let (_, threads) = decode(&out);
    let d = &threads[0];
    let jitted: Vec<Vec<u8>> = d
        .records
        .iter()
        .filter_map(|r| r.as_instruction())
        .filter(|i| (at..at + 16).contains(&i.pc))
        .map(|i| i.encoding().to_vec())
        .collect();
    assert_eq!(
        jitted,
        vec![
            vec![0xb8, 1, 0, 0, 0],
            vec![0xc3],
            vec![0xb8, 2, 0, 0, 0],
            vec![0x83, 0xc0, 0x03],
            vec![0xc3],
        ]
    );
    assert_equals_oracle(&threads);
}

#[test]
fn rep_strings_cpuid_and_syscalls_in_a_loop_count_exactly() {
    let Some((_dir, prog, out, o)) = run_case(&["rep"]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let (_, threads) = decode(&out);
    let d = &threads[0];
    for s in ["rep_movsb_at", "rep_stosq_at", "cpuid_at", "syscall_at"] {
        assert_eq!(d.count(symbol(&prog, s)), 10, "{s}");
    }
    let sys = symbol(&prog, "syscall_at");
    let ends = d
        .windows
        .iter()
        .filter(|w| w.nr == libc::SYS_getppid as u64)
        .count();
    assert_eq!(ends, 10, "each syscall ends a window");
    // No asynchronous event anywhere: REP iterations and cpuid are plain flow.
    assert!(!d
        .records
        .iter()
        .any(|r| matches!(r, Record::TraceDisabled { ip: Some(_) })));
    assert!(d
        .records
        .iter()
        .any(|r| matches!(r, Record::Syscall { pc } if *pc == sys)));
    assert_equals_oracle(&threads);
}

#[test]
fn a_crashing_program_keeps_its_windows_and_pttrace_reports_the_signal() {
    let Some((_dir, _, out, o)) = run_case(&["crash"]) else {
        return;
    };
    assert_eq!(o.status.code(), Some(128 + libc::SIGSEGV), "{}", text(&o));
    assert!(text(&o).contains("killed by signal 11"), "{}", text(&o));
    let (t, threads) = decode(&out);
    let s = drpttracer::format::summary::summarize_thread(&t.threads[0].path).unwrap();
    assert_eq!(s.tail, Tail::Clean);
    assert_eq!(s.per_syscall.get(&(libc::SYS_getppid as u64)), Some(&3));
    // QEMU 7.2 calls no plugin callback on a fatal signal: the file ends after the last
    // window written (the code since the last syscall is not in it), without End record.
    assert_eq!(s.end, None);
    let last = threads[0].windows.last().unwrap();
    assert_eq!(last.nr, libc::SYS_getppid as u64);
    assert!(threads[0].gaps().is_empty());
}

#[test]
fn a_program_closing_our_descriptors_keeps_its_files_and_its_trace() {
    let Some(dir0) = qemu_available().then(|| tempfile::tempdir().unwrap()) else {
        return;
    };
    let data = dir0.path().join("guest.txt");
    let Some((_dir, _, out, o)) = run_case(&["closefds", data.to_str().unwrap()]) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("pttrace-qemu:"), "{}", text(&o));
    // The program's file got the number of a trace file: it holds its line only.
    assert_eq!(std::fs::read(&data).unwrap(), b"guest data\n");
    let (t, threads) = decode(&out);
    let s = drpttracer::format::summary::summarize_thread(&t.threads[0].path).unwrap();
    assert_eq!(s.tail, Tail::Clean);
    assert!(
        s.end.is_some(),
        "End record written after the descriptors were closed"
    );
    assert_eq!(s.per_syscall.get(&(libc::SYS_getppid as u64)), Some(&25));
    assert_equals_oracle(&threads);
}

#[test]
fn errors_name_the_problem() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // No emulator where it is looked for.
    let o = Command::new(pttrace())
        .args([
            "run",
            "--mode",
            "user",
            "--window",
            "thread",
            "--backend",
            "qemu",
        ])
        .arg("--out")
        .arg(&out)
        .args(["--", "/bin/true"])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("qemu-x86_64 not found in PATH")
            && text(&o).contains("apt-get install qemu-user"),
        "{}",
        text(&o)
    );
    let o = Command::new(pttrace())
        .args([
            "run",
            "--mode",
            "user",
            "--window",
            "thread",
            "--backend",
            "qemu",
        ])
        .args(["--qemu", "/nonexistent/qemu"])
        .arg("--out")
        .arg(&out)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("--qemu /nonexistent/qemu: not an executable file"));
    // A program for another architecture.
    let arm = dir.path().join("arm-prog");
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    elf.resize(64, 0);
    elf[18] = 183; // EM_AARCH64
    std::fs::write(&arm, &elf).unwrap();
    std::fs::set_permissions(&arm, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = run_qemu(&out, &[arm.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("not an x86-64 program"), "{}", text(&o));
    // Kernel mode is not something QEMU can show.
    let o = Command::new(pttrace())
        .args([
            "run",
            "--mode",
            "kernel",
            "--backend",
            "qemu",
            "--",
            "/bin/true",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("the qemu backend traces user mode in thread windows"));
}

#[test]
fn a_full_disk_keeps_every_window_written_before_it() {
    if !qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // 96 KiB per file (ulimit -f counts 1 KiB blocks in bash, 512 B in dash: ask sh for
    // 192 blocks of either), SIGXFSZ ignored so writes fail with EFBIG instead.
    let script = format!(
        "trap '' XFSZ; ulimit -f 192; exec {} run --mode user --window thread --backend qemu \
         --qemu-plugin {} --out {} -- /bin/ls -lR /usr/share/doc/coreutils",
        pttrace().display(),
        plugin().display(),
        out.display()
    );
    let o = Command::new("/bin/sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(t.contains("failed at window"), "{t}");
    let (trace, _) = decode(&out);
    for th in &trace.threads {
        let s = drpttracer::format::summary::summarize_thread(&th.path).unwrap();
        assert_eq!(
            s.tail,
            Tail::Clean,
            "{}: whole frames only",
            th.path.display()
        );
        assert!(s.windows > 0);
    }
}

/// Go's asynchronous preemption under QEMU: the SIGURG handler returns (rt_sigreturn) into
/// `asyncPreempt`, not to the interrupted instruction, and `asyncPreempt` returns there
/// later. The signal frame says where each signal interrupted: every thread decodes to
/// exactly what QEMU executed, without overflow, with many entries into
/// `runtime.sigtramp`.
#[test]
fn go_preemption_signals_resume_where_they_interrupted() {
    if !qemu_available() {
        return;
    }
    if Command::new("go").arg("version").output().is_err() {
        println!("SKIP: go is not installed (apt-get install golang-go)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/go/preempt.go");
    let exe = dir.path().join("preempt");
    let o = Command::new("go")
        .args(["build", "-o"])
        .arg(&exe)
        .arg(&src)
        .env("GO111MODULE", "off")
        .env("GOCACHE", dir.path().join("gocache"))
        .output()
        .unwrap();
    assert!(o.status.success(), "go build: {}", text(&o));
    let out = dir.path().join("out");
    let cmd = [
        OsStr::new("env"),
        OsStr::new("GOMAXPROCS=2"),
        exe.as_os_str(),
    ];
    let o = run_under_qemu(&out, &["--qemu-oracle"], &cmd);
    assert!(o.status.success(), "{}", text(&o));
    let (_, threads) = decode(&out);
    let sigtramp = symbol(&exe, "runtime.sigtramp.abi0");
    let mut entries = 0;
    let mut overflows = 0;
    let mut exact = Vec::new();
    for d in threads {
        entries += d.count(sigtramp);
        let ovf = d
            .records
            .iter()
            .filter(|r| matches!(r, Record::Overflow { .. }))
            .count();
        overflows += ovf;
        if ovf == 0 {
            exact.push(d);
        }
    }
    println!("{entries} entries into runtime.sigtramp, {overflows} overflows");
    assert!(entries >= 10, "{entries} signal deliveries");
    // Each signal frame tells where its signal interrupted the goroutine.
    assert_eq!(
        overflows, 0,
        "{overflows} overflows for {entries} deliveries"
    );
    assert_equals_oracle(&exact);
}

/// Java under QEMU (OpenJDK, `default-jdk-headless`): three threads allocating (GC) and
/// catching NullPointerExceptions in a hot loop, so compiled code faults on purpose
/// (implicit null checks) and reaches safepoints. Every signal is traced exactly: no
/// overflow in any thread file, no gap, and `run`, `report`, `decode` agree.
#[test]
fn java_faults_and_safepoints_lose_nothing() {
    if !qemu_available() {
        return;
    }
    if Command::new("javac").arg("-version").output().is_err() {
        println!("SKIP: no JDK (javac) is installed (apt-get install default-jdk-headless)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/java/Faults.java");
    let o = Command::new("javac")
        .arg("-d")
        .arg(dir.path())
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "javac: {}", text(&o));
    let out = dir.path().join("out");
    let cp = dir.path().as_os_str();
    let cmd = [
        OsStr::new("java"),
        OsStr::new("-cp"),
        cp,
        OsStr::new("Faults"),
    ];
    let o = run_under_qemu(&out, &[], &cmd);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("npes=1200"), "{t}");
    assert!(t.contains("losses: 0 lossy windows"), "{t}");
    let mut files = 0;
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "ptt") {
            continue;
        }
        files += 1;
        let d = Command::new(pttrace())
            .args(["dump", "--ptt"])
            .arg(&p)
            .output()
            .unwrap();
        assert!(d.status.success(), "{}", text(&d));
        let ovf = String::from_utf8_lossy(&d.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("ovf"))
            .count();
        assert_eq!(ovf, 0, "{}: OVF packets", p.display());
    }
    assert!(files > 3, "{files} thread files");
    // Every signal entry is an asynchronous event into a handler's first instruction:
    // the few addresses entered so are never reached by ordinary flow.
    let t = ptt_dir::open(&out).unwrap();
    let mut entries: HashMap<u64, usize> = HashMap::new();
    let mut reached_by_flow: HashMap<u64, usize> = HashMap::new();
    let (mut gaps, mut overflows) = (0, 0);
    for th in &t.threads {
        t.decode_thread(th, &mut |_, dec| {
            let Some(d) = dec else { return Ok(()) };
            let mut disabled_at = None;
            let mut enabled_at = None;
            for r in d.by_ref() {
                match &r {
                    Record::Gap(_) => gaps += 1,
                    Record::Overflow { .. } => overflows += 1,
                    Record::TraceDisabled { ip } => disabled_at = *ip,
                    Record::TraceEnabled { ip } => {
                        if disabled_at.is_some_and(|a| a != *ip) {
                            *entries.entry(*ip).or_default() += 1;
                        }
                        enabled_at = Some(*ip);
                        disabled_at = None;
                    }
                    Record::Timestamp { .. } => {}
                    _ => {
                        if let Some(i) = r.as_instruction() {
                            if enabled_at != Some(i.pc) && entries.contains_key(&i.pc) {
                                *reached_by_flow.entry(i.pc).or_default() += 1;
                            }
                            enabled_at = None;
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    }
    assert_eq!((gaps, overflows), (0, 0));
    let total: usize = entries.values().sum();
    println!("signal entries by handler: {entries:x?}");
    assert!(total > 0 && entries.len() <= 4, "{entries:x?}");
    assert!(
        reached_by_flow.is_empty(),
        "handlers reached by a branch: {reached_by_flow:x?}"
    );
}
