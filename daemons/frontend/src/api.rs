//! `canopy.v1.Frontend`: the API users and scripts (grpcurl, the `canopy` command) use on the front-end's port.
//! Live results come from the root as it finalizes them; everything else is read from the run's store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use canopy_core::filter::{FilterFactory, Level};
use canopy_core::node::{Collection, RootHandle, RoundResult};
use canopy_core::plugin::PluginFilters;
use canopy_proto::v1::frontend_server::Frontend;
use canopy_proto::v1::{
    CloseStreamRequest, ControlRequest, ControlResponse, Coverage, CreateStreamRequest, EventName,
    EventNamesRequest, EventNamesResponse, ListStreamsRequest, ListStreamsResponse, Missing, MissingReason,
    NodeKind, NodeState, NodeStatus, RoundUpdate, StreamInfo, StreamSpec, SubscribeRequest, SyncMode,
    TopologyNode, TopologyRequest, TopologyResponse, control_request, subscribe_request,
};
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// What the root shares with the API while it runs.
pub struct Shared {
    /// Every result as the root finalizes it; a subscriber that falls behind misses the oldest and is told.
    pub live: broadcast::Sender<Arc<RoundResult>>,
    /// The last status each node reported.
    pub status: Mutex<HashMap<String, NodeStatus>>,
    /// Each stream's result type (the Any's type).
    pub result_types: Mutex<HashMap<u32, String>>,
}

impl Shared {
    pub fn new(buffer: usize) -> Arc<Shared> {
        let (live, _) = broadcast::channel(buffer.max(1));
        Arc::new(Shared {
            live,
            status: Mutex::default(),
            result_types: Mutex::default(),
        })
    }
}

/// The longest round time-out a stream may ask for.
const MAX_TIMEOUT_MS: u32 = 600_000;

pub struct FrontendApi {
    pub root: RootHandle,
    pub shared: Arc<Shared>,
    pub filters: Arc<PluginFilters>,
    pub store: PathBuf,
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<RoundUpdate, Status>> + Send>>;

fn any_of(result_type: &str, payload: Vec<u8>) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/{result_type}"),
        value: payload,
    }
}

/// A typed `google.protobuf.Struct` as the JSON text filters read.
fn json_of_struct(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), json_of_value(v)))
            .collect(),
    )
}

fn json_of_value(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9e15 => {
            serde_json::Value::from(*n as i64)
        }
        Some(Kind::NumberValue(n)) => serde_json::Value::from(*n),
        Some(Kind::StringValue(s)) => serde_json::Value::from(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::from(*b),
        Some(Kind::StructValue(s)) => json_of_struct(s),
        Some(Kind::ListValue(l)) => serde_json::Value::Array(l.values.iter().map(json_of_value).collect()),
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// Runs a read-only query on the store off the runtime's workers.
async fn read<T: Send + 'static>(
    store: PathBuf,
    f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(move || {
        let conn = rusqlite::Connection::open_with_flags(&store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        f(&conn)
    })
    .await
    .map_err(internal)?
    .map_err(internal)
}

fn reason_of(word: &str) -> MissingReason {
    match word {
        "late" => MissingReason::Late,
        "lost" => MissingReason::Lost,
        "stopped" => MissingReason::Stopped,
        "sampled_out" => MissingReason::SampledOut,
        "malformed" => MissingReason::Malformed,
        "not_waited" => MissingReason::NotWaited,
        "dropped" => MissingReason::Dropped,
        _ => MissingReason::Unspecified,
    }
}

fn sync_word(s: &str) -> SyncMode {
    if s == "dont_wait" {
        SyncMode::DontWait
    } else {
        SyncMode::WaitForAll
    }
}

/// Every stream the store knows, with its counts.
fn streams(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<StreamInfo>> {
    let mut st = conn.prepare(
        "SELECT s.stream_id, s.name, s.filter, COALESCE(s.params, ''), COALESCE(s.sync_mode, ''),
                COALESCE(s.timeout_ms, 0), COALESCE(s.state, ''), COALESCE(s.failure, ''),
                COALESCE(s.result_type, ''),
                (SELECT COUNT(*) FROM rounds r WHERE r.stream_id = s.stream_id),
                (SELECT COUNT(*) FROM rounds r WHERE r.stream_id = s.stream_id AND r.covered = r.expected),
                (SELECT COUNT(*) FROM late_arrivals l WHERE l.stream_id = s.stream_id),
                COALESCE(s.ranks, '')
         FROM streams s ORDER BY s.stream_id",
    )?;
    st.query_map([], |r| {
        Ok(StreamInfo {
            stream_id: r.get(0)?,
            name: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
            filter: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
            params_json: r.get(3)?,
            sync_mode: sync_word(&r.get::<_, String>(4)?) as i32,
            timeout_ms: r.get(5)?,
            state: r.get(6)?,
            failure: r.get(7)?,
            result_type: r.get(8)?,
            rounds: r.get::<_, i64>(9)? as u64,
            full_rounds: r.get::<_, i64>(10)? as u64,
            late_packets: r.get::<_, i64>(11)? as u64,
            ranks: r.get(12)?,
        })
    })?
    .collect()
}

/// What the store holds of the streams a subscriber wants, from `from_round` on, as updates.
fn stored_updates(
    conn: &rusqlite::Connection,
    wanted: &dyn Fn(u32, &str) -> bool,
    from_round: u64,
) -> rusqlite::Result<Vec<RoundUpdate>> {
    let streams = streams(conn)?;
    let mut out = Vec::new();
    for s in streams.iter().filter(|s| wanted(s.stream_id, &s.name)) {
        let mut rounds = conn.prepare_cached(
            "SELECT round, covered, expected, missing_late, missing_lost, missing_stopped, missing_sampled_out,
                    missing_malformed, missing_not_waited, missing_unspecified, missing_dropped
             FROM rounds WHERE stream_id = ?1 AND round >= ?2 ORDER BY round",
        )?;
        let rows: Vec<(u64, Coverage)> = rounds
            .query_map(rusqlite::params![s.stream_id, from_round as i64], |r| {
                let mut missing = Vec::new();
                for (i, word) in [
                    "late",
                    "lost",
                    "stopped",
                    "sampled_out",
                    "malformed",
                    "not_waited",
                    "unspecified",
                    "dropped",
                ]
                .iter()
                .enumerate()
                {
                    let n: u32 = r.get::<_, Option<u32>>(3 + i)?.unwrap_or(0);
                    if n > 0 {
                        missing.push(Missing {
                            reason: reason_of(word) as i32,
                            ranks: n,
                        });
                    }
                }
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    Coverage {
                        covered: r.get(1)?,
                        expected: r.get(2)?,
                        missing,
                    },
                ))
            })?
            .collect::<Result<_, _>>()?;
        for (round, coverage) in rows {
            let payload = if s.result_type == "canopy.v1.ProfileBatch" {
                profiles_of(conn, s.stream_id, round)?
            } else {
                conn.prepare_cached(
                    "SELECT payload FROM results WHERE stream_id = ?1 AND round = ?2 AND late = 0
                     ORDER BY phase DESC LIMIT 1",
                )?
                .query_row(rusqlite::params![s.stream_id, round as i64], |r| {
                    r.get::<_, Vec<u8>>(0)
                })
                .unwrap_or_default()
            };
            out.push(RoundUpdate {
                stream_id: s.stream_id,
                stream: s.name.clone(),
                filter: s.filter.clone(),
                round,
                phase: 0,
                coverage: Some(coverage),
                result: Some(any_of(&s.result_type, payload)),
                late: false,
                missed: 0,
                replayed: true,
            });
        }
    }
    Ok(out)
}

/// A passthrough round rebuilt from its `samples` and `counters` rows.
fn profiles_of(conn: &rusqlite::Connection, stream: u32, round: u64) -> rusqlite::Result<Vec<u8>> {
    use canopy_proto::v1::{CounterSample, EventSample, ProfileBatch, RankProfile};
    use prost::Message;
    let mut ranks: BTreeMap<(String, u32), RankProfile> = BTreeMap::new();
    let mut st = conn.prepare_cached(
        "SELECT app, rank, event_id, calls, subrs, incl_us, excl_us, calls_total, subrs_total, incl_total_us,
                excl_total_us FROM samples WHERE stream_id = ?1 AND round = ?2 AND late = 0",
    )?;
    let mut rows = st.query(rusqlite::params![stream, round as i64])?;
    while let Some(r) = rows.next()? {
        let (app, rank): (String, u32) = (r.get::<_, Option<String>>(0)?.unwrap_or_default(), r.get(1)?);
        let p = ranks.entry((app.clone(), rank)).or_insert_with(|| RankProfile {
            app,
            rank,
            round,
            ..Default::default()
        });
        p.events.push(EventSample {
            event_id: r.get::<_, i64>(2)? as u64,
            calls: r.get::<_, i64>(3)? as u64,
            subrs: r.get::<_, i64>(4)? as u64,
            // A NaN was stored as NULL.
            incl_us: r.get::<_, Option<f64>>(5)?.unwrap_or(f64::NAN),
            excl_us: r.get::<_, Option<f64>>(6)?.unwrap_or(f64::NAN),
            calls_total: r.get::<_, i64>(7)? as u64,
            subrs_total: r.get::<_, i64>(8)? as u64,
            incl_total_us: r.get::<_, Option<f64>>(9)?.unwrap_or(f64::NAN),
            excl_total_us: r.get::<_, Option<f64>>(10)?.unwrap_or(f64::NAN),
        });
    }
    let mut st = conn.prepare_cached(
        "SELECT app, rank, counter_id, value, total FROM counters WHERE stream_id = ?1 AND round = ?2 AND late = 0",
    )?;
    let mut rows = st.query(rusqlite::params![stream, round as i64])?;
    while let Some(r) = rows.next()? {
        let (app, rank): (String, u32) = (r.get::<_, Option<String>>(0)?.unwrap_or_default(), r.get(1)?);
        let p = ranks.entry((app.clone(), rank)).or_insert_with(|| RankProfile {
            app,
            rank,
            round,
            ..Default::default()
        });
        p.counters.push(CounterSample {
            counter_id: r.get::<_, i64>(2)? as u64,
            value: r.get::<_, Option<f64>>(3)?.unwrap_or(f64::NAN),
            total: r.get::<_, Option<f64>>(4)?.unwrap_or(f64::NAN),
        });
    }
    Ok(ProfileBatch {
        profiles: ranks.into_values().collect(),
    }
    .encode_to_vec())
}

fn word_state(s: &str) -> NodeState {
    match s {
        "attached" => NodeState::Attached,
        "lost" => NodeState::Lost,
        "finished" => NodeState::Finished,
        _ => NodeState::Unspecified,
    }
}

fn word_kind(s: &str) -> NodeKind {
    match s {
        "agent" => NodeKind::Agent,
        "relay" => NodeKind::Relay,
        "frontend" => NodeKind::Frontend,
        _ => NodeKind::Unspecified,
    }
}

impl FrontendApi {
    /// Checks a stream request and opens the stream on the tree.
    async fn open(&self, mut req: CreateStreamRequest) -> Result<StreamInfo, Status> {
        if let Some(params) = req.params.take() {
            if !req.params_json.is_empty() {
                return Err(Status::invalid_argument("give params or params_json, not both"));
            }
            req.params_json = json_of_struct(&params).to_string();
        }
        let info = self
            .filters
            .info(&req.filter)
            .map_err(|e| Status::not_found(e.to_string()))?;
        let timeout_ms = match req.timeout_ms {
            0 => 1000,
            t if t > MAX_TIMEOUT_MS => {
                return Err(Status::invalid_argument(format!(
                    "timeout_ms {t} is over the limit of {MAX_TIMEOUT_MS} (10 minutes)"
                )));
            }
            t => t,
        };
        let sync = match SyncMode::try_from(req.sync_mode) {
            Ok(SyncMode::Unspecified) | Ok(SyncMode::WaitForAll) => SyncMode::WaitForAll,
            Ok(SyncMode::DontWait) if info.phases > 1 => {
                return Err(Status::invalid_argument(format!(
                    "filter {} has {} phases and runs only in wait_for_all streams",
                    req.filter, info.phases
                )));
            }
            Ok(SyncMode::DontWait) => SyncMode::DontWait,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown sync_mode {}",
                    req.sync_mode
                )));
            }
        };
        // The parameters are checked by the filter itself, as the root will create it.
        self.filters
            .create(&req.filter, &req.params_json, Level::Root)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let name = if req.name.is_empty() {
            req.filter.clone()
        } else {
            req.name.clone()
        };
        canopy_core::ranks::RankSet::parse(&req.ranks).map_err(Status::invalid_argument)?;
        let spec = StreamSpec {
            stream_id: 0,
            name: name.clone(),
            filter: req.filter.clone(),
            params: req.params_json.clone(),
            sync_mode: sync as i32,
            timeout_ms,
            ranks: req.ranks.clone(),
        };
        let id = self.root.open_stream_id(spec).await;
        if id == 0 {
            return Err(Status::unavailable("the front-end is shutting down"));
        }
        Ok(StreamInfo {
            stream_id: id,
            name,
            filter: req.filter,
            params_json: req.params_json,
            sync_mode: sync as i32,
            timeout_ms,
            state: "open".into(),
            result_type: info.result_type,
            ranks: req.ranks,
            ..StreamInfo::default()
        })
    }
}

#[tonic::async_trait]
impl Frontend for FrontendApi {
    type SubscribeStream = UpdateStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let req = request.into_inner();
        let ids: HashSet<u32> = req.stream_ids.iter().copied().collect();
        let names: HashSet<String> = req.stream_names.iter().cloned().collect();
        let wanted = move |id: u32, name: &str| {
            (ids.is_empty() || ids.contains(&id)) && (names.is_empty() || names.contains(name))
        };
        // Subscribe before reading the store, so nothing stored in between is missed; duplicates are skipped.
        let mut live = self.shared.live.subscribe();
        let from = match req.start {
            Some(subscribe_request::Start::FromRound(r)) => Some(r),
            Some(subscribe_request::Start::Replay(true)) => Some(0),
            _ => None,
        };
        let stored = match from {
            Some(from) => {
                let w = wanted.clone();
                read(self.store.clone(), move |conn| stored_updates(conn, &w, from)).await?
            }
            None => Vec::new(),
        };
        // A round stored whole (wait-for-all) and also arriving live is sent once; don't-wait pieces are each
        // their own update.
        let dont_wait: HashSet<u32> = match from {
            Some(_) => {
                read(self.store.clone(), |conn| {
                    Ok(streams(conn)?
                        .into_iter()
                        .filter(|s| s.sync_mode == SyncMode::DontWait as i32)
                        .map(|s| s.stream_id)
                        .collect())
                })
                .await?
            }
            None => HashSet::new(),
        };
        let seen: HashSet<(u32, u64)> = stored
            .iter()
            .filter(|u| !dont_wait.contains(&u.stream_id))
            .map(|u| (u.stream_id, u.round))
            .collect();
        let shared = self.shared.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RoundUpdate, Status>>(16);
        tokio::spawn(async move {
            for u in stored {
                if tx.send(Ok(u)).await.is_err() {
                    return;
                }
            }
            let mut missed = 0u64;
            loop {
                // The client hanging up ends the task even while its streams are quiet.
                let received = tokio::select! {
                    _ = tx.closed() => return,
                    r = live.recv() => r,
                };
                match received {
                    Ok(r) => {
                        if !wanted(r.stream.stream_id, &r.stream.name)
                            || (!r.late && seen.contains(&(r.stream.stream_id, r.round)))
                        {
                            continue;
                        }
                        let result_type = shared
                            .result_types
                            .lock()
                            .expect("result types")
                            .get(&r.stream.stream_id)
                            .cloned()
                            .unwrap_or_default();
                        let update = RoundUpdate {
                            stream_id: r.stream.stream_id,
                            stream: r.stream.name.clone(),
                            filter: r.stream.filter.clone(),
                            round: r.round,
                            phase: r.phase,
                            coverage: Some(r.coverage.clone()),
                            result: Some(any_of(&result_type, r.payload.clone())),
                            late: r.late,
                            missed,
                            replayed: false,
                        };
                        missed = 0;
                        if tx.send(Ok(update)).await.is_err() {
                            return;
                        }
                    }
                    // This subscriber fell behind: the tree did not wait; the next update says how much it missed.
                    Err(broadcast::error::RecvError::Lagged(n)) => missed += n,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn create_stream(
        &self,
        request: Request<CreateStreamRequest>,
    ) -> Result<Response<StreamInfo>, Status> {
        self.open(request.into_inner()).await.map(Response::new)
    }

    async fn close_stream(
        &self,
        request: Request<CloseStreamRequest>,
    ) -> Result<Response<StreamInfo>, Status> {
        let id = request.into_inner().stream_id;
        // The root decides: the store may not have caught up with a stream opened a moment ago.
        let closed = self.root.close_stream_checked(id).await;
        let known = read(self.store.clone(), streams).await?;
        let info = known.into_iter().find(|s| s.stream_id == id);
        match (closed, info) {
            (None, _) => Err(Status::unavailable("the front-end is shutting down")),
            (Some(true), info) => {
                let mut info = info.unwrap_or(StreamInfo {
                    stream_id: id,
                    ..StreamInfo::default()
                });
                info.state = "closed".into();
                Ok(Response::new(info))
            }
            (Some(false), Some(info)) => Err(Status::failed_precondition(format!(
                "stream {id} is already {}",
                info.state
            ))),
            (Some(false), None) => Err(Status::not_found(format!("no stream {id}"))),
        }
    }

    async fn list_streams(
        &self,
        _: Request<ListStreamsRequest>,
    ) -> Result<Response<ListStreamsResponse>, Status> {
        let streams = read(self.store.clone(), streams).await?;
        Ok(Response::new(ListStreamsResponse { streams }))
    }

    async fn control(&self, request: Request<ControlRequest>) -> Result<Response<ControlResponse>, Status> {
        let (c, word) = match request.into_inner().action {
            Some(control_request::Action::Start(true)) => (Collection::Start, "start"),
            Some(control_request::Action::Stop(true)) => (Collection::Stop, "stop"),
            Some(control_request::Action::Detail(d)) => {
                let chosen =
                    canopy_core::ranks::RankSet::parse(&d.ranks).map_err(Status::invalid_argument)?;
                if chosen.is_all() {
                    return Err(Status::invalid_argument(
                        "a detail request names the ranks (\"0,17,40-43\")",
                    ));
                }
                let name = if d.name.is_empty() {
                    "detail".to_string()
                } else {
                    d.name
                };
                let req = CreateStreamRequest {
                    filter: "passthrough".into(),
                    name,
                    ranks: d.ranks,
                    ..CreateStreamRequest::default()
                };
                let info = self.open(req).await?;
                return Ok(Response::new(ControlResponse {
                    applied: "detail".into(),
                    stream_id: info.stream_id,
                }));
            }
            Some(control_request::Action::Options(o)) => {
                canopy_core::options::Measure::from_options(&o).map_err(Status::invalid_argument)?;
                if !self.root.options(o).await {
                    return Err(Status::unavailable("the front-end is shutting down"));
                }
                return Ok(Response::new(ControlResponse {
                    stream_id: 0,
                    applied: "options".into(),
                }));
            }
            _ => {
                return Err(Status::invalid_argument(
                    "give an action: start, stop, options or detail",
                ));
            }
        };
        if !self.root.collection(c).await {
            return Err(Status::unavailable("the front-end is shutting down"));
        }
        Ok(Response::new(ControlResponse {
            applied: word.into(),
            stream_id: 0,
        }))
    }

    async fn topology(&self, _: Request<TopologyRequest>) -> Result<Response<TopologyResponse>, Status> {
        let mut nodes = read(self.store.clone(), |conn| {
            let mut st = conn.prepare(
                "SELECT node_id, COALESCE(kind, ''), COALESCE(address, ''), COALESCE(parent, ''),
                        COALESCE(ranks_below, 0), COALESCE(state, ''), COALESCE(detail, '')
                 FROM nodes ORDER BY node_id",
            )?;
            st.query_map([], |r| {
                Ok(TopologyNode {
                    node_id: r.get(0)?,
                    kind: word_kind(&r.get::<_, String>(1)?) as i32,
                    address: r.get(2)?,
                    parent_id: r.get(3)?,
                    ranks_below: r.get(4)?,
                    state: word_state(&r.get::<_, String>(5)?) as i32,
                    detail: r.get(6)?,
                    ..TopologyNode::default()
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .await?;
        let status = self.shared.status.lock().expect("status").clone();
        let mut children: HashMap<String, Vec<String>> = HashMap::new();
        for n in &nodes {
            if !n.parent_id.is_empty() {
                children
                    .entry(n.parent_id.clone())
                    .or_default()
                    .push(n.node_id.clone());
            }
        }
        for n in &mut nodes {
            n.children = children.remove(&n.node_id).unwrap_or_default();
            if let Some(s) = status.get(&n.node_id) {
                n.rounds_closed = s.rounds_closed;
                n.rounds_partial = s.rounds_partial;
                n.late_arrivals = s.late_arrivals;
                n.malformed = s.malformed;
                n.bytes_in = s.bytes_in;
                n.bytes_out = s.bytes_out;
                n.lag_rounds = s.lag_rounds;
                n.filter_time = s.filter_time.clone();
                n.streams_failed = s.streams_failed;
                n.rank_dumps_dropped = s.rank_dumps_dropped;
            }
        }
        Ok(Response::new(TopologyResponse { nodes }))
    }

    async fn event_names(
        &self,
        _: Request<EventNamesRequest>,
    ) -> Result<Response<EventNamesResponse>, Status> {
        let names = read(self.store.clone(), |conn| {
            let mut st = conn.prepare("SELECT id, name FROM names ORDER BY name")?;
            st.query_map([], |r| {
                Ok(EventName {
                    id: r.get::<_, i64>(0)? as u64,
                    name: r.get(1)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .await?;
        Ok(Response::new(EventNamesResponse { names }))
    }
}
