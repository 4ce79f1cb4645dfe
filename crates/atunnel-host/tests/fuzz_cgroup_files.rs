//! Property tests for the parsers of cgroup files and of
//! `/proc/mounts` and `/proc/self/cgroup`: arbitrary text and mutations of
//! the real files in `tests/fixtures/cgroup`, checked against an
//! independent statement of each format. No panic, what is well formed is
//! read exactly, what is not is skipped or refused naming the file.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use atunnel_fuzz::{Edit, Weights, apply, edits};
use atunnel_host::HostError;
use atunnel_host::counters::{V1Files, V2Files, sample_from_v1, sample_from_v2};
use atunnel_host::location::{parse_mounts, parse_proc_cgroup, plan_layout};
use atunnel_host::parse::{parse_cpu_max, parse_flat_keyed, parse_limit, parse_pids, parse_u64};
use proptest::prelude::*;

#[macro_use]
mod common;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Edits at char boundaries, drawing the characters the files' grammars
/// turn on.
fn mutations() -> impl Strategy<Value = Vec<Edit<char>>> {
    let ch = prop_oneof![
        Just(' '),
        Just('\n'),
        Just(':'),
        Just(','),
        Just('\\'),
        Just('-'),
        Just('0'),
        any::<char>(),
    ];
    let weights = Weights {
        replace: 3,
        insert: 2,
        delete: 2,
        truncate: 1,
    };
    edits(ch, weights, 1..5)
}

/// `text` with the edits applied at char boundaries.
fn mutate(text: &str, edits: &[Edit<char>]) -> String {
    apply(text.chars().collect(), edits).into_iter().collect()
}

/// Lines of a flat-keyed file: `key value`, or junk.
fn keyed_line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ("[a-z_]{1,12}", any::<u64>(), "[ \t]{1,2}").prop_map(|(k, v, sep)| format!("{k}{sep}{v}")),
        1 => ("[a-z_]{1,12}", "-?[0-9]{1,25}").prop_map(|(k, v)| format!("{k} {v}")),
        1 => "[a-z_]{1,8} [0-9]{1,4} [0-9]{1,4}",
        1 => "\\PC{0,20}",
    ]
}

/// The flat-keyed rule, restated: exactly two fields, the second a u64;
/// the last of repeated keys wins.
fn expected_keyed(text: &str) -> HashMap<String, u64> {
    let mut map = HashMap::new();
    for line in text.lines() {
        if let [key, value] = line.split_whitespace().collect::<Vec<_>>()[..]
            && let Ok(value) = value.parse::<u64>()
        {
            map.insert(key.to_owned(), value);
        }
    }
    map
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn flat_keyed_files_keep_exactly_the_key_value_lines(
        lines in prop::collection::vec(keyed_line(), 0..12),
        edits in prop::option::of(mutations()),
    ) {
        let mut text = lines.join("\n");
        if let Some(edits) = edits {
            text = mutate(&text, &edits);
        }
        prop_assert_eq!(parse_flat_keyed(&text), expected_keyed(&text));
    }

    #[test]
    fn single_values_and_limits_read_only_an_unsigned_integer_or_max(
        text in prop_oneof![
            any::<u64>().prop_map(|v| format!("{v}\n")),
            Just("max\n".to_owned()),
            "[ \t\n]{0,2}[-+0-9a-z]{0,22}[ \t\n]{0,2}",
            "\\PC{0,24}",
        ],
    ) {
        let trimmed = text.trim();
        prop_assert_eq!(parse_u64(&text).ok(), trimmed.parse::<u64>().ok());
        match parse_limit(&text) {
            Ok(None) => prop_assert_eq!(trimmed, "max"),
            Ok(Some(v)) => prop_assert_eq!(Some(v), trimmed.parse::<u64>().ok()),
            Err(e) => {
                prop_assert!(trimmed != "max" && trimmed.parse::<u64>().is_err());
                prop_assert!(!e.is_empty());
            }
        }
    }

    #[test]
    fn cpu_max_takes_two_fields_and_nothing_else(
        text in prop_oneof![
            (prop_oneof![any::<u64>().prop_map(|q| q.to_string()), Just("max".to_owned())], any::<u64>())
                .prop_map(|(q, p)| format!("{q} {p}\n")),
            (prop::sample::select(vec![fixture!("v2/cpu.max.half"), fixture!("v2/cpu.max.one"), fixture!("v2/cpu.max.unlimited")]), mutations())
                .prop_map(|(f, m)| mutate(f, &m)),
            "\\PC{0,30}",
        ],
    ) {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let want = match fields[..] {
            [q, p] => match (q, p.parse::<u64>()) {
                ("max", Ok(p)) => Some((None, p)),
                (q, Ok(p)) => q.parse::<u64>().ok().map(|q| (Some(q), p)),
                _ => None,
            },
            _ => None,
        };
        prop_assert_eq!(parse_cpu_max(&text).ok(), want);
    }
}

/// `/proc/mounts` escapes space, tab, newline and backslash in octal.
fn escape_mount_field(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.push_str(&format!("\\{b:03o}")),
            _ => out.push(char::from(b)),
        }
    }
    out
}

#[derive(Clone, Debug)]
struct Mount {
    mount_point: Vec<u8>,
    fs_type: String,
    options: Vec<String>,
}

fn mount() -> impl Strategy<Value = Mount> {
    (
        // ASCII, so the escaped line is text; with every character a
        // kernel escapes, and backslashes before digits.
        prop::collection::vec(
            prop_oneof![
                4 => 0x21u8..0x7f,
                1 => Just(b' '),
                1 => Just(b'\t'),
                1 => Just(b'\n'),
                1 => Just(b'\\'),
            ],
            1..24,
        )
        .prop_map(|mut p| {
            p.insert(0, b'/');
            p
        }),
        prop_oneof![
            Just("cgroup".to_owned()),
            Just("cgroup2".to_owned()),
            "[a-z0-9]{1,8}"
        ],
        prop::collection::vec("[a-z0-9_=]{1,10}", 1..5),
    )
        .prop_map(|(mount_point, fs_type, options)| Mount {
            mount_point,
            fs_type,
            options,
        })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mounts_read_back_escaped_paths_and_options_exactly(
        mounts in prop::collection::vec(mount(), 0..8),
    ) {
        let text: String = mounts
            .iter()
            .map(|m| {
                format!(
                    "dev {} {} {} 0 0\n",
                    escape_mount_field(&m.mount_point),
                    m.fs_type,
                    m.options.join(",")
                )
            })
            .collect();
        let parsed = parse_mounts(&text);
        prop_assert_eq!(parsed.len(), mounts.len());
        for (got, want) in parsed.iter().zip(&mounts) {
            prop_assert_eq!(&got.mount_point, &PathBuf::from(OsStr::from_bytes(&want.mount_point)));
            prop_assert_eq!(&got.fs_type, &want.fs_type);
            prop_assert_eq!(&got.options, &want.options);
        }
    }

    #[test]
    fn proc_cgroup_lines_read_back_exactly_and_junk_is_skipped(
        entries in prop::collection::vec(
            (any::<u32>(), prop::collection::vec("[a-z_=]{1,8}", 0..3), "/[ -~]{0,20}"),
            0..8,
        ),
        junk in prop::collection::vec("[^0-9\n][^\n]{0,20}", 0..3),
    ) {
        let mut text = String::new();
        for (id, controllers, path) in &entries {
            text.push_str(&format!("{id}:{}:{path}\n", controllers.join(",")));
        }
        for line in &junk {
            text.push_str(line);
            text.push('\n');
        }
        let parsed = parse_proc_cgroup(&text);
        prop_assert_eq!(parsed.len(), entries.len());
        for (got, (id, controllers, path)) in parsed.iter().zip(&entries) {
            prop_assert_eq!(got.hierarchy_id, *id);
            prop_assert_eq!(&got.controllers, controllers);
            prop_assert_eq!(&got.path, path);
        }
    }

    #[test]
    fn any_mounts_and_cgroup_text_plan_a_layout_or_say_why_not(
        system in prop::sample::select(vec![
            (fixture!("hybrid.mounts"), fixture!("hybrid.self_cgroup"), fixture!("hybrid.unified_controllers")),
            (fixture!("legacy.mounts"), fixture!("legacy.self_cgroup"), fixture!("legacy.unified_controllers")),
            (fixture!("v2.mounts"), fixture!("v2.self_cgroup"), fixture!("v2.controllers")),
        ]),
        mounts_edits in mutations(),
        cgroup_edits in mutations(),
        controllers_edits in prop::option::of(mutations()),
        arbitrary in prop::option::of("\\PC{0,80}"),
    ) {
        let (mounts, self_cgroup, controllers) = system;
        let mounts = arbitrary.unwrap_or_else(|| mutate(mounts, &mounts_edits));
        let self_cgroup = mutate(self_cgroup, &cgroup_edits);
        let controllers = controllers_edits.map(|e| mutate(controllers, &e));
        match plan_layout(&mounts, &self_cgroup, controllers.as_deref()) {
            Ok(layout) => {
                // Every place is a mount point that the text names.
                let points: Vec<PathBuf> = parse_mounts(&mounts).into_iter().map(|m| m.mount_point).collect();
                for place in [&layout.memory, &layout.cpu, &layout.cpuacct] {
                    prop_assert!(points.contains(&place.mount));
                }
            }
            Err(e) => prop_assert!(matches!(e, HostError::Unsupported(_)), "{:?}", e),
        }
    }
}

/// Parse errors must name one of the files a sample is made of.
fn names_a_file(e: &HostError, files: &[&str]) -> bool {
    match e {
        HostError::Parse { path, .. } => files.iter().any(|f| path == &PathBuf::from(f)),
        _ => false,
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_v1_sample_from_mutated_files_is_read_or_refused_naming_the_file(
        which in 0usize..8,
        edits in mutations(),
    ) {
        let mut texts = [
            fixture!("v1/cpuacct.usage").to_owned(),
            fixture!("v1/cpu.stat").to_owned(),
            fixture!("v1/memory.usage_in_bytes").to_owned(),
            fixture!("v1/memory.max_usage_in_bytes").to_owned(),
            fixture!("v1/memory.stat").to_owned(),
            fixture!("v1/memory.oom_control").to_owned(),
            fixture!("v1/memory.kmem.usage_in_bytes").to_owned(),
            fixture!("v1/memory.kmem.tcp.usage_in_bytes").to_owned(),
        ];
        texts[which] = mutate(&texts[which], &edits);
        let files = V1Files {
            cpuacct_usage: &texts[0],
            cpu_stat: &texts[1],
            memory_usage_in_bytes: &texts[2],
            memory_max_usage_in_bytes: &texts[3],
            memory_stat: &texts[4],
            memory_oom_control: &texts[5],
            memory_kmem_usage_in_bytes: Some(&texts[6]),
            memory_kmem_tcp_usage_in_bytes: Some(&texts[7]),
        };
        let names = [
            "cpuacct.usage", "cpu.stat", "memory.usage_in_bytes", "memory.max_usage_in_bytes",
            "memory.stat", "memory.oom_control", "memory.kmem.usage_in_bytes",
            "memory.kmem.tcp.usage_in_bytes",
        ];
        match sample_from_v1(&files) {
            // A single-value file that still parses gives its value.
            Ok(sample) => {
                if which == 0 {
                    prop_assert_eq!(Some(sample.cpu_usage_ns), texts[0].trim().parse::<u64>().ok());
                }
            }
            Err(e) => prop_assert!(names_a_file(&e, &[names[which]]), "{:?} for {}", e, names[which]),
        }
    }

    #[test]
    fn a_v2_sample_from_mutated_files_is_read_or_refused_naming_the_file(
        which in 0usize..5,
        edits in mutations(),
    ) {
        let mut texts = [
            fixture!("v2/cpu.stat").to_owned(),
            fixture!("v2/memory.current").to_owned(),
            fixture!("v2/memory.stat").to_owned(),
            fixture!("v2/memory.events").to_owned(),
            fixture!("v2/memory.peak").to_owned(),
        ];
        texts[which] = mutate(&texts[which], &edits);
        let files = V2Files {
            cpu_stat: &texts[0],
            memory_current: &texts[1],
            memory_stat: &texts[2],
            memory_events: &texts[3],
            memory_peak: Some(&texts[4]),
        };
        let names = ["cpu.stat", "memory.current", "memory.stat", "memory.events", "memory.peak"];
        match sample_from_v2(&files) {
            Ok(sample) => {
                if which == 1 {
                    prop_assert_eq!(Some(sample.memory_bytes), texts[1].trim().parse::<u64>().ok());
                }
            }
            Err(e) => prop_assert!(names_a_file(&e, &[names[which]]), "{:?} for {}", e, names[which]),
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// `cgroup.procs`: one pid a line; anything else is refused quoting
    /// the line.
    #[test]
    fn cgroup_procs_read_back_every_pid_or_refuse_the_bad_line(
        pids in prop::collection::vec(any::<u32>(), 0..10),
        bad in prop::option::of((any::<prop::sample::Index>(), "[ -~]{1,12}")),
    ) {
        let mut lines: Vec<String> = pids.iter().map(|p| format!(" {p}\t")).collect();
        if let Some((at, junk)) = &bad {
            lines.insert(at.index(lines.len() + 1), junk.clone());
        }
        let text = lines.join("\n");
        match parse_pids(&text) {
            Ok(got) => {
                let want: Vec<u32> = text.lines().filter_map(|l| {
                    let l = l.trim();
                    (!l.is_empty()).then(|| l.parse().expect("only pids parse"))
                }).collect();
                prop_assert_eq!(got, want);
            }
            Err(e) => {
                let (_, junk) = bad.expect("only a junk line is refused");
                prop_assert!(junk.trim().parse::<u32>().is_err());
                let quoted = format!("{:?}", junk.trim());
                prop_assert!(e.contains(&quoted), "{}", e);
            }
        }
    }
}
