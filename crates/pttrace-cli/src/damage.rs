//! One way for every reader command (`decode`, `dump`, `report`, `view`) to tell about
//! damaged or lossy input: what the recording lost as one `lost: …` line and each damaged
//! place as `damaged: FILE: byte OFFSET: WHAT` on stderr, after the full output; then exit
//! status 1 ([`Partial`]) unless the user passed `--keep-going`. Any other error of a reader
//! command (an unusable input) is status 2 (`main`).

use super::text::printable;
use crate::CmdResult;
use drpttracer::decode::input::{tail_damage, InputDamage};
use drpttracer::format::ptt::Tail;

/// The position of a damage that concerns a whole file (no byte applies).
pub const WHOLE_FILE: u64 = drpttracer::decode::WHOLE_INPUT;

/// The exit policy every reader command shares (one option, one help text).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Policy {
    /// Damaged or lossy input (a torn or corrupt record, a file or window missing; windows
    /// the recording lost, PT overflows): use what could be read and exit 0. Without it such
    /// input makes the exit status 1, after the full output; an unusable input is status 2.
    /// Either way each damage and loss is listed on stderr.
    #[arg(long)]
    pub keep_going: bool,
}

/// The error of a command whose output is complete for what could be read, but whose input
/// was damaged or lossy: exit status 1 (other errors of reader commands are 2).
#[derive(Debug)]
pub struct Partial(String);

impl std::fmt::Display for Partial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Partial {}

/// The damage met by one command.
#[derive(Debug, Default)]
pub struct Damages(pub Vec<InputDamage>, pub Option<String>);

impl Damages {
    pub fn add(&mut self, file: impl std::fmt::Display, offset: u64, what: impl Into<String>) {
        self.0.push(InputDamage::at(file.to_string(), offset, what));
    }

    /// Adds damage of a whole file (no byte applies: missing, unreadable).
    pub fn add_whole(&mut self, file: impl std::fmt::Display, what: impl Into<String>) {
        self.add(file, WHOLE_FILE, what);
    }

    /// Adds the files the decoder left out of a directory that the damage check did not
    /// name already (so no unusable file goes unreported).
    pub fn add_skipped(&mut self, skipped: &[drpttracer::decode::DecodeError]) {
        for e in skipped {
            if !self.0.iter().any(|d| d.file == e.source_name) {
                self.add(&e.source_name, e.offset, e.message.clone());
            }
        }
    }

    /// Adds the damage a file's frame tail shows, if any.
    pub fn add_tail(&mut self, file: impl std::fmt::Display, t: &Tail) {
        if let Some((offset, what)) = tail_damage(t) {
            self.add(file, offset, what);
        }
    }

    /// Notes what the trace lost while it was recorded (printed by [`Self::finish`], not
    /// damage: the exit status stays).
    pub fn set_losses(&mut self, losses: Option<String>) {
        self.1 = losses;
    }

    /// Notes the OVF packets met while decoding, unless the recording's own loss counts
    /// (the directory's window flags) already told.
    pub fn note_overflows(&mut self, n: u64) {
        if n > 0 && self.1.is_none() {
            self.1 = Some(format!(
                "{n} PT overflows (OVF packets): the instructions around each are missing \
                 from the output"
            ));
        }
    }

    /// Prints what was lost and every damaged place on stderr and decides the exit:
    /// [`Partial`] for damage or loss unless `policy.keep_going`.
    pub fn finish(&self, cmd: &str, policy: Policy) -> CmdResult {
        if let Some(l) = &self.1 {
            eprintln!("pttrace {cmd}: lost: {}", printable(l));
        }
        const SHOWN: usize = 50;
        if self.0.len() > SHOWN {
            eprintln!(
                "pttrace {cmd}: damaged: … {} more damaged places after these",
                self.0.len() - SHOWN
            );
        }
        for d in self.0.iter().take(SHOWN) {
            let at = match d.offset {
                WHOLE_FILE => String::new(),
                b => format!("byte {b}: "),
            };
            eprintln!(
                "pttrace {cmd}: damaged: {}: {at}{}",
                printable(&d.file),
                printable(&d.what)
            );
        }
        let n = self.0.len();
        let places = if n == 1 { "place" } else { "places" };
        let (short, what) = match (n, self.1.is_some()) {
            (0, false) => return Ok(()),
            (0, true) => (
                "a lossy trace".to_string(),
                "the trace is lossy (`lost:` above)".to_string(),
            ),
            (_, false) => (
                format!("{n} damaged {places}"),
                format!("the input is damaged in {n} {places} (listed above)"),
            ),
            (_, true) => (
                format!("{n} damaged {places} and a lossy trace"),
                format!("the input is damaged in {n} {places} and lossy (listed above)"),
            ),
        };
        if policy.keep_going {
            eprintln!("pttrace {cmd}: continued past {short} (--keep-going)");
            return Ok(());
        }
        Err(Partial(format!(
            "{what}; what could be read was used; pass --keep-going to accept that with \
             exit status 0"
        ))
        .into())
    }
}
