//! A failed TLS connection says what is wrong in words an operator can act on: another tree's CA, plaintext
//! against TLS and TLS against plaintext, from the `canopy` command and in a daemon's log, at the first attempt.

use std::time::Duration;

use canopy_integration_tests::{Proc, bin_dir, credentials, start_frontend, wait_for};

/// `canopy streams list` against `addr` with `tls` (flags): its stderr, asserting it failed.
fn refused(addr: &str, tls: &[&str]) -> String {
    let out = std::process::Command::new(bin_dir().join("canopy"))
        .args(["streams", "list", "--frontend", addr])
        .args(tls)
        .env_remove("CANOPY_TLS_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn tls_faults_are_named_by_the_command_and_by_a_daemon_at_its_first_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, addr, _) = start_frontend(dir.path(), &["--streams", "stats"]);
    let other = canopy_runtime::tls::write_credentials(&dir.path().join("other"), &[], 1, true).unwrap();
    let other_dir = other.dir.display().to_string();

    let err = refused(&addr, &["--tls-dir", &other_dir]);
    assert!(
        err.contains("invalid peer certificate")
            && err.contains("unknown CA: the peer's certificate is not signed"),
        "{err}"
    );
    let err = refused(&addr, &["--insecure"]);
    assert!(
        err.contains("plaintext against TLS: the peer speaks TLS"),
        "{err}"
    );

    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let (_plain_fe, plain_addr, _) = start_frontend(&plain, &["--insecure", "--streams", "stats"]);
    let ours = credentials().dir.display().to_string();
    let err = refused(&plain_addr, &["--tls-dir", &ours]);
    assert!(
        err.contains("TLS against plaintext: the peer speaks plaintext"),
        "{err}"
    );

    // A relay with another tree's certificates names the fault at its first attempt.
    let node = other.node();
    let path = |p: Option<std::path::PathBuf>| p.unwrap().display().to_string();
    let (ca, cert, key) = (path(node.ca), path(node.cert), path(node.key));
    let args = [
        "--node-id",
        "stranger",
        "--parent",
        &addr,
        "--listen",
        "127.0.0.1:0",
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let relay = Proc::start(dir.path(), "canopy-relay", "stranger", &args);
    wait_for("the relay's first refusal named", Duration::from_secs(5), || {
        relay.log_text().contains("cannot reach parent") && relay.log_text().contains("unknown CA")
    });
}
