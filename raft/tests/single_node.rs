//! A one-node openraft cluster on bfkv storage, end to end: writes through raft, a
//! snapshot after which openraft purges the log it covers, and a restart of the node that
//! finds the vote, the applied state and the snapshot again and goes on writing.
//!
//! If it fails, the storage works piece by piece (the suite) but not as openraft drives
//! it: startup from a purged log, the order of snapshot and purge, the log reader.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bfkv_raft::{NodeId, Reader, Request, Response, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};

/// The network of a one-node cluster: there is no peer to reach.
struct NoPeers;

/// The error every RPC to a peer answers.
fn no_peer<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(
        "a one-node cluster has no peers",
    )))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(no_peer())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(no_peer())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(no_peer())
    }
}

/// Starts node 1 on the node directory `dir` and waits until it leads.
async fn start(dir: &Path, initialize: bool) -> (Raft<TypeConfig>, Reader) {
    let config = Config {
        // Snapshots only when the test asks; then purge everything they cover at once.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Config::default()
    };
    let (log_store, state_machine) = open_when_released(dir).await;
    let reader = state_machine.reader();
    let raft = Raft::new(
        1,
        Arc::new(config.validate().unwrap()),
        NoPeers,
        log_store,
        state_machine,
    )
    .await
    .unwrap();
    if initialize {
        let members = BTreeMap::from([(1, BasicNode::new("local"))]);
        raft.initialize(members).await.unwrap();
    }
    raft.wait(Some(Duration::from_secs(10)))
        .state(ServerState::Leader, "node 1 leads")
        .await
        .unwrap();
    (raft, reader)
}

/// Opens the node directory `dir`, waiting up to 10 s for a previous run to let go of it:
/// `Raft::shutdown` returns when the raft task ends, and openraft's state-machine task
/// drops the state machine (closing its tree) a moment later.
async fn open_when_released(dir: &Path) -> (bfkv_raft::LogStore, bfkv_raft::StateMachine) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match bfkv_raft::open(dir) {
            Ok(opened) => return opened,
            Err(e) if tokio::time::Instant::now() > deadline => {
                panic!("{} not released: {e}", dir.display())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Proposes `request` and returns what applying it answered, with its log index.
async fn write(raft: &Raft<TypeConfig>, request: Request) -> (u64, Response) {
    let written = raft.client_write(request).await.unwrap();
    (written.log_id.index, written.data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_writes_snapshots_purges_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (raft, reader) = start(dir.path(), true).await;
    for i in 0..50u32 {
        let put = Request::Put {
            key: i.to_be_bytes().to_vec(),
            value: vec![7; 100],
        };
        assert_eq!(write(&raft, put).await.1, Response::Put { previous: None });
    }
    let cas = Request::Cas {
        key: 0u32.to_be_bytes().to_vec(),
        expected: Some(vec![7; 100]),
        new: None,
    };
    let (last, response) = write(&raft, cas).await;
    assert_eq!(
        response,
        Response::Cas {
            swapped: true,
            current: None
        }
    );
    raft.ensure_linearizable().await.unwrap();
    assert_eq!(reader.get(1u32.to_be_bytes()).unwrap(), Some(vec![7; 100]));
    assert_eq!(reader.get(0u32.to_be_bytes()).unwrap(), None);

    raft.trigger().snapshot().await.unwrap();
    let wait = raft.wait(Some(Duration::from_secs(10)));
    let metrics = wait
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index == last),
            "snapshot of every write",
        )
        .await
        .unwrap();
    let snapshot = metrics.snapshot;
    wait.purged(snapshot, "log purged up to the snapshot")
        .await
        .unwrap();
    raft.shutdown().await.unwrap();
    drop((raft, reader));

    // Everything the log held is in the snapshot now: the restart starts from it.
    let (raft, reader) = start(dir.path(), false).await;
    let metrics = raft.metrics().borrow().clone();
    assert_eq!(metrics.snapshot, snapshot);
    assert!(metrics
        .last_applied
        .is_some_and(|applied| applied.index >= last));
    assert_eq!(reader.get(49u32.to_be_bytes()).unwrap(), Some(vec![7; 100]));
    let delete = Request::Delete {
        key: 49u32.to_be_bytes().to_vec(),
    };
    assert_eq!(
        write(&raft, delete).await.1,
        Response::Delete {
            previous: Some(vec![7; 100])
        }
    );
    raft.ensure_linearizable().await.unwrap();
    assert_eq!(reader.get(49u32.to_be_bytes()).unwrap(), None);
    raft.shutdown().await.unwrap();
}
