//! HAProxy's whole configuration for the served routes, as a pure function
//! ([`render`]): `haproxy.cfg` and the map files its frontends look routes up in, with
//! the OpenShift router's semantics (its `haproxy-config.template` and the map entries
//! of `pkg/router/template/util/haproxy`, read for the rules; nothing is copied).
//!
//! - `frontend public` (plain HTTP): a route whose insecure policy is `Redirect` is
//!   redirected to HTTPS (302, `os_route_http_redirect.map`); plain routes, and edge and
//!   reencrypt routes with `Allow`, are looked up by host and path in `os_http_be.map`;
//!   anything else reaches `openshift_default`, which has no server (503), or denies
//!   with 404 when the operator gives a 404 page (as the router's template does).
//! - `frontend public_ssl` (TLS, not terminated): a server name of a passthrough route
//!   (`os_sni_passthrough.map`) goes to its TCP backend (`os_tcp_be.map`); any other
//!   server name is terminated by `fe_sni` (the crt-list's certificates, the default
//!   certificate otherwise), a hello without one by `fe_no_sni` (the default
//!   certificate); both look the route up in `os_edge_reencrypt_be.map`.
//! - One backend per route ([`super::model`]), its servers from the services'
//!   endpoints, plus `--haproxy-spare-servers` spare servers in maintenance
//!   (`_dynamic-pod-<n>`, none by default); endpoint changes take those or add and
//!   delete servers at run time without a reload ([`super::dynamic`]).
//! - The `append` policy's `X-Forwarded-*` rules once, in a defaults section that the
//!   backends with that policy follow ([`FORWARDED_APPEND_DEFAULTS`]).
//! - A backend carries its route's annotations and header actions as the router writes
//!   them (allow lists, rate limits, rewrites, HSTS, header case, `httpHeaders`; the
//!   readers in `annotations`): a malformed value affects its route only, and never
//!   reaches HAProxy in a form its parser refuses. Allow lists longer than a line are
//!   files in `allowlists/`.
//!
//! Map keys are anchored regular expressions of the host (optional trailing dot and
//! port) and path; each map is sorted as the router sorts it: reverse lexical order
//! (longer paths of a host first), wildcard routes last.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use route_secrets::route::routing::{InsecurePolicy, Termination};
use route_secrets::tls::SecurityLevel;

use super::endpoints::EndpointTable;
use super::model::{BackendPlan, RoutingTable, ServedRoute};
use crate::tls_policy::TlsPolicy;

/// The name spare servers and servers added at run time get, numbered from 1 (the
/// router's dynamic servers' name).
pub const SPARE_SERVER_PREFIX: &str = "_dynamic-pod-";

/// The name of the `defaults` section that holds the `X-Forwarded-*` and `Forwarded`
/// request rules of the `append` policy (every HTTP route's but those annotated
/// otherwise): HAProxy keeps a defaults section's rules once for all the backends that
/// take it (those after it, up to the next defaults section), where rules written in
/// each backend cost about 8 KiB a backend.
pub const FORWARDED_APPEND_DEFAULTS: &str = "forwarded_append";

/// Spare servers a backend has at least when its balance algorithm takes no server
/// added at run time (`balance source` or another hash without `hash-type
/// consistent`): endpoints that come take them without a reload.
pub const STATIC_BACKEND_SPARE_SERVERS: usize = 5;

/// Where a spare server points until it is given an endpoint (never contacted: it is
/// in maintenance).
pub const SPARE_SERVER_ADDRESS: &str = "127.0.0.1:1";

/// The map files, in the order they are written.
pub const MAP_FILES: [&str; 5] = [
    "os_http_be.map",
    "os_edge_reencrypt_be.map",
    "os_route_http_redirect.map",
    "os_tcp_be.map",
    "os_sni_passthrough.map",
];

/// What the configuration needs besides the routes.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The plain HTTP listener (`:80`, `127.0.0.1:8080`).
    pub http_bind: String,
    /// The TLS listener.
    pub https_bind: String,
    /// The directory of the configuration: its maps, the destination CA files
    /// (`cacerts/`), error pages and the internal sockets (`run/`).
    pub config_dir: PathBuf,
    /// The crt-list with the routes' certificates.
    pub crt_list: PathBuf,
    /// The certificate served for names no route has (chain and key, PEM).
    pub default_certificate: PathBuf,
    /// The runtime API socket (`stats socket ... level admin`).
    pub admin_socket: PathBuf,
    /// `maxconn` (the router's `ROUTER_MAX_CONNECTIONS`, 50000).
    pub max_connections: u32,
    /// `nbthread`, when set.
    pub threads: Option<u32>,
    /// Spare servers (in maintenance) per backend for endpoints added at run time; an
    /// endpoint no spare server takes is added to HAProxy as a server of its own (`add
    /// server`), and a backend keeps this many of the servers its endpoints leave.
    pub spare_servers: usize,
    /// The CA that verifies reencrypt backends of routes without a
    /// `destinationCACertificate` (the service CA); `None`: not verified, as the router
    /// does without one.
    pub default_destination_ca: Option<PathBuf>,
    /// No HTTP/2 towards reencrypt backends (the router's `ROUTER_DISABLE_HTTP2`).
    pub disable_http2: bool,
    /// The balance algorithm of HTTP backends with one active service (the router's
    /// `ROUTER_LOAD_BALANCE_ALGORITHM`, `random`).
    pub load_balance_algorithm: String,
    /// The balance algorithm of passthrough backends with one active service
    /// (`ROUTER_TCP_BALANCE_SCHEME`, `source`).
    pub tcp_balance_scheme: String,
    /// Health check interval of servers of backends with several endpoints
    /// (`ROUTER_BACKEND_CHECK_INTERVAL`, `5000ms`).
    pub health_check_interval: String,
    /// HTTP header names whose case HAProxy adjusts in HTTP/1 (each as it should be
    /// written; the router's `ROUTER_H1_CASE_ADJUST`): in every response to clients,
    /// and in requests to the backends of routes with
    /// `haproxy.router.openshift.io/h1-adjust-case: true`.
    pub header_case_adjustments: Vec<String>,
    /// The OpenSSL security level HAProxy loads certificates at: the same as
    /// certwatch's validation, through the `OPENSSL_CONF` file written beside the
    /// configuration ([`OPENSSL_CONF_FILE`]).
    pub openssl_security_level: SecurityLevel,
    /// The TLS policy of the TLS bind (the cluster's profile; no route changes it).
    pub tls: TlsPolicy,
    /// How long old workers may keep serving after a reload or a soft stop
    /// (`hard-stop-after`); `None`: unbounded.
    pub hard_stop_after: Option<std::time::Duration>,
    /// Where HAProxy answers `GET /healthz` itself (`monitor-uri`), for a liveness
    /// probe of the HAProxy process; `None`: nowhere.
    pub health_bind: Option<String>,
    /// The public listeners take connections only with a PROXY protocol header
    /// (`accept-proxy`, the router's `ROUTER_USE_PROXY_PROTOCOL`): the client's
    /// address is the header's.
    pub proxy_protocol: bool,
    /// One line per HTTP request on HAProxy's standard output (`option httplog`:
    /// client, frontend, the route's backend and server, timings, status, bytes,
    /// termination state, request line).
    pub access_log: bool,
    /// Where HAProxy's Prometheus exporter answers (a unix socket, mode 600);
    /// `None`: no exporter.
    pub metrics_socket: Option<PathBuf>,
    /// The operator's error pages, in place of certwatch's (the router's
    /// `ROUTER_ERRORFILE_503` and `ROUTER_ERRORFILE_404`).
    pub error_pages: CustomErrorPages,
}

/// The operator's error pages: whole HTTP responses (HAProxy's `errorfile` format),
/// checked by [`ErrorPage::parse`]. A page not given is certwatch's own
/// ([`ERROR_PAGES`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CustomErrorPages {
    /// HAProxy's answer when no server serves (`errorfile 503`).
    pub page_503: Option<ErrorPage>,
    /// HAProxy's answer to a request no route takes (`errorfile 404`); with it,
    /// `openshift_default` denies with 404, as the router's template does when
    /// `ROUTER_ERRORFILE_404` is set, where it answers 503 otherwise.
    pub page_404: Option<ErrorPage>,
}

impl CustomErrorPages {
    /// The error page files to write: (file name in the configuration directory,
    /// content), the 503 page first.
    pub fn files(&self) -> [(&'static str, &[u8]); 2] {
        fn pick<'a>(
            custom: &'a Option<ErrorPage>,
            default: (&'static str, &'static str),
        ) -> (&'static str, &'a [u8]) {
            (
                default.0,
                custom
                    .as_ref()
                    .map_or(default.1.as_bytes(), |page| &page.0[..]),
            )
        }
        [
            pick(&self.page_503, ERROR_PAGES[0]),
            pick(&self.page_404, ERROR_PAGES[1]),
        ]
    }
}

/// The largest error page certwatch takes. HAProxy parses a page into one buffer
/// (`tune.bufsize`, 32768 in the configuration) together with its header blocks, so
/// the exact limit depends on the page's headers (HAProxy 2.6 took a 32,673-byte page
/// with three headers, not one byte more); this leaves the room kept for rewrites
/// (`tune.maxrewrite`, 8192) as a margin that any page's headers fit in.
pub const MAX_ERROR_PAGE_BYTES: usize = 32768 - 8192;

/// The most headers an error page may have (HAProxy 2.6 refuses 101).
pub const MAX_ERROR_PAGE_HEADERS: usize = 100;

/// One error page: a whole HTTP response as HAProxy's `errorfile` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorPage(pub std::sync::Arc<[u8]>);

/// Why a file is no error page HAProxy takes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ErrorPageError {
    /// Larger than one HAProxy buffer leaves room for.
    #[error("{size} bytes, more than HAProxy's buffer takes ({MAX_ERROR_PAGE_BYTES})")]
    TooLarge {
        /// The page's size.
        size: usize,
    },
    /// The first line is no `HTTP/1.x NNN reason` status line.
    #[error(
        "the first line is no HTTP/1.0 or HTTP/1.1 status line with a code from 200 to 599: {line:?}"
    )]
    StatusLine {
        /// The line, as far as it is text.
        line: String,
    },
    /// A header line without a colon, or with a name that is no token.
    #[error("header line {number} is no `name: value` header: {line:?}")]
    Header {
        /// The line's number (the status line is 1).
        number: usize,
        /// The line, as far as it is text.
        line: String,
    },
    /// More headers than HAProxy parses in a message (`tune.http.maxhdr`, 101 with
    /// the start line).
    #[error("{count} headers, more than HAProxy's {MAX_ERROR_PAGE_HEADERS}")]
    TooManyHeaders {
        /// The page's headers.
        count: usize,
    },
    /// No empty line ends the headers.
    #[error("no empty line ends the headers (a page is a whole HTTP response)")]
    Unterminated,
    /// The body is not as long as `Content-Length` says.
    #[error("content-length says {declared} bytes, the body has {actual}")]
    ContentLength {
        /// What the header says.
        declared: String,
        /// The body's length.
        actual: usize,
    },
    /// `Transfer-Encoding`, which a page HAProxy sends as it is cannot honour.
    #[error("a transfer-encoding header (the page is sent as it is, never encoded)")]
    TransferEncoding,
}

/// Whether `line` is `HTTP/1.0` or `HTTP/1.1`, a code from 200 to 599, and a reason.
fn status_line_ok(line: &[u8]) -> bool {
    let Ok(line) = std::str::from_utf8(line) else {
        return false;
    };
    let Some(rest) = line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| line.strip_prefix("HTTP/1.0 "))
    else {
        return false;
    };
    let code = rest.split_once(' ').map_or(rest, |(code, _reason)| code);
    code.len() == 3
        && code
            .parse::<u16>()
            .is_ok_and(|code| (200..600).contains(&code))
}

impl ErrorPage {
    /// Checks `bytes` as a whole HTTP/1 response that HAProxy's `errorfile` parser
    /// takes: a status line (`HTTP/1.0` or `HTTP/1.1`, a code from 200 to 599), header
    /// lines `name: value` (CRLF or LF; at most [`MAX_ERROR_PAGE_HEADERS`]), an empty
    /// line, a body as long as a `Content-Length` says; no `Transfer-Encoding`; at most
    /// [`MAX_ERROR_PAGE_BYTES`].
    pub fn parse(bytes: &[u8]) -> Result<Self, ErrorPageError> {
        if bytes.len() > MAX_ERROR_PAGE_BYTES {
            return Err(ErrorPageError::TooLarge { size: bytes.len() });
        }
        let text = |line: &[u8]| String::from_utf8_lossy(line).into_owned();
        let mut rest = bytes;
        let mut next_line = || -> Option<&[u8]> {
            let end = rest.iter().position(|&b| b == b'\n')?;
            let line = &rest[..end];
            rest = &rest[end + 1..];
            Some(line.strip_suffix(b"\r").unwrap_or(line))
        };
        let status = next_line().ok_or(ErrorPageError::Unterminated)?;
        if !status_line_ok(status) {
            return Err(ErrorPageError::StatusLine { line: text(status) });
        }
        let mut content_length = None;
        let mut number = 1;
        loop {
            let line = next_line().ok_or(ErrorPageError::Unterminated)?;
            number += 1;
            if line.is_empty() {
                break;
            }
            if number - 1 > MAX_ERROR_PAGE_HEADERS {
                return Err(ErrorPageError::TooManyHeaders { count: number - 1 });
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(ErrorPageError::Header {
                    number,
                    line: text(line),
                });
            };
            let name = &line[..colon];
            let token = !name.is_empty()
                && name
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b));
            let value = &line[colon + 1..];
            if !token || value.iter().any(|&b| b == b'\r' || b == 0) {
                return Err(ErrorPageError::Header {
                    number,
                    line: text(line),
                });
            }
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                return Err(ErrorPageError::TransferEncoding);
            }
            if name.eq_ignore_ascii_case(b"content-length") {
                content_length = Some(text(value).trim().to_owned());
            }
        }
        let body = rest.len();
        if let Some(declared) = content_length
            && declared.parse::<usize>().ok() != Some(body)
        {
            return Err(ErrorPageError::ContentLength {
                declared,
                actual: body,
            });
        }
        Ok(Self(bytes.into()))
    }
}

impl RenderOptions {
    /// The router's defaults for a configuration in `config_dir`.
    pub fn new(
        config_dir: impl Into<PathBuf>,
        crt_list: impl Into<PathBuf>,
        default_certificate: impl Into<PathBuf>,
        admin_socket: impl Into<PathBuf>,
    ) -> Self {
        Self {
            http_bind: ":80".into(),
            https_bind: ":443".into(),
            config_dir: config_dir.into(),
            crt_list: crt_list.into(),
            default_certificate: default_certificate.into(),
            admin_socket: admin_socket.into(),
            max_connections: 50_000,
            threads: None,
            spare_servers: 0,
            default_destination_ca: None,
            disable_http2: false,
            load_balance_algorithm: "random".into(),
            tcp_balance_scheme: "source".into(),
            health_check_interval: "5000ms".into(),
            header_case_adjustments: Vec::new(),
            openssl_security_level: SecurityLevel::default(),
            tls: TlsPolicy::default(),
            hard_stop_after: None,
            health_bind: None,
            proxy_protocol: false,
            access_log: false,
            metrics_socket: None,
            error_pages: CustomErrorPages::default(),
        }
    }

    /// The file of a route's allow list when it is too long for one line
    /// (`allowlists/<namespace>:<route>.txt`, one address or network a line).
    pub fn allowlist_file(&self, route: &ServedRoute) -> PathBuf {
        self.config_dir
            .join(ALLOWLIST_DIR)
            .join(format!("{}:{}.txt", route.key.namespace, route.key.name))
    }

    /// The file of a route's destination CA (`cacerts/<namespace>:<route>.pem`).
    pub fn destination_ca_file(&self, route: &ServedRoute) -> PathBuf {
        self.config_dir
            .join("cacerts")
            .join(format!("{}:{}.pem", route.key.namespace, route.key.name))
    }

    fn map(&self, name: &str) -> PathBuf {
        self.config_dir.join(name)
    }

    /// The OpenSSL configuration HAProxy runs with (its `OPENSSL_CONF`).
    pub fn openssl_conf(&self) -> PathBuf {
        self.config_dir.join(OPENSSL_CONF_FILE)
    }

    /// The Lua file every Lua state of HAProxy loads at start ([`LUA_INIT`]).
    pub fn lua_init(&self) -> PathBuf {
        self.config_dir.join(LUA_INIT_FILE)
    }
}

/// The directory, in the configuration directory, of allow lists too long for a line.
pub const ALLOWLIST_DIR: &str = "allowlists";

/// The OpenSSL configuration's file name in the configuration directory: HAProxy's
/// `OPENSSL_CONF`, at certwatch's security level (Debian's OpenSSL alone is at 2).
pub const OPENSSL_CONF_FILE: &str = "openssl.cnf";

/// The Lua file's name in the configuration directory ([`LUA_INIT`]).
pub const LUA_INIT_FILE: &str = "drop-proxy-tables.lua";

/// What every Lua state of a HAProxy built with Lua runs at start, the shared state
/// (`lua-load`) and each thread's (`lua-load-per-thread`). The configuration runs no
/// Lua of its own, but HAProxy 2.6 fills `core.proxies`, `core.frontends` and
/// `core.backends` in each of those states (one per thread and the shared one) with
/// an object for every proxy and every server of it: at 4 threads 4.6 KB a backend
/// and 2.4 KB a server, a third of what a route's backend holds (docs/BENCHMARKS.md,
/// "What HAProxy 2.6 holds per backend and per server"). Nothing reads them; each
/// state drops them and collects them in its init, before the next state fills its
/// own, so they take their memory once at most, never each state's at once.
pub const LUA_INIT: &str = "\
-- Written by certwatch. HAProxy's Lua states each list every proxy and server
-- (core.proxies, core.frontends, core.backends); the configuration runs no Lua
-- that reads them, so each state drops its lists once they are made.
core.register_init(function()
  core.proxies = nil
  core.frontends = nil
  core.backends = nil
  collectgarbage(\"collect\")
end)
";

/// The environment variable the configuration sets to [`RenderedConfig::digest`]
/// (`setenv` in a `global` section of its own, last): `show env` on the runtime API
/// then says which configuration the answering HAProxy loaded.
pub const DIGEST_VARIABLE: &str = "CERTWATCH_CONFIG_DIGEST";

/// The rendered configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedConfig {
    /// `haproxy.cfg`.
    pub config: String,
    /// Map file name → content.
    pub maps: Vec<(&'static str, String)>,
    /// Destination CA files (path → PEM) of reencrypt routes that have one.
    pub ca_files: Vec<(PathBuf, String)>,
    /// Allow list files (path → content) of routes whose list is too long for a line.
    pub allowlist_files: Vec<(PathBuf, String)>,
    /// Each backend's servers as rendered, spare ones included: what the runtime API
    /// starts from after HAProxy loads this configuration.
    pub backends: Vec<RenderedBackend>,
    /// The OpenSSL configuration (at the options' security level).
    pub openssl_conf: String,
    /// SHA-256 (hex, first 16 bytes) of everything above: the value of
    /// [`DIGEST_VARIABLE`] in a HAProxy that loaded these files.
    pub digest: String,
}

/// A backend as rendered: its servers' names and what each points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedBackend {
    /// The backend's name.
    pub name: String,
    /// Its servers, in order.
    pub servers: Vec<RenderedServer>,
    /// Whether its servers are health-checked.
    pub checked: bool,
    /// How servers are added to it at run time; `None` when its balance algorithm
    /// takes no server added at run time (HAProxy's hash-based ones without `hash-type
    /// consistent`).
    pub add: Option<AddServers>,
}

/// What a server added to a backend at run time (`add server`) is given besides its
/// address and weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddServers {
    /// The options of a spare server's line (the route's TLS towards the backend,
    /// health checks, `maxconn`): ` ssl ... check inter 5000ms`, or empty.
    pub options: String,
    /// Whether an `h2c` endpoint's server speaks HTTP/2 in clear (`proto h2`): the
    /// route's backend speaks HTTP (plain and edge routes).
    pub h2c: bool,
    /// Whether the backend sets sticky cookies: HAProxy 2.6 gives an added server no
    /// dynamic cookie until the backend's are computed again (`enable dynamic-cookie
    /// backend`).
    pub cookies: bool,
    /// The number the next server added is named with ([`SPARE_SERVER_PREFIX`]).
    pub next: usize,
    /// The next server added's `id`, past the ids HAProxy gave the rendered servers
    /// (1 to their number). HAProxy 2.6 gives servers added without one no distinct
    /// place in the random and consistent-hash algorithms: of several, some never get
    /// a request.
    pub next_id: usize,
}

/// A server as rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedServer {
    /// The server's name in its backend.
    pub name: String,
    /// What it serves; `None` for a spare server (in maintenance).
    pub target: Option<ServerTarget>,
}

/// Where a server sends traffic, and how much.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerTarget {
    /// Address, as a server line takes it.
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight.
    pub weight: u16,
}

/// The error page files (name → HTTP response) the configuration refers to.
pub const ERROR_PAGES: [(&str, &str); 2] = [
    (
        "error-page-503.http",
        "HTTP/1.0 503 Service Unavailable\r\nPragma: no-cache\r\nCache-Control: private, max-age=0, no-cache, no-store\r\nConnection: close\r\nContent-Type: text/html\r\n\r\n<html><body><h1>Application is not available</h1><p>No route serves this host and path, or its service has no ready endpoint.</p></body></html>\n",
    ),
    (
        "error-page-404.http",
        "HTTP/1.0 404 Not Found\r\nPragma: no-cache\r\nCache-Control: private, max-age=0, no-cache, no-store\r\nConnection: close\r\nContent-Type: text/html\r\n\r\n<html><body><h1>Not found</h1></body></html>\n",
    ),
];

/// Escapes the regular expression metacharacters Go's `regexp.QuoteMeta` escapes.
fn quote_meta(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The host part of a key: the host, or any first label of its domain.
fn host_regex(host: &str, wildcard: bool) -> String {
    if wildcard && let Some((_, domain)) = host.split_once('.') {
        return format!("[^\\.]*{}", quote_meta(&format!(".{domain}")));
    }
    quote_meta(host)
}

/// A map key matching a request's `base` (host, optional port, path).
pub fn route_regex(host: &str, path: Option<&str>, wildcard: bool) -> String {
    let path = path.unwrap_or("");
    let (path_re, subpath) = if path.trim_end_matches('/').is_empty() {
        (String::new(), "(/.*)?")
    } else if path.ends_with('/') {
        (quote_meta(path), "(.*)?")
    } else {
        (quote_meta(path), "(/.*)?")
    };
    // A map file separates key and value by white space.
    let path_re = path_re
        .replace(' ', "\\x20")
        .replace('\t', "\\t")
        .replace('\r', "\\r")
        .replace('\n', "\\n");
    format!(
        "^{}\\.?(:[0-9]+)?{path_re}{subpath}$",
        host_regex(host, wildcard)
    )
}

/// A map key matching a TLS server name.
pub fn sni_regex(host: &str, wildcard: bool) -> String {
    format!("^{}$", host_regex(host, wildcard))
}

/// Sorts map lines as the router does: reverse lexical order, lines of wildcard routes
/// (keys starting `^[^\.]*\.`) after the others.
fn sort_map(lines: &mut [String]) {
    const WILDCARD: &str = "^[^\\.]*\\.";
    lines.sort_by(|a, b| {
        let (wa, wb) = (a.starts_with(WILDCARD), b.starts_with(WILDCARD));
        wa.cmp(&wb).then_with(|| b.cmp(a))
    });
}

/// The name of a route's cookie: the router's routing key, the MD5 of
/// `" <namespace>:<route>"`, in hex.
pub fn routing_key(route: &ServedRoute) -> String {
    let digest = Md5::digest(format!(" {}:{}", route.key.namespace, route.key.name));
    digest.iter().fold(String::with_capacity(32), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// A time value as the router accepts it from an annotation (`[1-9][0-9]*` with an
/// optional unit `us|ms|s|m|h|d`), clipped to HAProxy's largest.
fn time_value(value: Option<&str>) -> Option<String> {
    let value = value?;
    let digits_end = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(digits_end);
    if digits.is_empty() || digits.starts_with('0') {
        return None;
    }
    let micros_per: u128 = match unit {
        "" | "ms" => 1_000,
        "us" => 1,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return None,
    };
    let micros = digits.parse::<u128>().ok()?.checked_mul(micros_per);
    const MAX_MICROS: u128 = 2_147_483_647 * 1_000;
    match micros {
        Some(micros) if micros <= MAX_MICROS => Some(value.to_owned()),
        _ => Some("2147483647ms".to_owned()),
    }
}

/// The annotation's value if it is one of `allowed` (a `|`-separated list).
fn one_of<'a>(value: Option<&'a str>, allowed: &str) -> Option<&'a str> {
    value.filter(|value| allowed.split('|').any(|a| a == *value))
}

/// Renders the configuration for `routes` with the endpoints of `endpoints`.
pub fn render(
    routes: &RoutingTable,
    endpoints: &EndpointTable,
    options: &RenderOptions,
) -> RenderedConfig {
    let mut out = String::with_capacity(16 * 1024 + routes.len() * 1024);
    global_and_frontends(&mut out, options);
    let mut maps: [Vec<String>; 5] = Default::default();
    let mut ca_files = Vec::new();
    let mut allowlist_files = Vec::new();
    let mut backends = Vec::with_capacity(routes.len());
    // The backends that take the append policy's rules from their defaults section
    // first (each route's map entries with them), then the others after a defaults
    // section of their own.
    forwarding_defaults(&mut out, options);
    for pass in [true, false] {
        if !pass {
            out.push_str("defaults\n");
            defaults_body(&mut out, options);
            out.push('\n');
        }
        for route in routes.routes() {
            if pass {
                map_entries(route, &mut maps);
            }
            if forwards_by_defaults(route) != pass {
                continue;
            }
            let Some(plan) = RoutingTable::plan(route, endpoints) else {
                continue;
            };
            let ca_file = route
                .routing
                .destination_ca_certificate
                .as_deref()
                .filter(|_| route.routing.termination == Termination::Reencrypt)
                .map(|pem| {
                    let path = options.destination_ca_file(route);
                    ca_files.push((path.clone(), pem.to_owned()));
                    path
                });
            backends.push(backend(
                &mut out,
                route,
                &plan,
                ca_file.as_deref(),
                &mut allowlist_files,
                options,
            ));
        }
    }
    let maps = MAP_FILES
        .iter()
        .zip(maps)
        .map(|(name, mut lines)| {
            sort_map(&mut lines);
            let mut text = lines.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            (*name, text)
        })
        .collect::<Vec<_>>();
    let openssl_conf = options.openssl_security_level.openssl_conf();
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    hash.update(out.as_bytes());
    for (name, text) in &maps {
        hash.update(name.as_bytes());
        hash.update(text.as_bytes());
    }
    for (path, text) in ca_files.iter().chain(&allowlist_files) {
        hash.update(path.as_os_str().as_encoded_bytes());
        hash.update(text.as_bytes());
    }
    hash.update(openssl_conf.as_bytes());
    let digest: String = hash.finish().as_ref()[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let _ = writeln!(out, "global\n  setenv {DIGEST_VARIABLE} {digest}");
    RenderedConfig {
        config: out,
        maps,
        ca_files,
        allowlist_files,
        backends,
        openssl_conf,
        digest,
    }
}

/// A route's lines in each map (indexed as [`MAP_FILES`]).
fn map_entries(route: &ServedRoute, maps: &mut [Vec<String>; 5]) {
    let routing = &route.routing;
    let Some(host) = routing.host.as_deref() else {
        return;
    };
    let path = routing.path.as_deref();
    let wildcard = route.wildcard;
    let key = route_regex(host, path, wildcard);
    let backend = route.backend_name();
    let termination = &routing.termination;
    let terminated = matches!(termination, Termination::Edge | Termination::Reencrypt);
    if let Some(backend) = &backend {
        let http = *termination == Termination::Http
            || (terminated && routing.insecure_policy == InsecurePolicy::Allow);
        if http {
            maps[0].push(format!("{key} {backend}"));
        }
        if terminated {
            maps[1].push(format!("{key} {backend}"));
        }
    }
    let redirect = u8::from(routing.insecure_policy == InsecurePolicy::Redirect);
    maps[2].push(format!("{key} {redirect}"));
    let passthrough = *termination == Termination::Passthrough;
    if path.is_none()
        && (passthrough || *termination == Termination::Reencrypt)
        && let Some(backend) = &backend
    {
        maps[3].push(format!("{} {backend}", route_regex(host, None, wildcard)));
    }
    if path.is_none() && passthrough {
        maps[4].push(format!("{} 1", sni_regex(host, wildcard)));
    }
}

/// Everything but the routes' backends: the global settings, the defaults, and the
/// frontends every configuration has.
fn global_and_frontends(out: &mut String, options: &RenderOptions) {
    global(out, options);
    out.push_str("defaults\n");
    defaults_body(out, options);
    out.push('\n');
    header_case_adjustments(out, options);
    service_frontends(out, options);
    public_frontend(out, options);
    public_ssl_frontend(out, options);
    tls_frontends(out, options);
    default_backend(out, options);
}

/// The `global` section: limits, threads, logging, Lua, the admin socket, TLS defaults.
fn global(out: &mut String, options: &RenderOptions) {
    let _ = writeln!(
        out,
        "# Written by certwatch for the routes it serves; rewritten whole on every change.\n\
         global\n  no strict-limits\n  maxconn {maxconn}",
        maxconn = options.max_connections
    );
    if let Some(threads) = options.threads {
        let _ = writeln!(out, "  nbthread {threads}");
    }
    if options.access_log {
        out.push_str("  log stdout format raw local0 info\n");
    }
    if let Some(after) = options.hard_stop_after {
        let _ = writeln!(out, "  hard-stop-after {}ms", after.as_millis().max(1));
    }
    // Only a HAProxy built with Lua has the lists LUA_INIT drops, and only it takes
    // the keywords.
    let _ = writeln!(
        out,
        "  .if feature(LUA)\n  lua-load {lua}\n  lua-load-per-thread {lua}\n  .endif",
        lua = options.lua_init().display(),
    );
    let _ = writeln!(
        out,
        "  ca-base /etc/ssl\n  crt-base /etc/ssl\n  \
         stats socket {socket} mode 600 level admin expose-fd listeners\n  stats timeout 2m\n  \
         tune.maxrewrite 8192\n  tune.bufsize 32768\n  \
         tune.ssl.default-dh-param 2048\n{tls}",
        socket = options.admin_socket.display(),
        tls = options.tls.haproxy_global(),
    );
}

/// HAProxy's own services, when asked for: its Prometheus exporter and a health check.
fn service_frontends(out: &mut String, options: &RenderOptions) {
    if let Some(socket) = &options.metrics_socket {
        let _ = writeln!(
            out,
            "frontend prometheus\n  bind unix@{} mode 600\n  mode http\n  \
             http-request use-service prometheus-exporter\n",
            socket.display()
        );
    }
    if let Some(health) = &options.health_bind {
        let _ = writeln!(
            out,
            "frontend healthz\n  bind {health}\n  mode http\n  monitor-uri /healthz\n"
        );
    }
}

/// The logging lines of a frontend where requests are logged: the plain frontend and
/// the TLS-terminating ones (the TCP frontend in front of them would log each request
/// a second time).
fn request_log(options: &RenderOptions) -> &'static str {
    if options.access_log {
        "  log global\n  option httplog\n"
    } else {
        ""
    }
}

/// What a public bind line adds when the clients' addresses come in the PROXY protocol.
fn accept_proxy(options: &RenderOptions) -> &'static str {
    if options.proxy_protocol {
        " accept-proxy"
    } else {
        ""
    }
}

/// The plain HTTP frontend: redirects to HTTPS, then the HTTP routes' backends.
fn public_frontend(out: &mut String, options: &RenderOptions) {
    let _ = writeln!(
        out,
        "frontend public\n  bind {http}{accept_proxy}\n  mode http\n{log}  \
         tcp-request inspect-delay 5s\n  tcp-request content accept if HTTP\n",
        http = options.http_bind,
        accept_proxy = accept_proxy(options),
        log = request_log(options),
    );
    request_hygiene(out);
    let _ = writeln!(
        out,
        "  acl secure_redirect base,map_reg_int({redirect}) -m bool\n  \
         http-request redirect location https://%[req.hdr(host),regsub(:[0-9]+$,,)]%[url] code 302 if secure_redirect\n  \
         use_backend %[base,map_reg({http_be})]\n  default_backend openshift_default\n",
        redirect = options.map("os_route_http_redirect.map").display(),
        http_be = options.map("os_http_be.map").display(),
    );
}

/// The TLS frontend, in TCP mode: passthrough routes by SNI, the rest to the
/// terminating frontends (with an SNI or without).
fn public_ssl_frontend(out: &mut String, options: &RenderOptions) {
    let _ = writeln!(
        out,
        "frontend public_ssl\n  bind {https}{accept_proxy}\n  \
         tcp-request inspect-delay 5s\n  tcp-request content accept if {{ req_ssl_hello_type 1 }}\n  \
         acl sni req.ssl_sni -m found\n  \
         acl sni_passthrough req.ssl_sni,lower,map_reg({passthrough}) -m found\n  \
         use_backend %[req.ssl_sni,lower,map_reg({tcp_be})] if sni sni_passthrough\n  \
         use_backend be_sni if sni\n  default_backend be_no_sni\n",
        https = options.https_bind,
        accept_proxy = accept_proxy(options),
        passthrough = options.map("os_sni_passthrough.map").display(),
        tcp_be = options.map("os_tcp_be.map").display(),
    );
}

/// The TLS-terminating frontends behind `public_ssl`, over unix sockets: one with the
/// routes' certificates (the crt-list) for clients that send an SNI, one with the
/// default certificate alone for those that do not.
fn tls_frontends(out: &mut String, options: &RenderOptions) {
    let run = options.config_dir.join("run");
    let sni_socket = run.join("haproxy-sni.sock");
    let no_sni_socket = run.join("haproxy-no-sni.sock");
    let log = request_log(options);
    for (name, socket, crt_list) in [
        ("sni", &sni_socket, Some(&options.crt_list)),
        ("no_sni", &no_sni_socket, None),
    ] {
        let crt_list = crt_list
            .map(|list| format!(" crt-list {}", list.display()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "backend be_{name}\n  server fe_{name} unix@{socket} weight 1 send-proxy\n\n\
             frontend fe_{name}\n  bind unix@{socket} ssl crt {default}{crt_list} accept-proxy\n  mode http{fe_log}",
            fe_log = log
                .trim_end_matches('\n')
                .replace("  log global", "\n  log global"),
            socket = socket.display(),
            default = options.default_certificate.display(),
        );
        request_hygiene(out);
        let _ = writeln!(
            out,
            "  use_backend %[base,map_reg({edge})]\n  default_backend openshift_default\n",
            edge = options.map("os_edge_reencrypt_be.map").display(),
        );
    }
}

/// The backend of requests no route claims (a 404 page when one is configured).
fn default_backend(out: &mut String, options: &RenderOptions) {
    let _ = writeln!(
        out,
        "backend openshift_default\n  mode http\n  option forwardfor\n  option http-pretend-keepalive{deny}\n",
        deny = if options.error_pages.page_404.is_some() {
            "\n  http-request deny deny_status 404"
        } else {
            ""
        },
    );
}

/// What every `defaults` section holds: timeouts, limits, error pages, and the
/// adjustment of header case in responses to clients when there is one.
fn defaults_body(out: &mut String, options: &RenderOptions) {
    let _ = writeln!(
        out,
        "  maxconn {maxconn}\n  \
         errorfile 503 {e503}\n  errorfile 404 {e404}\n  \
         timeout connect 5s\n  timeout client 30s\n  timeout client-fin 1s\n  \
         timeout server 30s\n  timeout server-fin 1s\n  timeout http-request 10s\n  \
         timeout http-keep-alive 300s\n  timeout tunnel 1h",
        maxconn = options.max_connections,
        e503 = options.config_dir.join(ERROR_PAGES[0].0).display(),
        e404 = options.config_dir.join(ERROR_PAGES[1].0).display(),
    );
    if !options.header_case_adjustments.is_empty() {
        out.push_str("  option h1-case-adjust-bogus-client\n");
    }
}

/// The header names whose case HAProxy adjusts (a `global` section of their own).
fn header_case_adjustments(out: &mut String, options: &RenderOptions) {
    if options.header_case_adjustments.is_empty() {
        return;
    }
    out.push_str("global\n");
    for name in &options.header_case_adjustments {
        let _ = writeln!(out, "  h1-case-adjust {} {name}", name.to_ascii_lowercase());
    }
    out.push('\n');
}

/// What every HTTP frontend does to a request before routing it: refuse an empty
/// `Content-Length`, drop `Proxy` and client-certificate headers a client could forge,
/// and lower-case the host (DNS names are case-insensitive).
fn request_hygiene(out: &mut String) {
    out.push_str(
        "  http-request deny if { hdr_len(content-length) 0 }\n  http-request del-header Proxy\n",
    );
    for header in [
        "X-SSL",
        "X-SSL-Client-CN",
        "X-SSL-Client-DER",
        "X-SSL-Client-DN",
        "X-SSL-Client-NotAfter",
        "X-SSL-Client-NotBefore",
        "X-SSL-Client-SHA1",
        "X-SSL-Client-Serial",
        "X-SSL-Client-Subject",
        "X-SSL-Client-Verify",
        "X-SSL-Client-Version",
        "X-SSL-Issuer",
    ] {
        let _ = writeln!(out, "  http-request del-header {header}");
    }
    out.push_str("  http-request set-header Host %[req.hdr(Host),lower]\n");
}

/// One route's backend section; returns its servers as rendered.
fn backend(
    out: &mut String,
    route: &ServedRoute,
    plan: &BackendPlan,
    ca_file: Option<&Path>,
    allowlist_files: &mut Vec<(PathBuf, String)>,
    options: &RenderOptions,
) -> RenderedBackend {
    let routing = &route.routing;
    let annotation = |name: &str| routing.annotation(name);
    let allowlist = allowlist_rule(route, options, allowlist_files);
    let _ = writeln!(out, "backend {}", plan.name);
    let mode = if routing.termination == Termination::Passthrough {
        passthrough_settings(out, route, plan, allowlist.as_deref(), options)
    } else {
        http_settings(out, route, plan, allowlist.as_deref(), options)
    };
    let interval = time_value(annotation(
        "router.openshift.io/haproxy.health.check.interval",
    ))
    .unwrap_or_else(|| options.health_check_interval.clone());
    let settings = ServerSettings {
        termination: &routing.termination,
        ca_file,
        options,
        verify_host: routing.termination == Termination::Reencrypt
            && ca_file.is_none()
            && options.default_destination_ca.is_some(),
        checked: plan.active_endpoints > 1,
        interval,
        max_connections: annotation("haproxy.router.openshift.io/pod-concurrent-connections")
            .filter(|value| value.parse::<i64>().is_ok()),
    };
    let mut servers = Vec::with_capacity(plan.servers.len() + options.spare_servers);
    for server in &plan.servers {
        let _ = writeln!(
            out,
            "  server {} {}:{} weight {}{}",
            server.id,
            server.ip,
            server.port,
            server.weight,
            settings.line(server.h2c, &server.service_host, server.health_check)
        );
        servers.push(RenderedServer {
            name: server.id.clone(),
            target: Some(ServerTarget {
                ip: server.ip.clone(),
                port: server.port,
                weight: server.weight,
            }),
        });
    }
    // Spare servers are verified as the route's primary service (`spec.to`), as the
    // router's dynamic servers are: an endpoint of another service of a reencrypt
    // route verified by host needs a reload.
    let spare_options = settings.line(false, &primary_service_host(route), true);
    // A backend that takes no server at run time keeps spare servers for the
    // endpoints that come.
    let spares = if mode.dynamic {
        options.spare_servers
    } else {
        options.spare_servers.max(STATIC_BACKEND_SPARE_SERVERS)
    };
    for n in 1..=spares {
        let name = format!("{SPARE_SERVER_PREFIX}{n}");
        let _ = writeln!(
            out,
            "  server {name} {SPARE_SERVER_ADDRESS} weight 0 disabled{spare_options}"
        );
        servers.push(RenderedServer { name, target: None });
    }
    out.push('\n');
    let rendered = servers.len();
    RenderedBackend {
        name: plan.name.clone(),
        servers,
        checked: settings.checked,
        add: mode.dynamic.then(|| AddServers {
            options: spare_options,
            h2c: matches!(routing.termination, Termination::Http | Termination::Edge),
            cookies: mode.cookies,
            next: options.spare_servers + 1,
            next_id: rendered + 1,
        }),
    }
}

/// What a backend's settings allow of the servers added at run time.
struct BackendMode {
    /// Servers can be added at run time: its balance algorithm is dynamic
    /// (passthrough backends hash consistently, HTTP ones hash by no key).
    dynamic: bool,
    /// Its servers carry cookies (an added server needs its dynamic cookie enabled).
    cookies: bool,
}

/// The route's allow list as an ACL line: inline for a short list, else a file (pushed
/// on `allowlist_files`) the line names.
fn allowlist_rule(
    route: &ServedRoute,
    options: &RenderOptions,
    allowlist_files: &mut Vec<(PathBuf, String)>,
) -> Option<String> {
    let owned = |name: &str| route.routing.annotation(name).map(str::to_owned);
    annotations::allowlist(owned).map(|entries| {
        if entries.len() <= annotations::MAX_INLINE_ALLOWLIST {
            format!("  acl allowlist src {}\n", entries.join(" "))
        } else {
            let path = options.allowlist_file(route);
            let line = format!("  acl allowlist src -f {}\n", path.display());
            allowlist_files.push((path, entries.join("\n") + "\n"));
            line
        }
    })
}

/// Writes the allow list's ACL and the rule that rejects what it does not allow.
fn write_allowlist(out: &mut String, allowlist: Option<&str>) {
    if let Some(acl) = allowlist {
        out.push_str(acl);
        out.push_str("  tcp-request content reject if !allowlist\n");
    }
}

/// The balance algorithm: the route's annotation, round robin over several services,
/// else `default`.
fn balance_of(route: &ServedRoute, plan: &BackendPlan, default: &str) -> String {
    one_of(
        route
            .routing
            .annotation("haproxy.router.openshift.io/balance"),
        "roundrobin|leastconn|source|random",
    )
    .map(str::to_owned)
    .unwrap_or_else(|| {
        if plan.active_services > 1 {
            "roundrobin".into()
        } else {
            default.to_owned()
        }
    })
}

/// A passthrough backend's settings (TCP: balance, allow list, tunnel timeout, rate
/// limits).
fn passthrough_settings(
    out: &mut String,
    route: &ServedRoute,
    plan: &BackendPlan,
    allowlist: Option<&str>,
    options: &RenderOptions,
) -> BackendMode {
    let annotation = |name: &str| route.routing.annotation(name);
    let owned = |name: &str| route.routing.annotation(name).map(str::to_owned);
    let balance = balance_of(route, plan, &options.tcp_balance_scheme);
    let _ = writeln!(out, "  balance {balance}");
    write_allowlist(out, allowlist);
    let tunnel = time_value(annotation("haproxy.router.openshift.io/timeout-tunnel"))
        .or_else(|| time_value(annotation("haproxy.router.openshift.io/timeout")));
    if let Some(tunnel) = tunnel {
        let _ = writeln!(out, "  timeout tunnel  {tunnel}");
    }
    out.push_str(&annotations::rate_limits(owned, false));
    out.push_str("  hash-type consistent\n  timeout check 5000ms\n");
    BackendMode {
        dynamic: true,
        cookies: false,
    }
}

/// An HTTP backend's settings (edge, reencrypt and plain routes): forwarded headers,
/// balance, allow list, timeouts, rate limits, rewrite, cookies, HSTS and header
/// actions.
fn http_settings(
    out: &mut String,
    route: &ServedRoute,
    plan: &BackendPlan,
    allowlist: Option<&str>,
    options: &RenderOptions,
) -> BackendMode {
    let routing = &route.routing;
    let annotation = |name: &str| routing.annotation(name);
    let owned = |name: &str| routing.annotation(name).map(str::to_owned);
    let forwarded = forwarded_policy(route);
    out.push_str("  mode http\n  option redispatch\n");
    match forwarded {
        "append" => out.push_str("  option forwardfor\n"),
        "if-none" => out.push_str("  option forwardfor if-none\n"),
        _ => {}
    }
    if !options.header_case_adjustments.is_empty()
        && annotations::is_true(annotation("haproxy.router.openshift.io/h1-adjust-case"))
    {
        out.push_str("  option h1-case-adjust-bogus-server\n");
    }
    let balance = balance_of(route, plan, &options.load_balance_algorithm);
    let dynamic = matches!(
        balance.split_whitespace().next(),
        Some("roundrobin" | "leastconn" | "random")
    );
    let _ = writeln!(out, "  balance {balance}");
    write_allowlist(out, allowlist);
    if let Some(timeout) = time_value(annotation("haproxy.router.openshift.io/timeout")) {
        let _ = writeln!(out, "  timeout server  {timeout}");
    }
    if let Some(tunnel) = time_value(annotation("haproxy.router.openshift.io/timeout-tunnel")) {
        let _ = writeln!(out, "  timeout tunnel  {tunnel}");
    }
    out.push_str(&annotations::rate_limits(owned, true));
    out.push_str("  timeout check 5000ms\n");
    // The append policy's rules are its defaults section's.
    if forwarded != "append" {
        forwarded_headers(out, forwarded);
    }
    if let Some(rewrite) = annotations::rewrite_target(
        annotation("haproxy.router.openshift.io/rewrite-target"),
        routing.path.as_deref(),
    ) {
        out.push_str(&rewrite);
    }
    let terminated = matches!(
        routing.termination,
        Termination::Edge | Termination::Reencrypt
    );
    let key = routing_key(route);
    let cookies = write_cookie(out, route, &key, terminated);
    if terminated
        && let Some(hsts) = annotations::hsts(annotation("haproxy.router.openshift.io/hsts_header"))
    {
        let _ = writeln!(
            out,
            "  http-response set-header Strict-Transport-Security '{hsts}'"
        );
    }
    out.push_str(&annotations::header_actions(
        &routing.request_headers,
        &routing.response_headers,
    ));
    let _ = writeln!(out, "  dynamic-cookie-key {key}");
    BackendMode { dynamic, cookies }
}

/// The backend's sticky-session cookie, unless the route disables cookies; returns
/// whether it has one.
fn write_cookie(out: &mut String, route: &ServedRoute, key: &str, terminated: bool) -> bool {
    let routing = &route.routing;
    let annotation = |name: &str| routing.annotation(name);
    let enabled = annotation("haproxy.router.openshift.io/disable_cookies")
        .is_none_or(|value| !matches!(value, "true" | "TRUE" | "True" | "1" | "t" | "T"));
    if !enabled {
        return false;
    }
    let name = annotation("router.openshift.io/cookie_name")
        .filter(|name| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
        .unwrap_or(key);
    let _ = write!(out, "  cookie {name} insert indirect nocache httponly");
    if terminated && routing.insecure_policy != InsecurePolicy::Allow {
        let same_site = one_of(
            annotation("router.openshift.io/cookie-same-site"),
            "Lax|Strict|None",
        )
        .unwrap_or("None");
        let _ = write!(out, " secure attr SameSite={same_site}");
    }
    // Cookies follow the server's address, so a server slot given another
    // endpoint at run time gets that endpoint's cookie.
    out.push_str(" dynamic\n");
    true
}

/// What every server line of a backend carries after its address and weight.
struct ServerSettings<'a> {
    termination: &'a Termination,
    ca_file: Option<&'a Path>,
    options: &'a RenderOptions,
    /// Reencrypt verified against the default destination CA: the server's name is
    /// checked as the service's host.
    verify_host: bool,
    /// Health checks are on (more than one active endpoint).
    checked: bool,
    interval: String,
    max_connections: Option<&'a str>,
}

impl ServerSettings<'_> {
    /// The options of a server to `service_host` (TLS to the backend, h2c, health
    /// check, connection limit).
    fn line(&self, h2c: bool, service_host: &str, health_check: bool) -> String {
        let mut line = String::new();
        match self.termination {
            Termination::Reencrypt => {
                line.push_str(" ssl");
                if !self.options.disable_http2 {
                    line.push_str(" alpn h2,http/1.1");
                }
                match (self.ca_file, &self.options.default_destination_ca) {
                    (Some(file), _) => {
                        let _ = write!(line, " verify required ca-file {}", file.display());
                    }
                    (None, Some(default)) => {
                        if self.verify_host {
                            let _ = write!(line, " verifyhost {service_host}");
                        }
                        let _ = write!(line, " verify required ca-file {}", default.display());
                    }
                    (None, None) => line.push_str(" verify none"),
                }
            }
            Termination::Http | Termination::Edge if h2c => line.push_str(" proto h2"),
            _ => {}
        }
        if self.checked && health_check {
            let _ = write!(line, " check inter {}", self.interval);
        }
        if let Some(max) = self.max_connections {
            let _ = write!(line, " maxconn {max}");
        }
        line
    }
}

/// The DNS name of a route's primary service (`spec.to`): `<service>.<namespace>.svc`.
pub fn primary_service_host(route: &ServedRoute) -> String {
    let service = route
        .routing
        .backends
        .first()
        .map_or("", |backend| &*backend.name);
    format!("{service}.{}.svc", route.key.namespace)
}

/// A route's `set-forwarded-headers` policy (`append` unless annotated otherwise).
fn forwarded_policy(route: &ServedRoute) -> &str {
    one_of(
        route
            .routing
            .annotation("haproxy.router.openshift.io/set-forwarded-headers"),
        "append|replace|if-none|never",
    )
    .unwrap_or("append")
}

/// Whether a route's backend takes the `append` policy's rules from
/// [`FORWARDED_APPEND_DEFAULTS`].
fn forwards_by_defaults(route: &ServedRoute) -> bool {
    route.routing.termination != Termination::Passthrough && forwarded_policy(route) == "append"
}

/// The `defaults` section of the backends that take the append policy's rules
/// ([`FORWARDED_APPEND_DEFAULTS`]): the first defaults section's settings and those
/// rules.
fn forwarding_defaults(out: &mut String, options: &RenderOptions) {
    let _ = writeln!(out, "defaults {FORWARDED_APPEND_DEFAULTS}");
    defaults_body(out, options);
    out.push_str("  mode http\n");
    forwarded_headers(out, "append");
    out.push('\n');
}

/// The `X-Forwarded-*` and `Forwarded` headers a backend adds, by the route's
/// `set-forwarded-headers` policy.
fn forwarded_headers(out: &mut String, policy: &str) {
    let forwarded_v6 =
        "for=\\\"[%[src]]\\\";host=%[req.hdr(host)];proto=%[req.hdr(X-Forwarded-Proto)]";
    let forwarded_v4 = "for=%[src];host=%[req.hdr(host)];proto=%[req.hdr(X-Forwarded-Proto)]";
    match policy {
        "append" => {
            let _ = writeln!(
                out,
                "  http-request add-header X-Forwarded-Host %[req.hdr(host)]\n  \
                 http-request add-header X-Forwarded-Port %[dst_port]\n  \
                 http-request add-header X-Forwarded-Proto http if !{{ ssl_fc }}\n  \
                 http-request add-header X-Forwarded-Proto https if {{ ssl_fc }}\n  \
                 http-request add-header X-Forwarded-Proto-Version h2 if {{ ssl_fc_alpn -i h2 }}\n  \
                 acl ipv6_addr src -m sub :\n  \
                 http-request add-header Forwarded {forwarded_v6} if ipv6_addr\n  \
                 http-request add-header Forwarded {forwarded_v4} if !ipv6_addr"
            );
        }
        "replace" => {
            let _ = writeln!(
                out,
                "  http-request set-header X-Forwarded-For %[src]\n  \
                 http-request set-header X-Forwarded-Host %[req.hdr(host)]\n  \
                 http-request set-header X-Forwarded-Port %[dst_port]\n  \
                 http-request set-header X-Forwarded-Proto http if !{{ ssl_fc }}\n  \
                 http-request set-header X-Forwarded-Proto https if {{ ssl_fc }}\n  \
                 http-request set-header X-Forwarded-Proto-Version h2 if {{ ssl_fc_alpn -i h2 }}\n  \
                 acl ipv6_addr src -m sub :\n  \
                 http-request set-header Forwarded {forwarded_v6} if ipv6_addr\n  \
                 http-request set-header Forwarded {forwarded_v4} if !ipv6_addr"
            );
        }
        "if-none" => {
            let _ = writeln!(
                out,
                "  http-request set-header X-Forwarded-Host %[req.hdr(host)] if !{{ req.hdr(X-Forwarded-Host) -m found }}\n  \
                 http-request set-header X-Forwarded-Port %[dst_port] if !{{ req.hdr(X-Forwarded-Port) -m found }}\n  \
                 http-request set-header X-Forwarded-Proto http if !{{ ssl_fc }} !{{ req.hdr(X-Forwarded-Proto) -m found }}\n  \
                 http-request set-header X-Forwarded-Proto https if {{ ssl_fc }} !{{ req.hdr(X-Forwarded-Proto) -m found }}\n  \
                 http-request set-header X-Forwarded-Proto-Version h2 if {{ ssl_fc_alpn -i h2 }} !{{ req.hdr(X-Forwarded-Proto-Version) -m found }}\n  \
                 acl ipv6_addr src -m sub :\n  \
                 http-request set-header Forwarded {forwarded_v6} if ipv6_addr !{{ req.hdr(Forwarded) -m found }}\n  \
                 http-request set-header Forwarded {forwarded_v4} if !ipv6_addr !{{ req.hdr(Forwarded) -m found }}"
            );
        }
        _ => {}
    }
}

mod annotations;

#[cfg(test)]
mod tests;
