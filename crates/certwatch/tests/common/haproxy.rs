//! A real HAProxy for the end-to-end tests: its configuration on certwatch's
//! crt-list, `haproxy -c`, a running process with its runtime API socket, and a TLS
//! client that tells which certificate it serves for a name.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::{Certwatch, SimProcess, free_port, tls_of};

/// A test of certwatch with a real HAProxy: a directory of its own (canonical, as the
/// paths HAProxy's configuration names) with the simulator generating `routes` routes
/// in namespace `app-0`; certwatch's files go to `certs`, HAProxy's runtime API socket
/// is `haproxy.sock`.
pub struct HaproxyCase {
    pub root: PathBuf,
    pub sim: SimProcess,
    pub admin: kube::Client,
    pub socket: PathBuf,
    pub cert_dir: PathBuf,
    _temp: tempfile::TempDir,
}

impl HaproxyCase {
    /// Starts the simulator with `routes` routes in one namespace.
    pub async fn start(routes: usize) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().canonicalize().unwrap();
        let generate = format!("routes={routes},namespaces=1");
        let sim = SimProcess::start(&root, &["--generate", &generate]);
        let admin = sim.client("admin").await;
        Self {
            socket: root.join("haproxy.sock"),
            cert_dir: root.join("certs"),
            root,
            sim,
            admin,
            _temp: temp,
        }
    }

    /// The runtime API socket's path, as an argument (`--haproxy-socket`).
    pub fn socket_arg(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    /// Starts certwatch on the simulator with `args`, logging to `root/log`.
    pub fn certwatch(&self, log: &str, args: &[&str]) -> Certwatch {
        Certwatch::start(
            &self.sim.kubeconfig,
            &self.cert_dir,
            &self.root.join(log),
            args,
        )
    }

    /// Debian's HAProxy at its OpenSSL's own level, run by others (not by certwatch)
    /// on an empty crt-list in the cert dir, serving TLS; with its TLS port and the leaf
    /// of its default certificate.
    pub async fn haproxy_of_others(&self) -> (Haproxy, u16, Vec<u8>) {
        std::fs::create_dir_all(&self.cert_dir).unwrap();
        std::fs::write(self.cert_dir.join("crt-list"), "").unwrap();
        let (haproxy, port, default_leaf) = start_haproxy(&self.root, &self.socket, &self.cert_dir);
        super::eventually_async("HAProxy to serve TLS", || {
            presented(port, "default.invalid")
        })
        .await;
        (haproxy, port, default_leaf)
    }

    /// Starts certwatch beside an HAProxy run by others (`--haproxy-socket` alone),
    /// logging to `root/log`.
    pub fn certwatch_beside_haproxy(&self, log: &str) -> Certwatch {
        self.certwatch(log, &["--haproxy-socket", self.socket_arg()])
    }

    /// HAProxy's configuration for certwatch to run ([`haproxy_config`]).
    pub fn managed(&self) -> Managed {
        let (config, port, default_leaf) = haproxy_config(&self.root, &self.socket, &self.cert_dir);
        Managed {
            socket_arg: self.socket_arg().to_owned(),
            config_arg: config.display().to_string(),
            config,
            port,
            default_leaf,
        }
    }
}

/// An HAProxy configuration certwatch runs HAProxy on (`--haproxy-config`).
pub struct Managed {
    socket_arg: String,
    config_arg: String,
    pub config: PathBuf,
    /// HAProxy's TLS port.
    pub port: u16,
    /// The leaf of HAProxy's default certificate.
    pub default_leaf: Vec<u8>,
}

impl Managed {
    /// The arguments that make certwatch run HAProxy on it (`--haproxy-socket`,
    /// `--haproxy-config`).
    pub fn args(&self) -> Vec<&str> {
        vec![
            "--haproxy-socket",
            &self.socket_arg,
            "--haproxy-config",
            &self.config_arg,
        ]
    }
}

/// The end-entity certificate HAProxy presents for `sni`, if a handshake succeeds.
pub async fn presented(port: u16, sni: &str) -> Option<Vec<u8>> {
    testenv::tls_probe::presented(("127.0.0.1", port), sni).await
}

pub fn leaf_der(pem_text: &[u8]) -> Vec<u8> {
    pem::parse_many(pem_text).unwrap()[0].contents().to_vec()
}

pub async fn leaf_of(client: &kube::Client, namespace: &str, name: &str) -> Vec<u8> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap();
    leaf_der(&tls_of(&secret).0)
}

/// One runtime API command over the stats socket.
pub fn runtime_api(socket: &Path, command: &str) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(format!("{command}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

pub fn info_field(socket: &Path, field: &str) -> u64 {
    runtime_api(socket, "show info")
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}: ")).map(str::to_owned))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Runtime API commands that failed, other than `show info` (which fails while
/// HAProxy is not running yet).
pub fn errors_besides_show_info(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|line| line.starts_with("certwatch_haproxy_commands_total{"))
        .filter(|line| line.contains("result=\"error\"") && !line.contains("command=\"show info\""))
        .filter(|line| !line.ends_with(" 0"))
        .count()
}

pub struct Haproxy {
    pub child: Child,
    log: PathBuf,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- haproxy log ---\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes HAProxy's configuration (a TLS frontend on a free port loading the crt-list
/// of `cert_dir` and a default certificate, the stats socket at level admin) to
/// `root/haproxy.cfg`.
pub fn haproxy_config(root: &Path, socket: &Path, cert_dir: &Path) -> (PathBuf, u16, Vec<u8>) {
    let default_pem = root.join("default.pem");
    std::fs::write(&default_pem, self_signed("default.invalid")).unwrap();
    let default_leaf = leaf_der(&std::fs::read(&default_pem).unwrap());
    let port = free_port();
    let config = root.join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n  stats socket {socket} level admin\n\
             defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend tls\n  bind 127.0.0.1:{port} ssl crt {default} crt-list {list}\n  default_backend nowhere\n\
             backend nowhere\n  server nowhere 127.0.0.1:9\n",
            socket = socket.display(),
            default = default_pem.display(),
            list = cert_dir.join("crt-list").display(),
        ),
    )
    .unwrap();
    (config, port, default_leaf)
}

/// Starts HAProxy on the files certwatch wrote; returns it, its TLS port and the leaf
/// of its default certificate.
pub fn start_haproxy(root: &Path, socket: &Path, cert_dir: &Path) -> (Haproxy, u16, Vec<u8>) {
    let (config, port, default_leaf) = haproxy_config(root, socket, cert_dir);
    let log = root.join("haproxy.err");
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(root.join("haproxy.log")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("haproxy must be installed (scripts/test installs it)");
    (Haproxy { child, log }, port, default_leaf)
}

/// `haproxy -c` on the configuration: HAProxy's verdict on the files as they are now
/// (it loads every certificate the crt-list names).
pub fn haproxy_check(config: &Path) -> Result<(), String> {
    let output = Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(config)
        .output()
        .expect("haproxy must be installed (scripts/test installs it)");
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

pub fn self_signed(host: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    let certificate = params.self_signed(&key).unwrap();
    format!("{}{}", certificate.pem(), key.serialize_pem())
}

/// The end-entity certificate HAProxy presents for `sni`, asked with `openssl s_client`
/// (installed by scripts/test): OpenSSL's client takes every key type HAProxy serves,
/// which the rustls client of [`presented`] does not (P-521). A P-224 certificate is
/// only chosen for a client that offers P-224 and a SHA-224 ECDSA signature over TLS
/// 1.2 (TLS 1.3 has no P-224 signature scheme), which OpenSSL does not by default: when
/// the first handshake fails, a second one offers them.
pub fn presented_to_openssl(port: u16, sni: &str) -> Option<Vec<u8>> {
    openssl_handshake(port, sni, &[]).or_else(|| {
        openssl_handshake(
            port,
            sni,
            &[
                "-tls1_2",
                "-curves",
                "P-224:P-256",
                "-sigalgs",
                "ECDSA+SHA224:ECDSA+SHA256",
            ],
        )
    })
}

fn openssl_handshake(port: u16, sni: &str, args: &[&str]) -> Option<Vec<u8>> {
    first_certificate(&s_client("127.0.0.1", port, sni, args).stdout)
}

/// `openssl s_client` (installed by scripts/test) to `host:port` (`127.0.0.1`, `[::1]`)
/// for `sni`, with `args`, its standard input closed: its output.
pub fn s_client(host: &str, port: u16, sni: &str, args: &[&str]) -> std::process::Output {
    Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(format!("{host}:{port}"))
        .args(["-servername", sni])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl must be installed (scripts/test installs it)")
}

/// The first certificate (DER) `openssl s_client` printed on `stdout`.
pub fn first_certificate(stdout: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(stdout);
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = text.find(BEGIN)?;
    let end = text[start..].find(END)? + start + END.len();
    Some(pem::parse(&text[start..end]).ok()?.contents().to_vec())
}

/// The sidecar's command line (`sh -c SCRIPT`) and environment, as deploy/base's
/// Deployment runs its `haproxy` container, with its volumes' paths moved to this
/// test's directories: `/run/haproxy` (the shared configuration directory) and
/// `/var/lib/certwatch` (the cert dir).
pub fn sidecar_of_the_deployment(
    config_dir: &Path,
    cert_dir: &Path,
) -> (String, Vec<(String, String)>) {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/deployment.yaml"),
    )
    .unwrap();
    let deployment: serde_yaml::Value = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .find(|doc: &serde_yaml::Value| doc["kind"] == "Deployment")
        .unwrap();
    let haproxy = deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|container| container["name"] == "haproxy")
        .unwrap()
        .clone();
    let local = |text: &str| {
        text.replace("/run/haproxy", config_dir.to_str().unwrap())
            .replace("/var/lib/certwatch", cert_dir.to_str().unwrap())
    };
    assert_eq!(
        serde_yaml::to_string(&haproxy["command"]).unwrap(),
        "- /bin/sh\n- -c\n"
    );
    let script = local(haproxy["args"][0].as_str().unwrap());
    let env = haproxy["env"]
        .as_sequence()
        .map(|env| {
            env.iter()
                .map(|variable| {
                    (
                        variable["name"].as_str().unwrap().to_owned(),
                        local(variable["value"].as_str().unwrap()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (script, env)
}
