//! `pttrace dump`: packet listing of a PT file (like ptdump).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use drpttracer::decode::packets::{
    list_packets_with, ListOptions, PacketLine, TimeColumn, TimeColumns,
};
use drpttracer::decode::timing::TimeCfg;
use drpttracer::decode::CpuParams;
use drpttracer::format::{auxtrace, pdb};

use crate::damage::Damages;
use crate::CmdResult;

#[derive(clap::Args)]
pub struct Args {
    /// The trace: a `pttrace run` directory (every thread file's windows) or one of its
    /// thread files (known by its header), raw PT, an AUXTRACE stream (--auxtrace) or a
    /// .raw.pt file (--raw-pt).
    file: PathBuf,
    /// The file holds PERF_RECORD_AUXTRACE-wrapped PT.
    #[arg(long, conflicts_with = "raw_pt")]
    auxtrace: bool,
    /// The file is DynamoRIO's <tid>.raw.pt (one listing per syscall window).
    #[arg(long = "raw-pt", conflicts_with = "ptt")]
    raw_pt: bool,
    /// The file is a `pttrace run` thread file (<pid>-<nonce>-<tid>.ptt).
    #[arg(long, conflicts_with = "auxtrace")]
    ptt: bool,
    /// Damaged input (undecodable packets, a torn or corrupt record, a container record
    /// that does not fit): list what could be read and exit 0 (the damage is still listed
    /// on stderr).
    #[command(flatten)]
    policy: crate::damage::Policy,
    /// CPU that recorded the trace, FAMILY/MODEL[/STEPPING] (its errata change how some
    /// packets are read), as ptdump's --cpu.
    #[arg(long, value_name = "F/M[/S]")]
    cpu: Option<String>,
    /// List from byte 0 instead of the first PSB, as ptdump's --no-sync.
    #[arg(long)]
    no_sync: bool,
    /// Leave out the offset column, as ptdump's --no-offset.
    #[arg(long)]
    no_offset: bool,
    /// Show each packet's bytes in hex, as ptdump's --raw.
    #[arg(long)]
    raw: bool,
    /// Show the last IP each IP packet makes, as ptdump's --lastip.
    #[arg(long)]
    lastip: bool,
    /// Show MODE.Exec's execution mode, as ptdump's --exec-mode.
    #[arg(long)]
    exec_mode: bool,
    /// Leave out PAD packets, as ptdump's --no-pad.
    #[arg(long)]
    no_pad: bool,
    /// Leave out timing packets (TSC, CBR, TMA, MTC, CYC), as ptdump's --no-timing.
    #[arg(long)]
    no_timing: bool,
    /// Leave out CYC packets (and do not track time by them), as ptdump's --no-cyc.
    #[arg(long)]
    no_cyc: bool,
    /// Show the time libipt estimates (its TSC) on timing packets, as ptdump's --time.
    #[arg(long, conflicts_with = "tcal")]
    time: bool,
    /// Show the time calibration (fast-counter:cycles ratio) on timing packets, as
    /// ptdump's --tcal.
    #[arg(long)]
    tcal: bool,
    /// Show --time or --tcal as the change since the last value shown, as ptdump's
    /// --time-delta.
    #[arg(long)]
    time_delta: bool,
    /// With --time/--tcal: no calibration (CYC packets do not move the time), as
    /// ptdump's --no-tcal.
    #[arg(long)]
    no_tcal: bool,
    /// With --time: before the first TSC, show the time counted from 0 instead of an
    /// error, as ptdump's --no-wall-clock.
    #[arg(long)]
    no_wall_clock: bool,
    /// With --time/--tcal: an OVF keeps the calibration, as ptdump's --keep-tcal-on-ovf.
    #[arg(long)]
    keep_tcal_on_ovf: bool,
    /// The MTC frequency the trace was recorded with (the PT event's mtc_period), for
    /// --time/--tcal, as ptdump's --mtc-freq.
    #[arg(long, value_name = "N")]
    mtc_freq: Option<u8>,
    /// The nominal core:bus ratio (calibrates cycles from CBR), for --time/--tcal, as
    /// ptdump's --nom-freq.
    #[arg(long, value_name = "N")]
    nom_freq: Option<u8>,
    /// CPUID leaf 0x15's EAX (the TSC:crystal clock ratio's denominator), for
    /// --time/--tcal, as ptdump's --cpuid-0x15.eax.
    #[arg(long = "cpuid-0x15.eax", value_name = "N")]
    cpuid_0x15_eax: Option<u32>,
    /// CPUID leaf 0x15's EBX (the ratio's numerator), as ptdump's --cpuid-0x15.ebx.
    #[arg(long = "cpuid-0x15.ebx", value_name = "N")]
    cpuid_0x15_ebx: Option<u32>,
}

pub fn run(args: Args) -> CmdResult {
    let name = args.file.display().to_string();
    let mut opts = ListOptions {
        cpu: None,
        no_sync: args.no_sync,
        last_ip: args.lastip,
        exec_mode: args.exec_mode,
        no_pad: args.no_pad,
        no_timing: args.no_timing,
        no_cyc: args.no_cyc,
        time: None,
    };
    if args.time || args.tcal {
        opts.time = Some(TimeColumns {
            column: if args.time {
                TimeColumn::Tsc
            } else {
                TimeColumn::Fcr
            },
            delta: args.time_delta,
            no_tcal: args.no_tcal,
            no_wall_clock: args.no_wall_clock,
            keep_tcal_on_ovf: args.keep_tcal_on_ovf,
            cfg: TimeCfg {
                mtc_freq: args.mtc_freq.unwrap_or(0),
                nom_freq: args.nom_freq.unwrap_or(0),
                cpuid_0x15_eax: args.cpuid_0x15_eax.unwrap_or(0),
                cpuid_0x15_ebx: args.cpuid_0x15_ebx.unwrap_or(0),
                skl168: false,
            },
        });
    } else if let Some(o) = [
        (args.time_delta, "--time-delta"),
        (args.no_tcal, "--no-tcal"),
        (args.no_wall_clock, "--no-wall-clock"),
        (args.keep_tcal_on_ovf, "--keep-tcal-on-ovf"),
        (args.mtc_freq.is_some(), "--mtc-freq"),
        (args.nom_freq.is_some(), "--nom-freq"),
        (args.cpuid_0x15_eax.is_some(), "--cpuid-0x15.eax"),
        (args.cpuid_0x15_ebx.is_some(), "--cpuid-0x15.ebx"),
    ]
    .iter()
    .find(|o| o.0)
    {
        // (ptdump takes these and shows nothing of them.)
        eprintln!(
            "pttrace dump: note: {} changes nothing without --time or --tcal",
            o.1
        );
    }
    if let Some(c) = &args.cpu {
        let (family, model, stepping) = CpuParams::parse_cpu(c)?;
        if let Some(w) = drpttracer::decode::errata::cpu_warning(family, model) {
            eprintln!("pttrace dump: warning: --cpu {c}: {w}");
        }
        opts.cpu = Some(CpuParams {
            family,
            model,
            stepping,
            ..Default::default()
        });
    }
    let dir = args.file.is_dir() && !(args.raw_pt || args.auxtrace);
    // A `run` thread file is listed as one, with --ptt or without (raw PT never starts
    // with its header).
    let ptt =
        args.ptt || !(args.raw_pt || args.auxtrace) && crate::text::is_thread_file(&args.file);
    // A directory's damage and losses are found file by file as `report` finds them.
    let (mut damages, files_checked) = if dir {
        crate::tracedir::of_trace(&args.file)
    } else {
        (Damages::default(), false)
    };
    // The thread files to list (a directory's, or the one given with --ptt), with their
    // heading lines; else the one file of another kind.
    let threads: Vec<(PathBuf, Option<String>)> = if dir {
        let trace = drpttracer::decode::ptt_dir::open(&args.file)?;
        damages.add_skipped(&trace.skipped);
        trace
            .threads
            .iter()
            .map(|th| {
                let cmd = trace
                    .process_of(th)
                    .map(|p| p.cmdline.clone())
                    .unwrap_or_default();
                let head = format!(
                    "# thread {}/{} ({}): {}",
                    th.header.pid,
                    th.header.tid,
                    th.path.display(),
                    cmd
                );
                (
                    th.path.clone(),
                    Some(crate::text::printable(&head).into_owned()),
                )
            })
            .collect()
    } else if ptt {
        vec![(args.file.clone(), None)]
    } else {
        Vec::new()
    };
    if dir && threads.is_empty() {
        return Err(format!("{name}: no thread files: there is nothing to dump").into());
    }
    let data = if threads.is_empty() {
        std::fs::read(&args.file).map_err(|e| format!("{name}: cannot read: {e}"))?
    } else {
        Vec::new()
    };
    if threads.is_empty() && data.is_empty() {
        return Err(format!("{name}: empty: there is nothing to dump").into());
    }
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if opts.cpu.is_some_and(|c| c.family == 0) {
        // ptdump's own line for a CPU it cannot look errata up for (the warning above
        // says what to give instead); the listing goes on as ptdump's does.
        writeln!(out, "[0: failed to determine errata: unknown cpu]")?;
    }
    // Undecodable packets, by the file offset of the PT they are in.
    let mut bad_packets: Vec<(String, u64, String)> = Vec::new();
    // OVF packets: what the hardware or the backend lost, reported as decode reports it.
    let mut overflows = 0u64;
    let mut line = String::new();
    let mut list =
        |out: &mut BufWriter<_>, file: &str, pt: &[u8], base: u64| -> std::io::Result<()> {
            for l in list_packets_with(pt, opts) {
                match &l {
                    // (What ptdump says about the last IP or the time it tracks: no damage.)
                    PacketLine::Diagnostic { .. } => {}
                    PacketLine::Error { offset, error, .. } => {
                        bad_packets.push((
                            file.to_string(),
                            base + offset,
                            format!("undecodable PT: {error}"),
                        ));
                    }
                    // Not listed (as ptdump): the damage list on stderr says it.
                    PacketLine::Unlisted { offset, why } => {
                        bad_packets.push((
                            file.to_string(),
                            base + offset,
                            format!("undecodable PT: {why}"),
                        ));
                        continue;
                    }
                    PacketLine::Packet { name: "ovf", .. } => overflows += 1,
                    PacketLine::Packet { .. } => {}
                }
                let bytes = match &l {
                    PacketLine::Packet { offset, size, .. } if args.raw => usize::try_from(*offset)
                        .ok()
                        .and_then(|o| pt.get(o..o.checked_add(*size as usize)?)),
                    _ => None,
                };
                line.clear();
                l.write_ptdump(&mut line, args.no_offset, bytes);
                line.push('\n');
                out.write_all(line.as_bytes())?;
            }
            Ok(())
        };
    let r = if args.raw_pt {
        let (f, damage) = pdb::parse_prefix(&data).map_err(|e| format!("{name}: {e}"))?;
        if let Some(e) = damage {
            damages.add(&name, e.offset, e.message);
        }
        (|| -> std::io::Result<()> {
            for w in &f.windows {
                writeln!(
                    out,
                    "# syscall #{} sysnum {} ({} bytes of PT at file offset {:#x})",
                    w.syscall_idx,
                    w.sysnum,
                    w.pt.len(),
                    w.pt.start
                )?;
                list(&mut out, &name, &data[w.pt.clone()], w.pt.start as u64)?;
            }
            Ok(())
        })()
    } else if !threads.is_empty() {
        let mut r = Ok(());
        for (path, head) in &threads {
            let file = path.display().to_string();
            let input = drpttracer::decode::ptt_input::read_thread(path)?;
            if !files_checked {
                damages.add_tail(&file, &input.tail);
            }
            if let Some(rec) = &input.recovered {
                eprintln!(
                    "pttrace dump: {}: {}",
                    crate::text::printable(&file),
                    crate::text::recovered_text(rec)
                );
            }
            let windows = drpttracer::decode::ptt_input::read_windows(&file, &input.data)?;
            r = (|| -> std::io::Result<()> {
                if let Some(h) = head {
                    writeln!(out, "{h}")?;
                }
                for w in &windows {
                    writeln!(
                        out,
                        "# window {} syscall {} ({} bytes of PT at file offset {:#x})",
                        w.window.index,
                        w.window.nr,
                        w.pt.len(),
                        w.pt_file_offset
                    )?;
                    list(&mut out, &file, w.pt, w.pt_file_offset)?;
                }
                Ok(())
            })();
            if r.is_err() {
                break;
            }
        }
        r
    } else if args.auxtrace {
        let (a, damage) = auxtrace::unwrap_prefix(&data);
        if let Some(e) = damage {
            damages.add(&name, e.offset, e.message);
        }
        // Offsets in the unwrapped PT (the chunks are listed as one stream).
        list(&mut out, &name, &a.pt, 0)
    } else {
        list(&mut out, &name, &data, 0)
    };
    let r = r.and_then(|_| out.flush());
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
        Ok(()) => {
            for (file, offset, what) in bad_packets {
                damages.add(&file, offset, what);
            }
            damages.note_overflows(overflows);
            damages.finish("dump", args.policy)
        }
    }
}
