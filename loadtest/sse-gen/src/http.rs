//! A lean HTTP/1.1 client for loopback load tests: one `TcpStream` bound to
//! a chosen source address, one small read buffer, keep-alive, bodies by
//! `Content-Length` or chunked, and a streaming SSE reader.
//!
//! It keeps per-connection memory to a few hundred bytes of buffer, so one
//! process can hold tens of thousands of streams.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Counts of source addresses to spread connections over.
#[derive(Debug, Clone)]
pub struct SourceIps(pub Vec<Ipv4Addr>);

impl SourceIps {
    /// `127.0.0.2-127.0.0.11`, `127.0.0.2,127.0.0.3` or one address. Only
    /// loopback (127.0.0.0/8) addresses are accepted.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some((a, b)) = part.split_once('-') {
                let a: Ipv4Addr = a.trim().parse()?;
                let b: Ipv4Addr = b.trim().parse()?;
                let (x, y) = (u32::from(a), u32::from(b));
                anyhow::ensure!(x <= y && y - x < 65_536, "bad address range {part}");
                for v in x..=y {
                    out.push(Ipv4Addr::from(v));
                }
            } else {
                out.push(part.parse()?);
            }
        }
        anyhow::ensure!(!out.is_empty(), "no source addresses");
        for ip in &out {
            anyhow::ensure!(
                ip.is_loopback(),
                "source address {ip} is not loopback (127.0.0.0/8)"
            );
        }
        Ok(Self(out))
    }

    pub fn pick(&self, i: usize) -> Ipv4Addr {
        self.0[i % self.0.len()]
    }
}

/// Refuses any target outside 127.0.0.0/8 (and ::1).
pub fn ensure_loopback(addr: &SocketAddr) -> anyhow::Result<()> {
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "target {addr} is not a loopback address; load tests target 127.0.0.0/8 only"
    );
    Ok(())
}

/// One HTTP/1.1 connection with a small buffer (`buf[pos..]` is unread).
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    read_chunk: usize,
}

/// A response with a fully read body (not for event streams).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub close: bool,
}

/// What the response head said about its body.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub status: u16,
    pub length: Option<usize>,
    pub chunked: bool,
    pub close: bool,
    pub event_stream: bool,
}

fn other(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

impl Conn {
    /// Connects from `src` (port chosen by the kernel) to `dst`.
    pub async fn connect(src: Ipv4Addr, dst: SocketAddr, read_chunk: usize) -> io::Result<Self> {
        let sock = TcpSocket::new_v4()?;
        sock.bind(SocketAddr::new(IpAddr::V4(src), 0))?;
        // Small kernel buffers too: an SSE client receives a few hundred
        // bytes at a time.
        let _ = sock.set_recv_buffer_size(16 * 1024);
        let _ = sock.set_send_buffer_size(16 * 1024);
        let stream = tokio::time::timeout(Duration::from_secs(10), sock.connect(dst))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::new(),
            pos: 0,
            read_chunk: read_chunk.max(128),
        })
    }

    /// Sends one request. `headers` are `(name, value)` pairs.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> io::Result<()> {
        let mut req = String::with_capacity(256);
        req.push_str(method);
        req.push(' ');
        req.push_str(path);
        req.push_str(" HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for (k, v) in headers {
            req.push_str(k);
            req.push_str(": ");
            req.push_str(v);
            req.push_str("\r\n");
        }
        match body {
            Some(b) => {
                req.push_str("Content-Length: ");
                req.push_str(&b.len().to_string());
                req.push_str("\r\n\r\n");
                let mut all = req.into_bytes();
                all.extend_from_slice(b);
                self.stream.write_all(&all).await
            }
            None => {
                if method != "GET" && method != "HEAD" {
                    req.push_str("Content-Length: 0\r\n");
                }
                req.push_str("\r\n");
                self.stream.write_all(req.as_bytes()).await
            }
        }
    }

    /// Reads more bytes into the buffer; `UnexpectedEof` when the peer closed.
    async fn fill(&mut self) -> io::Result<()> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.len() > 64 * 1024 {
            return Err(other("response line or head too long"));
        }
        let old = self.buf.len();
        self.buf.resize(old + self.read_chunk, 0);
        let n = self.stream.read(&mut self.buf[old..]).await;
        match n {
            Ok(0) => {
                self.buf.truncate(old);
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ))
            }
            Ok(n) => {
                self.buf.truncate(old + n);
                Ok(())
            }
            Err(e) => {
                self.buf.truncate(old);
                Err(e)
            }
        }
    }

    /// Drops the buffer's spare capacity (between phases of a long stream).
    pub fn shrink(&mut self) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.shrink_to(self.read_chunk);
    }

    /// The next CRLF- (or LF-) terminated line, without its terminator, as
    /// a range of `buf`.
    async fn line(&mut self) -> io::Result<(usize, usize)> {
        loop {
            if let Some(i) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                let start = self.pos;
                let mut end = start + i;
                self.pos = end + 1;
                if end > start && self.buf[end - 1] == b'\r' {
                    end -= 1;
                }
                return Ok((start, end));
            }
            self.fill().await?;
        }
    }

    /// Reads a response head.
    pub async fn head(&mut self) -> io::Result<Head> {
        let (s, e) = self.line().await?;
        let status_line = &self.buf[s..e];
        let status = std::str::from_utf8(status_line)
            .ok()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| other("bad status line"))?;
        let mut head = Head {
            status,
            length: None,
            chunked: false,
            close: false,
            event_stream: false,
        };
        loop {
            let (s, e) = self.line().await?;
            if s == e {
                break;
            }
            let line = &self.buf[s..e];
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let name = &line[..colon];
            let value = std::str::from_utf8(&line[colon + 1..]).unwrap_or("").trim();
            if name.eq_ignore_ascii_case(b"content-length") {
                head.length = value.parse().ok();
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                head.chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case(b"connection") {
                head.close = value.eq_ignore_ascii_case("close");
            } else if name.eq_ignore_ascii_case(b"content-type") {
                head.event_stream = value.starts_with("text/event-stream");
            }
        }
        Ok(head)
    }

    async fn exact(&mut self, n: usize, out: &mut Vec<u8>) -> io::Result<()> {
        while self.buf.len() - self.pos < n {
            let need = n - (self.buf.len() - self.pos);
            let old = self.read_chunk;
            self.read_chunk = need.clamp(old, 64 * 1024);
            let r = self.fill().await;
            self.read_chunk = old;
            r?;
        }
        out.extend_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(())
    }

    /// The size line of the next chunk (`None` for the last chunk, whose
    /// trailer is consumed).
    async fn chunk_size(&mut self) -> io::Result<Option<usize>> {
        let (s, e) = self.line().await?;
        let hex = &self.buf[s..e];
        let hex = hex.split(|&b| b == b';').next().unwrap_or(hex);
        let txt = std::str::from_utf8(hex).map_err(|_| other("bad chunk size"))?;
        let n = usize::from_str_radix(txt.trim(), 16).map_err(|_| other("bad chunk size"))?;
        if n == 0 {
            loop {
                let (s, e) = self.line().await?;
                if s == e {
                    return Ok(None);
                }
            }
        }
        Ok(Some(n))
    }

    /// Reads a whole response (head and body).
    pub async fn response(&mut self) -> io::Result<Response> {
        let head = self.head().await?;
        let body = self.response_body_after(&head).await?;
        Ok(Response {
            status: head.status,
            body,
            close: head.close
                || (!head.chunked
                    && head.length.is_none()
                    && head.status != 204
                    && head.status != 304),
        })
    }

    /// Reads the body that `head` announced.
    pub async fn response_body_after(&mut self, head: &Head) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        if head.status == 204 || head.status == 304 {
            // no body
        } else if head.chunked {
            while let Some(n) = self.chunk_size().await? {
                self.exact(n, &mut body).await?;
                self.line().await?;
            }
        } else if let Some(n) = head.length {
            self.exact(n, &mut body).await?;
        } else {
            // Body until close.
            loop {
                match self.fill().await {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
                if self.buf.len() > 1 << 20 {
                    return Err(other("body too large"));
                }
            }
            body.extend_from_slice(&self.buf[self.pos..]);
            self.pos = self.buf.len();
        }
        Ok(body)
    }

    /// One request and its whole response.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> io::Result<Response> {
        self.send(method, path, headers, body).await?;
        self.response().await
    }

    /// Reads an event-stream body after [`Conn::head`], feeding `parser`,
    /// which calls `on_item` for every item, until the body ends
    /// (`Ok(true)`) or `on_item` returns `false` (`Ok(false)`: stopped
    /// early; call again with the same `state` to go on).
    pub async fn read_events<F>(
        &mut self,
        head: &Head,
        state: &mut BodyState,
        parser: &mut SseParser,
        mut on_item: F,
    ) -> io::Result<bool>
    where
        F: FnMut(SseItem<'_>) -> bool,
    {
        if head.chunked {
            loop {
                if !state.in_chunk {
                    match self.chunk_size().await? {
                        Some(n) => {
                            state.chunk_left = n;
                            state.in_chunk = true;
                        }
                        None => return Ok(true),
                    }
                }
                while state.chunk_left > 0 {
                    if self.pos == self.buf.len() {
                        self.fill().await?;
                    }
                    let take = (self.buf.len() - self.pos).min(state.chunk_left);
                    let go = parser.feed(&self.buf[self.pos..self.pos + take], &mut on_item);
                    self.pos += take;
                    state.chunk_left -= take;
                    if !go {
                        return Ok(false);
                    }
                }
                self.line().await?; // the CRLF after the chunk's data
                state.in_chunk = false;
            }
        } else {
            loop {
                let remaining = head
                    .length
                    .map_or(usize::MAX, |n| n.saturating_sub(state.read));
                if remaining == 0 {
                    return Ok(true);
                }
                if self.pos == self.buf.len() {
                    match self.fill().await {
                        Ok(()) => {}
                        Err(e)
                            if e.kind() == io::ErrorKind::UnexpectedEof
                                && head.length.is_none() =>
                        {
                            return Ok(true);
                        }
                        Err(e) => return Err(e),
                    }
                }
                let take = (self.buf.len() - self.pos).min(remaining);
                let go = parser.feed(&self.buf[self.pos..self.pos + take], &mut on_item);
                self.pos += take;
                state.read += take;
                if !go {
                    return Ok(false);
                }
            }
        }
    }
}

/// Where [`Conn::read_events`] stopped in the body.
#[derive(Debug, Default)]
pub struct BodyState {
    chunk_left: usize,
    in_chunk: bool,
    read: usize,
}

/// One item out of an event stream.
#[derive(Debug)]
pub enum SseItem<'a> {
    Event {
        event: &'a str,
        id: &'a str,
        data: &'a str,
    },
    Comment,
    Retry(u64),
}

/// An incremental SSE parser (`event`, `id`, `data`, `retry`, comments).
#[derive(Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: String,
    id: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds body bytes; returns `false` when `on_item` asked to stop.
    pub fn feed<F>(&mut self, bytes: &[u8], on_item: &mut F) -> bool
    where
        F: FnMut(SseItem<'_>) -> bool,
    {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = std::mem::take(&mut self.line);
            let go = self.on_line(&line, on_item);
            self.line = line;
            self.line.clear();
            if !go {
                return false;
            }
        }
        self.line.extend_from_slice(rest);
        if self.line.len() > 64 * 1024 {
            self.line.clear();
        }
        true
    }

    fn on_line<F>(&mut self, line: &[u8], on_item: &mut F) -> bool
    where
        F: FnMut(SseItem<'_>) -> bool,
    {
        if line.is_empty() {
            if !self.has_data {
                self.event.clear();
                return true;
            }
            let event = if self.event.is_empty() {
                "message"
            } else {
                self.event.as_str()
            };
            let go = on_item(SseItem::Event {
                event,
                id: &self.id,
                data: &self.data,
            });
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            // `id` persists per the SSE spec (last event id).
            return go;
        }
        if line[0] == b':' {
            return on_item(SseItem::Comment);
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let mut v = &line[c + 1..];
                if v.first() == Some(&b' ') {
                    v = &v[1..];
                }
                (&line[..c], v)
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => {
                self.event.clear();
                self.event.push_str(&value);
            }
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"id" => {
                self.id.clear();
                self.id.push_str(&value);
            }
            b"retry" => {
                if let Ok(ms) = value.parse() {
                    return on_item(SseItem::Retry(ms));
                }
            }
            _ => {}
        }
        true
    }

    /// Frees the buffers' spare capacity.
    pub fn shrink(&mut self) {
        self.line.shrink_to_fit();
        self.event.shrink_to_fit();
        self.data.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_anywhere() {
        let text = b"retry: 3000\nevent: waiting\nid: 17\ndata: {\"rank\":1}\n\n: keep-alive\n\nevent: ready\nid: 18.2\ndata: {\"a\":1}\n\n";
        for split in 0..text.len() {
            let mut p = SseParser::default();
            let mut got = Vec::new();
            let mut f = |item: SseItem<'_>| {
                match item {
                    SseItem::Event { event, id, data } => got.push(format!("{event}|{id}|{data}")),
                    SseItem::Comment => got.push("c".into()),
                    SseItem::Retry(ms) => got.push(format!("r{ms}")),
                }
                true
            };
            p.feed(&text[..split], &mut f);
            p.feed(&text[split..], &mut f);
            assert_eq!(
                got,
                [
                    "r3000",
                    "waiting|17|{\"rank\":1}",
                    "c",
                    "ready|18.2|{\"a\":1}"
                ],
                "split at {split}"
            );
        }
    }

    #[test]
    fn source_ips() {
        let s = SourceIps::parse("127.0.0.2-127.0.0.4").unwrap();
        assert_eq!(s.0.len(), 3);
        assert!(SourceIps::parse("10.0.0.1").is_err());
    }
}
