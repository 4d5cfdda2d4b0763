//! `certwatch run`'s command line: every option also reads a `CERTWATCH_*` variable.
//!
//! [`RunArgs::daemon_options`] reads it into [`DaemonOptions`]; the five flags that say
//! who runs HAProxy and where certificates go are read together into a
//! [`HaproxyDeployment`], which holds only the combinations certwatch serves.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use route_secrets::api::access::AccessPolicy;
use route_secrets::api::leader::LeaseOptions;
use route_secrets::tls::SecurityLevel;

use crate::daemon::DaemonOptions;
use crate::haproxy::HaproxyOptions;
use crate::haproxy::process::{Drain, ProcessOptions};
use crate::logging::LogFormat;
use crate::progress::ProgressMode;
use crate::reload::ReloadOptions;
use crate::routing::{ErrorPage, ErrorPageError, RenderOptions, RoutingOptions};
use crate::secure_metrics::SecureMetricsOptions;
use crate::secure_metrics::tls::CertFiles;
use crate::tls_policy::{TlsPolicy, TlsPolicyError, TlsProfile, TlsVersion};
use route_secrets::api::route_watch::RouteScope;

fn duration_arg(text: &str) -> Result<Duration, kube_common::DurationParseError> {
    kube_common::duration::parse(text)
}

/// A label selector (`--route-selector`, `--namespace-selector`), checked before it
/// reaches the API server, as the OpenShift router checks it at start-up: a selector
/// the server would refuse on every watch is a configuration error, reported once with
/// the flag's name rather than retried forever.
fn selector_arg(text: &str) -> Result<String, kube_common::labels::SelectorError> {
    kube_common::labels::LabelSelector::parse(text)?;
    Ok(text.to_owned())
}

fn namespace_arg(text: &str) -> Result<String, kube_common::NameError> {
    kube_common::name::label(text)?;
    Ok(text.to_owned())
}

/// Why `--listen` is not an address.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    /// Not `HOST:PORT`, or the host does not resolve.
    #[error("expected HOST:PORT or :PORT (e.g. :9090, localhost:9090, 0.0.0.0:9090): {0}")]
    Unresolved(#[source] std::io::Error),
    /// The host resolves to nothing.
    #[error("{0} resolves to no address")]
    NoAddress(String),
}

/// Whether this host has IPv6 (an address on some interface, loopback included): then
/// `:PORT` listens on both families.
pub fn host_has_ipv6() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|text| !text.trim().is_empty())
}

/// An address to listen on: `HOST:PORT` with an IP or a name (`localhost:9090`), or
/// `:PORT` for every interface, as Go programs (and so Kubernetes components) accept:
/// both families where the host has IPv6 (`[::]:PORT`, which takes IPv4 clients too
/// unless the host's `net.ipv6.bindv6only` is set), IPv4 only elsewhere. An explicit
/// address listens on that address only.
fn listen_arg(text: &str) -> Result<SocketAddr, ListenError> {
    use std::net::ToSocketAddrs;
    let spelled = match text.strip_prefix(':') {
        Some(port) if host_has_ipv6() => format!("[::]:{port}"),
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    let mut addresses = spelled.to_socket_addrs().map_err(ListenError::Unresolved)?;
    addresses
        .next()
        .ok_or_else(|| ListenError::NoAddress(text.to_owned()))
}

/// A HAProxy `bind` address: `:PORT` on both families where the host has IPv6
/// (`:::PORT v4v6`), anything else as given.
fn haproxy_bind(spec: &str) -> String {
    match spec.strip_prefix(':') {
        Some(port) if !port.contains(':') && host_has_ipv6() => format!(":::{port} v4v6"),
        _ => spec.to_owned(),
    }
}

/// HTTP header names, as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderNames(pub Vec<String>);

/// A comma-separated list of HTTP header names (RFC 7230 tokens, as the router checks
/// them; `#` and `'`, tokens HAProxy's configuration would read as a comment or a
/// quote, are refused too). Empty: none.
fn header_names_arg(value: &str) -> Result<HeaderNames, String> {
    if value.is_empty() {
        return Ok(HeaderNames::default());
    }
    value
        .split(',')
        .map(|name| {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!$%&*+-.^_`|~".contains(&b));
            if token {
                Ok(name.to_owned())
            } else {
                Err(format!("invalid HTTP header name: {name:?}"))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(HeaderNames)
}

/// A CA bundle file (`--default-destination-ca`), checked once at start-up: HAProxy
/// refuses a configuration whose `ca-file` it cannot load, so a missing or empty
/// bundle stops certwatch naming the flag rather than every configuration it renders.
fn ca_bundle_arg(path: &str) -> Result<PathBuf, String> {
    let bytes = std::fs::read(path).map_err(|error| format!("cannot read {path}: {error}"))?;
    use rustls_pki_types::pem::PemObject;
    let mut certificates = 0;
    for certificate in rustls_pki_types::CertificateDer::pem_slice_iter(&bytes) {
        certificate
            .map_err(|error| format!("{path}: a PEM certificate that does not read: {error}"))?;
        certificates += 1;
    }
    if certificates == 0 {
        return Err(format!("{path} holds no PEM certificate"));
    }
    Ok(PathBuf::from(path))
}

/// Why an error page file is refused at start-up.
#[derive(Debug, thiserror::Error)]
enum ErrorPageArgError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is no page HAProxy takes.
    #[error("{path} is no HTTP response HAProxy's errorfile takes: {source}")]
    Page {
        /// The file.
        path: String,
        /// Why.
        source: ErrorPageError,
    },
}

/// An error page file (`--error-page-503`, `--error-page-404`), read and checked once
/// at start-up: a page HAProxy would refuse stops certwatch with the flag's name
/// rather than every configuration it renders.
fn error_page_arg(path: &str) -> Result<ErrorPage, ErrorPageArgError> {
    let bytes = std::fs::read(path).map_err(|source| ErrorPageArgError::Read {
        path: path.to_owned(),
        source,
    })?;
    ErrorPage::parse(&bytes).map_err(|source| ErrorPageArgError::Page {
        path: path.to_owned(),
        source,
    })
}

/// Boolean flags read as Kubernetes tools read them: `--flag` alone is true,
/// `--flag=true|false` says which (`--flag false` too: `run` takes no positional
/// argument to mistake it for); their value and variable also read `1`/`0`,
/// `yes`/`no`, `on`/`off`.
fn boolish() -> clap::builder::BoolishValueParser {
    clap::builder::BoolishValueParser::new()
}

/// How the router identity's access to each secret is checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AccessCheck {
    /// One SelfSubjectRulesReview per namespace answers every secret of the
    /// namespace for certwatch's own identity (denials from an incomplete answer are
    /// re-asked with a SelfSubjectAccessReview).
    #[default]
    SelfRules,
    /// One SelfSubjectAccessReview per secret and verb, for certwatch's own identity.
    SelfReview,
    /// One SubjectAccessReview per secret and verb, for --router-identity (when
    /// certwatch runs with other credentials than the router it serves).
    Subject,
}

/// Which HTTP versions to speak to the API server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ApiProtocol {
    /// HTTP/2 where the server offers it (thousands of watches share a few
    /// connections), HTTP/1.1 otherwise.
    #[default]
    Auto,
    /// HTTP/1.1 only: one connection per open watch.
    Http1,
    /// HTTP/2 only.
    Http2,
}

/// Arguments of `certwatch run`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Watch routes' TLS secrets and serve their certificates to a proxy",
    long_about = "Watch OpenShift routes whose certificate lives in a secret \
(spec.tls.externalCertificate), with one shared watch per secret, and write each admitted \
route's certificate chain and key to --cert-dir as <namespace>:<route>.pem, plus a crt-list \
for HAProxy. After changes, run --reload-command (debounced) and/or update a running HAProxy \
through its runtime API (--haproxy-socket), without a reload.\n\n\
Connects through the usual Kubernetes configuration (--kubeconfig/--context, $KUBECONFIG, \
~/.kube/config, or the in-cluster service account). Every option can also be set through the CERTWATCH_* variable shown.",
    after_long_help = "Endpoints (--listen): /healthz (200 while the process runs), /readyz (200 once \
every route present at start-up is admitted or rejected and its files are written; 503 before, \
and from the first SIGTERM on). /metrics (Prometheus text format) only with --metrics-listen, over \
HTTPS, for bearer tokens the API server authorizes to get /metrics, or on --listen to anyone with \
--metrics-unauthenticated.\n\n\
Examples:\n  certwatch run --cert-dir /var/lib/certwatch --haproxy-socket /run/haproxy/admin.sock\n  \
certwatch run --namespace-selector router=public --route-selector shard=a --cert-dir /certs \\\n      \
--reload-command 'systemctl reload haproxy'\n\n\
A simulated cluster started in-process is in the lab build: certwatch-lab run --embedded --cert-dir /tmp/certs",
    group(
        clap::ArgGroup::new("haproxy_target")
            .args(["haproxy_socket", "haproxy_config_dir"])
            .multiple(true)
    )
)]
pub struct RunArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster
    /// service account).
    #[arg(
        long,
        env = "CERTWATCH_KUBECONFIG",
        value_name = "PATH",
        help_heading = "Cluster"
    )]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context (default: the current context).
    #[arg(
        long,
        env = "CERTWATCH_CONTEXT",
        value_name = "NAME",
        help_heading = "Cluster"
    )]
    pub context: Option<String>,

    /// Which HTTP versions to speak to the API server.
    #[arg(
        long,
        env = "CERTWATCH_API_PROTOCOL",
        value_enum,
        default_value_t,
        help_heading = "Cluster"
    )]
    pub api_protocol: ApiProtocol,

    /// Watch routes in these namespaces only (comma-separated or repeated; default:
    /// all namespaces).
    #[arg(
        long,
        env = "CERTWATCH_NAMESPACE",
        value_name = "NS",
        value_delimiter = ',',
        value_parser = namespace_arg,
        help_heading = "Routes"
    )]
    pub namespace: Vec<String>,

    /// Serve routes only in namespaces whose labels match this selector (e.g.
    /// `router=public`); needs list/watch on namespaces.
    #[arg(
        long,
        env = "CERTWATCH_NAMESPACE_SELECTOR",
        value_name = "SELECTOR",
        value_parser = selector_arg,
        help_heading = "Routes"
    )]
    pub namespace_selector: Option<String>,

    /// Serve only routes whose labels match this selector (router sharding, e.g.
    /// `shard=a`).
    #[arg(
        long,
        env = "CERTWATCH_ROUTE_SELECTOR",
        value_name = "SELECTOR",
        value_parser = selector_arg,
        help_heading = "Routes"
    )]
    pub route_selector: Option<String>,

    /// Directory for the bundles (<namespace>:<route>.pem: chain then key, mode 0600)
    /// and the crt-list; created with mode 0700.
    #[arg(
        long,
        env = "CERTWATCH_CERT_DIR",
        value_name = "DIR",
        help_heading = "Output"
    )]
    pub cert_dir: PathBuf,

    /// Shell command run (sh -c) after the files change: bursts coalesce into one run,
    /// runs never overlap. Gets CERTWATCH_CERT_DIR and CERTWATCH_CRT_LIST.
    #[arg(
        long,
        env = "CERTWATCH_RELOAD_COMMAND",
        value_name = "CMD",
        help_heading = "Output"
    )]
    pub reload_command: Option<String>,

    /// Quiet period after the last change before the reload command runs.
    #[arg(long, env = "CERTWATCH_RELOAD_DEBOUNCE", value_name = "D", value_parser = duration_arg, default_value = "1s", help_heading = "Output")]
    pub reload_debounce: Duration,

    /// Longest wait between a change and the reload that covers it, even while
    /// changes keep coming.
    #[arg(long, env = "CERTWATCH_RELOAD_MAX_DELAY", value_name = "D", value_parser = duration_arg, default_value = "30s", help_heading = "Output")]
    pub reload_max_delay: Duration,

    /// Longest run of the reload command; it is killed (and counted as failed) after.
    #[arg(long, env = "CERTWATCH_RELOAD_TIMEOUT", value_name = "D", value_parser = duration_arg, default_value = "60s", help_heading = "Output")]
    pub reload_timeout: Duration,

    /// HAProxy's stats socket (`stats socket PATH level admin`): add, update and
    /// remove certificates in the running HAProxy through its runtime API, without a
    /// reload. Its configuration must load <cert-dir>/crt-list by that exact path.
    /// /readyz then waits until HAProxy serves every route present at start-up.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_SOCKET",
        value_name = "PATH",
        help_heading = "HAProxy"
    )]
    pub haproxy_socket: Option<PathBuf>,

    /// Run HAProxy with this configuration (master-worker mode), started once the
    /// files are complete, so that it loads every certificate itself; changes then go
    /// through its runtime API (--haproxy-socket, which the configuration's
    /// `stats socket` must name), and what the runtime API cannot carry through a
    /// reload.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_CONFIG",
        value_name = "FILE",
        requires = "haproxy_socket",
        conflicts_with = "reload_command",
        help_heading = "HAProxy"
    )]
    pub haproxy_config: Option<PathBuf>,

    /// The HAProxy binary run with --haproxy-config or --haproxy-config-dir.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_BINARY",
        value_name = "PATH",
        default_value = "haproxy",
        help_heading = "HAProxy"
    )]
    pub haproxy_binary: PathBuf,

    /// HAProxy's master CLI socket: with --haproxy-config, where certwatch creates it
    /// (default: the stats socket's path with `.master` appended); without, the socket
    /// of a HAProxy run by someone else in master-worker mode, which certwatch may then
    /// reload for certificates too large for the runtime API. With --haproxy-config-dir
    /// and --run-haproxy false: the master CLI of the HAProxy others run on that
    /// directory's configuration (a sidecar), which certwatch reloads for route changes.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_MASTER_SOCKET",
        value_name = "PATH",
        requires = "haproxy_target",
        help_heading = "HAProxy"
    )]
    pub haproxy_master_socket: Option<PathBuf>,

    /// Longest a start or reload of HAProxy may take (it loads every certificate).
    #[arg(long, env = "CERTWATCH_HAPROXY_LOAD_TIMEOUT", value_name = "D", value_parser = duration_arg, default_value = "10m", help_heading = "HAProxy")]
    pub haproxy_load_timeout: Duration,

    /// Longest HAProxy's runtime API may stay silent while answers are due.
    #[arg(long, env = "CERTWATCH_HAPROXY_COMMAND_TIMEOUT", value_name = "D", value_parser = duration_arg, default_value = "10s", help_heading = "HAProxy")]
    pub haproxy_command_timeout: Duration,

    /// Least time between two reloads of HAProxy (with --haproxy-config-dir, route
    /// changes and endpoint changes the runtime API cannot make come at most this often,
    /// each reload taking every change since the last).
    #[arg(long, env = "CERTWATCH_HAPROXY_MIN_RELOAD_INTERVAL", value_name = "D", value_parser = duration_arg, default_value = "5s", help_heading = "HAProxy")]
    pub haproxy_min_reload_interval: Duration,

    /// HTTP header names whose case HAProxy adjusts in HTTP/1, comma-separated, each as
    /// it should be written (the OpenShift router's ROUTER_H1_CASE_ADJUST): in every
    /// response to clients, and in requests to the backends of routes annotated
    /// haproxy.router.openshift.io/h1-adjust-case: true.
    #[arg(long, env = "CERTWATCH_H1_CASE_ADJUST", value_name = "NAMES", value_parser = header_names_arg, help_heading = "HAProxy")]
    pub http_header_name_case_adjustments: Option<HeaderNames>,

    /// Offer no HTTP/2 in the crt-list (no `[alpn h2,http/1.1]` on any line), as the
    /// OpenShift router's ROUTER_DISABLE_HTTP2.
    #[arg(long, env = "CERTWATCH_DISABLE_HTTP2", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "HAProxy")]
    pub disable_http2: bool,

    /// Address of the plain HTTP endpoint: /healthz, /readyz (and /metrics with
    /// --metrics-unauthenticated). HOST:PORT, or :PORT for every interface (IPv6 and
    /// IPv4 where the host has IPv6).
    #[arg(
        long,
        env = "CERTWATCH_LISTEN",
        value_name = "ADDR",
        value_parser = listen_arg,
        default_value = ":9090",
        help_heading = "Output"
    )]
    pub listen: SocketAddr,

    /// Serve /metrics here instead, over HTTPS, to authorized scrapers only: each
    /// bearer token is checked with a TokenReview, then a SubjectAccessReview for get
    /// on the non-resource URL /metrics (needs create on both: the
    /// system:auth-delegator cluster role). HOST:PORT or :PORT.
    #[arg(
        long,
        env = "CERTWATCH_METRICS_LISTEN",
        value_name = "ADDR",
        value_parser = listen_arg,
        help_heading = "Metrics"
    )]
    pub metrics_listen: Option<SocketAddr>,

    /// The metrics endpoint's certificate chain (PEM, leaf first), read again when it
    /// changes; default: a self-signed certificate made at start.
    #[arg(
        long,
        env = "CERTWATCH_METRICS_TLS_CERT",
        value_name = "PATH",
        requires_all = ["metrics_tls_key", "metrics_listen"],
        help_heading = "Metrics"
    )]
    pub metrics_tls_cert: Option<PathBuf>,

    /// The private key of --metrics-tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "CERTWATCH_METRICS_TLS_KEY",
        value_name = "PATH",
        requires = "metrics_tls_cert",
        help_heading = "Metrics"
    )]
    pub metrics_tls_key: Option<PathBuf>,

    /// How long a token's review and its user's authorization are trusted.
    #[arg(long, env = "CERTWATCH_METRICS_AUTH_CACHE_TTL", value_name = "D", value_parser = duration_arg, default_value = "10s", help_heading = "Metrics")]
    pub metrics_auth_cache_ttl: Duration,

    /// Name of this router in route status (status.ingress[].routerName).
    #[arg(
        long,
        env = "CERTWATCH_ROUTER_NAME",
        value_name = "NAME",
        default_value = "certwatch",
        help_heading = "Router"
    )]
    pub router_name: String,

    /// Record each route's admission or rejection (with its reason) in its status;
    /// needs update on routes/status.
    #[arg(long, env = "CERTWATCH_WRITE_STATUS", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Router")]
    pub write_status: bool,

    /// With --write-status: elect one status writer among the replicas of this router
    /// name on a coordination.k8s.io Lease (needs create, get, list, watch and update
    /// on leases in its namespace). Every replica serves certificates either way;
    /// `--leader-elect=false` makes this one always write.
    #[arg(long, env = "CERTWATCH_LEADER_ELECT", value_parser = boolish(), default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Router")]
    pub leader_elect: bool,

    /// The Lease's name (default: certwatch-<router name>).
    #[arg(
        long,
        env = "CERTWATCH_LEASE_NAME",
        value_name = "NAME",
        help_heading = "Router"
    )]
    pub lease_name: Option<String>,

    /// The Lease's namespace (default: the client's, in a pod its own).
    #[arg(
        long,
        env = "CERTWATCH_LEASE_NAMESPACE",
        value_name = "NS",
        help_heading = "Router"
    )]
    pub lease_namespace: Option<String>,

    /// This replica's holder identity (default: the host name, in a pod the pod's
    /// name, and a random suffix).
    #[arg(
        long,
        env = "CERTWATCH_LEASE_IDENTITY",
        value_name = "ID",
        help_heading = "Router"
    )]
    pub lease_identity: Option<String>,

    /// How long the Lease is good for after a follower saw it renewed: a leader killed
    /// outright is replaced within this long.
    #[arg(long, env = "CERTWATCH_LEASE_DURATION", value_name = "D", value_parser = duration_arg, default_value = "15s", help_heading = "Router")]
    pub lease_duration: Duration,

    /// How long the leader keeps writing while it cannot renew (less than
    /// --lease-duration).
    #[arg(long, env = "CERTWATCH_LEASE_RENEW_DEADLINE", value_name = "D", value_parser = duration_arg, default_value = "10s", help_heading = "Router")]
    pub lease_renew_deadline: Duration,

    /// How often the leader renews the Lease.
    #[arg(long, env = "CERTWATCH_LEASE_RETRY_PERIOD", value_name = "D", value_parser = duration_arg, default_value = "2s", help_heading = "Router")]
    pub lease_retry_period: Duration,

    /// How the router identity's access (get, list, watch) to each secret is checked.
    #[arg(
        long,
        env = "CERTWATCH_ACCESS_CHECK",
        value_enum,
        default_value_t,
        help_heading = "Router"
    )]
    pub access_check: AccessCheck,

    /// With --access-check subject: the user to check, e.g.
    /// system:serviceaccount:openshift-ingress:router.
    #[arg(
        long,
        env = "CERTWATCH_ROUTER_IDENTITY",
        value_name = "USER",
        help_heading = "Router"
    )]
    pub router_identity: Option<String>,

    /// With --access-check subject: the groups of that user (comma-separated).
    #[arg(
        long,
        env = "CERTWATCH_ROUTER_GROUPS",
        value_name = "GROUP",
        value_delimiter = ',',
        help_heading = "Router"
    )]
    pub router_groups: Vec<String>,

    /// How long access answers are cached (a revoked grant also shows as a failing
    /// watch).
    #[arg(long, env = "CERTWATCH_ACCESS_CACHE_TTL", value_name = "D", value_parser = duration_arg, default_value = "10m", help_heading = "Router")]
    pub access_cache_ttl: Duration,

    /// How long a cached denial is trusted: a grant added after a route was rejected
    /// is noticed after at most this long (at the route's next retry).
    #[arg(long, env = "CERTWATCH_ACCESS_DENIED_TTL", value_name = "D", value_parser = duration_arg, default_value = "30s", help_heading = "Router")]
    pub access_denied_ttl: Duration,

    /// The OpenSSL security level of the HAProxy the certificates are for (1 to 5): a
    /// certificate with a key that HAProxy refuses at that level (RSA under 1024 bits at
    /// 1, under 2048 at 2, ...) is rejected, with a reason that says so, instead of
    /// breaking HAProxy's whole crt-list. The OpenShift router image runs HAProxy at 1;
    /// Debian's OpenSSL defaults to 2. The HAProxy certwatch runs (--haproxy-config,
    /// --haproxy-config-dir) runs at this level (an OPENSSL_CONF certwatch writes); one
    /// run by others must be given it (its OPENSSL_CONF).
    #[arg(
        long,
        env = "CERTWATCH_OPENSSL_SECURITY_LEVEL",
        value_name = "LEVEL",
        default_value = "1",
        help_heading = "Router"
    )]
    pub openssl_security_level: SecurityLevel,

    /// Admit routes with spec.wildcardPolicy: Subdomain (served for `*.<domain>` of
    /// their host); rejected RouteNotAdmitted otherwise, as by the router.
    #[arg(long, env = "CERTWATCH_ALLOW_WILDCARD_ROUTES", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Router")]
    pub allow_wildcard_routes: bool,

    /// The domain of routes with spec.subdomain and no spec.host: such a route is
    /// admitted, served and recorded as `<subdomain>.<domain>`, as by the router with
    /// ROUTER_DOMAIN; without it such routes are rejected NoHostValue.
    #[arg(
        long,
        env = "CERTWATCH_ROUTER_DOMAIN",
        value_name = "DOMAIN",
        help_heading = "Router"
    )]
    pub router_domain: Option<String>,

    /// Let routes of any namespace claim a host (with different paths). By default a
    /// host belongs to the namespace of its oldest route, and routes of other
    /// namespaces are rejected HostAlreadyClaimed.
    #[arg(long, env = "CERTWATCH_DISABLE_NAMESPACE_OWNERSHIP_CHECK", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Router")]
    pub disable_namespace_ownership_check: bool,

    /// At most this many secrets' first syncs at once (default: no limit), for an API
    /// server with a small concurrency budget.
    #[arg(
        long,
        env = "CERTWATCH_MAX_CONCURRENT_SYNCS",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..),
        help_heading = "Router"
    )]
    pub max_concurrent_syncs: Option<u32>,

    /// Deadline of a secret's first sync; the route is then rejected and retried.
    #[arg(long, env = "CERTWATCH_SYNC_TIMEOUT", value_name = "D", value_parser = duration_arg, default_value = "2m", help_heading = "Router")]
    pub sync_timeout: Duration,

    /// Log format on stderr (level: RUST_LOG, default info).
    #[arg(
        long,
        env = "CERTWATCH_LOG_FORMAT",
        value_enum,
        default_value_t,
        help_heading = "Logging"
    )]
    pub log_format: LogFormat,

    /// Least severe log level shown (error, warn, info, debug, trace). Merged into the
    /// default filter, which keeps libraries' noise out at any level; `RUST_LOG`
    /// directives, when set, are merged after it (per target).
    #[arg(
        long,
        env = "CERTWATCH_LOG_LEVEL",
        value_enum,
        default_value_t,
        help_heading = "Logging"
    )]
    pub log_level: crate::logging::LogLevel,

    /// Start-up progress: a bar on a terminal, log lines otherwise (auto).
    #[arg(
        long,
        env = "CERTWATCH_PROGRESS",
        value_enum,
        default_value_t,
        help_heading = "Logging"
    )]
    pub progress: ProgressMode,

    /// Route traffic: write HAProxy's whole configuration for the served routes into
    /// DIR (frontends for HTTP and HTTPS with the OpenShift router's rules, maps, one
    /// backend per route with its servers from the services' EndpointSlices) and run
    /// HAProxy on it (see --run-haproxy). Its runtime API socket is DIR/run/haproxy.sock
    /// (certificates and endpoint changes go through it, without a reload).
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_CONFIG_DIR",
        value_name = "DIR",
        help_heading = "Routing"
    )]
    pub haproxy_config_dir: Option<PathBuf>,

    /// The page HAProxy answers with when no server serves (a route's service without
    /// endpoints, an unknown host), as the OpenShift router's ROUTER_ERRORFILE_503: a
    /// file holding a whole HTTP response (status line, headers, empty line, body),
    /// read and checked at start-up and copied into --haproxy-config-dir. Default:
    /// certwatch's own page.
    #[arg(
        long = "error-page-503",
        env = "CERTWATCH_ERROR_PAGE_503",
        value_name = "FILE",
        value_parser = error_page_arg,
        requires = "haproxy_config_dir",
        help_heading = "Routing"
    )]
    pub error_page_503: Option<ErrorPage>,

    /// The page HAProxy answers with for a request no route takes (an unknown host or
    /// path), as the OpenShift router's ROUTER_ERRORFILE_404: a whole HTTP response as
    /// for --error-page-503. With it such requests are answered 404 with this page
    /// (without it, 503), as the router does when ROUTER_ERRORFILE_404 is set.
    #[arg(
        long = "error-page-404",
        env = "CERTWATCH_ERROR_PAGE_404",
        value_name = "FILE",
        value_parser = error_page_arg,
        requires = "haproxy_config_dir",
        help_heading = "Routing"
    )]
    pub error_page_404: Option<ErrorPage>,

    /// Run HAProxy (master-worker, reloaded by certwatch) on --haproxy-config-dir; off:
    /// only write the files, for an HAProxy run by others (started on DIR/haproxy.cfg
    /// once it exists), which certwatch reloads through --haproxy-master-socket.
    #[arg(
        long,
        env = "CERTWATCH_RUN_HAPROXY",
        value_name = "BOOL",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = boolish(),
        num_args = 0..=1,
        default_missing_value = "true",
        help_heading = "Routing"
    )]
    pub run_haproxy: bool,

    /// Plain HTTP listener (the router's is :80; certwatch runs unprivileged). `:PORT`
    /// listens on IPv6 and IPv4 where the host has IPv6; an address, on it only.
    #[arg(
        long,
        env = "CERTWATCH_HTTP_BIND",
        value_name = "ADDR",
        default_value = ":8080",
        help_heading = "Routing"
    )]
    pub http_bind: String,

    /// TLS listener (the router's is :443); `:PORT` as --http-bind.
    #[arg(
        long,
        env = "CERTWATCH_HTTPS_BIND",
        value_name = "ADDR",
        default_value = ":8443",
        help_heading = "Routing"
    )]
    pub https_bind: String,

    /// The certificate (chain and key, PEM) served for names no route has; default: a
    /// self-signed one made in --haproxy-config-dir.
    #[arg(
        long,
        env = "CERTWATCH_DEFAULT_CERTIFICATE",
        value_name = "PATH",
        help_heading = "Routing"
    )]
    pub default_certificate: Option<PathBuf>,

    /// The CA bundle that verifies the backends of reencrypt routes without a
    /// destinationCACertificate (the service CA, the router's
    /// DEFAULT_DESTINATION_CA_PATH); default: the service account's service-ca.crt when
    /// it exists, else such backends are not verified (as the router does). A file
    /// given here must hold PEM certificates at start (HAProxy's configuration names
    /// it: a sidecar HAProxy must see it at the same path).
    #[arg(
        long,
        env = "CERTWATCH_DEFAULT_DESTINATION_CA",
        value_name = "PATH",
        value_parser = ca_bundle_arg,
        help_heading = "Routing"
    )]
    pub default_destination_ca: Option<PathBuf>,

    /// Spare servers (in maintenance) per backend, kept for endpoints that come; an
    /// endpoint no spare server takes is added to HAProxy at run time (`add server`),
    /// and servers endpoints leave are deleted down to this many. Either way, no reload.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_SPARE_SERVERS",
        value_name = "N",
        default_value_t = 0,
        help_heading = "Routing"
    )]
    pub haproxy_spare_servers: usize,

    /// HAProxy's maxconn (the router's ROUTER_MAX_CONNECTIONS).
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_MAX_CONNECTIONS",
        value_name = "N",
        default_value_t = 50_000,
        help_heading = "Routing"
    )]
    pub haproxy_max_connections: u32,

    /// HAProxy's nbthread. Default: the router's 4, or one per CPU where certwatch may
    /// run on fewer (its CPU affinity and CPU quota, which HAProxy beside it shares in
    /// the Deployment): threads beyond the cores only wait for one another, and the
    /// runtime API's thread, which applies certificate changes, waits with them.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_THREADS",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=4096),
        help_heading = "Routing"
    )]
    pub haproxy_threads: Option<u32>,

    // Production traffic: the TLS policy, shutdown and draining, HAProxy's bounds, the
    // metrics' exposure.
    /// OpenShift's TLS security profile for every TLS listener (HAProxy's and the
    /// metrics endpoint): old (TLS 1.0+, CBC and 3DES too), intermediate (TLS 1.2+,
    /// AEAD only), modern (TLS 1.3 only).
    #[arg(
        long,
        env = "CERTWATCH_TLS_PROFILE",
        value_enum,
        default_value_t,
        help_heading = "TLS policy"
    )]
    pub tls_profile: TlsProfile,

    /// TLS 1.2 and older ciphers instead of the profile's (an OpenSSL cipher list,
    /// e.g. `ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256`; the router's
    /// ROUTER_CIPHERS).
    #[arg(
        long,
        env = "CERTWATCH_TLS_CIPHERS",
        value_name = "LIST",
        help_heading = "TLS policy"
    )]
    pub tls_ciphers: Option<String>,

    /// TLS 1.3 suites instead of the profile's (e.g.
    /// `TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384`; the router's
    /// ROUTER_CIPHERSUITES).
    #[arg(
        long,
        env = "CERTWATCH_TLS_CIPHERSUITES",
        value_name = "LIST",
        help_heading = "TLS policy"
    )]
    pub tls_ciphersuites: Option<String>,

    /// The lowest TLS version instead of the profile's (the router's SSL_MIN_VERSION).
    #[arg(
        long,
        env = "CERTWATCH_TLS_MIN_VERSION",
        value_enum,
        help_heading = "TLS policy"
    )]
    pub tls_min_version: Option<TlsVersion>,

    /// Serve /metrics on --listen without authentication when there is no
    /// --metrics-listen (for development on a loopback address: the metrics name
    /// every tenant's namespaces, routes and secrets). Off: /metrics is only served
    /// by --metrics-listen. Ignored with --metrics-listen.
    #[arg(long, env = "CERTWATCH_METRICS_UNAUTHENTICATED", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Metrics")]
    pub metrics_unauthenticated: bool,

    /// On SIGTERM, /readyz answers 503 at once and HAProxy keeps serving this long
    /// (while endpoints and load balancers take the replica out), then stops softly;
    /// a second SIGTERM or SIGINT stops at once (the router's
    /// ROUTER_GRACEFUL_SHUTDOWN_DELAY).
    #[arg(long, env = "CERTWATCH_SHUTDOWN_DELAY", value_name = "D", value_parser = duration_arg, default_value = "45s", help_heading = "Shutdown")]
    pub shutdown_delay: Duration,

    /// The grace period certwatch runs under (the pod's
    /// terminationGracePeriodSeconds): a --shutdown-delay that does not fit in it is
    /// refused at start, and the HAProxy certwatch runs gets what it leaves after the
    /// delay (at most --haproxy-hard-stop-after) for its connections to finish.
    #[arg(long, env = "CERTWATCH_TERMINATION_GRACE_PERIOD", value_name = "D", value_parser = duration_arg, help_heading = "Shutdown")]
    pub termination_grace_period: Option<Duration>,

    /// How long HAProxy's old workers may finish their connections after a reload or
    /// a soft stop before they are stopped (HAProxy's hard-stop-after); also the
    /// longest certwatch waits for the HAProxy it runs to drain when it stops.
    #[arg(long, env = "CERTWATCH_HAPROXY_HARD_STOP_AFTER", value_name = "D", value_parser = duration_arg, default_value = "1h", help_heading = "Shutdown")]
    pub haproxy_hard_stop_after: Duration,

    /// Where HAProxy itself answers `GET /healthz` with 200 (its `monitor-uri`), for a
    /// liveness probe of the HAProxy process (the router's is :1936); default: nowhere.
    #[arg(
        long,
        env = "CERTWATCH_HAPROXY_HEALTH_BIND",
        value_name = "ADDR",
        help_heading = "Routing"
    )]
    pub haproxy_health_bind: Option<String>,

    /// HAProxy's public listeners (--http-bind, --https-bind) take connections only
    /// with a PROXY protocol header (v1 or v2) from the load balancer in front, and
    /// route with the client's address from it (X-Forwarded-For, Forwarded); a
    /// connection without one is refused (the router's ROUTER_USE_PROXY_PROTOCOL).
    #[arg(long, env = "CERTWATCH_PROXY_PROTOCOL", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Routing")]
    pub proxy_protocol: bool,

    /// One line per HTTP request on standard output, from the HAProxy certwatch
    /// configures (HAProxy's httplog: client, frontend, the route's backend and
    /// server, timings, status, bytes, termination state, request line); passthrough
    /// connections are not logged. Off by default.
    #[arg(long, env = "CERTWATCH_ACCESS_LOG", value_parser = boolish(), default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", help_heading = "Routing")]
    pub access_log: bool,
}

/// Where a pod's service account keeps the service CA bundle (OpenShift injects it).
pub const SERVICE_CA_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt";

/// Options that do not fit together.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// `--access-check subject` without `--router-identity`.
    #[error(
        "--access-check subject needs --router-identity USER (the identity whose access is checked)"
    )]
    MissingRouterIdentity,
    /// The Lease's name is no DNS subdomain.
    #[error("--lease-name {name:?} is not a valid Lease name ({source}); set --lease-name")]
    LeaseName {
        /// The name.
        name: String,
        /// Why.
        source: kube_common::NameError,
    },
    /// The election's timings do not fit together.
    #[error(
        "--lease-retry-period ({retry:?}) must be shorter than --lease-renew-deadline \
         ({renew:?}), and that shorter than --lease-duration ({duration:?})"
    )]
    LeaseTimings {
        /// `--lease-duration`.
        duration: Duration,
        /// `--lease-renew-deadline`.
        renew: Duration,
        /// `--lease-retry-period`.
        retry: Duration,
    },
    /// A master socket for the HAProxy certwatch runs on --haproxy-config-dir.
    #[error(
        "--haproxy-master-socket with --haproxy-config-dir names the master CLI of a HAProxy \
         run by others: set --run-haproxy false (certwatch's own HAProxy has its master CLI \
         in DIR/run/master.sock)"
    )]
    MasterSocketOfManagedRouting,
    /// The TLS policy's flags are refused.
    #[error(transparent)]
    TlsPolicy(#[from] TlsPolicyError),
    /// The shutdown delay does not fit in the grace period.
    #[error(
        "--shutdown-delay {delay:?} does not fit in the termination grace period \
         ({grace:?}, --termination-grace-period): the process would be killed while \
         still serving; shorten --shutdown-delay or lengthen the pod's \
         terminationGracePeriodSeconds (and --termination-grace-period with it)"
    )]
    ShutdownDelay {
        /// `--shutdown-delay`.
        delay: Duration,
        /// `--termination-grace-period`.
        grace: Duration,
    },
}

/// The HAProxy deployment that the five HAProxy flags (--haproxy-socket,
/// --haproxy-config, --haproxy-master-socket, --haproxy-config-dir, --run-haproxy)
/// describe together: one of the combinations certwatch accepts, each with what it
/// needs ([`RunArgs::haproxy_deployment`] refuses the others).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HaproxyDeployment {
    /// No HAProxy: certificate files only (and --reload-command).
    Files,
    /// --haproxy-socket without --haproxy-config-dir: certificates go to that HAProxy.
    Certificates(SocketHaproxy),
    /// --haproxy-config-dir with --run-haproxy: certwatch writes the configuration in
    /// `dir` and runs HAProxy on it.
    Routing {
        /// --haproxy-config-dir, absolute.
        dir: PathBuf,
        /// Where the certificates go; a HAProxy run by others is reached without its
        /// master CLI (certwatch's own is DIR/run/master.sock).
        certificates: RoutedCertificates,
    },
    /// --haproxy-config-dir with --run-haproxy false: certwatch writes the
    /// configuration in `dir` for a HAProxy others run on it (a sidecar).
    Sidecar {
        /// --haproxy-config-dir, absolute.
        dir: PathBuf,
        /// --haproxy-master-socket: the sidecar's master CLI, through which certwatch
        /// reloads it for route changes and certificates; without it others reload.
        master: Option<PathBuf>,
        /// Where the certificates go.
        certificates: RoutedCertificates,
    },
}

/// The HAProxy behind --haproxy-socket when certwatch does not write HAProxy's
/// configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketHaproxy {
    /// Run by others; its master CLI (--haproxy-master-socket), if given, lets
    /// certwatch reload it for certificates too large for the runtime API.
    External {
        /// --haproxy-socket.
        socket: PathBuf,
        /// --haproxy-master-socket.
        master: Option<PathBuf>,
    },
    /// Run by certwatch on --haproxy-config.
    Managed(ManagedHaproxy),
}

/// A HAProxy that certwatch runs on a configuration of the user's (--haproxy-config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedHaproxy {
    /// --haproxy-socket: the runtime API the configuration's `stats socket` names.
    pub socket: PathBuf,
    /// --haproxy-config.
    pub config: PathBuf,
    /// --haproxy-master-socket, by default the socket's path with `.master` appended.
    pub master: PathBuf,
}

/// Where the certificates go while certwatch writes HAProxy's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoutedCertificates {
    /// To the HAProxy that serves the configuration, through DIR/run/haproxy.sock.
    Served,
    /// To another HAProxy run by others (--haproxy-socket).
    External {
        /// --haproxy-socket.
        socket: PathBuf,
    },
    /// To a HAProxy certwatch runs on --haproxy-config.
    Managed(ManagedHaproxy),
}

impl HaproxyDeployment {
    /// --haproxy-config-dir, where certwatch writes HAProxy's configuration.
    pub fn config_dir(&self) -> Option<&Path> {
        match self {
            Self::Files | Self::Certificates(_) => None,
            Self::Routing { dir, .. } | Self::Sidecar { dir, .. } => Some(dir),
        }
    }

    /// The HAProxy that the certificates go to: its runtime API socket, and either the
    /// process certwatch runs or the master CLI of the one others run (if known).
    fn certificate_target(&self) -> Option<CertificateTarget<'_>> {
        // (where the certificates go, the configuration's directory, the master CLI of
        // the HAProxy serving it, the master CLI of another HAProxy run by others)
        let (certificates, dir, served_master, other_master) = match self {
            Self::Files => return None,
            Self::Certificates(SocketHaproxy::Managed(managed)) => {
                return Some(CertificateTarget::Managed(managed));
            }
            Self::Certificates(SocketHaproxy::External { socket, master }) => {
                return Some(CertificateTarget::External(socket.clone(), master.clone()));
            }
            Self::Routing { dir, certificates } => (
                certificates,
                dir,
                Some(crate::routing::supervisor::master_socket(
                    &dir.join(crate::routing::CONFIG_FILE),
                )),
                None,
            ),
            Self::Sidecar {
                dir,
                master,
                certificates,
            } => (certificates, dir, master.clone(), master.clone()),
        };
        Some(match certificates {
            RoutedCertificates::Served => {
                CertificateTarget::External(dir.join("run").join("haproxy.sock"), served_master)
            }
            RoutedCertificates::External { socket } => {
                CertificateTarget::External(socket.clone(), other_master)
            }
            RoutedCertificates::Managed(managed) => CertificateTarget::Managed(managed),
        })
    }
}

/// What [`HaproxyDeployment::certificate_target`] finds.
enum CertificateTarget<'a> {
    /// A HAProxy run by others: its runtime API socket and master CLI.
    External(PathBuf, Option<PathBuf>),
    /// The HAProxy certwatch runs on --haproxy-config.
    Managed(&'a ManagedHaproxy),
}

/// HAProxy's threads when `--haproxy-threads` is not given: the router's
/// [`ROUTER_HAPROXY_THREADS`], or one per CPU when fewer are available (`None`: unknown,
/// then the router's).
pub fn default_haproxy_threads(available_cpus: Option<std::num::NonZeroUsize>) -> u32 {
    available_cpus
        .and_then(|cpus| u32::try_from(cpus.get()).ok())
        .map_or(ROUTER_HAPROXY_THREADS, |cpus| {
            cpus.min(ROUTER_HAPROXY_THREADS)
        })
}

/// The OpenShift router's HAProxy threads (`ROUTER_THREADS`' default).
pub const ROUTER_HAPROXY_THREADS: u32 = 4;

impl RunArgs {
    /// HAProxy's `nbthread`: `--haproxy-threads`, or [`default_haproxy_threads`] of the
    /// CPUs this process may run on.
    pub fn haproxy_threads(&self) -> u32 {
        self.haproxy_threads
            .unwrap_or_else(|| default_haproxy_threads(std::thread::available_parallelism().ok()))
    }

    /// How long the HAProxy certwatch runs gets, after the shutdown delay, for its
    /// connections to finish once stopped softly: what the termination grace period
    /// leaves after the delay, and never longer than --haproxy-hard-stop-after (the
    /// bound HAProxy itself keeps on a soft stop of the configuration certwatch
    /// writes). Without --termination-grace-period: --haproxy-hard-stop-after.
    pub fn haproxy_drain_bound(&self) -> Duration {
        self.termination_grace_period
            .map(|grace| grace.saturating_sub(self.shutdown_delay))
            .map_or(self.haproxy_hard_stop_after, |left| {
                left.min(self.haproxy_hard_stop_after)
            })
    }

    /// The daemon options these arguments describe.
    pub fn daemon_options(&self) -> Result<DaemonOptions, ArgsError> {
        let deployment = self.haproxy_deployment()?;
        let access_policy = match self.access_check {
            AccessCheck::SelfRules => AccessPolicy::SelfRules,
            AccessCheck::SelfReview => AccessPolicy::SelfReviews,
            AccessCheck::Subject => AccessPolicy::Subject {
                user: self
                    .router_identity
                    .clone()
                    .ok_or(ArgsError::MissingRouterIdentity)?,
                groups: self.router_groups.clone(),
            },
        };
        let identity = self
            .router_identity
            .clone()
            .unwrap_or_else(|| "certwatch's service account".to_owned());
        let protocol = match self.api_protocol {
            ApiProtocol::Auto => kube_h2::Protocol::Auto,
            ApiProtocol::Http1 => kube_h2::Protocol::Http1Only,
            ApiProtocol::Http2 => kube_h2::Protocol::Http2Only,
        };
        let tls = self.tls_policy()?;
        if let Some(grace) = self.termination_grace_period
            && self.shutdown_delay >= grace
        {
            return Err(ArgsError::ShutdownDelay {
                delay: self.shutdown_delay,
                grace,
            });
        }
        let mut options = DaemonOptions::new(self.cert_dir.clone());
        options.haproxy_drain = Drain::new(self.haproxy_drain_bound());
        options.scope = RouteScope {
            namespaces: self.namespace.clone(),
            namespace_selector: self.namespace_selector.clone(),
            route_selector: self.route_selector.clone(),
        };
        options.reload = self.reload_command.clone().map(|command| ReloadOptions {
            debounce: self.reload_debounce,
            max_delay: self.reload_max_delay.max(self.reload_debounce),
            timeout: self.reload_timeout,
            ..ReloadOptions::new(command)
        });
        options.haproxy = self.haproxy_options(&deployment);
        options.crt_list.http2 = !self.disable_http2;
        options.routing = self.routing_options(&deployment, &tls);
        options.listen = Some(self.listen);
        options.secure_metrics = self.metrics_listen.map(|listen| SecureMetricsOptions {
            cert: self
                .metrics_tls_cert
                .clone()
                .zip(self.metrics_tls_key.clone())
                .map(|(cert, key)| CertFiles { cert, key }),
            cache_ttl: self.metrics_auth_cache_ttl,
            tls: tls.clone(),
            haproxy_metrics: options
                .routing
                .as_ref()
                .and_then(|routing| routing.render.metrics_socket.clone()),
            ..SecureMetricsOptions::new(listen)
        });
        options.unauthenticated_metrics = self.metrics_unauthenticated;
        options.router_name = self.router_name.clone();
        options.write_status = self.write_status;
        options.access_policy = access_policy;
        options.access_ttl = self.access_cache_ttl;
        options.access_denied_ttl = self.access_denied_ttl;
        options.hosts.allow_wildcard_routes = self.allow_wildcard_routes;
        options.router_domain = self
            .router_domain
            .clone()
            .filter(|domain| !domain.is_empty());
        options.openssl_security_level = self.openssl_security_level;
        options.hosts.disable_namespace_ownership_check = self.disable_namespace_ownership_check;
        options.identity = identity;
        options.max_concurrent_syncs = self
            .max_concurrent_syncs
            .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX));
        options.sync_timeout = self.sync_timeout;
        options.client = kube_h2::ClientOptions::default().protocol(protocol);
        options.progress = self.progress;
        options.leader_election = self.leader_election()?;
        Ok(options)
    }

    /// The HAProxy deployment the HAProxy flags describe; a combination certwatch
    /// cannot serve is refused with the flags it names.
    pub fn haproxy_deployment(&self) -> Result<HaproxyDeployment, ArgsError> {
        let master = self.haproxy_master_socket.clone();
        // --haproxy-config requires --haproxy-socket (clap checks it).
        let managed = self
            .haproxy_socket
            .clone()
            .zip(self.haproxy_config.clone())
            .map(|(socket, config)| ManagedHaproxy {
                master: master.clone().unwrap_or_else(|| {
                    let mut path = socket.clone().into_os_string();
                    path.push(".master");
                    PathBuf::from(path)
                }),
                socket,
                config,
            });
        let Some(dir) = &self.haproxy_config_dir else {
            return Ok(match (managed, self.haproxy_socket.clone()) {
                (Some(managed), _) => {
                    HaproxyDeployment::Certificates(SocketHaproxy::Managed(managed))
                }
                (None, Some(socket)) => {
                    HaproxyDeployment::Certificates(SocketHaproxy::External { socket, master })
                }
                (None, None) => HaproxyDeployment::Files,
            });
        };
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        let certificates = match (managed, self.haproxy_socket.clone()) {
            (Some(managed), _) => RoutedCertificates::Managed(managed),
            (None, Some(socket)) => RoutedCertificates::External { socket },
            (None, None) => RoutedCertificates::Served,
        };
        if !self.run_haproxy {
            return Ok(HaproxyDeployment::Sidecar {
                dir,
                master,
                certificates,
            });
        }
        // The master socket's only meaning here would be a managed HAProxy's.
        if master.is_some() && !matches!(certificates, RoutedCertificates::Managed(_)) {
            return Err(ArgsError::MasterSocketOfManagedRouting);
        }
        Ok(HaproxyDeployment::Routing { dir, certificates })
    }

    /// The certificates' HAProxy of `deployment`, with the timing flags.
    fn haproxy_options(&self, deployment: &HaproxyDeployment) -> Option<HaproxyOptions> {
        let mut haproxy = match deployment.certificate_target()? {
            CertificateTarget::Managed(managed) => {
                let mut process = ProcessOptions::new(
                    &self.haproxy_binary,
                    &managed.config,
                    managed.master.clone(),
                );
                process.load_timeout = self.haproxy_load_timeout;
                process.command_timeout = self.haproxy_command_timeout;
                HaproxyOptions::managed(managed.socket.clone(), process)
            }
            CertificateTarget::External(socket, master) => {
                HaproxyOptions::with_master(socket, master)
            }
        };
        haproxy.min_reload_interval = self.haproxy_min_reload_interval;
        haproxy.command_timeout = self.haproxy_command_timeout;
        Some(haproxy)
    }

    /// The routing task's options where `deployment` writes HAProxy's configuration.
    fn routing_options(
        &self,
        deployment: &HaproxyDeployment,
        tls: &TlsPolicy,
    ) -> Option<RoutingOptions> {
        let dir = deployment.config_dir()?;
        let socket = dir.join("run").join("haproxy.sock");
        let crt_list = std::path::absolute(&self.cert_dir)
            .unwrap_or_else(|_| self.cert_dir.clone())
            .join(crate::files::CRT_LIST_FILE);
        let default_certificate = self
            .default_certificate
            .clone()
            .unwrap_or_else(|| dir.join("default.pem"));
        let mut render = RenderOptions::new(dir.to_owned(), crt_list, default_certificate, socket);
        render.http_bind = haproxy_bind(&self.http_bind);
        render.https_bind = haproxy_bind(&self.https_bind);
        render.spare_servers = self.haproxy_spare_servers;
        render.max_connections = self.haproxy_max_connections;
        render.threads = Some(self.haproxy_threads());
        render.tls = tls.clone();
        render.hard_stop_after = Some(self.haproxy_hard_stop_after);
        render.health_bind = self.haproxy_health_bind.as_deref().map(haproxy_bind);
        render.proxy_protocol = self.proxy_protocol;
        render.access_log = self.access_log;
        // HAProxy's own series go to the scrapers the metrics endpoint authorizes.
        render.metrics_socket = self
            .metrics_listen
            .map(|_| dir.join("run").join("haproxy-metrics.sock"));
        render.disable_http2 = self.disable_http2;
        render.error_pages.page_503 = self.error_page_503.clone();
        render.error_pages.page_404 = self.error_page_404.clone();
        render.header_case_adjustments = self
            .http_header_name_case_adjustments
            .clone()
            .unwrap_or_default()
            .0;
        render.default_destination_ca = self.default_destination_ca.clone().or_else(|| {
            Path::new(SERVICE_CA_PATH)
                .exists()
                .then(|| PathBuf::from(SERVICE_CA_PATH))
        });
        render.openssl_security_level = self.openssl_security_level;
        let mut routing = RoutingOptions::new(render);
        match deployment {
            HaproxyDeployment::Routing { .. } => {
                routing.haproxy_binary = Some(self.haproxy_binary.clone());
            }
            HaproxyDeployment::Sidecar { master, .. } => {
                routing.haproxy_binary = None;
                routing.reload_external = master.is_some();
            }
            HaproxyDeployment::Files | HaproxyDeployment::Certificates(_) => {}
        }
        routing.reload_interval = self.haproxy_min_reload_interval;
        Some(routing)
    }

    /// The TLS policy the flags describe (checked for HAProxy's configuration and
    /// rustls, not yet against HAProxy: see [`TlsPolicy::check_with_haproxy`]).
    pub fn tls_policy(&self) -> Result<TlsPolicy, TlsPolicyError> {
        let policy = TlsPolicy::new(
            self.tls_profile,
            self.tls_ciphers.as_deref(),
            self.tls_ciphersuites.as_deref(),
            self.tls_min_version,
        )?;
        // The metrics endpoint needs a suite rustls has.
        if self.metrics_listen.is_some() {
            policy.rustls()?;
        }
        Ok(policy)
    }

    /// The election of one status writer, if it is on (`--write-status` and
    /// `--leader-elect`).
    fn leader_election(&self) -> Result<Option<LeaseOptions>, ArgsError> {
        if !(self.write_status && self.leader_elect) {
            return Ok(None);
        }
        let name = self
            .lease_name
            .clone()
            .unwrap_or_else(|| format!("certwatch-{}", self.router_name));
        kube_common::name::subdomain(&name).map_err(|source| ArgsError::LeaseName {
            name: name.clone(),
            source,
        })?;
        if !(self.lease_retry_period < self.lease_renew_deadline
            && self.lease_renew_deadline < self.lease_duration)
        {
            return Err(ArgsError::LeaseTimings {
                duration: self.lease_duration,
                renew: self.lease_renew_deadline,
                retry: self.lease_retry_period,
            });
        }
        let identity = self.lease_identity.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME")
                .ok()
                .filter(|host| !host.is_empty())
                .unwrap_or_else(|| "certwatch".to_owned());
            format!("{host}_{:08x}", rand::random::<u32>())
        });
        Ok(Some(LeaseOptions {
            lease_duration: self.lease_duration,
            renew_deadline: self.lease_renew_deadline,
            retry_period: self.lease_retry_period,
            // Empty: the client's namespace, known once connected.
            ..LeaseOptions::new(
                self.lease_namespace.clone().unwrap_or_default(),
                name,
                identity,
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn haproxy_runs_the_router_s_four_threads_or_one_per_cpu_when_fewer() {
        let cpus = |n| std::num::NonZeroUsize::new(n);
        assert_eq!(default_haproxy_threads(cpus(1)), 1);
        assert_eq!(default_haproxy_threads(cpus(2)), 2);
        assert_eq!(default_haproxy_threads(cpus(4)), 4);
        assert_eq!(default_haproxy_threads(cpus(64)), 4);
        assert_eq!(default_haproxy_threads(None), 4);
    }

    #[test]
    fn header_names_are_tokens_as_the_router_takes_them() {
        assert_eq!(
            header_names_arg("Host,X-Request-ID").unwrap(),
            HeaderNames(vec!["Host".into(), "X-Request-ID".into()])
        );
        assert_eq!(header_names_arg("").unwrap(), HeaderNames::default());
        for bad in ["Host,", "Ho st", "A:B", "X#Y", "it's"] {
            assert!(header_names_arg(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod flag_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::Parser;

    use super::{
        ArgsError, HaproxyDeployment, ManagedHaproxy, RoutedCertificates, RunArgs, SocketHaproxy,
    };

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = ["certwatch", "--cert-dir", "/tmp/certs"]
            .into_iter()
            .chain(args.iter().copied());
        Command::try_parse_from(argv).map(|command| command.run)
    }

    /// (read from the arguments) every boolean, in [`FLAGS`]' order.
    fn booleans(args: &RunArgs) -> [bool; 9] {
        [
            args.write_status,
            args.leader_elect,
            args.run_haproxy,
            args.disable_http2,
            args.allow_wildcard_routes,
            args.disable_namespace_ownership_check,
            args.metrics_unauthenticated,
            args.proxy_protocol,
            args.access_log,
        ]
    }

    const FLAGS: [&str; 9] = [
        "--write-status",
        "--leader-elect",
        "--run-haproxy",
        "--disable-http2",
        "--allow-wildcard-routes",
        "--disable-namespace-ownership-check",
        "--metrics-unauthenticated",
        "--proxy-protocol",
        "--access-log",
    ];

    #[test]
    fn every_boolean_takes_the_bare_flag_and_an_explicit_value() {
        let defaults = booleans(&parse(&[]).unwrap());
        assert_eq!(
            defaults,
            [false, true, true, false, false, false, false, false, false]
        );
        for (index, flag) in FLAGS.into_iter().enumerate() {
            for (spelled, value) in [
                (flag.to_owned(), true),
                (format!("{flag}=true"), true),
                (format!("{flag}=false"), false),
                (format!("{flag}=0"), false),
                (format!("{flag}=yes"), true),
            ] {
                let parsed = booleans(&parse(&[&spelled]).unwrap());
                let mut expected = defaults;
                expected[index] = value;
                assert_eq!(parsed, expected, "{spelled}");
            }
            // The older spelling with a separate value still reads.
            let parsed = booleans(&parse(&[flag, "false"]).unwrap());
            assert!(!parsed[index], "{flag} false");
            // A bare flag before another flag takes no value from it.
            let parsed = parse(&[flag, "--router-name", "x"]).unwrap();
            assert!(booleans(&parsed)[index], "{flag} --router-name x");
            assert_eq!(parsed.router_name, "x");
            assert!(
                parse(&[&format!("{flag}=perhaps")]).is_err(),
                "{flag}=perhaps"
            );
        }
    }

    #[test]
    fn the_log_level_is_a_flag_with_a_default() {
        use crate::logging::LogLevel;
        assert_eq!(parse(&[]).unwrap().log_level, LogLevel::Info);
        assert_eq!(
            parse(&["--log-level", "debug"]).unwrap().log_level,
            LogLevel::Debug
        );
        assert!(parse(&["--log-level", "loud"]).is_err());
    }

    /// What the daemon does with HAProxy under `args`: the certificates' HAProxy
    /// (`-`, `ext SOCKET MASTER`, `managed SOCKET CONFIG MASTER`) and the routing task
    /// (`-`, `runs`, `writes`, `writes+reloads`), or the refusal's message.
    fn haproxy_shape(args: &[&str]) -> String {
        use crate::haproxy::HaproxyMode;
        let shown = |path: &std::path::Path| path.display().to_string();
        let options = match parse(args).unwrap().daemon_options() {
            Ok(options) => options,
            Err(error) => return format!("refused: {error}"),
        };
        let haproxy = match &options.haproxy {
            None => "-".to_owned(),
            Some(haproxy) => match &haproxy.mode {
                HaproxyMode::External { master_socket } => format!(
                    "ext {} {}",
                    shown(&haproxy.socket),
                    master_socket.as_deref().map_or("-".into(), shown)
                ),
                HaproxyMode::Managed(process) => format!(
                    "managed {} {} {}",
                    shown(&haproxy.socket),
                    shown(&process.config),
                    shown(&process.master_socket)
                ),
            },
        };
        let routing = match &options.routing {
            None => "-",
            Some(routing) => match (routing.haproxy_binary.is_some(), routing.reload_external) {
                (true, false) => "runs",
                (false, false) => "writes",
                (false, true) => "writes+reloads",
                (true, true) => "runs+reloads",
            },
        };
        format!("{haproxy} | {routing}")
    }

    #[test]
    fn every_combination_of_the_haproxy_flags_is_served_or_refused_by_name() {
        const S: &str = "--haproxy-socket=/s.sock";
        const C: &str = "--haproxy-config=/h.cfg";
        const M: &str = "--haproxy-master-socket=/m.sock";
        const D: &str = "--haproxy-config-dir=/cfg";
        const OFF: &str = "--run-haproxy=false";
        let refused = "refused: --haproxy-master-socket with --haproxy-config-dir names the \
            master CLI of a HAProxy run by others: set --run-haproxy false (certwatch's own \
            HAProxy has its master CLI in DIR/run/master.sock)";
        // Every combination clap accepts (--haproxy-config needs --haproxy-socket,
        // --haproxy-master-socket a socket or a directory); without a directory
        // --run-haproxy changes nothing, so those rows hold for both of its values.
        let rows: &[(&[&str], &str)] = &[
            (&[], "- | -"),
            (&[S], "ext /s.sock - | -"),
            (&[S, M], "ext /s.sock /m.sock | -"),
            (&[S, C], "managed /s.sock /h.cfg /s.sock.master | -"),
            (&[S, C, M], "managed /s.sock /h.cfg /m.sock | -"),
            (
                &[D],
                "ext /cfg/run/haproxy.sock /cfg/run/master.sock | runs",
            ),
            (&[D, OFF], "ext /cfg/run/haproxy.sock - | writes"),
            (&[D, M], refused),
            (
                &[D, M, OFF],
                "ext /cfg/run/haproxy.sock /m.sock | writes+reloads",
            ),
            (&[D, S], "ext /s.sock - | runs"),
            (&[D, S, OFF], "ext /s.sock - | writes"),
            (&[D, S, M], refused),
            (&[D, S, M, OFF], "ext /s.sock /m.sock | writes+reloads"),
            (&[D, S, C], "managed /s.sock /h.cfg /s.sock.master | runs"),
            (
                &[D, S, C, OFF],
                "managed /s.sock /h.cfg /s.sock.master | writes",
            ),
            (&[D, S, C, M], "managed /s.sock /h.cfg /m.sock | runs"),
            (
                &[D, S, C, M, OFF],
                "managed /s.sock /h.cfg /m.sock | writes+reloads",
            ),
        ];
        for (flags, expected) in rows {
            let mut variants = vec![flags.to_vec()];
            if !flags.contains(&D) {
                variants.push([*flags, &[OFF]].concat());
            }
            for args in variants {
                assert_eq!(haproxy_shape(&args), *expected, "{args:?}");
            }
        }
        // What clap refuses never reaches the matrix.
        for args in [&[C][..], &[M], &[C, D], &[M, OFF]] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn the_deployment_names_who_runs_haproxy_and_where_certificates_go() {
        let deployment = |args: &[&str]| parse(args).unwrap().haproxy_deployment().unwrap();
        assert_eq!(deployment(&[]), HaproxyDeployment::Files);
        assert_eq!(
            deployment(&["--haproxy-config-dir=/cfg"]),
            HaproxyDeployment::Routing {
                dir: "/cfg".into(),
                certificates: RoutedCertificates::Served,
            }
        );
        assert_eq!(
            deployment(&[
                "--haproxy-config-dir=/cfg",
                "--run-haproxy=false",
                "--haproxy-socket=/s.sock",
                "--haproxy-master-socket=/m.sock",
            ]),
            HaproxyDeployment::Sidecar {
                dir: "/cfg".into(),
                master: Some("/m.sock".into()),
                certificates: RoutedCertificates::External {
                    socket: "/s.sock".into()
                },
            }
        );
        assert_eq!(
            deployment(&["--haproxy-socket=/s.sock", "--haproxy-config=/h.cfg"]),
            HaproxyDeployment::Certificates(SocketHaproxy::Managed(ManagedHaproxy {
                socket: "/s.sock".into(),
                config: "/h.cfg".into(),
                master: "/s.sock.master".into(),
            }))
        );
        let refused = parse(&[
            "--haproxy-config-dir=/cfg",
            "--haproxy-master-socket=/m.sock",
        ])
        .unwrap()
        .haproxy_deployment();
        assert!(
            matches!(refused, Err(ArgsError::MasterSocketOfManagedRouting)),
            "{refused:?}"
        );
    }

    #[test]
    fn the_drain_is_what_the_grace_period_leaves_at_most_hard_stop_after() {
        use std::time::Duration;
        let bound = |args: &[&str]| parse(args).unwrap().haproxy_drain_bound();
        let minutes = |m: u64| Duration::from_secs(m * 60);
        // No grace period: hard-stop-after, as given or its default.
        assert_eq!(bound(&[]), minutes(60));
        assert_eq!(
            bound(&["--haproxy-hard-stop-after", "90s"]),
            minutes(1) + Duration::from_secs(30)
        );
        // The deployment's: 3660 s − 45 s leaves more than the hour.
        assert_eq!(
            bound(&[
                "--shutdown-delay",
                "45s",
                "--termination-grace-period",
                "3660s"
            ]),
            minutes(60)
        );
        // A grace period that leaves less: what it leaves.
        assert_eq!(
            bound(&["--shutdown-delay", "1s", "--termination-grace-period", "3s"]),
            Duration::from_secs(2)
        );
        assert_eq!(
            bound(&[
                "--shutdown-delay",
                "0s",
                "--termination-grace-period",
                "30s"
            ]),
            Duration::from_secs(30)
        );
    }
}
