//! Measures how fast link changes reach engines (driven by `perf/takedown.sh`).
//!
//! For each of `--count` links: create it through the public API and time, per engine, from the
//! API's 201 to the first 302 that engine serves for it (creation → first redirect). Then take
//! each link down, `--interval-ms` apart, and time, per engine, from the API's 200 to the first
//! 410 (takedown propagation). Every engine is polled on its own keep-alive connection by its
//! own thread, as fast as loopback allows. Prints p50, p99 and max of both.
//!
//! `cargo run --release -p lasthop-engine --example propagation -- --api http://127.0.0.1:8081
//!  --owner-key K --admin-key K --engines 127.0.0.1:8080,127.0.0.1:8090 [--count 200]
//!  [--interval-ms 50]`

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// One keep-alive connection that answers "what status does GET /code get".
struct Probe {
    r: BufReader<TcpStream>,
    addr: String,
}

impl Probe {
    fn open(addr: &str) -> Probe {
        let s = TcpStream::connect(addr).expect("connect to engine");
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        Probe {
            r: BufReader::new(s),
            addr: addr.to_string(),
        }
    }

    fn status(&mut self, code: &str) -> u16 {
        let req = format!("GET /{code} HTTP/1.1\r\nHost: p\r\n\r\n");
        if self.r.get_mut().write_all(req.as_bytes()).is_err() {
            *self = Probe::open(&self.addr.clone());
            return 0;
        }
        let mut line = String::new();
        if self.r.read_line(&mut line).unwrap_or(0) == 0 {
            *self = Probe::open(&self.addr.clone());
            return 0;
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if self.r.read_line(&mut h).unwrap_or(0) == 0 {
                break;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                if n.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; len];
        let _ = self.r.read_exact(&mut body);
        status
    }
}

/// Per engine, a thread that waits for (code, wanted status, start) jobs and reports how long
/// until the engine served that status.
/// A poll job: the code, the status to wait for, and when the change was acknowledged.
type Job = (String, u16, Instant);

fn pollers(engines: &[String]) -> (Vec<mpsc::Sender<Job>>, mpsc::Receiver<Duration>) {
    let (done_tx, done_rx) = mpsc::channel();
    let mut jobs = Vec::new();
    for addr in engines {
        let (tx, rx) = mpsc::channel::<Job>();
        let done_tx = done_tx.clone();
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut probe = Probe::open(&addr);
            for (code, want, start) in rx {
                let deadline = start + Duration::from_secs(30);
                while probe.status(&code) != want {
                    if Instant::now() > deadline {
                        eprintln!("{addr}: /{code} never answered {want}");
                        break;
                    }
                }
                let _ = done_tx.send(start.elapsed());
            }
        });
        jobs.push(tx);
    }
    (jobs, done_rx)
}

fn summary(label: &str, mut d: Vec<Duration>) {
    d.sort();
    let pick = |q: f64| d[((d.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{label:<28} n={:<5} p50 {:>8.2} ms   p99 {:>8.2} ms   max {:>8.2} ms",
        d.len(),
        pick(0.5).as_secs_f64() * 1e3,
        pick(0.99).as_secs_f64() * 1e3,
        d.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let api = arg(&args, "--api").expect("--api");
    let owner = arg(&args, "--owner-key").expect("--owner-key");
    let admin = arg(&args, "--admin-key").expect("--admin-key");
    let engines: Vec<String> = arg(&args, "--engines")
        .expect("--engines")
        .split(',')
        .map(String::from)
        .collect();
    let count: usize = arg(&args, "--count").map_or(200, |v| v.parse().expect("--count"));
    let interval =
        Duration::from_millis(arg(&args, "--interval-ms").map_or(50, |v| v.parse().expect("ms")));
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let (jobs, done) = pollers(&engines);

    let mut codes = Vec::with_capacity(count);
    let mut created = Vec::new();
    let mut api_create = Vec::new();
    for i in 0..count {
        let t = Instant::now();
        let v: serde_json::Value = agent
            .post(&format!("{api}/v1/links"))
            .set("Authorization", &format!("Bearer {owner}"))
            .send_json(serde_json::json!({"long_url": format!("https://example.com/p/{i}")}))
            .expect("create")
            .into_json()
            .expect("json");
        let start = Instant::now();
        api_create.push(start - t);
        let code = v["code"].as_str().expect("code").to_string();
        for j in &jobs {
            j.send((code.clone(), 302, start)).expect("poller");
        }
        for _ in &jobs {
            created.push(done.recv().expect("poller"));
        }
        codes.push(code);
        std::thread::sleep(interval / 4);
    }

    let mut takedown = Vec::new();
    let mut api_takedown = Vec::new();
    for code in &codes {
        let t = Instant::now();
        agent
            .post(&format!("{api}/v1/links/{code}/takedown"))
            .set("Authorization", &format!("Bearer {admin}"))
            .send_json(serde_json::json!({"reason": "propagation test"}))
            .expect("takedown");
        let start = Instant::now();
        api_takedown.push(start - t);
        for j in &jobs {
            j.send((code.clone(), 410, start)).expect("poller");
        }
        for _ in &jobs {
            takedown.push(done.recv().expect("poller"));
        }
        std::thread::sleep(interval);
    }
    println!(
        "{} engines, {count} links, {} ms apart; times from the API's answer to the engine's",
        engines.len(),
        interval.as_millis()
    );
    summary("create -> first redirect", created);
    summary("takedown -> 410", takedown);
    summary("(API create latency)", api_create);
    summary("(API takedown latency)", api_takedown);
}
