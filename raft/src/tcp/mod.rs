//! A TCP transport on loopback: Raft RPCs and client requests as length-prefixed bincode
//! frames over tokio `TcpStream`s.
//!
//! - [`Server`] serves one [`Node`](crate::node::Node): it accepts connections and answers
//!   each request frame with one answer frame, in order.
//! - [`TcpNetwork`] is a node's way out: openraft's
//!   [`RaftNetworkFactory`](openraft::RaftNetworkFactory) and the
//!   [`Forward`](crate::client::Forward) its client operations use, over a pool of
//!   connections that are opened on demand and dropped on any failure (the next call
//!   reconnects).
//! - [`Client`] is an application's handle on the cluster: writes and linearizable reads
//!   that follow the leader, and per-node status, initialization and local reads.
//!
//! Only loopback addresses are used, ever: binding, connecting to or accepting anything
//! else is refused. This transport has no authentication and no encryption; it exists to
//! run a cluster of processes on one machine.
//!
//! # Wire format
//!
//! Integers little-endian. Each side of a new connection first sends a hello:
//!
//! ```text
//! magic    8 bytes  "BFKVRAFT"
//! version  u32      1
//! node     u64      client: the node it wants to reach; server: its own id
//! ```
//!
//! A server whose id differs answers its hello and closes, and the client reports the
//! mismatch: a restarted process on a reused port is never mistaken for another node.
//! Then the client sends request frames and reads one answer frame after each:
//!
//! ```text
//! length   u32      of the body, at most MAX_FRAME
//! body     bincode (fixed-width integers) of a request or an answer
//! ```
//!
//! A frame that is too long, truncated, or does not decode is answered with a `Malformed`
//! answer (when possible) and the connection is closed; nothing panics on bad input.

use std::net::SocketAddr;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::ClientError;
use crate::{NodeId, Request, Response, TypeConfig};

mod client;
mod network;
mod server;

pub use client::Client;
pub use network::{TcpConnection, TcpNetwork};
pub use server::Server;

/// The longest frame body accepted or sent: a request's values may take up to 64 MiB
/// ([`Request::check_size`]), plus room for the entry around them.
pub const MAX_FRAME: usize = 80 << 20;

/// The first bytes of every hello.
const MAGIC: &[u8; 8] = b"BFKVRAFT";
/// The protocol version this code speaks.
const VERSION: u32 = 1;
/// Bytes of a hello.
const HELLO_LEN: usize = 20;

/// What a client asks of a node.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    /// openraft's `AppendEntries` RPC.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// openraft's `RequestVote` RPC.
    Vote(VoteRequest<NodeId>),
    /// One chunk of openraft's `InstallSnapshot` RPC.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// Propose this write, as leader only ([`Node::write_local`](crate::node::Node::write_local)).
    Write(Request),
    /// Read this key linearizably, as leader only.
    Get(Vec<u8>),
    /// Read this key from the node's applied state, whoever leads.
    ReadApplied(Vec<u8>),
    /// Report the node's [`Status`].
    Status,
    /// Initialize a cluster of these members on this (pristine) node.
    Initialize(Vec<(NodeId, BasicNode)>),
}

/// A node's answer to a [`Message`].
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Write(Result<Response, ClientError>),
    /// For `Get` and `ReadApplied`.
    Value(Result<Option<Vec<u8>>, ClientError>),
    Status(Status),
    Initialize(Result<(), ClientError>),
    /// The request frame was not understood; the connection closes after this.
    Malformed(String),
}

impl Answer {
    /// The answer's kind, for errors (its contents may be large).
    fn kind(&self) -> &'static str {
        match self {
            Answer::AppendEntries(_) => "append-entries",
            Answer::Vote(_) => "vote",
            Answer::InstallSnapshot(_) => "install-snapshot",
            Answer::Write(_) => "write",
            Answer::Value(_) => "value",
            Answer::Status(_) => "status",
            Answer::Initialize(_) => "initialize",
            Answer::Malformed(_) => "malformed",
        }
    }
}

/// What a node reports about itself ([`Client::status`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The node's id.
    pub id: NodeId,
    /// Whether it is the leader.
    pub is_leader: bool,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// Its current term.
    pub term: u64,
    /// The index of its last log entry.
    pub last_log: Option<u64>,
    /// The index of the last entry its state machine applied.
    pub last_applied: Option<u64>,
    /// The last index its latest snapshot covers.
    pub snapshot: Option<u64>,
}

/// Why a frame could not be read or written.
#[derive(Debug)]
enum FrameError {
    /// The socket failed.
    Io(std::io::Error),
    /// The peer closed the connection in the middle of a frame.
    Truncated,
    /// A frame body longer than [`MAX_FRAME`].
    TooLarge(usize),
    /// The body did not decode (or encode).
    Codec(bincode::Error),
    /// The hello was not this protocol's.
    BadHello(&'static str),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "i/o: {e}"),
            FrameError::Truncated => write!(f, "connection closed inside a frame"),
            FrameError::TooLarge(len) => {
                write!(f, "frame of {len} bytes exceeds the limit of {MAX_FRAME}")
            }
            FrameError::Codec(e) => write!(f, "malformed frame body: {e}"),
            FrameError::BadHello(why) => write!(f, "bad hello: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// The wire's bincode: fixed-width integers, no trailing bytes, and never more than
/// [`MAX_FRAME`] bytes allocated for what a body claims to hold.
fn codec() -> impl bincode::Options {
    use bincode::Options as _;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// `value` as a whole frame (length and body), or `TooLarge`.
fn encode_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    use bincode::Options as _;
    let len = codec().serialized_size(value).map_err(|e| match *e {
        bincode::ErrorKind::SizeLimit => FrameError::TooLarge(MAX_FRAME + 1),
        _ => FrameError::Codec(e),
    })? as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&(len as u32).to_le_bytes());
    codec()
        .serialize_into(&mut frame, value)
        .map_err(FrameError::Codec)?;
    Ok(frame)
}

/// Reads one frame body; `None` if the peer closed the connection between frames.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Vec<u8>>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        let n = reader.read(&mut len[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(FrameError::Truncated)
            };
        }
        got += n;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    // Grown as bytes arrive rather than allocated up front from the claimed length.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    reader.take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(FrameError::Truncated);
    }
    Ok(Some(body))
}

/// A frame body as a `T`.
fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    use bincode::Options as _;
    codec().deserialize(body).map_err(FrameError::Codec)
}

/// Writes the hello naming `node`.
async fn write_hello<W: AsyncWrite + Unpin>(writer: &mut W, node: NodeId) -> std::io::Result<()> {
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(MAGIC);
    hello[8..12].copy_from_slice(&VERSION.to_le_bytes());
    hello[12..].copy_from_slice(&node.to_le_bytes());
    writer.write_all(&hello).await?;
    writer.flush().await
}

/// Reads a hello and returns the node it names.
async fn read_hello<R: AsyncRead + Unpin>(reader: &mut R) -> Result<NodeId, FrameError> {
    let mut hello = [0u8; HELLO_LEN];
    reader.read_exact(&mut hello).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        }
    })?;
    if &hello[..8] != MAGIC {
        return Err(FrameError::BadHello("not a bfkv-raft peer"));
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&hello[8..12]);
    if u32::from_le_bytes(version) != VERSION {
        return Err(FrameError::BadHello("unsupported protocol version"));
    }
    let mut node = [0u8; 8];
    node.copy_from_slice(&hello[12..]);
    Ok(NodeId::from_le_bytes(node))
}

/// `addr` parsed as a loopback socket address, or why it is refused.
///
/// # Errors
/// An `InvalidInput` I/O error for a string that is not `ip:port` or names another host.
///
/// ```
/// use bfkv_raft::tcp::loopback;
/// assert!(loopback("127.0.0.1:4000").is_ok());
/// assert!(loopback("[::1]:4000").is_ok());
/// assert!(loopback("10.0.0.1:4000").is_err());
/// assert!(loopback("localhost:4000").is_err()); // no name resolution
/// ```
pub fn loopback(addr: &str) -> std::io::Result<SocketAddr> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    let parsed: SocketAddr = addr
        .parse()
        .map_err(|_| invalid(format!("{addr:?} is not an ip:port address")))?;
    if !parsed.ip().is_loopback() {
        return Err(invalid(format!("{addr} is not a loopback address")));
    }
    Ok(parsed)
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
