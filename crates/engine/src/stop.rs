//! Stop strings over streamed text: emits text as soon as it cannot be the start of a stop string, and cuts the
//! output right before the first stop string that appears.

#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet released, because it may begin a stop string.
    held: String,
    /// The stop string that ended the text, once one has.
    matched: Option<usize>,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), matched: None }
    }

    /// Adds `text`; returns the text that is now safe to emit and whether a stop string was hit (in which case the
    /// returned text ends right before it and nothing more should be generated).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        // The earliest stop string in the text wins; among those starting at the same byte, the first listed.
        let hit = self.stops.iter().enumerate().filter_map(|(k, s)| Some((self.held.find(s.as_str())?, k))).min();
        if let Some((i, k)) = hit {
            let out = self.held[..i].to_string();
            self.held.clear();
            self.matched = Some(k);
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && self.held.ends_with(&s[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|k| self.stops[k].as_str())
    }

    /// Releases whatever is held (the generation ended for another reason).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_before_stop_across_pieces() {
        let mut s = StopStrings::new(vec!["END".into(), "\n\n".into()]);
        assert_eq!(s.push("hello E"), ("hello ".into(), false));
        assert_eq!(s.push("N"), ("".into(), false));
        assert_eq!(s.push("Dx"), ("".into(), true));
        assert_eq!(s.matched(), Some("END"));
    }

    #[test]
    fn earliest_stop_wins() {
        let mut s = StopStrings::new(vec!["b".into(), "ab".into()]);
        assert_eq!(s.matched(), None);
        assert_eq!(s.push("xab"), ("x".into(), true));
        assert_eq!(s.matched(), Some("ab"));
    }

    #[test]
    fn releases_false_starts() {
        let mut s = StopStrings::new(vec!["END".into()]);
        assert_eq!(s.push("EN"), ("".into(), false));
        assert_eq!(s.push("x"), ("ENx".into(), false));
        assert_eq!(s.push("E"), ("".into(), false));
        assert_eq!(s.flush(), "E");
    }

    #[test]
    fn multibyte_stop_strings() {
        let mut s = StopStrings::new(vec!["停止".into()]);
        assert_eq!(s.push("好停"), ("好".into(), false));
        assert_eq!(s.push("止了"), ("".into(), true));
    }
}
