//! The functions that can make a huge value out of a small query are bounded: `repeat`,
//! `lpad` and `rpad` (strings), `array_repeat`, `range` and `generate_series` (lists). Their
//! results are allocated outside the memory pool (an operator reserves memory for what it
//! keeps, not for what a function returns), so `repeat('x', 1000000000)` took 4 GB of a
//! process whose queries were each held to 1 GiB. Each is replaced by the same function behind
//! a check of the bytes its call would make, refused past [`CALL_BYTES`] per call (a batch of
//! rows; a call of constants, folded into the plan and then repeated for every row of a
//! batch, counts as a batch of its value: 8 KiB at most) with an error that names the
//! function and the limit.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::compute::kernels::length::length;
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{ExprSchema, Result, exec_err};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// What every refusal of a bounded function says (and how the engine knows it).
pub const REFUSED: &str = "in one call (a call of constants counts once for each row of a batch)";

/// The most bytes one call of a bounded function may make: 64 MiB.
pub const CALL_BYTES: u64 = 64 << 20;

/// How a function's output size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Estimate {
    /// `repeat(s, n)`: the bytes of `s`, `n` times.
    Repeat,
    /// `lpad(s, n[, fill])`, `rpad`: `n` characters, 4 bytes each at most.
    Pad,
    /// `array_repeat(x, n)`: `n` elements (8 bytes each at least).
    ArrayRepeat,
    /// `range(stop)`, `range(start, stop[, step])`, `generate_series`: the elements, 8
    /// bytes each.
    Series,
}

/// The functions bounded, and how.
const BOUNDED: [(&str, Estimate); 6] = [
    ("repeat", Estimate::Repeat),
    ("lpad", Estimate::Pad),
    ("rpad", Estimate::Pad),
    ("array_repeat", Estimate::ArrayRepeat),
    ("range", Estimate::Series),
    ("generate_series", Estimate::Series),
];

/// Replaces the functions of [`BOUNDED`] in `ctx` by their bounded selves.
pub fn register(ctx: &SessionContext) -> Result<()> {
    for (name, estimate) in BOUNDED {
        let inner = ctx.udf(name)?;
        ctx.register_udf(ScalarUDF::new_from_impl(Capped {
            inner: Arc::clone(inner.inner()),
            estimate,
        }));
    }
    Ok(())
}

/// A function behind a check of the bytes its call would make.
#[derive(Debug)]
struct Capped {
    inner: Arc<dyn ScalarUDFImpl>,
    estimate: Estimate,
}

impl PartialEq for Capped {
    fn eq(&self, other: &Self) -> bool {
        self.inner.name() == other.inner.name() && self.estimate == other.estimate
    }
}

impl Eq for Capped {}

impl Hash for Capped {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.name().hash(state);
        self.estimate.hash(state);
    }
}

/// Argument `i` as one Int64 value per row (nulls as 0); `None` when it is not a number.
fn ints(args: &ScalarFunctionArgs, i: usize) -> Result<Option<Vec<i64>>> {
    let Some(arg) = args.args.get(i) else {
        return Ok(None);
    };
    let array = arg.to_array(args.number_rows)?;
    if !array.data_type().is_integer() {
        return Ok(None);
    }
    let array = cast(&array, &DataType::Int64)?;
    let values = array.as_primitive::<Int64Type>();
    Ok(Some(
        (0..values.len())
            .map(|r| {
                if values.is_valid(r) {
                    values.value(r)
                } else {
                    0
                }
            })
            .collect(),
    ))
}

/// The byte length of argument `i` per row (0 for null or a non-string).
fn byte_lengths(args: &ScalarFunctionArgs, i: usize) -> Result<Vec<i64>> {
    let array: ArrayRef = args.args[i].to_array(args.number_rows)?;
    let Ok(lengths) = length(&array) else {
        return Ok(vec![0; args.number_rows]);
    };
    let lengths = cast(&lengths, &DataType::Int64)?;
    let values = lengths.as_primitive::<Int64Type>();
    Ok((0..values.len())
        .map(|r| {
            if values.is_valid(r) {
                values.value(r)
            } else {
                0
            }
        })
        .collect())
}

impl Capped {
    /// The bytes the call would make, at least (saturating).
    fn bytes(&self, args: &ScalarFunctionArgs) -> Result<u64> {
        let made = self.made(args)?;
        // A call of constants is one value (folded into the plan), repeated for every row of
        // a batch: counted as a batch of it.
        let constant = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        Ok(if constant {
            let batch = args.config_options.execution.batch_size.get() as u64;
            (made / args.number_rows.max(1) as u64).saturating_mul(batch)
        } else {
            made
        })
    }

    /// The bytes the call itself makes, at least (saturating).
    fn made(&self, args: &ScalarFunctionArgs) -> Result<u64> {
        let clamp = |x: i64| u64::try_from(x).unwrap_or(0);
        Ok(match self.estimate {
            Estimate::Repeat => {
                let (Some(n), lengths) = (ints(args, 1)?, byte_lengths(args, 0)?) else {
                    return Ok(0);
                };
                n.iter().zip(&lengths).fold(0u64, |sum, (n, len)| {
                    sum.saturating_add(clamp(*n).saturating_mul(clamp(*len)))
                })
            }
            Estimate::Pad => {
                let Some(n) = ints(args, 1)? else {
                    return Ok(0);
                };
                n.iter().fold(0u64, |sum, n| {
                    sum.saturating_add(clamp(*n).saturating_mul(4))
                })
            }
            Estimate::ArrayRepeat => {
                let Some(n) = ints(args, 1)? else {
                    return Ok(0);
                };
                n.iter().fold(0u64, |sum, n| {
                    sum.saturating_add(clamp(*n).saturating_mul(8))
                })
            }
            Estimate::Series => {
                // Integer bounds only; dates and timestamps with interval steps are not
                // estimated.
                let (start, stop, step) = match args.args.len() {
                    1 => (None, ints(args, 0)?, None),
                    2 => (ints(args, 0)?, ints(args, 1)?, None),
                    _ => (ints(args, 0)?, ints(args, 1)?, ints(args, 2)?),
                };
                let Some(stop) = stop else {
                    return Ok(0);
                };
                let mut sum = 0u64;
                for (r, stop) in stop.iter().enumerate() {
                    let start = start.as_ref().map_or(0, |s| s[r]);
                    let step = step.as_ref().map_or(1, |s| s[r]);
                    let span = i128::from(*stop) - i128::from(start);
                    let count = if step == 0 {
                        0
                    } else {
                        (span / i128::from(step)).max(0) as u128 + 1
                    };
                    sum = sum.saturating_add(u64::try_from(count).unwrap_or(u64::MAX / 8) * 8);
                }
                sum
            }
        })
    }
}

impl ScalarUDFImpl for Capped {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.inner.schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    #[allow(deprecated)]
    fn is_nullable(&self, args: &[Expr], schema: &dyn ExprSchema) -> bool {
        self.inner.is_nullable(args, schema)
    }

    fn is_strict(&self) -> bool {
        self.inner.is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytes = self.bytes(&args)?;
        if bytes > CALL_BYTES {
            return exec_err!(
                "{}() would make {bytes} bytes {REFUSED}; the limit is {} MiB",
                self.inner.name(),
                CALL_BYTES >> 20
            );
        }
        self.inner.invoke_with_args(args)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.inner.simplify(args, info)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(sql: &str) -> Result<Vec<arrow::array::RecordBatch>> {
        let ctx = SessionContext::new();
        register(&ctx)?;
        ctx.sql(sql).await?.collect().await
    }

    #[tokio::test]
    async fn a_call_past_the_limit_is_refused_by_name_and_one_within_it_answers() {
        for (sql, name) in [
            ("SELECT repeat('x', 1000000000)", "repeat"),
            ("SELECT lpad('x', 1000000000)", "lpad"),
            ("SELECT rpad('x', 1000000000, 'y')", "rpad"),
            ("SELECT array_repeat(1, 1000000000)", "array_repeat"),
            ("SELECT range(1000000000)", "range"),
            ("SELECT generate_series(1, 1000000000)", "generate_series"),
        ] {
            let Err(err) = run(sql).await else {
                panic!("{sql} answered");
            };
            let err = err.to_string();
            assert!(
                err.contains(&format!("{name}() would make"))
                    && err.contains("the limit is 64 MiB"),
                "{sql}: {err}"
            );
        }
        // 1,000 rows of 40 KB each: 40 MB, under the limit; a constant of 8 KB.
        let ok = run(
            "SELECT length(repeat('abcd', 10000 + value % 2)) AS n, repeat('ab', 4000) AS s \
             FROM generate_series(1, 1000)",
        )
        .await
        .unwrap();
        assert_eq!(ok.iter().map(|b| b.num_rows()).sum::<usize>(), 1000);
        // A constant of 40 KB, repeated for a batch of 8,192 rows: 328 MB.
        let Err(err) = run("SELECT repeat('abcd', 10000) FROM generate_series(1, 3)").await else {
            panic!("a constant of 40 KB answered");
        };
        assert!(
            err.to_string()
                .contains("repeat() would make 327680000 bytes"),
            "{err}"
        );
        // A column of counts: the sum over the call's rows is what counts (4 MB a row here,
        // past the limit at 17 rows).
        let Err(err) =
            run("SELECT repeat('abcd', 1000000 + value % 2) FROM generate_series(1, 1000)").await
        else {
            panic!("a column of 4 MB strings over 1,000 rows answered");
        };
        assert!(err.to_string().contains("repeat() would make"), "{err}");
    }
}
