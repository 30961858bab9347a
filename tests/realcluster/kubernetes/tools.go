//go:build tools

// Package tools names the programs this module exists to build: the control
// plane the tests start (kube-apiserver) and the rest of the single-node
// cluster the cluster step runs (kube-controller-manager, kube-scheduler,
// kube-proxy, kubelet). The build tag keeps it out of every build, and
// `go mod tidy` keeps their dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
