//! `cargo run --release -p pando-gen --example makeldif -- TEMPLATE [SEED] [name=value ...]`
//! writes LDIF to stdout and a rate to stderr. TEMPLATE is a built-in name
//! (example, telco) or a file path.

use std::io::{BufWriter, Write};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        eprintln!("usage: makeldif TEMPLATE [SEED] [name=value ...]");
        std::process::exit(2);
    };
    let text = match pando_gen::builtin(name) {
        Some(t) => t.to_string(),
        None => match std::fs::read_to_string(name) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{name}: {e}");
                std::process::exit(1);
            }
        },
    };
    let mut opts = pando_gen::Options::default();
    for a in &args[1..] {
        match a.split_once('=') {
            Some((k, v)) => opts.defines.push((k.to_string(), v.to_string())),
            None => opts.seed = a.parse().unwrap_or(0),
        }
    }
    let result = pando_gen::Template::parse(&text, name).and_then(|t| {
        let stdout = std::io::stdout();
        let mut out = BufWriter::with_capacity(1 << 20, stdout.lock());
        let start = Instant::now();
        let stats = pando_gen::generate(&t, &opts, &mut out)?;
        out.flush()?;
        Ok((stats, start.elapsed()))
    });
    match result {
        Ok((stats, took)) => eprintln!(
            "{} entries, {} bytes in {:.2?} ({:.0} entries/s)",
            stats.entries,
            stats.bytes,
            took,
            stats.entries as f64 / took.as_secs_f64()
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
