//! The OpenShift router's admission matrix, through the real binary.
//!
//! One `certwatch run` (with `--write-status` and `--haproxy-socket`) against
//! `certwatch sim`, many routes, and a table of rows applied in batches: routes added
//! with every kind of secret, routes updated (none→ext, ext→same, ext→other, ext→none,
//! none→none), routes deleted, secrets updated, deleted and re-created. Each row states
//! what the router does and what certwatch must do; after every batch the test checks,
//! for every route, the `Admitted` condition of certwatch's status entry (status and
//! reason, words of the message), the crt-list (exactly the admitted routes), each
//! bundle's certificates (leaf first, issuers in issuing order), and that a real HAProxy
//! accepts what certwatch wrote: `haproxy -c` on a configuration loading the crt-list,
//! and a running HAProxy, fed through the runtime API, serving each admitted route's
//! certificate and the default one for every other host.
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
use route_secrets::route::status::{admitted_condition, router_ingress};
use route_secrets::testing::openssl::{self, Fixture};
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki};
use route_secrets::tls::KeyEncoding;

const NAMESPACE: &str = "app-0";
const ROUTER_NAME: &str = "matrix";

/// The router's reason for access and secret problems, and certwatch's.
const VALIDATION_FAILED: &str = "ExternalCertificateValidationFailed";
/// What certwatch records today for a certificate or key problem: the router records
/// `ExtendedValidationFailed`; certwatch's reason names live in route-secrets'
/// `reason.rs` (the pipeline's), which does not tell the two apart yet. The message
/// names the cause either way. When the reason changes, this constant changes.
const CERTIFICATE_REJECTED: &str = VALIDATION_FAILED;
const SECRET_DELETED: &str = "ExternalCertificateSecretDeleted";
const SECRET_RECREATED: &str = "ExternalCertificateSecretRecreated";

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
        }
    }
}

/// What certwatch must show for a route after a step.
#[derive(Clone, Debug)]
enum Outcome {
    /// `Admitted=True` (with this reason, if any), a crt-list line for the route's host,
    /// and a bundle holding these certificates in this order.
    Served {
        certificates: Vec<Vec<u8>>,
        reason: Option<&'static str>,
    },
    /// `Admitted=False` for `reason`, with `words` in the message; no line, no bundle.
    Rejected {
        reason: &'static str,
        words: &'static str,
    },
    /// No longer (or never) certwatch's: no line, no bundle, and certwatch's status
    /// entry is as given (`None`: there is none; `Some(admitted)`: left as it was).
    NotServed { status: Option<bool> },
    /// The route is deleted: no line, no bundle.
    Deleted,
}

impl Outcome {
    fn rejected(reason: &'static str, words: &'static str) -> Self {
        Self::Rejected { reason, words }
    }

    /// The certwatch column of the table.
    fn describe(&self) -> String {
        match self {
            Self::Served { reason: None, .. } => "admitted, served".to_owned(),
            Self::Served {
                reason: Some(reason),
                ..
            } => format!("admitted (`{reason}`), served"),
            Self::Rejected { reason, words } => format!("`{reason}`: …{words}…"),
            Self::NotServed { status: None } => "not served by certwatch, no status".to_owned(),
            Self::NotServed { status: Some(_) } => {
                "not served by certwatch any more; status left as it was".to_owned()
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
    /// Creates the route; `Some(secret)`: with `spec.tls.externalCertificate`, `None`:
    /// an edge route without a certificate.
    CreateRoute(Option<String>),
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
    /// The route the row is about; empty for a row that only creates shared secrets.
    route: &'static str,
    actions: Vec<Action>,
    router: &'static str,
    certwatch: Outcome,
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
            route,
            actions,
            router,
            certwatch,
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

    /// Every secret name a row uses.
    fn secret_names(&self) -> BTreeSet<String> {
        self.rows
            .iter()
            .flat_map(|row| &row.actions)
            .filter_map(|action| match action {
                Action::CreateRoute(Some(name))
                | Action::SetExternalCertificate(Some(name))
                | Action::PutSecret(name, _)
                | Action::DeleteSecret(name) => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    /// The table as docs/daemon.md shows it.
    fn render(&self) -> String {
        let mut out =
            String::from("| Step | Case | OpenShift router | certwatch |\n|---|---|---|---|\n");
        for row in self.rows.iter().filter(|row| !row.case.is_empty()) {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                row.step.title(),
                row.case,
                row.router,
                row.certwatch.describe()
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
const ROUTER_SECRET_DELETED: &str = "`ExternalCertificateSecretDeleted`";
const ROUTER_SECRET_RECREATED: &str = "admitted (`ExternalCertificateSecretRecreated`)";
const ROUTER_NOT_EXTERNAL: &str = "admitted, served by the router itself (no external certificate)";
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
    let ours_no_more = |admitted| Outcome::NotServed {
        status: Some(admitted),
    };
    let never_ours = Outcome::NotServed { status: None };

    // Secrets several rows share: `s-valid`, `s-valid-b`, `s-sha1`, `s-bad-pem`, and
    // `s-denied` (valid, but the router may not read it); `s-missing` never exists.
    for (name, material) in [
        ("s-valid", &rsa),
        ("s-valid-b", &valid_b),
        ("s-sha1", &sha1),
        ("s-bad-pem", &bad_pem),
        ("s-denied", &rsa),
    ] {
        m.push(
            RouteAdded,
            "",
            "",
            vec![PutSecret(name.to_owned(), material.clone())],
            "",
            never_ours.clone(),
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
        rsa.clone().typed("Opaque"),
        ROUTER_WRONG_TYPE,
        Outcome::rejected(VALIDATION_FAILED, "expected \"kubernetes.io/tls\""),
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
    let expired = m.issued(m.spec().expired(now));
    m.added(
        "expired",
        "a-expired",
        expired.clone(),
        ROUTER_ADMITS,
        served(&expired),
    );
    let not_yet_valid = m.issued(m.spec().not_yet_valid(now));
    m.added(
        "not yet valid",
        "a-not-yet-valid",
        not_yet_valid.clone(),
        ROUTER_ADMITS,
        served(&not_yet_valid),
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
        certificate("tls.crt is empty"),
    );

    // Route updated: none→ext, with each target outcome.
    for (route, secret, router, outcome) in [
        ("u-none-valid", "s-valid", ROUTER_ADMITS, served(&rsa)),
        ("u-none-sha1", "s-sha1", ROUTER_SHA1, sha1_rejected.clone()),
        (
            "u-none-missing",
            "s-missing",
            ROUTER_MISSING,
            missing.clone(),
        ),
        ("u-none-denied", "s-denied", ROUTER_DENIED, denied.clone()),
    ] {
        m.set_up(route, None, never_ours.clone());
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
    m.set_up("u-none-none", None, never_ours.clone());
    m.push(
        RouteUpdated,
        "none→none (path edited)",
        "u-none-none",
        vec![EditPath],
        ROUTER_NOT_EXTERNAL,
        never_ours.clone(),
    );
    // ext→same: an edit that keeps the secret keeps the outcome.
    m.set_up("u-same-valid", Some("s-valid"), served(&rsa));
    m.push(
        RouteUpdated,
        "ext→same (`s-valid`, path edited)",
        "u-same-valid",
        vec![EditPath],
        ROUTER_ADMITS,
        served(&rsa),
    );
    m.set_up("u-same-sha1", Some("s-sha1"), sha1_rejected.clone());
    m.push(
        RouteUpdated,
        "ext→same (`s-sha1`, path edited)",
        "u-same-sha1",
        vec![EditPath],
        ROUTER_SHA1,
        sha1_rejected.clone(),
    );
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
        ours_no_more(true),
    );
    m.set_up("u-sha1-none", Some("s-sha1"), sha1_rejected.clone());
    m.push(
        RouteUpdated,
        "ext→none (was rejected)",
        "u-sha1-none",
        vec![SetExternalCertificate(None)],
        ROUTER_NOT_EXTERNAL,
        ours_no_more(false),
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
            served(&expired),
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
            Outcome::rejected(SECRET_DELETED, "deleted"),
        );
    }
    m.push(
        SecretRecreated,
        "secret re-created (another certificate)",
        "x-recreated",
        vec![PutSecret("s-x-recreated".to_owned(), rotated.clone())],
        ROUTER_SECRET_RECREATED,
        Outcome::Served {
            certificates: rotated.served.clone(),
            reason: Some(SECRET_RECREATED),
        },
    );
    // Host claims (`HostAlreadyClaimed`, namespace ownership, a rejected claimant taking
    // over) and wildcard policy (`WildcardPolicyNotAllowed`, `*.<domain>` with
    // --allow-wildcard-routes) belong here: they come with the pipeline's host-claim
    // work (branch wt/pipeline), not on main yet.
    m
}

/// The files, the API and the running HAProxy the checks look at.
struct World {
    admin: kube::Client,
    cert_dir: std::path::PathBuf,
    haproxy_config: std::path::PathBuf,
    haproxy_port: u16,
    default_leaf: Vec<u8>,
}

impl World {
    async fn apply(&self, route: &str, action: &Action) {
        let routes = Api::<Route>::namespaced(self.admin.clone(), NAMESPACE);
        let secrets = Api::<Secret>::namespaced(self.admin.clone(), NAMESPACE);
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
        match action {
            Action::CreateRoute(secret) => {
                let mut tls = serde_json::json!({"termination": "edge"});
                if let Some(secret) = secret {
                    tls["externalCertificate"] = serde_json::json!({"name": secret});
                }
                let route: Route = serde_json::from_value(serde_json::json!({
                    "apiVersion": "route.openshift.io/v1",
                    "kind": "Route",
                    "metadata": {"name": route, "namespace": NAMESPACE},
                    "spec": {
                        "host": host(route),
                        "to": {"kind": "Service", "name": "backend"},
                        "tls": tls,
                    },
                }))
                .unwrap();
                routes.create(&PostParams::default(), &route).await.unwrap();
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

    /// What differs from `expected` in the status, the crt-list and the bundles.
    async fn differences(&self, expected: &BTreeMap<&'static str, Outcome>) -> Vec<String> {
        let mut differences = Vec::new();
        let listed: BTreeSet<(String, String)> = crt_list(&self.cert_dir).into_iter().collect();
        let mut wanted: BTreeSet<(String, String)> = expected
            .iter()
            .filter(|(_, outcome)| matches!(outcome, Outcome::Served { .. }))
            .map(|(route, _)| (link(route), host(route)))
            .collect();
        // The route the simulator generated.
        wanted.insert((
            link("route-0"),
            format!("route-0.{NAMESPACE}.apps.sim.example"),
        ));
        if listed != wanted {
            differences.push(format!(
                "crt-list: missing {:?}, unexpected {:?}",
                wanted.difference(&listed).collect::<Vec<_>>(),
                listed.difference(&wanted).collect::<Vec<_>>()
            ));
        }
        let routes: BTreeMap<String, Route> =
            Api::<Route>::namespaced(self.admin.clone(), NAMESPACE)
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|route| (route.metadata.name.clone().unwrap_or_default(), route))
                .collect();
        for (name, outcome) in expected {
            let bundle = std::fs::read(self.cert_dir.join("links").join(link(name))).ok();
            let on_disk = self
                .cert_dir
                .join(format!("{NAMESPACE}:{name}.pem"))
                .exists();
            let condition = routes
                .get(*name)
                .and_then(|route| router_ingress(route, ROUTER_NAME))
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
                } => {
                    if status != Some(true) || reason != *wanted {
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
                Outcome::NotServed { status: wanted } => {
                    (status != *wanted).then(|| format!("status {status:?} {reason:?} {message:?}"))
                }
                Outcome::Deleted => routes
                    .contains_key(*name)
                    .then(|| "route still exists".to_owned()),
            };
            if let Some(problem) = problem {
                differences.push(format!("{name}: {problem}"));
            }
            let served = matches!(outcome, Outcome::Served { .. });
            if !served && (bundle.is_some() || on_disk) {
                differences.push(format!("{name}: a bundle is on disk"));
            }
        }
        differences
    }

    /// Routes the running HAProxy does not serve as expected (each admitted route's
    /// leaf, the default certificate for every other host).
    fn served_differently(&self, expected: &BTreeMap<&'static str, Outcome>) -> Vec<String> {
        let mut differences = Vec::new();
        for (name, outcome) in expected {
            let wanted = match outcome {
                Outcome::Served { certificates, .. } => &certificates[0],
                _ => &self.default_leaf,
            };
            let presented = presented_to_openssl(self.haproxy_port, &host(name));
            if presented.as_ref() != Some(wanted) {
                differences.push(format!("{name}: HAProxy presents another certificate"));
            }
        }
        differences
    }
}

fn link(route: &str) -> String {
    format!("{NAMESPACE}_{route}.pem")
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
    let sim = SimProcess::start(&root, &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;
    for secret in matrix.secret_names() {
        if !matrix.denied.contains(&secret) {
            grant_secret(&admin, NAMESPACE, &secret).await;
        }
    }
    let socket = root.join("haproxy.sock");
    let cert_dir = root.join("certs");
    let socket_arg = socket.display().to_string();
    let certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &root.join("certwatch.log"),
        &[
            "--write-status",
            "--router-name",
            ROUTER_NAME,
            "--haproxy-socket",
            &socket_arg,
            "--access-denied-ttl",
            "500ms",
        ],
    );
    certwatch.wait_ready().await;
    let (haproxy_config, _, _) = haproxy_config(&root, &socket, &cert_dir);
    let (_haproxy, haproxy_port, default_leaf) = start_haproxy(&root, &socket, &cert_dir);
    eventually_async("HAProxy to serve TLS", || {
        presented(haproxy_port, "default.invalid")
    })
    .await;
    let world = World {
        admin,
        cert_dir,
        haproxy_config,
        haproxy_port,
        default_leaf,
    };

    let mut expected: BTreeMap<&'static str, Outcome> = BTreeMap::new();
    for step in Step::ALL {
        for row in matrix.rows.iter().filter(|row| row.step == step) {
            for action in &row.actions {
                world.apply(row.route, action).await;
            }
            if !row.route.is_empty() {
                expected.insert(row.route, row.certwatch.clone());
            }
        }
        settle(
            &format!("{}: status, crt-list and bundles", step.title()),
            || world.differences(&expected),
        )
        .await;
        haproxy_check(&world.haproxy_config)
            .unwrap_or_else(|error| panic!("{}: haproxy -c refused:\n{error}", step.title()));
        settle(
            &format!("{}: the running HAProxy", step.title()),
            || async { world.served_differently(&expected) },
        )
        .await;
        let served = expected
            .values()
            .filter(|outcome| matches!(outcome, Outcome::Served { .. }))
            .count();
        eventually(
            &format!("{}: routes admitted in the metrics", step.title()),
            || {
                (certwatch.metric("certwatch_routes_admitted") == Some((served + 1) as f64))
                    .then_some(())
            },
        )
        .await;
        let metrics = certwatch.metrics();
        assert_eq!(
            errors_besides_show_info(&metrics),
            0,
            "{}\n{metrics}",
            step.title()
        );
        if step == Step::RouteAdded {
            // Served although expired, and the expiry metric says so.
            let not_after = certwatch
                .metric("certwatch_certificate_expiration_timestamp_seconds{namespace=\"app-0\",route=\"a-expired\",secret=\"s-a-expired\"}")
                .unwrap();
            assert!(not_after < now.as_second() as f64, "{not_after}");
        }
    }
    assert_eq!(certwatch.metric("certwatch_haproxy_in_sync"), Some(1.0));
}
