//! Versions: what keeps a reader from seeing writes made after its start. `store.rs` holds
//! the write sequence, the scans, snapshots and transactions registered at points of it,
//! and the old values later writes replaced, which those readers put back.

mod store;

pub(in crate::tree) use store::{ScanStart, Undo, Versions};
