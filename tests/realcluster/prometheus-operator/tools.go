//go:build tools

// Package tools names the programs this module exists to build:
// prometheus-operator and the config reloader it runs beside Prometheus
// and Alertmanager, which the cluster step's alert check runs on the node.
// The build tag keeps them out of every build, and `go mod tidy` keeps
// their dependencies.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
)
