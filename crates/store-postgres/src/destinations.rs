//! Deletion events on PostgreSQL: the log's events are read in commit order, `(xid, kind,
//! id)`, up to the oldest transaction of the service's own sessions still running.

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
};

use crate::{PostgresStore, database::APPLICATION_NAME};

#[async_trait]
impl Destinations for PostgresStore {
    #[tracing::instrument(skip_all)]
    async fn add_endpoint(&self, endpoint: &NewEndpoint) -> Result<i64, StoreError> {
        // The cursor starts before every transaction still running: whatever commits from now
        // on is after it (a few events committed just before may come too).
        let columns = DestinationColumns::from(&endpoint.kind);
        sqlx::query_scalar!(
            "INSERT INTO plantstore_webhook_endpoints
             (url, events, secret, http2, kind, stream, subject_prefix,
              cursor_pos, cursor_kind, cursor_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7,
                 pg_snapshot_xmin(pg_current_snapshot())::TEXT::BIGINT - 1, 2, 0)
         RETURNING id",
            columns.url,
            event_list(&endpoint.events),
            columns.secret,
            columns.http2,
            columns.kind,
            columns.stream,
            columns.subject_prefix,
        )
        .fetch_one(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))
    }

    #[tracing::instrument(skip(self))]
    async fn list_endpoints(&self) -> Result<Vec<EndpointRecord>, StoreError> {
        let rows = sqlx::query_as!(
            EndpointRow,
            r#"SELECT e.id, e.url, e.kind, e.stream, e.subject_prefix, e.events, e.http2, e.previous_secret_until, e.state,
                  e.delivered_through, e.last_error,
                  e.next_attempt_at, e.created_at,
                  (SELECT count(*) FROM plantstore_deletions d
                    WHERE d.xid >= GREATEST(e.cursor_pos, 0)::TEXT::xid8
                      AND (d.xid::TEXT::BIGINT, 0::BIGINT, d.id)
                          > (e.cursor_pos, e.cursor_kind, e.cursor_id))
                  + (SELECT count(*) FROM plantstore_deletions d
                      WHERE d.restored_xid >= GREATEST(e.cursor_pos, 0)::TEXT::xid8
                        AND (d.restored_xid::TEXT::BIGINT, 1::BIGINT, d.id)
                            > (e.cursor_pos, e.cursor_kind, e.cursor_id)) AS "pending!"
           FROM plantstore_webhook_endpoints e ORDER BY e.id"#
        )
        .fetch_all(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        rows.into_iter().map(EndpointRecord::try_from).collect()
    }

    #[tracing::instrument(skip(self))]
    async fn remove_endpoint(&self, id: i64) -> Result<(), StoreError> {
        let done = sqlx::query!("DELETE FROM plantstore_webhook_endpoints WHERE id = $1", id)
            .execute(&mut *self.db.conn().await?)
            .await
            .map_err(|err| self.db.error(err))?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self, secret))]
    async fn rotate_secret(
        &self,
        id: i64,
        secret: &str,
        overlap: Duration,
    ) -> Result<DateTime<Utc>, StoreError> {
        let until = sqlx::query_scalar!(
            r#"UPDATE plantstore_webhook_endpoints
           SET previous_secret = secret, previous_secret_until = now() + make_interval(secs => $3),
               secret = $2
           WHERE id = $1
           RETURNING previous_secret_until AS "until!""#,
            id,
            secret,
            overlap.as_secs_f64()
        )
        .fetch_optional(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        until.ok_or(StoreError::NotFound)
    }

    #[tracing::instrument(skip_all, fields(id))]
    async fn change_url(&self, id: i64, url: &str) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints SET url = $2 WHERE id = $1",
            id,
            url
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn enable_endpoint(&self, id: i64) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints
         SET state = 'active', last_error = NULL, next_attempt_at = NULL,
             generation = generation + 1
         WHERE id = $1",
            id
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        not_found_if_none(done.rows_affected())
    }

    #[tracing::instrument(skip(self))]
    async fn replay_endpoint(&self, id: i64, from: i64) -> Result<ReplayOutcome, StoreError> {
        let mut conn = self.db.conn().await?;
        let mut conn = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(|err| self.db.error(err))?;
        let moved = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints e
         SET cursor_pos = d.xid::TEXT::BIGINT, cursor_kind = 0, cursor_id = d.id - 1,
             delivered_through = NULL, generation = e.generation + 1
         FROM plantstore_deletions d
         WHERE e.id = $1 AND d.id = $2 AND d.xid IS NOT NULL",
            id,
            from
        )
        .execute(&mut *conn)
        .await
        .map_err(|err| self.db.error(err))?;
        if moved.rows_affected() > 0 {
            sqlx::query!(
                "DELETE FROM plantstore_stream_subjects WHERE endpoint_id = $1",
                id
            )
            .execute(&mut *conn)
            .await
            .map_err(|err| self.db.error(err))?;
            conn.commit().await.map_err(|err| self.db.error(err))?;
            self.news.bump();
            return Ok(ReplayOutcome::Done);
        }
        let exists = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM plantstore_webhook_endpoints WHERE id = $1) AS "e!""#,
            id
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(|err| self.db.error(err))?;
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
        // The database's clock, not the instances': theirs may disagree.
        let rows = sqlx::query_as!(
            LeaseRow,
            "UPDATE plantstore_webhook_endpoints
         SET lease_owner = $1, lease_until = now() + make_interval(secs => $2)
         WHERE state <> 'disabled'
           AND (lease_owner IS NULL OR lease_owner = $1 OR lease_until < now())
         RETURNING id, url, kind, stream, subject_prefix, events, secret,
                   CASE WHEN previous_secret_until > now() THEN previous_secret END
                       AS \"previous_secret?\",
                   http2, generation, cursor_pos, cursor_kind, cursor_id",
            owner,
            lease_length.as_secs_f64()
        )
        .fetch_all(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        rows.into_iter().map(Lease::try_from).collect()
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn read_events(&self, after: LogPosition, limit: i64) -> Result<Vec<Event>, StoreError> {
        // The horizon: the oldest transaction running in this statement's snapshot, but for
        // those pg_stat_activity shows in another application's session (only the service
        // writes the log). None below it can still commit behind what is read; one not found
        // there (ended meanwhile, prepared) still counts: doubt only stalls, never skips. Each
        // kind is cut at `limit` in its index's order, so a read costs what it returns.
        let (deletes_xid, deletes_id) = after.after_for(EventKind::PlantDeleted);
        let (restores_xid, restores_id) = after.after_for(EventKind::PlantRestored);
        let mut conn = self.db.interruptible_conn().await?;
        let rows = sqlx::query_as!(
            EventRow,
            r#"WITH snapshot AS (SELECT pg_current_snapshot() AS taken),
           horizon AS (
               SELECT LEAST(pg_snapshot_xmax(taken),
                            (SELECT min(running) FROM pg_snapshot_xip(taken) AS running
                             WHERE NOT EXISTS (
                                 SELECT 1 FROM pg_stat_activity a
                                 WHERE a.backend_xid = running::xid
                                   AND a.application_name IS DISTINCT FROM $6))) AS xmin
               FROM snapshot)
           SELECT pos AS "pos!", kind AS "kind!", id AS "seq!", id AS "id!", plant_id AS "plant_id!",
                  token_name AS "caller!", request_id AS "request_id!", idempotency_key,
                  deleted_at AS "deleted_at!", snapshot, restored_at, restored_by
           FROM (
               (SELECT d.xid::TEXT::BIGINT AS pos, 0::BIGINT AS kind, d.id, d.plant_id,
                       d.token_name, d.request_id, d.idempotency_key, d.deleted_at,
                       d.snapshot::TEXT AS snapshot, d.restored_at, d.restored_by
                FROM plantstore_deletions d
                WHERE (d.xid, d.id) > (GREATEST($1::BIGINT, 0)::TEXT::xid8, $2::BIGINT)
                  AND d.xid < (SELECT xmin FROM horizon)
                ORDER BY d.xid, d.id
                LIMIT $5)
               UNION ALL
               (SELECT d.restored_xid::TEXT::BIGINT, 1, d.id, d.plant_id,
                       d.token_name, d.request_id, d.idempotency_key, d.deleted_at,
                       d.snapshot::TEXT, d.restored_at, d.restored_by
                FROM plantstore_deletions d
                WHERE d.restored_xid IS NOT NULL
                  AND (d.restored_xid, d.id) > (GREATEST($3::BIGINT, 0)::TEXT::xid8, $4::BIGINT)
                  AND d.restored_xid < (SELECT xmin FROM horizon)
                ORDER BY d.restored_xid, d.id
                LIMIT $5)
           ) AS events
           ORDER BY pos, kind, id
           LIMIT $5"#,
            deletes_xid,
            deletes_id,
            restores_xid,
            restores_id,
            limit,
            APPLICATION_NAME
        )
        .fetch_all(conn.conn())
        .await
        .map_err(|err| self.db.error(err))?;
        let events = rows
            .into_iter()
            .map(Event::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        // An entry read may be one whose wait for the synchronous standbys was cut short: it
        // is sent only once the barrier, on the same connection (so server), says they hold
        // it. A caller that stops waiting closes the connection.
        #[cfg(not(feature = "negative-control"))]
        if !events.is_empty() {
            crate::sync_replication::barrier(&self.db, conn.conn()).await?;
        }
        conn.finished();
        Ok(events)
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn stored_message(
        &self,
        endpoint_id: i64,
        plant_id: i64,
    ) -> Result<Option<StoredMessage>, StoreError> {
        let row = sqlx::query_as!(
            StoredMessageRow,
            "SELECT plant_id, stream_seq, pos, kind, seq FROM plantstore_stream_subjects
             WHERE endpoint_id = $1 AND plant_id = $2",
            endpoint_id,
            plant_id
        )
        .fetch_optional(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(row.map(StoredMessage::from))
    }

    #[tracing::instrument(level = "debug", skip(self, lease), fields(endpoint = lease.endpoint_id))]
    async fn report_delivery(
        &self,
        lease: &Lease,
        owner: &str,
        report: &DeliveryReport,
    ) -> Result<bool, StoreError> {
        let mut conn = self.db.conn().await?;
        let mut conn = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(|err| self.db.error(err))?;
        let done = sqlx::query!(
            "UPDATE plantstore_webhook_endpoints
         SET cursor_pos = $4, cursor_kind = $5, cursor_id = $6,
             delivered_through = COALESCE($7, delivered_through),
             state = $8, last_error = $9, next_attempt_at = $10
         WHERE id = $1 AND lease_owner = $2 AND generation = $3 AND state <> 'disabled'",
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
        .map_err(|err| self.db.error(err))?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        if !report.stored.is_empty() {
            let column = |value: fn(&StoredMessage) -> i64| -> Vec<i64> {
                report.stored.iter().map(value).collect()
            };
            sqlx::query!(
                "INSERT INTO plantstore_stream_subjects
                     (endpoint_id, plant_id, stream_seq, pos, kind, seq)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::BIGINT[],
                                          $5::BIGINT[], $6::BIGINT[])
                 ON CONFLICT (endpoint_id, plant_id) DO UPDATE
                 SET stream_seq = excluded.stream_seq, pos = excluded.pos,
                     kind = excluded.kind, seq = excluded.seq",
                lease.endpoint_id,
                &column(|message| message.plant_id),
                &column(|message| message.stream_seq),
                &column(|message| message.position.pos),
                &column(|message| message.position.kind),
                &column(|message| message.position.seq),
            )
            .execute(&mut *conn)
            .await
            .map_err(|err| self.db.error(err))?;
        }
        conn.commit().await.map_err(|err| self.db.error(err))?;
        Ok(true)
    }

    #[tracing::instrument(skip(self))]
    async fn release_endpoints(&self, owner: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE plantstore_webhook_endpoints SET lease_owner = NULL, lease_until = NULL
         WHERE lease_owner = $1",
            owner
        )
        .execute(&mut *self.db.conn().await?)
        .await
        .map_err(|err| self.db.error(err))?;
        Ok(())
    }
}
