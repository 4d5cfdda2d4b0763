//! Labels and label selectors, with the grammar and the meaning of Kubernetes'
//! `k8s.io/apimachinery/pkg/labels` and the API server's messages.
//!
//! ```text
//! selector    = [ requirement ( "," requirement )* ]
//! requirement = [ "!" ] key
//!             | key ( "=" | "==" | "!=" ) value
//!             | key ( "in" | "notin" ) "(" [ value ( "," value )* ] ")"
//!             | key ( ">" | "<" ) integer
//! key         = [ dns-subdomain "/" ] name          (name: at most 63 characters)
//! value       = "" | name
//! name        = alphanumeric, with "-", "_", "." inside
//! ```
//!
//! As in Kubernetes, `!=` and `notin` also match objects that lack the label, `in ()`
//! is the set of the empty value, and the value of `>` and `<` is a label value that
//! reads as an integer. Whitespace between tokens is ignored.
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use kube_common::labels::LabelSelector;
//!
//! let selector: LabelSelector = "shard in (a, b), !canary".parse()?;
//! let labels = BTreeMap::from([("shard".to_owned(), "a".to_owned())]);
//! assert!(selector.matches(&labels));
//! assert!("shard=a b".parse::<LabelSelector>().is_err());
//! # Ok::<(), kube_common::labels::SelectorError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::name::{self, NameError};

/// Longest label name (the part of a key after its prefix) and label value.
pub const MAX_NAME_LEN: usize = 63;

/// What is wrong with a label name or value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelNameProblem {
    /// It is empty (a key's name part must not be).
    #[error("must be non-empty")]
    Empty,
    /// It is longer than [`MAX_NAME_LEN`].
    #[error("must be no more than {MAX_NAME_LEN} bytes")]
    TooLong,
    /// It holds other characters, or does not begin and end with a letter or digit.
    #[error(
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
         with an alphanumeric character"
    )]
    Shape,
}

/// Why a label key or value is not one. `Display` follows the API server's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// The key's prefix (before `/`) is not a DNS-1123 subdomain.
    #[error("invalid label key {key:?}: prefix part {problem}")]
    KeyPrefix {
        /// The key.
        key: String,
        /// What is wrong with the prefix.
        problem: NameError,
    },
    /// The key's name (after its prefix) is not a label name.
    #[error("invalid label key {key:?}: name part {problem}")]
    KeyName {
        /// The key.
        key: String,
        /// What is wrong with the name.
        problem: LabelNameProblem,
    },
    /// The key has more than one `/`.
    #[error("invalid label key {key:?}: a qualified name has at most one '/'")]
    KeySlashes {
        /// The key.
        key: String,
    },
    /// The value is not a label value.
    #[error("invalid label value {value:?}: a valid label {problem}, or be an empty string")]
    Value {
        /// The value.
        value: String,
        /// What is wrong with it.
        problem: LabelNameProblem,
    },
}

/// The problem with `text` as a label name, if any.
fn name_problem(text: &str) -> Option<LabelNameProblem> {
    let bytes = text.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Some(LabelNameProblem::Empty);
    };
    if bytes.len() > MAX_NAME_LEN {
        return Some(LabelNameProblem::TooLong);
    }
    let inside = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() || !bytes.iter().all(inside)
    {
        return Some(LabelNameProblem::Shape);
    }
    None
}

/// Checks a label (or annotation) key: an optional DNS-1123 subdomain and `/`, then a
/// label name.
pub fn key(key: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if name.contains('/') {
        return Err(LabelError::KeySlashes {
            key: key.to_owned(),
        });
    }
    if let Some(prefix) = prefix
        && let Err(problem) = name::subdomain(prefix)
    {
        return Err(LabelError::KeyPrefix {
            key: key.to_owned(),
            problem,
        });
    }
    match name_problem(name) {
        Some(problem) => Err(LabelError::KeyName {
            key: key.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// Checks a label value: empty, or a label name.
pub fn value(value: &str) -> Result<(), LabelError> {
    match name_problem(value) {
        Some(problem) if !value.is_empty() => Err(LabelError::Value {
            value: value.to_owned(),
            problem,
        }),
        _ => Ok(()),
    }
}

/// A label selector operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelOp {
    /// `key`: the label exists.
    Exists,
    /// `!key`: the label does not exist.
    DoesNotExist,
    /// `key=v` or `key==v`.
    Equals,
    /// `key!=v` (also true without the label).
    NotEquals,
    /// `key in (a,b)`.
    In,
    /// `key notin (a,b)` (also true without the label).
    NotIn,
    /// `key>N`.
    GreaterThan,
    /// `key<N`.
    LessThan,
}

impl LabelOp {
    fn as_str(self) -> &'static str {
        match self {
            Self::Exists => "exists",
            Self::DoesNotExist => "!",
            Self::Equals => "=",
            Self::NotEquals => "!=",
            Self::In => "in",
            Self::NotIn => "notin",
            Self::GreaterThan => ">",
            Self::LessThan => "<",
        }
    }
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRequirement {
    /// The label key.
    pub key: String,
    /// The operator.
    pub op: LabelOp,
    /// The values: one for `=`, `!=`, `>` and `<`, a set for `in` and `notin`, none
    /// for existence.
    pub values: Vec<String>,
}

impl LabelRequirement {
    /// Whether `labels` satisfy the requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.key);
        let listed = || actual.is_some_and(|actual| self.values.contains(actual));
        match self.op {
            LabelOp::Exists => actual.is_some(),
            LabelOp::DoesNotExist => actual.is_none(),
            LabelOp::Equals | LabelOp::In => listed(),
            LabelOp::NotEquals | LabelOp::NotIn => !listed(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let number = |text: Option<&String>| text.and_then(|text| text.parse::<i64>().ok());
                let (Some(actual), Some(bound)) = (number(actual), number(self.values.first()))
                else {
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

/// A parsed label selector: every requirement must hold; the empty selector selects
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// The requirements, in the selector's order.
    pub requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        Parser::new(text)
            .selector()
            .map_err(|problem| SelectorError {
                selector: text.to_owned(),
                problem,
            })
    }

    /// Whether the selector has no requirement (it selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| requirement.matches(labels))
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// Why a label selector is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {problem}")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub problem: SelectorProblem,
}

/// What is wrong with a label selector. `Display` follows the API server's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorProblem {
    /// A requirement must start with a key (or `!` and a key).
    #[error("found {found}, expected: !, identifier")]
    ExpectedKey {
        /// What was found instead.
        found: Found,
    },
    /// A key or value is not one.
    #[error(transparent)]
    Label(#[from] LabelError),
    /// A key is followed by something that is no operator.
    #[error("found {found} after key {key:?}, expected: in, notin, =, ==, !=, gt, lt")]
    ExpectedOperator {
        /// The key.
        key: String,
        /// What was found instead.
        found: Found,
    },
    /// `!key` is followed by an operator.
    #[error("found {found} after '!{key}', expected: ',' or the end")]
    NegatedWithOperator {
        /// The key.
        key: String,
        /// What was found instead.
        found: Found,
    },
    /// `in` or `notin` is not followed by a list in parentheses.
    #[error("found {found} after {key:?} {op}, expected: '('")]
    ExpectedList {
        /// The key.
        key: String,
        /// The operator.
        op: &'static str,
        /// What was found instead.
        found: Found,
    },
    /// A list of values holds something else, or is not closed.
    #[error("found {found} in the values of {key:?}, expected: ',' or ')'")]
    InList {
        /// The key.
        key: String,
        /// What was found instead.
        found: Found,
    },
    /// An operator is followed by something that is no value.
    #[error("found {found} after {key:?} {op}, expected: a value")]
    ExpectedValue {
        /// The key.
        key: String,
        /// The operator.
        op: &'static str,
        /// What was found instead.
        found: Found,
    },
    /// The value of `>` or `<` is not an integer.
    #[error("for 'Gt', 'Lt' operators, the value must be an integer, not {value:?} (key {key:?})")]
    NotAnInteger {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// A requirement is followed by something else than `,` or the end.
    #[error("found {found}, expected: ',' or the end")]
    ExpectedComma {
        /// What was found instead.
        found: Found,
    },
    /// A `,` is followed by nothing.
    #[error("found the end, expected: identifier after ','")]
    TrailingComma,
}

/// What a parser found where it expected something else: a token, or the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found(Option<String>);

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(token) => write!(f, "'{token}'"),
            None => f.write_str("the end"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Open,
    Close,
    Comma,
    Greater,
    Less,
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Self::Word(word) => word,
            Self::Not => "!",
            Self::Equals => "=",
            Self::DoubleEquals => "==",
            Self::NotEquals => "!=",
            Self::Open => "(",
            Self::Close => ")",
            Self::Comma => ",",
            Self::Greater => ">",
            Self::Less => "<",
        }
    }
}

/// The characters that end a word.
fn is_special(c: char) -> bool {
    c.is_whitespace() || matches!(c, '!' | '=' | '(' | ')' | ',' | '>' | '<')
}

fn tokens(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let (token, len) = match c {
            c if c.is_whitespace() => (None, c.len_utf8()),
            '!' if rest.starts_with("!=") => (Some(Token::NotEquals), 2),
            '!' => (Some(Token::Not), 1),
            '=' if rest.starts_with("==") => (Some(Token::DoubleEquals), 2),
            '=' => (Some(Token::Equals), 1),
            '(' => (Some(Token::Open), 1),
            ')' => (Some(Token::Close), 1),
            ',' => (Some(Token::Comma), 1),
            '>' => (Some(Token::Greater), 1),
            '<' => (Some(Token::Less), 1),
            _ => {
                let len = rest.find(is_special).unwrap_or(rest.len());
                (Some(Token::Word(rest[..len].to_owned())), len)
            }
        };
        tokens.extend(token);
        rest = &rest[len..];
    }
    tokens
}

struct Parser {
    tokens: std::iter::Peekable<std::vec::IntoIter<Token>>,
}

impl Parser {
    fn new(text: &str) -> Self {
        Self {
            tokens: tokens(text).into_iter().peekable(),
        }
    }

    fn found(token: Option<&Token>) -> Found {
        Found(token.map(|token| token.text().to_owned()))
    }

    fn selector(&mut self) -> Result<LabelSelector, SelectorProblem> {
        let mut requirements = Vec::new();
        if self.tokens.peek().is_none() {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(self.requirement()?);
            match self.tokens.next() {
                None => return Ok(LabelSelector { requirements }),
                Some(Token::Comma) if self.tokens.peek().is_none() => {
                    return Err(SelectorProblem::TrailingComma);
                }
                Some(Token::Comma) => {}
                other => {
                    return Err(SelectorProblem::ExpectedComma {
                        found: Self::found(other.as_ref()),
                    });
                }
            }
        }
    }

    fn at_end_of_requirement(&mut self) -> bool {
        matches!(self.tokens.peek(), None | Some(Token::Comma))
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorProblem> {
        let negated = self.tokens.next_if_eq(&Token::Not).is_some();
        let key = match self.tokens.next() {
            Some(Token::Word(word)) => word,
            other => {
                return Err(SelectorProblem::ExpectedKey {
                    found: Self::found(other.as_ref()),
                });
            }
        };
        self::key(&key)?;
        if negated {
            if !self.at_end_of_requirement() {
                let found = Self::found(self.tokens.peek());
                return Err(SelectorProblem::NegatedWithOperator { key, found });
            }
            return Ok(LabelRequirement {
                key,
                op: LabelOp::DoesNotExist,
                values: Vec::new(),
            });
        }
        if self.at_end_of_requirement() {
            return Ok(LabelRequirement {
                key,
                op: LabelOp::Exists,
                values: Vec::new(),
            });
        }
        let op = match self.tokens.next() {
            Some(Token::Equals | Token::DoubleEquals) => LabelOp::Equals,
            Some(Token::NotEquals) => LabelOp::NotEquals,
            Some(Token::Greater) => LabelOp::GreaterThan,
            Some(Token::Less) => LabelOp::LessThan,
            Some(Token::Word(word)) if word == "in" => LabelOp::In,
            Some(Token::Word(word)) if word == "notin" => LabelOp::NotIn,
            other => {
                let found = Self::found(other.as_ref());
                return Err(SelectorProblem::ExpectedOperator { key, found });
            }
        };
        let values = match op {
            LabelOp::In | LabelOp::NotIn => self.list(&key, op)?,
            _ => vec![self.single(&key, op)?],
        };
        for text in &values {
            value(text)?;
            if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan)
                && text.parse::<i64>().is_err()
            {
                return Err(SelectorProblem::NotAnInteger {
                    key,
                    value: text.clone(),
                });
            }
        }
        Ok(LabelRequirement { key, op, values })
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`: a word, or the empty value when the
    /// requirement ends there.
    fn single(&mut self, key: &str, op: LabelOp) -> Result<String, SelectorProblem> {
        if self.at_end_of_requirement() {
            return Ok(String::new());
        }
        match self.tokens.next() {
            Some(Token::Word(word)) => Ok(word),
            other => Err(SelectorProblem::ExpectedValue {
                key: key.to_owned(),
                op: op.as_str(),
                found: Self::found(other.as_ref()),
            }),
        }
    }

    /// The values in parentheses after `in` or `notin`; a missing value (`()`, `(a,)`)
    /// is the empty value.
    fn list(&mut self, key: &str, op: LabelOp) -> Result<Vec<String>, SelectorProblem> {
        if self.tokens.next_if_eq(&Token::Open).is_none() {
            return Err(SelectorProblem::ExpectedList {
                key: key.to_owned(),
                op: op.as_str(),
                found: Self::found(self.tokens.peek()),
            });
        }
        let mut values = Vec::new();
        let mut value = None;
        loop {
            match self.tokens.next() {
                Some(Token::Word(word)) if value.is_none() => value = Some(word),
                Some(Token::Comma) => values.push(value.take().unwrap_or_default()),
                Some(Token::Close) => {
                    values.push(value.take().unwrap_or_default());
                    return Ok(values);
                }
                other => {
                    return Err(SelectorProblem::InList {
                        key: key.to_owned(),
                        found: Self::found(other.as_ref()),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Selectors and whether kube-apiserver v1.36.2 accepts them (a list of namespaces
    /// with `labelSelector`: 200 or 400).
    const MEASURED: &[(&str, bool)] = &[
        ("", true),
        ("shard=a", true),
        ("shard==a,env!=prod", true),
        ("router.example.com/shard=a", true),
        ("!canary", true),
        ("canary", true),
        ("env in (prod, staging)", true),
        ("env notin (dev)", true),
        ("tier in ()", true),
        ("tier in (,)", true),
        ("tier in (a,)", true),
        ("replicas>3", true),
        ("a=,b", true),
        ("Shard_1=A.b-c", true),
        ("a notin ()", true),
        ("a > 3", true),
        ("a = b", true),
        (" a=b ", true),
        ("a in(b)", true),
        ("a==", true),
        ("a!=", true),
        ("in=b", true),
        ("notin", true),
        ("! a", true),
        ("a,b,c", true),
        ("shard=a=b", false),
        ("shard=a,", false),
        (",shard=a", false),
        ("=a", false),
        ("shard in a", false),
        ("shard in (a", false),
        ("bad key=a", false),
        ("-shard=a", false),
        ("shard=-a", false),
        ("replicas>three", false),
        ("UPPER.example.com/x=y", false),
        (
            "x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            false,
        ),
        ("shard=a b", false),
        ("!a=b", false),
        ("a!", false),
        ("a in (b) c", false),
        ("a=b,,c=d", false),
        ("a>", false),
        ("a<-3", false),
        ("a>3.5", false),
        ("a>+3", false),
        ("a in (b c)", false),
        ("a=(b)", false),
        ("!!a", false),
        ("x/=y", false),
        ("/x=y", false),
        ("a/b/c=d", false),
    ];

    #[test]
    fn what_the_api_server_accepts_and_refuses() {
        for (selector, accepted) in MEASURED {
            let parsed = LabelSelector::parse(selector);
            assert_eq!(parsed.is_ok(), *accepted, "{selector:?}: {parsed:?}");
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn what_a_selector_matches() {
        let selector =
            LabelSelector::parse("app=web, tier in (a, b),!legacy,env!=prod,n>3").expect("valid");
        assert_eq!(selector.requirements.len(), 5);
        assert!(selector.matches(&labels(&[("app", "web"), ("tier", "a"), ("n", "4")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "c"), ("n", "4")])));
        assert!(!selector.matches(&labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("legacy", ""),
            ("n", "4")
        ])));
        let empty_value = LabelSelector::parse("tier in ()").expect("valid");
        assert!(empty_value.matches(&labels(&[("tier", "")])));
        assert!(!empty_value.matches(&labels(&[])));
        assert!(LabelSelector::default().matches(&labels(&[])));
    }

    #[test]
    fn errors_name_the_selector_and_the_problem() {
        let error = LabelSelector::parse("shard in a").expect_err("refused");
        assert_eq!(error.selector, "shard in a");
        assert!(matches!(
            error.problem,
            SelectorProblem::ExpectedList { op: "in", .. }
        ));
        assert_eq!(
            error.to_string(),
            "invalid label selector \"shard in a\": found 'a' after \"shard\" in, expected: '('"
        );
        let error = LabelSelector::parse("replicas>three").expect_err("refused");
        assert!(error.to_string().contains("must be an integer"), "{error}");
        assert_eq!(
            LabelSelector::parse("a=b,").expect_err("refused").problem,
            SelectorProblem::TrailingComma
        );
    }

    #[test]
    fn keys_and_values() {
        assert_eq!(key("certwatch.io/shard"), Ok(()));
        assert!(matches!(
            key("UPPER.io/x"),
            Err(LabelError::KeyPrefix { .. })
        ));
        assert!(matches!(
            key("x/"),
            Err(LabelError::KeyName {
                problem: LabelNameProblem::Empty,
                ..
            })
        ));
        assert!(matches!(key("a/b/c"), Err(LabelError::KeySlashes { .. })));
        assert_eq!(value(""), Ok(()));
        assert!(matches!(
            value(&"v".repeat(64)),
            Err(LabelError::Value {
                problem: LabelNameProblem::TooLong,
                ..
            })
        ));
    }
}
