//! The standard `process_*` metrics of Prometheus client libraries (CPU, memory, file
//! descriptors, start time), read from `/proc` at each scrape, so that dashboards and
//! alerts written for any exporter work on certwatch too.

/// This process's resource figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time of all threads, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors.
    pub max_fds: u64,
}

impl ProcessSample {
    /// Reads the figures now; a figure `/proc` cannot give stays 0.
    pub fn now() -> Self {
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let page = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
        // statm: size resident shared text lib data dt, in pages.
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let mut pages = statm
            .split_whitespace()
            .map(|field| field.parse::<u64>().unwrap_or(0));
        let virtual_pages = pages.next().unwrap_or(0);
        let resident_pages = pages.next().unwrap_or(0);
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |entries| entries.count());
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        Self {
            cpu_seconds: cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9,
            resident_bytes: resident_pages.saturating_mul(page),
            virtual_bytes: virtual_pages.saturating_mul(page),
            open_fds: u64::try_from(open_fds).unwrap_or(u64::MAX),
            max_fds,
        }
    }
}

/// When this process started, in Unix seconds: boot time (`btime` of `/proc/stat`)
/// plus the process's start in clock ticks since boot (field 22 of
/// `/proc/self/stat`). `None` where `/proc` cannot tell.
pub fn start_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its
    // last `)`. Field 3 is the first after it, so field 22 is the 20th.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let start_ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let boot_seconds: u64 = boot
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let ticks_per_second = rustix::param::clock_ticks_per_second().max(1);
    Some(boot_seconds as f64 + start_ticks as f64 / ticks_per_second as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_plausible() {
        let sample = ProcessSample::now();
        assert!(sample.resident_bytes > 0);
        assert!(sample.virtual_bytes >= sample.resident_bytes);
        // stdin/stdout/stderr at least, and the directory listing itself.
        assert!(sample.open_fds >= 3);
        assert!(sample.max_fds >= sample.open_fds);
        let started = start_time_seconds().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // The test process started in the last day, and not in the future.
        assert!(
            started <= now + 1.0 && started > now - 86_400.0,
            "{started} vs {now}"
        );
    }
}
