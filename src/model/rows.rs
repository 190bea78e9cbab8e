//! DuckLake's catalog tables, each defined once: its columns (name, SQL type, nullability) in
//! DuckLake's order, and a row type whose fields are those columns.
//!
//! Everything that handles a table's columns is derived from these definitions: the Arrow
//! schemas, the batch builders and the ingest decoder (`query`, `write`), the JSON import, the
//! data-file record codec (its field numbers are the column positions), and the row types
//! below. `columns::tests` pins each definition against DuckLake's DDL.

use std::fmt;
use std::sync::LazyLock;

/// One of the catalog tables moraine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CatalogTable {
    /// `ducklake_column_mapping`.
    ColumnMapping,
    /// `ducklake_name_mapping`.
    NameMapping,
    /// `ducklake_data_file`.
    DataFile,
}

impl CatalogTable {
    /// Every served table.
    pub const ALL: [CatalogTable; 3] = [
        CatalogTable::ColumnMapping,
        CatalogTable::NameMapping,
        CatalogTable::DataFile,
    ];

    /// DuckLake's name of the table.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CatalogTable::ColumnMapping => "ducklake_column_mapping",
            CatalogTable::NameMapping => "ducklake_name_mapping",
            CatalogTable::DataFile => "ducklake_data_file",
        }
    }

    /// The table named `name` (DuckLake's spelling, case-insensitive).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|table| table.name().eq_ignore_ascii_case(name))
    }

    /// The table's columns, in DuckLake's order.
    #[must_use]
    pub fn columns(self) -> &'static [Column] {
        match self {
            CatalogTable::ColumnMapping => ColumnMappingRow::COLUMNS,
            CatalogTable::NameMapping => NameMappingRow::COLUMNS,
            CatalogTable::DataFile => DataFileRow::COLUMNS,
        }
    }
}

impl fmt::Display for CatalogTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A column's SQL type, as DuckLake declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlType {
    /// `BIGINT`.
    BigInt,
    /// `VARCHAR`.
    Varchar,
    /// `BOOLEAN`.
    Boolean,
}

impl fmt::Display for SqlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SqlType::BigInt => "BIGINT",
            SqlType::Varchar => "VARCHAR",
            SqlType::Boolean => "BOOLEAN",
        })
    }
}

/// One column of a served table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Column {
    /// DuckLake's name.
    pub name: &'static str,
    /// Its type.
    pub ty: SqlType,
    /// Whether it may be NULL (DuckLake's catalogs declare every column nullable but the
    /// data-file primary key).
    pub nullable: bool,
}

/// One value of a row, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell<'a> {
    /// SQL NULL.
    Null,
    /// A `BIGINT`.
    BigInt(i64),
    /// A `VARCHAR`.
    Varchar(&'a str),
    /// A `BOOLEAN`.
    Boolean(bool),
}

/// A Rust type that holds one column's values.
pub trait CellValue: Sized {
    /// The column type it holds.
    const TYPE: SqlType;
    /// `value` as a cell.
    fn to_cell(value: Option<&Self>) -> Cell<'_>;
    /// A cell as a value: `Some(None)` for NULL, `None` for a cell of another type.
    fn from_cell(cell: Cell<'_>) -> Option<Option<Self>>;
}

impl CellValue for i64 {
    const TYPE: SqlType = SqlType::BigInt;
    fn to_cell(value: Option<&Self>) -> Cell<'_> {
        value.map_or(Cell::Null, |v| Cell::BigInt(*v))
    }
    fn from_cell(cell: Cell<'_>) -> Option<Option<Self>> {
        match cell {
            Cell::Null => Some(None),
            Cell::BigInt(v) => Some(Some(v)),
            _ => None,
        }
    }
}

impl CellValue for String {
    const TYPE: SqlType = SqlType::Varchar;
    fn to_cell(value: Option<&Self>) -> Cell<'_> {
        value.map_or(Cell::Null, |v| Cell::Varchar(v))
    }
    fn from_cell(cell: Cell<'_>) -> Option<Option<Self>> {
        match cell {
            Cell::Null => Some(None),
            Cell::Varchar(v) => Some(Some(v.to_owned())),
            _ => None,
        }
    }
}

impl CellValue for bool {
    const TYPE: SqlType = SqlType::Boolean;
    fn to_cell(value: Option<&Self>) -> Cell<'_> {
        value.map_or(Cell::Null, |v| Cell::Boolean(*v))
    }
    fn from_cell(cell: Cell<'_>) -> Option<Option<Self>> {
        match cell {
            Cell::Null => Some(None),
            Cell::Boolean(v) => Some(Some(v)),
            _ => None,
        }
    }
}

/// The name of a column: the field's, unless given.
macro_rules! column_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident $name:literal) => {
        $name
    };
}

/// A catalog table's row type and its column list, from one list of columns.
macro_rules! catalog_row {
    (
        $(#[$doc:meta])*
        $row:ident {
            $($(#[$field_doc:meta])* $field:ident $(as $name:literal)? : $ty:ty $(, not $null:ident)?;)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct $row {
            $($(#[$field_doc])* pub $field: Option<$ty>,)*
        }

        impl $row {
            /// The table's columns, in DuckLake's order.
            pub const COLUMNS: &'static [Column] = &[$(Column {
                name: column_name!($field $($name)?),
                ty: <$ty as CellValue>::TYPE,
                nullable: catalog_row!(@nullable $($null)?),
            }),*];

            /// The row's values, in column order.
            #[must_use]
            pub fn cells(&self) -> Vec<Cell<'_>> {
                vec![$(<$ty as CellValue>::to_cell(self.$field.as_ref())),*]
            }

            /// The row of `cells`, in column order; `None` when a cell has another type than
            /// its column, or there are too few.
            #[must_use]
            pub fn from_cells<'a>(cells: impl IntoIterator<Item = Cell<'a>>) -> Option<Self> {
                let mut cells = cells.into_iter();
                Some(Self {
                    $($field: <$ty as CellValue>::from_cell(cells.next()?)?,)*
                })
            }
        }
    };
    (@nullable) => { true };
    (@nullable $null:ident) => { false };
}

catalog_row! {
    /// A `ducklake_column_mapping` row.
    ColumnMappingRow {
        /// `mapping_id`.
        mapping_id: i64;
        /// `table_id`.
        table_id: i64;
        /// `type` (DuckLake writes `'map_by_name'`).
        map_type as "type": String;
    }
}

catalog_row! {
    /// A `ducklake_name_mapping` row.
    NameMappingRow {
        /// `mapping_id`.
        mapping_id: i64;
        /// `column_id`: ordinal of the column in its mapping's pre-order walk.
        column_id: i64;
        /// `source_name`: the column's name as the file spells it.
        source_name: String;
        /// `target_field_id`: the table field the column resolves to.
        target_field_id: i64;
        /// `parent_column`: NULL for a root column, else the parent's `column_id`.
        parent_column: i64;
        /// `is_partition`: the value comes from the file's hive path, not its body.
        is_partition: bool;
    }
}

catalog_row! {
    /// A `ducklake_data_file` row as moraine stores it: DuckLake 0.3's sixteen columns, then
    /// the two later versions added (`partial_max` from 1.0 on, `row_group_count` from 1.1).
    /// Each deployment serves its DuckLake version's columns of it, in that version's order
    /// ([`DuckLakeVersion`](super::DuckLakeVersion)).
    DataFileRow {
        /// `data_file_id`, the primary key.
        data_file_id: i64, not null;
        /// `table_id`.
        table_id: i64;
        /// `begin_snapshot`.
        begin_snapshot: i64;
        /// `end_snapshot`: NULL while the file is live.
        end_snapshot: i64;
        /// `file_order`.
        file_order: i64;
        /// `path`.
        path: String;
        /// `path_is_relative`.
        path_is_relative: bool;
        /// `file_format`.
        file_format: String;
        /// `record_count`.
        record_count: i64;
        /// `file_size_bytes`.
        file_size_bytes: i64;
        /// `footer_size`.
        footer_size: i64;
        /// `row_id_start`.
        row_id_start: i64;
        /// `partition_id`.
        partition_id: i64;
        /// `encryption_key`.
        encryption_key: String;
        /// `partial_file_info`.
        partial_file_info: String;
        /// `mapping_id`: NULL for files DuckLake wrote itself.
        mapping_id: i64;
        /// `partial_max` (DuckLake 1.0 on; 0.3 kept it in `partial_file_info`'s text).
        partial_max: i64;
        /// `row_group_count` (DuckLake 1.1 on).
        row_group_count: i64;
    }
}

/// The columns of DuckLake's mapping load, the join of `ducklake_column_mapping` and
/// `ducklake_name_mapping` `USING (mapping_id)`: the mapping's columns, then the name row's
/// without its `mapping_id`.
#[must_use]
pub fn mapping_load_columns() -> &'static [Column] {
    static COLUMNS: LazyLock<Vec<Column>> = LazyLock::new(|| {
        ColumnMappingRow::COLUMNS
            .iter()
            .chain(NameMappingRow::COLUMNS.iter().skip(1))
            .copied()
            .collect()
    });
    &COLUMNS
}

/// The columns of a one-stream commit upload: the mapping load's columns, then the data
/// file's that the load does not have (`mapping_id` and `table_id` are shared). A row with a
/// `data_file_id` is a data file; any other row is a name row of the load.
#[must_use]
pub fn commit_upload_columns() -> &'static [Column] {
    static COLUMNS: LazyLock<Vec<Column>> = LazyLock::new(|| {
        let load = mapping_load_columns();
        let mut columns = load.to_vec();
        columns.extend(
            DataFileRow::COLUMNS
                .iter()
                .filter(|c| !load.iter().any(|l| l.name == c.name))
                .map(|c| Column {
                    nullable: true,
                    ..*c
                }),
        );
        columns
    });
    &COLUMNS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DuckLakeVersion;

    /// DuckLake 1.0's and 1.1's `ducklake_data_file` (from its metadata manager on the v1.5
    /// and main branches; the other two tables are 0.3's).
    const DATA_FILE_DDL: [(DuckLakeVersion, &str); 2] = [
        (
            DuckLakeVersion::V1_0,
            "CREATE TABLE ducklake_data_file(data_file_id BIGINT PRIMARY KEY, table_id BIGINT,
            begin_snapshot BIGINT, end_snapshot BIGINT, file_order BIGINT, path VARCHAR,
            path_is_relative BOOLEAN, file_format VARCHAR, record_count BIGINT,
            file_size_bytes BIGINT, footer_size BIGINT, row_id_start BIGINT, partition_id BIGINT,
            encryption_key VARCHAR, mapping_id BIGINT, partial_max BIGINT);",
        ),
        (
            DuckLakeVersion::V1_1,
            "CREATE TABLE ducklake_data_file(data_file_id BIGINT PRIMARY KEY, table_id BIGINT,
            begin_snapshot BIGINT, end_snapshot BIGINT, file_order BIGINT, path VARCHAR,
            path_is_relative BOOLEAN, file_format VARCHAR, record_count BIGINT,
            file_size_bytes BIGINT, footer_size BIGINT, row_id_start BIGINT, partition_id BIGINT,
            encryption_key VARCHAR, mapping_id BIGINT, partial_max BIGINT,
            row_group_count BIGINT);",
        ),
    ];

    /// DuckLake's DDL for the three tables (DuckLake 0.3, as its SQL catalogs create them).
    const DUCKLAKE_DDL: &str = "
        CREATE TABLE ducklake_column_mapping(mapping_id BIGINT, table_id BIGINT, type VARCHAR);
        CREATE TABLE ducklake_name_mapping(mapping_id BIGINT, column_id BIGINT, source_name VARCHAR,
            target_field_id BIGINT, parent_column BIGINT, is_partition BOOLEAN);
        CREATE TABLE ducklake_data_file(data_file_id BIGINT PRIMARY KEY, table_id BIGINT,
            begin_snapshot BIGINT, end_snapshot BIGINT, file_order BIGINT, path VARCHAR,
            path_is_relative BOOLEAN, file_format VARCHAR, record_count BIGINT,
            file_size_bytes BIGINT, footer_size BIGINT, row_id_start BIGINT, partition_id BIGINT,
            encryption_key VARCHAR, partial_file_info VARCHAR, mapping_id BIGINT);";

    /// `(column, type, primary key)`.
    type DdlColumn = (String, String, bool);

    /// `(table, columns)` of DDL `text`.
    fn ddl(text: &str) -> Vec<(String, Vec<DdlColumn>)> {
        text.split(';')
            .filter_map(|statement| {
                let statement = statement.trim().strip_prefix("CREATE TABLE ")?;
                let (table, body) = statement.split_once('(')?;
                let body = body.strip_suffix(')')?;
                let columns = body
                    .split(',')
                    .map(|column| {
                        let words: Vec<&str> = column.split_whitespace().collect();
                        (
                            words.first().copied().unwrap_or_default().to_owned(),
                            words.get(1).copied().unwrap_or_default().to_owned(),
                            column.contains("PRIMARY KEY"),
                        )
                    })
                    .collect();
                Some((table.trim().to_owned(), columns))
            })
            .collect()
    }

    #[test]
    fn each_table_is_ducklakes_ddl_column_for_column() {
        let served = |version: DuckLakeVersion, table: CatalogTable| -> Vec<DdlColumn> {
            version
                .columns(table)
                .iter()
                .map(|c| (c.name.to_owned(), c.ty.to_string(), !c.nullable))
                .collect()
        };
        let tables = ddl(DUCKLAKE_DDL);
        assert_eq!(tables.len(), 3);
        for (name, columns) in tables {
            let table = CatalogTable::from_name(&name).expect("a served table");
            assert_eq!(served(DuckLakeVersion::V0_3, table), columns, "{name}");
            if table != CatalogTable::DataFile {
                for version in DuckLakeVersion::ALL {
                    assert_eq!(served(version, table), columns, "{name} in {version}");
                }
            }
        }
        for (version, text) in DATA_FILE_DDL {
            let [(name, columns)] = <[_; 1]>::try_from(ddl(text)).expect("one table");
            assert_eq!(name, "ducklake_data_file");
            assert_eq!(
                served(version, CatalogTable::DataFile),
                columns,
                "{version}"
            );
        }
    }

    #[test]
    fn rows_convert_to_cells_and_back() {
        let row = DataFileRow {
            data_file_id: Some(7),
            path: Some("/x.parquet".into()),
            path_is_relative: Some(false),
            mapping_id: Some(3),
            ..DataFileRow::default()
        };
        let cells = row.cells();
        assert_eq!(cells.len(), DataFileRow::COLUMNS.len());
        assert_eq!(cells.get(5), Some(&Cell::Varchar("/x.parquet")));
        assert_eq!(DataFileRow::from_cells(cells), Some(row));
        assert_eq!(
            ColumnMappingRow::from_cells([Cell::BigInt(1), Cell::Boolean(true), Cell::Null]),
            None,
            "a cell of another type"
        );
    }

    #[test]
    fn derived_shapes_share_the_key_columns() {
        let load: Vec<&str> = mapping_load_columns().iter().map(|c| c.name).collect();
        assert_eq!(
            load,
            [
                "mapping_id",
                "table_id",
                "type",
                "column_id",
                "source_name",
                "target_field_id",
                "parent_column",
                "is_partition"
            ]
        );
        let upload = commit_upload_columns();
        assert_eq!(upload.len(), 8 + 16, "every version's data file columns");
        assert!(upload.iter().all(|c| c.nullable));
    }
}
