//! OpenShift routes whose certificate lives in a secret: the router's
//! external-certificate pipeline, from route events to admitted and rejected routes.
//!
//! The crate has two layers, and the folders show them.
//!
//! Pure (no I/O, no clock, no tasks; time and network results come in as data):
//!
//! - [`route`]: the `Route` resource (`route.openshift.io/v1`) with the fields a router
//!   uses, lossless for fields it does not model, plus [`route::admission`]: this
//!   router's `status.ingress[]` entry (write it, recognise it).
//! - [`reason`]: why a route was rejected or re-admitted, with OpenShift's reason names
//!   (`ExternalCertificateValidationFailed`, ...) and messages a person can act on.
//! - [`tls`]: validation of the certificate and key of a `kubernetes.io/tls` secret with
//!   the OpenShift router's rules, plus what HAProxy refuses: PEM, key kinds, weak keys
//!   and signatures, key/certificate match; warnings for validity, host coverage, order.
//! - [`consumer`]: who holds certificate references ([`consumer::ConsumerKey`], a
//!   route today) and the secrets they reference ([`consumer::CertificateRef`], in
//!   their own namespace): the registration bookkeeping [`machine`] keeps per holder.
//! - [`machine`]: the route state machine: what to do with each route event, network
//!   result, secret change and retry, as effects for a shell to perform.
//! - `testing` (feature `test-support`): certificate and key fixtures, and a `haproxy -c`
//!   check of bundles (the one piece of test support that runs a process).
//!
//! Talking to the API server ([`api`]):
//!
//! - [`api::route_watch`]: the watches on routes in scope (namespaces, selectors).
//! - [`api::access`]: access reviews (may the router get, list and watch a secret?).
//! - [`api::manager`]: registrations on shared per-secret watches.
//! - [`api::status_writer`]: route status writes, in the background.
//! - [`api::pipeline`]: the shell that runs the [`machine`] and performs its effects.
//!
//! A route event flows: [`api::route_watch`] → [`api::pipeline`] → [`machine`] (decides)
//! → back to [`api::pipeline`], which checks access ([`api::access`]), registers
//! ([`api::manager`]), validates the secret ([`tls`]), tells the consumer and records
//! the status ([`api::status_writer`]).
//!
//! # Example
//!
//! A route points at a secret; the secret is validated and the outcome recorded in the
//! route's status, once (the pure layer only):
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use jiff::Timestamp;
//! use k8s_openapi::ByteString;
//! use route_secrets::reason::{Reason, ValidationProblem};
//! use route_secrets::route::Route;
//! use route_secrets::route::admission::{RouterIdentity, record_admission, records_admission};
//! use route_secrets::tls::{self, TlsRejection};
//!
//! let mut route: Route = serde_json::from_value(serde_json::json!({
//!     "apiVersion": "route.openshift.io/v1",
//!     "kind": "Route",
//!     "metadata": {"name": "shop", "namespace": "team-a"},
//!     "spec": {
//!         "host": "shop.example.com",
//!         "to": {"kind": "Service", "name": "shop"},
//!         "tls": {"termination": "edge", "externalCertificate": {"name": "shop-tls"}}
//!     }
//! }))?;
//! let secret_name = route.external_certificate_name().expect("edge route with a secret");
//!
//! // A secret created with `kubectl create secret generic` has the wrong type.
//! let data = BTreeMap::from([("tls.crt".to_owned(), ByteString(b"...".to_vec()))]);
//! let now = Timestamp::from_second(1_750_000_000)?;
//! let rejection = tls::validate(Some("Opaque"), &data, route.host(), now).unwrap_err();
//! assert!(matches!(rejection, TlsRejection::WrongSecretType { .. }));
//!
//! let reason = Reason::ExternalCertificateValidationFailed {
//!     route: route.key().expect("namespaced route"),
//!     secret: secret_name.to_owned(),
//!     problem: ValidationProblem::Tls(rejection),
//! };
//! assert_eq!(reason.name(), "ExternalCertificateValidationFailed");
//!
//! let router = RouterIdentity::new("default");
//! let admission = reason.admission();
//! assert!(record_admission(&mut route, &router, &admission, now)); // write this status
//! assert!(records_admission(&route, &router, &admission)); // its echo needs no write
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod api;
pub mod consumer;
pub mod machine;
pub mod reason;
pub mod route;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod tls;
