//! The log store beyond openraft's suite: reopening, batches split past the batch limit,
//! a purge a crash interrupted, and the committed id written with the next batch.

use openraft::storage::RaftLogStorageExt;
use openraft::testing::log_id;
use openraft::{CommittedLeaderId, EntryPayload};

use super::*;
use crate::Request;

/// A log store on a fresh directory.
fn fresh() -> (tempfile::TempDir, LogStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::open(dir.path(), 1 << 20).unwrap();
    (dir, store)
}

/// A put entry at `index` of term 1.
fn put(index: u64, value: &[u8]) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Normal(Request::Put {
            key: index.to_be_bytes().to_vec(),
            value: value.to_vec(),
        }),
    }
}

/// The indexes of the entries present.
async fn indexes(store: &mut LogStore) -> Vec<u64> {
    let entries = store.try_get_log_entries(..).await.unwrap();
    entries.iter().map(|e| e.log_id.index).collect()
}

#[tokio::test]
async fn reopening_finds_vote_entries_and_state() {
    let (dir, mut store) = fresh();
    store.save_vote(&Vote::new(3, 1)).await.unwrap();
    store
        .blocking_append((1..=5).map(|i| put(i, b"v")))
        .await
        .unwrap();
    store.purge(log_id(1, 0, 2)).await.unwrap();
    // A purge below the last one changes nothing.
    store.purge(log_id(1, 0, 1)).await.unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
    assert_eq!(indexes(&mut store).await, [3, 4, 5]);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 0, 2)));
    assert_eq!(state.last_log_id, Some(log_id(1, 0, 5)));
    assert_eq!(
        store.try_get_log_entries(4..5).await.unwrap(),
        [put(4, b"v")]
    );
}

#[tokio::test]
async fn large_entries_round_trip() {
    // Past half a page an entry is stored out of line, in bfkv's blob file.
    let (dir, mut store) = fresh();
    let big = vec![0xabu8; 300_000];
    store
        .blocking_append([put(1, &big), put(2, b"small")])
        .await
        .unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(
        store.try_get_log_entries(1..=2).await.unwrap(),
        [put(1, &big), put(2, b"small")]
    );
}

#[tokio::test]
async fn writes_past_the_batch_limit_are_split_in_order() {
    let (_dir, mut store) = fresh();
    {
        let shared = &store.shared;
        // Over 100 bytes a write: a 500-byte limit holds 4 of them.
        let mut batches = Batcher::with_limit(&shared.tree, 500);
        for i in 1..=100u64 {
            batches
                .insert(
                    &shared.log,
                    &i.to_be_bytes(),
                    &encode(&put(i, &[7; 40])).unwrap(),
                )
                .unwrap();
        }
        // Every full batch is committed already, in index order; the last one waits.
        let committed: Vec<u64> = shared
            .log
            .iter()
            .map(|r| u64::from_be_bytes(r.unwrap().0.try_into().unwrap()))
            .collect();
        assert!(
            (90..100).contains(&committed.len()),
            "{} committed",
            committed.len()
        );
        assert_eq!(committed, (1..=committed.len() as u64).collect::<Vec<_>>());
        batches.finish().unwrap();
    }
    assert_eq!(indexes(&mut store).await, (1..=100).collect::<Vec<_>>());
    // The store's own limit holds thousands of such entries in one batch.
    store
        .blocking_append((101..=5000).map(|i| put(i, &[7; 40])))
        .await
        .unwrap();
    assert_eq!(indexes(&mut store).await.len(), 5000);
}

#[tokio::test]
async fn an_interrupted_purge_is_finished_at_open() {
    let (dir, mut store) = fresh();
    store
        .blocking_append((1..=10).map(|i| put(i, b"v")))
        .await
        .unwrap();
    // What a crash leaves after the first batch of a split purge: the last purged id
    // written, entries at or below it still present.
    store
        .shared
        .meta
        .insert(LAST_PURGED, encode(&log_id::<NodeId>(1, 0, 6)).unwrap())
        .unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(indexes(&mut store).await, [7, 8, 9, 10]);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 0, 6)));
    assert_eq!(state.last_log_id, Some(log_id(1, 0, 10)));
}

#[tokio::test]
async fn truncate_then_append_replaces_the_tail() {
    let (_dir, mut store) = fresh();
    store
        .blocking_append((1..=6).map(|i| put(i, b"old")))
        .await
        .unwrap();
    store.truncate(log_id(1, 0, 4)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [1, 2, 3]);
    store
        .blocking_append((4..=5).map(|i| put(i, b"new")))
        .await
        .unwrap();
    assert_eq!(
        store.try_get_log_entries(3..).await.unwrap(),
        [put(3, b"old"), put(4, b"new"), put(5, b"new")]
    );
    // Truncating past the end removes nothing.
    store.truncate(log_id(1, 0, 9)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn empty_and_inverted_ranges_read_nothing() {
    let (_dir, mut store) = fresh();
    store
        .blocking_append((1..=3).map(|i| put(i, b"v")))
        .await
        .unwrap();
    assert!(store.try_get_log_entries(2..2).await.unwrap().is_empty());
    let inverted = (Bound::Included(3), Bound::Excluded(1));
    assert!(store
        .try_get_log_entries(inverted)
        .await
        .unwrap()
        .is_empty());
    let to_max = (Bound::Excluded(2), Bound::Included(u64::MAX));
    assert_eq!(
        indexes_of(&store.try_get_log_entries(to_max).await.unwrap()),
        [3]
    );
    let mut reader = store.get_log_reader().await;
    assert_eq!(
        indexes_of(&reader.try_get_log_entries(..=2).await.unwrap()),
        [1, 2]
    );
}

/// The indexes of `entries`.
fn indexes_of(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

#[tokio::test]
async fn committed_is_written_with_the_next_batch_or_at_drop() {
    let (dir, mut store) = fresh();
    store.save_committed(Some(log_id(1, 0, 2))).await.unwrap();
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 0, 2)));
    assert_eq!(
        store
            .shared
            .read_meta::<Option<LogId<NodeId>>>(COMMITTED)
            .unwrap(),
        None
    );
    store.blocking_append([put(1, b"v")]).await.unwrap();
    assert_eq!(
        store
            .shared
            .read_meta::<Option<LogId<NodeId>>>(COMMITTED)
            .unwrap(),
        Some(Some(log_id(1, 0, 2)))
    );
    store.save_committed(Some(log_id(1, 0, 3))).await.unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 0, 3)));
}

#[tokio::test]
async fn a_misplaced_entry_is_an_error_not_a_wrong_entry() {
    let (_dir, mut store) = fresh();
    store.blocking_append([put(1, b"v")]).await.unwrap();
    // Entry 1's bytes under index 2.
    store
        .shared
        .log
        .insert(2u64.to_be_bytes(), encode(&put(1, b"v")).unwrap())
        .unwrap();
    assert!(store.try_get_log_entries(..).await.is_err());
    store
        .shared
        .log
        .insert(2u64.to_be_bytes(), b"not an entry")
        .unwrap();
    assert!(store.try_get_log_entries(2..).await.is_err());
}
