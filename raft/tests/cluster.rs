//! Clusters of bfkv-raft nodes in one process, over the in-process [`Router`]: elections,
//! replication, crashes and restarts, snapshots, membership changes, and a linearizability
//! check of concurrent clients while leaders fail.
//!
//! Every wait is bounded (`WAIT`); a test that fails names the condition that never came.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bfkv_raft::linearizability::{check, Call, History, Outcome, Reply};
use bfkv_raft::node::{self, Node};
use bfkv_raft::router::Router;
use bfkv_raft::{NodeId, Request, Response};
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::time::{sleep, timeout};

/// The longest any single condition is waited for.
const WAIT: Duration = Duration::from_secs(10);
/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(10);

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i}").into_bytes()
}

fn put(key: Vec<u8>, value: Vec<u8>) -> Request {
    Request::Put { key, value }
}

/// Starts nodes `ids` under `dir` and initializes them as one cluster; waits for a leader.
async fn start_cluster(dir: &Path, ids: &[NodeId], config: &Config) -> Router {
    let router = Router::new();
    for &id in ids {
        let node = router.start(id, node_dir(dir, id), config.clone()).await;
        node.expect("start node");
    }
    let members: BTreeMap<NodeId, BasicNode> = ids
        .iter()
        .map(|&id| (id, BasicNode::new(format!("node-{id}"))))
        .collect();
    let first = router.node(ids[0]).expect("first node");
    first.raft().initialize(members).await.expect("initialize");
    wait_leader(&router, ids).await;
    router
}

fn node_dir(dir: &Path, id: NodeId) -> std::path::PathBuf {
    dir.join(format!("node-{id}"))
}

fn node(router: &Router, id: NodeId) -> Node {
    router
        .node(id)
        .unwrap_or_else(|| panic!("node {id} is not running"))
}

/// The leader every node of `among` names, if they agree and it says it leads.
fn agreed_leader(router: &Router, among: &[NodeId]) -> Option<NodeId> {
    let nodes: Vec<Node> = among.iter().filter_map(|&id| router.node(id)).collect();
    let leader = nodes.first()?.leader()?;
    let agreed = among.contains(&leader) && nodes.iter().all(|n| n.leader() == Some(leader));
    let leads = router.node(leader)?.metrics().borrow().state == ServerState::Leader;
    (agreed && leads).then_some(leader)
}

/// Waits until the nodes `among` agree on a leader among them.
async fn wait_leader(router: &Router, among: &[NodeId]) -> NodeId {
    let agreed = timeout(WAIT, async {
        loop {
            if let Some(leader) = agreed_leader(router, among) {
                return leader;
            }
            sleep(POLL).await;
        }
    });
    agreed
        .await
        .unwrap_or_else(|_| panic!("nodes {among:?} agreed on no leader within {WAIT:?}"))
}

/// Waits until each node of `ids` has applied every write `leader` acknowledged.
async fn wait_caught_up(router: &Router, ids: &[NodeId], leader: NodeId) {
    // Every acknowledged write is committed at or below the log id a linearizable read on
    // the leader confirms now. The leader's `last_applied` metric is no such bound: under
    // load it was seen behind the last acknowledged write, and a follower killed after
    // catching up to it lacked that write.
    // A node healed after a partition raises its term (openraft 0.9 has no pre-vote), which
    // can cost `leader` its office: then ask whoever leads next, whose log holds every
    // committed entry.
    let read = timeout(WAIT, async {
        let mut asked = leader;
        loop {
            if let Ok(read) = node(router, asked).raft().ensure_linearizable().await {
                return read;
            }
            sleep(POLL).await;
            let running: Vec<NodeId> = router.nodes().iter().map(Node::id).collect();
            asked = wait_leader(router, &running).await;
        }
    });
    let read = read
        .await
        .unwrap_or_else(|_| panic!("leader {leader} and successors: no read within {WAIT:?}"));
    let index = read.map(|log_id| log_id.index);
    for &id in ids {
        let waited = node(router, id)
            .raft()
            .wait(Some(WAIT))
            .applied_index_at_least(index, "catch up with the leader")
            .await;
        waited.unwrap_or_else(|e| panic!("node {id} did not catch up to {index:?}: {e}"));
    }
}

/// Writes `request` through node `via` (forwarded to the leader); panics on failure.
async fn write(router: &Router, via: NodeId, request: Request) -> Response {
    let node = node(router, via);
    let written = node.write(request, &router.network(via)).await;
    written.unwrap_or_else(|e| panic!("write through node {via}: {e}"))
}

/// Reads `key` linearizably through node `via`; panics on failure.
async fn get(router: &Router, via: NodeId, key: &[u8]) -> Option<Vec<u8>> {
    let node = node(router, via);
    let read = node.get(key, &router.network(via)).await;
    read.unwrap_or_else(|e| panic!("read through node {via}: {e}"))
}

/// Checks every node of `ids` holds `expected` in its applied state.
fn assert_holds(router: &Router, ids: &[NodeId], expected: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for &id in ids {
        let node = node(router, id);
        for (k, v) in expected {
            let found = node.read_applied(k).expect("read applied state");
            assert_eq!(found.as_ref(), Some(v), "node {id}, key {k:?}");
        }
    }
}

fn other_than(ids: &[NodeId], leader: NodeId) -> Vec<NodeId> {
    ids.iter().copied().filter(|&id| id != leader).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_elects_a_leader_and_replicates() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    let router = start_cluster(dir.path(), &ids, &node::config()).await;
    let leader = wait_leader(&router, &ids).await;
    let follower = other_than(&ids, leader)[0];

    // Through a follower: each write is forwarded to the leader.
    let mut expected = BTreeMap::new();
    for i in 0..50 {
        let response = write(&router, follower, put(key(i), value(i))).await;
        assert_eq!(response, Response::Put { previous: None });
        expected.insert(key(i), value(i));
    }
    let cas = Request::Cas {
        key: key(0),
        expected: Some(value(0)),
        new: Some(b"swapped".to_vec()),
    };
    let response = write(&router, leader, cas).await;
    let current = Some(b"swapped".to_vec());
    assert_eq!(
        response,
        Response::Cas {
            swapped: true,
            current: current.clone()
        }
    );
    expected.insert(key(0), b"swapped".to_vec());
    let removed = write(&router, follower, Request::Delete { key: key(1) }).await;
    assert_eq!(
        removed,
        Response::Delete {
            previous: Some(value(1))
        }
    );
    expected.remove(&key(1));

    for (k, v) in &expected {
        assert_eq!(get(&router, follower, k).await.as_ref(), Some(v));
    }
    assert_eq!(get(&router, leader, &key(1)).await, None);
    wait_caught_up(&router, &ids, leader).await;
    assert_holds(&router, &ids, &expected);
    router.shutdown_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_new_leader_elected_no_acknowledged_write_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    let router = start_cluster(dir.path(), &ids, &node::config()).await;
    let old_leader = wait_leader(&router, &ids).await;

    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4usize {
        let (router, acked, stop) = (router.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            for n in 0..2000usize {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // Each write goes through a running node, round robin.
                let nodes = router.nodes();
                let via = &nodes[(w + n) % nodes.len()];
                let (k, v) = (format!("w{w}-{n}").into_bytes(), value(n));
                let request = put(k.clone(), v.clone());
                if via.write(request, &router.network(via.id())).await.is_ok() {
                    acked.lock().unwrap().insert(k, v);
                }
            }
        }));
    }
    let acked_count = || acked.lock().unwrap().len();
    wait_until("50 writes acknowledged", || acked_count() >= 50).await;

    router.kill(old_leader).await.unwrap();
    let survivors = other_than(&ids, old_leader);
    let new_leader = wait_leader(&router, &survivors).await;
    assert_ne!(new_leader, old_leader);
    let before = acked_count();
    wait_until("50 more writes acknowledged", || {
        acked_count() >= before + 50
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        timeout(WAIT, writer).await.expect("writer stops").unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    for (k, v) in &acked {
        assert_eq!(
            get(&router, survivors[0], k).await.as_ref(),
            Some(v),
            "{k:?}"
        );
    }
    wait_caught_up(&router, &survivors, new_leader).await;
    assert_holds(&router, &survivors, &acked);
    router.shutdown_all().await.unwrap();
}

/// Waits until `done()` holds.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let waited = timeout(WAIT, async {
        while !done() {
            sleep(POLL).await;
        }
    });
    waited
        .await
        .unwrap_or_else(|_| panic!("not within {WAIT:?}: {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_restarted_from_its_directory_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    let config = node::config();
    let router = start_cluster(dir.path(), &ids, &config).await;
    let leader = wait_leader(&router, &ids).await;
    let follower = other_than(&ids, leader)[0];

    let mut expected = BTreeMap::new();
    for i in 0..100 {
        write(&router, leader, put(key(i), value(i))).await;
        expected.insert(key(i), value(i));
    }
    wait_caught_up(&router, &[follower], leader).await;
    router.kill(follower).await.unwrap();
    for i in 100..200 {
        write(&router, leader, put(key(i), value(i))).await;
        expected.insert(key(i), value(i));
    }

    // Killing closed its trees: the directory opens, and holds what it had applied.
    let (log, sm) = bfkv_raft::open(node_dir(dir.path(), follower)).expect("reopen");
    assert_eq!(sm.get(key(99)).unwrap(), Some(value(99)));
    assert_eq!(sm.get(key(100)).unwrap(), None);
    drop((log, sm));

    // Same id, same directory: it finds its log and state machine and is sent the rest.
    let restarted = router
        .start(follower, node_dir(dir.path(), follower), config)
        .await;
    restarted.expect("restart the follower");
    wait_caught_up(&router, &[follower], leader).await;
    assert_holds(&router, &[follower], &expected);
    router.shutdown_all().await.unwrap();
}

/// The live state-machine generation named by `<node>/sm/CURRENT` (1 until a snapshot is
/// installed).
fn sm_generation(dir: &Path) -> u64 {
    let current = std::fs::read_to_string(dir.join("sm").join("CURRENT")).unwrap();
    let digits = current.trim().trim_start_matches("gen-");
    digits
        .parse()
        .unwrap_or_else(|_| panic!("sm/CURRENT: {current:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lagging_follower_caught_up_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    // A snapshot every 20 entries, and no entry kept once it is in one.
    let mut config = node::config();
    config.snapshot_policy = SnapshotPolicy::LogsSinceLast(20);
    config.max_in_snapshot_log_to_keep = 0;
    let router = start_cluster(dir.path(), &ids, &config).await;
    let leader = wait_leader(&router, &ids).await;
    let lagging = other_than(&ids, leader)[0];

    let mut expected = BTreeMap::new();
    for i in 0..5 {
        write(&router, leader, put(key(i), value(i))).await;
        expected.insert(key(i), value(i));
    }
    wait_caught_up(&router, &[lagging], leader).await;
    let lagging_node = node(&router, lagging);
    let behind = lagging_node.metrics().borrow().last_log_index.unwrap_or(0);
    router.isolate(lagging);
    for i in 5..120 {
        write(&router, leader, put(key(i), value(i))).await;
        expected.insert(key(i), value(i));
    }
    // The leader must have purged entries the lagging node lacks: only a snapshot helps it.
    let waited = node(&router, leader)
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index > behind + 10),
            "leader purges past the lagging node",
        )
        .await;
    waited.expect("leader purged");
    assert_eq!(sm_generation(&node_dir(dir.path(), lagging)), 1);
    router.heal(lagging);
    wait_caught_up(&router, &[lagging], leader).await;

    // Its term rose while it was cut off, so healing it may cost the leader its office;
    // whoever leads then sends its own snapshot, which still covers what it lacked.
    let snapshot = lagging_node.metrics().borrow().snapshot;
    assert!(
        snapshot.is_some_and(|s| s.index > behind),
        "lagging node (at {behind}) has no snapshot past it: {snapshot:?}"
    );
    // Installing a snapshot switches the state machine to a new generation.
    assert!(sm_generation(&node_dir(dir.path(), lagging)) >= 2);
    assert_holds(&router, &[lagging], &expected);
    router.shutdown_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_add_learner_then_promote() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    let config = node::config();
    let router = start_cluster(dir.path(), &ids, &config).await;
    let leader = wait_leader(&router, &ids).await;
    let mut expected = BTreeMap::new();
    for i in 0..30 {
        write(&router, leader, put(key(i), value(i))).await;
        expected.insert(key(i), value(i));
    }

    let new = 4;
    router
        .start(new, node_dir(dir.path(), new), config)
        .await
        .unwrap();
    let leader_node = node(&router, leader);
    let learner = BasicNode::new(format!("node-{new}"));
    // Blocking: returns once the learner has caught up with the leader's log.
    let added = timeout(WAIT, leader_node.raft().add_learner(new, learner, true)).await;
    added.expect("add_learner in time").expect("add_learner");
    wait_caught_up(&router, &[new], leader).await;
    assert_holds(&router, &[new], &expected);
    let state = node(&router, new).metrics().borrow().state;
    assert_eq!(state, ServerState::Learner);

    let voters = [1, 2, 3, new];
    let promoted = timeout(WAIT, leader_node.raft().change_membership(voters, false)).await;
    promoted
        .expect("change_membership in time")
        .expect("change_membership");
    for id in voters {
        let waited = node(&router, id)
            .raft()
            .wait(Some(WAIT))
            .voter_ids(voters, "node 4 is a voter")
            .await;
        waited.unwrap_or_else(|e| panic!("node {id}: {e}"));
    }
    // The new voter serves clients like any other node.
    for i in 30..40 {
        write(&router, new, put(key(i), value(i))).await;
        expected.insert(key(i), value(i));
    }
    for (k, v) in &expected {
        assert_eq!(get(&router, new, k).await.as_ref(), Some(v));
    }
    router.shutdown_all().await.unwrap();
}

/// xorshift64*: the clients' choices, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// What the linearizability test's clients share with it.
#[derive(Default)]
struct Clients {
    /// Set when the test wants them to finish.
    stop: AtomicBool,
    /// Operations completed (with a known outcome or not).
    done: AtomicUsize,
    /// Clients that have finished.
    exited: AtomicUsize,
}

/// One client of the linearizability test: up to `ops` operations on `KEYS` through random
/// nodes, each recorded in `history`.
async fn client(
    router: Router,
    history: History,
    id: u64,
    seed: u64,
    ops: usize,
    shared: Arc<Clients>,
) {
    const KEYS: [&str; 3] = ["x", "y", "z"];
    let mut rng = Rng(seed ^ (id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // The last value this client saw per key: what its swaps expect.
    let mut last_seen: BTreeMap<&str, Option<Vec<u8>>> = BTreeMap::new();
    for n in 0..ops {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let key = KEYS[rng.below(KEYS.len())];
        let nodes = router.nodes();
        let via = nodes[rng.below(nodes.len())].clone();
        let network = router.network(via.id());
        let fresh = Some(format!("c{id}-{n}").into_bytes());
        let choice = rng.below(10);
        if choice < 4 {
            let op = history.invoke(id, key, Call::Read);
            match via.get(key.as_bytes(), &network).await {
                Ok(found) => {
                    last_seen.insert(key, found.clone());
                    history.complete(op, Reply::Read(found));
                }
                Err(_) => history.fail_unknown(op),
            }
        } else {
            let (call, request) = match choice {
                4..=6 => {
                    let request = put(key.into(), fresh.clone().unwrap_or_default());
                    (Call::Write(fresh), request)
                }
                7 => (Call::Write(None), Request::Delete { key: key.into() }),
                _ => {
                    let expected = last_seen.get(key).cloned().flatten();
                    let call = Call::Cas {
                        expected: expected.clone(),
                        new: fresh.clone(),
                    };
                    (
                        call,
                        Request::Cas {
                            key: key.into(),
                            expected,
                            new: fresh,
                        },
                    )
                }
            };
            let op = history.invoke(id, key, call);
            match via.write(request, &network).await {
                Ok(Response::Cas { swapped, current }) => {
                    last_seen.insert(key, current);
                    history.complete(op, Reply::Cas(swapped));
                }
                Ok(Response::Put { .. } | Response::Delete { .. }) => {
                    history.complete(op, Reply::Write);
                }
                Ok(other) => panic!("unexpected response {other:?}"),
                Err(_) => history.fail_unknown(op),
            }
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    shared.exited.fetch_add(1, Ordering::Relaxed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizability_under_leader_failures() {
    const CLIENTS: u64 = 4;
    // A bound, not a target: the clients stop when the faults are over (some 500
    // operations, most of the time spent while a leader is cut off).
    const MAX_OPS: usize = 500;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1);
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    let config = node::config();
    let router = start_cluster(dir.path(), &ids, &config).await;
    // Short client deadlines: an operation stuck on an isolated leader gives up soon.
    let short_deadline = |node: &Node| node.set_client_timeout(Duration::from_secs(1));
    router.nodes().iter().for_each(short_deadline);

    let history = History::new();
    let shared = Arc::new(Clients::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let (router, history, shared) = (router.clone(), history.clone(), shared.clone());
            tokio::spawn(client(router, history, id, seed, MAX_OPS, shared))
        })
        .collect();
    // Waits until the clients have finished `n` more operations (or all their operations:
    // then the faults that remain find no clients, and the test is merely weaker).
    let progress = |n: usize| {
        let target = shared.done.load(Ordering::Relaxed) + n;
        let shared = shared.clone();
        async move {
            wait_until("client progress", || {
                shared.done.load(Ordering::Relaxed) >= target
                    || shared.exited.load(Ordering::Relaxed) == CLIENTS as usize
            })
            .await;
        }
    };

    progress(40).await;
    // 1: the leader is cut off; the others elect a new one; it comes back.
    let leader = wait_leader(&router, &ids).await;
    router.isolate(leader);
    wait_leader(&router, &other_than(&ids, leader)).await;
    progress(40).await;
    router.heal(leader);
    wait_leader(&router, &ids).await;
    progress(40).await;
    // 2: the leader crashes and restarts from its directory.
    let leader = wait_leader(&router, &ids).await;
    router.kill(leader).await.unwrap();
    wait_leader(&router, &other_than(&ids, leader)).await;
    progress(40).await;
    let restarted = router
        .start(leader, node_dir(dir.path(), leader), config)
        .await;
    short_deadline(&restarted.expect("restart the old leader"));
    wait_leader(&router, &ids).await;
    progress(40).await;
    // 3: the new leader is cut off, then heals.
    let leader = wait_leader(&router, &ids).await;
    router.isolate(leader);
    wait_leader(&router, &other_than(&ids, leader)).await;
    progress(40).await;
    router.heal(leader);
    wait_leader(&router, &ids).await;
    progress(40).await;

    shared.stop.store(true, Ordering::Relaxed);
    for client in clients {
        timeout(WAIT, client).await.expect("client stops").unwrap();
    }
    router.shutdown_all().await.unwrap();
    let operations = history.operations();
    let unknown = operations
        .iter()
        .filter(|op| op.outcome == Outcome::Unknown);
    let unknown = unknown.count();
    eprintln!(
        "seed {seed}: {} operations, {unknown} with unknown outcome",
        operations.len()
    );
    let verdict = check(&history);
    assert!(verdict.is_linearizable(), "seed {seed}: {verdict}");
}
