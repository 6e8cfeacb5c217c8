//! The root's way up and its sink: every message and finalized round the root hands up goes to the store's writer
//! thread, in order; what the API serves live (node status, names, result types) is noted on the way.

use std::sync::Arc;

use canopy_core::node::{Recount, RootSink, RoundResult, Up};
use canopy_proto::v1::up_message;
use canopy_store::{RoundRecord, Writer};
use futures::future::BoxFuture;

use crate::app_metrics::AppMetrics;
use crate::state::State;
use canopy_core::node::StreamState;
use canopy_proto::v1::StreamSpec;

/// A finalized result on its way through the store to live subscribers: stored from its payload, then passed
/// on whole once committed.
pub(crate) struct Committed(pub(crate) Arc<RoundResult>);

impl AsRef<[u8]> for Committed {
    fn as_ref(&self) -> &[u8] {
        &self.0.payload
    }
}

/// The root's way up and its sink: everything goes to the store's writer thread, in order.
#[derive(Clone)]
pub(crate) struct StoreUp {
    pub(crate) writer: Writer<Committed>,
    /// Tells what each stream's results are, so standard results become tables.
    pub(crate) filters: Arc<canopy_core::plugin::PluginFilters>,
    /// What the API serves live: results, node status, result types.
    pub(crate) shared: Arc<State>,
    /// The application's series on the metrics endpoint: a stream that ends takes its own with it.
    pub(crate) app_metrics: Arc<AppMetrics>,
}

impl Up for StoreUp {
    async fn send(&mut self, msg: up_message::Msg) {
        match msg {
            up_message::Msg::Names(d) => {
                let names: Vec<(u64, String)> = d.names.into_iter().map(|n| (n.id, n.name)).collect();
                self.shared.add_names(&names);
                self.writer.names(names).await;
            }
            up_message::Msg::NodeEvent(ev) => self.writer.node(ev).await,
            up_message::Msg::Fin(f) => self.writer.meta("rounds_end", f.rounds_end.to_string()).await,
            up_message::Msg::Status(st) => {
                tracing::debug!(node = %st.node_id, closed = st.rounds_closed, partial = st.rounds_partial,
                    late = st.late_arrivals, malformed = st.malformed, "node status");
                self.shared.set_status(st);
            }
            up_message::Msg::StreamError(e) => {
                tracing::error!(stream = e.stream_id, node = %e.node_id, "stream error: {}", e.reason);
            }
            // The root has no parent to ask for rounds (it never sends a Want) and sets a stream's first round
            // itself (it never passes a StreamReady on).
            up_message::Msg::Envelope(_)
            | up_message::Msg::Hello(_)
            | up_message::Msg::Want(_)
            | up_message::Msg::StreamReady(_) => {}
        }
    }
}

impl RootSink for StoreUp {
    fn result(&mut self, result: RoundResult) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let record = RoundRecord::of(
                result.stream.stream_id,
                &result.stream.name,
                result.round,
                &result.coverage,
                result.first_dump_unix_ns,
            );
            let round = canopy_store::Round {
                record,
                phase: result.phase,
                late: result.late,
                result_type: self.shared.result_type(result.stream.stream_id),
                payload: Committed(Arc::new(result)),
            };
            self.writer.round(round).await;
        })
    }

    fn stream_state<'a>(
        &'a mut self,
        spec: &'a StreamSpec,
        state: StreamState,
        failure: Option<&'a str>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // The stream's result type is known from its filter once it opens; the API and the store take it
            // here.
            let result_type = match state {
                canopy_store::StreamState::Open => {
                    self.filters.info(&spec.filter).ok().map(|info| info.result_type)
                }
                _ => None,
            };
            if let Some(t) = &result_type {
                self.shared.set_result_type(spec.stream_id, t.clone());
            }
            if state.is_ended() {
                self.app_metrics.forget(spec.stream_id);
            }
            let failure = failure.map(str::to_string);
            self.writer
                .stream(spec.clone(), state, failure, result_type)
                .await;
        })
    }

    fn recount(&mut self, r: Recount) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.writer
                .recount_stopped(r.stream, r.round, r.counted, r.ranks, r.source, r.apps)
                .await;
        })
    }

    fn flush(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(summary) = self.writer.flush().await {
                tracing::info!(
                    rounds = summary.rounds,
                    full = summary.full_rounds,
                    late = summary.late_packets,
                    bytes = summary.result_bytes,
                    errors = summary.store_errors,
                    store_failed = summary.store_failed_rounds,
                    waiting = summary.backlog,
                    "store flushed"
                );
            }
        })
    }
}
