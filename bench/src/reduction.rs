//! `canopy-bench reduction`: the data reduction each filter buys (the ToM paper's Fig. 7). Two tables:
//!
//! - `main`: one in-process tree (fanout 8, loopback gRPC, the store on disk) runs every standard filter as a
//!   stream over the same simulated ranks; the bytes of each round's result at the front-end are compared with
//!   `passthrough`'s, which carries every rank's profile whole.
//! - `schemes`: one tree per classification scheme runs `classify` alone; the table gives what the stored
//!   `reductions` rows say: the classes, the raw bytes (the encoded rank profiles the round's leaves read), the
//!   result's bytes and their ratio, the reduction factor as the paper counts it.

use std::time::Duration;

use canopy_integration_tests::{Select, StoreReader, TreeBuilder};

/// classify's schemes by the word `--schemes` takes: the paper's name for it and the stream's parameters.
pub const SCHEMES: [(&str, &str, &str); 3] = [
    (
        "patch1",
        "AMR L1 Patch Only",
        r#"{"scheme":"pattern","pattern":"^Patch 1 ->"}"#,
    ),
    ("mpi", "MPI Only", r#"{"scheme":"pattern","pattern":"^MPI_"}"#),
    ("all", "Default", "{}"),
];

/// What to measure.
pub struct Plan<'a> {
    pub sizes: &'a [u32],
    pub scenarios: &'a [String],
    pub events: u32,
    pub rounds: u64,
    /// `main`, `schemes` or both.
    pub tables: &'a [String],
    /// Words of [`SCHEMES`].
    pub schemes: &'a [String],
}

pub async fn run(plan: &Plan<'_>) -> anyhow::Result<()> {
    for table in plan.tables {
        match table.as_str() {
            "main" => main_table(plan).await?,
            "schemes" => schemes_table(plan).await?,
            other => anyhow::bail!("unknown table `{other}`: expected main or schemes"),
        }
    }
    Ok(())
}

/// The tree of one row: fanout 8, 32 ranks per agent (2 to 32 agents).
fn builder(plan: &Plan<'_>, scenario: &str, ranks: u32, streams: &[&str]) -> TreeBuilder {
    TreeBuilder {
        agents: (ranks as usize / 32).clamp(2, 32),
        fanout: 8,
        ranks,
        rounds: plan.rounds,
        period_ms: 100 + u64::from(ranks) / 4,
        events: plan.events,
        scenario: scenario.to_string(),
        timeout_ms: 30_000,
        streams: streams.iter().map(|f| f.to_string()).collect(),
        ..TreeBuilder::default()
    }
}

/// Runs a tree to its end and opens its store; every round of every stream must be at full coverage.
async fn run_tree(
    builder: TreeBuilder,
) -> anyhow::Result<(StoreReader, canopy_integration_tests::TreeSandbox)> {
    let rounds = builder.rounds;
    let streams = builder.streams.clone();
    let mut sandbox = builder.start().await;
    sandbox
        .wait_frontend(Duration::from_secs(900))
        .await
        .map_err(anyhow::Error::msg)?;
    let reader = StoreReader::open(&sandbox.store)?;
    let stored = reader.rounds(Select::all())?;
    for f in &streams {
        let full = stored.iter().filter(|r| &r.stream == f && r.is_full()).count();
        anyhow::ensure!(
            full as u64 == rounds,
            "{f}: {full} of {rounds} rounds at full coverage"
        );
    }
    Ok((reader, sandbox))
}

async fn main_table(plan: &Plan<'_>) -> anyhow::Result<()> {
    let filters = ["passthrough", "stats", "histogram", "classify"];
    println!(
        "\n## reduction: bytes per round at the front-end, per filter, {} rounds, {} events (flash) or tasks (uintah), fanout 8",
        plan.rounds, plan.events
    );
    println!(
        "\n| scenario | ranks | passthrough B/round | stats B/round | passthrough/stats | histogram B/round | passthrough/histogram | classify B/round | passthrough/classify |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for scenario in plan.scenarios {
        for &ranks in plan.sizes {
            let mut builder = builder(plan, scenario, ranks, &filters);
            // The paper's classification: Uintah's ranks by their level-1 AMR patches; FLASH's by all events.
            if scenario == "uintah" {
                builder.stream_params = vec![("classify".into(), SCHEMES[0].2.into())];
            }
            let (reader, _sandbox) = run_tree(builder).await?;
            let stored = reader.rounds(Select::all())?;
            let bytes: Vec<f64> = filters
                .iter()
                .map(|f| {
                    let of: Vec<_> = stored.iter().filter(|r| r.stream == *f).collect();
                    of.iter().map(|r| r.result_bytes as f64).sum::<f64>() / of.len().max(1) as f64
                })
                .collect();
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

async fn schemes_table(plan: &Plan<'_>) -> anyhow::Result<()> {
    let mut schemes = Vec::new();
    for word in plan.schemes {
        let Some(scheme) = SCHEMES.iter().find(|s| s.0 == word) else {
            let known: Vec<&str> = SCHEMES.iter().map(|s| s.0).collect();
            anyhow::bail!("unknown scheme `{word}`: expected one of {}", known.join(", "));
        };
        schemes.push(scheme);
    }
    println!(
        "\n## reduction: classify alone, per scheme, 5 bins of exclusive time, {} rounds, {} events (flash) or tasks (uintah), fanout 8",
        plan.rounds, plan.events
    );
    println!(
        "\n| scenario | ranks | scheme | params | classes | raw B/round | result B/round | reduction factor (min..max) |"
    );
    println!("|---|---:|---|---|---:|---:|---:|---:|");
    for scenario in plan.scenarios {
        for &ranks in plan.sizes {
            for (_, name, params) in &schemes {
                let mut builder = builder(plan, scenario, ranks, &["classify"]);
                builder.stream_params = vec![("classify".into(), params.to_string())];
                let (reader, _sandbox) = run_tree(builder).await?;
                let rows = reader.reductions(Select::all())?;
                let rows: Vec<_> = rows.iter().filter(|r| !r.late).collect();
                anyhow::ensure!(
                    !rows.is_empty(),
                    "{scenario} {ranks} {name}: no reductions stored"
                );
                let n = rows.len() as f64;
                let raw = rows.iter().map(|r| r.raw_bytes as f64).sum::<f64>() / n;
                let result = rows.iter().map(|r| r.result_bytes as f64).sum::<f64>() / n;
                let factors: Vec<f64> = rows.iter().filter_map(|r| r.reduction_factor).collect();
                let lo = factors.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = factors.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let classes = rows.iter().filter_map(|r| r.classes).max().unwrap_or(0);
                println!(
                    "| {scenario} | {ranks} | {name} | `{params}` | {classes} | {raw:.0} | {result:.0} | {:.2} ({lo:.2}..{hi:.2}) |",
                    raw / result
                );
            }
        }
    }
    Ok(())
}
