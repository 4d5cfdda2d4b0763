//! The [`Simulator`]: binds the port, bootstraps the cluster every simulator starts
//! with, wires the store, authorizer, accounting and faults into the shared state,
//! starts the transport, and hands out clients, kubeconfigs and control handles.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin;
use crate::api;
use crate::auth::rbac::Authorizer;
use crate::auth::users::{
    ADMIN_USER, AUTHENTICATED_GROUP, MASTERS_GROUP, ROUTER_USER, UserInfo, Users,
};
use crate::config::{FlowControlConfig, LatencyConfig, LimitsConfig, ServerFeatures, SimConfig};
use crate::control::faults::{FaultControl, Faults};
use crate::control::flow_control::FlowControl;
use crate::control::limits::Limiter;
use crate::control::metrics::RequestMetrics;
use crate::control::stats::{Protocol, RequestLog, RequestRecord, SimStats, Stats};
use crate::error::SimError;
use crate::generator::certs;
use crate::generator::generate::{self, GenerateSpec, GeneratedCluster, ROUTER_NAMESPACE};
use crate::kubeconfig::{self, ADMIN_CONTEXT, ROUTER_CONTEXT};
use crate::resources;
use crate::state::Shared;
use crate::storage::handle::{self as store_handle, StoreHandle};
use crate::storage::store::{Store, WriteOptions};
use crate::transport::body::SimBody;
use crate::transport::{self, Handler, Transport};

/// Sends the admin API (`/sim`, `/sim/...`) to its handler and everything else to the
/// Kubernetes API.
#[derive(Clone)]
struct Dispatch(Arc<Shared>);

impl Handler for Dispatch {
    fn handle(
        &self,
        request: http::Request<hyper::body::Incoming>,
        protocol: Protocol,
    ) -> impl Future<Output = http::Response<SimBody>> + Send + use<> {
        let shared = self.0.clone();
        async move {
            let path = request.uri().path();
            if path == "/sim" || path.starts_with("/sim/") {
                admin::serve(shared, request).await
            } else {
                api::serve(shared, request, protocol).await
            }
        }
    }
}

/// Ends API Priority and Fairness's adjustment periods (re-dividing seats by recent
/// demand) until the simulator stops; idles while APF is off.
async fn adjust_flow_control(shared: Arc<Shared>) {
    loop {
        let control = shared.flow_control();
        let period = control
            .as_ref()
            .map_or(Duration::from_secs(1), |fc| fc.config().adjust_interval)
            .max(Duration::from_millis(10));
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        // Adjust the filter that was in force for the whole period, if it still is.
        if let (Some(before), Some(now)) = (control, shared.flow_control())
            && Arc::ptr_eq(&before, &now)
        {
            now.adjust();
        }
    }
}

/// Stops the server when the last [`Simulator`] clone is dropped.
struct ServerGuard {
    shared: Arc<Shared>,
    /// Guards the accept loop's task handle, taken by `shutdown`.
    accept_task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// A running simulator. Cheap to clone; the server stops on [`Simulator::shutdown`]
/// or when the last clone is dropped.
#[derive(Clone)]
pub struct Simulator {
    shared: Arc<Shared>,
    guard: Arc<ServerGuard>,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator")
            .field("url", &self.shared.url)
            .finish()
    }
}

fn random_token(prefix: &str) -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{hex}")
}

/// Objects every cluster has: system namespaces, the superuser, discovery and
/// self-review grants for all authenticated users, and the router's cluster-wide
/// role.
fn bootstrap(store: &Store) -> Result<(), SimError> {
    let opts = WriteOptions {
        auto_namespace: true,
        ..WriteOptions::default()
    };
    for ns in [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        ROUTER_NAMESPACE,
    ] {
        store.create(
            resources::NAMESPACES,
            json!({ "metadata": { "name": ns } }),
            opts,
        )?;
    }
    let cluster_role = |name: &str, rules: serde_json::Value| json!({ "metadata": { "name": name }, "rules": rules });
    let binding = |name: &str, role: &str, group: &str| {
        json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group }],
        })
    };
    let objects = [
        (
            resources::CLUSTER_ROLES,
            cluster_role(
                "cluster-admin",
                json!([
                    { "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"] },
                    { "nonResourceURLs": ["*"], "verbs": ["*"] },
                ]),
            ),
        ),
        (
            resources::CLUSTER_ROLE_BINDINGS,
            binding("cluster-admin", "cluster-admin", MASTERS_GROUP),
        ),
        (
            resources::CLUSTER_ROLES,
            cluster_role(
                "system:discovery",
                json!([{
                    "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                        "/readyz", "/openapi", "/openapi/*", "/version", "/version/"],
                    "verbs": ["get"],
                }]),
            ),
        ),
        (
            resources::CLUSTER_ROLE_BINDINGS,
            binding("system:discovery", "system:discovery", AUTHENTICATED_GROUP),
        ),
        (
            resources::CLUSTER_ROLES,
            cluster_role(
                "system:basic-user",
                json!([{
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    "verbs": ["create"],
                }]),
            ),
        ),
        (
            resources::CLUSTER_ROLE_BINDINGS,
            binding(
                "system:basic-user",
                "system:basic-user",
                AUTHENTICATED_GROUP,
            ),
        ),
        (resources::CLUSTER_ROLES, generate::router_cluster_role()),
        (
            resources::CLUSTER_ROLE_BINDINGS,
            generate::router_cluster_binding(),
        ),
    ];
    for (id, obj) in objects {
        store.create(id, obj, opts)?;
    }
    Ok(())
}

fn tls_names(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    names.extend(extra.iter().cloned());
    names.sort();
    names.dedup();
    names
}

fn url_for(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let ip = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => IpAddr::from([127, 0, 0, 1]),
        ip if ip.is_unspecified() => IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1]),
        ip => ip,
    };
    match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{}", addr.port()),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{}", addr.port()),
    }
}

impl Simulator {
    /// The router's service-account user name.
    pub const ROUTER_USER: &'static str = ROUTER_USER;
    /// The cluster admin's user name.
    pub const ADMIN_USER: &'static str = ADMIN_USER;

    /// Binds the listen address and starts serving.
    pub async fn start(config: SimConfig) -> Result<Simulator, SimError> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| SimError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Bind {
            addr: config.listen,
            source,
        })?;
        let tls = if config.tls {
            Some(certs::server_tls(&tls_names(
                addr,
                &config.tls_subject_alt_names,
            ))?)
        } else {
            None
        };
        let admin_token = config
            .admin_token
            .clone()
            .unwrap_or_else(|| random_token("admin"));
        let router_token = config
            .router_token
            .clone()
            .unwrap_or_else(|| random_token("router"));
        let mut users = vec![
            (
                admin_token.clone(),
                UserInfo {
                    name: ADMIN_USER.to_string(),
                    groups: vec![MASTERS_GROUP.to_string()],
                },
            ),
            (
                router_token.clone(),
                UserInfo {
                    name: ROUTER_USER.to_string(),
                    groups: vec![
                        "system:serviceaccounts".to_string(),
                        format!("system:serviceaccounts:{ROUTER_NAMESPACE}"),
                    ],
                },
            ),
        ];
        users.extend(config.users.iter().map(|u| {
            (
                u.token.clone(),
                UserInfo {
                    name: u.name.clone(),
                    groups: u.groups.clone(),
                },
            )
        }));
        let store = Store::new(config.history_limit, config.watch_buffer);
        bootstrap(&store)?;
        let shared = Arc::new(Shared {
            authorizer: Authorizer::new(store.clone()),
            store,
            users: Users::new(users),
            stats: Arc::new(Stats::default()),
            metrics: Arc::new(RequestMetrics::default()),
            log: RequestLog::new(config.request_log_limit),
            limiter: Limiter::new(config.limits.clone()),
            flow_control: RwLock::new(config.flow_control.clone().map(FlowControl::new)),
            latency: RwLock::new(config.latency.clone()),
            faults: Arc::new(Faults::new()),
            features: RwLock::new(config.features),
            rules_incomplete: AtomicBool::new(false),
            bookmark_interval: config.bookmark_interval,
            addr,
            url: url_for(addr, config.tls),
            ca_pem: tls.as_ref().map(|t| t.ca_pem.clone()),
            admin_token,
            router_token,
            runtime: tokio::runtime::Handle::current(),
            shutdown: CancellationToken::new(),
        });
        let transport = Arc::new(Transport {
            stats: shared.stats.clone(),
            faults: shared.faults.clone(),
            shutdown: shared.shutdown.clone(),
            max_concurrent_streams: config.max_concurrent_streams.max(1),
            tls: tls.map(|t| tokio_rustls::TlsAcceptor::from(t.config)),
            handler: Dispatch(shared.clone()),
        });
        let task = tokio::spawn(transport::accept_loop(transport, listener));
        tokio::spawn(adjust_flow_control(shared.clone()));
        tracing::info!(url = %shared.url, "kube-sim listening");
        Ok(Simulator {
            guard: Arc::new(ServerGuard {
                shared: shared.clone(),
                accept_task: Mutex::new(Some(task)),
            }),
            shared,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:PORT` or `https://...`.
    pub fn url(&self) -> String {
        self.shared.url.clone()
    }

    /// The serving CA's PEM, when started with TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.shared.ca_pem.clone()
    }

    /// The bearer token of a context's user (`"router"` or `"admin"`).
    pub fn token(&self, context: &str) -> Result<String, SimError> {
        match context {
            ROUTER_CONTEXT => Ok(self.shared.router_token.clone()),
            ADMIN_CONTEXT => Ok(self.shared.admin_token.clone()),
            other => Err(SimError::UnknownContext(other.to_string())),
        }
    }

    /// A kubeconfig with contexts `router` (current) and `admin`.
    pub fn kubeconfig(&self) -> Kubeconfig {
        match kubeconfig::build(
            &self.shared.url,
            self.shared.ca_pem.as_deref(),
            &self.shared.router_token,
            &self.shared.admin_token,
        ) {
            Ok(k) => k,
            Err(e) => {
                // The document is built from fixed keys and strings; this cannot
                // fail unless kube changes its schema.
                tracing::error!(error = %e, "building the kubeconfig failed");
                Kubeconfig::default()
            }
        }
    }

    /// Writes [`Simulator::kubeconfig`] as YAML (mode 0600).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), SimError> {
        let kc = kubeconfig::build(
            &self.shared.url,
            self.shared.ca_pem.as_deref(),
            &self.shared.router_token,
            &self.shared.admin_token,
        )?;
        kubeconfig::write(&kc, path)
    }

    /// A kube client configuration for `"router"` or `"admin"`.
    pub async fn client_config(&self, context: &str) -> Result<kube::Config, SimError> {
        if context != ROUTER_CONTEXT && context != ADMIN_CONTEXT {
            return Err(SimError::UnknownContext(context.to_string()));
        }
        let kc = kubeconfig::build(
            &self.shared.url,
            self.shared.ca_pem.as_deref(),
            &self.shared.router_token,
            &self.shared.admin_token,
        )?;
        kube::Config::from_custom_kubeconfig(
            kc,
            &KubeConfigOptions {
                context: Some(context.to_string()),
                ..KubeConfigOptions::default()
            },
        )
        .await
        .map_err(|e| SimError::Kubeconfig(e.to_string()))
    }

    /// kube's default client for `"router"` or `"admin"`.
    pub async fn client(&self, context: &str) -> Result<kube::Client, SimError> {
        Ok(kube::Client::try_from(self.client_config(context).await?)?)
    }

    /// Direct store access (see [`StoreHandle`]).
    pub fn store(&self) -> StoreHandle {
        StoreHandle {
            store: self.shared.store.clone(),
        }
    }

    /// Loads multi-document YAML/JSON manifests; returns the number of objects.
    pub fn load_manifests(&self, yaml_or_json: &str) -> Result<usize, SimError> {
        store_handle::load_manifests(&self.shared.store, yaml_or_json)
    }

    /// Generates routes, secrets, namespaces and router RBAC (see [`GenerateSpec`]).
    pub fn generate(&self, spec: &GenerateSpec) -> Result<GeneratedCluster, SimError> {
        generate::generate(&self.shared.store, spec)
    }

    /// Lets the router identity get/list/watch the named secrets in `namespace`
    /// (adds them to the `certwatch-router-secrets` Role there, creating it and its
    /// RoleBinding if needed).
    pub fn grant_router_secrets(&self, namespace: &str, names: &[&str]) -> Result<(), SimError> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        generate::grant_router_secrets(&self.shared.store, namespace, &names)
    }

    /// A snapshot of the counters (the same JSON as `GET /sim/stats`).
    pub fn stats(&self) -> SimStats {
        self.shared.stats_snapshot()
    }

    /// Zeroes counters and peaks; open watches and connections stay as they are.
    pub fn reset_stats(&self) {
        self.shared.reset_stats();
    }

    /// Watches terminated because they could not keep up with their events (their
    /// buffer of `SimConfig::watch_buffer` events was full), since start.
    pub fn slow_watchers_terminated(&self) -> u64 {
        self.shared.store.slow_watchers_terminated()
    }

    /// Recent requests, oldest first (bounded by `SimConfig::request_log_limit`).
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.shared.log.since(0)
    }

    /// Requests with a sequence number above `seq`.
    pub fn requests_since(&self, seq: u64) -> Vec<RequestRecord> {
        self.shared.log.since(seq)
    }

    /// Replaces the latency model.
    pub fn set_latency(&self, latency: LatencyConfig) {
        self.shared.set_latency(latency);
    }

    /// Replaces the simple concurrency limit.
    pub fn set_limits(&self, limits: LimitsConfig) {
        self.shared.limiter.set_config(limits);
    }

    /// Turns API Priority and Fairness on with `config`, or off with `None`.
    pub fn set_flow_control(&self, config: Option<FlowControlConfig>) {
        self.shared.set_flow_control(config);
    }

    /// What the server supports of streaming lists now.
    pub fn features(&self) -> ServerFeatures {
        self.shared.features()
    }

    /// Makes every later `SelfSubjectRulesReview` answer say `incomplete: true` (its
    /// rules unchanged), as an API server with a webhook authorizer answers; `false`
    /// (the default) makes them complete again.
    pub fn set_rules_incomplete(&self, incomplete: bool) {
        self.shared
            .rules_incomplete
            .store(incomplete, std::sync::atomic::Ordering::Relaxed);
    }

    /// Replaces the server's features (for example turns `WatchList` off mid-run).
    pub fn set_features(&self, features: ServerFeatures) {
        self.shared.set_features(features);
    }

    /// Fault injection.
    pub fn faults(&self) -> FaultControl {
        self.shared.faults_handle()
    }

    /// Stops accepting, closes every connection and watch, and waits for the accept
    /// loop to end.
    pub async fn shutdown(self) {
        self.shared.shutdown.cancel();
        self.faults().close_all_watches();
        let task = kube_common::sync::lock(&self.guard.accept_task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}
