//! Plant Store: the published `DELETE /plants/{id}` over SQLite or PostgreSQL.

pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod connections;
pub mod cors;
pub mod deletions;
pub mod error;
pub mod idempotency;
pub mod jwt;
pub mod metrics;
pub mod middleware;
pub mod ops;
pub mod rate_limit;
pub mod request_id;
pub mod routes;
pub mod startup;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod tokens;
