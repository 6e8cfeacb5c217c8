//! `canopy certs`: the certificates of a tree. A CA for a site (`ca`), node and client certificates signed by it
//! (`issue`), or the whole set for one run with a CA that is thrown away (`run`, what `canopy up` and
//! `canopy-run` do by themselves).

use std::path::{Path, PathBuf};

use anyhow::Context;
use canopy_runtime::tls::{Authority, Role, write_private};

#[derive(clap::Subcommand, Debug)]
pub enum CertsCmd {
    /// Make a CA: DIR/ca.pem (give it to every daemon and client) and DIR/ca.key (keep it safe).
    Ca {
        dir: PathBuf,
        /// The CA's name.
        #[arg(long, default_value = "canopy CA")]
        name: String,
        #[arg(long, default_value_t = 3650)]
        days: u32,
        /// Replace files that exist.
        #[arg(long)]
        force: bool,
    },
    /// Sign a certificate with a CA made by `canopy certs ca`: writes OUT/NAME.pem and OUT/NAME.key.
    Issue {
        /// The CA's directory (ca.pem and ca.key).
        #[arg(long)]
        ca: PathBuf,
        /// node (a daemon of the tree), control (an API client that may change the run) or read.
        #[arg(long)]
        role: Role,
        /// The certificate's name, and its files' names.
        #[arg(long)]
        name: String,
        /// Host names or addresses a node's certificate is also valid for (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Where the files go.
        #[arg(
            short = 'o',
            long = "output",
            visible_alias = "out",
            value_name = "DIR",
            default_value = "."
        )]
        out: PathBuf,
        /// Replace files that exist.
        #[arg(long)]
        force: bool,
    },
    /// Everything one tree needs, with a CA whose key is not kept: ca.pem, node.pem/.key, client.pem/.key
    /// (control), token and tokens (a control bearer token and the front-end's token file).
    Run {
        dir: PathBuf,
        /// Host names or addresses the node certificate is also valid for (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 30)]
        days: u32,
        /// Replace files that exist.
        #[arg(long)]
        force: bool,
    },
}

pub fn run(cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd {
        CertsCmd::Ca {
            dir,
            name,
            days,
            force,
        } => {
            let ca = Authority::new(&name, days)?;
            canopy_runtime::tls::make_private_dir(&dir)?;
            write_new(&dir.join("ca.pem"), ca.cert_pem(), force)?;
            write_new(&dir.join("ca.key"), &ca.key_pem(), force)?;
            println!(
                "CA {name:?}: {} and {}",
                dir.join("ca.pem").display(),
                dir.join("ca.key").display()
            );
        }
        CertsCmd::Issue {
            ca,
            role,
            name,
            hosts,
            days,
            out,
            force,
        } => {
            let read = |file: &str| {
                let path = ca.join(file);
                std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
            };
            let authority = Authority::load(&read("ca.pem")?, &read("ca.key")?)
                .with_context(|| format!("{} is not a CA made by `canopy certs ca`", ca.display()))?;
            let issued = authority.issue(role, &name, &hosts, days)?;
            std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
            let cert = out.join(format!("{name}.pem"));
            let key = out.join(format!("{name}.key"));
            write_new(&cert, &issued.cert_pem, force)?;
            write_new(&key, &issued.key_pem, force)?;
            println!(
                "{} certificate {name:?}: {} and {}",
                role.word(),
                cert.display(),
                key.display()
            );
        }
        CertsCmd::Run {
            dir,
            hosts,
            days,
            force,
        } => {
            let creds = canopy_runtime::tls::write_credentials(&dir, &hosts, days, force)?;
            println!("run credentials in {}", creds.dir.display());
        }
    }
    Ok(())
}

fn write_new(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        force || !path.exists(),
        "{} exists already (give --force to replace it)",
        path.display()
    );
    write_private(path, text.as_bytes())?;
    Ok(())
}
