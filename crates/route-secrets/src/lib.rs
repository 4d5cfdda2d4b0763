//! OpenShift routes whose certificate lives in a secret: the pure foundation of
//! certwatch's route pipeline.
//!
//! - [`route`]: the `Route` resource (`route.openshift.io/v1`) with the fields a router
//!   uses, lossless for fields it does not model, plus [`route::status`] helpers that
//!   write and recognise this router's `status.ingress[]` entry.
//! - [`reason`]: why a route was rejected or re-admitted, with OpenShift's reason names
//!   (`ExternalCertificateValidationFailed`, ...) and messages a person can act on.
//! - [`tls`]: validation of the certificate and key of a `kubernetes.io/tls` secret with
//!   the OpenShift router's rules, plus what HAProxy refuses: PEM, key kinds, weak keys
//!   and signatures, key/certificate match; warnings for validity, host coverage, order.
//! - `testing` (feature `test-support`): certificate and key fixtures, and a `haproxy -c`
//!   check of bundles.
//!
//! Nothing in this crate performs I/O, except the test support's HAProxy check.
//!
//! # Example
//!
//! A route points at a secret; the secret is validated and the outcome recorded in the
//! route's status, once:
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use jiff::Timestamp;
//! use k8s_openapi::ByteString;
//! use route_secrets::reason::{Reason, ValidationProblem};
//! use route_secrets::route::Route;
//! use route_secrets::route::status::{RouterIdentity, record_admission, records_admission};
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

// Errors carry the route, the secret and the monitor's cause; they are returned on cold
// paths only, so their size is not worth boxing away.
#![allow(clippy::result_large_err)]

pub mod access;
pub mod manager;
pub mod pipeline;
pub mod reason;
pub mod route;
pub mod source;
pub mod status;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod tls;
