//! Every operator of a plan yields to the runtime now and then, so a query that is stopped
//! (its time limit, its client gone, a PostgreSQL cancel) stops at once and frees its memory.
//!
//! Dropping a query's stream aborts the tasks running its plan, but a task only notices at
//! its next yield, and DataFusion's own `EnsureCooperative` makes only the leaves yield. An
//! operator that makes many batches of one input batch (a nested loop or cross join, an
//! unnest, a hash join's probe with a hot key) never polls its input again for as long as it
//! has output, and so never yields: a cross join answered 408 and ran on, growing, until the
//! process was killed. This rule wraps every inner operator in a [`CooperativeExec`], which
//! spends the task's cooperative budget per batch and yields when it is spent (128 batches):
//! one check per batch (`verdict-bench query` keeps every report against DuckDB with it).

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coop::CooperativeExec;

use crate::rules::NodeRule;

/// See the module documentation.
pub const YIELD_EVERYWHERE: NodeRule = NodeRule {
    name: "verdict_yield_everywhere",
    replace: |node| {
        let inner = !node.children().is_empty();
        let wrapped = node.is::<CooperativeExec>();
        (inner && !wrapped)
            .then(|| Arc::new(CooperativeExec::new(Arc::clone(node))) as Arc<dyn ExecutionPlan>)
    },
};
