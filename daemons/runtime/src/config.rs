//! Layered configuration: built-in defaults, a TOML file, `CANOPY_<ROLE>_*` environment variables, then flags.
//!
//! Each daemon reads its own table of the file (`[agent]`, `[relay]`, `[frontend]`), so one file can serve a
//! whole site. Its flags are the fields of its config struct itself (the struct derives `clap::Args` as well as
//! `Deserialize`), so every key has its `--kebab-case` flag and the two cannot drift apart. A bad value is
//! reported with the key as written in its source and the source itself, and the daemon exits with
//! [`EXIT_CONFIG`].

use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The exit code for a configuration error (EX_USAGE).
pub const EXIT_CONFIG: i32 = 64;

/// A configuration value that cannot be used, with where it came from.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("bad config value for `{key}` (from {source_name}): {message}")]
pub struct ConfigError {
    pub key: String,
    pub source_name: String,
    pub message: String,
}

/// What a daemon's own check found wrong: the key, as a field path (`streams.0`), and why. [`load`] turns it
/// into a [`ConfigError`] that names the key as its source writes it.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("`{key}`: {message}")]
pub struct ConfigIssue {
    pub key: String,
    pub message: String,
}

impl ConfigIssue {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Implemented by each daemon's configuration: what the types alone cannot check.
pub trait CheckConfig {
    /// The first key that cannot be used, and why.
    fn check(&self) -> Result<(), ConfigIssue>;

    /// The keys every daemon has, when this configuration flattens them in (`#[serde(flatten,
    /// skip_deserializing)]`): [`load`] reads them from the same layers.
    fn common_mut(&mut self) -> Option<&mut crate::common::CommonConfig> {
        None
    }
}

/// Command-line flags as a figment provider, so errors name them as flags.
struct Flags<'a, T: Serialize>(&'a T);

impl<T: Serialize> Provider for Flags<'_, T> {
    fn metadata(&self) -> Metadata {
        Metadata::named("command-line flags")
            .interpolater(|_, path| format!("--{}", path.join(".").replace('_', "-")))
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Serialized::defaults(self.0).data()
    }
}

/// Loads a role's configuration. `flags` holds only the values given on the command line (`None` fields are
/// skipped when serialized).
pub fn load<T, F>(role: &str, file: Option<&Path>, flags: &F) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default + CheckConfig,
    F: Serialize,
{
    let figment = layers::<T, F>(role, file, flags)?;
    let config: T = extract(role, &figment)?;
    config.check().map_err(|issue| {
        let md = find_metadata(&figment, &issue.key);
        ConfigError {
            key: qualify(role, md, &issue.key),
            source_name: describe(md, role, &issue.key),
            message: issue.message,
        }
    })?;
    Ok(config)
}

/// The configuration in force for `role`, as its TOML table, each key with a comment naming where its value
/// comes from (defaults, the file, an environment variable, a flag); for `validate --print`. Keys without a
/// value (an unset path) are listed commented out.
pub fn effective<T, F>(role: &str, file: Option<&Path>, flags: &F) -> Result<String, ConfigError>
where
    T: DeserializeOwned + Serialize + Default + CheckConfig,
    F: Serialize,
{
    let figment = layers::<T, F>(role, file, flags)?;
    let config: T = extract(role, &figment)?;
    let keys = keys_of(&config).map_err(|message| ConfigError {
        key: String::new(),
        source_name: "defaults".into(),
        message,
    })?;
    let mut lines = Vec::new();
    let mut unset = Vec::new();
    for (key, value) in &keys {
        if matches!(value, Value::Empty(..)) {
            unset.push(key);
            continue;
        }
        let text = toml::Value::try_from(value)
            .map(|v| v.to_string())
            .unwrap_or_else(|e| format!("\"<{e}>\""));
        let origin = match find_metadata(&figment, key) {
            Some(md) if md.name.contains("flags") => format!("flag --{}", key.replace('_', "-")),
            md => describe(md, role, key),
        };
        lines.push((format!("{key} = {text}"), origin));
    }
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0).min(60);
    let mut out = format!("[{role}]\n");
    for (line, origin) in lines {
        out.push_str(&format!("{line:width$}  # {origin}\n"));
    }
    for key in unset {
        out.push_str(&format!("# {key} is not set\n"));
    }
    Ok(out)
}

/// The configuration the layers give: no key it does not have, its own keys and then the common ones read.
fn extract<T>(role: &str, figment: &Figment) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default + CheckConfig,
{
    let known = keys_of(&T::default()).map_err(|message| ConfigError {
        key: String::new(),
        source_name: "defaults".into(),
        message,
    })?;
    let given: Dict = figment.extract().map_err(|e| from_figment(role, figment, e))?;
    if let Some(found) = given.keys().find(|k| !known.contains_key(*k)) {
        let md = figment.find_metadata(found);
        let expected: Vec<&str> = known.keys().map(String::as_str).collect();
        return Err(ConfigError {
            key: qualify(role, md, found),
            source_name: describe(md, role, found),
            message: unknown_key(role, md, found, &expected),
        });
    }
    let mut config: T = figment.extract().map_err(|e| from_figment(role, figment, e))?;
    if let Some(common) = config.common_mut() {
        *common = figment.extract().map_err(|e| from_figment(role, figment, e))?;
    }
    Ok(config)
}

/// The keys given on the command line, with their values: the flags layer of [`load`]. `C` is the config struct,
/// which is its own `clap::Args`; a key not on the command line is left out, so the file, the environment or the
/// default decides it.
pub fn flags_given<C>(matches: &clap::ArgMatches) -> Result<Dict, clap::Error>
where
    C: clap::FromArgMatches + Serialize + Default,
{
    let mut config = C::default();
    config.update_from_arg_matches(matches)?;
    let mut dict = keys_of(&config).map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?;
    dict.retain(|key, _| {
        matches.try_contains_id(key).unwrap_or(false)
            && matches.value_source(key) == Some(clap::parser::ValueSource::CommandLine)
    });
    Ok(dict)
}

/// The keys of `C`'s table that have no `--kebab-case` flag in `command`, or one that is not global (so it could
/// not follow `validate`): each daemon's test that its command line covers its configuration.
pub fn keys_without_flags<C: Serialize + Default>(command: &clap::Command) -> Result<Vec<String>, String> {
    let keys = keys_of(&C::default())?;
    Ok(keys
        .into_keys()
        .filter(|key| {
            let long = key.replace('_', "-");
            !command.get_arguments().any(|a| {
                a.get_id() == key.as_str() && a.get_long() == Some(long.as_str()) && a.is_global_set()
            })
        })
        .collect())
}

/// A config struct as figment's dictionary of its keys.
fn keys_of<C: Serialize>(config: &C) -> Result<Dict, String> {
    Value::serialize(config)
        .map_err(|e| e.to_string())?
        .into_dict()
        .ok_or_else(|| "a configuration must serialize as a table".to_string())
}

/// The largest configuration file read: a path to something else (a log, a device) fails at once.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why the configuration file at `path` cannot be read as one, or `None` if it can: it must be a regular file
/// (after symbolic links), readable, and of at most `MAX_CONFIG_BYTES`.
fn unreadable_config(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(format!("no such file: {shown}")),
        Err(e) => return Some(format!("cannot read {shown}: {e}")),
    };
    let kind = meta.file_type();
    let what = if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_fifo() {
        Some("a named pipe")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    };
    if let Some(what) = what {
        return Some(format!("{shown} is {what}, not a configuration file"));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Some(format!(
            "{shown} is {} bytes, more than a configuration file's {MAX_CONFIG_BYTES}",
            meta.len()
        ));
    }
    std::fs::File::open(path)
        .err()
        .map(|e| format!("cannot read {shown}: {e}"))
}

fn layers<T: Serialize + Default, F: Serialize>(
    role: &str,
    file: Option<&Path>,
    flags: &F,
) -> Result<Figment, ConfigError> {
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        if let Some(message) = unreadable_config(path) {
            return Err(ConfigError {
                key: "--config".into(),
                source_name: "--config or CANOPY_CONFIG".into(),
                message,
            });
        }
        let file = Figment::from(Toml::file_exact(path));
        // A file with a syntax error fails here, before the role's table is read.
        if let Err(e) = file.extract::<figment::value::Value>() {
            let key = e.path.join(".");
            return Err(ConfigError {
                // A syntax error has no key: the file is what is wrong.
                key: if key.is_empty() { "--config".into() } else { key },
                source_name: format!("TOML file {}", path.display()),
                message: format!("not valid TOML: {}", e.kind.to_string().trim_end()),
            });
        }
        figment = figment.merge(file.focus(role));
    }
    let prefix = format!("CANOPY_{}_", role.to_uppercase());
    Ok(figment.merge(Env::prefixed(&prefix)).merge(Flags(flags)))
}

/// The source of a key; an element of a list (`streams.0`) comes from wherever its list came from.
fn find_metadata<'a>(figment: &'a Figment, key: &str) -> Option<&'a Metadata> {
    let mut k = key;
    loop {
        if let Some(md) = figment.find_metadata(k) {
            return Some(md);
        }
        k = k.rsplit_once('.')?.0;
    }
}

fn from_figment(role: &str, figment: &Figment, err: figment::Error) -> ConfigError {
    let key = err.path.join(".");
    let md = err.metadata.as_ref().or_else(|| find_metadata(figment, &key));
    let message = match &err.kind {
        figment::error::Kind::UnknownField(found, expected) => unknown_key(role, md, found, expected),
        kind => kind.to_string(),
    };
    ConfigError {
        key: qualify(role, md, &key),
        source_name: describe(md, role, &key),
        message,
    }
}

/// An unknown key, with the valid key it looks like a slip of (as its source would spell it), and the valid
/// keys.
fn unknown_key(role: &str, md: Option<&Metadata>, found: &str, expected: &[&str]) -> String {
    let spelled = |key: &str| match md {
        Some(md) if md.name.contains("environment") => env_var(role, key),
        _ => key.to_string(),
    };
    let near = expected
        .iter()
        .map(|k| (strsim::levenshtein(found, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) || k.starts_with(found) && found.len() >= 4)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| format!("did you mean {}? ", spelled(k)))
        .unwrap_or_default();
    format!(
        "unknown key {} ({near}valid keys of [{role}]: {})",
        spelled(found),
        expected.join(", ")
    )
}

/// Keys from the file are named with their table (`agent.simulate_ranks`), from the environment by variable.
fn qualify(role: &str, md: Option<&Metadata>, key: &str) -> String {
    match md {
        Some(md) if md.name.contains("environment") => env_var(role, key),
        Some(md) if md.name.contains("flags") => {
            md.interpolate(&Profile::Default, &key.split('.').collect::<Vec<_>>())
        }
        _ => format!("{role}.{key}"),
    }
}

fn describe(md: Option<&Metadata>, role: &str, key: &str) -> String {
    let Some(md) = md else { return "defaults".into() };
    if let Some(figment::Source::File(path)) = &md.source {
        return format!("TOML file {}", path.display());
    }
    if md.name.contains("environment") {
        return format!("environment variable {}", env_var(role, key));
    }
    if md.name.contains("flags") {
        return md.name.to_string();
    }
    // The only other layer: the config struct's defaults (figment names it by its type).
    "defaults".into()
}

/// The log output format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Parses `host:port` (or `[v6]:port`), naming the key on failure.
pub fn check_addr(key: &str, value: &str) -> Result<(), ConfigIssue> {
    value.parse::<std::net::SocketAddr>().map(|_| ()).map_err(|_| {
        ConfigIssue::new(
            key,
            format!("{value:?} is not an address of the form host:port (127.0.0.1:7400)"),
        )
    })
}

/// Checks an address that may name a host (`node1:7400`) rather than an IP.
pub fn check_host_port(key: &str, value: &str) -> Result<(), ConfigIssue> {
    let ok = value
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(ConfigIssue::new(
            key,
            format!("{value:?} is not of the form host:port"),
        ))
    }
}

/// A node's parents, in order of preference: `host:port` addresses separated by commas (the first is its parent;
/// the others adopt it when that one is lost).
pub fn parents(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

/// Checks a list of parents: at least one, each `host:port`.
pub fn check_parents(key: &str, value: &str) -> Result<(), ConfigIssue> {
    let list = parents(value);
    if list.is_empty() {
        return Err(ConfigIssue::new(
            key,
            "names no parent (host:port, more separated by commas)",
        ));
    }
    list.iter().try_for_each(|p| check_host_port(key, p))
}

/// The environment variable that sets `key` of `role`.
fn env_var(role: &str, key: &str) -> String {
    format!(
        "CANOPY_{}_{}",
        role.to_uppercase(),
        key.replace('.', "_").to_uppercase()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::path::PathBuf;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Demo {
        ranks: u32,
        parent: String,
    }

    impl CheckConfig for Demo {
        fn check(&self) -> Result<(), ConfigIssue> {
            if self.ranks > 1000 {
                return Err(ConfigIssue::new("ranks", "at most 1000"));
            }
            Ok(())
        }
    }

    #[derive(Serialize, Default)]
    struct DemoFlags {
        #[serde(skip_serializing_if = "Option::is_none")]
        ranks: Option<u32>,
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn layers_apply_in_order_and_flags_win() {
        let f = file("[demo]\nranks = 4\nparent = \"a:1\"\n[other]\nranks = \"x\"\n");
        let c: Demo = load("demo", Some(f.path()), &DemoFlags::default()).unwrap();
        assert_eq!(
            c,
            Demo {
                ranks: 4,
                parent: "a:1".into()
            }
        );
        let c: Demo = load("demo", Some(f.path()), &DemoFlags { ranks: Some(9) }).unwrap();
        assert_eq!(c.ranks, 9);
    }

    #[test]
    fn a_wrong_type_names_the_key_and_the_file() {
        let f = file("[demo]\nranks = \"many\"\n");
        let e = load::<Demo, _>("demo", Some(f.path()), &DemoFlags::default()).unwrap_err();
        assert_eq!(e.key, "demo.ranks");
        assert_eq!(e.source_name, format!("TOML file {}", f.path().display()));
        assert!(e.message.contains("expected u32"), "{e}");
    }

    #[test]
    fn a_failed_check_names_the_flag() {
        let e = load::<Demo, _>("demo", None, &DemoFlags { ranks: Some(5000) }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad config value for `--ranks` (from command-line flags): at most 1000"
        );
    }

    #[test]
    fn an_element_of_a_list_is_named_by_its_list_source() {
        #[derive(Debug, Default, Serialize, Deserialize)]
        #[serde(default)]
        struct L {
            streams: Vec<String>,
        }
        impl CheckConfig for L {
            fn check(&self) -> Result<(), ConfigIssue> {
                Err(ConfigIssue::new("streams.0", "bad"))
            }
        }
        #[derive(Serialize)]
        struct F {
            streams: Vec<String>,
        }
        let e = load::<L, F>(
            "x",
            None,
            &F {
                streams: vec!["nope".into()],
            },
        )
        .unwrap_err();
        assert_eq!(e.source_name, "command-line flags");
        assert_eq!(e.key, "--streams.0");
    }

    #[test]
    fn unknown_keys_and_syntax_errors_are_reported() {
        let f = file("[demo]\nrank = 3\n");
        let e = load::<Demo, _>("demo", Some(f.path()), &DemoFlags::default()).unwrap_err();
        assert_eq!(e.key, "demo.rank");
        assert_eq!(
            e.message,
            "unknown key rank (did you mean ranks? valid keys of [demo]: parent, ranks)"
        );
        // Nothing near: the valid keys alone.
        let f = file("[demo]\nfanout = 3\n");
        let e = load::<Demo, _>("demo", Some(f.path()), &DemoFlags::default()).unwrap_err();
        assert_eq!(
            e.message,
            "unknown key fanout (valid keys of [demo]: parent, ranks)"
        );
        // A syntax error has no key: the file is named as what is wrong, with the line and column.
        let f = file("[demo\nranks = 3\n");
        let e = load::<Demo, _>("demo", Some(f.path()), &DemoFlags::default()).unwrap_err();
        assert_eq!(e.key, "--config");
        assert!(e.source_name.starts_with("TOML file"), "{e}");
        assert!(
            e.message
                .starts_with("not valid TOML: TOML parse error at line 1, column 6"),
            "{e}"
        );
        let e = load::<Demo, _>(
            "demo",
            Some(Path::new("/nonexistent/c.toml")),
            &DemoFlags::default(),
        );
        assert!(e.unwrap_err().message.contains("no such file"));
    }

    #[test]
    fn a_config_path_that_is_no_file_says_what_it_is() {
        let load_at = |p: &Path| load::<Demo, _>("demo", Some(p), &DemoFlags::default()).unwrap_err();
        let e = load_at(Path::new("/dev/zero"));
        assert_eq!(e.key, "--config");
        assert_eq!(
            e.message,
            "/dev/zero is a character device, not a configuration file"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = load_at(dir.path());
        assert_eq!(
            e.message,
            format!(
                "{} is a directory, not a configuration file",
                dir.path().display()
            )
        );
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_CONFIG_BYTES + 1) as usize]).unwrap();
        assert_eq!(
            load_at(&big).message,
            format!(
                "{} is {} bytes, more than a configuration file's {MAX_CONFIG_BYTES}",
                big.display(),
                MAX_CONFIG_BYTES + 1
            )
        );
    }

    /// A config struct that is its own command line, as the daemons' are.
    #[derive(Debug, Default, Serialize, Deserialize, PartialEq, clap::Args)]
    #[serde(deny_unknown_fields, default)]
    struct Cli {
        #[arg(long)]
        max_ranks: u32,
        #[arg(long)]
        parent: String,
        #[arg(long, action = clap::ArgAction::Set)]
        quiet: bool,
        #[arg(long, value_delimiter = ':')]
        path: Vec<PathBuf>,
        #[arg(long)]
        ready_file: Option<PathBuf>,
    }

    impl CheckConfig for Cli {
        fn check(&self) -> Result<(), ConfigIssue> {
            if self.max_ranks > 1000 {
                return Err(ConfigIssue::new("max_ranks", "at most 1000"));
            }
            Ok(())
        }
    }

    #[test]
    fn the_effective_configuration_names_where_each_value_comes_from() {
        let f = file("[demo]\nparent = \"a:1\"\n");
        let text = effective::<Cli, _>("demo", Some(f.path()), &flags(&["--max-ranks", "7"])).unwrap();
        let name = f.path().display();
        assert_eq!(
            text,
            format!(
                "[demo]\n\
                 max_ranks = 7   # flag --max-ranks\n\
                 parent = \"a:1\"  # TOML file {name}\n\
                 path = []       # defaults\n\
                 quiet = false   # defaults\n\
                 # ready_file is not set\n"
            )
        );
        // What it prints is what loads.
        let back: Cli = toml::from_str(&text.replace("[demo]\n", "")).unwrap();
        assert_eq!(back.max_ranks, 7);
        assert_eq!(back.parent, "a:1");
    }

    fn flags(args: &[&str]) -> Dict {
        let matches = crate::daemon::command::<Cli>("demo", "a demo")
            .try_get_matches_from(std::iter::once("demo").chain(args.iter().copied()))
            .unwrap();
        flags_given::<Cli>(&matches).unwrap()
    }

    #[test]
    fn flags_given_hold_only_what_the_command_line_gave() {
        assert!(flags(&[]).is_empty());
        let given = flags(&[
            "--max-ranks",
            "9",
            "--quiet",
            "true",
            "--path",
            "a:b",
            "--ready-file",
            "r",
        ]);
        let keys: Vec<&str> = given.keys().map(String::as_str).collect();
        assert_eq!(keys, ["max_ranks", "path", "quiet", "ready_file"]);
        // Global: a flag may follow `validate`.
        assert_eq!(flags(&["validate", "--parent", "p:1"]).len(), 1);

        let f = file("[demo]\nmax_ranks = 4\nparent = \"a:1\"\n");
        let c: Cli = load(
            "demo",
            Some(f.path()),
            &flags(&["--max-ranks", "9", "--path", "a:b"]),
        )
        .unwrap();
        assert_eq!(
            c,
            Cli {
                max_ranks: 9,
                parent: "a:1".into(),
                quiet: false,
                path: vec!["a".into(), "b".into()],
                ready_file: None,
            }
        );
    }

    #[test]
    fn a_failed_check_names_the_derived_flag_in_kebab_case() {
        let e = load::<Cli, _>("demo", None, &flags(&["--max-ranks", "5000"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad config value for `--max-ranks` (from command-line flags): at most 1000"
        );
    }

    #[test]
    fn keys_without_flags_names_a_key_the_command_line_lacks() {
        let command = crate::daemon::command::<Cli>("demo", "a demo");
        assert_eq!(keys_without_flags::<Cli>(&command), Ok(Vec::new()));

        #[derive(Default, Serialize, clap::Args)]
        struct Drifted {
            #[arg(long)]
            parent: String,
            #[arg(skip)]
            subscriber_buffer: usize,
            /// Positional, not a flag.
            #[arg(required = false)]
            seed: u64,
            #[arg(skip)]
            ready_file: Option<PathBuf>,
        }
        let command = crate::daemon::command::<Drifted>("demo", "a demo");
        assert_eq!(
            keys_without_flags::<Drifted>(&command).unwrap(),
            ["ready_file", "seed", "subscriber_buffer"]
        );
    }
}
