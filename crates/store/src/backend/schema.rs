//! Checks at start that both backends share: the schema the service needs, and a first
//! connection that reports its real cause.

use crate::StoreError;

/// What a backend found in its catalog about the tables the service uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaFacts {
    /// The declared type of `plants.id`; `None` when there is no such column.
    pub plants_id_type: Option<String>,
    /// An integer type: smallint, integer or bigint (SQLite: INTEGER affinity).
    pub plants_id_is_integer: bool,
    /// A primary key or unique index on exactly `(id)`, with no condition: one id can
    /// never name, and so never delete, several rows.
    pub plants_id_is_unique: bool,
    /// The service's tables, as its latest migration leaves them.
    pub has_own_tables: bool,
}

/// What `Store::check_schema` reports, given what a backend found in its catalog.
pub fn schema_verdict(facts: &SchemaFacts) -> Result<(), StoreError> {
    let Some(id_type) = &facts.plants_id_type else {
        return Err(StoreError::Schema(
            "the database has no plants.id column: create the plants table, or start with PLANTSTORE_MIGRATE=true".into(),
        ));
    };
    if !facts.plants_id_is_integer {
        return Err(StoreError::Schema(format!(
            "plants.id is of type {id_type}: the service needs an integer column (smallint, integer or bigint) to delete plants by id"
        )));
    }
    if !facts.plants_id_is_unique {
        return Err(StoreError::Schema(format!(
            "plants.id ({id_type}) is not unique: add a primary key or a unique index on plants (id), so that one id can never delete several rows"
        )));
    }
    if !facts.has_own_tables {
        return Err(StoreError::Schema(
            "the service's own tables are missing or older than this version: run `plantstore migrate` once, or start with PLANTSTORE_MIGRATE=true".into(),
        ));
    }
    Ok(())
}

/// Opens and closes one connection, waiting at most `wait`.
///
/// Backends call it before building their pool: the pool retries a refused connection
/// until its timeout and then reports only that it timed out, while a user needs the
/// cause ("connection refused", "password authentication failed", "unable to open file").
pub async fn probe<O>(options: &O, wait: std::time::Duration) -> Result<(), sqlx::Error>
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    use sqlx::Connection;
    match tokio::time::timeout(wait, options.connect()).await {
        Ok(connection) => connection?.close().await,
        Err(_elapsed) => Err(sqlx::Error::PoolTimedOut),
    }
}
