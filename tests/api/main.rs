//! One integration-test binary: the real server against real SQLite files and PostgreSQL.

// A test binary has no public API: its helpers are `pub` for its own modules.
#![allow(unreachable_pub)]

mod fixtures;
mod helpers;

mod auth;
mod cli;
mod connections;
mod contract;
mod cors;
mod delete;
mod deletion_log;
mod existing_database;
mod failover;
mod group_commit;
mod idempotency;
mod image;
mod jwt;
mod layers;
mod metrics;
mod ops;
mod outage;
mod reference;
mod retention;
mod routing;
mod scale_out;
mod security;
mod streams;
mod sync_standby;
mod under_load;
mod webhooks;
