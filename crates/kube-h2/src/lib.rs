//! kube-h2 (placeholder: being built).
