//! How much memory the device has: CPU reads `/proc/meminfo` (MemAvailable) and the cgroup limit (v2
//! `memory.max`/`memory.current`, else v1 `memory.limit_in_bytes`/`memory.usage_in_bytes`), and keeps the lower.
//!
//! In: nothing (the live machine) or the files' text (tests). Out: [`DeviceMemory`]. The parsing is pure; only
//! [`cpu_memory`] touches the file system.

use serde::Serialize;

/// Memory of the device the plan is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Physical memory (MemTotal), for the report.
    pub total_bytes: u64,
    /// What a new process can use now: MemAvailable, lowered to the cgroup's headroom (limit minus usage).
    pub available_bytes: u64,
    /// The cgroup memory limit, if there is one below physical memory.
    pub cgroup_limit_bytes: Option<u64>,
    /// Where `available_bytes` came from, in words.
    pub source: String,
}

/// cgroup v1 reports "no limit" as a huge number (page-rounded i64::MAX); anything above this is no limit.
const NO_LIMIT_ABOVE: u64 = 1 << 60;

impl DeviceMemory {
    /// A machine with exactly `bytes` available (`splash plan --memory`, tests).
    pub fn simulated(bytes: u64) -> DeviceMemory {
        DeviceMemory {
            total_bytes: bytes,
            available_bytes: bytes,
            cgroup_limit_bytes: None,
            source: format!("simulated {}", crate::human_bytes(bytes)),
        }
    }

    /// Combines meminfo with an optional cgroup limit and usage: available is the lower of MemAvailable and the
    /// cgroup's headroom (limit − usage; the whole limit when usage is unknown).
    pub fn from_parts(
        total_bytes: u64,
        mem_available_bytes: u64,
        cgroup_limit_bytes: Option<u64>,
        cgroup_usage_bytes: Option<u64>,
    ) -> DeviceMemory {
        let limit = cgroup_limit_bytes.filter(|&l| l < NO_LIMIT_ABOVE && l < total_bytes.max(1).saturating_mul(2));
        let headroom = limit.map(|l| l.saturating_sub(cgroup_usage_bytes.unwrap_or(0)));
        let h = crate::human_bytes;
        match headroom {
            Some(room) if room < mem_available_bytes => DeviceMemory {
                total_bytes,
                available_bytes: room,
                cgroup_limit_bytes: limit,
                source: format!(
                    "cgroup limit {} minus {} in use (MemAvailable {} is higher)",
                    h(limit.unwrap_or(0)),
                    h(cgroup_usage_bytes.unwrap_or(0)),
                    h(mem_available_bytes)
                ),
            },
            _ => DeviceMemory {
                total_bytes,
                available_bytes: mem_available_bytes,
                cgroup_limit_bytes: limit,
                source: match limit {
                    Some(l) => format!("MemAvailable of {} physical (cgroup limit {} is higher)", h(total_bytes), h(l)),
                    None => format!("MemAvailable of {} physical", h(total_bytes)),
                },
            },
        }
    }
}

/// `(MemTotal, MemAvailable)` in bytes from the text of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line[name.len()..].trim_start_matches(':').trim();
        let kib: u64 = rest.trim_end_matches("kB").trim().parse().ok()?;
        kib.checked_mul(1024)
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

/// A cgroup limit file: v2 `max` means none; v1's huge "unlimited" is handled by [`DeviceMemory::from_parts`].
pub fn parse_cgroup_value(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" { None } else { t.parse().ok() }
}

/// The live CPU memory: `/proc/meminfo`, lowered by the cgroup (v2, else v1) the process runs in.
pub fn cpu_memory() -> std::io::Result<DeviceMemory> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let (total, available) = parse_meminfo(&meminfo).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "no MemTotal/MemAvailable in /proc/meminfo")
    })?;
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|t| parse_cgroup_value(&t));
    let (limit, usage) = if std::path::Path::new("/sys/fs/cgroup/memory.max").exists() {
        (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current"))
    } else {
        (read("/sys/fs/cgroup/memory/memory.limit_in_bytes"), read("/sys/fs/cgroup/memory/memory.usage_in_bytes"))
    };
    Ok(DeviceMemory::from_parts(total, available, limit, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn meminfo_and_cgroup_files() {
        let text = "MemTotal:       24576000 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text), Some((24_576_000 * 1024, 20_000_000 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_cgroup_value("max\n"), None);
        assert_eq!(parse_cgroup_value("4294967296\n"), Some(4 * GIB));
    }

    #[test]
    fn cgroup_limit_below_physical_wins() {
        let m = DeviceMemory::from_parts(64 * GIB, 60 * GIB, Some(8 * GIB), Some(GIB));
        assert_eq!(m.available_bytes, 7 * GIB);
        assert_eq!(m.cgroup_limit_bytes, Some(8 * GIB));
        assert!(m.source.contains("cgroup limit 8.0 GiB"), "{}", m.source);
        // A limit above what is available leaves MemAvailable.
        let m = DeviceMemory::from_parts(64 * GIB, 20 * GIB, Some(32 * GIB), Some(GIB));
        assert_eq!(m.available_bytes, 20 * GIB);
        // cgroup v1's "unlimited".
        let m = DeviceMemory::from_parts(64 * GIB, 20 * GIB, Some(9_223_372_036_854_771_712), None);
        assert_eq!((m.available_bytes, m.cgroup_limit_bytes), (20 * GIB, None));
    }

    #[test]
    fn live_machine_reads() {
        if let Ok(m) = cpu_memory() {
            assert!(m.available_bytes > 0 && m.available_bytes <= m.total_bytes.max(m.available_bytes));
        }
    }
}
