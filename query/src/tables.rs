//! The tables, registered in one DataFusion catalog over the lake:
//!
//! | table | what | files |
//! | --- | --- | --- |
//! | `decisions` | the raw table, one row per decision, 7 days | the raw Delta table's files, `raw/date=…/hour=…/*.parquet`; `date` and `hour` are partition columns, so a filter on them prunes folders |
//! | `denied_hourly` | the rollup, one row per hour × key × route class × tier × region with a refusal, 5 years | `rollup/denied_hourly/date=…/hour=…/`; `date` is a partition column |
//! | `demand_hourly` | per hour × tier × route class × region, keys by level of demand (log-spaced buckets), 5 years | `rollup/demand_hourly/date=…/hour=…/`; `date` is a partition column |
//! | `overage` | per key per day, requests over the hourly quota, for pricing | `overage/date=…/` |
//! | `policies` | the policy in force: one row per tier × route class, and one per override × route class | the limiter's policy source (TOML file or PostgreSQL) |
//! | `regions` | the policy's regions, each with its static weight and the share of every limit it enforces by that weight; one more row, its `region` null, holds the share of a region the policy does not list (1 when the policy lists fewer than two, where a region enforces the whole) | the same source |
//!
//! Every query lists the lake afresh (no listing cache), so new commits are seen at once;
//! the listing goes through [`ReaderView`], which lists each Delta table (`decisions`,
//! `denied_hourly`, `demand_hourly`, `overage`) as its snapshot: the committed files, no
//! others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeBinaryBuilder, Float64Array, Int64Array, RecordBatch,
    StringArray, UInt8Array, UInt16Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use tokio::sync::Mutex;
use verdict_limiter::policy::ALL_ROUTES;
use verdict_limiter::{PolicySnapshot, PolicySource};
use verdict_schemas::layout::{
    DEMAND_HOURLY_PREFIX, DENIED_HOURLY_PREFIX, OVERAGE_PREFIX, RAW_PREFIX, RECONCILE_ROUNDS_PREFIX,
};
use verdict_schemas::tables::{
    demand_hourly_schema, denied_hourly_schema, overage_schema, raw_schema, reconcile_rounds_schema,
};

/// The URL under which the lake is known to DataFusion.
pub const LAKE_URL: &str = "verdict://lake";

/// The table names, in the order `GET /v1/tables` lists them.
pub const TABLES: [&str; 7] = [
    "decisions",
    "denied_hourly",
    "demand_hourly",
    "overage",
    "policies",
    "regions",
    "reconcile_rounds",
];

/// Registers the four tables in `ctx`, whose runtime must know the lake as [`LAKE_URL`].
pub fn register(ctx: &SessionContext, policies: Arc<PoliciesTable>) -> DfResult<()> {
    // The session's Parquet options (`datafusion.execution.parquet.*`, which DATAFUSION_*
    // environment variables set), not the format's built-in defaults.
    let options = ctx.state().default_table_options().parquet;
    let parquet = || {
        ListingOptions::new(Arc::new(
            ParquetFormat::default().with_options(options.clone()),
        ))
        .with_file_extension(".parquet")
    };
    let listing = |prefix: &str, options: ListingOptions, schema: SchemaRef| {
        let url = ListingTableUrl::parse(format!("{LAKE_URL}/{prefix}/"))?;
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(schema);
        Ok::<_, DataFusionError>(Arc::new(ListingTable::try_new(config)?))
    };
    let date_hour = vec![
        ("date".to_string(), DataType::Date32),
        ("hour".to_string(), DataType::Int32),
    ];
    ctx.register_table(
        "decisions",
        listing(
            RAW_PREFIX,
            parquet().with_table_partition_cols(date_hour),
            raw_schema(),
        )?,
    )?;
    ctx.register_table(
        "denied_hourly",
        listing(
            DENIED_HOURLY_PREFIX,
            parquet().with_table_partition_cols(vec![("date".to_string(), DataType::Date32)]),
            denied_hourly_schema(),
        )?,
    )?;
    ctx.register_table(
        "demand_hourly",
        listing(
            DEMAND_HOURLY_PREFIX,
            parquet().with_table_partition_cols(vec![("date".to_string(), DataType::Date32)]),
            demand_hourly_schema(),
        )?,
    )?;
    ctx.register_table(
        "overage",
        listing(OVERAGE_PREFIX, parquet(), overage_schema())?,
    )?;
    ctx.register_table(
        "reconcile_rounds",
        listing(
            RECONCILE_ROUNDS_PREFIX,
            parquet(),
            reconcile_rounds_schema(),
        )?,
    )?;
    ctx.register_table(
        "regions",
        Arc::new(PolicyView {
            policies: Arc::clone(&policies),
            regions: true,
        }),
    )?;
    ctx.register_table(
        "policies",
        Arc::new(PolicyView {
            policies,
            regions: false,
        }),
    )?;
    Ok(())
}

/// How long a policy read stays fresh: the limiter polls its source as often.
pub const POLICY_REFRESH: Duration = Duration::from_secs(10);

/// The policy in force, as the `policies` and `regions` tables read it: from the limiter's
/// source, re-read when older than [`POLICY_REFRESH`]. If the source fails, the last policy read stays (with a
/// warning), as in the limiter.
#[derive(Debug)]
pub struct PoliciesTable {
    source: Option<Arc<dyn PolicySource>>,
    cached: Mutex<Option<(Instant, Arc<PolicySnapshot>)>>,
}

impl PoliciesTable {
    /// The table over `source`; `None` gives an empty table (no policy configured).
    pub fn new(source: Option<Arc<dyn PolicySource>>) -> Self {
        Self {
            source,
            cached: Mutex::new(None),
        }
    }

    /// The schema: see the module documentation of the `policies` rows.
    pub fn table_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("kind", DataType::Utf8, false),
            Field::new("tier", DataType::Utf8, true),
            Field::new("tier_id", DataType::UInt8, true),
            Field::new("route_class", DataType::Utf8, false),
            Field::new("route_class_id", DataType::UInt8, false),
            Field::new("key_id", DataType::FixedSizeBinary(16), true),
            Field::new("capacity", DataType::Int64, false),
            Field::new("refill_per_s", DataType::Float64, false),
            Field::new("hourly_quota", DataType::Int64, false),
            Field::new("mode", DataType::Utf8, true),
            Field::new("kill_switch", DataType::Boolean, false),
            Field::new("version", DataType::UInt64, false),
        ]))
    }

    /// The policy in force, re-read from the source when stale; `None` when no source is
    /// configured.
    pub async fn snapshot(&self) -> DfResult<Option<Arc<PolicySnapshot>>> {
        let mut cached = self.cached.lock().await;
        if let Some((at, snapshot)) = cached.as_ref()
            && at.elapsed() < POLICY_REFRESH
        {
            return Ok(Some(Arc::clone(snapshot)));
        }
        let Some(source) = &self.source else {
            return Ok(None);
        };
        match source.load().await {
            Ok(snapshot) => {
                let snapshot = Arc::new(snapshot);
                *cached = Some((Instant::now(), Arc::clone(&snapshot)));
                Ok(Some(snapshot))
            }
            Err(e) => match cached.as_mut() {
                Some((at, snapshot)) => {
                    tracing::warn!(error = %e, "policy source failed; the last policy read stays");
                    *at = Instant::now();
                    Ok(Some(Arc::clone(snapshot)))
                }
                None => Err(DataFusionError::External(
                    format!("the policies table could not be read: {e}").into(),
                )),
            },
        }
    }

    /// The rows now (see [`policy_rows`]); none without a source.
    pub async fn batch(&self) -> DfResult<RecordBatch> {
        match self.snapshot().await? {
            Some(snapshot) => policy_rows(&snapshot),
            None => Ok(RecordBatch::new_empty(Self::table_schema())),
        }
    }

    /// The `regions` table's rows now (see [`region_rows`]): without a source, the row of
    /// a region enforcing the whole.
    pub async fn regions_batch(&self) -> DfResult<RecordBatch> {
        region_rows(self.snapshot().await?.as_deref())
    }
}

/// One row per tier × route class (the rule in force, `*` rows expanded) and one per
/// override × route class.
pub fn policy_rows(snapshot: &PolicySnapshot) -> DfResult<RecordBatch> {
    let doc = snapshot.document();
    let mut kind = Vec::new();
    let mut tier: Vec<Option<String>> = Vec::new();
    let mut tier_id: Vec<Option<u8>> = Vec::new();
    let mut route = Vec::new();
    let mut route_id = Vec::new();
    let mut key = FixedSizeBinaryBuilder::new(16);
    let mut capacity = Vec::new();
    let mut refill = Vec::new();
    let mut quota = Vec::new();
    let mut mode: Vec<Option<&str>> = Vec::new();
    let mut killed = Vec::new();
    for t in &doc.tiers {
        for r in &doc.route_classes {
            let Some(rule) = snapshot.rule(
                verdict_schemas::TierId(t.id),
                verdict_schemas::RouteClassId(r.id),
            ) else {
                continue;
            };
            // The document's own row, for the refill as it was written.
            let row = doc
                .limits
                .iter()
                .find(|l| l.tier == t.name && l.route_class == r.name)
                .or_else(|| {
                    doc.limits
                        .iter()
                        .find(|l| l.tier == t.name && l.route_class == ALL_ROUTES)
                });
            kind.push("limit");
            tier.push(Some(t.name.clone()));
            tier_id.push(Some(t.id));
            route.push(r.name.clone());
            route_id.push(r.id);
            key.append_null();
            capacity.push(i64::from(rule.limits.capacity));
            refill.push(row.map_or(0.0, |l| l.refill_per_s));
            quota.push(i64::from(rule.limits.quota));
            mode.push(Some(rule.mode.as_str()));
            killed.push(doc.kill_switch || t.kill_switch);
        }
    }
    for o in &doc.overrides {
        for r in doc
            .route_classes
            .iter()
            .filter(|r| o.route_class == ALL_ROUTES || o.route_class == r.name)
        {
            kind.push("override");
            tier.push(None);
            tier_id.push(None);
            route.push(r.name.clone());
            route_id.push(r.id);
            key.append_value(o.key_id.as_bytes())
                .map_err(|e| DataFusionError::ArrowError(Box::new(e), None))?;
            capacity.push(o.capacity);
            refill.push(o.refill_per_s);
            quota.push(o.hourly_quota);
            mode.push(o.mode.map(|m| m.as_str()));
            killed.push(doc.kill_switch);
        }
    }
    let rows = kind.len();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(kind)),
        Arc::new(StringArray::from(tier)),
        Arc::new(UInt8Array::from(tier_id)),
        Arc::new(StringArray::from(route)),
        Arc::new(UInt8Array::from(route_id)),
        Arc::new(key.finish()),
        Arc::new(Int64Array::from(capacity)),
        Arc::new(Float64Array::from(refill)),
        Arc::new(Int64Array::from(quota)),
        Arc::new(StringArray::from(mode)),
        Arc::new(BooleanArray::from(killed)),
        Arc::new(UInt64Array::from(vec![snapshot.version(); rows])),
    ];
    Ok(RecordBatch::try_new(
        PoliciesTable::table_schema(),
        columns,
    )?)
}

/// The `regions` table's schema and rows.
pub struct RegionsTable;

impl RegionsTable {
    /// The schema: `region` (null in the row of unlisted regions), `name`, `weight`, and
    /// `share`, the part of every limit (bucket and quota) the region enforces without the
    /// reconcile.
    pub fn table_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("region", DataType::UInt16, true),
            Field::new("name", DataType::Utf8, false),
            Field::new("weight", DataType::Float64, true),
            Field::new("share", DataType::Float64, false),
        ]))
    }
}

/// The rows of the `regions` table for `snapshot` (none: the one row of a region enforcing
/// the whole).
pub fn region_rows(snapshot: Option<&PolicySnapshot>) -> DfResult<RecordBatch> {
    let listed = snapshot.map_or(&[][..], |s| &s.document().regions[..]);
    // Without a policy, a region enforces the whole.
    let share = |id: u16| {
        snapshot.map_or(1.0, |s| {
            f64::from(s.region_static_ppm(verdict_schemas::RegionId(id)))
                / f64::from(verdict_limiter::algo::PPM)
        })
    };
    // A region id the policy does not list gives the share of an unlisted region.
    let unlisted = (0..=u16::MAX)
        .find(|id| listed.iter().all(|r| r.id != *id))
        .unwrap_or(u16::MAX);
    let mut region: Vec<Option<u16>> = listed.iter().map(|r| Some(r.id)).collect();
    let mut name: Vec<String> = listed.iter().map(|r| r.name.clone()).collect();
    let mut weight: Vec<Option<f64>> = listed.iter().map(|r| Some(r.weight)).collect();
    let mut shares: Vec<f64> = listed.iter().map(|r| share(r.id)).collect();
    region.push(None);
    name.push("(unlisted)".to_owned());
    weight.push(None);
    shares.push(share(unlisted));
    Ok(RecordBatch::try_new(
        RegionsTable::table_schema(),
        vec![
            Arc::new(UInt16Array::from(region)),
            Arc::new(StringArray::from(name)),
            Arc::new(Float64Array::from(weight)),
            Arc::new(Float64Array::from(shares)),
        ],
    )?)
}

/// A table of the policy in force, one batch made from it when scanned: `policies` or
/// `regions`.
#[derive(Debug)]
struct PolicyView {
    policies: Arc<PoliciesTable>,
    regions: bool,
}

#[async_trait]
impl TableProvider for PolicyView {
    fn schema(&self) -> SchemaRef {
        if self.regions {
            RegionsTable::table_schema()
        } else {
            PoliciesTable::table_schema()
        }
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let batch = if self.regions {
            self.policies.regions_batch().await?
        } else {
            self.policies.batch().await?
        };
        MemTable::try_new(self.schema(), vec![vec![batch]])?
            .scan(state, projection, filters, limit)
            .await
    }
}
