//! Plant Store: the published `DELETE /plants/{id}` over SQLite or PostgreSQL.
//!
//! Layers, each knowing only those below it: `cli` and `startup` at the top; `http`,
//! `health`, `delivery` and `retention`; `auth` and `telemetry`; `connection_limits`;
//! `database` (the backend crates behind `plantstore_store`); `config` at the bottom.
//! Public only what the binary, the tests and fuzz use.

pub mod auth;
pub mod cli;
pub mod config;
pub mod connection_limits;
pub mod database;
pub mod delivery;
mod health;
pub mod http;
mod retention;
pub mod startup;
pub mod state;
pub mod telemetry;
