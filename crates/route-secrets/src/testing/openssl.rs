//! Certificates and keys made once with OpenSSL, for what rcgen and ring cannot make:
//! SHA-1, MD5, DSA and ECDSA-SHA-1 signatures, RSA keys of any size, P-224, P-521,
//! secp256k1, brainpool, Ed448, DSA and RSASSA-PSS keys.
//!
//! `src/testing/certs/generate.sh` made them (see the README there); every certificate is
//! valid from 2020-01-01 to 2120-01-01. Leaves are for `test.example.com` and, unless
//! said otherwise, issued by [`INTERMEDIATE`] with SHA-256; a leaf's `chain` is its
//! issuer path up to the root.

use super::{KeyEncoding, pkcs8_key_as};

/// The host every leaf is for.
pub const HOST: &str = "test.example.com";

/// A certificate made by OpenSSL, with its private key (PKCS#8) and its issuers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixture {
    /// The fixture's file name, without extension.
    pub name: &'static str,
    /// The certificate (PEM).
    pub certificate: &'static str,
    /// Its private key (PKCS#8 PEM).
    pub key: &'static str,
    /// Its issuers, nearest first (PEM; empty for a self-signed certificate).
    pub chain: &'static str,
}

impl Fixture {
    /// The certificate followed by its issuers: a `tls.crt` in order.
    pub fn chain_pem(&self) -> String {
        format!("{}{}", self.certificate, self.chain)
    }

    /// The key in another encoding (PKCS#1 for RSA, SEC1 for ECDSA).
    pub fn key_as(&self, encoding: KeyEncoding) -> String {
        pkcs8_key_as(self.key, encoding)
    }
}

/// The RSA 2048-bit root CA (SHA-256).
pub const ROOT: &str = include_str!("certs/root.crt");
/// The same root, self-signed with SHA-1.
pub const ROOT_SHA1: &str = include_str!("certs/root-sha1.crt");
/// A self-signed root CA with an RSA 1024-bit key.
pub const ROOT_RSA_1024: &str = include_str!("certs/root-rsa-1024.crt");
/// The RSA 2048-bit intermediate CA, issued by [`ROOT`] (SHA-256); it issued the leaves.
pub const INTERMEDIATE: &str = include_str!("certs/intermediate.crt");
/// The same intermediate (name and key), signed by [`ROOT`] with SHA-1.
pub const INTERMEDIATE_SHA1: &str = include_str!("certs/intermediate-sha1.crt");
/// The same intermediate (name and key), signed by [`ROOT`] with MD5.
pub const INTERMEDIATE_MD5: &str = include_str!("certs/intermediate-md5.crt");
/// An intermediate CA with an RSA 1024-bit key, issued by [`ROOT`].
pub const INTERMEDIATE_RSA_1024: &str = include_str!("certs/intermediate-rsa-1024.crt");
/// The intermediate (name and key) issued by [`ROOT_RSA_1024`] instead.
pub const INTERMEDIATE_UNDER_RSA_1024_ROOT: &str =
    include_str!("certs/intermediate-under-rsa-1024-root.crt");
/// A self-signed ECDSA P-256 root CA.
pub const EC_ROOT: &str = include_str!("certs/ec-root.crt");
/// A self-signed DSA 2048-bit root CA.
pub const DSA_ROOT: &str = include_str!("certs/dsa-root.crt");

/// The intermediate then the root: the chain of the leaves the intermediate issued.
const INTERMEDIATE_AND_ROOT: &str = concat!(
    include_str!("certs/intermediate.crt"),
    include_str!("certs/root.crt")
);

/// The RSA 2048-bit key `rsa-2048-b`, which belongs to no fixture certificate.
pub const KEY_RSA_2048_B: &str = include_str!("keys/rsa-2048-b.pkcs8.pem");

/// Leaf: RSA 2048-bit (the baseline).
pub const LEAF_RSA_2048: Fixture = Fixture {
    name: "leaf-rsa-2048-a",
    certificate: include_str!("certs/leaf-rsa-2048-a.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 1024-bit: HAProxy refuses it.
pub const LEAF_RSA_1024: Fixture = Fixture {
    name: "leaf-rsa-1024",
    certificate: include_str!("certs/leaf-rsa-1024.crt"),
    key: include_str!("keys/rsa-1024.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 3072-bit.
pub const LEAF_RSA_3072: Fixture = Fixture {
    name: "leaf-rsa-3072",
    certificate: include_str!("certs/leaf-rsa-3072.crt"),
    key: include_str!("keys/rsa-3072.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 4096-bit.
pub const LEAF_RSA_4096: Fixture = Fixture {
    name: "leaf-rsa-4096",
    certificate: include_str!("certs/leaf-rsa-4096.crt"),
    key: include_str!("keys/rsa-4096.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 2048-bit with public exponent 3.
pub const LEAF_RSA_2048_E3: Fixture = Fixture {
    name: "leaf-rsa-2048-e3",
    certificate: include_str!("certs/leaf-rsa-2048-e3.crt"),
    key: include_str!("keys/rsa-2048-e3.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: ECDSA P-224.
pub const LEAF_EC_P224: Fixture = Fixture {
    name: "leaf-ec-p224",
    certificate: include_str!("certs/leaf-ec-p224.crt"),
    key: include_str!("keys/ec-p224.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: ECDSA P-521.
pub const LEAF_EC_P521: Fixture = Fixture {
    name: "leaf-ec-p521",
    certificate: include_str!("certs/leaf-ec-p521.crt"),
    key: include_str!("keys/ec-p521.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: ECDSA secp256k1: a curve the router cannot read.
pub const LEAF_EC_SECP256K1: Fixture = Fixture {
    name: "leaf-ec-secp256k1",
    certificate: include_str!("certs/leaf-ec-secp256k1.crt"),
    key: include_str!("keys/ec-secp256k1.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: ECDSA brainpoolP256r1: a curve the router cannot read.
pub const LEAF_EC_BRAINPOOL: Fixture = Fixture {
    name: "leaf-ec-brainpoolp256r1",
    certificate: include_str!("certs/leaf-ec-brainpoolp256r1.crt"),
    key: include_str!("keys/ec-brainpoolp256r1.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: Ed25519: the router serves only RSA and ECDSA keys.
pub const LEAF_ED25519: Fixture = Fixture {
    name: "leaf-ed25519",
    certificate: include_str!("certs/leaf-ed25519.crt"),
    key: include_str!("keys/ed25519.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: Ed448.
pub const LEAF_ED448: Fixture = Fixture {
    name: "leaf-ed448",
    certificate: include_str!("certs/leaf-ed448.crt"),
    key: include_str!("keys/ed448.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: DSA 2048-bit.
pub const LEAF_DSA: Fixture = Fixture {
    name: "leaf-dsa-2048",
    certificate: include_str!("certs/leaf-dsa-2048.crt"),
    key: include_str!("keys/dsa-2048.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSASSA-PSS-only RSA 2048-bit.
pub const LEAF_RSA_PSS: Fixture = Fixture {
    name: "leaf-rsa-pss-2048",
    certificate: include_str!("certs/leaf-rsa-pss-2048.crt"),
    key: include_str!("keys/rsa-pss-2048.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 2048-bit, signed by the intermediate with SHA-1.
pub const LEAF_SHA1: Fixture = Fixture {
    name: "leaf-sha1",
    certificate: include_str!("certs/leaf-sha1.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 2048-bit, signed by the intermediate with MD5.
pub const LEAF_MD5: Fixture = Fixture {
    name: "leaf-md5",
    certificate: include_str!("certs/leaf-md5.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 2048-bit, issued by [`INTERMEDIATE_RSA_1024`].
pub const LEAF_UNDER_RSA_1024: Fixture = Fixture {
    name: "leaf-under-rsa-1024",
    certificate: include_str!("certs/leaf-under-rsa-1024.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: concat!(
        include_str!("certs/intermediate-rsa-1024.crt"),
        include_str!("certs/root.crt")
    ),
};

/// Leaf: RSA 2048-bit, signed by the intermediate with RSASSA-PSS and SHA-256.
pub const LEAF_PSS_SHA256: Fixture = Fixture {
    name: "leaf-pss-sha256",
    certificate: include_str!("certs/leaf-pss-sha256.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 2048-bit, signed by the intermediate with RSASSA-PSS and SHA-1.
pub const LEAF_PSS_SHA1: Fixture = Fixture {
    name: "leaf-pss-sha1",
    certificate: include_str!("certs/leaf-pss-sha1.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: INTERMEDIATE_AND_ROOT,
};

/// Leaf: RSA 2048-bit, signed by [`EC_ROOT`] with ecdsa-with-SHA1.
pub const LEAF_ECDSA_SHA1: Fixture = Fixture {
    name: "leaf-ecdsa-sha1",
    certificate: include_str!("certs/leaf-ecdsa-sha1.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: include_str!("certs/ec-root.crt"),
};

/// Leaf: RSA 2048-bit, signed by [`DSA_ROOT`] with dsa-with-SHA1.
pub const LEAF_DSA_SHA1: Fixture = Fixture {
    name: "leaf-dsa-sha1",
    certificate: include_str!("certs/leaf-dsa-sha1.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: include_str!("certs/dsa-root.crt"),
};

/// Leaf: RSA 2048-bit, signed by [`DSA_ROOT`] with SHA-256.
pub const LEAF_UNDER_DSA_ROOT: Fixture = Fixture {
    name: "leaf-under-dsa-root",
    certificate: include_str!("certs/leaf-under-dsa-root.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: include_str!("certs/dsa-root.crt"),
};

/// Leaf: self-signed with SHA-1 (allowed: nobody verifies a self-signature).
pub const SELF_SIGNED_SHA1: Fixture = Fixture {
    name: "self-signed-sha1",
    certificate: include_str!("certs/self-signed-sha1.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: "",
};

/// Leaf: self-signed with MD5 (allowed, as SHA-1).
pub const SELF_SIGNED_MD5: Fixture = Fixture {
    name: "self-signed-md5",
    certificate: include_str!("certs/self-signed-md5.crt"),
    key: include_str!("keys/rsa-2048-a.pkcs8.pem"),
    chain: "",
};

/// Leaf: self-signed RSA 1024-bit: HAProxy refuses the key.
pub const SELF_SIGNED_RSA_1024: Fixture = Fixture {
    name: "self-signed-rsa-1024",
    certificate: include_str!("certs/self-signed-rsa-1024.crt"),
    key: include_str!("keys/rsa-1024.pkcs8.pem"),
    chain: "",
};

/// Leaf: self-signed ECDSA P-521 (SHA-512).
pub const SELF_SIGNED_EC_P521: Fixture = Fixture {
    name: "self-signed-ec-p521",
    certificate: include_str!("certs/self-signed-ec-p521.crt"),
    key: include_str!("keys/ec-p521.pkcs8.pem"),
    chain: "",
};

/// Every leaf fixture.
pub const ALL: [Fixture; 25] = [
    LEAF_PSS_SHA256,
    LEAF_PSS_SHA1,
    LEAF_RSA_2048,
    LEAF_RSA_1024,
    LEAF_RSA_3072,
    LEAF_RSA_4096,
    LEAF_RSA_2048_E3,
    LEAF_EC_P224,
    LEAF_EC_P521,
    LEAF_EC_SECP256K1,
    LEAF_EC_BRAINPOOL,
    LEAF_ED25519,
    LEAF_ED448,
    LEAF_DSA,
    LEAF_RSA_PSS,
    LEAF_SHA1,
    LEAF_MD5,
    LEAF_UNDER_RSA_1024,
    LEAF_ECDSA_SHA1,
    LEAF_DSA_SHA1,
    LEAF_UNDER_DSA_ROOT,
    SELF_SIGNED_SHA1,
    SELF_SIGNED_MD5,
    SELF_SIGNED_RSA_1024,
    SELF_SIGNED_EC_P521,
];
