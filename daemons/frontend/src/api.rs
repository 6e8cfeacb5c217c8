//! `canopy.v1.Frontend`: the API users and scripts (grpcurl, the `canopy` command) use on the front-end's port.
//! Live results come from the root as it finalizes them; everything else is read from the run's store.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use canopy_core::filter::{FilterFactory, Level};
use canopy_core::node::{Collection, RootHandle};
use canopy_core::plugin::PluginFilters;
use canopy_proto::v1::frontend_server::Frontend;
use canopy_proto::v1::{
    CloseStreamRequest, ControlRequest, ControlResponse, CreateStreamRequest, EventName, EventNamesRequest,
    EventNamesResponse, ListStreamsRequest, ListStreamsResponse, RoundUpdate, StreamInfo, StreamSpec,
    SubscribeRequest, SyncMode, TopologyNode, TopologyRequest, TopologyResponse, control_request,
    subscribe_request,
};
use canopy_store::{StoreError, StoreReader, StreamRow, StreamState, Word};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::error::{ApiError, MAX_TIMEOUT_MS};
use crate::state::State;
use crate::subscription::{SentNames, Subscription, Wanted, stored_updates};

pub struct FrontendApi {
    pub root: RootHandle,
    pub shared: Arc<State>,
    pub filters: Arc<PluginFilters>,
    pub store: PathBuf,
    /// Learns the result types of filters loaded after start.
    pub reflection: Arc<dyn crate::reflection::Reflection>,
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<RoundUpdate, Status>> + Send>>;

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

/// Runs read-only queries on the store off the runtime's workers.
async fn read<T: Send + 'static>(
    store: PathBuf,
    f: impl FnOnce(&StoreReader) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let read = tokio::task::spawn_blocking(move || f(&StoreReader::open(&store)?)).await?;
    Ok(read?)
}

fn stream_info(s: StreamRow) -> StreamInfo {
    StreamInfo {
        stream_id: s.stream_id,
        name: s.name,
        filter: s.filter,
        params_json: s.params,
        sync_mode: s.sync_mode as i32,
        timeout_ms: s.timeout_ms,
        state: s.state.map(Word::word).unwrap_or_default().into(),
        failure: s.failure.unwrap_or_default(),
        result_type: s.result_type.unwrap_or_default(),
        rounds: s.rounds,
        full_rounds: s.full_rounds,
        late_packets: s.late_packets,
        ranks: s.ranks,
        next_round: s.last_round.map_or(0, |r| r + 1),
    }
}

impl FrontendApi {
    /// Checks a stream request and opens the stream on the tree.
    async fn open(&self, req: CreateStreamRequest) -> Result<StreamInfo, ApiError> {
        self.open_staged(req, Vec::new()).await
    }

    /// Opens a stream whose ranks change at the rounds `stages` say.
    async fn open_staged(
        &self,
        mut req: CreateStreamRequest,
        stages: Vec<canopy_proto::v1::RankStage>,
    ) -> Result<StreamInfo, ApiError> {
        if let Some(params) = req.params.take() {
            if !req.params_json.is_empty() {
                return Err(ApiError::ParamsTwice);
            }
            req.params_json = json_of_struct(&params).to_string();
        }
        let info = self
            .filters
            .info(&req.filter)
            .map_err(|e| ApiError::UnknownFilter(e.to_string()))?;
        // Before the stream opens, so its first result is typed for reflection's clients.
        if let Err(e) = self.reflection.add_filter(&req.filter, &info.descriptors) {
            tracing::warn!(filter = %req.filter, "cannot register the filter's result types for reflection: {e}");
        }
        let timeout_ms = match req.timeout_ms {
            0 => 1000,
            t if t > MAX_TIMEOUT_MS => return Err(ApiError::TimeoutTooLong(t)),
            t => t,
        };
        let sync = match SyncMode::try_from(req.sync_mode) {
            Ok(SyncMode::Unspecified) | Ok(SyncMode::WaitForAll) => SyncMode::WaitForAll,
            Ok(SyncMode::DontWait) if info.phases > 1 => {
                return Err(ApiError::MultiPhaseDontWait {
                    filter: req.filter,
                    phases: info.phases,
                });
            }
            Ok(SyncMode::DontWait) => SyncMode::DontWait,
            Err(_) => return Err(ApiError::UnknownSyncMode(req.sync_mode)),
        };
        // The parameters are checked by the filter itself, as the root will create it.
        self.filters
            .create(&req.filter, &req.params_json, Level::Root)
            .map_err(|e| ApiError::BadParams(e.to_string()))?;
        let name = if req.name.is_empty() {
            req.filter.clone()
        } else {
            req.name.clone()
        };
        canopy_core::ranks::RankSet::parse(&req.ranks).map_err(ApiError::BadRanks)?;
        let spec = StreamSpec {
            stream_id: 0,
            name: name.clone(),
            filter: req.filter.clone(),
            params: req.params_json.clone(),
            sync_mode: sync as i32,
            timeout_ms,
            ranks: req.ranks.clone(),
            stages,
            // The root sets it.
            first_round: None,
        };
        let id = self.root.open_stream_id(spec).await;
        if id == 0 {
            return Err(ApiError::ShuttingDown);
        }
        if self.shared.stream_filter(id, &req.filter, true)
            && !self.root.options(self.shared.effective_options()).await
        {
            return Err(ApiError::ShuttingDown);
        }
        Ok(StreamInfo {
            stream_id: id,
            name,
            filter: req.filter,
            params_json: req.params_json,
            sync_mode: sync as i32,
            timeout_ms,
            state: StreamState::Open.word().into(),
            result_type: info.result_type,
            ranks: req.ranks,
            ..StreamInfo::default()
        })
    }

    async fn subscribe_updates(&self, req: SubscribeRequest) -> Result<UpdateStream, ApiError> {
        let wanted = Wanted {
            ids: req.stream_ids.iter().copied().collect(),
            names: req.stream_names.iter().cloned().collect(),
            from: match req.start {
                Some(subscribe_request::Start::FromRound(r)) => Some(r),
                Some(subscribe_request::Start::Replay(true)) => Some(0),
                _ => None,
            },
        };
        // Subscribe before reading the store, so nothing stored in between is missed; duplicates are skipped.
        let live = self.shared.live.subscribe();
        let (stored, dont_wait) = match wanted.from {
            Some(from) => {
                let w = wanted.clone();
                read(self.store.clone(), move |r| stored_updates(r, &w, from)).await?
            }
            None => (Vec::new(), HashSet::new()),
        };
        // A round stored whole (wait-for-all) and also arriving live is sent once; don't-wait pieces are each
        // their own update.
        let seen = stored
            .iter()
            .filter(|u| !dont_wait.contains(&u.stream_id))
            .map(|u| (u.stream_id, u.round))
            .collect();
        // With names: those the store holds (an earlier front-end of a continued run heard some), then the root's.
        let names = match req.with_names {
            true => Some(SentNames::new(read(self.store.clone(), |r| r.names()).await?)),
            false => None,
        };
        let subscription = Subscription {
            wanted,
            seen,
            names,
            shared: self.shared.clone(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RoundUpdate, Status>>(16);
        tokio::spawn(subscription.run(stored, live, self.shared.ended(), tx));
        // Counted while the server holds the stream: at the end of the run the front-end waits for it.
        let open = self.shared.open_subscription();
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Box::pin(tokio_stream::StreamExt::map(stream, move |u| {
            let _ = &open;
            u
        })))
    }

    async fn close(&self, id: u32) -> Result<StreamInfo, ApiError> {
        // The root decides: the store may not have caught up with a stream opened a moment ago.
        let closed = self.root.close_stream_checked(id).await;
        let was_detail = self.shared.end_detail(id);
        let modules_change = self.shared.stream_filter(id, "", false);
        if closed == Some(true)
            && (was_detail || modules_change)
            && !self.root.options(self.shared.effective_options()).await
        {
            return Err(ApiError::ShuttingDown);
        }
        let known = read(self.store.clone(), move |r| r.stream(id)).await?;
        match (closed, known) {
            (None, _) => Err(ApiError::ShuttingDown),
            (Some(true), known) => {
                let mut info = known.map(stream_info).unwrap_or(StreamInfo {
                    stream_id: id,
                    ..StreamInfo::default()
                });
                info.state = StreamState::Closed.word().into();
                Ok(info)
            }
            (Some(false), Some(known)) => Err(ApiError::StreamEnded {
                id,
                state: stream_info(known).state,
            }),
            (Some(false), None) => Err(ApiError::NoStream(id)),
        }
    }

    async fn control_tree(
        &self,
        action: Option<control_request::Action>,
    ) -> Result<ControlResponse, ApiError> {
        let (c, word) = match action {
            Some(control_request::Action::Start(true)) => (Collection::Start, "start"),
            Some(control_request::Action::Stop(true)) => (Collection::Stop, "stop"),
            Some(control_request::Action::Detail(d)) if d.auto => return self.auto_detail(d).await,
            Some(control_request::Action::Detail(d)) => {
                let chosen = canopy_core::ranks::RankSet::parse(&d.ranks).map_err(ApiError::BadRanks)?;
                if chosen.is_all() {
                    return Err(ApiError::DetailWithoutRanks);
                }
                let chosen_text = d.ranks.clone();
                let info = self.open(detail_stream(d.name, d.ranks)).await?;
                self.shared.set_detail_ranks(info.stream_id, &chosen_text);
                if !self.root.options(self.shared.effective_options()).await {
                    return Err(ApiError::ShuttingDown);
                }
                return Ok(ControlResponse {
                    applied: "detail".into(),
                    stream_id: info.stream_id,
                });
            }
            Some(control_request::Action::Window(w)) => {
                self.root
                    .window(w.from_round, w.to_round)
                    .await
                    .ok_or(ApiError::ShuttingDown)?
                    .map_err(ApiError::Window)?;
                return Ok(ControlResponse {
                    applied: format!("window: rounds {} to {}", w.from_round, w.to_round),
                    stream_id: 0,
                });
            }
            Some(control_request::Action::Options(o)) => {
                canopy_core::options::Measure::from_options(&o).map_err(ApiError::BadOptions)?;
                if !self.root.options(self.shared.set_options(o)).await {
                    return Err(ApiError::ShuttingDown);
                }
                return Ok(ControlResponse {
                    stream_id: 0,
                    applied: "options".into(),
                });
            }
            Some(control_request::Action::AppOptions(a)) => {
                let alone = canopy_proto::v1::Options {
                    apps: vec![a.clone()],
                    ..Default::default()
                };
                canopy_core::options::Measure::from_options(&alone).map_err(ApiError::BadOptions)?;
                let applied = format!("options of application {:?}", a.app);
                if !self.root.options(self.shared.set_app_options(a)).await {
                    return Err(ApiError::ShuttingDown);
                }
                return Ok(ControlResponse {
                    stream_id: 0,
                    applied,
                });
            }
            _ => return Err(ApiError::NoAction),
        };
        if !self.root.collection(c).await {
            return Err(ApiError::ShuttingDown);
        }
        Ok(ControlResponse {
            applied: word.into(),
            stream_id: 0,
        })
    }

    /// A detail stream fed by the ranks that matter: it starts with no rank, and `auto_detail::spawn` moves it
    /// as the outliers and clusters streams' results come.
    async fn auto_detail(&self, d: canopy_proto::v1::DetailRequest) -> Result<ControlResponse, ApiError> {
        if !d.ranks.trim().is_empty() {
            return Err(ApiError::AutoDetailWithRanks);
        }
        let streams = read(self.store.clone(), |r| r.streams()).await?;
        let open = |name: &str, filter: &str| {
            streams.iter().find(|s| {
                s.state == Some(StreamState::Open)
                    && s.filter == filter
                    && (name.is_empty() || s.name == name)
            })
        };
        let source = async |name: &str, filter: &str, params: &str| -> Result<u32, ApiError> {
            if let Some(s) = open(name, filter) {
                return Ok(s.stream_id);
            }
            if !name.is_empty() {
                return Err(ApiError::NoSourceStream {
                    name: name.to_string(),
                    filter: filter.to_string(),
                });
            }
            let req = CreateStreamRequest {
                filter: filter.into(),
                params_json: params.into(),
                ..CreateStreamRequest::default()
            };
            Ok(self.open(req).await?.stream_id)
        };
        // The detail follows the ranks that cost time, over every rank's events alike (seed 002's unweighted
        // score): a rank whose call counts differ from round to round (polling, idle loops) is not taken for one,
        // and a rank slow in an event only its functional group runs still counts when the groups' mixes differ.
        let outliers = source(
            &d.outliers,
            "outliers",
            r#"{"fraction": 0.1, "metric": "exclusive", "weighted": false}"#,
        )
        .await?;
        let clusters = source(&d.clusters, "kmeans", r#"{"k": 3}"#).await?;
        let req = detail_stream(d.name, String::new());
        // No rank feeds it until the sources have chosen.
        let none = canopy_proto::v1::RankStage {
            from_round: 0,
            ranks: String::new(),
        };
        let info = self.open_staged(req, vec![none]).await?;
        crate::auto_detail::spawn(
            self.shared.clone(),
            self.root.clone(),
            info.stream_id,
            crate::auto_detail::Sources {
                outliers: Some(outliers),
                clusters: Some(clusters),
            },
        );
        Ok(ControlResponse {
            applied: format!(
                "detail (automatic: outliers from stream {outliers}, representatives from stream {clusters})"
            ),
            stream_id: info.stream_id,
        })
    }

    async fn topology_nodes(&self) -> Result<Vec<TopologyNode>, ApiError> {
        let stored = read(self.store.clone(), |r| r.nodes()).await?;
        let mut nodes: Vec<TopologyNode> = stored
            .into_iter()
            .map(|n| TopologyNode {
                node_id: n.node_id,
                kind: n.kind as i32,
                address: n.address.unwrap_or_default(),
                parent_id: n.parent.unwrap_or_default(),
                ranks_below: n.ranks_below,
                state: n.state as i32,
                detail: n.detail.unwrap_or_default(),
                ..TopologyNode::default()
            })
            .collect();
        let status = self.shared.statuses();
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
        Ok(nodes)
    }
}

/// The passthrough stream of a detail request (named "detail" unless the request names it).
fn detail_stream(name: String, ranks: String) -> CreateStreamRequest {
    CreateStreamRequest {
        filter: "passthrough".into(),
        name: if name.is_empty() { "detail".into() } else { name },
        ranks,
        ..CreateStreamRequest::default()
    }
}

/// Each call maps its error to a status in one place: `From<ApiError> for Status`.
#[tonic::async_trait]
impl Frontend for FrontendApi {
    type SubscribeStream = UpdateStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        Ok(Response::new(self.subscribe_updates(request.into_inner()).await?))
    }

    async fn create_stream(
        &self,
        request: Request<CreateStreamRequest>,
    ) -> Result<Response<StreamInfo>, Status> {
        Ok(Response::new(self.open(request.into_inner()).await?))
    }

    async fn close_stream(
        &self,
        request: Request<CloseStreamRequest>,
    ) -> Result<Response<StreamInfo>, Status> {
        Ok(Response::new(self.close(request.into_inner().stream_id).await?))
    }

    async fn list_streams(
        &self,
        _: Request<ListStreamsRequest>,
    ) -> Result<Response<ListStreamsResponse>, Status> {
        let streams = read(self.store.clone(), |r| r.streams()).await?;
        Ok(Response::new(ListStreamsResponse {
            streams: streams.into_iter().map(stream_info).collect(),
        }))
    }

    async fn control(&self, request: Request<ControlRequest>) -> Result<Response<ControlResponse>, Status> {
        Ok(Response::new(
            self.control_tree(request.into_inner().action).await?,
        ))
    }

    async fn topology(&self, _: Request<TopologyRequest>) -> Result<Response<TopologyResponse>, Status> {
        let started = read(self.store.clone(), |r| r.meta("started_unix_ns")).await?;
        Ok(Response::new(TopologyResponse {
            nodes: self.topology_nodes().await?,
            run_started_unix_ns: started.and_then(|s| s.parse().ok()).unwrap_or(0),
            store_path: self.store.display().to_string(),
        }))
    }

    async fn select_metrics(
        &self,
        request: Request<canopy_proto::v1::SelectMetricsRequest>,
    ) -> Result<Response<canopy_proto::v1::SelectMetricsResponse>, Status> {
        let req = request.into_inner();
        let apply = req.apply;
        let mut response = read(self.store.clone(), move |r| {
            Ok(crate::selection::training(r, &req).and_then(|t| crate::selection::select(&t)))
        })
        .await??;
        if apply {
            response.applied = crate::selection::narrowed(&response.ranking);
            crate::selection::apply(&self.shared, &self.root, &response.applied).await?;
            tracing::info!(
                chosen = %crate::selection::chosen_labels(&response),
                "metric selection applied on request"
            );
        }
        Ok(Response::new(response))
    }

    async fn event_names(
        &self,
        _: Request<EventNamesRequest>,
    ) -> Result<Response<EventNamesResponse>, Status> {
        let names = read(self.store.clone(), |r| r.names()).await?;
        Ok(Response::new(EventNamesResponse {
            names: names
                .into_iter()
                .map(|(id, name)| EventName { id, name })
                .collect(),
        }))
    }
}
