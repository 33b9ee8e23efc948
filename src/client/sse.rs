//! A Server-Sent Events parser over the bytes of an answer, as the WHATWG HTML standard's
//! "Interpreting an event stream" (§9.2.6) reads them.
//!
//! Owns: splitting the bytes into lines (LF, CRLF or CR, split anywhere across chunks), the
//! fields `event`, `data` and `id`, comments, a leading BOM, and dispatch on a blank line. Must
//! never: yield an event before its blank line, lose or reorder bytes across chunk boundaries, or
//! rescan bytes it has parsed (a catch-up delivers a megabyte of events per chunk; a parser that
//! copied the rest of its buffer after each line, as eventsource-stream 0.2 does, was quadratic
//! in the chunk size).

use std::pin::Pin;

use futures::{Stream, StreamExt};

/// One event: `event` its type (`message` when the stream named none), `data` its `data` lines
/// joined by `\n`, `id` the last event id set (an `id` field of this or an earlier event).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SseEvent {
    pub event: String,
    pub data: String,
    pub id: String,
}

/// U+FEFF in UTF-8, which a stream may begin with.
const BOM: &[u8] = "\u{feff}".as_bytes();

/// The parser's state between chunks.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes received and not yet parsed start at `pos`.
    buf: Vec<u8>,
    pos: usize,
    /// Whether the first byte has been seen (a BOM there is dropped).
    started: bool,
    /// The last line ended with CR: an LF that follows belongs to it.
    after_cr: bool,
    event: String,
    data: String,
    /// Whether a `data` field came since the last dispatch (an event without one is dropped).
    has_data: bool,
    id: String,
}

/// The event stream is not UTF-8 where a line must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseError(pub String);

impl SseParser {
    /// Takes the next chunk of the answer.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.pos > 0 {
            // Keep only the unparsed tail (a partial line): each byte is moved at most once more.
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete event in the bytes pushed so far, or `None` until more bytes come.
    ///
    /// Errors: a line that is not UTF-8.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        if !self.started {
            // A BOM may only begin the stream, and may come split across chunks.
            let rest = &self.buf[self.pos..];
            if rest.len() < BOM.len() && BOM.starts_with(rest) {
                return Ok(None);
            }
            self.started = true;
            if rest.starts_with(BOM) {
                self.pos += BOM.len();
            }
        }
        loop {
            if self.after_cr && self.pos < self.buf.len() {
                self.after_cr = false;
                if self.buf[self.pos] == b'\n' {
                    self.pos += 1;
                }
            }
            let rest = &self.buf[self.pos..];
            let Some(end) = memchr::memchr2(b'\n', b'\r', rest) else {
                return Ok(None);
            };
            let cr = rest[end] == b'\r';
            let (line_start, line_end) = (self.pos, self.pos + end);
            self.pos = line_end + 1;
            if cr {
                if self.pos < self.buf.len() {
                    if self.buf[self.pos] == b'\n' {
                        self.pos += 1;
                    }
                } else {
                    self.after_cr = true;
                }
            }
            if let Some(event) = self.line(line_start, line_end)? {
                return Ok(Some(event));
            }
        }
    }

    /// Interprets the line `buf[start..end]`; returns the event a blank line dispatches.
    fn line(&mut self, start: usize, end: usize) -> Result<Option<SseEvent>, SseError> {
        let line = &self.buf[start..end];
        if line.is_empty() {
            if !self.has_data {
                self.event.clear();
                return Ok(None);
            }
            self.has_data = false;
            let mut data = std::mem::take(&mut self.data);
            data.pop(); // the LF after the last data line
            let event = match std::mem::take(&mut self.event) {
                e if e.is_empty() => "message".to_string(),
                e => e,
            };
            return Ok(Some(SseEvent { event, data, id: self.id.clone() }));
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &line[line.len()..]),
        };
        let value = || std::str::from_utf8(value).map_err(|e| SseError(format!("an event's line is not UTF-8: {e}")));
        match field {
            b"event" => {
                self.event.clear();
                self.event.push_str(value()?);
            }
            b"data" => {
                self.data.push_str(value()?);
                self.data.push('\n');
                self.has_data = true;
            }
            b"id" => {
                let v = value()?;
                if !v.contains('\0') {
                    self.id.clear();
                    self.id.push_str(v);
                }
            }
            _ => {}
        }
        Ok(None)
    }
}

/// The events of an answer's body: each chunk is parsed as it comes; the stream ends when the body
/// does, or after its first error (a broken body, or bytes that are not UTF-8).
pub(crate) fn events<S, B, E>(body: S) -> Pin<Box<dyn Stream<Item = Result<SseEvent, String>> + Send>>
where
    S: Stream<Item = Result<B, E>> + Send + 'static,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    let state = (Box::pin(body), SseParser::default(), false);
    Box::pin(futures::stream::unfold(state, |(mut body, mut parser, failed)| async move {
        if failed {
            return None;
        }
        loop {
            match parser.next_event() {
                Ok(Some(ev)) => return Some((Ok(ev), (body, parser, false))),
                Err(e) => return Some((Err(e.0), (body, parser, true))),
                Ok(None) => {}
            }
            match body.next().await? {
                Ok(chunk) => parser.push(chunk.as_ref()),
                Err(e) => return Some((Err(e.to_string()), (body, parser, true))),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of `text` split into chunks at `cuts`.
    fn parse(text: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
            p.push(&text[from..cut]);
            from = cut;
            while let Some(ev) = p.next_event().unwrap() {
                out.push(ev);
            }
        }
        out
    }

    /// The same text through eventsource-stream 0.2, the parser this one replaced.
    fn reference(text: &[u8]) -> Vec<SseEvent> {
        use eventsource_stream::Eventsource;
        let chunks = futures::stream::iter([Ok::<_, std::convert::Infallible>(bytes::Bytes::copy_from_slice(text))]);
        futures::executor::block_on(chunks.eventsource().collect::<Vec<_>>())
            .into_iter()
            .map(|e| {
                let e = e.unwrap();
                SseEvent { event: e.event, data: e.data, id: e.id }
            })
            .collect()
    }

    const SAMPLES: &[&[u8]] = &[
        b"event: gap\ndata: {\"from\":1,\"to\":117}\n\nevent: batch\nid: 118\ndata: {\"seq\":118}\n\n: ping\n\n",
        b"data: first\r\n\r\ndata:no space\rdata:  two spaces\r\rid: 7\nevent: x\ndata\n\n",
        b"data: a\ndata: b\n\nid\ndata: c\n\nevent: only type\n\nid: 9\n\nfield without colon\ndata: d\n\n",
        b"retry: 10\nunknown: q\ndata: \xc3\xa9t\xc3\xa9\n\ndata: incomplete at the end",
        b"id: a\0b\ndata: the NUL id is ignored\n\n:comment\r\n\r\n\n\ndata: e\r\n\r\n",
    ];

    /// Every sample gives eventsource-stream's events, however the bytes are cut: at each single
    /// byte position and into one-byte chunks (a CR at a chunk's end with its LF in the next).
    #[test]
    fn events_match_the_reference_parser_at_every_cut() {
        for text in SAMPLES {
            let want = reference(text);
            assert!(!want.is_empty());
            assert_eq!(parse(text, &[]), want, "{}", String::from_utf8_lossy(text));
            for cut in 0..=text.len() {
                assert_eq!(parse(text, &[cut]), want, "cut at {cut}: {}", String::from_utf8_lossy(text));
            }
            let every: Vec<usize> = (1..text.len()).collect();
            assert_eq!(parse(text, &every), want, "one byte a chunk: {}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn fields_are_read_as_the_standard_says() {
        let evs = parse(b"id: 5\nevent: batch\ndata: x\ndata:y\n\ndata: z\n\n", &[]);
        assert_eq!(
            evs,
            vec![
                SseEvent { event: "batch".into(), data: "x\ny".into(), id: "5".into() },
                // The type does not carry over; the id does.
                SseEvent { event: "message".into(), data: "z".into(), id: "5".into() },
            ]
        );
        // No event before its blank line.
        assert_eq!(parse(b"event: batch\ndata: x\n", &[]), vec![]);
    }

    /// A BOM begins the stream only, however it is cut (eventsource-stream 0.2 panics on one).
    #[test]
    fn a_leading_bom_is_dropped_at_every_cut() {
        let text = "\u{feff}data: x\n\n\u{feff}data: y\n\n".as_bytes();
        let want = vec![SseEvent { event: "message".into(), data: "x".into(), id: String::new() }];
        for cut in 0..=text.len() {
            assert_eq!(parse(text, &[cut]), want, "cut at {cut}");
        }
    }

    #[test]
    fn a_line_that_is_not_utf8_is_an_error() {
        let mut p = SseParser::default();
        p.push(b"data: \xff\n\n");
        assert!(p.next_event().is_err());
    }

    /// The stream adapter ends after a body error, and yields the events before it in order.
    #[test]
    fn the_stream_yields_events_in_order_and_ends_on_an_error() {
        let chunks = futures::stream::iter(vec![
            Ok(bytes::Bytes::from_static(b"data: 1\n\ndata: 2\n")),
            Ok(bytes::Bytes::from_static(b"\ndata: 3\n\n")),
            Err("broken"),
            Ok(bytes::Bytes::from_static(b"data: 4\n\n")),
        ]);
        let got: Vec<Result<String, String>> =
            futures::executor::block_on(events(chunks).map(|r| r.map(|e| e.data)).collect());
        assert_eq!(got, vec![Ok("1".into()), Ok("2".into()), Ok("3".into()), Err("broken".into())]);
    }
}
