//! The status writer under the process's adaptive limiter: a write the API server
//! refuses for load is re-queued until it lands, never given up, and costs no re-read.
//! Counts from the simulator's request log, the writer and the limiter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kube_common::adaptive::AdaptiveLimiter;
use kube_sim::FailRule;
use route_secrets::api::leader::Leadership;
use route_secrets::api::status_writer::{StatusWriter, StatusWriterOptions};
use route_secrets::route::Route;
use route_secrets::route::admission::{Admission, RouterIdentity};
use route_secrets::testing::route_with_external_certificate;
use support::*;

const NS: &str = "app";
/// More refusals in a row than the writer's attempts at a write (5).
const REFUSALS: u64 = 6;

/// The route as the server holds it (with its resourceVersion), for the writer.
fn stored_route(sim: &kube_sim::Simulator) -> Arc<Route> {
    stored_route_named(sim, "shop")
}

/// Route `name` (host `<name>.example`) as the server holds it.
fn stored_route_named(sim: &kube_sim::Simulator, name: &str) -> Arc<Route> {
    let stored = put_route(
        sim,
        &route_with_external_certificate(NS, name, &format!("{name}.example"), "tls"),
    );
    Arc::new(serde_json::from_value(stored).unwrap())
}

fn writes(sim: &kube_sim::Simulator, code: u16) -> usize {
    answered(sim, "update", "routes/status", code)
}

#[tokio::test]
async fn a_write_refused_for_load_is_re_queued_until_it_lands() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let route = stored_route(&sim);
    let limiter = AdaptiveLimiter::new(Some(8));
    let pooled = kube_h2::build_client(
        sim.client_config("router").await.unwrap(),
        kube_h2::ClientOptions::default(),
    )
    .unwrap();
    let writer = StatusWriter::spawn_with_limiter(
        pooled.client(),
        RouterIdentity::new(ROUTER_NAME),
        4,
        limiter.clone(),
    );
    sim.faults()
        .fail_next(FailRule::new("update", "routes/status", 429, REFUSALS));
    writer.record(route, Admission::admitted()).await;
    within_patience("the status written", async {
        while limiter.snapshot().succeeded == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(writes(&sim, 429), REFUSALS as usize, "the faults fired");
    assert_eq!(
        requests(&sim, "list", "routes").len(),
        0,
        "a refusal for load needs no re-read"
    );
    let stats = writer.stats();
    assert_eq!(
        (stats.writes, stats.failed),
        (REFUSALS + 1, 0),
        "every attempt counted, none given up"
    );
    let snapshot = limiter.snapshot();
    assert_eq!(
        (snapshot.refused, snapshot.succeeded, snapshot.in_flight),
        (REFUSALS, 1, 0)
    );
    // The transport counted each re-queued attempt as a retry (what /metrics shows).
    let retries: u64 = pooled
        .pool()
        .requests()
        .retries
        .iter()
        .filter(|retry| retry.resource == "routes/status")
        .map(|retry| retry.count)
        .sum();
    assert_eq!(retries, REFUSALS);
}

/// The control: without a limiter the same refusals exhaust the writer's attempts.
#[tokio::test]
async fn without_a_limiter_the_same_refusals_give_the_write_up() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let route = stored_route(&sim);
    let writer = StatusWriter::spawn_with(
        client(&sim, "router").await,
        RouterIdentity::new(ROUTER_NAME),
        StatusWriterOptions {
            retry: quick_retries(),
            ..StatusWriterOptions::new(4)
        },
    );
    sim.faults()
        .fail_next(FailRule::new("update", "routes/status", 429, REFUSALS));
    writer.record(route, Admission::admitted()).await;
    within_patience("the write given up", async {
        while writer.stats().failed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(writes(&sim, 200), 0);
    // Five attempts, each refused, with a re-read between two of them.
    assert_eq!(writes(&sim, 429), 5);
    assert_eq!(requests(&sim, "list", "routes").len(), 4);
    assert_eq!(writer.stats().writes, 5);
}

/// A route deleted while its write is redone is no failure: its status is simply gone.
#[tokio::test]
async fn a_route_deleted_before_the_re_read_is_not_a_failure() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let route = stored_route(&sim);
    let other = stored_route_named(&sim, "other");
    // One write at a time: the second route's write starts once the first has ended.
    let writer = StatusWriter::spawn(
        client(&sim, "router").await,
        RouterIdentity::new(ROUTER_NAME),
        1,
    );
    // Someone else's change conflicts with the write; meanwhile the route is deleted.
    sim.faults()
        .fail_next(FailRule::new("update", "routes/status", 409, 1));
    delete(&sim, "routes", NS, "shop");
    writer.record(route, Admission::admitted()).await;
    writer.record(other, Admission::admitted()).await;
    eventually("the other route written", || writes(&sim, 200) == 1).await;
    assert_eq!(requests(&sim, "list", "routes").len(), 1, "one re-read");
    let stats = writer.stats();
    assert_eq!((stats.writes, stats.conflicts, stats.failed), (2, 1, 0));
}

/// A writer of one write at a time that leads while `leading` says so.
async fn elected_writer(
    sim: &kube_sim::Simulator,
    leading: tokio::sync::watch::Receiver<bool>,
) -> StatusWriter {
    StatusWriter::spawn_with(
        client(sim, "router").await,
        RouterIdentity::new(ROUTER_NAME),
        StatusWriterOptions {
            leadership: Leadership::from_decisions(leading),
            ..StatusWriterOptions::new(1)
        },
    )
}

/// A replica that starts leading writes nothing until every outcome has been recorded
/// again: a route decided in between is written once, from the re-record, not a
/// second time on the copy older than its first write (a 409). One write at a time,
/// so the second route's write is the barrier: it starts after every write of the
/// first has ended.
#[tokio::test]
async fn a_route_decided_before_the_re_record_is_written_once() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let route = stored_route(&sim);
    let other = stored_route_named(&sim, "other");
    let (elect, leading) = tokio::sync::watch::channel(false);
    let writer = elected_writer(&sim, leading).await;
    // This replica starts leading; the route is decided before the re-record comes.
    elect.send_replace(true);
    writer
        .record(Arc::clone(&route), Admission::admitted())
        .await;
    // The re-record carries the same copy (the watch has not brought any write back).
    writer.record(route, Admission::admitted()).await;
    writer.rerecorded().await;
    writer.record(other, Admission::admitted()).await;
    within_patience("both statuses written", async {
        while writer.stats().recorded < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        writes(&sim, 409),
        0,
        "no write on a copy older than a write"
    );
    assert_eq!(writes(&sim, 200), 2);
    let stats = writer.stats();
    assert_eq!((stats.writes, stats.conflicts), (2, 0));
}

/// While following, outcomes are the leader's to write; a replica that never leads
/// writes nothing, re-record or not.
#[tokio::test]
async fn a_follower_writes_nothing() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let route = stored_route(&sim);
    let (_elect, leading) = tokio::sync::watch::channel(false);
    let writer = elected_writer(&sim, leading).await;
    writer.record(route, Admission::admitted()).await;
    writer.rerecorded().await;
    within_patience("the outcome followed", async {
        while writer.stats().followed < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(writes(&sim, 200) + writes(&sim, 409), 0);
}
