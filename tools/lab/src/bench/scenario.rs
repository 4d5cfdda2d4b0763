//! Benchmark scenarios: the cluster the simulator generates, its latency and
//! concurrency limit, the client-side bound, and the targets the product is held to.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::BenchError;

/// One start-up scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// Short name, used in the table and the JSON (`customer-2000`).
    pub name: String,
    /// Routes with an external certificate.
    pub routes: usize,
    /// Distinct secrets they reference (route `i` uses secret `i mod secrets`).
    pub secrets: usize,
    /// Namespaces the routes and secrets are spread over.
    pub namespaces: usize,
    /// Server-side latency of every API request (for a watch: until its headers).
    pub latency: Duration,
    /// Whether `latency` is injected by the simulator (false against a real API
    /// server, whose latency is its own: `latency` is then zero).
    pub latency_injected: bool,
    /// Latency of `create` requests (access and rules reviews, the only creates at
    /// start-up) when it should differ from `latency`.
    pub review_latency: Option<Duration>,
    /// The simulator's concurrency limit (API Priority and Fairness model).
    pub max_inflight: Option<usize>,
    /// Requests that may wait for a slot beyond `max_inflight`; more get 429.
    pub queue: usize,
    /// The product's bound on concurrent first syncs (`MonitorOptions::max_concurrent_syncs`).
    pub max_concurrent_syncs: Option<usize>,
    /// Every route also gets its Service and an EndpointSlice with one endpoint.
    #[serde(default)]
    pub endpoints: bool,
}

/// The queue length of the APF scenario: kube-apiserver shuffle-shards one flow over
/// `handSize` = 6 queues of `queueLengthLimit` = 50 requests (its defaults), so one
/// client can have about 300 requests waiting at one priority level.
pub const APF_QUEUE: usize = 300;

/// The APF scenario's server concurrency.
pub const APF_MAX_INFLIGHT: usize = 50;

/// The API server budgets the daemon is held to, as built-in scenarios run on request
/// (`--scenarios budgets` runs them all): 300 routes at 10 ms behind kube-sim's simple
/// concurrency limit of 4, 10 and 50 seats, without a queue (429 at once beyond the
/// seats) and with one of 50, and without any limit. certwatch runs without
/// `--max-concurrent-syncs`: nothing to tune. Each also runs at another size as
/// `<name>@<routes>` (`budget-4@2000`; `budgets@2000` for all of them).
pub const BUDGET_PRESETS: [&str; 7] = [
    "budget-4",
    "budget-4-queue",
    "budget-10",
    "budget-10-queue",
    "budget-50",
    "budget-50-queue",
    "budget-unlimited",
];

/// Routes of the budget scenarios unless their name says another size.
pub const BUDGET_ROUTES: usize = 300;

/// Names of the built-in scenarios, in the order they run by default.
pub const PRESETS: [&str; 5] = [
    "seed-112",
    "seed-1738",
    "customer-2000",
    "scale-10000",
    "apf-2000",
];

/// Namespaces of the `scale-10000` scenario: 10,000 routes in 100 namespaces.
const SCALE_NAMESPACES: usize = 100;

/// Namespaces for `secrets` secrets when none are given: one per 40 secrets (the
/// demo's 2,000 routes over 50 namespaces).
pub fn default_namespaces(secrets: usize) -> usize {
    secrets.div_ceil(40).max(1)
}

impl Scenario {
    /// A scenario with one route per secret, default namespaces and no limit.
    pub fn new(name: &str, secrets: usize, latency: Duration) -> Self {
        Self {
            name: name.to_owned(),
            routes: secrets,
            secrets,
            namespaces: default_namespaces(secrets),
            latency,
            latency_injected: true,
            review_latency: None,
            max_inflight: None,
            queue: 50,
            max_concurrent_syncs: None,
            endpoints: false,
        }
    }

    /// A built-in scenario by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Result<Self, BenchError> {
        let ms = Duration::from_millis;
        Ok(match name {
            // The seed's table: measured start-up divided by the number of secrets.
            "seed-112" => Self::new(name, 112, ms(587)),
            "seed-1738" => Self::new(name, 1_738, ms(1_414)),
            // The customer: ~2,000 routes failing a 120 s start-up probe.
            "customer-2000" => Self::new(name, 2_000, ms(1_414)),
            // The scale target: 10,000 routes and secrets in 100 namespaces
            // (`--routes 10000` alone spreads them over 250, one per 40 secrets).
            "scale-10000" => Self {
                namespaces: SCALE_NAMESPACES,
                ..Self::new(name, 10_000, ms(1_414))
            },
            // The customer's cluster behind API Priority and Fairness: 50 requests in
            // flight, a queue, 429 beyond it. The product bounds its first syncs to the
            // server's concurrency: more would only wait in the server's queue.
            "apf-2000" => Self {
                max_inflight: Some(APF_MAX_INFLIGHT),
                queue: APF_QUEUE,
                max_concurrent_syncs: Some(APF_MAX_INFLIGHT),
                ..Self::new(name, 2_000, ms(1_414))
            },
            "budget-unlimited" => Self::new(name, BUDGET_ROUTES, ms(10)),
            other => {
                return Self::budget(other).ok_or_else(|| {
                    BenchError::Usage(format!(
                        "unknown scenario {other:?}; the built-in ones are {}, {} (or `budgets`)",
                        PRESETS.join(", "),
                        BUDGET_PRESETS.join(", ")
                    ))
                });
            }
        })
    }

    /// `budget-N` (no queue) and `budget-N-queue` (a queue of 50), for the seats in
    /// [`BUDGET_PRESETS`]; `<budget>@<routes>` for another size than
    /// [`BUDGET_ROUTES`] (one secret per route, one namespace per 40).
    fn budget(name: &str) -> Option<Self> {
        let (preset, routes) = match name.split_once('@') {
            Some((preset, routes)) => (preset, routes.parse().ok().filter(|n| *n > 0)?),
            None => (name, BUDGET_ROUTES),
        };
        if !BUDGET_PRESETS.contains(&preset) {
            return None;
        }
        let at_size = Self::new(name, routes, Duration::from_millis(10));
        let Some(rest) = preset
            .strip_prefix("budget-")
            .filter(|rest| *rest != "unlimited")
        else {
            return Some(at_size);
        };
        let (seats, queue) = match rest.strip_suffix("-queue") {
            Some(seats) => (seats, 50),
            None => (rest, 0),
        };
        Some(Self {
            max_inflight: Some(seats.parse().ok()?),
            queue,
            ..at_size
        })
    }

    /// Requests start-up needs when nothing is refused: one streaming list per
    /// secret, one rules review per namespace, the route list and watch.
    pub fn requests_needed(&self) -> u64 {
        self.secrets as u64 + self.namespaces_used() as u64 + 2
    }

    /// `latency` in whole milliseconds.
    pub fn latency_ms(&self) -> u64 {
        u64::try_from(self.latency.as_millis()).unwrap_or(u64::MAX)
    }

    /// Namespaces that hold at least one secret (secret `j` lives in namespace
    /// `j mod namespaces`).
    pub fn namespaces_used(&self) -> usize {
        self.namespaces.min(self.secrets)
    }

    /// Checks that the scenario can be generated.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |what: &str| Err(BenchError::Usage(format!("scenario {}: {what}", self.name)));
        if self.routes == 0 {
            return bad("needs at least one route");
        }
        if self.secrets == 0 || self.secrets > self.routes {
            return bad("secrets must be between 1 and the number of routes");
        }
        if self.namespaces == 0 {
            return bad("needs at least one namespace");
        }
        if self.max_inflight == Some(0) || self.max_concurrent_syncs == Some(0) {
            return bad("a concurrency limit of 0 would never serve a request");
        }
        Ok(())
    }

    /// What the product is held to in this scenario (benchmark targets, not test
    /// assertions).
    pub fn targets(&self) -> Targets {
        let secrets = self.secrets as u64;
        let two_round_trips = 2 * self.latency_ms();
        let ready_ms = if let Some(seats) = self.max_inflight {
            // The budget scenarios' bound: the requests needed at the server's sustained rate
            // (its seats per round trip), times 1.5, plus 2 round trips and 2 s.
            let per_request_ms = self.latency_ms().max(1) as f64 / seats as f64;
            let serving_ms = self.requests_needed() as f64 * per_request_ms;
            (serving_ms * 1.5).ceil() as u64 + two_round_trips + 2_000
        } else if self.secrets > 2_000 {
            two_round_trips + 2_000
        } else {
            two_round_trips + 1_000
        };
        let refused_fraction = self.max_inflight.map(|_| 0.25);
        // Under a budget each refusal the bound allows is one more request: the
        // first window beyond the server's seats is refused and sent again.
        let refused_allowed = refused_fraction.map_or(0, |fraction| {
            let needed = self.requests_needed();
            let first_window = self
                .max_concurrent_syncs
                .map_or(needed, |bound| bound as u64);
            (fraction * needed as f64).floor() as u64 + first_window
        });
        Targets {
            ready_ms,
            rss_bytes: (self.secrets >= 10_000).then_some(150 * 1024 * 1024),
            connections: secrets.div_ceil(100) + 2,
            requests: (2 * secrets + self.namespaces_used() as u64)
                .max(self.requests_needed() + refused_allowed),
            // A client bound that fits the server's seats and queue leaves nothing to
            // refuse: then retries must stay rare.
            retry_factor: self
                .max_inflight
                .zip(self.max_concurrent_syncs)
                .filter(|(seats, bound)| *bound <= seats + self.queue)
                .map(|_| 1.1),
            refused_fraction,
            errors: 0,
        }
    }
}

/// Upper bounds for the product in one scenario.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Targets {
    /// Start-up time: two API round trips plus 1 s (2 s beyond 2,000 secrets); under a
    /// concurrency limit, the budget's bound (see [`Scenario::targets`]).
    pub ready_ms: u64,
    /// Peak resident memory (stated for 10,000 secrets).
    pub rss_bytes: Option<u64>,
    /// Client connections: one HTTP/2 connection per 100 watches, plus 2.
    pub connections: u64,
    /// API requests at start-up: 2 per distinct secret plus 1 per namespace; under a
    /// concurrency limit at least the requests needed plus the refusals the bound
    /// allows (each refused request is sent again).
    pub requests: u64,
    /// Under a concurrency limit that the client's bound fits: total requests at most
    /// this factor times what the strategy needs (no retry storm).
    pub retry_factor: Option<f64>,
    /// Under a concurrency limit: requests answered 429 at most this fraction of the
    /// requests needed, plus the first window.
    #[serde(default)]
    pub refused_fraction: Option<f64>,
    /// Failed registrations and rejected routes.
    pub errors: u64,
}

/// Which strategy a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// The reference router's behaviour: routes one at a time, three access reviews
    /// and a GET per route, the registry lock held through each first sync.
    Serial,
    /// The product: the route pipeline with look-ahead over the shared monitor.
    Concurrent,
    /// The whole `certwatch run` daemon, cert directory writes included.
    Daemon,
    /// The daemon feeding a HAProxy it runs: ready on disk, ready served (handshakes),
    /// HAProxy's cold load, its own rate, and rotations to file and to served.
    Haproxy,
}

impl Strategy {
    /// `serial` or `concurrent`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serial => "serial",
            Self::Concurrent => "concurrent",
            Self::Daemon => "daemon",
            Self::Haproxy => "haproxy",
        }
    }
}

impl FromStr for Strategy {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s.trim() {
            "serial" => Ok(Self::Serial),
            "concurrent" => Ok(Self::Concurrent),
            "daemon" => Ok(Self::Daemon),
            "haproxy" => Ok(Self::Haproxy),
            other => Err(BenchError::Usage(format!(
                "unknown strategy {other:?} (expected serial, concurrent, daemon or haproxy)"
            ))),
        }
    }
}

/// One target and whether it was met.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Check {
    /// The bound.
    pub limit: f64,
    /// The measured value.
    pub value: f64,
    /// `value <= limit`.
    pub met: bool,
}

impl Check {
    /// `value` against `limit`.
    pub(crate) fn new(value: f64, limit: f64) -> Self {
        Self {
            limit,
            value,
            met: value <= limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_named_as_listed() {
        for name in PRESETS.into_iter().chain(BUDGET_PRESETS) {
            let scenario = Scenario::preset(name).unwrap();
            scenario.validate().unwrap();
            assert_eq!(scenario.name, name);
        }
        assert!(Scenario::preset("nope").is_err());
    }

    #[test]
    fn targets_follow_the_bounds() {
        let customer = Scenario::preset("customer-2000").unwrap().targets();
        assert_eq!(customer.ready_ms, 2 * 1_414 + 1_000);
        assert_eq!(customer.connections, 22);
        assert_eq!(customer.requests, 2 * 2_000 + 50);
        let scale_scenario = Scenario::preset("scale-10000").unwrap();
        assert_eq!(scale_scenario.namespaces, 100);
        let scale = scale_scenario.targets();
        assert_eq!(scale.ready_ms, 2 * 1_414 + 2_000);
        assert_eq!(scale.rss_bytes, Some(150 * 1024 * 1024));
        assert_eq!(scale.connections, 102);
        let apf = Scenario::preset("apf-2000").unwrap().targets();
        // 2,052 requests at 50 per 1.414 s, times 1.5, plus 2 round trips and 2 s.
        assert_eq!(apf.ready_ms, 87_046 + 2 * 1_414 + 2_000);
        assert_eq!(apf.retry_factor, Some(1.1));
        assert_eq!(apf.refused_fraction, Some(0.25));
        let four = Scenario::preset("budget-4").unwrap();
        assert_eq!(
            (four.max_inflight, four.queue, four.routes),
            (Some(4), 0, 300)
        );
        // 310 requests at 4 per 10 ms: 775 ms, times 1.5, plus 20 ms and 2 s.
        assert_eq!(four.targets().ready_ms, 1_163 + 20 + 2_000);
        assert_eq!(four.targets().retry_factor, None);
        // The 310 needed, plus the 77 + 310 refusals the bound allows (unbounded first
        // window), each sent again.
        assert_eq!(four.targets().requests, 310 + 77 + 310);
        let unlimited = Scenario::preset("budget-unlimited").unwrap().targets();
        assert_eq!(unlimited.ready_ms, 20 + 1_000);
        assert_eq!(unlimited.refused_fraction, None);
    }

    #[test]
    fn budgets_run_at_other_sizes_by_name() {
        let four = Scenario::preset("budget-4-queue@2000").unwrap();
        assert_eq!(
            (
                four.name.as_str(),
                four.max_inflight,
                four.queue,
                four.routes,
                four.secrets,
                four.namespaces
            ),
            ("budget-4-queue@2000", Some(4), 50, 2_000, 2_000, 50)
        );
        // 2,052 requests at 4 per 10 ms: 5,130 ms, times 1.5, plus 20 ms and 2 s.
        assert_eq!(four.targets().ready_ms, 7_695 + 20 + 2_000);
        let unlimited = Scenario::preset("budget-unlimited@10000").unwrap();
        assert_eq!((unlimited.max_inflight, unlimited.routes), (None, 10_000));
        for bad in [
            "budget-4@",
            "budget-4@0",
            "budget-7@2000",
            "budget-4@many",
            "seed-112@5",
        ] {
            assert!(Scenario::preset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_impossible_scenarios() {
        let mut s = Scenario::new("x", 10, Duration::ZERO);
        s.secrets = 11;
        assert!(s.validate().is_err());
        s.secrets = 10;
        s.max_inflight = Some(0);
        assert!(s.validate().is_err());
    }
}
