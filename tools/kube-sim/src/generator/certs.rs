//! Certificate helpers on rcgen (ECDSA P-256 with ring): a CA, and leaf
//! certificates signed by it. Used for the server's TLS and for generated secrets.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::SimError;

/// A CA that signs leaf certificates.
pub(crate) struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate in PEM.
    pub pem: String,
}

/// A signed leaf certificate and its key.
pub(crate) struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: PrivateKeyDer<'static>,
}

fn to_offset(t: jiff::Timestamp) -> Result<time::OffsetDateTime, SimError> {
    time::OffsetDateTime::from_unix_timestamp(t.as_second())
        .map_err(|e| SimError::Tls(format!("certificate time out of range: {e}")))
}

fn validity_window(
    validity: Duration,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), SimError> {
    let now = jiff::Timestamp::now();
    let start = now - jiff::SignedDuration::from_secs(3600);
    let secs = i64::try_from(validity.as_secs()).unwrap_or(i64::MAX / 4);
    let end = now
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .map_err(|e| SimError::Tls(format!("certificate validity out of range: {e}")))?;
    Ok((to_offset(start)?, to_offset(end)?))
}

impl CertAuthority {
    /// A new self-signed CA valid for `validity` (from an hour ago).
    pub(crate) fn new(common_name: &str, validity: Duration) -> Result<CertAuthority, SimError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, "kube-sim");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let (nb, na) = validity_window(validity)?;
        params.not_before = nb;
        params.not_after = na;
        let cert = params.self_signed(&key)?;
        Ok(CertAuthority {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A server-auth leaf for `names` (DNS names or IP addresses), valid for
    /// `validity` from an hour ago.
    pub(crate) fn leaf(&self, names: &[String], validity: Duration) -> Result<Leaf, SimError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().map(String::as_str).unwrap_or("kube-sim"),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let (nb, na) = validity_window(validity)?;
        params.not_before = nb;
        params.not_after = na;
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = key.serialize_der();
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)),
        })
    }
}

/// TLS material of a simulator started with `tls: true`.
pub(crate) struct ServerTls {
    pub ca_pem: String,
    pub config: Arc<rustls::ServerConfig>,
}

/// A fresh CA and a server certificate for `names`, with ALPN `h2` and `http/1.1`.
pub(crate) fn server_tls(names: &[String]) -> Result<ServerTls, SimError> {
    let ca = CertAuthority::new(
        "kube-sim serving CA",
        Duration::from_secs(10 * 365 * 86_400),
    )?;
    let leaf = ca.leaf(names, Duration::from_secs(365 * 86_400))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SimError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.cert_der], leaf.key_der)
        .map_err(|e| SimError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerTls {
        ca_pem: ca.pem,
        config: Arc::new(config),
    })
}
