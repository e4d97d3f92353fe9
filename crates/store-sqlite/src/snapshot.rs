//! The JSON snapshot of a deleted plant and putting it back: built at run time, because an
//! existing database's `plants` columns are unknown at compile time.

use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection, query::Query, sqlite::SqliteArguments};

use plantstore_store::StoreError;

/// Deletes the plants whose ids are in a JSON array, returning each one's id and snapshot
/// (not of generated columns: SQLite computes them again). Names are quoted as identifiers
/// and as JSON keys; every value is a column or a bound parameter, never statement text.
pub(crate) async fn delete_statement(conn: &mut SqliteConnection) -> Result<String, StoreError> {
    let names = table_columns(conn).await?;
    // A BLOB cannot be a JSON value: kept as {"blob": "<hex>"}, which no other value can look
    // like (json_object writes TEXT as a string). json_object writes a REAL with 15 digits,
    // losing some doubles (0.1 + 0.2): it gets 17 where 15 do not read back the same, and
    // keeps its decimal point (`!`), so 1.0 comes back REAL, not INTEGER.
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

/// In table order.
pub(crate) async fn table_columns(conn: &mut SqliteConnection) -> Result<Vec<String>, StoreError> {
    sqlx::query_scalar!(
        r#"SELECT '' || name AS "name!: String" FROM pragma_table_info('plants') ORDER BY cid"#
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(crate::errors::classify)
}

/// `names` must be exactly the snapshot's keys (checked before).
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
