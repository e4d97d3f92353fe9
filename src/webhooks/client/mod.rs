//! The HTTP/1.1 client delivery posts with: each endpoint's keep-alive connections, the
//! requests they carry (several in one write when they come together) and the answers.

mod address;
mod answer;
mod connection;
mod connections;
mod connector;

pub(super) use address::{Address, request};
pub(super) use connection::{Answered, NoAnswer};
pub(super) use connections::Connections;
pub(super) use connector::Connector;
