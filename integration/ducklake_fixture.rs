//! The rows real DuckLake wrote (`fixtures/ducklake-0.3/steps.json`, a copy of the shared
//! fixture): each commit as the staged batch `moraine::import` makes of it, and the catalog
//! state after it, computed here straight from the rows added and removed.

use moraine::import::{column_mapping_row, data_file_row, ducklake_steps, name_mapping_row, rows};
use moraine::model::DuckLakeVersion;
use moraine::write::StagedBatch;
use serde_json::Value;

use crate::harness::CatalogRows;

/// Path of the fixture.
pub const STEPS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/integration/fixtures/ducklake-0.3/steps.json"
);

/// One DuckLake commit of the fixture.
pub struct Step {
    pub name: String,
    /// The commit as DuckLake staged it.
    pub batch: StagedBatch,
    /// The three tables after the commit.
    pub expected: CatalogRows,
}

/// The fixture's steps that changed the mapping or data-file tables, in order.
pub fn steps() -> Vec<Step> {
    let text = std::fs::read_to_string(STEPS).expect("fixture");
    let json: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let dump = ducklake_steps(&text).expect("fixture imports");
    assert_eq!(dump.version, DuckLakeVersion::V0_3);
    let commits = dump.commits;
    let mut state = CatalogRows::default();
    let mut out = Vec::new();
    for commit in commits {
        let step = &json["steps"][&commit.name];
        let added = |t| rows(step, t, "added");
        let removed = |t| rows(step, t, "removed");
        let gone: Vec<_> = removed("ducklake_data_file")
            .into_iter()
            .map(|r| data_file_row(r, DuckLakeVersion::V0_3).expect("row"))
            .collect();
        state.data_files.retain(|f| !gone.contains(f));
        state.data_files.extend(
            added("ducklake_data_file")
                .into_iter()
                .map(|r| data_file_row(r, DuckLakeVersion::V0_3).expect("row")),
        );
        state.column_mappings.extend(
            added("ducklake_column_mapping")
                .into_iter()
                .map(|r| column_mapping_row(r).expect("row")),
        );
        state.name_mappings.extend(
            added("ducklake_name_mapping")
                .into_iter()
                .map(|r| name_mapping_row(r).expect("row")),
        );
        assert!(
            removed("ducklake_column_mapping").is_empty(),
            "1.4 never deletes mappings"
        );
        state = state.sorted();
        out.push(Step {
            name: commit.name,
            batch: commit.batch,
            expected: state.clone(),
        });
    }
    out
}
