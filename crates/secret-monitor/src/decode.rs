//! An incremental decoder of a watch response: newline-delimited JSON events, split
//! into lines as the body's chunks arrive.
//!
//! A watch on one object is idle nearly all its life, and ten thousand of them are
//! open at once, so the decoder keeps no buffer while idle: a line that arrives whole in
//! one chunk (the usual case: the API server writes each event at once, and an HTTP/2
//! DATA frame holds 16 KiB) is handed out as a slice of that chunk, without a copy;
//! only a line split across chunks is gathered into a buffer, which grows as far as
//! that line needs and is handed out with it. Between events the decoder holds two
//! empty handles. (kube-client's line framing keeps an 8 KiB buffer per open watch.)

use std::ops::Deref;

use bytes::Bytes;

/// The longest line accepted. kube-apiserver stores objects of at most 1.5 MiB (etcd's
/// default request limit), which JSON and base64 may double; anything far beyond that
/// is not a watch event.
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;

/// A line longer than [`MAX_LINE`] arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineTooLong;

/// One complete line, without its newline.
#[derive(Debug)]
pub(crate) enum Line {
    /// A slice of one received chunk (no copy).
    Shared(Bytes),
    /// Gathered from several chunks.
    Gathered(Vec<u8>),
}

impl Deref for Line {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Line::Shared(bytes) => bytes,
            Line::Gathered(bytes) => bytes,
        }
    }
}

/// Splits a byte stream into lines. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct LineDecoder {
    /// The part of the last chunk not yet split into lines.
    rest: Bytes,
    /// The beginning of a line whose end has not arrived; empty (unallocated) otherwise.
    partial: Vec<u8>,
}

impl LineDecoder {
    /// Adds a chunk of the body. Call only once [`next_line`](Self::next_line) has
    /// returned `Ok(None)`: the previous chunk is used up then.
    pub(crate) fn push(&mut self, chunk: Bytes) {
        debug_assert!(
            self.rest.is_empty(),
            "push before the last chunk was used up"
        );
        self.rest = chunk;
    }

    /// The next complete, non-blank line, or `None` when more bytes are needed.
    pub(crate) fn next_line(&mut self) -> Result<Option<Line>, LineTooLong> {
        while !self.rest.is_empty() {
            // memchr's search a word or a vector at a time: a watch event is kilobytes
            // of JSON on one line, and a byte-by-byte search of each was 2 % of the
            // start-up's instructions.
            let Some(end) = memchr::memchr(b'\n', &self.rest) else {
                // No end in sight: keep the beginning for the next chunk.
                if self.partial.len() + self.rest.len() > MAX_LINE {
                    self.partial = Vec::new();
                    self.rest = Bytes::new();
                    return Err(LineTooLong);
                }
                self.partial.extend_from_slice(&self.rest);
                self.rest = Bytes::new();
                return Ok(None);
            };
            let mut line = self.rest.split_to(end + 1);
            line.truncate(end);
            if self.rest.is_empty() {
                // An empty slice still holds the whole chunk (up to a 16 KiB DATA
                // frame) alive: let go of it, so an idle watch holds nothing.
                self.rest = Bytes::new();
            }
            let line = if self.partial.is_empty() {
                Line::Shared(line)
            } else {
                if self.partial.len() + line.len() > MAX_LINE {
                    self.partial = Vec::new();
                    return Err(LineTooLong);
                }
                self.partial.extend_from_slice(&line);
                // Handed out with the line, so nothing stays allocated between events.
                Line::Gathered(std::mem::take(&mut self.partial))
            };
            if !is_blank(&line) {
                return Ok(Some(line));
            }
        }
        Ok(None)
    }

    /// At the end of the body: the last line, if the body did not end with a newline.
    pub(crate) fn finish(&mut self) -> Option<Line> {
        let line = Line::Gathered(std::mem::take(&mut self.partial));
        (!is_blank(&line)).then_some(line)
    }

    /// Bytes held now (for tests of the idle footprint).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.rest.len() + self.partial.capacity()
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn drain(decoder: &mut LineDecoder) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(line) = decoder.next_line().unwrap() {
            lines.push(String::from_utf8(line.to_vec()).unwrap());
        }
        lines
    }

    #[test]
    fn whole_lines_are_slices_of_their_chunk() {
        let mut decoder = LineDecoder::default();
        decoder.push(Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n"));
        let first = decoder.next_line().unwrap().unwrap();
        assert!(matches!(first, Line::Shared(_)));
        assert_eq!(&*first, b"{\"a\":1}");
        assert_eq!(drain(&mut decoder), ["{\"b\":2}"]);
        assert_eq!(decoder.held(), 0);
    }

    #[test]
    fn a_split_line_is_gathered_and_the_buffer_released() {
        let mut decoder = LineDecoder::default();
        decoder.push(Bytes::from_static(b"{\"a\":"));
        assert!(decoder.next_line().unwrap().is_none());
        decoder.push(Bytes::from_static(b"1}\n{\"b\""));
        let line = decoder.next_line().unwrap().unwrap();
        assert!(matches!(line, Line::Gathered(_)));
        assert_eq!(&*line, b"{\"a\":1}");
        assert!(decoder.next_line().unwrap().is_none());
        decoder.push(Bytes::from_static(b":2}\n"));
        assert_eq!(drain(&mut decoder), ["{\"b\":2}"]);
        // Idle between events: nothing held.
        assert_eq!(decoder.held(), 0);
    }

    #[test]
    fn blank_lines_are_skipped_and_a_last_line_without_newline_is_kept() {
        let mut decoder = LineDecoder::default();
        decoder.push(Bytes::from_static(b"\n\r\n{\"a\":1}\n  \n{\"b\""));
        assert_eq!(drain(&mut decoder), ["{\"a\":1}"]);
        decoder.push(Bytes::from_static(b":2}"));
        assert!(decoder.next_line().unwrap().is_none());
        assert_eq!(&*decoder.finish().unwrap(), b"{\"b\":2}");
        assert!(decoder.finish().is_none());
    }

    #[test]
    fn long_lines_are_split_at_each_newline() {
        // Lines of kilobytes, as watch events are, with newlines around the word and
        // vector boundaries of the search, in one chunk and cut into uneven chunks.
        let lengths = [1, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 4_000, 17_000, 2];
        let lines: Vec<String> = lengths
            .iter()
            .enumerate()
            .map(|(i, len)| "x".repeat(*len - 1) + &((i % 10).to_string()))
            .collect();
        let body: String = lines.iter().map(|line| format!("{line}\n")).collect();
        let mut decoder = LineDecoder::default();
        decoder.push(Bytes::from(body.clone()));
        assert_eq!(drain(&mut decoder), lines);
        let mut decoder = LineDecoder::default();
        let mut got = Vec::new();
        for chunk in body.as_bytes().chunks(4_099) {
            decoder.push(Bytes::copy_from_slice(chunk));
            got.extend(drain(&mut decoder));
        }
        assert_eq!(got, lines);
        assert_eq!(decoder.held(), 0);
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut decoder = LineDecoder::default();
        let chunk = Bytes::from(vec![b'x'; MAX_LINE / 2 + 1]);
        decoder.push(chunk.clone());
        assert_eq!(decoder.next_line().unwrap().map(|l| l.len()), None);
        decoder.push(chunk);
        assert_eq!(decoder.next_line().unwrap_err(), LineTooLong);
        assert_eq!(decoder.held(), 0);
    }

    proptest! {
        /// However the body is cut into chunks, the same lines come out.
        #[test]
        fn any_chunking_yields_the_same_lines(
            lines in proptest::collection::vec("[a-z{}\":,0-9]{1,40}", 0..20),
            cuts in proptest::collection::vec(0usize..2000, 0..30),
        ) {
            let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let bytes = body.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < bytes.len()).collect();
            cuts.push(0);
            cuts.push(bytes.len());
            cuts.sort_unstable();
            cuts.dedup();
            let mut decoder = LineDecoder::default();
            let mut seen = Vec::new();
            for window in cuts.windows(2) {
                decoder.push(Bytes::copy_from_slice(&bytes[window[0]..window[1]]));
                seen.extend(drain(&mut decoder));
            }
            prop_assert!(decoder.finish().is_none());
            prop_assert_eq!(seen, lines);
            prop_assert_eq!(decoder.held(), 0);
        }
    }
}
