//! Executor pods kept at the allocator's target: the IO side of the engine's lifecycle for
//! Kubernetes (as `flint_net::lifecycle::local::LocalExecutors` is for local processes).
//!
//! Three tasks on a tokio runtime talk to the API server, and one control thread drives the
//! sans-IO state machines:
//!
//! - *watch source*: lists the app's pods (label selector), then watches from the list's
//!   `resourceVersion`, keeping the newest one seen; a watch that ends normally resumes from
//!   it, one answered with 410 Gone (an `ERROR` event or status) or a dropped stream re-lists.
//!   Each event is an update ([`SnapshotStore::update`]), each list a full listing;
//! - *polling source*: every `poll_interval` a full list, a listing
//!   ([`SnapshotStore::replace_all`]);
//! - *API calls*: pod creates and deletes the allocator asks for, each with
//!   [`with_retry`].
//!
//! The control thread, every `tick`: applies the events to the store (a pod whose create is
//! still in flight counts as pending in listings), asks the driver for its backlog and
//! registered executors ([`Driver::executors_view`]), feeds the store's batch to the
//! [`Allocator`] and to [`Removals`] (which calls [`Driver::remove_executor`] with the exit
//! reason), gives the allocator the load, ticks it and carries out its outputs: `Create`
//! creates pods, `Delete` asks the driver to stop a registered executor
//! ([`Driver::stop_executor`]) and deletes its pod, `Stop` records the reason for
//! [`K8sExecutors::failed`]. An API server that does not answer for `api_timeout`, or that
//! refuses a pod (invalid, forbidden: the next one would be refused too), also makes
//! [`K8sExecutors::failed`] say so.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_engine::lifecycle::{
    Allocator, AllocatorConfig, AllocatorOutput, ExecutorState, Removals, SnapshotStore,
};
use flint_net::driver::Driver;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client};
use tokio::runtime::Handle;
use tokio::task::JoinHandle as TaskHandle;

use crate::api::{retryable, status_code, with_retry};
use crate::pods::{self, deleted_state, executor_pod, pod_state, PodSettings};

/// How the executor pods run.
#[derive(Debug, Clone)]
pub struct K8sConfig {
    /// What goes into each pod.
    pub pods: PodSettings,
    /// The allocator's settings; its `name_prefix` should start with the app id (pod names).
    pub allocator: AllocatorConfig,
    /// How often the control thread applies events and ticks the allocator.
    pub tick: Duration,
    /// How often the polling source lists the pods.
    pub poll_interval: Duration,
    /// Executors missing from listings this long count as deleted.
    pub sync_grace: Duration,
    /// How long an API call is retried before the application fails.
    pub api_timeout: Duration,
    /// `timeoutSeconds` of each watch request (the watch resumes after it).
    pub watch_timeout_s: u32,
    /// Grace period of pod deletions, in seconds.
    pub delete_grace_s: u32,
}

/// The tracing target of executor events (pod requested, state change, removal, deletion), at
/// `info`: `flint-k8s submit --executor-events` shows them.
pub const EVENTS_TARGET: &str = "flint_k8s::events";

impl K8sConfig {
    /// Settings with the defaults for everything but the pods.
    pub fn new(pods: PodSettings) -> K8sConfig {
        K8sConfig {
            allocator: AllocatorConfig {
                name_prefix: format!("{}-exec-", pods.app_id),
                ..AllocatorConfig::default()
            },
            pods,
            tick: Duration::from_millis(20),
            poll_interval: Duration::from_secs(30),
            sync_grace: Duration::from_secs(5),
            api_timeout: Duration::from_secs(30),
            watch_timeout_s: 60,
            delete_grace_s: 5,
        }
    }
}

/// What happened to the executor pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct K8sStats {
    /// Pods created.
    pub created: u64,
    /// Executors registered with the driver now.
    pub registered: u64,
    /// The most executors registered at once.
    pub peak: u64,
    /// Pods deleted on purpose (excess, idle, pending too long).
    pub deleted: u64,
    /// Of those, pods deleted because they were pending too long.
    pub pending_timeouts: u64,
    /// Executors gone without being asked (each replaced while under the target).
    pub failed: u64,
    /// Full lists the watch source made (the first, then one per 410 Gone or dropped stream).
    pub watch_lists: u64,
}

enum Event {
    Update(String, ExecutorState),
    Listing(Vec<(String, ExecutorState)>),
    Created(String),
    CreateFailed(String, String),
    ApiDown(String),
}

struct Shared {
    stop: AtomicBool,
    frozen: AtomicBool,
    stats: Mutex<K8sStats>,
    failure: Mutex<Option<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The control thread and the API tasks (see the module docs).
pub struct K8sExecutors {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    tasks: Vec<TaskHandle<()>>,
}

impl std::fmt::Debug for K8sExecutors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K8sExecutors")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl K8sExecutors {
    /// Starts the sources and the control thread on `runtime`; the first pods are created on
    /// the first tick. Call [`prepare`] first.
    pub fn start(
        config: K8sConfig,
        client: Client,
        runtime: Handle,
        driver: Arc<Driver>,
    ) -> std::io::Result<K8sExecutors> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            stats: Mutex::new(K8sStats::default()),
            failure: Mutex::new(None),
        });
        let api: Api<Pod> = Api::namespaced(client, &config.pods.namespace);
        let (tx, rx) = channel();
        let tasks = vec![
            runtime.spawn(watch_source(
                api.clone(),
                config.clone(),
                tx.clone(),
                shared.clone(),
            )),
            runtime.spawn(poll_source(api.clone(), config.clone(), tx.clone())),
        ];
        let control = Control {
            store: SnapshotStore::new(config.sync_grace.as_micros() as u64),
            allocator: Allocator::new(config.allocator.clone()),
            removals: Removals::new(),
            creating: BTreeSet::new(),
            registered: BTreeSet::new(),
            epoch: Instant::now(),
            config,
            driver,
            shared: shared.clone(),
            events: rx,
            tx,
            api,
            runtime,
        };
        let thread = std::thread::Builder::new()
            .name("flint-k8s-executors".into())
            .spawn(move || control.run())?;
        Ok(K8sExecutors {
            shared,
            thread: Some(thread),
            tasks,
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> K8sStats {
        lock(&self.shared.stats).clone()
    }

    /// Why the application must stop (too many executor failures, the API server gone), once
    /// it must.
    pub fn failed(&self) -> Option<String> {
        lock(&self.shared.failure).clone()
    }

    /// Stops creating and deleting pods (states are still watched): call before stopping the
    /// executors at the end.
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    /// Stops the control thread and the sources (the pods stay: see [`cleanup`]); returns the
    /// final counters.
    pub fn stop(mut self) -> K8sStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
        self.shared.stop.store(true, Ordering::SeqCst);
        for task in self.tasks.drain(..) {
            task.abort();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for K8sExecutors {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Looks up the driver's own pod (when the driver runs in one) for the executors' owner
/// reference, so they are deleted when it is.
pub async fn owner_reference(
    client: Client,
    namespace: &str,
    pod_name: &str,
    budget: Duration,
) -> kube::Result<OwnerReference> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let pod = with_retry(&format!("get driver pod {pod_name}"), budget, || {
        api.get(pod_name)
    })
    .await?;
    Ok(OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod_name.into(),
        uid: pod.metadata.uid.unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// Why preparing or cleaning up an application's pods and Secret failed (after the retries
/// [`crate::api::with_retry`] allows).
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The app's Secret could not be created.
    #[error("cannot create the secret {name}: {source}")]
    CreateSecret {
        /// The Secret's name.
        name: String,
        /// The API's error.
        source: kube::Error,
    },
    /// The app's Secret could not be deleted.
    #[error("cannot delete the secret {name}: {source}")]
    DeleteSecret {
        /// The Secret's name.
        name: String,
        /// The API's error.
        source: kube::Error,
    },
    /// The app's pods could not be listed.
    #[error("cannot list the app's pods: {0}")]
    ListPods(kube::Error),
    /// A pod could not be deleted.
    #[error("cannot delete pod {name}: {source}")]
    DeletePod {
        /// The pod's name.
        name: String,
        /// The API's error.
        source: kube::Error,
    },
    /// Pods were still listed when the wait ended.
    #[error("{count} pods of the app are still there after {wait_s} s")]
    PodsRemain {
        /// How many.
        count: usize,
        /// The wait, in seconds.
        wait_s: u64,
    },
}

/// Before the first pod: deletes pods and the Secret a previous driver with the same app id
/// left (and waits until those pods are gone, since the new ones reuse their names), then
/// creates the app's Secret holding `secret_value`.
pub async fn prepare(
    client: Client,
    settings: &PodSettings,
    secret_value: &str,
    budget: Duration,
) -> Result<(), K8sError> {
    delete_app_pods(client.clone(), settings, budget, budget).await?;
    let secrets: Api<Secret> = Api::namespaced(client, &settings.namespace);
    let name = settings.secret_name.clone();
    delete_secret(&secrets, &name, budget).await?;
    let secret = pods::secret(settings, secret_value);
    let post = PostParams::default();
    with_retry(&format!("create secret {name}"), budget, || {
        secrets.create(&post, &secret)
    })
    .await
    .map_err(|source| K8sError::CreateSecret { name, source })?;
    Ok(())
}

/// After the application: deletes its pods (waiting until they are gone, at most `wait`) and
/// its Secret; each API call is retried for at most `budget`.
pub async fn cleanup(
    client: Client,
    settings: &PodSettings,
    budget: Duration,
    wait: Duration,
) -> Result<(), K8sError> {
    let pods_result = delete_app_pods(client.clone(), settings, budget, wait).await;
    let secrets: Api<Secret> = Api::namespaced(client, &settings.namespace);
    let secret_result = delete_secret(&secrets, &settings.secret_name, budget).await;
    pods_result.and(secret_result)
}

async fn delete_secret(
    secrets: &Api<Secret>,
    name: &str,
    budget: Duration,
) -> Result<(), K8sError> {
    let params = DeleteParams::default();
    match with_retry(&format!("delete secret {name}"), budget, || {
        secrets.delete(name, &params)
    })
    .await
    {
        Ok(_) => Ok(()),
        Err(e) if status_code(&e) == Some(404) => Ok(()),
        Err(source) => Err(K8sError::DeleteSecret {
            name: name.to_owned(),
            source,
        }),
    }
}

/// Deletes every pod with the app's labels and waits (at most `wait`) until a list shows none.
async fn delete_app_pods(
    client: Client,
    settings: &PodSettings,
    budget: Duration,
    wait: Duration,
) -> Result<(), K8sError> {
    let api: Api<Pod> = Api::namespaced(client, &settings.namespace);
    let params = ListParams::default().labels(&pods::selector(&settings.app_id));
    let deadline = Instant::now() + wait;
    loop {
        let list = with_retry("list pods", budget, || api.list(&params))
            .await
            .map_err(K8sError::ListPods)?;
        if list.items.is_empty() {
            return Ok(());
        }
        for pod in &list.items {
            let Some(name) = pods::pod_name(pod) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            tracing::info!(pod = %name, "deleting pod");
            let delete = DeleteParams::default().grace_period(5);
            match with_retry(&format!("delete pod {name}"), budget, || {
                api.delete(name, &delete)
            })
            .await
            {
                Ok(_) => {}
                Err(e) if status_code(&e) == Some(404) => {}
                Err(source) => {
                    return Err(K8sError::DeletePod {
                        name: name.to_owned(),
                        source,
                    })
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(K8sError::PodsRemain {
                count: list.items.len(),
                wait_s: wait.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn listing(list: &[Pod]) -> Vec<(String, ExecutorState)> {
    list.iter()
        .filter_map(|pod| Some((pods::pod_name(pod)?.to_string(), pod_state(pod))))
        .collect()
}

/// The watch source (see the module docs).
async fn watch_source(api: Api<Pod>, config: K8sConfig, tx: Sender<Event>, shared: Arc<Shared>) {
    let selector = pods::selector(&config.pods.app_id);
    let list_params = ListParams::default().labels(&selector);
    let watch_params = WatchParams::default()
        .labels(&selector)
        .timeout(config.watch_timeout_s);
    loop {
        let list =
            match with_retry("list pods", config.api_timeout, || api.list(&list_params)).await {
                Ok(list) => list,
                Err(e) => {
                    let _ = tx.send(Event::ApiDown(format!(
                        "the API server did not answer a pod list for {} s: {e}",
                        config.api_timeout.as_secs()
                    )));
                    return;
                }
            };
        lock(&shared.stats).watch_lists += 1;
        let mut version = list.metadata.resource_version.clone().unwrap_or_default();
        if tx.send(Event::Listing(listing(&list.items))).is_err() {
            return;
        }
        // Watch from `version` until the server says it is too old or the stream drops.
        loop {
            match watch_once(&api, &config, &watch_params, &tx, &mut version).await {
                AfterWatch::Rewatch => {}
                AfterWatch::Relist => break,
                AfterWatch::Stop => return,
            }
        }
    }
}

/// What the watch source does after a watch ends.
enum AfterWatch {
    /// The stream ended: watch again from the last version seen.
    Rewatch,
    /// The version is too old or the watch failed: list again.
    Relist,
    /// The API server is down (reported): stop.
    Stop,
}

/// One watch from `version`, its events sent as updates; `version` follows them.
async fn watch_once(
    api: &Api<Pod>,
    config: &K8sConfig,
    params: &WatchParams,
    tx: &Sender<Event>,
    version: &mut String,
) -> AfterWatch {
    let stream = match with_retry("watch pods", config.api_timeout, || {
        api.watch(params, version)
    })
    .await
    {
        Ok(stream) => stream,
        Err(e) if status_code(&e) == Some(410) => {
            tracing::info!("watch: resourceVersion {version} is too old; re-listing");
            return AfterWatch::Relist;
        }
        Err(e) if retryable(&e) => {
            let _ = tx.send(Event::ApiDown(format!(
                "the API server did not answer a pod watch for {} s: {e}",
                config.api_timeout.as_secs()
            )));
            return AfterWatch::Stop;
        }
        Err(e) => {
            tracing::warn!("watch refused: {e}; re-listing");
            tokio::time::sleep(Duration::from_secs(1)).await;
            return AfterWatch::Relist;
        }
    };
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => pod,
            Ok(WatchEvent::Deleted(pod)) => {
                send_update(tx, version, &pod, deleted_state(&pod));
                continue;
            }
            Ok(WatchEvent::Bookmark(bookmark)) => {
                *version = bookmark.metadata.resource_version;
                continue;
            }
            Ok(WatchEvent::Error(e)) if e.code == 410 => {
                tracing::info!("watch: {} (410 Gone); re-listing", e.message);
                return AfterWatch::Relist;
            }
            Ok(WatchEvent::Error(e)) => {
                tracing::warn!("watch error event: {} ({}); re-listing", e.message, e.code);
                return AfterWatch::Relist;
            }
            Err(e) => {
                tracing::warn!("watch stream dropped: {e}; re-listing");
                return AfterWatch::Relist;
            }
        };
        send_update(tx, version, &pod, pod_state(&pod));
    }
    AfterWatch::Rewatch
}

/// Sends a watched pod's new `state`, and moves `version` to the pod's.
fn send_update(tx: &Sender<Event>, version: &mut String, pod: &Pod, state: ExecutorState) {
    if let Some(v) = &pod.metadata.resource_version {
        *version = v.clone();
    }
    if let Some(name) = pods::pod_name(pod) {
        let _ = tx.send(Event::Update(name.to_string(), state));
    }
}

/// The polling source (see the module docs).
async fn poll_source(api: Api<Pod>, config: K8sConfig, tx: Sender<Event>) {
    let params = ListParams::default().labels(&pods::selector(&config.pods.app_id));
    loop {
        tokio::time::sleep(config.poll_interval).await;
        match with_retry("poll pods", config.api_timeout, || api.list(&params)).await {
            Ok(list) => {
                if tx.send(Event::Listing(listing(&list.items))).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Event::ApiDown(format!(
                    "the API server did not answer a pod list for {} s: {e}",
                    config.api_timeout.as_secs()
                )));
                return;
            }
        }
    }
}

struct Control {
    config: K8sConfig,
    driver: Arc<Driver>,
    shared: Arc<Shared>,
    store: SnapshotStore,
    allocator: Allocator,
    removals: Removals,
    /// Pods whose create is in flight.
    creating: BTreeSet<String>,
    registered: BTreeSet<String>,
    epoch: Instant,
    events: Receiver<Event>,
    tx: Sender<Event>,
    api: Api<Pod>,
    runtime: Handle,
}

impl Control {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn event(&self, what: std::fmt::Arguments<'_>) {
        tracing::info!(target: EVENTS_TARGET, "{what}");
    }

    fn fail(&self, reason: String) {
        let mut failure = lock(&self.shared.failure);
        if failure.is_none() {
            tracing::error!("{reason}");
            *failure = Some(reason);
        }
    }

    fn run(mut self) {
        let subscriber = self.store.subscribe(0, 64);
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.apply_events();
            let Ok(view) = self.driver.executors_view() else {
                break;
            };
            let now_us = self.now_us();
            self.registered = view.executors.iter().map(|(n, _)| n.clone()).collect();
            let frozen = self.shared.frozen.load(Ordering::SeqCst);
            for delivery in self.store.poll_deliveries(now_us) {
                for snapshot in &delivery.snapshots {
                    if !frozen {
                        self.allocator.on_snapshot(now_us, snapshot);
                    }
                    for (name, reason) in self.removals.on_snapshot(snapshot) {
                        self.event(format_args!("executor {name} removed: {reason:?}"));
                        let _ = self.driver.remove_executor(&name, reason);
                    }
                }
                self.store.delivered(subscriber);
            }
            let idle = view
                .executors
                .iter()
                .filter(|(_, running)| *running == 0)
                .map(|(name, _)| name.as_str());
            self.allocator
                .on_load(now_us, view.pending_tasks, view.running_tasks, idle);
            if !frozen {
                self.allocator.tick(now_us);
                while let Some(output) = self.allocator.poll_output() {
                    self.carry_out(output);
                }
            }
            self.update_stats();
            std::thread::sleep(self.config.tick);
        }
        // What arrived since the last tick still counts.
        self.apply_events();
        self.update_stats();
    }

    fn apply_events(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            let now_us = self.now_us();
            match event {
                Event::Update(name, state) => {
                    if self.store.current().get(&name) != Some(&state) {
                        self.event(format_args!("executor {name} {state}"));
                    }
                    self.store.update(now_us, &name, state);
                }
                Event::Listing(mut items) => {
                    for name in &self.creating {
                        if !items.iter().any(|(n, _)| n == name) {
                            items.push((name.clone(), ExecutorState::Pending));
                        }
                    }
                    self.store.replace_all(now_us, items);
                }
                Event::Created(name) => {
                    self.creating.remove(&name);
                    lock(&self.shared.stats).created += 1;
                    if self.store.current().get(&name) == Some(&ExecutorState::Pending) {
                        self.store.update(now_us, &name, ExecutorState::Pending);
                    }
                }
                Event::CreateFailed(name, error) => {
                    // Refused (invalid, forbidden, no such namespace): the next pod would be
                    // refused the same way, so the application stops with the server's reason.
                    self.creating.remove(&name);
                    let failed = ExecutorState::Failed {
                        code: -1,
                        caused_by_app: false,
                    };
                    self.store.update(now_us, &name, failed);
                    self.fail(format!("the API server refused pod {name}: {error}"));
                }
                Event::ApiDown(reason) => self.fail(reason),
            }
        }
    }

    fn carry_out(&mut self, output: AllocatorOutput) {
        match output {
            AllocatorOutput::Create(names) => {
                for name in names {
                    let now_us = self.now_us();
                    self.creating.insert(name.clone());
                    self.store.update(now_us, &name, ExecutorState::Pending);
                    self.event(format_args!("executor {name} requested"));
                    let pod = executor_pod(&self.config.pods, &name);
                    let api = self.api.clone();
                    let tx = self.tx.clone();
                    let budget = self.config.api_timeout;
                    self.runtime.spawn(async move {
                        let what = format!("create pod {name}");
                        let post = PostParams::default();
                        let result = with_retry(&what, budget, || api.create(&post, &pod)).await;
                        let event = match result {
                            Ok(_) => Event::Created(name),
                            // A retried create whose first attempt got through.
                            Err(e) if status_code(&e) == Some(409) => Event::Created(name),
                            Err(e) if retryable(&e) => Event::ApiDown(format!(
                                "the API server did not accept pod {name} for {} s: {e}",
                                budget.as_secs()
                            )),
                            Err(e) => Event::CreateFailed(name, e.to_string()),
                        };
                        let _ = tx.send(event);
                    });
                }
            }
            AllocatorOutput::Delete(names) => {
                for name in names {
                    let stopped = self.registered.contains(&name)
                        && self.driver.stop_executor(&name).unwrap_or(false);
                    self.event(format_args!(
                        "executor {name} deleted{}",
                        if stopped {
                            " (stopped by the driver)"
                        } else {
                            ""
                        }
                    ));
                    let api = self.api.clone();
                    let budget = self.config.api_timeout;
                    let grace = self.config.delete_grace_s;
                    let tx = self.tx.clone();
                    self.runtime.spawn(async move {
                        let what = format!("delete pod {name}");
                        let params = DeleteParams::default().grace_period(grace);
                        match with_retry(&what, budget, || api.delete(&name, &params)).await {
                            Ok(_) => {}
                            Err(e) if status_code(&e) == Some(404) => {}
                            Err(e) if retryable(&e) => {
                                let _ = tx.send(Event::ApiDown(format!(
                                    "the API server did not delete pod {name} for {} s: {e}",
                                    budget.as_secs()
                                )));
                            }
                            Err(e) => tracing::error!("cannot delete pod {name}: {e}"),
                        }
                    });
                }
            }
            AllocatorOutput::Stop(reason) => {
                self.event(format_args!("stopping the application: {reason}"));
                self.fail(reason);
            }
        }
    }

    fn update_stats(&self) {
        let registered = self.registered.len() as u64;
        let allocator = self.allocator.stats();
        let mut stats = lock(&self.shared.stats);
        stats.registered = registered;
        stats.peak = stats.peak.max(registered);
        stats.deleted = allocator.deleted;
        stats.pending_timeouts = allocator.pending_timeouts;
        stats.failed = allocator.failures;
    }
}
