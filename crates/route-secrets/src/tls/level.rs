//! The OpenSSL security level of the HAProxy that loads the served certificates.
//!
//! HAProxy refuses a certificate (and with it its whole crt-list) whose keys are weaker
//! than its OpenSSL's security level allows: RSA and DSA keys by their size, elliptic
//! curves by theirs. The OpenShift router image runs HAProxy at level 1 (its crypto
//! policy is edited from 2 to 1), where an RSA-1024 certificate loads; Debian's OpenSSL
//! defaults to level 2, where it does not. Signatures with MD5 or SHA-1 by a CA are
//! refused at every level from 1 (and by the router), so they are not a matter of level.

use std::fmt;
use std::str::FromStr;

/// An OpenSSL security level, 1 to 5 (OpenSSL's `SSL_CTX_set_security_level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecurityLevel(u8);

/// Bits of security each level demands, from level 1 (OpenSSL's table).
const MIN_SECURITY_BITS: [usize; 5] = [80, 112, 128, 192, 256];

impl SecurityLevel {
    /// The OpenShift router image's level (1).
    pub const ROUTER_IMAGE: Self = Self(1);
    /// Debian's (and OpenSSL's usual distribution) default (2).
    pub const DEBIAN_DEFAULT: Self = Self(2);

    /// The level `level`, if it is one of 1 to 5.
    pub fn new(level: u8) -> Option<Self> {
        (1..=5).contains(&level).then_some(Self(level))
    }

    /// The level as a number.
    pub fn get(self) -> u8 {
        self.0
    }

    /// The bits of security a key must offer at this level.
    pub fn min_security_bits(self) -> usize {
        MIN_SECURITY_BITS[usize::from(self.0 - 1)]
    }

    /// The smallest RSA or DSA key, in bits, loaded at this level.
    pub fn min_rsa_bits(self) -> usize {
        match self.0 {
            1 => 1024,
            2 => 2048,
            3 => 3072,
            4 => 7680,
            _ => 15360,
        }
    }

    /// Whether an RSA or DSA key of `bits` is loaded at this level.
    pub fn allows_rsa_bits(self, bits: usize) -> bool {
        bits >= self.min_rsa_bits()
    }

    /// Whether an elliptic-curve key on a curve of `bits` (224 for P-224) is loaded at
    /// this level (its security is half its size).
    pub fn allows_ec_bits(self, bits: usize) -> bool {
        bits / 2 >= self.min_security_bits()
    }

    /// An OpenSSL configuration file (for `OPENSSL_CONF`) that sets this level for every
    /// TLS context of the process, as the router image's crypto policy does.
    pub fn openssl_conf(self) -> String {
        format!(
            "openssl_conf = openssl_init\n[openssl_init]\nssl_conf = ssl_sect\n[ssl_sect]\n\
             system_default = system_default_sect\n[system_default_sect]\n\
             CipherString = DEFAULT:@SECLEVEL={}\n",
            self.0
        )
    }
}

impl Default for SecurityLevel {
    fn default() -> Self {
        Self::ROUTER_IMAGE
    }
}

impl fmt::Display for SecurityLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A level that is not one of 1 to 5.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an OpenSSL security level is a number from 1 to 5, not {0:?}")]
pub struct SecurityLevelError(String);

impl FromStr for SecurityLevel {
    type Err = SecurityLevelError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.trim()
            .parse::<u8>()
            .ok()
            .and_then(Self::new)
            .ok_or_else(|| SecurityLevelError(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenSSL's table: what HAProxy 2.6 on OpenSSL 3.0 was seen to load (RSA-1024 at 1,
    /// not at 2; P-224 at 2, not at 3).
    #[test]
    fn levels_follow_openssl() {
        let one = SecurityLevel::ROUTER_IMAGE;
        let two = SecurityLevel::DEBIAN_DEFAULT;
        let three = SecurityLevel::new(3).unwrap();
        assert!(one.allows_rsa_bits(1024) && !two.allows_rsa_bits(1024));
        assert!(two.allows_rsa_bits(2048) && !three.allows_rsa_bits(2048));
        assert!(two.allows_ec_bits(224) && !three.allows_ec_bits(224));
        assert!(three.allows_ec_bits(256));
        assert_eq!(SecurityLevel::new(0), None);
        assert_eq!(SecurityLevel::new(6), None);
        assert_eq!("2".parse::<SecurityLevel>(), Ok(two));
        assert!("x".parse::<SecurityLevel>().is_err());
        assert!(one.openssl_conf().contains("@SECLEVEL=1"));
    }
}
