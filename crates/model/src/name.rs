//! [`Name`]: the text of a small vocabulary (event, system call, interrupt
//! handler, device names) that millions of events carry.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, Mutex};

/// A name shared by every event that carries it, interned for the life of
/// the process: cloning and dropping one costs nothing.
///
/// An `Arc<str>` per event costs an atomic increment and decrement, which
/// measured as much as decoding the event. A kernel's vocabulary is a few
/// thousand names, so keeping them for good costs little; past
/// [`Name::INTERNED_BYTES`] of distinct names (hostile or garbled input),
/// further names are reference counted instead, so memory stays bounded.
///
/// Equality, ordering and hashing are those of the text.
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    Interned(&'static str),
    Counted(Arc<str>),
}

struct Interner {
    names: HashSet<&'static str>,
    bytes: usize,
}

static INTERNER: Mutex<Option<Interner>> = Mutex::new(None);

impl Name {
    /// The most bytes of text kept for the life of the process.
    pub const INTERNED_BYTES: usize = 16 << 20;

    /// The name with this text (looked up in a process-wide table: meant
    /// for once per event class or per distinct value, not once per event).
    pub fn new(text: &str) -> Name {
        // A poisoned lock only means another thread panicked while
        // inserting; the table is still valid.
        let mut guard = INTERNER.lock().unwrap_or_else(|p| p.into_inner());
        let table = guard.get_or_insert_with(|| Interner {
            names: HashSet::new(),
            bytes: 0,
        });
        if let Some(&s) = table.names.get(text) {
            return Name(Repr::Interned(s));
        }
        if table.bytes + text.len() > Self::INTERNED_BYTES {
            return Name(Repr::Counted(Arc::from(text)));
        }
        let s: &'static str = Box::leak(Box::from(text));
        table.names.insert(s);
        table.bytes += s.len();
        Name(Repr::Interned(s))
    }

    /// The name of these bytes, invalid UTF-8 replaced.
    pub fn from_utf8_lossy(bytes: &[u8]) -> Name {
        Name::new(&String::from_utf8_lossy(bytes))
    }

    /// [`Name::from_utf8_lossy`] for once per event (a name read from an
    /// event's payload: irq handler, device): a small per-thread cache of
    /// recent names answers without taking the process-wide lock.
    pub fn from_utf8_cached(bytes: &[u8]) -> Name {
        const WAYS: usize = 256;
        thread_local! {
            static RECENT: RefCell<Vec<Option<Name>>> = RefCell::new(vec![None; WAYS]);
        }
        if bytes.len() > 64 {
            return Name::from_utf8_lossy(bytes);
        }
        // FNV-1a picks the way; the entry is checked against the text.
        let mut h: u32 = 0x811c_9dc5;
        for &b in bytes {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
        let way = h as usize % WAYS;
        RECENT
            .try_with(|recent| {
                let mut recent = recent.borrow_mut();
                match &recent[way] {
                    Some(n) if n.as_bytes() == bytes => n.clone(),
                    _ => {
                        let n = Name::from_utf8_lossy(bytes);
                        // Valid UTF-8 only, so that the comparison above
                        // is exact.
                        if n.as_bytes() == bytes {
                            recent[way] = Some(n.clone());
                        }
                        n
                    }
                }
            })
            .unwrap_or_else(|_| Name::from_utf8_lossy(bytes))
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Interned(s) => s,
            Repr::Counted(s) => s,
        }
    }

    /// Whether both are the same text at the same address (an interned
    /// name is one address for the whole process).
    pub fn ptr_eq(&self, other: &Name) -> bool {
        std::ptr::eq(self.as_str(), other.as_str())
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Name {
        Name::new(text)
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.ptr_eq(other) || self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_per_text() {
        let a = Name::new("sched_switch");
        let b = Name::from_utf8_lossy(b"sched_switch");
        assert!(a.ptr_eq(&b));
        assert_eq!(a, b);
        assert_eq!(&*a, "sched_switch");
        assert_ne!(a, Name::new("sched_waking"));
        assert_eq!(Name::from_utf8_lossy(b"a\xffb").as_str(), "a\u{fffd}b");
        assert!(Name::from_utf8_cached(b"sched_switch").ptr_eq(&a));
        assert!(
            Name::from_utf8_cached(b"sched_switch").ptr_eq(&a),
            "from the cache"
        );
        assert_eq!(Name::from_utf8_cached(b"a\xffb").as_str(), "a\u{fffd}b");
    }

    #[test]
    fn texts_past_the_budget_are_counted_not_kept() {
        let big = "x".repeat(Name::INTERNED_BYTES + 1);
        let a = Name::new(&big);
        let b = Name::new(&big);
        assert_eq!(a, b);
        assert!(!a.ptr_eq(&b), "not interned: each is its own allocation");
    }
}
