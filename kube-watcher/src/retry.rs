//! Retries of a failing list or watch that back off, and logs that say
//! so once.
//!
//! kube-runtime's `default_backoff()` resets on every `Ok` item, and its
//! watcher yields `Event::Init` before each list attempt, so a list that
//! keeps failing is retried every second or so forever. [`with_backoff`]
//! instead delays the poll after each error by an exponential backoff with
//! jitter, up to [`WatchBackoff::max`], and starts again from
//! [`WatchBackoff::initial`] only once the watch has delivered objects for
//! [`WatchBackoff::reset_after`] (`Init` is not a success: it comes before
//! the list is even tried).
//!
//! A failure streak is logged at WARN once, with a reminder every
//! [`WatchBackoff::remind_every`] while it lasts, and its end at INFO. The
//! routine end of a watch (`410 Gone`/`Expired`, which relists, or a timed
//! out watch) is DEBUG and relisted at once, unless it repeats.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

/// The timing of watch retries.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    /// The delay after the first failure (before jitter).
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
    /// How long a watch must have delivered objects without a failure
    /// before the delay starts from `initial` again.
    pub reset_after: Duration,
    /// How often a failure streak is logged at WARN again.
    pub remind_every: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
            remind_every: Duration::from_secs(300),
        }
    }
}

impl WatchBackoff {
    /// The delay before retry number `attempt` (0 for the first), before
    /// jitter: `initial` doubled each attempt, at most `max`.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        doubled(self.initial, attempt, self.max)
    }
}

/// `initial` doubled `attempt` times, at most `max`: the delay before
/// retry number `attempt` (0 for the first).
pub(crate) fn doubled(initial: Duration, attempt: u32, max: Duration) -> Duration {
    let factor = 2u32.saturating_pow(attempt.min(31));
    initial.saturating_mul(factor).min(max)
}

/// A factor in [0.5, 1): spreads the retries of many replicas apart.
fn jitter() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let bits = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    // The top 53 bits as a fraction in [0, 1).
    let unit = (bits >> 11) as f64 / (1u64 << 53) as f64;
    0.5 + unit / 2.0
}

/// Whether `error` is a watch ending as watches routinely do: `410 Gone`
/// (the resourceVersion is too old: relist) or a timeout.
pub(crate) fn is_routine(error: &watcher::Error) -> bool {
    let client_error = match error {
        watcher::Error::WatchError(status) => return status.code == 410,
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => error,
        watcher::Error::NoResourceVersion => return false,
    };
    match client_error {
        kube::Error::Api(status) => status.code == 410,
        other => {
            let text = other.to_string().to_ascii_lowercase();
            matches!(error, watcher::Error::WatchFailed(_))
                && (text.contains("timed out") || text.contains("timeout"))
        }
    }
}

/// What a failed list or watch of `kind` means when the API server answers
/// `404 Not Found` for the whole kind: it is not served, which for a custom
/// resource means its CRD is not installed. Said in the warning, so that a
/// host waiting for pools says why rather than only that it retries.
fn not_served_hint(kind: &str, error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::WatchError(status) => status,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status,
        _ => return None,
    };
    if status.code != 404 {
        return None;
    }
    Some(match kind {
        "IPAddressPool" => "the API server does not serve ipaddresspools.metallb.io (404): \
             install MetalLB's CRD or kube-watcher's (kubectl apply -k deploy/crd/)"
            .to_owned(),
        _ => format!("the API server does not serve {kind} (404)"),
    })
}

/// The state of one kind's retries.
#[derive(Debug)]
struct Retry {
    kind: &'static str,
    config: WatchBackoff,
    /// Failures since the last reset.
    failures: u32,
    /// When the current streak's first failure came.
    since: Option<Instant>,
    /// When the streak was last logged at WARN (`None`: not yet).
    warned: Option<Instant>,
    /// When the watch first delivered objects after the last failure.
    healthy_since: Option<Instant>,
}

impl Retry {
    fn new(kind: &'static str, config: WatchBackoff) -> Self {
        Self {
            kind,
            config,
            failures: 0,
            since: None,
            warned: None,
            healthy_since: None,
        }
    }

    /// Ends the streak if the watch has been healthy long enough.
    fn settle(&mut self, now: Instant) {
        let healthy = self
            .healthy_since
            .is_some_and(|since| now.duration_since(since) >= self.config.reset_after);
        if self.failures > 0 && healthy {
            if self.warned.is_some() {
                tracing::info!(
                    kind = self.kind,
                    failures = self.failures,
                    "watch of {} recovered after {} failed attempts",
                    self.kind,
                    self.failures
                );
            }
            self.failures = 0;
            self.since = None;
            self.warned = None;
            self.healthy_since = None;
        }
    }

    fn succeeded<K>(&mut self, event: &watcher::Event<K>) {
        if self.failures == 0 || matches!(event, watcher::Event::Init) {
            return;
        }
        let now = Instant::now();
        self.healthy_since.get_or_insert(now);
        self.settle(now);
    }

    /// Logs `error` and returns how long to wait before trying again.
    fn failed(&mut self, error: &watcher::Error) -> Duration {
        let now = Instant::now();
        self.settle(now);
        self.healthy_since = None;
        let attempt = self.failures;
        self.failures = self.failures.saturating_add(1);
        let since = *self.since.get_or_insert(now);
        let routine = is_routine(error);
        if routine && attempt == 0 {
            tracing::debug!(kind = self.kind, %error, "watch ended; relisting");
            return Duration::ZERO;
        }
        let delay = self.config.base_delay(attempt).mul_f64(jitter());
        let remind = self
            .warned
            .is_some_and(|at| now.duration_since(at) >= self.config.remind_every);
        let why = not_served_hint(self.kind, error)
            .map(|hint| format!(": {hint}"))
            .unwrap_or_default();
        if self.warned.is_none() && !routine {
            self.warned = Some(now);
            tracing::warn!(
                kind = self.kind,
                %error,
                retry_in_ms = delay.as_millis(),
                "watch of {} failed; retrying with backoff up to {}s (further failures at DEBUG, a reminder every {}s){why}",
                self.kind,
                self.config.max.as_secs(),
                self.config.remind_every.as_secs()
            );
        } else if remind {
            self.warned = Some(now);
            tracing::warn!(
                kind = self.kind,
                %error,
                failures = self.failures,
                failing_for_s = now.duration_since(since).as_secs(),
                "watch of {} still failing after {} attempts{why}",
                self.kind,
                self.failures
            );
        } else {
            tracing::debug!(
                kind = self.kind,
                %error,
                failures = self.failures,
                retry_in_ms = delay.as_millis(),
                "watch failed; retrying"
            );
        }
        delay
    }
}

/// The stream `make` gives, with its errors passed through (and logged),
/// and the next poll after each delayed by the backoff (see the module
/// documentation). A watch refused with `410 Gone` when it starts gets a new
/// stream from `make`, which lists afresh: kube's watcher would retry the
/// expired resourceVersion forever (a kube-apiserver reports an expired
/// version inside the watch, which kube's watcher relists on; other servers
/// answer the watch request itself with a 410).
pub(crate) fn with_backoff<K, St, F>(
    make: F,
    kind: &'static str,
    config: WatchBackoff,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    St: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    F: Fn() -> St + Send + 'static,
{
    let state = (
        make().boxed(),
        make,
        Retry::new(kind, config),
        Duration::ZERO,
    );
    futures::stream::unfold(state, |(mut stream, make, mut retry, delay)| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let item = stream.next().await?;
        let delay = match &item {
            Ok(event) => {
                retry.succeeded(event);
                Duration::ZERO
            }
            Err(error) => {
                if is_gone_at_start(error) {
                    stream = make().boxed();
                }
                retry.failed(error)
            }
        };
        Some((item, (stream, make, retry, delay)))
    })
}

/// How [`with_backoff`] makes the watcher of every `K` (with `config`),
/// each object passed through `trim` on the stream.
pub(crate) fn watcher_of<K>(
    client: &kube::Client,
    config: &watcher::Config,
    trim: fn(&mut K),
) -> impl Fn() -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let (client, config) = (client.clone(), config.clone());
    move || {
        watcher(Api::<K>::all(client.clone()), config.clone())
            .modify(trim)
            .boxed()
    }
}

/// A watch request answered with `410 Gone`.
fn is_gone_at_start(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_failed() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(
            kube::core::Status::failure("boom", "InternalError")
                .with_code(500)
                .boxed(),
        ))
    }

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(
            kube::core::Status::failure("too old resource version", "Expired")
                .with_code(410)
                .boxed(),
        )
    }

    #[test]
    fn a_kind_not_served_is_named_with_what_to_install() {
        let not_found = |code| {
            watcher::Error::InitialListFailed(kube::Error::Api(
                kube::core::Status::failure(
                    "the server could not find the requested resource",
                    "NotFound",
                )
                .with_code(code)
                .boxed(),
            ))
        };
        let pools = not_served_hint("IPAddressPool", &not_found(404)).unwrap_or_default();
        assert!(pools.contains("ipaddresspools.metallb.io"), "{pools}");
        assert!(pools.contains("kubectl apply -k deploy/crd/"), "{pools}");
        assert_eq!(
            not_served_hint("Namespace", &not_found(404)).as_deref(),
            Some("the API server does not serve Namespace (404)")
        );
        assert_eq!(not_served_hint("IPAddressPool", &list_failed()), None);
        assert_eq!(not_served_hint("IPAddressPool", &gone()), None);
    }

    #[test]
    fn the_delay_doubles_to_the_cap() {
        let config = WatchBackoff::default();
        let delays: Vec<u64> = (0..8).map(|n| config.base_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(config.base_delay(u32::MAX), config.max);
    }

    #[test]
    fn jitter_stays_in_its_range_and_varies() {
        let factors: Vec<f64> = (0..100).map(|_| jitter()).collect();
        assert!(factors.iter().all(|f| (0.5..1.0).contains(f)));
        assert!(factors.iter().any(|f| (f - factors[0]).abs() > 1e-9));
    }

    #[tokio::test(start_paused = true)]
    async fn init_events_do_not_reset_the_backoff_but_a_healthy_watch_does() {
        let config = WatchBackoff::default();
        let mut retry = Retry::new("Service", config.clone());
        let mut last = Duration::ZERO;
        for attempt in 0..6 {
            retry.succeeded(&watcher::Event::<()>::Init);
            let delay = retry.failed(&list_failed());
            assert!(
                delay >= config.base_delay(attempt) / 2,
                "{attempt}: {delay:?}"
            );
            assert!(delay < config.base_delay(attempt), "{attempt}: {delay:?}");
            assert!(attempt < 5 || delay >= last / 2);
            last = delay;
        }
        // Objects delivered, but not for long: no reset.
        retry.succeeded(&watcher::Event::InitApply(()));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(retry.failed(&list_failed()) >= Duration::from_secs(15));
        // Delivered for a minute: the next failure starts from the bottom.
        retry.succeeded(&watcher::Event::<()>::InitDone);
        tokio::time::advance(config.reset_after).await;
        retry.succeeded(&watcher::Event::Apply(()));
        assert_eq!(retry.failures, 0);
        assert!(retry.failed(&list_failed()) < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_refused_with_410_gets_a_new_watcher() {
        let gone_at_start = || {
            watcher::Error::WatchStartFailed(kube::Error::Api(
                kube::core::Status::failure("too old resource version", "Expired")
                    .with_code(410)
                    .boxed(),
            ))
        };
        let made = std::sync::Arc::new(AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&made);
        // Each watcher made: a 410 at its watch's start, then (as kube's
        // watcher does) the same again, forever.
        let make = move || {
            let number = counter.fetch_add(1, Ordering::Relaxed);
            futures::stream::iter(
                (0..).map(move |_| Err::<watcher::Event<u64>, _>(gone_at_start())),
            )
            .take(if number < 2 { 3 } else { 0 })
            .chain(futures::stream::iter([Ok(watcher::Event::Apply(number))]))
        };
        let stream = with_backoff(make, "Service", WatchBackoff::default());
        let items: Vec<_> = stream.take(3).collect().await;
        assert!(items.iter().take(2).all(Result::is_err));
        // The first two watchers each yielded one 410 and were replaced.
        assert!(
            matches!(items[2], Ok(watcher::Event::Apply(2))),
            "{items:?}"
        );
        assert_eq!(made.load(Ordering::Relaxed), 3);
        // A 410 inside a watch is kube's to relist on: the stream stays.
        assert!(!is_gone_at_start(&gone()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_410_relists_at_once_unless_it_repeats() {
        let mut retry = Retry::new("Service", WatchBackoff::default());
        assert!(is_routine(&gone()));
        assert!(!is_routine(&list_failed()));
        assert_eq!(retry.failed(&gone()), Duration::ZERO);
        assert!(retry.warned.is_none(), "a 410 is routine");
        assert!(retry.failed(&gone()) > Duration::ZERO);
    }
}
