//! kube-sim: an embedded Kubernetes API server simulator that speaks the real wire
//! protocol, so unmodified clients (kube-rs, kubectl, client-go) work against it.
//!
//! It serves core/v1 `namespaces` and `secrets`, route.openshift.io/v1 `routes` (with
//! the `status` subresource), rbac.authorization.k8s.io/v1 roles and bindings, and
//! authorization.k8s.io/v1 access reviews, with discovery good enough for kubectl
//! 1.27–1.33. Semantics follow kube-apiserver: one global resourceVersion, 409 on
//! stale updates and existing names, field and label selectors, pagination, watches
//! from a resourceVersion with a bounded history (410 Expired beyond it), bookmarks,
//! streaming lists (`sendInitialEvents`), `Status` errors, bearer-token users and RBAC
//! with `resourceNames` (a list or watch is allowed by `resourceNames` only with a
//! `metadata.name` field selector).
//!
//! HTTP/1.1 and HTTP/2 share one port (h2c with prior knowledge on plain TCP, ALPN
//! under TLS); HTTP/2 connections advertise at most 100 concurrent streams by default.
//! kubectl (client-go) sends bearer tokens only over TLS, so drive a simulator with
//! kubectl only when it was started with `tls: true`; kube-rs sends them either way.
//! kubectl 1.32+ sends protobuf bodies for objects it generates (`kubectl create
//! secret ...`); those are decoded for Secret, Namespace, RBAC and review kinds, and
//! every response is JSON.
//! Latency, a simple concurrency limit with a queue, API Priority and Fairness as
//! kube-apiserver applies it (429 + `Retry-After` beyond them), servers without
//! streaming lists, and faults can be set at start and changed while running,
//! in-process or through the admin API under `/sim/` (see [`admin`]). Every request is
//! counted ([`SimStats`], and `/metrics` in kube-apiserver's names) and logged
//! ([`RequestRecord`]). `kubectl apply` validates against the simulator as against
//! kube-apiserver: it serves the same OpenAPI documents and validates fields itself.
//!
//! # Map
//!
//! The modules stand in layers; each uses only those below it.
//!
//! ```text
//! simulator   Simulator: start, bootstrap, clients, handles, shutdown; cli: `certwatch-lab sim`
//!   │
//!   ├─ transport/   accept loop, TLS + ALPN, h2c sniffing, HTTP/1.1 and HTTP/2 serving
//!   │               (body: response bodies that hold in-flight slots; protobuf: request decoding)
//!   ├─ api/         the Kubernetes API: request pipeline and verb handlers (mod),
//!   │               request_info, discovery, openapi (+ openapi_v2: the protobuf v2 document),
//!   │               table (kubectl printing), watch_stream
//!   └─ admin        the /sim/ admin API
//!        │
//!      state        Shared: what every handler reads
//!        │
//!   ├─ auth/        users (bearer tokens), rbac (authorizer), review (access reviews)
//!   ├─ control/     faults; limits (simple) and flow_control (API Priority and Fairness),
//!   │               held together per request by admission; stats (counters, request log)
//!   │               and metrics (kube-apiserver's names)
//!   ├─ generator/   generate (routes, secrets, RBAC), certs, loadgen (HTTP/2 load)
//!   └─ storage/     store (objects, resourceVersions, history), watch (watcher index),
//!        │          handle (direct access)
//!      objects/     meta, schema (kube-apiserver's OpenAPI schemas), validation, patch, selectors
//!        │
//!      error, config, kubeconfig
//!        │
//!      resources    the served kinds and what the API knows about each
//! ```
//!
//! A request travels `transport` → `simulator`'s dispatch → `api` (authenticate,
//! count, API Priority and Fairness, the simple limit, delay, fault, authorize) →
//! `storage` → back out through `api::watch_stream` or a JSON body.
//!
//! How the simulator compares with a real kube-apiserver, and what was changed to make
//! it agree, is in `docs/SIMULATOR.md`.
//!
//! # Example
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::Secret;
//! use kube::api::{Api, ListParams};
//! use kube_sim::{GenerateSpec, SimConfig, Simulator};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let sim = Simulator::start(SimConfig::default()).await?;
//! let cluster = sim.generate(&GenerateSpec::new(100, 5))?;
//!
//! // The router identity may read exactly the secrets its routes name, one at a time.
//! let client = sim.client("router").await?;
//! let route = &cluster.routes[0];
//! let secrets: Api<Secret> = Api::namespaced(client, &route.namespace);
//! let one = secrets
//!     .list(&ListParams::default().fields(&format!("metadata.name={}", route.secret)))
//!     .await?;
//! assert_eq!(one.items.len(), 1);
//! assert!(secrets.list(&ListParams::default()).await.is_err()); // 403 without the selector
//!
//! println!("{}", serde_json::to_string(&sim.stats())?);
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod admin;
mod api;
mod auth;
pub mod cli;
mod config;
mod control;
mod error;
mod generator;
mod kubeconfig;
mod objects;
mod resources;
mod simulator;
mod state;
mod storage;
mod transport;

pub use api::discovery::SERVER_MINOR;
pub use api::watch_stream::INITIAL_EVENTS_END;
pub use auth::users::{ADMIN_USER, AUTHENTICATED_GROUP, MASTERS_GROUP, ROUTER_USER};
pub use config::{
    FlowControlConfig, LatencyConfig, LimitsConfig, ServerFeatures, SimConfig, SimUser,
};
pub use control::faults::{FailRule, FaultControl, FaultState, OutageMode};
pub use control::flow_control::{FlowControlStats, PriorityLevelStats, RejectedRequests};
pub use control::stats::{Protocol, ProtocolCounts, RequestRecord, SimStats};
pub use error::{ApiError, FieldError, FieldErrorKind, SimError};
pub use generator::generate::{
    GENERATED_LABEL, GenerateSpec, GeneratedCluster, GeneratedRoute, ROUTER_CLUSTER_ROLE,
    ROUTER_LEASES_ROLE, ROUTER_NAMESPACE, ROUTER_SECRETS_ROLE, ROUTER_SERVICE_ACCOUNT, SHARD_LABEL,
    router_leases_binding, router_leases_role,
};
pub use generator::loadgen;
pub use kube_common::labels::LabelSelector;
pub use kubeconfig::{ADMIN_CONTEXT, CLUSTER_NAME, ROUTER_CONTEXT};
pub use objects::selectors::{FieldSelector, FieldSelectorError};
pub use simulator::Simulator;
pub use storage::handle::{NamespaceArg, StoreHandle};
