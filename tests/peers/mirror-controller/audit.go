package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
)

// maxAuditFile is the largest file the audit reads: kubeconfigs and tokens
// are small.
const maxAuditFile = 1 << 20

// credential is one way to authenticate that the audit found, and where.
type credential struct {
	source string
	apply  func(*rest.Config)
}

// audit tries every credential it can find in this container (environment
// variables, and every file outside /proc, /sys and /dev: kubeconfigs'
// users, bare tokens) against the home cluster, asking each for the Secret
// `namespace/name`, and logs what each got; never the credential itself.
// It is how a test shows what a controller could reach with what its
// container holds.
func audit(home *rest.Config, namespace, name string) {
	log := ctrl.Log.WithName("credential-audit")
	found := findCredentials()
	allowed := 0
	for _, c := range found {
		config := &rest.Config{
			Host:            home.Host,
			TLSClientConfig: rest.TLSClientConfig{CAData: home.CAData, CAFile: home.CAFile, ServerName: home.ServerName, Insecure: home.Insecure},
			Timeout:         10 * time.Second,
		}
		c.apply(config)
		status := "error"
		if client, err := kubernetes.NewForConfig(config); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
			cancel()
			var answered apierrors.APIStatus
			switch {
			case err == nil:
				status = "200"
				allowed++
			case errors.As(err, &answered):
				status = strconv.Itoa(int(answered.Status().Code))
			default:
				status = "error: " + err.Error()
			}
		}
		log.Info("credential tried", "source", c.source, "secret", namespace+"/"+name, "status", status)
	}
	log.Info("credential audit done", "tried", len(found), "allowed", allowed)
}

// findCredentials lists the environment's tokens and every credential in
// this container's files.
func findCredentials() []credential {
	var found []credential
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if looksLikeToken(value) {
			found = append(found, bearer("env "+name, value))
		}
	}
	_ = filepath.WalkDir("/", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			switch path {
			case "/proc", "/sys", "/dev":
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() > maxAuditFile {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if looksLikeToken(strings.TrimSpace(string(text))) {
			found = append(found, bearer("file "+path, strings.TrimSpace(string(text))))
			return nil
		}
		if config, err := clientcmd.Load(text); err == nil && len(config.AuthInfos) > 0 {
			for user, auth := range config.AuthInfos {
				if c, ok := fromAuthInfo("kubeconfig "+path+" user "+user, filepath.Dir(path), auth); ok {
					found = append(found, c)
				}
			}
		}
		return nil
	})
	return found
}

// looksLikeToken says whether s is a JWT, as ServiceAccount tokens are.
func looksLikeToken(s string) bool {
	return strings.HasPrefix(s, "eyJ") && strings.Count(s, ".") == 2 && !strings.ContainsAny(s, " \n")
}

func bearer(source, token string) credential {
	return credential{source: source, apply: func(c *rest.Config) { c.BearerToken = token }}
}

// fromAuthInfo is a kubeconfig user's credential: a token, a token file, or
// a client certificate (files relative to the kubeconfig's folder).
func fromAuthInfo(source, dir string, auth *clientcmdapi.AuthInfo) (credential, bool) {
	resolve := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	switch {
	case auth.Token != "":
		return bearer(source+" (token)", auth.Token), true
	case auth.TokenFile != "":
		file := resolve(auth.TokenFile)
		return credential{source: source + " (tokenFile)", apply: func(c *rest.Config) { c.BearerTokenFile = file }}, true
	case len(auth.ClientCertificateData) > 0 || auth.ClientCertificate != "":
		cert, key := auth.ClientCertificateData, auth.ClientKeyData
		certFile, keyFile := resolve(auth.ClientCertificate), resolve(auth.ClientKey)
		return credential{source: source + " (client certificate)", apply: func(c *rest.Config) {
			c.CertData, c.KeyData, c.CertFile, c.KeyFile = cert, key, certFile, keyFile
		}}, true
	}
	return credential{}, false
}
