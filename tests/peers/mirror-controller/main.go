// mirror-controller is the controller-runtime program of tether's tests: one
// manager on a home cluster, a cluster.Cluster for one remote cluster, and a
// controller that mirrors the remote's ConfigMaps labelled
// tether.test/mirror into the home cluster. It is the shape of the
// multi-cluster controllers tether is for, with their failure: when the
// remote goes away its cache goes stale, /readyz stays 200 and the process
// never exits.
//
// With --fleet it is the shape tether's fleets want instead: one
// cluster.Cluster per remote that tether's remotes file lists as
// reachable, through tether's Go package (github.com/tether-rs/tether/fleet),
// each with a controller of its own that stops when its remote is lost or
// removed. Mirrors are then named <remote>-<namespace>-<name>.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/tether-rs/tether/fleet"
)

// Label marks a remote ConfigMap to mirror; MirroredFrom marks a mirror.
const (
	Label        = "tether.test/mirror"
	MirroredFrom = "tether.test/mirrored-from"
)

func main() {
	home := flag.String("home-kubeconfig", "", "the home cluster's kubeconfig (mirrors are written there; controller-runtime has --kubeconfig)")
	remote := flag.String("remote-kubeconfig", "", "the remote cluster's kubeconfig (labelled ConfigMaps are read there)")
	named := flag.String("remote", "", "or: the remote of that name in $TETHER_REMOTES_FILE, as tether's exec manager gives it")
	into := flag.String("namespace", "default", "the home namespace mirrors are written into")
	probes := flag.String("health-probe-bind-address", "127.0.0.1:8081", "where /healthz and /readyz are served")
	metrics := flag.String("metrics-bind-address", "0", "where /metrics is served (0: off)")
	inFleet := flag.Bool("fleet", false, "mirror every reachable remote of $TETHER_REMOTES_FILE, following it as tether rewrites it (followsRemotesFile: true)")
	qps := flag.Float64("kube-api-qps", 0, "requests a second to the home cluster (0: client-go's default, 5)")
	burst := flag.Int("kube-api-burst", 0, "the burst above --kube-api-qps (0: client-go's default, 10)")
	auditSecret := flag.String("audit-secret", "", "namespace/name: at start, ask the home cluster for this Secret with every credential found in this container, and log what each got")
	flag.Parse()
	homeQPS, homeBurst = float32(*qps), *burst
	ctrl.SetLogger(zap.New(zap.UseDevMode(false)))
	if *auditSecret != "" {
		namespace, name, ok := strings.Cut(*auditSecret, "/")
		homeConfig, err := homeRestConfig(*home)
		if !ok || err != nil {
			fmt.Fprintln(os.Stderr, "mirror-controller: --audit-secret wants namespace/name, and a home cluster:", err)
			os.Exit(2)
		}
		audit(homeConfig, namespace, name)
	}
	if *named != "" {
		path, err := fromTether(*named)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mirror-controller:", err)
			os.Exit(2)
		}
		*remote = path
	}
	if *inFleet {
		if err := runFleet(*home, *into, *probes, *metrics); err != nil {
			fmt.Fprintln(os.Stderr, "mirror-controller:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*home, *remote, *into, *probes, *metrics); err != nil {
		fmt.Fprintln(os.Stderr, "mirror-controller:", err)
		os.Exit(1)
	}
}

// fromTether reads the kubeconfig of remote `name` from the file tether's
// exec manager writes before each start (docs/exec.md).
func fromTether(name string) (string, error) {
	file := os.Getenv("TETHER_REMOTES_FILE")
	if file == "" {
		return "", fmt.Errorf("--remote %s: TETHER_REMOTES_FILE is not set (run under tether's exec manager)", name)
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var remotes struct {
		Remotes []struct {
			Name       string `json:"name"`
			Kubeconfig string `json:"kubeconfig"`
		} `json:"remotes"`
	}
	if err := json.Unmarshal(text, &remotes); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	for _, r := range remotes.Remotes {
		if r.Name == name {
			return r.Kubeconfig, nil
		}
	}
	return "", fmt.Errorf("%s: no remote %q", file, name)
}

func run(home, remote, into, probes, metrics string) error {
	remoteConfig, err := clientcmd.BuildConfigFromFlags("", remote)
	if err != nil {
		return fmt.Errorf("remote kubeconfig: %w", err)
	}
	mgr, err := homeManager(home, into, probes, metrics)
	if err != nil {
		return err
	}
	remoteCluster, err := labelled(remoteConfig)
	if err != nil {
		return fmt.Errorf("remote cluster: %w", err)
	}
	if err := mgr.Add(remoteCluster); err != nil {
		return err
	}
	mirror := &mirror{remote: remoteCluster.GetClient(), home: mgr.GetClient(), into: into}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("mirror").
		WatchesRawSource(source.Kind(
			remoteCluster.GetCache(),
			&corev1.ConfigMap{},
			&handler.TypedEnqueueRequestForObject[*corev1.ConfigMap]{},
		)).
		Complete(mirror)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// homeManager is the manager on the home cluster. Its cache holds only the
// namespace mirrors are written into, so a Role there is all the RBAC the
// controller needs at home.
func homeManager(home, into, probes, metrics string) (ctrl.Manager, error) {
	homeConfig, err := homeRestConfig(home)
	if err != nil {
		return nil, fmt.Errorf("home kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(homeConfig, ctrl.Options{
		HealthProbeBindAddress: probes,
		Metrics:                metricsserver.Options{BindAddress: metrics},
		LeaderElection:         false,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{into: {}}},
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	return mgr, mgr.AddHealthzCheck("ping", healthz.Ping)
}

// homeRestConfig is the home cluster's config: the kubeconfig given, else as
// controller-runtime finds it ($KUBECONFIG, which tether sets for a
// controller with a ServiceAccount of its own, then in-cluster).
func homeRestConfig(home string) (*rest.Config, error) {
	var config *rest.Config
	var err error
	if home != "" {
		config, err = clientcmd.BuildConfigFromFlags("", home)
	} else {
		config, err = ctrl.GetConfig()
	}
	if err == nil && homeQPS > 0 {
		config.QPS, config.Burst = homeQPS, homeBurst
	}
	return config, err
}

// homeQPS and homeBurst are --kube-api-qps and --kube-api-burst.
var (
	homeQPS   float32
	homeBurst int
)

// labelled is a remote's cluster, whose cache holds only the ConfigMaps
// labelled for the mirror.
func labelled(config *rest.Config) (cluster.Cluster, error) {
	selector, err := labels.Parse(Label)
	if err != nil {
		return nil, err
	}
	return cluster.New(config, func(o *cluster.Options) {
		o.Cache = cache.Options{DefaultLabelSelector: selector}
	})
}

// runFleet mirrors every engaged remote of tether's remotes file: each with
// a cluster whose cache holds the labelled ConfigMaps, and a controller
// started under the remote's own context, so both stop with it.
func runFleet(home, into, probes, metrics string) error {
	mgr, err := homeManager(home, into, probes, metrics)
	if err != nil {
		return err
	}
	skip := true
	remotes, err := fleet.New(fleet.Options{
		NewCluster: func(_ string, config *rest.Config) (cluster.Cluster, error) {
			return labelled(config)
		},
		Engage: func(ctx context.Context, name string, cl cluster.Cluster) error {
			c, err := controller.NewUnmanaged("mirror-"+name, controller.Options{
				Reconciler: &mirror{remote: cl.GetClient(), home: mgr.GetClient(), into: into, prefix: name + "-"},
				// A remote replaced at a new generation gets a controller
				// of the same name.
				SkipNameValidation: &skip,
			})
			if err != nil {
				return err
			}
			if err := c.Watch(source.Kind(
				cl.GetCache(),
				&corev1.ConfigMap{},
				&handler.TypedEnqueueRequestForObject[*corev1.ConfigMap]{},
			)); err != nil {
				return err
			}
			go func() {
				if err := c.Start(ctx); err != nil {
					ctrl.Log.Error(err, "the remote's controller stopped", "remote", name)
				}
			}()
			return nil
		},
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(remotes); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("fleet", remotes.ReadyCheck); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// mirror copies a remote ConfigMap's data to <prefix><namespace>-<name> in
// the home namespace, and deletes that copy when the original goes.
type mirror struct {
	remote, home client.Client
	into         string
	prefix       string
}

func (m *mirror) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	name := types.NamespacedName{Namespace: m.into, Name: m.prefix + req.Namespace + "-" + req.Name}
	var original corev1.ConfigMap
	if err := m.remote.Get(ctx, req.NamespacedName, &original); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		mirrored := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
		if err := m.home.Delete(ctx, &mirrored); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		log.Info("mirror deleted", "mirror", name)
		return reconcile.Result{}, nil
	}
	mirrored := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
	result, err := ctrl.CreateOrUpdate(ctx, m.home, &mirrored, func() error {
		if mirrored.Labels == nil {
			mirrored.Labels = map[string]string{}
		}
		mirrored.Labels[MirroredFrom] = m.prefix + req.Namespace + "." + req.Name
		mirrored.Data = original.Data
		return nil
	})
	if err != nil {
		return reconcile.Result{}, err
	}
	log.Info("mirrored", "mirror", name, "result", result)
	return reconcile.Result{}, nil
}
