//! Shared ownership of a packet by its events, without an atomic operation
//! per event.
//!
//! Every event keeps its packet alive (its fields are decoded lazily from
//! the packet bytes), so the packet is reference counted. With `Arc`, each
//! event costs an atomic increment and an atomic decrement, which on the
//! machines we measured cost more than decoding the event. Here:
//!
//! - the stream reader ([`Owner`]) takes references in batches: one atomic
//!   `fetch_add` buys [`BATCH`] references, handed out one by one
//!   ([`Owner::share`]) with plain arithmetic;
//! - an event dropped on the thread that created the packet, while the
//!   reader still holds the packet, does not touch the counter either: the
//!   decrement is noted in a small thread-local table and applied, all at
//!   once, when the reader releases the packet ([`Owner::release`]) or when
//!   the table needs the room;
//! - any other drop (another thread, packet already released) is an atomic
//!   decrement, as with `Arc`.
//!
//! The counter therefore never goes below the true number of references:
//! deferred decrements only make the packet live longer, never shorter.
//! Memory stays bounded: a packet's deferred decrements are applied when the
//! reader leaves it, or (if the reader moved to another thread meanwhile)
//! when that table slot is reused or the thread exits.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

/// References bought per atomic operation.
const BATCH: usize = 1 << 12;
/// Slots of the thread-local table of deferred decrements.
const TABLE: usize = 16;

struct Shared<T> {
    count: AtomicUsize,
    /// True until the owner releases the packet. Only consulted on the
    /// owner's thread (anywhere else a drop is atomic anyway).
    held: AtomicBool,
    /// The creating thread's table ([`Deferred`] address; 0: none).
    owner: usize,
    /// The slot of that table this packet's deferred decrements go to.
    slot: usize,
    value: T,
}

/// The stream reader's handle on its current packet.
pub(crate) struct Owner<T> {
    ptr: NonNull<Shared<T>>,
    /// References bought (counted in `count`) and not handed out yet.
    credits: usize,
}

/// An event's handle on its packet: like `Arc<T>`.
pub(crate) struct PacketRef<T> {
    ptr: NonNull<Shared<T>>,
}

// SAFETY: like `Arc<T>`: a `PacketRef` only gives `&T`, and the counting is
// atomic wherever it can race (see the module docs).
unsafe impl<T: Send + Sync> Send for PacketRef<T> {}
unsafe impl<T: Send + Sync> Sync for PacketRef<T> {}
// SAFETY: as above; the owner's own fields are plain data it alone touches.
unsafe impl<T: Send + Sync> Send for Owner<T> {}
unsafe impl<T: Send + Sync> Sync for Owner<T> {}

thread_local! {
    static DEFERRED: Deferred = const {
        Deferred {
            slots: [const { Slot::empty() }; TABLE],
            next: Cell::new(0),
        }
    };
}

/// Per-thread deferred decrements, one packet per slot. Its address also
/// identifies the thread (unique among running threads).
struct Deferred {
    slots: [Slot; TABLE],
    /// Slot for the next packet created on this thread (round robin, so
    /// that up to TABLE packets in use at once never share a slot).
    next: Cell<usize>,
}

/// `n` decrements owed to the `Shared<T>` at `ptr`, applied by `flush`
/// (`flush_shared::<T>`).
struct Slot {
    ptr: Cell<usize>,
    n: Cell<usize>,
    flush: Cell<fn(usize, usize)>,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            ptr: Cell::new(0),
            n: Cell::new(0),
            flush: Cell::new(flush_nothing),
        }
    }

    fn apply(&self) {
        let (ptr, n) = (self.ptr.replace(0), self.n.replace(0));
        if ptr != 0 && n != 0 {
            (self.flush.get())(ptr, n);
        }
    }
}

fn flush_nothing(_: usize, _: usize) {}

impl Drop for Deferred {
    fn drop(&mut self) {
        for slot in &self.slots {
            slot.apply();
        }
    }
}

/// Applies `n` decrements to the `Shared<T>` at `ptr`, freeing it when
/// that was the last reference.
fn flush_shared<T>(ptr: usize, n: usize) {
    // SAFETY: the decrements to apply are still counted, so it is alive.
    let shared = unsafe { &*(ptr as *const Shared<T>) };
    if shared.count.fetch_sub(n, Ordering::Release) == n {
        fence(Ordering::Acquire);
        // SAFETY: that was the last reference; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(ptr as *mut Shared<T>) });
    }
}

impl<T> Owner<T> {
    pub fn new(value: T) -> Owner<T> {
        let (owner, slot) = DEFERRED
            .try_with(|d| {
                let slot = d.next.get();
                d.next.set((slot + 1) % TABLE);
                (d as *const Deferred as usize, slot)
            })
            .unwrap_or((0, 0));
        let shared = Box::new(Shared {
            count: AtomicUsize::new(1),
            held: AtomicBool::new(true),
            owner,
            slot,
            value,
        });
        Owner {
            // SAFETY: Box::into_raw never returns null.
            ptr: unsafe { NonNull::new_unchecked(Box::into_raw(shared)) },
            credits: 0,
        }
    }

    #[inline(always)]
    pub fn get(&self) -> &T {
        // SAFETY: the owner's own reference keeps it alive.
        unsafe { &self.ptr.as_ref().value }
    }

    /// A new reference for an event.
    #[inline(always)]
    pub fn share(&mut self) -> PacketRef<T> {
        if self.credits == 0 {
            // SAFETY: alive (see `get`).
            let shared = unsafe { self.ptr.as_ref() };
            shared.count.fetch_add(BATCH, Ordering::Relaxed);
            self.credits = BATCH;
        }
        self.credits -= 1;
        PacketRef { ptr: self.ptr }
    }

    /// Gives up the owner's reference (and unused credits). Returns the
    /// packet when nothing else refers to it any more, so that its buffers
    /// can be reused.
    pub fn release(self) -> Option<T> {
        let this = std::mem::ManuallyDrop::new(self);
        let ptr = this.ptr.as_ptr();
        // SAFETY: alive until the decrement below.
        let shared = unsafe { &*ptr };
        shared.held.store(false, Ordering::Relaxed);
        // This thread's deferred decrements of it, if it is the creator.
        let deferred = DEFERRED
            .try_with(|d| {
                let slot = &d.slots[shared.slot];
                if shared.owner == d as *const Deferred as usize && slot.ptr.get() == ptr as usize {
                    slot.ptr.set(0);
                    slot.n.replace(0)
                } else {
                    0
                }
            })
            .unwrap_or(0);
        let n = 1 + this.credits + deferred;
        if shared.count.fetch_sub(n, Ordering::Release) == n {
            fence(Ordering::Acquire);
            // SAFETY: that was the last reference; it came from Box::into_raw.
            let shared = unsafe { Box::from_raw(ptr) };
            return Some(shared.value);
        }
        None
    }
}

impl<T> Drop for Owner<T> {
    fn drop(&mut self) {
        let owner = Owner {
            ptr: self.ptr,
            credits: self.credits,
        };
        drop(owner.release());
    }
}

impl<T> PacketRef<T> {
    #[inline(always)]
    pub fn get(&self) -> &T {
        // SAFETY: this reference is counted, so the packet is alive.
        unsafe { &self.ptr.as_ref().value }
    }
}

impl<T> Drop for PacketRef<T> {
    #[inline]
    fn drop(&mut self) {
        let addr = self.ptr.as_ptr() as usize;
        // SAFETY: this reference is counted, so the packet is alive.
        let shared = unsafe { self.ptr.as_ref() };
        let deferred = DEFERRED.try_with(|d| {
            if shared.owner != d as *const Deferred as usize || !shared.held.load(Ordering::Relaxed)
            {
                return false;
            }
            let slot = &d.slots[shared.slot];
            if slot.ptr.get() == addr {
                slot.n.set(slot.n.get() + 1);
            } else {
                // Make room: apply the decrements noted for another packet.
                slot.apply();
                slot.ptr.set(addr);
                slot.n.set(1);
                slot.flush.set(flush_shared::<T>);
            }
            true
        });
        if !matches!(deferred, Ok(true)) {
            flush_shared::<T>(addr, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    type Packet = Vec<u8>;

    fn packet(tag: u8) -> Packet {
        vec![tag; 4]
    }

    #[test]
    fn buffer_comes_back_when_every_event_is_gone() {
        let mut owner = Owner::new(packet(1));
        let refs: Vec<PacketRef<Packet>> = (0..10_000).map(|_| owner.share()).collect();
        assert!(refs.iter().all(|r| r.get()[0] == 1));
        drop(refs);
        let back = owner.release().expect("no reference left");
        assert_eq!(back, vec![1; 4]);
    }

    #[test]
    fn events_outlive_the_owner() {
        let mut owner = Owner::new(packet(2));
        let r = owner.share();
        let r2 = owner.share();
        assert!(owner.release().is_none());
        assert_eq!(r.get()[0], 2);
        drop(r);
        assert_eq!(r2.get()[0], 2);
        drop(r2); // frees (checked by Miri / sanitizers, and by not crashing)
    }

    #[test]
    fn drops_on_other_threads_and_many_packets() {
        let mut owners: Vec<Owner<Packet>> = (0..40).map(|i| Owner::new(packet(i))).collect();
        let mut refs = Vec::new();
        for (i, o) in owners.iter_mut().enumerate() {
            for _ in 0..(i * 7 % 13 + 1) {
                refs.push(o.share());
            }
        }
        let (here, there): (Vec<_>, Vec<_>) =
            refs.into_iter().enumerate().partition(|(i, _)| i % 3 != 0);
        let there: Vec<PacketRef<Packet>> = there.into_iter().map(|(_, r)| r).collect();
        let handle = std::thread::spawn(move || {
            let sum: u32 = there.iter().map(|r| r.get()[0] as u32).sum();
            drop(there);
            sum
        });
        // Interleave drops here with releases of some owners.
        let mut kept = Vec::new();
        for (i, (_, r)) in here.into_iter().enumerate() {
            if i % 2 == 0 {
                drop(r);
            } else {
                kept.push(r);
            }
        }
        let _ = handle.join().unwrap();
        let released: Vec<Option<Packet>> = owners.drain(..20).map(Owner::release).collect();
        drop(kept);
        drop(released);
        drop(owners); // the rest released by Drop
    }

    #[test]
    fn reference_moved_to_thread_that_outlives_packet_release() {
        let mut owner = Owner::new(packet(3));
        let r = owner.share();
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let h = std::thread::spawn(move || {
            s.store(r.get()[0] as usize, Ordering::SeqCst);
            drop(r);
        });
        h.join().unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert!(owner.release().is_some());
    }
}
