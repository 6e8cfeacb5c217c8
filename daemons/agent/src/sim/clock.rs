//! The simulated ranks on the tree's clock: round `first_round + k` is dumped at `start + k * period`, so an
//! agent that starts late (or again) joins at the tree's current round. Each simulated rank is a rank source, as a
//! rank on the socket is: it attaches, dumps each round (or is sampled out), and detaches when it finishes.

use std::collections::HashSet;
use std::time::Duration;

use canopy_core::node::{Input, RankEvent, rank_source, unix_ns};
use canopy_core::options::Measure;
use canopy_core::window::WindowGate;
use canopy_proto::v1::{MissingReason, control};
use tokio::sync::mpsc;

use super::timer::WallTimer;
use super::{Selection, Simulator, TimeWindow};

/// When the simulated ranks dump, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub period: Duration,
    /// Rounds to simulate before the ranks finish (0: until drained).
    pub rounds: u64,
}

/// The simulated ranks as rank sources of the leaf.
pub struct SimulatedRanks {
    pub sim: Simulator,
    pub schedule: Schedule,
    pub control: mpsc::UnboundedReceiver<control::Action>,
    pub inputs: mpsc::Sender<Input>,
    pub window: WindowGate,
}

impl SimulatedRanks {
    /// Attaches every simulated rank and tells the leaf their names; they dump once collection starts.
    pub async fn attach(&self) -> bool {
        let mut events = vec![RankEvent::Names(self.sim.names())];
        events.extend(self.sim.ranks().map(|rank| RankEvent::Attached {
            source: rank_source(self.sim.app(), rank),
            from: 0,
            announced: 0,
        }));
        self.inputs.send(Input::Ranks(events)).await.is_ok()
    }

    /// Runs the ranks' clock until they finish (their rounds are done, or a drain), or the node ends.
    pub async fn run(mut self) {
        if !self.attach().await {
            return;
        }
        let mut period_ns = self.schedule.period.as_nanos() as u64;
        let mut anchor: Option<(u64, u64)> = None;
        let mut next_round = 0u64;
        // The rounds dumped so far end here: what a rank finishing now has delivered.
        let mut dumped_end = 0u64;
        // The window of rounds in force (canopy ctl window): rounds outside it are neither measured nor reported.
        let mut window_of_rounds: Option<(u64, u64)> = None;
        // The Start the ranks run on (its start and first round), until a Stop: the same Start heard again is
        // not a new one.
        let mut started: Option<(u64, u64)> = None;
        let names = self.sim.names();
        // Each rank's source id, made once: every dump names its rank's.
        let sources: Vec<String> = self
            .sim
            .ranks()
            .map(|rank| rank_source(self.sim.app(), rank))
            .collect();
        let mut options = Measure::default();
        let mut left = HashSet::new();
        // Time rounds (Options.time_rounds, or the utilization module): round k is a window of wall time.
        let mut time_rounds = false;
        let timer = WallTimer::new();
        loop {
            let wait = anchor.map(|(t0, first)| t0 + next_round.saturating_sub(first) * period_ns);
            let action = match wait {
                None => self.control.recv().await,
                // Control already queued (options that came with a Start) applies before a dump that is due.
                Some(due) => tokio::select! {
                    biased;
                    a = self.control.recv() => a,
                    _ = timer.sleep_until(due) => {
                        if window_of_rounds.is_some_and(|(from, to)| !(from..=to).contains(&next_round)) {
                            next_round += 1;
                            continue;
                        }
                        // Ranks the tree cannot keep up with fall behind their clock rather than run ahead of the
                        // window of rounds in flight.
                        // Round r is the window of wall time that ends when it is dumped.
                        let time = options.modules().iter().any(|m| m == "utilization").then(|| TimeWindow {
                            start_unix_ns: due.saturating_sub(period_ns),
                            period_ns,
                        });
                        // The round's step begins where its window does on the tree's clock, the same instant at every
                        // agent that heard the same Start.
                        let step = due.saturating_sub(period_ns);
                        if !self.window.admit(next_round).await || !self.dump(next_round, &options, &left, time, step, &sources).await {
                            return;
                        }
                        next_round += 1;
                        dumped_end = next_round;
                        if self.schedule.rounds > 0 && next_round >= self.schedule.rounds {
                            tracing::info!(rounds = next_round, "simulated ranks finished");
                            self.finish(next_round).await;
                            return;
                        }
                        continue;
                    }
                },
            };
            match action {
                Some(control::Action::Start(s)) if started == Some((s.start_unix_ns, s.first_round)) => {
                    // The Start these ranks run on, told again by a parent this node attached to since (an adopter
                    // after its parent was lost, or the parent back after a restart): every parent replays the
                    // collection in force to a child that attaches, marked as a rejoin. These ranks did not join
                    // late: they keep their count, and dump at once the rounds they fell behind on while their
                    // window waited for the parent (its credit was gone with it). Moved to the tree's current
                    // round, they would never dump those rounds: rank-rounds neither sent up nor kept for the
                    // adopter to ask for again, lost although no rank was.
                    window_of_rounds = None;
                }
                Some(control::Action::Start(s)) => {
                    // Round k is every rank's k-th dump: a node the Start reached late (a loaded machine) dumps the
                    // rounds it missed at once, so no round lacks its ranks; one that attached after the start (it
                    // joined late or restarted) begins at the tree's current round. In time rounds a round is a
                    // window, so every node begins at the window under way, as SDK ranks do.
                    next_round = if s.rejoin || time_rounds {
                        let since = unix_ns().saturating_sub(s.start_unix_ns);
                        next_round.max(s.first_round + since / period_ns)
                    } else {
                        next_round.max(s.first_round)
                    };
                    anchor = Some((s.start_unix_ns, s.first_round));
                    started = Some((s.start_unix_ns, s.first_round));
                    window_of_rounds = None;
                }
                Some(control::Action::Stop(_)) => {
                    anchor = None;
                    started = None;
                    window_of_rounds = None;
                }
                Some(control::Action::Window(w)) => window_of_rounds = Some((w.from_round, w.to_round)),
                Some(control::Action::Options(o)) => {
                    time_rounds = canopy_wire::options::time_rounds(&o);
                    // The simulated ranks are one application's: they run its options.
                    match Measure::from_options(&o).map(|m| m.for_app(self.sim.app())) {
                        Ok(m) => {
                            tracing::info!(?o, "measurement options changed");
                            left = left_out(&m, &names);
                            options = m;
                        }
                        Err(e) => tracing::error!("measurement options ignored: {e}"),
                    }
                    let period = o.period_ms.saturating_mul(1_000_000).max(1);
                    // The period in force told again (a new parent replays the options in force to a child that
                    // attaches) changes nothing: the ranks stay on the tree's clock and catch up on what they
                    // fell behind on.
                    if o.period_ms > 0 && period != period_ns {
                        period_ns = period;
                        if anchor.is_some() {
                            // The new period counts from now, from the next round on.
                            anchor = Some((unix_ns(), next_round));
                        }
                    }
                }
                Some(control::Action::Drain(_)) => {
                    tracing::info!(rounds = dumped_end, "drained: simulated ranks finished");
                    self.finish(dumped_end).await;
                    return;
                }
                Some(control::Action::FinAck(_)) | None => return,
            }
        }
    }

    /// Every rank's dump of `round`, as one input; false once the node has ended. `left_out` holds the ids the
    /// options leave out by name; `sources` each rank's source id, in the order of [`Simulator::ranks`].
    async fn dump(
        &mut self,
        round: u64,
        options: &Measure,
        left_out: &HashSet<u64>,
        utilization: Option<TimeWindow>,
        step_unix_ns: u64,
        sources: &[String],
    ) -> bool {
        let dump_unix_ns = unix_ns();
        let first = self.sim.ranks().start;
        let mut events = Vec::with_capacity(self.sim.ranks().len());
        {
            let selection = Selection {
                reported: &|id| !left_out.contains(&id),
                metrics: options.metrics(),
                sampled_out: &|rank| options.samples_out(rank),
                utilization,
                step_unix_ns,
            };
            self.sim
                .encode_round(round, dump_unix_ns, &selection, |rank, batch| {
                    events.push(RankEvent::Round {
                        source: sources[(rank - first) as usize].clone(),
                        rank,
                        round,
                        dump_unix_ns,
                        profile: batch.ok_or(MissingReason::SampledOut),
                    });
                });
        }
        self.inputs.send(Input::Ranks(events)).await.is_ok()
    }

    /// Every rank finished after its rounds below `end`.
    async fn finish(&self, end: u64) {
        let events = self
            .sim
            .ranks()
            .map(|rank| RankEvent::Detached {
                source: rank_source(self.sim.app(), rank),
                finished_end: Some(end),
            })
            .collect();
        let _ = self.inputs.send(Input::Ranks(events)).await;
    }
}

/// The ids of the names the options leave out.
fn left_out(options: &Measure, names: &[(u64, String)]) -> HashSet<u64> {
    if !options.selects_names() {
        return HashSet::new();
    }
    names
        .iter()
        .filter(|(_, name)| !options.reports(name))
        .map(|&(id, _)| id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Scenario, SimConfig};
    use canopy_core::window::{Window, WindowState};
    use canopy_proto::v1::Start;

    fn simulator(app: &str) -> Simulator {
        Simulator::new(SimConfig {
            scenario: Scenario::Flash,
            ranks: 2,
            events: 4,
            rank_offset: 0,
            total_ranks: 2,
            seed: 1,
            app: app.into(),
            plants: Vec::new(),
        })
    }

    /// The first round the simulated ranks dump after a Start stamped ten seconds ago, in time rounds or not.
    async fn first_round_after_a_late_start(rejoin: bool, time_rounds: bool) -> u64 {
        let sim = simulator("app");
        let (control_tx, control) = mpsc::unbounded_channel();
        let (inputs, mut node) = mpsc::channel(16);
        let (_window, gate) = Window::new(1 << 40);
        let ranks = SimulatedRanks {
            sim,
            schedule: Schedule {
                period: Duration::from_millis(1),
                rounds: 0,
            },
            control,
            inputs,
            window: gate,
        };
        let clock = tokio::spawn(ranks.run());
        let options = canopy_proto::v1::Options {
            time_rounds: Some(time_rounds),
            ..Default::default()
        };
        control_tx.send(control::Action::Options(options)).unwrap();
        let start = Start {
            start_unix_ns: unix_ns() - 10_000_000_000,
            first_round: 5,
            rejoin,
        };
        control_tx.send(control::Action::Start(start)).unwrap();
        let mut first = None;
        while first.is_none() {
            match node.recv().await {
                Some(Input::Ranks(events)) => {
                    first = events.iter().find_map(|e| match e {
                        RankEvent::Round { round, .. } => Some(*round),
                        _ => None,
                    })
                }
                Some(_) => {}
                None => panic!("the simulated ranks ended before dumping"),
            }
        }
        clock.abort();
        first.unwrap()
    }

    #[tokio::test]
    async fn a_start_that_reached_the_node_late_dumps_from_its_first_round() {
        // A loaded machine delayed the broadcast Start: no round may lack these ranks.
        assert_eq!(first_round_after_a_late_start(false, false).await, 5);
    }

    #[tokio::test]
    async fn in_time_rounds_a_start_that_reached_the_node_late_begins_at_the_window_under_way() {
        // A round is a window of wall time: the windows that ended before the Start came are not this node's.
        let first = first_round_after_a_late_start(false, true).await;
        assert!((10_005..10_500).contains(&first), "began at round {first}");
    }

    #[tokio::test]
    async fn a_node_that_rejoins_begins_at_the_trees_current_round() {
        let first = first_round_after_a_late_start(true, false).await;
        // Ten seconds of 1 ms rounds after round 5, give or take the test's own pace.
        assert!((10_005..10_500).contains(&first), "began at round {first}");
    }

    /// The round of the next dump the simulated ranks hand the node.
    async fn next_dump(node: &mut mpsc::Receiver<Input>) -> u64 {
        loop {
            let input = tokio::time::timeout(Duration::from_secs(10), node.recv())
                .await
                .expect("a dump within 10 s")
                .expect("the simulated ranks ended");
            let Input::Ranks(events) = input else { continue };
            if let Some(round) = events.iter().find_map(|e| match e {
                RankEvent::Round { round, .. } => Some(*round),
                _ => None,
            }) {
                return round;
            }
        }
    }

    /// Simulated ranks whose parent died: they dumped rounds 0 to 2 and wait at round 3, the end of their window
    /// (the dead parent's last credit), while the tree's clock runs on for twenty periods.
    struct Orphaned {
        control: mpsc::UnboundedSender<control::Action>,
        node: mpsc::Receiver<Input>,
        window: Window,
        clock: tokio::task::JoinHandle<()>,
        start: Start,
    }

    impl Orphaned {
        /// The ranks on `period`, told `options` (if any) before the Start, held at round 3.
        async fn held(period: Duration, options: Option<&canopy_proto::v1::Options>) -> Orphaned {
            let (control, control_rx) = mpsc::unbounded_channel();
            let (inputs, mut node) = mpsc::channel(64);
            let (mut window, gate) = Window::new(1 << 20);
            window.update(WindowState {
                credit: Some(3),
                ..Default::default()
            });
            let ranks = SimulatedRanks {
                sim: simulator("app"),
                schedule: Schedule { period, rounds: 0 },
                control: control_rx,
                inputs,
                window: gate,
            };
            let clock = tokio::spawn(ranks.run());
            if let Some(o) = options {
                control.send(control::Action::Options(o.clone())).unwrap();
            }
            let start = Start {
                start_unix_ns: unix_ns(),
                first_round: 0,
                rejoin: false,
            };
            control.send(control::Action::Start(start)).unwrap();
            for round in 0..3 {
                assert_eq!(next_dump(&mut node).await, round);
            }
            tokio::time::sleep(period * 20).await;
            Orphaned {
                control,
                node,
                window,
                clock,
                start,
            }
        }

        /// The adopter attaches: it tells the controls in force again, the Start marked as a rejoin as to any
        /// child that attaches, and opens the window with its credit.
        fn adopted(&mut self, options: Option<canopy_proto::v1::Options>) {
            if let Some(o) = options {
                self.control.send(control::Action::Options(o)).unwrap();
            }
            let replayed = Start {
                rejoin: true,
                ..self.start
            };
            self.control.send(control::Action::Start(replayed)).unwrap();
            self.window.update(WindowState {
                credit: Some(1 << 20),
                ..Default::default()
            });
        }
    }

    #[tokio::test]
    async fn ranks_held_by_the_window_and_adopted_skip_no_round() {
        // The ranks go on from round 3 once adopted, the rounds they fell behind on at once: a round skipped here
        // would be lost at every rank of the node, with nothing left to send again.
        let mut orphan = Orphaned::held(Duration::from_millis(5), None).await;
        orphan.adopted(None);
        let mut after = Vec::new();
        for _ in 0..3 {
            after.push(next_dump(&mut orphan.node).await);
        }
        orphan.clock.abort();
        assert_eq!(after, [3, 4, 5], "the adopted node's ranks skipped rounds");
    }

    #[tokio::test]
    async fn options_told_again_keep_the_ranks_on_the_trees_clock() {
        // The adopter also replays the options in force, period included. Once the window opens, the rounds the
        // ranks fell behind on (3 to 22) are due already and go at once, not one period apart from the moment the
        // options came.
        let period = Duration::from_millis(50);
        let options = canopy_proto::v1::Options {
            period_ms: 50,
            ..Default::default()
        };
        let mut orphan = Orphaned::held(period, Some(&options)).await;
        let opened = tokio::time::Instant::now();
        orphan.adopted(Some(options));
        for round in 3..18 {
            assert_eq!(next_dump(&mut orphan.node).await, round);
        }
        orphan.clock.abort();
        // Fifteen rounds on a clock moved to the options' arrival would take 14 periods (700 ms).
        let took = opened.elapsed();
        assert!(
            took < period * 7,
            "rounds 3 to 17 took {took:?}: the ranks left the tree's clock"
        );
    }

    /// The first round the simulated ranks of `app` dump under these options: per rank, the names of the
    /// events its profile reports, or why it has none.
    async fn first_dump(
        app: &str,
        options: &canopy_proto::v1::Options,
    ) -> Vec<(u32, Result<Vec<String>, MissingReason>)> {
        use prost::Message;
        let sim = simulator(app);
        let names: std::collections::HashMap<u64, String> = sim.names().into_iter().collect();
        let (control_tx, control) = mpsc::unbounded_channel();
        let (inputs, mut node) = mpsc::channel(16);
        let (_window, gate) = Window::new(1 << 40);
        let ranks = SimulatedRanks {
            sim,
            schedule: Schedule {
                period: Duration::from_millis(1),
                rounds: 0,
            },
            control,
            inputs,
            window: gate,
        };
        let clock = tokio::spawn(ranks.run());
        control_tx
            .send(control::Action::Options(options.clone()))
            .unwrap();
        let start = Start {
            start_unix_ns: unix_ns(),
            first_round: 0,
            rejoin: false,
        };
        control_tx.send(control::Action::Start(start)).unwrap();
        let dumps = loop {
            let Some(input) = node.recv().await else {
                panic!("the simulated ranks ended before dumping")
            };
            let Input::Ranks(events) = input else { continue };
            let dumps: Vec<_> = events
                .into_iter()
                .filter_map(|e| match e {
                    RankEvent::Round { rank, profile, .. } => Some((rank, profile)),
                    _ => None,
                })
                .collect();
            if !dumps.is_empty() {
                break dumps;
            }
        };
        clock.abort();
        dumps
            .into_iter()
            .map(|(rank, profile)| {
                let events = profile.map(|bytes| {
                    let batch = canopy_proto::v1::ProfileBatch::decode(&bytes[..]).unwrap();
                    let mut events: Vec<String> = batch
                        .profiles
                        .iter()
                        .flat_map(|p| &p.events)
                        .map(|e| names[&e.event_id].clone())
                        .collect();
                    events.sort();
                    events.dedup();
                    events
                });
                (rank, events)
            })
            .collect()
    }

    #[tokio::test]
    async fn simulated_ranks_of_two_applications_each_run_their_own_options() {
        let options = canopy_proto::v1::Options {
            include: vec!["^MPI_".into()],
            apps: vec![
                canopy_proto::v1::AppOptions {
                    app: "analysis".into(),
                    sample_below: Some(0),
                    ..Default::default()
                },
                canopy_proto::v1::AppOptions {
                    app: "viz".into(),
                    sample_below: Some(1),
                    include: vec![".".into()],
                    exclude: vec!["^MPI_".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        // The analysis is disabled: every rank sampled out.
        assert_eq!(
            first_dump("analysis", &options).await,
            [
                (0, Err(MissingReason::SampledOut)),
                (1, Err(MissingReason::SampledOut))
            ]
        );
        // The simulation has no entry: the global include.
        let sim = first_dump("sim", &options).await;
        assert_eq!(sim.len(), 2);
        for (rank, events) in sim {
            let events = events.unwrap_or_else(|why| panic!("rank {rank}: {why:?}"));
            assert!(
                !events.is_empty() && events.iter().all(|e| e.starts_with("MPI_")),
                "{events:?}"
            );
        }
        // The visualization: its own include and exclude, and its own sampling.
        let viz = first_dump("viz", &options).await;
        assert_eq!(viz[1], (1, Err(MissingReason::SampledOut)));
        let events = viz[0].1.as_ref().unwrap();
        assert!(
            !events.is_empty() && events.iter().all(|e| !e.starts_with("MPI_")),
            "{events:?}"
        );
    }
}
