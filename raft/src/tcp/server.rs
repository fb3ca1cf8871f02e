//! The server side: one accept task per node, one task per connection answering its
//! request frames in order.

use std::net::SocketAddr;
use std::time::Duration;

use openraft::error::{InitializeError, RaftError};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::{
    decode, encode_frame, loopback, read_frame, read_hello, write_hello, Answer, FrameError,
    Message, Status,
};
use crate::client::ClientError;
use crate::node::Node;

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a request is worked on. Clients give up sooner (5 s for forwarded client
/// requests, openraft's RPC deadlines); past this the connection is closed rather than
/// holding a task for an answer nobody waits for (a write on a leader cut off from its
/// quorum waits until it learns of the next leader).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves one node on a loopback listener until stopped or dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    /// The accept task; it owns the connection tasks, so aborting it ends them all.
    accept: JoinHandle<()>,
}

impl Server {
    /// Binds a listener on the loopback address `addr` (port 0: any free port).
    ///
    /// # Errors
    /// `InvalidInput` for an address that is not loopback; the bind's own error otherwise.
    pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
        TcpListener::bind(loopback(addr)?).await
    }

    /// Starts serving `node` on `listener` (from [`bind`](Self::bind)).
    ///
    /// # Errors
    /// The listener's address cannot be read.
    pub fn start(listener: TcpListener, node: Node) -> std::io::Result<Server> {
        let addr = listener.local_addr()?;
        let accept = tokio::spawn(accept(listener, node));
        Ok(Server { addr, accept })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops at once: the listener closes and every open connection is cut, mid-request or
    /// not, as when the process dies.
    pub fn stop(&self) {
        self.accept.abort();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Accepts connections until aborted; the connection tasks live in (and die with) its set.
async fn accept(listener: TcpListener, node: Node) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) if peer.ip().is_loopback() => {
                    connections.spawn(serve(stream, node.clone()));
                }
                // Another host: refused by dropping it.
                Ok(_) => {}
                // Running out of descriptors and the like: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Answers one connection's requests until it closes or misbehaves.
async fn serve(mut stream: TcpStream, node: Node) {
    // Small request-answer frames: waiting to fill a segment only adds latency.
    let _ = stream.set_nodelay(true);
    let Ok(Ok(wanted)) = tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut stream)).await else {
        return;
    };
    if write_hello(&mut stream, node.id()).await.is_err() || wanted != node.id() {
        return;
    }
    loop {
        let answer = match read_frame(&mut stream).await {
            Ok(None) | Err(FrameError::Io(_) | FrameError::Truncated) => return,
            Ok(Some(body)) => match decode::<Message>(&body) {
                Ok(message) => {
                    let answering = tokio::time::timeout(REQUEST_TIMEOUT, answer(&node, message));
                    let Ok(answer) = answering.await else {
                        return;
                    };
                    Ok(answer)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match answer {
            Ok(answer) => {
                let Ok(frame) = encode_frame(&answer).or_else(|e| {
                    // An answer too large to send (a huge value read back) is reported as such.
                    encode_frame(&Answer::Malformed(format!("answer not sent: {e}")))
                }) else {
                    return;
                };
                if stream.write_all(&frame).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                // Best effort: say why, then close (the stream is out of step).
                if let Ok(frame) = encode_frame(&Answer::Malformed(e.to_string())) {
                    let _ = stream.write_all(&frame).await;
                }
                return;
            }
        }
    }
}

/// Runs `message` on `node`.
async fn answer(node: &Node, message: Message) -> Answer {
    let raft = node.raft();
    match message {
        Message::AppendEntries(rpc) => Answer::AppendEntries(raft.append_entries(rpc).await),
        Message::Vote(rpc) => Answer::Vote(raft.vote(rpc).await),
        Message::InstallSnapshot(rpc) => Answer::InstallSnapshot(raft.install_snapshot(rpc).await),
        Message::Write(request) => Answer::Write(node.write_local(request).await),
        Message::Get(key) => Answer::Value(node.get_local(&key).await),
        Message::ReadApplied(key) => Answer::Value(node.read_applied(&key)),
        Message::Status => Answer::Status(status(node)),
        Message::Initialize(members) => {
            let members: std::collections::BTreeMap<_, _> = members.into_iter().collect();
            let initialized = raft.initialize(members).await.map_err(|e| match e {
                RaftError::APIError(InitializeError::NotAllowed(e)) => ClientError::Rejected {
                    reason: e.to_string(),
                },
                RaftError::APIError(InitializeError::NotInMembers(e)) => ClientError::Rejected {
                    reason: e.to_string(),
                },
                RaftError::Fatal(_) => ClientError::Stopped,
            });
            Answer::Initialize(initialized)
        }
    }
}

fn status(node: &Node) -> Status {
    let metrics = node.metrics();
    let metrics = metrics.borrow();
    Status {
        id: node.id(),
        is_leader: metrics.state == openraft::ServerState::Leader,
        leader: metrics.current_leader,
        term: metrics.current_term,
        last_log: metrics.last_log_index,
        last_applied: metrics.last_applied.map(|id| id.index),
        snapshot: metrics.snapshot.map(|id| id.index),
    }
}
