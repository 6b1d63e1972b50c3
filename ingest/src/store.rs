//! Putting raw files into the object store, at the paths the layout gives them: a chunk of
//! events consumed from one Kafka partition is split by the hour of its event times (late
//! events land in their own hour's folder) and each hour becomes one file named by the
//! offsets it holds.

use std::collections::BTreeMap;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use verdict_schemas::{HourPartition, LayoutError, RawFileName};

use crate::raw_file::{ConsumedEvent, RawFileError, build_hour_file};

/// Why raw files could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The file could not be built.
    #[error(transparent)]
    File(#[from] RawFileError),
    /// The store refused the file.
    #[error("writing {path}: {source}")]
    Store {
        /// The object path.
        path: String,
        /// What the store said.
        source: object_store::Error,
    },
}

/// One raw file that is now in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    /// Its hour partition.
    pub hour: HourPartition,
    /// Its object path.
    pub path: Path,
    /// Rows it holds.
    pub rows: usize,
    /// Its size in bytes.
    pub bytes: usize,
}

/// Events of one chunk, grouped by the hour of their event time, and those whose time has
/// no hour (to be quarantined by the caller).
#[derive(Debug, Default)]
pub struct HourSplit {
    /// Events by hour, hours in order.
    pub hours: BTreeMap<HourPartition, Vec<ConsumedEvent>>,
    /// Events whose event time is outside the calendar.
    pub unplaceable: Vec<(ConsumedEvent, LayoutError)>,
}

/// Groups events by the hour of their event time.
pub fn split_by_hour(events: impl IntoIterator<Item = ConsumedEvent>) -> HourSplit {
    let mut split = HourSplit::default();
    for c in events {
        match HourPartition::from_event_time_ms(c.event.event_time_ms) {
            Ok(h) => split.hours.entry(h).or_default().push(c),
            Err(e) => split.unplaceable.push((c, e)),
        }
    }
    split
}

/// The object path of a raw file: `raw/date=…/hour=…/<topic>+<partition>+<first>+<last>.parquet`.
pub fn raw_object_path(hour: &HourPartition, name: &RawFileName) -> Path {
    Path::from(name.raw_path(hour))
}

/// Writes one hour's events from one Kafka partition as one raw file named by the smallest
/// and largest offset among them.
///
/// # Panics
/// Never; an empty `events` writes nothing and returns `None`.
pub async fn write_hour_file(
    store: &dyn ObjectStore,
    topic: &str,
    partition: i32,
    hour: HourPartition,
    events: Vec<ConsumedEvent>,
) -> Result<Option<WrittenFile>, WriteError> {
    let Some(file) = build_hour_file(topic, partition, &hour, events)? else {
        return Ok(None);
    };
    let path = raw_object_path(&hour, &file.name);
    let (size, rows) = (file.bytes.len(), file.rows);
    store
        .put(&path, PutPayload::from(file.bytes))
        .await
        .map_err(|source| WriteError::Store {
            path: path.to_string(),
            source,
        })?;
    Ok(Some(WrittenFile {
        hour,
        path,
        rows,
        bytes: size,
    }))
}

#[cfg(test)]
mod tests {
    use verdict_schemas::{
        DecisionEvent, DecisionSource, DeniedBy, KeyId, RegionId, RouteClassId, TierId, Verdict,
    };

    use super::*;

    fn at(time: i64, offset: i64) -> ConsumedEvent {
        ConsumedEvent {
            event: DecisionEvent {
                event_time_ms: time,
                key_id: KeyId([1; 16]),
                route_class: RouteClassId(0),
                tier: TierId(0),
                region: RegionId(0),
                gateway_instance: 0,
                verdict: Verdict::Allowed,
                denied_by: DeniedBy::NONE,
                source: DecisionSource::CounterStore,
                remaining_tokens: 0,
                remaining_window: 0,
                retry_after_ms: 0,
                window_quota: 0,
                policy_version: 1,
                sub_key: 0,
                sub_keys: 1,
            },
            partition: 3,
            offset,
        }
    }

    #[test]
    fn late_events_go_to_their_own_hour_and_absurd_times_are_set_aside() {
        let h14 = 1_796_047_200_000;
        let split = split_by_hour([
            at(h14 + 5, 10),
            at(h14 - 1, 11),
            at(h14 + 7, 12),
            at(i64::MAX, 13),
        ]);
        let hours: Vec<String> = split.hours.keys().map(ToString::to_string).collect();
        assert_eq!(hours, ["2026-11-30T13", "2026-11-30T14"]);
        assert_eq!(
            split.hours.values().map(Vec::len).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(split.unplaceable.len(), 1);
        assert_eq!(split.unplaceable[0].0.offset, 13);
    }

    #[tokio::test]
    async fn an_hour_file_is_named_by_its_offsets_and_lands_in_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let h14 = 1_796_047_200_000;
        let split = split_by_hour([at(h14 + 5, 10), at(h14 + 1, 12), at(h14 + 9, 11)]);
        let (hour, events) = split.hours.into_iter().next().unwrap();
        let written = write_hour_file(&store, "verdict.decisions.v1", 3, hour, events)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            written.path.as_ref(),
            "raw/date=2026-11-30/hour=14/verdict.decisions.v1+00003+00000000000000000010+00000000000000000012.parquet"
        );
        assert_eq!(written.rows, 3);
        let on_disk = std::fs::metadata(dir.path().join(written.path.as_ref()))
            .unwrap()
            .len();
        assert_eq!(on_disk as usize, written.bytes);
        assert_eq!(
            write_hour_file(&store, "t", 0, hour, Vec::new())
                .await
                .unwrap(),
            None
        );
    }
}
