package cli

import (
	"fmt"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// userAgent identifies the CLI in API server audit logs.
const userAgent = "gpulink-cli"

// kubeconfigClient connects with kubectl's kubeconfig rules: --kubeconfig
// if given, else the files in $KUBECONFIG merged, else ~/.kube/config;
// --context overrides the current context.
func kubeconfigClient(o *inspectOptions) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("load kubeconfig (%s): %w", kubeconfigSource(rules), err)
	}
	cfg.Timeout = o.timeout
	cfg.UserAgent = userAgent
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("create a client for %s: %w", cfg.Host, err)
	}
	return client, cfg.Host, nil
}

// kubeconfigSource says which files were read, for errors: "where did it
// look" is the first question after a kubeconfig failure.
func kubeconfigSource(rules *clientcmd.ClientConfigLoadingRules) string {
	if rules.ExplicitPath != "" {
		return "--kubeconfig " + rules.ExplicitPath
	}
	files := rules.GetLoadingPrecedence()
	if len(files) == 0 {
		return "no kubeconfig file configured"
	}
	return strings.Join(files, ", ")
}
