//! One way for every reader command (`decode`, `dump`, `report`) to tell about damaged
//! input: each damaged place as `damaged: FILE: byte OFFSET: WHAT` on stderr, then a
//! non-zero exit unless the user passed `--keep-going` (the summary is printed either way).

use super::text::printable;
use crate::CmdResult;
use drpttracer::decode::input::{tail_damage, InputDamage};
use drpttracer::format::ptt::Tail;

/// The position of a damage that concerns a whole file (no byte applies).
pub const WHOLE_FILE: u64 = drpttracer::decode::WHOLE_INPUT;

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

    /// Prints what was lost and every damaged place on stderr and decides the exit: an
    /// error for damage unless `keep_going`.
    pub fn finish(&self, cmd: &str, keep_going: bool) -> CmdResult {
        if let Some(l) = &self.1 {
            eprintln!("pttrace {cmd}: lost: {l}");
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
        if n == 0 {
            return Ok(());
        }
        let places = if n == 1 { "place" } else { "places" };
        if keep_going {
            eprintln!("pttrace {cmd}: continued past {n} damaged {places} (--keep-going)");
            return Ok(());
        }
        Err(format!(
            "the input is damaged in {n} {places} (listed above); what could be read was \
             used; pass --keep-going to accept that with exit status 0"
        )
        .into())
    }
}
