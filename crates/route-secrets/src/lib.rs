//! route-secrets (placeholder: being built).
