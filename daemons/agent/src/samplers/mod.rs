//! The node's samplers, as LDMS loads sampler plugins: each reads one part of the node's state from /proc (CPU,
//! memory, network, disk, load) and the set fills one `NodeSample` for the streams of the `nodes` filter. Which
//! samplers run is the agent's configuration (`samplers`); they sample once per round of a node stream, or every
//! `sample_period_ms` on a thread of their own.
//!
//! Each sampler is a pure parser over the file's text (unit-tested on captured text) and its previous counters;
//! reading is thin: every file stays open and is read again from its start into one buffer. A sampler whose file
//! is missing or cannot be read is logged once, by name and reason, and left out; the others go on.

#![allow(
    clippy::disallowed_types,
    reason = "a sample's interval is real time, on the samplers' own thread or read as a round closes: the node's \
              paused test clock must not stretch it"
)]

pub mod cpu;
pub mod disk;
pub mod load;
pub mod memory;
pub mod network;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use canopy_core::node::{NodeSampler, unix_ns};
use canopy_proto::filters::v1::NodeSample;

/// A sampler the agent can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SamplerKind {
    Cpu,
    Memory,
    Network,
    Disk,
    Load,
}

impl SamplerKind {
    /// Every sampler, in the order a sample lists them: the default set.
    pub const ALL: [SamplerKind; 5] = [
        SamplerKind::Cpu,
        SamplerKind::Memory,
        SamplerKind::Network,
        SamplerKind::Disk,
        SamplerKind::Load,
    ];

    /// Its name in the configuration and the log.
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Cpu => "cpu",
            SamplerKind::Memory => "memory",
            SamplerKind::Network => "network",
            SamplerKind::Disk => "disk",
            SamplerKind::Load => "load",
        }
    }
}

/// The samplers' names as the configuration gives them (blank entries ignored, so `--samplers ''` is none): an
/// unknown or repeated name is an error that lists the valid ones.
pub fn parse_names(names: &[String]) -> Result<Vec<SamplerKind>, String> {
    let mut kinds = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let Some(kind) = SamplerKind::ALL.into_iter().find(|k| k.name() == name) else {
            let valid: Vec<&str> = SamplerKind::ALL.iter().map(|k| k.name()).collect();
            return Err(format!(
                "unknown sampler {name:?} (samplers: {})",
                valid.join(", ")
            ));
        };
        if kinds.contains(&kind) {
            return Err(format!("names the sampler {name:?} twice"));
        }
        kinds.push(kind);
    }
    Ok(kinds)
}

/// Why a sampler cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
}

/// Where the samplers find the kernel's files: `/proc` and `/sys`, or a copy of them in the tests.
#[derive(Debug, Clone)]
pub struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            proc: "/proc".into(),
            sys: "/sys".into(),
        }
    }
}

/// One file read again and again: kept open and read from its start into one buffer, so a sample costs a seek
/// and a read per file, and no allocation once the buffer has grown to the file's size.
#[derive(Debug)]
pub struct ProcFile {
    path: PathBuf,
    file: File,
    buf: String,
}

impl ProcFile {
    pub fn open(path: PathBuf) -> Result<Self, SamplerError> {
        match File::open(&path) {
            Ok(file) => Ok(Self {
                path,
                file,
                buf: String::with_capacity(4096),
            }),
            Err(source) => Err(SamplerError::Io { path, source }),
        }
    }

    /// The file's text as it is now.
    pub fn read(&mut self) -> Result<&str, SamplerError> {
        self.buf.clear();
        let read = self
            .file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.read_to_string(&mut self.buf));
        match read {
            Ok(_) => Ok(&self.buf),
            Err(source) => Err(SamplerError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// A parse error of this file.
    pub fn bad(&self, reason: impl Into<String>) -> SamplerError {
        SamplerError::Parse {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One sampler: reads its files and fills its part of a sample. Counters are turned into what happened since
/// its previous read; its first read (when the set starts) is the baseline.
pub trait Sampler: Send + std::fmt::Debug {
    fn kind(&self) -> SamplerKind;
    /// Reads the files; fills `sample` unless this is the baseline (or no time passed that the counters show).
    fn read(&mut self, sample: &mut NodeSample) -> Result<(), SamplerError>;
}

fn open(kind: SamplerKind, roots: &Roots) -> Result<Box<dyn Sampler>, SamplerError> {
    Ok(match kind {
        SamplerKind::Cpu => Box::new(cpu::CpuSampler::open(roots)?),
        SamplerKind::Memory => Box::new(memory::MemorySampler::open(roots)?),
        SamplerKind::Network => Box::new(network::NetworkSampler::open(roots)?),
        SamplerKind::Disk => Box::new(disk::DiskSampler::open(roots)?),
        SamplerKind::Load => Box::new(load::LoadSampler::open(roots)?),
    })
}

/// The samplers of one agent. Read as a [`NodeSampler`], it samples the node there and then: once per round of a
/// node stream.
#[derive(Debug)]
pub struct Samplers {
    running: Vec<Box<dyn Sampler>>,
    /// When the samplers last read (the baseline, then each sample).
    last: Instant,
}

impl Samplers {
    /// Starts the samplers named and reads each one's baseline; one that cannot read its files is logged, by
    /// name and reason, and left out.
    pub fn start(kinds: &[SamplerKind], roots: &Roots) -> Samplers {
        let mut running = Vec::with_capacity(kinds.len());
        let mut baseline = NodeSample::default();
        for &kind in kinds {
            match open(kind, roots).and_then(|mut s| s.read(&mut baseline).map(|()| s)) {
                Ok(s) => running.push(s),
                Err(e) => left_out(kind, &e),
            }
        }
        if !running.is_empty() {
            let names: Vec<&str> = running.iter().map(|s| s.kind().name()).collect();
            tracing::info!(samplers = %names.join(","), "node samplers started");
        }
        Samplers {
            running,
            last: Instant::now(),
        }
    }

    /// The samplers that run (those left out are not).
    pub fn running(&self) -> Vec<SamplerKind> {
        self.running.iter().map(|s| s.kind()).collect()
    }

    /// Reads every sampler into `sample`: what happened since the previous read. A sampler that fails is logged
    /// and left out from then on.
    pub fn read(&mut self, sample: &mut NodeSample) {
        let now = Instant::now();
        sample.sample_unix_ns = unix_ns();
        sample.interval_ns = u64::try_from(now.duration_since(self.last).as_nanos()).unwrap_or(u64::MAX);
        self.last = now;
        self.running.retain_mut(|s| match s.read(sample) {
            Ok(()) => true,
            Err(e) => {
                left_out(s.kind(), &e);
                false
            }
        });
    }
}

impl NodeSampler for Samplers {
    fn sample(&mut self, sample: &mut NodeSample) {
        self.read(sample);
    }
}

fn left_out(kind: SamplerKind, e: &SamplerError) {
    tracing::warn!(
        sampler = kind.name(),
        "node sampler {} is left out: {e}",
        kind.name()
    );
}

/// The samplers on a thread of their own, reading every period (LDMS's sample interval); each round of a node
/// stream takes the newest sample. The thread ends when this is dropped.
#[derive(Debug)]
pub struct Periodic {
    newest: Arc<Mutex<Option<NodeSample>>>,
    /// Dropped with this: the thread's wait for the next period ends, and so does the thread.
    _stop: std::sync::mpsc::Sender<()>,
}

/// The sampling thread's name (15 bytes, the most a thread name holds), so its CPU time can be found per thread.
pub const THREAD_NAME: &str = "canopy-samplers";

impl Periodic {
    /// Starts the thread: a sample every `period`, on a fixed schedule from now.
    pub fn spawn(mut samplers: Samplers, period: Duration) -> std::io::Result<Periodic> {
        let newest = Arc::new(Mutex::new(None));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let shared = newest.clone();
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                let mut next = Instant::now() + period;
                loop {
                    let wait = next.saturating_duration_since(Instant::now());
                    match stopped.recv_timeout(wait) {
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let mut sample = NodeSample::default();
                    samplers.read(&mut sample);
                    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Some(sample);
                    next += period;
                    // Behind by more than a period (the machine was stopped, say): sample on from now.
                    let now = Instant::now();
                    if next < now {
                        next = now + period;
                    }
                }
            })?;
        Ok(Periodic { newest, _stop: stop })
    }
}

impl NodeSampler for Periodic {
    fn sample(&mut self, sample: &mut NodeSample) {
        let newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = newest.as_ref() {
            sample.sample_unix_ns = n.sample_unix_ns;
            sample.interval_ns = n.interval_ns;
            sample.cpu = n.cpu;
            sample.memory = n.memory;
            sample.network = n.network;
            sample.disk = n.disk;
            sample.load = n.load;
        }
    }
}

/// The agent's node sampler as configured: none without samplers, the samplers themselves with period 0 (a
/// sample per round), else their thread.
pub fn node_sampler(
    kinds: &[SamplerKind],
    period_ms: u64,
    roots: &Roots,
) -> std::io::Result<Option<Box<dyn NodeSampler>>> {
    if kinds.is_empty() {
        return Ok(None);
    }
    let samplers = Samplers::start(kinds, roots);
    Ok(Some(match period_ms {
        0 => Box::new(samplers),
        ms => Box::new(Periodic::spawn(samplers, Duration::from_millis(ms))?),
    }))
}

#[cfg(test)]
mod tests;
