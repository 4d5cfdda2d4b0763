//! The standard `process_*` metrics, unprefixed as every Prometheus client library
//! names them, read from `/proc` before each scrape ([`crate::process`]).
//!
//! | Metric | Type | Meaning |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | user and system CPU time |
//! | `process_resident_memory_bytes` | gauge | resident set size |
//! | `process_virtual_memory_bytes` | gauge | virtual memory size |
//! | `process_open_fds` | gauge | open file descriptors |
//! | `process_max_fds` | gauge | the soft limit on open file descriptors |
//! | `process_start_time_seconds` | gauge | start time since the Unix epoch |

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use kube_common::sync;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::clamp;
use crate::process::{ProcessSample, start_time_seconds};

/// CPU, memory, file descriptors and start time of this process.
#[derive(Debug)]
pub struct ProcessMetrics {
    cpu: Counter<f64, AtomicU64>,
    /// Guards nothing but the order of CPU-counter updates: concurrent scrapes must
    /// add each CPU second once.
    cpu_update: Mutex<()>,
    resident: Gauge,
    virtual_memory: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: Gauge<f64, AtomicU64>,
}

impl ProcessMetrics {
    pub(super) fn new() -> Self {
        let start_time = Gauge::<f64, AtomicU64>::default();
        if let Some(started) = start_time_seconds() {
            start_time.set(started);
        }
        Self {
            cpu: Counter::default(),
            cpu_update: Mutex::new(()),
            resident: Gauge::default(),
            virtual_memory: Gauge::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
            start_time,
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent",
            Unit::Seconds,
            self.cpu.clone(),
        );
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory size",
            Unit::Bytes,
            self.resident.clone(),
        );
        registry.register_with_unit(
            "process_virtual_memory",
            "Virtual memory size",
            Unit::Bytes,
            self.virtual_memory.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            self.open_fds.clone(),
        );
        registry.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            self.max_fds.clone(),
        );
        registry.register_with_unit(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Unit::Seconds,
            self.start_time.clone(),
        );
    }

    /// Reads this process's CPU, memory and file descriptors (before a scrape).
    pub fn refresh(&self) {
        let sample = ProcessSample::now();
        {
            let _order = sync::lock(&self.cpu_update);
            let delta = sample.cpu_seconds - self.cpu.get();
            if delta > 0.0 {
                self.cpu.inc_by(delta);
            }
        }
        self.resident.set(clamp(sample.resident_bytes));
        self.virtual_memory.set(clamp(sample.virtual_bytes));
        self.open_fds.set(clamp(sample.open_fds));
        self.max_fds.set(clamp(sample.max_fds));
    }
}
