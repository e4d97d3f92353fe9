//! Deletion events on SQLite. One writer commits at a time and ids are given inside its
//! write, so a delete's place in the log's order is its id, and a restore's the highest id
//! when it committed, then its restored_seq.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plantstore_store::{
    Destinations, StoreError,
    backend::{
        DestinationColumns, EndpointRow, EventRow, LeaseRow, StoredMessageRow, event_list,
        not_found_if_none,
    },
    destinations::{
        DeliveryReport, EndpointRecord, Event, EventKind, Lease, LogPosition, NewEndpoint,
        ReplayOutcome, StoredMessage,
    },
    time::{LAST_STORABLE_TIME, storable_after},
};

use crate::{SqliteStore, errors::classify};

#[async_trait]
impl Destinations for SqliteStore {
    #[tracing::instrument(skip_all)]
    async fn add_endpoint(&self, endpoint: &NewEndpoint) -> Result<i64, StoreError> {
        let columns = DestinationColumns::from(&endpoint.kind);
        sqlx::query_scalar!(
            r#"INSERT INTO plantstore_webhook_endpoints
               (url, events, secret, http2, kind, stream, subject_prefix,
                cursor_pos, cursor_kind, cursor_id, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?,
                   (SELECT COALESCE(MAX(id), 0) FROM plantstore_deletions), 2, 0, ?)
           RETURNING id AS "id!: i64""#,
            columns.url,
            event_list(&endpoint.events),
            columns.secret,
            columns.http2,
            columns.kind,
            columns.stream,
            columns.subject_prefix,
            Utc::now()
        )
        .fetch_one(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)
    }

    #[tracing::instrument(skip(self))]
    async fn list_endpoints(&self) -> Result<Vec<EndpointRecord>, StoreError> {
        let rows = sqlx::query_as!(
            EndpointRow,
            r#"SELECT e.id AS "id!: i64", e.url, e.kind, e.stream, e.subject_prefix, e.events, e.http2 AS "http2!: bool",
                  e.previous_secret_until AS "previous_secret_until?: DateTime<Utc>", e.state,
                  e.delivered_through AS "delivered_through?: i64", e.last_error,
                  e.next_attempt_at AS "next_attempt_at?: DateTime<Utc>",
                  e.created_at AS "created_at!: DateTime<Utc>",
                  (SELECT count(*) FROM plantstore_deletions d
                    WHERE d.id >= e.cursor_pos
                      AND (d.id, 0, d.id) > (e.cursor_pos, e.cursor_kind, e.cursor_id))
                  + (SELECT count(*) FROM plantstore_deletions d
                      WHERE d.restored_pos >= e.cursor_pos
                        AND (d.restored_pos, 1, d.restored_seq)
                            > (e.cursor_pos, e.cursor_kind, e.cursor_id))
                    AS "pending!: i64"
           FROM plantstore_webhook_endpoints e ORDER BY e.id"#
        )
        .fetch_all(&self.readers)
        .await
        .map_err(classify)?;
        rows.into_iter().map(EndpointRecord::try_from).collect()
    }

    #[tracing::instrument(skip_all, fields(id))]
    async fn change_url(&self, id: i64, url: &str) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints SET url = ?2 WHERE id = ?1",
            id,
            url
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn remove_endpoint(&self, id: i64) -> Result<(), StoreError> {
        let done = sqlx::query!("DELETE FROM plantstore_webhook_endpoints WHERE id = ?", id)
            .execute(self.write_connection.lock().await?.conn()?)
            .await
            .map_err(classify)?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self, secret))]
    async fn rotate_secret(
        &self,
        id: i64,
        secret: &str,
        overlap: Duration,
    ) -> Result<DateTime<Utc>, StoreError> {
        let until = storable_after(Utc::now(), overlap).unwrap_or(LAST_STORABLE_TIME);
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints
         SET previous_secret = secret, previous_secret_until = ?3, secret = ?2
         WHERE id = ?1",
            id,
            secret,
            until
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        not_found_if_none(done.rows_affected())?;
        Ok(until)
    }

    #[tracing::instrument(skip(self))]
    async fn enable_endpoint(&self, id: i64) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints
         SET state = 'active', last_error = NULL, next_attempt_at = NULL,
             generation = generation + 1
         WHERE id = ?",
            id
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn replay_endpoint(&self, id: i64, from: i64) -> Result<ReplayOutcome, StoreError> {
        let mut writer = self.write_connection.lock().await?;
        let mut conn = sqlx::Connection::begin(writer.conn()?)
            .await
            .map_err(classify)?;
        let moved = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints
         SET cursor_pos = ?2, cursor_kind = 0, cursor_id = ?2 - 1, delivered_through = NULL,
             generation = generation + 1
         WHERE id = ?1 AND EXISTS (SELECT 1 FROM plantstore_deletions WHERE id = ?2)",
            id,
            from
        )
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
        if moved.rows_affected() > 0 {
            sqlx::query!(
                "DELETE FROM plantstore_stream_subjects WHERE endpoint_id = ?",
                id
            )
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
            conn.commit().await.map_err(classify)?;
            self.news.bump();
            return Ok(ReplayOutcome::Done);
        }
        let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM plantstore_webhook_endpoints WHERE id = ?) AS "e!: bool""#,
        id
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(classify)?;
        Ok(if exists {
            ReplayOutcome::NoEntry
        } else {
            ReplayOutcome::NoEndpoint
        })
    }

    #[tracing::instrument(skip(self))]
    async fn claim_endpoints(
        &self,
        owner: &str,
        lease_length: Duration,
    ) -> Result<Vec<Lease>, StoreError> {
        let now = Utc::now();
        let until = storable_after(now, lease_length).unwrap_or(LAST_STORABLE_TIME);
        let rows = sqlx::query_as!(
            LeaseRow,
            r#"UPDATE plantstore_webhook_endpoints SET lease_owner = ?1, lease_until = ?2
           WHERE state <> 'disabled'
             AND (lease_owner IS NULL OR lease_owner = ?1 OR lease_until < ?3)
           RETURNING id AS "id!: i64", url, kind, stream, subject_prefix, events, secret,
                     CASE WHEN previous_secret_until > ?3 THEN previous_secret END
                         AS "previous_secret?: String",
                     http2 AS "http2!: bool", generation AS "generation!: i64",
                     cursor_pos AS "cursor_pos!: i64", cursor_kind AS "cursor_kind!: i64",
                     cursor_id AS "cursor_id!: i64""#,
            owner,
            until,
            now
        )
        .fetch_all(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        rows.into_iter().map(Lease::try_from).collect()
    }

    /// Each kind is cut at the limit in its index's order, so a read costs what it returns.
    #[tracing::instrument(level = "debug", skip(self))]
    async fn read_events(&self, after: LogPosition, limit: i64) -> Result<Vec<Event>, StoreError> {
        let (deletes_pos, deletes_id) = after.after_for(EventKind::PlantDeleted);
        let (restores_pos, restores_id) = after.after_for(EventKind::PlantRestored);
        let rows = sqlx::query_as!(
            EventRow,
            r#"SELECT pos AS "pos!: i64", kind AS "kind!: i64", seq AS "seq!: i64",
                      id AS "id!: i64", plant_id AS "plant_id!: i64",
                      token_name AS "caller!: String", request_id AS "request_id!: String",
                      idempotency_key AS "idempotency_key?: String",
                      deleted_at AS "deleted_at!: DateTime<Utc>", snapshot AS "snapshot?: String",
                      restored_at AS "restored_at?: DateTime<Utc>",
                      restored_by AS "restored_by?: String"
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
               )
               ORDER BY pos, kind, seq
               LIMIT ?5"#,
            deletes_pos,
            deletes_id,
            restores_pos,
            restores_id,
            limit
        )
        .fetch_all(&self.readers)
        .await
        .map_err(classify)?;
        rows.into_iter().map(Event::try_from).collect()
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn stored_message(
        &self,
        endpoint_id: i64,
        plant_id: i64,
    ) -> Result<Option<StoredMessage>, StoreError> {
        let row = sqlx::query_as!(
            StoredMessageRow,
            r#"SELECT plant_id AS "plant_id!: i64", stream_seq AS "stream_seq!: i64",
                      pos AS "pos!: i64", kind AS "kind!: i64", seq AS "seq!: i64"
               FROM plantstore_stream_subjects WHERE endpoint_id = ? AND plant_id = ?"#,
            endpoint_id,
            plant_id
        )
        .fetch_optional(&self.readers)
        .await
        .map_err(classify)?;
        Ok(row.map(StoredMessage::from))
    }

    #[tracing::instrument(level = "debug", skip(self, lease), fields(endpoint = lease.endpoint_id))]
    async fn report_delivery(
        &self,
        lease: &Lease,
        owner: &str,
        report: &DeliveryReport,
    ) -> Result<bool, StoreError> {
        let mut writer = self.write_connection.lock().await?;
        let mut conn = sqlx::Connection::begin(writer.conn()?)
            .await
            .map_err(classify)?;
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints
         SET cursor_pos = ?4, cursor_kind = ?5, cursor_id = ?6,
             delivered_through = COALESCE(?7, delivered_through),
             state = ?8, last_error = ?9, next_attempt_at = ?10
         WHERE id = ?1 AND lease_owner = ?2 AND generation = ?3 AND state <> 'disabled'",
            lease.endpoint_id,
            owner,
            lease.generation,
            report.cursor.pos,
            report.cursor.kind,
            report.cursor.seq,
            report.delivered_through,
            report.state.as_str(),
            report.last_error,
            report.next_attempt_at,
        )
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        if !report.stored.is_empty() {
            // Only integers go into this JSON, so nothing needs escaping.
            let rows: Vec<String> = report
                .stored
                .iter()
                .map(|message| {
                    let at = message.position;
                    format!(
                        "[{},{},{},{},{}]",
                        message.plant_id, message.stream_seq, at.pos, at.kind, at.seq
                    )
                })
                .collect();
            let stored = format!("[{}]", rows.join(","));
            sqlx::query!(
                "INSERT INTO plantstore_stream_subjects
                     (endpoint_id, plant_id, stream_seq, pos, kind, seq)
                 SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4
                 FROM json_each(?2) WHERE true
                 ON CONFLICT (endpoint_id, plant_id) DO UPDATE
                 SET stream_seq = excluded.stream_seq, pos = excluded.pos,
                     kind = excluded.kind, seq = excluded.seq",
                lease.endpoint_id,
                stored
            )
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
        }
        conn.commit().await.map_err(classify)?;
        Ok(true)
    }

    #[tracing::instrument(skip(self))]
    async fn release_endpoints(&self, owner: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE plantstore_webhook_endpoints SET lease_owner = NULL, lease_until = NULL
         WHERE lease_owner = ?",
            owner
        )
        .execute(self.write_connection.lock().await?.conn()?)
        .await
        .map_err(classify)?;
        Ok(())
    }
}
