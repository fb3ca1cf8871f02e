//! A cluster member: a node directory opened with [`open`](crate::open), the
//! [`openraft::Raft`] running on it, and the client operations of the replicated map.
//!
//! - **Writes** ([`Node::write`]) are proposed with `Raft::client_write` on the leader and
//!   answered with what applying them returned. A follower's `ForwardToLeader` is followed
//!   through a caller-supplied [`Forward`] (see [`client`](crate::client)).
//! - **Linearizable reads** ([`Node::get`]) run `Raft::ensure_linearizable` on the leader,
//!   which confirms the leadership with a quorum of heartbeats and waits until the local
//!   state machine has applied everything committed before the read began (including the
//!   leader's first entry of its term), and then read the local state machine.
//! - **Shutdown** ([`Node::shutdown`]) stops Raft and waits until openraft has let go of
//!   every storage handle, so the trees are closed and the directory can be opened again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, Fatal, RaftError};
use openraft::{BasicNode, Config, Raft, RaftMetrics, RaftNetworkFactory, SnapshotPolicy};
use tokio::sync::watch;

use crate::client::{follow_leader, ClientError, Forward};
use crate::tracked::{self, Closed, LogCounters, LogStats, TrackedReader};
use crate::{NodeId, Options, Request, Response, TypeConfig};

/// How long [`Node::write`] and [`Node::get`] try (following leaders, waiting out an
/// election) before giving up, unless [`Node::set_client_timeout`] says otherwise.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`Node::shutdown`] waits for openraft to drop the storage handles.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// openraft settings for a node: 50 ms heartbeats and 150–300 ms election timeouts (quick
/// failover in tests and on loopback), a snapshot every 5000 entries, and 2 s for the last
/// snapshot chunk, since installing one unpacks and syncs a whole tree.
///
/// ```
/// let mut config = bfkv_raft::node::config();
/// config.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(100);
/// assert!(config.validate().is_ok());
/// ```
pub fn config() -> Config {
    Config {
        cluster_name: "bfkv".to_string(),
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        install_snapshot_timeout: 2000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(5000),
        max_in_snapshot_log_to_keep: 1000,
        ..Config::default()
    }
}

/// Why a node could not start or stop.
#[non_exhaustive]
#[derive(Debug)]
pub enum NodeError {
    /// The openraft configuration is invalid.
    Config(openraft::ConfigError),
    /// The node directory could not be opened.
    Storage(openraft::StorageError<NodeId>),
    /// openraft failed to start.
    Raft(Fatal<NodeId>),
    /// Opening the directory's trees (a blocking task) panicked.
    Task(tokio::task::JoinError),
    /// openraft still held the storage this long after shutting down.
    CloseTimeout {
        /// The node directory.
        dir: PathBuf,
        /// How long shutdown waited.
        waited: Duration,
    },
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Config(e) => write!(f, "invalid raft config: {e}"),
            NodeError::Storage(e) => write!(f, "node storage: {e}"),
            NodeError::Raft(e) => write!(f, "raft: {e}"),
            NodeError::Task(e) => write!(f, "opening the node directory: {e}"),
            NodeError::CloseTimeout { dir, waited } => write!(
                f,
                "{}: storage still in use {waited:?} after raft shut down",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NodeError::Config(e) => Some(e),
            NodeError::Storage(e) => Some(e),
            NodeError::Raft(e) => Some(e),
            NodeError::Task(e) => Some(e),
            NodeError::CloseTimeout { .. } => None,
        }
    }
}

/// A running cluster member; clones are handles on the same node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    id: NodeId,
    dir: PathBuf,
    raft: Raft<TypeConfig>,
    /// Taken at shutdown, so reads stop and the state-machine tree can close.
    reader: Mutex<Option<TrackedReader>>,
    /// Learns when openraft has dropped the storage; taken by the first shutdown.
    closed: tokio::sync::Mutex<Option<Closed>>,
    counters: Arc<LogCounters>,
    client_timeout: Mutex<Duration>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.inner.id)
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens (or creates) the node directory `dir` and starts Raft on it as node `id`,
    /// reaching its peers through `network`. A new node joins nothing: initialize a cluster
    /// through [`raft`](Self::raft) (`initialize`), or add it from the leader.
    ///
    /// # Errors
    /// [`NodeError::Config`] for an invalid `config`, [`NodeError::Storage`] if the
    /// directory cannot be opened (`Locked` if it is open elsewhere), [`NodeError::Raft`]
    /// if openraft fails to read its state.
    pub async fn start<N>(
        id: NodeId,
        dir: impl Into<PathBuf>,
        config: Config,
        network: N,
    ) -> Result<Node, NodeError>
    where
        N: RaftNetworkFactory<TypeConfig>,
    {
        let dir = dir.into();
        let config = Arc::new(config.validate().map_err(NodeError::Config)?);
        let path = dir.clone();
        let (log, sm) =
            tokio::task::spawn_blocking(move || crate::open_with(&path, Options::default()))
                .await
                .map_err(NodeError::Task)?
                .map_err(NodeError::Storage)?;
        let (open, closed) = tracked::open_closed();
        let counters = Arc::new(LogCounters::default());
        let (log, sm, reader) = tracked::track(log, sm, &open, counters.clone());
        drop(open);
        let raft = Raft::new(id, config, network, log, sm)
            .await
            .map_err(NodeError::Raft)?;
        Ok(Node {
            inner: Arc::new(Inner {
                id,
                dir,
                raft,
                reader: Mutex::new(Some(reader)),
                closed: tokio::sync::Mutex::new(Some(closed)),
                counters,
                client_timeout: Mutex::new(DEFAULT_CLIENT_TIMEOUT),
            }),
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// The node directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The Raft instance, for membership changes, metrics and triggers.
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.inner.raft
    }

    /// A receiver of this node's Raft metrics.
    pub fn metrics(&self) -> watch::Receiver<RaftMetrics<NodeId, BasicNode>> {
        self.inner.raft.metrics()
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// Durable writes this node's log store made since [`start`](Self::start).
    pub fn log_stats(&self) -> LogStats {
        self.inner.counters.stats()
    }

    /// Sets how long [`write`](Self::write) and [`get`](Self::get) keep trying.
    pub fn set_client_timeout(&self, timeout: Duration) {
        *self
            .inner
            .client_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = timeout;
    }

    fn client_timeout(&self) -> Duration {
        *self
            .inner
            .client_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Proposes `request` if this node is the leader, and returns what applying it gave;
    /// never forwards. Requests over the size limits ([`Request::check_size`]) are answered
    /// at once without being proposed.
    ///
    /// # Errors
    /// [`ClientError::NotLeader`] (nothing proposed); [`ClientError::Unknown`] if Raft
    /// stopped meanwhile; [`ClientError::Stopped`] after shutdown.
    pub async fn write_local(&self, request: Request) -> Result<Response, ClientError> {
        if let Err(rejected) = request.check_size() {
            return Ok(rejected);
        }
        if self.is_shut_down() {
            return Err(ClientError::Stopped);
        }
        match self.inner.raft.client_write(request).await {
            Ok(written) => Ok(written.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => {
                Err(ClientError::NotLeader {
                    leader: to.leader_id,
                    node: to.leader_node,
                })
            }
            // Only membership changes fail this way.
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(ClientError::Rejected {
                    reason: e.to_string(),
                })
            }
            // The entry may have been proposed before Raft stopped.
            Err(RaftError::Fatal(e)) => Err(ClientError::Unknown {
                reason: format!("raft stopped: {e}"),
            }),
        }
    }

    /// Reads `key` linearizably if this node is the leader; never forwards.
    ///
    /// # Errors
    /// [`ClientError::NotLeader`], [`ClientError::NoQuorum`], [`ClientError::Stopped`], or
    /// [`ClientError::Storage`] if the state machine read fails.
    pub async fn get_local(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        if self.is_shut_down() {
            return Err(ClientError::Stopped);
        }
        match self.inner.raft.ensure_linearizable().await {
            Ok(_) => self.read_applied(key),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(to))) => {
                Err(ClientError::NotLeader {
                    leader: to.leader_id,
                    node: to.leader_node,
                })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(ClientError::NoQuorum {
                    reason: e.to_string(),
                })
            }
            Err(RaftError::Fatal(_)) => Err(ClientError::Stopped),
        }
    }

    /// The value of `key` in this node's state machine as applied so far, without asking
    /// anyone: possibly stale. For checks after the cluster has settled.
    ///
    /// # Errors
    /// [`ClientError::Stopped`] after shutdown, [`ClientError::Storage`] if the read fails.
    pub fn read_applied(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        let reader = self
            .inner
            .reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let reader = reader.ok_or(ClientError::Stopped)?;
        reader.get(key).map_err(|e| ClientError::Storage {
            reason: e.to_string(),
        })
    }

    /// Has the leader apply `request`: this node if it leads, else the leader it learns of,
    /// reached through `via`, following new hints until the client timeout passes.
    ///
    /// # Errors
    /// The [`ClientError`] of the last attempt; when
    /// [`may_have_taken_effect`](ClientError::may_have_taken_effect) says so, the write's
    /// outcome is unknown.
    pub async fn write(
        &self,
        request: Request,
        via: &impl Forward,
    ) -> Result<Response, ClientError> {
        let request = &request;
        follow_leader(
            (self.id(), None),
            self.client_timeout(),
            || self.leader_or_self(),
            |to, node| async move {
                match self.remote(to, node) {
                    Some(node) => via.write(to, &node, request.clone()).await,
                    None => self.write_local(request.clone()).await,
                }
            },
        )
        .await
    }

    /// Reads `key` linearizably from the leader: this node if it leads, else the leader it
    /// learns of, reached through `via`.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn get(
        &self,
        key: &[u8],
        via: &impl Forward,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        follow_leader(
            (self.id(), None),
            self.client_timeout(),
            || self.leader_or_self(),
            |to, node| async move {
                match self.remote(to, node) {
                    Some(node) => via.get(to, &node, key.to_vec()).await,
                    None => self.get_local(key).await,
                }
            },
        )
        .await
    }

    /// The address of node `to` if it is another node: `node`, or else the one in the
    /// membership; `None` for this node (or one the membership does not know).
    fn remote(&self, to: NodeId, node: Option<BasicNode>) -> Option<BasicNode> {
        if to == self.id() {
            return None;
        }
        node.or_else(|| {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            metrics
                .membership_config
                .membership()
                .get_node(&to)
                .cloned()
        })
    }

    /// The leader this node knows of with its address, or this node when it knows none.
    fn leader_or_self(&self) -> (NodeId, Option<BasicNode>) {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        match metrics.current_leader {
            Some(leader) if leader != self.id() => {
                let node = metrics.membership_config.membership().get_node(&leader);
                (leader, node.cloned())
            }
            _ => (self.id(), None),
        }
    }

    fn is_shut_down(&self) -> bool {
        self.inner
            .reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Stops Raft and waits until its storage is closed, so `dir` can be opened again (in
    /// this process too). Client operations answer [`ClientError::Stopped`] afterwards;
    /// calling it again does nothing.
    ///
    /// # Errors
    /// [`NodeError::CloseTimeout`] if openraft still holds the storage after 30 s.
    pub async fn shutdown(&self) -> Result<(), NodeError> {
        let mut closed = self.inner.closed.lock().await;
        let Some(mut waiting) = closed.take() else {
            return Ok(());
        };
        // Only a panicked core task makes this fail; it has stopped either way.
        let _ = self.inner.raft.shutdown().await;
        self.inner
            .reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        tokio::time::timeout(CLOSE_TIMEOUT, waiting.wait())
            .await
            .map_err(|_| NodeError::CloseTimeout {
                dir: self.inner.dir.clone(),
                waited: CLOSE_TIMEOUT,
            })
    }
}
