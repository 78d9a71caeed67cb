//! TSDL tokens. Keywords are returned as plain words: they double as path
//! components (`stream.event.header.id`, `clock.monotonic.value`), so the
//! parser decides what a word means from where it stands.
//!
//! Words borrow the metadata text: a kernel trace's metadata holds tens of
//! thousands of them (one `integer { size = 32; ... }` per field of each of
//! its hundreds of event classes), and a copy of each was most of the time
//! spent opening a small trace.

use super::ParseError;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok<'a> {
    Word(&'a str),
    /// Integer constant; negative values come from a unary minus in the parser.
    Int(u64),
    Str(String),
    /// Punctuation: `{ } [ ] ( ) ; , = . < > : * + -` and the multi-char
    /// `:=`, `...`, `->`.
    Punct(&'static str),
}

#[derive(Clone, Debug)]
pub(crate) struct Token<'a> {
    pub tok: Tok<'a>,
    /// Byte offset of the first character in the metadata text.
    pub offset: usize,
}

pub(crate) fn tokenize(text: &[u8]) -> Result<Vec<Token<'_>>, ParseError> {
    // About one token per 4 bytes of kernel metadata.
    let mut out = Vec::with_capacity(text.len() / 3);
    // Words are sliced from the text as a whole when it is UTF-8 (as it
    // always is), which is cheaper than checking each word.
    let utf8 = std::str::from_utf8(text).ok();
    let mut i = 0;
    let n = text.len();
    while i < n {
        let c = text[i];
        if c.is_ascii_whitespace() || c == 0 {
            i += 1;
            continue;
        }
        let start = i;
        if c == b'/' && text.get(i + 1) == Some(&b'*') {
            let Some(end) = find(text, i + 2, b"*/") else {
                return Err(ParseError::new(start, "unterminated comment"));
            };
            i = end + 2;
            continue;
        }
        if c == b'/' && text.get(i + 1) == Some(&b'/') {
            while i < n && text[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < n && IDENT[text[i] as usize] {
                i += 1;
            }
            // ASCII by construction: neither fails.
            let word = match utf8 {
                Some(t) => &t[start..i],
                None => std::str::from_utf8(&text[start..i])
                    .map_err(|_| ParseError::new(start, "identifier is not ASCII"))?,
            };
            out.push(Token {
                tok: Tok::Word(word),
                offset: start,
            });
            continue;
        }
        if c.is_ascii_digit() {
            let (value, len) = integer(&text[i..]).map_err(|m| ParseError::new(start, m))?;
            i += len;
            out.push(Token {
                tok: Tok::Int(value),
                offset: start,
            });
            continue;
        }
        if c == b'"' {
            let (s, len) = string(&text[i..]).map_err(|m| ParseError::new(start, m))?;
            i += len;
            out.push(Token {
                tok: Tok::Str(s),
                offset: start,
            });
            continue;
        }
        if c == b'\'' {
            // Character constant: only its value matters (as an integer).
            let (s, len) = quoted(&text[i..], b'\'').map_err(|m| ParseError::new(start, m))?;
            i += len;
            let value = s.first().copied().unwrap_or(0) as u64;
            out.push(Token {
                tok: Tok::Int(value),
                offset: start,
            });
            continue;
        }
        let next = text.get(i + 1).copied();
        let punct: &'static str = match c {
            b':' if next == Some(b'=') => ":=",
            b'.' if next == Some(b'.') && text.get(i + 2) == Some(&b'.') => "...",
            b'-' if next == Some(b'>') => "->",
            b'{' => "{",
            b'}' => "}",
            b'[' => "[",
            b']' => "]",
            b'(' => "(",
            b')' => ")",
            b';' => ";",
            b',' => ",",
            b'=' => "=",
            b'.' => ".",
            b'<' => "<",
            b'>' => ">",
            b':' => ":",
            b'*' => "*",
            b'+' => "+",
            b'-' => "-",
            _ => {
                return Err(ParseError::new(
                    start,
                    format!("unexpected character {:?}", c as char),
                ));
            }
        };
        i += punct.len();
        out.push(Token {
            tok: Tok::Punct(punct),
            offset: start,
        });
    }
    Ok(out)
}

/// Bytes that continue an identifier (`[A-Za-z0-9_]`), by value: one load
/// per byte of the many words of kernel metadata.
static IDENT: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_';
        b += 1;
    }
    t
};

fn find(text: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    text.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Decimal, octal (leading 0) or hexadecimal (0x) constant with optional
/// C suffixes (u, l, ll in any case).
fn integer(text: &[u8]) -> Result<(u64, usize), String> {
    let (radix, mut i) =
        if text.len() > 1 && text[0] == b'0' && (text[1] == b'x' || text[1] == b'X') {
            (16, 2)
        } else if text[0] == b'0' {
            (8, 1)
        } else {
            (10, 0)
        };
    let digits_start = i;
    let mut value: u64 = 0;
    while i < text.len() && text[i].is_ascii_alphanumeric() {
        let c = text[i];
        if matches!(c, b'u' | b'U' | b'l' | b'L') {
            break;
        }
        let d = (c as char)
            .to_digit(radix)
            .ok_or_else(|| format!("bad digit {:?} in integer constant", c as char))?;
        value = value
            .checked_mul(radix as u64)
            .and_then(|v| v.checked_add(d as u64))
            .ok_or("integer constant does not fit in 64 bits")?;
        i += 1;
    }
    if radix == 16 && i == digits_start {
        return Err("hexadecimal constant without digits".into());
    }
    while i < text.len() && matches!(text[i], b'u' | b'U' | b'l' | b'L') {
        i += 1;
    }
    if i < text.len() && (text[i].is_ascii_alphanumeric() || text[i] == b'_') {
        return Err(format!(
            "bad character {:?} after integer constant",
            text[i] as char
        ));
    }
    Ok((value, i))
}

fn string(text: &[u8]) -> Result<(String, usize), String> {
    let (bytes, len) = quoted(text, b'"')?;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), len))
}

/// A C quoted literal starting at `text[0] == quote`; returns its bytes with
/// escapes resolved and the length consumed.
fn quoted(text: &[u8], quote: u8) -> Result<(Vec<u8>, usize), String> {
    let mut out = Vec::new();
    let mut i = 1;
    loop {
        let Some(&c) = text.get(i) else {
            return Err("unterminated literal".into());
        };
        i += 1;
        if c == quote {
            return Ok((out, i));
        }
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = text.get(i) else {
            return Err("unterminated literal".into());
        };
        i += 1;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'x' => {
                let mut v: u32 = 0;
                let mut count = 0;
                while let Some(d) = text.get(i).and_then(|c| (*c as char).to_digit(16)) {
                    v = (v << 4 | d) & 0xff;
                    i += 1;
                    count += 1;
                }
                if count == 0 {
                    return Err("\\x escape without digits".into());
                }
                out.push(v as u8);
            }
            b'0'..=b'7' => {
                let mut v: u32 = (e - b'0') as u32;
                let mut count = 1;
                while count < 3 {
                    match text.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + (d - b'0') as u32;
                            i += 1;
                            count += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok<'_>> {
        tokenize(s.as_bytes())
            .unwrap()
            .into_iter()
            .map(|t| t.tok)
            .collect()
    }

    #[test]
    fn lexes_constants_comments_and_punctuation() {
        assert_eq!(
            toks("/* CTF 1.8 */ a := 0x1F; // x\n b = 017 ... \"q\\\"\\n\" 10UL"),
            vec![
                Tok::Word("a"),
                Tok::Punct(":="),
                Tok::Int(31),
                Tok::Punct(";"),
                Tok::Word("b"),
                Tok::Punct("="),
                Tok::Int(15),
                Tok::Punct("..."),
                Tok::Str("q\"\n".into()),
                Tok::Int(10),
            ]
        );
    }

    #[test]
    fn rejects_garbage_with_offset() {
        let e = tokenize(b"abc @").unwrap_err();
        assert_eq!(e.offset, 4);
        assert!(tokenize(b"\"open").is_err());
        assert!(tokenize(b"/* open").is_err());
        assert!(tokenize(b"99999999999999999999999").is_err());
    }
}
