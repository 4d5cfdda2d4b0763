//! The installed kubectl (1.27, 1.32 and 1.33) driven as a subprocess against a TLS
//! simulator: get, list, watch, create, apply, delete on secrets and routes, and
//! `auth can-i` as the router.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use kube_sim::{GenerateSpec, SimConfig, Simulator};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const KUBECTL_DIR: &str = "/usr/lib/google-cloud-sdk/bin";

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn new(binary: &str, dir: &Path, sim: &Simulator) -> Kubectl {
        let bin = Path::new(KUBECTL_DIR).join(binary);
        assert!(bin.exists(), "{} is not installed", bin.display());
        let kubeconfig = dir.join(format!("{binary}.kubeconfig"));
        sim.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl {
            bin,
            kubeconfig,
            cache: dir.join(format!("{binary}-cache")),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .env("KUBECACHEDIR", &self.cache)
            .env("HOME", self.cache.parent().unwrap())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Outcome {
        let out = self.command(args).output().await.unwrap();
        Outcome {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert!(o.ok, "kubectl {args:?} failed:\n{}\n{}", o.stdout, o.stderr);
        o.stdout
    }
}

/// Arguments for the admin context.
fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--context", "admin"];
    v.extend_from_slice(extra);
    v
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

async fn scenario(binary: &str) {
    let sim = start_with(SimConfig {
        tls: true,
        ..SimConfig::default()
    })
    .await;
    let cluster = sim.generate(&GenerateSpec::new(2, 1)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(binary, dir.path(), &sim);

    // get / list.
    let out = k.ok(&with(&["get", "namespaces"])).await;
    assert!(out.contains("default") && out.contains("Active"), "{out}");
    // create, get with a Table, get as JSON.
    let out = k
        .ok(&with(&[
            "create",
            "secret",
            "generic",
            "s1",
            "--from-literal=a=b",
            "-n",
            "default",
        ]))
        .await;
    assert!(out.contains("secret/s1 created"), "{out}");
    let out = k.ok(&with(&["get", "secrets", "-n", "default"])).await;
    assert!(
        out.contains("NAME") && out.contains("s1") && out.contains("Opaque"),
        "{out}"
    );
    let out = k
        .ok(&with(&[
            "get",
            "secret",
            "s1",
            "-n",
            "default",
            "-o",
            "jsonpath={.data.a}",
        ]))
        .await;
    assert_eq!(out.trim(), b64("b"));

    // apply a TLS secret, then change it.
    let secret_yaml = |crt: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: tls-applied\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
            b64(crt),
            b64("key")
        )
    };
    let f = write(dir.path(), "secret.yaml", &secret_yaml("one"));
    let out = k.ok(&with(&["apply", "--validate=false", "-f", &f])).await;
    assert!(out.contains("created"), "{out}");
    let f = write(dir.path(), "secret.yaml", &secret_yaml("two"));
    let out = k.ok(&with(&["apply", "--validate=false", "-f", &f])).await;
    assert!(out.contains("configured"), "{out}");
    let stored = sim
        .store()
        .get("secrets", "default", "tls-applied")
        .unwrap();
    assert_eq!(stored["data"]["tls.crt"], b64("two"));

    // apply a route, change its host, get routes.
    let route_yaml = |host: &str| {
        format!(
            "apiVersion: route.openshift.io/v1\nkind: Route\nmetadata:\n  name: web\n  namespace: default\nspec:\n  host: {host}\n  to:\n    kind: Service\n    name: web\n  tls:\n    termination: edge\n    externalCertificate:\n      name: tls-applied\n"
        )
    };
    let rf = write(dir.path(), "route.yaml", &route_yaml("web.example.com"));
    let out = k.ok(&with(&["apply", "--validate=false", "-f", &rf])).await;
    assert!(
        out.contains("route.route.openshift.io/web created"),
        "{out}"
    );
    let rf = write(dir.path(), "route.yaml", &route_yaml("www.example.com"));
    let out = k.ok(&with(&["apply", "--validate=false", "-f", &rf])).await;
    assert!(out.contains("configured"), "{out}");
    let out = k.ok(&with(&["get", "routes", "-n", "default"])).await;
    assert!(
        out.contains("www.example.com") && out.contains("edge"),
        "{out}"
    );
    let out = k
        .ok(&with(&[
            "get",
            "route",
            "web",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.host} {.metadata.generation}",
        ]))
        .await;
    assert_eq!(out.trim(), "www.example.com 2");
    let f2 = write(
        dir.path(),
        "route2.yaml",
        &route_yaml("two.example.com").replace("name: web\n  namespace", "name: web2\n  namespace"),
    );
    let out = k
        .ok(&with(&["create", "--validate=false", "-f", &f2]))
        .await;
    assert!(out.contains("created"), "{out}");
    let out = k.ok(&with(&["get", "routes", "-A", "-o", "name"])).await;
    assert!(out.contains("route.route.openshift.io/web2"), "{out}");

    // watch: a secret created after the watch starts shows up.
    let mut child = k
        .command(&with(&[
            "get",
            "secrets",
            "-n",
            "default",
            "--watch-only",
            "-o",
            "name",
        ]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait until kubectl's watch is open before creating the secret.
    let mut waited = 0;
    while sim.stats().open_watches == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
        assert!(waited < 1500, "kubectl never opened its watch");
    }
    sim.store()
        .create(
            "secrets",
            opaque_secret("default", "watched", &[("x", "y")]),
        )
        .unwrap();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("kubectl printed nothing")
        .unwrap()
        .unwrap();
    assert_eq!(line.trim(), "secret/watched");
    child.kill().await.unwrap();

    // delete.
    let out = k
        .ok(&with(&["delete", "secret", "s1", "-n", "default"]))
        .await;
    assert!(out.contains("secret \"s1\" deleted"), "{out}");
    let out = k.ok(&with(&["delete", "--wait=false", "-f", &rf])).await;
    assert!(out.contains("deleted"), "{out}");
    assert!(sim.store().get("secrets", "default", "s1").is_none());
    assert!(sim.store().get("routes", "default", "web").is_none());
    let o = k
        .run(&with(&["get", "secret", "s1", "-n", "default"]))
        .await;
    assert!(!o.ok && o.stderr.contains("NotFound"), "{}", o.stderr);

    // Typed generators (protobuf bodies since kubectl 1.32): namespace, role, binding.
    k.ok(&with(&["create", "namespace", "team-x"])).await;
    k.ok(&with(&[
        "create",
        "role",
        "reader",
        "--verb=get",
        "--resource=secrets",
        "--resource-name=a",
        "-n",
        "team-x",
    ]))
    .await;
    k.ok(&with(&[
        "create",
        "rolebinding",
        "reader",
        "--role=reader",
        "--user=alice",
        "-n",
        "team-x",
    ]))
    .await;
    let role = sim.store().get("roles", "team-x", "reader").unwrap();
    assert_eq!(role["rules"][0]["resourceNames"][0], "a");
    assert_eq!(role["rules"][0]["verbs"][0], "get");
    let rb = sim.store().get("rolebindings", "team-x", "reader").unwrap();
    assert_eq!(rb["roleRef"]["name"], "reader");
    assert_eq!(rb["roleRef"]["kind"], "Role");
    assert_eq!(rb["subjects"][0]["name"], "alice");
    assert_eq!(
        sim.store().get("namespaces", "", "team-x").unwrap()["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "team-x"
    );

    // The router context: only its own secrets, one by one.
    let mine = &cluster.routes[0];
    let target = format!("secrets/{}", mine.secret);
    let o = k
        .run(&["auth", "can-i", "get", &target, "-n", &mine.namespace])
        .await;
    assert_eq!(o.stdout.trim(), "yes", "{}", o.stderr);
    let o = k
        .run(&["auth", "can-i", "list", "secrets", "-n", &mine.namespace])
        .await;
    assert_eq!(o.stdout.trim(), "no");
    let out = k
        .ok(&[
            "get",
            "secret",
            &mine.secret,
            "-n",
            &mine.namespace,
            "-o",
            "name",
        ])
        .await;
    assert_eq!(out.trim(), format!("secret/{}", mine.secret));
    let o = k.run(&["get", "secrets", "-n", &mine.namespace]).await;
    assert!(!o.ok && o.stderr.contains("is forbidden"), "{}", o.stderr);
    let out = k.ok(&["get", "routes", "-A", "-o", "name"]).await;
    assert!(out.contains(&mine.route), "{out}");

    // Everything went over TLS; kubectl speaks HTTP/2 when ALPN offers it.
    let stats = sim.stats();
    assert!(stats.connections.h2 > 0, "{stats:?}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27() {
    scenario("kubectl.1.27").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32() {
    scenario("kubectl.1.32").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33() {
    scenario("kubectl.1.33").await;
}

/// The kubectl versions between 1.27 and 1.32: get, create, delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_to_1_31_smoke() {
    let sim = start_with(SimConfig {
        tls: true,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    for minor in 28..=31 {
        let binary = format!("kubectl.1.{minor}");
        let k = Kubectl::new(&binary, dir.path(), &sim);
        let name = format!("smoke-{minor}");
        let out = k
            .ok(&with(&[
                "create",
                "secret",
                "generic",
                &name,
                "--from-literal=k=v",
                "-n",
                "default",
            ]))
            .await;
        assert!(out.contains("created"), "{binary}: {out}");
        let out = k.ok(&with(&["get", "secrets", "-n", "default"])).await;
        assert!(out.contains(&name), "{binary}: {out}");
        let out = k
            .ok(&with(&["delete", "secret", &name, "-n", "default"]))
            .await;
        assert!(out.contains("deleted"), "{binary}: {out}");
    }
    sim.shutdown().await;
}
