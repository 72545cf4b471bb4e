//! The operations' unit tests that run on a whole server.

mod extended;
mod search;
