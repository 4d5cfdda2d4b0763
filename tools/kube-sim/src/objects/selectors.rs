//! Field selectors with Kubernetes' syntax and semantics, and what a list or watch
//! selects ([`ObjectFilter`]). Label selectors are kube-common's
//! ([`kube_common::labels`]), the grammar the daemon checks its flags with.
//!
//! Field selectors: comma-separated terms `field=value`, `field==value`,
//! `field!=value` (all must hold), with `\` escaping `,`, `=`, `!` and `\` in values.

use std::collections::BTreeMap;

use kube_common::labels::LabelSelector;
use serde_json::Value;

use crate::resources::ResourceDef;

/// Why a field selector is refused. `Display` is the API server's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldSelectorError {
    /// A term has no `=`, `==` or `!=`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    NoOperator {
        /// The whole selector.
        selector: String,
        /// The term.
        term: String,
    },
    /// A `\` escapes a character that needs no escape.
    #[error("invalid escape sequence \\{escaped} in {text:?}")]
    Escape {
        /// The side of the term holding it.
        text: String,
        /// The escaped character.
        escaped: char,
    },
    /// A `\` ends a side of a term.
    #[error("trailing backslash in {text:?}")]
    TrailingBackslash {
        /// The side of the term.
        text: String,
    },
    /// The resource has no such field label, in the words of a registry that lists the
    /// supported ones (EndpointSlices').
    #[error("{field:?} is not a known field selector: only {supported}")]
    UnknownOf {
        /// The field label.
        field: String,
        /// The supported labels, quoted and separated by commas.
        supported: String,
    },
    /// The resource has no such field label.
    #[error("field label not supported: {field}")]
    Unsupported {
        /// The field label.
        field: String,
    },
}

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
    pub fn parse(input: &str) -> Result<FieldSelector, FieldSelectorError> {
        let mut terms = Vec::new();
        for raw in split_unescaped(input, ',') {
            if raw.is_empty() {
                continue;
            }
            let (lhs, op, rhs) =
                split_term(&raw).ok_or_else(|| FieldSelectorError::NoOperator {
                    selector: input.to_owned(),
                    term: raw.clone(),
                })?;
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
    pub fn validate_for(&self, def: &ResourceDef) -> Result<(), FieldSelectorError> {
        match self.terms.iter().find(|t| !def.supports_field(&t.field)) {
            Some(unsupported) if def.name == "endpointslices" => {
                let supported: Vec<String> = ["metadata.name", "metadata.namespace"]
                    .iter()
                    .chain(def.extra_fields)
                    .map(|field| format!("{field:?}"))
                    .collect();
                Err(FieldSelectorError::UnknownOf {
                    field: unsupported.field.clone(),
                    supported: supported.join(", "),
                })
            }
            Some(unsupported) => Err(FieldSelectorError::Unsupported {
                field: unsupported.field.clone(),
            }),
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

fn unescape(s: &str) -> Result<String, FieldSelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                Some(escaped) => {
                    return Err(FieldSelectorError::Escape {
                        text: s.to_owned(),
                        escaped,
                    });
                }
                None => {
                    return Err(FieldSelectorError::TrailingBackslash { text: s.to_owned() });
                }
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

/// Whether `object`'s `metadata.labels` satisfy `selector`.
pub fn labels_match(selector: &LabelSelector, object: &Value) -> bool {
    selector.is_empty() || selector.matches(&labels_of(object))
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
        self.fields.matches(object) && labels_match(&self.labels, object)
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
}
