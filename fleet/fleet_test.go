package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// deadline bounds every wait: long enough for a loaded machine.
const deadline = 60 * time.Second

// apiserver is a real kube-apiserver and etcd (envtest), from the binaries
// tether's scripts/peers builds.
var apiserver *rest.Config

func TestMain(m *testing.M) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		println("KUBEBUILDER_ASSETS is not set: run scripts/peers in the tether repository, then KUBEBUILDER_ASSETS=$PWD/target/peers/bin go test ./... (scripts/test does both)")
		os.Exit(1)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	config, err := env.Start()
	if err != nil {
		println("starting kube-apiserver and etcd from", assets, ":", err.Error())
		os.Exit(1)
	}
	apiserver = config
	code := m.Run()
	if err := env.Stop(); err != nil {
		println("stopping kube-apiserver and etcd:", err.Error())
	}
	os.Exit(code)
}

// kubeconfig writes a kubeconfig for the real apiserver into dir.
func kubeconfig(t *testing.T, dir string) string {
	t.Helper()
	config := clientcmdapi.NewConfig()
	config.Clusters["envtest"] = &clientcmdapi.Cluster{
		Server:                   apiserver.Host,
		CertificateAuthorityData: apiserver.CAData,
	}
	config.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: apiserver.CertData,
		ClientKeyData:         apiserver.KeyData,
		Token:                 apiserver.BearerToken,
	}
	config.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	config.CurrentContext = "envtest"
	path := filepath.Join(dir, "envtest.kubeconfig")
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// write replaces the remotes file at path as tether does: beside it, then
// renamed over.
func write(t *testing.T, path string, revision uint64, remotes ...Remote) {
	t.Helper()
	if remotes == nil {
		remotes = []Remote{}
	}
	body, err := json.Marshal(File{APIVersion: APIVersion, Kind: "Remotes", Revision: revision, Cycle: 1, Instance: "run-1", Remotes: remotes})
	if err != nil {
		t.Fatal(err)
	}
	next := path + ".next"
	if err := os.WriteFile(next, body, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
}

// until polls check every 20 ms until it holds, for at most deadline.
func until(t *testing.T, what string, check func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !check() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", deadline, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// engaged is one call of Options.Engage.
type engaged struct {
	ctx     context.Context
	name    string
	cluster cluster.Cluster
}

// informing is an Options.Engage that starts an informer on the cluster,
// as a controller's watch makes one, and says so on calls.
func informing(calls chan<- engaged) func(context.Context, string, cluster.Cluster) error {
	return func(ctx context.Context, name string, cl cluster.Cluster) error {
		if _, err := cl.GetCache().GetInformer(ctx, &corev1.ConfigMap{}); err != nil {
			return err
		}
		calls <- engaged{ctx, name, cl}
		return nil
	}
}

// running starts a Fleet on opts: it, the context it runs under, and a
// stop that cancels it and checks that Start returned no error.
func running(t *testing.T, opts Options) (*Fleet, context.Context, func()) {
	t.Helper()
	fleet, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	started := make(chan error, 1)
	go func() { started <- fleet.Start(ctx) }()
	return fleet, ctx, func() {
		cancel()
		if err := <-started; err != nil {
			t.Fatal(err)
		}
	}
}

func next(t *testing.T, calls <-chan engaged, what string) engaged {
	t.Helper()
	select {
	case call := <-calls:
		return call
	case <-time.After(deadline):
		t.Fatalf("not engaged within %v: %s", deadline, what)
		return engaged{}
	}
}

func stopped(t *testing.T, call engaged, what string) {
	t.Helper()
	select {
	case <-call.ctx.Done():
	case <-time.After(deadline):
		t.Fatalf("%s: its context is not done", what)
	}
}

// A remote is engaged with a cache that lists from the real apiserver,
// disengaged when unreachable, replaced by a new cluster when its
// generation changes, and disengaged when removed; an older revision is
// ignored.
func TestEngageDisengageAndReplaceOnARealApiserver(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "remotes.json")
	config := kubeconfig(t, dir)
	remote := func(generation uint64, reachable bool) Remote {
		return Remote{Name: "a", Generation: generation, Reachable: reachable, Kubeconfig: config}
	}
	write(t, path, 1, remote(1, true))
	calls := make(chan engaged, 8)
	fleet, ctx, stop := running(t, Options{
		Path:   path,
		Poll:   100 * time.Millisecond,
		Engage: informing(calls),
	})

	first := next(t, calls, "a, at the start")
	if got, err := fleet.Get("a"); err != nil || got != first.cluster {
		t.Fatalf("Get(a) = %v, %v; want the engaged cluster", got, err)
	}
	until(t, "every engaged cache synced", func() bool { return fleet.ReadyCheck(nil) == nil })
	// The cache lists and watches the real apiserver.
	direct, err := client.New(apiserver, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	made := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "seen"}}
	if err := direct.Create(ctx, made); err != nil {
		t.Fatal(err)
	}
	until(t, "the ConfigMap in a's cache", func() bool {
		var cached corev1.ConfigMap
		return first.cluster.GetClient().Get(ctx, types.NamespacedName{Namespace: "default", Name: "seen"}, &cached) == nil
	})

	write(t, path, 2, remote(1, false))
	stopped(t, first, "a, unreachable")
	if _, err := fleet.Get("a"); !errors.Is(err, ErrNotEngaged) {
		t.Fatalf("Get(a) of an unreachable remote: %v, want ErrNotEngaged", err)
	}
	if err := fleet.ReadyCheck(nil); err != nil {
		t.Fatalf("a lost remote counted for readiness: %v", err)
	}

	write(t, path, 3, remote(1, true))
	second := next(t, calls, "a, back")
	write(t, path, 4, remote(2, true))
	third := next(t, calls, "a, at a new generation")
	stopped(t, second, "a, replaced")
	if second.cluster == third.cluster || first.cluster == third.cluster {
		t.Fatal("a new generation kept the old cluster")
	}
	if got, _ := fleet.Get("a"); got != third.cluster {
		t.Fatal("Get(a) is not the new cluster")
	}

	write(t, path, 5)
	stopped(t, third, "a, removed")
	until(t, "revision 5 taken in", func() bool { return fleet.Revision() == 5 })
	// An older file, as a reader that raced a rename might see: ignored.
	fleet.apply(ctx, &File{APIVersion: APIVersion, Revision: 4, Remotes: []Remote{remote(2, true)}})
	if names := fleet.Names(); len(names) != 0 || fleet.Revision() != 5 {
		t.Fatalf("an older revision was taken in: engaged %v at revision %d", names, fleet.Revision())
	}
	select {
	case call := <-calls:
		t.Fatalf("engaged %s from an older revision", call.name)
	default:
	}
	stop()
}

func TestAFileOfAnotherVersionOrWithADuplicateIsRefused(t *testing.T) {
	for _, tc := range []struct{ body, says string }{
		{`{"apiVersion": "tether.dev/v2", "remotes": []}`, `apiVersion "tether.dev/v2"`},
		{`{"apiVersion": "tether.dev/v1", "remotes": [{"name": "a"}, {"name": "a"}]}`, "listed twice"},
		{`{"apiVersion": "tether.dev/v1", "remotes": [{"name": ""}]}`, "remotes[0].name is empty"},
		{`{"apiVersion": `, "unexpected end"},
	} {
		if _, err := parse("f", []byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.body, err, tc.says)
		}
	}
}

func TestStartFailsOnAMissingFileAndNewWithoutOne(t *testing.T) {
	t.Setenv("TETHER_REMOTES_FILE", "")
	if _, err := New(Options{}); err == nil || !strings.Contains(err.Error(), "TETHER_REMOTES_FILE") {
		t.Fatalf("New without a file: %v", err)
	}
	fleet, err := New(Options{Path: filepath.Join(t.TempDir(), "missing.json")})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Start(context.Background()); err == nil {
		t.Fatal("Start on a missing file succeeded")
	}
}

// Each revision is acknowledged in the applied file once it is applied: a
// removed remote's cluster has stopped by the time its revision is there.
func TestARevisionIsAcknowledgedOnceItsRemovedRemotesHaveStopped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "remotes.json")
	applied := filepath.Join(dir, "applied.json")
	config := kubeconfig(t, dir)
	a := Remote{Name: "a", Generation: 1, Reachable: true, Kubeconfig: config}
	write(t, path, 1, a)
	calls := make(chan engaged, 8)
	fleet, _, stop := running(t, Options{
		Path:        path,
		AppliedPath: applied,
		Poll:        100 * time.Millisecond,
		Engage:      informing(calls),
	})
	revision := func() uint64 {
		body, err := os.ReadFile(applied)
		if err != nil {
			return 0
		}
		var ack Applied
		if err := json.Unmarshal(body, &ack); err != nil || ack.APIVersion != APIVersion || ack.Instance != "run-1" {
			t.Fatalf("the applied file is not this run's acknowledgement: %q", body)
		}
		return ack.Revision
	}
	first := next(t, calls, "a, at the start")
	until(t, "revision 1 acknowledged", func() bool { return revision() == 1 })

	write(t, path, 2)
	until(t, "revision 2 acknowledged", func() bool { return revision() == 2 })
	select {
	case <-first.ctx.Done():
	default:
		t.Fatal("revision 2 was acknowledged while a's cluster still ran")
	}
	if names := fleet.Names(); len(names) != 0 {
		t.Fatalf("engaged after its removal was acknowledged: %v", names)
	}
	stop()
}
