//! The renderer against HAProxy itself: every route kind, insecure policy, path,
//! wildcard, weight and annotation case is rendered, written and checked with
//! `haproxy -c` (alone and all together), and the maps' lines and order are compared
//! with the router's rules.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use route_secrets::route::RouteKey;
use route_secrets::route::routing::{Backend, InsecurePolicy, RouteRouting, Termination};
use serde_json::json;

use super::*;
use crate::routing::endpoints::EndpointTable;
use crate::routing::model::{RoutingTable, ServedRoute};
use crate::routing::write_config;

fn self_signed(host: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    let certificate = params.self_signed(&key).unwrap();
    format!("{}{}", certificate.pem(), key.serialize_pem())
}

/// Options for a configuration in `dir`, with a default certificate and a crt-list
/// naming one route certificate.
fn options_in(dir: &Path) -> RenderOptions {
    let default = dir.join("default.pem");
    std::fs::write(&default, self_signed("default.invalid")).unwrap();
    let cert = dir.join("route.pem");
    std::fs::write(&cert, self_signed("edge.example")).unwrap();
    let crt_list = dir.join("crt-list");
    std::fs::write(
        &crt_list,
        format!("{} [alpn h2,http/1.1] edge.example\n", cert.display()),
    )
    .unwrap();
    let mut options = RenderOptions::new(
        dir.join("haproxy"),
        crt_list,
        default,
        dir.join("admin.sock"),
    );
    // `haproxy -c` does not bind: any port will do.
    options.http_bind = "127.0.0.1:18080".into();
    options.https_bind = "127.0.0.1:18443".into();
    options
}

fn haproxy_check(config: &Path) {
    let output = Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(config)
        .output()
        .expect("haproxy must be installed (scripts/test installs it)");
    let warnings: Vec<String> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&output.stdout).lines())
        .filter(|line| line.contains("[WARNING]") || line.contains("[ALERT]"))
        .map(str::to_owned)
        .collect();
    assert!(
        warnings.is_empty(),
        "haproxy -c warns about {}:\n{}",
        config.display(),
        warnings.join("\n")
    );
    assert!(
        output.status.success(),
        "haproxy -c refused {}:\n{}{}\n--- configuration ---\n{}",
        config.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(config).unwrap_or_default()
    );
}

fn routing(termination: Termination, policy: InsecurePolicy) -> RouteRouting {
    RouteRouting {
        termination,
        host: Some("shop.example".into()),
        path: None,
        wildcard_subdomain: false,
        backends: vec![Backend {
            kind: "Service".into(),
            name: "web".into(),
            weight: 1,
        }],
        target_port: None,
        insecure_policy: policy,
        ca_certificate: None,
        destination_ca_certificate: None,
        annotations: BTreeMap::new(),
        request_headers: Vec::new(),
        response_headers: Vec::new(),
    }
}

fn served(name: &str, routing: RouteRouting) -> ServedRoute {
    ServedRoute {
        key: RouteKey::new("shop", name),
        routing: Arc::new(routing),
        wildcard: false,
        has_certificate: true,
    }
}

fn endpoints() -> EndpointTable {
    let mut table = EndpointTable::new();
    for (service, addresses, ports) in [
        (
            "web",
            json!([{"addresses": ["192.0.2.10"]}, {"addresses": ["192.0.2.11"]}]),
            json!([{"name": "http", "port": 8080}, {"name": "h2", "port": 8081, "appProtocol": "h2c"}]),
        ),
        (
            "canary",
            json!([{"addresses": ["192.0.2.20"]}]),
            json!([{"name": "http", "port": 8080}]),
        ),
        (
            "v6",
            json!([{"addresses": ["2001:db8::1"]}]),
            json!([{"name": "http", "port": 8080}]),
        ),
    ] {
        let family = if service == "v6" { "IPv6" } else { "IPv4" };
        table.apply(
            &serde_json::from_value(json!({
                "metadata": {"name": format!("{service}-1"), "namespace": "shop",
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": family,
                "ports": ports,
                "endpoints": addresses,
            }))
            .unwrap(),
        );
    }
    table
}

/// Every case the renderer distinguishes, each a route.
fn cases() -> Vec<ServedRoute> {
    use InsecurePolicy::{Allow, None as Refuse, Redirect};
    let mut cases = vec![served("plain", routing(Termination::Http, Refuse))];
    for (termination, name) in [
        (Termination::Edge, "edge"),
        (Termination::Reencrypt, "reencrypt"),
    ] {
        for policy in [Refuse, Allow, Redirect] {
            let mut r = routing(termination.clone(), policy);
            r.host = Some(format!("{name}-{}.example", policy.as_str().to_lowercase()).into());
            cases.push(served(
                &format!("{name}-{}", policy.as_str().to_lowercase()),
                r,
            ));
        }
    }
    for policy in [Refuse, Redirect] {
        let mut r = routing(Termination::Passthrough, policy);
        r.host = Some(format!("tls-{}.example", policy.as_str().to_lowercase()).into());
        cases.push(served(
            &format!("pass-{}", policy.as_str().to_lowercase()),
            r,
        ));
    }
    let mut ca = routing(Termination::Reencrypt, Refuse);
    ca.host = Some("ca.example".into());
    ca.destination_ca_certificate = Some(
        self_signed("ca.invalid")
            .split("-----BEGIN PRIVATE")
            .next()
            .unwrap()
            .into(),
    );
    cases.push(served("reencrypt-ca", ca));
    for (name, path) in [
        ("root", "/"),
        ("cart", "/cart"),
        ("cart-dir", "/cart/"),
        ("space", "/a b"),
    ] {
        let mut r = routing(Termination::Edge, Refuse);
        r.path = Some(path.into());
        cases.push(served(&format!("path-{name}"), r));
    }
    let mut wildcard = served("wildcard", routing(Termination::Edge, Allow));
    wildcard.wildcard = true;
    cases.push(wildcard);
    let mut weighted = routing(Termination::Http, Refuse);
    weighted.host = Some("weighted.example".into());
    weighted.backends.push(Backend {
        kind: "Service".into(),
        name: "canary".into(),
        weight: 3,
    });
    weighted.backends.push(Backend {
        kind: "Service".into(),
        name: "gone".into(),
        weight: 5,
    });
    weighted.target_port = Some("http".into());
    cases.push(served("weighted", weighted));
    let mut no_endpoints = routing(Termination::Edge, Refuse);
    no_endpoints.host = Some("empty.example".into());
    no_endpoints.backends[0].name = "nothing".into();
    cases.push(served("empty", no_endpoints));
    let mut v6 = routing(Termination::Reencrypt, Refuse);
    v6.host = Some("v6.example".into());
    v6.backends[0].name = "v6".into();
    cases.push(served("v6", v6));
    let mut annotated = routing(Termination::Edge, Redirect);
    annotated.host = Some("annotated.example".into());
    annotated.annotations = BTreeMap::from(
        [
            ("haproxy.router.openshift.io/balance", "leastconn"),
            ("haproxy.router.openshift.io/timeout", "5m"),
            (
                "haproxy.router.openshift.io/timeout-tunnel",
                "99999999999999h",
            ),
            (
                "haproxy.router.openshift.io/hsts_header",
                "max-age=31536000;includeSubDomains;preload",
            ),
            ("router.openshift.io/cookie_name", "shop_session"),
            ("router.openshift.io/cookie-same-site", "Strict"),
            (
                "haproxy.router.openshift.io/set-forwarded-headers",
                "replace",
            ),
            (
                "haproxy.router.openshift.io/pod-concurrent-connections",
                "10",
            ),
            ("router.openshift.io/haproxy.health.check.interval", "2s"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    cases.push(served("annotated", annotated));
    let mut odd = routing(Termination::Passthrough, Refuse);
    odd.host = Some("odd.example".into());
    odd.annotations = BTreeMap::from(
        [
            ("haproxy.router.openshift.io/balance", "nonsense"),
            ("haproxy.router.openshift.io/timeout", "0s"),
            (
                "haproxy.router.openshift.io/hsts_header",
                "max-age=1'; evil",
            ),
            ("router.openshift.io/cookie_name", "bad name!"),
            (
                "haproxy.router.openshift.io/set-forwarded-headers",
                "if-none",
            ),
            ("haproxy.router.openshift.io/disable_cookies", "true"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    cases.push(served("odd", odd));
    let mut never = routing(Termination::Edge, Refuse);
    never.host = Some("never.example".into());
    never.annotations = BTreeMap::from([(
        "haproxy.router.openshift.io/set-forwarded-headers".to_owned(),
        "never".to_owned(),
    )]);
    cases.push(served("never", never));
    let mut unknown = routing(Termination::Other("quantum".into()), Refuse);
    unknown.host = Some("unknown.example".into());
    cases.push(served("unknown", unknown));
    let mut hostless = routing(Termination::Edge, Refuse);
    hostless.host = None;
    cases.push(served("hostless", hostless));
    cases
}

/// The cases of allow lists, connection limits and rewrites, valid and not.
fn feature_cases() -> Vec<ServedRoute> {
    use InsecurePolicy::None as Refuse;
    let mut cases = Vec::new();
    for (name, termination, pairs) in [
        (
            "allowed",
            Termination::Edge,
            vec![
                (
                    "haproxy.router.openshift.io/ip_allowlist",
                    "127.0.0.1 10.0.0.0/8 ::1 bogus".to_owned(),
                ),
                (
                    "haproxy.router.openshift.io/hsts_header",
                    "max-age=1;max-age=2".to_owned(),
                ),
            ],
        ),
        (
            "allowed-pass",
            Termination::Passthrough,
            vec![(
                "haproxy.router.openshift.io/ip_whitelist",
                "192.0.2.0/24".to_owned(),
            )],
        ),
        (
            "allowed-long",
            Termination::Http,
            vec![(
                "haproxy.router.openshift.io/ip_allowlist",
                (1..=70)
                    .map(|n| format!("10.0.0.{n}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            )],
        ),
        (
            "allowed-none",
            Termination::Http,
            vec![(
                "haproxy.router.openshift.io/ip_allowlist",
                "nonsense 999.1.1.1".to_owned(),
            )],
        ),
        (
            "limited",
            Termination::Edge,
            vec![
                (
                    "haproxy.router.openshift.io/rate-limit-connections",
                    "true".to_owned(),
                ),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.concurrent-tcp",
                    "3".to_owned(),
                ),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.rate-tcp",
                    "+4".to_owned(),
                ),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.rate-http",
                    "10".to_owned(),
                ),
            ],
        ),
        (
            "limited-pass",
            Termination::Passthrough,
            vec![
                (
                    "haproxy.router.openshift.io/rate-limit-connections",
                    "1".to_owned(),
                ),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.concurrent-tcp",
                    "-2".to_owned(),
                ),
                (
                    "haproxy.router.openshift.io/rate-limit-connections.rate-tcp",
                    "7".to_owned(),
                ),
            ],
        ),
        (
            "rewrite",
            Termination::Http,
            vec![(
                "haproxy.router.openshift.io/rewrite-target",
                "/v2/it's \\\\ 100% \"here\" x\\y".to_owned(),
            )],
        ),
        (
            "rewrite-odd",
            Termination::Edge,
            vec![(
                "haproxy.router.openshift.io/rewrite-target",
                "/\\\\2 {x} [y] #rest".to_owned(),
            )],
        ),
    ] {
        let mut r = routing(termination, Refuse);
        r.host = Some(format!("{name}.example").into());
        if name.starts_with("rewrite") {
            r.path = Some("/api(v1)[x]{2}+'q".into());
        }
        r.annotations = pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        cases.push(served(name, r));
    }
    let mut headers = routing(Termination::Edge, Refuse);
    headers.host = Some("headers.example".into());
    let set = |name: &str, value: &str| route_secrets::route::routing::HeaderAction {
        name: name.into(),
        set: Some(value.into()),
    };
    headers.request_headers = vec![
        set("X-Client", "%[req.hdr(host),lower] it's #1 100%%"),
        set("X-Cert", "%{+Q}[ssl_c_der,base64]"),
        set("X-Bad", "100%"),
        set("X-Unknown", "%[src]"),
    ];
    headers.response_headers = vec![
        set("X-Served", "%[res.hdr(server)]"),
        route_secrets::route::routing::HeaderAction {
            name: "Server".into(),
            set: None,
        },
    ];
    cases.push(served("headers", headers));
    cases
}

#[test]
fn every_case_alone_and_all_together_pass_haproxy_check() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut all = RoutingTable::new();
    for (i, case) in cases().into_iter().enumerate() {
        let case_dir = dir.path().join(format!("case-{i}"));
        std::fs::create_dir_all(&case_dir).unwrap();
        let mut options = options_in(&case_dir);
        if case.key.name.as_ref() == "v6" {
            options.default_destination_ca = Some(case_dir.join("default.pem"));
        }
        let mut table = RoutingTable::new();
        table.upsert(case.clone());
        all.upsert(case);
        let rendered = render(&table, &endpoints, &options);
        haproxy_check(&write_config(&rendered, &options).unwrap());
    }
    let mut options = options_in(dir.path());
    options.threads = Some(2);
    let rendered = render(&all, &endpoints, &options);
    haproxy_check(&write_config(&rendered, &options).unwrap());
    // With a default destination CA too (the service CA).
    options.default_destination_ca = Some(dir.path().join("default.pem"));
    options.disable_http2 = true;
    let rendered = render(&all, &endpoints, &options);
    haproxy_check(&write_config(&rendered, &options).unwrap());
    assert!(
        rendered
            .config
            .contains("verifyhost web.shop.svc verify required ca-file")
    );
    assert!(!rendered.config.contains("alpn h2,http/1.1"));
    // No route at all.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let options = options_in(&empty);
    let rendered = render(&RoutingTable::new(), &endpoints, &options);
    haproxy_check(&write_config(&rendered, &options).unwrap());
}

fn map<'a>(rendered: &'a RenderedConfig, name: &str) -> Vec<&'a str> {
    rendered
        .maps
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
        .lines()
        .collect()
}

#[test]
fn maps_follow_the_routers_entries_and_order() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let options = options_in(dir.path());
    let mut table = RoutingTable::new();
    for case in cases() {
        table.upsert(case);
    }
    let rendered = render(&table, &endpoints, &options);
    let http = map(&rendered, "os_http_be.map");
    assert!(http.contains(&"^shop\\.example\\.?(:[0-9]+)?(/.*)?$ be_http:shop:plain"));
    assert!(
        http.contains(&"^edge-allow\\.example\\.?(:[0-9]+)?(/.*)?$ be_edge_http:shop:edge-allow")
    );
    assert!(http.contains(
        &"^reencrypt-allow\\.example\\.?(:[0-9]+)?(/.*)?$ be_secure:shop:reencrypt-allow"
    ));
    assert!(
        !http
            .iter()
            .any(|l| l.contains("edge-none") || l.contains("redirect") || l.contains("pass-"))
    );
    // Wildcard routes last.
    assert_eq!(
        *http.last().unwrap(),
        "^[^\\.]*\\.example\\.?(:[0-9]+)?(/.*)?$ be_edge_http:shop:wildcard"
    );
    let edge = map(&rendered, "os_edge_reencrypt_be.map");
    // A host's paths in reverse lexical order (a longer path before its prefix).
    let shop: Vec<&&str> = edge
        .iter()
        .filter(|l| l.starts_with("^shop\\.example"))
        .collect();
    assert_eq!(
        shop,
        [
            &"^shop\\.example\\.?(:[0-9]+)?/cart/(.*)?$ be_edge_http:shop:path-cart-dir",
            &"^shop\\.example\\.?(:[0-9]+)?/cart(/.*)?$ be_edge_http:shop:path-cart",
            &"^shop\\.example\\.?(:[0-9]+)?/a\\x20b(/.*)?$ be_edge_http:shop:path-space",
            &"^shop\\.example\\.?(:[0-9]+)?(/.*)?$ be_edge_http:shop:path-root",
        ]
    );
    assert!(
        !edge
            .iter()
            .any(|l| l.contains("be_tcp") || l.contains("be_http:"))
    );
    let redirect = map(&rendered, "os_route_http_redirect.map");
    assert!(redirect.contains(&"^edge-redirect\\.example\\.?(:[0-9]+)?(/.*)?$ 1"));
    assert!(redirect.contains(&"^edge-none\\.example\\.?(:[0-9]+)?(/.*)?$ 0"));
    assert!(redirect.contains(&"^tls-redirect\\.example\\.?(:[0-9]+)?(/.*)?$ 1"));
    assert!(redirect.contains(&"^unknown\\.example\\.?(:[0-9]+)?(/.*)?$ 0"));
    assert!(!redirect.iter().any(|l| l.contains("hostless")));
    let tcp = map(&rendered, "os_tcp_be.map");
    assert!(tcp.contains(&"^tls-none\\.example\\.?(:[0-9]+)?(/.*)?$ be_tcp:shop:pass-none"));
    // Reencrypt routes are in the TCP map too (the router's rule), but not in the
    // passthrough one, so they are terminated.
    assert!(
        tcp.contains(
            &"^reencrypt-none\\.example\\.?(:[0-9]+)?(/.*)?$ be_secure:shop:reencrypt-none"
        )
    );
    let passthrough = map(&rendered, "os_sni_passthrough.map");
    assert_eq!(
        passthrough,
        [
            "^tls-redirect\\.example$ 1",
            "^tls-none\\.example$ 1",
            "^odd\\.example$ 1"
        ]
    );
}

#[test]
fn backends_carry_weights_balance_cookies_and_annotations() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut options = options_in(dir.path());
    // One spare server, to show its line (none by default).
    options.spare_servers = 1;
    let mut table = RoutingTable::new();
    for case in cases() {
        table.upsert(case);
    }
    let rendered = render(&table, &endpoints, &options);
    let section = |name: &str| -> String {
        let start = rendered.config.find(&format!("backend {name}\n")).unwrap();
        let rest = &rendered.config[start..];
        rest[..rest.find("\n\n").unwrap()].to_owned()
    };
    let weighted = section("be_http:shop:weighted");
    // web (weight 1, 2 endpoints on port http), canary (weight 3, 1 endpoint): shares
    // 0.5 and 3, scaled to 42 and 256; gone has no endpoints. Services in name order.
    assert!(weighted.contains("balance roundrobin"), "{weighted}");
    let servers: Vec<&str> = weighted
        .lines()
        .filter(|l| l.contains(" server "))
        .collect();
    assert_eq!(
        servers[..3],
        [
            "  server ept:canary:http:192.0.2.20:8080 192.0.2.20:8080 weight 256 check inter 5000ms",
            "  server ept:web:http:192.0.2.10:8080 192.0.2.10:8080 weight 42 check inter 5000ms",
            "  server ept:web:http:192.0.2.11:8080 192.0.2.11:8080 weight 42 check inter 5000ms",
        ],
        "{weighted}"
    );
    assert_eq!(
        servers[3],
        "  server _dynamic-pod-1 127.0.0.1:1 weight 0 disabled check inter 5000ms"
    );
    assert_eq!(servers.len(), 3 + options.spare_servers);
    let plain = section("be_http:shop:plain");
    assert!(plain.contains("balance random"));
    assert!(
        plain.contains("192.0.2.10:8081 weight 1 proto h2 check"),
        "{plain}"
    );
    let key = routing_key(&served(
        "plain",
        routing(Termination::Http, InsecurePolicy::None),
    ));
    assert_eq!(key.len(), 32);
    assert!(plain.contains(&format!(
        "cookie {key} insert indirect nocache httponly dynamic"
    )));
    assert!(plain.contains(&format!("dynamic-cookie-key {key}")));
    let edge = section("be_edge_http:shop:edge-none");
    assert!(edge.contains("secure attr SameSite=None dynamic"), "{edge}");
    let allow = section("be_edge_http:shop:edge-allow");
    assert!(!allow.contains("secure attr"), "{allow}");
    let reencrypt = section("be_secure:shop:reencrypt-none");
    assert!(
        reencrypt.contains("weight 1 ssl alpn h2,http/1.1 verify none check inter 5000ms"),
        "{reencrypt}"
    );
    let ca = section("be_secure:shop:reencrypt-ca");
    assert!(ca.contains("verify required ca-file"), "{ca}");
    assert_eq!(rendered.ca_files.len(), 1);
    let tcp = section("be_tcp:shop:pass-none");
    assert!(
        tcp.contains("balance source") && tcp.contains("hash-type consistent"),
        "{tcp}"
    );
    assert!(
        !tcp.contains("mode http") && !tcp.contains("cookie"),
        "{tcp}"
    );
    let annotated = section("be_edge_http:shop:annotated");
    for line in [
        "balance leastconn",
        "timeout server  5m",
        "timeout tunnel  2147483647ms",
        "http-response set-header Strict-Transport-Security 'max-age=31536000;includeSubDomains;preload'",
        "cookie shop_session insert indirect nocache httponly secure attr SameSite=Strict dynamic",
        "http-request set-header X-Forwarded-For %[src]",
        "check inter 2s maxconn 10",
    ] {
        assert!(annotated.contains(line), "{line} in\n{annotated}");
    }
    assert!(!annotated.contains("option forwardfor"), "{annotated}");
    let odd = section("be_tcp:shop:odd");
    assert!(
        odd.contains("balance source") && !odd.contains("timeout tunnel"),
        "{odd}"
    );
    let never = section("be_edge_http:shop:never");
    assert!(
        !never.contains("X-Forwarded") && !never.contains("forwardfor"),
        "{never}"
    );
    assert!(!rendered.config.contains("quantum") && !rendered.config.contains(":unknown"));
    assert!(
        rendered
            .config
            .contains("backend be_edge_http:shop:hostless")
    );
    let v6 = section("be_secure:shop:v6");
    assert!(
        v6.contains("server ept:v6:http:2001:db8::1:8080 [2001:db8::1]:8080 weight 1 ssl"),
        "{v6}"
    );
    let backend = rendered
        .backends
        .iter()
        .find(|b| b.name == "be_http:shop:weighted")
        .unwrap();
    assert!(backend.checked);
    assert_eq!(
        backend.servers[0],
        RenderedServer {
            name: "ept:canary:http:192.0.2.20:8080".to_owned(),
            target: Some(ServerTarget {
                ip: "192.0.2.20".to_owned(),
                port: 8080,
                weight: 256
            })
        }
    );
    assert_eq!(
        backend.servers[3],
        RenderedServer {
            name: "_dynamic-pod-1".to_owned(),
            target: None
        }
    );
}

#[test]
fn regexes_quote_what_go_quotes() {
    assert_eq!(
        quote_meta("a.b+c*d?e(f)g|h[i]j{k}l^m$n\\o-p/q"),
        "a\\.b\\+c\\*d\\?e\\(f\\)g\\|h\\[i\\]j\\{k\\}l\\^m\\$n\\\\o-p/q"
    );
    assert_eq!(
        route_regex("a.example", Some("/x"), false),
        "^a\\.example\\.?(:[0-9]+)?/x(/.*)?$"
    );
    assert_eq!(
        route_regex("a.example", Some("//"), false),
        "^a\\.example\\.?(:[0-9]+)?(/.*)?$"
    );
    assert_eq!(
        route_regex("www.shop.example", None, true),
        "^[^\\.]*\\.shop\\.example\\.?(:[0-9]+)?(/.*)?$"
    );
    assert_eq!(sni_regex("localhost", true), "^localhost$");
    assert_eq!(time_value(Some("10")).as_deref(), Some("10"));
    assert_eq!(time_value(Some("0s")), None);
    assert_eq!(time_value(Some("5x")), None);
    assert_eq!(
        annotations::hsts(Some("max-age=\"100\"")),
        Some("max-age=\"100\"")
    );
    assert_eq!(annotations::hsts(Some("includeSubDomains")), None);
}

#[test]
fn allow_lists_rate_limits_and_rewrites_render_as_the_router_does() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let options = options_in(dir.path());
    let mut table = RoutingTable::new();
    for (i, case) in feature_cases().into_iter().enumerate() {
        // Each alone, then all of them with every other case.
        let case_dir = dir.path().join(format!("case-{i}"));
        std::fs::create_dir_all(&case_dir).unwrap();
        let case_options = options_in(&case_dir);
        let mut alone = RoutingTable::new();
        alone.upsert(case.clone());
        let rendered = render(&alone, &endpoints, &case_options);
        haproxy_check(&write_config(&rendered, &case_options).unwrap());
        table.upsert(case);
    }
    for case in cases() {
        table.upsert(case);
    }
    let rendered = render(&table, &endpoints, &options);
    let section = |name: &str| -> String {
        let start = rendered.config.find(&format!("backend {name}\n")).unwrap();
        let rest = &rendered.config[start..];
        rest[..rest.find("\n\n").unwrap()].to_owned()
    };
    let allowed = section("be_edge_http:shop:allowed");
    assert!(
        allowed.contains(
            "  acl allowlist src 127.0.0.1 10.0.0.0/8 ::1\n  tcp-request content reject if !allowlist\n"
        ),
        "{allowed}"
    );
    assert!(
        !allowed.contains("Strict-Transport-Security"),
        "two max-age values: no HSTS header\n{allowed}"
    );
    let pass = section("be_tcp:shop:allowed-pass");
    assert!(
        pass.contains(
            "  acl allowlist src 192.0.2.0/24\n  tcp-request content reject if !allowlist"
        ),
        "{pass}"
    );
    let long = section("be_http:shop:allowed-long");
    let file = options.allowlist_file(&served(
        "allowed-long",
        routing(Termination::Http, InsecurePolicy::None),
    ));
    assert!(
        long.contains(&format!("  acl allowlist src -f {}\n", file.display())),
        "{long}"
    );
    assert_eq!(rendered.allowlist_files.len(), 1);
    assert_eq!(rendered.allowlist_files[0].0, file);
    assert_eq!(rendered.allowlist_files[0].1.lines().count(), 70);
    assert!(
        rendered.allowlist_files[0]
            .1
            .starts_with("10.0.0.1\n10.0.0.2\n")
    );
    assert!(!section("be_http:shop:allowed-none").contains("allowlist"));
    let limited = section("be_edge_http:shop:limited");
    for line in [
        "  stick-table type ip size 100k expire 30s store conn_cur,conn_rate(3s),http_req_rate(10s)",
        "  tcp-request content track-sc2 src",
        "  tcp-request content reject if { src_conn_cur ge  3 }",
        "  #TCP connection rate not restricted",
        "  tcp-request content reject if { src_http_req_rate ge 10 }",
    ] {
        assert!(limited.contains(line), "{line} in\n{limited}");
    }
    let limited = section("be_tcp:shop:limited-pass");
    for line in [
        "  tcp-request content reject if { src_conn_cur ge  -2 }",
        "  tcp-request content reject if { src_conn_rate ge 7 }",
    ] {
        assert!(limited.contains(line), "{line} in\n{limited}");
    }
    assert!(!limited.contains("http_req_rate ge"), "{limited}");
    let headers = section("be_edge_http:shop:headers");
    assert!(
        headers.contains(
            "  http-request set-header 'X-Client' '%[req.hdr(host),lower] it'\\''s #1 100%%'\n  \
             http-request set-header 'X-Cert' '%{+Q}[ssl_c_der,base64]'\n  \
             http-response set-header 'X-Served' '%[res.hdr(server)]'\n  \
             http-response del-header 'Server'\n"
        ),
        "{headers}"
    );
    let rewrite = section("be_http:shop:rewrite");
    assert!(
        rewrite.contains(
            "  http-request replace-path '^/api\\(v1\\)\\[x\\]\\{2\\}\\+'\\''q(.*)$' '/v2/its \\ 100%% here xy\\1'\n"
        ),
        "{rewrite}"
    );
    let odd = section("be_edge_http:shop:rewrite-odd");
    assert!(
        odd.contains("' '/\\2 {x} [y] '\n"),
        "a comment ends the target, without \\1\n{odd}"
    );
    // Written and checked: the allow list file exists, HAProxy takes it all.
    let config = write_config(&rendered, &options).unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        rendered.allowlist_files[0].1
    );
    haproxy_check(&config);
    // A route no longer rendered takes its allow list file with it.
    let mut fewer = RoutingTable::new();
    fewer.upsert(served(
        "plain",
        routing(Termination::Http, InsecurePolicy::None),
    ));
    let rendered = render(&fewer, &endpoints, &options);
    write_config(&rendered, &options).unwrap();
    assert!(!file.exists());
}

#[test]
fn header_case_adjustments_are_global_and_per_route_on_request() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut options = options_in(dir.path());
    let mut table = RoutingTable::new();
    let mut asking = routing(Termination::Edge, InsecurePolicy::None);
    asking.host = Some("asking.example".into());
    asking.annotations.insert(
        "haproxy.router.openshift.io/h1-adjust-case".into(),
        "true".into(),
    );
    table.upsert(served("asking", asking));
    let mut not_true = routing(Termination::Http, InsecurePolicy::None);
    not_true.annotations.insert(
        "haproxy.router.openshift.io/h1-adjust-case".into(),
        "yes".into(),
    );
    table.upsert(served("not-true", not_true));
    // Without a list, nothing of it at all.
    let rendered = render(&table, &endpoints, &options);
    assert!(!rendered.config.contains("h1-case-adjust"));
    options.header_case_adjustments = vec!["Host".into(), "X-Request-ID".into()];
    let rendered = render(&table, &endpoints, &options);
    let config = &rendered.config;
    assert!(
        config.contains("  h1-case-adjust host Host\n  h1-case-adjust x-request-id X-Request-ID\n")
    );
    assert!(config.contains("  option h1-case-adjust-bogus-client\n"));
    assert_eq!(
        config.matches("option h1-case-adjust-bogus-server").count(),
        1
    );
    let asking = &config[config.find("backend be_edge_http:shop:asking\n").unwrap()..];
    assert!(
        asking[..asking.find("\n\n").unwrap()].contains("option h1-case-adjust-bogus-server"),
        "{asking}"
    );
    // The client option sits in `defaults`, before the first frontend.
    let defaults = config.find("\ndefaults\n").unwrap();
    let option = config.find("option h1-case-adjust-bogus-client").unwrap();
    assert!(defaults < option && option < config.find("\nfrontend ").unwrap());
    haproxy_check(&write_config(&rendered, &options).unwrap());
}

/// A page of exactly `size` bytes: a 503 with `Content-Length`, the body filled.
fn page_of(size: usize, line_end: &str) -> Vec<u8> {
    let head = |length: usize| {
        format!(
            "HTTP/1.1 503 Service Unavailable{line_end}Content-Type: text/plain{line_end}\
             Content-Length: {length}{line_end}{line_end}"
        )
    };
    // The length's digits change the head's size: settle it.
    let mut body = size - head(0).len();
    while head(body).len() + body != size {
        body = size - head(body).len();
    }
    let mut page = head(body).into_bytes();
    page.resize(size, b'x');
    page
}

#[test]
fn error_pages_are_checked_as_haproxy_reads_them() {
    let ok = |bytes: &[u8]| ErrorPage::parse(bytes).map(|_| ());
    assert_eq!(ok(ERROR_PAGES[0].1.as_bytes()), Ok(()));
    assert_eq!(ok(ERROR_PAGES[1].1.as_bytes()), Ok(()));
    assert_eq!(ok(b"HTTP/1.0 404 Not Found\n\n"), Ok(()));
    assert_eq!(ok(b"HTTP/1.1 200\r\n\r\nbody"), Ok(()));
    assert_eq!(ok(&page_of(MAX_ERROR_PAGE_BYTES, "\r\n")), Ok(()));
    assert_eq!(
        ok(&page_of(MAX_ERROR_PAGE_BYTES + 1, "\r\n")),
        Err(ErrorPageError::TooLarge {
            size: MAX_ERROR_PAGE_BYTES + 1
        })
    );
    for status in [
        &b"<html>not a response</html>\n\n"[..],
        b"HTTP/2 503 Service Unavailable\r\n\r\n",
        b"HTTP/1.1 99 Odd\r\n\r\n",
        b"HTTP/1.1 600 Odd\r\n\r\n",
        b"HTTP/1.1 5030 Odd\r\n\r\n",
    ] {
        assert!(
            matches!(ok(status), Err(ErrorPageError::StatusLine { .. })),
            "{:?}",
            String::from_utf8_lossy(status)
        );
    }
    assert_eq!(
        ok(b"HTTP/1.1 503 Busy\r\nno colon here\r\n\r\n"),
        Err(ErrorPageError::Header {
            number: 2,
            line: "no colon here".into()
        })
    );
    assert!(matches!(
        ok(b"HTTP/1.1 503 Busy\r\nbad name: x\r\n\r\n"),
        Err(ErrorPageError::Header { number: 2, .. })
    ));
    assert_eq!(
        ok(b"HTTP/1.1 503 Busy\r\nContent-Type: text/html\r\n"),
        Err(ErrorPageError::Unterminated)
    );
    assert_eq!(ok(b""), Err(ErrorPageError::Unterminated));
    let headers = |n: usize| {
        let lines: String = (0..n).map(|i| format!("x-h{i}: v\r\n")).collect();
        format!("HTTP/1.1 503 Busy\r\n{lines}\r\n").into_bytes()
    };
    assert_eq!(ok(&headers(MAX_ERROR_PAGE_HEADERS)), Ok(()));
    assert_eq!(
        ok(&headers(MAX_ERROR_PAGE_HEADERS + 1)),
        Err(ErrorPageError::TooManyHeaders {
            count: MAX_ERROR_PAGE_HEADERS + 1
        })
    );
    assert_eq!(
        ok(b"HTTP/1.1 503 Busy\r\nContent-Length: 10\r\n\r\nshort"),
        Err(ErrorPageError::ContentLength {
            declared: "10".into(),
            actual: 5
        })
    );
    assert_eq!(
        ok(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        Err(ErrorPageError::TransferEncoding)
    );
}

#[test]
fn custom_error_pages_are_written_and_taken_by_haproxy() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut options = options_in(dir.path());
    let mut table = RoutingTable::new();
    table.upsert(served(
        "web",
        routing(Termination::Edge, InsecurePolicy::None),
    ));
    // Without pages of the operator's: certwatch's, and no 404 from openshift_default.
    let rendered = render(&table, &endpoints, &options);
    assert!(!rendered.config.contains("deny_status 404"));
    haproxy_check(&write_config(&rendered, &options).unwrap());
    assert_eq!(
        std::fs::read(options.config_dir.join("error-page-503.http")).unwrap(),
        ERROR_PAGES[0].1.as_bytes()
    );
    // The largest page the check takes, LF line ends, as the 503 page.
    let big = page_of(MAX_ERROR_PAGE_BYTES, "\n");
    options.error_pages.page_503 = Some(ErrorPage::parse(&big).unwrap());
    // The 404 page with the most headers the check takes.
    let lines: String = (1..MAX_ERROR_PAGE_HEADERS)
        .map(|i| format!("x-h{i}: v\r\n"))
        .collect();
    let page_404 =
        format!("HTTP/1.1 404 Not Found\r\nx-page: mine\r\n{lines}\r\nnot here").into_bytes();
    options.error_pages.page_404 = Some(ErrorPage::parse(&page_404).unwrap());
    let rendered = render(&table, &endpoints, &options);
    let config = &rendered.config;
    let default = &config[config.find("\nbackend openshift_default\n").unwrap() + 1..];
    assert!(
        default[..default.find("\n\n").unwrap()].ends_with("\n  http-request deny deny_status 404"),
        "{default}"
    );
    haproxy_check(&write_config(&rendered, &options).unwrap());
    assert_eq!(
        std::fs::read(options.config_dir.join("error-page-503.http")).unwrap(),
        big
    );
    assert_eq!(
        std::fs::read(options.config_dir.join("error-page-404.http")).unwrap(),
        page_404
    );
}

/// What a Lua probe loaded after the configuration's own Lua file finds in each Lua
/// state HAProxy makes (the shared one, 0, and one per thread) once HAProxy's own
/// lists are made: `state proxies frontends backends`, each the number of entries of
/// `core.proxies`, `core.frontends` and `core.backends`, or `nil`. The probe ends
/// HAProxy in the last thread's state, before it binds anything.
fn lua_lists(dir: &Path, config: &str, threads: u32) -> Vec<String> {
    let report = dir.join("lua-lists.txt");
    let _ = std::fs::remove_file(&report);
    let probe = dir.join("probe.lua");
    std::fs::write(
        &probe,
        format!(
            "core.register_init(function()\n\
             \x20 local function count(list)\n\
             \x20   if list == nil then return \"nil\" end\n\
             \x20   local n = 0\n\
             \x20   for _ in pairs(list) do n = n + 1 end\n\
             \x20   return tostring(n)\n\
             \x20 end\n\
             \x20 local out = io.open(\"{report}\", \"a\")\n\
             \x20 out:write(core.thread, \" \", count(core.proxies), \" \", count(core.frontends), \" \", count(core.backends), \"\\n\")\n\
             \x20 out:close()\n\
             \x20 if core.thread == {threads} then os.exit(0) end\n\
             end)\n",
            report = report.display(),
        ),
    )
    .unwrap();
    let probed = dir.join("probed.cfg");
    std::fs::write(
        &probed,
        format!(
            "{config}global\n  lua-load {probe}\n  lua-load-per-thread {probe}\n",
            probe = probe.display()
        ),
    )
    .unwrap();
    // `timeout` only ends a HAProxy the probe did not end (a failure, reported below).
    let output = Command::new("timeout")
        .args(["120", "haproxy", "-db", "-f"])
        .arg(&probed)
        .output()
        .expect("haproxy must be installed (scripts/test installs it)");
    assert!(
        output.status.success(),
        "haproxy with the Lua probe: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read_to_string(&report)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn haproxys_lua_states_drop_their_lists_of_every_proxy_and_server() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut options = options_in(dir.path());
    options.threads = Some(3);
    let mut table = RoutingTable::new();
    for case in cases() {
        table.upsert(case);
    }
    let rendered = render(&table, &endpoints, &options);
    let lua = options.lua_init();
    let lines = format!(
        "\n  .if feature(LUA)\n  lua-load {lua}\n  lua-load-per-thread {lua}\n  .endif\n",
        lua = lua.display()
    );
    let global = &rendered.config[..rendered.config.find("\ndefaults\n").unwrap()];
    assert!(global.contains(&lines), "{global}");
    haproxy_check(&write_config(&rendered, &options).unwrap());
    assert_eq!(std::fs::read_to_string(&lua).unwrap(), LUA_INIT);
    let sections = |kind: &str| {
        rendered
            .config
            .lines()
            .filter(|line| line.starts_with(kind))
            .count()
    };
    let (frontends, backends) = (sections("frontend "), sections("backend "));
    assert!(backends > cases().len(), "{backends} backends");
    // Without the configuration's Lua file, every state lists every proxy.
    let without = rendered.config.replacen(&lines, "\n", 1);
    let listed = format!("{} {frontends} {backends}", frontends + backends);
    assert_eq!(
        lua_lists(dir.path(), &without, 3),
        (0..=3)
            .map(|state| format!("{state} {listed}"))
            .collect::<Vec<_>>()
    );
    // With it, no state keeps them.
    assert_eq!(
        lua_lists(dir.path(), &rendered.config, 3),
        (0..=3)
            .map(|state| format!("{state} nil nil nil"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn backends_take_servers_at_run_time_where_their_balance_allows_and_keep_spares_otherwise() {
    let endpoints = endpoints();
    let dir = tempfile::tempdir().unwrap();
    let options = options_in(dir.path());
    let mut table = RoutingTable::new();
    let mut hashed = routing(Termination::Edge, InsecurePolicy::None);
    hashed.host = Some("hashed.example".into());
    hashed.annotations.insert(
        "haproxy.router.openshift.io/balance".into(),
        "source".into(),
    );
    table.upsert(served("hashed", hashed));
    table.upsert(served(
        "plain",
        routing(Termination::Http, InsecurePolicy::None),
    ));
    let mut forwarding = routing(Termination::Edge, InsecurePolicy::None);
    forwarding.host = Some("replace.example".into());
    forwarding.annotations.insert(
        "haproxy.router.openshift.io/set-forwarded-headers".into(),
        "replace".into(),
    );
    table.upsert(served("replace", forwarding));
    let rendered = render(&table, &endpoints, &options);
    let backend = |name: &str| {
        rendered
            .backends
            .iter()
            .find(|b| b.name == name)
            .unwrap()
            .clone()
    };
    // `balance source` without `hash-type consistent`: no server added at run time,
    // spare servers instead (none by default elsewhere).
    let hashed = backend("be_edge_http:shop:hashed");
    assert!(hashed.add.is_none());
    assert_eq!(
        hashed.servers.iter().filter(|s| s.target.is_none()).count(),
        STATIC_BACKEND_SPARE_SERVERS
    );
    let plain = backend("be_http:shop:plain");
    assert!(plain.servers.iter().all(|s| s.target.is_some()));
    let add = plain.add.expect("random takes servers at run time");
    assert_eq!(
        (add.next, add.next_id, add.cookies, add.h2c),
        (1, plain.servers.len() + 1, true, true)
    );
    // The append policy's rules once, in the defaults section its backends follow; the
    // other policies' rules in their backends, after a defaults section of their own.
    let config = &rendered.config;
    let append_defaults = config.find("defaults forwarded_append\n").unwrap();
    let plain_at = config.find("backend be_http:shop:plain\n").unwrap();
    let plain_defaults = config[append_defaults..].find("\ndefaults\n").unwrap() + append_defaults;
    let replace_at = config.find("backend be_edge_http:shop:replace\n").unwrap();
    assert!(append_defaults < plain_at && plain_at < plain_defaults && plain_defaults < replace_at);
    assert_eq!(
        config
            .matches("http-request add-header X-Forwarded-Host %[req.hdr(host)]")
            .count(),
        1
    );
    assert!(config[replace_at..].contains("http-request set-header X-Forwarded-For %[src]"));
    haproxy_check(&write_config(&rendered, &options).unwrap());
}
