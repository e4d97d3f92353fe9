//! What the database holds of the tables the service needs, read from PostgreSQL's catalog.

use plantstore_store::{
    StoreError,
    backend::{SchemaFacts, schema_verdict},
};

use crate::database::Database;

#[tracing::instrument(skip(db))]
pub(crate) async fn check(db: &Database) -> Result<(), StoreError> {
    // to_regclass resolves through search_path, as the service's own queries do. A
    // unique index counts only on exactly (id) and without a WHERE clause.
    let facts = sqlx::query_as!(
            SchemaFacts,
            r#"WITH id AS (
                   SELECT attnum, atttypid, format_type(atttypid, atttypmod) AS type_name
                   FROM pg_attribute
                   WHERE attrelid = to_regclass('plants') AND attname = 'id' AND NOT attisdropped
               )
               SELECT
                   (SELECT type_name FROM id) AS "plants_id_type?",
                   COALESCE((SELECT atttypid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype)
                             FROM id), false) AS "plants_id_is_integer!",
                   EXISTS (SELECT 1 FROM pg_index i, id
                           WHERE i.indrelid = to_regclass('plants') AND i.indisunique
                             AND i.indnkeyatts = 1 AND i.indkey[0] = id.attnum
                             AND i.indpred IS NULL) AS "plants_id_is_unique!",
                   (to_regclass('plantstore_tokens') IS NOT NULL
                    AND to_regclass('plantstore_webhook_endpoints') IS NOT NULL
                    AND EXISTS (SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass('plantstore_deletions')
                                  AND attname = 'snapshot' AND NOT attisdropped)
                    AND EXISTS (SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass('plantstore_webhook_endpoints')
                                  AND attname = 'previous_secret' AND NOT attisdropped)) AS "has_own_tables!""#
        )
        .fetch_one(&mut *db.conn().await?)
        .await
        .map_err(|err| db.error(err))?;
    schema_verdict(&facts)
}
