//! Threads, the clock, and the reporter.
//!
//! `--threads` OS threads each run a current-thread tokio runtime with
//! their share of the clients as local tasks, plus a ticker that hands the
//! thread's [`Stats`] to the reporter at every interval boundary (so the
//! hot path records into a thread-local histogram without locks). The main
//! thread opens nothing itself: it waits until every client is connected
//! and bound, starts the clock, then merges the threads' reports into one
//! line per interval and the final summary.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use crate::client::{self, Client, Shared, Timeline, DRAIN};
use crate::config::Plan;
use crate::report::{self, CpuSample, Line, Summary};
use crate::stats::Stats;

enum Msg {
    /// A thread's counters since its previous report. `last`: it will
    /// record nothing more.
    Interval {
        thread: usize,
        seq: u64,
        at: Instant,
        stats: Box<Stats>,
        last: bool,
    },
    /// The thread's clients have all finished.
    Exit,
}

pub fn execute(plan: Plan) -> Result<(), String> {
    for n in &plan.notes {
        eprintln!("pando bench: {n}");
    }
    let threads = plan.threads;
    let shared = Arc::new(Shared::new(plan));
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let (handles, starts) = start_load_threads(&shared, tx)?;
    let plan = &shared.plan;
    let start = Instant::now();
    let t = Timeline::new(start, plan);
    for s in &starts {
        let _ = s.send(Some(start));
    }
    if !plan.json {
        println!("{}", report::banner(plan));
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let mut rows = Rows::new(threads, plan.ops.len(), t.warmup_end);
    let mut cpu0 = None;
    let mut cpu1 = None;
    let mut exited = 0;
    rt.block_on(async {
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let mut interrupted = false;
        let warm = tokio::time::sleep_until(t.warmup_end.into());
        tokio::pin!(warm);
        let end = tokio::time::sleep_until(t.end.unwrap_or(t.drain_deadline).into());
        tokio::pin!(end);
        let hard = tokio::time::sleep_until((t.drain_deadline + Duration::from_secs(2)).into());
        tokio::pin!(hard);
        loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(Msg::Interval { thread, seq, at, stats, last }) => {
                        rows.add(thread, seq, at, &stats, last);
                        for line in rows.ready() {
                            if !plan.json {
                                println!("{}", line.text());
                            }
                        }
                    }
                    Some(Msg::Exit) => {
                        exited += 1;
                        if exited == threads {
                            break;
                        }
                    }
                    None => break,
                },
                () = &mut warm, if cpu0.is_none() => cpu0 = Some(CpuSample::now(plan.server_pid)),
                () = &mut end, if cpu1.is_none() && t.end.is_some() => {
                    cpu1 = Some(CpuSample::now(plan.server_pid));
                }
                r = &mut ctrl_c, if !interrupted => {
                    interrupted = true;
                    if r.is_ok() {
                        eprintln!("pando bench: interrupted, finishing");
                        shared.stop(Some("interrupted".into()));
                        hard.as_mut().reset((Instant::now() + DRAIN + Duration::from_secs(1)).into());
                    }
                }
                () = &mut hard => {
                    eprintln!("pando bench: load threads did not finish in time; reporting what arrived");
                    break;
                }
            }
        }
    });
    let finished = Instant::now();
    if exited == threads {
        for h in handles {
            let _ = h.join();
        }
    }
    let cpu1 = cpu1.unwrap_or_else(|| CpuSample::now(plan.server_pid));
    report_run(&shared, &t, rows, cpu0.map(|c0| (c0, cpu1)), finished)
}

/// Start one load thread per `plan.threads`, each with its share of the
/// connections, and wait until all have connected (and bound): the
/// threads and the senders that start them; or the first setup error,
/// once every thread has ended.
#[allow(clippy::type_complexity)]
fn start_load_threads(
    shared: &Arc<Shared>,
    tx: mpsc::UnboundedSender<Msg>,
) -> Result<
    (
        Vec<std::thread::JoinHandle<()>>,
        Vec<std_mpsc::Sender<Option<Instant>>>,
    ),
    String,
> {
    let threads = shared.plan.threads;
    let mut handles = Vec::with_capacity(threads);
    let mut readies = Vec::with_capacity(threads);
    let mut starts = Vec::with_capacity(threads);
    for th in 0..threads {
        let clients: Vec<usize> = (th..shared.plan.connections).step_by(threads).collect();
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let (start_tx, start_rx) = std_mpsc::channel();
        let (shared, tx) = (Arc::clone(shared), tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("pando-bench-{th}"))
            .spawn(move || load_thread(th, clients, shared, tx, ready_tx, start_rx))
            .map_err(|e| format!("cannot start a load thread: {e}"))?;
        handles.push(h);
        readies.push(ready_rx);
        starts.push(start_tx);
    }
    drop(tx);

    let mut setup_error = None;
    for r in &readies {
        let res = r
            .recv()
            .unwrap_or_else(|_| Err("a load thread ended during setup".into()));
        if let Err(e) = res {
            setup_error.get_or_insert(e);
        }
    }
    if let Some(e) = setup_error {
        for s in &starts {
            let _ = s.send(None);
        }
        for h in handles {
            let _ = h.join();
        }
        return Err(e);
    }
    Ok((handles, starts))
}

/// The run's summary (text or JSON) once the load has ended at
/// `finished`; the run's fatal error, if one stopped it.
fn report_run(
    shared: &Shared,
    t: &Timeline,
    rows: Rows,
    cpu: Option<(CpuSample, CpuSample)>,
    finished: Instant,
) -> Result<(), String> {
    let plan = &shared.plan;
    let reason = shared.stop_reason();
    let total = rows.total.clone();
    let elapsed = match t.end {
        Some(e) if reason.is_none() && finished >= e => e - t.warmup_end,
        _ => total.last_completion.map_or(Duration::ZERO, |l| {
            l.saturating_duration_since(t.warmup_end)
        }),
    };
    let keys_used_up = matches!(
        plan.ops.first().map(|o| o.kind),
        Some(crate::config::OpKind::Add | crate::config::OpKind::Delete)
    ) && shared.seq.load(std::sync::atomic::Ordering::Relaxed) >= plan.keys.n;
    let summary = Summary {
        plan,
        elapsed,
        stats: total,
        intervals: rows.lines,
        cpu,
        stopped: reason,
        fatal: shared.fatal(),
        keys_used_up,
    };
    if plan.json {
        println!("{}", summary.json());
    } else {
        print!("{}", summary.text());
    }
    match shared.fatal() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn load_thread(
    th: usize,
    clients: Vec<usize>,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Msg>,
    ready: std_mpsc::Sender<Result<(), String>>,
    start: std_mpsc::Receiver<Option<Instant>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start a runtime: {e}")));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    let opened = local.block_on(&rt, async {
        let mut v = Vec::with_capacity(clients.len());
        for i in clients {
            v.push(client::open(&shared.plan, i).await?);
        }
        Ok::<_, String>(v)
    });
    let conns = match opened {
        Ok(v) => {
            let _ = ready.send(Ok(()));
            v
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let Ok(Some(start)) = start.recv() else {
        return;
    };
    let t = Timeline::new(start, &shared.plan);
    let stats = Rc::new(RefCell::new(Stats::new(shared.plan.ops.len())));
    let running = Rc::new(Cell::new(conns.len()));
    let all_done = Rc::new(Notify::new());
    local.block_on(&rt, async {
        for c in conns {
            let client = Client::new(c, Arc::clone(&shared), t, Rc::clone(&stats));
            let (shared, running, all_done) = (
                Arc::clone(&shared),
                Rc::clone(&running),
                Rc::clone(&all_done),
            );
            tokio::task::spawn_local(async move {
                if let Err(e) = client.run().await {
                    shared.fail(e);
                }
                running.set(running.get() - 1);
                if running.get() == 0 {
                    all_done.notify_one();
                }
            });
        }
        ticker(th, t, &shared, &stats, &running, &all_done, &tx).await;
    });
    let _ = tx.send(Msg::Exit);
}

/// Sends the thread's stats at every interval boundary, and a last time
/// when nothing more can be recorded (end of the measured time, stop, or
/// every client finished); then waits for the clients to finish.
async fn ticker(
    th: usize,
    t: Timeline,
    shared: &Shared,
    stats: &RefCell<Stats>,
    running: &Cell<usize>,
    all_done: &Notify,
    tx: &mpsc::UnboundedSender<Msg>,
) {
    let interval = shared.plan.interval;
    let mut seq: u64 = 0;
    loop {
        let mut boundary =
            t.warmup_end + interval.saturating_mul(u32::try_from(seq + 1).unwrap_or(u32::MAX));
        let mut last = false;
        if let Some(e) = t.end {
            if boundary >= e {
                boundary = e;
                last = true;
            }
        }
        let early = shared.stopping()
            || running.get() == 0
            || tokio::select! {
                () = tokio::time::sleep_until(boundary.into()) => false,
                () = all_done.notified() => true,
                () = shared.stop_notify.notified() => true,
            };
        let at = if early { Instant::now() } else { boundary };
        let last = last || early;
        let s = stats.borrow_mut().take();
        let _ = tx.send(Msg::Interval {
            thread: th,
            seq,
            at,
            stats: Box::new(s),
            last,
        });
        if last {
            break;
        }
        seq += 1;
    }
    while running.get() > 0 {
        all_done.notified().await;
    }
}

/// Merges the threads' reports into interval lines and the total.
struct Rows {
    threads: usize,
    kinds: usize,
    warmup_end: Instant,
    /// seq → (merged stats, reports received, latest report time).
    pending: BTreeMap<u64, (Stats, usize, Instant)>,
    /// The seq of each thread's last report.
    finished_at: Vec<Option<u64>>,
    next: u64,
    prev_at: Instant,
    total: Stats,
    lines: Vec<Line>,
}

impl Rows {
    fn new(threads: usize, kinds: usize, warmup_end: Instant) -> Rows {
        Rows {
            threads,
            kinds,
            warmup_end,
            pending: BTreeMap::new(),
            finished_at: vec![None; threads],
            next: 0,
            prev_at: warmup_end,
            total: Stats::new(kinds),
            lines: Vec::new(),
        }
    }

    fn add(&mut self, thread: usize, seq: u64, at: Instant, stats: &Stats, last: bool) {
        self.total.merge(stats);
        let kinds = self.kinds;
        let e = self
            .pending
            .entry(seq)
            .or_insert_with(|| (Stats::new(kinds), 0, at));
        e.0.merge(stats);
        e.1 += 1;
        e.2 = e.2.max(at);
        if last {
            if let Some(f) = self.finished_at.get_mut(thread) {
                *f = Some(seq);
            }
        }
    }

    /// Lines that every thread has reported, in order.
    fn ready(&mut self) -> Vec<Line> {
        let mut out = Vec::new();
        loop {
            let k = self.next;
            let gone = self
                .finished_at
                .iter()
                .filter(|f| f.is_some_and(|f| f < k))
                .count();
            let complete = match self.pending.get(&k) {
                Some(e) => e.1 + gone >= self.threads,
                None => false,
            };
            if !complete {
                break;
            }
            let Some((stats, _, at)) = self.pending.remove(&k) else {
                break;
            };
            self.next += 1;
            // A stop during the warm-up leaves a report with nothing measured.
            if at <= self.warmup_end {
                continue;
            }
            let line = Line::new(
                at.saturating_duration_since(self.warmup_end),
                at.saturating_duration_since(self.prev_at),
                &stats,
            );
            self.prev_at = at;
            self.lines.push(line.clone());
            out.push(line);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_op(ms: u64) -> Stats {
        let mut s = Stats::new(1);
        s.kinds[0].ok(ms * 1_000_000);
        s
    }

    #[test]
    fn rows_wait_for_every_thread_and_skip_finished_ones() {
        let w = Instant::now();
        let sec = |n: u64| w + Duration::from_secs(n);
        let mut r = Rows::new(2, 1, w);
        r.add(0, 0, sec(1), &one_op(1), false);
        assert!(r.ready().is_empty(), "thread 1 has not reported interval 0");
        r.add(1, 0, sec(1), &one_op(3), false);
        let l = r.ready();
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].ops, l[0].t.as_secs()), (2, 1));
        // Thread 1 finishes early in interval 1; thread 0 goes on to 2.
        r.add(1, 1, sec(1) + Duration::from_millis(500), &one_op(1), true);
        r.add(0, 1, sec(2), &one_op(1), false);
        assert_eq!(r.ready().len(), 1);
        r.add(0, 2, sec(3), &one_op(1), true);
        let l = r.ready();
        assert_eq!(l.len(), 1, "interval 2 needs only thread 0");
        assert_eq!(l[0].ops, 1);
        assert_eq!(r.total.total().ops, 5);
        assert_eq!(r.lines.len(), 3);
    }
}
