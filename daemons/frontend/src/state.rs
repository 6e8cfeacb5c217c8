//! What the front-end's parts share while the run goes on: the root's live results, the nodes' last status, the
//! streams' result types, the measurement options in force and the names heard of. The API serves it; the store's
//! side of the root, the automatic detail stream and the selection triggers change it. The values sit behind one
//! lock, held only to read or replace them; the channels (live results, the run's end, the subscriptions open)
//! beside it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use canopy_core::node::RoundResult;
use canopy_proto::v1::{AppOptions, EventName, NodeStatus, Options};
use tokio::sync::{broadcast, watch};

/// The filter whose streams need the utilization module in force.
pub const UTILIZATION_FILTER: &str = "utilization";

/// The front-end's shared state.
pub struct State {
    /// Every result as the root finalizes it; a subscriber that falls behind misses the oldest and is told.
    pub live: broadcast::Sender<Arc<RoundResult>>,
    /// The run has ended: every result is out, and each subscription ends (with OK) once it has sent them.
    ended: watch::Sender<bool>,
    /// The subscriptions whose stream the server still holds (not yet sent whole, the client still there).
    subscriptions: watch::Sender<usize>,
    values: Mutex<Values>,
}

#[derive(Default)]
struct Values {
    /// The last status each node reported.
    status: HashMap<String, NodeStatus>,
    /// Each stream's result type (the Any's type, and how the store keeps it): the front-end's one record of
    /// it, set when the stream opens. The store's `streams.result_type` is written from it.
    result_types: HashMap<u32, String>,
    options: InForce,
    /// Every event and counter name the root has heard of, in the order they came (each id once), for the
    /// subscriptions that ask for names: each keeps how far it has read.
    names: Vec<EventName>,
    name_ids: HashSet<u64>,
}

/// The measurement options in force, from which the options sent down are made.
#[derive(Debug, Default)]
struct InForce {
    /// The global options last set (their `apps` moved into `apps`).
    global: Options,
    /// Each application's own options, as last set for it.
    apps: BTreeMap<String, AppOptions>,
    /// The open detail streams' ranks, which the options sent down add to `trace_ranks` (the ranks a detail
    /// stream watches ship their event trace).
    detail: BTreeMap<u32, String>,
    /// The measurement modules of the front-end's configuration: options that name none run these.
    default_modules: Vec<String>,
    /// The front-end's `time_rounds` key: options that leave `time_rounds` unset take it.
    default_time_rounds: bool,
    /// The open streams of the utilization filter: while there is one, every rank runs the utilization module
    /// (and its rounds are time rounds).
    utilization_streams: BTreeSet<u32>,
}

impl InForce {
    /// Replaces one application's options; one that sets nothing returns the application to the global ones.
    fn set_app(&mut self, a: AppOptions) {
        let sets_nothing =
            a.include.is_empty() && a.exclude.is_empty() && a.metrics.is_empty() && a.sample_below.is_none();
        if sets_nothing {
            self.apps.remove(&a.app);
        } else {
            self.apps.insert(a.app.clone(), a);
        }
    }

    /// The options to send down: the global ones last set with every application's own, the detail streams'
    /// ranks added to `trace_ranks`, and the utilization module added to the modules while a utilization stream
    /// is open.
    fn effective(&self) -> Options {
        let mut o = self.global.clone();
        o.apps = self.apps.values().cloned().collect();
        if o.modules.is_empty() {
            o.modules = self.default_modules.clone();
        }
        if !self.utilization_streams.is_empty() && !o.modules.iter().any(|m| m == UTILIZATION_FILTER) {
            if o.modules.is_empty() {
                o.modules.push("profile".into());
            }
            o.modules.push(UTILIZATION_FILTER.into());
        }
        let ranks: Vec<&str> = std::iter::once(self.global.trace_ranks.as_str())
            .chain(self.detail.values().map(String::as_str))
            .filter(|r| !r.trim().is_empty())
            .collect();
        o.trace_ranks = ranks.join(",");
        // Always said: a rank must not keep an earlier choice. The utilization module's rounds are time rounds.
        let time_rounds = o.time_rounds.unwrap_or(self.default_time_rounds);
        o.time_rounds = Some(time_rounds || o.modules.iter().any(|m| m == UTILIZATION_FILTER));
        o
    }
}

impl State {
    pub fn new(buffer: usize) -> Arc<State> {
        let (live, _) = broadcast::channel(buffer.max(1));
        Arc::new(State {
            live,
            ended: watch::Sender::new(false),
            subscriptions: watch::Sender::new(0),
            values: Mutex::default(),
        })
    }

    fn values(&self) -> MutexGuard<'_, Values> {
        self.values.lock().expect("front-end state")
    }

    /// Records a node's status as it last reported it.
    pub fn set_status(&self, status: NodeStatus) {
        self.values().status.insert(status.node_id.clone(), status);
    }

    /// Every node's last status, by node id.
    pub fn statuses(&self) -> HashMap<String, NodeStatus> {
        self.values().status.clone()
    }

    /// Records names the root heard of; an id already known keeps its first name (as the store does).
    pub fn add_names(&self, names: &[(u64, String)]) {
        let mut v = self.values();
        let Values {
            names: list,
            name_ids,
            ..
        } = &mut *v;
        for (id, name) in names {
            if name_ids.insert(*id) {
                list.push(EventName {
                    id: *id,
                    name: name.clone(),
                });
            }
        }
    }

    /// Every name recorded, by id.
    pub fn names_map(&self) -> HashMap<u64, String> {
        self.values()
            .names
            .iter()
            .map(|n| (n.id, n.name.clone()))
            .collect()
    }

    /// The names recorded from `*next` on, moving `*next` past them.
    pub fn names_since(&self, next: &mut usize) -> Vec<EventName> {
        let v = self.values();
        let new = v.names.get(*next..).unwrap_or_default().to_vec();
        *next = v.names.len();
        new
    }

    /// The modules every rank runs when the options in force name none (the front-end's `modules` key).
    pub fn set_default_modules(&self, modules: Vec<String>) {
        self.values().options.default_modules = modules;
    }

    /// Whether the rounds are time rounds when the options in force leave `time_rounds` unset (the front-end's
    /// `time_rounds` key).
    pub fn set_default_time_rounds(&self, on: bool) {
        self.values().options.default_time_rounds = on;
    }

    /// The ranks a detail stream watches now: their event traces ship with their profiles.
    pub fn set_detail_ranks(&self, stream: u32, ranks: &str) {
        self.values().options.detail.insert(stream, ranks.to_string());
    }

    /// A detail stream closed: its ranks no longer ship their traces. True if it was one.
    pub fn end_detail(&self, stream: u32) -> bool {
        self.values().options.detail.remove(&stream).is_some()
    }

    /// Replaces the global options; the applications' own options stay in force, but for those `o.apps` names,
    /// which it replaces. Returns the options to send down.
    pub fn set_options(&self, mut o: Options) -> Options {
        let mut v = self.values();
        for a in std::mem::take(&mut o.apps) {
            v.options.set_app(a);
        }
        v.options.global = o;
        v.options.effective()
    }

    /// Replaces one application's options, leaving the global ones and the other applications' in force; returns
    /// the options to send down.
    pub fn set_app_options(&self, a: AppOptions) -> Options {
        let mut v = self.values();
        v.options.set_app(a);
        v.options.effective()
    }

    /// Notes that a stream opened (`open`) or closed; true if it changes the modules the ranks must run.
    pub fn stream_filter(&self, stream_id: u32, filter: &str, open: bool) -> bool {
        let streams = &mut self.values().options.utilization_streams;
        let before = streams.is_empty();
        if open && filter == UTILIZATION_FILTER {
            streams.insert(stream_id);
        } else if !open {
            streams.remove(&stream_id);
        }
        before != streams.is_empty()
    }

    /// The options to send down (see [`InForce::effective`]).
    pub fn effective_options(&self) -> Options {
        self.values().options.effective()
    }

    /// The result type of a stream's results; empty if the stream never opened.
    pub fn result_type(&self, stream_id: u32) -> String {
        self.values()
            .result_types
            .get(&stream_id)
            .cloned()
            .unwrap_or_default()
    }

    pub fn set_result_type(&self, stream_id: u32, result_type: String) {
        self.values().result_types.insert(stream_id, result_type);
    }

    /// The run ended (the tree finished or drained): subscriptions end once they have sent what they hold.
    pub fn end(&self) {
        self.ended.send_replace(true);
    }

    /// Changes to true when the run ends.
    pub fn ended(&self) -> watch::Receiver<bool> {
        self.ended.subscribe()
    }

    /// Counts a subscription as open until the guard is dropped (with the stream the server holds).
    pub fn open_subscription(&self) -> OpenSubscription {
        self.subscriptions.send_modify(|n| *n += 1);
        OpenSubscription(self.subscriptions.clone())
    }

    /// Waits until the server holds no subscription's stream (each sent whole, or its client gone), or
    /// `deadline` passes.
    pub async fn subscriptions_sent(&self, deadline: tokio::time::Instant) {
        let mut open = self.subscriptions.subscribe();
        let _ = tokio::time::timeout_at(deadline, open.wait_for(|n| *n == 0)).await;
    }
}

/// One subscription in [`State`]'s count, from its start until the server drops its stream.
pub struct OpenSubscription(watch::Sender<usize>);

impl Drop for OpenSubscription {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(name: &str, sample_below: Option<u32>, include: &[&str]) -> AppOptions {
        AppOptions {
            app: name.into(),
            sample_below,
            include: include.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_application_s_options_replace_its_own_alone_and_the_global_ones_leave_them_in_force() {
        let shared = State::new(1);
        let sent = shared.set_app_options(app("analysis", Some(0), &[]));
        assert_eq!(sent.apps, vec![app("analysis", Some(0), &[])]);
        let sent = shared.set_app_options(app("sim", None, &["^MPI_"]));
        assert_eq!(
            sent.apps,
            vec![app("analysis", Some(0), &[]), app("sim", None, &["^MPI_"])]
        );
        // Setting an application again replaces its options whole; the other's stay.
        let sent = shared.set_app_options(app("sim", Some(4), &[]));
        assert_eq!(
            sent.apps,
            vec![app("analysis", Some(0), &[]), app("sim", Some(4), &[])]
        );
        // The global options replace the global ones only.
        let sent = shared.set_options(Options {
            exclude: vec!["^io_".into()],
            ..Default::default()
        });
        assert_eq!(sent.exclude, vec!["^io_".to_string()]);
        assert_eq!(sent.apps.len(), 2);
        // An entry the global options carry replaces its application's; one that sets nothing clears it.
        let sent = shared.set_options(Options {
            apps: vec![app("analysis", None, &[]), app("viz", Some(1), &[])],
            ..Default::default()
        });
        assert!(sent.exclude.is_empty());
        assert_eq!(
            sent.apps,
            vec![app("sim", Some(4), &[]), app("viz", Some(1), &[])]
        );
        let sent = shared.set_app_options(app("sim", None, &[]));
        assert_eq!(sent.apps, vec![app("viz", Some(1), &[])]);
        assert!(canopy_core::options::Measure::from_options(&sent).is_ok());
    }

    #[test]
    fn time_rounds_are_always_sent_taken_from_the_default_when_unset_and_kept_under_utilization() {
        let shared = State::new(1);
        assert_eq!(shared.effective_options().time_rounds, Some(false));
        shared.set_default_time_rounds(true);
        assert_eq!(shared.effective_options().time_rounds, Some(true));
        // Set through the API, the options' own choice wins over the default.
        let sent = shared.set_options(Options {
            time_rounds: Some(false),
            ..Default::default()
        });
        assert_eq!(sent.time_rounds, Some(false));
        // A utilization stream's module makes the rounds time rounds whatever the options say: what is sent
        // down is always options the ranks accept.
        assert!(shared.stream_filter(7, UTILIZATION_FILTER, true));
        let sent = shared.effective_options();
        assert_eq!(sent.time_rounds, Some(true));
        assert!(canopy_core::options::Measure::from_options(&sent).is_ok());
        assert!(shared.stream_filter(7, UTILIZATION_FILTER, false));
        assert_eq!(shared.effective_options().time_rounds, Some(false));
    }

    #[test]
    fn a_utilization_stream_adds_its_module_and_time_rounds_while_it_is_open() {
        let state = State::new(1);
        assert!(state.stream_filter(3, UTILIZATION_FILTER, true));
        assert!(!state.stream_filter(4, "stats", true));
        let o = state.effective_options();
        assert_eq!(o.modules, ["profile", UTILIZATION_FILTER]);
        assert_eq!(o.time_rounds, Some(true));
        assert!(state.stream_filter(3, "", false));
        let o = state.effective_options();
        assert!(o.modules.is_empty());
        assert_eq!(o.time_rounds, Some(false));
    }

    #[test]
    fn detail_ranks_join_the_traced_ranks_and_names_are_kept_once_in_order() {
        let state = State::new(1);
        state.set_options(Options {
            trace_ranks: "0".into(),
            ..Options::default()
        });
        state.set_detail_ranks(7, "3,5");
        assert_eq!(state.effective_options().trace_ranks, "0,3,5");
        state.add_names(&[(1, "a".into()), (2, "b".into())]);
        state.add_names(&[(1, "again".into()), (3, "c".into())]);
        let mut next = 1;
        let names: Vec<String> = state.names_since(&mut next).into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(next, 3);
        assert_eq!(state.names_map()[&1], "a");
    }

    #[tokio::test]
    async fn the_end_waits_for_open_subscriptions_only() {
        let state = State::new(1);
        let open = state.open_subscription();
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(50);
        state.subscriptions_sent(soon).await;
        assert_eq!(*state.subscriptions.borrow(), 1);
        drop(open);
        state
            .subscriptions_sent(tokio::time::Instant::now() + std::time::Duration::from_secs(5))
            .await;
        assert_eq!(*state.subscriptions.borrow(), 0);
    }
}
