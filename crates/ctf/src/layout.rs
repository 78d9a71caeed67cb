//! Compiled field layouts: the TSDL type IR with byte orders resolved,
//! every integer given a *slot* (where its last decoded value is kept), and
//! every variant tag / sequence length path resolved to a slot. Decoding then
//! never looks anything up by name.
//!
//! Slots are numbered per dynamic scope (packet header, packet context,
//! event header, stream event context, event context, payload). A reference
//! reads the value most recently decoded into its slot, which is exactly the
//! CTF rule "the closest preceding field" even inside arrays of structs.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use crate::tsdl::{IntIr, OrderSpec, ParseError, TypeIr};

pub(crate) const PACKET_HEADER: u8 = 0;
pub(crate) const PACKET_CONTEXT: u8 = 1;
pub(crate) const EVENT_HEADER: u8 = 2;
pub(crate) const STREAM_EVENT_CONTEXT: u8 = 3;
pub(crate) const EVENT_CONTEXT: u8 = 4;
pub(crate) const PAYLOAD: u8 = 5;
pub(crate) const SCOPES: usize = 6;

/// Compiled nodes allowed per trace: typedefs are instantiated at each use,
/// so hostile metadata could otherwise describe exponentially many.
pub(crate) const MAX_NODES: usize = 1 << 20;
/// An array of zero-size elements costs nothing to skip but one value per
/// element to materialize; more than this is not a real trace.
pub(crate) const MAX_EMPTY_ELEMENTS: u64 = 1 << 16;
/// The slot of an integer nobody reads (decoding only moves over it).
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// Bounds the recursion of compiling and decoding.
const MAX_NODE_DEPTH: u32 = 200;

#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotRef {
    pub scope: u8,
    pub slot: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct IntNode {
    pub size: u8,
    pub align: u32,
    pub signed: bool,
    pub be: bool,
    pub slot: u32,
    /// Decoding it updates the stream clock (N-bit wrap rule).
    pub clock: bool,
    /// Decoding it sets the event id (event header fields named `id`).
    pub event_id: bool,
}

#[derive(Debug)]
pub(crate) struct EnumRange {
    pub lo: i128,
    pub hi: i128,
    pub label: Arc<str>,
}

#[derive(Debug)]
pub(crate) struct Field {
    /// Name as displayed: one leading underscore removed (CTF 4.2.1).
    pub name: Arc<str>,
    /// Dotted path from the scope root, used for flattened field lists
    /// (`v.compact.timestamp`).
    pub path: Arc<str>,
    pub raw: Box<str>,
    pub node: Node,
}

#[derive(Debug)]
pub(crate) struct StructNode {
    pub align: u32,
    pub fields: Vec<Field>,
    /// Size in bits when the struct can be skipped without decoding it:
    /// fixed layout and no slot inside that anyone reads.
    pub skip: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct VariantNode {
    pub tag: SlotRef,
    pub tag_signed: bool,
    /// (lo, hi, option index) from the tag enumeration's mappings.
    pub select: Vec<(i128, i128, u32)>,
    pub options: Vec<Field>,
}

#[derive(Debug)]
pub(crate) struct ArrayNode {
    pub elem: Node,
    pub len: u64,
    /// Elements are UTF-8/ASCII characters: the value is a string.
    pub text: bool,
    pub skip: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct SeqNode {
    pub elem: Node,
    pub len: SlotRef,
    pub len_signed: bool,
    pub text: bool,
    /// Element size in bits when elements can be skipped without decoding.
    pub elem_skip: Option<u64>,
}

#[derive(Debug)]
pub(crate) enum Node {
    Int(IntNode),
    Enum(IntNode, Arc<[EnumRange]>),
    Float { double: bool, align: u32, be: bool },
    Str,
    Struct(StructNode),
    Variant(VariantNode),
    Array(Box<ArrayNode>),
    Sequence(Box<SeqNode>),
}

impl Node {
    pub fn align(&self) -> u32 {
        match self {
            Node::Int(i) | Node::Enum(i, _) => i.align,
            Node::Float { align, .. } => *align,
            Node::Str => 8,
            Node::Struct(s) => s.align,
            // A variant is aligned on its selected option, at decode time.
            Node::Variant(_) => 1,
            Node::Array(a) => a.elem.align(),
            Node::Sequence(s) => s.elem.align(),
        }
    }

    /// Size in bits when it does not depend on the data, assuming the node
    /// starts aligned (then inner offsets are fixed, since a compound is
    /// aligned at least as strictly as any member).
    fn fixed_size(&self) -> Option<u64> {
        match self {
            Node::Int(i) | Node::Enum(i, _) => Some(i.size as u64),
            Node::Float { double, .. } => Some(if *double { 64 } else { 32 }),
            Node::Str | Node::Variant(_) | Node::Sequence(_) => None,
            Node::Struct(s) => {
                let mut off: u64 = 0;
                for f in &s.fields {
                    off = align_up(off, f.node.align())?.checked_add(f.node.fixed_size()?)?;
                }
                Some(off)
            }
            Node::Array(a) => {
                let size = a.elem.fixed_size()?;
                if a.len == 0 {
                    return Some(0);
                }
                let stride = align_up(size, a.elem.align())?;
                stride.checked_mul(a.len - 1)?.checked_add(size)
            }
        }
    }

    fn has_read_slot(&self, read: &[bool]) -> bool {
        match self {
            Node::Int(i) | Node::Enum(i, _) => {
                read.get(i.slot as usize).copied().unwrap_or(false) || i.clock || i.event_id
            }
            Node::Float { .. } | Node::Str => false,
            Node::Struct(s) => s.fields.iter().any(|f| f.node.has_read_slot(read)),
            Node::Variant(v) => v.options.iter().any(|f| f.node.has_read_slot(read)),
            Node::Array(a) => a.elem.has_read_slot(read),
            Node::Sequence(s) => s.elem.has_read_slot(read),
        }
    }

    /// Fills in `skip` bottom-up once all references into the scope are known.
    fn finalize(&mut self, read: &[bool]) {
        match self {
            Node::Struct(s) => {
                for f in &mut s.fields {
                    f.node.finalize(read);
                }
            }
            Node::Variant(v) => {
                for f in &mut v.options {
                    f.node.finalize(read);
                }
            }
            Node::Array(a) => a.elem.finalize(read),
            Node::Sequence(s) => s.elem.finalize(read),
            _ => {}
        }
        let skip = match &*self {
            Node::Struct(_) | Node::Array(_) if !self.has_read_slot(read) => self.fixed_size(),
            _ => None,
        };
        match self {
            Node::Struct(s) => s.skip = skip,
            Node::Array(a) => a.skip = skip,
            Node::Sequence(s) if !s.elem.has_read_slot(read) => s.elem_skip = s.elem.fixed_size(),
            _ => {}
        }
    }
}

pub(crate) fn align_up(v: u64, align: u32) -> Option<u64> {
    let a = align as u64;
    Some(v.checked_add(a - 1)? & !(a - 1))
}

/// One compiled dynamic scope: its root struct and how many slots it uses.
#[derive(Debug)]
pub(crate) struct Scope {
    pub root: Node,
    pub slots: u32,
    /// The root as a flat program for [`crate::decode::Walker::run`].
    pub ops: Vec<Op>,
    /// The same program specialised by shape, for
    /// [`crate::decode::Walker::run_plan`].
    pub plan: Plan,
    /// Slots read within the scope (variant tags, sequence lengths) or by
    /// the reader.
    pub read: Vec<bool>,
    /// When the root has a fixed layout: the bit offset of each top-level
    /// field from the (aligned) root start, for direct field reads.
    pub offsets: Option<Vec<u64>>,
    /// How each top-level field is read straight from the packet by the
    /// typed mapping (see [`Direct`]).
    pub direct: Box<[Direct]>,
    /// The root's alignment.
    pub root_align: u32,
}

/// Where a top-level field of a scope is, for reading it without decoding
/// the fields before it: the typed mapping reads a handful of integers per
/// event, and finding each one by walking the layout cost more than the
/// rest of the event's decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direct {
    /// An integer or enumeration `off` bits after the aligned root start
    /// (every field before it has a size that does not depend on the data).
    Int {
        off: u64,
        size: u8,
        signed: bool,
        be: bool,
    },
    /// A character array of `len` bytes at byte `off / 8` of the aligned
    /// root, in a root whose whole layout is fixed.
    Text { off: u64, len: u64 },
    /// A NUL-terminated string at byte `off / 8` of the aligned root
    /// (every field before it has a size that does not depend on the data).
    Str { off: u64 },
    /// Found by walking the layout (or decoding the fields).
    Walk,
}

/// One step of the walking program: the layout tree flattened so that the
/// hot loop neither recurses into structs nor re-checks what is fixed.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Align(u32),
    Skip(u64),
    Int(IntNode),
    /// A run of the three steps above with a fixed layout from its aligned
    /// start: one bounds check, then direct reads.
    Fixed(Box<Fixed>),
    Str,
    Variant(Box<VariantOps>),
    /// An array that must be walked element by element.
    Array {
        len: u64,
        elem: Vec<Op>,
    },
    Seq(Box<SeqOps>),
}

#[derive(Clone, Debug)]
pub(crate) struct VariantOps {
    pub tag: SlotRef,
    pub tag_signed: bool,
    pub select: Vec<(i128, i128, u32)>,
    pub options: Vec<Vec<Op>>,
}

#[derive(Clone, Debug)]
pub(crate) struct SeqOps {
    pub len: SlotRef,
    pub len_signed: bool,
    pub align: u32,
    /// (size, stride) in bits when elements can be skipped arithmetically.
    pub fixed: Option<(u64, u64)>,
    pub elem: Vec<Op>,
}

/// How an integer of a [`Fixed`] run is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadKind {
    /// Whole bytes at a byte boundary: 1, 2, 4 or 8 of them.
    Bytes(u8),
    /// Anything else (bit fields, odd sizes, unknown byte alignment).
    Bits,
}

/// An integer of a [`Fixed`] run (the [`IntNode`] flattened).
#[derive(Clone, Debug)]
pub(crate) struct FixedInt {
    /// Bit offset from the aligned start of the run.
    pub off: u64,
    /// The slot's dynamic scope (runs of several scopes are fused, see
    /// [`ClassFast`]).
    pub scope: u8,
    pub slot: u32,
    pub size: u8,
    pub read: ReadKind,
    pub be: bool,
    pub signed: bool,
    pub clock: bool,
    pub event_id: bool,
}

/// Consecutive alignments, skips and integers whose offsets from the
/// run's aligned start do not depend on the data.
#[derive(Clone, Debug)]
pub(crate) struct Fixed {
    pub align: u32,
    pub bits: u64,
    pub ints: Vec<FixedInt>,
    /// The run as separate steps: rerun when the data is too short, so that
    /// the error names the very field that does not fit.
    pub steps: Vec<Op>,
}

impl Fixed {
    fn start(op: &Op) -> Option<Fixed> {
        let mut f = Fixed {
            align: match op {
                Op::Align(a) => *a,
                Op::Int(i) => i.align,
                Op::Skip(_) => 1,
                _ => return None,
            },
            bits: 0,
            ints: Vec::new(),
            steps: Vec::new(),
        };
        f.absorb(op).then_some(f)
    }

    /// Appends `op` when its offset from the run start is fixed.
    fn absorb(&mut self, op: &Op) -> bool {
        let bits = match op {
            Op::Align(a) if *a <= self.align => align_up(self.bits, *a),
            Op::Skip(n) => self.bits.checked_add(*n),
            Op::Int(i) if i.align <= self.align => {
                let Some(off) = align_up(self.bits, i.align) else {
                    return false;
                };
                let bytes =
                    matches!(i.size, 8 | 16 | 32 | 64) && off % 8 == 0 && self.align % 8 == 0;
                let end = off.checked_add(i.size as u64);
                if end.is_some() && (i.slot != NO_SLOT || i.clock || i.event_id) {
                    self.ints.push(FixedInt {
                        off,
                        scope: 0,
                        slot: i.slot,
                        size: i.size,
                        read: if bytes {
                            ReadKind::Bytes(i.size / 8)
                        } else {
                            ReadKind::Bits
                        },
                        be: i.be,
                        signed: i.signed,
                        clock: i.clock,
                        event_id: i.event_id,
                    });
                }
                end
            }
            _ => None,
        };
        match bits {
            Some(b) => {
                self.bits = b;
                self.steps.push(op.clone());
                true
            }
            None => false,
        }
    }
}

/// Turns runs of [`Op::Align`], [`Op::Skip`] and [`Op::Int`] into
/// [`Op::Fixed`], at every level.
fn fuse(ops: Vec<Op>) -> Vec<Op> {
    fn close(run: Option<Fixed>, out: &mut Vec<Op>) {
        if let Some(mut f) = run {
            if matches!(f.steps[..], [Op::Align(_) | Op::Skip(_)]) {
                out.extend(f.steps.pop());
            } else {
                out.push(Op::Fixed(Box::new(f)));
            }
        }
    }
    let mut out = Vec::with_capacity(ops.len());
    let mut run: Option<Fixed> = None;
    for op in ops {
        let op = match op {
            Op::Variant(mut v) => {
                v.options = std::mem::take(&mut v.options)
                    .into_iter()
                    .map(fuse)
                    .collect();
                Op::Variant(v)
            }
            Op::Array { len, elem } => Op::Array {
                len,
                elem: fuse(elem),
            },
            Op::Seq(mut s) => {
                s.elem = fuse(std::mem::take(&mut s.elem));
                Op::Seq(s)
            }
            other => other,
        };
        if let Some(f) = run.as_mut() {
            if f.absorb(&op) {
                continue;
            }
        }
        match Fixed::start(&op) {
            Some(f) => {
                close(run.replace(f), &mut out);
            }
            None => {
                close(run.take(), &mut out);
                out.push(op);
            }
        }
    }
    close(run, &mut out);
    out
}

fn set_scope(ops: &mut [Op], scope: u8) {
    for op in ops {
        match op {
            Op::Fixed(f) => f.ints.iter_mut().for_each(|i| i.scope = scope),
            Op::Variant(v) => v.options.iter_mut().for_each(|o| set_scope(o, scope)),
            Op::Array { elem, .. } => set_scope(elem, scope),
            Op::Seq(s) => set_scope(&mut s.elem, scope),
            _ => {}
        }
    }
}

/// The stream event context, event context and payload of one event class
/// as one program of fixed runs and strings, adjacent runs merged across
/// scopes: most events then take one or two bounds checks.
#[derive(Debug)]
pub(crate) struct ClassFast {
    pub steps: Vec<Step>,
    /// Where the payload starts (before its own alignment): at step
    /// `payload_step`, `payload_off` bits after its aligned start, or
    /// (None) where the step starts, before its alignment.
    pub payload_step: usize,
    pub payload_off: Option<u64>,
}

impl ClassFast {
    /// None when a scope has another shape than fixed runs and strings.
    pub fn new(
        stream_context: Option<&Scope>,
        context: Option<&Scope>,
        payload: Option<&Scope>,
    ) -> Option<ClassFast> {
        fn steps_of(scope: Option<&Scope>) -> Option<Vec<Step>> {
            let Some(s) = scope else {
                return Some(Vec::new());
            };
            match &s.plan {
                Plan::Nothing => Some(Vec::new()),
                Plan::Fixed(f) => Some(vec![Step::Fixed(f.clone())]),
                Plan::Steps(steps) => Some(steps.clone()),
                Plan::Tagged(_) | Plan::Ops => None,
            }
        }
        let mut out = ClassFast {
            steps: Vec::new(),
            payload_step: 0,
            payload_off: None,
        };
        for step in steps_of(stream_context)?
            .into_iter()
            .chain(steps_of(context)?)
        {
            out.push(step);
        }
        out.payload_step = usize::MAX;
        for (i, step) in steps_of(payload)?.into_iter().enumerate() {
            let before = out.steps.last().map(|s| match s {
                Step::Fixed(f) => f.bits,
                Step::Str => 0,
            });
            let merged = out.push(step);
            if i == 0 {
                // The payload starts where the last run ended, or with
                // its own step.
                match (merged, before) {
                    (true, Some(bits)) => {
                        out.payload_step = out.steps.len() - 1;
                        out.payload_off = Some(bits);
                    }
                    _ => out.payload_step = out.steps.len() - 1,
                }
            }
        }
        if out.payload_step == usize::MAX {
            // No payload step: it starts where everything ends.
            out.payload_step = out.steps.len();
            out.payload_off = None;
        }
        Some(out)
    }

    /// Appends a step; true when it was merged into the last run.
    fn push(&mut self, step: Step) -> bool {
        if let (Some(Step::Fixed(a)), Step::Fixed(b)) = (self.steps.last_mut(), &step) {
            if b.align <= a.align {
                if let Some(off) = align_up(a.bits, b.align) {
                    if let Some(bits) = off.checked_add(b.bits) {
                        a.ints.extend(b.ints.iter().map(|i| FixedInt {
                            off: i.off + off,
                            ..i.clone()
                        }));
                        a.bits = bits;
                        a.steps.clear();
                        return true;
                    }
                }
            }
        }
        self.steps.push(step);
        false
    }
}

/// A scope's program by shape, so that the common shapes decode without
/// interpreting steps.
#[derive(Debug)]
pub(crate) enum Plan {
    Nothing,
    Fixed(Fixed),
    /// LTTng's compact and large event headers: a fixed run holding an
    /// unsigned tag, then a variant on that tag whose options are fixed
    /// runs (or empty).
    Tagged(Box<Tagged>),
    /// Fixed runs and strings.
    Steps(Vec<Step>),
    /// Anything else: run [`Scope::ops`].
    Ops,
}

#[derive(Clone, Debug)]
pub(crate) enum Step {
    Fixed(Fixed),
    Str,
}

#[derive(Debug)]
pub(crate) struct Tagged {
    pub head: Fixed,
    pub tag_slot: u32,
    /// (lo, hi, option) on the unsigned tag value.
    pub select: Vec<(u64, u64, u32)>,
    pub options: Vec<Option<Fixed>>,
}

fn as_fixed(ops: &[Op]) -> Option<Option<Fixed>> {
    match ops {
        [] => Some(None),
        [Op::Fixed(f)] => Some(Some((**f).clone())),
        [op @ (Op::Align(_) | Op::Skip(_))] => Some(Fixed::start(op)),
        _ => None,
    }
}

fn plan_of(ops: &[Op], scope: u8) -> Plan {
    if ops.is_empty() {
        return Plan::Nothing;
    }
    if let Some(Some(f)) = as_fixed(ops) {
        return Plan::Fixed(f);
    }
    let steps: Option<Vec<Step>> = ops
        .iter()
        .map(|op| match op {
            Op::Str => Some(Step::Str),
            op => as_fixed(std::slice::from_ref(op))?.map(Step::Fixed),
        })
        .collect();
    if let Some(steps) = steps {
        return Plan::Steps(steps);
    }
    if let [Op::Fixed(head), Op::Variant(v)] = ops {
        let tag_here =
            v.tag.scope == scope && !v.tag_signed && head.ints.iter().any(|i| i.slot == v.tag.slot);
        let options: Option<Vec<Option<Fixed>>> = v.options.iter().map(|o| as_fixed(o)).collect();
        if let (true, Some(options)) = (tag_here, options) {
            let select = v
                .select
                .iter()
                .filter_map(|&(lo, hi, i)| {
                    let lo = lo.max(0);
                    let hi = hi.min(u64::MAX as i128);
                    (lo <= hi).then_some((lo as u64, hi as u64, i))
                })
                .collect();
            return Plan::Tagged(Box::new(Tagged {
                head: (**head).clone(),
                tag_slot: v.tag.slot,
                select,
                options,
            }));
        }
    }
    Plan::Ops
}

fn push_op(out: &mut Vec<Op>, op: Op) {
    match (out.last_mut(), op) {
        (_, Op::Align(1)) | (_, Op::Skip(0)) => {}
        (Some(Op::Align(a)), Op::Align(b)) => *a = (*a).max(b),
        (Some(Op::Skip(a)), Op::Skip(b)) if a.checked_add(b).is_some() => *a += b,
        (_, op) => out.push(op),
    }
}

/// Which integers may be skipped instead of decoded: in the payload (no
/// later scope refers to it), those whose slot nobody reads.
#[derive(Clone, Copy)]
struct Unread<'a>(Option<&'a [bool]>);

impl Unread<'_> {
    fn skips(&self, i: &IntNode) -> bool {
        match self.0 {
            Some(read) => {
                !(read.get(i.slot as usize).copied().unwrap_or(false) || i.clock || i.event_id)
            }
            None => false,
        }
    }
}

fn ops_of(node: &Node, unread: Unread<'_>) -> Vec<Op> {
    let mut v = Vec::new();
    build_ops(node, &mut v, unread);
    v
}

fn build_ops(node: &Node, out: &mut Vec<Op>, unread: Unread<'_>) {
    match node {
        // Still an integer step (same errors on short data), without a slot.
        Node::Int(i) | Node::Enum(i, _) if unread.skips(i) => push_op(
            out,
            Op::Int(IntNode {
                slot: NO_SLOT,
                ..i.clone()
            }),
        ),
        Node::Int(i) | Node::Enum(i, _) => push_op(out, Op::Int(i.clone())),
        Node::Float { double, align, .. } => {
            push_op(out, Op::Align(*align));
            push_op(out, Op::Skip(if *double { 64 } else { 32 }));
        }
        Node::Str => push_op(out, Op::Str),
        Node::Struct(s) => {
            push_op(out, Op::Align(s.align));
            match s.skip {
                Some(bits) => push_op(out, Op::Skip(bits)),
                None => s
                    .fields
                    .iter()
                    .for_each(|f| build_ops(&f.node, out, unread)),
            }
        }
        Node::Variant(v) => push_op(
            out,
            Op::Variant(Box::new(VariantOps {
                tag: v.tag,
                tag_signed: v.tag_signed,
                select: v.select.clone(),
                options: v.options.iter().map(|f| ops_of(&f.node, unread)).collect(),
            })),
        ),
        Node::Array(a) => {
            push_op(out, Op::Align(a.elem.align()));
            match a.skip {
                Some(bits) => push_op(out, Op::Skip(bits)),
                None if a.len == 0 => {}
                None => push_op(
                    out,
                    Op::Array {
                        len: a.len,
                        elem: ops_of(&a.elem, unread),
                    },
                ),
            }
        }
        Node::Sequence(s) => {
            let align = s.elem.align();
            let fixed = s
                .elem_skip
                .and_then(|size| Some((size, align_up(size, align)?)));
            push_op(
                out,
                Op::Seq(Box::new(SeqOps {
                    len: s.len,
                    len_signed: s.len_signed,
                    align,
                    fixed,
                    elem: ops_of(&s.elem, unread),
                })),
            );
        }
    }
}

impl Scope {
    /// Stops fixed runs from storing integers no one reads: not read within
    /// the scope nor from a later one (`cross`: (scope, slot) pairs). Clock
    /// and event id integers still act, without a slot.
    pub fn prune_stores(&mut self, id: u8, cross: &[(u8, u32)]) {
        fn prune(ops: &mut [Op], needed: &dyn Fn(u32) -> bool) {
            for op in ops {
                match op {
                    Op::Fixed(f) => {
                        for i in &mut f.ints {
                            if i.slot != NO_SLOT && !needed(i.slot) {
                                i.slot = NO_SLOT;
                            }
                        }
                        f.ints
                            .retain(|i| i.slot != NO_SLOT || i.clock || i.event_id);
                    }
                    Op::Variant(v) => v.options.iter_mut().for_each(|o| prune(o, needed)),
                    Op::Array { elem, .. } => prune(elem, needed),
                    Op::Seq(s) => prune(&mut s.elem, needed),
                    _ => {}
                }
            }
        }
        let read = &self.read;
        let needed = |slot: u32| {
            read.get(slot as usize).copied().unwrap_or(false) || cross.contains(&(id, slot))
        };
        prune(&mut self.ops, &needed);
        self.plan = plan_of(&self.ops, id);
    }

    /// The largest alignment (bits) anywhere in the scope.
    pub fn max_align(&self) -> u32 {
        fn walk(n: &Node) -> u32 {
            let inner = match n {
                Node::Struct(s) => s.fields.iter().map(|f| walk(&f.node)).max(),
                Node::Variant(v) => v.options.iter().map(|f| walk(&f.node)).max(),
                Node::Array(a) => Some(walk(&a.elem)),
                Node::Sequence(s) => Some(walk(&s.elem)),
                _ => None,
            };
            n.align().max(inner.unwrap_or(1))
        }
        walk(&self.root)
    }

    pub fn fields(&self) -> &[Field] {
        match &self.root {
            Node::Struct(s) => &s.fields,
            _ => &[],
        }
    }

    /// The slot of a top-level integer field, by displayed name.
    pub fn int_slot(&self, name: &str) -> Option<(u32, &IntNode)> {
        self.fields()
            .iter()
            .find(|f| &*f.name == name)
            .and_then(|f| match &f.node {
                Node::Int(i) | Node::Enum(i, _) => Some((i.slot, i)),
                _ => None,
            })
    }
}

/// What a scope compilation may look at outside itself.
pub(crate) struct Env<'a> {
    pub native_be: bool,
    /// Already compiled scopes, by scope id.
    pub uppers: [Option<&'a Scope>; SCOPES],
    /// Resolves `map = clock.NAME.value`; false when the clock is unknown.
    pub clock_known: &'a dyn Fn(&str) -> bool,
    /// Node budget shared by all scopes of a trace.
    pub budget: &'a std::cell::Cell<usize>,
    /// Slots read from a later scope (scope, slot), collected here.
    pub cross: &'a std::cell::RefCell<Vec<(u8, u32)>>,
}

struct Compiler<'a> {
    env: &'a Env<'a>,
    scope: u8,
    slots: u32,
    read: Vec<bool>,
    /// Fields compiled so far in each enclosing struct, innermost last.
    stack: Vec<Vec<Field>>,
    /// Inside the event header, integers named `timestamp` with no clock
    /// mapping still feed the clock (CTF 8: default 1 GHz clock).
    implicit_clock: bool,
    depth: u32,
}

/// Compiles one dynamic scope. `extra_read` names top-level integer fields
/// whose slot the reader consumes (so they must always be decoded).
pub(crate) fn compile_scope(
    ty: &Rc<TypeIr>,
    scope: u8,
    env: &Env<'_>,
    extra_read: &[&str],
    offset: usize,
) -> Result<Scope, ParseError> {
    let mut c = Compiler {
        env,
        scope,
        slots: 0,
        read: Vec::new(),
        stack: Vec::new(),
        implicit_clock: false,
        depth: 0,
    };
    c.implicit_clock = scope == EVENT_HEADER || scope == PACKET_CONTEXT;
    let mut root = match &**ty {
        TypeIr::Struct { .. } => c.node(ty, "", "", offset)?,
        _ => return Err(ParseError::new(offset, "a scope must be a struct")),
    };
    c.read.resize(c.slots as usize, false);
    if let Node::Struct(s) = &root {
        for f in &s.fields {
            if let Node::Int(i) | Node::Enum(i, _) = &f.node {
                if extra_read.contains(&&*f.name) {
                    c.read[i.slot as usize] = true;
                }
            }
        }
    }
    root.finalize(&c.read);
    let unread = Unread((scope == PAYLOAD).then_some(&c.read[..]));
    let mut ops = fuse(ops_of(&root, unread));
    set_scope(&mut ops, scope);
    let plan = plan_of(&ops, scope);
    // Looked up once: a kernel trace compiles a thousand scopes.
    static DEBUG_PLAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *DEBUG_PLAN.get_or_init(|| std::env::var_os("CTF_DEBUG_PLAN").is_some()) {
        eprintln!("scope {scope}: ops {ops:?}\n  plan {plan:?}");
    }
    let offsets = fixed_offsets(&root);
    let direct = direct_fields(&root, offsets.is_some());
    Ok(Scope {
        root_align: root.align(),
        root,
        slots: c.slots,
        ops,
        plan,
        read: c.read,
        offsets,
        direct,
    })
}

/// [`Direct`] of each top-level field of `root`: integers up to the first
/// field whose size depends on the data, and character arrays of fully
/// fixed roots (`fixed`), exactly where the general path finds them.
fn direct_fields(root: &Node, fixed: bool) -> Box<[Direct]> {
    let Node::Struct(s) = root else {
        return Box::new([]);
    };
    let mut off = Some(0u64);
    let mut out = Vec::with_capacity(s.fields.len());
    for f in &s.fields {
        let at = off.and_then(|o| align_up(o, f.node.align()));
        out.push(match (&f.node, at) {
            (Node::Int(i) | Node::Enum(i, _), Some(at)) if (1..=64).contains(&i.size) => {
                Direct::Int {
                    off: at,
                    size: i.size,
                    signed: i.signed,
                    be: i.be,
                }
            }
            (Node::Array(a), Some(at)) if fixed && a.text && at % 8 == 0 && a.elem.align() <= 8 => {
                Direct::Text {
                    off: at,
                    len: a.len,
                }
            }
            (Node::Str, Some(at)) => Direct::Str { off: at },
            _ => Direct::Walk,
        });
        off = at
            .zip(f.node.fixed_size())
            .and_then(|(a, n)| a.checked_add(n));
    }
    out.into_boxed_slice()
}

fn fixed_offsets(root: &Node) -> Option<Vec<u64>> {
    let Node::Struct(s) = root else { return None };
    let mut off = 0u64;
    let mut out = Vec::with_capacity(s.fields.len());
    for f in &s.fields {
        off = align_up(off, f.node.align())?;
        out.push(off);
        off = off.checked_add(f.node.fixed_size()?)?;
    }
    Some(out)
}

fn display_name(raw: &str) -> &str {
    raw.strip_prefix('_').unwrap_or(raw)
}

impl Compiler<'_> {
    fn spend(&self, offset: usize) -> Result<(), ParseError> {
        let left = self.env.budget.get();
        if left == 0 {
            return Err(ParseError::new(
                offset,
                format!("metadata describes more than {MAX_NODES} fields"),
            ));
        }
        self.env.budget.set(left - 1);
        Ok(())
    }

    fn int(&mut self, ir: &IntIr, name: &str, offset: usize) -> Result<IntNode, ParseError> {
        let be = match ir.order {
            OrderSpec::Native => self.env.native_be,
            OrderSpec::Be => true,
            OrderSpec::Le => false,
        };
        let mut clock = false;
        if let Some(c) = &ir.clock {
            if !(self.env.clock_known)(c) {
                return Err(ParseError::new(
                    offset,
                    format!("`map` refers to unknown clock `{c}`"),
                ));
            }
            clock = true;
        }
        if self.implicit_clock && (name == "timestamp" || name == "timestamp_begin") {
            clock = true;
        }
        // The end timestamp of a packet is a snapshot, it does not move the
        // clock (babeltrace2 does the same).
        if self.scope == PACKET_CONTEXT && (name == "timestamp_end" || self.stack.len() > 1) {
            clock = false;
        }
        let slot = self.slots;
        self.slots += 1;
        Ok(IntNode {
            size: ir.size as u8,
            align: ir.align,
            signed: ir.signed,
            be,
            slot,
            clock,
            event_id: self.scope == EVENT_HEADER && name == "id",
        })
    }

    /// `name` is the displayed field name of this node (empty for array
    /// elements), `path` its flattened path.
    fn node(
        &mut self,
        ty: &Rc<TypeIr>,
        name: &str,
        path: &str,
        offset: usize,
    ) -> Result<Node, ParseError> {
        self.spend(offset)?;
        if self.depth >= MAX_NODE_DEPTH {
            return Err(ParseError::new(
                offset,
                format!("types nested deeper than {MAX_NODE_DEPTH} levels"),
            ));
        }
        self.depth += 1;
        let r = self.node_inner(ty, name, path, offset);
        self.depth -= 1;
        r
    }

    fn node_inner(
        &mut self,
        ty: &Rc<TypeIr>,
        name: &str,
        path: &str,
        offset: usize,
    ) -> Result<Node, ParseError> {
        Ok(match &**ty {
            TypeIr::Int(ir) => Node::Int(self.int(ir, name, offset)?),
            TypeIr::Enum {
                container,
                mappings,
            } => {
                let int = self.int(container, name, offset)?;
                let ranges: Vec<EnumRange> = mappings
                    .iter()
                    .map(|m| EnumRange {
                        lo: m.lo,
                        hi: m.hi,
                        label: Arc::from(m.label.as_str()),
                    })
                    .collect();
                Node::Enum(int, ranges.into())
            }
            TypeIr::Float {
                mant_dig,
                align,
                order,
                ..
            } => Node::Float {
                double: *mant_dig == 53,
                align: *align,
                be: match order {
                    OrderSpec::Native => self.env.native_be,
                    OrderSpec::Be => true,
                    OrderSpec::Le => false,
                },
            },
            TypeIr::String => Node::Str,
            TypeIr::Struct { fields, min_align } => {
                self.stack.push(Vec::with_capacity(fields.len()));
                let r = self.struct_fields(fields, path, offset);
                let done = self.stack.pop().unwrap_or_default();
                r?;
                let align = done
                    .iter()
                    .map(|f| f.node.align())
                    .fold(*min_align, u32::max);
                Node::Struct(StructNode {
                    align,
                    fields: done,
                    skip: None,
                })
            }
            TypeIr::Variant {
                tag,
                options,
                offset: at,
            } => {
                let Some(tag) = tag else {
                    return Err(ParseError::new(*at, "variant without a tag"));
                };
                let (tag_ref, ranges, tag_signed) = self.resolve_tag(tag, *at)?;
                let mut compiled = Vec::with_capacity(options.len());
                for (raw, oty) in options {
                    let oname = display_name(raw);
                    // The selected option stands for the variant itself in
                    // flattened paths (`v`, `v.member`), as babeltrace2
                    // prints it; the tag already says which one it is.
                    let node = self.node(oty, oname, path, *at)?;
                    compiled.push(Field {
                        name: Arc::from(oname),
                        path: Arc::from(path),
                        raw: raw.as_str().into(),
                        node,
                    });
                }
                let mut select = Vec::new();
                for r in ranges.iter() {
                    let found = compiled
                        .iter()
                        .position(|f| *f.raw == *r.label)
                        .or_else(|| {
                            compiled
                                .iter()
                                .position(|f| *f.name == *display_name(&r.label))
                        });
                    if let Some(i) = found {
                        select.push((r.lo, r.hi, i as u32));
                    }
                }
                Node::Variant(VariantNode {
                    tag: tag_ref,
                    tag_signed,
                    select,
                    options: compiled,
                })
            }
            TypeIr::Array { elem, len } => {
                let e = self.node(elem, "", "", offset)?;
                let text = is_text(elem);
                if e.fixed_size() == Some(0) && *len > MAX_EMPTY_ELEMENTS {
                    return Err(ParseError::new(
                        offset,
                        format!("array of {len} empty elements"),
                    ));
                }
                Node::Array(Box::new(ArrayNode {
                    elem: e,
                    len: *len,
                    text,
                    skip: None,
                }))
            }
            TypeIr::Sequence {
                elem,
                len,
                offset: at,
            } => {
                let (len_ref, signed) = self.resolve_int(len, *at)?;
                let e = self.node(elem, "", "", offset)?;
                Node::Sequence(Box::new(SeqNode {
                    elem: e,
                    len: len_ref,
                    len_signed: signed,
                    text: is_text(elem),
                    elem_skip: None,
                }))
            }
        })
    }

    fn struct_fields(
        &mut self,
        fields: &[(String, Rc<TypeIr>)],
        path: &str,
        offset: usize,
    ) -> Result<(), ParseError> {
        for (raw, fty) in fields {
            let name = display_name(raw);
            let fpath = join(path, name);
            let node = self.node(fty, name, &fpath, offset)?;
            if let Some(level) = self.stack.last_mut() {
                let name: Arc<str> = Arc::from(name);
                // A top-level field's path is its name: one allocation.
                let fpath = match fpath {
                    Cow::Borrowed(_) => name.clone(),
                    Cow::Owned(p) => Arc::from(p),
                };
                level.push(Field {
                    name,
                    path: fpath,
                    raw: raw.as_str().into(),
                    node,
                });
            }
        }
        Ok(())
    }

    fn resolve_int(&mut self, path: &[String], at: usize) -> Result<(SlotRef, bool), ParseError> {
        match self.resolve(path, at)? {
            Target::Int { r, signed, .. } => Ok((r, signed)),
            Target::Other => Err(ParseError::new(
                at,
                format!("`{}` is not an integer field", path.join(".")),
            )),
        }
    }

    fn resolve_tag(
        &mut self,
        path: &[String],
        at: usize,
    ) -> Result<(SlotRef, Arc<[EnumRange]>, bool), ParseError> {
        match self.resolve(path, at)? {
            Target::Int {
                r,
                signed,
                ranges: Some(ranges),
            } => Ok((r, ranges, signed)),
            _ => Err(ParseError::new(
                at,
                format!("variant tag `{}` is not an enumeration", path.join(".")),
            )),
        }
    }

    /// Finds the field a tag/length path names and marks its slot as read.
    fn resolve(&mut self, path: &[String], at: usize) -> Result<Target, ParseError> {
        const PREFIXES: [(&[&str], u8); 6] = [
            (&["trace", "packet", "header"], PACKET_HEADER),
            (&["stream", "packet", "context"], PACKET_CONTEXT),
            (&["stream", "event", "header"], EVENT_HEADER),
            (&["stream", "event", "context"], STREAM_EVENT_CONTEXT),
            (&["event", "context"], EVENT_CONTEXT),
            (&["event", "fields"], PAYLOAD),
        ];
        let absolute = PREFIXES
            .iter()
            .find(|(p, _)| path.len() > p.len() && path.iter().zip(p.iter()).all(|(a, b)| a == b));
        let (target_scope, rest) = match absolute {
            Some((p, s)) => (Some(*s), &path[p.len()..]),
            None => (None, path),
        };
        let scope = self.scope;
        let found: Option<(u8, &Node)> = match target_scope {
            Some(s) if s == scope => self
                .stack
                .first()
                .and_then(|root| lookup(root, rest))
                .map(|n| (s, n)),
            Some(s) => self.env.uppers[s as usize]
                .and_then(|sc| lookup(sc.fields(), rest))
                .map(|n| (s, n)),
            None => {
                let local = self
                    .stack
                    .iter()
                    .rev()
                    .find_map(|level| lookup(level, rest))
                    .map(|n| (scope, n));
                // Not CTF-strict, but some producers use relative paths to
                // reach an upper dynamic scope: try them, nearest first.
                local.or_else(|| {
                    (0..scope).rev().find_map(|s| {
                        self.env.uppers[s as usize]
                            .and_then(|sc| lookup(sc.fields(), rest))
                            .map(|n| (s, n))
                    })
                })
            }
        };
        let Some((s, node)) = found else {
            return Err(ParseError::new(
                at,
                format!("`{}` names no preceding field", path.join(".")),
            ));
        };
        let target = match node {
            Node::Int(i) => Target::Int {
                r: SlotRef {
                    scope: s,
                    slot: i.slot,
                },
                signed: i.signed,
                ranges: None,
            },
            Node::Enum(i, ranges) => Target::Int {
                r: SlotRef {
                    scope: s,
                    slot: i.slot,
                },
                signed: i.signed,
                ranges: Some(ranges.clone()),
            },
            _ => Target::Other,
        };
        if let Target::Int { r, .. } = &target {
            if s != scope {
                self.env.cross.borrow_mut().push((s, r.slot));
            }
            if s == scope {
                let slot = r.slot as usize;
                if self.read.len() <= slot {
                    self.read.resize(slot + 1, false);
                }
                self.read[slot] = true;
            }
        }
        Ok(target)
    }
}

enum Target {
    Int {
        r: SlotRef,
        signed: bool,
        ranges: Option<Arc<[EnumRange]>>,
    },
    Other,
}

/// Walks `path` from a list of sibling fields down through nested structs.
/// The last declared match wins (closest preceding field).
fn lookup<'n>(fields: &'n [Field], path: &[String]) -> Option<&'n Node> {
    let (first, rest) = path.split_first()?;
    let f = fields
        .iter()
        .rev()
        .find(|f| *f.raw == **first || *f.name == **first)?;
    if rest.is_empty() {
        return Some(&f.node);
    }
    match &f.node {
        Node::Struct(s) => lookup(&s.fields, rest),
        _ => None,
    }
}

/// The path of field `name` in `prefix` (itself at the top level).
fn join<'n>(prefix: &str, name: &'n str) -> Cow<'n, str> {
    if prefix.is_empty() {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(format!("{prefix}.{name}"))
    }
}

fn is_text(elem: &Rc<TypeIr>) -> bool {
    matches!(&**elem, TypeIr::Int(i) if i.text && i.size == 8)
}
