//! A real Kafka-API broker for the export's tests: tansu (a Kafka broker in Rust, `cargo install tansu --locked
//! --features dynostore`) on a loopback port with its in-memory storage, and a reader of what a topic holds.
//!
//! The broker is `$CANOPY_TANSU`, else `tansu` on the PATH or in `~/.cargo/bin`. Without one a test says it
//! skipped, unless `CANOPY_KAFKA_TEST=1` (CI installs the broker and sets it), where a missing broker fails.

#![allow(
    clippy::disallowed_methods,
    reason = "tests that wait on a real broker by the wall clock"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rskafka::client::ClientBuilder;
use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};

use crate::Proc;

/// The broker's program, if there is one.
pub fn tansu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CANOPY_TANSU") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("tansu"))
        .find(|p| p.is_file());
    on_path.or_else(|| {
        let home = std::env::var_os("HOME")?;
        let p = Path::new(&home).join(".cargo/bin/tansu");
        p.is_file().then_some(p)
    })
}

/// A broker on loopback, killed when dropped.
pub struct Broker {
    proc: Proc,
    pub addr: String,
    program: PathBuf,
    dir: PathBuf,
}

/// One record as a consumer reads it.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub offset: i64,
    pub key: String,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
}

impl Broker {
    /// Starts a broker in `dir`; `None` (after saying so) where there is none and the test may skip.
    pub fn start(dir: &Path, test: &str) -> Option<Broker> {
        Broker::start_refusing(dir, test, &[])
    }

    /// As [`Broker::start`], refusing every record of each topic in `refused` (a JSON schema that wants a number
    /// as the key, which tansu checks every record against: the broker answers `InvalidRecord`).
    pub fn start_refusing(dir: &Path, test: &str, refused: &[&str]) -> Option<Broker> {
        let Some(program) = tansu() else {
            assert!(
                std::env::var("CANOPY_KAFKA_TEST").as_deref() != Ok("1"),
                "CANOPY_KAFKA_TEST=1 but no tansu broker: set CANOPY_TANSU or install it \
                 (cargo install tansu --locked --features dynostore)"
            );
            eprintln!("SKIPPED {test}: no Kafka broker (set CANOPY_TANSU, or install tansu)");
            return None;
        };
        let addr = crate::unused_addr();
        let schemas = dir.join("schemas");
        if !refused.is_empty() {
            std::fs::create_dir_all(&schemas).expect("schema directory");
        }
        for topic in refused {
            let schema = r#"{"type": "object", "properties": {"key": {"type": "number"}}}"#;
            std::fs::write(schemas.join(format!("{topic}.json")), schema).expect("schema");
        }
        let proc = start(&program, dir, &addr);
        let broker = Broker {
            proc,
            addr,
            program,
            dir: dir.to_path_buf(),
        };
        broker.wait_serving(Duration::from_secs(30));
        Some(broker)
    }

    /// SIGSTOP: the broker keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.proc.signal(Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.proc.signal(Signal::SIGCONT);
    }

    /// Kills the broker and starts another on the same address (its in-memory topics are gone).
    pub fn restart_empty(&mut self) {
        self.proc = start(&self.program, &self.dir, &self.addr);
        self.wait_serving(Duration::from_secs(30));
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }

    fn wait_serving(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let runtime = runtime();
        loop {
            let ok = runtime.block_on(async {
                let client = tokio::time::timeout(
                    Duration::from_secs(3),
                    ClientBuilder::new(vec![self.addr.clone()]).build(),
                )
                .await;
                match client {
                    Ok(Ok(c)) => tokio::time::timeout(Duration::from_secs(3), c.list_topics())
                        .await
                        .is_ok_and(|r| r.is_ok()),
                    _ => false,
                }
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the broker did not serve on {} in {timeout:?}:\n{}",
                self.addr,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The topics the broker has.
    pub fn topics(&self) -> Vec<String> {
        runtime().block_on(async {
            let client = ClientBuilder::new(vec![self.addr.clone()])
                .build()
                .await
                .expect("client");
            let mut names: Vec<String> = client
                .list_topics()
                .await
                .expect("topics")
                .into_iter()
                .map(|t| t.name)
                .collect();
            names.sort();
            names
        })
    }

    /// Every record of partition 0 of `topic`, in offset order.
    pub fn records(&self, topic: &str) -> Vec<Consumed> {
        runtime().block_on(async {
            let client = ClientBuilder::new(vec![self.addr.clone()])
                .build()
                .await
                .expect("client");
            let partition = client
                .partition_client(topic, 0, UnknownTopicHandling::Error)
                .await
                .unwrap_or_else(|e| panic!("topic {topic}: {e}"));
            let end = partition.get_offset(OffsetAt::Latest).await.expect("end offset");
            let mut offset = partition
                .get_offset(OffsetAt::Earliest)
                .await
                .expect("first offset");
            let mut out = Vec::new();
            while offset < end {
                let (records, _) = partition
                    .fetch_records(offset, 1..(8 << 20), 500)
                    .await
                    .expect("fetch");
                let Some(last) = records.last() else {
                    break;
                };
                offset = last.offset + 1;
                out.extend(records.into_iter().map(|r| Consumed {
                    offset: r.offset,
                    key: String::from_utf8(r.record.key.unwrap_or_default()).expect("UTF-8 key"),
                    value: r.record.value.unwrap_or_default(),
                    headers: r.record.headers,
                }));
            }
            out
        })
    }
}

fn start(program: &Path, dir: &Path, addr: &str) -> Proc {
    let url = format!("tcp://{addr}");
    let mut launch = canopy_launch::Launch::new(program);
    launch.args([
        "broker",
        "--listener-url",
        &url,
        "--advertised-listener-url",
        &url,
        "--storage-engine",
        "memory://tansu/",
    ]);
    // tansu reads a file:// registry's path relative to its working directory.
    launch.current_dir(dir);
    if dir.join("schemas").is_dir() {
        launch.args(["--schema-registry", "file://./schemas"]);
    }
    Proc::spawn(dir, "tansu", &launch)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
