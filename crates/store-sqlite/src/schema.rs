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
    let found = sqlx::query!(
            r#"SELECT
                (SELECT '' || type FROM pragma_table_info('plants') WHERE name = 'id') AS "id_type?: String",
                (SELECT instr(upper(type), 'INT') > 0 FROM pragma_table_info('plants') WHERE name = 'id') AS "id_is_integer?: bool",
                ((SELECT pk FROM pragma_table_info('plants') WHERE name = 'id') = 1
                 AND (SELECT COUNT(*) FROM pragma_table_info('plants') WHERE pk > 0) = 1)
                OR EXISTS (SELECT 1 FROM pragma_index_list('plants') AS il
                           WHERE il."unique" = 1 AND il.partial = 0
                             AND (SELECT COUNT(*) FROM pragma_index_info(il.name)) = 1
                             AND (SELECT name FROM pragma_index_info(il.name)) = 'id') AS "id_is_unique!: bool",
                (SELECT COUNT(*) FROM sqlite_master
                  WHERE type = 'table' AND name IN ('plantstore_tokens', 'plantstore_deletions',
                                                 'plantstore_webhook_endpoints'))
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_deletions')
                    WHERE name = 'snapshot')
                + (SELECT COUNT(*) FROM pragma_table_info('plantstore_webhook_endpoints')
                    WHERE name = 'previous_secret') AS "own_tables!: i64""#
        )
        .fetch_one(readers)
        .await
        .map_err(classify)?;
    schema_verdict(&SchemaFacts {
        plants_id_type: found.id_type.map(|declared| {
            if declared.is_empty() {
                "(no declared type)".to_owned()
            } else {
                declared
            }
        }),
        plants_id_is_integer: found.id_is_integer.unwrap_or(false),
        plants_id_is_unique: found.id_is_unique,
        has_own_tables: found.own_tables == 5,
    })
}
