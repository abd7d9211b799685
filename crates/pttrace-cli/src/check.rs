//! `pttrace check`: whether Intel PT is usable here, why not, and the backend per mode;
//! whether the QEMU backend of `pttrace run` is available.

use crate::CmdResult;

#[derive(clap::Args)]
pub struct Args {
    /// Exit with status 1 when Intel PT hardware is not usable.
    #[arg(long)]
    pub require_hardware: bool,
}

pub fn run(args: Args) -> CmdResult {
    let report = drpttracer::probe::probe();
    print!("{report}");
    print_qemu();
    if args.require_hardware && !report.pt_usable {
        return Err("Intel PT hardware is required (--require-hardware) but not usable".into());
    }
    Ok(())
}

/// The QEMU backend's line: emulator and plugin found, and what `pttrace run` picks.
fn print_qemu() {
    use super::qemu;
    let q = qemu::find_qemu(None);
    let p = qemu::find_plugin(None);
    let hw = drpttracer::perf::pmu::IntelPtPmu::probe().is_ok();
    println!("QEMU backend (pttrace run --backend qemu: whole programs, user mode, software PT):");
    match (&q, &p) {
        (Ok(q), Ok(p)) => {
            let v = qemu::qemu_version(q).unwrap_or_else(|| "version unknown".into());
            println!("  [ ok ] {} ({v})", q.display());
            println!("  [ ok ] plugin {}", p.display());
            if hw {
                println!("  pttrace run uses it when asked (--backend qemu); Intel PT hardware is the default here");
            } else {
                println!(
                    "  pttrace run -- PROG (no flags: user code in thread windows) uses it on \
                     this machine"
                );
            }
        }
        _ => {
            for r in [&q, &p] {
                match r {
                    Ok(path) => println!("  [ ok ] {}", path.display()),
                    Err(e) => println!("  [FAIL] {e}"),
                }
            }
            println!(
                "  pttrace run -- PROG (no flags: user code in thread windows) single-steps \
                 instead (slow)"
            );
        }
    }
}
