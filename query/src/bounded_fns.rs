//! Every function that can make a value larger than its arguments is bounded per call. A
//! function's result is allocated outside the memory pool (an operator reserves memory for
//! what it keeps, not for what a function returns), so `repeat('x', 1000000000)` took 4 GB
//! of a process whose queries were each held to 1 GiB, and `array_resize` or
//! `regexp_replace` built gigabytes in one call, before any count could stop them.
//!
//! Each scalar function of DataFusion's registry is classified ([`GROWTH`], checked against
//! the registry by a test, so a function a new DataFusion adds is classified before it is
//! served):
//!
//! - [`Growth::Estimated`]: the size of its result follows from its arguments and can be
//!   any multiple of them (`repeat`, `lpad`, `rpad`, `array_repeat`, `array_resize`, `range`,
//!   `generate_series`, `replace`, `regexp_replace`, `array_to_string`, `array_replace*`).
//!   The call is refused before it runs when it would make more than [`CALL_BYTES`] (a batch
//!   of rows; a call of constants, folded into the plan and then repeated for every row of a
//!   batch, counts as a batch of its value).
//! - [`Growth::Linear`]: its result is at most a few times its arguments (`concat`,
//!   `upper`, `array_concat`, `translate`, …). It runs, and its result is refused past
//!   [`CALL_BYTES`]; so a chain of them (`concat(x, x)` inside itself) is stopped at the
//!   first call past the limit, not at the end of the chain.
//! - [`Growth::None`]: a fixed-size result (numbers, times, hashes), or one that shares its
//!   arguments' buffers (`get_field`, `struct`): left as DataFusion registers it.
//!
//! Every bounded call first checks the memory count of the query it runs for
//! ([`crate::memory`]): a query already past its limit stops at its next function call,
//! not at its next batch. Aggregates' states ([`AGGREGATES`]) are counted by the allocator
//! as they grow. Every refusal names the function and the limit.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::compute::kernels::length::length;
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{ExprSchema, Result, ScalarValue, exec_err};
use datafusion::config::ConfigOptions;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::preimage::PreimageResult;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, StructFieldMapping,
};
use datafusion::prelude::SessionContext;

/// What every refusal of a bounded function says (and how the engine knows it).
pub const REFUSED: &str = "in one call (a call of constants counts once for each row of a batch)";

/// The most bytes one call of a bounded function may make: 64 MiB.
pub const CALL_BYTES: u64 = 64 << 20;

/// How a function's output size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Estimate {
    /// `repeat(s, n)`: the bytes of `s`, `n` times.
    Repeat,
    /// `lpad(s, n[, fill])`, `rpad`: `n` characters, 4 bytes each at most.
    Pad,
    /// `array_repeat(x, n)`, `array_resize(list, n[, x])`: `n` elements (8 bytes each at
    /// least).
    Elements,
    /// `range(stop)`, `range(start, stop[, step])`, `generate_series`: the elements, 8
    /// bytes each.
    Series,
    /// `replace(s, from, to)`, `regexp_replace(s, pattern, to[, flags])`: every position of
    /// `s` replaced by `to` (which may name the match twice over: `$0$0`).
    Replace,
    /// `array_to_string(list, separator)`: a separator between every two elements.
    Join,
    /// `array_replace*(list, from, to)`: every element replaced by `to`.
    ReplaceElements,
}

/// How much larger than its arguments a function's result can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Growth {
    /// Any multiple: estimated before the call.
    Estimated(Estimate),
    /// A few times its arguments at most: its result is checked after the call.
    Linear,
    /// A fixed size, or its arguments' own buffers.
    None,
}

/// Every scalar function of the registry (by its name; aliases follow it), and how it grows.
pub const GROWTH: &[(&str, Growth)] = &[
    ("repeat", Growth::Estimated(Estimate::Repeat)),
    ("lpad", Growth::Estimated(Estimate::Pad)),
    ("rpad", Growth::Estimated(Estimate::Pad)),
    ("array_repeat", Growth::Estimated(Estimate::Elements)),
    ("array_resize", Growth::Estimated(Estimate::Elements)),
    ("range", Growth::Estimated(Estimate::Series)),
    ("generate_series", Growth::Estimated(Estimate::Series)),
    ("replace", Growth::Estimated(Estimate::Replace)),
    ("regexp_replace", Growth::Estimated(Estimate::Replace)),
    ("array_to_string", Growth::Estimated(Estimate::Join)),
    (
        "array_replace",
        Growth::Estimated(Estimate::ReplaceElements),
    ),
    (
        "array_replace_n",
        Growth::Estimated(Estimate::ReplaceElements),
    ),
    (
        "array_replace_all",
        Growth::Estimated(Estimate::ReplaceElements),
    ),
];

/// The functions whose result is at most a few times their arguments.
pub const LINEAR: &[&str] = &[
    "array_any_value",
    "array_append",
    "array_compact",
    "array_concat",
    "array_distinct",
    "array_element",
    "array_except",
    "array_intersect",
    "array_max",
    "array_min",
    "array_normalize",
    "array_pop_back",
    "array_pop_front",
    "array_positions",
    "array_prepend",
    "array_remove",
    "array_remove_all",
    "array_remove_n",
    "array_reverse",
    "array_scale",
    "array_slice",
    "array_sort",
    "array_add",
    "array_subtract",
    "array_union",
    "arrays_zip",
    "arrow_cast",
    "arrow_try_cast",
    "arrow_field",
    "arrow_metadata",
    "btrim",
    "cast_to_type",
    "try_cast_to_type",
    "coalesce",
    "concat",
    "concat_ws",
    "decode",
    "encode",
    "flatten",
    "greatest",
    "initcap",
    "least",
    "left",
    "lower",
    "ltrim",
    "make_array",
    "map",
    "map_entries",
    "map_extract",
    "map_keys",
    "map_values",
    "nullif",
    "nvl",
    "nvl2",
    "overlay",
    "regexp_match",
    "reverse",
    "right",
    "rtrim",
    "split_part",
    "string_to_array",
    "substr",
    "substr_index",
    "translate",
    "union_extract",
    "upper",
    "to_char",
    "input_file_name",
    "array_dims",
];

/// The functions with a fixed-size result, or one that shares their arguments' buffers.
pub const FIXED: &[&str] = &[
    "abs",
    "acos",
    "acosh",
    "array_distance",
    "array_empty",
    "array_has",
    "array_has_all",
    "array_has_any",
    "array_length",
    "array_ndims",
    "array_position",
    "array_avg",
    "array_product",
    "array_sum",
    "arrays_overlap",
    "arrow_typeof",
    "ascii",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "bit_length",
    "cardinality",
    "cbrt",
    "ceil",
    "char_length",
    "character_length",
    "chr",
    "contains",
    "cos",
    "cosh",
    "cosine_distance",
    "cot",
    "current_date",
    "current_time",
    "current_timestamp",
    "date_bin",
    "date_part",
    "date_trunc",
    "degrees",
    "digest",
    "inner_product",
    "ends_with",
    "exp",
    "factorial",
    "file_row_index",
    "find_in_set",
    "floor",
    "from_unixtime",
    "gcd",
    "instr",
    "isnan",
    "iszero",
    "lcm",
    "length",
    "levenshtein",
    "ln",
    "log",
    "log10",
    "log2",
    "make_date",
    "make_time",
    "md5",
    "nanvl",
    "now",
    "octet_length",
    "pi",
    "power",
    "radians",
    "random",
    "regexp_count",
    "regexp_instr",
    "regexp_like",
    "round",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "signum",
    "sin",
    "sinh",
    "sqrt",
    "starts_with",
    "strpos",
    "tan",
    "tanh",
    "to_date",
    "to_hex",
    "to_local_time",
    "to_time",
    "to_timestamp",
    "to_timestamp_micros",
    "to_timestamp_millis",
    "to_timestamp_nanos",
    "to_timestamp_seconds",
    "to_unixtime",
    "today",
    "trunc",
    "union_tag",
    "uuid",
    "version",
    "get_field",
    "named_struct",
    "struct",
    "with_metadata",
    "empty",
    "position",
];

/// Aggregates whose state grows with their input (`array_agg` of wide strings without a
/// GROUP BY reached 8 GB): counted by the allocator as they grow ([`crate::memory`]); the
/// others keep a fixed-size state.
pub const AGGREGATES: &[&str] = &[
    "array_agg",
    "string_agg",
    "median",
    "percentile_cont",
    "nth_value",
    "count",
    "approx_percentile_cont",
    "approx_percentile_cont_with_weight",
    "approx_median",
    "approx_distinct",
    "first_value",
    "last_value",
];

/// Aggregates with a fixed-size state.
pub const FIXED_AGGREGATES: &[&str] = &[
    "any_value",
    "avg",
    "bit_and",
    "bit_or",
    "bit_xor",
    "bool_and",
    "bool_or",
    "corr",
    "covar_pop",
    "covar_samp",
    "grouping",
    "max",
    "min",
    "regr_avgx",
    "regr_avgy",
    "regr_count",
    "regr_intercept",
    "regr_r2",
    "regr_slope",
    "regr_sxx",
    "regr_sxy",
    "regr_syy",
    "stddev",
    "stddev_pop",
    "sum",
    "var",
    "var_pop",
];

/// How `name` grows, if it is classified.
pub fn growth(name: &str) -> Option<Growth> {
    if let Some((_, g)) = GROWTH.iter().find(|(n, _)| *n == name) {
        return Some(*g);
    }
    if LINEAR.contains(&name) {
        return Some(Growth::Linear);
    }
    FIXED.contains(&name).then_some(Growth::None)
}

/// Replaces every function of `ctx` that can grow a value by its bounded self.
pub fn register(ctx: &SessionContext) -> Result<()> {
    let state = ctx.state();
    let mut names: Vec<&String> = state.scalar_functions().keys().collect();
    names.sort();
    for name in names {
        let udf = &state.scalar_functions()[name];
        // Once per function, under its own name (its aliases follow it).
        if udf.name() != name.as_str() {
            continue;
        }
        let estimate = match growth(name) {
            Some(Growth::Estimated(e)) => Some(e),
            Some(Growth::Linear) => None,
            Some(Growth::None) | None => continue,
        };
        ctx.register_udf(ScalarUDF::new_from_impl(Capped {
            inner: Arc::clone(udf.inner()),
            estimate,
        }));
    }
    Ok(())
}

/// A function behind a check of the bytes its call would make (`estimate`) or made.
#[derive(Debug)]
struct Capped {
    inner: Arc<dyn ScalarUDFImpl>,
    estimate: Option<Estimate>,
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

/// The byte length of argument `i` per row (its elements for a list; 0 for null, a missing
/// argument or one of a fixed-size type).
fn byte_lengths(args: &ScalarFunctionArgs, i: usize) -> Result<Vec<i64>> {
    let Some(arg) = args.args.get(i) else {
        return Ok(vec![0; args.number_rows]);
    };
    let array: ArrayRef = arg.to_array(args.number_rows)?;
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
    fn bytes(&self, estimate: Estimate, args: &ScalarFunctionArgs) -> Result<u64> {
        let made = self.made(estimate, args)?;
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
    fn made(&self, estimate: Estimate, args: &ScalarFunctionArgs) -> Result<u64> {
        let clamp = |x: i64| u64::try_from(x).unwrap_or(0);
        Ok(match estimate {
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
            Estimate::Elements => {
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
            Estimate::Replace => {
                // At most one match per position (and one at the end), each replaced by `to`
                // with its references to the match written out: (len + 1) × (2 × to + 1).
                let (s, to) = (byte_lengths(args, 0)?, byte_lengths(args, 2)?);
                s.iter().zip(&to).fold(0u64, |sum, (s, to)| {
                    let per = clamp(*to).saturating_mul(2).saturating_add(1);
                    sum.saturating_add(clamp(*s).saturating_add(1).saturating_mul(per))
                })
            }
            Estimate::Join => {
                let (n, sep) = (byte_lengths(args, 0)?, byte_lengths(args, 1)?);
                n.iter().zip(&sep).fold(0u64, |sum, (n, sep)| {
                    sum.saturating_add(clamp(*n).saturating_mul(clamp(*sep)))
                })
            }
            Estimate::ReplaceElements => {
                let (n, to) = (byte_lengths(args, 0)?, byte_lengths(args, 2)?);
                n.iter().zip(&to).fold(0u64, |sum, (n, to)| {
                    sum.saturating_add(clamp(*n).saturating_mul(clamp(*to).max(8)))
                })
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
        if let Some(service) = crate::memory::current_state() {
            return Err(DataFusionError::ResourcesExhausted(if service {
                format!("{}: {}", crate::budget::BUDGET_EXHAUSTED, self.inner.name())
            } else {
                format!(
                    "the query's memory count is past its limit at {}()",
                    self.inner.name()
                )
            }));
        }
        if let Some(estimate) = self.estimate {
            let bytes = self.bytes(estimate, &args)?;
            if bytes > CALL_BYTES {
                return exec_err!(
                    "{}() would make {bytes} bytes {REFUSED}; the limit is {} MiB",
                    self.inner.name(),
                    CALL_BYTES >> 20
                );
            }
        }
        let out = self.inner.invoke_with_args(args)?;
        let made = match &out {
            ColumnarValue::Array(a) => a.get_array_memory_size(),
            ColumnarValue::Scalar(v) => v.size(),
        } as u64;
        if made > CALL_BYTES {
            return exec_err!(
                "{}() would make {made} bytes {REFUSED}; the limit is {} MiB",
                self.inner.name(),
                CALL_BYTES >> 20
            );
        }
        Ok(out)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.inner.simplify(args, info)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        self.inner.with_updated_config(config).map(|udf| {
            ScalarUDF::new_from_impl(Capped {
                inner: Arc::clone(udf.inner()),
                estimate: self.estimate,
            })
        })
    }

    fn conditional_arguments<'a>(
        &self,
        args: &'a [Expr],
    ) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.inner.conditional_arguments(args)
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> Result<Interval> {
        self.inner.evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> Result<Option<Vec<Interval>>> {
        self.inner.propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.preserves_lex_ordering(inputs)
    }

    fn strictly_order_preserving(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.strictly_order_preserving(inputs)
    }

    fn preimage(
        &self,
        args: &[Expr],
        lit_expr: &Expr,
        info: &SimplifyContext,
    ) -> Result<PreimageResult> {
        self.inner.preimage(args, lit_expr, info)
    }

    fn struct_field_mapping(
        &self,
        literal_args: &[Option<ScalarValue>],
    ) -> Option<StructFieldMapping> {
        self.inner.struct_field_mapping(literal_args)
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.inner.placement(args)
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

    #[test]
    fn every_function_of_the_registry_is_classified_by_how_it_grows() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut unclassified: Vec<&str> = state
            .scalar_functions()
            .values()
            .map(|f| f.name())
            .filter(|name| growth(name).is_none())
            .collect();
        unclassified.sort_unstable();
        unclassified.dedup();
        assert!(
            unclassified.is_empty(),
            "scalar functions not classified in GROWTH, LINEAR or FIXED: {unclassified:?}"
        );
        let mut aggregates: Vec<&str> = state
            .aggregate_functions()
            .values()
            .map(|f| f.name())
            .filter(|name| !AGGREGATES.contains(name) && !FIXED_AGGREGATES.contains(name))
            .collect();
        aggregates.sort_unstable();
        aggregates.dedup();
        assert!(
            aggregates.is_empty(),
            "aggregates not classified in AGGREGATES or FIXED_AGGREGATES: {aggregates:?}"
        );
        // And every name classified is a function there is (the lists follow the registry).
        let known = |name: &str| {
            state.scalar_functions().contains_key(name)
                || state.aggregate_functions().contains_key(name)
        };
        let listed = GROWTH.iter().map(|(n, _)| *n).chain(LINEAR.iter().copied());
        let listed = listed
            .chain(FIXED.iter().copied())
            .chain(AGGREGATES.iter().copied());
        for name in listed.chain(FIXED_AGGREGATES.iter().copied()) {
            assert!(known(name), "{name} is classified but not registered");
        }
    }

    #[tokio::test]
    async fn a_call_past_the_limit_is_refused_by_name_and_one_within_it_answers() {
        for (sql, name) in [
            (
                "SELECT array_resize(make_array(1), 1000000000)",
                "array_resize",
            ),
            (
                "SELECT regexp_replace(repeat('x', 8000), 'x', repeat('y', 8000), 'g')",
                "regexp_replace",
            ),
            (
                "SELECT replace(repeat('ab', 4000), 'a', repeat('y', 8000))",
                "replace",
            ),
            (
                "SELECT array_to_string(array_repeat(value, 4000000), repeat('-', 100)) \
                 FROM generate_series(1, 1)",
                "array_to_string",
            ),
            (
                "SELECT array_replace_all(array_repeat(CAST(value AS VARCHAR), 4000000), '1', \
                 repeat('y', 100)) FROM generate_series(1, 1)",
                "array_replace_all",
            ),
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
        // A linear function is checked after its call: a string doubled by concat twelve
        // times over a batch of 8,192 rows passes 64 MiB at the ninth.
        let mut sql = "WITH t0 AS (SELECT repeat('x', 100 + value % 2) AS s \
                       FROM generate_series(1, 8192))"
            .to_owned();
        for i in 1..=12 {
            sql += &format!(", t{i} AS (SELECT concat(s, s) AS s FROM t{})", i - 1);
        }
        sql += " SELECT SUM(length(s)) FROM t12";
        let Err(err) = run(&sql).await else {
            panic!("twelve doublings answered");
        };
        assert!(err.to_string().contains("concat() would make"), "{err}");
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
