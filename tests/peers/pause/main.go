// pause is the sandbox ("pause") image's program for the cluster step's
// containerd: none can be pulled there, so it is built here, FROM scratch.
// It holds the pod's namespaces open and exits on SIGTERM or SIGINT, as
// Kubernetes' own pause does; it never reaps, since no pod here shares its
// process namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
