//! [`TlsSecret`]: a Secret as serving it needs it, decoded straight from the API
//! server's JSON.
//!
//! The secret monitor caches every watched secret for the process's life, and at
//! 10,000 routes it decodes 10,000 of them in the start-up burst. Decoded as a full
//! `k8s_openapi` `Secret`, each one allocates every metadata map (labels, annotations,
//! managed fields) only to drop them, and keeps its two TLS entries in a `BTreeMap`
//! whose one leaf (544 bytes) outweighs the key. This type reads only what serving reads:
//! `metadata.name`, `namespace`, `uid` and `resourceVersion`, the `type`, and the
//! `tls.crt` and `tls.key` entries. The deserializer passes over everything else
//! without allocating it.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use secret_monitor::WatchedObject;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::{SECRET_TYPE_TLS, TLS_CERT_ENTRY, TLS_KEY_ENTRY, TlsMaterial};

/// A `v1` Secret reduced to its identity and TLS material.
///
/// Implements [`WatchedObject`] (as a `Secret`: same API path), so that
/// [`ObjectMonitor`](secret_monitor::ObjectMonitor) watches and caches it; it holds
/// no `ObjectMeta` (whose unused fields alone took 328 bytes per cached secret), only
/// the metadata the monitor and serving read. `Debug` shows the lengths of the
/// entries, never their bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsSecret {
    name: Option<Box<str>>,
    namespace: Option<Box<str>>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    /// The secret's `type`; the TLS type is held without an allocation.
    secret_type: Option<Cow<'static, str>>,
    /// `data["tls.crt"]`, decoded.
    certificate: Option<Box<[u8]>>,
    /// `data["tls.key"]`, decoded.
    key: Option<Box<[u8]>>,
}

impl TlsSecret {
    /// A secret with the given metadata (of which the four fields kept are read), type
    /// and entries.
    pub fn new(
        metadata: ObjectMeta,
        secret_type: Option<&str>,
        certificate: Option<Vec<u8>>,
        key: Option<Vec<u8>>,
    ) -> Self {
        Self {
            name: metadata.name.map(String::into_boxed_str),
            namespace: metadata.namespace.map(String::into_boxed_str),
            uid: metadata.uid.map(String::into_boxed_str),
            resource_version: metadata.resource_version.map(String::into_boxed_str),
            secret_type: secret_type.map(secret_type_of),
            certificate: certificate.map(Vec::into_boxed_slice),
            key: key.map(Vec::into_boxed_slice),
        }
    }

    /// `metadata.name`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// The secret's metadata: the four fields kept.
    pub fn metadata(&self) -> ObjectMeta {
        let owned = |field: &Option<Box<str>>| field.as_deref().map(str::to_owned);
        ObjectMeta {
            name: owned(&self.name),
            namespace: owned(&self.namespace),
            uid: owned(&self.uid),
            resource_version: owned(&self.resource_version),
            ..ObjectMeta::default()
        }
    }

    /// The secret's `type`.
    pub fn secret_type(&self) -> Option<&str> {
        self.secret_type.as_deref()
    }

    /// The bytes of an entry of `data`: [`TLS_CERT_ENTRY`] or [`TLS_KEY_ENTRY`] (any
    /// other entry is not kept, and reads as absent).
    pub fn entry(&self, entry: &str) -> Option<&[u8]> {
        match entry {
            TLS_CERT_ENTRY => self.certificate.as_deref(),
            TLS_KEY_ENTRY => self.key.as_deref(),
            _ => None,
        }
    }

    /// What validation reads: the type and the two entries.
    pub fn material(&self) -> TlsMaterial<'_> {
        TlsMaterial {
            secret_type: self.secret_type(),
            certificate: self.certificate.as_deref(),
            key: self.key.as_deref(),
        }
    }
}

/// The type as kept: the TLS type (nearly every secret here) without an allocation.
fn secret_type_of(found: &str) -> Cow<'static, str> {
    if found == SECRET_TYPE_TLS {
        Cow::Borrowed(SECRET_TYPE_TLS)
    } else {
        Cow::Owned(found.to_owned())
    }
}

impl From<&Secret> for TlsSecret {
    fn from(secret: &Secret) -> Self {
        let entry = |name: &str| {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(name))
                .map(|value| value.0.clone())
        };
        Self::new(
            secret.metadata.clone(),
            secret.type_.as_deref(),
            entry(TLS_CERT_ENTRY),
            entry(TLS_KEY_ENTRY),
        )
    }
}

impl From<&TlsSecret> for Secret {
    fn from(secret: &TlsSecret) -> Self {
        let data: std::collections::BTreeMap<String, ByteString> = [
            (TLS_CERT_ENTRY, &secret.certificate),
            (TLS_KEY_ENTRY, &secret.key),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name.to_owned(), ByteString(value.as_deref()?.to_vec()))))
        .collect();
        Secret {
            metadata: secret.metadata(),
            type_: secret.secret_type().map(str::to_owned),
            data: (!data.is_empty()).then_some(data),
            ..Secret::default()
        }
    }
}

impl WatchedObject for TlsSecret {
    fn resource_plural() -> Cow<'static, str> {
        Secret::resource_plural()
    }

    fn collection_path(namespace: &str) -> String {
        Secret::collection_path(namespace)
    }

    fn object_name(&self) -> Option<&str> {
        self.name()
    }

    fn object_uid(&self) -> Option<&str> {
        self.uid()
    }

    fn object_resource_version(&self) -> Option<&str> {
        self.resource_version()
    }
}

/// Lengths only: the key's bytes never reach a log.
impl fmt::Debug for TlsSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("resource_version", &self.resource_version)
            .field("type", &self.secret_type)
            .field(
                "certificate_len",
                &self.certificate.as_ref().map(|c| c.len()),
            )
            .field("key_len", &self.key.as_ref().map(|k| k.len()))
            .finish()
    }
}

/// As the API server writes a Secret (for tests and tools that serve one).
impl Serialize for TlsSecret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Secret::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TlsSecret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireSecret::deserialize(deserializer)?;
        let metadata = wire.metadata.unwrap_or_default();
        let data = wire.data.unwrap_or_default();
        Ok(TlsSecret {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            secret_type: wire.secret_type.map(|kept| kept.0),
            certificate: data.certificate,
            key: data.key,
        })
    }
}

/// A Secret as the API server writes it, with only the fields kept named: serde's
/// derived field matching passes over every other key and value (as `IgnoredAny`)
/// without allocating it.
#[derive(Deserialize)]
struct WireSecret {
    #[serde(default)]
    metadata: Option<KeptMetadata>,
    #[serde(rename = "type", default)]
    secret_type: Option<KeptType>,
    #[serde(default)]
    data: Option<KeptData>,
}

/// `metadata` with only the four fields kept.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeptMetadata {
    #[serde(default)]
    name: Option<Box<str>>,
    #[serde(default)]
    namespace: Option<Box<str>>,
    #[serde(default)]
    uid: Option<Box<str>>,
    #[serde(default)]
    resource_version: Option<Box<str>>,
}

/// The two TLS entries of `data`. An entry present as null is present and empty, as
/// the full Secret's `ByteString` reads it.
#[derive(Default, Deserialize)]
struct KeptData {
    #[serde(rename = "tls.crt", default, deserialize_with = "present_entry")]
    certificate: Option<Box<[u8]>>,
    #[serde(rename = "tls.key", default, deserialize_with = "present_entry")]
    key: Option<Box<[u8]>>,
}

fn present_entry<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Box<[u8]>>, D::Error> {
    Base64Entry::deserialize(deserializer).map(|entry| Some(entry.0))
}

/// The `type`, read without a transient copy (serde reads a `Cow<str>` as owned).
struct KeptType(Cow<'static, str>);

impl<'de> Deserialize<'de> for KeptType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TypeVisitor;

        impl Visitor<'_> for TypeVisitor {
            type Value = KeptType;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a secret type")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<KeptType, E> {
                Ok(KeptType(secret_type_of(text)))
            }
        }

        deserializer.deserialize_str(TypeVisitor)
    }
}

/// An entry's value: base64, decoded as the full Secret's `ByteString` decodes it (the
/// standard alphabet, padded; null is empty), into a buffer of exactly its length
/// (`ByteString` decodes into a buffer of the estimated length, which keeping it
/// then reallocates to fit).
struct Base64Entry(Box<[u8]>);

impl<'de> Deserialize<'de> for Base64Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;

        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = Base64Entry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a base64-encoded string")
            }

            fn visit_none<E: de::Error>(self) -> Result<Base64Entry, E> {
                Ok(Base64Entry(Box::default()))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Base64Entry, E> {
                self.visit_none()
            }

            // Asked for as bytes: serde_json then hands out the string's raw bytes
            // without checking that they are UTF-8, a pass over the entry that the
            // base64 decoder makes anyway (it refuses every byte outside its ASCII
            // alphabet). Escapes are still unescaped; other deserializers give text.
            fn visit_some<D: Deserializer<'de>>(
                self,
                deserializer: D,
            ) -> Result<Base64Entry, D::Error> {
                deserializer.deserialize_bytes(self)
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Base64Entry, E> {
                self.visit_bytes(text.as_bytes())
            }

            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Base64Entry, E> {
                decode_base64(bytes).map(Base64Entry).map_err(E::custom)
            }
        }

        deserializer.deserialize_option(EntryVisitor)
    }
}

/// Decodes standard, padded base64 into a buffer of exactly the decoded length.
fn decode_base64(bytes: &[u8]) -> Result<Box<[u8]>, base64::DecodeError> {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    // Exact for valid input (a multiple of 4, with its padding); anything else fails
    // to decode below, whatever the buffer.
    let padding = bytes
        .iter()
        .rev()
        .take(2)
        .take_while(|&&b| b == b'=')
        .count();
    let exact = (bytes.len() / 4 * 3).saturating_sub(padding);
    let mut buffer = vec![0; exact];
    match STANDARD.decode_slice(bytes, &mut buffer) {
        Ok(written) => {
            buffer.truncate(written);
            Ok(buffer.into_boxed_slice())
        }
        Err(base64::DecodeSliceError::DecodeError(error)) => Err(error),
        // Not expected for valid input; decoding into a growing buffer is always right.
        Err(base64::DecodeSliceError::OutputSliceTooSmall) => {
            STANDARD.decode(bytes).map(Vec::into_boxed_slice)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_secret() -> serde_json::Value {
        serde_json::json!({
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": {
                "name": "shop-tls",
                "namespace": "shop",
                "uid": "0b6c-uid",
                "resourceVersion": "42",
                "labels": {"app": "shop"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:data": {}}}],
                "creationTimestamp": "2026-12-01T00:00:00Z"
            },
            "immutable": false,
            "data": {
                "ca.crt": "Y2E=",
                "tls.crt": "Y2VydA==",
                "tls.key": "a2V5"
            },
            "type": "kubernetes.io/tls"
        })
    }

    #[test]
    fn keeps_identity_type_and_the_two_entries_only() {
        let secret: TlsSecret = serde_json::from_value(json_secret()).unwrap();
        assert_eq!(secret.name(), Some("shop-tls"));
        assert_eq!(secret.namespace(), Some("shop"));
        assert_eq!(secret.uid(), Some("0b6c-uid"));
        assert_eq!(secret.resource_version(), Some("42"));
        let meta = secret.metadata();
        assert_eq!(
            (meta.labels.as_ref(), meta.annotations.as_ref()),
            (None, None)
        );
        assert!(meta.managed_fields.is_none() && meta.creation_timestamp.is_none());
        // What the monitor reads.
        assert_eq!(secret.object_name(), Some("shop-tls"));
        assert_eq!(secret.object_uid(), Some("0b6c-uid"));
        assert_eq!(secret.object_resource_version(), Some("42"));
        assert_eq!(TlsSecret::resource_plural(), "secrets");
        assert_eq!(
            TlsSecret::collection_path("shop"),
            "/api/v1/namespaces/shop/secrets"
        );
        assert_eq!(secret.secret_type(), Some(SECRET_TYPE_TLS));
        assert!(matches!(secret.secret_type, Some(Cow::Borrowed(_))));
        assert_eq!(secret.entry(TLS_CERT_ENTRY), Some(&b"cert"[..]));
        assert_eq!(secret.entry(TLS_KEY_ENTRY), Some(&b"key"[..]));
        assert_eq!(secret.entry("ca.crt"), None);
    }

    #[test]
    fn reads_alike_from_a_slice_and_through_a_watch_event() {
        let text = serde_json::to_vec(&json_secret()).unwrap();
        let from_slice: TlsSecret = serde_json::from_slice(&text).unwrap();
        // A watch event's object comes through serde's buffered content when `type`
        // follows `object`.
        let event = format!(
            r#"{{"object":{},"type":"ADDED"}}"#,
            String::from_utf8(text).unwrap()
        );
        let event: kube::core::WatchEvent<TlsSecret> = serde_json::from_str(&event).unwrap();
        let kube::core::WatchEvent::Added(from_event) = event else {
            panic!("not an ADDED event: {event:?}");
        };
        assert_eq!(from_event, from_slice);
    }

    #[test]
    fn matches_the_full_secret_it_was_reduced_from() {
        let full: Secret = serde_json::from_value(json_secret()).unwrap();
        let compact: TlsSecret = serde_json::from_value(json_secret()).unwrap();
        assert_eq!(TlsSecret::from(&full), compact);
        let round_trip: TlsSecret =
            serde_json::from_value(serde_json::to_value(&compact).unwrap()).unwrap();
        assert_eq!(round_trip, compact);
    }

    #[test]
    fn missing_null_and_other_types_read_as_the_full_secret_reads_them() {
        let secret: TlsSecret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "opaque", "namespace": null},
            "type": "Opaque",
            "data": {"tls.crt": null}
        }))
        .unwrap();
        assert_eq!(secret.secret_type(), Some("Opaque"));
        assert_eq!(secret.namespace(), None);
        assert_eq!(secret.entry(TLS_CERT_ENTRY), Some(&b""[..]));
        assert_eq!(secret.entry(TLS_KEY_ENTRY), None);
        let bare: TlsSecret =
            serde_json::from_value(serde_json::json!({"metadata": {}, "data": null})).unwrap();
        assert_eq!(bare.material().secret_type, None);
        assert_eq!(bare.material().certificate, None);
        let broken = serde_json::from_value::<TlsSecret>(serde_json::json!({
            "data": {"tls.key": "not base64!"}
        }));
        assert!(broken.is_err());
    }

    #[test]
    fn base64_decodes_exactly_as_the_full_secret_decodes_it() {
        use base64::Engine as _;
        let engine = &base64::engine::general_purpose::STANDARD;
        for length in 0..64_u8 {
            let bytes: Vec<u8> = (0..length).map(|b| b.wrapping_mul(37)).collect();
            let text = engine.encode(&bytes);
            let decoded = decode_base64(text.as_bytes()).unwrap();
            assert_eq!(&*decoded, &bytes[..], "{length} bytes");
            let full: ByteString = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(full.0, bytes);
        }
        for broken in ["Y", "YW=", "Y===", "not base64!", "YWJj\n"] {
            let full = serde_json::from_value::<ByteString>(serde_json::json!(broken));
            assert_eq!(
                decode_base64(broken.as_bytes()).is_err(),
                full.is_err(),
                "{broken:?}"
            );
        }
    }

    #[test]
    fn entries_read_as_raw_bytes_decode_and_refuse_as_the_full_secret() {
        let cases: [&[u8]; 6] = [
            br#"{"data":{"tls.crt":"Y2VydA=="}}"#,
            // An escaped character is unescaped before decoding.
            br#"{"data":{"tls.crt":"Y2Vy\u0064A=="}}"#,
            // Not UTF-8, a raw control character, an escaped one: never base64.
            b"{\"data\":{\"tls.crt\":\"Y2V\xffydA==\"}}",
            b"{\"data\":{\"tls.crt\":\"Y2Vy\ndA==\"}}",
            br#"{"data":{"tls.crt":"Y2Vy\ndA=="}}"#,
            br#"{"data":{"tls.crt":["Y2VydA=="]}}"#,
        ];
        let mut read = 0;
        for case in cases {
            let full = serde_json::from_slice::<Secret>(case);
            let compact = serde_json::from_slice::<TlsSecret>(case);
            let shown = String::from_utf8_lossy(case);
            assert_eq!(compact.is_ok(), full.is_ok(), "{shown}");
            if let (Ok(full), Ok(compact)) = (full, compact) {
                assert_eq!(TlsSecret::from(&full), compact, "{shown}");
                assert_eq!(compact.entry(TLS_CERT_ENTRY), Some(&b"cert"[..]));
                read += 1;
            }
        }
        assert_eq!(read, 2);
    }

    #[test]
    fn debug_shows_lengths_never_bytes() {
        let secret = TlsSecret::new(
            ObjectMeta {
                name: Some("s".into()),
                ..ObjectMeta::default()
            },
            Some(SECRET_TYPE_TLS),
            Some(b"CERTBYTES".to_vec()),
            Some(b"PRIVATEKEYBYTES".to_vec()),
        );
        let shown = format!("{secret:?}");
        assert!(!shown.contains("PRIVATEKEYBYTES") && !shown.contains("CERTBYTES"));
        assert!(shown.contains("key_len: Some(15)"), "{shown}");
    }
}
