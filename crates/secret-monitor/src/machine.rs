//! The watch protocol for one object, as a pure state machine.
//!
//! The shape is kube-runtime's `watcher` (a `State` and a step function), with the I/O
//! taken out: [`Machine::step`] takes what happened (a response, an event, the end of
//! the stream) and says what the shell in [`watch`](crate::watch) must do next (read on,
//! send a request now, send it after a backoff, or give up the first sync), plus what
//! handlers should learn. No clock, no network, no tokio: every transition is
//! unit-tested below.
//!
//! # The protocol
//!
//! ```text
//!            ┌──────────── 410 Gone / event without resourceVersion ───────────────┐
//!            ▼                                                                     │
//!   ┌─ streaming list (watch, sendInitialEvents, consistent read) ─┐               │
//!   │  ADDED...  BOOKMARK "initial-events-end" at RV ──────────────┼─▶ watching RV ─┤
//!   │  refused (422/400, or ERROR "RequestWatchProgress")          │     │  ▲       │
//!   │  or broke off before its bookmark                            │     │  │ ended │
//!   ▼                                                              │     ▼  │       │
//!   list (resourceVersion=0; after a 410: a consistent read) at RV ┴─▶ watch from RV
//! ```
//!
//! * A streaming list is one request for the first sync. A server that refuses it, with
//!   422/400 (the `WatchList` feature off) or with a 200 whose only event is an `ERROR`
//!   naming `RequestWatchProgress` (storage without watch progress, e.g. etcd 3.4), makes
//!   the key list then watch, and reports `streaming_refused` so that the shell turns
//!   streaming off for every key. A streaming list that breaks off before its
//!   initial-events bookmark is retried as a plain list for this key only: a list is
//!   one response, not a stream that can break half-way.
//! * A watch that ends (the server's `timeoutSeconds`) resumes from the last
//!   resourceVersion, at once. `410 Gone` re-lists; the re-list is reconciled with what
//!   handlers saw ([`Reconciler`]).
//! * Errors are classified ([`Disposition`]): before the first sync, a permanent error
//!   (401, 403, other 4xx) fails it at once and a transient one (429, 5xx, transport)
//!   is retried up to `attempts` times; after it, every error is retried with backoff
//!   for as long as the key is watched. A 429's `Retry-After` travels with the retry.

use std::time::Duration;

use kube::core::{Status, WatchEvent};
use kube_common::Verb;

use crate::reconcile::{Event, Reconciler, Step};
use crate::{MonitorErrorKind, WatchedObject};

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The request the shell must send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// A watch with `sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan` and no
    /// resourceVersion: the current state (a consistent read), then changes.
    StreamingList,
    /// A LIST: with `resourceVersion=0` (served from the API server's cache, as
    /// client-go's first list is), or, after a `410`, a consistent read.
    List {
        /// Whether to ask for a consistent read (no resourceVersion).
        consistent: bool,
    },
    /// A watch from [`Machine::resource_version`].
    Watch,
}

impl Request {
    /// The verb the API server files the request under.
    pub(crate) fn verb(self) -> Verb {
        match self {
            Request::List { .. } => Verb::List,
            Request::StreamingList | Request::Watch => Verb::Watch,
        }
    }
}

/// A request that got no usable response: an error status, or none at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// What went wrong, naming the verb.
    pub(crate) kind: MonitorErrorKind,
    /// The server's `Retry-After`.
    pub(crate) retry_after: Option<Duration>,
}

/// What happened, fed to [`Machine::step`].
#[derive(Debug, Clone)]
pub(crate) enum Input<K> {
    /// The watch request in flight was answered 2xx: its stream is open.
    Opened,
    /// The request in flight failed (error status or no response), or the open stream
    /// broke (transport error, undecodable event).
    Failed(Failure),
    /// The LIST in flight was answered: the object, if the list held it, and the list's
    /// resourceVersion.
    Listed {
        /// The listed object named like the key, if any.
        object: Option<K>,
        /// `metadata.resourceVersion` of the list.
        resource_version: Option<String>,
    },
    /// An event arrived on the open stream.
    Event(WatchEvent<K>),
    /// The open stream ended cleanly.
    Ended,
}

/// What to do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Retrying cannot help until someone changes something (RBAC, the request).
    Permanent,
    /// Throttling, server errors, broken connections: retry after a backoff, and not
    /// before the server's `Retry-After`, when it gave one.
    Transient(Option<Duration>),
    /// `410 Gone`: re-list at once.
    Resync,
    /// The server does not serve streaming lists.
    StreamingRefused,
}

/// What the shell does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Read the next event of the open stream.
    Read,
    /// Close any open stream and send this request now.
    Send(Request),
    /// Close any open stream and send this request again after a backoff, not sooner
    /// than `retry_after`.
    Retry {
        /// The request.
        request: Request,
        /// The server's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The first sync failed with [`Output::error`]: stop.
    Fail,
}

/// The result of one step.
#[derive(Debug)]
pub(crate) struct Output<K> {
    /// What handlers should learn.
    pub(crate) step: Step<K>,
    /// The error the input carried, if any, for the observer and the logs (and for the
    /// waiters, with [`Next::Fail`]).
    pub(crate) error: Option<MonitorErrorKind>,
    /// This key found that the server does not serve streaming lists.
    pub(crate) streaming_refused: bool,
    /// What to do next.
    pub(crate) next: Next,
}

impl<K> Output<K> {
    fn next(next: Next) -> Self {
        Self {
            step: Step::Unchanged,
            error: None,
            streaming_refused: false,
            next,
        }
    }

    fn with_step(mut self, step: Step<K>) -> Self {
        self.step = step;
        self
    }

    fn with_error(mut self, error: MonitorErrorKind) -> Self {
        self.error = Some(error);
        self
    }
}

/// Where the protocol stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// A streaming list is requested or open; its initial events are arriving.
    InitialEvents,
    /// A LIST is in flight.
    Listing {
        /// Whether it asks for a consistent read.
        consistent: bool,
    },
    /// A watch from `resource_version` is requested or open.
    Watching {
        /// The last resourceVersion seen: the point to resume from.
        resource_version: String,
    },
}

/// The watch protocol of one object. See the module docs.
#[derive(Debug)]
pub(crate) struct Machine<K> {
    state: State,
    reconciler: Reconciler<K>,
    /// Whether this key lists with streaming lists.
    streaming: bool,
    /// Transient failures of the first sync so far.
    failures: u32,
    /// Transient failures that fail the first sync.
    attempts: u32,
}

impl<K: WatchedObject> Machine<K> {
    /// A machine for the object called `name`; `streaming` says whether to start with a
    /// streaming list; a first sync fails after `attempts` transient failures.
    pub(crate) fn new(name: impl Into<String>, streaming: bool, attempts: u32) -> Self {
        Self {
            state: if streaming {
                State::InitialEvents
            } else {
                State::Listing { consistent: false }
            },
            reconciler: Reconciler::new(name),
            streaming,
            failures: 0,
            attempts: attempts.max(1),
        }
    }

    /// The first request.
    pub(crate) fn start(&mut self) -> Next {
        Next::Send(self.restart())
    }

    /// Starts listing afresh, the way this key lists now; returns the request. (After
    /// the first sync, a re-list is a consistent read.)
    pub(crate) fn restart(&mut self) -> Request {
        self.reconciler.step(Event::Init);
        self.state = if self.streaming {
            State::InitialEvents
        } else {
            State::Listing {
                consistent: self.is_synced(),
            }
        };
        self.listing()
    }

    /// The resourceVersion to watch from (empty before the first listing).
    pub(crate) fn resource_version(&self) -> &str {
        match &self.state {
            State::Watching { resource_version } => resource_version,
            State::InitialEvents | State::Listing { .. } => "",
        }
    }

    /// Whether a streaming list's initial events are awaited: the only state in which
    /// [`Input::StreamingUnsupported`] changes anything.
    pub(crate) fn awaits_initial_events(&self) -> bool {
        self.state == State::InitialEvents
    }

    /// Whether the first listing has completed.
    pub(crate) fn is_synced(&self) -> bool {
        self.reconciler.is_synced()
    }

    /// Feeds one input; see the module docs.
    pub(crate) fn step(&mut self, input: Input<K>) -> Output<K> {
        match input {
            Input::Opened => Output::next(Next::Read),
            Input::Failed(failure) => self.failed(failure),
            Input::Listed {
                object,
                resource_version,
            } => self.listed(object, resource_version),
            Input::Event(event) => self.event(event),
            Input::Ended => self.ended(),
        }
    }

    /// Streaming lists were found unsupported (by this or another key): this key lists
    /// then watches from now on. A streaming list in flight is replaced by a list at
    /// once, which is not a failure of this key: returns what to do then. In any other
    /// state, whatever the shell was doing goes on (`None`).
    pub(crate) fn streaming_unsupported(&mut self) -> Option<Output<K>> {
        self.streaming = false;
        (self.state == State::InitialEvents).then(|| self.relist(false))
    }

    /// Starts a (re-)list, the way this key lists now; `consistent` asks a plain list
    /// for a consistent read (after a `410`, the cache may be behind too).
    fn relist(&mut self, consistent: bool) -> Output<K> {
        self.restart();
        if let State::Listing { consistent: read } = &mut self.state {
            *read = consistent;
        }
        Output::next(Next::Send(self.listing()))
    }

    /// The request that lists in the current state.
    fn listing(&self) -> Request {
        match self.state {
            State::InitialEvents => Request::StreamingList,
            State::Listing { consistent } => Request::List { consistent },
            State::Watching { .. } => Request::Watch,
        }
    }

    fn listed(&mut self, object: Option<K>, resource_version: Option<String>) -> Output<K> {
        let Some(resource_version) = resource_version.filter(|rv| !rv.is_empty()) else {
            return self.failed(Failure {
                kind: MonitorErrorKind::NoResourceVersion { verb: Verb::List },
                retry_after: None,
            });
        };
        if let Some(object) = object {
            self.reconciler.step(Event::InitApply(object));
        }
        let step = self.reconciler.step(Event::InitDone);
        self.state = State::Watching { resource_version };
        Output::next(Next::Send(Request::Watch)).with_step(step)
    }

    fn event(&mut self, event: WatchEvent<K>) -> Output<K> {
        match (&mut self.state, event) {
            (State::InitialEvents, WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                self.reconciler.step(Event::InitApply(object));
                Output::next(Next::Read)
            }
            (State::InitialEvents, WatchEvent::Bookmark(bookmark)) => {
                let ends_initial_events = bookmark
                    .metadata
                    .annotations
                    .get(INITIAL_EVENTS_END)
                    .is_some_and(|value| value == "true");
                if !ends_initial_events {
                    return Output::next(Next::Read);
                }
                if bookmark.metadata.resource_version.is_empty() {
                    return self.failed(Failure {
                        kind: MonitorErrorKind::NoResourceVersion { verb: Verb::Watch },
                        retry_after: None,
                    });
                }
                let step = self.reconciler.step(Event::InitDone);
                self.state = State::Watching {
                    resource_version: bookmark.metadata.resource_version,
                };
                Output::next(Next::Read).with_step(step)
            }
            // The API server never sends these during initial events; nothing to learn.
            (State::InitialEvents | State::Listing { .. }, WatchEvent::Deleted(_))
            | (State::Listing { .. }, _) => Output::next(Next::Read),
            (State::Watching { resource_version }, WatchEvent::Bookmark(bookmark)) => {
                if !bookmark.metadata.resource_version.is_empty() {
                    *resource_version = bookmark.metadata.resource_version;
                }
                Output::next(Next::Read)
            }
            (
                State::Watching { resource_version },
                event @ (WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)),
            ) => {
                let (object, deleted) = match event {
                    WatchEvent::Deleted(object) => (object, true),
                    WatchEvent::Added(object) | WatchEvent::Modified(object) => (object, false),
                    WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {
                        return Output::next(Next::Read);
                    }
                };
                match object.object_resource_version() {
                    Some(rv) if !rv.is_empty() => rv.clone_into(resource_version),
                    // Nowhere to resume from: start over.
                    _ => {
                        return self
                            .relist(true)
                            .with_error(MonitorErrorKind::NoResourceVersion { verb: Verb::Watch });
                    }
                }
                let step = self.reconciler.step(if deleted {
                    Event::Delete(object)
                } else {
                    Event::Apply(object)
                });
                Output::next(Next::Read).with_step(step)
            }
            (_, WatchEvent::Error(status)) => self.failed(Failure {
                retry_after: retry_after(&status),
                kind: api_error(&status, Verb::Watch),
            }),
        }
    }

    fn ended(&mut self) -> Output<K> {
        match &self.state {
            // Broke off before its bookmark: this key lists instead from now on.
            State::InitialEvents => {
                self.streaming = false;
                self.relist(false)
            }
            // The server's timeout: resume where the watch was.
            State::Watching { .. } => Output::next(Next::Send(Request::Watch)),
            // A list is one response; the shell never reports its end.
            State::Listing { .. } => Output::next(Next::Send(self.listing())),
        }
    }

    fn failed(&mut self, failure: Failure) -> Output<K> {
        let initial_events = self.state == State::InitialEvents;
        let disposition = classify(&failure, initial_events);
        // A 429 is the server pacing a burst, not a failure of this key: it never
        // fails a first sync (the sync timeout still bounds it).
        let throttled = matches!(failure.kind, MonitorErrorKind::Api { code: 429, .. });
        let output = match disposition {
            Disposition::StreamingRefused if initial_events => {
                self.streaming = false;
                let mut output = self.relist(false);
                output.streaming_refused = true;
                output
            }
            Disposition::Resync => self.relist(true),
            _ if initial_events && failure.kind.is_transport() => {
                // A stream that broke during its initial events is retried as a list
                // (see `ended`), after the usual backoff.
                self.streaming = false;
                self.retry_or_fail(disposition, self.is_synced() || throttled)
            }
            _ => self.retry_or_fail(disposition, self.is_synced() || throttled),
        };
        output.with_error(failure.kind)
    }

    /// Retries the current request after a backoff, or fails a first sync that
    /// cannot succeed; `forgiven` retries without counting an attempt (after the first
    /// sync, or for a 429).
    fn retry_or_fail(&mut self, disposition: Disposition, forgiven: bool) -> Output<K> {
        let retry_after = match disposition {
            Disposition::Transient(retry_after) => retry_after,
            _ => None,
        };
        if !forgiven {
            let transient = matches!(disposition, Disposition::Transient(_));
            if transient {
                self.failures += 1;
            }
            if !transient || self.failures >= self.attempts {
                return Output::next(Next::Fail);
            }
        }
        if !self.streaming && self.state == State::InitialEvents {
            self.state = State::Listing { consistent: false };
        }
        let request = match self.state {
            State::InitialEvents | State::Listing { .. } => {
                self.reconciler.step(Event::Init);
                self.listing()
            }
            State::Watching { .. } => Request::Watch,
        };
        Output::next(Next::Retry {
            request,
            retry_after,
        })
    }
}

/// Classifies a failure; `initial_events` says whether it happened to a streaming list
/// before its initial events were complete.
pub(crate) fn classify(failure: &Failure, initial_events: bool) -> Disposition {
    match &failure.kind {
        MonitorErrorKind::Forbidden { .. } | MonitorErrorKind::Unauthorized { .. } => {
            Disposition::Permanent
        }
        MonitorErrorKind::Api { code: 410, .. } => Disposition::Resync,
        MonitorErrorKind::Api {
            code: 400 | 422, ..
        } if initial_events => Disposition::StreamingRefused,
        MonitorErrorKind::Api {
            code: 500, message, ..
        } if initial_events && message.contains("RequestWatchProgress") => {
            Disposition::StreamingRefused
        }
        MonitorErrorKind::Api {
            code: 408 | 409 | 429 | 500..=599,
            ..
        }
        | MonitorErrorKind::Transport { .. }
        | MonitorErrorKind::NoResourceVersion { .. }
        | MonitorErrorKind::SyncTimeout { .. } => Disposition::Transient(failure.retry_after),
        MonitorErrorKind::Api { .. }
        | MonitorErrorKind::NotRegistered { .. }
        | MonitorErrorKind::NotFound
        | MonitorErrorKind::Cancelled => Disposition::Permanent,
    }
}

impl MonitorErrorKind {
    pub(crate) fn is_transport(&self) -> bool {
        matches!(self, MonitorErrorKind::Transport { .. })
    }
}

/// An API server `Status` as an error of `verb`.
pub(crate) fn api_error(status: &Status, verb: Verb) -> MonitorErrorKind {
    let message = status.message.clone();
    match status.code {
        401 => MonitorErrorKind::Unauthorized { verb, message },
        403 => MonitorErrorKind::Forbidden { verb, message },
        code => MonitorErrorKind::Api {
            verb,
            code,
            reason: status.reason.clone(),
            message,
        },
    }
}

/// The server's `Retry-After`, as kube-apiserver also puts it in the Status details.
pub(crate) fn retry_after(status: &Status) -> Option<Duration> {
    let seconds = status.details.as_ref()?.retry_after_seconds;
    (seconds > 0).then(|| Duration::from_secs(u64::from(seconds)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;
    use kube::core::TypeMeta;
    use kube::core::watch::{Bookmark, BookmarkMeta};
    use proptest::prelude::*;

    use super::*;
    use crate::ObjectEvent;

    fn secret(uid: &str, rv: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    fn bookmark(rv: &str, ends_initial_events: bool) -> WatchEvent<Secret> {
        let mut annotations = BTreeMap::new();
        if ends_initial_events {
            annotations.insert(INITIAL_EVENTS_END.to_owned(), "true".to_owned());
        }
        WatchEvent::Bookmark(Bookmark {
            types: TypeMeta::default(),
            metadata: BookmarkMeta {
                resource_version: rv.into(),
                annotations,
            },
        })
    }

    fn status(code: u16, message: &str) -> Status {
        let mut status = Status::failure(message, "Whatever");
        status.code = code;
        status
    }

    fn error_event(code: u16, message: &str) -> Input<Secret> {
        Input::Event(WatchEvent::Error(Box::new(status(code, message))))
    }

    fn http_error(code: u16, verb: Verb) -> Input<Secret> {
        Input::Failed(Failure {
            kind: api_error(&status(code, "refused"), verb),
            retry_after: (code == 429).then_some(Duration::from_secs(2)),
        })
    }

    fn broken() -> Input<Secret> {
        Input::Failed(Failure {
            kind: MonitorErrorKind::Transport {
                verb: Verb::Watch,
                cause: crate::TransportError::Body(crate::SharedError::new(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                ))),
            },
            retry_after: None,
        })
    }

    fn listed(object: Option<Secret>, rv: &str) -> Input<Secret> {
        Input::Listed {
            object,
            resource_version: Some(rv.into()),
        }
    }

    /// What handlers learned, as short strings: `first:true`, `updated:7`, ...
    fn learned(step: &Step<Secret>) -> Vec<String> {
        match step {
            Step::Unchanged => vec![],
            Step::FirstSync(object) => vec![format!("first:{}", object.is_some())],
            Step::Changed { events, .. } => events
                .iter()
                .map(|event| {
                    let rv = event
                        .object()
                        .metadata
                        .resource_version
                        .clone()
                        .unwrap_or_default();
                    match event {
                        ObjectEvent::Added(_) => format!("added:{rv}"),
                        ObjectEvent::Updated { .. } => format!("updated:{rv}"),
                        ObjectEvent::Deleted(_) => format!("deleted:{rv}"),
                    }
                })
                .collect(),
        }
    }

    /// A machine synced by a streaming list at resourceVersion 5.
    fn synced_streaming() -> Machine<Secret> {
        let mut machine = Machine::new("s", true, 3);
        assert_eq!(machine.start(), Next::Send(Request::StreamingList));
        assert_eq!(machine.step(Input::Opened).next, Next::Read);
        machine.step(Input::Event(WatchEvent::Added(secret("u1", "5"))));
        let output = machine.step(Input::Event(bookmark("5", true)));
        assert_eq!(learned(&output.step), ["first:true"]);
        machine
    }

    #[test]
    fn a_streaming_list_syncs_at_its_bookmark_and_keeps_watching() {
        let mut machine = Machine::new("s", true, 3);
        assert_eq!(machine.start(), Next::Send(Request::StreamingList));
        assert!(machine.awaits_initial_events());
        assert_eq!(machine.step(Input::Opened).next, Next::Read);
        let added = machine.step(Input::Event(WatchEvent::Added(secret("u1", "5"))));
        assert_eq!((learned(&added.step), added.next), (vec![], Next::Read));
        // A bookmark that does not end the initial events changes nothing.
        let early = machine.step(Input::Event(bookmark("4", false)));
        assert_eq!((learned(&early.step), early.next), (vec![], Next::Read));
        let done = machine.step(Input::Event(bookmark("5", true)));
        assert_eq!(learned(&done.step), ["first:true"]);
        assert_eq!(
            done.next,
            Next::Read,
            "the same stream goes on as the watch"
        );
        assert_eq!(machine.resource_version(), "5");
        assert!(machine.is_synced() && !machine.awaits_initial_events());

        let modified = machine.step(Input::Event(WatchEvent::Modified(secret("u1", "7"))));
        assert_eq!(learned(&modified.step), ["updated:7"]);
        machine.step(Input::Event(bookmark("9", false)));
        assert_eq!(machine.resource_version(), "9");
        // The server's timeout ends the watch: resume at once from the bookmark.
        assert_eq!(machine.step(Input::Ended).next, Next::Send(Request::Watch));
        assert_eq!(machine.resource_version(), "9");
        let deleted = machine.step(Input::Event(WatchEvent::Deleted(secret("u1", "10"))));
        assert_eq!(learned(&deleted.step), ["deleted:10"]);
        assert_eq!(machine.resource_version(), "10");
    }

    #[test]
    fn an_absent_object_syncs_as_absent() {
        let mut machine = Machine::<Secret>::new("s", true, 3);
        machine.start();
        let done = machine.step(Input::Event(bookmark("3", true)));
        assert_eq!(learned(&done.step), ["first:false"]);
    }

    #[test]
    fn list_then_watch_syncs_with_the_list_and_watches_from_its_version() {
        let mut machine = Machine::new("s", false, 3);
        assert_eq!(
            machine.start(),
            Next::Send(Request::List { consistent: false })
        );
        let output = machine.step(listed(Some(secret("u1", "10")), "12"));
        assert_eq!(learned(&output.step), ["first:true"]);
        assert_eq!(output.next, Next::Send(Request::Watch));
        assert_eq!(machine.resource_version(), "12");
        assert_eq!(machine.step(Input::Opened).next, Next::Read);
    }

    #[test]
    fn a_list_without_a_resource_version_is_retried() {
        let mut machine = Machine::<Secret>::new("s", false, 3);
        machine.start();
        let output = machine.step(Input::Listed {
            object: None,
            resource_version: Some(String::new()),
        });
        assert!(output.error.is_some());
        assert_eq!(
            output.next,
            Next::Retry {
                request: Request::List { consistent: false },
                retry_after: None
            }
        );
    }

    #[test]
    fn refusals_of_streaming_lists_switch_to_a_list_without_counting_a_failure() {
        let refusals = [
            ("422 at the start", http_error(422, Verb::Watch)),
            ("400 at the start", http_error(400, Verb::Watch)),
            (
                "ERROR event: storage without watch progress",
                error_event(
                    500,
                    "a watch stream was requested by the client but the required storage \
                     feature RequestWatchProgress is disabled",
                ),
            ),
        ];
        for (case, refusal) in refusals {
            // One attempt only: a refusal that counted as a failure would fail the sync.
            let mut machine = Machine::<Secret>::new("s", true, 1);
            machine.start();
            let output = machine.step(refusal);
            assert!(output.streaming_refused, "{case}");
            assert!(output.error.is_some(), "{case}: reported");
            assert_eq!(
                output.next,
                Next::Send(Request::List { consistent: false }),
                "{case}"
            );
            let synced = machine.step(listed(None, "3"));
            assert_eq!(learned(&synced.step), ["first:false"], "{case}");
            // Later re-lists list too.
            let expired = machine.step(error_event(410, "too old"));
            assert_eq!(
                expired.next,
                Next::Send(Request::List { consistent: true }),
                "{case}"
            );
        }
    }

    #[test]
    fn other_errors_of_a_streaming_list_are_no_refusal() {
        let mut machine = Machine::<Secret>::new("s", true, 3);
        machine.start();
        let output = machine.step(error_event(500, "etcdserver: leader changed"));
        assert!(!output.streaming_refused);
        assert_eq!(
            output.next,
            Next::Retry {
                request: Request::StreamingList,
                retry_after: None
            }
        );
        // A 422 on a plain watch after the sync is not about streaming either.
        let mut machine = synced_streaming();
        machine.step(Input::Ended);
        let output = machine.step(http_error(422, Verb::Watch));
        assert!(!output.streaming_refused);
        assert_eq!(
            output.next,
            Next::Retry {
                request: Request::Watch,
                retry_after: None
            }
        );
    }

    #[test]
    fn streaming_turned_off_elsewhere_replaces_a_streaming_list_in_flight() {
        let mut machine = Machine::<Secret>::new("s", true, 1);
        machine.start();
        machine.step(Input::Opened);
        let output = machine
            .streaming_unsupported()
            .expect("a streaming list was in flight");
        assert_eq!(output.next, Next::Send(Request::List { consistent: false }));
        assert!(output.error.is_none() && !output.streaming_refused);
        assert_eq!(
            learned(&machine.step(listed(None, "2")).step),
            ["first:false"]
        );

        // Once watching, nothing changes now; the next re-list lists.
        let mut machine = synced_streaming();
        assert!(machine.streaming_unsupported().is_none());
        let expired = machine.step(error_event(410, "too old"));
        assert_eq!(expired.next, Next::Send(Request::List { consistent: true }));
    }

    #[test]
    fn a_streaming_list_that_breaks_off_is_retried_as_a_list_for_this_key() {
        let mut machine = Machine::<Secret>::new("s", true, 3);
        machine.start();
        machine.step(Input::Opened);
        machine.step(Input::Event(WatchEvent::Added(secret("u1", "5"))));
        let ended = machine.step(Input::Ended);
        assert!(
            !ended.streaming_refused,
            "one key's broken stream says nothing about the server"
        );
        assert_eq!(ended.next, Next::Send(Request::List { consistent: false }));

        let mut machine = Machine::<Secret>::new("s", true, 3);
        machine.start();
        let output = machine.step(broken());
        assert!(!output.streaming_refused);
        assert_eq!(
            output.next,
            Next::Retry {
                request: Request::List { consistent: false },
                retry_after: None
            }
        );
    }

    #[test]
    fn first_sync_errors_fail_when_permanent_and_after_the_last_attempt() {
        for code in [401, 403, 404] {
            let mut machine = Machine::<Secret>::new("s", true, 3);
            machine.start();
            let output = machine.step(http_error(code, Verb::Watch));
            assert_eq!(output.next, Next::Fail, "{code}");
            assert!(output.error.is_some());
        }
        let mut machine = Machine::<Secret>::new("s", false, 3);
        machine.start();
        // However many 429s: the server paces the burst, no attempt is used up.
        for _ in 0..10 {
            let output = machine.step(http_error(429, Verb::List));
            assert_eq!(
                output.next,
                Next::Retry {
                    request: Request::List { consistent: false },
                    retry_after: Some(Duration::from_secs(2))
                },
                "Retry-After travels with the retry"
            );
        }
        for code in [500, 502] {
            let output = machine.step(http_error(code, Verb::List));
            assert!(matches!(output.next, Next::Retry { .. }), "{code}");
        }
        let last = machine.step(http_error(503, Verb::List));
        assert_eq!(last.next, Next::Fail);
        assert_eq!(
            last.error.as_ref().and_then(|kind| match kind {
                MonitorErrorKind::Api { code, verb, .. } => Some((*code, *verb)),
                _ => None,
            }),
            Some((503, Verb::List))
        );
    }

    #[test]
    fn after_the_first_sync_every_error_is_retried_from_where_the_watch_was() {
        let mut machine = synced_streaming();
        machine.step(Input::Event(bookmark("8", false)));
        for input in [
            http_error(403, Verb::Watch),
            http_error(500, Verb::Watch),
            http_error(429, Verb::Watch),
            error_event(500, "internal"),
            broken(),
        ] {
            let output = machine.step(input);
            assert!(
                matches!(
                    output.next,
                    Next::Retry {
                        request: Request::Watch,
                        ..
                    }
                ),
                "{:?}",
                output.next
            );
            assert_eq!(machine.resource_version(), "8");
        }
    }

    #[test]
    fn an_expired_watch_relists_and_reports_what_changed_meanwhile() {
        let mut machine = synced_streaming();
        let expired = machine.step(error_event(410, "too old resource version"));
        assert_eq!(expired.next, Next::Send(Request::StreamingList));
        assert!(expired.error.is_some());
        machine.step(Input::Opened);
        // Deleted and re-created while the watch was away.
        machine.step(Input::Event(WatchEvent::Added(secret("u2", "20"))));
        let done = machine.step(Input::Event(bookmark("20", true)));
        assert_eq!(learned(&done.step), ["deleted:5", "added:20"]);
        assert_eq!(machine.resource_version(), "20");
    }

    #[test]
    fn an_event_without_a_resource_version_starts_over() {
        let mut machine = synced_streaming();
        let output = machine.step(Input::Event(WatchEvent::Modified(secret("u1", ""))));
        assert!(output.error.is_some());
        assert_eq!(output.next, Next::Send(Request::StreamingList));
    }

    fn any_input() -> impl Strategy<Value = Input<Secret>> {
        let rv = (1u32..50).prop_map(|n| n.to_string());
        prop_oneof![
            Just(Input::Opened),
            Just(Input::Ended),
            Just(broken()),
            (rv.clone(), any::<bool>()).prop_map(|(rv, end)| Input::Event(bookmark(&rv, end))),
            (rv.clone(), 0u8..3).prop_map(|(rv, kind)| {
                let object = secret(if kind == 2 { "u2" } else { "u1" }, &rv);
                Input::Event(match kind {
                    0 => WatchEvent::Added(object),
                    1 => WatchEvent::Modified(object),
                    _ => WatchEvent::Deleted(object),
                })
            }),
            (rv.clone(), any::<bool>())
                .prop_map(|(rv, present)| listed(present.then(|| secret("u1", &rv)), &rv)),
            prop_oneof![Just(403u16), Just(410), Just(422), Just(429), Just(500)]
                .prop_map(|code| http_error(code, Verb::Watch)),
            Just(error_event(410, "expired")),
            Just(error_event(500, "RequestWatchProgress is disabled")),
        ]
    }

    proptest! {
        /// Whatever happens, in any order: a key fails only before its first sync, and
        /// once synced it always knows where to resume from when it watches.
        #[test]
        fn invariants_hold_over_any_sequence(
            streaming in any::<bool>(),
            inputs in proptest::collection::vec(any_input(), 0..60),
        ) {
            let mut machine = Machine::new("s", streaming, 3);
            let mut next = machine.start();
            for input in inputs {
                if next == Next::Fail {
                    break;
                }
                let synced_before = machine.is_synced();
                let output = machine.step(input);
                prop_assert!(!(synced_before && output.next == Next::Fail));
                if matches!(output.step, Step::FirstSync(_)) {
                    prop_assert!(!synced_before);
                }
                if matches!(output.step, Step::Changed { .. }) {
                    prop_assert!(synced_before);
                }
                let watches = matches!(
                    output.next,
                    Next::Send(Request::Watch) | Next::Retry { request: Request::Watch, .. }
                );
                if watches {
                    prop_assert!(!machine.resource_version().is_empty());
                }
                next = output.next;
            }
        }
    }
}
