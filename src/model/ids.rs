//! Id newtypes, so a table id cannot be passed where a mapping id is expected.
//!
//! DuckLake's ids are `BIGINT`; every id here is an `i64` and the whole `i64` range is valid
//! (the keyspace orders negative ids before non-negative ones).

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<i64> for $name {
            fn from(id: i64) -> Self {
                Self(id)
            }
        }
    };
}

id_type!(
    /// `table_id`: DuckLake's table id (`ducklake_table.table_id`).
    TableId
);
id_type!(
    /// `mapping_id`: drawn from the snapshot's `next_file_id` counter.
    MappingId
);
id_type!(
    /// `data_file_id`: drawn from the snapshot's `next_file_id` counter.
    DataFileId
);
id_type!(
    /// `column_id` of a name-mapping row: a 0-based ordinal local to its mapping.
    ColumnId
);
id_type!(
    /// `target_field_id`: the table's field id (`ducklake_column.column_id`).
    FieldId
);
