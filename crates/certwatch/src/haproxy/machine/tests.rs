//! The HAProxy machine without HAProxy: every certificate state against every event
//! (a table, row by row), each decision on its own, and random sequences of changes
//! and faults against invariants (proptest). The answers come from [`Sim`], a model of
//! HAProxy's CLI that answers as HAProxy 2.6 does (the markers
//! [`super::super::certs`] reads); the tests in `tests/haproxy*.rs` cover the driver
//! against a real HAProxy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube_common::backoff::BackoffPolicy;
use proptest::prelude::*;
use route_secrets::route::RouteKey;
use route_secrets::testing::{LeafSpec, Pki};
use route_secrets::tls::{TlsValidator, ValidatedTls};

use super::*;
use crate::cert_dir::bundle_digest;
use crate::haproxy::runtime::{Command, Reply};

const LIST: &str = "/crt-list";
const PREFIX: &str = "/l/";

/// Certificate materials: good ones, one HAProxy rejects, one too large for a request.
struct Material {
    good: Vec<Arc<ValidatedTls>>,
    bad: Arc<ValidatedTls>,
    large: Arc<ValidatedTls>,
}

fn material() -> &'static Material {
    static MATERIAL: OnceLock<Material> = OnceLock::new();
    MATERIAL.get_or_init(|| {
        let now = Timestamp::now();
        let pki = Pki::new(now);
        let validate = || {
            let secret = pki
                .issue(&LeafSpec::new("a.example", now))
                .secret("ns", "s");
            Arc::new(
                TlsValidator::default()
                    .validate_secret(&secret, None, now)
                    .expect("valid fixture"),
            )
        };
        let good: Vec<_> = (0..3).map(|_| validate()).collect();
        let bad = validate();
        let large = Arc::new(validate().with_ca_certificate(&pki.root_pem().repeat(40)));
        Material { good, bad, large }
    })
}

fn name(n: &str) -> String {
    format!("{PREFIX}{n}.pem")
}

fn entry(n: &str, tls: &Arc<ValidatedTls>, line: &str) -> CrtEntry {
    CrtEntry {
        route: RouteKey::new("ns", n),
        name: name(n),
        line: line.to_owned(),
        digest: bundle_digest(tls),
        tls: Arc::clone(tls),
    }
}

fn good(n: &str, material_index: usize) -> CrtEntry {
    entry(n, &material().good[material_index], &format!("{n}.example"))
}

/// HAProxy's CLI, as far as certificates and a crt-list go.
#[derive(Clone, Debug)]
struct Sim {
    instance: Instance,
    /// Committed stores: name → the bundle (`None`: empty).
    certs: BTreeMap<String, Option<String>>,
    /// The open transaction: name and bundle.
    transaction: Option<(String, String)>,
    /// The crt-list's lines: name and rest.
    lines: Vec<(String, String)>,
    /// Bundles whose key HAProxy does not take.
    bad: HashSet<String>,
    max_request: usize,
    /// Commands answered "currently locked" from now on.
    locked: usize,
    /// The connection breaks after this many answers of the next batch.
    break_after: Option<usize>,
    /// Whether the crt-list is in the configuration.
    has_list: bool,
}

impl Sim {
    fn new(pid: u32) -> Self {
        Self {
            instance: Instance {
                pid,
                started: i64::from(pid),
            },
            certs: BTreeMap::new(),
            transaction: None,
            lines: Vec::new(),
            bad: HashSet::from([material().bad.pem_bundle().expose_secret().to_owned()]),
            max_request: 16_383,
            locked: 0,
            break_after: None,
            has_list: true,
        }
    }

    /// A new process loading `files` (the cert directory): every file HAProxy can
    /// load, and its line.
    fn load(&self, pid: u32, files: &BTreeMap<String, CrtEntry>) -> Self {
        let mut next = Sim {
            certs: BTreeMap::new(),
            lines: Vec::new(),
            transaction: None,
            locked: 0,
            break_after: None,
            instance: Instance {
                pid,
                started: i64::from(pid),
            },
            ..self.clone()
        };
        for (name, entry) in files {
            let bundle = entry.tls.pem_bundle().expose_secret().to_owned();
            if self.bad.contains(&bundle) {
                continue;
            }
            next.certs.insert(name.clone(), Some(bundle));
            next.lines.push((name.clone(), entry.line.clone()));
        }
        next
    }

    fn execute(&mut self, commands: &[Command]) -> BatchOutcome {
        let connected = Connected {
            instance: self.instance,
            bufsize: self.max_request + 1,
            max_request: self.max_request,
        };
        let limit = self.break_after.take().unwrap_or(usize::MAX);
        let mut replies = Vec::new();
        for command in commands {
            if replies.len() >= limit {
                return BatchOutcome {
                    replies,
                    error: Some(RuntimeError::Closed {
                        socket: PathBuf::from("/sim"),
                        answered: limit,
                        command: command.line().to_owned(),
                    }),
                    connected: Some(connected),
                };
            }
            replies.push(Reply::new(self.answer(command)));
        }
        BatchOutcome {
            replies,
            error: None,
            connected: Some(connected),
        }
    }

    fn answer(&mut self, command: &Command) -> String {
        if self.locked > 0 {
            self.locked -= 1;
            return "Can't update the certificate! Operations on certificates are currently locked!\n"
                .to_owned();
        }
        let line = command.line();
        let payload = command.payload_text().unwrap_or_default().to_owned();
        let arg = |prefix: &str| line.strip_prefix(prefix).map(str::to_owned);
        if line == "show ssl cert" {
            let mut out = String::from("# transaction\n");
            if let Some((name, _)) = &self.transaction {
                out.push_str(&format!("*{name}\n"));
            }
            out.push_str("# filename\n/default.pem\n");
            for name in self.certs.keys() {
                out.push_str(&format!("{name}\n"));
            }
            return out;
        }
        if let Some(list) = arg("show ssl crt-list -n ") {
            if !self.has_list || list != LIST {
                return format!("didn't find the specified filename '{list}'\n");
            }
            let mut out = format!("# {LIST}\n");
            for (i, (name, rest)) in self.lines.iter().enumerate() {
                out.push_str(&format!("{name}:{} {rest}\n", i + 1));
            }
            return out;
        }
        if let Some(name) = arg("show ssl cert ") {
            return match self.certs.get(&name) {
                Some(Some(bundle)) => {
                    let der = crate::files::first_certificate_der(bundle).unwrap_or_default();
                    let sha1 = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &der);
                    let hex: String = sha1.as_ref().iter().map(|b| format!("{b:02X}")).collect();
                    format!("Filename: {name}\nSHA1 FingerPrint: {hex}\n")
                }
                Some(None) => format!("Filename: {name}\nStatus: Empty\n"),
                None => format!("certificate '{name}' not found\n"),
            };
        }
        if let Some(name) = arg("new ssl cert ") {
            if self.certs.contains_key(&name) {
                return format!("Certificate '{name}' already exists!\n");
            }
            self.certs.insert(name.clone(), None);
            return format!("New empty certificate store '{name}'!\n");
        }
        if let Some(name) = arg("set ssl cert ") {
            if let Some((open, _)) = &self.transaction
                && *open != name
            {
                return format!(
                    "The ongoing transaction is about '{open}' but you are trying to set '{name}'\n"
                );
            }
            if !self.certs.contains_key(&name) {
                return "Can't replace a certificate which is not referenced by the configuration!\n"
                    .to_owned();
            }
            if self.bad.contains(&payload) {
                return format!("unable to load the private key\nCan't update {name}!\n");
            }
            let created = self.transaction.is_none();
            self.transaction = Some((name.clone(), payload));
            return if created {
                format!("Transaction created for certificate {name}!\n")
            } else {
                format!("Transaction updated for certificate {name}!\n")
            };
        }
        if let Some(name) = arg("commit ssl cert ") {
            return match self.transaction.take() {
                Some((open, bundle)) if open == name => {
                    self.certs.insert(name.clone(), Some(bundle));
                    format!("Committing {name}\nSuccess!\n")
                }
                other => {
                    self.transaction = other;
                    "No ongoing transaction! !\n".to_owned()
                }
            };
        }
        if let Some(name) = arg("abort ssl cert ") {
            return match self.transaction.take() {
                Some((open, _)) if open == name => {
                    format!("Transaction aborted for certificate '{name}'!\n")
                }
                other => {
                    self.transaction = other;
                    "No ongoing transaction!\n".to_owned()
                }
            };
        }
        if arg(&format!("add ssl crt-list {LIST}")).is_some() {
            let (name, rest) = payload
                .trim()
                .split_once(' ')
                .unwrap_or((payload.trim(), ""));
            return match self.certs.get(name) {
                None => format!("certificate '{name}' does not exist!\n"),
                Some(None) => format!(
                    "Inserting certificate '{name}' in crt-list '{LIST}'.\nunable to load SSL certificate into SSL Context '{name}'.\nFailed!\n"
                ),
                Some(Some(_)) => {
                    self.lines.push((name.to_owned(), rest.to_owned()));
                    format!("Inserting certificate '{name}' in crt-list '{LIST}'.\nSuccess!\n")
                }
            };
        }
        if let Some(target) = arg(&format!("del ssl crt-list {LIST} ")) {
            let index = match target.rsplit_once(':') {
                Some((name, number)) => number
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .filter(|i| self.lines.get(*i).is_some_and(|(n, _)| n == name)),
                None => {
                    let found: Vec<usize> = (0..self.lines.len())
                        .filter(|i| self.lines[*i].0 == target)
                        .collect();
                    match found[..] {
                        [one] => Some(one),
                        _ => None,
                    }
                }
            };
            return match index {
                Some(i) => {
                    let (name, _) = self.lines.remove(i);
                    format!("Entry '{name}' deleted in crtlist '{LIST}'!\n")
                }
                None => format!("Can't find the entry '{target}'\n"),
            };
        }
        if let Some(name) = arg("del ssl cert ") {
            if self.lines.iter().any(|(n, _)| *n == name) {
                return format!("Can't remove the certificate: '{name}' is still in use!\n");
            }
            return match self.certs.remove(&name) {
                Some(_) => format!("Certificate '{name}' deleted!\n"),
                None => format!("Can't remove the certificate: '{name}' does not exist!\n"),
            };
        }
        format!("Unknown command: '{line}'\n")
    }

    /// Whether HAProxy serves `entry` as it is, on one line.
    fn serves(&self, entry: &CrtEntry) -> bool {
        let bundle = entry.tls.pem_bundle().expose_secret().to_owned();
        let lines: Vec<&String> = self
            .lines
            .iter()
            .filter(|(n, _)| *n == entry.name)
            .map(|(_, rest)| rest)
            .collect();
        self.certs.get(&entry.name) == Some(&Some(bundle)) && lines == [&entry.line]
    }

    /// Whether HAProxy holds nothing under `name`.
    fn lacks(&self, name: &str) -> bool {
        !self.certs.contains_key(name) && self.lines.iter().all(|(n, _)| n != name)
    }
}

/// Drives a machine as the controller does, against a [`Sim`]; remembers what it was
/// asked to do.
struct Rig {
    machine: Machine,
    sim: Sim,
    now: Instant,
    /// The persistent connection's process.
    connected: Option<Connected>,
    /// The cert directory: what the files hold.
    files: BTreeMap<String, CrtEntry>,
    /// Every action, in order.
    actions: Vec<Action>,
    /// Rejected certificates as the reports say.
    rejected: HashMap<String, [u8; 32]>,
    /// Starts and reloads asked for and not answered yet.
    start_asked: bool,
    reload_asked: Option<ReloadReason>,
    /// Answer starts and reloads at once (loading the files).
    auto_load: bool,
    next_pid: u32,
}

fn options() -> MachineOptions {
    MachineOptions {
        socket: PathBuf::from("/run/haproxy.sock"),
        list: LIST.to_owned(),
        prefix: PREFIX.to_owned(),
        managed: false,
        external_master: true,
        retry: BackoffPolicy::default(),
        check_interval: Duration::from_secs(5),
        batch_limit: 256,
        batch_bytes: 2 * 1024 * 1024,
        min_reload_interval: Duration::from_secs(5),
        refused: HashMap::new(),
        seed: 7,
    }
}

impl Rig {
    fn new(options: MachineOptions) -> Self {
        Self {
            machine: Machine::new(options),
            sim: Sim::new(100),
            now: Instant::now(),
            connected: None,
            files: BTreeMap::new(),
            actions: Vec::new(),
            rejected: HashMap::new(),
            start_asked: false,
            reload_asked: None,
            auto_load: true,
            next_pid: 101,
        }
    }

    /// An external HAProxy with a master CLI, serving `entries` after start-up.
    fn serving(entries: &[CrtEntry]) -> Self {
        let mut rig = Self::new(options());
        for entry in entries {
            rig.change(entry.clone());
        }
        rig.step(Event::ListingComplete);
        rig.settle();
        rig
    }

    fn step(&mut self, event: Event) {
        let mut queue: std::collections::VecDeque<Action> =
            self.machine.step(self.now, event).into();
        self.check_unserved();
        while let Some(action) = queue.pop_front() {
            let answer = self.perform(&action);
            self.actions.push(action);
            if let Some(answer) = answer {
                queue.extend(self.machine.step(self.now, answer));
                self.check_unserved();
            }
        }
    }

    /// The unserved count the machine keeps is the one a walk over what is pending
    /// finds.
    fn check_unserved(&self) {
        let m = &self.machine;
        let walked = m
            .pending
            .names()
            .chain(m.awaiting_reload.keys().map(String::as_str))
            .filter(|name| m.wanted.get(*name).is_some_and(|want| want.entry.is_some()))
            .count();
        assert_eq!(m.serving().unserved, walked, "the unserved count drifted");
    }

    fn perform(&mut self, action: &Action) -> Option<Event> {
        match action {
            Action::Execute(commands) => {
                let outcome = self.sim.execute(commands);
                if outcome.error.is_some() {
                    self.connected = None;
                } else {
                    self.connected = outcome.connected;
                }
                Some(Event::Answered(outcome))
            }
            Action::CheckIdentity => Some(Event::Identity {
                current: Ok(self.sim.instance),
                connected: self.connected,
            }),
            Action::Reconnect => {
                self.connected = None;
                None
            }
            Action::Start => {
                self.start_asked = true;
                None
            }
            Action::Reload(reason) => {
                self.reload_asked = Some(*reason);
                None
            }
            Action::CancelReload => {
                self.reload_asked = None;
                None
            }
            Action::Report(Report::Refused {
                name,
                digest,
                reason: RefusalReason::Rejected,
            }) => {
                self.rejected.insert(name.clone(), *digest);
                None
            }
            Action::Report(Report::RefusalLifted {
                name,
                reason: RefusalReason::Rejected,
            }) => {
                self.rejected.remove(name);
                None
            }
            Action::Report(_) | Action::Count(_) => None,
        }
    }

    /// The cert directory writes `entry` and publishes it.
    fn change(&mut self, entry: CrtEntry) {
        // A rejected certificate's line stays out of the crt-list file.
        self.files.insert(entry.name.clone(), entry.clone());
        self.step(Event::Changed {
            name: entry.name.clone(),
            entry: Some(entry),
            arrived: self.now,
        });
    }

    /// The cert directory writes `entry`'s bundle before start-up is complete and
    /// publishes its line as decided.
    fn decide(&mut self, entry: CrtEntry) {
        self.files.insert(entry.name.clone(), entry.clone());
        self.step(Event::Decided {
            name: entry.name.clone(),
            entry,
            arrived: self.now,
        });
    }

    /// The complete listing: every line of the files, then its end.
    fn complete(&mut self) {
        for entry in self.files.clone().into_values() {
            self.change(entry);
        }
        self.step(Event::ListingComplete);
    }

    fn remove(&mut self, n: &str) {
        self.files.remove(&name(n));
        self.step(Event::Changed {
            name: name(n),
            entry: None,
            arrived: self.now,
        });
    }

    /// Answers a start or reload asked for, loading the files.
    fn load(&mut self) {
        let pid = self.next_pid;
        self.next_pid += 1;
        let files: BTreeMap<String, CrtEntry> = self
            .files
            .iter()
            .filter(|(name, entry)| self.rejected.get(*name) != Some(&entry.digest))
            .map(|(name, entry)| (name.clone(), entry.clone()))
            .collect();
        let took = Duration::from_millis(300);
        if std::mem::take(&mut self.start_asked) {
            self.sim = self.sim.load(pid, &files);
            self.step(Event::Started(Ok(Loaded { worker: pid, took })));
        }
        if self.reload_asked.take().is_some() {
            self.sim = self.sim.load(pid, &files);
            self.step(Event::Reloaded(Ok(Loaded { worker: pid, took })));
        }
    }

    /// Gives the machine its turns, time passing to each wake, until it waits for
    /// nothing within a minute.
    fn settle(&mut self) {
        let until = self.now + Duration::from_secs(60);
        for _ in 0..500 {
            if self.auto_load && (self.start_asked || self.reload_asked.is_some()) {
                self.load();
            }
            self.step(Event::Timer);
            if self.auto_load && (self.start_asked || self.reload_asked.is_some()) {
                continue;
            }
            let Some(wake) = self.machine.next_wake(self.now) else {
                return;
            };
            let quiet = self.machine.pending.is_empty()
                && self.machine.reload_wanted.is_none()
                && self.machine.retry_at.is_none()
                && self.machine.known.as_ref().is_some_and(|k| !k.stale);
            if quiet || wake > until {
                return;
            }
            self.now = self.now.max(wake);
        }
        panic!("the machine did not settle");
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    fn executed(&self) -> Vec<String> {
        self.actions
            .iter()
            .filter_map(|action| match action {
                Action::Execute(commands) => Some(commands),
                _ => None,
            })
            .flatten()
            .map(|command| command.line().to_owned())
            .collect()
    }

    fn count(&self, wanted: impl Fn(&Count) -> bool) -> usize {
        self.actions
            .iter()
            .filter(|action| matches!(action, Action::Count(count) if wanted(count)))
            .count()
    }

    fn clear(&mut self) {
        self.actions.clear();
    }

    /// Where certificate `n` stands, in short.
    fn stands(&self, n: &str) -> &'static str {
        let m = &self.machine;
        let name = name(n);
        if !m.wanted.contains_key(&name) {
            return "gone";
        }
        if let Some(refusal) = m.refused.get(&name)
            && m.wanted[&name]
                .entry
                .as_ref()
                .is_some_and(|entry| entry.digest == refusal.digest)
        {
            return match refusal.reason {
                RefusalReason::Rejected => "rejected",
                RefusalReason::TooLarge => "refused, too large",
            };
        }
        if m.awaiting_reload.contains_key(&name) {
            return "awaiting reload";
        }
        if m.deferred.contains_key(&name) {
            return "deferred";
        }
        if m.pending.contains(&name) {
            return "pending";
        }
        "served"
    }

    /// What HAProxy holds of certificate `n`, against the files.
    fn holds(&self, n: &str) -> &'static str {
        match self.files.get(&name(n)) {
            Some(entry) if self.sim.serves(entry) => "as written",
            Some(_) if self.sim.lines.iter().any(|(l, _)| *l == name(n)) => "another version",
            Some(_) => "no line",
            None if self.sim.lacks(&name(n)) => "nothing",
            None => "leftovers",
        }
    }
}

// ----- the table -----------------------------------------------------------------

/// Where certificate `r` can stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Changed, not pushed yet.
    Pending,
    /// HAProxy holds it as written.
    Served,
    /// A step failed; waiting for its backoff.
    Deferred,
    /// HAProxy's certificate operations were locked; tried again shortly.
    Busy,
    /// HAProxy rejected its material.
    Rejected,
    /// Too large for the runtime API; waiting for a reload.
    AwaitingReload,
    /// Too large, and no reload possible: refused.
    TooLarge,
    /// Removed, and removed from HAProxy.
    Gone,
}

const STATES: [State; 8] = [
    State::Pending,
    State::Served,
    State::Deferred,
    State::Busy,
    State::Rejected,
    State::AwaitingReload,
    State::TooLarge,
    State::Gone,
];

/// What can happen to `r`, or around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Happening {
    /// New, good material.
    NewMaterial,
    /// The same entry published again.
    Same,
    /// The same material on another line (new options or filter).
    NewLine,
    /// Its line is removed.
    Removed,
    /// A minute passes.
    Minute,
    /// A resync is asked for.
    Resync,
    /// Someone restarts HAProxy on the files.
    Restart,
    /// A reload is requested (new configuration).
    ReloadRequest,
}

const HAPPENINGS: [Happening; 8] = [
    Happening::NewMaterial,
    Happening::Same,
    Happening::NewLine,
    Happening::Removed,
    Happening::Minute,
    Happening::Resync,
    Happening::Restart,
    Happening::ReloadRequest,
];

/// A rig in which `r` is in `state`, beside a served `h`.
fn in_state(state: State) -> Rig {
    let m = material();
    let mut rig = match state {
        State::TooLarge => {
            let mut rig = Rig::new(MachineOptions {
                external_master: false,
                ..options()
            });
            rig.change(good("h", 0));
            rig.step(Event::ListingComplete);
            rig.settle();
            rig
        }
        _ => Rig::serving(&[good("h", 0)]),
    };
    match state {
        State::Pending => rig.change(good("r", 0)),
        State::Served => {
            rig.change(good("r", 0));
            rig.settle();
        }
        State::Deferred => {
            // A store certwatch does not know of: `new` says it exists, knowledge
            // gone wrong.
            rig.change(good("r", 0));
            rig.sim.certs.insert(name("r"), None);
            rig.step(Event::Timer);
            assert_eq!(rig.stands("r"), "deferred", "{:?}", rig.executed());
        }
        State::Busy => {
            rig.change(good("r", 0));
            rig.sim.locked = 4;
            rig.step(Event::Timer);
        }
        State::Rejected => {
            rig.change(entry("r", &m.bad, "r.example"));
            rig.settle();
        }
        State::AwaitingReload | State::TooLarge => {
            rig.auto_load = false;
            rig.change(entry("r", &m.large, "r.example"));
            rig.settle();
            rig.auto_load = true;
        }
        State::Gone => {
            rig.change(good("r", 0));
            rig.settle();
            rig.remove("r");
            rig.settle();
        }
    }
    rig.clear();
    rig
}

fn meet(rig: &mut Rig, happening: Happening) {
    let m = material();
    let current = rig.files.get(&name("r")).cloned();
    match happening {
        Happening::NewMaterial => rig.change(good("r", 1)),
        Happening::Same => match current {
            Some(entry) => rig.change(entry),
            None => rig.remove("r"),
        },
        Happening::NewLine => {
            let tls = current.map_or_else(|| Arc::clone(&m.good[0]), |entry| entry.tls);
            rig.change(entry("r", &tls, "[alpn h2,http/1.1] r.example"));
        }
        Happening::Removed => rig.remove("r"),
        Happening::Minute => rig.advance(Duration::from_secs(60)),
        Happening::Resync => rig.step(Event::Resync),
        Happening::Restart => {
            let files: BTreeMap<String, CrtEntry> = rig
                .files
                .iter()
                .filter(|(name, entry)| rig.rejected.get(*name) != Some(&entry.digest))
                .map(|(name, entry)| (name.clone(), entry.clone()))
                .collect();
            let pid = rig.next_pid;
            rig.next_pid += 1;
            rig.sim = rig.sim.load(pid, &files);
            // The identity check notices it.
            rig.advance(Duration::from_secs(5));
        }
        Happening::ReloadRequest => rig.step(Event::ReloadRequested(ReloadReason::Routes)),
    }
    rig.settle();
}

/// `(state, happening, where r stands after, what HAProxy holds of r)`; `h` stays served
/// throughout.
type Row = (State, Happening, &'static str, &'static str);

#[rustfmt::skip]
const TABLE: &[Row] = {
    use Happening::*;
    use State::*;
    &[
        (Pending, NewMaterial, "served", "as written"),
        (Pending, Same, "served", "as written"),
        (Pending, NewLine, "served", "as written"),
        (Pending, Removed, "gone", "nothing"),
        (Pending, Minute, "served", "as written"),
        (Pending, Resync, "served", "as written"),
        (Pending, Restart, "served", "as written"),
        (Pending, ReloadRequest, "served", "as written"),

        (Served, NewMaterial, "served", "as written"),
        (Served, Same, "served", "as written"),
        (Served, NewLine, "served", "as written"),
        (Served, Removed, "gone", "nothing"),
        (Served, Minute, "served", "as written"),
        (Served, Resync, "served", "as written"),
        (Served, Restart, "served", "as written"),
        (Served, ReloadRequest, "served", "as written"),

        // The failed step waits for its backoff (under a minute), then goes again.
        (Deferred, NewMaterial, "served", "as written"),
        (Deferred, Same, "served", "as written"),
        (Deferred, NewLine, "served", "as written"),
        (Deferred, Removed, "gone", "nothing"),
        (Deferred, Minute, "served", "as written"),
        (Deferred, Resync, "served", "as written"),
        (Deferred, Restart, "served", "as written"),
        (Deferred, ReloadRequest, "served", "as written"),

        (Busy, NewMaterial, "served", "as written"),
        (Busy, Same, "served", "as written"),
        (Busy, NewLine, "served", "as written"),
        (Busy, Removed, "gone", "nothing"),
        (Busy, Minute, "served", "as written"),
        (Busy, Resync, "served", "as written"),
        (Busy, Restart, "served", "as written"),
        (Busy, ReloadRequest, "served", "as written"),

        // New material lifts the refusal.
        (Rejected, NewMaterial, "served", "as written"),
        // The same material stays refused: not pushed again.
        (Rejected, Same, "rejected", "no line"),
        (Rejected, NewLine, "rejected", "no line"),
        (Rejected, Removed, "gone", "nothing"),
        (Rejected, Minute, "rejected", "no line"),
        (Rejected, Resync, "rejected", "no line"),
        // The new process loaded the files without it.
        (Rejected, Restart, "rejected", "no line"),
        (Rejected, ReloadRequest, "rejected", "no line"),

        (AwaitingReload, NewMaterial, "served", "as written"),
        // The reload loads its file.
        (AwaitingReload, Same, "served", "as written"),
        (AwaitingReload, NewLine, "served", "as written"),
        (AwaitingReload, Removed, "gone", "nothing"),
        (AwaitingReload, Minute, "served", "as written"),
        (AwaitingReload, Resync, "served", "as written"),
        (AwaitingReload, Restart, "served", "as written"),
        (AwaitingReload, ReloadRequest, "served", "as written"),

        (TooLarge, NewMaterial, "served", "as written"),
        (TooLarge, Same, "refused, too large", "no line"),
        (TooLarge, NewLine, "refused, too large", "no line"),
        (TooLarge, Removed, "gone", "nothing"),
        (TooLarge, Minute, "refused, too large", "no line"),
        (TooLarge, Resync, "refused, too large", "no line"),
        // Loaded from its file by the new process: HAProxy holds it, as it is.
        (TooLarge, Restart, "served", "as written"),
        // No master CLI: the request is dropped.
        (TooLarge, ReloadRequest, "refused, too large", "no line"),

        (Gone, NewMaterial, "served", "as written"),
        (Gone, Same, "gone", "nothing"),
        (Gone, NewLine, "served", "as written"),
        (Gone, Removed, "gone", "nothing"),
        (Gone, Minute, "gone", "nothing"),
        (Gone, Resync, "gone", "nothing"),
        (Gone, Restart, "gone", "nothing"),
        (Gone, ReloadRequest, "gone", "nothing"),
    ]
};

#[test]
fn the_table_covers_every_state_and_happening() {
    for state in STATES {
        for happening in HAPPENINGS {
            let rows = TABLE
                .iter()
                .filter(|(s, h, ..)| *s == state && *h == happening)
                .count();
            assert_eq!(rows, 1, "{state:?} × {happening:?}");
        }
    }
}

#[test]
fn every_state_meets_every_happening() {
    let mut failures = Vec::new();
    for &(state, happening, stands, holds) in TABLE {
        let mut rig = in_state(state);
        meet(&mut rig, happening);
        let actual = (rig.stands("r"), rig.holds("r"), rig.holds("h"));
        let expected = (stands, holds, "as written");
        if actual != expected {
            failures.push(format!(
                "{state:?} × {happening:?}: expected {expected:?}, got {actual:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn each_state_is_what_it_says() {
    let stands: Vec<(State, &str)> = STATES
        .iter()
        .map(|state| (*state, in_state(*state).stands("r")))
        .collect();
    assert_eq!(
        stands,
        [
            (State::Pending, "pending"),
            (State::Served, "served"),
            (State::Deferred, "deferred"),
            (State::Busy, "deferred"),
            (State::Rejected, "rejected"),
            (State::AwaitingReload, "awaiting reload"),
            (State::TooLarge, "refused, too large"),
            (State::Gone, "gone"),
        ]
    );
}

// ----- decisions, one by one -----------------------------------------------------

/// The commands of each batch sent, by their first word pairs.
fn batches(rig: &Rig) -> Vec<Vec<String>> {
    rig.actions
        .iter()
        .filter_map(|action| match action {
            Action::Execute(commands) => Some(
                commands
                    .iter()
                    .map(|command| command.line().to_owned())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

#[test]
fn nothing_happens_before_the_listing_is_complete() {
    let mut rig = Rig::new(options());
    rig.change(good("a", 0));
    rig.step(Event::Timer);
    assert!(rig.actions.is_empty(), "{:?}", rig.actions);
    assert_eq!(rig.machine.next_wake(rig.now), None, "no turn without news");
    assert_eq!(rig.machine.status().state, HaproxyState::WaitingForFiles);
    assert!(!rig.machine.status().ready());
}

/// HAProxy holds `n` with material `material_index` on its plain line, as an earlier
/// run left it.
fn held_before(rig: &mut Rig, n: &str, material_index: usize) {
    let bundle = good(n, material_index)
        .tls
        .pem_bundle()
        .expose_secret()
        .to_owned();
    rig.sim.certs.insert(name(n), Some(bundle));
    rig.sim.lines.push((name(n), format!("{n}.example")));
}

/// The commands that remove or replace something: `del`, and `set ssl cert` of a name
/// HAProxy held.
fn removals_and_replacements(rig: &Rig, held: &[&str]) -> Vec<String> {
    rig.executed()
        .into_iter()
        .filter(|line| {
            line.starts_with("del ssl")
                || held
                    .iter()
                    .any(|n| *line == format!("set ssl cert {}", name(n)))
        })
        .collect()
}

#[test]
fn before_the_listing_only_adds_go_to_a_haproxy_run_by_others() {
    let mut rig = Rig::new(options());
    // An earlier run left a stray ("old") and an older version of "b".
    held_before(&mut rig, "old", 2);
    held_before(&mut rig, "b", 1);
    rig.decide(good("a", 0));
    rig.decide(good("b", 0));
    rig.settle();
    // a, which HAProxy held nothing of, is served; nothing was removed or replaced.
    assert!(rig.sim.serves(&good("a", 0)), "{:?}", rig.executed());
    assert!(
        rig.sim
            .serves(&entry("b", &material().good[1], "b.example"))
    );
    assert!(!rig.sim.lacks(&name("old")));
    assert_eq!(
        removals_and_replacements(&rig, &["old", "b"]),
        Vec::<String>::new()
    );
    let adds = rig
        .executed()
        .iter()
        .filter(|line| line.starts_with("add ssl crt-list"))
        .count();
    assert_eq!(adds, 1);
    let status = rig.machine.status();
    assert_eq!(status.state, HaproxyState::WaitingForFiles);
    assert!(!status.ready());

    // The complete listing: the replacement and the removal go now; a, served, needs
    // no command.
    rig.clear();
    rig.complete();
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)) && rig.sim.serves(&good("b", 0)));
    assert!(rig.sim.lacks(&name("old")));
    let executed = rig.executed();
    for expected in [
        format!("del ssl cert {}", name("old")),
        format!("set ssl cert {}", name("b")),
    ] {
        assert!(executed.contains(&expected), "{expected}: {executed:?}");
    }
    assert!(
        !executed.iter().any(|line| line.ends_with(&name("a"))),
        "{executed:?}"
    );
    let status = rig.machine.status();
    assert_eq!((status.startup_routes, status.startup_unserved), (2, 0));
    assert!(status.ready());
}

#[test]
fn a_route_decided_early_and_left_out_of_the_listing_is_removed_with_it() {
    let mut rig = Rig::new(options());
    rig.decide(good("a", 0));
    rig.decide(good("b", 0));
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)) && rig.sim.serves(&good("b", 0)));
    // a's route was removed before start-up was decided: the listing names b only.
    rig.files.remove(&name("a"));
    rig.clear();
    rig.complete();
    rig.settle();
    assert!(rig.sim.lacks(&name("a")), "{:?}", rig.sim);
    assert!(rig.sim.serves(&good("b", 0)));
    assert!(rig.machine.status().ready());
}

#[test]
fn a_managed_haproxy_gets_nothing_before_the_listing() {
    let mut rig = Rig::new(MachineOptions {
        managed: true,
        ..options()
    });
    rig.decide(good("a", 0));
    rig.step(Event::Timer);
    assert!(rig.actions.is_empty(), "{:?}", rig.actions);
    assert_eq!(rig.machine.next_wake(rig.now), None);
    rig.complete();
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)));
    let executed = rig.executed();
    assert!(
        !executed.iter().any(|line| line.starts_with("set ssl cert")),
        "loaded from the files: {executed:?}"
    );
}

#[test]
fn start_up_checks_reads_then_pushes_and_is_ready_once_served() {
    let mut rig = Rig::new(options());
    rig.change(good("a", 0));
    rig.change(good("b", 0));
    rig.step(Event::ListingComplete);
    assert_eq!(rig.machine.status().startup_routes, 2);
    assert_eq!(rig.machine.status().startup_unserved, 2);
    rig.step(Event::Timer);
    assert!(matches!(rig.actions[0], Action::CheckIdentity));
    let executed = rig.executed();
    assert_eq!(
        executed[..2],
        ["show ssl cert", "show ssl crt-list -n /crt-list"]
    );
    assert_eq!(
        executed
            .iter()
            .filter(|line| line.starts_with("commit ssl cert"))
            .count(),
        2
    );
    let status = rig.machine.status();
    assert_eq!(status.state, HaproxyState::Serving);
    assert_eq!((status.startup_unserved, status.unserved), (0, 0));
    assert!(status.ready());
    assert!(rig.sim.serves(&good("a", 0)) && rig.sim.serves(&good("b", 0)));
}

#[test]
fn batches_go_oldest_first_within_their_limits() {
    let mut rig = Rig::new(MachineOptions {
        batch_limit: 2,
        ..options()
    });
    rig.step(Event::ListingComplete);
    rig.settle();
    for (i, n) in ["e", "d", "c", "b", "a"].into_iter().enumerate() {
        rig.now += Duration::from_millis(i as u64);
        rig.change(good(n, 0));
    }
    rig.clear();
    rig.step(Event::Timer);
    let sent = batches(&rig);
    assert_eq!(sent.len(), 1, "one batch per turn");
    let committed: Vec<&String> = sent[0]
        .iter()
        .filter(|line| line.starts_with("commit"))
        .collect();
    assert_eq!(
        committed,
        [
            &format!("commit ssl cert {}", name("e")),
            &format!("commit ssl cert {}", name("d"))
        ]
    );
    assert_eq!(
        rig.machine.next_wake(rig.now),
        Some(rig.now),
        "more is due at once"
    );
    rig.settle();
    assert_eq!(batches(&rig).len(), 3);

    // A byte limit smaller than one certificate's commands: one certificate a batch.
    let mut rig = Rig::new(MachineOptions {
        batch_bytes: 1,
        ..options()
    });
    rig.step(Event::ListingComplete);
    rig.settle();
    rig.change(good("a", 0));
    rig.change(good("b", 0));
    rig.clear();
    rig.settle();
    assert_eq!(batches(&rig).len(), 2);
}

#[test]
fn a_failed_step_defers_its_certificate_alone() {
    let mut rig = Rig::serving(&[]);
    rig.change(good("a", 0));
    rig.change(good("b", 0));
    // `a` exists already unknown to certwatch: its `new` fails.
    rig.sim.certs.insert(name("a"), None);
    rig.clear();
    rig.step(Event::Timer);
    assert_eq!(rig.stands("a"), "deferred");
    assert_eq!(rig.stands("b"), "served");
    assert!(rig.machine.known.as_ref().is_some_and(|known| known.stale));
    let (_, due) = rig.machine.deferred[&name("a")];
    assert!(due > rig.now, "due after its backoff");
    // Read again on the next turn; HAProxy holds it as written after all.
    rig.settle();
    assert_eq!(rig.stands("a"), "served");
}

#[test]
fn a_busy_commit_is_aborted_first_and_retried_shortly() {
    let mut rig = Rig::serving(&[good("a", 0)]);
    rig.change(good("a", 1));
    rig.clear();
    // New material: `set`, then `commit`, which finds the operations locked.
    let outcome = {
        let batch = match rig.machine.step(rig.now, Event::Timer).pop() {
            Some(Action::Execute(commands)) => commands,
            other => panic!("{other:?}"),
        };
        assert_eq!(batch.len(), 2, "{batch:?}");
        let replies = vec![
            Reply::new(rig.sim.answer(&batch[0])),
            Reply::new("Can't commit! Operations on certificates are currently locked!\n"),
        ];
        BatchOutcome {
            replies,
            error: None,
            connected: rig.connected,
        }
    };
    rig.step(Event::Answered(outcome));
    assert_eq!(rig.stands("a"), "deferred");
    assert!(rig.machine.aborts.contains(&name("a")));
    let (_, due) = rig.machine.deferred[&name("a")];
    assert_eq!(due, rig.now + BUSY_RETRY);
    rig.clear();
    rig.advance(BUSY_RETRY);
    rig.step(Event::Timer);
    let sent = batches(&rig);
    assert_eq!(sent[0][0], format!("abort ssl cert {}", name("a")));
    assert_eq!(rig.stands("a"), "served");
    assert!(rig.sim.serves(&good("a", 1)));
}

#[test]
fn a_rejected_certificate_is_reported_and_lifted_by_new_material() {
    let m = material();
    let mut rig = Rig::serving(&[good("h", 0)]);
    let bad = entry("r", &m.bad, "r.example");
    rig.change(bad.clone());
    rig.settle();
    assert_eq!(rig.rejected.get(&name("r")), Some(&bad.digest));
    assert_eq!(
        rig.count(|c| *c == Count::Refused(RefusalReason::Rejected)),
        1
    );
    let status = rig.machine.status();
    assert_eq!((status.refused, status.unserved), (1, 0));
    assert!(status.ready(), "a refusal does not hold readiness");
    // Nothing more is tried while the material stays.
    rig.clear();
    rig.advance(Duration::from_secs(60));
    rig.settle();
    assert!(
        !rig.executed()
            .iter()
            .any(|line| line.starts_with("set ssl cert"))
    );
    // New material lifts the refusal and is served.
    rig.change(good("r", 0));
    assert!(rig.rejected.is_empty());
    rig.settle();
    assert_eq!(rig.stands("r"), "served");
    assert_eq!(rig.machine.status().refused, 0);
}

#[test]
fn refusals_of_an_earlier_run_hold_from_the_start() {
    let m = material();
    let bad = entry("r", &m.bad, "r.example");
    let mut rig = Rig::new(MachineOptions {
        refused: HashMap::from([(name("r"), bad.digest)]),
        ..options()
    });
    rig.change(bad);
    rig.step(Event::ListingComplete);
    rig.settle();
    assert_eq!(rig.stands("r"), "rejected");
    // Its line was left out of the crt-list: that is no change of material.
    rig.step(Event::Changed {
        name: name("r"),
        entry: None,
        arrived: rig.now,
    });
    assert!(rig.machine.refused.contains_key(&name("r")));
}

#[test]
fn a_bundle_too_large_waits_for_a_reload_that_loads_its_file() {
    let m = material();
    let mut rig = Rig::serving(&[good("h", 0)]);
    rig.auto_load = false;
    rig.clear();
    rig.change(entry("r", &m.large, "r.example"));
    rig.settle();
    assert_eq!(rig.reload_asked, Some(ReloadReason::TooLarge));
    assert_eq!(
        rig.count(|c| *c == Count::Refused(RefusalReason::TooLarge)),
        1
    );
    assert_eq!(rig.stands("r"), "awaiting reload");
    assert_eq!(rig.machine.status().unserved, 1);
    assert!(rig.machine.status().reloading);
    rig.load();
    rig.settle();
    assert_eq!(rig.stands("r"), "served");
    // The new worker holds what did not change since the reload began: no
    // certificate is asked one by one.
    assert!(
        !rig.executed()
            .iter()
            .any(|line| line.starts_with("show ssl cert /"))
    );
    assert_eq!(rig.machine.status().loads, 1);
}

#[test]
fn a_bundle_too_large_without_a_master_is_refused() {
    let m = material();
    let mut rig = Rig::new(MachineOptions {
        external_master: false,
        ..options()
    });
    rig.step(Event::ListingComplete);
    rig.settle();
    rig.change(entry("r", &m.large, "r.example"));
    rig.settle();
    assert_eq!(rig.stands("r"), "refused, too large");
    assert!(rig.reload_asked.is_none());
    assert!(rig.rejected.is_empty(), "its line may stay in the files");
    assert!(rig.actions.iter().any(|action| matches!(
        action,
        Action::Report(Report::Refused {
            reason: RefusalReason::TooLarge,
            ..
        })
    )));
}

#[test]
fn a_bundle_refused_before_the_listing_is_refused_once() {
    let m = material();
    let mut rig = Rig::new(MachineOptions {
        external_master: false,
        ..options()
    });
    rig.decide(good("a", 0));
    rig.decide(entry("r", &m.large, "r.example"));
    rig.settle();
    assert_eq!(rig.stands("r"), "refused, too large");
    // The complete listing names the same material again: not offered again.
    rig.complete();
    rig.settle();
    assert_eq!(rig.stands("r"), "refused, too large");
    assert_eq!(
        rig.count(|c| *c == Count::Refused(RefusalReason::TooLarge)),
        1
    );
    assert!(rig.sim.serves(&good("a", 0)));
    let status = rig.machine.status();
    assert_eq!((status.startup_routes, status.refused), (1, 1));
    assert!(status.ready(), "a refusal does not hold readiness");
}

#[test]
fn reloads_coalesce_and_keep_their_least_interval() {
    let mut rig = Rig::serving(&[good("a", 0)]);
    rig.auto_load = false;
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.step(Event::Timer);
    assert_eq!(
        rig.actions
            .iter()
            .filter(|a| matches!(a, Action::Reload(_)))
            .count(),
        1
    );
    rig.load();
    rig.clear();
    // Another request at once waits for the interval.
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.step(Event::Timer);
    assert!(!rig.actions.iter().any(|a| matches!(a, Action::Reload(_))));
    let wake = rig.machine.next_wake(rig.now).expect("a wake");
    assert!(wake <= rig.now + Duration::from_secs(5));
    rig.now += Duration::from_secs(5);
    rig.step(Event::Timer);
    assert!(
        rig.actions
            .iter()
            .any(|a| matches!(a, Action::Reload(ReloadReason::Routes)))
    );
}

#[test]
fn a_reload_without_a_master_is_dropped() {
    let mut rig = Rig::new(MachineOptions {
        external_master: false,
        ..options()
    });
    rig.step(Event::ListingComplete);
    rig.settle();
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.settle();
    assert!(rig.reload_asked.is_none());
    assert!(rig.machine.reload_wanted.is_none());
}

#[test]
fn a_failed_reload_is_tried_again_for_what_waits_for_it() {
    let m = material();
    let mut rig = Rig::serving(&[]);
    rig.auto_load = false;
    rig.change(entry("r", &m.large, "r.example"));
    rig.settle();
    assert!(rig.reload_asked.take().is_some());
    rig.step(Event::Reloaded(Err(ProcessError::Task {
        what: "reload",
        source: join_error(),
    })));
    assert_eq!(rig.machine.reload_wanted, Some(ReloadReason::TooLarge));
    assert_eq!(rig.stands("r"), "awaiting reload");
}

/// A join error, as an aborted task gives.
fn join_error() -> tokio::task::JoinError {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let task = tokio::spawn(std::future::pending::<()>());
        task.abort();
        task.await.expect_err("aborted")
    })
}

#[test]
fn a_backlog_longer_than_a_load_is_loaded_by_a_reload() {
    let mut rig = Rig::serving(&[]);
    rig.auto_load = false;
    rig.machine.push_rate = Some(100.0);
    rig.machine.load_time = Some(Duration::from_secs(2));
    for i in 0..1_001 {
        rig.machine
            .pending
            .insert_if_absent(&format!("{PREFIX}{i}"), rig.now, false);
    }
    rig.step(Event::Timer);
    assert_eq!(rig.reload_asked, Some(ReloadReason::Backlog));
    // Fast enough: pushed instead.
    let mut rig = Rig::serving(&[]);
    rig.auto_load = false;
    rig.machine.push_rate = Some(10_000.0);
    rig.machine.load_time = Some(Duration::from_secs(2));
    for i in 0..1_001 {
        rig.machine
            .pending
            .insert_if_absent(&format!("{PREFIX}{i}"), rig.now, false);
    }
    rig.step(Event::Timer);
    assert_eq!(rig.reload_asked, None);
}

#[test]
fn a_managed_haproxy_is_started_on_the_files_and_known_without_asking() {
    let mut rig = Rig::new(MachineOptions {
        managed: true,
        external_master: false,
        ..options()
    });
    rig.auto_load = false;
    rig.change(good("a", 0));
    rig.change(good("b", 0));
    rig.step(Event::ListingComplete);
    rig.step(Event::Timer);
    assert!(rig.start_asked);
    assert_eq!(rig.machine.status().state, HaproxyState::Starting);
    // A change while it starts: the new worker may have loaded the older file.
    rig.change(good("a", 1));
    rig.files.insert(name("a"), good("a", 0));
    rig.step(Event::Timer);
    assert!(
        rig.executed().is_empty(),
        "nothing reaches HAProxy while it starts"
    );
    rig.clear();
    rig.load();
    rig.files.insert(name("a"), good("a", 1));
    assert!(matches!(
        rig.actions.iter().find(|a| !matches!(a, Action::Count(_))),
        Some(Action::Reconnect)
    ));
    rig.settle();
    assert!(rig.sim.serves(&good("a", 1)));
    assert!(rig.sim.serves(&good("b", 0)));
    // b, unchanged since the start began, is known; a, changed once to another leaf,
    // is asked (the worker read the older file: then pushed).
    assert_eq!(commands_for(&rig, "show ssl cert", "b"), 0);
    assert_eq!(commands_for(&rig, "show ssl cert", "a"), 1);
    assert_eq!(commands_for(&rig, "set ssl cert", "a"), 1);
    assert!(rig.machine.status().ready());
    // Reloads go through the master it started.
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.advance(Duration::from_secs(5));
    rig.step(Event::Timer);
    assert!(rig.reload_asked.is_some());
}

#[test]
fn a_failed_start_is_tried_again_after_the_backoff() {
    let mut rig = Rig::new(MachineOptions {
        managed: true,
        ..options()
    });
    rig.auto_load = false;
    rig.step(Event::ListingComplete);
    rig.step(Event::Timer);
    assert!(std::mem::take(&mut rig.start_asked));
    rig.step(Event::Started(Err(ProcessError::Task {
        what: "start",
        source: join_error(),
    })));
    assert_eq!(rig.machine.status().state, HaproxyState::Down);
    assert_eq!(
        rig.count(|c| matches!(c, Count::Loaded { ok: false, .. })),
        1
    );
    rig.step(Event::Timer);
    assert!(!rig.start_asked, "not before the backoff");
    let wake = rig.machine.next_wake(rig.now).expect("a retry");
    rig.now = wake;
    rig.step(Event::Timer);
    assert!(rig.start_asked);
}

#[test]
fn an_exited_haproxy_is_started_again_and_its_reload_dropped() {
    let mut rig = Rig::new(MachineOptions {
        managed: true,
        ..options()
    });
    rig.change(good("a", 0));
    rig.step(Event::ListingComplete);
    rig.settle();
    assert!(rig.machine.status().ready());
    rig.auto_load = false;
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.advance(Duration::from_secs(5));
    rig.step(Event::Timer);
    assert!(rig.reload_asked.is_some());
    rig.clear();
    rig.step(Event::Exited);
    assert!(rig.actions.contains(&Action::CancelReload));
    assert!(rig.actions.contains(&Action::Count(Count::Up(false))));
    assert!(!rig.machine.status().ready());
    rig.auto_load = true;
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)));
    assert_eq!(rig.machine.status().loads, 2);
}

/// The runtime API commands executed that name certificate `n`, by their verb.
fn commands_for(rig: &Rig, verb: &str, n: &str) -> usize {
    let wanted = format!("{verb} {}", name(n));
    rig.executed()
        .iter()
        .filter(|line| line.starts_with(&wanted))
        .count()
}

/// The `set ssl cert` commands executed.
fn pushes(rig: &Rig) -> usize {
    rig.executed()
        .iter()
        .filter(|line| line.starts_with("set ssl cert"))
        .count()
}

#[test]
fn a_backlog_reload_leaves_the_old_worker_nothing_but_removals() {
    let names: Vec<String> = (0..=BACKLOG_RELOAD_MIN).map(|i| format!("x{i}")).collect();
    let mut served: Vec<CrtEntry> = names.iter().map(|n| good(n, 0)).collect();
    served.extend([good("a", 0), good("b", 0)]);
    let mut rig = Rig::serving(&served);
    rig.auto_load = false;
    rig.machine.push_rate = Some(100.0);
    rig.machine.load_time = Some(Duration::from_secs(2));
    // A re-issue: more than HAProxy loads faster than it takes them.
    for n in &names {
        rig.change(good(n, 1));
    }
    rig.clear();
    rig.step(Event::Timer);
    assert_eq!(rig.reload_asked, Some(ReloadReason::Backlog));
    // While the new worker loads: replacements wait for it, a removal goes at once.
    rig.change(good("a", 1));
    rig.remove("b");
    rig.advance(Duration::from_secs(1));
    rig.step(Event::Timer);
    assert_eq!(pushes(&rig), 0, "{:?}", rig.executed());
    assert_eq!(
        commands_for(&rig, "del ssl cert", "b"),
        1,
        "{:?}",
        rig.executed()
    );
    assert_eq!(rig.stands("a"), "pending");
    // The new worker read the new files: a asked, nothing pushed.
    rig.load();
    rig.settle();
    for n in names.iter().map(String::as_str).chain(["a"]) {
        assert_eq!(rig.stands(n), "served", "{n}");
        assert_eq!(rig.holds(n), "as written", "{n}");
    }
    assert_eq!(rig.holds("b"), "nothing");
    assert_eq!(commands_for(&rig, "show ssl cert", "a"), 1);
    assert_eq!(pushes(&rig), 0, "{:?}", rig.executed());
}

#[test]
fn a_small_backlog_still_reaches_the_old_worker_during_a_reload() {
    let mut rig = Rig::serving(&[good("a", 0)]);
    rig.auto_load = false;
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.step(Event::Timer);
    assert_eq!(rig.reload_asked, Some(ReloadReason::Routes));
    rig.clear();
    rig.change(good("a", 1));
    rig.step(Event::Timer);
    assert_eq!(
        commands_for(&rig, "set ssl cert", "a"),
        1,
        "{:?}",
        rig.executed()
    );
    assert_eq!(rig.holds("a"), "as written");
}

/// A rig serving `a`, `b`, `c`, `d` whose reload has begun (not answered yet), with
/// the files as they were when it began.
fn reloading_rig() -> (Rig, BTreeMap<String, CrtEntry>) {
    let mut rig = Rig::serving(&[good("a", 0), good("b", 0), good("c", 0), good("d", 0)]);
    rig.auto_load = false;
    rig.step(Event::ReloadRequested(ReloadReason::Routes));
    rig.step(Event::Timer);
    assert_eq!(rig.reload_asked.take(), Some(ReloadReason::Routes));
    let before = rig.files.clone();
    (rig, before)
}

/// The reload ends with a new worker that loaded `files`.
fn reloaded_with(rig: &mut Rig, files: &BTreeMap<String, CrtEntry>) {
    rig.sim = rig.sim.load(300, files);
    rig.clear();
    rig.step(Event::Reloaded(Ok(Loaded {
        worker: 300,
        took: Duration::from_millis(300),
    })));
    rig.settle();
}

/// Changes while the reload runs, before the machine's next turn (so the old worker
/// gets none of them, as when they are held for a backlog): `a` once to another leaf, `b` twice, `c` to another line with
/// the same leaf, `e` added.
fn change_while_reloading(rig: &mut Rig) {
    rig.change(good("a", 1));
    rig.change(good("b", 1));
    rig.change(good("b", 2));
    rig.change(entry("c", &material().good[0], "c.example other.example"));
    rig.change(good("e", 0));
}

/// A reload during [`change_while_reloading`]'s changes, its new worker having read
/// the files after them (`read_after`) or before them; every certificate served at
/// the end, as written.
fn reloaded_after_changes(read_after: bool) -> Rig {
    let (mut rig, before) = reloading_rig();
    change_while_reloading(&mut rig);
    let read = if read_after {
        rig.files.clone()
    } else {
        before
    };
    reloaded_with(&mut rig, &read);
    for n in ["a", "b", "c", "d", "e"] {
        assert_eq!(rig.stands(n), "served", "{n}");
        assert_eq!(rig.holds(n), "as written", "{n}");
    }
    rig
}

#[test]
fn after_a_reload_what_changed_once_meanwhile_is_asked_and_pushed_only_if_old() {
    let rig = reloaded_after_changes(true);
    // a and e told by their leaves: asked, not pushed; d unchanged: neither.
    assert_eq!(commands_for(&rig, "show ssl cert", "a"), 1);
    assert_eq!(commands_for(&rig, "set ssl cert", "a"), 0);
    assert_eq!(commands_for(&rig, "show ssl cert", "e"), 1);
    assert_eq!(commands_for(&rig, "set ssl cert", "e"), 0);
    assert_eq!(commands_for(&rig, "show ssl cert", "d"), 0);
    // b (twice) cannot be told by its leaf: pushed again.
    assert_eq!(commands_for(&rig, "show ssl cert", "b"), 0);
    assert_eq!(commands_for(&rig, "set ssl cert", "b"), 1);

    // The new worker read every file before the changes: a and e asked, then pushed.
    let rig = reloaded_after_changes(false);
    assert_eq!(commands_for(&rig, "show ssl cert", "a"), 1);
    assert_eq!(commands_for(&rig, "set ssl cert", "a"), 1);
    assert_eq!(commands_for(&rig, "set ssl cert", "e"), 1);
}

#[test]
fn a_change_after_the_reload_ended_is_pushed_not_told_by_its_leaf() {
    let (mut rig, _) = reloading_rig();
    change_while_reloading(&mut rig);
    let during = rig.files.clone();
    // The reload ends (the worker read the changes), and before the worker is read, a
    // changes again: a version the worker cannot hold, whatever its leaf says.
    rig.sim = rig.sim.load(300, &during);
    rig.step(Event::Reloaded(Ok(Loaded {
        worker: 300,
        took: Duration::from_millis(300),
    })));
    rig.change(good("a", 2));
    rig.clear();
    rig.settle();
    assert_eq!(rig.stands("a"), "served");
    assert_eq!(rig.holds("a"), "as written");
    assert_eq!(commands_for(&rig, "show ssl cert", "a"), 0);
    assert_eq!(commands_for(&rig, "set ssl cert", "a"), 1);
}

#[test]
fn another_process_is_noticed_and_read_certificate_by_certificate() {
    let mut rig = Rig::serving(&[good("a", 0)]);
    rig.sim = rig.sim.load(200, &rig.files.clone());
    rig.clear();
    rig.advance(Duration::from_secs(5));
    rig.settle();
    assert!(rig.actions.contains(&Action::Reconnect));
    assert!(
        rig.executed()
            .contains(&format!("show ssl cert {}", name("a")))
    );
    assert_eq!(rig.machine.status().worker, Some(200));
    assert_eq!(rig.stands("a"), "served");
    assert!(
        !rig.executed()
            .iter()
            .any(|line| line.starts_with("set ssl cert")),
        "held: not pushed"
    );
}

#[test]
fn an_answer_from_another_process_voids_what_is_known() {
    let mut rig = Rig::serving(&[good("a", 0)]);
    rig.change(good("a", 1));
    rig.sim.instance.pid = 300;
    rig.clear();
    rig.step(Event::Timer);
    assert!(rig.machine.known.is_none());
    assert_eq!(rig.machine.status().state, HaproxyState::Down);
    assert_eq!(rig.count(|c| *c == Count::SyncFailed), 1);
    rig.settle();
    assert!(rig.sim.serves(&good("a", 1)));
}

#[test]
fn a_broken_batch_makes_the_knowledge_stale() {
    let mut rig = Rig::serving(&[]);
    rig.change(good("a", 0));
    rig.change(good("b", 0));
    rig.sim.break_after = Some(3);
    rig.clear();
    rig.step(Event::Timer);
    assert!(rig.machine.known.as_ref().is_some_and(|known| known.stale));
    assert!(!rig.machine.up());
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)) && rig.sim.serves(&good("b", 0)));
}

#[test]
fn a_locked_reading_is_asked_again_shortly() {
    let mut rig = Rig::new(options());
    rig.step(Event::ListingComplete);
    rig.sim.locked = 2;
    rig.step(Event::Timer);
    assert_eq!(rig.machine.retry_at, Some(rig.now + BUSY_RETRY));
    assert!(rig.machine.known.is_none());
    assert_eq!(rig.count(|c| *c == Count::SyncFailed), 0, "no failure");
    rig.settle();
    assert!(rig.machine.known.is_some());
}

#[test]
fn a_crt_list_haproxy_does_not_load_is_a_failure() {
    let mut rig = Rig::new(options());
    rig.sim.has_list = false;
    rig.step(Event::ListingComplete);
    rig.step(Event::Timer);
    assert_eq!(rig.machine.status().state, HaproxyState::Down);
    assert!(rig.machine.retry_at.is_some());
}

#[test]
fn strays_and_open_transactions_of_certwatch_are_cleaned_up() {
    let mut rig = Rig::new(options());
    rig.sim.certs.insert(name("old"), Some("x".to_owned()));
    rig.sim.lines.push((name("old"), "old.example".to_owned()));
    rig.sim
        .certs
        .insert("/other.pem".to_owned(), Some("y".to_owned()));
    rig.sim.transaction = Some((name("t"), "z".to_owned()));
    rig.step(Event::ListingComplete);
    rig.settle();
    let executed = rig.executed();
    assert!(executed.contains(&format!("abort ssl cert {}", name("t"))));
    assert!(rig.sim.lacks(&name("old")));
    assert!(rig.sim.certs.contains_key("/other.pem"), "not certwatch's");
    assert!(rig.sim.transaction.is_none());
}

#[test]
fn duplicate_lines_go_highest_number_first() {
    let mut rig = Rig::new(options());
    rig.sim.certs.insert(
        name("a"),
        Some(good("a", 0).tls.pem_bundle().expose_secret().to_owned()),
    );
    rig.sim.lines.push((name("a"), "a.example".to_owned()));
    rig.sim.lines.push((name("a"), "a.example".to_owned()));
    rig.change(good("a", 0));
    rig.step(Event::ListingComplete);
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)), "{:?}", rig.sim.lines);
    let deletes: Vec<String> = rig
        .executed()
        .into_iter()
        .filter(|line| line.starts_with("del ssl crt-list"))
        .collect();
    assert_eq!(
        deletes,
        [
            format!("del ssl crt-list {LIST} {}:2", name("a")),
            format!("del ssl crt-list {LIST} {}:1", name("a")),
        ]
    );
}

#[test]
fn a_resync_reads_haproxy_again() {
    let mut rig = Rig::serving(&[good("a", 0)]);
    // Someone removed the line behind certwatch's back.
    rig.sim.lines.clear();
    rig.step(Event::Resync);
    rig.settle();
    assert!(rig.sim.serves(&good("a", 0)));
}

#[test]
fn closing_pushes_what_is_pending_once() {
    let mut rig = Rig::serving(&[]);
    rig.change(good("a", 0));
    rig.clear();
    rig.step(Event::Closing);
    assert_eq!(batches(&rig).len(), 1);
    assert!(rig.sim.serves(&good("a", 0)));
    rig.clear();
    rig.change(good("b", 0));
    rig.step(Event::Timer);
    assert!(rig.actions.is_empty(), "nothing after closing");
}

#[test]
fn a_missing_socket_before_the_first_answer_is_a_start() {
    let missing = Failure::Runtime(RuntimeError::Connect {
        socket: PathBuf::from("/run/haproxy.sock"),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    });
    assert!(missing.socket_missing());
    let refused = Failure::Runtime(RuntimeError::Connect {
        socket: PathBuf::from("/run/haproxy.sock"),
        source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
    });
    assert!(!refused.socket_missing());
}

// ----- random sequences ----------------------------------------------------------

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// Something that happens to the cert directory or to HAProxy.
#[derive(Clone, Debug)]
enum Move {
    /// Certificate `name` gets material `material` (3: rejected, 4: too large) on
    /// line `line`.
    Write {
        name: usize,
        material: usize,
        line: usize,
    },
    Remove(usize),
    /// HAProxy's certificate operations are locked for the next commands.
    Lock(usize),
    /// The connection breaks after a few answers of the next batch.
    Break(usize),
    /// Someone restarts HAProxy on the files.
    Restart,
    Resync,
    Reload,
    /// Time passes (milliseconds).
    Wait(u64),
    /// The machine's turn.
    Turn,
}

fn a_move() -> impl Strategy<Value = Move> {
    prop_oneof![
        6 => (0..NAMES.len(), 0..5usize, 0..2usize)
            .prop_map(|(name, material, line)| Move::Write { name, material, line }),
        2 => (0..NAMES.len()).prop_map(Move::Remove),
        1 => (1..4usize).prop_map(Move::Lock),
        1 => (0..6usize).prop_map(Move::Break),
        1 => Just(Move::Restart),
        1 => Just(Move::Resync),
        1 => Just(Move::Reload),
        3 => (0..3_000u64).prop_map(Move::Wait),
        6 => Just(Move::Turn),
    ]
}

fn written(name: usize, material_index: usize, line: usize) -> CrtEntry {
    let m = material();
    let n = NAMES[name];
    let tls = match material_index {
        0..=2 => Arc::clone(&m.good[material_index]),
        3 => Arc::clone(&m.bad),
        _ => Arc::clone(&m.large),
    };
    let line = match line {
        0 => format!("{n}.example"),
        _ => format!("[alpn h2,http/1.1] {n}.example"),
    };
    entry(n, &tls, &line)
}

fn play(rig: &mut Rig, moves: &[Move]) {
    for next in moves {
        match next {
            Move::Write {
                name,
                material,
                line,
            } => rig.change(written(*name, *material, *line)),
            Move::Remove(name) => rig.remove(NAMES[*name]),
            Move::Lock(commands) => rig.sim.locked = *commands,
            Move::Break(after) => rig.sim.break_after = Some(*after),
            Move::Restart => {
                let files: BTreeMap<String, CrtEntry> = rig
                    .files
                    .iter()
                    .filter(|(name, entry)| rig.rejected.get(*name) != Some(&entry.digest))
                    .map(|(name, entry)| (name.clone(), entry.clone()))
                    .collect();
                let pid = rig.next_pid;
                rig.next_pid += 1;
                rig.sim = rig.sim.load(pid, &files);
            }
            Move::Resync => rig.step(Event::Resync),
            Move::Reload => rig.step(Event::ReloadRequested(ReloadReason::Routes)),
            Move::Wait(ms) => rig.advance(Duration::from_millis(*ms)),
            Move::Turn => {
                if rig.start_asked || rig.reload_asked.is_some() {
                    rig.load();
                }
                rig.step(Event::Timer);
            }
        }
    }
}

/// After any sequence, once faults stop and time passes, HAProxy holds every
/// certificate as written, except refused material, and holds nothing certwatch
/// removed; the machine's reports and figures agree.
fn settles_to_the_files(managed: bool, moves: &[Move]) -> Result<(), TestCaseError> {
    let mut rig = Rig::new(MachineOptions {
        managed,
        ..options()
    });
    rig.change(written(0, 0, 0));
    rig.step(Event::ListingComplete);
    play(&mut rig, moves);
    settled(rig)
}

/// Once faults stop and time passes, HAProxy holds every certificate as written,
/// except refused material, and holds nothing certwatch removed; the machine's reports
/// and figures agree.
fn settled(mut rig: Rig) -> Result<(), TestCaseError> {
    rig.sim.locked = 0;
    rig.sim.break_after = None;
    // A restart is noticed at the next identity check.
    rig.advance(Duration::from_secs(60));
    for _ in 0..3 {
        rig.settle();
        rig.advance(Duration::from_secs(60));
    }
    rig.settle();
    let bad = material().bad.pem_bundle().expose_secret().to_owned();
    for n in NAMES {
        let name = name(n);
        match rig.files.get(&name) {
            Some(entry) if *entry.tls.pem_bundle().expose_secret() == *bad => {
                prop_assert_eq!(
                    rig.rejected.get(&name),
                    Some(&entry.digest),
                    "{} reported",
                    n
                );
                prop_assert_eq!(rig.stands(n), "rejected");
                prop_assert!(
                    rig.sim.certs.get(&name) != Some(&Some(bad.clone())),
                    "{} rejected material held",
                    n
                );
            }
            Some(entry) => {
                prop_assert!(
                    rig.sim.serves(entry),
                    "{} not served: {:?}",
                    n,
                    rig.sim.lines
                );
                prop_assert_eq!(rig.stands(n), "served");
                prop_assert!(!rig.rejected.contains_key(&name));
            }
            // A rejected certificate's line leaves the files because of the refusal:
            // a removal does not lift it.
            None => prop_assert!(rig.sim.lacks(&name), "{} left in HAProxy", n),
        }
    }
    let status = rig.machine.status();
    prop_assert_eq!(status.state, HaproxyState::Serving);
    prop_assert_eq!(status.unserved, 0);
    prop_assert!(status.ready());
    prop_assert!(rig.sim.transaction.is_none(), "a transaction left open");
    let rejected: HashMap<String, [u8; 32]> = rig
        .machine
        .refused
        .iter()
        .filter(|(_, refusal)| refusal.reason == RefusalReason::Rejected)
        .map(|(name, refusal)| (name.clone(), refusal.digest))
        .collect();
    prop_assert_eq!(rejected, rig.rejected.clone());
    Ok(())
}

/// Before the complete listing, with routes decided in any order and HAProxy
/// failing as it may, a HAProxy run by others loses nothing it held (no `del`, no
/// `set` of a name it held: "c" and "d" were left by an earlier run); after it, the
/// machine settles to the files as always.
fn adds_only_until_the_listing(early: &[Move], after: &[Move]) -> Result<(), TestCaseError> {
    let mut rig = Rig::new(options());
    held_before(&mut rig, "c", 2);
    held_before(&mut rig, "d", 2);
    for next in early {
        match next {
            Move::Write {
                name,
                material,
                line,
            } => rig.decide(written(*name, *material, *line)),
            // Nothing is removed from the files and no reload loads them before
            // start-up is decided.
            Move::Remove(_) | Move::Restart | Move::Reload => rig.step(Event::Timer),
            other => play(&mut rig, std::slice::from_ref(other)),
        }
    }
    rig.sim.locked = 0;
    rig.sim.break_after = None;
    rig.advance(Duration::from_secs(60));
    rig.settle();
    prop_assert_eq!(
        removals_and_replacements(&rig, &["c", "d"]),
        Vec::<String>::new()
    );
    prop_assert!(!rig.sim.lacks(&name("c")) && !rig.sim.lacks(&name("d")));
    // A refused material's attempt, or a broken or busy batch, may leave a store
    // behind, and a name decided again after its add holds a line: what follows is a
    // replacement, which waits.
    let faults = early
        .iter()
        .any(|next| matches!(next, Move::Break(_) | Move::Lock(_)));
    let ever_refused: HashSet<String> = early
        .iter()
        .filter_map(|next| match next {
            Move::Write { name, material, .. } if *material >= 3 => Some(self::name(NAMES[*name])),
            _ => None,
        })
        .collect();
    for (name, entry) in &rig.files {
        let held_before = [self::name("c"), self::name("d")].contains(name);
        let refused = ever_refused.contains(name)
            || rig.machine.refused.contains_key(name)
            || rig.machine.awaiting_reload.contains_key(name);
        if !held_before && !refused && !faults {
            prop_assert!(
                !rig.sim.lacks(name) && rig.sim.lines.iter().any(|(n, _)| n == name),
                "{} not added early: {:?}",
                name,
                entry.line
            );
        }
    }
    prop_assert!(!rig.machine.status().ready());
    rig.complete();
    play(&mut rig, after);
    settled(rig)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_haproxy_run_by_others_gets_adds_only_until_the_listing(
        early in proptest::collection::vec(a_move(), 0..30),
        after in proptest::collection::vec(a_move(), 0..20),
    ) {
        adds_only_until_the_listing(&early, &after)?;
    }

    #[test]
    fn external_haproxy_settles_to_the_files(moves in proptest::collection::vec(a_move(), 0..40)) {
        settles_to_the_files(false, &moves)?;
    }

    #[test]
    fn managed_haproxy_settles_to_the_files(moves in proptest::collection::vec(a_move(), 0..40)) {
        settles_to_the_files(true, &moves)?;
    }
}

/// Found by the property test: a `new` HAProxy could not do (locked) makes the `set`
/// after it fail on a store that is not there; that says nothing of the material.
#[test]
fn a_step_after_a_busy_one_is_no_refusal() {
    let mut rig = Rig::serving(&[]);
    rig.change(good("b", 0));
    rig.sim.locked = 1;
    rig.step(Event::Timer);
    assert_eq!(rig.stands("b"), "deferred");
    assert!(rig.rejected.is_empty());
    assert_eq!(rig.count(|c| matches!(c, Count::Refused(_))), 0);
    rig.settle();
    assert_eq!(rig.stands("b"), "served");
}
