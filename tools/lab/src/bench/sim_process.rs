//! The simulator as a separate process (`certwatch-lab sim`), driven through its admin API,
//! so that nothing it does counts against the client's memory or CPU.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_common::duration::format as format_duration;
use kube_sim::{ADMIN_CONTEXT, SimStats};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::BenchError;
use super::scenario::Scenario;

/// How long the simulator may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Interval between polls of `/sim/stats` while waiting for a state.
const POLL: Duration = Duration::from_millis(100);
/// The environment variable jemalloc reads its options from at run time.
const MALLOC_CONF_VAR: &str = "_RJEM_MALLOC_CONF";
/// jemalloc's default decay (freed pages kept for 10 s) for the simulator process.
const SIMULATOR_MALLOC_CONF: &str = "dirty_decay_ms:10000,muzzy_decay_ms:10000";

/// What the generator created, as far as the benchmark needs it.
#[derive(Clone, Debug, Deserialize)]
pub struct Generated {
    /// Distinct secrets.
    pub secrets: usize,
    /// Namespace names.
    pub namespaces: Vec<String>,
    /// Every route, oldest first (the `haproxy` strategy rotates their secrets).
    #[serde(default)]
    pub routes: Vec<kube_sim::GeneratedRoute>,
}

/// A running `certwatch-lab sim` child process and an admin client for it.
pub struct SimProcess {
    child: Child,
    kubeconfig: PathBuf,
    admin: kube::Client,
    admin_pool: kube_h2::PoolHandle,
    /// Holds the kubeconfig; removed when the simulator is dropped.
    _dir: tempfile::TempDir,
}

impl SimProcess {
    /// Starts `exe sim` with the scenario's latency and limits, and waits until it
    /// listens.
    pub async fn start(exe: &Path, scenario: &Scenario, tls: bool) -> Result<Self, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("certwatch-bench-")
            .tempdir()
            .map_err(|source| BenchError::Io {
                what: "creating a temporary directory".to_owned(),
                source,
            })?;
        let kubeconfig = dir.path().join("kubeconfig");
        let mut command = Command::new(exe);
        command
            .arg("sim")
            .args(["--listen", "127.0.0.1:0"])
            .args(["--latency", &format_duration(scenario.latency)])
            .args(["--queue", &scenario.queue.to_string()])
            .arg("--write-kubeconfig")
            .arg(&kubeconfig);
        if tls {
            command.arg("--tls");
        }
        // The binary returns freed pages to the kernel at once (.cargo/config.toml), for
        // the daemon's peak resident set. The simulator's memory is not measured, and
        // returning its per-request buffers at once costs it page faults on the cores
        // the measured client shares: it keeps jemalloc's usual 10 s decay unless the
        // caller chose options.
        if std::env::var_os(MALLOC_CONF_VAR).is_none() {
            command.env(MALLOC_CONF_VAR, SIMULATOR_MALLOC_CONF);
        }
        if let Some(review) = scenario.review_latency {
            command.args([
                "--verb-latency",
                &format!("create={}", format_duration(review)),
            ]);
        }
        if let Some(limit) = scenario.max_inflight {
            command.args(["--max-inflight", &limit.to_string()]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BenchError::Io {
                what: format!("starting the simulator {}", exe.display()),
                source,
            })?;
        let stdout = child.stdout.take().ok_or_else(|| BenchError::Simulator {
            message: "its standard output is not available".to_owned(),
        })?;
        let mut lines = BufReader::new(stdout).lines();
        // The kubeconfig is written before the simulator says where it listens.
        let listening = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if line.starts_with("kube-sim listening on ") {
                    return Ok(true);
                }
            }
            Ok::<bool, std::io::Error>(false)
        })
        .await;
        match listening {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                let status = child.wait().await.ok();
                return Err(BenchError::Simulator {
                    message: format!("it exited before listening ({status:?})"),
                });
            }
            Ok(Err(source)) => {
                return Err(BenchError::Io {
                    what: "reading the simulator's output".to_owned(),
                    source,
                });
            }
            Err(_) => {
                return Err(BenchError::Simulator {
                    message: format!("it did not listen within {START_TIMEOUT:?}"),
                });
            }
        }
        // Keep draining its output so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let config = client_config(&kubeconfig, ADMIN_CONTEXT).await?;
        let pooled =
            kube_h2::build_client(config, kube_h2::ClientOptions::default()).map_err(|e| {
                BenchError::Simulator {
                    message: format!("cannot build an admin client: {e}"),
                }
            })?;
        let (admin, admin_pool) = pooled.into_parts();
        Ok(Self {
            child,
            kubeconfig,
            admin,
            admin_pool,
            _dir: dir,
        })
    }

    /// The benchmark's admin client of the simulator (its requests are counted apart
    /// from the client's: [`SimProcess::admin_connections_opened`]).
    pub fn admin_client(&self) -> kube::Client {
        self.admin.clone()
    }

    /// The kubeconfig the simulator wrote (contexts `router` and `admin`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// CPU time the simulator process has used so far, in milliseconds.
    pub fn cpu_ms(&self) -> Option<u64> {
        super::process_stats::other_process_cpu_ms(self.child.id()?)
    }

    /// The simulator process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn admin_request(
        &self,
        method: http::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<String, BenchError> {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| BenchError::Admin {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        self.admin
            .request_text(request)
            .await
            .map_err(|e| BenchError::Admin {
                path: path.to_owned(),
                message: e.to_string(),
            })
    }

    /// Generates routes, secrets, namespaces and the router's RBAC.
    pub async fn generate(&self, scenario: &Scenario) -> Result<Generated, BenchError> {
        let spec = json!({
            "routes": scenario.routes,
            "secrets": scenario.secrets,
            "namespaces": scenario.namespaces,
            "endpoints": scenario.endpoints,
        });
        let text = self
            .admin_request(
                http::Method::POST,
                "/sim/generate",
                spec.to_string().into_bytes(),
            )
            .await?;
        serde_json::from_str(&text).map_err(|e| BenchError::Admin {
            path: "/sim/generate".to_owned(),
            message: format!("unexpected answer: {e}"),
        })
    }

    /// The simulator's counters now.
    pub async fn stats(&self) -> Result<SimStats, BenchError> {
        let text = self
            .admin_request(http::Method::GET, "/sim/stats", Vec::new())
            .await?;
        serde_json::from_str(&text).map_err(|e| BenchError::Admin {
            path: "/sim/stats".to_owned(),
            message: format!("unexpected answer: {e}"),
        })
    }

    /// Zeroes the simulator's counters.
    pub async fn reset_stats(&self) -> Result<(), BenchError> {
        self.admin_request(http::Method::POST, "/sim/stats/reset", Vec::new())
            .await
            .map(drop)
    }

    /// Connections the admin client has opened so far (they show up in the
    /// simulator's connection counts and are subtracted from the client's).
    pub fn admin_connections_opened(&self) -> u64 {
        let stats = self.admin_pool.stats();
        stats.http2_connections_opened + stats.http1_connections_opened
    }

    /// Waits until no watch is open and nothing is in flight (the previous client has
    /// gone).
    pub async fn wait_idle(&self, timeout: Duration) -> Result<SimStats, BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.stats().await?;
            if stats.open_watches == 0 && stats.inflight == 0 {
                return Ok(stats);
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Simulator {
                    message: format!(
                        "still {} open watches and {} requests in flight after {timeout:?}",
                        stats.open_watches, stats.inflight
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until nothing is in flight and the number of open watches has stopped
    /// changing (the client's last watches are established), up to `timeout`; returns
    /// the counters then.
    pub async fn settle(&self, timeout: Duration) -> Result<SimStats, BenchError> {
        let deadline = Instant::now() + timeout;
        let mut previous: Option<SimStats> = None;
        loop {
            let stats = self.stats().await?;
            let stable = previous.as_ref().is_some_and(|p| {
                p.open_watches == stats.open_watches && p.requests_total == stats.requests_total
            });
            if (stable && stats.inflight == 0) || Instant::now() >= deadline {
                return Ok(stats);
            }
            previous = Some(stats);
            tokio::time::sleep(POLL * 2).await;
        }
    }

    /// Stops the simulator.
    pub async fn stop(self) {
        let Self {
            mut child, admin, ..
        } = self;
        // Close the admin connection first, so that its pool does not report the
        // simulator's exit as a lost connection.
        drop(admin);
        tokio::time::sleep(POLL).await;
        // The simulator keeps no state worth a graceful shutdown.
        let _ = child.kill().await;
    }
}

/// A kube client configuration for a context of the kubeconfig at `path`.
pub async fn client_config(path: &Path, context: &str) -> Result<kube::Config, BenchError> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| BenchError::Simulator {
        message: format!("cannot read its kubeconfig {}: {e}", path.display()),
    })?;
    kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &KubeConfigOptions {
            context: Some(context.to_owned()),
            ..KubeConfigOptions::default()
        },
    )
    .await
    .map_err(|e| BenchError::Simulator {
        message: format!("kubeconfig {} context {context:?}: {e}", path.display()),
    })
}
