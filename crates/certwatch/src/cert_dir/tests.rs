//! The store against a real directory, its index written as HAProxy's crt-list.

use std::os::unix::fs::PermissionsExt;

use route_secrets::testing::{LeafSpec, Pki};
use route_secrets::tls::TlsValidator;

use super::*;
use crate::files::CRT_LIST_FILE;
use crate::haproxy::crt_list::{self, CrtList, CrtListOptions};

/// The store with its index as HAProxy's crt-list, written as by default.
async fn open(root: &Path) -> io::Result<CertDir> {
    CertDir::open(root, 4, Arc::new(CrtList::default())).await
}

fn served(pki: &Pki, namespace: &str, name: &str, created: i64) -> ServedCert {
    let now = Timestamp::now();
    let host = format!("{}.example.com", &name[..name.len().min(50)]);
    let secret = pki.issue(&LeafSpec::new(&host, now)).secret(namespace, "s");
    let tls = TlsValidator::default()
        .validate_secret(&secret, Some(&host), now)
        .unwrap();
    ServedCert {
        route: RouteKey::new(namespace, name),
        sni: Sni::Host(host),
        created: Some(Timestamp::from_second(created).unwrap()),
        tls: Arc::new(tls),
    }
}

/// A cert directory in a temporary directory of its own with routes `ns/a` and `ns/b`
/// set, complete and flushed once: the temporary directory, its canonical path, the
/// cert directory, a, b and the PKI that issued them.
async fn a_and_b_flushed() -> (
    tempfile::TempDir,
    PathBuf,
    CertDir,
    ServedCert,
    ServedCert,
    Pki,
) {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let (a, b) = (served(&pki, "ns", "a", 1), served(&pki, "ns", "b", 2));
    let mut dir = open(&root).await.unwrap();
    dir.set(a.clone()).unwrap();
    dir.set(b.clone()).unwrap();
    dir.mark_complete();
    dir.flush().await;
    (temp, root, dir, a, b, pki)
}

/// The crt-list as (link file name, SNI) pairs; every path it names must exist.
fn listed(root: &Path) -> Vec<(String, String)> {
    listed_lines(root)
        .into_iter()
        .map(|(name, rest)| (name, rest.rsplit(' ').next().unwrap().to_owned()))
        .collect()
}

/// The crt-list as (link file name, options and SNI).
fn listed_lines(root: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root.join(CRT_LIST_FILE)).unwrap();
    text.lines()
        .map(|line| {
            let (path, sni) = line.split_once(' ').unwrap();
            assert!(
                std::fs::metadata(path).is_ok(),
                "{path} is listed but missing"
            );
            let name = Path::new(path).file_name().unwrap().to_string_lossy();
            (name.into_owned(), sni.to_owned())
        })
        .collect()
}

#[test]
fn the_bundle_digest_is_the_digest_of_the_file_written() {
    // A restart compares the files' digests with the routes' bundle digests: were
    // they computed differently, every bundle would be rewritten at every start.
    let cert = served(&Pki::new(Timestamp::now()), "ns", "a", 1);
    let file = cert.tls.pem_bundle();
    assert_eq!(
        bundle_digest(&cert.tls),
        digest(file.expose_secret().as_bytes())
    );
}

#[test]
fn the_digests_made_in_one_pass_are_those_made_apart() {
    let pki = Pki::new(Timestamp::now());
    for (index, name) in ["a", "b"].into_iter().enumerate() {
        let cert = served(&pki, "ns", name, i64::try_from(index).unwrap());
        let (bundle, chain) = bundle_and_chain_digests(&cert.tls);
        assert_eq!(bundle, bundle_digest(&cert.tls));
        assert_eq!(chain, chain_digest(&cert.tls));
        assert_eq!(chain, digest(cert.tls.chain_pem().as_bytes()));
        assert_ne!(bundle, chain);
    }
}

#[test]
fn links_are_created_replaced_and_kept() {
    let temp = tempfile::tempdir().unwrap();
    let links = temp.path();
    files::ensure_link(links, "a.pem", "a-1.pem").unwrap();
    assert_eq!(
        std::fs::read_link(links.join("a.pem")).unwrap(),
        Path::new("../a-1.pem")
    );
    files::ensure_link(links, "a.pem", "a-1.pem").unwrap();
    files::ensure_link(links, "a.pem", "a-2.pem").unwrap();
    assert_eq!(
        std::fs::read_link(links.join("a.pem")).unwrap(),
        Path::new("../a-2.pem")
    );
    // A plain file where the link goes is replaced by the link.
    std::fs::write(links.join("b.pem"), "not a link").unwrap();
    files::ensure_link(links, "b.pem", "b-1.pem").unwrap();
    assert_eq!(
        std::fs::read_link(links.join("b.pem")).unwrap(),
        Path::new("../b-1.pem")
    );
    let names: Vec<_> = std::fs::read_dir(links)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "no temporary link left: {names:?}");
}

fn counts(report: &FlushReport) -> (usize, usize, usize, bool) {
    (
        report.written,
        report.removed,
        report.failed,
        report.index_written,
    )
}

#[tokio::test]
async fn start_up_restart_and_stale_files() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("certs");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("old:gone.pem"), b"stale").unwrap();
    let pki = Pki::new(Timestamp::now());
    let (a, b) = (
        served(&pki, "ns", "a", 2_000),
        served(&pki, "ns", "b", 1_000),
    );

    let mut dir = open(&root).await.unwrap();
    dir.set(a.clone()).unwrap();
    dir.set(b.clone()).unwrap();
    let report = dir.flush().await;
    assert_eq!(counts(&report), (2, 0, 0, false));
    // Until start-up is complete, nothing is removed and no crt-list is written.
    assert!(root.join("old:gone.pem").exists());
    assert!(!root.join(CRT_LIST_FILE).exists());
    assert!(!dir.is_current());

    dir.mark_complete();
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 1, 0, true));
    assert!(dir.is_current());
    assert!(!root.join("old:gone.pem").exists());
    let root = root.canonicalize().unwrap();
    assert_eq!(
        listed(&root),
        [
            ("ns_b.pem".to_owned(), "b.example.com".to_owned()),
            ("ns_a.pem".to_owned(), "a.example.com".to_owned())
        ],
        "the older route first"
    );
    assert!(report.complete_listing);
    assert_eq!(report.changes.len(), 2);
    assert!(report.changes.iter().all(|change| change.entry.is_some()));
    let bundle = root.join("ns:a.pem");
    assert_eq!(
        std::fs::read(&bundle).unwrap(),
        a.tls.pem_bundle().expose_secret().as_bytes()
    );
    assert_eq!(
        std::fs::metadata(&bundle).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(counts(&dir.flush().await), (0, 0, 0, false));

    // After a restart, identical bundles are not rewritten.
    let mut dir = open(&root).await.unwrap();
    dir.set(a).unwrap();
    dir.set(b.clone()).unwrap();
    dir.mark_complete();
    assert_eq!(counts(&dir.flush().await), (0, 0, 0, false));
    assert_eq!(dir.bundles_on_disk(), 2);

    // A removed route loses its bundle, link and line.
    dir.remove(&b.route);
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 1, 0, true));
    assert!(!root.join("ns:b.pem").exists());
    assert!(!root.join(LINKS_DIR).join("ns_b.pem").exists());
    assert_eq!(listed(&root).len(), 1);
    assert_eq!(dir.bundles_on_disk(), 1);
}

/// A bundle that cannot be written is counted, not listed, retried, and blocks
/// [`CertDir::is_current`] until it is on disk.
#[tokio::test]
async fn failed_writes_are_counted_and_never_listed() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let (a, b) = (served(&pki, "ns", "a", 1), served(&pki, "ns", "b", 2));
    let mut dir = open(&root).await.unwrap();
    // A directory where b's bundle goes: the rename onto it fails.
    std::fs::create_dir(root.join("ns:b.pem")).unwrap();
    std::fs::write(root.join("ns:b.pem").join("x"), b"").unwrap();
    dir.set(a).unwrap();
    dir.set(b).unwrap();
    dir.mark_complete();
    let report = dir.flush().await;
    assert_eq!(counts(&report), (1, 0, 1, true));
    assert!(report.error.is_some());
    assert!(report.error_text.as_deref().unwrap().contains("ns:b.pem"));
    assert_eq!(
        listed(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
    assert!(!dir.is_current());
    assert!(dir.has_pending_work());
    assert_eq!(dir.bundles_on_disk(), 1);

    std::fs::remove_dir_all(root.join("ns:b.pem")).unwrap();
    let report = dir.flush().await;
    assert_eq!(counts(&report), (1, 0, 0, true));
    assert!(dir.is_current());
    assert_eq!(listed(&root).len(), 2);
}

/// The crt-list stops naming a bundle before the bundle goes: while the new list
/// cannot be written, the old one's files stay.
#[tokio::test]
async fn bundles_outlive_the_list_that_names_them() {
    let (_temp, root, mut dir, _, b, _) = a_and_b_flushed().await;
    assert_eq!(listed(&root).len(), 2);

    // The next crt-list write fails: a directory stands where it goes.
    let list = root.join(CRT_LIST_FILE);
    std::fs::remove_file(&list).unwrap();
    std::fs::create_dir(&list).unwrap();
    std::fs::write(list.join("x"), b"").unwrap();
    dir.remove(&b.route);
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 0, 1, false));
    assert!(!dir.is_current());
    // b stays until a list without it is on disk.
    assert!(root.join("ns:b.pem").exists());
    assert!(root.join(LINKS_DIR).join("ns_b.pem").exists());

    std::fs::remove_dir_all(&list).unwrap();
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 1, 0, true));
    assert!(dir.is_current());
    assert_eq!(
        listed(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
    assert!(!root.join("ns:b.pem").exists());
}

/// Routes without an SNI are written but never listed; names too long for a file
/// are shortened, listed, and found again after a restart.
#[tokio::test]
async fn a_load_in_progress_keeps_the_files_it_may_read() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let (a, b, c) = (
        served(&pki, "ns", "a", 1),
        served(&pki, "ns", "b", 2),
        served(&pki, "ns", "c", 3),
    );
    let mut dir = open(&root).await.unwrap();
    let loads = dir.file_loads();
    dir.set(a.clone()).unwrap();
    dir.set(b.clone()).unwrap();
    dir.set(c.clone()).unwrap();
    dir.mark_complete();
    dir.flush().await;
    assert_eq!(listed(&root).len(), 3);

    // A load reads the list naming a, b and c; then b and c are no longer served.
    let load = loads.begin();
    dir.remove(&b.route);
    dir.remove(&c.route);
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 0, 0, true));
    assert_eq!(listed(&root).len(), 1);
    // Their files stay while that load runs; nothing to retry meanwhile.
    for name in ["ns:b.pem", "ns:c.pem"] {
        assert!(root.join(name).exists(), "{name}");
    }
    assert!(root.join(LINKS_DIR).join("ns_b.pem").exists());
    assert!(dir.removals_waiting());
    assert!(!dir.has_pending_work());
    // A load begun after the list was written does not hold them.
    let later = loads.begin();
    // b comes back while held: it is served again, its files kept.
    dir.set(b.clone()).unwrap();
    let report = dir.flush().await;
    assert_eq!(counts(&report).1, 0);
    assert_eq!(listed(&root).len(), 2);

    drop(load);
    assert!(!dir.removals_waiting());
    assert!(dir.has_pending_work());
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 1, 0, false));
    assert!(!root.join("ns:c.pem").exists());
    assert!(!root.join(LINKS_DIR).join("ns_c.pem").exists());
    assert!(root.join(LINKS_DIR).join("ns_b.pem").exists());
    assert!(!dir.has_pending_work());

    // b goes again while `later` runs: `later` began before this list.
    dir.remove(&b.route);
    dir.flush().await;
    assert!(root.join(LINKS_DIR).join("ns_b.pem").exists());
    drop(later);
    let report = dir.flush().await;
    assert_eq!(counts(&report), (0, 1, 0, false));
    assert!(!root.join("ns:b.pem").exists());
    assert_eq!(
        listed(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
}

#[tokio::test]
async fn hostless_and_long_named_routes() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let mut hostless = served(&pki, "ns", "hostless", 1);
    hostless.sni = Sni::NoHost;
    let long = served(&pki, &"n".repeat(63), &"r".repeat(253), 2);
    let long_names = files::bundle_names(&long.route).unwrap();
    let mut dir = open(&root).await.unwrap();
    dir.set(hostless).unwrap();
    dir.set(long.clone()).unwrap();
    dir.mark_complete();
    let report = dir.flush().await;
    assert_eq!(counts(&report), (2, 0, 0, true));
    assert!(root.join("ns:hostless.pem").exists());
    assert!(root.join(&long_names.bundle).exists());
    assert_eq!(
        listed(&root),
        [(
            long_names.link.clone(),
            crt_list::sni_filter(&long.sni).unwrap().into_owned()
        )]
    );
    assert!(dir.is_current());

    let mut dir = open(&root).await.unwrap();
    dir.set(long.clone()).unwrap();
    dir.mark_complete();
    // The long bundle is recognised; the host-less one is gone with its route.
    assert_eq!(counts(&dir.flush().await), (0, 1, 0, false));
    assert!(root.join(&long_names.bundle).exists());
}

/// Lines offer HTTP/2 as the router's do: not for a certificate two routes share
/// (until one moves away), not at all with HTTP/2 disabled; a rotation in place
/// changes no line, so the crt-list is not rewritten for it.
#[tokio::test]
async fn alpn_follows_shared_certificates() {
    let (_temp, root, mut dir, a, b, pki) = a_and_b_flushed().await;
    let h2 = |host: &str| format!("[alpn h2,http/1.1] {host}");
    assert_eq!(
        listed_lines(&root),
        [
            ("ns_a.pem".to_owned(), h2("a.example.com")),
            ("ns_b.pem".to_owned(), h2("b.example.com"))
        ]
    );
    // b serves a's certificate: both lines lose their ALPN.
    let shared = ServedCert {
        tls: Arc::clone(&a.tls),
        ..b.clone()
    };
    dir.set(shared).unwrap();
    let report = dir.flush().await;
    assert_eq!(report.changes.len(), 2, "{:?}", report.changes);
    assert_eq!(
        listed_lines(&root),
        [
            ("ns_a.pem".to_owned(), "a.example.com".to_owned()),
            ("ns_b.pem".to_owned(), "b.example.com".to_owned())
        ]
    );
    // b rotates to a certificate of its own: both get it back.
    let rotated = served(&pki, "ns", "b", 2);
    dir.set(rotated.clone()).unwrap();
    let report = dir.flush().await;
    assert_eq!(report.changes.len(), 2);
    assert!(report.index_written);
    assert_eq!(listed_lines(&root)[1].1, h2("b.example.com"));
    // Another rotation of b: one change (its material), no crt-list write.
    dir.set(served(&pki, "ns", "b", 2)).unwrap();
    let report = dir.flush().await;
    assert_eq!(report.written, 1);
    assert_eq!(report.changes.len(), 1);
    assert!(!report.index_written, "the list's text is unchanged");

    // HTTP/2 disabled: no line offers it.
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let no_http2 = CrtList::new(CrtListOptions {
        http2: false,
        ..CrtListOptions::default()
    });
    let mut dir = CertDir::open(&root, 4, Arc::new(no_http2)).await.unwrap();
    dir.set(a).unwrap();
    dir.mark_complete();
    dir.flush().await;
    assert_eq!(
        listed_lines(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
}

/// Without a change report the directory lists alike: the same crt-list after every
/// flush, through a certificate shared by three routes and given up one route at a
/// time (the ALPN rule follows), and a removal; only the reported changes differ.
#[tokio::test]
async fn lines_are_alike_without_a_change_report() {
    let pki = Pki::new(Timestamp::now());
    let (a, b, c) = (
        served(&pki, "ns", "a", 1),
        served(&pki, "ns", "b", 2),
        served(&pki, "ns", "c", 3),
    );
    let sharing = |route: &ServedCert| ServedCert {
        tls: Arc::clone(&a.tls),
        ..route.clone()
    };
    let steps: Vec<Vec<Option<ServedCert>>> = vec![
        vec![Some(a.clone()), Some(b.clone()), Some(c.clone())],
        vec![Some(sharing(&b)), Some(sharing(&c))],
        vec![Some(served(&pki, "ns", "c", 3))],
        vec![Some(served(&pki, "ns", "b", 2))],
        vec![None],
    ];
    let (with, without) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let roots = [with.path(), without.path()].map(|path| path.canonicalize().unwrap());
    let mut reporting = open(&roots[0]).await.unwrap();
    let mut silent = open(&roots[1]).await.unwrap().with_change_report(false);
    let mut alpn = Vec::new();
    for (index, step) in steps.into_iter().enumerate() {
        for dir in [&mut reporting, &mut silent] {
            for cert in &step {
                match cert {
                    Some(cert) => dir.set(cert.clone()).unwrap(),
                    None => dir.remove(&a.route),
                }
            }
            if index == 0 {
                dir.mark_complete();
            }
        }
        let (told, quiet) = (reporting.flush().await, silent.flush().await);
        assert!(!told.changes.is_empty(), "step {index}");
        assert!(
            quiet.changes.is_empty(),
            "step {index}: {:?}",
            quiet.changes
        );
        let lines = listed_lines(&roots[0]);
        assert_eq!(lines, listed_lines(&roots[1]), "step {index}");
        alpn.push(
            lines
                .iter()
                .filter(|(_, rest)| rest.starts_with("[alpn "))
                .count(),
        );
    }
    // Own certificates: ALPN on all three; a's shared by three, then by a and b:
    // none; b back on its own: all three; a gone: the other two.
    assert_eq!(alpn, [3, 0, 1, 3, 2]);
}

/// A certificate HAProxy rejected leaves the crt-list while it holds that material
/// (so that HAProxy's next load of the file does not fail on it), and comes back
/// with new material.
#[tokio::test]
async fn rejected_material_stays_out_of_the_list() {
    let (_temp, root, mut dir, _, b, pki) = a_and_b_flushed().await;
    let name = root.join(LINKS_DIR).join("ns_b.pem").display().to_string();
    dir.set_excluded(HashMap::from([(name.clone(), bundle_digest(&b.tls))]));
    let report = dir.flush().await;
    assert_eq!(report.changes.len(), 1);
    assert_eq!(report.changes[0].entry, None);
    assert_eq!(
        listed(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
    assert!(root.join("ns:b.pem").exists(), "the bundle stays");
    // New material: listed again, the exclusion is for the old one.
    dir.set(served(&pki, "ns", "b", 2)).unwrap();
    dir.flush().await;
    assert_eq!(listed(&root).len(), 2);
}

/// The refusals outlive the process: a cert directory opened again leaves the
/// refused material out of its first crt-list.
#[tokio::test]
async fn refusals_are_kept_across_a_restart() {
    let (_temp, root, mut dir, a, b, _) = a_and_b_flushed().await;
    let name = root.join(LINKS_DIR).join("ns_b.pem").display().to_string();
    let refused = HashMap::from([(name, bundle_digest(&b.tls))]);
    dir.set_excluded(refused.clone());
    dir.flush().await;
    assert_eq!(listed(&root).len(), 1);
    drop(dir);

    let mut dir = open(&root).await.unwrap();
    assert_eq!(dir.excluded(), &refused);
    dir.set(a).unwrap();
    dir.set(b).unwrap();
    dir.mark_complete();
    let report = dir.flush().await;
    assert!(
        report
            .changes
            .iter()
            .all(|change| change.route.name.as_ref() != "b")
    );
    assert_eq!(
        listed(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
    // No longer refused: listed again, and forgotten on disk.
    dir.set_excluded(HashMap::new());
    dir.flush().await;
    assert_eq!(listed(&root).len(), 2);
    assert_eq!(
        std::fs::read_to_string(root.join(REFUSED_FILE)).unwrap(),
        ""
    );
}

/// A crt-list left naming a missing file is repaired when the directory is opened.
#[tokio::test]
async fn a_list_naming_missing_files_is_repaired_at_start() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let mut dir = open(&root).await.unwrap();
    dir.set(served(&pki, "ns", "a", 1)).unwrap();
    dir.set(served(&pki, "ns", "b", 2)).unwrap();
    dir.mark_complete();
    dir.flush().await;
    std::fs::remove_file(root.join("ns:b.pem")).unwrap();
    open(&root).await.unwrap();
    assert_eq!(
        listed(&root),
        [("ns_a.pem".to_owned(), "a.example.com".to_owned())]
    );
    // The dangling link goes with the next removals.
    let mut dir = open(&root).await.unwrap();
    dir.mark_complete();
    dir.flush().await;
    assert!(
        std::fs::read_dir(root.join(LINKS_DIR))
            .unwrap()
            .next()
            .is_none()
    );
    assert!(listed(&root).is_empty());
}

/// Another proxy's index syntax: `<names> shared=<n> => <file>`, names first.
#[derive(Debug)]
struct Arrows;

impl IndexFormat for Arrows {
    fn file_name(&self) -> &str {
        "index.txt"
    }

    fn describe(&self, sni: &Sni, _chain: &[u8; 32], sharing: usize) -> Option<String> {
        match sni {
            Sni::Host(host) => Some(format!("{host} shared={sharing}")),
            Sni::Subdomain { .. } | Sni::NoHost => None,
        }
    }

    fn write_line(&self, out: &mut String, name: &str, description: &str) {
        out.push_str(&format!("{description} => {name}\n"));
    }

    fn file_named<'a>(&self, line: &'a str) -> Option<&'a str> {
        line.rsplit_once(" => ").map(|(_, file)| file)
    }
}

/// The store writes the index in the syntax it is given: its lines in the store's
/// order (oldest route first), a line's text from the names and the routes sharing the
/// chain, no line for names the syntax cannot hold, no crt-list; an index found at
/// start is repaired by the files its lines name, as the syntax reads them.
#[tokio::test]
async fn the_index_is_written_in_the_syntax_it_is_given() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let (a, b) = (
        served(&pki, "ns", "a", 2_000),
        served(&pki, "ns", "b", 1_000),
    );
    // The same certificate as b, for another host.
    let twin = ServedCert {
        route: RouteKey::new("ns", "twin"),
        sni: Sni::Host("twin.example.com".to_owned()),
        created: Some(Timestamp::from_second(4_000).unwrap()),
        tls: Arc::clone(&b.tls),
    };
    let mut hostless = served(&pki, "ns", "c", 3_000);
    hostless.sni = Sni::NoHost;
    let mut dir = CertDir::open(&root, 4, Arc::new(Arrows)).await.unwrap();
    for cert in [a, b, twin, hostless] {
        dir.set(cert).unwrap();
    }
    dir.mark_complete();
    let report = dir.flush().await;
    assert!(report.index_written);
    assert_eq!(report.written, 4);
    assert_eq!(dir.index_path(), root.join("index.txt"));
    let links = dir.links_path().to_owned();
    let link = |name: &str| links.join(name).display().to_string();
    assert_eq!(
        std::fs::read_to_string(root.join("index.txt")).unwrap(),
        format!(
            "b.example.com shared=2 => {}\na.example.com shared=1 => {}\n\
             twin.example.com shared=2 => {}\n",
            link("ns_b.pem"),
            link("ns_a.pem"),
            link("ns_twin.pem"),
        )
    );
    assert_eq!(dir.bundles_on_disk(), 4, "the hostless route's bundle too");
    assert!(!root.join(CRT_LIST_FILE).exists());

    drop(dir);
    std::fs::remove_file(root.join("ns:a.pem")).unwrap();
    CertDir::open(&root, 4, Arc::new(Arrows)).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("index.txt")).unwrap(),
        format!(
            "b.example.com shared=2 => {}\ntwin.example.com shared=2 => {}\n",
            link("ns_b.pem"),
            link("ns_twin.pem"),
        )
    );
}

/// Before start-up is complete, a directory opened with the decided report tells each
/// flush's newly set routes' lines (their bundles on disk), writes no crt-list and
/// keeps no line; the complete listing still names every line. Without the report,
/// nothing is told before it.
#[tokio::test]
async fn routes_decided_before_start_up_is_complete_are_told_as_decided() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let pki = Pki::new(Timestamp::now());
    let (a, b) = (served(&pki, "ns", "a", 1), served(&pki, "ns", "b", 2));
    let mut dir = open(&root).await.unwrap().with_decided_report(true);
    dir.set(a.clone()).unwrap();
    let report = dir.flush().await;
    let told: Vec<(String, bool)> = report
        .decided
        .iter()
        .map(|change| (change.route.to_string(), change.entry.is_some()))
        .collect();
    assert_eq!(told, [(a.route.to_string(), true)]);
    let entry = report.decided[0].entry.as_ref().unwrap();
    assert!(
        std::fs::metadata(&entry.name).is_ok(),
        "its link is on disk"
    );
    assert_eq!(entry.digest, bundle_digest(&a.tls));
    assert!(report.changes.is_empty());
    assert!(!root.join(CRT_LIST_FILE).exists());
    // The next flush tells only what was set since.
    dir.set(b.clone()).unwrap();
    let report = dir.flush().await;
    let told: Vec<String> = report
        .decided
        .iter()
        .map(|change| change.route.to_string())
        .collect();
    assert_eq!(told, [b.route.to_string()]);
    assert!(dir.flush().await.decided.is_empty());
    // a is removed before start-up is complete: the complete listing names b only.
    dir.remove(&a.route);
    dir.mark_complete();
    let report = dir.flush().await;
    assert!(report.complete_listing && report.decided.is_empty());
    let listed: Vec<(String, bool)> = report
        .changes
        .iter()
        .map(|change| (change.route.to_string(), change.entry.is_some()))
        .collect();
    assert_eq!(listed, [(b.route.to_string(), true)]);

    let other = tempfile::tempdir().unwrap();
    let mut silent = open(other.path()).await.unwrap();
    silent.set(a).unwrap();
    assert!(silent.flush().await.decided.is_empty());
}
