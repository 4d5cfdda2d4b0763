//! Certificates from `tls.crt`: parsing, the checks each certificate must pass, and the
//! order in which the chain is served.
//!
//! The router parses every certificate of `tls.crt` (Go's `crypto/x509`), refuses
//! CA-signed ones with MD2, MD5 or SHA-1 signatures, and otherwise only requires the first
//! certificate to match the key: it neither orders nor verifies the rest. HAProxy (OpenSSL
//! at security level 2) additionally refuses the whole crt-list when any certificate of a
//! bundle has an RSA or DSA key under 2048 bits, or a CA signature with a digest weaker
//! than 112 bits, self-signed certificates excepted for the digest only.

use x509_parser::certificate::X509Certificate;
use x509_parser::error::X509Error;
use x509_parser::extensions::ParsedExtension;
use x509_parser::x509::X509Name;

use super::error::{TlsRejection, shorten};
use super::key::CertificateKey;
use super::level::SecurityLevel;

/// ring verifies RSA signatures only from keys of at least this many bits.
const RING_MIN_RSA_BITS: usize = 2048;

/// Parses each DER certificate; positions in errors are 1-based.
pub(crate) fn parse<'a>(ders: &[&'a [u8]]) -> Result<Vec<X509Certificate<'a>>, TlsRejection> {
    ders.iter()
        .enumerate()
        .map(|(index, der)| {
            let unparseable = |detail: String| TlsRejection::CertificateUnparseable {
                position: index + 1,
                detail: shorten(detail),
            };
            match x509_parser::parse_x509_certificate(der) {
                Ok((rest, _)) if !rest.is_empty() => Err(unparseable(format!(
                    "{} bytes follow the certificate inside its PEM block",
                    rest.len()
                ))),
                Ok((_, certificate)) => Ok(certificate),
                Err(err) => Err(unparseable(err.to_string())),
            }
        })
        .collect()
}

/// The family of public key a signature algorithm belongs to (Go's
/// `x509.PublicKeyAlgorithm`, as the router's self-signed test uses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyFamily {
    Rsa,
    Dsa,
    Ecdsa,
    Ed25519,
    Unknown,
}

/// What a signature algorithm is: its key family, and the name of its digest when that
/// digest is too weak to be served.
struct SignatureKind {
    family: KeyFamily,
    weak_digest: Option<&'static str>,
}

/// PKCS#1 signature algorithms, 1.2.840.113549.1.1.x: the last arc.
const PKCS1_ARC: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
/// ECDSA signature algorithms, 1.2.840.10045.4.x.
const ECDSA_ARC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
/// DSA signature algorithms: dsa-with-sha1 (1.2.840.10040.4.3) and the NIST ones
/// (2.16.840.1.101.3.4.3.1..2).
const DSA_WITH_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x03];
const NIST_DSA_ARC: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03];
/// sha1WithRSASignature from OIW (1.3.14.3.2.29), which Go also reads as SHA-1 with RSA.
const OIW_SHA1_WITH_RSA: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1d];
/// Ed25519 (1.3.101.112).
const ED25519: &[u8] = &[0x2b, 0x65, 0x70];
/// SHA-1 (1.3.14.3.2.26), the default hash of RSASSA-PSS parameters.
const SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a];
/// MD5 (1.2.840.113549.2.5), a possible (if absurd) RSASSA-PSS hash.
const MD5: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x02, 0x05];

fn signature_kind(certificate: &X509Certificate<'_>) -> SignatureKind {
    let algorithm = &certificate.signature_algorithm;
    let oid = algorithm.algorithm.as_bytes();
    let kind = |family, weak_digest| SignatureKind {
        family,
        weak_digest,
    };
    if oid == OIW_SHA1_WITH_RSA {
        return kind(KeyFamily::Rsa, Some("SHA-1"));
    }
    if oid == DSA_WITH_SHA1 {
        return kind(KeyFamily::Dsa, Some("SHA-1"));
    }
    if oid == ED25519 {
        return kind(KeyFamily::Ed25519, None);
    }
    if let Some(&[arc]) = oid.strip_prefix(PKCS1_ARC) {
        return match arc {
            2 => kind(KeyFamily::Rsa, Some("MD2")),
            3 => kind(KeyFamily::Rsa, Some("MD4")),
            4 => kind(KeyFamily::Rsa, Some("MD5")),
            5 => kind(KeyFamily::Rsa, Some("SHA-1")),
            // RSASSA-PSS: the digest is in the parameters, SHA-1 when they name none.
            10 => kind(KeyFamily::Rsa, pss_weak_digest(algorithm)),
            _ => kind(KeyFamily::Rsa, None),
        };
    }
    if let Some(rest) = oid.strip_prefix(ECDSA_ARC) {
        // ecdsa-with-SHA1 is 4.1; the SHA-2 family is 4.3.x.
        return kind(KeyFamily::Ecdsa, (rest == [0x01]).then_some("SHA-1"));
    }
    if oid.starts_with(NIST_DSA_ARC) && oid.len() == NIST_DSA_ARC.len() + 1 {
        return kind(KeyFamily::Dsa, None);
    }
    kind(KeyFamily::Unknown, None)
}

fn pss_weak_digest(algorithm: &x509_parser::x509::AlgorithmIdentifier<'_>) -> Option<&'static str> {
    use x509_parser::signature_algorithm::SignatureAlgorithm;
    let hash = match SignatureAlgorithm::try_from(algorithm) {
        Ok(SignatureAlgorithm::RSASSA_PSS(params)) => {
            params.hash_algorithm_oid().as_bytes().to_vec()
        }
        // Unreadable parameters: OpenSSL cannot use the signature either; call it SHA-1,
        // the default, rather than let it through.
        _ => SHA1.to_vec(),
    };
    if hash == SHA1 {
        Some("SHA-1")
    } else if hash == MD5 {
        Some("MD5")
    } else {
        None
    }
}

fn key_family(key: &CertificateKey) -> KeyFamily {
    match key {
        // Go reads only rsaEncryption keys as RSA.
        CertificateKey::Rsa { pss: false, .. } => KeyFamily::Rsa,
        CertificateKey::Ec(_) => KeyFamily::Ecdsa,
        CertificateKey::Dsa { .. } => KeyFamily::Dsa,
        CertificateKey::Ed25519 => KeyFamily::Ed25519,
        CertificateKey::Rsa { pss: true, .. }
        | CertificateKey::UnsupportedEc(_)
        | CertificateKey::Ed448
        | CertificateKey::Other(_) => KeyFamily::Unknown,
    }
}

/// The authority and subject key identifiers of a certificate, when present.
fn key_identifiers<'a>(
    certificate: &'a X509Certificate<'_>,
) -> (Option<&'a [u8]>, Option<&'a [u8]>) {
    let mut authority = None;
    let mut subject = None;
    for extension in certificate.iter_extensions() {
        match extension.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                authority = aki.key_identifier.as_ref().map(|id| id.0);
            }
            ParsedExtension::SubjectKeyIdentifier(id) => subject = Some(id.0),
            _ => {}
        }
    }
    (authority, subject)
}

/// The digest of the certificate's signature when it is one HAProxy refuses (and the
/// router, but for MD4 and RSASSA-PSS with SHA-1, which it cannot read): `MD2`, `MD4`,
/// `MD5` or `SHA-1`.
pub(crate) fn weak_digest(certificate: &X509Certificate<'_>) -> Option<&'static str> {
    signature_kind(certificate).weak_digest
}

/// Whether a certificate is self-signed as the router and OpenSSL decide it (OpenSSL's
/// `EXFLAG_SS`): issuer and subject are the same, the authority key identifier is absent
/// or names the certificate's own key, and the signature algorithm is one for the
/// certificate's own kind of key. The signature itself is not verified.
pub(crate) fn is_self_signed(certificate: &X509Certificate<'_>) -> bool {
    let (authority, subject) = key_identifiers(certificate);
    certificate.issuer().as_raw() == certificate.subject().as_raw()
        && authority.is_none_or(|authority| Some(authority) == subject)
        && signature_kind(certificate).family
            == key_family(&CertificateKey::of(certificate.public_key()))
}

/// Runs the per-certificate checks, in this order over the whole chain: every public key
/// is one the router can parse; no CA-signed certificate uses a weak digest; no key is
/// too small for HAProxy at OpenSSL security `level`.
pub(crate) fn check_each(
    certificates: &[X509Certificate<'_>],
    level: SecurityLevel,
) -> Result<(), TlsRejection> {
    let keys: Vec<CertificateKey> = certificates
        .iter()
        .map(|certificate| CertificateKey::of(certificate.public_key()))
        .collect();
    let subject = |index: usize| shorten(certificates[index].subject().to_string());

    for (index, key) in keys.iter().enumerate() {
        if let CertificateKey::UnsupportedEc(curve) = key {
            return Err(TlsRejection::UnsupportedCertificateKey {
                position: index + 1,
                subject: subject(index),
                algorithm: format!("ECDSA on {curve}"),
            });
        }
    }
    for (index, certificate) in certificates.iter().enumerate() {
        if let Some(digest) = signature_kind(certificate).weak_digest
            && !is_self_signed(certificate)
        {
            return Err(TlsRejection::WeakSignature {
                position: index + 1,
                subject: subject(index),
                digest,
            });
        }
    }
    for (index, key) in keys.iter().enumerate() {
        let allowed = match key {
            CertificateKey::Rsa { bits, .. } | CertificateKey::Dsa { bits } => {
                level.allows_rsa_bits(*bits)
            }
            CertificateKey::Ec(curve) => level.allows_ec_bits(curve.bits()),
            _ => continue,
        };
        if !allowed {
            return Err(TlsRejection::WeakKey {
                position: index + 1,
                subject: subject(index),
                algorithm: key.to_string(),
                level: level.get(),
            });
        }
    }
    Ok(())
}

/// What ordering needs of a certificate, read once: its names and key identifiers,
/// borrowed from the parsed certificate.
struct Identity<'c> {
    subject: &'c X509Name<'c>,
    issuer: &'c X509Name<'c>,
    authority_key_id: Option<&'c [u8]>,
    subject_key_id: Option<&'c [u8]>,
}

impl<'c> Identity<'c> {
    fn of(certificate: &'c X509Certificate<'_>) -> Self {
        let (authority, subject) = key_identifiers(certificate);
        Self {
            subject: certificate.subject(),
            issuer: certificate.issuer(),
            authority_key_id: authority,
            subject_key_id: subject,
        }
    }

    fn is_self_issued(&self) -> bool {
        same_name(self.issuer, self.subject)
    }

    /// Whether `issuer`'s name and key identifier fit this certificate's issuer.
    fn may_be_issued_by(&self, issuer: &Self) -> bool {
        same_name(self.issuer, issuer.subject)
            && match (self.authority_key_id, issuer.subject_key_id) {
                (Some(authority), Some(subject)) => authority == subject,
                _ => true,
            }
    }

    /// Whether this certificate's authority key identifier names `issuer`'s subject key
    /// identifier (both present and equal).
    fn identified_by_key_id(&self, issuer: &Self) -> bool {
        self.authority_key_id
            .is_some_and(|authority| issuer.subject_key_id == Some(authority))
    }
}

/// Names are compared as encoded first; equal text with a different string encoding
/// (PrintableString vs UTF8String) also counts as the same name.
fn same_name(a: &X509Name<'_>, b: &X509Name<'_>) -> bool {
    if a.as_raw() == b.as_raw() {
        return true;
    }
    match same_text(a, b) {
        Some(same) => same,
        // An attribute in a string type `as_str` does not read (BMPString, ...): compare
        // the names as displayed.
        None => a.to_string() == b.to_string(),
    }
}

/// Whether two names hold the same attributes with the same text, in the same order,
/// read in place (rendering each name as text costs allocations and a look-up per
/// attribute: ordering 10,000 chains did that 40,000 times). `None` when an attribute
/// compared is not in a plain string type.
fn same_text(a: &X509Name<'_>, b: &X509Name<'_>) -> Option<bool> {
    let (mut a_rdns, mut b_rdns) = (a.iter(), b.iter());
    loop {
        let (a_rdn, b_rdn) = match (a_rdns.next(), b_rdns.next()) {
            (None, None) => return Some(true),
            (Some(a_rdn), Some(b_rdn)) => (a_rdn, b_rdn),
            _ => return Some(false),
        };
        let (mut a_attributes, mut b_attributes) = (a_rdn.iter(), b_rdn.iter());
        loop {
            match (a_attributes.next(), b_attributes.next()) {
                (None, None) => break,
                (Some(a_attribute), Some(b_attribute)) => {
                    if a_attribute.attr_type() != b_attribute.attr_type() {
                        return Some(false);
                    }
                    if a_attribute.as_str().ok()? != b_attribute.as_str().ok()? {
                        return Some(false);
                    }
                }
                _ => return Some(false),
            }
        }
    }
}

/// Whether `issuer`'s signature on `certificate` does not rule it out as the issuer:
/// verified, or made with an algorithm or key size ring cannot check (then names and
/// identifiers decide). A signature that ring checks and finds wrong rules it out.
pub(crate) fn signature_fits(
    certificate: &X509Certificate<'_>,
    issuer: &X509Certificate<'_>,
) -> bool {
    !matches!(
        certificate.verify_signature(Some(issuer.public_key())),
        Err(X509Error::SignatureVerificationError) if ring_verifies_with(issuer)
    )
}

/// ring verifies RSA signatures only from keys of 2048 bits or more; for smaller keys a
/// failed verification says nothing.
fn ring_verifies_with(issuer: &X509Certificate<'_>) -> bool {
    match CertificateKey::of(issuer.public_key()) {
        CertificateKey::Rsa { bits, .. } => bits >= RING_MIN_RSA_BITS,
        _ => true,
    }
}

/// Picks the issuer of `certificate` among the `candidates` (indices into
/// `certificates` whose names and key identifiers fit), as a position in `candidates`.
///
/// A sole candidate whose subject key identifier equals the certificate's authority key
/// identifier is taken without checking the signature: that is how OpenSSL's
/// `X509_check_issued` recognises an issuer too, and the order only decides how the
/// chain is served (neither the router nor HAProxy verifies `tls.crt`'s chain). With
/// several candidates, or names alone to go by, the signature decides, first fit wins.
/// Returns the choice and how many signatures were checked.
fn pick_issuer(
    certificates: &[X509Certificate<'_>],
    identities: &[Identity<'_>],
    certificate: usize,
    candidates: &[usize],
) -> (Option<usize>, usize) {
    if let [only] = candidates
        && identities[certificate].identified_by_key_id(&identities[*only])
    {
        return (Some(0), 0);
    }
    let mut checked = 0;
    let found = candidates.iter().position(|&candidate| {
        checked += 1;
        signature_fits(&certificates[certificate], &certificates[candidate])
    });
    (found, checked)
}

/// The order to serve the chain in, as indices into `certificates`: the first (the
/// certificate the key belongs to), then its issuer, that one's issuer and so on, as far
/// as `tls.crt` holds them; then every other certificate in the order given.
///
/// Also returns the indices that are not part of the leaf's issuer path. Names are read
/// once, and a signature is only checked where the names and key identifiers leave
/// doubt (see [`pick_issuer`]), so that a well-formed chain costs no verification and
/// even a secret full of certificates in reverse order at most one per candidate.
pub(crate) fn serving_order(certificates: &[X509Certificate<'_>]) -> (Vec<usize>, Vec<usize>) {
    let (order, rest, _) = serving_order_counted(certificates);
    (order, rest)
}

/// [`serving_order`], also returning how many signatures were verified (for tests).
fn serving_order_counted(certificates: &[X509Certificate<'_>]) -> (Vec<usize>, Vec<usize>, usize) {
    let identities: Vec<Identity> = certificates.iter().map(Identity::of).collect();
    let mut order = vec![0];
    let mut rest: Vec<usize> = (1..certificates.len()).collect();
    let mut verified = 0;
    while let Some(&last) = order.last() {
        if identities[last].is_self_issued() {
            break;
        }
        let candidates: Vec<usize> = rest
            .iter()
            .copied()
            .filter(|&candidate| identities[last].may_be_issued_by(&identities[candidate]))
            .collect();
        let (found, checked) = pick_issuer(certificates, &identities, last, &candidates);
        verified += checked;
        let Some(found) = found else {
            break;
        };
        let chosen = candidates[found];
        rest.retain(|&index| index != chosen);
        order.push(chosen);
    }
    order.extend(rest.iter().copied());
    (order, rest, verified)
}

#[cfg(test)]
mod tests {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, IsCa, Issuer,
        KeyIdMethod, KeyPair, PKCS_ECDSA_P256_SHA256,
    };

    use super::*;

    /// A self-signed CA named `name` whose subject key identifier is `key_id` (derived
    /// from its key when `None`).
    struct Ca {
        params: CertificateParams,
        key: KeyPair,
        der: Vec<u8>,
    }

    fn ca(name: &str, key_id: Option<&[u8]>) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        if let Some(key_id) = key_id {
            params.key_identifier_method = KeyIdMethod::PreSpecified(key_id.to_vec());
        }
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("CA key");
        let der = params.self_signed(&key).expect("CA cert").der().to_vec();
        Ca { params, key, der }
    }

    /// A leaf issued by `issuer`, naming its key identifier when `with_authority_key_id`.
    fn leaf(issuer: &Ca, with_authority_key_id: bool) -> Vec<u8> {
        let mut params =
            CertificateParams::new(vec!["leaf.example.com".to_owned()]).expect("leaf params");
        params.use_authority_key_identifier_extension = with_authority_key_id;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("leaf key");
        params
            .signed_by(&key, &Issuer::from_params(&issuer.params, &issuer.key))
            .expect("leaf cert")
            .der()
            .to_vec()
    }

    /// Order, unrelated positions and signatures verified.
    fn order(ders: &[&[u8]]) -> (Vec<usize>, Vec<usize>, usize) {
        serving_order_counted(&parse(ders).expect("certificates parse"))
    }

    #[test]
    fn a_sole_issuer_named_by_its_key_identifier_needs_no_signature_check() {
        let issuer = ca("issuing CA", None);
        let leaf = leaf(&issuer, true);
        assert_eq!(order(&[&leaf, &issuer.der]), (vec![0, 1], vec![], 0));
        // Another CA with the same name but its own key: its identifier rules it out,
        // still without a signature check.
        let stranger = ca("issuing CA", None);
        assert_eq!(order(&[&leaf, &stranger.der]), (vec![0, 1], vec![1], 0));
        assert_eq!(
            order(&[&leaf, &stranger.der, &issuer.der]),
            (vec![0, 2, 1], vec![1], 0)
        );
    }

    #[test]
    fn names_alone_are_checked_by_signature() {
        // No authority key identifier in the leaf: the name fits both CAs, the
        // signature picks the one that issued it, whichever comes first.
        let issuer = ca("issuing CA", None);
        let impostor = ca("issuing CA", None);
        let leaf = leaf(&issuer, false);
        assert_eq!(order(&[&leaf, &issuer.der]), (vec![0, 1], vec![], 1));
        let (served, unrelated, verified) = order(&[&leaf, &impostor.der]);
        assert_eq!((served, unrelated), (vec![0, 1], vec![1]));
        assert_eq!(verified, 1);
        let (served, unrelated, verified) = order(&[&leaf, &impostor.der, &issuer.der]);
        assert_eq!((served, unrelated), (vec![0, 2, 1], vec![1]));
        assert_eq!(verified, 2);
    }

    #[test]
    fn several_candidates_with_the_same_key_identifier_are_checked_by_signature() {
        let issuer = ca("issuing CA", Some(b"same id"));
        let impostor = ca("issuing CA", Some(b"same id"));
        let leaf = leaf(&issuer, true);
        let (served, unrelated, verified) = order(&[&leaf, &impostor.der, &issuer.der]);
        assert_eq!((served, unrelated), (vec![0, 2, 1], vec![1]));
        assert_eq!(verified, 2);
        // Alone, the impostor's identifier is taken at its word: the order is only how
        // the chain is served, and nothing downstream verifies it either.
        assert_eq!(order(&[&leaf, &impostor.der]), (vec![0, 1], vec![], 0));
    }

    /// A self-signed certificate whose subject has these attributes.
    fn named(attributes: Vec<(DnType, DnValue)>) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        let mut dn = DistinguishedName::new();
        for (kind, value) in attributes {
            dn.push(kind, value);
        }
        params.distinguished_name = dn;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn names_match_by_text_whatever_the_string_type() {
        let printable = |text: &str| DnValue::PrintableString(text.try_into().expect("printable"));
        let utf8 = |text: &str| DnValue::Utf8String(text.to_owned());
        let ders = [
            named(vec![
                (DnType::OrganizationName, printable("Example")),
                (DnType::CommonName, printable("issuing CA")),
            ]),
            named(vec![
                (DnType::OrganizationName, utf8("Example")),
                (DnType::CommonName, utf8("issuing CA")),
            ]),
            named(vec![
                (DnType::OrganizationName, utf8("Example")),
                (DnType::CommonName, utf8("issuing CA 2")),
            ]),
            named(vec![(DnType::OrganizationName, utf8("Example"))]),
            named(vec![
                (DnType::CommonName, utf8("Example")),
                (DnType::CommonName, utf8("issuing CA")),
            ]),
        ];
        let ders: Vec<&[u8]> = ders.iter().map(Vec::as_slice).collect();
        let certificates = parse(&ders).expect("certificates parse");
        let subject = |index: usize| certificates[index].subject();
        assert_ne!(subject(0).as_raw(), subject(1).as_raw());
        assert!(same_name(subject(0), subject(1)));
        assert!(same_name(subject(1), subject(0)));
        for other in 2..ders.len() {
            assert!(!same_name(subject(1), subject(other)), "#{other}");
            assert!(!same_name(subject(other), subject(0)), "#{other}");
        }
    }
}
