//! Mutual TLS for the tree and the API: which files a daemon or client reads, what they must hold, and the
//! rustls settings made from them (through tonic).
//!
//! Every certificate is signed by the tree's CA. What a certificate may do is in its names (subject alternative
//! DNS names), so any CA tooling can issue them:
//!
//! | name | role |
//! |---|---|
//! | `canopy-node` | a daemon of the tree: serves children and attaches to a parent (`Tree/Attach`) |
//! | `canopy-control` | an API client that may also change the run (CreateStream, CloseStream, Control) |
//! | `canopy-read` | an API client that reads (Subscribe, ListStreams, Topology, EventNames, reflection) |
//!
//! A child checks that its parent's certificate is valid for `canopy-node`: any daemon of the tree, not a
//! particular host, is a parent it trusts. Plaintext needs `insecure = true` and is refused on any address that is
//! not loopback.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::config::ConfigIssue;

/// The name every daemon's certificate carries, and the name a child checks its parent's against.
pub const NODE_NAME: &str = "canopy-node";

/// How long a TLS handshake may take, either side: a peer that connects and says nothing is dropped after it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a certificate (or a bearer token) allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read results and the tree's state.
    Read,
    /// Read, and change the run.
    Control,
    /// Be a daemon of the tree.
    Node,
}

impl Role {
    /// The subject alternative name that grants the role.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "canopy-read",
            Role::Control => "canopy-control",
            Role::Node => NODE_NAME,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Control => "control",
            Role::Node => "node",
        }
    }

    /// The roles a verified certificate grants, from its names.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Vec<Role> {
        let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
            return Vec::new();
        };
        [Role::Read, Role::Control, Role::Node]
            .into_iter()
            .filter(|role| {
                ServerName::try_from(role.name())
                    .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
            })
            .collect()
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Role::Read),
            "control" => Ok(Role::Control),
            "node" => Ok(Role::Node),
            other => Err(format!("unknown role `{other}` (read, control or node)")),
        }
    }
}

/// The TLS keys of a daemon's configuration, as given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub insecure: bool,
}

impl TlsFiles {
    /// The files of a directory `canopy certs` or `canopy up` wrote, for `who` (`node` or `client`).
    pub fn in_dir(dir: &Path, who: &str) -> Self {
        Self {
            ca: Some(dir.join("ca.pem")),
            cert: Some(dir.join(format!("{who}.pem"))),
            key: Some(dir.join(format!("{who}.key"))),
            insecure: false,
        }
    }

    /// What the types cannot check: TLS needs all three files unless `insecure`, and plaintext only on loopback.
    /// `addrs` are the configuration's addresses by key (`listen`, `parent`).
    pub fn check(&self, addrs: &[(&str, &str)]) -> Result<(), ConfigIssue> {
        if self.insecure {
            if let Some((key, addr)) = addrs.iter().find(|(_, addr)| !is_loopback(addr)) {
                return Err(ConfigIssue::new(
                    "insecure",
                    format!(
                        "plaintext is allowed on loopback addresses only, and `{key}` is {addr}: give tls_ca, \
                         tls_cert and tls_key instead (`canopy certs` makes them)"
                    ),
                ));
            }
            return Ok(());
        }
        for (key, value) in [
            ("tls_ca", &self.ca),
            ("tls_cert", &self.cert),
            ("tls_key", &self.key),
        ] {
            if value.is_none() {
                return Err(ConfigIssue::new(
                    key,
                    "TLS needs tls_ca, tls_cert and tls_key (`canopy certs` makes them); plaintext needs \
                     insecure = true and loopback addresses",
                ));
            }
        }
        Ok(())
    }

    /// Reads and checks the files; `None` when plaintext was asked for.
    pub fn load(&self) -> Result<Option<Tls>, TlsError> {
        if self.insecure {
            return Ok(None);
        }
        let (Some(ca), Some(cert), Some(key)) = (&self.ca, &self.cert, &self.key) else {
            return Err(TlsError::Incomplete);
        };
        Tls::load(ca, cert, key).map(Some)
    }
}

/// Whether an address (`host:port`, `[v6]:port`, a host alone) names this machine's loopback.
pub fn is_loopback(addr: &str) -> bool {
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    if let Ok(sock) = addr.parse::<std::net::SocketAddr>() {
        return sock.ip().is_loopback();
    }
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) && !host.is_empty() => host,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS needs tls_ca, tls_cert and tls_key")]
    Incomplete,
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key")]
    NoKey { path: PathBuf },
    #[error("{path} is readable by other users (mode {mode:o}): a private key must not be; chmod 600 it")]
    KeyExposed { path: PathBuf, mode: u32 },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} exists already (give --force to replace it)")]
    Exists { path: PathBuf },
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A daemon's or client's loaded TLS material: the CA it trusts and its own certificate and key.
#[derive(Clone)]
pub struct Tls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the CA, the certificate and the key (PEM), each checked so a bad file is named now rather than at
    /// the first handshake.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let (ca_pem, cert_pem, key_pem) = (read(ca)?, read(cert)?, read(key)?);
        for (path, pem) in [(ca, &ca_pem), (cert, &cert_pem)] {
            if !CertificateDer::pem_slice_iter(pem).any(|c| c.is_ok()) {
                return Err(TlsError::NoCertificate {
                    path: path.to_path_buf(),
                });
            }
        }
        if PrivateKeyDer::from_pem_slice(&key_pem).is_err() {
            return Err(TlsError::NoKey {
                path: key.to_path_buf(),
            });
        }
        let mode = std::fs::metadata(key)
            .map_err(|source| TlsError::Read {
                path: key.to_path_buf(),
                source,
            })?
            .permissions()
            .mode();
        if mode & 0o004 != 0 {
            return Err(TlsError::KeyExposed {
                path: key.to_path_buf(),
                mode: mode & 0o777,
            });
        }
        Ok(Self {
            ca: ca_pem,
            cert: cert_pem,
            key: key_pem,
        })
    }

    /// From PEM text already in memory (tests, in-process trees).
    pub fn from_pem(ca: &str, cert: &str, key: &str) -> Self {
        Self {
            ca: ca.as_bytes().to_vec(),
            cert: cert.as_bytes().to_vec(),
            key: key.as_bytes().to_vec(),
        }
    }

    /// The server side: this certificate, and clients' certificates checked against the CA. With
    /// `client_cert_required` a peer without one cannot finish the handshake (the tree's relays); without it, the
    /// peer may present none and be judged per call (the front-end's API, where a bearer token also admits).
    pub fn server(&self, client_cert_required: bool) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .client_auth_optional(!client_cert_required)
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The client side: this certificate, and the server's checked against the CA and [`NODE_NAME`].
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(NODE_NAME)
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// A certificate authority made here: it signs the node and client certificates of one tree or site.
pub struct Authority {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Authority {
    /// A new CA named `name`, valid for `days` from now.
    pub fn new(name: &str, days: u32) -> Result<Self, TlsError> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        validity(&mut params, days);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// A CA made earlier, from its certificate and key (PEM), to issue more certificates.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = rcgen::KeyPair::from_pem(key_pem)?;
        Ok(Self {
            issuer: rcgen::Issuer::from_ca_cert_pem(cert_pem, key)?,
            cert_pem: cert_pem.to_string(),
        })
    }

    /// The CA's key, PEM: whoever holds it can make certificates the tree trusts.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The CA's certificate, PEM: what every daemon and client trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for `role`, named `common_name`; a node's also carries `hosts` (DNS names or IP addresses),
    /// for clients that check a host rather than [`NODE_NAME`].
    pub fn issue(
        &self,
        role: Role,
        common_name: &str,
        hosts: &[String],
        days: u32,
    ) -> Result<Issued, TlsError> {
        let mut names = vec![role.name().to_string()];
        if role == Role::Node {
            names.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
            names.extend(hosts.iter().cloned());
        }
        names.dedup();
        let mut params = rcgen::CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name.to_string());
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match role {
            Role::Node => vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Read | Role::Control => vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
        };
        validity(&mut params, days);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn validity(params: &mut rcgen::CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // A little before now: clocks of a cluster's nodes differ.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// What a credentials directory holds once [`write_credentials`] has run.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub dir: PathBuf,
    /// The control client's bearer token (also in `DIR/token`).
    pub token: String,
}

impl Credentials {
    /// The node certificate's files (every daemon of the tree uses them).
    pub fn node(&self) -> TlsFiles {
        TlsFiles::in_dir(&self.dir, "node")
    }

    /// The control client's files (the `canopy` command).
    pub fn client(&self) -> TlsFiles {
        TlsFiles::in_dir(&self.dir, "client")
    }

    /// The token file the front-end reads.
    pub fn tokens(&self) -> PathBuf {
        self.dir.join("tokens")
    }
}

/// Makes a CA and writes, into `dir` (created 0700, files 0600): `ca.pem`; `node.pem`/`node.key` for every
/// daemon (valid for `hosts` too); `client.pem`/`client.key` with the control role for the `canopy` command;
/// `token` (a control bearer token for grpcurl) and `tokens` (the front-end's token file). The CA's key is not
/// kept: no further certificate can be made for this tree. `force` replaces files that exist.
pub fn write_credentials(
    dir: &Path,
    hosts: &[String],
    days: u32,
    force: bool,
) -> Result<Credentials, TlsError> {
    let ca = Authority::new("canopy run CA", days)?;
    let node = ca.issue(Role::Node, "canopy node", hosts, days)?;
    let client = ca.issue(Role::Control, "canopy client", &[], days)?;
    let token = new_token()?;
    make_private_dir(dir)?;
    let files: [(&str, &str); 7] = [
        ("ca.pem", ca.cert_pem()),
        ("node.pem", &node.cert_pem),
        ("node.key", &node.key_pem),
        ("client.pem", &client.cert_pem),
        ("client.key", &client.key_pem),
        ("token", &format!("{token}\n")),
        ("tokens", &format!("# role token\ncontrol {token}\n")),
    ];
    for (name, _) in &files {
        let path = dir.join(name);
        if !force && path.exists() {
            return Err(TlsError::Exists { path });
        }
    }
    for (name, text) in files {
        write_private(&dir.join(name), text.as_bytes())?;
    }
    Ok(Credentials {
        dir: dir.to_path_buf(),
        token,
    })
}

/// A new bearer token: 32 random bytes, hex.
pub fn new_token() -> Result<String, TlsError> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    let path = Path::new("/dev/urandom");
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

pub fn make_private_dir(dir: &Path) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)
}

/// Writes a file only its owner can read, created with that mode (never readable by others, even briefly).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    file.write_all(bytes).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses() {
        for addr in [
            "127.0.0.1:7400",
            "localhost:1",
            "[::1]:7400",
            "127.3.4.5:0",
            "::1",
        ] {
            assert!(is_loopback(addr), "{addr}");
        }
        for addr in [
            "0.0.0.0:7400",
            "10.0.0.1:7400",
            "node1:7400",
            "[::]:7400",
            "example.org",
        ] {
            assert!(!is_loopback(addr), "{addr}");
        }
    }

    #[test]
    fn insecure_is_refused_off_loopback() {
        let files = TlsFiles {
            insecure: true,
            ..Default::default()
        };
        assert!(files.check(&[("listen", "127.0.0.1:0")]).is_ok());
        let issue = files
            .check(&[("listen", "127.0.0.1:0"), ("parent", "node7:7400")])
            .unwrap_err();
        assert_eq!(issue.key, "insecure");
        assert!(
            issue.message.contains("`parent` is node7:7400"),
            "{}",
            issue.message
        );
    }

    #[test]
    fn tls_needs_all_three_files() {
        let files = TlsFiles {
            ca: Some("ca.pem".into()),
            cert: Some("node.pem".into()),
            ..Default::default()
        };
        assert_eq!(files.check(&[]).unwrap_err().key, "tls_key");
        assert_eq!(TlsFiles::default().check(&[]).unwrap_err().key, "tls_ca");
    }

    #[test]
    fn issued_certificates_carry_their_roles_and_files_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("tls");
        let creds = write_credentials(&run, &["node7".into()], 1, false).unwrap();
        assert_eq!(
            std::fs::metadata(&run).unwrap().permissions().mode() & 0o777,
            0o700
        );
        for name in [
            "ca.pem",
            "node.pem",
            "node.key",
            "client.pem",
            "client.key",
            "token",
            "tokens",
        ] {
            let mode = std::fs::metadata(run.join(name)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        let roles = |name: &str| {
            let pem = std::fs::read(run.join(name)).unwrap();
            Role::of_certificate(&CertificateDer::from_pem_slice(&pem).unwrap())
        };
        assert_eq!(roles("node.pem"), vec![Role::Node]);
        assert_eq!(roles("client.pem"), vec![Role::Control]);
        assert!(roles("ca.pem").is_empty());
        assert!(creds.node().load().unwrap().is_some());
        assert_eq!(creds.token.len(), 64);
        // Written once: a second run without force names the file in the way.
        assert!(matches!(
            write_credentials(&run, &[], 1, false),
            Err(TlsError::Exists { .. })
        ));
        assert!(write_credentials(&run, &[], 1, true).is_ok());
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let creds = write_credentials(&dir.path().join("tls"), &[], 1, false).unwrap();
        let key = creds.dir.join("node.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = creds.node().load().unwrap_err();
        assert!(matches!(err, TlsError::KeyExposed { mode: 0o644, .. }), "{err}");
    }

    #[test]
    fn files_that_are_not_pem_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let creds = write_credentials(&dir.path().join("tls"), &[], 1, false).unwrap();
        std::fs::write(creds.dir.join("ca.pem"), "not a certificate").unwrap();
        let err = creds.node().load().unwrap_err();
        assert!(
            err.to_string().ends_with("ca.pem holds no PEM certificate"),
            "{err}"
        );
    }
}
