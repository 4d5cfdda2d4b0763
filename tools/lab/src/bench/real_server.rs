//! A real kube-apiserver + etcd (the shared tool, through testenv) as the benchmark's
//! server, in place of the simulator: a fresh control plane per scenario, populated
//! with the very objects kube-sim generates for it, and the router's requests counted
//! from the server's audit log (exact: the user of every request is known, so the
//! benchmark's own setup never counts).
//!
//! What a real server does not offer: injected latency (its latency is its own, a few
//! milliseconds on loopback), a peak of requests in flight, and a count of accepted
//! connections (the client's own pool count stays the figure).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use kube_sim::{GenerateSpec, SimStats};
use testenv::{AuditLog, ControlPlane, ControlPlaneOptions, Installer, ROUTER_USER};

use super::BenchError;
use super::scenario::Scenario;
use super::sim_process::Generated;

/// Interval between reads of the audit log while waiting for a state.
const POLL: Duration = Duration::from_millis(500);

/// A control plane started for one scenario.
pub struct RealServer {
    control_plane: ControlPlane,
    /// Audit ids of the requests made before the last reset (not counted).
    before_reset: HashSet<String>,
}

fn server_error(message: impl std::fmt::Display) -> BenchError {
    BenchError::Simulator {
        message: format!("real control plane: {message}"),
    }
}

impl RealServer {
    /// Starts a control plane for `scenario`: its concurrency limit, if any, becomes
    /// the server's (`--max-requests-inflight`, with half of it for mutations), and
    /// `extra_flags` are added.
    pub async fn start(scenario: &Scenario, extra_flags: &[String]) -> Result<Self, BenchError> {
        let mut options = ControlPlaneOptions::from_env();
        if let Some(limit) = scenario.max_inflight {
            options = options
                .apiserver_flag(format!("--max-requests-inflight={limit}"))
                .apiserver_flag(format!(
                    "--max-mutating-requests-inflight={}",
                    (limit / 2).max(1)
                ));
        }
        for flag in extra_flags {
            options = options.apiserver_flag(flag.clone());
        }
        let control_plane = ControlPlane::start_with(options)
            .await
            .map_err(server_error)?;
        Ok(Self {
            control_plane,
            before_reset: HashSet::new(),
        })
    }

    /// Creates the scenario's routes, secrets, namespaces and the router's RBAC.
    pub async fn generate(&self, scenario: &Scenario) -> Result<Generated, BenchError> {
        let admin = self
            .control_plane
            .admin_client()
            .await
            .map_err(server_error)?;
        let spec = GenerateSpec {
            secrets: Some(scenario.secrets),
            ..GenerateSpec::new(scenario.routes, scenario.namespaces)
        };
        let cluster = Installer::new(admin)
            .generate(&spec)
            .await
            .map_err(server_error)?;
        Ok(Generated {
            secrets: cluster.secrets,
            namespaces: cluster.namespaces,
            routes: cluster.routes,
        })
    }

    /// The kubeconfig (contexts `router` and `admin`).
    pub fn kubeconfig(&self) -> &Path {
        self.control_plane.kubeconfig_path()
    }

    /// The kube-apiserver's process id.
    pub fn pid(&self) -> u32 {
        self.control_plane.pids()[0]
    }

    /// CPU time kube-apiserver has used so far, in milliseconds.
    pub fn cpu_ms(&self) -> Option<u64> {
        super::process_stats::other_process_cpu_ms(self.pid())
    }

    fn audit(&self) -> Result<AuditLog, BenchError> {
        self.control_plane.audit().map_err(server_error)
    }

    /// Waits until none of the router's watches is open (the previous client is gone).
    pub async fn wait_idle(&self, timeout: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let open = self
                .audit()?
                .of_user(ROUTER_USER)
                .filter(|request| request.stage == "ResponseStarted")
                .count();
            if open == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(server_error(format!(
                    "still {open} open watches of the router after {timeout:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Counts from now on only.
    pub fn reset_stats(&mut self) -> Result<(), BenchError> {
        self.before_reset = self
            .audit()?
            .requests()
            .iter()
            .map(|request| request.audit_id.clone())
            .collect();
        Ok(())
    }

    /// Waits until the router's request count has not changed for one poll (its last
    /// watches are established), up to `timeout`; returns the counts since the reset.
    pub async fn settle(&self, timeout: Duration) -> Result<SimStats, BenchError> {
        let deadline = Instant::now() + timeout;
        let mut previous: Option<SimStats> = None;
        loop {
            let stats = self.stats()?;
            let stable = previous.as_ref().is_some_and(|p| {
                p.requests_total == stats.requests_total && p.open_watches == stats.open_watches
            });
            if stable || Instant::now() >= deadline {
                return Ok(stats);
            }
            previous = Some(stats);
            tokio::time::sleep(POLL).await;
        }
    }

    /// The router's requests since the reset, in the simulator's terms.
    fn stats(&self) -> Result<SimStats, BenchError> {
        let audit = self.audit()?;
        let mut stats = SimStats::default();
        for request in audit
            .of_user(ROUTER_USER)
            .filter(|request| !self.before_reset.contains(&request.audit_id))
        {
            let resource = match (&request.resource, &request.subresource) {
                (Some(resource), Some(sub)) => format!("{resource}/{sub}"),
                (Some(resource), None) => resource.clone(),
                (None, _) => request
                    .request_uri
                    .split('?')
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            };
            *stats
                .requests
                .entry(request.verb.clone())
                .or_insert_with(BTreeMap::new)
                .entry(resource.clone())
                .or_insert(0) += 1;
            stats.requests_total += 1;
            let code = request.code.unwrap_or(0);
            *stats.responses.entry(code.to_string()).or_insert(0) += 1;
            if code == 429 {
                stats.rejected_429 += 1;
            }
            if request.verb == "watch" && code == 200 {
                stats.watches_started += 1;
                if request.stage == "ResponseStarted" {
                    stats.open_watches += 1;
                    *stats.open_watches_by_resource.entry(resource).or_insert(0) += 1;
                }
            }
        }
        Ok(stats)
    }
}
