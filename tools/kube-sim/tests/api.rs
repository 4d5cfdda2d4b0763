//! The API through kube-rs's `Api` and raw requests: CRUD, error Status objects,
//! the routes status subresource, namespaces, pagination, RBAC and access reviews.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use http::Method;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube_sim::{GenerateSpec, ROUTER_USER, Simulator};
use serde_json::{Value, json};

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_crud_and_conflicts() {
    let sim = start().await;
    let client = sim.client("admin").await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");

    let created: Secret = secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(opaque_secret("default", "s1", &[("a", "1")])).unwrap(),
        )
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.as_ref().is_some_and(|u| !u.is_empty()));
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_ref().unwrap().parse().unwrap();

    // Create of an existing name: 409 AlreadyExists.
    let dup = secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(opaque_secret("default", "s1", &[])).unwrap(),
        )
        .await
        .unwrap_err();
    let st = api_err(dup);
    assert_eq!((st.code, st.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(st.message, "secrets \"s1\" already exists");

    // Update with the current resourceVersion works and bumps it.
    let mut s = secrets.get("s1").await.unwrap();
    s.string_data = Some([("b".to_string(), "2".to_string())].into());
    let updated = secrets
        .replace("s1", &PostParams::default(), &s)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);
    assert_eq!(
        updated.data.as_ref().unwrap().len(),
        2,
        "stringData merged into data"
    );
    assert_eq!(updated.metadata.uid, created.metadata.uid);

    // The stale object now conflicts.
    let stale = secrets
        .replace("s1", &PostParams::default(), &s)
        .await
        .unwrap_err();
    let st = api_err(stale);
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"));
    assert!(
        st.message.contains("the object has been modified"),
        "{}",
        st.message
    );

    // A no-op update does not take a new resourceVersion.
    let same = secrets
        .replace("s1", &PostParams::default(), &updated)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        updated.metadata.resource_version
    );

    // Every patch type, each changing the data the way its type defines.
    let patches: [(&str, Patch<Value>, usize); 3] = [
        (
            "merge",
            Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
            2,
        ),
        (
            "strategic merge",
            Patch::Strategic(json!({"data": {"c": b64("3")}})),
            3,
        ),
        (
            "JSON",
            Patch::Json(
                serde_json::from_value(json!([{"op": "remove", "path": "/data/c"}])).unwrap(),
            ),
            2,
        ),
    ];
    for (kind, patch, keys) in patches {
        let p = secrets
            .patch("s1", &PatchParams::default(), &patch)
            .await
            .unwrap_or_else(|e| panic!("{kind} patch: {e}"));
        assert_eq!(p.data.unwrap().len(), keys, "{kind} patch");
        assert_eq!(p.metadata.labels.unwrap()["x"], "1", "{kind} patch");
    }
    // Server-side apply creates and updates.
    let applied = secrets
        .patch(
            "s2",
            &PatchParams::apply("test"),
            &Patch::Apply(opaque_secret("default", "s2", &[("k", "v")])),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.name.as_deref(), Some("s2"));

    // Delete returns a Success Status and a later get is 404 NotFound.
    let deleted = secrets
        .delete("s1", &DeleteParams::default())
        .await
        .unwrap();
    assert!(deleted.is_right());
    let st = api_err(secrets.get("s1").await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (404, "NotFound"));
    assert_eq!(st.message, "secrets \"s1\" not found");
    let st = api_err(
        secrets
            .delete("s1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 404);

    // Patch of a missing object is 404; a namespace that does not exist is 404.
    let st = api_err(
        secrets
            .patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 404);
    let elsewhere: Api<Secret> = Api::namespaced(client, "no-such-ns");
    let st = api_err(
        elsewhere
            .create(
                &PostParams::default(),
                &serde_json::from_value(opaque_secret("no-such-ns", "x", &[])).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(st.message, "namespaces \"no-such-ns\" not found");
    sim.shutdown().await;
}

/// A body refused on create: the code, and a part of the message it must carry.
struct Refusal {
    what: &'static str,
    body: Value,
    code: u16,
    message: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_get_422_without_leaking_data() {
    let sim = start().await;
    let client = sim.client("admin").await.unwrap();
    let big = "x".repeat(1024 * 1024 + 1);
    let refusals = [
        Refusal {
            what: "kubernetes.io/tls without tls.key",
            body: json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t"},
                "type": "kubernetes.io/tls", "data": {"tls.crt": b64("c")}}),
            code: 422,
            message: "Secret \"t\" is invalid: data[tls.key]: Required value",
        },
        Refusal {
            what: "data that is not base64",
            body: json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "u"},
                "data": {"k": "%%%SECRET-BYTES%%%"}}),
            code: 422,
            message: "",
        },
        Refusal {
            what: "over 1 MiB",
            body: opaque_secret("default", "big", &[("big", &big)]),
            code: 422,
            message: "data: Too long",
        },
        Refusal {
            what: "an invalid name",
            body: opaque_secret("default", "Not_Valid", &[]),
            code: 422,
            message: "metadata.name: Invalid value: \"Not_Valid\"",
        },
        Refusal {
            what: "a namespace in the body that differs from the URL's",
            body: opaque_secret("other", "n", &[]),
            code: 400,
            message: "does not match the namespace",
        },
        Refusal {
            what: "the wrong kind for the endpoint",
            body: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            code: 400,
            message: "ConfigMap",
        },
    ];
    for r in refusals {
        let (code, _, status) = raw(
            &client,
            Method::POST,
            "/api/v1/namespaces/default/secrets",
            Some(r.body),
            "application/json",
        )
        .await;
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            code == r.code && message.contains(r.message),
            "{}: {code} {status}",
            r.what
        );
        assert!(
            !status.to_string().contains("SECRET-BYTES"),
            "{}: data echoed",
            r.what
        );
        assert_eq!(status["kind"], "Status", "{}", r.what);
    }
    let tls = sim.store().list("secrets", "default");
    assert!(tls.is_empty(), "nothing refused was stored: {tls:?}");

    // The type of a secret is immutable.
    sim.store()
        .create("secrets", opaque_secret("default", "typed", &[("a", "b")]))
        .unwrap();
    let mut changed = sim.store().get("secrets", "default", "typed").unwrap();
    changed["type"] = json!("kubernetes.io/tls");
    changed["data"] = json!({"tls.crt": b64("c"), "tls.key": b64("k")});
    let (code, _, st) = raw(
        &client,
        Method::PUT,
        "/api/v1/namespaces/default/secrets/typed",
        Some(changed),
        "application/json",
    )
    .await;
    assert_eq!(code, 422);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("type: Invalid value")
    );
    // ...but insert_unchecked models objects a real server would refuse.
    sim.store()
        .insert_unchecked(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "namespace": "default"},
            "type": "kubernetes.io/tls", "data": {"tls.crt": b64("c")}}))
        .unwrap();
    let (code, v) = get(&client, "/api/v1/namespaces/default/secrets/t").await;
    assert_eq!((code, v["type"].as_str()), (200, Some("kubernetes.io/tls")));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_status_subresource_and_generation() {
    let sim = start().await;
    let client = sim.client("admin").await.unwrap();
    let routes = routes(client.clone(), "default");
    let mut r: DynamicObject =
        serde_json::from_value(route("default", "r1", "a.example.com", "s1")).unwrap();
    r.data["status"] = json!({"ingress": [{"host": "ignored"}]});
    let created = routes.create(&PostParams::default(), &r).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.data["status"],
        json!({}),
        "status is not settable on create"
    );
    assert_eq!(created.data["spec"]["wildcardPolicy"], "None");

    // PUT on the main resource ignores status changes, bumps generation on spec change.
    let mut changed = created.clone();
    changed.data["spec"]["host"] = json!("b.example.com");
    changed.data["status"] = json!({"ingress": [{"routerName": "x"}]});
    let updated = routes
        .replace("r1", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    assert_eq!(updated.data["spec"]["host"], "b.example.com");
    assert_eq!(updated.data["status"], json!({}));

    // PUT on /status changes only status, and not the generation.
    let mut status_update = updated.clone();
    status_update.data["spec"]["host"] = json!("c.example.com");
    status_update.data["status"] = json!({"ingress": [{"routerName": "default", "host": "b.example.com",
        "conditions": [{"type": "Admitted", "status": "False", "reason": "ExternalCertificateValidationFailed"}]}]});
    let st = routes
        .replace_status("r1", &PostParams::default(), &status_update)
        .await
        .unwrap();
    assert_eq!(st.data["spec"]["host"], "b.example.com");
    assert_eq!(st.data["status"]["ingress"][0]["routerName"], "default");
    assert_eq!(st.metadata.generation, Some(2));
    // Merge patch on /status.
    let st = routes
        .patch_status(
            "r1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ingress": []}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["ingress"], json!([]));
    // Invalid route spec: 422.
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"name": "bad"},
        "spec": {"host": "x.example.com", "tls": {"termination": "passthrough", "externalCertificate": {"name": "s"}}}}))
    .unwrap();
    let st = api_err(
        routes
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    assert!(
        st.message
            .starts_with("Route.route.openshift.io \"bad\" is invalid"),
        "{}",
        st.message
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_with_labels_and_cascading_delete() {
    let sim = start().await;
    let client = sim.client("admin").await.unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": "team-a", "labels": {"certwatch.io/shard": "1"}}}),
    )
    .unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let got = nss.get("team-a").await.unwrap();
    assert_eq!(
        got.metadata.labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
        "team-a"
    );
    let sharded = nss
        .list(&ListParams::default().labels("certwatch.io/shard=1"))
        .await
        .unwrap();
    assert_eq!(sharded.items.len(), 1);
    sim.store()
        .create("secrets", opaque_secret("team-a", "inside", &[]))
        .unwrap();
    nss.delete("team-a", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        sim.store().get("secrets", "team-a", "inside").is_none(),
        "contents deleted with the namespace"
    );
    assert!(sim.store().get("namespaces", "", "team-a").is_none());
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_is_consistent_and_expires() {
    let sim = start().await;
    for i in 0..25 {
        sim.store()
            .create(
                "secrets",
                opaque_secret("default", &format!("s{i:02}"), &[]),
            )
            .unwrap();
    }
    let client = sim.client("admin").await.unwrap();
    let (code, page1) = get(&client, "/api/v1/namespaces/default/secrets?limit=10").await;
    assert_eq!(code, 200);
    assert_eq!(page1["items"].as_array().unwrap().len(), 10);
    assert_eq!(page1["metadata"]["remainingItemCount"], 15);
    let rv = page1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let cont = page1["metadata"]["continue"].as_str().unwrap().to_string();
    // Writes after the first page do not show up in later pages (consistent snapshot).
    sim.store().delete("secrets", "default", "s15").unwrap();
    sim.store()
        .create("secrets", opaque_secret("default", "s99", &[]))
        .unwrap();
    let mut names: Vec<String> = Vec::new();
    let mut next = Some(cont);
    let mut pages = 1;
    names.extend(
        page1["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
    );
    while let Some(c) = next {
        let (code, page) = get(
            &client,
            &format!("/api/v1/namespaces/default/secrets?limit=10&continue={c}"),
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(page["metadata"]["resourceVersion"].as_str().unwrap(), rv);
        names.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        next = page["metadata"]["continue"].as_str().map(str::to_string);
        pages += 1;
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("s{i:02}")).collect();
    assert_eq!(names, expected);

    // kube's list with a limit walks the pages the same way.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let all = secrets.list(&ListParams::default().limit(7)).await.unwrap();
    assert_eq!(all.items.len(), 7);

    // An exact list at an old resourceVersion, then after compaction: 410.
    let (code, exact) = get(
        &client,
        &format!(
            "/api/v1/namespaces/default/secrets?resourceVersion={rv}&resourceVersionMatch=Exact"
        ),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(exact["items"].as_array().unwrap().len(), 25);
    let (_, page) = get(&client, "/api/v1/namespaces/default/secrets?limit=5").await;
    let stale_continue = page["metadata"]["continue"].as_str().unwrap().to_string();
    sim.store()
        .create("secrets", opaque_secret("default", "later", &[]))
        .unwrap();
    sim.faults().compact_history();
    let (code, st) = get(
        &client,
        &format!(
            "/api/v1/namespaces/default/secrets?resourceVersion={rv}&resourceVersionMatch=Exact"
        ),
    )
    .await;
    assert_eq!((code, st["reason"].as_str()), (410, Some("Expired")));
    let (code, st) = get(
        &client,
        &format!("/api/v1/namespaces/default/secrets?limit=5&continue={stale_continue}"),
    )
    .await;
    assert_eq!((code, st["reason"].as_str()), (410, Some("Expired")));
    // Parameter validation as in kube-apiserver.
    let refused = [
        ("resourceVersionMatch=Exact", 422, "Invalid"),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            422,
            "Invalid",
        ),
        (
            "resourceVersionMatch=Newest&resourceVersion=1",
            422,
            "Invalid",
        ),
        ("sendInitialEvents=true", 422, "Invalid"),
        ("continue=garbage", 400, "BadRequest"),
        ("fieldSelector=spec.nope%3Dx", 400, "BadRequest"),
        ("labelSelector=a%20in", 400, "BadRequest"),
        ("limit=x", 400, "BadRequest"),
        (
            "watch=true&resourceVersionMatch=NotOlderThan",
            422,
            "Invalid",
        ),
        ("watch=true&sendInitialEvents=true", 422, "Invalid"),
    ];
    for (query, want, reason) in refused {
        let (code, st) = get(
            &client,
            &format!("/api/v1/namespaces/default/secrets?{query}"),
        )
        .await;
        assert_eq!(
            (code, st["reason"].as_str()),
            (want, Some(reason)),
            "{query}: {st}"
        );
    }
    sim.shutdown().await;
}

/// A 403 `Status` exactly as kube-apiserver writes it.
fn forbidden(message: String, details: Value) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Forbidden", "details": details, "code": 403,
    })
}

/// One request by the router and the answer it must get: a code, and for a 403 the
/// whole `Status`.
struct Access {
    what: &'static str,
    method: Method,
    path: String,
    body: Option<Value>,
    code: u16,
    status: Option<Value>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_by_resource_names_and_403_messages_as_kube_apiserver_writes_them() {
    let sim = start().await;
    let cluster = sim.generate(&GenerateSpec::new(6, 2)).unwrap();
    let mine = &cluster.routes[0];
    let (ns, secret, route_name) = (&mine.namespace, &mine.secret, &mine.route);
    sim.store()
        .create("secrets", opaque_secret(ns, "other", &[]))
        .unwrap();
    let route_object = sim.store().get("routes", ns.as_str(), route_name).unwrap();
    let router = sim.client("router").await.unwrap();
    let user = ROUTER_USER;
    let cannot = |verb: &str, resource: &str, group: &str| {
        format!(
            "User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" in the namespace \"{ns}\""
        )
    };
    let secrets = format!("/api/v1/namespaces/{ns}/secrets");
    let allowed = |what, method, path: String, body| Access {
        what,
        method,
        path,
        body,
        code: 200,
        status: None,
    };
    let denied = |what, method, path: String, status| Access {
        what,
        method,
        path,
        body: None,
        code: 403,
        status: Some(status),
    };
    let cases = [
        allowed(
            "get its own secret",
            Method::GET,
            format!("{secrets}/{secret}"),
            None,
        ),
        allowed(
            "list its own secret by name",
            Method::GET,
            format!("{secrets}?fieldSelector=metadata.name%3D{secret}"),
            None,
        ),
        allowed(
            "watch its own secret by name",
            Method::GET,
            format!("{secrets}?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3D{secret}"),
            None,
        ),
        denied(
            "list without a name",
            Method::GET,
            secrets.clone(),
            forbidden(
                format!("secrets is forbidden: {}", cannot("list", "secrets", "")),
                json!({"kind": "secrets"}),
            ),
        ),
        denied(
            "get a secret it was not granted",
            Method::GET,
            format!("{secrets}/other"),
            forbidden(
                format!(
                    "secrets \"other\" is forbidden: {}",
                    cannot("get", "secrets", "")
                ),
                json!({"name": "other", "kind": "secrets"}),
            ),
        ),
        denied(
            "list it by name: the selector names the object",
            Method::GET,
            format!("{secrets}?fieldSelector=metadata.name%3Dother"),
            forbidden(
                format!(
                    "secrets \"other\" is forbidden: {}",
                    cannot("list", "secrets", "")
                ),
                json!({"name": "other", "kind": "secrets"}),
            ),
        ),
        denied(
            "watch it by name, with another term",
            Method::GET,
            format!("{secrets}?watch=true&fieldSelector=metadata.name%3D%3Dother,type%3DOpaque"),
            forbidden(
                format!(
                    "secrets \"other\" is forbidden: {}",
                    cannot("watch", "secrets", "")
                ),
                json!({"name": "other", "kind": "secrets"}),
            ),
        ),
        denied(
            "a != selector names nothing",
            Method::GET,
            format!("{secrets}?fieldSelector=metadata.name!%3Dother"),
            forbidden(
                format!("secrets is forbidden: {}", cannot("list", "secrets", "")),
                json!({"kind": "secrets"}),
            ),
        ),
        denied(
            "deletecollection by name: the selector does not name it",
            Method::DELETE,
            format!("{secrets}?fieldSelector=metadata.name%3D{secret}"),
            forbidden(
                format!(
                    "secrets is forbidden: {}",
                    cannot("deletecollection", "secrets", "")
                ),
                json!({"kind": "secrets"}),
            ),
        ),
        denied(
            "list in every namespace",
            Method::GET,
            "/api/v1/secrets".to_string(),
            forbidden(
                format!(
                    "secrets is forbidden: User \"{user}\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
                ),
                json!({"kind": "secrets"}),
            ),
        ),
        denied(
            "delete a namespace: a request in that namespace",
            Method::DELETE,
            format!("/api/v1/namespaces/{ns}"),
            forbidden(
                format!(
                    "namespaces \"{ns}\" is forbidden: {}",
                    cannot("delete", "namespaces", "")
                ),
                json!({"name": ns, "kind": "namespaces"}),
            ),
        ),
        allowed(
            "list routes everywhere",
            Method::GET,
            "/apis/route.openshift.io/v1/routes".to_string(),
            None,
        ),
        allowed(
            "update a route's status",
            Method::PUT,
            format!("/apis/route.openshift.io/v1/namespaces/{ns}/routes/{route_name}/status"),
            Some(route_object.clone()),
        ),
        Access {
            body: Some(route_object.clone()),
            ..denied(
                "update a route's spec",
                Method::PUT,
                format!("/apis/route.openshift.io/v1/namespaces/{ns}/routes/{route_name}"),
                forbidden(
                    format!(
                        "routes.route.openshift.io \"{route_name}\" is forbidden: {}",
                        cannot("update", "routes", "route.openshift.io")
                    ),
                    json!({"name": route_name, "group": "route.openshift.io", "kind": "routes"}),
                ),
            )
        },
        Access {
            body: Some(
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
                "spec": {"user": "x", "resourceAttributes": {"verb": "get", "resource": "secrets"}}}),
            ),
            ..denied(
                "review another identity in a namespace",
                Method::POST,
                format!("/apis/authorization.k8s.io/v1/namespaces/{ns}/localsubjectaccessreviews"),
                forbidden(
                    format!(
                        "localsubjectaccessreviews.authorization.k8s.io is forbidden: {}",
                        cannot(
                            "create",
                            "localsubjectaccessreviews",
                            "authorization.k8s.io"
                        )
                    ),
                    json!({"group": "authorization.k8s.io", "kind": "localsubjectaccessreviews"}),
                ),
            )
        },
        denied(
            "read a non-resource path it was not granted",
            Method::GET,
            "/metrics".to_string(),
            forbidden(
                format!("forbidden: User \"{user}\" cannot get path \"/metrics\""),
                json!({}),
            ),
        ),
    ];
    for case in cases {
        let (code, _, status) = raw(
            &router,
            case.method.clone(),
            &case.path,
            case.body.clone(),
            "application/json",
        )
        .await;
        assert_eq!(code, case.code, "{}: {status}", case.what);
        if let Some(want) = &case.status {
            assert_eq!(&status, want, "{}", case.what);
        }
    }

    // RBAC edits take effect at once: granting "other" allows it...
    let other = format!("{secrets}/other");
    sim.grant_router_secrets(ns, &["other"]).unwrap();
    assert_eq!(get(&router, &other).await.0, 200);
    // ...and deleting the binding takes every grant away.
    sim.store()
        .delete("rolebindings", ns.as_str(), kube_sim::ROUTER_SECRETS_ROLE)
        .unwrap();
    assert_eq!(get(&router, &format!("{secrets}/{secret}")).await.0, 403);

    // Unknown or missing tokens: 401 Status.
    let mut config = sim.client_config("router").await.unwrap();
    config.auth_info.token = Some("not-a-token".to_string().into());
    let stranger = kube::Client::try_from(config).unwrap();
    let (code, st) = get(&stranger, "/api/v1/namespaces/default/secrets").await;
    assert_eq!(
        (code, st["kind"].as_str(), st["reason"].as_str()),
        (401, Some("Status"), Some("Unauthorized"))
    );
    let log = sim.request_log();
    assert!(
        log.iter()
            .any(|r| r.code == 401 && r.user == "system:anonymous")
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_reviews_answer_from_rbac() {
    let sim = start().await;
    let cluster = sim.generate(&GenerateSpec::new(2, 1)).unwrap();
    let mine = &cluster.routes[0];
    let router = sim.client("router").await.unwrap();
    let sar = |verb: &str, name: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(ROUTER_USER.to_string()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(mine.namespace.clone()),
                verb: Some(verb.to_string()),
                resource: Some("secrets".to_string()),
                name: Some(name.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let sars: Api<SubjectAccessReview> = Api::all(router.clone());
    // As Kubernetes answers SARs, list/watch with a name is allowed by resourceNames.
    for verb in ["get", "list", "watch"] {
        let r = sars
            .create(&PostParams::default(), &sar(verb, &mine.secret))
            .await
            .unwrap();
        let status = r.status.unwrap();
        assert!(status.allowed, "{verb}");
        // The reason names binding, role and subject as kube-apiserver's RBAC does.
        assert_eq!(
            status.reason.as_deref(),
            Some(
                format!(
                    "RBAC: allowed by RoleBinding \"certwatch-router-secrets/{}\" of Role \"certwatch-router-secrets\" to ServiceAccount \"router/openshift-ingress\"",
                    mine.namespace
                )
                .as_str()
            ),
            "{verb}"
        );
    }
    let r = sars
        .create(&PostParams::default(), &sar("get", "not-mine"))
        .await
        .unwrap();
    let status = r.status.unwrap();
    assert!(!status.allowed);
    assert_eq!(status.reason, None, "a denial carries no reason");
    let r = sars
        .create(&PostParams::default(), &sar("list", ""))
        .await
        .unwrap();
    assert!(!r.status.unwrap().allowed);
    // Self reviews.
    let ssars: Api<SelfSubjectAccessReview> = Api::all(router.clone());
    let r = ssars
        .create(
            &PostParams::default(),
            &SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some("update".into()),
                        group: Some("route.openshift.io".into()),
                        resource: Some("routes".into()),
                        subresource: Some("status".into()),
                        namespace: Some(mine.namespace.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.status.unwrap().allowed);
    let rules: Api<SelfSubjectRulesReview> = Api::all(router);
    let r = rules
        .create(
            &PostParams::default(),
            &SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some(mine.namespace.clone()),
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let status = r.status.unwrap();
    assert!(status.resource_rules.iter().any(|rule| {
        rule.resource_names
            .as_ref()
            .is_some_and(|n| n.contains(&mine.secret))
    }));
    // A malformed SAR is 422.
    let admin = sim.client("admin").await.unwrap();
    let (code, st) = raw(&admin, Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        Some(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"user": "x"}})),
        "application/json").await.into_code_body();
    assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")));
    sim.shutdown().await;
}

trait CodeBody {
    fn into_code_body(self) -> (u16, Value);
}

impl CodeBody for (u16, http::HeaderMap, Value) {
    fn into_code_body(self) -> (u16, Value) {
        (self.0, self.2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_and_stats_accounting() {
    let sim: Simulator = start().await;
    let client = sim.client("router").await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let (code, apis) = get(&client, "/apis").await;
    assert_eq!(code, 200);
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(groups.contains(&"route.openshift.io"));
    let (_, v1) = get(&client, "/apis/route.openshift.io/v1").await;
    assert!(
        v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "routes/status")
    );
    let (code, _) = get(&client, "/apis/example.com/v1/widgets").await;
    assert_eq!(code, 404);

    sim.reset_stats();
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets/nope").await;
    assert_eq!(code, 403);
    let stats = sim.stats();
    assert_eq!(stats.requests["get"]["secrets"], 1);
    assert_eq!(stats.responses["403"], 1);
    assert_eq!(stats.requests_total, 1);
    assert!(stats.bytes_sent > 0);
    assert_eq!(stats.inflight, 0);
    assert!(stats.peak_inflight >= 1);
    // The HTTP admin endpoint gives the same JSON.
    let (code, json_stats) = admin(&sim, Method::GET, "/sim/stats", None).await;
    assert_eq!(code, 200);
    let parsed: kube_sim::SimStats = serde_json::from_value(json_stats.clone()).unwrap();
    assert_eq!(parsed.requests, stats.requests);
    for key in [
        "requests",
        "requests_total",
        "responses",
        "inflight",
        "peak_inflight",
        "open_watches",
        "open_watches_by_resource",
        "peak_open_watches",
        "watches_started",
        "connections",
        "open_connections",
        "bytes_sent",
        "watch_events_sent",
        "rejected_429",
        "peak_queued",
    ] {
        assert!(json_stats.get(key).is_some(), "missing {key}");
    }
    let rec = sim.request_log().into_iter().last().unwrap();
    assert_eq!(
        (
            rec.verb.as_str(),
            rec.resource.as_str(),
            rec.name.as_deref(),
            rec.code
        ),
        ("get", "secrets", Some("nope"), 403)
    );
    assert_eq!(rec.protocol, "h1");
    sim.shutdown().await;
}

/// The number a metric line carries, for one exact label set.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_as_kube_apiserver_does() {
    let sim = start().await;
    let cluster = sim.generate(&GenerateSpec::new(1, 1)).unwrap();
    let mine = &cluster.routes[0];
    let router = sim.client("router").await.unwrap();
    let admin = sim.client("admin").await.unwrap();
    let secret = format!(
        "/api/v1/namespaces/{}/secrets/{}",
        mine.namespace, mine.secret
    );
    assert_eq!(get(&router, &secret).await.0, 200);
    assert_eq!(
        get(
            &router,
            &format!("/api/v1/namespaces/{}/secrets/nope", mine.namespace)
        )
        .await
        .0,
        403
    );
    let selector = format!(
        "/api/v1/namespaces/{}/secrets?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3D{}",
        mine.namespace, mine.secret
    );
    assert_eq!(get(&router, &selector).await.0, 200);
    let (code, _, body) = raw(&admin, Method::GET, "/metrics", None, "application/json").await;
    assert_eq!(code, 200);
    // raw() parses JSON; read the text again as text.
    assert_eq!(body, Value::Null);
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(req).await.unwrap();
    let series = |verb: &str, scope: &str, code: u16| {
        format!(
            "apiserver_request_total{{code=\"{code}\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"{scope}\",subresource=\"\",system_client=\"\",verb=\"{verb}\",version=\"v1\"}}"
        )
    };
    assert_eq!(
        metric(&text, &series("GET", "resource", 200)),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, &series("GET", "resource", 403)),
        None,
        "403s are not counted"
    );
    // The watch named its secret by selector (scope resource) and has ended.
    assert_eq!(
        metric(&text, &series("WATCH", "resource", 200)),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",verb=\"WATCH\",version=\"v1\"}"
        ),
        Some(0.0)
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_duplicate_fields_follow_field_validation() {
    let sim = start().await;
    let admin = sim.client("admin").await.unwrap();
    let secrets = "/api/v1/namespaces/default/secrets";
    let strict = "Secret in version \"v1\" cannot be handled as a Secret: strict decoding error:";
    // (query, body, code, message start, warnings)
    let cases: [(&str, &str, u16, &str, &[&str]); 5] = [
        (
            "?fieldValidation=Strict",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a"},"bogus":1}"#,
            400,
            strict,
            &[],
        ),
        (
            "?fieldValidation=Strict",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"b"},"type":"Opaque","type":"Opaque"}"#,
            400,
            strict,
            &[],
        ),
        (
            "",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"c"},"bogus":1}"#,
            201,
            "",
            &["299 - \"unknown field \\\"bogus\\\"\""],
        ),
        (
            "?fieldValidation=Ignore",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"d"},"bogus":1}"#,
            201,
            "",
            &[],
        ),
        (
            "?fieldValidation=Maybe",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"e"}}"#,
            400,
            "fieldValidation",
            &[],
        ),
    ];
    for (query, body, code, message, warnings) in cases {
        let req = http::Request::post(format!("{secrets}{query}"))
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body.as_bytes().to_vec()))
            .unwrap();
        let resp = admin.send(req).await.unwrap();
        assert_eq!(resp.status().as_u16(), code, "{query} {body}");
        let got: Vec<&str> = resp
            .headers()
            .get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(got, warnings, "{query} {body}");
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let status: Value = serde_json::from_slice(&bytes).unwrap();
        if !message.is_empty() {
            assert!(
                status["message"].as_str().unwrap().starts_with(message),
                "{status}"
            );
        }
    }
    // A patch that adds an unknown field is an invalid patch (422), naming the field.
    let (code, _, status) = raw(
        &admin,
        Method::PATCH,
        &format!("{secrets}/c?fieldValidation=Strict"),
        Some(json!({"bogus2": 1})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(" \"\" is invalid: patch: Invalid value: \""),
        "{message}"
    );
    assert!(
        message.ends_with("strict decoding error: unknown field \"bogus2\""),
        "{message}"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "patch");
    sim.shutdown().await;
}
