//! The body of a watch response: initial state or replayed history, the
//! `initial-events-end` bookmark, live events, periodic bookmarks and one shortly
//! before `timeoutSeconds`; ended by `timeoutSeconds`, by the close-all fault, by the
//! close-after fault, or when the watcher falls too far behind.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::{Interval, MissedTickBehavior, Sleep};
use tokio_util::sync::CancellationToken;

use crate::api::table::{self, TableOptions};
use crate::control::admission::Admission;
use crate::error::ApiError;
use crate::objects::meta::meta_str;
use crate::resources::ResourceDef;
use crate::state::Shared;
use crate::storage::store::{InitialItem, Subscription};
use crate::storage::watch::{DeliveryItem, encode_event, encode_event_json};
use crate::transport::body::SimBody;

/// The annotation that marks the end of the initial events of a streaming list.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How long before a watch's `timeoutSeconds` kube-apiserver sends its last bookmark
/// (its watch cache schedules one at the deadline less this, when the client allows
/// bookmarks): the client then resumes from a resourceVersion seconds old instead of
/// one up to a bookmark interval old, and its renewal replays seconds of history.
const PRE_TIMEOUT_BOOKMARK: Duration = Duration::from_secs(2);

/// Options of one watch request.
pub(crate) struct WatchOptions {
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    /// `sendInitialEvents=true`: send the annotated bookmark after the initial events.
    pub initial_events_end: bool,
    /// Render events as `Table`s (kubectl's `get -w`).
    pub table: Option<TableOptions>,
}

struct OpenWatch {
    shared: Arc<Shared>,
    resource: &'static str,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.shared.stats.watch_closed(self.resource);
    }
}

struct WatchState {
    shared: Arc<Shared>,
    def: &'static ResourceDef,
    sub: Subscription,
    opts: WatchOptions,
    /// Kept until the initial-events-end bookmark is sent (streaming lists count as
    /// in flight until then).
    permit: Option<Admission>,
    close: CancellationToken,
    deadline: Option<Pin<Box<Sleep>>>,
    ticker: Option<Interval>,
    /// When the bookmark before the deadline is due (taken once it fires).
    pre_timeout: Option<Pin<Box<Sleep>>>,
    /// A bookmark is due at (at least) this resourceVersion once the channel is empty.
    pending_bookmark: Option<u64>,
    last_rv: u64,
    sent_events: u64,
    table_columns_sent: bool,
    done: bool,
    _open: OpenWatch,
}

fn rv_of(v: &Value) -> u64 {
    meta_str(v, "resourceVersion")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A BOOKMARK event line.
pub(crate) fn bookmark_line(def: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        meta["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
    }
    let obj = json!({ "kind": def.kind, "apiVersion": def.api_version(), "metadata": meta });
    encode_event("BOOKMARK", &obj)
}

/// A body with a single ERROR event carrying `failure`'s `Status`.
pub(crate) fn error_body(shared: &Arc<Shared>, failure: &ApiError) -> SimBody {
    shared.stats.add_watch_event();
    SimBody::full(encode_event("ERROR", &failure.status_wire()))
}

impl WatchState {
    fn encode(&mut self, event_type: &str, object: &Value) -> Bytes {
        match self.opts.table {
            Some(t) => {
                let with_columns = !self.table_columns_sent;
                self.table_columns_sent = true;
                encode_event(
                    event_type,
                    &table::event_table(self.def, object, t, with_columns),
                )
            }
            None => encode_event(event_type, object),
        }
    }

    fn encode_live(&mut self, (event, delivery): DeliveryItem) -> Bytes {
        self.last_rv = self.last_rv.max(event.rv);
        if self.opts.table.is_some() {
            let obj = event.object_for(delivery);
            self.encode(delivery.type_name(), &obj)
        } else {
            event.encoded(delivery)
        }
    }

    fn counted(&mut self, line: Bytes) -> Option<Bytes> {
        self.shared.stats.add_watch_event();
        self.sent_events += 1;
        if self
            .shared
            .faults
            .close_after()
            .is_some_and(|k| self.sent_events >= k)
        {
            self.done = true;
        }
        Some(line)
    }

    fn bookmark(&mut self, rv: u64, initial_end: bool) -> Bytes {
        self.shared.stats.add_watch_event();
        self.last_rv = self.last_rv.max(rv);
        bookmark_line(self.def, self.last_rv, initial_end)
    }

    /// A bookmark is due: it goes out at the current version once the channel, which
    /// holds every event up to it, has been drained. As kube-apiserver does, only once
    /// something changed since the watch started: until then the version the client
    /// started from is as good a place to resume.
    fn bookmark_due(&mut self) {
        let rv = self.shared.store.published_rv();
        if rv > self.sub.registered_rv {
            self.pending_bookmark = Some(rv);
        }
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        if self.done || self.close.is_cancelled() {
            return None;
        }
        // During a `Hang` outage an open watch delivers nothing.
        self.shared.faults.wait_while_hanging().await;
        if let Some(item) = self.sub.initial.pop_front() {
            let line = match item {
                InitialItem::Current(obj, json) => {
                    self.last_rv = self.last_rv.max(rv_of(&obj));
                    match json {
                        Some(json) if self.opts.table.is_none() => {
                            encode_event_json("ADDED", &json)
                        }
                        _ => self.encode("ADDED", &obj),
                    }
                }
                InitialItem::Replay(event, delivery) => self.encode_live((event, delivery)),
            };
            return self.counted(line);
        }
        // The initial events are out: a streaming list leaves the in-flight count.
        self.permit.take();
        if self.opts.initial_events_end {
            self.opts.initial_events_end = false;
            // Announced only to a client that allows bookmarks, as kube-apiserver does.
            if self.opts.bookmarks {
                return Some(self.bookmark(self.sub.start_rv, true));
            }
        }
        loop {
            if let Some(rv) = self.pending_bookmark {
                match self.sub.rx.try_recv() {
                    Ok(item) => {
                        let line = self.encode_live(item);
                        return self.counted(line);
                    }
                    Err(TryRecvError::Empty) => {
                        self.pending_bookmark = None;
                        return Some(self.bookmark(rv, false));
                    }
                    Err(TryRecvError::Disconnected) => return None,
                }
            }
            let wake = {
                let Self {
                    sub,
                    close,
                    deadline,
                    ticker,
                    pre_timeout,
                    ..
                } = &mut *self;
                let timeout = async {
                    match deadline {
                        Some(d) => d.as_mut().await,
                        None => std::future::pending().await,
                    }
                };
                let tick = async {
                    match ticker {
                        Some(t) => {
                            t.tick().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                let last_bookmark = async {
                    match pre_timeout {
                        Some(p) => p.as_mut().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    _ = close.cancelled() => Wake::Closed,
                    _ = timeout => Wake::Closed,
                    item = sub.rx.recv() => Wake::Item(item),
                    _ = tick => Wake::Tick,
                    _ = last_bookmark => Wake::PreTimeout,
                }
            };
            match wake {
                Wake::Closed | Wake::Item(None) => return None,
                Wake::Item(Some(item)) => {
                    self.shared.faults.wait_while_hanging().await;
                    let line = self.encode_live(item);
                    return self.counted(line);
                }
                Wake::Tick => self.bookmark_due(),
                Wake::PreTimeout => {
                    // The last bookmark: none is periodic between it and the deadline,
                    // as kube-apiserver schedules the next one at whichever comes first.
                    self.pre_timeout = None;
                    self.ticker = None;
                    self.bookmark_due();
                }
            }
        }
    }
}

enum Wake {
    Closed,
    Item(Option<DeliveryItem>),
    Tick,
    PreTimeout,
}

/// Builds the streaming body of a watch that has been registered.
pub(crate) fn watch_body(
    shared: Arc<Shared>,
    def: &'static ResourceDef,
    sub: Subscription,
    opts: WatchOptions,
    permit: Option<Admission>,
) -> SimBody {
    shared.stats.watch_opened(def.name);
    let open = OpenWatch {
        shared: shared.clone(),
        resource: def.name,
    };
    let ticker = opts.bookmarks.then(|| {
        let period = shared.bookmark_interval.max(Duration::from_millis(10));
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        t
    });
    let deadline = opts.timeout.map(|t| Box::pin(tokio::time::sleep(t)));
    let pre_timeout = opts
        .timeout
        .filter(|t| opts.bookmarks && *t > PRE_TIMEOUT_BOOKMARK)
        .map(|t| Box::pin(tokio::time::sleep(t - PRE_TIMEOUT_BOOKMARK)));
    let state = WatchState {
        close: shared.faults.watch_close_token(),
        last_rv: sub.start_rv,
        shared,
        def,
        sub,
        opts,
        permit,
        deadline,
        ticker,
        pre_timeout,
        pending_bookmark: None,
        sent_events: 0,
        table_columns_sent: false,
        done: false,
        _open: open,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        let line = st.next_line().await?;
        Some((Ok(Frame::data(line)), st))
    });
    SimBody::stream(stream)
}
