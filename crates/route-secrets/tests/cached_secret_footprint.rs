//! What one cached secret costs: the heap a decoded [`TlsSecret`] keeps, and the
//! allocations its decoding makes, against a full `Secret` slimmed by
//! `keep_tls_material` (what the daemon cached before). The secret monitor keeps one per
//! watched secret for the process's life and decodes 10,000 of them in the start-up
//! burst at 10,000 routes, so both are counted (by a global allocator that tracks live
//! bytes and calls: load-independent figures).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::core::WatchEvent;
use route_secrets::testing::{LeafSpec, Pki};
use route_secrets::tls::{self, TlsSecret};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// The system allocator, counting what is allocated and freed.
#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Secrets decoded per figure: enough that per-secret figures are exact averages.
const SECRETS: usize = 1_000;

/// A watch event of a secret as `kubectl apply` leaves it: its label, the
/// last-applied annotation (a whole copy of the data) and managed fields.
fn applied_secret_event(index: usize, crt: &str, key: &str) -> Vec<u8> {
    let applied = serde_json::json!({"data": {"tls.crt": crt, "tls.key": key}}).to_string();
    let object = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {
                "name": format!("secret-{index}"), "namespace": "shop",
                "uid": format!("6f1c1a3e-0000-4000-8000-{index:012}"),
                "resourceVersion": format!("{}", 1000 + index),
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": {"app": "shop"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied},
                "managedFields": [{
                    "manager": "kubectl-client-side-apply", "operation": "Update",
                    "apiVersion": "v1", "time": "2026-12-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:data": {".": {}, "f:tls.crt": {}, "f:tls.key": {}},
                                 "f:type": {}}
                }]
            },
            "data": {"tls.crt": crt, "tls.key": key}
    });
    // The type first, as the API server writes it (`json!` would sort it after the
    // object, which makes serde buffer the whole object before decoding it).
    format!(r#"{{"type":"ADDED","object":{object}}}"#).into_bytes()
}

/// The cache's entries decoded from `events`, with what decoding them allocated
/// (calls, whole run) and what they keep (bytes live once decoded).
struct Decoded<K> {
    cache: Vec<Arc<K>>,
    allocations_per_secret: usize,
    kept_bytes_per_secret: usize,
}

fn decode<K>(events: &[Vec<u8>], reshape: impl Fn(&mut K)) -> Decoded<K>
where
    K: serde::de::DeserializeOwned,
{
    let mut cache = Vec::with_capacity(events.len());
    let region = Region::new(ALLOCATOR);
    for event in events {
        let WatchEvent::Added(mut object) = serde_json::from_slice::<WatchEvent<K>>(event).unwrap()
        else {
            panic!("not an ADDED event");
        };
        reshape(&mut object);
        cache.push(Arc::new(object));
    }
    let stats = region.change();
    // stats_alloc counts a realloc's growth in `bytes_allocated` and its shrinkage in
    // `bytes_deallocated` already (`bytes_reallocated` is the same change again).
    let kept = stats.bytes_allocated as isize - stats.bytes_deallocated as isize;
    Decoded {
        cache,
        allocations_per_secret: (stats.allocations + stats.reallocations) / events.len(),
        kept_bytes_per_secret: usize::try_from(kept).unwrap() / events.len(),
    }
}

#[test]
fn a_cached_tls_secret_costs_far_less_to_decode_and_to_keep() {
    let pki = Pki::new(jiff::Timestamp::now());
    let leaf = pki.issue(&LeafSpec::new("shop.example", jiff::Timestamp::now()));
    let b64 =
        |text: String| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, text);
    let (crt, key) = (b64(leaf.chain_pem()), b64(leaf.key_pem()));
    let events: Vec<Vec<u8>> = (0..SECRETS)
        .map(|index| applied_secret_event(index, &crt, &key))
        .collect();
    let material = leaf.chain_pem().len() + leaf.key_pem().len();

    let full = decode::<Secret>(&events, tls::keep_tls_material);
    let compact = decode::<TlsSecret>(&events, |_| {});
    println!(
        "per secret: full Secret kept {} bytes ({} allocations to decode); \
         TlsSecret kept {} bytes ({} allocations); material {material} bytes; \
         size_of Secret {}, TlsSecret {}",
        full.kept_bytes_per_secret,
        full.allocations_per_secret,
        compact.kept_bytes_per_secret,
        compact.allocations_per_secret,
        size_of::<Secret>(),
        size_of::<TlsSecret>(),
    );

    // The same content, as validation reads it.
    for (full, compact) in full.cache.iter().zip(&compact.cache) {
        assert_eq!(&TlsSecret::from(full.as_ref()), compact.as_ref());
    }
    // Kept: the material, the four metadata strings and the object (120 bytes, no
    // `ObjectMeta`); no map, no type string. Measured: 1,867 against 2,780 bytes (see
    // docs/BENCHMARKS.md, "The cached Secrets, compact").
    assert!(
        compact.kept_bytes_per_secret + 800 <= full.kept_bytes_per_secret,
        "kept {} vs {} bytes per secret",
        compact.kept_bytes_per_secret,
        full.kept_bytes_per_secret
    );
    assert!(compact.kept_bytes_per_secret < material + 250);
    // Decoded: the Arc, the four metadata strings and the two entries, each allocated
    // once at its final size, plus serde_json's small stack for passing over nested
    // values (the managed fields); labels, annotations and managed fields themselves
    // are never allocated.
    assert!(
        compact.allocations_per_secret <= 8,
        "{} allocations per secret",
        compact.allocations_per_secret
    );
    assert!(full.allocations_per_secret >= 3 * compact.allocations_per_secret);
}
