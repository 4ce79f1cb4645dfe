//! The parsers of cgroup files and of `/proc/mounts` and
//! `/proc/self/cgroup`, on the real files of three hosts kept in
//! `tests/fixtures/cgroup`: v1 (hybrid, with cpu and cpuacct mounted apart,
//! and legacy, with them joint) and v2.

use std::path::Path;

use atunnel_host::HostError;
use atunnel_host::counters::{CgroupSample, V1Files, V2Files, sample_from_v1, sample_from_v2};
use atunnel_host::location::{CgroupVersion, parse_mounts, parse_proc_cgroup, plan_layout};
use atunnel_host::parse::{
    missing_controllers, parse_cpu_max, parse_flat_keyed, parse_limit, parse_pids, parse_u64,
};

#[macro_use]
mod common;

fn v1_files() -> V1Files<'static> {
    V1Files {
        cpuacct_usage: fixture!("v1/cpuacct.usage"),
        cpu_stat: fixture!("v1/cpu.stat"),
        memory_usage_in_bytes: fixture!("v1/memory.usage_in_bytes"),
        memory_max_usage_in_bytes: fixture!("v1/memory.max_usage_in_bytes"),
        memory_stat: fixture!("v1/memory.stat"),
        memory_oom_control: fixture!("v1/memory.oom_control"),
        memory_kmem_usage_in_bytes: Some(fixture!("v1/memory.kmem.usage_in_bytes")),
        memory_kmem_tcp_usage_in_bytes: Some(fixture!("v1/memory.kmem.tcp.usage_in_bytes")),
    }
}

fn v2_files() -> V2Files<'static> {
    V2Files {
        cpu_stat: fixture!("v2/cpu.stat"),
        memory_current: fixture!("v2/memory.current"),
        memory_stat: fixture!("v2/memory.stat"),
        memory_events: fixture!("v2/memory.events"),
        memory_peak: Some(fixture!("v2/memory.peak")),
    }
}

#[test]
fn flat_keyed_v1_memory_stat() {
    let stat = parse_flat_keyed(fixture!("v1/memory.stat"));
    assert_eq!(stat["rss"], 28_602_368);
    assert_eq!(stat["total_rss"], 28_602_368);
    assert_eq!(stat["cache"], 2_494_464);
    assert_eq!(stat["total_cache"], 2_494_464);
    assert_eq!(stat["hierarchical_memory_limit"], 67_108_864);
    assert_eq!(stat["total_swap"], 0);
}

#[test]
fn flat_keyed_v2_memory_stat() {
    let stat = parse_flat_keyed(fixture!("v2/memory.stat"));
    assert_eq!(stat["anon"], 28_602_368);
    assert_eq!(stat["file"], 2_494_464);
    assert_eq!(stat["kernel"], 1_556_480);
    assert_eq!(stat["sock"], 3_850_240);
    assert_eq!(stat["slab"], 1_260_768);
    assert_eq!(stat["pgdemote_proactive"], 0);
}

#[test]
fn flat_keyed_skips_junk() {
    let parsed = parse_flat_keyed("a 1\n\nb x\nc 2 3\n d  4 \ne -1\n");
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed["a"], 1);
    assert_eq!(parsed["d"], 4);
}

#[test]
fn cpu_stat_both_versions() {
    let v1 = parse_flat_keyed(fixture!("v1/cpu.stat"));
    assert_eq!(v1["nr_periods"], 20);
    assert_eq!(v1["nr_throttled"], 20);
    assert_eq!(v1["throttled_time"], 940_903_069);
    let v2 = parse_flat_keyed(fixture!("v2/cpu.stat"));
    assert_eq!(v2["usage_usec"], 1_052_311);
    assert_eq!(v2["nr_periods"], 21);
    assert_eq!(v2["nr_throttled"], 20);
    assert_eq!(v2["throttled_usec"], 947_512);
    // "core_sched.force_idle_usec" has a dot in the key.
    assert_eq!(v2["core_sched.force_idle_usec"], 0);
}

#[test]
fn memory_events_and_oom_control() {
    let events = parse_flat_keyed(fixture!("v2/memory.events"));
    assert_eq!(events["oom_kill"], 1);
    assert_eq!(events["max"], 1187);
    let oom = parse_flat_keyed(fixture!("v1/memory.oom_control"));
    assert_eq!(oom["oom_kill"], 0);
    assert_eq!(oom["under_oom"], 0);
    let oom = parse_flat_keyed(fixture!("v1/memory.oom_control.after_oom"));
    assert_eq!(oom["oom_kill"], 1);
}

#[test]
fn single_values_and_limits() {
    assert_eq!(parse_u64("1050014166\n"), Ok(1_050_014_166));
    assert!(parse_u64("").is_err());
    assert!(parse_u64("max\n").is_err());
    assert!(parse_u64("-1").is_err());
    assert_eq!(parse_limit("max\n"), Ok(None));
    assert_eq!(parse_limit("33554432\n"), Ok(Some(33_554_432)));
}

#[test]
fn cpu_max() {
    assert_eq!(
        parse_cpu_max(fixture!("v2/cpu.max.unlimited")),
        Ok((None, 100_000))
    );
    assert_eq!(
        parse_cpu_max(fixture!("v2/cpu.max.one")),
        Ok((Some(100_000), 100_000))
    );
    assert_eq!(
        parse_cpu_max(fixture!("v2/cpu.max.half")),
        Ok((Some(50_000), 100_000))
    );
    assert!(parse_cpu_max("100000").is_err());
    assert!(parse_cpu_max("1 2 3").is_err());
    assert!(parse_cpu_max("max max").is_err());
}

#[test]
fn v1_sample() {
    let sample = sample_from_v1(&v1_files()).expect("v1 sample");
    assert_eq!(
        sample,
        CgroupSample {
            cpu_usage_ns: 1_050_014_166,
            cpu_throttled_periods: 20,
            cpu_periods: 20,
            cpu_throttled_ns: 940_903_069,
            memory_bytes: 31_592_448,
            memory_anon_bytes: 28_602_368,
            memory_file_bytes: 2_494_464,
            kernel_bytes: 172_032,
            socket_bytes: 3_850_240,
            oom_kills: 0,
            memory_max_usage_bytes: 31_592_448,
        }
    );
}

#[test]
fn v1_sample_fallbacks() {
    // Without hierarchical totals, rss and cache are used; without kmem
    // files, kernel and socket bytes are 0.
    let files = V1Files {
        memory_stat: "cache 4096\nrss 8192\n",
        memory_oom_control: fixture!("v1/memory.oom_control.after_oom"),
        memory_kmem_usage_in_bytes: None,
        memory_kmem_tcp_usage_in_bytes: None,
        ..v1_files()
    };
    let sample = sample_from_v1(&files).expect("v1 sample");
    assert_eq!(sample.memory_anon_bytes, 8192);
    assert_eq!(sample.memory_file_bytes, 4096);
    assert_eq!(sample.kernel_bytes, 0);
    assert_eq!(sample.socket_bytes, 0);
    assert_eq!(sample.oom_kills, 1);
}

#[test]
fn v1_sample_errors_name_the_file() {
    let files = V1Files {
        cpuacct_usage: "garbage",
        ..v1_files()
    };
    let err = sample_from_v1(&files).expect_err("bad cpuacct.usage");
    assert!(
        matches!(&err, HostError::Parse { path, .. } if path == Path::new("cpuacct.usage")),
        "{err}"
    );
    let files = V1Files {
        memory_stat: "swap 0\n",
        ..v1_files()
    };
    let err = sample_from_v1(&files).expect_err("no rss");
    assert!(err.to_string().contains("memory.stat"), "{err}");
    assert!(err.to_string().contains("total_rss or rss"), "{err}");
    let located = err.located(|f| Path::new("/sys/fs/cgroup/memory/x").join(f));
    assert!(
        located
            .to_string()
            .contains("/sys/fs/cgroup/memory/x/memory.stat"),
        "{located}"
    );
}

#[test]
fn v2_sample() {
    let sample = sample_from_v2(&v2_files()).expect("v2 sample");
    assert_eq!(
        sample,
        CgroupSample {
            cpu_usage_ns: 1_052_311_000,
            cpu_throttled_periods: 20,
            cpu_periods: 21,
            cpu_throttled_ns: 947_512_000,
            memory_bytes: 33_554_432,
            memory_anon_bytes: 28_602_368,
            memory_file_bytes: 2_494_464,
            kernel_bytes: 1_556_480,
            socket_bytes: 3_850_240,
            oom_kills: 1,
            memory_max_usage_bytes: 33_554_432,
        }
    );
}

#[test]
fn v2_sample_fallbacks() {
    let files = V2Files {
        memory_stat: fixture!("v2/memory.stat.no_kernel_key"),
        memory_peak: None,
        // cpu.stat without the cpu controller enabled: no throttling keys.
        cpu_stat: "usage_usec 7\nuser_usec 5\nsystem_usec 2\n",
        ..v2_files()
    };
    let sample = sample_from_v2(&files).expect("v2 sample");
    // kernel_stack + slab + sock + pagetables
    assert_eq!(
        sample.kernel_bytes,
        32_768 + 1_260_768 + 3_850_240 + 253_952
    );
    assert_eq!(sample.memory_max_usage_bytes, 0);
    assert_eq!(sample.cpu_usage_ns, 7_000);
    assert_eq!(sample.cpu_periods, 0);
    assert_eq!(sample.cpu_throttled_periods, 0);
    assert_eq!(sample.cpu_throttled_ns, 0);
}

#[test]
fn v2_sample_errors_name_the_file() {
    let files = V2Files {
        memory_current: "max",
        ..v2_files()
    };
    let err = sample_from_v2(&files).expect_err("bad memory.current");
    assert!(err.to_string().contains("memory.current"), "{err}");
    let files = V2Files {
        cpu_stat: "nr_periods 1\n",
        ..v2_files()
    };
    let err = sample_from_v2(&files).expect_err("no usage_usec");
    assert!(err.to_string().contains("cpu.stat"), "{err}");
}

#[test]
fn cpu_seconds_and_throttling_deltas() {
    let earlier = CgroupSample {
        cpu_usage_ns: 1_000_000_000,
        cpu_throttled_periods: 3,
        cpu_periods: 10,
        cpu_throttled_ns: 5_000,
        ..CgroupSample::default()
    };
    let later = CgroupSample {
        cpu_usage_ns: 1_500_000_000,
        cpu_periods: 20,
        ..earlier
    };
    assert!((later.cpu_seconds_since(&earlier) - 0.5).abs() < 1e-12);
    assert!(!later.throttled_since(&earlier));
    let throttled = CgroupSample {
        cpu_throttled_periods: 4,
        ..later
    };
    assert!(throttled.throttled_since(&earlier));
    let throttled_time_only = CgroupSample {
        cpu_throttled_ns: 6_000,
        ..later
    };
    assert!(throttled_time_only.throttled_since(&earlier));
    // Going backwards (a different group) never yields negative time.
    assert_eq!(earlier.cpu_seconds_since(&later), 0.0);
    assert!(!earlier.throttled_since(&throttled));
    assert_eq!(later.cpu_seconds_since(&later), 0.0);
}

#[test]
fn mounts_and_proc_cgroup() {
    let mounts = parse_mounts(fixture!("hybrid.mounts"));
    let memory = mounts
        .iter()
        .find(|m| m.options.iter().any(|o| o == "memory"))
        .expect("memory mount");
    assert_eq!(memory.mount_point, Path::new("/sys/fs/cgroup/memory"));
    assert_eq!(memory.fs_type, "cgroup");
    let escaped = parse_mounts("none /mnt/a\\040b cgroup2 rw 0 0\n");
    assert_eq!(escaped[0].mount_point, Path::new("/mnt/a b"));

    let own = parse_proc_cgroup(fixture!("legacy.self_cgroup"));
    assert_eq!(own.len(), 7);
    assert_eq!(own[4].controllers, ["cpu", "cpuacct"]);
    assert_eq!(own[4].path, "/user.slice");
    assert_eq!(own[6].hierarchy_id, 0);
    assert!(own[6].controllers.is_empty());
    // A path may contain ':'.
    let odd = parse_proc_cgroup("0::/a:b\n");
    assert_eq!(odd[0].path, "/a:b");
}

#[test]
fn layout_hybrid_with_separate_cpu_and_cpuacct() {
    // This machine: v1 memory/cpu/cpuacct, cgroup2 with hugetlb only.
    let layout = plan_layout(
        fixture!("hybrid.mounts"),
        fixture!("hybrid.self_cgroup"),
        Some(fixture!("hybrid.unified_controllers")),
    )
    .expect("layout");
    assert_eq!(layout.version, CgroupVersion::V1);
    assert_eq!(layout.memory.mount, Path::new("/sys/fs/cgroup/memory"));
    assert_eq!(layout.memory.own, "/jobs/0123456789abcdef");
    assert_eq!(layout.cpu.mount, Path::new("/sys/fs/cgroup/cpu"));
    assert_eq!(layout.cpu.own, "/");
    assert_eq!(layout.cpuacct.mount, Path::new("/sys/fs/cgroup/cpuacct"));
}

#[test]
fn layout_legacy_with_joint_cpu_cpuacct() {
    let layout = plan_layout(
        fixture!("legacy.mounts"),
        fixture!("legacy.self_cgroup"),
        Some(fixture!("legacy.unified_controllers")),
    )
    .expect("layout");
    assert_eq!(layout.version, CgroupVersion::V1);
    assert_eq!(layout.cpu.mount, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    assert_eq!(layout.cpu, layout.cpuacct);
    assert_eq!(layout.cpu.own, "/user.slice");
    assert_eq!(
        layout.memory.own,
        "/user.slice/user-1000.slice/session-2.scope"
    );
}

#[test]
fn layout_unified() {
    let layout = plan_layout(
        fixture!("v2.mounts"),
        fixture!("v2.self_cgroup"),
        Some(fixture!("v2.controllers")),
    )
    .expect("layout");
    assert_eq!(layout.version, CgroupVersion::V2);
    assert_eq!(layout.memory.mount, Path::new("/sys/fs/cgroup"));
    assert_eq!(
        layout.memory.own,
        "/user.slice/user-1000.slice/session-3.scope"
    );
    assert_eq!(layout.memory, layout.cpu);
}

#[test]
fn layout_unsupported() {
    // cgroup2 without cpu/memory and no v1 controllers.
    let err = plan_layout(fixture!("v2.mounts"), "0::/\n", Some("pids io\n"))
        .expect_err("no controllers");
    assert!(matches!(err, HostError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("memory, cpu, cpuacct"), "{err}");
    let err = plan_layout("proc /proc proc rw 0 0\n", "", None).expect_err("nothing");
    assert!(err.to_string().contains("no cgroup2 mount"), "{err}");
}

#[test]
fn subtree_control() {
    assert_eq!(
        missing_controllers("cpuset io\n", &["cpu", "memory"]),
        ["cpu", "memory"]
    );
    assert!(missing_controllers("cpu io memory pids\n", &["cpu", "memory"]).is_empty());
    assert_eq!(
        missing_controllers("cpuset memory", &["cpu", "memory"]),
        ["cpu"]
    );
    assert_eq!(missing_controllers("", &["memory"]), ["memory"]);
}

#[test]
fn pids() {
    assert_eq!(parse_pids("12\n345\n").expect("pids"), [12, 345]);
    assert_eq!(parse_pids("").expect("pids"), Vec::<u32>::new());
    let bad = parse_pids("12\nx\n").expect_err("not a pid");
    assert!(bad.contains("\"x\""), "{bad}");
}
