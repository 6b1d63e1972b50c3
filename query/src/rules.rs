//! The two shapes of the crate's own optimizer rules, each written once: a logical rule that
//! rewrites aggregations ([`AggregateRule`]), and a physical rule that replaces plan nodes
//! ([`NodeRule`]), both bottom up. The rules themselves are the functions they are made of,
//! in [`crate::pack`], [`crate::indicator`], [`crate::pruning`] and [`crate::yielding`].

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::logical_expr::{Aggregate, LogicalPlan};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

/// An optimizer rule that rewrites each `Aggregate` of a plan, bottom up, into the plan
/// `rewrite` makes of it (`None`: it stays as it is). The crate's rules on aggregations are
/// made so: [`crate::pack::PACK_GROUP_KEYS`] and
/// [`crate::indicator::COUNT_INDICATORS`].
#[derive(Debug, Clone, Copy)]
pub struct AggregateRule {
    pub(crate) name: &'static str,
    pub(crate) rewrite: fn(&Aggregate) -> Result<Option<LogicalPlan>>,
}

impl OptimizerRule for AggregateRule {
    fn name(&self) -> &str {
        self.name
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = plan else {
            return Ok(Transformed::no(plan));
        };
        match (self.rewrite)(&agg)? {
            Some(plan) => Ok(Transformed::yes(plan)),
            None => Ok(Transformed::no(LogicalPlan::Aggregate(agg))),
        }
    }
}

/// A node of a physical plan.
type Plan = Arc<dyn ExecutionPlan>;

/// A physical optimizer rule that replaces each node of a plan, bottom up, with the node
/// `replace` makes of it (`None`: it stays as it is). The schema of the plan is unchanged
/// (DataFusion checks it after the rule).
#[derive(Debug, Clone, Copy)]
pub struct NodeRule {
    pub(crate) name: &'static str,
    pub(crate) replace: fn(&Plan) -> Option<Plan>,
}

impl PhysicalOptimizerRule for NodeRule {
    fn optimize(&self, plan: Plan, _config: &ConfigOptions) -> Result<Plan> {
        plan.transform_up(|node| {
            Ok(match (self.replace)(&node) {
                Some(new) => Transformed::yes(new),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        self.name
    }

    fn schema_check(&self) -> bool {
        true
    }
}
