//! Progress of long work (`decode`, `view`) on a terminal: a bar over the PT bytes to
//! decode, on stderr, only when stderr is a terminal and the input is large enough to be
//! worth one (nothing when stderr goes to a pipe or a file: scripts, CI logs).

use std::io::IsTerminal;

/// Inputs smaller than this decode too fast for a bar.
const MIN_BYTES: u64 = 1 << 20;

/// A bar over `total` PT bytes, or `None` (not on a terminal, or a small input).
pub fn pt_bytes(total: u64) -> Option<indicatif::ProgressBar> {
    if total < MIN_BYTES || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {elapsed} ETA {eta}",
    ) {
        b.set_style(style);
    }
    Some(b)
}

/// PT bytes in the windows of `trace`'s thread files (their sizes bound it).
pub fn trace_bytes(trace: &drpttracer::decode::ptt_dir::PttTrace) -> u64 {
    trace
        .threads
        .iter()
        .map(|t| std::fs::metadata(&t.path).map_or(0, |m| m.len()))
        .sum()
}
