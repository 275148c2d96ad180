//! Server-sent events split out of a stream as its bytes pass, with bounded memory: an event
//! larger than the bound is skipped whole (what it carried is not recorded; the client still
//! gets every byte, since the stream itself passes through untouched).

/// Splits a stream of SSE bytes into the `data` of each event.
pub(super) struct Splitter {
    /// The event being read: its `data` lines so far.
    data: String,
    /// The current line's bytes, until its end arrives.
    line: Vec<u8>,
    /// The current event grew past the bound: skip to its end.
    skipping: bool,
    max_bytes: usize,
}

impl Splitter {
    pub(super) fn new(max_bytes: usize) -> Splitter {
        Splitter {
            data: String::new(),
            line: Vec::new(),
            skipping: false,
            max_bytes: max_bytes.max(1024),
        }
    }

    /// The bytes held: the event being read.
    pub(super) fn held(&self) -> usize {
        self.data.len() + self.line.len()
    }

    /// The `data` of every event `bytes` completed (`[DONE]` left out).
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut done = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                if !self.skipping {
                    self.line.push(b);
                    if self.line.len() + self.data.len() > self.max_bytes {
                        self.skipping = true;
                        self.line.clear();
                        self.data.clear();
                    }
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(&line));
            if line.is_empty() {
                // The event ends.
                let data = std::mem::take(&mut self.data);
                if !std::mem::take(&mut self.skipping) && !data.is_empty() && data != "[DONE]" {
                    done.push(data);
                }
            } else if !self.skipping
                && let Some(value) = line.strip_prefix("data:")
            {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_arrive_whatever_the_cuts_and_a_huge_one_is_skipped() {
        let stream = "event: a\ndata: {\"x\":1}\n\ndata: {\"y\":\ndata: 2}\r\n\r\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut s = Splitter::new(1 << 20);
            let mut got = s.feed(&stream.as_bytes()[..cut]);
            got.extend(s.feed(&stream.as_bytes()[cut..]));
            assert_eq!(got, ["{\"x\":1}", "{\"y\":\n2}"], "cut at {cut}");
        }
        let mut s = Splitter::new(1024);
        let huge = format!("data: {}\n\ndata: ok\n\n", "z".repeat(5_000));
        assert_eq!(s.feed(huge.as_bytes()), ["ok"]);
    }
}
