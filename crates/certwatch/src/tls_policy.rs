//! The cluster's TLS policy (`--tls-profile`, `--tls-ciphers`, `--tls-ciphersuites`,
//! `--tls-min-version`): OpenShift's TLS security profiles (openshift/api's
//! `TLSProfiles`, Mozilla's server-side guidelines 5.8), applied to every TLS listener
//! certwatch controls: HAProxy's binds (`ssl-default-bind-*` in the configuration it
//! writes) and certwatch's own metrics endpoint (rustls, which supports a subset:
//! TLS 1.2 and 1.3 with AEAD suites only, so the policy maps to the suites both know).
//!
//! Routes never change it: no route field or annotation reaches these settings.

use std::sync::Arc;

use clap::ValueEnum;
use rustls::CipherSuite;

/// One of OpenShift's TLS security profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum TlsProfile {
    /// TLS 1.0 and later; also CBC and 3DES suites, for the oldest clients.
    Old,
    /// TLS 1.2 and later, AEAD suites only (ECDHE with AES-GCM or ChaCha20-Poly1305):
    /// OpenShift's default.
    #[default]
    Intermediate,
    /// TLS 1.3 only.
    Modern,
}

/// The lowest TLS version a listener accepts (OpenShift's `minTLSVersion`, the
/// router's `SSL_MIN_VERSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum TlsVersion {
    /// TLS 1.0.
    #[value(name = "TLSv1.0", alias = "VersionTLS10", alias = "1.0")]
    Tls10,
    /// TLS 1.1.
    #[value(name = "TLSv1.1", alias = "VersionTLS11", alias = "1.1")]
    Tls11,
    /// TLS 1.2.
    #[value(name = "TLSv1.2", alias = "VersionTLS12", alias = "1.2")]
    Tls12,
    /// TLS 1.3.
    #[value(name = "TLSv1.3", alias = "VersionTLS13", alias = "1.3")]
    Tls13,
}

impl TlsVersion {
    /// HAProxy's spelling (`ssl-min-ver`).
    pub fn haproxy(self) -> &'static str {
        match self {
            Self::Tls10 => "TLSv1.0",
            Self::Tls11 => "TLSv1.1",
            Self::Tls12 => "TLSv1.2",
            Self::Tls13 => "TLSv1.3",
        }
    }
}

/// OpenShift's profiles' cipher lists: TLS 1.3 suites (IANA names) first, then the
/// TLS 1.2 and older ones (OpenSSL names), as openshift/api lists them.
const OLD: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-RSA-AES128-SHA256",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-RSA-AES256-SHA384",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA256",
    "AES256-SHA256",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];
const INTERMEDIATE: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
];
const MODERN: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

impl TlsProfile {
    /// The profile's ciphers (TLS 1.3 suites first) and lowest version.
    fn definition(self) -> (&'static [&'static str], TlsVersion) {
        match self {
            Self::Old => (OLD, TlsVersion::Tls10),
            Self::Intermediate => (INTERMEDIATE, TlsVersion::Tls12),
            Self::Modern => (MODERN, TlsVersion::Tls13),
        }
    }
}

/// The TLS suites rustls (ring) offers, by the names OpenSSL gives them.
const RUSTLS_NAMES: [(&str, CipherSuite); 9] = [
    (
        "TLS_AES_128_GCM_SHA256",
        CipherSuite::TLS13_AES_128_GCM_SHA256,
    ),
    (
        "TLS_AES_256_GCM_SHA384",
        CipherSuite::TLS13_AES_256_GCM_SHA384,
    ),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Why a TLS policy cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsPolicyError {
    /// A cipher list holds characters no OpenSSL cipher string has (it is written
    /// into HAProxy's configuration as one word).
    #[error(
        "{flag} {value:?}: an OpenSSL cipher list is one word of names separated by ':' \
         (letters, digits and - _ + ! @ = .), e.g. {example}"
    )]
    Syntax {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// A valid value.
        example: &'static str,
    },
    /// `--tls-ciphersuites` names something that is no TLS 1.3 suite.
    #[error(
        "--tls-ciphersuites {value:?}: {name:?} is no TLS 1.3 suite; valid: \
         TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256, \
         TLS_AES_128_CCM_SHA256, TLS_AES_128_CCM_8_SHA256"
    )]
    UnknownSuite {
        /// The flag's value.
        value: String,
        /// The name.
        name: String,
    },
    /// HAProxy refuses the policy (`haproxy -c` on a configuration with it).
    #[error(
        "HAProxy refuses the TLS policy (--tls-profile {profile}{custom}): {detail}; fix \
         --tls-ciphers / --tls-ciphersuites (OpenSSL names, see `openssl ciphers -v`)"
    )]
    RefusedByHaproxy {
        /// The profile's name.
        profile: String,
        /// The custom lists given, as flags.
        custom: String,
        /// HAProxy's alert lines.
        detail: String,
    },
    /// The check with `haproxy -c` could not run.
    #[error("cannot check the TLS policy with {binary} -c: {source}")]
    Check {
        /// The binary.
        binary: String,
        /// The cause.
        source: std::io::Error,
    },
    /// No suite both the policy and rustls allow is left for certwatch's metrics
    /// endpoint.
    #[error(
        "the TLS policy leaves certwatch's metrics endpoint no suite (it supports TLS 1.2 \
         and 1.3 with {supported}); add one of them to --tls-ciphers or --tls-ciphersuites, \
         or lower --tls-min-version"
    )]
    NoRustlsSuite {
        /// The names rustls supports.
        supported: String,
    },
    /// rustls refused the protocol versions.
    #[error("the metrics endpoint's TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The TLS policy of every listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPolicy {
    /// The profile the rest derives from, unless overridden.
    pub profile: TlsProfile,
    /// TLS 1.2 and older ciphers (OpenSSL cipher string, `ssl-default-bind-ciphers`);
    /// empty: none.
    pub ciphers: String,
    /// TLS 1.3 suites (`ssl-default-bind-ciphersuites`).
    pub ciphersuites: String,
    /// The lowest version accepted.
    pub min_version: TlsVersion,
    /// Whether `ciphers` and `ciphersuites` were given rather than the profile's.
    custom: (bool, bool),
}

impl Default for TlsPolicy {
    fn default() -> Self {
        Self::from_profile(TlsProfile::default())
    }
}

fn valid_cipher_word(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_+!@=.:".contains(&b))
}

impl TlsPolicy {
    /// A profile's policy.
    pub fn from_profile(profile: TlsProfile) -> Self {
        let (names, min_version) = profile.definition();
        let (suites, ciphers): (Vec<&str>, Vec<&str>) =
            names.iter().partition(|name| name.starts_with("TLS_"));
        Self {
            profile,
            ciphers: ciphers.join(":"),
            ciphersuites: suites.join(":"),
            min_version,
            custom: (false, false),
        }
    }

    /// A profile's policy with the lists and version given instead of its own; refuses
    /// lists that cannot be written into HAProxy's configuration or name no TLS 1.3
    /// suite.
    pub fn new(
        profile: TlsProfile,
        ciphers: Option<&str>,
        ciphersuites: Option<&str>,
        min_version: Option<TlsVersion>,
    ) -> Result<Self, TlsPolicyError> {
        let mut policy = Self::from_profile(profile);
        if let Some(ciphers) = ciphers {
            if !valid_cipher_word(ciphers) {
                return Err(TlsPolicyError::Syntax {
                    flag: "--tls-ciphers",
                    value: ciphers.to_owned(),
                    example: "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256",
                });
            }
            policy.ciphers = ciphers.to_owned();
            policy.custom.0 = true;
        }
        if let Some(suites) = ciphersuites {
            if !valid_cipher_word(suites) {
                return Err(TlsPolicyError::Syntax {
                    flag: "--tls-ciphersuites",
                    value: suites.to_owned(),
                    example: "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384",
                });
            }
            const TLS13: [&str; 5] = [
                "TLS_AES_128_GCM_SHA256",
                "TLS_AES_256_GCM_SHA384",
                "TLS_CHACHA20_POLY1305_SHA256",
                "TLS_AES_128_CCM_SHA256",
                "TLS_AES_128_CCM_8_SHA256",
            ];
            if let Some(name) = suites.split(':').find(|name| !TLS13.contains(name)) {
                return Err(TlsPolicyError::UnknownSuite {
                    value: suites.to_owned(),
                    name: name.to_owned(),
                });
            }
            policy.ciphersuites = suites.to_owned();
            policy.custom.1 = true;
        }
        if let Some(version) = min_version {
            policy.min_version = version;
        }
        Ok(policy)
    }

    /// The `global` lines of HAProxy's configuration that apply the policy to every
    /// `bind ... ssl`.
    pub fn haproxy_global(&self) -> String {
        let mut out = format!(
            "  ssl-default-bind-options ssl-min-ver {} no-tls-tickets\n",
            self.min_version.haproxy()
        );
        if !self.ciphers.is_empty() {
            out.push_str(&format!("  ssl-default-bind-ciphers {}\n", self.ciphers));
        }
        out.push_str(&format!(
            "  ssl-default-bind-ciphersuites {}\n",
            self.ciphersuites
        ));
        out
    }

    /// The flags that changed the profile's lists, as a command line spells them.
    fn custom_flags(&self) -> String {
        let mut out = String::new();
        if self.custom.0 {
            out.push_str(&format!(" --tls-ciphers {}", self.ciphers));
        }
        if self.custom.1 {
            out.push_str(&format!(" --tls-ciphersuites {}", self.ciphersuites));
        }
        out
    }

    /// Names in an OpenSSL cipher string that are plain suite names (the rest:
    /// keywords and exclusions such as `!aNULL` or `HIGH`, which rustls cannot map).
    fn names(list: &str) -> impl Iterator<Item = &str> {
        list.split(':').filter(|name| !name.is_empty())
    }

    /// rustls's crypto provider and protocol versions under this policy: the suites
    /// both allow (named in the lists), the versions from `min_version` (rustls has
    /// TLS 1.2 and 1.3 only).
    pub fn rustls(
        &self,
    ) -> Result<
        (
            Arc<rustls::crypto::CryptoProvider>,
            Vec<&'static rustls::SupportedProtocolVersion>,
        ),
        TlsPolicyError,
    > {
        let mut provider = rustls::crypto::ring::default_provider();
        let tls13_allowed = |suite: CipherSuite| {
            RUSTLS_NAMES.iter().any(|(name, known)| {
                *known == suite && Self::names(&self.ciphersuites).any(|n| n == *name)
            })
        };
        let tls12_allowed = |suite: CipherSuite| {
            self.min_version <= TlsVersion::Tls12
                && RUSTLS_NAMES.iter().any(|(name, known)| {
                    *known == suite && Self::names(&self.ciphers).any(|n| n == *name)
                })
        };
        provider.cipher_suites.retain(|suite| match suite {
            rustls::SupportedCipherSuite::Tls13(_) => tls13_allowed(suite.suite()),
            rustls::SupportedCipherSuite::Tls12(_) => tls12_allowed(suite.suite()),
        });
        let mut versions = Vec::new();
        if provider
            .cipher_suites
            .iter()
            .any(|suite| matches!(suite, rustls::SupportedCipherSuite::Tls13(_)))
        {
            versions.push(&rustls::version::TLS13);
        }
        if provider
            .cipher_suites
            .iter()
            .any(|suite| matches!(suite, rustls::SupportedCipherSuite::Tls12(_)))
        {
            versions.push(&rustls::version::TLS12);
        }
        if versions.is_empty() {
            return Err(TlsPolicyError::NoRustlsSuite {
                supported: RUSTLS_NAMES
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok((Arc::new(provider), versions))
    }

    /// A rustls server configuration builder under this policy.
    pub fn rustls_server_builder(
        &self,
    ) -> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>, TlsPolicyError>
    {
        let (provider, versions) = self.rustls()?;
        Ok(rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)?)
    }

    /// Checks that `haproxy` (`binary`) accepts the policy: `haproxy -c` on a
    /// configuration with the policy's `global` lines and one TLS bind (with a
    /// throw-away self-signed certificate) in a temporary directory. `Ok(false)` when
    /// the binary cannot be run (not installed beside certwatch: its HAProxy is
    /// someone else's, which checks the configuration itself).
    pub fn check_with_haproxy(&self, binary: &std::path::Path) -> Result<bool, TlsPolicyError> {
        let check_error = |source| TlsPolicyError::Check {
            binary: binary.display().to_string(),
            source,
        };
        let dir = tempfile::tempdir().map_err(check_error)?;
        let key = rcgen::KeyPair::generate().map_err(|error| check_error(other(error)))?;
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .and_then(|params| params.self_signed(&key))
            .map_err(|error| check_error(other(error)))?;
        let pem = dir.path().join("check.pem");
        std::fs::write(&pem, format!("{}{}", cert.pem(), key.serialize_pem()))
            .map_err(check_error)?;
        let config = dir.path().join("check.cfg");
        let text = format!(
            "global\n{global}\ndefaults\n  mode http\n  timeout connect 1s\n  \
             timeout client 1s\n  timeout server 1s\n\nfrontend check\n  \
             bind unix@{socket} ssl crt {pem}\n",
            global = self.haproxy_global(),
            socket = dir.path().join("check.sock").display(),
            pem = pem.display(),
        );
        std::fs::write(&config, text).map_err(check_error)?;
        let output = match std::process::Command::new(binary)
            .arg("-c")
            .arg("-q")
            .arg("-f")
            .arg(&config)
            .output()
        {
            Ok(output) => output,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(check_error(error)),
        };
        if output.status.success() {
            return Ok(true);
        }
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let detail = text
            .lines()
            .filter(|line| line.contains("ALERT"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ");
        Err(TlsPolicyError::RefusedByHaproxy {
            profile: self
                .profile
                .to_possible_value()
                .map(|value| value.get_name().to_owned())
                .unwrap_or_default(),
            custom: self.custom_flags(),
            detail: if detail.is_empty() {
                text.trim().to_owned()
            } else {
                detail
            },
        })
    }
}

fn other(error: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intermediate_is_aead_only_from_tls_1_2() {
        let policy = TlsPolicy::default();
        assert_eq!(policy.min_version, TlsVersion::Tls12);
        assert!(!policy.ciphers.contains("CBC"));
        assert!(
            policy
                .ciphers
                .split(':')
                .all(|name| name.contains("GCM") || name.contains("CHACHA20"))
        );
        assert_eq!(
            policy.ciphersuites,
            "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
        );
        let (provider, versions) = policy.rustls().unwrap();
        assert_eq!(provider.cipher_suites.len(), 9);
        assert_eq!(versions.len(), 2);
    }

    #[test]
    fn modern_leaves_rustls_tls_1_3_only() {
        let policy = TlsPolicy::from_profile(TlsProfile::Modern);
        assert!(policy.ciphers.is_empty());
        assert!(
            !policy
                .haproxy_global()
                .contains("ssl-default-bind-ciphers ")
        );
        let (provider, versions) = policy.rustls().unwrap();
        assert_eq!(provider.cipher_suites.len(), 3);
        assert_eq!(versions, vec![&rustls::version::TLS13]);
    }

    #[test]
    fn custom_lists_are_one_word_of_known_names() {
        assert!(matches!(
            TlsPolicy::new(
                TlsProfile::Intermediate,
                Some("AES128-SHA\n  stats"),
                None,
                None
            ),
            Err(TlsPolicyError::Syntax { .. })
        ));
        assert!(matches!(
            TlsPolicy::new(TlsProfile::Intermediate, None, Some("TLS_FOO"), None),
            Err(TlsPolicyError::UnknownSuite { .. })
        ));
        let policy = TlsPolicy::new(
            TlsProfile::Intermediate,
            Some("ECDHE-RSA-AES128-GCM-SHA256"),
            Some("TLS_AES_256_GCM_SHA384"),
            Some(TlsVersion::Tls13),
        )
        .unwrap();
        let (provider, versions) = policy.rustls().unwrap();
        assert_eq!(provider.cipher_suites.len(), 1);
        assert_eq!(versions, vec![&rustls::version::TLS13]);
    }
}
