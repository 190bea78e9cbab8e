//! Twin marks: the key prefixes of one range under which the file holds, or has held, more
//! than one key, kept in the same redb transactions as the data, so that a read asking
//! which keys of a range may share their prefix with another reads the marks instead of
//! looking at every key's neighbours.
//!
//! With the catalog's keys, the range is the mapping id index and the prefix a key's
//! `mapping_id`: a mark says that two tables hold mappings of that id, which DuckLake never
//! writes but the store allows (the spec keys mappings by `table_id, mapping_id`), and
//! which a table-scoped mapping load must then join. Without marks, that load looks the id
//! index up for every mapping it reads.
//!
//! A new key is marked when a stored neighbour shares its prefix. The writer applies
//! commits one after another, so of two transactions that add one prefix concurrently, the
//! second applied sees the first's key. Deleting a key leaves its mark: a mark may be stale
//! (the prefix holds one key again), never missing. What the file marks is recorded in the
//! file; a store opened with another rule (or one written before marks existed) is marked
//! afresh, by one walk, when it is opened.

use std::collections::BTreeSet;

use redb::{ReadableTable, Table, TableDefinition};

use super::rule::{record_rule, recorded_rule};
use crate::key_range::prefix_end;
use crate::kv::KeyRange;

/// The marked prefixes; the values are empty.
pub(super) const TWINS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("moraine_twins");
/// The rule the marks follow: keys `start`, `end` (the range) and `prefix` (its length,
/// 8 bytes little-endian). Absent when nothing is marked.
pub(super) const RULE: TableDefinition<&str, &[u8]> = TableDefinition::new("moraine_twin_rule");

/// What a store marks: the prefixes of `prefix` bytes under which `range` holds more than
/// one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twins {
    /// The range whose keys are marked.
    pub range: KeyRange,
    /// Length of the prefix two keys must share to be twins.
    pub prefix: usize,
}

impl Twins {
    /// The prefix of `key`, when `key` lies in the range and is long enough to have one.
    fn prefix_of<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        if self.range.contains(key) {
            key.get(..self.prefix)
        } else {
            None
        }
    }

    /// Whether the marks answer for `range`: it lies in the marked range.
    pub(super) fn covers(&self, range: &KeyRange) -> bool {
        self.range.start <= range.start && range.end <= self.range.end
    }

    /// The rule `file` records, if any.
    pub(super) fn recorded(
        file: &impl ReadableTable<&'static str, &'static [u8]>,
    ) -> Result<Option<Self>, redb::Error> {
        Ok(recorded_rule(file, "prefix")?.map(|(range, prefix)| Self { range, prefix }))
    }

    /// Records `rule` in `file` (or that nothing is marked), empties `twins` and marks
    /// `data` afresh under the new rule: one walk of the range, comparing each key's prefix
    /// with the one before.
    pub(super) fn remark(
        rule: Option<&Self>,
        file: &mut Table<&'static str, &'static [u8]>,
        twins: &mut Table<&'static [u8], &'static [u8]>,
        data: &impl ReadableTable<&'static [u8], &'static [u8]>,
    ) -> Result<(), redb::Error> {
        twins.retain(|_, _| false)?;
        record_rule(file, rule.map(|rule| (&rule.range, rule.prefix)), "prefix")?;
        let Some(rule) = rule else {
            return Ok(());
        };
        let mut marks = Marks::new(Some(rule.clone()));
        // The key before, in one buffer for the whole walk.
        let mut before: Option<Vec<u8>> = None;
        for item in data.range::<&[u8]>(rule.range.start.as_slice()..rule.range.end.as_slice())? {
            let (key, _) = item?;
            let key = key.value();
            marks.new_key(key, before.as_deref(), None);
            let buffer = before.get_or_insert_with(Vec::new);
            buffer.clear();
            buffer.extend_from_slice(key);
        }
        marks.apply(twins)
    }
}

/// The marks a run of writes adds, gathered while the writes are applied and then written
/// in one pass.
#[derive(Debug)]
pub(super) struct Marks {
    rule: Option<Twins>,
    found: BTreeSet<Vec<u8>>,
}

impl Marks {
    /// Marks under `rule`; none at all when nothing is marked.
    pub(super) fn new(rule: Option<Twins>) -> Self {
        Self {
            rule,
            found: BTreeSet::new(),
        }
    }

    /// Whether a rule is kept.
    pub(super) fn kept(&self) -> bool {
        self.rule.is_some()
    }

    /// Whether `key` lies where marks are kept.
    pub(super) fn watches(&self, key: &[u8]) -> bool {
        self.rule
            .as_ref()
            .is_some_and(|rule| rule.prefix_of(key).is_some())
    }

    /// A new key `key`, stored between `before` and `after` (its neighbours, where known):
    /// marked when either shares its prefix.
    pub(super) fn new_key(&mut self, key: &[u8], before: Option<&[u8]>, after: Option<&[u8]>) {
        let Some(prefix) = self.rule.as_ref().and_then(|rule| rule.prefix_of(key)) else {
            return;
        };
        let shares = |other: Option<&[u8]>| other.is_some_and(|other| other.starts_with(prefix));
        if (shares(before) || shares(after)) && !self.found.contains(prefix) {
            self.found.insert(prefix.to_vec());
        }
    }

    /// A new key `key` written on its own: marked when `data` (which holds it now) holds
    /// another key with its prefix. One short range read.
    pub(super) fn new_key_in(
        &mut self,
        data: &impl ReadableTable<&'static [u8], &'static [u8]>,
        key: &[u8],
    ) -> Result<(), redb::StorageError> {
        let Some(prefix) = self.rule.as_ref().and_then(|rule| rule.prefix_of(key)) else {
            return Ok(());
        };
        if self.found.contains(prefix) {
            return Ok(());
        }
        let end = prefix_end(prefix);
        let mut keys = match &end {
            Some(end) => data.range::<&[u8]>(prefix..end.as_slice())?,
            None => data.range::<&[u8]>(prefix..)?,
        };
        if keys.next().transpose()?.is_some() && keys.next().transpose()?.is_some() {
            self.found.insert(prefix.to_vec());
        }
        Ok(())
    }

    /// Writes the marks found to `twins`.
    pub(super) fn apply(
        self,
        twins: &mut Table<&'static [u8], &'static [u8]>,
    ) -> Result<(), redb::Error> {
        for prefix in self.found {
            twins.insert(prefix.as_slice(), [].as_slice())?;
        }
        Ok(())
    }
}

/// The marks of `range` (which the rule covers): every prefix marked at or after the prefix
/// `range` starts in, and before its end.
pub(super) fn marked(
    twins: &impl ReadableTable<&'static [u8], &'static [u8]>,
    rule: &Twins,
    range: &KeyRange,
) -> Result<Vec<Vec<u8>>, redb::Error> {
    let start = range.start.get(..rule.prefix).unwrap_or(&range.start);
    let mut out = Vec::new();
    for item in twins.range::<&[u8]>(start..range.end.as_slice())? {
        out.push(item?.0.value().to_vec());
    }
    Ok(out)
}
