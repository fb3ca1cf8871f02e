//! CRC-32C (Castagnoli), the checksum of every page, log record and snapshot.
//!
//! The `crc32c` crate is fast on pages (three interleaved streams hide the instruction's
//! latency) but pays a fixed cost per call for that machinery. A `Buffered` log record of a
//! 16-byte key and value is checksummed in three short pieces on every write, so that cost
//! landed on the hot path: 3.6 % of all CPU samples of 2-thread YCSB-A in memory went to the
//! crate's functions. Short inputs therefore take a plain loop over the SSE4.2 `crc32`
//! instruction here (about 10 ns against 22 ns for a record's three pieces, measured in a
//! loop); long ones, and machines without SSE4.2, still go to the crate. Both compute the
//! same standard CRC-32C, so nothing on disk changes.

/// Inputs up to this many bytes take the inline loop; the crate's interleaved streams win
/// beyond a few hundred bytes.
const SHORT: usize = 256;

/// The CRC-32C of `data`.
#[inline]
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// The CRC-32C of the bytes whose checksum is `crc` followed by `data` (so
/// `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`).
#[inline]
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if data.len() <= SHORT && std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: `short_hw` needs SSE4.2, which the check just above found on this CPU.
            return unsafe { short_hw(crc, data) };
        }
    }
    crc32c::crc32c_append(crc, data)
}

/// The CRC-32C of `a ++ b`, given `crc32c(a)`, `crc32c(b)` and `b`'s length: pieces
/// checksummed apart (by several threads) combine into the checksum of the whole.
///
/// Appending `len_b` bytes multiplies `a`'s remainder by `x^(8·len_b)` modulo the polynomial
/// (the pre- and post-inversions cancel between the two sides), and x to that power is a
/// product of the precomputed powers `x^(2^k)`, one 32-bit carry-less product per set bit
/// of the length. The crate's version squares 32×32-bit matrices for every bit of the
/// length instead; at four combines per value it took a tenth of all CPU samples while
/// reading 1 MiB values.
pub(crate) fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    if len_b == 0 {
        return crc_a;
    }
    let bits = len_b as u64;
    // x^(8·len) = x^(len·2^3): bit j of `len` contributes x^(2^(j+3)).
    let mut power = X0;
    for (j, x2n) in X2N[3..].iter().enumerate() {
        if bits >> j == 0 {
            break;
        }
        if bits >> j & 1 == 1 {
            power = mul_mod(power, *x2n);
        }
    }
    mul_mod(power, crc_a) ^ crc_b
}

/// The CRC-32C polynomial, bit-reflected (bit 31 is the coefficient of x^0).
const POLY: u32 = 0x82F6_3B78;

/// The polynomial 1 (x^0) in the reflected representation.
const X0: u32 = 1 << 31;

/// `a · b` modulo [`POLY`], both reflected: for each set coefficient of `a` (from x^0 up),
/// add `b` times that power of x, multiplying `b` by x (a right shift, reduced) as it goes.
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut m = X0;
    while m != 0 {
        if a & m != 0 {
            product ^= b;
            if a & (m - 1) == 0 {
                break;
            }
        }
        m >>= 1;
        b = if b & 1 == 1 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// x^(2^k) modulo [`POLY`] for k in 0..67 (enough for 8 × any 64-bit length): each the
/// square of the one before.
const X2N: [u32; 67] = {
    let mut table = [0u32; 67];
    table[0] = X0 >> 1; // x^1
    let mut k = 1;
    while k < 67 {
        table[k] = mul_mod(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// The loop over the `crc32` instruction: 8 bytes at a time, then 4, then single bytes.
/// Pre- and post-inversion as in the standard CRC-32C, so it agrees with the crate.
///
/// # Safety
/// The CPU must support SSE4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn short_hw(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let mut state = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        state = _mm_crc32_u64(state, u64::from_le_bytes(b));
    }
    // The instruction leaves the upper half zero: the state is a 32-bit CRC.
    let mut state = state as u32;
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&rest[..4]);
        state = _mm_crc32_u32(state, u32::from_le_bytes(b));
        rest = &rest[4..];
    }
    for &byte in rest {
        state = _mm_crc32_u8(state, byte);
    }
    !state
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every length across the short/long boundary, several starting states, and unaligned
    /// starts agree with the crate (which has its own tests against the standard vectors).
    #[test]
    fn agrees_with_the_crate_on_every_short_length() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let data: Vec<u8> = (0..SHORT * 2 + 16).map(|_| rng.gen::<u8>()).collect();
        for len in 0..=SHORT + 40 {
            for start in [0usize, 1, 3, 7] {
                let piece = &data[start..start + len];
                for state in [0u32, 1, 0xdead_beef, u32::MAX] {
                    assert_eq!(
                        crc32c_append(state, piece),
                        crc32c::crc32c_append(state, piece),
                        "len {len} start {start} state {state:#x}"
                    );
                }
            }
        }
    }

    /// The standard check value of CRC-32C ("123456789" → 0xE3069283).
    #[test]
    fn standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// Appending piece by piece gives the checksum of the whole, for every split point.
    #[test]
    fn append_composes() {
        let data: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
        let whole = crc32c(&data);
        for split in 0..=data.len() {
            let (a, b) = data.split_at(split);
            assert_eq!(crc32c_append(crc32c(a), b), whole, "split at {split}");
        }
    }

    /// Combining the checksums of two pieces gives the checksum of their concatenation,
    /// for every split of a buffer longer than the table's shortest powers.
    #[test]
    fn combine_gives_the_checksum_of_the_concatenation() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let data: Vec<u8> = (0..5000).map(|_| rng.gen::<u8>()).collect();
        let whole = crc32c(&data);
        for split in (0..=data.len()).step_by(37).chain([data.len()]) {
            let (a, b) = data.split_at(split);
            assert_eq!(
                crc32c_combine(crc32c(a), crc32c(b), b.len()),
                whole,
                "split at {split}"
            );
        }
    }

    /// Lengths far beyond any buffer (every bit of a `usize` length in use) agree with the
    /// crate's matrix method, which computes the same function another way.
    #[test]
    fn combine_agrees_with_the_crate_on_huge_lengths() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for _ in 0..200 {
            let (a, b) = (rng.gen::<u32>(), rng.gen::<u32>());
            let len = rng.gen::<usize>() >> rng.gen_range(0..64);
            assert_eq!(
                crc32c_combine(a, b, len),
                crc32c::crc32c_combine(a, b, len),
                "len {len}"
            );
        }
        assert_eq!(crc32c_combine(5, 9, 0), 5);
        assert_eq!(
            crc32c_combine(5, 9, usize::MAX),
            crc32c::crc32c_combine(5, 9, usize::MAX)
        );
    }
}
