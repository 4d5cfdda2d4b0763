//! kubectl driven as a subprocess against a TLS simulator: every kubectl installed
//! (each versioned `kubectl.1.N` next to the one on PATH, else that one) runs the same
//! table of commands — get, list, create, apply (validated, as against kube-apiserver,
//! through the OpenAPI documents and server-side field validation), delete on secrets
//! and routes, typed generators (protobuf bodies), `auth can-i` as the router — then a
//! watch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Stdio;

use common::kubectl::{Binary, Kubectl, all_binaries};
use common::*;
use kube_sim::{GenerateSpec, SimConfig};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// What a command must do.
enum Expect {
    /// Succeed, printing every one of these.
    Prints(Vec<String>),
    /// Succeed, printing exactly this (trimmed).
    PrintsExactly(String),
    /// Fail, saying this on standard error.
    FailsWith(&'static str),
    /// Print exactly this, whatever the exit status (`auth can-i` exits 1 for "no").
    Answers(&'static str),
}

/// One kubectl invocation and what it must do.
struct Step {
    args: Vec<String>,
    expect: Expect,
}

fn step<S: AsRef<str>>(args: &[S], expect: Expect) -> Step {
    Step {
        args: args.iter().map(|a| a.as_ref().to_string()).collect(),
        expect,
    }
}

/// Arguments for the admin context.
fn admin(args: &[&str]) -> Vec<String> {
    ["--context", "admin"]
        .iter()
        .chain(args)
        .map(|a| a.to_string())
        .collect()
}

fn prints(words: &[&str]) -> Expect {
    Expect::Prints(words.iter().map(|w| w.to_string()).collect())
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

fn tls_secret_yaml(crt: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: tls-applied\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        b64(crt),
        b64("key")
    )
}

fn route_yaml(name: &str, host: &str) -> String {
    format!(
        "apiVersion: route.openshift.io/v1\nkind: Route\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  host: {host}\n  to:\n    kind: Service\n    name: web\n  tls:\n    termination: edge\n    externalCertificate:\n      name: tls-applied\n"
    )
}

async fn run_steps(k: &Kubectl, steps: &[Step]) {
    for s in steps {
        let args: Vec<&str> = s.args.iter().map(String::as_str).collect();
        let o = k.run(&args).await;
        let context = format!(
            "{} {args:?}\nstdout: {}\nstderr: {}",
            k.binary.name, o.stdout, o.stderr
        );
        match &s.expect {
            Expect::Prints(words) => {
                assert!(o.ok, "failed: {context}");
                for w in words {
                    assert!(o.stdout.contains(w.as_str()), "no {w:?}: {context}");
                }
            }
            Expect::PrintsExactly(text) => {
                assert!(o.ok, "failed: {context}");
                assert_eq!(o.stdout.trim(), text, "{context}");
            }
            Expect::FailsWith(text) => {
                assert!(!o.ok, "succeeded: {context}");
                assert!(o.stderr.contains(text), "no {text:?}: {context}");
            }
            Expect::Answers(text) => assert_eq!(o.stdout.trim(), *text, "{context}"),
        }
    }
}

async fn scenario(binary: Binary) {
    let sim = start_with(SimConfig {
        tls: true,
        ..SimConfig::default()
    })
    .await;
    let cluster = sim.generate(&GenerateSpec::new(2, 1)).unwrap();
    let mine = &cluster.routes[0];
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(binary, dir.path(), &sim);
    let secret_one = write(dir.path(), "secret-1.yaml", &tls_secret_yaml("one"));
    let secret_two = write(dir.path(), "secret-2.yaml", &tls_secret_yaml("two"));
    let route_a = write(
        dir.path(),
        "route-a.yaml",
        &route_yaml("web", "web.example.com"),
    );
    let route_b = write(
        dir.path(),
        "route-b.yaml",
        &route_yaml("web", "www.example.com"),
    );
    let route_2 = write(
        dir.path(),
        "route-2.yaml",
        &route_yaml("web2", "two.example.com"),
    );
    // Objects with a field their schema does not have: kubectl leaves validation to
    // the server (the OpenAPI documents say it validates fields), which refuses them.
    let bad = [
        (
            "bad-secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bad\n  namespace: default\nstringData:\n  a: b\nbogus: 1\n",
            "Secret in version \"v1\" cannot be handled as a Secret: strict decoding error: unknown field \"bogus\"",
        ),
        (
            "bad-route.yaml",
            &route_yaml("bad", "bad.example.com")
                .replace("termination: edge", "termination: edge\n    bogus: 1"),
            "Route in version \"v1\" cannot be handled as a Route: strict decoding error: unknown field \"spec.tls.bogus\"",
        ),
        (
            "bad-namespace.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: bad\nspec:\n  bogus: []\n",
            "Namespace in version \"v1\" cannot be handled as a Namespace: strict decoding error: unknown field \"spec.bogus\"",
        ),
        (
            "bad-role.yaml",
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: bad\n  namespace: default\nrules:\n- apiGroups: [\"\"]\n  resources: [secrets]\n  verbs: [get]\n  nope: true\n",
            "Role in version \"v1\" cannot be handled as a Role: strict decoding error: unknown field \"rules[0].nope\"",
        ),
    ];
    let bad_files: Vec<(String, &str)> = bad
        .iter()
        .map(|(name, text, message)| (write(dir.path(), name, text), *message))
        .collect();
    let router_secret = format!("secrets/{}", mine.secret);
    let ns = mine.namespace.as_str();

    let steps = [
        step(
            &admin(&["get", "namespaces"]),
            prints(&["default", "Active"]),
        ),
        step(
            &admin(&[
                "create",
                "secret",
                "generic",
                "s1",
                "--from-literal=a=b",
                "-n",
                "default",
            ]),
            prints(&["secret/s1 created"]),
        ),
        step(
            &admin(&["get", "secrets", "-n", "default"]),
            prints(&["NAME", "s1", "Opaque"]),
        ),
        step(
            &admin(&[
                "get",
                "secret",
                "s1",
                "-n",
                "default",
                "-o",
                "jsonpath={.data.a}",
            ]),
            Expect::PrintsExactly(b64("b")),
        ),
        step(&admin(&["apply", "-f", &secret_one]), prints(&["created"])),
        step(
            &admin(&["apply", "-f", &secret_two]),
            prints(&["configured"]),
        ),
        step(
            &admin(&["apply", "-f", &route_a]),
            prints(&["route.route.openshift.io/web created"]),
        ),
        step(&admin(&["apply", "-f", &route_b]), prints(&["configured"])),
        step(
            &admin(&["get", "routes", "-n", "default"]),
            prints(&["www.example.com", "edge"]),
        ),
        step(
            &admin(&[
                "get",
                "route",
                "web",
                "-n",
                "default",
                "-o",
                "jsonpath={.spec.host} {.metadata.generation}",
            ]),
            Expect::PrintsExactly("www.example.com 2".to_string()),
        ),
        step(&admin(&["create", "-f", &route_2]), prints(&["created"])),
        step(
            &admin(&["get", "routes", "-A", "-o", "name"]),
            prints(&["route.route.openshift.io/web2"]),
        ),
        step(
            &admin(&["delete", "secret", "s1", "-n", "default"]),
            prints(&["secret \"s1\" deleted"]),
        ),
        step(
            &admin(&["delete", "--wait=false", "-f", &route_a]),
            prints(&["deleted"]),
        ),
        step(
            &admin(&["get", "secret", "s1", "-n", "default"]),
            Expect::FailsWith("NotFound"),
        ),
        // Typed generators (protobuf bodies since kubectl 1.32).
        step(
            &admin(&["create", "namespace", "team-x"]),
            prints(&["created"]),
        ),
        step(
            &admin(&[
                "create",
                "role",
                "reader",
                "--verb=get",
                "--resource=secrets",
                "--resource-name=a",
                "-n",
                "team-x",
            ]),
            prints(&["created"]),
        ),
        step(
            &admin(&[
                "create",
                "rolebinding",
                "reader",
                "--role=reader",
                "--user=alice",
                "-n",
                "team-x",
            ]),
            prints(&["created"]),
        ),
        // The router context: only its own secrets, one by one.
        step(
            &["auth", "can-i", "get", &router_secret, "-n", ns],
            Expect::Answers("yes"),
        ),
        step(
            &["auth", "can-i", "list", "secrets", "-n", ns],
            Expect::Answers("no"),
        ),
        step(
            &["get", "secret", &mine.secret, "-n", ns, "-o", "name"],
            Expect::PrintsExactly(format!("secret/{}", mine.secret)),
        ),
        step(
            &["get", "secrets", "-n", ns],
            Expect::FailsWith("is forbidden"),
        ),
        step(
            &["get", "routes", "-A", "-o", "name"],
            prints(&[&mine.route]),
        ),
    ];
    run_steps(&k, &steps).await;
    for (file, message) in &bad_files {
        let o = k.run(&["--context", "admin", "apply", "-f", file]).await;
        assert!(!o.ok, "{}: {file} was accepted", k.binary.name);
        assert!(
            o.stderr.contains(&format!(
                "Error from server (BadRequest): error when creating \"{file}\": {message}"
            )),
            "{}: {}",
            k.binary.name,
            o.stderr
        );
    }
    for (resource, namespace) in [
        ("secrets", "default"),
        ("routes", "default"),
        ("namespaces", ""),
        ("roles", "default"),
    ] {
        assert!(
            sim.store().get(resource, namespace, "bad").is_none(),
            "{resource} stored"
        );
    }

    // What the commands stored, field by field.
    let store = sim.store();
    let stored: [(&str, &str, &str, &str, Value); 7] = [
        (
            "secrets",
            "default",
            "tls-applied",
            "/data/tls.crt",
            b64("two").into(),
        ),
        (
            "roles",
            "team-x",
            "reader",
            "/rules/0/resourceNames/0",
            "a".into(),
        ),
        (
            "roles",
            "team-x",
            "reader",
            "/rules/0/verbs/0",
            "get".into(),
        ),
        (
            "rolebindings",
            "team-x",
            "reader",
            "/roleRef/name",
            "reader".into(),
        ),
        (
            "rolebindings",
            "team-x",
            "reader",
            "/roleRef/kind",
            "Role".into(),
        ),
        (
            "rolebindings",
            "team-x",
            "reader",
            "/subjects/0/name",
            "alice".into(),
        ),
        (
            "namespaces",
            "",
            "team-x",
            "/metadata/labels/kubernetes.io~1metadata.name",
            "team-x".into(),
        ),
    ];
    for (resource, namespace, name, pointer, want) in stored {
        let object = store
            .get(resource, namespace, name)
            .unwrap_or_else(|| panic!("{}: {resource} {namespace}/{name} missing", k.binary.name));
        assert_eq!(
            object.pointer(pointer),
            Some(&want),
            "{resource} {name} {pointer}"
        );
    }
    assert!(store.get("secrets", "default", "s1").is_none());
    assert!(store.get("routes", "default", "web").is_none());

    // Watch: a secret created after kubectl's watch is open shows up.
    let mut child = k
        .command(&[
            "--context",
            "admin",
            "get",
            "secrets",
            "-n",
            "default",
            "--watch-only",
            "-o",
            "name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    stats_reach(&sim, "kubectl's watch is open", |s| s.open_watches == 1).await;
    store
        .create(
            "secrets",
            opaque_secret("default", "watched", &[("x", "y")]),
        )
        .unwrap();
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("kubectl printed nothing")
        .unwrap()
        .unwrap();
    assert_eq!(line.trim(), "secret/watched");
    child.kill().await.unwrap();

    // Everything went over TLS; kubectl speaks HTTP/2 when ALPN offers it.
    assert!(sim.stats().connections.h2 > 0, "{:?}", sim.stats());
    sim.shutdown().await;
}

/// Every installed kubectl runs the whole scenario, each against its own simulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_installed_kubectl_runs_the_scenario() {
    let binaries = all_binaries();
    let names: Vec<String> = binaries.iter().map(|b| b.name.clone()).collect();
    eprintln!("kubectl binaries: {names:?}");
    futures::future::join_all(binaries.into_iter().map(scenario)).await;
}
