//! What a rank sends: the profile messages of `canopy.v1` and the protocol between the application SDK and its
//! node's leaf agent (canopy/v1/rank.proto), generated with prost alone so the SDK links no gRPC stack.
//! `canopy-proto` uses these same types for the tree.

#![forbid(unsafe_code)]

pub mod event_metrics;
pub mod options;
pub mod ranks;
pub mod utilization;
pub mod write;

use std::io::{self, Read, Write};
use std::path::PathBuf;

use prost::Message;

/// The `canopy.v1` messages a rank sends and receives.
#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/canopy.v1.rs"));
}

/// The version a rank states in its RankHello; an agent refuses another one.
pub const RANK_PROTOCOL_VERSION: u32 = 1;

/// The largest frame either side accepts: a profile of some 100,000 events. An agent accepts less by default
/// (its `max_frame_bytes`).
pub const MAX_FRAME: usize = 16 << 20;

/// How long a frame's bytes may take to arrive once its length has, by default: a peer that sends a length and
/// stalls is dropped rather than holding the connection (and what it sent) forever.
pub const FRAME_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a reader of frames from an untrusted peer allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// The most bytes in one frame.
    pub max_bytes: usize,
    /// How long a frame's bytes may take once its length has arrived.
    pub body_timeout: std::time::Duration,
}

impl Default for FrameLimits {
    fn default() -> Self {
        Self {
            max_bytes: MAX_FRAME,
            body_timeout: FRAME_BODY_TIMEOUT,
        }
    }
}

/// The id of an event or counter: the xxh3-64 hash of its name, so every rank agrees without talking.
pub fn event_id(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

/// Appends `msg` to `out` as one frame: its length (4 bytes, little-endian), then its encoding.
pub fn encode_frame(msg: &impl Message, out: &mut Vec<u8>) {
    let len = msg.encoded_len();
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    msg.encode(out).expect("a Vec grows as needed");
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, msg: &impl Message) -> io::Result<()> {
    let mut buf = Vec::new();
    encode_frame(msg, &mut buf);
    w.write_all(&buf)
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Closed,
    Io(io::Error),
    /// A length over the reader's limit: the stream is not Canopy's, is corrupt, or carries more than allowed.
    TooLong {
        len: usize,
        max: usize,
    },
    /// The frame's bytes did not all arrive within the time allowed.
    Stalled {
        len: usize,
        got: usize,
        after: std::time::Duration,
    },
    /// The peer closed the connection, or it failed, inside a frame.
    Truncated(io::Error),
    /// The bytes are not the message expected.
    Decode(prost::DecodeError),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::TooLong { len, max } => write!(f, "frame of {len} bytes is over the limit of {max}"),
            FrameError::Stalled { len, got, after } => write!(
                f,
                "frame of {len} bytes incomplete after {after:?} ({got} bytes arrived)"
            ),
            FrameError::Truncated(e) => write!(f, "connection closed inside a frame: {e}"),
            FrameError::Decode(e) => write!(f, "undecodable message: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Decodes a frame's length prefix, checking it against `max`.
pub fn frame_len(prefix: [u8; 4], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max {
        return Err(FrameError::TooLong { len, max });
    }
    Ok(len)
}

/// Reads one frame (blocking).
pub fn read_frame<M: Message + Default>(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<M, FrameError> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let len = frame_len(prefix, MAX_FRAME)?;
    buf.clear();
    // Grown as the bytes arrive, not to the length a peer claims.
    r.take(len as u64)
        .read_to_end(buf)
        .map_err(FrameError::Truncated)?;
    if buf.len() < len {
        return Err(FrameError::Truncated(io::ErrorKind::UnexpectedEof.into()));
    }
    M::decode(buf.as_slice()).map_err(FrameError::Decode)
}

/// Reads one frame from an async stream: the same framing as [`read_frame`], for the agent's side, within
/// `limits`. The buffer grows as the bytes arrive, never to the length a peer merely claims, and a frame whose
/// bytes do not all come within the body time-out is an error. Not cancellation-safe inside a frame: drop it
/// only to stop reading the stream.
#[cfg(feature = "tokio")]
pub async fn read_frame_async<M: Message + Default>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    limits: FrameLimits,
) -> Result<M, FrameError> {
    use tokio::io::AsyncReadExt;
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let len = frame_len(prefix, limits.max_bytes)?;
    buf.clear();
    let mut body = r.take(len as u64);
    match tokio::time::timeout(limits.body_timeout, body.read_to_end(buf)).await {
        Err(_) => {
            return Err(FrameError::Stalled {
                len,
                got: buf.len(),
                after: limits.body_timeout,
            });
        }
        Ok(Err(e)) => return Err(FrameError::Truncated(e)),
        Ok(Ok(_)) => {}
    }
    if buf.len() < len {
        return Err(FrameError::Truncated(io::ErrorKind::UnexpectedEof.into()));
    }
    M::decode(buf.as_slice()).map_err(FrameError::Decode)
}

/// Wraps one encoded RankProfile as an encoded one-profile ProfileBatch, without decoding it.
pub fn batch_of_one(profile: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(profile.len() + 6);
    // Field 1 (profiles), wire type 2 (length-delimited).
    out.push(0x0a);
    prost::encoding::encode_varint(profile.len() as u64, &mut out);
    out.extend_from_slice(profile);
    out
}

/// Where a leaf agent listens and the SDK looks for it when `CANOPY_AGENT_SOCKET` is not set:
/// /run/canopy/agent.sock where /run/canopy exists (the system service's runtime directory), else
/// $XDG_RUNTIME_DIR/canopy/agent.sock, else /tmp/canopy-UID/agent.sock.
pub fn default_socket_path() -> PathBuf {
    let system = PathBuf::from("/run/canopy");
    if system.is_dir() {
        return system.join("agent.sock");
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("canopy").join("agent.sock");
    }
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    PathBuf::from(format!("/tmp/canopy-{}", uid.unwrap_or(0))).join("agent.sock")
}

#[cfg(test)]
mod tests {
    use super::*;
    use v1::{ProfileBatch, RankDump, RankMessage, RankProfile, rank_message};

    #[test]
    fn frames_round_trip_and_bad_ones_are_named() {
        let msg = RankMessage {
            msg: Some(rank_message::Msg::Dump(RankDump {
                round: 7,
                ..Default::default()
            })),
        };
        let mut bytes = Vec::new();
        encode_frame(&msg, &mut bytes);
        encode_frame(&msg, &mut bytes);
        let mut r = bytes.as_slice();
        let mut buf = Vec::new();
        assert_eq!(read_frame::<RankMessage>(&mut r, &mut buf).unwrap(), msg);
        assert_eq!(read_frame::<RankMessage>(&mut r, &mut buf).unwrap(), msg);
        assert!(matches!(
            read_frame::<RankMessage>(&mut r, &mut buf),
            Err(FrameError::Closed)
        ));

        let huge = (u32::MAX).to_le_bytes();
        let err = read_frame::<RankMessage>(&mut huge.as_slice(), &mut buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame of 4294967295 bytes is over the limit of 16777216"
        );
        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        let err = read_frame::<RankMessage>(&mut garbage.as_slice(), &mut buf).unwrap_err();
        assert!(err.to_string().starts_with("undecodable message"), "{err}");
    }

    #[test]
    fn a_batch_of_one_decodes_to_the_profile() {
        let p = RankProfile {
            app: "a".into(),
            rank: 3,
            round: 9,
            ..Default::default()
        };
        let batch = ProfileBatch::decode(batch_of_one(&p.encode_to_vec()).as_slice()).unwrap();
        assert_eq!(batch.profiles, vec![p]);
    }

    #[cfg(feature = "tokio")]
    mod limits {
        use super::*;
        use tokio::io::AsyncWriteExt;

        fn limits(max_bytes: usize) -> FrameLimits {
            FrameLimits {
                max_bytes,
                body_timeout: std::time::Duration::from_millis(50),
            }
        }

        #[tokio::test]
        async fn a_claimed_length_allocates_nothing_until_the_bytes_come() {
            let (mut peer, mut ours) = tokio::io::duplex(64);
            let claimed = 900_000u32;
            peer.write_all(&claimed.to_le_bytes()).await.unwrap();
            peer.write_all(b"0123456789").await.unwrap();
            drop(peer);
            let mut buf = Vec::new();
            let read = read_frame_async::<RankMessage>(&mut ours, &mut buf, limits(1 << 20)).await;
            assert!(matches!(read, Err(FrameError::Truncated(_))), "{read:?}");
            assert!(
                buf.capacity() < 4096,
                "{} bytes held for 10 that came",
                buf.capacity()
            );
        }

        #[tokio::test]
        async fn a_length_over_the_limit_is_refused_by_its_numbers() {
            let (mut peer, mut ours) = tokio::io::duplex(64);
            peer.write_all(&(16u32 << 20).to_le_bytes()).await.unwrap();
            let read = read_frame_async::<RankMessage>(&mut ours, &mut Vec::new(), limits(1 << 20)).await;
            let err = read.expect_err("refused");
            assert_eq!(
                err.to_string(),
                "frame of 16777216 bytes is over the limit of 1048576"
            );
        }

        #[tokio::test]
        async fn a_frame_whose_bytes_stop_coming_is_dropped_after_the_time_out() {
            let (mut peer, mut ours) = tokio::io::duplex(64);
            peer.write_all(&100u32.to_le_bytes()).await.unwrap();
            peer.write_all(&[0u8; 30]).await.unwrap();
            let read = read_frame_async::<RankMessage>(&mut ours, &mut Vec::new(), limits(1 << 20)).await;
            let err = read.expect_err("stalled");
            assert_eq!(
                err.to_string(),
                "frame of 100 bytes incomplete after 50ms (30 bytes arrived)"
            );
            drop(peer);
        }

        #[tokio::test]
        async fn a_whole_frame_within_the_limits_reads_as_before() {
            let msg = RankMessage {
                msg: Some(rank_message::Msg::Dump(RankDump {
                    round: 7,
                    ..Default::default()
                })),
            };
            let mut frame = Vec::new();
            encode_frame(&msg, &mut frame);
            let (mut peer, mut ours) = tokio::io::duplex(1024);
            peer.write_all(&frame).await.unwrap();
            let read = read_frame_async::<RankMessage>(&mut ours, &mut Vec::new(), limits(4096)).await;
            assert_eq!(read.unwrap(), msg);
        }
    }
}
