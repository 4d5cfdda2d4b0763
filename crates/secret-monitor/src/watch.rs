//! The task behind one key: the shell that performs what the protocol's state machine
//! ([`machine`](crate::machine)) asks for — requests through `kube::Client`, reading the
//! watch stream, backoff, the first-sync deadline and the bound on concurrent first
//! syncs — and reports to the registry what handlers should learn.
//!
//! Ten thousand of these run at once, each idle nearly all the time, so what one holds
//! while it waits for the next event is kept small: the machine (a resourceVersion and
//! the last object), the open response body and a line decoder that holds nothing
//! between events. Everything needed only to send a request or to finish the first
//! sync lives in boxed futures that exist only while that happens.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube::Client;
use kube::core::WatchEvent;
use kube_common::adaptive::{AdaptiveLimiter, AdaptivePolicy, Permit, Turn, is_overload_status};
use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::reconnect::Waited;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lock::StdLocks;
use crate::machine::{Disposition, Failure, Input, Machine, Next, Output, Request, classify};
use crate::options::{InitialList, MonitorOptions};
use crate::reconcile::Step;
use crate::registry::SyncDriver;
use crate::request::{self, Answer, EventStream, Target};
use crate::{MonitorError, MonitorErrorKind, ObjectKey, WatchedObject};

/// The shortest server-side watch timeout when none is configured: client-go's
/// reflector asks for 5 to 10 minutes, at random, so that watches opened together are
/// not all renewed together.
const DEFAULT_MIN_WATCH_TIMEOUT: u32 = 300;

/// The longest minimum the default timeout grows to with the number of keys:
/// kube-apiserver's own `--min-request-timeout` default, which it applies to a watch
/// that asks for none. A stalled stream is noticed at most this long (twice it, plus
/// [`WATCH_DEADLINE_MARGIN`]) after it stalls; a dead connection sooner, by HTTP/2
/// keep-alive.
const MAX_DEFAULT_MIN_WATCH_TIMEOUT: u32 = 1_800;

/// The longest a streaming probe holds first syncs back (it normally takes one round
/// trip).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Keys resuming after an outage of the server come back spread over this long.
const RESUME_SPREAD: Duration = Duration::from_millis(200);

/// How long past its `timeoutSeconds` a watch may stay silent before the client gives
/// up on it (a server that ended it without the end reaching us).
const WATCH_DEADLINE_MARGIN: Duration = Duration::from_secs(60);

/// State shared by all watch tasks of one monitor.
pub(crate) struct WatchContext {
    /// The client every request goes through.
    pub(crate) client: Client,
    pub(crate) options: MonitorOptions,
    /// Plural resource name, for errors.
    pub(crate) resource: String,
    /// Cancelled once the server turned out not to serve streaming lists: later keys
    /// list then watch at once, and streaming lists in flight switch over.
    streaming_off: CancellationToken,
    /// Set by the first key that finds streaming lists refused, so it is logged once.
    streaming_off_logged: AtomicBool,
    /// Whether a streaming probe ([`probe_streaming`]) is out: while it is, first
    /// syncs hold their streaming lists, so that a server without them refuses one
    /// request, not the whole start-up burst.
    probe: tokio::sync::watch::Sender<ProbeState>,
    /// Paces first syncs (shared with other bursts when the options give one).
    limiter: AdaptiveLimiter,
    /// How many watch tasks exist ([`WatchCount`]): the default watch timeout grows
    /// with it.
    watches: AtomicUsize,
}

impl WatchContext {
    pub(crate) fn new(client: Client, options: MonitorOptions, resource: String) -> Self {
        // The monitor's own limiter re-queues refused work with the monitor's backoff
        // bounds, so they hold for first syncs as for everything else.
        let limiter = options.limiter.clone().unwrap_or_else(|| {
            AdaptiveLimiter::with_policy(
                options.max_concurrent_syncs,
                AdaptivePolicy {
                    backoff: backoff_policy(&options),
                    ..AdaptivePolicy::default()
                },
            )
        });
        Self {
            client,
            options,
            resource,
            streaming_off: CancellationToken::new(),
            streaming_off_logged: AtomicBool::new(false),
            probe: tokio::sync::watch::Sender::new(ProbeState::None),
            limiter,
            watches: AtomicUsize::new(0),
        }
    }

    /// `timeoutSeconds` of one watch request: at random between the minimum and twice
    /// that, so that watches opened together are renewed spread out. The minimum is
    /// the configured one or else grows with the keys watched
    /// ([`default_min_watch_timeout`]).
    fn watch_timeout_seconds(&self) -> u32 {
        let min = self
            .options
            .watch_timeout
            .unwrap_or_else(|| {
                default_min_watch_timeout(
                    self.watches.load(Ordering::Relaxed),
                    self.options.watch_renewals_per_second,
                )
            })
            .max(1);
        min.saturating_add(rand::random_range(0..min))
    }

    /// Marks a streaming probe out, unless streaming lists are off already (then no
    /// probe is needed: returns false).
    pub(crate) fn probe_starting(&self) -> bool {
        let streaming = self.streaming();
        if streaming {
            self.probe.send_replace(ProbeState::Out);
        }
        streaming
    }

    /// Waits while a streaming probe is out. Returns at once when there is none.
    async fn probe_answered(&self) {
        let mut state = self.probe.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = state.wait_for(|state| *state != ProbeState::Out).await;
    }

    fn streaming(&self) -> bool {
        self.options.initial_list == InitialList::Streaming && !self.streaming_off.is_cancelled()
    }

    /// Turns streaming lists off for every key, logging it once. Returns whether this
    /// key was the first to find out.
    fn refuse_streaming(&self, key: &ObjectKey, error: Option<&MonitorError>) -> bool {
        let first = !self.streaming_off_logged.swap(true, Ordering::Relaxed);
        if first {
            let reason = error.map(ToString::to_string).unwrap_or_default();
            info!(
                first_key = %key,
                %reason,
                "the API server does not serve streaming lists; every watch lists, then watches"
            );
        }
        self.streaming_off.cancel();
        first
    }

    fn error(&self, key: &ObjectKey, kind: MonitorErrorKind) -> MonitorError {
        MonitorError::new(self.resource.as_str(), key.clone(), kind)
    }
}

/// Where the monitor's streaming probe stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProbeState {
    /// No probe was started, or it has been answered: streaming lists go out freely.
    None,
    /// A probe is out: streaming lists wait for its answer.
    Out,
}

/// What the probe's answer says about streaming lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProbeVerdict {
    /// Served: its initial-events bookmark arrived.
    Served,
    /// Refused (422/400, or the `RequestWatchProgress` error): turned off for every key.
    Refused,
    /// Anything else (403, 5xx, no answer in time): nothing learned; keys stream as
    /// without a probe.
    Unknown,
}

/// Asks the API server once whether it serves streaming lists: a streaming list of the
/// collection at `path` narrowed to `name` (best an object that does not exist, in a
/// collection the client may watch). Until the answer, first syncs hold their
/// streaming lists; a refusal turns streaming off before any key asks.
pub(crate) async fn probe_streaming<K>(ctx: Arc<WatchContext>, path: String, name: String)
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // Answered when this returns or is dropped (the monitor went away).
    struct Answered<'a>(&'a WatchContext);
    impl Drop for Answered<'_> {
        fn drop(&mut self) {
            self.0.probe.send_replace(ProbeState::None);
        }
    }
    let answered = Answered(&ctx);
    let mut probing = Box::pin(probe::<K>(&ctx, &path, &name));
    // Keys wait for the answer within their own first-sync deadline: hold them well
    // short of that. A probe that takes longer (queued by a throttling server) is not
    // abandoned: first syncs go ahead, and a late refusal still switches the keys.
    let patience = PROBE_TIMEOUT.min(ctx.options.sync_timeout / 4);
    let verdict = match tokio::time::timeout(patience, &mut probing).await {
        Ok(verdict) => verdict,
        Err(_slow) => {
            ctx.probe.send_replace(ProbeState::None);
            tokio::time::timeout(ctx.options.sync_timeout, probing)
                .await
                .unwrap_or(ProbeVerdict::Unknown)
        }
    };
    debug!(%path, %name, ?verdict, "streaming probe answered");
    if verdict == ProbeVerdict::Refused {
        ctx.refuse_streaming(&ObjectKey::new(String::new(), name.clone()), None);
    }
    drop(answered);
}

async fn probe<K>(ctx: &WatchContext, path: &str, name: &str) -> ProbeVerdict
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut machine: Machine<K> = Machine::new(name, true, 1);
    let answer = request::send::<K>(
        &ctx.client,
        Target { path, name },
        request::Send {
            request: Request::StreamingList,
            resource_version: "",
            timeout_seconds: ctx.watch_timeout_seconds(),
            retry: false,
        },
    )
    .await;
    let mut stream = match answer {
        Answer::Stream(stream) => stream,
        // A refusal comes as the response itself (422/400).
        Answer::Input(input) => {
            return if machine.step(input).streaming_refused {
                ProbeVerdict::Refused
            } else {
                ProbeVerdict::Unknown
            };
        }
    };
    let mut output = machine.step(Input::Opened);
    loop {
        if output.streaming_refused {
            return ProbeVerdict::Refused;
        }
        if let Step::FirstSync(_) = output.step {
            return ProbeVerdict::Served;
        }
        if output.next != Next::Read {
            return ProbeVerdict::Unknown;
        }
        output = machine.step(stream.next::<K>().await);
    }
}

/// Reshapes each object the watch receives before anything keeps it (see
/// [`ObjectMonitor::with_transform`](crate::ObjectMonitor::with_transform)).
pub(crate) type Transform<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

/// One key's protocol state and what it holds open.
struct KeyWatch<K> {
    machine: Machine<K>,
    /// Applied to every received object before the machine sees it.
    transform: Option<Transform<K>>,
    /// The open watch response, if any.
    stream: Option<EventStream>,
    /// When the open watch should have ended on its own.
    deadline: Instant,
    /// One sequence for the key's life: it starts over after a healthy period, not
    /// after every success, so a watch that opens and breaks at once keeps backing off
    /// (and after an outage of the server: see [`back_off`]). Created at the key's
    /// first retry and boxed: most keys never retry, and inline it would take its room
    /// in every watch task for the key's whole life.
    backoff: Option<Box<Backoff>>,
    /// The last request failed without an answer (refused connection, broken stream).
    unanswered: bool,
}

impl<K> KeyWatch<K> {
    /// The key's backoff sequence, started at its first retry.
    fn backoff(&mut self, ctx: &WatchContext) -> &mut Backoff {
        self.backoff
            .get_or_insert_with(|| Box::new(Backoff::new(backoff_policy(&ctx.options))))
    }
}

impl<K: WatchedObject> KeyWatch<K> {
    /// Feeds `input` to the machine, every object in it reshaped by the transform
    /// first: the cache, the events and the comparisons all see the same shape.
    fn step(&mut self, mut input: Input<K>) -> Output<K> {
        self.unanswered = matches!(&input, Input::Failed(failure) if failure.kind.is_transport());
        if let Some(transform) = &self.transform {
            match &mut input {
                Input::Listed {
                    object: Some(object),
                    ..
                }
                | Input::Event(
                    WatchEvent::Added(object)
                    | WatchEvent::Modified(object)
                    | WatchEvent::Deleted(object),
                ) => transform(object),
                _ => {}
            }
        }
        self.machine.step(input)
    }
}

/// What moved the key on.
enum Happened<K> {
    /// An input for the machine.
    Input(Input<K>),
    /// Streaming lists were turned off while this key waited for its initial events.
    StreamingOff,
}

/// Runs the watch for the driver's key until the entry leaves the registry.
///
/// Not an `async fn`: an async fn keeps its arguments for its whole life beside the
/// locals moved out of them, and would hold the transform twice (and the key's state
/// twice, were it an argument). The async block below uses what it captured in place.
pub(crate) fn run<K>(
    driver: SyncDriver<K, StdLocks>,
    ctx: Arc<WatchContext>,
    transform: Option<Transform<K>>,
) -> impl Future<Output = ()> + Send + 'static
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut watch = KeyWatch {
        machine: Machine::new(
            driver.key().name.clone(),
            ctx.streaming(),
            ctx.options.first_sync_attempts,
        ),
        transform,
        stream: None,
        deadline: Instant::now(),
        backoff: None,
        unanswered: false,
    };
    let ctx = WatchCount::new(ctx);
    async move {
        let stopped = driver.stopped();
        tokio::select! {
            biased;
            // Dropping `drive` drops the open response, which closes its HTTP stream.
            () = stopped => debug!(key = %driver.key(), "watch stopped: no handlers left"),
            () = drive(&driver, &ctx, &mut watch) => {}
        }
    }
}

async fn drive<K>(driver: &SyncDriver<K, StdLocks>, ctx: &WatchContext, watch: &mut KeyWatch<K>)
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let key = driver.key();
    // Boxed: needed once, while the task then lives on for as long as the key is
    // watched, so its size matters at thousands of keys.
    let mut next = match Box::pin(bounded_first_sync(watch, key, ctx)).await {
        Ok((object, next)) => {
            driver.synced(object);
            next
        }
        Err(error) => {
            debug!(%key, %error, "first sync failed");
            driver.failed(error);
            return;
        }
    };
    loop {
        // The common case, reading the open watch, is awaited here; everything else
        // (a request, a backoff, the initial events of a streaming list) is boxed, so
        // that this future, which every watched key holds for its whole life, keeps
        // room for a read and no more.
        let happened = if next == Next::Read && !watch.machine.awaits_initial_events() {
            Happened::Input(read(watch).await)
        } else {
            Box::pin(advance(watch, next, key, ctx)).await
        };
        let output = match happened {
            Happened::Input(input) => watch.step(input),
            Happened::StreamingOff => match watch.machine.streaming_unsupported() {
                Some(output) => output,
                None => continue,
            },
        };
        report(&output, key, ctx, true);
        if let Step::Changed { object, events } = output.step {
            driver.publish(object, &events);
        }
        next = output.next;
    }
}

/// The first sync, paced by the adaptive limiter and within its deadline, reported to
/// the observer. Returns the object (`None`: it does not exist) and what to do next.
async fn bounded_first_sync<K>(
    watch: &mut KeyWatch<K>,
    key: &ObjectKey,
    ctx: &WatchContext,
) -> Result<(Option<Arc<K>>, Next), MonitorError>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // The first permit is awaited before the deadline starts: a key waiting for its
    // turn in a long line has not started syncing. Boxed: waiting in line takes the
    // limiter several hundred bytes, which would otherwise stay reserved in this
    // (boxed) future for as long as the first sync's request is out.
    let permit = Box::pin(ctx.limiter.acquire()).await;
    let started = Instant::now();
    let first = tokio::time::timeout(
        ctx.options.sync_timeout,
        first_sync(watch, permit, key, ctx),
    )
    .await
    .unwrap_or_else(|_elapsed| {
        Err(ctx.error(
            key,
            MonitorErrorKind::SyncTimeout {
                timeout: ctx.options.sync_timeout,
            },
        ))
    });
    if let Some(observer) = &ctx.options.observer {
        observer.first_sync(key, started.elapsed(), first.as_ref().map(|_| ()));
    }
    first
}

/// Where a first sync stands with the adaptive limiter: it holds a permit while a
/// request is out (until the sync completes or the request fails), or waits for one.
struct Pacing {
    /// The permit held, if any.
    permit: Option<Permit>,
    /// The place in line a refusal for load gave back: due only after the server's
    /// `Retry-After` (or the backoff delay), so the retry must not also wait for the
    /// key's own backoff.
    refused: Option<Turn>,
}

impl Pacing {
    /// Makes sure a permit is held before a request goes out.
    async fn hold(&mut self, limiter: &AdaptiveLimiter) {
        if self.permit.is_none() {
            let turn = self.refused.take().unwrap_or_else(|| limiter.turn());
            // Boxed, and only when a permit must be waited for: the wait is the
            // exception (a retry), and inline it would reserve its room in the first
            // sync's future for every key while their requests are out.
            self.permit = Some(Box::pin(turn.acquire()).await);
        }
    }

    /// Tells the limiter how the request out failed: a refusal for load (429, 5xx)
    /// shrinks the window and keeps this sync's place in line; any other failure frees
    /// the slot and teaches nothing.
    fn failed(&mut self, failure: &Failure) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        if let MonitorErrorKind::Api { code, .. } = failure.kind
            && is_overload_status(code)
        {
            self.refused = Some(permit.refused(failure.retry_after));
        }
    }

    /// The first sync completed: the window may grow.
    fn succeeded(self) {
        if let Some(permit) = self.permit {
            permit.succeeded();
        }
    }
}

/// Runs the protocol until the first complete listing, or until it fails. Every
/// request goes out with a permit of the adaptive limiter.
async fn first_sync<K>(
    watch: &mut KeyWatch<K>,
    permit: Permit,
    key: &ObjectKey,
    ctx: &WatchContext,
) -> Result<(Option<Arc<K>>, Next), MonitorError>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut pacing = Pacing {
        permit: Some(permit),
        refused: None,
    };
    let mut next = watch.machine.start();
    loop {
        let happened = match next {
            Next::Send(request) => {
                pacing.hold(&ctx.limiter).await;
                Box::pin(send(watch, request, false, key, ctx)).await
            }
            Next::Retry {
                request,
                retry_after,
            } => {
                watch.stream = None;
                // A refusal for load is paced by the limiter (its turn comes due after
                // Retry-After); any other failure backs off as always.
                if pacing.refused.is_none() {
                    Box::pin(back_off(watch, key, ctx, retry_after)).await;
                }
                pacing.hold(&ctx.limiter).await;
                Box::pin(send(watch, request, true, key, ctx)).await
            }
            Next::Read | Next::Fail => advance(watch, next, key, ctx).await,
        };
        let output = match happened {
            Happened::Input(input) => {
                if let Input::Failed(failure) = &input {
                    pacing.failed(failure);
                }
                watch.step(input)
            }
            Happened::StreamingOff => match watch.machine.streaming_unsupported() {
                Some(output) => output,
                None => continue,
            },
        };
        report(&output, key, ctx, false);
        if output.next == Next::Fail {
            let kind = output.error.unwrap_or(MonitorErrorKind::Cancelled);
            return Err(ctx.error(key, kind));
        }
        if let Step::FirstSync(object) = output.step {
            pacing.succeeded();
            return Ok((object, output.next));
        }
        next = output.next;
    }
}

/// Performs `next` and returns what came of it.
async fn advance<K>(
    watch: &mut KeyWatch<K>,
    next: Next,
    key: &ObjectKey,
    ctx: &WatchContext,
) -> Happened<K>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    match next {
        Next::Read if watch.machine.awaits_initial_events() => {
            // The rare case, boxed: a streaming list whose initial events are still
            // coming switches to a list as soon as any key finds streaming refused.
            Box::pin(read_or_streaming_off(watch, ctx)).await
        }
        Next::Read => Happened::Input(read(watch).await),
        Next::Send(request) => Box::pin(send(watch, request, false, key, ctx)).await,
        Next::Retry {
            request,
            retry_after,
        } => {
            // Closed before waiting: a failed watch holds nothing while it backs off.
            watch.stream = None;
            match Box::pin(back_off(watch, key, ctx, retry_after)).await {
                Waited::Elapsed => Box::pin(send(watch, request, true, key, ctx)).await,
                Waited::ServerBack => Box::pin(resume(watch, request, key, ctx)).await,
            }
        }
        // Only a first sync fails, and `first_sync` stops there; should the machine
        // ever fail a key that is already synced, starting over is the safe answer.
        Next::Fail => {
            let request = watch.machine.restart();
            Box::pin(send(watch, request, true, key, ctx)).await
        }
    }
}

/// Waits before a retry: the backoff's next delay (at least `retry_after`), or, when
/// the request failed without an answer (or the server is in an outage) and the
/// monitor has the server's prober, until the server answers again after the outage. Then the outage was not this key's fault:
/// its backoff starts over, and the retry waits a random moment of up to
/// [`RESUME_SPREAD`] so that every key of the monitor does not come back in the same
/// instant.
async fn back_off<K>(
    watch: &mut KeyWatch<K>,
    key: &ObjectKey,
    ctx: &WatchContext,
    retry_after: Option<Duration>,
) -> Waited {
    let delay = retry_delay(watch.backoff(ctx), retry_after);
    // A failure with an answer during an outage counts too: a starting kube-apiserver
    // answers 403 to everything until its authorizer has loaded the RBAC rules.
    let Some(reconnect) = ctx
        .options
        .reconnect
        .as_ref()
        .filter(|reconnect| watch.unanswered || reconnect.in_outage())
    else {
        tokio::time::sleep(delay).await;
        return Waited::Elapsed;
    };
    let mut waited = reconnect.unanswered().wait(delay).await;
    // While the server is down only its prober asks: a retry now would fail (or, from
    // a starting server, meet a 403 and start the key over with a list).
    while waited == Waited::Elapsed && reconnect.in_outage() {
        let delay = retry_delay(watch.backoff(ctx), retry_after);
        waited = reconnect.unanswered().wait(delay).await;
    }
    if waited == Waited::ServerBack {
        debug!(%key, "the API server answers again: resuming now");
        // A sequence not yet started is as good as one started over.
        if let Some(backoff) = &mut watch.backoff {
            backoff.reset();
        }
        tokio::time::sleep(RESUME_SPREAD.mul_f64(rand::random::<f64>())).await;
    }
    waited
}

/// A synced key's watch resumed after an outage of the server: its request waits for
/// a permit of the process's adaptive limiter, like a first sync, so that thousands of
/// keys resuming at once go at the pace the server takes (a 429 or 5xx shrinks the
/// window); the permit is given back when the server has answered.
async fn resume<K>(
    watch: &mut KeyWatch<K>,
    request: Request,
    key: &ObjectKey,
    ctx: &WatchContext,
) -> Happened<K>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let permit = Box::pin(ctx.limiter.acquire()).await;
    let happened = Box::pin(send(watch, request, true, key, ctx)).await;
    match &happened {
        Happened::Input(Input::Failed(failure)) => {
            if let MonitorErrorKind::Api { code, .. } = failure.kind
                && is_overload_status(code)
            {
                // The turn given back is not waited on: the key's own backoff
                // (Retry-After) paces its next try.
                drop(permit.refused(failure.retry_after));
            }
        }
        _ => permit.succeeded(),
    }
    happened
}

/// The next input of the open stream, or a stall once its deadline passed.
async fn read<K>(watch: &mut KeyWatch<K>) -> Input<K>
where
    K: DeserializeOwned,
{
    let Some(stream) = watch.stream.as_mut() else {
        return Input::Ended;
    };
    match tokio::time::timeout_at(watch.deadline, stream.next()).await {
        Ok(input) => input,
        Err(_stalled) => Input::Failed(Failure {
            kind: MonitorErrorKind::Transport {
                verb: kube_common::Verb::Watch,
                cause: crate::TransportError::Stalled,
            },
            retry_after: None,
        }),
    }
}

async fn read_or_streaming_off<K>(watch: &mut KeyWatch<K>, ctx: &WatchContext) -> Happened<K>
where
    K: DeserializeOwned,
{
    tokio::select! {
        biased;
        () = ctx.streaming_off.cancelled() => Happened::StreamingOff,
        input = read(watch) => Happened::Input(input),
    }
}

/// Sends `request` (closing any open stream first) and reads its answer.
async fn send<K>(
    watch: &mut KeyWatch<K>,
    request: Request,
    retry: bool,
    key: &ObjectKey,
    ctx: &WatchContext,
) -> Happened<K>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watch.stream = None;
    if request == Request::StreamingList {
        // Held while the probe is out (one latency at most, usually overlapping the
        // caller's own first request): a refusal then costs one request, not one per key.
        tokio::select! {
            biased;
            () = ctx.streaming_off.cancelled() => return Happened::StreamingOff,
            () = ctx.probe_answered() => {}
        }
        if !ctx.streaming() {
            return Happened::StreamingOff;
        }
    }
    let path = K::collection_path(&key.namespace);
    let timeout_seconds = ctx.watch_timeout_seconds();
    let sending = request::send::<K>(
        &ctx.client,
        Target {
            path: &path,
            name: &key.name,
        },
        request::Send {
            request,
            resource_version: watch.machine.resource_version(),
            timeout_seconds,
            retry,
        },
    );
    let answer = if request == Request::StreamingList {
        tokio::select! {
            // Once streaming is off, an answer that arrives at the same moment (likely
            // a refusal too) is not looked at: the key switches without a failure.
            biased;
            () = ctx.streaming_off.cancelled() => return Happened::StreamingOff,
            answer = sending => answer,
        }
    } else {
        sending.await
    };
    match answer {
        Answer::Stream(stream) => {
            watch.stream = Some(stream);
            watch.deadline = Instant::now()
                + Duration::from_secs(u64::from(timeout_seconds))
                + WATCH_DEADLINE_MARGIN;
            Happened::Input(Input::Opened)
        }
        Answer::Input(input) => Happened::Input(input),
    }
}

/// Tells the observer and the log about an output's error, and turns streaming off
/// globally when the output says so.
fn report<K>(output: &Output<K>, key: &ObjectKey, ctx: &WatchContext, synced: bool) {
    let error = output
        .error
        .as_ref()
        .map(|kind| ctx.error(key, kind.clone()));
    if output.streaming_refused && !ctx.refuse_streaming(key, error.as_ref()) {
        // Another key's refusal came first and switched every key over: this one's,
        // already on its way, is no error of this key's.
        return;
    }
    let Some(error) = error else {
        return;
    };
    if let Some(observer) = &ctx.options.observer {
        observer.watch_error(key, &error);
    }
    let failure = Failure {
        kind: error.kind().clone(),
        retry_after: None,
    };
    match classify(&failure, false) {
        Disposition::Resync => debug!(%key, "watch expired (410); re-listing"),
        _ if output.streaming_refused => {}
        // Throttling is expected under load and retried; the counts are in the
        // transport's accounting, so one line per request would only flood the log.
        _ if error.status_code() == Some(429) || !synced => {
            debug!(%key, %error, "request failed; retrying");
        }
        _ => warn!(%key, %error, "watch failed; retrying"),
    }
}

/// The project's retry policy (client-go's reflector shape) within the configured
/// bounds.
fn backoff_policy(options: &MonitorOptions) -> BackoffPolicy {
    BackoffPolicy::default().with_bounds(options.backoff_min, options.backoff_max)
}

/// The wait before retrying: the backoff's next delay, but never less than the server's
/// `Retry-After`. Past `Retry-After` the wait is spread over up to half as long again,
/// so that the many requests one throttled burst refused do not return in lock-step.
fn retry_delay(backoff: &mut Backoff, retry_after: Option<Duration>) -> Duration {
    let delay = backoff.next_delay();
    match retry_after {
        Some(floor) => delay.max(floor.mul_f64(1.0 + rand::random::<f64>() / 2.0)),
        None => delay,
    }
}

/// The shortest `timeoutSeconds` when none is configured, for `watches` keys: client-go's
/// 300 s, or long enough that watches opened together renew at no more than
/// `renewals_per_second` (they renew evenly between the minimum and twice it), up to
/// [`MAX_DEFAULT_MIN_WATCH_TIMEOUT`]. Every renewal costs a request and CPU on both
/// sides whatever changed, so without this their cost would grow with the keys alone.
fn default_min_watch_timeout(watches: usize, renewals_per_second: u32) -> u32 {
    let rate = usize::try_from(renewals_per_second.max(1)).unwrap_or(usize::MAX);
    let spread = u32::try_from(watches.div_ceil(rate)).unwrap_or(u32::MAX);
    spread.clamp(DEFAULT_MIN_WATCH_TIMEOUT, MAX_DEFAULT_MIN_WATCH_TIMEOUT)
}

/// Counts a watch task in [`WatchContext::watches`] for as long as it exists, however
/// it ends.
struct WatchCount(Arc<WatchContext>);

impl WatchCount {
    fn new(ctx: Arc<WatchContext>) -> Self {
        ctx.watches.fetch_add(1, Ordering::Relaxed);
        Self(ctx)
    }
}

impl Drop for WatchCount {
    fn drop(&mut self) {
        self.0.watches.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::ops::Deref for WatchCount {
    type Target = WatchContext;

    fn deref(&self) -> &WatchContext {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;

    use super::*;
    use crate::registry::Registry;

    /// A watch task lives as long as its key is watched, ten thousand of them at a
    /// time: its size is memory per watched object. Guards against a change that
    /// quietly keeps a large value (an object, an error, a first-sync state) inline.
    /// Tokio allocates a task as one cell: the future, about a hundred bytes of its own,
    /// rounded up to 128 bytes. An idle watch task (the open watch being read) stays
    /// within a 768-byte cell in a debug build (it was 1,024 with an 840-byte future):
    /// the key's state is built before the task's future and held once, its backoff is
    /// made at its first retry, and a read is the only wait kept inline.
    #[tokio::test]
    async fn an_idle_watch_task_fits_a_768_byte_task_cell() {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::empty()))
        });
        let client = kube::Client::new(service, "default");
        let registry: Registry<Secret, StdLocks> = Registry::new("secrets");
        let (_ticket, driver) = registry.join(&ObjectKey::new("ns", "a"));
        let ctx = Arc::new(WatchContext::new(
            client,
            MonitorOptions::default(),
            "secrets".into(),
        ));
        let transform: Transform<Secret> = Arc::new(|_secret: &mut Secret| {});
        let task = run(
            driver.expect("a new entry has a driver"),
            ctx,
            Some(transform),
        );
        let size = std::mem::size_of_val(&task);
        println!("watch task future: {size} bytes");
        assert!(
            size <= 640,
            "the watch task's future grew to {size} bytes: past a 768-byte task cell"
        );
        assert!(std::mem::size_of::<KeyWatch<Secret>>() <= 256);
    }

    /// During a start-up every key's first sync has its request out at once, ten
    /// thousand of them: the boxed first-sync state and the boxed request future are
    /// memory per key at the start-up's peak. Guards against room reserved in them for
    /// what happens only before or after the wait for the response (a wait in the
    /// limiter's line, reading a list or an error, the request itself).
    #[tokio::test]
    async fn a_first_sync_in_flight_stays_small() {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::empty()))
        });
        let client = kube::Client::new(service, "default");
        let ctx = WatchContext::new(client, MonitorOptions::default(), "secrets".into());
        let key = ObjectKey::new("ns", "a");
        let mut watch: KeyWatch<Secret> = KeyWatch {
            machine: Machine::new("a".to_owned(), true, 1),
            transform: None,
            stream: None,
            deadline: Instant::now(),
            backoff: None,
            unanswered: false,
        };
        let request_size =
            std::mem::size_of_val(&send(&mut watch, Request::Watch, false, &key, &ctx));
        let first_sync_size = std::mem::size_of_val(&bounded_first_sync(&mut watch, &key, &ctx));
        println!("first sync: {first_sync_size} bytes, its request: {request_size} bytes");
        // Debug build (release: smaller); before the limiter's wait and the response's
        // reading were boxed: 1,432 and 1,352 bytes.
        assert!(
            first_sync_size <= 1_000,
            "the first sync's future grew to {first_sync_size} bytes"
        );
        assert!(
            request_size <= 1_000,
            "a request's future grew to {request_size} bytes"
        );
    }

    fn context(options: MonitorOptions) -> Arc<WatchContext> {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::empty()))
        });
        let client = kube::Client::new(service, "default");
        Arc::new(WatchContext::new(client, options, "secrets".into()))
    }

    #[tokio::test]
    async fn watch_timeouts_are_spread_between_the_minimum_and_twice_that() {
        let ctx = context(MonitorOptions {
            watch_timeout: Some(100),
            ..MonitorOptions::default()
        });
        let timeouts: Vec<u32> = (0..1_000).map(|_| ctx.watch_timeout_seconds()).collect();
        assert!(timeouts.iter().all(|t| (100..200).contains(t)));
        // Spread, not all alike: a thousand draws land in most of the hundred values.
        let distinct: std::collections::BTreeSet<u32> = timeouts.into_iter().collect();
        assert!(distinct.len() > 50, "{}", distinct.len());
        let default = context(MonitorOptions::default()).watch_timeout_seconds();
        assert!((300..600).contains(&default));
    }

    #[test]
    fn the_default_timeout_keeps_renewals_to_the_rate_up_to_the_api_servers_own() {
        let rate = crate::DEFAULT_WATCH_RENEWALS_PER_SECOND;
        assert_eq!(default_min_watch_timeout(0, rate), 300);
        assert_eq!(default_min_watch_timeout(10_000, rate), 300);
        assert_eq!(default_min_watch_timeout(30_000, rate), 300);
        assert_eq!(default_min_watch_timeout(30_001, rate), 301);
        assert_eq!(default_min_watch_timeout(100_000, rate), 1_000);
        assert_eq!(default_min_watch_timeout(180_000, rate), 1_800);
        assert_eq!(default_min_watch_timeout(1_000_000, rate), 1_800);
        assert_eq!(default_min_watch_timeout(usize::MAX, 0), 1_800);
        assert_eq!(default_min_watch_timeout(500, 1), 500);
    }

    /// The minimum follows the watch tasks that exist: counted when a key's task is
    /// made, uncounted when its future is dropped (as a finished task's is).
    #[tokio::test]
    async fn the_default_timeout_grows_with_the_keys_watched() {
        let ctx = context(MonitorOptions {
            watch_renewals_per_second: 1,
            ..MonitorOptions::default()
        });
        let registry: Registry<Secret, StdLocks> = Registry::new("secrets");
        let mut tickets = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..450 {
            let (ticket, driver) = registry.join(&ObjectKey::new("ns", format!("s{i}")));
            tickets.push(ticket);
            let driver = driver.expect("a new entry has a driver");
            tasks.push(run(driver, Arc::clone(&ctx), None));
        }
        assert_eq!(ctx.watches.load(Ordering::Relaxed), 450);
        let timeouts: Vec<u32> = (0..200).map(|_| ctx.watch_timeout_seconds()).collect();
        assert!(
            timeouts.iter().all(|t| (450..900).contains(t)),
            "{timeouts:?}"
        );
        tasks.truncate(100);
        assert_eq!(ctx.watches.load(Ordering::Relaxed), 100);
        let timeouts: Vec<u32> = (0..200).map(|_| ctx.watch_timeout_seconds()).collect();
        assert!(
            timeouts.iter().all(|t| (300..600).contains(t)),
            "{timeouts:?}"
        );
        drop(tasks);
        assert_eq!(ctx.watches.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn retries_wait_for_retry_after_and_spread_past_it() {
        let mut backoff = Backoff::new(
            BackoffPolicy::default()
                .with_bounds(Duration::from_millis(10), Duration::from_millis(20)),
        );
        let delays: Vec<Duration> = (0..200)
            .map(|_| retry_delay(&mut backoff, Some(Duration::from_secs(2))))
            .collect();
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_secs(2) && *d <= Duration::from_secs(3))
        );
        let distinct: std::collections::BTreeSet<Duration> = delays.into_iter().collect();
        assert!(distinct.len() > 100, "retries return in lock-step");
        assert!(retry_delay(&mut backoff, None) <= Duration::from_millis(20));
    }
}
