//go:build tools

// Package tools names the one program this module exists to build; the build
// tag keeps it out of every build, and `go mod tidy` keeps its dependencies.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
