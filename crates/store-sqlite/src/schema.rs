//! What the database holds of the tables the service needs, read from SQLite's catalog.

use plantstore_store::{
    StoreError,
    backend::{SchemaFacts, schema_verdict},
};
use sqlx::SqlitePool;

use crate::errors::classify;

#[tracing::instrument(skip(readers))]
pub(crate) async fn check(readers: &SqlitePool) -> Result<(), StoreError> {
    // INTEGER affinity is any declared type containing "INT" (SQLite's own rule). Unique:
    // the whole primary key, or a unique index on exactly (id) without a WHERE clause.
    let facts = sqlx::query_as!(
            SchemaFacts,
            r#"SELECT
                (SELECT coalesce(nullif(type, ''), '(no declared type)') FROM pragma_table_info('plants') WHERE name = 'id') AS "plants_id_type?: String",
                coalesce((SELECT instr(upper(type), 'INT') > 0 FROM pragma_table_info('plants') WHERE name = 'id'), false) AS "plants_id_is_integer!: bool",
                ((SELECT pk FROM pragma_table_info('plants') WHERE name = 'id') = 1
                 AND (SELECT COUNT(*) FROM pragma_table_info('plants') WHERE pk > 0) = 1)
                OR EXISTS (SELECT 1 FROM pragma_index_list('plants') AS il
                           WHERE il."unique" = 1 AND il.partial = 0
                             AND (SELECT COUNT(*) FROM pragma_index_info(il.name)) = 1
                             AND (SELECT name FROM pragma_index_info(il.name)) = 'id') AS "plants_id_is_unique!: bool",
                (SELECT COUNT(*) FROM sqlite_master
                  WHERE type = 'table' AND name IN ('plantstore_tokens', 'plantstore_deletions',
                                                 'plantstore_webhook_endpoints'))
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_deletions')
                    WHERE name = 'snapshot')
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_webhook_endpoints')
                    WHERE name = 'previous_secret') = 5 AS "has_own_tables!: bool""#
        )
        .fetch_one(readers)
        .await
        .map_err(classify)?;
    schema_verdict(&facts)
}
