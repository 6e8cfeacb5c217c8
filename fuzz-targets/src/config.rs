//! Configuration files: a TOML file as `--config` gives it to a daemon, read with the daemon's own config struct
//! and checked as `validate` checks it. No environment variable or flag takes part, but for the front-end's
//! filter path, which the flags point at an empty directory so that no stream's name can load a plugin.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use canopy_runtime::config::{ConfigError, load};
use figment::value::{Dict, Value};

use crate::input::Input;

/// A directory of this process's own for the file each input is written to.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = ["/dev/shm"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("canopy-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("no-plugins")).expect("a scratch directory");
        dir
    })
}

/// One byte picks the daemon (agent, relay, front-end); the rest is the file.
pub fn config(data: &[u8]) {
    let mut input = Input::new(data);
    let role = input.below(3);
    let file_text = input.rest();
    let dir = scratch();
    let thread = format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_alphanumeric(), "");
    let path = dir.join(format!("canopy-{thread}.toml"));
    {
        let mut f = std::fs::File::create(&path).expect("the scratch file");
        f.write_all(file_text).expect("the scratch file");
    }
    let mut flags = Dict::new();
    match role {
        0 => check(
            "agent",
            load::<canopy_agent::AgentConfig, _>("agent", Some(&path), &flags),
        ),
        1 => check(
            "relay",
            load::<canopy_relay::RelayConfig, _>("relay", Some(&path), &flags),
        ),
        _ => {
            let no_plugins = dir.join("no-plugins").display().to_string();
            flags.insert("filter_path".into(), Value::from(vec![no_plugins]));
            check(
                "frontend",
                load::<canopy_frontend::FrontendConfig, _>("frontend", Some(&path), &flags),
            )
        }
    }
}

/// A refusal names a key and where it came from; an accepted configuration passes its own check again.
fn check<T: canopy_runtime::config::CheckConfig>(role: &str, loaded: Result<T, ConfigError>) {
    match loaded {
        Ok(config) => assert!(config.check().is_ok(), "{role}: accepted, then refused"),
        Err(e) => {
            assert!(!e.source_name.is_empty(), "{role}: {e} names no source");
            let _ = e.to_string();
        }
    }
}
