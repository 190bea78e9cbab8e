//! Write sets: a list of mutations built by a caller that does not stage incrementally, and
//! the checked, per-key writes a backend commits.

use bytes::Bytes;

use super::digest::Digest;
use super::staged::{StagedWrites, Undo};
use super::{KeyRange, KvError};

/// One mutation of a [`WriteSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Set `key` to `value`, whatever was there.
    Put {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// Set `key` to `value`; the whole commit fails with
    /// [`Conflict::AlreadyExists`](super::Conflict::AlreadyExists) if the key is present.
    Insert {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// Remove `key`, if present.
    Delete {
        /// The key.
        key: Bytes,
    },
    /// Write nothing, but fail the whole commit with
    /// [`Conflict::Missing`](super::Conflict::Missing) unless `key` is present.
    RequirePresent {
        /// The key.
        key: Bytes,
    },
    /// Write nothing, but fail the whole commit with
    /// [`Conflict::AlreadyExists`](super::Conflict::AlreadyExists) if `key` is present. Has
    /// no effect after a mutation of the same key.
    RequireAbsent {
        /// The key.
        key: Bytes,
    },
    /// Write nothing, but fail the whole commit with
    /// [`Conflict::Changed`](super::Conflict::Changed) (or `Missing`) unless `key` holds a
    /// value whose digest is `digest`. Has no effect after a mutation of the same key: it
    /// states what was read before writing.
    RequireUnchanged {
        /// The key.
        key: Bytes,
        /// The digest of the value read.
        digest: Digest,
    },
    /// Write nothing, but fail the whole commit with
    /// [`Conflict::RangeChanged`](super::Conflict::RangeChanged) unless `range` holds pairs
    /// whose digest is `digest`.
    RequireRange {
        /// The range.
        range: KeyRange,
        /// The digest of its pairs as read.
        digest: Digest,
    },
}

/// The mutations of one atomic commit, applied in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteSet {
    mutations: Vec<Mutation>,
}

impl WriteSet {
    /// An empty write set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a [`Mutation::Put`].
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> &mut Self {
        self.push(Mutation::Put {
            key: key.into(),
            value: value.into(),
        })
    }

    /// Adds a [`Mutation::Insert`].
    pub fn insert(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> &mut Self {
        self.push(Mutation::Insert {
            key: key.into(),
            value: value.into(),
        })
    }

    /// Adds a [`Mutation::Delete`].
    pub fn delete(&mut self, key: impl Into<Bytes>) -> &mut Self {
        self.push(Mutation::Delete { key: key.into() })
    }

    /// Adds a [`Mutation::RequirePresent`].
    pub fn require_present(&mut self, key: impl Into<Bytes>) -> &mut Self {
        self.push(Mutation::RequirePresent { key: key.into() })
    }

    /// Adds a [`Mutation::RequireAbsent`].
    pub fn require_absent(&mut self, key: impl Into<Bytes>) -> &mut Self {
        self.push(Mutation::RequireAbsent { key: key.into() })
    }

    /// Adds a [`Mutation::RequireUnchanged`].
    pub fn require_unchanged(&mut self, key: impl Into<Bytes>, digest: Digest) -> &mut Self {
        self.push(Mutation::RequireUnchanged {
            key: key.into(),
            digest,
        })
    }

    /// Adds a [`Mutation::RequireRange`].
    pub fn require_range(&mut self, range: KeyRange, digest: Digest) -> &mut Self {
        self.push(Mutation::RequireRange { range, digest })
    }

    /// Adds any mutation.
    pub fn push(&mut self, mutation: Mutation) -> &mut Self {
        self.mutations.push(mutation);
        self
    }

    /// The mutations, in order.
    #[must_use]
    pub fn mutations(&self) -> &[Mutation] {
        &self.mutations
    }

    /// Number of mutations.
    #[must_use]
    pub fn len(&self) -> usize {
        self.mutations.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.mutations.is_empty()
    }

    /// The mutations reduced to one staged write per key, with the same effect as applying
    /// them one after another.
    ///
    /// # Errors
    /// [`KvError::ContradictoryWriteSet`] for an insert of a key the set already wrote, or a
    /// requirement of a key it deleted.
    pub fn into_staged(self) -> Result<StagedWrites, KvError> {
        self.into_staged_at(None)
    }

    /// As [`into_staged`](Self::into_staged), for a writer whose requirements state what the
    /// snapshot of store version `version` held ([`StagedWrites::read_at`]).
    ///
    /// # Errors
    /// As [`into_staged`](Self::into_staged).
    pub fn into_staged_at(self, version: Option<u64>) -> Result<StagedWrites, KvError> {
        let mut staged = StagedWrites::read_at(version);
        let mut undo = Undo::off();
        for mutation in self.mutations {
            staged.apply(mutation, &mut undo)?;
        }
        staged.seal();
        Ok(staged)
    }
}
