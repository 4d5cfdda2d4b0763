//! Reencrypt routes without a `destinationCACertificate` verified as the router verifies
//! them: against the default destination CA (the service CA bundle the deployment
//! mounts, `--default-destination-ca`), the binary against the simulator with a real
//! HAProxy. A backend whose certificate that CA signed for the service's name answers;
//! one it did not sign is refused (HAProxy's TLS connection to it fails: 503, and the
//! backend sees no request). A bundle certwatch cannot use stops it at start, naming
//! the flag.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::routing::{Routing, RoutingLaunch};
use common::traffic::{Backend, TestCa, create_service, https_get, set_endpoints};
use common::{
    SimProcess, create_route_spec, create_tls_secret, eventually_async, grant_secret, run_to_exit,
};

const NS: &str = "app-0";

/// A reencrypt route `name` for `host` to Service `service`, with its own certificate
/// and no destination CA of its own.
async fn reencrypt_route(admin: &kube::Client, name: &str, host: &str, service: &str) {
    let secret = format!("{name}-tls");
    create_tls_secret(admin, NS, &secret, host).await;
    grant_secret(admin, NS, &secret).await;
    let spec = serde_json::json!({
        "host": host,
        "to": {"kind": "Service", "name": service},
        "tls": {"termination": "reencrypt", "externalCertificate": {"name": secret}},
    });
    create_route_spec(admin, NS, name, spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reencrypt_backends_are_verified_against_the_default_destination_ca() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(dir.path(), &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;

    let service_ca = TestCa::new("service-ca");
    let ca_file = dir.path().join("service-ca.crt");
    std::fs::write(&ca_file, &service_ca.pem).unwrap();
    // The router verifies the name `<service>.<namespace>.svc` (verifyhost).
    let signed = Backend::https_signed("signed-1", "signed.app-0.svc", &service_ca).await;
    let unsigned = Backend::https("unsigned-1", "unsigned.app-0.svc").await;
    let misnamed = Backend::https_signed("misnamed-1", "other.app-0.svc", &service_ca).await;
    for (service, backend) in [
        ("signed", &signed),
        ("unsigned", &unsigned),
        ("misnamed", &misnamed),
    ] {
        create_service(&admin, NS, service).await;
        set_endpoints(&admin, NS, service, &[backend]).await;
        reencrypt_route(&admin, service, &format!("{service}.example"), service).await;
    }

    let Routing {
        mut certwatch,
        https,
        ..
    } = RoutingLaunch::on(&sim, dir.path())
        .args(&["--default-destination-ca", ca_file.to_str().unwrap()])
        .ready()
        .await;

    let answer = eventually_async("the signed backend answers", || async {
        https_get(https, "signed.example", "/v", false)
            .await
            .filter(|r| r.status == 200)
    })
    .await;
    assert_eq!(answer.backend.as_deref(), Some("signed-1"));
    assert_eq!(signed.served(), 1);

    // Neither a certificate the CA did not sign nor one it signed for another name
    // passes: HAProxy gives up on the server, and the backend never sees a request.
    for (host, backend) in [
        ("unsigned.example", &unsigned),
        ("misnamed.example", &misnamed),
    ] {
        let refused = https_get(https, host, "/v", false).await.unwrap();
        assert_eq!(
            (refused.status, refused.backend.as_deref()),
            (503, None),
            "{host}: {refused:?}"
        );
        assert_eq!(backend.served(), 0, "{host}");
    }
    assert!(certwatch.terminate().success());
}

#[test]
fn a_default_destination_ca_that_cannot_be_used_stops_certwatch_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("certs");
    let missing = dir.path().join("missing.crt");
    let empty = dir.path().join("empty.crt");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    for file in [&missing, &empty] {
        let output = run_to_exit(
            &[
                "run",
                "--cert-dir",
                cert_dir.to_str().unwrap(),
                "--default-destination-ca",
                file.to_str().unwrap(),
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--default-destination-ca"), "{stderr}");
        assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
    }
}
