//! Commits the synchronous standbys hold (docs/operations.md, "PostgreSQL with synchronous
//! standbys"). A commit whose wait for them is cancelled is answered as a success with a
//! WARNING, the only sign that a failover may take it back; every commit a user or a
//! receiver is told of runs through `replicated`, which turns it into `NotReplicated`.
//!
//! Why this sees every such WARNING, whatever subscriber the application installed:
//! - sqlx decodes a notice only in `PgStream::recv`, and the statement futures read up to
//!   `ReadyForQuery`, which the WARNING precedes, before they resolve: so it is decoded inside
//!   a poll of that future, on the polling thread;
//! - sqlx then emits a WARN event, target `sqlx::postgres::notice`, to the thread's current
//!   dispatcher, during those polls `NoticeWatch` (`dispatcher::with_default`): made once and
//!   never dropped, tracing asks it about every callsite, so the notice's stay enabled at WARN
//!   whatever the application's filter says.
//!
//! The severity is the signal, not the text: the WARNING's SQLSTATE is the generic 01000, and
//! a commit has no other WARNING to give. Every other event during those polls goes on to
//! the dispatcher that was current, so the log is as it was.

use std::{
    cell::{Cell, RefCell},
    future::{Future, poll_fn},
    pin::pin,
    sync::LazyLock,
};

use plantstore_store::StoreError;
use sqlx::PgConnection;
use tracing::{
    Dispatch, Event, Level, Metadata, Subscriber, dispatcher,
    level_filters::{LevelFilter, STATIC_MAX_LEVEL},
    span,
    subscriber::Interest,
};

use crate::database::Database;

const NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// `statement`'s success is a commit; `NotReplicated` if its answer carried a WARNING.
pub(crate) async fn replicated<T>(
    db: &Database,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    let (result, warned) = watching_notices(statement).await;
    // Logged once, by the caller that answers for it (`StoreError`'s text says what).
    let value = result.map_err(|err| db.error(err))?;
    if warned {
        return Err(StoreError::NotReplicated);
    }
    Ok(value)
}

/// Waits until the synchronous standbys hold every commit this session has seen: commits a
/// transactional logical message (it waits as `synchronous_commit` says; no row locked, no
/// table grown, any role, any `wal_level`), and a standby flushes WAL in order. For commits
/// the service vouches for but did not make (an event read, a replayed `204`).
pub(crate) async fn barrier(db: &Database, conn: &mut PgConnection) -> Result<(), StoreError> {
    replicated(
        db,
        sqlx::query!("SELECT pg_logical_emit_message(true, 'plantstore', '')::TEXT")
            .fetch_one(conn),
    )
    .await
    .map(drop)
}

/// A `tracing` built with a static maximum level below WARN (`max_level_error`) hides them.
pub(crate) fn notices_visible() -> bool {
    STATIC_MAX_LEVEL >= LevelFilter::WARN
}

/// `statement`'s output, and whether a notice of WARNING or worse came during its polls.
async fn watching_notices<T>(statement: impl Future<Output = T>) -> (T, bool) {
    let mut statement = pin!(statement);
    let mut warned = false;
    if dispatcher::get_default(|current| current.is::<NoticeWatch>()) {
        // Inside a watched statement already: the outer watch sees it.
        return (statement.await, false);
    }
    let output = poll_fn(|cx| {
        let outer = dispatcher::get_default(Dispatch::clone);
        OUTER.replace(Some(outer));
        let poll = dispatcher::with_default(&WATCH, || statement.as_mut().poll(cx));
        warned |= WARNED.take();
        OUTER.take();
        poll
    })
    .await;
    (output, warned)
}

thread_local! {
    /// Current when the watched poll began, for every other event.
    static OUTER: RefCell<Option<Dispatch>> = const { RefCell::new(None) };
    /// Set when a notice of WARNING or worse came during the watched poll.
    static WARNED: Cell<bool> = const { Cell::new(false) };
}

/// Made once: each new dispatcher makes tracing recompute every callsite's interest.
static WATCH: LazyLock<Dispatch> = LazyLock::new(|| {
    LazyLock::force(&SECOND);
    Dispatch::new(NoticeWatch)
});

/// Never current, only registered: while at most one dispatcher was ever made, tracing-core
/// asks the current thread's about a callsite met first. With no global subscriber (a test, a
/// command), a notice first met outside a watched statement (on a connection a crash ends)
/// would then be disabled for good, and missed inside one.
static SECOND: LazyLock<Dispatch> = LazyLock::new(|| Dispatch::new(NoticeWatch));

/// Notes the notices and forwards every event to the dispatcher that was current. Spans are
/// not made while it is current (none are opened inside a statement).
struct NoticeWatch;

fn is_warning_notice(metadata: &Metadata<'_>) -> bool {
    metadata.target() == NOTICE_TARGET && *metadata.level() <= Level::WARN
}

fn with_outer<T>(f: impl FnOnce(&Dispatch) -> T) -> Option<T> {
    OUTER.with_borrow(|outer| outer.as_ref().map(f))
}

impl Subscriber for NoticeWatch {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Only the notices' callsites: saying "sometimes" to others would make tracing ask
        // the application's dispatcher about each of their events, not once.
        if is_warning_notice(metadata) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::WARN)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        if metadata.is_span() {
            return false;
        }
        is_warning_notice(metadata) || with_outer(|outer| outer.enabled(metadata)).unwrap_or(false)
    }

    fn event(&self, event: &Event<'_>) {
        if is_warning_notice(event.metadata()) {
            WARNED.set(true);
        }
        with_outer(|outer| {
            if outer.enabled(event.metadata()) {
                outer.event(event);
            }
        });
    }

    // Never called: `enabled` refuses every span.
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_can_see_warnings() {
        assert!(notices_visible());
    }

    /// The event as sqlx emits it, with no subscriber of the test's own.
    #[tokio::test]
    async fn a_warning_notice_inside_the_statement_is_seen() {
        let warn = async { tracing::event!(target: NOTICE_TARGET, Level::WARN, message = "x") };
        assert!(watching_notices(warn).await.1);
        let error = async { tracing::event!(target: NOTICE_TARGET, Level::ERROR, message = "x") };
        assert!(watching_notices(error).await.1);
        let notice = async { tracing::event!(target: NOTICE_TARGET, Level::INFO, message = "x") };
        assert!(!watching_notices(notice).await.1);
        let elsewhere = async { tracing::warn!(target: "sqlx::query", "x") };
        assert!(!watching_notices(elsewhere).await.1);
        let quiet = async {};
        assert!(!watching_notices(quiet).await.1);
    }

    fn server_warning() {
        tracing::event!(target: NOTICE_TARGET, Level::WARN, message = "x");
    }

    #[tokio::test]
    async fn a_notice_first_met_outside_a_watch_is_still_seen_inside_one() {
        LazyLock::force(&WATCH);
        server_warning();
        assert!(watching_notices(async { server_warning() }).await.1);
    }
}
