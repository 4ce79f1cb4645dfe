//! The text formats of cgroupfs and procfs files, as pure functions: no
//! file is opened here, so each is tested on sample texts and fuzzed.

use std::collections::{HashMap, HashSet};

/// A v1 limit at or above this is "no limit" (the kernel prints
/// `PAGE_COUNTER_MAX` pages, 9223372036854771712 on 4 KiB pages).
pub const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

/// A single-value file such as `cpuacct.usage` or `memory.current`.
pub fn parse_u64(text: &str) -> Result<u64, String> {
    let text = text.trim();
    text.parse()
        .map_err(|e| format!("expected an unsigned integer, got {text:?}: {e}"))
}

/// A limit that may read `max` (v2 `memory.max`, `memory.peak`): `None`
/// means unlimited.
pub fn parse_limit(text: &str) -> Result<Option<u64>, String> {
    match text.trim() {
        "max" => Ok(None),
        other => parse_u64(other).map(Some),
    }
}

/// v1 `memory.limit_in_bytes`: bytes, or a huge value (`None`).
pub fn parse_v1_limit(text: &str) -> Result<Option<u64>, String> {
    parse_u64(text).map(|l| (l < V1_UNLIMITED_FLOOR).then_some(l))
}

/// v2 `cpu.max` (`"$QUOTA $PERIOD"`, quota may be `max`) as
/// `(quota_us, period_us)`; a `None` quota means unlimited.
pub fn parse_cpu_max(text: &str) -> Result<(Option<u64>, u64), String> {
    let mut fields = text.split_whitespace();
    let (Some(quota), Some(period), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(format!(
            "expected \"$QUOTA $PERIOD\", got {:?}",
            text.trim()
        ));
    };
    let quota = parse_limit(quota)?;
    let period = parse_u64(period)?;
    Ok((quota, period))
}

/// One value of a "flat keyed" file (`key value` a line: `memory.stat`),
/// without building a map: what a reading taken every interval needs.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// A "flat keyed" file whole (`memory.stat`, `cpu.stat`, `memory.events`,
/// `memory.oom_control`). Lines whose value is not an unsigned integer are
/// skipped.
pub fn parse_flat_keyed(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let key = fields.next()?;
            let value = fields.next()?.parse::<u64>().ok()?;
            if fields.next().is_some() {
                return None;
            }
            Some((key.to_string(), value))
        })
        .collect()
}

/// A `/proc/meminfo` field (`MemTotal:  24683584 kB`) in bytes.
pub fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// The controllers of `wanted` that a `cgroup.subtree_control` (or
/// `cgroup.controllers`) text does not list.
pub fn missing_controllers<'a>(list: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    let present: HashSet<&str> = list.split_whitespace().collect();
    wanted
        .iter()
        .copied()
        .filter(|c| !present.contains(c))
        .collect()
}

/// The pids of a `cgroup.procs` (or `tasks`) text, one a line; the first
/// line that is not one is the error.
pub fn parse_pids(text: &str) -> Result<Vec<u32>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.parse::<u32>().map_err(|e| format!("bad pid {l:?}: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_unlimited_as_none() {
        assert_eq!(parse_limit("max\n"), Ok(None));
        assert_eq!(parse_limit("67108864\n"), Ok(Some(67_108_864)));
        assert!(parse_limit("").is_err());
        assert_eq!(parse_v1_limit("9223372036854771712\n"), Ok(None));
        // 64 KiB pages print a different "unlimited".
        assert_eq!(parse_v1_limit("9223372036854710272\n"), Ok(None));
        assert_eq!(parse_v1_limit("67108864\n"), Ok(Some(67_108_864)));
        assert!(parse_v1_limit("-1").is_err());
        assert!(parse_u64("12 kB").is_err());
    }

    #[test]
    fn stat_and_meminfo_values() {
        let v1 = "cache 50331648\nrss 0\ninactive_file 139264\n\
            hierarchical_memory_limit 67108864\ntotal_inactive_file 50290688\n";
        assert_eq!(stat_value(v1, "total_inactive_file"), Some(50_290_688));
        // A key is matched whole, not as a prefix or suffix.
        assert_eq!(stat_value(v1, "inactive_file"), Some(139_264));
        assert_eq!(
            stat_value(v1, "hierarchical_memory_limit"),
            Some(67_108_864)
        );
        assert_eq!(stat_value(v1, "file"), None);
        let v2 = "anon 28602368\nfile 2494464\nactive_file 4096\ninactive_file 2490368\n";
        assert_eq!(stat_value(v2, "inactive_file"), Some(2_490_368));
        assert_eq!(stat_value("inactive_file x\n", "inactive_file"), None);
        let meminfo = "MemTotal:       24683584 kB\nMemFree:        17223980 kB\n\
            MemAvailable:   24061572 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(24_683_584 * 1024));
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable"),
            Some(24_061_572 * 1024)
        );
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None);
        assert_eq!(meminfo_bytes("MemTotal: lots\n", "MemTotal"), None);
    }
}
