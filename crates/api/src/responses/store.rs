//! Stored responses: what `previous_response_id` continues from and what `GET /v1/responses/{id}` returns.
//!
//! In memory only, least recently used first out, within a byte budget (sizes estimated from the JSON). Lost on
//! restart.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use chat::Message;
use serde_json::Value;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object as returned.
    pub response: Value,
    /// The conversation it ended (input items and output, without instructions), for `previous_response_id`.
    pub conversation: Vec<Message>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Stored>,
    /// Ids, least recently used first.
    order: VecDeque<String>,
    num_bytes: usize,
}

#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

impl Store {
    pub fn new(max_bytes: usize) -> Self {
        Store { inner: Mutex::default(), max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data behind (every update is a few assignments).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a response (replacing one with the same id); evicts the oldest to stay within the budget. A response
    /// larger than the whole budget is not stored.
    pub fn put(&self, id: String, response: Value, conversation: Vec<Message>) {
        let bytes = response.to_string().len() + serde_json::to_string(&conversation).map_or(0, |s| s.len());
        if bytes > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        remove(&mut inner, &id);
        while inner.num_bytes + bytes > self.max_bytes {
            let Some(oldest) = inner.order.front().cloned() else { break };
            remove(&mut inner, &oldest);
        }
        inner.num_bytes += bytes;
        inner.order.push_back(id.clone());
        inner.entries.insert(id, Stored { response, conversation, bytes });
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut inner = self.lock();
        let stored = inner.entries.get(id).cloned()?;
        if let Some(i) = inner.order.iter().position(|x| x == id) {
            inner.order.remove(i);
            inner.order.push_back(id.to_owned());
        }
        Some(stored)
    }

    pub fn delete(&self, id: &str) -> bool {
        remove(&mut self.lock(), id)
    }
}

fn remove(inner: &mut Inner, id: &str) -> bool {
    let Some(old) = inner.entries.remove(id) else { return false };
    inner.num_bytes -= old.bytes;
    inner.order.retain(|x| x != id);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let store = Store::new(300);
        let big = |n: usize| json!({"text": "x".repeat(n)});
        store.put("a".into(), big(120), Vec::new());
        store.put("b".into(), big(120), Vec::new());
        assert!(store.get("a").is_some()); // a is now the most recent
        store.put("c".into(), big(120), Vec::new());
        assert!(store.get("b").is_none(), "b was least recently used");
        assert!(store.get("a").is_some() && store.get("c").is_some());
        store.put("huge".into(), big(1000), Vec::new());
        assert!(store.get("huge").is_none());
        assert!(store.delete("a") && !store.delete("a"));
        assert!(store.get("a").is_none());
    }
}
