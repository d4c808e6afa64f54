//! What the fake hubs of these tests (and crates/cli/tests/pull.rs, through `#[path]`) share: the bytes they serve,
//! their hash, the log of requests seen, and reading one HTTP request.
#![allow(dead_code)] // each test file uses its part

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// `(path, Range header)` of every request a hub saw.
pub type RequestLog = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// `size` bytes of a fixed pseudo-random sequence: a file to serve.
pub fn content(size: usize) -> Vec<u8> {
    let mut x: u32 = 987_654_321;
    (0..size)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect()
}

/// Lower-case hex SHA-256.
pub fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// Reads a request's first line and headers: its path and its `Range` header (lower-cased), or `None` when the
/// connection closed before a request line.
pub fn read_request(stream: &TcpStream) -> Option<(String, Option<String>)> {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut first = String::new();
    reader.read_line(&mut first).ok()?;
    let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("range:") {
            range = Some(v.trim().to_string());
        }
    }
    Some((path, range))
}
