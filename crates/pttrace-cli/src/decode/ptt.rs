//! `pttrace decode DIR`: every thread's windows of a `pttrace run` output.

use std::io::{BufWriter, Write};
use std::path::Path;

use drpttracer::decode::ptt_dir::{self as ptt_input, PttWindowInfo};
use drpttracer::decode::TraceDecoder;
use drpttracer::decode::{DecodeError, Record};

use super::{DecodeArgs, OutFormat, Printer};
use crate::text::count;
use crate::CmdResult;

pub fn run(path: &Path, args: &DecodeArgs) -> CmdResult {
    let mut trace = ptt_input::open(path)?;
    trace.sysroot = args.sysroot.clone();
    trace.decoder = args.decoder.kind();
    trace.resync_on_error = args.resync_on_error;
    trace.iflags_events = args.iflags_events;
    if args.decoder == super::DecoderArg::Check {
        return check(&trace, path, args.policy);
    }
    if args.format == OutFormat::Drmemtrace {
        return super::drmemtrace::write_dir(&trace, path, args);
    }
    let stdout = std::io::stdout();
    let mut printer = Printer::new(
        BufWriter::with_capacity(1 << 16, stdout.lock()),
        args.format,
        args.syntax,
        drpttracer::decode::Symbols::new(),
        args.srcline,
        None,
    );
    let symbolizer = crate::names::symbolizer(&args.debug_dir);
    let trace_dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let (mut total_insns, mut total_gaps, mut total_windows, mut total_pt) =
        (0u64, 0u64, 0u64, 0u64);
    let mut total_ovf = 0u64;
    let mut total_mem = 0u64;
    let mut total_with_pt = 0u64;
    // Loads and stores (`run --memory`) joined to no decoded instruction.
    let mut unjoined: Vec<(String, String)> = Vec::new();
    let mut problems = 0u64;
    let (mut damages, files_checked) = crate::tracedir::of_trace(path);
    damages.add_skipped(&trace.skipped);
    let bar = crate::progress::pt_bytes(crate::progress::trace_bytes(&trace));
    // Names by process image, and the image of those in `printer.lines`.
    let mut image_names: std::collections::HashMap<(i32, u64), crate::names::ImageNames> =
        Default::default();
    let mut names_of: Option<(i32, u64)> = None;
    let shared_names = crate::names::SharedImages::of(&trace, trace.threads.iter(), &trace_dir);
    // Threads of the same code hand their decoder caches on.
    let mut carriers = crate::carried::Carriers::new(&shared_names, trace.threads.iter());
    let result = (|| -> CmdResult {
        for th in &trace.threads {
            let h = &th.header;
            // Its set of images of the same mappings: their names and decoder caches.
            let set = shared_names.names_of((h.pid, h.nonce));
            if let Some(p) = trace.process_of(th) {
                if args.format == OutFormat::Disasm {
                    printer.set_symbols(p.symbols(trace.sysroot.as_deref()));
                }
            }
            if args.srcline || args.format == OutFormat::Disasm {
                // One image's names serve all its threads (what they resolved stays).
                if let (Some(n), Some(k)) = (printer.set_names(None), names_of.take()) {
                    image_names.insert(k, n);
                }
                let n = image_names.remove(&set).unwrap_or_else(|| {
                    crate::names::ImageNames::new(
                        trace.process_of(th),
                        trace.sysroot.as_deref(),
                        Some(&trace_dir),
                        symbolizer.clone(),
                    )
                    .with_code_files(shared_names.code_files(set))
                });
                printer.set_names(Some(n));
                names_of = Some(set);
            }
            let cmd = trace
                .process_of(th)
                .map(|p| p.cmdline.clone())
                .unwrap_or_default();
            match args.format {
                OutFormat::Jsonl => writeln!(
                    printer.out,
                    "{}",
                    serde_json::json!({"type": "thread", "pid": h.pid, "tid": h.tid,
                        "file": th.path.display().to_string(), "cmdline": cmd})
                )?,
                _ => writeln!(
                    printer.out,
                    "thread {}/{} ({}): {}",
                    h.pid,
                    h.tid,
                    crate::text::printable(&th.path.display().to_string()),
                    crate::text::printable(&cmd)
                )?,
            }
            let (mut t_insns, mut t_gaps, mut t_ovf) = (0u64, 0u64, 0u64);
            let mut io_err: Option<std::io::Error> = None;
            let mut carried = carriers.take(set);
            let stats =
                trace.decode_thread_carrying(th, &mut carried, &mut |w: &PttWindowInfo, dec| {
                    total_windows += 1;
                    total_pt += w.pt_len as u64;
                    total_mem += w.memory.len();
                    if let Some(b) = &bar {
                        // The window's frame in the file: PT, sideband, fixed fields.
                        b.inc((w.pt_len + w.sideband_len + 124) as u64);
                    }
                    let flags = w.flag_names().join(",");
                    let end = if w.flags & drpttracer::format::ptt::WF_NO_SYSCALL != 0 {
                        "cut without a syscall".to_string()
                    } else if w.flags & drpttracer::format::ptt::WF_SNAPSHOT_CUT != 0 {
                        format!("ends at {}, not returned at the snapshot", w.syscall_name())
                    } else {
                        format!("ends at {} = {}", w.syscall_name(), w.ret)
                    };
                    let head = format!(
                        "window {} ({end}){}{}",
                        w.index,
                        if flags.is_empty() { "" } else { " flags " },
                        flags
                    );
                    let mut io = |e: std::io::Error| {
                        let d = DecodeError::new("stdout", 0, e.to_string());
                        io_err = Some(e);
                        d
                    };
                    let Some(dec) = dec else {
                        if args.format != OutFormat::Jsonl {
                            writeln!(printer.out, "  {head}: no PT").map_err(&mut io)?;
                        }
                        return Ok(());
                    };
                    let (mut n, mut gaps, mut ovf) = (0u64, Vec::new(), 0u64);
                    let mut join = drpttracer::decode::accesses::AccessJoin::new(&w.memory);
                    let mut accesses = Vec::new();
                    // (The lines of an instruction's accesses.)
                    let mut line = Vec::new();
                    if args.format == OutFormat::Disasm {
                        writeln!(printer.out, "  {head}:").map_err(&mut io)?;
                    }
                    // Notes a gap or a loss.
                    let mut note = |r: &Record| match r {
                        Record::Gap(g) => gaps.push(g.to_string()),
                        Record::Overflow { ip } => {
                            ovf += 1;
                            gaps.push(match ip {
                                Some(ip) => format!(
                                    "overflow: trace lost, resumed at {ip:#x} (the backend \
                                 wrote OVF; see the window's flags)"
                                ),
                                None => "overflow: trace lost (OVF)".to_string(),
                            });
                        }
                        _ => {}
                    };
                    // (drmemtrace is written by its own module, before this loop.)
                    if matches!(args.format, OutFormat::Summary | OutFormat::Drmemtrace) {
                        // Only counted: the decoder's slices as they are (a cached block's
                        // instructions are not copied out one by one).
                        dec.for_each_slice(|recs| {
                            let mut k = 0;
                            for r in recs {
                                match r {
                                    Record::Instruction(_) => k += 1,
                                    other => note(other),
                                }
                            }
                            n += k;
                            std::ops::ControlFlow::<()>::Continue(())
                        });
                    }
                    for r in dec.by_ref() {
                        match &r {
                            Record::Instruction(_) => n += 1,
                            other => note(other),
                        }
                        match args.format {
                            OutFormat::Summary | OutFormat::Drmemtrace => {}
                            OutFormat::Jsonl => {
                                printer
                                    .jsonl(&r, Some(h.tid), args.srcline)
                                    .map_err(&mut io)?;
                                if let Record::Instruction(i) = &r {
                                    join.of(i.pc, &mut accesses);
                                    if !accesses.is_empty() {
                                        line.clear();
                                        for a in &accesses {
                                            super::lines::access_line(&mut line, a, h.tid);
                                        }
                                        printer.out.write_all(&line).map_err(&mut io)?;
                                    }
                                }
                            }
                            OutFormat::Disasm => printer.disasm(&r).map_err(&mut io)?,
                        }
                    }
                    if let (OutFormat::Jsonl, Some(what)) = (args.format, join.left_out(w.index)) {
                        unjoined.push((th.path.display().to_string(), what));
                    }
                    printer.decoded(super::decoded_by_text(dec.decoded_by()));
                    if args.format == OutFormat::Summary {
                        writeln!(
                            printer.out,
                            "  {head}: {}, {}",
                            super::tally(n, gaps.len() as u64 - ovf, ovf),
                            count(w.pt_len as u64, "PT byte")
                        )
                        .map_err(&mut io)?;
                        for g in &gaps {
                            writeln!(printer.out, "    gap: {g}").map_err(&mut io)?;
                        }
                    }
                    t_insns += n;
                    t_gaps += gaps.len() as u64 - ovf;
                    t_ovf += ovf;
                    Ok(())
                });
            carriers.give_back(set, carried);
            if let Some(e) = io_err {
                return Err(e.into());
            }
            let stats = stats?;
            total_insns += t_insns;
            total_gaps += t_gaps;
            total_ovf += t_ovf;
            total_with_pt += stats.windows_with_pt;
            if args.format != OutFormat::Jsonl {
                writeln!(
                    printer.out,
                    "  thread {}: {} ({} with PT), {}, {} dropped",
                    h.tid,
                    count(stats.windows as u64, "window"),
                    stats.windows_with_pt,
                    super::tally(t_insns, t_gaps, t_ovf),
                    stats.dropped
                )?;
            }
            if stats.tail != drpttracer::format::ptt::Tail::Clean {
                problems += 1;
                if !files_checked {
                    damages.add_tail(th.path.display(), &stats.tail);
                }
            }
            if !stats.ended {
                eprintln!("pttrace decode: {}", crate::text::unended_note(&th.path));
            }
            if let Some(r) = &stats.recovered {
                eprintln!(
                    "pttrace decode: {}: {}",
                    crate::text::printable(&th.path.display().to_string()),
                    crate::text::recovered_text(r)
                );
            }
            for w in &stats.warnings {
                eprintln!(
                    "pttrace decode: warning: {}: {}",
                    crate::text::printable(&th.path.display().to_string()),
                    crate::text::printable(&w.to_string())
                );
            }
        }
        if args.format != OutFormat::Jsonl {
            let mem = if total_mem > 0 {
                format!(", {total_mem} loads and stores")
            } else {
                String::new()
            };
            writeln!(
                printer.out,
                "total: {}, {}, {}, {}{mem}, {}, {}, {}",
                count(trace.threads.len() as u64, "thread"),
                count(total_windows, "window"),
                count(total_pt, "PT byte"),
                count(total_insns, "instruction"),
                count(total_gaps, "gap"),
                count(total_ovf, "overflow"),
                count(problems, "damaged file")
            )?;
            printer.decoded_by_line(total_windows.saturating_sub(total_with_pt))?;
        }
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        printer.out.flush()?;
        Ok(())
    })();
    match result {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        r => {
            r?;
            for (file, what) in &unjoined {
                damages.add_whole(crate::text::printable(file), what.clone());
            }
            damages.note_overflows(total_ovf);
            damages.finish("decode", args.policy)
        }
    }
}

/// `--decoder check` on a directory: every thread's windows by both decoders, compared.
fn check(trace: &ptt_input::PttTrace, path: &Path, policy: crate::damage::Policy) -> CmdResult {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut tally = super::CheckTally::default();
    let (mut damages, files_checked) = crate::tracedir::of_trace(path);
    for th in &trace.threads {
        let mut failed: Option<Box<dyn std::error::Error>> = None;
        let stats = trace.check_thread(th, &mut |w: &PttWindowInfo, outcome| {
            let Some(outcome) = outcome else {
                tally.without_pt += 1;
                return Ok(());
            };
            let source = format!("{} window {}", th.path.display(), w.index);
            tally.add(&mut out, &source, outcome).map_err(|e| {
                let d = DecodeError::new(&source, 0, e.to_string());
                failed = Some(e);
                d
            })
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let stats = stats?;
        if stats.tail != drpttracer::format::ptt::Tail::Clean && !files_checked {
            damages.add_tail(th.path.display(), &stats.tail);
        }
    }
    tally.finish(&mut out)?;
    out.flush()?;
    damages.finish("decode", policy)
}
