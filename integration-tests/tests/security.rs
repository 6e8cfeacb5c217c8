//! A tree of real processes on mutual TLS, tried as a stranger would: plaintext, certificates of another CA, an
//! impostor parent, the wrong role, a token that grants read only, a flood of silent connections. Each is refused
//! with a precise status, and the real ranks lose nothing.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock; no runtime worker is blocked for long"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use canopy_integration_tests::{Proc, read_rounds, reader, start_frontend, wait_for};
use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::tree_client::TreeClient;
use canopy_proto::v1::{
    CloseStreamRequest, ListStreamsRequest, NodeKind, TopologyRequest, UpMessage, up_message,
};
use canopy_runtime::tls::{Authority, Role, Tls, write_private};
use tonic::Code;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// A CA of the test's own, so it can issue every role (the support's CA key is thrown away).
struct Site {
    dir: PathBuf,
    ca: Authority,
}

impl Site {
    fn new(dir: &Path, name: &str) -> Site {
        let dir = dir.join(name);
        canopy_runtime::tls::make_private_dir(&dir).unwrap();
        let ca = Authority::new(name, 1).unwrap();
        write_private(&dir.join("ca.pem"), ca.cert_pem().as_bytes()).unwrap();
        Site { dir, ca }
    }

    /// Issues a certificate; returns its (cert, key) paths.
    fn issue(&self, role: Role, name: &str) -> (PathBuf, PathBuf) {
        let issued = self.ca.issue(role, name, &[], 1).unwrap();
        let cert = self.dir.join(format!("{name}.pem"));
        let key = self.dir.join(format!("{name}.key"));
        write_private(&cert, issued.cert_pem.as_bytes()).unwrap();
        write_private(&key, issued.key_pem.as_bytes()).unwrap();
        (cert, key)
    }

    /// A daemon's TLS flags with a node certificate of this CA.
    fn node_flags(&self, name: &str) -> Vec<String> {
        let (cert, key) = self.issue(Role::Node, name);
        [
            "--tls-ca".into(),
            self.dir.join("ca.pem").display().to_string(),
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
        ]
        .to_vec()
    }

    /// A client's TLS settings: this CA's trust, and a certificate of `role` if given.
    fn client(&self, role: Option<Role>) -> ClientTlsConfig {
        let ca = std::fs::read_to_string(self.dir.join("ca.pem")).unwrap();
        match role {
            Some(role) => {
                let (cert, key) = self.issue(role, &format!("client-{}", role.word()));
                let tls = Tls::from_pem(
                    &ca,
                    &std::fs::read_to_string(cert).unwrap(),
                    &std::fs::read_to_string(key).unwrap(),
                );
                tls.client()
            }
            None => ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .domain_name(canopy_runtime::tls::NODE_NAME),
        }
    }
}

async fn connect(addr: &str, tls: Option<ClientTlsConfig>) -> Result<Channel, tonic::transport::Error> {
    match tls {
        Some(tls) => {
            Endpoint::from_shared(format!("https://{addr}"))?
                .tls_config(tls)?
                .connect()
                .await
        }
        None => Endpoint::from_shared(format!("http://{addr}"))?.connect().await,
    }
}

fn bearer(token: Option<String>) -> impl tonic::service::Interceptor + Clone {
    move |mut req: tonic::Request<()>| {
        if let Some(t) = &token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(req)
    }
}

/// ListStreams (needs read) and CloseStream of a stream that does not exist (needs control; past the gate it is
/// NotFound), as the given client: the two codes.
async fn try_roles(addr: &str, tls: Option<ClientTlsConfig>, token: Option<&str>) -> (Code, Code) {
    let channel = match connect(addr, tls).await {
        Ok(c) => c,
        Err(_) => return (Code::Unavailable, Code::Unavailable),
    };
    let mut client = FrontendClient::with_interceptor(channel, bearer(token.map(str::to_string)));
    let read = match client.list_streams(ListStreamsRequest::default()).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    let control = match client.close_stream(CloseStreamRequest { stream_id: 999 }).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    (read, control)
}

fn agent_args<'a>(id: &'a str, parent: &'a str, ranks: &'a str) -> Vec<&'a str> {
    vec![
        "--node-id",
        id,
        "--parent",
        parent,
        "--socket",
        "none",
        "--simulate-ranks",
        ranks,
        "--simulate-period-ms",
        "20",
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_are_enforced_and_strangers_cannot_read_control_or_attach() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::new(dir.path(), "site");
    let tokens = dir.path().join("tokens");
    write_private(
        &tokens,
        b"read rrrrrrrrrrrrrrrrrrrrrrrr\ncontrol cccccccccccccccccccccccc\n",
    )
    .unwrap();
    let mut fe_args: Vec<String> = [
        "--expect-ranks",
        "8",
        "--stream-timeout-ms",
        "500",
        "--token-file",
    ]
    .map(String::from)
    .to_vec();
    fe_args.push(tokens.display().to_string());
    fe_args.extend(site.node_flags("frontend"));
    let fe_args: Vec<&str> = fe_args.iter().map(String::as_str).collect();
    let (mut fe, addr, store) = start_frontend(dir.path(), &fe_args);
    let mut agent_flags: Vec<String> = agent_args("agent-0", &addr, "8")
        .into_iter()
        .map(String::from)
        .collect();
    agent_flags.extend(site.node_flags("agent"));
    let agent_flags: Vec<&str> = agent_flags.iter().map(String::as_str).collect();
    let _agent = Proc::start(dir.path(), "canopy-agent", "agent-0", &agent_flags);
    wait_for("rounds over TLS", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 3
    });

    // Who gets what: (ListStreams, CloseStream of a stream that does not exist).
    let other = Site::new(dir.path(), "other");
    let cases = [
        ("plaintext", None, None, (Code::Unavailable, Code::Unavailable)),
        (
            "TLS, no credentials",
            Some(site.client(None)),
            None,
            (Code::Unauthenticated, Code::Unauthenticated),
        ),
        (
            "read token",
            Some(site.client(None)),
            Some("rrrrrrrrrrrrrrrrrrrrrrrr"),
            (Code::Ok, Code::PermissionDenied),
        ),
        (
            "control token",
            Some(site.client(None)),
            Some("cccccccccccccccccccccccc"),
            (Code::Ok, Code::NotFound),
        ),
        (
            "an unknown token",
            Some(site.client(None)),
            Some("xxxxxxxxxxxxxxxxxxxxxxxx"),
            (Code::Unauthenticated, Code::Unauthenticated),
        ),
        (
            "read certificate",
            Some(site.client(Some(Role::Read))),
            None,
            (Code::Ok, Code::PermissionDenied),
        ),
        (
            "control certificate",
            Some(site.client(Some(Role::Control))),
            None,
            (Code::Ok, Code::NotFound),
        ),
        (
            "node certificate",
            Some(site.client(Some(Role::Node))),
            None,
            (Code::PermissionDenied, Code::PermissionDenied),
        ),
        (
            "control certificate of another CA",
            Some(other.client(Some(Role::Control))),
            None,
            (Code::Unavailable, Code::Unavailable),
        ),
    ];
    for (who, tls, token, expect) in cases {
        let got = try_roles(&addr, tls, token).await;
        // A connection that fails below gRPC (a failed handshake, plaintext against TLS) surfaces as Unavailable,
        // Unknown, Internal or Cancelled depending on when the client sees it: all mean no call was served.
        let norm = |c: Code| match c {
            Code::Unknown | Code::Internal | Code::Cancelled => Code::Unavailable,
            c => c,
        };
        assert_eq!((norm(got.0), norm(got.1)), expect, "{who}");
    }
    // The refusal says what was needed and what the caller held.
    let channel = connect(&addr, Some(site.client(None))).await.unwrap();
    let mut reader_client =
        FrontendClient::with_interceptor(channel, bearer(Some("rrrrrrrrrrrrrrrrrrrrrrrr".into())));
    let status = reader_client
        .close_stream(CloseStreamRequest { stream_id: 1 })
        .await
        .unwrap_err();
    assert_eq!(
        status.message(),
        "/canopy.v1.Frontend/CloseStream needs control, and the caller holds read"
    );

    // A child with a node certificate of another CA cannot attach; one with a control token cannot either, and
    // what it sends is never read (the front-end does not grow by its 64 MiB).
    let mut stranger_flags: Vec<String> = [
        "--node-id",
        "stranger",
        "--parent",
        &addr,
        "--listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    stranger_flags.extend(other.node_flags("stranger"));
    let ready = dir.path().join("stranger.ready");
    stranger_flags.extend(["--ready-file".to_string(), ready.display().to_string()]);
    let stranger_flags: Vec<&str> = stranger_flags.iter().map(String::as_str).collect();
    let mut stranger = Proc::start(dir.path(), "canopy-relay", "stranger", &stranger_flags);
    canopy_integration_tests::wait_ready_file(&ready, &mut stranger);
    wait_for("the stranger's failed attempt", Duration::from_secs(10), || {
        stranger.log_text().contains("cannot reach parent")
    });
    let rss_before = fe.rss_kib();
    let channel = connect(&addr, Some(site.client(None))).await.unwrap();
    let mut tree = TreeClient::with_interceptor(channel, bearer(Some("cccccccccccccccccccccccc".into())))
        .max_encoding_message_size(usize::MAX);
    let big = UpMessage {
        msg: Some(up_message::Msg::Names(canopy_proto::v1::NameDictionary {
            names: vec![canopy_proto::v1::EventName {
                id: 1,
                name: "x".repeat(64 << 20),
            }],
        })),
    };
    let status = tree
        .attach(tokio_stream::iter([big]))
        .await
        .expect_err("a token holder attached as a child");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("needs a node certificate"),
        "{}",
        status.message()
    );
    let grown = fe.rss_kib().saturating_sub(rss_before);
    assert!(grown < 50 * 1024, "the front-end grew by {grown} KiB");

    // Neither stranger shows in the tree.
    let channel = connect(&addr, Some(site.client(Some(Role::Read)))).await.unwrap();
    let topology = FrontendClient::new(channel)
        .topology(TopologyRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = topology.nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert!(!ids.contains(&"stranger"), "{ids:?}");
    assert_eq!(
        topology
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Agent as i32)
            .count(),
        1,
        "{ids:?}"
    );

    // The real ranks lost nothing: every round stored so far is whole.
    let before = read_rounds(&store).len();
    wait_for("more rounds", Duration::from_secs(20), || {
        read_rounds(&store).len() >= before + 5
    });
    for r in read_rounds(&store) {
        assert_eq!((r.covered, r.expected), (8, 8), "{r:?}");
    }
    drop(stranger);
    fe.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn a_child_refuses_an_impostor_parent_and_attaches_to_the_real_one_on_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let listen = canopy_integration_tests::unused_addr();
    // The impostor: a front-end with a certificate of its own CA, on the address the agent's parent had.
    let impostor_dir = dir.path().join("impostor");
    std::fs::create_dir_all(&impostor_dir).unwrap();
    let other = Site::new(dir.path(), "other");
    let mut args: Vec<String> = ["--listen", &listen, "--expect-ranks", "4"]
        .map(String::from)
        .to_vec();
    args.extend(other.node_flags("impostor"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (impostor, _, impostor_store) = canopy_integration_tests::start_frontend(&impostor_dir, &args);
    let agent = Proc::start(
        dir.path(),
        "canopy-agent",
        "agent-0",
        &agent_args("agent-0", &listen, "4"),
    );
    wait_for(
        "the agent's refusal of the impostor",
        Duration::from_secs(10),
        || agent.log_text().contains("cannot reach parent"),
    );
    std::thread::sleep(Duration::from_secs(1));
    let log = agent.log_text();
    assert!(log.contains("certificate"), "{log}");
    // The impostor got nothing: no child, no round.
    let nodes = reader(&impostor_store).nodes().unwrap();
    assert!(nodes.iter().all(|n| n.kind == NodeKind::Frontend), "{nodes:?}");
    assert!(read_rounds(&impostor_store).is_empty());
    drop(impostor);

    // The real front-end on the same address: the agent, still retrying, attaches and its ranks are whole.
    let real_dir = dir.path().join("real");
    std::fs::create_dir_all(&real_dir).unwrap();
    let (_fe, _, store) = start_frontend(&real_dir, &["--listen", &listen, "--expect-ranks", "4"]);
    wait_for("rounds at the real front-end", Duration::from_secs(30), || {
        read_rounds(&store).len() >= 3
    });
    for r in read_rounds(&store) {
        assert_eq!((r.covered, r.expected), (4, 4), "{r:?}");
    }
    drop(agent);
}

#[test]
fn silent_connections_and_stalled_handshakes_are_closed_and_a_listener_keeps_its_limit() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (fe, addr, _store) = start_frontend(dir.path(), &["--max-connections", "200"]);
    let rss_before = fe.rss_kib();
    let mut flood: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // The connections beyond the limit are closed as they come.
    std::thread::sleep(Duration::from_millis(500));
    let mut closed_at_once = 0;
    for s in &mut flood {
        s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        let mut byte = [0u8; 1];
        if matches!(s.read(&mut byte), Ok(0)) {
            closed_at_once += 1;
        }
    }
    assert_eq!(closed_at_once, 100, "connections closed at once for the limit");
    // Some of the others begin a TLS handshake and stall: the start of a record that promises 255 bytes.
    for s in flood.iter_mut().take(50) {
        use std::io::Write;
        let _ = s.write_all(&[0x16, 0x03, 0x01, 0x00, 0xff]);
    }
    // The silent ones are closed once the first-byte time-out (10 s) passes, the stalled handshakes once the
    // handshake time-out (10 s) does.
    std::thread::sleep(Duration::from_secs(11));
    let mut open = 0;
    for s in &mut flood {
        let mut byte = [0u8; 1];
        if let Err(e) = s.read(&mut byte)
            && e.kind() == std::io::ErrorKind::WouldBlock
        {
            open += 1;
        }
    }
    assert_eq!(open, 0, "silent connections still open after 11 s");
    let grown = fe.rss_kib().saturating_sub(rss_before);
    assert!(grown < 50 * 1024, "the front-end grew by {grown} KiB");
    // The API answers at once.
    let started = Instant::now();
    let out = canopy_integration_tests::canopy_cli(&["streams", "list", "--frontend", &addr]);
    assert!(out.contains("stats"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop(flood);
}

#[test]
fn strangers_on_the_agent_socket_cost_it_no_memory_and_are_cut_off() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let dir = tempfile::tempdir().unwrap();
    let (_fe, addr, _store) = start_frontend(dir.path(), &[]);
    let socket = dir.path().join("sock/agent.sock");
    let agent = canopy_integration_tests::start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_for("the agent's socket", Duration::from_secs(20), || {
        UnixStream::connect(&socket).is_ok()
    });
    std::thread::sleep(Duration::from_millis(300));
    let rss_before = agent.rss_kib();
    // 48 connections that claim a 16 MiB frame, 48 that claim 1 MiB (the limit) and send 10 bytes of it.
    let mut over: Vec<UnixStream> = (0..48).map(|_| UnixStream::connect(&socket).unwrap()).collect();
    for s in &mut over {
        s.write_all(&(16u32 << 20).to_le_bytes()).unwrap();
    }
    let mut stalled: Vec<UnixStream> = (0..48).map(|_| UnixStream::connect(&socket).unwrap()).collect();
    for s in &mut stalled {
        s.write_all(&(1u32 << 20).to_le_bytes()).unwrap();
        s.write_all(&[0u8; 10]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = agent.rss_kib().saturating_sub(rss_before);
    assert!(grown < 50 * 1024, "the agent grew by {grown} KiB");
    // A frame over the limit ends its connection at once.
    let ended = |s: &mut UnixStream, wait: Duration| {
        s.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    };
    for s in &mut over {
        assert!(ended(s, Duration::from_secs(2)), "a 16 MiB claim was kept open");
    }
    // A frame whose bytes stop coming ends its connection after the body time-out (10 s).
    std::thread::sleep(Duration::from_secs(10));
    for s in &mut stalled {
        assert!(ended(s, Duration::from_secs(2)), "a stalled frame was kept open");
    }
    // (A connection that never said hello is closed without a log line: nothing of a rank's is lost.)
    let grown = agent.rss_kib().saturating_sub(rss_before);
    assert!(grown < 50 * 1024, "the agent grew by {grown} KiB");
}
