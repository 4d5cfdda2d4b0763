//! API Priority and Fairness, modelled on kube-apiserver's: every request is
//! classified by the default flow schemas into a priority level; each level has a
//! concurrency limit carved out of the server's (`--max-requests-inflight` plus
//! `--max-mutating-requests-inflight`) by its nominal shares, lends and borrows seats
//! as demand shifts (re-divided every adjustment period), and queues what it cannot
//! serve in shuffle-sharded per-flow queues. A request that finds its queue full, waits
//! longer than the queue-wait limit, or meets a level that does not queue, is refused
//! with 429 and a `Retry-After` that grows while the level keeps refusing.
//!
//! With the defaults the router's service account lands where it lands on a real
//! server: flow schema `service-accounts` (its group `system:serviceaccounts`), priority
//! level `workload-low`, one flow per user. `system:masters` and health probes are
//! exempt.
//!
//! Simplifications, each named where it applies: every request occupies one seat (the
//! real server charges unnamed LISTs more); non-empty queues are served round-robin
//! (fair queuing's virtual clock gives the same order when requests cost the same); no
//! flow schema or priority level objects are served, the defaults are built in.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::auth::users::UserInfo;
use crate::config::FlowControlConfig;

/// What a priority level does with a request it cannot serve at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limiting {
    /// Never limited.
    Exempt,
    /// Refused (reason `concurrency-limit`).
    Reject,
    /// Queued in shuffle-sharded queues.
    Queue {
        queues: usize,
        hand_size: usize,
        queue_length_limit: usize,
    },
}

/// One priority level of kube-apiserver's default configuration.
struct LevelSpec {
    name: &'static str,
    nominal_shares: u32,
    lendable_percent: u32,
    limiting: Limiting,
}

const fn queuing(queues: usize, hand_size: usize) -> Limiting {
    Limiting::Queue {
        queues,
        hand_size,
        queue_length_limit: 50,
    }
}

/// kube-apiserver's default priority levels (as `GET prioritylevelconfigurations`
/// lists them on v1.36).
const PRIORITY_LEVELS: &[LevelSpec] = &[
    LevelSpec {
        name: "exempt",
        nominal_shares: 0,
        lendable_percent: 0,
        limiting: Limiting::Exempt,
    },
    LevelSpec {
        name: "catch-all",
        nominal_shares: 5,
        lendable_percent: 0,
        limiting: Limiting::Reject,
    },
    LevelSpec {
        name: "global-default",
        nominal_shares: 20,
        lendable_percent: 50,
        limiting: queuing(128, 6),
    },
    LevelSpec {
        name: "leader-election",
        nominal_shares: 10,
        lendable_percent: 0,
        limiting: queuing(16, 4),
    },
    LevelSpec {
        name: "node-high",
        nominal_shares: 40,
        lendable_percent: 25,
        limiting: queuing(64, 6),
    },
    LevelSpec {
        name: "system",
        nominal_shares: 30,
        lendable_percent: 33,
        limiting: queuing(64, 6),
    },
    LevelSpec {
        name: "workload-high",
        nominal_shares: 40,
        lendable_percent: 50,
        limiting: queuing(128, 6),
    },
    LevelSpec {
        name: "workload-low",
        nominal_shares: 100,
        lendable_percent: 90,
        limiting: queuing(128, 6),
    },
];

/// Who a flow schema rule applies to.
enum Subject {
    Group(&'static str),
    User(&'static str),
    /// `name` may be `*`.
    ServiceAccount {
        namespace: &'static str,
        name: &'static str,
    },
}

/// A resource rule of a flow schema; `*` matches anything.
struct ResourceRule {
    verbs: &'static [&'static str],
    groups: &'static [&'static str],
    resources: &'static [&'static str],
    namespaces: &'static [&'static str],
    cluster_scope: bool,
}

/// A non-resource rule; a URL ending in `*` matches by prefix.
struct NonResourceRule {
    verbs: &'static [&'static str],
    urls: &'static [&'static str],
}

/// How requests of one flow schema are split into flows.
#[derive(Clone, Copy)]
enum Distinguisher {
    None,
    ByUser,
    ByNamespace,
}

struct FlowSchemaSpec {
    name: &'static str,
    level: &'static str,
    distinguisher: Distinguisher,
    subjects: &'static [Subject],
    resource_rules: &'static [ResourceRule],
    non_resource_rules: &'static [NonResourceRule],
}

const EVERY_RESOURCE: &[ResourceRule] = &[ResourceRule {
    verbs: &["*"],
    groups: &["*"],
    resources: &["*"],
    namespaces: &["*"],
    cluster_scope: true,
}];
const EVERY_URL: &[NonResourceRule] = &[NonResourceRule {
    verbs: &["*"],
    urls: &["*"],
}];
const EVERYONE: &[Subject] = &[
    Subject::Group("system:unauthenticated"),
    Subject::Group("system:authenticated"),
];

/// kube-apiserver's default flow schemas, in matching precedence.
const FLOW_SCHEMAS: &[FlowSchemaSpec] = &[
    FlowSchemaSpec {
        name: "exempt",
        level: "exempt",
        distinguisher: Distinguisher::None,
        subjects: &[Subject::Group("system:masters")],
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "probes",
        level: "exempt",
        distinguisher: Distinguisher::None,
        subjects: EVERYONE,
        resource_rules: &[],
        non_resource_rules: &[NonResourceRule {
            verbs: &["get"],
            urls: &["/healthz", "/readyz", "/livez"],
        }],
    },
    FlowSchemaSpec {
        name: "system-leader-election",
        level: "leader-election",
        distinguisher: Distinguisher::ByUser,
        subjects: &[
            Subject::User("system:kube-controller-manager"),
            Subject::User("system:kube-scheduler"),
            Subject::ServiceAccount {
                namespace: "kube-system",
                name: "*",
            },
        ],
        resource_rules: &[ResourceRule {
            verbs: &["get", "create", "update"],
            groups: &["coordination.k8s.io"],
            resources: &["leases"],
            namespaces: &["*"],
            cluster_scope: false,
        }],
        non_resource_rules: &[],
    },
    FlowSchemaSpec {
        name: "system-node-high",
        level: "node-high",
        distinguisher: Distinguisher::ByUser,
        subjects: &[Subject::Group("system:nodes")],
        resource_rules: &[
            ResourceRule {
                verbs: &["*"],
                groups: &[""],
                resources: &["nodes", "nodes/status"],
                namespaces: &["*"],
                cluster_scope: true,
            },
            ResourceRule {
                verbs: &["*"],
                groups: &["coordination.k8s.io"],
                resources: &["leases"],
                namespaces: &["*"],
                cluster_scope: false,
            },
        ],
        non_resource_rules: &[],
    },
    FlowSchemaSpec {
        name: "system-nodes",
        level: "system",
        distinguisher: Distinguisher::ByUser,
        subjects: &[Subject::Group("system:nodes")],
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "kube-controller-manager",
        level: "workload-high",
        distinguisher: Distinguisher::ByNamespace,
        subjects: &[Subject::User("system:kube-controller-manager")],
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "kube-scheduler",
        level: "workload-high",
        distinguisher: Distinguisher::ByNamespace,
        subjects: &[Subject::User("system:kube-scheduler")],
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "kube-system-service-accounts",
        level: "workload-high",
        distinguisher: Distinguisher::ByNamespace,
        subjects: &[Subject::ServiceAccount {
            namespace: "kube-system",
            name: "*",
        }],
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "service-accounts",
        level: "workload-low",
        distinguisher: Distinguisher::ByUser,
        subjects: &[Subject::Group("system:serviceaccounts")],
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "global-default",
        level: "global-default",
        distinguisher: Distinguisher::ByUser,
        subjects: EVERYONE,
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
    FlowSchemaSpec {
        name: "catch-all",
        level: "catch-all",
        distinguisher: Distinguisher::ByUser,
        subjects: EVERYONE,
        resource_rules: EVERY_RESOURCE,
        non_resource_rules: EVERY_URL,
    },
];

fn star_or(list: &[&str], wanted: &str) -> bool {
    list.iter().any(|item| *item == "*" || *item == wanted)
}

impl Subject {
    fn matches(&self, user: &UserInfo) -> bool {
        match self {
            Subject::Group(group) => user.groups.iter().any(|g| g == group),
            Subject::User(name) => user.name == *name,
            Subject::ServiceAccount { namespace, name } => user
                .name
                .strip_prefix("system:serviceaccount:")
                .and_then(|rest| rest.split_once(':'))
                .is_some_and(|(ns, sa)| ns == *namespace && (*name == "*" || sa == *name)),
        }
    }
}

/// What classification needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RequestShape<'a> {
    /// A resource request: verb, API group, `resource` or `resource/subresource`,
    /// namespace (`None` at the cluster scope).
    Resource {
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        namespace: Option<&'a str>,
    },
    /// A non-resource request: lower-cased method and path.
    NonResource { verb: &'a str, path: &'a str },
}

impl FlowSchemaSpec {
    fn matches(&self, user: &UserInfo, request: RequestShape<'_>) -> bool {
        if !self.subjects.iter().any(|s| s.matches(user)) {
            return false;
        }
        match request {
            RequestShape::Resource {
                verb,
                group,
                resource,
                namespace,
            } => self.resource_rules.iter().any(|rule| {
                star_or(rule.verbs, verb)
                    && star_or(rule.groups, group)
                    && star_or(rule.resources, resource)
                    && match namespace {
                        None => rule.cluster_scope,
                        Some(ns) => star_or(rule.namespaces, ns),
                    }
            }),
            RequestShape::NonResource { verb, path } => {
                self.non_resource_rules.iter().any(|rule| {
                    star_or(rule.verbs, verb)
                        && rule.urls.iter().any(|url| {
                            *url == "*"
                                || *url == path
                                || url
                                    .strip_suffix('*')
                                    .is_some_and(|prefix| path.starts_with(prefix))
                        })
                })
            }
        }
    }
}

/// Where a request belongs: its flow schema, priority level and flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Classification {
    schema: usize,
    level: usize,
    /// Identifies the flow (schema and distinguisher) for shuffle sharding.
    flow: u64,
}

impl Classification {
    /// The flow schema's name.
    pub(crate) fn flow_schema(&self) -> &'static str {
        FLOW_SCHEMAS[self.schema].name
    }

    /// The priority level's name.
    pub(crate) fn priority_level(&self) -> &'static str {
        PRIORITY_LEVELS[self.level].name
    }
}

/// Finds the first flow schema (in precedence) that matches, as kube-apiserver does;
/// `catch-all` matches everyone.
pub(crate) fn classify(user: &UserInfo, request: RequestShape<'_>) -> Classification {
    let schema = FLOW_SCHEMAS
        .iter()
        .position(|s| s.matches(user, request))
        .unwrap_or(FLOW_SCHEMAS.len() - 1);
    let spec = &FLOW_SCHEMAS[schema];
    let level = PRIORITY_LEVELS
        .iter()
        .position(|l| l.name == spec.level)
        .unwrap_or(0);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    spec.name.hash(&mut hasher);
    match spec.distinguisher {
        Distinguisher::None => {}
        Distinguisher::ByUser => user.name.hash(&mut hasher),
        Distinguisher::ByNamespace => {
            let namespace = match request {
                RequestShape::Resource { namespace, .. } => namespace.unwrap_or(""),
                RequestShape::NonResource { .. } => "",
            };
            namespace.hash(&mut hasher);
        }
    }
    Classification {
        schema,
        level,
        flow: hasher.finish(),
    }
}

/// Deals a hand of `hand` distinct queue indices out of `queues` from a flow's hash,
/// so that each flow always lands on the same few queues and two flows rarely share
/// all of them (shuffle sharding).
fn deal_hand(mut entropy: u64, queues: usize, hand: usize) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::with_capacity(hand);
    for dealt in 0..hand.min(queues) {
        let remaining = (queues - dealt) as u64;
        let mut pick = (entropy % remaining) as usize;
        entropy /= remaining;
        // The pick counts only the queues not dealt yet.
        let mut taken = chosen.clone();
        taken.sort_unstable();
        for queue in taken {
            if queue <= pick {
                pick += 1;
            }
        }
        chosen.push(pick);
    }
    chosen
}

/// A priority level's seat limits derived from the server's concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LevelBounds {
    /// `ceil(ServerCL * shares / sum of shares)`.
    pub nominal: f64,
    /// Nominal minus the seats it may lend.
    pub min: f64,
    /// Nominal plus what it may borrow (no borrowing limit: the server's).
    pub max: f64,
    pub exempt: bool,
}

fn bounds(server_cl: u32) -> Vec<LevelBounds> {
    let shares: u32 = PRIORITY_LEVELS.iter().map(|l| l.nominal_shares).sum();
    PRIORITY_LEVELS
        .iter()
        .map(|l| {
            let nominal = (f64::from(server_cl) * f64::from(l.nominal_shares)
                / f64::from(shares.max(1)))
            .ceil();
            let lendable = (nominal * f64::from(l.lendable_percent) / 100.0).round();
            LevelBounds {
                nominal,
                min: nominal - lendable,
                max: nominal + f64::from(server_cl),
                exempt: l.limiting == Limiting::Exempt,
            }
        })
        .collect()
}

/// A level's seat demand over the adjustment period just ended.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Demand {
    /// The highest demand (occupied plus queued seats) seen.
    pub high: f64,
    /// Exponentially smoothed envelope (average plus standard deviation).
    pub smooth: f64,
}

/// Divides the server's seats among the levels for the next period, by the rules
/// kube-apiserver's borrowing follows (KEP-1040): each level gets at least its
/// guaranteed minimum and what it used (up to its nominal share); the rest goes out in
/// proportion to smoothed demand, within each level's bounds.
pub(crate) fn allocate(levels: &[LevelBounds], demand: &[Demand], server_cl: f64) -> Vec<f64> {
    let min_current: Vec<f64> = levels
        .iter()
        .zip(demand)
        .map(|(b, d)| {
            if b.exempt {
                b.min.max(d.high)
            } else {
                b.min.max(b.nominal.min(d.high))
            }
        })
        .collect();
    if levels
        .iter()
        .zip(&min_current)
        .all(|(b, m)| (b.nominal - m).abs() < f64::EPSILON)
    {
        return levels.iter().map(|b| b.nominal).collect();
    }
    let mut current = vec![0.0; levels.len()];
    let mut remaining = server_cl;
    for (i, b) in levels.iter().enumerate() {
        if b.exempt {
            current[i] = min_current[i];
            remaining -= min_current[i];
        }
    }
    let limited: Vec<usize> = (0..levels.len()).filter(|i| !levels[*i].exempt).collect();
    let min_sum: f64 = limited.iter().map(|i| levels[*i].min).sum();
    let min_current_sum: f64 = limited.iter().map(|i| min_current[*i]).sum();
    if remaining <= min_sum {
        for &i in &limited {
            current[i] = levels[i].min;
        }
    } else if remaining <= min_current_sum {
        let share = (remaining - min_sum) / (min_current_sum - min_sum);
        for &i in &limited {
            current[i] = levels[i].min + (min_current[i] - levels[i].min) * share;
        }
    } else {
        let target: Vec<f64> = (0..levels.len())
            .map(|i| min_current[i].max(demand[i].smooth))
            .collect();
        let at = |prop: f64| -> f64 {
            limited
                .iter()
                .map(|&i| (prop * target[i]).max(min_current[i]).min(levels[i].max))
                .sum()
        };
        // The sum grows with the proportion: bisect for the one that fills the server.
        let (mut low, mut high) = (0.0_f64, 1.0_f64);
        while at(high) < remaining && high < 1e12 {
            high *= 2.0;
        }
        for _ in 0..100 {
            let mid = (low + high) / 2.0;
            if at(mid) < remaining {
                low = mid;
            } else {
                high = mid;
            }
        }
        for &i in &limited {
            current[i] = (high * target[i]).max(min_current[i]).min(levels[i].max);
        }
    }
    current
}

/// Time-weighted seat demand of one level over the current period.
struct DemandTracker {
    period_start: Instant,
    last_change: Instant,
    now: f64,
    high: f64,
    /// Integral of demand over time (seat-seconds).
    area: f64,
    /// Integral of demand squared over time.
    area_sq: f64,
    smooth: f64,
}

/// kube-apiserver's smoothing coefficient (a half-life of about 5 minutes at 10 s).
const SMOOTHING: f64 = 0.977;

impl DemandTracker {
    fn new(now: Instant) -> Self {
        DemandTracker {
            period_start: now,
            last_change: now,
            now: 0.0,
            high: 0.0,
            area: 0.0,
            area_sq: 0.0,
            smooth: 0.0,
        }
    }

    fn set(&mut self, at: Instant, demand: f64) {
        let dt = at.saturating_duration_since(self.last_change).as_secs_f64();
        self.area += self.now * dt;
        self.area_sq += self.now * self.now * dt;
        self.now = demand;
        self.high = self.high.max(demand);
        self.last_change = at;
    }

    fn finish_period(&mut self, at: Instant) -> Demand {
        self.set(at, self.now);
        let length = at
            .saturating_duration_since(self.period_start)
            .as_secs_f64();
        let (avg, var) = if length > 0.0 {
            let avg = self.area / length;
            (avg, (self.area_sq / length - avg * avg).max(0.0))
        } else {
            (self.now, 0.0)
        };
        let envelope = avg + var.sqrt();
        self.smooth = envelope.max(SMOOTHING * self.smooth + (1.0 - SMOOTHING) * envelope);
        let demand = Demand {
            high: self.high,
            smooth: self.smooth,
        };
        self.period_start = at;
        self.area = 0.0;
        self.area_sq = 0.0;
        self.high = self.now;
        demand
    }
}

/// The `Retry-After` a level answers refusals with: it starts at 1 s, doubles (to at
/// most 32 s, and at most once per current value's worth of seconds) while the level
/// refuses at least three times that many requests within that many seconds, and
/// steps down by one second when refusals fall below it — kube-apiserver's rule.
struct RetryAfter {
    seconds: u64,
    raised_at: u64,
    /// Refusals per whole second since the tracker's epoch, oldest first.
    history: VecDeque<(u64, u64)>,
}

const MAX_RETRY_AFTER: u64 = 32;

impl RetryAfter {
    fn new() -> Self {
        RetryAfter {
            seconds: 1,
            raised_at: 0,
            history: VecDeque::new(),
        }
    }

    fn refused(&mut self, second: u64) {
        self.update(second);
        match self.history.back_mut() {
            Some((at, count)) if *at == second => *count += 1,
            _ => self.history.push_back((second, 1)),
        }
        while self
            .history
            .front()
            .is_some_and(|(at, _)| second.saturating_sub(*at) > MAX_RETRY_AFTER)
        {
            self.history.pop_front();
        }
    }

    fn current(&mut self, second: u64) -> u64 {
        self.update(second);
        self.seconds
    }

    fn update(&mut self, second: u64) {
        let window = self.seconds;
        let refused: u64 = self
            .history
            .iter()
            .rev()
            .take_while(|(at, _)| second.saturating_sub(*at) <= window)
            .filter(|(at, _)| *at < second)
            .map(|(_, count)| count)
            .sum();
        if second.saturating_sub(self.raised_at) >= window && refused >= 3 * window {
            self.seconds = (window * 2).min(MAX_RETRY_AFTER);
            self.raised_at = second;
        } else if refused < window && window > 1 {
            self.seconds = window - 1;
        }
    }
}

/// Why a request was refused (the `reason` label of
/// `apiserver_flowcontrol_rejected_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RejectReason {
    /// Its queue held `queueLengthLimit` requests.
    QueueFull,
    /// It waited longer than the queue-wait limit.
    TimeOut,
    /// Its level does not queue and had no free seat.
    ConcurrencyLimit,
}

impl RejectReason {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue-full",
            RejectReason::TimeOut => "time-out",
            RejectReason::ConcurrencyLimit => "concurrency-limit",
        }
    }
}

/// A refused request: why, and the `Retry-After` to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejection {
    pub reason: RejectReason,
    pub retry_after_secs: u64,
}

struct Waiter {
    id: u64,
    /// Carries the index of the queue the seat was granted from.
    grant: oneshot::Sender<usize>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
    /// Requests dispatched from this queue and still executing.
    executing: usize,
}

struct LevelState {
    current_limit: u32,
    seats_in_use: u32,
    queued: usize,
    queues: Vec<Queue>,
    /// Where the round-robin over non-empty queues resumes.
    next_queue: usize,
    demand: DemandTracker,
    retry_after: RetryAfter,
    peak_seats: u32,
    peak_queued: usize,
    dispatched: u64,
}

struct FlowState {
    levels: Vec<LevelState>,
    /// Refusals by (flow schema, priority level, reason).
    rejected: BTreeMap<(usize, usize, RejectReason), u64>,
    next_waiter: u64,
}

/// The APF filter (see the module documentation).
pub(crate) struct FlowControl {
    config: FlowControlConfig,
    bounds: Vec<LevelBounds>,
    /// Seconds for the `Retry-After` history are counted from here.
    epoch: Instant,
    /// Guards every level's seats, queues and demand, and the refusal counts.
    state: Mutex<FlowState>,
}

impl FlowControl {
    /// A filter with every level at its share of an idle server.
    pub(crate) fn new(config: FlowControlConfig) -> Arc<FlowControl> {
        let now = Instant::now();
        let bounds = bounds(config.server_concurrency_limit());
        let idle = allocate(
            &bounds,
            &vec![Demand::default(); bounds.len()],
            f64::from(config.server_concurrency_limit()),
        );
        let levels = PRIORITY_LEVELS
            .iter()
            .zip(&idle)
            .map(|(spec, limit)| LevelState {
                current_limit: limit.round() as u32,
                seats_in_use: 0,
                queued: 0,
                queues: match spec.limiting {
                    Limiting::Queue { queues, .. } => {
                        (0..queues).map(|_| Queue::default()).collect()
                    }
                    _ => Vec::new(),
                },
                next_queue: 0,
                demand: DemandTracker::new(now),
                retry_after: RetryAfter::new(),
                peak_seats: 0,
                peak_queued: 0,
                dispatched: 0,
            })
            .collect();
        Arc::new(FlowControl {
            config,
            bounds,
            epoch: now,
            state: Mutex::new(FlowState {
                levels,
                rejected: BTreeMap::new(),
                next_waiter: 0,
            }),
        })
    }

    /// The configuration this filter was built from.
    pub(crate) fn config(&self) -> &FlowControlConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, FlowState> {
        kube_common::sync::lock(&self.state)
    }

    fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// Admits a request: at once if its level has a seat and nobody waits, after a
    /// wait in its flow's queue, or not at all.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        class: Classification,
    ) -> Result<Seat, (Classification, Rejection)> {
        self.admit_classified(class).await.map_err(|r| (class, r))
    }

    async fn admit_classified(self: &Arc<Self>, class: Classification) -> Result<Seat, Rejection> {
        let level = class.level;
        let (id, granted) = {
            let mut st = self.lock();
            let now = Instant::now();
            let lvl = &mut st.levels[level];
            let can_run = lvl.seats_in_use == 0 || lvl.seats_in_use < lvl.current_limit;
            match PRIORITY_LEVELS[level].limiting {
                Limiting::Exempt => {
                    Self::occupy(lvl, None, now);
                    return Ok(self.seat(level, None));
                }
                _ if can_run && lvl.queued == 0 => {
                    Self::occupy(lvl, None, now);
                    return Ok(self.seat(level, None));
                }
                Limiting::Reject => {
                    return Err(self.refuse(&mut st, class, RejectReason::ConcurrencyLimit));
                }
                Limiting::Queue {
                    queues,
                    hand_size,
                    queue_length_limit,
                } => {
                    let hand = deal_hand(class.flow, queues, hand_size);
                    // The least loaded queue of the hand (waiting plus executing).
                    let Some(queue) = hand.into_iter().min_by_key(|q| {
                        let queue = &lvl.queues[*q];
                        (queue.waiting.len() + queue.executing, *q)
                    }) else {
                        return Err(self.refuse(&mut st, class, RejectReason::QueueFull));
                    };
                    if lvl.queues[queue].waiting.len() >= queue_length_limit {
                        return Err(self.refuse(&mut st, class, RejectReason::QueueFull));
                    }
                    let id = st.next_waiter;
                    st.next_waiter += 1;
                    let lvl = &mut st.levels[level];
                    let (grant, granted) = oneshot::channel();
                    lvl.queues[queue].waiting.push_back(Waiter { id, grant });
                    lvl.queued += 1;
                    lvl.peak_queued = lvl.peak_queued.max(lvl.queued);
                    let demand = f64::from(lvl.seats_in_use) + lvl.queued as f64;
                    lvl.demand.set(now, demand);
                    (id, granted)
                }
            }
        };
        let mut waiting = Waiting {
            control: self.clone(),
            level,
            id,
            granted,
            settled: false,
        };
        let outcome =
            tokio::time::timeout(self.config.queue_wait_limit, &mut waiting.granted).await;
        waiting.settled = true;
        if let Ok(Ok(queue)) = outcome {
            return Ok(self.seat(level, Some(queue)));
        }
        // Timed out: leave the queue, unless a seat was granted in the meantime.
        let mut st = self.lock();
        if Self::remove_waiter(&mut st.levels[level], id) {
            return Err(self.refuse(&mut st, class, RejectReason::TimeOut));
        }
        drop(st);
        match waiting.granted.try_recv() {
            Ok(queue) => Ok(self.seat(level, Some(queue))),
            // Neither queued nor granted cannot happen: every waiter is one or the
            // other until it is settled.
            Err(_) => Err(Rejection {
                reason: RejectReason::TimeOut,
                retry_after_secs: 1,
            }),
        }
    }

    fn seat(self: &Arc<Self>, level: usize, queue: Option<usize>) -> Seat {
        Seat {
            control: self.clone(),
            level,
            queue,
        }
    }

    fn occupy(lvl: &mut LevelState, queue: Option<usize>, now: Instant) {
        lvl.seats_in_use += 1;
        lvl.dispatched += 1;
        lvl.peak_seats = lvl.peak_seats.max(lvl.seats_in_use);
        if let Some(q) = queue {
            lvl.queues[q].executing += 1;
        }
        let demand = f64::from(lvl.seats_in_use) + lvl.queued as f64;
        lvl.demand.set(now, demand);
    }

    fn refuse(&self, st: &mut FlowState, class: Classification, reason: RejectReason) -> Rejection {
        *st.rejected
            .entry((class.schema, class.level, reason))
            .or_default() += 1;
        let second = self.second();
        let tracker = &mut st.levels[class.level].retry_after;
        tracker.refused(second);
        Rejection {
            reason,
            retry_after_secs: tracker.current(second),
        }
    }

    /// Removes a waiter still in its queue; false when it was already granted.
    fn remove_waiter(lvl: &mut LevelState, id: u64) -> bool {
        for queue in &mut lvl.queues {
            if let Some(pos) = queue.waiting.iter().position(|w| w.id == id) {
                queue.waiting.remove(pos);
                lvl.queued -= 1;
                let demand = f64::from(lvl.seats_in_use) + lvl.queued as f64;
                lvl.demand.set(Instant::now(), demand);
                return true;
            }
        }
        false
    }

    /// Hands free seats of a level to its queued requests, round-robin over the
    /// non-empty queues.
    fn dispatch(lvl: &mut LevelState) {
        let now = Instant::now();
        while lvl.queued > 0 && (lvl.seats_in_use == 0 || lvl.seats_in_use < lvl.current_limit) {
            let count = lvl.queues.len();
            let Some(queue) = (0..count)
                .map(|k| (lvl.next_queue + k) % count)
                .find(|q| !lvl.queues[*q].waiting.is_empty())
            else {
                break;
            };
            lvl.next_queue = (queue + 1) % count;
            let Some(waiter) = lvl.queues[queue].waiting.pop_front() else {
                break;
            };
            lvl.queued -= 1;
            // A waiter that gave up meanwhile does not take the seat.
            if waiter.grant.send(queue).is_ok() {
                Self::occupy(lvl, Some(queue), now);
            } else {
                let demand = f64::from(lvl.seats_in_use) + lvl.queued as f64;
                lvl.demand.set(now, demand);
            }
        }
    }

    fn release(&self, level: usize, queue: Option<usize>) {
        let mut st = self.lock();
        let lvl = &mut st.levels[level];
        lvl.seats_in_use = lvl.seats_in_use.saturating_sub(1);
        if let Some(q) = queue {
            lvl.queues[q].executing = lvl.queues[q].executing.saturating_sub(1);
        }
        let demand = f64::from(lvl.seats_in_use) + lvl.queued as f64;
        lvl.demand.set(Instant::now(), demand);
        Self::dispatch(lvl);
    }

    /// Ends an adjustment period: re-divides the server's seats by the demand seen
    /// and lets levels that gained seats dispatch.
    pub(crate) fn adjust(&self) {
        let mut st = self.lock();
        let now = Instant::now();
        let demand: Vec<Demand> = st
            .levels
            .iter_mut()
            .map(|l| l.demand.finish_period(now))
            .collect();
        let limits = allocate(
            &self.bounds,
            &demand,
            f64::from(self.config.server_concurrency_limit()),
        );
        for (lvl, limit) in st.levels.iter_mut().zip(limits) {
            lvl.current_limit = limit.round().max(0.0) as u32;
            Self::dispatch(lvl);
        }
    }

    /// The counters behind `/sim/stats` and `/metrics`.
    pub(crate) fn stats(&self) -> FlowControlStats {
        let mut st = self.lock();
        let second = self.second();
        let priority_levels = PRIORITY_LEVELS
            .iter()
            .zip(st.levels.iter_mut())
            .zip(&self.bounds)
            .map(|((spec, lvl), bounds)| {
                (
                    spec.name.to_string(),
                    PriorityLevelStats {
                        nominal_limit: bounds.nominal as u32,
                        current_limit: lvl.current_limit,
                        seats_in_use: lvl.seats_in_use,
                        peak_seats_in_use: lvl.peak_seats,
                        queued: lvl.queued as u64,
                        peak_queued: lvl.peak_queued as u64,
                        dispatched: lvl.dispatched,
                        retry_after_seconds: lvl.retry_after.current(second),
                    },
                )
            })
            .collect();
        let rejected = st
            .rejected
            .iter()
            .map(|((schema, level, reason), count)| RejectedRequests {
                flow_schema: FLOW_SCHEMAS[*schema].name.to_string(),
                priority_level: PRIORITY_LEVELS[*level].name.to_string(),
                reason: reason.as_str().to_string(),
                count: *count,
            })
            .collect();
        FlowControlStats {
            server_concurrency_limit: self.config.server_concurrency_limit(),
            priority_levels,
            rejected,
        }
    }

    /// Zeroes the counters; seats, queues and limits stay.
    pub(crate) fn reset_counters(&self) {
        let mut st = self.lock();
        st.rejected.clear();
        for lvl in &mut st.levels {
            lvl.peak_seats = lvl.seats_in_use;
            lvl.peak_queued = lvl.queued;
            lvl.dispatched = 0;
        }
    }
}

/// A queued request; leaving before it is granted takes it out of its queue, leaving
/// after gives its seat back.
struct Waiting {
    control: Arc<FlowControl>,
    level: usize,
    id: u64,
    granted: oneshot::Receiver<usize>,
    settled: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut st = self.control.lock();
        let lvl = &mut st.levels[self.level];
        if FlowControl::remove_waiter(lvl, self.id) {
            return;
        }
        drop(st);
        // Granted while the request was going away: pass the seat on.
        if let Ok(queue) = self.granted.try_recv() {
            self.control.release(self.level, Some(queue));
        }
    }
}

/// One occupied seat of a priority level; given back on drop.
pub(crate) struct Seat {
    control: Arc<FlowControl>,
    level: usize,
    queue: Option<usize>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.control.release(self.level, self.queue);
    }
}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(PRIORITY_LEVELS[self.level].name)
    }
}

/// One priority level's state (a part of [`crate::SimStats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorityLevelStats {
    /// Seats by the level's nominal shares.
    pub nominal_limit: u32,
    /// Seats the level may use in this adjustment period (after lending and borrowing).
    pub current_limit: u32,
    /// Seats occupied now.
    pub seats_in_use: u32,
    /// Highest `seats_in_use` since start or the last reset.
    pub peak_seats_in_use: u32,
    /// Requests waiting in the level's queues now.
    pub queued: u64,
    /// Highest `queued` since start or the last reset.
    pub peak_queued: u64,
    /// Requests given a seat since start or the last reset.
    pub dispatched: u64,
    /// The `Retry-After` the level's refusals carry now.
    pub retry_after_seconds: u64,
}

/// Requests refused for one flow schema, priority level and reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedRequests {
    /// Flow schema.
    pub flow_schema: String,
    /// Priority level.
    pub priority_level: String,
    /// `queue-full`, `time-out` or `concurrency-limit`.
    pub reason: String,
    /// How many.
    pub count: u64,
}

/// API Priority and Fairness as the simulator applies it now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowControlStats {
    /// Seats all levels share (`--max-requests-inflight` plus
    /// `--max-mutating-requests-inflight`).
    pub server_concurrency_limit: u32,
    /// Each priority level by name.
    pub priority_levels: BTreeMap<String, PriorityLevelStats>,
    /// Refusals, by flow schema, level and reason.
    pub rejected: Vec<RejectedRequests>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn get_secret(namespace: &str) -> RequestShape<'_> {
        RequestShape::Resource {
            verb: "get",
            group: "",
            resource: "secrets",
            namespace: Some(namespace),
        }
    }

    #[test]
    fn identities_land_where_kube_apiserver_puts_them() {
        let router = user(
            "system:serviceaccount:openshift-ingress:router",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-ingress",
                "system:authenticated",
            ],
        );
        let cases = [
            (
                &router,
                get_secret("app"),
                "service-accounts",
                "workload-low",
            ),
            (
                &user("admin", &["system:masters", "system:authenticated"]),
                get_secret("app"),
                "exempt",
                "exempt",
            ),
            (
                &user("alice", &["system:authenticated"]),
                get_secret("app"),
                "global-default",
                "global-default",
            ),
            (
                &user("alice", &["system:authenticated"]),
                RequestShape::NonResource {
                    verb: "get",
                    path: "/readyz",
                },
                "probes",
                "exempt",
            ),
            (
                &user(
                    "system:serviceaccount:kube-system:gc",
                    &["system:serviceaccounts", "system:authenticated"],
                ),
                get_secret("app"),
                "kube-system-service-accounts",
                "workload-high",
            ),
            (
                &user("nobody", &[]),
                get_secret("app"),
                "catch-all",
                "catch-all",
            ),
        ];
        for (who, request, schema, level) in cases {
            let class = classify(who, request);
            assert_eq!(
                (class.flow_schema(), class.priority_level()),
                (schema, level),
                "{}",
                who.name
            );
        }
        // One flow per user: the same user always, another user differently.
        let again = classify(&router, get_secret("other"));
        assert_eq!(again.flow, classify(&router, get_secret("app")).flow);
        let other = user("system:serviceaccount:x:y", &["system:serviceaccounts"]);
        assert_ne!(classify(&other, get_secret("app")).flow, again.flow);
    }

    #[test]
    fn limits_are_divided_as_on_a_real_idle_server() {
        // kube-apiserver v1.36 with the default flags reports these nominal and (idle)
        // current limits in apiserver_flowcontrol_{nominal,current}_limit_seats.
        let control = FlowControl::new(FlowControlConfig::default());
        let stats = control.stats();
        let level = |name: &str| stats.priority_levels[name].clone();
        let nominal: Vec<u32> = [
            "catch-all",
            "global-default",
            "leader-election",
            "node-high",
            "system",
            "workload-high",
            "workload-low",
        ]
        .iter()
        .map(|n| level(n).nominal_limit)
        .collect();
        assert_eq!(nominal, [13, 49, 25, 98, 74, 98, 245]);
        let current: Vec<u32> = [
            "catch-all",
            "global-default",
            "leader-election",
            "workload-high",
            "workload-low",
        ]
        .iter()
        .map(|n| level(n).current_limit)
        .collect();
        assert_eq!(current, [30, 56, 58, 114, 56]);
        // With --max-requests-inflight=4 --max-mutating-requests-inflight=2 the router's
        // level has no seat of its own when idle (it still runs one request at a time).
        let small = FlowControl::new(FlowControlConfig {
            max_requests_inflight: 4,
            max_mutating_requests_inflight: 2,
            ..FlowControlConfig::default()
        });
        let low = small.stats().priority_levels["workload-low"].clone();
        assert_eq!((low.nominal_limit, low.current_limit), (3, 0));
    }

    #[test]
    fn a_busy_level_borrows_at_the_next_adjustment() {
        let levels = bounds(600);
        let mut demand = vec![Demand::default(); levels.len()];
        let low = PRIORITY_LEVELS
            .iter()
            .position(|l| l.name == "workload-low")
            .unwrap();
        demand[low] = Demand {
            high: 400.0,
            smooth: 400.0,
        };
        let limits = allocate(&levels, &demand, 600.0);
        assert!(limits[low] > 245.0, "borrowed beyond nominal: {limits:?}");
        let total: f64 = limits.iter().sum();
        assert!(
            (total - 600.0).abs() < 1.0,
            "the server's seats, all given: {total}"
        );
        for (limit, b) in limits.iter().zip(&levels) {
            assert!(*limit >= b.min - 1e-9, "{limits:?}");
        }
    }

    #[test]
    fn hands_are_distinct_and_stable() {
        for entropy in [0_u64, 1, 12_345, u64::MAX] {
            let hand = deal_hand(entropy, 128, 6);
            let mut sorted = hand.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 6);
            assert!(hand.iter().all(|q| *q < 128));
            assert_eq!(hand, deal_hand(entropy, 128, 6));
        }
    }

    #[test]
    fn retry_after_doubles_under_refusals_and_decays() {
        let mut tracker = RetryAfter::new();
        assert_eq!(tracker.current(0), 1);
        for _ in 0..10 {
            tracker.refused(0);
        }
        assert_eq!(tracker.current(1), 2, "10 refusals in the last second");
        for _ in 0..10 {
            tracker.refused(1);
        }
        assert_eq!(tracker.current(2), 2, "raised at most once per Retry-After");
        for _ in 0..10 {
            tracker.refused(2);
        }
        assert_eq!(tracker.current(3), 4);
        assert_eq!(tracker.current(40), 3, "quiet: one second less per update");
    }

    #[tokio::test]
    async fn one_flow_fills_its_queues_then_is_refused_queue_full() {
        let control = FlowControl::new(FlowControlConfig {
            max_requests_inflight: 4,
            max_mutating_requests_inflight: 2,
            ..FlowControlConfig::default()
        });
        let router = user(
            "system:serviceaccount:openshift-ingress:router",
            &["system:serviceaccounts"],
        );
        let class = classify(&router, get_secret("app"));
        // workload-low has no seat of its own: the first request runs anyway...
        let running = control.admit(class).await.unwrap();
        // ...the next ones queue in the flow's hand of 6 queues of 50...
        let mut queued = Vec::new();
        for _ in 0..300 {
            let c = control.clone();
            queued.push(tokio::spawn(async move { c.admit(class).await.map(drop) }));
        }
        while control.stats().priority_levels["workload-low"].queued < 300 {
            tokio::task::yield_now().await;
        }
        // ...and then there is no room.
        let (_, refused) = control.admit(class).await.unwrap_err();
        assert_eq!(refused.reason, RejectReason::QueueFull);
        assert_eq!(refused.retry_after_secs, 1);
        let stats = control.stats();
        assert_eq!(stats.rejected[0].flow_schema, "service-accounts");
        assert_eq!(stats.rejected[0].reason, "queue-full");
        // Giving the seat back lets every queued request through, one at a time.
        drop(running);
        for q in queued {
            q.await.unwrap().unwrap();
        }
        assert_eq!(
            control.stats().priority_levels["workload-low"].dispatched,
            301
        );
        // Exempt users are never held up.
        let admin = user("admin", &["system:masters"]);
        let _exempt: Vec<Seat> = futures::future::try_join_all(
            (0..50).map(|_| control.admit(classify(&admin, get_secret("app")))),
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn waiting_too_long_is_refused_time_out() {
        let control = FlowControl::new(FlowControlConfig {
            max_requests_inflight: 1,
            max_mutating_requests_inflight: 0,
            queue_wait_limit: Duration::from_millis(20),
            ..FlowControlConfig::default()
        });
        let router = user("system:serviceaccount:a:b", &["system:serviceaccounts"]);
        let class = classify(&router, get_secret("app"));
        let _running = control.admit(class).await.unwrap();
        let (_, refused) = control.admit(class).await.unwrap_err();
        assert_eq!(refused.reason, RejectReason::TimeOut);
        assert_eq!(control.stats().priority_levels["workload-low"].queued, 0);
    }
}
