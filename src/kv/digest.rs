//! Digests of what a transaction read, so that a commit can require a record or a whole range
//! to be still what the transaction saw without keeping a copy of it.
//!
//! A digest is 128 bits of two SipHash-1-3 states keyed at random when the process starts.
//! Digests never leave the process (they are made while staging and checked while committing,
//! by the same server), so the keys need not be stable, and a client that cannot learn them
//! cannot make two different contents collide on purpose.

use std::hash::{BuildHasher as _, Hasher as _, RandomState};
use std::sync::OnceLock;

/// What a value or a range held, in 128 bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u64; 2]);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({:016x}{:016x})", self.0[0], self.0[1])
    }
}

fn keys() -> &'static (RandomState, RandomState) {
    static KEYS: OnceLock<(RandomState, RandomState)> = OnceLock::new();
    KEYS.get_or_init(|| (RandomState::new(), RandomState::new()))
}

impl Digest {
    /// The digest of one stored value.
    #[must_use]
    pub fn of_value(value: &[u8]) -> Self {
        let mut digester = Digester::new();
        digester.chunk(value);
        digester.finish()
    }

    /// The digest as 16 bytes, for a store of bytes to hold ([`from_bytes`](Self::from_bytes)
    /// reads them back).
    #[must_use]
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0_u8; 16];
        for (to, word) in bytes.chunks_exact_mut(8).zip(self.0) {
            to.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// The digest [`to_bytes`](Self::to_bytes) gave `bytes` for; zeros past their end.
    #[must_use]
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        let mut words = [0_u64; 2];
        for (word, from) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut eight = [0_u8; 8];
            for (to, byte) in eight.iter_mut().zip(from) {
                *to = *byte;
            }
            *word = u64::from_le_bytes(eight);
        }
        Self(words)
    }
}

/// Builds the digest of a sequence of pairs: a range's contents, in key order.
pub struct Digester {
    halves: [std::hash::DefaultHasher; 2],
    pairs: u64,
}

impl Default for Digester {
    fn default() -> Self {
        Self::new()
    }
}

impl Digester {
    /// Nothing digested yet.
    #[must_use]
    pub fn new() -> Self {
        let (a, b) = keys();
        Self {
            halves: [a.build_hasher(), b.build_hasher()],
            pairs: 0,
        }
    }

    fn chunk(&mut self, bytes: &[u8]) {
        for half in &mut self.halves {
            // Length first, so that no two sequences of chunks feed the same bytes.
            half.write_usize(bytes.len());
            half.write(bytes);
        }
    }

    /// Adds one pair.
    pub fn pair(&mut self, key: &[u8], value: &[u8]) {
        self.chunk(key);
        self.chunk(value);
        self.pairs += 1;
    }

    /// The digest of every pair added, in the order added.
    #[must_use]
    pub fn finish(mut self) -> Digest {
        for half in &mut self.halves {
            half.write_u64(self.pairs);
        }
        Digest([self.halves[0].finish(), self.halves[1].finish()])
    }

    /// The digest of `pairs`.
    #[must_use]
    pub fn of_pairs<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Digest {
        let mut digester = Self::new();
        for (key, value) in pairs {
            digester.pair(key, value);
        }
        digester.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_contents_apart() {
        assert_eq!(Digest::of_value(b"abc"), Digest::of_value(b"abc"));
        assert_ne!(Digest::of_value(b"abc"), Digest::of_value(b"abd"));
        let split = |pairs: &[(&[u8], &[u8])]| Digester::of_pairs(pairs.iter().copied());
        // The same bytes cut differently, a pair more or fewer, and the empty range all differ.
        assert_ne!(split(&[(b"ab", b"c")]), split(&[(b"a", b"bc")]));
        assert_ne!(split(&[(b"a", b"")]), split(&[(b"a", b""), (b"a", b"")]));
        assert_ne!(split(&[]), split(&[(b"", b"")]));
        assert_eq!(split(&[(b"k", b"v")]), split(&[(b"k", b"v")]));
    }
}
