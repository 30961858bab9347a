//go:build tools

// Package tools names the one program this module exists to build: etcd's
// main package is the root of go.etcd.io/etcd/server/v3.
package tools

import _ "go.etcd.io/etcd/server/v3"
