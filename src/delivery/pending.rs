//! Events read ahead of an endpoint's cursor: one per plant is sent at a time, so each
//! plant's events arrive in order, and the cursor moves only where it leaves no gap.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::Duration,
};

use plantstore_store::destinations::{Event, LogPosition};

/// Events read ahead of the cursor at most.
pub(super) const WINDOW: usize = 2048;

/// An event to send now or after `wait`: the one in flight for its plant.
#[derive(Debug)]
pub(super) struct EventToSend {
    pub(super) event: Event,
    pub(super) failures: u32,
    pub(super) wait: Duration,
    /// Whether the destination's recovery may cut the wait short (the probe always may).
    pub(super) may_wake: bool,
}

impl EventToSend {
    fn first(event: Event) -> Self {
        Self {
            event,
            failures: 0,
            wait: Duration::ZERO,
            may_wake: true,
        }
    }
}

struct Slot {
    position: LogPosition,
    entry: i64,
    /// Delivered, or not for this endpoint.
    done: bool,
}

pub(super) struct PendingEvents {
    window: VecDeque<Slot>,
    read_to: LogPosition,
    /// Plants with an event in flight or waiting for a retry; `behind`, their later events.
    busy: HashSet<i64>,
    behind: HashMap<i64, VecDeque<Event>>,
    ready: VecDeque<EventToSend>,
}

impl PendingEvents {
    pub(super) fn new(cursor: LogPosition) -> Self {
        Self {
            window: VecDeque::new(),
            read_to: cursor,
            busy: HashSet::new(),
            behind: HashMap::new(),
            ready: VecDeque::new(),
        }
    }

    pub(super) fn room(&self) -> usize {
        WINDOW - self.window.len()
    }

    pub(super) fn read_to(&self) -> LogPosition {
        self.read_to
    }

    /// Takes events just read, in log order; those the endpoint does not want are done now.
    pub(super) fn add(&mut self, events: Vec<Event>, wanted: impl Fn(&Event) -> bool) {
        for event in events {
            self.read_to = event.position;
            let wanted = wanted(&event);
            self.window.push_back(Slot {
                position: event.position,
                entry: event.entry.id,
                done: !wanted,
            });
            if !wanted {
                continue;
            }
            let plant = event.entry.plant_id;
            if self.busy.insert(plant) {
                self.ready.push_back(EventToSend::first(event));
            } else {
                self.behind.entry(plant).or_default().push_back(event);
            }
        }
    }

    /// The next event to send: the oldest of its plant's not yet delivered.
    pub(super) fn next_to_send(&mut self) -> Option<EventToSend> {
        self.ready.pop_front()
    }

    /// The event is delivered: the next of its plant's, if any, takes its turn.
    pub(super) fn delivered(&mut self, event: &Event) {
        if let Ok(at) = self
            .window
            .binary_search_by(|slot| slot.position.cmp(&event.position))
        {
            self.window[at].done = true;
        }
        let plant = event.entry.plant_id;
        match self.behind.get_mut(&plant).and_then(VecDeque::pop_front) {
            Some(next) => self.ready.push_back(EventToSend::first(next)),
            None => {
                self.behind.remove(&plant);
                self.busy.remove(&plant);
            }
        }
    }

    /// The event failed: it stays its plant's one in flight, tried again after `wait`.
    pub(super) fn retry(&mut self, event: Event, failures: u32, wait: Duration, may_wake: bool) {
        self.ready.push_back(EventToSend {
            event,
            failures,
            wait,
            may_wake,
        });
    }

    /// Drops the done events at the front; the last one's position and entry, if any.
    pub(super) fn take_done(&mut self) -> Option<(LogPosition, i64)> {
        let mut last = None;
        while let Some(slot) = self.window.front().filter(|slot| slot.done) {
            last = Some((slot.position, slot.entry));
            self.window.pop_front();
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use plantstore_store::{DeletionRecord, destinations::EventKind};

    use super::*;

    /// The delete logged as entry `id`, of `plant`, at log position `id`.
    fn deleted(id: i64, plant: i64) -> Event {
        Event {
            position: LogPosition {
                pos: id,
                kind: 0,
                seq: id,
            },
            kind: EventKind::PlantDeleted,
            entry: DeletionRecord {
                id,
                plant_id: plant,
                caller: "test".into(),
                request_id: format!("request-{id}"),
                idempotency_key: None,
                deleted_at: Utc::now(),
                snapshot: None,
                restored_at: None,
                restored_by: None,
            },
        }
    }

    fn ids_to_send(pending: &mut PendingEvents) -> Vec<i64> {
        std::iter::from_fn(|| pending.next_to_send())
            .map(|to_send| to_send.event.entry.id)
            .collect()
    }

    #[test]
    fn a_plants_next_event_waits_until_the_one_before_is_delivered() {
        let mut pending = PendingEvents::new(deleted(0, 0).position);
        pending.add(vec![deleted(1, 7), deleted(2, 8), deleted(3, 7)], |_| true);
        assert_eq!(ids_to_send(&mut pending), [1, 2]);
        pending.delivered(&deleted(2, 8));
        assert_eq!(ids_to_send(&mut pending), Vec::<i64>::new());
        pending.delivered(&deleted(1, 7));
        assert_eq!(ids_to_send(&mut pending), [3]);
    }

    #[test]
    fn a_failed_event_holds_back_its_plants_next() {
        let mut pending = PendingEvents::new(deleted(0, 0).position);
        pending.add(vec![deleted(1, 7), deleted(2, 7)], |_| true);
        let first = pending.next_to_send().expect("a dispatch");
        pending.retry(first.event, 1, Duration::from_millis(5), true);
        let again = pending.next_to_send().expect("the retry");
        assert_eq!(
            (again.event.entry.id, again.failures, again.wait),
            (1, 1, Duration::from_millis(5))
        );
        assert!(
            pending.next_to_send().is_none(),
            "entry 2 waits behind entry 1"
        );
    }

    #[test]
    fn the_cursor_moves_only_over_what_is_done_and_unwanted_events_are_done_at_once() {
        let mut pending = PendingEvents::new(deleted(0, 0).position);
        pending.add(
            vec![deleted(1, 1), deleted(2, 2), deleted(3, 3), deleted(4, 4)],
            |event| event.entry.id != 3,
        );
        assert_eq!(pending.read_to(), deleted(4, 4).position);
        assert_eq!(pending.room(), WINDOW - 4);
        pending.delivered(&deleted(2, 2));
        assert_eq!(pending.take_done(), None, "entry 1 is not delivered yet");
        pending.delivered(&deleted(1, 1));
        assert_eq!(pending.take_done(), Some((deleted(3, 3).position, 3)));
        assert_ne!(pending.room(), WINDOW);
        pending.delivered(&deleted(4, 4));
        assert_eq!(pending.take_done(), Some((deleted(4, 4).position, 4)));
        assert_eq!(pending.room(), WINDOW);
    }
}
