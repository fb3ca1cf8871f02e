//! Faults under a node's storage, each as found by an adversarial run (issue "bfkv-raft
//! never forgets a vote or an acknowledged entry"): a byte flipped in the log a crash left
//! unsealed, a log tree rolled back, a state machine emptied, lost or behind the log's
//! purge point, `CURRENT` lost, a damaged page in the state machine or in the log tree,
//! a snapshot pack damaged before it was sealed. Each must make `bfkv_raft::open` (or the
//! snapshot build or install) fail with an error, never serve a node that forgot a vote
//! or an entry or spread damage; and a node that refuses to start is replaced by a new
//! member through a membership change.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bfkv_raft::node::{self, Node};
use bfkv_raft::router::Router;
use bfkv_raft::{LogStore, NodeId, Request, StateMachine, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    BasicNode, CommittedLeaderId, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder,
    ServerState, Snapshot, Vote,
};
use tokio::time::{sleep, timeout};

type Entry = openraft::Entry<TypeConfig>;

fn id(index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(1, 0), index)
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

/// A value of about `len` bytes that says which entry wrote it.
fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(len, b'v');
    v
}

fn entry(i: u64, len: usize) -> Entry {
    Entry {
        log_id: id(i),
        payload: EntryPayload::Normal(Request::Put {
            key: key(i),
            value: value(i, len),
        }),
    }
}

fn open(dir: &Path) -> Result<(LogStore, StateMachine), openraft::StorageError<NodeId>> {
    bfkv_raft::open(dir)
}

/// Appends entries `from..=to` (values of `len` bytes), `per_append` to an append, each
/// append durable before the next.
async fn append(log: &mut LogStore, from: u64, to: u64, len: usize, per_append: u64) {
    let mut i = from;
    while i <= to {
        let last = (i + per_append - 1).min(to);
        log.blocking_append((i..=last).map(|j| entry(j, len)))
            .await
            .expect("append");
        i = last + 1;
    }
}

/// Appends and applies entries `from..=to`.
async fn append_and_apply(log: &mut LogStore, sm: &mut StateMachine, from: u64, to: u64) {
    append(log, from, to, 100, 10).await;
    sm.apply((from..=to).map(|i| entry(i, 100)))
        .await
        .expect("apply");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// The one segment of the log tree in `node` and the end of its written bytes.
fn log_segment(node: &Path) -> (PathBuf, u64) {
    let wal = node.join("log/wal");
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&wal)
        .expect("wal")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let path = segments.remove(0);
    let bytes = std::fs::read(&path).expect("segment");
    let end = bytes.iter().rposition(|&b| b != 0).expect("records") as u64 + 1;
    (path, end)
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).expect("read");
    bytes[at as usize] ^= 0x08;
    std::fs::write(path, bytes).expect("write");
}

/// What a node holds: its vote and its entries' indexes.
async fn contents(log: &mut LogStore) -> (Option<Vote<NodeId>>, Vec<u64>) {
    let vote = log.read_vote().await.expect("vote");
    let entries = log.try_get_log_entries(..).await.expect("entries");
    (vote, entries.iter().map(|e| e.log_id.index).collect())
}

/// A named place to flip a byte: its offset in the segment file, from where the
/// segment's bytes end.
type Flip = (&'static str, fn(u64) -> u64);

/// A node saves a vote, appends `n` entries (each append synced), saves a newer vote, and
/// crashes; then one byte of its log is flipped, in a copy each, at each of `flips` (a
/// name, and the offset in the segment file as a function of where its bytes end). Each
/// reopen fails: none may come back without the vote or some of the entries.
async fn flips_in_a_crashed_log_are_refused(n: u64, len: usize, flips: &[Flip]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node");
    let crashed = dir.path().join("crashed");
    {
        let (mut log, _sm) = open(&node).expect("open");
        log.save_vote(&Vote::new(2, 1)).await.expect("vote");
        append(&mut log, 1, n, len, 1).await;
        log.save_vote(&Vote::new(3, 1)).await.expect("vote");
        // What a kill leaves: every append and the vote were synced before they returned.
        copy_dir(&node, &crashed);
    }
    let (_, end) = log_segment(&crashed);
    for (what, at) in flips {
        let copy = dir.path().join(format!("flip-{what}"));
        copy_dir(&crashed, &copy);
        let (segment, _) = log_segment(&copy);
        flip(&segment, at(end));
        match open(&copy) {
            Err(_) => {}
            Ok((mut log, _sm)) => {
                let (vote, entries) = contents(&mut log).await;
                panic!(
                    "{n} entries, flip {what} (at {} of {end}): opened with vote {vote:?} and \
                     {} entries",
                    at(end),
                    entries.len()
                );
            }
        }
    }
    // Undamaged, the crashed node has everything.
    let (mut log, _sm) = open(&crashed).expect("open the crashed node");
    let (vote, entries) = contents(&mut log).await;
    assert_eq!(vote, Some(Vote::new(3, 1)));
    assert_eq!(entries, (1..=n).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_flip_in_a_crashed_log_never_loses_the_vote_or_an_entry() {
    flips_in_a_crashed_log_are_refused(
        100,
        100,
        &[
            ("at byte 200", |_| 200),
            ("in the middle", |end| end / 2),
            ("20 bytes from the end", |end| end - 20),
        ],
    )
    .await;
    flips_in_a_crashed_log_are_refused(
        5000,
        700,
        &[
            ("500 KB from the end", |end| end - 500_000),
            ("100 KB from the end", |end| end - 100_000),
            ("20 bytes from the end", |end| end - 20),
        ],
    )
    .await;
}

#[tokio::test]
async fn a_log_tree_rolled_back_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node");
    let old_log = dir.path().join("old-log");
    {
        let (mut log, mut sm) = open(&node).expect("open");
        log.save_vote(&Vote::new(2, 1)).await.expect("vote");
        append_and_apply(&mut log, &mut sm, 1, 10).await;
        drop((log, sm));
        copy_dir(&node.join("log"), &old_log);
        let (mut log, mut sm) = open(&node).expect("reopen");
        log.save_vote(&Vote::new(3, 1)).await.expect("vote");
        append_and_apply(&mut log, &mut sm, 11, 20).await;
    }
    // The log tree put back as it was before the last vote and entries: the node would
    // vote again in term 3, and it lacks entries its state machine applied.
    std::fs::remove_dir_all(node.join("log")).expect("rm");
    copy_dir(&old_log, &node.join("log"));
    assert!(open(&node).is_err(), "a rolled-back log tree opened");
    // With the state machine rolled back too, only the vote file tells.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let node2 = dir2.path().join("node");
    {
        let (mut log, sm) = open(&node2).expect("open");
        log.save_vote(&Vote::new(2, 1)).await.expect("vote");
        drop((log, sm));
        copy_dir(&node2.join("log"), &dir2.path().join("old-log"));
        let (mut log, _sm) = open(&node2).expect("reopen");
        log.save_vote(&Vote::new(3, 1)).await.expect("vote");
    }
    std::fs::remove_dir_all(node2.join("log")).expect("rm");
    copy_dir(&dir2.path().join("old-log"), &node2.join("log"));
    assert!(
        open(&node2).is_err(),
        "a log tree with an older vote opened"
    );
}

/// A node with 50 entries applied, a snapshot at 50, the log purged up to it, and 5 more
/// entries; closed. Also returns a copy of its `sm/` from when 20 entries were applied.
async fn purged_node(dir: &Path) -> (PathBuf, PathBuf) {
    let node = dir.join("node");
    let old_sm = dir.join("old-sm");
    let (mut log, mut sm) = open(&node).expect("open");
    append_and_apply(&mut log, &mut sm, 1, 20).await;
    drop((log, sm));
    copy_dir(&node.join("sm"), &old_sm);
    let (mut log, mut sm) = open(&node).expect("reopen");
    append_and_apply(&mut log, &mut sm, 21, 50).await;
    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot");
    assert_eq!(snapshot.meta.last_log_id, Some(id(50)));
    log.purge(id(50)).await.expect("purge");
    append_and_apply(&mut log, &mut sm, 51, 55).await;
    (node, old_sm)
}

/// The live generation's directory of the node in `node`.
fn live_generation(node: &Path) -> PathBuf {
    let current = std::fs::read_to_string(node.join("sm/CURRENT")).expect("CURRENT");
    node.join("sm").join(current.trim_end())
}

#[tokio::test]
async fn a_state_machine_emptied_lost_or_behind_the_purge_point_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, old_sm) = purged_node(dir.path()).await;
    let case = |name: &str| {
        let copy = dir.path().join(name);
        copy_dir(&node, &copy);
        copy
    };
    // The live generation's tree files deleted, its directory kept.
    let emptied = case("emptied");
    let tree = live_generation(&emptied).join("tree");
    std::fs::remove_dir_all(&tree).expect("rm");
    std::fs::create_dir(&tree).expect("mkdir");
    // All of `sm/` gone.
    let lost = case("lost");
    std::fs::remove_dir_all(lost.join("sm")).expect("rm");
    // An old copy of `sm/` put back: it applied 20 entries, the log is purged to 50.
    let behind = case("behind");
    std::fs::remove_dir_all(behind.join("sm")).expect("rm");
    copy_dir(&old_sm, &behind.join("sm"));
    for (name, copy) in [("emptied", &emptied), ("lost", &lost), ("behind", &behind)] {
        match open(copy) {
            Err(e) => eprintln!("{name}: refused: {e}"),
            Ok((_log, sm)) => panic!(
                "{name}: opened, the state machine holds key 1: {:?}",
                sm.get(key(1))
            ),
        }
        // Refused again, unchanged: the first refusal made nothing up.
        assert!(open(copy).is_err(), "{name}: a second open went through");
    }
    // Untouched, the node opens with its state.
    let (_log, sm) = open(&node).expect("open");
    assert_eq!(sm.get(key(55)).expect("get"), Some(value(55, 100)));
}

#[tokio::test]
async fn current_lost_with_its_generation_intact_is_taken_up_with_its_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, _) = purged_node(dir.path()).await;
    std::fs::remove_file(node.join("sm/CURRENT")).expect("rm CURRENT");
    let (_log, mut sm) = open(&node).expect("open without CURRENT");
    let snapshot = sm.get_current_snapshot().await.expect("snapshot");
    let snapshot = snapshot.expect("the generation's snapshot was ignored");
    assert_eq!(snapshot.meta.last_log_id, Some(id(50)));
    assert_eq!(sm.get(key(55)).expect("get"), Some(value(55, 100)));
    assert!(node.join("sm/CURRENT").exists());
}

/// The 4 KiB pages of `bytes` that hold anything.
fn written_pages(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len() / 4096)
        .filter(|p| bytes[p * 4096..(p + 1) * 4096].iter().any(|&b| b != 0))
        .collect()
}

/// `pristine` with one byte flipped in page `page`.
fn page_damaged(pristine: &[u8], page: usize) -> Vec<u8> {
    let mut bytes = pristine.to_vec();
    bytes[page * 4096 + 2048] ^= 0x10;
    bytes
}

#[tokio::test]
async fn a_damaged_page_of_the_log_tree_is_found_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node");
    {
        let (mut log, _sm) = open(&node).expect("open");
        append(&mut log, 1, 2000, 100, 50).await;
    }
    let data = node.join("log/data");
    let pristine = std::fs::read(&data).expect("read");
    let mut refused = 0;
    for page in written_pages(&pristine) {
        std::fs::write(&data, page_damaged(&pristine, page)).expect("damage");
        match open(&node) {
            Err(_) => refused += 1,
            Ok((mut log, _sm)) => {
                // A page no entry lives on: every entry still reads back whole.
                let entries = log.try_get_log_entries(..).await.unwrap_or_else(|e| {
                    panic!("page {page} damaged: opened, then an entry failed to read: {e}")
                });
                assert_eq!(entries.len(), 2000, "page {page}");
            }
        }
        std::fs::write(&data, &pristine).expect("restore");
    }
    assert!(refused > 0, "no damaged page was found at open");
}

/// A node with `n` keys applied (values of 300 bytes), closed.
async fn node_with(dir: &Path, n: u64) -> PathBuf {
    let (mut log, mut sm) = open(dir).expect("open");
    append(&mut log, 1, n, 300, 20).await;
    sm.apply((1..=n).map(|i| entry(i, 300)))
        .await
        .expect("apply");
    dir.to_path_buf()
}

async fn build_snapshot(sm: &mut StateMachine) -> Result<Snapshot<TypeConfig>, String> {
    let built = sm.get_snapshot_builder().await.build_snapshot().await;
    built.map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_damaged_state_machine_page_builds_no_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_with(&dir.path().join("node"), 600).await;
    let data = live_generation(&node).join("tree/data");
    let pristine = std::fs::read(&data).expect("read");
    let mut refused = 0;
    for page in written_pages(&pristine) {
        std::fs::write(&data, page_damaged(&pristine, page)).expect("damage");
        // A node whose applied state is unreadable does not even open.
        if let Ok((_log, mut sm)) = open(&node) {
            if (1..=600).any(|i| sm.get(key(i)).is_err()) {
                let built = build_snapshot(&mut sm).await;
                assert!(built.is_err(), "page {page}: a snapshot of a damaged tree");
                refused += 1;
            }
        }
        std::fs::write(&data, &pristine).expect("restore");
    }
    assert!(refused > 0, "no page held a leaf");
}

#[tokio::test]
async fn a_pack_damaged_before_it_was_sealed_installs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let leader = node_with(&dir.path().join("leader"), 300).await;
    let snapshot = {
        let (_log, mut sm) = open(&leader).expect("open");
        build_snapshot(&mut sm).await.expect("snapshot")
    };
    let pack = snapshot.snapshot.into_inner();
    let body = pack.len() - 4;
    let mut installed = 0;
    for case in 0..30u64 {
        // Spread over the pack, away from its header: each case another file's bytes.
        let at = 16 + (case * 7919 + case * case * 104_729) as usize % (body - 16);
        let mut damaged = pack.clone();
        damaged[at] ^= 0x20;
        let crc = crc32c::crc32c(&damaged[..body]);
        damaged[body..].copy_from_slice(&crc.to_le_bytes());
        let follower = node_with(&dir.path().join(format!("follower-{case}")), 5).await;
        let before = std::fs::read_to_string(follower.join("sm/CURRENT")).expect("CURRENT");
        let (_log, mut sm) = open(&follower).expect("open follower");
        let result = sm
            .install_snapshot(&snapshot.meta, Box::new(Cursor::new(damaged)))
            .await;
        if result.is_err() {
            // The follower's own generation stays live and whole.
            let now = std::fs::read_to_string(follower.join("sm/CURRENT")).expect("CURRENT");
            assert_eq!(now, before, "case {case}: CURRENT moved");
            for i in 1..=5 {
                assert_eq!(sm.get(key(i)).expect("get"), Some(value(i, 300)));
            }
        } else {
            // The flip hit bytes nothing reads: the installed state is the leader's.
            installed += 1;
            for i in 1..=300 {
                let got = sm.get(key(i));
                assert!(
                    matches!(&got, Ok(Some(v)) if *v == value(i, 300)),
                    "case {case} (byte {at}): installed, key {i} reads {got:?}"
                );
            }
        }
    }
    eprintln!("{installed} of 30 damaged packs installed (damage in bytes nothing reads)");
}

const WAIT: Duration = Duration::from_secs(10);

fn node_dir(dir: &Path, id: NodeId) -> PathBuf {
    dir.join(format!("node-{id}"))
}

async fn wait_leader(router: &Router, among: &[NodeId]) -> Node {
    let found = timeout(WAIT, async {
        loop {
            let leader = among.iter().find_map(|&id| {
                let node = router.node(id)?;
                let leads = node.metrics().borrow().state == ServerState::Leader;
                leads.then_some(node)
            });
            if let Some(leader) = leader {
                return leader;
            }
            sleep(Duration::from_millis(10)).await;
        }
    });
    found.await.expect("a leader within the wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_refuses_to_start_is_replaced_through_membership_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let router = Router::new();
    let config = node::config();
    for id in [1, 2, 3] {
        router
            .start(id, node_dir(dir.path(), id), config.clone())
            .await
            .expect("start");
    }
    let members: BTreeMap<NodeId, BasicNode> = (1..=3)
        .map(|id| (id, BasicNode::new(format!("node-{id}"))))
        .collect();
    let first = router.node(1).expect("node 1");
    first.raft().initialize(members).await.expect("initialize");
    let leader = wait_leader(&router, &[1, 2, 3]).await;
    let write = |node: Node, i: u64| {
        let router = &router;
        async move {
            let put = Request::Put {
                key: key(i),
                value: value(i, 50),
            };
            node.write(put, &router.network(node.id()))
                .await
                .expect("write");
        }
    };
    for i in 1..=20 {
        write(leader.clone(), i).await;
    }
    // A follower goes down, and its log is damaged while it is down: it refuses to start.
    let victim = if leader.id() == 3 { 2 } else { 3 };
    router.kill(victim).await.expect("kill");
    let (segment, end) = log_segment(&node_dir(dir.path(), victim));
    flip(&segment, end / 2);
    let restarted = router
        .start(victim, node_dir(dir.path(), victim), config.clone())
        .await;
    assert!(restarted.is_err(), "the damaged node started");
    // A new member takes its place: added as a learner, then made a voter in its stead.
    let new = 4;
    router
        .start(new, node_dir(dir.path(), new), config)
        .await
        .expect("start the new node");
    let leader = wait_leader(&router, &[1, 2, 3]).await;
    let learner = BasicNode::new(format!("node-{new}"));
    let added = timeout(WAIT, leader.raft().add_learner(new, learner, true)).await;
    added.expect("add_learner in time").expect("add_learner");
    let voters: std::collections::BTreeSet<NodeId> = [1, 2, 3]
        .into_iter()
        .filter(|&id| id != victim)
        .chain([new])
        .collect();
    let voter_list: Vec<NodeId> = voters.iter().copied().collect();
    let changed = timeout(WAIT, leader.raft().change_membership(voters.clone(), false)).await;
    changed
        .expect("change_membership in time")
        .expect("change_membership");
    // The cluster goes on with the new member, which holds every write.
    let leader = wait_leader(&router, &voter_list).await;
    for i in 21..=30 {
        write(leader.clone(), i).await;
    }
    let fresh = router.node(new).expect("node 4");
    let caught_up = timeout(WAIT, async {
        while fresh.read_applied(&key(30)).ok().flatten().is_none() {
            sleep(Duration::from_millis(10)).await;
        }
    });
    caught_up
        .await
        .expect("the new member applied the last write");
    for i in 1..=30 {
        let got = fresh.read_applied(&key(i)).expect("read");
        assert_eq!(got, Some(value(i, 50)), "key {i} on the new member");
    }
    let state = fresh.metrics().borrow().membership_config.clone();
    let voting: Vec<NodeId> = state.membership().voter_ids().collect();
    assert_eq!(voting, voter_list);
    router.shutdown_all().await.expect("shutdown");
}
