//! A verdict service for `--scan-webhook` that takes its time, so a hold is visible while the
//! scan runs.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// Starts a verdict service on loopback and returns its URL: each call is answered after
/// `delay`, `block` (reason "phishing kit") when the request names `blocked_host`, else
/// `clean`.
pub fn verdict_service(delay: Duration, blocked_host: Option<&'static str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/verdict", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let asked = read_request(&mut conn);
                std::thread::sleep(delay);
                let body = match blocked_host {
                    Some(host) if asked.contains(host) => {
                        r#"{"verdict":"block","reason":"phishing kit"}"#
                    }
                    _ => r#"{"verdict":"clean"}"#,
                };
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            });
        }
    });
    url
}

/// The whole request, head and body (a client may write them in separate segments: one read
/// could miss the URL in the body and answer a blocked host as clean).
fn read_request(conn: &mut std::net::TcpStream) -> String {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                break;
            }
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}
