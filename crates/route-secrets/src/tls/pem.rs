//! A scanner for PEM text (RFC 7468) that reads what Go's `encoding/pem` reads.
//!
//! The router decodes `tls.crt` and `tls.key` with Go's `pem.Decode`, which treats text
//! outside encapsulation boundaries as explanatory text and silently skips a block it
//! cannot decode (a broken boundary, a missing or mismatched END line, a nested BEGIN,
//! bad base64), carrying on after that block's BEGIN line. [`scan`] does the same, but
//! reports each skipped block as a [`PemProblem`], so that a caller can tell a person
//! why a certificate was not found, or warn that a block was left out.
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

/// Why a PEM block was skipped. Line numbers are 1-based.
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

/// What a line is to the scanner.
enum Line<'a> {
    /// Explanatory text, or block contents.
    Text,
    /// `-----BEGIN LABEL-----`.
    Begin(&'a str),
    /// `-----END LABEL-----`.
    End(&'a str),
    /// A line that starts like a boundary but is not one.
    BrokenBoundary,
}

fn classify(line: &str) -> Line<'_> {
    let line = line.trim_start();
    let (rest, begin) = if let Some(rest) = line.strip_prefix(BEGIN) {
        (rest, true)
    } else if let Some(rest) = line.strip_prefix(END) {
        (rest, false)
    } else {
        return Line::Text;
    };
    match rest.trim_end().strip_suffix(DASHES) {
        Some(label) if !has_dashes(label) && begin => Line::Begin(label),
        Some(label) if !has_dashes(label) => Line::End(label),
        _ => Line::BrokenBoundary,
    }
}

/// Whether `label` contains [`DASHES`]: `str::contains` with a string pattern sets up a
/// two-way searcher each time, more work than the search in a label of a few bytes
/// (about 1 % of the start-up's instructions, nine boundaries per route).
fn has_dashes(label: &str) -> bool {
    label
        .as_bytes()
        .windows(DASHES.len())
        .any(|window| window == DASHES.as_bytes())
}

/// The blocks of a PEM text, and the blocks that were skipped.
#[derive(Debug, Default)]
pub(crate) struct PemScan {
    /// Blocks that decoded, in order.
    pub(crate) blocks: Vec<PemBlock>,
    /// Why each skipped block was skipped, in order.
    pub(crate) skipped: Vec<PemProblem>,
}

/// Splits `text` into PEM blocks, skipping (and reporting) those Go's `pem.Decode` would
/// skip. Lines outside blocks, stray END lines included, are explanatory text. Runs in
/// time linear in the number of lines: after a broken block, scanning resumes at the
/// first boundary line after its BEGIN line, where Go would find its next block too.
pub(crate) fn scan(text: &str) -> PemScan {
    let lines: Vec<&str> = text.lines().collect();
    let mut scan = PemScan::default();
    let mut index = 0;
    while index < lines.len() {
        let begin_line = index + 1;
        let label = match classify(lines[index]) {
            Line::Begin(label) => label,
            Line::BrokenBoundary if lines[index].trim_start().starts_with(BEGIN) => {
                scan.skipped
                    .push(PemProblem::BadBoundary { line: begin_line });
                index += 1;
                continue;
            }
            Line::Text | Line::End(_) | Line::BrokenBoundary => {
                index += 1;
                continue;
            }
        };
        index += 1;
        let body_start = index;
        while index < lines.len() && matches!(classify(lines[index]), Line::Text) {
            index += 1;
        }
        let Some(closing) = lines.get(index) else {
            scan.skipped.push(PemProblem::Unterminated {
                label: display_label(label),
                line: begin_line,
            });
            break;
        };
        match classify(closing) {
            Line::End(end) if end == label => {
                match decode_block(label, begin_line, &lines[body_start..index]) {
                    Ok(block) => scan.blocks.push(block),
                    Err(problem) => scan.skipped.push(problem),
                }
                index += 1;
            }
            Line::End(end) => {
                scan.skipped.push(PemProblem::MismatchedEnd {
                    begin: display_label(label),
                    end: display_label(end),
                    line: begin_line,
                });
                index += 1;
            }
            // A BEGIN inside the block: the block is skipped and the inner BEGIN line
            // is read again as the start of the next one.
            Line::Begin(_) => scan.skipped.push(PemProblem::NestedBegin {
                label: display_label(label),
                line: begin_line,
            }),
            Line::BrokenBoundary if closing.trim_start().starts_with(BEGIN) => {
                scan.skipped.push(PemProblem::NestedBegin {
                    label: display_label(label),
                    line: begin_line,
                });
            }
            Line::BrokenBoundary | Line::Text => {
                scan.skipped
                    .push(PemProblem::BadBoundary { line: index + 1 });
                index += 1;
            }
        }
    }
    scan
}

/// Decodes the body lines of a block whose BEGIN boundary is on `line`. An empty body
/// is an empty block (Go decodes it as zero bytes; what it should hold then fails to
/// parse, with a message of its own).
fn decode_block(label: &str, line: usize, body: &[&str]) -> Result<PemBlock, PemProblem> {
    // RFC 1421 headers sit before the first blank line and each contains a colon; base64
    // never does, so a colon on the first body line tells headers apart.
    let mut headers = Vec::new();
    let mut lines = body;
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
    let der = decode_body(lines).ok_or_else(|| PemProblem::InvalidBase64 {
        label: display_label(label),
        line,
    })?;
    Ok(PemBlock {
        label: label.to_owned(),
        headers,
        der,
    })
}

/// Decodes a block's base64 body lines as Go does: as one text, whitespace removed.
///
/// Each line is first decoded on its own straight into the result, as encoders write
/// them (every line but the last whole four-character groups, no padding before the
/// last line, no whitespace): base64 decodes group by group, so that is the decoding of
/// the joined text, padding and its checks in the last line either way. The decoder
/// checks every character as it goes, so no pass of its own looks at them first: a line
/// it refuses (whitespace, a character outside the alphabet, padding inside a line)
/// sends the whole body to the joined decoding, which gives the answer. Only padding
/// at the end of a line before the last one decodes on its own but not joined; such a
/// body is joined from the start.
fn decode_body(lines: &[&str]) -> Option<Vec<u8>> {
    let by_line = match lines.split_last() {
        None => true,
        Some((_, before)) => before
            .iter()
            .all(|line| line.len().is_multiple_of(4) && !line.ends_with('=')),
    };
    if !by_line {
        return decode_joined(lines);
    }
    let length: usize = lines.iter().map(|line| line.len()).sum();
    let mut der = vec![0; length.div_ceil(4) * 3];
    let mut written = 0;
    for line in lines {
        match STANDARD.decode_slice(line.as_bytes(), &mut der[written..]) {
            Ok(decoded) => written += decoded,
            Err(_) => return decode_joined(lines),
        }
    }
    der.truncate(written);
    Some(der)
}

/// [`decode_body`] through one copy of the text: byte by byte, not char by char
/// (whitespace is ASCII, and any other byte goes to the base64 decoder as it is, which
/// refuses what is not base64).
fn decode_joined(lines: &[&str]) -> Option<Vec<u8>> {
    let mut encoded = Vec::with_capacity(lines.iter().map(|l| l.len()).sum());
    for chunk in lines {
        encoded.extend(
            chunk
                .as_bytes()
                .iter()
                .filter(|byte| !byte.is_ascii_whitespace()),
        );
    }
    STANDARD.decode(&encoded).ok()
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

/// Whether `text` is exactly the concatenation of `blocks` (label, DER) as [`encode`]
/// writes them, decided without writing the text: checking that a secret's entry is
/// already the served rendering costs no allocation.
pub(crate) fn is_encoding_of<'a>(
    text: &[u8],
    blocks: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> bool {
    let mut rest = text;
    for (label, der) in blocks {
        match strip_encoded(rest, label, der) {
            Some(after) => rest = after,
            None => return false,
        }
    }
    rest.is_empty()
}

/// `text` after the block [`encode`] writes for `label` and `der`, if `text` begins
/// with it. Each 48 bytes of DER are one full 64-character line of base64, so encoding
/// line by line gives the lines `encode` cuts from the whole encoding.
fn strip_encoded<'t>(text: &'t [u8], label: &str, der: &[u8]) -> Option<&'t [u8]> {
    let boundary = |text: &'t [u8], start: &str| {
        text.strip_prefix(start.as_bytes())?
            .strip_prefix(label.as_bytes())?
            .strip_prefix(b"-----\n".as_slice())
    };
    let mut rest = boundary(text, BEGIN)?;
    let mut line = [0; 64];
    for chunk in der.chunks(48) {
        let written = STANDARD.encode_slice(chunk, &mut line).ok()?;
        rest = rest.strip_prefix(&line[..written])?.strip_prefix(b"\n")?;
    }
    boundary(rest, END)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(text: &str) -> Vec<String> {
        let scan = scan(text);
        assert_eq!(scan.skipped, [], "{text:?}");
        scan.blocks.into_iter().map(|block| block.label).collect()
    }

    #[test]
    fn an_encoding_is_recognized_without_writing_it() {
        let key = b"key".as_slice();
        // Around the 48-byte lines: empty, partial, exactly full, one byte over.
        for len in [0usize, 1, 2, 3, 47, 48, 49, 95, 96, 97, 300] {
            let der: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let certificate = ("CERTIFICATE", der.as_slice());
            let one = encode("CERTIFICATE", &der);
            let two = format!("{one}{}", encode("PRIVATE KEY", key));
            assert!(is_encoding_of(one.as_bytes(), [certificate]), "{len}");
            assert!(
                is_encoding_of(two.as_bytes(), [certificate, ("PRIVATE KEY", key)]),
                "{len}"
            );
            // Any other text is not: a block more or less, another order or label,
            // a trailing newline, CRLF line ends, other bytes.
            assert!(!is_encoding_of(two.as_bytes(), [certificate]), "{len}");
            assert!(!is_encoding_of(
                one.as_bytes(),
                [certificate, ("PRIVATE KEY", key)]
            ));
            assert!(!is_encoding_of(
                two.as_bytes(),
                [("PRIVATE KEY", key), certificate]
            ));
            assert!(!is_encoding_of(
                one.as_bytes(),
                [("PRIVATE KEY", der.as_slice())]
            ));
            assert!(!is_encoding_of(
                format!("{one}\n").as_bytes(),
                [certificate]
            ));
            assert!(!is_encoding_of(
                one.replace('\n', "\r\n").as_bytes(),
                [certificate]
            ));
            assert!(!is_encoding_of(one.trim_end().as_bytes(), [certificate]));
            let mut other = der.clone();
            other.push(1);
            assert!(!is_encoding_of(
                one.as_bytes(),
                [("CERTIFICATE", other.as_slice())]
            ));
        }
    }

    #[test]
    fn a_body_decodes_line_by_line_as_it_decodes_joined() {
        let der: Vec<u8> = (0..200u32).map(|i| (i * 13 % 256) as u8).collect();
        let text = STANDARD.encode(&der);
        let cut = |width: usize| -> Vec<String> {
            text.as_bytes()
                .chunks(width)
                .map(|chunk| String::from_utf8_lossy(chunk).into_owned())
                .collect()
        };
        let mut bodies: Vec<Vec<String>> =
            [64, 76, 4, 63, 65, 1, 1000].into_iter().map(cut).collect();
        let lines = cut(64);
        let edited = |edit: &dyn Fn(&mut Vec<String>)| {
            let mut lines = lines.clone();
            edit(&mut lines);
            lines
        };
        bodies.extend([
            Vec::new(),
            vec![String::new()],
            edited(&|lines| lines.push(String::new())),
            edited(&|lines| lines[0].push(' ')),
            edited(&|lines| lines[1].insert(0, '\t')),
            edited(&|lines| lines.last_mut().unwrap().push('\r')),
            edited(&|lines| lines[0].replace_range(60.., "QQ==")),
            edited(&|lines| lines[0].replace_range(10..11, "*")),
            edited(&|lines| lines.last_mut().unwrap().push('=')),
            edited(&|lines| lines.last_mut().unwrap().truncate(2)),
            edited(&|lines| lines.last_mut().unwrap().push_str("QQ")),
            vec!["QR==".to_owned()],
            vec!["QQ==".to_owned(), "QQ==".to_owned()],
            // Lines of whole groups that the decoder refuses on their own.
            edited(&|lines| lines[0].replace_range(60.., " QQQ")),
            edited(&|lines| lines[0].replace_range(60.., "QQ=Q")),
            edited(&|lines| lines[0].replace_range(60.., "Q\u{e9}Q")),
            edited(&|lines| lines[1].replace_range(0..4, "\tQQQ")),
            edited(&|lines| lines.last_mut().unwrap().insert(0, ' ')),
            vec!["QQ==".to_owned(), String::new()],
            vec!["QUFB".to_owned(), " ".to_owned(), "QQ==".to_owned()],
        ]);
        for body in &bodies {
            let body: Vec<&str> = body.iter().map(String::as_str).collect();
            assert_eq!(decode_body(&body), decode_joined(&body), "{body:?}");
        }
        assert_eq!(
            decode_body(&cut(64).iter().map(String::as_str).collect::<Vec<_>>()),
            Some(der)
        );
    }

    #[test]
    fn round_trips_through_encode() {
        let der: Vec<u8> = (0..=255).collect();
        let text = encode("CERTIFICATE", &der);
        let blocks = scan(&text).blocks;
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].label, "CERTIFICATE");
        assert_eq!(blocks[0].der, der);
        assert!(text.lines().all(|line| line.len() <= 64));
    }

    #[test]
    fn ignores_explanatory_text_stray_ends_and_crlf() {
        let text = format!(
            "Bag Attributes\r\n    localKeyID: 01\r\nsubject=CN = a\r\n{}\r\ntrailing words\r\n\
             -----END CERTIFICATE-----\n{}",
            encode("CERTIFICATE", b"one").replace('\n', "\r\n"),
            encode("CERTIFICATE", b"two")
        );
        assert_eq!(labels(&text), ["CERTIFICATE", "CERTIFICATE"]);
    }

    #[test]
    fn no_blocks_is_empty_not_an_error() {
        assert!(scan("hello world\n").blocks.is_empty());
        assert!(scan("").blocks.is_empty());
        assert!(scan("hello world\n").skipped.is_empty());
    }

    #[test]
    fn reads_rfc1421_headers() {
        let text = "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAEC\n-----END EC PRIVATE KEY-----\n";
        let blocks = scan(text).blocks;
        assert!(blocks[0].is_encrypted());
        assert_eq!(blocks[0].der, [0, 1, 2]);
    }

    #[test]
    fn an_empty_block_decodes_to_nothing() {
        let blocks = scan("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n").blocks;
        assert_eq!(blocks.len(), 1);
        assert!(blocks[0].der.is_empty());
    }

    #[test]
    fn each_broken_block_is_skipped_with_its_own_problem() {
        let cases: [(&str, PemProblem); 6] = [
            (
                "-----BEGIN CERTIFICATE\nAAEC\n-----END CERTIFICATE-----\n",
                PemProblem::BadBoundary { line: 1 },
            ),
            (
                "-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE\n",
                PemProblem::BadBoundary { line: 3 },
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
                "-----BEGIN CERTIFICATE-----\n-----BEGIN CERTIFICATE\n",
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
        ];
        for (text, expected) in cases {
            let scan = scan(text);
            assert!(scan.blocks.is_empty(), "input: {text:?}");
            assert_eq!(scan.skipped.first(), Some(&expected), "input: {text:?}");
        }
    }

    #[test]
    fn scanning_goes_on_after_a_broken_block() {
        // As Go's pem.Decode: a truncated block, then a block nested in it, then one
        // after a mismatched END: the two good ones are found.
        let good = encode("CERTIFICATE", b"good");
        let text = format!(
            "-----BEGIN CERTIFICATE-----\nAAEC\n{good}-----BEGIN CERTIFICATE-----\nAAEC\n\
             -----END X509 CRL-----\n{good}"
        );
        let scan = scan(&text);
        let ders: Vec<&[u8]> = scan.blocks.iter().map(|b| b.der.as_slice()).collect();
        assert_eq!(ders, [b"good".as_slice(), b"good".as_slice()]);
        assert!(matches!(
            scan.skipped[0],
            PemProblem::NestedBegin { line: 1, .. }
        ));
        assert!(matches!(
            scan.skipped[1],
            PemProblem::MismatchedEnd { line: 6, .. }
        ));
    }

    #[test]
    fn many_unterminated_blocks_are_each_skipped_once() {
        let text = "-----BEGIN CERTIFICATE-----\nAAEC\n".repeat(50_000);
        let scan = scan(&text);
        assert!(scan.blocks.is_empty());
        // Each BEGIN is nested in the previous one; the last never ends.
        assert_eq!(scan.skipped.len(), 50_000);
    }

    #[test]
    fn odd_labels_are_not_echoed() {
        let text = "-----BEGIN MIIEvQIBADANBgkqhkiG9w0BAQEFAASC-----\nAAEC\n";
        let problem = &scan(text).skipped[0];
        assert!(!problem.to_string().contains("MIIEv"), "{problem}");
        assert_eq!(display_label("RSA PRIVATE KEY"), "RSA PRIVATE KEY");
        assert_eq!(display_label("lower"), "<unrecognized label>");
    }

    #[test]
    fn dashes_in_a_label_are_found_as_contains_finds_them() {
        let labels = [
            "",
            "-",
            "----",
            "-----",
            "------",
            "A-----",
            "-----A",
            "A-----B",
            "A----B",
            "CERTIFICATE",
            "EC PRIVATE KEY",
            "X-Y-Z",
            "A--------B",
            "é-----",
            "A----é-",
        ];
        for label in labels {
            assert_eq!(has_dashes(label), label.contains(DASHES), "{label:?}");
        }
        // And the boundaries they make: a label holding five dashes is no boundary.
        assert!(matches!(
            classify("-----BEGIN A-----B-----"),
            Line::BrokenBoundary
        ));
        assert!(matches!(
            classify("-----END A----B-----"),
            Line::End("A----B")
        ));
    }
}
