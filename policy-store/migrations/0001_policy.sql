-- verdict policy store, version 1. Applied by PgPolicySource::migrate (idempotent).
-- Rows are loosely typed on purpose: the loader validates every row and names the row and
-- field it refuses, keeping the previous policy in force. Every change to any table raises
-- meta.version by one (statement triggers), so gateways see a change by polling one row.

create schema if not exists verdict_policy;

create table if not exists verdict_policy.meta (
    id boolean primary key default true check (id),
    version bigint not null default 1,
    kill_switch boolean not null default false,
    updated_at timestamptz not null default now()
);
insert into verdict_policy.meta (id) values (true) on conflict do nothing;

create table if not exists verdict_policy.tiers (
    id integer primary key,
    name text not null unique,
    kill_switch boolean not null default false
);

create table if not exists verdict_policy.route_classes (
    id integer primary key,
    name text not null unique,
    prefixes text[] not null default '{}'
);

create table if not exists verdict_policy.limits (
    tier text not null,
    route_class text not null,
    capacity bigint not null,
    refill_per_s double precision not null,
    hourly_quota bigint not null,
    mode text not null default 'enforce',
    primary key (tier, route_class)
);

create table if not exists verdict_policy.overrides (
    key_id text not null,
    route_class text not null default '*',
    capacity bigint not null,
    refill_per_s double precision not null,
    hourly_quota bigint not null,
    mode text,
    primary key (key_id, route_class)
);

create table if not exists verdict_policy.hot_keys (
    key_id text primary key,
    sub_keys integer not null
);

-- meta's own updates (the kill switch) raise the version unless they set it.
create or replace function verdict_policy.meta_bump() returns trigger language plpgsql as $$
begin
    if new.version = old.version then
        new.version := old.version + 1;
    end if;
    new.updated_at := now();
    return new;
end $$;

-- Any change to another table touches meta, which raises the version.
create or replace function verdict_policy.touch_meta() returns trigger language plpgsql as $$
begin
    update verdict_policy.meta set updated_at = now() where id;
    return null;
end $$;

drop trigger if exists meta_bump on verdict_policy.meta;
create trigger meta_bump before update on verdict_policy.meta
    for each row execute function verdict_policy.meta_bump();

do $$
declare t text;
begin
    foreach t in array array['tiers', 'route_classes', 'limits', 'overrides', 'hot_keys'] loop
        execute format('drop trigger if exists touch_meta on verdict_policy.%I', t);
        execute format('create trigger touch_meta after insert or update or delete or truncate on verdict_policy.%I
                        for each statement execute function verdict_policy.touch_meta()', t);
    end loop;
end $$;
