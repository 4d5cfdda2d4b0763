//! What the API does to objects, independent of HTTP and of storage: metadata helpers
//! ([`meta`]), defaulting and validation as kube-apiserver applies them
//! ([`validation`]), the fields each kind may have ([`schema`]), patch bodies
//! ([`patch`]), field and label selectors ([`selectors`]), and what Services and
//! EndpointSlices get ([`network`]). The kinds themselves are [`crate::resources`].

pub(crate) mod meta;
pub(crate) mod network;
pub(crate) mod patch;
pub(crate) mod schema;
pub(crate) mod selectors;
pub(crate) mod validation;
