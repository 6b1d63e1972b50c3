//! Work done every so often beside the decision path: the policy and share refreshers, the
//! near-limit reports. One tick at a time (a slow one delays the next, never piles up).

use std::future::Future;
use std::time::Duration;

/// Spawns a task that runs `tick()` to completion at once and then every `every`, until
/// the task is aborted. A tick that overruns `every` delays the next rather than bunching
/// the missed ones.
pub fn spawn_every<F, Fut>(every: Duration, mut tick: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            tick().await;
        }
    })
}
