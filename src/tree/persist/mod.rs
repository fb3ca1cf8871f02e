//! Persistence: the write-ahead log as the tree uses it, open and recovery, checkpoints, the
//! checkpoint file and online backups.
//!
//! | file | owns |
//! |---|---|
//! | `journal.rs` | whether writes are logged, the log, the LSN replay starts at |
//! | `open.rs` | open, recovery, the checkpoint driver, the directory lock |
//! | `tree_dir.rs` | what a path must hold to be opened as a tree |
//! | `checkpoint_file.rs` | the checkpoint file's format, written atomically |
//! | `backup.rs` | online backups |
//! | `backup_target.rs` | a backup's target: outside the tree, marked incomplete until done |
//! | `crash.rs` | the power-cut scenario the crash sweeps and the fuzz target share |

mod backup;
mod backup_target;
mod checkpoint_file;
#[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
pub(crate) mod crash;
#[cfg(all(test, not(shuttle)))]
mod fault_tests;
mod journal;
mod open;
#[cfg(all(test, not(shuttle)))]
mod power_tests;
mod tree_dir;

#[cfg(all(test, not(shuttle)))]
pub(in crate::tree) use crash::{copy_dir, quiet_config};
pub(in crate::tree) use journal::Journal;
pub(in crate::tree) use open::{open, DirLock};
