//! Property tests: label and field selectors, parsed from their text form, select
//! exactly what a reference evaluation of the same requirements selects — in the
//! parser and through list requests against a running simulator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;

const KEYS: &[&str] = &["app", "tier", "example.com/team", "n"];
const VALUES: &[&str] = &["a", "b", "c", "1", "2", "10", ""];

#[derive(Debug, Clone)]
enum Req {
    Exists(&'static str),
    Absent(&'static str),
    Eq(&'static str, &'static str, bool),
    NotEq(&'static str, &'static str),
    In(&'static str, Vec<&'static str>),
    NotIn(&'static str, Vec<&'static str>),
    Gt(&'static str, i64),
    Lt(&'static str, i64),
}

fn key() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(KEYS)
}

fn value() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(VALUES)
}

fn value_set() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::collection::vec(proptest::sample::select(&VALUES[..6]), 1..4)
}

fn requirement() -> impl Strategy<Value = Req> {
    prop_oneof![
        key().prop_map(Req::Exists),
        key().prop_map(Req::Absent),
        (key(), value(), any::<bool>()).prop_map(|(k, v, double)| Req::Eq(k, v, double)),
        (key(), value()).prop_map(|(k, v)| Req::NotEq(k, v)),
        (key(), value_set()).prop_map(|(k, v)| Req::In(k, v)),
        (key(), value_set()).prop_map(|(k, v)| Req::NotIn(k, v)),
        (key(), 0i64..12).prop_map(|(k, n)| Req::Gt(k, n)),
        (key(), 0i64..12).prop_map(|(k, n)| Req::Lt(k, n)),
    ]
}

fn render(reqs: &[Req], spaced: bool) -> String {
    let sp = if spaced { " " } else { "" };
    reqs.iter()
        .map(|r| match r {
            Req::Exists(k) => k.to_string(),
            Req::Absent(k) => format!("!{k}"),
            Req::Eq(k, v, double) => format!("{k}{sp}{}{sp}{v}", if *double { "==" } else { "=" }),
            Req::NotEq(k, v) => format!("{k}{sp}!={sp}{v}"),
            Req::In(k, vs) => format!("{k} in ({})", vs.join(&format!(",{sp}"))),
            Req::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            Req::Gt(k, n) => format!("{k}{sp}>{sp}{n}"),
            Req::Lt(k, n) => format!("{k}<{n}"),
        })
        .collect::<Vec<_>>()
        .join(&format!(",{sp}"))
}

/// The reference semantics, written from the Kubernetes documentation.
fn reference(reqs: &[Req], labels: &BTreeMap<String, String>) -> bool {
    let get = |k: &str| labels.get(k).map(String::as_str);
    let int = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
    reqs.iter().all(|r| match r {
        Req::Exists(k) => get(k).is_some(),
        Req::Absent(k) => get(k).is_none(),
        Req::Eq(k, v, _) => get(k) == Some(*v),
        Req::NotEq(k, v) => get(k) != Some(*v),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
        Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.contains(&x)),
        Req::Gt(k, n) => int(k).is_some_and(|x| x > *n),
        Req::Lt(k, n) => int(k).is_some_and(|x| x < *n),
    })
}

fn label_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        key().prop_map(str::to_string),
        value().prop_map(str::to_string),
        0..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn label_selectors_match_the_reference(
        reqs in proptest::collection::vec(requirement(), 1..4),
        labels in label_map(),
        spaced in any::<bool>(),
    ) {
        let text = render(&reqs, spaced);
        let parsed = kube_sim::LabelSelector::parse(&text).unwrap();
        prop_assert_eq!(parsed.requirements.len(), reqs.len());
        prop_assert_eq!(parsed.matches(&labels), reference(&reqs, &labels), "selector {}", text);
    }

    #[test]
    fn field_selectors_match_the_reference(
        terms in proptest::collection::vec(
            (prop_oneof![Just("metadata.name"), Just("metadata.namespace")], any::<bool>(), "[a-c,=!\\\\]{0,4}"),
            1..4,
        ),
        name in "[a-c,=!\\\\]{0,4}",
        namespace in "[a-c]{1,2}",
    ) {
        let text = terms
            .iter()
            .map(|(f, eq, v)| format!("{f}{}{}", if *eq { "=" } else { "!=" }, kube_sim::FieldSelector::escape(v)))
            .collect::<Vec<_>>()
            .join(",");
        let parsed = kube_sim::FieldSelector::parse(&text).unwrap();
        let obj = json!({"metadata": {"name": name, "namespace": namespace}});
        let expected = terms.iter().all(|(f, eq, v)| {
            let actual = if *f == "metadata.name" { &name } else { &namespace };
            (actual == v) == *eq
        });
        prop_assert_eq!(parsed.matches(&obj), expected, "selector {}", text);
    }
}

/// Lists through the API with random label selectors return exactly the objects
/// the reference selects.
#[test]
fn list_requests_agree_with_the_reference() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sim = runtime.block_on(start());
    let client = runtime.block_on(sim.client("admin")).unwrap();
    let mut runner = TestRunner::new(Config::with_cases(24));
    let all_labels: Vec<BTreeMap<String, String>> = runner
        .run_one_value(&proptest::collection::vec(label_map(), 16))
        .unwrap();
    for (i, labels) in all_labels.iter().enumerate() {
        let mut s = opaque_secret("default", &format!("obj-{i}"), &[]);
        s["metadata"]["labels"] = json!(labels);
        sim.store().create("secrets", s).unwrap();
    }
    runner
        .run(&proptest::collection::vec(requirement(), 1..3), |reqs| {
            let text = render(&reqs, false);
            let expected: BTreeSet<String> = all_labels
                .iter()
                .enumerate()
                .filter(|(_, l)| reference(&reqs, l))
                .map(|(i, _)| format!("obj-{i}"))
                .collect();
            let query: String = form_urlencoded::byte_serialize(text.as_bytes()).collect();
            let (code, list) = runtime.block_on(get(
                &client,
                &format!("/api/v1/namespaces/default/secrets?labelSelector={query}"),
            ));
            prop_assert_eq!(code, 200);
            let got: BTreeSet<String> = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
                .collect();
            prop_assert_eq!(got, expected, "selector {}", text);
            Ok(())
        })
        .unwrap();
    runtime.block_on(sim.shutdown());
}

trait RunOne {
    fn run_one_value<S: Strategy>(&mut self, s: &S) -> Result<S::Value, String>;
}

impl RunOne for TestRunner {
    fn run_one_value<S: Strategy>(&mut self, s: &S) -> Result<S::Value, String> {
        s.new_tree(self)
            .map(|t| proptest::strategy::ValueTree::current(&t))
            .map_err(|e| e.to_string())
    }
}
