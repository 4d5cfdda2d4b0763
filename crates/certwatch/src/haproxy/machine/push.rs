//! One batch: the oldest pending certificates' commands, pipelined, and what their
//! answers mean.
//!
//! Planning ([`super::certs::plan`]) takes pending certificates oldest change first,
//! skipping those deferred (and, before the first complete listing, all but adds),
//! until the batch holds [`MachineOptions::batch_limit`]
//! certificates or [`MachineOptions::batch_bytes`] of requests; a certificate with
//! nothing to do is served, one too large for a request waits for a reload or is
//! refused. Transactions a busy `commit` may have left open are aborted first. Each
//! answer is read back into the knowledge ([`Known::apply`]): a certificate whose every
//! step succeeded is served; a refused one is refused alone; a failed or busy one is
//! deferred.
//!
//! [`MachineOptions::batch_limit`]: super::MachineOptions::batch_limit
//! [`MachineOptions::batch_bytes`]: super::MachineOptions::batch_bytes
//! [`Known::apply`]: super::super::certs::Known::apply

use std::ops::Range;
use std::time::Instant;

use kube_common::backoff::Backoff;
use tracing::debug;

use super::{Action, BUSY_RETRY, Count, Failure, Machine, Op};
use crate::haproxy::certs::{self, Applied, Planned, Step, Unplannable};
use crate::haproxy::runtime::{self, BatchOutcome, Command, Reply, RuntimeError};

/// A batch sent, waiting for its answers.
#[derive(Debug)]
pub(super) struct Batch {
    /// Every command, in order (the aborts first).
    planned: Vec<Planned>,
    /// Each certificate's commands in `planned`.
    certificates: Vec<(String, Range<usize>)>,
    /// When it was planned.
    sent: Instant,
}

/// What a batch's answers mean, per certificate.
#[derive(Debug, Default)]
struct Verdicts {
    /// Certificates committed.
    pushed: usize,
    /// Held as wanted now.
    done: Vec<String>,
    /// HAProxy refused their material, with its answer.
    refused: Vec<(String, String)>,
    /// A step failed: knowledge gone wrong.
    failed: Vec<String>,
    /// HAProxy could not act now; `true` when a `commit` may have left a transaction
    /// open.
    busy: Vec<(String, bool)>,
}

impl Machine {
    /// Plans and sends a batch; `false` when there was nothing to send.
    pub(super) fn push(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        let Some(batch) = self.plan_batch(now, out) else {
            return false;
        };
        let commands = batch
            .planned
            .iter()
            .map(|planned| planned.command.clone())
            .collect();
        out.push(Action::Execute(commands));
        self.op = Op::Push(batch);
        true
    }

    /// The batch's commands, or `None` when none is due.
    fn plan_batch(&mut self, now: Instant, out: &mut Vec<Action>) -> Option<Batch> {
        let known = self.known.as_ref()?;
        let max_request = self
            .limits
            .map_or(runtime::DEFAULT_BUFSIZE - 1, |limits| limits.max_request);
        let mut planned: Vec<Planned> = Vec::new();
        let mut certificates = Vec::new();
        let mut bytes = 0;
        let mut served = Vec::new();
        let mut too_large = Vec::new();
        let mut stale = false;
        for name in self.pending.oldest_first() {
            if certificates.len() >= self.options.batch_limit || bytes >= self.options.batch_bytes {
                break;
            }
            if self.deferred.get(name).is_some_and(|(_, due)| now < *due) || !self.may_push(name) {
                continue;
            }
            let Some(want) = self.wanted.get(name) else {
                served.push(name.to_owned());
                continue;
            };
            let list = &self.options.list;
            match certs::plan(name, want.entry.as_ref(), known, list, max_request) {
                Ok(steps) if steps.is_empty() => served.push(name.to_owned()),
                Ok(steps) => {
                    let start = planned.len();
                    bytes += steps
                        .iter()
                        .map(|p| p.command.request_size())
                        .sum::<usize>();
                    planned.extend(steps);
                    certificates.push((name.to_owned(), start..planned.len()));
                }
                Err(Unplannable::TooLarge { size, limit }) => {
                    too_large.push((name.to_owned(), size, limit));
                }
                Err(Unplannable::LinesUnknown) => stale = true,
            }
        }
        for name in served {
            self.served(&name, out);
        }
        for (name, size, limit) in too_large {
            self.too_large(name, size, limit, out);
        }
        if stale && let Some(known) = self.known.as_mut() {
            known.stale = true;
        }
        if planned.is_empty() && self.aborts.is_empty() {
            return None;
        }
        // Transactions a busy `commit` may have left open go first.
        let aborts: Vec<Planned> = self
            .aborts
            .drain()
            .map(|name| Planned {
                step: Step::Abort,
                command: Command::new(format!("abort ssl cert {name}")),
                name,
            })
            .collect();
        let offset = aborts.len();
        for (_, range) in &mut certificates {
            *range = range.start + offset..range.end + offset;
        }
        planned.splice(0..0, aborts);
        Some(Batch {
            planned,
            certificates,
            sent: now,
        })
    }

    /// The answers of a batch.
    pub(super) fn pushed(
        &mut self,
        now: Instant,
        batch: Batch,
        outcome: BatchOutcome,
        out: &mut Vec<Action>,
    ) {
        if let Some(connected) = outcome.connected {
            self.limits = Some(connected);
            if self
                .known
                .as_ref()
                .is_some_and(|known| known.instance != connected.instance)
            {
                // Another process answered: nothing it said is about what is known.
                self.known = None;
                let error = RuntimeError::ProcessChanged {
                    socket: self.options.socket.clone(),
                };
                self.failed(now, &Failure::Runtime(error), out);
                return;
            }
        }
        let Some(verdicts) = self.verdicts(&batch, &outcome.replies, out) else {
            return;
        };
        self.apply_verdicts(batch.sent, &verdicts, out);
        out.push(Action::Count(Count::Pushed(verdicts.pushed)));
        let elapsed = now.saturating_duration_since(batch.sent).as_secs_f64();
        if verdicts.pushed >= 16 && elapsed > 0.0 {
            let rate = verdicts.pushed as f64 / elapsed;
            self.push_rate = Some(self.push_rate.map_or(rate, |old| 0.7 * old + 0.3 * rate));
        }
        debug!(
            certificates = batch.certificates.len(),
            commands = batch.planned.len(),
            answered = outcome.replies.len(),
            pushed = verdicts.pushed,
            elapsed_ms = elapsed * 1e3,
            "runtime API batch"
        );
        match outcome.error {
            Some(error) => {
                // What the unanswered commands did is not known.
                if let Some(known) = self.known.as_mut() {
                    known.stale = true;
                }
                self.failed(now, &Failure::Runtime(error), out);
            }
            None => self.succeeded(out),
        }
    }

    /// Reads each answer into the knowledge; what it means per certificate.
    fn verdicts(
        &mut self,
        batch: &Batch,
        replies: &[Reply],
        out: &mut Vec<Action>,
    ) -> Option<Verdicts> {
        let known = self.known.as_mut()?;
        let mut verdicts = Verdicts::default();
        for (name, range) in &batch.certificates {
            let want = self.wanted.get(name).and_then(|want| want.entry.as_ref());
            let mut complete = range.end <= replies.len();
            let mut refused = None;
            // After a step HAProxy did not do, the next ones answer to a state the plan
            // did not expect (a `set` on a store a busy `new` did not make): no
            // verdict on the material.
            let mut disturbed = false;
            for (step, reply) in batch.planned[range.clone()]
                .iter()
                .zip(&replies[range.start.min(replies.len())..])
            {
                let applied = known.apply(step, want, reply);
                out.push(Action::Count(Count::Command {
                    command: step.step.command(),
                    ok: applied == Applied::Done,
                }));
                match applied {
                    Applied::Done if step.step == Step::Commit => verdicts.pushed += 1,
                    Applied::Done => {}
                    Applied::MaterialRefused(message) if !disturbed => {
                        refused.get_or_insert(message);
                    }
                    Applied::MaterialRefused(message) => {
                        debug!(certificate = %name, step = step.step.command(), %message, "runtime API step failed after an earlier one");
                    }
                    Applied::Failed(message) => {
                        debug!(certificate = %name, step = step.step.command(), %message, "runtime API step failed");
                        disturbed = true;
                        complete = false;
                        verdicts.failed.push(name.clone());
                    }
                    Applied::Busy => {
                        disturbed = true;
                        complete = false;
                        verdicts
                            .busy
                            .push((name.clone(), step.step == Step::Commit));
                    }
                }
            }
            if let Some(message) = refused {
                verdicts.refused.push((name.clone(), message));
            } else if complete && known.holds(name, want) {
                verdicts.done.push(name.clone());
            }
        }
        Some(verdicts)
    }

    /// Served, deferred, refused, as the verdicts say; `planned` is when the batch was
    /// planned.
    fn apply_verdicts(&mut self, planned: Instant, verdicts: &Verdicts, out: &mut Vec<Action>) {
        for name in &verdicts.done {
            self.served(name, out);
        }
        for (name, commit) in &verdicts.busy {
            if *commit {
                self.aborts.insert(name.clone());
            }
            let policy = self.options.retry;
            self.deferred
                .entry(name.clone())
                .or_insert_with(|| (Backoff::new(policy), planned))
                .1 = planned + BUSY_RETRY;
        }
        for name in &verdicts.failed {
            let mut backoff = self
                .deferred
                .remove(name)
                .map_or_else(|| Backoff::new(self.options.retry), |(backoff, _)| backoff);
            let draw = self.jitter.draw();
            let delay = backoff.next_delay_at(planned, draw);
            self.deferred
                .insert(name.clone(), (backoff, planned + delay));
        }
        for (name, message) in &verdicts.refused {
            self.rejected(name.clone(), message, out);
        }
    }
}
