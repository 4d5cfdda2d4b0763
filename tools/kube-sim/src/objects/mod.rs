//! What the API does to objects, independent of HTTP and of storage: metadata helpers
//! ([`meta`]), defaulting and validation as kube-apiserver applies them
//! ([`validation`]), the fields each kind may have ([`schema`]), patch bodies
//! ([`patch`]), and field and label selectors ([`selectors`]). The kinds themselves are [`crate::resources`].

pub(crate) mod meta;
pub(crate) mod patch;
pub(crate) mod schema;
pub(crate) mod selectors;
pub(crate) mod validation;
