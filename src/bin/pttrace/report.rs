//! `pttrace report` (not yet implemented).

use crate::CmdResult;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> CmdResult {
    Err("'report' is not implemented yet".into())
}
