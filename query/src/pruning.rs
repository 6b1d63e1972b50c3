//! Raw-table scans check against each file's statistics only what can rule a file out: a
//! physical optimizer rule that keeps, in the predicate of a scan of `decisions`, the
//! conjuncts on the columns the raw layout orders or holds few values of per file, and drops
//! the rest from the scan. The `FilterExec` above the scan still applies every conjunct.
//!
//! DataFusion hands a scan the query's filters so that, for each file it opens, it can build
//! a pruning predicate and test it against the file's statistics, row groups and bloom
//! filters. A raw file holds an hour of one Kafka partition, sorted by key id then time
//! (DESIGN.md), so its statistics can exclude it for a condition on `key_id` (bloom filter,
//! min/max), `event_time`, `kafka_cluster`, `kafka_partition`, `kafka_offset` or `policy_version` (a few
//! versions are in force in an hour), and `date`/`hour` are its folder. Every other column —
//! tier, route class, region, verdict, source, the remaining counts — takes nearly all its
//! values in every file, so testing a condition on it against statistics rules out nothing
//! and costs the same per file: in `verdict-bench query`, wrong-limits spent about 7 % of its
//! time pruning 672 files with `source IN (0, 1)` and keeping every one.
//!
//! The conjuncts dropped are only ever used for pruning: the rule leaves a scan alone when
//! its Parquet filters are pushed down into the decoder
//! (`datafusion.execution.parquet.pushdown_filters`), because the scan then applies them
//! itself and no `FilterExec` is left above it.

use std::sync::Arc;

use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_expr::expressions::lit;
use datafusion::physical_expr::utils::{collect_columns, conjunction_opt, split_conjunction};
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use verdict_schemas::tables::raw;

use crate::rules::NodeRule;
use crate::view::in_raw;

/// The raw table's columns whose per-file statistics can exclude a file (see the module
/// documentation).
pub const RAW_PRUNING_COLUMNS: [&str; 8] = [
    raw::KEY_ID,
    raw::EVENT_TIME,
    raw::KAFKA_CLUSTER,
    raw::KAFKA_PARTITION,
    raw::KAFKA_OFFSET,
    raw::POLICY_VERSION,
    "date",
    "hour",
];

/// The physical optimizer rule; see the module documentation.
pub const RAW_SCAN_PRUNING: NodeRule = NodeRule {
    name: "verdict_raw_scan_pruning",
    replace: |node| narrowed(node.as_ref()),
};

/// `node` with a narrower predicate, if it is a scan of raw files whose predicate has
/// conjuncts that cannot prune.
fn narrowed(node: &dyn ExecutionPlan) -> Option<Arc<dyn ExecutionPlan>> {
    let exec = node.downcast_ref::<DataSourceExec>()?;
    let config = exec.data_source().downcast_ref::<FileScanConfig>()?;
    let source = config.file_source().downcast_ref::<ParquetSource>()?;
    if source.table_parquet_options().global.pushdown_filters || !scans_raw(config) {
        return None;
    }
    let predicate = FileSource::filter(source)?;
    let conjuncts = split_conjunction(&predicate);
    let kept: Vec<Arc<dyn PhysicalExpr>> = conjuncts
        .iter()
        .filter(|c| can_prune(c))
        .map(|c| Arc::clone(c))
        .collect();
    if kept.len() == conjuncts.len() {
        return None;
    }
    // A scan's predicate cannot be taken away, only replaced: `true` builds no pruning
    // predicate (DataFusion skips one that is always true).
    let kept = conjunction_opt(kept).unwrap_or_else(|| lit(true));
    let mut config = config.clone();
    config.file_source = Arc::new(source.with_predicate(kept));
    Some(DataSourceExec::from_data_source(config))
}

/// Whether every file the scan reads is a raw file.
fn scans_raw(config: &FileScanConfig) -> bool {
    let mut files = config.file_groups.iter().flat_map(|g| g.iter()).peekable();
    files.peek().is_some() && files.all(|f| in_raw(&f.object_meta))
}

/// Whether `conjunct` only reads columns whose statistics can exclude a raw file (a constant
/// reads none, and is kept).
fn can_prune(conjunct: &&Arc<dyn PhysicalExpr>) -> bool {
    collect_columns(conjunct)
        .iter()
        .all(|c| RAW_PRUNING_COLUMNS.contains(&c.name()))
}
