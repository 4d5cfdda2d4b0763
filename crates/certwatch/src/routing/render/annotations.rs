//! The per-route annotations a backend section carries, read with the OpenShift
//! router's rules (its template's patterns and `pkg/router/template` helpers):
//! allow lists, connection rate limits, path rewrites and HSTS.
//!
//! Each reader answers `None` (nothing rendered) for a value the router ignores, and
//! for the few values the router would render into a line HAProxy refuses (which would
//! make HAProxy refuse the whole configuration): a tenant's annotation never reaches
//! HAProxy in a form that fails its parser.

use std::net::IpAddr;

use route_secrets::route::routing::HeaderAction;

/// The allow list annotation, and the older name the router still reads after it.
pub const ALLOWLIST_ANNOTATIONS: [&str; 2] = [
    "haproxy.router.openshift.io/ip_allowlist",
    "haproxy.router.openshift.io/ip_whitelist",
];

/// Allow lists with more entries than this go to a file (`acl allowlist src -f`): a
/// HAProxy line takes 64 words, three of them `acl allowlist src`.
pub const MAX_INLINE_ALLOWLIST: usize = 61;

/// Go's `strconv.ParseBool` true values (the template's `isTrue`).
pub fn is_true(value: Option<&str>) -> bool {
    matches!(value, Some("1" | "t" | "T" | "TRUE" | "true" | "True"))
}

/// Go's `strconv.Atoi` success (the template's `isInteger`): an optional sign and
/// decimal digits that fit 64 bits.
pub fn is_integer(value: &str) -> bool {
    let digits = value.strip_prefix(['+', '-']).unwrap_or(value);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && value.parse::<i64>().is_ok()
}

/// Whether `entry` is an address or a network as Go's `net.ParseIP` /
/// `net.ParseCIDR` accept them.
fn ip_or_cidr(entry: &str) -> bool {
    if entry.parse::<IpAddr>().is_ok() {
        return true;
    }
    let Some((address, bits)) = entry.split_once('/') else {
        return false;
    };
    let Ok(address) = address.parse::<IpAddr>() else {
        return false;
    };
    let max = if address.is_ipv4() { 32 } else { 128 };
    !bits.is_empty()
        && bits.len() <= 3
        && bits.bytes().all(|b| b.is_ascii_digit())
        && bits.parse::<u32>().is_ok_and(|bits| bits <= max)
}

/// The route's allow list as the router reads it: the first of `ip_allowlist` and
/// `ip_whitelist` that is set (one line), its addresses and networks with invalid
/// entries left out (`parseIPList`). `None` (the route is open to everyone) when it
/// has no valid entry, or white space around it.
pub fn allowlist(value_of: impl Fn(&str) -> Option<String>) -> Option<Vec<String>> {
    let value = ALLOWLIST_ANNOTATIONS
        .iter()
        .filter_map(|name| value_of(name))
        .find(|value| !value.is_empty() && !value.contains('\n'))?;
    if value.trim() != value || value.trim().is_empty() {
        return None;
    }
    let valid: Vec<String> = value
        .split_whitespace()
        .filter(|entry| ip_or_cidr(entry))
        .map(str::to_owned)
        .collect();
    (!valid.is_empty()).then_some(valid)
}

/// White space as RE2's `\s`.
fn re2_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\x0c' | '\r' | ' ')
}

/// The `Strict-Transport-Security` value of an annotation when the router's pattern
/// takes it whole: exactly one `max-age=<digits>` (digits optionally quoted), and only
/// `includeSubDomains` and `preload` beside it, separated by `;`, case-insensitive,
/// no white space around the value. A line break (which the pattern's `\s` allows)
/// would end HAProxy's line: such a value is ignored.
pub fn hsts(value: Option<&str>) -> Option<&str> {
    let value = value?;
    if value.contains(['\n', '\r']) || value.starts_with(re2_space) || value.ends_with(re2_space) {
        return None;
    }
    let mut max_ages = 0;
    for part in value.split(';') {
        let part = part.trim_matches(re2_space);
        let lower = part.to_ascii_lowercase();
        if lower == "includesubdomains" || lower == "preload" {
            continue;
        }
        let rest = lower.strip_prefix("max-age")?;
        let rest = rest.trim_start_matches(re2_space).strip_prefix('=')?;
        let rest = rest.trim_start_matches(re2_space);
        let digits = match rest.strip_prefix('"') {
            Some(quoted) => quoted.strip_suffix('"')?,
            None => rest,
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        max_ages += 1;
    }
    (max_ages == 1).then_some(value)
}

/// The lines of a route's connection limits
/// (`haproxy.router.openshift.io/rate-limit-connections` and its
/// `.concurrent-tcp`, `.rate-tcp`, `.rate-http` limits), as the router writes them;
/// empty when limits are off. `http`: the backend counts HTTP requests (not for
/// passthrough routes). A limit that is not an integer is not applied; nor is one with
/// a `+` sign, which the router writes as it is and HAProxy refuses (a negative limit
/// HAProxy takes, and then refuses every connection, as through the router).
pub fn rate_limits(value_of: impl Fn(&str) -> Option<String>, http: bool) -> String {
    const PREFIX: &str = "haproxy.router.openshift.io/rate-limit-connections";
    if !is_true(value_of(PREFIX).as_deref()) {
        return String::new();
    }
    let limit = |suffix: &str| {
        value_of(&format!("{PREFIX}.{suffix}"))
            .filter(|value| is_integer(value) && !value.starts_with('+'))
    };
    let mut out = String::from(
        "  stick-table type ip size 100k expire 30s store conn_cur,conn_rate(3s),http_req_rate(10s)\n  \
         tcp-request content track-sc2 src\n",
    );
    match limit("concurrent-tcp") {
        Some(n) => out.push_str(&format!(
            "  tcp-request content reject if {{ src_conn_cur ge  {n} }}\n"
        )),
        None => out.push_str("  # concurrent TCP connections not restricted\n"),
    }
    match limit("rate-tcp") {
        Some(n) => out.push_str(&format!(
            "  tcp-request content reject if {{ src_conn_rate ge {n} }}\n"
        )),
        None => out.push_str("  #TCP connection rate not restricted\n"),
    }
    if http {
        match limit("rate-http") {
            Some(n) => out.push_str(&format!(
                "  tcp-request content reject if {{ src_http_req_rate ge {n} }}\n"
            )),
            None => out.push_str("  #HTTP request rate not restricted\n"),
        }
    }
    out
}

/// Escapes text for HAProxy's single quotes (`'` as `'\''`) and drops line breaks,
/// as the router's `escapeSingleQuotes`.
fn escape_single_quotes(text: &str) -> String {
    text.replace('\'', "'\\''").replace(['\n', '\r'], "")
}

/// The router's `SanitizeInput` of a rewrite target: text up to an unescaped `#`,
/// unescaped quotes dropped, odd runs of `%` doubled, single backslashes dropped and
/// double ones made single; `\1` (the rest of the path) appended unless a `#` ended it.
pub fn sanitize_rewrite_target(value: &str) -> String {
    // Up to an unescaped '#'.
    let mut comment = false;
    let mut text = String::with_capacity(value.len() + 4);
    let mut escaped = false;
    for c in value.chars() {
        if c == '#' && !escaped {
            comment = true;
            break;
        }
        escaped = c == '\\' && !escaped;
        text.push(c);
    }
    // Unescaped double quotes dropped.
    let mut out = String::with_capacity(text.len());
    let mut escaped = false;
    for c in text.chars() {
        if c == '"' && !escaped {
            escaped = false;
            continue;
        }
        escaped = c == '\\' && !escaped;
        out.push(c);
    }
    // Unescaped single quotes dropped, escaped ones made `'\\''` (a backslash pair
    // that the steps below turn into one).
    let mut text = String::with_capacity(out.len());
    let mut escaped = false;
    for c in out.chars() {
        if c == '\'' {
            if escaped {
                text.push_str("'\\\\''");
            }
            escaped = false;
            continue;
        }
        escaped = c == '\\' && !escaped;
        text.push(c);
    }
    let text = map_runs(&text, '%', |run| {
        if run % 2 == 1 {
            "%%".repeat(run)
        } else {
            "%".repeat(run)
        }
    });
    let text = map_runs(&text, '\\', |run| {
        if run == 1 {
            String::new()
        } else {
            "\\".repeat(run)
        }
    });
    let mut text = text.replace("\\\\", "\\");
    if !comment {
        text.push_str("\\1");
    }
    text
}

/// `text` with each maximal run of `c` replaced by `replace(run length)`.
fn map_runs(text: &str, c: char, replace: impl Fn(usize) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = 0;
    for ch in text.chars() {
        if ch == c {
            run += 1;
            continue;
        }
        if run > 0 {
            out.push_str(&replace(run));
            run = 0;
        }
        out.push(ch);
    }
    if run > 0 {
        out.push_str(&replace(run));
    }
    out
}

/// The regular expression metacharacters that make a route path mean something else
/// as a regular expression than as text (`.` matches itself among the paths the route
/// serves, so it is left as the router leaves it).
const PATH_METACHARACTERS: &str = "\\+*?()|[]{}^$";

/// The `replace-path` line of a route's `haproxy.router.openshift.io/rewrite-target`
/// (the router's: the route's path and what follows it replaced by the target, the
/// rest of the path kept; a target `/` also takes the slash after the path). `None`
/// when the value is not a path (`^/.*$`) or holds a control character HAProxy's line
/// would not keep. A route path with regular expression metacharacters is escaped
/// (the router puts it in the expression as written, where HAProxy may refuse it).
pub fn rewrite_target(value: Option<&str>, path: Option<&str>) -> Option<String> {
    let target = value?;
    if !target.starts_with('/') || target.chars().any(|c| c.is_control()) {
        return None;
    }
    let path = path.unwrap_or("");
    let path = if path.contains(|c| PATH_METACHARACTERS.contains(c)) {
        path.chars()
            .fold(String::with_capacity(path.len() + 8), |mut out, c| {
                if PATH_METACHARACTERS.contains(c) || c == '.' {
                    out.push('\\');
                }
                out.push(c);
                out
            })
    } else {
        path.to_owned()
    };
    let path = escape_single_quotes(&path);
    let replacement = sanitize_rewrite_target(target);
    Some(if target == "/" {
        format!("  http-request replace-path '^{path}/?(.*)$' '{replacement}'\n")
    } else {
        format!("  http-request replace-path '^{path}(.*)$' '{replacement}'\n")
    })
}

/// Header names the API refuses in header actions.
const RESERVED_HEADERS: [&str; 4] = ["strict-transport-security", "proxy", "cookie", "set-cookie"];

/// Whether `name` is a header name the Route API takes in a header action.
fn header_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-!#$%&'*+.^_`|~".contains(&b))
        && !RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str())
}

/// Whether `value` is a header value the Route API takes (its pattern): text without
/// control characters, `%%`, and `%[<fetch>(,<converter>)*]` with an optional
/// `{flags}` of `Q`, `X`, `E`, where the fetch is `<prefix>.hdr(<name>)` or
/// `ssl_c_der` and the converters `lower` or `base64`. `prefix`: `req` for request
/// headers, `res` for response headers.
fn header_value_ok(value: &str, prefix: &str) -> bool {
    if value.is_empty() || value.len() > 16384 {
        return false;
    }
    let mut rest = value;
    while let Some(c) = rest.chars().next() {
        if c != '%' {
            if c.is_ascii_control() {
                return false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        rest = &rest[1..];
        if let Some(after) = rest.strip_prefix('%') {
            rest = after;
            continue;
        }
        if let Some(after) = rest.strip_prefix('{') {
            let Some((flags, after)) = after.split_once('}') else {
                return false;
            };
            let flag_ok = |flag: &str| {
                let flag = flag.strip_prefix(['+', '-']).unwrap_or(flag);
                matches!(flag, "Q" | "X" | "E")
            };
            if !flags.split(',').all(flag_ok) {
                return false;
            }
            rest = after;
        }
        let Some(after) = rest.strip_prefix('[') else {
            return false;
        };
        let Some((expression, after)) = after.split_once(']') else {
            return false;
        };
        let mut parts = expression.split(',');
        let fetch = parts.next().unwrap_or("");
        let fetch_ok = fetch == "ssl_c_der"
            || fetch
                .strip_prefix(prefix)
                .and_then(|f| f.strip_prefix(".hdr("))
                .and_then(|f| f.strip_suffix(')'))
                .is_some_and(|name| {
                    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
        if !fetch_ok || !parts.all(|converter| matches!(converter, "lower" | "base64")) {
            return false;
        }
        rest = after;
    }
    true
}

/// Single-quoted as the router quotes header names and values (`'` as `'\''`).
fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// The lines of a route's `spec.httpHeaders.actions`, request actions then response
/// actions, in order, as the router writes them. An action the Route API would have
/// refused (a name or value outside its patterns, a reserved header) is left out.
pub fn header_actions(request: &[HeaderAction], response: &[HeaderAction]) -> String {
    let mut out = String::new();
    for (actions, direction, prefix) in [(request, "request", "req"), (response, "response", "res")]
    {
        for action in actions {
            if !header_name_ok(&action.name) {
                continue;
            }
            let name = single_quoted(&action.name);
            match &action.set {
                Some(value) if header_value_ok(value, prefix) => {
                    out.push_str(&format!(
                        "  http-{direction} set-header {name} {}\n",
                        single_quoted(value)
                    ));
                }
                Some(_) => {}
                None => out.push_str(&format!("  http-{direction} del-header {name}\n")),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn values(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn allow_lists_keep_valid_entries_and_prefer_the_new_name() {
        let list = |pairs: &[(&str, &str)]| allowlist(values(pairs));
        assert_eq!(
            list(&[(
                ALLOWLIST_ANNOTATIONS[0],
                "10.0.0.1 192.168.0.0/16 ::1 fd00::/8"
            )]),
            Some(vec![
                "10.0.0.1".into(),
                "192.168.0.0/16".into(),
                "::1".into(),
                "fd00::/8".into()
            ])
        );
        // Invalid entries are left out; nothing valid: no list at all.
        assert_eq!(
            list(&[(
                ALLOWLIST_ANNOTATIONS[0],
                "10.0.0.1 bogus 1.2.3.4/33 300.1.1.1"
            )]),
            Some(vec!["10.0.0.1".into()])
        );
        assert_eq!(list(&[(ALLOWLIST_ANNOTATIONS[0], "bogus")]), None);
        // White space around the value: ignored, as the router ignores it.
        assert_eq!(list(&[(ALLOWLIST_ANNOTATIONS[0], " 10.0.0.1")]), None);
        assert_eq!(list(&[(ALLOWLIST_ANNOTATIONS[0], "")]), None);
        // The old name counts when the new one is empty or absent.
        assert_eq!(
            list(&[
                (ALLOWLIST_ANNOTATIONS[0], ""),
                (ALLOWLIST_ANNOTATIONS[1], "10.1.0.0/16")
            ]),
            Some(vec!["10.1.0.0/16".into()])
        );
        assert_eq!(
            list(&[
                (ALLOWLIST_ANNOTATIONS[0], "10.2.0.1"),
                (ALLOWLIST_ANNOTATIONS[1], "10.1.0.0/16")
            ]),
            Some(vec!["10.2.0.1".into()])
        );
    }

    #[test]
    fn hsts_takes_the_router_pattern_whole() {
        for good in [
            "max-age=31536000",
            "max-age=31536000;includeSubDomains;preload",
            "preload; MAX-AGE = \"10\" ; includesubdomains",
            "includeSubDomains;max-age=0",
        ] {
            assert_eq!(hsts(Some(good)), Some(good), "{good}");
        }
        for bad in [
            "max-age=1;max-age=2",
            "max-age=1;",
            " max-age=1",
            "max-age=1 ",
            "max-age=",
            "max-age=1x",
            "includeSubDomains",
            "max-age=1;foo",
            "max-age=1;\npreload",
            "max-age=\"1",
        ] {
            assert_eq!(hsts(Some(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn header_actions_take_what_the_api_takes() {
        let set = |name: &str, value: &str| HeaderAction {
            name: name.into(),
            set: Some(value.into()),
        };
        let delete = |name: &str| HeaderAction {
            name: name.into(),
            set: None,
        };
        let lines = header_actions(
            &[
                set("X-Client", "%[req.hdr(host),lower] it's 100%%"),
                set("X-Cert", "%{+Q}[ssl_c_der,base64]"),
                delete("X-Gone"),
                set("X-Bad", "100%"),
                set("X-Wrong-Fetch", "%[res.hdr(a)]"),
                set("X-Src", "%[src]"),
                set("X-Line", "a\nb"),
                set("Cookie", "c"),
                set("Bad Name", "v"),
            ],
            &[set("X-Served", "%[res.hdr(server)]"), delete("Server")],
        );
        assert_eq!(
            lines,
            "  http-request set-header 'X-Client' '%[req.hdr(host),lower] it'\\''s 100%%'\n  \
             http-request set-header 'X-Cert' '%{+Q}[ssl_c_der,base64]'\n  \
             http-request del-header 'X-Gone'\n  \
             http-response set-header 'X-Served' '%[res.hdr(server)]'\n  \
             http-response del-header 'Server'\n"
        );
    }

    #[test]
    fn rate_limits_follow_the_switch_and_integers() {
        assert_eq!(rate_limits(values(&[]), true), "");
        let on = "haproxy.router.openshift.io/rate-limit-connections";
        let lines = rate_limits(
            values(&[
                (on, "true"),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.concurrent-tcp",
                    "2",
                ),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.rate-http",
                    "x",
                ),
            ]),
            true,
        );
        assert!(lines.contains("{ src_conn_cur ge  2 }"), "{lines}");
        assert!(lines.contains("#TCP connection rate not restricted"));
        assert!(lines.contains("#HTTP request rate not restricted"));
        let tcp = rate_limits(
            values(&[
                (on, "1"),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.rate-http",
                    "5",
                ),
            ]),
            false,
        );
        assert!(!tcp.contains("http_req_rate ge"), "{tcp}");
        assert_eq!(rate_limits(values(&[(on, "yes")]), true), "");
        assert!(is_integer("-3") && is_integer("+3") && !is_integer("3.0"));
    }

    #[test]
    fn rewrite_targets_are_sanitized_as_the_router_does() {
        assert_eq!(sanitize_rewrite_target("/"), "/\\1");
        assert_eq!(sanitize_rewrite_target("/x/"), "/x/\\1");
        assert_eq!(sanitize_rewrite_target("/x#"), "/x");
        assert_eq!(sanitize_rewrite_target("/x\\#y"), "/x#y\\1");
        assert_eq!(sanitize_rewrite_target("/a%b"), "/a%%b\\1");
        assert_eq!(sanitize_rewrite_target("/a%%b"), "/a%%b\\1");
        assert_eq!(sanitize_rewrite_target("/a%%%b"), "/a%%%%%%b\\1");
        assert_eq!(sanitize_rewrite_target("/a\"b'c"), "/abc\\1");
        assert_eq!(sanitize_rewrite_target("/a\\'b"), "/a'\\''b\\1");
        assert_eq!(sanitize_rewrite_target("/a\\\\b"), "/a\\b\\1");
        assert_eq!(
            rewrite_target(Some("/"), Some("/api")).as_deref(),
            Some("  http-request replace-path '^/api/?(.*)$' '/\\1'\n")
        );
        assert_eq!(
            rewrite_target(Some("/v2"), Some("/api")).as_deref(),
            Some("  http-request replace-path '^/api(.*)$' '/v2\\1'\n")
        );
        assert_eq!(
            rewrite_target(Some("/x"), None).as_deref(),
            Some("  http-request replace-path '^(.*)$' '/x\\1'\n")
        );
        assert_eq!(rewrite_target(Some("x"), Some("/api")), None);
        assert_eq!(rewrite_target(Some("/x\ny"), Some("/api")), None);
        assert_eq!(
            rewrite_target(Some("/"), Some("/a(b")).as_deref(),
            Some("  http-request replace-path '^/a\\(b/?(.*)$' '/\\1'\n")
        );
    }
}
