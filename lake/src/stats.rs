//! A data file's statistics as an `add` action carries them: the row count and, per column,
//! the smallest and largest value and the null count, in the JSON the protocol specifies
//! ("Per-file Statistics"). Engines skip files by them (Spark's data skipping, the kernel's
//! and DataFusion's pruning), so they must be exact: they are computed from the very
//! batches the file is encoded from.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::{max, max_string, min, min_string};
use arrow::datatypes::{
    DataType, Date32Type, Int8Type, Int16Type, Int32Type, Int64Type, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use serde_json::{Map, Value, json};

/// The statistics of the rows in `batches` (one schema), as the `stats` JSON text. Columns
/// in `skip` (partition columns, which the `add` carries as values) and columns without an
/// order Delta defines for statistics (binary, boolean, nested) get a null count only.
pub fn file_stats(batches: &[RecordBatch], skip: &[&str]) -> String {
    let mut stats = FileStats::new(skip);
    for b in batches {
        stats.add(b);
    }
    stats.finish()
}

/// [`file_stats`] folded a batch at a time, for a file written as its batches are read
/// (a compaction that streams its inputs into the output): the same JSON text.
#[derive(Debug)]
pub struct FileStats {
    skip: Vec<String>,
    rows: usize,
    /// Per column of the first batch's schema, in order: its name, whether it is skipped,
    /// its smallest and largest value so far and its nulls.
    columns: Vec<ColumnStats>,
}

#[derive(Debug)]
struct ColumnStats {
    name: String,
    skipped: bool,
    lo: Option<Value>,
    hi: Option<Value>,
    nulls: usize,
}

impl FileStats {
    /// Statistics of no rows yet; the columns in `skip` are left out.
    pub fn new(skip: &[&str]) -> Self {
        Self {
            skip: skip.iter().map(|s| (*s).to_owned()).collect(),
            rows: 0,
            columns: Vec::new(),
        }
    }

    /// Adds `batch`'s rows (the schema of the first batch added).
    pub fn add(&mut self, batch: &RecordBatch) {
        if self.columns.is_empty() {
            self.columns = batch
                .schema()
                .fields()
                .iter()
                .map(|f| ColumnStats {
                    name: f.name().clone(),
                    skipped: self.skip.iter().any(|s| s == f.name()),
                    lo: None,
                    hi: None,
                    nulls: 0,
                })
                .collect();
        }
        self.rows += batch.num_rows();
        for (c, col) in self.columns.iter_mut().zip(batch.columns()) {
            if c.skipped {
                continue;
            }
            c.nulls += col.null_count();
            if let Some((l, h)) = min_max(col.as_ref()) {
                c.lo = Some(match c.lo.take() {
                    Some(v) if !less(&l, &v) => v,
                    _ => l,
                });
                c.hi = Some(match c.hi.take() {
                    Some(v) if !less(&v, &h) => v,
                    _ => h,
                });
            }
        }
    }

    /// The rows added so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The `stats` JSON text.
    pub fn finish(self) -> String {
        let mut mins = Map::new();
        let mut maxs = Map::new();
        let mut nulls = Map::new();
        for c in self.columns.into_iter().filter(|c| !c.skipped) {
            if let (Some(l), Some(h)) = (c.lo, c.hi) {
                mins.insert(c.name.clone(), l);
                maxs.insert(c.name.clone(), h);
            }
            nulls.insert(c.name, json!(c.nulls));
        }
        json!({
            "numRecords": self.rows,
            "minValues": mins,
            "maxValues": maxs,
            "nullCount": nulls,
        })
        .to_string()
    }
}

/// Compares two values of one column's statistics: numbers as numbers, text (ISO dates
/// and times, strings) as text.
fn less(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x < y,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(x), Some(y)) => x < y,
                _ => x.as_f64() < y.as_f64(),
            },
        },
        (Value::String(x), Value::String(y)) => x < y,
        _ => false,
    }
}

fn iso_ms(ms: i64) -> Value {
    chrono::DateTime::from_timestamp_millis(ms).map_or(Value::Null, |t| {
        json!(t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
    })
}

fn min_max(col: &dyn Array) -> Option<(Value, Value)> {
    macro_rules! prim {
        ($t:ty) => {{
            let a = col.as_primitive::<$t>();
            Some((json!(min(a)?), json!(max(a)?)))
        }};
    }
    match col.data_type() {
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Utf8 => {
            let a = col.as_string::<i32>();
            Some((json!(min_string(a)?), json!(max_string(a)?)))
        }
        DataType::Date32 => {
            let a = col.as_primitive::<Date32Type>();
            let day = |d: i32| {
                chrono::DateTime::from_timestamp(i64::from(d) * 86_400, 0)
                    .map_or(Value::Null, |t| json!(t.format("%Y-%m-%d").to_string()))
            };
            Some((day(min(a)?), day(max(a)?)))
        }
        DataType::Timestamp(TimeUnit::Millisecond, Some(_)) => {
            let a = col.as_primitive::<TimestampMillisecondType>();
            Some((iso_ms(min(a)?), iso_ms(max(a)?)))
        }
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => {
            let a = col.as_primitive::<TimestampMicrosecondType>();
            // Statistics keep milliseconds: the minimum rounds down, the maximum up.
            let (lo, hi) = (min(a)?, max(a)?);
            Some((
                iso_ms(lo.div_euclid(1000)),
                iso_ms((hi + 999).div_euclid(1000)),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        BooleanArray, Date32Array, FixedSizeBinaryArray, Int16Array, StringArray,
        TimestampMillisecondArray, UInt8Array, UInt64Array,
    };
    use arrow::datatypes::{Field, Schema};

    use super::*;

    #[test]
    fn statistics_are_the_rows_own_extremes_across_batches() {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                false,
            ),
            Field::new("tier", DataType::UInt8, false),
            Field::new("n", DataType::UInt64, true),
            Field::new("b", DataType::Int16, false),
            Field::new("s", DataType::Utf8, false),
            Field::new("d", DataType::Date32, false),
            Field::new("k", DataType::FixedSizeBinary(2), false),
            Field::new("ok", DataType::Boolean, false),
        ]));
        let batch = |t: Vec<i64>, tier: Vec<u8>, n: Vec<Option<u64>>, b: Vec<i16>, s: Vec<&str>| {
            let len = t.len();
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(TimestampMillisecondArray::from(t).with_timezone("UTC")),
                    Arc::new(UInt8Array::from(tier)),
                    Arc::new(UInt64Array::from(n)),
                    Arc::new(Int16Array::from(b)),
                    Arc::new(StringArray::from(s)),
                    Arc::new(Date32Array::from(vec![20_422; len])),
                    Arc::new(
                        FixedSizeBinaryArray::try_from_iter(std::iter::repeat_n([1u8, 2], len))
                            .unwrap(),
                    ),
                    Arc::new(BooleanArray::from(vec![true; len])),
                ],
            )
            .unwrap()
        };
        let a = batch(
            vec![1_796_047_200_000, 1_796_047_200_999],
            vec![3, 1],
            vec![Some(5), None],
            vec![-40, 2],
            vec!["m", "b"],
        );
        let b = batch(
            vec![1_796_047_199_999],
            vec![2],
            vec![Some(u64::MAX)],
            vec![24],
            vec!["z"],
        );
        // Folded a batch at a time, as a compaction streams its inputs: the text of the
        // rows in one batch.
        let whole = arrow::compute::concat_batches(&a.schema(), [&a, &b]).unwrap();
        let folded = file_stats(&[a, b], &["d"]);
        assert_eq!(folded, file_stats(&[whole], &["d"]));
        let stats: Value = serde_json::from_str(&folded).unwrap();
        assert_eq!(stats["numRecords"], 3);
        assert_eq!(stats["minValues"]["t"], "2026-11-30T13:59:59.999Z");
        assert_eq!(stats["maxValues"]["t"], "2026-11-30T14:00:00.999Z");
        assert_eq!(
            (&stats["minValues"]["tier"], &stats["maxValues"]["tier"]),
            (&json!(1), &json!(3))
        );
        assert_eq!(stats["maxValues"]["n"], json!(u64::MAX));
        assert_eq!(stats["nullCount"]["n"], 1);
        assert_eq!(
            (&stats["minValues"]["b"], &stats["maxValues"]["b"]),
            (&json!(-40), &json!(24))
        );
        assert_eq!(
            (&stats["minValues"]["s"], &stats["maxValues"]["s"]),
            (&json!("b"), &json!("z"))
        );
        assert!(stats["minValues"].get("d").is_none() && stats["nullCount"].get("d").is_none());
        assert!(stats["minValues"].get("k").is_none() && stats["minValues"].get("ok").is_none());
        assert_eq!(stats["nullCount"]["k"], 0);
        let empty: Value = serde_json::from_str(&file_stats(&[], &[])).unwrap();
        assert_eq!(empty["numRecords"], 0);
    }
}
