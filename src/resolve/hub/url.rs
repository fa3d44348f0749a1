//! URLs and server text for the hub client: Python's quoting, redirect targets resolved against
//! the request, origins compared (the token goes to its own origin only), and untrusted strings
//! shortened and escaped for messages.

/// An untrusted string for a message: control characters escaped, at most 200 characters.
pub(super) fn shown(s: &str) -> String {
    // The terminal's escaping (one rule for every untrusted string), and a bound on how much of
    // a server's text an error quotes.
    let head: String = s.chars().take(200).collect();
    let mut out = crate::escape::escape(&head).into_owned();
    if s.chars().nth(200).is_some() {
        out.push('…');
    }
    out
}

/// Python's `urllib.parse.quote`: every byte but ASCII letters, digits and `_.-~` as `%XX`,
/// keeping `/` when `keep_slash` (huggingface_hub encodes file paths that way, and a revision
/// such as `refs/pr/1` with its slashes encoded).
pub(super) fn quote(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'_' | b'.' | b'-' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `Location` that stays on the same server: a path, not a URL with a scheme or host.
pub(super) fn is_relative(location: &str) -> bool {
    !location.starts_with("//") && scheme_of(location).is_none()
}

/// The scheme of an absolute URL (`[A-Za-z][A-Za-z0-9+.-]*:`), lowercased.
pub(super) fn scheme_of(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'));
    ok.then(|| scheme.to_ascii_lowercase())
}

/// The URL a `Location` names, seen from `base`, when it is one wload follows: http or https,
/// absolute or relative to `base`.
pub(super) fn resolve_location(base: &str, location: &str) -> Result<String, String> {
    let location = location.trim();
    let location = location.split_once('#').map_or(location, |(l, _)| l);
    let base_scheme = scheme_of(base).unwrap_or_else(|| "http".into());
    let url = if let Some(scheme) = scheme_of(location) {
        if scheme != "http" && scheme != "https" {
            return Err(format!(
                "a {scheme}: URL; wload follows only http and https"
            ));
        }
        location.to_string()
    } else if location.starts_with("//") {
        format!("{base_scheme}:{location}")
    } else if location.starts_with('/') {
        format!("{}{location}", origin(base))
    } else {
        let path_end = base.find(['?', '#']).unwrap_or(base.len());
        let dir = &base[..path_end];
        let dir = match dir.rfind('/') {
            Some(i) if i >= origin(base).len() => &dir[..=i],
            _ => return Ok(format!("{}/{location}", origin(base))),
        };
        format!("{dir}{location}")
    };
    match url.parse::<ureq::http::Uri>() {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) => Ok(url),
        _ => Err("not a URL wload can request".into()),
    }
}

/// `scheme://host[:port]` of an absolute URL.
pub(super) fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find(['/', '?', '#']) {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// Same scheme, host and port (the scheme's default port when none is written).
pub(super) fn same_origin(a: &str, b: &str) -> bool {
    let parts = |u: &str| {
        let uri: ureq::http::Uri = u.parse().ok()?;
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let port = uri.port_u16().or(match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        })?;
        Some((scheme, uri.host()?.to_ascii_lowercase(), port))
    };
    matches!((parts(a), parts(b)), (Some(x), Some(y)) if x == y)
}
