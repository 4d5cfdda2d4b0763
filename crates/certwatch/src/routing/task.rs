//! The task that keeps HAProxy routing what certwatch serves: one cluster-wide
//! list/watch of EndpointSlices and one of Services (idled services, served at their
//! cluster IP; as the router has both), the served routes from the outputs, and
//! HAProxy itself.
//!
//! - Nothing is written before start-up is decided (every route present at start-up
//!   has its outcome and the crt-list is written) and the EndpointSlices and Services
//!   are listed: then the configuration is rendered, written and HAProxy started (or
//!   reloaded) on it once. The slices' and Services' lists go out with the routes'
//!   own, so start-up keeps its two round trips.
//! - An endpoint change reaches the running HAProxy through its runtime API, on the
//!   backends' server slots and servers added and deleted at run time
//!   ([`super::dynamic`]), without a reload. A server an endpoint left is deleted once
//!   HAProxy lets it (no connection left on it): at once, or at a later check.
//! - A change the slots cannot take, and any change of the routes themselves (added,
//!   removed, another host, path, termination, backend, weight or annotation), is
//!   written to the files and loaded by a reload; reloads come at most once per
//!   `reload_interval`, each taking every change since the last.
//! - A failed write, reload or command is retried with [`kube_common::backoff`] by a
//!   full render and reload.
//! - HAProxy run by others on these files (a sidecar container, [`RoutingOptions::
//!   reload_external`]) is reloaded through the certificates' controller
//!   ([`HaproxyHandle::request_reload`], its master CLI): a load is done once the
//!   HAProxy answering the runtime API says (`show env`) it holds the configuration's
//!   [`super::render::DIGEST_VARIABLE`]. It starts on the first files itself; one
//!   already running on older files is reloaded.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::listing::{Change, ListingStreamExt};
use kube_common::time::sleep_until;
use route_secrets::route::routing::Termination;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::changes::{self, ChangeReceiver, ChangeSender, RouteChange};
use super::dynamic::LoadedBackend;
use super::endpoints::{EndpointTable, ServiceKey};
use super::model::RoutingTable;
use super::render::{DIGEST_VARIABLE, RenderOptions, primary_service_host, render};
use super::supervisor::process_options;
use super::write_config;
use crate::file_loads::FileLoads;
use crate::haproxy::HaproxyHandle;
use crate::haproxy::process::{Drain, HaproxyProcess, Processes};
use crate::haproxy::runtime::{Instance, RuntimeError, current_instance, one_shot};
use crate::metrics::Metrics;
use crate::metrics::haproxy::ReloadReason;

/// How certwatch runs HAProxy's configuration.
#[derive(Clone, Debug)]
pub struct RoutingOptions {
    /// What the configuration is made of and where it goes.
    pub render: RenderOptions,
    /// The HAProxy binary certwatch runs on the configuration; `None`: HAProxy is run
    /// by others on the files (see `reload_external`).
    pub haproxy_binary: Option<PathBuf>,
    /// With `haproxy_binary` `None`: the HAProxy run by others is in master-worker mode
    /// and certwatch reloads it through the certificates' controller (its master CLI);
    /// a load is done once that HAProxy holds the configuration written. Off: the files
    /// are the hand-off (whoever runs HAProxy reloads it).
    pub reload_external: bool,
    /// Reloads come at most this often.
    pub reload_interval: Duration,
    /// Deadline of each runtime API exchange.
    pub command_timeout: Duration,
    /// How long a (re)started HAProxy may take to answer on its socket (it loads every
    /// certificate first).
    pub load_timeout: Duration,
    /// The loads of the cert directory's files ([`crate::cert_dir::CertDir::file_loads`]):
    /// each start or reload of the HAProxy certwatch runs is one, so that no file its
    /// crt-list names is removed while it loads.
    pub file_loads: FileLoads,
    /// How long the HAProxy certwatch runs may take to finish its connections when
    /// certwatch stops, and the cut that stops it at once.
    pub drain: Drain,
}

impl RoutingOptions {
    /// Defaults for `render`: HAProxy run by certwatch (`haproxy` on `PATH`), reloads
    /// at most every 5 s (the router's reload interval).
    pub fn new(render: RenderOptions) -> Self {
        Self {
            render,
            haproxy_binary: Some(PathBuf::from("haproxy")),
            reload_external: false,
            reload_interval: Duration::from_secs(5),
            command_timeout: Duration::from_secs(10),
            load_timeout: Duration::from_secs(600),
            file_loads: FileLoads::new(),
            drain: Drain::default(),
        }
    }
}

/// Handle of the routing task.
#[derive(Debug)]
pub struct Routing {
    changes: ChangeSender,
    served: watch::Receiver<bool>,
    repairs: watch::Receiver<u64>,
    haproxy: watch::Sender<Option<HaproxyHandle>>,
    /// Cancelled by [`Routing::close`]: a load in progress is abandoned.
    closing: CancellationToken,
    task: JoinHandle<()>,
}

impl Routing {
    /// Starts the task: its EndpointSlice and Service watches through `client` at once.
    pub fn spawn(client: kube::Client, options: RoutingOptions, metrics: Arc<Metrics>) -> Self {
        let (changes, inputs) = changes::channel();
        let (served_tx, served) = watch::channel(false);
        let (repairs_tx, repairs) = watch::channel(0);
        let (haproxy, haproxy_rx) = watch::channel(None);
        let slices = watch_events(
            Api::<EndpointSlice>::all(client.clone()),
            "endpointslices",
            Arc::clone(&metrics),
        );
        let services = watch_events(
            Api::<Service>::all(client),
            "services",
            Arc::clone(&metrics),
        );
        metrics.register_routing();
        let mut worker = Worker::new(options, metrics, haproxy_rx, served_tx);
        worker.repairs = repairs_tx;
        let closing = CancellationToken::new();
        let task = tokio::spawn(worker.run(inputs, slices, services, closing.clone()));
        Self {
            closing,
            changes,
            served,
            repairs,
            haproxy,
            task,
        }
    }

    /// The certificates' controller, which reloads a HAProxy run by others
    /// ([`RoutingOptions::reload_external`]); given before start-up is decided.
    pub fn use_haproxy(&self, haproxy: HaproxyHandle) {
        self.haproxy.send_replace(Some(haproxy));
    }

    /// Whether HAProxy has loaded the routes' configuration (it did once: the first
    /// load after start-up); `/readyz` waits for it.
    pub fn served(&self) -> watch::Receiver<bool> {
        self.served.clone()
    }

    /// Bumped each time HAProxy failed to load the files: the cert directory checks
    /// that every file its crt-list names is there (and writes again what is not)
    /// before the next load.
    pub fn repairs(&self) -> watch::Receiver<u64> {
        self.repairs.clone()
    }

    /// Tells the task of a route change; returns at once (a change not yet taken is
    /// replaced by the route's next one).
    pub fn send(&self, change: RouteChange) {
        self.changes.send(change);
    }

    /// Stops the task (and the HAProxy it runs): a load in progress is abandoned (a
    /// reload HAProxy is doing may take up to the load timeout).
    pub async fn close(self) {
        self.closing.cancel();
        drop(self.changes);
        let _ = self.task.await;
    }
}

/// One cluster-wide list/watch of `K` (`resource` names it in logs and metrics).
fn watch_events<K>(
    api: Api<K>,
    resource: &'static str,
    metrics: Arc<Metrics>,
) -> futures::stream::BoxStream<'static, Change<K>>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + 'static,
{
    // One list from the watch cache, unpaged, as the route watch lists.
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    watcher::watcher(api, config)
        .default_backoff()
        .gather_listings()
        .filter_map(move |item| {
            let event = match item {
                Ok(change) => Some(change),
                Err(error) => {
                    warn!(%error, resource, "watch failed; retrying");
                    metrics.api.watcher_error(resource, &error);
                    None
                }
            };
            std::future::ready(event)
        })
        .boxed()
}

struct Worker {
    options: RoutingOptions,
    metrics: Arc<Metrics>,
    table: RoutingTable,
    endpoints: EndpointTable,
    /// Whether the EndpointSlices have been listed.
    listed: bool,
    /// Whether the Services have been listed (idled services' cluster IPs).
    services_listed: bool,
    decided: bool,
    process: Option<HaproxyProcess>,
    /// The certificates' controller: reloads a HAProxy run by others.
    haproxy: watch::Receiver<Option<HaproxyHandle>>,
    /// Set once HAProxy first holds the routes' configuration.
    served: watch::Sender<bool>,
    /// Bumped when a load failed (see [`Routing::repairs`]).
    repairs: watch::Sender<u64>,
    /// Whether the running HAProxy holds the configuration last written.
    current: bool,
    /// What the running HAProxy holds, per backend.
    loaded: HashMap<String, LoadedBackend>,
    /// The instance that loaded it.
    instance: Option<Instance>,
    /// Routes changed since the last load: a reload is due.
    structure_dirty: bool,
    /// Services whose endpoints changed since HAProxy last heard.
    dirty_services: HashSet<ServiceKey>,
    /// Backends with spare servers beyond those kept, to delete.
    retiring: HashSet<String>,
    last_load: Option<Instant>,
    due: Option<Instant>,
    /// When to check next that the instance that loaded the configuration still
    /// answers, and whether that check is due.
    next_check: Instant,
    check_identity: bool,
    backoff: Backoff,
}

/// How often the routing task checks, without news, that the HAProxy answering is the
/// one that loaded its configuration: one started again by others (a sidecar's
/// restart) loaded the files, not the server slots changed since.
const IDENTITY_CHECK: Duration = Duration::from_secs(5);

impl Worker {
    fn new(
        options: RoutingOptions,
        metrics: Arc<Metrics>,
        haproxy: watch::Receiver<Option<HaproxyHandle>>,
        served: watch::Sender<bool>,
    ) -> Self {
        Self {
            options,
            metrics,
            haproxy,
            served,
            repairs: watch::channel(0).0,
            current: false,
            table: RoutingTable::new(),
            endpoints: EndpointTable::new(),
            listed: false,
            services_listed: false,
            decided: false,
            process: None,
            loaded: HashMap::new(),
            instance: None,
            structure_dirty: true,
            dirty_services: HashSet::new(),
            retiring: HashSet::new(),
            last_load: None,
            due: None,
            next_check: Instant::now() + IDENTITY_CHECK,
            check_identity: false,
            backoff: Backoff::new(BackoffPolicy::default()),
        }
    }

    async fn run(
        mut self,
        mut inputs: ChangeReceiver,
        mut slices: futures::stream::BoxStream<'static, Change<EndpointSlice>>,
        mut services: futures::stream::BoxStream<'static, Change<Service>>,
        closing: CancellationToken,
    ) {
        loop {
            if closing.is_cancelled() {
                break;
            }
            tokio::select! {
                biased;
                changes = inputs.recv() => {
                    let Some(changes) = changes else { break };
                    for change in changes {
                        self.take(change);
                    }
                }
                event = slices.next() => {
                    let Some(event) = event else { break };
                    self.take_slices(event);
                }
                event = services.next() => {
                    let Some(event) = event else { break };
                    self.take_services(event);
                }
                () = sleep_until(self.due), if self.due.is_some() => {
                    self.due = None;
                }
                () = tokio::time::sleep_until(self.next_check), if self.instance.is_some() => {
                    self.next_check = Instant::now() + IDENTITY_CHECK;
                    self.check_identity = true;
                }
                () = closing.cancelled() => break,
            }
            tokio::select! {
                () = self.step() => {}
                () = closing.cancelled() => break,
            }
        }
        if let Some(process) = self.process.take() {
            let stopped = process.stop(&self.options.drain).await;
            info!(?stopped, "HAProxy stopped");
        }
    }

    fn take(&mut self, change: RouteChange) {
        match change {
            RouteChange::Served(route) => {
                if self.table.upsert(route) {
                    self.structure_dirty = true;
                }
            }
            RouteChange::Gone(key) => {
                if self.table.remove(&key) {
                    self.structure_dirty = true;
                }
            }
            RouteChange::Decided => self.decided = true,
        }
    }

    fn take_slices(&mut self, event: Change<EndpointSlice>) {
        let changed = match event {
            Change::Listed(slices) => {
                self.listed = true;
                debug!(slices = slices.len(), "EndpointSlices listed");
                self.endpoints.replace_all(&slices)
            }
            Change::Applied(slice) => self.endpoints.apply(&slice),
            Change::Deleted(slice) => {
                let namespace = slice.namespace().unwrap_or_default();
                self.endpoints.remove(&namespace, &slice.name_any())
            }
        };
        self.dirty_services.extend(changed);
    }

    fn take_services(&mut self, event: Change<Service>) {
        let changed = match event {
            Change::Listed(services) => {
                self.services_listed = true;
                debug!(services = services.len(), "Services listed");
                self.endpoints.replace_services(&services)
            }
            Change::Applied(service) => self.endpoints.apply_service(&service),
            Change::Deleted(service) => {
                let namespace = service.namespace().unwrap_or_default();
                self.endpoints
                    .remove_service(&namespace, &service.name_any())
            }
        };
        self.dirty_services.extend(changed);
    }

    /// Brings HAProxy to the current routes and endpoints, as far as is due now.
    async fn step(&mut self) {
        if !(self.decided && self.listed && self.services_listed) {
            return;
        }
        let running = self.process.as_mut().is_none_or(HaproxyProcess::running);
        if !running {
            warn!("HAProxy is not running: starting it again");
            self.process = None;
            self.current = false;
            self.loaded.clear();
            self.structure_dirty = true;
        }
        if !self.current || self.structure_dirty {
            let now = Instant::now();
            let due = self
                .last_load
                .map(|last| last + self.options.reload_interval)
                .filter(|due| *due > now && self.current);
            if let Some(due) = due {
                self.due = Some(due);
                return;
            }
            self.load().await;
            return;
        }
        let check_identity = std::mem::take(&mut self.check_identity);
        if self.dirty_services.is_empty() && !check_identity {
            return;
        }
        // A HAProxy reloaded or restarted by someone else (the certificates' controller
        // for a certificate too large for its runtime API; a sidecar started again)
        // loaded the files as they were written, not the server slots changed since:
        // load them anew instead (a HAProxy run by others is reloaded only if what is
        // rendered now differs from what it loaded).
        if self.instance.is_some() {
            let now = current_instance(
                &self.options.render.admin_socket,
                self.options.command_timeout,
            )
            .await
            .ok();
            if now.is_some() && now != self.instance {
                info!("HAProxy was reloaded by another: loading the routes' configuration again");
                self.structure_dirty = true;
                self.due = Some(Instant::now());
                return;
            }
        }
        if self.dirty_services.is_empty() {
            self.delete_spares().await;
            return;
        }
        let services: Vec<ServiceKey> = self.dirty_services.drain().collect();
        let mut commands = Vec::new();
        let mut touched = Vec::new();
        let mut seen = HashSet::new();
        for service in &services {
            for route in self.table.routes_of(service) {
                if !seen.insert(route.key.clone()) {
                    continue;
                }
                let Some(plan) = RoutingTable::plan(route, &self.endpoints) else {
                    continue;
                };
                let Some(backend) = self.loaded.get_mut(&plan.name) else {
                    self.structure_dirty = true;
                    continue;
                };
                match backend.update(&plan) {
                    Ok(more) => {
                        if !more.is_empty() {
                            touched.push(plan.name.clone());
                        }
                        commands.extend(more);
                    }
                    Err(why) => {
                        info!(%why, "an endpoint change needs a reload");
                        self.structure_dirty = true;
                    }
                }
            }
        }
        if !commands.is_empty() {
            match run_commands(
                &self.options.render.admin_socket,
                &commands,
                self.options.command_timeout,
            )
            .await
            {
                Ok(()) => {
                    self.metrics.routing.server_commands(commands.len(), true);
                    debug!(
                        commands = commands.len(),
                        "endpoint changes sent to HAProxy"
                    );
                    self.retiring.extend(touched);
                    self.delete_spares().await;
                }
                Err(error) => {
                    self.metrics.routing.server_commands(commands.len(), false);
                    warn!(%error, "HAProxy refused endpoint changes; reloading instead");
                    self.structure_dirty = true;
                }
            }
        }
        if self.structure_dirty {
            // Taken by the next step (now or when the interval allows).
            self.due = Some(Instant::now());
        }
    }

    /// Deletes the spare servers beyond `--haproxy-spare-servers` of the backends in
    /// `retiring`, each by its own command (each answers whether HAProxy deleted it).
    /// HAProxy deletes no server with a connection on it (a request still in flight, an
    /// idle connection kept for reuse): its backend stays in `retiring` for the next
    /// check. The servers are in maintenance already: they get no new request.
    async fn delete_spares(&mut self) {
        if self.retiring.is_empty() {
            return;
        }
        let socket = self.options.render.admin_socket.clone();
        let timeout = self.options.command_timeout;
        let keep = self.options.render.spare_servers;
        let mut deleted = 0;
        for name in std::mem::take(&mut self.retiring) {
            let Some(backend) = self.loaded.get_mut(&name) else {
                continue;
            };
            let mut left = false;
            for server in backend.spares_beyond(keep) {
                let command = format!("del server {name}/{server}");
                match one_shot(&socket, &command, timeout).await {
                    Ok(answer) if answer.contains("Server deleted") => {
                        backend.deleted(&server);
                        deleted += 1;
                    }
                    Ok(answer) => {
                        debug!(backend = %name, %server, answer = answer.trim(), "server not deleted yet");
                        left = true;
                    }
                    Err(error) => {
                        debug!(%error, backend = %name, %server, "server not deleted yet");
                        left = true;
                    }
                }
            }
            if left {
                self.retiring.insert(name);
            }
        }
        if deleted > 0 {
            self.metrics.routing.server_commands(deleted, true);
            debug!(deleted, "servers endpoints left deleted from HAProxy");
        }
    }

    /// Renders, writes and (re)loads the whole configuration.
    async fn load(&mut self) {
        let started = Instant::now();
        let rendered = render(&self.table, &self.endpoints, &self.options.render);
        let config = match write_config(&rendered, &self.options.render) {
            Ok(config) => config,
            Err(error) => {
                warn!(%error, dir = %self.options.render.config_dir.display(), "cannot write HAProxy's configuration; will retry");
                self.retry_later();
                return;
            }
        };
        self.structure_dirty = false;
        self.dirty_services.clear();
        self.last_load = Some(started);
        let Some(binary) = self.options.haproxy_binary.clone() else {
            // Someone else runs HAProxy: reloaded through the controller's master CLI,
            // or the files are the hand-off.
            let haproxy = self.haproxy.borrow().clone();
            let instance = match haproxy.filter(|_| self.options.reload_external) {
                Some(haproxy) => match self.wait_external(&haproxy, &rendered.digest).await {
                    Some(instance) => Some(instance),
                    None => {
                        warn!(
                            digest = %rendered.digest,
                            "HAProxy did not load the routes' configuration; will retry"
                        );
                        self.retry_later();
                        return;
                    }
                },
                None => None,
            };
            self.instance = instance;
            self.loaded_now(&rendered, started);
            info!(
                routes = self.table.len(),
                services = self.endpoints.services(),
                pid = instance.map(|instance| instance.pid),
                digest = %rendered.digest,
                elapsed = ?started.elapsed(),
                "HAProxy holds the routes' configuration"
            );
            return;
        };
        let previous = self.instance;
        // Until the load has ended (however), no file a crt-list it may read names is
        // removed.
        let _loading = self.options.file_loads.begin();
        let mut reload = None;
        let result = match &mut self.process {
            Some(process) => process
                .begin_reload(self.options.command_timeout)
                .await
                .map(|before| {
                    reload = Some(before);
                    "reloaded"
                }),
            None => HaproxyProcess::spawn(process_options(
                &binary,
                &config,
                self.options.render.access_log,
                self.options.command_timeout,
            ))
            .await
            .map(|process| {
                self.process = Some(process);
                "started"
            }),
        };
        let what = match result {
            Ok(what) => what,
            Err(error) => {
                warn!(%error, "cannot run HAProxy; will retry");
                self.process = None;
                self.retry_later();
                return;
            }
        };
        match self.wait_for_load(previous, reload.as_ref()).await {
            Loading::Loaded(instance) => {
                self.instance = Some(instance);
                self.loaded_now(&rendered, started);
                info!(
                    routes = self.table.len(),
                    services = self.endpoints.services(),
                    pid = instance.pid,
                    elapsed = ?started.elapsed(),
                    "HAProxy {what} on the routes' configuration"
                );
            }
            Loading::Failed(log) => {
                // The old worker keeps serving. A file the crt-list names may be
                // missing (removed by others, or replaced at that moment): the cert
                // directory checks them and writes again what is missing, then the files
                // are loaded again. HAProxy's alerts say why; the rest of its output is
                // its life.
                let alerts: Vec<&str> = log
                    .split(" | ")
                    .filter(|line| line.contains("[ALERT]"))
                    .collect();
                let words = if alerts.is_empty() {
                    log.clone()
                } else {
                    alerts.join(" | ")
                };
                warn!(
                    haproxy = %words,
                    "HAProxy could not load the routes' configuration and files (its old worker keeps serving); checking the files and loading again"
                );
                self.repairs.send_modify(|count| *count += 1);
                self.retry_later();
            }
            Loading::NoAnswer => {
                warn!("HAProxy did not answer on its socket after loading; will retry");
                self.retry_later();
            }
        }
    }

    /// HAProxy holds `rendered`, loaded from the files (what each backend's slots are).
    fn loaded_now(&mut self, rendered: &super::RenderedConfig, started: Instant) {
        self.loaded = loaded_backends(&self.table, rendered, &self.options.render);
        self.retiring.clear();
        self.current = true;
        self.backoff = Backoff::new(BackoffPolicy::default());
        self.metrics
            .routing
            .loaded(started.elapsed(), self.table.len());
        self.served
            .send_if_modified(|served| !std::mem::replace(served, true));
    }

    /// Waits until the HAProxy run by others answers the runtime API with the
    /// configuration whose digest is `digest`: it starts on the files itself (its
    /// first start waits for them), and one that holds another configuration is
    /// reloaded through the controller, asked again after each reload that ended
    /// without it (the controller coalesces requests, and a reload begun before the
    /// files were written loads the older ones).
    async fn wait_external(&self, haproxy: &HaproxyHandle, digest: &str) -> Option<Instance> {
        let socket = &self.options.render.admin_socket;
        let timeout = self.options.command_timeout;
        let status = haproxy.status();
        let deadline = Instant::now() + self.options.load_timeout;
        // The controller's loads when the reload was asked for, and whether a reload
        // was seen running since.
        let mut asked: Option<(u64, bool)> = None;
        let mut absent_logged = false;
        while Instant::now() < deadline {
            // The controller's state before HAProxy is asked: a reload it saw end had
            // its new worker answering by then, so an older digest after it means that
            // reload loaded older files (not that the answer came from the old worker).
            let now = *status.borrow();
            match loaded_digest(socket, timeout).await {
                Ok(Some(loaded)) if loaded == digest => {
                    if let Ok(instance) = current_instance(socket, timeout).await {
                        return Some(instance);
                    }
                }
                Ok(_) => {
                    let ask = match &mut asked {
                        None => true,
                        Some((loads, seen_reloading)) => {
                            *seen_reloading |= now.reloading;
                            !now.reloading && (now.loads > *loads || *seen_reloading)
                        }
                    };
                    if ask {
                        debug!(digest, "HAProxy holds another configuration: reloading it");
                        haproxy.request_reload(ReloadReason::Routes);
                        asked = Some((now.loads, false));
                    }
                }
                Err(error) => {
                    if !absent_logged {
                        info!(%error, socket = %socket.display(), "waiting for HAProxy to start on the routes' configuration");
                        absent_logged = true;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Waits until a process other than `previous` answers on the admin socket, or
    /// (for a reload begun after the master said `reload`) the master says the load
    /// failed.
    async fn wait_for_load(
        &mut self,
        previous: Option<Instance>,
        reload: Option<&Processes>,
    ) -> Loading {
        let deadline = Instant::now() + self.options.load_timeout;
        while Instant::now() < deadline {
            if let Some(process) = &mut self.process
                && !process.running()
            {
                return Loading::NoAnswer;
            }
            if let Ok(instance) = current_instance(
                &self.options.render.admin_socket,
                self.options.command_timeout,
            )
            .await
                && previous.is_none_or(|previous| previous != instance)
            {
                return Loading::Loaded(instance);
            }
            if let (Some(before), Some(process)) = (reload, &self.process)
                && let Some(log) = process
                    .load_failed(before, self.options.command_timeout)
                    .await
            {
                return Loading::Failed(log);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Loading::NoAnswer
    }

    fn retry_later(&mut self) {
        self.metrics.routing.load_failed();
        self.structure_dirty = true;
        self.current = false;
        self.loaded.clear();
        self.retiring.clear();
        self.due = Some(Instant::now() + self.backoff.next_delay());
    }
}

/// How a start or reload of the HAProxy certwatch runs ended.
enum Loading {
    /// This process answers on the admin socket.
    Loaded(Instance),
    /// The load failed (the old worker keeps serving): the end of HAProxy's output.
    Failed(String),
    /// HAProxy exited, or did not answer within the load timeout.
    NoAnswer,
}

/// The digest of the configuration the HAProxy at `socket` loaded (`show env`), if it
/// loaded one of certwatch's.
async fn loaded_digest(
    socket: &std::path::Path,
    timeout: Duration,
) -> Result<Option<String>, RuntimeError> {
    let answer = one_shot(socket, &format!("show env {DIGEST_VARIABLE}"), timeout).await?;
    Ok(answer.lines().find_map(|line| {
        line.strip_prefix(DIGEST_VARIABLE)
            .and_then(|rest| rest.strip_prefix('='))
            .map(|value| value.trim().to_owned())
    }))
}

/// The backends a loaded configuration holds, with what their spare slots verify.
fn loaded_backends(
    table: &RoutingTable,
    rendered: &super::RenderedConfig,
    options: &RenderOptions,
) -> HashMap<String, LoadedBackend> {
    let mut verified: HashMap<String, String> = HashMap::new();
    for route in table.routes() {
        let verifies = route.routing.termination == Termination::Reencrypt
            && route.routing.destination_ca_certificate.is_none()
            && options.default_destination_ca.is_some();
        if verifies && let Some(name) = route.backend_name() {
            verified.insert(name, primary_service_host(route));
        }
    }
    rendered
        .backends
        .iter()
        .map(|backend| {
            (
                backend.name.clone(),
                LoadedBackend::loaded(backend, verified.get(&backend.name).cloned()),
            )
        })
        .collect()
}

/// The most bytes of commands sent as one request: well within HAProxy's line buffer
/// (`tune.bufsize`), whatever `add server` lines carry (CA file paths).
const MAX_BATCH_BYTES: usize = 8 * 1024;

/// Splits `commands` into requests of at most a hundred commands and
/// [`MAX_BATCH_BYTES`] (a longer command goes alone).
fn batches(commands: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, command) in commands.iter().enumerate() {
        let full = i - start == 100 || (i > start && bytes + 2 + command.len() > MAX_BATCH_BYTES);
        if full {
            out.push(&commands[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += command.len() + 2;
    }
    if start < commands.len() {
        out.push(&commands[start..]);
    }
    out
}

/// Runs payload-free commands (`set server ...`, `add server ...`) on connections of
/// their own, in [`batches`] separated by `;` as the CLI reads them. Those commands
/// answer nothing, or a line saying what changed, on success; an answer naming a
/// problem fails the batch (the commands before it ran).
async fn run_commands(
    socket: &std::path::Path,
    commands: &[String],
    timeout: Duration,
) -> Result<(), CommandError> {
    for batch in batches(commands) {
        let answer = one_shot(socket, &batch.join("; "), timeout).await?;
        let refused = answer.lines().find(|line| {
            [
                "No such",
                "Require",
                "Invalid",
                "Unknown",
                "Can't",
                "cannot",
                "not allowed",
                "Permission denied",
                "expects",
                "Already exists",
                "must use",
                "unknown keyword",
            ]
            .iter()
            .any(|marker| line.contains(marker))
        });
        if let Some(refused) = refused {
            return Err(CommandError::Refused {
                command: batch[0].clone(),
                answer: refused.to_owned(),
            });
        }
    }
    Ok(())
}

/// Why endpoint changes did not reach HAProxy.
#[derive(Debug, thiserror::Error)]
enum CommandError {
    /// The runtime API could not be reached.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// HAProxy refused a command of the batch.
    #[error("HAProxy refused a batch starting with {command:?}: {answer}")]
    Refused { command: String, answer: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_hold_a_hundred_commands_and_a_bounded_size() {
        let short: Vec<String> = (0..250)
            .map(|n| format!("set server b/s{n} weight 1"))
            .collect();
        let sizes: Vec<usize> = batches(&short).iter().map(|batch| batch.len()).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let long: Vec<String> = (0..5).map(|n| format!("{n}{}", "x".repeat(3000))).collect();
        let sizes: Vec<usize> = batches(&long).iter().map(|batch| batch.len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        let huge = vec!["y".repeat(MAX_BATCH_BYTES * 2)];
        assert_eq!(batches(&huge).len(), 1);
        assert!(batches(&[]).is_empty());
    }
}
