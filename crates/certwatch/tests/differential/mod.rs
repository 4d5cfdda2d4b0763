//! The differential test's harness: a real control plane (testenv), the real OpenShift
//! router (testenv's `OpenShiftRouter`, from the shared tool) and `certwatch run`, each
//! writing route status under its own router name, a corpus of routes and secrets
//! applied step by step, and what each router wrote after each step.
//!
//! Extending it: [`Harness`] gives the control plane, the admin client, the running
//! router (its HAProxy's ports, its crt-list) and certwatch (its address and cert
//! directory); a check that runs after every step goes into the test's step loop, next
//! to the status comparison, and reads the [`Observation`] of that step.

pub mod corpus;
pub mod differences;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use route_secrets::route::Route;
use route_secrets::route::admission::{admitted_condition, router_ingress};
use testenv::{ControlPlane, ControlPlaneOptions, Installer, OpenShiftRouter, RouterOptions};

use crate::common::Certwatch;
use corpus::{Action, Admitted, NAMESPACES};

/// The name the real router writes status under.
pub const REAL_ROUTER: &str = "openshift-router";
/// The name certwatch writes status under.
pub const CERTWATCH: &str = "certwatch";

/// What one route's status says, for each router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The real router's `Admitted` condition.
    pub router: Admitted,
    /// When the real router's condition last changed (RFC 3339, to the second).
    pub router_transition: Option<jiff::Timestamp>,
    /// certwatch's `Admitted` condition.
    pub certwatch: Admitted,
}

/// Every corpus route's status, by route name.
pub type Observation = BTreeMap<String, Observed>;

/// The control plane, both routers, and a directory for certwatch.
pub struct Harness {
    pub control_plane: ControlPlane,
    pub admin: kube::Client,
    pub installer: Installer,
    pub router: Option<OpenShiftRouter>,
    pub certwatch: Option<Certwatch>,
    pub dir: tempfile::TempDir,
    /// When the last change was answered (for [`Action::NextSecond`]).
    last_change: SystemTime,
}

impl Harness {
    /// A control plane with the router identity's cluster rights and the corpus's
    /// namespaces; no router runs yet.
    pub async fn start() -> Self {
        let control_plane = ControlPlane::start_with(ControlPlaneOptions::from_env())
            .await
            .unwrap();
        let admin = control_plane.admin_client().await.unwrap();
        OpenShiftRouter::grant_cluster_rights(&admin).await.unwrap();
        let installer = Installer::new(admin.clone());
        // certwatch elects its status writer on a Lease, as deployed (lease-role.yaml).
        installer.grant_router_leases().await.unwrap();
        for namespace in NAMESPACES {
            installer.namespace(namespace).await.unwrap();
        }
        Self {
            control_plane,
            admin,
            installer,
            router: None,
            certwatch: None,
            dir: tempfile::tempdir().unwrap(),
            last_change: SystemTime::now(),
        }
    }

    /// certwatch's cert directory.
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// Starts the real router (`REAL_ROUTER`, HAProxy at the image's OpenSSL security
    /// level 1) and `certwatch run --write-status` (`CERTWATCH`, with `args`), both as
    /// the router identity.
    pub async fn start_routers(&mut self, certwatch_args: &[&str]) {
        let kubeconfig = self.control_plane.kubeconfig_path().to_path_buf();
        let router = OpenShiftRouter::start(&kubeconfig, RouterOptions::new(REAL_ROUTER))
            .await
            .unwrap();
        self.router = Some(router);
        let mut args = vec!["--write-status", "--router-name", CERTWATCH];
        args.extend_from_slice(certwatch_args);
        self.certwatch = Some(Certwatch::start(
            &kubeconfig,
            &self.cert_dir(),
            &self.dir.path().join("certwatch.log"),
            &args,
        ));
    }

    /// The real router.
    pub fn router(&self) -> &OpenShiftRouter {
        self.router.as_ref().expect("the routers are started")
    }

    /// Makes one change through the API, as the admin.
    pub async fn apply(&mut self, action: &Action) {
        match action {
            Action::PutSecret {
                namespace,
                name,
                secret_type,
                crt,
                key,
            } => {
                let secrets: Api<Secret> = Api::namespaced(self.admin.clone(), namespace);
                let mut secret = Secret {
                    type_: Some((*secret_type).to_owned()),
                    data: Some(BTreeMap::from([
                        ("tls.crt".to_owned(), ByteString(crt.clone().into_bytes())),
                        ("tls.key".to_owned(), ByteString(key.clone().into_bytes())),
                    ])),
                    ..Secret::default()
                };
                secret.metadata.name = Some(name.clone());
                match secrets.get_opt(name).await.unwrap() {
                    None => {
                        secrets
                            .create(&PostParams::default(), &secret)
                            .await
                            .unwrap();
                    }
                    Some(existing) if existing.type_ == secret.type_ => {
                        secret.metadata.resource_version = existing.metadata.resource_version;
                        secrets
                            .replace(name, &PostParams::default(), &secret)
                            .await
                            .unwrap();
                    }
                    Some(_) => {
                        panic!("secret {namespace}/{name} changes type: not supported by the API")
                    }
                }
            }
            Action::DeleteSecret { namespace, name } => {
                Api::<Secret>::namespaced(self.admin.clone(), namespace)
                    .delete(name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
            Action::Grant { namespace, secrets } => {
                let names: Vec<&str> = secrets.iter().map(String::as_str).collect();
                self.installer
                    .grant_router_secrets(namespace, &names)
                    .await
                    .unwrap();
            }
            Action::PutRoute {
                namespace,
                name,
                spec,
            } => {
                let routes: Api<Route> = Api::namespaced(self.admin.clone(), namespace);
                match routes.get_opt(name).await.unwrap() {
                    None => {
                        let route: Route = serde_json::from_value(serde_json::json!({
                            "apiVersion": "route.openshift.io/v1",
                            "kind": "Route",
                            "metadata": {"name": name, "namespace": namespace},
                            "spec": spec,
                        }))
                        .unwrap();
                        routes
                            .create(&PostParams::default(), &route)
                            .await
                            .unwrap_or_else(|error| {
                                panic!("creating route {namespace}/{name}: {error}")
                            });
                    }
                    Some(_) => loop {
                        // The whole spec is replaced (a merge patch would keep fields the
                        // new spec leaves out); a status write in between is a 409: again.
                        let mut route = routes.get(name).await.unwrap();
                        route.spec = serde_json::from_value(spec.clone()).unwrap();
                        match routes.replace(name, &PostParams::default(), &route).await {
                            Ok(_) => break,
                            Err(kube::Error::Api(status)) if status.code == 409 => continue,
                            Err(error) => panic!("changing route {namespace}/{name}: {error}"),
                        }
                    },
                }
            }
            Action::DeleteRoute { namespace, name } => {
                Api::<Route>::namespaced(self.admin.clone(), namespace)
                    .delete(name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
            Action::NextSecond => {
                let since_epoch = self
                    .last_change
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap();
                let next = SystemTime::UNIX_EPOCH
                    + Duration::from_secs(since_epoch.as_secs() + 1)
                    + Duration::from_millis(50);
                if let Ok(wait) = next.duration_since(SystemTime::now()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }
        self.last_change = SystemTime::now();
    }

    /// Every corpus route's status as both routers wrote it.
    pub async fn observe(&self) -> Observation {
        let mut observation = Observation::new();
        for namespace in NAMESPACES {
            let routes: Api<Route> = Api::namespaced(self.admin.clone(), namespace);
            for route in routes.list(&ListParams::default()).await.unwrap().items {
                let name = route.metadata.name.clone().unwrap_or_default();
                let condition = |router: &str| {
                    router_ingress(&route, router)
                        .and_then(admitted_condition)
                        .cloned()
                };
                let real = condition(REAL_ROUTER);
                let ours = condition(CERTWATCH);
                observation.insert(
                    name,
                    Observed {
                        router: admitted(real.as_ref()),
                        router_transition: real
                            .as_ref()
                            .and_then(|condition| condition.last_transition_time.as_ref())
                            .map(|time| time.0),
                        certwatch: admitted(ours.as_ref()),
                    },
                );
            }
        }
        observation
    }
}

fn admitted(condition: Option<&route_secrets::route::RouteIngressCondition>) -> Admitted {
    let Some(condition) = condition else {
        return Admitted::Absent;
    };
    let reason = condition.reason.clone().filter(|reason| !reason.is_empty());
    match condition.status.as_str() {
        "True" => Admitted::True(reason),
        _ => Admitted::False(reason.unwrap_or_default()),
    }
}

/// Polls `check` every half second until it returns `true` or `patience` has passed;
/// returns whether it did. A bound on a hang, never a statement about speed.
pub async fn wait_until(patience: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
