//! A list of problems for a terminal: a short list whole, a long one summarised by kind.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use super::Problem;
use crate::units::{plural, thousands};

/// At most this many problems of one kind are printed; the rest are counted.
pub(crate) const PROBLEMS_PER_KIND: usize = 5;
/// At most this many kinds of problem are printed; problems of the others are counted.
pub(crate) const PROBLEM_KINDS_SHOWN: usize = 20;

/// A refused plan's problems for a terminal. A short list is printed whole, in the order found.
/// A long one (a config claiming 20,000 layers yields 120,000 problems) is grouped by kind: the
/// first few of each kind, how many more there are, and a closing total; `--json` has them all.
pub(crate) struct ProblemList<'a>(pub &'a [Problem]);

/// How a problem's message and fix are embedded in the list's lines: as they are, or escaped.
type Embed = for<'s> fn(&'s str) -> Cow<'s, str>;

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.render(f, as_is)
    }
}

fn as_is(s: &str) -> Cow<'_, str> {
    Cow::Borrowed(s)
}

impl ProblemList<'_> {
    /// The list for a terminal: each message and fix escaped ([`crate::escape::escape`]), so
    /// that the list's only line breaks are its own, however the names in the messages read.
    pub(crate) fn for_terminal(&self) -> String {
        let mut s = String::new();
        self.render(&mut s, crate::escape::escape)
            .expect("writing to a String does not fail");
        s
    }

    fn render(&self, f: &mut dyn fmt::Write, embed: Embed) -> fmt::Result {
        let ps = self.0;
        write!(
            f,
            "{} problem{} found; vLLM would refuse this checkpoint or load it wrongly:",
            thousands(ps.len() as u64),
            plural(ps.len() as u64)
        )?;
        let kinds = problem_kinds(ps);
        let elided =
            kinds.len() > PROBLEM_KINDS_SHOWN || kinds.iter().any(|k| k.count > PROBLEMS_PER_KIND);
        let mut fixes = FixRun { open: None, embed };
        if !elided {
            for p in ps {
                fixes.problem(f, p)?;
            }
            return fixes.end(f);
        }
        let mut shown = 0;
        for k in kinds.iter().take(PROBLEM_KINDS_SHOWN) {
            for &i in &k.first {
                fixes.problem(f, &ps[i])?;
                shown += 1;
            }
            let more = k.count - k.first.len();
            if more > 0 {
                fixes.more(f, more, k.same_fix)?;
            }
        }
        fixes.end(f)?;
        if let Some(rest) = kinds.get(PROBLEM_KINDS_SHOWN..) {
            let n: usize = rest.iter().map(|k| k.count).sum();
            write!(
                f,
                "\n  … and {} more problem{} of {} other kind{}",
                thousands(n as u64),
                plural(n as u64),
                rest.len(),
                plural(rest.len() as u64)
            )?;
        }
        write!(
            f,
            "\n{} problems in all, {} shown above; pass --json for the complete list",
            thousands(ps.len() as u64),
            thousands(shown as u64)
        )
    }
}

/// Consecutive problems with the same fix (a wrong --tp refuses every layer's tensor for one
/// reason): their messages, then the fix once, for all of them.
struct FixRun<'a> {
    /// The run's fix and how many problems it covers so far.
    open: Option<(&'a str, usize)>,
    embed: Embed,
}

impl<'a> FixRun<'a> {
    fn problem(&mut self, f: &mut dyn fmt::Write, p: &'a Problem) -> fmt::Result {
        let fix = p.fix.as_deref();
        if self.open.map(|(open, _)| open) != fix {
            self.end(f)?;
            self.open = fix.map(|x| (x, 0));
        }
        write!(f, "\n  - {}", (self.embed)(&p.message))?;
        if let Some((_, n)) = &mut self.open {
            *n += 1;
        }
        Ok(())
    }

    /// `more` problems like the last one, not shown; the run's fix covers them when every
    /// problem of their kind has it (`same_fix`).
    fn more(&mut self, f: &mut dyn fmt::Write, more: usize, same_fix: bool) -> fmt::Result {
        if !same_fix {
            self.end(f)?;
        }
        write!(f, "\n  … and {} more like this", thousands(more as u64))?;
        if let Some((_, n)) = &mut self.open {
            *n += more;
        }
        Ok(())
    }

    /// Writes the open run's fix.
    fn end(&mut self, f: &mut dyn fmt::Write) -> fmt::Result {
        let embed = self.embed;
        match self.open.take() {
            Some((fix, 1)) => write!(f, "\n    fix: {}", embed(fix)),
            Some((fix, n)) => write!(
                f,
                "\n    fix (the {} above): {}",
                thousands(n as u64),
                embed(fix)
            ),
            None => Ok(()),
        }
    }
}

/// Problems of one kind: the indices of the first few, how many there are, and whether they all
/// have the first one's fix.
struct Kind {
    first: Vec<usize>,
    count: usize,
    same_fix: bool,
}

/// Kinds in the order their first problem was found.
fn problem_kinds(ps: &[Problem]) -> Vec<Kind> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut kinds: Vec<Kind> = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        let n = kinds.len();
        let k = *index.entry(problem_kind(&p.message)).or_insert(n);
        if k == n {
            kinds.push(Kind {
                first: Vec::new(),
                count: 0,
                same_fix: true,
            });
        }
        let kind = &mut kinds[k];
        kind.count += 1;
        if let Some(&first) = kind.first.first() {
            kind.same_fix &= ps[first].fix == p.fix;
        }
        if kind.first.len() < PROBLEMS_PER_KIND {
            kind.first.push(i);
        }
    }
    kinds
}

/// A message with what varies from one instance to the next masked: quoted names (`'…'`) and
/// numbers (layer indices, shapes, file numbers). Two problems of one kind differ only there.
/// A quote opens only after a non-alphanumeric character and closes only before one, so that
/// the apostrophe of "vLLM's" is prose, not a quote.
fn problem_kind(message: &str) -> String {
    let mut kind = String::with_capacity(message.len());
    let mut quoted = false;
    let mut prev = ' ';
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        let next = chars.peek().copied().unwrap_or(' ');
        let opens = c == '\'' && !quoted && !prev.is_alphanumeric();
        let closes = c == '\'' && quoted && !next.is_alphanumeric();
        if opens || closes {
            quoted = !quoted;
            kind.push(c);
        } else if !quoted && c.is_ascii_digit() {
            if !kind.ends_with('#') {
                kind.push('#');
            }
        } else if !quoted {
            kind.push(c);
        }
        prev = c;
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(message: String) -> Problem {
        Problem {
            message,
            fix: Some("do this".into()),
            ..Problem::default()
        }
    }

    #[test]
    fn problem_kinds_mask_names_and_numbers_but_not_prose() {
        assert_eq!(
            problem_kind(
                "model-00002-of-00006.safetensors: tensor 'model.layers.7.x' has shape [64, 256]"
            ),
            "model-#-of-#.safetensors: tensor '' has shape [#, #]"
        );
        // The apostrophe of "vLLM's" does not open a quote that would swallow the rest.
        assert_eq!(
            problem_kind("x: unexpected tensor 'a.b' (vLLM's Llama at tp 2 has no such parameter)"),
            "x: unexpected tensor '' (vLLM's Llama at tp # has no such parameter)"
        );
        assert_ne!(
            problem_kind(
                "parameter 'a' has nothing in the checkpoint to fill it (missing shard q)"
            ),
            problem_kind(
                "parameter 'a' has nothing in the checkpoint to fill it (missing shard k)"
            ),
        );
    }

    #[test]
    fn problems_of_too_many_kinds_are_counted_past_the_first_twenty() {
        // 30 kinds of 2 problems each: no kind is long, but the kinds are too many.
        let ps: Vec<Problem> = (0..30)
            .flat_map(|k| {
                let kind = "abcdefghijklmnopqrstuvwxyzABCD".as_bytes()[k] as char;
                [0, 1].map(|i| problem(format!("kind {kind} instance '{i}'")))
            })
            .collect();
        let text = ProblemList(&ps).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.iter().filter(|l| l.starts_with("  - ")).count(), 40);
        assert!(
            lines.contains(&"  … and 20 more problems of 10 other kinds"),
            "{text}"
        );
        assert_eq!(
            lines.last().copied(),
            Some("60 problems in all, 40 shown above; pass --json for the complete list")
        );
        // In the order found: kind a's two, then kind b's; their one fix once, after them all.
        assert_eq!(lines[1], "  - kind a instance '0'");
        assert_eq!(lines[2], "  - kind a instance '1'");
        assert_eq!(lines[3], "  - kind b instance '0'");
        assert_eq!(lines.iter().filter(|l| l.contains("fix")).count(), 1);
        assert_eq!(lines[41], "    fix (the 40 above): do this");
    }

    fn with_fix(message: &str, fix: Option<&str>) -> Problem {
        Problem {
            message: message.into(),
            fix: fix.map(Into::into),
            ..Problem::default()
        }
    }

    #[test]
    fn a_fix_shared_by_consecutive_problems_is_printed_once_after_them() {
        let tp = Some("choose another --tp (now 4)");
        let ps = [
            with_fix("a: not divisible", tp),
            with_fix("b: not divisible", tp),
            with_fix("c: no fix", None),
            with_fix("d: renamed", Some("rename it")),
            with_fix("e: not divisible", tp),
        ];
        let text = ProblemList(&ps).to_string();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                "  - a: not divisible",
                "  - b: not divisible",
                "    fix (the 2 above): choose another --tp (now 4)",
                "  - c: no fix",
                "  - d: renamed",
                "    fix: rename it",
                "  - e: not divisible",
                "    fix: choose another --tp (now 4)",
            ]
        );
    }

    #[test]
    fn elided_problems_share_the_fix_only_when_their_whole_kind_has_it() {
        // Kind 'x' (7 problems, one fix), then kind 'y' (7 problems, fixes differing).
        let mut ps: Vec<Problem> = (0..7)
            .map(|i| with_fix(&format!("x '{i}'"), Some("fix x")))
            .collect();
        ps.extend((0..7).map(|i| {
            with_fix(
                &format!("y '{i}'"),
                Some(if i < 6 { "fix y" } else { "other" }),
            )
        }));
        let text = ProblemList(&ps).to_string();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines[5], "  … and 2 more like this");
        assert_eq!(lines[6], "    fix (the 7 above): fix x");
        // y's shown five get their fix before the hidden two, whose fixes differ.
        assert_eq!(lines[12], "    fix (the 5 above): fix y");
        assert_eq!(lines[13], "  … and 2 more like this");
    }

    #[test]
    fn one_problem_reads_as_before() {
        let text = ProblemList(&[problem("it is 'broken'".into())]).to_string();
        assert_eq!(
            text,
            "1 problem found; vLLM would refuse this checkpoint or load it wrongly:\n  - it is 'broken'\n    fix: do this"
        );
    }
}
