//! The rules the derived tables (volume tallies, twin marks) follow, as the file records
//! them: each a range and a length, and the last commit group applied under it.

use redb::{ReadableTable, Table};

use crate::kv::KeyRange;

/// A rule of a range and a length, as `file` records it: keys `start`, `end` and `length`
/// (8 bytes little-endian); `None` when any is missing.
pub(super) fn recorded_rule(
    file: &impl ReadableTable<&'static str, &'static [u8]>,
    length: &str,
) -> Result<Option<(KeyRange, usize)>, redb::Error> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, redb::Error> {
        Ok(file.get(name)?.map(|value| value.value().to_vec()))
    };
    let (Some(start), Some(end), Some(len)) = (read("start")?, read("end")?, read(length)?) else {
        return Ok(None);
    };
    let len = <[u8; 8]>::try_from(len.as_slice())
        .ok()
        .and_then(|len| usize::try_from(u64::from_le_bytes(len)).ok());
    Ok(len.map(|len| (KeyRange::new(start, end), len)))
}

/// Records a rule of a range and a length in `file` under the keys [`recorded_rule`] reads,
/// or removes them (and the sequence number it was kept through) for `None`.
pub(super) fn record_rule(
    file: &mut Table<&'static str, &'static [u8]>,
    rule: Option<(&KeyRange, usize)>,
    length: &str,
) -> Result<(), redb::Error> {
    let Some((range, len)) = rule else {
        for name in ["start", "end", length, THROUGH] {
            file.remove(name)?;
        }
        return Ok(());
    };
    file.insert("start", range.start.as_slice())?;
    file.insert("end", range.end.as_slice())?;
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    file.insert(length, len.to_le_bytes().as_slice())?;
    Ok(())
}

/// Key of a rule's file under which it records the sequence number of the last commit group
/// applied under it: what a build that keeps the rule writes with every apply, and what a
/// build that does not (an older one) leaves behind, so that an open can tell whether every
/// commit the file holds was applied under the rule.
const THROUGH: &str = "through";

/// The sequence number `file`'s rule was kept through, if recorded.
pub(super) fn kept_through(
    file: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Option<u64>, redb::Error> {
    Ok(file
        .get(THROUGH)?
        .and_then(|value| <[u8; 8]>::try_from(value.value()).ok())
        .map(u64::from_le_bytes))
}

/// Records that `file`'s rule was kept through commit group `seq`.
pub(super) fn keep_through(
    file: &mut Table<&'static str, &'static [u8]>,
    seq: u64,
) -> Result<(), redb::Error> {
    file.insert(THROUGH, seq.to_le_bytes().as_slice())?;
    Ok(())
}
