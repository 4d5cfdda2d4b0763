//! The verbs of the Kubernetes API, as RBAC rules, access reviews, audit logs and
//! `apiserver_request_total` name them.

use std::fmt;
use std::str::FromStr;

/// A Kubernetes API verb.
///
/// Serialized (and displayed) lowercase, as the API writes it: `get`, `list`,
/// `watch`, `deletecollection`, ...
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// Read one object.
    Get,
    /// Read a collection.
    List,
    /// Stream changes.
    Watch,
    /// Create an object.
    Create,
    /// Replace an object.
    Update,
    /// Patch an object.
    Patch,
    /// Delete an object.
    Delete,
    /// Delete a collection.
    #[serde(rename = "deletecollection")]
    DeleteCollection,
}

impl Verb {
    /// Every verb, in declaration order.
    pub const ALL: [Self; 8] = [
        Self::Get,
        Self::List,
        Self::Watch,
        Self::Create,
        Self::Update,
        Self::Patch,
        Self::Delete,
        Self::DeleteCollection,
    ];

    /// The verbs that only read.
    pub const READ: [Self; 3] = [Self::Get, Self::List, Self::Watch];

    /// The verb as the API writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }

    /// Whether the verb changes state (RBAC and API Priority and Fairness treat these
    /// apart from reads).
    pub const fn is_mutating(self) -> bool {
        !matches!(self, Self::Get | Self::List | Self::Watch)
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no Kubernetes verb.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown API verb {0:?} (expected one of get, list, watch, create, update, patch, delete, deletecollection)"
)]
pub struct UnknownVerb(pub String);

impl FromStr for Verb {
    type Err = UnknownVerb;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|verb| verb.as_str() == text)
            .ok_or_else(|| UnknownVerb(text.to_owned()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_verb_round_trips_through_its_name_and_serde() {
        for verb in Verb::ALL {
            assert_eq!(verb.as_str().parse::<Verb>().unwrap(), verb);
            let json = serde_json::to_string(&verb).unwrap();
            assert_eq!(json, format!("\"{verb}\""));
            assert_eq!(serde_json::from_str::<Verb>(&json).unwrap(), verb);
        }
    }

    #[test]
    fn unknown_and_differently_cased_verbs_are_refused() {
        assert!("GET".parse::<Verb>().is_err());
        assert!("*".parse::<Verb>().is_err());
        assert_eq!("escalate".parse::<Verb>().unwrap_err().0, "escalate");
    }

    #[test]
    fn reads_are_not_mutating() {
        assert!(Verb::READ.iter().all(|verb| !verb.is_mutating()));
        assert!(Verb::Create.is_mutating() && Verb::DeleteCollection.is_mutating());
    }
}
