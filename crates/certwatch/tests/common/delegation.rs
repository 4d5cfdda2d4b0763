//! Delegated authentication on the real control plane: service accounts' tokens,
//! kubeconfigs for them, `kubectl` as admin, a serving certificate of a test CA, and
//! HTTPS requests with a bearer token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use testenv::ControlPlane;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

pub fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `kubectl --context admin ARGS` with `stdin`; panics unless it succeeds.
pub fn kubectl(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let (success, text) = kubectl_with(plane.kubeconfig_path(), args, stdin);
    assert!(success, "kubectl {args:?}:\n{text}");
    text
}

/// `kubectl --kubeconfig KUBECONFIG --context admin ARGS` with `stdin`; returns
/// (success, stdout + stderr).
pub fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--context", "admin"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl must be on PATH (scripts/test installs it)");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// A token for the service account `namespace/name`, from the API server's
/// TokenRequest (what the kubelet mounts into a pod).
pub async fn token_for(admin: &kube::Client, namespace: &str, name: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap()
}

/// A kubeconfig for `token` on the control plane.
pub fn kubeconfig_for(plane: &ControlPlane, token: &str, path: &Path) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(plane.ca_pem());
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: test, cluster: {{server: \"{}\", certificate-authority-data: {ca}}}}}]\n\
             users: [{{name: certwatch, user: {{token: {token}}}}}]\n\
             contexts: [{{name: certwatch, context: {{cluster: test, user: certwatch}}}}]\ncurrent-context: certwatch\n",
            plane.url()
        ),
    )
    .unwrap();
}

/// A CA, and a serving certificate it issued for `names`, written as `ca.crt`,
/// `tls.crt`, `tls.key` in `dir`; returns the CA's PEM.
pub fn serving_certificate(dir: &Path, names: &[&str]) -> String {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "certwatch test service CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    let params = rcgen::CertificateParams::new(names).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    ca.pem()
}

/// `GET path` over TLS (trusting `ca_pem`, as `localhost`) with an optional bearer
/// token: status, head (lower case), body.
pub async fn https_get(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String, String) {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    // The server closes after the response (Connection: close); a TLS close without
    // close_notify is still the end of the body read so far.
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// Applies certwatch's namespace, service account and cluster role as deploy/base
/// declares them (server-side, as admin).
pub fn apply_base_identity(plane: &ControlPlane) {
    for file in ["namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml"] {
        let path = deploy_dir().join("base").join(file);
        kubectl(
            plane,
            &["apply", "--server-side", "-f", path.to_str().unwrap()],
            None,
        );
    }
}

/// Applies scrapers in namespace `monitoring`: service account `prometheus`, granted
/// `get` on the non-resource URL `/metrics` (as OpenShift's `prometheus-k8s` is), and a
/// service account for each of `ungranted`, without the grant.
pub fn apply_scrapers(plane: &ControlPlane, ungranted: &[&str]) {
    let mut manifest = "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: prometheus, namespace: monitoring}\n---\n"
        .to_owned();
    for name in ungranted {
        manifest.push_str(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: monitoring}}\n---\n"
        ));
    }
    manifest.push_str(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: metrics-reader}\n\
         rules: [{nonResourceURLs: [/metrics], verbs: [get]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: prometheus-metrics-reader}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}\n\
         subjects: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]\n",
    );
    kubectl(
        plane,
        &["apply", "--server-side", "-f", "-"],
        Some(&manifest),
    );
}

/// certwatch's HTTPS metrics endpoint: a serving certificate of a test CA in `dir`
/// (for `localhost` and `127.0.0.1`) and the arguments that serve `/metrics` with it on
/// any loopback port; returns the CA (PEM) and the arguments.
pub fn secure_metrics(dir: &Path) -> (String, Vec<String>) {
    let ca = serving_certificate(dir, &["localhost", "127.0.0.1"]);
    let args = [
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-tls-cert".to_owned(),
        dir.join("tls.crt").display().to_string(),
        "--metrics-tls-key".to_owned(),
        dir.join("tls.key").display().to_string(),
    ];
    (ca, args.into())
}

/// The real control plane with certwatch's identity as deploy/base declares it and the
/// scrapers of [`apply_scrapers`]; certwatch's kubeconfig (its service account's token)
/// and the serving certificate of its HTTPS metrics endpoint in a temporary directory.
pub struct Delegated {
    pub plane: ControlPlane,
    /// The token of `monitoring/prometheus`, granted `get` on `/metrics`.
    pub prometheus: String,
    /// The tokens of the scrapers without the grant, in the order named.
    pub ungranted: Vec<String>,
    /// The CA of the metrics endpoint's certificate (PEM).
    pub ca: String,
    /// The arguments that serve `/metrics` over HTTPS ([`secure_metrics`]).
    pub metrics_args: Vec<String>,
    pub kubeconfig: PathBuf,
    pub temp: tempfile::TempDir,
}

impl Delegated {
    /// Starts the control plane and applies the identities; `ungranted` names the
    /// scrapers without the grant.
    pub async fn start(ungranted: &[&str]) -> Self {
        let plane = ControlPlane::start().await.unwrap();
        let admin = plane.admin_client().await.unwrap();
        // certwatch's identity and RBAC, as deploy/base declares them.
        apply_base_identity(&plane);
        apply_scrapers(&plane, ungranted);
        let certwatch_token = token_for(&admin, "certwatch", "certwatch").await;
        let prometheus = token_for(&admin, "monitoring", "prometheus").await;
        let mut tokens = Vec::new();
        for name in ungranted {
            tokens.push(token_for(&admin, "monitoring", name).await);
        }
        let temp = tempfile::tempdir().unwrap();
        let kubeconfig = temp.path().join("certwatch.kubeconfig");
        kubeconfig_for(&plane, &certwatch_token, &kubeconfig);
        let (ca, metrics_args) = secure_metrics(temp.path());
        Self {
            plane,
            prometheus,
            ungranted: tokens,
            ca,
            metrics_args,
            kubeconfig,
            temp,
        }
    }

    /// certwatch as its service account, serving `/metrics` over HTTPS; its files in
    /// the temporary directory (`certs`, `certwatch.log`).
    pub fn launch(&self) -> super::Launch {
        super::Launch::new(
            &self.kubeconfig,
            &self.temp.path().join("certs"),
            &self.temp.path().join("certwatch.log"),
        )
        .args(&self.metrics_args)
    }
}
