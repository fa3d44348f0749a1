//! Numbers for people: byte sizes both ways (`5GiB` → bytes, bytes → `3.2 GiB`), thousands
//! separators, and lists of ids (ranks, experts) as runs. A leaf, so that every stage's messages read the same.

use std::fmt;

/// 1536 → "1.5 KiB".
pub fn human_bytes(n: u64) -> String {
    HumanBytes(n).to_string()
}

/// [`human_bytes`] as a `Display`, to format without an intermediate `String`.
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let n = self.0;
        let mut v = n as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{n} B")
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// 1234567 → "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Parses `500MB`, `5GiB`, `40000`: decimal (kB, MB, GB, TB) and binary (KiB, MiB, GiB, TiB) units.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1000u64.pow(2),
        "g" | "gb" => 1000u64.pow(3),
        "t" | "tb" => 1000u64.pow(4),
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{s}' (use B, kB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size like 40000, 500MB or 5GiB"))?;
    let bytes = v * mult as f64;
    if bytes < 1.0 || !bytes.is_finite() {
        return Err(format!("'{s}' must be at least one byte"));
    }
    // `as` would saturate: 99999999999999999999GiB is no size at all.
    if bytes >= u64::MAX as f64 {
        return Err(format!("'{s}' is larger than any file can be"));
    }
    Ok(bytes as u64)
}

/// serde's default for a count that is 1 unless written (pipeline stages, repeats).
pub(crate) fn one() -> u64 {
    1
}

/// serde's `skip_serializing_if` for such a count: 1 is left out of the JSON.
pub(crate) fn is_one(n: &u64) -> bool {
    *n == 1
}

/// The plural ending for a count: `1 file`, `2 files`.
pub(crate) fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Ids as runs, the way `--ranks` takes them: `0-3,5,8-9`; sorted first, each id once. The one
/// way a message, a report or a run record's name writes a list of ranks or experts.
pub(crate) fn id_runs(ids: &[u64]) -> String {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for i in ids {
        match runs.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(i) => *end = i,
            _ => runs.push((i, i)),
        }
    }
    runs_text(runs)
}

/// Runs `(first, last)`, in the order given, as [`id_runs`] writes them.
pub(crate) fn runs_text(runs: impl IntoIterator<Item = (u64, u64)>) -> String {
    let parts: Vec<String> = (runs.into_iter())
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("40000"), Ok(40000));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("5GiB"), Ok(5 << 30));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
        assert!(parse_size("16EiB").is_err());
    }
}
