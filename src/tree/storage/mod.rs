//! Storage: the tree's side of the page store. `data_file.rs` holds the data file (absent
//! for in-memory trees) through which every leaf page reaches the disk; `pages.rs` the page
//! tracker, which disk page holds which leaf and when a superseded page may be reused.

mod data_file;
#[cfg(all(test, not(shuttle)))]
mod lost_write_tests;
mod pages;

pub(in crate::tree) use data_file::Storage;
pub(in crate::tree) use pages::{Inspections, PageTracker, SnapshotLeaf};
