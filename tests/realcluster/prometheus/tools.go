//go:build tools

// Package tools names the program this module exists to build: the
// Prometheus server the cluster step's alert check runs under
// prometheus-operator. Debian's prometheus package is built without
// Kubernetes service discovery, which every configuration the operator
// writes uses. The build tag keeps it out of every build, and `go mod tidy`
// keeps its dependencies.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
