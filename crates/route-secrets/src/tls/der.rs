//! Small helpers over `asn1-rs` for reading private-key structures element by element.
//!
//! They return `None` on any malformation; callers turn that into an error that names the
//! structure, never the bytes.

use x509_parser::asn1_rs::{Any, Class, FromDer, Tag};

/// Reads one DER element from the front of `input`.
pub(crate) fn element(input: &[u8]) -> Option<(&[u8], Any<'_>)> {
    Any::from_der(input).ok()
}

/// The contents of `input` if it is exactly one SEQUENCE.
pub(crate) fn whole_sequence(input: &[u8]) -> Option<&[u8]> {
    let (rest, any) = element(input)?;
    (rest.is_empty() && any.class() == Class::Universal && any.tag() == Tag::Sequence)
        .then_some(any.data)
}

/// Iterates the elements inside a constructed value.
pub(crate) struct Elements<'a> {
    rest: &'a [u8],
}

impl<'a> Elements<'a> {
    /// Iterates the elements of `contents` (the data of a SEQUENCE).
    pub(crate) fn new(contents: &'a [u8]) -> Self {
        Self { rest: contents }
    }

    /// The next element, or `None` at the end or on malformed input.
    pub(crate) fn next_any(&mut self) -> Option<Any<'a>> {
        let (rest, any) = element(self.rest)?;
        self.rest = rest;
        Some(any)
    }

    /// The next element if it is a universal element with `tag`; returns its contents.
    pub(crate) fn next_universal(&mut self, tag: Tag) -> Option<&'a [u8]> {
        let any = self.next_any()?;
        (any.class() == Class::Universal && any.tag() == tag).then_some(any.data)
    }

    /// The next element if it is a non-negative INTEGER; returns its magnitude without
    /// leading zero bytes.
    pub(crate) fn next_unsigned(&mut self) -> Option<&'a [u8]> {
        let bytes = self.next_universal(Tag::Integer)?;
        if bytes.first().is_none_or(|first| first & 0x80 != 0) {
            return None;
        }
        let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
        Some(&bytes[start..])
    }

    /// The remaining elements, each as `(context tag number, contents)` for
    /// context-specific elements; `None` if any element is malformed or not
    /// context-specific.
    pub(crate) fn context_tagged(mut self) -> Option<Vec<(u32, &'a [u8])>> {
        let mut tagged = Vec::new();
        while !self.rest.is_empty() {
            let any = self.next_any()?;
            if any.class() != Class::ContextSpecific {
                return None;
            }
            tagged.push((any.tag().0, any.data));
        }
        Some(tagged)
    }

    /// Whether every element has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// The contents of a BIT STRING with no unused bits.
pub(crate) fn bit_string_bytes(contents: &[u8]) -> Option<&[u8]> {
    match contents.split_first() {
        Some((0, bytes)) => Some(bytes),
        _ => None,
    }
}

/// Interprets `data` as exactly one universal element with `tag`; returns its contents.
pub(crate) fn single(data: &[u8], tag: Tag) -> Option<&[u8]> {
    let (rest, any) = element(data)?;
    (rest.is_empty() && any.class() == Class::Universal && any.tag() == tag).then_some(any.data)
}

/// Number of significant bits of an unsigned big-endian integer without leading zeros.
pub(crate) fn bit_length(magnitude: &[u8]) -> usize {
    match magnitude.first() {
        None => 0,
        Some(first) => magnitude.len() * 8 - first.leading_zeros() as usize,
    }
}

/// Strips leading zero bytes from a big-endian integer.
pub(crate) fn trim_leading_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}
