//! The generator: routes, secrets with real certificates signed by one CA, namespace
//! labels, creation order, and exactly the RBAC a router has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube_sim::{GenerateSpec, ROUTER_SECRETS_ROLE, SHARD_LABEL};
use x509_parser::prelude::*;

fn decode(v: &serde_json::Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_cluster_is_consistent() {
    let sim = start().await;
    let spec = GenerateSpec {
        secrets: Some(50),
        ..GenerateSpec::new(200, 10)
    };
    let cluster = sim.generate(&spec).unwrap();
    assert_eq!(cluster.routes.len(), 200);
    assert_eq!(cluster.namespaces.len(), 10);
    assert_eq!(cluster.secrets, 50);
    assert_eq!(cluster.distinct_secrets().len(), 50);
    // Round-robin sharing: route i uses secret i mod 50.
    for (i, r) in cluster.routes.iter().enumerate() {
        assert_eq!(r.secret, format!("tls-{}", i % 50));
    }
    let store = sim.store();

    // Routes: host, edge termination, external certificate in their own namespace,
    // creation timestamps increasing with the index.
    let mut last_created = String::new();
    for r in &cluster.routes {
        let route = store.get("routes", r.namespace.as_str(), &r.route).unwrap();
        assert_eq!(route["spec"]["host"], r.host.as_str());
        assert_eq!(route["spec"]["tls"]["termination"], "edge");
        assert_eq!(
            route["spec"]["tls"]["externalCertificate"]["name"],
            r.secret.as_str()
        );
        let created = route["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .to_string();
        let parsed: jiff::Timestamp = created.parse().unwrap();
        if !last_created.is_empty() {
            assert!(
                parsed > last_created.parse::<jiff::Timestamp>().unwrap(),
                "{created} after {last_created}"
            );
        }
        last_created = created;
    }

    // Secrets: kubernetes.io/tls, leaf then CA, leaf signed by the CA, SANs cover the
    // hosts of the routes using it, key matches the leaf.
    let ca_pem = ::pem::parse(cluster.ca_pem.as_bytes()).unwrap();
    let (_, ca) = X509Certificate::from_der(ca_pem.contents()).unwrap();
    let mut hosts_by_secret: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in &cluster.routes {
        hosts_by_secret
            .entry((r.namespace.clone(), r.secret.clone()))
            .or_default()
            .insert(r.host.clone());
    }
    for ((ns, name), hosts) in &hosts_by_secret {
        let secret = store.get("secrets", ns.as_str(), name).unwrap();
        assert_eq!(secret["type"], "kubernetes.io/tls");
        let chain = ::pem::parse_many(decode(&secret["data"]["tls.crt"])).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(
            chain[1].contents(),
            ca_pem.contents(),
            "the CA follows the leaf"
        );
        let (_, leaf) = X509Certificate::from_der(chain[0].contents()).unwrap();
        leaf.verify_signature(Some(ca.public_key())).unwrap();
        assert_eq!(leaf.issuer(), ca.subject());
        assert!(leaf.validity().is_valid());
        let sans: BTreeSet<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .filter_map(|g| match g {
                GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        assert!(hosts.is_subset(&sans), "{hosts:?} not in {sans:?}");
        let key_pem = String::from_utf8(decode(&secret["data"]["tls.key"])).unwrap();
        let key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
        assert_eq!(
            key.public_key_raw(),
            leaf.public_key().subject_public_key.data.as_ref()
        );
    }

    // Namespaces carry the shard label.
    for (k, ns) in cluster.namespaces.iter().enumerate() {
        let n = store.get("namespaces", "", ns).unwrap();
        assert_eq!(n["metadata"]["labels"][SHARD_LABEL], (k % 2).to_string());
    }

    // RBAC: per namespace exactly the secrets its routes use.
    for ns in &cluster.namespaces {
        let role = store
            .get("roles", ns.as_str(), ROUTER_SECRETS_ROLE)
            .unwrap();
        let names: BTreeSet<String> = role["rules"][0]["resourceNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let expected: BTreeSet<String> = cluster
            .routes
            .iter()
            .filter(|r| &r.namespace == ns)
            .map(|r| r.secret.clone())
            .collect();
        assert_eq!(names, expected);
    }
    let router = sim.client("router").await.unwrap();
    let r0 = &cluster.routes[0];
    let secrets: Api<Secret> = Api::namespaced(router.clone(), &r0.namespace);
    secrets.get(&r0.secret).await.unwrap();
    let foreign = cluster
        .routes
        .iter()
        .find(|r| r.namespace != r0.namespace)
        .unwrap();
    let there: Api<Secret> = Api::namespaced(router, &foreign.namespace);
    there.get(&foreign.secret).await.unwrap();
    let err = secrets.get(&foreign.secret).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403 || s.code == 404),
        "{err:?}"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fewer_secrets_than_namespaces_and_spec_parsing() {
    let sim = start().await;
    let spec: GenerateSpec = "routes=9,namespaces=5,secrets=3,host={route}.apps.test,shards=3"
        .parse()
        .unwrap();
    assert_eq!(
        (spec.routes, spec.namespaces, spec.secrets, spec.shards),
        (9, 5, Some(3), 3)
    );
    let cluster = sim.generate(&spec).unwrap();
    let used: BTreeSet<&str> = cluster
        .routes
        .iter()
        .map(|r| r.namespace.as_str())
        .collect();
    assert_eq!(used.len(), 3);
    for ns in &cluster.namespaces {
        let role = sim.store().get("roles", ns.as_str(), ROUTER_SECRETS_ROLE);
        assert_eq!(
            role.is_some(),
            used.contains(ns.as_str()),
            "no empty (all-granting) Role in {ns}"
        );
    }
    assert_eq!(cluster.routes[4].host, "route-4.apps.test");
    assert!("routes=x".parse::<GenerateSpec>().is_err());
    assert!("colour=blue".parse::<GenerateSpec>().is_err());
    assert!(
        sim.generate(&GenerateSpec {
            namespaces: 0,
            ..GenerateSpec::new(1, 1)
        })
        .is_err()
    );
    let bad_host = GenerateSpec {
        host_pattern: "Bad_{route}".into(),
        ..GenerateSpec::new(1, 1)
    };
    assert!(
        sim.generate(&bad_host)
            .unwrap_err()
            .to_string()
            .contains("host pattern")
    );
    sim.shutdown().await;
}

/// `endpoints=true`: every route's service exists with one ready endpoint on the port
/// the route targets; without it there are none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_get_a_service_and_an_endpoint_on_request() {
    let sim = start().await;
    let spec: GenerateSpec = "routes=6,namespaces=2,endpoints=true".parse().unwrap();
    assert!(spec.endpoints);
    let cluster = sim.generate(&spec).unwrap();
    let store = sim.store();
    let mut addresses = BTreeSet::new();
    for r in &cluster.routes {
        let route = store.get("routes", r.namespace.as_str(), &r.route).unwrap();
        let service_name = route["spec"]["to"]["name"].as_str().unwrap();
        let target = route["spec"]["port"]["targetPort"].as_str().unwrap();
        let service = store
            .get("services", r.namespace.as_str(), service_name)
            .unwrap();
        assert_eq!(service["spec"]["ports"][0]["targetPort"], target);
        assert_eq!(service["spec"]["clusterIP"], "None", "headless: {service}");
        let slice = store
            .get(
                "endpointslices",
                r.namespace.as_str(),
                &format!("{service_name}-1"),
            )
            .unwrap();
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            service_name
        );
        assert_eq!(slice["ports"][0]["name"], target);
        let endpoints = slice["endpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 1, "{slice}");
        assert_eq!(endpoints[0]["conditions"]["ready"], true);
        addresses.insert(endpoints[0]["addresses"][0].as_str().unwrap().to_owned());
    }
    assert_eq!(addresses.len(), 6, "one address per route: {addresses:?}");

    sim.shutdown().await;

    let sim = start().await;
    let cluster = sim.generate(&GenerateSpec::new(2, 1)).unwrap();
    let r = &cluster.routes[0];
    let route = sim
        .store()
        .get("routes", r.namespace.as_str(), &r.route)
        .unwrap();
    let service_name = route["spec"]["to"]["name"].as_str().unwrap();
    assert!(
        sim.store()
            .get("services", r.namespace.as_str(), service_name)
            .is_none()
    );
    sim.shutdown().await;
}
