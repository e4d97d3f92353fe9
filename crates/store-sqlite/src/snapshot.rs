//! The JSON snapshot of a deleted plant and putting it back: the statements built at run
//! time, because an existing database's `plants` columns are unknown at compile time.

use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection, query::Query, sqlite::SqliteArguments};

use plantstore_store::StoreError;

/// The statement that deletes the plants whose ids are in a JSON array, returning each
/// one's id and snapshot, built from the columns of `plants` now (generated columns are not
/// among them, and are not snapshot: SQLite computes them again). Names are quoted as
/// identifiers and as JSON keys (string literals); every value is a column or a bound
/// parameter, never text in the statement.
pub(crate) async fn delete_statement(conn: &mut SqliteConnection) -> Result<String, StoreError> {
    let names = table_columns(conn).await?;
    // A BLOB cannot be a JSON value: it is kept as {"blob": "<hex>"}, which no other
    // column value can look like (json_object writes TEXT as a JSON string). A REAL
    // is written by json_object with 15 digits, which loses some doubles (0.1 + 0.2):
    // it gets 17 where 15 do not read back as the same number, and keeps its decimal
    // point (`!`), so 1.0 comes back REAL, not INTEGER.
    let pairs: Vec<String> = names
        .iter()
        .map(|name| {
            let c = identifier(name);
            format!(
                "{}, CASE typeof({c}) \
                   WHEN 'blob' THEN json_object('blob', hex({c})) \
                   WHEN 'real' THEN json(CASE WHEN CAST(printf('%!.15g', {c}) AS REAL) = {c} \
                                             THEN printf('%!.15g', {c}) ELSE printf('%!.17g', {c}) END) \
                   ELSE {c} END",
                literal(name)
            )
        })
        .collect();
    Ok(format!(
        "DELETE FROM plants WHERE id IN (SELECT value FROM json_each(?)) \
         RETURNING id, json_object({})",
        pairs.join(", ")
    ))
}

/// The columns of `plants` now, in table order.
pub(crate) async fn table_columns(conn: &mut SqliteConnection) -> Result<Vec<String>, StoreError> {
    sqlx::query_scalar!(
        r#"SELECT '' || name AS "name!: String" FROM pragma_table_info('plants') ORDER BY cid"#
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(crate::errors::classify)
}

/// Inserts the snapshot of log entry `entry` into `plants`, one column per name in
/// `names` (which the snapshot has been checked to hold exactly).
pub(crate) fn insert_from_snapshot(
    names: &[String],
    entry: i64,
) -> Query<'static, Sqlite, SqliteArguments> {
    let columns: Vec<String> = names.iter().map(|name| identifier(name)).collect();
    let values: Vec<String> = names
        .iter()
        .map(|name| {
            format!(
                "(SELECT CASE type WHEN 'object' THEN unhex(value ->> 'blob') ELSE value END \
                 FROM json_each(log.snapshot) WHERE key = {})",
                literal(name)
            )
        })
        .collect();
    let sql = format!(
        "INSERT INTO plants ({}) SELECT {} FROM plantstore_deletions AS log WHERE log.id = ?",
        columns.join(", "),
        values.join(", ")
    );
    sqlx::query(AssertSqlSafe(sql)).bind(entry)
}

fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(name: &str) -> String {
    format!("'{}'", name.replace('\'', "''"))
}
