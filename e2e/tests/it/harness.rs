//! What only the whole-system tests use: a TCP proxy standing in for a WAN link between
//! regions. (Processes, clients and waiting come from `lasthop-testkit`.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A TCP proxy on loopback standing in for a WAN link between regions: every byte is held
/// `delay` in each direction (one-way delay, so a round trip through it costs twice that), and
/// [`Proxy::cut`] drops every connection and refuses new ones until [`Proxy::mend`].
pub struct Proxy {
    pub addr: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(target: &str, delay: Duration) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let target = target
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let flag = Arc::clone(&cut);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if flag.load(Ordering::SeqCst) {
                    continue; // dropped: the connection closes
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    pump(from, to, delay, Arc::clone(&flag));
                }
            }
        });
        Proxy { addr, cut }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn mend(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, each chunk delivered `delay` after it was read; stops (shutting both
/// down) at EOF, an error, or a cut.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let reader_cut = std::sync::Arc::clone(&cut);
    let watched = from.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if reader_cut.load(Ordering::SeqCst) {
                break;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .send((std::time::Instant::now(), buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        while let Ok((read_at, bytes)) = rx.recv() {
            let due = read_at + delay;
            let now = std::time::Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if cut.load(Ordering::SeqCst) || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = watched.shutdown(std::net::Shutdown::Both);
    });
}
