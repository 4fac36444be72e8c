package kube

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NewClient reaches the API server through kubeconfig, or ("") the
// in-cluster configuration of the Pod.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		// rest.InClusterConfig, not clientcmd with no file: that logs two
		// client-go warnings and ends with a hint about KUBERNETES_MASTER.
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes lender: not in a cluster (%w): outside one, give the lender kubeconfig=FILE", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("kubernetes lender: kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "prism-loan"
	return kubernetes.NewForConfig(cfg)
}

// OwnNamespace is the namespace of the Pod this runs in (env
// POD_NAMESPACE, else its service account's), or "default".
func OwnNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}
