//! The CPU quota of this process's cgroup, so the runtime runs as many
//! worker threads as it may use cores: more workers than the quota only park
//! and wake each other. Measured at a 1 CPU quota, one worker against two
//! (`TOKIO_WORKER_THREADS=2` forces two), alternating runs of
//! `atunnel-bench run --quick --scenarios egress-new,egress-http`: CPU per
//! new egress connection at 1,000/s 0.188 and 0.186 ms vs 0.229 and 0.222;
//! cores at 8,000 req/s 0.213 and 0.218 vs 0.276 and 0.233. Read by hand
//! because it is two small files; v2 (`cpu.max`) and v1 (`cpu.cfs_quota_us`,
//! `cpu.cfs_period_us`) both.

use std::path::Path;

/// Cores allowed by the cgroup quota, rounded up; `None` when unlimited or
/// unknown.
pub fn cgroup_cpu_limit() -> Option<usize> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2 (unified).
            if let Ok(max) = std::fs::read_to_string(root.join(path).join("cpu.max")) {
                return parse_v2(&max);
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            let dir = ["cpu,cpuacct", "cpu", "cpuacct,cpu"]
                .iter()
                .map(|m| root.join(m).join(path))
                .find(|d| d.join("cpu.cfs_quota_us").exists())?;
            let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok()?;
            let period = std::fs::read_to_string(dir.join("cpu.cfs_period_us")).ok()?;
            return parse_v1(&quota, &period);
        }
    }
    None
}

/// `cpu.max`: "<quota> <period>" or "max <period>".
fn parse_v2(max: &str) -> Option<usize> {
    let mut it = max.split_whitespace();
    let quota: u64 = it.next()?.parse().ok()?;
    let period: u64 = it.next()?.parse().ok()?;
    cores(quota, period)
}

/// `cpu.cfs_quota_us` (-1 when unlimited) and `cpu.cfs_period_us`.
fn parse_v1(quota: &str, period: &str) -> Option<usize> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok()?;
    cores(u64::try_from(quota).ok()?, period)
}

fn cores(quota: u64, period: u64) -> Option<usize> {
    (quota > 0 && period > 0).then(|| quota.div_ceil(period) as usize)
}

/// Worker threads for the runtime: the quota, at most the machine's cores;
/// `None` leaves tokio's default (also when TOKIO_WORKER_THREADS is set).
pub fn worker_threads() -> Option<usize> {
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let limit = cgroup_cpu_limit()?;
    let cpus = std::thread::available_parallelism().map_or(limit, |n| n.get());
    Some(limit.min(cpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_round_up_to_whole_cores_and_unlimited_is_none() {
        assert_eq!(parse_v2("100000 100000\n"), Some(1));
        assert_eq!(parse_v2("150000 100000\n"), Some(2));
        assert_eq!(parse_v2("50000 100000\n"), Some(1));
        assert_eq!(parse_v2("max 100000\n"), None);
        assert_eq!(parse_v2(""), None);
        assert_eq!(parse_v1("200000\n", "100000\n"), Some(2));
        assert_eq!(parse_v1("-1\n", "100000\n"), None);
        assert_eq!(parse_v1("garbage", "100000"), None);
        assert_eq!(parse_v1("100000", "0"), None);
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// The quota in whole cores, rounded up, restated.
    fn want(quota: u64, period: u64) -> Option<usize> {
        (quota > 0 && period > 0)
            .then(|| (quota / period + u64::from(!quota.is_multiple_of(period))) as usize)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn cpu_max_gives_the_quota_in_whole_cores(
            quota in prop_oneof![any::<u64>(), 0u64..1_000_000],
            period in prop_oneof![any::<u64>(), 1u64..1_000_000, Just(0)],
            unlimited in any::<bool>(),
        ) {
            if unlimited {
                prop_assert_eq!(parse_v2(&format!("max {period}\n")), None);
            } else {
                prop_assert_eq!(parse_v2(&format!("{quota} {period}\n")), want(quota, period));
            }
        }

        #[test]
        fn cfs_files_give_the_quota_in_whole_cores_and_minus_one_is_unlimited(
            quota in prop_oneof![any::<i64>(), -1i64..1_000_000],
            period in prop_oneof![any::<u64>(), 1u64..1_000_000],
        ) {
            let got = parse_v1(&format!("{quota}\n"), &format!("{period}\n"));
            prop_assert_eq!(got, u64::try_from(quota).ok().and_then(|q| want(q, period)));
        }

        #[test]
        fn any_text_is_a_quota_or_none_and_no_panic(a in "\\PC{0,40}", b in "\\PC{0,40}") {
            let _ = parse_v2(&a);
            let _ = parse_v1(&a, &b);
        }
    }
}
