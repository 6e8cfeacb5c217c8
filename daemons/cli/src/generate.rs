//! `canopy completions SHELL` and `canopy man`: shell completions and man pages written from the command's own
//! definition, so they follow every subcommand and flag the CLI has. deploy/install.sh installs both. `canopy
//! descriptors`: the protobuf descriptors of everything Canopy sends, for readers in other languages.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap_complete::Shell;

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(clap::Args)]
pub struct ManArgs {
    /// Write one page per command and subcommand (canopy.1, canopy-up.1, canopy-streams-list.1, ...) into this
    /// directory, made if absent. Without it the page of `canopy` itself is printed.
    #[arg(short = 'o', long = "output", visible_alias = "out", value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct DescriptorsArgs {
    /// Write the descriptor set to this file; without it, to standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Writes Canopy's encoded `google.protobuf.FileDescriptorSet`: every message the API, the tree and the bundled
/// filters send (`canopy.v1.RoundUpdate`, the filters' results), with the well-known types they import, so a
/// Kafka consumer or any protobuf library decodes them without Canopy's sources.
pub fn descriptors(args: DescriptorsArgs) -> anyhow::Result<()> {
    let set = canopy_proto::FILE_DESCRIPTOR_SET;
    match &args.output {
        Some(path) => std::fs::write(path, set).with_context(|| format!("cannot write {}", path.display())),
        None => std::io::stdout()
            .write_all(set)
            .context("cannot write the descriptors"),
    }
}

/// The completion script for `shell`.
pub fn completion_script(mut cmd: clap::Command, shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "canopy", &mut script);
    script
}

/// Every man page: the file name (`canopy-up.1`) and the roff text, the command's own page first, then its
/// subcommands' depth first. Hidden subcommands get none.
pub fn man_pages(cmd: clap::Command) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    fn walk(cmd: clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> anyhow::Result<()> {
        let subcommands: Vec<clap::Command> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
            .collect();
        let man = clap_mangen::Man::new(cmd)
            .source(format!("canopy {}", env!("CARGO_PKG_VERSION")))
            .manual("Canopy");
        let mut text = Vec::new();
        man.render(&mut text).context("rendering a man page")?;
        pages.push((man.get_filename(), text));
        for sub in subcommands {
            walk(sub, pages)?;
        }
        Ok(())
    }
    // Built, the subcommands carry their full names (`canopy-up`), which name their pages.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    walk(cmd, &mut pages)?;
    Ok(pages)
}

pub fn completions(cmd: clap::Command, args: CompletionsArgs) -> anyhow::Result<()> {
    std::io::stdout()
        .lock()
        .write_all(&completion_script(cmd, args.shell))
        .context("writing the completion script to stdout")
}

pub fn man(cmd: clap::Command, args: ManArgs) -> anyhow::Result<()> {
    let pages = man_pages(cmd)?;
    let Some(dir) = args.out else {
        return std::io::stdout()
            .lock()
            .write_all(&pages[0].1)
            .context("writing the man page to stdout");
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
    for (name, text) in &pages {
        write(&dir.join(name), text)?;
    }
    Ok(())
}

fn write(path: &Path, text: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
