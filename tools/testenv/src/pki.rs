//! The control plane's own credentials: a CA, the API server's serving certificate, the
//! service-account signing key and the two bearer tokens. Made fresh for every control
//! plane (ECDSA P-256 through rcgen, as the rest of the project's fixtures).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::TestEnvError;

/// PEM files and tokens for one control plane.
pub(crate) struct ControlPlanePki {
    /// The CA that signed the serving certificate (clients trust it).
    pub ca_pem: String,
    /// The API server's serving certificate, for 127.0.0.1 and localhost.
    pub serving_cert_pem: String,
    /// Its key.
    pub serving_key_pem: String,
    /// The key that signs service-account tokens.
    pub service_account_key_pem: String,
    /// Its public half, which verifies them.
    pub service_account_public_pem: String,
    /// Bearer token of the `admin` user (group `system:masters`).
    pub admin_token: String,
    /// Bearer token of the router's service account.
    pub router_token: String,
}

impl fmt::Debug for ControlPlanePki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlanePki").finish_non_exhaustive()
    }
}

impl ControlPlanePki {
    /// Fresh keys, certificates and tokens.
    pub fn generate() -> Result<Self, TestEnvError> {
        let pki_error = |what| {
            move |error: rcgen::Error| TestEnvError::Pki {
                what,
                reason: error.to_string(),
            }
        };
        let ca_key = KeyPair::generate().map_err(pki_error("CA key"))?;
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_error("CA"))?;
        ca_params.distinguished_name = common_name("certwatch testenv CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_pem = ca_params
            .self_signed(&ca_key)
            .map_err(pki_error("CA"))?
            .pem();

        let serving_key = KeyPair::generate().map_err(pki_error("serving key"))?;
        let mut serving_params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])
        .map_err(pki_error("serving certificate"))?;
        serving_params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving_params.distinguished_name = common_name("kube-apiserver");
        serving_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert_pem = serving_params
            .signed_by(&serving_key, &Issuer::from_params(&ca_params, &ca_key))
            .map_err(pki_error("serving certificate"))?
            .pem();

        let service_account_key = KeyPair::generate().map_err(pki_error("service-account key"))?;
        Ok(Self {
            ca_pem,
            serving_cert_pem,
            serving_key_pem: serving_key.serialize_pem(),
            service_account_key_pem: service_account_key.serialize_pem(),
            service_account_public_pem: service_account_key.public_key_pem(),
            admin_token: token(),
            router_token: token(),
        })
    }
}

fn common_name(name: &str) -> DistinguishedName {
    let mut distinguished_name = DistinguishedName::new();
    distinguished_name.push(DnType::CommonName, name);
    distinguished_name
}

/// 24 random bytes in hex, like the shared tool's `openssl rand -hex 24`.
fn token() -> String {
    (0..24)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}
