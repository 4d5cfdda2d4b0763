//! One status writer among replicas: leader election on a `coordination.k8s.io/v1`
//! Lease, the way client-go's `leaderelection` does it, on kube's client.
//!
//! Every replica watches the Lease (one watch narrowed to its name). A follower notes,
//! on its own monotonic clock, when it last saw the record change; the record expires
//! `leaseDurationSeconds` after that, whatever the clocks of the writers say. At that
//! moment (not at the next poll: the watch says when the record changed) the follower
//! takes it over with an update carrying the resourceVersion it saw, so of several
//! followers exactly one wins and the others get a 409. The leader renews every
//! [`LeaseOptions::retry_period`] with the same precondition; if it cannot renew for
//! [`LeaseOptions::renew_deadline`] (shorter than the lease duration) it stops leading
//! before any follower may start, and a 409 (someone else's record) stops it at once.
//! A leader that shuts down releases the Lease (empty holder), so a follower takes over
//! at once instead of after the duration.
//!
//! The leader's term is counted from when it *sent* its last accepted write of the
//! Lease: a follower saw that write no earlier, so none takes over before
//! `sent + lease_duration`, and the leader writes only until `sent + renew_deadline`
//! ([`Leadership::is_leader`] reads the clock itself). A leader whose election task is
//! scheduled late (a busy machine, a stalled runtime thread) therefore stops writing on
//! time even before the task notices; the difference between the two durations is
//! what a status write already sent has to arrive in.
//!
//! Why not a crate (docs/DESIGN.md, "One status writer"): kube-leader-election needs
//! kube 4 and renews and takes over with merge patches without a resourceVersion (two
//! followers can both "acquire"); kube-lease-manager builds on kube 5, but judges expiry
//! by the holder's wall clock, takes an expired lease over by clearing its holder
//! without a precondition (which can clear a fresh winner's claim), holds a lock across
//! its requests, and polls where a watch tells at once.
//!
//! Requests: one watch (plus its list) per replica; the leader one update per retry
//! period; an election one create or update per contender.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube_common::listing::{Change, ListingStreamExt};
use kube_common::time::sleep_until;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How a replica takes part in the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    /// The Lease's namespace (the replicas' own).
    pub namespace: String,
    /// The Lease's name: one per router name.
    pub name: String,
    /// This replica's identity in `holderIdentity` (unique among replicas: the pod name
    /// and a random suffix).
    pub identity: String,
    /// How long a record is good for after a follower saw it change
    /// (`leaseDurationSeconds`; client-go's default, 15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps leading while renewals fail (client-go's default,
    /// 10 s; shorter than the lease duration, so it stops before anyone else starts).
    pub renew_deadline: Duration,
    /// How often the leader renews, and how soon a failed request is tried again
    /// (client-go's default, 2 s).
    pub retry_period: Duration,
}

impl LeaseOptions {
    /// client-go's defaults (15 s, 10 s, 2 s) for the Lease `name` in `namespace`.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// `leaseDurationSeconds` as written: whole seconds, at least one.
    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Whether this replica leads now, and its changes; cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership {
    /// Whether the election holds the Lease, as its task last decided.
    leading: watch::Receiver<bool>,
    /// Until when the last accepted write of the Lease lets this replica write
    /// (`None`: without end, for a leadership without an election).
    term: watch::Receiver<Option<Instant>>,
    /// Keeps the channels open for a leadership that never changes.
    _fixed: Option<Arc<FixedLeadership>>,
}

/// The senders of a leadership without an election of its own: the decisions' (when
/// they never change) and the term's (which never ends).
#[derive(Debug)]
struct FixedLeadership {
    _leading: Option<watch::Sender<bool>>,
    _term: watch::Sender<Option<Instant>>,
}

impl Leadership {
    /// A leadership that is always held: the only writer, without an election.
    pub fn always() -> Self {
        let (sender, leading) = watch::channel(true);
        Self::untimed(leading, Some(sender))
    }

    /// A leadership decided elsewhere (another election library, an operator's
    /// switch): this replica leads while `leading` says `true`, with no term of its
    /// own (a late decision is not caught by the clock).
    pub fn from_decisions(leading: watch::Receiver<bool>) -> Self {
        Self::untimed(leading, None)
    }

    /// `leading` without a term; `sender`, when the decisions never change, kept so
    /// that the channel stays open.
    fn untimed(leading: watch::Receiver<bool>, sender: Option<watch::Sender<bool>>) -> Self {
        let (term_sender, term) = watch::channel(None);
        Self {
            leading,
            term,
            _fixed: Some(Arc::new(FixedLeadership {
                _leading: sender,
                _term: term_sender,
            })),
        }
    }

    /// Whether this replica may write now: the election holds the Lease and its last
    /// renewal, counted from when it was sent, is younger than the renew deadline.
    /// This reads the clock, so it turns `false` on time however late the election's
    /// task runs.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
            && self
                .term
                .borrow()
                .is_none_or(|until| Instant::now() < until)
    }

    /// A receiver of the election's decisions (`true`: leading). Between them,
    /// [`Leadership::is_leader`] may still turn `false` when a renewal is late.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// A receiver of the term's ends: it changes on every renewal, so a writer that
    /// paused because the term ran out learns when it may write again.
    pub fn terms(&self) -> watch::Receiver<Option<Instant>> {
        self.term.clone()
    }
}

/// A replica's part in the election: a task that watches, takes over and renews the
/// Lease. Stop it with [`LeaderElector::release`] (or drop it: the task ends and the
/// Lease expires on its own).
#[derive(Debug)]
pub struct LeaderElector {
    leadership: Leadership,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl LeaderElector {
    /// Starts taking part in the election for `options.name` through `client`.
    pub fn spawn(client: kube::Client, options: LeaseOptions) -> Self {
        let (sender, leading) = watch::channel(false);
        let (term_sender, term) = watch::channel(Some(Instant::now()));
        let stop = CancellationToken::new();
        let election = Election {
            api: Api::namespaced(client, &options.namespace),
            options,
            leading: sender,
            term: term_sender,
            observed: None,
            listed: false,
            last_renewal: None,
            failing: false,
            written: std::collections::VecDeque::new(),
        };
        let task = tokio::spawn(election.run(stop.clone()));
        Self {
            leadership: Leadership {
                leading,
                term,
                _fixed: None,
            },
            stop,
            task: Some(task),
        }
    }

    /// Whether this replica leads, and its changes.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// Stops taking part: a leader releases the Lease (empty holder, so a follower
    /// takes over at once) before this returns.
    pub async fn release(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        // Without `release`: stop at once, without a last request.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What a replica last saw of the Lease, and when (its own clock).
#[derive(Debug)]
struct Observed {
    lease: Lease,
    /// When the record last changed, as seen here.
    changed_at: Instant,
}

impl Observed {
    fn spec(&self) -> Option<&LeaseSpec> {
        self.lease.spec.as_ref()
    }

    fn holder(&self) -> Option<&str> {
        self.spec()
            .and_then(|spec| spec.holder_identity.as_deref())
            .filter(|holder| !holder.is_empty())
    }

    fn resource_version(&self) -> Option<&str> {
        self.lease.metadata.resource_version.as_deref()
    }

    /// When the record runs out, by this replica's clock.
    fn expires_at(&self) -> Instant {
        let seconds = self
            .spec()
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .unwrap_or(0);
        self.changed_at + Duration::from_secs(seconds)
    }
}

struct Election {
    api: Api<Lease>,
    options: LeaseOptions,
    leading: watch::Sender<bool>,
    /// Until when this replica may write: its last accepted write's sending plus the
    /// renew deadline.
    term: watch::Sender<Option<Instant>>,
    observed: Option<Observed>,
    /// The watch has listed: `observed: None` then means there is no Lease.
    listed: bool,
    /// While leading: when the last successful renewal (or the acquisition) was sent.
    last_renewal: Option<Instant>,
    /// The last take-over or create failed (logged once per streak).
    failing: bool,
    /// resourceVersions of this replica's latest writes: the watch delivers them after
    /// the answers did, and such a late event must not replace the newer record in
    /// hand (a renewal from it would meet its own 409).
    written: std::collections::VecDeque<String>,
}

/// How many of its own writes a replica remembers to recognise them in the watch.
const OWN_WRITES: usize = 8;

/// What one request of the election came to.
enum Outcome {
    /// The Lease is ours: this is what the server stored.
    Held(Box<Lease>),
    /// Someone else's record came first (409): wait for the watch to show it.
    Lost,
    /// No answer, or an error: try again after the retry period.
    Failed(kube::Error),
    /// No answer within the renew deadline.
    TimedOut,
}

impl Election {
    async fn run(mut self, stop: CancellationToken) {
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.options.name));
        let mut events = watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .gather_listings()
            .boxed();
        let mut next_action: Option<Instant> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        if self.observe(event) {
                            // Someone else's record (or none): decide again now.
                            next_action = Some(Instant::now());
                        }
                    }
                    // Until the watch has listed, this replica cannot lead: say why (the
                    // watcher's backoff spaces these out).
                    Some(Err(error)) => warn!(
                        lease = %self.lease_name(),
                        %error,
                        "lease watch failed; retrying (this replica writes no status until it lists the Lease)"
                    ),
                    None => break,
                },
                () = sleep_until(next_action), if next_action.is_some() => {
                    next_action = self.act().await;
                }
            }
        }
        if self.is_leading() {
            self.release().await;
        }
        self.set_leading(false, "stopped");
    }

    /// Takes in one watch change; returns whether the record changed (this replica's
    /// own writes, already taken in from their answers, do not count).
    fn observe(&mut self, change: Change<Lease>) -> bool {
        match change {
            Change::Listed(leases) => {
                // The watch selects one name: the listing holds that Lease or nothing.
                let changed = self.saw(leases.into_iter().next_back());
                let first = !self.listed;
                self.listed = true;
                changed || first
            }
            Change::Applied(lease) => self.saw(Some(lease)),
            Change::Deleted(_) => self.saw(None),
        }
    }

    /// Records what the server holds now (from the watch or an answer); returns
    /// whether it differs from what was known.
    fn saw(&mut self, lease: Option<Lease>) -> bool {
        let Some(lease) = lease else {
            let had = self.observed.take().is_some();
            if self.is_leading() {
                self.set_leading(false, "the lease was deleted");
            }
            return had;
        };
        let rv = lease.metadata.resource_version.clone();
        let unchanged = self
            .observed
            .as_ref()
            .is_some_and(|observed| observed.resource_version() == rv.as_deref());
        let own = rv
            .as_ref()
            .is_some_and(|rv| self.written.iter().any(|written| written == rv));
        if unchanged || own {
            return false;
        }
        let before = self
            .observed
            .as_ref()
            .and_then(|o| o.holder().map(str::to_owned));
        debug!(
            lease = %self.lease_name(),
            resource_version = rv.as_deref().unwrap_or(""),
            holder = lease.spec.as_ref().and_then(|spec| spec.holder_identity.as_deref()).unwrap_or(""),
            duration_seconds = lease.spec.as_ref().and_then(|spec| spec.lease_duration_seconds).unwrap_or(0),
            "the lease record changed"
        );
        self.observed = Some(Observed {
            lease,
            changed_at: Instant::now(),
        });
        let holder = self
            .observed
            .as_ref()
            .and_then(Observed::holder)
            .map(str::to_owned);
        if let Some(holder) = holder.as_deref()
            && holder != self.options.identity
        {
            if self.is_leading() {
                self.set_leading(false, "another replica holds the lease");
            }
            if before.as_deref() != Some(holder) {
                info!(lease = %self.lease_name(), leader = %holder, "following the status writer");
            }
        }
        true
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.options.namespace, self.options.name)
    }

    fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// One log line per change of this replica's leadership.
    fn set_leading(&mut self, leading: bool, why: &str) {
        if self.is_leading() == leading {
            return;
        }
        self.leading.send_replace(leading);
        if leading {
            info!(lease = %self.lease_name(), identity = %self.options.identity, "leading: this replica writes route status");
        } else {
            self.last_renewal = None;
            self.term.send_replace(Some(Instant::now()));
            info!(lease = %self.lease_name(), identity = %self.options.identity, reason = why, "no longer leading: another replica writes route status");
        }
    }

    /// Renews, takes over or creates the Lease as the time has come to; returns when
    /// to act next (`None`: when the watch shows a change).
    async fn act(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let retry = now + self.options.retry_period;
        if !self.listed {
            return None;
        }
        if self.is_leading() {
            // A renewal that has not come back by the renew deadline ends the leading
            // as a failed one would: followers may take over soon after.
            let since = self.last_renewal.unwrap_or(now);
            let left = self
                .options
                .renew_deadline
                .saturating_sub(now.saturating_duration_since(since));
            let sent = Instant::now();
            let renewal = tokio::time::timeout(left, self.write(false))
                .await
                .unwrap_or(Outcome::TimedOut);
            return match renewal {
                Outcome::Held(lease) => {
                    self.held(lease, sent);
                    Some(retry)
                }
                Outcome::Lost => {
                    self.set_leading(false, "the lease was taken over");
                    None
                }
                Outcome::Failed(error) => {
                    let since = self.last_renewal.unwrap_or(now);
                    if Instant::now().saturating_duration_since(since)
                        >= self.options.renew_deadline
                    {
                        self.set_leading(false, "the lease could not be renewed in time");
                    } else {
                        warn!(lease = %self.lease_name(), %error, "cannot renew the lease; retrying");
                    }
                    Some(retry)
                }
                Outcome::TimedOut => {
                    self.set_leading(false, "the lease could not be renewed in time");
                    Some(retry)
                }
            };
        }
        let free = match &self.observed {
            None => true,
            Some(observed) => observed.holder().is_none() || now >= observed.expires_at(),
        };
        if !free {
            return self.observed.as_ref().map(Observed::expires_at);
        }
        debug!(
            lease = %self.lease_name(),
            holder = self.observed.as_ref().and_then(Observed::holder).unwrap_or(""),
            "taking the lease"
        );
        let sent = Instant::now();
        let acquisition = tokio::time::timeout(self.options.renew_deadline, self.write(true))
            .await
            .unwrap_or(Outcome::TimedOut);
        match acquisition {
            Outcome::Held(lease) => {
                self.failing = false;
                self.held(lease, sent);
                self.set_leading(true, "acquired");
                Some(retry)
            }
            // The winner's record comes through the watch.
            Outcome::Lost => None,
            Outcome::TimedOut => {
                debug!(lease = %self.lease_name(), "no answer to the take-over in time; retrying");
                Some(retry)
            }
            Outcome::Failed(error) => {
                if self.failing {
                    debug!(lease = %self.lease_name(), %error, "cannot take the lease; retrying");
                } else {
                    warn!(
                        lease = %self.lease_name(),
                        %error,
                        "cannot take the lease; retrying (it needs create, get, list, watch and update on leases)"
                    );
                }
                self.failing = true;
                Some(retry)
            }
        }
    }

    /// Takes in the server's answer to this replica's write sent at `sent`: the term
    /// runs to `sent` plus the renew deadline (a follower saw the write no earlier).
    fn held(&mut self, lease: Box<Lease>, sent: Instant) {
        self.last_renewal = Some(sent);
        self.term
            .send_replace(Some(sent + self.options.renew_deadline));
        let rv = lease.metadata.resource_version.clone();
        self.saw(Some(*lease));
        if let Some(rv) = rv {
            if self.written.len() == OWN_WRITES {
                self.written.pop_front();
            }
            self.written.push_back(rv);
        }
    }

    /// Writes this replica's record: a renewal, or (`acquire`) a take-over of the
    /// record last seen (or a new Lease when there is none).
    async fn write(&self, acquire: bool) -> Outcome {
        let now = MicroTime(Timestamp::now());
        let previous = self.observed.as_ref();
        let spec = previous.and_then(Observed::spec);
        let transitions = spec.and_then(|spec| spec.lease_transitions).unwrap_or(0);
        // As client-go counts: every acquisition of an existing record is a transition
        // (from a released one too).
        let changes_hands = acquire && previous.is_some();
        let record = LeaseSpec {
            holder_identity: Some(self.options.identity.clone()),
            lease_duration_seconds: Some(self.options.duration_seconds()),
            acquire_time: if acquire {
                Some(now.clone())
            } else {
                spec.and_then(|spec| spec.acquire_time.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if changes_hands {
                transitions + 1
            } else {
                transitions
            }),
            ..LeaseSpec::default()
        };
        let answer = match previous {
            Some(previous) => {
                let mut lease = previous.lease.clone();
                lease.metadata.managed_fields = None;
                lease.spec = Some(record);
                self.api
                    .replace(&self.options.name, &PostParams::default(), &lease)
                    .await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.options.name.clone()),
                        namespace: Some(self.options.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(record),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
        };
        match answer {
            Ok(lease) => Outcome::Held(Box::new(lease)),
            Err(kube::Error::Api(status)) if status.code == 409 => Outcome::Lost,
            Err(error) => Outcome::Failed(error),
        }
    }

    /// Gives the Lease up: an empty holder with a one-second duration, as client-go
    /// releases it, so a follower takes over at once.
    async fn release(&mut self) {
        let Some(observed) = &self.observed else {
            return;
        };
        let mut lease = observed.lease.clone();
        lease.metadata.managed_fields = None;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        match self
            .api
            .replace(&self.options.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.lease_name(), "released the lease"),
            Err(error) => {
                warn!(lease = %self.lease_name(), %error, "cannot release the lease; it expires on its own")
            }
        }
    }
}
