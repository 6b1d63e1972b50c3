//! Integer arithmetic that overflows is an error that says so (`invalid_query`, SQLSTATE
//! 22003), not a wrapped value: DataFusion plans `+`, `-` and `*` to wrap on overflow
//! (`SELECT 9223372036854775807 + 1` answered -9223372036854775808). This rule turns on the
//! checked form of every such operator in the plan's projections and filters.
//!
//! Aggregates (`SUM` over Int64) still wrap: their accumulators are DataFusion's own.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use crate::rules::NodeRule;

/// `expr` with every integer `+`, `-` and `*` checked; `None` when it has none.
fn checked(expr: &Arc<dyn PhysicalExpr>) -> Option<Arc<dyn PhysicalExpr>> {
    let out = Arc::clone(expr)
        .transform_up(|e| {
            let Some(b) = e.downcast_ref::<BinaryExpr>() else {
                return Ok(Transformed::no(e));
            };
            if !matches!(
                b.op(),
                Operator::Plus | Operator::Minus | Operator::Multiply
            ) {
                return Ok(Transformed::no(e));
            }
            let checked = BinaryExpr::new(Arc::clone(b.left()), *b.op(), Arc::clone(b.right()))
                .with_fail_on_overflow(true);
            Ok(Transformed::yes(Arc::new(checked) as Arc<dyn PhysicalExpr>))
        })
        .ok()?;
    out.transformed.then_some(out.data)
}

/// See the module documentation.
pub const OVERFLOW_IS_AN_ERROR: NodeRule = NodeRule {
    name: "verdict_overflow_is_an_error",
    replace: |node| {
        if let Some(p) = node.downcast_ref::<ProjectionExec>() {
            let mut changed = false;
            let exprs: Vec<ProjectionExpr> = p
                .expr()
                .iter()
                .map(|e| match checked(&e.expr) {
                    Some(expr) => {
                        changed = true;
                        ProjectionExpr {
                            expr,
                            alias: e.alias.clone(),
                        }
                    }
                    None => e.clone(),
                })
                .collect();
            if !changed {
                return None;
            }
            let new = ProjectionExec::try_new(exprs, Arc::clone(p.input())).ok()?;
            return Some(Arc::new(new) as Arc<dyn ExecutionPlan>);
        }
        let f = node.downcast_ref::<FilterExec>()?;
        let predicate = checked(f.predicate())?;
        let new = FilterExecBuilder::from(f)
            .with_predicate(predicate)
            .build()
            .ok()?;
        Some(Arc::new(new) as Arc<dyn ExecutionPlan>)
    },
};

#[cfg(test)]
mod tests {
    use datafusion::execution::session_state::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    #[tokio::test]
    async fn an_overflow_is_an_error_and_arithmetic_within_range_answers() {
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new())
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(OVERFLOW_IS_AN_ERROR))
            .build();
        let ctx = SessionContext::new_with_state(state);
        for sql in [
            "SELECT CAST(9223372036854775807 AS BIGINT) + value AS v FROM generate_series(1, 2)",
            "SELECT value FROM generate_series(1, 2) WHERE value * 9223372036854775807 > 0",
        ] {
            let err = ctx.sql(sql).await.unwrap().collect().await.unwrap_err();
            assert!(err.to_string().contains("Overflow"), "{sql}: {err}");
        }
        let ok = ctx
            .sql("SELECT value * 2 - 1 AS v FROM generate_series(1, 3)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(ok.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    }
}
