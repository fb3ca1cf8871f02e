//! Damage or a torn tail: whether records that verify follow the first record of the log's
//! last segment that fails its check.
//!
//! A record's LSN is its position and is folded into its checksum, never stored, so a
//! record that verifies at a position was written there (by this log, at that LSN). Within
//! one boot the page cache holds a segment exactly as the process wrote it, in order: a
//! crash can leave only a prefix of its last write, so nothing written follows a torn
//! record. A verified record after a failed one therefore proves damage, and recovery
//! reports it instead of cutting the log there (`segment::recover`, which asks only for a
//! segment last opened on the current boot: across a restart, unsynced pages may have
//! reached the disk in any order, and the synced mark alone decides).
//!
//! # False positives
//! What proves damage is a record at some position `p` after the failed one that
//! - has a known operation, lengths that agree with it and a key of at most 64 KiB, lies
//!   inside the bytes read, and passes its 32-bit checksum at `p`'s LSN (a batch's writes
//!   must decode too); and
//! - is followed either by a second such record right after it (a chain of two), or by
//!   nothing but zeros, ending at most 8 bytes past the last non-zero byte (a value may end
//!   in a few zeros).
//!
//! Bytes that are not a record pass the operation byte with chance 4/256 and a checksum
//! with chance 2^-32, so one position passes the first condition with chance below 2^-38;
//! a chain of two needs two such matches (below 2^-76), and the end case needs the
//! candidate's claimed end to fall within the 9 positions at the last non-zero byte.
//! After a true torn tail the bytes searched are only the non-zero ones from the torn
//! record on, which a crash leaves as a prefix of the torn record itself: 2^20 of them (a
//! 1 MiB record) give a chance below 2^-18 even counting every end case as a match. Zeros
//! never pass (no operation is 0), and a stale record of another position (a recycled ring
//! lap, a copy) fails its checksum at this one. The search starts with the position the
//! failed record's own lengths name (where the next record is when only its body or
//! checksum was damaged), then tries every later position.

use super::format::{self, Shape};
use super::Lsn;

/// The search reads at most this many bytes from the failed record on.
pub(super) const SEARCH_LIMIT: u64 = 64 << 20;

/// Reading stops after this many zeros in a row past the last non-zero byte: the
/// preallocated end of the segment. Only an outside zeroing longer than this, followed by
/// records, goes unseen.
pub(super) const ZERO_RUN: u64 = 1 << 20;

/// A record that verifies and is followed only by zeros counts if it ends at most this many
/// bytes past the last non-zero byte: values end in a few zeros (an 8-byte counter), and a
/// random match claiming to end deep in the zeros must not count them all as its own.
const TRAILING_ZEROS: usize = 8;

/// The longest key a record found by the search may have (the tree's keys are at most
/// 8 KiB and a keyspace prefix).
const MAX_KEY: u64 = 1 << 16;

/// Bytes of checksum work the search may do: this much, plus [`BUDGET_PER_BYTE`] for each
/// byte searched. Garbage lengths can name long records at many positions; a real record
/// after damage is found within a record or two of it, long before this runs out. Spent,
/// the search ends without proof (the tail is cut, as before the search existed).
const BUDGET_BASE: usize = 256 << 20;
/// See [`BUDGET_BASE`].
const BUDGET_PER_BYTE: usize = 16;

/// Where, in `bytes` (which start with a record that failed its check, at LSN `lsn`), the
/// first record that proves damage starts (module docs); `None` if none does.
pub(super) fn verified_after(bytes: &[u8], lsn: Lsn) -> Option<usize> {
    let zero_from = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut search = Search {
        bytes,
        lsn,
        zero_from,
        budget: BUDGET_BASE.saturating_add(zero_from.saturating_mul(BUDGET_PER_BYTE)),
    };
    if let Some(s) = search.shape(0) {
        if search.proves(s.len) {
            return Some(s.len);
        }
    }
    // The operation byte follows the 4-byte checksum.
    let op = 4;
    for p in 1..zero_from {
        if !matches!(bytes.get(p + op), Some(1..=4)) {
            continue;
        }
        if search.proves(p) {
            return Some(p);
        }
        if search.budget == 0 {
            return None;
        }
    }
    None
}

/// The bytes searched and what is left of the budget.
struct Search<'a> {
    bytes: &'a [u8],
    lsn: Lsn,
    /// `bytes[zero_from..]` are all zero.
    zero_from: usize,
    budget: usize,
}

impl Search<'_> {
    /// The shape of a record a writer could have written at `p`.
    fn shape(&self, p: usize) -> Option<Shape> {
        let s = format::shape(self.bytes.get(p..)?)?;
        (s.key_len <= MAX_KEY).then_some(s)
    }

    /// Whether the record of shape `s` at `p` verifies, paid from the budget.
    fn verifies(&mut self, p: usize, s: &Shape) -> bool {
        let Some(left) = self.budget.checked_sub(s.len) else {
            self.budget = 0;
            return false;
        };
        self.budget = left;
        format::verifies(&self.bytes[p..], self.lsn + p as u64, s)
    }

    /// Whether a record that verifies starts at `p`, followed by another that verifies or
    /// by nothing but zeros.
    fn proves(&mut self, p: usize) -> bool {
        let Some(s) = self.shape(p) else {
            return false;
        };
        let end = p + s.len;
        if end >= self.zero_from {
            return end - self.zero_from <= TRAILING_ZEROS && self.verifies(p, &s);
        }
        // The cheap test of the successor's shape first: most garbage fails it.
        let Some(next) = self.shape(end) else {
            return false;
        };
        self.verifies(p, &s) && self.verifies(end, &next)
    }
}

#[cfg(all(test, not(shuttle)))]
#[path = "damage_tests.rs"]
mod tests;
