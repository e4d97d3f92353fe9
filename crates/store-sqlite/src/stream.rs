//! Reading the event stream: a batch of events in one row of JSON. Row by row, each event
//! crossed from SQLite's thread to the reader's task on its own, and those hand-overs were
//! most of what delivery's reads cost the service under load.

use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime, Utc};
use plantstore_store::{Event, StoreError, StreamPosition, backend::EventRow};
use sqlx::SqlitePool;

use crate::errors::classify;

#[tracing::instrument(level = "debug", skip(readers))]
pub(crate) async fn read(
    readers: &SqlitePool,
    after: StreamPosition,
    limit: i64,
) -> Result<Vec<Event>, StoreError> {
    // Each kind is read in its index's order and cut at `limit`, so a read costs what it
    // returns, not the whole backlog.
    let (deletes_pos, deletes_id) = after.after_for(0);
    let (restores_pos, restores_id) = after.after_for(1);
    let batch = sqlx::query_scalar!(
        r#"SELECT json_group_array(json_array(pos, kind, seq, id, plant_id, token_name,
                                              request_id, idempotency_key, deleted_at,
                                              snapshot, restored_at, restored_by))
                  AS "events!: String"
           FROM (
               SELECT * FROM (
                   SELECT id AS pos, 0 AS kind, id AS seq, id, plant_id, token_name,
                          request_id, idempotency_key, deleted_at, snapshot, restored_at,
                          restored_by
                   FROM plantstore_deletions
                   WHERE id >= ?1 AND (id, id) > (?1, ?2)
                   ORDER BY id
                   LIMIT ?5)
               UNION ALL
               SELECT * FROM (
                   SELECT restored_pos AS pos, 1 AS kind, restored_seq AS seq, id, plant_id,
                          token_name, request_id, idempotency_key, deleted_at, snapshot,
                          restored_at, restored_by
                   FROM plantstore_deletions
                   WHERE restored_pos >= ?3 AND (restored_pos, restored_seq) > (?3, ?4)
                   ORDER BY restored_pos, restored_seq
                   LIMIT ?5)
               ORDER BY pos, kind, seq
               LIMIT ?5
           )"#,
        deletes_pos,
        deletes_id,
        restores_pos,
        restores_id,
        limit
    )
    .fetch_one(readers)
    .await
    .map_err(classify)?;
    let mut events = decode(&batch)?;
    // The aggregate keeps the inner order in practice; the stream's order is not left to it.
    events.sort_unstable_by_key(|event| {
        (event.position.pos, event.position.kind, event.position.seq)
    });
    Ok(events)
}

/// One event as `json_array` lays it out, in the query's column order (serde reads a
/// struct from an array field by field): `seq` orders the events at one place of the
/// stream (a delete's id, a restore's `restored_seq`).
#[derive(serde::Deserialize)]
struct Columns {
    pos: i64,
    kind: i64,
    seq: i64,
    id: i64,
    plant_id: i64,
    caller: String,
    request_id: String,
    idempotency_key: Option<String>,
    deleted_at: String,
    snapshot: Option<String>,
    restored_at: Option<String>,
    restored_by: Option<String>,
}

fn decode(batch: &str) -> Result<Vec<Event>, StoreError> {
    let rows: Vec<Columns> = serde_json::from_str(batch).map_err(|err| bad(err.to_string()))?;
    rows.into_iter()
        .map(|row| {
            let mut event = Event::try_from(EventRow {
                pos: row.pos,
                kind: row.kind,
                id: row.id,
                plant_id: row.plant_id,
                caller: row.caller,
                request_id: row.request_id,
                idempotency_key: row.idempotency_key,
                deleted_at: time(&row.deleted_at)?,
                snapshot: row.snapshot,
                restored_at: row.restored_at.as_deref().map(time).transpose()?,
                restored_by: row.restored_by,
            })?;
            event.position.seq = row.seq;
            Ok(event)
        })
        .collect()
}

/// A time as sqlx stores it (RFC 3339), or in the other forms its decoder takes.
fn time(text: &str) -> Result<DateTime<Utc>, StoreError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%F %T%.f%:z", "%F %T%.f%#z", "%FT%T%.f%#z"] {
        if let Ok(at) = DateTime::parse_from_str(text, format) {
            return Ok(at.with_timezone(&Utc));
        }
    }
    for format in ["%F %T%.f", "%FT%T%.f", "%F %R", "%FT%R"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(at.and_utc());
        }
    }
    Err(bad(format!(
        "a time the deletion log holds cannot be read: {text:?}"
    )))
}

fn bad(why: String) -> StoreError {
    StoreError::Other(Arc::new(sqlx::Error::Decode(why.into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_in_each_form_sqlx_writes_or_takes() {
        let micros = "2026-11-24T01:02:03.123456+00:00";
        let at = time(micros).expect("RFC 3339");
        assert_eq!(at.to_rfc3339(), "2026-11-24T01:02:03.123456+00:00");
        for text in [
            "2026-11-24 01:02:03.123456",
            "2026-11-24 01:02:03.123456+00:00",
            "2026-11-24T03:02:03.123456+02:00",
            "2026-11-24T01:02:03.123456Z",
        ] {
            assert_eq!(time(text).expect(text), at, "{text}");
        }
        assert!(time("yesterday").is_err());
    }

    #[test]
    fn a_batch_is_read_with_its_nulls() {
        let batch = r#"[[9,1,2,7,3,"ops","req-1",null,"2026-11-24T01:02:03.5+00:00","{\"name\":\"fern\"}","2026-11-24T01:02:04+00:00",null]]"#;
        let events = decode(batch).expect("a batch");
        let entry = &events[0].entry;
        assert_eq!((entry.id, entry.plant_id), (7, 3));
        let place = events[0].position;
        assert_eq!((place.pos, place.kind, place.seq), (9, 1, 2));
        assert_eq!(entry.snapshot.as_deref(), Some(r#"{"name":"fern"}"#));
        assert!(entry.idempotency_key.is_none() && entry.restored_by.is_none());
        assert_eq!(decode("[]").expect("empty").len(), 0);
    }
}
