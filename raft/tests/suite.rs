//! openraft's own storage conformance suite (`openraft::testing::Suite`) run against the
//! bfkv log store and state machine: each of its tests gets a fresh node directory.
//!
//! If one fails, openraft's storage contract is broken: the suite's message names the
//! check (log state after a purge, a vote read back, a snapshot transferred between nodes).

use bfkv_raft::{LogStore, StateMachine, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb, StorageError};
use tempfile::TempDir;

/// A fresh node directory per build; the directory is removed when the suite drops the
/// guard, after the store and state machine.
struct FreshNode {
    /// Close and reopen the node before handing it out, so every suite test also runs
    /// on a reopened directory.
    reopen: bool,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for FreshNode {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir()
            .map_err(|e| StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Write, e))?;
        if self.reopen {
            drop(bfkv_raft::open(dir.path())?);
        }
        let (log_store, state_machine) = bfkv_raft::open(dir.path())?;
        Ok((dir, log_store, state_machine))
    }
}

#[test]
fn storage_suite() -> Result<(), StorageError<u64>> {
    Suite::test_all(FreshNode { reopen: false })
}

#[test]
fn storage_suite_on_reopened_node() -> Result<(), StorageError<u64>> {
    Suite::test_all(FreshNode { reopen: true })
}
