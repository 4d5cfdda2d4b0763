//! The hand-off to HAProxy: certwatch's certificates and crt-list reach a HAProxy,
//! started on complete files, then kept current through its runtime API.
//!
//! - [`controller`]: [`Haproxy`], the task that owns how HAProxy gets its state
//!   (start-up on the files, changes through the runtime API, reloads for what the
//!   runtime API cannot carry), and what `/readyz` learns from it: every route present
//!   at start-up served.
//! - [`process`]: HAProxy as certwatch's child in master-worker mode, and its master
//!   CLI (`reload`, `show proc`).
//! - [`runtime`]: the runtime API over one persistent connection, commands pipelined.
//! - [`certs`]: what one HAProxy process holds of certwatch's certificates, and the
//!   commands that change it, certificate by certificate.
//! - [`crt_list`]: what a crt-list line says (SNI filter, ALPN), as the OpenShift
//!   router writes it.
//! - [`metrics`]: the controller's metrics.
//!
//! Only certificates under the cert directory's `links/` are touched; anything else
//! in HAProxy (a default certificate, other lists, backends, servers, maps) is left to
//! its configuration and to other users of [`Haproxy::runtime`].

pub mod certs;
pub mod controller;
pub mod crt_list;
pub mod metrics;
pub mod process;
pub mod runtime;

pub use controller::{Haproxy, HaproxyMode, HaproxyOptions, HaproxyState, HaproxyStatus};
