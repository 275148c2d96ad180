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
//! memory. A PDF whose pages cannot be counted counts a page per
//! [`BYTES_PER_UNCOUNTED_PAGE`] of it.

use flate2::{Decompress, FlushDecompress, Status};
use memchr::memmem;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

/// What one page of a PDF is counted at: the most a page of text was measured to cost Claude
/// (its image, at most 1,600, and its text).
pub(super) const PAGE_TOKENS: usize = 2_500;
/// A PDF whose pages are not found counts a page for every this many bytes (at least one).
const BYTES_PER_UNCOUNTED_PAGE: usize = 20_000;
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
/// Base64 characters at each end of a PDF that, with its length, tell it from another.
const ENDS: usize = 4_096;

/// What PDFs counted lately cost, by their [`identity`]: counting one decodes the whole of it
/// (a 350 KB PDF, 0.5 ms), and an agent that read thirty sends them all with every call.
static COUNTED: LazyLock<Mutex<HashMap<(usize, u64), usize>>> = LazyLock::new(Default::default);

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
    let key = identity(base64.as_bytes());
    let counted = || COUNTED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&tokens) = counted().get(&key) {
        return tokens;
    }
    let pdf = super::base64_text::decode(base64.as_bytes());
    let pages = pdf_pages(&pdf).unwrap_or(pdf.len() / BYTES_PER_UNCOUNTED_PAGE);
    let tokens = pages.max(1) * PAGE_TOKENS;
    let mut counted = counted();
    if counted.len() >= MAX_COUNTED {
        counted.clear();
    }
    counted.insert(key, tokens);
    tokens
}

/// What tells a PDF from another without reading all of it: its length, and a hash of its
/// first and last [`ENDS`] characters (its header and first objects; its cross-reference
/// table, which gives every object's place in the file, and its trailer, where most writers
/// put an ID made from the file's content).
fn identity(base64: &[u8]) -> (usize, u64) {
    let mut hash = crate::fnv::Fnv::default();
    hash.feed(&base64[..base64.len().min(ENDS)]);
    hash.feed(&base64[base64.len().saturating_sub(ENDS)..]);
    (base64.len(), hash.finish())
}

/// The pages of a PDF, if it is one and any page object is found.
fn pdf_pages(pdf: &[u8]) -> Option<usize> {
    if !pdf.starts_with(b"%PDF") {
        return None;
    }
    let mut inflating = Inflating::new(inflation_limit(pdf.len()));
    let (mut pages, mut from) = (0, 0);
    while let Some(found) = memmem::find(&pdf[from..], b"/Type") {
        let at = from + found;
        from = at + b"/Type".len();
        match named_type(&pdf[at..]) {
            Some(Type::Page) => pages += 1,
            Some(Type::ObjectStream) if inflating.streams < MAX_STREAMS => {
                if let Some(start) = stream_start(&pdf[at..]) {
                    let (inside, read) = inflating.pages(&pdf[at + start..]);
                    pages += inside;
                    // The stream's bytes are not searched again as they stand.
                    from = at + start + read;
                }
            }
            _ => {}
        }
    }
    (pages > 0).then_some(pages)
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

    /// Page objects in the zlib stream at the start of `data`, inflated a window at a time,
    /// and how many bytes of `data` were read. A stream that is not zlib (another filter)
    /// counts what it inflated before failing, which is nothing.
    fn pages(&mut self, data: &[u8]) -> (usize, usize) {
        self.streams += 1;
        self.inflater.reset(true);
        let (mut carried, mut pages) = (0, 0);
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
            pages += page_objects_ending_after(&self.window[..filled], carried);
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
        (pages, self.inflater.total_in() as usize)
    }
}

/// Page objects in `text` whose last byte read (the one after `/Page`) lies past `from`: those
/// before were counted with the previous window.
fn page_objects_ending_after(text: &[u8], from: usize) -> usize {
    memmem::find_iter(text, b"/Type")
        .filter(|&at| {
            let name = text[at + b"/Type".len()..].trim_ascii_start();
            let end = text.len() - name.len() + b"/Page".len() + 1;
            end > from && named_type(&text[at..]) == Some(Type::Page)
        })
        .count()
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
    pub(crate) fn pdf(pages: usize, compressed: bool) -> Vec<u8> {
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
        let key = identity(text.as_bytes());
        assert_eq!(COUNTED.lock().unwrap().get(&key), Some(&(7 * PAGE_TOKENS)));
        // Another PDF of the same length differs at its ends: its own count.
        let other = base64(&pdf(7, true)).replace("JVBERi0xLjUK", "JVBERi0xLjYK");
        assert_eq!(other.len(), text.len());
        assert_ne!(identity(other.as_bytes()), key);
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
        let (pages, read) = inflating.pages(&file[start..]);
        assert_eq!(pages, 0);
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
        inflating.pages(&small[start..]);
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
