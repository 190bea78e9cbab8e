//! The staged keys of a transaction, hashed: a map from keys to states that keeps every key at
//! the position it was staged at, in storage that never moves.
//!
//! A hash map that keeps insertion order in one vector (as `indexmap` does) copies the whole
//! vector each time it grows, and the copy touches fresh memory as large as what it copies: a
//! bulk load's staging took a third of its page faults in those copies, and about a fifth of
//! the time of the phase in which the map grew past 200k keys in them and in the rehashing.
//! Here the entries lie in chunks of a fixed size that are added as they fill and never
//! reallocated, and each slot of the hash table holds its key's hash beside the position, so
//! that growing the table reads the table alone. An entry names its key's bytes in the map's
//! arena ([`super::arena`]) rather than holding them.
//!
//! Keys are placed by their ids as well as by hash ([`Slots::hash`], [`crate::kv::near`]): keys
//! that differ only in the low bits of their last byte, the low bits of the id a catalog key ends
//! in, lie side by side in one run of buckets. A bulk load stages the data-file index's keys (the
//! id alone) in id order; placed at random, each took a cache miss and a page walk in the table,
//! which at a million files had grown past the caches; placed side by side, a run of 64 ids takes
//! one. The data-file phase of a 1M-mapping load went from 1.73 s to 1.36 s, the load's CPU from
//! 5.07 s to 4.44 s (an optimized build, medians of 6 interleaved rounds).

use std::hash::BuildHasher as _;

use hashbrown::HashTable;

use super::arena::{Arena, Span};
use crate::kv::near::{NEAR_MASK_BYTE, near_hash, placed};

/// Entries per chunk: 4,096 entries of 32 bytes, 128 KiB.
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A hash table slot, 8 bytes: 32 bits of the key's hash and the key's position.
#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u32,
    at: u32,
}

/// Why a key could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// The key (with its trailer), this long, is longer than the arena holds in one piece.
    Key(usize),
    /// The map holds as many keys as a position can number.
    Keys,
}

/// A key's hash, from [`Slots::lookup`], for [`Slots::push`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Hash(u32);

/// Where a key is: at a position, or absent (with its hash, to add it).
#[derive(Debug, Clone, Copy)]
pub(super) enum Lookup {
    /// The key is at this position.
    At(usize),
    /// The key is absent.
    Absent(Hash),
}

/// Keys and their values, found by hash and numbered in the order they were first inserted.
/// The keys' bytes lie in the map's [`Arena`], which also holds whatever bytes the values
/// name.
#[derive(Debug, Clone)]
pub(super) struct Slots<V> {
    table: HashTable<Slot>,
    /// The entries, `CHUNK` to a chunk: entry `at` is `chunks[at / CHUNK][at % CHUNK]`.
    chunks: Vec<Vec<(Span, V)>>,
    arena: Arena,
    len: usize,
    state: foldhash::fast::RandomState,
}

impl<V> Default for Slots<V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            chunks: Vec::new(),
            arena: Arena::default(),
            len: 0,
            state: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V: Copy> Slots<V> {
    /// Keys in the map.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes room in the table for `additional` more keys.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.table.reserve(additional, |slot| placed(slot.hash));
    }

    /// The bytes of keys and values.
    pub(super) fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The bytes of keys and values, to add to (or to truncate, when the keys whose bytes
    /// are cut off are taken out too).
    pub(super) fn arena_mut(&mut self) -> &mut Arena {
        &mut self.arena
    }

    /// Memory the map holds, in bytes: entries, table and arena.
    pub(super) fn memory(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum::<usize>() * size_of::<(Span, V)>()
            + self.table.capacity() * (size_of::<Slot>() + 1)
            + self.arena.capacity()
    }

    /// A key's 32-bit hash: its block's hash in the high bits and its near bits, the low
    /// bits of its last byte, in the low ones. A key's block is the key with those bits
    /// cleared. A catalog key ends in a big-endian id, so keys of neighbouring ids lie side
    /// by side; why no input can crowd a bucket is in [`crate::kv::near`].
    fn hash(&self, key: &[u8]) -> u32 {
        use std::hash::Hasher as _;
        let mut hasher = self.state.build_hasher();
        let near = match key.split_last() {
            Some((&last, head)) => {
                hasher.write(head);
                hasher.write_u8(last & !NEAR_MASK_BYTE);
                u32::from(last & NEAR_MASK_BYTE)
            }
            None => 0,
        };
        near_hash(hasher.finish(), near)
    }

    /// Where `key` is.
    pub(super) fn lookup(&self, key: &[u8]) -> Lookup {
        let hash = self.hash(key);
        let (chunks, arena) = (&self.chunks, &self.arena);
        self.table
            .find(placed(hash), |slot| {
                slot.hash == hash
                    && entry_in(chunks, slot.at as usize)
                        .is_some_and(|(span, _)| arena.get(*span, 0) == key)
            })
            .map_or(Lookup::Absent(Hash(hash)), |slot| {
                Lookup::At(slot.at as usize)
            })
    }

    /// The position of `key`.
    pub(super) fn index_of(&self, key: &[u8]) -> Option<usize> {
        match self.lookup(key) {
            Lookup::At(at) => Some(at),
            Lookup::Absent(_) => None,
        }
    }

    /// The value of `key`.
    pub(super) fn get(&self, key: &[u8]) -> Option<&V> {
        self.get_index(self.index_of(key)?).map(|(_, value)| value)
    }

    /// The key at position `at` and its value.
    pub(super) fn get_index(&self, at: usize) -> Option<(&[u8], &V)> {
        entry_in(&self.chunks, at).map(|(span, value)| (self.arena.get(*span, 0), value))
    }

    /// The span of the key at position `at` and its value.
    pub(super) fn span_at(&self, at: usize) -> Option<(Span, V)> {
        entry_in(&self.chunks, at).copied()
    }

    /// The value at position `at`, to change.
    pub(super) fn value_mut(&mut self, at: usize) -> Option<&mut V> {
        let (chunk, within) = place(at);
        Some(&mut self.chunks.get_mut(chunk)?.get_mut(within)?.1)
    }

    /// Adds `key`, absent with hash `hash` (as [`lookup`](Self::lookup) found it), at the
    /// next position, which it returns; `trailer` is copied into the arena right after the
    /// key.
    ///
    /// # Errors
    /// [`Full`] when the key cannot be added.
    pub(super) fn push(
        &mut self,
        Hash(hash): Hash,
        key: &[u8],
        trailer: &[u8],
        value: V,
    ) -> Result<usize, Full> {
        let at = self.len;
        let Ok(slot_at) = u32::try_from(at) else {
            return Err(Full::Keys);
        };
        let span = self.arena.push_with(key, trailer).map_err(Full::Key)?;
        self.table
            .insert_unique(placed(hash), Slot { hash, at: slot_at }, |slot| {
                placed(slot.hash)
            });
        if self.chunks.last().is_none_or(|chunk| chunk.len() == CHUNK) {
            // The first chunk grows as a vector does (to `CHUNK`, a power of two), so that a
            // small transaction holds little; the later ones are allocated whole and never
            // move.
            let chunk = if self.chunks.is_empty() {
                Vec::new()
            } else {
                Vec::with_capacity(CHUNK)
            };
            self.chunks.push(chunk);
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push((span, value));
        }
        self.len += 1;
        Ok(at)
    }

    /// Sets `key` to `value`: in its place if present, else at the next position.
    #[cfg(test)]
    pub(super) fn insert(&mut self, key: &[u8], value: V) {
        match self.lookup(key) {
            Lookup::At(at) => {
                if let Some(slot) = self.value_mut(at) {
                    *slot = value;
                }
            }
            Lookup::Absent(hash) => {
                self.push(hash, key, &[], value).expect("a short key");
            }
        }
    }

    /// Takes out the entries from position `from` on, newest first, handing each to `each`
    /// with its key. Their bytes stay in the arena.
    pub(super) fn truncate(&mut self, from: usize, mut each: impl FnMut(&[u8], V)) {
        while self.len > from {
            let at = self.len - 1;
            let Some((span, value)) = self.chunks.last_mut().and_then(Vec::pop) else {
                break;
            };
            if self.chunks.last().is_some_and(Vec::is_empty) {
                self.chunks.pop();
            }
            let key = self.arena.get(span, 0);
            let hash = placed(self.hash(key));
            if let Ok(slot) = self.table.find_entry(hash, |slot| slot.at as usize == at) {
                slot.remove();
            }
            self.len = at;
            each(key, value);
        }
    }

    /// Every key and value, in the order of their positions.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], &V)> + Clone {
        self.chunks
            .iter()
            .flatten()
            .map(|(span, value)| (self.arena.get(*span, 0), value))
    }

    /// Every key's span and value, in the order of their positions.
    pub(super) fn spans(&self) -> impl Iterator<Item = (Span, V)> + Clone {
        self.chunks.iter().flatten().copied()
    }

    /// Every key, in the order of their positions.
    pub(super) fn keys(&self) -> impl Iterator<Item = &[u8]> + Clone {
        self.iter().map(|(key, _)| key)
    }

    /// Every value, in the order of their positions.
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, value)| value)
    }
}

/// Where entry `at` lies: its chunk, and its place in the chunk.
fn place(at: usize) -> (usize, usize) {
    (at >> CHUNK_BITS, at & (CHUNK - 1))
}

/// The entry at `at` of `chunks`.
fn entry_in<V>(chunks: &[Vec<(Span, V)>], at: usize) -> Option<&(Span, V)> {
    let (chunk, within) = place(at);
    chunks.get(chunk)?.get(within)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        /// This many fresh keys at once, to cross chunks.
        Bulk(u16),
        Truncate(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..300_u16, any::<u32>()).prop_map(|(key, value)| Op::Insert(key, value)),
            2 => (0..6_000_u16).prop_map(Op::Bulk),
            2 => (0..16_000_usize).prop_map(Op::Truncate),
        ]
    }

    fn key(n: u16) -> Vec<u8> {
        format!("key-{n}").into_bytes()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against a vector of pairs: every key keeps its first position until it is taken
        /// out, is found by hash and by position, and a truncation takes out exactly the
        /// entries from its position on, newest first, across chunk boundaries.
        #[test]
        fn slots_agree_with_a_vector(ops in proptest::collection::vec(op(), 1..30)) {
            let mut slots: Slots<u32> = Slots::default();
            let mut model: Vec<(Vec<u8>, u32)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(n, value) => {
                        let expected_at = model.iter().position(|(k, _)| *k == key(n));
                        match slots.lookup(&key(n)) {
                            Lookup::At(at) => {
                                prop_assert_eq!(Some(at), expected_at);
                                prop_assert_eq!(
                                    slots.get_index(at).map(|(k, _)| k),
                                    Some(&key(n)[..])
                                );
                                *slots.value_mut(at).expect("present") = value;
                            }
                            Lookup::Absent(hash) => {
                                prop_assert_eq!(expected_at, None);
                                let at = slots.push(hash, &key(n), b"", value).expect("push");
                                prop_assert_eq!(at, model.len());
                            }
                        }
                        match expected_at.and_then(|at| model.get_mut(at)) {
                            Some(pair) => pair.1 = value,
                            None => model.push((key(n), value)),
                        }
                    }
                    Op::Bulk(count) => {
                        for extra in 0..count {
                            let k = format!("bulk-{}-{extra}", model.len()).into_bytes();
                            slots.insert(&k, u32::from(extra));
                            model.push((k, u32::from(extra)));
                        }
                    }
                    Op::Truncate(from) => {
                        let mut taken = Vec::new();
                        slots.truncate(from, |k, v| taken.push((k.to_vec(), v)));
                        let mut expected: Vec<(Vec<u8>, u32)> =
                            model.drain(from.min(model.len())..).collect();
                        expected.reverse();
                        prop_assert_eq!(taken, expected);
                    }
                }
                prop_assert_eq!(slots.len(), model.len());
            }
            let listed: Vec<(Vec<u8>, u32)> =
                slots.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
            prop_assert_eq!(&listed, &model);
            let by_key: HashMap<&[u8], usize> =
                model.iter().enumerate().map(|(at, (k, _))| (&k[..], at)).collect();
            for (&k, &at) in &by_key {
                prop_assert_eq!(slots.index_of(k), Some(at));
                prop_assert_eq!(slots.get(k), model.get(at).map(|(_, v)| v));
                prop_assert_eq!(slots.get_index(at).map(|(k, _)| k), Some(k));
            }
            for n in 0..300_u16 {
                if !by_key.contains_key(&key(n)[..]) {
                    prop_assert_eq!(slots.index_of(&key(n)), None);
                }
            }
            let cloned = slots.clone();
            prop_assert!(cloned.iter().eq(slots.iter()));
        }
    }

    /// A key's trailer lies right after it in the arena, outside the key itself.
    #[test]
    fn a_trailer_follows_its_key() {
        let mut slots: Slots<u32> = Slots::default();
        let Lookup::Absent(hash) = slots.lookup(b"a") else {
            panic!("empty map");
        };
        let at = slots.push(hash, b"a", b"tail", 1).expect("push");
        let (span, value) = slots.span_at(at).expect("present");
        assert_eq!((slots.arena().get(span, 0), value), (&b"a"[..], 1));
        assert_eq!(slots.arena().get(span, 4), b"atail");
        assert_eq!(slots.keys().collect::<Vec<_>>(), [&b"a"[..]]);
        assert_eq!(slots.values().copied().collect::<Vec<_>>(), [1]);
        assert!(!slots.is_empty());
    }

    /// Keys of neighbouring ids (big-endian, last) are placed in one aligned run of buckets,
    /// in id order and with tags of their own; the next run of ids is placed elsewhere, by
    /// the seeded hash of the rest of the key.
    #[test]
    fn neighbouring_ids_are_placed_side_by_side() {
        let slots: Slots<u32> = Slots::default();
        let key = |id: u64| [b"catalog".as_slice(), &id.to_be_bytes()].concat();
        crate::kv::near::assert_neighbouring_ids_lie_side_by_side(|id| {
            placed(slots.hash(&key(id)))
        });
    }
}
