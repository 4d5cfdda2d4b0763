//! Hints a caller attaches to an HTTP request (in its extensions) for the transport
//! below, so that the transport need not guess from the URL what a request is for.

/// Marks a request that stands in for a long-lived stream: the LIST that starts a
/// per-object watch (list, then watch), which the watch replaces as soon as the list is
/// answered.
///
/// kube-h2 plans its connections for long-lived requests (watches) and lets short ones
/// take turns on one more connection; a burst of first-sync lists is really the first
/// half of a burst of watches, so it is planned like one
/// (`request.extensions_mut().insert(LongLived)`). A watch needs no marker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LongLived;
