//! The in-memory [`Client`]: the controller's writes go into the
//! [`ReplayStore`] and come back to the Service chain as MODIFIED events, as
//! from a real watch; every write and Event is recorded in order.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;
use manager::{Client, ClientError, Event, EventType, ServiceWrite, Store};
use serde::{Deserialize, Serialize};
use subscriber::{Chain, Handler};
use tokio::sync::watch;

use crate::store::{Delta, ReplayStore};

/// Fails some of the client's status writes, deterministically, to exercise
/// the manager's retries. Events never fail.
///
/// Every plan lets some writes through, so retries end: a plan that failed
/// every write would keep the manager busy forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailurePlan {
    schedule: Schedule,
    conflict: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    Every(u64),
    Seeded { seed: u64, percent: u8 },
}

impl FailurePlan {
    /// Fails the `n`th, `2n`th, … write attempt (counted from 1 over every
    /// key); `n` below 2 is taken as 2.
    pub fn every(n: u64) -> Self {
        Self {
            schedule: Schedule::Every(n.max(2)),
            conflict: true,
        }
    }

    /// Fails each write attempt with a chance of `percent` (at most 90),
    /// drawn from `seed` and the attempt's number: the same seed fails the
    /// same attempts.
    pub fn seeded(seed: u64, percent: u8) -> Self {
        Self {
            schedule: Schedule::Seeded {
                seed,
                percent: percent.min(90),
            },
            conflict: true,
        }
    }

    /// Fails with [`ClientError::Failed`] instead of the default
    /// [`ClientError::Conflict`].
    #[must_use]
    pub fn failed(mut self) -> Self {
        self.conflict = false;
        self
    }

    /// Whether write attempt `attempt` (from 1) fails.
    fn fails(&self, attempt: u64) -> bool {
        match self.schedule {
            Schedule::Every(n) => attempt.is_multiple_of(n),
            Schedule::Seeded { seed, percent } => {
                splitmix64(seed ^ attempt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 100
                    < u64::from(percent)
            }
        }
    }

    fn error(&self, key: &str, attempt: u64) -> ClientError {
        let message = format!("injected failure of write #{attempt}");
        if self.conflict {
            ClientError::Conflict {
                key: key.to_owned(),
                message,
            }
        } else {
            ClientError::Failed {
                key: key.to_owned(),
                message,
            }
        }
    }
}

fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What became of one status write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteOutcome {
    /// Stored, and delivered back as a MODIFIED event.
    Written,
    /// Nothing changed: not stored, no event (as on an API server).
    Unchanged,
    /// The Service is gone.
    NotFound,
    /// Failed by the [`FailurePlan`].
    Injected,
    /// Refused: the line's write limit was reached (see
    /// [`MemoryClient::limit_attempts`]).
    Refused,
}

/// One status write the controller made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The Service's key.
    pub key: String,
    /// The ingress addresses written.
    pub ips: Vec<IpAddr>,
    /// The pool annotation written, or null to remove it.
    pub pool: Option<String>,
    /// The controller's condition written, as `STATUS REASON`, or null to
    /// remove it.
    pub condition: Option<String>,
    pub outcome: WriteOutcome,
}

/// One Kubernetes Event the controller emitted (docs/replay.md §3 `events`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// The Service's key.
    pub key: String,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// CamelCase reason, e.g. `IPAllocated`.
    pub reason: String,
    pub message: String,
    /// The stream line whose processing emitted it: for the passes at sync,
    /// the `SYNCED` line; 0 before the first line (`--config` pools, and
    /// the sync of a stream without a `SYNCED` line).
    #[serde(default)]
    pub line: u64,
}

#[derive(Debug)]
struct Log {
    attempts: u64,
    /// Whether `writes` is kept (a trace needs it; a plain replay does not).
    keep_writes: bool,
    writes: Vec<WriteRecord>,
    events: EventLog,
    /// While `writes` is kept: for each Event, how many writes came before
    /// it (the two logs' order, which tests check; a plain replay keeps
    /// none of it).
    writes_before: Vec<usize>,
}

/// The Events so far, packed: the strings of all of them in one buffer.
/// A replay of 100k Services logs 100k Events; four strings each, spread
/// over the heap among everything the replay made meanwhile, cost a cache
/// miss apiece when the result is written, and twice the memory.
#[derive(Debug, Default)]
struct EventLog {
    text: String,
    events: Vec<PackedEvent>,
}

#[derive(Clone, Copy, Debug)]
struct PackedEvent {
    /// Where the key, the reason and the message end in `text` (each
    /// starts where the one before ends; the key where the previous
    /// Event's message ends).
    ends: [usize; 3],
    event_type: EventType,
    line: u64,
}

impl EventLog {
    fn len(&self) -> usize {
        self.events.len()
    }

    fn push(&mut self, key: &str, event: &Event, line: u64) {
        let mut ends = [0; 3];
        for (end, part) in ends.iter_mut().zip([key, &event.reason, &event.message]) {
            self.text.push_str(part);
            *end = self.text.len();
        }
        self.events.push(PackedEvent {
            ends,
            event_type: event.event_type,
            line,
        });
    }

    /// The Events from the `from`th on, unpacked.
    fn records(&self, from: usize) -> Vec<EventRecord> {
        let Some(events) = self.events.get(from..) else {
            return Vec::new();
        };
        let mut start = from
            .checked_sub(1)
            .and_then(|before| self.events.get(before))
            .map_or(0, |before| before.ends[2]);
        events
            .iter()
            .map(|event| {
                let [key, reason, message] = event.ends.map(|end| {
                    let part = self.text.get(start..end).unwrap_or_default().to_owned();
                    start = end;
                    part
                });
                EventRecord {
                    key,
                    event_type: event.event_type.as_str().to_owned(),
                    reason,
                    message,
                    line: event.line,
                }
            })
            .collect()
    }
}

/// The in-memory [`Client`] of a replay.
pub struct MemoryClient {
    store: Arc<ReplayStore>,
    /// Set once the chain is built (the chain holds the manager, which holds
    /// the controller, which holds this client: weak, so no cycle).
    services: OnceLock<Weak<Chain<Service>>>,
    failures: Option<FailurePlan>,
    log: Mutex<Log>,
    /// The highest write attempt number allowed.
    limit: AtomicU64,
    /// Set once a write was refused for the limit.
    overrun: watch::Sender<bool>,
    /// The stream line being processed (for the Events' `line`).
    line: AtomicU64,
}

impl std::fmt::Debug for MemoryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let log = self.log();
        f.debug_struct("MemoryClient")
            .field("failures", &self.failures)
            .field("writes", &log.writes.len())
            .field("events", &log.events.len())
            .finish_non_exhaustive()
    }
}

impl MemoryClient {
    /// A client writing into `store`, failing writes as `failures` says.
    pub fn new(store: Arc<ReplayStore>, failures: Option<FailurePlan>) -> Self {
        Self {
            store,
            services: OnceLock::new(),
            failures,
            log: Mutex::new(Log {
                attempts: 0,
                keep_writes: true,
                writes: Vec::new(),
                events: EventLog::default(),
                writes_before: Vec::new(),
            }),
            limit: AtomicU64::new(u64::MAX),
            overrun: watch::Sender::new(false),
            line: AtomicU64::new(0),
        }
    }

    /// Sets the stream line being processed: the Events emitted from now on
    /// carry it.
    pub fn set_line(&self, line: u64) {
        self.line.store(line, Ordering::SeqCst);
    }

    /// How many write attempts were made so far.
    pub fn attempts(&self) -> u64 {
        self.log().attempts
    }

    /// Refuses every write attempt after the `max`th (counted from the
    /// first write of the replay) with [`ClientError::Failed`], and reports
    /// it through [`MemoryClient::overrun`]. A controller that does not
    /// converge writes forever; this makes a replay fail instead of hang.
    pub fn limit_attempts(&self, max: u64) {
        self.limit.store(max, Ordering::SeqCst);
    }

    /// Resolves once a write was refused for the limit.
    pub async fn overrun(&self) {
        let mut overrun = self.overrun.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = overrun.wait_for(|overrun| *overrun).await;
    }

    /// The shared cache the client writes into, for a manager built by hand
    /// (the manager's own tests build one with their configuration).
    pub fn cache(&self) -> Arc<dyn Store> {
        self.store.cache()
    }

    /// Connects the chain that the client's writes are delivered to; the
    /// first call wins.
    pub fn deliver_to(&self, services: &Arc<Chain<Service>>) {
        let _ = self.services.set(Arc::downgrade(services));
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops recording writes (`writes` and `since` then show none): a
    /// replay without a trace has no use for them.
    pub fn forget_writes(&self) {
        let mut log = self.log();
        log.keep_writes = false;
        log.writes = Vec::new();
        log.writes_before = Vec::new();
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.log().writes.clone()
    }

    /// Every Event so far, in order.
    pub fn events(&self) -> Vec<EventRecord> {
        self.log().events.records(0)
    }

    /// Every Event so far, in order, each with how many of
    /// [`MemoryClient::writes`] came before it (0 once writes are
    /// forgotten): the order of writes and Events together.
    pub fn events_after_writes(&self) -> Vec<(usize, EventRecord)> {
        let log = self.log();
        let before = log
            .writes_before
            .iter()
            .copied()
            .chain(std::iter::repeat(0));
        before.zip(log.events.records(0)).collect()
    }

    /// Every Event so far, in order, taken out of the log (which starts
    /// afresh).
    pub fn take_events(&self) -> Vec<EventRecord> {
        let mut log = self.log();
        log.writes_before = Vec::new();
        std::mem::take(&mut log.events).records(0)
    }

    /// How many writes and Events there are so far (a mark for
    /// [`MemoryClient::since`]).
    pub fn mark(&self) -> (usize, usize) {
        let log = self.log();
        (log.writes.len(), log.events.len())
    }

    /// The writes and Events after `mark`.
    pub fn since(&self, mark: (usize, usize)) -> (Vec<WriteRecord>, Vec<EventRecord>) {
        let log = self.log();
        (
            log.writes.get(mark.0..).unwrap_or_default().to_vec(),
            log.events.records(mark.1),
        )
    }

    fn record(&self, key: &str, write: &ServiceWrite, outcome: WriteOutcome) {
        let mut log = self.log();
        if !log.keep_writes {
            return;
        }
        log.writes.push(WriteRecord {
            key: key.to_owned(),
            ips: write.ingress.clone(),
            pool: write.pool.clone(),
            condition: write
                .condition
                .as_ref()
                .map(|c| format!("{} {}", c.status(), c.reason)),
            outcome,
        });
    }
}

#[async_trait]
impl Client for MemoryClient {
    async fn write_service(&self, key: &str, write: &ServiceWrite) -> Result<(), ClientError> {
        let attempt = {
            let mut log = self.log();
            log.attempts = log.attempts.saturating_add(1);
            log.attempts
        };
        if attempt > self.limit.load(Ordering::SeqCst) {
            self.record(key, write, WriteOutcome::Refused);
            self.overrun.send_replace(true);
            return Err(ClientError::Failed {
                key: key.to_owned(),
                message: "the replay's write limit is reached".to_owned(),
            });
        }
        if let Some(plan) = self.failures.filter(|plan| plan.fails(attempt)) {
            self.record(key, write, WriteOutcome::Injected);
            return Err(plan.error(key, attempt));
        }
        let delta = match self.store.write_service(key, write) {
            Ok(delta) => delta,
            Err(error) => {
                self.record(key, write, WriteOutcome::NotFound);
                return Err(error);
            }
        };
        let Delta::Updated { old, new } = delta else {
            self.record(key, write, WriteOutcome::Unchanged);
            return Ok(());
        };
        self.record(key, write, WriteOutcome::Written);
        // Like a watch, deliver the write back; a handler's failure is the
        // handler's business, not the writer's.
        if let Some(chain) = self.services.get().and_then(Weak::upgrade) {
            if let Err(error) = chain.on_update(&old, &new).await {
                tracing::warn!(key, %error, "delivering a status write failed");
            }
        }
        Ok(())
    }

    async fn emit_event(&self, key: &str, event: &Event) -> Result<(), ClientError> {
        let line = self.line.load(Ordering::SeqCst);
        let mut log = self.log();
        if log.keep_writes {
            let writes = log.writes.len();
            log.writes_before.push(writes);
        }
        log.events.push(key, event, line);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_log_gives_back_every_event_from_any_mark() {
        let event = |event_type, reason: &str, message: &str| Event {
            event_type,
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        let events = [
            (
                "a/x",
                event(
                    EventType::Normal,
                    "IPAllocated",
                    "Assigned IP [\"10.0.0.1\"]",
                ),
            ),
            ("", event(EventType::Warning, "AllocationFailed", "")),
            ("b/é", event(EventType::Warning, "", "no pool \"p\" ✓")),
        ];
        let mut log = EventLog::default();
        let mut expected = Vec::new();
        for (line, (key, event)) in (1u64..).zip(&events) {
            log.push(key, event, line);
            expected.push(EventRecord {
                key: (*key).to_owned(),
                event_type: event.event_type.as_str().to_owned(),
                reason: event.reason.clone(),
                message: event.message.clone(),
                line,
            });
        }
        assert_eq!(log.len(), 3);
        for from in 0..=4 {
            let tail = expected.get(from..).unwrap_or_default().to_vec();
            assert_eq!(log.records(from), tail, "from {from}");
        }
    }

    #[tokio::test]
    async fn events_say_how_many_writes_came_before_them_while_writes_are_kept() {
        let event = |reason: &str| Event {
            event_type: EventType::Normal,
            reason: reason.to_owned(),
            message: String::new(),
        };
        let order = |client: &MemoryClient| -> Vec<(usize, String)> {
            let events = client.events_after_writes().into_iter();
            events.map(|(before, e)| (before, e.reason)).collect()
        };
        let client = MemoryClient::new(Arc::new(ReplayStore::new()), None);
        let write = ServiceWrite::default();
        client.emit_event("ns/a", &event("First")).await.unwrap();
        // A Service the store does not have: a write recorded all the same.
        assert!(client.write_service("ns/a", &write).await.is_err());
        assert!(client.write_service("ns/a", &write).await.is_err());
        client.emit_event("ns/a", &event("Second")).await.unwrap();
        assert_eq!(client.writes().len(), 2);
        assert_eq!(
            order(&client),
            [(0, "First".to_owned()), (2, "Second".to_owned())]
        );

        client.forget_writes();
        client.emit_event("ns/a", &event("Third")).await.unwrap();
        assert_eq!(order(&client).last(), Some(&(0, "Third".to_owned())));
        assert_eq!(client.take_events().len(), 3);
        assert!(order(&client).is_empty());
    }

    #[test]
    fn every_nth_write_fails() {
        let plan = FailurePlan::every(3);
        let failing: Vec<u64> = (1..=9).filter(|&n| plan.fails(n)).collect();
        assert_eq!(failing, [3, 6, 9]);
        assert_eq!(FailurePlan::every(0), FailurePlan::every(2));
    }

    #[test]
    fn seeded_failures_repeat_and_are_about_the_rate() {
        let plan = FailurePlan::seeded(7, 30);
        let first: Vec<bool> = (1..=1000).map(|n| plan.fails(n)).collect();
        let again: Vec<bool> = (1..=1000).map(|n| plan.fails(n)).collect();
        assert_eq!(first, again);
        let count = first.iter().filter(|&&f| f).count();
        assert!((200..400).contains(&count), "{count}");
        assert!((1..=1000).any(|n| !FailurePlan::seeded(1, 100).fails(n)));
    }
}
