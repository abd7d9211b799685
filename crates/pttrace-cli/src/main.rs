//! `pttrace`: check, run, decode, dump and report Intel PT traces.

mod carried;
mod check;
mod damage;
mod decode;
mod dump;
mod interrupt;
mod names;
mod orphans;
mod outfile;
mod profile;
mod progress;
mod qemu;
mod report;
mod run;
mod snapshot;
mod text;
mod tracedir;
mod view;

use clap::{Parser, Subcommand};

/// Result of a subcommand; errors are printed as `pttrace <cmd>: <message>`.
pub type CmdResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Parser)]
#[command(
    name = "pttrace",
    version,
    about = "Intel Processor Trace capture and decode"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tell whether Intel PT is usable here, why not, and which backend each mode uses.
    Check(check::Args),
    /// Run a program traced: under the LD_PRELOAD shim (syscall windows; hardware PT or
    /// single-stepping), or under QEMU with pttrace's plugin (whole program, software PT).
    Run(Box<run::Args>),
    /// Decode PT (+ sideband + images) into instruction records.
    Decode(decode::Args),
    /// List the packets of a PT file, like ptdump.
    Dump(dump::Args),
    /// Summarize a trace directory written by `pttrace run`.
    Report(report::Args),
    /// Pictures of a `pttrace run` trace: timelines of the function calls (Perfetto
    /// protobuf with every call; Chrome trace JSON and speedscope, bounded), a flame graph
    /// (SVG) and collapsed stacks, in memory bounded by the call depth.
    View(view::Args),
    /// Profiles from a trace: BOLT's branch profile of a binary (exact counts, for
    /// `llvm-bolt -pa -p`), or its line coverage in lcov's format (for `genhtml`).
    Profile(profile::Args),
}

fn main() -> std::process::ExitCode {
    // Output piped into `head` and the like ends quietly on a closed pipe, as with C tools,
    // instead of a panic in `println!` (Rust ignores SIGPIPE by default).
    // SAFETY: first thing in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let (name, result) = match cli.command {
        Command::Check(a) => ("check", check::run(a)),
        Command::Run(a) => ("run", run::run(*a)),
        Command::Decode(a) => ("decode", decode::run(a)),
        Command::Dump(a) => ("dump", dump::run(a)),
        Command::Report(a) => ("report", report::run(a)),
        Command::View(a) => ("view", view::run(a)),
        Command::Profile(a) => ("profile", profile::run(a)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Bytes from trace files reach the terminal escaped (line breaks kept).
            let text = e.to_string();
            let lines: Vec<_> = text.lines().map(text::printable).collect();
            eprintln!("pttrace {name}: {}", lines.join("\n"));
            // Reader commands: 1 where the output is complete for what could be read
            // (damaged or lossy input), 2 where there is none (an unusable input).
            let partial = e.is::<damage::Partial>();
            let reader = matches!(name, "decode" | "dump" | "report" | "view" | "profile");
            std::process::ExitCode::from(if reader && !partial { 2 } else { 1 })
        }
    }
}
