//! A hand-made rank as a process of its own (the `canopy-test-rank` binary), so a test can attach it to an agent
//! as another user and hold its connection for as long as it likes.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use canopy_wire::v1::{EventSample, RankDump, RankProfile};
use prost::Message;

use crate::bin_dir;

/// Rank `rank` of `app`'s dump of `round` as the tests' hand-made ranks send it: one event, `work`, called once
/// for 10 us each round.
pub fn work_dump(app: &str, rank: u32, round: u64) -> RankDump {
    let profile = RankProfile {
        app: app.into(),
        rank,
        round,
        events: vec![EventSample {
            event_id: canopy_wire::event_id("work"),
            calls: 1,
            calls_total: round + 1,
            incl_us: 10.0,
            excl_us: 10.0,
            ..Default::default()
        }],
        ..Default::default()
    };
    RankDump {
        round,
        dump_unix_ns: 1,
        profile: profile.encode_to_vec(),
        ..Default::default()
    }
}

/// A `canopy-test-rank` process: what the agent answered its hello, and its connection, held until dropped.
pub struct TestRank {
    child: Child,
    /// `accepted`, or `refused: REASON`.
    pub answer: String,
}

impl TestRank {
    /// Rank `rank` of `app` (of `nranks`) says hello on `socket`, as `user` (uid, gid) if given, and dumps rounds
    /// `0..rounds` once accepted.
    pub fn start(
        socket: &Path,
        app: &str,
        rank: u32,
        nranks: u32,
        rounds: u64,
        user: Option<(u32, u32)>,
    ) -> Self {
        let mut cmd = Command::new(bin_dir().join("canopy-test-rank"));
        cmd.arg(socket)
            .args([app, &rank.to_string(), &nranks.to_string(), &rounds.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((uid, gid)) = user {
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd.spawn().expect("canopy-test-rank");
        let mut answer = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut answer)
            .expect("canopy-test-rank's answer");
        TestRank {
            child,
            answer: answer.trim_end().to_string(),
        }
    }

    /// The agent's reason for refusing the hello; panics if it was accepted.
    pub fn refusal(&self) -> &str {
        self.answer
            .strip_prefix("refused: ")
            .unwrap_or_else(|| panic!("not refused: {:?}", self.answer))
    }

    /// Panics unless the agent accepted the hello.
    pub fn assert_accepted(&self) {
        assert_eq!(self.answer, "accepted", "the agent's answer");
    }

    /// The process id, as the agent sees it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for TestRank {
    fn drop(&mut self) {
        // Closing its standard input ends it: it hangs up.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
