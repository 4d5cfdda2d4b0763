//! Field and label selectors with Kubernetes' syntax and semantics.
//!
//! Field selectors: comma-separated terms `field=value`, `field==value`,
//! `field!=value` (all must hold), with `\` escaping `,`, `=`, `!` and `\` in values.
//! Label selectors: `key`, `!key`, `key=value`, `key==value`, `key!=value`,
//! `key in (a,b)`, `key notin (a,b)`, `key>N`, `key<N`, comma = AND. As in Kubernetes,
//! `!=` and `notin` also match objects that lack the label.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::resources::ResourceDef;

/// A comparison in a field selector term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    /// `=` or `==`.
    Eq,
    /// `!=`.
    NotEq,
}

/// One `field op value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field label (`metadata.name`).
    pub field: String,
    /// The comparison.
    pub op: FieldOp,
    /// The (unescaped) value.
    pub value: String,
}

/// A parsed field selector: every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// The terms, in input order.
    pub terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses a field selector; the empty string selects everything.
    pub fn parse(input: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for raw in split_unescaped(input, ',') {
            if raw.is_empty() {
                continue;
            }
            let (lhs, op, rhs) = split_term(&raw)
                .ok_or_else(|| format!("invalid selector: '{input}'; can't understand '{raw}'"))?;
            let field = unescape(lhs)?;
            let value = unescape(rhs)?;
            terms.push(FieldTerm { field, op, value });
        }
        Ok(FieldSelector { terms })
    }

    /// Escapes a value for use in a field selector term (`\\`, `,`, `=`, `!`).
    pub fn escape(value: &str) -> String {
        escape_field_value(value)
    }

    /// Checks every field label is supported by `def`. The refusal is kube-apiserver's,
    /// word for word: it names the label only, not the ones supported, except for
    /// EndpointSlices, whose registry lists the supported ones.
    pub fn validate_for(&self, def: &ResourceDef) -> Result<(), String> {
        match self.terms.iter().find(|t| !def.supports_field(&t.field)) {
            Some(unsupported) if def.name == "endpointslices" => {
                let supported: Vec<String> = ["metadata.name", "metadata.namespace"]
                    .iter()
                    .chain(def.extra_fields)
                    .map(|field| format!("{field:?}"))
                    .collect();
                Err(format!(
                    "{:?} is not a known field selector: only {}",
                    unsupported.field,
                    supported.join(", ")
                ))
            }
            Some(unsupported) => Err(format!("field label not supported: {}", unsupported.field)),
            None => Ok(()),
        }
    }

    /// True when there are no terms.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value of an `=`/`==` requirement on `field`, if any (as Kubernetes'
    /// `RequiresExactMatch`).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && t.op == FieldOp::Eq)
            .map(|t| t.value.as_str())
    }

    /// Whether `object` satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|t| {
            let actual = field_value(object, &t.field);
            match t.op {
                FieldOp::Eq => actual == t.value,
                FieldOp::NotEq => actual != t.value,
            }
        })
    }
}

/// The string value of a field label on an object (empty when absent).
pub fn field_value<'a>(object: &'a Value, field: &str) -> &'a str {
    let mut cur = object;
    for part in field.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

/// Splits at the first unescaped operator, trying `!=`, `==`, `=` at each position.
fn split_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        let rest = &term[i..];
        if rest.starts_with("!=") {
            return Some((&term[..i], FieldOp::NotEq, &term[i + 2..]));
        }
        if rest.starts_with("==") {
            return Some((&term[..i], FieldOp::Eq, &term[i + 2..]));
        }
        if rest.starts_with('=') {
            return Some((&term[..i], FieldOp::Eq, &term[i + 1..]));
        }
        i += 1;
    }
    None
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence \\{e} in {s:?}")),
                None => return Err(format!("trailing backslash in {s:?}")),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Escapes a value for use in a field selector.
pub fn escape_field_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=' | '!') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A label selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelOp {
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key=v` or `key==v`
    Equals,
    /// `key!=v`
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`
    NotIn,
    /// `key>N`
    GreaterThan,
    /// `key<N`
    LessThan,
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub op: LabelOp,
    /// Values (one for `=`/`!=`/`>`/`<`, a set for `in`/`notin`, none otherwise).
    pub values: Vec<String>,
}

impl LabelRequirement {
    /// Whether `labels` satisfy this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.key);
        match self.op {
            LabelOp::Exists => actual.is_some(),
            LabelOp::DoesNotExist => actual.is_none(),
            LabelOp::Equals | LabelOp::In => actual.is_some_and(|a| self.values.contains(a)),
            LabelOp::NotEquals | LabelOp::NotIn => !actual.is_some_and(|a| self.values.contains(a)),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let Some(actual) = actual.and_then(|a| a.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(bound) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// Requirements in input order.
    pub requirements: Vec<LabelRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
}

fn lex(input: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = input.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '!' if chars.get(i + 1) == Some(&'=') => {
                out.push(Token::NotEq);
                i += 2;
            }
            '!' => {
                out.push(Token::Not);
                i += 1;
            }
            '=' if chars.get(i + 1) == Some(&'=') => {
                out.push(Token::DoubleEq);
                i += 2;
            }
            '=' => {
                out.push(Token::Eq);
                i += 1;
            }
            '(' => {
                out.push(Token::Open);
                i += 1;
            }
            ')' => {
                out.push(Token::Close);
                i += 1;
            }
            ',' => {
                out.push(Token::Comma);
                i += 1;
            }
            '>' => {
                out.push(Token::Gt);
                i += 1;
            }
            '<' => {
                out.push(Token::Lt);
                i += 1;
            }
            _ => {
                let start = i;
                while i < chars.len()
                    && !chars[i].is_whitespace()
                    && !matches!(chars[i], '!' | '=' | '(' | ')' | ',' | '>' | '<')
                {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(out)
}

impl LabelSelector {
    /// Parses a label selector; the empty string selects everything.
    pub fn parse(input: &str) -> Result<LabelSelector, String> {
        let tokens = lex(input)?;
        let mut pos = 0;
        let mut requirements = Vec::new();
        if tokens.is_empty() {
            return Ok(LabelSelector::default());
        }
        let err = |msg: String| format!("unable to parse requirement: {msg} (in {input:?})");
        loop {
            let negated = tokens.get(pos) == Some(&Token::Not);
            if negated {
                pos += 1;
            }
            let key = match tokens.get(pos) {
                Some(Token::Ident(k)) => k.clone(),
                other => return Err(err(format!("found {other:?}, expected: identifier"))),
            };
            pos += 1;
            validate_label_key(&key).map_err(err)?;
            let at_end = matches!(tokens.get(pos), None | Some(Token::Comma));
            let requirement = if negated {
                if !at_end {
                    return Err(err(format!(
                        "found {:?}, expected: ',' or end of selector after '!{key}'",
                        tokens.get(pos)
                    )));
                }
                LabelRequirement {
                    key,
                    op: LabelOp::DoesNotExist,
                    values: vec![],
                }
            } else if at_end {
                LabelRequirement {
                    key,
                    op: LabelOp::Exists,
                    values: vec![],
                }
            } else {
                let op = match &tokens[pos] {
                    Token::Eq | Token::DoubleEq => LabelOp::Equals,
                    Token::NotEq => LabelOp::NotEquals,
                    Token::Gt => LabelOp::GreaterThan,
                    Token::Lt => LabelOp::LessThan,
                    Token::Ident(w) if w == "in" => LabelOp::In,
                    Token::Ident(w) if w == "notin" => LabelOp::NotIn,
                    other => {
                        return Err(err(format!(
                            "found {other:?}, expected one of: in, notin, =, ==, !=, gt, lt"
                        )));
                    }
                };
                pos += 1;
                let values = match op {
                    LabelOp::In | LabelOp::NotIn => {
                        if tokens.get(pos) != Some(&Token::Open) {
                            return Err(err("expected '(' after in/notin".into()));
                        }
                        pos += 1;
                        let mut values = Vec::new();
                        let mut expect_value = true;
                        loop {
                            match tokens.get(pos) {
                                Some(Token::Ident(v)) if expect_value => {
                                    values.push(v.clone());
                                    expect_value = false;
                                    pos += 1;
                                }
                                Some(Token::Comma) => {
                                    if expect_value {
                                        values.push(String::new());
                                    }
                                    expect_value = true;
                                    pos += 1;
                                }
                                Some(Token::Close) => {
                                    if expect_value && !values.is_empty() {
                                        values.push(String::new());
                                    }
                                    pos += 1;
                                    break;
                                }
                                other => {
                                    return Err(err(format!(
                                        "found {other:?} in value list, expected identifier, ',' or ')'"
                                    )));
                                }
                            }
                        }
                        if values.is_empty() {
                            return Err(err(
                                "for 'in', 'notin' operators, values set can't be empty".into(),
                            ));
                        }
                        values
                    }
                    _ => match tokens.get(pos) {
                        Some(Token::Ident(v)) => {
                            pos += 1;
                            vec![v.clone()]
                        }
                        None | Some(Token::Comma) => vec![String::new()],
                        other => return Err(err(format!("found {other:?}, expected a value"))),
                    },
                };
                for v in &values {
                    if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) {
                        if v.parse::<i64>().is_err() {
                            return Err(err(format!(
                                "for 'gt', 'lt' operators, the value must be an integer, got {v:?}"
                            )));
                        }
                    } else {
                        validate_label_value(v).map_err(err)?;
                    }
                }
                LabelRequirement { key, op, values }
            };
            requirements.push(requirement);
            match tokens.get(pos) {
                None => break,
                Some(Token::Comma) => {
                    pos += 1;
                    if pos >= tokens.len() {
                        return Err(err("found end of selector after ','".into()));
                    }
                }
                other => return Err(err(format!("found {other:?}, expected: ',' or end"))),
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// True when there are no requirements.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        self.matches_labels(&labels_of(object))
    }
}

/// An object's `metadata.labels` as a map (non-string values ignored).
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Validates a label key: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 characters.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && kube_common::name::subdomain(p).is_err()
    {
        return Err(format!(
            "invalid label key {key:?}: prefix part must be a DNS-1123 subdomain"
        ));
    }
    if !is_name_part(name) {
        return Err(format!(
            "invalid label key {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)"
        ));
    }
    Ok(())
}

/// Validates a label value: empty, or at most 63 characters of the name-part alphabet.
pub fn validate_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name_part(v) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)"
        ))
    }
}

/// Namespace scope, field selector and label selector of a list or watch.
#[derive(Debug, Clone, Default)]
pub struct ObjectFilter {
    /// Only objects in this namespace (from the URL).
    pub namespace: Option<String>,
    /// Field selector.
    pub fields: FieldSelector,
    /// Label selector.
    pub labels: LabelSelector,
}

impl ObjectFilter {
    /// Whether the object passes the namespace scope and both selectors.
    pub fn matches(&self, object: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && field_value(object, "metadata.namespace") != ns
        {
            return false;
        }
        self.fields.matches(object) && self.labels.matches(object)
    }

    /// The single namespace this filter can match, from the URL or an exact
    /// `metadata.namespace` field requirement.
    pub fn exact_namespace(&self) -> Option<&str> {
        self.namespace
            .as_deref()
            .or_else(|| self.fields.exact("metadata.namespace"))
    }

    /// The single object name this filter can match (`metadata.name=` requirement).
    pub fn exact_name(&self) -> Option<&str> {
        self.fields.exact("metadata.name")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn field_selector_terms_and_escapes() {
        let s = FieldSelector::parse("metadata.name=a\\,b,metadata.namespace!=x").unwrap();
        assert_eq!(s.terms.len(), 2);
        assert_eq!(s.terms[0].value, "a,b");
        assert_eq!(s.terms[1].op, FieldOp::NotEq);
        assert_eq!(s.exact("metadata.name"), Some("a,b"));
        let obj = json!({"metadata": {"name": "a,b", "namespace": "y"}});
        assert!(s.matches(&obj));
        assert!(FieldSelector::parse("nonsense").is_err());
        assert!(FieldSelector::parse("").unwrap().is_empty());
        let eq2 = FieldSelector::parse("metadata.name==z").unwrap();
        assert_eq!(eq2.terms[0].value, "z");
    }

    #[test]
    fn label_selector_forms() {
        let s = LabelSelector::parse("app=web, tier in (a, b),!legacy,env!=prod,n>3").unwrap();
        assert_eq!(s.requirements.len(), 5);
        assert!(s.matches_labels(&labels(&[("app", "web"), ("tier", "a"), ("n", "4")])));
        assert!(!s.matches_labels(&labels(&[("app", "web"), ("tier", "c"), ("n", "4")])));
        assert!(!s.matches_labels(&labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("legacy", ""),
            ("n", "4")
        ])));
        assert!(LabelSelector::parse("a in ()").is_err());
        assert!(LabelSelector::parse("a in (x").is_err());
        assert!(LabelSelector::parse("a,").is_err());
        assert!(LabelSelector::parse("-bad=x").is_err());
        assert!(LabelSelector::parse("a>x").is_err());
        assert!(LabelSelector::parse("certwatch.io/shard=1").is_ok());
    }
}
