//! The benchmarked process's own resource use: peak and current resident memory from
//! `/proc/self/status`, CPU time from the process CPU-time clock.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Memory and CPU of this process, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Peak resident set size (`VmHWM`), in bytes; 0 where `/proc` is unavailable.
    pub rss_peak_bytes: u64,
    /// Resident set size now (`VmRSS`), in bytes; 0 where `/proc` is unavailable.
    pub rss_bytes: u64,
    /// User plus system CPU time of every thread, in milliseconds.
    pub cpu_ms: u64,
}

impl ProcessStats {
    /// Reads this process's figures now.
    pub fn now() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Self {
            rss_peak_bytes: status_kib(&status, "VmHWM:").saturating_mul(1024),
            rss_bytes: status_kib(&status, "VmRSS:").saturating_mul(1024),
            cpu_ms: u64::try_from(process_cpu_time().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// CPU time consumed by all threads of this process (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu_time() -> Duration {
    let spec = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let secs = u64::try_from(spec.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(spec.tv_nsec).unwrap_or(0);
    Duration::new(secs, nanos)
}

/// CPU time (user + system, all threads) of another process, from
/// `/proc/<pid>/stat`; `None` when it cannot be read.
pub fn other_process_cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = stat_cpu_ticks(&stat)?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Some(ticks.saturating_mul(1000) / per_second)
}

/// Peak resident set (`VmHWM`) of another process, in bytes; `None` when it cannot be
/// read (gone, or a zombie).
pub fn other_process_peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status_kib(&status, "VmHWM:");
    (kib > 0).then(|| kib.saturating_mul(1024))
}

/// Resident set (`VmRSS`) of another process now, in bytes; `None` when it cannot be
/// read (gone, or a zombie).
pub fn other_process_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status_kib(&status, "VmRSS:");
    (kib > 0).then(|| kib.saturating_mul(1024))
}

/// The parent of another process (`PPid`), if it can be read.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:"))
        .and_then(|rest| rest.trim().parse().ok())
}

/// The children of another process (of every thread of it), in the order the kernel
/// lists them, thread by thread; empty when they cannot be read.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|listed| {
            listed
                .split_whitespace()
                .filter_map(|child| child.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// `utime + stime` from a `/proc/<pid>/stat` line. The command name (field 2) may
/// contain spaces and parentheses, so fields are counted after its last `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // Fields 3 (state) to 13 come first; utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The value of a `Key:   1234 kB` line of `/proc/self/status`, in KiB (0 if absent).
fn status_kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Bytes as MiB with one decimal (how the reports show memory).
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_lines() {
        let status = "Name:\tcertwatch\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_kib(status, "VmHWM:"), 20480);
        assert_eq!(status_kib(status, "VmRSS:"), 10240);
        assert_eq!(status_kib(status, "VmSwap:"), 0);
    }

    #[test]
    fn parses_stat_lines() {
        let stat = "4242 (cert watch) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 3 0 100";
        assert_eq!(stat_cpu_ticks(stat), Some(175));
        assert_eq!(stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn reads_another_process_by_pid() {
        let me = std::process::id();
        assert_eq!(parent_pid(me), Some(std::os::unix::process::parent_id()));
        // The peak, read by pid after the resident set now: never below it.
        let resident = ProcessStats::now().rss_bytes;
        let peak = other_process_peak_rss_bytes(me).unwrap_or(0);
        assert!(resident > 0);
        assert!(peak >= resident, "{peak} < {resident}");
        assert_eq!(other_process_peak_rss_bytes(u32::MAX), None);
        assert_eq!(parent_pid(u32::MAX), None);
    }

    #[test]
    fn lists_a_process_children() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let listed = children(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed.contains(&child.id()), "{listed:?}");
        assert!(children(u32::MAX).is_empty());
    }

    #[test]
    fn reads_this_process() {
        let stats = ProcessStats::now();
        assert!(stats.rss_peak_bytes >= stats.rss_bytes);
        assert!(stats.rss_bytes > 0);
    }
}
