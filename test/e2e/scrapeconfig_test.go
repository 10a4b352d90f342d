//go:build e2e && prometheus

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/test/localcluster"
)

// The scrape configuration the e2e test gives Prometheus is what the
// Prometheus Operator would make of the chart's ServiceMonitor, read from
// the live API server: one job per endpoint of the ServiceMonitor, named
// as the operator names it, with the endpoint's path, interval, timeout
// and honorLabels, scraping every ready address of the EndpointSlices of
// the Services the ServiceMonitor selects, on the port the endpoint names,
// with the target labels the operator sets (job from the Service's
// jobLabel, namespace, service, pod, container, endpoint). Prometheus is
// built without Kubernetes service discovery (hack/prometheus.sh), so the
// targets are resolved here and handed to it through file-based discovery,
// which also lets the test add targets while Prometheus runs (the second
// plugin instance of a rolling update).

// serviceMonitor is the part of a monitoring.coreos.com/v1 ServiceMonitor
// the test reads.
type serviceMonitor struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		JobLabel          string `json:"jobLabel"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			HonorLabels   bool   `json:"honorLabels"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// scrapeJob is one job of the generated configuration.
type scrapeJob struct {
	name, path, interval, timeout string
	honorLabels                   bool
	targets                       []targetGroup
}

// targetGroup is one entry of a file_sd file.
type targetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// serviceMonitorJobs reads the ServiceMonitor namespace/name and resolves
// its targets as the operator's configuration would.
func serviceMonitorJobs(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, namespace, name string) ([]scrapeJob, error) {
	u, err := dyn.Resource(localcluster.ServiceMonitorGVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading ServiceMonitor %s/%s: %w", namespace, name, err)
	}
	var sm serviceMonitor
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &sm); err != nil {
		return nil, fmt.Errorf("ServiceMonitor %s/%s: %w", namespace, name, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("ServiceMonitor %s/%s: spec.selector: %w", namespace, name, err)
	}
	namespaces := sm.Spec.NamespaceSelector.MatchNames
	if len(namespaces) == 0 {
		namespaces = []string{namespace}
	}
	var jobs []scrapeJob
	for i, ep := range sm.Spec.Endpoints {
		job := scrapeJob{
			name: fmt.Sprintf("serviceMonitor/%s/%s/%d", namespace, name, i), path: ep.Path,
			interval: ep.Interval, timeout: ep.ScrapeTimeout, honorLabels: ep.HonorLabels,
		}
		for _, ns := range namespaces {
			svcs, err := client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
			if err != nil {
				return nil, err
			}
			for _, svc := range svcs.Items {
				groups, err := serviceTargets(ctx, client, &svc, ep.Port, sm.Spec.JobLabel)
				if err != nil {
					return nil, err
				}
				job.targets = append(job.targets, groups...)
			}
		}
		jobs = append(jobs, job)
	}
	return jobs, nil
}

// serviceTargets returns a target group per ready endpoint address of the
// Service's port named port.
func serviceTargets(ctx context.Context, client kubernetes.Interface, svc *corev1.Service, port, jobLabel string) ([]targetGroup, error) {
	slices, err := client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return nil, err
	}
	job := svc.Labels[jobLabel]
	if job == "" {
		job = svc.Name
	}
	var out []targetGroup
	for _, sl := range slices.Items {
		var number int32
		for _, p := range sl.Ports {
			if p.Name != nil && *p.Name == port && p.Port != nil {
				number = *p.Port
			}
		}
		if number == 0 {
			continue
		}
		for _, e := range sl.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			labels := map[string]string{"job": job, "namespace": svc.Namespace, "service": svc.Name, "endpoint": port}
			if r := e.TargetRef; r != nil && r.Kind == "Pod" {
				labels["pod"] = r.Name
				pod, err := client.CoreV1().Pods(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				for _, c := range pod.Spec.Containers {
					for _, cp := range c.Ports {
						if cp.ContainerPort == number {
							labels["container"] = c.Name
						}
					}
				}
			}
			for _, a := range e.Addresses {
				out = append(out, targetGroup{Targets: []string{net.JoinHostPort(a, strconv.Itoa(int(number)))}, Labels: labels})
			}
		}
	}
	return out, nil
}

// fileName is the file_sd file of the job in dir.
func (j scrapeJob) fileName(dir string) string {
	return filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(j.name)+".json")
}

// writeTargets (re)writes the job's file_sd file; Prometheus notices the
// rename.
func (j scrapeJob) writeTargets(dir string) error {
	groups := j.targets
	if groups == nil {
		groups = []targetGroup{}
	}
	raw, err := json.MarshalIndent(groups, "", "  ")
	if err != nil {
		return err
	}
	path := j.fileName(dir)
	if err := os.WriteFile(path+".tmp", raw, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// prometheusConfig writes prometheus.yml and the jobs' target files into
// dir and returns the configuration's path.
func prometheusConfig(dir string, jobs []scrapeJob) (string, error) {
	var configs []map[string]any
	for _, j := range jobs {
		c := map[string]any{
			"job_name":     j.name,
			"honor_labels": j.honorLabels,
			"file_sd_configs": []map[string]any{{
				"files": []string{j.fileName(dir)}, "refresh_interval": "5s",
			}},
		}
		if j.path != "" {
			c["metrics_path"] = j.path
		}
		if j.interval != "" {
			c["scrape_interval"] = j.interval
		}
		if j.timeout != "" {
			c["scrape_timeout"] = j.timeout
		}
		configs = append(configs, c)
		if err := j.writeTargets(dir); err != nil {
			return "", err
		}
	}
	raw, err := yaml.Marshal(map[string]any{"scrape_configs": configs})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "prometheus.yml")
	return path, os.WriteFile(path, raw, 0o644)
}
