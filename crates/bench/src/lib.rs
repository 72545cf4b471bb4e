//! `pando bench`: an LDAP load generator fast enough to saturate Pando.
//!
//! The key decision: the generator shares the machine with the server, so
//! every cycle it spends is taken from what it measures. Requests are
//! therefore encoded from templates compiled once ([`template`]): sending a
//! search is copying a few byte runs and the digits of its key into a
//! reused buffer. Responses are read for their envelope only (message ID,
//! operation, result code; [`wire`]). Each load thread is a current-thread
//! tokio runtime driving many connections, each with up to `--depth`
//! pipelined requests, and records latencies into its own HDR histogram,
//! merged once per interval ([`runner`]). Nothing is allocated per
//! operation once the buffers have grown to their working size.
//!
//! Workloads: searchrate, authrate (search, then bind as the DN found),
//! bindrate, modrate, addrate/delrate, and a mix; keys uniform, hot-set or
//! sequential; closed loop (as fast as the server answers) or open loop at
//! a fixed rate with latency measured from each request's scheduled time
//! ([`schedule`]), which avoids coordinated omission.

mod client;
pub mod config;
pub mod keys;
mod replay;
mod report;
mod runner;
pub mod schedule;
pub mod stats;
pub mod template;
pub mod wire;

pub use config::BenchArgs;

/// Runs `pando bench` with its own runtimes; returns once the summary is
/// printed. An error names what was wrong (bad option, connection refused,
/// bind failure with the LDAP result, a fatal protocol problem).
pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.replay.is_some() {
        return replay::run(args);
    }
    let plan = config::Plan::from_args(args)?;
    runner::execute(plan)
}
