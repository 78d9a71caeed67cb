//! Recursive descent over the TSDL grammar (CTF 1.8 spec, annex C), limited
//! to what describes data: declarations, typedef/typealias, and the
//! `trace`/`env`/`clock`/`stream`/`event`/`callsite` blocks.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use super::lexer::{tokenize, Tok, Token};
use super::*;

/// Deep enough for any real trace, shallow enough that hostile metadata
/// cannot overflow the stack of this parser or of the decoders after it.
const MAX_DEPTH: usize = 64;
/// Named types can be nested into each other without nesting the text;
/// this bounds how deep a type reached that way may be.
const MAX_TYPE_DEPTH: u32 = 100;
const MAX_DIMS: usize = 16;

pub(crate) fn parse(text: &[u8]) -> Result<MetadataIr, ParseError> {
    let toks = tokenize(text)?;
    let mut p = Parser {
        toks: &toks,
        pos: 0,
        scopes: vec![HashMap::new()],
        depth: 0,
        end: text.len(),
        depths: HashMap::new(),
    };
    let mut out = MetadataIr::default();
    while p.pos < p.toks.len() {
        p.top_item(&mut out)?;
    }
    Ok(out)
}

/// A right-hand side of `key = value` in a block; words borrow the text.
#[derive(Debug)]
enum Value<'t> {
    Int(i128),
    Str(String),
    /// A bare word (`le`, `true`, `none`): nearly every word value.
    Word(&'t str),
    /// A dotted path (`clock.monotonic.value`).
    Path(Vec<&'t str>),
    Type(Rc<TypeIr>),
}

struct Attr<'t> {
    /// The key's words joined with dots (borrowed when a single word, as
    /// nearly all are).
    key: Cow<'t, str>,
    value: Value<'t>,
    offset: usize,
}

enum Dim<'t> {
    Len(u64),
    Path(Vec<&'t str>),
}

/// A dotted path as the IR keeps it.
fn owned(path: Vec<&str>) -> Vec<String> {
    path.into_iter().map(str::to_string).collect()
}

struct Parser<'t> {
    toks: &'t [Token<'t>],
    pos: usize,
    /// Lexical scopes of type names: aliases by their (space-joined) name,
    /// tagged types as `struct X`, `variant X`, `enum X`.
    scopes: Vec<HashMap<String, Rc<TypeIr>>>,
    depth: usize,
    end: usize,
    /// Memoized nesting depth of types, keyed by address; the `Rc` clone
    /// keeps the address from being reused by another type.
    depths: HashMap<*const TypeIr, (Rc<TypeIr>, u32)>,
}

const STRUCTURAL: &[&str] = &[
    "struct",
    "variant",
    "enum",
    "integer",
    "floating_point",
    "string",
    "typedef",
    "typealias",
    "align",
];

impl<'t> Parser<'t> {
    fn offset(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.offset)
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError::new(self.offset(), message))
    }

    fn peek(&self) -> Option<&'t Tok<'t>> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn peek_at(&self, n: usize) -> Option<&'t Tok<'t>> {
        self.toks.get(self.pos + n).map(|t| &t.tok)
    }

    fn peek_word(&self) -> Option<&'t str> {
        match self.peek() {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        }
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Tok::Punct(q)) if *q == p)
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        if self.is_punct(p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, p: &str) -> Result<(), ParseError> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            self.err(format!("expected `{p}`, found {}", self.describe()))
        }
    }

    fn eat_word(&mut self, w: &str) -> bool {
        if self.peek_word() == Some(w) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_word(&mut self) -> Result<&'t str, ParseError> {
        match self.peek() {
            Some(Tok::Word(w)) => {
                self.pos += 1;
                Ok(w)
            }
            _ => self.err(format!("expected an identifier, found {}", self.describe())),
        }
    }

    fn describe(&self) -> String {
        match self.peek() {
            None => "end of metadata".into(),
            Some(Tok::Word(w)) => format!("`{w}`"),
            Some(Tok::Int(i)) => format!("`{i}`"),
            Some(Tok::Str(s)) => format!("{s:?}"),
            Some(Tok::Punct(p)) => format!("`{p}`"),
        }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err(format!("types nested deeper than {MAX_DEPTH} levels"));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn lookup(&self, name: &str) -> Option<Rc<TypeIr>> {
        self.scopes.iter().rev().find_map(|s| s.get(name).cloned())
    }

    fn define(&mut self, name: String, ty: Rc<TypeIr>) -> Result<(), ParseError> {
        let depth = self.type_depth(&ty);
        if depth > MAX_TYPE_DEPTH {
            return self.err(format!(
                "type `{name}` is nested {depth} levels deep (at most {MAX_TYPE_DEPTH})"
            ));
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name, ty);
        }
        Ok(())
    }

    fn type_depth(&mut self, ty: &Rc<TypeIr>) -> u32 {
        if let Some((_, d)) = self.depths.get(&Rc::as_ptr(ty)) {
            return *d;
        }
        let children: Vec<Rc<TypeIr>> = match &**ty {
            TypeIr::Struct { fields, .. } => fields.iter().map(|f| f.1.clone()).collect(),
            TypeIr::Variant { options, .. } => options.iter().map(|f| f.1.clone()).collect(),
            TypeIr::Array { elem, .. } | TypeIr::Sequence { elem, .. } => vec![elem.clone()],
            _ => Vec::new(),
        };
        let d = 1 + children
            .iter()
            .map(|c| self.type_depth(c))
            .max()
            .unwrap_or(0);
        self.depths.insert(Rc::as_ptr(ty), (ty.clone(), d));
        d
    }

    fn top_item(&mut self, out: &mut MetadataIr) -> Result<(), ParseError> {
        let at = self.offset();
        let block = match (self.peek_word(), self.peek_at(1)) {
            (
                Some(w @ ("trace" | "env" | "clock" | "stream" | "event" | "callsite")),
                Some(Tok::Punct("{")),
            ) => Some(w),
            _ => None,
        };
        let Some(kind) = block else {
            self.declaration_or_alias()?;
            return self.expect_punct(";");
        };
        self.pos += 2;
        self.scopes.push(HashMap::new());
        let attrs = self.block_body();
        self.scopes.pop();
        let attrs = attrs?;
        self.expect_punct(";")?;
        match kind {
            "trace" => {
                if out.trace.is_some() {
                    return Err(ParseError::new(at, "second `trace` block"));
                }
                out.trace = Some(trace_block(attrs, at)?);
            }
            "env" => {
                for a in attrs {
                    let v = match a.value {
                        Value::Int(i) => EnvIr::Int(i),
                        Value::Str(s) => EnvIr::Str(s),
                        Value::Word(w) => EnvIr::Str(w.to_string()),
                        Value::Path(p) => EnvIr::Str(p.join(".")),
                        Value::Type(_) => {
                            return Err(ParseError::new(a.offset, "type in `env` block"))
                        }
                    };
                    out.env.retain(|(k, _)| *k != a.key);
                    out.env.push((a.key.into_owned(), v));
                }
            }
            "clock" => out.clocks.push(clock_block(attrs, at)?),
            "stream" => out.streams.push(stream_block(attrs, at)?),
            "event" => out.events.push(event_block(attrs, at)?),
            _ => {} // callsite: debugging aid only
        }
        Ok(())
    }

    /// Items of a `trace`/`stream`/... block up to and including `}`.
    fn block_body(&mut self) -> Result<Vec<Attr<'t>>, ParseError> {
        let mut attrs = Vec::new();
        loop {
            if self.eat_punct("}") {
                return Ok(attrs);
            }
            if self.peek().is_none() {
                return self.err("unterminated block");
            }
            match self.peek_word() {
                Some(w) if STRUCTURAL.contains(&w) => {
                    self.declaration_or_alias()?;
                    self.expect_punct(";")?;
                    continue;
                }
                _ => {}
            }
            let offset = self.offset();
            let key = self.key()?;
            let value = if self.eat_punct(":=") {
                self.enter()?;
                let ty = self.type_spec();
                self.leave();
                Value::Type(ty?)
            } else {
                self.expect_punct("=")?;
                self.value()?
            };
            self.expect_punct(";")?;
            attrs.push(Attr { key, value, offset });
        }
    }

    /// The key of `key = value`: a word, or a path joined with dots.
    fn key(&mut self) -> Result<Cow<'t, str>, ParseError> {
        let first = self.expect_word()?;
        if !(self.is_punct(".") || self.is_punct("->")) {
            return Ok(Cow::Borrowed(first));
        }
        let mut key = first.to_string();
        while self.is_punct(".") || self.is_punct("->") {
            self.pos += 1;
            key.push('.');
            key.push_str(self.expect_word()?);
        }
        Ok(Cow::Owned(key))
    }

    /// `a.b.c` (also accepts `->` as a separator, as C does).
    fn path(&mut self) -> Result<Vec<&'t str>, ParseError> {
        let mut parts = vec![self.expect_word()?];
        while self.is_punct(".") || self.is_punct("->") {
            self.pos += 1;
            parts.push(self.expect_word()?);
        }
        Ok(parts)
    }

    fn value(&mut self) -> Result<Value<'t>, ParseError> {
        let negative = if self.eat_punct("-") {
            true
        } else {
            self.eat_punct("+");
            false
        };
        match self.peek() {
            Some(Tok::Int(i)) => {
                let i = *i as i128;
                self.pos += 1;
                Ok(Value::Int(if negative { -i } else { i }))
            }
            Some(Tok::Str(s)) if !negative => {
                self.pos += 1;
                Ok(Value::Str(s.clone()))
            }
            Some(Tok::Word(w)) if !negative => {
                if matches!(self.peek_at(1), Some(Tok::Punct("." | "->"))) {
                    Ok(Value::Path(self.path()?))
                } else {
                    self.pos += 1;
                    Ok(Value::Word(w))
                }
            }
            _ => self.err(format!("expected a value, found {}", self.describe())),
        }
    }

    fn int_value(&mut self) -> Result<i128, ParseError> {
        match self.value()? {
            Value::Int(i) => Ok(i),
            _ => self.err("expected an integer constant"),
        }
    }

    /// `typealias ...`, `typedef ...`, or a type specifier with optional
    /// declarators (whose names are meaningless outside a struct). The
    /// caller eats the `;`.
    fn declaration_or_alias(&mut self) -> Result<(), ParseError> {
        if self.eat_word("typealias") {
            return self.typealias();
        }
        if self.eat_word("typedef") {
            return self.typedef();
        }
        self.enter()?;
        let base = self.type_spec();
        self.leave();
        let base = base?;
        if !self.is_punct(";") {
            loop {
                self.declarator(base.clone())?;
                if !self.eat_punct(",") {
                    break;
                }
            }
        }
        Ok(())
    }

    fn typealias(&mut self) -> Result<(), ParseError> {
        self.enter()?;
        let ty = self.type_spec();
        self.leave();
        let mut ty = ty?;
        // Abstract declarator: pointers and dimensions without a name.
        while self.eat_punct("*") {}
        ty = self.dims(ty)?;
        self.expect_punct(":=")?;
        let at = self.offset();
        let mut words = Vec::new();
        loop {
            match self.peek() {
                Some(Tok::Word(w)) if *w != "const" || !words.is_empty() => {
                    words.push(*w);
                    self.pos += 1;
                }
                Some(Tok::Word(_)) => self.pos += 1,
                Some(Tok::Punct("*")) => {
                    words.push("*");
                    self.pos += 1;
                }
                _ => break,
            }
        }
        if words.is_empty() {
            return Err(ParseError::new(at, "typealias without a name"));
        }
        ty = self.dims(ty)?;
        self.define(words.join(" "), ty)
    }

    fn typedef(&mut self) -> Result<(), ParseError> {
        self.enter()?;
        let base = self.type_spec();
        self.leave();
        let base = base?;
        loop {
            let (name, ty) = self.declarator(base.clone())?;
            self.define(name, ty)?;
            if !self.eat_punct(",") {
                return Ok(());
            }
        }
    }

    /// `*name[dims]` or `name : bits`.
    fn declarator(&mut self, base: Rc<TypeIr>) -> Result<(String, Rc<TypeIr>), ParseError> {
        while self.eat_punct("*") || self.eat_word("const") {}
        let name = self.expect_word()?;
        if self.eat_punct(":") {
            // GNU/C bitfield: an integer of that many bits, bit-packed.
            let at = self.offset();
            let bits = self.int_value()?;
            let TypeIr::Int(int) = &*base else {
                return Err(ParseError::new(at, "bitfield of a non-integer type"));
            };
            if !(1..=64).contains(&bits) {
                return Err(ParseError::new(
                    at,
                    format!("bitfield size {bits} is not in 1..=64"),
                ));
            }
            let int = IntIr {
                size: bits as u32,
                align: 1,
                ..int.clone()
            };
            return Ok((name.to_string(), Rc::new(TypeIr::Int(int))));
        }
        let ty = self.dims(base)?;
        Ok((name.to_string(), ty))
    }

    /// Trailing `[n]` / `[length.path]` dimensions; `a[2][3]` is an array of
    /// 2 arrays of 3, as in C.
    fn dims(&mut self, base: Rc<TypeIr>) -> Result<Rc<TypeIr>, ParseError> {
        let mut dims = Vec::new();
        while self.is_punct("[") {
            let at = self.offset();
            self.pos += 1;
            let dim = match self.peek() {
                Some(Tok::Int(n)) => {
                    let n = *n;
                    self.pos += 1;
                    Dim::Len(n)
                }
                Some(Tok::Word(_)) => Dim::Path(self.path()?),
                _ => {
                    return self.err(format!(
                        "expected an array length, found {}",
                        self.describe()
                    ))
                }
            };
            self.expect_punct("]")?;
            dims.push((dim, at));
            if dims.len() > MAX_DIMS {
                return Err(ParseError::new(at, "too many array dimensions"));
            }
        }
        let mut ty = base;
        for (dim, at) in dims.into_iter().rev() {
            ty = Rc::new(match dim {
                Dim::Len(len) => TypeIr::Array { elem: ty, len },
                Dim::Path(len) => TypeIr::Sequence {
                    elem: ty,
                    len: owned(len),
                    offset: at,
                },
            });
        }
        Ok(ty)
    }

    fn type_spec(&mut self) -> Result<Rc<TypeIr>, ParseError> {
        while self.eat_word("const") {}
        let at = self.offset();
        let Some(word) = self.peek_word() else {
            return self.err(format!("expected a type, found {}", self.describe()));
        };
        match word {
            "integer" => {
                self.pos += 1;
                let attrs = self.attr_block()?;
                Ok(Rc::new(TypeIr::Int(int_attrs(attrs, at)?)))
            }
            "floating_point" => {
                self.pos += 1;
                let attrs = self.attr_block()?;
                float_attrs(attrs, at)
            }
            "string" => {
                self.pos += 1;
                if self.is_punct("{") {
                    self.attr_block()?; // encoding only; decoded as UTF-8 either way
                }
                Ok(Rc::new(TypeIr::String))
            }
            "struct" => {
                self.pos += 1;
                self.struct_spec(at)
            }
            "variant" => {
                self.pos += 1;
                self.variant_spec(at)
            }
            "enum" => {
                self.pos += 1;
                self.enum_spec(at)
            }
            _ => self.named_type(at),
        }
    }

    /// A run of words naming a type (`unsigned long`, `uint32_t`); the
    /// longest known prefix wins, the rest is left for the declarator.
    fn named_type(&mut self, at: usize) -> Result<Rc<TypeIr>, ParseError> {
        let mut words = Vec::new();
        let mut i = self.pos;
        while let Some(Token {
            tok: Tok::Word(w), ..
        }) = self.toks.get(i)
        {
            if STRUCTURAL.contains(w) {
                break;
            }
            words.push(*w);
            i += 1;
        }
        for take in (1..=words.len()).rev() {
            if let Some(ty) = self.lookup(&words[..take].join(" ")) {
                self.pos += take;
                return Ok(ty);
            }
        }
        if words.is_empty() {
            return self.err(format!("expected a type, found {}", self.describe()));
        }
        Err(ParseError::new(at, format!("unknown type `{}`", words[0])))
    }

    fn attr_block(&mut self) -> Result<Vec<Attr<'t>>, ParseError> {
        self.expect_punct("{")?;
        // LTTng's integers have five attributes.
        let mut attrs = Vec::with_capacity(8);
        while !self.eat_punct("}") {
            if self.peek().is_none() {
                return self.err("unterminated attribute block");
            }
            let offset = self.offset();
            let key = self.key()?;
            self.expect_punct("=")?;
            let value = self.value()?;
            self.expect_punct(";")?;
            attrs.push(Attr { key, value, offset });
        }
        Ok(attrs)
    }

    fn align_attr(&mut self) -> Result<Option<u32>, ParseError> {
        if !self.eat_word("align") {
            return Ok(None);
        }
        self.expect_punct("(")?;
        let at = self.offset();
        let v = self.int_value()?;
        self.expect_punct(")")?;
        Ok(Some(check_align(v, at)?))
    }

    fn struct_spec(&mut self, at: usize) -> Result<Rc<TypeIr>, ParseError> {
        let name = match self.peek_word() {
            Some(w) if w != "align" => {
                self.pos += 1;
                Some(w.to_string())
            }
            _ => None,
        };
        if !self.is_punct("{") {
            let Some(name) = name else {
                return self.err("expected a struct name or `{`");
            };
            let Some(ty) = self.lookup(&format!("struct {name}")) else {
                return Err(ParseError::new(at, format!("unknown struct `{name}`")));
            };
            return Ok(match self.align_attr()? {
                Some(a) => match &*ty {
                    TypeIr::Struct { fields, min_align } => Rc::new(TypeIr::Struct {
                        fields: fields.clone(),
                        min_align: a.max(*min_align),
                    }),
                    _ => ty,
                },
                None => ty,
            });
        }
        let fields = self.compound_body()?;
        let min_align = self.align_attr()?.unwrap_or(1);
        let ty = Rc::new(TypeIr::Struct { fields, min_align });
        if let Some(name) = name {
            self.define(format!("struct {name}"), ty.clone())?;
        }
        Ok(ty)
    }

    fn variant_spec(&mut self, at: usize) -> Result<Rc<TypeIr>, ParseError> {
        let name = match self.peek_word() {
            Some(w) => {
                self.pos += 1;
                Some(w.to_string())
            }
            None => None,
        };
        let tag = if self.eat_punct("<") {
            let p = self.path()?;
            self.expect_punct(">")?;
            Some(owned(p))
        } else {
            None
        };
        if !self.is_punct("{") {
            let Some(name) = name else {
                return self.err("expected a variant name or `{`");
            };
            let Some(ty) = self.lookup(&format!("variant {name}")) else {
                return Err(ParseError::new(at, format!("unknown variant `{name}`")));
            };
            return Ok(match (&*ty, tag) {
                (TypeIr::Variant { options, .. }, Some(tag)) => Rc::new(TypeIr::Variant {
                    tag: Some(tag),
                    options: options.clone(),
                    offset: at,
                }),
                _ => ty,
            });
        }
        let options = self.compound_body()?;
        let ty = Rc::new(TypeIr::Variant {
            tag,
            options,
            offset: at,
        });
        if let Some(name) = name {
            self.define(format!("variant {name}"), ty.clone())?;
        }
        Ok(ty)
    }

    fn enum_spec(&mut self, at: usize) -> Result<Rc<TypeIr>, ParseError> {
        let name = match self.peek_word() {
            Some(w) => {
                self.pos += 1;
                Some(w.to_string())
            }
            None => None,
        };
        let container = if self.eat_punct(":") {
            self.enter()?;
            let c = self.type_spec();
            self.leave();
            Some(c?)
        } else {
            None
        };
        if !self.is_punct("{") {
            let Some(name) = name else {
                return self.err("expected an enum name or `{`");
            };
            return self
                .lookup(&format!("enum {name}"))
                .ok_or_else(|| ParseError::new(at, format!("unknown enum `{name}`")));
        }
        let container = match container.or_else(|| self.lookup("int")) {
            Some(c) => c,
            None => {
                return Err(ParseError::new(
                    at,
                    "enum without container type and no `int` declared",
                ))
            }
        };
        let container = match &*container {
            TypeIr::Int(i) => i.clone(),
            TypeIr::Enum { container, .. } => container.clone(),
            _ => return Err(ParseError::new(at, "enum container is not an integer type")),
        };
        self.expect_punct("{")?;
        let mut mappings = Vec::new();
        let mut next: i128 = 0;
        while !self.eat_punct("}") {
            let label = match self.peek() {
                Some(Tok::Word(w)) => w.to_string(),
                Some(Tok::Str(s)) => s.clone(),
                _ => return self.err(format!("expected an enumerator, found {}", self.describe())),
            };
            self.pos += 1;
            let (lo, hi) = if self.eat_punct("=") {
                let lo = self.int_value()?;
                let hi = if self.eat_punct("...") {
                    self.int_value()?
                } else {
                    lo
                };
                (lo, hi)
            } else {
                (next, next)
            };
            if hi < lo {
                return self.err(format!(
                    "enumerator `{label}` has an empty range {lo} ... {hi}"
                ));
            }
            next = hi + 1;
            mappings.push(EnumMapping { label, lo, hi });
            if !self.eat_punct(",") {
                self.expect_punct("}")?;
                break;
            }
        }
        let ty = Rc::new(TypeIr::Enum {
            container,
            mappings,
        });
        if let Some(name) = name {
            self.define(format!("enum {name}"), ty.clone())?;
        }
        Ok(ty)
    }

    /// `{ declarations }` of a struct or variant, in its own lexical scope.
    fn compound_body(&mut self) -> Result<Vec<(String, Rc<TypeIr>)>, ParseError> {
        self.expect_punct("{")?;
        self.enter()?;
        self.scopes.push(HashMap::new());
        let r = self.compound_items();
        self.scopes.pop();
        self.leave();
        r
    }

    fn compound_items(&mut self) -> Result<Vec<(String, Rc<TypeIr>)>, ParseError> {
        let mut fields = Vec::with_capacity(8);
        loop {
            if self.eat_punct("}") {
                return Ok(fields);
            }
            if self.peek().is_none() {
                return self.err("unterminated struct or variant");
            }
            if self.eat_word("typealias") {
                self.typealias()?;
            } else if self.eat_word("typedef") {
                self.typedef()?;
            } else {
                let base = self.type_spec()?;
                if !self.is_punct(";") {
                    loop {
                        let at = self.offset();
                        let (name, ty) = self.declarator(base.clone())?;
                        if fields.iter().any(|(n, _)| *n == name) {
                            return Err(ParseError::new(at, format!("duplicate field `{name}`")));
                        }
                        fields.push((name, ty));
                        if !self.eat_punct(",") {
                            break;
                        }
                    }
                }
            }
            self.expect_punct(";")?;
        }
    }
}

fn check_align(v: i128, at: usize) -> Result<u32, ParseError> {
    if v <= 0 || v > 1 << 20 || (v & (v - 1)) != 0 {
        return Err(ParseError::new(
            at,
            format!("alignment {v} is not a power of two (in bits)"),
        ));
    }
    Ok(v as u32)
}

fn word<'v>(value: &'v Value<'_>) -> Option<&'v str> {
    match value {
        Value::Word(w) => Some(w),
        Value::Str(s) => Some(s.as_str()),
        _ => None,
    }
}

fn boolean(a: &Attr<'_>) -> Result<bool, ParseError> {
    match &a.value {
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        v => match word(v) {
            Some("true" | "TRUE") => Ok(true),
            Some("false" | "FALSE") => Ok(false),
            _ => Err(ParseError::new(
                a.offset,
                format!("`{}` is not a boolean", a.key),
            )),
        },
    }
}

fn order(a: &Attr<'_>, allow_native: bool) -> Result<OrderSpec, ParseError> {
    match word(&a.value) {
        Some("le") => Ok(OrderSpec::Le),
        Some("be" | "network") => Ok(OrderSpec::Be),
        Some("native") if allow_native => Ok(OrderSpec::Native),
        _ => Err(ParseError::new(
            a.offset,
            "byte_order must be le, be, network or native",
        )),
    }
}

fn int_of(a: &Attr<'_>) -> Result<i128, ParseError> {
    match a.value {
        Value::Int(i) => Ok(i),
        _ => Err(ParseError::new(
            a.offset,
            format!("`{}` must be an integer", a.key),
        )),
    }
}

fn int_attrs(attrs: Vec<Attr<'_>>, at: usize) -> Result<IntIr, ParseError> {
    let mut size = None;
    let mut align = None;
    let mut int = IntIr {
        size: 0,
        align: 0,
        signed: false,
        order: OrderSpec::Native,
        base: 10,
        text: false,
        clock: None,
    };
    for a in &attrs {
        match &*a.key {
            "size" => {
                let s = int_of(a)?;
                if !(1..=64).contains(&s) {
                    return Err(ParseError::new(
                        a.offset,
                        format!("integer size {s} is not in 1..=64"),
                    ));
                }
                size = Some(s as u32);
            }
            "align" => align = Some(check_align(int_of(a)?, a.offset)?),
            "signed" => int.signed = boolean(a)?,
            "byte_order" => int.order = order(a, true)?,
            "base" => {
                int.base = match (&a.value, word(&a.value)) {
                    (Value::Int(b @ (2 | 8 | 10 | 16)), _) => *b as u32,
                    (_, Some("decimal" | "dec" | "d" | "i" | "u")) => 10,
                    (_, Some("hexadecimal" | "hex" | "x" | "X" | "p")) => 16,
                    (_, Some("octal" | "oct" | "o")) => 8,
                    (_, Some("binary" | "b")) => 2,
                    _ => return Err(ParseError::new(a.offset, "unknown integer base")),
                }
            }
            "encoding" => {
                int.text = match word(&a.value) {
                    Some("none") => false,
                    Some("UTF8" | "utf8" | "ASCII" | "ascii") => true,
                    _ => {
                        return Err(ParseError::new(
                            a.offset,
                            "encoding must be none, UTF8 or ASCII",
                        ))
                    }
                }
            }
            "map" => match &a.value {
                Value::Path(p) if p.len() == 3 && p[0] == "clock" && p[2] == "value" => {
                    int.clock = Some(p[1].to_string())
                }
                _ => return Err(ParseError::new(a.offset, "map must be clock.NAME.value")),
            },
            _ => {}
        }
    }
    int.size = size.ok_or_else(|| ParseError::new(at, "integer without size"))?;
    int.align = align.unwrap_or(if int.size % 8 == 0 { 8 } else { 1 });
    Ok(int)
}

fn float_attrs(attrs: Vec<Attr<'_>>, at: usize) -> Result<Rc<TypeIr>, ParseError> {
    let mut exp_dig = None;
    let mut mant_dig = None;
    let mut align = 8;
    let mut ord = OrderSpec::Native;
    for a in &attrs {
        match &*a.key {
            "exp_dig" => exp_dig = Some(int_of(a)?),
            "mant_dig" => mant_dig = Some(int_of(a)?),
            "align" => align = check_align(int_of(a)?, a.offset)?,
            "byte_order" => ord = order(a, true)?,
            _ => {}
        }
    }
    match (exp_dig, mant_dig) {
        (Some(e @ 8), Some(m @ 24)) | (Some(e @ 11), Some(m @ 53)) => {
            Ok(Rc::new(TypeIr::Float { exp_dig: e as u32, mant_dig: m as u32, align, order: ord }))
        }
        (Some(e), Some(m)) => Err(ParseError::new(
            at,
            format!("floating point with exp_dig={e}, mant_dig={m}: only 32-bit and 64-bit IEEE 754 are supported"),
        )),
        _ => Err(ParseError::new(at, "floating_point without exp_dig and mant_dig")),
    }
}

fn string_of(a: &Attr<'_>) -> Result<String, ParseError> {
    match &a.value {
        Value::Str(s) => Ok(s.clone()),
        Value::Word(w) => Ok(w.to_string()),
        Value::Path(p) => Ok(p.join(".")),
        _ => Err(ParseError::new(
            a.offset,
            format!("`{}` must be a string", a.key),
        )),
    }
}

fn type_of(a: Attr<'_>) -> Result<Rc<TypeIr>, ParseError> {
    match a.value {
        Value::Type(t) => Ok(t),
        _ => Err(ParseError::new(
            a.offset,
            format!("`{}` must be assigned a type with `:=`", a.key),
        )),
    }
}

fn trace_block(attrs: Vec<Attr<'_>>, at: usize) -> Result<TraceIr, ParseError> {
    let mut t = TraceIr {
        offset: at,
        ..Default::default()
    };
    for a in attrs {
        match &*a.key {
            "byte_order" => t.byte_order = Some(order(&a, false)?),
            "uuid" => t.uuid = Some(string_of(&a)?),
            "major" => t.major = Some(int_of(&a)?),
            "minor" => t.minor = Some(int_of(&a)?),
            "packet.header" => t.packet_header = Some(type_of(a)?),
            _ => {}
        }
    }
    Ok(t)
}

fn clock_block(attrs: Vec<Attr<'_>>, at: usize) -> Result<ClockIr, ParseError> {
    let mut c = ClockIr {
        at,
        ..Default::default()
    };
    let mut named = false;
    for a in attrs {
        match &*a.key {
            "name" => {
                c.name = string_of(&a)?;
                named = true;
            }
            "uuid" => c.uuid = Some(string_of(&a)?),
            "description" => c.description = Some(string_of(&a)?),
            "freq" => c.freq = Some(int_of(&a)?),
            "offset_s" => c.offset_s = int_of(&a)?,
            "offset" => c.offset = int_of(&a)?,
            "precision" => c.precision = int_of(&a)?,
            "absolute" => c.absolute = boolean(&a)?,
            _ => {}
        }
    }
    if !named {
        return Err(ParseError::new(at, "clock without a name"));
    }
    Ok(c)
}

fn stream_block(attrs: Vec<Attr<'_>>, at: usize) -> Result<StreamIr, ParseError> {
    let mut s = StreamIr {
        offset: at,
        ..Default::default()
    };
    for a in attrs {
        match &*a.key {
            "id" => s.id = Some(int_of(&a)?),
            "event.header" => s.event_header = Some(type_of(a)?),
            "event.context" => s.event_context = Some(type_of(a)?),
            "packet.context" => s.packet_context = Some(type_of(a)?),
            _ => {}
        }
    }
    Ok(s)
}

fn event_block(attrs: Vec<Attr<'_>>, at: usize) -> Result<EventIr, ParseError> {
    let mut e = EventIr {
        offset: at,
        ..Default::default()
    };
    for a in attrs {
        match &*a.key {
            "name" => e.name = Some(string_of(&a)?),
            "id" => e.id = Some(int_of(&a)?),
            "stream_id" => e.stream_id = Some(int_of(&a)?),
            "loglevel" => e.loglevel = Some(int_of(&a)?),
            "context" => e.context = Some(type_of(a)?),
            "fields" => e.fields = Some(type_of(a)?),
            _ => {}
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"/* CTF 1.8 */
typealias integer { size = 8; align = 8; signed = false; } := uint8_t;
typealias integer { size = 32; align = 32; signed = false; } := uint32_t;
typealias integer { size = 32; signed = false; } := unsigned long;
typealias integer { size = 5; align = 1; signed = false; } := uint5_t;
typealias integer { size = 27; align = 1; signed = false; map = clock.monotonic.value; } := uint27_clock_monotonic_t;
trace { major = 1; minor = 8; byte_order = be; uuid = "cf1c757c-93a6-6343-be56-fe367222623c";
  packet.header := struct { uint32_t magic; uint8_t uuid[16]; uint32_t stream_id; };
};
env { hostname = "qemu0"; tracer_major = 2; };
clock { name = monotonic; freq = 1000000000; offset = 1417383477000003520; };
struct event_header_compact {
	enum : uint5_t { compact = 0 ... 30, extended = 31 } id;
	variant <id> {
		struct { uint27_clock_monotonic_t timestamp; } compact;
		struct { uint32_t id; uint32_t timestamp; } extended;
	} v;
} align(32);
stream { id = 0; event.header := struct event_header_compact; };
event {
	name = "sched_switch"; id = 0; stream_id = 0;
	fields := struct {
		integer { size = 8; align = 8; signed = 1; encoding = UTF8; base = 10; } _prev_comm[16];
		unsigned long _len;
		uint8_t _seq[_len], _two[2][3];
		string _name;
	};
};
"#;

    #[test]
    fn parses_an_lttng_like_metadata() {
        let m = parse(SAMPLE.as_bytes()).unwrap();
        let t = m.trace.unwrap();
        assert_eq!(t.byte_order, Some(OrderSpec::Be));
        assert!(t.packet_header.is_some());
        assert_eq!(
            m.env,
            vec![
                ("hostname".into(), EnvIr::Str("qemu0".into())),
                ("tracer_major".into(), EnvIr::Int(2))
            ]
        );
        assert_eq!(m.clocks[0].name, "monotonic");
        assert_eq!(m.clocks[0].offset, 1417383477000003520);
        let hdr = m.streams[0].event_header.as_ref().unwrap();
        let TypeIr::Struct { fields, min_align } = &**hdr else {
            panic!()
        };
        assert_eq!(*min_align, 32);
        assert!(
            matches!(&*fields[0].1, TypeIr::Enum { mappings, .. } if mappings.len() == 2 && mappings[1].lo == 31)
        );
        assert!(
            matches!(&*fields[1].1, TypeIr::Variant { tag: Some(t), options, .. } if t == &["id"] && options.len() == 2)
        );
        let ev = &m.events[0];
        assert_eq!(ev.name.as_deref(), Some("sched_switch"));
        let TypeIr::Struct { fields, .. } = &**ev.fields.as_ref().unwrap() else {
            panic!()
        };
        let names: Vec<&str> = fields.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["_prev_comm", "_len", "_seq", "_two", "_name"]);
        assert!(
            matches!(&*fields[0].1, TypeIr::Array { len: 16, elem } if matches!(&**elem, TypeIr::Int(i) if i.text))
        );
        assert!(matches!(&*fields[1].1, TypeIr::Int(i) if i.align == 8 && i.size == 32));
        assert!(matches!(&*fields[2].1, TypeIr::Sequence { len, .. } if len == &["_len"]));
        assert!(
            matches!(&*fields[3].1, TypeIr::Array { len: 2, elem } if matches!(&**elem, TypeIr::Array { len: 3, .. }))
        );
    }

    #[test]
    fn errors_carry_offsets() {
        let text = "typealias integer { size = 8; } := u8;\nstruct { u9 x; } y;";
        let e = parse(text.as_bytes()).unwrap_err();
        assert_eq!(e.offset, text.find("u9").unwrap());
        assert!(e.message.contains("unknown type"), "{e:?}");
        let e = parse(b"trace { byte_order = middle; };").unwrap_err();
        assert!(e.message.contains("byte_order"));
        assert!(parse(b"typealias integer { size = 0; } := x;").is_err());
        assert!(parse(b"typealias integer { size = 8; align = 3; } := x;").is_err());
        assert!(parse(b"event { name = \"x\"; ").is_err());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let mut s = String::from("typealias integer { size = 8; } := u8; event { fields := ");
        for _ in 0..10_000 {
            s.push_str("struct { ");
        }
        let e = parse(s.as_bytes()).unwrap_err();
        assert!(e.message.contains("nested"), "{e:?}");
    }
}
