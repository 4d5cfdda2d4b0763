//! kube-sim (placeholder: being built).
