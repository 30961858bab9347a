//! Leadership as an input of the supervisor: cycles are built only while the
//! gate is open, and closing it ends the running cycle with
//! `leadership_lost`, whatever the manager does. On tokio's paused clock.

use prometheus::Registry;
use tether_supervisor::{
    Cause, CauseKind, CycleToken, ManagerError, ManagerFactory, Phase, ShutdownOutcome, Supervisor,
    SupervisorConfig,
};
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// Far longer than any schedule here, on the paused clock.
const DEADLOCK: std::time::Duration = std::time::Duration::from_secs(3600);

/// A manager that reports each cycle and runs until cancelled.
struct Reporting(mpsc::UnboundedSender<CycleToken>);

impl ManagerFactory for Reporting {
    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        cycle.set_manager_up(true);
        let _ = self.0.send(cycle.clone());
        cycle.cancelled().await;
        Ok(())
    }
}

/// A supervisor of a [`Reporting`] manager, and the cycles it reports.
fn reporting() -> (Supervisor<Reporting>, mpsc::UnboundedReceiver<CycleToken>) {
    let (cycles_tx, cycles) = mpsc::unbounded_channel();
    let supervisor = Supervisor::new(
        Reporting(cycles_tx),
        SupervisorConfig::default(),
        &Registry::new(),
    )
    .expect("valid");
    (supervisor, cycles)
}

/// The next cycle the manager reports.
async fn next(cycles: &mut mpsc::UnboundedReceiver<CycleToken>) -> CycleToken {
    timeout(DEADLOCK, cycles.recv())
        .await
        .expect("built")
        .expect("a cycle")
}

#[tokio::test(start_paused = true)]
async fn cycles_run_only_while_the_gate_is_open_and_its_closing_ends_one() {
    let (gate_tx, gate) = watch::channel(false);
    let (supervisor, mut cycles) = reporting();
    let supervisor = supervisor.build_while(gate);
    let handle = supervisor.handle();
    let root = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));

    // Closed: a minute passes with no cycle, standing by.
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    assert!(
        cycles.try_recv().is_err(),
        "a cycle ran while the gate was closed"
    );
    assert_eq!(handle.status().phase, Phase::Standby);
    assert!(!handle.status().manager_up);

    gate_tx.send_replace(true);
    let first = next(&mut cycles).await;
    assert_eq!(first.number(), 1);

    gate_tx.send_replace(false);
    timeout(DEADLOCK, first.cancelled())
        .await
        .expect("the closing ends the cycle");
    assert_eq!(
        first.cause().map(Cause::kind),
        Some(CauseKind::LeadershipLost)
    );
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    assert!(
        cycles.try_recv().is_err(),
        "a cycle was built after the leadership was lost"
    );
    assert_eq!(handle.status().phase, Phase::Standby);
    assert_eq!(
        handle.status().ended.get(&CauseKind::LeadershipLost),
        Some(&1)
    );

    gate_tx.send_replace(true);
    let second = next(&mut cycles).await;
    assert_eq!(second.number(), 2);
    root.cancel();
    assert_eq!(run.await.expect("joins"), ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_gate_built_with_its_own_cause_ends_a_cycle_with_that_cause() {
    let (gate_tx, gate) = watch::channel(true);
    let (supervisor, mut cycles) = reporting();
    let supervisor = supervisor.build_while_ending_with(gate, || Cause::ShardChanged {
        taken: 0,
        given_up: 3,
    });
    let root = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));
    let first = next(&mut cycles).await;
    gate_tx.send_replace(false);
    timeout(DEADLOCK, first.cancelled())
        .await
        .expect("the closing ends the cycle");
    assert_eq!(
        first.cause(),
        Some(&Cause::ShardChanged {
            taken: 0,
            given_up: 3
        })
    );
    root.cancel();
    assert_eq!(run.await.expect("joins"), ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_plan_change_sent_with_the_gates_closing_names_the_cause() {
    let (gate_tx, gate) = watch::channel(true);
    let (ends_tx, ends) = mpsc::unbounded_channel();
    let (supervisor, mut cycles) = reporting();
    let supervisor = supervisor
        .build_while(gate)
        .end_cycles_with(tokio_stream_of(ends));
    let root = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));
    let first = next(&mut cycles).await;
    // Both at once, before the loop runs again: the change is taken first.
    let cause = Cause::ShardChanged {
        taken: 0,
        given_up: 2,
    };
    ends_tx.send(cause.clone()).expect("the loop listens");
    gate_tx.send_replace(false);
    timeout(DEADLOCK, first.cancelled()).await.expect("ended");
    assert_eq!(first.cause(), Some(&cause));
    root.cancel();
    assert_eq!(run.await.expect("joins"), ShutdownOutcome::Clean);
}

/// The receiver as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
