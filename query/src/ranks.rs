//! Two aggregate functions the limit review's served statement uses where the portable one
//! ranks each limit's keys with window functions:
//!
//! - `verdict_nearest_rank(x, q)`: the nearest-rank percentile `q` of the group's non-null
//!   `x`, the k-th smallest for k = ⌈q·n⌉ (n the non-null values): what
//!   `MIN(CASE WHEN ROW_NUMBER() OVER (… ORDER BY x) >= CEIL(q * n) THEN x END)` gives.
//! - `verdict_top_sum(x, share)`: the sum of the group's largest max(1, ⌈share·n⌉) values
//!   of `x` (n the rows): what `SUM(CASE WHEN ROW_NUMBER() OVER (… ORDER BY x DESC) <=
//!   GREATEST(1, CEIL(share * n)) THEN x ELSE 0 END)` gives.
//!
//! - `verdict_top_sum_of(x, k)`: the sum of the group's largest `k` values of `x` (`k` the
//!   same on every row): the limit review's outliers when its keys are sampled, `k` taken
//!   from the estimated count of the limit's keys, not from the rows there are.
//!
//! And one scalar function, `verdict_key_hash(key_id)`: a key's place in the review's
//! sample, a number in [0, 2³²) that depends on the key alone (see
//! [`crate::reports`]' `wrong-limits`), so that a key is in the sample on every day of a
//! range or on none.
//!
//! Each sorts a group's values once, where the windows sorted every key's whole row once
//! per ranking (nine sorts of about 100,000 rows of twenty columns over the bench's week,
//! more than half of the review's time once its first level is kept; see
//! [`crate::parts`]). Both take and give `DOUBLE`; the statement casts integers back.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, ListArray};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

/// What a function makes of a group's sorted values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pick {
    /// The k-th smallest of the non-null values, k = ⌈q·n⌉.
    NearestRank,
    /// The sum of the largest max(1, ⌈share·n⌉), n counting every row.
    TopSum,
    /// The sum of the largest k.
    TopSumOf,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Ranked {
    pick: Pick,
    signature: Signature,
}

impl Ranked {
    fn new(pick: Pick) -> Self {
        Self {
            pick,
            signature: Signature::exact(
                vec![DataType::Float64, DataType::Float64],
                Volatility::Immutable,
            ),
        }
    }
}

impl AggregateUDFImpl for Ranked {
    fn name(&self) -> &str {
        match self.pick {
            Pick::NearestRank => "verdict_nearest_rank",
            Pick::TopSum => "verdict_top_sum",
            Pick::TopSumOf => "verdict_top_sum_of",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let list = DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)));
        Ok(vec![
            Arc::new(Field::new(format!("{}[values]", args.name), list, true)),
            Arc::new(Field::new(
                format!("{}[rows]", args.name),
                DataType::Float64,
                true,
            )),
            Arc::new(Field::new(
                format!("{}[q]", args.name),
                DataType::Float64,
                true,
            )),
        ])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(Values::new(self.pick)))
    }
}

/// A group's values, its rows (nulls too) and its `q`.
#[derive(Debug)]
struct Values {
    pick: Pick,
    values: Vec<f64>,
    rows: u64,
    q: Option<f64>,
}

impl Values {
    fn new(pick: Pick) -> Self {
        Self {
            pick,
            values: Vec::new(),
            rows: 0,
            q: None,
        }
    }

    fn take_q(&mut self, q: &Float64Array) {
        if self.q.is_none() {
            self.q = q.iter().flatten().next();
        }
    }
}

impl Accumulator for Values {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let x = values[0].as_primitive::<Float64Type>();
        self.take_q(values[1].as_primitive::<Float64Type>());
        self.rows += x.len() as u64;
        self.values.extend(x.iter().flatten());
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        let rows = states[1].as_primitive::<Float64Type>();
        self.take_q(states[2].as_primitive::<Float64Type>());
        for (i, list) in lists.iter().enumerate() {
            if let Some(list) = list {
                self.values
                    .extend(list.as_primitive::<Float64Type>().iter().flatten());
            }
            if rows.is_valid(i) {
                self.rows += rows.value(i) as u64;
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values = std::mem::take(&mut self.values);
        let list = ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            OffsetBuffer::new(ScalarBuffer::from(vec![0, values.len() as i32])),
            Arc::new(Float64Array::from(values)),
            None,
        );
        Ok(vec![
            ScalarValue::List(Arc::new(list)),
            ScalarValue::Float64(Some(self.rows as f64)),
            ScalarValue::Float64(self.q),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let q = self.q.unwrap_or(0.0);
        let v = &mut self.values;
        Ok(ScalarValue::Float64(match self.pick {
            Pick::NearestRank => {
                // As the SQL computes it: CEIL(q * n) in doubles, n the non-null values.
                let k = (q * v.len() as f64).ceil();
                (k >= 1.0 && k <= v.len() as f64).then(|| {
                    let k = k as usize - 1;
                    *v.select_nth_unstable_by(k, f64::total_cmp).1
                })
            }
            Pick::TopSum | Pick::TopSumOf => {
                if self.rows == 0 {
                    None
                } else {
                    let k = match self.pick {
                        Pick::TopSum => (q * self.rows as f64).ceil().max(1.0) as usize,
                        _ => q.max(0.0) as usize,
                    };
                    v.sort_unstable_by(|a, b| b.total_cmp(a));
                    Some(v.iter().take(k).sum())
                }
            }
        }))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.values.capacity() * std::mem::size_of::<f64>()
    }
}

/// Registers the functions in `ctx`.
pub fn register(ctx: &SessionContext) {
    for pick in [Pick::NearestRank, Pick::TopSum, Pick::TopSumOf] {
        ctx.register_udaf(AggregateUDF::from(Ranked::new(pick)));
    }
    ctx.register_udf(ScalarUDF::from(KeyHash::new()));
}

/// A key's place in the review's sample: the 16 bytes of its id mixed (the two halves,
/// then SplitMix64's finalizer) and the top 32 bits kept. A key id is already a hash of
/// the API key, but a mix keeps ids with a structure (a test's, a tenant's numbering)
/// spread evenly.
pub fn key_hash(key: &[u8]) -> i64 {
    let half = |b: &[u8]| {
        let mut w = [0u8; 8];
        let n = b.len().min(8);
        w[..n].copy_from_slice(&b[..n]);
        u64::from_le_bytes(w)
    };
    let (lo, hi) = key.split_at(key.len().min(8));
    let mut z = half(lo) ^ half(hi).rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 32) as i64
}

/// `verdict_key_hash(key_id)`: [`key_hash`] of a 16-byte key id, as a `BIGINT`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct KeyHash {
    signature: Signature,
}

impl KeyHash {
    fn new() -> Self {
        Self {
            signature: Signature::exact(vec![DataType::FixedSizeBinary(16)], Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for KeyHash {
    fn name(&self) -> &str {
        "verdict_key_hash"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let keys = args.args[0].to_array(args.number_rows)?;
        let keys = keys.as_fixed_size_binary();
        let hashed: Int64Array = keys.iter().map(|k| k.map(key_hash)).collect();
        Ok(ColumnarValue::Array(Arc::new(hashed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pick: Pick, x: &[Option<f64>], q: f64) -> Option<f64> {
        // Two accumulators merged, as a partial and a final aggregation make them.
        let (a, b) = x.split_at(x.len() / 2);
        let mut parts = Vec::new();
        for half in [a, b] {
            let mut acc = Values::new(pick);
            let values: ArrayRef = Arc::new(Float64Array::from(half.to_vec()));
            let qs: ArrayRef = Arc::new(Float64Array::from(vec![q; half.len()]));
            acc.update_batch(&[values, qs]).unwrap();
            parts.push(acc.state().unwrap());
        }
        let mut total = Values::new(pick);
        for state in parts {
            let arrays: Vec<ArrayRef> = state.iter().map(|s| s.to_array().unwrap()).collect();
            total.merge_batch(&arrays).unwrap();
        }
        match total.evaluate().unwrap() {
            ScalarValue::Float64(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_nearest_rank_is_the_kth_smallest_of_the_values_there_are() {
        let x: Vec<Option<f64>> = (1..=10).rev().map(|i| Some(f64::from(i))).collect();
        assert_eq!(run(Pick::NearestRank, &x, 0.5), Some(5.0));
        assert_eq!(run(Pick::NearestRank, &x, 0.9), Some(9.0));
        assert_eq!(run(Pick::NearestRank, &x, 0.99), Some(10.0));
        assert_eq!(run(Pick::NearestRank, &x, 0.01), Some(1.0));
        // Nulls are not values: the percentile of the three there are.
        let sparse = [None, Some(3.0), None, Some(1.0), Some(2.0), None];
        assert_eq!(run(Pick::NearestRank, &sparse, 0.5), Some(2.0));
        assert_eq!(run(Pick::NearestRank, &[None, None], 0.5), None);
    }

    #[test]
    fn the_top_sum_of_k_adds_the_largest_k_whatever_the_rows() {
        let x: Vec<Option<f64>> = (0..200).map(|i| Some(f64::from(i % 100))).collect();
        assert_eq!(run(Pick::TopSumOf, &x, 3.0), Some(99.0 + 99.0 + 98.0));
        assert_eq!(run(Pick::TopSumOf, &x[..10], 20.0), Some(45.0));
    }

    #[test]
    fn the_key_hash_spreads_numbered_keys_evenly_over_its_range() {
        // Keys numbered in their last bytes, as the tests' and a tenant's are: a sample of
        // a quarter of the range holds about a quarter of them.
        let keys: Vec<[u8; 16]> = (0..100_000u32)
            .map(|i| {
                let mut k = [0u8; 16];
                k[0] = 0xa0;
                k[12..].copy_from_slice(&i.to_be_bytes());
                k
            })
            .collect();
        let cut = 1i64 << 30;
        let under = keys.iter().filter(|k| key_hash(&k[..]) < cut).count();
        assert!((24_000..26_000).contains(&under), "{under} of 100,000");
        assert!(
            keys.iter()
                .all(|k| (0..1i64 << 32).contains(&key_hash(&k[..])))
        );
        assert_eq!(key_hash(&keys[7][..]), key_hash(&keys[7][..]));
    }

    #[test]
    fn the_top_sum_adds_the_largest_share_of_the_rows_and_at_least_one() {
        let x: Vec<Option<f64>> = (0..200).map(|i| Some(f64::from(i % 100))).collect();
        // 1 % of 200 rows: the 2 largest, 99 and 99.
        assert_eq!(run(Pick::TopSum, &x, 0.01), Some(198.0));
        assert_eq!(run(Pick::TopSum, &x[..10], 0.01), Some(9.0));
        assert_eq!(
            run(Pick::TopSum, &x, 0.05),
            Some(99.0 * 2.0 + 98.0 * 2.0 + 97.0 * 2.0 + 96.0 * 2.0 + 95.0 * 2.0)
        );
    }
}
