//! The fast path of event decoding: the layouts of the common cases (fixed
//! runs of integers, strings, LTTng's compact and large event headers)
//! compiled into flat descriptions that a tight loop executes with one
//! bounds check per run.
//!
//! Anything unusual (short data, an unknown id, a shape not covered) makes
//! the fast path give up on that event; the stream reader then decodes it
//! step by step ([`crate::decode::Walker::run`]), which reports errors
//! exactly. Both paths leave the same state (slots, clock).

use crate::decode::{find_nul, read_bits};
use crate::layout::{ClassFast, Fixed, FixedInt, Plan, ReadKind, Step, Tagged, NO_SLOT, SCOPES};

/// How an integer is read, relative to the aligned start of its run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Load {
    off: u64,
    /// Whole bytes, little endian: the value is the low bits (`mask`) of
    /// the eight bytes at its position (read at once when they are there).
    le: bool,
    mask: u64,
    be: bool,
    size: u8,
    scope: u8,
    slot: u32,
    /// For a clock integer: what one wrap adds (0 for 64 bits: no wrap).
    wrap: u64,
    /// Shift that sign-extends the value (0: unsigned).
    sext: u32,
}

impl Load {
    fn of(i: &FixedInt) -> Load {
        Load {
            off: i.off,
            le: matches!(i.read, ReadKind::Bytes(_)) && !i.be,
            mask: u64::MAX >> (64 - i.size as u32),
            be: i.be,
            size: i.size,
            scope: i.scope,
            slot: i.slot,
            wrap: if i.size >= 64 { 0 } else { 1u64 << i.size },
            sext: if i.signed { 64 - i.size as u32 } else { 0 },
        }
    }

    /// The raw value, when the eight bytes at its position are known to
    /// be inside `data` (`eight`).
    ///
    /// # Safety
    /// As [`Load::raw`]; and when `eight`, `start / 8 + off / 8 + 8 <=
    /// data.len()`.
    #[inline(always)]
    unsafe fn raw8(&self, data: &[u8], start: u64, eight: bool) -> u64 {
        if self.le && eight {
            let at = ((start + self.off) >> 3) as usize;
            let v = data.as_ptr().add(at).cast::<u64>().read_unaligned();
            return u64::from_le(v) & self.mask;
        }
        self.raw(data, start)
    }

    /// The clock after this integer (a clock field) read `v` (CTF 8: an
    /// N-bit field replaces the low N bits; a smaller value than before
    /// means one wrap-around).
    #[inline(always)]
    fn next_clock(&self, clock: u64, v: u64) -> u64 {
        let next = (clock & !self.mask) | v;
        if v < clock & self.mask {
            next.wrapping_add(self.wrap)
        } else {
            next
        }
    }

    /// The raw (unsigned, not sign-extended) value at `start + off`.
    ///
    /// # Safety
    /// The integer must lie inside `data` (`start + off + size <= len * 8`).
    #[inline(always)]
    unsafe fn raw(&self, data: &[u8], start: u64) -> u64 {
        let bit = start + self.off;
        let at = (bit >> 3) as usize;
        if self.le && at + 8 <= data.len() {
            let v = data.as_ptr().add(at).cast::<u64>().read_unaligned();
            return u64::from_le(v) & self.mask;
        }
        read_bits(data, bit, self.size, self.be)
    }

    #[inline(always)]
    fn value(&self, raw: u64) -> u64 {
        (((raw << self.sext) as i64) >> self.sext) as u64
    }

    /// Reads it and stores its value in its slot.
    ///
    /// # Safety
    /// As [`Load::raw8`].
    #[inline(always)]
    unsafe fn store(&self, cx: &mut Cx, data: &[u8], start: u64, eight: bool) {
        let v = self.value(self.raw8(data, start, eight));
        if let Some(s) = cx.slots[self.scope as usize].get_mut(self.slot as usize) {
            *s = v;
        }
    }
}

/// What the fast path changes: the stream clock and the event id (local
/// copies of the walker's, kept in registers), and the walker's slots.
pub(crate) struct Cx<'a> {
    pub clock: u64,
    pub event_id: Option<u64>,
    pub slots: &'a mut [Vec<u64>; SCOPES],
}

impl Cx<'_> {
    #[inline(always)]
    fn clock(&mut self, l: &Load, v: u64) {
        self.clock = l.next_clock(self.clock, v);
    }
}

/// A fixed run: alignment, size, and its integers by role.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    mask: u64,
    bits: u64,
    /// Integers whose slot someone reads.
    stores: Box<[Load]>,
    /// The one store, when it is the only integer (the commonest run with
    /// integers: a thread id context).
    one: Option<Load>,
    /// Whether some integer moves the clock or sets the event id.
    special: bool,
    /// Integers that move the clock, in order.
    clocks: Box<[Load]>,
    /// Integers that set the event id (the last one wins).
    ids: Box<[Load]>,
}

impl Run {
    pub fn of(f: &Fixed) -> Run {
        let pick = |keep: fn(&FixedInt) -> bool| -> Box<[Load]> {
            f.ints.iter().filter(|i| keep(i)).map(Load::of).collect()
        };
        let clocks = pick(|i| i.clock);
        let ids = pick(|i| i.event_id);
        let stores = pick(|i| i.slot != NO_SLOT);
        let special = !clocks.is_empty() || !ids.is_empty();
        Run {
            mask: f.align as u64 - 1,
            bits: f.bits,
            one: match &stores[..] {
                [one] if !special => Some(*one),
                _ => None,
            },
            stores,
            special,
            clocks,
            ids,
        }
    }

    /// Moves over the run at `*pos`: its aligned start, or None (nothing
    /// moved) when it does not end by `end`, which must be at most
    /// `data.len() * 8`.
    #[inline(always)]
    fn run(&self, cx: &mut Cx, data: &[u8], pos: &mut u64, end: u64) -> Option<u64> {
        debug_assert!(end <= data.len() as u64 * 8);
        // Positions are below 2^61 (bits of a slice), no overflow.
        let start = (*pos + self.mask) & !self.mask;
        let stop = start.checked_add(self.bits)?;
        if stop > end {
            return None;
        }
        // Eight bytes readable at every integer of the run.
        let eight = (stop >> 3) + 8 <= data.len() as u64;
        // SAFETY (all `raw8` and `store` calls): every integer lies in
        // [start, stop), stop <= end <= data.len() * 8, and `eight` as
        // computed.
        if let Some(l) = &self.one {
            unsafe { l.store(cx, data, start, eight) };
            *pos = stop;
            return Some(start);
        }
        for l in self.stores.iter() {
            unsafe { l.store(cx, data, start, eight) };
        }
        if self.special {
            for l in self.clocks.iter() {
                cx.clock(l, unsafe { l.raw8(data, start, eight) });
            }
            for l in self.ids.iter() {
                cx.event_id = Some(unsafe { l.raw8(data, start, eight) });
            }
        }
        *pos = stop;
        Some(start)
    }
}

/// A fast step: a fixed run or a NUL-terminated string.
#[derive(Clone, Debug)]
pub(crate) enum FastStep {
    Run(Run),
    Str,
}

impl FastStep {
    /// Its (aligned) start, or None.
    #[inline(always)]
    fn run(&self, cx: &mut Cx, data: &[u8], pos: &mut u64, end: u64) -> Option<u64> {
        match self {
            FastStep::Run(r) => r.run(cx, data, pos, end),
            FastStep::Str => {
                let from = pos.div_ceil(8);
                let to = (end / 8) as usize;
                let n = data.get(from as usize..to).and_then(find_nul)?;
                *pos = (from + n as u64 + 1) * 8;
                Some(from * 8)
            }
        }
    }
}

/// An event header the fast way.
#[derive(Debug)]
pub(crate) enum HeaderFast {
    Nothing,
    Steps(Box<[FastStep]>),
    /// A tag (LTTng: `id`, 5 or 16 bits) selecting one of a few fixed
    /// options (LTTng: `compact` with a short timestamp, `extended` with
    /// a 32-bit id and a 64-bit timestamp).
    Tagged {
        head: Run,
        tag: Load,
        /// (lo, hi, option) on the tag value.
        select: Box<[(u64, u64, Option<Run>)]>,
    },
    /// LTTng's compact and large headers exactly: a tag that is the event
    /// id; tags up to `compact_hi` are followed by a clock integer, tag
    /// `ext_tag` by an id integer and a clock integer.
    Lttng(Box<Lttng>),
    /// Another shape: the generic plan (see [`Walker::plan_ok`]).
    Generic,
}

#[derive(Debug)]
pub(crate) struct Lttng {
    mask: u64,
    head_bits: u64,
    tag: Load,
    compact_hi: u64,
    compact: (u64, u64, Load),
    ext_tag: u64,
    extended: (u64, u64, Load, Load),
}

impl Lttng {
    /// The shape of `t` when it is exactly LTTng's (see [`HeaderFast::Lttng`]).
    fn of(t: &Tagged) -> Option<Lttng> {
        let only = |f: &Fixed, n: usize| (f.ints.len() == n).then_some(());
        only(&t.head, 1)?;
        let tag = &t.head.ints[0];
        if tag.slot != t.tag_slot || !tag.event_id || tag.clock || tag.signed {
            return None;
        }
        let [(0, compact_hi, c), (ext_lo, ext_hi, e)] = t.select[..] else {
            return None;
        };
        if ext_lo != ext_hi || ext_lo <= compact_hi {
            return None;
        }
        let compact = t.options.get(c as usize)?.as_ref()?;
        let extended = t.options.get(e as usize)?.as_ref()?;
        only(compact, 1)?;
        only(extended, 2)?;
        // Small runs: no overflow in `run`'s position arithmetic.
        if [&t.head, compact, extended]
            .iter()
            .any(|f| f.bits > 1024 || f.align > 1024)
        {
            return None;
        }
        let plain = |i: &FixedInt| i.slot == NO_SLOT && !i.signed;
        let ts = &compact.ints[0];
        let (id, ets) = (&extended.ints[0], &extended.ints[1]);
        let ok = plain(ts)
            && ts.clock
            && !ts.event_id
            && plain(id)
            && id.event_id
            && !id.clock
            && plain(ets)
            && ets.clock
            && !ets.event_id;
        ok.then(|| Lttng {
            mask: t.head.align as u64 - 1,
            head_bits: t.head.bits,
            tag: Load::of(tag),
            compact_hi,
            compact: (compact.align as u64 - 1, compact.bits, Load::of(ts)),
            ext_tag: ext_lo,
            extended: (
                extended.align as u64 - 1,
                extended.bits,
                Load::of(id),
                Load::of(ets),
            ),
        })
    }

    /// Decodes the header at `*pos`; `end` must be at most `data.len() *
    /// 8`. False on anything unusual.
    #[inline(always)]
    pub fn run(&self, cx: &mut Cx, data: &[u8], pos: &mut u64, end: u64) -> bool {
        debug_assert!(end <= data.len() as u64 * 8);
        let start = (*pos + self.mask) & !self.mask;
        let p = start + self.head_bits;
        if p > end {
            return false;
        }
        // Eight bytes readable anywhere in the header (runs are at most
        // 1024 bits, see `Lttng::of`).
        let eight = (start >> 3) + 3 * 128 + 8 <= data.len() as u64;
        // SAFETY: the tag lies in [start, p), p <= end <= data.len() * 8.
        let tag = unsafe { self.tag.raw8(data, start, eight) };
        if tag <= self.compact_hi {
            let (mask, bits, ts) = &self.compact;
            let s = (p + mask) & !mask;
            if s + bits > end {
                return false;
            }
            // SAFETY: the option lies in [s, s + bits).
            let v = unsafe { ts.raw8(data, s, eight) };
            cx.clock(ts, v);
            cx.event_id = Some(tag);
            *pos = s + bits;
            true
        } else if tag == self.ext_tag {
            let (mask, bits, id, ts) = &self.extended;
            let s = (p + mask) & !mask;
            if s + bits > end {
                return false;
            }
            // SAFETY: the option lies in [s, s + bits).
            unsafe {
                cx.event_id = Some(id.raw8(data, s, eight));
                let v = ts.raw8(data, s, eight);
                cx.clock(ts, v);
            }
            *pos = s + bits;
            true
        } else {
            false
        }
    }
}

impl HeaderFast {
    pub fn of(plan: &Plan, tag_read_elsewhere: bool) -> HeaderFast {
        match plan {
            Plan::Nothing => HeaderFast::Nothing,
            Plan::Fixed(f) => HeaderFast::Steps(Box::new([FastStep::Run(Run::of(f))])),
            Plan::Steps(steps) => HeaderFast::Steps(steps.iter().map(fast_step).collect()),
            Plan::Tagged(t) if !tag_read_elsewhere => match Lttng::of(t) {
                Some(l) => HeaderFast::Lttng(Box::new(l)),
                None => Self::tagged(t),
            },
            _ => HeaderFast::Generic,
        }
    }

    fn tagged(t: &Tagged) -> HeaderFast {
        let Some(tag) = t.head.ints.iter().find(|i| i.slot == t.tag_slot) else {
            return HeaderFast::Generic;
        };
        let mut head = Run::of(&t.head);
        // The tag is used right away; its slot is not needed afterwards.
        head.stores = head
            .stores
            .iter()
            .filter(|l| l.slot != t.tag_slot)
            .copied()
            .collect();
        let mut select = Vec::new();
        for &(lo, hi, i) in &t.select {
            match t.options.get(i as usize) {
                Some(o) => select.push((lo, hi, o.as_ref().map(Run::of))),
                None => return HeaderFast::Generic,
            }
        }
        HeaderFast::Tagged {
            head,
            tag: Load::of(tag),
            select: select.into(),
        }
    }

    /// Decodes the header at `*pos` (not for [`HeaderFast::Generic`]);
    /// false on anything unusual.
    #[inline(always)]
    pub fn run(&self, cx: &mut Cx, data: &[u8], pos: &mut u64, end: u64) -> bool {
        match self {
            HeaderFast::Nothing => true,
            HeaderFast::Steps(steps) => steps.iter().all(|s| s.run(cx, data, pos, end).is_some()),
            HeaderFast::Tagged { head, tag, select } => {
                let Some(start) = head.run(cx, data, pos, end) else {
                    return false;
                };
                // SAFETY: the head run (which holds the tag) fit.
                let tag = tag.value(unsafe { tag.raw(data, start) });
                for (lo, hi, option) in select.iter() {
                    if *lo <= tag && tag <= *hi {
                        return match option {
                            Some(r) => r.run(cx, data, pos, end).is_some(),
                            None => true,
                        };
                    }
                }
                false
            }
            HeaderFast::Lttng(l) => l.run(cx, data, pos, end),
            HeaderFast::Generic => false,
        }
    }
}

fn fast_step(s: &Step) -> FastStep {
    match s {
        Step::Fixed(f) => FastStep::Run(Run::of(f)),
        Step::Str => FastStep::Str,
    }
}

/// Where the payload starts in a [`ClassSteps`] program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PayloadAt {
    /// Where the program starts.
    Start,
    /// `off` bits after the aligned start of the first run.
    First(u64),
    /// At step `k` of `rest`: before it (None) or `off` bits after its
    /// aligned start.
    Rest(usize, Option<u64>),
    /// Where the program ends.
    End,
}

/// [`ClassFast`] the fast way: a first run (usually the contexts and the
/// start of the payload, or the whole of a fixed payload), then the rest.
#[derive(Debug)]
pub(crate) struct ClassSteps {
    first: Option<Run>,
    rest: Box<[FastStep]>,
    payload: PayloadAt,
    /// The commonest shape, a run of fixed layout whose integers nobody
    /// reads (most kernel events): (alignment mask, bits, payload offset
    /// from the aligned start, or None: the payload starts before the
    /// alignment).
    skip: Option<(u64, u64, Option<u64>)>,
}

impl ClassSteps {
    pub fn of(c: &ClassFast) -> ClassSteps {
        let mut steps: Vec<FastStep> = c.steps.iter().map(fast_step).collect();
        let first = match steps.first() {
            Some(FastStep::Run(_)) => match steps.remove(0) {
                FastStep::Run(r) => Some(r),
                FastStep::Str => None,
            },
            _ => None,
        };
        let shift = first.is_some() as usize;
        let payload = match (c.payload_step, c.payload_off) {
            (k, _) if k >= c.steps.len() => PayloadAt::End,
            (0, None) => PayloadAt::Start,
            (0, Some(off)) if first.is_some() => PayloadAt::First(off),
            (k, off) => PayloadAt::Rest(k - shift, off),
        };
        let skip = match (&first, &payload) {
            (Some(r), PayloadAt::First(off))
                if steps.is_empty() && r.stores.is_empty() && !r.special =>
            {
                Some((r.mask, r.bits, Some(*off)))
            }
            (Some(r), PayloadAt::Start)
                if steps.is_empty() && r.stores.is_empty() && !r.special =>
            {
                Some((r.mask, r.bits, None))
            }
            _ => None,
        };
        ClassSteps {
            first,
            rest: steps.into(),
            payload,
            skip,
        }
    }

    /// Decodes the stream event context, event context and payload at
    /// `*pos`: the payload's start (before its alignment), or None on
    /// anything unusual.
    #[inline(always)]
    pub fn run(&self, cx: &mut Cx, data: &[u8], pos: &mut u64, end: u64) -> Option<u64> {
        if let Some((mask, bits, off)) = self.skip {
            // Positions are below 2^61 (bits of a slice), runs small.
            let start = (*pos + mask) & !mask;
            let stop = start.checked_add(bits)?;
            if stop > end {
                return None;
            }
            let payload_at = off.map_or(*pos, |off| start + off);
            *pos = stop;
            return Some(payload_at);
        }
        let mut payload_at = *pos;
        if let Some(r) = &self.first {
            let start = r.run(cx, data, pos, end)?;
            if let PayloadAt::First(off) = self.payload {
                payload_at = start + off;
            }
        }
        for (k, step) in self.rest.iter().enumerate() {
            let at = *pos;
            let start = step.run(cx, data, pos, end)?;
            if let PayloadAt::Rest(j, off) = self.payload {
                if j == k {
                    payload_at = match off {
                        Some(off) => start + off,
                        None => at,
                    };
                }
            }
        }
        if self.payload == PayloadAt::End {
            payload_at = *pos;
        }
        Some(payload_at)
    }
}
