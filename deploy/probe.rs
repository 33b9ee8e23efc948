//! `runnev-probe URL`: a dependency-free HTTP probe for images that have no curl or wget (the
//! Runnev image is `FROM scratch`). Exits 0 when the URL answers 2xx within the timeout, 1
//! otherwise, and prints the status line (or the failure) to stdout.
//!
//! Built by `deploy/build-image.sh` with plain `rustc` (std only, no crates). Usage:
//!   runnev-probe http://127.0.0.1:7001/readyz [--timeout-ms 2000]

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn probe(url: &str, timeout: Duration) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?} is not http://HOST:PORT/PATH"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let deadline = Instant::now() + timeout;
    let addrs: Vec<_> =
        authority.to_socket_addrs().map_err(|e| format!("resolving {authority}: {e}"))?.collect();
    let mut last = format!("{authority} resolved to no address");
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut tcp = match TcpStream::connect_timeout(&addr, left) {
            Ok(t) => t,
            Err(e) => {
                last = format!("connecting to {addr}: {e}");
                continue;
            }
        };
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        tcp.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        tcp.set_write_timeout(Some(left)).map_err(|e| e.to_string())?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nUser-Agent: runnev-probe\r\n\r\n");
        tcp.write_all(req.as_bytes()).map_err(|e| format!("sending to {addr}: {e}"))?;
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        // The status line is all we need.
        while !head.contains(&b'\n') && head.len() < 4096 {
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
                Err(e) => return Err(format!("reading from {addr}: {e}")),
            }
        }
        let line = String::from_utf8_lossy(&head);
        let line = line.lines().next().unwrap_or("").trim().to_string();
        let code: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("{addr} answered {line:?}, not HTTP"))?;
        return if (200..300).contains(&code) { Ok(line) } else { Err(line) };
    }
    Err(last)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut url = None;
    let mut timeout = Duration::from_millis(2000);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--timeout-ms" => match it.next().and_then(|v| v.parse().ok()) {
                Some(ms) => timeout = Duration::from_millis(ms),
                None => {
                    eprintln!("runnev-probe: --timeout-ms needs a number of milliseconds");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("usage: runnev-probe URL [--timeout-ms MS]   (exit 0 on a 2xx answer)");
                return ExitCode::SUCCESS;
            }
            _ if url.is_none() => url = Some(a.clone()),
            _ => {
                eprintln!("runnev-probe: unexpected argument {a:?}");
                return ExitCode::from(2);
            }
        }
    }
    let url = url.unwrap_or_else(|| "http://127.0.0.1:7001/readyz".to_string());
    match probe(&url, timeout) {
        Ok(line) => {
            println!("{url}: {line}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("{url}: {why}");
            ExitCode::FAILURE
        }
    }
}
