//! TSDL (CTF 1.8 metadata language): a hand-written lexer and recursive
//! descent parser producing a type IR in which every type name, typedef and
//! typealias is already resolved (lexical scoping is a parse-time concern).
//!
//! What stays symbolic in the IR, because it can only be resolved once the
//! whole text is known: `native` byte order (the `trace` block may come after
//! the types using it), clock names of `map = clock.X.value`, and the paths of
//! variant tags and sequence lengths (dynamic scopes).

mod lexer;
mod parser;

use std::rc::Rc;

pub(crate) use parser::parse;

/// A syntax or semantic error at a byte offset of the metadata text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParseError {
    pub offset: usize,
    pub message: String,
}

impl ParseError {
    pub fn new(offset: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            offset,
            message: message.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OrderSpec {
    Native,
    Le,
    Be,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct IntIr {
    pub size: u32,
    /// In bits; defaults to 8 for byte-multiple sizes, else 1 (CTF 4.1.2).
    pub align: u32,
    pub signed: bool,
    pub order: OrderSpec,
    pub base: u32,
    /// `encoding` is UTF8 or ASCII: arrays/sequences of it are text.
    pub text: bool,
    /// Clock name from `map = clock.NAME.value`.
    pub clock: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EnumMapping {
    pub label: String,
    pub lo: i128,
    pub hi: i128,
}

/// A resolved type; shared between the places that name it.
#[derive(Debug, PartialEq)]
pub(crate) enum TypeIr {
    Int(IntIr),
    Float {
        exp_dig: u32,
        mant_dig: u32,
        align: u32,
        order: OrderSpec,
    },
    String,
    Enum {
        container: IntIr,
        mappings: Vec<EnumMapping>,
    },
    Struct {
        fields: Vec<(String, Rc<TypeIr>)>,
        min_align: u32,
    },
    Variant {
        tag: Option<Vec<String>>,
        options: Vec<(String, Rc<TypeIr>)>,
        offset: usize,
    },
    Array {
        elem: Rc<TypeIr>,
        len: u64,
    },
    Sequence {
        elem: Rc<TypeIr>,
        len: Vec<String>,
        offset: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum EnvIr {
    Int(i128),
    Str(String),
}

#[derive(Debug, Default)]
pub(crate) struct TraceIr {
    pub byte_order: Option<OrderSpec>,
    pub uuid: Option<String>,
    pub major: Option<i128>,
    pub minor: Option<i128>,
    pub packet_header: Option<Rc<TypeIr>>,
    pub offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct ClockIr {
    pub name: String,
    pub uuid: Option<String>,
    pub description: Option<String>,
    pub freq: Option<i128>,
    pub offset_s: i128,
    pub offset: i128,
    pub precision: i128,
    pub absolute: bool,
    pub at: usize,
}

#[derive(Debug, Default)]
pub(crate) struct StreamIr {
    pub id: Option<i128>,
    pub event_header: Option<Rc<TypeIr>>,
    pub event_context: Option<Rc<TypeIr>>,
    pub packet_context: Option<Rc<TypeIr>>,
    pub offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct EventIr {
    pub name: Option<String>,
    pub id: Option<i128>,
    pub stream_id: Option<i128>,
    pub loglevel: Option<i128>,
    pub context: Option<Rc<TypeIr>>,
    pub fields: Option<Rc<TypeIr>>,
    pub offset: usize,
}

/// Everything a metadata text declares, in declaration order.
#[derive(Debug, Default)]
pub(crate) struct MetadataIr {
    pub trace: Option<TraceIr>,
    pub env: Vec<(String, EnvIr)>,
    pub clocks: Vec<ClockIr>,
    pub streams: Vec<StreamIr>,
    pub events: Vec<EventIr>,
}
