//! What the PDF documents of a proxied message cost the model, in tokens.
//!
//! Claude Code's `Read` of a PDF sends the file whole, as a `document` block in the tool's
//! result (checked against Claude Code 2.1.332), and compactd read it as a note of a few
//! tokens. The model reads a PDF page by page, each page's text and an image of it: a page of
//! text costs Claude 2,100 to 2,500 tokens, a scanned page about 1,600, its image alone (a
//! published measurement of Claude's own counts; a user's 44 slides read by Claude Code cost
//! 73,500, 1,670 a page). A document counts [`PAGE_TOKENS`] a page, the most a page was seen
//! to cost (a compaction early rather than a refusal late), its pages counted in the file:
//! its page objects, those inside compressed object streams too (pdfTeX and most writers
//! since PDF 1.5 put them there), inflated within [`MAX_INFLATED`] bytes a document (and
//! [`MAX_INFLATION`] times its size: a small request's is parsed on a runtime worker), a buffer
//! at a time, so a small body that inflates to gigabytes costs a bounded moment and no
//! memory.
//!
//! The count is checked: no more than the page tree's `/Count` (page objects nothing refers
//! to are not pages), and no more than a file of its size can hold ([`MIN_PAGE_BYTES`] a
//! page). A PDF whose pages cannot be counted, or whose count fails the checks (an 85 KB
//! file of bare page objects once counted 787 million tokens and was left out of every
//! context after), counts a page per [`BYTES_PER_UNCOUNTED_PAGE`] of it.

use flate2::{Decompress, FlushDecompress, Status};
use memchr::memmem;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

/// What one page of a PDF is counted at: the most a page of text was measured to cost Claude
/// (its image, at most 1,600, and its text).
pub(super) const PAGE_TOKENS: usize = 2_500;
/// A PDF whose pages are not found counts a page for every this many bytes (at least one).
const BYTES_PER_UNCOUNTED_PAGE: usize = 20_000;
/// The fewest bytes a page takes in a real PDF: its page object and its content. Blank pages
/// written by pypdf take 124 bytes each; a page of text written by fpdf2, 600.
const MIN_PAGE_BYTES: usize = 100;
/// The most a document's compressed object streams are inflated to, together.
const MAX_INFLATED: usize = 16 << 20;
/// And at most this many times the document's own size: object streams compress some 3 to
/// 10 times, and are a part of the file; a stream of zeros compresses a thousand times.
const MAX_INFLATION: usize = 64;
/// The most object streams of a document inflated (a large book has some hundreds).
const MAX_STREAMS: usize = 4_096;
/// How far after `/Type /ObjStm` its dictionary ends and its stream begins, at most.
const DICTIONARY_BYTES: usize = 4_096;
/// Inflated a buffer of this size at a time.
const WINDOW: usize = 64 << 10;
/// Bytes carried from one buffer to the next, so that a page object cut between two is found:
/// more than `/Type`, some white space, `/Page` and the byte after it.
const CARRIED: usize = 32;
/// PDFs counted lately, at most this many: a conversation's PDFs are sent again with every
/// call, and counting one reads the whole of it.
const MAX_COUNTED: usize = 4_096;

/// What PDFs counted lately cost, by the SHA-256 of their base64 text: counting one decodes
/// and inflates the whole of it, and an agent that read thirty sends them all with every
/// call. The count is a function of the bytes alone, and the key is a hash of all of them, so
/// no caller's document can set what another's counts (the key once was the length and the
/// two ends, and another key's forgery of the same length set a victim's count).
static COUNTED: LazyLock<Mutex<HashMap<[u8; 32], usize>>> = LazyLock::new(Default::default);

/// What a document block costs: Anthropic's `document` (a PDF's bytes in `source.data`,
/// plain text in it, or a PDF by URL or file id), Chat's `file` and Responses' `input_file`
/// (a PDF's bytes as a `data:` URL in `file_data`, or a file id). A document whose pages are
/// not in the request counts one page.
pub(super) fn tokens(block: &Value) -> usize {
    let source = &block["source"];
    let inline = match source["type"].as_str() {
        Some("base64") => source["data"].as_str(),
        Some("text") => {
            return source["data"]
                .as_str()
                .map_or(0, |text| text.len().div_ceil(3));
        }
        _ => block
            .get("file")
            .unwrap_or(block)
            .get("file_data")
            .and_then(Value::as_str)
            .and_then(|url| url.split_once(";base64,"))
            .map(|(_, data)| data),
    };
    inline.map_or(PAGE_TOKENS, pdf_tokens)
}

/// Tokens a PDF costs the model, `base64` its bytes as a request carries them: counted once
/// and remembered (see [`COUNTED`]).
fn pdf_tokens(base64: &str) -> usize {
    let key: [u8; 32] = Sha256::digest(base64.as_bytes()).into();
    let counted = || COUNTED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&tokens) = counted().get(&key) {
        return tokens;
    }
    let pdf = super::base64_text::decode(base64.as_bytes());
    let pages = pdf_pages(&pdf)
        .filter(|&pages| pages <= pdf.len() / MIN_PAGE_BYTES)
        .unwrap_or(pdf.len() / BYTES_PER_UNCOUNTED_PAGE);
    let tokens = pages.max(1) * PAGE_TOKENS;
    let mut counted = counted();
    if counted.len() >= MAX_COUNTED {
        counted.clear();
    }
    counted.insert(key, tokens);
    tokens
}

/// The pages of a PDF, if it is one and any page object is found: its page objects, and no
/// more than the largest `/Count` in it (the page tree's root counts every page; an outline's
/// count, if larger, is bounded by the page objects all the same).
fn pdf_pages(pdf: &[u8]) -> Option<usize> {
    if !pdf.starts_with(b"%PDF") {
        return None;
    }
    let mut inflating = Inflating::new(inflation_limit(pdf.len()));
    let mut found = Found::default();
    let mut from = 0;
    while let Some(next) = memchr::memchr(b'/', &pdf[from..]) {
        let at = from + next;
        from = at + 1;
        let rest = &pdf[at..];
        if let Some(count) = count_value(rest) {
            found.most_counted = found.most_counted.max(Some(count));
            continue;
        }
        if !rest.starts_with(b"/Type") {
            continue;
        }
        match named_type(rest) {
            Some(Type::Page) => found.page_objects += 1,
            Some(Type::ObjectStream) if inflating.streams < MAX_STREAMS => {
                if let Some(start) = stream_start(rest) {
                    let (inside, read) = inflating.read(&pdf[at + start..]);
                    found.add(inside);
                    // The stream's bytes are not searched again as they stand.
                    from = at + start + read;
                }
            }
            _ => {}
        }
    }
    found.pages()
}

/// What a PDF's text (or an object stream's) was found to hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Found {
    page_objects: usize,
    /// The largest `/Count` value.
    most_counted: Option<usize>,
}

impl Found {
    fn add(&mut self, other: Found) {
        self.page_objects += other.page_objects;
        self.most_counted = self.most_counted.max(other.most_counted);
    }

    fn pages(self) -> Option<usize> {
        let pages = self
            .most_counted
            .map_or(self.page_objects, |count| count.min(self.page_objects));
        (pages > 0).then_some(pages)
    }
}

/// The number after `/Count` at the start of `text`, if it is one (and its digits end in it).
fn count_value(text: &[u8]) -> Option<usize> {
    let rest = text.strip_prefix(b"/Count")?.trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits == rest.len() || digits > 12 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// The most a document of `bytes` has inflated.
fn inflation_limit(bytes: usize) -> usize {
    bytes.saturating_mul(MAX_INFLATION).min(MAX_INFLATED)
}

/// The object types counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Page,
    ObjectStream,
}

/// What `/Type` at the start of `text` names, if it is a page or an object stream (`/Pages`,
/// a page tree's node, is neither). `None` too if the name's end is not in `text` yet.
fn named_type(text: &[u8]) -> Option<Type> {
    let rest = &text[b"/Type".len()..];
    let name = rest.trim_ascii_start();
    let (kind, len) = if name.starts_with(b"/Page") {
        (Type::Page, b"/Page".len())
    } else if name.starts_with(b"/ObjStm") {
        (Type::ObjectStream, b"/ObjStm".len())
    } else {
        return None;
    };
    // A name goes on until white space or a delimiter: `/Pages` is another name.
    let after = *name.get(len)?;
    let ends = after.is_ascii_whitespace() || b"/<>[]()%{}".contains(&after);
    ends.then_some(kind)
}

/// Where the stream data begins after the object dictionary at the start of `text`: after
/// its `stream` keyword and end of line (the deflate stream ends itself). The keyword comes
/// within [`DICTIONARY_BYTES`], right after the dictionary's `>>`, or it is not there.
fn stream_start(text: &[u8]) -> Option<usize> {
    let head = &text[..text.len().min(DICTIONARY_BYTES)];
    let keyword = memmem::find(head, b"stream")?;
    if !head[..keyword].trim_ascii_end().ends_with(b">>") {
        return None;
    }
    let mut start = keyword + b"stream".len();
    for end_of_line in [b'\r', b'\n'] {
        if text.get(start) == Some(&end_of_line) {
            start += 1;
        }
    }
    Some(start)
}

/// The inflating of a document's object streams: one inflater and one window for all of
/// them, and how much they inflated and how many there were, each bounded.
struct Inflating {
    inflater: Decompress,
    window: Vec<u8>,
    /// Bytes inflated so far, at most `limit`.
    inflated: usize,
    limit: usize,
    /// Object streams read so far, at most [`MAX_STREAMS`].
    streams: usize,
}

impl Inflating {
    /// Inflating at most `limit` bytes in all.
    fn new(limit: usize) -> Inflating {
        Inflating {
            inflater: Decompress::new(true),
            window: vec![0u8; CARRIED + WINDOW],
            inflated: 0,
            limit,
            streams: 0,
        }
    }

    /// Page objects and counts in the zlib stream at the start of `data`, inflated a window at
    /// a time, and how many bytes of `data` were read. A stream that is not zlib (another
    /// filter) holds what it inflated before failing, which is nothing.
    fn read(&mut self, data: &[u8]) -> (Found, usize) {
        self.streams += 1;
        self.inflater.reset(true);
        let mut carried = 0;
        let mut found = Found::default();
        while self.inflated < self.limit {
            let (read, written) = (self.inflater.total_in(), self.inflater.total_out());
            let Some(input) = data.get(read as usize..) else {
                break;
            };
            let status =
                self.inflater
                    .decompress(input, &mut self.window[carried..], FlushDecompress::None);
            let produced = (self.inflater.total_out() - written) as usize;
            self.inflated += produced;
            let filled = carried + produced;
            found.add(found_ending_after(&self.window[..filled], carried));
            let done = match status {
                Ok(Status::StreamEnd) | Err(_) => true,
                Ok(_) => produced == 0 && self.inflater.total_in() == read,
            };
            if done {
                break;
            }
            let keep = filled.min(CARRIED);
            self.window.copy_within(filled - keep..filled, 0);
            carried = keep;
        }
        (found, self.inflater.total_in() as usize)
    }
}

/// Page objects and counts in `text` whose last byte read (the one after `/Page`, or after
/// the count's digits) lies past `from`: those before were found in the previous window.
fn found_ending_after(text: &[u8], from: usize) -> Found {
    let mut found = Found::default();
    for at in memchr::memchr_iter(b'/', text) {
        let rest = &text[at..];
        let after = |len: usize| text.len() - rest.len() + len + 1 > from;
        if let Some(count) = count_value(rest) {
            let name = rest[b"/Count".len()..].trim_ascii_start();
            let digits = name.iter().take_while(|b| b.is_ascii_digit()).count();
            if after(rest.len() - name.len() + digits) {
                found.most_counted = found.most_counted.max(Some(count));
            }
        } else if rest.starts_with(b"/Type") && named_type(rest) == Some(Type::Page) {
            let name = rest[b"/Type".len()..].trim_ascii_start();
            if after(rest.len() - name.len() + b"/Page".len()) {
                found.page_objects += 1;
            }
        }
    }
    found
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::provider::base64_text::tests::encoded as base64;
    use flate2::Compression;
    use flate2::write::ZlibEncoder;
    use std::io::Write;

    /// A PDF of `pages` pages, its objects plain (PDF 1.4) or, with `compressed`, its page
    /// objects in one object stream (as pdfTeX and PDF 1.5 writers put them).
    pub fn pdf(pages: usize, compressed: bool) -> Vec<u8> {
        let page = |i: usize| {
            format!(
                "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {} 0 R >>",
                100 + i
            )
        };
        let mut out = b"%PDF-1.5\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n".to_vec();
        out.extend(format!("2 0 obj\n<</Type/Pages/Count {pages}>>\nendobj\n").as_bytes());
        let objects: String = (0..pages).map(page).collect::<Vec<_>>().join("\n");
        if compressed {
            let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
            zlib.write_all(objects.as_bytes()).unwrap();
            let data = zlib.finish().unwrap();
            out.extend(
                format!("3 0 obj\n<< /Type /ObjStm /N {pages} /First 0 /Filter /FlateDecode /Length {} >>\nstream\r\n", data.len())
                    .as_bytes(),
            );
            out.extend(data);
            out.extend(b"\nendstream\nendobj\n");
        } else {
            out.extend(objects.as_bytes());
        }
        // Each page's content, as plain streams: a page of a real PDF takes some bytes.
        for i in 0..pages {
            let text = format!(
                "BT /F1 12 Tf 72 700 Td (Page {} of the report.) Tj ET",
                i + 1
            );
            out.extend(
                format!(
                    "\n{} 0 obj\n<< /Length {} >>\nstream\n{text}\nendstream\nendobj",
                    100 + i,
                    text.len()
                )
                .as_bytes(),
            );
        }
        out.extend(b"\n%%EOF\n");
        out
    }

    #[test]
    fn pages_are_counted_in_plain_and_compressed_objects_and_page_trees_are_not() {
        for pages in [1, 3, 40] {
            assert_eq!(pdf_pages(&pdf(pages, false)), Some(pages));
            assert_eq!(pdf_pages(&pdf(pages, true)), Some(pages));
            assert_eq!(pdf_tokens(&base64(&pdf(pages, true))), pages * PAGE_TOKENS);
        }
        // `/Type/Page` without a space, and the tree's `/Pages` beside it.
        let tight =
            b"%PDF-1.7\n<</Type/Pages/Kids[3 0 R]>> <</Type/Page/Parent 2 0 R>> <</Type /Page>>";
        assert_eq!(pdf_pages(tight), Some(2));
    }

    #[test]
    fn a_pdf_sent_again_is_counted_from_memory() {
        let text = base64(&pdf(7, true));
        assert_eq!(pdf_tokens(&text), 7 * PAGE_TOKENS);
        let key: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(COUNTED.lock().unwrap().get(&key), Some(&(7 * PAGE_TOKENS)));
    }

    /// A forgery the same length as a genuine PDF, with the same first and last 4,096
    /// characters (a middle of page objects blanked out), counted first, as another key's
    /// request would: the genuine one is counted by its own pages all the same. The cache's
    /// key was the length and the two ends.
    #[test]
    fn a_forgery_sharing_a_pdfs_length_and_ends_does_not_set_its_count() {
        let genuine = pdf(200, false);
        let mut forged = genuine.clone();
        let third = genuine.len() / 9 * 3;
        forged[third..third + 3_000].fill(b' ');
        let (genuine, forged) = (base64(&genuine), base64(&forged));
        assert_eq!(genuine.len(), forged.len());
        let ends = |t: &str| (t[..4_096].to_string(), t[t.len() - 4_096..].to_string());
        assert!(ends(&genuine) == ends(&forged));
        assert!(pdf_tokens(&forged) < 200 * PAGE_TOKENS);
        assert_eq!(pdf_tokens(&genuine), 200 * PAGE_TOKENS);
    }

    /// An 85 KB PDF of bare page objects nothing refers to, plain or in an object stream:
    /// counted as their number it cost 787 million tokens and left the context. The page
    /// tree's count bounds it where there is one; where there is none, a count more than the
    /// file could hold is no count, and the file counts by its size.
    #[test]
    fn page_objects_past_the_page_tree_or_the_files_size_are_not_counted() {
        let bare = b"<</Type/Page>>".repeat(85_000 / 14);
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::best());
        zlib.write_all(&b"<</Type/Page>>".repeat(300_000)).unwrap();
        let stream = [
            &b"%PDF-1.5\n<< /Type /ObjStm /N 1 >>\nstream\n"[..],
            &zlib.finish().unwrap(),
            b"\nendstream\n",
        ]
        .concat();
        for body in [[&b"%PDF-1.4\n"[..], &bare].concat(), stream] {
            assert!(pdf_pages(&body).unwrap() > 5_000);
            let tree = [
                &body[..],
                b"\n<< /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >>\n",
            ]
            .concat();
            assert_eq!(pdf_pages(&tree), Some(3));
            assert_eq!(pdf_tokens(&base64(&tree)), 3 * PAGE_TOKENS);
            let by_size = (body.len() / BYTES_PER_UNCOUNTED_PAGE).max(1) * PAGE_TOKENS;
            assert_eq!(pdf_tokens(&base64(&body)), by_size);
            assert!(by_size <= 5 * PAGE_TOKENS);
        }
        // A page tree that says more than the pages there are counts the pages.
        let mut liar = pdf(4, true);
        let at = memmem::find(&liar, b"/Count 4").unwrap();
        liar.splice(at..at + 8, b"/Count 4000000".iter().copied());
        assert_eq!(pdf_pages(&liar), Some(4));
    }

    #[test]
    fn a_page_cut_between_two_windows_is_counted_once() {
        // Enough pages that the inflated objects span many windows, every cut somewhere else.
        let pages = 3_000;
        assert!(pdf(pages, false).len() > 3 * WINDOW);
        assert_eq!(pdf_pages(&pdf(pages, true)), Some(pages));
    }

    #[test]
    fn a_stream_inflating_to_far_more_stops_at_the_bound() {
        // 256 MiB of zeros compress to a quarter of a megabyte: inflated up to the bound only.
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::fast());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..256 {
            zlib.write_all(&zeros).unwrap();
        }
        let bomb = zlib.finish().unwrap();
        let mut file = b"%PDF-1.5\n<< /Type /ObjStm /N 1 >>\nstream\n".to_vec();
        file.extend(&bomb);
        let start = 9 + stream_start(&file[9..]).unwrap();
        let limit = inflation_limit(file.len());
        assert_eq!(
            limit, MAX_INFLATED,
            "a quarter megabyte may inflate to the most"
        );
        let mut inflating = Inflating::new(limit);
        let (found, read) = inflating.read(&file[start..]);
        assert_eq!(found.page_objects, 0);
        assert!(read < bomb.len(), "stopped before the stream's end");
        let inflated = inflating.inflated;
        assert!(inflated <= MAX_INFLATED + WINDOW, "inflated {inflated}");
        // No page found: counted by its size.
        assert_eq!(
            pdf_tokens(&base64(&file)),
            file.len() / BYTES_PER_UNCOUNTED_PAGE * PAGE_TOKENS
        );
        // A small document inflates at most its size times MAX_INFLATION.
        let small = &file[..start + 16 * 1024];
        let mut inflating = Inflating::new(inflation_limit(small.len()));
        inflating.read(&small[start..]);
        assert!(inflating.inflated <= small.len() * MAX_INFLATION + WINDOW);
        assert!(inflating.inflated >= small.len() * MAX_INFLATION);
    }

    #[test]
    fn a_text_document_counts_its_text_and_one_by_reference_a_page() {
        let text = serde_json::json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x".repeat(3_000)}});
        assert_eq!(tokens(&text), 1_000);
        let url = serde_json::json!({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}});
        assert_eq!(tokens(&url), PAGE_TOKENS);
    }

    #[test]
    fn object_streams_are_found_after_nested_dictionaries_and_false_ones_cost_little() {
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
        zlib.write_all(b"<</Type/Page>> <</Type/Page>>").unwrap();
        let mut file =
            b"%PDF-1.5\n<< /Type /ObjStm /DecodeParms << /Columns 5 >> /N 2 >>\nstream\n".to_vec();
        file.extend(zlib.finish().unwrap());
        assert_eq!(pdf_pages(&file), Some(2));
        // A body of markers: none with a stream, then each with one that is not zlib.
        let no_stream = [&b"%PDF-1.5\n"[..], &b"<< /Type /ObjStm >> ".repeat(50_000)].concat();
        assert_eq!(pdf_pages(&no_stream), None);
        let not_zlib = [
            &b"%PDF-1.5\n"[..],
            &b"<</Type /ObjStm>>stream\nxx ".repeat(200_000),
        ]
        .concat();
        assert_eq!(pdf_pages(&not_zlib), None);
    }

    #[test]
    fn what_is_not_a_pdf_counts_a_page_for_its_size() {
        assert_eq!(pdf_tokens(""), PAGE_TOKENS);
        assert_eq!(pdf_tokens(&base64(&vec![b'x'; 100_000])), 5 * PAGE_TOKENS);
        // Not base64 past some point: what decoded is counted.
        assert_eq!(pdf_tokens("JVBERi0x!!!"), PAGE_TOKENS);
    }
}
