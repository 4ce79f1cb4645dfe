//! Checks of the workspace as a whole, from its sources and cargo's view
//! of them: what a plain build ships, and that no module imports run in a
//! circle. No build, no network, no root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The features cargo turns on for the `atunnel` package when building
/// `selection` (from the workspace root, offline: no build, no network).
fn atunnel_features(selection: &[&str]) -> String {
    let root = workspace_root();
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["tree", "--offline", "-e", "features", "-i", "atunnel"])
        .args(selection)
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A plain `cargo build --release` at the root builds the default members,
/// which leave the bench out: the production binary has no comparison code
/// (`--copy-mode`, `--wait-buffer`). With the bench selected, cargo turns
/// the feature on, which is what this would catch.
#[test]
fn a_plain_build_at_the_root_ships_no_comparison_code() {
    let plain = atunnel_features(&[]);
    assert!(
        plain.contains("atunnel v"),
        "cargo tree did not list atunnel: {plain}"
    );
    assert!(
        !plain.contains("feature \"comparison\""),
        "a plain build turns on atunnel's comparison feature:\n{plain}"
    );
    let with_bench = atunnel_features(&["-p", "atunnel-bench"]);
    assert!(
        with_bench.contains("feature \"comparison\""),
        "the bench's build should turn comparison on (else this test checks nothing):\n{with_bench}"
    );
}

/// A module's path inside its crate (`load::plots`), from its file's path
/// under `src/` (`load/plots.rs`, or `load/mod.rs` for `load`); None for
/// the crate root.
fn module_of(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    match parts.as_slice() {
        [] => None,
        [one] if one == "lib" || one == "main" => None,
        _ => Some(parts),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each module of the crate at `src` and the modules of the same crate it
/// names (`crate::a::b`, `super::b`), leaving out comments, unit tests,
/// and its own ancestors (a child naming its parent is how Rust nests).
fn module_imports(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .into_iter()
        .filter_map(|f| Some((module_of(f.strip_prefix(src).ok()?)?, f)))
        .collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("read");
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        // Comments cut, whole lines or trailing ones (a `//` inside a
        // string cuts it too, which at worst hides a name in a literal).
        let code: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let mut names = BTreeSet::new();
        for path in crate_paths(&code) {
            let (mut base, mut rest) = (Vec::new(), &path[..]);
            if rest.first().map(String::as_str) == Some("crate") {
                rest = &rest[1..];
            } else {
                base = module.clone();
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            // The longest prefix that is a module of this crate.
            let mut named = None;
            for seg in rest {
                base.push(seg.clone());
                if modules.contains_key(&base) {
                    named = Some(base.clone());
                }
            }
            if let Some(n) = named
                && !module.starts_with(&n)
            {
                names.insert(n);
            }
        }
        graph.insert(module.clone(), names);
    }
    graph
}

/// Every path `code` names from `crate::` or `super::`, segment by
/// segment, with `use` groups expanded: `crate::a::{b, c::{d}}` names
/// `crate::a::b` and `crate::a::c::d`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let tail = &code[at..];
        let len = tail
            .find(|c: char| !(is_ident(c) || c == ':'))
            .unwrap_or(tail.len());
        let prefix = &tail[..len];
        if tail[len..].starts_with('{') {
            for item in expand_group(&tail[len..]) {
                out.push(segments(&format!("{prefix}{item}")));
            }
        } else {
            out.push(segments(prefix));
        }
    }
    out
}

/// The items of the `{...}` group `text` starts with, nested groups
/// expanded, each as a path relative to the group.
fn expand_group(text: &str) -> Vec<String> {
    let mut depth = 0;
    let mut end = text.len();
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &text[1..end];
    let (mut items, mut depth, mut from) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[from..]);
    let mut out = Vec::new();
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        match item.find('{') {
            Some(brace) => {
                for sub in expand_group(&item[brace..]) {
                    out.push(format!("{}{sub}", &item[..brace]));
                }
            }
            None => out.push(
                item.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            ),
        }
    }
    out
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "self")
        .map(str::to_string)
        .collect()
}

/// The import circles of `graph`: each strongly connected set of more than
/// one module (Tarjan's algorithm).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, (usize, usize)>,
        stack: Vec<&'g Vec<String>>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Vec<String>) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let Some((w, _)) = s.graph.get_key_value(w) else {
                continue;
            };
            match s.index.get(w).copied() {
                None => {
                    visit(s, w);
                    let low = s.index[w].1.min(s.index[v].1);
                    s.index.get_mut(v).expect("visited").1 = low;
                }
                Some((wi, _)) if s.stack.contains(&w) => {
                    let low = wi.min(s.index[v].1);
                    s.index.get_mut(v).expect("visited").1 = low;
                }
                Some(_) => {}
            }
        }
        let (vi, vl) = s.index[v];
        if vi == vl {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                set.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                s.found.push(set);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// No crate of the workspace has modules that import each other in a
/// circle: data flows one way through each crate, and a reader can start
/// at the bottom. Crates never circle (cargo refuses it); modules can.
#[test]
fn no_module_imports_run_in_a_circle() {
    let mut found = Vec::new();
    let crates = workspace_root().join("crates");
    for entry in std::fs::read_dir(&crates).expect("crates").flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        for circle in circles(&module_imports(&src)) {
            found.push(format!(
                "{}: {}",
                entry.file_name().to_string_lossy(),
                circle.join(" <-> ")
            ));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The checker itself: a circle through `super::` and `crate::` paths is
/// found, a child naming its parent is not a circle, and comments do not
/// count.
#[test]
fn the_circle_check_finds_a_circle_and_only_a_circle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("load")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "pub mod load;\npub mod stats;\n").expect("write");
    std::fs::write(
        src.join("load/mod.rs"),
        "pub mod plots;\npub mod results;\n",
    )
    .expect("write");
    std::fs::write(src.join("load/results.rs"), "use super::plots::draw;\n").expect("write");
    std::fs::write(
        src.join("load/plots.rs"),
        "use crate::load::results::Results;\nuse super::Helper;\n// crate::stats::Stats in a comment\n",
    )
    .expect("write");
    std::fs::write(src.join("stats.rs"), "use crate::load::plots::x;\n").expect("write");
    let graph = module_imports(src);
    assert_eq!(
        circles(&graph),
        vec![vec!["load::plots".to_string(), "load::results".to_string()]]
    );
    // The same circle through a `use` group over two lines.
    std::fs::write(
        src.join("load/results.rs"),
        "use crate::{\n    load::{ // why, {nested}\n        plots::draw as d, self},\n};\n",
    )
    .expect("write");
    assert_eq!(
        circles(&module_imports(src)),
        vec![vec!["load::plots".to_string(), "load::results".to_string()]]
    );
    std::fs::write(src.join("load/results.rs"), "pub struct Results;\n").expect("write");
    assert!(circles(&module_imports(src)).is_empty());
}

/// Each long flag `--help` lists (but `--help` and `--version`), with its
/// default if it prints one.
fn help_flags(help: &str) -> BTreeMap<String, Option<String>> {
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        // Flags sit at a small indent; their descriptions at ten spaces.
        if indent < 10
            && let Some(rest) = trimmed
                .strip_prefix("--")
                .or_else(|| trimmed.split_once(", --").map(|(_, r)| r))
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            current = (name != "help" && name != "version").then_some(name);
            if let Some(n) = &current {
                flags.insert(n.clone(), None);
            }
            continue;
        }
        if let (Some(n), Some(d)) = (
            &current,
            trimmed
                .strip_prefix("[default: ")
                .and_then(|d| d.strip_suffix(']')),
        ) {
            flags.insert(n.clone(), Some(d.to_string()));
        }
    }
    flags
}

/// The rows (`| `--flag` | `default` or — | ... |`) of the table under the
/// heading `### {heading}` in docs/operating.md.
fn documented_flags(doc: &str, heading: &str) -> BTreeMap<String, Option<String>> {
    let section = doc
        .split(&format!("### {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/operating.md has no section {heading}"));
    let section = section.split("\n#").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `--")?.splitn(3, '|');
            let name = cells.next()?.trim().trim_end_matches('`').to_string();
            let default = cells.next()?.trim();
            let default = (default != "—").then(|| default.trim_matches('`').to_string());
            Some((name, default))
        })
        .collect()
}

fn atunnel_help(command: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
        .args([command, "--help"])
        .output()
        .expect("atunnel --help");
    assert!(out.status.success(), "atunnel {command} --help failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Flags only a comparison build has (the bench's).
const COMPARISON_ONLY: [&str; 2] = ["copy-mode", "wait-buffer"];

fn assert_same(
    what: &str,
    documented: &BTreeMap<String, Option<String>>,
    help: &BTreeMap<String, Option<String>>,
) {
    let missing: Vec<&String> = help
        .keys()
        .filter(|k| !documented.contains_key(*k))
        .collect();
    let gone: Vec<&String> = documented
        .keys()
        .filter(|k| !help.contains_key(*k) && !COMPARISON_ONLY.contains(&k.as_str()))
        .collect();
    let defaults: Vec<String> = documented
        .iter()
        .filter_map(|(k, d)| {
            let h = help.get(k)?;
            (h != d).then(|| format!("--{k}: documented {d:?}, --help says {h:?}"))
        })
        .collect();
    assert!(
        missing.is_empty() && gone.is_empty() && defaults.is_empty(),
        "docs/operating.md's flags of {what} differ from --help:\n\
         not documented: {missing:?}\nno longer a flag: {gone:?}\n{}",
        defaults.join("\n")
    );
}

/// docs/operating.md's flag tables list every flag of `atunnel serve`,
/// `atunnel host`, `atunnel ctl` and `atunnel-gateway` with the default
/// `--help` prints, and no flag that is gone.
#[test]
fn the_flag_tables_in_the_docs_match_every_binarys_help() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/operating.md")).expect("doc");
    let serve = help_flags(&atunnel_help("serve"));
    assert!(
        serve.len() > 50,
        "parsed only {} flags of serve",
        serve.len()
    );
    assert_same(
        "atunnel serve",
        &documented_flags(&doc, "`atunnel serve`"),
        &serve,
    );
    let host_only: BTreeMap<_, _> = help_flags(&atunnel_help("host"))
        .into_iter()
        .filter(|(k, _)| !serve.contains_key(k))
        .collect();
    assert_same(
        "atunnel host",
        &documented_flags(&doc, "`atunnel host`"),
        &host_only,
    );
    assert_same(
        "atunnel ctl",
        &documented_flags(&doc, "`atunnel ctl`"),
        &help_flags(&atunnel_help("ctl")),
    );
    let gateway = <atunnel_gateway::cli::Cli as clap::CommandFactory>::command()
        .render_long_help()
        .to_string();
    assert_same(
        "atunnel-gateway",
        &documented_flags(&doc, "`atunnel-gateway`"),
        &help_flags(&gateway),
    );
}

/// The atunnel crates `manifest` names under `[dependencies]`, short
/// (`atunnel-core` -> `core`; `atunnel` itself stays `atunnel`).
fn atunnel_dependencies(manifest: &str) -> BTreeSet<String> {
    let doc: toml::Table = manifest.parse().expect("Cargo.toml parses");
    doc.get("dependencies")
        .and_then(|d| d.as_table())
        .map(|deps| {
            deps.keys()
                .filter(|k| *k == "atunnel" || k.starts_with("atunnel-"))
                .map(|k| k.strip_prefix("atunnel-").unwrap_or(k).to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// design.md's crate map says what each crate depends on; a manifest that
/// gains or drops an atunnel crate without the map following fails here
/// (the map once said `atunnel-sandbox` depends on `atunnel-core`, which
/// only its tests did).
#[test]
fn the_crate_map_in_design_md_matches_the_manifests() {
    let root = workspace_root();
    let design = std::fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    let section = design
        .split("## Crates follow the data path")
        .nth(1)
        .expect("design.md has its crate map");
    let mut rows = BTreeMap::new();
    for line in section.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `name` | owns | depends on |
        let [_, name, _, deps, _] = cells[..] else {
            continue;
        };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            continue;
        };
        rows.insert(name.to_string(), deps.to_string());
    }
    let crates = std::fs::read_dir(root.join("crates")).expect("crates/");
    let mut seen = 0;
    for dir in crates {
        let dir = dir.expect("crates/ entry").path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
        let actual = atunnel_dependencies(&manifest);
        let written = rows
            .get(&name)
            .unwrap_or_else(|| panic!("design.md's crate map has no row for {name}"));
        let written: BTreeSet<String> = match written.as_str() {
            "none" => BTreeSet::new(),
            // The bench depends on whatever it measures.
            "all" => continue,
            list => list.split(',').map(|d| d.trim().to_string()).collect(),
        };
        assert_eq!(
            written, actual,
            "design.md's crate map and crates/{name}/Cargo.toml disagree on its atunnel dependencies"
        );
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} crates checked");
    assert_eq!(
        rows.len(),
        seen + 1,
        "design.md lists a crate that is not in crates/: {rows:?}"
    );
}
