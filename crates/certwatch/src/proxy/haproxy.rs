//! HAProxy behind the seam: its certificates through the controller ([`Haproxy`],
//! the runtime API) and its routes' configuration through the routing task
//! ([`Routing`]), either of which may be absent (certwatch may feed a HAProxy's
//! certificates without configuring its routes).

use futures::future::BoxFuture;
use tokio::sync::watch;

use super::{Flushed, Proxy, ProxyReport, ProxyState, RouteDecision};
use crate::haproxy::Haproxy;
use crate::haproxy::HaproxyStatus;
use crate::haproxy::controller::Rejected;
use crate::routing::model::ServedRoute;
use crate::routing::{RouteChange, Routing};

/// HAProxy as a [`Proxy`].
pub struct HaproxyProxy {
    certificates: Option<Haproxy>,
    routing: Option<Routing>,
    /// What the parts report, each `None` once its sender is gone.
    status: Option<watch::Receiver<HaproxyStatus>>,
    rejected: Option<watch::Receiver<Rejected>>,
    served: Option<watch::Receiver<bool>>,
    repairs: Option<watch::Receiver<u64>>,
}

impl HaproxyProxy {
    /// The proxy of a HAProxy whose certificates `certificates` keeps and whose routes'
    /// configuration `routing` writes; `None` when certwatch does neither.
    pub fn new(certificates: Option<Haproxy>, routing: Option<Routing>) -> Option<Self> {
        if certificates.is_none() && routing.is_none() {
            return None;
        }
        Some(Self {
            status: certificates.as_ref().map(Haproxy::status),
            rejected: certificates.as_ref().map(Haproxy::rejected),
            served: routing.as_ref().map(Routing::served),
            repairs: routing.as_ref().map(Routing::repairs),
            certificates,
            routing,
        })
    }
}

impl Proxy for HaproxyProxy {
    fn routes(&self) -> bool {
        self.routing.is_some()
    }

    fn flushed(&mut self, flushed: Flushed<'_>) {
        // The routes first: a reload they cause loads a crt-list that names their
        // certificates, which the flush has just written.
        if let Some(routing) = &self.routing {
            for decision in flushed.routes {
                routing.send(match decision {
                    RouteDecision::Served(route) => RouteChange::Served(ServedRoute {
                        key: route.key.clone(),
                        routing: route.routing.clone(),
                        wildcard: route.wildcard,
                        has_certificate: route.has_certificate,
                    }),
                    RouteDecision::Gone(key) => RouteChange::Gone(key.clone()),
                });
            }
        }
        if let Some(haproxy) = &self.certificates {
            // Changes come only once start-up is decided: a half-built set must not
            // remove anything from a running HAProxy. Routes decided before may be
            // added to it.
            haproxy.publish_decided(flushed.decided);
            haproxy.publish(flushed.certificates.to_vec(), flushed.complete);
        }
    }

    fn decided(&mut self) {
        // The crt-list HAProxy's configuration names is written now.
        if let Some(routing) = &self.routing {
            routing.send(RouteChange::Decided);
        }
    }

    fn resync(&mut self) {
        if let Some(haproxy) = &self.certificates {
            haproxy.resync();
        }
    }

    fn state(&self) -> ProxyState {
        let haproxy = self
            .certificates
            .as_ref()
            .map(|haproxy| *haproxy.status().borrow());
        let routed = self
            .routing
            .as_ref()
            .map(|routing| *routing.served().borrow());
        ProxyState {
            ready: haproxy.is_none_or(|haproxy| haproxy.ready()) && routed != Some(false),
            haproxy,
            routed,
        }
    }

    fn report(&mut self) -> BoxFuture<'_, ProxyReport> {
        Box::pin(async move {
            loop {
                tokio::select! {
                    changed = changed_or_pending(&mut self.status) => match changed {
                        Ok(()) => return ProxyReport::State,
                        Err(_) => self.status = None,
                    },
                    changed = changed_or_pending(&mut self.served) => match changed {
                        Ok(()) => return ProxyReport::State,
                        Err(_) => self.served = None,
                    },
                    changed = changed_or_pending(&mut self.repairs) => match changed {
                        Ok(()) => return ProxyReport::FilesMissing,
                        Err(_) => self.repairs = None,
                    },
                    changed = changed_or_pending(&mut self.rejected) => {
                        match (changed, self.rejected.as_mut()) {
                            (Ok(()), Some(receiver)) => {
                                return ProxyReport::Refused(receiver.borrow_and_update().clone());
                            }
                            _ => self.rejected = None,
                        }
                    }
                }
            }
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, ()> {
        let Self {
            certificates,
            routing,
            ..
        } = *self;
        Box::pin(async move {
            if let Some(haproxy) = certificates {
                haproxy.close().await;
            }
            if let Some(routing) = routing {
                routing.close().await;
            }
        })
    }
}

/// Waits for the next change of `receiver`; never, without one.
async fn changed_or_pending<T>(
    receiver: &mut Option<watch::Receiver<T>>,
) -> Result<(), watch::error::RecvError> {
    match receiver {
        Some(receiver) => receiver.changed().await,
        None => std::future::pending().await,
    }
}
