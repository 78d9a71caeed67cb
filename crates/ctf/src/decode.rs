//! Bit-level decoding of compiled layouts.
//!
//! Two passes share one cursor and slot state: [`Walker::walk`] only moves
//! over the data (keeping integer values in their slots, updating the clock,
//! skipping fixed-size parts in O(1)); [`Walker::flatten`] builds
//! [`Fields`] for callers that want values. Iteration uses the first, field
//! access the second, so events nobody looks at cost no allocation.

use deepspan_model::{Fields, Value};

use crate::layout::{
    align_up, Field, Fixed, IntNode, Node, Op, Plan, ReadKind, SeqNode, VariantNode,
    MAX_EMPTY_ELEMENTS, SCOPES,
};

/// A decoding failure at a bit offset of the buffer being decoded.
#[derive(Debug)]
pub(crate) struct DecodeError {
    pub bit: u64,
    pub message: String,
    /// The data ended early (more data might make it decodable).
    pub short: bool,
}

type R<T> = Result<T, DecodeError>;

/// A read position over `data[..end/8]`, in bits from the packet start
/// (CTF alignment is relative to the packet start).
pub(crate) struct Cursor<'a> {
    pub data: &'a [u8],
    pub pos: u64,
    pub end: u64,
}

impl<'a> Cursor<'a> {
    /// `end` (bits) is clamped to the data length.
    pub fn new(data: &'a [u8], pos: u64, end: u64) -> Cursor<'a> {
        Cursor {
            data,
            pos,
            end: end.min(data.len() as u64 * 8),
        }
    }

    #[cold]
    fn fail<T>(&self, message: impl Into<String>) -> R<T> {
        Err(DecodeError {
            bit: self.pos,
            message: message.into(),
            short: false,
        })
    }

    #[cold]
    #[inline(never)]
    fn short<T>(&self, what: &str, bits: u64) -> R<T> {
        Err(DecodeError {
            bit: self.pos,
            message: format!(
                "{what} of {bits} bits runs past the end of the data ({} bits)",
                self.end
            ),
            short: true,
        })
    }

    #[inline(always)]
    pub fn align(&mut self, align: u32) -> R<()> {
        match align_up(self.pos, align) {
            Some(p) if p <= self.end => {
                self.pos = p;
                Ok(())
            }
            _ => self.short("alignment padding", align as u64),
        }
    }

    #[inline(always)]
    pub fn skip(&mut self, bits: u64) -> R<()> {
        match self.pos.checked_add(bits) {
            Some(p) if p <= self.end => {
                self.pos = p;
                Ok(())
            }
            _ => self.short("field", bits),
        }
    }

    /// Reads an unsigned integer of 1..=64 bits (CTF 4.1.5 bit layout).
    #[inline(always)]
    pub fn read(&mut self, size: u8, be: bool) -> R<u64> {
        let bits = size as u64;
        if bits == 0 || bits > 64 || self.end - self.pos.min(self.end) < bits {
            return self.short("integer", bits);
        }
        let byte = (self.pos >> 3) as usize;
        let shift = (self.pos & 7) as u32;
        self.pos += bits;
        if shift == 0 && bits % 8 == 0 {
            let n = (bits / 8) as usize;
            let b = &self.data[byte..byte + n];
            return Ok(match (n, be) {
                (1, _) => b[0] as u64,
                (2, false) => u16::from_le_bytes([b[0], b[1]]) as u64,
                (2, true) => u16::from_be_bytes([b[0], b[1]]) as u64,
                (4, false) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64,
                (4, true) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64,
                (8, false) => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
                (8, true) => u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
                _ => {
                    let mut v: u64 = 0;
                    for (i, &x) in b.iter().enumerate() {
                        v |= if be {
                            (x as u64) << (8 * (n - 1 - i))
                        } else {
                            (x as u64) << (8 * i)
                        };
                    }
                    v
                }
            });
        }
        // General case: the value spans at most 9 bytes.
        let n = (shift as u64 + bits).div_ceil(8) as usize;
        let b = &self.data[byte..byte + n];
        let mut wide: u128 = 0;
        let mask: u128 = (1u128 << bits) - 1;
        if be {
            for &x in b {
                wide = wide << 8 | x as u128;
            }
            let low = n as u64 * 8 - shift as u64 - bits;
            Ok(((wide >> low) & mask) as u64)
        } else {
            for (i, &x) in b.iter().enumerate() {
                wide |= (x as u128) << (8 * i);
            }
            Ok(((wide >> shift) & mask) as u64)
        }
    }

    /// The bytes of a NUL-terminated string; the cursor moves past the NUL.
    fn cstr(&mut self) -> R<&'a [u8]> {
        self.align(8)?;
        let start = (self.pos / 8) as usize;
        let end = (self.end / 8) as usize;
        let data: &'a [u8] = self.data;
        match find_nul(&data[start..end]) {
            Some(len) => {
                self.pos = ((start + len + 1) * 8) as u64;
                Ok(&data[start..start + len])
            }
            None => Err(DecodeError {
                bit: self.pos,
                message: "string without terminating NUL before the end of the data".into(),
                short: true,
            }),
        }
    }
}

/// CTF 8: an N-bit clock field replaces the low N bits of the clock; a
/// value below the previous low bits means exactly one wrap-around.
#[inline(always)]
pub(crate) fn next_clock(clock: u64, v: u64, size: u8) -> u64 {
    if size >= 64 {
        return v;
    }
    let mask = (1u64 << size) - 1;
    let next = (clock & !mask) | v;
    if v < clock & mask {
        next.wrapping_add(1u64 << size)
    } else {
        next
    }
}

/// Position of the first NUL byte, eight bytes at a time.
#[inline]
pub(crate) fn find_nul(b: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while i + 8 <= b.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        let x = u64::from_le_bytes(w);
        let z = x.wrapping_sub(LO) & !x & HI;
        if z != 0 {
            return Some(i + (z.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b[i..].iter().position(|&c| c == 0).map(|p| i + p)
}

/// Reads an integer at bit `bit` of `data`, known to lie inside it.
#[inline(always)]
fn read_at(data: &[u8], bit: u64, kind: ReadKind, size: u8, be: bool) -> u64 {
    let at = (bit >> 3) as usize;
    match kind {
        ReadKind::Bytes(1) => data[at] as u64,
        ReadKind::Bytes(2) => {
            let b = [data[at], data[at + 1]];
            if be {
                u16::from_be_bytes(b) as u64
            } else {
                u16::from_le_bytes(b) as u64
            }
        }
        ReadKind::Bytes(4) => {
            let mut b = [0u8; 4];
            b.copy_from_slice(&data[at..at + 4]);
            if be {
                u32::from_be_bytes(b) as u64
            } else {
                u32::from_le_bytes(b) as u64
            }
        }
        ReadKind::Bytes(_) => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[at..at + 8]);
            if be {
                u64::from_be_bytes(b)
            } else {
                u64::from_le_bytes(b)
            }
        }
        ReadKind::Bits => read_bits(data, bit, size, be),
    }
}

/// Any integer of 1..=64 bits at any bit offset (CTF 4.1.5 bit layout),
/// known to lie inside `data`.
#[inline]
pub(crate) fn read_bits(data: &[u8], bit: u64, size: u8, be: bool) -> u64 {
    let at = (bit >> 3) as usize;
    let shift = (bit & 7) as u32;
    let bits = size as u32;
    let n = (shift + bits).div_ceil(8) as usize;
    // Common case: eight bytes readable, value within them.
    if shift + bits <= 64 && at + 8 <= data.len() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[at..at + 8]);
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        return if be {
            (u64::from_be_bytes(b) >> (64 - shift - bits)) & mask
        } else {
            (u64::from_le_bytes(b) >> shift) & mask
        };
    }
    let b = &data[at..at + n];
    let mut wide: u128 = 0;
    let mask: u128 = (1u128 << bits) - 1;
    if be {
        for &x in b {
            wide = wide << 8 | x as u128;
        }
        let low = n as u32 * 8 - shift - bits;
        ((wide >> low) & mask) as u64
    } else {
        for (i, &x) in b.iter().enumerate() {
            wide |= (x as u128) << (8 * i);
        }
        ((wide >> shift) & mask) as u64
    }
}

#[inline]
pub(crate) fn sign_extend(v: u64, size: u8) -> i64 {
    let shift = 64 - size as u32;
    ((v << shift) as i64) >> shift
}

/// Decoding state of one stream: slot values per scope and the clock.
pub(crate) struct Walker {
    pub slots: [Vec<u64>; SCOPES],
    /// Current value of the stream clock, in ticks.
    pub clock: u64,
    /// Set by event header fields named `id` (the last one decoded wins,
    /// so an extended header's 32-bit id overrides the compact one).
    pub event_id: Option<u64>,
}

impl Walker {
    pub fn new() -> Walker {
        Walker {
            slots: Default::default(),
            clock: 0,
            event_id: None,
        }
    }

    /// Makes room for `n` slots in `scope` (cheap when already large enough).
    #[inline]
    pub fn reserve(&mut self, scope: u8, n: u32) {
        let s = &mut self.slots[scope as usize];
        if s.len() < n as usize {
            s.resize(n as usize, 0);
        }
    }

    #[inline]
    pub fn slot(&self, scope: u8, slot: u32) -> u64 {
        self.slots[scope as usize]
            .get(slot as usize)
            .copied()
            .unwrap_or(0)
    }

    #[inline(always)]
    fn int(&mut self, i: &IntNode, scope: u8, cur: &mut Cursor) -> R<u64> {
        cur.align(i.align)?;
        let raw = cur.read(i.size, i.be)?;
        let v = if i.signed {
            sign_extend(raw, i.size) as u64
        } else {
            raw
        };
        if let Some(s) = self.slots[scope as usize].get_mut(i.slot as usize) {
            *s = v;
        }
        if i.clock {
            self.update_clock(raw, i.size);
        }
        if i.event_id {
            self.event_id = Some(raw);
        }
        Ok(v)
    }

    /// CTF 8: an N-bit clock field replaces the low N bits of the clock; a
    /// value below the previous low bits means exactly one wrap-around.
    #[inline]
    pub(crate) fn update_clock(&mut self, v: u64, size: u8) {
        self.clock = next_clock(self.clock, v, size);
    }

    fn select<'n>(&self, v: &'n VariantNode, cur: &Cursor) -> R<&'n Field> {
        let raw = self.slot(v.tag.scope, v.tag.slot);
        let tag = if v.tag_signed {
            raw as i64 as i128
        } else {
            raw as i128
        };
        for &(lo, hi, i) in &v.select {
            if lo <= tag && tag <= hi {
                if let Some(f) = v.options.get(i as usize) {
                    return Ok(f);
                }
            }
        }
        cur.fail(format!("variant tag value {tag} selects no option"))
    }

    fn seq_len(&self, s: &SeqNode, cur: &Cursor) -> R<u64> {
        let raw = self.slot(s.len.scope, s.len.slot);
        if s.len_signed && (raw as i64) < 0 {
            return cur.fail(format!("negative sequence length {}", raw as i64));
        }
        Ok(raw)
    }

    /// Moves over a [`Fixed`] run: one bounds check, then direct reads.
    #[inline(always)]
    pub fn fixed(&mut self, f: &Fixed, scope: u8, cur: &mut Cursor) -> R<()> {
        let start = align_up(cur.pos, f.align);
        let end = start.and_then(|s| s.checked_add(f.bits));
        let (Some(start), Some(end)) = (start, end) else {
            return self.run(&f.steps, scope, cur);
        };
        if end > cur.end {
            // Short data: step by step, for the exact error.
            return self.run(&f.steps, scope, cur);
        }
        self.fixed_ints(f, cur.data, start);
        cur.pos = end;
        Ok(())
    }

    /// [`Walker::run_plan`] for the fast path's shapes it does not cover
    /// itself: false on anything unusual (short data, an error), which the
    /// caller then decodes again step by step for the exact error.
    #[inline]
    pub fn plan_ok(
        &mut self,
        plan: &Plan,
        ops: &[Op],
        scope: u8,
        data: &[u8],
        pos: &mut u64,
        end: u64,
    ) -> bool {
        let mut cur = Cursor::new(data, *pos, end);
        let ok = self.run_plan(plan, ops, scope, &mut cur).is_ok();
        *pos = cur.pos;
        ok
    }

    /// The integers of a run starting at `start`, known to lie in `data`.
    #[inline(always)]
    fn fixed_ints(&mut self, f: &Fixed, data: &[u8], start: u64) {
        for i in &f.ints {
            let raw = read_at(data, start + i.off, i.read, i.size, i.be);
            if let Some(s) = self.slots[i.scope as usize].get_mut(i.slot as usize) {
                *s = if i.signed {
                    sign_extend(raw, i.size) as u64
                } else {
                    raw
                };
            }
            if i.clock {
                self.update_clock(raw, i.size);
            }
            if i.event_id {
                self.event_id = Some(raw);
            }
        }
    }

    /// Runs a scope's program by its [`Plan`] (same effect as
    /// [`Walker::run`] on its steps).
    #[inline(always)]
    pub fn run_plan(&mut self, plan: &Plan, ops: &[Op], scope: u8, cur: &mut Cursor) -> R<()> {
        match plan {
            Plan::Nothing => Ok(()),
            Plan::Fixed(f) => self.fixed(f, scope, cur),
            Plan::Tagged(t) => {
                self.fixed(&t.head, scope, cur)?;
                let tag = self.slot(scope, t.tag_slot);
                for &(lo, hi, i) in &t.select {
                    if lo <= tag && tag <= hi {
                        return match t.options.get(i as usize) {
                            Some(Some(f)) => self.fixed(f, scope, cur),
                            Some(None) => Ok(()),
                            None => cur.fail(format!("variant tag value {tag} selects no option")),
                        };
                    }
                }
                cur.fail(format!("variant tag value {tag} selects no option"))
            }
            Plan::Steps(_) | Plan::Ops => self.run(ops, scope, cur),
        }
    }

    /// Runs a scope's walking program: moves over its data keeping slots
    /// and clock up to date (same effect as [`Walker::walk`] on its root).
    pub fn run(&mut self, ops: &[Op], scope: u8, cur: &mut Cursor) -> R<()> {
        for op in ops {
            match op {
                Op::Align(a) => cur.align(*a)?,
                Op::Skip(bits) => cur.skip(*bits)?,
                Op::Fixed(f) => self.fixed(f, scope, cur)?,
                Op::Int(i) => {
                    self.int(i, scope, cur)?;
                }
                Op::Str => {
                    cur.cstr()?;
                }
                Op::Variant(v) => {
                    let raw = self.slot(v.tag.scope, v.tag.slot);
                    let tag = if v.tag_signed {
                        raw as i64 as i128
                    } else {
                        raw as i128
                    };
                    let Some(&(_, _, i)) =
                        v.select.iter().find(|(lo, hi, _)| *lo <= tag && tag <= *hi)
                    else {
                        return cur.fail(format!("variant tag value {tag} selects no option"));
                    };
                    match v.options.get(i as usize) {
                        Some(option) => self.run(option, scope, cur)?,
                        None => {
                            return cur.fail(format!("variant tag value {tag} selects no option"))
                        }
                    }
                }
                Op::Array { len, elem } => {
                    let start = cur.pos;
                    for i in 0..*len {
                        self.run(elem, scope, cur)?;
                        if cur.pos == start && i >= MAX_EMPTY_ELEMENTS {
                            return cur.fail(format!("{len} elements of zero size"));
                        }
                    }
                }
                Op::Seq(s) => {
                    let raw = self.slot(s.len.scope, s.len.slot);
                    if s.len_signed && (raw as i64) < 0 {
                        return cur.fail(format!("negative sequence length {}", raw as i64));
                    }
                    cur.align(s.align)?;
                    match s.fixed {
                        // Free to skip, but not to materialize: bounded like
                        // the element-by-element walk.
                        Some((0, _)) if raw > MAX_EMPTY_ELEMENTS => {
                            return cur.fail(format!("{raw} elements of zero size"));
                        }
                        Some((size, stride)) if raw > 0 => {
                            let bits = (raw - 1)
                                .checked_mul(stride)
                                .and_then(|b| b.checked_add(size));
                            match bits {
                                Some(bits) => cur.skip(bits)?,
                                None => return cur.short("sequence", u64::MAX),
                            }
                        }
                        Some(_) => {}
                        None => {
                            let start = cur.pos;
                            for i in 0..raw {
                                self.run(&s.elem, scope, cur)?;
                                if cur.pos == start && i >= MAX_EMPTY_ELEMENTS {
                                    return cur.fail(format!("{raw} elements of zero size"));
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves over `node`, keeping slots and clock up to date.
    pub fn walk(&mut self, node: &Node, scope: u8, cur: &mut Cursor) -> R<()> {
        match node {
            Node::Int(i) | Node::Enum(i, _) => {
                self.int(i, scope, cur)?;
            }
            Node::Float { double, align, .. } => {
                cur.align(*align)?;
                cur.skip(if *double { 64 } else { 32 })?;
            }
            Node::Str => {
                cur.cstr()?;
            }
            Node::Struct(s) => {
                cur.align(s.align)?;
                match s.skip {
                    Some(bits) => cur.skip(bits)?,
                    None => {
                        for f in &s.fields {
                            self.walk(&f.node, scope, cur)?;
                        }
                    }
                }
            }
            Node::Variant(v) => {
                let f = self.select(v, cur)?;
                self.walk(&f.node, scope, cur)?;
            }
            Node::Array(a) => {
                cur.align(a.elem.align())?;
                match a.skip {
                    Some(bits) => cur.skip(bits)?,
                    None => self.walk_elems(&a.elem, a.len, scope, cur)?,
                }
            }
            Node::Sequence(s) => {
                let len = self.seq_len(s, cur)?;
                cur.align(s.elem.align())?;
                self.walk_elems(&s.elem, len, scope, cur)?;
            }
        }
        Ok(())
    }

    fn walk_elems(&mut self, elem: &Node, len: u64, scope: u8, cur: &mut Cursor) -> R<()> {
        let start = cur.pos;
        for i in 0..len {
            self.walk(elem, scope, cur)?;
            // Zero-size elements never run out of data: bound them.
            if cur.pos == start && i >= MAX_EMPTY_ELEMENTS {
                return cur.fail(format!("{len} elements of zero size"));
            }
        }
        Ok(())
    }

    /// Decodes a scope root into `out` as a flat list: nested struct members
    /// become `outer.inner`; a variant `v` is its selected option, named `v`.
    pub fn flatten(&mut self, node: &Node, scope: u8, cur: &mut Cursor, out: &mut Fields) -> R<()> {
        match node {
            Node::Struct(s) => {
                cur.align(s.align)?;
                for f in &s.fields {
                    self.flatten_field(f, scope, cur, out)?;
                }
                Ok(())
            }
            other => self.walk(other, scope, cur),
        }
    }

    fn flatten_field(&mut self, f: &Field, scope: u8, cur: &mut Cursor, out: &mut Fields) -> R<()> {
        match &f.node {
            Node::Struct(s) => {
                cur.align(s.align)?;
                for g in &s.fields {
                    self.flatten_field(g, scope, cur, out)?;
                }
            }
            Node::Variant(v) => {
                let o = self.select(v, cur)?;
                self.flatten_field(o, scope, cur, out)?;
            }
            node => {
                let value = self.value(node, scope, cur)?;
                out.push((f.path.clone(), value));
            }
        }
        Ok(())
    }

    fn value(&mut self, node: &Node, scope: u8, cur: &mut Cursor) -> R<Value> {
        Ok(match node {
            Node::Int(i) | Node::Enum(i, _) => {
                let v = self.int(i, scope, cur)?;
                if i.signed {
                    Value::Int(v as i64)
                } else {
                    Value::UInt(v)
                }
            }
            Node::Float { double, align, be } => {
                cur.align(*align)?;
                if *double {
                    Value::Float(f64::from_bits(cur.read(64, *be)?))
                } else {
                    Value::Float(f32::from_bits(cur.read(32, *be)? as u32) as f64)
                }
            }
            Node::Str => Value::Str(String::from_utf8_lossy(cur.cstr()?).into_owned()),
            Node::Struct(s) => {
                cur.align(s.align)?;
                let mut items = Vec::with_capacity(s.fields.len());
                for f in &s.fields {
                    items.push(self.value(&f.node, scope, cur)?);
                }
                Value::Array(items)
            }
            Node::Variant(v) => {
                let f = self.select(v, cur)?;
                self.value(&f.node, scope, cur)?
            }
            Node::Array(a) => {
                cur.align(a.elem.align())?;
                self.elems(&a.elem, a.len, a.text, scope, cur)?
            }
            Node::Sequence(s) => {
                let len = self.seq_len(s, cur)?;
                cur.align(s.elem.align())?;
                self.elems(&s.elem, len, s.text, scope, cur)?
            }
        })
    }

    fn elems(
        &mut self,
        elem: &Node,
        len: u64,
        text: bool,
        scope: u8,
        cur: &mut Cursor,
    ) -> R<Value> {
        if text {
            // Characters: shown up to the first NUL, like C strings.
            let aligned_bytes = cur.pos % 8 == 0 && elem.align() <= 8;
            let bytes: Vec<u8> = if aligned_bytes {
                let n = len.checked_mul(8).filter(|bits| *bits <= cur.end - cur.pos);
                let Some(bits) = n else {
                    return cur.short("character array", len.saturating_mul(8));
                };
                let start = (cur.pos / 8) as usize;
                cur.pos += bits;
                cur.data[start..start + len as usize].to_vec()
            } else {
                let mut bytes = Vec::new();
                for _ in 0..len {
                    match elem {
                        Node::Int(i) | Node::Enum(i, _) => {
                            bytes.push(self.int(i, scope, cur)? as u8)
                        }
                        other => self.walk(other, scope, cur)?,
                    }
                }
                bytes
            };
            let upto = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            Ok(Value::Str(
                String::from_utf8_lossy(&bytes[..upto]).into_owned(),
            ))
        } else {
            let start = cur.pos;
            let cap = len.min(cur.end.saturating_sub(cur.pos)).min(1 << 16) as usize;
            let mut items = Vec::with_capacity(cap);
            for i in 0..len {
                items.push(self.value(elem, scope, cur)?);
                if cur.pos == start && i >= MAX_EMPTY_ELEMENTS {
                    return cur.fail(format!("{len} elements of zero size"));
                }
            }
            Ok(Value::Array(items))
        }
    }
}
