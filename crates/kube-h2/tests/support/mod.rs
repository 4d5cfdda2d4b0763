//! A small Kubernetes-like API server for the tests: real TCP, real TLS (rcgen CA,
//! ALPN), HTTP/2 with a configurable SETTINGS_MAX_CONCURRENT_STREAMS and HTTP/1.1 on the
//! same port (hyper-util's auto server sniffs the preface). It serves
//! `GET /api/v1/namespaces/{ns}/secrets` as a SecretList and, with `watch=true`, as a
//! watch that streams JSON lines until the client goes away, and it counts what it sees.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{body::Frame, body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Notify,
    task::AbortHandle,
};

/// Time between BOOKMARK events on an open watch.
const WATCH_TICK: Duration = Duration::from_millis(500);

/// How the test server speaks.
#[derive(Clone)]
pub struct ServerOptions {
    /// SETTINGS_MAX_CONCURRENT_STREAMS it advertises.
    pub max_concurrent_streams: u32,
    /// Whether it speaks HTTP/2 at all (h2c prior knowledge or ALPN h2).
    pub http2: bool,
    /// TLS with these ALPN protocols; `None` for plain TCP.
    pub tls_alpn: Option<Vec<Vec<u8>>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            http2: true,
            tls_alpn: None,
        }
    }
}

/// What the server has seen.
#[derive(Default)]
pub struct ServerState {
    next_connection: AtomicU64,
    pub connections_accepted: AtomicUsize,
    pub connections_open: AtomicUsize,
    pub http2_requests: AtomicUsize,
    pub http1_requests: AtomicUsize,
    pub open_watches: AtomicUsize,
    pub peak_open_watches: AtomicUsize,
    /// Open watches per connection id, and the peak per connection.
    per_connection: Mutex<HashMap<u64, (usize, usize)>>,
    /// Distinct Authorization header values.
    authorizations: Mutex<Vec<String>>,
    /// Distinct User-Agent header values.
    user_agents: Mutex<Vec<String>>,
    /// Per connection: abort (hard kill) and GOAWAY (graceful shutdown) controls.
    controls: Mutex<HashMap<u64, (AbortHandle, Arc<Notify>)>>,
}

impl ServerState {
    pub fn open_watches(&self) -> usize {
        self.open_watches.load(Ordering::SeqCst)
    }

    pub fn connections_accepted(&self) -> usize {
        self.connections_accepted.load(Ordering::SeqCst)
    }

    pub fn connections_open(&self) -> usize {
        self.connections_open.load(Ordering::SeqCst)
    }

    /// The most watches ever open at once on any one connection.
    pub fn peak_watches_per_connection(&self) -> usize {
        let per = self.per_connection.lock().unwrap();
        per.values().map(|(_, peak)| *peak).max().unwrap_or(0)
    }

    /// Open watches per connection, for connections with at least one.
    pub fn watches_per_connection(&self) -> Vec<usize> {
        let per = self.per_connection.lock().unwrap();
        let mut counts: Vec<usize> = per
            .values()
            .map(|(open, _)| *open)
            .filter(|n| *n > 0)
            .collect();
        counts.sort_unstable();
        counts
    }

    pub fn authorizations(&self) -> Vec<String> {
        self.authorizations.lock().unwrap().clone()
    }

    pub fn user_agents(&self) -> Vec<String> {
        self.user_agents.lock().unwrap().clone()
    }

    /// Drops every connection abruptly (as a crashed or restarted server would).
    pub fn kill_connections(&self) {
        for (abort, _) in self.controls.lock().unwrap().values() {
            abort.abort();
        }
    }

    /// Sends GOAWAY on every connection; streams already open continue.
    pub fn goaway_connections(&self) {
        for (_, goaway) in self.controls.lock().unwrap().values() {
            goaway.notify_one();
        }
    }

    fn watch_opened(&self, connection: u64) {
        let open = self.open_watches.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_open_watches.fetch_max(open, Ordering::SeqCst);
        let mut per = self.per_connection.lock().unwrap();
        let entry = per.entry(connection).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(entry.0);
    }

    fn watch_closed(&self, connection: u64) {
        self.open_watches.fetch_sub(1, Ordering::SeqCst);
        let mut per = self.per_connection.lock().unwrap();
        if let Some(entry) = per.get_mut(&connection) {
            entry.0 -= 1;
        }
    }
}

/// Counts a watch as open until the response body is dropped.
struct WatchGuard {
    state: Arc<ServerState>,
    connection: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.state.watch_closed(self.connection);
    }
}

/// A CA and the PEM/DER a client needs to trust it.
pub struct TestCa {
    pub ca_der: Vec<u8>,
    leaf_chain: Vec<CertificateDer<'static>>,
    leaf_key: Vec<u8>,
}

impl TestCa {
    /// A CA and a server certificate for 127.0.0.1 and localhost signed by it.
    pub fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kube-h2 test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        Self {
            ca_der: ca_cert.der().to_vec(),
            leaf_chain: vec![leaf.der().clone(), ca_cert.der().clone()],
            leaf_key: leaf_key.serialize_der(),
        }
    }

    fn server_config(&self, alpn: Vec<Vec<u8>>) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                self.leaf_chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.clone())),
            )
            .unwrap();
        config.alpn_protocols = alpn;
        config
    }
}

/// A running test server.
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<ServerState>,
    pub ca: Option<TestCa>,
    accept_task: AbortHandle,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.state.kill_connections();
    }
}

impl TestServer {
    pub async fn start(options: ServerOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ServerState::default());
        let ca = options.tls_alpn.as_ref().map(|_| TestCa::new());
        let acceptor = match (&ca, &options.tls_alpn) {
            (Some(ca), Some(alpn)) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                ca.server_config(alpn.clone()),
            ))),
            _ => None,
        };
        let accept_state = state.clone();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let state = accept_state.clone();
                let options = options.clone();
                let acceptor = acceptor.clone();
                let id = state.next_connection.fetch_add(1, Ordering::SeqCst);
                let goaway = Arc::new(Notify::new());
                let goaway_rx = goaway.clone();
                // Registered before the task runs, so a kill right after accept finds it.
                let mut controls = state.controls.lock().unwrap();
                let task_state = state.clone();
                let task = tokio::spawn(async move {
                    match acceptor {
                        Some(acceptor) => {
                            // A failed handshake (an untrusting client) just ends here.
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                serve(tls, id, task_state, options, goaway_rx).await;
                            }
                        }
                        None => serve(tcp, id, task_state, options, goaway_rx).await,
                    }
                });
                controls.insert(id, (task.abort_handle(), goaway));
            }
        })
        .abort_handle();
        Self {
            addr,
            state,
            ca,
            accept_task,
        }
    }

    /// A kube config pointing at this server, default namespace `ns`.
    pub fn kube_config(&self) -> kube::Config {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        let mut config = kube::Config::new(format!("{scheme}://{}", self.addr).parse().unwrap());
        config.default_namespace = "ns".to_owned();
        if let Some(ca) = &self.ca {
            config.root_cert = Some(vec![ca.ca_der.clone()]);
        }
        config
    }
}

/// Counts a connection as open for as long as it is served.
struct ConnectionGuard(Arc<ServerState>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve<I>(
    io: I,
    id: u64,
    state: Arc<ServerState>,
    options: ServerOptions,
    goaway: Arc<Notify>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    state.connections_accepted.fetch_add(1, Ordering::SeqCst);
    state.connections_open.fetch_add(1, Ordering::SeqCst);
    let _open = ConnectionGuard(state.clone());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .max_concurrent_streams(options.max_concurrent_streams);
    if !options.http2 {
        builder = builder.http1_only();
    }
    let service_state = state.clone();
    let service = service_fn(move |request: Request<Incoming>| {
        let state = service_state.clone();
        async move { Ok::<_, Infallible>(handle(state, id, request).await) }
    });
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = goaway.notified() => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

type ServerBody = BoxBody<Bytes, Infallible>;

async fn handle(
    state: Arc<ServerState>,
    connection: u64,
    request: Request<Incoming>,
) -> Response<ServerBody> {
    match request.version() {
        Version::HTTP_2 => state.http2_requests.fetch_add(1, Ordering::SeqCst),
        _ => state.http1_requests.fetch_add(1, Ordering::SeqCst),
    };
    for (header, seen) in [
        (http::header::AUTHORIZATION, &state.authorizations),
        (http::header::USER_AGENT, &state.user_agents),
    ] {
        if let Some(value) = request.headers().get(header) {
            let value = value.to_str().unwrap_or("<binary>").to_owned();
            let mut seen = seen.lock().unwrap();
            if !seen.contains(&value) {
                seen.push(value);
            }
        }
    }
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let params: HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "v1", "namespaces", namespace, "secrets"]
            if request.method() == http::Method::GET =>
        {
            let name = params
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .unwrap_or("default-secret")
                .to_owned();
            if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
                watch(state, connection, namespace, &name)
            } else {
                let list = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "SecretList",
                    "metadata": {"resourceVersion": "1"},
                    "items": [secret(namespace, &name)],
                });
                json(StatusCode::OK, &list)
            }
        }
        ["api", "v1", "namespaces", _, "secrets"] if request.method() == http::Method::POST => {
            // Echo the created object back, as the API server does.
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let object: serde_json::Value = serde_json::from_slice(&body).unwrap();
            json(StatusCode::CREATED, &object)
        }
        ["api", "v1", "namespaces", _, "secrets", "hang"] => {
            // Never answers: for response-header deadlines.
            std::future::pending::<()>().await;
            unreachable!()
        }
        ["api", "v1", "namespaces", namespace, "secrets", name] => {
            json(StatusCode::OK, &secret(namespace, name))
        }
        _ => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": "NotFound", "code": 404, "message": format!("{path} not found"),
            }),
        ),
    }
}

fn secret(namespace: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
        "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
    })
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<ServerBody> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(value.to_string())).boxed())
        .unwrap()
}

fn line(event_type: &str, object: serde_json::Value) -> Bytes {
    let mut text = serde_json::json!({"type": event_type, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

/// ADDED for the secret, then a BOOKMARK every tick, until the client goes away.
fn watch(
    state: Arc<ServerState>,
    connection: u64,
    namespace: &str,
    name: &str,
) -> Response<ServerBody> {
    state.watch_opened(connection);
    let guard = WatchGuard { state, connection };
    let added = line("ADDED", secret(namespace, name));
    let first = futures::stream::once(async move { Ok::<_, Infallible>(Frame::data(added)) });
    let bookmarks = futures::stream::unfold((guard, 2u64), |(guard, rv)| async move {
        tokio::time::sleep(WATCH_TICK).await;
        let bookmark = line(
            "BOOKMARK",
            serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"resourceVersion": rv.to_string()},
            }),
        );
        Some((Ok(Frame::data(bookmark)), (guard, rv + 1)))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(first.chain(bookmarks))))
        .unwrap()
}

/// A TCP proxy in front of a server whose existing connections can be frozen: bytes
/// stop flowing both ways but the sockets stay open, as with a peer that vanished
/// without a FIN. Connections accepted after a freeze flow normally.
pub struct FreezableProxy {
    pub addr: SocketAddr,
    /// One switch per accepted connection.
    switches: Arc<Mutex<Vec<tokio::sync::watch::Sender<bool>>>>,
    accept_task: AbortHandle,
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl FreezableProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let switches: Arc<Mutex<Vec<tokio::sync::watch::Sender<bool>>>> = Arc::default();
        let accept_switches = switches.clone();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (frozen_tx, frozen_rx) = tokio::sync::watch::channel(false);
                accept_switches.lock().unwrap().push(frozen_tx);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, frozen_rx.clone()));
                tokio::spawn(pipe(server_read, client_write, frozen_rx));
            }
        })
        .abort_handle();
        Self {
            addr,
            switches,
            accept_task,
        }
    }

    /// Stops all traffic on the connections accepted so far.
    pub fn freeze_existing(&self) {
        for switch in self.switches.lock().unwrap().iter() {
            let _ = switch.send(true);
        }
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if *frozen.borrow() {
            // Hold both sockets open and move nothing.
            std::future::pending::<()>().await;
        }
        tokio::select! {
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
            },
            _ = frozen.changed() => {}
        }
    }
}

/// How long a wait for an event waits before the test fails (not a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `condition` every 10 ms until it holds; panics with `what` after ~60 s so a
/// broken pool fails the test instead of hanging it. Not a timing assertion.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}
