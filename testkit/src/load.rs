//! Load: keep-alive clients requesting links until stopped, each answer checked.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::http::{Conn, Resp};

/// Keep-alive clients hammering `codes` until stopped; each response goes through `check`
/// (which panics on a bad one, failing the join).
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(addr: &str, codes: &[String], clients: usize, check: fn(&str, &Resp)) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let clients = (0..clients)
            .map(|t| {
                let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
                let (addr, codes) = (addr.to_string(), codes.to_vec());
                std::thread::spawn(move || {
                    let mut conn = Conn::open(&addr);
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        let code = &codes[i % codes.len()];
                        check(code, &conn.get(&format!("/{code}")));
                        done.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        Load {
            stop,
            done,
            clients,
        }
    }

    /// Stops the clients; the number of requests answered. Panics if a client saw a failure.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("a client saw a failure");
        }
        self.done.load(Ordering::Relaxed)
    }
}
