//! secret-monitor (placeholder: being built).
