//! The second copy of the vote: `<node>/vote`, beside the log tree.
//!
//! A node that forgets its vote may vote twice in a term, and two leaders may be elected.
//! The log tree holds the vote (`raft_meta`), durable when `save_vote` returns; bfkv
//! reports damage to any synced record of its log rather than cut it, but a log lost or
//! rolled back as a whole (an older copy of `log/` put back, a tail lost with its marks
//! in a power cut) would take the vote along. So `save_vote` also replaces this file,
//! after the tree's write is durable, and `LogStore::open` compares the two: the file
//! never holds a newer vote than the tree unless the tree lost it, which is refused.
//! The file behind the tree (a crash between the two writes) is brought up to date.
//!
//! Format, integers little-endian:
//!
//! ```text
//! magic     8 bytes  "BFKVVOTE"
//! version   u32      1
//! len       u32      then the vote (openraft's Vote, bincode)
//! crc       u32      CRC-32C of every byte before it
//! ```

use std::path::Path;

use openraft::Vote;

use crate::error::{Error, Result};
use crate::files::{read_if_present, write_atomic};
use crate::{decode, encode, NodeId};

/// The file's name in the node directory.
pub(crate) const FILE: &str = "vote";
/// Its first bytes.
const MAGIC: &[u8; 8] = b"BFKVVOTE";
/// The format this code writes and reads.
const VERSION: u32 = 1;

/// Replaces the vote file of the node directory `node` with `vote`, durably.
pub(crate) fn write(node: &Path, vote: &Vote<NodeId>) -> Result<()> {
    let body = encode(vote)?;
    let len = u32::try_from(body.len()).map_err(|_| Error::malformed("vote file", "too long"))?;
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&body);
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    write_atomic(node, FILE, &[&bytes])
}

/// The vote in the vote file of the node directory `node`, checked; `None` if there is no
/// file (a new node, or one that has not voted since this file existed).
pub(crate) fn read(node: &Path) -> Result<Option<Vote<NodeId>>> {
    let Some(bytes) = read_if_present(&node.join(FILE))? else {
        return Ok(None);
    };
    let bad = |reason| Error::malformed("vote file", reason);
    let body_len = bytes.len().checked_sub(4).ok_or(bad("truncated"))?;
    let (body, crc) = bytes.split_at(body_len);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(bad("checksum mismatch"));
    }
    let field = |at: usize| {
        body.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or(bad("truncated"))
    };
    if !body.starts_with(MAGIC) {
        return Err(bad("bad magic"));
    }
    if field(8)? != VERSION {
        return Err(bad("unknown version"));
    }
    let len = field(12)? as usize;
    if body.len() != 16 + len {
        return Err(bad("length does not match the file"));
    }
    Ok(Some(decode(&body[16..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vote_round_trips_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let vote = Vote::new(7, 3);
        write(dir.path(), &vote).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(vote));
        let pristine = std::fs::read(dir.path().join(FILE)).unwrap();
        for i in 0..pristine.len() {
            let mut bytes = pristine.clone();
            bytes[i] ^= 0x04;
            std::fs::write(dir.path().join(FILE), &bytes).unwrap();
            assert!(read(dir.path()).is_err(), "byte {i}");
        }
        std::fs::write(dir.path().join(FILE), &pristine[..10]).unwrap();
        assert!(read(dir.path()).is_err());
    }
}
