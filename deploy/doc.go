// Package deploy holds Prism's Kubernetes deployment: the Helm chart
// (helm/prism), the plain manifests rendered from it with its default
// values (manifests/, for kubectl apply -k; `make manifests` regenerates
// them), and the tests that check both against the Kubernetes API types
// and against the real `prism` command line. It has no code of its own.
package deploy
