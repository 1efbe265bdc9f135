//! `flint-k8s`: run a job with executors as Kubernetes pods (`flint-k8s submit --master
//! k8s://...`; `flint submit --master k8s://...` runs this binary). The driver runs here
//! (client mode); its executor pods are created, watched and deleted through the API server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use flint_cli::run::{
    driver_config, exit_code, json_or_plain, print_summary, run_job, validate, wait_for_executors,
    JobArgs,
};
use flint_cli::stop::Stop;
use flint_engine::lifecycle::{AllocatorConfig, DynamicConfig};
use flint_k8s::api::{version_warning, with_retry};
use flint_k8s::executors::{self, K8sConfig, K8sExecutors, K8sStats};
use flint_k8s::pods::PodSettings;
use flint_net::driver::{Driver, DriverConfig};
use flint_net::handshake::{random_nonce, Secret};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

#[derive(Parser)]
#[command(
    name = "flint-k8s",
    version,
    about = "Flint on Kubernetes: a driver here, its executors as pods"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a job with executor pods: create them, wait for them, run the job, delete them.
    Submit(SubmitArgs),
}

#[derive(Args)]
struct SubmitArgs {
    /// `k8s://https://HOST:PORT` (credentials from $KUBECONFIG or the pod's service account),
    /// `k8s://http://HOST:PORT` (no credentials: a local proxy or the test double), or `k8s://`
    /// alone for $KUBECONFIG / in-cluster config.
    #[arg(long)]
    master: String,
    /// Namespace of the executor pods (default: the config's namespace).
    #[arg(long)]
    namespace: Option<String>,
    /// The executor image (needs `flint` on its PATH, see the Dockerfile).
    #[arg(long)]
    image: Option<String>,
    /// A pod (JSON) to build executor pods from: node selectors, tolerations, volumes, a
    /// container named `executor` to fill in.
    #[arg(long)]
    pod_template: Option<PathBuf>,
    /// The program the executor container runs (words split on whitespace); the image from
    /// the Dockerfile has `tini` as init so the executor is not PID 1.
    #[arg(long, default_value = "tini -- flint")]
    executor_command: String,
    /// Executors to keep (with --max-executors: the fewest), and to wait for before the job.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    executors: u32,
    /// Cores per executor (its cpu request).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    cores: u32,
    /// Memory per executor, in MiB: its request and limit (0: none).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=16_777_216))]
    memory_mb: u64,
    /// A node label the executor pods must match, KEY=VALUE (repeat for more; Spark's
    /// `spark.kubernetes.node.selector.*`).
    #[arg(long = "node-selector", value_name = "KEY=VALUE", value_parser = key_value)]
    node_selector: Vec<(String, String)>,
    /// A taint the executor pods tolerate: KEY[=VALUE][:EFFECT] (operator `Equal` with a value,
    /// `Exists` without; EFFECT one of NoSchedule, PreferNoSchedule, NoExecute; repeatable).
    #[arg(long = "toleration", value_name = "KEY[=VALUE][:EFFECT]", value_parser = toleration)]
    tolerations: Vec<Toleration>,
    /// The executor container's image pull policy.
    #[arg(long, value_parser = ["Always", "IfNotPresent", "Never"])]
    image_pull_policy: Option<String>,
    /// A Secret to pull the image with (repeatable).
    #[arg(long = "image-pull-secret", value_name = "NAME")]
    image_pull_secrets: Vec<String>,
    /// The executor pods' service account (default: the template's, else the namespace's
    /// `default`).
    #[arg(long)]
    service_account: Option<String>,
    /// A label for the executor pods, KEY=VALUE (repeatable; Flint's own labels win).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
    labels: Vec<(String, String)>,
    /// An annotation for the executor pods, KEY=VALUE (repeatable).
    #[arg(long = "annotation", value_name = "KEY=VALUE", value_parser = key_value)]
    annotations: Vec<(String, String)>,
    /// The executor pods' terminationGracePeriodSeconds, and the grace of the deletes Flint
    /// makes: how long a deleted executor has between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3600))]
    executor_grace_s: u32,
    /// Dynamic allocation: between --executors and this many pods, following the backlog.
    #[arg(long)]
    max_executors: Option<u32>,
    /// With --max-executors: an executor idle this long is released.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    idle_timeout_ms: u64,
    /// With --max-executors: after the job, wait up to this long for idle executors to be
    /// released down to --executors (shows in `executors_end`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    idle_wait_ms: u64,
    /// The application id (pod and label names); pods left by a previous driver with the same
    /// id are deleted first. Default: `flint-` and random hex.
    #[arg(long)]
    app_id: Option<String>,
    /// Address the driver listens on (must be reachable from the pods).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The driver's address as the pods reach it: IP:PORT, or an IP alone for the listening
    /// port (default: the listen address).
    #[arg(long)]
    driver_address: Option<String>,
    /// The driver's own pod, when it runs in one (default: $FLINT_DRIVER_POD_NAME): executor
    /// pods get an owner reference to it.
    #[arg(long)]
    driver_pod_name: Option<String>,
    /// Pods created at most per round.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch_size: u32,
    /// Time between rounds of pod creation.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    batch_delay_ms: u64,
    /// A pod not running this long after its creation is deleted and replaced.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pending_timeout_ms: u64,
    /// Executor failures tolerated; one more stops the application with an error.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    max_executor_failures: u32,
    /// Full pod list every this many milliseconds (the polling source).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    poll_interval_ms: u64,
    /// How long API calls are retried before the application fails.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    api_timeout_ms: u64,
    /// `timeoutSeconds` of each watch request.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3600))]
    watch_timeout_s: u32,
    /// How long to wait for the executors, in seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    wait_s: u64,
    /// Print a line per executor event (pod requested, state change, removal, deletion).
    #[arg(long)]
    executor_events: bool,
    #[command(flatten)]
    job: JobArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube's client logs every failed request; the retries log their own line.
        .unwrap_or_else(|_| "warn,kube_client=off".into());
    let Cmd::Submit(args) = &cli.command;
    if args.executor_events {
        if let Ok(directive) = format!("{}=info", executors::EVENTS_TARGET).parse() {
            filter = filter.add_directive(directive);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Cmd::Submit(args) => submit(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("flint-k8s: {message}");
            ExitCode::from(2)
        }
    }
}

/// `KEY=VALUE`, both non-empty (the API server checks the label syntax).
fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// `KEY[=VALUE][:EFFECT]` as a toleration.
fn toleration(text: &str) -> Result<Toleration, String> {
    let (rest, effect) = match text.rsplit_once(':') {
        Some((rest, effect)) => (rest, Some(effect)),
        None => (text, None),
    };
    if let Some(effect) = effect {
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            return Err(format!(
                "{text:?}: the effect must be NoSchedule, PreferNoSchedule or NoExecute"
            ));
        }
    }
    let (key, value) = match rest.split_once('=') {
        Some((key, value)) => (key, Some(value.to_owned())),
        None => (rest, None),
    };
    if key.is_empty() {
        return Err(format!("{text:?}: no key"));
    }
    Ok(Toleration {
        key: Some(key.to_owned()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value,
        effect: effect.map(str::to_owned),
        ..Toleration::default()
    })
}

fn random_hex(len: usize) -> Result<String, String> {
    let bytes = random_nonce().map_err(|e| format!("no randomness: {e}"))?;
    Ok(bytes
        .iter()
        .take(len.div_ceil(2))
        .flat_map(|b| [b >> 4, b & 15])
        .take(len)
        .map(|n| char::from(b"0123456789abcdef"[n as usize]))
        .collect())
}

async fn client_for(master: &str) -> Result<kube::Client, String> {
    let rest = master
        .strip_prefix("k8s://")
        .ok_or("--master must start with k8s://")?;
    let config = if rest.is_empty() {
        kube::Config::infer().await.map_err(|e| {
            format!("no Kubernetes config ($KUBECONFIG, ~/.kube/config or in-cluster): {e}")
        })?
    } else {
        let url: http::Uri = rest
            .parse()
            .map_err(|e| format!("--master: bad URL {rest:?}: {e}"))?;
        if rest.starts_with("http://") {
            kube::Config::new(url)
        } else {
            let mut config = kube::Config::infer().await.map_err(|e| {
                format!(
                    "no credentials for {rest} ($KUBECONFIG, ~/.kube/config or in-cluster): {e}"
                )
            })?;
            config.cluster_url = url;
            config
        }
    };
    kube::Client::try_from(config).map_err(|e| format!("cannot make a Kubernetes client: {e}"))
}

fn valid_app_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 40
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && id.as_bytes()[0].is_ascii_lowercase()
        && !id.ends_with('-')
}

fn submit(args: SubmitArgs) -> Result<ExitCode, String> {
    let (template, app_id) = check_submit(&args)?;
    let stop = Stop::catch("flint-k8s")?;
    let runtime = api_runtime()?;
    let client = runtime.block_on(client_for(&args.master))?;
    check_version(
        &runtime,
        &client,
        Duration::from_millis(args.api_timeout_ms),
    );
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let api_timeout = Duration::from_millis(args.api_timeout_ms);

    // The shared secret: the driver checks it, the pods read it from the app's Secret.
    let secret_value = random_hex(32)?;
    let driver = start_driver(&args, &secret_value)?;
    let listening = driver.local_addr().ok_or("the driver has no address")?;
    let driver_addr = driver_address(&args, listening)?;
    let owner = driver_owner(&args, &runtime, &client, &namespace, api_timeout)?;
    let settings = pod_settings(&args, (&app_id, &namespace), driver_addr, owner, template);
    runtime
        .block_on(executors::prepare(
            client.clone(),
            &settings,
            &secret_value,
            api_timeout,
        ))
        .map_err(|e| e.to_string())?;
    let min = args.executors;
    let k8s = k8s_config(&args, settings.clone(), api_timeout);
    let driver = Arc::new(driver);
    let pods = K8sExecutors::start(
        k8s,
        client.clone(),
        runtime.handle().clone(),
        driver.clone(),
    )
    .map_err(|e| format!("cannot start the executor pods' control: {e}"))?;
    eprintln!(
        "flint-k8s: application {app_id} in namespace {namespace}, driver on {driver_addr}, waiting for {min} executors"
    );
    let result = run_with_pods(&args, &stop, &driver, &pods);
    let registered_end = pods.stats().executors.registered;
    let (stats, cleaned) = stop_and_clean(&runtime, client, &settings, api_timeout, pods, driver);
    if let Some(code) = stop.exit("flint-k8s") {
        cleaned.map_err(|e| e.to_string())?;
        return Ok(code);
    }
    let summary = result?;
    cleaned.map_err(|e| e.to_string())?;
    let extra = summary_extra(&args, &app_id, &namespace, &stats, registered_end);
    print_summary(&summary, &args.job, &extra);
    Ok(exit_code(&summary))
}

/// The executor pods' settings from the flags.
fn pod_settings(
    args: &SubmitArgs,
    (app_id, namespace): (&str, &str),
    driver_addr: SocketAddr,
    owner: Option<OwnerReference>,
    template: Option<Pod>,
) -> PodSettings {
    PodSettings {
        app_id: app_id.to_owned(),
        namespace: namespace.to_owned(),
        image: args.image.clone(),
        executor_command: args.executor_command.clone(),
        driver_addr: driver_addr.to_string(),
        cores: args.cores,
        memory_mb: args.memory_mb,
        node_selector: args.node_selector.iter().cloned().collect(),
        tolerations: args.tolerations.clone(),
        image_pull_policy: args.image_pull_policy.clone(),
        image_pull_secrets: args.image_pull_secrets.clone(),
        service_account: args.service_account.clone(),
        labels: args.labels.iter().cloned().collect(),
        annotations: args.annotations.iter().cloned().collect(),
        grace_s: args.executor_grace_s,
        secret_name: format!("{app_id}-secret"),
        owner,
        template,
    }
}

/// Warns (on stderr) when the API server's version is outside the supported ones, or cannot
/// be read.
fn check_version(runtime: &tokio::runtime::Runtime, client: &kube::Client, budget: Duration) {
    let answer = runtime.block_on(with_retry("get /version", budget, || {
        client.apiserver_version()
    }));
    match answer {
        Ok(info) => {
            if let Some(warning) = version_warning(&info.major, &info.minor) {
                eprintln!("flint-k8s: warning: {warning}");
            }
        }
        Err(error) => {
            eprintln!("flint-k8s: warning: cannot read the API server's version: {error}")
        }
    }
}

/// The one-thread runtime the Kubernetes API calls run on.
fn api_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("flint-k8s-api")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the API runtime: {e}"))
}

/// Stops the executors and their pods' control, then deletes the app's pods and Secret
/// (waiting up to 60 s); the pods' counts and how the cleanup went (reported here).
fn stop_and_clean(
    runtime: &tokio::runtime::Runtime,
    client: kube::Client,
    settings: &PodSettings,
    api_timeout: Duration,
    pods: K8sExecutors,
    driver: Arc<Driver>,
) -> (K8sStats, Result<(), executors::K8sError>) {
    pods.freeze();
    let _ = driver.stop_executors(Duration::from_secs(5));
    let stats = pods.stop();
    drop(driver);
    let cleaned = runtime.block_on(executors::cleanup(
        client,
        settings,
        api_timeout,
        Duration::from_secs(60),
    ));
    if let Err(error) = &cleaned {
        eprintln!("flint-k8s: cleanup: {error}");
    }
    (stats, cleaned)
}

/// The checks on `submit`'s arguments made before anything starts: the job, the executor
/// counts, the pod template (read here), the image and the application id (drawn if not given).
fn check_submit(args: &SubmitArgs) -> Result<(Option<Pod>, String), String> {
    validate(&args.job)?;
    if args.executors == 0 && args.max_executors.is_none() {
        return Err("--executors must be at least 1 (or give --max-executors)".into());
    }
    if args
        .max_executors
        .is_some_and(|max| max < args.executors.max(1))
    {
        return Err("--max-executors must be at least --executors and 1".into());
    }
    let template = read_template(args)?;
    let has_image = args.image.is_some()
        || template.as_ref().is_some_and(|t| {
            t.spec
                .as_ref()
                .is_some_and(|s| s.containers.iter().any(|c| c.image.is_some()))
        });
    if !has_image {
        return Err("--image is required (or a --pod-template whose container has one)".into());
    }
    let app_id = match args.app_id.clone() {
        Some(id) => id,
        None => format!("flint-{}", random_hex(10)?),
    };
    if !valid_app_id(&app_id) {
        return Err(format!(
            "--app-id {app_id:?}: at most 40 characters of a-z, 0-9 and '-', starting with a letter"
        ));
    }
    Ok((template, app_id))
}

/// The `--pod-template` file parsed as a pod, if one is given.
fn read_template(args: &SubmitArgs) -> Result<Option<Pod>, String> {
    let Some(path) = &args.pod_template else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let pod = serde_json::from_str(&text)
        .map_err(|e| format!("--pod-template {}: not a pod in JSON: {e}", path.display()))?;
    Ok(Some(pod))
}

/// The driver, listening, checking `secret_value`.
fn start_driver(args: &SubmitArgs, secret_value: &str) -> Result<Driver, String> {
    let secret = Secret::new(secret_value.to_string().into_bytes()).map_err(|e| e.to_string())?;
    let config = DriverConfig {
        listen: args.listen,
        secret: Some(secret),
        ..driver_config(&args.job)
    };
    Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())
}

/// The address the pods dial: `--driver-address` (IP:PORT, or an IP with the listening port),
/// else the listening address, which then must not be unspecified.
fn driver_address(args: &SubmitArgs, listening: SocketAddr) -> Result<SocketAddr, String> {
    let driver_addr = match &args.driver_address {
        None => listening,
        Some(text) => match (text.parse::<SocketAddr>(), text.parse::<std::net::IpAddr>()) {
            (Ok(addr), _) => addr,
            (_, Ok(ip)) => SocketAddr::new(ip, listening.port()),
            _ => return Err(format!("--driver-address {text:?}: not IP:PORT nor an IP")),
        },
    };
    if driver_addr.ip().is_unspecified() {
        return Err("--driver-address is needed when listening on an unspecified address".into());
    }
    Ok(driver_addr)
}

/// The owner reference to the driver's own pod (`--driver-pod-name` or
/// `$FLINT_DRIVER_POD_NAME`), so the executor pods go when it goes; `None` outside a pod.
fn driver_owner(
    args: &SubmitArgs,
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    namespace: &str,
    api_timeout: Duration,
) -> Result<Option<OwnerReference>, String> {
    let driver_pod = args
        .driver_pod_name
        .clone()
        .or_else(|| std::env::var("FLINT_DRIVER_POD_NAME").ok());
    let Some(name) = &driver_pod else {
        return Ok(None);
    };
    let owner = runtime
        .block_on(executors::owner_reference(
            client.clone(),
            namespace,
            name,
            api_timeout,
        ))
        .map_err(|e| format!("cannot find the driver's pod {name}: {e}"))?;
    Ok(Some(owner))
}

/// The executor pods' control settings from the arguments: the allocator's batches, timeouts
/// and (with `--max-executors`) its dynamic range, the API's poll and watch timings.
fn k8s_config(args: &SubmitArgs, settings: PodSettings, api_timeout: Duration) -> K8sConfig {
    let min = args.executors;
    let dynamic = args.max_executors.map(|max| DynamicConfig {
        min,
        max,
        tasks_per_executor: args.cores.saturating_mul(args.job.tasks_per_core),
        idle_timeout_us: args.idle_timeout_ms.saturating_mul(1000),
    });
    let name_prefix = format!("{}-exec-", settings.app_id);
    let mut k8s = K8sConfig::new(settings);
    k8s.allocator = AllocatorConfig {
        batch_size: args.batch_size.max(1),
        batch_delay_us: args.batch_delay_ms.saturating_mul(1000),
        pending_timeout_us: args.pending_timeout_ms.saturating_mul(1000),
        failures_max: args.max_executor_failures,
        initial_target: min,
        dynamic,
        name_prefix,
    };
    k8s.poll_interval = Duration::from_millis(args.poll_interval_ms.max(10));
    k8s.api_timeout = api_timeout;
    k8s.watch_timeout_s = args.watch_timeout_s.max(1);
    k8s.delete_grace_s = args.executor_grace_s;
    k8s
}

/// Waits for the executors, runs the job (stopped early if the pods fail or a signal comes),
/// then with `--max-executors` waits up to `--idle-wait-ms` for the idle ones to be released.
fn run_with_pods(
    args: &SubmitArgs,
    stop: &Stop,
    driver: &Driver,
    pods: &K8sExecutors,
) -> Result<flint_cli::summary::Summary, String> {
    let min = args.executors;
    let failed = || stop.reason().or_else(|| pods.failed());
    let result = wait_for_executors(
        driver,
        min as usize,
        Duration::from_secs(args.wait_s),
        &failed,
    )
    .and_then(|()| run_job(driver, &args.job, &failed));
    if result.is_ok() && args.max_executors.is_some() && args.idle_wait_ms > 0 {
        let deadline = Instant::now() + Duration::from_millis(args.idle_wait_ms);
        while Instant::now() < deadline && pods.stats().executors.registered > u64::from(min) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    result
}

/// The Kubernetes lines of the job's summary: the application, the pods' counts.
fn summary_extra(
    args: &SubmitArgs,
    app_id: &str,
    namespace: &str,
    stats: &K8sStats,
    registered_end: u64,
) -> Vec<(&'static str, String)> {
    let min = args.executors;
    let mut extra = vec![
        ("app_id", json_or_plain(&args.job, app_id)),
        ("namespace", json_or_plain(&args.job, namespace)),
        ("cores", args.cores.to_string()),
        ("pods_created", stats.executors.started.to_string()),
        ("executors_peak", stats.executors.peak.to_string()),
        ("executors_end", registered_end.to_string()),
        ("executors_deleted", stats.executors.deleted.to_string()),
        ("executors_failed", stats.executors.failed.to_string()),
        (
            "pending_timeouts",
            stats.executors.pending_timeouts.to_string(),
        ),
        ("watch_lists", stats.watch_lists.to_string()),
    ];
    match args.max_executors {
        Some(max) => {
            extra.push(("min_executors", min.to_string()));
            extra.push(("max_executors", max.to_string()));
        }
        None => extra.push(("executors", min.to_string())),
    }
    extra
}
