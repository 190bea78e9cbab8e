//! Hashing that places neighbouring ids side by side in a hash table.
//!
//! A catalog's ids come from one counter, and a bulk load stages them in order. Hashed at
//! random, each key of a large table costs a cache miss and a page walk when it is placed or
//! found; placed by its id's low bits within a run of buckets that the rest of the key picks
//! by hash, a run of ids costs one. The rest of the key (its *block*) is hashed with a seeded
//! hash, so where a block lies cannot be chosen from outside; a block holds at most
//! `2^NEAR_BITS` keys (they differ in those bits alone), each in a bucket and with a tag of
//! its own, so no input crowds more keys onto one bucket than random hashing would.
//!
//! [`placed`] lays a 32-bit hash out as hashbrown (and so `std`'s maps) uses one: the bucket
//! from the low bits, the 7-bit tag it compares first from the top ones. [`NearIds`] is the
//! [`BuildHasher`] of maps keyed by ids (or by tuples that end in one); the staged keys'
//! table ([`super::staged`]) hashes byte keys the same way.

use std::hash::{BuildHasher, Hasher};

/// Bits of a key's place taken from the low bits of its id.
pub(crate) const NEAR_BITS: u32 = 6;
/// The near bits of a 32-bit hash.
pub(crate) const NEAR_MASK: u32 = (1 << NEAR_BITS) - 1;
/// The near bits of a key's last byte.
pub(crate) const NEAR_MASK_BYTE: u8 = (1 << NEAR_BITS) - 1;

/// The 64-bit hash a hashbrown table places a key by, from its 32-bit hash: the block's hash
/// (the bits above [`NEAR_BITS`]) spread over the high bits by an odd multiplier, the near
/// bits as the bucket's low bits. Keys of one block lie in one aligned run of `2^NEAR_BITS`
/// buckets, in the order of their ids. The top seven bits, which the table keeps as the
/// key's tag and compares first, are the near bits and a bit of the block's: no two keys of
/// a block share a tag.
pub(crate) fn placed(hash: u32) -> u64 {
    let near = u64::from(hash & NEAR_MASK);
    let block = u64::from(hash >> NEAR_BITS).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let tag = near | ((block >> 63) << NEAR_BITS);
    (tag << 57) | (((block << NEAR_BITS) | near) & ((1 << 57) - 1))
}

/// The 32-bit hash [`placed`] takes: a block's 64-bit hash in the high bits, `near` (the near
/// bits) in the low ones.
pub(crate) fn near_hash(block: u64, near: u32) -> u32 {
    // The high half: foldhash mixes its output there best.
    let [a, b, c, d, ..] = block.to_be_bytes();
    (u32::from_be_bytes([a, b, c, d]) & !NEAR_MASK) | (near & NEAR_MASK)
}

/// A [`BuildHasher`] for maps keyed by ids, or by tuples of integers that end in an id:
/// keys that differ only in the low six bits (`NEAR_BITS`) of the last integer they hash
/// lie in one run of buckets. Seeded per map, as `foldhash`'s `RandomState` is.
#[derive(Debug, Clone, Default)]
pub struct NearIds(foldhash::fast::RandomState);

impl BuildHasher for NearIds {
    type Hasher = NearHasher;

    fn build_hasher(&self) -> NearHasher {
        NearHasher {
            block: self.0.build_hasher(),
            last: None,
        }
    }
}

/// The [`Hasher`] of [`NearIds`]: everything but the last integer written goes whole into
/// the block's hash, the last one without its near bits.
#[derive(Clone)]
pub struct NearHasher {
    block: foldhash::fast::FoldHasher<'static>,
    last: Option<u64>,
}

impl std::fmt::Debug for NearHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NearHasher")
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl NearHasher {
    /// Hashes the integer held back as the last one whole: something was written after it.
    fn settle(&mut self) {
        if let Some(last) = self.last.take() {
            self.block.write_u64(last);
        }
    }
}

impl Hasher for NearHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.settle();
        self.block.write(bytes);
    }

    fn write_u64(&mut self, i: u64) {
        self.settle();
        self.last = Some(i);
    }

    fn write_i64(&mut self, i: i64) {
        self.write_u64(i.cast_unsigned());
    }

    fn finish(&self) -> u64 {
        let Some(last) = self.last else {
            return placed(near_hash(self.block.finish(), 0));
        };
        let mut block = self.block.clone();
        block.write_u64(last >> NEAR_BITS);
        // Masked to six bits, it always fits.
        let near = u32::try_from(last & u64::from(NEAR_MASK)).unwrap_or_default();
        placed(near_hash(block.finish(), near))
    }
}

/// Asserts that `placed_id`, the 64-bit hash a table places a key ending in id `id` by, puts
/// neighbouring ids side by side: in a table of 2^20 buckets, each run of `2^NEAR_BITS` ids
/// starts on a multiple of its length and takes consecutive buckets in id order, with tags
/// (the top seven bits) of its own; and 100 runs lie (almost) all apart and spread over more
/// than their width, as a seeded hash of the rest of the key puts them, where the ids alone
/// would put each run on the next.
#[cfg(test)]
pub(crate) fn assert_neighbouring_ids_lie_side_by_side(placed_id: impl Fn(u64) -> u64) {
    use std::collections::HashSet;
    let bucket = |id: u64| placed_id(id) & ((1 << 20) - 1);
    let block = 1_u64 << NEAR_BITS;
    let mut starts = HashSet::new();
    for first in (0..100).map(|run| (1_000 + run) * block) {
        let start = bucket(first);
        assert_eq!(start % block, 0, "the run of id {first} starts mid-run");
        for id in first..first + block {
            assert_eq!(
                bucket(id),
                start + (id - first),
                "id {id} is not beside its run"
            );
        }
        let tags: HashSet<u64> = (first..first + block)
            .map(|id| placed_id(id) >> 57)
            .collect();
        assert_eq!(
            tags.len() as u64,
            block,
            "two ids of the run of {first} share a tag"
        );
        starts.insert(start);
    }
    assert!(starts.len() >= 90, "{} distinct runs of 100", starts.len());
    let spread =
        starts.iter().max().copied().unwrap_or(0) - starts.iter().min().copied().unwrap_or(0);
    assert!(
        spread > 100 * block,
        "runs lie {spread} buckets apart at most"
    );
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    fn hash_of(state: &NearIds, key: impl std::hash::Hash) -> u64 {
        state.hash_one(key)
    }

    /// Ids of one block take consecutive buckets in id order, with tags of their own; the
    /// blocks of a run of ids lie in distinct places.
    #[test]
    fn neighbouring_ids_lie_side_by_side() {
        let state = NearIds::default();
        assert_neighbouring_ids_lie_side_by_side(|id| hash_of(&state, id.cast_signed()));
    }

    /// In a tuple, only the last integer is split: keys whose first integers differ in
    /// their low bits (the same mapping id in neighbouring tables) are hashed apart, not
    /// crowded into one run.
    #[test]
    fn only_the_last_integer_places_a_key_side_by_side() {
        let state = NearIds::default();
        let buckets = (1_u64 << 20) - 1;
        let runs: HashSet<u64> = (0..64_i64)
            .map(|table| hash_of(&state, (table, 7_i64)) & buckets & !63)
            .collect();
        assert!(runs.len() >= 60, "tables share runs: {}", runs.len());
        let same_table = hash_of(&state, (3_i64, 64_i64)) & buckets;
        let next_id = hash_of(&state, (3_i64, 65_i64)) & buckets;
        assert_eq!(next_id, same_table + 1);
    }

    /// Two maps' seeds place the same ids apart: where a block lies is not fixed.
    #[test]
    fn blocks_are_placed_by_a_seeded_hash() {
        let (a, b) = (NearIds::default(), NearIds::default());
        let moved = (0..64_i64)
            .filter(|run| hash_of(&a, run * 64) != hash_of(&b, run * 64))
            .count();
        assert!(moved >= 60, "only {moved} of 64 blocks moved between seeds");
    }

    proptest! {
        /// A map hashed by ids holds what an ordered map does, for any ids.
        #[test]
        fn a_map_keyed_by_near_ids_agrees_with_an_ordered_one(
            ops in proptest::collection::vec((any::<bool>(), -300_i64..300, any::<u8>()), 1..400),
        ) {
            let mut near: HashMap<i64, u8, NearIds> = HashMap::default();
            let mut ordered = BTreeMap::new();
            for (insert, id, value) in ops {
                let id = id * 37 + i64::from(value % 3);
                if insert {
                    prop_assert_eq!(near.insert(id, value), ordered.insert(id, value));
                } else {
                    prop_assert_eq!(near.remove(&id), ordered.remove(&id));
                }
            }
            prop_assert_eq!(near.len(), ordered.len());
            for (id, value) in &ordered {
                prop_assert_eq!(near.get(id), Some(value));
            }
        }
    }
}
