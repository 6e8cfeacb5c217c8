//! The nodes filter over random trees: whatever the shape and the order packets arrive in, the root's result holds
//! every leaf's sample of every round, once, sorted by node id, and equals the samples sorted directly.

use canopy_filter_nodes::NodesFilter;
use canopy_filter_proto::v1::{CpuSample, DiskSample, NetworkSample, NodeSample, NodeSamples, RankRange};
use canopy_filter_test::{Rng, Run, Tree, simulate};
use proptest::prelude::*;
use prost::Message;

/// Leaf `leaf`'s sample of `round`: its own ranks, random figures.
fn sample(rng: &mut Rng, leaf: usize, round: u64) -> NodeSample {
    let user = rng.unit();
    NodeSample {
        node_id: format!("agent@n{leaf:03}"),
        hostname: format!("n{leaf:03}"),
        ranks: vec![RankRange {
            app: "a".into(),
            first: leaf as u32 * 4,
            last: leaf as u32 * 4 + 3,
        }],
        sample_unix_ns: 1_700_000_000_000_000_000 + round * 1_000_000_000,
        interval_ns: 1_000_000_000,
        cpu: Some(CpuSample {
            cpus: 8,
            user_share: user,
            idle_share: 1.0 - user,
            ..Default::default()
        }),
        network: Some(NetworkSample {
            rx_bytes: rng.next_u64() >> 20,
            tx_bytes: rng.next_u64() >> 20,
            interfaces: 1,
        }),
        disk: rng.chance(0.5).then(|| DiskSample {
            read_bytes: rng.next_u64() >> 30,
            ..Default::default()
        }),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_nodes_sample_reaches_the_root_once_sorted_by_node(seed in any::<u64>(), rounds in 1usize..4) {
        let mut rng = Rng::new(seed);
        let tree = Tree::random(&mut rng, 4, 5, 40);
        let leaves = tree.leaf_count();
        // One input per leaf and round: the node's own sample, as the agent hands it to its leaf filter.
        let mut expected = Vec::new();
        let inputs: Vec<Vec<Vec<u8>>> = (0..rounds as u64)
            .map(|round| {
                let samples: Vec<NodeSample> = (0..leaves).map(|leaf| sample(&mut rng, leaf, round)).collect();
                expected.push(samples.clone());
                samples
                    .into_iter()
                    .map(|s| NodeSamples { nodes: vec![s] }.encode_to_vec())
                    .collect()
            })
            .collect();
        let placement: Vec<usize> = (0..leaves).collect();
        let run = Run {
            params: "",
            names: &[],
            placement: &placement,
            rounds: &inputs,
            first_round: 0,
            seed: seed ^ 0x5eed,
        };
        let out = simulate::<NodesFilter>(&tree, &run).map_err(TestCaseError::fail)?;
        prop_assert!(out.rejects.is_empty(), "{:?}", out.rejects);
        prop_assert_eq!(out.results.len(), rounds);
        for (round, want) in expected.into_iter().enumerate() {
            let got = NodeSamples::decode(out.results[&(round as u64, 0)].as_slice()).unwrap();
            // The leaves are numbered in the order of their ids, so sorting by id keeps their order.
            prop_assert_eq!(&got.nodes, &want, "round {} over {}", round, tree.describe());
        }
    }
}
