//! Who is asking, and may they: bearer-token authentication ([`users`]), RBAC
//! authorization over the store's Role and Binding objects ([`rbac`]), and the
//! authorization.k8s.io reviews answered from the same authorizer ([`review`]).

pub(crate) mod rbac;
pub(crate) mod review;
pub(crate) mod users;
