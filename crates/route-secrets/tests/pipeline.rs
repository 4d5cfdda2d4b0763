//! The pipeline's shell against the simulator, as the router identity with real RBAC:
//! that what the state machine decides (its every transition is unit-tested in
//! `src/machine/tests.rs`) reaches the API server and comes back: registrations open
//! and close watches, secret events arrive, outcomes and status are written.
//!
//! Each scenario is a row of steps; a failing row names its scenario and step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use route_secrets::testing::{LeafSpec, Pki};
use route_secrets::tls::TlsWarning;
use support::*;

const NS: &str = "shop";

/// One step of a scenario.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Creates or changes route `name` for `host`, with the secret (or none).
    Route(&'static str, Option<&'static str>, &'static str),
    DeleteRoute(&'static str),
    /// Writes a new certificate for `host` into the secret (creating it).
    Rotate(&'static str, &'static str),
    /// Writes an expired certificate for `host` into the secret.
    Expired(&'static str, &'static str),
    /// Writes a certificate for `host` that is not valid yet into the secret.
    NotYetValid(&'static str, &'static str),
    /// Writes a certificate for `host` that expires in a few seconds into the secret.
    ShortLived(&'static str, &'static str),
    DeleteSecret(&'static str),
    /// The route is admitted with the secret's latest certificate.
    Admitted(&'static str, &'static str),
    /// The route is admitted without a certificate of its own (no external certificate:
    /// the router's default certificate).
    AdmittedLocally(&'static str),
    /// The route is admitted with a warning that its certificate misses the host.
    HostWarning(&'static str),
    Rejected(&'static str, &'static str),
    Removed(&'static str),
    /// The route's status records admitted (or not) with the reason (or none).
    Status(&'static str, bool, Option<&'static str>),
    /// The route's status records admitted, with a message containing these words (or
    /// without a message).
    AdmittedMessage(&'static str, Option<&'static str>),
    /// Secret watches open at the simulator, and the secrets the manager watches.
    Watches(&'static [&'static str]),
    /// Outcomes said so far about the route.
    Outcomes(&'static str, usize),
    /// Route status updates sent so far.
    StatusWrites(usize),
    /// Watch requests sent so far for the secret.
    WatchRequests(&'static str, usize),
}

use Step::*;

const SCENARIOS: &[(&str, &[Step])] = &[
    (
        "an added route is admitted with its secret",
        &[
            Rotate("a", "a.shop.example"),
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            Status("r", true, None),
            Watches(&["a"]),
        ],
    ),
    (
        "a modified route follows its secret reference",
        &[
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            Watches(&["a"]),
            // Another secret: the old one is released, the new one registered.
            Route("r", Some("b"), "b.shop.example"),
            Admitted("r", "b"),
            Watches(&["b"]),
            // Same secret, other host: re-validated; the certificate does not cover it.
            Route("r", Some("b"), "elsewhere.example"),
            HostWarning("r"),
            Watches(&["b"]),
            // No external certificate any more: admitted as the router admits an edge
            // route without a certificate (its default one), watch closed.
            Route("r", None, "b.shop.example"),
            AdmittedLocally("r"),
            Status("r", true, None),
            Watches(&[]),
            // An external certificate again.
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            Watches(&["a"]),
        ],
    ),
    (
        "a deleted route releases its secret",
        &[
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            Watches(&["a"]),
            DeleteRoute("r"),
            Removed("r"),
            Watches(&[]),
        ],
    ),
    (
        "secret updated, deleted and re-created",
        &[
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            Rotate("a", "a.shop.example"),
            Admitted("r", "a"),
            Status("r", true, None),
            // Deleted: rejected as for a secret that does not exist (what the router
            // says of that state), the watch stays.
            DeleteSecret("a"),
            Rejected("r", "ExternalCertificateValidationFailed"),
            Status("r", false, Some("ExternalCertificateValidationFailed")),
            Watches(&["a"]),
            // Re-created: re-validated and re-admitted, without a reason (a secret that
            // exists).
            Rotate("a", "a.shop.example"),
            Admitted("r", "a"),
            Status("r", true, None),
            Watches(&["a"]),
        ],
    ),
    (
        "routes sharing a secret share one watch",
        &[
            // Each its own host: routes of one host are host claims (tests/hosts.rs).
            Route("r1", Some("a"), "r1.shop.example"),
            Route("r2", Some("a"), "r2.shop.example"),
            Route("r3", Some("a"), "r3.shop.example"),
            Admitted("r1", "a"),
            Admitted("r2", "a"),
            Admitted("r3", "a"),
            Watches(&["a"]),
            WatchRequests("a", 1),
            Rotate("a", "a.shop.example"),
            Admitted("r1", "a"),
            Admitted("r2", "a"),
            Admitted("r3", "a"),
            DeleteRoute("r1"),
            DeleteRoute("r2"),
            Removed("r1"),
            Removed("r2"),
            Watches(&["a"]),
            DeleteRoute("r3"),
            Removed("r3"),
            Watches(&[]),
        ],
    ),
    (
        "the router's own status writes do not loop",
        &[
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            Status("r", true, None),
            // Another outcome (secret deleted) is one more write; the write's own route
            // event (a status-only change) produces none.
            DeleteSecret("a"),
            Status("r", false, Some("ExternalCertificateValidationFailed")),
            // A further, unrelated change round-trips through the pipeline.
            Route("other", Some("b"), "b.shop.example"),
            Admitted("other", "b"),
            Status("other", true, None),
            StatusWrites(3),
            Outcomes("r", 2),
        ],
    ),
    (
        "a certificate served despite its dates says so in the status until renewed",
        &[
            Expired("a", "a.shop.example"),
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            AdmittedMessage("r", Some("expired at")),
            Status("r", true, None),
            StatusWrites(1),
            // Renewed: the message goes, in a write that changes nothing else.
            Rotate("a", "a.shop.example"),
            Admitted("r", "a"),
            AdmittedMessage("r", None),
            StatusWrites(2),
            NotYetValid("a", "a.shop.example"),
            Admitted("r", "a"),
            AdmittedMessage("r", Some("is not valid before")),
            StatusWrites(3),
            Outcomes("r", 3),
        ],
    ),
    (
        "a served certificate that expires says so in the status, with no change to the secret",
        &[
            ShortLived("a", "a.shop.example"),
            Route("r", Some("a"), "a.shop.example"),
            Admitted("r", "a"),
            // Waits for the expiry, seconds away.
            AdmittedMessage("r", Some("expired at")),
            StatusWrites(2),
            // Told again (with the warning), from the same secret version.
            Admitted("r", "a"),
            Outcomes("r", 2),
            WatchRequests("a", 1),
        ],
    ),
    (
        "a missing secret is admitted once created",
        &[
            Route("r", Some("later"), "later.shop.example"),
            Rejected("r", "ExternalCertificateValidationFailed"),
            Status("r", false, Some("ExternalCertificateValidationFailed")),
            Watches(&["later"]),
            Rotate("later", "later.shop.example"),
            Admitted("r", "later"),
            Status("r", true, None),
        ],
    ),
];

struct World {
    h: Harness,
    pki: Pki,
    /// The latest certificate written to each secret.
    fingerprints: BTreeMap<&'static str, [u8; 32]>,
}

/// A namespace with secrets `a` and `b` (certificates for `a.shop.example` and
/// `b.shop.example`), and a grant for them and `later`, and a running pipeline.
async fn world() -> World {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    let mut world_fingerprints = BTreeMap::new();
    for name in ["a", "b"] {
        let leaf = pki.issue(&LeafSpec::new(&format!("{name}.shop.example"), now()));
        put_secret(&sim, &leaf.secret(NS, name));
        world_fingerprints.insert(name, fingerprint_of_leaf(&leaf));
    }
    sim.grant_router_secrets(NS, &["a", "b", "later"]).unwrap();
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    World {
        h,
        pki,
        fingerprints: world_fingerprints,
    }
}

async fn run(scenario: &str, steps: &[Step]) {
    let mut w = world().await;
    for (index, step) in steps.iter().enumerate() {
        let at = format!("{scenario}, step {index} ({step:?})");
        eprintln!("STEP {at}");
        perform(&mut w, *step, &at).await;
    }
}

async fn perform(w: &mut World, step: Step, at: &str) {
    let sim = w.h.sim.clone();
    match step {
        Route(name, secret, host) => {
            let mut route =
                route_secrets::testing::route_with_external_certificate(NS, name, host, "x");
            let tls = route.spec.tls.as_mut().unwrap();
            match secret {
                Some(secret) => tls.external_certificate.as_mut().unwrap().name = secret.into(),
                None => tls.external_certificate = None,
            }
            put_route(&sim, &route);
        }
        DeleteRoute(name) => delete(&sim, "routes", NS, name),
        Rotate(secret, host)
        | Expired(secret, host)
        | NotYetValid(secret, host)
        | ShortLived(secret, host) => {
            let spec = LeafSpec::new(host, now());
            let spec = match step {
                Expired(..) => spec.expired(now()),
                NotYetValid(..) => spec.not_yet_valid(now()),
                ShortLived(..) => spec.valid(
                    now() - jiff::SignedDuration::from_hours(1),
                    now() + jiff::SignedDuration::from_secs(3),
                ),
                _ => spec,
            };
            let leaf = w.pki.issue(&spec);
            put_secret(&sim, &leaf.secret(NS, secret));
            w.fingerprints.insert(secret, fingerprint_of_leaf(&leaf));
        }
        DeleteSecret(secret) => delete(&sim, "secrets", NS, secret),
        Admitted(route, secret) => {
            let fingerprint = w.fingerprints.get(secret).copied();
            let admitted = w.h.until_admitted(&key(NS, route), fingerprint).await;
            assert_eq!(admitted.secret(), Some(secret), "{at}");
        }
        AdmittedLocally(route) => {
            let route = key(NS, route);
            w.h.until(at, |h| {
                h.admitted(&route)
                    .is_some_and(|admitted| admitted.certificate.is_none())
            })
            .await;
        }
        HostWarning(route) => {
            let route = key(NS, route);
            w.h.until(at, |h| {
                h.admitted(&route).is_some_and(|a| {
                    a.warnings
                        .iter()
                        .any(|w| matches!(w, TlsWarning::HostNotCovered { .. }))
                })
            })
            .await;
        }
        Rejected(route, reason) => {
            w.h.until_rejected(&key(NS, route), reason).await;
        }
        Removed(route) => {
            let route = key(NS, route);
            w.h.until(at, |h| h.removed(&route)).await;
        }
        Status(route, admitted, reason) => {
            w.h.until_status(&key(NS, route), admitted, reason).await
        }
        AdmittedMessage(route, words) => w.h.until_admitted_message(&key(NS, route), words).await,
        Watches(secrets) => {
            w.h.until_secret_watches(secrets.len() as u64).await;
            let expected: Vec<String> = secrets.iter().map(|s| (*s).to_owned()).collect();
            let h = &w.h;
            eventually(at, || {
                h.watched().keys().cloned().collect::<Vec<_>>() == expected
            })
            .await;
        }
        Outcomes(route, count) => {
            let said = w.h.outcomes_of(&key(NS, route));
            assert_eq!(said.len(), count, "{at}: {said:#?}");
        }
        StatusWrites(count) => {
            // Writes that landed: one that met a 409 (the pipeline's copy of the route
            // was older than the server's) is redone, and only the redo counts. The
            // simulator accounts a request once it has answered it, which can be after
            // the status it wrote is seen: the count is awaited, and one more write
            // than expected fails it as surely as one less.
            eventually(at, || {
                answered(&sim, "update", "routes/status", 200) >= count
            })
            .await;
            assert_eq!(
                answered(&sim, "update", "routes/status", 200),
                count,
                "{at}"
            );
        }
        WatchRequests(secret, count) => {
            let watches = requests(&sim, "watch", "secrets")
                .iter()
                .filter(|r| r.name.as_deref() == Some(secret))
                .count();
            assert_eq!(watches, count, "{at}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios() {
    for (scenario, steps) in SCENARIOS {
        run(scenario, steps).await;
    }
}

#[tokio::test]
async fn the_bundle_is_the_secrets_chain_then_its_key() {
    let mut w = world().await;
    put_route(
        &w.h.sim,
        &route_secrets::testing::route_with_external_certificate(NS, "r", "a.shop.example", "a"),
    );
    let fingerprint = w.fingerprints.get("a").copied();
    let admitted = w.h.until_admitted(&key(NS, "r"), fingerprint).await;
    let secret = w.h.sim.store().get("secrets", NS, "a").unwrap();
    let decode = |field: &str| {
        use base64::Engine;
        let encoded = secret["data"][field].as_str().unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap(),
        )
        .unwrap()
    };
    let bundle = bundle(&admitted);
    let tls = admitted.tls().expect("a certificate");
    assert!(bundle.starts_with(tls.chain_pem()));
    assert!(bundle.ends_with(tls.key_pem().expose_secret()));
    assert_eq!(
        tls.chain_pem().matches("BEGIN CERTIFICATE").count(),
        decode("tls.crt").matches("BEGIN CERTIFICATE").count()
    );
    assert!(admitted.warnings.is_empty(), "{:?}", admitted.warnings);
}
