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
use super::haproxy::Percentiles;
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
    for (n, position) in spread(count, secrets.len()).into_iter().enumerate() {
        let secret = &secrets[position];
        let corruption = Corruption::ALL[n % Corruption::ALL.len()];
        let (key, value) = corruption.data(&foreign_key);
        let patch = serde_json::json!({ "data": { key: b64.encode(value) } });
        let api: Api<Secret> = Api::namespaced(admin.clone(), &secret.namespace);
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
) -> tokio::task::JoinHandle<Followed> {
    tokio::task::spawn_blocking(move || {
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
    })
}

/// Rewrites every secret of `routes` with a new CA's certificate over `window`, and
/// follows every route to its bundle in `cert_dir`. `client_pid` is certwatch's
/// process, for its memory and CPU.
pub async fn reissue(
    admin: &kube::Client,
    routes: &[kube_sim::GeneratedRoute],
    cert_dir: &Path,
    window: Duration,
    client_pid: Option<u32>,
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
                leaf: Arc::clone(&leaf),
                sent: OnceLock::new(),
            });
        }
        slots.push(of_secret);
    }
    let pending = Arc::new(pending);
    let followed = pending.len();
    let rss_before = client_pid
        .and_then(process_stats::other_process_rss_bytes)
        .unwrap_or(0);
    let cpu_before = client_pid.and_then(process_stats::other_process_cpu_ms);
    let stop = Arc::new(AtomicBool::new(false));
    let rss_max = Arc::new(AtomicU64::new(rss_before));
    let sampler = client_pid.map(|pid| sample_rss(pid, Arc::clone(&stop), Arc::clone(&rss_max)));
    let writes_done = Arc::new(OnceLock::new());
    let follower = follow_files(Arc::clone(&pending), Arc::clone(&writes_done));

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
        for slot in of_secret {
            let _ = pending[slot].sent.set(now);
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
