//! What varies in a simulated run: each rank's statics (its speed, communication, bytes and load, drawn once)
//! and the application's work from round to round.

use super::*;

/// What sets a rank apart for the whole run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Statics {
    /// Compute time multiplier: most ranks are fast, a few slow.
    pub(super) speed: f64,
    pub(super) comm: f64,
    pub(super) bytes: f64,
    /// Namd work multiplier: 1 to 1.08 for most ranks, 1.35 to 1.65 for the overloaded few.
    pub(super) load: f64,
}

impl Statics {
    /// A rank's statics as drawn, then its planted factor applied to its computation and its load.
    pub(super) fn of(cfg: &SimConfig, rank: u32, total: u32) -> Statics {
        let mut st = Statics::draw(cfg.seed, cfg.scenario, rank, total);
        let factor = plant::factor_of(&cfg.plants, rank);
        st.speed *= factor;
        st.load *= factor;
        st
    }

    pub(super) fn draw(seed: u64, sc: Scenario, rank: u32, total: u32) -> Statics {
        let mut g = Keyed::of(&[seed, sc.tag(), u64::from(rank), u64::MAX]);
        let u = g.unit();
        let speed = SPEED_MIN + (SPEED_MAX - SPEED_MIN) * u * u;
        let comm = g.range(0.9, 1.1);
        let bytes = g.range(0.5, 1.5)
            * match sc {
                Scenario::Flash => 24.0 * 32768.0,
                Scenario::Uintah => 40.0 * 16384.0,
                Scenario::Namd => 16.0 * 49152.0,
                Scenario::Workflow => 12.0 * 65536.0,
            };
        let (u, v) = (g.unit(), g.unit());
        // One rank is always overloaded so that the imbalance shows even in a small run.
        let forced = u64::from(rank) == seed % u64::from(total.max(1));
        let load = if forced || v < 1.0 / 32.0 {
            1.35 + 0.3 * u
        } else {
            1.0 + 0.08 * u * u
        };
        Statics {
            speed,
            comm,
            bytes,
            load,
        }
    }
}

pub(super) const SPEED_MIN: f64 = 0.9;
pub(super) const SPEED_MAX: f64 = 1.1;
/// The application's work in a round, relative to round 0: a slow oscillation, for FLASH a refinement
/// that grows and saturates.
pub(super) fn workload(sc: Scenario, round: u64) -> f64 {
    let k = round as f64;
    match sc {
        Scenario::Flash => 1.0 + 0.1 * (k / 40.0).sin() + 0.2 * k / (k + 500.0),
        Scenario::Uintah => 1.0 + 0.05 * (k / 25.0).sin(),
        Scenario::Namd => 1.0 + 0.02 * (k / 10.0).sin(),
        Scenario::Workflow => 1.0 + 0.05 * (k / 30.0).sin(),
    }
}
