//! The state machine beyond openraft's suite: the application's requests, snapshots moved
//! between nodes, rejected snapshots, and the generation switch surviving crashes.

use std::fs;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Membership, Vote};

use super::*;

/// A log id of term 1 at `index`.
fn id(index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(1, 0), index)
}

/// An entry carrying `request` at `index`.
fn normal(index: u64, request: Request) -> Entry {
    Entry {
        log_id: id(index),
        payload: EntryPayload::Normal(request),
    }
}

/// A put of `key` → `value`.
fn put(key: &[u8], value: &[u8]) -> Request {
    Request::Put {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

/// A node with `n` keys `k0..` in its log and applied, at indexes 1..=n.
async fn node_with(n: u64) -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut sm) = crate::open(dir.path()).unwrap();
    let entries: Vec<Entry> = (1..=n)
        .map(|i| normal(i, put(format!("k{i}").as_bytes(), &i.to_le_bytes())))
        .collect();
    log.blocking_append(entries.clone()).await.unwrap();
    sm.apply(entries).await.unwrap();
    (dir, sm)
}

/// The generation `CURRENT` names in the node directory `node`.
fn current(node: &Path) -> String {
    fs::read_to_string(node.join("sm/CURRENT")).unwrap()
}

/// The names in the node's `sm` directory, sorted.
fn sm_entries(node: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(node.join("sm"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn put_delete_and_cas_apply_and_answer() {
    let (_dir, mut sm) = node_with(0).await;
    let cas = |expected: Option<&[u8]>, new: Option<&[u8]>| Request::Cas {
        key: b"k".to_vec(),
        expected: expected.map(<[u8]>::to_vec),
        new: new.map(<[u8]>::to_vec),
    };
    let responses = sm
        .apply([
            normal(1, put(b"k", b"a")),
            normal(2, put(b"k", b"b")),
            normal(3, cas(Some(b"a"), Some(b"c"))),
            normal(4, cas(Some(b"b"), Some(b"c"))),
            normal(5, cas(None, Some(b"d"))),
            normal(6, cas(Some(b"c"), None)),
            normal(7, cas(None, Some(b"e"))),
            normal(8, Request::Delete { key: b"k".to_vec() }),
            normal(9, Request::Delete { key: b"k".to_vec() }),
        ])
        .await
        .unwrap();
    let some = |v: &[u8]| Some(v.to_vec());
    assert_eq!(
        responses,
        [
            Response::Put { previous: None },
            Response::Put {
                previous: some(b"a")
            },
            Response::Cas {
                swapped: false,
                current: some(b"b")
            },
            Response::Cas {
                swapped: true,
                current: some(b"c")
            },
            Response::Cas {
                swapped: false,
                current: some(b"c")
            },
            Response::Cas {
                swapped: true,
                current: None
            },
            Response::Cas {
                swapped: true,
                current: some(b"e")
            },
            Response::Delete {
                previous: some(b"e")
            },
            Response::Delete { previous: None },
        ]
    );
    assert_eq!(sm.get(b"k").unwrap(), None);
    assert_eq!(sm.applied_state().await.unwrap().0, Some(id(9)));
}

#[tokio::test]
async fn oversized_requests_are_answered_and_change_nothing() {
    let (_dir, mut sm) = node_with(0).await;
    let long_key = vec![1u8; 1025];
    let responses = sm
        .apply([
            normal(1, put(&long_key, b"v")),
            normal(
                2,
                Request::Delete {
                    key: long_key.clone(),
                },
            ),
        ])
        .await
        .unwrap();
    let rejected = Response::KeyTooLarge {
        len: 1025,
        limit: 1024,
    };
    assert_eq!(responses, [rejected.clone(), rejected]);
    // Still applied: every node rejects it alike, and it is not applied again.
    assert_eq!(sm.applied_state().await.unwrap().0, Some(id(2)));
    let huge = Request::Cas {
        key: b"k".to_vec(),
        expected: Some(vec![0; 40 << 20]),
        new: Some(vec![0; 40 << 20]),
    };
    assert!(
        matches!(huge.check_size(), Err(Response::ValueTooLarge { len, .. }) if len == 80 << 20)
    );
}

#[tokio::test]
async fn membership_and_blank_entries_update_the_applied_state() {
    let (_dir, mut sm) = node_with(0).await;
    let membership = Membership::new(vec![[1, 2, 3].into()], None);
    let entries = [
        Entry {
            log_id: id(1),
            payload: EntryPayload::Membership(membership.clone()),
        },
        Entry {
            log_id: id(2),
            payload: EntryPayload::Blank,
        },
    ];
    assert_eq!(
        sm.apply(entries).await.unwrap(),
        [Response::Empty, Response::Empty]
    );
    let (applied, stored) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(id(2)));
    assert_eq!(stored, StoredMembership::new(Some(id(1)), membership));
}

#[tokio::test]
async fn a_snapshot_moves_the_state_to_another_node_and_survives_reopen() {
    let (leader_dir, mut leader) = node_with(300).await;
    let big = vec![5u8; 200_000];
    leader
        .apply([normal(301, put(b"big", &big))])
        .await
        .unwrap();
    let built = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(built.meta.last_log_id, Some(id(301)));
    let kept = leader.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(
        (&kept.meta, kept.snapshot.get_ref()),
        (&built.meta, built.snapshot.get_ref())
    );
    drop((leader, leader_dir));

    let (dir, mut follower) = node_with(2).await;
    let reader = follower.reader();
    let before = current(dir.path());
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    received
        .get_mut()
        .extend_from_slice(built.snapshot.get_ref());
    follower
        .install_snapshot(&built.meta, received)
        .await
        .unwrap();
    assert_ne!(current(dir.path()), before);
    assert_eq!(
        reader.get(b"big").unwrap(),
        Some(big.clone()),
        "a reader follows the install"
    );
    assert_eq!(follower.applied_state().await.unwrap().0, Some(id(301)));
    // The old generation is gone with its last handle.
    assert_eq!(
        sm_entries(dir.path()),
        ["CURRENT", current(dir.path()).trim_end()]
    );
    // As openraft goes on after an install: the log purged up to the snapshot, the next
    // entry appended, then applied.
    let after = normal(302, put(b"after", b"x"));
    let mut log = crate::log_store::LogStore::open(dir.path(), 1 << 20).unwrap();
    log.purge(id(301)).await.unwrap();
    log.blocking_append([after.clone()]).await.unwrap();
    drop(log);
    follower.apply([after]).await.unwrap();
    drop((follower, reader));

    let (_log, mut follower) = crate::open(dir.path()).unwrap();
    assert_eq!(
        follower.get(b"k300").unwrap(),
        Some(300u64.to_le_bytes().to_vec())
    );
    assert_eq!(follower.get(b"after").unwrap(), Some(b"x".to_vec()));
    assert_eq!(follower.applied_state().await.unwrap().0, Some(id(302)));
    let kept = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(kept.meta, built.meta);
    assert_eq!(kept.snapshot.get_ref(), built.snapshot.get_ref());
}

#[tokio::test]
async fn damaged_or_mismatched_snapshots_are_refused_and_change_nothing() {
    let (_leader_dir, mut leader) = node_with(5).await;
    let built = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let bytes = built.snapshot.into_inner();
    let (dir, mut follower) = node_with(1).await;
    let before = (current(dir.path()), sm_entries(dir.path()));
    let mut garbled = bytes.clone();
    garbled[bytes.len() / 2] ^= 1;
    let mut wrong_meta = built.meta.clone();
    wrong_meta.last_log_id = Some(id(4));
    let cases = [
        (
            "truncated",
            built.meta.clone(),
            bytes[..bytes.len() - 1].to_vec(),
        ),
        ("garbled", built.meta.clone(), garbled),
        ("empty", built.meta.clone(), Vec::new()),
        ("metadata of another state", wrong_meta, bytes.clone()),
    ];
    for (name, meta, data) in cases {
        let result = follower
            .install_snapshot(&meta, Box::new(Cursor::new(data)))
            .await;
        assert!(result.is_err(), "{name} snapshot installed");
        assert_eq!(
            (current(dir.path()), sm_entries(dir.path())),
            before,
            "{name}"
        );
    }
    assert_eq!(
        follower.get(b"k1").unwrap(),
        Some(1u64.to_le_bytes().to_vec())
    );
    assert_eq!(follower.get(b"k5").unwrap(), None);
    assert!(follower.get_current_snapshot().await.unwrap().is_none());
}

#[tokio::test]
async fn a_generation_in_use_is_removed_when_its_last_user_lets_go() {
    let (_leader_dir, mut leader) = node_with(3).await;
    let built = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let (dir, mut follower) = node_with(1).await;
    // A builder or reader in the middle of its work holds the old generation.
    let old = follower.shared.live();
    follower
        .install_snapshot(&built.meta, built.snapshot)
        .await
        .unwrap();
    assert!(old.dir().exists());
    assert_eq!(
        old.data.get(b"k1").unwrap(),
        Some(1u64.to_le_bytes().to_vec())
    );
    let old_dir = old.dir().to_path_buf();
    drop(old);
    assert!(!old_dir.exists());
    assert_eq!(sm_entries(dir.path()).len(), 2);
}

#[tokio::test]
async fn a_crash_during_a_swap_leaves_the_old_generation_live() {
    let (dir, sm) = node_with(4).await;
    let live = current(dir.path());
    let live = live.trim_end();
    drop(sm);
    let sm_dir = dir.path().join("sm");
    // An install that crashed while unpacking the next generation, before `CURRENT` moved.
    let next = generation_dir(&sm_dir, 2);
    fs::create_dir_all(next.join("tree/wal")).unwrap();
    fs::write(next.join("tree/data"), vec![9u8; 5000]).unwrap();
    fs::write(next.join("snapshot.tmp"), b"half").unwrap();
    fs::write(sm_dir.join("CURRENT.tmp"), b"gen-00000000000000000002\n").unwrap();
    // A snapshot build's scratch, and the live generation's half-written snapshot file.
    fs::create_dir_all(sm_dir.join("tmp-7/wal")).unwrap();
    fs::write(sm_dir.join(live).join("snapshot.tmp"), b"half").unwrap();

    let (_log, mut sm) = crate::open(dir.path()).unwrap();
    assert_eq!(current(dir.path()).trim_end(), live);
    assert_eq!(sm_entries(dir.path()), ["CURRENT", live]);
    assert!(!sm_dir.join(live).join("snapshot.tmp").exists());
    assert_eq!(sm.get(b"k4").unwrap(), Some(4u64.to_le_bytes().to_vec()));
    assert_eq!(sm.applied_state().await.unwrap().0, Some(id(4)));
    // And the next install reuses the number of the abandoned generation.
    let (_leader_dir, mut leader) = node_with(6).await;
    let built = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    sm.install_snapshot(&built.meta, built.snapshot)
        .await
        .unwrap();
    assert_eq!(current(dir.path()), "gen-00000000000000000002\n");
    assert_eq!(sm.get(b"k6").unwrap(), Some(6u64.to_le_bytes().to_vec()));
}

#[tokio::test]
async fn a_crash_after_the_switch_leaves_the_new_generation_live() {
    let (dir, sm) = node_with(2).await;
    let old_live = current(dir.path());
    drop(sm);
    // The install switched `CURRENT` to a copy of the live generation and crashed before
    // the old one was removed.
    let sm_dir = dir.path().join("sm");
    let copy = generation_dir(&sm_dir, 9);
    fs::create_dir(&copy).unwrap();
    bfkv::Tree::open(tree_config(
        &sm_dir.join(old_live.trim_end()).join("tree"),
        PEEK_CACHE,
    ))
    .unwrap()
    .backup(copy.join("tree"))
    .unwrap();
    write_current(&sm_dir, 9).unwrap();
    let (_log, sm) = crate::open(dir.path()).unwrap();
    assert_eq!(
        sm_entries(dir.path()),
        ["CURRENT", "gen-00000000000000000009"]
    );
    assert_eq!(sm.get(b"k2").unwrap(), Some(2u64.to_le_bytes().to_vec()));
}

#[tokio::test]
async fn a_damaged_current_or_snapshot_file_fails_the_open() {
    let (dir, mut sm) = node_with(1).await;
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let live = current(dir.path());
    drop(sm);
    let sm_dir = dir.path().join("sm");
    for bad in [
        "gen-1\n",
        "gen-00000000000000000001",
        "",
        "gen-0000000000000000000x\n",
    ] {
        fs::write(sm_dir.join("CURRENT"), bad).unwrap();
        assert!(crate::open(dir.path()).is_err(), "CURRENT {bad:?} accepted");
    }
    // A generation that does not exist.
    write_current(&sm_dir, 77).unwrap();
    assert!(crate::open(dir.path()).is_err());
    fs::write(sm_dir.join("CURRENT"), &live).unwrap();
    // The snapshot file: every truncation and a flipped byte.
    let path = sm_dir.join(live.trim_end()).join("snapshot");
    let good = fs::read(&path).unwrap();
    let mut garbled = good.clone();
    garbled[20] ^= 4;
    for bad in (0..good.len())
        .step_by(7)
        .map(|n| good[..n].to_vec())
        .chain([garbled])
    {
        fs::write(&path, &bad).unwrap();
        assert!(read_snapshot(&sm_dir.join(live.trim_end())).is_err());
    }
    fs::write(&path, &good).unwrap();
    assert!(crate::open(dir.path()).is_ok());
}

#[tokio::test]
async fn reopening_a_node_restores_vote_log_and_applied_state() {
    let dir = tempfile::tempdir().unwrap();
    let membership = Membership::new(vec![[1, 2].into()], None);
    {
        let (mut log, mut sm) = crate::open(dir.path()).unwrap();
        log.save_vote(&Vote::new(7, 2)).await.unwrap();
        let entries = vec![
            Entry {
                log_id: id(1),
                payload: EntryPayload::Membership(membership.clone()),
            },
            normal(2, put(b"a", b"1")),
            normal(3, put(b"b", b"2")),
        ];
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_committed(Some(id(3))).await.unwrap();
        sm.apply(entries).await.unwrap();
    }
    let (mut log, mut sm) = crate::open(dir.path()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(7, 2)));
    assert_eq!(log.read_committed().await.unwrap(), Some(id(3)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (None, Some(id(3)))
    );
    let read = openraft::RaftLogReader::try_get_log_entries(&mut log, 2..)
        .await
        .unwrap();
    assert_eq!(
        read,
        [normal(2, put(b"a", b"1")), normal(3, put(b"b", b"2"))]
    );
    let (applied, stored) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(id(3)));
    assert_eq!(stored, StoredMembership::new(Some(id(1)), membership));
    assert_eq!(sm.get(b"b").unwrap(), Some(b"2".to_vec()));
}
