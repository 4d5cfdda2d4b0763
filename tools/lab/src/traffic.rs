//! The demo's traffic: a small HTTP backend that says who it is, registered as a
//! route's Service and EndpointSlice, and one HTTPS request (with SNI) through the
//! HAProxy certwatch runs, reporting who answered and under which certificate.
//!
//! The backend listens in the lab's test host (`testenv::netns`: a network namespace of
//! this process's own, joined to the machine by a veth pair): Kubernetes refuses loopback
//! addresses in EndpointSlices (and kube-sim does as it does), and demo traffic never
//! goes to the machine's own interface address.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use route_secrets::tls::Sha256Fingerprint;
use testenv::netns::{TestHost, TestHostError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A backend answering every request with `200` and its name.
pub struct DemoBackend {
    /// Its name, in the answer's body and `x-backend` header.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DemoBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DemoBackend {
    /// Starts one in the test host `host`.
    pub async fn start(name: &str, host: &TestHost) -> Result<Self, TestHostError> {
        let listener = host.listen(0)?;
        let addr = listener
            .local_addr()
            .map_err(|source| TestHostError::Bind {
                addr: SocketAddr::new(host.ip(), 0),
                source,
            })?;
        let body = format!("hello from {name} ({addr})\n");
        let answer = format!(
            "HTTP/1.1 200 OK\r\nx-backend: {name}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 2048];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(Self {
            name: name.to_owned(),
            addr,
            task,
        })
    }
}

/// Registers `backend` as the only ready endpoint of Service `service` in `namespace`,
/// on the port named `port_name`.
pub async fn register(
    admin: &kube::Client,
    namespace: &str,
    service: &str,
    port_name: &str,
    backend: &DemoBackend,
) -> Result<(), kube::Error> {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": namespace},
        "spec": {"ports": [{"name": port_name, "port": 443, "targetPort": backend.addr.port()}]},
    }))
    .map_err(kube::Error::SerdeError)?;
    Api::<Service>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &svc)
        .await?;
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-demo"), "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": backend.addr.port(), "protocol": "TCP"}],
        "endpoints": [{"addresses": [backend.addr.ip().to_string()], "conditions": {"ready": true}}],
    }))
    .map_err(kube::Error::SerdeError)?;
    Api::<EndpointSlice>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &slice)
        .await?;
    Ok(())
}

/// What one HTTPS request through the proxy got.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Who answered (`x-backend`), `None` when the proxy did.
    pub backend: Option<String>,
    /// The body's first line.
    pub body: String,
    /// The server certificate's SHA-256.
    pub certificate: Option<Sha256Fingerprint>,
}

/// `GET /` for `host`, with SNI `host`, to `https` (the certificate is shown, not
/// verified: the demo's certificates are self-signed).
pub async fn https_get(https: SocketAddr, host: &str) -> Option<Answer> {
    let session = testenv::tls_probe::connect(https, host, &[]).await?;
    let certificate = session.certificate.as_deref().map(Sha256Fingerprint::of);
    let mut stream = session.stream;
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let backend = head.lines().find_map(|line| {
        line.split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("x-backend"))
            .map(|(_, v)| v.trim().to_owned())
    });
    Some(Answer {
        status,
        backend,
        body: body.lines().next().unwrap_or("").to_owned(),
        certificate,
    })
}
