//! The OpenShift router's admission matrix, through the real binary.
//!
//! One `certwatch run` (with `--write-status` and `--haproxy-socket`) against
//! `certwatch-lab sim`, many routes, and a table of rows applied in batches: routes added
//! with every kind of secret, routes updated (none→ext, ext→same, ext→other, ext→none,
//! none→none), routes deleted, secrets updated, deleted and re-created, host claims and
//! wildcard routes. Each row states what the router does and what certwatch must do;
//! after every batch the test checks, for every route, the `Admitted` condition of
//! certwatch's status entry (status and reason, words of the message), the crt-list
//! (exactly the admitted routes, each with its SNI filter), each bundle's certificates
//! (leaf first, issuers in issuing order), and that a real HAProxy accepts what certwatch
//! wrote: `haproxy -c` on a configuration loading the crt-list, and a running HAProxy,
//! fed through the runtime API, serving each host's admitted certificate and the default
//! one for every other host.
//!
//! A second `certwatch run` with `--allow-wildcard-routes` and
//! `--disable-namespace-ownership-check` (router name `matrix-permissive`) watches the
//! same routes: rows whose outcome depends on those flags state its outcome too, every
//! other row must come out the same, and after every batch the same checks run on its
//! files and status entries (`haproxy -c` on its crt-list; the running HAProxy is fed by
//! the first daemon only).
//!
//! The table in docs/daemon.md ("The matrix through the binary") is rendered from these
//! rows; the test fails when the two differ.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use common::haproxy::*;
use common::*;
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use route_secrets::route::Route;
use route_secrets::route::admission::{admitted_condition, router_ingress};
use route_secrets::testing::openssl::{self, Fixture};
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki};
use route_secrets::tls::KeyEncoding;

const NAMESPACE: &str = "app-0";
/// A second namespace, for host claims across namespaces.
const OTHER_NAMESPACE: &str = "app-1";
const ROUTER_NAME: &str = "matrix";
/// The router name of the daemon with wildcard routes allowed and the namespace
/// ownership check disabled.
const PERMISSIVE_ROUTER_NAME: &str = "matrix-permissive";

/// The router's reason for access and secret problems, and certwatch's.
const VALIDATION_FAILED: &str = "ExternalCertificateValidationFailed";
/// The router's reason for a certificate or key problem, and certwatch's (route-secrets'
/// `Reason::name`).
const CERTIFICATE_REJECTED: &str = "ExtendedValidationFailed";
const HOST_CLAIMED: &str = "HostAlreadyClaimed";
const WILDCARD_REFUSED: &str = "RouteNotAdmitted";

fn host(route: &str) -> String {
    format!("{route}.matrix.example")
}

/// The DER of each `CERTIFICATE` block of `text`, in order.
fn certificates(text: &[u8]) -> Vec<Vec<u8>> {
    pem::parse_many(text)
        .unwrap()
        .into_iter()
        .filter(|block| block.tag() == "CERTIFICATE")
        .map(|block| block.contents().to_vec())
        .collect()
}

/// What a secret holds.
#[derive(Clone, Debug)]
struct Material {
    secret_type: &'static str,
    crt: String,
    key: String,
    /// The certificates certwatch serves when it admits this, in order.
    served: Vec<Vec<u8>>,
}

impl Material {
    /// A `kubernetes.io/tls` secret with `crt` and `key`, served as `served_pem` says.
    fn tls(crt: impl Into<String>, key: impl Into<String>, served_pem: &str) -> Self {
        Self {
            secret_type: "kubernetes.io/tls",
            crt: crt.into(),
            key: key.into(),
            served: certificates(served_pem.as_bytes()),
        }
    }

    /// An OpenSSL fixture, chain in order.
    fn fixture(fixture: Fixture) -> Self {
        Self::tls(fixture.chain_pem(), fixture.key, &fixture.chain_pem())
    }

    /// The same data in a secret of another type.
    fn typed(mut self, secret_type: &'static str) -> Self {
        self.secret_type = secret_type;
        self
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        testing::tls_data(self.crt.clone(), self.key.clone())
    }

    fn admitted(&self) -> Outcome {
        Outcome::Served {
            certificates: self.served.clone(),
            reason: None,
            words: None,
        }
    }
}

/// What certwatch must show for a route after a step.
#[derive(Clone, Debug)]
enum Outcome {
    /// `Admitted=True` (with this reason, if any, and `words` in the message; without
    /// a reason or words, no message), a crt-list line for the route's SNI, and a
    /// bundle holding these certificates in this order.
    Served {
        certificates: Vec<Vec<u8>>,
        reason: Option<&'static str>,
        words: Option<&'static str>,
    },
    /// `Admitted=False` for `reason`, with `words` in the message; no line, no bundle.
    Rejected {
        reason: &'static str,
        words: &'static str,
    },
    /// `Admitted=True` without a message, served without a certificate of its own
    /// (an edge route without one: the default certificate answers): no line, no
    /// bundle.
    AdmittedWithoutCertificate,
    /// The route is deleted: no line, no bundle.
    Deleted,
}

impl Outcome {
    fn rejected(reason: &'static str, words: &'static str) -> Self {
        Self::Rejected { reason, words }
    }

    /// The same, served with `words` in the status message.
    fn saying(self, words: &'static str) -> Self {
        match self {
            Self::Served {
                certificates,
                reason,
                ..
            } => Self::Served {
                certificates,
                reason,
                words: Some(words),
            },
            other => other,
        }
    }

    /// The certwatch column of the table.
    fn describe(&self) -> String {
        match self {
            Self::Served { reason, words, .. } => {
                let mut text = match reason {
                    None => "admitted, served".to_owned(),
                    Some(reason) => format!("admitted (`{reason}`), served"),
                };
                if let Some(words) = words {
                    text.push_str(&format!("; status message: …{words}…"));
                }
                text
            }
            Self::Rejected { reason, words } => format!("`{reason}`: …{words}…"),
            Self::AdmittedWithoutCertificate => {
                "admitted, no line (the default certificate)".to_owned()
            }
            Self::Deleted => "line and bundle removed".to_owned(),
        }
    }
}

/// A batch of changes, applied together; everything is checked after each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    RouteAdded,
    RouteUpdated,
    RouteDeleted,
    SecretChanged,
    SecretRecreated,
}

impl Step {
    const ALL: [Self; 5] = [
        Self::RouteAdded,
        Self::RouteUpdated,
        Self::RouteDeleted,
        Self::SecretChanged,
        Self::SecretRecreated,
    ];

    fn title(self) -> &'static str {
        match self {
            Self::RouteAdded => "route added",
            Self::RouteUpdated => "route updated",
            Self::RouteDeleted => "route deleted",
            Self::SecretChanged => "secret updated / deleted",
            Self::SecretRecreated => "secret re-created",
        }
    }
}

/// A change made through the API.
#[derive(Clone, Debug)]
enum Action {
    /// Creates the route for host `<route>.matrix.example`; `Some(secret)`: with
    /// `spec.tls.externalCertificate`, `None`: an edge route without a certificate.
    CreateRoute(Option<String>),
    /// Creates the route with this secret, claiming `host` (with `path`), as a wildcard
    /// route (`spec.wildcardPolicy: Subdomain`) when `wildcard`.
    CreateClaim {
        secret: String,
        host: String,
        path: Option<&'static str>,
        wildcard: bool,
    },
    /// Moves the route to another host.
    SetHost(String),
    /// Sets (`Some`) or removes (`None`) the route's `spec.tls.externalCertificate`.
    SetExternalCertificate(Option<String>),
    /// An edit of the route that leaves its certificate reference alone (`spec.path`).
    EditPath,
    DeleteRoute,
    /// Creates or replaces a secret.
    PutSecret(String, Material),
    DeleteSecret(String),
}

/// One row of the matrix: in `step`, `actions` are applied; then the router does
/// `router` and certwatch must show `certwatch` for `route`.
struct Row {
    step: Step,
    /// The case, as the table names it; empty for the set-up of a later row (not shown).
    case: String,
    /// The route's (and its secrets') namespace.
    namespace: &'static str,
    /// The route the row is about; empty for a row that only creates shared secrets.
    route: &'static str,
    actions: Vec<Action>,
    router: &'static str,
    certwatch: Outcome,
    /// The outcome of the daemon with wildcard routes allowed and the namespace
    /// ownership check disabled, with the flag that makes the difference, when it
    /// differs.
    permissive: Option<(&'static str, Outcome)>,
}

/// The table: names, materials and outcomes.
struct Matrix {
    now: Timestamp,
    pki: Pki,
    rows: Vec<Row>,
    /// Secrets the router is not granted.
    denied: Vec<String>,
}

impl Matrix {
    fn new(now: Timestamp) -> Self {
        Self {
            now,
            pki: Pki::new(now),
            rows: Vec::new(),
            denied: Vec::new(),
        }
    }

    fn push(
        &mut self,
        step: Step,
        case: impl Into<String>,
        route: &'static str,
        actions: Vec<Action>,
        router: &'static str,
        certwatch: Outcome,
    ) {
        self.rows.push(Row {
            step,
            case: case.into(),
            namespace: NAMESPACE,
            route,
            actions,
            router,
            certwatch,
            permissive: None,
        });
    }

    /// A route added with its own secret `s-<route>` holding `material`.
    fn added(
        &mut self,
        case: &str,
        route: &'static str,
        material: Material,
        router: &'static str,
        certwatch: Outcome,
    ) {
        let secret = format!("s-{route}");
        self.push(
            Step::RouteAdded,
            case,
            route,
            vec![
                Action::PutSecret(secret.clone(), material),
                Action::CreateRoute(Some(secret)),
            ],
            router,
            certwatch,
        );
    }

    /// A route created in the first step, for a row of a later step.
    fn set_up(&mut self, route: &'static str, secret: Option<&str>, certwatch: Outcome) {
        self.push(
            Step::RouteAdded,
            "",
            route,
            vec![Action::CreateRoute(secret.map(str::to_owned))],
            "",
            certwatch,
        );
    }

    /// A leaf issued by the test PKI (ECDSA P-256 intermediate), with its chain.
    fn issued(&self, spec: LeafSpec) -> Material {
        let leaf = self.pki.issue(&spec);
        Material::tls(leaf.chain_pem(), leaf.key_pem(), &leaf.chain_pem())
    }

    fn spec(&self) -> LeafSpec {
        LeafSpec::new(openssl::HOST, self.now)
    }

    /// Every secret a row uses: namespace and name.
    fn secret_names(&self) -> BTreeSet<(&'static str, String)> {
        self.rows
            .iter()
            .flat_map(|row| {
                row.actions
                    .iter()
                    .map(move |action| (row.namespace, action))
            })
            .filter_map(|(namespace, action)| match action {
                Action::CreateRoute(Some(name))
                | Action::CreateClaim { secret: name, .. }
                | Action::SetExternalCertificate(Some(name))
                | Action::PutSecret(name, _)
                | Action::DeleteSecret(name) => Some((namespace, name.clone())),
                _ => None,
            })
            .collect()
    }

    /// The table as docs/daemon.md shows it.
    fn render(&self) -> String {
        let mut out =
            String::from("| Step | Case | OpenShift router | certwatch |\n|---|---|---|---|\n");
        // In the order the test applies them: by step, then as pushed.
        let shown = Step::ALL.into_iter().flat_map(|step| {
            self.rows
                .iter()
                .filter(move |row| row.step == step && !row.case.is_empty())
        });
        for row in shown {
            let mut certwatch = row.certwatch.describe();
            if let Some((flag, outcome)) = &row.permissive {
                certwatch.push_str(&format!("; with `{flag}`: {}", outcome.describe()));
            }
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                row.step.title(),
                row.case,
                row.router,
                certwatch
            ));
        }
        out
    }
}

const ROUTER_ADMITS: &str = "admitted";
const ROUTER_DENIED: &str = "`ExternalCertificateValidationFailed`: router serviceaccount does not have permission to get this secret";
const ROUTER_MISSING: &str = "`ExternalCertificateValidationFailed`: secrets \"…\" not found";
const ROUTER_WRONG_TYPE: &str =
    "`ExternalCertificateValidationFailed`: secret of type \"kubernetes.io/tls\" required";
const ROUTER_BAD_PEM: &str =
    "`ExtendedValidationFailed`: data does not contain any valid RSA or ECDSA certificates";
const ROUTER_MISMATCH: &str =
    "`ExtendedValidationFailed`: tls: private key does not match public key";
const ROUTER_SHA1: &str =
    "`ExtendedValidationFailed`: router does not support CA-signed certs using SHA1";
const ROUTER_MD5: &str =
    "`ExtendedValidationFailed`: router does not support CA-signed certs using MD5";
const ROUTER_BAD_KEY: &str = "`ExtendedValidationFailed`: block PRIVATE KEY is not valid";
const ROUTER_BAD_CURVE: &str = "`ExtendedValidationFailed`: x509: unsupported elliptic curve";
const ROUTER_ED25519: &str =
    "`ExtendedValidationFailed`: block private key ed25519.PrivateKey is not valid";
const ROUTER_SECRET_DELETED: &str = "`ExternalCertificateValidationFailed`: secrets \"…\" not found (recorded after a passing `ExternalCertificateSecretDeleted`)";
const ROUTER_SECRET_RECREATED: &str =
    "admitted (after a passing `ExternalCertificateSecretRecreated`)";
const ROUTER_NOT_EXTERNAL: &str =
    "admitted, with the router's default certificate (no external certificate)";
const ROUTER_DELETED: &str = "route removed";

fn matrix(now: Timestamp) -> Matrix {
    use Action::*;
    use Step::*;
    let mut m = Matrix::new(now);
    let rsa = Material::fixture(openssl::LEAF_RSA_2048);
    let valid_b = m.issued(m.spec());
    let sha1 = Material::fixture(openssl::LEAF_SHA1);
    let bad_pem = Material::tls(testing::NOT_PEM_TEXT, openssl::LEAF_RSA_2048.key, "");
    let served = |material: &Material| material.admitted();
    let certificate = |words| Outcome::rejected(CERTIFICATE_REJECTED, words);
    let denied = Outcome::rejected(VALIDATION_FAILED, "is not allowed to");
    let missing = Outcome::rejected(VALIDATION_FAILED, "does not exist");
    let sha1_rejected = certificate("CA-signed using SHA-1");
    let bad_pem_rejected = certificate("contains no CERTIFICATE block");
    let default_certificate = Outcome::AdmittedWithoutCertificate;

    // Secrets several rows share: `s-valid`, `s-valid-b`, `s-sha1`, `s-bad-pem`,
    // `s-opaque` (valid data in a secret of type Opaque), and `s-denied` (valid, but the
    // router may not read it); `s-missing` never exists.
    let opaque = rsa.clone().typed("Opaque");
    let wrong_type = Outcome::rejected(VALIDATION_FAILED, "expected \"kubernetes.io/tls\"");
    for (name, material) in [
        ("s-valid", &rsa),
        ("s-valid-b", &valid_b),
        ("s-sha1", &sha1),
        ("s-bad-pem", &bad_pem),
        ("s-opaque", &opaque),
        ("s-denied", &rsa),
    ] {
        m.push(
            RouteAdded,
            "",
            "",
            vec![PutSecret(name.to_owned(), material.clone())],
            "",
            default_certificate.clone(),
        );
    }
    m.denied.push("s-denied".to_owned());

    // Route added.
    let added = |m: &mut Matrix, case, route, secret: &str, router, outcome| {
        m.push(
            RouteAdded,
            case,
            route,
            vec![CreateRoute(Some(secret.to_owned()))],
            router,
            outcome,
        );
    };
    added(
        &mut m,
        "valid (RSA 2048, chain in order)",
        "a-valid",
        "s-valid",
        ROUTER_ADMITS,
        served(&rsa),
    );
    added(
        &mut m,
        "the router may not read the secret",
        "a-denied",
        "s-denied",
        ROUTER_DENIED,
        denied.clone(),
    );
    added(
        &mut m,
        "secret not found",
        "a-missing",
        "s-missing",
        ROUTER_MISSING,
        missing.clone(),
    );
    m.added(
        "secret of type Opaque",
        "a-opaque",
        opaque.clone(),
        ROUTER_WRONG_TYPE,
        wrong_type.clone(),
    );
    added(
        &mut m,
        "bad PEM (no certificate)",
        "a-bad-pem",
        "s-bad-pem",
        ROUTER_BAD_PEM,
        bad_pem_rejected.clone(),
    );
    m.added(
        "key of another certificate",
        "a-mismatch",
        Material::tls(
            openssl::LEAF_RSA_2048.chain_pem(),
            openssl::KEY_RSA_2048_B,
            "",
        ),
        ROUTER_MISMATCH,
        certificate("is not the private key of the first certificate"),
    );
    added(
        &mut m,
        "CA-signed with SHA-1",
        "a-sha1",
        "s-sha1",
        ROUTER_SHA1,
        sha1_rejected.clone(),
    );
    m.added(
        "CA-signed with MD5",
        "a-md5",
        Material::fixture(openssl::LEAF_MD5),
        ROUTER_MD5,
        certificate("CA-signed using MD5"),
    );
    let self_signed_sha1 = Material::fixture(openssl::SELF_SIGNED_SHA1);
    m.added(
        "self-signed with SHA-1",
        "a-self-sha1",
        self_signed_sha1.clone(),
        ROUTER_ADMITS,
        served(&self_signed_sha1),
    );
    // Served, as by the router, and the status message says why clients refuse them.
    let expired = m.issued(m.spec().expired(now));
    let served_expired = served(&expired).saying("expired at");
    m.added(
        "expired",
        "a-expired",
        expired.clone(),
        ROUTER_ADMITS,
        served_expired.clone(),
    );
    let not_yet_valid = m.issued(m.spec().not_yet_valid(now));
    m.added(
        "not yet valid",
        "a-not-yet-valid",
        not_yet_valid.clone(),
        ROUTER_ADMITS,
        served(&not_yet_valid).saying("is not valid before"),
    );
    let leaf = m.pki.issue(&m.spec());
    let reordered = Material::tls(
        leaf.root_before_intermediate_pem(),
        leaf.key_pem(),
        &leaf.full_chain_pem(),
    );
    m.added(
        "chain out of order (leaf, root, intermediate): served leaf, intermediate, root",
        "a-out-of-order",
        reordered.clone(),
        ROUTER_ADMITS,
        served(&reordered),
    );
    let reversed = Material::tls(leaf.reversed_chain_pem(), leaf.key_pem(), "");
    m.added(
        "chain reversed (intermediate first)",
        "a-reversed",
        reversed,
        ROUTER_MISMATCH,
        certificate("is not the private key of the first certificate"),
    );

    // Route added: each key type and size.
    let pkcs1 = Material::tls(
        openssl::LEAF_RSA_2048.chain_pem(),
        openssl::LEAF_RSA_2048.key_as(KeyEncoding::Pkcs1),
        &openssl::LEAF_RSA_2048.chain_pem(),
    );
    m.added(
        "RSA 2048 (PKCS#1)",
        "k-rsa-2048-pkcs1",
        pkcs1.clone(),
        ROUTER_ADMITS,
        served(&pkcs1),
    );
    for (case, route, fixture) in [
        ("RSA 3072", "k-rsa-3072", openssl::LEAF_RSA_3072),
        ("RSA 4096", "k-rsa-4096", openssl::LEAF_RSA_4096),
        (
            "ECDSA P-224 (chosen only for TLS 1.2 clients that offer P-224)",
            "k-ec-p224",
            openssl::LEAF_EC_P224,
        ),
        ("ECDSA P-521", "k-ec-p521", openssl::LEAF_EC_P521),
    ] {
        let material = Material::fixture(fixture);
        m.added(
            case,
            route,
            material.clone(),
            ROUTER_ADMITS,
            served(&material),
        );
    }
    for (case, route, kind) in [
        ("ECDSA P-256 (PKCS#8)", "k-ec-p256", KeyKind::EcdsaP256Pkcs8),
        (
            "ECDSA P-384 (SEC1)",
            "k-ec-p384-sec1",
            KeyKind::EcdsaP384Sec1,
        ),
    ] {
        let material = m.issued(m.spec().key(kind));
        m.added(
            case,
            route,
            material.clone(),
            ROUTER_ADMITS,
            served(&material),
        );
    }
    m.added(
        "RSA 1024 (HAProxy refuses it, and the whole crt-list with it)",
        "k-rsa-1024",
        Material::fixture(openssl::LEAF_RSA_1024),
        ROUTER_ADMITS,
        certificate("HAProxy refuses to load"),
    );
    m.added(
        "Ed25519",
        "k-ed25519",
        Material::fixture(openssl::LEAF_ED25519),
        ROUTER_ED25519,
        certificate("unsupported key"),
    );
    m.added(
        "Ed448",
        "k-ed448",
        Material::fixture(openssl::LEAF_ED448),
        ROUTER_BAD_KEY,
        certificate("unsupported key"),
    );
    m.added(
        "DSA 2048",
        "k-dsa",
        Material::fixture(openssl::LEAF_DSA),
        ROUTER_BAD_KEY,
        certificate("unsupported key"),
    );
    m.added(
        "ECDSA secp256k1",
        "k-ec-secp256k1",
        Material::fixture(openssl::LEAF_EC_SECP256K1),
        ROUTER_BAD_CURVE,
        certificate("the router cannot read"),
    );
    m.added(
        "RSA 1024 intermediate (HAProxy refuses it)",
        "k-rsa-1024-intermediate",
        Material::fixture(openssl::LEAF_UNDER_RSA_1024),
        ROUTER_ADMITS,
        certificate("HAProxy refuses to load"),
    );
    m.added(
        "CA-signed with RSASSA-PSS and SHA-1 (Go cannot read it; HAProxy refuses it)",
        "a-pss-sha1",
        Material::fixture(openssl::LEAF_PSS_SHA1),
        ROUTER_ADMITS,
        certificate("CA-signed using SHA-1"),
    );
    m.added(
        "encrypted key (PKCS#8)",
        "k-encrypted",
        Material::tls(
            openssl::LEAF_RSA_2048.chain_pem(),
            testing::ENCRYPTED_PKCS8_KEY_PEM,
            "",
        ),
        "`ExtendedValidationFailed`: unrecognized PEM block ENCRYPTED PRIVATE KEY",
        certificate("unsupported key"),
    );
    m.added(
        "empty tls.crt (the router serves its default certificate for the host)",
        "a-empty-crt",
        Material::tls("", openssl::LEAF_RSA_2048.key, ""),
        ROUTER_ADMITS,
        Outcome::AdmittedWithoutCertificate,
    );

    // Route updated: none→ext, with each target outcome.
    for (route, secret, router, outcome) in [
        ("u-none-valid", "s-valid", ROUTER_ADMITS, served(&rsa)),
        ("u-none-sha1", "s-sha1", ROUTER_SHA1, sha1_rejected.clone()),
        (
            "u-none-bad-pem",
            "s-bad-pem",
            ROUTER_BAD_PEM,
            bad_pem_rejected.clone(),
        ),
        (
            "u-none-opaque",
            "s-opaque",
            ROUTER_WRONG_TYPE,
            wrong_type.clone(),
        ),
        (
            "u-none-missing",
            "s-missing",
            ROUTER_MISSING,
            missing.clone(),
        ),
        ("u-none-denied", "s-denied", ROUTER_DENIED, denied.clone()),
    ] {
        m.set_up(route, None, default_certificate.clone());
        m.push(
            RouteUpdated,
            format!("none→ext (`{secret}`)"),
            route,
            vec![SetExternalCertificate(Some(secret.to_owned()))],
            router,
            outcome,
        );
    }
    // none→none.
    m.set_up("u-none-none", None, default_certificate.clone());
    m.push(
        RouteUpdated,
        "none→none (path edited)",
        "u-none-none",
        vec![EditPath],
        ROUTER_NOT_EXTERNAL,
        default_certificate.clone(),
    );
    // ext→same: an edit that keeps the secret re-checks it, and keeps the outcome.
    for (route, secret, router, outcome) in [
        ("u-same-valid", "s-valid", ROUTER_ADMITS, served(&rsa)),
        ("u-same-sha1", "s-sha1", ROUTER_SHA1, sha1_rejected.clone()),
        (
            "u-same-missing",
            "s-missing",
            ROUTER_MISSING,
            missing.clone(),
        ),
        ("u-same-denied", "s-denied", ROUTER_DENIED, denied.clone()),
    ] {
        m.set_up(route, Some(secret), outcome.clone());
        m.push(
            RouteUpdated,
            format!("ext→same (`{secret}`, path edited)"),
            route,
            vec![EditPath],
            router,
            outcome,
        );
    }
    // ext→other, from an admitted route to each target outcome, and from rejected ones.
    for (route, secret, router, outcome) in [
        (
            "u-valid-valid-b",
            "s-valid-b",
            ROUTER_ADMITS,
            served(&valid_b),
        ),
        ("u-valid-sha1", "s-sha1", ROUTER_SHA1, sha1_rejected.clone()),
        (
            "u-valid-bad-pem",
            "s-bad-pem",
            ROUTER_BAD_PEM,
            bad_pem_rejected.clone(),
        ),
        (
            "u-valid-missing",
            "s-missing",
            ROUTER_MISSING,
            missing.clone(),
        ),
        (
            "u-valid-opaque",
            "s-opaque",
            ROUTER_WRONG_TYPE,
            wrong_type.clone(),
        ),
        ("u-valid-denied", "s-denied", ROUTER_DENIED, denied.clone()),
    ] {
        m.set_up(route, Some("s-valid"), served(&rsa));
        m.push(
            RouteUpdated,
            format!("ext→other (`s-valid` → `{secret}`)"),
            route,
            vec![SetExternalCertificate(Some(secret.to_owned()))],
            router,
            outcome,
        );
    }
    for (route, from, from_outcome) in [
        ("u-bad-pem-valid", "s-bad-pem", bad_pem_rejected.clone()),
        ("u-missing-valid", "s-missing", missing.clone()),
        ("u-denied-valid", "s-denied", denied.clone()),
    ] {
        m.set_up(route, Some(from), from_outcome);
        m.push(
            RouteUpdated,
            format!("ext→other (`{from}` → `s-valid`)"),
            route,
            vec![SetExternalCertificate(Some("s-valid".to_owned()))],
            ROUTER_ADMITS,
            served(&rsa),
        );
    }
    // ext→none.
    m.set_up("u-valid-none", Some("s-valid"), served(&rsa));
    m.push(
        RouteUpdated,
        "ext→none (was admitted)",
        "u-valid-none",
        vec![SetExternalCertificate(None)],
        ROUTER_NOT_EXTERNAL,
        default_certificate.clone(),
    );
    m.set_up("u-sha1-none", Some("s-sha1"), sha1_rejected.clone());
    m.push(
        RouteUpdated,
        "ext→none (was rejected)",
        "u-sha1-none",
        vec![SetExternalCertificate(None)],
        ROUTER_NOT_EXTERNAL,
        default_certificate.clone(),
    );

    // Route deleted.
    m.set_up("d-valid", Some("s-valid"), served(&rsa));
    m.push(
        RouteDeleted,
        "admitted route deleted",
        "d-valid",
        vec![DeleteRoute],
        ROUTER_DELETED,
        Outcome::Deleted,
    );
    m.set_up("d-sha1", Some("s-sha1"), sha1_rejected.clone());
    m.push(
        RouteDeleted,
        "rejected route deleted",
        "d-sha1",
        vec![DeleteRoute],
        ROUTER_DELETED,
        Outcome::Deleted,
    );

    // Secret updated, deleted, re-created (each route with its own secret).
    let rotated = m.issued(m.spec());
    for (case, route, before, after, router, outcome) in [
        (
            "secret updated (valid → another valid)",
            "x-rotate",
            (&rsa, served(&rsa)),
            &rotated,
            ROUTER_ADMITS,
            served(&rotated),
        ),
        (
            "secret updated (valid → SHA-1 CA-signed)",
            "x-valid-sha1",
            (&rsa, served(&rsa)),
            &sha1,
            ROUTER_SHA1,
            sha1_rejected.clone(),
        ),
        (
            "secret updated (bad PEM → valid)",
            "x-bad-pem-valid",
            (&bad_pem, bad_pem_rejected.clone()),
            &rsa,
            ROUTER_ADMITS,
            served(&rsa),
        ),
        (
            "secret updated (SHA-1 CA-signed → expired)",
            "x-sha1-expired",
            (&sha1, sha1_rejected.clone()),
            &expired,
            ROUTER_ADMITS,
            served_expired.clone(),
        ),
    ] {
        let secret = format!("s-{route}");
        let (before, before_outcome) = before;
        // Set-up: the route with its own secret as it is before the step.
        m.added("", route, before.clone(), "", before_outcome);
        m.push(
            SecretChanged,
            case,
            route,
            vec![PutSecret(secret, after.clone())],
            router,
            outcome,
        );
    }
    for route in ["x-deleted", "x-recreated"] {
        let secret = format!("s-{route}");
        m.added("", route, rsa.clone(), "", served(&rsa));
        m.push(
            SecretChanged,
            if route == "x-deleted" {
                "secret deleted"
            } else {
                ""
            },
            route,
            vec![DeleteSecret(secret)],
            ROUTER_SECRET_DELETED,
            missing.clone(),
        );
    }
    m.push(
        SecretRecreated,
        "secret re-created (another certificate)",
        "x-recreated",
        vec![PutSecret("s-x-recreated".to_owned(), rotated.clone())],
        ROUTER_SECRET_RECREATED,
        served(&rotated),
    );
    host_claims_and_wildcards(&mut m, &rsa, &valid_b);
    m
}

const ROUTER_SAME_PATH: &str = "`HostAlreadyClaimed`: route … already exposes … and is older";
const ROUTER_OTHER_NAMESPACE: &str =
    "`HostAlreadyClaimed`: a route in another namespace holds … and is older than …";
const ROUTER_TAKES_OVER: &str = "admitted (activated when the older claim goes)";
const DISABLE_OWNERSHIP: &str = "--disable-namespace-ownership-check";

/// Host claims (openshift/router `unique_host.go`: the oldest claim wins, by creation
/// time, then uid; a host belongs to the namespace of its oldest claim
/// unless the ownership check is disabled; a refused claimant takes over when the
/// older claim goes) and wildcard routes. Routes that claim one host are created in one
/// batch, the older one first, each claim in a later second than the route before it
/// (within one second the order is the routes' uids).
fn host_claims_and_wildcards(m: &mut Matrix, rsa: &Material, valid_b: &Material) {
    use Action::*;
    use Step::*;
    let served = |material: &Material| material.admitted();
    let same_path = Outcome::rejected(HOST_CLAIMED, "is already served by the older route");
    let foreign = Outcome::rejected(HOST_CLAIMED, "belongs to namespace app-0");
    let claim = |secret: &str, host: &str, path| CreateClaim {
        secret: secret.to_owned(),
        host: host.to_owned(),
        path,
        wildcard: false,
    };
    let shared = host("h-owner");
    let mut row = |step, case: &str, namespace, route, actions, router, certwatch, permissive| {
        m.rows.push(Row {
            step,
            case: case.to_owned(),
            namespace,
            route,
            actions,
            router,
            certwatch,
            permissive,
        });
    };

    // One host, claimed five times.
    row(
        RouteAdded,
        "host claimed twice: the older route",
        NAMESPACE,
        "h-owner",
        vec![CreateRoute(Some("s-valid".to_owned()))],
        ROUTER_ADMITS,
        served(rsa),
        None,
    );
    row(
        RouteAdded,
        "host claimed twice: the younger route (same namespace, same path)",
        NAMESPACE,
        "h-same-path",
        vec![claim("s-valid-b", &shared, None)],
        ROUTER_SAME_PATH,
        same_path.clone(),
        None,
    );
    row(
        RouteAdded,
        "the same host with another path, same namespace",
        NAMESPACE,
        "h-other-path",
        vec![claim("s-valid", &shared, Some("/other"))],
        ROUTER_ADMITS,
        served(rsa),
        None,
    );
    let foreign_secret = |route: &str| PutSecret(format!("s-{route}"), rsa.clone());
    row(
        RouteAdded,
        "the same host with another path, from another namespace",
        OTHER_NAMESPACE,
        "h-foreign-path",
        vec![
            foreign_secret("h-foreign-path"),
            claim("s-h-foreign-path", &shared, Some("/foreign")),
        ],
        "`HostAlreadyClaimed`: a route in another namespace holds … and is older than …; \
         with `ROUTER_DISABLE_NAMESPACE_OWNERSHIP_CHECK`: admitted",
        foreign.clone(),
        Some((DISABLE_OWNERSHIP, served(rsa))),
    );
    row(
        RouteAdded,
        "the same host and path, from another namespace",
        OTHER_NAMESPACE,
        "h-foreign-same-path",
        vec![
            foreign_secret("h-foreign-same-path"),
            claim("s-h-foreign-same-path", &shared, None),
        ],
        ROUTER_OTHER_NAMESPACE,
        foreign,
        Some((DISABLE_OWNERSHIP, same_path.clone())),
    );

    // A refused claimant takes over when the older route moves away or is deleted.
    for (owner, claimant, step) in [
        ("h-move-a-owner", "h-move-b-claimant", RouteUpdated),
        ("h-gone-a-owner", "h-gone-b-claimant", RouteDeleted),
    ] {
        let contested = host(owner);
        row(
            RouteAdded,
            "",
            NAMESPACE,
            owner,
            vec![CreateRoute(Some("s-valid".to_owned()))],
            "",
            served(rsa),
            None,
        );
        row(
            RouteAdded,
            "",
            NAMESPACE,
            claimant,
            vec![claim("s-valid-b", &contested, None)],
            "",
            same_path.clone(),
            None,
        );
        let (case, owner_action, owner_outcome) = if step == RouteUpdated {
            (
                "host claimed twice: the younger route, once the older one changes host",
                SetHost(host(&format!("{owner}-moved"))),
                served(rsa),
            )
        } else {
            (
                "host claimed twice: the younger route, once the older one is deleted",
                DeleteRoute,
                Outcome::Deleted,
            )
        };
        row(
            step,
            "",
            NAMESPACE,
            owner,
            vec![owner_action],
            "",
            owner_outcome,
            None,
        );
        row(
            step,
            case,
            NAMESPACE,
            claimant,
            vec![],
            ROUTER_TAKES_OVER,
            served(valid_b),
            None,
        );
    }

    // Wildcard routes.
    row(
        RouteAdded,
        "wildcardPolicy Subdomain (host `www.w-wild.matrix.example`; where allowed, served for \
         `*.w-wild.matrix.example`)",
        NAMESPACE,
        "w-wild",
        vec![
            PutSecret("s-w-wild".to_owned(), rsa.clone()),
            CreateClaim {
                secret: "s-w-wild".to_owned(),
                host: "www.w-wild.matrix.example".to_owned(),
                path: None,
                wildcard: true,
            },
        ],
        "`RouteNotAdmitted`: wildcard routes are not allowed; with \
         `ROUTER_ALLOW_WILDCARD_ROUTES`: admitted, served for `*.w-wild.matrix.example`",
        Outcome::rejected(WILDCARD_REFUSED, "wildcard routes are not allowed"),
        Some(("--allow-wildcard-routes", served(rsa))),
    );
}

/// A route, by namespace and name.
type RouteId = (&'static str, &'static str);

/// Where a route is served: its host, and whether it is a wildcard route.
#[derive(Clone, Debug)]
struct Claimed {
    host: String,
    wildcard: bool,
}

impl Claimed {
    /// The crt-list SNI filter of the route when served: its host, or `*.<domain>` for a
    /// wildcard route.
    fn sni(&self) -> String {
        match (self.wildcard, self.host.split_once('.')) {
            (true, Some((_, domain))) => format!("*.{domain}"),
            _ => self.host.clone(),
        }
    }
}

/// What each route must show after a step, for either daemon.
#[derive(Clone, Debug)]
struct Expected {
    certwatch: Outcome,
    permissive: Outcome,
}

/// One `certwatch run` and where it writes.
struct Daemon {
    certwatch: Certwatch,
    router_name: &'static str,
    cert_dir: std::path::PathBuf,
    haproxy_config: std::path::PathBuf,
    /// Runs with `--allow-wildcard-routes --disable-namespace-ownership-check`.
    permissive: bool,
}

impl Daemon {
    fn outcome<'a>(&self, expected: &'a Expected) -> &'a Outcome {
        if self.permissive {
            &expected.permissive
        } else {
            &expected.certwatch
        }
    }
}

/// The routes the simulator generated (one per namespace), served by both daemons.
fn generated_routes() -> [(String, String); 2] {
    [NAMESPACE, OTHER_NAMESPACE].map(|namespace| {
        let index = if namespace == NAMESPACE { 0 } else { 1 };
        (
            link(namespace, &format!("route-{index}")),
            format!("route-{index}.{namespace}.apps.sim.example"),
        )
    })
}

/// The API and the running HAProxy the checks look at.
struct World {
    admin: kube::Client,
    haproxy_port: u16,
    default_leaf: Vec<u8>,
    /// Each route's host, as the actions so far set it.
    claimed: BTreeMap<RouteId, Claimed>,
    /// The second (Unix time) the last route was created in.
    last_created: u64,
}

fn unix_second() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl World {
    async fn apply(&mut self, (namespace, route): RouteId, action: &Action) {
        let routes = Api::<Route>::namespaced(self.admin.clone(), namespace);
        let secrets = Api::<Secret>::namespaced(self.admin.clone(), namespace);
        let patch_route = |patch: serde_json::Value| {
            let routes = routes.clone();
            let route = route.to_owned();
            async move {
                routes
                    .patch(&route, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        };
        let create = |secret: Option<&String>, claimed: &Claimed, path: Option<&str>| {
            let mut tls = serde_json::json!({"termination": "edge"});
            if let Some(secret) = secret {
                tls["externalCertificate"] = serde_json::json!({"name": secret});
            }
            let mut spec = serde_json::json!({
                "host": claimed.host,
                "to": {"kind": "Service", "name": "backend"},
                "tls": tls,
            });
            if let Some(path) = path {
                spec["path"] = serde_json::json!(path);
            }
            if claimed.wildcard {
                spec["wildcardPolicy"] = serde_json::json!("Subdomain");
            }
            let route: Route = serde_json::from_value(serde_json::json!({
                "apiVersion": "route.openshift.io/v1",
                "kind": "Route",
                "metadata": {"name": route, "namespace": namespace},
                "spec": spec,
            }))
            .unwrap();
            let routes = routes.clone();
            async move {
                routes.create(&PostParams::default(), &route).await.unwrap();
            }
        };
        match action {
            Action::CreateRoute(secret) => {
                let claimed = Claimed {
                    host: host(route),
                    wildcard: false,
                };
                create(secret.as_ref(), &claimed, None).await;
                self.last_created = unix_second();
                self.claimed.insert((namespace, route), claimed);
            }
            Action::CreateClaim {
                secret,
                host,
                path,
                wildcard,
            } => {
                let claimed = Claimed {
                    host: host.clone(),
                    wildcard: *wildcard,
                };
                // A claim is younger than every route created before it: in a later
                // second, since within one second the router (and certwatch) order
                // routes by their uids, which are random.
                while unix_second() <= self.last_created {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                create(Some(secret), &claimed, *path).await;
                self.last_created = unix_second();
                self.claimed.insert((namespace, route), claimed);
            }
            Action::SetHost(host) => {
                patch_route(serde_json::json!({"spec": {"host": host}})).await;
                if let Some(claimed) = self.claimed.get_mut(&(namespace, route)) {
                    claimed.host = host.clone();
                }
            }
            Action::SetExternalCertificate(secret) => {
                let reference = secret
                    .as_ref()
                    .map(|name| serde_json::json!({"name": name}));
                patch_route(
                    serde_json::json!({"spec": {"tls": {"externalCertificate": reference}}}),
                )
                .await;
            }
            Action::EditPath => patch_route(serde_json::json!({"spec": {"path": "/edited"}})).await,
            Action::DeleteRoute => {
                routes
                    .delete(route, &DeleteParams::default())
                    .await
                    .unwrap();
            }
            Action::PutSecret(name, material) => {
                if secrets.get_opt(name).await.unwrap().is_some() {
                    let patch = serde_json::json!({"data": material.data()});
                    secrets
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                } else {
                    let mut secret = Secret {
                        data: Some(material.data()),
                        type_: Some(material.secret_type.to_owned()),
                        ..Secret::default()
                    };
                    secret.metadata.name = Some(name.clone());
                    secrets
                        .create(&PostParams::default(), &secret)
                        .await
                        .unwrap();
                }
            }
            Action::DeleteSecret(name) => {
                secrets
                    .delete(name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
    }

    fn claimed(&self, id: &RouteId) -> &Claimed {
        self.claimed
            .get(id)
            .expect("every route of a row was created")
    }

    /// What differs from `expected` in `daemon`'s status entries, crt-list and bundles.
    async fn differences(
        &self,
        daemon: &Daemon,
        expected: &BTreeMap<RouteId, Expected>,
    ) -> Vec<String> {
        let mut differences = Vec::new();
        let listed: BTreeSet<(String, String)> = crt_list(&daemon.cert_dir).into_iter().collect();
        let mut wanted: BTreeSet<(String, String)> = expected
            .iter()
            .filter(|(_, expected)| matches!(daemon.outcome(expected), Outcome::Served { .. }))
            .map(|(id, _)| (link(id.0, id.1), self.claimed(id).sni()))
            .collect();
        wanted.extend(generated_routes());
        if listed != wanted {
            differences.push(format!(
                "crt-list: missing {:?}, unexpected {:?}",
                wanted.difference(&listed).collect::<Vec<_>>(),
                listed.difference(&wanted).collect::<Vec<_>>()
            ));
        }
        let routes: BTreeMap<(String, String), Route> = Api::<Route>::all(self.admin.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|route| {
                let id = (
                    route.metadata.namespace.clone().unwrap_or_default(),
                    route.metadata.name.clone().unwrap_or_default(),
                );
                (id, route)
            })
            .collect();
        for (id, expected) in expected {
            let (namespace, name) = *id;
            let outcome = daemon.outcome(expected);
            let links = daemon.cert_dir.join("links");
            let bundle = std::fs::read(links.join(link(namespace, name))).ok();
            let on_disk = daemon
                .cert_dir
                .join(format!("{namespace}:{name}.pem"))
                .exists();
            let route = routes.get(&(namespace.to_owned(), name.to_owned()));
            let condition = route
                .and_then(|route| router_ingress(route, daemon.router_name))
                .and_then(admitted_condition);
            let status = condition.map(|condition| condition.status.as_str() == "True");
            let reason = condition
                .and_then(|condition| condition.reason.as_deref())
                .filter(|reason| !reason.is_empty());
            let message = condition
                .and_then(|condition| condition.message.as_deref())
                .unwrap_or("");
            let problem = match outcome {
                Outcome::Served {
                    certificates: chain,
                    reason: wanted,
                    words,
                } => {
                    let message_as_wanted = match (wanted, words) {
                        (_, Some(words)) => message.contains(words),
                        (None, None) => message.is_empty(),
                        (Some(_), None) => true,
                    };
                    if status != Some(true) || reason != *wanted || !message_as_wanted {
                        Some(format!("status {status:?} {reason:?} {message:?}"))
                    } else if bundle.as_deref().map(certificates).as_ref() != Some(chain) {
                        Some("bundle missing or with other certificates".to_owned())
                    } else {
                        None
                    }
                }
                Outcome::Rejected {
                    reason: wanted,
                    words,
                } => {
                    if status != Some(false) || reason != Some(*wanted) || !message.contains(words)
                    {
                        Some(format!("status {status:?} {reason:?} {message:?}"))
                    } else {
                        None
                    }
                }
                Outcome::AdmittedWithoutCertificate => {
                    (status != Some(true) || reason.is_some() || !message.is_empty())
                        .then(|| format!("status {status:?} {reason:?} {message:?}"))
                }
                Outcome::Deleted => route.is_some().then(|| "route still exists".to_owned()),
            };
            if let Some(problem) = problem {
                differences.push(format!("{namespace}/{name}: {problem}"));
            }
            let served = matches!(outcome, Outcome::Served { .. });
            if !served && (bundle.is_some() || on_disk) {
                differences.push(format!("{namespace}/{name}: a bundle is on disk"));
            }
        }
        differences
    }

    /// Hosts the running HAProxy (fed by `daemon`) does not serve as expected: each
    /// host with an admitted route presents that route's leaf (routes sharing a host
    /// share a certificate in the matrix), every other host the default certificate.
    fn served_differently(
        &self,
        daemon: &Daemon,
        expected: &BTreeMap<RouteId, Expected>,
    ) -> Vec<String> {
        let mut wanted: BTreeMap<&str, &Vec<u8>> = BTreeMap::new();
        for (id, expected) in expected {
            let host = self.claimed(id).host.as_str();
            let leaf = match daemon.outcome(expected) {
                Outcome::Served { certificates, .. } => &certificates[0],
                _ => &self.default_leaf,
            };
            let entry = wanted.entry(host).or_insert(leaf);
            if *entry == &self.default_leaf {
                *entry = leaf;
            }
        }
        wanted
            .into_iter()
            .filter(|(host, leaf)| {
                presented_to_openssl(self.haproxy_port, host).as_ref() != Some(*leaf)
            })
            .map(|(host, _)| format!("{host}: HAProxy presents another certificate"))
            .collect()
    }
}

fn link(namespace: &str, route: &str) -> String {
    format!("{namespace}_{route}.pem")
}

/// Polls `differences` until it is empty; fails with the last list otherwise.
async fn settle<F: std::future::Future<Output = Vec<String>>>(
    what: &str,
    mut differences: impl FnMut() -> F,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = differences().await;
        if found.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", found.join("\n"));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn docs_daemon_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/daemon.md");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn docs_show_the_matrix() {
    let table = matrix(Timestamp::now()).render();
    assert!(
        docs_daemon_md().contains(&table),
        "docs/daemon.md must show the matrix as the test runs it:\n{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_matrix_through_the_binary() {
    let now = Timestamp::now();
    let matrix = matrix(now);
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    // One generated route (and the router's role) in each namespace.
    let sim = SimProcess::start(&root, &["--generate", "routes=2,namespaces=2"]);
    let admin = sim.client("admin").await;
    for (namespace, secret) in matrix.secret_names() {
        if !matrix.denied.contains(&secret) {
            grant_secret(&admin, namespace, &secret).await;
        }
    }
    let socket = root.join("haproxy.sock");
    let socket_arg = socket.display().to_string();
    let start = |name: &'static str, flags: &[&str]| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let cert_dir = dir.join("certs");
        // The HAProxy the matrix runs is Debian's, at its OpenSSL's default security
        // level (2): certwatch is told so.
        let mut args = vec![
            "--write-status",
            "--router-name",
            name,
            "--access-denied-ttl",
            "500ms",
            "--openssl-security-level",
            "2",
        ];
        args.extend(flags);
        let certwatch = Certwatch::start(
            &sim.kubeconfig,
            &cert_dir,
            &dir.join("certwatch.log"),
            &args,
        );
        let (haproxy_config, _, _) = haproxy_config(&dir, &dir.join("haproxy.sock"), &cert_dir);
        Daemon {
            certwatch,
            router_name: name,
            cert_dir,
            haproxy_config,
            permissive: name == PERMISSIVE_ROUTER_NAME,
        }
    };
    let daemon = start(ROUTER_NAME, &["--haproxy-socket", &socket_arg]);
    let permissive = start(
        PERMISSIVE_ROUTER_NAME,
        &[
            "--allow-wildcard-routes",
            "--disable-namespace-ownership-check",
        ],
    );
    let daemons = [&daemon, &permissive];
    for daemon in daemons {
        daemon.certwatch.wait_files_ready().await;
    }
    let (_haproxy, haproxy_port, default_leaf) = start_haproxy(&root, &socket, &daemon.cert_dir);
    eventually_async("HAProxy to serve TLS", || {
        presented(haproxy_port, "default.invalid")
    })
    .await;
    // Ready once HAProxy serves every route present at start-up.
    daemon.certwatch.wait_ready().await;
    let mut world = World {
        admin,
        haproxy_port,
        default_leaf,
        claimed: BTreeMap::new(),
        last_created: 0,
    };

    let mut expected: BTreeMap<RouteId, Expected> = BTreeMap::new();
    for step in Step::ALL {
        for row in matrix.rows.iter().filter(|row| row.step == step) {
            for action in &row.actions {
                world.apply((row.namespace, row.route), action).await;
            }
            if !row.route.is_empty() {
                let permissive = row.permissive.as_ref().map(|(_, outcome)| outcome);
                expected.insert(
                    (row.namespace, row.route),
                    Expected {
                        certwatch: row.certwatch.clone(),
                        permissive: permissive.unwrap_or(&row.certwatch).clone(),
                    },
                );
            }
        }
        for daemon in daemons {
            let title = format!("{} ({})", step.title(), daemon.router_name);
            settle(&format!("{title}: status, crt-list and bundles"), || {
                world.differences(daemon, &expected)
            })
            .await;
            haproxy_check(&daemon.haproxy_config)
                .unwrap_or_else(|error| panic!("{title}: haproxy -c refused:\n{error}"));
            let served = expected
                .values()
                .filter(|expected| {
                    matches!(
                        daemon.outcome(expected),
                        Outcome::Served { .. } | Outcome::AdmittedWithoutCertificate
                    )
                })
                .count();
            let generated = generated_routes().len();
            eventually(&format!("{title}: routes admitted in the metrics"), || {
                (daemon.certwatch.metric("certwatch_routes_admitted")
                    == Some((served + generated) as f64))
                .then_some(())
            })
            .await;
        }
        settle(
            &format!("{}: the running HAProxy", step.title()),
            || async { world.served_differently(&daemon, &expected) },
        )
        .await;
        let metrics = daemon.certwatch.metrics();
        assert_eq!(
            errors_besides_show_info(&metrics),
            0,
            "{}\n{metrics}",
            step.title()
        );
        if step == Step::RouteAdded {
            // Served although expired, and the expiry metric says so.
            let not_after = daemon
                .certwatch
                .metric("certwatch_certificate_expiration_timestamp_seconds{route_namespace=\"app-0\",route=\"a-expired\",secret=\"s-a-expired\"}")
                .unwrap();
            assert!(not_after < now.as_second() as f64, "{not_after}");
        }
    }
    assert_eq!(
        daemon.certwatch.metric("certwatch_haproxy_in_sync"),
        Some(1.0)
    );
}
