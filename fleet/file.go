package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// APIVersion is the version of the remotes file this package reads. A file
// of another version is refused, never guessed at.
const APIVersion = "tether.dev/v1"

// MaxFileBytes bounds the remotes file: 64 MiB holds a few hundred
// thousand remotes, and a larger one is refused rather than read.
const MaxFileBytes = 64 << 20

// File is TETHER_REMOTES_FILE, as tether's exec manager writes it
// (docs/exec.md in the tether repository).
type File struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Revision grows by one at each file tether writes.
	Revision uint64 `json:"revision"`
	// Cycle is the tether cycle the process runs in.
	Cycle uint64 `json:"cycle"`
	// Instance names this run of the process; an acknowledgement names
	// it too.
	Instance string   `json:"instance"`
	Remotes  []Remote `json:"remotes"`
}

// Remote is one remote cluster in the file.
type Remote struct {
	Name     string `json:"name"`
	Required bool   `json:"required"`
	// Generation changes when the remote must be reached anew: a new
	// server, CA, client certificate or key.
	Generation uint64 `json:"generation"`
	// Reachable is false while tether's probes call the remote lost.
	Reachable bool `json:"reachable"`
	// Kubeconfig is the absolute path of its kubeconfig; empty for the
	// in-cluster config.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Context is the kubeconfig context to use; empty for its current one.
	Context string `json:"context,omitempty"`
}

// Applied is TETHER_APPLIED_FILE, as the Fleet writes it: the last
// revision of the remotes file whose removed remotes are all disengaged.
type Applied struct {
	APIVersion string `json:"apiVersion"`
	Instance   string `json:"instance"`
	Revision   uint64 `json:"revision"`
}

// ReadFile reads and checks the remotes file at path.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	body, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(body) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileBytes)
	}
	return parse(path, body)
}

func parse(path string, body []byte) (*File, error) {
	var file File
	if err := json.Unmarshal(body, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if file.APIVersion != APIVersion {
		return nil, fmt.Errorf("%s: apiVersion %q, this package reads %q", path, file.APIVersion, APIVersion)
	}
	seen := make(map[string]bool, len(file.Remotes))
	for i, remote := range file.Remotes {
		if remote.Name == "" {
			return nil, fmt.Errorf("%s: remotes[%d].name is empty", path, i)
		}
		if seen[remote.Name] {
			return nil, fmt.Errorf("%s: remotes[%d].name %q is listed twice", path, i, remote.Name)
		}
		seen[remote.Name] = true
	}
	return &file, nil
}
