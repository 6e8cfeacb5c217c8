//! The kinds of daemon in a tree, and how the CPU `canopy up` and `canopy run` read of them adds up by kind.

use std::time::Duration;

/// The kinds of daemon in a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    FrontEnd,
    Relay,
    Agent,
}

/// CPU by kind of process over a run.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct ByKind {
    pub frontend_s: f64,
    pub relays: usize,
    pub relays_s: f64,
    pub agents: usize,
    pub agents_s: f64,
}

impl ByKind {
    pub fn add(&mut self, kind: Kind, cpu: Duration) {
        let s = cpu.as_secs_f64();
        match kind {
            Kind::FrontEnd => self.frontend_s += s,
            Kind::Relay => {
                self.relays += 1;
                self.relays_s += s;
            }
            Kind::Agent => {
                self.agents += 1;
                self.agents_s += s;
            }
        }
    }

    /// The summary line: seconds by kind, and milliseconds per round when rounds were stored.
    pub fn line(&self, rounds: u64) -> String {
        let mut s = format!(
            "CPU (from /proc): front-end {:.2} s, {} relays {:.2} s, {} agents {:.2} s",
            self.frontend_s, self.relays, self.relays_s, self.agents, self.agents_s
        );
        if rounds > 0 {
            let per = |x: f64| x * 1e3 / rounds as f64;
            s.push_str(&format!(
                "; per round: {:.2} / {:.2} / {:.2} ms",
                per(self.frontend_s),
                per(self.relays_s),
                per(self.agents_s)
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_add_up_per_round() {
        let mut k = ByKind::default();
        k.add(Kind::FrontEnd, Duration::from_secs(1));
        k.add(Kind::Relay, Duration::from_millis(500));
        k.add(Kind::Relay, Duration::from_millis(500));
        k.add(Kind::Agent, Duration::from_secs(4));
        assert_eq!(
            k.line(1000),
            "CPU (from /proc): front-end 1.00 s, 2 relays 1.00 s, 1 agents 4.00 s; per round: 1.00 / 1.00 / 4.00 ms"
        );
    }
}
