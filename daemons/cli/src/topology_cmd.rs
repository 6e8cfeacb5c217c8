//! `canopy topology`: computes a tree shape and prints it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use canopy_topology::Topology;

#[derive(clap::Args)]
pub struct TopologyArgs {
    #[command(flatten)]
    target: crate::client::Target,
    /// Every node has up to F children, filled breadth-first over the hosts (same as --spec kary:F).
    #[arg(long, conflicts_with_all = ["spec", "file"])]
    fanout: Option<usize>,
    /// A file with one host per line (`#` comments): the nodes to lay the tree over, the first is the root.
    #[arg(long)]
    hosts: Option<PathBuf>,
    /// A shape: `kary:F`, or balanced `b:F^D` / `b:F1xF2...`.
    #[arg(long, conflicts_with = "file")]
    spec: Option<String>,
    /// An MRNet topology file (`host:N => child:N child:N ;`).
    #[arg(long)]
    file: Option<PathBuf>,
    /// A tree for N agents with --fanout F: the front-end, the relays the fanout calls for, the agents
    /// (named frontend:0, relay:K, agent:K; what `canopy up` and the Slurm launcher lay out).
    #[arg(long, value_name = "N", requires = "fanout", conflicts_with_all = ["hosts", "spec", "file"])]
    leaves: Option<usize>,
    /// parents (NODE <= PARENT, one per line) or mrnet (a topology file).
    #[arg(long, default_value = "parents", value_parser = ["parents", "mrnet"])]
    format: String,
}

pub fn run(args: TopologyArgs) -> anyhow::Result<ExitCode> {
    if args.fanout.is_none() && args.spec.is_none() && args.file.is_none() {
        // No shape asked for: show the running tree.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(crate::client::topology(args.target))?;
        return Ok(ExitCode::SUCCESS);
    }
    let topology = load(&args)?;
    match args.format.as_str() {
        "mrnet" => print!("{}", topology.to_mrnet()),
        _ => print!("{}", topology.render_parents()),
    }
    Ok(ExitCode::SUCCESS)
}

fn load(args: &TopologyArgs) -> anyhow::Result<Topology> {
    if let Some(file) = &args.file {
        return read_mrnet(file);
    }
    if let (Some(leaves), Some(fanout)) = (args.leaves, args.fanout) {
        return Ok(Topology::for_leaves(leaves, fanout)?);
    }
    let hosts = match &args.hosts {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Topology::read_hosts(&text)
        }
        None => vec!["localhost".to_string()],
    };
    let spec = match (&args.spec, args.fanout) {
        (Some(s), _) => s.clone(),
        (None, Some(f)) => format!("kary:{f}"),
        (None, None) => anyhow::bail!("give --fanout F --hosts FILE, --spec SPEC, or --file MRNET_FILE"),
    };
    Ok(Topology::from_spec(&spec, &hosts)?)
}

/// Reads an MRNet topology file; errors carry the file name, line and column.
pub fn read_mrnet(path: &Path) -> anyhow::Result<Topology> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Topology::parse_mrnet(&text).with_context(|| format!("in {}", path.display()))
}
