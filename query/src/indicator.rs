//! Sums of indicators counted with a filter: an optimizer rule that rewrites
//! `SUM(CASE WHEN p THEN 1 ELSE 0 END)` in a grouped aggregation to
//! `COUNT(*) FILTER (WHERE p)`, under the original name.
//!
//! The reports count decisions of a kind this way (`SUM(CASE WHEN source = 1 THEN 1 ELSE 0
//! END)`), as analysts' SQL does. DataFusion evaluates such a `CASE` per row into a new
//! column of ones and zeros (a `zip` of two literals under the condition's mask) and adds it
//! up; the filtered count only evaluates `p` and counts the rows it selects. In a group there
//! is at least one row, so both give the same number (a row where `p` is null counts in
//! neither), of the same type, `Int64`. Without `GROUP BY` they differ on an empty input
//! (`NULL` against 0), so a global aggregation is left alone, and so is a sum that is
//! `DISTINCT`, ordered or filtered already, or of another type.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::logical_expr::expr::{AggregateFunction, AggregateFunctionParams, Alias, Case};
use datafusion::logical_expr::utils::COUNT_STAR_EXPANSION;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, LogicalPlan};

use crate::rules::AggregateRule;

/// The optimizer rule; see the module documentation.
pub const COUNT_INDICATORS: AggregateRule = AggregateRule {
    name: "verdict_count_indicators",
    rewrite: count_indicators,
};

/// `agg` with its sums of indicators counted with a filter, if it groups and has any.
fn count_indicators(agg: &Aggregate) -> Result<Option<LogicalPlan>> {
    if agg.group_expr.is_empty() {
        return Ok(None);
    }
    let input = agg.input.schema();
    let mut changed = false;
    let mut aggr_expr = Vec::with_capacity(agg.aggr_expr.len());
    for e in &agg.aggr_expr {
        let rewritten = match e {
            Expr::Alias(alias) => counted(&alias.expr, input)?.map(|c| {
                Expr::Alias(Alias {
                    expr: Box::new(c),
                    ..alias.clone()
                })
            }),
            _ => counted(e, input)?.map(|c| c.alias(e.schema_name().to_string())),
        };
        changed |= rewritten.is_some();
        aggr_expr.push(rewritten.unwrap_or_else(|| e.clone()));
    }
    if !changed {
        return Ok(None);
    }
    Ok(Some(LogicalPlan::Aggregate(Aggregate::try_new(
        Arc::clone(&agg.input),
        agg.group_expr.clone(),
        aggr_expr,
    )?)))
}

/// `COUNT(*) FILTER (WHERE p)` for `e` = `SUM(CASE WHEN p THEN 1 ELSE 0 END)` of type
/// `Int64`, else `None`.
fn counted(e: &Expr, input: &DFSchema) -> Result<Option<Expr>> {
    let Expr::AggregateFunction(AggregateFunction {
        func,
        params:
            AggregateFunctionParams {
                args,
                distinct: false,
                filter: None,
                order_by,
                null_treatment: None,
            },
    }) = e
    else {
        return Ok(None);
    };
    if func.name() != "sum" || !order_by.is_empty() || args.len() != 1 {
        return Ok(None);
    }
    let Some(when) = indicator(&args[0]) else {
        return Ok(None);
    };
    if e.get_type(input)? != DataType::Int64 {
        return Ok(None);
    }
    Ok(Some(Expr::AggregateFunction(AggregateFunction::new_udf(
        count_udaf(),
        vec![Expr::Literal(COUNT_STAR_EXPANSION, None)],
        false,
        Some(Box::new(when.clone())),
        vec![],
        None,
    ))))
}

/// `p` for `e` = `CASE WHEN p THEN 1 ELSE 0 END` (integer literals, possibly cast to
/// another integer type).
fn indicator(e: &Expr) -> Option<&Expr> {
    match e {
        Expr::Cast(c) if c.field.data_type().is_integer() => indicator(&c.expr),
        Expr::Case(Case {
            expr: None,
            when_then_expr,
            else_expr: Some(otherwise),
        }) if when_then_expr.len() == 1
            && integer_literal(&when_then_expr[0].1) == Some(1)
            && integer_literal(otherwise) == Some(0) =>
        {
            Some(&when_then_expr[0].0)
        }
        _ => None,
    }
}

/// The value of an integer literal (possibly cast to an integer type).
fn integer_literal(e: &Expr) -> Option<i128> {
    match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Int8(Some(v)) => Some(i128::from(*v)),
            ScalarValue::Int16(Some(v)) => Some(i128::from(*v)),
            ScalarValue::Int32(Some(v)) => Some(i128::from(*v)),
            ScalarValue::Int64(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt8(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt16(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt32(Some(v)) => Some(i128::from(*v)),
            ScalarValue::UInt64(Some(v)) => Some(i128::from(*v)),
            _ => None,
        },
        Expr::Cast(c) if c.field.data_type().is_integer() => integer_literal(&c.expr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use arrow::array::{Int64Array, UInt8Array};
    use arrow::datatypes::{Field, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    /// A session over `t(g, s)` with or without the rule.
    fn session(with_rule: bool) -> SessionContext {
        let ctx = SessionContext::new();
        if with_rule {
            ctx.add_optimizer_rule(Arc::new(COUNT_INDICATORS));
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("s", DataType::UInt8, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 1, 2, 2, 3])),
                Arc::new(UInt8Array::from(vec![
                    Some(1),
                    Some(2),
                    None,
                    Some(2),
                    Some(2),
                    None,
                ])),
            ],
        )
        .unwrap();
        let table = MemTable::try_new(schema, vec![vec![batch]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        ctx
    }

    async fn rows(ctx: &SessionContext, sql: &str) -> (Vec<String>, String) {
        let df = ctx.sql(sql).await.unwrap();
        let names = df
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        let batches = df.collect().await.unwrap();
        (
            names,
            arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string(),
        )
    }

    async fn plan(ctx: &SessionContext, sql: &str) -> String {
        let df = ctx.sql(sql).await.unwrap();
        df.into_optimized_plan()
            .unwrap()
            .display_indent()
            .to_string()
    }

    #[tokio::test]
    async fn same_rows_and_schema_with_and_without_the_rule() {
        let queries = [
            // Named, compared in HAVING, used in an expression; a null condition counts 0.
            "SELECT g, SUM(CASE WHEN s = 2 THEN 1 ELSE 0 END) AS twos, \
               CAST(SUM(CASE WHEN s IN (1, 2) THEN 1 ELSE 0 END) AS DOUBLE) / COUNT(*) AS share \
             FROM t GROUP BY g HAVING SUM(CASE WHEN s IN (1, 2) THEN 1 ELSE 0 END) > 0 ORDER BY g",
            // Unnamed: the column keeps the sum's name.
            "SELECT g, SUM(CASE WHEN s IS NULL THEN 1 ELSE 0 END) FROM t GROUP BY g ORDER BY g",
            // A group with no row where the condition holds gives 0, not NULL.
            "SELECT g, SUM(CASE WHEN s = 1 THEN 1 ELSE 0 END) AS ones FROM t GROUP BY g ORDER BY g",
        ];
        for sql in queries {
            let plain = rows(&session(false), sql).await;
            let counted = rows(&session(true), sql).await;
            assert_eq!(plain, counted, "{sql}");
        }
        let (_, ones) = rows(
            &session(true),
            "SELECT g, SUM(CASE WHEN s = 1 THEN 1 ELSE 0 END) AS ones FROM t GROUP BY g ORDER BY g",
        )
        .await;
        assert!(ones.contains("| 2 | 0    |"), "{ones}");
    }

    #[tokio::test]
    async fn counts_with_a_filter() {
        let sql = "SELECT g, SUM(CASE WHEN s = 2 THEN 1 ELSE 0 END) AS twos FROM t GROUP BY g";
        let plan = plan(&session(true), sql).await;
        // The count, under the sum's name, which the projection above refers to.
        assert!(
            plan.contains(
                "aggr=[[count(Int64(1)) FILTER (WHERE t.s = UInt8(2)) AS sum(CASE WHEN t.s"
            ),
            "{plan}"
        );
    }

    #[tokio::test]
    async fn leaves_other_sums_alone() {
        for sql in [
            // No GROUP BY: an empty input sums to NULL, but counts 0.
            "SELECT SUM(CASE WHEN s = 2 THEN 1 ELSE 0 END) FROM t",
            // Not ones and zeros.
            "SELECT g, SUM(CASE WHEN s = 2 THEN 2 ELSE 0 END) FROM t GROUP BY g",
            "SELECT g, SUM(CASE WHEN s = 2 THEN 1 ELSE 1 END) FROM t GROUP BY g",
            "SELECT g, SUM(CASE WHEN s = 2 THEN 1.0 ELSE 0.0 END) FROM t GROUP BY g",
            // Filtered or distinct already.
            "SELECT g, SUM(CASE WHEN s = 2 THEN 1 ELSE 0 END) FILTER (WHERE g > 1) FROM t GROUP BY g",
            "SELECT g, SUM(DISTINCT CASE WHEN s = 2 THEN 1 ELSE 0 END) FROM t GROUP BY g",
        ] {
            let plan = plan(&session(true), sql).await;
            assert!(!plan.contains("count(Int64(1)) FILTER"), "{sql}\n{plan}");
        }
    }
}
