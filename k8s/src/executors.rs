//! Executor pods kept at the allocator's target: [`PodBackend`], the
//! [`ExecutorBackend`] for Kubernetes (as `flint_net::lifecycle::local::LocalBackend` is for
//! local processes), run by the lifecycle loop ([`LifecycleThread`]).
//!
//! On a tokio runtime:
//!
//! - *watch source*: lists the app's pods (label selector), then watches from the list's
//!   `resourceVersion`, keeping the newest one seen; a watch that ends normally resumes from
//!   it, one answered with 410 Gone (an `ERROR` event or status) or a dropped stream re-lists.
//!   Each event is an update, each list a full listing;
//! - *list*: the lifecycle asks for a full list every `poll_interval` (the polling source);
//! - *create* and *delete*: the pod creates and deletes the lifecycle asks for, each with
//!   [`with_retry`] (a pod whose create is in flight counts as pending in listings).
//!
//! A registered executor is stopped through the driver before its pod is deleted. An API
//! server that does not answer for `api_timeout`, or that refuses a pod (invalid, forbidden:
//! the next one would be refused too), makes [`K8sExecutors::failed`] say so.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::lifecycle::{Allocation, AllocatorConfig, ExecutorState};
use flint_net::driver::Driver;
use flint_net::lifecycle::{
    ExecutorBackend, ExecutorStats, LifecycleThread, Observed, RunnerConfig,
};
use flint_net::observe::EventSink;
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
    /// How often the lifecycle ticks.
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
    /// The lifecycle's counters (`started`: pods created).
    pub executors: ExecutorStats,
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

/// The lifecycle thread and the watch source (see the module docs).
#[derive(Debug)]
pub struct K8sExecutors {
    thread: Option<LifecycleThread<PodBackend>>,
    watch: TaskHandle<()>,
    watch_lists: Arc<AtomicU64>,
}

impl K8sExecutors {
    /// Starts the watch source and the lifecycle thread on `runtime`; the first pods are
    /// created on the first tick. Call [`prepare`] first.
    pub fn start(
        config: K8sConfig,
        client: Client,
        runtime: Handle,
        driver: Arc<Driver>,
    ) -> std::io::Result<K8sExecutors> {
        let api: Api<Pod> = Api::namespaced(client, &config.pods.namespace);
        let (tx, rx) = channel();
        let watch_lists = Arc::new(AtomicU64::new(0));
        let watch = runtime.spawn(watch_source(
            api.clone(),
            config.clone(),
            tx.clone(),
            watch_lists.clone(),
        ));
        let events = EventSink::new(|line| tracing::info!(target: EVENTS_TARGET, "{line}"));
        let runner = RunnerConfig::new(
            Allocation::Create(config.allocator.clone()),
            [config.tick, config.poll_interval, config.sync_grace],
            Some(events),
            "flint-k8s-executors",
        );
        let backend = PodBackend {
            config,
            creating: BTreeSet::new(),
            events: rx,
            tx,
            api,
            runtime,
        };
        let thread = LifecycleThread::start(runner, backend, driver)?;
        Ok(K8sExecutors {
            thread: Some(thread),
            watch,
            watch_lists,
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> K8sStats {
        K8sStats {
            executors: self
                .thread
                .as_ref()
                .map(LifecycleThread::stats)
                .unwrap_or_default(),
            watch_lists: self.watch_lists.load(Ordering::SeqCst),
        }
    }

    /// Why the application must stop (too many executor failures, the API server gone), once
    /// it must.
    pub fn failed(&self) -> Option<String> {
        self.thread.as_ref().and_then(LifecycleThread::failed)
    }

    /// Stops creating and deleting pods (states are still watched): call before stopping the
    /// executors at the end.
    pub fn freeze(&self) {
        if let Some(thread) = &self.thread {
            thread.freeze();
        }
    }

    /// Stops the lifecycle thread and the watch (the pods stay: see [`cleanup`]); returns the
    /// final counters.
    pub fn stop(mut self) -> K8sStats {
        K8sStats {
            executors: self.halt(),
            watch_lists: self.watch_lists.load(Ordering::SeqCst),
        }
    }

    fn halt(&mut self) -> ExecutorStats {
        self.watch.abort();
        self.thread
            .take()
            .map(|thread| thread.stop().0)
            .unwrap_or_default()
    }
}

impl Drop for K8sExecutors {
    fn drop(&mut self) {
        let _ = self.halt();
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
async fn watch_source(api: Api<Pod>, config: K8sConfig, tx: Sender<Event>, lists: Arc<AtomicU64>) {
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
        lists.fetch_add(1, Ordering::SeqCst);
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

/// Executor pods through the API server (see the module docs).
pub struct PodBackend {
    config: K8sConfig,
    /// Pods whose create is in flight.
    creating: BTreeSet<String>,
    events: Receiver<Event>,
    tx: Sender<Event>,
    api: Api<Pod>,
    runtime: Handle,
}

impl ExecutorBackend for PodBackend {
    fn create(&mut self, name: &str) {
        self.creating.insert(name.to_owned());
        tracing::info!(target: EVENTS_TARGET, "executor {name} requested");
        let pod = executor_pod(&self.config.pods, name);
        let (api, tx, budget) = (self.api.clone(), self.tx.clone(), self.config.api_timeout);
        let name = name.to_owned();
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

    fn delete(&mut self, name: &str, _stopped: bool) {
        let (api, tx, budget) = (self.api.clone(), self.tx.clone(), self.config.api_timeout);
        let grace = self.config.delete_grace_s;
        let name = name.to_owned();
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

    fn list(&mut self) {
        let (api, tx, budget) = (self.api.clone(), self.tx.clone(), self.config.api_timeout);
        let params = ListParams::default().labels(&pods::selector(&self.config.pods.app_id));
        self.runtime.spawn(async move {
            let event = match with_retry("poll pods", budget, || api.list(&params)).await {
                Ok(list) => Event::Listing(listing(&list.items)),
                Err(e) => Event::ApiDown(format!(
                    "the API server did not answer a pod list for {} s: {e}",
                    budget.as_secs()
                )),
            };
            let _ = tx.send(event);
        });
    }

    fn poll(&mut self, out: &mut Vec<Observed>) {
        while let Ok(event) = self.events.try_recv() {
            out.push(self.observed(event));
        }
    }
}

impl PodBackend {
    /// What an API task's event means for the lifecycle.
    fn observed(&mut self, event: Event) -> Observed {
        match event {
            Event::Update(name, state) => Observed::Update(name, state),
            Event::Listing(mut items) => {
                for name in &self.creating {
                    if !items.iter().any(|(n, _)| n == name) {
                        items.push((name.clone(), ExecutorState::Pending));
                    }
                }
                Observed::Listing(items)
            }
            Event::Created(name) => {
                self.creating.remove(&name);
                Observed::Created(name)
            }
            Event::CreateFailed(name, error) => {
                // Refused (invalid, forbidden, no such namespace): the next pod would be
                // refused the same way, so the application stops with the server's reason.
                self.creating.remove(&name);
                Observed::Failed(format!("the API server refused pod {name}: {error}"))
            }
            Event::ApiDown(reason) => Observed::Failed(reason),
        }
    }
}
