//! The two header lines of `canopy watch`: the shown stream's latest round, its rate and coverage, and how long
//! the watch has run; then the tree's troubles (lost nodes, late arrivals, dropped dumps, updates this watch
//! missed), in colour when there are any, and where the front-end is.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use canopy_proto::v1::{NodeState, RoundUpdate, TopologyNode};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

use crate::units::elapsed;

/// How far back the rate of rounds looks.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Rounds per second over `(seconds, round)` samples, oldest first: the rounds between the first and the last
/// sample over the time between them; `None` with fewer than two samples or no time between them.
pub fn rounds_per_second(samples: &[(f64, u64)]) -> Option<f64> {
    let (first, last) = (samples.first()?, samples.last()?);
    let dt = last.0 - first.0;
    (dt > 0.0).then(|| last.1.saturating_sub(first.1) as f64 / dt)
}

/// What the header knows of one stream.
#[derive(Debug, Default, Clone)]
pub struct StreamStatus {
    pub round: u64,
    pub covered: u32,
    pub expected: u32,
    /// The nodes the round's coverage names unreachable, most ranks first.
    pub unreachable: Vec<String>,
    /// When each recent round arrived (seconds since the watch began) and its number.
    arrivals: VecDeque<(f64, u64)>,
}

impl StreamStatus {
    pub fn update(&mut self, u: &RoundUpdate, at: f64) {
        let cov = u.coverage.clone().unwrap_or_default();
        // A late phase of an older round does not move the stream back.
        if u.round >= self.round || self.arrivals.is_empty() {
            self.round = u.round;
            self.covered = cov.covered;
            self.expected = cov.expected;
            let mut nodes = cov.unreachable;
            nodes.sort_by(|a, b| b.ranks.cmp(&a.ranks).then_with(|| a.node.cmp(&b.node)));
            self.unreachable = nodes.into_iter().map(|u| u.node).collect();
            // Rounds replayed from the store arrive all at once: they say nothing of the rate.
            if !u.replayed {
                self.arrivals.push_back((at, u.round));
            }
        }
        while self
            .arrivals
            .front()
            .is_some_and(|(t, _)| at - t > RATE_WINDOW.as_secs_f64())
        {
            self.arrivals.pop_front();
        }
    }

    /// Rounds per second over the last ten seconds; none until the rounds seen span a second (over less, the
    /// rate is the jitter of a few arrivals).
    pub fn rate(&self) -> Option<f64> {
        let samples: Vec<(f64, u64)> = self.arrivals.iter().copied().collect();
        let span = samples.last()?.0 - samples.first()?.0;
        if span < 1.0 {
            return None;
        }
        rounds_per_second(&samples)
    }
}

/// The tree's troubles, from its Topology.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Troubles {
    pub lost_nodes: u64,
    pub late: u64,
    pub dropped: u64,
}

impl Troubles {
    pub fn of(nodes: &[TopologyNode]) -> Troubles {
        Troubles {
            lost_nodes: nodes.iter().filter(|n| n.state == NodeState::Lost as i32).count() as u64,
            late: nodes.iter().map(|n| n.late_arrivals).sum(),
            dropped: nodes.iter().map(|n| n.rank_dumps_dropped).sum(),
        }
    }
}

/// Everything the header shows.
#[derive(Debug, Clone)]
pub struct Header {
    pub frontend: String,
    pub started: Instant,
    /// How long the run had been going when the front-end last said, and when that was: the header shows the
    /// run's elapsed time from it (the watch's own until then).
    pub run_age: Option<(Duration, Instant)>,
    pub troubles: Troubles,
    /// Updates this watch read too slowly to get.
    pub missed: u64,
    /// Set while the front-end is away: what the watch is doing about it.
    pub notice: Option<String>,
}

/// A count of troubles, red and bold when there are any, and the space after it.
pub fn count(label: &str, n: u64) -> Vec<Span<'static>> {
    let style = if n > 0 {
        Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
    } else {
        Style::new().fg(Color::Gray)
    };
    vec![Span::styled(format!("{label} {n}"), style), Span::raw("  ")]
}

impl Header {
    pub fn new(frontend: &str) -> Header {
        Header {
            frontend: frontend.to_string(),
            started: Instant::now(),
            run_age: None,
            troubles: Troubles::default(),
            missed: 0,
            notice: None,
        }
    }

    /// The two lines for the shown stream (if any) at `now`, each short enough for 80 columns: the stream's round,
    /// rate and coverage and the run's elapsed time; then the troubles, the front-end's address and `keys`.
    pub fn lines(
        &self,
        stream: Option<(&str, &StreamStatus)>,
        now: Instant,
        keys: &str,
    ) -> [Line<'static>; 2] {
        let mut first = Vec::new();
        match stream {
            Some((name, s)) => {
                let rate = s.rate().map_or("-".to_string(), |r| format!("{r:.1}"));
                first.push(Span::styled(
                    format!("{name}: round {}", s.round),
                    Style::new().add_modifier(Modifier::BOLD),
                ));
                first.push(Span::raw(format!("  {rate} rounds/s  ")));
                let cov_style = if s.covered >= s.expected {
                    Style::new()
                } else {
                    Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)
                };
                let unreachable = match s.unreachable.as_slice() {
                    [] => String::new(),
                    [one] => format!(" ({one} unreachable)"),
                    [first, rest @ ..] => format!(" ({first} +{} unreachable)", rest.len()),
                };
                first.push(Span::styled(
                    format!("coverage {}/{}{unreachable}", s.covered, s.expected),
                    cov_style,
                ));
            }
            None => first.push(Span::raw("waiting for the first round")),
        }
        let (label, since) = match self.run_age {
            Some((age, at)) => ("run", age + now.saturating_duration_since(at)),
            None => ("up", now.saturating_duration_since(self.started)),
        };
        first.push(Span::raw(format!("  {label} {}", elapsed(since))));
        let mut second = Vec::new();
        second.extend(count("lost", self.troubles.lost_nodes));
        second.extend(count("late", self.troubles.late));
        second.extend(count("dropped", self.troubles.dropped));
        second.extend(count("missed", self.missed));
        if let Some(n) = &self.notice {
            second.push(Span::styled(
                format!("{n}  "),
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            ));
        }
        second.push(Span::raw(format!("{}  ", self.frontend)));
        second.push(Span::styled(keys.to_string(), Style::new().fg(Color::Gray)));
        [Line::from(first), Line::from(second)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::Coverage;

    fn text(l: &Line<'_>) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn the_rate_of_rounds_is_the_rounds_between_two_samples_over_their_time() {
        assert_eq!(rounds_per_second(&[]), None);
        assert_eq!(rounds_per_second(&[(1.0, 5)]), None);
        assert_eq!(rounds_per_second(&[(1.0, 5), (1.0, 6)]), None);
        assert_eq!(rounds_per_second(&[(0.0, 10), (1.0, 12), (2.0, 20)]), Some(5.0));
    }

    #[test]
    fn the_header_names_the_round_its_coverage_and_lights_up_troubles() {
        let mut s = StreamStatus::default();
        let update = |round, covered| RoundUpdate {
            round,
            coverage: Some(Coverage {
                covered,
                expected: 8,
                ..Default::default()
            }),
            ..Default::default()
        };
        s.update(&update(3, 8), 0.0);
        s.update(&update(4, 8), 0.5);
        // Half a second of rounds is too little for a rate.
        assert_eq!(s.rate(), None);
        s.update(&update(5, 6), 1.0);
        // A late phase of round 4 does not take the header back.
        s.update(&update(4, 8), 1.5);
        assert_eq!((s.round, s.covered, s.expected), (5, 6, 8));
        assert_eq!(s.rate(), Some(2.0));
        let mut h = Header::new("127.0.0.1:7400");
        h.troubles = Troubles {
            lost_nodes: 1,
            late: 0,
            dropped: 0,
        };
        let [first, second] = h.lines(
            Some(("stats", &s)),
            h.started + Duration::from_secs(83),
            "?: help",
        );
        let first_text = text(&first);
        assert!(
            first_text == "stats: round 5  2.0 rounds/s  coverage 6/8  up 1:23",
            "{first_text}"
        );
        // Partial coverage and a lost node stand out; counts of zero do not.
        let span = |l: &Line<'static>, what: &str| {
            l.spans
                .iter()
                .find(|s| s.content.contains(what))
                .cloned()
                .unwrap()
        };
        assert_eq!(span(&first, "coverage").style.fg, Some(Color::Yellow));
        // A round closed while nodes were cut off names the one with the most ranks.
        let mut cut = update(6, 4);
        let names = [("relay1", 2), ("relay0", 2)];
        cut.coverage.as_mut().unwrap().unreachable = names
            .iter()
            .map(|(node, ranks)| canopy_proto::v1::Unreachable {
                node: node.to_string(),
                ranks: *ranks,
            })
            .collect();
        s.update(&cut, 2.0);
        let [cut_line, _] = h.lines(Some(("stats", &s)), h.started, "");
        assert!(
            text(&cut_line).contains("coverage 4/8 (relay0 +1 unreachable)"),
            "{}",
            text(&cut_line)
        );
        assert_eq!(span(&second, "lost 1").style.fg, Some(Color::Red));
        assert_eq!(span(&second, "late 0").style.fg, Some(Color::Gray));
        assert_eq!(
            text(&second),
            "lost 1  late 0  dropped 0  missed 0  127.0.0.1:7400  ?: help"
        );
        // Once the front-end has said when the run began, the header counts from there.
        h.run_age = Some((Duration::from_secs(600), h.started + Duration::from_secs(3)));
        let [first, _] = h.lines(Some(("stats", &s)), h.started + Duration::from_secs(83), "");
        assert!(text(&first).ends_with("  run 11:20"), "{}", text(&first));
    }

    #[test]
    fn troubles_add_up_over_the_nodes_of_the_tree() {
        let node = |state: NodeState, late, dropped| TopologyNode {
            state: state as i32,
            late_arrivals: late,
            rank_dumps_dropped: dropped,
            ..Default::default()
        };
        let t = Troubles::of(&[
            node(NodeState::Attached, 2, 0),
            node(NodeState::Lost, 0, 5),
            node(NodeState::Attached, 1, 1),
        ]);
        assert_eq!(
            t,
            Troubles {
                lost_nodes: 1,
                late: 3,
                dropped: 6
            }
        );
    }
}
