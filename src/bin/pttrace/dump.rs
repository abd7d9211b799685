//! `pttrace dump`: packet listing of a PT file (like ptdump).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use drpttracer::decode::packets::{list_packets, PacketLine};
use drpttracer::format::{auxtrace, pdb};

use crate::CmdResult;

#[derive(clap::Args)]
pub struct Args {
    /// The trace: raw PT, an AUXTRACE stream (--auxtrace), a .raw.pt file (--raw-pt) or a
    /// pttrace thread file (--ptt).
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
}

pub fn run(args: Args) -> CmdResult {
    let name = args.file.display().to_string();
    let data = std::fs::read(&args.file).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut errors = 0usize;
    let mut list = |out: &mut BufWriter<_>, pt: &[u8]| -> std::io::Result<()> {
        for l in list_packets(pt) {
            if matches!(l, PacketLine::Error { .. }) {
                errors += 1;
            }
            writeln!(out, "{l}")?;
        }
        Ok(())
    };
    let r = if args.raw_pt {
        let f = pdb::parse(&data).map_err(|e| format!("{name}: {e}"))?;
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
                list(&mut out, &data[w.pt.clone()])?;
            }
            Ok(())
        })()
    } else if args.ptt {
        let windows = drpttracer::decode::ptt_input::read_windows(&name, &data)?;
        (|| -> std::io::Result<()> {
            for w in &windows {
                writeln!(
                    out,
                    "# window {} syscall {} ({} bytes of PT at file offset {:#x})",
                    w.window.index,
                    w.window.nr,
                    w.pt.len(),
                    w.pt_file_offset
                )?;
                list(&mut out, w.pt)?;
            }
            Ok(())
        })()
    } else if args.auxtrace {
        let a = auxtrace::unwrap(&data).map_err(|e| format!("{name}: {e}"))?;
        list(&mut out, &a.pt)
    } else {
        list(&mut out, &data)
    };
    let r = r.and_then(|_| out.flush());
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
        Ok(()) if errors > 0 => {
            Err(format!("{name}: {errors} decode errors (listed above)").into())
        }
        Ok(()) => Ok(()),
    }
}
