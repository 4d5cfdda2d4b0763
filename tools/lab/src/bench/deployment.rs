//! The `haproxy` strategy in the deployment's mode (`--haproxy-config deployment`):
//! certwatch and HAProxy as deploy/base runs them, measured as the certificates-only
//! mode measures them (see [`super::haproxy`]).
//!
//! - **certwatch** runs in the client process with the arguments the Deployment's
//!   `certwatch` container sets (its `CERTWATCH_*` variables, read from
//!   deploy/base/deployment.yaml when this binary was built, each given as the flag
//!   that reads it): the routing configuration (`--haproxy-config-dir`, a backend per
//!   route), `--run-haproxy false`, the sidecar's master CLI, HAProxy's threads and
//!   connection limit. Only what the pod's surroundings provide is the benchmark's:
//!   the mounted paths (temporary directories), the listening addresses (free ports
//!   on loopback), `/metrics` on the probe listener without authentication (the
//!   benchmark reads the backlog there, as the haproxy strategy does), status writes
//!   as `--status-writes` says, and the API client (the simulator's, as the router).
//! - **HAProxy** is started by the Deployment's `haproxy` container script itself,
//!   with its environment, the paths moved the same way: it waits for certwatch's
//!   files, then runs HAProxy in master-worker mode on the routing configuration;
//!   certwatch drives it through its runtime API and reloads it through its master
//!   CLI.
//! - **HAProxy's cold load** is the same script on a copy of that configuration
//!   (routing included; its own sockets and ports), started once the first one serves:
//!   spawn to its runtime API answering. Then `haproxy -c` of the copy.
//!
//! The simulator gives every route a Service and an EndpointSlice with one endpoint
//! (`endpoints=true` of its generator), so that each route's backend holds a server,
//! as in a cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use certwatch::Daemon;
use clap::{CommandFactory as _, Parser};
use serde::{Deserialize, Serialize};

use super::BenchError;
use super::haproxy::{
    check_load, crt_list_lines, failed, free_port, io, ms, sample_until_served, self_signed,
    startup,
};
use super::protocol::{ClientSpec, ErrorLog, HaproxyReady, HaproxyResources, ReadyReport};

/// The Deployment the mode runs as, as this binary was built.
const DEPLOYMENT_YAML: &str = include_str!("../../../../deploy/base/deployment.yaml");

/// What HAProxy the haproxy strategy runs, and on which configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HaproxyConfig {
    /// The benchmark's own configuration: one TLS frontend on certwatch's crt-list;
    /// HAProxy run by certwatch (`certwatch run --haproxy-config`).
    #[default]
    Certificates,
    /// As deploy/base runs it: certwatch writes the routing configuration (frontends,
    /// a backend per route, `--haproxy-config-dir`, `--run-haproxy false`) and HAProxy
    /// is started by the sidecar's script on it, at the Deployment's threads; every
    /// route gets a service with one endpoint.
    Deployment,
}

/// `certwatch run`'s command line, parsed as the binary parses it.
#[derive(Debug, Parser)]
#[command(name = "certwatch")]
struct CertwatchCommand {
    #[command(flatten)]
    run: certwatch::RunArgs,
}

/// The two containers of the Deployment, as far as the mode uses them.
struct Pod {
    /// The `certwatch` container's variables (`None`: set from the pod, `valueFrom`).
    certwatch_env: Vec<(String, Option<String>)>,
    /// The `haproxy` container's script (`/bin/sh -c SCRIPT`).
    sidecar_script: String,
    /// The `haproxy` container's variables.
    sidecar_env: Vec<(String, String)>,
}

impl Pod {
    /// The containers of deploy/base/deployment.yaml.
    fn of_the_deployment() -> Result<Self, BenchError> {
        let bad = |what: &str| failed(format!("deploy/base/deployment.yaml: {what}"));
        let deployment = serde_yaml::Deserializer::from_str(DEPLOYMENT_YAML)
            .filter_map(|doc| serde_yaml::Value::deserialize(doc).ok())
            .find(|doc| doc["kind"] == "Deployment")
            .ok_or_else(|| bad("no Deployment"))?;
        let containers = deployment["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .ok_or_else(|| bad("no containers"))?;
        let container = |name: &str| {
            containers
                .iter()
                .find(|container| container["name"] == name)
                .ok_or_else(|| bad(&format!("no {name} container")))
        };
        let certwatch = container("certwatch")?;
        let haproxy = container("haproxy")?;
        let env = |container: &serde_yaml::Value| -> Vec<(String, Option<String>)> {
            container["env"]
                .as_sequence()
                .map(|env| {
                    env.iter()
                        .filter_map(|variable| {
                            Some((
                                variable["name"].as_str()?.to_owned(),
                                variable["value"].as_str().map(str::to_owned),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let command: Vec<&str> = haproxy["command"]
            .as_sequence()
            .map(|command| command.iter().filter_map(|part| part.as_str()).collect())
            .unwrap_or_default();
        if command != ["/bin/sh", "-c"] {
            return Err(bad(&format!(
                "the haproxy container's command is {command:?}, not a script"
            )));
        }
        let sidecar_script = haproxy["args"][0]
            .as_str()
            .ok_or_else(|| bad("the haproxy container has no script"))?
            .to_owned();
        let sidecar_env = env(haproxy)
            .into_iter()
            .map(|(name, value)| {
                value
                    .map(|value| (name.clone(), value))
                    .ok_or_else(|| bad(&format!("{name} of the haproxy container has no value")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            certwatch_env: env(certwatch),
            sidecar_script,
            sidecar_env,
        })
    }
}

/// Where the pod's volumes are mounted here.
struct Mounts {
    /// `/run/haproxy` (the haproxy-run emptyDir): HAProxy's configuration and sockets.
    run: PathBuf,
    /// `/var/lib/certwatch` (the certs emptyDir): bundles and the crt-list.
    certs: PathBuf,
    /// `/etc/certwatch`: the default certificate and the service CA.
    etc: PathBuf,
}

impl Mounts {
    /// The pod's directories under `base` (its configuration directory, and the
    /// default certificate and service CA mounted from secrets and config maps), the
    /// bundles in `certs`.
    fn prepare(base: &Path, certs: PathBuf) -> Result<Self, BenchError> {
        let mounts = Self {
            run: base.join("run-haproxy"),
            certs,
            etc: base.join("etc"),
        };
        for dir in [
            mounts.run.clone(),
            mounts.etc.join("default-cert"),
            mounts.etc.join("service-ca"),
        ] {
            std::fs::create_dir_all(&dir).map_err(io("creating the pod's directories"))?;
        }
        std::fs::write(
            mounts.etc.join("default-cert").join("default.pem"),
            self_signed("default.invalid")?,
        )
        .map_err(io("writing the default certificate"))?;
        std::fs::write(
            mounts.etc.join("service-ca").join("service-ca.crt"),
            ca_certificate("bench service CA")?,
        )
        .map_err(io("writing the service CA"))?;
        Ok(mounts)
    }

    /// `text` with the pod's paths moved to these.
    fn local(&self, text: &str) -> String {
        text.replace("/run/haproxy", &self.run.display().to_string())
            .replace("/var/lib/certwatch", &self.certs.display().to_string())
            .replace("/etc/certwatch", &self.etc.display().to_string())
    }
}

/// Variables of the certwatch container the benchmark does not take: `/metrics` over
/// HTTPS with a certificate and token reviews (the benchmark reads `/metrics` on the
/// probe listener instead).
const NOT_TAKEN: [&str; 3] = [
    "CERTWATCH_METRICS_LISTEN",
    "CERTWATCH_METRICS_TLS_CERT",
    "CERTWATCH_METRICS_TLS_KEY",
];

/// The addresses certwatch's listeners got here, by variable.
#[derive(Debug, Default)]
struct Addresses {
    by_variable: BTreeMap<String, String>,
}

impl Addresses {
    fn port_of(&self, variable: &str) -> Result<u16, BenchError> {
        self.by_variable
            .get(variable)
            .and_then(|address| address.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok())
            .ok_or_else(|| failed(format!("the Deployment sets no {variable}")))
    }
}

/// `certwatch run`'s arguments for the Deployment's variables: each as the flag that
/// reads it, the paths moved, each listening address (`:PORT`) on a free loopback
/// port.
fn certwatch_args(
    pod: &Pod,
    mounts: &Mounts,
    spec: &ClientSpec,
) -> Result<(Vec<String>, Addresses), BenchError> {
    let command = CertwatchCommand::command();
    let mut args = vec!["certwatch".to_owned()];
    let mut addresses = Addresses::default();
    for (name, value) in &pod.certwatch_env {
        if NOT_TAKEN.contains(&name.as_str()) {
            continue;
        }
        let value = match (name.as_str(), value) {
            ("CERTWATCH_WRITE_STATUS", _) => spec.status_writes.to_string(),
            // The pod's namespace; the simulator's router lives in its own.
            ("CERTWATCH_LEASE_NAMESPACE", None) => kube_sim::ROUTER_NAMESPACE.to_owned(),
            (_, Some(value)) if value.starts_with(':') => {
                let address = format!("127.0.0.1:{}", free_port()?);
                addresses.by_variable.insert(name.clone(), address.clone());
                address
            }
            (_, Some(value)) => mounts.local(value),
            (_, None) => {
                return Err(failed(format!(
                    "the Deployment sets {name} from the pod: not known to the benchmark"
                )));
            }
        };
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_env().is_some_and(|env| env == name.as_str()))
            .ok_or_else(|| failed(format!("no certwatch flag reads {name}")))?;
        let long = arg
            .get_long()
            .ok_or_else(|| failed(format!("the flag that reads {name} has no long name")))?;
        if arg.get_action().takes_values() {
            args.push(format!("--{long}={value}"));
        } else if matches!(value.as_str(), "true" | "1" | "yes" | "on") {
            args.push(format!("--{long}"));
        }
    }
    args.push("--metrics-unauthenticated".to_owned());
    if let Some(threads) = spec.haproxy_threads {
        args.push(format!("--haproxy-threads={threads}"));
    }
    Ok((args, addresses))
}

/// The sidecar's script, running; stopped at once (SIGINT: the script stops HAProxy
/// without its shutdown delay) when dropped.
struct Sidecar {
    child: std::process::Child,
    log: PathBuf,
}

impl Sidecar {
    /// Starts `script` with `env` (SIGINT at its default: a shell cannot trap a signal
    /// ignored when it starts, as it is in a background job), its output to `log`.
    fn start(script: &str, env: &[(String, String)], log: &Path) -> Result<Self, BenchError> {
        let output = std::fs::File::create(log).map_err(io("creating the sidecar's log"))?;
        let errors = output
            .try_clone()
            .map_err(io("creating the sidecar's log"))?;
        let child = std::process::Command::new("env")
            .args(["--default-signal=INT", "sh", "-c"])
            .arg(script)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .map_err(io("starting the sidecar's script"))?;
        Ok(Self {
            child,
            log: log.to_owned(),
        })
    }

    /// Resolves when the script has exited (HAProxy refused its configuration, or
    /// stopped), with the end of its log.
    async fn exited(&mut self) -> String {
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let start = log
                    .char_indices()
                    .rev()
                    .nth(2_000)
                    .map_or(0, |(index, _)| index);
                return format!("{status}; its log ends: {}", &log[start..]);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let _ = self.child.wait();
    }
}

/// HAProxy's answer to `command` on its runtime API at `socket`; `None` while it does
/// not answer.
async fn ask(socket: &Path, command: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        stream
            .write_all(format!("{command}\n").as_bytes())
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

/// The worker's pid, from `show info`; `None` while HAProxy does not answer.
async fn show_info_pid(socket: &Path) -> Option<u32> {
    ask(socket, "show info")
        .await?
        .lines()
        .find_map(|line| line.strip_prefix("Pid:")?.trim().parse().ok())
}

/// Servers HAProxy holds in the routes' backends (`show servers state`: those with an
/// address of the simulator's endpoints, 10.0.0.0/8).
async fn route_servers(socket: &Path) -> usize {
    ask(socket, "show servers state")
        .await
        .unwrap_or_default()
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .nth(4)
                .is_some_and(|address| address.starts_with("10."))
        })
        .count()
}

/// Waits until HAProxy's runtime API at `socket` answers (its worker serves); the
/// worker's pid.
async fn answering(socket: &Path) -> u32 {
    loop {
        if let Some(pid) = show_info_pid(socket).await {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A copy of the routing configuration `text` for a second HAProxy: its sockets under
/// `cold_run` instead of `run`, each of `binds` (the first HAProxy's listening
/// addresses) moved to a free loopback port.
fn cold_config(
    text: &str,
    run: &Path,
    cold_run: &Path,
    binds: &[String],
) -> Result<String, BenchError> {
    let sockets = format!("{}/", run.display());
    let mut cold = text.replace(&sockets, &format!("{}/", cold_run.display()));
    for bind in binds {
        let moved = format!("127.0.0.1:{}", free_port()?);
        for end in ["\n", " "] {
            cold = cold.replace(
                &format!(" bind {bind}{end}"),
                &format!(" bind {moved}{end}"),
            );
        }
        if ["\n", " "]
            .iter()
            .any(|end| cold.contains(&format!(" bind {bind}{end}")))
        {
            return Err(failed(format!(
                "the copy of HAProxy's configuration still binds {bind}"
            )));
        }
    }
    if cold.contains(&sockets) {
        return Err(failed(format!(
            "the copy of HAProxy's configuration still names {sockets}"
        )));
    }
    Ok(cold)
}

/// A running daemon with the sidecar's HAProxy; dropping it stops both.
pub struct DeploymentRun {
    // Dropped in this order: HAProxy, then certwatch, then the directories.
    _sidecar: Sidecar,
    daemon: Daemon,
    _cert_dir: tempfile::TempDir,
    _root: tempfile::TempDir,
}

impl DeploymentRun {
    /// The daemon's connection pool counters.
    pub fn pool_stats(&self) -> kube_h2::PoolStats {
        self.daemon.pool_stats()
    }
}

/// A self-signed certificate alone (PEM), for the service CA.
fn ca_certificate(name: &str) -> Result<String, BenchError> {
    let key = rcgen::KeyPair::generate().map_err(|e| failed(e.to_string()))?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| failed(e.to_string()))?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name.to_owned());
    Ok(params
        .self_signed(&key)
        .map_err(|e| failed(e.to_string()))?
        .pem())
}

/// Client side: starts the sidecar's script and certwatch as the Deployment runs
/// them, and returns once HAProxy serves every sampled route and its cold load of the
/// same configuration has been measured.
pub async fn run(
    config: kube::Config,
    spec: &ClientSpec,
    started: Instant,
    errors: ErrorLog,
) -> Result<(ReadyReport, DeploymentRun), BenchError> {
    let timeout = Duration::from_millis(spec.timeout_ms);
    let pod = Pod::of_the_deployment()?;
    let cert_dir = certwatch::files::memory_backed_tempdir("certwatch-bench-certs-")
        .map_err(io("creating the cert directory"))?;
    let root = certwatch::files::memory_backed_tempdir("certwatch-bench-pod-")
        .map_err(io("creating the pod's directory"))?;
    let base = root
        .path()
        .canonicalize()
        .map_err(io("reading the pod's directory's path"))?;
    let mounts = Mounts::prepare(
        &base,
        cert_dir
            .path()
            .canonicalize()
            .map_err(io("reading the cert directory's path"))?,
    )?;
    let (args, addresses) = certwatch_args(&pod, &mounts, spec)?;
    let parsed = CertwatchCommand::try_parse_from(&args).map_err(|e| {
        failed(format!(
            "the Deployment's certwatch arguments {args:?}: {e}"
        ))
    })?;
    let threads = u16::try_from(parsed.run.haproxy_threads()).ok();
    let mut options = parsed
        .run
        .daemon_options()
        .map_err(|e| failed(format!("the Deployment's certwatch arguments: {e}")))?;
    if options.routing.is_none() || options.haproxy.is_none() {
        return Err(failed(
            "the Deployment's certwatch writes no routing configuration for a HAProxy",
        ));
    }
    options.identity = kube_sim::ROUTER_USER.to_owned();
    options.client = kube_h2::ClientOptions::default().protocol(spec.protocol.into());
    options.max_concurrent_syncs = spec.max_concurrent_syncs;
    if let Some(routing) = options.routing.as_mut() {
        routing.load_timeout = timeout;
    }
    let tls_port = addresses.port_of("CERTWATCH_HTTPS_BIND")?;
    let socket = mounts.run.join("run").join("haproxy.sock");

    // The sidecar first, as the pod starts its containers together: it waits for
    // certwatch's files.
    let sidecar_env: Vec<(String, String)> = pod
        .sidecar_env
        .iter()
        .map(|(name, value)| (name.clone(), mounts.local(value)))
        .collect();
    let mut sidecar = Sidecar::start(
        &mounts.local(&pod.sidecar_script),
        &sidecar_env,
        &base.join("haproxy.log"),
    )?;
    let daemon = Daemon::start(config, options)
        .await
        .map_err(|e| failed(e.to_string()))?;

    let milestones = startup::Milestones::until_files_ready(&daemon, started).await?;
    let files_ready_ms = milestones.files_ready_ms;
    let files_ready = Instant::now();
    let peak_mib =
        || super::process_stats::mib(super::process_stats::ProcessStats::now().rss_peak_bytes);
    super::progress(&format!(
        "  haproxy (deployment): files ready at {files_ready_ms} ms, peak memory so far {} MiB",
        peak_mib()
    ));
    // HAProxy's start as the sidecar runs it, from the files being ready (the script
    // looks for them every second) to its runtime API answering.
    let start = {
        let socket = socket.clone();
        tokio::spawn(async move {
            let worker = answering(&socket).await;
            (worker, files_ready.elapsed())
        })
    };
    let lines = crt_list_lines(&mounts.certs);
    let samples = startup::spread_samples(&lines);
    let sampled = samples.len();
    let daemon_ready = startup::daemon_ready(&daemon, started);
    tokio::select! {
        () = sample_until_served(tls_port, samples) => {}
        exit = sidecar.exited() => {
            return Err(failed(format!("the sidecar's script exited before HAProxy served: {exit}")));
        }
    }
    let served_ms = ms(started.elapsed());
    super::progress(&format!(
        "  haproxy (deployment): served at {served_ms} ms, peak memory so far {} MiB (with the handshake sampler's)",
        peak_mib()
    ));
    let daemon_ready_ms = startup::daemon_ready_ms(daemon_ready).await?;
    let (worker, haproxy_start) = tokio::time::timeout(timeout, start)
        .await
        .map_err(|_| failed("HAProxy's runtime API did not answer"))?
        .map_err(|e| failed(e.to_string()))?;
    let haproxy_start_ms = ms(haproxy_start);
    let served_haproxy = HaproxyResources::of_worker(worker);
    let servers = route_servers(&socket).await;
    let ready = *daemon.status().borrow();
    if ready.routed != Some(true) {
        errors.record("HAProxy had not loaded the routes' configuration at ready");
    }

    // HAProxy's own cold load of the same configuration: the sidecar's script again,
    // on a copy with its own sockets and ports.
    let cold_dir = base.join("cold");
    std::fs::create_dir_all(cold_dir.join("run"))
        .map_err(io("creating the cold load's directory"))?;
    let config_text = std::fs::read_to_string(mounts.run.join("haproxy.cfg"))
        .map_err(io("reading HAProxy's configuration"))?;
    let binds: Vec<String> = addresses.by_variable.values().cloned().collect();
    let cold_text = cold_config(
        &config_text,
        &mounts.run.join("run"),
        &cold_dir.join("run"),
        &binds,
    )?;
    let openssl_conf = mounts.run.join("openssl.cnf");
    if openssl_conf.exists() {
        std::fs::copy(&openssl_conf, cold_dir.join("openssl.cnf"))
            .map_err(io("copying HAProxy's OpenSSL configuration"))?;
    }
    let cold_config_path = cold_dir.join("haproxy.cfg");
    std::fs::write(&cold_config_path, cold_text)
        .map_err(io("writing the cold load's configuration"))?;
    let cold_mounts = Mounts {
        run: cold_dir.clone(),
        certs: mounts.certs.clone(),
        etc: mounts.etc.clone(),
    };
    let cold_env: Vec<(String, String)> = pod
        .sidecar_env
        .iter()
        .map(|(name, value)| (name.clone(), cold_mounts.local(value)))
        .collect();
    let cold_started = Instant::now();
    let mut cold = Sidecar::start(
        &cold_mounts.local(&pod.sidecar_script),
        &cold_env,
        &base.join("haproxy-cold.log"),
    )?;
    let cold_socket = cold_dir.join("run").join("haproxy.sock");
    let cold_worker = tokio::select! {
        worker = tokio::time::timeout(timeout, answering(&cold_socket)) => {
            worker.map_err(|_| failed("the cold load's HAProxy did not answer in time"))?
        }
        exit = cold.exited() => {
            return Err(failed(format!("the cold load's script exited before HAProxy served: {exit}")));
        }
    };
    let cold_load_ms = ms(cold_started.elapsed());
    let cold_haproxy = HaproxyResources::of_worker(cold_worker);
    drop(cold);
    // And `haproxy -c` of it: the load alone, no worker.
    let check = check_load(
        &cold_config_path,
        cold_env
            .iter()
            .find(|(name, _)| name == "OPENSSL_CONF")
            .map(|(_, value)| Path::new(value)),
    )
    .await?;
    let cold = startup::ColdLoad {
        ms: cold_load_ms,
        haproxy: cold_haproxy,
        check,
    };
    super::progress(&format!(
        "  haproxy (deployment): start {haproxy_start_ms} ms after the files; {}",
        cold.summary()
    ));

    let haproxy = HaproxyReady {
        tls_port,
        stats_socket: socket,
        cert_dir: mounts.certs.clone(),
        worker: Some(worker),
        listed: lines.len(),
        files_ready_ms,
        daemon_ready_ms,
        served_ms,
        sampled,
        haproxy_start_ms,
        cold_load_ms: cold.ms,
        metrics_addr: daemon.http_addr(),
        threads,
        served_haproxy,
        cold_haproxy: cold.haproxy,
        check: cold.check,
        config: HaproxyConfig::Deployment,
        servers,
        push: None,
    };
    let later = [("served", served_ms)];
    Ok((
        startup::ready_report(&daemon, &milestones, &ready, &later, haproxy, spec, &errors),
        DeploymentRun {
            _sidecar: sidecar,
            daemon,
            _cert_dir: cert_dir,
            _root: root,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployment_gives_a_routing_configuration_and_a_sidecar_script() {
        let pod = Pod::of_the_deployment().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mounts = Mounts::prepare(dir.path(), dir.path().join("certs")).unwrap();
        let spec = ClientSpec {
            strategy: super::super::scenario::Strategy::Haproxy,
            kubeconfig: PathBuf::from("/nowhere"),
            serial_routes: 0,
            max_concurrent_syncs: None,
            protocol: super::super::protocol::HttpProtocol::Auto,
            route_listing: super::super::protocol::RouteListing::List,
            status_writes: false,
            timeout_ms: 1_000,
            haproxy_threads: None,
            haproxy_start: super::super::protocol::HaproxyStart::Managed,
            haproxy_config: HaproxyConfig::Deployment,
            expected_rejected: 0,
        };
        let (args, addresses) = certwatch_args(&pod, &mounts, &spec).unwrap();
        let parsed = CertwatchCommand::try_parse_from(&args).unwrap();
        assert!(!parsed.run.run_haproxy, "{args:?}");
        assert!(
            !parsed.run.write_status,
            "as --status-writes says: {args:?}"
        );
        let options = parsed.run.daemon_options().unwrap();
        let routing = options.routing.unwrap();
        assert_eq!(routing.render.config_dir, mounts.run);
        assert!(routing.reload_external, "reloads through the master CLI");
        assert!(routing.haproxy_binary.is_none(), "the sidecar runs HAProxy");
        assert!(addresses.port_of("CERTWATCH_HTTPS_BIND").is_ok());
        let script = mounts.local(&pod.sidecar_script);
        assert!(
            script.contains(&format!(
                "haproxy -W -db -S {}/master.sock",
                mounts.run.display()
            )),
            "{script}"
        );
        assert!(!script.contains("/run/haproxy/"), "{script}");
    }

    #[test]
    fn the_cold_copy_moves_every_socket_and_listener() {
        let text = "global\n  stats socket /r/run/haproxy.sock mode 600\n\
                    frontend public\n  bind 127.0.0.1:4000\n\
                    frontend public_ssl\n  bind 127.0.0.1:40001 accept-proxy\n\
                    frontend fe_sni\n  bind unix@/r/run/haproxy-sni.sock ssl crt x\n";
        let binds = ["127.0.0.1:4000".to_owned(), "127.0.0.1:40001".to_owned()];
        let cold = cold_config(text, Path::new("/r/run"), Path::new("/c/run"), &binds).unwrap();
        assert!(cold.contains("stats socket /c/run/haproxy.sock"), "{cold}");
        assert!(cold.contains("unix@/c/run/haproxy-sni.sock"), "{cold}");
        for bind in binds {
            assert!(!cold.contains(&format!("bind {bind}\n")), "{cold}");
            assert!(!cold.contains(&format!("bind {bind} ")), "{cold}");
        }
        assert_eq!(cold.matches(" bind 127.0.0.1:").count(), 2, "{cold}");
        assert!(cold.contains(" accept-proxy\n"), "{cold}");
    }
}
