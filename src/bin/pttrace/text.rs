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

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("ls /"), "ls /");
        assert_eq!(printable("a\u{1b}[31mred\\"), "a\\x1b[31mred\\\\");
        assert_eq!(printable("tab\there\n"), "tab\\x09here\\x0a");
        assert_eq!(printable("c1\u{9b}"), "c1\\x9b");
        assert_eq!(printable("ünïcode"), "ünïcode");
    }
}
