//! The shards of the counter store and the connections each shard's lanes call.
//!
//! Outside a cluster there is one shard, the server, and its lanes call the store's pool.
//! In a Redis Cluster each master is a shard, and its lanes call connections of their own
//! to that master, not fred's cluster client: that client reconnects as a whole when one
//! master dies, so every shard's calls would wait for the failover. A watcher asks the
//! cluster who serves each shard's slots (every second, and at once when a call fails) and,
//! when a replica has been promoted, connects to it and swaps it in; no restart.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::sync::Notify;
use verdict_limiter::StoreError;

/// The deadline of each command while connecting: the handshakes and `SCRIPT LOAD`.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(1);

/// The masters of a cluster as shards: which one owns each slot, as the cluster was when
/// the store connected. A failover keeps a shard's slots together (the promoted replica
/// takes them all), so the map stays true.
pub(crate) struct Shards {
    pub(crate) count: usize,
    /// By slot, the shard owning it (empty outside a cluster).
    of_slot: Box<[u8]>,
}

impl Shards {
    pub(crate) fn one() -> Self {
        Self {
            count: 1,
            of_slot: Box::default(),
        }
    }

    /// The shards of the cluster `client` is connected to, and each one's master address.
    pub(crate) fn of(client: &Client) -> Result<(Self, Vec<String>), StoreError> {
        let routing = client.cached_cluster_state().ok_or_else(|| {
            StoreError::backend("connected to the cluster, but its slots are not known")
        })?;
        let masters = routing.unique_primary_nodes();
        let mut of_slot = vec![0u8; 16_384].into_boxed_slice();
        for range in routing.slots() {
            let shard = masters
                .iter()
                .position(|m| *m == range.primary)
                .and_then(|i| u8::try_from(i).ok())
                .ok_or_else(|| StoreError::backend("a cluster of more than 256 masters"))?;
            for slot in range.start..=range.end.min(16_383) {
                of_slot[usize::from(slot)] = shard;
            }
        }
        let addresses = masters
            .iter()
            .map(|m| format!("{}:{}", m.host, m.port))
            .collect();
        let shards = Self {
            count: masters.len().max(1),
            of_slot,
        };
        Ok((shards, addresses))
    }

    pub(crate) fn of_slot(&self, slot: u16) -> usize {
        self.of_slot
            .get(usize::from(slot))
            .map_or(0, |&s| usize::from(s))
    }

    /// A slot of `shard` (its first), to ask the cluster who serves it now.
    fn a_slot_of(&self, shard: usize) -> Option<u16> {
        self.of_slot
            .iter()
            .position(|&s| usize::from(s) == shard)
            .and_then(|i| u16::try_from(i).ok())
    }
}

/// The connections one shard's lanes call, to one server.
pub(crate) struct Master {
    address: String,
    pool: Pool,
}

/// Each shard's current master.
pub(crate) struct ShardClients {
    masters: Vec<ArcSwap<Master>>,
    /// Rung by a lane whose call failed: the watcher looks at once.
    pub(crate) look: Notify,
}

impl ShardClients {
    /// One shard served by `pool` (outside a cluster).
    pub(crate) fn single(pool: Pool) -> Self {
        Self {
            masters: vec![ArcSwap::from_pointee(Master {
                address: String::new(),
                pool,
            })],
            look: Notify::new(),
        }
    }

    /// A client of `shard`'s master, the `lane`-th of its connections.
    pub(crate) fn client(&self, shard: usize, lane: usize) -> Client {
        let m = self.masters[shard].load();
        let clients = m.pool.clients();
        clients[lane % clients.len()].clone()
    }
}

/// How the store connects to one node.
#[derive(Clone)]
pub(crate) struct NodeSettings {
    pub(crate) connections: usize,
    pub(crate) timeout: Duration,
    pub(crate) script: Script,
}

/// A pool of `connections` to `address` (not cluster-aware), its script loaded, with the
/// decision deadline as its commands' deadline.
pub(crate) async fn connect_node(
    address: &str,
    settings: &NodeSettings,
) -> Result<Pool, StoreError> {
    let config = Config::from_url(&format!("redis://{address}")).map_err(StoreError::backend)?;
    let pool = build(config, settings.connections)?;
    ready(&pool, &settings.script, settings.timeout).await?;
    Ok(pool)
}

/// Connects `pool` and loads `script`, within [`SETUP_TIMEOUT`] in all;
/// then sets `timeout` as its commands' deadline.
pub(crate) async fn ready(
    pool: &Pool,
    script: &Script,
    timeout: Duration,
) -> Result<(), StoreError> {
    tokio::time::timeout(SETUP_TIMEOUT, async {
        pool.init().await.map_err(StoreError::backend)?;
        script.load(pool.next()).await.map_err(StoreError::backend)
    })
    .await
    .map_err(|_| StoreError::timeout(SETUP_TIMEOUT))??;
    set_deadline(pool, timeout);
    Ok(())
}

/// A pool with the settings every connection of the store has: setup commands get
/// [`SETUP_TIMEOUT`], one attempt per command, reconnects every 100 ms.
pub(crate) fn build(config: Config, connections: usize) -> Result<Pool, StoreError> {
    Builder::from_config(config)
        .with_performance_config(|p| {
            p.default_command_timeout = SETUP_TIMEOUT;
        })
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(500);
            c.max_command_attempts = 1;
        })
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build_pool(connections.max(1))
        .map_err(StoreError::backend)
}

/// From here fred's own deadline matches ours, so a call abandoned at the deadline is
/// dropped from its queue rather than sent late.
fn set_deadline(pool: &Pool, timeout: Duration) {
    for client in pool.clients() {
        let mut perf = client.perf_config();
        perf.default_command_timeout = timeout;
        client.update_perf_config(perf);
    }
}

/// Connects to each shard's master.
pub(crate) async fn cluster_clients(
    addresses: &[String],
    settings: &NodeSettings,
) -> Result<ShardClients, StoreError> {
    let mut masters = Vec::with_capacity(addresses.len());
    for address in addresses {
        let pool = connect_node(address, settings).await?;
        masters.push(ArcSwap::from_pointee(Master {
            address: address.clone(),
            pool,
        }));
    }
    Ok(ShardClients {
        masters,
        look: Notify::new(),
    })
}

/// Watches who serves each shard until the store is dropped.
pub(crate) fn spawn_watcher(
    clients: Weak<ShardClients>,
    shards: Arc<Shards>,
    settings: NodeSettings,
) {
    tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            let Some(c) = clients.upgrade() else { return };
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = c.look.notified() => {}
            }
            // At most ten looks a second, however many calls fail.
            let since = last.elapsed();
            if since < Duration::from_millis(100) {
                tokio::time::sleep(Duration::from_millis(100) - since).await;
            }
            last = Instant::now();
            look(&c, &shards, &settings).await;
        }
    });
}

/// Asks the cluster (any master that answers) who serves each shard's slots, and swaps in
/// a connection to each new master.
async fn look(clients: &ShardClients, shards: &Shards, settings: &NodeSettings) {
    let Some(ranges) = cluster_slots(clients).await else {
        return;
    };
    for (shard, current) in clients.masters.iter().enumerate() {
        let Some(slot) = shards.a_slot_of(shard) else {
            continue;
        };
        let Some((_, _, address)) = ranges.iter().find(|(a, b, _)| (*a..=*b).contains(&slot))
        else {
            continue;
        };
        if current.load().address == *address {
            continue;
        }
        match connect_node(address, settings).await {
            Ok(pool) => {
                let old = current.swap(Arc::new(Master {
                    address: address.clone(),
                    pool,
                }));
                tracing::info!(shard, from = %old.address, to = %address, "a shard's master changed; its lanes call the new one");
                let _ = old.pool.quit().await;
            }
            Err(e) => {
                tracing::warn!(shard, %address, error = %e, "cannot reach a shard's new master yet");
            }
        }
    }
}

/// `CLUSTER SLOTS` from the first master that answers within 250 ms: (start, end,
/// `host:port` of its master) per range.
async fn cluster_slots(clients: &ShardClients) -> Option<Vec<(u16, u16, String)>> {
    for m in &clients.masters {
        let client = m.load().pool.next().clone();
        let reply =
            tokio::time::timeout(Duration::from_millis(250), client.cluster_slots::<Value>()).await;
        if let Ok(Ok(value)) = reply
            && let Some(ranges) = parse_slots(value)
        {
            return Some(ranges);
        }
    }
    None
}

/// `CLUSTER SLOTS`'s reply: `[[start, end, [host, port, id…], replicas…]…]`.
fn parse_slots(value: Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = value else {
        return None;
    };
    ranges
        .into_iter()
        .map(|r| {
            let Value::Array(r) = r else { return None };
            let start = u16::try_from(r.first()?.as_i64()?).ok()?;
            let end = u16::try_from(r.get(1)?.as_i64()?).ok()?;
            let Value::Array(master) = r.get(2)? else {
                return None;
            };
            let host = master.first()?.as_string()?;
            let port = master.get(1)?.as_i64()?;
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_replies_are_read_and_nonsense_is_refused() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::from(host),
                Value::Integer(port),
                Value::from("id"),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Integer(0),
                Value::Integer(5460),
                node("127.0.0.1", 7001),
                node("127.0.0.1", 7004),
            ]),
            Value::Array(vec![
                Value::Integer(5461),
                Value::Integer(16383),
                node("127.0.0.1", 7002),
            ]),
        ]);
        assert_eq!(
            parse_slots(reply),
            Some(vec![
                (0, 5460, "127.0.0.1:7001".to_string()),
                (5461, 16383, "127.0.0.1:7002".to_string()),
            ])
        );
        assert_eq!(parse_slots(Value::from("OK")), None);
        assert_eq!(
            parse_slots(Value::Array(vec![Value::Array(vec![Value::Integer(0)])])),
            None
        );
    }
}
