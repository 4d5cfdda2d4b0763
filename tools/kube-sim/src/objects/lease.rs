//! What kube-apiserver does to a `coordination.k8s.io/v1` Lease beyond the generic
//! object rules: its spec fields are typed when the body is decoded (a number where a
//! string belongs is a 400, as is a `MicroTime` without exactly six fractional digits),
//! times are stored in UTC, the fields behind the `CoordinatedLeaderElection` feature
//! gate (off by default: `strategy`, `preferredHolder`) are dropped, and the spec is
//! validated (a duration of at least one second, no negative transition count).

use serde_json::Value;

use crate::error::{ApiError, FieldError};

/// The layout kube-apiserver parses a `MicroTime` with (Go's reference time).
const MICRO_TIME_LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";

/// The Go type of each spec field, for decode errors.
const SPEC_FIELDS: &[(&str, GoType)] = &[
    ("holderIdentity", GoType::String),
    ("leaseDurationSeconds", GoType::Int32),
    ("acquireTime", GoType::String),
    ("renewTime", GoType::String),
    ("leaseTransitions", GoType::Int32),
];

/// Fields kube-apiserver drops while `CoordinatedLeaderElection` is off.
const GATED_FIELDS: &[&str] = &["strategy", "preferredHolder"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GoType {
    String,
    Int32,
}

impl GoType {
    fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Int32 => "int32",
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            Self::String => value.is_string(),
            Self::Int32 => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
        }
    }
}

/// The JSON type name Go's decoder reports for a value it could not store.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn decode_error(message: String) -> ApiError {
    ApiError::bad_request(format!(
        "Lease in version \"v1\" cannot be handled as a Lease: {message}"
    ))
}

/// Decodes a Lease body as kube-apiserver does: refuses mistyped spec fields and
/// malformed times (400), stores times in UTC and drops feature-gated fields.
pub(crate) fn decode(obj: &mut Value) -> Result<(), ApiError> {
    let Some(spec) = obj.get_mut("spec") else {
        return Ok(());
    };
    if spec.is_null() {
        return Ok(());
    }
    let Some(spec) = spec.as_object_mut() else {
        return Err(decode_error(format!(
            "json: cannot unmarshal {} into Go struct field Lease.spec of type v1.LeaseSpec",
            json_type(spec)
        )));
    };
    for field in GATED_FIELDS {
        spec.remove(*field);
    }
    for (field, go_type) in SPEC_FIELDS {
        let Some(value) = spec.get_mut(*field) else {
            continue;
        };
        if value.is_null() {
            spec.remove(*field);
            continue;
        }
        if !go_type.accepts(value) {
            return Err(decode_error(format!(
                "json: cannot unmarshal {} into Go struct field LeaseSpec.spec.{field} of type {}",
                json_type(value),
                go_type.name()
            )));
        }
        if matches!(*field, "acquireTime" | "renewTime")
            && let Some(text) = value.as_str()
        {
            let utc = parse_micro_time(text).map_err(decode_error)?;
            *value = Value::String(utc);
        }
    }
    Ok(())
}

/// Validates a decoded Lease's spec, as kube-apiserver's `ValidateLeaseSpec`.
pub(crate) fn validate(obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(spec) = obj.get("spec").and_then(Value::as_object) else {
        return;
    };
    if let Some(duration) = spec.get("leaseDurationSeconds").and_then(Value::as_i64)
        && duration <= 0
    {
        errs.push(FieldError::invalid_number(
            "spec.leaseDurationSeconds",
            duration,
            "must be greater than 0",
        ));
    }
    if let Some(transitions) = spec.get("leaseTransitions").and_then(Value::as_i64)
        && transitions < 0
    {
        errs.push(FieldError::invalid_number(
            "spec.leaseTransitions",
            transitions,
            "must be greater than or equal to 0",
        ));
    }
}

/// Parses `text` with [`MICRO_TIME_LAYOUT`] as Go's `time.Parse` does and returns it
/// in UTC with six fractional digits, or Go's error message.
fn parse_micro_time(text: &str) -> Result<String, String> {
    let fail = |rest: &str, element: &str| {
        format!(
            "parsing time {text:?} as {MICRO_TIME_LAYOUT:?}: cannot parse {rest:?} as {element:?}"
        )
    };
    let out_of_range = |what: &str| format!("parsing time {text:?}: {what} out of range");
    let mut rest = text;
    let mut fields = [0i64; 6];
    // (literal before the element, the element, its digits)
    let numbers: [(&str, &str, usize); 6] = [
        ("", "2006", 4),
        ("-", "01", 2),
        ("-", "02", 2),
        ("T", "15", 2),
        (":", "04", 2),
        (":", "05", 2),
    ];
    for (slot, (literal, element, digits)) in fields.iter_mut().zip(numbers) {
        rest = rest
            .strip_prefix(literal)
            .ok_or_else(|| fail(rest, literal))?;
        let number = rest
            .get(..digits)
            .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| fail(rest, element))?;
        *slot = number.parse().map_err(|_| fail(rest, element))?;
        rest = &rest[digits..];
    }
    let fraction = rest
        .strip_prefix('.')
        .and_then(|r| r.get(..6))
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| fail(rest, ".000000"))?;
    let micros: i64 = fraction.parse().map_err(|_| fail(rest, ".000000"))?;
    rest = &rest[7..];
    let offset_seconds = if let Some(after) = rest.strip_prefix('Z') {
        rest = after;
        0
    } else {
        let sign = match rest.as_bytes().first() {
            Some(b'+') => 1,
            Some(b'-') => -1,
            _ => return Err(fail(rest, "Z07:00")),
        };
        let zone = rest
            .get(1..6)
            .filter(|z| {
                let b = z.as_bytes();
                b[2] == b':' && [0, 1, 3, 4].iter().all(|i| b[*i].is_ascii_digit())
            })
            .ok_or_else(|| fail(rest, "Z07:00"))?;
        let hours: i64 = zone[..2].parse().map_err(|_| fail(rest, "Z07:00"))?;
        let minutes: i64 = zone[3..].parse().map_err(|_| fail(rest, "Z07:00"))?;
        rest = &rest[6..];
        sign * (hours * 3600 + minutes * 60)
    };
    if !rest.is_empty() {
        return Err(format!(
            "parsing time {text:?} as {MICRO_TIME_LAYOUT:?}: extra text: {rest:?}"
        ));
    }
    let [year, month, day, hour, minute, second] = fields;
    if !(1..=12).contains(&month) {
        return Err(out_of_range("month"));
    }
    if hour > 23 {
        return Err(out_of_range("hour"));
    }
    if minute > 59 {
        return Err(out_of_range("minute"));
    }
    if second > 59 {
        return Err(out_of_range("second"));
    }
    let date = i16::try_from(year)
        .ok()
        .and_then(|year| jiff::civil::Date::new(year, month as i8, day as i8).ok())
        .ok_or_else(|| out_of_range("day"))?;
    let local = date
        .to_datetime(
            jiff::civil::Time::new(hour as i8, minute as i8, second as i8, 0)
                .map_err(|_| out_of_range("hour"))?,
        )
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|_| out_of_range("day"))?
        .timestamp();
    let utc = local
        .checked_sub(jiff::SignedDuration::from_secs(offset_seconds))
        .map_err(|_| out_of_range("year"))?;
    Ok(format!(
        "{}.{micros:06}Z",
        utc.strftime("%Y-%m-%dT%H:%M:%S")
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lease(spec: Value) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "l", "namespace": "ns"}, "spec": spec})
    }

    #[test]
    fn micro_times_are_stored_in_utc_with_six_digits() {
        assert_eq!(
            parse_micro_time("2025-01-01T00:00:01.123456+02:00").as_deref(),
            Ok("2024-12-31T22:00:01.123456Z")
        );
        assert_eq!(
            parse_micro_time("2025-01-01T00:00:01.000001Z").as_deref(),
            Ok("2025-01-01T00:00:01.000001Z")
        );
    }

    #[test]
    fn malformed_micro_times_are_refused_in_go_s_words() {
        let cases = [
            (
                "2025-01-01T00:00:01Z",
                r#"parsing time "2025-01-01T00:00:01Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "Z" as ".000000""#,
            ),
            (
                "2025-01-01T00:00:01.123Z",
                r#"parsing time "2025-01-01T00:00:01.123Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse ".123Z" as ".000000""#,
            ),
            (
                "2025-01-01T00:00:01.1234567Z",
                r#"parsing time "2025-01-01T00:00:01.1234567Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "7Z" as "Z07:00""#,
            ),
            (
                "garbage",
                r#"parsing time "garbage" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "garbage" as "2006""#,
            ),
            (
                "2025-13-01T00:00:01.000000Z",
                r#"parsing time "2025-13-01T00:00:01.000000Z": month out of range"#,
            ),
        ];
        for (text, message) in cases {
            assert_eq!(parse_micro_time(text), Err(message.to_owned()), "{text}");
        }
    }

    #[test]
    fn decoding_types_the_spec_and_drops_gated_fields() {
        let mut ok = lease(
            json!({"holderIdentity": "a", "strategy": "x", "preferredHolder": "b",
                                  "renewTime": "2025-01-01T00:00:01.123456+01:00"}),
        );
        decode(&mut ok).unwrap();
        assert_eq!(
            ok["spec"],
            json!({"holderIdentity": "a", "renewTime": "2024-12-31T23:00:01.123456Z"})
        );
        let mut mistyped = lease(json!({"leaseDurationSeconds": "5"}));
        assert_eq!(
            decode(&mut mistyped).unwrap_err().message,
            "Lease in version \"v1\" cannot be handled as a Lease: json: cannot unmarshal string \
             into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32"
        );
    }

    #[test]
    fn validation_wants_a_positive_duration() {
        let mut errs = Vec::new();
        validate(
            &lease(json!({"leaseDurationSeconds": -3, "leaseTransitions": -1})),
            &mut errs,
        );
        let messages: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "spec.leaseDurationSeconds: Invalid value: -3: must be greater than 0",
                "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0",
            ]
        );
    }
}
