//! `pttrace check`: whether Intel PT is usable here, why not, and the backend per mode.

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
    if args.require_hardware && !report.pt_usable {
        return Err("Intel PT hardware is required (--require-hardware) but not usable".into());
    }
    Ok(())
}
