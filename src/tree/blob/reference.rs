//! What a leaf stores in place of a value kept out of line: a [`BlobRef`] (where the
//! value is, how long, and a checksum), and the markers that tell every stored value that
//! is not the user's own.

use crate::store::{blocks_for, checksum};

/// Bytes of a stored reference.
pub(crate) const REF_LEN: usize = 28;
/// The first bytes of every stored reference.
const MARKER: [u8; 8] = [0xBF, 0xB1, 0x0B, b'r', b'e', b'f', 0x00, 0x01];

/// The first bytes of a stored value that stands for a key whose pending merges could not
/// be folded (`merge.rs`, "failed folds"). Like a reference's marker it starts with
/// [`MARKED`], so the one byte a scan compares for every value it lends rules both out.
pub(crate) const FAILED_FOLD: [u8; 8] = [0xBF, 0xFA, 0x11, 0xED, b'm', b'r', b'g', 0x01];

/// The first byte of every stored value that is not the user's own (a reference, a failed
/// fold): a value that starts otherwise is the user's.
pub(crate) const MARKED: u8 = 0xBF;

/// Where a value stored out of line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlobRef {
    /// The extent's first block.
    pub(crate) start: u64,
    /// The value's length in bytes.
    pub(crate) len: u64,
    /// CRC-32C of `start` (u64 LE) followed by the value.
    pub(crate) crc: u32,
}

impl BlobRef {
    /// The stored form.
    pub(crate) fn encode(&self) -> [u8; REF_LEN] {
        let mut out = [0u8; REF_LEN];
        out[..8].copy_from_slice(&MARKER);
        out[8..16].copy_from_slice(&self.start.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out[24..28].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// The reference a stored value is, if it is one.
    pub(crate) fn decode(value: &[u8]) -> Option<BlobRef> {
        if value.len() != REF_LEN || value[..8] != MARKER {
            return None;
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&value[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&value[24..28]);
        Some(BlobRef {
            start: u64_at(8),
            len: u64_at(16),
            crc: u32::from_le_bytes(crc),
        })
    }

    /// Blocks of its extent (at least one: an empty value is never stored out of line, but
    /// a damaged reference must not name an empty extent).
    pub(crate) fn blocks(&self) -> u64 {
        blocks_for(self.len).max(1)
    }

    /// The checksum a value of `len` bytes whose own CRC-32C is `crc` has when stored at
    /// `start`.
    pub(super) fn checksum_of(start: u64, crc: u32, len: usize) -> u32 {
        checksum::crc32c_combine(checksum::crc32c(&start.to_le_bytes()), crc, len)
    }
}
