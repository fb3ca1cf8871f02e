//! An application's client of a cluster over TCP.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use openraft::BasicNode;

use super::network::{unexpected, TcpNetwork};
use super::{Answer, Message, Status};
use crate::client::{follow_leader, ClientError, Forward};
use crate::{NodeId, Request, Response};

/// How long [`Client::write`] and [`Client::get`] try (following leaders, waiting out an
/// election) before giving up.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of a single status, initialization or local read.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A cluster's client: sends each request to the leader it last learned of, follows
/// `NotLeader` hints, and tries the other nodes in turn when none is known.
///
/// ```no_run
/// use bfkv_raft::tcp::Client;
/// use bfkv_raft::Request;
/// # async fn f() -> Result<(), bfkv_raft::client::ClientError> {
/// let client = Client::new([(1, "127.0.0.1:7001"), (2, "127.0.0.1:7002")]);
/// client.write(Request::Put { key: b"k".to_vec(), value: b"v".to_vec() }).await?;
/// assert_eq!(client.get(b"k").await?, Some(b"v".to_vec()));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Client {
    network: TcpNetwork,
    nodes: BTreeMap<NodeId, BasicNode>,
    /// The node tried first: the last that answered, or the next in turn.
    next: AtomicUsize,
}

impl Client {
    /// A client of the nodes `nodes` (id and loopback address each).
    pub fn new<A: Into<String>>(nodes: impl IntoIterator<Item = (NodeId, A)>) -> Self {
        Client {
            network: TcpNetwork::new(0),
            nodes: nodes
                .into_iter()
                .map(|(id, addr)| (id, BasicNode { addr: addr.into() }))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The node at position `i` (modulo the number of nodes).
    fn nth(&self, i: usize) -> (NodeId, Option<BasicNode>) {
        match self.nodes.iter().nth(i % self.nodes.len().max(1)) {
            Some((id, node)) => (*id, Some(node.clone())),
            None => (0, None),
        }
    }

    /// The next node in turn, when no leader is known.
    fn rotate(&self) -> (NodeId, Option<BasicNode>) {
        self.nth(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Remembers `id` as the node to try first.
    fn prefer(&self, id: NodeId) {
        if let Some(i) = self.nodes.keys().position(|&k| k == id) {
            self.next.store(i, Ordering::Relaxed);
        }
    }

    /// The address of `id`: as given (a leader hint), or as configured.
    fn address(&self, id: NodeId, node: Option<BasicNode>) -> Result<BasicNode, ClientError> {
        node.or_else(|| self.nodes.get(&id).cloned())
            .ok_or_else(|| ClientError::Unreachable {
                node: id,
                reason: "no address known".to_string(),
            })
    }

    /// Has the leader apply `request` and returns what applying it gave.
    ///
    /// # Errors
    /// The [`ClientError`] of the last attempt (after up to 10 s); if
    /// [`may_have_taken_effect`](ClientError::may_have_taken_effect), the write's outcome
    /// is unknown.
    pub async fn write(&self, request: Request) -> Result<Response, ClientError> {
        let request = &request;
        let first = self.nth(self.next.load(Ordering::Relaxed));
        follow_leader(
            first,
            CLIENT_TIMEOUT,
            || self.rotate(),
            |to, node| async move {
                let node = self.address(to, node)?;
                let written = self.network.write(to, &node, request.clone()).await;
                if written.is_ok() {
                    self.prefer(to);
                }
                written
            },
        )
        .await
    }

    /// Reads `key` linearizably from the leader.
    ///
    /// # Errors
    /// As [`write`](Self::write); a failed read changed nothing.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        let first = self.nth(self.next.load(Ordering::Relaxed));
        follow_leader(
            first,
            CLIENT_TIMEOUT,
            || self.rotate(),
            |to, node| async move {
                let node = self.address(to, node)?;
                let read = self.network.get(to, &node, key.to_vec()).await;
                if read.is_ok() {
                    self.prefer(to);
                }
                read
            },
        )
        .await
    }

    /// Sends `message` to node `id` alone.
    async fn call(&self, id: NodeId, message: &Message) -> Result<Answer, ClientError> {
        let node = self.address(id, None)?;
        let answer = self
            .network
            .call(id, &node.addr, message, CALL_TIMEOUT)
            .await;
        answer.map_err(|e| e.into_client(id))
    }

    /// Node `id`'s view of itself and of the cluster.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] and the other failures of a call.
    pub async fn status(&self, id: NodeId) -> Result<Status, ClientError> {
        match self.call(id, &Message::Status).await? {
            Answer::Status(status) => Ok(status),
            other => Err(unexpected(&other)),
        }
    }

    /// The value of `key` in node `id`'s applied state, without a leadership check: for
    /// checking replicas once the cluster has settled.
    ///
    /// # Errors
    /// As [`status`](Self::status); [`ClientError::Storage`] if the node's read fails.
    pub async fn read_applied(
        &self,
        id: NodeId,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, ClientError> {
        match self.call(id, &Message::ReadApplied(key.to_vec())).await? {
            Answer::Value(value) => value,
            other => Err(unexpected(&other)),
        }
    }

    /// Initializes node `id` (pristine) as the first member of a cluster of all the nodes
    /// this client knows.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] if the node is already initialized; the failures of a call.
    pub async fn initialize(&self, id: NodeId) -> Result<(), ClientError> {
        let members = self.nodes.clone().into_iter().collect();
        match self.call(id, &Message::Initialize(members)).await? {
            Answer::Initialize(done) => done,
            other => Err(unexpected(&other)),
        }
    }
}
