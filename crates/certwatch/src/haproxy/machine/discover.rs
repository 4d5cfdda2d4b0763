//! Reading what HAProxy holds of certwatch's certificates.
//!
//! `show ssl cert` and `show ssl crt-list -n` name the certificates and lines; open
//! transactions of certwatch's certificates (left by an interrupted update) are
//! aborted, since one would block the next `set ssl cert`. Then what each certificate
//! holds: known without asking when the answering worker is the one certwatch's last
//! start or reload made (every certificate not changed since it began is what the
//! files held; one changed once meanwhile, to another leaf, is asked: the worker read
//! either file), asked certificate by certificate (`show ssl cert <name>`, its SHA-1)
//! otherwise. What HAProxy holds of certwatch's and certwatch no longer wants is
//! removed (once the first complete listing says what certwatch wants); everything
//! else not held as wanted is pending.

use std::time::Instant;

use tracing::debug;

use super::{Action, BUSY_RETRY, BeforeLoad, Failure, Machine, Op, Want};
use crate::cert_dir::CrtEntry;
use crate::haproxy::certs::{self, Held, HeldLine, Known};
use crate::haproxy::runtime::{BatchOutcome, Command, Connected, RuntimeError};

/// A reading in progress.
#[derive(Debug)]
pub(super) struct Discovery {
    stage: Stage,
    /// The process read, and what is learnt of it so far.
    connected: Option<Connected>,
    known: Option<Known>,
    /// The answer of `show ssl crt-list -n`.
    shown: String,
    /// certwatch's certificates HAProxy holds.
    managed: Vec<String>,
}

/// Which answer the reading waits for.
#[derive(Debug)]
enum Stage {
    /// `show ssl cert` and `show ssl crt-list -n`.
    Show,
    /// `abort ssl cert` of the open transactions.
    Aborts,
    /// `show ssl cert <name>` of `managed[from..to]`.
    ReadEach { from: usize, to: usize },
}

impl Machine {
    /// Starts reading HAProxy.
    pub(super) fn discover(&mut self, out: &mut Vec<Action>) {
        let list = &self.options.list;
        out.push(Action::Execute(vec![
            Command::new("show ssl cert"),
            Command::new(format!("show ssl crt-list -n {list}")),
        ]));
        self.op = Op::Discover(Discovery {
            stage: Stage::Show,
            connected: None,
            known: None,
            shown: String::new(),
            managed: Vec::new(),
        });
    }

    /// An answer of the reading; `true` once it is complete.
    pub(super) fn discovered(
        &mut self,
        now: Instant,
        discovery: Discovery,
        outcome: BatchOutcome,
        out: &mut Vec<Action>,
    ) -> bool {
        let result = match discovery.stage {
            Stage::Show => self.shown(now, discovery, outcome, out),
            Stage::Aborts => self.answer(outcome).map(|_| self.read_held(discovery, out)),
            Stage::ReadEach { from, to } => self
                .answer(outcome)
                .map(|outcome| self.read_each(discovery, from, to, &outcome, out)),
        };
        match result {
            Ok(Some(discovery)) => {
                self.finish_discovery(now, discovery, out);
                true
            }
            Ok(None) => false,
            Err(error) => {
                self.failed(now, &Failure::Runtime(error), out);
                false
            }
        }
    }

    /// The answers of an exchange that must complete; the connection's limits learnt.
    fn answer(&mut self, mut outcome: BatchOutcome) -> Result<BatchOutcome, RuntimeError> {
        if let Some(connected) = outcome.connected {
            self.limits = Some(connected);
        }
        match outcome.error.take() {
            Some(error) => Err(error),
            None => Ok(outcome),
        }
    }

    /// The names: aborts what is left open, or goes on to what each holds.
    fn shown(
        &mut self,
        now: Instant,
        mut discovery: Discovery,
        outcome: BatchOutcome,
        out: &mut Vec<Action>,
    ) -> Result<Option<Discovery>, RuntimeError> {
        let outcome = self.answer(outcome)?;
        let connected = outcome.connected.ok_or(RuntimeError::Stopped)?;
        if outcome
            .replies
            .iter()
            .any(|reply| reply.contains("currently locked"))
        {
            debug!("HAProxy's certificate operations are locked; asking again shortly");
            self.retry_at = Some(now + BUSY_RETRY);
            return Ok(None);
        }
        let reply = |index: usize| outcome.replies.get(index).map_or("", |reply| reply.text());
        let (committed, transactions) = certs::parse_certificates(reply(0));
        let shown = reply(1);
        if shown.starts_with("didn't find") || shown.contains("Can't") {
            let list = &self.options.list;
            return Err(RuntimeError::Protocol {
                socket: self.options.socket.clone(),
                problem: format!(
                    "show ssl crt-list {list}: {} (HAProxy's configuration must load this crt-list by this exact path)",
                    certs_summary(shown)
                ),
            });
        }
        discovery.connected = Some(connected);
        discovery.known = Some(Known::new(connected.instance));
        discovery.shown = shown.to_owned();
        discovery.managed = committed
            .into_iter()
            .filter(|name| self.managed(name))
            .collect();
        let aborts: Vec<Command> = transactions
            .iter()
            .filter(|name| self.managed(name))
            .map(|name| Command::new(format!("abort ssl cert {name}")))
            .collect();
        if aborts.is_empty() {
            return Ok(self.read_held(discovery, out));
        }
        discovery.stage = Stage::Aborts;
        out.push(Action::Execute(aborts));
        self.op = Op::Discover(discovery);
        Ok(None)
    }

    /// The worker certwatch loaded last: the epoch of its load.
    fn loaded_epoch(&self, discovery: &Discovery) -> Option<u64> {
        let pid = discovery.connected?.instance.pid;
        self.loaded
            .filter(|(worker, _)| *worker == pid)
            .map(|(_, epoch)| epoch)
    }

    /// What each certificate holds: known from the load, asked where the load may
    /// have read either of two versions with different leaves, or asked one by one of
    /// a process certwatch did not load.
    fn read_held(&mut self, mut discovery: Discovery, out: &mut Vec<Action>) -> Option<Discovery> {
        let Some(epoch) = self.loaded_epoch(&discovery) else {
            return self.ask_each(discovery, 0, out);
        };
        let before_load = std::mem::take(&mut self.changed_while_loading);
        let known = discovery.known.as_mut()?;
        let mut ask = Vec::new();
        for name in &discovery.managed {
            let held = match self.wanted.get(name) {
                Some(Want {
                    entry: Some(entry),
                    version,
                }) if *version <= epoch => Held::Bundle(entry.digest),
                Some(Want {
                    entry: Some(entry), ..
                }) if leaf_tells(before_load.get(name), entry) => {
                    ask.push(name.clone());
                    continue;
                }
                _ => Held::Unknown,
            };
            known.certs.insert(name.clone(), held);
        }
        discovery.managed = ask;
        self.ask_each(discovery, 0, out)
    }

    /// Asks the next chunk of certificates from `from`, or ends the reading.
    fn ask_each(
        &mut self,
        mut discovery: Discovery,
        from: usize,
        out: &mut Vec<Action>,
    ) -> Option<Discovery> {
        let chunk = self.options.batch_limit.max(1) * 4;
        let to = discovery.managed.len().min(from + chunk);
        if from >= to {
            return Some(discovery);
        }
        let commands = discovery.managed[from..to]
            .iter()
            .map(|name| Command::new(format!("show ssl cert {name}")))
            .collect();
        out.push(Action::Execute(commands));
        discovery.stage = Stage::ReadEach { from, to };
        self.op = Op::Discover(discovery);
        None
    }

    fn read_each(
        &mut self,
        mut discovery: Discovery,
        from: usize,
        to: usize,
        outcome: &BatchOutcome,
        out: &mut Vec<Action>,
    ) -> Option<Discovery> {
        let known = discovery.known.as_mut()?;
        for (name, reply) in discovery.managed[from..to].iter().zip(&outcome.replies) {
            let held = certs::parse_sha1(reply.text()).map_or(Held::Unknown, Held::Leaf);
            known.certs.insert(name.clone(), held);
        }
        self.ask_each(discovery, to, out)
    }

    /// Lines, strays and what is pending, from a complete reading.
    fn finish_discovery(&mut self, now: Instant, discovery: Discovery, out: &mut Vec<Action>) {
        let (Some(connected), Some(mut known)) = (discovery.connected, discovery.known) else {
            return;
        };
        for (name, number, rest) in certs::parse_crt_list(&discovery.shown) {
            if self.managed(&name) {
                known.lines.entry(name).or_default().push(HeldLine {
                    number: Some(number),
                    rest,
                });
            }
        }
        let (pid, certificates, lines) =
            (connected.instance.pid, known.certs.len(), known.lines.len());
        self.limits = Some(connected);
        self.known = Some(known);
        // What HAProxy holds of certwatch's and certwatch no longer wants goes, once
        // the listing says what certwatch wants.
        if self.listing_complete {
            self.mark_strays(now);
        }
        // Everything HAProxy does not hold as wanted is pending; what it holds is
        // served.
        let Some(known) = &self.known else {
            return;
        };
        let mut served = Vec::new();
        for (name, want) in &self.wanted {
            if known.holds(name, want.entry.as_ref()) {
                served.push(name.clone());
            } else if !self.awaiting_reload.contains_key(name) && !self.is_refused(name, want) {
                self.pending
                    .insert_if_absent(name, now, want.entry.is_some());
            }
        }
        for name in served {
            self.served(&name, out);
        }
        debug!(
            pid,
            certificates,
            lines,
            pending = self.pending.len(),
            "read HAProxy's certificates"
        );
        self.succeeded(out);
    }
}

/// Whether the leaf a worker holds tells which of a certificate's versions it read: the
/// one before the load's change (`before`) has no leaf or another leaf than `now`.
fn leaf_tells(before: Option<&BeforeLoad>, now: &CrtEntry) -> bool {
    match before {
        Some(BeforeLoad::Nothing) => true,
        Some(BeforeLoad::Leaf(leaf)) => certs::leaf_sha1(&now.tls).is_some_and(|now| now != *leaf),
        Some(BeforeLoad::Ambiguous) | None => false,
    }
}

/// An answer on one line for an error message.
fn certs_summary(answer: &str) -> String {
    crate::haproxy::runtime::summarize(answer)
}
