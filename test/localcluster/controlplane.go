package localcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func (c *Cluster) writeKubeconfigs() error {
	server := fmt.Sprintf("https://127.0.0.1:%d", c.apiserverPort)
	write := func(path, user, token string) error {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.pki.caPEM}
		cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
		cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
		cfg.CurrentContext = "local"
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			return fmt.Errorf("localcluster: writing kubeconfig %s: %w", path, err)
		}
		return nil
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := write(c.kubeconfig, "admin", c.pki.adminToken); err != nil {
		return err
	}
	if err := write(filepath.Join(c.dir, "pki", "kubelet.kubeconfig"), "system:node:"+c.opts.NodeName, c.pki.nodeToken); err != nil {
		return err
	}
	c.restConfig = &rest.Config{
		Host:            server,
		BearerToken:     c.pki.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		QPS:             200,
		Burst:           400,
	}
	client, err := kubernetes.NewForConfig(c.restConfig)
	if err != nil {
		return fmt.Errorf("localcluster: creating client: %w", err)
	}
	c.client = client
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	start := time.Now()
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPeerPort)
	p, err := c.startProcess("etcd", c.bin("etcd"),
		"--name=default",
		"--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=default="+peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	if err := waitFor(ctx, p, 60*time.Second, "etcd health", func(ctx context.Context) (bool, error) {
		return httpOK(ctx, hc, client+"/health", "")
	}); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	c.logf("etcd ready on 127.0.0.1:%d after %.1fs", c.etcdPort, time.Since(start).Seconds())
	return nil
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	start := time.Now()
	args := []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.etcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.apiserverPort),
		"--cert-dir=" + filepath.Join(c.dir, "pki", "apiserver"),
		"--tls-cert-file=" + c.pki.apiserverCert,
		"--tls-private-key-file=" + c.pki.apiserverKey,
		"--client-ca-file=" + c.pki.caCert,
		"--token-auth-file=" + c.pki.tokenFile,
		"--kubelet-client-certificate=" + c.pki.kubeletClientCert,
		"--kubelet-client-key=" + c.pki.kubeletClientKey,
		// Node names do not resolve; reach kubelets (logs, exec) at their node IP.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-key-file=" + c.pki.saPub,
		"--service-account-signing-key-file=" + c.pki.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--runtime-config=resource.k8s.io/v1=true,scheduling.k8s.io/v1beta1=true",
		fmt.Sprintf("--profiling=%t", c.opts.Profiling),
		"--v=1",
	}
	if c.opts.AuditPolicy != "" {
		policy := filepath.Join(c.dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(c.opts.AuditPolicy), 0o600); err != nil {
			return fmt.Errorf("localcluster: writing the audit policy: %w", err)
		}
		args = append(args,
			"--audit-policy-file="+policy,
			"--audit-log-path="+c.AuditLogPath(),
			"--audit-log-format=json",
			// Written before the response: a test that saw the object
			// finds its event.
			"--audit-log-mode=blocking",
		)
	}
	p, err := c.startProcess("kube-apiserver", c.bin("kube-apiserver"), append(args, c.featureGates()...)...)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	hc, err := rest.HTTPClientFor(c.restConfig)
	if err != nil {
		return fmt.Errorf("localcluster: creating HTTP client: %w", err)
	}
	hc.Timeout = 5 * time.Second
	if err := waitFor(ctx, p, 120*time.Second, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		return httpOK(ctx, hc, c.restConfig.Host+"/readyz", "")
	}); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	c.logf("kube-apiserver ready on 127.0.0.1:%d after %.1fs", c.apiserverPort, time.Since(start).Seconds())
	return nil
}

func (c *Cluster) startControllerManagerAndScheduler(ctx context.Context) error {
	start := time.Now()
	common := []string{
		"--kubeconfig=" + c.kubeconfig,
		"--authentication-kubeconfig=" + c.kubeconfig,
		"--authorization-kubeconfig=" + c.kubeconfig,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
		fmt.Sprintf("--profiling=%t", c.opts.Profiling),
		"--v=1",
	}
	common = append(common, c.featureGates()...)
	if q := c.opts.ComponentQPS; q > 0 {
		common = append(common, fmt.Sprintf("--kube-api-qps=%d", q), fmt.Sprintf("--kube-api-burst=%d", 2*q))
	}
	cm, err := c.startProcess("kube-controller-manager", c.bin("kube-controller-manager"), append([]string{
		fmt.Sprintf("--secure-port=%d", c.controllerMgrPort),
		"--cert-dir=" + filepath.Join(c.dir, "pki", "kube-controller-manager"),
		"--controllers=*,-node-lifecycle-controller",
		"--service-account-private-key-file=" + c.pki.saKey,
		"--root-ca-file=" + c.pki.caCert,
		"--cluster-signing-cert-file=" + c.pki.caCert,
		"--cluster-signing-key-file=" + c.pki.caKey,
		"--service-cluster-ip-range=" + serviceCIDR,
	}, common...)...)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	// Benchmarks read the scheduler's queue and attempt counters
	// (SchedulerMetrics) and, with Profiling, its CPU profile
	// (CPUProfile); the port listens on 127.0.0.1 only.
	allowPaths := "/healthz,/readyz,/livez,/metrics"
	if c.opts.Profiling {
		allowPaths += ",/debug/pprof/*"
	}
	sched, err := c.startProcess("kube-scheduler", c.bin("kube-scheduler"), append([]string{
		fmt.Sprintf("--secure-port=%d", c.schedulerPort),
		"--cert-dir=" + filepath.Join(c.dir, "pki", "kube-scheduler"),
		"--authorization-always-allow-paths=" + allowPaths,
	}, common...)...)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	hc := insecureHTTPClient()
	for _, w := range []struct {
		p    *process
		port int
	}{{cm, c.controllerMgrPort}, {sched, c.schedulerPort}} {
		url := fmt.Sprintf("https://127.0.0.1:%d/healthz", w.port)
		if err := waitFor(ctx, w.p, 120*time.Second, w.p.name+" /healthz", func(ctx context.Context) (bool, error) {
			return httpOK(ctx, hc, url, "")
		}); err != nil {
			return fmt.Errorf("localcluster: %w", err)
		}
	}
	// Pods cannot be created before the service account controller has
	// created the namespace's "default" service account.
	if err := waitFor(ctx, cm, 120*time.Second, "service account default/default", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", getOpts)
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	c.logf("kube-controller-manager and kube-scheduler ready after %.1fs", time.Since(start).Seconds())
	return nil
}
