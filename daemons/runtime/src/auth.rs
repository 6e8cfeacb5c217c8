//! Who may call what: every call on a daemon's port passes the [`Gate`], which finds what the call needs from its
//! path and what the caller holds from its client certificate (verified against the tree's CA during the
//! handshake) or its bearer token, and refuses a call the caller may not make before any service sees it.
//!
//! | calls | need |
//! |---|---|
//! | `grpc.health.v1.Health/*` | nothing |
//! | `Frontend/Subscribe`, `ListStreams`, `Topology`, `EventNames`, server reflection | read (or control) |
//! | `Frontend/CreateStream`, `CloseStream`, `Control`, anything else | control |
//! | `Tree/Attach` | a node certificate |

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::Either;
use rustls_pki_types::CertificateDer;
use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::tls::Role;

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Nothing,
    Read,
    Control,
    Node,
}

impl Need {
    /// What the call at `path` (`/package.Service/Method`) needs.
    pub fn of_path(path: &str) -> Need {
        const READ: [&str; 4] = ["Subscribe", "ListStreams", "Topology", "EventNames"];
        if path.starts_with("/grpc.health.v1.Health/") {
            Need::Nothing
        } else if path.starts_with("/canopy.v1.Tree/") {
            Need::Node
        } else if path.starts_with("/grpc.reflection.") {
            Need::Read
        } else if let Some(method) = path.strip_prefix("/canopy.v1.Frontend/")
            && READ.contains(&method)
        {
            Need::Read
        } else {
            Need::Control
        }
    }

    fn word(self) -> &'static str {
        match self {
            Need::Nothing => "nothing",
            Need::Read => "read",
            Need::Control => "control",
            Need::Node => "a node certificate",
        }
    }

    fn met_by(self, role: Role) -> bool {
        match self {
            Need::Nothing => true,
            Need::Read => matches!(role, Role::Read | Role::Control),
            Need::Control => role == Role::Control,
            Need::Node => role == Role::Node,
        }
    }
}

/// The bearer tokens a front-end accepts, each with its role (read or control).
#[derive(Default, Clone)]
pub struct Tokens(Vec<(Role, Vec<u8>)>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} entries)", self.0.len())
    }
}

/// The shortest token a file may hold.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is readable by other users (mode {mode:o}): chmod 600 it")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

impl Tokens {
    /// Reads a token file: one `ROLE TOKEN` per line (role `read` or `control`), `#` comments and blank lines
    /// skipped. Tokens shorter than [`MIN_TOKEN_LEN`] are refused, and so is a file other users can read.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        use std::os::unix::fs::PermissionsExt;
        let read = |source| TokenFileError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(read)?.permissions().mode();
        if mode & 0o004 != 0 {
            return Err(TokenFileError::Exposed {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Self::parse(&text).map_err(|(line, message)| TokenFileError::Line {
            path: path.to_path_buf(),
            line,
            message,
        })
    }

    /// Parses a token file's text; the error is the line number and what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(role), Some(token), None) = (words.next(), words.next(), words.next()) else {
                return Err((i + 1, "expected `ROLE TOKEN` (role read or control)".into()));
            };
            let role = match role.parse::<Role>() {
                Ok(r @ (Role::Read | Role::Control)) => r,
                _ => return Err((i + 1, format!("role `{role}`: a token may grant read or control"))),
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err((
                    i + 1,
                    format!(
                        "a token of {} characters is too short (at least {MIN_TOKEN_LEN})",
                        token.len()
                    ),
                ));
            }
            tokens.push((role, token.as_bytes().to_vec()));
        }
        Ok(Self(tokens))
    }

    /// The role a presented token grants: every known token is compared, each in constant time.
    pub fn role_of(&self, presented: &[u8]) -> Option<Role> {
        let mut found = None;
        for (role, token) in &self.0 {
            if bool::from(token.as_slice().ct_eq(presented)) {
                found = Some(*role);
            }
        }
        found
    }
}

/// Decides every call on a port: see the module's table. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Gate {
    state: Arc<GateState>,
}

#[derive(Debug)]
struct GateState {
    /// Plaintext on loopback (`insecure`): there is no identity to check, every call passes.
    open: bool,
    tokens: Tokens,
    log: Mutex<crate::telemetry::EverySecond>,
}

impl Gate {
    /// A gate that checks certificates and `tokens`.
    pub fn new(tokens: Tokens) -> Self {
        Self::with(false, tokens)
    }

    /// The gate of a plaintext port: nothing to check.
    pub fn open() -> Self {
        Self::with(true, Tokens::default())
    }

    fn with(open: bool, tokens: Tokens) -> Self {
        Self {
            state: Arc::new(GateState {
                open,
                tokens,
                log: Mutex::new(crate::telemetry::EverySecond::default()),
            }),
        }
    }

    /// Whether the call may proceed; the refusal says what was missing.
    pub fn judge<B>(&self, req: &http::Request<B>) -> Result<(), Status> {
        let need = Need::of_path(req.uri().path());
        if need == Need::Nothing || self.state.open {
            return Ok(());
        }
        let tls = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>();
        let cert_roles = tls
            .and_then(|t| t.peer_certs())
            .and_then(|certs| {
                certs
                    .first()
                    .map(|c: &CertificateDer<'static>| Role::of_certificate(c))
            })
            .unwrap_or_default();
        let token = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        let token_role = token.and_then(|t| self.state.tokens.role_of(t));
        if cert_roles
            .iter()
            .chain(token_role.iter())
            .any(|r| need.met_by(*r))
        {
            return Ok(());
        }
        let status = if cert_roles.is_empty() && token_role.is_none() {
            match token {
                Some(_) => Status::unauthenticated("the bearer token is not one this front-end knows"),
                None => Status::unauthenticated(format!(
                    "{} needs {}: present a client certificate of the tree's CA or a bearer token",
                    req.uri().path(),
                    need.word()
                )),
            }
        } else {
            let held: Vec<&str> = cert_roles
                .iter()
                .chain(token_role.iter())
                .map(|r| r.word())
                .collect();
            Status::permission_denied(format!(
                "{} needs {}, and the caller holds {}",
                req.uri().path(),
                need.word(),
                held.join(" and ")
            ))
        };
        let peer = tls
            .map(|t| t.get_ref())
            .or_else(|| req.extensions().get::<TcpConnectInfo>())
            .and_then(|c| c.remote_addr())
            .map(|a| a.to_string())
            .unwrap_or_else(|| "an unknown peer".into());
        self.log_refusal(&peer, status.message());
        Err(status)
    }

    /// Refusals are logged with the peer, at most once a second, with how many were not.
    fn log_refusal(&self, peer: &str, why: &str) {
        let mut log = self.state.log.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = log.pass() {
            tracing::warn!(%peer, unlogged_since = held, "call refused: {why}");
        }
    }
}

impl<S> tower_layer::Layer<S> for Gate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Gated {
            inner,
            gate: self.clone(),
        }
    }
}

/// A service behind a [`Gate`].
#[derive(Clone, Debug)]
pub struct Gated<S> {
    inner: S,
    gate: Gate,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for Gated<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match self.gate.judge(&req) {
            Ok(()) => Either::Right(self.inner.call(req)),
            Err(status) => Either::Left(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_need_what_the_table_says() {
        assert_eq!(Need::of_path("/grpc.health.v1.Health/Check"), Need::Nothing);
        assert_eq!(Need::of_path("/canopy.v1.Tree/Attach"), Need::Node);
        assert_eq!(Need::of_path("/canopy.v1.Frontend/Subscribe"), Need::Read);
        assert_eq!(Need::of_path("/canopy.v1.Frontend/EventNames"), Need::Read);
        assert_eq!(
            Need::of_path("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            Need::Read
        );
        assert_eq!(Need::of_path("/canopy.v1.Frontend/Control"), Need::Control);
        assert_eq!(Need::of_path("/canopy.v1.Frontend/CreateStream"), Need::Control);
        assert_eq!(Need::of_path("/canopy.v1.Frontend/SubscribeX"), Need::Control);
        assert_eq!(Need::of_path("/other.Service/Method"), Need::Control);
    }

    #[test]
    fn token_files_parse_with_precise_errors() {
        let t = Tokens::parse("# comment\n\nread 0123456789abcdef\ncontrol fedcba9876543210xx\n").unwrap();
        assert_eq!(t.role_of(b"0123456789abcdef"), Some(Role::Read));
        assert_eq!(t.role_of(b"fedcba9876543210xx"), Some(Role::Control));
        assert_eq!(t.role_of(b"0123456789abcdeF"), None);
        assert_eq!(t.role_of(b""), None);
        assert_eq!(Tokens::parse("read short").unwrap_err().0, 1);
        assert!(
            Tokens::parse("\nnode 0123456789abcdef")
                .unwrap_err()
                .1
                .contains("read or control")
        );
        assert!(Tokens::parse("control").unwrap_err().1.contains("ROLE TOKEN"));
    }

    fn call(gate: &Gate, path: &str, token: Option<&str>) -> Result<(), tonic::Code> {
        let mut req = http::Request::builder().uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        gate.judge(&req.body(()).unwrap()).map_err(|s| s.code())
    }

    #[test]
    fn tokens_grant_their_role_only() {
        let gate = Gate::new(Tokens::parse("read rrrrrrrrrrrrrrrr\ncontrol cccccccccccccccc").unwrap());
        let control = "/canopy.v1.Frontend/Control";
        let subscribe = "/canopy.v1.Frontend/Subscribe";
        assert_eq!(call(&gate, "/grpc.health.v1.Health/Check", None), Ok(()));
        assert_eq!(call(&gate, subscribe, None), Err(tonic::Code::Unauthenticated));
        assert_eq!(call(&gate, subscribe, Some("rrrrrrrrrrrrrrrr")), Ok(()));
        assert_eq!(
            call(&gate, control, Some("rrrrrrrrrrrrrrrr")),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(call(&gate, control, Some("cccccccccccccccc")), Ok(()));
        assert_eq!(call(&gate, subscribe, Some("cccccccccccccccc")), Ok(()));
        assert_eq!(
            call(&gate, control, Some("wrongwrongwrongwrong")),
            Err(tonic::Code::Unauthenticated)
        );
        // A token never makes a node.
        assert_eq!(
            call(&gate, "/canopy.v1.Tree/Attach", Some("cccccccccccccccc")),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(call(&Gate::open(), control, None), Ok(()));
    }
}
