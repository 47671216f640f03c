//! One upstream query per question in flight: the first asker leads, and the others wait for
//! its reply — with a relay slot of their own, as any relayed query, or, joining a question
//! already in flight, without one: they send nothing, so they need none, and at a cold start
//! (every popular name missing at once) the slots stay for the questions that must be asked.
//! Those joining without a slot are bounded, per question and in all.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::oneshot;

use super::Shared;
use crate::relay_cache::Key;

/// Queries waiting for one question's reply without a slot, at most.
pub(super) const JOINED_PER_QUESTION: usize = 64;
/// Queries waiting without a slot, at most, in all: a few MiB of tasks.
const JOINED: usize = 4 * super::MAX_FORWARDS;

/// The questions in flight and who waits for each.
#[derive(Default)]
pub(super) struct Flights {
    waiting: Mutex<HashMap<Key, Question, foldhash::fast::RandomState>>,
    /// Waiting without a slot, now, in all.
    joined: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Question {
    waiters: Vec<oneshot::Sender<Shared>>,
    /// Of them, those without a slot.
    joined: usize,
}

/// What a query for a question is to do.
pub(super) enum Role<'a> {
    /// Ask it, and land the flight with the reply.
    Lead(Flight<'a>),
    /// Wait for the reply of the query that leads.
    Wait(oneshot::Receiver<Shared>),
}

impl Flights {
    /// Leads `key`'s flight, or waits for the one in flight.
    pub(super) fn enter<'a>(&'a self, key: &'a Key) -> Role<'a> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        match waiting.get_mut(key) {
            Some(question) => {
                let (sender, receiver) = oneshot::channel();
                question.waiters.push(sender);
                Role::Wait(receiver)
            }
            None => {
                waiting.insert(key.clone(), Question::default());
                Role::Lead(Flight { flights: self, key })
            }
        }
    }

    /// Waits, without a slot, for `key`'s flight, if it is in flight and the bounds allow.
    pub(super) fn join(&self, key: &Key) -> Option<Joined> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let question = waiting.get_mut(key)?;
        if question.joined >= JOINED_PER_QUESTION || self.joined.load(Ordering::Relaxed) >= JOINED {
            return None;
        }
        let (sender, receiver) = oneshot::channel();
        question.waiters.push(sender);
        question.joined += 1;
        self.joined.fetch_add(1, Ordering::Relaxed);
        Some(Joined { receiver, joined: Arc::clone(&self.joined) })
    }
}

/// A query that leads its question's flight; those waiting get nothing if it is dropped before
/// it lands (and ask again themselves next time).
pub(super) struct Flight<'a> {
    flights: &'a Flights,
    key: &'a Key,
}

impl Flight<'_> {
    /// Hands `reply` to those waiting.
    pub(super) fn land(self, reply: &Shared) {
        for waiter in self.take().map(|question| question.waiters).into_iter().flatten() {
            let _ = waiter.send(reply.clone());
        }
        std::mem::forget(self);
    }

    fn take(&self) -> Option<Question> {
        self.flights.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(self.key)
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.take();
    }
}

/// A query waiting for a flight without a slot; counted until dropped.
pub struct Joined {
    receiver: oneshot::Receiver<Shared>,
    joined: Arc<AtomicUsize>,
}

impl Joined {
    /// The flight's reply, within `wait` (`None`: the upstreams failed, or it did not land).
    pub(super) async fn reply(mut self, wait: Duration) -> Shared {
        tokio::time::timeout(wait, &mut self.receiver).await.ok().and_then(Result::ok).flatten()
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        self.joined.fetch_sub(1, Ordering::Relaxed);
    }
}
