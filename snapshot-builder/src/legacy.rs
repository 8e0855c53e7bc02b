//! The legacy set (version 5): a split-block Bloom filter of every legacy link key of the
//! record (issue 44), so the edge looks a legacy-shaped code up only when it may exist, and a
//! scanner's junk of that shape still costs no lookup. `FORMAT.md`, "The legacy set".
//!
//! The filter is the split-block Bloom filter of Apache Parquet's specification (its eight
//! salts, its 32-byte blocks): one block, one cache line at most, per query. It is written here
//! rather than taken from a crate because the edge queries it in place, in the mapped file,
//! on the request path, and no crate reads one from borrowed bytes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Bytes per block: eight 32-bit words.
pub(crate) const BLOCK_LEN: usize = 32;
/// The trailer after the filter: blocks (u64), keys (u64), checksum (u64), magic.
pub(crate) const TRAILER_LEN: usize = 32;
pub(crate) const TRAILER_MAGIC: [u8; 8] = *b"LHLEGACY";
/// Bits of filter per key: about 0.3 % false positives for eight bits set in a 256-bit block.
pub(crate) const BITS_PER_KEY: u64 = 16;
/// The filter's hash seed is the index's, changed so the two hashes are independent.
const SEED_MIX: u64 = 0x6c65_6761_6379_7365;

/// Parquet's salts (one odd constant per word of a block).
const SALT: [u32; 8] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
];

/// The hash a key is filtered by, under the snapshot's `seed`.
#[inline]
pub(crate) fn key_hash(key: &[u8], seed: u64) -> u64 {
    xxh3_64_with_seed(key, seed ^ SEED_MIX)
}

/// Blocks for `keys` keys (at least one).
pub(crate) fn blocks_for(keys: u64) -> u64 {
    keys.saturating_mul(BITS_PER_KEY)
        .div_ceil(BLOCK_LEN as u64 * 8)
        .clamp(1, 1 << 32)
}

#[inline]
fn block_of(h: u64, blocks: u64) -> usize {
    // blocks <= 2^32: the product fits 64 bits, and the result is below blocks.
    (((h >> 32) * blocks) >> 32) as usize
}

#[inline]
fn bit(h: u64, word: usize) -> u32 {
    let salt = SALT.get(word).copied().unwrap_or(1);
    1u32 << ((h as u32).wrapping_mul(salt) >> 27)
}

/// Sets `h`'s bits in `filter` (`blocks` blocks).
pub(crate) fn insert(filter: &mut [u8], blocks: u64, h: u64) {
    let at = block_of(h, blocks) * BLOCK_LEN;
    if let Some(block) = filter.get_mut(at..at + BLOCK_LEN) {
        for (i, word) in block.chunks_exact_mut(4).enumerate() {
            let mut w = [0u8; 4];
            w.copy_from_slice(word);
            let v = u32::from_le_bytes(w) | bit(h, i);
            word.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Whether `h` may be in `filter` (false: certainly not). Bounds-checked: a corrupt filter can
/// give a wrong answer, never a panic.
#[inline]
pub(crate) fn may_contain(filter: &[u8], blocks: u64, h: u64) -> bool {
    let at = block_of(h, blocks) * BLOCK_LEN;
    let Some(block) = filter.get(at..at + BLOCK_LEN) else {
        return false;
    };
    block.chunks_exact(4).enumerate().all(|(i, word)| {
        let w = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        w & bit(h, i) != 0
    })
}

/// The filter of `hashes` (sorted or not; repeats are harmless).
pub(crate) fn build(hashes: &[u64]) -> (u64, Vec<u8>) {
    let blocks = blocks_for(hashes.len() as u64);
    let mut filter = vec![0u8; blocks as usize * BLOCK_LEN];
    for &h in hashes {
        insert(&mut filter, blocks, h);
    }
    (blocks, filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_added_is_found_and_few_others_are() {
        let keys: Vec<String> = (0..20_000).map(|i| format!("k{i}")).collect();
        let hashes: Vec<u64> = keys.iter().map(|k| key_hash(k.as_bytes(), 7)).collect();
        let (blocks, filter) = build(&hashes);
        assert!(hashes.iter().all(|&h| may_contain(&filter, blocks, h)));
        let false_positives = (0..100_000)
            .filter(|i| may_contain(&filter, blocks, key_hash(format!("x{i}").as_bytes(), 7)))
            .count();
        // 16 bits a key: about 0.1-0.3 % (a bound with room for chance).
        assert!(false_positives < 1_000, "{false_positives} of 100000");
        assert!(!may_contain(&[], 1, 5), "an empty filter holds nothing");
    }
}
