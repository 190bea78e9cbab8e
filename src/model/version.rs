//! The DuckLake catalog versions moraine serves, and the shape of `ducklake_data_file` in each.
//!
//! moraine stores every data file with the columns of every version it knows
//! ([`DataFileRow`]: DuckLake 0.3's sixteen, then `partial_max` and `row_group_count`) and
//! serves, and accepts, the columns of the one version its deployment records, in that
//! version's order: DuckLake appends `ducklake_data_file` rows by position. The other two
//! tables are the same in every version.
//!
//! | version | `ducklake_data_file` ends with                                   |
//! |---------|-------------------------------------------------------------------|
//! | 0.3     | `…, encryption_key, partial_file_info, mapping_id`                |
//! | 1.0     | `…, encryption_key, mapping_id, partial_max` (0.4 is the same)    |
//! | 1.1     | `…, encryption_key, mapping_id, partial_max, row_group_count`     |
//!
//! (From DuckLake's metadata manager: its `CREATE TABLE` for each version and its migrations
//! `MigrateV03` and `MigrateV10`, which drop `partial_file_info` and append the new columns.)

use std::fmt;
use std::sync::LazyLock;

use super::{CatalogTable, Column, DataFileRow};

/// A DuckLake catalog version, as `ducklake_metadata`'s `version` key spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum DuckLakeVersion {
    /// 0.3, what DuckDB 1.4 writes.
    #[default]
    V0_3,
    /// 1.0 (and 0.4, its pre-release with the same tables), what DuckDB 1.5 writes.
    V1_0,
    /// 1.1 (`1.1-dev1` on DuckLake's main branch).
    V1_1,
}

/// Columns of [`DataFileRow`] that only some versions have.
const PARTIAL_FILE_INFO: &str = "partial_file_info";
const PARTIAL_MAX: &str = "partial_max";
const ROW_GROUP_COUNT: &str = "row_group_count";

impl DuckLakeVersion {
    /// Every version, oldest first.
    pub const ALL: [DuckLakeVersion; 3] = [
        DuckLakeVersion::V0_3,
        DuckLakeVersion::V1_0,
        DuckLakeVersion::V1_1,
    ];

    /// The version's name: `0.3`, `1.0` or `1.1`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DuckLakeVersion::V0_3 => "0.3",
            DuckLakeVersion::V1_0 => "1.0",
            DuckLakeVersion::V1_1 => "1.1",
        }
    }

    /// The version `name` spells: a name of [`name`](Self::name), or how DuckLake's catalogs
    /// record it (`0.4` for 1.0, `1.1-dev1` for 1.1).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim() {
            "0.3" => Some(DuckLakeVersion::V0_3),
            "0.4" | "1.0" => Some(DuckLakeVersion::V1_0),
            "1.1" | "1.1-dev1" => Some(DuckLakeVersion::V1_1),
            _ => None,
        }
    }

    /// Whether the version's `ducklake_data_file` has column `name` (one of
    /// [`DataFileRow::COLUMNS`]).
    #[must_use]
    pub fn has_data_file_column(self, name: &str) -> bool {
        match name {
            PARTIAL_FILE_INFO => self == DuckLakeVersion::V0_3,
            PARTIAL_MAX => self >= DuckLakeVersion::V1_0,
            ROW_GROUP_COUNT => self >= DuckLakeVersion::V1_1,
            _ => true,
        }
    }

    /// The first version whose `ducklake_data_file` has column `name`, other than this one.
    #[must_use]
    pub fn other_with_data_file_column(self, name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|v| *v != self && v.has_data_file_column(name))
    }

    /// The positions in [`DataFileRow::COLUMNS`] of this version's `ducklake_data_file`
    /// columns, in the version's order.
    #[must_use]
    pub fn data_file_positions(self) -> &'static [usize] {
        static POSITIONS: LazyLock<[Vec<usize>; 3]> =
            LazyLock::new(|| DuckLakeVersion::ALL.map(DuckLakeVersion::order_data_file));
        POSITIONS.get(self as usize).map_or(&[][..], Vec::as_slice)
    }

    /// The served columns of `table` in this version, in its order.
    #[must_use]
    pub fn columns(self, table: CatalogTable) -> &'static [Column] {
        static DATA_FILE: LazyLock<[Vec<Column>; 3]> = LazyLock::new(|| {
            DuckLakeVersion::ALL.map(|v| {
                v.data_file_positions()
                    .iter()
                    .filter_map(|i| DataFileRow::COLUMNS.get(*i).copied())
                    .collect()
            })
        });
        match table {
            CatalogTable::DataFile => DATA_FILE.get(self as usize).map_or(&[][..], Vec::as_slice),
            _ => table.columns(),
        }
    }

    /// The positions in `table.columns()` of the served columns, when they are not all of
    /// them in order (only `ducklake_data_file`'s differ).
    #[must_use]
    pub fn positions(self, table: CatalogTable) -> Option<&'static [usize]> {
        (table == CatalogTable::DataFile).then(|| self.data_file_positions())
    }

    /// The version whose `ducklake_data_file` has exactly the columns `names`, in order.
    #[must_use]
    pub fn of_data_file_columns(names: &[&str]) -> Option<Self> {
        Self::ALL.into_iter().find(|v| {
            names
                .iter()
                .copied()
                .eq(v.columns(CatalogTable::DataFile).iter().map(|c| c.name))
        })
    }

    /// Values of `table`'s served columns in this version (`served`, in the version's order)
    /// as values of its stored columns, `absent` for the columns the version lacks.
    #[must_use]
    pub fn to_stored<T: Clone>(self, table: CatalogTable, served: Vec<T>, absent: &T) -> Vec<T> {
        let Some(positions) = self.positions(table) else {
            return served;
        };
        let mut stored = vec![absent.clone(); table.columns().len()];
        for (value, at) in served.into_iter().zip(positions) {
            if let Some(slot) = stored.get_mut(*at) {
                *slot = value;
            }
        }
        stored
    }

    /// The version's order: 0.3's columns as stored; from 1.0 on, `mapping_id` before the
    /// columns the later versions appended.
    fn order_data_file(self) -> Vec<usize> {
        let position = |name: &str| DataFileRow::COLUMNS.iter().position(|c| c.name == name);
        let mapping_id = position("mapping_id");
        let appended: Vec<usize> = [PARTIAL_MAX, ROW_GROUP_COUNT]
            .into_iter()
            .filter_map(position)
            .collect();
        let mut order: Vec<usize> = (0..DataFileRow::COLUMNS.len())
            .filter(|i| Some(*i) != mapping_id && !appended.contains(i))
            .collect();
        order.extend(mapping_id);
        order.extend(appended);
        order.retain(|i| {
            DataFileRow::COLUMNS
                .get(*i)
                .is_some_and(|c| self.has_data_file_column(c.name))
        });
        order
    }
}

impl fmt::Display for DuckLakeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(version: DuckLakeVersion) -> Vec<&'static str> {
        version
            .columns(CatalogTable::DataFile)
            .iter()
            .map(|c| c.name)
            .collect()
    }

    /// DuckLake's `CREATE TABLE ducklake_data_file` of each version, column names only (from
    /// its metadata manager on the v1.4, v1.5 and main branches).
    #[test]
    fn each_version_serves_ducklakes_data_file_columns_in_order() {
        let common = [
            "data_file_id",
            "table_id",
            "begin_snapshot",
            "end_snapshot",
            "file_order",
            "path",
            "path_is_relative",
            "file_format",
            "record_count",
            "file_size_bytes",
            "footer_size",
            "row_id_start",
            "partition_id",
            "encryption_key",
        ];
        let with = |tail: &[&'static str]| [&common[..], tail].concat();
        assert_eq!(
            names(DuckLakeVersion::V0_3),
            with(&["partial_file_info", "mapping_id"])
        );
        assert_eq!(
            names(DuckLakeVersion::V1_0),
            with(&["mapping_id", "partial_max"])
        );
        assert_eq!(
            names(DuckLakeVersion::V1_1),
            with(&["mapping_id", "partial_max", "row_group_count"])
        );
        for version in DuckLakeVersion::ALL {
            assert_eq!(
                version.columns(CatalogTable::NameMapping),
                CatalogTable::NameMapping.columns()
            );
            assert!(version.positions(CatalogTable::ColumnMapping).is_none());
        }
    }

    #[test]
    fn values_in_a_versions_order_land_in_their_stored_columns() {
        let served: Vec<&str> = names(DuckLakeVersion::V1_1);
        let stored = DuckLakeVersion::V1_1.to_stored(CatalogTable::DataFile, served, &"-");
        let expected: Vec<&str> = DataFileRow::COLUMNS
            .iter()
            .map(|c| {
                if c.name == "partial_file_info" {
                    "-"
                } else {
                    c.name
                }
            })
            .collect();
        assert_eq!(stored, expected);
        for version in DuckLakeVersion::ALL {
            assert_eq!(
                DuckLakeVersion::of_data_file_columns(&names(version)),
                Some(version)
            );
        }
        let mut reordered = names(DuckLakeVersion::V1_0);
        reordered.swap(14, 15);
        assert_eq!(DuckLakeVersion::of_data_file_columns(&reordered), None);
    }

    #[test]
    fn versions_parse_as_ducklake_records_them() {
        for (name, version) in [
            ("0.3", DuckLakeVersion::V0_3),
            ("0.4", DuckLakeVersion::V1_0),
            ("1.0", DuckLakeVersion::V1_0),
            ("1.1-dev1", DuckLakeVersion::V1_1),
            (" 1.1 ", DuckLakeVersion::V1_1),
        ] {
            assert_eq!(DuckLakeVersion::parse(name), Some(version), "{name}");
            assert_eq!(DuckLakeVersion::parse(version.name()), Some(version));
        }
        assert_eq!(DuckLakeVersion::parse("0.2"), None);
        assert_eq!(DuckLakeVersion::parse("2.0"), None);
        assert_eq!(
            DuckLakeVersion::V0_3.other_with_data_file_column("partial_max"),
            Some(DuckLakeVersion::V1_0)
        );
        assert_eq!(
            DuckLakeVersion::V1_1.other_with_data_file_column("partial_file_info"),
            Some(DuckLakeVersion::V0_3)
        );
    }
}
