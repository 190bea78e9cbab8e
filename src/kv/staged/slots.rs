//! The staged keys of a transaction, hashed: a map from keys to states that keeps every key at
//! the position it was staged at, in storage that never moves.
//!
//! A hash map that keeps insertion order in one vector (as `indexmap` does) copies the whole
//! vector each time it grows, and the copy touches fresh memory as large as what it copies: a
//! bulk load's staging took a third of its page faults in those copies, and about a fifth of
//! the time of the phase in which the map grew past 200k keys in them and in the rehashing.
//! Here the entries lie in chunks of a fixed size that are added as they fill and never
//! reallocated, and each slot of the hash table holds its key's hash beside the position, so
//! that growing the table reads the table alone.

use std::hash::BuildHasher as _;

use bytes::Bytes;
use hashbrown::HashTable;

/// Entries per chunk: 4,096 entries of about 90 bytes, a few hundred KiB.
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A hash table slot: the key's hash and the key's position.
#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    at: usize,
}

/// Keys and their values, found by hash and numbered in the order they were first inserted.
#[derive(Debug, Clone)]
pub(super) struct Slots<V> {
    table: HashTable<Slot>,
    /// The entries, `CHUNK` to a chunk: entry `at` is `chunks[at / CHUNK][at % CHUNK]`.
    chunks: Vec<Vec<(Bytes, V)>>,
    len: usize,
    state: foldhash::fast::RandomState,
}

/// A key in the map, or a place for it.
pub(super) enum Entry<'a, V> {
    /// The key is at this position.
    Occupied(Occupied<'a, V>),
    /// The key is absent.
    Vacant(Vacant<'a, V>),
}

/// A key present in the map: `at` is the position of an entry.
pub(super) struct Occupied<'a, V> {
    slots: &'a mut Slots<V>,
    at: usize,
}

/// A key absent from the map, with its hash.
pub(super) struct Vacant<'a, V> {
    slots: &'a mut Slots<V>,
    key: Bytes,
    hash: u64,
}

impl<V> Occupied<'_, V> {
    /// The key's position.
    pub(super) fn index(&self) -> usize {
        self.at
    }

    // An occupied entry is made only for a position the map holds, and the map does not
    // change while the entry borrows it: indexing cannot fail.

    #[allow(clippy::indexing_slicing)]
    fn pair(&self) -> &(Bytes, V) {
        let (chunk, within) = place(self.at);
        &self.slots.chunks[chunk][within]
    }

    /// The key.
    pub(super) fn key(&self) -> &Bytes {
        &self.pair().0
    }

    /// The value.
    pub(super) fn get(&self) -> &V {
        &self.pair().1
    }

    /// The value, to change.
    #[allow(clippy::indexing_slicing)]
    pub(super) fn get_mut(&mut self) -> &mut V {
        let (chunk, within) = place(self.at);
        &mut self.slots.chunks[chunk][within].1
    }
}

impl<V> Vacant<'_, V> {
    /// The position the key will have.
    pub(super) fn index(&self) -> usize {
        self.slots.len
    }

    /// The key.
    pub(super) fn key(&self) -> &Bytes {
        &self.key
    }

    /// Inserts the key with `value`, at [`index`](Self::index).
    pub(super) fn insert(self, value: V) {
        let Self { slots, key, hash } = self;
        slots.push_hashed(hash, key, value);
    }
}

impl<V> Default for Slots<V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            chunks: Vec::new(),
            len: 0,
            state: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V> Slots<V> {
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
        self.table.reserve(additional, |slot| slot.hash);
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.state.hash_one(key)
    }

    fn entry_ref(&self, at: usize) -> Option<&(Bytes, V)> {
        entry_in(&self.chunks, at)
    }

    fn entry_mut(&mut self, at: usize) -> Option<(&mut Bytes, &mut V)> {
        let (chunk, within) = place(at);
        let (key, value) = self.chunks.get_mut(chunk)?.get_mut(within)?;
        Some((key, value))
    }

    /// The position of `key`.
    pub(super) fn index_of(&self, key: &[u8]) -> Option<usize> {
        self.index_of_hashed(self.hash(key), key)
    }

    /// The value of `key`.
    pub(super) fn get(&self, key: &[u8]) -> Option<&V> {
        self.get_index(self.index_of(key)?).map(|(_, value)| value)
    }

    /// The key at position `at` and its value.
    pub(super) fn get_index(&self, at: usize) -> Option<(&Bytes, &V)> {
        self.entry_ref(at).map(|(key, value)| (key, value))
    }

    /// The key at position `at` and its value, to change.
    pub(super) fn get_index_mut(&mut self, at: usize) -> Option<(&Bytes, &mut V)> {
        self.entry_mut(at).map(|(key, value)| (&*key, value))
    }

    /// `key`'s entry: where it is, or a place for it.
    pub(super) fn entry(&mut self, key: Bytes) -> Entry<'_, V> {
        let hash = self.hash(&key);
        match self.index_of_hashed(hash, &key) {
            Some(at) => Entry::Occupied(Occupied { slots: self, at }),
            None => Entry::Vacant(Vacant {
                slots: self,
                key,
                hash,
            }),
        }
    }

    fn index_of_hashed(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let chunks = &self.chunks;
        self.table
            .find(hash, |slot| {
                slot.hash == hash && key_is(chunks, slot.at, key)
            })
            .map(|slot| slot.at)
    }

    /// Adds `key`, which must be absent, at the next position.
    fn push_hashed(&mut self, hash: u64, key: Bytes, value: V) {
        let at = self.len;
        self.table
            .insert_unique(hash, Slot { hash, at }, |slot| slot.hash);
        if self.chunks.last().is_none_or(|chunk| chunk.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push((key, value));
        }
        self.len += 1;
    }

    /// Sets `key` to `value`: in its place if present, else at the next position.
    pub(super) fn insert(&mut self, key: Bytes, value: V) {
        match self.entry(key) {
            Entry::Occupied(mut present) => *present.get_mut() = value,
            Entry::Vacant(absent) => absent.insert(value),
        }
    }

    /// Takes out the entries from position `from` on, newest first, handing each to `each`.
    pub(super) fn truncate(&mut self, from: usize, mut each: impl FnMut(Bytes, V)) {
        while self.len > from {
            let at = self.len - 1;
            let Some((key, value)) = self.chunks.last_mut().and_then(Vec::pop) else {
                break;
            };
            if self.chunks.last().is_some_and(Vec::is_empty) {
                self.chunks.pop();
            }
            let hash = self.hash(&key);
            if let Ok(slot) = self.table.find_entry(hash, |slot| slot.at == at) {
                slot.remove();
            }
            self.len = at;
            each(key, value);
        }
    }

    /// Every key and value, in the order of their positions.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (&Bytes, &V)> + Clone {
        self.chunks
            .iter()
            .flatten()
            .map(|(key, value)| (key, value))
    }

    /// Every key, in the order of their positions.
    pub(super) fn keys(&self) -> impl Iterator<Item = &Bytes> + Clone {
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
fn entry_in<V>(chunks: &[Vec<(Bytes, V)>], at: usize) -> Option<&(Bytes, V)> {
    let (chunk, within) = place(at);
    chunks.get(chunk)?.get(within)
}

/// Whether the entry at `at` of `chunks` has key `key`.
fn key_is<V>(chunks: &[Vec<(Bytes, V)>], at: usize, key: &[u8]) -> bool {
    entry_in(chunks, at).is_some_and(|(stored, _)| stored.as_ref() == key)
}

impl<V> FromIterator<(Bytes, V)> for Slots<V> {
    /// The pairs in order; a key given twice keeps its first place and its last value.
    fn from_iter<I: IntoIterator<Item = (Bytes, V)>>(pairs: I) -> Self {
        let mut slots = Self::default();
        for (key, value) in pairs {
            slots.insert(key, value);
        }
        slots
    }
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

    fn key(n: u16) -> Bytes {
        Bytes::from(format!("key-{n}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against a vector of pairs: every key keeps its first position until it is taken
        /// out, is found by hash and by position, and a truncation takes out exactly the
        /// entries from its position on, newest first, across chunk boundaries.
        #[test]
        fn slots_agree_with_a_vector(ops in proptest::collection::vec(op(), 1..30)) {
            let mut slots: Slots<u32> = Slots::default();
            let mut model: Vec<(Bytes, u32)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(n, value) => {
                        let expected_at = model.iter().position(|(k, _)| *k == key(n));
                        match slots.entry(key(n)) {
                            Entry::Occupied(mut present) => {
                                prop_assert_eq!(Some(present.index()), expected_at);
                                prop_assert_eq!(present.key(), &key(n));
                                *present.get_mut() = value;
                            }
                            Entry::Vacant(absent) => {
                                prop_assert_eq!(expected_at, None);
                                prop_assert_eq!(absent.index(), model.len());
                                absent.insert(value);
                            }
                        }
                        match expected_at.and_then(|at| model.get_mut(at)) {
                            Some(pair) => pair.1 = value,
                            None => model.push((key(n), value)),
                        }
                    }
                    Op::Bulk(count) => {
                        for extra in 0..count {
                            let k = Bytes::from(format!("bulk-{}-{extra}", model.len()));
                            slots.insert(k.clone(), u32::from(extra));
                            model.push((k, u32::from(extra)));
                        }
                    }
                    Op::Truncate(from) => {
                        let mut taken = Vec::new();
                        slots.truncate(from, |k, v| taken.push((k, v)));
                        let mut expected: Vec<(Bytes, u32)> =
                            model.drain(from.min(model.len())..).collect();
                        expected.reverse();
                        prop_assert_eq!(taken, expected);
                    }
                }
                prop_assert_eq!(slots.len(), model.len());
            }
            let listed: Vec<(Bytes, u32)> =
                slots.iter().map(|(k, v)| (k.clone(), *v)).collect();
            prop_assert_eq!(&listed, &model);
            let by_key: HashMap<&Bytes, usize> =
                model.iter().enumerate().map(|(at, (k, _))| (k, at)).collect();
            for (&k, &at) in &by_key {
                prop_assert_eq!(slots.index_of(k), Some(at));
                prop_assert_eq!(slots.get(k), model.get(at).map(|(_, v)| v));
                prop_assert_eq!(slots.get_index(at).map(|(k, _)| k), Some(k));
            }
            for n in 0..300_u16 {
                if !by_key.contains_key(&key(n)) {
                    prop_assert_eq!(slots.index_of(&key(n)), None);
                }
            }
            let cloned = slots.clone();
            prop_assert!(cloned.iter().eq(slots.iter()));
        }
    }

    #[test]
    fn pairs_collect_in_order_and_a_repeated_key_keeps_its_place() {
        let slots: Slots<u32> = [("a", 1), ("b", 2), ("a", 3)]
            .into_iter()
            .map(|(k, v)| (Bytes::from(k), v))
            .collect();
        let pairs: Vec<(&[u8], u32)> = slots.iter().map(|(k, v)| (k.as_ref(), *v)).collect();
        assert_eq!(pairs, [(&b"a"[..], 3), (&b"b"[..], 2)]);
        assert!(!slots.is_empty());
        assert_eq!(slots.keys().count(), 2);
        assert_eq!(slots.values().copied().collect::<Vec<_>>(), [3, 2]);
    }
}
