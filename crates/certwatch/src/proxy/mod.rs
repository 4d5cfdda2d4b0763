//! The proxy seam: what the outputs tell a proxy, and what a proxy tells them back.
//!
//! [`crate::outputs::Outputs`] keeps the cert directory, the metrics and readiness, and
//! fans out to a list of [`Proxy`]s; it names no proxy. Per flush of the cert
//! directory each proxy is told, in order:
//!
//! - the routes decided since the last flush ([`RouteDecision`]: served with their
//!   routing, or gone), for a proxy that routes ([`Proxy::routes`]); told only once the
//!   files a route's certificate lives in are on disk;
//! - the certificates whose served bundle changed ([`CrtChange`]: the bundle's path,
//!   its material and digest), and whether this is the first complete listing;
//!   before it, the lines of the routes decided so far ([`Flushed::decided`]), which a
//!   running proxy may add but must not remove or replace anything for.
//!
//! then, once, that start-up is decided ([`Proxy::decided`]). A proxy reports back
//! ([`ProxyReport`]): its state changed (ready or not, [`ProxyState`]), certificates it
//! refused for their material (their lines stay out of the files it loads), or files it
//! could not load (written again).
//!
//! The proxies are listed in one place, [`crate::daemon`]'s `spawn_outputs`. HAProxy
//! (its certificates over the runtime API and its routes' configuration) is
//! [`haproxy::HaproxyProxy`].

use std::sync::Arc;

use futures::future::BoxFuture;
use route_secrets::route::RouteKey;
use route_secrets::route::routing::RouteRouting;

pub use crate::cert_dir::CrtChange;
use crate::haproxy::HaproxyStatus;

pub mod haproxy;
#[cfg(test)]
pub(crate) mod record;

/// Certificates a proxy refused for their material: certificate name → the refused
/// bundle's digest. Their lines stay out of the files the proxy loads until their
/// material changes.
pub type Refused = Arc<std::collections::HashMap<String, [u8; 32]>>;

/// A route the proxy must route, as decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteServed {
    /// The route.
    pub key: RouteKey,
    /// Where its traffic goes.
    pub routing: Arc<RouteRouting>,
    /// Served for every host of its domain (a wildcard route the router allows).
    pub wildcard: bool,
    /// Whether it is served with a certificate of its own (a [`CrtChange`] names it);
    /// otherwise with the default certificate, or without TLS.
    pub has_certificate: bool,
}

/// A route's decision, for a proxy that routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteDecision {
    /// Route it so (replaces what it was told before).
    Served(RouteServed),
    /// Route it no more (rejected or removed).
    Gone(RouteKey),
}

/// What one flush of the cert directory means for a proxy.
#[derive(Clone, Copy, Debug)]
pub struct Flushed<'a> {
    /// Routes decided since the last flush, oldest first (empty for a proxy that does
    /// not route).
    pub routes: &'a [RouteDecision],
    /// Certificates whose served bundle changed (once start-up is decided).
    pub certificates: &'a [CrtChange],
    /// Whether `certificates` lists every served certificate: the first flush once
    /// start-up is decided.
    pub complete: bool,
    /// Before start-up is decided: the lines of routes decided since the last flush,
    /// their files on disk (empty unless the cert directory reports them, and once
    /// start-up is decided). A running proxy may add them at once; the complete
    /// listing names every line again.
    pub decided: &'a [CrtChange],
}

/// What a proxy says of itself, for readiness and the daemon's status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyState {
    /// Whether it serves what it was told (the daemon is ready only when every proxy
    /// is, besides the files).
    pub ready: bool,
    /// The HAProxy certificate controller's status, from a proxy that has one.
    pub haproxy: Option<HaproxyStatus>,
    /// Whether the routes' configuration is loaded, from a proxy that routes.
    pub routed: Option<bool>,
}

/// What a proxy reports back to the outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyReport {
    /// Its [`ProxyState`] may have changed.
    State,
    /// It refused these certificates (all of them, not a change): their lines leave
    /// the files it loads.
    Refused(Refused),
    /// It could not load the files: whatever is missing is written again.
    FilesMissing,
}

/// One proxy behind the seam (see the [module documentation](self)).
pub trait Proxy: Send {
    /// Whether it routes, so needs [`Flushed::routes`].
    fn routes(&self) -> bool;

    /// The cert directory was flushed: the files are on disk; bring the proxy there.
    fn flushed(&mut self, flushed: Flushed<'_>);

    /// Start-up is decided: the first complete files are on disk.
    fn decided(&mut self);

    /// Forget what the proxy is believed to hold, and bring it there again.
    fn resync(&mut self);

    /// Its state now.
    fn state(&self) -> ProxyState;

    /// Waits for its next report; never completes once it has nothing more to say.
    /// Dropping the future loses nothing.
    fn report(&mut self) -> BoxFuture<'_, ProxyReport>;

    /// Finishes what is pending and stops.
    fn close(self: Box<Self>) -> BoxFuture<'static, ()>;
}
