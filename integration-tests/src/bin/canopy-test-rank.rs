//! A rank that speaks the agent's socket protocol by hand, as a process of its own, so a test can run it as
//! another user: `canopy-test-rank SOCKET APP RANK NRANKS [ROUNDS]`. It says hello, prints `accepted` or
//! `refused: REASON` (exit 3), dumps rounds 0..ROUNDS, then holds its connection until its standard input closes.

use std::io::{BufRead, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use canopy_wire::v1::{AgentMessage, RankHello, RankMessage, agent_message, rank_message};
use canopy_wire::{RANK_PROTOCOL_VERSION, encode_frame, read_frame};

fn send(stream: &mut UnixStream, msg: rank_message::Msg) -> std::io::Result<()> {
    let mut frame = Vec::new();
    encode_frame(&RankMessage { msg: Some(msg) }, &mut frame);
    stream.write_all(&frame)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, app, rank, nranks, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: canopy-test-rank SOCKET APP RANK NRANKS [ROUNDS]");
    };
    let rank: u32 = rank.parse()?;
    let nranks: u32 = nranks.parse()?;
    let rounds: u64 = rest.first().map_or(Ok(0), |r| r.parse())?;
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    send(
        &mut stream,
        rank_message::Msg::Hello(RankHello {
            protocol_version: RANK_PROTOCOL_VERSION,
            app: app.clone(),
            rank,
            nranks,
            pid: std::process::id(),
            next_round: 0,
        }),
    )?;
    let reply: AgentMessage = read_frame(&mut stream, &mut Vec::new())?;
    match reply.msg {
        Some(agent_message::Msg::Control(_)) => println!("accepted"),
        Some(agent_message::Msg::Refused(r)) => {
            println!("refused: {}", r.reason);
            std::process::exit(3);
        }
        other => anyhow::bail!("unexpected reply: {other:?}"),
    }
    std::io::stdout().flush()?;
    for round in 0..rounds {
        let dump = canopy_integration_tests::work_dump(app, rank, round);
        send(&mut stream, rank_message::Msg::Dump(dump))?;
    }
    // Held until the test lets go.
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line)? > 0 {
        line.clear();
    }
    Ok(())
}
