//! Event format files (`events/<system>/<name>/format`): the layout of each
//! event's record, as the kernel describes it.

use std::sync::Arc;

use deepspan_model::Name;

use crate::error::Error;

/// The layout of one event type, parsed from its format file.
#[derive(Clone, Debug)]
pub struct EventFormat {
    /// The id carried in each record's `common_type` field.
    pub id: u16,
    /// The subsystem (`sched`, `irq`, ...; `ftrace` for ftrace's own events).
    pub system: String,
    pub name: String,
    /// All fields in declaration order, including the `common_*` ones.
    pub fields: Vec<FieldFormat>,
    /// The `print fmt:` line, kept verbatim (not evaluated by this crate).
    pub print_fmt: String,
    pub(crate) shared: Name,
}

impl EventFormat {
    /// The field called `name`, if any.
    pub fn field(&self, name: &str) -> Option<&FieldFormat> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The event's own fields: all but the `common_*` header fields.
    pub fn payload_fields(&self) -> impl Iterator<Item = &FieldFormat> {
        self.fields.iter().filter(|f| !f.is_common())
    }

    /// The event name shared with every [`EventKind::Other`] of this event,
    /// so that decoding does not allocate a name per record.
    ///
    /// [`EventKind::Other`]: deepspan_model::EventKind::Other
    pub fn shared_name(&self) -> &Name {
        &self.shared
    }
}

/// Where the elements of a variable-length field live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dynamic {
    /// `__data_loc`: a u32 in the record; low 16 bits are the offset of the
    /// data from the start of the record, high 16 bits its length.
    DataLoc,
    /// `__rel_loc`: like `__data_loc`, but the offset counts from the end of
    /// the u32 field itself.
    RelLoc,
}

/// The array shape of a field declared with brackets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayLen {
    /// `type name[n]`: n elements in place.
    Fixed(usize),
    /// `type name[]` (size 0): the elements run to the end of the record.
    Flexible,
}

/// One field of an event record.
#[derive(Clone, Debug)]
pub struct FieldFormat {
    pub name: String,
    /// The element type as declared, without the field name, brackets and
    /// `__data_loc`/`__rel_loc`: `char`, `unsigned long`, `void *`, `pid_t`.
    pub type_name: String,
    /// Byte offset from the start of the record.
    pub offset: usize,
    /// Bytes taken in place (4 for `__data_loc`, the whole array for arrays).
    pub size: usize,
    pub signed: bool,
    /// Set for `name[n]` and `name[]` declarations.
    pub array: Option<ArrayLen>,
    /// Set for `__data_loc` and `__rel_loc` fields.
    pub dynamic: Option<Dynamic>,
    /// Bytes per element (for scalars: `size`); 0 when the type's size is
    /// not known (an unknown type in a flexible or dynamic array).
    pub elem_size: usize,
    pub(crate) name_arc: Arc<str>,
}

impl FieldFormat {
    /// `common_type`, `common_pid`, ...: the header every record starts with.
    pub fn is_common(&self) -> bool {
        self.name.starts_with("common_")
    }

    /// Character arrays (fixed, flexible or dynamic) hold text.
    pub fn is_string(&self) -> bool {
        (self.array.is_some() || self.dynamic.is_some())
            && matches!(
                self.type_name.as_str(),
                "char" | "const char" | "signed char"
            )
    }

    /// The field name as shared text (used as the key of decoded fields).
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name_arc
    }
}

/// Parses one event format file. The system is left empty (the format file
/// does not name it) and `long` is taken to be 8 bytes where a type's size
/// matters (flexible and dynamic arrays of `long`).
///
/// Use this to validate format files; [`crate::TraceDat`] parses the ones
/// stored in a trace with the file's system names and long size.
pub fn parse_format(text: &str) -> Result<EventFormat, Error> {
    parse_event_format(text, "", 8)
}

pub(crate) fn parse_event_format(
    text: &str,
    system: &str,
    long_size: usize,
) -> Result<EventFormat, Error> {
    let mut name: Option<String> = None;
    let mut id: Option<u16> = None;
    let mut fields = Vec::new();
    let mut print_fmt = String::new();
    let err = |name: &Option<String>, line: usize, what: String| Error::Format {
        event: match name {
            Some(n) if system.is_empty() => n.clone(),
            Some(n) => format!("{system}:{n}"),
            None => String::new(),
        },
        line,
        what,
    };

    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix("name:") {
            name = Some(rest.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("ID:") {
            let v: u32 = rest.trim().parse().map_err(|_| {
                err(
                    &name,
                    line_no,
                    format!("ID {:?} is not a number", rest.trim()),
                )
            })?;
            id = Some(
                u16::try_from(v)
                    .map_err(|_| err(&name, line_no, format!("ID {v} does not fit in 16 bits")))?,
            );
        } else if line.starts_with("field:") || line.starts_with("field ") {
            let field =
                parse_field_line(line, long_size).map_err(|what| err(&name, line_no, what))?;
            fields.push(field);
        } else if line.starts_with("print fmt:") {
            // The print format is the last entry; keep everything after the
            // label, which may in principle span lines.
            let rest = text[line_offset(text, i)..].trim_start();
            print_fmt = rest
                .strip_prefix("print fmt:")
                .unwrap_or(rest)
                .trim()
                .to_string();
            break;
        }
    }
    let name = name.ok_or_else(|| err(&None, 1, "no \"name:\" line".into()))?;
    let id = id.ok_or_else(|| err(&Some(name.clone()), 1, "no \"ID:\" line".into()))?;
    Ok(EventFormat {
        id,
        system: system.to_string(),
        shared: Name::new(&name),
        name,
        fields,
        print_fmt,
    })
}

/// Byte offset of line `index` (0-based) in `text`, as `str::lines` splits it.
fn line_offset(text: &str, index: usize) -> usize {
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if i == index {
            return offset;
        }
        offset += line.len();
    }
    text.len()
}

/// Parses the field lines of a text (an event format or `header_page`),
/// ignoring every other line.
pub(crate) fn parse_field_lines(
    text: &str,
    long_size: usize,
) -> Result<Vec<FieldFormat>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with("field:") || line.starts_with("field ") {
            out.push(parse_field_line(line, long_size).map_err(|e| (i + 1, e))?);
        }
    }
    Ok(out)
}

/// Largest offset or size accepted in a field: records live in ring-buffer
/// sub-buffers, which are far smaller.
const MAX_FIELD_EXTENT: usize = 1 << 24;

/// Parses `field:TYPE NAME;\toffset:N;\tsize:N;\tsigned:N;` (also the old
/// `field special:` form and lines without `signed:`).
fn parse_field_line(line: &str, long_size: usize) -> Result<FieldFormat, String> {
    let body = line
        .split_once(':')
        .map(|(_, b)| b)
        .ok_or("field line without ':'")?;
    let mut parts = body.split(';');
    let decl = parts.next().unwrap_or("").trim();
    let (mut offset, mut size, mut signed) = (None, None, None);
    for part in parts {
        let part = part.trim();
        let Some((key, value)) = part.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let number = || -> Result<usize, String> {
            let v: usize = value
                .parse()
                .map_err(|_| format!("{key}:{value} is not a number"))?;
            if v > MAX_FIELD_EXTENT {
                return Err(format!("{key}:{v} is implausibly large"));
            }
            Ok(v)
        };
        match key.trim() {
            "offset" => offset = Some(number()?),
            "size" => size = Some(number()?),
            "signed" => signed = Some(number()? != 0),
            _ => {}
        }
    }
    let offset = offset.ok_or_else(|| format!("field {decl:?} has no offset"))?;
    let size = size.ok_or_else(|| format!("field {decl:?} has no size"))?;

    let (type_name, name, array, dynamic) = parse_declaration(decl)?;
    let type_size = type_size(&type_name, long_size);
    let (array, elem_size) = match array {
        None if dynamic.is_some() => (None, type_size),
        None => (None, size),
        Some(Some(n)) if n > 0 && size % n == 0 => (Some(ArrayLen::Fixed(n)), size / n),
        Some(Some(0)) | Some(None) if size == 0 => (Some(ArrayLen::Flexible), type_size),
        // A length we cannot read (a macro) or that does not divide the
        // size: trust the size and the element type.
        Some(_) => {
            let elem = if type_size > 0 && size % type_size == 0 {
                type_size
            } else {
                1
            };
            (Some(ArrayLen::Fixed(size / elem)), elem)
        }
    };
    let signed = signed.unwrap_or_else(|| type_is_signed(&type_name));
    Ok(FieldFormat {
        name_arc: Arc::from(name.as_str()),
        name,
        type_name,
        offset,
        size,
        signed,
        array,
        dynamic,
        elem_size,
    })
}

/// Splits a C declaration into (element type, name, array length, dynamic).
/// The array length is `Some(None)` for brackets we cannot read as a number.
#[allow(clippy::type_complexity)]
fn parse_declaration(
    decl: &str,
) -> Result<(String, String, Option<Option<usize>>, Option<Dynamic>), String> {
    let mut s = decl.trim();
    let mut dynamic = None;
    for (prefix, kind) in [
        ("__data_loc", Dynamic::DataLoc),
        ("__rel_loc", Dynamic::RelLoc),
    ] {
        if let Some(rest) = s.strip_prefix(prefix) {
            if rest.starts_with(char::is_whitespace) {
                dynamic = Some(kind);
                s = rest.trim_start();
            }
        }
    }
    let mut array = None;
    if s.ends_with(']') {
        let open = s
            .rfind('[')
            .ok_or_else(|| format!("unbalanced ']' in {decl:?}"))?;
        let inner = s[open + 1..s.len() - 1].trim();
        array = Some(if inner.is_empty() {
            Some(0)
        } else {
            inner.parse::<usize>().ok()
        });
        s = s[..open].trim_end();
    }
    let name_start = s
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_alphanumeric() || *c == '_')
        .last()
        .map(|(i, _)| i)
        .ok_or_else(|| format!("no field name in {decl:?}"))?;
    let name = s[name_start..].to_string();
    let mut type_name = s[..name_start].trim();
    if dynamic.is_some() {
        type_name = type_name.strip_suffix("[]").unwrap_or(type_name).trim_end();
    }
    if type_name.is_empty() {
        return Err(format!("no type in {decl:?}"));
    }
    Ok((type_name.to_string(), name, array, dynamic))
}

/// The size of a C type as it appears in format files; 0 when unknown.
pub(crate) fn type_size(type_name: &str, long_size: usize) -> usize {
    if type_name.contains('*') {
        return long_size;
    }
    let t = bare_type(type_name);
    match t {
        "char" | "unsigned char" | "signed char" | "u8" | "s8" | "__u8" | "__s8" | "bool"
        | "_Bool" => 1,
        "short" | "unsigned short" | "short int" | "u16" | "s16" | "__u16" | "__s16" | "__le16"
        | "__be16" => 2,
        "int" | "unsigned int" | "unsigned" | "u32" | "s32" | "__u32" | "__s32" | "pid_t"
        | "dev_t" | "gfp_t" | "__le32" | "__be32" | "uid_t" | "gid_t" => 4,
        "long" | "unsigned long" | "long int" | "size_t" | "ssize_t" => long_size,
        "long long" | "unsigned long long" | "u64" | "s64" | "__u64" | "__s64" | "sector_t"
        | "loff_t" | "__le64" | "__be64" => 8,
        _ => 0,
    }
}

/// Whether a type is signed, for old format files without `signed:`.
fn type_is_signed(type_name: &str) -> bool {
    if type_name.contains('*') {
        return false;
    }
    matches!(
        bare_type(type_name),
        "char"
            | "signed char"
            | "short"
            | "short int"
            | "int"
            | "long"
            | "long int"
            | "long long"
            | "s8"
            | "s16"
            | "s32"
            | "s64"
            | "__s8"
            | "__s16"
            | "__s32"
            | "__s64"
            | "pid_t"
            | "ssize_t"
            | "loff_t"
    )
}

/// A type without `const`/`volatile` qualifiers.
fn bare_type(type_name: &str) -> &str {
    let mut t = type_name.trim();
    loop {
        if let Some(rest) = t.strip_prefix("const ") {
            t = rest.trim_start();
        } else if let Some(rest) = t.strip_prefix("volatile ") {
            t = rest.trim_start();
        } else {
            return t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHED_SWITCH: &str = "name: sched_switch
ID: 372
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;

print fmt: \"prev_comm=%s prev_pid=%d\", REC->prev_comm, REC->prev_pid
";

    #[test]
    fn parses_sched_switch() {
        let f = parse_format(SCHED_SWITCH).unwrap();
        assert_eq!((f.id, f.name.as_str()), (372, "sched_switch"));
        assert_eq!(f.fields.len(), 11);
        assert_eq!(f.payload_fields().count(), 7);
        let comm = f.field("prev_comm").unwrap();
        assert_eq!(
            (comm.type_name.as_str(), comm.offset, comm.size),
            ("char", 8, 16)
        );
        assert_eq!(comm.array, Some(ArrayLen::Fixed(16)));
        assert!(comm.is_string());
        let state = f.field("prev_state").unwrap();
        assert_eq!(
            (state.type_name.as_str(), state.size, state.signed),
            ("long", 8, true)
        );
        assert_eq!(state.array, None);
        assert_eq!(
            f.print_fmt,
            "\"prev_comm=%s prev_pid=%d\", REC->prev_comm, REC->prev_pid"
        );
    }

    #[test]
    fn parses_data_loc_rel_loc_and_arrays() {
        let text = "name: x\nID: 7\nformat:\n\
            \tfield:__data_loc char[] name;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:__rel_loc unsigned long[] stack;\toffset:12;\tsize:4;\tsigned:0;\n\
            \tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;\n\
            \tfield:u32 buf[];\toffset:64;\tsize:0;\tsigned:0;\n\
            \tfield:const char * fmt;\toffset:64;\tsize:8;\tsigned:0;\n\
            \tfield:char comm[TASK_COMM_LEN];\toffset:72;\tsize:16;\tsigned:0;\n\
            print fmt: \"%s\", __get_str(name)\n";
        let f = parse_format(text).unwrap();
        let name = f.field("name").unwrap();
        assert_eq!(name.dynamic, Some(Dynamic::DataLoc));
        assert_eq!((name.type_name.as_str(), name.elem_size), ("char", 1));
        assert!(name.is_string());
        let stack = f.field("stack").unwrap();
        assert_eq!(stack.dynamic, Some(Dynamic::RelLoc));
        assert_eq!(
            (stack.type_name.as_str(), stack.elem_size),
            ("unsigned long", 8)
        );
        assert!(!stack.is_string());
        let args = f.field("args").unwrap();
        assert_eq!((args.array, args.elem_size), (Some(ArrayLen::Fixed(6)), 8));
        let buf = f.field("buf").unwrap();
        assert_eq!((buf.array, buf.elem_size), (Some(ArrayLen::Flexible), 4));
        let fmt = f.field("fmt").unwrap();
        assert_eq!((fmt.type_name.as_str(), fmt.array), ("const char *", None));
        let comm = f.field("comm").unwrap();
        assert_eq!((comm.array, comm.elem_size), (Some(ArrayLen::Fixed(16)), 1));
    }

    #[test]
    fn old_format_without_signed() {
        let text = "name: old\nID: 3\nformat:\n\
            \tfield special:unsigned short common_type;\toffset:0;\tsize:2;\n\
            \tfield:int common_pid;\toffset:4;\tsize:4;\n\
            \tfield:unsigned long ip;\toffset:8;\tsize:8;\n\nprint fmt: \"\"\n";
        let f = parse_format(text).unwrap();
        assert_eq!(f.fields.len(), 3);
        assert!(f.field("common_pid").unwrap().signed);
        assert!(!f.field("ip").unwrap().signed);
        assert!(!f.field("common_type").unwrap().signed);
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_format("name: bad\nID: 1\nformat:\n\tfield:int x;\toffset:abc;\tsize:4;\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4") && e.contains("bad"), "{e}");
        assert!(parse_format("ID: 1\n").is_err());
        assert!(parse_format("name: x\n").is_err());
        assert!(parse_format("name: x\nID: 70000\n").is_err());
        assert!(parse_format("name: x\nID: 1\nformat:\n\tfield:;\toffset:0;\tsize:4;\n").is_err());
        assert!(
            parse_format("name: x\nID: 1\nformat:\n\tfield:int [;\toffset:0;\tsize:4;\n").is_err()
        );
    }
}
