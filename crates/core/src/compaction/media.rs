//! The images and documents of a proxied message, in tokens, and what of them a form the
//! context shows keeps.
//!
//! compactd reads an image or a document as a note of a few tokens, and the model bills it by
//! what it holds (`provider::media` counts that). A message the context shows otherwise (its
//! outputs masked, or shortened to head and tail) goes upstream as the client sent it with
//! only its text patched: a tool result shown otherwise goes as text, its media dropped with
//! it, and every other block stays, media included (a person's pasted screenshot beside a
//! long log is still sent). So what such a form costs is its text's estimate plus the media
//! it keeps; counting the text alone sent contexts past the window.

use crate::message::{Part, output_of};
use serde::{Deserialize, Serialize};

/// What a message's media cost the model, by where they sit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Media {
    /// Tokens of the media outside any tool result: every form of the message keeps them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outside: usize,
    /// Tokens of the media inside each tool result that holds any, by its call id: a form
    /// that shows that result otherwise drops them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<(String, usize)>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Media {
    /// All of them, as the message the client sent costs.
    pub fn total(&self) -> usize {
        self.outside + self.results.iter().map(|(_, n)| n).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// What of them goes upstream with the message shown as `shown` (its parts as stored
    /// were `original`): those outside results, and those of each result shown as it was.
    pub fn kept(&self, original: &[Part], shown: &[Part]) -> usize {
        let kept_results = self
            .results
            .iter()
            .filter(|(id, _)| {
                let changed =
                    output_of(shown, id).is_some_and(|o| Some(o) != output_of(original, id));
                !changed
            })
            .map(|(_, n)| n)
            .sum::<usize>();
        self.outside + kept_results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, output: &str) -> Part {
        Part::ToolResult {
            call_id: id.into(),
            name: None,
            output: output.into(),
            is_error: false,
        }
    }

    #[test]
    fn a_form_keeps_the_media_outside_results_and_in_results_shown_as_they_were() {
        let media = Media {
            outside: 1_399,
            results: vec![("a".into(), 1_600), ("b".into(), 2_347)],
        };
        assert_eq!(media.total(), 1_399 + 1_600 + 2_347);
        let original = [
            result("a", "[image omitted]"),
            result("b", "PDF read\n[document omitted]"),
            Part::Text {
                text: "Look at this.\n[image omitted]".into(),
            },
        ];
        assert_eq!(media.kept(&original, &original), media.total());
        let masked = [
            result("a", "[image omitted]"),
            result("b", "[output of Read masked: 27 chars]"),
            original[2].clone(),
        ];
        assert_eq!(
            media.kept(&original, &masked),
            1_399 + 1_600,
            "the masked result's document goes with it; the image beside stays"
        );
        let shortened_text = [
            original[0].clone(),
            original[1].clone(),
            Part::Text {
                text: "Look at [… cut …]".into(),
            },
        ];
        assert_eq!(media.kept(&original, &shortened_text), media.total());
        assert!(Media::default().is_empty());
    }

    #[test]
    fn media_are_stored_as_short_json() {
        let media = Media {
            outside: 85,
            results: vec![("c1".into(), 765)],
        };
        let json = serde_json::to_string(&media).unwrap();
        assert_eq!(json, r#"{"outside":85,"results":[["c1",765]]}"#);
        assert_eq!(serde_json::from_str::<Media>(&json).unwrap(), media);
        assert_eq!(
            serde_json::to_string(&Media {
                outside: 85,
                results: vec![]
            })
            .unwrap(),
            r#"{"outside":85}"#
        );
    }
}
