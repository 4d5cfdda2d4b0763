//! A strict scanner for PEM text (RFC 7468), with errors that say where and what.
//!
//! Text outside encapsulation boundaries is explanatory text and is ignored, as RFC 7468
//! section 5.2 asks of parsers (OpenSSL writes `Bag Attributes` and `subject=` lines
//! there). Inside a block everything must be well formed: a matching END line, optional
//! RFC 1421 headers (`Proc-Type`, `DEK-Info`), and base64 that decodes.
//!
//! Errors never carry block contents: only labels (sanitized) and line numbers.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

const BEGIN: &str = "-----BEGIN ";
const END: &str = "-----END ";
const DASHES: &str = "-----";

/// Longest label echoed back in an error; longer or odd labels are replaced.
const MAX_LABEL_LEN: usize = 40;

/// One decoded PEM block.
pub(crate) struct PemBlock {
    /// The label between `BEGIN ` and the dashes, e.g. `CERTIFICATE`.
    pub(crate) label: String,
    /// RFC 1421 headers (name, value), e.g. `Proc-Type: 4,ENCRYPTED`.
    pub(crate) headers: Vec<(String, String)>,
    /// The decoded body.
    pub(crate) der: Vec<u8>,
}

/// Shows the label and sizes only: the body may be a private key.
impl std::fmt::Debug for PemBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemBlock")
            .field("label", &display_label(&self.label))
            .field("headers", &self.headers.len())
            .field("der_len", &self.der.len())
            .finish()
    }
}

impl PemBlock {
    /// Whether RFC 1421 headers mark the body as encrypted.
    pub(crate) fn is_encrypted(&self) -> bool {
        self.headers.iter().any(|(name, value)| {
            name.eq_ignore_ascii_case("Proc-Type")
                && value.to_ascii_uppercase().contains("ENCRYPTED")
        })
    }

    /// The label, safe to show to a person.
    pub(crate) fn display_label(&self) -> String {
        display_label(&self.label)
    }
}

/// What is wrong with PEM text. Line numbers are 1-based.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PemProblem {
    /// A `-----BEGIN` or `-----END` line that is not of the form `-----BEGIN LABEL-----`.
    #[error("line {line} is a broken encapsulation boundary (expected `-----BEGIN LABEL-----`)")]
    BadBoundary {
        /// Line of the boundary.
        line: usize,
    },
    /// A block that never ends.
    #[error("the {label} block that begins on line {line} has no END line")]
    Unterminated {
        /// Label of the block.
        label: String,
        /// Line of the BEGIN boundary.
        line: usize,
    },
    /// An END line whose label differs from its BEGIN line.
    #[error("the {begin} block that begins on line {line} ends with END {end}")]
    MismatchedEnd {
        /// Label on the BEGIN line.
        begin: String,
        /// Label on the END line.
        end: String,
        /// Line of the BEGIN boundary.
        line: usize,
    },
    /// An END line outside any block.
    #[error("line {line} ends a {label} block that never began")]
    StrayEnd {
        /// Label on the END line.
        label: String,
        /// Line of the END boundary.
        line: usize,
    },
    /// A BEGIN line inside another block.
    #[error("the {label} block that begins on line {line} contains another BEGIN line")]
    NestedBegin {
        /// Label of the outer block.
        label: String,
        /// Line of the outer BEGIN boundary.
        line: usize,
    },
    /// A body that is not valid base64.
    #[error("the {label} block that begins on line {line} is not valid base64")]
    InvalidBase64 {
        /// Label of the block.
        label: String,
        /// Line of the BEGIN boundary.
        line: usize,
    },
    /// A block with no body.
    #[error("the {label} block that begins on line {line} is empty")]
    EmptyBlock {
        /// Label of the block.
        label: String,
        /// Line of the BEGIN boundary.
        line: usize,
    },
}

/// A label as it may appear in messages: PEM labels are short upper-case words, anything
/// else is replaced so that stray content of a key file never reaches an error.
pub(crate) fn display_label(label: &str) -> String {
    let looks_like_label = !label.is_empty()
        && label.len() <= MAX_LABEL_LEN
        && label
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == ' ' || c == '-');
    if looks_like_label {
        label.to_owned()
    } else {
        "<unrecognized label>".to_owned()
    }
}

/// Parses a boundary line, returning its label, or `None` when the line is no boundary.
fn boundary<'a>(line: &'a str, prefix: &str, number: usize) -> Result<Option<&'a str>, PemProblem> {
    let Some(rest) = line.strip_prefix(prefix) else {
        return Ok(None);
    };
    match rest.trim_end().strip_suffix(DASHES) {
        Some(label) if !label.contains(DASHES) => Ok(Some(label)),
        _ => Err(PemProblem::BadBoundary { line: number }),
    }
}

/// An open block while scanning.
struct OpenBlock<'a> {
    label: &'a str,
    line: usize,
    body: Vec<&'a str>,
}

/// Splits `text` into PEM blocks. An input without any block yields an empty list; the
/// caller decides what that means for its file.
pub(crate) fn parse(text: &str) -> Result<Vec<PemBlock>, PemProblem> {
    let mut blocks = Vec::new();
    let mut open: Option<OpenBlock<'_>> = None;
    for (index, raw_line) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw_line.trim_start();
        let begin = boundary(line, BEGIN, number)?;
        let end = boundary(line, END, number)?;
        match (open.take(), begin, end) {
            (None, Some(label), _) => {
                open = Some(OpenBlock {
                    label,
                    line: number,
                    body: Vec::new(),
                });
            }
            (None, None, Some(label)) => {
                return Err(PemProblem::StrayEnd {
                    label: display_label(label),
                    line: number,
                });
            }
            (None, None, None) => {}
            (Some(block), Some(_), _) => {
                return Err(PemProblem::NestedBegin {
                    label: display_label(block.label),
                    line: block.line,
                });
            }
            (Some(block), None, Some(label)) => {
                if label != block.label {
                    return Err(PemProblem::MismatchedEnd {
                        begin: display_label(block.label),
                        end: display_label(label),
                        line: block.line,
                    });
                }
                blocks.push(decode_block(block)?);
            }
            (Some(mut block), None, None) => {
                block.body.push(line);
                open = Some(block);
            }
        }
    }
    match open {
        Some(block) => Err(PemProblem::Unterminated {
            label: display_label(block.label),
            line: block.line,
        }),
        None => Ok(blocks),
    }
}

fn decode_block(block: OpenBlock<'_>) -> Result<PemBlock, PemProblem> {
    let OpenBlock { label, line, body } = block;
    // RFC 1421 headers sit before the first blank line and each contains a colon; base64
    // never does, so a colon on the first body line tells headers apart.
    let mut headers = Vec::new();
    let mut lines = body.as_slice();
    if lines.first().is_some_and(|first| first.contains(':')) {
        let mut consumed = 0;
        for header in lines {
            consumed += 1;
            let header = header.trim();
            if header.is_empty() {
                break;
            }
            match header.split_once(':') {
                Some((name, value)) => {
                    headers.push((name.trim().to_owned(), value.trim().to_owned()))
                }
                // A header folded onto the next line continues the previous value.
                None => {
                    if let Some((_, value)) = headers.last_mut() {
                        value.push_str(header);
                    }
                }
            }
        }
        lines = &lines[consumed..];
    }
    let mut encoded = String::with_capacity(lines.iter().map(|l| l.len()).sum());
    for chunk in lines {
        encoded.extend(chunk.chars().filter(|c| !c.is_ascii_whitespace()));
    }
    if encoded.is_empty() {
        return Err(PemProblem::EmptyBlock {
            label: display_label(label),
            line,
        });
    }
    let der = STANDARD
        .decode(encoded.as_bytes())
        .map_err(|_| PemProblem::InvalidBase64 {
            label: display_label(label),
            line,
        })?;
    Ok(PemBlock {
        label: label.to_owned(),
        headers,
        der,
    })
}

/// Encodes `der` as a PEM block with 64-character lines.
pub(crate) fn encode(label: &str, der: &[u8]) -> String {
    let encoded = STANDARD.encode(der);
    let mut out = String::with_capacity(encoded.len() + encoded.len() / 64 + 2 * label.len() + 32);
    out.push_str(BEGIN);
    out.push_str(label);
    out.push_str("-----\n");
    // Base64 output is ASCII, so splitting bytes keeps characters whole.
    for chunk in encoded.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(END);
    out.push_str(label);
    out.push_str("-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(text: &str) -> Vec<String> {
        parse(text)
            .unwrap()
            .into_iter()
            .map(|block| block.label)
            .collect()
    }

    #[test]
    fn round_trips_through_encode() {
        let der: Vec<u8> = (0..=255).collect();
        let text = encode("CERTIFICATE", &der);
        let blocks = parse(&text).unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].label, "CERTIFICATE");
        assert_eq!(blocks[0].der, der);
        assert!(text.lines().all(|line| line.len() <= 64));
    }

    #[test]
    fn ignores_explanatory_text_and_crlf() {
        let text = format!(
            "Bag Attributes\r\n    localKeyID: 01\r\nsubject=CN = a\r\n{}\r\ntrailing words\r\n{}",
            encode("CERTIFICATE", b"one").replace('\n', "\r\n"),
            encode("CERTIFICATE", b"two")
        );
        assert_eq!(labels(&text), ["CERTIFICATE", "CERTIFICATE"]);
    }

    #[test]
    fn no_blocks_is_empty_not_an_error() {
        assert!(parse("hello world\n").unwrap().is_empty());
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn reads_rfc1421_headers() {
        let text = "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAEC\n-----END EC PRIVATE KEY-----\n";
        let blocks = parse(text).unwrap();
        assert!(blocks[0].is_encrypted());
        assert_eq!(blocks[0].der, [0, 1, 2]);
    }

    #[test]
    fn each_structural_problem_has_its_own_variant() {
        let cases: [(&str, PemProblem); 7] = [
            (
                "-----BEGIN CERTIFICATE\nAAEC\n-----END CERTIFICATE-----\n",
                PemProblem::BadBoundary { line: 1 },
            ),
            (
                "x\n-----BEGIN CERTIFICATE-----\nAAEC\n",
                PemProblem::Unterminated {
                    label: "CERTIFICATE".into(),
                    line: 2,
                },
            ),
            (
                "-----BEGIN CERTIFICATE-----\nAAEC\n-----END PRIVATE KEY-----\n",
                PemProblem::MismatchedEnd {
                    begin: "CERTIFICATE".into(),
                    end: "PRIVATE KEY".into(),
                    line: 1,
                },
            ),
            (
                "-----END CERTIFICATE-----\n",
                PemProblem::StrayEnd {
                    label: "CERTIFICATE".into(),
                    line: 1,
                },
            ),
            (
                "-----BEGIN CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\n",
                PemProblem::NestedBegin {
                    label: "CERTIFICATE".into(),
                    line: 1,
                },
            ),
            (
                "-----BEGIN CERTIFICATE-----\nnot*base64!\n-----END CERTIFICATE-----\n",
                PemProblem::InvalidBase64 {
                    label: "CERTIFICATE".into(),
                    line: 1,
                },
            ),
            (
                "-----BEGIN CERTIFICATE-----\n\n-----END CERTIFICATE-----\n",
                PemProblem::EmptyBlock {
                    label: "CERTIFICATE".into(),
                    line: 1,
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text).err(), Some(expected), "input: {text:?}");
        }
    }

    #[test]
    fn odd_labels_are_not_echoed() {
        let text = "-----END MIIEvQIBADANBgkqhkiG9w0BAQEFAASC-----\n";
        let err = parse(text).unwrap_err();
        assert!(!err.to_string().contains("MIIEv"), "{err}");
        assert_eq!(display_label("RSA PRIVATE KEY"), "RSA PRIVATE KEY");
        assert_eq!(display_label("lower"), "<unrecognized label>");
    }
}
