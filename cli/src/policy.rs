//! `verdict policy`: the operator's commands against the policy store, the design's
//! rollback levels. Level one, seconds: a tier back to shadow (`set-mode`). Level two: a
//! limit raised or lowered for a tier, a route class or one key (`set-limit`). Level three:
//! the kill switch that hard-allows everything, or one tier (`kill-switch`).

use clap::{Args, Subcommand, ValueEnum};
use verdict_limiter::policy::ALL_ROUTES;
use verdict_limiter::{Mode, PolicyDocument};
use verdict_policy_store::{Edit, LimitChange, PgSource};
use verdict_schemas::KeyId;

use crate::policy_args::PolicyArgs;

/// `verdict policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the policy in force and its version.
    Show(ShowArgs),
    /// Set a tier's mode (enforce, shadow, off) on every route class or one: rollback level
    /// one is `set-mode --tier T --mode shadow`.
    SetMode(SetModeArgs),
    /// Raise or lower a limit for a tier (on every route class, `*`, or one), or for one
    /// key (an override): rollback level two.
    SetLimit(SetLimitArgs),
    /// Turn the kill switch on or off: every request (or one tier's) allowed and nothing
    /// counted. Rollback level three.
    KillSwitch(KillSwitchArgs),
    /// Read an envoyproxy/ratelimit configuration (YAML) as a verdict policy and the
    /// descriptor rules of the rate limit service, so Envoy can ask verdict instead:
    /// per-second and per-minute limits become token buckets, per-hour limits the sliding
    /// window; what cannot be expressed is refused, naming the field and its line.
    ImportEnvoy(ImportEnvoyArgs),
}

/// Options of `verdict policy import-envoy`.
#[derive(Debug, Args)]
pub struct ImportEnvoyArgs {
    /// The envoyproxy/ratelimit configuration file (`domain`, `descriptors`).
    pub file: std::path::PathBuf,
    /// Where to write the policy (TOML, for --policy-file; refused if it exists).
    #[arg(long)]
    pub policy_out: std::path::PathBuf,
    /// Where to write the descriptor rules (TOML, for --rls-descriptors; refused if it
    /// exists).
    #[arg(long)]
    pub descriptors_out: std::path::PathBuf,
}

/// Options of `verdict policy show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The policy.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The PostgreSQL policy store the changes go to.
#[derive(Debug, Args)]
pub struct StoreArg {
    /// The policy store, e.g. postgres://verdict@127.0.0.1:15432/verdict. (A policy file is
    /// changed by editing it: gateways re-read it when it changes.)
    #[arg(long, env = "VERDICT_POLICY_POSTGRES")]
    pub policy_postgres: String,
}

/// A mode, as the command line spells it.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Decide and refuse.
    Enforce,
    /// Decide and record, refuse nobody.
    Shadow,
    /// Neither decide nor count.
    Off,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Enforce => Mode::Enforce,
            ModeArg::Shadow => Mode::Shadow,
            ModeArg::Off => Mode::Off,
        }
    }
}

/// Options of `verdict policy set-mode`.
#[derive(Debug, Args)]
pub struct SetModeArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArg,
    /// The tier.
    #[arg(long)]
    pub tier: String,
    /// The mode.
    #[arg(long, value_enum)]
    pub mode: ModeArg,
    /// Only this route class [default: every one].
    #[arg(long)]
    pub route_class: Option<String>,
}

/// Options of `verdict policy set-limit`.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct SetLimitArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArg,
    /// The tier (with --key: the key's tier, where a new override starts from).
    #[arg(long)]
    pub tier: String,
    /// The route class, or * for the row covering every class without its own.
    #[arg(long, default_value = ALL_ROUTES)]
    pub route_class: String,
    /// One key's limits instead of the tier's (32 hex digits).
    #[arg(long)]
    pub key: Option<KeyId>,
    /// Bucket capacity (the largest burst).
    #[arg(long)]
    pub capacity: Option<i64>,
    /// Bucket refill, tokens per second.
    #[arg(long)]
    pub refill_per_s: Option<f64>,
    /// Requests per sliding hour.
    #[arg(long)]
    pub hourly_quota: Option<i64>,
}

/// On or off.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Switch {
    /// Hard-allow.
    On,
    /// Back to deciding.
    Off,
}

/// Options of `verdict policy kill-switch`.
#[derive(Debug, Args)]
pub struct KillSwitchArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArg,
    /// On or off.
    #[arg(value_enum)]
    pub state: Switch,
    /// Only this tier [default: every request].
    #[arg(long)]
    pub tier: Option<String>,
}

/// Runs a policy command.
pub async fn run(cmd: PolicyCommand) -> anyhow::Result<()> {
    let (url, edit) = match cmd {
        PolicyCommand::Show(args) => return show(args).await,
        PolicyCommand::ImportEnvoy(args) => return import_envoy(&args),
        PolicyCommand::SetMode(a) => (
            a.store.policy_postgres,
            Edit::SetMode {
                tier: a.tier,
                route_class: a.route_class,
                mode: a.mode.into(),
            },
        ),
        PolicyCommand::SetLimit(a) => {
            let change = LimitChange {
                capacity: a.capacity,
                refill_per_s: a.refill_per_s,
                hourly_quota: a.hourly_quota,
            };
            let edit = match a.key {
                Some(key_id) => Edit::SetKeyLimit {
                    key_id,
                    tier: a.tier,
                    route_class: a.route_class,
                    change,
                },
                None => Edit::SetTierLimit {
                    tier: a.tier,
                    route_class: a.route_class,
                    change,
                },
            };
            (a.store.policy_postgres, edit)
        }
        PolicyCommand::KillSwitch(a) => (
            a.store.policy_postgres,
            Edit::KillSwitch {
                tier: a.tier,
                on: matches!(a.state, Switch::On),
            },
        ),
    };
    let applied = PgSource::new(url).apply(&edit).await?;
    println!(
        "policy version {} -> {}: {}",
        applied.from_version,
        applied.to_version,
        describe(&edit)
    );
    println!(
        "every gateway polls the policy (every 5 s by default, --policy-refresh-secs): in force everywhere within that, and within 30 s at most"
    );
    Ok(())
}

fn describe(edit: &Edit) -> String {
    let change = |c: &LimitChange| {
        let mut parts = Vec::new();
        if let Some(v) = c.capacity {
            parts.push(format!("capacity {v}"));
        }
        if let Some(v) = c.refill_per_s {
            parts.push(format!("refill {v}/s"));
        }
        if let Some(v) = c.hourly_quota {
            parts.push(format!("hourly quota {v}"));
        }
        parts.join(", ")
    };
    match edit {
        Edit::SetMode {
            tier,
            route_class,
            mode,
        } => format!(
            "tier {tier} on {} is now {}",
            route_class.as_deref().unwrap_or("every route class"),
            mode.as_str()
        ),
        Edit::SetTierLimit {
            tier,
            route_class,
            change: c,
        } => format!("tier {tier}, route class {route_class}: {}", change(c)),
        Edit::SetKeyLimit {
            key_id,
            route_class,
            change: c,
            ..
        } => format!("key {key_id}, route class {route_class}: {}", change(c)),
        Edit::KillSwitch { tier, on } => format!(
            "kill switch {} for {}",
            if *on {
                "ON (every request allowed, nothing counted)"
            } else {
                "off"
            },
            tier.as_deref()
                .map_or("every tier".to_owned(), |t| format!("tier {t}"))
        ),
    }
}

async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let source = args.policy.source().ok_or_else(|| {
        anyhow::anyhow!("which policy? --policy-file policy.toml or --policy-postgres URL")
    })?;
    let snapshot = source.load().await?;
    let doc = snapshot.document();
    if args.json {
        println!("{}", serde_json::to_string_pretty(doc)?);
        return Ok(());
    }
    print!("{}", render(doc, snapshot.version()));
    Ok(())
}

/// The policy as text.
fn render(doc: &PolicyDocument, version: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "policy version {version}{}",
        if doc.kill_switch {
            "  KILL SWITCH ON: every request allowed, nothing counted"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "\n{:<14} {:<14} {:>10} {:>10} {:>12}  mode",
        "tier", "route class", "capacity", "refill/s", "hourly quota"
    );
    for t in &doc.tiers {
        for l in doc.limits.iter().filter(|l| l.tier == t.name) {
            let _ = writeln!(
                out,
                "{:<14} {:<14} {:>10} {:>10} {:>12}  {}{}",
                l.tier,
                l.route_class,
                l.capacity,
                l.refill_per_s,
                l.hourly_quota,
                l.mode.as_str(),
                if t.kill_switch {
                    "  (tier kill switch ON)"
                } else {
                    ""
                }
            );
        }
    }
    if !doc.overrides.is_empty() {
        let _ = writeln!(out, "\noverrides");
        for o in &doc.overrides {
            let _ = writeln!(
                out,
                "  key {} on {}: capacity {}, refill {}/s, hourly quota {}{}",
                o.key_id,
                o.route_class,
                o.capacity,
                o.refill_per_s,
                o.hourly_quota,
                o.mode
                    .map(|m| format!(", mode {}", m.as_str()))
                    .unwrap_or_default()
            );
        }
    }
    if !doc.hot_keys.is_empty() {
        let _ = writeln!(out, "\nhot keys");
        for h in &doc.hot_keys {
            let _ = writeln!(out, "  key {} split into {} sub-keys", h.key_id, h.sub_keys);
        }
    }
    if !doc.regions.is_empty() {
        let _ = writeln!(out, "\nregions");
        for r in &doc.regions {
            let _ = writeln!(out, "  {} (id {}), weight {}", r.name, r.id, r.weight);
        }
    }
    out
}

/// `verdict policy import-envoy`: the two files written, and what each limit became.
fn import_envoy(args: &ImportEnvoyArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let file = args.file.display().to_string();
    let yaml = std::fs::read_to_string(&args.file).with_context(|| format!("reading {file}"))?;
    let imported = verdict_rls::import::import(&file, &yaml)?;
    let policy = toml::to_string(&imported.policy).context("writing the policy as TOML")?;
    let descriptors =
        toml::to_string(&imported.descriptors).context("writing the descriptors as TOML")?;
    let outputs = [
        (&args.policy_out, policy),
        (&args.descriptors_out, descriptors),
    ];
    if let Some((path, _)) = outputs.iter().find(|(p, _)| p.exists()) {
        anyhow::bail!(
            "{} exists: the import writes new files only",
            path.display()
        );
    }
    for (path, text) in outputs {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
        std::io::Write::write_all(&mut out, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let domain = &imported.descriptors.domain;
    println!(
        "imported {} limit(s) of domain {domain} from {file}",
        imported.policy.limits.len()
    );
    println!(
        "{:<40} {:<9} {:>10} {:>12} {:>12}",
        "route class", "mode", "burst", "refill/s", "hourly quota"
    );
    for l in &imported.policy.limits {
        println!(
            "{:<40} {:<9} {:>10} {:>12.3} {:>12}",
            l.route_class,
            l.mode.as_str(),
            l.capacity,
            l.refill_per_s,
            l.hourly_quota
        );
    }
    println!(
        "policy: {} (--policy-file); descriptors: {} (--rls-descriptors); tier {domain}",
        args.policy_out.display(),
        args.descriptors_out.display()
    );
    Ok(())
}
