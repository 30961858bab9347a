//! The exec manager's process in a container of its own: `tether launcher`
//! runs there, listens on a Unix socket in a volume both containers mount,
//! and starts, stops and reaps the process as tether asks. tether keeps
//! every decision (when to start, stop, restart), and its credentials stay
//! in its own container (docs/exec.md, "The controller in a container of
//! its own").
//!
//! One connection is one run of the process, and the launcher serves one
//! connection at a time: a start is read only once the last run's group is
//! empty, so two runs never overlap. The connection is the fence: when it
//! closes (tether stopped, killed, or its container restarted), the
//! launcher kills the group at once and reaps it. The process dies with the
//! launcher, through the same child shim as in tether's own container.
//!
//! The protocol is JSON lines, each at most [`MAX_LINE`] bytes:
//!
//! - tether sends a [`Start`], and then at most a `stop` or a `kill`;
//! - the launcher answers `started` (with the pid, in its own container)
//!   or `failed`, and once the process and its group are gone, `exited`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader,
};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep, timeout};
use tracing::{info, warn};

use super::ExitHow;
use super::group::{Group, kill, pid_of, stop};
use super::program::{Spawner, Start, command};

/// The protocol's version, in each start; a launcher refuses another.
pub(super) const VERSION: u32 = 1;

/// The longest line either side sends: a start carries the environment,
/// with `TETHER_REMOTES` at 32 KiB among it.
const MAX_LINE: u64 = 1024 * 1024;

/// How long a connection may take to send its start.
const START_WITHIN: Duration = Duration::from_secs(10);

/// How long tether waits for a launcher's socket to appear and take
/// connections: both containers start together, and the launcher may come
/// up second.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// How often a missing or refusing socket is tried again.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

/// How long a launcher may take to answer a start beyond the grace period:
/// it first finishes stopping the run before, if one is still stopping.
const ANSWER_SLACK: Duration = Duration::from_secs(30);

/// What tether sends after its start.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Ask {
    /// The stop signal, then SIGKILL after the grace period.
    Stop,
    /// SIGKILL to the group now: the second SIGTERM.
    Kill,
}

/// What the launcher sends.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Answer {
    /// Running, with this pid in the launcher's container.
    Started { pid: u32 },
    /// Not started.
    Failed { error: String },
    /// Over: its exit code, or the signal that ended it.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

impl From<ExitHow> for Answer {
    fn from(how: ExitHow) -> Self {
        match how {
            ExitHow::Code(code) => Self::Exited {
                code: Some(code),
                signal: None,
            },
            ExitHow::Signal(signal) => Self::Exited {
                code: None,
                signal: Some(signal),
            },
        }
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes as JSON; `None` at the
/// end of the stream.
async fn read<T: for<'de> Deserialize<'de>>(
    reader: &mut (impl AsyncBufRead + Unpin),
) -> std::io::Result<Option<T>> {
    let mut line = Vec::new();
    let n = (&mut *reader)
        .take(MAX_LINE + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            if n as u64 > MAX_LINE {
                "a line longer than 1 MiB"
            } else {
                "a line cut short"
            },
        ));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidData, err))
}

async fn send<T: Serialize>(writer: &mut OwnedWriteHalf, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    writer.write_all(&line).await
}

// --- the launcher's side ---

/// `tether launcher --socket PATH`: serves starts on `socket` until SIGTERM
/// or SIGINT, and then until the running process (if any) has ended, so
/// that tether's stop, not the launcher's end, stops it.
///
/// # Errors
///
/// If the socket cannot be listened on (another launcher answers there,
/// or its folder cannot be written), or the signals or the spawning thread
/// cannot be set up.
pub async fn serve(socket: &Path) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let listener = listen(socket).await?;
    let spawner = Spawner::start()?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    info!(socket = %socket.display(), "launcher listening: tether starts its manager's process here");
    loop {
        let conn = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => conn,
                Err(err) => {
                    warn!(error = %err, "cannot accept a connection");
                    sleep(CONNECT_RETRY).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        let run = serve_one(conn, &spawner);
        tokio::pin!(run);
        let mut ending = false;
        loop {
            tokio::select! {
                () = &mut run => break,
                _ = term.recv(), if !ending => ending = true,
                _ = int.recv(), if !ending => ending = true,
            }
            info!(
                "launcher asked to end: it ends once tether has stopped the process, or it has ended"
            );
        }
        if ending {
            break;
        }
    }
    let _ = std::fs::remove_file(socket);
    info!("launcher ended");
    Ok(())
}

/// Listens on `socket`, replacing a file left there by a launcher that is
/// gone; refuses one that still answers.
async fn listen(socket: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt as _;

    if UnixStream::connect(socket).await.is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("another launcher answers on {}", socket.display()),
        ));
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(socket)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", socket.display()),
            ));
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    // Only its owner may connect: the socket starts processes.
    let mask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let listener = UnixListener::bind(socket);
    rustix::process::umask(mask);
    listener
}

/// Serves one connection: one run of the process, to its end.
async fn serve_one(conn: UnixStream, spawner: &Spawner) {
    let (read_half, mut writer) = conn.into_split();
    let mut reader = BufReader::new(read_half);
    let start: Start = match timeout(START_WITHIN, read(&mut reader)).await {
        Ok(Ok(Some(start))) => start,
        Ok(Ok(None)) => return,
        Ok(Err(err)) => {
            warn!(error = %err, "a connection sent no start it could read; closed");
            return;
        }
        Err(_) => {
            warn!(within = ?START_WITHIN, "a connection sent no start in time; closed");
            return;
        }
    };
    if start.version != VERSION {
        let error = format!(
            "this launcher speaks version {VERSION}, and was asked for {}: run the same tether in both containers",
            start.version
        );
        warn!(%error, "start refused");
        let _ = send(&mut writer, &Answer::Failed { error }).await;
        return;
    }
    let own = rustix::process::getpid().as_raw_nonzero().get();
    let binary = PathBuf::from("/proc/self/exe");
    let (mut child, _own) = match spawner.spawn(command(&binary, own, &start)).await {
        Ok(started) => started,
        Err(err) => {
            let error = format!(
                "cannot start {:?}: {err}",
                start.command.first().map_or("", String::as_str)
            );
            warn!(%error, "start failed");
            let _ = send(&mut writer, &Answer::Failed { error }).await;
            return;
        }
    };
    let pid = child
        .id()
        .expect("a child that was not waited for has its id");
    let group = Group(pid_of(pid).expect("a child's pid is positive"));
    info!(pid, cycle = start.cycle, "process started for tether");
    if send(&mut writer, &Answer::Started { pid }).await.is_err() {
        warn!(
            pid,
            "tether is gone before it heard of the start; killing the process group"
        );
    }
    let (signal, grace) = (start.stop_signal(), start.grace());
    let how = loop {
        tokio::select! {
            status = child.wait() => {
                let how = status.map_or(ExitHow::Code(-1), ExitHow::of);
                group.stop_leftovers(signal, grace).await;
                break how;
            }
            ask = read::<Ask>(&mut reader) => match ask {
                Ok(Some(Ask::Stop)) => break stop(&mut child, &group, signal, grace).await,
                Ok(Some(Ask::Kill)) => group.signal(Signal::KILL),
                Ok(None) | Err(_) => {
                    warn!(pid, "tether's connection closed: killing the process group");
                    break kill(&mut child, &group).await;
                }
            }
        }
    };
    info!(pid, exit = %how, "process ended");
    let _ = send(&mut writer, &Answer::from(how)).await;
}

// --- tether's side ---

/// A run of the process in the launcher's container.
#[derive(Debug)]
pub(super) struct Remote {
    pid: u32,
    asks: mpsc::UnboundedSender<Ask>,
    /// How it ended, from the task that reads the connection.
    ended: oneshot::Receiver<std::io::Result<ExitHow>>,
    /// Once taken from `ended`.
    how: Option<ExitHow>,
}

/// Connects to the launcher on `socket`, waiting up to [`CONNECT_WITHIN`]
/// for it to listen.
async fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    let deadline = Instant::now() + CONNECT_WITHIN;
    loop {
        match UnixStream::connect(socket).await {
            Ok(conn) => return Ok(conn),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && Instant::now() < deadline =>
            {
                sleep(CONNECT_RETRY).await;
            }
            Err(err) => {
                return Err(std::io::Error::new(
                    err.kind(),
                    format!("no launcher answers on {}: {err}", socket.display()),
                ));
            }
        }
    }
}

impl Remote {
    /// Asks the launcher on `socket` to start `start`.
    pub(super) async fn start(socket: &Path, start: &Start) -> std::io::Result<Self> {
        let conn = connect(socket).await?;
        let (read_half, mut writer) = conn.into_split();
        let mut reader = BufReader::new(read_half);
        send(&mut writer, start).await?;
        let within = start.grace() + ANSWER_SLACK;
        let answer = timeout(within, read::<Answer>(&mut reader))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the launcher did not answer the start within {within:?}"),
                )
            })??;
        let pid = match answer {
            Some(Answer::Started { pid }) => pid,
            Some(Answer::Failed { error }) => {
                // The launcher's container is the controller's: its words
                // are escaped and cut before they are logged or shown.
                return Err(std::io::Error::other(format!(
                    "the launcher: {}",
                    tether_supervisor::printable(&error, 512)
                )));
            }
            Some(Answer::Exited { .. }) | None => {
                return Err(std::io::Error::other(
                    "the launcher closed the connection without starting the process",
                ));
            }
        };
        let (asks, mut asked) = mpsc::unbounded_channel::<Ask>();
        let (tell, ended) = oneshot::channel();
        tokio::spawn(async move {
            let how = loop {
                tokio::select! {
                    answer = read::<Answer>(&mut reader) => break match answer {
                        Ok(Some(Answer::Exited { code, signal })) => Ok(match (code, signal) {
                            (Some(code), _) => ExitHow::Code(code),
                            (None, Some(signal)) => ExitHow::Signal(signal),
                            (None, None) => ExitHow::Code(-1),
                        }),
                        Ok(Some(_)) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the launcher answered out of turn")),
                        Ok(None) => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the launcher's connection closed before the process ended")),
                        Err(err) => Err(err),
                    },
                    ask = asked.recv() => match ask {
                        Some(ask) => {
                            if let Err(err) = send(&mut writer, &ask).await {
                                break Err(err);
                            }
                        }
                        // The run was let go: closing the connection has
                        // the launcher kill the group.
                        None => break Err(std::io::Error::other("the run was let go")),
                    },
                }
            };
            // The connection closes here, with the reader and the writer:
            // a launcher that did not finish kills the group.
            let _ = tell.send(how);
        });
        Ok(Self {
            pid,
            asks,
            ended,
            how: None,
        })
    }

    /// The pid, in the launcher's container.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends SIGKILL to the group at once, from anywhere.
    pub(super) fn killer(&self) -> impl Fn() + Send + Sync + 'static {
        let asks = self.asks.clone();
        move || {
            let _ = asks.send(Ask::Kill);
        }
    }

    /// Waits for the run's end: how the process ended, once its group is
    /// empty; an error if the launcher went first. Safe to cancel.
    pub(super) async fn wait(&mut self) -> std::io::Result<ExitHow> {
        if let Some(how) = self.how {
            return Ok(how);
        }
        let how = (&mut self.ended)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the launcher's connection ended")))?;
        self.how = Some(how);
        Ok(how)
    }

    /// Stops the run: the stop signal, then SIGKILL after `grace`, by the
    /// launcher. If it does not answer in time, the connection is dropped,
    /// which has it kill the group.
    pub(super) async fn stop(&mut self, grace: Duration) -> ExitHow {
        let _ = self.asks.send(Ask::Stop);
        let within = grace + super::group::KILL_WAIT + ANSWER_SLACK;
        match timeout(within, self.wait()).await {
            Ok(Ok(how)) => how,
            Ok(Err(err)) => {
                warn!(pid = self.pid, error = %err, "the launcher did not say how the process ended");
                ExitHow::Code(-1)
            }
            Err(_) => {
                warn!(
                    pid = self.pid,
                    ?within,
                    "the launcher did not stop the process in time; closing its connection, which has it kill the group"
                );
                ExitHow::Code(-1)
            }
        }
    }
}
