//! Durations as Kubernetes users type them.
//!
//! The syntax is Go's `time.ParseDuration`, which kubectl, client-go and every
//! Kubernetes component use for their flags: one or more decimal numbers, each with a
//! unit, such as `300ms`, `1.5h` or `2h45m10s`. Units are `ns`, `us` (or `µs`), `ms`,
//! `s`, `m` and `h`; certwatch adds `d` (24 h) for certificate lifetimes. A bare `0`
//! is zero; any other number without a unit is refused, because `60` could mean
//! seconds or milliseconds and a wrong guess is silent. Durations are never negative.

use std::fmt;
use std::time::Duration;

/// Why a text is not a duration. The message quotes the text and shows the syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {reason} (write a number with a unit, e.g. 300ms, 1.5s, 1m30s, 2h)"
)]
pub struct DurationParseError {
    input: String,
    reason: &'static str,
}

impl DurationParseError {
    /// What is wrong, without the input (e.g. `missing unit`).
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

const NANOS_PER_UNIT: [(&str, u128); 9] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Longest duration accepted: about 292 years, as Go's `time.Duration`.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Parses a duration such as `1m30s`, `1.5h`, `300ms` or `0`.
pub fn parse(input: &str) -> Result<Duration, DurationParseError> {
    let fail = |reason| DurationParseError {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(fail("empty"));
    }
    if text.starts_with('-') {
        return Err(fail("negative"));
    }
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits_end);
        if number.is_empty() {
            return Err(fail("expected a number"));
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        if unit.is_empty() {
            return Err(fail("missing unit"));
        }
        let per_unit = NANOS_PER_UNIT
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, nanos)| *nanos)
            .ok_or_else(|| fail("unknown unit"))?;
        total = total
            .checked_add(scaled(number, per_unit).ok_or_else(|| fail("bad number"))?)
            .filter(|total| *total <= MAX_NANOS)
            .ok_or_else(|| fail("out of range"))?;
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| fail("out of range"))?;
    let nanos = u32::try_from(total % 1_000_000_000).map_err(|_| fail("out of range"))?;
    Ok(Duration::new(secs, nanos))
}

/// `number` (decimal digits with at most one point) times `per_unit` nanoseconds,
/// exact up to the nanosecond (extra fraction digits are truncated, as Go does).
fn scaled(number: &str, per_unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut result = whole.checked_mul(per_unit)?;
    let mut scale = per_unit;
    for digit in fraction.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        result = result.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(result)
}

/// Formats a duration as Go's `time.Duration` prints it (`1h2m3.5s`, `1.4s`,
/// `300ms`, `0s`), except that microseconds are written `us`. [`parse`] reads it back.
pub fn format(duration: Duration) -> String {
    Display(duration).to_string()
}

/// A [`Duration`] that displays as [`format`] writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Display(pub Duration);

impl fmt::Display for Display {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let duration = self.0;
        let nanos = duration.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000 {
            return write!(f, "{nanos}ns");
        }
        if nanos < 1_000_000 {
            return write_fraction(f, nanos, 1_000, "us");
        }
        if nanos < 1_000_000_000 {
            return write_fraction(f, nanos, 1_000_000, "ms");
        }
        let secs = duration.as_secs();
        let (hours, minutes) = (secs / 3600, secs / 60 % 60);
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if hours > 0 || minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        write_fraction(
            f,
            u128::from(secs % 60) * 1_000_000_000 + u128::from(duration.subsec_nanos()),
            1_000_000_000,
            "s",
        )
    }
}

fn write_fraction(
    f: &mut fmt::Formatter<'_>,
    nanos: u128,
    per_unit: u128,
    unit: &str,
) -> fmt::Result {
    let whole = nanos / per_unit;
    let fraction = nanos % per_unit;
    if fraction == 0 {
        return write!(f, "{whole}{unit}");
    }
    let width = per_unit.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    write!(f, "{whole}.{}{unit}", digits.trim_end_matches('0'))
}

/// Serde for a [`Duration`] written as a duration string (`"1m30s"`).
///
/// ```
/// # use std::time::Duration;
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Config {
///     #[serde(with = "kube_common::duration::serde_text")]
///     timeout: Duration,
/// }
/// let config: Config = serde_json::from_str(r#"{"timeout": "1m30s"}"#)?;
/// assert_eq!(config.timeout, Duration::from_secs(90));
/// # Ok::<(), serde_json::Error>(())
/// ```
pub mod serde_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    /// Writes the duration as [`format`](super::format) does.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::Display(*duration))
    }

    /// Reads a duration string, as [`parse`](super::parse) does.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse(&text).map_err(D::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reads_what_kubernetes_users_type() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("300ms", Duration::from_millis(300)),
            ("1.4s", Duration::from_millis(1400)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m10s", Duration::from_secs(2 * 3600 + 45 * 60 + 10)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("10ns", Duration::from_nanos(10)),
            ("90d", Duration::from_secs(90 * 86_400)),
            (".5s", Duration::from_millis(500)),
            ("+5s", Duration::from_secs(5)),
            (" 2m ", Duration::from_secs(120)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text).unwrap(), expected, "{text}");
        }
    }

    #[test]
    fn refuses_unitless_negative_and_malformed_durations() {
        let cases = [
            ("60", "missing unit"),
            ("1m30", "missing unit"),
            ("", "empty"),
            ("-1s", "negative"),
            ("fast", "expected a number"),
            ("1x", "unknown unit"),
            ("1 s", "unknown unit"),
            ("1..5s", "bad number"),
            ("s", "expected a number"),
            ("9999999999h", "out of range"),
        ];
        for (text, reason) in cases {
            let error = parse(text).unwrap_err();
            assert_eq!(error.reason(), reason, "{text}");
            assert!(error.to_string().contains(&format!("{text:?}")));
        }
    }

    #[test]
    fn formats_as_go_does() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(15), "15ns"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(1400), "1.4s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
        ];
        for (duration, text) in cases {
            assert_eq!(format(duration), text);
        }
    }

    proptest! {
        #[test]
        fn format_round_trips(nanos in 0u64..(400 * 86_400 * 1_000_000_000)) {
            let duration = Duration::from_nanos(nanos);
            prop_assert_eq!(parse(&format(duration)).unwrap(), duration);
        }
    }
}
