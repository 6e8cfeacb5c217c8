//! `canopy-bench reduction`: the data reduction each filter buys (the ToM paper's Fig. 7). One in-process tree
//! (fanout 8, loopback gRPC, the store on disk) runs every standard filter as a stream over the same simulated
//! ranks; the bytes of each round's result at the front-end are compared with `passthrough`'s, which carries
//! every rank's profile whole.

use std::time::Duration;

use canopy_integration_tests::TreeBuilder;

pub async fn run(sizes: &[u32], scenarios: &[String], events: u32, rounds: u64) -> anyhow::Result<()> {
    let filters = ["passthrough", "stats", "histogram", "classify"];
    println!(
        "\n## reduction: bytes per round at the front-end, per filter, {rounds} rounds, {events} events (flash), fanout 8"
    );
    println!(
        "\n| scenario | ranks | passthrough B/round | stats B/round | passthrough/stats | histogram B/round | passthrough/histogram | classify B/round | passthrough/classify |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for scenario in scenarios {
        for &ranks in sizes {
            let agents = (ranks as usize / 32).clamp(2, 32);
            let builder = TreeBuilder {
                agents,
                fanout: 8,
                ranks,
                rounds,
                period_ms: 100 + u64::from(ranks) / 4,
                events,
                scenario: scenario.clone(),
                timeout_ms: 30_000,
                streams: filters.iter().map(|f| f.to_string()).collect(),
                // The paper's classification: Uintah's ranks by their level-1 AMR patches; FLASH's by all events.
                stream_params: if scenario == "uintah" {
                    vec![(
                        "classify".into(),
                        r#"{"scheme":"pattern","pattern":"^Patch 1 ->"}"#.into(),
                    )]
                } else {
                    Vec::new()
                },
                ..TreeBuilder::default()
            };
            let mut sandbox = builder.start().await;
            sandbox
                .wait_frontend(Duration::from_secs(900))
                .await
                .map_err(anyhow::Error::msg)?;
            let stored =
                canopy_store::StoreReader::open(&sandbox.store)?.rounds(canopy_store::Select::all())?;
            let mut bytes = Vec::new();
            for f in filters {
                let of: Vec<_> = stored.iter().filter(|r| r.stream == f).collect();
                let avg = if of.is_empty() {
                    0.0
                } else {
                    of.iter().map(|r| r.result_bytes as f64).sum::<f64>() / of.len() as f64
                };
                let full = of.iter().filter(|r| r.is_full()).count();
                anyhow::ensure!(
                    full as u64 == rounds,
                    "{f}: {full} of {rounds} rounds at full coverage"
                );
                bytes.push(avg);
            }
            let p = bytes[0];
            println!(
                "| {scenario} | {ranks} | {p:.0} | {:.0} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} |",
                bytes[1],
                p / bytes[1],
                bytes[2],
                p / bytes[2],
                bytes[3],
                p / bytes[3]
            );
        }
    }
    Ok(())
}
