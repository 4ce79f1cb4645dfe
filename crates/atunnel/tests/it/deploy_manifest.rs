//! `deploy/kubernetes/atunnel.yaml` is what the binary takes: every flag it
//! passes (on the command line and in its ConfigMap's TOML) is one that
//! `atunnel serve --help` lists, the probes reach the admin listener the
//! config names, and the container has what the sandboxes need.

use std::collections::BTreeSet;
use std::path::PathBuf;

use yaml_rust2::{Yaml, YamlLoader};

fn manifest() -> Vec<Yaml> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/atunnel.yaml");
    let text = std::fs::read_to_string(&path).expect("the manifest");
    YamlLoader::load_from_str(&text).expect("the manifest is YAML")
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in the manifest"))
}

/// The long flags `atunnel serve --help` lists.
fn serve_flags() -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
        .args(["serve", "--help"])
        .output()
        .expect("atunnel runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .expect("utf-8 help")
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| w.split(['=', '<', ',']).next().unwrap_or(w).to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn every_flag_the_manifest_passes_is_one_atunnel_serve_takes() {
    let docs = manifest();
    let known = serve_flags();
    assert!(known.contains("control-socket"), "help parsed: {known:?}");
    let container = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_vec()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string args"))
        .collect();
    assert_eq!(args[0], "serve", "{args:?}");
    let mut passed: Vec<String> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect();
    let toml_text = of_kind(&docs, "ConfigMap")["data"]["atunnel.toml"]
        .as_str()
        .expect("atunnel.toml in the ConfigMap");
    let config: toml::Table = toml_text.parse().expect("the config is TOML");
    passed.extend(config.keys().cloned());
    assert!(passed.len() > 10, "{passed:?}");
    let unknown: Vec<&String> = passed.iter().filter(|f| !known.contains(*f)).collect();
    assert!(
        unknown.is_empty(),
        "flags atunnel serve does not take: {unknown:?}"
    );

    // The probes reach the admin listener the config names, on loopback.
    let stats: std::net::SocketAddr = config["stats"]
        .as_str()
        .expect("stats")
        .parse()
        .expect("an address");
    assert!(
        stats.ip().is_loopback(),
        "the admin listener stays on loopback"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(
            get["port"].as_i64(),
            Some(i64::from(stats.port())),
            "{probe}"
        );
        assert_eq!(get["host"].as_str(), Some("127.0.0.1"), "{probe}");
    }

    // What the sandboxes need, and a memory limit the overload guard reads.
    let caps: Vec<&str> = container["securityContext"]["capabilities"]["add"]
        .as_vec()
        .expect("capabilities")
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    for cap in ["NET_ADMIN", "SYS_ADMIN"] {
        assert!(caps.contains(&cap), "{cap} missing: {caps:?}");
    }
    assert!(
        container["resources"]["limits"]["memory"]
            .as_str()
            .is_some()
    );
    let spec = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"].as_bool(), Some(true));
    // The control socket's folder is shared with the worker.
    let socket = PathBuf::from(config["control-socket"].as_str().expect("control-socket"));
    let mounted = container["volumeMounts"]
        .as_vec()
        .expect("mounts")
        .iter()
        .any(|m| m["mountPath"].as_str().map(PathBuf::from).as_deref() == socket.parent());
    assert!(
        mounted,
        "the control socket's folder is not a mounted volume"
    );
}
