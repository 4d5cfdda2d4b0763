//! The hand-off to HAProxy: certwatch's certificates and crt-list reach a HAProxy,
//! started on complete files, then kept current through its runtime API.
//!
//! - [`controller`]: [`Haproxy`], the task that owns how HAProxy gets its state
//!   (start-up on the files, changes through the runtime API, reloads for what the
//!   runtime API cannot carry), and what `/readyz` learns from it: every route present
//!   at start-up served.
//! - [`machine`]: the controller's bookkeeping and every decision (what to push,
//!   batch, defer, refuse, when to reload, what an answer means), as a pure state
//!   machine the controller drives.
//! - [`process`]: HAProxy as certwatch's child in master-worker mode, and its master
//!   CLI (`reload`, `show proc`).
//! - [`watchdog`]: how every HAProxy certwatch starts runs, so that none outlives
//!   certwatch (`SIGKILL` included) and none is left from an earlier run.
//! - [`runtime`]: the runtime API over one persistent connection, commands pipelined.
//! - [`certs`]: what one HAProxy process holds of certwatch's certificates, and the
//!   commands that change it, certificate by certificate.
//! - [`crt_list`]: what a crt-list line says (SNI filter, ALPN), as the OpenShift
//!   router writes it.
//! - its metrics are [`crate::metrics::haproxy`]'s.
//!
//! Only certificates under the cert directory's `links/` are touched; anything else
//! in HAProxy (a default certificate, other lists, backends, servers, maps) is left to
//! its configuration and to other users of [`Haproxy::runtime`].

pub mod certs;
pub mod controller;
pub mod crt_list;
pub mod machine;
pub mod process;
pub mod runtime;
pub mod watchdog;

pub use controller::{Haproxy, HaproxyHandle, HaproxyMode, HaproxyOptions};
pub use machine::{HaproxyState, HaproxyStatus};
