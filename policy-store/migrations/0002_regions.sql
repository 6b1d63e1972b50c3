-- verdict policy store, version 2: regions and their shares. Applied after 0001 by
-- PgSource::migrate (idempotent).
--
-- regions: the static weights, part of the policy (a change raises meta.version like any
-- other policy row). shares: what the reconcile job last computed, one row per region and
-- limit key it found near its limit; share_rounds: one row per region whose version rises
-- with every round that wrote its shares, so a gateway polls one row.

create table if not exists verdict_policy.regions (
    id integer primary key,
    name text not null unique,
    weight double precision not null default 1
);

drop trigger if exists touch_meta on verdict_policy.regions;
create trigger touch_meta after insert or update or delete or truncate on verdict_policy.regions
    for each statement execute function verdict_policy.touch_meta();

-- A share is parts per million of the key's global limits: bucket_ppm of its capacity and
-- refill, window_ppm of its hourly quota. Until effective_ms the gateways enforce the
-- smaller of (before, after), so a share that grows waits until every region has had time
-- to apply the shares that shrank, and the sum in force never exceeds the whole.
create table if not exists verdict_policy.shares (
    region integer not null,
    key_id text not null,
    route_class integer not null,
    tier integer not null,
    bucket_ppm integer not null,
    window_ppm integer not null,
    before_bucket_ppm integer not null,
    before_window_ppm integer not null,
    effective_ms bigint not null,
    computed_ms bigint not null,
    primary key (region, key_id, route_class, tier)
);

create table if not exists verdict_policy.share_rounds (
    region integer primary key,
    version bigint not null default 0,
    -- The last round that could read this region's counters (null: never).
    last_seen_ms bigint,
    updated_ms bigint not null default 0
);
