//! One integration-test binary: the real server against real SQLite files and PostgreSQL.

mod helpers;

mod auth;
mod cli;
mod connections;
mod contract;
mod cors;
mod delete;
mod deletion_log;
mod existing_database;
mod group_commit;
mod idempotency;
mod image;
mod jwt;
mod metrics;
mod ops;
mod outage;
mod pg_server;
mod routing;
mod scale_out;
mod security;
mod under_load;
