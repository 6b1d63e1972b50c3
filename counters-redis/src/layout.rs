//! How limit keys are laid out in Redis.
//!
//! A limit key's state (bucket and window, 24 bytes: see [`crate::packed`]) is one field of
//! a hash. The hash is one of `groups` hashes, `rl:{g<n>}`, chosen by the key id: every
//! route class and tier of one key id share a group, so one key's limits share a Redis
//! Cluster slot, and many key ids share each hash. A hash costs Redis about 150 bytes of its
//! own (the key's entry, its name, its TTL), which a hash per key id pays for each key id,
//! and which a group shares among its fields: with 8 or more fields a group, a limit key
//! costs 52 to 73 bytes, where a hash of its own costs 198 (one field) or 115 (two).
//! `groups` is sized to the active limit keys: about one group per 8 to 64 of them
//! ([`DEFAULT_GROUPS`], 2^20, fits the design's 50 million), and below
//! `hash-max-listpack-entries` fields a group (512 on Debian's Redis 7.0; `CONFIG GET`
//! shows it), past which Redis stores the hash as a table at about twice the bytes.
//!
//! A field is the key id's 16 bytes, then the route class and the tier (18 bytes). A hot
//! key split into sub-keys keeps a hash per sub-key, `rl:{<key id hex>#<sub key>}`: its
//! sub-keys must land on different slots (that is the point of splitting), and hot keys
//! are few.
//!
//! Every instance writing to one Redis must use the same `groups`, or a key would have two
//! states at once and get two allowances: the first store to connect records its layout at
//! [`LAYOUT_KEY`], and a store configured otherwise refuses to start (see
//! [`Layout::claim`]).
//!
//! The empty field of each hash is the script's own: the window in which it last removed
//! the fields of keys idle for the hash's TTL (a group lives as long as any of its keys is
//! active, so its idle fields are removed by the script rather than by the TTL).

use std::fmt::Write as _;

use fred::prelude::*;
use fred::types::SetOptions;
use verdict_limiter::LimitKey;
use verdict_limiter::key::{fnv1a, mix64};

/// Groups by default: about 48 fields a group for the design's 10 million callers × 5
/// route classes.
pub const DEFAULT_GROUPS: u32 = 1 << 20;

/// Limit keys a group holds in the layout [`Layout::sized_for`] chooses: what the default
/// gives the design's 50 million.
pub const KEYS_PER_GROUP: u64 = 48;

/// Most groups a layout may have.
pub const MAX_GROUPS: u32 = 1 << 24;

/// Where the layout in use is recorded: the number of groups, as decimal text.
pub const LAYOUT_KEY: &str = "rl:layout";

/// Bytes of a field: the key id, the route class, the tier.
pub const FIELD_LEN: usize = 18;

/// The layout: how many groups the limit keys are spread over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    groups: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            groups: DEFAULT_GROUPS,
        }
    }
}

impl std::fmt::Display for Layout {
    /// The number of groups.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.groups)
    }
}

/// Why a layout cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Groups out of 1 ..= [`MAX_GROUPS`].
    #[error("key groups: {0} is out of range (1 to {MAX_GROUPS})")]
    Groups(u64),
    /// The Redis holds counters laid out otherwise.
    #[error(
        "this Redis holds counters laid out in {recorded} key groups ({LAYOUT_KEY}), and this \
         store is set for {wanted}: every instance must use the same (--redis-key-groups \
         {recorded}), or delete {LAYOUT_KEY} and the rl:{{g…}} hashes to start the counters \
         afresh"
    )]
    Mismatch {
        /// What `rl:layout` says.
        recorded: String,
        /// What this store was given.
        wanted: u32,
    },
}

impl Layout {
    /// A layout of `groups` groups.
    ///
    /// # Errors
    /// When `groups` is 0 or above [`MAX_GROUPS`].
    pub fn new(groups: u32) -> Result<Self, LayoutError> {
        if (1..=MAX_GROUPS).contains(&groups) {
            Ok(Self { groups })
        } else {
            Err(LayoutError::Groups(u64::from(groups)))
        }
    }

    /// The layout for about `limit_keys` active limit keys: a group per [`KEYS_PER_GROUP`]
    /// of them (within 1 ..= [`MAX_GROUPS`]).
    pub fn sized_for(limit_keys: u64) -> Self {
        let groups = limit_keys
            .div_ceil(KEYS_PER_GROUP)
            .clamp(1, u64::from(MAX_GROUPS));
        Self {
            groups: u32::try_from(groups).unwrap_or(MAX_GROUPS),
        }
    }

    /// The number of groups.
    pub fn groups(&self) -> u32 {
        self.groups
    }

    /// The group of an unsplit key: its key id hashed (FNV-1a, mixed) onto `0..groups`.
    pub fn group(&self, key: &LimitKey) -> u32 {
        (((mix64(fnv1a(&key.key_id.0)) >> 32) * u64::from(self.groups)) >> 32) as u32
    }

    /// The hash holding `key`'s state: `rl:{g<group>}`, or `rl:{<key id hex>#<sub key>}`
    /// for a sub-key of a split key.
    pub fn hash(&self, key: &LimitKey) -> String {
        let mut s = String::with_capacity(40);
        let _ = write!(s, "rl:{{{}}}", Tag(self, key));
        s
    }

    /// The Redis Cluster slot of `key`'s hash (the CRC16 of its hash tag, as
    /// `CLUSTER KEYSLOT` of [`Self::hash`] answers), without building the hash's name.
    pub fn slot(&self, key: &LimitKey) -> u16 {
        // The longest tag: 32 hex digits, '#', a sub-key of three digits.
        let mut buf = [0u8; 40];
        let mut w = std::io::Cursor::new(&mut buf[..]);
        let written = std::io::Write::write_fmt(&mut w, format_args!("{}", Tag(self, key)));
        debug_assert!(written.is_ok(), "a hash tag is at most 36 bytes");
        let len = usize::try_from(w.position()).unwrap_or(0);
        // A tag holds no braces, so the slot of the tag alone is the slot of the name.
        fred::util::redis_keyslot(&buf[..len])
    }

    /// `key`'s field inside its hash: the key id's 16 bytes, the route class, the tier.
    pub fn field(&self, key: &LimitKey) -> [u8; FIELD_LEN] {
        let mut f = [0u8; FIELD_LEN];
        f[..16].copy_from_slice(&key.key_id.0);
        f[16] = key.route_class.0;
        f[17] = key.tier.0;
        f
    }

    /// Records this layout at [`LAYOUT_KEY`] if none is, in one `SET … NX GET`.
    ///
    /// # Errors
    /// [`LayoutError::Mismatch`] (as a Redis error) when another layout is recorded.
    pub async fn claim(&self, client: &Client) -> Result<(), Error> {
        let mine = self.groups.to_string();
        let recorded: Option<String> = client
            .set(LAYOUT_KEY, mine.as_str(), None, Some(SetOptions::NX), true)
            .await?;
        match recorded {
            Some(r) if r != mine => Err(Error::new(
                ErrorKind::InvalidArgument,
                LayoutError::Mismatch {
                    recorded: r,
                    wanted: self.groups,
                }
                .to_string(),
            )),
            _ => Ok(()),
        }
    }

    /// The layout recorded in the Redis `client` reads, or the default when none is (no
    /// store has written there).
    ///
    /// # Errors
    /// When Redis fails, or the record is not a number of groups.
    pub async fn recorded(client: &Client) -> Result<Self, Error> {
        let recorded: Option<String> = client.get(LAYOUT_KEY).await?;
        let Some(r) = recorded else {
            return Ok(Self::default());
        };
        r.parse::<u32>()
            .ok()
            .and_then(|g| Self::new(g).ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Parse,
                    format!("{LAYOUT_KEY} = {r:?} is not a number of key groups"),
                )
            })
    }
}

/// The hash tag of a key's hash, the part between the braces that picks its slot:
/// `g<group>`, or `<key id hex>#<sub key>` for a sub-key of a split key.
struct Tag<'a>(&'a Layout, &'a LimitKey);

impl std::fmt::Display for Tag<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Tag(layout, key) = *self;
        if key.sub_keys > 1 {
            write!(f, "{}#{}", key.key_id, key.sub_key)
        } else {
            write!(f, "g{}", layout.group(key))
        }
    }
}

#[cfg(test)]
mod tests {
    use verdict_schemas::{KeyId, RouteClassId, TierId};

    use super::*;

    fn key(b: u8) -> LimitKey {
        LimitKey::new(KeyId([b; 16]), RouteClassId(2), TierId(1))
    }

    #[test]
    fn unsplit_keys_share_groups_and_a_key_id_keeps_its_group_across_routes() {
        let l = Layout::new(4096).unwrap();
        let k = key(0xab);
        let other_route = LimitKey::new(k.key_id, RouteClassId(3), TierId(1));
        assert_eq!(l.hash(&k), l.hash(&other_route));
        assert_eq!(l.hash(&k), format!("rl:{{g{}}}", l.group(&k)));
        assert!(l.group(&k) < 4096);
        let mut f = [0xab; FIELD_LEN];
        f[16] = 2;
        f[17] = 1;
        assert_eq!(l.field(&k), f);
        assert_ne!(l.field(&k), l.field(&other_route));
    }

    #[test]
    fn key_ids_spread_over_the_groups() {
        let l = Layout::new(16).unwrap();
        let mut seen = [0u32; 16];
        for i in 0..1600u32 {
            let mut id = [0u8; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            seen[l.group(&LimitKey::new(KeyId(id), RouteClassId(0), TierId(0))) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (60..140).contains(&n)), "{seen:?}");
    }

    #[test]
    fn sub_keys_keep_a_hash_of_their_own() {
        let l = Layout::default();
        let s = key(0xab).split(16, b"203.0.113.9");
        assert_eq!(
            l.hash(&s),
            format!("rl:{{abababababababababababababababab#{}}}", s.sub_key)
        );
    }

    #[test]
    fn a_keys_slot_is_the_slot_of_its_hashs_name() {
        let l = Layout::new(4096).unwrap();
        for b in [0u8, 7, 0xab, 0xff] {
            let k = key(b);
            assert_eq!(l.slot(&k), fred::util::redis_keyslot(l.hash(&k).as_bytes()));
            for caller in [&b"203.0.113.9"[..], b"198.51.100.1", b"x"] {
                let s = k.split(255, caller);
                assert_eq!(l.slot(&s), fred::util::redis_keyslot(l.hash(&s).as_bytes()));
            }
        }
    }

    #[test]
    fn groups_out_of_range_are_refused() {
        assert_eq!(Layout::new(0), Err(LayoutError::Groups(0)));
        assert!(Layout::new(MAX_GROUPS + 1).is_err());
        assert_eq!(Layout::new(1).unwrap().groups(), 1);
    }

    #[test]
    fn a_sized_layout_has_a_group_per_48_keys_and_the_design_gets_the_default() {
        assert_eq!(Layout::sized_for(50_000_000).groups(), 1_041_667);
        assert_eq!(Layout::sized_for(500_000).groups(), 10_417);
        assert_eq!(Layout::sized_for(48).groups(), 1);
        assert_eq!(Layout::sized_for(0).groups(), 1);
        assert_eq!(Layout::sized_for(u64::MAX).groups(), MAX_GROUPS);
    }
}
