//! One rank's connection: frames in (with the gaps in its round numbers found on the way, and each dump held
//! at the leaf's window), frames out.

use canopy_core::window::WindowGate;
use canopy_wire::v1::{AgentMessage, RankMessage, rank_message};
use canopy_wire::{FrameError, FrameLimits, encode_frame, read_frame_async};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::Event;

/// Reads frames from one rank and writes what the agent sends it.
pub(super) async fn connection(
    id: u64,
    stream: UnixStream,
    events: mpsc::Sender<Event>,
    mut outbound: mpsc::Receiver<AgentMessage>,
    mut gate: WindowGate,
    limits: FrameLimits,
) {
    let (mut rd, mut wr) = stream.into_split();
    let mut writer = tokio::spawn(async move {
        let mut frame = Vec::new();
        while let Some(msg) = outbound.recv().await {
            frame.clear();
            encode_frame(&msg, &mut frame);
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut buf = Vec::new();
    // The round the rank's next dump should carry: a later one means it dropped the ones between.
    let mut next_round: Option<u64> = None;
    let reason = loop {
        // The agent closing the connection (a refusal, a protocol error) ends the writer, and the reading.
        let read = tokio::select! {
            r = read_frame_async::<RankMessage>(&mut rd, &mut buf, limits) => r,
            _ = &mut writer => {
                let _ = events.send(Event::Closed(id, "closed by the agent".into())).await;
                return;
            }
        };
        let msg = match read {
            Ok(msg) if msg.msg.is_some() => msg,
            Ok(_) => break "bad message: empty".into(),
            Err(FrameError::Closed) => break "connection closed".to_string(),
            Err(FrameError::Io(e)) => break format!("read failed: {e}"),
            Err(e @ (FrameError::TooLong { .. } | FrameError::Stalled { .. })) => {
                break format!("bad frame: {e}");
            }
            Err(e @ FrameError::Truncated(_)) => break e.to_string(),
            Err(FrameError::Decode(e)) => break format!("bad message: {e}"),
        };
        // A dump's round, or a FIN's end, past the round expected next: the rank dropped the ones between
        // (at a FIN, the ones after the last it delivered).
        let reached = match &msg.msg {
            Some(rank_message::Msg::Hello(h)) => {
                next_round = Some(h.next_round);
                None
            }
            Some(rank_message::Msg::Dump(d)) => Some((d.round, d.round.saturating_add(1))),
            Some(rank_message::Msg::Fin(f)) => Some((f.rounds_end, f.rounds_end)),
            None => None,
        };
        if let Some((end, after)) = reached {
            // The gap goes ahead of the dump's wait for the window: the rounds it leaves out must not wait
            // for this rank.
            if let Some(next) = next_round.filter(|next| end > *next)
                && events.send(Event::Gap(id, next, end)).await.is_err()
            {
                break "the agent is stopping".into();
            }
            next_round = Some(next_round.unwrap_or(0).max(after));
        }
        if let Some(rank_message::Msg::Dump(d)) = &msg.msg
            && !gate.admit(d.round).await
        {
            break "the agent is stopping".into();
        }
        if events.send(Event::Message(id, msg)).await.is_err() {
            break "the agent is stopping".into();
        }
    };
    let _ = events.send(Event::Closed(id, reason)).await;
    // The writer ends when the socket's task drops this rank's sender.
    let _ = writer.await;
}
