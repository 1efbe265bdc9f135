//! A job's task inputs, one payload per task, held as the caller has them: a one-task job's
//! single payload needs no vector, and a service that submits the same inputs with every
//! request shares one list instead of copying a vector each time.
//!
//! The scheduler keeps a job's `Payloads` as they came (its task records hold none): a
//! task's launch clones its payload from them, its success lets go of it or puts its result
//! in its place, and the outcome's results are the job's vector itself. A vector the caller
//! builds is allocated on the caller's thread and freed on the driver's loop: a malloc and a
//! cross-thread free, about 230 instructions of a one-task job's cost (callgrind, `ci/cost`).

use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;

/// The inputs of a job's tasks, in task order (a task's index is its payload's). Reads as a
/// slice (`len`, `iter`, indexing); built from a `Vec<Bytes>`, a single `Bytes` (a one-task
/// job) or an `Arc<[Bytes]>` (inputs shared by many jobs: each job takes a clone of every
/// payload, which is a reference count, never a copy of the bytes).
#[derive(Clone, Default)]
pub struct Payloads(Held);

#[derive(Clone)]
enum Held {
    One(Bytes),
    Many(Vec<Bytes>),
    Shared(Arc<[Bytes]>),
}

impl Default for Held {
    fn default() -> Self {
        Held::Many(Vec::new())
    }
}

impl Payloads {
    /// Replaces payload `i` with `value` (a task's result, kept for the job's outcome): in
    /// place when held alone or in a vector; a shared list becomes this job's own vector
    /// first ([`own`](Self::own), once per job; the driver has its callers do that).
    pub(crate) fn replace(&mut self, i: usize, value: Bytes) {
        self.own();
        match self.own_mut(i) {
            Some(slot) => *slot = value,
            None => unreachable!("payload {i} of {}", self.len()),
        }
    }

    /// Makes a shared list this job's own vector (a reference count per payload), where a
    /// caller's thread can pay for it: a job that keeps results puts them in its payloads'
    /// places, and copying a big list at its first result would hold up the driver's loop.
    /// A vector or a single payload is left as it is.
    pub fn own(&mut self) {
        if let Held::Shared(shared) = &self.0 {
            self.0 = Held::Many(shared.to_vec());
        }
    }

    /// Lets go of payload `i` (its task succeeded and its result is not kept), so a big job's
    /// inputs are freed as it runs; a shared list's stay with it (others hold them).
    pub(crate) fn release(&mut self, i: usize) {
        if let Some(slot) = self.own_mut(i) {
            *slot = Bytes::new();
        }
    }

    /// How many payloads: read straight from how they are held, without the slice
    /// [`Deref`] builds (a match on the three forms) on every use.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.0 {
            Held::One(_) => 1,
            Held::Many(payloads) => payloads.len(),
            Held::Shared(payloads) => payloads.len(),
        }
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload `i`, if any: a single payload's without a slice built and bounds-checked
    /// (a one-task job's launch reads it so).
    #[inline]
    pub fn get(&self, i: usize) -> Option<&Bytes> {
        match &self.0 {
            Held::One(payload) => (i == 0).then_some(payload),
            Held::Many(payloads) => payloads.get(i),
            Held::Shared(payloads) => payloads.get(i),
        }
    }

    /// Payload `i`, to change, if this job holds it alone (not in a shared list).
    fn own_mut(&mut self, i: usize) -> Option<&mut Bytes> {
        match &mut self.0 {
            Held::One(payload) => (i == 0).then_some(payload),
            Held::Many(payloads) => payloads.get_mut(i),
            Held::Shared(_) => None,
        }
    }

    /// Whether these are the default's (no payload, no allocation): what dropping them does
    /// nothing for.
    pub(crate) fn is_unallocated(&self) -> bool {
        matches!(&self.0, Held::Many(payloads) if payloads.capacity() == 0)
    }

    /// The first payload over `bytes_max` bytes, if any: its index and size (a one-task job's
    /// looked at without a pass over a slice).
    pub fn first_over(&self, bytes_max: usize) -> Option<(usize, usize)> {
        match &self.0 {
            Held::One(payload) => (payload.len() > bytes_max).then_some((0, payload.len())),
            _ => super::types::first_over(self.iter(), bytes_max),
        }
    }

    /// Them as a vector: the one they came in if they came in one (nothing copied), else a
    /// new one.
    pub fn into_vec(self) -> Vec<Bytes> {
        match self.0 {
            Held::One(payload) => vec![payload],
            Held::Many(payloads) => payloads,
            Held::Shared(payloads) => payloads.to_vec(),
        }
    }
}

impl Deref for Payloads {
    type Target = [Bytes];

    fn deref(&self) -> &[Bytes] {
        match &self.0 {
            Held::One(payload) => std::slice::from_ref(payload),
            Held::Many(payloads) => payloads,
            Held::Shared(payloads) => payloads,
        }
    }
}

impl From<Vec<Bytes>> for Payloads {
    fn from(payloads: Vec<Bytes>) -> Self {
        Payloads(Held::Many(payloads))
    }
}

impl From<Bytes> for Payloads {
    /// One task's payload.
    fn from(payload: Bytes) -> Self {
        Payloads(Held::One(payload))
    }
}

impl From<Arc<[Bytes]>> for Payloads {
    fn from(payloads: Arc<[Bytes]>) -> Self {
        Payloads(Held::Shared(payloads))
    }
}

impl FromIterator<Bytes> for Payloads {
    fn from_iter<I: IntoIterator<Item = Bytes>>(payloads: I) -> Self {
        Payloads(Held::Many(payloads.into_iter().collect()))
    }
}

impl std::fmt::Debug for Payloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Payloads {
    fn eq(&self, other: &Payloads) -> bool {
        **self == **other
    }
}

impl Eq for Payloads {}

impl IntoIterator for Payloads {
    type Item = Bytes;
    type IntoIter = IntoIter;

    fn into_iter(self) -> IntoIter {
        IntoIter(match self.0 {
            Held::One(payload) => Taking::One(Some(payload)),
            Held::Many(payloads) => Taking::Many(payloads.into_iter()),
            Held::Shared(payloads) => Taking::Shared(payloads, 0),
        })
    }
}

/// The payloads of a [`Payloads`], taken in task order.
pub struct IntoIter(Taking);

enum Taking {
    One(Option<Bytes>),
    Many(std::vec::IntoIter<Bytes>),
    Shared(Arc<[Bytes]>, usize),
}

impl Iterator for IntoIter {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        match &mut self.0 {
            Taking::One(payload) => payload.take(),
            Taking::Many(payloads) => payloads.next(),
            Taking::Shared(payloads, next) => {
                let payload = payloads.get(*next)?.clone();
                *next += 1;
                Some(payload)
            }
        }
    }

    /// Each form's own loop (a vector's is the tight one), not a `match` per payload.
    fn fold<B, F: FnMut(B, Bytes) -> B>(self, init: B, mut f: F) -> B {
        match self.0 {
            Taking::One(payload) => payload.into_iter().fold(init, f),
            Taking::Many(payloads) => payloads.fold(init, f),
            Taking::Shared(payloads, next) => {
                let left = payloads.get(next..).unwrap_or_default();
                left.iter()
                    .fold(init, |acc, payload| f(acc, payload.clone()))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = match &self.0 {
            Taking::One(payload) => usize::from(payload.is_some()),
            Taking::Many(payloads) => payloads.len(),
            Taking::Shared(payloads, next) => payloads.len().saturating_sub(*next),
        };
        (left, Some(left))
    }
}

impl ExactSizeIterator for IntoIter {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_reads_and_yields_the_same_payloads_in_order() {
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        let forms = [
            Payloads::from(vec![a.clone(), b.clone()]),
            Payloads::from(Arc::<[Bytes]>::from(vec![a.clone(), b.clone()])),
        ];
        for p in forms {
            assert_eq!((p.len(), &p[..]), (2, &[a.clone(), b.clone()][..]));
            assert_eq!(p, Payloads::from(vec![a.clone(), b.clone()]));
            let mut each = p.into_iter();
            assert_eq!(each.len(), 2);
            assert_eq!(each.next(), Some(a.clone()));
            assert_eq!(each.len(), 1);
            assert_eq!((each.next(), each.next()), (Some(b.clone()), None));
        }
        let one = Payloads::from(a.clone());
        assert_eq!((one.len(), one.first()), (1, Some(&a)));
        assert_eq!(one.into_iter().collect::<Vec<_>>(), [a]);
        let vector = vec![Bytes::from(vec![1u8; 8])];
        let at = vector.as_ptr();
        let back = Payloads::from(vector).into_vec();
        assert_eq!(back.as_ptr(), at, "the same vector, not a copy");
        let x = Bytes::from_static(b"x");
        assert_eq!(Payloads::from(x.clone()).into_vec(), [x], "a new vector");
        let none = Payloads::default();
        assert!(none.is_empty());
        assert_eq!(none.into_iter().next(), None);
    }

    #[test]
    fn results_replace_payloads_in_every_form_and_released_ones_are_freed() {
        let (a, b, r) = (
            Bytes::from_static(b"a"),
            Bytes::from_static(b"b"),
            Bytes::from_static(b"result"),
        );
        let shared: Arc<[Bytes]> = Arc::from(vec![a.clone(), b.clone()]);
        let forms = [
            Payloads::from(vec![a.clone(), b.clone()]),
            Payloads::from(shared.clone()),
        ];
        for mut p in forms {
            p.replace(1, r.clone());
            assert_eq!(&p[..], &[a.clone(), r.clone()][..]);
            p.release(0);
            assert_eq!(p.into_vec(), [Bytes::new(), r.clone()]);
        }
        assert_eq!(
            &shared[..],
            &[a.clone(), b.clone()][..],
            "a shared list is left alone"
        );
        let mut owned = Payloads::from(shared.clone());
        owned.own();
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "the handles copied, the list let go"
        );
        assert_eq!(&owned[..], &shared[..]);
        let mut shared_job = Payloads::from(shared.clone());
        shared_job.release(0);
        assert_eq!(shared_job[0], a, "released: still the shared list's");
        let mut one = Payloads::from(a.clone());
        one.replace(0, r.clone());
        assert_eq!(one.into_vec(), [r]);
        let mut one = Payloads::from(a);
        one.release(0);
        assert!(one[0].is_empty());
    }

    #[test]
    fn a_shared_list_is_not_copied_by_the_jobs_that_take_it() {
        let shared: Arc<[Bytes]> = Arc::from(vec![Bytes::from(vec![7u8; 64])]);
        let job = Payloads::from(shared.clone());
        assert_eq!(Arc::strong_count(&shared), 2);
        let taken: Vec<Bytes> = job.into_iter().collect();
        assert_eq!(taken[0].as_ptr(), shared[0].as_ptr(), "the same bytes");
        assert_eq!(Arc::strong_count(&shared), 1, "the job let go of the list");
    }
}
