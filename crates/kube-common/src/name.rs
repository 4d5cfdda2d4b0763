//! Object name checks, with the messages kube-apiserver gives for them.
//!
//! Namespaces are DNS-1123 labels (at most 63 characters); most other objects,
//! secrets and routes among them, are DNS-1123 subdomains (at most 253).

/// Longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS-1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Why a string is not a valid name. `Display` is the API server's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("a name is required")]
    Empty,
    /// The name is too long.
    #[error("must be no more than {max} characters")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name has characters or a shape a DNS-1123 label does not allow.
    #[error(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
         '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
         '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    )]
    NotLabel,
    /// The name has characters or a shape a DNS-1123 subdomain does not allow.
    #[error(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
         '-' or '.', and must start and end with an alphanumeric character (e.g. \
         'example.com', regex used for validation is \
         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    )]
    NotSubdomain,
}

fn is_label_shape(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// Checks a DNS-1123 label (namespace names).
pub fn label(text: &str) -> Result<(), NameError> {
    if text.is_empty() {
        Err(NameError::Empty)
    } else if text.len() > MAX_LABEL_LEN {
        Err(NameError::TooLong {
            len: text.len(),
            max: MAX_LABEL_LEN,
        })
    } else if is_label_shape(text) {
        Ok(())
    } else {
        Err(NameError::NotLabel)
    }
}

/// Checks a DNS-1123 subdomain (names of secrets, routes and most objects; hosts).
pub fn subdomain(text: &str) -> Result<(), NameError> {
    if text.is_empty() {
        Err(NameError::Empty)
    } else if text.len() > MAX_SUBDOMAIN_LEN {
        Err(NameError::TooLong {
            len: text.len(),
            max: MAX_SUBDOMAIN_LEN,
        })
    } else if text.split('.').all(is_label_shape) {
        Ok(())
    } else {
        Err(NameError::NotSubdomain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(label("team-a"), Ok(()));
        assert_eq!(label("a.b"), Err(NameError::NotLabel));
        assert_eq!(label("-a"), Err(NameError::NotLabel));
        assert_eq!(label("A"), Err(NameError::NotLabel));
        assert_eq!(label(""), Err(NameError::Empty));
        assert_eq!(label(&"a".repeat(63)), Ok(()));
        assert_eq!(
            label(&"a".repeat(64)),
            Err(NameError::TooLong { len: 64, max: 63 })
        );
    }

    #[test]
    fn subdomains() {
        assert_eq!(subdomain("a.b-c"), Ok(()));
        assert_eq!(subdomain("shop-tls"), Ok(()));
        assert_eq!(subdomain("a..b"), Err(NameError::NotSubdomain));
        assert_eq!(subdomain("a_b"), Err(NameError::NotSubdomain));
        assert_eq!(subdomain("a."), Err(NameError::NotSubdomain));
        assert_eq!(subdomain(&"a".repeat(253)), Ok(()));
        assert!(matches!(
            subdomain(&"a".repeat(254)),
            Err(NameError::TooLong { .. })
        ));
        assert!(
            NameError::NotSubdomain
                .to_string()
                .contains("RFC 1123 subdomain")
        );
    }
}
