//! A refused plan's problems for a terminal: a short list whole, a long one summarised by kind.

use std::collections::HashMap;
use std::fmt;

use super::Problem;
use crate::units::thousands;

/// At most this many problems of one kind are printed; the rest are counted.
pub const PROBLEMS_PER_KIND: usize = 5;
/// At most this many kinds of problem are printed; problems of the others are counted.
pub const PROBLEM_KINDS_SHOWN: usize = 20;

/// A refused plan's problems for a terminal. A short list is printed whole, in the order found.
/// A long one (a config claiming 20,000 layers yields 120,000 problems) is grouped by kind: the
/// first few of each kind, how many more there are, and a closing total; `--json` has them all.
pub struct ProblemList<'a>(pub &'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ps = self.0;
        write!(
            f,
            "{} problem{} found; vLLM would refuse this checkpoint or load it wrongly:",
            thousands(ps.len() as u64),
            plural(ps.len())
        )?;
        let kinds = problem_kinds(ps);
        let elided =
            kinds.len() > PROBLEM_KINDS_SHOWN || kinds.iter().any(|k| k.count > PROBLEMS_PER_KIND);
        if !elided {
            return ps.iter().try_for_each(|p| write_problem(f, p));
        }
        let mut shown = 0;
        for k in kinds.iter().take(PROBLEM_KINDS_SHOWN) {
            for &i in &k.first {
                write_problem(f, &ps[i])?;
                shown += 1;
            }
            let more = k.count - k.first.len();
            if more > 0 {
                write!(f, "\n  … and {} more like this", thousands(more as u64))?;
            }
        }
        if let Some(rest) = kinds.get(PROBLEM_KINDS_SHOWN..) {
            let n: usize = rest.iter().map(|k| k.count).sum();
            write!(
                f,
                "\n  … and {} more problem{} of {} other kind{}",
                thousands(n as u64),
                plural(n),
                rest.len(),
                plural(rest.len())
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

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn write_problem(f: &mut fmt::Formatter<'_>, p: &Problem) -> fmt::Result {
    write!(f, "\n  - {}", p.message)?;
    if let Some(fix) = &p.fix {
        write!(f, "\n    fix: {fix}")?;
    }
    Ok(())
}

/// Problems of one kind: the indices of the first few, and how many there are.
struct Kind {
    first: Vec<usize>,
    count: usize,
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
            });
        }
        let kind = &mut kinds[k];
        kind.count += 1;
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
        // In the order found: kind a's two, then kind b's.
        assert_eq!(lines[1], "  - kind a instance '0'");
        assert_eq!(lines[3], "  - kind a instance '1'");
        assert_eq!(lines[5], "  - kind b instance '0'");
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
