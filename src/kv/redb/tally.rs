//! Volume tallies: the key and value bytes the file holds under each unit of one range, kept
//! in the same redb transactions as the data, so that a range made of whole units divides by
//! reading a tally per unit instead of walking every pair.
//!
//! A unit is a key's first [`Tally::unit`] bytes (a shorter key is its own unit): with the
//! catalog's keys, one DuckLake table of one row kind. What the file tallies is recorded in
//! the file itself; a store opened with another rule (or one written before tallies
//! existed) is tallied afresh, by one walk, when it is opened.

use std::collections::BTreeMap;

use redb::{ReadableTable, Table, TableDefinition};

use super::rule::{record_rule, recorded_rule};
use crate::kv::divide::Divider;
use crate::kv::{Divided, Division, KeyRange};

/// Per unit, its key and value bytes; a unit without pairs has no entry.
pub(super) const TALLIES: TableDefinition<&[u8], u64> = TableDefinition::new("moraine_tallies");
/// The rule the tallies follow: keys `start`, `end` (the tallied range) and `unit` (its
/// length, 8 bytes little-endian). Absent when nothing is tallied.
pub(super) const RULE: TableDefinition<&str, &[u8]> = TableDefinition::new("moraine_tally_rule");

/// What a store tallies: the pairs of `range`, by unit of `unit` key bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    /// The range whose pairs are tallied.
    pub range: KeyRange,
    /// Length of a unit's key: the pairs whose keys share their first `unit` bytes.
    pub unit: usize,
}

impl Tally {
    /// The unit of `key`, when `key` lies in the tallied range.
    fn unit_of<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        self.range
            .contains(key)
            .then(|| key.get(..self.unit).unwrap_or(key))
    }

    /// Whether the tallies answer for `range`: it lies in the tallied range, and every unit
    /// is wholly inside or wholly outside it. A bound no longer than a unit's key cannot
    /// fall between two keys of one unit.
    pub(super) fn covers(&self, range: &KeyRange) -> bool {
        range.start.len() <= self.unit
            && range.end.len() <= self.unit
            && self.range.start <= range.start
            && range.end <= self.range.end
    }

    /// The rule `file` records, if any.
    pub(super) fn recorded(
        file: &impl ReadableTable<&'static str, &'static [u8]>,
    ) -> Result<Option<Self>, redb::Error> {
        Ok(recorded_rule(file, "unit")?.map(|(range, unit)| Self { range, unit }))
    }

    /// Records `rule` in `file` (or that nothing is tallied), empties `tallies` and tallies
    /// `data` afresh under the new rule.
    pub(super) fn retally(
        rule: Option<&Self>,
        file: &mut Table<&'static str, &'static [u8]>,
        tallies: &mut Table<&'static [u8], u64>,
        data: &impl ReadableTable<&'static [u8], &'static [u8]>,
    ) -> Result<(), redb::Error> {
        tallies.retain(|_, _| false)?;
        record_rule(file, rule.map(|rule| (&rule.range, rule.unit)), "unit")?;
        let Some(rule) = rule else {
            return Ok(());
        };
        let mut changes = Changes::new(Some(rule.clone()));
        for item in data.range::<&[u8]>(rule.range.start.as_slice()..rule.range.end.as_slice())? {
            let (key, value) = item?;
            changes.record(key.value(), None, Some(value.value().len()));
        }
        changes.apply(tallies)
    }
}

/// The changes a run of writes makes to the tallies, gathered while the writes are applied
/// and then applied in one pass over the units touched.
#[derive(Debug)]
pub(super) struct Changes {
    rule: Option<Tally>,
    /// The unit of the last write recorded and its change so far: writes come in runs of one
    /// unit, so most add to it.
    current: Option<(Vec<u8>, i64)>,
    done: BTreeMap<Vec<u8>, i64>,
}

impl Changes {
    /// Changes under `rule`; none at all when nothing is tallied.
    pub(super) fn new(rule: Option<Tally>) -> Self {
        Self {
            rule,
            current: None,
            done: BTreeMap::new(),
        }
    }

    /// Whether a rule is kept.
    pub(super) fn kept(&self) -> bool {
        self.rule.is_some()
    }

    /// A write of `key`, whose value was `before` bytes long (or absent) and is now `after`
    /// bytes long (or absent).
    pub(super) fn record(&mut self, key: &[u8], before: Option<usize>, after: Option<usize>) {
        let Some(unit) = self.rule.as_ref().and_then(|rule| rule.unit_of(key)) else {
            return;
        };
        let bytes = |value: Option<usize>| {
            value.map_or(0, |len| i64::try_from(key.len() + len).unwrap_or(i64::MAX))
        };
        let change = bytes(after).saturating_sub(bytes(before));
        match &mut self.current {
            Some((current, sum)) if current.as_slice() == unit => {
                *sum = sum.saturating_add(change);
            }
            current => {
                if let Some((unit, sum)) = current.replace((unit.to_vec(), change)) {
                    let entry = self.done.entry(unit).or_default();
                    *entry = entry.saturating_add(sum);
                }
            }
        }
    }

    /// Applies the changes to `tallies`; a unit left without bytes loses its entry.
    pub(super) fn apply(
        mut self,
        tallies: &mut Table<&'static [u8], u64>,
    ) -> Result<(), redb::Error> {
        if let Some((unit, sum)) = self.current.take() {
            let entry = self.done.entry(unit).or_default();
            *entry = entry.saturating_add(sum);
        }
        for (unit, change) in self.done {
            if change == 0 {
                continue;
            }
            let was = tallies
                .get(unit.as_slice())?
                .map_or(0, |bytes| bytes.value());
            let now = was.saturating_add_signed(change);
            if now == 0 {
                tallies.remove(unit.as_slice())?;
            } else {
                tallies.insert(unit.as_slice(), now)?;
            }
        }
        Ok(())
    }
}

/// Divides `range`, which the tallies cover ([`Tally::covers`]), from the tallies of its
/// units: cuts fall at units' first keys.
pub(super) fn divide(
    tallies: &impl ReadableTable<&'static [u8], u64>,
    range: &KeyRange,
    division: Division,
) -> Result<Divided, redb::Error> {
    let mut divider = Divider::new(division);
    for item in tallies.range::<&[u8]>(range.start.as_slice()..range.end.as_slice())? {
        let (unit, bytes) = item?;
        divider.add(
            unit.value(),
            usize::try_from(bytes.value()).unwrap_or(usize::MAX),
        );
    }
    Ok(divider.finish())
}
