//! Each standard filter's payload readers, through its Rust API as the plugin host calls it: a leaf's rank
//! profiles, a relay's and the root's children's packets, the packets that come down, and the root's
//! finalize.
//!
//! An input picks the level the fuzzed bytes enter at and the filter's parameters, then a list of calls. What
//! a call emits travels on as it would in a tree with one node per level (a leaf's packet up to the relay,
//! the relay's to the root, the root's down again, and every packet the root emits up through finalize), so
//! the fuzzed bytes reach every reader of the filter and the filter reads its own packets too: a packet one
//! instance wrote that another refuses is a bug.

use canopy_filter_sdk::{Filter, Level};
use canopy_filter_test::Collect;

use crate::input::Input;

/// The calls one input may make, and the packets one call's outputs may lead to.
const MAX_CALLS: usize = 32;
const MAX_HOPS: usize = 64;
/// Inputs to one upstream call.
const MAX_INPUTS: u8 = 6;
/// Bytes of one input.
const MAX_PACKET: usize = 8192;

pub fn filter_stats(data: &[u8]) {
    run::<canopy_filter_stats::StatsFilter>(
        data,
        &["", r#"{"values":"round"}"#, r#"{"values":"cumulative"}"#],
    );
}

pub fn filter_histogram(data: &[u8]) {
    run::<canopy_filter_histogram::HistogramFilter>(
        data,
        &[
            "",
            r#"{"bins":1}"#,
            r#"{"bins":3,"values":"cumulative"}"#,
            r#"{"bins":10000}"#,
        ],
    );
}

pub fn filter_classify(data: &[u8]) {
    run::<canopy_filter_classify::ClassifyFilter>(
        data,
        &[
            "",
            r#"{"scheme":"pattern","pattern":"^Patch 1 ->"}"#,
            r#"{"scheme":"pattern","pattern":"MPI_","bins":4,"metric":"inclusive","summaries":true}"#,
            r#"{"summaries":false,"values":"cumulative"}"#,
        ],
    );
}

pub fn filter_outliers(data: &[u8]) {
    run::<canopy_filter_outliers::OutliersFilter>(
        data,
        &[
            "",
            r#"{"k":1,"top_events":0}"#,
            r#"{"fraction":0.5,"weighted":true,"within":"class","metric":"inclusive"}"#,
            r#"{"events":"pattern","pattern":"MPI_","within":"class","values":"cumulative"}"#,
        ],
    );
}

pub fn filter_passthrough(data: &[u8]) {
    run::<canopy_filter_passthrough::Passthrough>(data, &["", "{}"]);
}

const LEVELS: [Level; 3] = [Level::Leaf, Level::Relay, Level::Root];

/// Where a packet goes next.
enum Hop {
    /// Upstream into the instance at this level.
    Up(usize, u64, u32, Vec<u8>),
    /// Downstream into the instance at this level.
    Down(usize, u64, u32, Vec<u8>),
}

/// A tree of one instance per level, from the leaf (0) to the root (2).
struct Chain<F: Filter> {
    nodes: Vec<Option<F>>,
}

fn run<F: Filter>(data: &[u8], params: &[&str]) {
    let mut input = Input::new(data);
    let head = input.byte();
    let entry = usize::from(head % 3);
    let choice = usize::from(head / 3) % (params.len() + 1);
    // The last choice: parameters from the input, as a user's CreateStream gives them.
    let params = match params.get(choice) {
        Some(p) => p.to_string(),
        None => input.string(256),
    };
    let mut chain = Chain::<F> {
        nodes: LEVELS
            .iter()
            .map(|level| F::create(&params, *level).ok())
            .collect(),
    };
    if chain.nodes.iter().all(Option::is_none) {
        return;
    }
    for _ in 0..MAX_CALLS {
        if input.is_empty() {
            break;
        }
        let op = input.below(4);
        let round = u64::from(input.below(4));
        let phase = u32::from(input.below(4));
        match op {
            0 => {
                let n = input.below(MAX_INPUTS + 1);
                let inputs: Vec<&[u8]> = (0..n).map(|_| input.bytes(MAX_PACKET)).collect();
                if entry == 0 {
                    for i in &inputs {
                        crate::wire::profile_batch(i);
                    }
                }
                chain.upstream(entry, round, phase, &inputs, false);
            }
            1 => {
                let packet = input.bytes(MAX_PACKET);
                chain.downstream(entry, round, phase, packet);
            }
            2 => {
                let packet = input.bytes(MAX_PACKET);
                chain.finalize(round, phase, packet);
            }
            _ => {
                let n = input.below(4);
                let names: Vec<(u64, String)> = (0..n)
                    .map(|_| (u64::from(input.below(8)), input.string(64)))
                    .collect();
                let names: Vec<(u64, &str)> = names.iter().map(|(id, n)| (*id, n.as_str())).collect();
                for f in chain.nodes.iter_mut().flatten() {
                    f.names(&names);
                }
            }
        }
    }
}

impl<F: Filter> Chain<F> {
    /// An upstream call; `own`: the inputs are packets an instance of this filter wrote.
    fn upstream(&mut self, level: usize, round: u64, phase: u32, inputs: &[&[u8]], own: bool) {
        let Some(f) = self.nodes[level].as_mut() else {
            return;
        };
        let mut out = Collect::default();
        let result = f.upstream(round, phase, inputs, &mut out);
        if own {
            assert!(
                out.rejects.is_empty(),
                "{} at {:?} rejected its own packets: {:?}",
                F::NAME,
                LEVELS[level],
                out.rejects
            );
        }
        if result.is_ok() {
            self.follow(level, round, out);
        }
    }

    fn downstream(&mut self, level: usize, round: u64, phase: u32, packet: &[u8]) {
        let Some(f) = self.nodes[level].as_mut() else {
            return;
        };
        let mut out = Collect::default();
        if f.downstream(round, phase, packet, &mut out).is_ok() {
            self.follow(level, round, out);
        }
    }

    fn finalize(&mut self, round: u64, phase: u32, packet: &[u8]) {
        if let Some(f) = self.nodes[2].as_mut() {
            let _ = f.finalize(round, phase, packet);
        }
    }

    /// Delivers what a call emitted, and what that leads to, up to a bound.
    fn follow(&mut self, level: usize, round: u64, out: Collect) {
        let mut hops = Vec::new();
        push(&mut hops, level, round, out);
        let mut done = 0;
        while let Some(hop) = hops.pop() {
            done += 1;
            if done > MAX_HOPS {
                break;
            }
            match hop {
                Hop::Up(3, round, phase, packet) => {
                    // Emitted up by the root: stored through finalize, as the node does. The filter wrote it.
                    let f = self.nodes[2].as_mut().expect("the root emitted it");
                    if let Err(e) = f.finalize(round, phase, &packet) {
                        assert!(
                            !e.contains("is not a"),
                            "{} cannot finalize its own packet: {e}",
                            F::NAME
                        );
                    }
                }
                Hop::Up(level, round, phase, packet) => {
                    let Some(f) = self.nodes[level].as_mut() else {
                        continue;
                    };
                    let mut out = Collect::default();
                    let result = f.upstream(round, phase, &[&packet], &mut out);
                    assert!(
                        out.rejects.is_empty(),
                        "{} at {:?} rejected a packet of its child: {:?}",
                        F::NAME,
                        LEVELS[level],
                        out.rejects
                    );
                    if result.is_ok() {
                        push(&mut hops, level, round, out);
                    }
                }
                Hop::Down(level, round, phase, packet) => {
                    let Some(f) = self.nodes[level].as_mut() else {
                        continue;
                    };
                    let mut out = Collect::default();
                    if f.downstream(round, phase, &packet, &mut out).is_ok() {
                        push(&mut hops, level, round, out);
                    }
                }
            }
        }
    }
}

fn push(hops: &mut Vec<Hop>, level: usize, round: u64, out: Collect) {
    for (phase, packet) in out.up {
        hops.push(Hop::Up(level + 1, round, phase, packet));
    }
    if level > 0 {
        for (phase, packet) in out.down {
            hops.push(Hop::Down(level - 1, round, phase, packet));
        }
    }
}
