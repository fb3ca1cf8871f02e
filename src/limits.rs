//! Size limits of keys, values and batches: what a tree accepts, and why.

use crate::config::{DEFAULT_CACHE_SIZE, DEFAULT_LOG_SEGMENT_SIZE, DEFAULT_LOG_STAGING_SIZE};
use crate::error::{Error, Result};

/// Bytes in front of every stored key: its keyspace's prefix, at most this long
/// (`tree/prefix.rs`).
pub(crate) const MAX_KEY_PREFIX: usize = 5;

/// The longest value a tree with a directory stores: 64 MiB.
pub(crate) const MAX_VALUE_LEN: usize = 64 << 20;

/// Size limits of keys and values. Key and record limits derive from the page size so that
/// any two records and the page's fence keys always fit in one leaf page (a split always
/// makes progress).
///
/// With the default 8 KiB pages: keys up to 2048 bytes; a value whose key + value fit in
/// 4096 bytes is stored in its leaf record, a longer one out of line in the blob file (the
/// leaf holds a 28-byte reference), up to 64 MiB. An in-memory tree has no blob file: its
/// values stop where records do. The limits are the same in every keyspace.
///
/// ```
/// let limits = bfkv::Limits::for_page_size(8192);
/// assert_eq!(limits.max_key_len, 2048);
/// assert_eq!(limits.max_record_len, 4096);
/// assert_eq!(limits.max_value_len, 64 << 20);
/// let in_memory = bfkv::Config::in_memory().limits();
/// assert_eq!(in_memory.max_value_len, 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes: a quarter page, at most 8186 (the 13-bit length field, less
    /// the keyspace prefix stored in front of every key).
    pub max_key_len: usize,
    /// Longest key + value stored in a leaf record, in bytes: half a page, at most 32767
    /// (the 15-bit length field). Longer values are stored out of line.
    pub max_record_len: usize,
    /// Longest value, in bytes: 64 MiB in a tree with a directory (values past
    /// `max_record_len` less the key go to the blob file); in an in-memory tree, what a
    /// record holds with an empty key (a longer key leaves less, see [`Limits::check`]).
    pub max_value_len: usize,
    /// Most bytes the writes of one [`Batch`](crate::Batch) may take, each counted as its
    /// key and value plus at most 11 bytes ([`Batch::len_bytes`](crate::Batch::len_bytes)):
    /// a quarter of the cache (the batch is applied in memory at once, every leaf it writes
    /// locked together), at most what one log record holds (a segment, and half the
    /// `Buffered` staging file). 1 MiB with a 4 MiB cache; 4 MiB with the defaults.
    pub max_batch_len: usize,
}

/// The most bytes one batch may take (see [`Limits::max_batch_len`]).
pub(crate) fn max_batch_len(cache_size: usize, segment_size: u64, staging_size: usize) -> usize {
    // A record's own head (checksum, op byte, lengths) and the segment header.
    let log_room = usize::try_from(segment_size.saturating_sub(128)).unwrap_or(usize::MAX);
    let staged = if staging_size == 0 {
        usize::MAX
    } else {
        staging_size / 2
    };
    (cache_size / 4).min(log_room).min(staged)
}

impl Limits {
    /// The limits for leaf pages of `page_size` bytes.
    ///
    /// ```
    /// let limits = bfkv::Limits::for_page_size(64 << 10);
    /// assert_eq!((limits.max_key_len, limits.max_record_len), (8186, 32767));
    /// ```
    pub fn for_page_size(page_size: usize) -> Limits {
        let max_record_len = (page_size / 2).min(32767);
        Limits {
            max_key_len: (page_size / 4).min(8191 - MAX_KEY_PREFIX),
            max_record_len,
            max_value_len: MAX_VALUE_LEN,
            max_batch_len: max_batch_len(
                DEFAULT_CACHE_SIZE,
                DEFAULT_LOG_SEGMENT_SIZE,
                DEFAULT_LOG_STAGING_SIZE,
            ),
        }
    }

    /// Checks a key and value against the limits.
    ///
    /// # Errors
    /// [`Error::KeyTooLarge`], or [`Error::ValueTooLarge`] past `max_value_len` (without
    /// out-of-line values: past what remains of the record limit after this key).
    ///
    /// ```
    /// let limits = bfkv::Limits::for_page_size(4096);
    /// assert!(limits.check(&[0; 1024], &[0; 1024]).is_ok());
    /// assert!(limits.check(b"k", &vec![0; 64 << 20]).is_ok());
    /// assert!(matches!(
    ///     limits.check(&[0; 1025], b""),
    ///     Err(bfkv::Error::KeyTooLarge { len: 1025, limit: 1024 })
    /// ));
    /// assert!(matches!(
    ///     limits.check(b"k", &vec![0; (64 << 20) + 1]),
    ///     Err(bfkv::Error::ValueTooLarge { limit: 67108864, .. })
    /// ));
    /// ```
    pub fn check(&self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.max_value_len > self.max_record_len {
            self.check_key(key)?;
            if value.len() > self.max_value_len {
                return Err(Error::ValueTooLarge {
                    len: value.len(),
                    limit: self.max_value_len,
                });
            }
            return Ok(());
        }
        self.check_inline(key, value)
    }

    /// The key limit alone.
    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.len() > self.max_key_len {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                limit: self.max_key_len,
            });
        }
        Ok(())
    }

    /// Whether `key` and `value` fit one leaf record (merge operands and merge results,
    /// which are never stored out of line, must).
    pub(crate) fn check_inline(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check_key(key)?;
        let limit = self.max_record_len - key.len();
        if value.len() > limit {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                limit,
            });
        }
        Ok(())
    }

    /// Checks a stored key (keyspace prefix included) and its value: what a valid write can
    /// have put in the log.
    pub(crate) fn check_stored(&self, key: &[u8], value: &[u8]) -> Result<()> {
        Limits {
            max_key_len: self.max_key_len + MAX_KEY_PREFIX,
            max_record_len: self.max_record_len + MAX_KEY_PREFIX,
            max_value_len: self.max_value_len,
            max_batch_len: self.max_batch_len,
        }
        .check_inline(key, value)
    }

    /// The longest value stored inline with user key `key` (0 past the key limit).
    pub(crate) fn inline_value_len(&self, key: &[u8]) -> usize {
        self.max_record_len.saturating_sub(key.len())
    }

    /// These limits without out-of-line values (a tree without a blob file).
    pub(crate) fn inline_only(self) -> Limits {
        Limits {
            max_value_len: self.max_record_len,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn limits_scale_with_page_size_and_fit_length_fields() {
        assert_eq!(Limits::for_page_size(4096).max_key_len, 1024);
        assert_eq!(Limits::for_page_size(4096).max_record_len, 2048);
        let big = Limits::for_page_size(64 << 10);
        assert_eq!(big.max_key_len, 8191 - MAX_KEY_PREFIX);
        assert_eq!(big.max_record_len, 32767);
    }

    #[test]
    fn check_reports_the_remaining_value_limit() {
        // Without out-of-line values (an in-memory tree): what the record leaves.
        let l = Config::in_memory().page_size(4096).limits();
        l.check(&[], &[]).unwrap();
        l.check(&[0; 1024], &[0; 1024]).unwrap();
        assert!(matches!(
            l.check(&[0; 1025], &[]),
            Err(Error::KeyTooLarge {
                len: 1025,
                limit: 1024
            })
        ));
        assert!(matches!(
            l.check(&[0; 1000], &[0; 1049]),
            Err(Error::ValueTooLarge {
                len: 1049,
                limit: 1048
            })
        ));
        // With them: the value limit, whatever the key; records hold what check_inline
        // accepts.
        let l = Limits::for_page_size(4096);
        l.check(&[0; 1000], &[0; 1049]).unwrap();
        assert!(l.check_inline(&[0; 1000], &[0; 1049]).is_err());
        assert!(matches!(
            l.check(&[0; 1025], &[]),
            Err(Error::KeyTooLarge { .. })
        ));
        assert_eq!(l.inline_value_len(&[0; 48]), 2000);
    }
}
