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
                let mut buf = [0u8; 4096];
                let n = conn.read(&mut buf).unwrap_or(0);
                let asked = String::from_utf8_lossy(&buf[..n]).into_owned();
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
