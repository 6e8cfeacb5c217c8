//! The streams a node runs: each one's spec, its filter instance on this node, the ranks it is fed by (parsed once,
//! at open), and the time spent in its filter.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use canopy_proto::v1::{FilterTime, StreamSpec, SyncMode};
use tokio::time::Instant;

use crate::engine::StreamSync;
use crate::filter::{FilterError, FilterFactory, FilterInstance, Level, Output};
use crate::ranks::RankSet;

/// One stream on this node.
struct Stream {
    spec: StreamSpec,
    /// `None` once the stream failed here (or if it could not be created).
    filter: Option<Box<dyn FilterInstance>>,
    /// The failure was reported.
    failed: bool,
    /// The ranks that feed it (a detail stream names some; the rest count as sampled out).
    ranks: RankSet,
}

/// What a packet's stream is to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    Live,
    /// Failed here: its packets are dropped quietly.
    Failed,
    /// Closed here: packets still in flight are dropped quietly.
    Closed,
    /// Never opened here: a packet for it is malformed.
    Unknown,
}

/// The streams of one node.
pub(crate) struct StreamTable {
    factory: Arc<dyn FilterFactory>,
    level: Level,
    streams: BTreeMap<u32, Stream>,
    closed: HashSet<u32>,
    /// Calls into each stream's filter and the time they took (microseconds).
    time: BTreeMap<u32, (u64, u64)>,
}

impl StreamTable {
    pub(crate) fn new(factory: Arc<dyn FilterFactory>, level: Level) -> Self {
        Self {
            factory,
            level,
            streams: BTreeMap::new(),
            closed: HashSet::new(),
            time: BTreeMap::new(),
        }
    }

    /// Opens a stream: creates its filter, parses its ranks and tells it the names known so far. On an error the
    /// stream is kept as failed (so its packets are dropped quietly) and the reason is returned.
    pub(crate) fn open(
        &mut self,
        spec: StreamSpec,
        names: &HashMap<u64, String>,
    ) -> Result<StreamSync, String> {
        let id = spec.stream_id;
        let created = self
            .factory
            .create(&spec.filter, &spec.params, self.level)
            .map_err(|e| e.to_string())
            .and_then(|filter| {
                let ranks = RankSet::parse(&spec.ranks).map_err(|e| e.to_string())?;
                Ok((filter, ranks))
            })
            .and_then(|(filter, ranks)| {
                let mode = match SyncMode::try_from(spec.sync_mode) {
                    Ok(SyncMode::DontWait) => SyncMode::DontWait,
                    _ => SyncMode::WaitForAll,
                };
                if mode == SyncMode::DontWait && filter.phases() > 1 {
                    // Its later phases need every packet of the round's first phase merged first.
                    return Err(format!(
                        "filter {} has {} phases and runs only in wait_for_all streams",
                        spec.filter,
                        filter.phases()
                    ));
                }
                let timeout = Duration::from_millis(u64::from(spec.timeout_ms.max(1)));
                Ok((filter, ranks, StreamSync { mode, timeout }))
            });
        match created {
            Ok((mut filter, ranks, sync)) => {
                // A filter that classifies by name needs the names before the first round.
                if !names.is_empty() {
                    let pairs: Vec<(u64, String)> = names.iter().map(|(id, n)| (*id, n.clone())).collect();
                    filter.names(&pairs);
                }
                self.streams.insert(
                    id,
                    Stream {
                        spec,
                        filter: Some(filter),
                        failed: false,
                        ranks,
                    },
                );
                Ok(sync)
            }
            Err(reason) => {
                self.streams.insert(
                    id,
                    Stream {
                        spec,
                        filter: None,
                        failed: false,
                        ranks: RankSet::default(),
                    },
                );
                Err(reason)
            }
        }
    }

    pub(crate) fn known(&self, id: u32) -> Known {
        match self.streams.get(&id) {
            Some(s) if s.filter.is_some() => Known::Live,
            Some(_) => Known::Failed,
            None if self.closed.contains(&id) => Known::Closed,
            None => Known::Unknown,
        }
    }

    /// The spec of a stream that is live here.
    pub(crate) fn live_spec(&self, id: u32) -> Option<&StreamSpec> {
        self.streams
            .get(&id)
            .filter(|s| s.filter.is_some())
            .map(|s| &s.spec)
    }

    pub(crate) fn spec(&self, id: u32) -> Option<&StreamSpec> {
        self.streams.get(&id).map(|s| &s.spec)
    }

    /// A stream that ended before this node began (an earlier run of this root had it): its packets still on
    /// their way are expected, not malformed.
    pub(crate) fn ended_before(&mut self, id: u32) {
        if !self.streams.contains_key(&id) {
            self.closed.insert(id);
        }
    }

    /// Every stream this node runs or keeps as failed, in id order.
    pub(crate) fn ids(&self) -> Vec<u32> {
        self.streams.keys().copied().collect()
    }

    /// The live streams' specs, in id order.
    pub(crate) fn live_specs(&self) -> impl Iterator<Item = &StreamSpec> {
        self.streams
            .values()
            .filter(|s| s.filter.is_some())
            .map(|s| &s.spec)
    }

    /// The live streams and the ranks that feed each.
    pub(crate) fn feeds(&self) -> impl Iterator<Item = (u32, &RankSet)> {
        self.streams
            .iter()
            .filter(|(_, s)| s.filter.is_some())
            .map(|(id, s)| (*id, &s.ranks))
    }

    /// Removes a closed stream; its packets still in flight are expected from now on.
    pub(crate) fn close(&mut self, id: u32) -> Option<StreamSpec> {
        self.closed.insert(id);
        self.streams.remove(&id).map(|s| s.spec)
    }

    /// Marks a stream failed here; returns its spec the first time.
    pub(crate) fn fail(&mut self, id: u32) -> Option<StreamSpec> {
        let s = self.streams.get_mut(&id)?;
        s.filter = None;
        if s.failed {
            return None;
        }
        s.failed = true;
        Some(s.spec.clone())
    }

    /// Phases of the stream's rounds and its time-out, for a live stream.
    pub(crate) fn phases(&self, id: u32) -> Option<u32> {
        self.streams.get(&id)?.filter.as_ref().map(|f| f.phases())
    }

    pub(crate) fn names(&mut self, pairs: &[(u64, String)]) {
        for s in self.streams.values_mut() {
            if let Some(f) = s.filter.as_mut() {
                f.names(pairs);
            }
        }
    }

    pub(crate) fn upstream(
        &mut self,
        id: u32,
        round: u64,
        phase: u32,
        inputs: &[&[u8]],
    ) -> Option<Result<Output, FilterError>> {
        self.call(id, |f| f.upstream(round, phase, inputs))
    }

    pub(crate) fn downstream(
        &mut self,
        id: u32,
        round: u64,
        phase: u32,
        packet: &[u8],
    ) -> Option<Result<Output, FilterError>> {
        self.call(id, |f| f.downstream(round, phase, packet))
    }

    pub(crate) fn finalize(
        &mut self,
        id: u32,
        round: u64,
        phase: u32,
        payload: &[u8],
    ) -> Option<Result<Vec<u8>, FilterError>> {
        self.call(id, |f| f.finalize(round, phase, payload))
    }

    /// A late rank's raw profile turned into the packet a single-phase filter sends up; a multi-phase round has
    /// moved on, so it gets none (only its coverage goes up).
    pub(crate) fn late_leaf_packet(&mut self, id: u32, round: u64, phase: u32, raw: &[u8]) -> Vec<u8> {
        let Some(filter) = self.streams.get_mut(&id).and_then(|s| s.filter.as_mut()) else {
            return Vec::new();
        };
        if filter.phases() > 1 {
            return Vec::new();
        }
        match filter.upstream(round, phase, &[raw]) {
            Ok(out) if out.rejected.is_empty() => {
                out.up.into_iter().next().map(|p| p.payload).unwrap_or_default()
            }
            Ok(_) | Err(_) => Vec::new(),
        }
    }

    fn call<T>(&mut self, id: u32, f: impl FnOnce(&mut dyn FilterInstance) -> T) -> Option<T> {
        let filter = self.streams.get_mut(&id)?.filter.as_mut()?;
        let started = Instant::now();
        let out = f(filter.as_mut());
        let t = self.time.entry(id).or_default();
        t.0 += 1;
        t.1 += started.elapsed().as_micros() as u64;
        Some(out)
    }

    pub(crate) fn filter_time(&self) -> Vec<FilterTime> {
        self.time
            .iter()
            .map(|(id, (calls, micros))| FilterTime {
                stream_id: *id,
                calls: *calls,
                micros: *micros,
            })
            .collect()
    }
}
