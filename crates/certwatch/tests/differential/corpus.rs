//! The corpus: routes and secrets, and the steps that change them, with what the real
//! OpenShift router writes for each route after each step.
//!
//! Every route has a name of its own across namespaces; the name is the case's name in
//! the report and in docs/daemon.md's list of differences. The router's column is the
//! judge's answer as recorded from runs of the real router (openshift/router at the
//! commit the shared tool was built from); the test checks that it still writes it, so
//! the record cannot go stale either.

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use route_secrets::testing::openssl::{self, Fixture};
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki};
use serde_json::{Value, json};

/// The namespace of nearly every case.
pub const NAMESPACE: &str = "parity-a";
/// A second namespace: host claims across namespaces, a secret in the wrong namespace.
pub const OTHER_NAMESPACE: &str = "parity-b";
/// Every namespace of the corpus.
pub const NAMESPACES: [&str; 2] = [NAMESPACE, OTHER_NAMESPACE];

/// The host every claim case competes for.
const CLAIMED_HOST: &str = "shop.parity.example";
/// The host of the two routes created in the same second.
const TIED_HOST: &str = "tie.parity.example";

/// The `Admitted` condition a router wrote for a route under its name: status and
/// reason (messages are worded differently by design and are not compared).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Admitted {
    /// No `status.ingress[]` entry of this router (or none with an `Admitted` condition).
    Absent,
    /// `Admitted=True`, with its reason if it has one.
    True(Option<String>),
    /// `Admitted=False` with this reason.
    False(String),
}

impl Admitted {
    /// `True` without a reason.
    pub fn yes() -> Self {
        Self::True(None)
    }

    /// `False` with `reason`.
    pub fn no(reason: &str) -> Self {
        Self::False(reason.to_owned())
    }

    /// Reads the notation of [`Display`](fmt::Display): `True`, `True (Reason)`,
    /// `False Reason`, `none`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim().trim_matches('`');
        if text == "none" {
            return Some(Self::Absent);
        }
        if text == "True" {
            return Some(Self::True(None));
        }
        if let Some(rest) = text.strip_prefix("True (") {
            return Some(Self::True(Some(rest.strip_suffix(')')?.to_owned())));
        }
        let reason = text.strip_prefix("False ")?;
        (!reason.is_empty() && !reason.contains(' ')).then(|| Self::False(reason.to_owned()))
    }
}

impl fmt::Display for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Absent => f.write_str("none"),
            Self::True(None) => f.write_str("True"),
            Self::True(Some(reason)) => write!(f, "True ({reason})"),
            Self::False(reason) => write!(f, "False {reason}"),
        }
    }
}

/// A change made through the API as the cluster's admin.
#[derive(Clone, Debug)]
pub enum Action {
    /// Creates the secret, or replaces its type and data.
    PutSecret {
        namespace: &'static str,
        name: String,
        secret_type: &'static str,
        crt: String,
        key: String,
    },
    DeleteSecret {
        namespace: &'static str,
        name: String,
    },
    /// Lets the router identity get, list and watch these secrets (by name).
    Grant {
        namespace: &'static str,
        secrets: Vec<String>,
    },
    /// Creates the route with `spec`, or replaces its spec.
    PutRoute {
        namespace: &'static str,
        name: String,
        spec: Value,
    },
    DeleteRoute {
        namespace: &'static str,
        name: String,
    },
    /// Waits until the wall clock is in a later second than when the last change before
    /// it was answered, so that routes created after this are younger by their creation
    /// timestamps (which have a resolution of one second) than routes created before.
    NextSecond,
}

/// What the router writes for a route once a step has settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Its `Admitted` condition; `None` where the router's answer is not determined by
    /// the corpus (two routes created in the same second: its tie-break is the routes'
    /// uids), only that it writes one.
    pub router: Option<Admitted>,
    /// The router writes the route's status during this step (a new transition time)
    /// even where the final condition is the one it had before, as it does when a
    /// secret it watches changes: the step has settled for this route only once it has.
    pub rewritten: bool,
}

/// A batch of actions, applied together; both routers are compared once it has settled.
#[derive(Clone, Debug)]
pub struct Step {
    /// Short name, as docs/daemon.md's list names it.
    pub id: &'static str,
    /// What the step does.
    pub about: &'static str,
    pub actions: Vec<Action>,
    /// What the router writes afterwards, for the routes whose answer this step
    /// changes or rewrites (every other route keeps its answer of the step before).
    pub expect: BTreeMap<String, Expect>,
    /// Routes deleted by this step: no longer compared.
    pub gone: Vec<String>,
    /// certwatch is paused (SIGSTOP) while the step is applied and until the router has
    /// settled, then continued: for changes the router does not react to, which it
    /// would otherwise see through certwatch's status write (any change of a route
    /// object makes the router evaluate the route again). The step then ends with a
    /// change of the [`SENTINEL`] route, whose new status tells that the router has
    /// handled every route event before it.
    pub pause_certwatch: bool,
}

impl Step {
    fn new(id: &'static str, about: &'static str) -> Self {
        Self {
            id,
            about,
            actions: Vec::new(),
            expect: BTreeMap::new(),
            gone: Vec::new(),
            pause_certwatch: false,
        }
    }
}

/// The route a step with certwatch paused changes last (between a wildcard route, which
/// the router refuses, and a plain one), so that its status shows the router is done.
pub const SENTINEL: &str = "sentinel";

/// The whole corpus.
#[derive(Debug)]
pub struct Corpus {
    /// The first step creates everything before either router starts; the others
    /// change it with both running.
    pub steps: Vec<Step>,
}

/// A route's spec, built up.
#[derive(Clone, Debug)]
pub struct Spec(Value);

impl Spec {
    fn new(host: &str) -> Self {
        Self(json!({"host": host, "to": {"kind": "Service", "name": "app"}}))
    }

    fn tls(mut self, tls: Value) -> Self {
        self.0["tls"] = tls;
        self
    }

    fn path(mut self, path: &str) -> Self {
        self.0["path"] = json!(path);
        self
    }

    fn wildcard(mut self) -> Self {
        self.0["wildcardPolicy"] = json!("Subdomain");
        self
    }

    fn without_host(mut self) -> Self {
        if let Some(spec) = self.0.as_object_mut() {
            spec.remove("host");
        }
        self
    }

    /// The spec as the API takes it.
    pub fn value(&self) -> Value {
        self.0.clone()
    }
}

/// `<route>.parity.example`.
pub fn host_of(route: &str) -> String {
    format!("{route}.parity.example")
}

/// An edge route whose certificate is the secret `secret`.
fn edge_external(host: &str, secret: &str) -> Spec {
    Spec::new(host).tls(json!({"termination": "edge", "externalCertificate": {"name": secret}}))
}

const TLS: &str = "kubernetes.io/tls";
const OPAQUE: &str = "Opaque";

/// Reasons, as the router names them.
const VALIDATION_FAILED: &str = "ExternalCertificateValidationFailed";
const EXTENDED_VALIDATION_FAILED: &str = "ExtendedValidationFailed";
const HOST_CLAIMED: &str = "HostAlreadyClaimed";
const NOT_ADMITTED: &str = "RouteNotAdmitted";
const NO_HOST: &str = "NoHostValue";
const INVALID_HOST: &str = "InvalidHost";

/// Builds the corpus step by step.
struct Builder {
    now: Timestamp,
    pki: Pki,
    steps: Vec<Step>,
    /// Whether the sentinel is a wildcard route now.
    sentinel_wildcard: bool,
}

impl Builder {
    fn step(&mut self, id: &'static str, about: &'static str) {
        self.steps.push(Step::new(id, about));
    }

    fn current(&mut self) -> &mut Step {
        self.steps.last_mut().expect("a step was begun")
    }

    fn act(&mut self, action: Action) {
        self.current().actions.push(action);
    }

    fn expect(&mut self, route: &str, router: Admitted) {
        self.current().expect.insert(
            route.to_owned(),
            Expect {
                router: Some(router),
                rewritten: false,
            },
        );
    }

    /// The router writes some status for the route, which the corpus does not fix.
    fn expect_some(&mut self, route: &str) {
        self.current().expect.insert(
            route.to_owned(),
            Expect {
                router: None,
                rewritten: false,
            },
        );
    }

    /// The router rewrites the route's status in this step, ending at `router`.
    fn expect_rewritten(&mut self, route: &str, router: Admitted) {
        self.current().expect.insert(
            route.to_owned(),
            Expect {
                router: Some(router),
                rewritten: true,
            },
        );
    }

    fn put_secret(
        &mut self,
        namespace: &'static str,
        name: &str,
        secret_type: &'static str,
        crt: String,
        key: String,
    ) {
        self.act(Action::PutSecret {
            namespace,
            name: name.to_owned(),
            secret_type,
            crt,
            key,
        });
    }

    fn grant(&mut self, namespace: &'static str, secrets: &[&str]) {
        self.act(Action::Grant {
            namespace,
            secrets: secrets.iter().map(|secret| (*secret).to_owned()).collect(),
        });
    }

    fn put_route(&mut self, namespace: &'static str, name: &str, spec: Spec) {
        self.act(Action::PutRoute {
            namespace,
            name: name.to_owned(),
            spec: spec.value(),
        });
    }

    /// A route in the main namespace with its own granted secret `s-<route>` holding
    /// `crt` and `key` (of `secret_type`), edge-terminated.
    fn external(
        &mut self,
        route: &str,
        secret_type: &'static str,
        crt: String,
        key: String,
        router: Admitted,
    ) {
        let secret = format!("s-{route}");
        self.put_secret(NAMESPACE, &secret, secret_type, crt, key);
        self.grant(NAMESPACE, &[&secret]);
        self.put_route(NAMESPACE, route, edge_external(&host_of(route), &secret));
        self.expect(route, router);
    }

    fn fixture(&mut self, route: &str, fixture: Fixture, router: Admitted) {
        self.external(
            route,
            TLS,
            fixture.chain_pem(),
            fixture.key.to_owned(),
            router,
        );
    }

    fn issued(&mut self, route: &str, spec: LeafSpec, router: Admitted) {
        let leaf = self.pki.issue(&spec);
        self.external(route, TLS, leaf.chain_pem(), leaf.key_pem(), router);
    }

    /// Pauses certwatch during this step, ending it with a change of the sentinel.
    fn pause_certwatch(&mut self) {
        self.current().pause_certwatch = true;
        self.sentinel_wildcard = !self.sentinel_wildcard;
        let spec = Spec::new(&host_of(SENTINEL));
        if self.sentinel_wildcard {
            self.put_route(NAMESPACE, SENTINEL, spec.wildcard());
            self.expect(SENTINEL, Admitted::no(NOT_ADMITTED));
        } else {
            self.put_route(NAMESPACE, SENTINEL, spec);
            self.expect(SENTINEL, Admitted::yes());
        }
    }

    fn spec(&self, route: &str) -> LeafSpec {
        LeafSpec::new(&host_of(route), self.now)
    }

    /// A fresh valid certificate and key for `host`.
    fn fresh(&self, host: &str) -> (String, String) {
        let leaf = self.pki.issue(&LeafSpec::new(host, self.now));
        (leaf.chain_pem(), leaf.key_pem())
    }
}

/// The corpus, with certificates valid around `now`.
pub fn corpus(now: Timestamp) -> Corpus {
    let mut b = Builder {
        now,
        pki: Pki::new(now),
        steps: Vec::new(),
        sentinel_wildcard: false,
    };
    let yes = Admitted::yes;
    let no = Admitted::no;

    b.step(
        "start",
        "every route and secret created, then both routers started",
    );
    // Key types and sizes.
    b.fixture("rsa-2048", openssl::LEAF_RSA_2048, yes());
    b.fixture("rsa-3072", openssl::LEAF_RSA_3072, yes());
    b.fixture("rsa-4096", openssl::LEAF_RSA_4096, yes());
    b.fixture("rsa-1024", openssl::LEAF_RSA_1024, yes());
    b.fixture("rsa-1024-intermediate", openssl::LEAF_UNDER_RSA_1024, yes());
    let spec = b.spec("rsa-pkcs1").key(KeyKind::RsaPkcs1);
    b.issued("rsa-pkcs1", spec, yes());
    let spec = b.spec("ec-p256");
    b.issued("ec-p256", spec, yes());
    let spec = b.spec("ec-p384-sec1").key(KeyKind::EcdsaP384Sec1);
    b.issued("ec-p384-sec1", spec, yes());
    b.fixture("ec-p521", openssl::LEAF_EC_P521, yes());
    b.fixture("ec-p224", openssl::LEAF_EC_P224, yes());
    b.fixture(
        "ed25519",
        openssl::LEAF_ED25519,
        no(EXTENDED_VALIDATION_FAILED),
    );
    b.fixture(
        "dsa-2048",
        openssl::LEAF_DSA,
        no(EXTENDED_VALIDATION_FAILED),
    );
    b.fixture(
        "ec-secp256k1",
        openssl::LEAF_EC_SECP256K1,
        no(EXTENDED_VALIDATION_FAILED),
    );
    // Signatures.
    b.fixture(
        "sha1-ca-signed",
        openssl::LEAF_SHA1,
        no(EXTENDED_VALIDATION_FAILED),
    );
    b.fixture("sha1-self-signed", openssl::SELF_SIGNED_SHA1, yes());
    b.fixture(
        "md5-ca-signed",
        openssl::LEAF_MD5,
        no(EXTENDED_VALIDATION_FAILED),
    );
    // Dates: served as they are.
    let spec = b.spec("expired").expired(now);
    b.issued("expired", spec, yes());
    let spec = b.spec("not-yet-valid").not_yet_valid(now);
    b.issued("not-yet-valid", spec, yes());
    // Chain order.
    let leaf = b.pki.issue(&b.spec("chain-out-of-order"));
    b.external(
        "chain-out-of-order",
        TLS,
        leaf.root_before_intermediate_pem(),
        leaf.key_pem(),
        yes(),
    );
    let leaf = b.pki.issue(&b.spec("chain-reversed"));
    b.external(
        "chain-reversed",
        TLS,
        leaf.reversed_chain_pem(),
        leaf.key_pem(),
        no(EXTENDED_VALIDATION_FAILED),
    );
    // Garbage and mismatches.
    let key = b.fresh("garbage").1;
    b.external(
        "garbage",
        TLS,
        testing::NOT_PEM_TEXT.to_owned(),
        key,
        no(EXTENDED_VALIDATION_FAILED),
    );
    let (crt, _) = b.fresh("key-mismatch");
    let (_, other_key) = b.fresh("key-mismatch");
    b.external(
        "key-mismatch",
        TLS,
        crt,
        other_key,
        no(EXTENDED_VALIDATION_FAILED),
    );
    let key = b.fresh("empty-crt").1;
    b.external("empty-crt", TLS, String::new(), key, yes());
    // The secret itself.
    let (crt, key) = b.fresh("opaque");
    b.external("opaque", OPAQUE, crt, key, no(VALIDATION_FAILED));
    b.grant(NAMESPACE, &["s-missing"]);
    b.put_route(
        NAMESPACE,
        "missing",
        edge_external(&host_of("missing"), "s-missing"),
    );
    b.expect("missing", no(VALIDATION_FAILED));
    // The secret exists, but in the other namespace.
    let (crt, key) = b.fresh("other-namespace");
    b.put_secret(OTHER_NAMESPACE, "s-other-namespace", TLS, crt, key);
    b.grant(OTHER_NAMESPACE, &["s-other-namespace"]);
    b.grant(NAMESPACE, &["s-other-namespace"]);
    b.put_route(
        NAMESPACE,
        "other-namespace",
        edge_external(&host_of("other-namespace"), "s-other-namespace"),
    );
    b.expect("other-namespace", no(VALIDATION_FAILED));
    // The router may not read the secret.
    let (crt, key) = b.fresh("no-rbac");
    b.put_secret(NAMESPACE, "s-no-rbac", TLS, crt, key);
    b.put_route(
        NAMESPACE,
        "no-rbac",
        edge_external(&host_of("no-rbac"), "s-no-rbac"),
    );
    b.expect("no-rbac", no(VALIDATION_FAILED));
    // Terminations.
    let (crt, key) = b.fresh("reencrypt");
    b.put_secret(NAMESPACE, "s-reencrypt", TLS, crt, key);
    b.grant(NAMESPACE, &["s-reencrypt"]);
    b.put_route(
        NAMESPACE,
        "reencrypt",
        Spec::new(&host_of("reencrypt")).tls(
            json!({"termination": "reencrypt", "externalCertificate": {"name": "s-reencrypt"}}),
        ),
    );
    b.expect("reencrypt", yes());
    let root = b.pki.root_pem().to_owned();
    b.put_route(
        NAMESPACE,
        "reencrypt-destination-ca",
        Spec::new(&host_of("reencrypt-destination-ca")).tls(json!({
            "termination": "reencrypt",
            "externalCertificate": {"name": "s-reencrypt"},
            "destinationCACertificate": root,
        })),
    );
    b.expect("reencrypt-destination-ca", yes());
    b.put_route(
        NAMESPACE,
        "reencrypt-bad-destination-ca",
        Spec::new(&host_of("reencrypt-bad-destination-ca")).tls(json!({
            "termination": "reencrypt",
            "externalCertificate": {"name": "s-reencrypt"},
            "destinationCACertificate": testing::NOT_PEM_TEXT,
        })),
    );
    b.expect(
        "reencrypt-bad-destination-ca",
        no(EXTENDED_VALIDATION_FAILED),
    );
    b.put_route(
        NAMESPACE,
        "passthrough-external",
        Spec::new(&host_of("passthrough-external")).tls(
            json!({"termination": "passthrough", "externalCertificate": {"name": "s-reencrypt"}}),
        ),
    );
    b.expect("passthrough-external", no(EXTENDED_VALIDATION_FAILED));
    b.put_route(
        NAMESPACE,
        "passthrough",
        Spec::new(&host_of("passthrough")).tls(json!({"termination": "passthrough"})),
    );
    b.expect("passthrough", yes());
    b.put_route(
        NAMESPACE,
        "edge-default-certificate",
        Spec::new(&host_of("edge-default-certificate")).tls(json!({"termination": "edge"})),
    );
    b.expect("edge-default-certificate", yes());
    let (crt, key) = b.fresh(&host_of("edge-inline"));
    b.put_route(
        NAMESPACE,
        "edge-inline",
        Spec::new(&host_of("edge-inline"))
            .tls(json!({"termination": "edge", "certificate": crt, "key": key})),
    );
    b.expect("edge-inline", yes());
    let key = b.fresh("edge-inline-garbage").1;
    b.put_route(
        NAMESPACE,
        "edge-inline-garbage",
        Spec::new(&host_of("edge-inline-garbage"))
            .tls(json!({"termination": "edge", "certificate": testing::NOT_PEM_TEXT, "key": key})),
    );
    b.expect("edge-inline-garbage", no(EXTENDED_VALIDATION_FAILED));
    let (crt, key) = b.fresh(&host_of("edge-inline-foreign-ca"));
    let foreign = Pki::new(now);
    b.put_route(
        NAMESPACE,
        "edge-inline-foreign-ca",
        Spec::new(&host_of("edge-inline-foreign-ca")).tls(json!({
            "termination": "edge", "certificate": crt, "key": key, "caCertificate": foreign.root_pem(),
        })),
    );
    b.expect("edge-inline-foreign-ca", no(EXTENDED_VALIDATION_FAILED));
    b.put_route(NAMESPACE, "plain-http", Spec::new(&host_of("plain-http")));
    b.expect("plain-http", yes());
    b.put_route(NAMESPACE, SENTINEL, Spec::new(&host_of(SENTINEL)));
    b.expect(SENTINEL, yes());
    b.put_route(NAMESPACE, "no-host", Spec::new("unused").without_host());
    b.expect("no-host", no(NO_HOST));
    // The API accepts upper-case letters in a host; the router does not.
    b.put_route(
        NAMESPACE,
        "upper-case-host",
        Spec::new("Upper-Case.parity.example").tls(json!({"termination": "edge"})),
    );
    b.expect("upper-case-host", no(INVALID_HOST));
    // An empty secret name is no external certificate at all.
    b.put_route(
        NAMESPACE,
        "empty-external-name",
        Spec::new(&host_of("empty-external-name"))
            .tls(json!({"termination": "edge", "externalCertificate": {"name": ""}})),
    );
    b.expect("empty-external-name", yes());
    // The secret's certificate and key replace the route's own fields.
    let (crt, key) = b.fresh(&host_of("external-and-inline-key"));
    let (_, inline_key) = b.fresh("external-and-inline-key");
    b.put_secret(NAMESPACE, "s-external-and-inline-key", TLS, crt, key);
    b.grant(NAMESPACE, &["s-external-and-inline-key"]);
    b.put_route(
        NAMESPACE,
        "external-and-inline-key",
        Spec::new(&host_of("external-and-inline-key")).tls(json!({
            "termination": "edge",
            "externalCertificate": {"name": "s-external-and-inline-key"},
            "key": inline_key,
        })),
    );
    b.expect("external-and-inline-key", yes());
    // spec.tls.caCertificate must have issued the served certificate, wherever it
    // comes from.
    let chain_ca = format!("{}{}", b.pki.intermediate_pem(), b.pki.root_pem());
    let (crt, key) = b.fresh(&host_of("external-with-ca"));
    b.put_secret(NAMESPACE, "s-external-with-ca", TLS, crt, key);
    b.grant(NAMESPACE, &["s-external-with-ca"]);
    for (route, ca, expected) in [
        ("external-with-ca", chain_ca.clone(), yes()),
        (
            "external-foreign-ca",
            Pki::new(now).root_pem().to_owned(),
            no(EXTENDED_VALIDATION_FAILED),
        ),
    ] {
        b.put_route(
            NAMESPACE,
            route,
            Spec::new(&host_of(route)).tls(json!({
                "termination": "edge",
                "externalCertificate": {"name": "s-external-with-ca"},
                "caCertificate": ca,
            })),
        );
        b.expect(route, expected);
    }
    let (crt, key) = b.fresh(&host_of("edge-inline-with-ca"));
    b.put_route(
        NAMESPACE,
        "edge-inline-with-ca",
        Spec::new(&host_of("edge-inline-with-ca")).tls(json!({
            "termination": "edge", "certificate": crt, "key": key, "caCertificate": chain_ca,
        })),
    );
    b.expect("edge-inline-with-ca", yes());
    // A wildcard route on a router that admits none.
    let (crt, key) = b.fresh("wildcard");
    b.put_secret(NAMESPACE, "s-wildcard", TLS, crt, key);
    b.grant(NAMESPACE, &["s-wildcard"]);
    b.put_route(
        NAMESPACE,
        "wildcard",
        edge_external("www.wildcard.parity.example", "s-wildcard").wildcard(),
    );
    b.expect("wildcard", no(NOT_ADMITTED));
    // A refused wildcard route claims no host: a younger route of the same host has it.
    let (crt, key) = b.fresh("wildcard-claim");
    b.put_secret(NAMESPACE, "s-wildcard-claim", TLS, crt, key);
    b.grant(NAMESPACE, &["s-wildcard-claim"]);
    b.put_route(
        NAMESPACE,
        "wildcard-claim-older",
        edge_external("www.wildcard-claim.parity.example", "s-wildcard-claim").wildcard(),
    );
    b.expect("wildcard-claim-older", no(NOT_ADMITTED));
    b.act(Action::NextSecond);
    b.put_route(
        NAMESPACE,
        "wildcard-claim-younger",
        edge_external("www.wildcard-claim.parity.example", "s-wildcard-claim"),
    );
    b.expect("wildcard-claim-younger", yes());
    // Two routes sharing one secret.
    let (crt, key) = b.fresh("shared");
    b.put_secret(NAMESPACE, "s-shared", TLS, crt, key);
    b.grant(NAMESPACE, &["s-shared"]);
    for route in ["shared-a", "shared-b"] {
        b.put_route(NAMESPACE, route, edge_external(&host_of(route), "s-shared"));
        b.expect(route, yes());
    }
    // The routes the updates work on.
    for route in [
        "rename",
        "secret-life",
        "rotate",
        "late-secret",
        "late-grant",
        "lose-external",
    ] {
        let secret = format!("s-{route}");
        if route != "late-secret" {
            let (crt, key) = b.fresh(&host_of(route));
            b.put_secret(NAMESPACE, &secret, TLS, crt, key);
        }
        if route != "late-grant" {
            b.grant(NAMESPACE, &[&secret]);
        }
        b.put_route(NAMESPACE, route, edge_external(&host_of(route), &secret));
        let admitted = !matches!(route, "late-secret" | "late-grant");
        b.expect(
            route,
            if admitted {
                yes()
            } else {
                no(VALIDATION_FAILED)
            },
        );
    }
    let (crt, key) = b.fresh(&host_of("rename"));
    b.put_secret(NAMESPACE, "s-rename-b", TLS, crt, key);
    b.grant(NAMESPACE, &["s-rename-b", "s-gain-external"]);
    let (crt, key) = b.fresh(&host_of("gain-external"));
    b.put_secret(NAMESPACE, "s-gain-external", TLS, crt, key);
    b.put_route(
        NAMESPACE,
        "gain-external",
        Spec::new(&host_of("gain-external")).tls(json!({"termination": "edge"})),
    );
    b.expect("gain-external", yes());
    // Host claims: the older route first, then (a second later) the younger ones.
    let (crt, key) = b.fresh(CLAIMED_HOST);
    b.put_secret(NAMESPACE, "s-claim", TLS, crt.clone(), key.clone());
    b.grant(NAMESPACE, &["s-claim"]);
    b.put_secret(OTHER_NAMESPACE, "s-claim", TLS, crt, key);
    b.grant(OTHER_NAMESPACE, &["s-claim"]);
    b.put_route(
        NAMESPACE,
        "claim-older",
        edge_external(CLAIMED_HOST, "s-claim"),
    );
    b.expect("claim-older", yes());
    // Two routes created in one go: in the same second, mostly, where the router's
    // tie-break decides (the route's uid).
    b.put_route(NAMESPACE, "tie-a", edge_external(TIED_HOST, "s-claim"));
    b.put_route(NAMESPACE, "tie-b", edge_external(TIED_HOST, "s-claim"));
    b.expect_some("tie-a");
    b.expect_some("tie-b");
    b.act(Action::NextSecond);
    b.put_route(
        NAMESPACE,
        "claim-younger",
        edge_external(CLAIMED_HOST, "s-claim"),
    );
    b.expect("claim-younger", no(HOST_CLAIMED));
    b.put_route(
        NAMESPACE,
        "claim-other-path",
        edge_external(CLAIMED_HOST, "s-claim").path("/other"),
    );
    b.expect("claim-other-path", yes());
    // Younger still: the host stays with the main namespace when the oldest claim goes.
    b.act(Action::NextSecond);
    b.put_route(
        OTHER_NAMESPACE,
        "claim-other-namespace",
        edge_external(CLAIMED_HOST, "s-claim").path("/elsewhere"),
    );
    b.expect("claim-other-namespace", no(HOST_CLAIMED));

    b.step("rename", "routes move to another secret");
    b.put_route(
        NAMESPACE,
        "rename",
        edge_external(&host_of("rename"), "s-rename-b"),
    );
    b.expect("rename", yes());
    b.put_route(
        NAMESPACE,
        "shared-b",
        edge_external(&host_of("shared-b"), "s-missing"),
    );
    b.expect("shared-b", no(VALIDATION_FAILED));
    b.put_route(
        NAMESPACE,
        "gain-external",
        edge_external(&host_of("gain-external"), "s-gain-external"),
    );
    b.expect("gain-external", yes());
    b.put_route(
        NAMESPACE,
        "lose-external",
        Spec::new(&host_of("lose-external")).tls(json!({"termination": "edge"})),
    );
    b.expect("lose-external", yes());

    b.step("delete-secret", "a secret in use is deleted");
    b.act(Action::DeleteSecret {
        namespace: NAMESPACE,
        name: "s-secret-life".to_owned(),
    });
    b.expect_rewritten("secret-life", no(VALIDATION_FAILED));

    b.step("recreate-secret", "the deleted secret is created again");
    let (crt, key) = b.fresh(&host_of("secret-life"));
    b.put_secret(NAMESPACE, "s-secret-life", TLS, crt, key);
    b.expect_rewritten("secret-life", yes());

    b.step("rotate", "a secret in use gets another valid certificate");
    let (crt, key) = b.fresh(&host_of("rotate"));
    b.put_secret(NAMESPACE, "s-rotate", TLS, crt, key);
    b.expect_rewritten("rotate", yes());

    b.step(
        "rotate-bad",
        "the secret gets a certificate with another certificate's key",
    );
    let (crt, _) = b.fresh(&host_of("rotate"));
    let (_, other_key) = b.fresh(&host_of("rotate"));
    b.put_secret(NAMESPACE, "s-rotate", TLS, crt, other_key);
    b.expect_rewritten("rotate", no(EXTENDED_VALIDATION_FAILED));

    b.step("rotate-back", "the secret gets a valid pair again");
    let (crt, key) = b.fresh(&host_of("rotate"));
    b.put_secret(NAMESPACE, "s-rotate", TLS, crt, key);
    b.expect_rewritten("rotate", yes());

    b.step(
        "late-fixes",
        "a missing secret is created, a missing grant given",
    );
    let (crt, key) = b.fresh(&host_of("late-secret"));
    b.put_secret(NAMESPACE, "s-late-secret", TLS, crt, key);
    b.grant(NAMESPACE, &["s-late-grant"]);
    // The router keeps no watch on a secret it rejected: both stay rejected for it
    // until their routes change.
    b.pause_certwatch();

    b.step("release-claim", "the route holding a host is deleted");
    b.act(Action::DeleteRoute {
        namespace: NAMESPACE,
        name: "claim-older".to_owned(),
    });
    b.current().gone.push("claim-older".to_owned());
    b.expect("claim-younger", yes());
    // certwatch's status write (True) for the routes fixed in the step before changed
    // them, and the router evaluated them again on that change.
    b.expect("late-secret", yes());
    b.expect("late-grant", yes());

    Corpus { steps: b.steps }
}
