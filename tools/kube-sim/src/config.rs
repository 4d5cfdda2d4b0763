//! Simulator configuration: listen address, transport, latency, concurrency limits,
//! history size and users. Every knob that can change at run time has its own type
//! ([`LatencyConfig`], [`LimitsConfig`]) so the admin API can replace it whole.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kube_common::Verb;
use serde::{Deserialize, Serialize};

use kube_common::duration::{format as format_duration, parse as parse_duration};

/// Everything [`crate::Simulator::start`] needs. `SimConfig::default()` is a plain-HTTP
/// simulator on an ephemeral loopback port with no latency and no concurrency limit.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address to listen on (default `127.0.0.1:0`: an ephemeral loopback port).
    pub listen: SocketAddr,
    /// Serve TLS (ALPN `h2` and `http/1.1`) with a freshly generated CA instead of
    /// plain HTTP (h1 and h2c with prior knowledge).
    pub tls: bool,
    /// Server-side latency model.
    pub latency: LatencyConfig,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` advertised on every HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// A simple concurrency limit and queue (429 beyond it).
    pub limits: LimitsConfig,
    /// API Priority and Fairness (`None`: off, the default, so that only `limits`
    /// applies). kube-apiserver has it on, with 400 + 200 seats.
    pub flow_control: Option<FlowControlConfig>,
    /// Number of events kept in the watch history. Older resource versions get 410.
    pub history_limit: usize,
    /// Interval between periodic BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Events buffered per watcher before the watcher is considered too slow and its
    /// watch is terminated (as kube-apiserver does), so memory stays bounded.
    pub watch_buffer: usize,
    /// Number of recent requests kept in the request log.
    pub request_log_limit: usize,
    /// Bearer token of the `admin` user (random when `None`).
    pub admin_token: Option<String>,
    /// Bearer token of the router service account (random when `None`).
    pub router_token: Option<String>,
    /// Additional users beyond `admin` and the router.
    pub users: Vec<SimUser>,
    /// Extra DNS names or IP addresses for the generated server certificate (TLS only);
    /// `localhost`, `127.0.0.1`, `::1` and the listen IP are always included.
    pub tls_subject_alt_names: Vec<String>,
    /// What the modelled server supports of streaming lists.
    pub features: ServerFeatures,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            latency: LatencyConfig::default(),
            max_concurrent_streams: 100,
            limits: LimitsConfig::default(),
            flow_control: None,
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(60),
            watch_buffer: 1_000,
            request_log_limit: 200_000,
            admin_token: None,
            router_token: None,
            users: Vec::new(),
            tls_subject_alt_names: Vec::new(),
            features: ServerFeatures::default(),
        }
    }
}

/// Server capabilities that real clusters differ in, and that clients must cope with.
/// The default is a current server (kube-apiserver 1.32+ on etcd 3.6): everything on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerFeatures {
    /// The `WatchList` feature gate. Off (`--feature-gates=WatchList=false`, as on
    /// older clusters), a watch with `sendInitialEvents` is refused with 422 Invalid.
    pub watch_list: bool,
    /// Whether the storage offers `RequestWatchProgress` (etcd 3.4 does not). Without
    /// it, a streaming list (`sendInitialEvents=true` with bookmarks) is answered 200
    /// with a single ERROR event carrying a 500 `Status`, and ends.
    pub watch_progress: bool,
}

impl Default for ServerFeatures {
    fn default() -> Self {
        ServerFeatures {
            watch_list: true,
            watch_progress: true,
        }
    }
}

/// A bearer-token user known to the simulator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimUser {
    /// The bearer token that authenticates this user.
    pub token: String,
    /// The user name RBAC subjects refer to.
    pub name: String,
    /// Groups the user belongs to (`system:authenticated` is always added).
    #[serde(default)]
    pub groups: Vec<String>,
}

/// Server-side latency: how long a request is held in flight before it is answered
/// (for a watch: before its response headers are sent).
///
/// The delay for a verb is `per_verb[verb]` if present, else `default`, shifted by a
/// uniformly random amount in `[-jitter, +jitter]` and clamped at zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencyConfig {
    /// Delay for verbs without their own entry.
    #[serde(with = "duration_serde")]
    pub default: Duration,
    /// Maximum random deviation from the base delay, in either direction.
    #[serde(with = "duration_serde")]
    pub jitter: Duration,
    /// Per-verb delays (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`).
    #[serde(with = "duration_map_serde")]
    pub per_verb: BTreeMap<Verb, Duration>,
}

impl LatencyConfig {
    /// The same fixed delay for every verb, without jitter.
    pub fn fixed(delay: Duration) -> Self {
        LatencyConfig {
            default: delay,
            ..LatencyConfig::default()
        }
    }

    /// The delay to apply to one request of `verb` (`None`: a request no verb names,
    /// which gets the default), with jitter drawn at random.
    pub fn sample(&self, verb: impl Into<Option<Verb>>) -> Duration {
        let base = verb
            .into()
            .and_then(|verb| self.per_verb.get(&verb).copied())
            .unwrap_or(self.default);
        if self.jitter.is_zero() {
            return base;
        }
        let jitter = self.jitter.as_nanos().min(u64::MAX as u128) as i128;
        let offset = rand::random_range(-jitter..=jitter);
        let nanos = (base.as_nanos() as i128 + offset).max(0);
        Duration::from_nanos(nanos.min(u64::MAX as i128) as u64)
    }
}

/// The server's concurrency limit: at most `max_inflight` requests in flight, up to
/// `queue_len` more waiting in FIFO order, everything beyond answered with 429 and a
/// `Retry-After` header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LimitsConfig {
    /// Maximum concurrent in-flight requests (`None`: unlimited).
    pub max_inflight: Option<usize>,
    /// Maximum number of requests waiting for a slot.
    pub queue_len: usize,
    /// The `Retry-After` value sent with 429 responses (rounded up to whole seconds).
    #[serde(with = "duration_serde")]
    pub retry_after: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_inflight: None,
            queue_len: 50,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// The server's concurrency budget and APF's timing, as kube-apiserver's flags set it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowControlConfig {
    /// `--max-requests-inflight` (default 400).
    pub max_requests_inflight: u32,
    /// `--max-mutating-requests-inflight` (default 200). With APF on, the two only add
    /// up to the server's concurrency limit; reads and writes share it.
    pub max_mutating_requests_inflight: u32,
    /// How long a request may wait in a queue before it is refused with reason
    /// `time-out` (kube-apiserver: a quarter of the 60 s request timeout).
    #[serde(with = "duration_serde")]
    pub queue_wait_limit: Duration,
    /// How often the levels' current limits are re-divided by recent demand
    /// (kube-apiserver: 10 s).
    #[serde(with = "duration_serde")]
    pub adjust_interval: Duration,
}

impl Default for FlowControlConfig {
    fn default() -> Self {
        FlowControlConfig {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            queue_wait_limit: Duration::from_secs(15),
            adjust_interval: Duration::from_secs(10),
        }
    }
}

impl FlowControlConfig {
    /// The server's concurrency limit: the seats all priority levels share.
    pub fn server_concurrency_limit(&self) -> u32 {
        self.max_requests_inflight
            .saturating_add(self.max_mutating_requests_inflight)
            .max(1)
    }
}

/// Serde for a [`Duration`] as a duration string (`"1400ms"`, `"1m30s"`) or a JSON
/// number of milliseconds (the admin API's shorthand).
pub mod duration_serde {
    use super::*;
    use serde::{Deserializer, Serializer, de::Error as _};

    /// Serializes as a string such as `"1400ms"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Text(String),
        Millis(f64),
    }

    /// Deserializes from a string (`"1.4s"`) or a number of milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Text(t) => parse_duration(&t).map_err(D::Error::custom),
            Repr::Millis(ms) if ms.is_finite() && ms >= 0.0 => {
                Ok(Duration::from_secs_f64(ms / 1000.0))
            }
            Repr::Millis(_) => Err(D::Error::custom("duration must be a non-negative number")),
        }
    }
}

mod duration_map_serde {
    use super::*;
    use serde::{Deserializer, Serializer, ser::SerializeMap};

    pub fn serialize<S: Serializer>(m: &BTreeMap<Verb, Duration>, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(m.len()))?;
        for (k, v) in m {
            map.serialize_entry(k, &format_duration(*v))?;
        }
        map.end()
    }

    #[derive(Deserialize)]
    struct Wrapper(#[serde(with = "duration_serde")] Duration);

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<Verb, Duration>, D::Error> {
        let raw = BTreeMap::<Verb, Wrapper>::deserialize(d)?;
        Ok(raw.into_iter().map(|(k, v)| (k, v.0)).collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn latency_config_json_accepts_strings_and_numbers() {
        let cfg: LatencyConfig =
            serde_json::from_str(r#"{"default":"1.4s","jitter":100,"per_verb":{"list":"2s"}}"#)
                .unwrap();
        assert_eq!(cfg.default, Duration::from_millis(1400));
        assert_eq!(cfg.jitter, Duration::from_millis(100));
        assert_eq!(cfg.per_verb[&Verb::List], Duration::from_secs(2));
        let back: LatencyConfig =
            serde_json::from_value(serde_json::to_value(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let cfg = LatencyConfig {
            default: Duration::from_millis(100),
            jitter: Duration::from_millis(50),
            per_verb: BTreeMap::new(),
        };
        for _ in 0..200 {
            let d = cfg.sample(Verb::Get);
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(150));
        }
    }
}
