//! certwatch in routing mode: the binary writes HAProxy's configuration
//! (`--haproxy-config-dir`) and runs a real HAProxy on it, its plain and TLS listeners
//! on free loopback ports. [`RoutingLaunch`] says how to start it; [`Routing`] is the
//! running certwatch with HAProxy's addresses and the directories.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use super::{Certwatch, Launch, SimProcess, free_port};

/// The arguments of routing mode: HAProxy's configuration directory, its HTTP and
/// HTTPS listeners, and at most 2000 connections (within the test machine's descriptor
/// limit).
pub fn routing_args(config_dir: &Path, http: SocketAddr, https: SocketAddr) -> Vec<String> {
    vec![
        "--haproxy-config-dir".to_owned(),
        config_dir.display().to_string(),
        "--http-bind".to_owned(),
        http.to_string(),
        "--https-bind".to_owned(),
        https.to_string(),
        "--haproxy-max-connections".to_owned(),
        "2000".to_owned(),
    ]
}

/// A free port on 127.0.0.1, as an address.
pub fn free_loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// How to start certwatch in routing mode ([`RoutingLaunch::start`]).
pub struct RoutingLaunch {
    launch: Launch,
    config_dir: PathBuf,
    http: SocketAddr,
    https: SocketAddr,
    args: Vec<String>,
}

impl RoutingLaunch {
    /// certwatch against `kubeconfig` with the HAProxy it configures: its bundles in
    /// `root/certs`, HAProxy's configuration in `root/haproxy`, its log in
    /// `root/certwatch.log`, HAProxy's listeners on free loopback ports.
    pub fn new(kubeconfig: &Path, root: &Path) -> Self {
        Self {
            launch: Launch::new(kubeconfig, &root.join("certs"), &root.join("certwatch.log")),
            config_dir: root.join("haproxy"),
            http: free_loopback(),
            https: free_loopback(),
            args: Vec::new(),
        }
    }

    /// [`RoutingLaunch::new`] against the simulator `sim`.
    pub fn on(sim: &SimProcess, root: &Path) -> Self {
        Self::new(&sim.kubeconfig, root)
    }

    /// The log at `log` instead of `root/certwatch.log`.
    pub fn log(mut self, log: &Path) -> Self {
        log.clone_into(&mut self.launch.log);
        self
    }

    /// HAProxy's HTTPS listener on 127.0.0.1:`port`.
    pub fn https_port(mut self, port: u16) -> Self {
        self.https = SocketAddr::from(([127, 0, 0, 1], port));
        self
    }

    /// HAProxy's plain HTTP listener on 127.0.0.1:`port`.
    pub fn http_port(mut self, port: u16) -> Self {
        self.http = SocketAddr::from(([127, 0, 0, 1], port));
        self
    }

    /// `--haproxy-min-reload-interval`.
    pub fn min_reload_interval(self, interval: &str) -> Self {
        self.args(&["--haproxy-min-reload-interval", interval])
    }

    /// More arguments, after routing mode's.
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args
            .extend(args.iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// Anything else [`Launch`] says (environment, `--listen`, the user).
    pub fn adjust(mut self, adjust: impl FnOnce(Launch) -> Launch) -> Self {
        self.launch = adjust(self.launch);
        self
    }

    /// Starts certwatch; it serves its probes, not yet necessarily routes.
    pub fn start(self) -> Routing {
        let launch = Launch {
            args: routing_args(&self.config_dir, self.http, self.https)
                .into_iter()
                .chain(self.args)
                .chain(self.launch.args)
                .collect(),
            ..self.launch
        };
        let cert_dir = launch.cert_dir.clone();
        Routing {
            certwatch: Certwatch::launch(launch),
            cert_dir,
            http: self.http,
            https: self.https,
            config_dir: self.config_dir,
        }
    }

    /// Starts certwatch and waits until it is ready.
    pub async fn ready(self) -> Routing {
        let routing = self.start();
        routing.wait_ready().await;
        routing
    }
}

/// certwatch running in routing mode, with HAProxy's addresses; the certwatch it is
/// (probes, metrics, log, stop) by [`Deref`].
pub struct Routing {
    pub certwatch: Certwatch,
    /// certwatch's bundles and crt-list (`--cert-dir`).
    pub cert_dir: PathBuf,
    /// HAProxy's plain HTTP listener.
    pub http: SocketAddr,
    /// HAProxy's TLS listener.
    pub https: SocketAddr,
    /// HAProxy's configuration directory (`--haproxy-config-dir`).
    pub config_dir: PathBuf,
}

impl Routing {
    /// The port of HAProxy's TLS listener.
    pub fn https_port(&self) -> u16 {
        self.https.port()
    }

    /// HAProxy's configuration file.
    pub fn config(&self) -> PathBuf {
        self.config_dir.join("haproxy.cfg")
    }

    /// HAProxy's runtime API socket.
    pub fn socket(&self) -> PathBuf {
        self.config_dir.join("run/haproxy.sock")
    }
}

impl Deref for Routing {
    type Target = Certwatch;

    fn deref(&self) -> &Certwatch {
        &self.certwatch
    }
}

impl DerefMut for Routing {
    fn deref_mut(&mut self) -> &mut Certwatch {
        &mut self.certwatch
    }
}
