//! The parts of the crate that talk to the Kubernetes API server. Everything here
//! performs I/O (requests, watches, spawned tasks); everything outside `api` does not.
//!
//! - [`route_watch`]: which routes the router sees (namespaces, namespace and route
//!   selectors), as one stream of [`route_watch::RouteEvent`]s.
//! - [`access`]: whether the router identity may get, list and watch a secret (access
//!   reviews, cached and shared).
//! - [`manager`]: registrations on the per-secret watches of a
//!   [`TlsSecretMonitor`](manager::TlsSecretMonitor) (secrets cached as
//!   [`TlsSecret`](crate::tls::TlsSecret)s), and prefetching them.
//! - [`status_writer`]: records outcomes in `status.ingress[]` through the status
//!   subresource, in the background.
//! - [`pipeline`]: the shell around the pure route state machine: it performs what the
//!   machine decides (prefetch, access checks, registrations, outcomes, status) and feeds
//!   the results back.

pub mod access;
mod mailbox;
pub mod manager;
mod paced;
pub mod pipeline;
pub mod route_watch;
pub mod status_writer;
