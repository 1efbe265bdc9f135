//! flint-flood: a `flint driver`'s HTTP port under the attacks of issue 25, or polled as an
//! open page and a Prometheus would, measured while a job runs: the good requests' status and
//! latency, the job's time, and the driver's CPU (the whole process and its HTTP threads, from
//! `/proc`). One JSON line per run; `ci/bench_http` runs the sweep and pairs the figures.
//!
//! The good client asks from 127.0.0.2 every `--every-ms`; the attacker comes from 127.0.0.3-6
//! (`flint_net::observe::http::flood`). The driver runs `--tasks` tasks of `--task` on one
//! 2-core executor. `--token secret` makes the good client show the cluster secret (as builds
//! before the observe token took it), `--token printed` the observe token the driver printed
//! the file of.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use flint_net::observe::http::flood;

const SECRET: &str = "flint-flood-secret";

#[derive(Parser)]
#[command(about = "A flint driver's HTTP port under attack, measured")]
struct Args {
    /// The flint binary (default: the one beside this program).
    #[arg(long)]
    flint: Option<PathBuf>,
    /// none, slow (300 slow heads), held (10,000 held connections), unauth (16 threads
    /// without the token), poll (the page, the API and the metrics once a second).
    #[arg(long, default_value = "none")]
    attack: String,
    /// Tasks in the job.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u64,
    /// The task function.
    #[arg(long, default_value = "noop")]
    task: String,
    /// How the good client shows itself: `printed` (the observe token) or `secret`.
    #[arg(long, default_value = "printed")]
    token: String,
    /// Milliseconds between the good client's requests.
    #[arg(long, default_value_t = 100)]
    every_ms: u64,
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// CPU seconds of process `pid` (all threads) and of its threads named `flint-http*`.
fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let ticks = |stat: &str| -> Option<(String, f64)> {
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let fields: Vec<&str> = rest.split(' ').collect();
        let user: f64 = fields.get(11)?.parse().ok()?;
        let system: f64 = fields.get(12)?.parse().ok()?;
        Some((name.to_owned(), (user + system) / 100.0))
    };
    let (_, total) = ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let mut http = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if let Some((name, seconds)) = ticks(&stat) {
            if name.starts_with("flint-http") {
                http += seconds;
            }
        }
    }
    Some((total, http))
}

fn descriptor_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(0)
}

fn start_attack(attack: &str, to: SocketAddr) -> Result<Option<flood::Flood>, String> {
    let from: Vec<IpAddr> = (3..7).map(ip).collect();
    Ok(match attack {
        "none" | "poll" => None,
        "slow" => Some(flood::slow_headers(
            from,
            to,
            300,
            Duration::from_millis(100),
        )),
        "held" if descriptor_limit() < 10_500 => {
            return Err("held needs a descriptor limit of 10,500 (ulimit -n)".into())
        }
        "held" => Some(flood::held(from, to, 10_000)),
        "unauth" => Some(flood::unauthenticated(ip(3), to, 16)),
        other => return Err(format!("unknown attack {other}")),
    })
}

/// The good client's latencies (ms) and the statuses that were not 200.
#[derive(Default)]
struct Good {
    took_ms: Vec<f64>,
    not_ok: Vec<u16>,
}

fn good_client(
    http: SocketAddr,
    token: String,
    args_every: Duration,
    poll: bool,
    done: &AtomicBool,
    good: &Mutex<Good>,
) {
    let paths: &[&str] = if poll {
        &[
            "/",
            "/api/v1/series",
            "/api/v1/timeline",
            "/api/v1/jobs",
            "/metrics",
        ]
    } else {
        &["/metrics", "/"]
    };
    let mut i = 0;
    while !done.load(Ordering::Relaxed) {
        let path = paths[i % paths.len()];
        let answer = flood::get(ip(2), http, path, Some(&token), Duration::from_secs(10));
        let mut g = good.lock().expect("good");
        match answer {
            Ok(a) => {
                g.took_ms.push(a.took.as_secs_f64() * 1e3);
                if a.status != 200 {
                    g.not_ok.push(a.status);
                }
            }
            // A request cut by the driver's exit is not the server's failure.
            Err(_) if done.load(Ordering::Relaxed) => {}
            Err(_) => g.not_ok.push(0),
        }
        drop(g);
        i += 1;
        // Polling: the whole page's requests each second, like an open page and a scraper.
        if !poll || i % paths.len() == 0 {
            std::thread::sleep(args_every);
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

struct Run {
    driver: Child,
    executor: Child,
    http: SocketAddr,
    stderr: PathBuf,
}

fn start(args: &Args, flint: &Path) -> Result<Run, String> {
    let (listen, http) = (free_addr(), free_addr());
    let stderr = std::env::temp_dir().join(format!("flint-flood-{}.err", std::process::id()));
    let driver = Command::new(flint)
        .env("FLINT_SECRET", SECRET)
        .args([
            "driver",
            "--listen",
            &listen.to_string(),
            "--executors",
            "1",
        ])
        .args([
            "--tasks",
            &args.tasks.to_string(),
            "--task",
            &args.task,
            "--json",
        ])
        .args(["--ui-listen", &http.to_string()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("{}: {e}", flint.display()))?;
    let executor = Command::new(flint)
        .env("FLINT_SECRET", SECRET)
        .args(["executor", "--driver", &listen.to_string(), "--cores", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    Ok(Run {
        driver,
        executor,
        http,
        stderr,
    })
}

/// The token the good client shows, once the server answers.
fn token_of(args: &Args, run: &Run) -> Result<String, String> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let up = flood::get(ip(2), run.http, "/metrics", None, Duration::from_secs(1)).is_ok();
        let printed = std::fs::read_to_string(&run.stderr).unwrap_or_default();
        let path = printed
            .lines()
            .find_map(|l| l.split("observe token in ").nth(1)?.split(' ').next());
        match (args.token.as_str(), up, path) {
            ("secret", true, _) => return Ok(SECRET.into()),
            ("printed", true, Some(path)) => {
                let token = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
                return Ok(token.trim().to_owned());
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Err("the driver's HTTP port never answered (or printed no token)".into())
}

fn run(args: &Args) -> Result<(), String> {
    let flint = match &args.flint {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("flint"),
    };
    let mut run = start(args, &flint)?;
    let pid = run.driver.id();
    let token = token_of(args, &run)?;
    let attack = start_attack(&args.attack, run.http)?;
    let done = Arc::new(AtomicBool::new(false));
    let good = Arc::new(Mutex::new(Good::default()));
    let client = {
        let (done, good, http) = (done.clone(), good.clone(), run.http);
        let every = Duration::from_millis(args.every_ms);
        let poll = args.attack == "poll";
        std::thread::spawn(move || good_client(http, token, every, poll, &done, &good))
    };
    let mut cpu = (0.0, 0.0);
    while run.driver.try_wait().map_err(|e| e.to_string())?.is_none() {
        if let Some(now) = cpu_seconds(pid) {
            cpu = now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, Ordering::Relaxed);
    let attacker = attack.map(flood::Flood::stop).unwrap_or_default();
    let _ = client.join();
    let _ = run.executor.kill();
    let _ = run.executor.wait();
    let mut summary = String::new();
    if let Some(mut out) = run.driver.stdout.take() {
        let _ = out.read_to_string(&mut summary);
    }
    let _ = std::fs::remove_file(&run.stderr);
    report(
        args,
        &flint,
        &summary,
        cpu,
        &good.lock().expect("good"),
        attacker,
    );
    Ok(())
}

fn field<'a>(json: &'a str, name: &str) -> &'a str {
    json.split(&format!("\"{name}\":"))
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .unwrap_or("null")
}

fn report(
    args: &Args,
    flint: &Path,
    summary: &str,
    cpu: (f64, f64),
    good: &Good,
    attacker: flood::FloodStats,
) {
    let mut took = good.took_ms.clone();
    took.sort_by(f64::total_cmp);
    println!(
        "{{\"attack\":\"{}\",\"flint\":\"{}\",\"tasks\":{},\"job_s\":{},\"tasks_per_s\":{},\
         \"driver_cpu_s\":{:.2},\"http_cpu_s\":{:.2},\"good\":{{\"asked\":{},\"not_200\":{},\
         \"statuses\":{:?},\
         \"p50_ms\":{:.1},\"p99_ms\":{:.1},\"max_ms\":{:.1}}},\"attacker\":{{\"connections\":{},\
         \"answers\":{},\"closed\":{}}},\"load_average\":\"{}\"}}",
        args.attack,
        flint.display(),
        args.tasks,
        field(summary, "elapsed_s"),
        field(summary, "tasks_per_s"),
        cpu.0,
        cpu.1,
        took.len() + good.not_ok.iter().filter(|s| **s == 0).count(),
        good.not_ok.len(),
        good.not_ok,
        quantile(&took, 0.5),
        quantile(&took, 0.99),
        took.last().copied().unwrap_or(0.0),
        attacker.connections,
        attacker.answers,
        attacker.closed,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .next()
            .unwrap_or(""),
    );
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flint-flood: {error}");
            ExitCode::from(2)
        }
    }
}
