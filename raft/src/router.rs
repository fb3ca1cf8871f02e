//! An in-process network for tests: Raft RPCs and forwarded client requests are calls on
//! the target [`Node`], with switches to cut a node off.
//!
//! [`Router::network`] gives node `from` its view of the network: a
//! [`RaftNetworkFactory`] for its Raft and a [`Forward`] for its client operations. Every
//! call from `from` to `to` fails with `Unreachable` (nothing delivered) if either is
//! isolated or `to` is not registered, and with a lost answer if either became isolated
//! while the call ran, as a partition that starts mid-request would. Snapshots travel as
//! openraft's chunked `install_snapshot` calls (the default `full_snapshot` for a
//! `Cursor<Vec<u8>>` snapshot), the same path as over TCP.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Config};

use crate::client::{ClientError, Forward};
use crate::node::{Node, NodeError};
use crate::{NodeId, Request, Response, TypeConfig};

/// How long a Raft connection waits before retrying an unreachable node: short, so a
/// healed or restarted node is caught up soon (openraft's default is 500 ms).
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(50);

/// The in-process network: the registered nodes and which of them are isolated. Clones
/// share it.
///
/// ```
/// use std::collections::BTreeMap;
/// use bfkv_raft::{node, router::Router, Request, Response};
/// use openraft::BasicNode;
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let router = Router::new();
/// let node = router.start(1, dir.path(), node::config()).await?;
/// node.raft().initialize(BTreeMap::from([(1, BasicNode::default())])).await?;
/// let put = Request::Put { key: b"k".to_vec(), value: b"v".to_vec() };
/// let via = router.network(1);
/// assert_eq!(node.write(put, &via).await?, Response::Put { previous: None });
/// assert_eq!(node.get(b"k", &via).await?, Some(b"v".to_vec()));
/// router.shutdown_all().await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Router {
    inner: Arc<Mutex<Links>>,
}

#[derive(Default)]
struct Links {
    nodes: BTreeMap<NodeId, Node>,
    isolated: BTreeSet<NodeId>,
}

/// Why a call between two nodes could not be delivered.
#[derive(Debug)]
struct Cut(String);

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cut {}

impl Router {
    /// An empty network.
    pub fn new() -> Self {
        Self::default()
    }

    fn links(&self) -> MutexGuard<'_, Links> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Node `from`'s view of the network.
    pub fn network(&self, from: NodeId) -> RouterNetwork {
        RouterNetwork {
            router: self.clone(),
            from,
        }
    }

    /// Starts node `id` on directory `dir` with `config`, connected to this network, and
    /// registers it.
    ///
    /// # Errors
    /// As [`Node::start`].
    pub async fn start(
        &self,
        id: NodeId,
        dir: impl Into<PathBuf>,
        config: Config,
    ) -> Result<Node, NodeError> {
        let node = Node::start(id, dir, config, self.network(id)).await?;
        self.links().nodes.insert(id, node.clone());
        Ok(node)
    }

    /// Registered node `id`.
    pub fn node(&self, id: NodeId) -> Option<Node> {
        self.links().nodes.get(&id).cloned()
    }

    /// Every registered node, by id.
    pub fn nodes(&self) -> Vec<Node> {
        self.links().nodes.values().cloned().collect()
    }

    /// Unregisters node `id` (calls to it fail from now on) and shuts it down: a crash of
    /// the process, with the directory left as it was.
    ///
    /// # Errors
    /// As [`Node::shutdown`]. Nothing happens to an unknown id.
    pub async fn kill(&self, id: NodeId) -> Result<(), NodeError> {
        let node = self.links().nodes.remove(&id);
        match node {
            Some(node) => node.shutdown().await,
            None => Ok(()),
        }
    }

    /// Shuts every node down (the end of a test: the trees close before their directories
    /// go).
    ///
    /// # Errors
    /// The first [`Node::shutdown`] error; every node is shut down regardless.
    pub async fn shutdown_all(&self) -> Result<(), NodeError> {
        let nodes = std::mem::take(&mut self.links().nodes);
        let mut result = Ok(());
        for node in nodes.into_values() {
            let stopped = node.shutdown().await;
            result = result.and(stopped);
        }
        result
    }

    /// Cuts node `id` off: calls to and from it fail until [`heal`](Self::heal).
    pub fn isolate(&self, id: NodeId) {
        self.links().isolated.insert(id);
    }

    /// Reconnects an isolated node.
    pub fn heal(&self, id: NodeId) {
        self.links().isolated.remove(&id);
    }

    /// The node a call from `from` to `to` reaches now, if the link is up.
    fn reach(&self, from: NodeId, to: NodeId) -> Result<Node, Cut> {
        let links = self.links();
        if links.isolated.contains(&from) || links.isolated.contains(&to) {
            return Err(Cut(format!("link {from} -> {to} is cut")));
        }
        links
            .nodes
            .get(&to)
            .cloned()
            .ok_or_else(|| Cut(format!("node {to} is not running")))
    }

    /// Whether the link from `from` to `to` is up (both may be gone or running).
    fn linked(&self, from: NodeId, to: NodeId) -> bool {
        let links = self.links();
        !links.isolated.contains(&from) && !links.isolated.contains(&to)
    }
}

/// Node `from`'s view of a [`Router`]: its Raft's network and its client forwarding.
#[derive(Clone)]
pub struct RouterNetwork {
    router: Router,
    from: NodeId,
}

/// A Raft connection from one node to another over a [`Router`].
pub struct RouterConnection {
    router: Router,
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for RouterNetwork {
    type Network = RouterConnection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> RouterConnection {
        RouterConnection {
            router: self.router.clone(),
            from: self.from,
            to: target,
        }
    }
}

/// The error of an RPC whose target answered `Err(e)`: a stopped target counts as
/// unreachable (openraft then backs off), any other error is the remote's.
fn remote<E>(
    to: NodeId,
    e: RaftError<NodeId, E>,
) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>>
where
    E: std::error::Error,
{
    match e {
        RaftError::Fatal(Fatal::Stopped) => {
            RPCError::Unreachable(Unreachable::new(&Cut(format!("node {to} stopped"))))
        }
        e => RPCError::RemoteError(RemoteError::new(to, e)),
    }
}

impl RouterConnection {
    /// Delivers `call` to the target's Raft unless the link is cut before or while it runs.
    async fn deliver<T, E, F, Fut>(
        &self,
        call: F,
    ) -> Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error,
        F: FnOnce(Node) -> Fut,
        Fut: std::future::Future<Output = Result<T, RaftError<NodeId, E>>>,
    {
        let node = self
            .router
            .reach(self.from, self.to)
            .map_err(|cut| RPCError::Unreachable(Unreachable::new(&cut)))?;
        let answer = call(node).await;
        if !self.router.linked(self.from, self.to) {
            let cut = Cut(format!(
                "link {} -> {} cut during the call",
                self.from, self.to
            ));
            return Err(RPCError::Network(NetworkError::new(&cut)));
        }
        answer.map_err(|e| remote(self.to, e))
    }
}

impl RaftNetwork<TypeConfig> for RouterConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.deliver(|node| async move { node.raft().append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.deliver(|node| async move { node.raft().install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.deliver(|node| async move { node.raft().vote(rpc).await })
            .await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }
}

impl RouterNetwork {
    /// Runs a client operation on node `to` unless the link is cut before or while it runs.
    async fn forward<T, F, Fut>(&self, to: NodeId, call: F) -> Result<T, ClientError>
    where
        F: FnOnce(Node) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let node = self
            .router
            .reach(self.from, to)
            .map_err(|cut| ClientError::Unreachable {
                node: to,
                reason: cut.0,
            })?;
        let answer = call(node).await;
        if !self.router.linked(self.from, to) {
            return Err(ClientError::Unknown {
                reason: format!("link {} -> {to} cut during the call", self.from),
            });
        }
        answer
    }
}

impl Forward for RouterNetwork {
    async fn write(
        &self,
        to: NodeId,
        _node: &BasicNode,
        request: Request,
    ) -> Result<Response, ClientError> {
        self.forward(to, |node| async move { node.write_local(request).await })
            .await
    }

    async fn get(
        &self,
        to: NodeId,
        _node: &BasicNode,
        key: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        self.forward(to, |node| async move { node.get_local(&key).await })
            .await
    }
}
