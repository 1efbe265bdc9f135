//! Every message Flint speaks, declared once in a table: its kind number, its fields in wire
//! order. The table generates [`Kind`], [`Message`], and their decoding and encoding.
//!
//! Messages borrow: a decoded `Message<'a>` holds `&'a str` and `&'a [u8]` views into the frame
//! body it came from (see `Frame::share` to keep a part as `Bytes`), and lists are [`List`] views
//! that allocate nothing per item. To send, build a `Message` from borrowed data and call
//! [`Message::encode`]; many frames may be appended to one buffer before a single write.

use bytes::BytesMut;

use super::codec::{head, wire_enum, wire_struct, Field, List, Reader, WireByte};
use super::frame::encode_frame;
use super::WireError;

/// Bytes that open every connection's first frame: "FLNT".
pub const MAGIC: [u8; 4] = *b"FLNT";

/// The protocol version this build speaks. Peers must match exactly. 2: executors run lanes
/// (`RegisterExecutor.lanes`, `RegisteredExecutor.lane_key`, `JoinLane`, `LaneJoined`).
/// 3: the proofs cover the whole transcript and the connector proves itself first; frames to
/// and from a master or a worker are sealed (`crate::handshake`, `crate::seal`).
/// 4: a launch names its function by an index the connection defined (`DefineFunction`).
pub const PROTOCOL_VERSION: u16 = 4;

/// The handshake's magic field: reads only [`MAGIC`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Magic;

impl<'a> Field<'a> for Magic {
    const ENCODED_LEN_MIN: usize = 4;
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        let magic = *reader.array::<4>()?;
        if magic == MAGIC {
            Ok(Magic)
        } else {
            Err(WireError::BadMagic(magic))
        }
    }
    fn write(&self, out: &mut BytesMut) {
        MAGIC.write(out);
    }
    #[cfg(test)]
    fn sample(_: &mut super::sample::Rng, out: &mut BytesMut) {
        Magic.write(out);
    }
}

/// The handshake's version field: reads only [`PROTOCOL_VERSION`], so a peer of another version
/// is refused before anything version-specific in its frame is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Version;

impl<'a> Field<'a> for Version {
    const ENCODED_LEN_MIN: usize = 2;
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        let theirs = u16::read(reader)?;
        if theirs == PROTOCOL_VERSION {
            Ok(Version)
        } else {
            Err(WireError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs,
            })
        }
    }
    fn write(&self, out: &mut BytesMut) {
        PROTOCOL_VERSION.write(out);
    }
    #[cfg(test)]
    fn sample(_: &mut super::sample::Rng, out: &mut BytesMut) {
        Version.write(out);
    }
}

wire_enum! {
    /// What a peer is, announced in its handshake.
    pub enum Role {
        /// The driver: schedules tasks.
        Driver = 1,
        /// An executor: runs tasks.
        Executor = 2,
        /// The standalone master.
        Master = 3,
        /// A standalone worker: starts executor processes.
        Worker = 4,
        /// A command-line client (`flint status`, `flint submit`).
        Client = 5,
    }
}

wire_enum! {
    /// How a connection authenticates.
    pub enum AuthMethod {
        /// No authentication.
        None = 0,
        /// HMAC-SHA256 over the peer's nonce with a shared secret.
        HmacSha256 = 1,
    }
}

/// A task attempt's state, as an executor reports it: the scheduler's own, carried as it is.
pub use flint_engine::scheduler::TaskState;

wire_enum! {
    impl Field for TaskState {
        Running = 1,
        Finished = 2,
        Failed = 3,
        Killed = 4,
        Lost = 5,
    }
}

/// An executor process's state (a worker reports it), a worker's and an application's (the
/// master's status answer): the engine's own enums, encoded here.
pub use flint_engine::standalone::{AppState, ProcessState, WorkerState};

wire_enum! {
    impl Field for ProcessState {
        Launching = 1,
        Running = 2,
        Killed = 3,
        Failed = 4,
        Lost = 5,
        Exited = 6,
    }
}

// 3 was `Decommissioned`, a state no role ever produced; it is no longer a valid value.
wire_enum! {
    impl Field for WorkerState {
        Alive = 1,
        Dead = 2,
        Unknown = 4,
    }
}

wire_enum! {
    impl Field for AppState {
        Waiting = 1,
        Running = 2,
        Finished = 3,
        Failed = 4,
        Killed = 5,
    }
}

wire_struct! {
    /// A key and a value (executor attributes, settings, environment variables).
    pub struct KeyValue<'a> {
        /// The key.
        pub key: &'a str,
        /// The value.
        pub value: &'a str,
    }
}

wire_struct! {
    /// A named counter in a heartbeat.
    pub struct Metric<'a> {
        /// The metric's name.
        pub name: &'a str,
        /// Its value.
        pub value: u64,
    }
}

/// One task in a `LaunchTasks` batch. Encoded as its fields in order, like a
/// `wire_struct!`'s; read and written by hand, its fixed head at once (`codec::head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLaunch<'a> {
    /// The task's id, unique within its driver.
    pub task_id: u64,
    /// Which attempt of the task this is, from 0.
    pub attempt: u32,
    /// Cores the task needs.
    pub cores: u32,
    /// The registered function to run: an index this connection defined with
    /// `DefineFunction` before (below [`FUNCTIONS_PER_CONNECTION`](super::limits::FUNCTIONS_PER_CONNECTION)).
    pub function: u32,
    /// The function's input.
    pub payload: &'a [u8],
}

impl<'a> Field<'a> for TaskLaunch<'a> {
    /// Id, attempt, cores, function and the payload's length.
    const ENCODED_LEN_MIN: usize = 24;
    #[inline]
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        let h: &[u8; 24] = reader.array()?;
        Ok(TaskLaunch {
            task_id: u64::from_le_bytes(head::bytes_at(h, 0)),
            attempt: u32::from_le_bytes(head::bytes_at(h, 8)),
            cores: u32::from_le_bytes(head::bytes_at(h, 12)),
            function: u32::from_le_bytes(head::bytes_at(h, 16)),
            payload: reader.take(u32::from_le_bytes(head::bytes_at(h, 20)) as usize)?,
        })
    }
    #[inline]
    fn write(&self, out: &mut BytesMut) {
        let mut h = [0u8; 24];
        head::put(&mut h, 0, &self.task_id.to_le_bytes());
        head::put(&mut h, 8, &self.attempt.to_le_bytes());
        head::put(&mut h, 12, &self.cores.to_le_bytes());
        head::put(&mut h, 16, &self.function.to_le_bytes());
        head::put(&mut h, 20, &head::len_u32(self.payload));
        head::finish(out, &h, self.payload);
    }
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        <u64 as Field>::sample(rng, out);
        <u32 as Field>::sample(rng, out);
        <u32 as Field>::sample(rng, out);
        <u32 as Field>::sample(rng, out);
        <&[u8] as Field>::sample(rng, out);
    }
}

/// One entry in a `StatusUpdates` batch. Encoded as its fields in order, like a
/// `wire_struct!`'s; read and written by hand, its fixed head at once (`codec::head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusUpdate<'a> {
    /// The task's id.
    pub task_id: u64,
    /// The attempt this is about.
    pub attempt: u32,
    /// The attempt's new state.
    pub state: TaskState,
    /// `Finished`: the result. `Failed`, `Killed`, `Lost`: UTF-8 text saying why.
    /// `Running`: empty.
    pub data: &'a [u8],
}

impl<'a> Field<'a> for StatusUpdate<'a> {
    /// Id, attempt, state and the data's length.
    const ENCODED_LEN_MIN: usize = 17;
    #[inline]
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        let h: &[u8; 17] = reader.array()?;
        Ok(StatusUpdate {
            task_id: u64::from_le_bytes(head::bytes_at(h, 0)),
            attempt: u32::from_le_bytes(head::bytes_at(h, 8)),
            state: TaskState::read(&mut Reader::new(std::slice::from_ref(&h[12])))?,
            data: reader.take(u32::from_le_bytes(head::bytes_at(h, 13)) as usize)?,
        })
    }
    #[inline]
    fn write(&self, out: &mut BytesMut) {
        let mut h = [0u8; 17];
        head::put(&mut h, 0, &self.task_id.to_le_bytes());
        head::put(&mut h, 8, &self.attempt.to_le_bytes());
        h[12] = self.state.wire_byte();
        head::put(&mut h, 13, &head::len_u32(self.data));
        head::finish(out, &h, self.data);
    }
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        <u64 as Field>::sample(rng, out);
        <u32 as Field>::sample(rng, out);
        <TaskState as Field>::sample(rng, out);
        <&[u8] as Field>::sample(rng, out);
    }
}

wire_struct! {
    /// What an application asks the master for, and what a worker needs to start its executors.
    pub struct AppDescription<'a> {
        /// The application's name.
        pub name: &'a str,
        /// The address executors connect to.
        pub driver_addr: &'a str,
        /// The executor program; empty means the worker's own `flint executor`.
        pub command: &'a str,
        /// Arguments to the executor program.
        pub args: List<'a, &'a str>,
        /// Environment for the executor processes.
        pub env: List<'a, KeyValue<'a>>,
        /// Cores each executor gets.
        pub cores_per_executor: u32,
        /// Most cores the application may hold in total.
        pub max_cores: u32,
        /// Memory each executor gets, in MiB.
        pub memory_mb: u64,
    }
}

wire_struct! {
    /// A worker in a status answer.
    pub struct WorkerStatus<'a> {
        /// The worker's id.
        pub worker_id: &'a str,
        /// Its host.
        pub host: &'a str,
        /// Its port.
        pub port: u16,
        /// Its state.
        pub state: WorkerState,
        /// Cores it offers.
        pub cores: u32,
        /// Cores in use.
        pub cores_used: u32,
        /// Memory it offers, in MiB.
        pub memory_mb: u64,
        /// Memory in use, in MiB.
        pub memory_used_mb: u64,
    }
}

wire_struct! {
    /// An application in a status answer.
    pub struct AppStatus<'a> {
        /// The application's id.
        pub app_id: &'a str,
        /// Its name.
        pub name: &'a str,
        /// Its state.
        pub state: AppState,
        /// Cores granted to it.
        pub cores_granted: u32,
        /// Executors it asked for.
        pub executors_requested: u32,
        /// Why it does not have all it asked for (empty: it does, or it is over).
        pub waiting: &'a str,
    }
}

wire_struct! {
    /// An executor in a status answer.
    pub struct ExecutorStatus<'a> {
        /// Its application.
        pub app_id: &'a str,
        /// Its id.
        pub executor_id: &'a str,
        /// The worker it runs on.
        pub worker_id: &'a str,
        /// Its cores.
        pub cores: u32,
        /// Its state.
        pub state: ProcessState,
    }
}

/// Declares the message table: kinds, the `Message` enum, decoding and encoding.
macro_rules! messages {
    ($(
        $(#[$meta:meta])*
        $name:ident = $kind:literal { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? }
    ),* $(,)?) => {
        /// A message's kind, as the frame header carries it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Kind {
            $($(#[$meta])* $name = $kind),*
        }

        impl Kind {
            /// Every kind, in table order.
            pub const ALL: &'static [Kind] = &[$(Kind::$name),*];

            /// The kind with this number, if there is one.
            pub fn from_u16(value: u16) -> Option<Kind> {
                match value {
                    $($kind => Some(Kind::$name),)*
                    _ => None,
                }
            }

            /// The message's name.
            pub fn name(self) -> &'static str {
                match self { $(Kind::$name => stringify!($name)),* }
            }
        }

        /// A message, borrowing its strings and byte strings from the frame it was decoded from
        /// (or from whatever it was built from).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Message<'a> {
            $($(#[$meta])* $name { $($(#[$fmeta])* $field: $ty),* }),*
        }

        impl<'a> Message<'a> {
            /// This message's kind.
            pub fn kind(&self) -> Kind {
                match self { $(Message::$name { .. } => Kind::$name),* }
            }

            fn read_body(kind: Kind, reader: &mut Reader<'a>) -> Result<Self, WireError> {
                match kind {
                    $(Kind::$name => Ok(Message::$name { $($field: Field::read(reader)?),* }),)*
                }
            }

            /// Appends a random valid body of this kind (property tests).
            #[cfg(test)]
            pub(crate) fn sample_body(kind: Kind, rng: &mut super::sample::Rng, out: &mut BytesMut) {
                match kind {
                    $(Kind::$name => { $(<$ty as Field<'a>>::sample(rng, out);)* })*
                }
            }

            fn write_body(&self, out: &mut BytesMut) {
                match self {
                    $(Message::$name { $($field),* } => { $(Field::write($field, out);)* })*
                }
            }
        }
    };
}

messages! {
    // ---- handshake: the first frame each side sends on every connection ----
    /// Opens a connection: who is speaking, which protocol, how it will prove itself.
    Hello = 1 {
        /// Always [`MAGIC`].
        magic: Magic,
        /// Always [`PROTOCOL_VERSION`]; a peer of another version is refused.
        version: Version,
        /// What the sender is.
        role: Role,
        /// How the sender expects to authenticate.
        auth: AuthMethod,
        /// A fresh random challenge for the peer's proof.
        nonce: [u8; 32],
    },
    /// The proof of the shared secret: HMAC-SHA256 over the peer's nonce.
    AuthProof = 2 {
        /// The proof.
        proof: [u8; 32],
    },
    /// The handshake is refused (bad proof, wrong role); the connection closes after it.
    HandshakeRefused = 3 {
        /// Why.
        reason: &'a str,
    },

    // ---- driver <-> executor ----
    /// An executor asks to join the driver.
    RegisterExecutor = 16 {
        /// The executor's id, unique among the driver's executors.
        executor_id: &'a str,
        /// The host it runs on.
        host: &'a str,
        /// Cores it offers.
        cores: u32,
        /// Its lanes: connections, each with its own event loop, this one being lane 0; the
        /// others join with `JoinLane`. 1 to `LANES_MAX`, and no more than `cores`.
        lanes: u32,
        /// Free-form attributes.
        attributes: List<'a, KeyValue<'a>>,
    },
    /// The driver accepts an executor.
    RegisteredExecutor = 17 {
        /// How often the executor must heartbeat, in milliseconds.
        heartbeat_interval_ms: u32,
        /// What the executor's other lanes show in `JoinLane` to prove they belong to it
        /// (random, never logged; zeros for an executor of one lane).
        lane_key: [u8; 32],
    },
    /// The driver refuses an executor; it exits with this reason.
    RegisterExecutorFailed = 18 {
        /// Why.
        reason: &'a str,
    },
    /// Tasks for an executor to run, batched.
    LaunchTasks = 19 {
        /// The tasks.
        tasks: List<'a, TaskLaunch<'a>>,
    },
    /// Task state changes from an executor, batched.
    StatusUpdates = 20 {
        /// The updates.
        updates: List<'a, StatusUpdate<'a>>,
    },
    /// The driver asks an executor to kill a task attempt.
    KillTask = 21 {
        /// The task.
        task_id: u64,
        /// The attempt.
        attempt: u32,
        /// Why.
        reason: &'a str,
    },
    /// An executor says it is alive.
    Heartbeat = 22 {
        /// The executor.
        executor_id: &'a str,
        /// Tasks it is running.
        running_tasks: u32,
        /// Its counters.
        metrics: List<'a, Metric<'a>>,
    },
    /// The driver's answer to a heartbeat.
    HeartbeatAck = 23 {},
    /// The driver tells an executor to exit cleanly.
    StopExecutor = 24 {},
    /// Either side is going away.
    Shutdown = 25 {},
    /// A registered executor's lane `lane` (1 or more) joins it on a connection of its own
    /// (after the handshake, in place of `RegisterExecutor`). Refused with
    /// `RegisterExecutorFailed`, and the connection closed.
    JoinLane = 26 {
        /// The executor, as it registered.
        executor_id: &'a str,
        /// Which lane this connection is, from 1 to the registered lanes less one.
        lane: u32,
        /// The key the driver gave the executor in `RegisteredExecutor`.
        lane_key: [u8; 32],
    },
    /// The driver accepts a lane: it may send it launches and kills from now on.
    LaneJoined = 27 {
        /// How often the lane must heartbeat, in milliseconds.
        heartbeat_interval_ms: u32,
    },

    // ---- standalone: worker <-> master ----
    /// A worker asks to join the master.
    RegisterWorker = 32 {
        /// The worker's id.
        worker_id: &'a str,
        /// Its host.
        host: &'a str,
        /// Its port.
        port: u16,
        /// Cores it offers.
        cores: u32,
        /// Memory it offers, in MiB.
        memory_mb: u64,
    },
    /// The master accepts a worker.
    RegisteredWorker = 33 {
        /// How often the worker must heartbeat, in milliseconds.
        heartbeat_interval_ms: u32,
    },
    /// The master refuses a worker.
    RegisterWorkerFailed = 34 {
        /// Why.
        reason: &'a str,
    },
    /// A worker says it is alive.
    WorkerHeartbeat = 35 {
        /// The worker.
        worker_id: &'a str,
    },
    /// The master tells a worker to start an executor.
    LaunchExecutor = 36 {
        /// The application.
        app_id: &'a str,
        /// The executor's id.
        executor_id: &'a str,
        /// The application's description.
        app: AppDescription<'a>,
        /// Cores for this executor.
        cores: u32,
        /// Memory for this executor, in MiB.
        memory_mb: u64,
    },
    /// A worker reports an executor's state (and the master forwards it to the application).
    ExecutorStateChanged = 37 {
        /// The application.
        app_id: &'a str,
        /// The executor.
        executor_id: &'a str,
        /// Its new state.
        state: ProcessState,
        /// What happened.
        message: &'a str,
        /// The exit code, once the process has exited.
        exit_code: Option<i32>,
    },
    /// The master tells a worker to kill an executor.
    KillExecutor = 38 {
        /// The application.
        app_id: &'a str,
        /// The executor.
        executor_id: &'a str,
    },
    /// The master tells a worker an application is over: kill its executors, clean up.
    ApplicationFinished = 39 {
        /// The application.
        app_id: &'a str,
    },

    // ---- standalone: application (driver) <-> master ----
    /// A driver registers an application.
    RegisterApplication = 48 {
        /// What it needs.
        app: AppDescription<'a>,
    },
    /// The master accepts an application.
    RegisteredApplication = 49 {
        /// The id the master gave it.
        app_id: &'a str,
    },
    /// The master placed an executor for an application.
    ExecutorAdded = 50 {
        /// The application.
        app_id: &'a str,
        /// The executor.
        executor_id: &'a str,
        /// The worker it runs on.
        worker_id: &'a str,
        /// The worker's host and port.
        host_port: &'a str,
        /// Its cores.
        cores: u32,
        /// Its memory, in MiB.
        memory_mb: u64,
    },
    /// An application asks for this many executors in total.
    RequestExecutors = 51 {
        /// The application.
        app_id: &'a str,
        /// The total it wants.
        total: u32,
    },
    /// An application asks for these executors to be killed.
    KillExecutors = 52 {
        /// The application.
        app_id: &'a str,
        /// The executors.
        executor_ids: List<'a, &'a str>,
    },
    /// An application is done.
    UnregisterApplication = 53 {
        /// The application.
        app_id: &'a str,
    },
    /// The master removed an application.
    ApplicationRemoved = 54 {
        /// The application.
        app_id: &'a str,
        /// Why.
        reason: &'a str,
    },
    /// The master lost a worker (and the executors on it).
    WorkerRemoved = 55 {
        /// The worker.
        worker_id: &'a str,
        /// Its host.
        host: &'a str,
        /// Why.
        reason: &'a str,
    },

    // ---- status: client <-> master ----
    /// A client asks the master for the cluster's state.
    StatusRequest = 64 {},
    /// The master's answer.
    StatusResponse = 65 {
        /// Workers.
        workers: List<'a, WorkerStatus<'a>>,
        /// Applications.
        applications: List<'a, AppStatus<'a>>,
        /// Executors.
        executors: List<'a, ExecutorStatus<'a>>,
    },

    // ---- later additions (last in the table, so the fuzz corpus's kind indices stay) ----
    /// An executor is going away (it got SIGTERM): the driver gives it no new task; the ones
    /// it runs end or come back as killed (Spark's executor decommissioning).
    ExecutorDraining = 28 {},
    /// The driver names function `index` for the launches that follow on this connection
    /// (replacing the name it had). Each connection has [`FUNCTIONS_PER_CONNECTION`](super::limits::FUNCTIONS_PER_CONNECTION) indexes.
    DefineFunction = 29 {
        /// The index launches will carry.
        index: u32,
        /// The registered function's name.
        name: &'a str,
    },
}

impl<'a> Message<'a> {
    /// A handshake opener for `role`.
    pub fn hello(role: Role, auth: AuthMethod, nonce: [u8; 32]) -> Self {
        Message::Hello {
            magic: Magic,
            version: Version,
            role,
            auth,
            nonce,
        }
    }

    /// Decodes a body of the given kind. The whole body must be the message: bytes left over
    /// are an error, as is any malformed field.
    pub fn decode(kind: u16, body: &'a [u8]) -> Result<Self, WireError> {
        let kind = Kind::from_u16(kind).ok_or(WireError::UnknownKind(kind))?;
        let mut reader = Reader::new(body);
        let message = Message::read_body(kind, &mut reader)?;
        reader.finish()?;
        Ok(message)
    }

    /// Decodes the first frame of a connection, which must be a [`Message::Hello`]: the kind is
    /// checked before anything else, then the magic, then the version.
    pub fn decode_hello(kind: u16, body: &'a [u8]) -> Result<Self, WireError> {
        if kind != Kind::Hello as u16 {
            return Err(WireError::ExpectedHandshake { kind });
        }
        Message::decode(kind, body)
    }

    /// Appends this message as one frame. Fails, leaving `out` as it was, if the body would be
    /// larger than `frame_size_max`.
    pub fn encode(&self, out: &mut BytesMut, frame_size_max: usize) -> Result<(), WireError> {
        encode_frame(out, self.kind(), frame_size_max, |out| self.write_body(out))
    }

    /// Appends just the body (what `encode` puts after the header).
    pub fn encode_body(&self, out: &mut BytesMut) {
        self.write_body(out);
    }
}
