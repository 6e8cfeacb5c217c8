//! The store under pressure: a front-end whose disk fills mid-run keeps its rounds and writes them once space
//! returns, lets go of the oldest results only past its bound (their rows then count their ranks as
//! `store_failed`), logs the failure once a second, and a front-end or `canopy up` refuses to start on a full
//! disk. The disk is a small tmpfs mounted for the test: it needs root, and says it skipped without it.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use canopy_integration_tests::accounting::assert_every_round_has_its_row;
use canopy_integration_tests::{SimAgent, bin_dir, read_rounds, start_frontend, wait_for};
use canopy_proto::v1::MissingReason;
use canopy_store::RoundRow;
use nix::sys::signal::Signal;

/// A tmpfs of `mib` MiB mounted at `at` until dropped; `None` (and a line saying the test skipped) where this
/// process may not mount.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, mib: u32) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallDisk(at.to_path_buf())),
            Ok(o) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }

    /// Fills the disk with `filler`, to the last byte.
    fn fill(&self) -> PathBuf {
        let filler = self.0.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let one = [0u8; 1];
        while f.write_all(&one).is_ok() {}
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Every round has its row, whose ranks add up: covered plus every reason's count is what was expected.
fn assert_every_round_accounted(rounds: &[RoundRow]) {
    assert_every_round_has_its_row(rounds);
    for r in rounds {
        let missing: u32 = r.missing.iter().map(|(_, n)| n).sum();
        assert_eq!(r.covered + missing, r.expected, "ranks unaccounted for: {r:?}");
    }
}

#[test]
fn a_disk_that_fills_mid_run_loses_no_round_and_each_round_let_go_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&dir.path().join("out"), 20) else {
        return;
    };
    // A retry bound of 1 MiB: some 100 rounds of 64 ranks' stats, so a 6 s outage at 100 rounds/s passes it.
    let args = ["--streams", "stats", "--store-retry-mb", "1"];
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &args);
    let _agent = SimAgent {
        id: "agent-0",
        parents: &fe_addr,
        ranks: 64,
        offset: 0,
        total: 64,
        period_ms: 10,
        rounds: 0,
    }
    .start(dir.path());
    wait_for("20 rounds", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 20
    });

    let filler = disk.fill();
    std::thread::sleep(Duration::from_secs(6));
    let log = fe.log_text();
    let failures = log.matches("store write failed, kept for retry").count();
    assert!(failures >= 1, "{log}");
    assert!(failures <= 8, "{failures} lines in 6 s:\n{log}");
    std::fs::remove_file(&filler).unwrap();
    wait_for("the store to write again", Duration::from_secs(20), || {
        fe.log_text().contains("the store writes again")
    });
    let seen = read_rounds(&store).last().unwrap().round;
    wait_for("20 more rounds", Duration::from_secs(30), || {
        read_rounds(&store).last().unwrap().round >= seen + 20
    });
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(20)).is_some());

    let rounds = read_rounds(&store);
    assert_every_round_accounted(&rounds);
    let failed: Vec<&RoundRow> = rounds
        .iter()
        .filter(|r| r.missing.get(MissingReason::StoreFailed) > 0)
        .collect();
    assert!(
        !failed.is_empty(),
        "the outage passed the bound: some rounds were let go"
    );
    for r in &failed {
        assert_eq!(
            (r.covered, r.missing.get(MissingReason::StoreFailed)),
            (0, 64),
            "{r:?}"
        );
    }
    // What stayed within the bound was written whole once the disk had room, and so was every round after.
    let whole = rounds.iter().filter(|r| r.covered == 64).count();
    assert_eq!(whole + failed.len(), rounds.len(), "every round whole or let go");
    let last_failed = failed.last().unwrap().round;
    assert!(
        rounds
            .iter()
            .any(|r| r.round > last_failed && r.round < seen && r.covered == 64),
        "the rounds kept for retry were written once the disk had room"
    );
    assert!(
        fe.log_text()
            .contains("are stored with their ranks as store_failed"),
        "{}",
        fe.log_text()
    );
    drop(disk);
}

#[test]
fn a_frontend_and_canopy_up_refuse_to_start_on_a_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&dir.path().join("full"), 20) else {
        return;
    };
    let _filler = disk.fill();
    let out = disk.0.join("out");
    let fe = Command::new(bin_dir().join("canopy-frontend"))
        .args(["--insecure", "--listen", "127.0.0.1:0", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&fe.stderr);
    assert_eq!(fe.status.code(), Some(64), "{err}");
    assert!(
        err.contains(&format!(
            "`--out` (from command-line flags): {} has 0 bytes free, less than the 16 MiB a run's store needs to \
             start",
            disk.0.display()
        )),
        "{err}"
    );
    let up = Command::new(bin_dir().join("canopy"))
        .args([
            "up",
            "--insecure",
            "--ranks",
            "4",
            "--agents",
            "1",
            "--rounds",
            "3",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&up.stderr);
    assert!(!up.status.success(), "{err}");
    assert!(
        err.contains(&format!("--output: {} has 0 bytes free", disk.0.display())),
        "{err}"
    );
    // A read-only directory, named as such.
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let Some(ro_disk) = SmallDisk::mount(&ro, 20) else {
        return;
    };
    let remount = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&ro)
        .status()
        .unwrap();
    assert!(remount.success());
    let fe = Command::new(bin_dir().join("canopy-frontend"))
        .args(["validate", "--insecure", "--out"])
        .arg(ro.join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&fe.stderr);
    assert_eq!(fe.status.code(), Some(64), "{err}");
    assert!(
        err.contains(&format!(
            "cannot write in {}: Read-only file system",
            ro.display()
        )),
        "{err}"
    );
    drop(ro_disk);
}
