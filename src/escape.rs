//! Untrusted text made safe for a terminal: names and paths from checkpoints, hub repos, mappings,
//! configs and manifests reach wload's human output, and a terminal obeys the control characters in
//! them (ESC sequences clear the screen or set the title, CR and BS overwrite what was printed, a
//! newline starts a line that looks like wload's own, `ok: vLLM would load …`, and bidi overrides
//! reorder what is shown).
//!
//! Two layers, because neither alone is enough:
//!
//! - **At the boundary**, [`Terminal`] wraps every writer of human text (stdout for the reports,
//!   stderr for errors and notes, in `src/app/`): whatever reaches it, whoever formatted
//!   it, leaves with every control character but `\n` and `\t` written as a visible escape. Nothing
//!   printed for people bypasses it, so a forgotten call cannot let an ESC through.
//! - **Where a value is formatted** into a line, [`Esc`] (or [`escape`]) escapes `\n` and `\t` too:
//!   the boundary cannot tell a newline wload writes from one inside a name, so a name must lose
//!   its newlines before it joins a line. Table cells ([`crate::report::Table`]) are escaped by the
//!   table itself, and an error's message by [`crate::Error::for_terminal`], where the few
//!   multi-line messages escape each line's values and every other message is one line whole.
//!
//! The escapes are those of Rust's `escape_debug`, readable and unambiguous about which character
//! it was: `\n`, `\r`, `\t`, `\0`, `\x1b` for the other C0 controls and DEL, `\u{85}` for C1 and
//! the Unicode format characters that reorder or break lines (U+061C, U+200E/F, U+2028/9,
//! U+202A–E, U+2066–9), `\xNN` for a byte that is not UTF-8. Unlike `escape_debug`, quotes and
//! backslashes stay as they are: a name's ordinary characters print unchanged, and `--json`
//! carries every string exactly, escaped by JSON's rules and by nothing else (ls and fd quote
//! names the same way, only when a name needs it).

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};

/// Whether a terminal could act on `c` rather than show it: C0 and C1 controls, DEL, and the
/// Unicode formatting characters that reorder text or break lines.
pub fn is_control(c: char) -> bool {
    matches!(
        c,
        '\0'..='\x1f'
            | '\x7f'..='\u{9f}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// A cheap first look: false means no character of `s` is a control ([`is_control`]). The
/// lead bytes of every multi-byte control are C2 (C1), D8 (U+061C) and E2 (the U+20xx ones).
fn may_have_control(s: &str) -> bool {
    s.bytes()
        .any(|b| b < 0x20 || b == 0x7f || b == 0xc2 || b == 0xd8 || b == 0xe2)
}

/// Writes `c`'s visible escape.
fn write_escape(out: &mut impl fmt::Write, c: char) -> fmt::Result {
    match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        '\0' => out.write_str("\\0"),
        c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    }
}

/// Writes `s` with every control but those `keep` accepts escaped.
fn write_escaped(out: &mut impl fmt::Write, s: &str, keep: fn(char) -> bool) -> fmt::Result {
    let mut rest = s;
    while let Some((at, c)) = rest
        .char_indices()
        .find(|&(_, c)| is_control(c) && !keep(c))
    {
        out.write_str(&rest[..at])?;
        write_escape(out, c)?;
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)
}

fn keep_none(_: char) -> bool {
    false
}

fn keep_line_ends(c: char) -> bool {
    c == '\n' || c == '\t'
}

/// `s` with every control character escaped, `\n` and `\t` included: one line, whatever it holds.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !may_have_control(s) || !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    write_escaped(&mut out, s, keep_none).expect("writing to a String does not fail");
    Cow::Owned(out)
}

/// [`escape`] as a `Display`, to format an untrusted value into a line without a `String`.
pub struct Esc<'a>(pub &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if may_have_control(self.0) {
            write_escaped(f, self.0, keep_none)
        } else {
            f.write_str(self.0)
        }
    }
}

/// A shell command line for people to copy ([`crate::sharded::serve::shell_quote`]'s words): every
/// control escaped but `\t`, which inside a quoted word is what the shell is to get, and which a
/// terminal only moves to a tab stop. A newline would make a pasted line two commands: it is
/// escaped, and `--json` has the exact line.
pub struct EscShell<'a>(pub &'a str);

fn keep_tab(c: char) -> bool {
    c == '\t'
}

impl fmt::Display for EscShell<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, keep_tab)
    }
}

/// A writer of text for people: escapes every control character ([`is_control`]) except `\n` and
/// `\t`, and every byte that is not UTF-8, before it reaches `inner`. A character split across two
/// writes is held until its end arrives (or written as `\xNN` bytes at [`Terminal::flush`]).
pub struct Terminal<W: Write> {
    inner: W,
    /// The start of a UTF-8 sequence whose end has not been written yet (at most 3 bytes).
    pending: Vec<u8>,
    /// Reused for each write's escaped text.
    buf: String,
}

impl<W: Write> Terminal<W> {
    pub fn new(inner: W) -> Terminal<W> {
        Terminal {
            inner,
            pending: Vec::new(),
            buf: String::new(),
        }
    }

    /// Escapes `bytes` into `buf`; returns how many trailing bytes start a character not yet complete.
    fn escape_into(buf: &mut String, bytes: &[u8], at_end: bool) -> usize {
        let mut rest = bytes;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    let _ = write_escaped(buf, s, keep_line_ends);
                    return 0;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // Valid by definition of `valid_up_to`.
                    let s = std::str::from_utf8(valid).unwrap_or_default();
                    let _ = write_escaped(buf, s, keep_line_ends);
                    let bad = match e.error_len() {
                        Some(n) => n,
                        None if !at_end => return after.len(),
                        None => after.len(),
                    };
                    for b in &after[..bad] {
                        let _ = fmt::Write::write_fmt(buf, format_args!("\\x{b:02x}"));
                    }
                    rest = &after[bad..];
                }
            }
        }
    }

    fn emit(&mut self, bytes: &[u8], at_end: bool) -> io::Result<()> {
        let joined;
        let all: &[u8] = if self.pending.is_empty() {
            bytes
        } else {
            let mut j = std::mem::take(&mut self.pending);
            j.extend_from_slice(bytes);
            joined = j;
            &joined
        };
        self.buf.clear();
        let held = Self::escape_into(&mut self.buf, all, at_end);
        self.pending = all[all.len() - held..].to_vec();
        self.inner.write_all(self.buf.as_bytes())
    }

    /// The writer inside, once everything written has been flushed to it.
    #[cfg(test)]
    fn into_inner(mut self) -> io::Result<W> {
        self.flush()?;
        let Terminal { inner, .. } = self;
        Ok(inner)
    }
}

impl<W: Write> Write for Terminal<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        // Plain text (every byte printable ASCII, a newline or a tab) goes straight through.
        if self.pending.is_empty()
            && bytes
                .iter()
                .all(|&b| (0x20..0x7f).contains(&b) || b == b'\n' || b == b'\t')
        {
            self.inner.write_all(bytes)?;
        } else {
            self.emit(bytes, false)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.emit(&pending, true)?;
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str =
        "a\x1b[2J\x1b]0;t\x07\r\x08\0\x7f\u{85}\u{9b}\u{202e}\u{2066}\u{2028}b\n\tc";

    #[test]
    fn every_control_is_escaped_visibly_in_a_value() {
        assert_eq!(
            escape(HOSTILE),
            r"a\x1b[2J\x1b]0;t\x07\r\x08\0\x7f\u{85}\u{9b}\u{202e}\u{2066}\u{2028}b\n\tc"
        );
        assert_eq!(Esc(HOSTILE).to_string(), escape(HOSTILE));
        assert_eq!(EscShell("'a\tb\nc'").to_string(), "'a\tb\\nc'");
        assert!(!escape(HOSTILE).chars().any(is_control));
    }

    #[test]
    fn ordinary_text_is_unchanged_and_not_copied() {
        for s in [
            "model.layers.0.q_proj.weight",
            "ünïcode.模型 'q' \"d\" \\x1b",
            "€ — é",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(_)), "{s}");
            assert_eq!(Esc(s).to_string(), s);
        }
    }

    fn through_terminal(chunks: &[&[u8]]) -> String {
        let mut t = Terminal::new(Vec::new());
        for c in chunks {
            t.write_all(c).unwrap();
        }
        String::from_utf8(t.into_inner().unwrap()).unwrap()
    }

    #[test]
    fn the_terminal_writer_keeps_line_ends_and_escapes_the_rest() {
        assert_eq!(
            through_terminal(&[HOSTILE.as_bytes()]),
            "a\\x1b[2J\\x1b]0;t\\x07\\r\\x08\\0\\x7f\\u{85}\\u{9b}\\u{202e}\\u{2066}\\u{2028}b\n\tc"
        );
        assert_eq!(through_terminal(&[b"plain\n"]), "plain\n");
    }

    #[test]
    fn a_character_split_across_writes_is_judged_whole() {
        let rlo = "\u{202e}".as_bytes();
        let e_acute = "é".as_bytes();
        let out = through_terminal(&[
            b"x",
            &rlo[..1],
            &rlo[1..2],
            &rlo[2..],
            &e_acute[..1],
            &e_acute[1..],
        ]);
        assert_eq!(out, "x\\u{202e}é");
        // Bytes that never become a character are shown as bytes, even at the end.
        assert_eq!(through_terminal(&[b"a\xff", &rlo[..2]]), "a\\xff\\xe2\\x80");
    }
}
