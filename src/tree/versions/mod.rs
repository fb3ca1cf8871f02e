//! Versions: what keeps a reader from seeing writes made after its start. `store.rs` holds
//! the write sequence and the scans, snapshots and transactions registered at points of it;
//! `saved.rs` the old values later writes replaced, which those readers put back;
//! `reads.rs` reads at a registered moment and what a transaction read.

mod reads;
mod saved;
mod store;

pub(in crate::tree) use reads::ReadSet;
pub(in crate::tree) use saved::Undo;
pub(in crate::tree) use store::{ScanStart, Versions, Written};
