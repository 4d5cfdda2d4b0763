//! Real traffic for the routing tests: small HTTP and HTTPS backends that say who they
//! are, registered as Services and EndpointSlices, and clients that send a request
//! through an HAProxy and report the status, who answered, the certificate served and
//! the ALPN negotiated.
//!
//! Backends listen in this test process's own test host (a network namespace joined to
//! the machine by a veth pair, `testenv::netns`): kube-apiserver (and so kube-sim)
//! refuses loopback and link-local addresses in EndpointSlices, and test traffic never
//! goes to the machine's own interface address.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The test host's address: where the backends listen.
pub fn backend_ip() -> IpAddr {
    testenv::netns::TestHost::shared()
        .expect("the routing tests run their backends in a test host (root and iproute2)")
        .ip()
}

/// A listener for a backend, on any port of the test host.
pub fn backend_listener() -> TcpListener {
    testenv::netns::TestHost::shared()
        .and_then(|host| host.listen(0))
        .expect("a backend's socket in the test host (root and iproute2)")
}

/// A backend: a name it answers with, where it listens, and what it was asked.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    /// Requests served: (Host header, path).
    pub seen: Arc<Mutex<Vec<(String, String)>>>,
    /// The leaf certificate (DER) of a TLS backend.
    pub certificate: Option<Vec<u8>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The answer a backend gives: `200`, `x-backend: <name>`, `x-path: <the request's
/// path as received>`, `x-host-header: <the Host header's name as received>`, body
/// `<name>`; and `x-echo-added: <value>` when the request had an `x-added` header.
fn answer(name: &str, path: &str, host_header: &str, added: Option<&str>) -> String {
    let echo = added
        .map(|value| format!("x-echo-added: {value}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 200 OK\r\nx-backend: {name}\r\nx-path: {path}\r\nx-host-header: {host_header}\r\n{echo}content-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}",
        name.len()
    )
}

/// Reads one request from `stream`, records it in `seen` and answers it; with `gate`,
/// only once the gate is open (`true`).
async fn serve_one<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    name: &str,
    seen: &Mutex<Vec<(String, String)>>,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let path = text
        .lines()
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or("")
        .to_owned();
    let host = text
        .lines()
        .find_map(|line| {
            line.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    let host_header = text
        .lines()
        .skip(1)
        .find_map(|line| {
            line.split_once(':')
                .map(|(k, _)| k)
                .filter(|k| k.eq_ignore_ascii_case("host"))
        })
        .unwrap_or("");
    let added = text.lines().skip(1).find_map(|line| {
        line.split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("x-added"))
            .map(|(_, v)| v.trim())
    });
    let response = answer(name, &path, host_header, added);
    seen.lock().unwrap().push((host, path));
    if let Some(mut gate) = gate
        && gate.wait_for(|open| *open).await.is_err()
    {
        return;
    }
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Opens the gate of a [`Backend::held`]: every request it holds, and every one to
/// come, is answered.
pub struct Release(tokio::sync::watch::Sender<bool>);

impl Release {
    /// A closed gate, and its receiver for whoever holds answers until it opens.
    pub fn new() -> (Self, tokio::sync::watch::Receiver<bool>) {
        let (release, gate) = tokio::sync::watch::channel(false);
        (Self(release), gate)
    }

    /// Answers what is held, and from now on at once.
    pub fn release(&self) {
        self.0.send_replace(true);
    }
}

impl Backend {
    /// A plain HTTP backend.
    pub async fn http(name: &str) -> Self {
        Self::http_gated(name, None).await
    }

    /// A plain HTTP backend that reads each request (counted in [`Backend::served`] at
    /// once) and answers it only once released: a request in flight for as long as a
    /// test wants.
    pub async fn held(name: &str) -> (Self, Release) {
        let (release, gate) = Release::new();
        (Self::http_gated(name, Some(gate)).await, release)
    }

    async fn http_gated(name: &str, gate: Option<tokio::sync::watch::Receiver<bool>>) -> Self {
        let listener = backend_listener();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (task_name, task_seen) = (name.to_owned(), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (name, seen, gate) = (task_name.clone(), Arc::clone(&task_seen), gate.clone());
                tokio::spawn(async move { serve_one(stream, &name, &seen, gate).await });
            }
        });
        Self {
            name: name.to_owned(),
            addr,
            seen,
            certificate: None,
            task,
        }
    }

    /// A TLS backend with its own self-signed certificate for `host` (HTTP/1.1 inside).
    pub async fn https(name: &str, host: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
        let certificate = params.self_signed(&key).unwrap();
        Self::https_with(name, certificate.der().to_vec(), key).await
    }

    /// A TLS backend whose certificate for `host` `ca` signed (HTTP/1.1 inside).
    pub async fn https_signed(name: &str, host: &str, ca: &TestCa) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
        let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
        let certificate = params.signed_by(&key, &issuer).unwrap();
        Self::https_with(name, certificate.der().to_vec(), key).await
    }

    async fn https_with(name: &str, der: Vec<u8>, key: rcgen::KeyPair) -> Self {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(der.clone())],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = backend_listener();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (task_name, task_seen) = (name.to_owned(), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (name, seen, acceptor) =
                    (task_name.clone(), Arc::clone(&task_seen), acceptor.clone());
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve_one(stream, &name, &seen, None).await;
                    }
                });
            }
        });
        Self {
            name: name.to_owned(),
            addr,
            seen,
            certificate: Some(der),
            task,
        }
    }

    /// Requests served so far (for a [`Backend::held`], received so far).
    pub fn served(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// A certificate authority of a test's own (a service CA, say).
pub struct TestCa {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    /// Its certificate, PEM.
    pub pem: String,
}

impl TestCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        Self { params, key, pem }
    }
}

/// Creates Service `name` (port `http` 80 → target `http`) in `namespace`.
pub async fn create_service(admin: &kube::Client, namespace: &str, name: &str) {
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
}

/// Creates or replaces EndpointSlice `<service>-1` naming `backends` as the service's
/// ready endpoints (port name `http`).
pub async fn set_endpoints(
    admin: &kube::Client,
    namespace: &str,
    service: &str,
    backends: &[&Backend],
) {
    let port = backends.first().map_or(80, |b| b.addr.port());
    assert!(
        backends.iter().all(|b| b.addr.port() == port) || backends.len() <= 1,
        "one slice, one port"
    );
    let endpoints: Vec<serde_json::Value> = backends
        .iter()
        .map(|b| serde_json::json!({"addresses": [b.addr.ip().to_string()], "conditions": {"ready": true}}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-1"), "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(admin.clone(), namespace)
        .patch(
            &format!("{service}-1"),
            &PatchParams::apply("certwatch-test").force(),
            &Patch::Apply(&slice),
        )
        .await
        .unwrap();
}

/// Creates or replaces EndpointSlice `<service>-<n>` with one endpoint per backend,
/// each on its own port: one slice per backend.
pub async fn set_endpoints_each(
    admin: &kube::Client,
    namespace: &str,
    service: &str,
    backends: &[&Backend],
) {
    let slices = Api::<EndpointSlice>::namespaced(admin.clone(), namespace);
    for (n, backend) in backends.iter().enumerate() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{service}-{n}"), "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": backend.addr.port(), "protocol": "TCP"}],
            "endpoints": [{"addresses": [backend.addr.ip().to_string()], "conditions": {"ready": true}}],
        }))
        .unwrap();
        slices
            .patch(
                &format!("{service}-{n}"),
                &PatchParams::apply("certwatch-test").force(),
                &Patch::Apply(&slice),
            )
            .await
            .unwrap();
    }
}

/// What a request through the proxy got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The `x-backend` header: who answered (`None`: the proxy itself).
    pub backend: Option<String>,
    /// The `location` header.
    pub location: Option<String>,
    /// The leaf certificate (DER) the TLS handshake presented (HTTPS only).
    pub certificate: Option<Vec<u8>>,
    /// The ALPN protocol negotiated (HTTPS only).
    pub alpn: Option<String>,
    /// The `x-path` header: the path the backend received.
    pub path: Option<String>,
    /// The `strict-transport-security` header.
    pub hsts: Option<String>,
    /// The `x-host-header` header: the Host header's name as the backend received it.
    pub host_header: Option<String>,
    /// The name of the `x-backend` header as the client received it (its case).
    pub backend_header: Option<String>,
    /// The `x-echo-added` header: the `x-added` request header the backend received.
    pub echo_added: Option<String>,
    /// The `x-resp` header.
    pub x_resp: Option<String>,
}

/// What an exchange read from a response: status and the headers the tests look at.
struct Answer {
    status: u16,
    backend: Option<String>,
    location: Option<String>,
    path: Option<String>,
    hsts: Option<String>,
    host_header: Option<String>,
    backend_header: Option<String>,
    echo_added: Option<String>,
    x_resp: Option<String>,
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    host: &str,
    path: &str,
) -> Option<Answer> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut response),
    )
    .await
    .ok()?;
    let text = String::from_utf8_lossy(&response);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let header = |name: &str| {
        text.split("\r\n\r\n").next().and_then(|head| {
            head.lines().find_map(|line| {
                line.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.trim().to_owned())
            })
        })
    };
    Some(Answer {
        status,
        backend: header("x-backend"),
        location: header("location"),
        path: header("x-path"),
        hsts: header("strict-transport-security"),
        host_header: header("x-host-header"),
        echo_added: header("x-echo-added"),
        x_resp: header("x-resp"),
        backend_header: text.split("\r\n\r\n").next().and_then(|head| {
            head.lines().find_map(|line| {
                line.split_once(':')
                    .map(|(k, _)| k)
                    .filter(|k| k.eq_ignore_ascii_case("x-backend"))
                    .map(str::to_owned)
            })
        }),
    })
}

/// A plain HTTP request for `host` + `path` to `addr`.
pub async fn http_get(addr: SocketAddr, host: &str, path: &str) -> Option<Response> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let answer = exchange(stream, host, path).await?;
    Some(Response {
        status: answer.status,
        backend: answer.backend,
        location: answer.location,
        certificate: None,
        alpn: None,
        path: answer.path,
        hsts: answer.hsts,
        host_header: answer.host_header,
        backend_header: answer.backend_header,
        echo_added: answer.echo_added,
        x_resp: answer.x_resp,
    })
}

/// An HTTPS request with SNI `sni` (and `Host: sni`) for `path` to `addr`, offering
/// ALPN `http/1.1` only when `h2` is false, `h2` and `http/1.1` otherwise (the request
/// itself is HTTP/1.1 either way: with `h2` negotiated only the handshake is reported).
pub async fn https_get(addr: SocketAddr, sni: &str, path: &str, h2: bool) -> Option<Response> {
    let protocols: &[&[u8]] = if h2 {
        &[b"h2", b"http/1.1"]
    } else {
        &[b"http/1.1"]
    };
    let session = testenv::tls_probe::connect(addr, sni, protocols).await?;
    let alpn = session.alpn();
    let certificate = session.certificate;
    let stream = session.stream;
    if alpn.as_deref() == Some("h2") {
        return Some(Response {
            status: 0,
            backend: None,
            location: None,
            certificate,
            alpn,
            path: None,
            hsts: None,
            host_header: None,
            backend_header: None,
            echo_added: None,
            x_resp: None,
        });
    }
    let answer = exchange(stream, sni, path).await?;
    Some(Response {
        status: answer.status,
        backend: answer.backend,
        location: answer.location,
        certificate,
        alpn,
        path: answer.path,
        hsts: answer.hsts,
        host_header: answer.host_header,
        backend_header: answer.backend_header,
        echo_added: answer.echo_added,
        x_resp: answer.x_resp,
    })
}
