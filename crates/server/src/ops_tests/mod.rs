//! The operations' unit tests that run on a whole server.

mod config_tree;
mod extended;
mod search;
