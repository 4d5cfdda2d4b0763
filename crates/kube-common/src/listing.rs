//! A watch's (re-)listings gathered into one event, as a stream adapter in the style
//! of kube-runtime's `WatchStreamExt`.
//!
//! kube-runtime's watcher hands a listing out object by object: `Init`, one
//! `InitApply` per object, `InitDone`. A consumer that compares the listing with what
//! it holds (to drop what is gone after a desync, say) needs the whole listing at
//! once. [`Gather`] is the pure state machine that collects it ([`Gather::step`]: one
//! watcher event in, at most one [`Change`] out); [`ListingStreamExt::gather_listings`]
//! wraps a stream of watcher results with it, passing errors through untouched.
//!
//! ```
//! use futures::{StreamExt, executor::block_on, stream};
//! use kube::runtime::watcher::Event;
//! use kube_common::listing::{Change, ListingStreamExt};
//!
//! let events = stream::iter([
//!     Ok(Event::Init),
//!     Ok(Event::InitApply("a")),
//!     Err("timed out"),
//!     Ok(Event::InitApply("b")),
//!     Ok(Event::InitDone),
//!     Ok(Event::Apply("c")),
//! ]);
//! let changes: Vec<_> = block_on(events.gather_listings().collect());
//! assert_eq!(
//!     changes,
//!     [Err("timed out"), Ok(Change::Listed(vec!["a", "b"])), Ok(Change::Applied("c"))]
//! );
//! ```

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Stream;
use kube::runtime::watcher::Event;

/// What a list/watch tells, with each (re-)listing whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<K> {
    /// Everything the (re-)list found, in the server's order; it replaces what an
    /// earlier listing told.
    Listed(Vec<K>),
    /// An object was added or modified.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
}

/// Gathers the watcher's `Init`..`InitDone` events into one [`Change::Listed`]: the
/// pure state machine behind [`Listings`].
#[derive(Debug)]
pub struct Gather<K> {
    /// The listing under way, `None` between listings.
    listing: Option<Vec<K>>,
}

impl<K> Default for Gather<K> {
    fn default() -> Self {
        Self { listing: None }
    }
}

impl<K> Gather<K> {
    /// A machine that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes in one watcher event; returns what it completes. An `Init` starts a
    /// listing afresh (a re-list after a desync drops what the one it interrupted
    /// gathered); an `InitDone` without an `Init` lists what the `InitApply`s since
    /// the last listing brought, or nothing.
    pub fn step(&mut self, event: Event<K>) -> Option<Change<K>> {
        match event {
            Event::Init => {
                self.listing = Some(Vec::new());
                None
            }
            Event::InitApply(object) => {
                self.listing.get_or_insert_with(Vec::new).push(object);
                None
            }
            Event::InitDone => Some(Change::Listed(self.listing.take().unwrap_or_default())),
            Event::Apply(object) => Some(Change::Applied(object)),
            Event::Delete(object) => Some(Change::Deleted(object)),
        }
    }
}

pin_project_lite::pin_project! {
    /// A stream of watcher results with the listings gathered
    /// ([`ListingStreamExt::gather_listings`]).
    #[must_use = "streams do nothing unless polled"]
    pub struct Listings<S, K> {
        #[pin]
        stream: S,
        gather: Gather<K>,
    }
}

impl<S, K, E> Stream for Listings<S, K>
where
    S: Stream<Item = Result<Event<K>, E>>,
{
    type Item = Result<Change<K>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            match ready!(this.stream.as_mut().poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                Some(Ok(event)) => {
                    if let Some(change) = this.gather.step(event) {
                        return Poll::Ready(Some(Ok(change)));
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // Every event may be swallowed into a listing; none yields two changes.
        (0, self.stream.size_hint().1)
    }
}

/// [`Listings`] on any stream of watcher results (a watcher, with or without backoff).
pub trait ListingStreamExt: Stream {
    /// Gathers each (re-)listing into one [`Change::Listed`]; `Apply` and `Delete`
    /// become [`Change::Applied`] and [`Change::Deleted`], errors pass through as they
    /// come.
    fn gather_listings<K, E>(self) -> Listings<Self, K>
    where
        Self: Stream<Item = Result<Event<K>, E>> + Sized,
    {
        Listings {
            stream: self,
            gather: Gather::new(),
        }
    }
}

impl<S: Stream + ?Sized> ListingStreamExt for S {}

#[cfg(test)]
mod tests {
    use futures::{StreamExt, executor::block_on, stream};

    use super::*;

    /// One step of a table: the event, then what the machine must emit.
    type Row = (Event<&'static str>, Option<Change<&'static str>>);

    fn run(rows: Vec<Row>) {
        let mut gather = Gather::new();
        for (index, (event, expected)) in rows.into_iter().enumerate() {
            let shown = format!("{event:?}");
            assert_eq!(gather.step(event), expected, "step {index}: {shown}");
        }
    }

    #[test]
    fn a_listing_is_emitted_whole_when_done() {
        run(vec![
            (Event::Init, None),
            (Event::InitApply("a"), None),
            (Event::InitApply("b"), None),
            (Event::InitDone, Some(Change::Listed(vec!["a", "b"]))),
        ]);
    }

    #[test]
    fn an_empty_listing_is_emitted_empty() {
        run(vec![
            (Event::Init, None),
            (Event::InitDone, Some(Change::Listed(vec![]))),
        ]);
    }

    #[test]
    fn applies_and_deletes_after_the_listing_pass_one_by_one() {
        run(vec![
            (Event::Init, None),
            (Event::InitApply("a"), None),
            (Event::InitDone, Some(Change::Listed(vec!["a"]))),
            (Event::Apply("b"), Some(Change::Applied("b"))),
            (Event::Delete("a"), Some(Change::Deleted("a"))),
            (Event::Apply("b"), Some(Change::Applied("b"))),
        ]);
    }

    #[test]
    fn a_relist_after_a_desync_replaces_the_first_listing() {
        run(vec![
            (Event::Init, None),
            (Event::InitApply("a"), None),
            (Event::InitApply("b"), None),
            (Event::InitDone, Some(Change::Listed(vec!["a", "b"]))),
            (Event::Apply("c"), Some(Change::Applied("c"))),
            // 410 Gone: the watcher lists again; "a" is gone meanwhile.
            (Event::Init, None),
            (Event::InitApply("b"), None),
            (Event::InitApply("c"), None),
            (Event::InitDone, Some(Change::Listed(vec!["b", "c"]))),
        ]);
    }

    #[test]
    fn a_relist_interrupting_a_listing_drops_what_it_gathered() {
        run(vec![
            (Event::Init, None),
            (Event::InitApply("a"), None),
            (Event::Init, None),
            (Event::InitApply("b"), None),
            (Event::InitDone, Some(Change::Listed(vec!["b"]))),
        ]);
    }

    #[test]
    fn objects_without_an_init_are_listed_by_the_next_done() {
        run(vec![
            (Event::InitApply("a"), None),
            (Event::InitDone, Some(Change::Listed(vec!["a"]))),
            (Event::InitDone, Some(Change::Listed(vec![]))),
        ]);
    }

    #[test]
    fn the_stream_passes_errors_through_in_order_and_keeps_the_listing() {
        let events = stream::iter([
            Err("before"),
            Ok(Event::Init),
            Ok(Event::InitApply("a")),
            Err("during"),
            Ok(Event::InitApply("b")),
            Ok(Event::InitDone),
            Err("after"),
            Ok(Event::Delete("a")),
        ]);
        let changes: Vec<_> = block_on(events.gather_listings().collect());
        assert_eq!(
            changes,
            [
                Err("before"),
                Err("during"),
                Ok(Change::Listed(vec!["a", "b"])),
                Err("after"),
                Ok(Change::Deleted("a")),
            ]
        );
    }

    #[test]
    fn the_stream_ends_with_its_source_even_mid_listing() {
        let events = stream::iter([
            Ok::<_, ()>(Event::Apply("a")),
            Ok(Event::Init),
            Ok(Event::InitApply("b")),
        ]);
        let changes: Vec<_> = block_on(events.gather_listings().collect());
        assert_eq!(changes, [Ok(Change::Applied("a"))]);
    }
}
