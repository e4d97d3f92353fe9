//! The events read ahead of an endpoint's cursor: whose plant's turn it is, which are
//! delivered, and how far the cursor may move without leaving a gap.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::Duration,
};

use plantstore_store::{Event, StreamPosition};

/// Events read ahead of the cursor at most.
pub(super) const WINDOW: usize = 2048;

/// An event whose plant's turn it is: its failures so far, and the wait before its next
/// attempt.
pub(super) type Turn = (Event, u32, Duration);

pub(super) struct ReadAhead {
    /// In stream order: each event's place, its entry, and whether it is done with.
    window: VecDeque<(StreamPosition, i64, bool)>,
    /// Where the next read starts.
    read_to: StreamPosition,
    /// Plants with an event in flight or waiting to be retried, and the events of theirs
    /// that wait behind it.
    busy: HashSet<i64>,
    behind: HashMap<i64, VecDeque<Event>>,
    ready: VecDeque<Turn>,
}

impl ReadAhead {
    pub(super) fn new(cursor: StreamPosition) -> Self {
        Self {
            window: VecDeque::new(),
            read_to: cursor,
            busy: HashSet::new(),
            behind: HashMap::new(),
            ready: VecDeque::new(),
        }
    }

    /// How many more events may be read now.
    pub(super) fn room(&self) -> usize {
        WINDOW - self.window.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    pub(super) fn read_to(&self) -> StreamPosition {
        self.read_to
    }

    /// Takes events just read, in stream order; those the endpoint does not want are done
    /// with at once.
    pub(super) fn add(&mut self, events: Vec<Event>, wanted: impl Fn(&Event) -> bool) {
        for event in events {
            self.read_to = event.position;
            let wanted = wanted(&event);
            self.window
                .push_back((event.position, event.entry.id, !wanted));
            if !wanted {
                continue;
            }
            let plant = event.entry.plant_id;
            if self.busy.insert(plant) {
                self.ready.push_back((event, 0, Duration::ZERO));
            } else {
                self.behind.entry(plant).or_default().push_back(event);
            }
        }
    }

    /// The next event whose plant's turn it is.
    pub(super) fn next_turn(&mut self) -> Option<Turn> {
        self.ready.pop_front()
    }

    /// The event is delivered: the next of its plant's, if any, takes its turn.
    pub(super) fn delivered(&mut self, event: &Event) {
        if let Ok(at) = self
            .window
            .binary_search_by(|(position, _, _)| position.cmp(&event.position))
        {
            self.window[at].2 = true;
        }
        let plant = event.entry.plant_id;
        match self.behind.get_mut(&plant).and_then(VecDeque::pop_front) {
            Some(next) => self.ready.push_back((next, 0, Duration::ZERO)),
            None => {
                self.behind.remove(&plant);
                self.busy.remove(&plant);
            }
        }
    }

    /// The event failed: it keeps its plant's turn, tried again after `wait`.
    pub(super) fn retry(&mut self, event: Event, failures: u32, wait: Duration) {
        self.ready.push_back((event, failures, wait));
    }

    /// Drops the events done with at the front; the last one's place and entry, if any:
    /// how far the cursor may move.
    pub(super) fn take_done(&mut self) -> Option<(StreamPosition, i64)> {
        let mut last = None;
        while let Some(&(position, entry, true)) = self.window.front() {
            last = Some((position, entry));
            self.window.pop_front();
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use plantstore_store::{DeletionRecord, EventKind};

    use super::*;

    /// The delete logged as entry `id`, of `plant`, at stream place `id`.
    fn deleted(id: i64, plant: i64) -> Event {
        Event {
            position: StreamPosition {
                pos: id,
                kind: 0,
                id,
            },
            kind: EventKind::Deleted,
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

    fn turn_ids(ahead: &mut ReadAhead) -> Vec<i64> {
        std::iter::from_fn(|| ahead.next_turn())
            .map(|(event, _, _)| event.entry.id)
            .collect()
    }

    #[test]
    fn a_plants_next_event_waits_until_the_one_before_is_delivered() {
        let mut ahead = ReadAhead::new(deleted(0, 0).position);
        ahead.add(vec![deleted(1, 7), deleted(2, 8), deleted(3, 7)], |_| true);
        assert_eq!(turn_ids(&mut ahead), [1, 2]);
        ahead.delivered(&deleted(2, 8));
        assert_eq!(turn_ids(&mut ahead), Vec::<i64>::new());
        ahead.delivered(&deleted(1, 7));
        assert_eq!(turn_ids(&mut ahead), [3]);
    }

    #[test]
    fn a_failed_event_keeps_its_plants_turn() {
        let mut ahead = ReadAhead::new(deleted(0, 0).position);
        ahead.add(vec![deleted(1, 7), deleted(2, 7)], |_| true);
        let (first, _, _) = ahead.next_turn().expect("a turn");
        ahead.retry(first, 1, Duration::from_millis(5));
        let (again, failures, wait) = ahead.next_turn().expect("the retry");
        assert_eq!(
            (again.entry.id, failures, wait),
            (1, 1, Duration::from_millis(5))
        );
        assert!(ahead.next_turn().is_none(), "entry 2 waits behind entry 1");
    }

    #[test]
    fn the_cursor_moves_only_over_what_is_done_and_unwanted_events_are_done_at_once() {
        let mut ahead = ReadAhead::new(deleted(0, 0).position);
        ahead.add(
            vec![deleted(1, 1), deleted(2, 2), deleted(3, 3), deleted(4, 4)],
            |event| event.entry.id != 3,
        );
        assert_eq!(ahead.read_to(), deleted(4, 4).position);
        assert_eq!(ahead.room(), WINDOW - 4);
        ahead.delivered(&deleted(2, 2));
        assert_eq!(ahead.take_done(), None, "entry 1 is not delivered yet");
        ahead.delivered(&deleted(1, 1));
        assert_eq!(ahead.take_done(), Some((deleted(3, 3).position, 3)));
        assert!(!ahead.is_empty());
        ahead.delivered(&deleted(4, 4));
        assert_eq!(ahead.take_done(), Some((deleted(4, 4).position, 4)));
        assert!(ahead.is_empty());
    }
}
