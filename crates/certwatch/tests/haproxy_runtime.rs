//! The pipelined runtime API client against a real HAProxy (Debian's 2.6): answers in
//! order over one connection, payload commands among them, an oversized request
//! refused before anything is sent (the connection and the other batches unharmed),
//! concurrent batches from several handles, and a restart seen as a new process.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use certwatch::haproxy::runtime::{
    Command, Payload, RuntimeClient, RuntimeError, RuntimeOptions, current_instance,
};
use common::eventually_async;
use common::haproxy::{leaf_der, presented, self_signed, start_haproxy};

/// A cert dir with one certificate in its crt-list, for HAProxy to load.
fn cert_dir_with_one(root: &Path) -> std::path::PathBuf {
    let dir = root.join("certs");
    std::fs::create_dir_all(&dir).unwrap();
    let bundle = dir.join("one.pem");
    std::fs::write(&bundle, self_signed("one.example")).unwrap();
    std::fs::write(
        dir.join("crt-list"),
        format!("{} one.example\n", bundle.display()),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_pipelined_in_order_over_one_connection() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let socket = root.join("haproxy.sock");
    let cert_dir = cert_dir_with_one(&root);
    let (mut haproxy, port, _default) = start_haproxy(&root, &socket, &cert_dir);
    eventually_async("HAProxy to serve TLS", || presented(port, "one.example")).await;

    let client = RuntimeClient::spawn(RuntimeOptions::new(&socket));
    let name = cert_dir.join("one.pem").display().to_string();
    // A rotation of `one.pem`, then reads, in one batch: each answer is its own.
    let rotated = self_signed("one.example");
    let commands = vec![
        Command::new("show info"),
        Command::with_payload(
            format!("set ssl cert {name}"),
            Payload::new(rotated.clone()),
        ),
        Command::new(format!("commit ssl cert {name}")),
        Command::new("abort ssl cert nothing-open"),
        Command::new(format!("show ssl cert {name}")),
        Command::new("no such command"),
        Command::new("show ssl crt-list"),
    ];
    let outcome = client.execute(commands).await;
    assert!(outcome.complete(), "{:?}", outcome.error);
    let replies = outcome.replies;
    assert_eq!(replies.len(), 7);
    let connected = outcome.connected.unwrap();
    assert_eq!(connected.instance.pid, haproxy.child.id());
    assert_eq!(connected.bufsize, 16_384, "Debian's default tune.bufsize");
    assert!(replies[0].contains(&format!("Pid: {}", haproxy.child.id())));
    assert!(
        replies[1].contains("Transaction created"),
        "{:?}",
        replies[1]
    );
    assert!(replies[2].contains("Success!"), "{:?}", replies[2]);
    assert!(
        replies[3].contains("No ongoing transaction"),
        "{:?}",
        replies[3]
    );
    assert!(replies[4].contains("SHA1 FingerPrint:"), "{:?}", replies[4]);
    assert!(replies[5].contains("Unknown command"), "{:?}", replies[5]);
    assert!(replies[6].contains("crt-list"), "{:?}", replies[6]);
    assert_eq!(
        presented(port, "one.example").await,
        Some(leaf_der(rotated.as_bytes())),
        "the committed certificate is served"
    );

    // An oversized request is refused before anything is sent; a batch queued with it
    // runs on the same connection, unharmed.
    let big_chain = rotated.repeat(40);
    let oversized = client.execute(vec![
        Command::with_payload(format!("set ssl cert {name}"), Payload::new(big_chain)),
        Command::new(format!("commit ssl cert {name}")),
    ]);
    let beside = client.execute(vec![Command::new("show info")]);
    let (oversized, beside) = tokio::join!(oversized, beside);
    match oversized.error {
        Some(RuntimeError::TooLarge { size, limit, .. }) => {
            assert!(size > limit && limit < 16_384, "{size} {limit}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(oversized.replies.is_empty());
    assert!(beside.complete(), "{:?}", beside.error);
    assert_eq!(beside.connected.unwrap(), connected, "the same connection");
    assert!(
        !common::haproxy::runtime_api(&socket, "show ssl cert").contains("*"),
        "no transaction was opened"
    );

    // Many handles at once: every batch answered, in its own order.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let commands = (0..10)
                .map(|j| {
                    Command::new(format!(
                        "show ssl cert {}",
                        if (i + j) % 2 == 0 { "x" } else { "y" }
                    ))
                })
                .collect();
            (i, client.execute(commands).await)
        }));
    }
    for task in tasks {
        let (i, outcome) = task.await.unwrap();
        assert!(outcome.complete(), "{i}: {:?}", outcome.error);
        assert_eq!(outcome.replies.len(), 10);
        assert_eq!(outcome.connected.unwrap(), connected);
    }

    // HAProxy restarts: the broken connection is reported, the next batch opens a new
    // one to the new process.
    haproxy.child.kill().unwrap();
    haproxy.child.wait().unwrap();
    let (restarted, port, _) = start_haproxy(&root, &socket, &cert_dir);
    eventually_async("HAProxy to serve TLS again", || {
        presented(port, "one.example")
    })
    .await;
    let first = client.execute(vec![Command::new("show info")]).await;
    let outcome = if first.complete() {
        first
    } else {
        client.execute(vec![Command::new("show info")]).await
    };
    assert!(outcome.complete(), "{:?}", outcome.error);
    assert_eq!(
        outcome.connected.unwrap().instance.pid,
        restarted.child.id()
    );
    let fresh = current_instance(&socket, std::time::Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(fresh, outcome.connected.unwrap().instance);
}

/// A request of exactly the size the client allows reaches HAProxy and is answered; one
/// byte more (sent by hand) is never answered: the limit is HAProxy's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_limit_is_exact() {
    use std::io::{Read, Write};
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let socket = root.join("haproxy.sock");
    let cert_dir = cert_dir_with_one(&root);
    let (_haproxy, port, _default) = start_haproxy(&root, &socket, &cert_dir);
    eventually_async("HAProxy to serve TLS", || presented(port, "one.example")).await;
    let client = RuntimeClient::spawn(RuntimeOptions::new(&socket));
    let connected = client
        .execute(vec![Command::new("show info")])
        .await
        .connected
        .unwrap();
    let name = cert_dir.join("one.pem").display().to_string();
    // Lines of 64 characters, the last one cut to make the size exact.
    let sized = |size: usize| {
        let mut text = String::new();
        loop {
            let command =
                Command::with_payload(format!("set ssl cert {name}"), Payload::new(text.clone()));
            let missing = size - command.request_size();
            if missing == 0 {
                return (command, text);
            }
            let line = "A".repeat(missing.saturating_sub(1).clamp(1, 64));
            text.push_str(&line);
            text.push('\n');
        }
    };
    let (at_limit, _) = sized(connected.max_request);
    let outcome = client
        .execute(vec![at_limit, Command::new("show info")])
        .await;
    assert!(outcome.complete(), "{:?}", outcome.error);
    assert!(
        !outcome.replies[0].contains("Transaction created"),
        "not a certificate"
    );
    assert_eq!(
        outcome.connected.unwrap(),
        connected,
        "the connection stays"
    );

    let (_, over) = sized(connected.max_request + 1);
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    // HAProxy neither answers nor closes: the read ends at its timeout.
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let request = format!("set ssl cert {name} <<\n{over}\nshow info\n");
    let _ = stream.write_all(request.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(
        !answer.contains("Pid:"),
        "HAProxy took a request past the limit: {answer:?}"
    );
}
