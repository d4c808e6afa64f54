//! What the fake hubs of these tests share: reading one HTTP request.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;

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
