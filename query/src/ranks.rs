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
//! Each sorts a group's values once, where the windows sorted every key's whole row once
//! per ranking (nine sorts of about 100,000 rows of twenty columns over the bench's week,
//! more than half of the review's time once its first level is kept; see
//! [`crate::parts`]). Both take and give `DOUBLE`; the statement casts integers back.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, ListArray};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

/// What a function makes of a group's sorted values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pick {
    /// The k-th smallest of the non-null values, k = ⌈q·n⌉.
    NearestRank,
    /// The sum of the largest max(1, ⌈share·n⌉), n counting every row.
    TopSum,
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
            Pick::TopSum => {
                if self.rows == 0 {
                    None
                } else {
                    let k = (q * self.rows as f64).ceil().max(1.0) as usize;
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

/// Registers both functions in `ctx`.
pub fn register(ctx: &SessionContext) {
    for pick in [Pick::NearestRank, Pick::TopSum] {
        ctx.register_udaf(AggregateUDF::from(Ranked::new(pick)));
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
