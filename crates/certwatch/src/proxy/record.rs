//! A second proxy behind the seam: one that records what it is told and reports what
//! its test says. It proves that the outputs need nothing of HAProxy, and drives
//! [`Outputs`](crate::outputs::Outputs) in its tests.

use futures::future::BoxFuture;
use route_secrets::route::RouteKey;
use tokio::sync::{mpsc, watch};

use super::{Flushed, Proxy, ProxyReport, ProxyState, RouteDecision};

/// One thing the recorder was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Told {
    /// A flush: the routes, and per certificate its route and the digest of the
    /// bundle it serves now (`None`: none).
    Flushed {
        routes: Vec<RouteDecision>,
        certificates: Vec<(RouteKey, String, Option<[u8; 32]>)>,
        complete: bool,
    },
    Decided,
    Resync,
    Closed,
}

/// The proxy that records.
pub(crate) struct Recorder {
    told: watch::Sender<Vec<Told>>,
    state: watch::Receiver<ProxyState>,
    reports: mpsc::Receiver<ProxyReport>,
}

/// The test's side of a [`Recorder`].
pub(crate) struct RecorderHandle {
    /// Everything told, in order.
    pub(crate) told: watch::Receiver<Vec<Told>>,
    /// The state the recorder says it is in.
    pub(crate) state: watch::Sender<ProxyState>,
    /// Reports the recorder makes.
    pub(crate) reports: mpsc::Sender<ProxyReport>,
}

impl Recorder {
    pub(crate) fn new() -> (Self, RecorderHandle) {
        let (told_tx, told) = watch::channel(Vec::new());
        let (state_tx, state) = watch::channel(ProxyState::default());
        let (reports_tx, reports) = mpsc::channel(16);
        (
            Self {
                told: told_tx,
                state,
                reports,
            },
            RecorderHandle {
                told,
                state: state_tx,
                reports: reports_tx,
            },
        )
    }

    fn record(&self, told: Told) {
        self.told.send_modify(|all| all.push(told));
    }
}

impl Proxy for Recorder {
    fn routes(&self) -> bool {
        true
    }

    fn flushed(&mut self, flushed: Flushed<'_>) {
        self.record(Told::Flushed {
            routes: flushed.routes.to_vec(),
            certificates: flushed
                .certificates
                .iter()
                .map(|change| {
                    (
                        change.route.clone(),
                        change.name.clone(),
                        change.entry.as_ref().map(|entry| entry.digest),
                    )
                })
                .collect(),
            complete: flushed.complete,
        });
    }

    fn decided(&mut self) {
        self.record(Told::Decided);
    }

    fn resync(&mut self) {
        self.record(Told::Resync);
    }

    fn state(&self) -> ProxyState {
        *self.state.borrow()
    }

    fn report(&mut self) -> BoxFuture<'_, ProxyReport> {
        Box::pin(async move {
            match self.reports.recv().await {
                Some(report) => report,
                None => std::future::pending().await,
            }
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, ()> {
        self.record(Told::Closed);
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use jiff::Timestamp;
    use route_secrets::api::pipeline::{AdmittedRoute, Readiness, RouteOutcome, Sni};
    use route_secrets::machine::{CertificateSource, RouteCertificate};
    use route_secrets::route::routing::Termination;
    use route_secrets::testing::{LeafSpec, Pki};
    use route_secrets::tls::TlsValidator;
    use tokio::time::Instant;

    use super::*;
    use crate::cert_dir::CertDir;
    use crate::files::CRT_LIST_FILE;
    use crate::haproxy::crt_list::CrtList;
    use crate::metrics::Metrics;
    use crate::outputs::{DaemonStatus, Outputs};
    use crate::proxy::RouteServed;
    use crate::routing::model::tests::routing;

    fn admitted(pki: &Pki, name: &str, created: i64) -> RouteOutcome {
        let now = Timestamp::now();
        let host = format!("{name}.example.com");
        let secret = pki.issue(&LeafSpec::new(&host, now)).secret("shop", "s");
        let tls = TlsValidator::default()
            .validate_secret(&secret, Some(&host), now)
            .unwrap();
        RouteOutcome::Admitted(AdmittedRoute {
            route: RouteKey::new("shop", name),
            host: Some(host.clone()),
            sni: Sni::Host(host),
            created: Some(Timestamp::from_second(created).unwrap()),
            certificate: Some(RouteCertificate {
                source: CertificateSource::Secret("s".to_owned()),
                tls: Arc::new(tls),
            }),
            warnings: Vec::new(),
            routing: Arc::new(routing(Termination::Edge, &[("web", 1)])),
        })
    }

    fn served(decision: &RouteDecision) -> Option<&RouteServed> {
        match decision {
            RouteDecision::Served(route) => Some(route),
            RouteDecision::Gone(_) => None,
        }
    }

    /// Every flush told, as (routes, certificates, complete).
    fn flushes(told: &[Told]) -> Vec<Told> {
        told.iter()
            .filter(|told| matches!(told, Told::Flushed { .. }))
            .cloned()
            .collect()
    }

    /// The flush told after the first `seen`, once it is told.
    async fn flush_after(told: &mut watch::Receiver<Vec<Told>>, seen: usize) -> Told {
        let all = told
            .wait_for(|told| flushes(told).len() > seen)
            .await
            .unwrap()
            .clone();
        flushes(&all).swap_remove(seen)
    }

    /// The outputs drive a proxy that is not HAProxy through the seam alone: routes
    /// and certificates are told once their files are on disk and in order, start-up
    /// is told after the first complete listing, readiness waits for the proxy, and a
    /// refusal it reports takes the certificate out of the crt-list.
    #[tokio::test]
    async fn outputs_drive_a_proxy_through_the_seam() {
        let dir = tempfile::tempdir().unwrap();
        let cert_dir = CertDir::open(dir.path(), 2, Arc::new(CrtList::default()))
            .await
            .unwrap();
        let pki = Pki::new(Timestamp::now());
        let (recorder, mut handle) = Recorder::new();
        let (status_tx, mut status) = watch::channel(DaemonStatus::default());
        let (resync_tx, resync) = watch::channel(0);
        let (outcomes_tx, outcomes) = mpsc::channel(16);
        let (_readiness_tx, readiness) = watch::channel(Readiness {
            listed: true,
            initial_routes: 2,
            initial_done: 2,
        });
        outcomes_tx.send(admitted(&pki, "a", 1)).await.unwrap();
        outcomes_tx.send(admitted(&pki, "b", 2)).await.unwrap();
        let task = tokio::spawn(
            Outputs {
                cert_dir,
                metrics: Arc::new(Metrics::new()),
                reloader: None,
                proxies: vec![Box::new(recorder)],
                status: status_tx,
                started: Instant::now(),
                resync,
                routes_pending: Vec::new(),
            }
            .run(outcomes, readiness),
        );

        // The files are ready; the daemon is not, while the proxy is not.
        let now = *status.wait_for(|status| status.files_ready).await.unwrap();
        assert!(!now.ready);
        let told = handle.told.borrow().clone();
        let flushed = flushes(&told);
        let routes: Vec<&str> = flushed
            .iter()
            .flat_map(|told| match told {
                Told::Flushed { routes, .. } => routes.as_slice(),
                _ => &[],
            })
            .filter_map(served)
            .map(|route| &*route.key.name)
            .collect();
        assert_eq!(routes, ["a", "b"], "every admitted route is told, in order");
        // No certificate before the complete listing, which names both.
        let complete = flushed
            .iter()
            .position(|told| matches!(told, Told::Flushed { complete: true, .. }))
            .expect("a complete listing is told");
        for before in &flushed[..complete] {
            let Told::Flushed { certificates, .. } = before else {
                unreachable!()
            };
            assert!(certificates.is_empty(), "{certificates:?}");
        }
        let Told::Flushed { certificates, .. } = &flushed[complete] else {
            unreachable!()
        };
        let mut listed: Vec<&str> = certificates
            .iter()
            .filter(|(_, _, digest)| digest.is_some())
            .map(|(route, _, _)| &*route.name)
            .collect();
        listed.sort_unstable();
        assert_eq!(listed, ["a", "b"]);
        let complete_at = told
            .iter()
            .position(|told| matches!(told, Told::Flushed { complete: true, .. }))
            .unwrap();
        let decided_at = told.iter().position(|told| *told == Told::Decided).unwrap();
        assert!(complete_at < decided_at, "{told:?}");
        assert_eq!(
            told.iter().filter(|told| **told == Told::Decided).count(),
            1
        );

        // Ready once the proxy is; its state is the daemon's.
        handle.state.send_replace(ProxyState {
            ready: true,
            haproxy: None,
            routed: Some(true),
        });
        handle.reports.send(ProxyReport::State).await.unwrap();
        let now = *status.wait_for(|status| status.ready).await.unwrap();
        assert_eq!(now.routed, Some(true));
        assert_eq!(now.haproxy, None);

        // A refusal of a's material: a leaves the crt-list, b stays.
        let (_, name, digest) = certificates
            .iter()
            .find(|(route, _, _)| &*route.name == "a")
            .cloned()
            .unwrap();
        let refused = Arc::new(HashMap::from([(name.clone(), digest.unwrap())]));
        let seen = flushes(&handle.told.borrow()).len();
        handle
            .reports
            .send(ProxyReport::Refused(refused))
            .await
            .unwrap();
        // The refusal's flush tells the proxy that a has no line any more.
        let Told::Flushed { certificates, .. } = flush_after(&mut handle.told, seen).await else {
            unreachable!()
        };
        assert_eq!(certificates, [(RouteKey::new("shop", "a"), name, None)]);
        let list = std::fs::read_to_string(dir.path().join(CRT_LIST_FILE)).unwrap();
        assert!(!list.contains("a.example.com"), "{list}");
        assert!(list.contains("b.example.com"), "{list}");

        // A re-synchronisation request reaches the proxy.
        resync_tx.send_replace(1);
        handle
            .told
            .wait_for(|told| told.contains(&Told::Resync))
            .await
            .unwrap();

        // A removed route is told gone with its certificate.
        let seen = flushes(&handle.told.borrow()).len();
        outcomes_tx
            .send(RouteOutcome::Removed(RouteKey::new("shop", "b")))
            .await
            .unwrap();
        let Told::Flushed {
            routes,
            certificates,
            ..
        } = flush_after(&mut handle.told, seen).await
        else {
            unreachable!()
        };
        assert_eq!(routes, [RouteDecision::Gone(RouteKey::new("shop", "b"))]);
        let gone: Vec<_> = certificates
            .iter()
            .map(|(route, _, digest)| (route.clone(), *digest))
            .collect();
        assert_eq!(gone, [(RouteKey::new("shop", "b"), None)]);

        // The outputs end with the pipeline, and close the proxy last.
        drop(outcomes_tx);
        task.await.unwrap();
        assert_eq!(handle.told.borrow().last(), Some(&Told::Closed));
    }
}
