//! The one error type of bfkv.
//!
//! Every fallible operation returns [`Result`]. Each variant is something a caller can act
//! on: retry or report an I/O failure, shorten a key, restore a damaged file from backup,
//! close the other handle that holds the directory, or fix the configuration.

use std::fmt;
use std::path::PathBuf;

/// Shorthand for `std::result::Result<T, bfkv::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
///
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a `_` arm.
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// match tree.insert(vec![0u8; 5000], b"v") {
///     Err(bfkv::Error::KeyTooLarge { len, limit }) => assert!(len > limit),
///     other => panic!("expected KeyTooLarge, got {other:?}"),
/// }
/// # Ok::<(), bfkv::Error>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O call failed on `path`.
    Io {
        /// The file or directory the failing call was about.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A key was longer than the tree accepts.
    KeyTooLarge {
        /// Length of the rejected key in bytes.
        len: usize,
        /// The largest accepted key length for this tree's page size.
        limit: usize,
    },
    /// A value was longer than the tree accepts for its key.
    ValueTooLarge {
        /// Length of the rejected value in bytes.
        len: usize,
        /// The largest accepted value length for the key it came with.
        limit: usize,
    },
    /// Stored data failed validation (checksum, magic, structure).
    Corruption {
        /// The damaged file.
        file: PathBuf,
        /// The page number inside that file, when the damage is in a page.
        page: Option<u64>,
        /// The byte offset inside that file where the damage starts, when known (the
        /// first bad record of a log segment).
        offset: Option<u64>,
        /// What check failed.
        reason: &'static str,
    },
    /// The directory is already opened by another `Tree`, in this or another process (still
    /// so after a second of trying: a child process being started holds a copy of the lock
    /// until it runs its program).
    Locked {
        /// The locked directory.
        path: PathBuf,
    },
    /// The configuration cannot be used.
    InvalidConfig {
        /// Which setting is wrong and why.
        reason: &'static str,
    },
    /// An in-memory tree has no room left in its cache; nothing was changed.
    CacheFull {
        /// The configured cache size in bytes.
        cache_size: usize,
    },
    /// The tree has as many leaves as it can name (one id each, 2^32 of them), so a write
    /// that needed a new leaf failed; nothing was changed.
    TooManyLeaves {
        /// The most leaves a tree can have.
        limit: u64,
    },
    /// The tree this handle (a [`Keyspace`](crate::Keyspace) or an iterator over one) belongs
    /// to was closed; nothing was done.
    Closed,
    /// The keyspace this handle names was dropped; nothing was done. A keyspace created
    /// again under the same name is a new one: ask the tree for a new handle.
    KeyspaceDropped {
        /// The dropped keyspace's name.
        name: String,
    },
    /// A batch's writes, encoded, were longer than one batch may be
    /// ([`Limits::max_batch_len`](crate::Limits::max_batch_len)); nothing was applied.
    BatchTooLarge {
        /// Bytes the batch's writes take.
        len: usize,
        /// The most a batch may take.
        limit: usize,
    },
    /// The input of a call broke the call's contract, as [`Tree::bulk_load`](crate::Tree::bulk_load)
    /// given keys that are not strictly ascending, or a key span that already holds a key
    /// or crosses a leaf boundary, or [`Tree::backup`](crate::Tree::backup) given a target
    /// inside the tree's own directory; nothing was changed.
    InvalidInput {
        /// What was wrong with the input.
        reason: &'static str,
    },
    /// The merge operator panicked while folding a key's pending operands. That key's
    /// reads, and the writes that need its value (a merge folded at once, a
    /// compare-and-swap), fail with this error until the key is inserted or removed again;
    /// every other key reads and writes as before.
    MergeFailed {
        /// The panic's message (empty if it carried no string).
        reason: String,
    },
    /// A transaction's commit found that a key it read, or a key in a range it scanned,
    /// was written by someone else after the transaction started (or its snapshot became
    /// too old); nothing was applied. Run the transaction again
    /// ([`Tree::transact`](crate::Tree::transact) does).
    Conflict {
        /// The keyspace of the key (empty for the default keyspace).
        keyspace: String,
        /// The key (without its keyspace); empty when the snapshot became too old.
        key: Vec<u8>,
    },
    /// What a snapshot or a transaction needed to read at its moment was dropped, because
    /// the old values kept for open snapshots outgrew
    /// [`Config::max_snapshot_bytes`](crate::Config::max_snapshot_bytes) and this was the
    /// oldest; take a new snapshot.
    SnapshotTooOld {
        /// The limit that was reached (bytes).
        limit: u64,
    },
}

/// A key as an error message shows it: printable ASCII as it is, other bytes escaped, at
/// most 64 bytes of it.
pub(crate) fn shown(key: &[u8]) -> String {
    let cut = key.len() > 64;
    let mut s = format!("\"{}\"", key[..key.len().min(64)].escape_ascii());
    if cut {
        s.push_str("...");
    }
    s
}

impl Error {
    /// A write needed a new leaf and every leaf id is taken.
    pub(crate) fn too_many_leaves() -> Self {
        Error::TooManyLeaves { limit: 1 << 32 }
    }

    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A corruption error about `file`, optionally at `page`.
    pub(crate) fn corruption(
        file: impl Into<PathBuf>,
        page: Option<u64>,
        reason: &'static str,
    ) -> Self {
        Error::Corruption {
            file: file.into(),
            page,
            offset: None,
            reason,
        }
    }

    /// A corruption error about `file`, starting at byte `offset`.
    pub(crate) fn corruption_at(
        file: impl Into<PathBuf>,
        offset: u64,
        reason: &'static str,
    ) -> Self {
        Error::Corruption {
            file: file.into(),
            page: None,
            offset: Some(offset),
            reason,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "I/O error on {}: {source}", path.display()),
            Error::KeyTooLarge { len, limit } => {
                write!(
                    f,
                    "key of {len} bytes is larger than the limit of {limit} bytes"
                )
            }
            Error::ValueTooLarge { len, limit } => {
                write!(
                    f,
                    "value of {len} bytes is larger than the limit of {limit} bytes"
                )
            }
            Error::Corruption {
                file,
                page: Some(page),
                reason,
                ..
            } => {
                write!(
                    f,
                    "corruption in {} at page {page}: {reason}",
                    file.display()
                )
            }
            Error::Corruption {
                file,
                page: None,
                offset: Some(offset),
                reason,
            } => {
                write!(
                    f,
                    "corruption in {} at byte {offset}: {reason}",
                    file.display()
                )
            }
            Error::Corruption {
                file,
                page: None,
                offset: None,
                reason,
            } => {
                write!(f, "corruption in {}: {reason}", file.display())
            }
            Error::Locked { path } => write!(
                f,
                "{} is already open in another Tree or process",
                path.display()
            ),
            Error::InvalidConfig { reason } => write!(f, "invalid configuration: {reason}"),
            Error::CacheFull { cache_size } => write!(
                f,
                "the in-memory tree is full ({cache_size} bytes of cache); nothing was written"
            ),
            Error::TooManyLeaves { limit } => write!(
                f,
                "the tree has {limit} leaves, as many as it can name; nothing was written"
            ),
            Error::Closed => write!(f, "the tree was closed"),
            Error::KeyspaceDropped { name } => {
                write!(f, "keyspace {name:?} was dropped")
            }
            Error::BatchTooLarge { len, limit } => {
                write!(f, "batch of {len} bytes exceeds the limit of {limit} bytes")
            }
            Error::InvalidInput { reason } => write!(f, "invalid input: {reason}"),
            Error::Conflict { keyspace, key } => write!(
                f,
                "transaction conflict: key {} of keyspace {keyspace:?} changed since the transaction started",
                crate::error::shown(key)
            ),
            Error::SnapshotTooOld { limit } => write!(
                f,
                "the snapshot is too old: the old values kept for open snapshots outgrew {limit} bytes"
            ),
            Error::MergeFailed { reason } => write!(
                f,
                "the merge operator panicked folding this key's pending operands: {reason}"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn display_names_what_and_where() {
        let e = Error::io(
            "/tmp/x",
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        );
        let s = e.to_string();
        assert!(s.contains("/tmp/x"), "{s}");
        assert!(e.source().is_some());

        let e = Error::corruption("data", Some(7), "checksum mismatch");
        assert_eq!(
            e.to_string(),
            "corruption in data at page 7: checksum mismatch"
        );
        assert!(e.source().is_none());

        let e = Error::KeyTooLarge {
            len: 2000,
            limit: 1024,
        };
        assert!(e.to_string().contains("2000") && e.to_string().contains("1024"));

        let e = Error::too_many_leaves();
        assert_eq!(
            e.to_string(),
            "the tree has 4294967296 leaves, as many as it can name; nothing was written"
        );
    }

    #[test]
    fn error_is_send_sync_static() {
        fn check<T: Send + Sync + 'static + std::error::Error>() {}
        check::<Error>();
    }
}
