// Package fleet runs one controller-runtime cluster.Cluster per remote that
// tether's exec manager lists as reachable in its remotes file
// (TETHER_REMOTES_FILE), and follows the file as tether rewrites it: a
// remote that appears is engaged (its cluster built and started under a
// context of its own), one that is lost or removed is disengaged (that
// context cancelled: its informers and everything started under it stop),
// and one whose generation changes is replaced by a fresh cluster, with a
// new client and a new cache.
//
// Run tether with `followsRemotesFile: true` on its exec manager, add a
// Fleet to the controller-runtime manager, and start each remote's
// controllers under the context Engage gives. A reconciler asks Get for a
// remote's cluster and gets ErrNotEngaged for one that is lost. ReadyCheck
// is a readyz check: every engaged cache synced.
//
// Once a revision of the file is applied (every remote it no longer runs
// disengaged, its cluster stopped), the Fleet says so in
// TETHER_APPLIED_FILE, which tether reads before it lets such a remote go
// to another replica: with sharding, a remote moves between replicas with
// no restart.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Version is this package's version; its releases are tagged
// fleet/<Version> in the tether repository.
const Version = "v0.1.0"

// ErrNotEngaged is what Get says of a remote that is not engaged: lost,
// removed, never listed, or its cluster could not be built.
var ErrNotEngaged = errors.New("not engaged")

// Options configure a Fleet.
type Options struct {
	// Path is the remotes file; by default $TETHER_REMOTES_FILE.
	Path string
	// AppliedPath is where each applied revision is acknowledged; by
	// default $TETHER_APPLIED_FILE. Empty: none is.
	AppliedPath string
	// NewCluster builds a remote's cluster; by default cluster.New.
	NewCluster func(name string, config *rest.Config) (cluster.Cluster, error)
	// Engage is called with each new cluster before it starts, and the
	// context it runs under: start what uses the cluster (an unmanaged
	// controller watching its cache) under ctx, and it stops when the
	// remote is disengaged. An error leaves the remote not engaged, and it
	// is tried again at the next look at the file.
	Engage func(ctx context.Context, name string, cl cluster.Cluster) error
	// Poll is how often the file is read again besides the events of its
	// folder; by default 2s.
	Poll time.Duration
	// StopTimeout is how long a disengaged cluster has to stop; by
	// default 30s.
	StopTimeout time.Duration
	// Log is where engagements are logged; by default controller-runtime's
	// logger, named "fleet".
	Log logr.Logger
}

// Fleet follows tether's remotes file. It is a manager.Runnable: add it to
// a controller-runtime manager, or call Start.
type Fleet struct {
	opts     Options
	mu       sync.RWMutex
	members  map[string]*member
	revision atomic.Uint64
	// The last revision written to AppliedPath.
	acknowledged atomic.Uint64
}

type member struct {
	remote  Remote
	cluster cluster.Cluster
	cancel  context.CancelFunc
	done    chan struct{}
	synced  atomic.Bool
}

// New makes a Fleet; it reads nothing until Start.
func New(opts Options) (*Fleet, error) {
	if opts.Path == "" {
		opts.Path = os.Getenv("TETHER_REMOTES_FILE")
	}
	if opts.Path == "" {
		return nil, errors.New("fleet: no remotes file: TETHER_REMOTES_FILE is not set (run under tether's exec manager) and Options.Path is empty")
	}
	if opts.AppliedPath == "" {
		opts.AppliedPath = os.Getenv("TETHER_APPLIED_FILE")
	}
	if opts.NewCluster == nil {
		opts.NewCluster = func(_ string, config *rest.Config) (cluster.Cluster, error) {
			return cluster.New(config)
		}
	}
	if opts.Poll <= 0 {
		opts.Poll = 2 * time.Second
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 30 * time.Second
	}
	if opts.Log.GetSink() == nil {
		opts.Log = ctrllog.Log.WithName("fleet")
	}
	return &Fleet{opts: opts, members: map[string]*member{}}, nil
}

// NeedLeaderElection says the fleet runs whether or not the manager leads:
// tether runs one process per replica, and decides which remotes it has.
func (f *Fleet) NeedLeaderElection() bool { return false }

// Start reads the file, engages its reachable remotes, and follows the
// file until ctx is done; then it disengages every remote. A file that
// cannot be read at first is an error; later, the last one read stays in
// force and the error is logged.
func (f *Fleet) Start(ctx context.Context) error {
	file, err := ReadFile(f.opts.Path)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("fleet: watching %s: %w", f.opts.Path, err)
	}
	defer watcher.Close()
	// tether renames a new file over the old: watch the folder.
	if err := watcher.Add(filepath.Dir(f.opts.Path)); err != nil {
		return fmt.Errorf("fleet: watching %s: %w", filepath.Dir(f.opts.Path), err)
	}
	f.apply(ctx, file)
	ticker := time.NewTicker(f.opts.Poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			f.disengageAll()
			return nil
		case event := <-watcher.Events:
			if filepath.Clean(event.Name) != filepath.Clean(f.opts.Path) {
				continue
			}
		case err := <-watcher.Errors:
			f.opts.Log.Error(err, "watching the remotes file; reading it every poll", "path", f.opts.Path)
			continue
		case <-ticker.C:
		}
		file, err := ReadFile(f.opts.Path)
		if err != nil {
			f.opts.Log.Error(err, "cannot read the remotes file; the last one read stays in force")
			continue
		}
		f.apply(ctx, file)
	}
}

// apply engages the reachable remotes of file, disengages the others, and
// replaces those whose generation or kubeconfig changed; then, if every
// disengaged cluster stopped, acknowledges the revision.
func (f *Fleet) apply(ctx context.Context, file *File) {
	if file.Revision < f.revision.Load() {
		return
	}
	stopped := true
	if file.Revision > f.revision.Load() {
		f.opts.Log.V(1).Info("remotes file", "revision", file.Revision, "remotes", len(file.Remotes))
	}
	f.revision.Store(file.Revision)
	want := make(map[string]Remote, len(file.Remotes))
	for _, remote := range file.Remotes {
		if remote.Reachable {
			want[remote.Name] = remote
		}
	}
	f.mu.RLock()
	var stale []string
	for name, m := range f.members {
		if w, ok := want[name]; !ok || w != m.remote {
			stale = append(stale, name)
		}
	}
	f.mu.RUnlock()
	sort.Strings(stale)
	for _, name := range stale {
		why := "removed"
		if w, ok := want[name]; ok {
			why = fmt.Sprintf("generation %d", w.Generation)
		} else if listed(file, name) {
			why = "unreachable"
		}
		stopped = f.disengage(name, why) && stopped
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f.mu.RLock()
		_, engaged := f.members[name]
		f.mu.RUnlock()
		if !engaged {
			f.engage(ctx, want[name])
		}
	}
	if stopped {
		f.acknowledge(file.Instance, file.Revision)
	}
}

// acknowledge writes revision, of the file for instance, to AppliedPath,
// whole (a file beside it, renamed over), unless it is already there.
func (f *Fleet) acknowledge(instance string, revision uint64) {
	if f.opts.AppliedPath == "" || f.acknowledged.Load() == revision {
		return
	}
	body, _ := json.Marshal(Applied{APIVersion: APIVersion, Instance: instance, Revision: revision})
	next := f.opts.AppliedPath + ".next"
	if err := os.WriteFile(next, append(body, '\n'), 0o600); err != nil {
		f.opts.Log.Error(err, "cannot acknowledge the remotes file", "path", f.opts.AppliedPath)
		return
	}
	if err := os.Rename(next, f.opts.AppliedPath); err != nil {
		f.opts.Log.Error(err, "cannot acknowledge the remotes file", "path", f.opts.AppliedPath)
		return
	}
	f.acknowledged.Store(revision)
	f.opts.Log.V(1).Info("remotes file applied", "revision", revision)
}

func listed(file *File, name string) bool {
	for _, remote := range file.Remotes {
		if remote.Name == name {
			return true
		}
	}
	return false
}

// engage builds remote's cluster and starts it under a context of its own.
func (f *Fleet) engage(parent context.Context, remote Remote) {
	log := f.opts.Log.WithValues("remote", remote.Name, "generation", remote.Generation)
	config, err := restConfig(remote)
	if err != nil {
		log.Error(err, "cannot read the remote's kubeconfig; not engaged")
		return
	}
	cl, err := f.opts.NewCluster(remote.Name, config)
	if err != nil {
		log.Error(err, "cannot build the remote's cluster; not engaged")
		return
	}
	ctx, cancel := context.WithCancel(parent)
	if f.opts.Engage != nil {
		if err := f.opts.Engage(ctx, remote.Name, cl); err != nil {
			cancel()
			log.Error(err, "engaging the remote failed; not engaged")
			return
		}
	}
	m := &member{remote: remote, cluster: cl, cancel: cancel, done: make(chan struct{})}
	f.mu.Lock()
	f.members[remote.Name] = m
	f.mu.Unlock()
	go func() {
		defer close(m.done)
		if err := cl.Start(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "the remote's cluster stopped; engaged again at the next look")
			f.mu.Lock()
			if f.members[remote.Name] == m {
				delete(f.members, remote.Name)
			}
			f.mu.Unlock()
			cancel()
		}
	}()
	go func() {
		if cl.GetCache().WaitForCacheSync(ctx) {
			m.synced.Store(true)
			log.Info("remote's cache synced")
		}
	}()
	log.Info("remote engaged")
}

// disengage cancels name's context and waits for its cluster to stop;
// whether it did in time.
func (f *Fleet) disengage(name, why string) bool {
	f.mu.Lock()
	m, ok := f.members[name]
	delete(f.members, name)
	f.mu.Unlock()
	if !ok {
		return true
	}
	m.cancel()
	select {
	case <-m.done:
		f.opts.Log.Info("remote disengaged", "remote", name, "why", why)
		return true
	case <-time.After(f.opts.StopTimeout):
		f.opts.Log.Info("remote disengaged; its cluster did not stop in time", "remote", name, "why", why, "timeout", f.opts.StopTimeout)
		return false
	}
}

func (f *Fleet) disengageAll() {
	for _, name := range f.Names() {
		f.disengage(name, "stopping")
	}
}

// Get is the cluster of the remote name, or ErrNotEngaged.
func (f *Fleet) Get(name string) (cluster.Cluster, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if m, ok := f.members[name]; ok {
		return m.cluster, nil
	}
	return nil, fmt.Errorf("remote %s: %w", name, ErrNotEngaged)
}

// Names are the engaged remotes, sorted.
func (f *Fleet) Names() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	names := make([]string, 0, len(f.members))
	for name := range f.members {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Revision is the revision of the last remotes file taken in.
func (f *Fleet) Revision() uint64 { return f.revision.Load() }

// ReadyCheck is a healthz.Checker: ready while every engaged remote's
// cache has synced. A remote that is lost is not engaged, and does not
// count.
func (f *Fleet) ReadyCheck(_ *http.Request) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var waiting []string
	for name, m := range f.members {
		if !m.synced.Load() {
			waiting = append(waiting, name)
		}
	}
	if len(waiting) > 0 {
		sort.Strings(waiting)
		return fmt.Errorf("caches not synced: %v", waiting)
	}
	return nil
}

// restConfig is how to reach remote: its kubeconfig and context, or the
// in-cluster config.
func restConfig(remote Remote) (*rest.Config, error) {
	if remote.Kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: remote.Kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: remote.Context},
	).ClientConfig()
}
