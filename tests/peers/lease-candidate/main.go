// lease-candidate is the client-go side of tether's leader-election interop
// test, and the witness that every candidate's manager runs.
//
//	lease-candidate elect --identity go-0 ...   a candidate on a LeaseLock
//	lease-candidate write --identity r0 ...     a manager that writes until SIGTERM
//
// While it may act, each appends to one witness log, on CLOCK_MONOTONIC in
// nanoseconds:
//
//	start <t> <identity>
//	write <t> <identity> <seq> <rv>   t: when the write was sent; rv: the
//	                                  ConfigMap's resourceVersion it made
//	stop <t> <identity>
//
// and writes {holder, seq} to one ConfigMap. The test's auditor checks that
// no two tenures overlap, that every write falls inside its writer's, and,
// by resourceVersion, that no write of an older tenure landed after one of
// a newer.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: lease-candidate elect|write [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	flags := flag.NewFlagSet(mode, flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "the cluster that holds the Lease and the ConfigMap")
	namespace := flags.String("namespace", "default", "the namespace of both")
	identity := flags.String("identity", "", "this candidate's identity")
	witness := flags.String("witness", "", "the witness log to append to")
	configMap := flags.String("configmap", "witness", "the ConfigMap every leader writes")
	lease := flags.String("lease", "tether", "the Lease (elect)")
	leaseDuration := flags.Duration("lease-duration", 15*time.Second, "LeaseDuration (elect)")
	renewDeadline := flags.Duration("renew-deadline", 10*time.Second, "RenewDeadline (elect)")
	retryPeriod := flags.Duration("retry-period", 2*time.Second, "RetryPeriod (elect)")
	_ = flags.Parse(os.Args[2:])
	if *identity == "" || *witness == "" {
		fmt.Fprintln(os.Stderr, "lease-candidate: --identity and --witness are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease-candidate: kubeconfig:", err)
		os.Exit(2)
	}
	config.Timeout = *retryPeriod
	// No client-side rate limit (client-go's default is 5 requests a
	// second): a write that waits its turn is sent after the check that
	// allowed it, and a renewal that waits behind writes comes late.
	config.QPS = -1
	client := kubernetes.NewForConfigOrDie(config)
	log, err := os.OpenFile(*witness, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease-candidate: witness:", err)
		os.Exit(2)
	}
	w := &writer{client: client, namespace: *namespace, name: *configMap, identity: *identity, log: log}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	switch mode {
	case "write":
		// A manager under tether: it acts from start to SIGTERM.
		w.run(ctx, func() bool { return true })
	case "elect":
		elect(ctx, client, w, *namespace, *lease, *leaseDuration, *renewDeadline, *retryPeriod)
	default:
		fmt.Fprintln(os.Stderr, "lease-candidate: unknown mode", mode)
		os.Exit(2)
	}
}

// elect stands for the Lease until ctx ends, as a client-go controller does
// with ReleaseOnCancel. It writes while it leads and its lease is surely its
// own: within RenewDeadline of *sending* its last renewal that succeeded, on
// its own clock, as tether fences. (client-go's own Check counts from when
// the answer came back: a leader frozen while a renewal was in flight
// trusts it after the thaw, when another may hold the Lease.) When it may
// no longer write it lets go, as a controller exits, and stands again.
func elect(ctx context.Context, client kubernetes.Interface, w *writer, namespace, lease string, leaseDuration, renewDeadline, retryPeriod time.Duration) {
	for ctx.Err() == nil {
		term, letGo := context.WithCancel(ctx)
		// OnStartedLeading runs in a goroutine of its own: this term waits
		// for it, and one that starts after the term ended does nothing.
		var (
			mu      sync.Mutex
			ended   bool
			running sync.WaitGroup
			elector *leaderelection.LeaderElector
		)
		lock := &fencedLock{leaseDuration: leaseDuration, LeaseLock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: w.identity},
		}}
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   leaseDuration,
			RenewDeadline:   renewDeadline,
			RetryPeriod:     retryPeriod,
			ReleaseOnCancel: true,
			Name:            lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(leading context.Context) {
					mu.Lock()
					if ended {
						mu.Unlock()
						return
					}
					running.Add(1)
					mu.Unlock()
					defer running.Done()
					w.run(leading, func() bool {
						return elector.IsLeader() && lock.sentWithin(renewDeadline)
					})
					letGo()
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "lease-candidate:", err)
			os.Exit(2)
		}
		elector.Run(term)
		letGo()
		mu.Lock()
		ended = true
		mu.Unlock()
		running.Wait()
	}
}

// fencedLock is a LeaseLock that remembers when the last write of the
// Lease that succeeded was sent, releases only a Lease it holds, and waits
// before it creates a missing one: the three places where stock client-go
// let two candidates act at once in tether's interop test (docs/ha.md).
type fencedLock struct {
	*resourcelock.LeaseLock
	leaseDuration time.Duration
	mu            sync.Mutex
	sent          time.Time
	holder        string    // as last read
	vanished      time.Time // when the Lease was first found missing
}

func (l *fencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	record, raw, err := l.LeaseLock.Get(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.holder = record.HolderIdentity
		l.vanished = time.Time{}
	case apierrors.IsNotFound(err) && l.vanished.IsZero():
		l.vanished = time.Now()
	}
	return record, raw, err
}

// Create creates the Lease, unless it was found missing less than a lease
// duration ago and this candidate did not hold it: client-go creates a
// missing Lease and leads at once, while a holder it never saw, or saw
// before the Lease was deleted, acts on until its next try. tether waits,
// and so does this candidate.
func (l *fencedLock) Create(ctx context.Context, record resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	mayBeHeld := l.holder != l.Identity() && time.Since(l.vanished) < l.leaseDuration
	l.mu.Unlock()
	if mayBeHeld {
		return errors.New("the Lease was found missing less than a lease duration ago")
	}
	at := time.Now()
	err := l.LeaseLock.Create(ctx, record)
	l.succeeded(at, err)
	return err
}

func (l *fencedLock) Update(ctx context.Context, record resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	holder := l.holder
	l.mu.Unlock()
	if record.HolderIdentity == "" && holder != l.Identity() {
		// client-go v0.37's release reads the Lease, then asks whether it
		// leads by the record it saw *before* that read: a leader paused
		// past its renew deadline, its renewals never tried, releases the
		// Lease another candidate took meanwhile. Found by this test.
		return nil
	}
	at := time.Now()
	err := l.LeaseLock.Update(ctx, record)
	l.succeeded(at, err)
	return err
}

func (l *fencedLock) succeeded(at time.Time, err error) {
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if at.After(l.sent) {
		l.sent = at
	}
}

// sentWithin says whether the last write that succeeded was sent less than
// d ago.
func (l *fencedLock) sentWithin(d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.sent.IsZero() && time.Since(l.sent) < d
}

type writer struct {
	client          kubernetes.Interface
	namespace, name string
	identity        string
	log             *os.File
	seq             int
}

// run writes {holder, seq} every 50ms while ctx lasts and mayAct holds,
// noting its start before the first write and its stop at the end.
func (w *writer) run(ctx context.Context, mayAct func() bool) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	started := false
	defer func() {
		if started {
			w.note("stop")
		}
	}()
	for {
		if ctx.Err() != nil || !mayAct() {
			return
		}
		if !started {
			w.note("start")
			started = true
		}
		w.seq++
		if sent, rv, err := w.write(ctx, mayAct); err == nil {
			w.noteAt(sent, "write", strconv.Itoa(w.seq), rv)
		} else if !errors.Is(err, context.Canceled) && !errors.Is(err, errMayNotAct) {
			fmt.Fprintln(os.Stderr, "lease-candidate: write:", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

var errMayNotAct = errors.New("may no longer act")

// write sets {holder, seq}, with the resourceVersion it read, if mayAct
// still holds once it has read: when the write was sent, and the
// resourceVersion it made.
func (w *writer) write(ctx context.Context, mayAct func() bool) (int64, string, error) {
	data := map[string]string{"holder": w.identity, "seq": strconv.Itoa(w.seq)}
	maps := w.client.CoreV1().ConfigMaps(w.namespace)
	current, err := maps.Get(ctx, w.name, metav1.GetOptions{})
	if !mayAct() {
		return 0, "", errMayNotAct
	}
	sent := monotonic()
	var written *corev1.ConfigMap
	switch {
	case apierrors.IsNotFound(err):
		written, err = maps.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.namespace, Name: w.name},
			Data:       data,
		}, metav1.CreateOptions{})
	case err == nil:
		current.Data = data
		written, err = maps.Update(ctx, current, metav1.UpdateOptions{})
	}
	if err != nil {
		return 0, "", err
	}
	return sent, written.ResourceVersion, nil
}

// monotonic is CLOCK_MONOTONIC in nanoseconds: one clock for every process.
func monotonic() int64 {
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		panic(err)
	}
	return now.Nano()
}

// note appends one line to the witness log, stamped now.
func (w *writer) note(what string, extra ...string) {
	w.noteAt(monotonic(), what, extra...)
}

// noteAt appends one line to the witness log, stamped at.
func (w *writer) noteAt(at int64, what string, extra ...string) {
	line := fmt.Sprintf("%s %d %s", what, at, w.identity)
	for _, e := range extra {
		line += " " + e
	}
	if _, err := w.log.WriteString(line + "\n"); err != nil {
		panic(err)
	}
}
