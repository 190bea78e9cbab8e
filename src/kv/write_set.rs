//! Write sets and their reduction to one checked write per key.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use super::{KvError, StoreLimits};

/// One mutation of a [`WriteSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Set `key` to `value`, whatever was there.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Set `key` to `value`; the whole commit fails with
    /// [`Conflict::AlreadyExists`](super::Conflict::AlreadyExists) if the key is present.
    Insert {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Remove `key`, if present.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Write nothing, but fail the whole commit with
    /// [`Conflict::Missing`](super::Conflict::Missing) unless `key` is present.
    RequirePresent {
        /// The key.
        key: Vec<u8>,
    },
}

impl Mutation {
    fn key(&self) -> &[u8] {
        match self {
            Mutation::Put { key, .. }
            | Mutation::Insert { key, .. }
            | Mutation::Delete { key }
            | Mutation::RequirePresent { key } => key,
        }
    }

    fn value_len(&self) -> usize {
        match self {
            Mutation::Put { value, .. } | Mutation::Insert { value, .. } => value.len(),
            Mutation::Delete { .. } | Mutation::RequirePresent { .. } => 0,
        }
    }
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
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> &mut Self {
        self.push(Mutation::Put { key, value })
    }

    /// Adds a [`Mutation::Insert`].
    pub fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> &mut Self {
        self.push(Mutation::Insert { key, value })
    }

    /// Adds a [`Mutation::Delete`].
    pub fn delete(&mut self, key: Vec<u8>) -> &mut Self {
        self.push(Mutation::Delete { key })
    }

    /// Adds a [`Mutation::RequirePresent`].
    pub fn require_present(&mut self, key: Vec<u8>) -> &mut Self {
        self.push(Mutation::RequirePresent { key })
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

    /// Checks the limits and reduces the mutations to one [`PreparedWrite`] per key, in key
    /// order, with the same effect as applying them one after another.
    pub(crate) fn prepare(self, limits: &StoreLimits) -> Result<Vec<PreparedWrite>, KvError> {
        let ops = self.mutations.len();
        let bytes: usize = self
            .mutations
            .iter()
            .map(|m| m.key().len() + m.value_len())
            .sum();
        if ops > limits.max_write_set_ops || bytes > limits.max_write_set_bytes {
            return Err(KvError::WriteSetTooLarge {
                ops,
                bytes,
                max_ops: limits.max_write_set_ops,
                max_bytes: limits.max_write_set_bytes,
            });
        }
        let mut by_key: BTreeMap<Vec<u8>, PreparedWrite> = BTreeMap::new();
        for mutation in self.mutations {
            check_sizes(&mutation, limits)?;
            let (key, step) = match mutation {
                Mutation::Put { key, value } => (key, Step::Put(value)),
                Mutation::Insert { key, value } => (key, Step::Insert(value)),
                Mutation::Delete { key } => (key, Step::Delete),
                Mutation::RequirePresent { key } => (key, Step::RequirePresent),
            };
            match by_key.entry(key) {
                Entry::Vacant(slot) => {
                    let key = slot.key().clone();
                    slot.insert(PreparedWrite::first(key, step));
                }
                Entry::Occupied(mut slot) => slot.get_mut().then(step)?,
            }
        }
        Ok(by_key.into_values().collect())
    }
}

fn check_sizes(mutation: &Mutation, limits: &StoreLimits) -> Result<(), KvError> {
    let key = mutation.key();
    if key.len() > limits.max_key_bytes {
        return Err(KvError::KeyTooLarge {
            len: key.len(),
            max: limits.max_key_bytes,
        });
    }
    if mutation.value_len() > limits.max_value_bytes {
        return Err(KvError::ValueTooLarge {
            key: key.to_vec(),
            len: mutation.value_len(),
            max: limits.max_value_bytes,
        });
    }
    Ok(())
}

enum Step {
    Put(Vec<u8>),
    Insert(Vec<u8>),
    Delete,
    RequirePresent,
}

/// What the key must be in the store before the commit for it to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Anything.
    None,
    /// Absent (an insert-if-absent).
    Absent,
    /// Present.
    Present,
}

/// The net effect of a write set on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedWrite {
    /// The key.
    pub key: Vec<u8>,
    /// What the key must be before the commit.
    pub requirement: Requirement,
    /// The key's value after the commit: `Some(Some(v))` written, `Some(None)` deleted, `None`
    /// untouched (a requirement only).
    pub write: Option<Option<Vec<u8>>>,
}

impl PreparedWrite {
    fn first(key: Vec<u8>, step: Step) -> Self {
        let (requirement, write) = match step {
            Step::Put(value) => (Requirement::None, Some(Some(value))),
            Step::Insert(value) => (Requirement::Absent, Some(Some(value))),
            Step::Delete => (Requirement::None, Some(None)),
            Step::RequirePresent => (Requirement::Present, None),
        };
        Self {
            key,
            requirement,
            write,
        }
    }

    /// Folds a later mutation of the same key into this one. The state the key is in at this
    /// point of the set is known when an earlier mutation wrote it; otherwise it is the store's.
    fn then(&mut self, step: Step) -> Result<(), KvError> {
        let contradiction = |reason| KvError::ContradictoryWriteSet {
            key: self.key.clone(),
            reason,
        };
        let present_here = match &self.write {
            Some(value) => Some(value.is_some()),
            None => (self.requirement == Requirement::Present).then_some(true),
        };
        match step {
            Step::Put(value) => self.write = Some(Some(value)),
            Step::Delete => self.write = Some(None),
            Step::Insert(value) => match present_here {
                Some(true) => return Err(contradiction("inserted after it was written")),
                Some(false) => self.write = Some(Some(value)),
                None => {
                    self.requirement = Requirement::Absent;
                    self.write = Some(Some(value));
                }
            },
            Step::RequirePresent => match present_here {
                Some(true) => {}
                Some(false) => return Err(contradiction("required after it was deleted")),
                None => self.requirement = Requirement::Present,
            },
        }
        Ok(())
    }
}
