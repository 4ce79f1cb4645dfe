//! `--config <file.toml>`: every flag of a command can also be set in a TOML
//! file, one key per flag by its long name (`gateway-idle-timeout = "90s"`,
//! `no-overload-guard = true`, `destinations = ["127.0.0.1:7", ...]`).
//!
//! The file is turned into flags placed before the command line's own, and
//! the command parses with `args_override_self`, so a flag given on the
//! command line wins over the file. Going through clap keeps one set of
//! names, defaults, parsers and errors: an unknown key or a bad value is
//! refused exactly as the same flag would be.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What can be wrong with a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--config needs a file")]
    NoFile,
    #[error("reading the configuration file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the configuration file {}: {source}", .path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error(
        "the configuration file {}: {key}: {reason}",
        .path.display()
    )]
    Value {
        path: PathBuf,
        key: String,
        reason: &'static str,
    },
}

/// `argv` with each `--config FILE` (or `--config=FILE`) followed, at
/// `insert_at` (the index just past the command's own name, where its
/// flags begin), by the flags the file sets. `argv` without `--config` is
/// returned as it is.
pub fn expand(argv: Vec<OsString>, insert_at: usize) -> Result<Vec<OsString>, ConfigError> {
    let Some(path) = config_path(&argv)? else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let flags = flags_of(&text, &path)?;
    let at = insert_at.min(argv.len());
    let mut out = Vec::with_capacity(argv.len() + flags.len());
    out.extend(argv[..at].iter().cloned());
    out.extend(flags);
    out.extend(argv[at..].iter().cloned());
    Ok(out)
}

fn config_path(argv: &[OsString]) -> Result<Option<PathBuf>, ConfigError> {
    let mut args = argv.iter();
    while let Some(arg) = args.next() {
        let Some(s) = arg.to_str() else { continue };
        if s == "--" {
            break;
        }
        if s == "--config" {
            return match args.next() {
                Some(p) => Ok(Some(PathBuf::from(p))),
                None => Err(ConfigError::NoFile),
            };
        }
        if let Some(p) = s.strip_prefix("--config=") {
            return Ok(Some(PathBuf::from(p)));
        }
    }
    Ok(None)
}

/// The flags a configuration file's text sets, as `--key=value`.
fn flags_of(text: &str, path: &Path) -> Result<Vec<OsString>, ConfigError> {
    let table: toml::Table = text.parse().map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(e),
    })?;
    let bad = |key: &str, reason| ConfigError::Value {
        path: path.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let mut flags = Vec::new();
    for (key, value) in &table {
        if key == "config" {
            return Err(bad(key, "a configuration file cannot name another"));
        }
        let flag = format!("--{key}");
        match value {
            toml::Value::Boolean(true) => flags.push(flag.into()),
            // A switch left off is the default.
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                let items: Option<Vec<String>> = items.iter().map(scalar).collect();
                let items =
                    items.ok_or_else(|| bad(key, "a list may hold strings and numbers only"))?;
                flags.push(format!("{flag}={}", items.join(",")).into());
            }
            other => {
                let v = scalar(other)
                    .ok_or_else(|| bad(key, "must be a string, a number, a boolean or a list"))?;
                flags.push(format!("{flag}={v}").into());
            }
        }
    }
    Ok(flags)
}

fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[derive(clap::Parser, Debug)]
    #[command(args_override_self = true)]
    struct Cli {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value_t = 4)]
        streams: u32,
        #[arg(long, default_value = "10s")]
        timeout: String,
        #[arg(long)]
        quiet: bool,
        #[arg(long, value_delimiter = ',')]
        peers: Vec<String>,
    }

    fn parse_with(file: &str, argv: &[&str]) -> Result<Cli, String> {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, file).expect("write");
        let mut full = os(&["prog"]);
        full.extend(os(argv));
        full.extend(os(&["--config", path.to_str().expect("utf-8")]));
        let argv = expand(full, 1).map_err(|e| e.to_string())?;
        <Cli as clap::Parser>::try_parse_from(argv).map_err(|e| e.to_string())
    }

    #[test]
    fn the_file_sets_flags_and_the_command_line_wins() {
        let file = "streams = 9\ntimeout = \"3s\"\nquiet = true\npeers = [\"a:1\", \"b:2\"]\n";
        let cli = parse_with(file, &[]).expect("parses");
        assert_eq!(
            (cli.streams, cli.timeout.as_str(), cli.quiet),
            (9, "3s", true)
        );
        assert_eq!(cli.peers, ["a:1", "b:2"]);
        let cli = parse_with(file, &["--streams=2"]).expect("parses");
        assert_eq!(cli.streams, 2, "the flag wins over the file");
        assert_eq!(cli.timeout, "3s");
    }

    #[test]
    fn unknown_keys_bad_values_and_bad_files_are_refused_by_name() {
        let err = parse_with("stream = 9\n", &[]).expect_err("unknown key");
        assert!(err.contains("--stream"), "{err}");
        let err = parse_with("streams = \"many\"\n", &[]).expect_err("bad value");
        assert!(err.contains("many") && err.contains("--streams"), "{err}");
        let err = parse_with("streams = [\n", &[]).expect_err("not TOML");
        assert!(err.contains("c.toml"), "{err}");
        let err = parse_with("[section]\nstreams = 1\n", &[]).expect_err("a table");
        assert!(err.contains("section"), "{err}");
        let err = parse_with("config = \"x\"\n", &[]).expect_err("nested");
        assert!(err.contains("another"), "{err}");
        assert!(matches!(
            expand(os(&["prog", "--config"]), 1),
            Err(ConfigError::NoFile)
        ));
    }

    #[test]
    fn without_config_the_arguments_are_untouched() {
        let argv = os(&["prog", "--streams=3"]);
        assert_eq!(expand(argv.clone(), 1).expect("no file"), argv);
    }
}
