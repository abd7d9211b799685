//! Text that comes from input files (command lines, paths, notes, reasons) printed on a
//! terminal: control characters are escaped (`\x1b`), so a trace cannot send escape
//! sequences to the user's terminal.

use std::borrow::Cow;

/// `s` with every control character (C0, DEL, C1) written as `\xNN` or `\u{NNNN}`, and
/// backslashes doubled where anything was escaped.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `name(arg, …)` of a syscall that was entered and had not returned when its process
/// died (from a spool, see `drpttracer::format::spool`).
pub fn in_flight_text(f: &drpttracer::format::spool::InFlight) -> String {
    let name = drpttracer::shim::sysnames::name(f.nr)
        .map_or_else(|| format!("syscall {}", f.nr), String::from);
    let args: Vec<String> = f.args.iter().map(|a| format!("{a:#x}")).collect();
    let depth = if f.depth > 0 {
        format!(" (in a signal handler, nesting depth {})", f.depth)
    } else {
        String::new()
    };
    format!("{name}({}){depth}", args.join(", "))
}

/// One line on what a thread's spool gave its file after the process died.
pub fn recovered_text(r: &drpttracer::format::spool::Recovered) -> String {
    let mut s = format!(
        "the process died before writing everything: {} recovered from the spool",
        count(r.windows, "window")
    );
    if r.dropped > 0 {
        s.push_str(&format!(", {} counted", count(r.dropped, "dropped window")));
    }
    if r.in_flight.is_empty() {
        s.push_str("; no syscall was in flight");
    } else {
        let v: Vec<String> = r.in_flight.iter().map(in_flight_text).collect();
        s.push_str(&format!("; in flight (never returned): {}", v.join(", ")));
    }
    if r.flags & drpttracer::format::spool::FLAG_IN_FLIGHT_OVERFLOW as u32 != 0 {
        s.push_str("; syscalls nested 16 or more signal handlers deep were not tracked");
    }
    s
}

/// Reads a text file, naming the byte and line of the first byte that is not UTF-8.
pub fn read_text(path: &std::path::Path) -> Result<String, String> {
    let name = printable(&path.display().to_string()).into_owned();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        format!("{name}: byte {at} (line {line}): not UTF-8 text")
    })
}

/// `n` and the noun, singular for one: `count(1, "thread")` is "1 thread", `count(2,
/// "process")` "2 processes" (nouns ending in s, x or ch take -es).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else if noun.ends_with('s') || noun.ends_with('x') || noun.ends_with("ch") {
        format!("{n} {noun}es")
    } else {
        format!("{n} {noun}s")
    }
}

/// Whether `path` is a `pttrace run` thread file: it starts with the trace files' magic
/// and a thread file's kind (whatever its version: its reader says what it makes of that).
pub fn is_thread_file(path: &std::path::Path) -> bool {
    use drpttracer::format::ptt::{FileKind, MAGIC};
    use std::io::Read;
    let mut head = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head[..8] == MAGIC
        && head[12..16] == (FileKind::Thread as u32).to_le_bytes()
}

/// What a command says of a thread file without `End` record: its trace stops at its
/// last window.
pub fn unended_note(file: &std::path::Path) -> String {
    printable(&format!(
        "note: {}: no End record: the thread was killed (by a signal, or by another \
         thread's execve) or is still running; its trace stops at the end of its last \
         window: what it ran after is not in the file",
        file.display()
    ))
    .into_owned()
}

#[cfg(test)]
mod tests {
    use super::{count, printable, read_text};

    #[test]
    fn counts_say_one_in_the_singular() {
        assert_eq!(count(0u64, "thread"), "0 threads");
        assert_eq!(count(1u64, "thread"), "1 thread");
        assert_eq!(count(2u32, "thread image"), "2 thread images");
        assert_eq!(count(1u32, "process"), "1 process");
        assert_eq!(count(5u64, "process"), "5 processes");
        assert_eq!(count(3u64, "function span"), "3 function spans");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("ls /"), "ls /");
        assert_eq!(printable("a\u{1b}[31mred\\"), "a\\x1b[31mred\\\\");
        assert_eq!(printable("tab\there\n"), "tab\\x09here\\x0a");
        assert_eq!(printable("c1\u{9b}"), "c1\\x9b");
        assert_eq!(printable("ünïcode"), "ünïcode");
    }

    #[test]
    fn text_files_name_the_first_byte_that_is_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kallsyms");
        std::fs::write(
            &f,
            b"ffffffff81000000 T _text\nffffffff81000010 T \xffbad\n",
        )
        .unwrap();
        assert_eq!(
            read_text(&f).unwrap_err(),
            format!("{}: byte 44 (line 2): not UTF-8 text", f.display())
        );
        std::fs::write(&f, b"ok\n").unwrap();
        assert_eq!(read_text(&f).unwrap(), "ok\n");
        assert!(read_text(&dir.path().join("none"))
            .unwrap_err()
            .contains("none: cannot read: "));
    }
}
