//go:build tools

// Package tools names the program this module exists to build: the helm
// CLI the cluster step runs the README's quickstart with. The build tag
// keeps it out of every build, and `go mod tidy` keeps its dependencies.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
