//! `pttrace decode` (not yet implemented).

use crate::CmdResult;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> CmdResult {
    Err("'decode' is not implemented yet".into())
}
