//! Authentication: bearer tokens to users. The table is fixed when the simulator
//! starts: the admin, the router's service account, and any configured users.

use std::collections::HashMap;
use std::sync::Arc;

/// The router's service-account user name.
pub const ROUTER_USER: &str = "system:serviceaccount:openshift-ingress:router";
/// The cluster admin's user name (member of `system:masters`).
pub const ADMIN_USER: &str = "admin";

/// The group whose members may do anything (hard-wired, as in kube-apiserver).
pub const MASTERS_GROUP: &str = "system:masters";
/// Added to every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// An authenticated identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// Groups.
    pub groups: Vec<String>,
}

/// Token → user table; fixed when the simulator starts.
pub(crate) struct Users {
    by_token: HashMap<String, Arc<UserInfo>>,
}

impl Users {
    pub(crate) fn new(users: impl IntoIterator<Item = (String, UserInfo)>) -> Users {
        Users {
            by_token: users
                .into_iter()
                .map(|(token, mut info)| {
                    if !info.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                        info.groups.push(AUTHENTICATED_GROUP.to_string());
                    }
                    (token, Arc::new(info))
                })
                .collect(),
        }
    }

    /// The user for an `Authorization` header value, if it carries a known token.
    pub(crate) fn authenticate(&self, header: Option<&str>) -> Option<Arc<UserInfo>> {
        let value = header?.trim();
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.by_token.get(token.trim()).cloned()
    }
}
