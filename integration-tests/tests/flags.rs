//! Every daemon's command line covers its configuration: each key has its `--kebab-case` flag, derived from
//! the config struct, so the two cannot drift apart.

use std::process::Command;

use canopy_agent::AgentConfig;
use canopy_frontend::FrontendConfig;
use canopy_integration_tests::{bin_dir, start_relay_with};
use canopy_relay::RelayConfig;
use canopy_runtime::config::keys_without_flags;
use canopy_runtime::daemon::{DaemonConfig, command};

fn keys_without_flags_of<C: DaemonConfig>(name: &'static str) -> Vec<String> {
    keys_without_flags::<C>(&command::<C>(name, "")).unwrap()
}

#[test]
fn every_config_key_of_every_daemon_has_its_flag() {
    assert_eq!(
        keys_without_flags_of::<AgentConfig>("canopy-agent"),
        Vec::<String>::new()
    );
    assert_eq!(
        keys_without_flags_of::<RelayConfig>("canopy-relay"),
        Vec::<String>::new()
    );
    assert_eq!(
        keys_without_flags_of::<FrontendConfig>("canopy-frontend"),
        Vec::<String>::new()
    );
}

#[test]
fn a_key_that_once_had_no_flag_is_set_and_named_by_it() {
    // `subscriber_buffer` had drifted out of the hand-written flags; now it is a flag like any other key.
    let out = Command::new(bin_dir().join("canopy-frontend"))
        .args(["validate", "--subscriber-buffer", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "bad config value for `--subscriber-buffer` (from command-line flags): must be at least 1"
        ),
        "{err}"
    );

    // An unknown measurement module is named, with the ones there are.
    let out = Command::new(bin_dir().join("canopy-frontend"))
        .args(["validate", "--modules", "profile,tau"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "bad config value for `--modules` (from command-line flags): unknown measurement module \"tau\" (profile, trace, utilization, null)"
        ),
        "{err}"
    );

    // Repeated map entries and a value-taking bool reach the configuration too.
    let out = Command::new(bin_dir().join("canopy-frontend"))
        .args(["validate", "--streams", "stats,classify", "--exit-on-fin", "true"])
        .args(["--stream-params", "stats=", "--stream-params", "classify=[]"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`--stream-params.classify` (from command-line flags)"),
        "{err}"
    );
}

/// The agent's samplers are checked by name, from any layer, and the error lists the ones there are; the period
/// is 0 (a sample per round) or at least 10 ms.
#[test]
fn an_unknown_sampler_or_a_period_too_short_is_refused_by_its_key() {
    let validate = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(bin_dir().join("canopy-agent"))
            .arg("validate")
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = validate(&["--samplers", "cpu,gpu"], &[]);
    assert_eq!(code, Some(64));
    assert!(
        err.contains(
            "bad config value for `--samplers` (from command-line flags): unknown sampler \"gpu\" (samplers: cpu, memory, network, disk, load)"
        ),
        "{err}"
    );
    let (code, err) = validate(&[], &[("CANOPY_AGENT_SAMPLERS", "[\"load\", \"load\"]")]);
    assert_eq!(code, Some(64));
    assert!(
        err.contains("(from environment variable CANOPY_AGENT_SAMPLERS): names the sampler \"load\" twice"),
        "{err}"
    );
    let (code, err) = validate(&["--sample-period-ms", "5"], &[]);
    assert_eq!(code, Some(64));
    assert!(
        err.contains(
            "bad config value for `--sample-period-ms` (from command-line flags): must be 0 (a sample per round) or from 10 to 3600000 (an hour)"
        ),
        "{err}"
    );
}

/// `validate --print` shows every daemon's configuration in force, each value with its origin; an unknown key in
/// any layer is named with the one it looks like a slip of, and a misspelled filter with the filter.
#[test]
fn validate_prints_the_configuration_in_force_and_suggests_what_was_meant() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("canopy.toml");
    std::fs::write(
        &file,
        "[relay]\nparent = \"127.0.0.1:7400\"\n[agent]\nsimulate_ranks = 4\n",
    )
    .unwrap();
    let run = |bin: &str, args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(bin_dir().join(bin))
            .args(args)
            .arg("--config")
            .arg(&file)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(
        "canopy-relay",
        &["validate", "--print", "--listen", "127.0.0.1:7401", "--insecure"],
        &[("CANOPY_RELAY_MAX_CONNECTIONS", "64")],
    );
    assert_eq!(code, Some(0), "{err}");
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("{key} in\n{out}"))
            .to_string()
    };
    assert!(out.starts_with("[relay]\n"), "{out}");
    assert!(
        line("parent").ends_with(&format!("# TOML file {}", file.display())),
        "{out}"
    );
    assert!(line("listen").ends_with("# flag --listen"), "{out}");
    assert!(
        line("max_connections").ends_with("# environment variable CANOPY_RELAY_MAX_CONNECTIONS"),
        "{out}"
    );
    assert!(line("max_rounds_in_flight").ends_with("# defaults"), "{out}");
    assert!(out.contains("# tls_ca is not set\n"), "{out}");
    // The filters Canopy ships run inline unless the configuration says otherwise.
    assert!(
        line("inline_filters").contains("\"stats\"") && line("inline_filters").ends_with("# defaults"),
        "{out}"
    );
    let (code, out, err) = run(
        "canopy-relay",
        &[
            "validate",
            "--print",
            "--listen",
            "127.0.0.1:7401",
            "--insecure",
            "--inline-filters",
            "stats,mine",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let inline = out.lines().find(|l| l.starts_with("inline_filters = ")).unwrap();
    assert!(
        inline.starts_with("inline_filters = [\"stats\", \"mine\"]")
            && inline.ends_with("# flag --inline-filters"),
        "{out}"
    );

    let (code, _, err) = run(
        "canopy-agent",
        &["validate", "--socket", "none"],
        &[("CANOPY_AGENT_SIMULATE_RANK", "3")],
    );
    assert_eq!(code, Some(64));
    assert!(
        err.contains("unknown key CANOPY_AGENT_SIMULATE_RANK (did you mean CANOPY_AGENT_SIMULATE_RANKS?"),
        "{err}"
    );
    std::fs::write(
        &file,
        "[frontend]\nstreams = [\"histogramm\"]\nstream_timeout = 5\n",
    )
    .unwrap();
    let (code, _, err) = run("canopy-frontend", &["validate"], &[]);
    assert_eq!(code, Some(64));
    assert!(
        err.contains("`frontend.stream_timeout`") && err.contains("(did you mean stream_timeout_ms?"),
        "{err}"
    );
    std::fs::write(&file, "[frontend]\nstreams = [\"histogramm\"]\n").unwrap();
    let (code, _, err) = run("canopy-frontend", &["validate"], &[]);
    assert_eq!(code, Some(64));
    assert!(
        err.contains("unknown filter \"histogramm\" (did you mean \"histogram\"? available: "),
        "{err}"
    );
}

/// The front-end's metric selection keys are refused outside their range, each by its key.
#[test]
fn selection_keys_out_of_range_are_refused_by_their_key() {
    let validate = |args: &[&str]| {
        let out = Command::new(bin_dir().join("canopy-frontend"))
            .arg("validate")
            .args(["--insecure", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = validate(&["--select-rounds", "2"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains(
            "bad config value for `--select-rounds` (from command-line flags): must be between 10 (the check validates on a fifth of them) and 1000"
        ),
        "{err}"
    );
    let (code, err) = validate(&["--select-on-change=-0.5"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains(
            "`--select-on-change` (from command-line flags): must be a fraction between 0 (never) and 100"
        ),
        "{err}"
    );
    let (code, err) = validate(&["--select-every-rounds", "50", "--select-on-change", "0.5"]);
    assert_eq!(code, Some(0), "{err}");
}

/// `worker_threads` is checked in every daemon and sets the threads that run its tasks: one by default.
#[test]
fn worker_threads_are_checked_and_are_the_threads_a_daemon_runs() {
    for (bin, var) in [
        ("canopy-agent", "CANOPY_AGENT_WORKER_THREADS"),
        ("canopy-relay", "CANOPY_RELAY_WORKER_THREADS"),
        ("canopy-frontend", "CANOPY_FRONTEND_WORKER_THREADS"),
    ] {
        let out = Command::new(bin_dir().join(bin))
            .arg("validate")
            .env(var, "0")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{bin}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "bad config value for `{var}` (from environment variable {var}): must be between 1 and 256"
            )),
            "{bin}: {err}"
        );
    }
    // A relay whose parent is not there keeps running, and retrying, on its workers alone.
    let workers = |extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let (relay, _) = start_relay_with(dir.path(), "relay-w", "127.0.0.1:1", "127.0.0.1:0", extra);
        let tasks = std::fs::read_dir(format!("/proc/{}/task", relay.child.id())).unwrap();
        tasks
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
            .filter(|comm| matches!(comm.trim(), "tokio-rt-worker" | "canopy-worker"))
            .count()
    };
    assert_eq!(workers(&[]), 1);
    assert_eq!(workers(&["--worker-threads", "3"]), 3);
}
