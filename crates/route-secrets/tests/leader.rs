//! Leader election on a Lease against the simulator (which serves Leases as
//! kube-apiserver does; see kube-sim's conformance test): one leader among replicas,
//! renewals with a precondition, a killed leader replaced once its record runs out,
//! a released Lease taken over at once. Counts come from the simulator's request log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_sim::{GenerateSpec, ROUTER_NAMESPACE, ROUTER_USER, SimConfig, Simulator};
use route_secrets::api::leader::{LeaderElector, Leadership, LeaseOptions};

const LEASE: &str = "certwatch-default";

async fn sim() -> Simulator {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    // The router identity's RBAC, Leases in its namespace included.
    sim.generate(&GenerateSpec::new(1, 1)).unwrap();
    sim
}

/// Short timings, so that a run of the test takes seconds (they are no bound the test
/// checks: every assertion is on counts and order).
fn options(identity: &str, lease_duration: Duration) -> LeaseOptions {
    LeaseOptions {
        lease_duration,
        renew_deadline: Duration::from_millis(1_500),
        retry_period: Duration::from_millis(300),
        ..LeaseOptions::new(ROUTER_NAMESPACE, LEASE, identity)
    }
}

fn leaders(electors: &[(&str, LeaderElector)]) -> Vec<String> {
    electors
        .iter()
        .filter(|(_, elector)| elector.leadership().is_leader())
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

async fn one_leader(electors: &[(&str, LeaderElector)]) -> String {
    support::within_patience("exactly one replica leads", async {
        loop {
            if let [leader] = leaders(electors).as_slice() {
                return leader.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// The router's lease writes as (verb, code).
fn lease_writes(sim: &Simulator) -> Vec<(String, u16)> {
    sim.request_log()
        .into_iter()
        .filter(|r| r.user == ROUTER_USER && r.resource == "leases")
        .filter(|r| matches!(r.verb.to_string().as_str(), "create" | "update"))
        .map(|r| (r.verb.to_string(), r.code))
        .collect()
}

async fn record(sim: &Simulator) -> (String, i32) {
    let admin = sim.client("admin").await.unwrap();
    let lease = Api::<Lease>::namespaced(admin, ROUTER_NAMESPACE)
        .get(LEASE)
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    (
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    )
}

/// Waits until the leader has renewed `count` more times (its updates answered 200).
async fn renewals(sim: &Simulator, count: usize) {
    let before = lease_writes(sim)
        .iter()
        .filter(|w| *w == &("update".to_owned(), 200))
        .count();
    support::within_patience("the leader renews", async {
        while lease_writes(sim)
            .iter()
            .filter(|w| *w == &("update".to_owned(), 200))
            .count()
            < before + count
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_elect_one_writer_that_keeps_renewing() {
    let sim = sim().await;
    let client = sim.client("router").await.unwrap();
    let electors: Vec<(&str, LeaderElector)> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            (
                name,
                LeaderElector::spawn(client.clone(), options(name, Duration::from_secs(3))),
            )
        })
        .collect();
    let leader = one_leader(&electors).await;
    renewals(&sim, 5).await;
    // Still one leader, the same, after five renewals.
    assert_eq!(leaders(&electors), std::slice::from_ref(&leader));
    assert_eq!(record(&sim).await, (leader, 0));
    // One create won; a replica that listed before it and tried too lost (409), one
    // that listed after it followed without trying; every update was a renewal that
    // succeeded (no take-over was tried while the record was fresh).
    let writes = lease_writes(&sim);
    let creates: Vec<u16> = writes
        .iter()
        .filter(|w| w.0 == "create")
        .map(|w| w.1)
        .collect();
    assert_eq!(
        creates.iter().filter(|c| **c == 201).count(),
        1,
        "{writes:?}"
    );
    assert!(creates.iter().all(|c| [201, 409].contains(c)), "{writes:?}");
    assert!(
        writes
            .iter()
            .filter(|w| w.0 == "update")
            .all(|w| w.1 == 200),
        "{writes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_once_its_record_runs_out() {
    let sim = sim().await;
    let client = sim.client("router").await.unwrap();
    let mut electors: Vec<(&str, LeaderElector)> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            (
                name,
                LeaderElector::spawn(client.clone(), options(name, Duration::from_secs(2))),
            )
        })
        .collect();
    let leader = one_leader(&electors).await;
    renewals(&sim, 2).await;
    let writes_before = lease_writes(&sim).len();
    // Dropped without release: its task stops at once, as a SIGKILL would stop it.
    let index = electors
        .iter()
        .position(|(name, _)| *name == leader)
        .unwrap();
    drop(electors.remove(index));
    let successor = one_leader(&electors).await;
    assert_ne!(successor, leader);
    assert_eq!(record(&sim).await, (successor.clone(), 1));
    renewals(&sim, 2).await;
    assert_eq!(leaders(&electors), [successor]);
    // The take-over: the two followers each tried once with the version they saw;
    // one won, the other met a 409. Then only the new leader's renewals.
    let after: Vec<(String, u16)> = lease_writes(&sim)[writes_before..].to_vec();
    let conflicts = after.iter().filter(|w| w.1 == 409).count();
    assert!(conflicts <= 1, "{after:?}");
    assert!(after.iter().all(|w| w.0 == "update"), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_over_at_once() {
    let sim = sim().await;
    let client = sim.client("router").await.unwrap();
    // A lease duration far longer than the test's patience: only the release can
    // explain a take-over.
    let long = Duration::from_secs(3_600);
    let first = LeaderElector::spawn(client.clone(), options("first", long));
    support::within_patience("the first replica leads", async {
        while !first.leadership().is_leader() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let second = LeaderElector::spawn(client.clone(), options("second", long));
    let mut leading = second.leadership().subscribe();
    support::within_patience("the second replica watches the lease", async {
        while sim
            .request_log()
            .iter()
            .filter(|r| r.resource == "leases" && r.verb == "watch" && r.code == 200)
            .count()
            < 2
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(!second.leadership().is_leader());
    first.release().await;
    support::within_patience("the second replica leads", leading.wait_for(|l| *l))
        .await
        .unwrap();
    assert_eq!(record(&sim).await, ("second".to_owned(), 1));
}

/// A replica whose election runs on a runtime of its own, on a thread of its own, that
/// the test can stall: none of its tasks runs then, as when a busy machine does not
/// schedule the process.
struct Stallable {
    leadership: Leadership,
    /// Each message stalls the runtime until its sender is dropped.
    stalls: tokio::sync::mpsc::UnboundedSender<std::sync::mpsc::Receiver<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stallable {
    fn spawn(client: kube::Client, options: LeaseOptions) -> Self {
        let (stalls, mut stall_requests) =
            tokio::sync::mpsc::unbounded_channel::<std::sync::mpsc::Receiver<()>>();
        let (ready, leadership) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let elector = LeaderElector::spawn(client, options);
                ready.send(elector.leadership()).unwrap();
                while let Some(resume) = stall_requests.recv().await {
                    // Blocks the runtime's only thread: the election's task stops.
                    let _ = resume.recv();
                }
                drop(elector);
            });
        });
        Self {
            leadership: leadership.recv().unwrap(),
            stalls,
            thread: Some(thread),
        }
    }

    /// Stalls the replica's runtime until the returned sender is dropped.
    fn stall(&self) -> std::sync::mpsc::Sender<()> {
        let (resume, stalled) = std::sync::mpsc::channel();
        self.stalls.send(stalled).unwrap();
        resume
    }
}

impl Drop for Stallable {
    fn drop(&mut self) {
        let (stalls, _) = tokio::sync::mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.stalls, stalls));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The window of two writers: a leader whose process is not scheduled cannot renew,
/// and its election task cannot say it stopped leading either. Its leadership (what its
/// status writer asks right before each write) ends on its own clock, counted from the
/// sending of its last renewal, before another replica may take the Lease over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_not_scheduled_stops_writing_before_another_starts() {
    let sim = sim().await;
    // Each replica with a client of its own, as replicas are processes of their own:
    // the stalled runtime must not hold up the other replica's requests.
    let client = sim.client("router").await.unwrap();
    let other_client = sim.client("router").await.unwrap();
    let duration = Duration::from_secs(2);
    let stalled = Stallable::spawn(client.clone(), options("stalled", duration));
    support::within_patience("the first replica leads", async {
        while !stalled.leadership.is_leader() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let other = LeaderElector::spawn(other_client, options("other", duration));
    renewals(&sim, 2).await;
    assert!(!other.leadership().is_leader());

    let resume = stalled.stall();
    let mut overlaps = 0;
    let mut samples = 0;
    support::within_patience("the other replica leads", async {
        loop {
            // In this order: a leadership that has ended on the clock stays ended
            // while the runtime is stalled, so both `true` means both at once.
            let other_leads = other.leadership().is_leader();
            let stalled_leads = stalled.leadership.is_leader();
            samples += 1;
            if other_leads && stalled_leads {
                overlaps += 1;
            }
            if other_leads {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(overlaps, 0, "two writers at once in {samples} samples");
    assert!(!stalled.leadership.is_leader());
    // The stalled replica's election really did not run: it still thinks it leads.
    // Only the clock ended its term.
    assert!(*stalled.leadership.subscribe().borrow());
    assert_eq!(record(&sim).await, ("other".to_owned(), 1));

    drop(resume);
    let mut follows = stalled.leadership.subscribe();
    support::within_patience(
        "the stalled replica, scheduled again, follows",
        follows.wait_for(|leading| !*leading),
    )
    .await
    .unwrap();
    renewals(&sim, 2).await;
    assert!(other.leadership().is_leader());
    assert!(!stalled.leadership.is_leader());
    assert_eq!(record(&sim).await, ("other".to_owned(), 1));
}
