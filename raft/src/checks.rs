//! What `open` checks across the log and the state machine before a node may serve: that
//! nothing synced was lost between them. Each part checks itself as it opens (bfkv its
//! files; the log store its vote against the vote file and its entries for holes; the
//! state-machine directory its generations); these checks catch a part that is whole but
//! behind or ahead of the other, which a rolled-back or lost directory leaves.
//!
//! The state machine applies only committed entries, each after the log holds it durably,
//! and the log is purged only up to a snapshot the state machine has reached. So, by
//! index, with the log's end the later of its last entry and its last purged id:
//! - the state machine is not behind the last purged id (the entries between are gone);
//! - it has not applied past the log's end, unless it sits exactly at its own snapshot:
//!   a snapshot installed from the leader, before openraft purged the log up to it;
//! - the stored committed id is not past the log's end, unless it is at or below the
//!   snapshot (openraft saves the committed id an install reaches before it purges).
//!
//! A committed id or vote behind where it was cannot be seen from these alone: the vote
//! file catches the vote (`vote_file.rs`); the committed id may lag by design
//! (`log_store.rs`), and a lagging one only re-applies less.

use openraft::LogId;

use crate::error::{Error, Result};
use crate::log_store::AtOpen;
use crate::NodeId;

/// The state machine as open found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applied {
    /// The last applied log id.
    pub(crate) applied: Option<LogId<NodeId>>,
    /// The last log id of its snapshot, if it has one.
    pub(crate) snapshot: Option<LogId<NodeId>>,
}

impl AtOpen {
    /// Whether the log holds nothing a state machine could have applied: a new node.
    pub(crate) fn is_new(&self) -> bool {
        self.last_entry.is_none() && self.last_purged.is_none() && self.committed.is_none()
    }
}

/// The index of `id`, with `None` below every index.
fn index(id: Option<LogId<NodeId>>) -> Option<u64> {
    id.map(|id| id.index)
}

/// Checks the log as open found it against the state machine (module docs).
pub(crate) fn check(log: &AtOpen, sm: &Applied) -> Result<()> {
    let end = index(log.last_entry).max(index(log.last_purged));
    if index(sm.applied) < index(log.last_purged) {
        return Err(Error::inconsistent(
            "state machine",
            "behind the log's purge point: entries it never applied are gone from the log",
        ));
    }
    if index(sm.applied) > end && sm.applied != sm.snapshot {
        return Err(Error::inconsistent(
            "log tree",
            "ends before entries the state machine applied: it lost entries it had synced",
        ));
    }
    if index(log.committed) > end && index(log.committed) > index(sm.snapshot) {
        return Err(Error::inconsistent(
            "log tree",
            "ends before its committed id: it lost entries it had synced",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::log_id;

    fn log(purged: Option<u64>, last: Option<u64>, committed: Option<u64>) -> AtOpen {
        AtOpen {
            last_purged: purged.map(|i| log_id(1, 0, i)),
            last_entry: last.map(|i| log_id(1, 0, i)),
            committed: committed.map(|i| log_id(1, 0, i)),
        }
    }

    fn sm(applied: Option<u64>, snapshot: Option<u64>) -> Applied {
        Applied {
            applied: applied.map(|i| log_id(1, 0, i)),
            snapshot: snapshot.map(|i| log_id(1, 0, i)),
        }
    }

    #[test]
    fn a_whole_node_passes_and_each_loss_is_refused() {
        // Healthy: applied within the log, committed lagging, snapshot purged.
        assert!(check(&log(None, Some(10), Some(8)), &sm(Some(9), None)).is_ok());
        assert!(check(&log(Some(5), Some(10), Some(10)), &sm(Some(10), Some(5))).is_ok());
        assert!(check(&log(Some(10), None, Some(10)), &sm(Some(10), Some(10))).is_ok());
        assert!(check(&log(None, None, None), &sm(None, None)).is_ok());
        // An installed snapshot the log was not purged up to yet.
        assert!(check(&log(None, Some(3), Some(20)), &sm(Some(20), Some(20))).is_ok());
        // The state machine behind the purge point (emptied, or an old copy).
        assert!(check(&log(Some(5), Some(10), Some(10)), &sm(None, None)).is_err());
        assert!(check(&log(Some(5), Some(10), Some(10)), &sm(Some(4), None)).is_err());
        // The log shorter than what was applied, or than its committed id.
        assert!(check(&log(None, Some(6), Some(6)), &sm(Some(9), None)).is_err());
        assert!(check(&log(None, None, None), &sm(Some(9), Some(3))).is_err());
        assert!(check(&log(None, Some(6), Some(9)), &sm(Some(6), None)).is_err());
    }
}
