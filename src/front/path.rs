//! One spelling of a request's path before anything is decided on it.
//!
//! Rooms are matched by path prefix, and waitroom's own paths by the
//! reserved prefix: both decisions must be taken on the path the origin
//! will act on, or a request could be matched as one thing and served as
//! another (`/public/../protected/x` matched as `/public`, served by the
//! origin as `/protected/x`). So the path is resolved here once, as RFC
//! 3986 §5.2.4 says (dot segments removed, with `%2e` read as `.`), empty
//! segments folded, and that resolved path is both what is matched and
//! what is forwarded. What cannot be given one meaning is refused (`400`):
//! an encoded slash or backslash (`%2f`, `%5c`: one server reads a
//! separator, another a character), a raw backslash, a control character
//! or NUL, and a `..` that would climb above the root.

use std::fmt;

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRefused {
    /// `%2f` or `%5c` in a segment, or a raw `\`.
    EncodedSeparator,
    /// A control byte, raw or percent-encoded.
    ControlByte,
    /// More `..` than segments above them.
    AboveRoot,
    /// A `%` not followed by two hex digits.
    BadEscape,
}

impl fmt::Display for PathRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EncodedSeparator => "the path holds an encoded or backslash separator",
            Self::ControlByte => "the path holds a control character",
            Self::AboveRoot => "the path climbs above the root",
            Self::BadEscape => "the path holds a malformed percent escape",
        })
    }
}

/// The resolved form of `raw` (a request target's path, without its
/// query): starts with `/`, no `.` or `..` segment, no empty segment but a
/// trailing one (`/a/` stays `/a/`); each kept segment keeps its original
/// spelling, so the origin receives what the client wrote, less the parts
/// that would have moved it elsewhere.
pub fn normalize(raw: &str) -> Result<String, PathRefused> {
    // Most paths have nothing to resolve: said once, without taking them
    // apart.
    if already_normal(raw) {
        return Ok(raw.to_owned());
    }
    if raw.contains('\\') {
        return Err(PathRefused::EncodedSeparator);
    }
    if raw.bytes().any(|b| b.is_ascii_control()) {
        return Err(PathRefused::ControlByte);
    }
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = raw.split('/').collect();
    let last = segments.len().saturating_sub(1);
    let mut trailing_slash = false;
    for (i, segment) in segments.iter().enumerate() {
        let decoded = decode_segment(segment)?;
        match decoded.as_str() {
            "" => {
                // A trailing `/` is meaningful (`/shop/` is not `/shop`);
                // an empty segment elsewhere is folded.
                if i == last && i > 0 {
                    trailing_slash = true;
                }
            }
            "." => trailing_slash = i == last,
            ".." => {
                if kept.pop().is_none() {
                    return Err(PathRefused::AboveRoot);
                }
                trailing_slash = i == last;
            }
            _ => {
                kept.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(raw.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if kept.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(out)
}

/// Whether `raw` is its own resolved form: rooted, no escape, backslash
/// or control byte, and no segment empty (but a trailing one), `.` or
/// `..`.
fn already_normal(raw: &str) -> bool {
    if raw == "/" {
        return true;
    }
    let Some(inner) = raw.strip_prefix('/') else {
        return false;
    };
    if raw
        .bytes()
        .any(|b| b == b'%' || b == b'\\' || b.is_ascii_control())
    {
        return false;
    }
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    !inner.is_empty()
        && inner
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

/// A segment percent-decoded, as far as deciding on it needs: refused when
/// it hides a separator or a control byte.
fn decode_segment(segment: &str) -> Result<String, PathRefused> {
    if !segment.contains('%') {
        return Ok(segment.to_owned());
    }
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3).ok_or(PathRefused::BadEscape)?;
            let byte = u8::from_str_radix(hex, 16).map_err(|_| PathRefused::BadEscape)?;
            if byte == b'/' || byte == b'\\' {
                return Err(PathRefused::EncodedSeparator);
            }
            if byte.is_ascii_control() {
                return Err(PathRefused::ControlByte);
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Whether `path` (normalized) is `prefix` or below it, at a segment
/// boundary: `/shop` covers `/shop` and `/shop/x`, not `/shopping`.
pub fn is_below(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return true;
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_stay_as_written() {
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(normalize("/product/42").unwrap(), "/product/42");
        assert_eq!(normalize("/shop/").unwrap(), "/shop/");
        assert_eq!(normalize("/a%20b/%C3%A9").unwrap(), "/a%20b/%C3%A9");
    }

    #[test]
    fn dot_segments_are_resolved_encoded_or_not() {
        assert_eq!(normalize("/protected/../public").unwrap(), "/public");
        assert_eq!(normalize("/protected/%2e%2e/public").unwrap(), "/public");
        assert_eq!(normalize("/protected/.%2E/public").unwrap(), "/public");
        assert_eq!(normalize("/a/./b/.").unwrap(), "/a/b/");
        assert_eq!(normalize("/a/b/..").unwrap(), "/a/");
        assert_eq!(normalize("//a///b").unwrap(), "/a/b");
    }

    #[test]
    fn what_has_two_meanings_is_refused() {
        assert_eq!(normalize("/a%2fb"), Err(PathRefused::EncodedSeparator));
        assert_eq!(normalize("/a%2Fb"), Err(PathRefused::EncodedSeparator));
        assert_eq!(normalize("/a%5cb"), Err(PathRefused::EncodedSeparator));
        assert_eq!(normalize("/a\\b"), Err(PathRefused::EncodedSeparator));
        assert_eq!(normalize("/a%00b"), Err(PathRefused::ControlByte));
        assert_eq!(normalize("/a%zz"), Err(PathRefused::BadEscape));
        assert_eq!(normalize("/a%2"), Err(PathRefused::BadEscape));
        assert_eq!(normalize("/.."), Err(PathRefused::AboveRoot));
        assert_eq!(normalize("/a/../../b"), Err(PathRefused::AboveRoot));
    }

    proptest::proptest! {
        /// The shortcut for paths with nothing to resolve answers what
        /// the whole resolution answers.
        #[test]
        fn the_shortcut_agrees_with_the_resolution(raw in "/[a./%2eE\\\\]{0,12}") {
            if already_normal(&raw) {
                // `/.` in front: a dot segment, so the whole resolution
                // runs, and it resolves to `raw` again.
                let resolved = normalize(&format!("/.{raw}"));
                proptest::prop_assert_eq!(resolved, Ok(raw.clone()));
            }
        }
    }

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(is_below("/shop", "/shop"));
        assert!(is_below("/shop/x", "/shop"));
        assert!(is_below("/shop/x", "/shop/"));
        assert!(!is_below("/shopping", "/shop"));
        assert!(is_below("/anything", "/"));
    }
}
