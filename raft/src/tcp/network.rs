//! The client side: a pool of connections, calls with deadlines, and openraft's network and
//! the client forwarding on top.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{
    decode, encode_frame, loopback, read_frame, read_hello, write_hello, Answer, FrameError,
    Message,
};
use crate::client::{ClientError, Forward};
use crate::{NodeId, Request, Response, TypeConfig};

/// Deadline of a forwarded client request (it may wait for a commit, or an election).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of connecting and exchanging hellos.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle connections kept per peer.
const IDLE_PER_PEER: usize = 16;
/// How long openraft waits before retrying a node it could not reach.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(100);

/// Why a call failed, by what the peer may have seen of it.
#[derive(Debug)]
pub(super) enum CallError {
    /// Nothing was sent: no connection, or a failed hello.
    NotSent(String),
    /// The request was too large to send (`MAX_FRAME`).
    TooLarge,
    /// The request was (perhaps partly) sent, then the connection failed.
    Lost(String),
    /// No answer before the deadline.
    Timeout(Duration),
    /// The peer broke the protocol (a malformed answer, or a `Malformed` reply).
    Protocol(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotSent(why) => write!(f, "not sent: {why}"),
            CallError::TooLarge => write!(f, "request exceeds the frame limit"),
            CallError::Lost(why) => write!(f, "connection lost: {why}"),
            CallError::Timeout(after) => write!(f, "no answer within {after:?}"),
            CallError::Protocol(why) => write!(f, "protocol: {why}"),
        }
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// As a client operation's error against node `to`.
    pub(super) fn into_client(self, to: NodeId) -> ClientError {
        match self {
            CallError::NotSent(reason) => ClientError::Unreachable { node: to, reason },
            CallError::TooLarge => ClientError::Rejected {
                reason: "request exceeds the frame limit".to_string(),
            },
            CallError::Lost(reason) => ClientError::Unknown { reason },
            CallError::Timeout(after) => ClientError::Timeout { after },
            CallError::Protocol(reason) => ClientError::Protocol { reason },
        }
    }
}

/// One open connection to a node that has said hello.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
}

impl Conn {
    /// Connects to `addr` and checks the peer is node `node`.
    async fn open(addr: SocketAddr, node: NodeId) -> Result<Conn, CallError> {
        let opening = async {
            let mut stream = TcpStream::connect(addr).await.map_err(FrameError::Io)?;
            let _ = stream.set_nodelay(true);
            write_hello(&mut stream, node).await?;
            let peer = read_hello(&mut stream).await?;
            Ok::<_, FrameError>((stream, peer))
        };
        let (stream, peer) = tokio::time::timeout(CONNECT_TIMEOUT, opening)
            .await
            .map_err(|_| {
                CallError::NotSent(format!("{addr}: no hello within {CONNECT_TIMEOUT:?}"))
            })?
            .map_err(|e| CallError::NotSent(format!("{addr}: {e}")))?;
        if peer != node {
            return Err(CallError::NotSent(format!(
                "{addr} is node {peer}, not node {node}"
            )));
        }
        Ok(Conn { stream })
    }

    /// Whether the peer still has this idle connection open: it sends nothing unasked, so
    /// readable means closed (or out of step).
    fn is_idle_and_open(&self) -> bool {
        let mut probe = [0u8; 1];
        let read = self.stream.try_read(&mut probe);
        matches!(read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Sends `frame` and reads the answer.
    async fn round_trip(&mut self, frame: &[u8]) -> Result<Answer, CallError> {
        self.stream
            .write_all(frame)
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        match read_frame(&mut self.stream).await {
            Ok(Some(body)) => match decode::<Answer>(&body) {
                Ok(Answer::Malformed(why)) => Err(CallError::Protocol(format!("peer: {why}"))),
                Ok(answer) => Ok(answer),
                Err(e) => Err(CallError::Protocol(e.to_string())),
            },
            Ok(None) => Err(CallError::Lost("closed by the peer".to_string())),
            Err(e @ (FrameError::Io(_) | FrameError::Truncated)) => {
                Err(CallError::Lost(e.to_string()))
            }
            Err(e) => Err(CallError::Protocol(e.to_string())),
        }
    }
}

/// Idle connections by peer; each call takes one (or opens one) and gives it back only if
/// the call succeeded, so a connection in an unknown state is never reused.
#[derive(Debug, Default)]
struct Pool {
    idle: Mutex<HashMap<(SocketAddr, NodeId), Vec<Conn>>>,
}

impl Pool {
    fn take(&self, addr: SocketAddr, node: NodeId) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.get_mut(&(addr, node))?;
        while let Some(conn) = conns.pop() {
            if conn.is_idle_and_open() {
                return Some(conn);
            }
        }
        None
    }

    fn give_back(&self, addr: SocketAddr, node: NodeId, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.entry((addr, node)).or_default();
        if conns.len() < IDLE_PER_PEER {
            conns.push(conn);
        }
    }

    /// Sends `message` to node `node` at `addr` and returns its answer within `timeout`.
    async fn call(
        &self,
        addr: &str,
        node: NodeId,
        message: &Message,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        let addr = loopback(addr).map_err(|e| CallError::NotSent(e.to_string()))?;
        let frame = encode_frame(message).map_err(|e| match e {
            FrameError::TooLarge(_) => CallError::TooLarge,
            e => CallError::NotSent(e.to_string()),
        })?;
        let calling = async {
            let mut conn = match self.take(addr, node) {
                Some(conn) => conn,
                None => Conn::open(addr, node).await?,
            };
            let answer = conn.round_trip(&frame).await?;
            self.give_back(addr, node, conn);
            Ok(answer)
        };
        tokio::time::timeout(timeout, calling)
            .await
            .map_err(|_| CallError::Timeout(timeout))?
    }
}

/// A node's network over TCP ([`RaftNetworkFactory`] and [`Forward`]); clones share one
/// connection pool.
#[derive(Debug, Clone)]
pub struct TcpNetwork {
    /// The node it belongs to (named in timeout errors); 0 for an application's client.
    id: NodeId,
    pool: Arc<Pool>,
}

impl TcpNetwork {
    /// The network of node `id`.
    pub fn new(id: NodeId) -> Self {
        TcpNetwork {
            id,
            pool: Arc::new(Pool::default()),
        }
    }

    /// Sends `message` to node `to` at `addr`.
    pub(super) async fn call(
        &self,
        to: NodeId,
        addr: &str,
        message: &Message,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        self.pool.call(addr, to, message, timeout).await
    }
}

/// openraft's connection from one node to another over a [`TcpNetwork`].
#[derive(Debug)]
pub struct TcpConnection {
    network: TcpNetwork,
    target: NodeId,
    node: BasicNode,
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = TcpConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> TcpConnection {
        TcpConnection {
            network: self.clone(),
            target,
            node: node.clone(),
        }
    }
}

/// An RPC error with openraft's meaning for each way a call fails.
type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl TcpConnection {
    /// Sends `message` and returns the answer.
    async fn rpc(&self, message: &Message, option: &RPCOption) -> Result<Answer, CallError> {
        let timeout = option.hard_ttl();
        self.network
            .call(self.target, &self.node.addr, message, timeout)
            .await
    }

    /// openraft's meaning of a failed call of kind `action`: `Unreachable` (back off) when
    /// nothing was sent, `Timeout`, or a network error (retry at once).
    fn failed<E: std::error::Error>(&self, action: RPCTypes, e: &CallError) -> RpcError<E> {
        match e {
            CallError::NotSent(_) => RPCError::Unreachable(Unreachable::new(e)),
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.network.id,
                target: self.target,
                timeout: *timeout,
            }),
            CallError::TooLarge | CallError::Lost(_) | CallError::Protocol(_) => {
                RPCError::Network(NetworkError::new(e))
            }
        }
    }

    /// The remote's error, as openraft expects it.
    fn remote<E: std::error::Error>(&self, e: RaftError<NodeId, E>) -> RpcError<E> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            self.node.clone(),
            e,
        ))
    }
}

/// An answer of the wrong kind: the peer is out of step.
fn mismatched<E: std::error::Error>(answer: &Answer) -> RpcError<E> {
    let why = CallError::Protocol(format!("unexpected {} answer", answer.kind()));
    RPCError::Network(NetworkError::new(&why))
}

impl RaftNetwork<TypeConfig> for TcpConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let entries = rpc.entries.len() as u64;
        match self.rpc(&Message::AppendEntries(rpc), &option).await {
            Ok(Answer::AppendEntries(answer)) => answer.map_err(|e| self.remote(e)),
            Ok(other) => Err(mismatched(&other)),
            // openraft retries with at most this many entries.
            Err(CallError::TooLarge) if entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries / 2),
            )),
            Err(e) => Err(self.failed(RPCTypes::AppendEntries, &e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        match self.rpc(&Message::InstallSnapshot(rpc), &option).await {
            Ok(Answer::InstallSnapshot(answer)) => answer.map_err(|e| self.remote(e)),
            Ok(other) => Err(mismatched(&other)),
            Err(e) => Err(self.failed(RPCTypes::InstallSnapshot, &e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        match self.rpc(&Message::Vote(rpc), &option).await {
            Ok(Answer::Vote(answer)) => answer.map_err(|e| self.remote(e)),
            Ok(other) => Err(mismatched(&other)),
            Err(e) => Err(self.failed(RPCTypes::Vote, &e)),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }
}

impl Forward for TcpNetwork {
    async fn write(
        &self,
        to: NodeId,
        node: &BasicNode,
        request: Request,
    ) -> Result<Response, ClientError> {
        let message = Message::Write(request);
        match self.call(to, &node.addr, &message, FORWARD_TIMEOUT).await {
            Ok(Answer::Write(answer)) => answer,
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(e.into_client(to)),
        }
    }

    async fn get(
        &self,
        to: NodeId,
        node: &BasicNode,
        key: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        match self
            .call(to, &node.addr, &Message::Get(key), FORWARD_TIMEOUT)
            .await
        {
            Ok(Answer::Value(answer)) => answer,
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(e.into_client(to)),
        }
    }
}

/// A client error for an answer of the wrong kind.
pub(super) fn unexpected(answer: &Answer) -> ClientError {
    ClientError::Protocol {
        reason: format!("unexpected {} answer", answer.kind()),
    }
}
