//! Checking label selectors (`--route-selector`, `--namespace-selector`) before they
//! reach the API server, as the OpenShift router does at start-up: a selector the
//! server would refuse with 400 on every route watch is a configuration error, to be
//! reported once with the flag's name, not retried forever.
//!
//! The grammar is Kubernetes' (`k8s.io/apimachinery/pkg/labels.Parse`):
//!
//! ```text
//! selector    = requirement ( "," requirement )*
//! requirement = [ "!" ] key
//!             | key ( "=" | "==" | "!=" ) value
//!             | key ( "in" | "notin" ) "(" [ value ( "," value )* ] ")"
//!             | key ( ">" | "<" ) integer
//! key         = [ dns-subdomain "/" ] name          (name: at most 63 characters)
//! value       = "" | name
//! name        = alphanumeric, with "-", "_", "." inside
//! ```

use kube_common::name;

/// Why a label selector is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {problem}")]
pub struct SelectorError {
    selector: String,
    problem: String,
}

/// Checks `selector`'s syntax; the empty selector (everything) is valid.
pub fn check(selector: &str) -> Result<(), SelectorError> {
    let fail = |problem: String| SelectorError {
        selector: selector.to_owned(),
        problem,
    };
    let mut rest = selector.trim();
    if rest.is_empty() {
        return Ok(());
    }
    loop {
        rest = requirement(rest).map_err(fail)?.trim_start();
        if rest.is_empty() {
            return Ok(());
        }
        rest = rest
            .strip_prefix(',')
            .ok_or_else(|| fail(format!("expected ',' before {rest:?}")))?
            .trim_start();
        if rest.is_empty() {
            return Err(fail("a ',' must be followed by a requirement".to_owned()));
        }
    }
}

/// Parses one requirement at the start of `text`; returns what follows it.
fn requirement(text: &str) -> Result<&str, String> {
    let (negated, text) = match text.strip_prefix('!') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, text),
    };
    let key_end = text
        .find(|c: char| c.is_whitespace() || "=!<>(),".contains(c))
        .unwrap_or(text.len());
    let (key, rest) = text.split_at(key_end);
    check_key(key)?;
    let rest = rest.trim_start();
    if negated || rest.is_empty() || rest.starts_with(',') {
        // `key` or `!key`: existence.
        return Ok(rest);
    }
    for operator in ["==", "!=", "="] {
        if let Some(after) = rest.strip_prefix(operator) {
            let after = after.trim_start();
            let end = after
                .find(|c: char| c.is_whitespace() || c == ',')
                .unwrap_or(after.len());
            check_value(&after[..end])?;
            return Ok(&after[end..]);
        }
    }
    for operator in [">", "<"] {
        if let Some(after) = rest.strip_prefix(operator) {
            let after = after.trim_start();
            let end = after
                .find(|c: char| c.is_whitespace() || c == ',')
                .unwrap_or(after.len());
            let number = &after[..end];
            if number.parse::<i64>().is_err() {
                return Err(format!(
                    "{operator} needs an integer, not {number:?} (key {key:?})"
                ));
            }
            return Ok(&after[end..]);
        }
    }
    for operator in ["notin", "in"] {
        let Some(after) = rest.strip_prefix(operator) else {
            continue;
        };
        let after = after.trim_start();
        let Some(list) = after.strip_prefix('(') else {
            return Err(format!(
                "{operator} needs a list in parentheses (key {key:?})"
            ));
        };
        let close = list
            .find(')')
            .ok_or_else(|| format!("unclosed '(' after {operator} (key {key:?})"))?;
        let values = &list[..close];
        if !values.trim().is_empty() {
            for value in values.split(',') {
                check_value(value.trim())?;
            }
        }
        return Ok(&list[close + 1..]);
    }
    Err(format!(
        "expected an operator (=, ==, !=, in, notin, >, <) after key {key:?}, found {rest:?}"
    ))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("a requirement needs a key".to_owned());
    }
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            name::subdomain(prefix)
                .map_err(|error| format!("the prefix of key {key:?} is invalid: {error}"))?;
            name
        }
        None => key,
    };
    check_name(name).map_err(|problem| format!("key {key:?}: {problem}"))
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|problem| format!("value {value:?}: {problem}"))
}

/// A label name or value: at most 63 characters, alphanumeric at both ends, `-`, `_`
/// and `.` inside.
fn check_name(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if text.len() > 63 {
        return Err("must be at most 63 characters".to_owned());
    }
    let bytes = text.as_bytes();
    let alphanumeric = |b: u8| b.is_ascii_alphanumeric();
    if !alphanumeric(bytes[0]) || !alphanumeric(bytes[bytes.len() - 1]) {
        return Err("must begin and end with a letter or digit".to_owned());
    }
    if !bytes
        .iter()
        .all(|&b| alphanumeric(b) || b == b'-' || b == b'_' || b == b'.')
    {
        return Err("may only hold letters, digits, '-', '_' and '.'".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_kubernetes_accepts() {
        for selector in [
            "",
            "shard=a",
            "shard==a,env!=prod",
            "router.example.com/shard=a",
            "!canary",
            "canary",
            "env in (prod, staging)",
            "env notin (dev)",
            "tier in ()",
            "replicas>3",
            "a=,b",
            "Shard_1=A.b-c",
        ] {
            assert_eq!(check(selector), Ok(()), "{selector:?}");
        }
    }

    #[test]
    fn what_kubernetes_refuses() {
        for selector in [
            "shard=a=b",
            "shard=a,",
            ",shard=a",
            "=a",
            "shard in a",
            "shard in (a",
            "bad key=a",
            "-shard=a",
            "shard=-a",
            "replicas>three",
            "UPPER.example.com/x=y",
            &format!("x={}", "a".repeat(64)),
            "shard=a b",
        ] {
            assert!(check(selector).is_err(), "{selector:?}");
        }
    }
}
