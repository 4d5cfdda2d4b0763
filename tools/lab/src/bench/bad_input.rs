//! Bad input at scale, measured where the routes' files are:
//!
//! - **bad secrets** (`--bad-secrets N`): before the client starts, `N` of the
//!   scenario's secrets, spread evenly over them, are made invalid through the API (as
//!   the admin), in four ways in turn: a certificate that is not PEM, a PEM block cut
//!   before its end line, a key of another certificate, and an empty key. Every route
//!   of a good secret must still be admitted, every route of a bad one rejected, and
//!   start-up must not wait for them;
//! - **a CA re-issue** (`--reissue WINDOW`): once the client is ready, every secret is
//!   rewritten with a certificate of a new CA (its chain included), the writes spread
//!   evenly over `WINDOW` (100,000 secrets in a minute is a cluster's CA rotating). Each
//!   route is followed to its file, which must hold its new certificate: nothing may be
//!   lost, and certwatch's memory must stay bounded while the changes arrive faster than
//!   it can write them (it coalesces them: only the newest version of a secret counts).
//!
//! With the `haproxy` strategy both are also followed to HAProxy, by TLS handshakes
//! (SNI) as the rotation phases follow their changes:
//!
//! - every bad secret's routes must not present the certificate the secret held before
//!   it was made invalid, and the route of the next secret (a good one) must present
//!   its bundle's certificate;
//! - during a re-issue, a sample of the rewritten secrets (50 a second of the window, at
//!   most 1,000) is followed from its write to a handshake presenting its new leaf, with
//!   the probes' handshakes paced together as the rotation phases pace theirs; certwatch's
//!   backlog is read from its `/metrics` every second until it drained, and HAProxy's
//!   pushes (`set ssl cert` + `commit ssl cert`), reloads, resident set and CPU over the
//!   phase are reported beside certwatch's. A sampled route not served within a deadline
//!   derived from the routes and HAProxy's own rate counts as never served.
//!
//! Both run from the benchmark process with the simulator's admin client, so their own
//! cost is not certwatch's.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::BenchError;
use super::haproxy::{
    BACKLOG_SAMPLE, BacklogPeak, FILE_POLL, HANDSHAKE_POLL, HandshakePacer,
    PROBE_HANDSHAKES_PER_SECOND, PROBES_PER_SECOND, Percentiles, fetch_metrics, leaf_of_file,
    metric_seconds, poll_pause, presented,
};
use super::process_stats;

/// How long routes are followed after the last write of a re-issue before the ones
/// still without their new certificate count as lost.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(180);
/// The pause between two looks at the pending routes' files during a re-issue, per
/// pending route (a look costs a `stat` per route, and a read of the files replaced
/// since their secret's write), and its bounds: each latency is known within the
/// pause, and the benchmark's looks take at most a few percent of a core.
const FOLLOW_POLL_PER_ROUTE: Duration = Duration::from_micros(5);
const FOLLOW_POLL_MIN: Duration = Duration::from_millis(10);
const FOLLOW_POLL_MAX: Duration = Duration::from_millis(500);

fn follow_pause(pending: usize) -> Duration {
    (FOLLOW_POLL_PER_ROUTE * u32::try_from(pending).unwrap_or(u32::MAX))
        .clamp(FOLLOW_POLL_MIN, FOLLOW_POLL_MAX)
}
/// Re-issued secrets followed to a handshake at most. Each probe makes about ten
/// handshakes per tenfold of its wait (it looks again after a tenth of its wait), and a
/// re-issue at 100,000 routes waits minutes for HAProxy: 1,000 probes then ask about
/// 200 handshakes a second, under the pace of 400 shared by all of them, so that the
/// pacing adds little to what is measured and the handshakes little to HAProxy's work.
const REISSUE_PROBES_MAX: usize = 1_000;

/// Every how many rewritten secrets one is followed to a handshake: 50 a second of the
/// window (as the rotation phases follow theirs), at most `REISSUE_PROBES_MAX` in all.
fn probe_every(secrets: usize, window: Duration) -> usize {
    let by_rate = PROBES_PER_SECOND * window.as_secs_f64();
    let probes = (by_rate.floor() as usize).clamp(1, REISSUE_PROBES_MAX);
    secrets.div_ceil(probes).max(1)
}

/// How long sampled routes are followed to a handshake after the last write of a
/// re-issue: HAProxy takes the changes one at a time on one thread, so every route's
/// change takes `routes / own rate` after the writes at the least; twice that, plus one
/// cold load of all the files (certwatch reloads HAProxy instead of pushing when the
/// backlog would take longer than a load), plus the files' own deadline.
fn served_deadline(routes: usize, own_rate_per_s: f64, cold_load: Duration) -> Duration {
    // A rate not measured (or absurdly low) must not make the deadline endless.
    let rate = own_rate_per_s.max(50.0);
    FOLLOW_DEADLINE + Duration::from_secs_f64(2.0 * routes as f64 / rate) + cold_load
}

/// The sum of the values of `name`'s series whose labels contain `label` (all of them
/// when `label` is empty), in Prometheus' text format.
fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels.contains(label).then_some(())?;
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// How often certwatch's resident set is sampled during a re-issue.
const RSS_SAMPLE: Duration = Duration::from_millis(250);
/// Secret writes in flight at most during a re-issue (each waits for the
/// simulator's latency; more would only queue at the server).
const WRITES_IN_FLIGHT: usize = 512;

fn failed(message: impl Into<String>) -> BenchError {
    BenchError::Admin {
        path: "bad input".to_owned(),
        message: message.into(),
    }
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One secret of the scenario: where it is, and the routes that reference it.
#[derive(Clone, Debug)]
struct SecretOfRoutes {
    namespace: String,
    name: String,
    /// Indexes into the generated routes.
    routes: Vec<usize>,
}

/// The distinct secrets of `routes`, in the order their first route was created.
fn secrets_of(routes: &[kube_sim::GeneratedRoute]) -> Vec<SecretOfRoutes> {
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut secrets: Vec<SecretOfRoutes> = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let key = (route.namespace.as_str(), route.secret.as_str());
        let at = *index.entry(key).or_insert_with(|| {
            secrets.push(SecretOfRoutes {
                namespace: route.namespace.clone(),
                name: route.secret.clone(),
                routes: Vec::new(),
            });
            secrets.len() - 1
        });
        secrets[at].routes.push(i);
    }
    secrets
}

/// `count` positions spread evenly over `len` (the first at 0), without repeats.
fn spread(count: usize, len: usize) -> Vec<usize> {
    let count = count.min(len);
    (0..count).map(|i| i * len / count).collect()
}

/// The ways a secret is made invalid, in the order they are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Corruption {
    /// `tls.crt` holds text that is no PEM at all.
    NotPem,
    /// `tls.crt` holds a certificate block without its end line.
    TruncatedPem,
    /// `tls.key` holds the key of another certificate.
    ForeignKey,
    /// `tls.key` is empty.
    EmptyKey,
}

impl Corruption {
    const ALL: [Corruption; 4] = [
        Corruption::NotPem,
        Corruption::TruncatedPem,
        Corruption::ForeignKey,
        Corruption::EmptyKey,
    ];

    fn name(self) -> &'static str {
        match self {
            Corruption::NotPem => "not_pem",
            Corruption::TruncatedPem => "truncated_pem",
            Corruption::ForeignKey => "foreign_key",
            Corruption::EmptyKey => "empty_key",
        }
    }

    /// The secret's data key and its new (unencoded) value.
    fn data(self, foreign_key: &str) -> (&'static str, String) {
        match self {
            Corruption::NotPem => ("tls.crt", "this is not a certificate\n".to_owned()),
            Corruption::TruncatedPem => (
                "tls.crt",
                "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUYm9ndXMgY2VydGlmaWNhdGUgZm9y\n"
                    .to_owned(),
            ),
            Corruption::ForeignKey => ("tls.key", foreign_key.to_owned()),
            Corruption::EmptyKey => ("tls.key", String::new()),
        }
    }
}

/// What `--bad-secrets` did to the scenario.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BadSecrets {
    /// Secrets made invalid.
    pub secrets: usize,
    /// Routes that reference them: the client must reject exactly these.
    pub routes: usize,
    /// Secrets by the way they were made invalid.
    pub by_kind: BTreeMap<String, usize>,
    /// With the `haproxy` strategy: what handshakes showed for them once ready.
    #[serde(default)]
    pub served: Option<BadServed>,
    /// The routes to ask HAProxy about (the benchmark's own).
    #[serde(skip)]
    probes: Vec<BadProbe>,
}

/// A route of a bad secret, and a good route beside it, to ask HAProxy about.
#[derive(Clone, Debug)]
struct BadProbe {
    /// The bad route's host (its SNI).
    host: String,
    /// The first certificate the secret held before it was made invalid (`None` if it
    /// held none).
    before: Option<Vec<u8>>,
    /// The route of the next secret, if that one is good: its SNI and its bundle's
    /// path relative to the cert directory.
    good: Option<(String, String)>,
}

/// What HAProxy presented for the bad secrets' routes and their good neighbours.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BadServed {
    /// Routes of bad secrets asked.
    pub bad_routes_asked: usize,
    /// Of those, how many presented the certificate their secret held before it was
    /// made invalid (must be 0: the route is rejected, HAProxy must not serve it).
    pub bad_routes_presenting_their_certificate: usize,
    /// Of those, how many got no handshake at all (HAProxy presents its default
    /// certificate to an unknown SNI, so this counts failures to connect).
    pub bad_routes_without_handshake: usize,
    /// Good routes beside them asked.
    pub good_routes_asked: usize,
    /// Of those, how many presented their bundle's certificate (must be all).
    pub good_routes_served: usize,
}

/// Asks HAProxy on 127.0.0.1:`port` about every bad secret's route and the good route
/// beside it; `cert_dir` holds the good routes' bundles.
pub async fn check_served(port: u16, cert_dir: &Path, bad: &BadSecrets) -> BadServed {
    let mut served = BadServed::default();
    for probe in &bad.probes {
        served.bad_routes_asked += 1;
        match presented(port, &probe.host).await {
            None => served.bad_routes_without_handshake += 1,
            Some(leaf) => {
                if probe.before.as_ref() == Some(&leaf) {
                    served.bad_routes_presenting_their_certificate += 1;
                }
            }
        }
        if let Some((host, bundle)) = &probe.good {
            served.good_routes_asked += 1;
            let want = leaf_of_file(&cert_dir.join(bundle));
            if want.is_some() && presented(port, host).await == want {
                served.good_routes_served += 1;
            }
        }
    }
    served
}

/// Makes `count` of the scenario's secrets invalid (see the module documentation).
pub async fn corrupt(
    admin: &kube::Client,
    routes: &[kube_sim::GeneratedRoute],
    count: usize,
) -> Result<BadSecrets, BenchError> {
    let secrets = secrets_of(routes);
    if count > secrets.len() {
        return Err(BenchError::Usage(format!(
            "--bad-secrets {count}: the scenario has only {} secrets",
            secrets.len()
        )));
    }
    let foreign_key = rcgen::KeyPair::generate()
        .map_err(|e| failed(format!("generating a key: {e}")))?
        .serialize_pem();
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut bad = BadSecrets::default();
    let positions = spread(count, secrets.len());
    let bad_positions: std::collections::HashSet<usize> = positions.iter().copied().collect();
    for (n, position) in positions.into_iter().enumerate() {
        let secret = &secrets[position];
        let corruption = Corruption::ALL[n % Corruption::ALL.len()];
        let (key, value) = corruption.data(&foreign_key);
        let patch = serde_json::json!({ "data": { key: b64.encode(value) } });
        let api: Api<Secret> = Api::namespaced(admin.clone(), &secret.namespace);
        let before = api
            .get(&secret.name)
            .await
            .map_err(|e| {
                failed(format!(
                    "reading secret {}/{}: {e}",
                    secret.namespace, secret.name
                ))
            })?
            .data
            .and_then(|data| data.get("tls.crt").cloned())
            .and_then(|crt| String::from_utf8(crt.0).ok())
            .and_then(|text| certwatch::files::first_certificate_der(&text));
        let good = match secrets.get(position + 1) {
            Some(next) if !bad_positions.contains(&(position + 1)) => next
                .routes
                .first()
                .map(|&i| good_probe(&routes[i]))
                .transpose()?,
            _ => None,
        };
        for &i in &secret.routes {
            bad.probes.push(BadProbe {
                host: routes[i].host.clone(),
                before: before.clone(),
                good: good.clone(),
            });
        }
        api.patch(&secret.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                failed(format!(
                    "making secret {}/{} invalid ({}): {e}",
                    secret.namespace,
                    secret.name,
                    corruption.name()
                ))
            })?;
        bad.secrets += 1;
        bad.routes += secret.routes.len();
        *bad.by_kind.entry(corruption.name().to_owned()).or_default() += 1;
    }
    Ok(bad)
}

/// A good route's SNI and its bundle's name in the cert directory.
fn good_probe(route: &kube_sim::GeneratedRoute) -> Result<(String, String), BenchError> {
    let names = certwatch::files::bundle_names(&route_secrets::route::RouteKey::new(
        route.namespace.as_str(),
        route.route.as_str(),
    ))
    .map_err(|e| failed(e.to_string()))?;
    Ok((route.host.clone(), names.bundle))
}

/// What a CA re-issue measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReissueFigures {
    /// Secrets rewritten.
    pub secrets: usize,
    /// Routes followed to their files.
    pub routes: usize,
    /// The window the writes were spread over.
    pub window_ms: u64,
    /// From the first write to the last one sent.
    pub writing_ms: u64,
    /// Writes the API server refused.
    pub write_errors: usize,
    /// From a secret's write to its route's file holding the new certificate.
    pub to_file: Percentiles,
    /// From the first write until every followed route's file held its new
    /// certificate (`None` if some never did).
    pub all_on_disk_ms: Option<u64>,
    /// Routes whose file never held the new certificate within 180 s of the last write.
    pub never_on_disk: usize,
    /// certwatch's resident set at the start of the re-issue.
    pub rss_before_bytes: u64,
    /// The most it held during the re-issue (sampled every 250 ms).
    pub rss_max_bytes: u64,
    /// Its peak resident set (`VmHWM`, start-up included) after the re-issue.
    pub rss_peak_after_bytes: u64,
    /// Its CPU over the re-issue, from the first write to the last file.
    pub cpu_ms: Option<u64>,
    /// With the `haproxy` strategy: the re-issue followed to HAProxy.
    pub served: Option<ReissueServed>,
}

/// The HAProxy a re-issue is followed to.
#[derive(Clone, Debug)]
pub struct ServedTarget {
    /// Its TLS port on 127.0.0.1.
    pub tls_port: u16,
    /// certwatch's `/metrics` (the backlog and the pushes).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// HAProxy's master (its workers are its children) or, without one, its worker.
    pub haproxy_pid: Option<u32>,
    /// HAProxy's own `set ssl cert` + `commit ssl cert` per second, as measured before.
    pub own_rate_per_s: f64,
    /// HAProxy's own cold load of every file, in milliseconds.
    pub cold_load_ms: u64,
}

/// A re-issue as HAProxy served it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReissueServed {
    /// Routes followed to a handshake (one route of every `probe_every`-th secret
    /// written).
    pub probes: usize,
    /// From a sampled secret's write to a handshake for its route's SNI presenting its
    /// new leaf.
    pub to_served: Percentiles,
    /// Sampled routes never served by `follow_deadline_ms` after the last write.
    pub never_served: usize,
    /// How long sampled routes were followed after the last write at most (derived from
    /// the routes, HAProxy's own rate and its cold load).
    pub follow_deadline_ms: u64,
    /// From the first write until the last sampled route was served (`None` if some
    /// never were).
    pub all_sampled_served_ms: Option<u64>,
    /// TLS handshakes the probes made (paced to 400 a second together).
    pub probe_handshakes: usize,
    /// The most routes certwatch reported waiting for HAProxy
    /// (`certwatch_routes_admitted_not_served`).
    pub peak_unserved_routes: f64,
    /// The oldest unserved change it reported, at most, in seconds.
    pub peak_unserved_age_s: f64,
    /// From the first write to the first read of `/metrics`, after every file held its
    /// new certificate, that showed nothing waiting (`None` if none did by the deadline).
    pub drained_ms: Option<u64>,
    /// Reads of certwatch's `/metrics` for the backlog (one a second until it drained).
    pub backlog_scrapes: usize,
    /// Certificates certwatch pushed to HAProxy over the phase
    /// (`certwatch_haproxy_pushed_certificates_total`).
    pub pushed_certificates: u64,
    /// `set ssl cert` commands HAProxy accepted over the phase.
    pub set_ssl_cert: u64,
    /// `commit ssl cert` commands HAProxy accepted over the phase.
    pub commit_ssl_cert: u64,
    /// Runtime API commands that failed over the phase.
    pub command_errors: u64,
    /// HAProxy reloads certwatch made over the phase (a backlog longer than a load is
    /// loaded by a reload instead of pushed).
    pub reloads: u64,
    /// The changes: routes whose secret was rewritten (one write per secret). Pushes are
    /// coalesced when `pushed_certificates <= changes`.
    pub changes: usize,
    /// certwatch's CPU from the first write to the end of the phase (the last probe
    /// served and the backlog drained).
    pub certwatch_cpu_ms: Option<u64>,
    /// HAProxy's resident set (master and workers) at the start of the phase.
    pub haproxy_rss_before_bytes: u64,
    /// The most it held during the phase (sampled every 250 ms).
    pub haproxy_rss_max_bytes: u64,
    /// HAProxy's CPU (master and workers, a reload's new worker included) over the phase.
    pub haproxy_cpu_ms: u64,
    /// The phase, from the first write to its end.
    pub phase_ms: u64,
}

/// The new material of one secret.
struct Reissued {
    namespace: String,
    name: String,
    /// `tls.crt`: the leaf and the new CA.
    chain: String,
    /// The leaf's DER, as its routes' files must show it.
    leaf: Vec<u8>,
    routes: Vec<usize>,
}

/// A new CA, and a certificate of it for every secret (one key for all leaves: the
/// benchmark's cost, not certwatch's, is what would grow with a key each).
fn reissued_material(
    routes: &[kube_sim::GeneratedRoute],
) -> Result<(Vec<Reissued>, String), BenchError> {
    let rcgen_error = |e: rcgen::Error| failed(format!("generating the new CA's material: {e}"));
    let now = time::OffsetDateTime::now_utc();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "certwatch bench re-issued CA");
    ca_params.not_before = now - time::Duration::hours(1);
    ca_params.not_after = now + time::Duration::days(365);
    let ca_key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(rcgen_error)?;
    let ca_pem = ca.pem();
    let leaf_key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
    let mut material = Vec::new();
    for secret in secrets_of(routes) {
        let hosts: Vec<String> = secret
            .routes
            .iter()
            .map(|&i| routes[i].host.clone())
            .collect();
        let mut params = rcgen::CertificateParams::new(hosts.clone()).map_err(rcgen_error)?;
        params.not_before = now - time::Duration::hours(1);
        // Longer than certwatch's renewal warning, which would otherwise log each one.
        params.not_after = now + time::Duration::days(90);
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            hosts.first().cloned().unwrap_or_default(),
        );
        let leaf = params.signed_by(&leaf_key, &ca).map_err(rcgen_error)?;
        material.push(Reissued {
            namespace: secret.namespace,
            name: secret.name,
            chain: format!("{}{ca_pem}", leaf.pem()),
            leaf: leaf.der().to_vec(),
            routes: secret.routes,
        });
    }
    Ok((material, leaf_key.serialize_pem()))
}

/// A route being followed to its file.
struct Pending {
    bundle: PathBuf,
    /// The route's host (its SNI).
    host: String,
    leaf: Arc<Vec<u8>>,
    /// When its secret's write was sent (set once, by the writer).
    sent: OnceLock<(Instant, SystemTime)>,
}

/// What the follower saw.
struct Followed {
    /// Each route's latency from its write to its file, in milliseconds.
    on_disk: Vec<u64>,
    /// Routes never seen with their new certificate.
    never: usize,
    /// When the last one was seen, if every one was.
    all_seen: Option<Instant>,
}

/// Samples `pid`'s resident set until `stop`, keeping the largest.
fn sample_rss(pid: u32, stop: Arc<AtomicBool>, max: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            if let Some(rss) = process_stats::other_process_rss_bytes(pid) {
                max.fetch_max(rss, Ordering::Relaxed);
            }
            tokio::time::sleep(RSS_SAMPLE).await;
        }
    })
}

/// Whether the file at `path` was replaced at or after `since` and shows `leaf`.
fn shows(path: &Path, since: SystemTime, leaf: &[u8]) -> bool {
    let Ok(modified) = std::fs::metadata(path).and_then(|m| m.modified()) else {
        return false;
    };
    if modified < since {
        return false;
    }
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| certwatch::files::first_certificate_der(&text))
        .is_some_and(|der| der == leaf)
}

/// Follows every route of `pending` to its file, on a thread of its own (file system
/// calls block), until each shows its new certificate or `FOLLOW_DEADLINE` has passed
/// since `writes_done` was set.
fn follow_files(
    pending: Arc<Vec<Pending>>,
    writes_done: Arc<OnceLock<Instant>>,
    files_done: Arc<OnceLock<Instant>>,
) -> tokio::task::JoinHandle<Followed> {
    tokio::task::spawn_blocking(move || {
        let followed = follow_files_until_done(&pending, &writes_done);
        let _ = files_done.set(Instant::now());
        followed
    })
}

fn follow_files_until_done(pending: &[Pending], writes_done: &OnceLock<Instant>) -> Followed {
    {
        let mut remaining: Vec<usize> = (0..pending.len()).collect();
        let mut on_disk = Vec::with_capacity(pending.len());
        loop {
            remaining.retain(|&slot| {
                let route = &pending[slot];
                let Some(&(sent, sent_at)) = route.sent.get() else {
                    return true;
                };
                if shows(&route.bundle, sent_at, &route.leaf) {
                    on_disk.push(ms(sent.elapsed()));
                    false
                } else {
                    true
                }
            });
            if remaining.is_empty() {
                return Followed {
                    on_disk,
                    never: 0,
                    all_seen: Some(Instant::now()),
                };
            }
            if writes_done
                .get()
                .is_some_and(|done| done.elapsed() >= FOLLOW_DEADLINE)
            {
                return Followed {
                    on_disk,
                    never: remaining.len(),
                    all_seen: None,
                };
            }
            std::thread::sleep(follow_pause(remaining.len()));
        }
    }
}

/// Whether `follow` has passed since the last write (not before the writes are done).
fn past(writes_done: &OnceLock<Instant>, follow: Duration) -> bool {
    writes_done
        .get()
        .is_some_and(|done| done.elapsed() >= follow)
}

/// Follows one re-issued route to its file, then to a handshake for its SNI that
/// presents its new leaf (paced with the other probes'); the latency from its secret's
/// write and when it was served, or `None` if not within `follow` after the last write.
#[allow(clippy::too_many_arguments)]
async fn probe_served(
    port: u16,
    host: String,
    bundle: PathBuf,
    leaf: Arc<Vec<u8>>,
    (sent, sent_at): (Instant, SystemTime),
    writes_done: Arc<OnceLock<Instant>>,
    follow: Duration,
    pacer: Arc<HandshakePacer>,
) -> Option<(u64, Instant)> {
    // No handshake before the file: HAProxy cannot hold what certwatch has not written.
    while !shows(&bundle, sent_at, &leaf) {
        if past(&writes_done, follow) {
            return None;
        }
        tokio::time::sleep(poll_pause(sent.elapsed(), FILE_POLL)).await;
    }
    while !past(&writes_done, follow) {
        let slot = pacer.reserve(Instant::now());
        tokio::time::sleep_until(tokio::time::Instant::from_std(slot)).await;
        if presented(port, &host).await.as_deref() == Some(leaf.as_slice()) {
            return Some((ms(sent.elapsed()), Instant::now()));
        }
        tokio::time::sleep(poll_pause(sent.elapsed(), HANDSHAKE_POLL)).await;
    }
    None
}

/// HAProxy's processes now: `pid` and its children (a master's workers, old and new).
fn haproxy_processes(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    pids.extend(process_stats::children(pid));
    pids
}

/// HAProxy's resident set and CPU over a phase, sampled.
#[derive(Debug, Default)]
struct HaproxySampled {
    rss_before: u64,
    rss_max: u64,
    /// Each process's CPU at its first sample (0 for one started during the phase)
    /// and at its last, in milliseconds.
    cpu: HashMap<u32, (u64, u64)>,
}

impl HaproxySampled {
    /// Takes one sample of every process in; `first` for the sample at the start.
    fn sample(&mut self, pids: &[u32], first: bool) {
        let mut rss = 0;
        for &pid in pids {
            rss += process_stats::other_process_rss_bytes(pid).unwrap_or(0);
            if let Some(cpu) = process_stats::other_process_cpu_ms(pid) {
                self.record_cpu(pid, cpu, first);
            }
        }
        if first {
            self.rss_before = rss;
        }
        self.rss_max = self.rss_max.max(rss);
    }

    fn record_cpu(&mut self, pid: u32, cpu: u64, first: bool) {
        let entry = self
            .cpu
            .entry(pid)
            .or_insert((if first { cpu } else { 0 }, cpu));
        entry.1 = entry.1.max(cpu);
    }

    /// CPU over the phase: each process's last sample minus its first.
    fn cpu_ms(&self) -> u64 {
        self.cpu
            .values()
            .map(|(first, last)| last.saturating_sub(*first))
            .sum()
    }
}

/// Samples HAProxy's processes under `pid` until `stop`.
fn sample_haproxy(pid: u32, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<HaproxySampled> {
    tokio::spawn(async move {
        let mut sampled = HaproxySampled::default();
        sampled.sample(&haproxy_processes(pid), true);
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(RSS_SAMPLE).await;
            sampled.sample(&haproxy_processes(pid), false);
        }
        sampled
    })
}

/// certwatch's HAProxy counters at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct PushCounters {
    pushed: f64,
    set: f64,
    commit: f64,
    errors: f64,
    reloads: f64,
}

impl PushCounters {
    fn of(text: &str) -> Self {
        let commands = "certwatch_haproxy_commands_total";
        Self {
            pushed: metric_sum(text, "certwatch_haproxy_pushed_certificates_total", ""),
            set: metric_sum(text, commands, "command=\"set ssl cert\",result=\"ok\""),
            commit: metric_sum(text, commands, "command=\"commit ssl cert\",result=\"ok\""),
            errors: metric_sum(text, commands, "result=\"error\""),
            reloads: metric_sum(text, "certwatch_haproxy_reloads_total", ""),
        }
    }

    async fn read(addr: Option<std::net::SocketAddr>) -> Option<Self> {
        Some(Self::of(&fetch_metrics(addr?).await?))
    }
}

/// Reads certwatch's backlog every second during a re-issue (the pace of the rotation
/// phases while routes wait: a re-issue is changes from its first write to its drain,
/// and the quiet pace of 10 s would miss the backlog's rise and blur its drain), until
/// a read after every file was written shows nothing waiting (the moment it drained),
/// or `follow` after the last write.
async fn watch_reissue_backlog(
    addr: Option<std::net::SocketAddr>,
    writes_done: Arc<OnceLock<Instant>>,
    files_done: Arc<OnceLock<Instant>>,
    follow: Duration,
) -> (BacklogPeak, Option<Instant>) {
    let mut peak = BacklogPeak::default();
    let Some(addr) = addr else {
        return (peak, None);
    };
    loop {
        if let Some(text) = fetch_metrics(addr).await {
            peak.scrapes += 1;
            let routes = metric_seconds(&text, "certwatch_routes_admitted_not_served");
            peak.record(
                routes.unwrap_or(0.0),
                metric_seconds(&text, "certwatch_oldest_unserved_change_age_seconds")
                    .unwrap_or(0.0),
            );
            // Only once every change is in certwatch does nothing waiting mean drained.
            if files_done.get().is_some() && routes == Some(0.0) {
                return (peak, Some(Instant::now()));
            }
        }
        if past(&writes_done, follow) {
            return (peak, None);
        }
        tokio::time::sleep(BACKLOG_SAMPLE).await;
    }
}

/// Rewrites every secret of `routes` with a new CA's certificate over `window`, and
/// follows every route to its bundle in `cert_dir`. `client_pid` is certwatch's
/// process, for its memory and CPU; `served`, when given, the HAProxy it feeds, to
/// which a sample of the routes is followed too.
pub async fn reissue(
    admin: &kube::Client,
    routes: &[kube_sim::GeneratedRoute],
    cert_dir: &Path,
    window: Duration,
    client_pid: Option<u32>,
    served: Option<ServedTarget>,
) -> Result<ReissueFigures, BenchError> {
    let (material, key) = reissued_material(routes)?;
    let secret_count = material.len();
    let mut pending: Vec<Pending> = Vec::with_capacity(routes.len());
    // The slots in `pending` of each secret's routes, in `material`'s order.
    let mut slots: Vec<Vec<usize>> = Vec::with_capacity(material.len());
    for secret in &material {
        let leaf = Arc::new(secret.leaf.clone());
        let mut of_secret = Vec::with_capacity(secret.routes.len());
        for &i in &secret.routes {
            let route = &routes[i];
            let names = certwatch::files::bundle_names(&route_secrets::route::RouteKey::new(
                route.namespace.as_str(),
                route.route.as_str(),
            ))
            .map_err(|e| failed(e.to_string()))?;
            of_secret.push(pending.len());
            pending.push(Pending {
                bundle: cert_dir.join(names.bundle),
                host: route.host.clone(),
                leaf: Arc::clone(&leaf),
                sent: OnceLock::new(),
            });
        }
        slots.push(of_secret);
    }
    let pending = Arc::new(pending);
    let followed = pending.len();
    let follow_served = served.as_ref().map(|target| {
        served_deadline(
            followed,
            target.own_rate_per_s,
            Duration::from_millis(target.cold_load_ms),
        )
    });
    let every = probe_every(secret_count, window);
    let counters_before = match &served {
        Some(target) => PushCounters::read(target.metrics_addr).await,
        None => None,
    };
    let rss_before = client_pid
        .and_then(process_stats::other_process_rss_bytes)
        .unwrap_or(0);
    let cpu_before = client_pid.and_then(process_stats::other_process_cpu_ms);
    let stop = Arc::new(AtomicBool::new(false));
    let rss_max = Arc::new(AtomicU64::new(rss_before));
    let sampler = client_pid.map(|pid| sample_rss(pid, Arc::clone(&stop), Arc::clone(&rss_max)));
    let haproxy_sampler = served
        .as_ref()
        .and_then(|target| target.haproxy_pid)
        .map(|pid| sample_haproxy(pid, Arc::clone(&stop)));
    let writes_done = Arc::new(OnceLock::new());
    let files_done = Arc::new(OnceLock::new());
    let follower = follow_files(
        Arc::clone(&pending),
        Arc::clone(&writes_done),
        Arc::clone(&files_done),
    );
    let backlog = served.as_ref().zip(follow_served).map(|(target, follow)| {
        tokio::spawn(watch_reissue_backlog(
            target.metrics_addr,
            Arc::clone(&writes_done),
            Arc::clone(&files_done),
            follow,
        ))
    });
    let pacer = Arc::new(HandshakePacer::new(PROBE_HANDSHAKES_PER_SECOND));
    let mut probes = Vec::new();

    let b64 = base64::engine::general_purpose::STANDARD;
    let encoded_key = b64.encode(&key);
    let interval = window.div_f64(material.len().max(1) as f64);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(WRITES_IN_FLIGHT));
    let started = Instant::now();
    let mut writes = tokio::task::JoinSet::new();
    for (n, (secret, of_secret)) in material.into_iter().zip(slots).enumerate() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + interval.mul_f64(n as f64),
        ))
        .await;
        let permit = Arc::clone(&in_flight)
            .acquire_owned()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let now = (Instant::now(), SystemTime::now());
        for &slot in &of_secret {
            let _ = pending[slot].sent.set(now);
        }
        if let (Some(target), Some(follow), Some(&slot)) =
            (&served, follow_served, of_secret.first())
            && n % every == 0
        {
            let route = &pending[slot];
            probes.push(tokio::spawn(probe_served(
                target.tls_port,
                route.host.clone(),
                route.bundle.clone(),
                Arc::clone(&route.leaf),
                now,
                Arc::clone(&writes_done),
                follow,
                Arc::clone(&pacer),
            )));
        }
        let patch = serde_json::json!({
            "data": { "tls.crt": b64.encode(&secret.chain), "tls.key": encoded_key }
        });
        let api: Api<Secret> = Api::namespaced(admin.clone(), &secret.namespace);
        let name = secret.name;
        writes.spawn(async move {
            let written = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok();
            drop(permit);
            written
        });
    }
    let writing_ms = ms(started.elapsed());
    let mut write_errors = 0;
    while let Some(written) = writes.join_next().await {
        if !written.unwrap_or(false) {
            write_errors += 1;
        }
    }
    let _ = writes_done.set(Instant::now());
    let seen = follower
        .await
        .map_err(|e| failed(format!("following the files: {e}")))?;
    let cpu_after = client_pid.and_then(process_stats::other_process_cpu_ms);
    let served = match (served, follow_served, backlog) {
        (Some(target), Some(follow), Some(backlog)) => {
            let probed = probes.len();
            let mut to_served = Vec::with_capacity(probed);
            let mut last_served = None;
            for probe in probes {
                if let Ok(Some((latency, at))) = probe.await {
                    to_served.push(latency);
                    last_served = last_served.max(Some(at));
                }
            }
            let never_served = probed - to_served.len();
            let (peak, drained) = backlog.await.unwrap_or_default();
            let counters_after = PushCounters::read(target.metrics_addr).await;
            let ended = Instant::now();
            let certwatch_cpu_end = client_pid.and_then(process_stats::other_process_cpu_ms);
            stop.store(true, Ordering::Relaxed);
            let haproxy = match haproxy_sampler {
                Some(sampler) => sampler.await.unwrap_or_default(),
                None => HaproxySampled::default(),
            };
            let delta = |f: fn(&PushCounters) -> f64| {
                counters_before
                    .zip(counters_after)
                    .map_or(0, |(before, after)| {
                        (f(&after) - f(&before)).max(0.0) as u64
                    })
            };
            Some(ReissueServed {
                probes: probed,
                to_served: Percentiles::of(to_served),
                never_served,
                follow_deadline_ms: ms(follow),
                all_sampled_served_ms: (never_served == 0)
                    .then(|| last_served.map(|at| ms(at.duration_since(started))))
                    .flatten(),
                probe_handshakes: pacer.made(),
                peak_unserved_routes: peak.routes,
                peak_unserved_age_s: peak.age_s,
                drained_ms: drained.map(|at| ms(at.duration_since(started))),
                backlog_scrapes: peak.scrapes,
                pushed_certificates: delta(|c| c.pushed),
                set_ssl_cert: delta(|c| c.set),
                commit_ssl_cert: delta(|c| c.commit),
                command_errors: delta(|c| c.errors),
                reloads: delta(|c| c.reloads),
                changes: followed,
                certwatch_cpu_ms: cpu_before
                    .zip(certwatch_cpu_end)
                    .map(|(before, after)| after.saturating_sub(before)),
                haproxy_rss_before_bytes: haproxy.rss_before,
                haproxy_rss_max_bytes: haproxy.rss_max,
                haproxy_cpu_ms: haproxy.cpu_ms(),
                phase_ms: ms(ended.duration_since(started)),
            })
        }
        _ => None,
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(sampler) = sampler {
        let _ = sampler.await;
    }
    Ok(ReissueFigures {
        secrets: secret_count,
        routes: followed,
        window_ms: ms(window),
        writing_ms,
        write_errors,
        to_file: Percentiles::of(seen.on_disk),
        all_on_disk_ms: seen.all_seen.map(|at| ms(at.duration_since(started))),
        never_on_disk: seen.never,
        rss_before_bytes: rss_before,
        rss_max_bytes: rss_max.load(Ordering::Relaxed),
        rss_peak_after_bytes: client_pid
            .and_then(process_stats::other_process_peak_rss_bytes)
            .unwrap_or(0),
        cpu_ms: cpu_before
            .zip(cpu_after)
            .map(|(before, after)| after.saturating_sub(before)),
        served,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(namespace: &str, name: &str, secret: &str) -> kube_sim::GeneratedRoute {
        kube_sim::GeneratedRoute {
            namespace: namespace.to_owned(),
            route: name.to_owned(),
            secret: secret.to_owned(),
            host: format!("{name}.{namespace}.example"),
        }
    }

    #[test]
    fn secrets_are_distinct_by_namespace_and_name_with_their_routes() {
        let routes = vec![
            route("a", "r0", "s0"),
            route("a", "r1", "s1"),
            route("b", "r2", "s0"),
            route("a", "r3", "s0"),
        ];
        let secrets = secrets_of(&routes);
        let seen: Vec<(&str, &str, &[usize])> = secrets
            .iter()
            .map(|s| (s.namespace.as_str(), s.name.as_str(), s.routes.as_slice()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("a", "s0", &[0, 3][..]),
                ("a", "s1", &[1][..]),
                ("b", "s0", &[2][..])
            ]
        );
    }

    #[test]
    fn bad_secrets_are_spread_without_repeats() {
        assert_eq!(spread(4, 100), vec![0, 25, 50, 75]);
        assert_eq!(spread(3, 3), vec![0, 1, 2]);
        assert_eq!(spread(5, 2), vec![0, 1]);
        assert!(spread(0, 10).is_empty());
        let positions = spread(100, 100_000);
        let distinct: std::collections::HashSet<usize> = positions.iter().copied().collect();
        assert_eq!(distinct.len(), 100);
        assert!(positions.iter().all(|&p| p < 100_000));
    }

    #[test]
    fn every_corruption_is_used_in_turn_and_none_is_valid_material() {
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        for corruption in Corruption::ALL {
            let (data_key, value) = corruption.data(&key);
            match data_key {
                "tls.crt" => assert!(
                    certwatch::files::first_certificate_der(&value).is_none(),
                    "{corruption:?} still reads as a certificate"
                ),
                "tls.key" => assert!(value.is_empty() || value == key),
                other => panic!("unexpected data key {other}"),
            }
        }
    }

    #[test]
    fn a_reissue_is_probed_at_fifty_a_second_of_its_window_at_most_a_thousand() {
        // 10,000 secrets over 6 s: 300 probes, one secret in 34.
        assert_eq!(probe_every(10_000, Duration::from_secs(6)), 34);
        assert_eq!(10_000_usize.div_ceil(34), 295);
        // 100,000 over 60 s would be 3,000 probes: capped at 1,000, one in 100.
        assert_eq!(probe_every(100_000, Duration::from_secs(60)), 100);
        // Fewer secrets than probes: every one.
        assert_eq!(probe_every(20, Duration::from_secs(60)), 1);
        // A window too short for one probe at 50/s still probes one secret.
        assert_eq!(probe_every(10, Duration::from_millis(1)), 10);
        assert_eq!(probe_every(0, Duration::from_secs(6)), 1);
    }

    #[test]
    fn the_served_deadline_grows_with_the_routes_over_haproxys_rate() {
        let cold = Duration::from_secs(150);
        // 100,000 changes at 500/s take HAProxy 200 s: the deadline leaves twice that.
        assert_eq!(
            served_deadline(100_000, 500.0, cold),
            FOLLOW_DEADLINE + Duration::from_secs(400) + cold
        );
        assert!(served_deadline(100_000, 500.0, cold) > served_deadline(10_000, 500.0, cold));
        assert!(served_deadline(100_000, 300.0, cold) > served_deadline(100_000, 500.0, cold));
        // No rate measured: 50/s is assumed, not an endless deadline.
        assert_eq!(
            served_deadline(1_000, 0.0, Duration::ZERO),
            FOLLOW_DEADLINE + Duration::from_secs(40)
        );
    }

    #[test]
    fn counters_are_summed_over_the_series_whose_labels_match() {
        let text = "\
# HELP certwatch_haproxy_commands_total runtime API commands sent.
# TYPE certwatch_haproxy_commands_total counter
certwatch_haproxy_commands_total{command=\"set ssl cert\",result=\"ok\"} 120
certwatch_haproxy_commands_total{command=\"commit ssl cert\",result=\"ok\"} 118
certwatch_haproxy_commands_total{command=\"commit ssl cert\",result=\"error\"} 2
certwatch_haproxy_commands_total{command=\"show ssl cert\",result=\"error\"} 1
certwatch_haproxy_pushed_certificates_total 118
certwatch_haproxy_pushed_certificates_total_other 5
certwatch_haproxy_reloads_total{reason=\"start\",result=\"ok\"} 1
certwatch_haproxy_reloads_total{reason=\"backlog\",result=\"ok\"} 1
";
        let counters = PushCounters::of(text);
        assert_eq!(counters.set, 120.0);
        assert_eq!(counters.commit, 118.0);
        assert_eq!(counters.errors, 3.0);
        assert_eq!(counters.pushed, 118.0);
        assert_eq!(counters.reloads, 2.0);
        assert_eq!(metric_sum(text, "certwatch_missing_total", ""), 0.0);
    }

    #[test]
    fn haproxys_cpu_counts_a_new_worker_whole_and_the_others_from_the_start() {
        let mut sampled = HaproxySampled::default();
        // Master and worker at the start, with the start-up's CPU behind them.
        sampled.record_cpu(1, 500, true);
        sampled.record_cpu(2, 160_000, true);
        sampled.record_cpu(1, 510, false);
        sampled.record_cpu(2, 190_000, false);
        // A reload's new worker, first seen during the phase.
        sampled.record_cpu(3, 4_000, false);
        sampled.record_cpu(3, 9_000, false);
        // The old worker's CPU does not go down once it exits and is not seen again.
        sampled.record_cpu(2, 0, false);
        assert_eq!(sampled.cpu_ms(), 10 + 30_000 + 9_000);
    }

    #[test]
    fn the_reissued_chain_starts_with_the_leaf_its_routes_must_show() {
        let routes = vec![route("a", "r0", "s0"), route("a", "r1", "s0")];
        let (material, key) = reissued_material(&routes).unwrap();
        assert_eq!(material.len(), 1);
        assert_eq!(material[0].routes, vec![0, 1]);
        assert_eq!(
            certwatch::files::first_certificate_der(&material[0].chain).as_deref(),
            Some(material[0].leaf.as_slice())
        );
        assert_eq!(material[0].chain.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(key.contains("PRIVATE KEY"));
    }
}
